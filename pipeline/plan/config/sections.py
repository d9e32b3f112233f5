"""The config's sections: one dataclass per section of configs/default.yaml, each field with its default, its
documentation and its constraints (`option`), and the checks across fields a section makes itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.errors import PipelineError


class ConfigError(PipelineError, ValueError):
    """A config key is unknown, has the wrong type or a value out of range. The message names the key."""


def option(default: Any, doc: str, **constraints: Any) -> Any:
    """A config field with its documentation and JSON-schema constraints (minimum, exclusiveMinimum, maximum)."""
    metadata = {"doc": doc, **constraints}
    if callable(default):  # a factory, for mutable defaults such as a TrainConfig with other values
        return field(default_factory=default, metadata=metadata)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
    return field(default=default, metadata=metadata)


def section(cls: type, doc: str) -> Any:
    """A nested config section."""
    return field(default_factory=cls, metadata={"doc": doc})


@dataclass
class SyntheticConfig:
    """The offline synthetic SQuAD-format world (pipeline/data/synthetic.py)."""

    seed: int = option(13, "Seed of the world generator; the same seed gives byte-identical data.")
    n_train_contexts: int = option(600, "Training paragraphs (each with several questions).", minimum=1)
    n_dev_contexts: int = option(120, "Dev paragraphs, built from held-out entities and paraphrases.", minimum=1)
    n_corpus_paragraphs: int = option(3000, "MLM corpus paragraphs drawn from the same world.", minimum=1)


@dataclass
class DataConfig:
    """Where the SQuAD data and the MLM corpus come from."""

    squad: str = option(
        "synthetic",
        "'synthetic' (generated offline), a datasets hub name (e.g. 'squad'), or a local SQuAD .json "
        "(v1.1 or v2.0 layout) / .jsonl (datasets squad columns) training file.",
    )
    squad_dev: str | None = option(
        None, "Dev file when `squad` is a local file. Ignored for 'synthetic'; hub names use `dev_split`. With "
        "deploy.model set, the one dev set a deploy reads (a local file, or a hub name), instead of `squad`'s."
    )
    train_split: str = option("train", "Split name for a hub dataset's training data.")
    dev_split: str = option("validation", "Split name for a hub dataset's dev data.")
    on_bad_example: Literal["error", "skip"] = option(
        "error", "What a malformed SQuAD example does: stop with an error naming it, or be skipped and counted."
    )
    max_train_examples: int | None = option(None, "Keep only the first N training questions (null: all).", minimum=1)
    max_dev_examples: int | None = option(None, "Keep only the first N dev questions (null: all).", minimum=1)
    corpus: str = option(
        "synthetic",
        "MLM corpus: 'synthetic', 'squad_contexts' (the training contexts), a local text file (one document "
        "per line), or a datasets hub name (e.g. 'wikitext').",
    )
    corpus_config_name: str | None = option(None, "Hub dataset configuration, e.g. 'wikitext-103-raw-v1'.")
    corpus_split: str = option("train", "Hub corpus split.")
    corpus_text_column: str = option("text", "Hub corpus column holding the text.")
    max_corpus_lines: int | None = option(None, "Keep only the first N corpus documents (null: all).", minimum=1)
    mlm_holdout_fraction: float = option(
        0.05, "Fraction of corpus documents held out for masked-token accuracy (chosen by a seeded hash of the "
        "document's index).", exclusiveMinimum=0.0, maximum=0.5
    )
    synthetic: SyntheticConfig = section(SyntheticConfig, "The offline synthetic world.")


@dataclass
class TokenizerConfig:
    """The tokenizer: a pretrained one, or a WordPiece tokenizer trained on the corpus."""

    pretrained: str | None = option(
        None, "Hub name or local directory of a pretrained tokenizer (e.g. 'bert-base-uncased'); null trains one."
    )
    vocab_size: int = option(4000, "WordPiece vocabulary size when training a tokenizer.", minimum=16)
    min_frequency: int = option(2, "Minimum pair frequency for a WordPiece merge.", minimum=1)
    lowercase: bool = option(True, "Lower-case and strip accents (BERT uncased normalizer).")


@dataclass
class TrainConfig:
    """One training run of the shared loop (pipeline/training/)."""

    epochs: float = option(1.0, "Passes over the training data (ignored when max_steps is set).", exclusiveMinimum=0.0)
    max_steps: int | None = option(None, "Optimizer steps; overrides epochs when set.", minimum=1)
    batch_size: int = option(32, "Examples per forward pass.", minimum=1)
    grad_accum_steps: int = option(1, "Forward passes per optimizer step (effective batch = batch_size x this).", minimum=1)
    learning_rate: float = option(5e-4, "Peak learning rate.", exclusiveMinimum=0.0)
    warmup_ratio: float = option(0.05, "Fraction of steps with linear warm-up; then linear decay to 0.", minimum=0.0, maximum=1.0)
    weight_decay: float = option(0.01, "AdamW weight decay (not applied to biases and LayerNorm).", minimum=0.0)
    adam_eps: float = option(1e-6, "Adam epsilon.", exclusiveMinimum=0.0)
    adam_beta1: float = option(0.9, "Adam beta1.", minimum=0.0, maximum=1.0)
    adam_beta2: float = option(0.98, "Adam beta2.", minimum=0.0, maximum=1.0)
    max_grad_norm: float = option(5.0, "Gradient clipping norm (0 disables).", minimum=0.0)
    log_every: int = option(20, "Log loss terms, lr and tokens/s every N optimizer steps.", minimum=1)
    checkpoint_every: int = option(200, "Write a resumable checkpoint every N optimizer steps.", minimum=1)
    keep_checkpoints: int = option(1, "How many recent checkpoints to keep.", minimum=1)
    device: Literal["auto", "cpu", "cuda"] = option("auto", "auto: CUDA when available, else CPU.")
    bf16: bool = option(True, "bf16 autocast on CUDA (ignored on CPU).")
    torch_compile: bool = option(
        False, "torch.compile the trained model (CUDA runs); distill_pretrain compiles its frozen teacher's encoder too.")
    group_by_length: bool = option(
        True,
        "Batch examples of similar length together (transformers' length-grouped sampling: shuffled mega-batches "
        "of up to 50 batches, each sorted by length), so less compute goes to padding.",
    )
    max_tokens_per_batch: int | None = option(
        None, "MLM stages (teacher_pretrain, distill_pretrain): a micro-batch holds as many length-grouped sequences "
        "as fit in this many padded tokens (sequences x the longest), and the loss is a per-token mean across "
        "gradient accumulation. null: batch_size x the stage's max_seq_length.", minimum=16)
    dataloader_workers: int = option(
        0, "DataLoader worker processes that read, batch and mask ahead of the step (0: in the training "
        "process). Give GPU runs a few; on a small CPU machine they only compete with training.", minimum=0)
    process_group_timeout_minutes: int = option(
        60, "Collective timeout of multi-process runs (NCCL's default of 10 minutes is too short for a first step "
        "under torch.compile).", minimum=1)
    cpu_threads: int | None = option(
        None, "torch intra-op threads per training process on CPU, and the cores its Snakemake rule asks for. null: "
        "the rule's share of --cores, so the trained weights then depend on --cores (float sums differ with the "
        "thread count); a number keeps a build the same whatever --cores is.", minimum=1)


def _default_pretrain() -> TrainConfig:
    return TrainConfig(epochs=3.0, batch_size=32, learning_rate=1e-3, warmup_ratio=0.05)


def _default_finetune() -> TrainConfig:
    return TrainConfig(epochs=3.0, batch_size=32, learning_rate=5e-4, warmup_ratio=0.1, adam_beta2=0.999, max_grad_norm=1.0)


@dataclass
class TeacherArchitectureConfig:
    """Shape of a teacher BERT trained from scratch (ignored when teacher.pretrained is set)."""

    hidden_size: int = option(128, "Hidden width (bert-base: 768).", minimum=8)
    num_layers: int = option(4, "Transformer layers (bert-base: 12).", minimum=1)
    num_heads: int = option(4, "Attention heads; must divide hidden_size.", minimum=1)
    intermediate_size: int = option(512, "Feed-forward width (bert-base: 3072).", minimum=8)
    max_position_embeddings: int = option(256, "Longest sequence the model accepts.", minimum=16)
    dropout: float = option(0.1, "Hidden and attention dropout.", minimum=0.0, maximum=1.0)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"teacher.architecture.num_heads: {self.num_heads} does not divide hidden_size {self.hidden_size}"
            )


@dataclass
class TeacherConfig:
    """The BERT teacher: pretrained from the hub, or pretrained here from scratch, then fine-tuned on SQuAD."""

    pretrained: str | None = option(
        None,
        "Hub name or local directory of a pretrained BERT (e.g. 'bert-base-uncased'); null pretrains one from "
        "scratch with MLM (rule teacher_pretrain).",
    )
    pretrained_qa: str | None = option(
        None,
        "Hub name or directory of a BERT already fine-tuned on SQuAD (e.g. "
        "'bert-base-uncased-whole-word-masking-finetuned-squad'); when set, teacher_finetune only evaluates it.",
    )
    architecture: TeacherArchitectureConfig = section(TeacherArchitectureConfig, "Shape of a from-scratch teacher.")
    mlm_probability: float = option(0.15, "Masked fraction for MLM pretraining (BERT: 0.15).", exclusiveMinimum=0.0, maximum=1.0)
    pretrain_max_seq_length: int = option(
        128, "Positions of an MLM pretraining sequence: longer documents are cut into chunks of this many tokens "
        "with [CLS] and [SEP] (no text lost).", minimum=16)
    pretrain: TrainConfig = option(_default_pretrain, "Training of the from-scratch MLM teacher.")
    finetune: TrainConfig = option(_default_finetune, "SQuAD fine-tuning of the teacher.")


@dataclass
class SquadConfig:
    """Windowing and answer extraction, shared by every QA stage (semantics of transformers' utils_qa)."""

    max_seq_length: int = option(384, "Tokens per window (question + context).", minimum=16)
    doc_stride: int = option(128, "Overlap between consecutive windows of a long context.", minimum=0)
    n_best_size: int = option(20, "Start and end candidates considered per window.", minimum=1)
    max_answer_length: int = option(30, "Longest answer in tokens.", minimum=1)
    eval_batch_size: int = option(64, "Windows per forward pass at evaluation.", minimum=1)
    freeze_word_embeddings: bool = option(
        False,
        "Keep the word embeddings of the pretrained (or distilled) model fixed in every QA stage (teacher_finetune, "
        "student_finetune, distill_squad): words that QA training never shows, such as held-out names, then stay "
        "in the same space as the words it does show.",
    )

    def __post_init__(self) -> None:
        if self.doc_stride >= self.max_seq_length:
            raise ConfigError(
                f"squad.doc_stride: {self.doc_stride} must be smaller than squad.max_seq_length {self.max_seq_length}"
            )


@dataclass
class StudentConfig:
    """The DistilBERT student (Sanh et al. 2019): the teacher's width, fewer layers, no token types, no pooler."""

    pretrained: str | None = option(
        None,
        "Hub name or local directory of a pretrained DistilBERT (e.g. 'distilbert-base-uncased', as the paper's "
        "second step starts): init_student and distill_pretrain are skipped, and distill_squad, the CE-only baseline "
        "and everything after them start from it. Its vocabulary must be the teacher's. null: the student is "
        "distilled here.",
    )
    n_layers: int | None = option(None, "Student depth; null: half the teacher's (DistilBERT: 12 -> 6).", minimum=1)
    layer_mapping: str | list[int] = option(
        "every_other",
        "Teacher layer each student layer is copied from: every_other (k layers spread evenly from the teacher's "
        "bottom to its top, round(i*(L-1)/(k-1)): 12->6 is DistilBERT's 0,2,4,7,9,11, 12->4 is 0,4,7,11), first_k, "
        "last_k, uniform (TinyBERT: 12->6 is 1,3,5,7,9,11), or an explicit list of teacher layer indices.",
    )
    init: Literal["teacher", "random"] = option("teacher", "Initialise from the teacher, or randomly (ablation).")
    fold_token_type_into_positions: bool = option(
        True, "Add the teacher's token-type-0 embedding into the student's position embeddings."
    )


def _default_distill_pretrain_train() -> TrainConfig:
    # DistilBERT reference distiller defaults: lr 5e-4, warm-up 5%, Adam eps 1e-6, betas (0.9, 0.98), clip 5.0.
    return TrainConfig(epochs=3.0, batch_size=32, learning_rate=5e-4, warmup_ratio=0.05, weight_decay=0.0,
                       adam_eps=1e-6, adam_beta1=0.9, adam_beta2=0.98, max_grad_norm=5.0)


@dataclass
class DistillPretrainConfig:
    """Distillation during MLM pretraining: alpha_ce*L_ce + alpha_mlm*L_mlm + alpha_cos*L_cos (+ alpha_mse*L_mse)."""

    alpha_ce: float = option(5.0, "Weight of KL(teacher || student) on temperature-softened logits.", minimum=0.0)
    alpha_mlm: float = option(2.0, "Weight of the masked-LM cross-entropy against the true tokens.", minimum=0.0)
    alpha_cos: float = option(1.0, "Weight of the cosine loss between last hidden states.", minimum=0.0)
    alpha_mse: float = option(0.0, "Weight of an MSE between student and teacher logits.", minimum=0.0)
    temperature: float = option(2.0, "Softmax temperature T (DistilBERT: 2).", exclusiveMinimum=0.0)
    mlm_mask_prop: float = option(0.15, "Fraction of tokens selected for masking.", exclusiveMinimum=0.0, maximum=1.0)
    token_frequency_smoothing: bool = option(
        True, "Select tokens with probability proportional to max(count, 1)^-0.7 (reference mlm_smoothing)."
    )
    smoothing_exponent: float = option(0.7, "Exponent of the token-frequency smoothing.", minimum=0.0)
    restrict_ce_to_mask: bool = option(False, "Compute L_ce only at masked positions (else all non-padding).")
    chunked_loss_rows: int = option(
        2048, "Rows of the vocabulary projection per chunk of the loss: L_ce, L_mlm and L_mse are computed chunk by "
        "chunk with their gradients (pipeline/distillation/chunked_lm_loss.py), so no [tokens x vocab] logits of the whole batch "
        "exist. Only memory and speed change; a batch smaller than a chunk is padded to a multiple of 64 rows.",
        minimum=1)
    max_seq_length: int = option(
        128, "Positions of a pretraining-distillation sequence: longer documents are cut into chunks of this many "
        "tokens with [CLS] and [SEP] (no text lost).", minimum=16)
    run_random_init_ablation: bool = option(
        True, "Target `study` also distills a randomly initialised student with the same budget (the ablation)."
    )
    packed_tokens_multiple_of: int = option(
        64, "Both models run on each micro-batch's real tokens only, as one flat sequence (pipeline/distillation/packed_encoder.py); "
        "its token count is padded up to a multiple of this, so torch.compile and CUDA graphs see few shapes. The "
        "padding forms sequences of its own that no loss reads.", minimum=1)
    train: TrainConfig = option(_default_distill_pretrain_train, "The training run.")

    def __post_init__(self) -> None:
        if self.alpha_ce + self.alpha_mlm + self.alpha_cos + self.alpha_mse <= 0:
            raise ConfigError("distill_pretrain.alpha_ce: at least one loss weight must be positive")


@dataclass
class DistilBertObjectiveConfig:
    """Soft start/end targets: KL(softmax(t/T) || softmax(s/T)) * T^2 over context positions (Sanh et al. 2019)."""

    weight: float = option(0.5, "alpha_kd: weight of the soft-target loss.", minimum=0.0)
    temperature: float = option(2.0, "Softmax temperature T.", exclusiveMinimum=0.0)


@dataclass
class PKDObjectiveConfig:
    """Patient KD (Sun et al. 2019): MSE between L2-normalised [CLS] states of mapped layers.

    The loss is a mean over batch x layers x hidden, as in the reference code, so beta means what it means in the
    paper. Paper grid: T in {5, 10, 20}, alpha in {0.2, 0.5, 0.7}, beta in {10, 100, 500, 1000}.
    """

    weight: float = option(100.0, "beta: weight of the patient loss.", minimum=0.0)
    scheme: Literal["skip", "last"] = option("skip", "PKD-Skip (every k-th teacher layer) or PKD-Last (the last k).")


@dataclass
class TinyBERTObjectiveConfig:
    """TinyBERT (Jiao et al. 2019): attention-score, hidden-state, embedding and prediction-layer distillation."""

    attention_weight: float = option(1.0, "Weight of the pre-softmax attention-score MSE.", minimum=0.0)
    hidden_weight: float = option(1.0, "Weight of the hidden-state MSE.", minimum=0.0)
    embedding_weight: float = option(1.0, "Weight of the embedding-output MSE.", minimum=0.0)
    prediction_weight: float = option(1.0, "Weight of the soft cross-entropy on start/end logits.", minimum=0.0)
    temperature: float = option(1.0, "Temperature of the prediction-layer soft cross-entropy.", exclusiveMinimum=0.0)
    layer_mapping: str | list[int] = option("uniform", "Teacher layer for each student layer (as student.layer_mapping).")
    projection: bool = option(True, "Learn a linear map student width -> teacher width (needed when they differ).")
    intermediate_share: float = option(
        0.5,
        "TinyBERT's two steps: this share of distill_squad.train.epochs trains the intermediate layers only "
        "(attention scores, hidden states, embeddings; no gold spans), the rest the prediction layer with the gold "
        "spans and the other objectives. 0: every term together in one run.", minimum=0.0, maximum=0.99,
    )


@dataclass
class SquadAugmentationConfig:
    """TinyBERT's task-stage augmentation: copies of the training windows with words an MLM predicts in place of
    some of theirs, labelled by the QA teacher only (soft targets, no gold span). Paper: p_t 0.4, K 15, 20 copies."""

    copies: int = option(0, "Augmented copies of every training window (0: no augmentation).", minimum=0)
    replace_probability: float = option(0.4, "p_t: chance that a single-piece word is replaced.", minimum=0.0,
                                        maximum=1.0)
    top_k: int = option(15, "K: the replacement is drawn uniformly from the MLM's K most likely words.", minimum=1)


def _default_distill_squad_train() -> TrainConfig:
    return TrainConfig(epochs=3.0, batch_size=32, learning_rate=5e-4, warmup_ratio=0.1, weight_decay=0.01,
                       adam_eps=1e-6, adam_beta2=0.999, max_grad_norm=1.0)


@dataclass
class DistillSquadConfig:
    """Second distillation step on SQuAD: alpha_task * CE(gold) + each chosen objective with its weight."""

    alpha_task: float = option(0.5, "Weight of the cross-entropy against the gold start/end.", minimum=0.0)
    objectives: list[Literal["distilbert", "pkd", "tinybert"]] = option(
        ["distilbert"],
        "Distillation objectives to combine: distilbert, pkd, tinybert. PKD is (1-alpha)*CE + alpha*KD + beta*PT "
        "(Sun et al. 2019): its soft-target term is the distilbert objective, so pkd must be listed with distilbert "
        "(alpha_task, distilbert.weight and pkd.weight are its 1-alpha, alpha and beta); pkd alone is refused.",
    )
    distilbert: DistilBertObjectiveConfig = section(DistilBertObjectiveConfig, "The DistilBERT soft-target loss.")
    pkd: PKDObjectiveConfig = section(PKDObjectiveConfig, "The PKD patient loss.")
    tinybert: TinyBERTObjectiveConfig = section(TinyBERTObjectiveConfig, "The TinyBERT losses.")
    augmentation: SquadAugmentationConfig = section(
        SquadAugmentationConfig, "Teacher-labelled augmented windows (TinyBERT); the CE-only baseline never uses them."
    )
    cache_teacher_logits: bool = option(
        True, "Compute the teacher's start/end logits once and reuse them every epoch (logit-only objectives)."
    )
    train: TrainConfig = option(_default_distill_squad_train, "The training run (the CE-only baseline uses it too).")

    def __post_init__(self) -> None:
        if len(set(self.objectives)) != len(self.objectives):
            raise ConfigError(f"distill_squad.objectives: {self.objectives} lists an objective twice")
        if "pkd" in self.objectives and "distilbert" not in self.objectives:
            raise ConfigError(
                f"distill_squad.objectives: {self.objectives} has pkd without its soft-target term; PKD is "
                "(1-alpha)*CE + alpha*KD + beta*PT, so add 'distilbert' (the KD term) to the objectives"
            )


@dataclass
class FallbackConfig:
    """Accuracy-aware int8 (pipeline/export/int8_tuning.py): layers back to fp32, most sensitive first, until the
    tuning questions (never the gated ones) lose no more than the target."""

    recipes: int = option(
        2, "Recipes tuned: of those whose tuning F1 drop is over the target, the most accurate ones (each costs "
        "one quantization and one scoring of the tuning questions per quantizable layer). 0: no fallback.",
        minimum=0,
    )
    target_f1_drop: float = option(
        0.5, "Tuning F1 drop (points, from the fp32 graph) the fallback stops at: under export.gates.max_f1_drop, "
        "so the gated questions' own noise has room.", minimum=0.0,
    )
    max_layers: int = option(8, "Most layers a recipe falls back to fp32.", minimum=1)
    sensitivity_windows: int = option(
        32, "Tuning windows each layer's sensitivity is measured on (one quantization and one run of these per "
        "layer: what bounds the fallback's cost on a full-size model); the fallback's steps score every tuning "
        "question.", minimum=1,
    )


@dataclass
class QuantizeConfig:
    """Dynamic int8 quantization of the ONNX graphs (onnxruntime.quantization), and optional 4-bit weights."""

    target: Literal["auto", "x86-avx2", "x86-vnni", "arm64"] = option(
        "auto",
        "CPU the int8 graphs are tuned for: auto (this machine's CPU flags), x86-avx2 (no VNNI: reduce_range on), "
        "x86-vnni (AVX-512 VNNI / AMX), arm64 (phones: per-channel weights, full 8-bit range).",
    )
    per_channel: bool | None = option(None, "One scale per output channel of each weight (null: from target).")
    reduce_range: bool | None = option(
        None, "7-bit weights, avoiding int16 overflow in u8s8 kernels on AVX2 CPUs without VNNI (null: from target)."
    )
    int4: bool = option(True, "Also build a 4-bit weight-only graph (MatMulNBits; a stretch variant, not bundled).")
    openvino: bool = option(
        True, "Also build the x86 target: NNCF's post-training int8 of the fp32 graph as an OpenVINO model, "
        "calibrated on the tuning questions, answered by the OpenVINO runtime at its default precision on this CPU "
        "and gated like the ONNX variants; bundled in openvino/ when it ships (pipeline/export/openvino_target.py).")
    int4_block_size: int = option(16, "Weights per 4-bit quantization block (one float scale each).", minimum=16)
    int4_embeddings: bool = option(
        False,
        "Store the word embeddings in 4 bits too (GatherBlockQuantized). Off by default: on the offline default's "
        "64-wide model it cut dev answer agreement with PyTorch to 96.5 %, under the 97 % gate.",
    )
    search_graphs: list[Literal["plain", "fused", "fused-no-attention"]] = option(
        ["plain", "fused", "fused-no-attention"],
        "Graphs the int8 search quantizes: plain (the export), fused (onnxruntime's BERT fusions, int8 attention "
        "as QAttention), fused-no-attention (LayerNorm, GELU and embedding fusions, attention left as MatMuls).",
    )
    search_formats: list[Literal["qoperator", "qdq"]] = option(
        ["qoperator", "qdq"],
        "qoperator: dynamic quantization (activation scales computed per run); qdq: static QuantizeLinear/"
        "DequantizeLinear pairs with activation scales calibrated on tuning windows (not on the fused graph).",
    )
    search_per_channel: list[bool] = option([False, True], "Weight scale granularities searched (false: per tensor).")
    search_attention_int8: list[bool] = option(
        [False, True],
        "Whether the activation x activation MatMuls of attention (Q.K^T, probabilities.V) are int8 too "
        "(MatMulConstBOnly off); not for the fused graph, whose QAttention has its own int8 path.",
    )
    calibration_windows: int = option(16, "Tuning windows that calibrate the static (qdq) activation scales.",
                                      minimum=1)
    tuning_questions: int = option(
        200, "Dev questions the gates never score that calibrate the static scales and drive the layer fallback: "
        "the ones after export.gates.dev_questions (a smaller dev set: export.gates.tuning_share of it).", minimum=1,
    )
    fallback: FallbackConfig = section(FallbackConfig, "Accuracy-aware int8: layers that fall back to fp32.")
    latency_runs: int = option(
        20, "Timed runs per int8 variant (after warm-up) when choosing the bundle's fastest passing one.", minimum=5
    )
    latency_tie_fraction: float = option(
        0.05,
        "Median latencies closer than this fraction count as a tie, broken by the smaller file: the bundle then "
        "does not change with timing noise between builds. The full-size int8 search (rule int8_search) takes its "
        "fastest pair with onnxruntime's default session options where it is within this of the fastest pair.",
        minimum=0.0, maximum=1.0,
    )


@dataclass
class CoreMLConfig:
    """CoreML mlprogram conversion (coremltools) from the traced PyTorch model."""

    fallback: bool = option(
        True, "Keep the most sensitive layers of the int8 and 4-bit packages in float where the compressed proxy "
        "loses more than export.quantize.fallback.target_f1_drop on the tuning questions (the int8 search's fallback, "
        "with its target and layer budget).",
    )
    minimum_deployment_target: Literal["iOS16", "iOS17", "iOS18"] = option(
        "iOS18",
        "iOS18: input_ids and attention_mask both take the enumerated lengths. iOS16/17 allow only one enumerated "
        "input, so the model takes input_ids alone and derives the mask inside (input_ids != pad).",
    )
    sequence_lengths: list[int] = option(
        [128, 256, 384],
        "Enumerated input lengths (fixed shapes keep the Neural Engine usable; ranges do not). Each must be at most "
        "the model's max_position_embeddings.",
    )
    variants: list[Literal["fp16", "int8", "4bit", "ane"]] = option(
        ["fp16", "int8", "4bit", "ane"],
        "fp16 weights; int8 weights (linear symmetric, per channel); 4-bit palettized weights (k-means); ane: fp16 "
        "weights in the Neural Engine layout ((B, C, 1, S) tensors, 1x1 convolutions, per-head attention; "
        "pipeline/export/neural_engine.py), DistilBERT models only.",
    )
    palettization_granularity: Literal["per_tensor", "per_grouped_channel"] = option(
        "per_tensor", "One 16-entry lookup table per weight tensor, or one per group of output channels."
    )
    palettization_group_size: int = option(16, "Output channels per lookup table (per_grouped_channel).", minimum=1)
    palettize_embeddings: bool = option(
        True,
        "Palettize the embedding tables too in the 4-bit variant (they are a third of DistilBERT's weights). The "
        "full-size export always does.",
    )

    def __post_init__(self) -> None:
        if not self.sequence_lengths or any(length < 8 for length in self.sequence_lengths):
            raise ConfigError(f"export.coreml.sequence_lengths: {self.sequence_lengths} needs lengths of at least 8")
        if len(set(self.sequence_lengths)) != len(self.sequence_lengths):
            raise ConfigError(f"export.coreml.sequence_lengths: {self.sequence_lengths} lists a length twice")
        if len(set(self.variants)) != len(self.variants):
            raise ConfigError(f"export.coreml.variants: {self.variants} lists a variant twice")
        if self.minimum_deployment_target != "iOS18" and self.palettization_granularity != "per_tensor":
            raise ConfigError(
                f"export.coreml.palettization_granularity: {self.palettization_granularity} needs "
                f"minimum_deployment_target iOS18 (earlier targets take one lookup table per tensor)"
            )


@dataclass
class GatesConfig:
    """What every export must reach before it ships (pipeline/export/gates.py). Each variant gets one of three
    verdicts: rejected when a measure's point estimate is past its threshold (never shipped, whatever its
    interval); proven when the measure's whole 95 % interval is on the right side; unproven in between (shipped
    and marked, with the dev questions that would decide it). A variant with no verdict (its build or scoring
    failed, or it was never scored) is a failure and never ships. The bundle always holds the fp32 ONNX graph
    and each compressed variant that ships; the run stops only when the fp32 graph misses its parity gate."""

    strict: bool = option(
        False, "Ship proven variants only (unproven ones are left out, as rejected ones always are), and stop the "
        "export_onnx rule when an fp32 graph misses its parity gate.",
    )
    max_abs_logit_diff: float = option(
        1e-4, "fp32 and optimized ONNX vs PyTorch: largest |start/end logit difference| on dev windows.",
        exclusiveMinimum=0.0,
    )
    min_answer_agreement: float | None = option(
        0.97, "Compressed variants (int8, 4-bit): fraction of dev questions answered exactly as PyTorch does, judged "
        "by its Wilson 95 % interval. null: recorded, not a gate (a model with small logit margins flips answers "
        "under any rounding without losing F1: there agreement measures noise, and the F1 drop is the gate).",
        minimum=0.0, maximum=1.0,
    )
    max_f1_drop: float = option(
        1.0, "Compressed variants: largest dev F1 drop from the fp32 model, in points, judged by the paired "
        "bootstrap 95 % interval over the gate questions.", minimum=0.0,
    )
    min_pytorch_agreement: float = option(
        0.99, "The torch-free answerer on the fp32 ONNX graph: fraction of dev answers equal to PyTorch's (Wilson "
        "95 % interval).", minimum=0.0, maximum=1.0,
    )
    dev_questions: int | None = option(
        1000,
        "Exports are gated on the first N dev questions (null: all but the tuning share), against PyTorch's answers "
        "on the same questions: agreement near 0.96 on 1000 questions has a binomial standard error of 0.006. The "
        "int8 search tunes on the export.quantize.tuning_questions after them; a dev set with fewer questions is "
        "split by tuning_share (pipeline/export/dev_split.py).", minimum=1,
    )
    tuning_share: float = option(
        0.5, "When the dev set holds fewer than dev_questions + export.quantize.tuning_questions questions: the "
        "share of it that tunes the int8 search (the rest is gated), cut at a paragraph boundary.",
        exclusiveMinimum=0.0, maximum=0.9,
    )
    min_split_questions: int = option(
        20, "Fewest questions on each side of the split (gated, tuning): a dev set with fewer than twice this many "
        "answerable questions is refused, naming it.", minimum=1,
    )


@dataclass
class FullSizeConfig:
    """Full-size architectures run through the same export path: what the 207 MB figure is about."""

    architectures: list[Literal["distilbert", "bert-base"]] = option(
        ["distilbert", "bert-base"],
        "Full-size architectures exported and benchmarked: distilbert (6 x 768: ONNX, int8, 4-bit and CoreML) and "
        "bert-base (12 x 768: ONNX and int8, the speed baseline). Empty: none.",
    )
    distilbert_pretrained: str | None = option(
        None, "Hub name or directory of DistilBERT QA weights (e.g. 'distilbert-base-uncased-distilled-squad'); "
        "null: random weights (sizes and latency do not depend on the values).",
    )
    bert_base_pretrained: str | None = option(
        None, "Hub name or directory of BERT-base QA weights; null: random weights.",
    )
    coreml_sequence_lengths: list[int] = option(
        [128, 256, 384], "CoreML enumerated lengths of the full-size packages (DistilBERT has 512 positions)."
    )
    max_int8_onnx_mb: float = option(68.0, "Goal: int8 ONNX size in MB (10^6 bytes).", exclusiveMinimum=0.0)
    max_coreml_4bit_mb: float = option(36.0, "Goal: 4-bit CoreML size in MB.", exclusiveMinimum=0.0)


@dataclass
class NpuConfig:
    """Android NPU graphs (pipeline/export/npu_graph.py): static int8 (QDQ) ONNX with fixed shapes, one per length of
    export.coreml.sequence_lengths, for Qualcomm's QNN execution provider (and NNAPI), gated on the CPU execution
    provider and checked on the QNN HTP backend's x86 emulation where onnxruntime-qnn is installed."""

    enabled: bool = option(True, "Build, gate and bundle the Android NPU graphs (rule export_npu).")
    calibration_windows: int = option(
        32, "Tuning windows (never gated ones) that calibrate each graph's activation scales, padded to its length.",
        minimum=1,
    )
    emulator_questions: int = option(
        40, "Gated dev questions whose windows also run through the QNN HTP emulation (0: none). The emulation is "
        "slow (seconds per window for a full-size model): a sample, checked against the CPU execution provider's "
        "answers on the same graphs.", minimum=0,
    )
    htp_arch: str = option("73", "HTP architecture the emulation models (onnxruntime-qnn's htp_arch).")
    soc_model: str = option("57", "SoC model the emulation models (onnxruntime-qnn's soc_model).")


# The trained models a DAG can export (pipeline/plan/model_registry.py: TRAINED_MODELS).
TrainedModelName = Literal["student", "student_ce_only", "teacher"]


@dataclass
class ExportConfig:
    """From trained PyTorch models to the files an app ships: ONNX, int8/4-bit ONNX, .ort, CoreML, the bundle."""

    models: list[TrainedModelName] = option(
        ["student", "student_ce_only", "teacher"],
        "Trained models exported (ONNX, int8, 4-bit, OpenVINO; CoreML and NPU graphs for export.phone_models), gated "
        "and benchmarked. The bundle ships the distilled student, which is always among them; the CE-only student "
        "and the teacher show what distillation buys on device. A deploy (deploy.model) exports the one model it "
        "takes.",
    )
    phone_models: list[TrainedModelName] = option(
        ["student"],
        "Exported models that also get the phone builds (CoreML packages, Android NPU graphs). The student, which the "
        "bundle ships, always does; the CE-only student and the teacher are compared on the CPU runtimes (ONNX, int8, "
        "OpenVINO) by default, as their phone builds ship in no app: name them here to compare those too. A deploy "
        "builds them for the model it takes.",
    )
    opset: int | None = option(None, "ONNX opset (null: optimum's default for the architecture).", minimum=11)
    quantize: QuantizeConfig = section(QuantizeConfig, "ONNX quantization.")
    coreml: CoreMLConfig = section(CoreMLConfig, "CoreML conversion.")
    npu: NpuConfig = section(NpuConfig, "Android NPU graphs.")
    gates: GatesConfig = section(GatesConfig, "Accuracy gates of every export.")
    full_size: FullSizeConfig = section(FullSizeConfig, "Full-size architectures (sizes and latency).")

    def __post_init__(self) -> None:
        for key, names in (("models", self.models), ("phone_models", self.phone_models)):
            if "student" not in names:
                raise ConfigError(f"export.{key}: {names} leaves out student, the model the bundle ships")
            if len(set(names)) != len(names):
                raise ConfigError(f"export.{key}: {names} lists a model twice")
        if not_exported := [name for name in self.phone_models if name not in self.models]:
            raise ConfigError(f"export.phone_models: {not_exported} not in export.models {self.models}: only an "
                              "exported model gets phone builds")


@dataclass
class BenchmarkConfig:
    """Latency and memory of every artifact on this machine (rule benchmark), and the report (rule report)."""

    sequence_lengths: list[int] = option(
        [128, 384], "Input lengths timed (batch 1, every token attended). Longer than a model's positions: null."
    )
    threads: list[int] = option([1, 2], "Intra-op thread counts timed (pinned in onnxruntime and torch).")
    runs: int = option(20, "Timed runs per artifact, length and thread count, after warm-up.", minimum=1)
    full_size_runs: int = option(
        10, "Timed runs per length and thread count of a full-size artifact in its own process (a run of BERT-base "
        "takes over a second on the slowest CPUs; ten give its median within a few percent), and of the peers' "
        "comparison with our full-size graph, in turn by blocks.", minimum=1)
    warmup: int = option(1, "Untimed runs first (allocations, kernel selection).", minimum=0)
    profile_runs: int = option(5, "Runs under onnxruntime's profiler for the per-op breakdown of the int8 graphs.",
                               minimum=1)
    search_runs: int = option(
        5, "Timed runs per candidate when the full-size DistilBERT int8 variants are searched (longest length, "
        "1 thread, round-robin).", minimum=3)
    session_options: list[Literal["default", "denormals-as-zero", "extended-graph-level"]] = option(
        ["default", "denormals-as-zero"],
        "onnxruntime session option sets tried on the two fastest int8 candidates (pipeline.measurement.latency.SESSION_OPTIONS).",
    )
    javascript: bool | Literal["auto"] = option(
        "auto", "Also time the bundle's model in JavaScript (rule benchmark_web): onnxruntime-web (WASM) and "
        "onnxruntime-node in Node at 1 thread, and in headless Chromium with `browser`; needs Node.js 20 and "
        "`npm ci` in clients/web, which setup.sh runs where npm exists. auto: time them where the machine has them, "
        "and write in summary.json and the report what was skipped and why; true: stop when they are missing.")
    javascript_full_size: bool = option(
        True, "Also time the full-size DistilBERT int8-optimized graph in JavaScript, on every runtime timed "
        "(about half a minute on 2 idle cores with the default runs).")
    javascript_full_size_runs: int = option(
        10, "Timed runs of the full-size graph per length and thread count in JavaScript, after `warmup` (a run "
        "takes up to a second in WebAssembly).", minimum=1)
    browser: bool | Literal["auto"] = option(
        "auto", "With `javascript`, also time in headless Chromium: onnxruntime-web in a cross-origin-isolated page "
        "served by clients/web/scripts/serve-demo.mjs, at `browser_threads`. Needs Chromium (/usr/bin/chromium "
        "or $CHROMIUM_PATH; `apt-get install chromium`, which setup.sh runs as root). auto: where Chromium is "
        "there, else skipped with the reason; true: stop without it.")
    browser_threads: list[int] = option(
        [1, 2], "WebAssembly thread counts timed in Chromium, each in a fresh page (more than 1 needs the page's "
        "cross-origin isolation).")
    timed_full_size: list[str] = option(
        ["bert-base/pytorch-fp32", "bert-base/onnx-int8-optimized", "distilbert/pytorch-fp32", "distilbert/onnx-fp32",
         "distilbert/onnx-int8", "distilbert/onnx-int8-optimized", "distilbert/torch-dynamic-int8",
         "distilbert/onnx-ortquantizer-int8", "distilbert/openvino-nncf-int8", "distilbert/openvino-ours-int8"],
        "Full-size artifacts that are timed (each takes tens of seconds); the others get sizes only. The peers "
        "(<architecture>/torch-dynamic-int8, <architecture>/onnx-ortquantizer-int8, "
        "<architecture>/openvino-nncf-int8, distilbert/openvino-ours-int8: pipeline.export.peers) are built and "
        "timed only when named here; each OpenVINO one at precision f32 and at the runtime's default.",
    )

    def __post_init__(self) -> None:
        if not self.sequence_lengths or min(self.sequence_lengths) < 8:
            raise ConfigError(f"benchmark.sequence_lengths: {self.sequence_lengths} needs lengths of at least 8")
        if not self.threads or min(self.threads) < 1:
            raise ConfigError(f"benchmark.threads: {self.threads} needs thread counts of at least 1")
        if not self.browser_threads or min(self.browser_threads) < 1:
            raise ConfigError(f"benchmark.browser_threads: {self.browser_threads} needs thread counts of at least 1")


@dataclass
class ComputeConfig:
    """How training rules are launched, and what Snakemake rules ask the scheduler for (resources:)."""

    gpus: int = option(0, "GPUs each training rule requests (resources: gpu); 0 runs on CPU.", minimum=0)
    processes: int = option(
        1,
        "Training processes per training rule (per node with nodes > 1). 1: a plain `python -m pipeline` process; "
        "N > 1: `torchrun --nproc_per_node N` (PyTorch DDP: NCCL on GPUs, one process per GPU; gloo on CPU). The "
        "effective batch is batch_size x processes x grad_accum_steps.",
        minimum=1,
    )
    nodes: int = option(
        1, "Machines per training rule, each running `processes` processes. N > 1 (SLURM): the rule asks for N nodes "
        "and its own `srun` starts one `torchrun --nnodes N --nproc-per-node <processes> --rdzv-backend c10d` per "
        "node; the effective batch is batch_size x nodes x processes x grad_accum_steps.", minimum=1)
    rdzv_endpoint: str | None = option(
        None, "HOST:PORT where the nodes' torchrun agents meet (c10d rendezvous) when nodes > 1. null: port 29500 "
        "on the first node of the SLURM allocation, looked up by the job's shell when it starts.")
    mixed_precision: Literal["no", "bf16", "fp16"] = option(
        "bf16", "Autocast precision of training on CUDA (fp16 adds loss scaling); CPU training is always fp32."
    )
    # The *_mem_mb options feed Snakemake's `mem_mb` resource and keep its convention (name and unit, MB).
    training_mem_mb: int = option(8000, "Memory a training rule requests.", minimum=100)
    light_mem_mb: int = option(2000, "Memory the small rules request (bundle, report, web benchmark).", minimum=100)
    data_mem_mb: int = option(
        2000, "Memory prepare_data, tokenizer and tokenize_corpus request (a tokenizing worker holds one batch of "
        "documents; a trained WordPiece tokenizer's pair counts grow with the corpus's distinct words).", minimum=100)
    data_threads: int = option(
        2, "Cores tokenize_corpus (one tokenizing process each) and tokenizer training ask for. The output does not "
        "depend on it.", minimum=1)
    export_mem_mb: int = option(
        4000, "Memory the export, quantization, CoreML, full-size and benchmark rules request (full-size BERT-base "
        "exports hold several copies of the model).", minimum=100)

    def __post_init__(self) -> None:
        if self.rdzv_endpoint is not None and not re.fullmatch(r"[A-Za-z0-9_.\-]+:[0-9]{1,5}", self.rdzv_endpoint):
            raise ConfigError(f"compute.rdzv_endpoint: {self.rdzv_endpoint!r} is not HOST:PORT")
        if self.gpus and self.processes != self.gpus:
            raise ConfigError(
                f"compute.processes: {self.processes} processes for compute.gpus {self.gpus}; DDP runs one process "
                "per GPU, so set both to the same number"
            )


STUDY_VARIANTS = ("ce_only", "distilbert", "pkd_skip", "pkd_last", "tinybert")


@dataclass
class StudyConfig:
    """The evidence behind the distillation claims (target `study`, not in the default `all`): distill_squad and
    its alternatives rerun from the same distilled student and teacher over several seeds."""

    seeds: list[int] = option([1, 2, 3, 4, 5], "Seeds of every variant (head initialisation and data order).")
    variants: list[Literal["ce_only", "distilbert", "pkd_skip", "pkd_last", "tinybert"]] = option(
        list(STUDY_VARIANTS),
        "ce_only: gold spans only (student_finetune); distilbert: the DistilBERT soft-target loss; pkd_skip / "
        "pkd_last: distilbert plus the PKD patient loss on the Skip / Last teacher layers; tinybert: TinyBERT's "
        "two steps, intermediate layers (attention, hidden states, embeddings) for tinybert.intermediate_share of "
        "the epochs, then the prediction layer (with the gold spans). Each variant keeps every other distill_squad "
        "setting as configured, so all train for the same epochs.",
    )
    confidence: float = option(0.95, "Level of the intervals (Student's t over seeds).", exclusiveMinimum=0.0,
                               maximum=0.999)
    bootstrap_samples: int = option(2000, "Resamples of the dev questions for one run's standard error.", minimum=100)

    def __post_init__(self) -> None:
        if len(self.seeds) < 2 or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"study.seeds: {self.seeds} needs at least two different seeds for an interval")
        if "ce_only" not in self.variants:
            raise ConfigError(f"study.variants: {self.variants} needs ce_only, the baseline every difference is to")


