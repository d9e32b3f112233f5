"""Accuracy-aware CoreML compression: the int8 search's fallback (pipeline/export/int8_tuning.py) for the CoreML
packages' int8 and 4-bit weights, on the PyTorch-side proxy.

A compressed variant whose proxy loses more than export.quantize.fallback.target_f1_drop on the tuning questions
(never the gated ones) keeps its most sensitive layers in float: each compressible layer's sensitivity is the
divergence of the start/end distributions from the uncompressed model with only that layer compressed; then the
most sensitive layers are left uncompressed one at a time until the tuning drop's paired interval lies within the
target or the layer budget is spent; the step kept follows the int8 search's rule (int8_tuning.STOPPING_RULE). The
steps run the proxy in float32 (many quick comparisons on a CPU without fast float16); the gate then scores the
weights read back out of the chosen package, at float16, on the gated questions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.data import qa_windows
from pipeline.export.coreml import FLOAT_VARIANTS, compress, compressible_layers, load_wrapped, proxy_logits
from pipeline.export.int8_tuning import (STOPPING_RULE, distribution_divergence, kept_step, tuning_records,
                                         within_target)
from pipeline.export.neural_engine import converted_module
from pipeline.measurement.statistics import paired_bootstrap_interval, per_question_f1
from pipeline.plan.config import PipelineConfig
from pipeline.runtime import squad

logger = logging.getLogger(__name__)


@dataclass
class ProxyTuning:
    """Tuning questions windowed for the PyTorch proxy, with the uncompressed model's logits and per-question F1."""

    records: object  # datasets.Dataset
    features: object  # their windows (qa_windows.validation_windows)
    gold: dict[str, list[str]]
    reference: tuple[np.ndarray, np.ndarray]
    reference_f1: np.ndarray
    source: str

    @property
    def mask(self) -> np.ndarray:
        return np.asarray(squad.whole_column(self.features.with_format("numpy"), "attention_mask")).astype(bool)

    def f1(self, logits: tuple[np.ndarray, np.ndarray], cfg: PipelineConfig) -> np.ndarray:
        """Per-question F1 of the answers these logits give."""
        return per_question_f1(answers(logits, self.records, self.features, cfg), self.gold)


def proxy_tuning(data_dir: Path, model_dir: Path, mask_input: bool, cfg: PipelineConfig) -> tuple[ProxyTuning | None, str]:
    """The tuning questions (int8_tuning.tuning_records) with the uncompressed float32 proxy's logits and F1."""
    from transformers import AutoTokenizer

    records, where = tuning_records(data_dir, cfg)
    features = qa_windows.validation_windows(records, AutoTokenizer.from_pretrained(model_dir), cfg.squad)
    reference = proxy_logits(load_wrapped(model_dir, mask_input), features, cfg, half=False)
    gold = squad.gold_answers(records)
    reference_f1 = per_question_f1(answers(reference, records, features, cfg), gold)
    return ProxyTuning(records, features, gold, reference, reference_f1, where), where


def answers(logits: tuple[np.ndarray, np.ndarray], records, features, cfg: PipelineConfig) -> dict[str, str]:
    return squad.postprocess_predictions(records, features, *logits, n_best_size=cfg.squad.n_best_size,
                                         max_answer_length=cfg.squad.max_answer_length)


def tuning_drop(model: torch.nn.Module, tuning: ProxyTuning, cfg: PipelineConfig) -> dict:
    """The compressed proxy against the uncompressed one on the tuning questions: the F1 drop with its paired
    interval and the label-free divergence over every tuning window (int8_tuning's measures)."""
    logits = proxy_logits(model, tuning.features, cfg, half=False)
    drops = tuning.reference_f1 - tuning.f1(logits, cfg)
    return {"f1_drop": round(float(drops.mean()), 3), "f1_drop_interval": list(paired_bootstrap_interval(drops)),
            "divergence": round(distribution_divergence(tuning.reference, logits, tuning.mask), 6)}


def compress_with_fallback(model_dir: Path, mask_input: bool, variant: str, cfg: PipelineConfig,
                           tuning: ProxyTuning | None) -> tuple[torch.nn.Module, dict | None]:
    """The variant's compressed proxy, with the fallback's layers kept in float where its tuning drop is over the
    target; returns it and the fallback's record (None: no tuning questions, or an uncompressed variant)."""
    ccfg, fcfg = cfg.export.coreml, cfg.export.quantize.fallback
    compressed = converted_module(load_wrapped(model_dir, mask_input), variant, ccfg)
    if tuning is None or variant in FLOAT_VARIANTS or not ccfg.fallback:
        return compressed, None
    before = tuning_drop(compressed, tuning, cfg)
    if within_target(before, fcfg.target_f1_drop):
        return compressed, {"before": before, "fell_back": [], "tuned": "shown within the target"}
    layers = compressible_layers(load_wrapped(model_dir, mask_input), variant, ccfg)
    # Sensitivity on the first sensitivity_windows windows: one compression and one proxy run per layer.
    count = min(fcfg.sensitivity_windows, len(tuning.features))
    windows = tuning.features.select(range(count))
    reference = tuple(logits[:count] for logits in tuning.reference)
    mask = tuning.mask[:count]
    sensitivity = {}
    for layer in layers:
        only = compress(load_wrapped(model_dir, mask_input), variant, ccfg, only=layer)
        sensitivity[layer] = round(distribution_divergence(reference, proxy_logits(only, windows, cfg, half=False),
                                                           mask), 6)
    sensitivity = dict(sorted(sensitivity.items(), key=lambda item: -item[1]))
    steps, measures = [], [before]
    for count, layer in enumerate(list(sensitivity)[:fcfg.max_layers], start=1):
        kept = tuple(list(sensitivity)[:count])
        measured = tuning_drop(compress(load_wrapped(model_dir, mask_input), variant, ccfg, keep_float=kept), tuning,
                               cfg)
        steps.append({"layer": layer, "sensitivity": sensitivity[layer], **measured})
        measures.append(measured)
        logger.info("CoreML %s fallback: %s kept in float -> tuning F1 drop %s %s", variant, layer,
                    measured["f1_drop"], measured["f1_drop_interval"])
        if within_target(measured, fcfg.target_f1_drop):
            break
    chosen_step = kept_step(measures, fcfg.target_f1_drop)  # the int8 search's stopping rule
    kept = tuple(list(sensitivity)[:chosen_step])
    chosen = compress(load_wrapped(model_dir, mask_input), variant, ccfg, keep_float=kept) if kept else compressed
    return chosen, {"target_f1_drop": fcfg.target_f1_drop, "max_layers": fcfg.max_layers, "tuned_on": tuning.source,
                    "stopping_rule": STOPPING_RULE, "before": before, "sensitivity": sensitivity, "steps": steps,
                    "fell_back": list(kept), "after": measures[chosen_step],
                    "reached_target": within_target(measures[chosen_step], fcfg.target_f1_drop)}
