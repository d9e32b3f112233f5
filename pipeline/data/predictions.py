"""Scoring a predictions file against a SQuAD file: `python -m pipeline evaluate-predictions`, the official v1.1
EM/F1 (pipeline/runtime/squad.py) of the official predictions layout. It loads SQuAD with `datasets`, so it lives
here and not in the torch-free runtime."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.data.squad_loading import DataError, load_squad
from pipeline.runtime.squad import gold_answers, squad_v1_scores


def gold_answers_from_squad_json(path: str | Path) -> dict[str, list[str]]:
    """Question id → gold answer texts from a SQuAD v1.1/v2.0 file; v2 unanswerable questions are left out."""
    dataset, _ = load_squad(str(path), on_bad_example="error")
    return gold_answers(dataset)


def read_predictions_json(path: str | Path) -> dict[str, str]:
    """The official predictions layout: one JSON object mapping question id → answer text."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        predictions = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise DataError(f"{path}: invalid JSON at line {error.lineno} column {error.colno}: {error.msg}") from None
    if not isinstance(predictions, dict):
        raise DataError(
            f"{path}: expected a JSON object mapping question id to answer text, got {type(predictions).__name__}"
        )
    for question_id, answer in predictions.items():
        if not isinstance(answer, str):
            raise DataError(f"{path}: question {question_id!r}: expected the answer text as a string, got {answer!r}")
    return predictions


# ------------------------------------------------------------------------------------------------------- CLI


def evaluate_predictions_main(argv: list[str] | None = None) -> int:
    """`python -m pipeline evaluate-predictions DATASET.json PREDICTIONS.json`: print one JSON object of scores."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline evaluate-predictions",
        description="Official SQuAD v1.1 EM/F1 of a predictions file (v2 unanswerable questions are left out).",
    )
    parser.add_argument("dataset", help="SQuAD v1.1 or v2.0 JSON file with the gold answers")
    parser.add_argument("predictions", help="JSON object mapping question id to predicted answer text")
    args = parser.parse_args(argv)
    try:
        gold_answers = gold_answers_from_squad_json(args.dataset)
        predictions = read_predictions_json(args.predictions)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    scores = squad_v1_scores(gold_answers, predictions)
    if scores["n_missing_predictions"]:
        print(
            f"warning: {scores['n_missing_predictions']} of {scores['total']} questions have no prediction and "
            f"score 0 (first ids: {', '.join(scores['missing_prediction_ids'])})",
            file=sys.stderr,
        )
    summary = {key: scores[key] for key in ("exact_match", "f1", "total", "n_missing_predictions")}
    print(json.dumps(summary))
    return 0
