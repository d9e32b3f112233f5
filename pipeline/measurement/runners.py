"""An artifact run once, and its latency table: a batch-1 input of a given length on what the benchmark times
(a PyTorch model, the torch peer, an onnxruntime session, an OpenVINO model), every length and thread count timed
with the pipeline's one timer (latency.py), threads pinned. The workers (workers.py) call these in a fresh process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.measurement.latency import DEFAULT_OPTIONS, onnx_session, synthetic_feed, time_calls
from pipeline.measurement.torch_peer import TORCH_DYNAMIC_INT8, torch_dynamic_int8
from pipeline.plan.config import BenchmarkConfig


def torch_inputs(vocab_size: int, sequence_length: int) -> dict:
    """A batch-1 PyTorch input of `sequence_length` tokens, every one attended (as synthetic_feed for onnxruntime)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(5, vocab_size, (1, sequence_length), generator=generator),
            "attention_mask": torch.ones(1, sequence_length, dtype=torch.long)}


def load_pytorch(item: dict):
    """The artifact's PyTorch model: the fp32 folder, dynamically quantized on item["engine"] for the torch peer."""
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(Path(item["path"]).parent).eval()
    if item.get("precision") == TORCH_DYNAMIC_INT8:
        # in place: a copy would keep the fp32 weights beside the int8 ones in the peak memory recorded
        model = torch_dynamic_int8(model, item["engine"], inplace=True)
    return model


def session_option_set(item: dict) -> str:
    """The onnxruntime session option set an ONNX artifact is timed with (latency.SESSION_OPTIONS)."""
    return item.get("session_options") or DEFAULT_OPTIONS


def runner(item: dict, sequence_length: int, threads: int, model=None):
    """A no-argument callable that runs the artifact once on a batch-1 input of `sequence_length` tokens; `model`:
    the loaded PyTorch model of a "pytorch" artifact. An OpenVINO item's "runtime_precision" is set to what its
    precision hint resolved to in the session compiled for it."""
    if item["format"] == "pytorch":
        import torch

        inputs = torch_inputs(item["vocab_size"], sequence_length)

        def run_once():
            with torch.inference_mode():
                model(**inputs)
        return run_once
    if item["format"] == "openvino":
        from pipeline.runtime.openvino_session import OpenVinoSession

        session = OpenVinoSession(item["path"], threads, item["openvino_precision"])
        item["runtime_precision"] = session.precision  # what its precision hint resolved to on this CPU
    else:
        session = onnx_session(item["path"], threads, session_option_set(item))
    feed = synthetic_feed(session, sequence_length, item["vocab_size"])
    return lambda: session.run(None, feed)


def time_onnx(path: str, sequence_length: int, threads: int, vocab_size: int, cfg: BenchmarkConfig,
              option_set: str = DEFAULT_OPTIONS) -> dict:
    session = onnx_session(path, threads, option_set)
    feed = synthetic_feed(session, sequence_length, vocab_size)
    return time_calls(lambda: session.run(None, feed), cfg.runs, cfg.warmup)


def time_pytorch(model, sequence_length: int, threads: int, vocab_size: int, cfg: BenchmarkConfig) -> dict:
    import torch

    torch.set_num_threads(threads)
    inputs = torch_inputs(vocab_size, sequence_length)
    with torch.inference_mode():
        return time_calls(lambda: model(**inputs), cfg.runs, cfg.warmup)


def latency_table(item: dict, cfg: BenchmarkConfig) -> dict:
    """Latency per length and thread count: {seqL: {"threadsN": {p50, p90}}}, null for a length beyond the model's
    positions; runs inside the worker process whose peak memory is recorded. An OpenVINO item's
    "runtime_precision" is set to what its precision hint resolved to (see runner)."""
    model = load_pytorch(item) if item["format"] == "pytorch" else None
    latency: dict = {}
    option_set = session_option_set(item)
    for length in cfg.sequence_lengths:
        key = f"seq{length}"
        if length > item["max_positions"]:
            latency[key] = None  # the model has fewer positions than this length
            continue
        latency[key] = {}
        for threads in cfg.threads:
            if model is not None:
                latency[key][f"threads{threads}"] = time_pytorch(model, length, threads, item["vocab_size"], cfg)
            elif item["format"] == "openvino":
                latency[key][f"threads{threads}"] = time_calls(runner(item, length, threads), cfg.runs, cfg.warmup)
            else:
                latency[key][f"threads{threads}"] = time_onnx(item["path"], length, threads, item["vocab_size"], cfg,
                                                              option_set)
    return latency


def time_gemm_floor(path: Path, cfg: BenchmarkConfig) -> dict:
    """The GEMM floor graph (export_gemm_floor) at 1 thread on random uint8 activations of its own shapes."""
    session = onnx_session(path, 1)
    rng = np.random.default_rng(0)
    feed = {i.name: rng.integers(0, 256, size=i.shape, dtype=np.uint8) for i in session.get_inputs()}
    return time_calls(lambda: session.run(None, feed), cfg.runs, cfg.warmup)
