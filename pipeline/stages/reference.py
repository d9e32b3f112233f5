"""Stage export_reference: full-size architectures through the same export path as the trained models.

The offline default trains small models, but the paper's claims are about DistilBERT-base (66M parameters,
207 MB on an iPhone 7 Plus, 60 % faster than BERT-base on CPU). Sizes and latency do not depend on weight
values, so this stage builds the full-size architectures, with random weights unless export.reference names
real ones, and exports them exactly as the trained models are exported:
  distilbert (6 x 768): ONNX fp32, fused, every int8 recipe of the search (quantize.int8_recipes; static ones
                        calibrated on random token windows), 4-bit, and CoreML fp16, int8 and 4-bit (every weight
                        palettized); size goals int8 ONNX <= max_int8_onnx_mb, CoreML 4-bit <= max_coreml_4bit_mb.
  bert-base (12 x 768): ONNX fp32, fused, naive int8: the speed baseline of the benchmark (which builds its int8
                        graph with the recipe the DistilBERT search chose).
Fusions and logit parity (on random token windows) are checked as in export_onnx.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path

import numpy as np

from pipeline import mobile, qa
from pipeline.artifacts import atomic_output_dir, atomic_write_json, directory_size_bytes, megabytes, setup_logging
from pipeline.config import PipelineConfig, config_from_json
from pipeline.gates import logit_parity_report, raise_for_failures
from pipeline.stages import export_coreml, export_onnx, quantize

logger = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
PARITY_WINDOWS, PARITY_LENGTH = 4, 128


ARCHITECTURES = ("distilbert", "bert-base")


def save_full_size(architecture: str, out_dir: Path, pretrained: str | None, seed: int) -> int:
    """The full-size QA model as a save_pretrained folder; returns its parameter count."""
    import torch
    from transformers import (BertConfig, BertForQuestionAnswering, DistilBertConfig,
                              DistilBertForQuestionAnswering)

    model_class, config_class = {"distilbert": (DistilBertForQuestionAnswering, DistilBertConfig),
                                 "bert-base": (BertForQuestionAnswering, BertConfig)}[architecture]
    if pretrained:
        model = model_class.from_pretrained(pretrained)
    else:
        torch.manual_seed(seed)
        model = model_class(config_class())  # the defaults are the base sizes: 768 wide, 30522 tokens, 512 positions
    model.save_pretrained(out_dir, safe_serialization=True)
    return model.num_parameters()


def random_windows(vocab_size: int, seed: int, count: int = PARITY_WINDOWS) -> mobile.Windows:
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(5, vocab_size, size=(count, PARITY_LENGTH)).astype(np.int64)
    attention_mask = np.ones_like(input_ids)
    attention_mask[1::2, PARITY_LENGTH // 2:] = 0  # half the windows padded, as real batches are
    return mobile.Windows([str(i) for i in range(count)], input_ids, attention_mask,  # one segment
                          np.zeros_like(input_ids), [[None] * PARITY_LENGTH] * count)


def torch_logits(model_dir: Path, windows: mobile.Windows) -> tuple[np.ndarray, np.ndarray]:
    import torch
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(model_dir).eval()
    with torch.no_grad():
        inputs = {"input_ids": torch.from_numpy(windows.input_ids),
                  "attention_mask": torch.from_numpy(windows.attention_mask)}
        output = model(**qa.model_inputs(inputs | {"token_type_ids": torch.from_numpy(windows.token_type_ids)}, model))
    return output.start_logits.numpy(), output.end_logits.numpy()


def run(cfg: PipelineConfig, architecture: str, out_dir: Path) -> dict:
    rcfg = cfg.export.reference
    settings = quantize.quantization_settings(cfg.export.quantize)
    pretrained = rcfg.distilbert_pretrained if architecture == "distilbert" else rcfg.bert_base_pretrained
    with_device_formats = architecture == "distilbert"  # the 207 MB comparison is about DistilBERT
    with atomic_output_dir(out_dir, cfg) as tmp:
        pytorch_dir = tmp / "pytorch"
        n_parameters = save_full_size(architecture, pytorch_dir, pretrained, cfg.seed)
        model_config = json.loads((pytorch_dir / "config.json").read_text())
        n_layers = model_config.get("n_layers", model_config.get("num_hidden_layers"))
        onnx_dir = tmp / "onnx"
        export_onnx.export_fp32(pytorch_dir, onnx_dir / "fp32", cfg.export.opset)
        fused_ops = export_onnx.optimize_graph(onnx_dir / "fp32", onnx_dir / "optimized")
        export_onnx.check_fusions(fused_ops, n_layers, f"{out_dir}/onnx/optimized")

        windows = random_windows(model_config["vocab_size"], cfg.seed)
        torch_start, torch_end = torch_logits(pytorch_dir, windows)
        parity = [
            logit_parity_report(variant, export_onnx.max_logit_difference(onnx_dir / variant / MODEL_FILE, windows,
                                                                          torch_start, torch_end, PARITY_WINDOWS),
                                cfg.export.gates.max_abs_logit_diff, PARITY_WINDOWS)
            for variant in ("fp32", "optimized")
        ]
        raise_for_failures(parity, str(out_dir))

        qcfg = cfg.export.quantize
        int4_block_size = qcfg.int4_block_size if with_device_formats else None
        recipes = quantize.int8_recipes(qcfg, settings)
        if not with_device_formats:  # bert-base: the benchmark quantizes it with the recipe the search chose
            recipes = {quantize.NAIVE: recipes[quantize.NAIVE]}
        # Random weights make calibrated scales meaningless beyond their graph shape: a few windows do (static
        # calibration runs the full-size fp32 graph once per window).
        calibration = random_windows(model_config["vocab_size"], cfg.seed + 1)
        quantized = quantize.build_variants(onnx_dir, onnx_dir, settings, recipes, calibration, PARITY_WINDOWS,
                                            int4_block_size, int4_embeddings=True, graphs_dir=onnx_dir)

        packages = export_coreml_packages(pytorch_dir, tmp / "coreml", cfg, out_dir) if with_device_formats else {}
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
            "paper_on_device_mb": 207,
        }
        if with_device_formats:
            int8_mb = min(size for variant, size in onnx_sizes.items() if variant in recipes)
            coreml_4bit_mb = packages["4bit"]["size_mb"] if "4bit" in packages else None
            metrics["goals"] = {
                "int8_onnx_mb": {"value": int8_mb, "maximum": rcfg.max_int8_onnx_mb,
                                 "met": int8_mb <= rcfg.max_int8_onnx_mb},
                "coreml_4bit_mb": {"value": coreml_4bit_mb, "maximum": rcfg.max_coreml_4bit_mb,
                                   "met": coreml_4bit_mb is not None and coreml_4bit_mb <= rcfg.max_coreml_4bit_mb},
            }
        atomic_write_json(tmp / "reference.json", metrics)
    logger.info("export_reference %s: %s", architecture, json.dumps(metrics))
    return metrics


def export_coreml_packages(pytorch_dir: Path, coreml_dir: Path, cfg: PipelineConfig, out_dir: Path) -> dict:
    # The size goal counts every weight, so the reference palettizes the embedding tables too.
    coreml_cfg = dataclasses.replace(cfg.export.coreml, palettize_embeddings=True,
                                     sequence_lengths=cfg.export.reference.coreml_sequence_lengths)
    coreml_dir.mkdir()
    packages = {}
    for variant in coreml_cfg.variants:
        wrapped = export_coreml.load_wrapped(pytorch_dir, coreml_cfg.minimum_deployment_target == "iOS18")
        path = coreml_dir / f"{variant}.mlpackage"
        export_coreml.convert(export_coreml.compress(wrapped, variant, coreml_cfg), coreml_cfg, path)
        info = export_coreml.read_package(path)
        export_coreml.check_package(info, variant, coreml_cfg,
                                    export_coreml.weight_matrix_count(wrapped.model, variant, coreml_cfg),
                                    f"{out_dir}/coreml/{path.name}")
        packages[variant] = {"path": f"coreml/{path.name}", "size_mb": megabytes(directory_size_bytes(path)), **info}
    return packages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline export-reference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--architecture", required=True, choices=ARCHITECTURES)
    parser.add_argument("--out-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    setup_logging()
    run(config_from_json(args.config_json), args.architecture, args.out_dir)
    return 0
