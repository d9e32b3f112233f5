"""The peers (pipeline.export.peers): their build (stage export_peers), and how the benchmark and report set them
beside our int8 graph."""

import json

import numpy as np
import onnx
import pytest
import torch

from pipeline.export import onnx_graph, peers
from pipeline.measurement import workers
from pipeline.measurement.torch_peer import listed_engines
from pipeline.reporting import markdown, summary
from pipeline.stages import benchmark, export_peers
from tests.openvino_checks import openvino_against_onnxruntime
from tests.stage_fixtures import tiny_config


@pytest.fixture(scope="module")
def tiny_full_size(tmp_path_factory):
    """A stand-in for export_full_size's folder: a small DistilBERT QA model and optimum's fp32 export of it."""
    from transformers import DistilBertConfig, DistilBertForQuestionAnswering

    root = tmp_path_factory.mktemp("peers")
    folder = root / "full_size" / "distilbert"
    torch.manual_seed(0)
    model = DistilBertForQuestionAnswering(DistilBertConfig(vocab_size=200, dim=64, n_layers=2, n_heads=2,
                                                            hidden_dim=128, max_position_embeddings=128))
    model.save_pretrained(folder / "pytorch")
    onnx_graph.export_fp32(folder / "pytorch", folder / "onnx" / "fp32", None)
    (folder / "full_size.json").write_text(json.dumps({"architecture": "distilbert"}))
    return root


def output_root(tiny_full_size, tmp_path):
    """An output root of its own holding the shared full_size folder, for the peers built into it."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "full_size").symlink_to(tiny_full_size / "full_size")
    return root


# The benchmark settings of the peers' tests: two lengths (one beyond the models' positions), two thread counts.
PEERS_CONFIG = {"export": {"full_size": {"architectures": ["distilbert"]}},
                "benchmark": {"sequence_lengths": [32, 256], "threads": [1, 2], "runs": 2, "warmup": 1,
                              "search_runs": 3, "timed_full_size": ["distilbert/torch-dynamic-int8",
                                                                    "distilbert/onnx-ortquantizer-int8",
                                                                    "distilbert/openvino-nncf-int8",
                                                                    "distilbert/openvino-ours-int8"]}}


@pytest.fixture(scope="module")
def built_peers(tiny_full_size, tmp_path_factory):
    """Stage export_peers' three peers of the stand-in, built once into an output root of their own (read only)."""
    root = output_root(tiny_full_size, tmp_path_factory.mktemp("built_peers"))
    cfg = tiny_config(**PEERS_CONFIG)
    named = f"{peers.TORCH_PEER},{peers.ORT_PEER},{peers.OPENVINO_PEER}"
    built = export_peers.run(cfg, root / "full_size" / "distilbert", named, root / "peers" / "distilbert")
    return root, cfg, built


def test_the_ort_preset_is_the_widest_int8_path_of_the_cpu():
    assert peers.ort_preset(["avx2", "avx512_vnni", "avx512f"], "x86_64") == "avx512_vnni"
    assert peers.ort_preset(["avx2", "avx512f"], "x86_64") == "avx512"
    assert peers.ort_preset(["avx", "avx2", "fma"], "x86_64") == "avx2"
    assert peers.ort_preset(["asimd"], "aarch64") == "arm64"
    with pytest.raises(ValueError, match="no AutoQuantizationConfig preset"):
        peers.ort_preset(["sse4_2"], "x86_64")


def test_ortquantizer_peer_quantizes_every_matmul_and_keeps_the_answers_close(tiny_full_size, tmp_path):
    from pipeline.measurement.latency import onnx_session, synthetic_feed

    fp32_dir = tiny_full_size / "full_size" / "distilbert" / "onnx" / "fp32"
    path, settings = peers.build_ortquantizer_int8(fp32_dir, tmp_path / "ort", "avx2")
    assert settings["preset"] == "avx2" and settings["is_static"] is False
    ops = [node.op_type for node in onnx.load(str(path)).graph.node]
    assert "MatMul" not in ops and {"DynamicQuantizeLinear", "MatMulInteger"} <= set(ops)
    assert path.stat().st_size < (fp32_dir / "model.onnx").stat().st_size
    fp32, quantized = onnx_session(fp32_dir / "model.onnx", 1), onnx_session(path, 1)
    feed = synthetic_feed(fp32, 48, 200)
    for expected, got in zip(fp32.run(None, feed), quantized.run(None, feed)):
        assert np.abs(expected - got).max() < 0.1 * np.abs(expected).max() + 0.05


