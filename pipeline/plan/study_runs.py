"""The study's runs (target `study`): each variant of the SQuAD step as objective settings of the one config. Plain
config logic, without torch: the Snakefile plans the study's jobs with it."""

from __future__ import annotations

import copy

BASELINE = "ce_only"


def run_names(variants: list[str]) -> list[str]:
    """The training runs behind the variants: one each (TinyBERT's two steps are phases of one run)."""
    return list(variants)


def run_config(full: dict, run: str, seed: int) -> dict:
    """The whole config (as a plain dict) of one study run: distill_squad's objectives set for the run, the seed
    replaced; every other setting (weights, temperature, budget, augmentation) is the configured one."""
    config = copy.deepcopy(full)
    config["seed"] = seed
    squad_step = config["distill_squad"]
    if run == "pkd_skip" or run == "pkd_last":
        squad_step["objectives"] = ["distilbert", "pkd"]  # PKD = (1-alpha) CE + alpha KD + beta PT
        squad_step["pkd"]["scheme"] = "skip" if run == "pkd_skip" else "last"
    elif run == "distilbert":
        squad_step["objectives"] = ["distilbert"]
    elif run == "tinybert":
        # Intermediate layers for tinybert.intermediate_share of the epochs, then the prediction layer.
        squad_step["objectives"] = ["tinybert"]
    elif run != BASELINE:
        raise ValueError(f"unknown study run {run!r}")
    return config
