"""SQuAD loading for the extractive (v1.1) task, with errors that name the file, the example and the field.

Three kinds of source give the same `datasets.Dataset` (the hub "squad" columns: id, title, context, question,
answers = {"text": [...], "answer_start": [...]}):

  * a local `.json` file in the official SQuAD v1.1 or v2.0 layout;
  * a local `.jsonl` file, one record per line in the column layout above;
  * a datasets hub name (anything that is neither an existing path nor looks like one).

Every record goes through the same validation. Unanswerable v2 questions are not bad data, they are simply not
part of the v1.1 task: they are excluded and counted. Bad examples either stop the load (`on_bad_example="error"`)
or are dropped and counted (`"skip"`); a file that is missing, not JSON, or not in SQuAD layout always stops it,
because skipping cannot repair a broken file. This module only reads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import PipelineError
from pipeline.plan.data_sources import looks_like_a_path

# datasets is imported where data is loaded, not at import: it adds about a second to every process that imports
# this module only for its errors or its checks.
if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)

SQUAD_COLUMNS = ("id", "title", "context", "question", "answers")
ON_BAD_EXAMPLE_CHOICES = ("error", "skip")
MAX_SKIPPED_REASONS_KEPT = 5  # enough to see the pattern without flooding the report


def squad_features() -> datasets.Features:
    """The hub "squad" dataset's schema, so local files and hub data give identical datasets."""
    import datasets

    return datasets.Features(
        {
            "id": datasets.Value("string"),
            "title": datasets.Value("string"),
            "context": datasets.Value("string"),
            "question": datasets.Value("string"),
            "answers": {
                "text": datasets.List(datasets.Value("string")),
                "answer_start": datasets.List(datasets.Value("int32")),
            },
        }
    )


class DataError(PipelineError, ValueError):
    """Data that cannot be used; the one-line message names the file, the example id and the field."""


class HubDatasetError(DataError):
    """A hub dataset that could not be loaded: offline or unreachable, or a name or split the hub does not have. The
    stage that read the name from the config says which key, and the local alternative."""


@dataclass
class LoadReport:
    """What `load_squad` kept and dropped, for logs and metrics.json."""

    source: str
    n_examples: int
    n_unanswerable_excluded: int
    n_skipped: int
    skipped_reasons: list[str] = field(default_factory=list)  # the first few only


@dataclass
class _Candidate:
    """One question as read from the source, before validation."""

    where: str  # "example 'q17'" or "line 7, example 'q17'": the location part of an error message
    record: dict[str, Any] | None = None
    problem: tuple[str, str] | None = None  # (field, reason) found while reading, before the record exists
    unanswerable: bool = False


class _BadExample(Exception):
    def __init__(self, field_name: str, reason: str):
        super().__init__(reason)
        self.field_name = field_name
        self.reason = reason


def load_squad(
    source: str,
    split: str = "train",
    on_bad_example: str = "error",
    cache_dir: str | None = None,
) -> tuple[datasets.Dataset, LoadReport]:
    """Load answerable SQuAD examples from a .json/.jsonl file or a datasets hub name, validating every record."""
    import datasets

    if on_bad_example not in ON_BAD_EXAMPLE_CHOICES:
        raise ValueError(f"on_bad_example must be one of {ON_BAD_EXAMPLE_CHOICES}, got {on_bad_example!r}")
    path = Path(source)
    if path.exists() or looks_like_a_path(source):
        candidates = _read_local_file(path, source)
        hub_dataset = None
    else:
        # The real hub call, for users; tests give local paths, or a hub name offline for the error.
        try:
            hub_dataset = datasets.load_dataset(source, split=split, cache_dir=cache_dir)
        except (OSError, ValueError) as error:  # offline or unreachable (ConnectionError), unknown name, unknown split
            lines = str(error).strip().splitlines()
            reason = lines[0] if lines else type(error).__name__
            raise HubDatasetError(f"hub dataset {source!r}: not loaded ({reason})") from error
        candidates = _hub_candidates(hub_dataset)

    kept_rows, kept_records, report = _validate_candidates(candidates, source, on_bad_example)
    if not kept_records:
        raise DataError(f"{source}: no answerable examples left to load ({_summary(report)})")
    if hub_dataset is not None:
        dataset = hub_dataset.select(kept_rows).select_columns(list(SQUAD_COLUMNS))
    else:
        dataset = datasets.Dataset.from_list(kept_records, features=squad_features())
    _log_report(report)
    return dataset, report


# ----------------------------------------------------------------------------------------------- local files


def _read_local_file(path: Path, source: str) -> list[_Candidate]:
    if not path.exists():
        raise DataError(f"{source}: file not found")
    if path.is_dir():
        raise DataError(f"{source}: is a directory; give a SQuAD .json file or a .jsonl file")
    if path.suffix == ".jsonl":
        return list(_jsonl_candidates(path, source))
    if path.suffix == ".json":
        return list(_squad_json_candidates(_read_json_document(path, source), source))
    raise DataError(f"{source}: unsupported file type {path.suffix!r}; expected .json (SQuAD layout) or .jsonl")