def test_torch_peer_quantizes_every_linear_layer_on_each_engine(tiny_full_size):
    from transformers import AutoModelForQuestionAnswering

    fp32 = AutoModelForQuestionAnswering.from_pretrained(tiny_full_size / "full_size" / "distilbert" / "pytorch").eval()
    inputs = {"input_ids": torch.randint(5, 200, (1, 40)), "attention_mask": torch.ones(1, 40, dtype=torch.long)}
    with torch.inference_mode():
        expected = fp32(**inputs).start_logits
    engines = peers.torch_engines()
    assert engines and "none" not in engines
    for engine in engines:
        quantized = peers.torch_dynamic_int8(fp32, engine)
        assert not any(type(m) is torch.nn.Linear for m in quantized.modules())  # every Linear replaced
        assert any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in quantized.modules())
        with torch.inference_mode():
            got = quantized(**inputs).start_logits
        assert torch.allclose(got, expected, atol=0.1 * float(expected.abs().max()) + 0.05), engine
        assert peers.state_dict_megabytes(quantized) < peers.state_dict_megabytes(fp32)
    assert all(type(m) is not torch.ao.nn.quantized.dynamic.Linear for m in fp32.modules())  # original untouched


def test_nncf_peer_is_an_openvino_int8_model_that_keeps_the_answers_close(tiny_full_size, built_peers):
    from pipeline.export.full_size import PARITY_WINDOWS
    from pipeline.export.openvino_target import OPENVINO_FILE
    from pipeline.spawn import in_spawned_process

    root, _, built = built_peers
    fp32_path = tiny_full_size / "full_size" / "distilbert" / "onnx" / "fp32" / "model.onnx"
    nncf_built = built["peers"][peers.OPENVINO_PEER]
    path, settings = root / "peers" / "distilbert" / nncf_built["path"], nncf_built["quantization"]
    assert path.name == OPENVINO_FILE and path.with_suffix(".bin").is_file()
    assert settings["calibration_feeds"] == PARITY_WINDOWS and settings["model_type"] == "transformer"
    found = in_spawned_process(openvino_against_onnxruntime, path, fp32_path)
    rows, resolved = found["profile"]
    assert resolved == "f32" and rows and all(row["ms_per_run"] >= 0 for row in rows)
    assert any(row["op"].startswith("FullyConnected") for row in rows)  # the int8 GEMMs are OpenVINO's own layers
    for precision in peers.OPENVINO_PRECISIONS:  # f32 first: it runs wherever OpenVINO runs
        cell = found[precision]
        if "refused" in cell:
            pytest.skip(f"OpenVINO refused the model at precision {precision} here: {cell['refused']}")
        assert precision == "default" or cell["resolved"] == precision
        assert cell["shapes_equal"] and cell["error"] < 0.1 * cell["scale"] + 0.05, precision


