"""Stage export_full_size: full-size architectures through the same export path as the trained models.

The offline default trains small models, but the paper's claims are about DistilBERT-base (66M parameters,
207 MB on an iPhone 7 Plus, 60 % faster than BERT-base on CPU). Sizes and latency do not depend on weight
values, so this stage builds the full-size architectures, with random weights unless export.full_size names
real ones, and exports them exactly as the trained models are exported:
  distilbert (6 x 768): ONNX fp32, fused, every int8 recipe of the search (int8.int8_recipes; static ones
                        calibrated on random token windows), 4-bit, CoreML fp16, int8 and 4-bit (every weight
                        palettized) and the Neural Engine layout, and the Android NPU graph (static int8, fixed
                        shape: one length, pipeline/export/npu_graph.py); size goals int8 ONNX <= max_int8_onnx_mb, CoreML 4-bit <= max_coreml_4bit_mb.
  bert-base (12 x 768): ONNX fp32, fused, naive int8: the speed baseline of the benchmark (rule
                        export_full_size_int8 builds its int8 graph with the recipe the DistilBERT search chose).
Fusions and logit parity (on random token windows) are checked as in export_onnx.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from pipeline.export import int8
from pipeline.export.full_size import (PARITY_WINDOWS, Architecture, build_int8_recipes, export_coreml_packages,
                                       export_npu_graph, random_windows, save_full_size, torch_logits)
from pipeline.export.npu_graph import NPU_FOLDER
from pipeline.export.gates import enforce_if_strict, logit_parity_report
from pipeline.export.onnx_graph import MODEL_FILE, check_fusions, export_fp32, max_logit_difference, optimize_graph
from pipeline.outputs.artifacts import atomic_write_json, directory_size_bytes, megabytes
from pipeline.outputs.manifests import atomic_output_dir
from pipeline.plan.config import PipelineConfig

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, architecture: Architecture, out_dir: Path) -> dict:
    full_size_cfg = cfg.export.full_size
    settings = int8.quantization_settings(cfg.export.quantize)
    pretrained = (full_size_cfg.distilbert_pretrained if architecture == "distilbert"
                  else full_size_cfg.bert_base_pretrained)
    with_device_formats = architecture == "distilbert"  # the 207 MB comparison is about DistilBERT
    with atomic_output_dir(out_dir, cfg) as tmp:
        pytorch_dir = tmp / "pytorch"
        n_parameters = save_full_size(architecture, pytorch_dir, pretrained, cfg.seed)
        model_config = json.loads((pytorch_dir / "config.json").read_text())
        n_layers = model_config.get("n_layers", model_config.get("num_hidden_layers"))
        onnx_dir = tmp / "onnx"
        export_fp32(pytorch_dir, onnx_dir / "fp32", cfg.export.opset)
        fused_ops = optimize_graph(onnx_dir / "fp32", onnx_dir / "optimized")
        check_fusions(fused_ops, model_config["model_type"], n_layers, f"{out_dir}/onnx/optimized")

        windows = random_windows(model_config["vocab_size"], cfg.seed)
        torch_start, torch_end = torch_logits(pytorch_dir, windows)
        parity = [
            logit_parity_report(variant, max_logit_difference(onnx_dir / variant / MODEL_FILE, windows, torch_start,
                                                              torch_end, PARITY_WINDOWS),
                                cfg.export.gates.max_abs_logit_diff, PARITY_WINDOWS)
            for variant in ("fp32", "optimized")
        ]
        enforce_if_strict(parity, str(out_dir), cfg.export.gates.strict)

        qcfg = cfg.export.quantize
        int4_block_size = qcfg.int4_block_size if with_device_formats else None
        recipes = int8.int8_recipes(qcfg, settings)
        if not with_device_formats:  # bert-base: rule export_full_size_int8 builds the recipe the search chose
            recipes = {int8.NAIVE: recipes[int8.NAIVE]}
        quantized = build_int8_recipes(onnx_dir, onnx_dir, recipes, cfg, model_config["vocab_size"],
                                       graphs_dir=onnx_dir, int4_block_size=int4_block_size)

        packages = export_coreml_packages(pytorch_dir, tmp / "coreml", cfg, out_dir) if with_device_formats else {}
        npu = (export_npu_graph(pytorch_dir, tmp / NPU_FOLDER, cfg, model_config["vocab_size"])
               if with_device_formats and cfg.export.npu.enabled else None)
        onnx_sizes = {variant: megabytes(directory_size_bytes(onnx_dir / variant / MODEL_FILE))
                      for variant in ["fp32", "optimized", *quantized]}
        metrics = {
            "architecture": architecture,
            "shape": {key: model_config[key] for key in ("n_layers", "num_hidden_layers", "dim", "hidden_size",
                                                         "vocab_size") if key in model_config},
            "weights": pretrained or "random (sizes and latency do not depend on the values)",
            "n_parameters": n_parameters,
            "pytorch_fp32_mb": megabytes(directory_size_bytes(pytorch_dir / "model.safetensors")),
            "onnx_size_mb": onnx_sizes,
            "fused_ops": fused_ops,
            "parity": {report["name"]: report["max_abs_logit_diff"] for report in parity},
            "quantization": settings,
            "int8_recipes": {name: dataclasses.asdict(recipe) for name, recipe in recipes.items()},
            "coreml": packages,
            "npu": npu,  # the Android NPU graph (static int8, fixed shape); null where not built
            "paper_on_device_mb": 207,
        }
        if with_device_formats:
            int8_mb = min(size for variant, size in onnx_sizes.items() if variant in recipes)
            coreml_4bit_mb = packages["4bit"]["size_mb"] if "4bit" in packages else None
            max_int8_mb, max_4bit_mb = full_size_cfg.max_int8_onnx_mb, full_size_cfg.max_coreml_4bit_mb
            metrics["goals"] = {
                "int8_onnx_mb": {"value": int8_mb, "maximum": max_int8_mb, "met": int8_mb <= max_int8_mb},
                "coreml_4bit_mb": {"value": coreml_4bit_mb, "maximum": max_4bit_mb,
                                   "met": coreml_4bit_mb is not None and coreml_4bit_mb <= max_4bit_mb},
            }
        atomic_write_json(tmp / "full_size.json", metrics)
    logger.info("export_full_size %s: %s", architecture, json.dumps(metrics))
    return metrics

