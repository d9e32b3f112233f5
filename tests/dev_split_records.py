"""What a build's records say about the dev split (pipeline/export/dev_split.py): every int8 tuning step read tuning
questions only, and the gated questions are the ones every stage scored. Checked on the tiny student's exports
(tests/stages/test_export.py) and on the end-to-end builds (tests/test_pipeline_dag.py, tests/test_deploy.py)."""

import json
from pathlib import Path


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def assert_tuning_steps_read_no_gated_question(quantized_dir: Path, onnx_dir: Path, bundle_dir: Path | None = None):
    """quantize.json's `reads` (every tuning step) lie within its `tuning_ids` and outside its `gated_ids`, and the
    gated ids are the questions export_onnx, quantize_onnx's variants and the bundle scored. Returns quantize.json."""
    quantized = read_json(quantized_dir / "quantize.json")
    gated, tuning = quantized["gated_ids"], quantized["tuning_ids"]
    assert gated and tuning and not set(gated) & set(tuning), "gated and tuning questions overlap"
    split = quantized["dev_split"]
    assert (split["gated"], split["tuning"]) == (len(gated), len(tuning)) and quantized["n_questions"] == len(gated)
    for step, ids in quantized["reads"].items():
        assert ids and set(ids) <= set(tuning), f"{step} read questions outside the tuning ones"
        assert not set(ids) & set(gated), f"{step} read gated questions"
    for graph in ("fp32", "optimized"):  # export_onnx's answers, in the gated questions' order
        assert list(read_json(onnx_dir / graph / "predictions.json")) == gated, graph
    for name, variant in quantized["variants"].items():
        if variant["path"] is not None:  # built and scored (a failure has no path, and no answers)
            folder = quantized_dir / Path(variant["path"]).parent
            assert list(read_json(folder / "predictions.json")) == gated, name
    if bundle_dir is not None:
        assert read_json(bundle_dir / "metrics.json")["n_questions"] == len(gated)
    return quantized
