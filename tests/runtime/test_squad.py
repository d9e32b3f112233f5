"""pipeline.runtime.squad: windows, n-best postprocessing, the official v1.1 metric; and the
evaluate-predictions CLI (pipeline.data.predictions).

Tokenizers are built offline with the `tokenizers` library: a hand-written WordPiece vocabulary for the synthetic
examples and one trained on the real sample's paragraphs.
"""

import functools
import json
import math
import re

import datasets
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from pipeline.data.predictions import evaluate_predictions_main, gold_answers_from_squad_json
from pipeline.data.squad_loading import DataError, load_squad
from pipeline.runtime.squad import (
    answer_token_span,
    batches_by_length,
    exact_match_score,
    f1_score,
    gold_answers,
    n_best_predictions,
    normalize_answer,
    postprocess_predictions,
    prepare_train_features,
    prepare_validation_features,
    questions,
    squad_v1_scores,
    whole_column,
)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CLS_INDEX = 0  # right padding: [CLS] question [SEP] context [SEP] [PAD]...

SEINE_CONTEXT = (
    "The river Seine flows through Paris, the capital of France. Many parisian bridges cross it, and the oldest "
    "one is the Pont Neuf, finished in 1607. Boats carry tourists past the cathedral of Notre Dame every day. "
    "In winter the water can rise above the quays, and in 1910 a great flood covered the streets for weeks."
)
SEINE_QUESTION = "Which river flows through Paris?"
WORD = re.compile(r"\w+|[^\w\s]")  # what BertPreTokenizer splits on: words and single punctuation marks


def bert_style_backend(wordpiece_model) -> Tokenizer:
    """A `tokenizers` pipeline like BERT's: lower-casing normaliser, split on whitespace and punctuation, WordPiece."""
    backend = Tokenizer(wordpiece_model)
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return backend


def as_transformers_tokenizer(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """Add the [CLS] A [SEP] B [SEP] template and wrap for transformers (a fast tokenizer: it returns offsets)."""
    cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    backend.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


@pytest.fixture(scope="module")
def seine_tokenizer() -> PreTrainedTokenizerFast:
    """Every word of the Seine text is one token, except "parisian" = "paris" + "##ian" (a subword case)."""
    words = sorted({word.lower() for word in WORD.findall(SEINE_CONTEXT + " " + SEINE_QUESTION)} - {"parisian"})
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + words + ["##ian"])}
    return as_transformers_tokenizer(bert_style_backend(models.WordPiece(vocab=vocab, unk_token="[UNK]")))


@pytest.fixture
def real_sample(squad2_dev_sample) -> datasets.Dataset:
    """The sample's 473 answerable questions."""
    return _load_once(str(squad2_dev_sample))


@pytest.fixture
def real_sample_tokenizer(squad2_dev_sample) -> PreTrainedTokenizerFast:
    return _tokenizer_trained_once(str(squad2_dev_sample))


# conftest's path fixture is per test; these caches keep the load and the training to once per run.
@functools.cache
def _load_once(path: str) -> datasets.Dataset:
    dataset, _ = load_squad(path)
    return dataset


@functools.cache
def _tokenizer_trained_once(path: str) -> PreTrainedTokenizerFast:
    """WordPiece trained on the sample's paragraphs and questions (as the tokenizer stage would, in miniature).

    The trainer breaks ties in an unspecified order, so the vocabulary can differ slightly between runs; the
    assertions below do not depend on it because every first gold answer in the sample starts and ends on a word
    boundary, and WordPiece pieces never cross word boundaries.
    """
    real_sample = _load_once(path)
    texts = list(dict.fromkeys(real_sample["context"])) + list(real_sample["question"])
    backend = bert_style_backend(models.WordPiece(unk_token="[UNK]"))
    backend.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=2000, special_tokens=SPECIAL_TOKENS))
    return as_transformers_tokenizer(backend)


def seine_examples(answer_spans: list[tuple[int, int]]) -> dict[str, list]:
    """A batch (dict of columns) with one example per answer (start_char, end_char) in the Seine text."""
    return {
        "id": [f"seine-{start}-{end}" for start, end in answer_spans],
        "title": ["Seine"] * len(answer_spans),
        "context": [SEINE_CONTEXT] * len(answer_spans),
        "question": [SEINE_QUESTION] * len(answer_spans),
        "answers": [{"text": [SEINE_CONTEXT[start:end]], "answer_start": [start]} for start, end in answer_spans],
    }


