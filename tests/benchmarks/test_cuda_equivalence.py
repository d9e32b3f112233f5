"""benchmarks/cuda_equivalence.py on the CPU (its smoke shapes): the checks pass on the real packed path, fail on a
broken one, and the JSON holds what each check measured."""

import json

import pytest
import torch

import pipeline.distillation.packed_encoder
from benchmarks import cuda_equivalence as script

SMOKE = ["--device", "cpu", "--teacher-layers", "2", "--student-layers", "1", "--hidden", "32", "--intermediate", "64",
         "--heads", "4", "--seq-len", "48", "--max-tokens", "384", "--chunked-loss-rows", "96",
         "--packed-multiple", "32", "--checks", "fp32,bf16,attention_dropout,host_syncs"]


def test_every_check_passes_on_the_packed_path_and_the_json_says_what_it_measured(tmp_path):
    out = tmp_path / "equivalence.json"
    assert script.main([*SMOKE, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["passed"] is True and record["complete"] is True
    assert record["device"] == "cpu" and record["cpu"]["model_name"]
    checks = record["checks"]
    assert list(checks) == ["fp32", "bf16", "attention_dropout", "host_syncs"]
    assert checks["fp32"]["passed"] and len(checks["fp32"]["micro_batches"]) == 2
    for fp32 in checks["fp32"]["micro_batches"]:
        assert fp32["passed"] and set(fp32["terms"]) == {"loss", "ce", "mlm", "cos"}
        assert max(fp32["terms_relative_error"].values()) <= 1e-5 and fp32["gradient_relative_norm_error"] <= 1e-4
        assert fp32["terms"]["ce"] > 1e-3  # the perturbed student differs from its teacher: the KL is not rounding
        assert fp32["parameters_compared"] > 10 and not fp32["worst_parameter"]["name"].endswith(script.KEY_BIASES)
    for bf16 in checks["bf16"]["micro_batches"]:
        assert bf16["passed"] and bf16["packed_bf16"]["gradient_relative_norm_error"] > 0  # bf16 did round
    dropout = checks["attention_dropout"]
    assert dropout["passed"] and dropout["same_seed_same_output"] and dropout["other_dropouts"] == 0.0
    assert checks["host_syncs"]["passed"] is None and "CPU" in checks["host_syncs"]["reason"]
    batches = record["micro_batches"]
    assert len(batches) == 2 and batches[1]["packed_tokens"] < batches[0]["packed_tokens"]  # two shapes to compile
    assert all(b["packed_tokens"] % 32 == 0 and b["packed_tokens"] >= b["real_tokens"] for b in batches)


def test_a_packed_attention_that_attends_across_sequences_fails_the_fp32_check(tmp_path, monkeypatch):
    def across_sequences(query, key, value, layout, dropout_p):  # every token attends to every token
        context = torch.nn.functional.scaled_dot_product_attention(
            *(x.transpose(0, 1) for x in (query, key, value)), dropout_p=dropout_p)
        return context.transpose(0, 1)

    monkeypatch.setattr(pipeline.distillation.packed_encoder, "_grid_attention", across_sequences)
    out = tmp_path / "equivalence.json"
    assert script.main([*SMOKE, "--checks", "fp32", "--out", str(out)]) == 1
    record = json.loads(out.read_text())
    assert record["passed"] is False and record["checks"]["fp32"]["passed"] is False
    assert record["checks"]["fp32"]["micro_batches"][0]["gradient_relative_norm_error"] > 1e-2


def test_the_dropout_check_fails_when_attention_dropout_is_not_applied(tmp_path, monkeypatch):
    # The student's other dropouts are off in the check, so the attention's alone must make training differ.
    monkeypatch.setattr(pipeline.distillation.packed_encoder, "_attention_dropout", lambda module, probability: 0.0)
    out = tmp_path / "equivalence.json"
    assert script.main([*SMOKE, "--checks", "attention_dropout", "--out", str(out)]) == 1
    dropout = json.loads(out.read_text())["checks"]["attention_dropout"]
    assert dropout["passed"] is False and dropout["train_vs_eval_relative_norm_difference"] == 0


def test_a_run_cut_short_is_written_as_incomplete_after_each_check(tmp_path, monkeypatch):
    written = []
    monkeypatch.setattr(script, "atomic_write_json",
                        lambda path, record: written.append(json.loads(json.dumps(record))))
    assert script.main([*SMOKE, "--checks", "attention_dropout,fp32", "--out", str(tmp_path / "e.json")]) == 0
    assert [(r["complete"], r["passed"], list(r["checks"])) for r in written] == [
        (False, None, ["attention_dropout"]), (True, True, ["attention_dropout", "fp32"])]


def test_a_check_that_raises_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    monkeypatch.setattr(script, "check_attention_dropout", lambda *args: 1 / 0)
    out = tmp_path / "equivalence.json"
    assert script.main([*SMOKE, "--checks", "attention_dropout,fp32", "--out", str(out)]) == 1
    checks = json.loads(out.read_text())["checks"]
    assert checks["attention_dropout"]["passed"] is False
    assert checks["attention_dropout"]["error"].startswith("ZeroDivisionError")
    assert checks["fp32"]["passed"] is True


def test_unknown_checks_are_refused():
    with pytest.raises(SystemExit):
        script.parse_args(["--checks", "fp32,speed", "--out", "x.json"])