def test_export_peers_builds_the_named_peers_and_the_benchmark_times_them(tiny_full_size, built_peers, tmp_path):
    from pipeline.export.full_size import random_windows
    from pipeline.export.int8 import Int8Recipe, calibration_feeds, quantize_int8

    root, cfg, built = built_peers
    assert built["architecture"] == "distilbert" and built["skipped"] == {}
    sizes = built["peers"][peers.TORCH_PEER]["size_mb_by_engine"]
    assert set(sizes) == set(peers.torch_engines()) and all(size > 0 for size in sizes.values())
    # every engine torch lists is sized, or named with why it is not
    left_out = built["peers"][peers.TORCH_PEER]["engines_left_out"]
    assert set(sizes) | set(left_out) == set(listed_engines()) and not set(sizes) & set(left_out)
    ort_built = built["peers"][peers.ORT_PEER]
    assert (root / "peers" / "distilbert" / ort_built["path"]).is_file()
    assert ort_built["quantization"]["is_static"] is False and ort_built["precision"].startswith("int8-ortquantizer-")

    nncf_built = built["peers"][peers.OPENVINO_PEER]
    assert (root / "peers" / "distilbert" / nncf_built["path"]).is_file() and nncf_built["size_mb"] > 0

    # openvino-ours-int8 runs the search's fastest static graph: none searched, none run, and the reason said (that
    # peer alone named: the others' items, the torch engine search among them, come below)
    ours_only = tiny_config(**{**PEERS_CONFIG, "benchmark": {**PEERS_CONFIG["benchmark"],
                                                             "timed_full_size": ["distilbert/openvino-ours-int8"]}})
    timed, skipped = benchmark.peer_artifacts(root, ours_only)
    assert "no static (qdq) int8 recipe" in skipped["distilbert/openvino-ours-int8"] and timed == []
    fp32_path = tiny_full_size / "full_size" / "distilbert" / "onnx" / "fp32" / "model.onnx"
    static = Int8Recipe("plain", "qdq", True, False)
    graph = tiny_full_size / "full_size" / "distilbert" / "onnx" / static.name / "model.onnx"  # where the search puts it
    graph.parent.mkdir(exist_ok=True)
    quantize_int8(fp32_path, graph, static, False, calibration_feeds(random_windows(200, 1), fp32_path, 4))
    search = {"candidates": {"int8": {"recipe": {"format": "qoperator"}, "latency_ms": {"p50": 1.0, "p90": 1.0}},
                             static.name: {"recipe": {"format": "qdq"}, "latency_ms": {"p50": 2.0, "p90": 2.0}}}}
    timed, skipped = benchmark.peer_artifacts(root, cfg, search)
    items = {item["name"]: item for item in timed}
    assert skipped == {}
    assert set(items) == {"distilbert/torch-dynamic-int8", "distilbert/onnx-ortquantizer-int8",
                          *(f"distilbert/{peer}-{precision}" for peer in (peers.OPENVINO_PEER, peers.OPENVINO_OURS)
                            for precision in peers.OPENVINO_PRECISIONS)}
    ours_on_openvino = items["distilbert/openvino-ours-int8-f32"]
    assert ours_on_openvino["path"].endswith(f"{static.name}/model.onnx") and ours_on_openvino["recipe"] == static.name
    assert all(items[f"distilbert/{peer}-default"]["openvino_precision"] == "default"
               for peer in (peers.OPENVINO_PEER, peers.OPENVINO_OURS))
    assert items["distilbert/openvino-nncf-int8-f32"]["size_mb"] == nncf_built["size_mb"]
    torch_peer, ort_peer = items["distilbert/torch-dynamic-int8"], items["distilbert/onnx-ortquantizer-int8"]
    search = torch_peer["engine_search"]
    assert set(search["engines"]) == set(peers.torch_engines())
    assert set(search["engines"]) | set(search["engines_left_out"]) == set(listed_engines())
    assert torch_peer["engine"] == min(search["engines"], key=lambda e: search["engines"][e]["p50"])
    assert torch_peer["size_mb"] == sizes[torch_peer["engine"]]
    assert torch_peer["tool"].endswith(f"engine {torch_peer['engine']})")
    assert all(item["peer_of"] == "distilbert/onnx-int8-optimized" for item in items.values())
    assert ort_peer["path"] == str(root / "peers" / "distilbert" / ort_built["path"])
    assert ort_peer["quantization"] == ort_built["quantization"] and ort_peer["tool"] == ort_built["tool"]
    # "ours" here: the fp32 graph stands in for the int8 one (the comparison only needs a graph to alternate with)
    ours = {"name": "distilbert/onnx-int8-optimized", "format": "onnx", "max_positions": 128, "vocab_size": 200,
            "path": str(tiny_full_size / "full_size" / "distilbert" / "onnx" / "fp32" / "model.onnx"),
            "session_options": "denormals-as-zero"}
    refused, measured = [], []
    # Each format timed once (each measurement starts processes of its own): the torch and ORTQuantizer peers, NNCF's
    # model at the runtime's default precision and our static graph on OpenVINO at f32; then all of them in turn
    # with "ours" in one process.
    timed_here = ["distilbert/torch-dynamic-int8", "distilbert/onnx-ortquantizer-int8",
                  f"distilbert/{peers.OPENVINO_PEER}-default", f"distilbert/{peers.OPENVINO_OURS}-f32"]
    for item in [items[name] for name in timed_here]:  # OpenVINO's last
        try:
            latency, rss = workers.measure(item, cfg.benchmark)
        except RuntimeError:  # its CPU plugin refused the model at that precision on this machine (the log says)
            assert item["format"] == "openvino"
            refused.append(item["name"])
            continue
        assert latency["seq32"]["threads1"]["p50"] > 0 and rss > 0
        assert item["format"] != "openvino" or item["runtime_precision"] in ("f32", "bf16", "f16")
        measured.append(item)
    in_turn = workers.in_worker({"name": "peers", "peers": measured, "ours": ours}, cfg.benchmark,
                                "peers-in-turn-with-ours")
    assert set(in_turn) == {item["name"] for item in measured}
    for comparison in in_turn.values():
        assert set(comparison) == {"seq32"}  # 256 is beyond the models' 128 positions
        assert set(comparison["seq32"]) == {"threads1", "threads2"}  # every thread count, in turn in one process
        for pair in comparison["seq32"].values():
            assert set(pair) == {"peer", "ours"} and all(0 < cell["p50"] <= cell["p90"] for cell in pair.values())
    first, *others = in_turn.values()
    assert all(other["seq32"]["threads1"]["ours"] == first["seq32"]["threads1"]["ours"] for other in others)
    none_named = tiny_config(export={"full_size": {"architectures": ["distilbert"]}}, benchmark={"timed_full_size": []})
    assert benchmark.peer_artifacts(tmp_path / "no-root", none_named) == ([], {})
    if refused:
        pytest.skip(f"OpenVINO refused {refused} on this machine; every other peer was timed")


