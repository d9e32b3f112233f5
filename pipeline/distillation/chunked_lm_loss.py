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
The chunk's logits are then dropped, so no [rows × vocab] tensor of the whole batch ever exists. Backward only
scales the saved gradients by the incoming one, as Liger-Kernel's fused-linear chunked losses do
(linkedin/Liger-Kernel ``chunked_loss/fused_linear_distillation.py``).

Shapes, for the GEMMs: the vocabulary is padded with zero rows of weight and bias up to a multiple of
``vocab_multiple`` (64: 30,522 -> 30,528), so the three vocabulary GEMMs (logits = x·Wᵀ, input gradient = g·W,
weight gradient = gᵀ·x, whose operand gᵀ has the vocabulary as its leading dimension) get aligned operands: at
30,522 columns cuBLAS/CUTLASS fall back to 2-element-aligned kernels. Inside the loss the extra columns are cut off
as a view before any softmax (so no probability, log-probability or -inf is formed for them: a -inf log-probability
times a 0 probability in the KL would be NaN), their gradient is 0, and the gradients returned are sliced back to the
real vocabulary: the model itself never changes shape. Where the chunk is compiled, the rows are padded too, with
zero-weight rows, so every chunk of a batch has one shape (``chunk_rows``, or for a batch smaller than one chunk
its rows rounded up to 64): torch.compile then compiles one graph, not one per tail. Eager, a short last chunk
costs nothing and padding rows would.

Fused chunk: ``chunk_terms_and_logit_gradient`` takes one chunk's student and teacher logits and returns the
chunk's KL, CE and MSE sums, its logit gradient in the matmul dtype and its bias gradient: every elementwise pass
over the [chunk × vocab] grid in one function, which torch.compile fuses into a few kernels on CUDA (on CPU it
runs eager: see ``compile_chunks``).

Why not Liger-Kernel itself (0.8.5): it requires ``triton``, the GPU kernel compiler, on every install, a GPU
dependency this CPU-first project will not add; and its distillation base applies the soft loss to the same
rows as the hard one, normalises it by their count and has no T² factor, while DistilBERT's soft term runs over
every non-padding token and its MLM term over the masked ones only, each with its own mean.

