"""Accuracy-aware int8: the search the quantize stage calls once, in named steps.

  calibration   tuning questions the gates never score: held-out dev questions on paragraphs with no gated
                question (pipeline/export/dev_split.py), never training questions (the model was fitted on
                those). They calibrate the static (qdq) scales and drive the sensitivity and the fallback;
                quantize.json records the ids each step read (`reads`).
  build         every recipe of the grid (pipeline/export/int8.py), and the 4-bit graph; a recipe that cannot be
                built or scored is a failed variant with its reason, never shipped.
  fallback      a recipe whose tuning F1 drop is not shown within export.quantize.fallback's target is tuned as
                Intel Neural Compressor tunes post-training int8: each quantizable layer's sensitivity (the
                start/end distributions' KL divergence from the fp32 graph with only that layer quantized), then
                the most sensitive layers back to fp32, one at a time, until the tuning drop's paired interval
                lies within the target or the layer budget is spent (STOPPING_RULE). Only the recipes most
                accurate on the tuning questions are tuned (each costs one build per layer).
  gate          every variant answers the gated dev questions and is judged (pipeline/export/gates.py).
  timing        every variant timed in turn in one process, and each fallen-back recipe beside its graph
                without the fallback: what the fallback costs in latency.
  choice        among the variants that ship, proven before unproven, accuracy before speed (int8.py).
  x86 target    NNCF's int8 as an OpenVINO model (openvino_target.py), calibrated on the same tuning windows,
                gated and timed in its own runtime; the bundle ships it beside the ONNX choice when it passes.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

from pipeline.export.gates import GateQuestions, compressed_model_report, dev_records_and_split, failed_report
from pipeline.export.int8 import (MODEL_FILE, Int8Recipe, activation_matmuls, calibration_feeds,
                                  choose_bundle_variant, copy_side_files, fp32_graph, int8_recipes,
                                  quantization_settings, quantize_int4, quantize_int8, weight_storage)
from pipeline.export.openvino_target import OPENVINO_VARIANT, build_and_gate
from pipeline.measurement.latency import compare_latency, onnx_session
from pipeline.measurement.statistics import paired_bootstrap_interval, per_question_f1
from pipeline.outputs.artifacts import atomic_write_json, directory_size_bytes, megabytes, read_json
from pipeline.outputs.machine import cpu_description
from pipeline.plan.config import PipelineConfig
from pipeline.runtime import answering, squad

logger = logging.getLogger(__name__)

WITHOUT_FALLBACK = " (no fallback)"  # the timing key of a tuned recipe's graph before its fallback


@dataclass
class TuningQuestions:
    """Questions that calibrate and tune, never scored by the gates, with where they come from."""

    examples: list[dict[str, str]]
    gold: dict[str, list[str]]
    windows: answering.Windows
    source: str


# ------------------------------------------------------------------------------------------------ calibration


def tuning_records(data_dir: Path, cfg: PipelineConfig):
    """The dev questions (datasets records) the int8 search tunes on, never gated (pipeline/export/dev_split.py),
    and where they come from."""
    records, split = dev_records_and_split(data_dir, cfg)
    records = records.select(split.tuning_rows)
    return records, (f"{len(records)} held-out dev questions, on paragraphs with no gated question "
                     f"(dev_split: {split.rule})")


def tuning_questions(data_dir: Path, onnx_dir: Path, cfg: PipelineConfig) -> TuningQuestions:
    """The tuning questions (tuning_records) windowed by the fp32 export's tokenizer, and where they come from."""
    records, where = tuning_records(data_dir, cfg)
    answerer = answering.QuestionAnswerer.with_squad_settings(onnx_dir / "fp32" / MODEL_FILE,
                                                            onnx_dir / "fp32" / "tokenizer.json", cfg.squad, threads=1)
    examples = squad.questions(records)
    return TuningQuestions(examples, squad.gold_answers(records), answerer.windows(examples), where)


def window_question_ids(windows: answering.Windows, count: int | None = None) -> list[str]:
    """The question ids of the first `count` windows (all when None), once each, in order: what a step read."""
    return list(dict.fromkeys(windows.example_ids[:count]))


