"""Every distillation objective, one plain-torch function each.

Sources:
- DistilBERT (Sanh et al. 2019, arXiv:1910.01108) and its reference code
  (huggingface/transformers examples/research_projects/distillation: ``distiller.py`` for
  pretraining, ``run_squad_w_distillation.py`` for SQuAD).
- PKD, Patient Knowledge Distillation (Sun et al. 2019, arXiv:1908.09355).
- TinyBERT (Jiao et al. 2019, arXiv:1909.10351).

Conventions: teacher tensors are always detached here, so a loss can never send gradients into
the teacher. Logits are ``[N, V]`` rows unless stated; a "row" is one token position (or one
window for QA). An empty selection (e.g. a batch with no masked token) contributes 0, not NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import TracebackType

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.models.bert.modeling_bert import BertSelfAttention
from transformers.models.distilbert.modeling_distilbert import MultiHeadSelfAttention

from pipeline.distillation.chunked_lm_loss import (ChunkLayout, LmHeadLossWeights, VocabProjection,
                                                   chunked_lm_head_losses)
from pipeline.distillation.students import teacher_layers_for_student

# The weights of the DistilBERT pretraining objective, from the reference README command
# (--alpha_ce 5.0 --alpha_mlm 2.0 --alpha_cos 1.0 --alpha_clm 0.0; alpha_mse defaults to 0).
REFERENCE_MLM_WEIGHTS = {"ce": 5.0, "mlm": 2.0, "cos": 1.0, "mse": 0.0}
REFERENCE_TEMPERATURE = 2.0  # DistilBERT reference distiller default (--temperature 2.0)

MLM_LOSS_TERMS = ("ce", "mlm", "cos", "mse")
IGNORED_LABEL = -100  # Hugging Face convention: labels of unmasked tokens are -100


# --------------------------------------------------------------------------------------------
# Prediction-layer losses
# --------------------------------------------------------------------------------------------


def soft_target_kl_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """Hinton soft-target loss as in the DistilBERT reference distiller.

    loss = T² · (1/N) Σ_rows KL( softmax(t/T) ‖ softmax(s/T) ) for ``[N, V]`` logits, i.e.
    ``KLDivLoss(reduction="batchmean")(log_softmax(s/T), softmax(t/T)) * T**2``. The T² keeps
    the gradient scale independent of T (Hinton et al. 2015).
    """
    _check_temperature(temperature)
    if student_logits.shape[0] == 0:
        return _zero_with_graph(student_logits)
    student_log_probs = F.log_softmax(student_logits / temperature, dim=-1)
    teacher_probs = F.softmax(teacher_logits.detach() / temperature, dim=-1)
    return F.kl_div(student_log_probs, teacher_probs, reduction="batchmean") * temperature**2


def soft_cross_entropy(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """TinyBERT prediction-layer loss: mean over rows of −Σ softmax(t/T) · log_softmax(s/T).

    Rows are all leading dimensions; the last is the class dimension. (The TinyBERT code averages
    over every element, i.e. this value divided by the number of classes; we average over rows so
    the value does not depend on the vocabulary size.)
    """
    _check_temperature(temperature)
    student_rows = student_logits.reshape(-1, student_logits.shape[-1])
    teacher_rows = teacher_logits.detach().reshape(-1, teacher_logits.shape[-1])
    if student_rows.shape[0] == 0:
        return _zero_with_graph(student_logits)
    teacher_probs = F.softmax(teacher_rows / temperature, dim=-1)
    student_log_probs = F.log_softmax(student_rows / temperature, dim=-1)
    return -(teacher_probs * student_log_probs).sum(dim=-1).mean()


def tinybert_prediction_loss(student_start: Tensor, student_end: Tensor, teacher_start: Tensor, teacher_end: Tensor,
                             temperature: float = 1.0) -> Tensor:
    """TinyBERT's prediction-layer step for span QA: the soft cross-entropy of the start and of the end logits,
    averaged."""
    return (soft_cross_entropy(student_start, teacher_start, temperature)
            + soft_cross_entropy(student_end, teacher_end, temperature)) / 2


def masked_lm_loss(student_logits_at_masked: Tensor, true_token_ids: Tensor) -> Tensor:
    """Masked-language-model loss: mean cross-entropy of ``[N, V]`` logits against ``[N]`` token ids."""
    if student_logits_at_masked.shape[0] == 0:
        return _zero_with_graph(student_logits_at_masked)
    return F.cross_entropy(student_logits_at_masked, true_token_ids)


def logits_mse_loss(student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
    """Squared error between logits, summed over the vocabulary and averaged over the N rows.

    The DistilBERT reference ``alpha_mse`` term: ``MSELoss(reduction="sum")(s, t) / N``.
    """
    if student_logits.shape[0] == 0:
        return _zero_with_graph(student_logits)
    return F.mse_loss(student_logits, teacher_logits.detach(), reduction="sum") / student_logits.shape[0]


# --------------------------------------------------------------------------------------------
# Hidden-state losses
# --------------------------------------------------------------------------------------------


def hidden_cosine_loss(student_hidden: Tensor, teacher_hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """DistilBERT cosine loss: mean over non-padding positions of 1 − cos(h_s, h_t).

    ``CosineEmbeddingLoss`` with target 1 on the ``[B, S, H]`` last hidden states, aligning the
    directions of student and teacher vectors (the reference ``alpha_cos`` term).
    """
    _check_same_width(student_hidden, teacher_hidden, "hidden_cosine_loss")
    keep = attention_mask.bool()
    return hidden_rows_cosine_loss(student_hidden[keep], teacher_hidden[keep])


def hidden_rows_cosine_loss(student_rows: Tensor, teacher_rows: Tensor) -> Tensor:
    """Mean of 1 − cos(h_s, h_t) over ``[N, H]`` rows (the non-padding positions)."""
    _check_same_width(student_rows, teacher_rows, "hidden_cosine_loss")
    if student_rows.shape[0] == 0:
        return _zero_with_graph(student_rows)
    return (1.0 - F.cosine_similarity(student_rows, teacher_rows.detach(), dim=-1)).mean()


# --------------------------------------------------------------------------------------------
# DistilBERT pretraining objective
# --------------------------------------------------------------------------------------------


def mlm_distillation_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    student_hidden: Tensor,
    teacher_hidden: Tensor,
    labels: Tensor,
    attention_mask: Tensor,
    weights: Mapping[str, float],
    temperature: float,
    restrict_ce_to_mask: bool = False,
) -> dict[str, Tensor]:
    """The DistilBERT triple loss on whole batches: loss = w_ce·L_ce + w_mlm·L_mlm + w_cos·L_cos (+ w_mse·L_mse).

    Shapes: logits ``[B, S, V]``, hidden ``[B, S, H]``, labels and attention_mask ``[B, S]``
    (labels are -100 except at masked positions). Selects the rows each term reads and computes the terms with
    ``mlm_distillation_terms``, the readable reference of the chunked loss pretraining distillation trains with.
    """
    masked = labels.ne(IGNORED_LABEL)
    tokens = attention_mask.bool()
    ce_positions = masked if restrict_ce_to_mask else tokens
    # Masked rows among the L_ce rows: all of them when L_ce is restricted to the mask.
    masked_rows = None if restrict_ce_to_mask else masked[tokens].nonzero().squeeze(1)
    return mlm_distillation_terms(
        student_logits[ce_positions], teacher_logits.detach()[ce_positions], masked_rows, labels[masked],
        student_hidden[tokens], teacher_hidden.detach()[tokens], weights, temperature,
    )


def mlm_distillation_terms(
    student_ce_logits: Tensor,
    teacher_ce_logits: Tensor,
    masked_rows: Tensor | None,
    masked_labels: Tensor,
    student_token_hidden: Tensor,
    teacher_token_hidden: Tensor,
    weights: Mapping[str, float],
    temperature: float,
) -> dict[str, Tensor]:
    """The DistilBERT triple loss on selected rows (Sanh et al. 2019; the reference distiller):
    loss = w_ce·L_ce + w_mlm·L_mlm + w_cos·L_cos (+ w_mse·L_mse).

    - ``student_ce_logits``/``teacher_ce_logits`` ``[N, V]``: the rows L_ce reads (every non-padding token, or
      only the masked ones: the reference ``--restrict_ce_to_mask``). The vocabulary projection dominates a
      step's cost and memory, so callers project only these rows, never the ``[B, S, V]`` grid.
    - L_ce: ``soft_target_kl_loss`` at temperature T over those rows.
    - L_mlm: ``masked_lm_loss`` of the masked rows (``masked_rows`` indexes them among the L_ce rows; None: they
      are all the L_ce rows) against ``masked_labels``.
    - L_cos: 1 − cos(h_s, h_t) averaged over the ``[M, H]`` hidden rows of every non-padding token.
    - L_mse: ``logits_mse_loss`` over the L_ce rows, only when its weight is > 0.

    ``weights`` uses the keys ce, mlm, cos, mse; a missing key means weight 0. Returns the named terms and their
    weighted sum under "loss". Row selection by index: nothing here reads a tensor's values on the host.
    """
    _check_weights(weights)
    student_mlm_rows = student_ce_logits if masked_rows is None else student_ce_logits.index_select(0, masked_rows)
    terms = {
        "ce": soft_target_kl_loss(student_ce_logits, teacher_ce_logits, temperature),
        "mlm": masked_lm_loss(student_mlm_rows, masked_labels),
        "cos": hidden_rows_cosine_loss(student_token_hidden.float(), teacher_token_hidden.float()),
    }
    if weights.get("mse", 0.0) > 0:
        terms["mse"] = logits_mse_loss(student_ce_logits, teacher_ce_logits)
    total = sum(weights.get(name, 0.0) * value for name, value in terms.items())
    return {"loss": total, **terms}


def mlm_distillation_terms_in_chunks(
    student_ce_projection: VocabProjection,
    teacher_ce_projection: VocabProjection,
    masked_rows: Tensor | None,
    masked_labels: Tensor,
    student_token_hidden: Tensor,
    teacher_token_hidden: Tensor,
    weights: Mapping[str, float],
    temperature: float,
    layout: ChunkLayout | int,
) -> dict[str, Tensor]:
    """``mlm_distillation_terms`` with the vocabulary projection inside, over chunks of L_ce rows
    (``chunked_lm_loss.chunked_lm_head_losses``; ``layout``: a ChunkLayout or its chunk_rows): the same terms and
    gradients within float rounding, with no ``[N, V]`` logits of the whole batch, and for the gradient nothing
    beyond one chunk's. This is what distill_pretrain trains with; ``mlm_distillation_terms`` is its readable
    reference, which the tests compare it against.

    ``student_ce_projection``/``teacher_ce_projection``: the L_ce rows ``[N, H]`` as they enter each model's
    vocabulary projection, with its weight and bias. The other arguments are ``mlm_distillation_terms``'s. Only
    "loss" carries gradients; the other terms are detached (the training loop only logs them).
    """
    _check_weights(weights)
    _check_temperature(temperature)
    if masked_rows is None:  # the L_ce rows are the masked rows
        row_labels = masked_labels
    else:
        n_rows = student_ce_projection.inputs.shape[0]
        row_labels = masked_labels.new_full((n_rows,), IGNORED_LABEL).index_copy_(0, masked_rows, masked_labels)
    head_weights = LmHeadLossWeights(ce=weights.get("ce", 0.0), mlm=weights.get("mlm", 0.0),
                                     mse=weights.get("mse", 0.0))
    head_terms = chunked_lm_head_losses(student_ce_projection, teacher_ce_projection, row_labels, temperature,
                                        head_weights, layout, ignore_index=IGNORED_LABEL)
    cos = hidden_rows_cosine_loss(student_token_hidden.float(), teacher_token_hidden.float())
    total = head_terms.pop("loss") + weights.get("cos", 0.0) * cos
    terms = {"ce": head_terms["ce"], "mlm": head_terms["mlm"], "cos": cos}
    if "mse" in head_terms:
        terms["mse"] = head_terms["mse"]
    return {"loss": total, **terms}


# --------------------------------------------------------------------------------------------
# Question answering (second distillation step)
# --------------------------------------------------------------------------------------------


def qa_distillation_loss(
    student_start: Tensor,
    student_end: Tensor,
    teacher_start: Tensor,
    teacher_end: Tensor,
    context_mask: Tensor,
    temperature: float,
) -> Tensor:
    """Soft-target loss on answer-span logits, averaged over start and end.

    For start and for end logits ``[B, S]``: T² · (1/B) Σ_windows KL(softmax(t/T) ‖ softmax(s/T)),
    where the softmax runs only over positions with ``context_mask`` true; the result is
    (start + end) / 2.

    The reference ``run_squad_w_distillation.py`` applies the KL to all positions, so question
    tokens and padding carry probability mass the student is asked to copy. We exclude them:
    after dividing by T, both student and teacher logits outside the context are set to the most
    negative finite value, which gives them zero probability and zero gradient without the NaNs
    that −inf would cause in the KL.
    """
    _check_temperature(temperature)
    keep = context_mask.bool()
    start = _masked_span_kl(student_start, teacher_start, keep, temperature)
    end = _masked_span_kl(student_end, teacher_end, keep, temperature)
    return (start + end) / 2


def qa_task_loss(student_start: Tensor, student_end: Tensor, start_positions: Tensor, end_positions: Tensor) -> Tensor:
    """Span cross-entropy, (CE(start) + CE(end)) / 2, exactly as ``BertForQuestionAnswering``.

    Positions outside the window are clamped to S and ignored, as Hugging Face does.
    """
    sequence_length = student_start.shape[1]
    start_positions = start_positions.clamp(0, sequence_length)
    end_positions = end_positions.clamp(0, sequence_length)
    start = F.cross_entropy(student_start, start_positions, ignore_index=sequence_length)
    end = F.cross_entropy(student_end, end_positions, ignore_index=sequence_length)
    return (start + end) / 2


def _masked_span_kl(student_logits: Tensor, teacher_logits: Tensor, keep: Tensor, temperature: float) -> Tensor:
    excluded = ~keep
    lowest = torch.finfo(student_logits.dtype).min
    student_scaled = (student_logits / temperature).masked_fill(excluded, lowest)
    teacher_scaled = (teacher_logits.detach() / temperature).masked_fill(excluded, lowest)
    student_log_probs = F.log_softmax(student_scaled, dim=-1)
    teacher_probs = F.softmax(teacher_scaled, dim=-1)
    return F.kl_div(student_log_probs, teacher_probs, reduction="batchmean") * temperature**2


# --------------------------------------------------------------------------------------------
# PKD: Patient Knowledge Distillation (Sun et al. 2019)
# --------------------------------------------------------------------------------------------


def pkd_teacher_layers(n_teacher_layers: int, n_student_layers: int, scheme: str) -> list[int]:
    """Teacher layers (0-based) whose [CLS] states student layers 0 … k−2 learn from.

    In PKD the last student layer is already taught by the prediction loss, so only the first
    k−1 student layers get a patient teacher layer: student layer i ↔ returned[i].

    - ``skip`` (PKD-Skip): every (L/k)-th teacher layer; 12→6 gives the paper's layers
      {2, 4, 6, 8, 10} (1-based), i.e. [1, 3, 5, 7, 9] here. It is the ``uniform`` mapping
      without its last entry (the teacher's top layer).
    - ``last`` (PKD-Last): the k−1 teacher layers just below the top one; 12→6 gives the
      paper's {7, …, 11} (1-based), i.e. [6, 7, 8, 9, 10] here.
    """
    if scheme not in ("skip", "last"):
        raise ValueError(f"pkd.scheme: unknown PKD scheme {scheme!r}; use 'skip' or 'last'")
    # The uniform mapping also checks 1 <= k <= L; its last entry is always the top layer L-1.
    uniform = teacher_layers_for_student("uniform", n_teacher_layers, n_student_layers, key="pkd.teacher_layers")
    if scheme == "skip":
        return uniform[:-1]
    return list(range(n_teacher_layers - n_student_layers, n_teacher_layers - 1))


def pkd_patient_loss(student_cls_states: Sequence[Tensor], teacher_cls_states: Sequence[Tensor]) -> Tensor:
    """PKD patient loss: the mean over batch × layers × hidden of (s/‖s‖₂ − t/‖t‖₂)² on [CLS] vectors.

    Each list holds one ``[B, H]`` tensor per mapped layer pair (see ``pkd_teacher_layers``).
    Normalising first makes the loss depend only on directions, as in PKD eq. (3). The reduction is
    the reference's (intersun/PKD ``patience_loss``: ``F.mse_loss`` of the normalised
    ``[B, layers, H]`` states, a mean over every element), so the paper's β grid (10 … 1000) keeps
    its meaning: for one layer pair this is ‖s/‖s‖ − t/‖t‖‖² averaged over the batch, divided by H.
    """
    _check_same_length(student_cls_states, teacher_cls_states, "pkd_patient_loss")
    for student_cls, teacher_cls in zip(student_cls_states, teacher_cls_states):
        _check_same_width(student_cls, teacher_cls, "pkd_patient_loss")
    # [B, layers, H] in fp32, as the reference computes it (the states may come out of bf16 autocast).
    student_units = torch.stack([F.normalize(s.float(), dim=-1) for s in student_cls_states], dim=1)
    teacher_units = torch.stack([F.normalize(t.detach().float(), dim=-1) for t in teacher_cls_states], dim=1)
    return F.mse_loss(student_units, teacher_units)


# --------------------------------------------------------------------------------------------
# TinyBERT (Jiao et al. 2019)
# --------------------------------------------------------------------------------------------


def tinybert_attention_loss(
    student_scores: Sequence[Tensor], teacher_scores: Sequence[Tensor], attention_mask: Tensor
) -> Tensor:
    """TinyBERT attention loss: Σ_layers MSE of pre-softmax attention scores ``[B, heads, S, S]``.

    The mean runs over valid entries only: an entry counts when both its query and its key are
    real tokens. (The TinyBERT code zeroes masked entries but still counts them in the mean.)
    Student and teacher must have the same number of heads.
    """
    _check_same_length(student_scores, teacher_scores, "tinybert_attention_loss")
    keep = attention_mask.bool()
    valid = (keep[:, None, :, None] & keep[:, None, None, :]).to(student_scores[0].dtype)  # [B, 1, S, S]
    total = None
    for student_layer, teacher_layer in zip(student_scores, teacher_scores):
        if student_layer.shape[1] != teacher_layer.shape[1]:
            raise ValueError(
                f"tinybert_attention_loss: student has {student_layer.shape[1]} attention heads and the "
                f"teacher {teacher_layer.shape[1]}; TinyBERT attention transfer needs equal head counts"
            )
        n_valid = valid.sum() * student_layer.shape[1]
        squared_error = (student_layer - teacher_layer.detach()).pow(2) * valid
        layer_loss = squared_error.sum() / n_valid.clamp(min=1)
        total = layer_loss if total is None else total + layer_loss
    return total


def tinybert_hidden_loss(
    student_hidden: Sequence[Tensor],
    teacher_hidden: Sequence[Tensor],
    projection: nn.Module | None,
    attention_mask: Tensor,
) -> Tensor:
    """TinyBERT hidden-state loss: Σ_layers MSE(h_s · W_h, h_t) over non-padding positions.

    Hidden states are ``[B, S, Hs]`` (student) and ``[B, S, Ht]`` (teacher). ``projection`` is the
    learnable W_h (e.g. ``nn.Linear(Hs, Ht)``), shared by all layers as in TinyBERT; it may be
    None only when Hs == Ht.
    """
    _check_same_length(student_hidden, teacher_hidden, "tinybert_hidden_loss")
    # Padding is weighted out, not indexed out: a boolean index counts the mask on the host, which on a GPU waits
    # for the device at every layer of every step. Padded rows are projected too and carry weight 0. In fp32,
    # as autocast runs mse_loss.
    keep = attention_mask.to(torch.float32).unsqueeze(-1)  # [B, S, 1]
    total = None
    for student_layer, teacher_layer in zip(student_hidden, teacher_hidden):
        width = teacher_layer.shape[-1]
        student_layer = _project(student_layer, width, projection)
        squared_error = (student_layer.float() - teacher_layer.detach().float()).pow(2) * keep
        layer_loss = squared_error.sum() / (keep.sum() * width).clamp(min=1)  # no kept rows: 0, graph intact
        total = layer_loss if total is None else total + layer_loss
    return total


def tinybert_embedding_loss(
    student_embeddings: Tensor, teacher_embeddings: Tensor, projection: nn.Module | None, attention_mask: Tensor
) -> Tensor:
    """TinyBERT embedding loss: MSE(e_s · W_e, e_t) over non-padding positions of the embedding outputs."""
    return tinybert_hidden_loss([student_embeddings], [teacher_embeddings], projection, attention_mask)


def _project(student_rows: Tensor, teacher_width: int, projection: nn.Module | None) -> Tensor:
    if projection is not None:
        student_rows = projection(student_rows)
    elif student_rows.shape[-1] != teacher_width:
        raise ValueError(
            f"student hidden size {student_rows.shape[-1]} differs from the teacher's {teacher_width}; "
            f"pass a projection such as nn.Linear({student_rows.shape[-1]}, {teacher_width})"
        )
    if student_rows.shape[-1] != teacher_width:
        raise ValueError(
            f"projection outputs width {student_rows.shape[-1]} but the teacher hidden size is {teacher_width}"
        )
    return student_rows


class AttentionScoreRecorder:
    """Records pre-softmax attention scores, (Q·Kᵀ)/√d_head per layer, during a forward pass.

    Works on Hugging Face BERT (``BertSelfAttention``: ``query``/``key``) and DistilBERT
    (``MultiHeadSelfAttention``: ``q_lin``/``k_lin``) with any attention implementation, by hooking
    the query and key projections. The additive padding mask is not included; the losses exclude
    padded positions themselves. Scores keep their autograd graph, so a student can learn from them.

        with AttentionScoreRecorder(model) as recorder:
            model(input_ids, attention_mask=mask)
        scores = recorder.scores  # list, one [B, heads, S, S] tensor per layer, bottom first
    """

    def __init__(self, model: nn.Module):
        self._layers = _attention_projections(model)
        if not self._layers:
            raise ValueError(f"{type(model).__name__} has no BERT or DistilBERT self-attention layers to record")
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._scores: list[Tensor | None] = []
        self._pending: list[dict[str, Tensor]] = []

    def __enter__(self) -> AttentionScoreRecorder:
        self._scores = [None] * len(self._layers)
        self._pending = [{} for _ in self._layers]
        for layer_index, (query, key, n_heads) in enumerate(self._layers):
            self._handles.append(query.register_forward_hook(self._hook(layer_index, "query", n_heads)))
            self._handles.append(key.register_forward_hook(self._hook(layer_index, "key", n_heads)))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._pending = []

    @property
    def scores(self) -> list[Tensor]:
        """Scores of the most recent forward pass, one ``[B, heads, S, S]`` tensor per layer."""
        if not self._scores or any(layer_scores is None for layer_scores in self._scores):
            raise RuntimeError("no attention scores recorded; run a forward pass inside the `with` block first")
        return list(self._scores)

    def _hook(self, layer_index: int, role: str, n_heads: int):
        def record(module: nn.Module, inputs: tuple, output: Tensor) -> None:
            pending = self._pending[layer_index]
            pending[role] = output
            if len(pending) == 2:  # query and key of this layer both seen, in either order
                self._scores[layer_index] = _scaled_dot_product_scores(pending.pop("query"), pending.pop("key"), n_heads)

        return record


def _attention_projections(model: nn.Module) -> list[tuple[nn.Module, nn.Module, int]]:
    """(query projection, key projection, number of heads) for each self-attention layer, in order."""
    layers = []
    for module in model.modules():
        if isinstance(module, BertSelfAttention):
            layers.append((module.query, module.key, module.num_attention_heads))
        elif isinstance(module, MultiHeadSelfAttention):
            layers.append((module.q_lin, module.k_lin, module.n_heads))
    return layers


def _scaled_dot_product_scores(query: Tensor, key: Tensor, n_heads: int) -> Tensor:
    batch_size, sequence_length, width = query.shape
    head_size = width // n_heads

    def split_heads(projected: Tensor) -> Tensor:  # [B, S, H] -> [B, heads, S, d_head]
        return projected.view(batch_size, -1, n_heads, head_size).transpose(1, 2)

    return split_heads(query) @ split_heads(key).transpose(-1, -2) / math.sqrt(head_size)


# --------------------------------------------------------------------------------------------
# Checks and small helpers
# --------------------------------------------------------------------------------------------


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _check_weights(weights: Mapping[str, float]) -> None:
    unknown = sorted(set(weights) - set(MLM_LOSS_TERMS))
    if unknown:
        raise ValueError(f"unknown loss weight(s) {unknown}; valid terms are {', '.join(MLM_LOSS_TERMS)}")
    negative = {name: value for name, value in weights.items() if value < 0}
    if negative:
        raise ValueError(f"loss weights must be >= 0, got {negative}")


def _check_same_length(student: Sequence[Tensor], teacher: Sequence[Tensor], loss_name: str) -> None:
    if len(student) != len(teacher):
        raise ValueError(f"{loss_name}: {len(student)} student layers but {len(teacher)} teacher layers")
    if not student:
        raise ValueError(f"{loss_name}: no layers given")


def _check_same_width(student: Tensor, teacher: Tensor, loss_name: str) -> None:
    if student.shape[-1] != teacher.shape[-1]:
        raise ValueError(
            f"{loss_name}: student width {student.shape[-1]} differs from the teacher's {teacher.shape[-1]}"
        )


def _zero_with_graph(tensor: Tensor) -> Tensor:
    """0 that stays connected to ``tensor``'s graph, so backward() works on an empty selection."""
    return tensor.sum() * 0.0