def every_word_and_three_word_span() -> list[tuple[int, int]]:
    words = [match.span() for match in re.finditer(r"\w+", SEINE_CONTEXT)]
    three_word_spans = [(words[k][0], words[k + 2][1]) for k in range(len(words) - 2)]
    return words + three_word_spans


def window_context_chars(offsets) -> tuple[int, int]:
    """The [first, last) context characters a validation window covers."""
    context_offsets = [offset for offset in offsets if offset is not None]
    return context_offsets[0][0], context_offsets[-1][1]


def assert_labels_round_trip(examples, train_features, validation_features) -> int:
    """Answer chars → labelled token positions → chars gives the answer back in every window that holds it.

    Windows that do not hold the whole answer must be labelled with the CLS index. Returns how many windows hold it.
    """
    example_index = {example_id: index for index, example_id in enumerate(examples["id"])}
    n_windows_with_answer = 0
    for window, example_id in enumerate(validation_features["example_id"]):
        example = example_index[example_id]
        answer_text = examples["answers"][example]["text"][0]
        answer_start = examples["answers"][example]["answer_start"][0]
        offsets = validation_features["offset_mapping"][window]
        start = train_features["start_positions"][window]
        end = train_features["end_positions"][window]
        window_start, window_end = window_context_chars(offsets)
        if window_start <= answer_start and answer_start + len(answer_text) <= window_end:
            n_windows_with_answer += 1
            assert examples["context"][example][offsets[start][0] : offsets[end][1]] == answer_text
        else:
            assert (start, end) == (CLS_INDEX, CLS_INDEX)
    return n_windows_with_answer


# ------------------------------------------------------------------------------------------------- windows


def test_train_windows_round_trip_every_answer_in_a_long_context(seine_tokenizer):
    examples = seine_examples(every_word_and_three_word_span())
    train = prepare_train_features(examples, seine_tokenizer, max_seq_length=24, doc_stride=8)
    validation = prepare_validation_features(examples, seine_tokenizer, max_seq_length=24, doc_stride=8)

    windows_per_example = len(train["input_ids"]) / len(examples["id"])
    assert windows_per_example > 5  # a long context: several overlapping windows each
    assert assert_labels_round_trip(examples, train, validation) >= len(examples["id"])
    for window_offsets, start in zip(validation["offset_mapping"], train["start_positions"]):
        assert start == CLS_INDEX or window_offsets[start] is not None  # labels always point into the context