def test_a_peer_named_but_not_built_or_unknown_stops_naming_the_file_or_the_peer(tiny_full_size, tmp_path):
    root = output_root(tiny_full_size, tmp_path)
    cfg = tiny_config(export={"full_size": {"architectures": ["distilbert"]}},
                      benchmark={"timed_full_size": ["distilbert/onnx-ortquantizer-int8"]})
    (root / "peers" / "distilbert").mkdir(parents=True)
    (root / "peers" / "distilbert" / "peers.json").write_text(json.dumps({"peers": {}, "skipped": {}}))
    with pytest.raises(benchmark.BenchmarkInputError, match="peers.json: onnx-ortquantizer-int8 is named"):
        benchmark.peer_artifacts(root, cfg)
    with pytest.raises(ValueError, match="unknown peers"):
        export_peers.run(cfg, root / "full_size" / "distilbert", "onnx-fp16", tmp_path / "peers")


def test_a_cpu_without_an_ortquantizer_preset_leaves_that_peer_out_with_the_reason(tiny_full_size, tmp_path,
                                                                                  monkeypatch):
    root = output_root(tiny_full_size, tmp_path)
    monkeypatch.setattr(export_peers, "cpu_description", lambda: {"model_name": "old", "simd_flags": ["sse4_2"]})
    cfg = tiny_config(export={"full_size": {"architectures": ["distilbert"]}},
                      benchmark={"timed_full_size": ["distilbert/onnx-ortquantizer-int8"]})
    built = export_peers.run(cfg, root / "full_size" / "distilbert", peers.ORT_PEER, root / "peers" / "distilbert")
    assert built["peers"] == {} and not (root / "peers" / "distilbert" / peers.ORT_PEER).exists()
    timed, skipped = benchmark.peer_artifacts(root, cfg)
    assert timed == [] and "no AutoQuantizationConfig preset" in skipped["distilbert/onnx-ortquantizer-int8"]
    section = "\n".join(markdown.peer_section([], cfg, skipped))
    assert "distilbert/onnx-ortquantizer-int8: not built on this machine: no AutoQuantizationConfig preset" in section


def cell(p50, spread=0.1):
    return {"p50": p50, "p90": round(p50 * (1 + spread), 3)}


def timed(points: dict, ours: dict) -> tuple[dict, dict, dict]:
    """From {(length, threads): peer p50} and ours' p50s: the 1-thread pairs as the benchmark writes them
    (interleaved_with_ours), and the peer's and ours' own latency tables holding the other thread counts."""
    in_turn, peer_latency, ours_latency = {}, {}, {}
    for (length, threads), p50 in points.items():
        if threads == 1:
            in_turn.setdefault(f"seq{length}", {})["threads1"] = {"peer": cell(p50), "ours": cell(ours[(length, 1)])}
        else:
            peer_latency.setdefault(f"seq{length}", {})[f"threads{threads}"] = cell(p50)
    for (length, threads), p50 in ours.items():
        ours_latency.setdefault(f"seq{length}", {})[f"threads{threads}"] = cell(p50 + 5)  # its own process: slower
    return in_turn, peer_latency, ours_latency


