"""pipeline/measurement/workers.py: each timing in a fresh process, with that process's peak memory; the benchmark's
entries timed in place, an OpenVINO one its CPU plugin refuses left untimed, the peers then in turn with our graph."""

import subprocess
import sys

import pytest

from pipeline.measurement import runners, workers
from pipeline.plan.config import BenchmarkConfig
from pipeline.spawn import in_spawned_process
from tests.paths import PROJECT_ROOT


def entry(name, path="", fmt="onnx", max_positions=128, **fields):
    return {"name": name, "format": fmt, "path": str(path), "max_positions": max_positions, "vocab_size": 200,
            "timed": True, **fields}


def test_each_artifact_is_timed_in_its_own_process_with_its_peak_memory(tiny_int8):
    cfg = BenchmarkConfig(sequence_lengths=[32, 256], threads=[1, 2], runs=2, warmup=1)
    latency, peak_rss_mib = workers.measure(entry("tiny", tiny_int8 / "int8.onnx"), cfg)
    assert latency["seq256"] is None  # longer than the model's 128 positions
    assert set(latency["seq32"]) == {"threads1", "threads2"}
    assert 0 < latency["seq32"]["threads1"]["p50"] <= latency["seq32"]["threads1"]["p90"]
    assert peak_rss_mib > 20  # a Python process with onnxruntime loaded
    torch_entry = entry("tiny", tiny_int8 / "pytorch" / "model.safetensors", "pytorch")
    torch_latency, torch_rss = workers.measure(torch_entry, cfg)
    assert torch_latency["seq32"]["threads2"]["p50"] > 0 and torch_rss > peak_rss_mib
    openvino = entry("tiny", tiny_int8 / "int8.onnx", "openvino", openvino_precision="f32")
    openvino_latency, _ = workers.measure(openvino, cfg)  # OpenVINO reads the ONNX graph itself
    assert openvino_latency["seq32"]["threads1"]["p50"] > 0 and openvino["runtime_precision"] == "f32"


def precision_after_timing(item: dict, cfg: BenchmarkConfig) -> str | None:
    """What the timing itself left on the item (run in a spawned process: OpenVINO stays out of pytest's)."""
    runners.latency_table(item, cfg)
    return item.get("runtime_precision")


def test_an_openvino_timing_says_what_its_precision_resolved_to_even_with_no_length_timed(tiny_int8):
    """The timed session says what the hint resolved to; a memory run whose one length is beyond the model's
    positions times nothing, and the worker still says it."""
    openvino = entry("tiny", tiny_int8 / "int8.onnx", "openvino", openvino_precision="f32")
    assert in_spawned_process(precision_after_timing, openvino, BenchmarkConfig(sequence_lengths=[32], threads=[1],
                                                                                runs=1, warmup=0)) == "f32"
    beyond = BenchmarkConfig(sequence_lengths=[256], threads=[1], runs=1, warmup=1)  # the model has 128 positions
    assert in_spawned_process(precision_after_timing, openvino, beyond) is None
    latency, _ = workers.measure(openvino, beyond)
    assert latency == {"seq256": None} and openvino["runtime_precision"] == "f32"


def test_entries_are_timed_in_place_and_the_peers_in_turn_with_our_graph(monkeypatch):
    """The peers of a timed graph are timed once, together in turn with it (their latency tables come from there),
    each one's own process running once for its memory, over our graph's runs; a peer of an untimed graph is timed
    alone; an OpenVINO
    "-default" peer whose precision resolved to f32 is the "-f32" one's run and is not timed again."""
    started = []

    def measure(item, cfg):
        started.append(("latency", item["name"], cfg.runs, tuple(cfg.sequence_lengths), tuple(cfg.threads)))
        if item["name"] == "refused":
            raise RuntimeError("the CPU plugin refused it")
        if item["format"] == "openvino":
            item["runtime_precision"] = "f32"
        return {"seq32": {"threads1": {"p50": 1.0, "p90": 1.0}}}, 100.0

    def in_worker(item, cfg, task):
        started.append((task, [peer["name"] for peer in item["peers"]], item["ours"]["name"], cfg.runs))
        return {peer["name"]: {"seq32": {"threads1": {"peer": {"p50": 3.0 + n, "p90": 4.0 + n},
                                                      "ours": {"p50": 2.0, "p90": 2.5}}}}
                for n, peer in enumerate(item["peers"])}

    monkeypatch.setattr(workers, "measure", measure)
    monkeypatch.setattr(workers, "in_worker", in_worker)
    cfg = BenchmarkConfig(sequence_lengths=[32, 256], threads=[1], runs=20)
    items = [entry("ours", runs=10), entry("coreml", fmt="coreml", timed=False), entry("peer", peer_of="ours"),
             entry("refused", fmt="openvino", peer_of="ours"), entry("peer-of-untimed", peer_of="coreml"),
             entry("ov-f32", fmt="openvino", peer_of="ours", openvino_precision="f32"),
             entry("ov-default", fmt="openvino", peer_of="ours", openvino_precision="default")]
    workers.time_artifacts(items, cfg)
    ours, coreml, peer, refused, peer_of_untimed, ov_f32, ov_default = items
    assert started == [("latency", "ours", 10, (32, 256), (1,)), ("latency", "peer", 1, (256,), (1,)),
                       ("latency", "refused", 1, (256,), (1,)),
                       ("latency", "peer-of-untimed", 20, (32, 256), (1,)),
                       ("latency", "ov-f32", 1, (256,), (1,)), ("latency", "ov-default", 1, (256,), (1,)),
                       ("peers-in-turn-with-ours", ["peer", "ov-f32"], "ours", 10)]  # our graph's runs
    assert ours["peak_rss_mib"] == 100.0 and coreml["latency_ms"] is None and coreml["peak_rss_mib"] is None
    assert peer["latency_ms"] == {"seq32": {"threads1": {"p50": 3.0, "p90": 4.0}}, "seq256": None}
    assert ov_f32["latency_ms"] == {"seq32": {"threads1": {"p50": 4.0, "p90": 5.0}}, "seq256": None}
    assert peer["interleaved_with_ours"]["seq32"]["threads1"]["ours"] == {"p50": 2.0, "p90": 2.5}
    assert peer["peak_rss_mib"] == 100.0 and "in turn" in peer["latency_timing"] and peer["runs"] == 10
    assert refused["timed"] is False and refused["latency_ms"] is None
    assert refused["untimed_reason"] == "OpenVINO did not run it on this machine (the CPU plugin refused it)"
    assert ov_default["timed"] is False and ov_default["latency_ms"] is None and ov_default["peak_rss_mib"] == 100.0
    assert ov_default["same_run_as"] == "ov-f32" and "resolved to f32" in ov_default["untimed_reason"]
    assert "interleaved_with_ours" not in peer_of_untimed and "latency_timing" not in peer_of_untimed
    with pytest.raises(RuntimeError, match="refused"):  # only OpenVINO's refusal is a reason to go on
        workers.time_artifacts([entry("refused")], BenchmarkConfig())


