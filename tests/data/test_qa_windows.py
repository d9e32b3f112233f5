"""QA batching glue: dynamic trimming keeps every per-position tensor aligned."""

import numpy as np
import torch

from pipeline.data.qa_windows import window_collate


def test_window_collate_trims_inputs_and_cached_teacher_logits_together():
    attention_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    windows = {
        "input_ids": torch.arange(10).view(2, 5),
        "attention_mask": attention_mask,
        "teacher_start_logits": torch.randn(2, 5),
        "start_positions": torch.tensor([1, 0]),
    }
    batch = window_collate(windows)([1, 0])
    assert batch["input_ids"].shape == (2, 3) and batch["teacher_start_logits"].shape == (2, 3)
    assert torch.equal(batch["teacher_start_logits"], windows["teacher_start_logits"][[1, 0], :3])
    assert torch.equal(batch["start_positions"], torch.tensor([0, 1]))


# ---------------------------------------------------------------- windows, inputs and dev evaluation


import datasets  # noqa: E402
import pytest  # noqa: E402
from transformers import BertForQuestionAnswering, DistilBertForQuestionAnswering  # noqa: E402

from pipeline.data import qa_windows
from pipeline.distillation.students import student_config_from_teacher  # noqa: E402
from pipeline.plan.config import SquadConfig  # noqa: E402
from pipeline.runtime import squad  # noqa: E402
from tests.stage_fixtures import tiny_bert_config  # noqa: E402
from tests.runtime.test_squad import SEINE_CONTEXT, seine_examples, seine_tokenizer  # noqa: E402,F401  (fixture)

SQUAD = SquadConfig(max_seq_length=24, doc_stride=8, n_best_size=5, max_answer_length=6, eval_batch_size=3)
SPANS = [(10, 15), (30, 35), (120, 124)]  # "Seine", "Paris", a word in the middle


@pytest.fixture
def examples():
    return datasets.Dataset.from_dict(seine_examples(SPANS))


def tiny_qa_model(tokenizer, distilbert: bool):
    torch.manual_seed(0)
    config = tiny_bert_config(vocab_size=len(tokenizer), hidden_dropout_prob=0.5)
    if distilbert:
        return DistilBertForQuestionAnswering(student_config_from_teacher(config, n_layers=2))
    return BertForQuestionAnswering(config)


def test_train_window_tensors_are_the_squad_features_as_tensors(examples, seine_tokenizer):
    windows = qa_windows.train_window_tensors(examples, seine_tokenizer, SQUAD)
    features = squad.prepare_train_features(examples[:], seine_tokenizer, SQUAD.max_seq_length, SQUAD.doc_stride)
    assert set(windows) == set(features)
    for name, tensor in windows.items():
        assert tensor.dtype == torch.int64 and tensor.tolist() == features[name], name
    assert windows["input_ids"].shape == (len(features["input_ids"]), SQUAD.max_seq_length)
    assert len(windows["input_ids"]) > 3 * len(SPANS)  # the Seine text needs several windows per question
    assert qa_windows.window_lengths(windows) == [sum(mask) for mask in features["attention_mask"]]


def test_validation_windows_keep_example_ids(examples, seine_tokenizer):
    windows = qa_windows.validation_windows(examples, seine_tokenizer, SQUAD)
    features = squad.prepare_validation_features(examples[:], seine_tokenizer, SQUAD.max_seq_length, SQUAD.doc_stride)
    assert windows["example_id"] == features["example_id"]
    assert windows["input_ids"] == features["input_ids"]
    assert "start_positions" not in windows.column_names and "context" not in windows.column_names


def test_model_inputs_are_those_the_model_accepts(seine_tokenizer):
    batch = {"input_ids": torch.ones(1, 3), "attention_mask": torch.ones(1, 3), "token_type_ids": torch.zeros(1, 3),
             "start_positions": torch.zeros(1)}
    bert, distilbert = tiny_qa_model(seine_tokenizer, False), tiny_qa_model(seine_tokenizer, True)
    assert list(qa_windows.model_inputs(batch, bert)) == ["input_ids", "attention_mask", "token_type_ids"]
    assert list(qa_windows.model_inputs(batch, distilbert)) == ["input_ids", "attention_mask"]
    assert list(qa_windows.model_inputs({"input_ids": batch["input_ids"]}, bert)) == ["input_ids"]


