"""The published figures come from committed result files (pipeline/reporting/results_tables.py)."""

import json

from pipeline.reporting import results_tables


def test_the_readme_and_results_tables_are_what_the_committed_result_files_give():
    assert results_tables.render(check=True) == [], "run `python -m pipeline render-results` and commit"


def fake_run_root(root, teacher_f1=93.0, student_f1=93.5):
    """An output root with the files collect-run reads, as a finished default run writes them."""
    metrics = {"data": {"n_train_examples": 100, "n_dev_examples": 20},
               "teacher_pretrain": {"heldout_mlm_accuracy": 0.495},
               "teacher": {"exact_match": 92.4, "f1": teacher_f1},
               "distill_pretrain/main": {"student_mlm_accuracy": 0.5, "teacher_mlm_accuracy": 0.541},
               "distill_squad": {"exact_match": 92.0, "f1": student_f1, "f1_relative_to_teacher": student_f1 / teacher_f1},
               "student_finetune": {"exact_match": 91.5, "f1": 92.2},
               "bundle": {"onnx_variant": "int8", "f1": 93.4, "pytorch_f1": 93.5}}
    for folder, values in metrics.items():
        (root / folder).mkdir(parents=True)
        (root / folder / "metrics.json").write_text(json.dumps(values))
    latency = {"seq384": {"threads1": {"p50": 112.0, "p90": 115.0}}}
    summary = {"target_size_mb": 207, "models": {"teacher": {"params": 1000}, "student": {"params": 500}},
               "artifacts": [], "peers": [],
               "full_size": [{"name": "distilbert/onnx-int8-optimized", "size_mb": 66.5, "recipe": "int8",
                              "latency_ms": latency},
                             {"name": "distilbert/coreml-4bit", "size_mb": 33.2, "latency_ms": None}],
               "gates": [{"model": "student", "variant": "onnx-int8", "passed": True, "shipped": True, "gates": {}},
                         {"model": "student_ce_only", "variant": "coreml-4bit", "passed": False, "shipped": False,
                          "gates": {}}]}
    (root / "report").mkdir()
    (root / "report" / "summary.json").write_text(json.dumps(summary))
    (root / "study").mkdir()
    lead = {"n": 5, "mean": 2.5, "std": 1.0, "low": 1.26, "high": 3.74, "significant": True}
    (root / "study" / "summary.json").write_text(json.dumps({
        "seeds": [1, 2, 3, 4, 5], "confidence": 0.95, "n_dev_questions": 3781, "teacher_f1": teacher_f1,
        "variants": {"ce_only": {"f1": {"mean": 91.0, "std": 1.5, "low": 89.1, "high": 92.9},
                                 "f1_relative_to_teacher": 91.0 / teacher_f1},
                     "tinybert": {"f1": {"mean": 93.5, "std": 0.5, "low": 92.9, "high": 94.1},
                                  "f1_relative_to_teacher": 93.5 / teacher_f1, "f1_minus_ce_only": lead}}}))
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "teacher_pretrain.tsv").write_text("s\th:m:s\n94.2\t0:01:34\n")


def test_a_collected_run_renders_every_figure_from_its_files(tmp_path):
    fake_run_root(tmp_path / "artifacts")
    results = tmp_path / "results"
    results_tables.collect_run(tmp_path / "artifacts", "xeon-native", "native", 812.0, 0, "snakemake --cores 2",
                               results_dir=results)
    run = json.loads((results / "xeon-native" / "run.json").read_text())
    assert run["rule_seconds"] == {"teacher_pretrain": 94.2} and run["exit_code"] == 0
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("intro\n<!-- results:headline -->\nold 112.2 ms\n<!-- /results:headline -->\n"
                                        "<!-- results:claims -->\n<!-- /results:claims -->\nend\n")
    (tmp_path / "docs" / "results.md").write_text("<!-- results:runs -->\n<!-- /results:runs -->\n")
    (tmp_path / "docs" / "distillation.md").write_text("<!-- results:study -->\n<!-- /results:study -->\n")
    assert results_tables.render(project_root=tmp_path, results_dir=results) == [
        str(tmp_path / "README.md"), str(tmp_path / "docs" / "results.md"), str(tmp_path / "docs" / "distillation.md")]
    study = (tmp_path / "docs" / "distillation.md").read_text()
    assert "| tinybert | 93.50 ± 0.50 | [92.90, 94.10] | 100.5% | +2.50 (significant) | [+1.26, +3.74] |" in study
    assert "at least 97% of the teacher's dev F1 on average: holds (100.5% of the teacher)." in study
    assert "paired interval above zero: holds (+2.50 F1, 95% interval [+1.26, +3.74])." in study
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("intro\n<!-- results:headline -->\nThe default run") and readme.endswith("-->\nend\n")
    assert "old 112.2" not in readme and "| 93.50 = 100.5 % of the teacher |".replace(" %", "%") in readme
    assert ("CPU, SIMD the CPU's own: both hold (100.5% of the teacher; +2.50 F1, 95% interval [+1.26, +3.74]; "
            "5 seeds) ([docs/distillation.md]") in readme
    assert "66.5 MB, 112.0 ms" in readme and "6.2x below the paper's 207 MB" in readme and "| 13:32 (exit code 0) |" in readme
    runs = (tmp_path / "docs" / "results.md").read_text()
    assert "| teacher_finetune: dev EM / F1 | 92.40 / 93.00 |" in runs
    assert "| variants rejected by the gates | student_ce_only/coreml-4bit |" in runs
    assert "| shipped variants that passed every gate | 1 of 1 |" in runs
    assert results_tables.render(check=True, project_root=tmp_path, results_dir=results) == []