# ------------------------------------------------------------------------------------------------ sensitivity


class GraphAnswers:
    """A graph's start/end logits and answers on the tuning questions."""

    def __init__(self, path: Path, tuning: TuningQuestions, cfg: PipelineConfig):
        self.start, self.end = graph_logits(path, tuning.windows)
        candidates = squad.n_best_predictions(
            {"id": [e["id"] for e in tuning.examples], "context": [e["context"] for e in tuning.examples]},
            {"example_id": tuning.windows.example_ids, "offset_mapping": tuning.windows.context_offsets},
            self.start, self.end, n_best_size=cfg.squad.n_best_size, max_answer_length=cfg.squad.max_answer_length)
        self.predictions = {qid: (found[0]["text"] if found else "") for qid, found in candidates.items()}


def first_windows(windows: answering.Windows, count: int) -> answering.Windows:
    return answering.Windows(windows.example_ids[:count], windows.input_ids[:count], windows.attention_mask[:count],
                           windows.token_type_ids[:count], windows.context_offsets[:count])


def graph_logits(path: Path, windows: answering.Windows) -> tuple[np.ndarray, np.ndarray]:
    """A graph's start and end logits on `windows` (onnxruntime on one thread, the rule's)."""
    # onnxruntime ignores OMP_NUM_THREADS: unpinned, its pool would spin on the core of the job beside this rule
    return answering.window_logits(onnx_session(path, threads=1), windows)


def distribution_divergence(reference: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray],
                            mask: np.ndarray) -> float:
    """Mean KL divergence of the start and end distributions (softmax over each window's real tokens) of `other`
    from `reference` (each a (start, end) pair of logits): what decides the answer, unlike a raw logit difference
    that a shift would inflate."""
    total = 0.0
    for ours, theirs in zip(reference, other):
        p_log = log_softmax(np.where(mask, ours, -1e4))
        q_log = log_softmax(np.where(mask, theirs, -1e4))
        total += float((np.exp(p_log) * (p_log - q_log)).sum(axis=1).mean())
    return total / 2


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def quantizable_layers(graph_path: Path, recipe: Int8Recipe) -> list[str]:
    """The nodes a recipe quantizes, by name: MatMuls with a stored weight (and, with int8 attention, attention's
    activation products), fused Attention nodes, and Gathers of a stored table (the embeddings)."""
    graph = onnx.load(str(graph_path), load_external_data=False).graph
    stored = {initializer.name for initializer in graph.initializer}
    stored |= {output for node in graph.node if node.op_type == "Constant" for output in node.output}
    activation = set(activation_matmuls(graph_path)) if recipe.attention_int8 else set()
    names = []
    for node in graph.node:
        weighted = ((node.op_type in ("MatMul", "Attention") and node.input[1] in stored)
                    or (node.op_type == "Gather" and node.input[0] in stored))
        if weighted or node.name in activation:
            names.append(node.name)
    return names


def layer_sensitivity(source: Path, recipe: Int8Recipe, layers: list[str], reduce_range: bool,
                      calibration: list | None, tuning: TuningQuestions, cfg: PipelineConfig, scratch: Path,
                      side_files: Path) -> dict[str, float]:
    """Each layer's divergence from the fp32 graph with only that layer quantized, on the first
    export.quantize.fallback.sensitivity_windows tuning windows; most sensitive first."""
    windows = first_windows(tuning.windows, cfg.export.quantize.fallback.sensitivity_windows)
    mask = windows.attention_mask.astype(bool)
    reference = graph_logits(source, windows)
    copy_side_files(side_files, scratch)
    sensitivity = {}
    for layer in layers:
        quantize_int8(source, scratch / MODEL_FILE, recipe, reduce_range, calibration, only=[layer])
        sensitivity[layer] = round(distribution_divergence(reference, graph_logits(scratch / MODEL_FILE, windows),
                                                           mask), 6)
    shutil.rmtree(scratch, ignore_errors=True)
    return dict(sorted(sensitivity.items(), key=lambda item: -item[1]))


