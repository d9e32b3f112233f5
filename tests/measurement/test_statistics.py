"""The intervals verdicts are judged with (pipeline/measurement/statistics.py)."""

import math

import numpy as np
import pytest

from pipeline.measurement import statistics


def test_the_t_interval_is_students_t_over_seeds():
    result = statistics.t_interval([80.0, 82.0, 84.0], 0.95)
    assert result["mean"] == 82.0 and result["std"] == 2.0
    half_width = 4.302653 * 2.0 / math.sqrt(3)  # t(0.975, 2 degrees of freedom)
    assert result["low"] == pytest.approx(82.0 - half_width, abs=1e-3)
    assert result["high"] == pytest.approx(82.0 + half_width, abs=1e-3)


def test_the_bootstrap_standard_error_matches_the_analytic_one():
    scores = np.random.default_rng(0).choice([0.0, 100.0], size=2000, p=[0.1, 0.9])
    analytic = scores.std() / math.sqrt(len(scores))
    assert statistics.bootstrap_standard_error(scores, 2000) == pytest.approx(analytic, rel=0.1)


def test_the_wilson_interval_matches_the_textbook_values():
    # 958 of 1,000: the CE-only 4-bit agreement that a fixed 0.96 threshold rejected by 0.2 points.
    low, high = statistics.wilson_interval(958, 1000)
    assert (low, high) == pytest.approx((0.9436, 0.9690), abs=2e-4)
    assert statistics.wilson_interval(1000, 1000)[1] == 1.0 and statistics.wilson_interval(0, 10)[0] == 0.0


def test_a_paired_interval_cancels_what_both_models_share():
    rng = np.random.default_rng(1)
    shared = rng.choice([0.0, 100.0], size=1000)   # questions both answer right or wrong: no difference
    differences = np.zeros(1000)
    differences[:30] = -100.0                      # 30 questions the second model loses
    low, high = statistics.paired_bootstrap_interval(differences)
    assert low < -3.0 < high < 0.0                 # the 3-point loss is shown, though each model alone spreads
    assert statistics.bootstrap_standard_error(shared) > 1.0 > (high - low) / 4


def test_per_question_f1_scores_a_missing_answer_zero():
    gold = {"a": ["black cat"], "b": ["dog"]}
    assert statistics.per_question_f1({"a": "cat"}, gold).tolist() == pytest.approx([100 * 2 / 3, 0.0])
