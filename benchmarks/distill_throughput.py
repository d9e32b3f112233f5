"""Benchmark: pretraining-distillation throughput and model FLOPs utilisation (MFU), measured the same way every time
(not a test).

A bert-base-sized teacher (random weights: 12 layers, 768 wide, 30,522 tokens) distills into a 6-layer DistilBERT
student initialised from teacher layers 0, 2, 4, 7, 9, 11, with distill_pretrain's own loss (`distillation_terms`)
at the shape of `configs/paper.yaml`'s distill_pretrain (sequence length, micro-batch token budget, chunked loss
rows, the packed layout's token multiple; each can be scaled down by a flag), fed exactly as the stage feeds it:
sequences read from a memory-mapped tokenized corpus (a tokenize_corpus folder, or one written here of random ids in
the same layout), token-budget batches, masking (with the token-frequency smoothing) in the DataLoader's workers,
pinned memory.

The protocol, in rounds: each round runs, one after the other, (1) the benchmark's own loop (`--warmup` untimed
steps, then `--steps` timed ones, with the time of each phase), (2) the stage's own loop, `pipeline.training.loop.train`
called with the arguments `distill_pretrain.run` gives it (the same number of steps; the first timed micro-batch's
start and the loop's return bound the timed span), and (3) a GEMM microbenchmark of the step's own matmul shapes.
`--repeats` rounds interleave the three, so a machine that drifts (clocks, other work) drifts for all of them alike;
the JSON records the order. Both loops read the same batches (the same seed and batch plan), so with one
micro-batch a step (`--grad-accum-steps 1`, the default) their FLOPs and tokens agree exactly. Then a `torch.profiler` trace of `--profile-steps` steps of the benchmark's loop gives the
time per kernel class.

    CPU smoke run (a 4-layer, 256-wide teacher and a 2-layer student, paper settings scaled down; under 3 minutes
    on 2 shared cores):
      .venv/bin/python -m benchmarks.distill_throughput --device cpu --threads 2 --workers 0 --teacher-layers 4 \
        --student-layers 2 --hidden 256 --intermediate 1024 --heads 4 --seq-len 128 --max-tokens 512 \
        --chunked-loss-rows 256 --packed-multiple 64 --warmup 1 --steps 3 --repeats 3 --profile-steps 2 \
        --gemm-min-seconds 0.05 --out benchmarks/results/distill_throughput_cpu.json
    One GPU at the paper's shape (3 rounds of 3 + 50 steps by default):
      python -m benchmarks.distill_throughput --device cuda --workers 6 \
        --out benchmarks/results/distill_throughput_paper_cuda.json

What the JSON holds:
- tokens/s and s/step (means of the benchmark loop's repeats, the headline fields), and per loop every repeat's
  tokens/s, s/step, model FLOPs, achieved TFLOP/s, MFU and fraction of the GEMM ceiling, with the spread (values,
  mean, min, max, Student's t 95 % interval);
- MFU = model FLOPs of the timed steps / their wall time / the GPU's dense peak at the run's precision. Model FLOPs
  are counted from each micro-batch's real tokens and sequence lengths (`flop_formula` in the JSON writes the
  formula out); on CPU there is no peak on record, so MFU is null with the reason, and the fraction of the measured
  GEMM ceiling stands in;
- the GEMM ceiling: the step's exact matmul shapes and operand layouts (from the model configs and the median
  micro-batch's rows; a Linear's forward x·Wᵀ, input gradient g·W and weight gradient gᵀ·x, gᵀ a transposed view),
  each timed alone, as FLOP/s over the step's mix, beside the peak;
- GPU clocks, power, temperature and utilisation sampled during each timed span (pynvml when installed, else
  nvidia-smi; null with the reason on CPU);
- the profile: seconds and shares per kernel class (gemm, attention, softmax_loss, elementwise, idle_other), from
  the profiler's key_averages, classified by op or kernel name; idle_other is the profiled wall time the other
  four classes leave (device idle, host overhead, copies and unclassified ops).

Nothing synchronises the device inside the benchmark loop's timed span: tokens/s is taken over the whole span, and
on CUDA the phase breakdown is the device's time between CUDA events recorded at the phase boundaries
(`data_wait`: the device waiting for the batch and its copy), beside the host's time to issue each phase
(`host_breakdown_seconds`). On CPU both are wall time. `--precision bf16` (the stage's default on CUDA) trains under
bf16 autocast with a bf16 teacher; `no` is fp32 throughout (TF32 off, PyTorch's default). Under `--compile` the
first steps compile for each new shape: give them `--warmup` steps.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import transformers
import yaml
from transformers import BertConfig, BertForMaskedLM

from pipeline.data.corpus import TokenizedCorpus, token_budget_batches
from pipeline.data.masking import selection_weights_from_counts
from pipeline.data.mlm_batches import MaskedBatchCollator, special_token_ids
from pipeline.distillation.chunked_lm_loss import ChunkLayout, chunk_shape_rows, round_up
from pipeline.distillation.students import freeze, init_student_from_teacher, student_config_from_teacher, teacher_layers_for_student
from pipeline.measurement.statistics import t_interval
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.outputs.machine import cpu_description
from pipeline.plan.config import DistillPretrainConfig, load_config
from pipeline.stages.distill_pretrain import distillation_terms, encoders
from pipeline.training.batching import micro_batch_loader, to_device
from pipeline.training.loop import build_optimizer, train
from pipeline.training.run_settings import maybe_compile, peak_memory_mib

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "default.yaml"
PAPER_CONFIG = PROJECT_ROOT / "configs" / "paper.yaml"
REFERENCE = "Sanh et al. 2019 trained on 8 V100 GPUs for about 90 hours"
PHASES = ("data_wait", "forward", "backward", "optimizer")
MINIMUM_PROTOCOL = {"repeats": 3, "steps": 50}  # what a reported figure needs; smaller runs are smoke runs
SEED = 0

# ---------------------------------------------------------------------------------------------------------------
# Model FLOPs
# ---------------------------------------------------------------------------------------------------------------

FLOP_FORMULA = {
    "mfu": "model FLOPs of the timed steps / their wall time / the GPU's dense peak at the run's precision",
    "micro_batch": "teacher_forward + 3 x student_forward: the student's backward is 2 x its forward (each matmul's "
                   "input gradient and weight gradient); the frozen teacher runs forward only",
    "model_forward": "layers x (2 N (4 H^2 + 2 H I) + 4 H sum_i L_i^2) + 2 R (H^2 + H V)",
    "symbols": "L_i: each sequence's real tokens with [CLS] and [SEP]; N = sum_i L_i; H: hidden width; I: "
               "feed-forward width; V: vocabulary; R: rows the vocabulary head reads (every real token, or the "
               "masked ones under restrict_ce_to_mask)",
    "counted": "per layer and token the Q, K, V and attention-output projections (4 x 2 H^2) and the two "
               "feed-forward matmuls (2 x 2 H I); per layer and sequence the attention scores Q K^T and their "
               "product with V (2 L^2 H each); the MLM head's transform (2 H^2) and vocabulary projection (2 H V) "
               "per head row",
    "not_counted": "padding (padded rows, the packed path's padding sequences, attention over padded keys), "
                   "embedding lookups, LayerNorm, GELU, softmax, dropout, the losses' elementwise work, the "
                   "optimizer, and the attention backward's recomputation of the scores (flash attention recomputes "
                   "them; model FLOPs count them once)",
}


@dataclass(frozen=True)
class EncoderShape:
    """What the FLOP count needs of a BERT or DistilBERT model."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    vocab: int

    @classmethod
    def of(cls, config) -> "EncoderShape":
        """From a BertConfig or a DistilBertConfig (which names the feed-forward width hidden_dim)."""
        intermediate = getattr(config, "intermediate_size", None) or config.hidden_dim
        return cls(config.num_hidden_layers, config.hidden_size, intermediate, config.num_attention_heads,
                   config.vocab_size)