def _read_json_document(path: Path, source: str) -> Any:
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        # datasets' to_json writes JSON Lines even to a .json name; say so instead of a bare "Extra data".
        hint = "; if this is JSON Lines, name it .jsonl" if error.msg == "Extra data" else ""
        raise DataError(
            f"{source}: invalid JSON at line {error.lineno} column {error.colno}: {error.msg}{hint}"
        ) from None


def _squad_json_candidates(document: Any, source: str) -> Iterator[_Candidate]:
    """Flatten the official layout (data → articles → paragraphs → qas) into one candidate per question."""
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise DataError(
            f"{source}: field 'data': expected the SQuAD layout "
            '{"version": ..., "data": [{"title", "paragraphs": [...]}]}'
        )
    is_v2 = _is_squad_v2(document)
    for article_index, article in enumerate(document["data"]):
        title = _required_key(article, "title", source, f"article {article_index}")
        paragraphs = _required_key(article, "paragraphs", source, f"article {title!r}")
        for paragraph_index, paragraph in enumerate(paragraphs):
            where = f"article {title!r} paragraph {paragraph_index}"
            context = _required_key(paragraph, "context", source, where)
            for question_index, qa in enumerate(_required_key(paragraph, "qas", source, where)):
                yield _candidate_from_qa(qa, title, context, is_v2, f"{where} question {question_index}")


def _is_squad_v2(document: dict) -> bool:
    version = str(document.get("version", ""))
    if version.lstrip("v").startswith("2"):
        return True
    return any(
        isinstance(qa, dict) and "is_impossible" in qa
        for article in document["data"]
        if isinstance(article, dict)
        for paragraph in article.get("paragraphs", [])
        if isinstance(paragraph, dict)
        for qa in paragraph.get("qas", [])
    )


def _required_key(container: Any, key: str, source: str, where: str) -> Any:
    """A structural key of the file layout; missing means a broken file, so it is never skipped."""
    if not isinstance(container, dict):
        raise DataError(f"{source}: {where}: expected a JSON object, got {type(container).__name__}")
    if key not in container:
        raise DataError(f"{source}: {where} field '{key}': missing key")
    value = container[key]
    if key in ("paragraphs", "qas") and not isinstance(value, list):
        raise DataError(f"{source}: {where} field '{key}': expected a list, got {type(value).__name__}")
    return value


def _candidate_from_qa(qa: Any, title: Any, context: Any, is_v2: bool, position: str) -> _Candidate:
    if not isinstance(qa, dict):
        return _Candidate(where=position, problem=("qas", f"expected a JSON object, got {type(qa).__name__}"))
    where = f"example {qa['id']!r}" if "id" in qa else position
    if qa.get("is_impossible") is True or (is_v2 and qa.get("answers") == []):
        return _Candidate(where=where, unanswerable=True)
    try:
        record = {
            "id": _qa_key(qa, "id"),
            "title": title,
            "context": context,
            "question": _qa_key(qa, "question"),
            "answers": _answers_as_columns(_qa_key(qa, "answers")),
        }
    except _BadExample as bad:
        return _Candidate(where=where, problem=(bad.field_name, bad.reason))
    return _Candidate(where=where, record=record)


def _qa_key(qa: dict, key: str) -> Any:
    if key not in qa:
        raise _BadExample(key, "missing key")
    return qa[key]


def _answers_as_columns(answers: Any) -> dict[str, list]:
    """[{"text", "answer_start"}, ...] (file layout) → {"text": [...], "answer_start": [...]} (column layout)."""
    if not isinstance(answers, list):
        raise _BadExample("answers", f"expected a list of {{text, answer_start}}, got {type(answers).__name__}")
    columns: dict[str, list] = {"text": [], "answer_start": []}
    for index, answer in enumerate(answers):
        if not isinstance(answer, dict):
            raise _BadExample(f"answers[{index}]", f"expected a JSON object, got {type(answer).__name__}")
        for key in ("text", "answer_start"):
            if key not in answer:
                raise _BadExample(f"answers[{index}].{key}", "missing key")
            columns[key].append(answer[key])
    return columns


