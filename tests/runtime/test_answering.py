"""The torch-free answerer: its windows equal the training code's, token for token and offset for offset, and it
answers on a bundle in a process where torch and transformers cannot be imported."""

import json
import subprocess
import sys

import numpy as np
import pytest
from transformers import AutoTokenizer

from pipeline.data.squad_loading import load_squad
from pipeline.plan.config import SquadConfig
from pipeline.runtime import answering, squad
from pipeline.stages import prepare_data, tokenizer
from tests.paths import PROJECT_ROOT
from tests.stage_fixtures import tiny_config

HARD_CONTEXTS = [
    ("accents", "Où est Zoë?", "Zoë Müller vécut à Köln, São Paulo et Reykjavík; elle naquit en 1901."),
    ("punctuation", "What did (she) say?", 'She said: "Hello—world!" … then left (quickly), didn\'t she?  Yes.'),
    ("cjk", "東京はどこ?", "東京は日本の首都です。The capital is 東京 (Tokyo), population 14,000,000."),
    ("leading spaces", "   Where is it?", "It is in Köln."),
    ("long", "Where did the river flow?", " ".join(f"Sentence {i} says the river flowed past town {i}." for i in range(80))),
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("answering")
    cfg = tiny_config()
    prepare_data.run(cfg, root / "data")
    tokenizer.run(cfg, root / "data", root / "tokenizer")
    return root


def training_windows(examples, tokenizer_path, squad_cfg):
    """The dev windows as the training stages build them (transformers + pipeline.runtime.squad)."""
    hf_tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    columns = {key: [e[key] for e in examples] for key in ("id", "question", "context")}
    return squad.prepare_validation_features(columns, hf_tokenizer, squad_cfg.max_seq_length, squad_cfg.doc_stride)


class WindowsOnly(answering.QuestionAnswerer):
    """The answerer's tokenization without an ONNX session."""

    def __init__(self, tokenizer_path, max_seq_length, doc_stride):
        self.max_seq_length, self.doc_stride = max_seq_length, doc_stride
        self._load_tokenizer(tokenizer_path / "tokenizer.json")


def assert_same_windows(examples, tokenizer_path, squad_cfg):
    expected = training_windows(examples, tokenizer_path, squad_cfg)
    got = WindowsOnly(tokenizer_path, squad_cfg.max_seq_length, squad_cfg.doc_stride).windows(examples)
    assert got.example_ids == expected["example_id"]
    np.testing.assert_array_equal(got.input_ids, np.array(expected["input_ids"]))
    np.testing.assert_array_equal(got.attention_mask, np.array(expected["attention_mask"]))
    np.testing.assert_array_equal(got.token_type_ids, np.array(expected["token_type_ids"]))
    expected_offsets = [[tuple(o) if o is not None else None for o in window] for window in expected["offset_mapping"]]
    assert got.context_offsets == expected_offsets
    return got


def test_windows_match_the_training_code_on_every_dev_context(tokenizer_dir):
    dev, _ = load_squad(str(tokenizer_dir / "data" / "dev.jsonl"))
    examples = [{"id": i, "question": q, "context": c} for i, q, c in zip(dev["id"], dev["question"], dev["context"])]
    assert_same_windows(examples, tokenizer_dir / "tokenizer", SquadConfig(max_seq_length=64, doc_stride=16))


def test_windows_match_on_accents_punctuation_cjk_and_long_contexts(tokenizer_dir):
    examples = [{"id": name, "question": q, "context": c} for name, q, c in HARD_CONTEXTS]
    windows = assert_same_windows(examples, tokenizer_dir / "tokenizer", SquadConfig(max_seq_length=64, doc_stride=16))
    assert windows.example_ids.count("long") > 3


def test_windows_match_on_real_squad_paragraphs(tokenizer_dir, squad2_dev_sample):
    data = json.loads(squad2_dev_sample.read_text())
    examples = [{"id": qa["id"], "question": qa["question"], "context": paragraph["context"]}
                for article in data["data"] for paragraph in article["paragraphs"][:3] for qa in paragraph["qas"][:4]]
    assert_same_windows(examples, tokenizer_dir / "tokenizer", SquadConfig(max_seq_length=160, doc_stride=32))


def test_a_question_too_long_for_the_window_is_refused_by_id(tokenizer_dir):
    answerer = WindowsOnly(tokenizer_dir / "tokenizer", 16, 4)
    with pytest.raises(answering.BundleError, match="question 'q7'.*too long"):
        answerer.windows([{"id": "q7", "question": "who " * 40, "context": "nobody at all"}])


def test_a_long_question_with_a_context_that_fits_in_one_window_is_answered(tokenizer_dir):
    answerer = WindowsOnly(tokenizer_dir / "tokenizer", 32, 16)
    windows = answerer.windows([{"id": "q", "question": "  who " * 20, "context": "nobody"}])
    assert len(windows) == 1 and windows.attention_mask.sum() <= 32


def test_question_files_are_validated_with_the_record_named(tmp_path):
    path = tmp_path / "questions.json"
    path.write_text(json.dumps([{"id": "a", "question": "Who?", "context": "Me."}, {"id": "b", "question": 3}]))
    with pytest.raises(answering.BundleError, match="question 1: field 'question' must be a string"):
        answering.read_questions(path)
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "Me.", "qas": [{"id": "x", "question": "Who?"}]}]}]}))
    assert answering.read_questions(path) == [{"id": "x", "question": "Who?", "context": "Me."}]


