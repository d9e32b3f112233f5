"""Stage distill_pretrain: the student learns from the frozen MLM teacher during MLM pretraining.

Loss (Sanh et al. 2019; reference distiller): alpha_ce * KL(softmax(t/T) || softmax(s/T)) * T^2
+ alpha_mlm * cross-entropy on masked tokens + alpha_cos * (1 - cos(h_s, h_t)) [+ alpha_mse * MSE(logits)].
Dynamic masking every batch (optionally frequency-smoothed), no next-sentence prediction. Sequences come from the
memory-mapped tokenized corpus (tokenize_corpus), in token-budget batches.

One path, on every device and in every config: both models run packed, on each micro-batch's real tokens only
(pipeline/distillation/packed_encoder.py), and the vocabulary terms run chunked and fused (`losses.mlm_distillation_terms_in_chunks`,
pipeline/distillation/chunked_lm_loss.py): the projection only on the rows a term reads (every token, or only the masked ones
with restrict_ce_to_mask), chunk_rows at a time over a vocabulary padded to a multiple of 64, so no [rows, vocab]
logits of the whole batch ever exist. Its readable reference, the Hugging Face models on padded batches and the
whole-vocabulary loss (pipeline/distillation/reference_loss.py), is what the tests hold it equal to.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from torch.nn import Module
from transformers import AutoTokenizer, BertForMaskedLM, DistilBertForMaskedLM

from pipeline.data.corpus import TokenizedCorpus, copy_ids_to_node, node_local_ids_path, token_budget_batches
from pipeline.data.masking import selection_weights_from_counts
from pipeline.data.mlm_batches import MaskedBatchCollator, masked_token_accuracy, rows, special_token_ids
from pipeline.distillation.chunked_lm_loss import ChunkLayout, VocabProjection
from pipeline.distillation.losses import mlm_distillation_terms_in_chunks
from pipeline.distillation.packed_encoder import PackedBertEncoder, PackedDistilBertEncoder, encoder_inputs
from pipeline.distillation.students import freeze
from pipeline.export.model_card import mlm_student_card, write_model_card
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.outputs.manifests import atomic_output_dir, fingerprint, to_plain, verify_input_dirs
from pipeline.plan.config import DistillPretrainConfig, PipelineConfig
from pipeline.training.loop import train
from pipeline.training.processes import is_main_process, once_per_node, process_group_from_env
from pipeline.training.run_settings import maybe_compile, prepare_run, use_bf16

logger = logging.getLogger(__name__)


def student_mlm_head_transform(student: DistilBertForMaskedLM, hidden_rows: torch.Tensor) -> torch.Tensor:
    """DistilBERT's MLM head up to its vocabulary projection, on selected hidden rows [N, H] -> [N, H]."""
    return student.vocab_layer_norm(student.activation(student.vocab_transform(hidden_rows)))


def loss_weights(cfg: DistillPretrainConfig) -> dict[str, float]:
    return {"ce": cfg.alpha_ce, "mlm": cfg.alpha_mlm, "cos": cfg.alpha_cos, "mse": cfg.alpha_mse}


def encoders(student: DistilBertForMaskedLM, teacher: BertForMaskedLM) -> tuple[Module, Module]:
    """The student's and the teacher's packed encoders, over the Hugging Face modules' own parameters."""
    return PackedDistilBertEncoder(student.distilbert), PackedBertEncoder(teacher.bert)


def distillation_terms(
    student: DistilBertForMaskedLM,
    teacher: BertForMaskedLM,
    batch: dict[str, torch.Tensor],
    cfg: DistillPretrainConfig,
    student_forward=None,
    teacher_forward=None,
    layout: ChunkLayout | None = None,
) -> dict[str, torch.Tensor]:
    """Both models on a packed masked batch (MaskedBatchCollator's keys with pack_to_multiple_of), then the triple
    loss on the rows it reads, its vocabulary terms chunked. The forwards default to `encoders(...)`; the layout
    to chunks of cfg.chunked_loss_rows over the vocabulary padded to a multiple of 64."""
    if "cu_seqlens" not in batch:
        raise ValueError("distill_pretrain's loss takes packed batches (MaskedBatchCollator(pack_to_multiple_of=...)); "
                         "pipeline.distillation.reference_loss computes it on padded ones")
    # `is None`, not `or`: the truth value of a torch.compile'd module is its len(), which raises.
    if student_forward is None or teacher_forward is None:
        default_student, default_teacher = encoders(student, teacher)
        student_forward = default_student if student_forward is None else student_forward
        teacher_forward = default_teacher if teacher_forward is None else teacher_forward
    inputs = encoder_inputs(batch)
    student_hidden = student_forward(**inputs).last_hidden_state
    with torch.no_grad():
        teacher_hidden = teacher_forward(**inputs).last_hidden_state
    ce_positions = batch["masked_positions"] if cfg.restrict_ce_to_mask else batch["token_positions"]
    masked_rows = None if cfg.restrict_ce_to_mask else batch["masked_in_tokens"]
    # Only the vocabulary projection is chunked: the head's layers before it are [N, H], as small as the encoder's
    # activations, and stay in autograd.
    student_projection = VocabProjection(student_mlm_head_transform(student, rows(student_hidden, ce_positions)),
                                         student.vocab_projector.weight, student.vocab_projector.bias)
    teacher_head = teacher.cls.predictions
    with torch.no_grad():
        teacher_projection = VocabProjection(teacher_head.transform(rows(teacher_hidden, ce_positions)),
                                             teacher_head.decoder.weight, teacher_head.decoder.bias)
    return mlm_distillation_terms_in_chunks(
        student_projection, teacher_projection, masked_rows, batch["masked_labels"],
        rows(student_hidden, batch["token_positions"]), rows(teacher_hidden, batch["token_positions"]),
        loss_weights(cfg), cfg.temperature, layout or ChunkLayout(cfg.chunked_loss_rows),
    )


