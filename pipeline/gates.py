"""Accuracy gates: what an exported model must reach before it counts (config section export.gates).

Every variant is gated and its verdict recorded (value, 95 % interval, threshold, passed). A variant that misses
a gate is rejected: left out of the bundle and of the full-size int8 search. The run stops (GateError, with the
numbers) only when the bundle has no passing variant of a format it ships, or with export.gates.strict.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from dataclasses import dataclass
from pathlib import Path

from pipeline import squad
from pipeline.errors import PipelineError
from pipeline.statistics import paired_bootstrap_interval, per_question_f1, wilson_interval

logger = logging.getLogger(__name__)


class GateError(PipelineError, RuntimeError):
    """An export missed one of its gates; the message names the artifact, the measure and both numbers."""


@dataclass
class GateQuestions:
    """The dev questions exports are scored on, with the PyTorch model's answers and scores on the same ones."""

    records: Any  # datasets.Dataset of the dev questions kept
    examples: list[dict[str, str]]
    gold: dict[str, list[str]]
    pytorch_predictions: dict[str, str]
    pytorch_exact_match: float
    pytorch_f1: float


def gate_questions(data_dir: Path, model_dir: Path, limit: int | None) -> GateQuestions:
    """The first `limit` dev questions (all if None) and the PyTorch model's predictions.json restricted to them."""
    import json

    from pipeline.data import load_squad

    records, _ = load_squad(str(data_dir / "dev.jsonl"))
    if limit and limit < len(records):
        records = records.select(range(limit))  # a datasets.Dataset: slicing would give columns
    gold = squad.gold_answers(records)
    predictions_path = model_dir / "predictions.json"
    all_predictions = json.loads(predictions_path.read_text())
    missing = [question_id for question_id in gold if question_id not in all_predictions]
    if missing:
        raise GateError(f"{predictions_path}: no prediction for {len(missing)} dev question(s), e.g. {missing[0]!r}")
    pytorch_predictions = {question_id: all_predictions[question_id] for question_id in gold}
    scores = squad.squad_v1_scores(gold, pytorch_predictions)
    return GateQuestions(records, squad.questions(records), gold, pytorch_predictions,
                         round(scores["exact_match"], 3), round(scores["f1"], 3))


# How each gate is judged. A measurement on N dev questions has its own noise, and a verdict that falls inside it
# would change between CPUs and builds without anything real changing; so a gate is missed only when the value's
# 95 % interval lies wholly on the wrong side of its threshold, and a verdict inside the interval is marked
# within_noise. The thresholds themselves are set in configs/default.yaml against the spread measured there.


def agreement_gate(predictions: Mapping[str, str], pytorch_predictions: Mapping[str, str],
                   minimum: float | None) -> dict:
    """Answer agreement with PyTorch and its binomial (Wilson) interval; missed when the whole interval is below
    `minimum`. None: recorded, not a gate (passed is None)."""
    same = sum(predictions.get(question_id) == answer for question_id, answer in pytorch_predictions.items())
    low, high = wilson_interval(same, len(pytorch_predictions))
    value = round(same / len(pytorch_predictions), 4)
    verdict = {"value": value, "interval": [low, high], "minimum": minimum,
               "judged_by": f"Wilson 95 % interval of {same}/{len(pytorch_predictions)} equal answers"}
    if minimum is None:
        return {**verdict, "passed": None, "within_noise": None}
    return {**verdict, "passed": high >= minimum, "within_noise": low < minimum <= high}


def f1_drop_gate(predictions: Mapping[str, str], pytorch_predictions: Mapping[str, str],
                 gold_answers: Mapping[str, list[str]], maximum: float) -> dict:
    """PyTorch's dev F1 minus the variant's, with the paired bootstrap interval over questions; missed when the
    whole interval is above `maximum` (the variant lost more F1 than allowed beyond the measurement's noise)."""
    pytorch_f1 = per_question_f1(pytorch_predictions, gold_answers)
    variant_f1 = per_question_f1(predictions, gold_answers)
    drops = pytorch_f1 - variant_f1
    low, high = paired_bootstrap_interval(drops)
    return {"value": round(float(drops.mean()), 3), "interval": [low, high], "maximum": maximum,
            "passed": low <= maximum, "within_noise": low <= maximum < high,
            "judged_by": f"paired bootstrap 95 % interval over {len(drops)} questions"}


def compressed_model_report(
    name: str,
    predictions: Mapping[str, str],
    pytorch_predictions: Mapping[str, str],
    gold_answers: Mapping[str, list[str]],
    pytorch_f1: float,
    min_answer_agreement: float | None,
    max_f1_drop: float,
) -> dict:
    """Scores of a compressed model against its fp32 original, with each gate's verdict (not raised here)."""
    scores = squad.squad_v1_scores(gold_answers, predictions)
    gates = {"answer_agreement": agreement_gate(predictions, pytorch_predictions, min_answer_agreement),
             "f1_drop": f1_drop_gate(predictions, pytorch_predictions, gold_answers, max_f1_drop)}
    return {
        "name": name,
        "exact_match": round(scores["exact_match"], 3),
        "f1": round(scores["f1"], 3),
        "f1_drop": round(pytorch_f1 - scores["f1"], 3),
        "answer_agreement": gates["answer_agreement"]["value"],
        "gates": gates,
        "passed": all(gate["passed"] is not False for gate in gates.values()),
    }


def logit_parity_report(name: str, max_abs_diff: float, limit: float, n_windows: int) -> dict:
    """fp32 graphs against PyTorch: the same arithmetic up to rounding, so the largest difference is the measure."""
    passed = max_abs_diff <= limit
    return {
        "name": name,
        "max_abs_logit_diff": max_abs_diff,
        "limit": limit,
        "n_windows": n_windows,
        "gates": {"max_abs_logit_diff": {"value": max_abs_diff, "maximum": limit, "passed": passed,
                                         "within_noise": False, "judged_by": f"largest over {n_windows} dev windows"}},
        "passed": passed,
    }


def failure_lines(reports: list[dict]) -> list[str]:
    """One line per missed gate: the artifact, the measure, its interval and the threshold."""
    lines = []
    for report in reports:
        for gate, result in report["gates"].items():
            if result["passed"] is not False:
                continue
            bound = f">= {result['minimum']}" if "minimum" in result else f"<= {result['maximum']}"
            interval = f" (95 % interval {result['interval'][0]} to {result['interval'][1]})" if "interval" in result else ""
            lines.append(f"  {report['name']}: {gate} {result['value']:.4g}{interval}, needs {bound}")
    return lines


def raise_for_failures(reports: list[dict], where: str) -> None:
    """Raise one GateError listing every report that did not pass, with its numbers."""
    failed = [report for report in reports if not report["passed"]]
    if not failed:
        return
    raise GateError("\n".join([f"{where}: {len(failed)} export(s) missed their gates (see export.gates in the config):",
                               *failure_lines(failed)]))


def enforce_if_strict(reports: list[dict], where: str, strict: bool) -> None:
    """With export.gates.strict every missed gate stops the rule; otherwise the verdicts are recorded and the
    missed variants are left out downstream (the bundle stops only when nothing it needs passed)."""
    failed = [report for report in reports if not report["passed"]]
    if strict:
        raise_for_failures(reports, where)
    elif failed:
        logger.warning("%s: rejected by the gates, left out of the bundle and the int8 search:\n%s", where,
                       "\n".join(failure_lines(failed)))
