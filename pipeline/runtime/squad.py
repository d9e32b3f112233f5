"""SQuAD v1.1 machinery: tokenized windows ("features"), n-best answer postprocessing, the official EM/F1 metric.

The windowing and postprocessing follow transformers' examples/pytorch/question-answering (`run_qa.py`'s
prepare_train_features / prepare_validation_features and `utils_qa.postprocess_qa_predictions` without a null
answer), so models trained here score the same as with those example scripts. The metric is the official SQuAD
v1.1 evaluation script (evaluate-v1.1.py, Rajpurkar et al., 2016), including its quirks.

Two deliberate differences from transformers' example, both at edges it gets wrong or leaves odd:
  * an answer that starts in the last context token of a window is labelled with that token (the example's
    start scan runs past the context into [SEP]/padding there, see its "edge case" comment);
  * an example with no valid candidate span is answered "" (the example answers the literal string "empty").
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

CONTEXT_SEQUENCE_ID = 1  # question first, context second: we only pad on the right
MAX_IDS_LISTED = 5  # how many missing prediction ids a report lists
PUNCTUATION = frozenset(string.punctuation)  # the official script's definition of punctuation


def whole_column(table, name: str):
    """Column `name` of a datasets.Dataset (a list, or an array under a numpy format) or of a dict of lists, read
    in one go. A Dataset's column (datasets >= 4: a lazy Column) iterated, or given to np.asarray, is read row by
    row: 16x slower for 4,000 windows' token ids (0.30 s against 0.02 s)."""
    return table[name][:]


# ------------------------------------------------------------------------------------------------- windows


def prepare_train_features(
    examples: dict[str, list], tokenizer, max_seq_length: int, doc_stride: int
) -> dict[str, list]:
    """Batched `Dataset.map` function: examples → overlapping windows labelled with answer token positions.

    A window that does not fully contain the (first) gold answer is labelled with its CLS index for both start
    and end, as in that example. Use `remove_columns=dataset.column_names`: one example can give several windows.
    """
    tokenized = _tokenize_windows(examples, tokenizer, max_seq_length, doc_stride)
    window_to_example = tokenized.pop("overflow_to_sample_mapping")
    offset_mapping = tokenized.pop("offset_mapping")
    start_positions, end_positions = [], []
    for window, offsets in enumerate(offset_mapping):
        answers = examples["answers"][window_to_example[window]]
        cls_index = _cls_index(tokenized["input_ids"][window], tokenizer)
        span = None
        if answers["answer_start"]:
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            span = answer_token_span(offsets, tokenized.sequence_ids(window), start_char, end_char)
        start, end = span if span is not None else (cls_index, cls_index)
        start_positions.append(start)
        end_positions.append(end)
    features = dict(tokenized)
    features["start_positions"] = start_positions
    features["end_positions"] = end_positions
    return features


def prepare_validation_features(
    examples: dict[str, list], tokenizer, max_seq_length: int, doc_stride: int
) -> dict[str, list]:
    """Batched `Dataset.map` function: examples → windows with `example_id` and context-only `offset_mapping`.

    Offsets of non-context tokens (question, special tokens, padding) are None, so postprocessing can tell at a
    glance which positions may start or end an answer.
    """
    tokenized = _tokenize_windows(examples, tokenizer, max_seq_length, doc_stride)
    window_to_example = tokenized.pop("overflow_to_sample_mapping")
    example_ids, context_offsets = [], []
    for window, offsets in enumerate(tokenized["offset_mapping"]):
        sequence_ids = tokenized.sequence_ids(window)
        example_ids.append(examples["id"][window_to_example[window]])
        context_offsets.append(
            [offset if sequence_ids[k] == CONTEXT_SEQUENCE_ID else None for k, offset in enumerate(offsets)]
        )
    features = dict(tokenized)
    features["example_id"] = example_ids
    features["offset_mapping"] = context_offsets
    return features


def _tokenize_windows(examples: dict[str, list], tokenizer, max_seq_length: int, doc_stride: int):
    _check_tokenizer(tokenizer)
    if not 0 <= doc_stride < max_seq_length:
        raise ValueError(f"doc_stride must be in [0, max_seq_length={max_seq_length}), got {doc_stride}")
    # Leading whitespace in some questions only wastes window room (and can make truncation fail).
    questions = [question.lstrip() for question in examples["question"]]
    return tokenizer(
        questions,
        examples["context"],
        truncation="only_second",
        max_length=max_seq_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length",
    )