# ------------------------------------------------------------------------------------------------ fallback


def tuning_drop(graph: GraphAnswers, reference_f1: np.ndarray, tuning: TuningQuestions,
                reference: GraphAnswers) -> dict:
    """A graph against the fp32 graph on the tuning questions: the F1 drop with its paired bootstrap interval,
    answer agreement, and the label-free divergence of its start/end distributions over every tuning window."""
    drops = reference_f1 - per_question_f1(graph.predictions, tuning.gold)
    same = sum(graph.predictions[qid] == answer for qid, answer in reference.predictions.items())
    divergence = distribution_divergence((reference.start, reference.end), (graph.start, graph.end),
                                         tuning.windows.attention_mask.astype(bool))
    return {"f1_drop": round(float(drops.mean()), 3), "f1_drop_interval": list(paired_bootstrap_interval(drops)),
            "answer_agreement": round(same / len(reference.predictions), 4), "divergence": round(divergence, 6)}


# The fallback's stopping rule reads no noise: a step reaches the target only when the tuning drop's whole paired
# 95 % interval is within it (a point estimate on a few hundred questions moves by a point or more between
# samples); where no step reaches it, the step kept is the one closest to the fp32 graph by the label-free
# divergence over every tuning window, not the one with the luckiest F1.
STOPPING_RULE = ("a step reaches the target when the tuning F1 drop's paired bootstrap 95 % interval lies within "
                 "it; otherwise the step kept is the one with the smallest start/end KL divergence from the fp32 "
                 "graph over every tuning window")


def within_target(measured: dict, target: float) -> bool:
    return measured["f1_drop_interval"][1] <= target


def kept_step(measures: list[dict], target: float) -> int:
    """Index into `measures` (step 0: no fallback) of the step the fallback keeps (STOPPING_RULE)."""
    for index, measured in enumerate(measures):
        if within_target(measured, target):
            return index
    return min(range(len(measures)), key=lambda index: measures[index]["divergence"])


def fall_back(source: Path, target: Path, recipe: Int8Recipe, reduce_range: bool, calibration: list | None,
              tuning: TuningQuestions, reference: GraphAnswers, reference_f1: np.ndarray, before: dict,
              cfg: PipelineConfig, scratch: Path) -> dict:
    """The recipe's graph at `target` with its most sensitive layers in fp32, one more at a time, until the
    tuning F1 drop is shown within export.quantize.fallback.target_f1_drop (or max_layers are back); returns the
    record (sensitivity, each step, the layers that fell back, the rule). `target` keeps the chosen step's graph."""
    fcfg = cfg.export.quantize.fallback
    layers = quantizable_layers(source, recipe)
    sensitivity = layer_sensitivity(source, recipe, layers, reduce_range, calibration, tuning, cfg, scratch,
                                    side_files=target.parent)
    steps, fell_back, measures = [], [], [before]
    graphs = target.parent / "fallback-steps"
    graphs.mkdir(exist_ok=True)
    shutil.copy(target, graphs / "0.onnx")  # step 0: no fallback
    for layer in list(sensitivity)[:fcfg.max_layers]:
        fell_back.append(layer)
        quantize_int8(source, target, recipe, reduce_range, calibration, exclude=fell_back)
        shutil.copy(target, graphs / f"{len(fell_back)}.onnx")
        measured = tuning_drop(GraphAnswers(target, tuning, cfg), reference_f1, tuning, reference)
        steps.append({"layer": layer, "sensitivity": sensitivity[layer], **measured})
        measures.append(measured)
        logger.info("int8 fallback %s: %s back to fp32 -> tuning F1 drop %s %s", recipe.name, layer,
                    measured["f1_drop"], measured["f1_drop_interval"])
        if within_target(measured, fcfg.target_f1_drop):
            break
    chosen = kept_step(measures, fcfg.target_f1_drop)
    shutil.move(graphs / f"{chosen}.onnx", target)
    shutil.rmtree(graphs)
    return {"target_f1_drop": fcfg.target_f1_drop, "max_layers": fcfg.max_layers, "stopping_rule": STOPPING_RULE,
            "before": before, "sensitivity": sensitivity, "steps": steps, "fell_back": fell_back[:chosen],
            "after": measures[chosen], "reached_target": within_target(measures[chosen], fcfg.target_f1_drop),
            "reads": {"sensitivity": window_question_ids(tuning.windows, fcfg.sensitivity_windows),
                      "scoring": window_question_ids(tuning.windows)}}


