"""Accuracy gates: what an exported model must reach before it ships (config section export.gates).

Every variant is gated and its verdicts recorded (value, 95 % interval, threshold, verdict, passed): proven,
unproven (shipped and marked, with the dev questions that would decide it) or rejected (left out of the bundle
and of the full-size int8 search). `passed` says whether it ships: export.gates.strict ships proven variants only.
The run stops (GateError, with the numbers) only when the bundle has nothing of a format it ships, or, with
strict, at an fp32 graph that misses its parity gate.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.export.dev_split import DevSplit, dev_source, split_for
from pipeline.measurement.statistics import Z_95, paired_bootstrap_interval, per_question_f1, wilson_interval
from pipeline.runtime import squad

logger = logging.getLogger(__name__)


class GateError(PipelineError, RuntimeError):
    """An export missed one of its gates; the message names the artifact, the measure and both numbers."""


@dataclass
class GateQuestions:
    """The dev questions exports are scored on, with the PyTorch model's answers and scores on the same ones."""

    records: Any  # datasets.Dataset of the dev questions kept (None in the x86 target's spawned process)
    examples: list[dict[str, str]]
    gold: dict[str, list[str]]
    pytorch_predictions: dict[str, str]
    pytorch_exact_match: float
    pytorch_f1: float
    split: DevSplit | None = None


def dev_records_and_split(data_dir: Path, cfg):
    """prepare_data's dev questions (datasets) and their split into gated and tuning questions (dev_split)."""
    from pipeline.data.squad_loading import load_squad

    records, _ = load_squad(str(data_dir / "dev.jsonl"))
    return records, split_for(squad.whole_column(records, "context"), cfg, dev_source(cfg))


def gate_questions(data_dir: Path, model_dir: Path, cfg) -> GateQuestions:
    """The gated dev questions (pipeline/export/dev_split.py) and the PyTorch model's predictions.json on them."""
    import json

    records, split = dev_records_and_split(data_dir, cfg)
    records = records.select(split.gated_rows)  # a datasets.Dataset: slicing would give columns
    gold = squad.gold_answers(records)
    predictions_path = model_dir / "predictions.json"
    all_predictions = json.loads(predictions_path.read_text())
    missing = [question_id for question_id in gold if question_id not in all_predictions]
    if missing:
        raise GateError(f"{predictions_path}: no prediction for {len(missing)} dev question(s), e.g. {missing[0]!r}")
    pytorch_predictions = {question_id: all_predictions[question_id] for question_id in gold}
    scores = squad.squad_v1_scores(gold, pytorch_predictions)
    return GateQuestions(records, squad.questions(records), gold, pytorch_predictions,
                         round(scores["exact_match"], 3), round(scores["f1"], 3), split)


# How each gate is judged. A measurement on N dev questions has its own noise, so a verdict says how far the data
# supports it (three verdicts, not two):
#   rejected  the point estimate is past the threshold: never shipped, whatever its interval;
#   proven    the whole 95 % interval is on the right side of the threshold: shipped;
#   unproven  the point estimate is within the threshold but the interval straddles it: shipped and marked so
#             (with the number of dev questions that would decide it), unless export.gates.strict ships proven
#             variants only.
# The thresholds themselves are set in configs/default.yaml against the spread measured there.
PROVEN, UNPROVEN, REJECTED, RECORDED = "proven", "unproven", "rejected", "recorded"
VERDICT_ORDER = (PROVEN, UNPROVEN, REJECTED)  # a report's verdict is its worst gate's


def judge(value: float, interval: tuple[float, float], threshold: float, higher_is_better: bool) -> str:
    """proven, unproven or rejected: the point estimate decides rejection, the interval decides proof."""
    low, high = interval
    if (value < threshold) if higher_is_better else (value > threshold):
        return REJECTED
    if (low >= threshold) if higher_is_better else (high <= threshold):
        return PROVEN
    return UNPROVEN


