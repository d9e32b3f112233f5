"""pipeline/measurement/profiles.py: where a graph's time goes, per operator type, under onnxruntime's profiler."""

from pipeline.measurement.profiles import profile_graphs, profile_ops


def test_the_profile_attributes_kernel_time_to_operator_types(tiny_int8, tmp_path):
    ops = profile_ops(tiny_int8 / "int8.onnx", 32, 200, 2, tmp_path)
    assert ops and sum(op["share"] for op in ops) <= 1.0001
    assert any(op["op"] in ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat") for op in ops)


def test_several_graphs_are_profiled_by_name_in_order(tiny_int8):
    profiles = profile_graphs({"int8": tiny_int8 / "int8.onnx", "fp32": tiny_int8 / "fp32" / "model.onnx"}, 16, 200, 1)
    assert list(profiles) == ["int8", "fp32"]
    assert all(rows and {"op", "ms_per_run", "share"} == set(rows[0]) for rows in profiles.values())
