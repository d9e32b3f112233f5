"""pipeline/model_card.py: each card parses back with huggingface_hub, with the scores of metrics.json."""

from huggingface_hub import ModelCard

from pipeline import model_card
from tests.stage_fixtures import tiny_config

QA_METRICS = {"exact_match": 81.25, "f1": 88.5, "n_examples": 16, "steps": 40, "objectives": ["tinybert"],
              "alpha_task": 0.5, "teacher_f1": 90.0, "f1_relative_to_teacher": 0.9833, "device": "cpu"}


def scores(card: ModelCard) -> dict[str, float]:
    return {result.metric_type: result.metric_value for result in card.data.eval_results}


def test_a_student_card_carries_its_measured_scores_task_and_build(tmp_path):
    cfg = tiny_config()
    path = model_card.write_model_card(model_card.qa_student_card(cfg, QA_METRICS, "artifacts/teacher", "distill_squad"),
                                       tmp_path)
    card = ModelCard.load(path)
    assert card.data.pipeline_tag == "question-answering" and card.data.license == "apache-2.0"
    assert scores(card) == {"exact_match": 81.25, "f1": 88.5}
    assert {result.task_type for result in card.data.eval_results} == {"question-answering"}
    assert card.data.datasets == ["synthetic-squad"] and card.data.base_model is None  # a teacher built here
    assert model_card.config_hash(cfg) in card.text and "tinybert" in card.text and "98.3%" in card.text
    assert "- trained on: cpu" in card.text and "- machine: " in card.text


def test_a_hub_teacher_is_the_base_model_and_a_local_folder_is_not(tmp_path):
    hub = tiny_config(teacher={"pretrained": "bert-base-uncased"})
    assert ModelCard(str(model_card.qa_teacher_card(hub, QA_METRICS))).data.base_model == "bert-base-uncased"
    local = tiny_config(teacher={"pretrained": str(tmp_path)})
    assert ModelCard(str(model_card.qa_teacher_card(local, QA_METRICS))).data.base_model is None


def test_the_bundle_card_keeps_the_app_readme_as_its_body():
    metrics = {"exact_match": 80.0, "f1": 87.0, "n_questions": 100, "onnx_variant": "int8",
               "onnx_decided_by": "latency"}
    card = ModelCard(str(model_card.bundle_card(tiny_config(), metrics, "# Question-answering bundle\n\nFiles.\n")))
    assert card.text.lstrip().startswith("# Question-answering bundle") and scores(card) == {"exact_match": 80.0,
                                                                                            "f1": 87.0}
    assert {"onnx", "coreml", "int8"} <= set(card.data.tags)
