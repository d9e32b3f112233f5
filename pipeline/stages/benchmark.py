"""Stage benchmark: size, dev accuracy, latency and peak memory of every artifact, measured on this machine.

It times what the export rules built and builds nothing. Artifacts: every model the pipeline exported (PyTorch
fp32 as the baseline, ONNX fp32 / fused / int8 / 4-bit, the bundle's .ort, CoreML packages), the full-size
architectures (export_full_size), their searched int8 graphs (int8_search, export_full_size_int8), the peers
(export_peers) and the GEMM floor graph (export_gemm_floor).
- size: bytes on disk (MB = 10^6 bytes; an .mlpackage counts every file in it).
- dev exact match / F1: as the export stages measured them (ONNX through onnxruntime with the torch-free
  answerer, PyTorch from training, CoreML from its PyTorch-side proxy); null for the random-weight full-size
  architectures.
- latency: batch 1, every configured length and thread count, p50 and p90 over `runs` timed runs after `warmup`
  (`full_size_runs` for a full-size architecture's rows and its peers' blocks) (pipeline.measurement.latency, the
  pipeline's one timer); onnxruntime sessions and torch pinned to the thread count, one process per artifact whose
  peak resident memory is recorded (pipeline.measurement.workers). CoreML cannot run on Linux: null, with why.
- int8 search (rule int8_search, copied into benchmark.json): the fastest gate-passing int8 recipe and session
  options of the full-size DistilBERT (the default options where they are within the latency tie) are
  "distilbert/onnx-int8-optimized" (the naive row's run, same_run_as, where the choice is the naive graph with the
  default options); "bert-base/onnx-int8-optimized" is BERT-base's graph of the recipe (export_full_size_int8).
- peers: the int8 paths a user would otherwise pick (export_peers), timed like every artifact and, at every thread
  count, in turn with our graph in one process; the torch peer on every quantized engine first, the fastest kept.
- GEMM floor: the full-size DistilBERT int8 graph's MatMulInteger nodes alone (export_gemm_floor), timed like the
  model at the longest length with 1 thread: model latency / floor says how close the model runs to this
  machine's int8 matrix-multiply speed.
- profile: onnxruntime's profiler over the full-size int8 graphs, time per operator type (OpenVINO's performance
  counters for its DistilBERT peers).
The rule takes every core Snakemake has, so nothing runs beside the timed runs.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.export import peers
from pipeline.measurement.inventory import (artifact_entry, full_size_artifacts, model_shape, timed_if_named,
                                            trained_artifacts)
from pipeline.measurement.latency import BLOCK_RUNS, SETTLE_S, fastest_first
from pipeline.measurement.machine_description import machine_description
from pipeline.measurement.profiles import profile_graphs
from pipeline.measurement.runners import time_gemm_floor
from pipeline.measurement.torch_peer import TORCH_DYNAMIC_INT8
from pipeline.measurement.workers import in_worker, time_artifacts
from pipeline.outputs.artifacts import atomic_write_json, read_json
from pipeline.outputs.manifests import atomic_output_dir
from pipeline.plan.config import PipelineConfig
from pipeline.spawn import in_spawned_process

logger = logging.getLogger(__name__)

NAIVE_INT8 = "int8"  # the naive int8 graph's folder (pipeline.export.int8.NAIVE: not imported, it loads the ONNX tools)


class BenchmarkInputError(PipelineError, ValueError):
    """A built artifact that does not match what the benchmark was asked to time."""


def optimized_int8_artifacts(root: Path, cfg: PipelineConfig, search: dict) -> list[dict]:
    """"<architecture>/onnx-int8-optimized" for each full-size architecture: the search's recipe and session options,
    on the full-size DistilBERT's own graph of that recipe and on the others' export_full_size_int8 graphs."""
    recipe_name, items = search["choice"]["recipe"], []
    for architecture in cfg.export.full_size.architectures:
        folder = root / "full_size" / architecture
        path = folder / "onnx" / recipe_name / "model.onnx"
        if architecture != "distilbert":
            built = read_json(root / "full_size_int8" / architecture / "full_size_int8.json")
            if built["recipe"] != recipe_name:
                raise BenchmarkInputError(f"{root}/full_size_int8/{architecture}/full_size_int8.json: built with "
                                          f"{built['recipe']}, but the int8 search chose {recipe_name}")
            path = root / "full_size_int8" / architecture / built["path"]
        name = f"{architecture}/onnx-int8-optimized"
        item = artifact_entry(name, architecture, "onnx", "int8-optimized", path,
                              **timed_if_named(name, cfg.benchmark.timed_full_size),
                              **model_shape(folder / "pytorch" / "config.json"))
        items.append({**item, "recipe": recipe_name, "session_options": search["choice"]["session_options"]})
    return items


def peer_artifacts(root: Path, cfg: PipelineConfig,
                   int8_search: dict | None = None) -> tuple[list[dict], dict[str, str]]:
    """The int8 paths a user would otherwise pick (export_peers), for each full-size architecture whose peers
    benchmark.timed_full_size names; the torch peer's engine is chosen here, by timing every engine in turn; each
    OpenVINO one twice, at precision f32 and at the runtime's default. Their "ours" is the architecture's
    onnx-int8-optimized graph, the one their latency is compared with. openvino-ours-int8 runs our fastest static
    int8 graph of the int8 search (`int8_search`). Returns the peers and, by name, why a named one could not be
    built or run on this machine."""
    items, skipped = [], {}
    for architecture in cfg.export.full_size.architectures:
        named = [peer for peer in peers.BUILT_PEERS + (peers.OPENVINO_OURS,)
                 if f"{architecture}/{peer}" in cfg.benchmark.timed_full_size]
        if not named:
            continue
        folder, report_path = root / "full_size" / architecture, root / "peers" / architecture / "peers.json"
        shape = model_shape(folder / "pytorch" / "config.json")
        ours = {"peer_of": f"{architecture}/onnx-int8-optimized"}  # the graph a peer's latency is compared with
        built = read_json(report_path) if set(named) & set(peers.BUILT_PEERS) else {"peers": {}, "skipped": {}}
        skipped.update(built["skipped"])
        for peer in named:
            name, recorded = f"{architecture}/{peer}", built["peers"].get(peer)
            if name in built["skipped"]:
                continue
            if peer == peers.OPENVINO_OURS:
                graph = fastest_static_graph(int8_search) if architecture == "distilbert" and int8_search else None
                if graph is None:
                    skipped[name] = ("no static (qdq) int8 recipe of the full-size DistilBERT passed its gates in "
                                     "the int8 search" if architecture == "distilbert" else
                                     "only the full-size DistilBERT has the int8 search's static graphs")
                    continue
                for precision in peers.OPENVINO_PRECISIONS:
                    item = artifact_entry(f"{name}-{precision}", architecture, "openvino", f"int8-static-{precision}",
                                          folder / "onnx" / graph / "model.onnx", **shape)
                    items.append({**item, **ours, "openvino_precision": precision, "recipe": graph,
                                  "tool": peers.openvino_tool(peer, precision, graph)})
            elif recorded is None:
                raise BenchmarkInputError(f"{report_path}: {peer} is named in benchmark.timed_full_size but was "
                                          "not built (rule export_peers)")
            elif peer == peers.TORCH_PEER:
                item = artifact_entry(name, architecture, "pytorch", TORCH_DYNAMIC_INT8,
                                      folder / "pytorch" / "model.safetensors", **shape)
                logger.info("timing %s on every quantized engine", name)
                search = in_worker(item, cfg.benchmark, "torch-engine-search")
                item.update(engine=search["choice"], engine_search=search, **ours,
                            tool=peers.torch_peer_tool(search["choice"]))
                item["size_mb"] = recorded["size_mb_by_engine"][search["choice"]]  # its quantized state_dict
                items.append(item)
            elif peer == peers.OPENVINO_PEER:
                for precision in peers.OPENVINO_PRECISIONS:
                    item = artifact_entry(f"{name}-{precision}", architecture, "openvino", f"int8-nncf-{precision}",
                                          report_path.parent / recorded["path"], **shape)
                    items.append({**item, **ours, "openvino_precision": precision,
                                  "quantization": recorded["quantization"], "size_mb": recorded["size_mb"],
                                  "tool": peers.openvino_tool(peer, precision)})
            else:
                item = artifact_entry(name, architecture, "onnx", recorded["precision"],
                                      report_path.parent / recorded["path"], **shape)
                items.append({**item, **ours, "quantization": recorded["quantization"], "tool": recorded["tool"]})
    return items, skipped


def fastest_static_graph(int8_search: dict) -> str | None:
    """The static (qdq) recipe the int8 search timed fastest among those that passed their gates, or None."""
    static = {name: candidate["latency_ms"] for name, candidate in int8_search["candidates"].items()
              if candidate["recipe"]["format"] == "qdq"}
    return fastest_first(static)[0] if static else None


def floor_and_profiles(root: Path, cfg: PipelineConfig, int8_search: dict,
                       peer_items: list[dict]) -> tuple[dict, dict]:
    """The GEMM floor's latency, and where the full-size DistilBERT int8 graphs spend their time (and its OpenVINO
    peers: where OpenVINO's kernels win), on the same input."""
    bcfg, longest = cfg.benchmark, max(cfg.benchmark.sequence_lengths)
    floor = read_json(root / "gemm_floor" / "gemm_floor.json")
    if floor["sequence_length"] != longest:
        raise BenchmarkInputError(f"{root}/gemm_floor/gemm_floor.json: built for {floor['sequence_length']} "
                                  f"tokens, but the longest benchmark.sequence_lengths is {longest}")
    gemm_floor = {"sequence_length": longest, "threads": 1, "n_matmul_integer": floor["n_matmul_integer"],
                  "latency_ms": time_gemm_floor(root / "gemm_floor" / floor["path"], bcfg)}
    distilbert = root / "full_size" / "distilbert"
    vocab_size = model_shape(distilbert / "pytorch" / "config.json")["vocab_size"]
    chosen = int8_search["choice"]["recipe"]
    graphs = {"distilbert/onnx-int8": distilbert / "onnx" / NAIVE_INT8 / "model.onnx"}
    if chosen != NAIVE_INT8:  # else the same file, profiled once (the profiler takes no session options)
        graphs["distilbert/onnx-int8-optimized"] = distilbert / "onnx" / chosen / "model.onnx"
    profiles = profile_graphs(graphs, longest, vocab_size, bcfg.profile_runs)
    profiles.setdefault("distilbert/onnx-int8-optimized", profiles["distilbert/onnx-int8"])
    for item in peer_items:
        if item["format"] == "openvino" and item["model"] == "distilbert" and item["timed"]:
            profiles[item["name"]], _ = in_spawned_process(peers.openvino_profile, Path(item["path"]),
                                                           item["openvino_precision"], longest, vocab_size,
                                                           bcfg.profile_runs, libraries=("openvino",))
    return gemm_floor, profiles


