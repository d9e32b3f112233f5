"""Latency: batch 1, a fixed sequence length, pinned threads, percentiles over timed runs taken in turn.

Timings belong in benchmark JSON, never in test assertions. Call this only where nothing else runs beside it
(the rules that time take every core Snakemake was given).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime

from pipeline.startup import libraries_loaded

DEFAULT_OPTIONS = "default"  # onnxruntime's own session options
# Session option sets the int8 search tries beside onnxruntime's defaults (benchmark.session_options).
# denormals-as-zero: fp32 ops that meet denormal values (tiny activations between int8 GEMMs) can slow down by
# orders of magnitude on x86; extended-graph-level: the fusions up to "extended" only, no layout transforms.
SESSION_OPTIONS = {
    DEFAULT_OPTIONS: {},
    "denormals-as-zero": {"config": {"session.set_denormal_as_zero": "1"}},
    "extended-graph-level": {"graph_optimization_level": "ORT_ENABLE_EXTENDED"},
}


def onnx_session(path: str | Path, threads: int, option_set: str = DEFAULT_OPTIONS) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    chosen = SESSION_OPTIONS[option_set]
    for key, value in chosen.get("config", {}).items():
        options.add_session_config_entry(key, value)
    if "graph_optimization_level" in chosen:
        options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, chosen["graph_optimization_level"])
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def synthetic_feed(session: onnxruntime.InferenceSession, sequence_length: int, vocab_size: int, seed: int = 0) -> dict:
    """A batch-1 input of real length `sequence_length` (every token attended: the worst case a window reaches)."""
    rng = np.random.default_rng(seed)
    feed = {}
    for model_input in session.get_inputs():
        dtype = np.int32 if model_input.type == "tensor(int32)" else np.int64
        if model_input.name == "input_ids":
            feed[model_input.name] = rng.integers(5, vocab_size, size=(1, sequence_length)).astype(dtype)
        elif model_input.name == "attention_mask":
            feed[model_input.name] = np.ones((1, sequence_length), dtype=dtype)
        else:
            feed[model_input.name] = np.zeros((1, sequence_length), dtype=dtype)
    return feed


def percentiles(times_ms: list[float]) -> dict[str, float]:
    return {"p50": round(float(np.percentile(times_ms, 50)), 3), "p90": round(float(np.percentile(times_ms, 90)), 3)}


def time_in_turn(runs_once: dict[str, Callable[[], object]], runs: int, warmup: int) -> dict[str, dict[str, float]]:
    """p50/p90 in ms of each named no-argument callable, called round-robin (`runs` each after `warmup` untimed
    rounds), so drift in machine speed hits every one alike. The one timer of the pipeline: every latency it
    reports comes from here."""
    libraries_loaded()  # in a timing worker, what it runs is loaded by now: collection resumes (pipeline/startup.py)
    for _ in range(warmup):
        for run_once in runs_once.values():
            run_once()
    times: dict[str, list[float]] = {name: [] for name in runs_once}
    for _ in range(runs):
        for name, run_once in runs_once.items():
            start = time.perf_counter()
            run_once()
            times[name].append((time.perf_counter() - start) * 1000)
    return {name: percentiles(t) for name, t in times.items()}


# Between two runtimes timed in turn with more than one thread, each runtime's pool spins after its run (onnxruntime's
# threads, OpenMP's, TBB's) and takes the cores the next one needs; so the runtimes alternate by blocks, each after a
# pause long enough for the other's threads to park and one untimed run (docs/findings.md has the figures).
BLOCK_RUNS, SETTLE_S = 5, 0.1


def time_in_blocks(runs_once: dict[str, Callable[[], object]], runs: int, warmup: int, block: int = BLOCK_RUNS,
                   settle_s: float = SETTLE_S) -> dict[str, dict[str, float]]:
    """p50/p90 in ms of each named callable, timed round-robin by blocks: each block waits settle_s, runs once
    untimed, then times up to `block` runs; `runs` timed runs each, after `warmup` untimed rounds. For runtimes
    with thread pools of their own side by side in one process (time_in_turn suits one thread)."""
    libraries_loaded()  # as in time_in_turn
    for _ in range(warmup):
        for run_once in runs_once.values():
            run_once()
    times: dict[str, list[float]] = {name: [] for name in runs_once}
    while len(times[next(iter(times))]) < runs:
        for name, run_once in runs_once.items():
            time.sleep(settle_s)
            run_once()
            for _ in range(min(block, runs - len(times[name]))):
                start = time.perf_counter()
                run_once()
                times[name].append((time.perf_counter() - start) * 1000)
    return {name: percentiles(t) for name, t in times.items()}


def time_calls(run_once: Callable[[], object], runs: int, warmup: int) -> dict[str, float]:
    """p50/p90 in ms of one callable over `runs` calls after `warmup` untimed ones."""
    return time_in_turn({"run": run_once}, runs, warmup)["run"]


def ranked_profile(ms_by_op: dict[str, float], runs: int, rows: int = 10) -> list[dict]:
    """A profile's `rows` largest operators, from each one's total ms over `runs` runs: ms per run and share of the
    total (the onnxruntime profiles and OpenVINO's performance counters of the benchmark both read so)."""
    total = sum(ms_by_op.values()) or 1.0
    ranked = sorted(ms_by_op.items(), key=lambda item: -item[1])
    return [{"op": op, "ms_per_run": round(ms / runs, 3), "share": round(ms / total, 4)} for op, ms in ranked[:rows]]


def fastest_first(timings: dict[str, dict[str, float]]) -> list[str]:
    """Names by median latency, fastest first; equal medians keep their order. Every latency-based choice (the
    bundle's int8 variant, the full-size int8 search, the torch peer's engine) ranks with this."""
    return sorted(timings, key=lambda name: timings[name]["p50"])


def compare_latency(
    paths: dict[str, str | Path], sequence_length: int, vocab_size: int, threads: int = 1, runs: int = 20,
    warmup: int = 3, option_sets: dict[str, str] | None = None,
) -> dict[str, dict[str, float]]:
    """p50/p90 in ms per ONNX graph, timed in turn (time_in_turn) on synthetic batch-1 feeds; option_sets maps a name
    to its SESSION_OPTIONS set (default: "default")."""
    option_sets = option_sets or {}
    runs_once = {}
    for name, path in paths.items():
        session = onnx_session(path, threads, option_sets.get(name, DEFAULT_OPTIONS))
        feed = synthetic_feed(session, sequence_length, vocab_size)
        runs_once[name] = functools.partial(session.run, None, feed)
    return {name: {**timing, "runs": runs} for name, timing in time_in_turn(runs_once, runs, warmup).items()}
