"""Stage quantize_onnx: int8 (and 4-bit) ONNX graphs of one model, each scored on dev and gated.

Variants (onnxruntime.quantization):
  int8            quantize_dynamic of the plain fp32 export: int8 MatMul weights and an 8-bit word-embedding
                  table (onnxruntime stores Gather tables in its activation type, uint8 with a zero point),
                  activations quantized at run time. The naive baseline: the report shows what fusing buys.
  int8-optimized  quantize_dynamic of the fused graph (QAttention, QEmbedLayerNormalization, fused LayerNorms).
  int4            4-bit weight-only blocks (MatMulNBits; optionally GatherBlockQuantized for the embeddings).
Per-channel scales and reduce_range come from export.quantize.target (this machine's CPU by default; arm64 for
phones) unless set explicitly. Each variant is answered with the torch-free answerer on every dev question and
must give PyTorch's answer on min_answer_agreement of them and lose at most max_f1_drop F1.

The app bundle takes the fastest int8 variant that passes its gates, timed here on the building machine (batch 1,
max_seq_length tokens, 1 thread; quantize.json keeps the runner-up and both timings): which one wins depends on
the CPU (on a Xeon with VNNI/AMX the fused int8 attention was slower than the naive graph).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
from pathlib import Path

import onnx
from onnx import numpy_helper

from pipeline import mobile, squad
from pipeline.artifacts import atomic_output_dir, atomic_write_json, directory_size_bytes, megabytes, read_json, setup_logging
from pipeline.artifacts import verify_input_dirs
from pipeline.config import PipelineConfig, QuantizeConfig, config_from_json
from pipeline.gates import compressed_model_report, raise_for_failures
from pipeline.latency import compare_latency, cpu_description

logger = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
INT8_VARIANTS = ("int8", "int8-optimized")
# Per target: (per_channel, reduce_range). u8s8 kernels without VNNI can overflow int16 accumulators, which
# reduce_range (7-bit weights) avoids; VNNI and ARM dot-product kernels use the full range, and per-channel scales
# cost little on ARM (onnxruntime's quantization guide).
TARGET_SETTINGS = {"x86-avx2": (False, True), "x86-vnni": (False, False), "arm64": (True, False)}


def resolve_target(cfg: QuantizeConfig) -> str:
    if cfg.target != "auto":
        return cfg.target
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "arm64"
    flags = set(cpu_description()["simd_flags"])
    return "x86-vnni" if flags & {"avx512_vnni", "avx_vnni", "amx_int8"} else "x86-avx2"


def quantization_settings(cfg: QuantizeConfig) -> dict:
    target = resolve_target(cfg)
    per_channel, reduce_range = TARGET_SETTINGS[target]
    return {
        "target": target,
        "per_channel": per_channel if cfg.per_channel is None else cfg.per_channel,
        "reduce_range": reduce_range if cfg.reduce_range is None else cfg.reduce_range,
        "weight_type": "int8",  # uint8 weights ran 3x slower than int8 on x86 here
    }


def quantize_int8(source: Path, target: Path, settings: dict, fused: bool) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Shape inference does not type the fused ops' outputs; without a default the quantizer stops on them.
    extra_options = {"DefaultTensorType": onnx.TensorProto.FLOAT} if fused else None
    quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=settings["per_channel"],
                     reduce_range=settings["reduce_range"], extra_options=extra_options)


def quantize_int4(source: Path, target: Path, block_size: int, embeddings: bool) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # accuracy_level 4: int8 activations in the 4-bit kernels (the float path was slower than fp32 here).
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(source)), block_size=block_size, is_symmetric=True, accuracy_level=4,
        op_types_to_quantize=("MatMul", "Gather") if embeddings else ("MatMul",),
        quant_axes=(("MatMul", 0), ("Gather", 1)),
    )
    quantizer.process()
    quantizer.model.save_model_to_file(str(target), use_external_data_format=False)


def weight_storage(path: Path) -> dict:
    """Op counts of the graph and bytes of its stored tensors per data type (4-bit weights are packed in uint8)."""
    model = onnx.load(str(path))
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    stored: dict[str, int] = {}
    for initializer in model.graph.initializer:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(initializer.data_type).name
        stored[dtype] = stored.get(dtype, 0) + len(numpy_helper.to_array(initializer).tobytes())
    return {"ops": dict(sorted(ops.items(), key=lambda item: -item[1])), "stored_bytes_by_dtype": stored}


def build_variants(onnx_dir: Path, out_dir: Path, settings: dict, int4_block_size: int | None,
                   int4_embeddings: bool) -> list[str]:
    """int8 (naive), int8-optimized (fused) and, unless int4_block_size is None, int4, each in its own folder of
    out_dir with the fp32 export's config and tokenizer; returns the variant names."""
    builds = {
        "int8": lambda target: quantize_int8(onnx_dir / "fp32" / MODEL_FILE, target, settings, fused=False),
        "int8-optimized": lambda target: quantize_int8(onnx_dir / "optimized" / MODEL_FILE, target, settings,
                                                       fused=True),
    }
    if int4_block_size is not None:
        builds["int4"] = lambda target: quantize_int4(onnx_dir / "fp32" / MODEL_FILE, target, int4_block_size,
                                                      int4_embeddings)
    for name, build in builds.items():
        copy_side_files(onnx_dir / "fp32", out_dir / name)
        build(out_dir / name / MODEL_FILE)
    return list(builds)


