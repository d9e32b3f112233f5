"""Stages benchmark and report: the report's tables, plots and summary schema. The timing machinery the benchmark
calls: tests/measurement/; the builds it times and the entries it lists: tests/export/test_full_size_builds.py,
tests/stages/test_int8_search.py, tests/export/test_peers.py."""

import json

import pytest

from pipeline.plan.config import BenchmarkConfig, PipelineConfig
from pipeline.reporting import formatting, markdown, plots, summary
from pipeline.stages import benchmark
from tests.paths import PROJECT_ROOT


def test_openvino_runs_the_fastest_static_graph_the_int8_search_passed():
    search = {"candidates": {"dynamic": {"recipe": {"format": "qoperator"}, "latency_ms": {"p50": 1.0, "p90": 1.0}},
                             "slow-qdq": {"recipe": {"format": "qdq"}, "latency_ms": {"p50": 3.0, "p90": 3.0}},
                             "fast-qdq": {"recipe": {"format": "qdq"}, "latency_ms": {"p50": 2.0, "p90": 9.0}}}}
    assert benchmark.fastest_static_graph(search) == "fast-qdq"
    assert benchmark.fastest_static_graph({"candidates": {"dynamic": search["candidates"]["dynamic"]}}) is None


def test_ratios_and_missing_timings():
    artifacts = {"a": {"latency_ms": {"seq384": {"threads1": {"p50": 10.0, "p90": 11.0}}}},
                 "b": {"latency_ms": None}}
    assert formatting.p50(artifacts.get("a"), 384, 1) == 10.0
    assert formatting.p50(artifacts.get("b"), 384, 1) is None and formatting.p50(artifacts.get("c"), 384, 1) is None
    assert formatting.ratio(20.0, 10.0) == 2.0 and formatting.ratio(None, 1.0) is None and formatting.ratio(1.0, None) is None


def test_the_gates_say_how_many_dev_questions_they_scored():
    recorded = [{"n_questions": 1000}, {"n_questions": None}]  # a CoreML package scored on no dev set
    assert markdown.gated_questions(recorded, 1000) == "the first 1000 dev questions (export.gates.dev_questions)"
    assert markdown.gated_questions([{"n_questions": 119}], 1000) == (
        "119 gated dev questions (a dev set smaller than export.gates.dev_questions 1000 plus the int8 tuning "
        "questions is split between them: quantize.json's dev_split)")
    assert markdown.gated_questions([{"n_questions": 42}], None).startswith(
        "42 gated dev questions (a dev set smaller than export.gates.dev_questions all plus")
    assert markdown.gated_questions([], 1000) == "the first 1000 dev questions (export.gates.dev_questions)"


def test_the_loss_plot_shows_only_loss_terms():
    records = [{"step": 50, "epoch": 0.1, "lr": 1e-3, "tokens_per_second": 9e3, "effective_batch_size": 16,
                "loss": 2.0, "task": 1.5, "tb_hidden": 0.3, "phase": "intermediate"},
               {"step": 100, "epoch": 0.2, "lr": 9e-4, "loss": 1.0, "tb_prediction": 0.5, "phase": "prediction"}]
    assert plots.loss_terms(records) == ["loss", "task", "tb_hidden", "tb_prediction"]


def test_the_summary_schema_refuses_a_wrong_shape():
    import jsonschema

    schema = json.loads((PROJECT_ROOT / "configs" / "summary.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"target_size_mb": 207}, schema)


def test_the_report_shows_chromium_entries_at_each_thread_count_in_the_summary_shape(tmp_path):
    import jsonschema

    chromium = {"name": "student/onnx-web-chromium-int8-optimized", "model": "student", "format": "onnx-web-chromium",
                "precision": "int8-optimized", "path": "bundle/model.int8.onnx", "size_mb": 0.456, "recipe": "int8",
                "runtime": "onnxruntime-web 1.30.0 (WebAssembly, in Chromium 156.0, cross-origin isolated)",
                "timed": True, "untimed_reason": None, "runs": 20, "peak_rss_mib": 279.0,
                "latency_ms": {"seq128": {"threads1": {"p50": 10.8, "p90": 20.8}, "threads2": {"p50": 7.5, "p90": 9.1}},
                               "seq384": None}}
    skipped = {"what": "Chromium timings (onnxruntime-web in a page)", "reason": "no Chromium at /nowhere"}
    (tmp_path / "benchmark_web.json").write_text(json.dumps({"artifacts": [chromium], "skipped": [skipped]}))
    machine = {"cpu": "a CPU", "cores": 2, "versions": {}}
    benchmark = summary.with_web_timings({"machine": machine, "artifacts": []}, tmp_path / "benchmark_web.json")
    items = benchmark["artifacts"]
    cfg = PipelineConfig(benchmark=BenchmarkConfig(threads=[1], browser_threads=[1, 2]))
    table = markdown.artifact_table(items, cfg)
    assert "seq 128, 2 thr p50 / p90 ms" in table  # Chromium's thread count, beyond benchmark.threads
    assert "| 10.80 / 20.80 | 7.50 / 9.10 | n/a | n/a | 279 |" in table
    summary_data = {"target_size_mb": 207, "machine": machine, "artifacts": items, "full_size": [], "gemm_floor": None,
                    "ratios": {}, "peers": [], "models": {name: {"params": 1, "exact_match": 1.0, "f1": 1.0}
                                             for name in ("teacher", "student", "student_ce_only")},
                    "gates": [], "skipped_timings": benchmark["skipped_timings"], "npu": {},
                    "bundle": {"onnx_model": "model.int8.onnx", "onnx_variant": "int8", "int8_note": None,
                               "shipped": ["model.fp32.onnx", "model.int8.onnx", "model.int8.ort"], "rejected_why": {},
                               "coreml_executed": None}}
    jsonschema.validate(summary_data, json.loads((PROJECT_ROOT / "configs" / "summary.schema.json").read_text()))
    note = " ".join(markdown.javascript_note(summary_data, cfg))
    assert "onnx-web-chromium in onnxruntime-web 1.30.0 (WebAssembly, in Chromium 156.0, cross-origin isolated)" in note
    assert "Chromium: WebAssembly threads 1, 2" in note
    assert markdown.skipped_note(summary_data["skipped_timings"]) == [
        "", "Not timed on this machine: Chromium timings (onnxruntime-web in a page) (no Chromium at /nowhere)."]