What is chunked: only the final vocabulary projection (``vocab_projector`` of DistilBertForMaskedLM, the
``decoder`` of BERT's MLM head). The layers before it map [rows × hidden] to [rows × hidden], no larger than the
encoder's own activations, so they stay in ordinary autograd and the gradient computed here for the projection's
input flows back through them.

Like Liger's, the Function returns the weighted sum of the terms as its one differentiable output, and the terms
themselves, detached, for the log. Returning each term with its own gradient would need one set of gradient
matmuls per term, half again the projection's compute at every step.

Precision: the projections run in the input's dtype (or autocast's); softmax, log-sum-exp, the terms and the
gradient sums over chunks in fp32 (fp64 for fp64 inputs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

VOCAB_MULTIPLE = 64  # 128-byte rows in bf16: the alignment cuBLAS and CUTLASS's fast GEMM kernels want
ROW_MULTIPLE = 64  # a batch smaller than one chunk is padded to this many rows, so few shapes get compiled
PROFILER_RANGE = "chunked_lm_head_losses"


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


@dataclass(frozen=True)
class ChunkLayout:
    """How the rows and the vocabulary are cut and padded; none of it changes the result beyond float rounding.

    compile_chunks: torch.compile the fused chunk function; None compiles it on CUDA only. On 2 CPU cores, at the
    default config's shapes, the compiled chunk saves about what its compilations cost (each new chunk shape
    compiles again; docs/scale.md), and it would need a C++ compiler wherever the pipeline runs."""

    chunk_rows: int
    vocab_multiple: int = VOCAB_MULTIPLE
    compile_chunks: bool | None = None

    def resolved_compile(self, device: torch.device) -> bool:
        """Whether the chunk is compiled for inputs on this device."""
        return device.type == "cuda" if self.compile_chunks is None else self.compile_chunks

    def __post_init__(self) -> None:
        if self.chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {self.chunk_rows}")
        if self.vocab_multiple < 1:
            raise ValueError(f"vocab_multiple must be >= 1, got {self.vocab_multiple}")


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def chunk_shape_rows(n_rows: int, chunk_rows: int) -> int:
    """The rows of every chunk of an n_rows batch: chunk_rows, or a smaller batch's rows rounded up to 64 (never
    above chunk_rows)."""
    if n_rows >= chunk_rows:
        return chunk_rows
    return min(round_up(max(n_rows, 1), ROW_MULTIPLE), chunk_rows)


def chunked_lm_head_losses(
    student: VocabProjection,
    teacher: VocabProjection,
    row_labels: Tensor,
    temperature: float,
    weights: LmHeadLossWeights,
    layout: ChunkLayout | int,
    ignore_index: int = -100,
) -> dict[str, Tensor]:
    """The vocabulary-logit terms over N rows, chunk by chunk, with their gradient formed as they go.

    - ce: T² · (1/N) Σ_rows KL(softmax(t/T) ‖ softmax(s/T)), ``KLDivLoss(reduction="batchmean")`` · T².
    - mlm: mean cross-entropy of the rows whose ``row_labels`` is not ``ignore_index`` (0 when there is none).
    - mse: Σ (s − t)² / N, computed only when its weight is > 0.
    - loss: weights.ce·ce + weights.mlm·mlm + weights.mse·mse, the one term that carries gradients (to
      ``student.inputs``, ``student.weight`` and ``student.bias``; the teacher gets none).

    ``row_labels`` ``[N]`` holds each row's true token id, or ``ignore_index``. ``layout`` (or just its
    chunk_rows) changes nothing but memory and speed: any layout gives the same values within float rounding.
    """
    layout = layout if isinstance(layout, ChunkLayout) else ChunkLayout(chunk_rows=layout)
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
    compiled = layout.resolved_compile(student.inputs.device)
    settings = _Settings(temperature=float(temperature), ce_weight=float(weights.ce), mlm_weight=float(weights.mlm),
                         mse_weight=float(weights.mse), chunk_rows=layout.chunk_rows,
                         vocab_multiple=layout.vocab_multiple, compiled=compiled, ignore_index=ignore_index,
                         compute_grads=compute_grads)
    # A named range, so a profile can tell the loss's share of a step (its gradient work included: it runs here).
    with torch.profiler.record_function(PROFILER_RANGE):
        loss, ce, mlm, mse = ChunkedLmHeadLoss.apply(
            student.inputs, student.weight, student.bias,
            teacher.inputs.detach(), teacher.weight.detach(), _detached(teacher.bias), row_labels, settings,
        )
    terms = {"loss": loss, "ce": ce, "mlm": mlm}
    if weights.mse > 0:
        terms["mse"] = mse
    return terms


def chunk_terms_and_logit_gradient(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    row_weights: Tensor | None,
    labelled: Tensor,
    mlm_scale: Tensor,
    *,
    n_columns: int,
    temperature: float,
    ce_weight: float,
    mse_weight: float,
    with_gradient: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """One chunk, fused: [C, V'] student and teacher logits (V' >= n_columns; the columns past n_columns are the
    vocabulary's padding) -> the chunk's KL sum, CE sum, squared-error sum, and with_gradient its [C, V'] logit
    gradient in the logits' dtype (0 on the padding) and its [n_columns] column sums (the bias gradient) in fp32.

    labels [C]: each row's label (any valid id where it has none); row_weights [C]: 1 for a real row, 0 for a
    padding row (None: every row is real); labelled [C]: 1 for a row with a label, else 0; mlm_scale (0-d): the CE
    gradient's weight of a labelled row. The gradient is that of ce_weight·T²·KL + mlm_scale·Σ_labelled CE +
    mse_weight·Σ(s − t)², summed over the chunk's rows (the caller divides by its row count)."""
    float_dtype = torch.promote_types(student_logits.dtype, torch.float32)
    # The padding columns are cut off as a view before any softmax: no probability, log-probability or -inf is ever
    # formed for them (a -inf log-probability times a 0 probability in the KL would be NaN).
    student = student_logits[:, :n_columns].to(float_dtype)
    teacher = teacher_logits[:, :n_columns].to(float_dtype)

    student_log_probs_t = F.log_softmax(student / temperature, dim=1)
    teacher_log_probs_t = F.log_softmax(teacher / temperature, dim=1)
    teacher_probs_t = teacher_log_probs_t.exp()
    kl_rows = (teacher_probs_t * (teacher_log_probs_t - student_log_probs_t)).sum(1)
    ce_sum = (kl_rows if row_weights is None else kl_rows * row_weights).sum()
    student_log_probs = student_log_probs_t if temperature == 1 else F.log_softmax(student, dim=1)
    label_log_probs = student_log_probs.gather(1, labels.unsqueeze(1)).squeeze(1)
    mlm_sum = -(label_log_probs * labelled).sum()
    mse_sum = torch.zeros((), dtype=float_dtype, device=student.device)
    difference = None
    if mse_weight > 0:
        difference = student - teacher
        squared_rows = difference.pow(2).sum(1)
        mse_sum = (squared_rows if row_weights is None else squared_rows * row_weights).sum()
    if not with_gradient:
        return ce_sum, mlm_sum, mse_sum, None, None

    # T²·KL(p_t ‖ p_s) with p = softmax(z/T): the chain rule's 1/T leaves one factor T.
    gradient = student_log_probs_t.exp().sub_(teacher_probs_t).mul_(ce_weight * temperature)
    del teacher_probs_t
    probs_minus_onehot = student_log_probs.exp().scatter_add_(1, labels.unsqueeze(1),
                                                              -torch.ones_like(label_log_probs).unsqueeze(1))
    gradient += probs_minus_onehot.mul_((labelled * mlm_scale).unsqueeze(1))
    del probs_minus_onehot
    if difference is not None:
        gradient += difference.mul_(2 * mse_weight)
    if row_weights is not None:
        gradient.mul_(row_weights.unsqueeze(1))
    padding = student_logits.shape[1] - n_columns
    matmul_gradient = gradient.to(student_logits.dtype)
    if padding:
        matmul_gradient = F.pad(matmul_gradient, (0, padding))  # the padding columns' gradient: 0
    return ce_sum, mlm_sum, mse_sum, matmul_gradient, gradient.sum(0)


@functools.cache
def _compiled_chunk_function():
    # One compiled graph per chunk shape and setting; dynamic=False: every chunk of a batch has one shape.
    return torch.compile(chunk_terms_and_logit_gradient, dynamic=False, fullgraph=True)


def chunk_function(compiled: bool):
    return _compiled_chunk_function() if compiled else chunk_terms_and_logit_gradient


@dataclass(frozen=True)
class _Settings:
    temperature: float
    ce_weight: float
    mlm_weight: float
    mse_weight: float
    chunk_rows: int
    vocab_multiple: int
    compiled: bool
    ignore_index: int
    compute_grads: bool


class ChunkedLmHeadLoss(torch.autograd.Function):
    """Forward computes the weighted vocabulary-logit loss and its gradients chunk by chunk; backward scales them.

    Call through ``chunked_lm_head_losses``. Outputs: (weighted loss, ce, mlm, mse); only the first is
    differentiable.
    """

    @staticmethod
    def forward(ctx, student_inputs, student_weight, student_bias, teacher_inputs, teacher_weight, teacher_bias,
                row_labels, settings: _Settings):
        n_rows, vocab = student_inputs.shape[0], student_weight.shape[0]
        device = student_inputs.device
        # Softmax, log-sum-exp, the terms and the gradient sums in fp32 (fp64 when the inputs are fp64).
        float_dtype = torch.promote_types(student_inputs.dtype, torch.float32)
        matmul_dtype = _matmul_dtype(student_inputs)
        padded_vocab = round_up(vocab, settings.vocab_multiple)
        if settings.compiled:  # every chunk one shape, for one compiled graph
            rows_per_chunk = chunk_shape_rows(n_rows, settings.chunk_rows)
            padded_rows = round_up(n_rows, rows_per_chunk) if n_rows else 0
        else:  # eager: a short last chunk costs nothing, padding rows would
            rows_per_chunk, padded_rows = max(min(settings.chunk_rows, n_rows), 1), n_rows

        # The weights cast and padded once per call, not once per chunk.
        student_w = _pad_rows(student_weight.to(matmul_dtype), padded_vocab)
        student_b = None if student_bias is None else _pad_rows(student_bias.to(matmul_dtype), padded_vocab)
        teacher_w = _pad_rows(teacher_weight, padded_vocab)
        teacher_b = None if teacher_bias is None else _pad_rows(teacher_bias, padded_vocab)
        student_x = _pad_rows(student_inputs, padded_rows)
        teacher_x = _pad_rows(teacher_inputs, padded_rows)

        labels = _pad_rows(row_labels, padded_rows, value=settings.ignore_index)
        labelled = labels.ne(settings.ignore_index)
        n_labelled = labelled.sum().clamp(min=1).to(float_dtype)  # a device tensor: no host sync
        safe_labels = torch.where(labelled, labels, 0)  # any valid id; these rows are weighted out
        row_weights = ((torch.arange(padded_rows, device=device) < n_rows).to(float_dtype) if padded_rows > n_rows
                       else None)
        # Every chunk's logit gradient is scaled by n_rows and divided by it after the matmuls, in fp32: gradients
        # of a per-row mean are ~1/N, small enough that fp16 autocast would flush them to zero.
        mlm_scale = settings.mlm_weight * n_rows / n_labelled
        labelled = labelled.to(float_dtype)

        ce_sum = torch.zeros((), dtype=float_dtype, device=device)
        mlm_sum, mse_sum = torch.zeros_like(ce_sum), torch.zeros_like(ce_sum)
        if settings.compute_grads:
            grad_inputs = torch.empty_like(student_x)
            grad_weight_sum = torch.zeros((padded_vocab, student_weight.shape[1]), dtype=float_dtype, device=device)
            grad_bias_sum = torch.zeros(vocab, dtype=float_dtype, device=device)
        fused_chunk = chunk_function(settings.compiled)

        for start in range(0, padded_rows, rows_per_chunk):
            rows = slice(start, min(start + rows_per_chunk, padded_rows))
            chunk_x = student_x[rows].to(matmul_dtype)
            student_logits = F.linear(chunk_x, student_w, student_b)
            teacher_logits = F.linear(teacher_x[rows], teacher_w, teacher_b)
            chunk_ce, chunk_mlm, chunk_mse, logit_grad, bias_grad = fused_chunk(
                student_logits, teacher_logits, safe_labels[rows], None if row_weights is None else row_weights[rows], labelled[rows], mlm_scale,
                n_columns=vocab, temperature=settings.temperature, ce_weight=settings.ce_weight,
                mse_weight=settings.mse_weight, with_gradient=settings.compute_grads)
            del student_logits, teacher_logits
            ce_sum += chunk_ce
            mlm_sum += chunk_mlm
            mse_sum += chunk_mse
            if not settings.compute_grads:
                continue
            logit_grad = logit_grad.to(matmul_dtype)
            grad_inputs[rows] = (logit_grad @ student_w).to(float_dtype).div_(max(n_rows, 1))
            _accumulate_product(grad_weight_sum, logit_grad.t(), chunk_x)
            grad_bias_sum += bias_grad

        rows_or_one = max(n_rows, 1)  # no rows: every term is 0
        ce = ce_sum * settings.temperature**2 / rows_or_one
        mlm = mlm_sum / n_labelled
        mse = mse_sum / rows_or_one
        loss = settings.ce_weight * ce + settings.mlm_weight * mlm + settings.mse_weight * mse
        if settings.compute_grads:
            grad_weight = (grad_weight_sum[:vocab] / rows_or_one).to(student_weight.dtype)
            grad_bias = (None if student_bias is None
                         else (grad_bias_sum / rows_or_one).to(student_bias.dtype))
            ctx.save_for_backward(grad_inputs[:n_rows], grad_weight, grad_bias)
        ctx.mark_non_differentiable(ce, mlm, mse)
        return loss, ce, mlm, mse

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_mlm, _grad_mse):
        grad_inputs, grad_weight, grad_bias = ctx.saved_tensors
        scaled = [None if grad is None else grad * grad_loss.to(grad.dtype)
                  for grad in (grad_inputs, grad_weight, grad_bias)]
        return (*scaled, *[None] * 5)


def _matmul_dtype(inputs: Tensor) -> torch.dtype:
    """The dtype F.linear computes in here: autocast's where it is on for the inputs' device, else the inputs'."""
    device_type = inputs.device.type
    if inputs.dtype == torch.float32 and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return inputs.dtype


def _accumulate_product(total: Tensor, left: Tensor, right: Tensor) -> None:
    """total += left @ right: one in-place GEMM where the dtypes agree; a low-precision product is added in fp32."""
    if left.dtype == total.dtype:
        torch.addmm(total, left, right, out=total)  # addmm's out= form: FLOP counters see it, addmm_ they miss
    else:
        total += left @ right


def _pad_rows(tensor: Tensor, n_rows: int, value: float = 0) -> Tensor:
    """The tensor with rows of `value` appended up to n_rows along dim 0 (itself when it has that many)."""
    missing = n_rows - tensor.shape[0]
    if missing == 0:
        return tensor
    return torch.cat([tensor, tensor.new_full((missing, *tensor.shape[1:]), value)])


def _detached(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.detach()
