"""Latency of the bundle's ONNX model in JavaScript: onnxruntime-web (WebAssembly) and onnxruntime-node in Node at
1 thread, and onnxruntime-web in headless Chromium at benchmark.browser_threads.

The timing runs in clients/web/scripts/bench.mjs (its timing code, clients/web/bench/latency.js, is shared with the
latency page and stays out of the client's npm package), one process per model, runtime and thread count, so each
peak memory is its own; in Chromium it times session.run inside a page that the client's own server makes
cross-origin isolated (WebAssembly threads need it), and fails if the page runs fewer threads than asked. This
stage picks the models, calls it, and writes entries shaped like the benchmark summary's artifacts (format
"onnx-web" / "onnx-node" / "onnx-web-chromium"). Timed: the bundle's model and, where the pipeline built it, the
full-size DistilBERT int8 graph, whose 512 positions also reach the longest lengths.

  python -m pipeline benchmark-web --root artifacts --out artifacts/benchmark_web/benchmark_web.json
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.outputs.artifacts import atomic_write_json, directory_size_bytes, megabytes, read_json
from pipeline.outputs.machine import cpu_description
from pipeline.plan.config import BenchmarkConfig, PipelineConfig
from pipeline.plan.model_registry import TRAINED_MODELS, bundled_model, exported_models

logger = logging.getLogger(__name__)

CLIENT_DIR = Path(__file__).resolve().parents[2] / "clients" / "web"
BACKENDS = {"web": "onnx-web", "node": "onnx-node", "chromium": "onnx-web-chromium"}  # bench.mjs -> summary format
NODE_THREADS = [1]  # in Node: one thread, what any page runs, cross-origin isolated or not


class WebBenchmarkError(PipelineError, RuntimeError):
    """Node, the client's npm packages or Chromium are missing, or a timing run failed."""


def chromium_path() -> Path:
    """The Chromium that bench.mjs drives (clients/web/scripts/chromium.mjs reads the same variable)."""
    return Path(os.environ.get("CHROMIUM_PATH") or "/usr/bin/chromium")


def missing_client(client_dir: Path = CLIENT_DIR) -> str | None:
    """Why the JavaScript timings cannot run here (Node.js or the client's npm packages missing), or None."""
    if shutil.which("node") is None:
        return "node is not on PATH: install Node.js 20 or newer"
    for package in ("onnxruntime-node", "onnxruntime-web"):
        if not (client_dir / "node_modules" / package).is_dir():
            return f"{client_dir / 'node_modules' / package} is missing: run `npm ci` in {client_dir}"
    return None


def missing_browser(client_dir: Path = CLIENT_DIR) -> str | None:
    """Why the Chromium timings cannot run here (no Chromium, or no puppeteer-core to drive it), or None."""
    if not (client_dir / "node_modules" / "puppeteer-core").is_dir():
        return f"{client_dir / 'node_modules' / 'puppeteer-core'} is missing: run `npm ci` in {client_dir}"
    if not chromium_path().is_file():
        return (f"no Chromium at {chromium_path()}: `apt-get install chromium` (setup.sh does as root) or set "
                "CHROMIUM_PATH")
    return None


def check_client(client_dir: Path = CLIENT_DIR, browser: bool = False) -> str:
    """The node executable; fails with what to install when Node, the client's node_modules or (with `browser`)
    Chromium are missing."""
    reason = missing_client(client_dir) or (missing_browser(client_dir) if browser else None)
    if reason:
        raise WebBenchmarkError(reason + (" (benchmark.browser is true: set it to auto or false to time without it)"
                                          if browser and "hromium" in reason else ""))
    return shutil.which("node")


def what_runs(cfg: BenchmarkConfig, client_dir: Path = CLIENT_DIR) -> tuple[bool, bool, list[dict]]:
    """Whether the JavaScript and the Chromium timings run on this machine, and what is skipped with the reason.
    true requires the tools (the run stops without them); auto times what the machine has."""
    skipped = []
    javascript = cfg.javascript is not False
    if cfg.javascript == "auto" and (reason := missing_client(client_dir)):
        skipped.append({"what": "JavaScript timings (onnxruntime-web and onnxruntime-node in Node, and Chromium)",
                        "reason": reason})
        javascript = False
    browser = javascript and cfg.browser is not False
    if javascript and cfg.browser == "auto" and (reason := missing_browser(client_dir)):
        skipped.append({"what": "Chromium timings (onnxruntime-web in a page)", "reason": reason})
        browser = False
    if javascript:
        check_client(client_dir, browser=browser)  # true: stops here, naming what is missing
    return javascript, browser, skipped


def runtimes(cfg: BenchmarkConfig, browser: bool) -> dict[str, list[int]]:
    """bench.mjs backend -> the thread counts it is timed at."""
    timed = {"web": NODE_THREADS, "node": NODE_THREADS}
    if browser:
        timed["chromium"] = sorted(set(cfg.browser_threads))
    return timed


STUDENT = ("student", TRAINED_MODELS["student"])  # the bundled model of the training DAG, and its stage folder


