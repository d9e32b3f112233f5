"""Stage distill_squad: every objective end to end from the config, and bad configs caught before training."""

import json

import pytest
import torch
from transformers import BertConfig, DistilBertForMaskedLM

from pipeline.config import ConfigError
from pipeline.stages import distill_squad
from tests.stage_fixtures import build_tiny_artifacts, tiny_config


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return build_tiny_artifacts(tmp_path_factory.mktemp("tiny"))


def run_distill_squad(artifacts, tmp_path, teacher=True, **distill_squad_overrides):
    cfg = tiny_config(distill_squad=distill_squad_overrides)
    return distill_squad.run(
        cfg, artifacts["student"], artifacts["qa_teacher"] if teacher else None, artifacts["data"],
        tmp_path / "out", tmp_path / "work",
    )


def logged_terms(tmp_path) -> set[str]:
    lines = (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()
    return set(json.loads(lines[-1]))


@pytest.mark.parametrize(
    "objectives, expected_terms",
    [
        (["distilbert"], {"task", "kd"}),
        (["distilbert", "pkd"], {"task", "kd", "pkd"}),  # PKD = CE + KD + patient loss
        (["tinybert"], {"task", "tb_attention", "tb_hidden", "tb_embedding", "tb_prediction"}),
        (["distilbert", "pkd", "tinybert"], {"task", "kd", "pkd", "tb_attention", "tb_hidden"}),
    ],
)
def test_each_objective_trains_end_to_end_and_reports_dev_scores(artifacts, tmp_path, objectives, expected_terms):
    metrics = run_distill_squad(artifacts, tmp_path, objectives=objectives)
    assert metrics["objectives"] == objectives
    assert 0.0 <= metrics["f1"] <= 100.0 and metrics["steps"] == 4
    assert expected_terms <= logged_terms(tmp_path)
    assert metrics["teacher_f1"] == 2.0  # read from the teacher's metrics.json
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert metrics["teacher_logits_cached"] == (objectives == ["distilbert"])


def test_teacher_logit_cache_is_reused_across_runs(artifacts, tmp_path):
    first = run_distill_squad(artifacts, tmp_path)
    cache_files = list((tmp_path / "work").glob("teacher_logits-*.safetensors"))
    assert len(cache_files) == 1
    second = run_distill_squad(artifacts, tmp_path)
    assert second["f1"] == first["f1"]  # same seed, same cached targets: same model


def test_ce_only_baseline_uses_no_teacher(artifacts, tmp_path):
    metrics = run_distill_squad(artifacts, tmp_path, teacher=False)
    assert metrics["objectives"] == [] and "teacher_f1" not in metrics
    assert logged_terms(tmp_path) >= {"task", "loss"} and "kd" not in logged_terms(tmp_path)


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"objectives": ["distilbert", "mystery"]}, r"distill_squad\.objectives\[1\]"),
        ({"distilbert": {"temperature": 0}}, r"distill_squad\.distilbert\.temperature"),
        ({"pkd": {"weight": -1.0}}, r"distill_squad\.pkd\.weight"),
        ({"alpha_task": -0.5}, r"distill_squad\.alpha_task"),
    ],
)
def test_bad_config_values_fail_at_load_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        tiny_config(distill_squad=overrides)


def test_pkd_without_its_soft_target_term_is_refused_naming_the_missing_objective():
    with pytest.raises(ConfigError, match=r"distill_squad\.objectives.*pkd.*add 'distilbert'"):
        tiny_config(distill_squad={"objectives": ["pkd"]})
    with pytest.raises(ConfigError, match="add 'distilbert'"):
        tiny_config(distill_squad={"objectives": ["pkd", "tinybert"]})
    assert tiny_config(distill_squad={"objectives": ["pkd", "distilbert"]}).distill_squad.objectives == ["pkd", "distilbert"]


def test_layer_mapping_outside_the_teacher_fails_before_training(artifacts, tmp_path):
    with pytest.raises(ConfigError, match=r"distill_squad\.tinybert\.layer_mapping"):
        run_distill_squad(artifacts, tmp_path, objectives=["tinybert"], tinybert={"layer_mapping": [5]})
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_width_mismatch_without_projection_fails_naming_the_key(artifacts):
    student_config = DistilBertForMaskedLM.config_class.from_pretrained(artifacts["student"])
    student_config.dim = student_config.dim * 2
    teacher_config = BertConfig.from_pretrained(artifacts["qa_teacher"])
    cfg = tiny_config(distill_squad={"objectives": ["tinybert"], "tinybert": {"projection": False}}).distill_squad
    with pytest.raises(ConfigError, match=r"distill_squad\.tinybert\.projection"):
        distill_squad.distillation_plan(cfg, student_config, teacher_config)
    cfg_with_projection = tiny_config(distill_squad={"objectives": ["tinybert"]}).distill_squad
    student_config.n_heads = teacher_config.num_attention_heads
    plan = distill_squad.distillation_plan(cfg_with_projection, student_config, teacher_config)
    assert plan["needs_projection"] is True


@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_word_embeddings_keeps_only_the_word_embeddings_fixed(artifacts, tmp_path, freeze):
    from safetensors.torch import load_file

    cfg = tiny_config(squad={"freeze_word_embeddings": freeze})
    distill_squad.run(cfg, artifacts["student"], None, artifacts["data"], tmp_path / "out", tmp_path / "work")
    before, after = load_file(artifacts["student"] / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    words = "distilbert.embeddings.word_embeddings.weight"
    assert torch.equal(before[words], after[words]) == freeze
    positions = "distilbert.embeddings.position_embeddings.weight"
    assert not torch.equal(before[positions], after[positions])
