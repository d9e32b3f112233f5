"""Student construction: which teacher layers a student copies, its config, and its initialisation.

DistilBERT (Sanh et al. 2019, arXiv:1910.01108) builds a 6-layer student from a 12-layer BERT by
copying every other teacher layer and dropping the token-type embeddings and the pooler. This
module does that for any teacher depth and student depth, and also offers the layer mappings
used by TinyBERT (Jiao et al. 2019, arXiv:1909.10351) and PKD (Sun et al. 2019, arXiv:1908.09355).

Layer indices are 0-based indices into the teacher's transformer layers: teacher layer ``l`` is
``teacher.bert.encoder.layer[l]``, whose output is ``hidden_states[l + 1]`` in a Hugging Face
forward with ``output_hidden_states=True`` (``hidden_states[0]`` is the embedding output).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.errors import PipelineError

# torch and transformers are imported where a model is built: the Snakefile checks layer mappings with this
# module while it plans the DAG, and importing them there would add seconds to every snakemake call.
if TYPE_CHECKING:
    import torch
    from transformers import BertConfig, BertForMaskedLM, DistilBertConfig, DistilBertForMaskedLM

DEFAULT_MAPPING_KEY = "student.layer_mapping"

# The named strategies a config may give instead of an explicit list of teacher layers.
LAYER_MAPPING_STRATEGIES = ("every_other", "first_k", "last_k", "uniform")


class LayerMappingError(PipelineError, ValueError):
    """A student→teacher layer mapping that cannot be used; the message names the config key."""


# --------------------------------------------------------------------------------------------
# Layer mapping
# --------------------------------------------------------------------------------------------


def teacher_layers_for_student(
    strategy: str | Sequence[int],
    n_teacher_layers: int,
    n_student_layers: int,
    key: str = DEFAULT_MAPPING_KEY,
) -> list[int]:
    """Teacher layer (0-based) that each student layer copies or imitates, in student-layer order.

    Strategies, for a teacher of ``L`` layers and a student of ``k``:

    - ``every_other``: the DistilBERT reference mapping, 12→6 gives [0, 2, 4, 7, 9, 11]: k teacher
      layers spread evenly from the bottom (0) to the top (L-1), student layer i ← round(i·(L−1)/(k−1))
      with halves rounded up. Other depths follow the same rule, so no block of the teacher is left
      out: 12→4 gives [0, 4, 7, 11], 24→6 [0, 5, 9, 14, 18, 23], 12→3 [0, 6, 11], 6→3 [0, 3, 5],
      4→2 [0, 3]. A 1-layer student copies layer 0 (next to the embeddings it also copies).
    - ``first_k``: 0, 1, …, k-1.
    - ``last_k``: L-k, …, L-1.
    - ``uniform``: TinyBERT's g(m) = m·L/k, i.e. student layer i ← round((i+1)·L/k) − 1 (halves
      round up), 12→6 gives [1, 3, 5, 7, 9, 11] and 12→4 gives [2, 5, 8, 11].
    - a list of ints: used as given; it must have one entry per student layer, each in [0, L).
      Repeats are allowed (two student layers may imitate the same teacher layer).

    Raises LayerMappingError naming ``key`` when the mapping cannot be built.
    """
    _check_layer_counts(n_teacher_layers, n_student_layers, key)
    if isinstance(strategy, str):
        return _named_strategy(strategy, n_teacher_layers, n_student_layers, key)
    if not isinstance(strategy, Sequence):
        raise LayerMappingError(
            f"{key}: expected a strategy name ({', '.join(LAYER_MAPPING_STRATEGIES)}) or a list of "
            f"teacher layer indices, got {strategy!r}"
        )
    return _explicit_mapping(strategy, n_teacher_layers, n_student_layers, key)


def validate_student_against_teacher(
    teacher_config: BertConfig,
    n_student_layers: int,
    mapping: str | Sequence[int],
    key: str = DEFAULT_MAPPING_KEY,
) -> list[int]:
    """Check, before any training, that ``mapping`` works for this teacher; return the teacher layers.

    Raises LayerMappingError naming ``key`` (see ``teacher_layers_for_student``).
    """
    return teacher_layers_for_student(mapping, teacher_config.num_hidden_layers, n_student_layers, key)


def _check_layer_counts(n_teacher_layers: int, n_student_layers: int, key: str) -> None:
    if n_teacher_layers <= 0:
        raise LayerMappingError(f"{key}: the teacher must have at least one layer, got {n_teacher_layers}")
    if n_student_layers <= 0:
        raise LayerMappingError(f"{key}: the student must have at least one layer, got {n_student_layers}")
    if n_student_layers > n_teacher_layers:
        raise LayerMappingError(
            f"{key}: a student of {n_student_layers} layers cannot be mapped onto a teacher of "
            f"{n_teacher_layers} layers; use at most {n_teacher_layers} student layers"
        )


def _named_strategy(strategy: str, n_teacher_layers: int, n_student_layers: int, key: str) -> list[int]:
    if strategy == "every_other":
        return _every_other(n_teacher_layers, n_student_layers)
    if strategy == "first_k":
        return list(range(n_student_layers))
    if strategy == "last_k":
        return list(range(n_teacher_layers - n_student_layers, n_teacher_layers))
    if strategy == "uniform":
        return [_round_half_up((i + 1) * n_teacher_layers, n_student_layers) - 1 for i in range(n_student_layers)]
    raise LayerMappingError(
        f"{key}: unknown layer mapping {strategy!r}; use one of {', '.join(LAYER_MAPPING_STRATEGIES)} "
        "or an explicit list of teacher layer indices"
    )


def _every_other(n_teacher_layers: int, n_student_layers: int) -> list[int]:
    if n_student_layers == 1:
        return [0]
    # Evenly spaced over [0, L-1]; the spacing (L-1)/(k-1) >= 1 for k <= L, so the layers are distinct.
    return [_round_half_up(i * (n_teacher_layers - 1), n_student_layers - 1) for i in range(n_student_layers)]


def _explicit_mapping(layers: Sequence[int], n_teacher_layers: int, n_student_layers: int, key: str) -> list[int]:
    layers = list(layers)
    if len(layers) != n_student_layers:
        raise LayerMappingError(
            f"{key}: lists {len(layers)} teacher layers but the student has {n_student_layers} layers; "
            "give exactly one teacher layer per student layer"
        )
    for student_layer, teacher_layer in enumerate(layers):
        # bool is an int subclass; True as a layer index is a config mistake, not layer 1.
        if isinstance(teacher_layer, bool) or not isinstance(teacher_layer, int):
            raise LayerMappingError(
                f"{key}[{student_layer}]: teacher layer must be an integer, got {teacher_layer!r}"
            )
        if not 0 <= teacher_layer < n_teacher_layers:
            raise LayerMappingError(
                f"{key}[{student_layer}]: teacher layer {teacher_layer} is out of range; "
                f"the teacher has {n_teacher_layers} layers (valid indices 0..{n_teacher_layers - 1})"
            )
    return layers


def _round_half_up(numerator: int, denominator: int) -> int:
    """round(numerator / denominator) with halves rounded up, in exact integer arithmetic."""
    return (2 * numerator + denominator) // (2 * denominator)


# --------------------------------------------------------------------------------------------
# Student config
# --------------------------------------------------------------------------------------------


def student_config_from_teacher(teacher_config: BertConfig, n_layers: int | None = None) -> DistilBertConfig:
    """A DistilBERT config with the teacher's width, heads, vocabulary and dropout, and fewer layers.

    ``n_layers`` defaults to half the teacher's layers (DistilBERT: 12 → 6). DistilBERT has no
    token-type embeddings and no pooler; positions are learned (not sinusoidal) so they can be
    copied from the teacher.
    """
    from transformers import DistilBertConfig

    if n_layers is None:
        n_layers = max(1, teacher_config.num_hidden_layers // 2)
    return DistilBertConfig(
        vocab_size=teacher_config.vocab_size,
        max_position_embeddings=teacher_config.max_position_embeddings,
        sinusoidal_pos_embds=False,
        n_layers=n_layers,
        n_heads=teacher_config.num_attention_heads,
        dim=teacher_config.hidden_size,
        hidden_dim=teacher_config.intermediate_size,
        dropout=teacher_config.hidden_dropout_prob,
        attention_dropout=teacher_config.attention_probs_dropout_prob,
        activation=teacher_config.hidden_act,
        initializer_range=teacher_config.initializer_range,
        pad_token_id=teacher_config.pad_token_id,
        # Tie the MLM projection to the word embeddings exactly when the teacher does, so the
        # copied decoder and the copied embeddings cannot disagree.
        tie_word_embeddings=teacher_config.tie_word_embeddings,
    )


# --------------------------------------------------------------------------------------------
# Initialisation from the teacher
# --------------------------------------------------------------------------------------------

# Per transformer layer: DistilBERT sub-module ← BERT sub-module (each has .weight and .bias).
_LAYER_MODULE_SOURCES = (
    ("attention.q_lin", "attention.self.query"),
    ("attention.k_lin", "attention.self.key"),
    ("attention.v_lin", "attention.self.value"),
    ("attention.out_lin", "attention.output.dense"),
    ("sa_layer_norm", "attention.output.LayerNorm"),
    ("ffn.lin1", "intermediate.dense"),
    ("ffn.lin2", "output.dense"),
    ("output_layer_norm", "output.LayerNorm"),
)

# MLM head: DistilBERT parameter ← BERT parameter.
_MLM_HEAD_SOURCES = (
    ("vocab_transform.weight", "cls.predictions.transform.dense.weight"),
    ("vocab_transform.bias", "cls.predictions.transform.dense.bias"),
    ("vocab_layer_norm.weight", "cls.predictions.transform.LayerNorm.weight"),
    ("vocab_layer_norm.bias", "cls.predictions.transform.LayerNorm.bias"),
    ("vocab_projector.weight", "cls.predictions.decoder.weight"),
    ("vocab_projector.bias", "cls.predictions.bias"),
)

_TEACHER_TOKEN_TYPES = "bert.embeddings.token_type_embeddings.weight"


@dataclass(frozen=True)
class ParameterSource:
    """Where one student parameter comes from in the teacher's state dict.

    The student value is ``teacher[teacher_name]``, plus row 0 of ``teacher[plus_row_zero_of]``
    when that is set (used to fold the token-type embedding into the position embeddings).
    """

    student_name: str
    teacher_name: str
    plus_row_zero_of: str | None = None

    def value_from(self, teacher_state: Mapping[str, torch.Tensor]) -> torch.Tensor:
        value = teacher_state[self.teacher_name]
        if self.plus_row_zero_of is not None:
            value = value + teacher_state[self.plus_row_zero_of][0]
        return value


def student_parameter_sources(
    teacher_layers: Sequence[int], fold_token_type_into_positions: bool = True
) -> list[ParameterSource]:
    """Every parameter of a ``DistilBertForMaskedLM`` and the teacher parameter it is copied from.

    ``init_student_from_teacher`` copies exactly this list, so a caller (or a test) can check
    each student tensor against its source. Student layer i copies teacher layer teacher_layers[i].
    """
    position_source = ParameterSource(
        "distilbert.embeddings.position_embeddings.weight",
        "bert.embeddings.position_embeddings.weight",
        _TEACHER_TOKEN_TYPES if fold_token_type_into_positions else None,
    )
    sources = [
        ParameterSource("distilbert.embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight"),
        position_source,
        ParameterSource("distilbert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.weight"),
        ParameterSource("distilbert.embeddings.LayerNorm.bias", "bert.embeddings.LayerNorm.bias"),
    ]
    for student_layer, teacher_layer in enumerate(teacher_layers):
        for student_module, teacher_module in _LAYER_MODULE_SOURCES:
            for tensor in ("weight", "bias"):
                sources.append(
                    ParameterSource(
                        f"distilbert.transformer.layer.{student_layer}.{student_module}.{tensor}",
                        f"bert.encoder.layer.{teacher_layer}.{teacher_module}.{tensor}",
                    )
                )
    sources += [ParameterSource(student_name, teacher_name) for student_name, teacher_name in _MLM_HEAD_SOURCES]
    return sources


def init_student_from_teacher(
    teacher: BertForMaskedLM,
    student_config: DistilBertConfig,
    teacher_layers: Sequence[int],
    *,
    fold_token_type_into_positions: bool = True,
) -> DistilBertForMaskedLM:
    """A DistilBERT MLM student whose every parameter is copied from ``teacher``.

    Student layer i copies teacher layer ``teacher_layers[i]``; embeddings and the MLM head are
    copied as well (see ``student_parameter_sources`` for the full list).

    BERT adds a token-type embedding to every input, and row 0 (segment A) whenever no
    ``token_type_ids`` are given; DistilBERT has no token-type embeddings. With
    ``fold_token_type_into_positions`` the student's position embeddings are the teacher's
    position embeddings plus token_type_embeddings[0], so for segment-A inputs the student's
    embedding output equals the teacher's exactly. (The DistilBERT reference drops the row;
    the first layers then see a constant shift they must unlearn.)
    """
    from transformers import DistilBertForMaskedLM

    teacher_config = teacher.config
    _check_student_fits_teacher(teacher_config, student_config)
    teacher_layers = teacher_layers_for_student(
        list(teacher_layers), teacher_config.num_hidden_layers, student_config.n_layers, key="teacher_layers"
    )
    teacher_state = teacher.state_dict()
    _check_tying_is_consistent(teacher_state, student_config)

    sources = student_parameter_sources(teacher_layers, fold_token_type_into_positions)
    student_state = {source.student_name: source.value_from(teacher_state) for source in sources}
    student = DistilBertForMaskedLM(student_config)
    # strict=True: every student parameter must have a source, so nothing stays random by accident.
    student.load_state_dict(student_state, strict=True)
    return student


def random_student(student_config: DistilBertConfig, seed: int) -> DistilBertForMaskedLM:
    """A randomly initialised student (the ``init: random`` ablation), reproducible from ``seed``.

    The global RNG is left untouched so that seeding here does not change anything else.
    """
    import torch
    from transformers import DistilBertForMaskedLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DistilBertForMaskedLM(student_config)


def _check_student_fits_teacher(teacher_config: BertConfig, student_config: DistilBertConfig) -> None:
    """Raise ValueError naming the first field where the student cannot hold the teacher's tensors."""
    expected = student_config_from_teacher(teacher_config, student_config.n_layers)
    for field in ("vocab_size", "dim", "hidden_dim", "n_heads", "max_position_embeddings"):
        if getattr(student_config, field) != getattr(expected, field):
            raise ValueError(
                f"student config {field}={getattr(student_config, field)} does not match the teacher "
                f"({getattr(expected, field)}); build it with student_config_from_teacher"
            )
    if student_config.sinusoidal_pos_embds:
        raise ValueError(
            "student config has sinusoidal_pos_embds=True; learned positions are needed to copy the teacher's"
        )
    if getattr(teacher_config, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"teacher uses position_embedding_type={teacher_config.position_embedding_type!r}; "
            "only absolute position embeddings can be copied into DistilBERT"
        )


def _check_tying_is_consistent(teacher_state: Mapping[str, torch.Tensor], student_config: DistilBertConfig) -> None:
    """A tied student holds one tensor for embeddings and decoder, so the teacher's two must agree."""
    import torch

    if not student_config.tie_word_embeddings:
        return
    embeddings = teacher_state["bert.embeddings.word_embeddings.weight"]
    decoder = teacher_state["cls.predictions.decoder.weight"]
    if not torch.equal(embeddings, decoder):
        raise ValueError(
            "the student ties vocab_projector to its word embeddings but the teacher's MLM decoder differs "
            "from its word embeddings; build the student config with tie_word_embeddings=False"
        )


def freeze(teacher: torch.nn.Module) -> torch.nn.Module:
    """The teacher only supplies targets: eval mode (no dropout), no gradients, not in the optimizer."""
    teacher.eval()
    for parameter in teacher.parameters():
        parameter.requires_grad_(False)
    return teacher