@pytest.mark.parametrize("distilbert", [True, False], ids=["distilbert", "bert"])
def test_window_logits_are_the_models_in_eval_mode_padded_with_a_losing_score(examples, seine_tokenizer, distilbert):
    model = tiny_qa_model(seine_tokenizer, distilbert).train()
    windows = qa_windows.validation_windows(examples, seine_tokenizer, SQUAD)
    start, end = qa_windows.predict_window_logits(model, windows, batch_size=2, device=torch.device("cpu"))
    assert model.training  # the caller's mode is restored
    assert start.dtype == end.dtype == np.float32 and start.shape == end.shape == (len(windows), SQUAD.max_seq_length)

    tensors = {name: torch.tensor(windows[name])
               for name in qa_windows.MODEL_INPUT_NAMES if name in windows.column_names}
    model.eval()
    with torch.no_grad():
        full = model(**qa_windows.model_inputs(tensors, model))  # no trimming, no dropout
    real = tensors["attention_mask"].bool().numpy()
    assert np.allclose(start[real], full.start_logits.numpy()[real], atol=1e-5)
    assert np.allclose(end[real], full.end_logits.numpy()[real], atol=1e-5)
    n_padded = 0
    for rows, length in squad.batches_by_length(real.sum(axis=1), 2):  # past each batch's longest window: a
        assert (start[rows, length:] == -1e4).all() and (end[rows, length:] == -1e4).all()  # score no answer wins
        n_padded += start[rows, length:].size
    assert n_padded > 0
    one_batch = qa_windows.predict_window_logits(model, windows, batch_size=64, device=torch.device("cpu"))
    assert np.allclose(one_batch[0][real], start[real], atol=1e-5)


def test_evaluate_qa_scores_the_postprocessed_predictions(examples, seine_tokenizer):
    model = tiny_qa_model(seine_tokenizer, True)
    metrics, predictions = qa_windows.evaluate_qa(model, seine_tokenizer, examples, SQUAD, torch.device("cpu"))
    assert set(predictions) == set(examples["id"])
    for prediction in predictions.values():
        assert prediction in SEINE_CONTEXT and len(prediction.split()) <= SQUAD.max_answer_length
    scores = squad.squad_v1_scores(squad.gold_answers(examples), predictions)
    assert metrics == {"exact_match": round(scores["exact_match"], 3), "f1": round(scores["f1"], 3),
                       "n_examples": len(SPANS), "n_windows": len(qa_windows.validation_windows(examples, seine_tokenizer, SQUAD))}

    # A model whose start/end logits point at "Seine" answers every question with it.
    seine = seine_tokenizer.convert_tokens_to_ids("seine")

    class PointsAtSeine(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            hit = (input_ids == seine).float() * 10
            return type("Output", (), {"start_logits": hit, "end_logits": hit})()

    metrics, predictions = qa_windows.evaluate_qa(PointsAtSeine(), seine_tokenizer, examples, SQUAD,
                                                  torch.device("cpu"))
    assert set(predictions.values()) == {"Seine"}
    assert metrics["exact_match"] == metrics["f1"] == 33.333  # one question of three, rounded to 3 decimals


def test_evaluate_qa_applies_the_configured_n_best_size_and_answer_length(examples, seine_tokenizer):
    # Start logits: highest on the question's first token (never an answer: not context), then on each "the", the
    # earlier the higher; end logits: highest on "France", then on each "the" alike.
    the, france = seine_tokenizer.convert_tokens_to_ids("the"), seine_tokenizer.convert_tokens_to_ids("france")
    which = seine_tokenizer.convert_tokens_to_ids("which")

    class FixedPointer(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            earlier_higher = 5 - 0.01 * torch.arange(input_ids.shape[1]).float()
            start = (input_ids == which).float() * 9 + (input_ids == the).float() * earlier_higher
            end = (input_ids == france).float() * 9 + (input_ids == the).float() * earlier_higher
            return type("Output", (), {"start_logits": start, "end_logits": end})()

    def answers(**squad_options):
        cfg = SquadConfig(max_seq_length=64, doc_stride=16, eval_batch_size=3, **squad_options)
        _, predictions = qa_windows.evaluate_qa(FixedPointer(), seine_tokenizer, examples, cfg, torch.device("cpu"))
        return set(predictions.values())

    long_answer = SEINE_CONTEXT[: SEINE_CONTEXT.index("France") + len("France")]
    assert answers(n_best_size=5, max_answer_length=30) == {long_answer}
    # "The river ... France" is 11 tokens: too long; the next start, "the capital", makes a 4-token span.
    assert answers(n_best_size=5, max_answer_length=10) == {"the capital of France"}
    # With only the top start considered, the first window has no valid span; a later window answers "the".
    assert {a.lower() for a in answers(n_best_size=1, max_answer_length=10)} == {"the"}


@pytest.mark.parametrize("freeze", [True, False])
def test_prepare_for_qa_training_freezes_only_the_word_embeddings(seine_tokenizer, freeze):
    model = tiny_qa_model(seine_tokenizer, True)
    prepared = qa_windows.prepare_for_qa_training(model, SquadConfig(freeze_word_embeddings=freeze))
    assert prepared is model
    assert model.get_input_embeddings().weight.requires_grad is not freeze
    assert all(p.requires_grad for n, p in model.named_parameters() if "word_embeddings" not in n)