def _jsonl_candidates(path: Path, source: str) -> Iterator[_Candidate]:
    with path.open(encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue  # a trailing newline or blank line is not a record
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(
                    f"{source}: line {line_number}: invalid JSON at column {error.colno}: {error.msg}"
                ) from None
            yield _candidate_from_record(record, f"line {line_number}")


def _hub_candidates(dataset: datasets.Dataset) -> Iterator[_Candidate]:
    for row_index, record in enumerate(dataset):
        yield _candidate_from_record(record, f"row {row_index}")


def _candidate_from_record(record: Any, position: str) -> _Candidate:
    """A record already in the column layout (JSON Lines or a hub row)."""
    if not isinstance(record, dict):
        return _Candidate(where=position, problem=("record", f"expected a JSON object, got {type(record).__name__}"))
    where = f"{position}, example {record['id']!r}" if "id" in record else position
    answers = record.get("answers")
    # The hub's squad_v2 marks unanswerable questions with empty answer lists.
    if isinstance(answers, dict) and answers.get("text") == [] and answers.get("answer_start") == []:
        return _Candidate(where=where, unanswerable=True)
    return _Candidate(where=where, record=record)


# ------------------------------------------------------------------------------------------------ validation


def _validate_candidates(
    candidates: Iterable[_Candidate], source: str, on_bad_example: str
) -> tuple[list[int], list[dict], LoadReport]:
    """Keep the good records; raise on the first bad one ("error") or drop and count it ("skip")."""
    report = LoadReport(source=source, n_examples=0, n_unanswerable_excluded=0, n_skipped=0)
    kept_rows: list[int] = []
    kept_records: list[dict] = []
    seen_ids: set[str] = set()
    for row, candidate in enumerate(candidates):
        if candidate.unanswerable:
            report.n_unanswerable_excluded += 1
            continue
        problem = candidate.problem or _problem_in_record(candidate.record, seen_ids)
        if problem is None:
            seen_ids.add(candidate.record["id"])
            kept_rows.append(row)
            kept_records.append({column: candidate.record[column] for column in SQUAD_COLUMNS})
            continue
        field_name, reason = problem
        message = f"{source}: {candidate.where} field '{field_name}': {reason}"
        if on_bad_example == "error":
            raise DataError(message)
        report.n_skipped += 1
        if len(report.skipped_reasons) < MAX_SKIPPED_REASONS_KEPT:
            report.skipped_reasons.append(message)
    report.n_examples = len(kept_records)
    return kept_rows, kept_records, report


def _problem_in_record(record: dict, seen_ids: set[str]) -> tuple[str, str] | None:
    """(field, reason) for the first thing wrong with a column-layout record, or None when it is usable."""
    try:
        _check_record(record, seen_ids)
    except _BadExample as bad:
        return bad.field_name, bad.reason
    return None


def _check_record(record: dict, seen_ids: set[str]) -> None:
    for column in SQUAD_COLUMNS:
        if column not in record:
            raise _BadExample(column, "missing key")
    for column in ("id", "title", "context", "question"):
        if not isinstance(record[column], str):
            raise _BadExample(column, f"expected a string, got {type(record[column]).__name__}")
    if not record["id"]:
        raise _BadExample("id", "empty id")
    if record["id"] in seen_ids:
        raise _BadExample("id", "duplicate id (an earlier example has the same id)")
    if not record["context"].strip():
        raise _BadExample("context", "empty context")
    if not record["question"].strip():
        raise _BadExample("question", "empty question")
    _check_answers(record["answers"], record["context"])


def _check_answers(answers: Any, context: str) -> None:
    """Every gold answer must point at its own text in the context; one bad answer makes the example bad."""
    if not isinstance(answers, dict):
        raise _BadExample("answers", f"expected {{'text': [...], 'answer_start': [...]}}, got {type(answers).__name__}")
    for key in ("text", "answer_start"):
        if key not in answers:
            raise _BadExample(f"answers.{key}", "missing key")
        if not isinstance(answers[key], list):
            raise _BadExample(f"answers.{key}", f"expected a list, got {type(answers[key]).__name__}")
    texts, starts = answers["text"], answers["answer_start"]
    if len(texts) != len(starts):
        raise _BadExample("answers", f"{len(texts)} answer texts but {len(starts)} answer_start values")
    if not texts:
        raise _BadExample("answers", "no answers (an answerable example needs at least one)")
    for index, (text, start) in enumerate(zip(texts, starts)):
        which = f"answer {index}: " if len(texts) > 1 else ""
        _check_one_answer(text, start, context, which)


def _check_one_answer(text: Any, start: Any, context: str, which: str) -> None:
    if not isinstance(text, str) or not text:
        raise _BadExample("answers.text", f"{which}expected a non-empty string, got {text!r}")
    if not isinstance(start, int) or isinstance(start, bool):
        raise _BadExample("answers.answer_start", f"{which}expected an integer, got {start!r}")
    if start < 0 or start + len(text) > len(context):
        raise _BadExample(
            "answers.answer_start",
            f"{which}answer_start {start} with answer length {len(text)} is outside the context "
            f"({len(context)} characters)",
        )
    found = context[start : start + len(text)]
    if found != text:
        raise _BadExample(
            "answers.answer_start",
            f"{which}answer_start {start} does not point at the answer text {text!r} (context has {found!r} there)",
        )


# --------------------------------------------------------------------------------------------------- logging


def _summary(report: LoadReport) -> str:
    return (
        f"{report.n_examples} examples kept, {report.n_unanswerable_excluded} unanswerable excluded, "
        f"{report.n_skipped} bad examples skipped"
    )


def _log_report(report: LoadReport) -> None:
    logger.info("%s: %s", report.source, _summary(report))
    if report.n_unanswerable_excluded:
        logger.info(
            "%s: excluded %d unanswerable (SQuAD 2.0) questions from the extractive v1.1 task",
            report.source,
            report.n_unanswerable_excluded,
        )
    if report.n_skipped:
        logger.warning(
            "%s: skipped %d bad examples; first reasons: %s",
            report.source,
            report.n_skipped,
            " | ".join(report.skipped_reasons),
        )
