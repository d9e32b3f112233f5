"""Quantized ONNX graphs: the int8 recipes (naive baseline and search grid), 4-bit weight-only blocks, the target's
settings, and the choice among the variants that passed their gates (accuracy first, then latency on this machine).

onnxruntime.quantization does the quantizing; this module decides what to quantize and how.
"""

from __future__ import annotations

import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from pipeline.export.gates import GateError
from pipeline.export.onnx_graph import MODEL_FILE, optimize_graph
from pipeline.measurement.latency import DEFAULT_OPTIONS, compare_latency, fastest_first
from pipeline.measurement.statistics import paired_bootstrap_interval
from pipeline.outputs.artifacts import read_json
from pipeline.outputs.machine import cpu_description
from pipeline.plan.config import PipelineConfig, QuantizeConfig
from pipeline.plan.model_registry import bundled_model, exported_models
from pipeline.runtime import answering

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


def calibration_feeds(windows: answering.Windows, graph_path: Path, count: int) -> list[dict[str, np.ndarray]]:
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
                  calibration: list[dict[str, np.ndarray]] | None = None, *, only: list[str] | None = None,
                  exclude: list[str] | None = None) -> None:
    """The recipe's int8 graph of `source` at `target`; `only`: quantize just these nodes (the sensitivity step),
    `exclude`: keep these in fp32 (the fallback)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    extra_options: dict = {"MatMulConstBOnly": not recipe.attention_int8}
    if recipe.graph != "plain":
        # Shape inference does not type the fused ops' outputs; without a default the quantizer stops on them.
        extra_options["DefaultTensorType"] = onnx.TensorProto.FLOAT
    if recipe.format == "qoperator":
        quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=recipe.per_channel,
                         reduce_range=reduce_range, nodes_to_quantize=only or [], nodes_to_exclude=exclude or [],
                         extra_options=extra_options)
        return
    if not calibration:
        raise ValueError(f"{target}: the qdq recipe {recipe.name} needs calibration windows")
    # The QDQ quantizer ignores MatMulConstBOnly, so attention's products stay fp32 by naming them.
    excluded = ([] if recipe.attention_int8 else activation_matmuls(source)) + list(exclude or [])
    quantize_static(source, target, CalibrationFeeds(calibration), quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=["MatMul", "Gather"], activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=recipe.per_channel, reduce_range=reduce_range,
                    nodes_to_quantize=only or [], nodes_to_exclude=excluded, calibrate_method=CalibrationMethod.MinMax,
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
    if graph != "fused-no-attention":
        return onnx_dir / GRAPH_FOLDERS[graph] / MODEL_FILE
    folder = graphs_dir / GRAPH_FOLDERS[graph]
    if not (folder / MODEL_FILE).is_file():
        optimize_graph(onnx_dir / "fp32", folder, fuse_attention=False)
    return folder / MODEL_FILE


def build_variants(onnx_dir: Path, out_dir: Path, settings: dict, recipes: dict[str, Int8Recipe],
                   calibration_windows: answering.Windows | None, calibration_count: int,
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


def choose_bundle_variant(variants: dict, f1_by_question: dict[str, np.ndarray],
                          tie_fraction: float) -> tuple[str | None, str | None, str]:
    """Proof, then accuracy, then speed: among the int8 variants that ship (`passed`), the proven ones where there
    are any; of those, the ones not significantly less accurate than the most accurate one (the paired bootstrap
    95 % interval of their F1 difference reaches 0), then the fastest of these; near-equal medians go to the
    smaller file. Returns the choice, the runner-up and why. Marks each candidate's `accuracy_vs_best`."""
    shipping = [name for name in variants if name.startswith(NAIVE) and variants[name]["passed"]]
    if not shipping:
        return None, None, "no int8 variant passed its gates"
    proven = [name for name in shipping if variants[name].get("verdict") == "proven"]
    passing = proven or shipping
    proof = (f"{len(proven)} of {len(shipping)} shipping variants proven within the gates; "
             if proven else f"none of {len(shipping)} shipping variants proven within the gates (all unproven); ")
    most_accurate = max(passing, key=lambda name: (variants[name]["f1"], -variants[name]["latency_ms"]["p50"]))
    as_accurate = []
    for name in passing:
        low, high = paired_bootstrap_interval(f1_by_question[name] - f1_by_question[most_accurate])
        variants[name]["accuracy_vs_best"] = {"best": most_accurate, "f1_difference_interval": [low, high],
                                              "as_accurate": high >= 0}
        if high >= 0:
            as_accurate.append(name)
    as_accurate = fastest_first({name: variants[name]["latency_ms"] for name in as_accurate})
    less_accurate = len(passing) - len(as_accurate)
    accuracy = (f"{len(as_accurate)} of {len(passing)} passing variants as accurate as the best ({most_accurate}, "
                f"F1 {variants[most_accurate]['f1']})"
                + (f"; {less_accurate} significantly less accurate left out" if less_accurate else ""))
    accuracy = proof + accuracy
    if len(as_accurate) == 1:
        return as_accurate[0], None, f"accuracy: {accuracy}"
    fastest, second = as_accurate[0], as_accurate[1]
    fast_ms, second_ms = variants[fastest]["latency_ms"]["p50"], variants[second]["latency_ms"]["p50"]
    if second_ms - fast_ms > tie_fraction * fast_ms:
        return fastest, second, f"{accuracy}; then latency: p50 {fast_ms} ms vs {second_ms} ms"
    smaller, larger = sorted((fastest, second), key=lambda name: variants[name]["size_mb"])
    return smaller, larger, (f"{accuracy}; then size: p50 {fast_ms} ms vs {second_ms} ms is within "
                             f"{tie_fraction:.0%}, so the smaller file ({variants[smaller]['size_mb']} MB vs "
                             f"{variants[larger]['size_mb']} MB)")


