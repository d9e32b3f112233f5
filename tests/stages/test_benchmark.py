"""Stages benchmark and report: timing in a separate process, profiles, summary schema. The builds the benchmark
times: tests/export/test_full_size_builds.py, tests/stages/test_int8_search.py, tests/export/test_peers.py."""

import json
import subprocess
import sys

import pytest

from pipeline.export import int8, onnx_graph
from pipeline.plan.config import BenchmarkConfig, PipelineConfig
from pipeline.reporting import formatting, markdown, plots, summary
from pipeline.stages import benchmark
from tests.paths import PROJECT_ROOT


@pytest.fixture(scope="module")
def tiny_int8(tmp_path_factory):
    from transformers import DistilBertConfig, DistilBertForQuestionAnswering

    root = tmp_path_factory.mktemp("bench")
    model = DistilBertForQuestionAnswering(DistilBertConfig(vocab_size=200, dim=32, n_layers=2, n_heads=2,
                                                            hidden_dim=64, max_position_embeddings=128))
    model.save_pretrained(root / "pytorch")
    onnx_graph.export_fp32(root / "pytorch", root / "fp32", None)
    naive = int8.Int8Recipe("plain", "qoperator", per_channel=False, attention_int8=False)
    int8.quantize_int8(root / "fp32" / "model.onnx", root / "int8.onnx", naive, reduce_range=False)
    return root


def item(path, fmt="onnx", max_positions=128):
    return {"name": "tiny", "format": fmt, "path": str(path), "max_positions": max_positions, "vocab_size": 200}


def test_each_artifact_is_timed_in_its_own_process_with_its_peak_memory(tiny_int8):
    cfg = BenchmarkConfig(sequence_lengths=[32, 256], threads=[1, 2], runs=2, warmup=1)
    latency, peak_rss_mib = benchmark.measure(item(tiny_int8 / "int8.onnx"), cfg)
    assert latency["seq256"] is None  # longer than the model's 128 positions
    assert set(latency["seq32"]) == {"threads1", "threads2"}
    assert 0 < latency["seq32"]["threads1"]["p50"] <= latency["seq32"]["threads1"]["p90"]
    assert peak_rss_mib > 20  # a Python process with onnxruntime loaded
    torch_latency, torch_rss = benchmark.measure(item(tiny_int8 / "pytorch" / "model.safetensors", "pytorch"), cfg)
    assert torch_latency["seq32"]["threads2"]["p50"] > 0 and torch_rss > peak_rss_mib


def test_the_profile_attributes_kernel_time_to_operator_types(tiny_int8, tmp_path):
    ops = benchmark.profile_ops(tiny_int8 / "int8.onnx", 32, 200, 2, tmp_path)
    assert ops and sum(op["share"] for op in ops) <= 1.0001
    assert any(op["op"] in ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat") for op in ops)


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
        "119 dev questions (the whole dev set, which holds fewer than export.gates.dev_questions: 1000)")
    assert markdown.gated_questions([{"n_questions": 42}], None) == "42 dev questions (the whole dev set)"
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
                    "gates": [], "skipped_timings": benchmark["skipped_timings"]}
    jsonschema.validate(summary_data, json.loads((PROJECT_ROOT / "configs" / "summary.schema.json").read_text()))
    note = " ".join(markdown.javascript_note(summary_data, cfg))
    assert "onnx-web-chromium in onnxruntime-web 1.30.0 (WebAssembly, in Chromium 156.0, cross-origin isolated)" in note
    assert "Chromium: WebAssembly threads 1, 2" in note
    assert markdown.skipped_note(summary_data["skipped_timings"]) == [
        "", "Not timed on this machine: Chromium timings (onnxruntime-web in a page) (no Chromium at /nowhere)."]


def test_session_option_sets_change_speed_settings_not_answers(tiny_int8):
    import numpy as np

    from pipeline.measurement.latency import SESSION_OPTIONS, onnx_session, synthetic_feed

    outputs = {}
    for option_set in SESSION_OPTIONS:
        session = onnx_session(tiny_int8 / "int8.onnx", 1, option_set)
        outputs[option_set] = session.run(None, synthetic_feed(session, 32, 200))
    for start, end in outputs.values():
        assert np.allclose(start, outputs["default"][0], atol=1e-5) and np.allclose(end, outputs["default"][1], atol=1e-5)


def test_a_timing_process_starts_without_torch_or_the_export_libraries():
    # Every timed artifact runs in a fresh process that imports the stage module: what it imports is start-up time
    # charged to each of the benchmark's dozens of processes.
    script = ("import sys, pipeline.stages.benchmark; "
              "print(sorted(m for m in ('torch', 'coremltools', 'pipeline.export.int8') if m in sys.modules))")
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                               cwd=PROJECT_ROOT)
    assert completed.stdout.strip() == "[]"
