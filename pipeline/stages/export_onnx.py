"""Stage export_onnx: a trained QA model -> ONNX (fp32, optimum) and its fused graph (onnxruntime's optimizer).

Outputs, under the model's folder:
  fp32/       optimum's export (input_ids, attention_mask [+ token_type_ids for BERT], dynamic batch and sequence
              axes; start_logits, end_logits) with config and tokenizer: loads in ORTModelForQuestionAnswering.
  optimized/  the same graph after onnxruntime.transformers' BERT fusions (Attention, SkipLayerNormalization,
              EmbedLayerNormalization, BiasGelu), same layout.
  export.json fused-op counts, sizes, dev scores of both graphs through the torch-free answerer.
  parity.json largest |logit difference| against PyTorch on every dev window.
Gates (export.gates): both graphs within max_abs_logit_diff of PyTorch, and, answered by the torch-free answerer
(pipeline/mobile.py), giving PyTorch's answer on min_reference_agreement of dev questions. Fusions fail
silently when the exported graph's pattern changes, so the rule also fails unless there is one Attention per
layer and one SkipLayerNormalization per sublayer (two per layer).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

import numpy as np

from pipeline import mobile, qa, squad
from pipeline.artifacts import atomic_output_dir, atomic_write_json, directory_size_bytes, megabytes, setup_logging
from pipeline.artifacts import verify_input_dirs
from pipeline.config import PipelineConfig, config_from_json
from pipeline.gates import GateError, answer_agreement, gate_questions, logit_parity_report, raise_for_failures

logger = logging.getLogger(__name__)

FUSED_OPS = ("Attention", "MultiHeadAttention", "SkipLayerNormalization", "EmbedLayerNormalization", "BiasGelu",
             "FastGelu", "Gelu", "LayerNormalization")
MODEL_FILE = "model.onnx"


def export_fp32(model_dir: Path, out_dir: Path, opset: int | None) -> None:
    """optimum's question-answering export; optimum also checks the graph against PyTorch on random inputs."""
    from optimum.exporters.onnx import main_export

    main_export(str(model_dir), output=str(out_dir), task="question-answering", opset=opset, device="cpu",
                do_validation=True)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / name).is_file() and not (out_dir / name).is_file():
            shutil.copy(model_dir / name, out_dir / name)


def optimize_graph(fp32_dir: Path, out_dir: Path, fuse_attention: bool = True) -> dict[str, int]:
    """onnxruntime's transformer fusions with the model's own head count and width; returns fused-op counts.
    fuse_attention=False keeps attention as plain MatMul/Softmax nodes and fuses the rest (an int8 search graph)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(fp32_dir)
    options = FusionOptions("bert")
    options.enable_attention = fuse_attention
    # model_type "bert" covers DistilBERT too: its fusions match both exported graphs.
    optimized = optimize_model(str(fp32_dir / MODEL_FILE), model_type="bert", num_heads=config.num_attention_heads,
                               hidden_size=config.hidden_size, optimization_options=options)
    out_dir.mkdir(parents=True, exist_ok=True)
    optimized.save_model_to_file(str(out_dir / MODEL_FILE))
    for path in fp32_dir.iterdir():  # config and tokenizer, so the folder loads like the fp32 one
        if path.is_file() and path.name != MODEL_FILE:
            shutil.copy(path, out_dir / path.name)
    statistics = optimized.get_fused_operator_statistics()
    return {op: int(statistics.get(op, 0)) for op in FUSED_OPS}


def check_fusions(fused_ops: dict[str, int], n_layers: int, where: str) -> None:
    """One attention per layer and a skip-LayerNorm after each sublayer, or the optimizer missed the pattern."""
    attention = fused_ops["Attention"] + fused_ops["MultiHeadAttention"]
    problems = []
    if attention != n_layers:
        problems.append(f"Attention/MultiHeadAttention {attention}, expected {n_layers} (one per layer)")
    if fused_ops["SkipLayerNormalization"] != 2 * n_layers:
        problems.append(f"SkipLayerNormalization {fused_ops['SkipLayerNormalization']}, expected {2 * n_layers} "
                        "(after attention and after the feed-forward block of each layer)")
    if problems:
        raise GateError(f"{where}: the transformer optimizer did not fuse the graph as expected: "
                        + "; ".join(problems) + f" (all counts: {fused_ops})")


def max_logit_difference(onnx_path: Path, windows: mobile.Windows, torch_start, torch_end, batch_size: int) -> float:
    """Largest |ONNX - PyTorch| over start and end logits at every real (unpadded) window position."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1  # onnxruntime ignores OMP_NUM_THREADS; the rule has one thread
    session = onnxruntime.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    onnx_start, onnx_end = mobile.window_logits(session, windows, batch_size)
    real = windows.attention_mask.astype(bool)
    return float(max(np.abs(onnx_start - torch_start)[real].max(), np.abs(onnx_end - torch_end)[real].max()))