def questions_to_decide(value: float, threshold: float, spread: float) -> int | None:
    """Dev questions whose 95 % interval would clear `threshold`, if the per-question spread (standard deviation)
    and the point estimate stayed as measured: the half width Z·spread/√n must shrink to the margin. None when the
    estimate sits on the threshold (no number of questions decides it)."""
    margin = abs(threshold - value)
    if margin == 0:
        return None
    return max(1, math.ceil((Z_95 * spread / margin) ** 2))


def questions_for_agreement(rate: float, minimum: float, most: int = 10_000_000) -> int | None:
    """Dev questions whose Wilson 95 % interval would lie above `minimum` at this agreement rate: the interval's
    own formula, not the normal approximation, which says 1 question at a rate of 1.0. None beyond `most`."""
    def clears(n: int) -> bool:
        return wilson_interval(round(rate * n), n)[0] >= minimum

    if rate <= minimum:
        return None
    high = 1
    while not clears(high):
        high *= 2
        if high > most:
            return None
    low = high // 2
    while high - low > 1:  # clears(high), not clears(low)
        middle = (low + high) // 2
        low, high = (low, middle) if clears(middle) else (middle, high)
    return high


def ships(verdict: str | None, strict: bool) -> bool:
    """Whether a variant with this verdict goes into the bundle: proven always, unproven unless strict; no
    verdict (never scored, or its build failed) never."""
    return verdict == PROVEN or (verdict == UNPROVEN and not strict)


def failed_report(name: str, reason: str) -> dict:
    """A variant whose build or scoring failed: rejected with the reason, never shipped."""
    gate = {"value": None, "verdict": REJECTED, "passed": False, "judged_by": reason}
    return {"name": name, "error": reason, "gates": {"built_and_scored": gate}, "verdict": REJECTED,
            "passed": False, "exact_match": None, "f1": None, "f1_drop": None, "answer_agreement": None}


def agreement_gate(predictions: Mapping[str, str], pytorch_predictions: Mapping[str, str],
                   minimum: float | None) -> dict:
    """Answer agreement with PyTorch and its binomial (Wilson) interval, judged against `minimum` (see judge).
    None: recorded, not a gate (passed is None)."""
    same = sum(predictions.get(question_id) == answer for question_id, answer in pytorch_predictions.items())
    total = len(pytorch_predictions)
    low, high = wilson_interval(same, total)
    value = round(same / total, 4)
    result = {"value": value, "interval": [low, high], "minimum": minimum,
              "judged_by": f"Wilson 95 % interval of {same}/{total} equal answers"}
    if minimum is None:
        return {**result, "verdict": RECORDED, "passed": None, "questions_to_decide": None}
    verdict = judge(value, (low, high), minimum, higher_is_better=True)
    needed = questions_for_agreement(same / total, minimum) if verdict == UNPROVEN else None
    return {**result, "verdict": verdict, "passed": verdict != REJECTED, "questions_to_decide": needed}


def f1_drop_gate(predictions: Mapping[str, str], pytorch_predictions: Mapping[str, str],
                 gold_answers: Mapping[str, list[str]], maximum: float) -> dict:
    """PyTorch's dev F1 minus the variant's, with the paired bootstrap interval over questions (both models'
    scores of one question resampled together, so what they share cancels), judged against `maximum`."""
    pytorch_f1 = per_question_f1(pytorch_predictions, gold_answers)
    variant_f1 = per_question_f1(predictions, gold_answers)
    drops = pytorch_f1 - variant_f1
    low, high = paired_bootstrap_interval(drops)
    value = float(drops.mean())
    verdict = judge(value, (low, high), maximum, higher_is_better=False)
    spread = float(drops.std(ddof=1)) if len(drops) > 1 else 0.0
    return {"value": round(value, 3), "interval": [low, high], "maximum": maximum, "verdict": verdict,
            "passed": verdict != REJECTED,
            "questions_to_decide": questions_to_decide(value, maximum, spread) if verdict == UNPROVEN else None,
            "judged_by": f"paired bootstrap 95 % interval over {len(drops)} questions"}


