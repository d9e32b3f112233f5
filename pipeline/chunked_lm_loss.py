"""The vocabulary-logit terms of DistilBERT pretraining distillation, computed over row chunks.

The DistilBERT soft-target term T²·KL(softmax(t/T) ‖ softmax(s/T)), the masked-LM cross-entropy and the optional
logit MSE (Sanh et al. 2019; their reference distiller) all read [rows × vocab] logits of student and teacher.
Through autograd each term keeps several such grids in fp32 for backward (logits, /T copies, log-softmax, softmax,
the kl_div grid): at a paper-sized micro-batch of 8,192 tokens and a 30,522-word vocabulary one grid is 1 GB, and
a 65,536-token batch would need tens of GB. Here the rows are cut into chunks of ``chunk_rows``. For each chunk
the student's and the teacher's logits are projected, the terms summed and their gradient with respect to the
logits written down analytically:

    d(T²·KL)/ds = T·(softmax(s/T) − softmax(t/T))       d(CE)/ds = softmax(s) − onehot(label)
    d(MSE)/ds   = 2·(s − t)

which the chunk turns at once into its share of the gradients of the projection's input rows, weight and bias.
The chunk's logits are then dropped, so no [rows × vocab] tensor of the whole batch ever exists: the peak is a
handful of [chunk_rows × vocab] fp32 tensors (logits, probabilities and their gradient, about six at once).
Backward only scales the saved gradients by the incoming one, as Liger-Kernel's fused-linear chunked losses do
(linkedin/Liger-Kernel ``chunked_loss/fused_linear_distillation.py``).

Why not that library (liger-kernel 0.8.5): it requires ``triton``, the GPU kernel compiler, on every install, a
GPU dependency this CPU-first project will not add; and its distillation base applies the soft loss to the same
rows as the hard one, normalises it by their count and has no T² factor, while DistilBERT's soft term runs over
every non-padding token and its MLM term over the masked ones only, each with its own mean.

What is chunked: only the final vocabulary projection (``vocab_projector`` of DistilBertForMaskedLM, the
``decoder`` of BERT's MLM head). The layers before it (vocab_transform, activation, vocab_layer_norm; BERT's
head transform) map [rows × hidden] to [rows × hidden], no larger than the encoder's own activations, so they
stay in ordinary autograd and the gradient computed here for the projection's input flows back through them.

Like Liger's, the Function returns the weighted sum of the terms as its one differentiable output, and the terms
themselves, detached, for the log. Returning each term with its own gradient would need one set of gradient
matmuls per term, half again the projection's compute at every step.

Precision: the projections run in the input's dtype (or autocast's); softmax, log-sum-exp, the terms and the
gradient sums over chunks in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class VocabProjection:
    """Rows entering a model's vocabulary projection and the projection: logits = inputs @ weight.T + bias."""

    inputs: Tensor  # [N, H]
    weight: Tensor  # [V, H]
    bias: Tensor | None  # [V]


@dataclass(frozen=True)
class LmHeadLossWeights:
    """Weights of the vocabulary-logit terms in the loss (the stage's alpha_ce, alpha_mlm, alpha_mse)."""

    ce: float = 0.0
    mlm: float = 0.0
    mse: float = 0.0


