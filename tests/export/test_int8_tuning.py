"""Accuracy-aware int8 (pipeline/export/int8_tuning.py) on the tiny student: the tuning questions, each layer's
sensitivity, the fallback to fp32 and what it costs, through search(), the function the quantize stage calls."""

import copy
import json

import onnx
import pytest

from pipeline.export import int8, int8_tuning
from pipeline.export.gates import gate_questions


def quantized_op_inputs(path) -> set[str]:
    """Names of the fp32 graph's tensors that feed an int8 op of `path` (what the quantizer took)."""
    graph = onnx.load(str(path)).graph
    return {name for node in graph.node if node.op_type in ("DynamicQuantizeMatMul", "MatMulInteger", "QAttention")
            for name in node.input}


@pytest.fixture(scope="module")
def student(exported_student):
    return exported_student


def test_tuning_questions_are_held_out_dev_questions_never_gated_nor_trained_on(student):
    cfg, paths = student["cfg"], student["paths"]
    tuning = int8_tuning.tuning_questions(paths["data"], student["root"] / "onnx_student", cfg)
    gated = gate_questions(paths["data"], student["student"], cfg)
    trained = {json.loads(line)["id"] for line in (paths["data"] / "train.jsonl").read_text().splitlines()}
    dev = [json.loads(line) for line in (paths["data"] / "dev.jsonl").read_text().splitlines()]
    assert tuning.gold and gated.gold and "held-out dev questions" in tuning.source
    assert not set(tuning.gold) & set(gated.gold) and not set(tuning.gold) & trained
    assert set(tuning.gold) <= {record["id"] for record in dev}
    # no paragraph on both sides of the split
    contexts = {record["id"]: record["context"] for record in dev}
    assert not {contexts[qid] for qid in tuning.gold} & {contexts[qid] for qid in gated.gold}
    assert gated.split.n_gated == len(gated.gold) and gated.split.n_tuning == len(tuning.gold)


def test_one_layer_quantized_and_one_layer_kept(student, tmp_path):
    fp32 = student["root"] / "onnx_student" / "fp32" / "model.onnx"
    recipe = int8.Int8Recipe("plain", "qoperator", True, False)
    layers = int8_tuning.quantizable_layers(fp32, recipe)
    matmuls = [layer for layer in layers if "MatMul" in layer]
    assert matmuls and not set(int8.activation_matmuls(fp32)) & set(layers)  # attention's products stay fp32
    int8.quantize_int8(fp32, tmp_path / "only.onnx", recipe, False, only=[matmuls[0]])
    int8.quantize_int8(fp32, tmp_path / "all.onnx", recipe, False)
    int8.quantize_int8(fp32, tmp_path / "but.onnx", recipe, False, exclude=[matmuls[0]])
    graph = {node.name: node for node in onnx.load(str(fp32)).graph.node}
    weight = graph[matmuls[0]].input[1]
    count = lambda path: sum(node.op_type in ("DynamicQuantizeMatMul", "MatMulInteger")  # noqa: E731
                             for node in onnx.load(str(path)).graph.node)
    assert count(tmp_path / "only.onnx") == 1 and count(tmp_path / "but.onnx") == count(tmp_path / "all.onnx") - 1
    kept = onnx.load(str(tmp_path / "but.onnx")).graph
    assert any(node.op_type == "MatMul" and weight in node.input for node in kept.node)  # still fp32, its weight too


def test_the_fallback_puts_the_most_sensitive_layers_back_in_fp32_and_times_what_it_costs(student, tmp_path,
                                                                                           monkeypatch):
    cfg, paths = copy.deepcopy(student["cfg"]), student["paths"]
    # Every logit the tuning computes (sensitivity, each fallback step's scoring) goes through graph_logits: seen
    # there, the questions it read are tuning questions only
    real_graph_logits, seen = int8_tuning.graph_logits, set()

    def graph_logits(path, windows):
        seen.update(windows.example_ids)
        return real_graph_logits(path, windows)

    monkeypatch.setattr(int8_tuning, "graph_logits", graph_logits)
    onnx_dir = student["root"] / "onnx_student"
    fallback = cfg.export.quantize.fallback
    fallback.recipes, fallback.max_layers = 1, 2
    fallback.target_f1_drop = -1.0  # out of reach (the schema's minimum is 0): every step is taken
    quantize = cfg.export.quantize
    quantize.int4, quantize.latency_runs, quantize.openvino = False, 5, False  # the x86 target: test_export.py
    # The naive baseline and one dynamic per-channel recipe of the plain graph
    quantize.search_graphs, quantize.search_formats = ["plain"], ["qoperator"]
    quantize.search_per_channel, quantize.search_attention_int8 = [True], [False]
    questions = gate_questions(paths["data"], student["student"], cfg)
    searched = int8_tuning.search(onnx_dir, paths["data"], tmp_path, cfg, questions, threads=1)
    variants = searched["variants"]
    recipes = {name: int8.Int8Recipe(**recipe) for name, recipe in searched["int8_recipes"].items()}
    assert len(recipes) == 2 and "held-out dev questions" in searched["tuned_on"]
    tuned = [name for name, variant in variants.items() if variant["fallback"].get("sensitivity")]
    assert len(tuned) == 1  # fallback.recipes
    record = variants[tuned[0]]["fallback"]
    layers = int8_tuning.quantizable_layers(onnx_dir / "fp32" / "model.onnx", recipes[tuned[0]])
    assert list(record["sensitivity"]) == sorted(layers, key=lambda layer: -record["sensitivity"][layer])
    assert [step["layer"] for step in record["steps"]] == list(record["sensitivity"])[:2]  # most sensitive first
    # No step's tuning interval lies within the target: the step kept is the one closest to fp32 by the label-free
    # divergence over every tuning window (not the luckiest F1), and its fallen-back layers are fp32 in it
    kept = record["fell_back"]
    assert kept == list(record["sensitivity"])[:len(kept)]
    closest = min([record["before"]["divergence"]] + [step["divergence"] for step in record["steps"]])
    assert record["after"]["divergence"] == closest and record["reached_target"] is False
    assert all(len(step["f1_drop_interval"]) == 2 for step in record["steps"]) and "interval" in record["stopping_rule"]
    graph = {node.name: node for node in onnx.load(str(onnx_dir / "fp32" / "model.onnx")).graph.node}
    quantized_inputs = quantized_op_inputs(tmp_path / tuned[0] / "model.onnx")
    for layer in kept:
        assert graph[layer].input[1] not in quantized_inputs
    assert "latency_cost_ms_p50" in record and record["latency_ms_without_fallback"]["p50"] > 0
    others = [name for name in variants if name not in tuned and name in recipes]
    assert all(variants[name]["fallback"]["fell_back"] == [] for name in others)
    assert all(v["verdict"] for v in variants.values()) and searched["bundle_choice"] in variants
    assert not (tmp_path / "untuned").exists() and not (tmp_path / "fp32-graphs").exists()
    # Every tuning step read tuning questions only: never a gated one
    tuning_ids, gated_ids = set(searched["tuning_ids"]), set(searched["gated_ids"])
    assert gated_ids == set(questions.gold) and not tuning_ids & gated_ids
    assert set(searched["reads"]) == {"fallback_sensitivity", "fallback_scoring"}  # no static recipe here
    for step, ids in searched["reads"].items():
        assert ids and set(ids) <= tuning_ids, step
    assert set(searched["reads"]["fallback_scoring"]) == tuning_ids
    assert seen == tuning_ids  # what the sensitivity and the fallback's steps were fed


