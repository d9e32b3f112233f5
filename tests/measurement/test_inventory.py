"""pipeline/measurement/inventory.py: the benchmark's entries read from what the export rules wrote."""

import json

from pipeline.measurement.inventory import COREML_UNTIMED, NOT_TIMED_FULL_SIZE, full_size_artifacts


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
