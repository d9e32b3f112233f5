"""The objectives of the SQuAD step (stage distill_squad): each objective's check against both models, TinyBERT's
two training phases, and the loss the training loop minimises (the study's variants of them: pipeline/plan/study_runs.py).

Objectives: the gold-span CE (weight alpha_task) plus, each with its weight,
    distilbert: KL(softmax(t/T) || softmax(s/T)) * T^2 on start and end logits, averaged, over [CLS] and context
                positions only (Sanh et al. 2019);
    pkd:        the patient loss on normalised [CLS] states of mapped layers (Sun et al. 2019); its soft-target
                term is the distilbert objective, which the config requires alongside it;
    tinybert:   attention-score, hidden-state and embedding MSE, then prediction-layer soft cross-entropy
                (Jiao et al. 2019).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from pipeline.data import qa_windows
from pipeline.distillation.losses import (
    AttentionScoreRecorder,
    pkd_patient_loss,
    pkd_teacher_layers,
    qa_distillation_loss,
    qa_task_loss,
    tinybert_attention_loss,
    tinybert_embedding_loss,
    tinybert_hidden_loss,
    tinybert_prediction_loss,
)
from pipeline.distillation.students import LayerMappingError, teacher_layers_for_student
from pipeline.plan.config import ConfigError, DistillSquadConfig


def distillation_plan(cfg: DistillSquadConfig, student_config, teacher_config) -> dict:
    """Check the objectives against both models before any training; returns the layer mappings.

    Errors name the config key: a layer mapping outside the teacher's depth, a width mismatch without a
    projection, a head-count mismatch for attention-score distillation.
    """
    n_student, n_teacher = student_config.n_layers, teacher_config.num_hidden_layers
    student_width, teacher_width = student_config.dim, teacher_config.hidden_size
    plan: dict = {}
    try:
        if "pkd" in cfg.objectives:
            if student_width != teacher_width:
                raise ConfigError(
                    f"distill_squad.objectives: pkd compares [CLS] states directly and needs equal widths "
                    f"(student {student_width}, teacher {teacher_width})"
                )
            plan["pkd_teacher_layers"] = pkd_teacher_layers(n_teacher, n_student, cfg.pkd.scheme)
            if not plan["pkd_teacher_layers"]:  # PKD teaches layers below the top one, which the KD loss covers
                raise ConfigError("distill_squad.objectives: pkd needs a student with at least 2 layers")
        if "tinybert" in cfg.objectives:
            plan["tinybert_teacher_layers"] = teacher_layers_for_student(
                cfg.tinybert.layer_mapping, n_teacher, n_student, key="distill_squad.tinybert.layer_mapping"
            )
            if student_width != teacher_width and not cfg.tinybert.projection:
                raise ConfigError(
                    f"distill_squad.tinybert.projection: student width {student_width} differs from teacher width "
                    f"{teacher_width}; hidden-state distillation needs a projection (set projection: true)"
                )
            if cfg.tinybert.attention_weight > 0 and student_config.n_heads != teacher_config.num_attention_heads:
                raise ConfigError(
                    f"distill_squad.tinybert.attention_weight: attention-score MSE needs equal head counts "
                    f"(student {student_config.n_heads}, teacher {teacher_config.num_attention_heads})"
                )
    except (LayerMappingError, ValueError) as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(str(error)) from None
    plan["needs_projection"] = "tinybert" in cfg.objectives and student_width != teacher_width
    return plan


def kd_positions(batch: dict[str, torch.Tensor], sep_token_id: int) -> torch.Tensor:
    """[CLS] and context tokens: the positions an answer (or the no-answer [CLS] label) can take."""
    context = (batch["token_type_ids"] == 1) & (batch["attention_mask"] == 1) & (batch["input_ids"] != sep_token_id)
    context[:, 0] = True
    return context


def tinybert_intermediate_weighted(cfg: DistillSquadConfig) -> bool:
    """Whether TinyBERT's intermediate-layer terms (attention scores, hidden states, embeddings) are trained."""
    tb = cfg.tinybert
    return "tinybert" in cfg.objectives and max(tb.attention_weight, tb.hidden_weight, tb.embedding_weight) > 0


def logits_suffice(cfg: DistillSquadConfig) -> bool:
    """Whether the teacher's start/end logits are all the objectives read (then they can be cached)."""
    return set(cfg.objectives) <= {"distilbert", "tinybert"} and not tinybert_intermediate_weighted(cfg)


def training_phases(cfg: DistillSquadConfig) -> list[tuple[str, DistillSquadConfig]]:
    """(name, config) of each training run distill_squad makes, in order.

    TinyBERT's task distillation is two steps (Jiao et al. 2019): intermediate layers first (attention scores,
    hidden states, embeddings; no gold spans, no prediction layer), then the prediction layer. With
    ``tinybert.intermediate_share`` s > 0 the first step takes s of ``train.epochs`` (or of ``max_steps``) and
    the second the rest,
    with every other configured objective and the gold-span CE; s = 0 trains every term together in one run.
    """
    tb = cfg.tinybert
    if "tinybert" not in cfg.objectives or tb.intermediate_share == 0:
        return [("main", cfg)]
    epochs, steps = cfg.train.epochs, cfg.train.max_steps
    first_steps = max(1, round(steps * tb.intermediate_share)) if steps else None
    intermediate = replace(
        cfg, objectives=["tinybert"], alpha_task=0.0, tinybert=replace(tb, prediction_weight=0.0),
        train=replace(cfg.train, epochs=epochs * tb.intermediate_share, max_steps=first_steps),
    )
    prediction = replace(
        cfg, tinybert=replace(tb, attention_weight=0.0, hidden_weight=0.0, embedding_weight=0.0),
        train=replace(cfg.train, epochs=epochs * (1 - tb.intermediate_share),
                      max_steps=max(1, steps - first_steps) if steps else None),
    )
    return [("intermediate", intermediate), ("prediction", prediction)]