def test_an_entry_that_names_its_runs_is_timed_with_them(monkeypatch):
    """The full-size architectures' own rows carry benchmark.full_size_runs; every other entry takes cfg.runs."""
    runs = {}

    def measure(item, cfg):
        runs[item["name"]] = cfg.runs
        return {"seq32": {"threads1": {"p50": 1.0, "p90": 1.0}}}, 100.0

    monkeypatch.setattr(workers, "measure", measure)
    workers.time_artifacts([entry("student/onnx-int8"), entry("bert-base/pytorch-fp32", runs=10)],
                           BenchmarkConfig(runs=20))
    assert runs == {"student/onnx-int8": 20, "bert-base/pytorch-fp32": 10}


def test_an_onnx_entry_on_a_graph_and_options_already_timed_takes_that_run(monkeypatch, tmp_path):
    """The int8 search's choice when it is the naive graph with the default options: the same file, options and
    runs as the naive row, so one run and one figure, named; another option set or another file is its own run."""
    timed = []

    def measure(item, cfg):
        timed.append(item["name"])
        return {"seq32": {"threads1": {"p50": float(len(timed)), "p90": 9.0}}}, 100.0 + len(timed)

    monkeypatch.setattr(workers, "measure", measure)
    monkeypatch.setattr(workers, "in_worker", lambda item, cfg, task: {  # the peer's blocks in turn with ours
        "peer": {"seq32": {"threads1": {"peer": {"p50": 1.0, "p90": 1.0}, "ours": {"p50": 1.0, "p90": 1.0}}}}})
    graph, other = tmp_path / "int8" / "model.onnx", tmp_path / "int8-plain-qdq" / "model.onnx"
    items = [entry("naive", graph, runs=10), entry("optimized", tmp_path / "int8" / ".." / "int8" / "model.onnx",
                                                   runs=10, session_options="default"),
             entry("optimized-daz", graph, runs=10, session_options="denormals-as-zero"),
             entry("few-runs", graph), entry("searched", other, runs=10),
             entry("peer", graph, runs=10, peer_of="naive")]
    workers.time_artifacts(items, BenchmarkConfig(runs=20))
    naive, optimized, daz, few_runs, searched, peer = items
    assert timed == ["naive", "optimized-daz", "few-runs", "searched", "peer"]
    assert optimized["latency_ms"] == naive["latency_ms"] and optimized["peak_rss_mib"] == naive["peak_rss_mib"]
    assert optimized["same_run_as"] == "naive" and "same graph file, session options and runs" in \
        optimized["latency_timing"]
    assert all("same_run_as" not in item for item in (naive, daz, few_runs, searched))


def test_a_default_precision_that_is_not_f32_is_timed_as_its_own_run():
    by_name = {"ov-f32": entry("ov-f32", fmt="openvino", openvino_precision="f32")}
    bf16 = entry("ov-default", fmt="openvino", openvino_precision="default", runtime_precision="bf16")
    f32 = entry("ov-default", fmt="openvino", openvino_precision="default", runtime_precision="f32")
    assert workers.same_run_as(bf16, by_name) is None
    assert workers.same_run_as(f32, by_name) == "ov-f32"
    assert workers.same_run_as(f32, {"ov-f32": {**by_name["ov-f32"], "timed": False}}) is None  # nothing to repeat
    assert workers.same_run_as(entry("onnx-default", openvino_precision="default", runtime_precision="f32"),
                               by_name) is None


def test_a_timing_process_starts_without_torch_or_the_export_libraries():
    # Every timed artifact runs in a fresh process that imports the worker module: what it imports is start-up time
    # charged to each of the benchmark's dozens of processes.
    script = ("import sys, pipeline.measurement.workers; "
              "print(sorted(m for m in ('torch', 'transformers', 'coremltools', 'pipeline.export') if m in sys.modules))")
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                               cwd=PROJECT_ROOT)
    assert completed.stdout.strip() == "[]"
