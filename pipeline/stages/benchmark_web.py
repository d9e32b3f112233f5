"""Latency of the bundle's ONNX model in JavaScript: onnxruntime-web (WebAssembly) and onnxruntime-node, 1 thread.

The timing itself runs in Node (clients/web/scripts/bench.mjs, one process per model and runtime, so each peak
memory is its own); this stage picks the models, calls it, and writes entries shaped like the benchmark
summary's artifacts (format "onnx-web" / "onnx-node"). Timed: the bundle's model and, where the pipeline built
it, the full-size DistilBERT int8 graph, whose 512 positions also reach the longest lengths.

  python -m pipeline benchmark-web --root artifacts --out artifacts/benchmark_web/benchmark_web.json
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.artifacts import EXPORTED_MODELS, atomic_write_json, directory_size_bytes, megabytes, read_json, setup_logging
from pipeline.config import BenchmarkConfig, config_from_json
from pipeline.errors import PipelineError
from pipeline.latency import cpu_description

logger = logging.getLogger(__name__)

CLIENT_DIR = Path(__file__).resolve().parents[2] / "clients" / "web"
BACKENDS = {"web": "onnx-web", "node": "onnx-node"}  # bench.mjs backend -> summary format
THREADS = 1  # the browser case: one WebAssembly thread needs no cross-origin isolation


class WebBenchmarkError(PipelineError, RuntimeError):
    """Node or the client's npm packages are missing, or a timing run failed."""


def check_client(client_dir: Path = CLIENT_DIR) -> str:
    """The node executable; fails with what to install when Node or the client's node_modules are missing."""
    node = shutil.which("node")
    if node is None:
        raise WebBenchmarkError("node is not on PATH: install Node.js 20 or newer")
    for package in ("onnxruntime-node", "onnxruntime-web"):
        if not (client_dir / "node_modules" / package).is_dir():
            raise WebBenchmarkError(f"{client_dir / 'node_modules' / package} is missing: run `npm ci` in {client_dir}")
    return node


def models_to_time(root: Path, with_full_size: bool = True) -> list[dict]:
    """The bundle's model (the student's chosen int8 graph) and, if asked and searched by rule benchmark, the
    full-size DistilBERT int8-optimized graph."""
    bundle = root / "bundle"
    for needed in (bundle / "qa_config.json", bundle / "metrics.json", root / EXPORTED_MODELS["student"] / "config.json"):
        if not needed.is_file():
            raise WebBenchmarkError(f"{needed}: missing (run the pipeline's bundle rule first)")
    qa_config = read_json(bundle / "qa_config.json")
    student_config = read_json(root / EXPORTED_MODELS["student"] / "config.json")
    models = [{"model": "student", "precision": "int8-optimized", "recipe": read_json(bundle / "metrics.json")["onnx_variant"],
               "path": bundle / qa_config["onnx"]["model"], "max_positions": student_config["max_position_embeddings"],
               "vocab_size": student_config["vocab_size"]}]
    distilbert = root / "full_size" / "distilbert"
    search = (read_json(root / "benchmark" / "benchmark.json").get("int8_search")
              if (root / "benchmark" / "benchmark.json").is_file() else None)
    if with_full_size and search:
        config = read_json(distilbert / "pytorch" / "config.json")
        models.append({"model": "distilbert", "precision": "int8-optimized", "recipe": search["choice"]["recipe"],
                       "path": distilbert / "onnx" / search["choice"]["recipe"] / "model.onnx",
                       "max_positions": config["max_position_embeddings"], "vocab_size": config["vocab_size"]})
    return models


def time_in_node(node: str, model: dict, backend: str, cfg: BenchmarkConfig, client_dir: Path = CLIENT_DIR) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "latency.json"
        command = [node, str(client_dir / "scripts" / "bench.mjs"), "--model", str(model["path"]), "--backend", backend,
                   "--lengths", ",".join(str(length) for length in cfg.sequence_lengths),
                   "--vocab-size", str(model["vocab_size"]), "--max-positions", str(model["max_positions"]),
                   "--runs", str(cfg.runs), "--warmup", str(cfg.warmup), "--threads", str(THREADS), "--out", str(out)]
        completed = subprocess.run(command, capture_output=True, text=True)
        if completed.returncode != 0 or not out.is_file():
            raise WebBenchmarkError(f"timing {model['path']} on {backend} failed (exit code {completed.returncode}): "
                                    f"{completed.stderr.strip()[-500:]}")
        return json.loads(out.read_text())


def run(root: Path, out: Path, cfg: BenchmarkConfig | None = None, client_dir: Path = CLIENT_DIR) -> dict:
    """Time every model on both JavaScript runtimes and write the entries to `out` (JSON)."""
    cfg = cfg or BenchmarkConfig()
    node = check_client(client_dir)
    versions = {}
    artifacts = []
    for model in models_to_time(root, cfg.javascript_full_size):
        for backend, fmt in BACKENDS.items():
            logger.info("timing %s on %s", model["path"], fmt)
            result = time_in_node(node, model, backend, cfg, client_dir)
            versions[fmt] = result["runtime"]
            artifacts.append({
                "name": f"{model['model']}/{fmt}-{model['precision']}", "model": model["model"], "format": fmt,
                "precision": model["precision"], "path": str(model["path"]),
                "size_mb": megabytes(directory_size_bytes(model["path"])),
                "recipe": model["recipe"], "runtime": result["runtime"], "timed": True, "untimed_reason": None,
                "max_positions": model["max_positions"], "vocab_size": model["vocab_size"],
                "latency_ms": result["latency_ms"], "peak_rss_mb": result["peak_rss_mb"],
            })
    cpu = cpu_description()
    metrics = {
        "machine": {"cpu": cpu["model_name"], "cpu_flags": cpu["simd_flags"], "node": result["node"], "runtimes": versions},
        "settings": {"sequence_lengths": cfg.sequence_lengths, "threads": [THREADS], "runs": cfg.runs,
                     "warmup": cfg.warmup, "batch_size": 1},
        "artifacts": artifacts,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, metrics)
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline benchmark-web", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="the pipeline's output root (artifacts/)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--config-json", help="the run's config as JSON: its benchmark section sets lengths and runs")
    args = parser.parse_args(argv)
    setup_logging()
    cfg = config_from_json(args.config_json).benchmark if args.config_json else BenchmarkConfig()
    try:
        run(args.root, args.out, cfg)
    except WebBenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
