"""Stage benchmark: size, dev accuracy, latency and peak memory of every artifact, measured on this machine.

It times what the export rules built and builds nothing. Artifacts: every model the pipeline exported (PyTorch
fp32 as the baseline, ONNX fp32 / fused / int8 / 4-bit, the bundle's .ort, CoreML packages), the full-size
architectures (export_full_size), their searched int8 graphs (int8_search, export_full_size_int8), the peers
(export_peers) and the GEMM floor graph (export_gemm_floor).
- size: bytes on disk (MB = 10^6 bytes; an .mlpackage counts every file in it).
- dev exact match / F1: as the export stages measured them (ONNX through onnxruntime with the torch-free
  answerer, PyTorch from training, CoreML from its PyTorch-side proxy); null for the random-weight full-size
  architectures.
- latency: batch 1, every configured length and thread count, p50 and p90 over `runs` timed runs after
  `warmup` (pipeline.measurement.latency, the pipeline's one timer); onnxruntime sessions and torch pinned to the thread
  count, one process per artifact whose peak resident memory is recorded. CoreML cannot run on Linux: its latency
  is null, with the reason.
- int8 search (rule int8_search, copied into benchmark.json): the fastest gate-passing int8 recipe and session
  options of the full-size DistilBERT are "distilbert/onnx-int8-optimized"; export_full_size_int8 built
  bert-base's graph with the same recipe, so "bert-base/onnx-int8-optimized" is the same path applied to BERT-base.
- peers: the int8 paths a user would otherwise pick (export_peers), timed like every artifact and, at 1 thread,
  in turn with our graph in one process; the torch peer on every quantized engine first, the fastest kept.
- GEMM floor: the full-size DistilBERT int8 graph's MatMulInteger nodes alone (export_gemm_floor), timed like the
  model at the longest length with 1 thread: model latency / floor says how close the model runs to this
  machine's int8 matrix-multiply speed.
- profile: onnxruntime's profiler over the full-size int8 graphs, time per operator type.
The rule takes every core Snakemake has, so nothing runs beside the timed runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pipeline.errors import PipelineError
from pipeline.measurement.latency import (BLOCK_RUNS, SETTLE_S, fastest_first, onnx_session, ranked_profile,
                                          synthetic_feed, time_calls, time_in_blocks, time_in_turn)
from pipeline.outputs.artifacts import atomic_write_json, directory_size_bytes, megabytes, read_json
from pipeline.outputs.machine import cpu_description, high_water_mark_mib
from pipeline.outputs.manifests import atomic_output_dir
from pipeline.plan.config import BenchmarkConfig, PipelineConfig
from pipeline.plan.model_registry import bundled_model, exported_models

# The export libraries are imported where they are used: every timed artifact runs in a fresh process that imports
# this module, and its start-up must not grow with them.

logger = logging.getLogger(__name__)

COREML_UNTIMED = "CoreML prediction runs only on macOS; this benchmark ran on Linux"
TORCH_DYNAMIC_INT8 = "int8-dynamic"  # precision of the PyTorch dynamic-quantization peer
NAIVE_INT8 = "int8"  # the naive int8 graph's folder (pipeline.export.int8.NAIVE; that module is not imported here)


class BenchmarkInputError(PipelineError, ValueError):
    """A built artifact that does not match what the benchmark was asked to time."""


# ------------------------------------------------------------------------------------------------ inventory


def artifact_entry(name, model, fmt, precision, path, dev=None, f1_source=None, timed=True, untimed_reason=None,
                   max_positions=None, vocab_size=None) -> dict:
    """A new benchmark entry for the artifact at `path`: its size and dev scores, latency not yet measured."""
    dev = dev or {}
    return {
        "name": name, "model": model, "format": fmt, "precision": precision, "path": str(path),
        "size_mb": megabytes(directory_size_bytes(path)),
        "exact_match": dev.get("exact_match"), "f1": dev.get("f1"), "f1_source": f1_source if dev else None,
        "timed": timed, "untimed_reason": untimed_reason, "max_positions": max_positions, "vocab_size": vocab_size,
    }


def model_shape(config_path: Path) -> tuple[int, int]:
    config = read_json(config_path)
    return config["max_position_embeddings"], config["vocab_size"]


def trained_artifacts(root: Path, cfg: PipelineConfig) -> list[dict]:
    """Every export of the trained models (or of the deployed one), and the bundle's .ort."""
    items = []
    for model, stage in exported_models(cfg).items():
        max_positions, vocab_size = model_shape(root / stage / "config.json")
        shape = {"max_positions": max_positions, "vocab_size": vocab_size}
        metrics = read_json(root / stage / "metrics.json")
        items.append(artifact_entry(f"{model}/pytorch-fp32", model, "pytorch", "fp32",
                                    root / stage / "model.safetensors", metrics, "pytorch", **shape))
        export = read_json(root / "onnx" / model / "export.json")
        items.append(artifact_entry(f"{model}/onnx-fp32", model, "onnx", "fp32",
                                    root / "onnx" / model / "fp32" / "model.onnx", export["fp32"], "onnxruntime",
                                    **shape))
        items.append(artifact_entry(f"{model}/onnx-fp32-optimized", model, "onnx", "fp32-optimized",
                                    root / "onnx" / model / "optimized" / "model.onnx", export["optimized"],
                                    "onnxruntime", **shape))
        quantized = read_json(root / "quantized" / model / "quantize.json")
        for variant, report in quantized["variants"].items():
            if report.get("runtime") == "openvino":  # the x86 target, answered and timed by its own runtime
                item = artifact_entry(f"{model}/{variant}", model, "openvino", "int8-nncf",
                                      root / "quantized" / model / report["path"], report, "openvino", **shape)
                item.update(size_mb=report["size_mb"], openvino_precision="default",
                            runtime_precision=report["runtime_precision"])
                items.append(item)
                continue
            items.append(artifact_entry(f"{model}/onnx-{variant}", model, "onnx", variant,
                                        root / "quantized" / model / report["path"], report, "onnxruntime", **shape))
        coreml = read_json(root / "coreml" / model / "coreml.json")
        for variant, package in coreml["packages"].items():
            items.append(artifact_entry(f"{model}/coreml-{variant}", model, "coreml", variant,
                                        root / "coreml" / model / package["path"], package.get("dev"), "pytorch-proxy",
                                        timed=False, untimed_reason=COREML_UNTIMED, **shape))
    bundle = read_json(root / "bundle" / "metrics.json")
    bundled = bundled_model(cfg)
    max_positions, vocab_size = model_shape(root / exported_models(cfg)[bundled] / "config.json")
    precision = "int8" if bundle["onnx_model"] == "model.int8.onnx" else "fp32"  # fp32: no int8 passed its gates
    items.append(artifact_entry(f"{bundled}/ort-{precision}", bundled, "ort", bundle["onnx_variant"],
                                root / "bundle" / bundle["ort_model"], bundle, "onnxruntime", max_positions=max_positions,
                                vocab_size=vocab_size))
    return items