class SquadDistillationLoss:
    """compute_loss(batch) for the training loop: the task loss plus each configured objective."""

    def __init__(self, student, teacher, cfg: DistillSquadConfig, plan: dict, projection, sep_token_id: int):
        self.student, self.teacher, self.cfg, self.plan = student, teacher, cfg, plan
        self.projection, self.sep_token_id = projection, sep_token_id
        self.needs_hidden = "pkd" in cfg.objectives or tinybert_intermediate_weighted(cfg)

    @staticmethod
    def task_loss(student_out, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Gold-span CE over the windows that have a gold span (augmented windows have none)."""
        gold = batch.get("has_gold")
        if gold is None:
            return qa_task_loss(student_out.start_logits, student_out.end_logits,
                                batch["start_positions"], batch["end_positions"])
        if not gold.any():  # a batch of augmented windows only: the soft targets are the whole signal
            return student_out.start_logits.sum() * 0.0
        return qa_task_loss(student_out.start_logits[gold], student_out.end_logits[gold],
                            batch["start_positions"][gold], batch["end_positions"][gold])

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        record_attention = "tinybert" in cfg.objectives and cfg.tinybert.attention_weight > 0
        with AttentionScoreRecorder(self.student) if record_attention else _nothing() as student_scores:
            student_out = self.student(**inputs, output_hidden_states=self.needs_hidden)
        terms = {"task": self.task_loss(student_out, batch)}
        total = cfg.alpha_task * terms["task"]
        if self.teacher is None:  # CE-only baseline
            return {"loss": total, **terms}

        if "teacher_start_logits" in batch:
            teacher_start, teacher_end, teacher_out, teacher_scores = (
                batch["teacher_start_logits"], batch["teacher_end_logits"], None, None)
        else:
            with torch.no_grad():
                with AttentionScoreRecorder(self.teacher) if record_attention else _nothing() as teacher_scores:
                    teacher_out = self.teacher(**qa_windows.model_inputs(batch, self.teacher),
                                               output_hidden_states=self.needs_hidden)
            teacher_start, teacher_end = teacher_out.start_logits, teacher_out.end_logits

        if "distilbert" in cfg.objectives:
            keep = kd_positions(batch, self.sep_token_id)
            terms["kd"] = qa_distillation_loss(student_out.start_logits, student_out.end_logits,
                                               teacher_start, teacher_end, keep, cfg.distilbert.temperature)
            total = total + cfg.distilbert.weight * terms["kd"]
        if "pkd" in cfg.objectives:
            # hidden_states[0] is the embedding output; layer i's output is hidden_states[i + 1].
            student_cls = [student_out.hidden_states[i + 1][:, 0] for i in range(len(self.plan["pkd_teacher_layers"]))]
            teacher_cls = [teacher_out.hidden_states[t + 1][:, 0] for t in self.plan["pkd_teacher_layers"]]
            terms["pkd"] = pkd_patient_loss(student_cls, teacher_cls)
            total = total + cfg.pkd.weight * terms["pkd"]
        if "tinybert" in cfg.objectives:
            layers = self.plan["tinybert_teacher_layers"]
            mask = batch["attention_mask"]
            tb = cfg.tinybert
            if tb.attention_weight > 0:
                terms["tb_attention"] = tinybert_attention_loss(
                    student_scores.scores, [teacher_scores.scores[t] for t in layers], mask)
                total = total + tb.attention_weight * terms["tb_attention"]
            # Terms with weight 0 (TinyBERT's prediction-layer step) are skipped: no hidden states are needed then.
            if tb.hidden_weight > 0:
                terms["tb_hidden"] = tinybert_hidden_loss(
                    list(student_out.hidden_states[1:]), [teacher_out.hidden_states[t + 1] for t in layers],
                    self.projection, mask)
                total = total + tb.hidden_weight * terms["tb_hidden"]
            if tb.embedding_weight > 0:
                terms["tb_embedding"] = tinybert_embedding_loss(
                    student_out.hidden_states[0], teacher_out.hidden_states[0], self.projection, mask)
                total = total + tb.embedding_weight * terms["tb_embedding"]
            if tb.prediction_weight > 0:
                terms["tb_prediction"] = tinybert_prediction_loss(student_out.start_logits, student_out.end_logits,
                                                                  teacher_start, teacher_end, tb.temperature)
                total = total + tb.prediction_weight * terms["tb_prediction"]
        return {"loss": total, **{name: value.detach() for name, value in terms.items()}}


class _nothing:
    """A no-op context manager standing in for AttentionScoreRecorder when attention is not distilled."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
