"""The Android NPU graphs (pipeline/export/npu_graph.py) of the tiny student, built by export_npu's own functions:
the NPU form computes what the model does, the graphs are static int8 with fixed int32 shapes, the QNN execution
provider takes every node of them, the emulated NPU answers like the CPU execution provider, and the npu gate
misses only on a disagreement its interval shows."""

import numpy as np
import onnx
import pytest
import torch

from pipeline.export import coreml, npu_graph
from pipeline.export.gates import REJECTED, RECORDED
from pipeline.runtime import answering, squad
from tests.stage_fixtures import EXPORT_RELAXED, build_tiny_artifacts, tiny_config, tiny_qa_model_dir

LENGTHS = [64, 128]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny student, its float NPU-form graphs, the int8 graphs calibrated on its tuning windows, and the
    windows of its first dev questions."""
    root = tmp_path_factory.mktemp("npu")
    cfg = tiny_config(export=EXPORT_RELAXED)
    paths = build_tiny_artifacts(root, cfg)
    student = tiny_qa_model_dir(root, paths, cfg, distilbert=True)
    teacher = tiny_qa_model_dir(root, paths, cfg, distilbert=False)
    (root / "float").mkdir()
    (root / "int8").mkdir()
    float_graphs = npu_graph.export_float_graphs(coreml.load_wrapped(student, True), LENGTHS, root / "float")
    tokenizer = answering.QuestionAnswerer(float_graphs[128], student / "tokenizer.json", max_seq_length=128,
                                           doc_stride=cfg.squad.doc_stride)
    from pipeline.data.squad_loading import load_squad

    records, _ = load_squad(str(paths["data"] / "dev.jsonl"))
    examples = squad.questions(records)[:24]
    windows = tokenizer.windows(examples)
    graphs = npu_graph.quantize_graphs(float_graphs, windows, 16, root / "int8")
    return {"cfg": cfg, "paths": paths, "student": student, "teacher": teacher, "float": float_graphs, "graphs": graphs,
            "examples": examples, "windows": windows, "root": root}


@pytest.mark.parametrize("model", ["student", "teacher"])  # DistilBERT, BERT (token types derived inside)
def test_masking_after_the_softmax_computes_what_the_model_does_on_padded_windows(built, model):
    reference = coreml.load_wrapped(built[model], True)
    npu_model = npu_graph.npu_form(coreml.load_wrapped(built[model], True))
    windows = built["windows"]
    real = windows.attention_mask.astype(bool)
    with torch.no_grad():
        ids, mask = torch.from_numpy(windows.input_ids).int(), torch.from_numpy(windows.attention_mask).int()
        expected = reference(ids, mask)
        found = npu_model(ids, mask)
    for want, got in zip(expected, found):
        assert np.abs(want.numpy() - got.numpy())[real].max() < 1e-4
    if model == "teacher":
        return
    # and the exported float graphs, each window alone on the shortest graph that holds it
    graph_answers = npu_graph.answers(npu_graph.cpu_sessions(built["float"]), built["examples"], windows, built["cfg"])
    assert np.abs(graph_answers.start - expected[0].numpy())[real].max() < 1e-4


def test_each_graph_is_static_int8_with_fixed_int32_shapes(built):
    for length, path in built["graphs"].items():
        model = onnx.load(str(path))
        shapes = {i.name: ([d.dim_value for d in i.type.tensor_type.shape.dim], i.type.tensor_type.elem_type)
                  for i in model.graph.input}
        assert shapes == {name: ([1, length], onnx.TensorProto.INT32) for name in npu_graph.INPUTS}
        record = npu_graph.graph_record(path)
        assert record["dynamic_ops"] == []
        assert record["ops"]["QuantizeLinear"] > 0 and record["ops"]["DequantizeLinear"] > 0
        assert record["ops"].get("MatMul", 0) + record["ops"].get("Gemm", 0) > 0
        assert record["nnapi"]["nodes"] == sum(record["ops"].values())


def test_another_model_type_is_refused_by_name(built):
    wrapped = coreml.load_wrapped(built["student"], True)
    wrapped.model_type = "electra"
    with pytest.raises(ValueError, match="'electra'"):
        npu_graph.npu_form(wrapped)


def test_a_window_goes_to_the_shortest_graph_that_holds_it():
    graphs = npu_graph.FixedLengthGraphs({128: None, 64: None})
    assert [graphs.length_for(n) for n in (1, 64, 65, 128)] == [64, 64, 128, 128]
    with pytest.raises(ValueError, match="longer than the longest graph"):
        graphs.length_for(129)


def qnn_or_skip(graphs):
    try:
        return npu_graph.qnn_htp_sessions(graphs, "73", "57")
    except npu_graph.QnnUnavailable as error:
        pytest.skip(f"the QNN HTP emulation cannot run here: {error}")


def test_the_qnn_execution_provider_takes_every_node_and_the_emulated_npu_answers_like_the_cpu(built):
    emulated = qnn_or_skip(built["graphs"])  # the CPU fallback is off: the session opens only if QNN takes all
    windows, examples = built["windows"], built["examples"][:4]
    rows = [row for row in range(len(windows)) if windows.example_ids[row] in {e["id"] for e in examples}]
    sample = answering.Windows([windows.example_ids[r] for r in rows], windows.input_ids[rows],
                               windows.attention_mask[rows], windows.token_type_ids[rows],
                               [windows.context_offsets[r] for r in rows])
    on_npu = npu_graph.answers(emulated, examples, sample, built["cfg"])
    on_cpu = npu_graph.answers(npu_graph.cpu_sessions(built["graphs"]), examples, sample, built["cfg"])
    difference = npu_graph.largest_logit_difference(on_npu, on_cpu, sample)
    assert 0 <= difference < 0.5  # the same int8 graph; the NPU rounds its own way, not arbitrarily
    assert np.isfinite(on_npu.start[sample.attention_mask.astype(bool)]).all()


def test_a_graph_with_an_operator_qnn_does_not_take_is_refused_saying_so(built, tmp_path):
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed (no wheel for this platform)")
    model = onnx.load(str(built["graphs"][64]))
    # A dynamic int8 operator, as in the bundle's CPU graph: QNN has no kernel for it.
    node = onnx.helper.make_node("DynamicQuantizeLinear", ["extra_input"], ["q", "scale", "zero_point"])
    model.graph.node.append(node)
    model.graph.input.append(onnx.helper.make_tensor_value_info("extra_input", onnx.TensorProto.FLOAT, [4]))
    for name in ("q", "scale", "zero_point"):
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    onnx.save(model, str(tmp_path / "refused.onnx"))
    with pytest.raises(npu_graph.QnnUnavailable, match="refused"):
        npu_graph.qnn_htp_sessions({64: tmp_path / "refused.onnx"}, "73", "57")


def test_the_npu_gate_misses_only_on_a_disagreement_its_interval_shows():
    gold = {f"q{i}": ["paris"] for i in range(40)}
    cpu = {f"q{i}": "paris" for i in range(40)}
    two_differ = {**cpu, "q0": "lyon", "q1": "lyon"}
    gate = npu_graph.npu_gate(two_differ, cpu, gold, 0.96, 1.0)
    assert gate["verdict"] == RECORDED and gate["passed"] is None  # 38/40: the interval reaches 0.96, and the
    assert gate["f1_drop"] == 5.0 and gate["f1_drop_interval"][0] <= 1.0  # F1 loss's reaches the 1-point bound
    half_differ = {q: ("lyon" if i % 2 else "paris") for i, q in enumerate(cpu)}
    gate = npu_graph.npu_gate(half_differ, cpu, gold, 0.96, 1.0)
    assert gate["verdict"] == REJECTED and gate["passed"] is False and gate["interval"][1] < 0.96
    # where agreement is no gate (a deploy's config), the F1 the NPU loses still is
    gate = npu_graph.npu_gate(half_differ, cpu, gold, None, 1.0)
    assert gate["verdict"] == REJECTED and gate["value"] == 50.0 and gate["interval"][0] > gate["maximum"] == 1.0
    assert gate["answer_agreement"]["value"] == 0.5 and "minimum" not in gate
    # answers that differ without losing F1 (another span as good) are recorded only
    other_span = {q: "paris france" for q in cpu}
    assert npu_graph.npu_gate(other_span, cpu, {q: ["paris", "paris france"] for q in cpu}, None, 1.0)["verdict"] == RECORDED