NOT_TIMED_FULL_SIZE = "not in benchmark.timed_full_size (each full-size timing takes tens of seconds)"


def full_size_artifacts(root: Path, architectures: list[str], timed: list[str]) -> list[dict]:
    items = []
    for architecture in architectures:
        folder = root / "full_size" / architecture
        report = read_json(folder / "full_size.json")
        max_positions, vocab_size = model_shape(folder / "pytorch" / "config.json")
        shape = {"max_positions": max_positions, "vocab_size": vocab_size}
        name = f"{architecture}/pytorch-fp32"
        items.append(artifact_entry(name, architecture, "pytorch", "fp32", folder / "pytorch" / "model.safetensors",
                                    timed=name in timed, untimed_reason=None if name in timed else NOT_TIMED_FULL_SIZE,
                                    **shape))
        for variant in report["onnx_size_mb"]:
            if variant.startswith("int8-"):
                continue  # the search variants: int8_search below times them, and adds the winner
            precision = "fp32-optimized" if variant == "optimized" else variant
            name = f"{architecture}/onnx-{'fp32-optimized' if variant == 'optimized' else variant}"
            items.append(artifact_entry(name, architecture, "onnx", precision, folder / "onnx" / variant / "model.onnx",
                                        timed=name in timed,
                                        untimed_reason=None if name in timed else NOT_TIMED_FULL_SIZE, **shape))
        for variant, package in report["coreml"].items():
            items.append(artifact_entry(f"{architecture}/coreml-{variant}", architecture, "coreml", variant,
                                        folder / package["path"], timed=False, untimed_reason=COREML_UNTIMED, **shape))
    return items


