"""pipeline/measurement/inventory.py: the benchmark's entries read from what the export rules wrote."""

import json

import pytest

from pipeline.measurement.inventory import COREML_UNTIMED, NOT_TIMED_FULL_SIZE, full_size_artifacts, trained_artifacts
from pipeline.plan.config import PipelineConfig, from_dict


def write(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))


def test_full_size_entries_are_timed_only_where_named_and_leave_the_search_graphs_to_the_search(tmp_path):
    folder = tmp_path / "full_size" / "distilbert"
    write(folder / "pytorch" / "config.json", {"max_position_embeddings": 512, "vocab_size": 30522})
    write(folder / "pytorch" / "model.safetensors", "x" * 2_000_000)
    for variant in ("fp32", "optimized", "int8", "int8-plain-qdq"):
        write(folder / "onnx" / variant / "model.onnx", "x" * 1000)
    write(folder / "coreml" / "fp16.mlpackage" / "Data" / "weights.bin", "x" * 5000)
    write(folder / "coreml" / "fp16.mlpackage" / "Manifest.json", "x" * 5000)
    write(folder / "full_size.json", {"onnx_size_mb": {"fp32": 0.001, "optimized": 0.001, "int8": 0.001,
                                                       "int8-plain-qdq": 0.001},
                                      "coreml": {"fp16": {"path": "coreml/fp16.mlpackage"}}})
    items = full_size_artifacts(tmp_path, ["distilbert"], ["distilbert/pytorch-fp32", "distilbert/onnx-int8"])
    by_name = {item["name"]: item for item in items}
    assert list(by_name) == ["distilbert/pytorch-fp32", "distilbert/onnx-fp32", "distilbert/onnx-fp32-optimized",
                             "distilbert/onnx-int8", "distilbert/coreml-fp16"]  # the search's graph left out
    assert by_name["distilbert/pytorch-fp32"]["size_mb"] == 2.0 and by_name["distilbert/pytorch-fp32"]["timed"]
    assert by_name["distilbert/onnx-fp32-optimized"]["precision"] == "fp32-optimized"
    assert by_name["distilbert/onnx-fp32"]["untimed_reason"] == NOT_TIMED_FULL_SIZE
    assert by_name["distilbert/coreml-fp16"]["untimed_reason"] == COREML_UNTIMED
    assert by_name["distilbert/coreml-fp16"]["size_mb"] == 0.01  # every file of the package
    assert all(item["max_positions"] == 512 and item["vocab_size"] == 30522 and item["f1"] is None
               for item in items)


@pytest.mark.parametrize("phone_models", [["student"], ["student", "teacher"]])
def test_phone_builds_are_read_for_export_phone_models_alone(tmp_path, phone_models):
    """A model export.phone_models leaves out has no coreml/ or npu/ folder to read (the DAG plans none), and a
    stale one from an earlier build is not read either; its ONNX graphs are."""
    cfg = from_dict(PipelineConfig, {"export": {"models": ["student", "teacher"], "phone_models": phone_models}})
    for model, stage in (("student", "distill_squad"), ("teacher", "teacher")):
        write(tmp_path / stage / "config.json", {"max_position_embeddings": 256, "vocab_size": 500})
        write(tmp_path / stage / "model.safetensors", "x" * 1000)
        write(tmp_path / stage / "metrics.json", {"exact_match": 50.0, "f1": 60.0})
        write(tmp_path / "onnx" / model / "export.json", {"fp32": {"f1": 60.0}, "optimized": {"f1": 60.0}})
        for graph in ("fp32", "optimized"):
            write(tmp_path / "onnx" / model / graph / "model.onnx", "x" * 100)
        write(tmp_path / "quantized" / model / "quantize.json", {"variants": {}})
        # both models' phone builds on disk: the teacher's are stale where phone_models leaves it out
        write(tmp_path / "coreml" / model / "coreml.json", {"packages": {"fp16": {"path": "fp16.mlpackage"}}})
        write(tmp_path / "coreml" / model / "fp16.mlpackage" / "weights.bin", "x" * 100)
        write(tmp_path / "npu" / model / "npu.json", {"folder": "graphs", "dev": {"f1": 59.0}})
        write(tmp_path / "npu" / model / "graphs" / "model.L128.onnx", "x" * 100)
    write(tmp_path / "bundle" / "metrics.json", {"onnx_model": "model.int8.onnx", "onnx_variant": "int8",
                                                 "ort_model": "model.int8.ort"})
    write(tmp_path / "bundle" / "model.int8.ort", "x" * 100)
    names = [item["name"] for item in trained_artifacts(tmp_path, cfg)]
    for model in ("student", "teacher"):
        assert f"{model}/onnx-fp32" in names and f"{model}/onnx-fp32-optimized" in names
        phone = model in phone_models
        assert (f"{model}/coreml-fp16" in names) == phone and (f"{model}/npu-int8-static" in names) == phone
