"""The x86 target: NNCF's post-training int8 of the fp32 export as an OpenVINO model, answered by the OpenVINO
runtime and gated like the ONNX variants (rule quantize_onnx; the bundle ships it in openvino/ when it passes).

Why NNCF and not our own static graph on OpenVINO: on a real BERT fine-tuned on real SQuAD questions, our MinMax
static graphs lost 5-23 F1 points there while NNCF's (SmoothQuant, its own range estimation, symmetric int8
activations that OpenVINO's int8 attention kernels take) kept the F1, and at full size NNCF's model runs faster
than onnxruntime runs our chosen int8 graph (docs/findings.md, "Peers and the x86 target"). OpenVINO and NNCF run
in a spawned process (pipeline/spawn.py).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np

from pipeline.export.gates import GateQuestions, compressed_model_report
from pipeline.export.int8 import copy_side_files
from pipeline.measurement.latency import synthetic_feed, time_calls
from pipeline.outputs.artifacts import atomic_write_json, megabytes, read_json
from pipeline.outputs.manifests import library_versions
from pipeline.runtime import answering
from pipeline.spawn import in_spawned_process

logger = logging.getLogger(__name__)

OPENVINO_VARIANT = "openvino-int8"
OPENVINO_FILE = "openvino_model.xml"  # with its weights beside it in openvino_model.bin


def nncf_int8(fp32_onnx: Path, out_dir: Path, calibration: list[dict[str, np.ndarray]]) -> tuple[Path, dict]:
    """NNCF's post-training int8 of the fp32 ONNX graph as an OpenVINO model in out_dir, calibrated on
    `calibration` (batch-1 feeds, as our static recipes get); returns the model's path and the settings used.
    Call it in a spawned process (pipeline.spawn) where the caller forks later."""
    import nncf
    import openvino

    model = openvino.convert_model(fp32_onnx)
    quantized = nncf.quantize(model, nncf.Dataset(calibration), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(calibration))
    out_dir.mkdir(parents=True, exist_ok=True)
    openvino.save_model(quantized, out_dir / OPENVINO_FILE, compress_to_fp16=False)
    versions = library_versions(("nncf", "openvino"))
    settings = {"tool": "nncf.quantize", "nncf": versions["nncf"], "openvino": versions["openvino"],
                "model_type": "transformer", "preset": "performance (nncf's default: symmetric int8)",
                "calibration_feeds": len(calibration)}
    return out_dir / OPENVINO_FILE, settings


def model_megabytes(path: Path) -> float:
    """Size of an OpenVINO model (the .xml and its .bin), in MB = 10^6 bytes."""
    return megabytes(sum(file.stat().st_size for file in (path, path.with_suffix(".bin")) if file.is_file()))


def build_and_gate(onnx_dir: Path, out_dir: Path, calibration: list[dict[str, np.ndarray]], questions: GateQuestions,
                   cfg, latency_runs: int) -> dict:
    """The OpenVINO variant in out_dir/openvino-int8, in a spawned process: built, answering the gated questions
    at the runtime's default precision on this CPU (what an x86 user gets) with 1 thread (as the bundle answers),
    judged by the gates and timed at 1 thread on its own; returns its quantize.json record."""
    # The spawned process reads the questions' texts and answers, not their datasets table: unpickling that would
    # import datasets (pandas, pyarrow) there, about half a second of every quantize_onnx job.
    texts_only = dataclasses.replace(questions, records=None)
    return in_spawned_process(build_and_gate_here, onnx_dir, out_dir, calibration, texts_only, cfg, latency_runs,
                              libraries=("nncf", "openvino"))


def build_and_gate_here(onnx_dir: Path, out_dir: Path, calibration: list[dict[str, np.ndarray]],
                        questions: GateQuestions, cfg, latency_runs: int) -> dict:
    """build_and_gate's work, in this process."""
    from pipeline.runtime.openvino_session import OpenVinoSession

    folder = out_dir / OPENVINO_VARIANT
    path, settings = nncf_int8(onnx_dir / "fp32" / "model.onnx", folder, calibration)
    copy_side_files(onnx_dir / "fp32", folder)
    gates = cfg.export.gates
    predictions = predict(path, folder / "tokenizer.json", cfg.squad, questions.examples, 1)
    atomic_write_json(folder / "predictions.json", predictions)
    report = compressed_model_report(f"{out_dir}/{OPENVINO_VARIANT}", predictions, questions.pytorch_predictions,
                                     questions.gold, questions.pytorch_f1, gates.min_answer_agreement,
                                     gates.max_f1_drop, gates.strict)
    session = OpenVinoSession(path, 1)
    feed = synthetic_feed(session, cfg.squad.max_seq_length, read_json(onnx_dir / "fp32" / "config.json")["vocab_size"])
    logger.info("%s: F1 %s (drop %s), %s", OPENVINO_VARIANT, report["f1"], report["f1_drop"], report["verdict"])
    return {
        "path": f"{OPENVINO_VARIANT}/{OPENVINO_FILE}",
        "runtime": "openvino",
        "runtime_precision": session.precision,  # what the default hint resolved to on this CPU
        "quantization": settings,
        "size_mb": model_megabytes(path),
        **{k: report[k] for k in ("exact_match", "f1", "f1_drop", "answer_agreement", "gates", "verdict", "passed")},
        # timed alone, in this process: the ONNX variants are timed in turn with each other, not with it
        "latency_ms": {**time_calls(lambda: session.run(None, feed), latency_runs, 1), "runs": latency_runs,
                       "timing": "own process"},
    }


def predict(model_path: Path, tokenizer_path: Path, squad_settings, examples: list[dict[str, str]],
            threads: int | None) -> dict[str, str]:
    """The answers of an OpenVINO model through the torch-free answerer, in this process (callers that go on to
    fork wrap it in in_spawned_process)."""
    answerer = answering.QuestionAnswerer.with_squad_settings(model_path, tokenizer_path, squad_settings,
                                                            threads=threads)
    return answerer.predict(examples)