# ------------------------------------------------------------------------------------------------- timing


def time_onnx(path: str, sequence_length: int, threads: int, vocab_size: int, cfg: BenchmarkConfig,
              option_set: str = "default") -> dict:
    session = onnx_session(path, threads, option_set)
    feed = synthetic_feed(session, sequence_length, vocab_size)
    return time_calls(lambda: session.run(None, feed), cfg.runs, cfg.warmup)


def torch_inputs(vocab_size: int, sequence_length: int) -> dict:
    """A batch-1 PyTorch input of `sequence_length` tokens, every one attended (as synthetic_feed for onnxruntime)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(5, vocab_size, (1, sequence_length), generator=generator),
            "attention_mask": torch.ones(1, sequence_length, dtype=torch.long)}


def time_pytorch(model, sequence_length: int, threads: int, vocab_size: int, cfg: BenchmarkConfig) -> dict:
    import torch

    torch.set_num_threads(threads)
    inputs = torch_inputs(vocab_size, sequence_length)
    with torch.inference_mode():
        return time_calls(lambda: model(**inputs), cfg.runs, cfg.warmup)


def load_pytorch(item: dict):
    """The artifact's PyTorch model: the fp32 folder, dynamically quantized on item["engine"] for the torch peer."""
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(Path(item["path"]).parent).eval()
    if item.get("precision") == TORCH_DYNAMIC_INT8:
        from pipeline.export import peers

        # in place: a copy would keep the fp32 weights beside the int8 ones in the peak memory recorded
        model = peers.torch_dynamic_int8(model, item["engine"], inplace=True)
    return model


def search_torch_engine(item: dict, cfg: BenchmarkConfig) -> dict:
    """The torch peer on every quantized engine this torch build has, timed round-robin at the longest length with
    1 thread (cfg.search_runs each after cfg.warmup), so drift in machine speed hits every engine alike."""
    import torch

    from pipeline.export import peers

    torch.set_num_threads(1)
    fp32 = load_pytorch({**item, "precision": "fp32"})
    length = min(max(cfg.sequence_lengths), item["max_positions"])

    def on_engine(engine: str):
        run_once = runner(item, length, 1, peers.torch_dynamic_int8(fp32, engine))

        def run_on_engine():
            torch.backends.quantized.engine = engine  # the engine its weights were packed for
            run_once()
        return run_on_engine

    engines = time_in_turn({engine: on_engine(engine) for engine in peers.torch_engines()}, cfg.search_runs,
                           cfg.warmup)
    return {"sequence_length": length, "threads": 1, "runs": cfg.search_runs, "engines": engines,
            "choice": fastest_first(engines)[0]}


def runner(item: dict, sequence_length: int, threads: int, model=None):
    """A no-argument callable that runs the artifact once on a batch-1 input of `sequence_length` tokens; `model`:
    the loaded PyTorch model of a "pytorch" artifact."""
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
    else:
        session = onnx_session(item["path"], threads, item.get("session_options") or "default")
    feed = synthetic_feed(session, sequence_length, item["vocab_size"])
    return lambda: session.run(None, feed)