def encoder_forward_flops(shape: EncoderShape, n_tokens: int, attention_lengths) -> dict[str, int]:
    """Matmul FLOPs of the encoder layers' forward over `n_tokens` rows, attention within sequences of
    `attention_lengths` (multiply-add = 2 FLOPs)."""
    h, i = shape.hidden, shape.intermediate
    return {
        "linear": shape.layers * n_tokens * 2 * (4 * h * h + 2 * h * i),
        "attention": shape.layers * 4 * h * sum(int(length) ** 2 for length in attention_lengths),
    }


def head_forward_flops(shape: EncoderShape, rows: int) -> dict[str, int]:
    """The MLM head on `rows` rows: its transform dense (H x H) and the vocabulary projection (H x V)."""
    return {"head_transform": 2 * rows * shape.hidden ** 2, "vocab_projection": 2 * rows * shape.hidden * shape.vocab}


def model_flops(teacher: EncoderShape, student: EncoderShape, sequence_lengths, head_rows: int) -> dict[str, int]:
    """Model FLOPs of one distillation micro-batch (FLOP_FORMULA): teacher forward + student forward and backward,
    counted on the real tokens only."""
    n_tokens = sum(int(length) for length in sequence_lengths)
    parts = {}
    for name, shape in (("teacher", teacher), ("student", student)):
        parts[name] = {**encoder_forward_flops(shape, n_tokens, sequence_lengths), **head_forward_flops(shape, head_rows)}
    teacher_forward, student_forward = sum(parts["teacher"].values()), sum(parts["student"].values())
    return {
        "teacher_forward": teacher_forward,
        "student_forward": student_forward,
        "student_backward": 2 * student_forward,
        "attention": parts["teacher"]["attention"] + 3 * parts["student"]["attention"],
        "vocab_projection": parts["teacher"]["vocab_projection"] + 3 * parts["student"]["vocab_projection"],
        "total": teacher_forward + 3 * student_forward,
    }


# ---------------------------------------------------------------------------------------------------------------
# What the count reads of a batch
# ---------------------------------------------------------------------------------------------------------------

LENGTHS_KEY, HEAD_ROWS_KEY, EXECUTED_TOKENS_KEY = "count_sequence_lengths", "count_head_rows", "count_executed_tokens"


def real_sequence_lengths(batch: dict) -> tuple[int, ...]:
    """Each sequence's real tokens ([CLS] and [SEP] included) of a MaskedBatchCollator batch on the CPU: the rows of
    its attention mask, or the packed layout's sequences before its padding sequences."""
    if "cu_seqlens" not in batch:
        return tuple(int(n) for n in batch["attention_mask"].sum(dim=1).tolist())
    n_real, lengths, total = int(batch["n_tokens"]), [], 0
    for length in batch["cu_seqlens"].diff().tolist():
        if total >= n_real:
            break  # the padding sequences come after the real ones (pipeline.data.mlm_batches.pack_masked_batch)
        lengths.append(int(length))
        total += int(length)
    if total != n_real:
        raise ValueError(f"packed batch: its sequences hold {total} tokens before the padding, n_tokens says {n_real}")
    return tuple(lengths)


class CountingCollate:
    """The stage's collate, plus three host numbers the FLOP count reads: each sequence's real length, the rows
    the vocabulary head reads, and the rows the encoders run on (padding included). Counted on the CPU, in the
    loader's worker: nothing is read back from the device."""

    def __init__(self, collate, restrict_ce_to_mask: bool):
        self.collate, self.restrict_ce_to_mask = collate, restrict_ce_to_mask

    def __call__(self, sequences, generator=None) -> dict:
        batch = self.collate(sequences, generator)
        batch[LENGTHS_KEY] = real_sequence_lengths(batch)
        batch[HEAD_ROWS_KEY] = len(batch["masked_positions"]) if self.restrict_ce_to_mask else int(batch["n_tokens"])
        batch[EXECUTED_TOKENS_KEY] = batch["input_ids"].numel()
        return batch


@dataclass
class SpanCounts:
    """Tokens and model FLOPs of the micro-batches of a timed span."""

    teacher: EncoderShape
    student: EncoderShape
    micro_batches: int = 0
    tokens: int = 0
    executed_tokens: int = 0
    flops: collections.Counter = field(default_factory=collections.Counter)
    batch_rows: list = field(default_factory=list)  # (encoder rows, head rows) of each micro-batch

    def add(self, batch: dict) -> None:
        self.micro_batches += 1
        self.tokens += int(batch["n_tokens"])
        self.executed_tokens += int(batch[EXECUTED_TOKENS_KEY])
        self.flops.update(model_flops(self.teacher, self.student, batch[LENGTHS_KEY], batch[HEAD_ROWS_KEY]))
        self.batch_rows.append((int(batch[EXECUTED_TOKENS_KEY]), int(batch[HEAD_ROWS_KEY])))