def batches_by_length(lengths: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, int]]:
    """Rows of windows (their token counts `lengths`) in batches of up to `batch_size`, shortest first, each with
    its longest window's length. A batch runs only up to its longest window, so windows of like length together
    pad least: on the SQuAD 2.0 dev sample at 384 tokens, 1.6x fewer positions than batches of 64 in window order
    (what a window scores does not depend on its batch: padded positions are masked out)."""
    order = np.argsort(lengths, kind="stable")
    for begin in range(0, len(order), batch_size):
        rows = order[begin : begin + batch_size]
        yield rows, int(lengths[rows].max())


def _check_tokenizer(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("SQuAD windows need a fast tokenizer (offset mappings come from the tokenizers library)")
    if tokenizer.padding_side != "right":
        raise ValueError(
            f"SQuAD windows put the question first and pad on the right; tokenizer.padding_side is "
            f"{tokenizer.padding_side!r}"
        )


def _cls_index(input_ids: list[int], tokenizer) -> int:
    """Where "no answer in this window" points: the CLS token, else BOS, else 0 (as in that example)."""
    for token_id in (tokenizer.cls_token_id, tokenizer.bos_token_id):
        if token_id is not None and token_id in input_ids:
            return input_ids.index(token_id)
    return 0


def answer_token_span(
    offsets: Sequence[tuple[int, int]], sequence_ids: Sequence[int | None], start_char: int, end_char: int
) -> tuple[int, int] | None:
    """Token positions (first, last) of the answer chars [start_char, end_char), or None if the window lacks it.

    The first token is the last context token starting at or before start_char; the last token is the first
    context token ending at or after end_char.
    """
    context_positions = [k for k, sequence_id in enumerate(sequence_ids) if sequence_id == CONTEXT_SEQUENCE_ID]
    if not context_positions:
        return None
    first, last = context_positions[0], context_positions[-1]
    if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
        return None
    start = first
    while start + 1 <= last and offsets[start + 1][0] <= start_char:
        start += 1
    end = last
    while end - 1 >= first and offsets[end - 1][1] >= end_char:
        end -= 1
    return start, end


# ------------------------------------------------------------------------------------------ postprocessing


def n_best_predictions(
    examples,
    features,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best_size: int = 20,
    max_answer_length: int = 30,
) -> dict[str, list[dict[str, Any]]]:
    """For each example id, its best candidate spans over all its windows, best first (possibly empty).

    Each candidate is {"text", "score", "start_logit", "end_logit"} with score = start_logit + end_logit.
    `examples` needs "id" and "context", `features` needs "example_id" and "offset_mapping" (a Dataset or a dict
    of lists); the logits have one row per feature.
    """
    start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
    feature_example_ids = list(whole_column(features, "example_id"))
    if not (len(feature_example_ids) == len(start_logits) == len(end_logits)):
        raise ValueError(
            f"{len(feature_example_ids)} features but {len(start_logits)} start and {len(end_logits)} end logit rows"
        )
    all_offsets = whole_column(features, "offset_mapping")
    windows_of_example: dict[str, list[int]] = {}
    for feature_index, example_id in enumerate(feature_example_ids):
        windows_of_example.setdefault(example_id, []).append(feature_index)

    n_best: dict[str, list[dict[str, Any]]] = {}
    for example_id, context in zip(whole_column(examples, "id"), whole_column(examples, "context")):
        candidates = []
        for feature_index in windows_of_example.get(example_id, []):
            candidates += _window_candidates(
                all_offsets[feature_index],
                start_logits[feature_index],
                end_logits[feature_index],
                n_best_size,
                max_answer_length,
            )
        # sorted() is stable, so ties keep window order, as in that example.
        best = sorted(candidates, key=lambda candidate: candidate["score"], reverse=True)[:n_best_size]
        n_best[example_id] = [_with_text(candidate, context) for candidate in best]
    return n_best


def postprocess_predictions(
    examples,
    features,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best_size: int = 20,
    max_answer_length: int = 30,
) -> dict[str, str]:
    """Example id → best answer text over all its windows; "" when no window has a valid span."""
    n_best = n_best_predictions(examples, features, start_logits, end_logits, n_best_size, max_answer_length)
    return {example_id: (candidates[0]["text"] if candidates else "") for example_id, candidates in n_best.items()}


def _window_candidates(
    offsets: Sequence, start_logits: np.ndarray, end_logits: np.ndarray, n_best_size: int, max_answer_length: int
) -> list[dict[str, Any]]:
    """The window's n_best_size best valid spans among its top-n start x top-n end context positions, best first.

    The top n are taken among context tokens only. That example takes them over every position, so the logits a
    model gives padding, [CLS] and the question can fill its top n (a briefly trained model can score padding
    above every context token), and then the answer depends on how much padding the window's batch had. Equal
    logits rank the later position first; equal scores keep the order of a start-major scan, so the overall
    n-best list (a stable sort of every window's candidates) is that of nested loops; a span outside its window's
    top n can never reach the overall top n. Vectorised: this runs once per window of every dev evaluation.
    """
    in_context = _context_mask(offsets, len(start_logits))
    context = np.flatnonzero(in_context)
    top_starts = context[np.argsort(start_logits[context], kind="stable")][::-1][:n_best_size]
    top_ends = context[np.argsort(end_logits[context], kind="stable")][::-1][:n_best_size]
    starts, ends = top_starts[:, None], top_ends[None, :]
    valid = (ends >= starts) & (ends - starts + 1 <= max_answer_length)
    start_rows, end_columns = np.nonzero(valid)  # row-major: the scan order
    span_starts, span_ends = top_starts[start_rows], top_ends[end_columns]
    scores = start_logits[span_starts] + end_logits[span_ends]
    best = np.argsort(-scores, kind="stable")[:n_best_size]
    return [
        {
            "char_span": (offsets[start][0], offsets[end][1]),
            "score": float(scores[index]),
            "start_logit": float(start_logits[start]),
            "end_logit": float(end_logits[end]),
        }
        for index, start, end in zip(best.tolist(), span_starts[best].tolist(), span_ends[best].tolist())
    ]


def _context_mask(offsets: Sequence, length: int) -> np.ndarray:
    """Which of `length` logit positions are context tokens. Logits may be longer than the offsets (padded
    batches); non-context offsets are None."""
    mask = np.zeros(length, dtype=bool)
    flags = [offset is not None and len(offset) >= 2 for offset in offsets[:length]]
    mask[: len(flags)] = flags
    return mask


def _with_text(candidate: dict[str, Any], context: str) -> dict[str, Any]:
    char_start, char_end = candidate["char_span"]
    return {
        "text": context[char_start:char_end],
        "start": char_start,  # character offsets of the answer in the context
        "end": char_end,
        "score": candidate["score"],
        "start_logit": candidate["start_logit"],
        "end_logit": candidate["end_logit"],
    }


# ---------------------------------------------------------------------------------- official v1.1 metric


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace (official order)."""
    text = text.lower()
    text = "".join(character for character in text if character not in PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_score(prediction: str, ground_truth: str) -> float:
    """Token-overlap F1; 0 when nothing overlaps, even if both sides normalise to empty (as the official script)."""
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(ground_truth_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_v1_scores(gold_answers: Mapping[str, list[str]], predictions: Mapping[str, str]) -> dict[str, Any]:
    """EM and F1 (×100) averaged over every gold question; a missing prediction scores 0 on both.

    Returns {"exact_match", "f1", "total", "n_missing_predictions", "missing_prediction_ids" (first few)}.
    Predictions for ids not in `gold_answers` are ignored, as in the official script.
    """
    if not gold_answers:
        raise ValueError("no gold questions to score")
    exact_match_sum = f1_sum = 0.0
    missing_ids = []
    for question_id, ground_truths in gold_answers.items():
        if not ground_truths:
            raise ValueError(f"question {question_id!r} has no gold answers; it is not a v1.1 question")
        if question_id not in predictions:
            missing_ids.append(question_id)
            continue
        prediction = predictions[question_id]
        exact_match_sum += max(exact_match_score(prediction, truth) for truth in ground_truths)
        f1_sum += max(f1_score(prediction, truth) for truth in ground_truths)
    total = len(gold_answers)
    return {
        "exact_match": 100.0 * exact_match_sum / total,
        "f1": 100.0 * f1_sum / total,
        "total": total,
        "n_missing_predictions": len(missing_ids),
        "missing_prediction_ids": missing_ids[:MAX_IDS_LISTED],
    }


def gold_answers(examples) -> dict[str, list[str]]:
    """Question id → gold answer texts of examples with "id" and "answers" columns (a Dataset or a dict of lists)."""
    return {example_id: answers["text"]
            for example_id, answers in zip(whole_column(examples, "id"), whole_column(examples, "answers"))}


def questions(examples) -> list[dict[str, str]]:
    """The examples as {"id", "question", "context"} records, the input of the torch-free answerer."""
    return [{"id": i, "question": q, "context": c}
            for i, q, c in zip(*(whole_column(examples, name) for name in ("id", "question", "context")))]