@pytest.mark.parametrize(("max_seq_length", "doc_stride"), [(24, 8), (24, 0), (24, 14), (32, 5), (40, 16)])
def test_windows_overlap_by_exactly_doc_stride_context_tokens(seine_tokenizer, max_seq_length, doc_stride):
    # [CLS] question [SEP] context [SEP]: each window holds `room` context tokens; the next one starts
    # room - doc_stride tokens later, so consecutive windows share exactly doc_stride tokens, and the
    # last window ends at the context's last token.
    context_offsets = seine_tokenizer(SEINE_CONTEXT, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    token_at_offset = {tuple(offset): index for index, offset in enumerate(context_offsets)}
    n_context, n_question = len(context_offsets), len(seine_tokenizer.tokenize(SEINE_QUESTION))
    room = max_seq_length - n_question - 3
    expected_windows = 1 + math.ceil((n_context - room) / (room - doc_stride))

    features = prepare_validation_features(seine_examples([(10, 15)]), seine_tokenizer, max_seq_length, doc_stride)
    windows = [[token_at_offset[tuple(o)] for o in offsets if o is not None] for offsets in features["offset_mapping"]]
    assert len(windows) == expected_windows
    for index, window in enumerate(windows):
        assert window == list(range(window[0], window[0] + len(window)))  # contiguous context tokens
        assert window[0] == index * (room - doc_stride)
        assert len(window) == (room if index < len(windows) - 1 else n_context - window[0])
    for earlier, later in zip(windows, windows[1:]):
        assert len(set(earlier) & set(later)) == doc_stride
    assert windows[-1][-1] == n_context - 1 and windows[-2][-1] < n_context - 1
    # Training windows are the same windows.
    train = prepare_train_features(seine_examples([(10, 15)]), seine_tokenizer, max_seq_length, doc_stride)
    assert train["input_ids"] == features["input_ids"]


def test_answer_starting_in_the_last_context_token_is_labelled_with_that_token():
    # [CLS] q [SEP] c0 c1 [SEP] [PAD]: the answer is c1 (chars 4-9). The reference's start scan runs on into
    # [SEP]/[PAD] here (their offsets are (0, 0)); ours stops at the end of the context.
    offsets = [(0, 0), (0, 1), (0, 0), (0, 3), (4, 9), (0, 0), (0, 0)]
    sequence_ids = [None, 0, None, 1, 1, None, None]

    assert answer_token_span(offsets, sequence_ids, start_char=4, end_char=9) == (4, 4)
    assert answer_token_span(offsets, sequence_ids, start_char=0, end_char=9) == (3, 4)
    assert answer_token_span(offsets, sequence_ids, start_char=4, end_char=12) is None  # runs past the window


def test_train_features_have_model_inputs_and_labels_padded_to_max_length(seine_tokenizer):
    features = prepare_train_features(seine_examples([(10, 15)]), seine_tokenizer, max_seq_length=32, doc_stride=8)

    assert sorted(features) == ["attention_mask", "end_positions", "input_ids", "start_positions", "token_type_ids"]
    assert {len(row) for row in features["input_ids"]} == {32}
    which = seine_tokenizer.convert_tokens_to_ids("which")
    assert features["input_ids"][0][:2] == [seine_tokenizer.cls_token_id, which]


def test_leading_whitespace_of_questions_is_ignored(seine_tokenizer):
    examples = seine_examples([(10, 15)])
    padded_question = dict(examples, question=["   \t" + SEINE_QUESTION])

    plain = prepare_train_features(examples, seine_tokenizer, max_seq_length=24, doc_stride=8)
    stripped = prepare_train_features(padded_question, seine_tokenizer, max_seq_length=24, doc_stride=8)

    assert stripped == plain
    assert padded_question["question"][0].startswith("   ")  # the caller's batch is not modified


def test_validation_windows_keep_example_ids_and_only_context_offsets(seine_tokenizer):
    examples = seine_examples([(10, 15), (20, 25)])
    features = prepare_validation_features(examples, seine_tokenizer, max_seq_length=24, doc_stride=8)

    n_windows = len(features["input_ids"])
    assert features["example_id"] == ["seine-10-15"] * (n_windows // 2) + ["seine-20-25"] * (n_windows // 2)
    first_window = features["offset_mapping"][0]
    question_length = len(seine_tokenizer.tokenize(SEINE_QUESTION))
    assert first_window[: question_length + 2] == [None] * (question_length + 2)  # [CLS] question [SEP]
    assert first_window[question_length + 2] == (0, 3)  # "The"
    assert first_window[-1] is None  # the final [SEP]


def test_features_work_as_a_batched_dataset_map(seine_tokenizer):
    dataset = datasets.Dataset.from_dict(seine_examples([(10, 15), (120, 124)]))

    features = dataset.map(
        prepare_train_features,
        batched=True,
        remove_columns=dataset.column_names,
        fn_kwargs={"tokenizer": seine_tokenizer, "max_seq_length": 24, "doc_stride": 8},
    )

    assert len(features) > len(dataset)
    model_inputs_and_labels = {"input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions"}
    assert set(features.column_names) == model_inputs_and_labels


def test_left_padding_and_bad_stride_are_rejected(seine_tokenizer):
    left_padding = PreTrainedTokenizerFast(
        tokenizer_object=seine_tokenizer.backend_tokenizer, pad_token="[PAD]", cls_token="[CLS]", padding_side="left"
    )
    with pytest.raises(ValueError, match="padding_side is 'left'"):
        prepare_train_features(seine_examples([(10, 15)]), left_padding, max_seq_length=24, doc_stride=8)
    with pytest.raises(ValueError, match="doc_stride"):
        prepare_validation_features(seine_examples([(10, 15)]), seine_tokenizer, max_seq_length=24, doc_stride=24)


def test_real_sample_windows_round_trip_every_first_gold_answer(real_sample, real_sample_tokenizer):
    examples = real_sample.to_dict()
    train = prepare_train_features(examples, real_sample_tokenizer, max_seq_length=128, doc_stride=64)
    validation = prepare_validation_features(examples, real_sample_tokenizer, max_seq_length=128, doc_stride=64)

    assert len(train["input_ids"]) > 2 * len(real_sample)  # Wikipedia paragraphs need several 128-token windows
    assert assert_labels_round_trip(examples, train, validation) >= len(real_sample)


# ------------------------------------------------------------------------------------------ postprocessing


@pytest.fixture
def two_window_seine(seine_tokenizer):
    """One Seine example split into windows; positions of words found through the offsets."""
    examples = seine_examples([(30, 35)])
    features = prepare_validation_features(examples, seine_tokenizer, max_seq_length=40, doc_stride=16)
    assert len(features["input_ids"]) >= 2
    return examples, features


def token_position(features, window: int, word_start_char: int) -> int:
    offsets = features["offset_mapping"][window]
    return next(k for k, offset in enumerate(offsets) if offset and offset[0] == word_start_char)


def logits_with(features, peaks: dict[tuple[int, int], float]) -> np.ndarray:
    """Zero logits except the given {(window, position): value}."""
    logits = np.zeros((len(features["input_ids"]), len(features["input_ids"][0])), dtype=np.float32)
    for (window, position), value in peaks.items():
        logits[window, position] = value
    return logits


def test_batches_by_length_cover_every_window_once_shortest_first_with_each_batchs_longest_length():
    lengths = np.array([50, 384, 12, 200, 50, 7, 384])
    batches = list(batches_by_length(lengths, 3))
    assert [rows.tolist() for rows, _ in batches] == [[5, 2, 0], [4, 3, 1], [6]]  # ties in window order
    assert [length for _, length in batches] == [50, 384, 384]
    assert sum(length * len(rows) for rows, length in batches) < sum(
        lengths[begin : begin + 3].max() * len(lengths[begin : begin + 3]) for begin in range(0, 7, 3))
    assert list(batches_by_length(np.array([], dtype=np.int64), 3)) == []


def test_best_span_is_picked_across_windows(two_window_seine):
    examples, features = two_window_seine
    last = len(features["input_ids"]) - 1
    flood, weeks = SEINE_CONTEXT.index("flood"), SEINE_CONTEXT.index("weeks")
    seine = SEINE_CONTEXT.index("Seine")
    seine_position = (0, token_position(features, 0, seine))
    start = logits_with(features, {seine_position: 4.0, (last, token_position(features, last, flood)): 5.0})
    end = logits_with(features, {seine_position: 4.0, (last, token_position(features, last, weeks)): 5.0})

    predictions = postprocess_predictions(examples, features, start, end)
    assert predictions == {"seine-30-35": "flood covered the streets for weeks"}
    n_best = n_best_predictions(examples, features, start, end)["seine-30-35"]
    assert [candidate["text"] for candidate in n_best[:2]] == ["flood covered the streets for weeks", "Seine"]
    assert n_best[0]["score"] == 10.0 and n_best[1]["score"] == 8.0
    assert postprocess_predictions(examples, features, start, end, max_answer_length=5) == {"seine-30-35": "Seine"}


def test_datasets_give_the_answers_of_dicts_each_column_read_whole(two_window_seine, monkeypatch):
    # A datasets.Dataset's column read row by row (iterated, or given to np.asarray) took seconds of every export
    # stage; every reader here takes it in one go, as whole_column does, with the same values as from a dict.
    examples, features = two_window_seine
    flood, weeks = SEINE_CONTEXT.index("flood"), SEINE_CONTEXT.index("weeks")
    last = len(features["input_ids"]) - 1
    start = logits_with(features, {(last, token_position(features, last, flood)): 5.0})
    end = logits_with(features, {(last, token_position(features, last, weeks)): 5.0})
    from_dicts = (n_best_predictions(examples, features, start, end), gold_answers(examples), questions(examples))
    example_table, feature_table = datasets.Dataset.from_dict(examples), datasets.Dataset.from_dict(features)
    # the export modules' readers of the same windows: the ONNX parity windows and the CoreML fallback's mask
    from pipeline.export.coreml_tuning import ProxyTuning
    from pipeline.export.onnx_graph import windows_from_features

    def export_readers():
        windows = windows_from_features(feature_table)
        mask = ProxyTuning(None, feature_table, {}, (start, end), np.zeros(1), "").mask
        return (windows.example_ids, windows.input_ids.tolist(), windows.attention_mask.tolist(),
                windows.token_type_ids.tolist(), windows.context_offsets, mask.tolist())

    before_the_patch = export_readers()

    def row_by_row(column):
        raise AssertionError(f"column {column.column_name!r} read row by row")

    monkeypatch.setattr(datasets.arrow_dataset.Column, "__iter__", row_by_row)
    assert (n_best_predictions(example_table, feature_table, start, end), gold_answers(example_table),
            questions(example_table)) == from_dicts
    assert export_readers() == before_the_patch
    assert before_the_patch[1] == features["input_ids"] and before_the_patch[5] == np.asarray(
        features["attention_mask"]).astype(bool).tolist()
    assert from_dicts[0]["seine-30-35"][0]["text"] == "flood covered the streets for weeks"
    ids = whole_column(feature_table.with_format("numpy"), "input_ids")
    assert isinstance(ids, np.ndarray) and ids.tolist() == features["input_ids"]
    assert whole_column(features, "example_id") == features["example_id"]


def test_end_before_start_and_non_context_tokens_are_rejected(two_window_seine):
    examples, features = two_window_seine
    river, seine = SEINE_CONTEXT.index("river"), SEINE_CONTEXT.index("Seine")
    river_position, seine_position = token_position(features, 0, river), token_position(features, 0, seine)
    question_token, final_sep = 2, len(features["input_ids"][0]) - 1
    start = logits_with(features, {(0, seine_position): 9.0, (0, river_position): 3.0, (0, question_token): 20.0})
    end = logits_with(features, {(0, river_position): 9.0, (0, seine_position): 2.0, (0, final_sep): 20.0})

    # The top raw pairs are question→[SEP] (not context) and Seine→river (end before start);
    # of the valid ones river→river (3 + 9) beats Seine→Seine (9 + 2).
    assert postprocess_predictions(examples, features, start, end) == {"seine-30-35": "river"}


def test_no_valid_span_gives_an_empty_answer(two_window_seine):
    examples, features = two_window_seine
    context = [[k for k, offset in enumerate(offsets) if offset is not None] for offsets in features["offset_mapping"]]
    # In every window the top-1 start is the last context token and the top-1 end the first: the pair ends before
    # it starts, so no candidate is valid.
    start = logits_with(features, {(window, positions[-1]): 9.0 for window, positions in enumerate(context)})
    end = logits_with(features, {(window, positions[0]): 9.0 for window, positions in enumerate(context)})

    assert postprocess_predictions(examples, features, start, end, n_best_size=1) == {"seine-30-35": ""}


def test_logit_rows_must_match_the_features(two_window_seine):
    examples, features = two_window_seine
    too_few = np.zeros((1, 40))
    with pytest.raises(ValueError, match="features but 1 start"):
        postprocess_predictions(examples, features, too_few, too_few)


def test_oracle_logits_from_the_labels_recover_the_real_gold_answers(real_sample, real_sample_tokenizer):
    # max_answer_length 384 so no long gold answer is cut off by the span-length limit.
    features = real_sample.map(
        prepare_validation_features,
        batched=True,
        remove_columns=real_sample.column_names,
        fn_kwargs={"tokenizer": real_sample_tokenizer, "max_seq_length": 128, "doc_stride": 64},
    )
    labels = prepare_train_features(real_sample.to_dict(), real_sample_tokenizer, max_seq_length=128, doc_stride=64)
    peaks = np.arange(len(labels["start_positions"]))
    start_logits = logits_with(features, dict.fromkeys(zip(peaks, labels["start_positions"]), 10.0))
    end_logits = logits_with(features, dict.fromkeys(zip(peaks, labels["end_positions"]), 10.0))

    predictions = postprocess_predictions(real_sample, features, start_logits, end_logits, max_answer_length=384)
    gold = {example_id: answers["text"] for example_id, answers in zip(real_sample["id"], real_sample["answers"])}

    # Every first gold answer starts and ends on a word boundary, so tokenization loses nothing: EM is exact.
    assert squad_v1_scores(gold, predictions)["exact_match"] == 100.0


# ------------------------------------------------------------------------------------------ official metric


def test_normalization_follows_the_official_script():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("Theatre, anthem") == "theatre anthem"  # articles only as whole words
    assert normalize_answer("state-of-the-art") == "stateoftheart"  # punctuation goes before article removal


def test_exact_match_ignores_case_punctuation_and_articles():
    assert exact_match_score("the Eiffel tower.", "Eiffel Tower")
    assert not exact_match_score("Eiffel", "Eiffel Tower")
    assert not exact_match_score("", "Paris")


def test_f1_partial_overlap_by_hand():
    # prediction tokens [big, red, barn], gold [red, barn, door]: 2 shared, precision = recall = 2/3.
    assert f1_score("the big red barn", "red barn door") == pytest.approx(2 / 3)
    # Counter intersection: "paris" counts once; precision 1/2, recall 1 → F1 = 2/3.
    assert f1_score("Paris Paris", "Paris") == pytest.approx(2 / 3)
    assert f1_score("", "Paris") == 0.0


def test_gold_that_normalizes_to_empty_matches_exactly_but_scores_zero_f1():
    # The official v1.1 script's quirk (num_same == 0 → 0), unlike torchmetrics/SQuAD 2.0's 1.0.
    assert exact_match_score("", "The")
    assert f1_score("", "The") == 0.0


def test_scores_take_the_best_gold_answer_and_count_missing_predictions_as_wrong():
    gold = {
        "q1": ["Denver Broncos", "the Broncos"],
        "q2": ["Santa Clara, California", "Levi's Stadium"],
        "q3": ["February 7, 2016"],
        "q4": ["Gold"],
    }
    predictions = {"q1": "Broncos", "q2": "Levi's Stadium in Santa Clara", "q3": "7 February 2016", "q9": "extra"}

    scores = squad_v1_scores(gold, predictions)

    # q1: matches "the Broncos" exactly. q3: same tokens in another order, F1 1 but not EM. q4: missing, 0 and 0.
    # q2: prediction tokens [levis stadium in santa clara]; vs "Santa Clara, California" P 2/5 R 2/3 → F1 1/2,
    # vs "Levi's Stadium" P 2/5 R 1 → F1 4/7; the best gold answer counts.
    assert scores["exact_match"] == pytest.approx(100 * 1 / 4)
    assert scores["f1"] == pytest.approx(100 * (1 + 4 / 7 + 1 + 0) / 4)
    assert scores["total"] == 4
    assert scores["n_missing_predictions"] == 1
    assert scores["missing_prediction_ids"] == ["q4"]


def test_question_without_gold_answers_is_not_scored():
    with pytest.raises(ValueError, match="'q1' has no gold answers"):
        squad_v1_scores({"q1": []}, {"q1": ""})


def test_gold_answers_from_the_real_sample(squad2_dev_sample):
    gold = gold_answers_from_squad_json(squad2_dev_sample)

    assert len(gold) == 473
    assert gold["56ddde6b9a695914005b9628"] == ["France", "France", "France", "France"]


def test_gold_answers_from_a_bad_file_raise_the_loader_error(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        gold_answers_from_squad_json(tmp_path / "dev.json")


# ----------------------------------------------------------------------------------------------------- CLI


def write_predictions(path, predictions) -> str:
    path.write_text(json.dumps(predictions), encoding="utf-8")
    return str(path)


def test_cli_scores_perfect_predictions_100(squad2_dev_sample, tmp_path, capsys):
    gold = gold_answers_from_squad_json(squad2_dev_sample)
    predictions = write_predictions(tmp_path / "predictions.json", {qid: answers[0] for qid, answers in gold.items()})

    exit_code = evaluate_predictions_main([str(squad2_dev_sample), predictions])

    assert exit_code == 0
    assert json.loads(capsys.readouterr().out) == {
        "exact_match": 100.0,
        "f1": 100.0,
        "total": 473,
        "n_missing_predictions": 0,
    }


def test_cli_reports_missing_predictions(squad2_dev_sample, tmp_path, capsys):
    gold = gold_answers_from_squad_json(squad2_dev_sample)
    kept = dict(list({qid: answers[0] for qid, answers in gold.items()}.items())[:-3])
    predictions = write_predictions(tmp_path / "predictions.json", kept)

    exit_code = evaluate_predictions_main([str(squad2_dev_sample), predictions])

    captured = capsys.readouterr()
    scores = json.loads(captured.out)
    assert exit_code == 0
    assert scores["n_missing_predictions"] == 3
    assert scores["exact_match"] == pytest.approx(100 * 470 / 473)
    assert "3 of 473 questions have no prediction" in captured.err


@pytest.mark.parametrize(
    ("content", "expected_message"),
    [
        (None, "file not found"),
        ('{"q1": "Paris"', "invalid JSON at line 1"),
        ('["Paris"]', "expected a JSON object mapping question id to answer text, got list"),
        ('{"q1": ["Paris"]}', "question 'q1': expected the answer text as a string"),
    ],
)
def test_cli_bad_predictions_file_exits_2_with_one_line(squad2_dev_sample, tmp_path, capsys, content, expected_message):
    path = tmp_path / "predictions.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")

    exit_code = evaluate_predictions_main([str(squad2_dev_sample), str(path)])

    captured = capsys.readouterr()
    assert exit_code == 2
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert str(path) in captured.err and expected_message in captured.err


def test_cli_bad_dataset_exits_2(tmp_path, capsys):
    dataset = tmp_path / "dev.json"
    dataset.write_text("not json", encoding="utf-8")

    exit_code = evaluate_predictions_main([str(dataset), write_predictions(tmp_path / "p.json", {})])

    assert exit_code == 2
    assert f"{dataset}: invalid JSON" in capsys.readouterr().err


# ---------------------------------------------------------------- edges found by mutation testing


def test_a_question_without_an_answer_is_labelled_with_cls_in_every_window(seine_tokenizer):
    examples = seine_examples([(10, 15)])
    examples["answers"] = [{"text": [], "answer_start": []}]
    features = prepare_train_features(examples, seine_tokenizer, max_seq_length=24, doc_stride=8)
    assert len(features["input_ids"]) > 1
    assert set(features["start_positions"]) == set(features["end_positions"]) == {CLS_INDEX}


def test_answer_length_limit_is_inclusive_and_skips_only_the_long_spans(two_window_seine):
    examples, features = two_window_seine
    words = [match.start() for match in re.finditer(r"\w+", SEINE_CONTEXT)]
    river = SEINE_CONTEXT.index("river")
    first = token_position(features, 0, river)
    # Start at "river"; ends 2 tokens on (3-token span, best) and 1 token on (2-token span, second best).
    start = logits_with(features, {(0, first): 5.0})
    end = logits_with(features, {(0, first + 2): 5.0, (0, first + 1): 4.0})
    three_words = SEINE_CONTEXT[river : SEINE_CONTEXT.index(" ", SEINE_CONTEXT.index("flows"))]
    assert postprocess_predictions(examples, features, start, end, max_answer_length=3) == {"seine-30-35": three_words}
    # With a limit of 2 the best pair is too long; the loop goes on to the 2-token span.
    assert postprocess_predictions(examples, features, start, end, max_answer_length=2) == {"seine-30-35": "river Seine"}
    assert words  # the text has words to pick from


def test_n_best_considers_exactly_the_top_n_starts_and_ends(two_window_seine):
    examples, features = two_window_seine
    positions = [k for k, offset in enumerate(features["offset_mapping"][0]) if offset is not None][:4]
    # Start logits rank positions 0 > 1 > 2 > 3, end logits 3 > 2 > 1 > 0 (all others 0).
    start = logits_with(features, {(0, p): 10.0 - i for i, p in enumerate(positions)})
    end = logits_with(features, {(0, p): 7.0 + i for i, p in enumerate(positions)})
    for n_best_size in (1, 2, 3):
        n_best = n_best_predictions(examples, features, start, end, n_best_size=n_best_size)["seine-30-35"]
        assert len(n_best) == n_best_size
        starts = {candidate["start"] for candidate in n_best}
        assert starts <= {features["offset_mapping"][0][p][0] for p in positions[:n_best_size]}
        assert set(n_best[0]) == {"text", "score", "start", "end", "start_logit", "end_logit"}
        assert n_best[0]["start_logit"] == 10.0 and n_best[0]["end_logit"] == 10.0


def test_padding_and_question_logits_never_crowd_the_context_out_of_the_top_n(two_window_seine):
    examples, features = two_window_seine
    river = token_position(features, 0, SEINE_CONTEXT.index("river"))
    start = logits_with(features, {(0, river): 1.0})
    end = logits_with(features, {(0, river): 1.0})
    # Every non-context position of every window (the question, [CLS], [SEP]) outscores the context.
    for window, offsets in enumerate(features["offset_mapping"]):
        for position, offset in enumerate(offsets):
            if offset is None:
                start[window, position] = end[window, position] = 50.0
    answer = {"seine-30-35": "river"}
    assert postprocess_predictions(examples, features, start, end, n_best_size=3) == answer
    # Padding past the offsets (a batch padded to a longer window) with high logits changes nothing either.
    padded_start, padded_end = (np.pad(logits, ((0, 0), (0, 30)), constant_values=80.0) for logits in (start, end))
    assert postprocess_predictions(examples, features, padded_start, padded_end, n_best_size=3) == answer
    assert (n_best_predictions(examples, features, padded_start, padded_end, n_best_size=3)
            == n_best_predictions(examples, features, start, end, n_best_size=3))


def test_equal_logits_rank_the_later_position_first(two_window_seine):
    examples, features = two_window_seine
    first, second = [k for k, offset in enumerate(features["offset_mapping"][0]) if offset is not None][:2]
    start = logits_with(features, {(0, first): 5.0, (0, second): 5.0})
    end = logits_with(features, {(0, second): 5.0})
    # n_best_size 1: only one of the tied starts is considered; the later one, as in the JavaScript client.
    (best,) = n_best_predictions(examples, features, start, end, n_best_size=1)["seine-30-35"]
    assert best["start"] == features["offset_mapping"][0][second][0]


def test_n_best_with_many_ties_is_that_of_plain_nested_loops(two_window_seine):
    # Logits drawn from three values: ties everywhere, over windows longer than the 16 elements below which
    # numpy's default sort happens to keep equal elements in order.
    examples, features = two_window_seine
    rng = np.random.default_rng(0)
    start = rng.integers(0, 3, size=(len(features["input_ids"]), len(features["input_ids"][0]))).astype(np.float32)
    end = rng.integers(0, 3, size=start.shape).astype(np.float32)
    n_best_size, max_answer_length = 20, 6

    expected = []
    for window, offsets in enumerate(features["offset_mapping"]):
        context = [p for p, offset in enumerate(offsets) if offset is not None]
        top = lambda logits: sorted(context, key=lambda p: (logits[window][p], p), reverse=True)[:n_best_size]
        candidates = [(start[window][s] + end[window][e], offsets[s][0], offsets[e][1])
                      for s in top(start) for e in top(end) if s <= e < s + max_answer_length]
        expected += sorted(candidates, key=lambda candidate: -candidate[0])[:n_best_size]
    expected = sorted(expected, key=lambda candidate: -candidate[0])[:n_best_size]

    n_best = n_best_predictions(examples, features, start, end, n_best_size, max_answer_length)["seine-30-35"]
    assert [(c["score"], c["start"], c["end"]) for c in n_best] == [(float(a), b, c) for a, b, c in expected]


def test_scores_need_gold_questions_and_windows_need_a_fast_tokenizer(tmp_path):
    with pytest.raises(ValueError, match=r"^no gold questions to score$"):
        squad_v1_scores({}, {})
    from transformers import BertTokenizer

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL_TOKENS + ["the", "river"]) + "\n")
    slow = BertTokenizer(str(vocab))
    with pytest.raises(ValueError, match=r"^SQuAD windows need a fast tokenizer \(offset mappings come from the "
                                         r"tokenizers library\)$"):
        prepare_train_features(seine_examples([(10, 15)]), slow, max_seq_length=24, doc_stride=8)