def test_the_report_says_where_ours_is_ahead_of_each_peer_beyond_the_noise_and_where_not():
    cfg = tiny_config(benchmark={"sequence_lengths": [128, 384], "threads": [1, 2]})
    ours_ms = {(128, 1): 30.0, (128, 2): 15.0, (384, 1): 100.0, (384, 2): 55.0}
    slower_in_turn, slower_latency, ours_latency = timed(
        {(128, 1): 33.5, (128, 2): 23.0, (384, 1): 125.0, (384, 2): 70.0}, ours_ms)
    mixed_in_turn, mixed_latency, _ = timed({(128, 1): 31.0, (384, 1): 80.0, (384, 2): 70.0}, ours_ms)
    ours = {"name": "distilbert/onnx-int8-optimized", "size_mb": 66.0, "latency_ms": ours_latency}
    slower = {"name": "distilbert/onnx-ortquantizer-int8", "tool": "ORTQuantizer", "peer_of": ours["name"],
              "size_mb": 66.5, "interleaved_with_ours": slower_in_turn, "latency_ms": slower_latency}
    mixed = {"name": "distilbert/torch-dynamic-int8", "tool": "torch.ao", "peer_of": ours["name"], "size_mb": 132.0,
             "interleaved_with_ours": mixed_in_turn, "latency_ms": {**mixed_latency, "seq128": {"threads2": None}}}
    same_run = {"name": "distilbert/openvino-nncf-int8-default", "tool": "OpenVINO", "peer_of": ours["name"],
                "size_mb": 67.0, "latency_ms": None, "same_run_as": "distilbert/openvino-nncf-int8-f32",
                "untimed_reason": "OpenVINO's default precision resolved to f32 on this CPU: the same run as "
                                  "distilbert/openvino-nncf-int8-f32"}
    nncf_f32 = {**same_run, "name": "distilbert/openvino-nncf-int8-f32", "same_run_as": None, "untimed_reason": None,
                "interleaved_with_ours": slower_in_turn, "latency_ms": slower_latency}
    benchmark_json = {"artifacts": [ours, slower, mixed, nncf_f32, same_run]}
    assert summary.x86_target_entries(benchmark_json) == [nncf_f32["name"]]  # the default's goals are the f32 one's
    same_run_row = summary.peer_comparison(benchmark_json, cfg)[-1]
    assert same_run_row["latency"] == {} and "the same run as" in same_run_row["untimed_reason"]
    assert "(OpenVINO's default precision resolved to f32" in markdown.peer_verdict(same_run_row)
    assert "not timed: OpenVINO's default" in "\n".join(markdown.peer_section([same_run_row], cfg))
    rows = summary.peer_comparison({"artifacts": [ours, slower, mixed]}, cfg)
    assert [row["name"] for row in rows] == [slower["name"], mixed["name"]]
    assert rows[0]["latency"]["seq384"]["threads1"] == {"peer_p50": 125.0, "peer_p90": 137.5, "ours_p50": 100.0,
                                                        "ours_p90": 110.0, "ratio": 1.25, "verdict": "ahead",
                                                        "timing": "in turn"}
    # 2 threads: ours from its own process (60), not from the 1-thread pairs
    assert rows[0]["latency"]["seq384"]["threads2"]["ours_p50"] == 60.0
    assert rows[0]["latency"]["seq384"]["threads2"]["timing"] == "separate processes"
    assert rows[1]["size_ratio"] == 2.0 and "threads2" not in rows[1]["latency"]["seq128"]
    assert rows[1]["latency"]["seq128"]["threads1"]["verdict"] == "within noise"  # 31 is inside ours' 30 to 33
    assert rows[1]["latency"]["seq384"]["threads1"]["verdict"] == "behind"  # its p90 88 is below our p50 100
    verdicts = [markdown.peer_verdict(row) for row in rows]
    assert "is ahead at 4 of 4 points" in verdicts[0] and "seq 384, 1 thr: 1.25x" in verdicts[0]
    assert "ahead at 1 of 3 points (seq 384, 2 thr: 1.17x)" in verdicts[1]  # 70 against 60
    assert "within the run-to-run spread (p50 to p90) at 1 of 3 points (seq 128, 1 thr: 1.03x)" in verdicts[1]
    assert "**behind** at 1 of 3 points (seq 384, 1 thr: 0.80x)" in verdicts[1]
    section = "\n".join(markdown.peer_section(rows, cfg))
    assert "125.0 / 100.0 = 1.25x, ahead |" in section and "70.0 / 60.0 = 1.17x, ahead, separate" in section
    assert "n/a" in section