def overall_verdict(gates: Mapping[str, dict]) -> str | None:
    """The worst verdict of the gates that are on (recorded measures do not vote); None when no gate is on: no
    verdict, which never ships."""
    verdicts = [gate["verdict"] for gate in gates.values() if gate.get("verdict") in VERDICT_ORDER]
    return max(verdicts, key=VERDICT_ORDER.index, default=None)


def compressed_model_report(
    name: str,
    predictions: Mapping[str, str],
    pytorch_predictions: Mapping[str, str],
    gold_answers: Mapping[str, list[str]],
    pytorch_f1: float,
    min_answer_agreement: float | None,
    max_f1_drop: float,
    strict: bool = False,
) -> dict:
    """Scores of a compressed model against its fp32 original, each gate's verdict, the variant's verdict (its
    worst gate's) and whether it ships: `passed` (not raised here)."""
    scores = squad.squad_v1_scores(gold_answers, predictions)
    gates = {"answer_agreement": agreement_gate(predictions, pytorch_predictions, min_answer_agreement),
             "f1_drop": f1_drop_gate(predictions, pytorch_predictions, gold_answers, max_f1_drop)}
    verdict = overall_verdict(gates)
    return {
        "name": name,
        "exact_match": round(scores["exact_match"], 3),
        "f1": round(scores["f1"], 3),
        "f1_drop": round(pytorch_f1 - scores["f1"], 3),
        "answer_agreement": gates["answer_agreement"]["value"],
        "gates": gates,
        "verdict": verdict,
        "passed": ships(verdict, strict),
    }


def logit_parity_report(name: str, max_abs_diff: float, limit: float, n_windows: int) -> dict:
    """fp32 graphs against PyTorch: the same arithmetic up to rounding, so the largest difference is the measure."""
    passed = max_abs_diff <= limit
    verdict = PROVEN if passed else REJECTED  # no sampling noise to prove anything against: rounding only
    return {
        "name": name,
        "max_abs_logit_diff": max_abs_diff,
        "limit": limit,
        "n_windows": n_windows,
        "gates": {"max_abs_logit_diff": {"value": max_abs_diff, "maximum": limit, "verdict": verdict,
                                         "passed": passed, "judged_by": f"largest over {n_windows} dev windows"}},
        "verdict": verdict,
        "passed": passed,
    }


def failure_lines(reports: list[dict]) -> list[str]:
    """One line per gate that kept a variant out: the artifact, the measure, its interval and the threshold (a
    rejected gate, or an unproven one where export.gates.strict ships proven variants only)."""
    lines = []
    for report in reports:
        if report.get("error"):
            lines.append(f"  {report['name']}: {report['error']}")
            continue
        for gate, result in report["gates"].items():
            unproven_kept_out = result.get("verdict") == UNPROVEN and report.get("passed") is False
            if result["passed"] is not False and not unproven_kept_out:
                continue
            bound = f">= {result['minimum']}" if "minimum" in result else f"<= {result['maximum']}"
            interval = f" (95 % interval {result['interval'][0]} to {result['interval'][1]})" if "interval" in result else ""
            why = (f"unproven: {bound} not shown (export.gates.strict ships proven variants only)"
                   if unproven_kept_out else f"needs {bound}")
            lines.append(f"  {report['name']}: {gate} {result['value']:.4g}{interval}, {why}")
    return lines


def raise_for_failures(reports: list[dict], where: str) -> None:
    """Raise one GateError listing every report that did not pass, with its numbers."""
    failed = [report for report in reports if not report["passed"]]
    if not failed:
        return
    raise GateError("\n".join([f"{where}: {len(failed)} export(s) missed their gates (see export.gates in the config):",
                               *failure_lines(failed)]))


def enforce_if_strict(reports: list[dict], where: str, strict: bool) -> None:
    """With export.gates.strict a missed fp32 parity gate stops the rule; otherwise the verdicts are recorded and
    the missed graphs are left out downstream (the bundle stops only when nothing it needs passed)."""
    failed = [report for report in reports if not report["passed"]]
    if strict:
        raise_for_failures(reports, where)
    elif failed:
        logger.warning("%s: rejected by the gates, left out of the bundle and the int8 search:\n%s", where,
                       "\n".join(failure_lines(failed)))
