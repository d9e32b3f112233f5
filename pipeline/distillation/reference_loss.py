"""The readable reference of distill_pretrain's loss: the Hugging Face models on a padded batch, then the
whole-vocabulary triple loss (`losses.mlm_distillation_terms` on [rows × vocab] logits).

distill_pretrain trains on packed batches with the chunked, fused loss (`stages.distill_pretrain.distillation_terms`);
this is what that path must equal within float rounding. Only the tests and the device checks
(benchmarks/cuda_equivalence.py) call it: no stage or training code does.
"""

from __future__ import annotations

import torch
from transformers import BertForMaskedLM, DistilBertForMaskedLM

from pipeline.data.mlm_batches import rows
from pipeline.distillation.losses import mlm_distillation_terms
from pipeline.plan.config import DistillPretrainConfig


def student_mlm_logits(student: DistilBertForMaskedLM, hidden_rows: torch.Tensor) -> torch.Tensor:
    """DistilBERT's whole MLM head on selected hidden rows [N, H] -> [N, V]."""
    return student.vocab_projector(student.vocab_layer_norm(student.activation(student.vocab_transform(hidden_rows))))


def reference_distillation_terms(
    student: DistilBertForMaskedLM,
    teacher: BertForMaskedLM,
    padded_batch: dict[str, torch.Tensor],
    cfg: DistillPretrainConfig,
) -> dict[str, torch.Tensor]:
    """Both models on a padded masked batch (MaskedBatchCollator's keys, unpacked), the vocabulary projection on
    every row a term reads at once, then the triple loss: the terms and the loss, with gradients to the student."""
    if "cu_seqlens" in padded_batch:
        raise ValueError("the reference runs the Hugging Face models on a padded batch, not a packed one")
    inputs = {"input_ids": padded_batch["input_ids"], "attention_mask": padded_batch["attention_mask"]}
    student_hidden = student.distilbert(**inputs).last_hidden_state
    with torch.no_grad():
        teacher_hidden = teacher.bert(**inputs).last_hidden_state
    ce_positions = padded_batch["masked_positions"] if cfg.restrict_ce_to_mask else padded_batch["token_positions"]
    masked_rows = None if cfg.restrict_ce_to_mask else padded_batch["masked_in_tokens"]
    student_logits = student_mlm_logits(student, rows(student_hidden, ce_positions))
    with torch.no_grad():
        teacher_logits = teacher.cls(rows(teacher_hidden, ce_positions))
    weights = {"ce": cfg.alpha_ce, "mlm": cfg.alpha_mlm, "cos": cfg.alpha_cos, "mse": cfg.alpha_mse}
    return mlm_distillation_terms(
        student_logits, teacher_logits, masked_rows, padded_batch["masked_labels"],
        rows(student_hidden, padded_batch["token_positions"]), rows(teacher_hidden, padded_batch["token_positions"]),
        weights, cfg.temperature,
    )
