"""Bad input, one case per test: each stops with a one-line error naming the file, key or example, exits
non-zero, and leaves no output that looks complete.

Commands go through `pipeline.__main__.main`, the dispatcher that turns a handled error into exit status 2 and
one `error:` line. Each command is also run once as Snakemake runs it (`python -m pipeline` in a process of its
own); the other cases call the same dispatcher in this process, which saves an interpreter start (seconds) each.
"""

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.outputs.manifests import atomic_output_dir, ManifestError, write_manifest
from pipeline.plan.config import TrainConfig
from pipeline.training.loop import train
from tests.paths import PROJECT_ROOT
from tests.dry_run import command_line_dry_run

CONTEXT = "Paris is the capital of France. Lyon is the third city."  # "France" at 24


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m pipeline ARGS` in a process of its own, as a Snakemake rule runs it (with `env` added to its
    environment)."""
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def run_cli_here(*args: str) -> subprocess.CompletedProcess:
    """The same command through the same dispatcher, in this process: its return value is the exit status."""
    from pipeline.__main__ import main

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # stages reconfigure logging; leave it as it was
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            returncode = main(list(args))
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return subprocess.CompletedProcess(["python", "-m", "pipeline", *args], returncode, stdout.getvalue(),
                                       stderr.getvalue())


def last_error_line(completed: subprocess.CompletedProcess) -> str:
    assert completed.returncode != 0, completed.stdout[-1000:]
    return completed.stderr.strip().splitlines()[-1]


def assert_one_line_error(completed: subprocess.CompletedProcess, *needles: str) -> str:
    """The stage's handled error: exit status 2 and the message as the last line of stderr."""
    line = last_error_line(completed)
    assert completed.returncode == 2 and line.startswith("error: "), completed.stderr[-2000:]
    for needle in needles:
        assert needle in line, line
    return line


def prepare_data(config: dict, out_dir: Path, own_process: bool = False) -> subprocess.CompletedProcess:
    run = run_cli if own_process else run_cli_here
    return run("prepare-data", "--config-json", json.dumps(config), "--out-dir", str(out_dir))


def squad_file(path: Path, qas: list, context: str = CONTEXT) -> str:
    document = {"version": "1.1", "data": [{"title": "France", "paragraphs": [{"context": context, "qas": qas}]}]}
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


GOOD_QAS = [{"id": "q1", "question": "What is the capital of France?", "answers": [{"text": "Paris", "answer_start": 0}]}]


def local_data_config(tmp_path: Path, train_qas: list, corpus: str = "squad_contexts") -> dict:
    return {"data": {"squad": squad_file(tmp_path / "train.json", train_qas),
                     "squad_dev": squad_file(tmp_path / "dev.json", GOOD_QAS), "corpus": corpus}}


# --------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "config, needles",
    [
        ({"data": {"squadd": "x.json"}}, ["data.squadd: unknown config key"]),
        ({"data": {"max_train_examples": "ten"}}, ["data.max_train_examples: expected an integer, got 'ten'"]),
        ({"squad": {"max_seq_length": 64, "doc_stride": 64}}, ["squad.doc_stride: 64 must be smaller"]),
        ({"distill_pretrain": {"temperature": 0}}, ["distill_pretrain.temperature: 0.0 must be > 0.0"]),
        ({"distill_squad": {"distilbert": {"temperature": -1.0}}}, ["distill_squad.distilbert.temperature"]),
        ({"distill_squad": {"objectives": ["distilbert", "fitnet"]}},
         ["distill_squad.objectives[1]: 'fitnet' is not one of"]),
        ({"compute": {"mixed_precision": "fp8"}}, ["compute.mixed_precision: 'fp8' is not one of"]),
    ],
    ids=["unknown-key", "wrong-type", "doc-stride", "temperature", "kd-temperature", "objective", "precision"],
)
def test_bad_config_values_stop_the_stage_naming_the_key(tmp_path, config, needles):
    completed = prepare_data(config, tmp_path / "out")
    assert_one_line_error(completed, *needles)
    assert not (tmp_path / "out").exists()


def snakemake_dry_run(tmp_path: Path, config_text: str) -> subprocess.CompletedProcess:
    config = tmp_path / "config.yaml"
    config.write_text(f"output_root: {json.dumps(str(tmp_path / 'artifacts'))}\n" + config_text)
    arguments = ["-n", "--cores", "1", "--snakefile", str(PROJECT_ROOT / "Snakefile"), "--directory", str(tmp_path),
                 "--configfile", str(PROJECT_ROOT / "configs" / "test.yaml"), str(config)]
    return command_line_dry_run(arguments, cwd=tmp_path)  # the command line, in this process (tests/dry_run.py)


def test_a_layer_mapping_outside_the_teacher_stops_snakemake_before_any_job(tmp_path):
    completed = snakemake_dry_run(tmp_path, "student:\n  layer_mapping: [0, 7]\n")
    assert completed.returncode != 0
    output = completed.stdout + completed.stderr
    assert "student.layer_mapping[1]: teacher layer 7 is out of range; the teacher has 4 layers" in output
    assert not (tmp_path / "artifacts").exists()


def test_a_missing_local_squad_file_is_reported_by_snakemake_before_any_job(tmp_path):
    missing = tmp_path / "no such" / "train.json"
    completed = snakemake_dry_run(
        tmp_path, f"data:\n  squad: {json.dumps(str(missing))}\n  squad_dev: {json.dumps(str(missing))}\n"
                  "  corpus: squad_contexts\n")
    assert completed.returncode != 0
    output = completed.stdout + completed.stderr
    assert f"no such file or directory: data.squad: {missing}; data.squad_dev: {missing}" in output
    assert not (tmp_path / "artifacts").exists()


# ----------------------------------------------------------------------------------------------- data


def test_a_missing_squad_file_names_it(tmp_path):
    config = {"data": {"squad": str(tmp_path / "absent.json"), "squad_dev": str(tmp_path / "absent.json")}}
    completed = prepare_data(config, tmp_path / "out", own_process=True)
    assert_one_line_error(completed, "absent.json: file not found")
    assert not (tmp_path / "out").exists()


def test_a_squad_file_that_is_not_json_names_file_line_and_column(tmp_path):
    config = local_data_config(tmp_path, GOOD_QAS)
    Path(config["data"]["squad"]).write_text('{"version": "1.1", "data": [}', encoding="utf-8")
    assert_one_line_error(prepare_data(config, tmp_path / "out"), "train.json: invalid JSON at line 1 column")
    assert not (tmp_path / "out").exists()


def test_a_squad_example_with_a_missing_field_names_example_and_field(tmp_path):
    qas = GOOD_QAS + [{"id": "q2", "answers": [{"text": "France", "answer_start": 24}]}]
    config = local_data_config(tmp_path, qas)
    assert_one_line_error(prepare_data(config, tmp_path / "out"), "train.json", "example 'q2' field 'question'",
                          "missing key")
    assert not (tmp_path / "out").exists()


def test_an_answer_start_that_does_not_match_its_text_names_the_example(tmp_path):
    qas = GOOD_QAS + [{"id": "q2", "question": "Where?", "answers": [{"text": "France", "answer_start": 20}]}]
    config = local_data_config(tmp_path, qas)
    assert_one_line_error(prepare_data(config, tmp_path / "out"), "train.json", "example 'q2'",
                          "field 'answers.answer_start'", "does not point at the answer text 'France'")
    assert not (tmp_path / "out").exists()


def test_an_empty_corpus_names_the_file(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n  \n", encoding="utf-8")
    completed = prepare_data(local_data_config(tmp_path, GOOD_QAS, corpus=str(corpus)), tmp_path / "out")
    assert_one_line_error(completed, "corpus.txt: the MLM corpus has no non-empty lines")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------- hub, offline

# The hub libraries read these when they are imported: each case runs in a process of its own, which fails at once
# instead of retrying the network for half a minute.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
HUB_MODEL = "distilbert-base-cased-distilled-squad"  # configs/deploy.yaml's deploy.model


@pytest.mark.parametrize("config, needles", [
    ({"deploy": {"model": HUB_MODEL}, "data": {"squad": "squad"}},
     ["data.squad: hub dataset 'squad': not loaded (Couldn't reach 'squad' on the Hub",
      "offline, give a local SQuAD dev file instead (data.squad_dev: ./my-dev.json)"]),
    ({"data": {"squad": "squad", "corpus": "squad_contexts"}},
     ["data.squad: hub dataset 'squad': not loaded",
      "offline, give local SQuAD files instead (data.squad: ./train.json and data.squad_dev: ./dev.json)"]),
], ids=["deploy", "training"])
def test_a_hub_dataset_offline_names_the_key_and_the_local_alternative(tmp_path, config, needles):
    completed = run_cli("prepare-data", "--config-json", json.dumps(config), "--out-dir", str(tmp_path / "data"),
                        env=OFFLINE)
    assert_one_line_error(completed, *needles)
    assert "Traceback" not in completed.stderr and not (tmp_path / "data").exists()


def test_a_hub_model_offline_names_the_key_and_the_local_alternative(tmp_path):
    config = {"deploy": {"model": HUB_MODEL}}
    completed = run_cli("deploy-model", "--config-json", json.dumps(config), "--data-dir", str(tmp_path / "data"),
                        "--out-dir", str(tmp_path / "deployed"), env=OFFLINE)
    assert_one_line_error(completed, f"deploy.model {HUB_MODEL}: cannot read its config (",
                          "offline, give a local save_pretrained folder instead (deploy.model: ./my-qa-model)")
    assert "Traceback" not in completed.stderr and not (tmp_path / "deployed").exists()


# ----------------------------------------------------------------------------------- checkpoints, models


def test_a_truncated_checkpoint_is_refused_by_name(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    x, y = torch.randn(32, 4), torch.randn(32)
    cfg = TrainConfig(max_steps=6, batch_size=8, checkpoint_every=2, log_every=2, group_by_length=False)
    calls = {"n": 0}

    def compute_loss(batch):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("killed")  # after the step-2 and step-4 checkpoints were written
        return {"loss": torch.nn.functional.mse_loss(model(batch["x"]).squeeze(-1), batch["y"])}

    arguments = dict(module=model, compute_loss=compute_loss, examples=list(range(32)), cfg=cfg, seed=1,
                     collate=lambda i, generator: {"x": x[i], "y": y[i], "input_ids": torch.ones(len(i), 2, dtype=torch.long)},
                     device=torch.device("cpu"), checkpoint_dir=tmp_path / "checkpoints", log_path=tmp_path / "log",
                     fingerprint="run")
    with pytest.raises(RuntimeError, match="killed"):
        train(**arguments)
    weights = tmp_path / "checkpoints" / "step-00000004" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-7])
    with pytest.raises(ManifestError, match=r"step-00000004/model.safetensors: \d+ bytes, the manifest says .* "
                                            r"\(truncated or replaced\); delete .*step-00000004 to resume"):
        train(**arguments)


def test_a_truncated_safetensors_input_is_refused_by_name_before_any_work(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    from tests.stage_fixtures import tiny_bert_config

    teacher_dir = tmp_path / "teacher"
    with atomic_output_dir(teacher_dir) as tmp:  # as a stage writes it: with a manifest
        BertForMaskedLM(tiny_bert_config()).save_pretrained(tmp, safe_serialization=True)
    weights = teacher_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert isinstance(BertConfig.from_pretrained(teacher_dir), BertConfig)  # the config alone still loads
    completed = run_cli_here("init-student", "--config-json", "{}", "--teacher", str(teacher_dir), "--tokenizer-dir",
                             str(tmp_path / "tokenizer"), "--out-dir", str(tmp_path / "student"))
    assert_one_line_error(completed, "teacher/model.safetensors", "the manifest says", "truncated")
    assert not (tmp_path / "student").exists()


# -------------------------------------------------------------------------------------------- bundles


@pytest.fixture
def small_bundle(tmp_path) -> Path:
    """A bundle's files as the bundle rule lays them out: qa_config.json, tokenizer.json, an ONNX model, manifest."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "paris", "france", "?", "."])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.save(str(bundle / "tokenizer.json"))
    (bundle / "model.int8.onnx").write_bytes(b"\x08\x07" + b"not a protobuf graph " * 40)
    config = {"max_seq_length": 32, "doc_stride": 8, "n_best_size": 5, "max_answer_length": 10,
              "tokenizer": {"file": "tokenizer.json"}, "onnx": {"model": "model.int8.onnx"}}
    (bundle / "qa_config.json").write_text(json.dumps(config))
    write_manifest(bundle)
    return bundle


def test_a_corrupted_onnx_model_handed_to_answer_is_named(small_bundle, tmp_path):
    questions = tmp_path / "questions.json"
    questions.write_text(json.dumps([{"id": "q1", "question": "Paris?", "context": "Paris. France."}]))
    completed = run_cli_here("answer", "--bundle", str(small_bundle), "--json", str(questions), "--out",
                             str(tmp_path / "answers.json"))
    assert_one_line_error(completed, "model.int8.onnx: not a loadable ONNX model", "INVALID_PROTOBUF")
    assert not (tmp_path / "answers.json").exists()


def test_a_bundle_with_a_modified_file_is_refused_by_name(small_bundle, tmp_path):
    tokenizer = small_bundle / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace('"france"', '"franco"'))  # same size, other content
    completed = run_cli("answer", "--bundle", str(small_bundle), "--question", "Paris?", "--context", "Paris.")
    assert_one_line_error(completed, "tokenizer.json: sha256 differs from the manifest")


@pytest.fixture
def answering_bundle(small_bundle) -> Path:
    """small_bundle with a model that loads and answers: a graph whose start and end logits are the token ids, so
    the highest-id context token is the answer."""
    import onnx
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
              for name in ("input_ids", "attention_mask", "token_type_ids")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "sequence"])
               for name in ("start_logits", "end_logits")]
    nodes = [helper.make_node("Cast", ["input_ids"], [name], to=TensorProto.FLOAT)
             for name in ("start_logits", "end_logits")]
    graph = helper.make_graph(nodes, "token_ids_as_logits", inputs, outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(small_bundle / "model.int8.onnx"))
    write_manifest(small_bundle)
    return small_bundle


def answer_with_questions(bundle: Path, tmp_path: Path, document) -> subprocess.CompletedProcess:
    questions = tmp_path / "questions.json"
    questions.write_text(json.dumps(document))
    return run_cli_here("answer", "--bundle", str(bundle), "--json", str(questions), "--out",
                        str(tmp_path / "answers.json"))


def test_a_question_file_not_in_squad_layout_names_the_file_and_the_field(answering_bundle, tmp_path):
    document = {"data": [{"paragraphs": [{"context": "Paris.", "qas": []}, {"context": "France.", "qas": 3}]}]}
    completed = answer_with_questions(answering_bundle, tmp_path, document)
    assert_one_line_error(completed, "questions.json: data[0].paragraphs[1].qas: expected a list, got a number")
    assert not (tmp_path / "answers.json").exists()


def test_a_blank_question_in_a_question_file_is_refused_by_its_id(answering_bundle, tmp_path):
    good = {"id": "q1", "question": "Paris?", "context": "Paris. France."}
    assert answer_with_questions(answering_bundle, tmp_path, [good]).returncode == 0  # the bundle answers
    (tmp_path / "answers.json").unlink()
    completed = answer_with_questions(answering_bundle, tmp_path, [good, {**good, "id": "q2", "question": "  "}])
    assert_one_line_error(completed, "questions.json: question 'q2': the question is empty")
    assert not (tmp_path / "answers.json").exists()


@pytest.mark.parametrize("question, context, needle", [
    ("", "Paris. France.", "error: the question is empty: there is nothing to answer"),
    ("  \n", "Paris. France.", "error: the question is empty: there is nothing to answer"),
    ("Paris?", " ", "error: the context is empty: there is nothing to answer"),
], ids=["empty-question", "blank-question", "blank-context"])
def test_an_empty_question_or_context_gets_an_error_not_an_answer(answering_bundle, question, context, needle):
    from pipeline.runtime.answering import BundleError, QuestionAnswerer

    answerer = QuestionAnswerer.from_bundle(answering_bundle)
    assert answerer.answer("Paris?", "Paris France")["answer"] == "France"  # the bundle answers a real question
    with pytest.raises(BundleError, match=needle.removeprefix("error: ")):
        answerer.answer(question, context)
    with pytest.raises(BundleError, match="question 'q7': the (question|context) is empty"):
        answerer.n_best([{"id": "q7", "question": question, "context": context}])
    completed = run_cli_here("answer", "--bundle", str(answering_bundle), "--question", question, "--context", context)
    assert completed.stdout == "" and assert_one_line_error(completed) == needle
