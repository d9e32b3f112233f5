"""The GEMM ceiling and the peak: the step's matmul shapes timed alone, the vocabulary GEMMs, the GPUs' peaks."""

from __future__ import annotations

import collections
import math
import time

import torch

from benchmarks.distill_throughput.device import synchronize
from benchmarks.distill_throughput.flops import EncoderShape
from pipeline.distillation.chunked_lm_loss import chunk_shape_rows, round_up


def step_matmul_shapes(teacher: EncoderShape, student: EncoderShape, encoder_rows: int, head_rows: int,
                       chunk_rows: int, vocab_multiple: int = 1, padded_chunks: bool = True) -> list[dict]:
    """Every matmul of one micro-batch as (m, n, k, layout, count): out[m, n] = a[m, k] @ b[k, n]. The teacher's
    forward; the student's forward and, for each forward matmul, its input gradient (m, k, n) and weight gradient
    (n, k, m). Layouts as the step lays its operands out: "nt" for a Linear's forward (b = Wᵀ, a transposed view),
    "nn" for its input gradient (g·W), "tn" for its weight gradient (a = gᵀ, a transposed view). Q, K and V are
    projected in one matmul (the packed encoders); the chunked loss projects the vocabulary, padded to a multiple
    of vocab_multiple, in chunks of one shape where the chunk is compiled (padded_chunks: chunked_lm_loss.
    chunk_shape_rows), else in whole chunks and a shorter tail. Attention's own products run inside the attention
    kernels, not here."""
    counted: collections.Counter = collections.Counter()
    if padded_chunks:
        chunk = chunk_shape_rows(head_rows, chunk_rows) if head_rows else 0
        vocabulary_chunks = [(chunk, round_up(head_rows, chunk) // chunk if head_rows else 0)]
    else:
        chunk = min(chunk_rows, head_rows)
        vocabulary_chunks = [(chunk, head_rows // chunk if chunk else 0), (head_rows % chunk if chunk else 0, 1)]
    for shape, with_backward in ((teacher, False), (student, True)):
        h, i, layers = shape.hidden, shape.intermediate, shape.layers
        forward = [((encoder_rows, 3 * h, h), layers), ((encoder_rows, h, h), layers),
                   ((encoder_rows, i, h), layers), ((encoder_rows, h, i), layers), ((head_rows, h, h), 1)]
        forward += [((rows, round_up(shape.vocab, vocab_multiple), h), count) for rows, count in vocabulary_chunks]
        for (m, n, k), count in forward:
            if not count or not m:
                continue
            counted[(m, n, k, "nt")] += count
            if with_backward:
                counted[(m, k, n, "nn")] += count  # d input = d out [m, n] @ weight [n, k]
                counted[(n, k, m, "tn")] += count  # d weight = d out^T [n, m] @ input [m, k]
    return [{"m": m, "n": n, "k": k, "layout": layout, "count": count}
            for (m, n, k, layout), count in sorted(counted.items())]


def matmul_operands(m: int, n: int, k: int, layout: str, dtype: torch.dtype, device: torch.device):
    """a [m, k] and b [k, n] laid out as the step lays them: "n" a row-major matrix, "t" the transposed view of
    one (its leading dimension the other side's)."""
    a = torch.randn(k, m, dtype=dtype, device=device).t() if layout[0] == "t" else torch.randn(m, k, dtype=dtype,
                                                                                              device=device)
    b = torch.randn(n, k, dtype=dtype, device=device).t() if layout[1] == "t" else torch.randn(k, n, dtype=dtype,
                                                                                              device=device)
    return a, b


def time_matmul(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, min_seconds: float,
                layout: str = "nn") -> float:
    """Seconds per torch.mm of [m, k] @ [k, n] in the given operand layout: one warm-up call, one to size the run,
    then enough calls to fill `min_seconds` (at least 3), timed with CUDA events on a GPU and the wall clock on
    CPU."""
    a, b = matmul_operands(m, n, k, layout, dtype, device)
    out = torch.empty(m, n, dtype=dtype, device=device)
    torch.mm(a, b, out=out)
    synchronize(device)
    started = time.perf_counter()
    torch.mm(a, b, out=out)
    synchronize(device)
    calls = max(3, math.ceil(min_seconds / max(time.perf_counter() - started, 1e-6)))
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            torch.mm(a, b, out=out)
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1000 / calls
    started = time.perf_counter()
    for _ in range(calls):
        torch.mm(a, b, out=out)
    return (time.perf_counter() - started) / calls


VOCABULARY_GEMMS = {  # the loss's three vocabulary GEMMs per chunk, as (m, n, k, layout) of rows, hidden, vocab
    "logits": lambda rows, hidden, vocab: (rows, vocab, hidden, "nt"),  # x · Wᵀ
    "input_gradient": lambda rows, hidden, vocab: (rows, hidden, vocab, "nn"),  # g · W
    "weight_gradient": lambda rows, hidden, vocab: (vocab, hidden, rows, "tn"),  # gᵀ · x, gᵀ a view of [rows, V]
}


def vocabulary_gemms(rows: int, hidden: int, vocabularies: list[int], dtype: torch.dtype, device: torch.device,
                     min_seconds: float) -> list[dict]:
    """TFLOP/s of each vocabulary GEMM of a chunk, at each vocabulary size, in the operand layouts the loss uses."""
    results = []
    for vocab in vocabularies:
        for name, shape in VOCABULARY_GEMMS.items():
            m, n, k, layout = shape(rows, hidden, vocab)
            seconds = time_matmul(m, n, k, dtype, device, min_seconds, layout)
            results.append({"vocab": vocab, "gemm": name, "m": m, "n": n, "k": k, "layout": layout,
                            "seconds": round(seconds, 9), "tflops": round(2 * m * n * k / seconds / 1e12, 4)})
    return results


def gemm_round(shapes: list[dict], dtype: torch.dtype, device: torch.device, min_seconds: float) -> dict:
    """Each shape timed alone; the ceiling is the step's matmul FLOPs over the time those shapes take alone."""
    per_shape = [time_matmul(s["m"], s["n"], s["k"], dtype, device, min_seconds, s["layout"]) for s in shapes]
    flops = sum(2 * s["m"] * s["n"] * s["k"] * s["count"] for s in shapes)
    seconds = sum(t * s["count"] for t, s in zip(per_shape, shapes))
    return {
        "seconds_per_step_matmuls": round(seconds, 6),
        "achieved_tflops": round(flops / seconds / 1e12, 4),
        "tflops_by_shape": [round(2 * s["m"] * s["n"] * s["k"] / t / 1e12, 4) for s, t in zip(shapes, per_shape)],
    }


# Dense (no sparsity) tensor-core peaks, TFLOP/s, from NVIDIA's datasheets (H100/H200 SXM: 1,979 bf16 TFLOP/s "with
# sparsity" = 989.4 dense; A100: 312). fp32: the CUDA cores' peak (TF32 off, PyTorch's default for matmuls).
PEAK_TFLOPS = (
    ("H200 NVL", None),  # other clocks and power than the SXM part: no figure on record here
    ("H100 NVL", None),
    ("H200", {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM5 (the "H100 80GB HBM3" of nvidia-smi)
    ("A100", {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}),
)


def peak_tflops(device_name: str | None, precision: str) -> dict:
    """The dense peak of a known GPU at `precision` (bf16, tf32, fp32), or null with the reason."""
    if device_name is None:
        return {"tflops": None, "precision": precision, "reason": "CPU: no peak on record; the measured GEMM "
                "ceiling stands in (fraction_of_gemm_ceiling)"}
    for marker, peaks in PEAK_TFLOPS:
        if marker.lower() in device_name.lower():
            if peaks is None:
                break
            return {"tflops": peaks[precision], "precision": precision,
                    "source": f"NVIDIA datasheet, {marker}, dense {precision}"}
    return {"tflops": None, "precision": precision, "reason": f"no peak on record for {device_name!r}"}