def models_to_time(root: Path, with_full_size: bool = True, bundled: tuple[str, str] = STUDENT) -> list[dict]:
    """The bundle's model (the chosen int8 graph of `bundled`: its name and stage folder) and, if asked and searched
    by rule int8_search (benchmark.json's copy), the full-size DistilBERT int8-optimized graph."""
    bundle = root / "bundle"
    name, stage = bundled
    for needed in (bundle / "qa_config.json", bundle / "metrics.json", root / stage / "config.json"):
        if not needed.is_file():
            raise WebBenchmarkError(f"{needed}: missing (run the pipeline's bundle rule first)")
    qa_config = read_json(bundle / "qa_config.json")
    student_config = read_json(root / stage / "config.json")
    bundled_int8 = qa_config["onnx"]["model"] == "model.int8.onnx"  # else no int8 passed: the app runs the fp32 graph
    models = [{"model": name, "precision": "int8-optimized" if bundled_int8 else "fp32",
               "recipe": read_json(bundle / "metrics.json")["onnx_variant"],
               "path": bundle / qa_config["onnx"]["model"], "max_positions": student_config["max_position_embeddings"],
               "vocab_size": student_config["vocab_size"], "full_size": False}]
    distilbert = root / "full_size" / "distilbert"
    search = (read_json(root / "benchmark" / "benchmark.json").get("int8_search")
              if (root / "benchmark" / "benchmark.json").is_file() else None)
    if with_full_size and search:
        config = read_json(distilbert / "pytorch" / "config.json")
        models.append({"model": "distilbert", "precision": "int8-optimized", "recipe": search["choice"]["recipe"],
                       "path": distilbert / "onnx" / search["choice"]["recipe"] / "model.onnx",
                       "max_positions": config["max_position_embeddings"], "vocab_size": config["vocab_size"],
                       "full_size": True})
    return models


def time_in_javascript(node: str, model: dict, backend: str, threads: int, runs: int, cfg: BenchmarkConfig,
                       client_dir: Path = CLIENT_DIR) -> dict:
    """One bench.mjs run: one model on one runtime at one thread count."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "latency.json"
        command = [node, str(client_dir / "scripts" / "bench.mjs"), "--model", str(model["path"]), "--backend", backend,
                   "--lengths", ",".join(str(length) for length in cfg.sequence_lengths),
                   "--vocab-size", str(model["vocab_size"]), "--max-positions", str(model["max_positions"]),
                   "--runs", str(runs), "--warmup", str(cfg.warmup), "--threads", str(threads), "--out", str(out)]
        completed = subprocess.run(command, capture_output=True, text=True)
        if completed.returncode != 0 or not out.is_file():
            raise WebBenchmarkError(f"timing {model['path']} on {backend} at {threads} thread(s) failed (exit code "
                                    f"{completed.returncode}): {completed.stderr.strip()[-500:]}")
        return json.loads(out.read_text())


def merged_latency(results: list[dict]) -> dict:
    """One latency table over thread counts: {seqL: {threads1: .., threads2: ..}}, null where a length is beyond
    the model's positions."""
    latency: dict = {}
    for result in results:
        for length, cell in result["latency_ms"].items():
            latency[length] = None if cell is None else {**(latency.get(length) or {}), **cell}
    return latency


def run(root: Path, out: Path, cfg: BenchmarkConfig | None = None, client_dir: Path = CLIENT_DIR,
        bundled: tuple[str, str] = STUDENT) -> dict:
    """Time every model on every JavaScript runtime this machine has (benchmark.javascript / browser) and write the
    entries, and what was skipped with the reason, to `out` (JSON)."""
    cfg = cfg or BenchmarkConfig()
    javascript, with_browser, skipped = what_runs(cfg, client_dir)
    node = shutil.which("node")
    timed = runtimes(cfg, with_browser) if javascript else {}
    versions, node_version, browser = {}, None, None
    artifacts = []
    for model in models_to_time(root, cfg.javascript_full_size, bundled) if javascript else []:
        runs = cfg.javascript_full_size_runs if model["full_size"] else cfg.runs
        for backend, thread_counts in timed.items():
            fmt = BACKENDS[backend]
            logger.info("timing %s on %s at %s thread(s)", model["path"], fmt, thread_counts)
            results = [time_in_javascript(node, model, backend, threads, runs, cfg, client_dir) for threads in thread_counts]
            versions[fmt], node_version = results[0]["runtime"], results[0]["node"]
            browser = results[0].get("browser") or browser
            peaks = [result["peak_rss_mib"] for result in results if result["peak_rss_mib"] is not None]
            artifacts.append({
                "name": f"{model['model']}/{fmt}-{model['precision']}", "model": model["model"], "format": fmt,
                "precision": model["precision"], "path": str(model["path"]),
                "size_mb": megabytes(directory_size_bytes(model["path"])),
                "recipe": model["recipe"], "runtime": results[0]["runtime"], "timed": True, "untimed_reason": None,
                "max_positions": model["max_positions"], "vocab_size": model["vocab_size"], "runs": runs,
                "latency_ms": merged_latency(results), "peak_rss_mib": max(peaks) if peaks else None,
            })
    cpu = cpu_description()
    metrics = {
        "machine": {"cpu": cpu["model_name"], "cpu_flags": cpu["simd_flags"], "node": node_version,
                    "browser": browser, "runtimes": versions},
        "settings": {"sequence_lengths": cfg.sequence_lengths, "threads": {BACKENDS[b]: t for b, t in timed.items()},
                     "runs": cfg.runs, "full_size_runs": cfg.javascript_full_size_runs, "warmup": cfg.warmup,
                     "batch_size": 1},
        "artifacts": artifacts,
        "skipped": skipped,
    }
    for item in skipped:
        logger.warning("benchmark_web: %s skipped: %s", item["what"], item["reason"])
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, metrics)
    return metrics


def run_for_config(cfg: PipelineConfig | None, root: Path, out: Path) -> dict:
    """run() with the benchmark section and the bundled model of the pipeline's config (the default config
    without one)."""
    full = cfg or PipelineConfig()
    bundled = bundled_model(full)
    return run(root, out, full.benchmark, bundled=(bundled, exported_models(full)[bundled]))


# `python -m pipeline benchmark-web`: run_for_config()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "root": "the pipeline's output root (artifacts/)",
    "out": "JSON file to write",
    "cfg": "the run's config as JSON: its benchmark section sets lengths, runs, the full-size graph and Chromium's "
           "threads",
}
