"""Stage quantize_onnx: int8 (and 4-bit) ONNX graphs of one model, each scored on dev and gated.

Variants (onnxruntime.quantization):
  int8          the naive baseline: quantize_dynamic of the plain fp32 export with the target's settings. int8
                MatMul weights and an 8-bit word-embedding table (onnxruntime stores Gather tables in its
                activation type, uint8 with a zero point), activations quantized at run time.
  int8-<graph>-<format>-<scales>-<attention>
                the int8 search grid (export.quantize.search_*): graph plain / fused (onnxruntime's BERT fusions,
                QAttention) / noattn (LayerNorm, GELU and embedding fusions only); format qoperator (dynamic) or
                qdq (static, activation scales calibrated on training windows); per-tensor or per-channel weight
                scales; attention's activation x activation MatMuls in fp32 (attfp32) or int8 (att8).
  int4          4-bit weight-only blocks (MatMulNBits; optionally GatherBlockQuantized for the embeddings).
reduce_range comes from export.quantize.target (this machine's CPU by default; arm64 for phones), as does the
naive baseline's per-channel setting. Each variant is answered with the torch-free answerer on every dev question
and must give PyTorch's answer on min_answer_agreement of them and lose at most max_f1_drop F1; a variant that
fails is recorded, not bundled (the run fails only when no int8 variant passes).

The bundle takes the fastest int8 variant that passes its gates, timed here on the building machine (batch 1,
max_seq_length tokens, 1 thread; quantize.json keeps the runner-up and every timing): which one wins depends on
the CPU. The full-size search that the speed goals are about runs in the benchmark rule, on the reference
DistilBERT, over the recipes that passed on every trained model.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from pipeline import mobile, squad
from pipeline.artifacts import atomic_output_dir, atomic_write_json, directory_size_bytes, megabytes, read_json, setup_logging
from pipeline.artifacts import verify_input_dirs
from pipeline.config import PipelineConfig, QuantizeConfig, config_from_json
from pipeline.gates import compressed_model_report, gate_questions, raise_for_failures
from pipeline.latency import compare_latency, cpu_description

logger = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
NAIVE = "int8"
# Per target: (per_channel, reduce_range). u8s8 kernels without VNNI can overflow int16 accumulators, which
# reduce_range (7-bit weights) avoids; VNNI and ARM dot-product kernels use the full range, and per-channel scales
# cost little on ARM (onnxruntime's quantization guide).
TARGET_SETTINGS = {"x86-avx2": (False, True), "x86-vnni": (False, False), "arm64": (True, False)}
GRAPH_TAGS = {"plain": "plain", "fused": "fused", "fused-no-attention": "noattn"}
# Where each graph of the search comes from: export_onnx's folders, or built here from the fp32 export.
GRAPH_FOLDERS = {"plain": "fp32", "fused": "optimized", "fused-no-attention": "optimized-no-attention"}


@dataclass(frozen=True)
class Int8Recipe:
    """How one int8 graph is built."""

    graph: str  # plain | fused | fused-no-attention
    format: str  # qoperator | qdq
    per_channel: bool
    attention_int8: bool

    @property
    def name(self) -> str:
        return "-".join(["int8", GRAPH_TAGS[self.graph], self.format, "channel" if self.per_channel else "tensor",
                         "att8" if self.attention_int8 else "attfp32"])


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


def int8_recipes(cfg: QuantizeConfig, settings: dict) -> dict[str, Int8Recipe]:
    """The naive baseline first, then every valid combination of the search grid, by name."""
    naive = Int8Recipe("plain", "qoperator", settings["per_channel"], False)
    recipes = {NAIVE: naive}
    for graph in cfg.search_graphs:
        for quant_format in cfg.search_formats:
            for per_channel in cfg.search_per_channel:
                for attention_int8 in cfg.search_attention_int8:
                    recipe = Int8Recipe(graph, quant_format, per_channel, attention_int8)
                    # The fused graph's QAttention quantizes attention itself, and static QDQ does not cover
                    # the fused contrib ops (Attention, EmbedLayerNormalization).
                    if graph == "fused" and (quant_format == "qdq" or attention_int8):
                        continue
                    if recipe != naive:
                        recipes[recipe.name] = recipe
    return recipes


class CalibrationFeeds:
    """onnxruntime's CalibrationDataReader protocol over a fixed list of feeds (one window each)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = iter(feeds)

    def get_next(self):
        return next(self._feeds, None)

    def rewind(self):  # not needed for MinMax calibration, which reads the feeds once
        raise NotImplementedError