# ------------------------------------------------------------------------------------------------ the search


def build_and_tune(onnx_dir: Path, out_dir: Path, cfg: PipelineConfig, settings: dict,
                   recipes: dict[str, Int8Recipe], tuning: TuningQuestions) -> tuple[list[str], dict, dict, dict]:
    """Every recipe built (and the 4-bit graph), the ones to tune tuned; returns the variant names built, each tuned
    recipe's fallback record, the graphs before their fallback (for the timing) and, by name, why a variant could
    not be built (a failure, never shipped)."""
    qcfg = cfg.export.quantize
    graphs_dir, names, sources, calibrations, failed = out_dir / "fp32-graphs", [], {}, {}, {}
    for name, recipe in recipes.items():
        try:
            sources[name] = fp32_graph(onnx_dir, recipe.graph, graphs_dir)
            calibrations[name] = (calibration_feeds(tuning.windows, sources[name], qcfg.calibration_windows)
                                  if recipe.format == "qdq" else None)
            copy_side_files(onnx_dir / "fp32", out_dir / name)
            quantize_int8(sources[name], out_dir / name / MODEL_FILE, recipe, settings["reduce_range"],
                          calibrations[name])
        except Exception as error:  # one recipe the quantizer cannot build fails alone, saying why
            failed[name] = failure_reason("build", error)
            logger.warning("int8 %s not built: %s", name, failed[name])
            continue
        names.append(name)
    if qcfg.int4:
        copy_side_files(onnx_dir / "fp32", out_dir / "int4")
        try:
            quantize_int4(onnx_dir / "fp32" / MODEL_FILE, out_dir / "int4" / MODEL_FILE, qcfg.int4_block_size,
                          qcfg.int4_embeddings)
            names.append("int4")
        except Exception as error:
            failed["int4"] = failure_reason("build", error)
    fallbacks, untuned = {}, {}
    built = [name for name in recipes if name in names]
    if qcfg.fallback.recipes == 0:
        return names, fallbacks, untuned, failed
    reference = GraphAnswers(onnx_dir / "fp32" / MODEL_FILE, tuning, cfg)
    reference_f1 = per_question_f1(reference.predictions, tuning.gold)
    before = {name: tuning_drop(GraphAnswers(out_dir / name / MODEL_FILE, tuning, cfg), reference_f1,
                                tuning, reference) for name in built}
    over = sorted((name for name in built if not within_target(before[name], qcfg.fallback.target_f1_drop)),
                  key=lambda name: before[name]["f1_drop"])
    for name in over[:qcfg.fallback.recipes]:  # the most accurate of those not shown within the target
        untuned[name] = out_dir / "untuned" / name / MODEL_FILE
        copy_side_files(onnx_dir / "fp32", untuned[name].parent)
        shutil.copy(out_dir / name / MODEL_FILE, untuned[name])
        try:
            fallbacks[name] = fall_back(sources[name], out_dir / name / MODEL_FILE, recipes[name],
                                        settings["reduce_range"], calibrations[name], tuning, reference,
                                        reference_f1, before[name], cfg, out_dir / "sensitivity")
        except Exception as error:  # a fallback that breaks leaves the recipe a failure, not its untuned graph
            failed[name] = failure_reason("fallback", error)
            names.remove(name)
            del untuned[name]
    for name in built:
        not_tuned = (f"not shown within the target, not among the {qcfg.fallback.recipes} most accurate such "
                     "recipes" if name in over else "shown within the target on the tuning questions")
        fallbacks.setdefault(name, {"before": before[name], "fell_back": [], "not_tuned": not_tuned})
    return names, fallbacks, untuned, failed


def failure_reason(step: str, error: BaseException) -> str:
    """One line: the step that failed, the exception's type and its first line."""
    return f"{step} failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".rstrip(": ")