def test_the_summary_schema_takes_the_peer_rows():
    import jsonschema

    from tests.paths import PROJECT_ROOT

    schema = json.loads((PROJECT_ROOT / "configs" / "summary.schema.json").read_text())
    peer_schema = {**schema["properties"]["peers"], "definitions": schema["definitions"]}
    row = {"name": "p", "tool": "t", "ours": "o", "size_mb": 1.0, "ours_size_mb": 2.0, "size_ratio": 0.5,
           "latency": {"seq128": {"threads1": {"peer_p50": 2.0, "peer_p90": 2.1, "ours_p50": 1.0, "ours_p90": 1.1,
                                               "ratio": 2.0, "verdict": "ahead", "timing": "in turn"}}}}
    jsonschema.validate([row], peer_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{**row, "latency": {"seq128": {"threads1": {"p50": 2.0}}}}], peer_schema)


def test_the_x86_targets_recipe_is_held_to_the_floor_and_speedup_goals_and_its_profile_set_beside_ours():
    longest = 384
    ratios = {f"distilbert_{name}_speedup_seq{longest}_threads1": value for name, value in (
        ("onnx_int8_optimized_vs_bert_base_pytorch_fp32", 9.1), ("onnx_int8_optimized_vs_naive_int8", 0.9),
        ("vs_bert_base_pytorch_fp32", 2.1), ("openvino_nncf_int8_f32_vs_bert_base_pytorch_fp32", 13.3),
        ("openvino_nncf_int8_default_vs_bert_base_pytorch_fp32", 14.2))}
    summary_data = {"full_size": [{"name": "distilbert/onnx-int8-optimized"}], "ratios": ratios,
                    "gemm_floor": {"ratio": 2.02, "openvino": {"distilbert/openvino-nncf-int8-f32": 1.39,
                                                               "distilbert/openvino-nncf-int8-default": 1.30}}}
    rows = {row["goal"]: row for row in summary.goals(summary_data, {}, {}, longest)}
    floor = {goal: row for goal, row in rows.items() if "GEMM floor" in goal}
    assert [(row["value"], row["met"]) for row in floor.values()] == [(2.02, False), (1.39, False), (1.30, True)]
    assert all(row["target"] == f"<= {summary.FLOOR_RATIO_GOAL}" for row in floor.values())
    speedups = [row for goal, row in rows.items() if "x86" in goal and "bert-base" in goal]
    assert [(row["value"], row["met"]) for row in speedups] == [(13.3, True), (14.2, True)]
    ours = [{"op": "DynamicQuantizeMatMul", "ms_per_run": 30.0, "share": 0.5},
            {"op": "SkipLayerNormalization", "ms_per_run": 6.0, "share": 0.1},
            {"op": "MatMul", "ms_per_run": 12.0, "share": 0.2}]  # the other 12 ms: rows past the profile's top 10
    theirs = [{"op": "FullyConnected (brgemm_avx512_I8)", "ms_per_run": 30.0, "share": 0.75},
              {"op": "MVN (jit_avx512_f32)", "ms_per_run": 1.0, "share": 0.025},
              {"op": "Subgraph (jit_avx512_i8)", "ms_per_run": 9.0, "share": 0.225}]
    lines = markdown.openvino_analysis({"distilbert/onnx-int8-optimized": ours, "distilbert/openvino-nncf-int8-f32": theirs})
    assert lines == ["- distilbert/openvino-nncf-int8-f32 against onnxruntime on distilbert/onnx-int8-optimized, ms "
                     "per run: int8 GEMMs 30.0 vs 30.0; layer norms 1.0 vs 6.0; attention and elementwise 9.0 vs "
                     "12.0; other 0.0 vs 12.0."]
