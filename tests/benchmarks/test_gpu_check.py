"""benchmarks/gpu_check.sh's CPU dry run at tiny shapes: every step of the device run runs and writes its results
under one folder, so a lent GPU's minutes go to measuring, not to debugging the script. And the loss-path
benchmark's verdict on the convergence runs."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import loss_paths
from tests.paths import PROJECT_ROOT


@pytest.fixture(scope="module")
def gpu_check_dry_run(tmp_path_factory):
    """The whole device script end to end (four benchmark processes one after another): an end-to-end build."""
    out = tmp_path_factory.mktemp("gpu_check") / "results"
    completed = subprocess.run(
        [str(PROJECT_ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", str(out)], cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=600)
    return completed, out


def read(out, name):
    return json.loads((out / name).read_text())


def test_every_step_runs_and_the_summary_lists_it(gpu_check_dry_run):
    completed, out = gpu_check_dry_run
    assert completed.returncode == 0, completed.stdout + completed.stderr
    summary = read(out, "summary.json")
    assert summary["dry_run"] is True and summary["passed"] is True
    assert [step["step"] for step in summary["steps"]] == ["versions", "gemm", "cuda_equivalence", "loss_paths"]
    assert all(step["exit_status"] == 0 and not step["timed_out"] for step in summary["steps"])
    assert summary["files"] == ["cuda_equivalence.json", "loss_paths.json", "versions.json", "vocabulary_gemms.json"]
    assert all((out / step["log"]).exists() for step in summary["steps"])
    versions = read(out, "versions.json")
    assert versions["torch"] and versions["transformers"] and versions["gpu"] is None


def test_the_gemm_step_times_every_vocabulary_gemm_in_its_layout(gpu_check_dry_run):
    gemm = read(gpu_check_dry_run[1], "vocabulary_gemms.json")["parts"]["gemm"]
    seen = {(entry["vocab"], entry["gemm"], entry["layout"]) for entry in gemm["gemms"]}
    assert seen == {(vocab, name, layout) for vocab in (30522, 30528)
                    for name, layout in (("logits", "nt"), ("input_gradient", "nn"), ("weight_gradient", "tn"))}


def test_the_equivalence_step_checks_the_stage_against_the_reference(gpu_check_dry_run):
    record = read(gpu_check_dry_run[1], "cuda_equivalence.json")
    assert record["passed"] is True and list(record["checks"]) == ["fp32", "bf16", "attention_dropout", "host_syncs"]
    assert " -m benchmarks.cuda_equivalence --device cpu " in record["command"]  # a command that reruns it


def test_the_paths_step_measures_both_paths_profiles_and_convergence(gpu_check_dry_run):
    record = read(gpu_check_dry_run[1], "loss_paths.json")
    assert record["complete"] is True and record["failed_parts"] == []
    assert " -m benchmarks.loss_paths --device cpu " in record["command"]
    assert record["paths"]["fused"]["vocab_multiple"] == 64 and record["paths"]["unpadded_eager"]["vocab_multiple"] == 1
    throughput = record["parts"]["throughput"]
    assert [entry["path"] for entry in throughput["order"]] == ["unpadded_eager", "fused"]  # one round, interleaved
    for name in ("unpadded_eager", "fused"):
        assert throughput["rounds"][name][0]["tokens_per_second"] > 0
        assert throughput["rounds"][name][0]["peak_memory_mib"] > 0
        profile = record["parts"]["profile"][name]
        assert profile["loss_ranges_seen"] == 1 and 0 < profile["loss_share_of_wall"] < 1
        assert profile["seconds_by_class"]["gemm"] > 0
    convergence = record["parts"]["convergence"]
    assert convergence["seeds"] == [0, 1] and set(convergence["runs"]) == {"unpadded_eager", "fused"}
    for by_seed in convergence["runs"].values():
        assert all(run["steps"] == 2 and run["logged"] and run["final_mlm"] > 0 for run in by_seed.values())
    assert isinstance(convergence["within_seed_spread"], bool)


def test_the_convergence_verdict_compares_the_paths_with_the_seed_spread(monkeypatch, tmp_path):
    finals = {("unpadded_eager", 0): 2.00, ("fused", 0): 2.01, ("unpadded_eager", 1): 2.10, ("fused", 1): 2.12}
    monkeypatch.setattr(loss_paths, "convergence_run",
                        lambda args, work, state, seed, scratch: {"final_mlm": finals[(work, seed)]})
    args = type("Args", (), {"seeds": [0, 1], "convergence_steps": 150, "convergence_max_tokens": 16384})()
    result = loss_paths.convergence_part(args, {"unpadded_eager": "unpadded_eager", "fused": "fused"}, {}, tmp_path)
    assert result["seed_to_seed_spread"] == pytest.approx({"unpadded_eager": 0.10, "fused": 0.11})
    assert result["path_difference_of_means"] == pytest.approx(0.015)
    assert result["within_seed_spread"] is True
    finals[("fused", 0)], finals[("fused", 1)] = 2.30, 2.41  # a path that learns worse than seeds vary
    assert loss_paths.convergence_part(args, {"unpadded_eager": "unpadded_eager", "fused": "fused"}, {},
                                       tmp_path)["within_seed_spread"] is False


def test_the_loss_share_counts_each_range_once_on_a_gpu():
    """On a GPU the profiler lists the loss's range twice: the host's range (device time: the kernels launched inside
    it) and a device-side annotation over the same kernels. Only the host's count."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name, device_type, device_us, cpu_us):
        return SimpleNamespace(name=name, device_type=device_type, device_time_total=device_us, cpu_time_total=cpu_us)

    events = [event(loss_paths.PROFILER_RANGE, DeviceType.CPU, 300_000, 40_000),
              event(loss_paths.PROFILER_RANGE, DeviceType.CUDA, 310_000, 0),
              event(loss_paths.PROFILER_RANGE, DeviceType.CPU, 200_000, 30_000),
              event(loss_paths.PROFILER_RANGE, DeviceType.CUDA, 205_000, 0),
              event("aten::mm", DeviceType.CPU, 900_000, 90_000)]
    assert loss_paths.loss_range_seconds(events, on_gpu=True) == (pytest.approx(0.5), 2)
    assert loss_paths.loss_range_seconds(events, on_gpu=False) == (pytest.approx(0.07), 2)
