"""Stage distill_pretrain: the student learns from the frozen MLM teacher during MLM pretraining.

Loss (Sanh et al. 2019; reference distiller): alpha_ce * KL(softmax(t/T) || softmax(s/T)) * T^2
+ alpha_mlm * cross-entropy on masked tokens + alpha_cos * (1 - cos(h_s, h_t)) [+ alpha_mse * MSE(logits)].
Dynamic masking every batch (optionally frequency-smoothed), no next-sentence prediction.

Memory: the vocabulary projection is applied only to the positions a loss reads (non-padding, or only the
masked ones with restrict_ce_to_mask), never to the full [batch, sequence, vocab] grid.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertForMaskedLM, DistilBertForMaskedLM

from pipeline.artifacts import atomic_output_dir, atomic_write_json, fingerprint, setup_logging, to_plain
from pipeline.artifacts import verify_input_dirs
from pipeline.config import DistillPretrainConfig, PipelineConfig, config_from_json
from pipeline.losses import hidden_cosine_loss, logits_mse_loss, masked_lm_loss, soft_target_kl_loss
from pipeline.masking import mask_tokens, selection_weights_from_counts
from pipeline.mlm import collate_sequences, masked_token_accuracy, read_corpus_lines, special_token_ids, tokenize_corpus
from pipeline.stages.token_counts import load_token_counts
from pipeline.train import maybe_compile, prepare_run, train, use_bf16

logger = logging.getLogger(__name__)


def student_mlm_logits(student: DistilBertForMaskedLM, hidden_rows: torch.Tensor) -> torch.Tensor:
    """DistilBERT's MLM head on selected hidden rows [N, H] -> [N, V]."""
    transformed = student.activation(student.vocab_transform(hidden_rows))
    return student.vocab_projector(student.vocab_layer_norm(transformed))


def freeze(teacher: torch.nn.Module) -> torch.nn.Module:
    """The teacher only supplies targets: eval mode (no dropout), no gradients, not in the optimizer."""
    teacher.eval()
    for parameter in teacher.parameters():
        parameter.requires_grad_(False)
    return teacher


def distillation_terms(
    student: DistilBertForMaskedLM,
    teacher: BertForMaskedLM,
    masked_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor,
    cfg: DistillPretrainConfig,
    student_forward=None,
) -> dict[str, torch.Tensor]:
    student_forward = student_forward or student.distilbert
    student_hidden = student_forward(input_ids=masked_ids, attention_mask=attention_mask).last_hidden_state
    with torch.no_grad():
        teacher_hidden = teacher.bert(input_ids=masked_ids, attention_mask=attention_mask).last_hidden_state

    masked_positions = labels != -100
    ce_positions = masked_positions if cfg.restrict_ce_to_mask else attention_mask.bool()
    student_logits = student_mlm_logits(student, student_hidden[ce_positions])
    with torch.no_grad():
        teacher_logits = teacher.cls(teacher_hidden[ce_positions])
    # Masked rows among the CE rows: a row selection of the logits already computed, not a second head pass.
    masked_rows = masked_positions[ce_positions]

    terms = {
        "ce": soft_target_kl_loss(student_logits, teacher_logits, cfg.temperature),
        "mlm": masked_lm_loss(student_logits[masked_rows], labels[masked_positions]),
        "cos": hidden_cosine_loss(student_hidden.float(), teacher_hidden.float(), attention_mask),
    }
    if cfg.alpha_mse > 0:
        terms["mse"] = logits_mse_loss(student_logits, teacher_logits)
    weights = {"ce": cfg.alpha_ce, "mlm": cfg.alpha_mlm, "cos": cfg.alpha_cos, "mse": cfg.alpha_mse}
    terms["loss"] = sum(weights[name] * value for name, value in terms.items())
    return terms