# ---------------------------------------------------------------------------------------------------------------
# Kernel classes of a profile
# ---------------------------------------------------------------------------------------------------------------

KERNEL_CLASSES = ("gemm", "attention", "softmax_loss", "elementwise", "idle_other")
ATTENTION_MARKERS = ("flash", "fmha", "attention", "sdpa", "scaled_dot_product")
# cuBLAS / cuBLASLt / CUTLASS kernel families (nvjet: cuBLASLt's Hopper kernels; gemv: matrix-vector), Triton's
# matmul templates.
GEMM_MARKERS = ("gemm", "gemv", "nvjet", "cublas", "cutlass", "xmma", "s16816", "s1688", "wmma", "triton_tem")
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_addmm_activation",
            "aten::matmul", "aten::linear", "aten::mkldnn_matmul", "aten::mv", "aten::dot"}
SOFTMAX_LOSS_MARKERS = ("softmax", "kl_div", "nll_loss", "cross_entropy", "logsumexp")
# Every other kernel of PyTorch or Triton is memory-bound pointwise, normalisation, reduction, indexing or copy work.
ELEMENTWISE_MARKERS = ("at::native", "elementwise", "vectorized", "reduce", "norm", "dropout", "adam",
                       "multi_tensor", "index", "gather", "scatter", "embedding", "catarray", "triton_poi",
                       "triton_red", "triton_per")
# ATen ops that only describe tensors (views, allocation, metadata): their self time is dispatch overhead.
METADATA_OPS = {"empty", "empty_strided", "empty_like", "view", "_unsafe_view", "reshape", "as_strided", "t",
                "transpose", "permute", "expand", "expand_as", "slice", "select", "unsqueeze", "squeeze", "detach",
                "alias", "unbind", "split", "split_with_sizes", "chunk", "contiguous", "resize_", "result_type",
                "lift_fresh", "flatten", "item", "_local_scalar_dense", "is_nonzero", "size", "stride", "numel",
                "narrow", "unflatten", "view_as", "_reshape_alias", "set_", "record_stream", "to", "type_as"}


def kernel_class(name: str) -> str:
    """gemm, attention, softmax_loss, elementwise, or other, from a profiler event's op or kernel name."""
    lower = name.lower()
    if name.startswith("autograd::") or "memcpy" in lower or "memset" in lower:
        return "other"  # autograd's bookkeeping around a backward op (the op is its own event); copies
    if any(marker in lower for marker in ATTENTION_MARKERS):
        return "attention"  # checked first: fused attention kernels carry gemm and cutlass in their names
    if name in GEMM_OPS or any(marker in lower for marker in GEMM_MARKERS):
        return "gemm"
    if any(marker in lower for marker in SOFTMAX_LOSS_MARKERS):
        return "softmax_loss"
    if name.startswith("aten::"):
        return "other" if name[len("aten::"):] in METADATA_OPS else "elementwise"
    if any(marker in lower for marker in ELEMENTWISE_MARKERS):
        return "elementwise"
    return "other"


def profile_summary(events, wall_seconds: float, on_gpu: bool, top: int = 5) -> dict:
    """Seconds per kernel class over a profiled span, from key_averages(): on a GPU each kernel's device time, on
    CPU each op's self time (its children excluded, so nothing counts twice). idle_other = wall time - the four
    compute classes: the device idle (or the host's Python and framework overhead on CPU), copies and
    unclassified ops."""
    from torch.autograd import DeviceType

    seconds = dict.fromkeys(KERNEL_CLASSES[:-1], 0.0)
    other = 0.0
    names: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    calls: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for event in events:
        if getattr(event, "is_user_annotation", False):
            continue  # record_function ranges (the DataLoader's, the optimizer's): their ops are events of their own
        if on_gpu:
            if event.device_type != DeviceType.CUDA:
                continue
            event_seconds = event.self_device_time_total / 1e6
        else:
            if event.device_type != DeviceType.CPU:
                continue
            event_seconds = event.self_cpu_time_total / 1e6
        kind = kernel_class(event.key)
        if kind == "other":
            other += event_seconds
        else:
            seconds[kind] += event_seconds
        label = kind if kind != "other" else "idle_other"
        names[label][event.key[:160]] += event_seconds
        calls[label][event.key[:160]] += event.count
    compute = sum(seconds.values())
    seconds["idle_other"] = max(0.0, wall_seconds - compute)
    return {
        "wall_seconds": round(wall_seconds, 6),
        "timeline": "device (CUDA kernels)" if on_gpu else "host (CPU ops, self time)",
        "seconds_by_class": {kind: round(value, 6) for kind, value in seconds.items()},
        "share_by_class": {kind: round(value / wall_seconds, 4) if wall_seconds > 0 else None
                           for kind, value in seconds.items()},
        "other_ops_seconds": round(other, 6),  # copies and unclassified ops, inside idle_other
        "top_by_class": {kind: [{"name": name, "seconds": round(value, 6), "calls": calls[kind][name]}
                                for name, value in names[kind].most_common(top)]
                         for kind in KERNEL_CLASSES if names[kind]},
    }


# ---------------------------------------------------------------------------------------------------------------
# The GEMM ceiling and the peak
# ---------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------
# GPU clocks and power
# ---------------------------------------------------------------------------------------------------------------

SMI_FIELDS = {"clocks.sm": "sm_clock_mhz", "clocks.mem": "memory_clock_mhz", "power.draw": "power_w",
              "temperature.gpu": "temperature_c", "utilization.gpu": "utilization_percent"}
SMI_STATIC_FIELDS = {"clocks.max.sm": "max_sm_clock_mhz", "power.limit": "power_limit_w"}


def _smi_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def gpu_identifiers(device: torch.device) -> list[str]:
    """Names nvidia-smi and NVML may know the device by, best first: its UUID, then its index (through
    CUDA_VISIBLE_DEVICES when that lists indices: CUDA's numbering is then not the driver's)."""
    names = []
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        names.append(text if text.startswith("GPU-") else f"GPU-{text}")
    index = device.index or 0
    visible = [name.strip() for name in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if name.strip()]
    names.append(visible[index] if index < len(visible) else str(index))
    return names


