"""Stage export_gemm_floor: the GEMM floor graph of the full-size DistilBERT (pipeline.export.gemm_floor).

An ONNX graph of just the MatMulInteger nodes of export_full_size's naive int8 graph (same weights and shapes),
fed batch-1 activations of the longest benchmarked length: model.onnx and gemm_floor.json (the length and
the node count). The benchmark times it like the model; model latency / floor says how close the model runs to
this machine's int8 matrix-multiply speed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.export.gemm_floor import gemm_floor_graph
from pipeline.export.int8 import NAIVE
from pipeline.export.onnx_graph import MODEL_FILE
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.outputs.manifests import atomic_output_dir
from pipeline.plan.config import PipelineConfig

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, full_size_dir: Path, sequence_length: int, out_dir: Path) -> dict:
    source = full_size_dir / "onnx" / NAIVE / MODEL_FILE
    with atomic_output_dir(out_dir, cfg) as tmp:
        n_matmuls = gemm_floor_graph(source, sequence_length, tmp / MODEL_FILE)
        metrics = {"source": str(source), "path": MODEL_FILE, "sequence_length": sequence_length,
                   "n_matmul_integer": n_matmuls}
        atomic_write_json(tmp / "gemm_floor.json", metrics)
    logger.info("GEMM floor of %s: %d MatMulInteger nodes at %d tokens", source, n_matmuls, sequence_length)
    return metrics


# `python -m pipeline export-gemm-floor`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "full_size_dir": "export_full_size's distilbert folder",
    "sequence_length": "tokens of the activations it is fed",
}
