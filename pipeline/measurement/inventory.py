"""The benchmark's entries: one per file the export rules wrote, with its size on disk, the dev scores its export
stage measured and the model's shape, latency not yet measured (workers.time_artifacts adds it). The trained models'
exports (or the deployed model's), the bundle's .ort and the full-size architectures are read here; the entries that
depend on what other stages chose (the int8 search's graph, the peers) are the benchmark stage's.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.outputs.artifacts import directory_size_bytes, megabytes, read_json
from pipeline.plan.config import PipelineConfig
from pipeline.plan.model_registry import bundled_model, exported_models, phone_models

COREML_UNTIMED = "CoreML prediction runs only on macOS; this benchmark ran on Linux"
NPU_UNTIMED = ("the NPU's latency cannot be measured here: the QNN HTP backend runs as an x86 emulation, whose "
               "seconds are not a phone's")
NOT_TIMED_FULL_SIZE = "not in benchmark.timed_full_size (each full-size timing takes tens of seconds)"


def artifact_entry(name, model, fmt, precision, path, dev=None, f1_source=None, timed=True, untimed_reason=None,
                   max_positions=None, vocab_size=None) -> dict:
    """A new benchmark entry for the artifact at `path`: its size and dev scores, latency not yet measured."""
    dev = dev or {}
    return {
        "name": name, "model": model, "format": fmt, "precision": precision, "path": str(path),
        "size_mb": megabytes(directory_size_bytes(path)),
        "exact_match": dev.get("exact_match"), "f1": dev.get("f1"), "f1_source": f1_source if dev else None,
        "timed": timed, "untimed_reason": untimed_reason, "max_positions": max_positions, "vocab_size": vocab_size,
    }


def model_shape(config_path: Path) -> dict:
    """An entry's max_positions and vocab_size, from the model's config.json."""
    config = read_json(config_path)
    return {"max_positions": config["max_position_embeddings"], "vocab_size": config["vocab_size"]}


def timed_if_named(name: str, timed_full_size: list[str]) -> dict:
    """A full-size artifact is timed only where benchmark.timed_full_size names it."""
    named = name in timed_full_size
    return {"timed": named, "untimed_reason": None if named else NOT_TIMED_FULL_SIZE}


def trained_artifacts(root: Path, cfg: PipelineConfig) -> list[dict]:
    """Every export of the trained models (or of the deployed one): the phone builds of export.phone_models' only;
    and the bundle's .ort."""
    items = []
    for model, stage in exported_models(cfg).items():
        shape = model_shape(root / stage / "config.json")
        items.append(artifact_entry(f"{model}/pytorch-fp32", model, "pytorch", "fp32",
                                    root / stage / "model.safetensors", read_json(root / stage / "metrics.json"),
                                    "pytorch", **shape))
        export = read_json(root / "onnx" / model / "export.json")
        for variant, precision in (("fp32", "fp32"), ("optimized", "fp32-optimized")):
            items.append(artifact_entry(f"{model}/onnx-{precision}", model, "onnx", precision,
                                        root / "onnx" / model / variant / "model.onnx", export[variant],
                                        "onnxruntime", **shape))
        quantized = root / "quantized" / model
        for variant, report in read_json(quantized / "quantize.json")["variants"].items():
            if report.get("runtime") == "openvino":  # the x86 target, answered and timed by its own runtime
                item = artifact_entry(f"{model}/{variant}", model, "openvino", "int8-nncf",
                                      quantized / report["path"], report, "openvino", **shape)
                item.update(size_mb=report["size_mb"], openvino_precision="default",
                            runtime_precision=report["runtime_precision"])
                items.append(item)
                continue
            items.append(artifact_entry(f"{model}/onnx-{variant}", model, "onnx", variant, quantized / report["path"],
                                        report, "onnxruntime", **shape))
        if model not in phone_models(cfg):
            continue  # no CoreML packages or NPU graphs (export.phone_models)
        coreml = read_json(root / "coreml" / model / "coreml.json")
        for variant, package in coreml["packages"].items():
            items.append(artifact_entry(f"{model}/coreml-{variant}", model, "coreml", variant,
                                        root / "coreml" / model / package["path"], package.get("dev"), "pytorch-proxy",
                                        timed=False, untimed_reason=COREML_UNTIMED, **shape))
        npu_json = root / "npu" / model / "npu.json"
        if npu_json.is_file():  # every length's graph: what an app ships
            npu = read_json(npu_json)
            items.append(artifact_entry(f"{model}/npu-int8-static", model, "onnx-npu", "int8-qdq-fixed-shapes",
                                        root / "npu" / model / npu["folder"], npu["dev"], "onnxruntime-cpu",
                                        timed=False, untimed_reason=NPU_UNTIMED, **shape))
    bundle, bundled = read_json(root / "bundle" / "metrics.json"), bundled_model(cfg)
    precision = "int8" if bundle["onnx_model"] == "model.int8.onnx" else "fp32"  # fp32: no int8 passed its gates
    items.append(artifact_entry(f"{bundled}/ort-{precision}", bundled, "ort", bundle["onnx_variant"],
                                root / "bundle" / bundle["ort_model"], bundle, "onnxruntime",
                                **model_shape(root / exported_models(cfg)[bundled] / "config.json")))
    return items


def full_size_artifacts(root: Path, architectures: list[str], timed: list[str]) -> list[dict]:
    """The full-size architectures' PyTorch model, ONNX graphs (all but the int8 search's) and CoreML packages."""
    items = []
    for architecture in architectures:
        folder = root / "full_size" / architecture
        report, shape = read_json(folder / "full_size.json"), model_shape(folder / "pytorch" / "config.json")
        name = f"{architecture}/pytorch-fp32"
        items.append(artifact_entry(name, architecture, "pytorch", "fp32", folder / "pytorch" / "model.safetensors",
                                    **timed_if_named(name, timed), **shape))
        for variant in report["onnx_size_mb"]:
            if variant.startswith("int8-"):
                continue  # the search variants: rule int8_search times them, and the benchmark adds the winner
            precision = "fp32-optimized" if variant == "optimized" else variant
            name = f"{architecture}/onnx-{precision}"
            items.append(artifact_entry(name, architecture, "onnx", precision, folder / "onnx" / variant / "model.onnx",
                                        **timed_if_named(name, timed), **shape))
        for variant, package in report["coreml"].items():
            items.append(artifact_entry(f"{architecture}/coreml-{variant}", architecture, "coreml", variant,
                                        folder / package["path"], timed=False, untimed_reason=COREML_UNTIMED, **shape))
        if report.get("npu"):
            items.append(artifact_entry(f"{architecture}/npu-int8-static-L{report['npu']['sequence_length']}",
                                        architecture, "onnx-npu", "int8-qdq-fixed-shapes", folder / report["npu"]["path"],
                                        timed=False, untimed_reason=NPU_UNTIMED, **shape))
    return items
