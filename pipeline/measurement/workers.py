"""Each timing in a fresh worker process: an artifact's latency table with the process's peak resident memory, the
torch peer's engine search, the peers in turn with our graph. A fresh process per artifact keeps one artifact's memory
and threads out of the next one's figures; this module's start-up is charged to each of them, so it imports no
export library and no torch until a PyTorch artifact is loaded.

`python -m pipeline.measurement.workers` is the worker's command line (in_worker starts it; not a user's command:
that is `python -m pipeline benchmark`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.measurement.peer_timing import peers_in_turn_with_ours, search_torch_engine
from pipeline.measurement.runners import latency_table, session_option_set
from pipeline.outputs.artifacts import atomic_write_json, read_json
from pipeline.outputs.machine import high_water_mark_mib
from pipeline.plan.config import BenchmarkConfig

logger = logging.getLogger(__name__)

TASKS = ("latency", "torch-engine-search", "peers-in-turn-with-ours")


def in_worker(item: dict, cfg: BenchmarkConfig, task: str = "latency") -> dict:
    """Run `task` on the artifact in a fresh process; returns what it wrote (see worker_main)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        command = [sys.executable, "-m", "pipeline.measurement.workers", "--worker", json.dumps(item),
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


def memory_run(cfg: BenchmarkConfig) -> BenchmarkConfig:
    """One warm-up and one run at the longest length and the most threads: what a peer's own process runs for its
    peak memory when its latency comes from its blocks in turn with our graph."""
    return dataclasses.replace(cfg, sequence_lengths=[max(cfg.sequence_lengths)], threads=[max(cfg.threads)], runs=1,
                               warmup=1)


def in_turn_latency(in_turn: dict, cfg: BenchmarkConfig) -> dict:
    """A peer's latency table ({seqL: {"threadsN": {p50, p90}}}, null for a length it was not timed at) from its
    blocks in turn with our graph."""
    return {f"seq{length}": ({f"threads{threads}": in_turn[f"seq{length}"][f"threads{threads}"]["peer"]
                              for threads in cfg.threads} if f"seq{length}" in in_turn else None)
            for length in cfg.sequence_lengths}


def same_run_as(item: dict, by_name: dict[str, dict]) -> str | None:
    """The -f32 entry an OpenVINO "-default" entry repeats on this CPU: where the runtime's default precision for
    what is not int8 resolved to f32 (no bf16 or fp16 inference), the two compile the same model the same way; None
    otherwise."""
    if item["format"] != "openvino" or item.get("openvino_precision") != "default":
        return None
    if item.get("runtime_precision") != "f32":
        return None
    sibling = by_name.get(item["name"].removesuffix("-default") + "-f32")
    return sibling["name"] if sibling is not None and sibling["timed"] else None


def graph_run_key(item: dict) -> tuple | None:
    """What decides an onnxruntime timing of our own graphs: the graph file, the session options and the timed runs
    (a peer's graph is a file of its own); None for the other formats."""
    if item["format"] != "onnx" or item.get("peer_of"):
        return None
    return str(Path(item["path"]).resolve()), session_option_set(item), item.get("runs")


def time_artifacts(items: list[dict], cfg: BenchmarkConfig) -> None:
    """Time every benchmark entry in place, each in its own process: its "latency_ms" and "peak_rss_mib" (null for
    one not timed), over item["runs"] timed runs where the entry says (the full-size ones), else cfg.runs. A peer
    ("peer_of" names our graph, timed before it) is timed once, in turn with our graph and the other peers of that
    graph in one process at every length and thread count ("interleaved_with_ours", which is also its latency
    table), over our graph's runs (its "runs"): its own process then only measures its peak memory (memory_run). A
    peer whose graph of ours was not timed is timed alone. An OpenVINO entry its CPU plugin refuses is left untimed,
    saying why; so is a "-default" one that repeats its "-f32" sibling on this CPU (same_run_as). An ONNX entry
    whose graph file, session options and runs an earlier entry was timed with (the int8 search's choice when it is
    the naive graph with the default options) takes that entry's figures and names it (same_run_as): one
    configuration, one figure."""
    by_name = {item["name"]: item for item in items}
    in_turn_with: dict[str, list[dict]] = {}  # our graph's name: its peers, timed in turn with it
    timed_graph_runs: dict[tuple, str] = {}  # graph_run_key: the entry timed with it
    for item in items:
        if not item["timed"]:
            item["latency_ms"], item["peak_rss_mib"] = None, None
            continue
        key = graph_run_key(item)
        if key in timed_graph_runs:
            first = by_name[timed_graph_runs[key]]
            item.update(latency_ms=first["latency_ms"], peak_rss_mib=first["peak_rss_mib"], same_run_as=first["name"],
                        latency_timing=f"the same run as {first['name']}: the same graph file, session options and "
                                       "runs")
            continue
        ours = by_name.get(item.get("peer_of"))
        in_turn = ours is not None and ours["timed"] and ours.get("latency_ms") is not None
        logger.info("timing %s%s", item["name"], " (its memory: its latency is timed in turn with ours)" if in_turn
                    else "")
        try:
            own_cfg = dataclasses.replace(cfg, runs=item["runs"]) if "runs" in item else cfg  # full-size: fewer
            item["latency_ms"], item["peak_rss_mib"] = measure(item, memory_run(cfg) if in_turn else own_cfg)
        except RuntimeError as error:
            if item["format"] != "openvino":
                raise
            # OpenVINO's CPU plugin can refuse a model at a precision on some CPUs or SIMD settings: that entry is
            # left untimed, saying why, and the benchmark goes on
            logger.warning("not timed: %s: %s", item["name"], error)
            item.update(timed=False, latency_ms=None, peak_rss_mib=None,
                        untimed_reason=f"OpenVINO did not run it on this machine ({error})")
            continue
        if key is not None:
            timed_graph_runs[key] = item["name"]
        repeated = same_run_as(item, by_name)
        if repeated is not None:
            # timing it would time the sibling's run again (about a minute per peer on the slowest CPU kind)
            item.update(timed=False, latency_ms=None, same_run_as=repeated, untimed_reason=(
                f"OpenVINO's default precision resolved to f32 on this CPU: the same run as {repeated}"))
            continue
        if in_turn:
            in_turn_with.setdefault(ours["name"], []).append(item)
    for ours_name, peers in in_turn_with.items():
        logger.info("timing %s in turn with %s", ", ".join(peer["name"] for peer in peers), ours_name)
        # as many timed runs as our graph's own row (a full-size one: full_size_runs), in blocks as ever
        runs = by_name[ours_name].get("runs", cfg.runs)
        comparison = in_worker({"name": f"the peers of {ours_name}", "ours": by_name[ours_name], "peers": peers},
                               dataclasses.replace(cfg, runs=runs), "peers-in-turn-with-ours")
        for peer in peers:
            peer["runs"] = runs
            peer["interleaved_with_ours"] = comparison[peer["name"]]
            peer["latency_ms"] = in_turn_latency(peer["interleaved_with_ours"], cfg)
            peer["latency_timing"] = "in turn with our graph and its other peers; peak memory from one run of its own"


def untimed_openvino_precision(item: dict) -> str:
    """What an OpenVINO item's precision hint resolves to on this CPU, from a session compiled for that alone: where
    no length was timed (all beyond the model's positions), no timed session said it."""
    from pipeline.runtime.openvino_session import OpenVinoSession

    return OpenVinoSession(item["path"], 1, item["openvino_precision"]).precision


def worker_main(item_json: str, benchmark_json: str, task: str, out: Path) -> int:
    item = json.loads(item_json)
    cfg = BenchmarkConfig(**json.loads(benchmark_json))
    if task == "torch-engine-search":
        atomic_write_json(out, search_torch_engine(item, cfg))
    elif task == "peers-in-turn-with-ours":
        atomic_write_json(out, peers_in_turn_with_ours(item["peers"], item["ours"], cfg))
    else:
        latency = latency_table(item, cfg)
        peak = high_water_mark_mib()
        result = {"latency_ms": latency, "peak_rss_mib": None if peak is None else round(peak, 1)}
        if item["format"] == "openvino":  # what its precision hint resolved to on this CPU, in the timed session
            result["runtime_precision"] = item.get("runtime_precision") or untimed_openvino_precision(item)
        atomic_write_json(out, result)
    return 0


def worker_cli(argv: list[str] | None = None) -> int:
    """`python -m pipeline.measurement.workers --worker ITEM --benchmark-json JSON --task TASK --out FILE`: one task
    on one artifact in this process, as in_worker starts it (not a user's command: that is `python -m pipeline
    benchmark`)."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.measurement.workers", description=worker_cli.__doc__)
    parser.add_argument("--worker", required=True, help="the artifact, as JSON")
    parser.add_argument("--benchmark-json", required=True, help="the benchmark config section, as JSON")
    parser.add_argument("--task", default="latency", choices=TASKS)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    return worker_main(args.worker, args.benchmark_json, args.task, args.out)


if __name__ == "__main__":
    from pipeline.startup import pause_collection_while_loading, prepare_process

    prepare_process()  # library settings, as in every process of the pipeline (pipeline/startup.py)
    pause_collection_while_loading()  # until the timer starts (latency.py), its artifact and runtime loaded
    sys.exit(worker_cli())