def copy_side_files(source_dir: Path, target_dir: Path) -> None:
    target_dir.mkdir(parents=True, exist_ok=True)
    for path in source_dir.iterdir():
        if path.is_file() and path.suffix != ".onnx" and path.name != "predictions.json":
            shutil.copy(path, target_dir / path.name)


def choose_bundle_variant(variants: dict, tie_fraction: float) -> tuple[str | None, str | None, str]:
    """The fastest int8 variant that passed its gates, and the runner-up; near-equal medians go to the smaller file."""
    passing = sorted((name for name in INT8_VARIANTS if variants[name]["passed"]),
                     key=lambda name: variants[name]["latency_ms"]["p50"])
    if not passing:
        return None, None, "no int8 variant passed its gates"
    if len(passing) == 1:
        return passing[0], None, "the only int8 variant that passed its gates"
    fastest, second = passing[0], passing[1]
    fast_ms, second_ms = variants[fastest]["latency_ms"]["p50"], variants[second]["latency_ms"]["p50"]
    if second_ms - fast_ms > tie_fraction * fast_ms:
        return fastest, second, f"latency: p50 {fast_ms} ms vs {second_ms} ms"
    smaller, larger = sorted((fastest, second), key=lambda name: variants[name]["size_mb"])
    return smaller, larger, (f"size: p50 {fast_ms} ms vs {second_ms} ms is within {tie_fraction:.0%}, so the smaller "
                             f"file ({variants[smaller]['size_mb']} MB vs {variants[larger]['size_mb']} MB)")


def run(cfg: PipelineConfig, onnx_dir: Path, model_dir: Path, data_dir: Path, out_dir: Path, threads: int = 1) -> dict:
    verify_input_dirs(onnx_dir, model_dir, data_dir)
    from pipeline.data import load_squad

    qcfg, gates = cfg.export.quantize, cfg.export.gates
    settings = quantization_settings(qcfg)
    dev, _ = load_squad(str(data_dir / "dev.jsonl"))
    examples, gold = squad.questions(dev), squad.gold_answers(dev)
    pytorch_predictions = read_json(model_dir / "predictions.json")
    pytorch_f1 = read_json(model_dir / "metrics.json")["f1"]
    vocab_size = read_json(onnx_dir / "fp32" / "config.json")["vocab_size"]

    with atomic_output_dir(out_dir, cfg) as tmp:
        names = build_variants(onnx_dir, tmp, settings, qcfg.int4_block_size if qcfg.int4 else None,
                               qcfg.int4_embeddings)
        variants, reports = {}, []
        for name in names:
            answerer = mobile.QuestionAnswerer.with_squad_settings(
                tmp / name / MODEL_FILE, tmp / name / "tokenizer.json", cfg.squad, threads=threads)
            predictions = answerer.predict(examples)
            atomic_write_json(tmp / name / "predictions.json", predictions)
            report = compressed_model_report(f"{out_dir}/{name}", predictions, pytorch_predictions, gold, pytorch_f1,
                                             gates.min_answer_agreement, gates.max_f1_drop)
            reports.append(report)
            variants[name] = {
                "path": f"{name}/{MODEL_FILE}",
                "size_mb": megabytes(directory_size_bytes(tmp / name / MODEL_FILE)),
                **{k: report[k] for k in ("exact_match", "f1", "f1_drop", "answer_agreement", "gates", "passed")},
                **weight_storage(tmp / name / MODEL_FILE),
            }
        # Timed before the gates are enforced, so a failing run's log still says how fast each variant was.
        timings = compare_latency({name: tmp / name / MODEL_FILE for name in variants}, cfg.squad.max_seq_length,
                                  vocab_size, threads=1, runs=qcfg.latency_runs)
        for name, timing in timings.items():
            variants[name]["latency_ms"] = timing
        choice, runner_up, decided_by = choose_bundle_variant(variants, qcfg.latency_tie_fraction)
        metrics = {
            "settings": settings,
            "cpu": cpu_description(),
            "timing": {"sequence_length": cfg.squad.max_seq_length, "batch_size": 1, "threads": 1,
                       "runs": qcfg.latency_runs},
            "pytorch_f1": pytorch_f1,
            "variants": variants,
            "bundle_choice": choice,
            "runner_up": runner_up,
            "decided_by": decided_by,
        }
        atomic_write_json(tmp / "quantize.json", metrics)
        logger.info("quantize_onnx %s: %s", onnx_dir, json.dumps(metrics))
        raise_for_failures(reports, str(out_dir))
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline quantize-onnx", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--onnx-dir", required=True, type=Path, help="output of export_onnx")
    parser.add_argument("--model-dir", required=True, type=Path, help="the PyTorch model (its dev predictions and F1)")
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads for dev scoring")
    args = parser.parse_args(argv)
    setup_logging()
    run(config_from_json(args.config_json), args.onnx_dir, args.model_dir, args.data_dir, args.out_dir, args.threads)
    return 0
