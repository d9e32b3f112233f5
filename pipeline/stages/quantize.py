"""Stage quantize_onnx: int8 (and 4-bit) ONNX graphs of one model, each scored on dev and gated.

Variants (onnxruntime.quantization):
  int8          the naive baseline: quantize_dynamic of the plain fp32 export with the target's settings. int8
                MatMul weights and an 8-bit word-embedding table (onnxruntime stores Gather tables in its
                activation type, uint8 with a zero point), activations quantized at run time.
  int8-<graph>-<format>-<scales>-<attention>
                the int8 search grid (export.quantize.search_*): graph plain / fused (onnxruntime's BERT fusions,
                QAttention) / noattn (LayerNorm, GELU and embedding fusions only); format qoperator (dynamic) or
                qdq (static, activation scales calibrated on training windows); per-tensor or per-channel weight
                scales; attention's activation x activation MatMuls in fp32 (attfp32) or int8 (att8).
  int4          4-bit weight-only blocks (MatMulNBits; optionally GatherBlockQuantized for the embeddings).
reduce_range comes from export.quantize.target (this machine's CPU by default; arm64 for phones), as does the
naive baseline's per-channel setting. Recipes that lose more than export.quantize.fallback's target on the tuning
questions (never the gated ones) have their most sensitive layers fall back to fp32 (pipeline/export/int8_tuning.py:
the whole search, in named steps). Each variant is answered with the torch-free answerer on the gated dev questions
and judged (export.gates; pipeline/export/gates.py): proven, unproven or rejected; a rejected variant is not bundled, an
unproven one only without export.gates.strict (the bundle rule stops when nothing ships).

The bundle takes, among the int8 variants that ship, the proven ones where there are any, of those the ones not
significantly less accurate than the most accurate one (paired bootstrap of their F1 difference), and of these the
fastest, timed here on the building
machine (batch 1, max_seq_length tokens, 1 thread; quantize.json keeps the runner-up and every timing): which one
wins depends on the CPU. The recipes, their builder, the timer (pipeline.measurement.latency) and the ranking by latency are
the ones of the full-size search that the speed goals are about (rule int8_search, on the full-size DistilBERT,
over the recipes that passed on every exported model).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.export.gates import gate_questions
from pipeline.export.int8_tuning import search
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.outputs.manifests import atomic_output_dir, verify_input_dirs
from pipeline.plan.config import PipelineConfig

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, onnx_dir: Path, model_dir: Path, data_dir: Path, out_dir: Path, threads: int = 1) -> dict:
    verify_input_dirs(onnx_dir, model_dir, data_dir)
    questions = gate_questions(data_dir, model_dir, cfg)
    with atomic_output_dir(out_dir, cfg) as tmp:
        metrics = search(onnx_dir, data_dir, tmp, cfg, questions, threads)
        atomic_write_json(tmp / "quantize.json", metrics)
    logger.info("quantize_onnx %s: %s", onnx_dir, json.dumps(metrics))
    return metrics


# `python -m pipeline quantize-onnx`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "onnx_dir": "output of export_onnx",
    "model_dir": "the PyTorch model (its dev predictions and F1)",
    "threads": "onnxruntime threads for dev scoring",
}