def _nvml_handle(pynvml, names: list[str]):
    for name in names:
        try:
            if name.startswith("GPU-"):
                return pynvml.nvmlDeviceGetHandleByUUID(name)
            if name.isdigit():
                return pynvml.nvmlDeviceGetHandleByIndex(int(name))
        except pynvml.NVMLError:
            continue
    raise LookupError(f"NVML knows none of {names}")


def gpu_reader(device: torch.device):
    """(read, static values, source) for the device's clocks, power, temperature and utilisation, or
    (None, None, reason) where none can be read."""
    if device.type != "cuda":
        return None, None, "device is cpu: no GPU clocks or power to read"
    names = gpu_identifiers(device)
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = _nvml_handle(pynvml, names)

        def read_nvml() -> dict:
            return {
                "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "memory_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,  # NVML reports milliwatts
                "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                "utilization_percent": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            }

        static = {"max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
                  "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000}
        read_nvml()
        return read_nvml, static, "pynvml"
    except Exception:  # not installed, or NVML refuses: nvidia-smi reads the same counters
        pass

    def query(fields: dict, name: str) -> dict:
        line = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                               "-i", name], capture_output=True, text=True, timeout=30, check=True).stdout
        return {key: _smi_number(value.strip()) for key, value in zip(fields.values(), line.strip().split(","))}

    errors = []
    for name in names:
        try:
            static = query(SMI_STATIC_FIELDS, name)
            query(SMI_FIELDS, name)
        except (OSError, subprocess.SubprocessError) as error:
            errors.append(f"-i {name}: {error}")
            continue
        return (lambda: query(SMI_FIELDS, name)), static, "nvidia-smi"
    return None, None, f"neither pynvml nor nvidia-smi could read the GPU ({'; '.join(errors)})"


class GpuTelemetry:
    """Samples the GPU's clocks and power in a thread while a timed span runs (a read every `interval` seconds)."""

    def __init__(self, reader, interval: float):
        self.reader, self.interval = reader, interval
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> None:
        if self.reader is None:
            return
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.samples.append(self.reader())
            except Exception:  # a failed read loses one sample, never the run
                pass
            if self._stop.wait(self.interval):
                return

    def stop(self) -> dict | None:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._thread = None
        summary = {"samples": len(self.samples)}
        for name in SMI_FIELDS.values():
            values = [s[name] for s in self.samples if s.get(name) is not None]
            summary[name] = ({"mean": round(float(np.mean(values)), 1), "min": min(values), "max": max(values)}
                             if values else None)
        return summary


# ---------------------------------------------------------------------------------------------------------------
# The workload and its two loops
# ---------------------------------------------------------------------------------------------------------------


class BertTokenIds:
    """What MaskedBatchCollator reads of a tokenizer: bert-base-uncased's special ids and vocabulary size."""

    cls_token_id, sep_token_id, pad_token_id, mask_token_id = 101, 102, 0, 103
    all_special_ids = [0, 100, 101, 102, 103]

    def __len__(self) -> int:
        return 30522


def random_corpus(directory: Path, n_tokens: int, seed: int = 0) -> Path:
    """A tokenize_corpus folder of random ids: documents of 50 to 2,000 ids, so chunks and tails both occur."""
    rng = np.random.default_rng(seed)
    lengths, total = [], 0
    while total < n_tokens:
        lengths.append(int(rng.integers(50, 2000)))
        total += lengths[-1]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rng.integers(1000, 30522, size=int(offsets[-1]), dtype=np.uint16).tofile(directory / "ids.bin")
    np.save(directory / "doc_offsets.npy", offsets)
    np.save(directory / "doc_is_heldout.npy", np.zeros(len(lengths), dtype=bool))
    np.save(directory / "token_counts.npy", np.ones(30522, dtype=np.int64))
    description = {"dtype": "uint16", "vocab_size": 30522, "n_documents": len(lengths), "n_tokens": int(offsets[-1])}
    (directory / "corpus.json").write_text(json.dumps(description))
    return directory


@dataclass
class Workload:
    """The models, config and data both loops train on."""

    student: torch.nn.Module
    teacher: torch.nn.Module
    student_forward: torch.nn.Module
    teacher_forward: torch.nn.Module
    dcfg: DistillPretrainConfig
    device: torch.device
    precision: str  # --precision: bf16 or no
    bf16: bool
    sequences: object
    collate: CountingCollate
    teacher_shape: EncoderShape
    student_shape: EncoderShape
    workers: int
    layout: ChunkLayout  # the loss's chunking and vocabulary padding (LOSS_PATHS)

    def batch_plan(self, epoch: int):
        """distill_pretrain's plan (one process): token-budget batches of the run's seed."""
        return token_budget_batches(self.sequences.sequence_lengths(), self.dcfg.train.max_tokens_per_batch, SEED,
                                    epoch)

    def loss(self, batch: dict) -> dict:
        """distill_pretrain's compute_loss."""
        return distillation_terms(self.student, self.teacher, batch, self.dcfg, self.student_forward,
                                  self.teacher_forward, self.layout)

    def counts(self) -> SpanCounts:
        return SpanCounts(self.teacher_shape, self.student_shape)


