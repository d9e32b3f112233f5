"""Typed config: loading, errors that name the key, and the generated schema Snakemake validates against."""

import re

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from pipeline.plan.config import ConfigError, PipelineConfig, from_dict, load_config, pipeline_schema_yaml, to_dict, deep_merge
from tests.paths import PROJECT_ROOT

CONFIGS = PROJECT_ROOT / "configs"


def test_committed_schema_is_generated_from_the_dataclasses():
    assert (CONFIGS / "schema.yaml").read_text() == pipeline_schema_yaml(), (
        "configs/schema.yaml is stale: run `python -m pipeline schema > configs/schema.yaml`"
    )


@pytest.mark.parametrize("name", ["default.yaml", "test.yaml", "paper.yaml", "deploy.yaml"])
def test_shipped_configs_load_and_validate(name):
    cfg = load_config(CONFIGS / name)
    assert isinstance(cfg, PipelineConfig)
    validate(yaml.safe_load((CONFIGS / name).read_text()), str(CONFIGS / "schema.yaml"))


def test_round_trip_through_plain_dict():
    cfg = load_config(CONFIGS / "default.yaml")
    assert from_dict(PipelineConfig, to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    "data, message",
    [
        ({"teacher": {"finetune": {"lerning_rate": 0.1}}}, "teacher.finetune.lerning_rate: unknown config key"),
        ({"teacher": {"finetune": {"learning_rate": "fast"}}}, "teacher.finetune.learning_rate: expected a number"),
        ({"teacher": {"finetune": {"batch_size": 0}}}, "teacher.finetune.batch_size: 0 must be >= 1"),
        ({"teacher": {"finetune": {"batch_size": True}}}, "teacher.finetune.batch_size: expected an integer"),
        ({"data": {"on_bad_example": "ignore"}}, "data.on_bad_example: 'ignore' is not one of"),
        ({"squad": {"max_seq_length": 64, "doc_stride": 64}}, "squad.doc_stride"),
        ({"teacher": {"architecture": {"hidden_size": 30, "num_heads": 4}}}, "teacher.architecture.num_heads"),
        ({"data": "synthetic"}, "data: expected a mapping"),
        ({"compute": {"nodes": 2, "rdzv_endpoint": "head-node"}}, "compute.rdzv_endpoint: 'head-node' is not HOST:PORT"),
        ({"export": {"models": ["teacher"]}}, "export.models: ['teacher'] leaves out student, the model the bundle"),
        ({"export": {"models": ["student", "student"]}}, "export.models: ['student', 'student'] lists a model twice"),
        ({"export": {"models": ["student", "tinybert"]}}, "export.models[1]: 'tinybert' is not one of"),
        ({"export": {"phone_models": ["teacher"]}},
         "export.phone_models: ['teacher'] leaves out student, the model the bundle ships"),
        ({"export": {"models": ["student", "teacher"], "phone_models": ["student", "student_ce_only"]}},
         "export.phone_models: ['student_ce_only'] not in export.models ['student', 'teacher']"),
        ({"export": {"phone_models": ["student", "student"]}},
         "export.phone_models: ['student', 'student'] lists a model twice"),
    ],
)
def test_bad_values_fail_naming_the_key(data, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        from_dict(PipelineConfig, data)


def test_snakemake_schema_validation_rejects_a_typo_before_any_job():
    with pytest.raises(WorkflowError, match="lerning_rate"):
        validate({"teacher": {"finetune": {"lerning_rate": 0.1}}}, str(CONFIGS / "schema.yaml"))


def test_missing_or_invalid_config_file_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("teacher: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml: invalid YAML"):
        load_config(broken)


def test_paper_recipe_merged_over_the_default_keeps_the_papers_budgets():
    # Snakemake merges --configfile configs/paper.yaml over configs/default.yaml: the offline default's
    # small-model settings must not leak into the real recipe.
    merged = deep_merge(yaml.safe_load((CONFIGS / "default.yaml").read_text()),
                        yaml.safe_load((CONFIGS / "paper.yaml").read_text()))
    cfg = from_dict(PipelineConfig, merged)
    assert cfg.teacher.pretrained == "bert-base-uncased" and not cfg.squad.freeze_word_embeddings
    assert cfg.distill_pretrain.train.learning_rate == 5e-4 and not cfg.distill_pretrain.restrict_ce_to_mask
    assert cfg.distill_squad.train.learning_rate == 3e-5 and cfg.teacher.finetune.learning_rate == 3e-5
    assert cfg.distill_squad.distilbert.temperature == 2.0 and cfg.distill_squad.alpha_task == 0.5
