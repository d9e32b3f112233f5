"""Model FLOPs of a distillation micro-batch: the formula, the encoders' shapes and the count."""

from __future__ import annotations

from dataclasses import dataclass

FLOP_FORMULA = {
    "mfu": "model FLOPs of the timed steps / their wall time / the GPU's dense peak at the run's precision",
    "micro_batch": "teacher_forward + 3 x student_forward: the student's backward is 2 x its forward (each matmul's "
                   "input gradient and weight gradient); the frozen teacher runs forward only",
    "model_forward": "layers x (2 N (4 H^2 + 2 H I) + 4 H sum_i L_i^2) + 2 R (H^2 + H V)",
    "symbols": "L_i: each sequence's real tokens with [CLS] and [SEP]; N = sum_i L_i; H: hidden width; I: "
               "feed-forward width; V: vocabulary; R: rows the vocabulary head reads (every real token, or the "
               "masked ones under restrict_ce_to_mask)",
    "counted": "per layer and token the Q, K, V and attention-output projections (4 x 2 H^2) and the two "
               "feed-forward matmuls (2 x 2 H I); per layer and sequence the attention scores Q K^T and their "
               "product with V (2 L^2 H each); the MLM head's transform (2 H^2) and vocabulary projection (2 H V) "
               "per head row",
    "not_counted": "padding (padded rows, the packed path's padding sequences, attention over padded keys), "
                   "embedding lookups, LayerNorm, GELU, softmax, dropout, the losses' elementwise work, the "
                   "optimizer, and the attention backward's recomputation of the scores (flash attention recomputes "
                   "them; model FLOPs count them once)",
}


@dataclass(frozen=True)
class EncoderShape:
    """What the FLOP count needs of a BERT or DistilBERT model."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    vocab: int

    @classmethod
    def of(cls, config) -> "EncoderShape":
        """From a BertConfig or a DistilBertConfig (which names the feed-forward width hidden_dim)."""
        intermediate = getattr(config, "intermediate_size", None) or config.hidden_dim
        return cls(config.num_hidden_layers, config.hidden_size, intermediate, config.num_attention_heads,
                   config.vocab_size)


def encoder_forward_flops(shape: EncoderShape, n_tokens: int, attention_lengths) -> dict[str, int]:
    """Matmul FLOPs of the encoder layers' forward over `n_tokens` rows, attention within sequences of
    `attention_lengths` (multiply-add = 2 FLOPs)."""
    h, i = shape.hidden, shape.intermediate
    return {
        "linear": shape.layers * n_tokens * 2 * (4 * h * h + 2 * h * i),
        "attention": shape.layers * 4 * h * sum(int(length) ** 2 for length in attention_lengths),
    }


def head_forward_flops(shape: EncoderShape, rows: int) -> dict[str, int]:
    """The MLM head on `rows` rows: its transform dense (H x H) and the vocabulary projection (H x V)."""
    return {"head_transform": 2 * rows * shape.hidden ** 2, "vocab_projection": 2 * rows * shape.hidden * shape.vocab}


def model_flops(teacher: EncoderShape, student: EncoderShape, sequence_lengths, head_rows: int) -> dict[str, int]:
    """Model FLOPs of one distillation micro-batch (FLOP_FORMULA): teacher forward + student forward and backward,
    counted on the real tokens only."""
    n_tokens = sum(int(length) for length in sequence_lengths)
    parts = {}
    for name, shape in (("teacher", teacher), ("student", student)):
        parts[name] = {**encoder_forward_flops(shape, n_tokens, sequence_lengths),
                       **head_forward_flops(shape, head_rows)}
    teacher_forward, student_forward = sum(parts["teacher"].values()), sum(parts["student"].values())
    return {
        "teacher_forward": teacher_forward,
        "student_forward": student_forward,
        "student_backward": 2 * student_forward,
        "attention": parts["teacher"]["attention"] + 3 * parts["student"]["attention"],
        "vocab_projection": parts["teacher"]["vocab_projection"] + 3 * parts["student"]["vocab_projection"],
        "total": teacher_forward + 3 * student_forward,
    }
