"""Kernel classes of a profile: each op or kernel name's class, and a profile's seconds per class."""

from __future__ import annotations

import collections

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
