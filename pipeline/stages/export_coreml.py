"""Stage export_coreml: a trained QA model -> CoreML mlprogram packages (fp16, int8 weights, 4-bit palettized, and
for DistilBERT the Neural Engine layout: ane, pipeline/export/neural_engine.py).

The model is traced from PyTorch and converted with coremltools. Weights are compressed on the PyTorch side with
coremltools.optimize.torch (post-training linear quantization, k-means palettization). Each package is then read
back as a spec and checked: input and output names, shapes and types, deployment target, and how its weights are
stored. CoreML prediction runs only on macOS, so each package's dev gate runs its own weights: read back out of
the package (palettized and quantized ones decompressed), loaded into the PyTorch model it was converted from and
run in float16, as the package computes (dev.executed; f1_source "pytorch-proxy"). A package whose weights cannot
all be read back is rejected. dev.read_back.weights_sha256 is the digest of the weights gated, which
coreml.verify_gated_weights checks against a package before it ships.

Inputs: iOS18 (default) takes input_ids and attention_mask, both with the enumerated lengths of
export.coreml.sequence_lengths. Before iOS18 only one input may have enumerated shapes, so the iOS16/17 package
takes input_ids alone and derives the mask inside (input_ids != [PAD]). BERT teachers derive their token types
inside too (tokens after the first [SEP] are segment 1), so every package has the same interface.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from pipeline.data import qa_windows
from pipeline.export.coreml import (FLOAT_VARIANTS, MASKED_SCORE, check_lengths, check_package, convert,
                                    load_wrapped, package_dev_report, read_package, variants_for, weight_matrix_count)
from pipeline.export.neural_engine import gated_architecture
from pipeline.export.coreml_tuning import compress_with_fallback, proxy_tuning
from pipeline.export.gates import gate_questions
from pipeline.outputs.artifacts import atomic_write_json, directory_size_bytes, megabytes
from pipeline.outputs.manifests import atomic_output_dir, verify_input_dirs
from pipeline.plan.config import PipelineConfig

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, model_dir: Path, data_dir: Path | None, out_dir: Path) -> dict:
    """Convert every configured variant; with data_dir, score each package's weights on dev and record its gate
    verdicts (a rejected package is left out of the bundle)."""
    verify_input_dirs(model_dir, data_dir)
    from transformers import AutoTokenizer

    ccfg = cfg.export.coreml
    mask_input = ccfg.minimum_deployment_target == "iOS18"
    model_config = load_wrapped(model_dir, mask_input).model.config
    check_lengths(ccfg, model_config.max_position_embeddings, str(model_dir))
    variants, not_built = variants_for(model_config.model_type, ccfg.variants)
    questions = features = None
    if data_dir is not None:
        questions = gate_questions(data_dir, model_dir, cfg)
        # once for all
        features = qa_windows.validation_windows(questions.records, AutoTokenizer.from_pretrained(model_dir),
                                                 cfg.squad)

    compressed_variants = set(variants) - set(FLOAT_VARIANTS)
    tuning, tuned_on = (proxy_tuning(data_dir, model_dir, mask_input, cfg)
                        if data_dir is not None and ccfg.fallback and compressed_variants else (None, None))
    packages = {}
    with atomic_output_dir(out_dir, cfg) as tmp:
        for variant in variants:
            compressed, fallback = compress_with_fallback(model_dir, mask_input, variant, cfg, tuning)
            kept_float = len((fallback or {}).get("fell_back", []))
            path = tmp / f"{variant}.mlpackage"
            convert(compressed, ccfg, path)
            info = read_package(path)
            check_package(info, variant, ccfg, weight_matrix_count(load_wrapped(model_dir, mask_input).model, variant,
                                                                   ccfg, kept_float), f"{out_dir}/{path.name}")
            packages[variant] = {"path": path.name, "size_mb": megabytes(directory_size_bytes(path)), **info,
                                 **({"fallback": fallback} if fallback is not None else {})}
            if questions is not None:
                packages[variant]["dev"] = package_dev_report(
                    path, gated_architecture(load_wrapped(model_dir, mask_input), variant), questions, features, cfg,
                    f"{out_dir}/{path.name}")
        metrics = {
            "model_dir": str(model_dir),
            "minimum_deployment_target": ccfg.minimum_deployment_target,
            "sequence_lengths": sorted(ccfg.sequence_lengths),
            "masked_score": MASKED_SCORE,
            # the dev questions each package is gated on
            "n_questions": None if questions is None else len(questions.gold),
            # the questions the packages' fallback tuned on, or why there were none
            **({"tuned_on": tuned_on} if tuning is not None else {"not_tuned": tuned_on}),
            "packages": packages,
            "not_built": not_built,  # variants configured but not for this model type, with why
            "rejected": sorted(variant for variant, package in packages.items()
                               if package.get("dev", {}).get("passed") is False),
        }
        atomic_write_json(tmp / "coreml.json", metrics)
    logger.info("export_coreml %s: %s", model_dir, json.dumps(metrics))
    return metrics