# The full-size search: which recipe the speed goals are measured with (rule int8_search).


def recipes_passing_everywhere(root: Path, cfg: PipelineConfig) -> tuple[list[str], dict, str]:
    """int8 recipe names that passed their accuracy gates on every exported model, each model's verdicts, and which
    models decided: when no recipe passed everywhere, the recipes that passed on the bundled model (the one the
    app ships), said so in the third value."""
    verdicts = {}
    for model in exported_models(cfg):
        variants = read_json(root / "quantized" / model / "quantize.json")["variants"]
        verdicts[model] = {name: bool(report["passed"]) for name, report in variants.items() if name.startswith("int8")}
    names = sorted(set.intersection(*(set(name for name, ok in v.items() if ok) for v in verdicts.values())))
    if names:
        return names, verdicts, "every exported model"
    shipped = bundled_model(cfg)
    names = sorted(name for name, ok in verdicts[shipped].items() if ok)
    return names, verdicts, f"the bundled model ({shipped}) only: no recipe passed on every exported model"


def default_options_within_tie(timings: dict[str, dict[str, float]], pairs: dict[str, tuple[str, str]],
                               fastest: str, tie_fraction: float) -> tuple[str, str]:
    """The key of `timings` (`pairs` maps it to its recipe and session options) the search chooses, and why: the
    fastest, unless it runs with other session options than onnxruntime's default and the fastest pair with the
    default ones is within tie_fraction of it (export.quantize.latency_tie_fraction, the bundle's own tie): then
    that one, so the choice does not follow noise and an app needs no special session options for a gain no larger
    than the noise."""
    options = pairs[fastest][1]
    with_default = [key for key in fastest_first(timings) if pairs[key][1] == DEFAULT_OPTIONS]
    if options == DEFAULT_OPTIONS or not with_default:
        return fastest, "the fastest median"
    fast_ms, default_ms = timings[fastest]["p50"], timings[with_default[0]]["p50"]
    if default_ms - fast_ms > tie_fraction * fast_ms:
        return fastest, (f"the fastest median: {options} {fast_ms} ms against {default_ms} ms at best with the "
                         f"default options, beyond the {tie_fraction:.0%} tie")
    return with_default[0], (f"a tie: {options} {fast_ms} ms against {default_ms} ms with the default options, "
                             f"within {tie_fraction:.0%}, so the default options")


def search_int8(root: Path, cfg: PipelineConfig) -> dict:
    """The fastest gate-passing int8 recipe of the full-size DistilBERT, with its session options and runner-up."""
    bcfg = cfg.benchmark
    folder = root / "full_size" / "distilbert"
    full_size = read_json(folder / "full_size.json")
    vocab_size = read_json(folder / "pytorch" / "config.json")["vocab_size"]
    passing, verdicts, decided_on = recipes_passing_everywhere(root, cfg)
    candidates = [name for name in full_size["int8_recipes"] if name in passing]
    if not candidates:
        raise GateError(f"{root}/quantized/*/quantize.json: no int8 recipe of the full-size build passed its gates "
                        f"on {decided_on} ({verdicts})")
    length = max(bcfg.sequence_lengths)
    paths = {name: folder / "onnx" / name / "model.onnx" for name in candidates}
    first = compare_latency(paths, length, vocab_size, threads=1, runs=bcfg.search_runs, warmup=bcfg.warmup)
    finalists = fastest_first(first)[:2]
    pairs = {f"{name}|{options}": (name, options) for name in finalists for options in bcfg.session_options}
    second = compare_latency({key: paths[name] for key, (name, _) in pairs.items()}, length, vocab_size, threads=1,
                             runs=bcfg.search_runs, warmup=bcfg.warmup,
                             option_sets={key: options for key, (_, options) in pairs.items()})
    ranked = fastest_first(second)
    best, decided_by = default_options_within_tie(second, pairs, ranked[0], cfg.export.quantize.latency_tie_fraction)
    best_recipe, best_options = pairs[best]
    others = [key for key in ranked if key != best]  # the runner-up is never the choice itself
    runner_up = next((key for key in others if pairs[key][0] != best_recipe), others[0] if others else None)
    return {
        "sequence_length": length, "threads": 1, "runs": bcfg.search_runs, "gates_decided_on": decided_on,
        "candidates": {name: {"recipe": full_size["int8_recipes"][name], "latency_ms": first[name]}
                       for name in candidates},
        "rejected_by_gates": {name: {model: v.get(name) for model, v in verdicts.items()}
                              for name in full_size["int8_recipes"] if name not in passing},
        "session_options": {key: {"recipe": name, "session_options": options, "latency_ms": second[key]}
                            for key, (name, options) in pairs.items()},
        "choice": {"recipe": best_recipe, "session_options": best_options, "latency_ms": second[best],
                   "decided_by": decided_by},
        "runner_up": None if runner_up is None else {"recipe": pairs[runner_up][0],
                                                     "session_options": pairs[runner_up][1],
                                                     "latency_ms": second[runner_up]},
    }