def search(onnx_dir: Path, data_dir: Path, out_dir: Path, cfg: PipelineConfig, questions: GateQuestions,
           threads: int) -> dict:
    """The whole int8 search into out_dir, in its named steps: the target's settings and the recipe grid, the
    tuning questions (calibration), every variant built and tuned (sensitivity, fallback), gated on `questions`,
    timed, and the bundle's choice. Returns quantize.json's record."""
    qcfg = cfg.export.quantize
    settings = quantization_settings(qcfg)
    recipes = int8_recipes(qcfg, settings)
    tuning = tuning_questions(data_dir, onnx_dir, cfg)
    variants, f1_by_question, fallback_reads = build_gate_and_time(onnx_dir, out_dir, cfg, settings, recipes,
                                                                   tuning, questions, threads)
    choice, runner_up, decided_by = choose_bundle_variant(variants, f1_by_question, qcfg.latency_tie_fraction)
    static = any(recipe.format == "qdq" for recipe in recipes.values())
    reads = {**({"static_calibration": window_question_ids(tuning.windows, qcfg.calibration_windows)} if static
                else {}), **fallback_reads}
    left_out_targets = {}
    if qcfg.openvino:  # the x86 target, calibrated as the static recipes are; never the ONNX bundle's choice
        calibration = calibration_feeds(tuning.windows, onnx_dir / "fp32" / MODEL_FILE, qcfg.calibration_windows)
        reads["openvino_calibration"] = window_question_ids(tuning.windows, qcfg.calibration_windows)
        missing = openvino_missing()
        if missing:  # the optional target cannot run here at all: said so, not a variant
            left_out_targets[OPENVINO_VARIANT] = missing
        else:
            try:
                variants[OPENVINO_VARIANT] = build_and_gate(onnx_dir, out_dir, calibration, questions, cfg,
                                                            qcfg.latency_runs)
            except Exception as error:
                if isinstance(error, answering.BundleError) and PLUGIN_REFUSAL in str(error):
                    # this machine's CPU plugin cannot run the model (some CPUs and narrowed SIMD settings): the
                    # target cannot be built here at all, said so, as where its packages are missing
                    left_out_targets[OPENVINO_VARIANT] = f"{CPU_PLUGIN_REFUSED}: {str(error).splitlines()[0]}"
                    logger.warning("%s left out: %s", OPENVINO_VARIANT, left_out_targets[OPENVINO_VARIANT])
                else:  # a model NNCF or OpenVINO cannot take: a failed variant, never shipped
                    reason = failure_reason("build or scoring", error)
                    logger.warning("%s failed: %s", OPENVINO_VARIANT, reason)
                    variants[OPENVINO_VARIANT] = {"path": None, "runtime": "openvino",
                                                  **failed_report(f"{out_dir}/{OPENVINO_VARIANT}", reason)}
    return {
        "settings": settings,
        "cpu": cpu_description(),
        "timing": {"sequence_length": cfg.squad.max_seq_length, "batch_size": 1, "threads": 1,
                   "runs": qcfg.latency_runs},
        "pytorch_f1": questions.pytorch_f1,
        "n_questions": len(questions.examples),
        "dev_split": questions.split.record(),
        "gated_ids": [example["id"] for example in questions.examples],
        "tuning_ids": [example["id"] for example in tuning.examples],
        "reads": reads,  # the question ids each tuning step read: tuning ones only
        "variants": variants,
        "int8_recipes": {name: asdict(recipe) for name, recipe in recipes.items()},
        "tuned_on": tuning.source,  # also what calibrated the static scales
        "left_out_targets": left_out_targets,
        "rejected": sorted(name for name in variants if variants[name]["verdict"] == "rejected"),
        "not_shipped": sorted(name for name in variants if not variants[name]["passed"]),
        "bundle_choice": choice,
        "runner_up": runner_up,
        "decided_by": decided_by,
    }


# The answerer's words for a model the runtime cannot open (answering._open_session), and how quantize.json says it.
PLUGIN_REFUSAL = "not a loadable OpenVINO model"
CPU_PLUGIN_REFUSED = "OpenVINO's CPU plugin refused the model on this machine"