def benchmark_loop(work: Workload, warmup: int, steps: int, telemetry: GpuTelemetry) -> dict:
    """The benchmark's own loop: `warmup` untimed steps, then `steps` timed ones with the time of each phase."""
    loader = micro_batch_loader(work.sequences, work.collate, work.batch_plan, seed=SEED, start_micro_batch=0,
                                total_micro_batches=warmup + steps, workers=work.workers,
                                pin_memory=work.device.type == "cuda")
    optimizer = build_optimizer(work.student, work.dcfg.train, work.device)
    reset_peak_memory(work.device)
    work.student.train()
    timer = PhaseTimer(work.device, PHASES)
    counts = work.counts()
    stream = iter(loader)
    for number in range(warmup + steps):
        timed = number >= warmup  # warm-up steps: the allocator, kernels, compilation, the loader's workers
        if number == warmup:
            timer.start()
            telemetry.start()
        cpu_batch = next(stream)
        batch = to_device(cpu_batch, work.device)
        timer.lap("data_wait", timed)
        with torch.autocast(work.device.type, dtype=torch.bfloat16, enabled=work.bf16):
            terms = work.loss(batch)
        timer.lap("forward", timed)
        terms["loss"].backward()
        timer.lap("backward", timed)
        if work.dcfg.train.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(work.student.parameters(), work.dcfg.train.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timer.lap("optimizer", timed)
        if timed:
            counts.add(cpu_batch)
    synchronize(work.device)
    seconds = time.perf_counter() - timer.started
    gpu = telemetry.stop()
    del stream, loader, optimizer
    return {
        "seconds": seconds,
        "counts": counts,
        "gpu": gpu,
        "step_breakdown_seconds": {name: round(value / steps, 6) for name, value in timer.seconds().items()},
        "host_breakdown_seconds": ({name: round(value / steps, 6) for name, value in timer.host.items()}
                                   if work.device.type == "cuda" else None),
        "peak_memory_mib": round(peak_memory_mib(work.device), 1),
        "last_loss_terms": {name: float(value.detach()) for name, value in terms.items()},
    }


@contextlib.contextmanager
def launch_precision(precision: str):
    """ACCELERATE_MIXED_PRECISION as the rule sets it from compute.mixed_precision (pipeline.training.run_settings.mixed_precision
    reads it on CUDA), for the stage loop only."""
    previous = os.environ.get("ACCELERATE_MIXED_PRECISION")
    os.environ["ACCELERATE_MIXED_PRECISION"] = precision
    try:
        yield
    finally:
        if previous is None:
            del os.environ["ACCELERATE_MIXED_PRECISION"]
        else:
            os.environ["ACCELERATE_MIXED_PRECISION"] = previous


class TimedStageLoss:
    """The stage's compute_loss, counting the micro-batches after the first `untimed` ones: the timed span starts
    as the first of them starts (the device synchronised there, once, before it)."""

    def __init__(self, work: Workload, untimed: int, telemetry: GpuTelemetry):
        self.work, self.untimed, self.telemetry = work, untimed, telemetry
        self.calls, self.started = 0, None
        self.counts = work.counts()

    def __call__(self, batch: dict) -> dict:
        if self.calls == self.untimed:
            synchronize(self.work.device)
            self.started = time.perf_counter()
            self.telemetry.start()
        if self.calls >= self.untimed:
            self.counts.add(batch)  # host numbers the collate added: no device read
        self.calls += 1
        return self.work.loss(batch)


def stage_train_loop(work: Workload, warmup: int, steps: int, grad_accum_steps: int, telemetry: GpuTelemetry,
                     scratch: Path) -> dict:
    """`pipeline.training.loop.train` as distill_pretrain.run calls it (its collate, batch plan, per-token loss weights
    and static graph), for warmup + steps optimizer steps. Timed from the first timed micro-batch's loss to
    train()'s return (the loop's log reads and its loader's shutdown included), the device synchronised."""
    cfg = replace(work.dcfg.train, max_steps=warmup + steps, grad_accum_steps=grad_accum_steps,
                  checkpoint_every=warmup + steps + 1, dataloader_workers=work.workers)
    loss = TimedStageLoss(work, warmup * grad_accum_steps, telemetry)
    with launch_precision(work.precision):
        result = train(
            module=work.student, compute_loss=loss, examples=work.sequences, collate=work.collate, cfg=cfg,
            seed=SEED, device=work.device, checkpoint_dir=scratch / "checkpoints",
            log_path=scratch / "train_log.jsonl", fingerprint="distill_throughput",
            description="distill_pretrain (timed)", batch_plan=work.batch_plan,
            example_tokens=work.sequences.sequence_lengths(), static_graph=True,
        )
    synchronize(work.device)
    seconds = time.perf_counter() - loss.started
    return {
        "seconds": seconds,
        "counts": loss.counts,
        "gpu": telemetry.stop(),
        "peak_memory_mib": round(result.peak_memory_mib, 1),
        "train_result": {key: value for key, value in result.as_metrics().items()
                         if key in ("steps", "train_seconds", "tokens_per_second", "mixed_precision",
                                    "final_loss_terms")},
    }


def repeat_record(run: dict, steps: int, position: int, repeat: int, peak: float | None) -> dict:
    """One repeat of a loop: its rates, model FLOPs and MFU."""
    counts, seconds = run["counts"], run["seconds"]
    achieved = counts.flops["total"] / seconds
    record = {
        "position": position,
        "repeat": repeat,
        "seconds": round(seconds, 4),
        "steps_timed": steps,
        "micro_batches": counts.micro_batches,
        "seconds_per_step": round(seconds / steps, 6),
        "tokens": counts.tokens,
        "executed_tokens": counts.executed_tokens,  # rows the encoders ran on, padding included
        "tokens_per_second": round(counts.tokens / seconds, 1),
        "model_flops": dict(counts.flops),
        "achieved_tflops": round(achieved / 1e12, 6),
        "mfu": round(achieved / (peak * 1e12), 6) if peak else None,
        "peak_memory_mib": run["peak_memory_mib"],
        "gpu_telemetry": run["gpu"],
    }
    for key in ("step_breakdown_seconds", "host_breakdown_seconds", "train_result"):
        if key in run:
            record[key] = run[key]
    return record


def spread(values: list[float]) -> dict | None:
    """Every value, mean, min, max and Student's t 95 % interval of the mean (null without values)."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return None
    interval = t_interval(values, 0.95) if len(values) > 1 else None
    return {"values": values, "mean": float(np.mean(values)), "min": min(values), "max": max(values),
            "ci95": [interval["low"], interval["high"]] if interval else None}


def training_step(work, optimizer, stream):
    """One optimizer step of the stage's loss on the next micro-batch of `stream`, as the training loop takes it
    (bf16 autocast where the workload runs it, gradient clipping, zeroed gradients)."""
    def step() -> None:
        batch = to_device(next(stream), work.device)
        with torch.autocast(work.device.type, dtype=torch.bfloat16, enabled=work.bf16):
            terms = work.loss(batch)
        terms["loss"].backward()
        if work.dcfg.train.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(work.student.parameters(), work.dcfg.train.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def profiled_steps(work: Workload, steps: int, seed: int = SEED):
    """`steps` steps of the benchmark's loop under torch.profiler, after one untimed step: the profiler and the
    steps' wall seconds."""
    from torch.profiler import ProfilerActivity, profile

    loader = micro_batch_loader(work.sequences, work.collate, work.batch_plan, seed=seed, start_micro_batch=0,
                                total_micro_batches=steps + 1, workers=work.workers,
                                pin_memory=work.device.type == "cuda")
    optimizer = build_optimizer(work.student, work.dcfg.train, work.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if work.device.type == "cuda" else [])
    stream = iter(loader)
    step = training_step(work, optimizer, stream)
    step()
    synchronize(work.device)
    with profile(activities=activities) as profiler:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(work.device)
        wall = time.perf_counter() - started
    del stream, loader, optimizer
    return profiler, wall


def profile_steps(work: Workload, steps: int) -> dict:
    """A torch.profiler trace of `steps` steps of the benchmark's loop (after one untimed step), summarised by
    kernel class."""
    profiler, wall = profiled_steps(work, steps)
    return {"steps": steps, **profile_summary(profiler.key_averages(), wall, on_gpu=work.device.type == "cuda")}


# ---------------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=PAPER_CONFIG,
                        help="the config whose distill_pretrain shape is measured (merged over configs/default.yaml)")
    parser.add_argument("--steps", type=int, default=50, help="timed optimizer steps per repeat (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first in every repeat of each loop")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of (benchmark loop, stage loop, GEMM)")
    parser.add_argument("--profile-steps", type=int, default=5, help="profiled steps of the benchmark loop")
    parser.add_argument("--grad-accum-steps", type=int, default=1,
                        help="micro-batches per optimizer step of the stage's loop (paper.yaml: 16)")
    parser.add_argument("--seq-len", type=int, default=None, help="default: the config's max_seq_length")
    parser.add_argument("--max-tokens", type=int, default=None, help="default: the config's max_tokens_per_batch")
    parser.add_argument("--chunked-loss-rows", type=int, default=None, help="default: the config's chunked_loss_rows")
    parser.add_argument("--loss-path", choices=sorted(LOSS_PATHS), default="fused",
                        help="; ".join(f"{name}: {description}" for name, (_, _, description) in LOSS_PATHS.items()))
    parser.add_argument("--packed-multiple", type=int, default=None,
                        help="default: the config's packed_tokens_multiple_of")
    add_model_shape_arguments(parser)
    parser.add_argument("--corpus-dir", type=Path, default=None, help="a tokenize_corpus folder (bert-base ids)")
    parser.add_argument("--workers", type=int, default=None,
                        help="DataLoader worker processes (default: the config's dataloader_workers)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--compile", action="store_true", help="torch.compile both encoders (CUDA only)")
    parser.add_argument("--precision", choices=["bf16", "no"], default="bf16",
                        help="CUDA: bf16 autocast and a bf16 teacher (as the stage), or fp32; CPU is always fp32")
    parser.add_argument("--gemm-min-seconds", type=float, default=0.2, help="time per GEMM shape and repeat")
    parser.add_argument("--telemetry-interval", type=float, default=0.5, help="seconds between GPU reads")
    parser.add_argument("--out", type=Path, default=Path("artifacts/benchmarks/distill_throughput.json"))
    args = parser.parse_args(argv)
    for name in ("steps", "warmup", "repeats", "profile_steps", "grad_accum_steps", "chunked_loss_rows"):
        if getattr(args, name) is not None and getattr(args, name) < (0 if name == "warmup" else 1):
            parser.error(f"--{name.replace('_', '-')} must be at least {0 if name == 'warmup' else 1}")
    return args


