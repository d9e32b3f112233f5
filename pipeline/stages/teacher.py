"""Stages teacher_pretrain and teacher_finetune: the BERT teacher.

teacher_pretrain (only when no pretrained teacher is configured): a small BertForMaskedLM trained from scratch
on the tokenized corpus (token-budget batches) with dynamic masking and no next-sentence prediction (as RoBERTa and DistilBERT do).
teacher_finetune: BertForQuestionAnswering from that model (or from `teacher.pretrained`) fine-tuned on SQuAD,
evaluated on dev with exact match / F1. With `teacher.pretrained_qa` an already fine-tuned model is only
evaluated. Both write a save_pretrained directory (safetensors, with the tokenizer) and metrics.json.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertForQuestionAnswering

from pipeline.data import qa_windows
from pipeline.data.corpus import TokenizedCorpus, copy_ids_to_node, node_local_ids_path, token_budget_batches
from pipeline.data.mlm_batches import MaskedBatchCollator, masked_token_accuracy, rows
from pipeline.data.squad_loading import load_squad
from pipeline.distillation.losses import masked_lm_loss
from pipeline.export.model_card import mlm_teacher_card, qa_teacher_card, write_model_card
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.outputs.manifests import atomic_output_dir, fingerprint, to_plain, verify_input_dirs
from pipeline.plan.config import PipelineConfig
from pipeline.training.loop import train
from pipeline.training.processes import is_main_process, once_per_node, process_group_from_env
from pipeline.training.run_settings import prepare_run

logger = logging.getLogger(__name__)


def teacher_config_from_scratch(cfg: PipelineConfig, tokenizer) -> BertConfig:
    arch = cfg.teacher.architecture
    return BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        intermediate_size=arch.intermediate_size,
        max_position_embeddings=arch.max_position_embeddings,
        hidden_dropout_prob=arch.dropout,
        attention_probs_dropout_prob=arch.dropout,
        pad_token_id=tokenizer.pad_token_id,
    )


def run_pretrain(cfg: PipelineConfig, corpus_dir: Path, tokenizer_dir: Path, out_dir: Path, work_dir: Path,
                 node_local_dir: str | None = None) -> dict:
    """MLM pretraining from scratch on the tokenized corpus. `work_dir` holds checkpoints and the live log."""
    verify_input_dirs(corpus_dir, tokenizer_dir)
    train_cfg = cfg.teacher.pretrain
    device = prepare_run(train_cfg, cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = BertForMaskedLM(teacher_config_from_scratch(cfg, tokenizer)).to(device)

    max_len = cfg.teacher.pretrain_max_seq_length
    ids_path = None
    if node_local_dir:  # every rank reads the ids from its node's own disk, copied there once per node
        once_per_node(lambda: copy_ids_to_node(corpus_dir, node_local_dir), process_group_from_env())
        ids_path = node_local_ids_path(corpus_dir, node_local_dir)
    corpus = TokenizedCorpus(corpus_dir, ids_path)
    sequences = corpus.sequences("train", max_len)
    collator = MaskedBatchCollator(tokenizer, cfg.teacher.mlm_probability)
    max_tokens = train_cfg.max_tokens_per_batch or train_cfg.batch_size * max_len
    world_size = process_group_from_env().world_size

    def compute_loss(batch):
        hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        # Vocabulary logits only at the masked positions: the [B, S, V] tensor is most of MLM's cost.
        loss = masked_lm_loss(model.cls(rows(hidden, batch["masked_positions"])), batch["masked_labels"])
        return {"loss": loss, "mlm": loss.detach()}

    run_id = fingerprint("teacher_pretrain", to_plain(cfg.teacher), cfg.seed, files=[corpus_dir, tokenizer_dir])
    result = train(
        module=model, compute_loss=compute_loss, examples=sequences, collate=collator, cfg=train_cfg,
        seed=cfg.seed, device=device, checkpoint_dir=work_dir / "checkpoints", log_path=work_dir / "train_log.jsonl",
        fingerprint=run_id, description="teacher_pretrain",
        batch_plan=lambda epoch: token_budget_batches(sequences.sequence_lengths(), max_tokens, cfg.seed, epoch,
                                                      world_size),
        example_tokens=sequences.sequence_lengths(),  # the collate's loss_tokens: every real token of a sequence
        static_graph=True,  # the same model and loss in every micro-batch
    )
    if not is_main_process():
        return result.as_metrics()  # evaluation and outputs are rank 0's
    accuracy = masked_token_accuracy(
        {"teacher": model}, corpus.sequences("heldout", max_len), collator, seed=cfg.seed, device=device
    )
    metrics = {
        **result.as_metrics(),
        "n_train_sequences": len(sequences),
        "n_train_tokens": sequences.n_tokens_total(),
        "max_tokens_per_batch": max_tokens,
        "heldout_mlm_accuracy": round(accuracy["teacher"], 4),
        "n_heldout_masked_tokens": accuracy["n_masked_tokens"],
        "n_parameters": model.num_parameters(),
    }
    with atomic_output_dir(out_dir, cfg) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        shutil.copy(work_dir / "train_log.jsonl", tmp / "train_log.jsonl")
        atomic_write_json(tmp / "metrics.json", metrics)
        write_model_card(mlm_teacher_card(cfg, metrics, corpus_dir, str(out_dir)), tmp)
    logger.info("teacher_pretrain: %s", json.dumps(metrics))
    return metrics


def run_finetune(
    cfg: PipelineConfig, data_dir: Path, tokenizer_dir: Path, pretrained_dir: Path | None, out_dir: Path, work_dir: Path
) -> dict:
    """Fine-tune BertForQuestionAnswering on SQuAD (or only evaluate `teacher.pretrained_qa`)."""
    verify_input_dirs(data_dir, tokenizer_dir, pretrained_dir)
    train_cfg = cfg.teacher.finetune
    device = prepare_run(train_cfg, cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    dev, _ = load_squad(str(data_dir / "dev.jsonl"))

    if cfg.teacher.pretrained_qa:
        model = BertForQuestionAnswering.from_pretrained(cfg.teacher.pretrained_qa).to(device)
        training_metrics = {"steps": 0, "train_seconds": 0.0, "tokens_per_second": 0.0, "fine_tuned_here": False}
    else:
        source = str(pretrained_dir) if pretrained_dir else cfg.teacher.pretrained
        if not source:
            raise ValueError("teacher_finetune needs --pretrained-dir or teacher.pretrained")
        model = BertForQuestionAnswering.from_pretrained(source).to(device)
        model = qa_windows.prepare_for_qa_training(model, cfg.squad)
        train_examples, _ = load_squad(str(data_dir / "train.jsonl"))
        windows = qa_windows.train_window_tensors(train_examples, tokenizer, cfg.squad)

        collate = qa_windows.window_collate(windows)

        def compute_loss(batch):
            output = model(**qa_windows.model_inputs(batch, model), start_positions=batch["start_positions"],
                           end_positions=batch["end_positions"])
            return {"loss": output.loss}

        run_id = fingerprint(
            "teacher_finetune", to_plain(cfg.teacher), to_plain(cfg.squad), cfg.seed,
            files=[data_dir / "train.jsonl", tokenizer_dir] + ([pretrained_dir] if pretrained_dir else []),
        )
        result = train(
            module=model, compute_loss=compute_loss, examples=list(range(len(windows["input_ids"]))), collate=collate,
            cfg=train_cfg, seed=cfg.seed, device=device, checkpoint_dir=work_dir / "checkpoints",
            log_path=work_dir / "train_log.jsonl", fingerprint=run_id, description="teacher_finetune",
            example_lengths=qa_windows.window_lengths(windows),
        )
        training_metrics = {**result.as_metrics(), "n_train_examples": len(train_examples),
                            "n_train_windows": len(windows["input_ids"]), "fine_tuned_here": True}

    if not is_main_process():
        return training_metrics  # evaluation and outputs are rank 0's
    dev_metrics, predictions = qa_windows.evaluate_qa(model, tokenizer, dev, cfg.squad, device)
    metrics = {**dev_metrics, **training_metrics, "n_parameters": model.num_parameters()}
    with atomic_output_dir(out_dir, cfg) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / "predictions.json", predictions)
        if (work_dir / "train_log.jsonl").is_file():
            shutil.copy(work_dir / "train_log.jsonl", tmp / "train_log.jsonl")
        atomic_write_json(tmp / "metrics.json", metrics)
        write_model_card(qa_teacher_card(cfg, metrics, data_dir, pretrained_dir or cfg.teacher.pretrained,
                                         str(out_dir)), tmp)
    logger.info("teacher_finetune: %s", json.dumps(metrics))
    return metrics


# `python -m pipeline teacher-pretrain` and `teacher-finetune`: run_pretrain()'s and run_finetune()'s
# parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "corpus_dir": "output of tokenize_corpus",
    "work_dir": "checkpoints and live training log",
    "node_local_dir": "copy the corpus's ids.bin to this node-local folder and read it there ('': read it in place)",
    "pretrained_dir": "output of teacher_pretrain, if any",
}