def calibration_feeds(windows: mobile.Windows, graph_path: Path, count: int) -> list[dict[str, np.ndarray]]:
    """Up to `count` windows as batch-1 feeds for the graph's own inputs, each cut to its real length."""
    inputs = [i.name for i in onnx.load(str(graph_path), load_external_data=False).graph.input]
    arrays = {"input_ids": windows.input_ids, "attention_mask": windows.attention_mask,
              "token_type_ids": windows.token_type_ids}
    feeds = []
    for row in range(min(count, len(windows))):
        length = int(windows.attention_mask[row].sum())
        feeds.append({name: arrays[name][row:row + 1, :length].astype(np.int64) for name in inputs})
    return feeds


def quantize_int8(source: Path, target: Path, recipe: Int8Recipe, reduce_range: bool,
                  calibration: list[dict[str, np.ndarray]] | None = None) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    extra_options: dict = {"MatMulConstBOnly": not recipe.attention_int8}
    if recipe.graph != "plain":
        # Shape inference does not type the fused ops' outputs; without a default the quantizer stops on them.
        extra_options["DefaultTensorType"] = onnx.TensorProto.FLOAT
    if recipe.format == "qoperator":
        quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=recipe.per_channel,
                         reduce_range=reduce_range, extra_options=extra_options)
        return
    if not calibration:
        raise ValueError(f"{target}: the qdq recipe {recipe.name} needs calibration windows")
    # The QDQ quantizer ignores MatMulConstBOnly, so attention's products stay fp32 by naming them.
    excluded = [] if recipe.attention_int8 else activation_matmuls(source)
    quantize_static(source, target, CalibrationFeeds(calibration), quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=["MatMul", "Gather"], activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=recipe.per_channel, reduce_range=reduce_range,
                    nodes_to_exclude=excluded, calibrate_method=CalibrationMethod.MinMax,
                    extra_options=extra_options)


def activation_matmuls(path: Path) -> list[str]:
    """Names of the MatMul nodes whose second input is computed, not a stored weight (attention's products)."""
    graph = onnx.load(str(path)).graph
    stored = {initializer.name for initializer in graph.initializer}
    stored |= {output for node in graph.node if node.op_type == "Constant" for output in node.output}
    names = [node.name for node in graph.node if node.op_type == "MatMul" and node.input[1] not in stored]
    if not all(names):
        raise ValueError(f"{path}: unnamed MatMul nodes cannot be kept out of static quantization")
    return names


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


def fp32_graph(onnx_dir: Path, graph: str, graphs_dir: Path) -> Path:
    """The fp32 graph a recipe quantizes: export_onnx's plain or fused one, or the no-attention fusion of the
    plain one, built once under graphs_dir."""
    from pipeline.stages import export_onnx

    if graph != "fused-no-attention":
        return onnx_dir / GRAPH_FOLDERS[graph] / MODEL_FILE
    folder = graphs_dir / GRAPH_FOLDERS[graph]
    if not (folder / MODEL_FILE).is_file():
        export_onnx.optimize_graph(onnx_dir / "fp32", folder, fuse_attention=False)
    return folder / MODEL_FILE


def build_variants(onnx_dir: Path, out_dir: Path, settings: dict, recipes: dict[str, Int8Recipe],
                   calibration_windows: mobile.Windows | None, calibration_count: int,
                   int4_block_size: int | None, int4_embeddings: bool, graphs_dir: Path) -> list[str]:
    """Every int8 recipe and, unless int4_block_size is None, int4, each in its own folder of out_dir with the fp32
    export's config and tokenizer; returns the variant names."""
    names = []
    for name, recipe in recipes.items():
        source = fp32_graph(onnx_dir, recipe.graph, graphs_dir)
        calibration = (calibration_feeds(calibration_windows, source, calibration_count)
                       if recipe.format == "qdq" and calibration_windows is not None else None)
        copy_side_files(onnx_dir / "fp32", out_dir / name)
        quantize_int8(source, out_dir / name / MODEL_FILE, recipe, settings["reduce_range"], calibration)
        names.append(name)
    if int4_block_size is not None:
        copy_side_files(onnx_dir / "fp32", out_dir / "int4")
        quantize_int4(onnx_dir / "fp32" / MODEL_FILE, out_dir / "int4" / MODEL_FILE, int4_block_size, int4_embeddings)
        names.append("int4")
    return names


