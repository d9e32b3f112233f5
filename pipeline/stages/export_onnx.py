"""Stage export_onnx: a trained QA model -> ONNX (fp32, optimum) and its fused graph (onnxruntime's optimizer).

Outputs, under the model's folder:
  fp32/       optimum's export (input_ids, attention_mask [+ token_type_ids for BERT, ELECTRA and MobileBERT],
              dynamic batch and sequence axes; start_logits, end_logits) with config and tokenizer: loads in
              ORTModelForQuestionAnswering.
  optimized/  the same graph after onnxruntime.transformers' BERT fusions (Attention, SkipLayerNormalization,
              EmbedLayerNormalization, BiasGelu; none match a MobileBERT graph with NoNorm), same layout.
  export.json fused-op counts, sizes, dev scores of both graphs through the torch-free answerer.
  parity.json largest |logit difference| against PyTorch on every dev window.
Gates (export.gates): both graphs within max_abs_logit_diff of PyTorch, and, answered by the torch-free answerer
(pipeline/runtime/answering.py), giving PyTorch's answer on min_pytorch_agreement of dev questions; verdicts are recorded
(a miss stops the rule only with export.gates.strict: the shipped graphs are gated on their own). Fusions fail
silently when the exported graph's pattern changes, so the rule fails unless the graph has the fusions its model
type has (pipeline/plan/model_types.py: one Attention per layer and one SkipLayerNormalization per sublayer in
BERT, DistilBERT and ELECTRA; no Attention in MobileBERT).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.data import qa_windows
from pipeline.export.gates import (REJECTED, agreement_gate, enforce_if_strict, gate_questions, logit_parity_report,
                                   overall_verdict)
from pipeline.export.onnx_graph import (MODEL_FILE, check_fusions, export_fp32, max_logit_difference, optimize_graph,
                                        windows_from_features)
from pipeline.outputs.artifacts import atomic_write_json, directory_size_bytes, megabytes
from pipeline.outputs.manifests import atomic_output_dir, verify_input_dirs
from pipeline.plan.config import PipelineConfig
from pipeline.runtime import answering, squad

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, model_dir: Path, data_dir: Path, out_dir: Path) -> dict:
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    verify_input_dirs(model_dir, data_dir)
    gates = cfg.export.gates
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    questions = gate_questions(data_dir, model_dir, cfg)
    dev = questions.records
    features = qa_windows.validation_windows(dev, tokenizer, cfg.squad)
    torch_start, torch_end = qa_windows.predict_window_logits(model, features, cfg.squad.eval_batch_size,
                                                              torch.device("cpu"))
    windows = windows_from_features(features)
    pytorch_predictions = questions.pytorch_predictions
    n_layers = model.config.num_hidden_layers

    with atomic_output_dir(out_dir, cfg) as tmp:
        export_fp32(model_dir, tmp / "fp32", cfg.export.opset)
        fused_ops = optimize_graph(tmp / "fp32", tmp / "optimized")
        check_fusions(fused_ops, model.config.model_type, n_layers, f"{out_dir}/optimized")
        parity = [
            logit_parity_report(variant, max_logit_difference(tmp / variant / MODEL_FILE, windows, torch_start,
                                                              torch_end, cfg.squad.eval_batch_size),
                                gates.max_abs_logit_diff, len(windows))
            for variant in ("fp32", "optimized")
        ]
        atomic_write_json(tmp / "parity.json", {"pytorch_model": str(model_dir), "reports": parity})

        # Both graphs through the torch-free answerer: its own tokenization, windows and n-best.
        examples, gold = questions.examples, questions.gold
        dev_scores = {}
        for variant in ("fp32", "optimized"):
            answerer = answering.QuestionAnswerer.with_squad_settings(
                tmp / variant / MODEL_FILE, tmp / variant / "tokenizer.json", cfg.squad, threads=1)
            predictions = answerer.predict(examples)
            agreement = agreement_gate(predictions, pytorch_predictions, gates.min_pytorch_agreement)
            parity_report = next(report for report in parity if report["name"] == variant)
            parity_report["gates"]["torch_free_answer_agreement"] = agreement
            parity_report["verdict"] = overall_verdict(parity_report["gates"])
            parity_report["passed"] = parity_report["verdict"] != REJECTED
            scores = squad.squad_v1_scores(gold, predictions)
            dev_scores[variant] = {"exact_match": round(scores["exact_match"], 3), "f1": round(scores["f1"], 3),
                                   "answer_agreement_with_pytorch": agreement["value"],
                                   "gates": parity_report["gates"], "verdict": parity_report["verdict"],
                                   "passed": parity_report["passed"]}
            atomic_write_json(tmp / variant / "predictions.json", predictions)
        metrics = {
            "model_dir": str(model_dir),
            "n_layers": n_layers,
            "opset": cfg.export.opset,
            "inputs": [i.name for i in answerer.session.get_inputs()],
            "outputs": [o.name for o in answerer.session.get_outputs()],
            "fp32": {"size_mb": megabytes(directory_size_bytes(tmp / "fp32" / MODEL_FILE)), **dev_scores["fp32"]},
            "optimized": {"size_mb": megabytes(directory_size_bytes(tmp / "optimized" / MODEL_FILE)),
                          **dev_scores["optimized"], "fused_ops": fused_ops},
            "pytorch": {"exact_match": questions.pytorch_exact_match, "f1": questions.pytorch_f1},
            "n_questions": len(examples),
            "parity": {report["name"]: report["max_abs_logit_diff"] for report in parity},
            "rejected": [report["name"] for report in parity if not report["passed"]],
        }
        atomic_write_json(tmp / "export.json", metrics)
        # The fp32 graphs are not shipped: the int8 and 4-bit graphs built from them are gated on their own answers.
        enforce_if_strict([{**report, "name": f"{out_dir}/{report['name']}"} for report in parity], str(out_dir),
                          gates.strict)
    logger.info("export_onnx %s: %s", model_dir, json.dumps(metrics))
    return metrics


# `python -m pipeline export-onnx`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "model_dir": "a trained QA model (save_pretrained folder)",
    "data_dir": "output of prepare_data (dev.jsonl)",
}
