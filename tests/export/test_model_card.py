"""pipeline/export/model_card.py: each card parses back with huggingface_hub, with the scores of metrics.json and where
the model came from read from the stage's input folders (not from config sections the stage never receives)."""

import json

from huggingface_hub import ModelCard

from pipeline.export import model_card
from pipeline.outputs.manifests import config_sha256
from tests.stage_fixtures import tiny_config

QA_METRICS = {"exact_match": 81.25, "f1": 88.5, "n_examples": 16, "steps": 40, "objectives": ["tinybert"],
              "alpha_task": 0.5, "teacher_f1": 90.0, "f1_relative_to_teacher": 0.9833, "device": "cpu"}


def scores(card: ModelCard) -> dict[str, float]:
    return {result.metric_type: result.metric_value for result in card.data.eval_results}


def data_dir(tmp_path, squad_source="synthetic"):
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps({"squad_source": squad_source, "corpus_source": "synthetic"}))
    return folder


def model_folder(tmp_path, name, base_model=None):
    """A model folder with a card, as a stage writes it (only its metadata matters here)."""
    folder = tmp_path / name
    folder.mkdir()
    metadata = f"base_model: {base_model}\n" if base_model else ""
    (folder / "README.md").write_text(f"---\n{metadata}license: apache-2.0\n---\n\n# {name}\n")
    return folder


def test_a_student_card_carries_its_measured_scores_its_data_and_how_it_was_built(tmp_path):
    cfg = tiny_config()  # as a stage receives it: data, student and teacher sections at their defaults
    student = model_folder(tmp_path, "distill_pretrain")
    card = ModelCard(str(model_card.qa_student_card(cfg, QA_METRICS, student, tmp_path / "teacher",
                                                    data_dir(tmp_path, "squad"), "distill_squad")))
    assert card.data.pipeline_tag == "question-answering" and card.data.license == "apache-2.0"
    assert scores(card) == {"exact_match": 81.25, "f1": 88.5}
    assert card.data.datasets == ["squad"]  # read from data/metrics.json, not from the config's default
    assert {result.dataset_type for result in card.data.eval_results} == {"squad"}
    assert card.data.base_model is None  # a student distilled from a teacher built here
    assert config_sha256(cfg) in card.text and "tinybert" in card.text and "98.3%" in card.text
    assert "- trained on: cpu" in card.text and "- machine: " in card.text


def test_base_model_is_a_hub_name_or_the_one_the_input_models_card_names(tmp_path):
    assert model_card.base_model_of("distilbert-base-uncased") == "distilbert-base-uncased"
    assert model_card.base_model_of("./students/mine") is None  # a path, not a hub id
    chained = model_folder(tmp_path, "distill_squad", base_model="bert-base-uncased")
    assert model_card.base_model_of(chained) == "bert-base-uncased"
    ce_only = {**QA_METRICS, "objectives": []}
    card = ModelCard(str(model_card.qa_student_card(tiny_config(), ce_only, "distilbert-base-uncased", None,
                                                    data_dir(tmp_path), "student_finetune")))
    assert card.data.base_model == "distilbert-base-uncased" and card.data.datasets is None  # synthetic: no hub id
    assert "fine-tuned on SQuAD with the gold-span cross-entropy only" in card.text


def test_the_bundle_card_keeps_the_app_readme_and_names_what_it_was_exported_from(tmp_path):
    metrics = {"exact_match": 80.0, "f1": 87.0, "n_questions": 100, "onnx_variant": "int8",
               "onnx_decided_by": "latency"}
    student = model_folder(tmp_path, "distill_squad", base_model="distilbert-base-uncased")
    (student / "config.json").write_text('{"model_type": "distilbert"}')
    card = ModelCard(str(model_card.bundle_card(tiny_config(), metrics, "# Question-answering bundle\n\nFiles.\n",
                                                student, data_dir(tmp_path))))
    assert card.text.lstrip().startswith("# Question-answering bundle") and scores(card) == {"exact_match": 80.0,
                                                                                            "f1": 87.0}
    assert card.data.base_model == "distilbert-base-uncased" and card.data.library_name == "onnx"
    assert {result.dataset_split for result in card.data.eval_results} == {"validation[:100]"}
    assert {"onnx", "coreml", "int8"} <= set(card.data.tags)
    assert f"- exported from: {student} (DistilBERT)" in card.text


def test_the_bundle_card_scores_the_shipped_graph_not_the_pytorch_model_it_came_from(tmp_path):
    # An int8 graph whose answers differ from PyTorch's: the card's F1 is the graph's (bundle metrics' f1).
    metrics = {"exact_match": 78.0, "f1": 84.25, "pytorch_f1": 91.5, "n_questions": 100, "onnx_variant": "int8",
               "onnx_decided_by": "latency"}
    student = model_folder(tmp_path, "distill_squad")
    (student / "config.json").write_text('{"model_type": "distilbert"}')
    card = ModelCard(str(model_card.bundle_card(tiny_config(), metrics, "# Question-answering bundle\n",
                                                student, data_dir(tmp_path))))
    assert scores(card) == {"exact_match": 78.0, "f1": 84.25}  # not the PyTorch model's 91.5


def test_an_evaluated_only_teacher_claims_no_license_and_no_training(tmp_path):
    cfg = tiny_config(teacher={"pretrained_qa": "deepset/bert-base-uncased-squad2"})
    metrics = {**QA_METRICS, "fine_tuned_here": False}
    del metrics["device"]
    card = ModelCard(str(model_card.qa_teacher_card(cfg, metrics, data_dir(tmp_path), None, "teacher")))
    assert card.data.license is None and card.data.base_model == "deepset/bert-base-uncased-squad2"
    assert "taken as it is" in card.text and "- trained on: not trained here" in card.text
