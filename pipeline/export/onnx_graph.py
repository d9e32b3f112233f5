"""ONNX graphs of a QA model: optimum's fp32 export, onnxruntime's BERT fusions and their checks per model type
(pipeline/plan/model_types.py), logit parity.

Used by the export_onnx stage (trained models) and export_full_size (the full-size architectures).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from pipeline.export.gates import GateError
from pipeline.outputs.artifacts import read_json
from pipeline.plan.model_types import attention_shape, model_type_of
from pipeline.runtime import answering
from pipeline.runtime.squad import whole_column

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

    heads, width = attention_shape(read_json(fp32_dir / "config.json"), f"{fp32_dir}/config.json")
    options = FusionOptions("bert")
    options.enable_attention = fuse_attention
    # model_type "bert" for every exportable type (onnxruntime has no DistilBERT, ELECTRA or MobileBERT type; what
    # its BERT fusions find in each is in pipeline/plan/model_types.py).
    optimized = optimize_model(str(fp32_dir / MODEL_FILE), model_type="bert", num_heads=heads, hidden_size=width,
                               optimization_options=options)
    out_dir.mkdir(parents=True, exist_ok=True)
    optimized.save_model_to_file(str(out_dir / MODEL_FILE))
    for path in fp32_dir.iterdir():  # config and tokenizer, so the folder loads like the fp32 one
        if path.is_file() and path.name != MODEL_FILE:
            shutil.copy(path, out_dir / path.name)
    statistics = optimized.get_fused_operator_statistics()
    return {op: int(statistics.get(op, 0)) for op in FUSED_OPS}


def check_fusions(fused_ops: dict[str, int], model_type: str, n_layers: int, where: str) -> None:
    """The fusions the optimizer makes in this model type's graph (pipeline/plan/model_types.py: for BERT,
    DistilBERT and ELECTRA one attention per layer and a skip-LayerNorm after each sublayer; for MobileBERT no
    attention), or the graph's pattern changed and the optimizer missed it (or found one it did not before)."""
    expected = model_type_of(model_type, where)
    attention = fused_ops["Attention"] + fused_ops["MultiHeadAttention"]
    problems = []
    if attention != expected.attention_fusions_per_layer * n_layers:
        problems.append(f"Attention/MultiHeadAttention {attention}, expected "
                        f"{expected.attention_fusions_per_layer * n_layers} ({expected.attention_fusions_per_layer} "
                        f"per layer in {expected.name})")
    if (expected.skip_layer_norms_per_layer is not None
            and fused_ops["SkipLayerNormalization"] != expected.skip_layer_norms_per_layer * n_layers):
        problems.append(f"SkipLayerNormalization {fused_ops['SkipLayerNormalization']}, expected "
                        f"{expected.skip_layer_norms_per_layer * n_layers} ({expected.skip_layer_norms_per_layer} "
                        f"per layer in {expected.name})")
    if problems:
        raise GateError(f"{where}: the transformer optimizer did not fuse the graph as expected: "
                        + "; ".join(problems) + f" (all counts: {fused_ops})")


def max_logit_difference(onnx_path: Path, windows: answering.Windows, torch_start, torch_end, batch_size: int) -> float:
    """Largest |ONNX - PyTorch| over start and end logits at every real (unpadded) window position."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1  # onnxruntime ignores OMP_NUM_THREADS; the rule has one thread
    session = onnxruntime.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    onnx_start, onnx_end = answering.window_logits(session, windows, batch_size)
    real = windows.attention_mask.astype(bool)
    return float(max(np.abs(onnx_start - torch_start)[real].max(), np.abs(onnx_end - torch_end)[real].max()))


def windows_from_features(features) -> answering.Windows:
    """The training code's dev windows (transformers tokenizer) in the torch-free answerer's layout."""
    columns = features.with_format("numpy")
    input_ids = np.asarray(whole_column(columns, "input_ids"), dtype=np.int64)
    token_type_ids = (np.asarray(whole_column(columns, "token_type_ids")) if "token_type_ids" in features.column_names
                      else np.zeros_like(input_ids))
    return answering.Windows(
        example_ids=list(whole_column(features, "example_id")),
        input_ids=input_ids,
        attention_mask=np.asarray(whole_column(columns, "attention_mask"), dtype=np.int64),
        token_type_ids=token_type_ids.astype(np.int64),
        context_offsets=list(whole_column(features, "offset_mapping")),
    )