def add_model_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The teacher's shape (bert-base by default) and the student's depth (also cuda_equivalence.py's flags)."""
    parser.add_argument("--teacher-layers", type=int, default=12)
    parser.add_argument("--student-layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--heads", type=int, default=12)


def teacher_and_student(args: argparse.Namespace, max_seq_length: int) -> tuple[BertForMaskedLM, torch.nn.Module]:
    """A random-weight teacher of the flags' shape and the student initialised from every other of its layers,
    on the CPU, drawn from SEED."""
    torch.manual_seed(SEED)
    teacher_config = BertConfig(num_hidden_layers=args.teacher_layers, hidden_size=args.hidden,
                                intermediate_size=args.intermediate, num_attention_heads=args.heads,
                                max_position_embeddings=max(512, max_seq_length))
    teacher = BertForMaskedLM(teacher_config)
    layers = teacher_layers_for_student("every_other", args.teacher_layers, args.student_layers)
    student = init_student_from_teacher(teacher, student_config_from_teacher(teacher_config, args.student_layers),
                                        layers)
    return teacher, student


def measured_config(args: argparse.Namespace, device: torch.device) -> DistillPretrainConfig:
    """The config's distill_pretrain (merged over configs/default.yaml, as Snakemake merges --configfile), with the
    flags' scaled-down values where given."""
    overrides = yaml.safe_load(args.config.read_text()) or {}
    dcfg = load_config(DEFAULT_CONFIG, overrides if args.config.resolve() != DEFAULT_CONFIG else None).distill_pretrain
    train_cfg = replace(
        dcfg.train, device=device.type, torch_compile=args.compile, bf16=args.precision == "bf16",
        max_tokens_per_batch=args.max_tokens or dcfg.train.max_tokens_per_batch,
        dataloader_workers=dcfg.train.dataloader_workers if args.workers is None else args.workers,
    )
    return replace(
        dcfg, train=train_cfg,
        max_seq_length=args.seq_len or dcfg.max_seq_length,
        chunked_loss_rows=args.chunked_loss_rows or dcfg.chunked_loss_rows,
        packed_tokens_multiple_of=args.packed_multiple or dcfg.packed_tokens_multiple_of,
    )


# The loss as the stage runs it, and as it ran before its vocabulary was padded and its chunk fused and compiled
# (the same chunking and math, eager, on 30,522 columns): (vocab_multiple, compile_chunks, description).
LOSS_PATHS = {
    "fused": (64, None, "the stage's loss: vocabulary padded to a multiple of 64, the fused chunk compiled on CUDA"),
    "unpadded_eager": (1, False, "the same chunks on the unpadded vocabulary, the chunk function eager"),
}


def loss_layout(path: str, chunk_rows: int) -> ChunkLayout:
    vocab_multiple, compile_chunks, _ = LOSS_PATHS[path]
    return ChunkLayout(chunk_rows, vocab_multiple, compile_chunks)


def build_workload(args: argparse.Namespace, dcfg: DistillPretrainConfig, device: torch.device,
                   corpus_dir: Path) -> Workload:
    teacher, student = teacher_and_student(args, dcfg.max_seq_length)
    student = student.to(device)
    teacher = freeze(teacher).to(device)
    bf16 = device.type == "cuda" and args.precision == "bf16"
    if bf16:
        teacher = teacher.to(torch.bfloat16)  # as the stage: a frozen bf16 teacher where the loop trains in bf16
    student_encoder, teacher_encoder = encoders(student, teacher)
    corpus = TokenizedCorpus(corpus_dir)
    tokens = BertTokenIds()
    selection_weights = (selection_weights_from_counts(corpus.token_counts(), special_token_ids(tokens),
                                                       dcfg.smoothing_exponent)
                         if dcfg.token_frequency_smoothing else None)
    collator = MaskedBatchCollator(tokens, dcfg.mlm_mask_prop, selection_weights, dcfg.packed_tokens_multiple_of)
    return Workload(
        student=student, teacher=teacher, dcfg=dcfg, device=device, precision=args.precision, bf16=bf16,
        student_forward=maybe_compile(student_encoder, dcfg.train, device),
        teacher_forward=maybe_compile(teacher_encoder, dcfg.train, device),
        sequences=corpus.sequences("train", dcfg.max_seq_length),
        collate=CountingCollate(collator, dcfg.restrict_ce_to_mask),
        teacher_shape=EncoderShape.of(teacher.config), student_shape=EncoderShape.of(student.config),
        workers=dcfg.train.dataloader_workers, layout=loss_layout(args.loss_path, dcfg.chunked_loss_rows),
    )


def run_rounds(args: argparse.Namespace, work: Workload, gemm_dtype: torch.dtype, telemetry: GpuTelemetry,
               scratch: Path) -> tuple[list, list[dict], tuple[int, int]]:
    """The protocol: `--repeats` rounds of (benchmark loop, stage loop, GEMM microbenchmark), one after the other.
    Returns (loop, repeat, what it measured) in the order they ran, the GEMM shapes and the micro-batch rows they
    come from (the median micro-batch of the first timed span)."""
    rounds, shapes, gemm_rows = [], None, None
    for repeat in range(args.repeats):
        rounds.append(("benchmark_loop", repeat, benchmark_loop(work, args.warmup, args.steps, telemetry)))
        rounds.append(("stage_train", repeat, stage_train_loop(work, args.warmup, args.steps, args.grad_accum_steps,
                                                                telemetry, scratch / f"stage-{repeat}")))
        if shapes is None:
            rows = sorted(rounds[0][2]["counts"].batch_rows)
            gemm_rows = rows[len(rows) // 2]
            shapes = step_matmul_shapes(work.teacher_shape, work.student_shape, gemm_rows[0], gemm_rows[1],
                                        work.layout.chunk_rows, work.layout.vocab_multiple,
                                        padded_chunks=work.layout.resolved_compile(work.device))
        rounds.append(("gemm", repeat, gemm_round(shapes, gemm_dtype, work.device, args.gemm_min_seconds)))
    return rounds, shapes, gemm_rows


LOOP_DESCRIPTIONS = {
    "benchmark_loop": "this script's loop over distill_pretrain's loss, data path and optimizer (AdamW, clipping), "
                      "one micro-batch per optimizer step",
    "stage_train": "pipeline.training.loop.train with distill_pretrain's arguments (the stage's own loop)",
}


def loop_results(rounds: list, steps: int, peak: float | None, ceiling: float) -> dict:
    """Per loop: every repeat's record (with its fraction of the GEMM ceiling) and the spread of each rate."""
    loops = {}
    for name, description in LOOP_DESCRIPTIONS.items():
        repeats = []
        for position, (loop, repeat, run) in enumerate(rounds):
            if loop == name:
                record = repeat_record(run, steps, position, repeat, peak)
                record["fraction_of_gemm_ceiling"] = round(record["achieved_tflops"] / ceiling, 4)
                repeats.append(record)
        loops[name] = {
            "description": description,
            "repeats": repeats,
            "summary": {key: spread([r[key] for r in repeats])
                        for key in ("tokens_per_second", "seconds_per_step", "achieved_tflops", "mfu",
                                    "fraction_of_gemm_ceiling")},
        }
    return loops


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    dcfg = measured_config(args, device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    bf16 = device.type == "cuda" and args.precision == "bf16"
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    precision = "bf16" if bf16 else ("tf32" if tf32 else "fp32")
    peak = peak_tflops(device_name, precision)
    reader, gpu_static, gpu_source = gpu_reader(device)
    telemetry = GpuTelemetry(reader, args.telemetry_interval)
    load_at_start = host_load()

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        micro_batches = (args.warmup + args.steps) * args.grad_accum_steps
        corpus_dir = args.corpus_dir or random_corpus(
            scratch, n_tokens=(micro_batches + args.profile_steps + 1) * dcfg.train.max_tokens_per_batch * 4)
        work = build_workload(args, dcfg, device, corpus_dir)
        gemm_dtype = torch.bfloat16 if bf16 else torch.float32
        rounds, shapes, gemm_rows = run_rounds(args, work, gemm_dtype, telemetry, scratch)
        profile = profile_steps(work, args.profile_steps) if args.profile_steps else None

    gemm_repeats = [dict(record, position=position, repeat=repeat)
                    for position, (loop, repeat, record) in enumerate(rounds) if loop == "gemm"]
    loops = loop_results(rounds, args.steps, peak["tflops"],
                         ceiling=float(np.mean([r["achieved_tflops"] for r in gemm_repeats])))
    headline = loops["benchmark_loop"]["repeats"]

    def mean_of(key: str) -> dict | None:
        if headline[0].get(key) is None:
            return None
        return {name: round(float(np.mean([r[key][name] for r in headline])), 6) for name in headline[0][key]}

    result = {
        "benchmark": f"distill_pretrain throughput and MFU through the corpus data path, {models_description(args)} "
                     "(random weights)",
        "command": shlex.join([Path(sys.executable).name, *sys.argv] if argv is None else ["distill_throughput.py",
                                                                                             *argv]),
        "device": device_name or "cpu",
        "gpu": gpu_description(device),
        "cpu": cpu_description(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        # Runnable processes averaged over a minute, at the start and the end: above the core count, other work
        # shared the CPU with this run.
        "host_load_average_1min": {"start": load_at_start, "end": host_load()},
        "threads": torch.get_num_threads(),
        "loader_workers": work.workers,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "bf16": bf16,
        "precision": precision,
        "tf32_matmul": tf32,
        "torch_compile": args.compile and device.type == "cuda",
        "config": str(args.config.resolve().relative_to(PROJECT_ROOT)) if args.config.resolve().is_relative_to(
            PROJECT_ROOT) else str(args.config),
        "packed_tokens_multiple_of": dcfg.packed_tokens_multiple_of,
        "chunked_loss_rows": dcfg.chunked_loss_rows,
        "loss_path": {"name": args.loss_path, "description": LOSS_PATHS[args.loss_path][2],
                      "vocab_multiple": work.layout.vocab_multiple,
                      "chunk_compiled": work.layout.resolved_compile(device)},
        "restrict_ce_to_mask": dcfg.restrict_ce_to_mask,
        "seq_len": dcfg.max_seq_length,
        "max_tokens_per_batch": dcfg.train.max_tokens_per_batch,
        "grad_accum_steps_stage_loop": args.grad_accum_steps,
        "corpus": str(args.corpus_dir) if args.corpus_dir else "random ids",
        "model_shapes": {"teacher": vars(work.teacher_shape), "student": vars(work.student_shape)},
        "steps_warmup": args.warmup,
        "steps_timed": args.steps,
        "repeats": args.repeats,
        "protocol": {
            "order": "each round: benchmark_loop, stage_train, gemm; rounds repeated",
            "minimum_for_reported_figures": MINIMUM_PROTOCOL,
            "meets_minimum": args.repeats >= MINIMUM_PROTOCOL["repeats"] and args.steps >= MINIMUM_PROTOCOL["steps"],
        },
        "order": [{"position": position, "loop": loop, "repeat": repeat}
                  for position, (loop, repeat, _) in enumerate(rounds)],
        "seconds_per_step": round(float(np.mean([r["seconds_per_step"] for r in headline])), 4),
        "tokens_per_second": round(float(np.mean([r["tokens_per_second"] for r in headline])), 1),
        "step_breakdown_seconds": mean_of("step_breakdown_seconds"),
        "host_breakdown_seconds": mean_of("host_breakdown_seconds"),
        "mfu": {
            "benchmark_loop": loops["benchmark_loop"]["summary"]["mfu"]["mean"] if peak["tflops"] else None,
            "stage_train": loops["stage_train"]["summary"]["mfu"]["mean"] if peak["tflops"] else None,
            "reason": None if peak["tflops"] else peak["reason"],
        },
        "flop_formula": FLOP_FORMULA,
        "peak": peak,
        "gemm": {
            "what": "the step's own matmul shapes and operand layouts, each timed alone with torch.mm; "
                    "achieved_tflops = the step's matmul FLOPs / the time those shapes take alone (the realistic "
                    "ceiling)",
            "dtype": str(gemm_dtype).removeprefix("torch."),
            "from_micro_batch": {"encoder_rows": gemm_rows[0], "head_rows": gemm_rows[1],
                                 "chosen": "the median micro-batch of the first timed span"},
            "shapes": shapes,
            "repeats": gemm_repeats,
            "achieved_tflops": spread([r["achieved_tflops"] for r in gemm_repeats]),
            "peak_tflops": peak["tflops"],
        },
        "loops": loops,
        "gpu_clocks": ({"source": gpu_source, **gpu_static, "per_repeat": "loops.*.repeats[].gpu_telemetry"}
                       if reader else {"available": False, "reason": gpu_source}),
        "profile": profile,
        "peak_memory_mib": max(r["peak_memory_mib"] for loop in loops.values() for r in loop["repeats"]),
        "teacher_parameters": work.teacher.num_parameters(),
        "student_parameters": work.student.num_parameters(),
        "last_loss_terms": [run for loop, _, run in rounds if loop == "benchmark_loop"][-1]["last_loss_terms"],
        "reference": REFERENCE,
    }
    atomic_write_json(args.out, result)
    print(json.dumps({key: result[key] for key in ("device", "tokens_per_second", "seconds_per_step", "mfu")}
                     | {"summary": {name: loop["summary"] for name, loop in loops.items()}}, indent=2))
    return result


def models_description(args: argparse.Namespace) -> str:
    if (args.teacher_layers, args.student_layers, args.hidden, args.intermediate) == (12, 6, 768, 3072):
        return "bert-base teacher -> 6-layer DistilBERT student"
    return (f"{args.teacher_layers}-layer teacher -> {args.student_layers}-layer DistilBERT student, width "
            f"{args.hidden}, feed-forward {args.intermediate}")


def gpu_description(device: torch.device) -> dict | None:
    """The GPU, its driver and the CUDA runtime PyTorch was built with (None on CPU)."""
    if device.type != "cuda":
        return None
    properties = torch.cuda.get_device_properties(device)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i",
                                 gpu_identifiers(device)[0]], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = None
    return {
        "name": properties.name,
        "memory_gb": round(properties.total_memory / 1e9, 1),
        "compute_capability": f"{properties.major}.{properties.minor}",
        "multiprocessors": properties.multi_processor_count,
        "driver": driver or None,
        "cuda_runtime": torch.version.cuda,
    }


def host_load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not every platform reports one
        return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


class PhaseTimer:
    """Time per phase of the timed steps, with no synchronisation inside them: on CUDA the device's time between
    events recorded at the phase boundaries, and the host's time to issue each phase; on CPU the wall time."""

    def __init__(self, device: torch.device, names: tuple[str, ...]):
        self.cuda = device.type == "cuda"
        self.device = device
        self.host = dict.fromkeys(names, 0.0)
        self.intervals: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self.started = self.clock = 0.0
        self.event = None

    def _record(self):
        if not self.cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        synchronize(self.device)
        self.started = self.clock = time.perf_counter()
        self.event = self._record()

    def lap(self, name: str, timed: bool) -> None:
        if not timed:
            return
        now = time.perf_counter()
        self.host[name] += now - self.clock
        self.clock = now
        if self.cuda:
            event = self._record()
            self.intervals.append((name, self.event, event))
            self.event = event

    def seconds(self) -> dict[str, float]:
        """Per phase, summed over the timed steps (call after synchronising)."""
        if not self.cuda:
            return dict(self.host)
        device_seconds = dict.fromkeys(self.host, 0.0)
        for name, begin, end in self.intervals:
            device_seconds[name] += begin.elapsed_time(end) / 1000
        return device_seconds


if __name__ == "__main__":
    main()