def windows_from_features(features) -> mobile.Windows:
    """The training code's dev windows (transformers tokenizer) in the torch-free answerer's layout."""
    columns = features.with_format("numpy")
    token_type_ids = (np.asarray(columns["token_type_ids"]) if "token_type_ids" in features.column_names
                      else np.zeros_like(np.asarray(columns["input_ids"])))
    return mobile.Windows(
        example_ids=list(features["example_id"]),
        input_ids=np.asarray(columns["input_ids"], dtype=np.int64),
        attention_mask=np.asarray(columns["attention_mask"], dtype=np.int64),
        token_type_ids=token_type_ids.astype(np.int64),
        context_offsets=list(features["offset_mapping"]),
    )


def run(cfg: PipelineConfig, model_dir: Path, data_dir: Path, out_dir: Path) -> dict:
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    verify_input_dirs(model_dir, data_dir)
    gates = cfg.export.gates
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    questions = gate_questions(data_dir, model_dir, gates.dev_questions)
    dev = questions.records
    features = qa.validation_windows(dev, tokenizer, cfg.squad)
    torch_start, torch_end = qa.predict_window_logits(model, features, cfg.squad.eval_batch_size, torch.device("cpu"))
    windows = windows_from_features(features)
    pytorch_predictions = questions.pytorch_predictions
    n_layers = model.config.num_hidden_layers

    with atomic_output_dir(out_dir, cfg) as tmp:
        export_fp32(model_dir, tmp / "fp32", cfg.export.opset)
        fused_ops = optimize_graph(tmp / "fp32", tmp / "optimized")
        check_fusions(fused_ops, n_layers, f"{out_dir}/optimized")
        parity = [
            logit_parity_report(variant, max_logit_difference(tmp / variant / MODEL_FILE, windows, torch_start,
                                                              torch_end, cfg.squad.eval_batch_size),
                                gates.max_abs_logit_diff, len(windows))
            for variant in ("fp32", "optimized")
        ]
        atomic_write_json(tmp / "parity.json", {"pytorch_model": str(model_dir), "reports": parity})
        raise_for_failures(parity, str(out_dir))

        # Both graphs through the torch-free answerer: its own tokenization, windows and n-best.
        examples, gold = questions.examples, questions.gold
        dev_scores = {}
        for variant in ("fp32", "optimized"):
            answerer = mobile.QuestionAnswerer.with_squad_settings(
                tmp / variant / MODEL_FILE, tmp / variant / "tokenizer.json", cfg.squad, threads=1)
            predictions = answerer.predict(examples)
            agreement = answer_agreement(predictions, pytorch_predictions)
            if agreement < gates.min_reference_agreement:
                raise GateError(f"{out_dir}/{variant}: the torch-free answerer gave PyTorch's answer on {agreement:.2%} "
                                f"of dev questions (needs >= {gates.min_reference_agreement:.0%})")
            scores = squad.squad_v1_scores(gold, predictions)
            dev_scores[variant] = {"exact_match": round(scores["exact_match"], 3), "f1": round(scores["f1"], 3),
                                   "answer_agreement_with_pytorch": round(agreement, 4)}
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
        }
        atomic_write_json(tmp / "export.json", metrics)
    logger.info("export_onnx %s: %s", model_dir, json.dumps(metrics))
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline export-onnx", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--model-dir", required=True, type=Path, help="a trained QA model (save_pretrained folder)")
    parser.add_argument("--data-dir", required=True, type=Path, help="output of prepare_data (dev.jsonl)")
    parser.add_argument("--out-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    setup_logging()
    run(config_from_json(args.config_json), args.model_dir, args.data_dir, args.out_dir)
    return 0