def test_the_study_says_a_claim_is_not_shown_when_its_interval_reaches_zero():
    lead = {"n": 5, "mean": 1.5, "std": 2.0, "low": -0.98, "high": 3.98, "significant": False}
    study = {"seeds": [1, 2, 3, 4, 5], "confidence": 0.95,
             "variants": {"tinybert": {"f1_relative_to_teacher": 0.962, "f1_minus_ce_only": lead}}}
    first, second = results_tables.claim_lines(study)
    assert first.endswith("does not hold (96.2% of the teacher).")
    assert second.endswith("not shown (+1.50 F1, 95% interval [-0.98, +3.98]).")
    assert results_tables.claim_lines({"variants": {"ce_only": {}}}) == [
        "The claims are not measured here: no `tinybert` variant in this study."]


def test_the_headline_comes_from_the_native_run_with_a_study(tmp_path):
    results = tmp_path / "results"
    for name, teacher_f1, studied in (("a-native", 80.0, False), ("xeon-native", 93.0, True)):
        root = tmp_path / name
        fake_run_root(root, teacher_f1=teacher_f1)
        if not studied:
            (root / "study" / "summary.json").unlink()
        results_tables.collect_run(root, name, "native", 600.0, 0, "snakemake --cores 2", results_dir=results)
    runs = results_tables.read_runs(results)
    assert [run["name"] for run in runs] == ["a-native", "xeon-native"] and runs[0]["study"] is None
    headline = results_tables.blocks(runs)["headline"]
    assert "`results/xeon-native/`" in headline and "a-native" not in headline


def test_minutes_rounds_to_the_second_before_splitting_off_the_minutes():
    assert results_tables.minutes(239.7) == "4:00"  # not "3:60"
    assert results_tables.minutes(204.1) == "3:24"
    assert results_tables.minutes(59.4) == "0:59"
    assert results_tables.minutes(None) == "n/a"


def test_an_artifact_that_is_another_ones_run_is_named_so_in_the_artifacts_table():
    latency = {"seq384": {"threads1": {"p50": 69.3, "p90": 71.0}}}
    naive = {"name": "distilbert/onnx-int8", "size_mb": 66.5, "latency_ms": latency, "peak_rss_mib": 233.0}
    chosen = {**naive, "name": "distilbert/onnx-int8-optimized", "recipe": "int8", "same_run_as": naive["name"]}
    run = {"name": "a-run", "cpu": "AMD EPYC", "simd_flags": ["avx2"], "simd": "native",
           "summary": {"artifacts": [], "full_size": [naive, chosen]}}
    table = results_tables.artifacts_table(run)
    assert "| distilbert/onnx-int8 | 66.5 | n/a | n/a | 69.3 / n/a | 233 |" in table
    assert ("| distilbert/onnx-int8-optimized (int8), the same run as distilbert/onnx-int8 | 66.5 | n/a | n/a | "
            "69.3 / n/a | 233 |") in table


def test_the_headline_shows_each_peer_once_an_openvino_one_at_its_faster_precision(tmp_path):
    fake_run_root(tmp_path / "artifacts")
    results_tables.collect_run(tmp_path / "artifacts", "a-native", "native", 600.0, 0, "snakemake --cores 2",
                               results_dir=tmp_path / "results")
    run, = results_tables.read_runs(tmp_path / "results")

    def peer(name, ratio):
        return {"name": name, "tool": f"the tool of {name}",
                "latency": {"seq384": {"threads1": {"ratio": ratio, "verdict": "behind" if ratio < 1 else "ahead"}}}}

    run["summary"]["peers"] = [peer("distilbert/torch-dynamic-int8", 1.14), peer("distilbert/openvino-nncf-int8-f32", 0.76),
                               peer("distilbert/openvino-nncf-int8-default", 0.71),
                               peer("distilbert/openvino-ours-int8-f32", 0.85),
                               {**peer("distilbert/openvino-ours-int8-default", 0.0), "latency": {"seq384": None}}]
    rows = [line for line in results_tables.headline(run).splitlines() if "peer p50 / ours" in line]
    assert rows == ["| distilbert/torch-dynamic-int8 (the tool of distilbert/torch-dynamic-int8), peer p50 / ours | 1.14x (ahead) |",
                    "| distilbert/openvino-nncf-int8-default (the tool of distilbert/openvino-nncf-int8-default), peer p50 / "
                    "ours | 0.71x (behind) |",
                    "| distilbert/openvino-ours-int8-f32 (the tool of distilbert/openvino-ours-int8-f32), peer p50 / ours | "
                    "0.85x (behind) |"]