def chunked_lm_head_losses(
    student: VocabProjection,
    teacher: VocabProjection,
    row_labels: Tensor,
    temperature: float,
    weights: LmHeadLossWeights,
    chunk_rows: int,
    ignore_index: int = -100,
) -> dict[str, Tensor]:
    """The vocabulary-logit terms over N rows, chunk by chunk, with their gradient formed as they go.

    - ce: T² · (1/N) Σ_rows KL(softmax(t/T) ‖ softmax(s/T)), ``KLDivLoss(reduction="batchmean")`` · T².
    - mlm: mean cross-entropy of the rows whose ``row_labels`` is not ``ignore_index`` (0 when there is none).
    - mse: Σ (s − t)² / N, computed only when its weight is > 0.
    - loss: weights.ce·ce + weights.mlm·mlm + weights.mse·mse, the one term that carries gradients (to
      ``student.inputs``, ``student.weight`` and ``student.bias``; the teacher gets none).

    ``row_labels`` ``[N]`` holds each row's true token id, or ``ignore_index``. The chunking changes nothing but
    memory: any ``chunk_rows`` >= 1 gives the same values within float rounding.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if student.inputs.shape[0] != teacher.inputs.shape[0] or student.inputs.shape[0] != row_labels.shape[0]:
        raise ValueError(f"student rows {student.inputs.shape[0]}, teacher rows {teacher.inputs.shape[0]} and "
                         f"labels {row_labels.shape[0]} must match")
    if student.weight.shape[0] != teacher.weight.shape[0]:
        raise ValueError(f"student vocabulary {student.weight.shape[0]} differs from the teacher's "
                         f"{teacher.weight.shape[0]}")
    # Under no_grad (evaluation) the gradient matmuls would be thrown away: skip them.
    compute_grads = torch.is_grad_enabled() and any(
        tensor is not None and tensor.requires_grad for tensor in (student.inputs, student.weight, student.bias))
    loss, ce, mlm, mse = ChunkedLmHeadLoss.apply(
        student.inputs, student.weight, student.bias,
        teacher.inputs.detach(), teacher.weight.detach(), _detached(teacher.bias),
        row_labels, temperature, weights.ce, weights.mlm, weights.mse, chunk_rows, ignore_index, compute_grads,
    )
    terms = {"loss": loss, "ce": ce, "mlm": mlm}
    if weights.mse > 0:
        terms["mse"] = mse
    return terms


class ChunkedLmHeadLoss(torch.autograd.Function):
    """Forward computes the weighted vocabulary-logit loss and its gradients chunk by chunk; backward scales them.

    Call through ``chunked_lm_head_losses``. Outputs: (weighted loss, ce, mlm, mse); only the first is
    differentiable.
    """

    @staticmethod
    def forward(ctx, student_inputs, student_weight, student_bias, teacher_inputs, teacher_weight, teacher_bias,
                row_labels, temperature, ce_weight, mlm_weight, mse_weight, chunk_rows, ignore_index, compute_grads):
        n_rows = student_inputs.shape[0]
        # Softmax, log-sum-exp, the terms and the gradient sums in fp32 (fp64 when the inputs are fp64).
        float_dtype = torch.promote_types(student_inputs.dtype, torch.float32)
        labelled = row_labels.ne(ignore_index)
        n_labelled = labelled.sum().clamp(min=1).to(float_dtype)  # a device tensor: no host sync
        safe_labels = torch.where(labelled, row_labels, 0)  # any valid id; these rows are weighted out
        # Every chunk's logit gradient is scaled by n_rows and divided by it after the matmuls, in fp32: gradients
        # of a per-row mean are ~1/N, small enough that fp16 autocast would flush them to zero.
        mlm_row_scale = mlm_weight * n_rows / n_labelled
        ce_sum = torch.zeros((), dtype=float_dtype, device=student_inputs.device)
        mlm_sum, mse_sum = torch.zeros_like(ce_sum), torch.zeros_like(ce_sum)
        if compute_grads:
            grad_inputs = torch.empty_like(student_inputs)
            grad_weight_sum = torch.zeros_like(student_weight, dtype=float_dtype)
            grad_bias_sum = torch.zeros(student_weight.shape[0], dtype=float_dtype, device=student_weight.device)
        weight_for_grads = None  # the weight in the projection's dtype, made on the first chunk

        for start in range(0, n_rows, chunk_rows):
            rows = slice(start, min(start + chunk_rows, n_rows))
            student_logits = F.linear(student_inputs[rows], student_weight, student_bias)
            matmul_dtype = student_logits.dtype  # the input's, or autocast's (bf16)
            logits = student_logits.to(float_dtype)
            del student_logits
            teacher_logits = F.linear(teacher_inputs[rows], teacher_weight, teacher_bias).to(float_dtype)
            chunk_labels, chunk_labelled = safe_labels[rows].unsqueeze(1), labelled[rows].unsqueeze(1)

            student_log_probs_t = F.log_softmax(logits / temperature, dim=-1)
            teacher_probs_t = F.softmax(teacher_logits / temperature, dim=-1)
            ce_sum += F.kl_div(student_log_probs_t, teacher_probs_t, reduction="sum")
            student_log_probs = student_log_probs_t if temperature == 1 else F.log_softmax(logits, dim=-1)
            mlm_sum -= (student_log_probs.gather(1, chunk_labels) * chunk_labelled).sum()
            if mse_weight > 0:
                mse_sum += (logits - teacher_logits).pow(2).sum()
            if not compute_grads:
                continue

            # d(loss)/d(logits) of the chunk's rows, times n_rows: the analytic gradients of the module docstring.
            logit_grad = (student_log_probs_t.exp() - teacher_probs_t).mul_(ce_weight * temperature)
            del student_log_probs_t, teacher_probs_t
            probs_minus_onehot = student_log_probs.exp().scatter_add_(1, chunk_labels, -torch.ones_like(logits[:, :1]))
            del student_log_probs
            logit_grad += probs_minus_onehot.mul_(chunk_labelled * mlm_row_scale)
            del probs_minus_onehot
            if mse_weight > 0:
                logit_grad += (logits - teacher_logits).mul_(2 * mse_weight)
            del logits, teacher_logits

            if weight_for_grads is None:
                weight_for_grads = student_weight.to(matmul_dtype)
            matmul_grad = logit_grad.to(matmul_dtype)
            grad_inputs[rows] = (matmul_grad @ weight_for_grads).to(float_dtype).div_(n_rows)
            grad_weight_sum += matmul_grad.t() @ student_inputs[rows].to(matmul_dtype)
            grad_bias_sum += logit_grad.sum(0)

        rows_or_one = max(n_rows, 1)  # no rows: every term is 0
        ce = ce_sum * temperature**2 / rows_or_one
        mlm = mlm_sum / n_labelled
        mse = mse_sum / rows_or_one
        loss = ce_weight * ce + mlm_weight * mlm + mse_weight * mse
        if compute_grads:
            grad_weight = (grad_weight_sum / rows_or_one).to(student_weight.dtype)
            grad_bias = None if student_bias is None else (grad_bias_sum / rows_or_one).to(student_bias.dtype)
            ctx.save_for_backward(grad_inputs, grad_weight, grad_bias)
        ctx.mark_non_differentiable(ce, mlm, mse)
        return loss, ce, mlm, mse

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_mlm, _grad_mse):
        grad_inputs, grad_weight, grad_bias = ctx.saved_tensors
        scaled = [None if grad is None else grad * grad_loss.to(grad.dtype)
                  for grad in (grad_inputs, grad_weight, grad_bias)]
        return (*scaled, *[None] * 11)


def _detached(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.detach()
