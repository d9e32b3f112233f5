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
and is gated (export.gates: answer agreement and F1 drop, each judged by its 95 % interval); a variant that
misses a gate is recorded as rejected and not bundled (the bundle rule stops when nothing passed).

The bundle takes, among the int8 variants that passed, those not significantly less accurate than the most
accurate one (paired bootstrap of their F1 difference), and of these the fastest, timed here on the building
machine (batch 1, max_seq_length tokens, 1 thread; quantize.json keeps the runner-up and every timing): which one
wins depends on the CPU. The recipes, their builder, the timer (pipeline.latency) and the ranking by latency are
the ones of the full-size search that the speed goals are about (rule int8_search, on the full-size DistilBERT,
over the recipes that passed on every exported model).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict
from pathlib import Path

from pipeline import onnx_qa, squad
from pipeline.artifacts import atomic_output_dir, atomic_write_json, directory_size_bytes, megabytes, read_json
from pipeline.manifests import verify_input_dirs
from pipeline.config import PipelineConfig
from pipeline.export.int8 import (MODEL_FILE, NAIVE, build_variants, choose_bundle_variant, int8_recipes,
                                  quantization_settings, weight_storage)
from pipeline.gates import compressed_model_report, enforce_if_strict, gate_questions
from pipeline.statistics import per_question_f1
from pipeline.latency import compare_latency
from pipeline.machine import cpu_description

logger = logging.getLogger(__name__)


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

    calibration, calibrated_on = (calibration_windows(data_dir, onnx_dir, cfg, qcfg.calibration_windows)
                                  if needs_calibration else (None, None))
    left_out = {}
    if needs_calibration and calibration is None:
        left_out = {name: calibrated_on for name, recipe in recipes.items() if recipe.format == "qdq"}
        recipes = {name: recipe for name, recipe in recipes.items() if name not in left_out}
    with atomic_output_dir(out_dir, cfg) as tmp:
        names = build_variants(onnx_dir, tmp, settings, recipes, calibration, qcfg.calibration_windows,
                               qcfg.int4_block_size if qcfg.int4 else None, qcfg.int4_embeddings,
                               graphs_dir=tmp / "fp32-graphs")
        variants, reports, f1_by_question = {}, [], {}
        windows = None  # every variant has the export's tokenizer: the gate questions are tokenized once
        for name in names:
            answerer = onnx_qa.QuestionAnswerer.with_squad_settings(
                tmp / name / MODEL_FILE, tmp / name / "tokenizer.json", cfg.squad, threads=threads)
            windows = answerer.windows(examples) if windows is None else windows
            predictions = answerer.predict(examples, windows)
            atomic_write_json(tmp / name / "predictions.json", predictions)
            report = compressed_model_report(f"{out_dir}/{name}", predictions, pytorch_predictions, gold, pytorch_f1,
                                             gates.min_answer_agreement, gates.max_f1_drop)
            reports.append(report)
            f1_by_question[name] = per_question_f1(predictions, gold)
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
        choice, runner_up, decided_by = choose_bundle_variant(variants, f1_by_question, qcfg.latency_tie_fraction)
        metrics = {
            "settings": settings,
            "cpu": cpu_description(),
            "timing": {"sequence_length": cfg.squad.max_seq_length, "batch_size": 1, "threads": 1,
                       "runs": qcfg.latency_runs},
            "pytorch_f1": pytorch_f1,
            "n_questions": len(examples),
            "variants": variants,
            "int8_recipes": {name: asdict(recipe) for name, recipe in recipes.items()},
            "calibrated_on": calibrated_on,
            "left_out_recipes": left_out,
            "rejected": sorted(name for name in variants if not variants[name]["passed"]),
            "bundle_choice": choice,
            "runner_up": runner_up,
            "decided_by": decided_by,
        }
        atomic_write_json(tmp / "quantize.json", metrics)
        logger.info("quantize_onnx %s: %s", onnx_dir, json.dumps(metrics))
        # A variant that misses its gates is recorded and left out of the bundle and the full-size search; the
        # bundle rule stops when the model it ships has no passing int8 variant.
        enforce_if_strict(reports, str(out_dir), gates.strict)
    return metrics


def calibration_windows(data_dir: Path, onnx_dir: Path, cfg: PipelineConfig,
                        count: int) -> tuple[onnx_qa.Windows | None, str]:
    """Windows of up to `count` questions that calibrate the static (qdq) activation scales, never ones the gates
    score, and where they come from: the first training questions; for a deploy (no training set), the dev
    questions past export.gates.dev_questions; None, with the reason, when there are none."""
    from pipeline.data import load_squad

    if (data_dir / "train.jsonl").is_file():
        questions, where = squad.questions(load_squad(str(data_dir / "train.jsonl"))[0])[:count], "training questions"
    else:
        dev = squad.questions(load_squad(str(data_dir / "dev.jsonl"))[0])
        gated = cfg.export.gates.dev_questions or len(dev)
        questions, where = dev[gated:gated + count], f"dev questions past the {gated} the gates score"
    if not questions:
        return None, (f"no training questions and no dev questions past the {cfg.export.gates.dev_questions} gated "
                      "ones to calibrate static scales on (a longer dev set, data.max_dev_examples, gives some)")
    answerer = onnx_qa.QuestionAnswerer.with_squad_settings(onnx_dir / "fp32" / MODEL_FILE,
                                                            onnx_dir / "fp32" / "tokenizer.json", cfg.squad, threads=1)
    return answerer.windows(questions), f"{len(questions)} {where}"


# `python -m pipeline quantize-onnx`: run()'s parameters as flags (pipeline/stage_cli.py), with this help.
FLAG_HELP = {
    "onnx_dir": "output of export_onnx",
    "model_dir": "the PyTorch model (its dev predictions and F1)",
    "threads": "onnxruntime threads for dev scoring",
}