def interleaved_with_ours(peer: dict, ours: dict, cfg: BenchmarkConfig) -> dict:
    """The peer and our graph timed in one process, in turn by blocks (pipeline.measurement.latency.time_in_blocks: cfg.runs
    each after cfg.warmup) at every length and thread count, so a drift in machine speed cannot make one look
    faster, nor one runtime's spinning threads slow the other: {seqL: {"threadsN": {"peer": {p50, p90}, "ours":
    {p50, p90}}}}."""
    peer_model = load_pytorch(peer) if peer["format"] == "pytorch" else None
    comparison: dict = {}
    for length in cfg.sequence_lengths:
        if length > min(peer["max_positions"], ours["max_positions"]):
            continue
        comparison[f"seq{length}"] = {}
        for threads in cfg.threads:
            if peer_model is not None:
                import torch

                torch.set_num_threads(threads)  # the ONNX and OpenVINO runners pin their own
            runs_once = {"peer": runner(peer, length, threads, peer_model), "ours": runner(ours, length, threads)}
            comparison[f"seq{length}"][f"threads{threads}"] = time_in_blocks(runs_once, cfg.runs, cfg.warmup)
    return comparison


def measure_in_this_process(item: dict, cfg: BenchmarkConfig) -> dict:
    """Latency per length and thread count; runs inside the worker process whose peak memory is recorded."""
    model = load_pytorch(item) if item["format"] == "pytorch" else None
    latency: dict = {}
    option_set = item.get("session_options") or "default"
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


def in_worker(item: dict, cfg: BenchmarkConfig, task: str = "latency") -> dict:
    """Run `task` on the artifact in a fresh process; returns what it wrote (see worker_main)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        command = [sys.executable, "-m", "pipeline.stages.benchmark", "--worker", json.dumps(item),
                   "--benchmark-json", json.dumps(cfg.__dict__), "--task", task, "--out", str(out)]
        completed = subprocess.run(command)
        if completed.returncode != 0 or not out.is_file():
            raise RuntimeError(f"{task} of {item['name']} failed (exit code {completed.returncode}); the log above "
                               "has its error")
        return read_json(out)


def measure(item: dict, cfg: BenchmarkConfig) -> tuple[dict, float | None]:
    """Run the timing in a fresh process; returns its latencies and its peak resident memory in MiB, and sets an
    OpenVINO item's runtime_precision (what its hint resolved to)."""
    result = in_worker(item, cfg)
    if "runtime_precision" in result:
        item["runtime_precision"] = result["runtime_precision"]
    return result["latency_ms"], result["peak_rss_mib"]


def time_gemm_floor(path: Path, cfg: BenchmarkConfig) -> dict:
    """The GEMM floor graph (export_gemm_floor) at 1 thread on random uint8 activations of its own shapes."""
    session = onnx_session(path, 1)
    rng = np.random.default_rng(0)
    feed = {i.name: rng.integers(0, 256, size=i.shape, dtype=np.uint8) for i in session.get_inputs()}
    return time_calls(lambda: session.run(None, feed), cfg.runs, cfg.warmup)


