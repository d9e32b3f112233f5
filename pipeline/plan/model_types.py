"""The model types the export path is built and tested for, and what differs between them.

Every one is a BERT-family encoder with a `qa_outputs` span head (AutoModelForQuestionAnswering) and a WordPiece
tokenizer, and optimum exports it with BERT's ONNX config (input_ids, attention_mask, and token_type_ids where the
model has segment embeddings). What differs, and is written down here once: the name users know it by, what
onnxruntime's transformer optimizer fuses in its graph (export_onnx checks it), whether it takes token types,
and whether transformers has an sdpa attention for it (the CoreML wrapper).

onnxruntime.transformers' optimizer has no ELECTRA or MobileBERT model type: every type here goes through its
"bert" fusions (pipeline/export/onnx_graph.py), which match BERT, DistilBERT and ELECTRA graphs (an ELECTRA graph
fuses as BERT's: embeddings, attention, skip-LayerNorms, GELU) and find no attention to fuse in MobileBERT's (see
MOBILEBERT below).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelType:
    """What the export path knows of one transformers model_type."""

    name: str  # as its paper and its users write it
    attention_fusions_per_layer: int  # fused Attention/MultiHeadAttention nodes per layer after the "bert" fusions
    skip_layer_norms_per_layer: int | None  # fused SkipLayerNormalization nodes per layer; None: not checked
    token_types: bool  # segment embeddings: the graph takes token_type_ids, and the CoreML wrapper derives them
    sdpa: bool  # transformers has an sdpa attention for it (else eager: it adds the wrapper's mask as it is too)
    # where its config.json holds the attention's head count and width, as transformers saves them
    attention_keys: tuple[str, str] = ("num_attention_heads", "hidden_size")


# MobileBERT (Sun et al. 2020, the model of onnxruntime's own mobile question-answering sample): no attention fuses,
# in onnxruntime's "bert" fusions or in any other of its optimizer types (bart, gpt2, t5, tnlr, conformer, vit,
# swin, clip, sam2 find nothing either). The Attention fusion needs query, key and value projected from one input,
# and MobileBERT projects query and key from a shared bottleneck, value from the layer input. Its skip-LayerNorms
# are not checked: their count follows config.normalization_type. Every released MobileBERT normalizes with NoNorm
# (an element-wise scale and shift, Mul + Add: no LayerNormalization, so none fuse and its "optimized" graph is
# onnxruntime's basic graph optimizations only); a "layer_norm" one fuses one per residual add of its bottlenecks
# and stacked feed-forward blocks.
MOBILEBERT = ModelType("MobileBERT", attention_fusions_per_layer=0, skip_layer_norms_per_layer=None, token_types=True,
                       sdpa=False, attention_keys=("num_attention_heads", "true_hidden_size"))  # its bottleneck width

EXPORTABLE: dict[str, ModelType] = {
    # One Attention per layer and a SkipLayerNormalization after each of its two sublayers.
    "bert": ModelType("BERT", 1, 2, token_types=True, sdpa=True),
    "distilbert": ModelType("DistilBERT", 1, 2, token_types=False, sdpa=True, attention_keys=("n_heads", "dim")),
    # ELECTRA's encoder is BERT's; where its embeddings are narrower than its layers (ELECTRA-small), the
    # projection between them is one more MatMul that the attention fusion of the first layer passes by.
    "electra": ModelType("ELECTRA", 1, 2, token_types=True, sdpa=False),
    "mobilebert": MOBILEBERT,
}

# Tokenizers of common model types that are not WordPiece: part of what a refused type lacks.
OTHER_TOKENIZERS = {"roberta": "byte-level BPE", "longformer": "byte-level BPE", "bart": "byte-level BPE",
                    "deberta": "byte-level BPE", "deberta-v2": "SentencePiece", "albert": "SentencePiece",
                    "xlm-roberta": "SentencePiece", "camembert": "SentencePiece"}


def model_type_of(model_type: str | None, where: str) -> ModelType:
    """The exportable type named `model_type`, or ValueError saying which types there are."""
    if model_type not in EXPORTABLE:
        raise ValueError(f"{where}: model_type {model_type!r} is not one the export path takes "
                         f"({supported_types()})")
    return EXPORTABLE[model_type]


def attention_shape(config: dict, where: str) -> tuple[int, int]:
    """(heads, width) of the attention of the model whose config.json (at `where`) is `config`.

    Read from the file rather than through transformers' AutoConfig: that import brings transformers and torch
    (2 CPU-seconds) into the stages that are otherwise free of them (quantize_onnx builds the fused graphs)."""
    model_type = model_type_of(config.get("model_type"), where)
    missing = [key for key in model_type.attention_keys if key not in config]
    if missing:
        raise ValueError(f"{where}: no {' or '.join(missing)} (a {model_type.name} config holds both)")
    return tuple(int(config[key]) for key in model_type.attention_keys)


def supported_types() -> str:
    """"BERT (bert), DistilBERT (distilbert), ...": the names users know and the model_type values."""
    return ", ".join(f"{model_type.name} ({key})" for key, model_type in EXPORTABLE.items())


def display_name(model_type: str | None) -> str:
    """The name users know a model type by; the model_type itself for a type the export path does not take."""
    return EXPORTABLE[model_type].name if model_type in EXPORTABLE else str(model_type)
