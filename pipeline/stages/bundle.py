"""Stage bundle: the folder an app ships, built from the distilled student's exports (or the deployed model's).

artifacts/bundle/
  model.int8.onnx           quantize.json's bundle_choice, when an int8 graph passed its gates (also as shipped,
                            here): of those as accurate as the best, the fastest; the app's model
  model.int8.ort            the same graph in ORT format for ONNX Runtime Mobile (+ its required-operators list)
  model.fp32.onnx           the fp32 graph, always (gated against PyTorch's logits by export_onnx); the app's model,
                            with model.fp32.ort, when no int8 graph passed: metrics.json's int8_note says why
  coreml/*.mlpackage        every CoreML variant (fp16, int8, 4-bit) that passed its gates
  tokenizer.json, vocab.txt the WordPiece tokenizer (vocab.txt for ports without a tokenizers library)
  qa_config.json            windowing and n-best settings, input/output names and types, file names
  README.md                 the contract for app developers, with a worked example from this build
  metrics.json              dev scores of the shipped models through the torch-free answerer
  openvino/                 the x86 target when it passed its gates, here too: NNCF's int8 as an OpenVINO model
  android-npu/              static int8 graphs with fixed shapes, one per length, for Android's NPU (QNN, NNAPI), when
                            they passed their gates, here too (export_npu: also the NPU's emulated arithmetic)
  huggingface/              the app's ONNX graph in the Hugging Face layout that transformers.js and optimum load
  manifest.json             sha256 and bytes of every file, library versions, the hash of the config that built it
The rule answers the gated dev questions with every shipped ONNX, .ort (and OpenVINO) file through
pipeline/runtime/answering.py (no torch) and holds them to the gates against the PyTorch model
(pipeline/export/app_bundle.py); it stops ("nothing to bundle") only when the fp32 graph missed its parity gate.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.export.app_bundle import write_bundle
from pipeline.export.gates import gate_questions
from pipeline.outputs.manifests import atomic_output_dir, verify_input_dirs
from pipeline.plan.config import PipelineConfig

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, onnx_dir: Path, quantized_dir: Path, coreml_dir: Path, model_dir: Path, data_dir: Path,
        out_dir: Path, npu_dir: Path | None = None) -> dict:
    verify_input_dirs(onnx_dir, quantized_dir, coreml_dir, model_dir, data_dir, npu_dir)
    questions = gate_questions(data_dir, model_dir, cfg)
    with atomic_output_dir(out_dir, cfg) as tmp:
        metrics = write_bundle(tmp, out_dir, cfg, onnx_dir, quantized_dir, coreml_dir, model_dir, data_dir, questions,
                               npu_dir)
    logger.info("bundle: %s", json.dumps(metrics))
    return metrics


# `python -m pipeline bundle`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "onnx_dir": "output of export_onnx (the bundled model): the fp32 graph, always shipped",
    "quantized_dir": "output of quantize_onnx (the bundled model)",
    "coreml_dir": "output of export_coreml (the bundled model)",
    "npu_dir": "output of export_npu (the bundled model); empty: none were built",
    "model_dir": "the PyTorch model (dev predictions and F1)",
}
