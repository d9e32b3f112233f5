"""Integration: the whole Snakemake DAG on configs/test.yaml, then checks of what it wrote.

The DAG runs once for the session (tests/dag_run.py), under an output root whose name has spaces and quotes, and
the hard way: killed with SIGKILL during teacher_pretrain and finished with `--unlock` and `--rerun-incomplete`
(tests/test_resume_after_kill.py checks that recovery)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import PROJECT_ROOT
from tests.dag_run import PRETRAIN_STEPS
from tests.dev_split_records import assert_tuning_steps_read_no_gated_question

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def dag_outputs(dag_run) -> Path:
    return dag_run.root


def read_metrics(path: Path) -> dict:
    return json.loads((path / "metrics.json").read_text())


def test_every_stage_wrote_its_outputs_and_metrics(dag_outputs):
    data = read_metrics(dag_outputs / "data")
    assert data["n_train_examples"] > 0 and data["n_dev_examples"] > 0
    assert read_metrics(dag_outputs / "tokenizer")["vocab_size"] > 5
    pretrain = read_metrics(dag_outputs / "teacher_pretrain")
    assert pretrain["steps"] == PRETRAIN_STEPS and 0.0 <= pretrain["heldout_mlm_accuracy"] <= 1.0
    teacher = read_metrics(dag_outputs / "teacher")
    assert {"exact_match", "f1", "n_examples", "train_seconds", "tokens_per_second"} <= teacher.keys()
    assert teacher["n_examples"] == data["n_dev_examples"] and 0.0 <= teacher["f1"] <= 100.0
    assert (dag_outputs / "teacher" / "model.safetensors").is_file()
    distilled = read_metrics(dag_outputs / "distill_pretrain" / "main")
    assert {"student_mlm_accuracy", "teacher_mlm_accuracy", "peak_memory_mib", "tokens_per_second"} <= distilled.keys()
    assert not (dag_outputs / "distill_pretrain" / "random_init_ablation").exists()  # evidence: target study
    for stage in ("distill_squad", "student_finetune"):
        assert {"exact_match", "f1", "train_seconds", "tokens_per_second"} <= read_metrics(dag_outputs / stage).keys()
    for rule in ("prepare_data", "tokenizer", "teacher_pretrain", "teacher_finetune", "distill_squad"):
        assert (dag_outputs / "logs" / f"{rule}.log").is_file()
        assert (dag_outputs / "benchmarks" / f"{rule}.tsv").is_file()
    for kind, report in (("onnx", "export.json"), ("quantized", "quantize.json"), ("coreml", "coreml.json")):
        assert (dag_outputs / kind / "student" / report).is_file(), f"{kind}/student/{report}"
    assert list(dag_outputs.glob("*/student_ce_only")) == []  # left out: no export, gate or timing of it
    for kind in ("onnx", "quantized", "coreml", "npu"):  # the teacher is trained, not exported (export.models)
        assert not (dag_outputs / kind / "teacher").exists(), kind
    assert (dag_outputs / "bundle" / "manifest.json").is_file()
    # off in configs/test.yaml, and with them the builds around the full-size search
    for folder in ("full_size", "int8_search", "full_size_int8", "peers", "gemm_floor"):
        assert not (dag_outputs / folder).exists(), folder
    assert (dag_outputs / "benchmark" / "benchmark.json").is_file()
    train_log = (dag_outputs / "teacher" / "train_log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in train_log] == [2, 4, 6]


def test_the_official_style_evaluation_cli_scores_the_teachers_predictions(dag_outputs):
    completed = subprocess.run(
        [sys.executable, "-m", "pipeline", "evaluate-predictions", str(dag_outputs / "data" / "dev.json"),
         str(dag_outputs / "teacher" / "predictions.json")],
        capture_output=True, text=True, cwd=PROJECT_ROOT, check=True,
    )
    scores = json.loads(completed.stdout)
    teacher = read_metrics(dag_outputs / "teacher")
    assert scores["total"] == teacher["n_examples"]
    assert scores["f1"] == pytest.approx(teacher["f1"], abs=1e-3)


def test_a_rerun_with_nothing_changed_runs_no_job(dag_run):
    completed = dag_run.dry_run()
    assert "Nothing to be done" in completed.stdout + completed.stderr


@pytest.mark.parametrize("cores", [1, 4])
def test_other_core_counts_find_nothing_to_do_after_a_build(dag_run, cores):
    completed = dag_run.dry_run(cores=cores)
    assert "Nothing to be done" in completed.stdout + completed.stderr, completed.stdout[-3000:]


def test_a_missing_data_file_stops_a_planned_rerun_with_its_key_and_path(dag_run, tmp_path):
    config = tmp_path / "missing.yaml"
    config.write_text("data:\n  squad: /nonexistent/train.json\n  squad_dev: /nonexistent/dev.json\n")
    command = dag_run.snakemake_command("-n")
    command.insert(command.index("--configfile") + 3, str(config))  # merged over the build's own config files
    completed = subprocess.run(command, capture_output=True, text=True)
    assert completed.returncode != 0
    console = completed.stdout + completed.stderr
    assert "data.squad: /nonexistent/train.json" in console and "data.squad_dev: /nonexistent/dev.json" in console


def test_a_config_typo_stops_the_run_before_any_job(tmp_path):
    bad_config = tmp_path / "bad.yaml"
    bad_config.write_text("teacher:\n  finetune:\n    lerning_rate: 0.1\n")
    command = [
        sys.executable, "-m", "snakemake", "--cores", "1", "-n", "--snakefile", str(PROJECT_ROOT / "Snakefile"),
        "--directory", str(PROJECT_ROOT), "--configfile", str(bad_config), "--config", f"output_root={tmp_path}",
    ]
    completed = subprocess.run(command, capture_output=True, text=True)
    assert completed.returncode != 0
    assert "lerning_rate" in completed.stdout + completed.stderr
    assert not (tmp_path / "data").exists()


def test_the_bundle_answers_dev_questions_like_the_pytorch_student_without_torch(dag_outputs, tmp_path):
    out = tmp_path / "answers.json"
    script = (
        "import sys; from pipeline.__main__ import main; code = main(sys.argv[1:]);"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; sys.exit(code)"
    )
    command = [sys.executable, "-c", script, "answer", "--bundle", str(dag_outputs / "bundle"), "--json",
               str(dag_outputs / "data" / "dev.json"), "--out", str(out)]
    subprocess.run(command, capture_output=True, text=True, cwd=PROJECT_ROOT, check=True)
    answers = json.loads(out.read_text())
    pytorch = json.loads((dag_outputs / "distill_squad" / "predictions.json").read_text())
    assert answers.keys() == pytorch.keys()
    # The bundled graph is the chosen int8 variant: on the gated questions, the CLI gives exactly the answers
    # quantize_onnx scored.
    quantized = json.loads((dag_outputs / "quantized" / "student" / "quantize.json").read_text())
    scored = json.loads((dag_outputs / "quantized" / "student" / quantized["bundle_choice"] / "predictions.json")
                        .read_text())
    assert list(scored) == quantized["gated_ids"] and len(scored) < len(answers)
    assert {qid: answers[qid] for qid in scored} == scored  # each question on its own windows, whatever is beside it
    # The fp32 graph through the same torch-free answerer gives PyTorch's answers (the export_onnx gate).
    fp32 = json.loads((dag_outputs / "onnx" / "student" / "fp32" / "predictions.json").read_text())
    assert sum(fp32[k] == pytorch[k] for k in fp32) / len(fp32) >= 0.99


def test_every_int8_tuning_step_read_tuning_questions_only_and_every_stage_scored_the_gated_ones(dag_outputs):
    quantized = assert_tuning_steps_read_no_gated_question(
        dag_outputs / "quantized" / "student", dag_outputs / "onnx" / "student", dag_outputs / "bundle")
    # the test config's int8 search: no static recipe (nothing calibrated for one), the x86 target calibrated
    assert "openvino_calibration" in quantized["reads"] and "static_calibration" not in quantized["reads"]


def test_the_report_summary_follows_its_schema_and_every_timed_artifact_has_numbers(dag_outputs):
    import jsonschema

    summary = json.loads((dag_outputs / "report" / "summary.json").read_text())
    jsonschema.validate(summary, json.loads((PROJECT_ROOT / "configs" / "summary.schema.json").read_text()))
    assert summary["target_size_mb"] == 207 and summary["machine"]["cpu"]
    names = {a["name"] for a in summary["artifacts"]}
    assert {"student/pytorch-fp32", "student/onnx-int8", "student/ort-int8", "student/coreml-4bit",
            "student/coreml-ane", "student/npu-int8-static"} <= names
    emulator = summary["npu"]["student"]["emulator"]  # the NPU graphs' check on the QNN HTP emulation, or why not
    assert emulator["ran"] is True or emulator["reason"]
    if emulator["ran"]:
        assert emulator["n_questions"] == 8 and 0 <= emulator["agreement_with_cpu"]["value"] <= 1
    for artifact in summary["artifacts"]:
        if artifact["format"] == "coreml":
            assert artifact["latency_ms"] is None and "macOS" in artifact["untimed_reason"]
            assert artifact["f1_source"] == "pytorch-proxy"
        elif artifact["format"] == "onnx-npu":  # sized and scored on the CPU; the emulator's time is no latency
            assert artifact["latency_ms"] is None and "not a phone's" in artifact["untimed_reason"]
            assert artifact["f1_source"] == "onnxruntime-cpu" and artifact["f1"] is not None
        else:
            cell = artifact["latency_ms"]["seq64"]["threads2"]
            assert 0 < cell["p50"] <= cell["p90"] and artifact["peak_rss_mib"] > 0
    assert summary["models"]["student"]["params"] < summary["models"]["teacher"]["params"]
    for plot in ("f1_vs_size.png", "f1_vs_latency.png", "loss_curves.png"):
        assert (dag_outputs / "report" / plot).read_bytes()[:4] == b"\x89PNG"
    report_text = (dag_outputs / "report" / "report.md").read_text()
    assert "## Goals" in report_text and "## Android NPU graphs" in report_text
    assert "| student_ce_only |" in report_text  # trained and scored, though export.models leaves it out
    assert "Not exported (export.models): student_ce_only, teacher; trained and scored above only." in report_text


def test_snakemake_builds_its_html_report(dag_run, tmp_path):
    completed = subprocess.run(dag_run.snakemake_command("--report", str(tmp_path / "report.html")),
                               capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert (tmp_path / "report.html").stat().st_size > 10_000


def test_teacher_directory_loads_in_the_transformers_qa_pipeline(dag_outputs):
    import transformers

    record = json.loads((dag_outputs / "data" / "dev.jsonl").read_text().splitlines()[0])
    qa_pipeline = transformers.pipeline("question-answering", model=str(dag_outputs / "teacher"), device="cpu")
    answer = qa_pipeline(question=record["question"], context=record["context"])
    assert answer["answer"] and answer["answer"] in record["context"]
    assert record["context"][answer["start"] : answer["end"]] == answer["answer"]


def test_every_trained_model_and_the_bundle_has_a_model_card_with_its_measured_scores(dag_outputs):
    from huggingface_hub import ModelCard

    expected = {  # folder -> (pipeline tag, metrics.json key per metric type)
        "teacher_pretrain": ("fill-mask", {"accuracy": "heldout_mlm_accuracy"}),
        "teacher": ("question-answering", {"exact_match": "exact_match", "f1": "f1"}),
        "distill_pretrain/main": ("fill-mask", {"accuracy": "student_mlm_accuracy"}),
        "distill_squad": ("question-answering", {"exact_match": "exact_match", "f1": "f1"}),
        "student_finetune": ("question-answering", {"exact_match": "exact_match", "f1": "f1"}),
        "bundle": ("question-answering", {"exact_match": "exact_match", "f1": "f1"}),
    }
    for folder, (task, keys) in expected.items():
        card = ModelCard.load(dag_outputs / folder / "README.md")
        metrics = read_metrics(dag_outputs / folder)
        assert card.data.pipeline_tag == task, folder
        # the synthetic world and corpus have no hub ids, and every model here was built from scratch
        assert card.data.license == "apache-2.0" and card.data.datasets is None and card.data.base_model is None
        assert {r.dataset_type for r in card.data.eval_results} == {
            "mlm-corpus" if task == "fill-mask" else "synthetic-squad"}, folder
        assert {r.metric_type: r.metric_value for r in card.data.eval_results} == {
            metric: metrics[key] for metric, key in keys.items()}, folder