@dataclass
class DeployConfig:
    """Target `deploy`: export, quantize, bundle and benchmark an existing question-answering model, no training."""

    model: str | None = option(
        None, "A question-answering model to deploy as it is: a hub name (e.g. distilbert-base-cased-distilled-squad) "
        "or a local save_pretrained folder (write ./folder). Set, the DAG trains nothing: its outputs go to "
        "<output_root>/deploy/<model's last path part>.")
    revision: str | None = option(None, "Hub revision (branch, tag or commit) of deploy.model; null: the default branch.")

    def __post_init__(self) -> None:
        if self.model is not None and not self.model.strip():
            raise ConfigError("deploy.model: empty; leave it null to train, or name a hub model or ./folder to deploy")


@dataclass
class PipelineConfig:
    """The whole pipeline. Every stage reads the sections it needs."""

    seed: int = option(42, "Seed for model initialisation, data order, masking and dropout.")
    output_root: str = option("artifacts", "Folder all stage outputs go under.")
    data: DataConfig = section(DataConfig, "SQuAD data and MLM corpus sources.")
    tokenizer: TokenizerConfig = section(TokenizerConfig, "Pretrained or trained WordPiece tokenizer.")
    teacher: TeacherConfig = section(TeacherConfig, "The BERT teacher.")
    squad: SquadConfig = section(SquadConfig, "QA windowing and postprocessing.")
    student: StudentConfig = section(StudentConfig, "The DistilBERT student.")
    distill_pretrain: DistillPretrainConfig = section(DistillPretrainConfig, "Pretraining distillation.")
    distill_squad: DistillSquadConfig = section(DistillSquadConfig, "SQuAD distillation (second step).")
    export: ExportConfig = section(ExportConfig, "ONNX / CoreML export, quantization, gates and the app bundle.")
    benchmark: BenchmarkConfig = section(BenchmarkConfig, "Size, accuracy, latency and memory of every artifact.")
    compute: ComputeConfig = section(ComputeConfig, "Scheduler resources per rule.")
    study: StudyConfig = section(StudyConfig, "Multi-seed evidence for the distillation claims (target study).")
    deploy: DeployConfig = section(DeployConfig, "Deploy an existing QA model as it is (target deploy).")

    def __post_init__(self) -> None:
        if self.deploy.model is not None:
            # The deployed model is the full-size one: a deploy builds no random-weight references.
            self.export.full_size.architectures = []
        lengths = self.export.coreml.sequence_lengths
        if max(lengths) < self.squad.max_seq_length:
            raise ConfigError(
                f"export.coreml.sequence_lengths: the longest, {max(lengths)}, is shorter than squad.max_seq_length "
                f"{self.squad.max_seq_length}; the CoreML packages could not take a full window"
            )