def run(cfg: PipelineConfig, root: Path, out_dir: Path) -> dict:
    bcfg, architectures = cfg.benchmark, cfg.export.full_size.architectures
    with_search = "distilbert" in architectures  # the int8 search, the GEMM floor and the profiles are DistilBERT's
    int8_search = read_json(root / "int8_search" / "int8_search.json") if with_search else None
    full_size = full_size_artifacts(root, architectures, bcfg.timed_full_size)
    full_size += optimized_int8_artifacts(root, cfg, int8_search) if with_search else []
    items = trained_artifacts(root, cfg) + [{**item, "runs": bcfg.full_size_runs} for item in full_size]
    peer_items, peers_skipped = peer_artifacts(root, cfg, int8_search)
    items += peer_items
    time_artifacts(items, bcfg)  # each in a process of its own; then each peer in turn with our graph
    gemm_floor, profiles = floor_and_profiles(root, cfg, int8_search, peer_items) if with_search else (None, {})
    metrics = {
        "machine": machine_description(),
        "settings": {"sequence_lengths": bcfg.sequence_lengths, "threads": bcfg.threads, "runs": bcfg.runs,
                     "full_size_runs": bcfg.full_size_runs, "warmup": bcfg.warmup, "batch_size": 1,
                     "in_turn_block_runs": BLOCK_RUNS, "in_turn_settle_s": SETTLE_S},
        "artifacts": items, "int8_search": int8_search, "peers_skipped": peers_skipped, "gemm_floor": gemm_floor,
        "profiles": profiles,
    }
    with atomic_output_dir(out_dir, cfg) as tmp:
        atomic_write_json(tmp / "benchmark.json", metrics)
    return metrics


# `python -m pipeline benchmark`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {"root": "the pipeline's output root (artifacts/)"}