def run(
    cfg: PipelineConfig,
    student_dir: Path,
    teacher: str,
    corpus_dir: Path,
    out_dir: Path,
    work_dir: Path,
    node_local_dir: str | None = None,
) -> dict:
    verify_input_dirs(student_dir, teacher, corpus_dir)
    dcfg = cfg.distill_pretrain
    device = prepare_run(dcfg.train, cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    student = DistilBertForMaskedLM.from_pretrained(student_dir).to(device)
    teacher_model = freeze(BertForMaskedLM.from_pretrained(teacher)).to(device)
    if use_bf16(dcfg.train, device):
        # Frozen: bf16 weights halve its memory and time; only where the loop itself trains under bf16 autocast.
        teacher_model = teacher_model.to(torch.bfloat16)
    student_encoder, teacher_encoder = encoders(student, teacher_model)
    student_forward = maybe_compile(student_encoder, dcfg.train, device)
    teacher_forward = maybe_compile(teacher_encoder, dcfg.train, device)

    ids_path = None
    if node_local_dir:  # every rank reads the ids from its node's own disk, copied there once per node
        once_per_node(lambda: copy_ids_to_node(corpus_dir, node_local_dir), process_group_from_env())
        ids_path = node_local_ids_path(corpus_dir, node_local_dir)
    corpus = TokenizedCorpus(corpus_dir, ids_path)
    if corpus.vocab_size != len(tokenizer):
        raise ValueError(f"{corpus_dir}: tokenized with a vocabulary of {corpus.vocab_size}, but the student's "
                         f"tokenizer has {len(tokenizer)}")
    sequences = corpus.sequences("train", dcfg.max_seq_length)
    selection_weights = None
    if dcfg.token_frequency_smoothing:
        selection_weights = selection_weights_from_counts(
            corpus.token_counts(), special_token_ids(tokenizer), dcfg.smoothing_exponent)
    collator = MaskedBatchCollator(tokenizer, dcfg.mlm_mask_prop, selection_weights, dcfg.packed_tokens_multiple_of)
    max_tokens = dcfg.train.max_tokens_per_batch or dcfg.train.batch_size * dcfg.max_seq_length
    world_size = process_group_from_env().world_size

    def compute_loss(batch):
        return distillation_terms(student, teacher_model, batch, dcfg, student_forward, teacher_forward)

    run_id = fingerprint(
        "distill_pretrain", to_plain(dcfg), cfg.seed, str(teacher), files=[corpus_dir, student_dir],
    )
    result = train(
        module=student, compute_loss=compute_loss, examples=sequences, collate=collator, cfg=dcfg.train,
        seed=cfg.seed, device=device, checkpoint_dir=work_dir / "checkpoints", log_path=work_dir / "train_log.jsonl",
        fingerprint=run_id, description="distill_pretrain",
        batch_plan=lambda epoch: token_budget_batches(sequences.sequence_lengths(), max_tokens, cfg.seed, epoch,
                                                      world_size),
        example_tokens=sequences.sequence_lengths(),  # the collate's loss_tokens: every real token of a sequence
        static_graph=True,  # the same modules and loss terms in every micro-batch
    )
    if not is_main_process():
        return result.as_metrics()  # evaluation and outputs are rank 0's
    # Both models are scored in fp32 on the same masks, whatever precision the teacher trained in.
    accuracy = masked_token_accuracy(
        {"student": student, "teacher": teacher_model.float()}, corpus.sequences("heldout", dcfg.max_seq_length),
        collator, seed=cfg.seed, device=device,
    )
    metrics = {
        **result.as_metrics(),
        "student_mlm_accuracy": round(accuracy["student"], 4),
        "teacher_mlm_accuracy": round(accuracy["teacher"], 4),
        # no ratio to a teacher that predicts no held-out token (a briefly trained one): null, not a huge number
        "student_to_teacher_mlm_accuracy": (round(accuracy["student"] / accuracy["teacher"], 4)
                                            if accuracy["teacher"] > 0 else None),
        "n_heldout_masked_tokens": accuracy["n_masked_tokens"],
        "n_train_sequences": len(sequences),
        "n_train_tokens": sequences.n_tokens_total(),
        "max_tokens_per_batch": max_tokens,
        "n_student_parameters": student.num_parameters(),
        "n_teacher_parameters": teacher_model.num_parameters(),
        "loss_weights": loss_weights(dcfg),
        "temperature": dcfg.temperature,
    }
    with atomic_output_dir(out_dir, cfg) as tmp:
        student.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        shutil.copy(work_dir / "train_log.jsonl", tmp / "train_log.jsonl")
        atomic_write_json(tmp / "metrics.json", metrics)
        write_model_card(mlm_student_card(cfg, metrics, student_dir, str(teacher), corpus_dir, str(out_dir)), tmp)
    logger.info("distill_pretrain: %s", json.dumps(metrics))
    return metrics


# `python -m pipeline distill-pretrain`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "student_dir": "output of init_student",
    "teacher": "teacher_pretrain output directory or a hub BERT name",
    "corpus_dir": "output of tokenize_corpus",
    "work_dir": "checkpoints and live training log",
    "node_local_dir": "copy the corpus's ids.bin to this node-local folder and read it there ('': read it in place)",
}
