"""The accuracy gates (pipeline/export/gates.py): three verdicts, judged on the measurement and its own noise."""

import numpy as np
import pytest

from pipeline.export import gates
from pipeline.measurement.statistics import wilson_interval


def answers(n: int, wrong: int, prefix: str = "q") -> tuple[dict, dict]:
    """PyTorch's answers (all right), and a variant's with the first `wrong` of them wrong."""
    pytorch = {f"{prefix}{i}": "right" for i in range(n)}
    return pytorch, {**pytorch, **{f"{prefix}{i}": "wrong" for i in range(wrong)}}


def test_agreement_is_rejected_past_its_minimum_proven_beyond_its_noise_and_unproven_in_between():
    pytorch, near = answers(1000, 42)  # 95.8 % agreement, Wilson interval [0.944, 0.969]
    assert gates.agreement_gate(near, pytorch, 0.96)["verdict"] == "rejected"  # the estimate is under the minimum
    unproven = gates.agreement_gate(near, pytorch, 0.95)
    assert unproven["verdict"] == "unproven" and unproven["passed"] and unproven["interval"][0] < 0.95
    # The Wilson interval of 95.8 % clears 0.95 from about 2,800 questions on (the normal approximation says 2,400)
    needed = unproven["questions_to_decide"]
    assert 2000 < needed < 3500
    assert wilson_interval(round(0.958 * needed), needed)[0] >= 0.95 > wilson_interval(round(0.958 * (needed - 50)),
                                                                                        needed - 50)[0]
    proven = gates.agreement_gate(near, pytorch, 0.94)
    assert proven["verdict"] == "proven" and proven["passed"] and proven["questions_to_decide"] is None
    recorded = gates.agreement_gate(near, pytorch, None)
    assert recorded["passed"] is None and recorded["verdict"] == "recorded"


def test_an_f1_drop_over_the_maximum_never_ships_whatever_its_interval():
    pytorch, worse = answers(40, 2)  # 5 points lost on 40 questions: the interval reaches far below 1
    gold = {question: ["right"] for question in pytorch}
    drop = gates.f1_drop_gate(worse, pytorch, gold, 1.0)
    assert drop["value"] == pytest.approx(5.0) and drop["interval"][0] < 1.0
    assert drop["verdict"] == "rejected" and drop["passed"] is False
    report = gates.compressed_model_report("x", worse, pytorch, gold, 100.0, None, 1.0)
    assert report["verdict"] == "rejected" and report["passed"] is False


def test_an_unproven_drop_ships_unless_strict_and_says_how_many_questions_would_decide_it():
    pytorch, worse = answers(400, 2)  # 0.5 points lost, interval [0, 1.25]: straddles 1
    gold = {question: ["right"] for question in pytorch}
    drop = gates.f1_drop_gate(worse, pytorch, gold, 1.0)
    assert drop["verdict"] == "unproven" and drop["interval"][0] <= 0.5 <= 1.0 < drop["interval"][1]
    spread = np.std([100.0, 100.0] + [0.0] * 398, ddof=1)
    assert drop["questions_to_decide"] == int(np.ceil((1.959964 * spread / 0.5) ** 2)) > 400
    shipped = gates.compressed_model_report("x", worse, pytorch, gold, 100.0, None, 1.0)
    strict = gates.compressed_model_report("x", worse, pytorch, gold, 100.0, None, 1.0, strict=True)
    assert shipped["verdict"] == strict["verdict"] == "unproven"
    assert shipped["passed"] is True and strict["passed"] is False
    # The strict miss says why: the threshold is not shown, not passed by
    assert "unproven: <= 1.0 not shown" in gates.failure_lines([strict])[0]
    assert gates.failure_lines([shipped]) == []
    assert gates.f1_drop_gate(worse, pytorch, gold, 2.0)["verdict"] == "proven"