def profile_ops(path: Path, sequence_length: int, vocab_size: int, runs: int, scratch: Path) -> list[dict]:
    """Time per operator type under onnxruntime's profiler (1 thread), largest first."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(scratch / path.parent.name)
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = synthetic_feed(session, sequence_length, vocab_size)
    session.run(None, feed)
    for _ in range(runs):
        session.run(None, feed)
    trace = json.loads(Path(session.end_profiling()).read_text())
    ms_by_op: dict[str, float] = {}
    for event in trace:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            ms_by_op[op] = ms_by_op.get(op, 0.0) + event["dur"] / 1000  # microseconds in the trace
    return ranked_profile(ms_by_op, runs + 1)


def optimized_int8_artifacts(root: Path, cfg: PipelineConfig, search: dict) -> list[dict]:
    """"<architecture>/onnx-int8-optimized" for each full-size architecture: the search's recipe and session options,
    on the full-size DistilBERT's own graph of that recipe and on the others' export_full_size_int8 graphs."""
    recipe_name = search["choice"]["recipe"]
    items = []
    for architecture in cfg.export.full_size.architectures:
        folder = root / "full_size" / architecture
        if architecture == "distilbert":
            path = folder / "onnx" / recipe_name / "model.onnx"
        else:
            built = read_json(root / "full_size_int8" / architecture / "full_size_int8.json")
            if built["recipe"] != recipe_name:
                raise BenchmarkInputError(f"{root}/full_size_int8/{architecture}/full_size_int8.json: built with "
                                          f"{built['recipe']}, but the int8 search chose {recipe_name}")
            path = root / "full_size_int8" / architecture / built["path"]
        max_positions, vocab_size = model_shape(folder / "pytorch" / "config.json")
        name = f"{architecture}/onnx-int8-optimized"
        timed_here = name in cfg.benchmark.timed_full_size
        item = artifact_entry(name, architecture, "onnx", "int8-optimized", path, timed=timed_here,
                              untimed_reason=None if timed_here else NOT_TIMED_FULL_SIZE, max_positions=max_positions,
                              vocab_size=vocab_size)
        item["recipe"] = recipe_name
        item["session_options"] = search["choice"]["session_options"]
        items.append(item)
    return items


def peer_artifacts(root: Path, cfg: PipelineConfig,
                   int8_search: dict | None = None) -> tuple[list[dict], dict[str, str]]:
    """The int8 paths a user would otherwise pick (export_peers), for each full-size architecture whose peers
    benchmark.timed_full_size names; the torch peer's engine is chosen here, by timing every engine in turn; each
    OpenVINO one twice, at precision f32 and at the runtime's default. Their "ours" is the architecture's
    onnx-int8-optimized graph, the one their latency is compared with. openvino-ours-int8 runs our fastest static
    int8 graph of the int8 search (`int8_search`). Returns the peers and, by name, why a named one could not be
    built or run on this machine."""
    from pipeline.export import peers

    bcfg = cfg.benchmark
    items, skipped = [], {}
    for architecture in cfg.export.full_size.architectures:
        named = [peer for peer in peers.BUILT_PEERS + (peers.OPENVINO_OURS,)
                 if f"{architecture}/{peer}" in bcfg.timed_full_size]
        if not named:
            continue
        folder = root / "full_size" / architecture
        max_positions, vocab_size = model_shape(folder / "pytorch" / "config.json")
        shape = {"max_positions": max_positions, "vocab_size": vocab_size}
        ours = f"{architecture}/onnx-int8-optimized"
        report_path = root / "peers" / architecture / "peers.json"
        built = read_json(report_path) if set(named) & set(peers.BUILT_PEERS) else {"peers": {}, "skipped": {}}
        skipped.update(built["skipped"])
        for peer in named:
            name = f"{architecture}/{peer}"
            if name in built["skipped"]:
                continue
            if peer == peers.OPENVINO_OURS:
                graph = fastest_static_graph(int8_search) if architecture == "distilbert" and int8_search else None
                if graph is None:
                    skipped[name] = ("no static (qdq) int8 recipe of the full-size DistilBERT passed its gates in "
                                     "the int8 search" if architecture == "distilbert" else
                                     "only the full-size DistilBERT has the int8 search's static graphs")
                    continue
                path = folder / "onnx" / graph / "model.onnx"
                for precision in peers.OPENVINO_PRECISIONS:
                    item = artifact_entry(f"{name}-{precision}", architecture, "openvino", f"int8-static-{precision}",
                                          path, **shape)
                    item.update(peer_of=ours, openvino_precision=precision, recipe=graph,
                                tool=peers.openvino_tool(peer, precision, graph))
                    items.append(item)
                continue
            if peer not in built["peers"]:
                raise BenchmarkInputError(f"{report_path}: {peer} is named in benchmark.timed_full_size but was "
                                          "not built (rule export_peers)")
            recorded = built["peers"][peer]
            if peer == peers.TORCH_PEER:
                item = artifact_entry(name, architecture, "pytorch", TORCH_DYNAMIC_INT8,
                                      folder / "pytorch" / "model.safetensors", **shape)
                logger.info("timing %s on every quantized engine", name)
                search = in_worker(item, bcfg, "torch-engine-search")
                item.update(engine=search["choice"], engine_search=search, peer_of=ours,
                            tool=peers.torch_peer_tool(search["choice"]))
                item["size_mb"] = recorded["size_mb_by_engine"][search["choice"]]  # its quantized state_dict
                items.append(item)
            elif peer == peers.OPENVINO_PEER:
                for precision in peers.OPENVINO_PRECISIONS:
                    item = artifact_entry(f"{name}-{precision}", architecture, "openvino", f"int8-nncf-{precision}",
                                          root / "peers" / architecture / recorded["path"], **shape)
                    item.update(peer_of=ours, openvino_precision=precision, quantization=recorded["quantization"],
                                size_mb=recorded["size_mb"], tool=peers.openvino_tool(peer, precision))
                    items.append(item)
            else:
                item = artifact_entry(name, architecture, "onnx", recorded["precision"],
                                      root / "peers" / architecture / recorded["path"], **shape)
                item.update(peer_of=ours, quantization=recorded["quantization"], tool=recorded["tool"])
                items.append(item)
    return items, skipped


def fastest_static_graph(int8_search: dict) -> str | None:
    """The static (qdq) recipe the int8 search timed fastest among those that passed their gates, or None."""
    static = {name: candidate["latency_ms"] for name, candidate in int8_search["candidates"].items()
              if candidate["recipe"]["format"] == "qdq"}
    return fastest_first(static)[0] if static else None


# ------------------------------------------------------------------------------------------------------ run


def run(cfg: PipelineConfig, root: Path, out_dir: Path) -> dict:
    bcfg = cfg.benchmark
    items = trained_artifacts(root, cfg) + full_size_artifacts(root, cfg.export.full_size.architectures,
                                                          bcfg.timed_full_size)
    longest = max(bcfg.sequence_lengths)
    with_search = "distilbert" in cfg.export.full_size.architectures
    int8_search = read_json(root / "int8_search" / "int8_search.json") if with_search else None
    if with_search:
        items += optimized_int8_artifacts(root, cfg, int8_search)
    peer_items, peers_skipped = peer_artifacts(root, cfg, int8_search)
    items += peer_items
    for item in items:
        if not item["timed"]:
            item["latency_ms"], item["peak_rss_mib"] = None, None
            continue
        logger.info("timing %s", item["name"])
        try:
            item["latency_ms"], item["peak_rss_mib"] = measure(item, bcfg)
        except RuntimeError as error:
            if item["format"] != "openvino":
                raise
            # OpenVINO's CPU plugin can refuse a model at a precision on some CPUs or SIMD settings: that entry is
            # left untimed, saying why, and the benchmark goes on
            logger.warning("not timed: %s: %s", item["name"], error)
            item.update(timed=False, latency_ms=None, peak_rss_mib=None,
                        untimed_reason=f"OpenVINO did not run it on this machine ({error})")
    by_name = {item["name"]: item for item in items}
    for peer in peer_items:
        ours = by_name.get(peer["peer_of"])
        if ours is not None and ours["timed"] and peer["timed"]:
            logger.info("timing %s and %s in turn", peer["name"], ours["name"])
            peer["interleaved_with_ours"] = in_worker({**peer, "ours": ours}, bcfg, "interleaved-with-ours")
    gemm_floor, profiles = None, {}
    if with_search:
        floor = read_json(root / "gemm_floor" / "gemm_floor.json")
        if floor["sequence_length"] != longest:
            raise BenchmarkInputError(f"{root}/gemm_floor/gemm_floor.json: built for {floor['sequence_length']} "
                                      f"tokens, but the longest benchmark.sequence_lengths is {longest}")
        gemm_floor = {"sequence_length": longest, "threads": 1, "n_matmul_integer": floor["n_matmul_integer"],
                      "latency_ms": time_gemm_floor(root / "gemm_floor" / floor["path"], bcfg)}
        distilbert = root / "full_size" / "distilbert" / "onnx"
        _, vocab_size = model_shape(root / "full_size" / "distilbert" / "pytorch" / "config.json")
        profiled = {"distilbert/onnx-int8": distilbert / NAIVE_INT8 / "model.onnx",
                    "distilbert/onnx-int8-optimized": distilbert / int8_search["choice"]["recipe"] / "model.onnx"}
        with tempfile.TemporaryDirectory() as traces:  # onnxruntime's profiler writes one trace file per session
            for name, path in profiled.items():
                profiles[name] = profile_ops(path, longest, vocab_size, bcfg.profile_runs, Path(traces))
        for item in peer_items:
            if item["format"] == "openvino" and item["model"] == "distilbert" and item["timed"]:
                from pipeline.export.peers import openvino_profile
                from pipeline.spawn import in_spawned_process

                # where OpenVINO's kernels win: beside the onnxruntime profiles above, on the same input
                profiles[item["name"]], _ = in_spawned_process(
                    openvino_profile, Path(item["path"]), item["openvino_precision"], longest, vocab_size,
                    bcfg.profile_runs)
    metrics = {
        "machine": machine_description(),
        "settings": {"sequence_lengths": bcfg.sequence_lengths, "threads": bcfg.threads, "runs": bcfg.runs,
                     "warmup": bcfg.warmup, "batch_size": 1, "in_turn_block_runs": BLOCK_RUNS,
                     "in_turn_settle_s": SETTLE_S},
        "artifacts": items,
        "int8_search": int8_search,
        "peers_skipped": peers_skipped,
        "gemm_floor": gemm_floor,
        "profiles": profiles,
    }
    with atomic_output_dir(out_dir, cfg) as tmp:
        atomic_write_json(tmp / "benchmark.json", metrics)
    return metrics


def machine_description() -> dict:
    from importlib import metadata

    versions = {}
    for name in ("onnxruntime", "torch", "transformers", "optimum", "coremltools", "onnx", "openvino", "nncf"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    cpu = cpu_description()
    return {"cpu": cpu["model_name"], "cpu_flags": cpu["simd_flags"], "cores": os.cpu_count(),
            "python": sys.version.split()[0], "versions": versions}


def worker_main(item_json: str, benchmark_json: str, task: str, out: Path) -> int:
    item = json.loads(item_json)
    cfg = BenchmarkConfig(**json.loads(benchmark_json))
    if task == "torch-engine-search":
        atomic_write_json(out, search_torch_engine(item, cfg))
    elif task == "interleaved-with-ours":
        atomic_write_json(out, interleaved_with_ours(item, item["ours"], cfg))
    else:
        latency = measure_in_this_process(item, cfg)
        peak = high_water_mark_mib()
        result = {"latency_ms": latency, "peak_rss_mib": None if peak is None else round(peak, 1)}
        if item["format"] == "openvino":  # what its precision hint resolved to on this CPU
            from pipeline.runtime.openvino_session import OpenVinoSession

            result["runtime_precision"] = OpenVinoSession(item["path"], 1, item["openvino_precision"]).precision
        atomic_write_json(out, result)
    return 0


def worker_cli(argv: list[str] | None = None) -> int:
    """`python -m pipeline.stages.benchmark --worker ITEM --benchmark-json JSON --task TASK --out FILE`: one task on
    one artifact in this process, as in_worker starts it (not a user's command: that is `python -m pipeline
    benchmark`)."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.stages.benchmark", description=worker_cli.__doc__)
    parser.add_argument("--worker", required=True, help="the artifact, as JSON")
    parser.add_argument("--benchmark-json", required=True, help="the benchmark config section, as JSON")
    parser.add_argument("--task", default="latency")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    return worker_main(args.worker, args.benchmark_json, args.task, args.out)


# `python -m pipeline benchmark`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "root": "the pipeline's output root (artifacts/)",
}


if __name__ == "__main__":
    from pipeline.startup import hide_unused_packages_from_transformers

    hide_unused_packages_from_transformers()  # each PyTorch timing worker loads a model (pipeline/startup.py)
    sys.exit(worker_cli())