def copy_side_files(source_dir: Path, target_dir: Path) -> None:
    target_dir.mkdir(parents=True, exist_ok=True)
    for path in source_dir.iterdir():
        if path.is_file() and path.suffix != ".onnx" and path.name != "predictions.json":
            shutil.copy(path, target_dir / path.name)


def choose_bundle_variant(variants: dict, tie_fraction: float) -> tuple[str | None, str | None, str]:
    """The fastest int8 variant that passed its gates, and the runner-up; near-equal medians go to the smaller file."""
    passing = sorted((name for name in variants if name.startswith(NAIVE) and variants[name]["passed"]),
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

    qcfg, gates = cfg.export.quantize, cfg.export.gates
    settings = quantization_settings(qcfg)
    questions = gate_questions(data_dir, model_dir, gates.dev_questions)
    examples, gold = questions.examples, questions.gold
    pytorch_predictions, pytorch_f1 = questions.pytorch_predictions, questions.pytorch_f1
    vocab_size = read_json(onnx_dir / "fp32" / "config.json")["vocab_size"]
    recipes = int8_recipes(qcfg, settings)
    needs_calibration = any(recipe.format == "qdq" for recipe in recipes.values())

    with atomic_output_dir(out_dir, cfg) as tmp:
        # Static activation scales come from training windows, never from the dev set they are scored on.
        calibration = training_windows(data_dir, onnx_dir, cfg, qcfg.calibration_windows) if needs_calibration else None
        names = build_variants(onnx_dir, tmp, settings, recipes, calibration, qcfg.calibration_windows,
                               qcfg.int4_block_size if qcfg.int4 else None, qcfg.int4_embeddings,
                               graphs_dir=tmp / "fp32-graphs")
        variants, reports = {}, []
        windows = None  # every variant has the export's tokenizer: the gate questions are tokenized once
        for name in names:
            answerer = mobile.QuestionAnswerer.with_squad_settings(
                tmp / name / MODEL_FILE, tmp / name / "tokenizer.json", cfg.squad, threads=threads)
            windows = answerer.windows(examples) if windows is None else windows
            predictions = answerer.predict(examples, windows)
            atomic_write_json(tmp / name / "predictions.json", predictions)
            report = compressed_model_report(f"{out_dir}/{name}", predictions, pytorch_predictions, gold, pytorch_f1,
                                             gates.min_answer_agreement, gates.max_f1_drop)
            reports.append(report)
            variants[name] = {
                "path": f"{name}/{MODEL_FILE}",
                "recipe": asdict(recipes[name]) if name in recipes else None,
                "size_mb": megabytes(directory_size_bytes(tmp / name / MODEL_FILE)),
                **{k: report[k] for k in ("exact_match", "f1", "f1_drop", "answer_agreement", "gates", "passed")},
                **weight_storage(tmp / name / MODEL_FILE),
            }
        shutil.rmtree(tmp / "fp32-graphs", ignore_errors=True)  # intermediate fp32 graphs, not outputs
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
            "n_questions": len(examples),
            "variants": variants,
            "int8_recipes": {name: asdict(recipe) for name, recipe in recipes.items()},
            "bundle_choice": choice,
            "runner_up": runner_up,
            "decided_by": decided_by,
        }
        atomic_write_json(tmp / "quantize.json", metrics)
        logger.info("quantize_onnx %s: %s", onnx_dir, json.dumps(metrics))
        # A search variant that misses its gates is recorded and left out; the run fails only when nothing
        # bundleable is left (the naive baseline and int4 keep their hard gates).
        raise_for_failures([report for name, report in zip(names, reports)
                            if name in (NAIVE, "int4") or choice is None], str(out_dir))
    return metrics


def training_windows(data_dir: Path, onnx_dir: Path, cfg: PipelineConfig, count: int) -> mobile.Windows:
    """The first `count` training questions' windows, tokenized as the answerer does (for qdq calibration)."""
    from pipeline.data import load_squad

    train, _ = load_squad(str(data_dir / "train.jsonl"))
    answerer = mobile.QuestionAnswerer.with_squad_settings(onnx_dir / "fp32" / MODEL_FILE,
                                                           onnx_dir / "fp32" / "tokenizer.json", cfg.squad, threads=1)
    return answerer.windows(squad.questions(train)[:count])


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