def test_a_recipe_whose_build_raises_is_a_failed_variant_never_shipped(student, tmp_path, monkeypatch):
    cfg, paths = copy.deepcopy(student["cfg"]), student["paths"]
    quantize = cfg.export.quantize
    quantize.int4, quantize.latency_runs, quantize.openvino, quantize.fallback.recipes = False, 5, False, 0
    quantize.search_graphs, quantize.search_formats = ["plain"], ["qoperator"]
    quantize.search_per_channel, quantize.search_attention_int8 = [True], [False]
    real_quantize = int8_tuning.quantize_int8

    def quantize_or_fail(source, target, recipe, *args, **kwargs):
        if recipe.per_channel:  # the searched recipe; the naive baseline (per tensor here) builds
            raise RuntimeError("the quantizer refused a node\nsecond line")
        return real_quantize(source, target, recipe, *args, **kwargs)

    monkeypatch.setattr(int8_tuning, "quantize_int8", quantize_or_fail)
    questions = gate_questions(paths["data"], student["student"], cfg)
    searched = int8_tuning.search(student["root"] / "onnx_student", paths["data"], tmp_path, cfg, questions, threads=1)
    failed = searched["variants"]["int8-plain-qoperator-channel-attfp32"]
    assert failed["passed"] is False and failed["verdict"] == "rejected" and failed["path"] is None
    assert failed["error"] == "build failed: RuntimeError: the quantizer refused a node"
    assert "int8-plain-qoperator-channel-attfp32" in searched["not_shipped"]
    assert searched["bundle_choice"] == "int8" and searched["variants"]["int8"]["verdict"] in ("proven", "unproven")


def test_static_scales_and_the_x86_target_are_calibrated_on_tuning_questions_only(student, tmp_path, monkeypatch):
    """What each calibration was fed, seen where it is fed (int8.calibration_feeds), is the tuning questions
    quantize.json's `reads` names, never a gated one."""
    cfg, paths = copy.deepcopy(student["cfg"]), student["paths"]
    quantize = cfg.export.quantize
    # The naive baseline and one static (qdq) recipe, calibrated; the x86 target where its packages are installed
    quantize.search_graphs, quantize.search_formats = ["plain"], ["qdq"]
    quantize.search_per_channel, quantize.search_attention_int8 = [True], [False]
    quantize.int4, quantize.latency_runs, quantize.fallback.recipes = False, 5, 0
    fed = []

    def calibration_feeds(windows, graph_path, count):
        fed.append(int8_tuning.window_question_ids(windows, count))
        return int8.calibration_feeds(windows, graph_path, count)

    monkeypatch.setattr(int8_tuning, "calibration_feeds", calibration_feeds)
    questions = gate_questions(paths["data"], student["student"], cfg)
    searched = int8_tuning.search(student["root"] / "onnx_student", paths["data"], tmp_path, cfg, questions, 1)
    qdq = "int8-plain-qdq-channel-attfp32"
    assert searched["variants"][qdq]["path"] and searched["variants"][qdq]["verdict"] in ("proven", "unproven")
    # the x86 target is calibrated wherever its packages are installed (a CPU plugin that then refuses the model
    # leaves it out afterwards, saying so)
    left_out = searched["left_out_targets"].get("openvino-int8", "")
    x86 = not left_out.startswith("not installed")
    assert len(fed) == 1 + x86  # the qdq recipe, and the x86 target
    assert fed[0] == searched["reads"]["static_calibration"]
    if x86:
        assert fed[1] == searched["reads"]["openvino_calibration"]
        assert left_out.startswith(int8_tuning.CPU_PLUGIN_REFUSED) or searched["variants"]["openvino-int8"]["path"]
    tuning_ids, gated_ids = set(searched["tuning_ids"]), set(questions.gold)
    for ids in fed:
        assert ids and set(ids) <= tuning_ids and not set(ids) & gated_ids