def test_the_f1_drop_interval_pairs_each_questions_two_answers():
    """PyTorch's own answers vary question by question (right on half, wrong on the other half); the variant
    differs from it on 1 question in 500. Paired, the drop's interval is narrow and proves a 1-point maximum;
    resampling the two models' questions independently would give an interval of about ±4 points."""
    pytorch = {f"q{i}": ("right" if i % 2 else "wrong") for i in range(1000)}
    gold = {question: ["right"] for question in pytorch}
    variant = {**pytorch, "q1": "wrong", "q3": "wrong"}  # two right answers lost: 0.2 points
    drop = gates.f1_drop_gate(variant, pytorch, gold, 1.0)
    assert drop["value"] == pytest.approx(0.2)
    assert drop["interval"][1] - drop["interval"][0] < 1.0 and drop["verdict"] == "proven"


def test_a_report_takes_its_worst_gates_verdict():
    pytorch, near = answers(1000, 3)
    gold = {question: ["right"] for question in pytorch}
    both = gates.compressed_model_report("x", near, pytorch, gold, 100.0, 0.99, 1.0)
    assert both["gates"]["answer_agreement"]["verdict"] == "proven"
    assert both["gates"]["f1_drop"]["verdict"] == "proven" and both["verdict"] == "proven"
    tight = gates.compressed_model_report("x", near, pytorch, gold, 100.0, 0.996, 1.0)
    assert tight["gates"]["answer_agreement"]["verdict"] == "unproven" and tight["verdict"] == "unproven"
    assert gates.compressed_model_report("x", near, pytorch, gold, 100.0, 0.998, 1.0)["verdict"] == "rejected"


def test_all_answers_equal_on_few_questions_is_unproven_with_the_questions_its_interval_needs():
    pytorch, same = answers(120, 0)
    agreement = gates.agreement_gate(same, pytorch, 0.99)
    assert agreement["verdict"] == "unproven" and agreement["interval"][0] < 0.99
    # n / (n + 1.96²) >= 0.99 from n = 380 on (not the 1 question a normal approximation of p = 1 would say)
    assert agreement["questions_to_decide"] in (379, 380)


def test_ships_proven_always_unproven_unless_strict_rejected_never():
    assert gates.ships("proven", strict=True) and gates.ships("proven", strict=False)
    assert gates.ships("unproven", strict=False) and not gates.ships("unproven", strict=True)
    assert not gates.ships("rejected", strict=False)


def test_a_missing_result_is_never_a_pass():
    # no verdict (never scored, or a build that failed) never ships, strict or not
    assert not gates.ships(None, strict=False) and not gates.ships(None, strict=True)
    assert not gates.ships(gates.RECORDED, strict=False)
    assert gates.overall_verdict({}) is None
    assert gates.overall_verdict({"agreement": {"verdict": gates.RECORDED, "passed": None}}) is None
    failed = gates.failed_report("int8-x", "build failed: ValueError: no calibration windows")
    assert failed["verdict"] == gates.REJECTED and failed["passed"] is False
    assert gates.failure_lines([failed]) == ["  int8-x: build failed: ValueError: no calibration windows"]
    with pytest.raises(gates.GateError, match="int8-x: build failed"):
        gates.raise_for_failures([failed], "quantized")


def test_the_bundle_choice_counts_no_variant_without_a_verdict_as_proven():
    from pipeline.export.int8 import choose_bundle_variant

    latency = {"p50": 1.0, "p90": 1.1}
    variants = {"int8": {"passed": True, "verdict": "unproven", "f1": 50.0, "latency_ms": latency, "size_mb": 1.0},
                "int8-b": {"passed": True, "f1": 50.0, "latency_ms": {"p50": 0.5, "p90": 0.6}, "size_mb": 1.0},
                "int8-c": {**gates.failed_report("int8-c", "scoring failed: x"), "size_mb": 1.0}}
    f1 = {"int8": np.array([50.0, 50.0]), "int8-b": np.array([50.0, 50.0])}
    choice, _, why = choose_bundle_variant(variants, f1, 0.05)
    assert "none of 2 shipping variants proven" in why and choice in ("int8", "int8-b")
    del variants["int8-b"]
    assert choose_bundle_variant(variants, f1, 0.05)[0] == "int8"
    variants["int8"]["passed"] = False
    assert choose_bundle_variant(variants, f1, 0.05) == (None, None, "no int8 variant passed its gates")
