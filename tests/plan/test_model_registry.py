"""pipeline/plan/model_registry.py: which models a config's DAG exports, and which one the bundle ships."""

from pipeline.plan.config import load_config
from pipeline.plan.model_registry import bundled_model, exported_models, trained_models
from tests.paths import PROJECT_ROOT
from tests.stage_fixtures import tiny_config


def test_the_models_export_models_names_are_exported_in_a_fixed_order_and_a_deploy_exports_its_one_model():
    default = load_config(PROJECT_ROOT / "configs" / "default.yaml")
    assert exported_models(default) == {"student": "distill_squad", "student_ce_only": "student_finetune",
                                        "teacher": "teacher"}
    some = tiny_config(export={"models": ["teacher", "student"]})
    assert list(exported_models(some)) == ["student", "teacher"]
    assert trained_models(some) == exported_models(default)  # what is left out is still trained, and scored
    assert bundled_model(default) == "student"
    deploy = tiny_config(deploy={"model": "./my-qa-model"}, export={"models": ["student"]})
    assert exported_models(deploy) == trained_models(deploy) == {"deployed": "deployed_model"}
    assert bundled_model(deploy) == "deployed"
