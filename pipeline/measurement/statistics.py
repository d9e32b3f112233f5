"""The intervals every verdict of the pipeline is judged with: per-question F1, bootstrap resamples of questions,
the binomial (Wilson) interval of an agreement rate, and Student's t interval over seeds.

A figure measured on N dev questions has its own noise; a gate or a comparison that ignores it decides by chance
when two values are close. These are the few formulas the gates (pipeline/export/gates.py), the bundle's choice
(pipeline/export/int8.py) and the study (stages/study.py) share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

Z_95 = 1.959964  # two-sided 95 % normal quantile
BOOTSTRAP_SAMPLES = 2000


def per_question_f1(predictions: Mapping[str, str], gold: Mapping[str, list[str]]) -> np.ndarray:
    """F1 (×100) of each gold question, in the gold order; a missing prediction scores 0 (as squad_v1_scores)."""
    from pipeline.runtime import squad

    return np.array([max(squad.f1_score(predictions[question_id], answer) for answer in answers)
                     if question_id in predictions else 0.0
                     for question_id, answers in gold.items()], dtype=float) * 100


def bootstrap_means(scores: np.ndarray, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> np.ndarray:
    """Means of `samples` resamples (with replacement) of the per-question scores."""
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, len(scores), size=(samples, len(scores)))
    return scores[indices].mean(axis=1)


def bootstrap_standard_error(scores: np.ndarray, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> float:
    """Standard deviation of the mean score over resamples of the questions."""
    return round(float(np.std(bootstrap_means(scores, samples, seed))), 3)


def paired_bootstrap_interval(differences: np.ndarray, confidence: float = 0.95, samples: int = BOOTSTRAP_SAMPLES,
                              seed: int = 0) -> tuple[float, float]:
    """Percentile interval of the mean of per-question differences (the same questions resampled for both models,
    so what they share cancels: a paired comparison)."""
    means = bootstrap_means(np.asarray(differences, dtype=float), samples, seed)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return round(float(low), 3), round(float(high), 3)


def wilson_interval(successes: int, total: int, z: float = Z_95) -> tuple[float, float]:
    """The binomial 95 % (Wilson score) interval of a rate: it stays inside [0, 1] and is honest near 1, where
    compressed models' agreement with their original sits."""
    if total <= 0:
        raise ValueError("a rate needs at least one trial")
    rate = successes / total
    denominator = 1 + z * z / total
    centre = (rate + z * z / (2 * total)) / denominator
    half = z * math.sqrt(rate * (1 - rate) / total + z * z / (4 * total * total)) / denominator
    return round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)


def t_interval(values: list[float], confidence: float) -> dict:
    """Mean, sample standard deviation and Student's t interval of the mean (N-1 degrees of freedom)."""
    from scipy import stats

    array = np.asarray(values, dtype=float)
    n = len(array)
    mean = float(array.mean())
    std = float(array.std(ddof=1)) if n > 1 else 0.0
    half_width = float(stats.t.ppf((1 + confidence) / 2, n - 1) * std / math.sqrt(n)) if n > 1 else math.inf
    return {"n": n, "mean": round(mean, 3), "std": round(std, 3), "low": round(mean - half_width, 3),
            "high": round(mean + half_width, 3)}
