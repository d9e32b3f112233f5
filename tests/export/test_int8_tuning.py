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


def test_tuning_questions_are_never_the_gated_ones(student, tmp_path):
    cfg, paths = student["cfg"], student["paths"]
    tuning, source = int8_tuning.tuning_questions(paths["data"], student["root"] / "onnx_student", cfg)
    assert "training questions" in source and len(tuning.examples) == min(cfg.export.quantize.tuning_questions,
                                                                          len(tuning.examples))
    gated = gate_questions(paths["data"], student["student"], cfg.export.gates.dev_questions)
    assert not set(tuning.gold) & set(gated.gold)
    # A deploy has no training set: the dev questions past the gated ones tune, and none of the gated
    deploy_data = tmp_path / "data"
    deploy_data.mkdir()
    dev_lines = (paths["data"] / "dev.jsonl").read_text().splitlines()
    (deploy_data / "dev.jsonl").write_text("\n".join(dev_lines) + "\n")
    cfg = copy.deepcopy(cfg)
    cfg.export.gates.dev_questions = len(dev_lines) // 2
    tuning, source = int8_tuning.tuning_questions(deploy_data, student["root"] / "onnx_student", cfg)
    first_gated = [json.loads(line)["id"] for line in dev_lines[: len(dev_lines) // 2]]
    assert f"past the {len(dev_lines) // 2}" in source and not set(tuning.gold) & set(first_gated)
    cfg.export.gates.dev_questions = len(dev_lines)
    tuning, source = int8_tuning.tuning_questions(deploy_data, student["root"] / "onnx_student", cfg)
    assert tuning is None and "no dev questions past" in source


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


def test_the_fallback_puts_the_most_sensitive_layers_back_in_fp32_and_times_what_it_costs(student, tmp_path):
    cfg, paths = copy.deepcopy(student["cfg"]), student["paths"]
    onnx_dir = student["root"] / "onnx_student"
    fallback = cfg.export.quantize.fallback
    fallback.recipes, fallback.max_layers = 1, 2
    fallback.target_f1_drop = -1.0  # out of reach (the schema's minimum is 0): every step is taken
    quantize = cfg.export.quantize
    quantize.int4, quantize.latency_runs, quantize.openvino = False, 5, False  # the x86 target: test_export.py
    # The naive baseline and one dynamic per-channel recipe of the plain graph
    quantize.search_graphs, quantize.search_formats = ["plain"], ["qoperator"]
    quantize.search_per_channel, quantize.search_attention_int8 = [True], [False]
    questions = gate_questions(paths["data"], student["student"], cfg.export.gates.dev_questions)
    searched = int8_tuning.search(onnx_dir, paths["data"], tmp_path, cfg, questions, threads=1)
    variants = searched["variants"]
    recipes = {name: int8.Int8Recipe(**recipe) for name, recipe in searched["int8_recipes"].items()}
    assert len(recipes) == 2 and "training questions" in searched["tuned_on"]
    tuned = [name for name, variant in variants.items() if variant["fallback"].get("sensitivity")]
    assert len(tuned) == 1  # fallback.recipes
    record = variants[tuned[0]]["fallback"]
    layers = int8_tuning.quantizable_layers(onnx_dir / "fp32" / "model.onnx", recipes[tuned[0]])
    assert list(record["sensitivity"]) == sorted(layers, key=lambda layer: -record["sensitivity"][layer])
    assert [step["layer"] for step in record["steps"]] == list(record["sensitivity"])[:2]  # most sensitive first
    # The graph kept is the step with the smallest tuning drop, and its fallen-back layers are fp32 in it
    kept = record["fell_back"]
    assert kept == list(record["sensitivity"])[:len(kept)]
    best = min([record["before"]["f1_drop"]] + [step["f1_drop"] for step in record["steps"]])
    assert record["after"]["f1_drop"] == best and record["reached_target"] is False
    graph = {node.name: node for node in onnx.load(str(onnx_dir / "fp32" / "model.onnx")).graph.node}
    quantized_inputs = quantized_op_inputs(tmp_path / tuned[0] / "model.onnx")
    for layer in kept:
        assert graph[layer].input[1] not in quantized_inputs
    assert "latency_cost_ms_p50" in record and record["latency_ms_without_fallback"]["p50"] > 0
    others = [name for name in variants if name not in tuned and name in recipes]
    assert all(variants[name]["fallback"]["fell_back"] == [] for name in others)
    assert all(v["verdict"] for v in variants.values()) and searched["bundle_choice"] in variants
    assert not (tmp_path / "untuned").exists() and not (tmp_path / "fp32-graphs").exists()