def openvino_missing() -> str | None:
    """Why the x86 target cannot be built on this machine at all (a package not installed), or None."""
    import importlib.util

    absent = [name for name in ("openvino", "nncf") if importlib.util.find_spec(name) is None]
    return f"not installed: {', '.join(absent)} (pip install openvino nncf)" if absent else None


def build_gate_and_time(onnx_dir: Path, out_dir: Path, cfg: PipelineConfig, settings: dict,
                        recipes: dict[str, Int8Recipe], tuning: TuningQuestions, questions: GateQuestions,
                        threads: int) -> tuple[dict, dict, dict]:
    """Build, tune, gate and time every variant into out_dir; returns the variants' records (a variant that could
    not be built or scored is a failure with its reason), the per-question F1 of each scored one (for the choice)
    and the question ids the fallback read."""
    gates, qcfg = cfg.export.gates, cfg.export.quantize
    names, fallbacks, untuned, failed = build_and_tune(onnx_dir, out_dir, cfg, settings, recipes, tuning)
    variants, f1_by_question, windows = {}, {}, None
    for name in names:
        try:
            answerer = answering.QuestionAnswerer.with_squad_settings(
                out_dir / name / MODEL_FILE, out_dir / name / "tokenizer.json", cfg.squad, threads=threads)
            windows = answerer.windows(questions.examples) if windows is None else windows  # one tokenizer for all
            predictions = answerer.predict(questions.examples, windows)
        except Exception as error:  # a graph the runtime cannot run: a failure, never shipped
            failed[name] = failure_reason("scoring", error)
            continue
        atomic_write_json(out_dir / name / "predictions.json", predictions)
        report = compressed_model_report(f"{out_dir}/{name}", predictions, questions.pytorch_predictions,
                                         questions.gold, questions.pytorch_f1, gates.min_answer_agreement,
                                         gates.max_f1_drop, gates.strict)
        f1_by_question[name] = per_question_f1(predictions, questions.gold)
        variants[name] = {
            "path": f"{name}/{MODEL_FILE}",
            "recipe": asdict(recipes[name]) if name in recipes else None,
            "size_mb": megabytes(directory_size_bytes(out_dir / name / MODEL_FILE)),
            **{k: report[k] for k in ("exact_match", "f1", "f1_drop", "answer_agreement", "gates", "verdict",
                                      "passed")},
            **({"fallback": fallbacks[name]} if name in fallbacks else {}),
            **weight_storage(out_dir / name / MODEL_FILE),
        }
    # Timed in turn in one process, each tuned recipe beside its graph before the fallback.
    paths = {name: out_dir / name / MODEL_FILE for name in variants}
    paths.update({name + WITHOUT_FALLBACK: path for name, path in untuned.items() if name in variants})
    vocab_size = read_json(onnx_dir / "fp32" / "config.json")["vocab_size"]
    timings = compare_latency(paths, cfg.squad.max_seq_length, vocab_size, threads=1, runs=qcfg.latency_runs)
    for name in variants:
        variants[name]["latency_ms"] = timings[name]
        if name in untuned:
            cost = timings[name]["p50"] - timings[name + WITHOUT_FALLBACK]["p50"]
            variants[name]["fallback"]["latency_ms_without_fallback"] = timings[name + WITHOUT_FALLBACK]
            variants[name]["fallback"]["latency_cost_ms_p50"] = round(cost, 3)
    for name, reason in failed.items():
        variants[name] = {"path": None, "recipe": asdict(recipes[name]) if name in recipes else None,
                          **failed_report(f"{out_dir}/{name}", reason)}
    shutil.rmtree(out_dir / "fp32-graphs", ignore_errors=True)  # intermediate graphs, not outputs
    shutil.rmtree(out_dir / "untuned", ignore_errors=True)
    reads = next(({f"fallback_{step}": ids for step, ids in record["reads"].items()}
                  for record in fallbacks.values() if "reads" in record), {})
    return variants, f1_by_question, reads
