"""Accuracy gates: what an exported model must reach before it counts (config section export.gates).

A missed gate raises GateError with the numbers, so the Snakemake rule that built the model fails and says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from dataclasses import dataclass
from pathlib import Path

from pipeline import squad
from pipeline.errors import PipelineError


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


def answer_agreement(predictions: Mapping[str, str], pytorch_predictions: Mapping[str, str]) -> float:
    """Fraction of the questions PyTorch answered that `predictions` answer with exactly the same text."""
    if not pytorch_predictions:
        raise ValueError("no PyTorch answers to compare with")
    same = sum(predictions.get(question_id) == answer for question_id, answer in pytorch_predictions.items())
    return same / len(pytorch_predictions)


def compressed_model_report(
    name: str,
    predictions: Mapping[str, str],
    pytorch_predictions: Mapping[str, str],
    gold_answers: Mapping[str, list[str]],
    pytorch_f1: float,
    min_answer_agreement: float,
    max_f1_drop: float,
) -> dict:
    """Scores of a compressed model against its fp32 original, with pass/fail of both gates (not raised here)."""
    scores = squad.squad_v1_scores(gold_answers, predictions)
    agreement = answer_agreement(predictions, pytorch_predictions)
    f1_drop = pytorch_f1 - scores["f1"]
    return {
        "name": name,
        "exact_match": round(scores["exact_match"], 3),
        "f1": round(scores["f1"], 3),
        "f1_drop": round(f1_drop, 3),
        "answer_agreement": round(agreement, 4),
        "gates": {
            "answer_agreement": {"value": round(agreement, 4), "minimum": min_answer_agreement,
                                 "passed": agreement >= min_answer_agreement},
            "f1_drop": {"value": round(f1_drop, 3), "maximum": max_f1_drop, "passed": f1_drop <= max_f1_drop},
        },
        "passed": agreement >= min_answer_agreement and f1_drop <= max_f1_drop,
    }


def logit_parity_report(name: str, max_abs_diff: float, limit: float, n_windows: int) -> dict:
    return {
        "name": name,
        "max_abs_logit_diff": max_abs_diff,
        "limit": limit,
        "n_windows": n_windows,
        "passed": max_abs_diff <= limit,
    }


def raise_for_failures(reports: list[dict], where: str) -> None:
    """Raise one GateError listing every report that did not pass, with its numbers."""
    failed = [report for report in reports if not report["passed"]]
    if not failed:
        return
    lines = [f"{where}: {len(failed)} export(s) missed their gates (see export.gates in the config):"]
    for report in failed:
        if "max_abs_logit_diff" in report:
            lines.append(f"  {report['name']}: max |logit diff| {report['max_abs_logit_diff']:.3g} > {report['limit']:.3g}"
                         f" over {report['n_windows']} dev windows")
            continue
        for gate, result in report["gates"].items():
            if not result["passed"]:
                bound = f">= {result['minimum']}" if "minimum" in result else f"<= {result['maximum']}"
                lines.append(f"  {report['name']}: {gate} {result['value']} (needs {bound})")
    raise GateError("\n".join(lines))