def run(
    cfg: PipelineConfig,
    student_dir: Path,
    teacher_source: str,
    data_dir: Path,
    token_counts_path: Path | None,
    out_dir: Path,
    work_dir: Path,
) -> dict:
    verify_input_dirs(student_dir, teacher_source, data_dir, token_counts_path.parent if token_counts_path else None)
    dcfg = cfg.distill_pretrain
    device = prepare_run(dcfg.train, cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    student = DistilBertForMaskedLM.from_pretrained(student_dir).to(device)
    teacher = freeze(BertForMaskedLM.from_pretrained(teacher_source)).to(device)
    if use_bf16(dcfg.train, device):
        # Frozen: bf16 weights halve its memory and time; only where the loop itself trains under bf16 autocast.
        teacher = teacher.to(torch.bfloat16)
    student_forward = maybe_compile(student.distilbert, dcfg.train, device)

    sequences = tokenize_corpus(read_corpus_lines(data_dir / "corpus_train.txt"), tokenizer, dcfg.max_seq_length)
    heldout = tokenize_corpus(read_corpus_lines(data_dir / "corpus_heldout.txt"), tokenizer, dcfg.max_seq_length)
    specials = special_token_ids(tokenizer)
    selection_weights = None
    if dcfg.token_frequency_smoothing:
        if token_counts_path is None:
            raise ValueError("distill_pretrain.token_frequency_smoothing needs --token-counts")
        counts = load_token_counts(token_counts_path, len(tokenizer))
        selection_weights = selection_weights_from_counts(counts, specials, dcfg.smoothing_exponent).to(device)

    def collate(batch_sequences):
        return collate_sequences(batch_sequences, tokenizer.pad_token_id, specials)

    def compute_loss(batch):
        masked, labels = mask_tokens(
            batch["input_ids"], batch["special_tokens_mask"], tokenizer.mask_token_id, len(tokenizer),
            dcfg.mlm_mask_prop, selection_weights=selection_weights,
        )
        return distillation_terms(student, teacher, masked, labels, batch["attention_mask"], dcfg, student_forward)

    run_id = fingerprint(
        "distill_pretrain", to_plain(dcfg), cfg.seed, str(teacher_source),
        files=[data_dir / "corpus_train.txt", student_dir],
    )
    result = train(
        module=student, compute_loss=compute_loss, examples=sequences, collate=collate, cfg=dcfg.train,
        seed=cfg.seed, device=device, checkpoint_dir=work_dir / "checkpoints", log_path=work_dir / "train_log.jsonl",
        fingerprint=run_id, description="distill_pretrain",
        example_lengths=[len(sequence) for sequence in sequences],
    )
    # Both models are scored in fp32 on the same masks, whatever precision the teacher trained in.
    accuracy = masked_token_accuracy(
        {"student": student, "teacher": teacher.float()}, heldout, tokenizer, dcfg.mlm_mask_prop, seed=cfg.seed,
        device=device,
    )
    metrics = {
        **result.as_metrics(),
        "student_mlm_accuracy": round(accuracy["student"], 4),
        "teacher_mlm_accuracy": round(accuracy["teacher"], 4),
        "student_to_teacher_mlm_accuracy": round(accuracy["student"] / max(accuracy["teacher"], 1e-9), 4),
        "n_heldout_masked_tokens": accuracy["n_masked_tokens"],
        "n_train_sequences": len(sequences),
        "n_student_parameters": student.num_parameters(),
        "n_teacher_parameters": teacher.num_parameters(),
        "loss_weights": {"ce": dcfg.alpha_ce, "mlm": dcfg.alpha_mlm, "cos": dcfg.alpha_cos, "mse": dcfg.alpha_mse},
        "temperature": dcfg.temperature,
    }
    with atomic_output_dir(out_dir, cfg) as tmp:
        student.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        shutil.copy(work_dir / "train_log.jsonl", tmp / "train_log.jsonl")
        atomic_write_json(tmp / "metrics.json", metrics)
    logger.info("distill_pretrain: %s", json.dumps(metrics))
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline distill-pretrain", description=__doc__)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--student-dir", required=True, type=Path, help="output of init_student")
    parser.add_argument("--teacher", required=True, help="teacher_pretrain output directory or a hub BERT name")
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--token-counts", type=Path, default=None, help="token_counts.json (for smoothing)")
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--work-dir", required=True, type=Path, help="checkpoints and live training log")
    args = parser.parse_args(argv)
    setup_logging()
    run(
        config_from_json(args.config_json), args.student_dir, args.teacher, args.data_dir, args.token_counts,
        args.out_dir, args.work_dir,
    )
    return 0
