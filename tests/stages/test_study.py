"""Target study: run configs per variant, the statistics of the summary, and the planned DAG."""

import json

import pytest

from pipeline.plan import study_runs
from pipeline.plan.config import STUDY_VARIANTS, ConfigError, PipelineConfig, from_dict, to_dict
from pipeline.stages import study
from tests.paths import PROJECT_ROOT
from tests.dry_run import dry_run
from tests.stage_fixtures import tiny_config


def test_each_variant_changes_only_its_objectives_and_the_seed():
    full = to_dict(tiny_config())
    configs = {run: study_runs.run_config(full, run, 7) for run in study_runs.run_names(list(STUDY_VARIANTS))}
    assert list(configs) == ["ce_only", "distilbert", "pkd_skip", "pkd_last", "tinybert"]
    for run, config in configs.items():
        assert config["seed"] == 7
        from_dict(PipelineConfig, config)  # every run config validates
        assert {k: v for k, v in config.items() if k not in ("seed", "distill_squad")} == \
            {k: v for k, v in full.items() if k not in ("seed", "distill_squad")}
        # Only the objectives (and PKD's scheme) differ: the same budget, weights and augmentation for all.
        changed = {k for k in full["distill_squad"] if config["distill_squad"][k] != full["distill_squad"][k]}
        assert changed <= {"objectives", "pkd"}
    assert configs["distilbert"]["distill_squad"]["objectives"] == ["distilbert"]
    assert configs["pkd_skip"]["distill_squad"]["objectives"] == ["distilbert", "pkd"]
    assert configs["pkd_skip"]["distill_squad"]["pkd"]["scheme"] == "skip"
    assert configs["pkd_last"]["distill_squad"]["pkd"]["scheme"] == "last"
    assert configs["tinybert"]["distill_squad"]["objectives"] == ["tinybert"]
    assert full["distill_squad"]["objectives"] == tiny_config().distill_squad.objectives  # the input is not changed


def test_the_study_needs_two_seeds_and_the_baseline():
    with pytest.raises(ConfigError, match="study.seeds"):
        tiny_config(study={"seeds": [1]})
    with pytest.raises(ConfigError, match="study.variants"):
        tiny_config(study={"variants": ["distilbert"]})


def write_run(folder, f1, predictions, seconds=10.0):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"exact_match": f1, "f1": f1, "train_seconds": seconds}))
    (folder / "predictions.json").write_text(json.dumps(predictions))


def test_the_summary_pairs_runs_by_seed_and_calls_only_a_clear_difference_significant(tmp_path):
    cfg = tiny_config(study={"seeds": [1, 2, 3], "variants": ["ce_only", "distilbert", "pkd_skip"]})
    gold = {f"q{i}": ["alpha beta"] for i in range(50)}
    right = {question_id: "alpha beta" for question_id in gold}
    # distilbert beats ce_only by exactly 1 on every seed (a seed-to-seed spread of 4 does not matter when paired);
    # pkd_skip is +3, -3, 0: no clear difference.
    f1 = {"ce_only": [80.0, 84.0, 82.0], "distilbert": [81.0, 85.0, 83.0], "pkd_skip": [83.0, 81.0, 82.0]}
    for variant, values in f1.items():
        for seed, value in zip(cfg.study.seeds, values):
            write_run(tmp_path / variant / f"seed{seed}", value, right)
    summary = study.summarize(cfg, tmp_path, gold, teacher_f1=90.0)
    distilbert = summary["variants"]["distilbert"]
    assert distilbert["f1"]["mean"] == 83.0
    assert distilbert["f1_minus_ce_only"]["mean"] == 1.0 and distilbert["f1_minus_ce_only"]["std"] == 0.0
    assert distilbert["f1_minus_ce_only"]["significant"] is True
    assert summary["variants"]["pkd_skip"]["f1_minus_ce_only"]["significant"] is False
    assert "f1_minus_ce_only" not in summary["variants"]["ce_only"]
    assert distilbert["f1_relative_to_teacher"] == pytest.approx(83.0 / 90.0, abs=1e-4)
    assert set(distilbert["f1_bootstrap_standard_error_by_seed"].values()) == {0.0}  # every answer right
    table = study.markdown(summary, {"model_name": "test CPU"})
    assert "| distilbert | 83.00 ± 2.00 |" in table and "+1.00 (significant)" in table and "test CPU" in table


def test_the_study_target_plans_every_run_from_the_same_student(tmp_path):
    completed = dry_run(tmp_path, [PROJECT_ROOT / "configs" / "test.yaml"], {"output_root": str(tmp_path / "out")},
                        target="study")
    assert completed.returncode == 0, completed.stderr[-2000:]
    n_runs = len(study_runs.run_names(tiny_config().study.variants)) * len(tiny_config().study.seeds)
    assert f"study_run {n_runs}" in " ".join(completed.stdout.split())
    planned = " ".join(completed.stdout.split())
    assert "distill_pretrain 2" in planned and "init_student 2" in planned  # the student and its random-init ablation
    assert "export_onnx" not in completed.stdout