# An app's process: torch and transformers are not installed, so any import of them, at import time or inside a
# function the answerer calls, fails. The finder goes in before the package is imported.
WITHOUT_TORCH = """
import importlib.abc, json, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "transformers"):
            raise ModuleNotFoundError(f"No module named {name!r} (an app has no torch)", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from pipeline.runtime.answering import QuestionAnswerer

bundle, question, context, examples = json.loads(sys.stdin.read())
answerer = QuestionAnswerer.from_bundle(bundle, threads=1)
print(json.dumps({"answer": answerer.answer(question, context), "predictions": answerer.predict(examples)}))
"""


def test_the_bundle_answers_in_a_process_without_torch_or_transformers(exported_student):
    bundle = exported_student["bundle"]
    lines = (exported_student["data"] / "dev.jsonl").read_text(encoding="utf-8").splitlines()[:6]
    examples = [{key: record[key] for key in ("id", "question", "context")} for record in map(json.loads, lines)]
    _, question, context = HARD_CONTEXTS[-1]  # several windows
    result = subprocess.run([sys.executable, "-c", WITHOUT_TORCH], cwd=PROJECT_ROOT, capture_output=True, text=True,
                            input=json.dumps([str(bundle), question, context, examples]), timeout=120)
    assert result.returncode == 0, result.stderr
    answered = json.loads(result.stdout)
    answerer = answering.QuestionAnswerer.from_bundle(bundle, threads=1)  # this process has torch: the same answers
    assert answered["answer"] == json.loads(json.dumps(answerer.answer(question, context)))
    assert answered["predictions"] == answerer.predict(examples) and len(answered["predictions"]) == len(examples)


def squad_document(paragraphs):
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": paragraphs}]}


GOOD_PARAGRAPH = {"context": "Me.", "qas": [{"id": "x", "question": "Who?"}]}


@pytest.mark.parametrize("document, where", [
    ({"data": 5}, "data: expected a list, got a number"),
    ({"data": [5]}, "data[0]: expected an object, got a number"),
    ({"data": [{"paragraphs": 3}]}, "data[0].paragraphs: expected a list, got a number"),
    ({"data": [{"title": "T"}]}, "data[0].paragraphs: expected a list, got nothing (missing or null)"),
    (squad_document([GOOD_PARAGRAPH, {"context": "Me."}]),
     "data[0].paragraphs[1].qas: expected a list, got nothing (missing or null)"),
    (squad_document([GOOD_PARAGRAPH, {"context": "Me.", "qas": {"id": "y"}}]),
     "data[0].paragraphs[1].qas: expected a list, got an object"),
    (squad_document([{"context": ["Me."], "qas": []}]), "data[0].paragraphs[0].context: expected a string, got a list"),
    (squad_document([{"context": "Me.", "qas": ["Who?"]}]), "data[0].paragraphs[0].qas[0]: expected an object"),
    (squad_document([{"context": "Me.", "qas": [{"id": "y", "question": 7}]}]),
     "data[0].paragraphs[0].qas[0]: field 'question' must be a string"),
    ({"data": []}, "no questions in the file"),
], ids=["data", "article", "paragraphs", "no-paragraphs", "no-qas", "qas-object", "context", "qa", "question", "empty"])
def test_a_question_file_not_in_squad_layout_names_the_bad_field(tmp_path, document, where):
    path = tmp_path / "questions.json"
    path.write_text(json.dumps(document))
    with pytest.raises(answering.BundleError) as raised:
        answering.read_questions(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: {where}") and "\n" not in message


@pytest.mark.parametrize("question, context, problem", [
    ("", "Me.", "question 'x': the question is empty"),
    (" \t\n", "Me.", "question 'x': the question is empty"),
    ("Who?", "  ", "question 'x': the context is empty"),
], ids=["empty-question", "blank-question", "blank-context"])
def test_a_blank_question_or_context_in_a_question_file_is_refused_by_id(tmp_path, question, context, problem):
    path = tmp_path / "questions.json"
    for document in ([{"id": "x", "question": question, "context": context}],
                     squad_document([{"context": context, "qas": [{"id": "x", "question": question}]}])):
        path.write_text(json.dumps(document))
        with pytest.raises(answering.BundleError, match=f"^{path}: {problem}$"):
            answering.read_questions(path)


def test_a_question_id_given_twice_in_a_question_file_is_refused(tmp_path):
    path = tmp_path / "questions.json"
    path.write_text(json.dumps(squad_document([GOOD_PARAGRAPH, GOOD_PARAGRAPH])))
    with pytest.raises(answering.BundleError, match="question id 'x' appears twice"):
        answering.read_questions(path)
