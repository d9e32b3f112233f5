"""Student layer mapping, config and initialisation from a tiny BERT teacher."""

import pytest
import torch
from transformers import BertForMaskedLM

from pipeline.distillation.students import (
    LayerMappingError,
    init_student_from_teacher,
    random_student,
    student_config_from_teacher,
    student_parameter_sources,
    teacher_layers_for_student,
    validate_student_against_teacher,
)


from tests.stage_fixtures import tiny_bert_config as tiny_teacher_config  # noqa: E402


@pytest.fixture
def teacher() -> BertForMaskedLM:
    torch.manual_seed(0)
    model = BertForMaskedLM(tiny_teacher_config())
    # Fresh BERT token-type embeddings are random too, but make row 0 clearly non-zero so the
    # folding test would fail if it were dropped.
    with torch.no_grad():
        model.bert.embeddings.token_type_embeddings.weight[0] += 1.0
    return model.eval()


# ---------------------------------------------------------------- layer mapping


@pytest.mark.parametrize(
    ("n_teacher", "n_student", "expected"),
    [
        (12, 6, [0, 2, 4, 7, 9, 11]),  # the DistilBERT reference mapping, exactly
        (4, 2, [0, 3]),  # the offline default
        (12, 4, [0, 4, 7, 11]),
        (24, 6, [0, 5, 9, 14, 18, 23]),
        (12, 3, [0, 6, 11]),
        (6, 3, [0, 3, 5]),
        (12, 7, [0, 2, 4, 6, 7, 9, 11]),
        (12, 8, [0, 2, 3, 5, 6, 8, 9, 11]),
        (12, 12, list(range(12))),
        (12, 1, [0]),
    ],
)
def test_every_other_spreads_the_student_evenly_from_bottom_to_top(n_teacher, n_student, expected):
    assert teacher_layers_for_student("every_other", n_teacher, n_student) == expected


@pytest.mark.parametrize("n_teacher", [2, 4, 6, 12, 24, 48])
def test_every_other_leaves_no_block_of_the_teacher_uncopied(n_teacher):
    # Evenly spread: distinct increasing layers from 0 to L-1, and no gap between copied layers
    # wider than ceil((L-1)/(k-1)) (12->4 once took [0, 2, 9, 11], a gap of 7).
    for n_student in range(2, n_teacher + 1):
        layers = teacher_layers_for_student("every_other", n_teacher, n_student)
        assert layers[0] == 0 and layers[-1] == n_teacher - 1
        gaps = [later - earlier for earlier, later in zip(layers, layers[1:])]
        assert min(gaps) >= 1
        assert max(gaps) <= -(-(n_teacher - 1) // (n_student - 1)), (n_teacher, n_student, layers)
        assert max(gaps) - min(gaps) <= 1, (n_teacher, n_student, layers)


@pytest.mark.parametrize(
    ("strategy", "n_teacher", "n_student", "expected"),
    [
        ("first_k", 12, 3, [0, 1, 2]),
        ("last_k", 12, 3, [9, 10, 11]),
        ("uniform", 12, 6, [1, 3, 5, 7, 9, 11]),  # TinyBERT g(m) = 2m
        ("uniform", 12, 4, [2, 5, 8, 11]),  # TinyBERT g(m) = 3m
        ("uniform", 4, 4, [0, 1, 2, 3]),
        ([3, 1, 1], 4, 3, [3, 1, 1]),  # explicit lists may repeat and reorder
    ],
)
def test_other_strategies(strategy, n_teacher, n_student, expected):
    assert teacher_layers_for_student(strategy, n_teacher, n_student) == expected


def test_out_of_range_layer_names_the_key_index_and_teacher_depth():
    with pytest.raises(LayerMappingError, match=r"student\.layer_mapping\[1\].*4.*4 layers"):
        teacher_layers_for_student([0, 4], 4, 2)


def test_wrong_length_names_both_lengths():
    with pytest.raises(LayerMappingError, match="my.key: lists 3 teacher layers but the student has 2"):
        teacher_layers_for_student([0, 1, 2], 4, 2, key="my.key")


def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(LayerMappingError, match="student.layer_mapping: unknown.*every_other, first_k, last_k, uniform"):
        teacher_layers_for_student("every_third", 12, 6)


@pytest.mark.parametrize("n_student", [0, -1, 5])
def test_student_depth_must_be_between_one_and_teacher_depth(n_student):
    with pytest.raises(LayerMappingError, match="student.layer_mapping"):
        teacher_layers_for_student("first_k", 4, n_student)


def test_layer_mapping_error_is_a_value_error():
    with pytest.raises(ValueError):
        teacher_layers_for_student([True, 1], 4, 2)


def test_a_mapping_that_is_neither_name_nor_list_is_rejected():
    with pytest.raises(LayerMappingError, match="student.layer_mapping: expected a strategy name"):
        teacher_layers_for_student(6, 12, 6)


def test_validate_student_against_teacher_uses_the_teacher_depth():
    config = tiny_teacher_config(num_hidden_layers=12)
    assert validate_student_against_teacher(config, 6, "every_other") == [0, 2, 4, 7, 9, 11]
    with pytest.raises(LayerMappingError, match="distill.mapping"):
        validate_student_against_teacher(config, 6, [0, 12, 1, 2, 3, 4], key="distill.mapping")


# ---------------------------------------------------------------- student config


def test_student_config_copies_the_teacher_shape_with_half_the_layers():
    teacher_config = tiny_teacher_config(hidden_act="relu", hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3)
    config = student_config_from_teacher(teacher_config, n_layers=None)
    assert (config.vocab_size, config.dim, config.hidden_dim, config.n_heads) == (50, 16, 32, 2)
    assert config.max_position_embeddings == 64
    assert config.n_layers == 2
    assert config.activation == "relu"
    assert (config.dropout, config.attention_dropout) == (0.2, 0.3)
    assert config.pad_token_id == teacher_config.pad_token_id
    assert config.sinusoidal_pos_embds is False
    assert student_config_from_teacher(teacher_config, n_layers=3).n_layers == 3


# ---------------------------------------------------------------- init from teacher


def test_every_student_parameter_is_copied_from_its_teacher_source(teacher):
    student = init_student_from_teacher(teacher, student_config_from_teacher(teacher.config, 2), [0, 3])
    sources = student_parameter_sources([0, 3])
    teacher_state, student_state = teacher.state_dict(), student.state_dict()

    assert {source.student_name for source in sources} == set(student_state)
    for source in sources:
        assert torch.equal(student_state[source.student_name], source.value_from(teacher_state)), source


def test_student_layer_i_copies_the_mapped_teacher_layer(teacher):
    student = init_student_from_teacher(teacher, student_config_from_teacher(teacher.config, 2), [0, 3])
    teacher_layer = teacher.bert.encoder.layer[3]
    student_layer = student.distilbert.transformer.layer[1]
    assert torch.equal(student_layer.attention.q_lin.weight, teacher_layer.attention.self.query.weight)
    assert torch.equal(student_layer.attention.out_lin.bias, teacher_layer.attention.output.dense.bias)
    assert torch.equal(student_layer.ffn.lin2.weight, teacher_layer.output.dense.weight)
    assert torch.equal(student_layer.output_layer_norm.weight, teacher_layer.output.LayerNorm.weight)


def test_token_type_row_zero_is_folded_into_positions(teacher):
    config = student_config_from_teacher(teacher.config, 2)
    embeddings = teacher.bert.embeddings
    folded = init_student_from_teacher(teacher, config, [0, 3])
    plain = init_student_from_teacher(teacher, config, [0, 3], fold_token_type_into_positions=False)

    expected = embeddings.position_embeddings.weight + embeddings.token_type_embeddings.weight[0]
    assert torch.allclose(folded.distilbert.embeddings.position_embeddings.weight, expected)
    assert torch.equal(plain.distilbert.embeddings.position_embeddings.weight, embeddings.position_embeddings.weight)


def test_student_embedding_output_equals_the_teachers(teacher):
    student = init_student_from_teacher(teacher, student_config_from_teacher(teacher.config, 2), [0, 3]).eval()
    input_ids = torch.tensor([[2, 7, 11, 3, 0], [2, 5, 3, 0, 0]])
    attention_mask = (input_ids != 0).long()
    with torch.no_grad():
        teacher_hidden = teacher(input_ids, attention_mask, output_hidden_states=True).hidden_states[0]
        student_hidden = student(input_ids, attention_mask, output_hidden_states=True).hidden_states[0]
    # Not bit-equal: (word + position) + token_type is summed in a different order than
    # word + (position + token_type); LayerNorm then amplifies float rounding to ~1e-6.
    assert torch.allclose(student_hidden, teacher_hidden, atol=1e-5)


def test_mlm_projection_stays_tied_to_the_copied_word_embeddings(teacher):
    student = init_student_from_teacher(teacher, student_config_from_teacher(teacher.config, 2), [0, 3])
    assert student.vocab_projector.weight is student.distilbert.embeddings.word_embeddings.weight
    assert torch.equal(student.vocab_projector.weight, teacher.cls.predictions.decoder.weight)
    assert torch.equal(student.vocab_projector.bias, teacher.cls.predictions.bias)


def test_untied_teacher_gives_an_untied_student_with_the_teachers_decoder():
    torch.manual_seed(0)
    teacher = BertForMaskedLM(tiny_teacher_config(tie_word_embeddings=False))
    student = init_student_from_teacher(teacher, student_config_from_teacher(teacher.config, 2), [1, 3])
    assert torch.equal(student.vocab_projector.weight, teacher.cls.predictions.decoder.weight)
    assert torch.equal(
        student.distilbert.embeddings.word_embeddings.weight, teacher.bert.embeddings.word_embeddings.weight
    )
    assert not torch.equal(student.vocab_projector.weight, student.distilbert.embeddings.word_embeddings.weight)


def test_init_rejects_a_mapping_of_the_wrong_length(teacher):
    with pytest.raises(LayerMappingError, match="teacher_layers"):
        init_student_from_teacher(teacher, student_config_from_teacher(teacher.config, 2), [0, 1, 2])


def test_init_rejects_a_student_narrower_than_the_teacher(teacher):
    config = student_config_from_teacher(teacher.config, 2)
    config.dim = 8
    with pytest.raises(ValueError, match="dim=8"):
        init_student_from_teacher(teacher, config, [0, 3])


def test_random_student_is_reproducible_and_differs_from_the_teacher_copy(teacher):
    config = student_config_from_teacher(teacher.config, 2)
    copied = init_student_from_teacher(teacher, config, [0, 3]).state_dict()
    first, second = random_student(config, seed=1).state_dict(), random_student(config, seed=1).state_dict()
    other_seed = random_student(config, seed=2).state_dict()

    name = "distilbert.transformer.layer.0.attention.q_lin.weight"
    assert torch.equal(first[name], second[name])
    assert not torch.equal(first[name], other_seed[name])
    assert not torch.equal(first[name], copied[name])


# ---------------------------------------------------------------- edges and messages


def test_a_teacher_needs_at_least_one_layer():
    with pytest.raises(LayerMappingError, match=r"^student\.layer_mapping: the teacher must have at least one layer, got 0$"):
        teacher_layers_for_student("first_k", 0, 1)
    assert teacher_layers_for_student("every_other", 1, 1) == [0]


@pytest.mark.parametrize(("n_teacher", "n_student"), [(1, 1), (2, 1), (3, 1), (5, 2), (12, 6)])
def test_default_student_depth_is_half_the_teacher_rounded_down_and_at_least_one(n_teacher, n_student):
    config = student_config_from_teacher(tiny_teacher_config(num_hidden_layers=n_teacher))
    assert config.n_layers == n_student and isinstance(config.n_layers, int)


def test_student_config_copies_initialisation_range_and_padding_id():
    config = student_config_from_teacher(tiny_teacher_config(initializer_range=0.05, pad_token_id=3), 2)
    assert (config.initializer_range, config.pad_token_id) == (0.05, 3)
    assert config.sinusoidal_pos_embds is False


@pytest.mark.parametrize(
    ("mapping", "n_student", "message"),
    [
        ([0, 1.5], 2, r"^student\.layer_mapping\[1\]: teacher layer must be an integer, got 1\.5$"),
        ([0, 4], 2, r"^student\.layer_mapping\[1\]: teacher layer 4 is out of range; the teacher has 4 layers "
                    r"\(valid indices 0\.\.3\)$"),
        ([0, 1, 2], 2, r"^student\.layer_mapping: lists 3 teacher layers but the student has 2 layers; "
                       r"give exactly one teacher layer per student layer$"),
        ("every_third", 2, r"^student\.layer_mapping: unknown layer mapping 'every_third'; use one of every_other, "
                           r"first_k, last_k, uniform or an explicit list of teacher layer indices$"),
        (6, 2, r"^student\.layer_mapping: expected a strategy name \(every_other, first_k, last_k, uniform\) or a list"),
    ],
)
def test_mapping_errors_say_exactly_what_is_wrong(mapping, n_student, message):
    with pytest.raises(LayerMappingError, match=message):
        teacher_layers_for_student(mapping, 4, n_student)


def test_init_errors_name_what_cannot_be_copied(teacher):
    with pytest.raises(LayerMappingError, match=r"^teacher_layers: lists 3"):
        init_student_from_teacher(teacher, student_config_from_teacher(teacher.config, 2), [0, 1, 2])
    sinusoidal = student_config_from_teacher(teacher.config, 2)
    sinusoidal.sinusoidal_pos_embds = True
    with pytest.raises(ValueError, match=r"^student config has sinusoidal_pos_embds=True; learned positions are "
                                         r"needed to copy the teacher's$"):
        init_student_from_teacher(teacher, sinusoidal, [0, 3])
    relative = BertForMaskedLM(tiny_teacher_config(position_embedding_type="relative_key"))
    with pytest.raises(ValueError, match=r"^teacher uses position_embedding_type='relative_key'; only absolute "
                                         r"position embeddings can be copied into DistilBERT$"):
        init_student_from_teacher(relative, student_config_from_teacher(relative.config, 2), [0, 3])


def test_a_tied_student_refuses_a_teacher_whose_decoder_differs_from_its_embeddings(teacher):
    untied = BertForMaskedLM(tiny_teacher_config(tie_word_embeddings=False))
    with torch.no_grad():
        untied.cls.predictions.decoder.weight.add_(1.0)
    tied_config = student_config_from_teacher(untied.config, 2)
    tied_config.tie_word_embeddings = True
    with pytest.raises(ValueError, match=r"^the student ties vocab_projector to its word embeddings but the teacher's "
                                         r"MLM decoder differs from its word embeddings; build the student config "
                                         r"with tie_word_embeddings=False$"):
        init_student_from_teacher(untied, tied_config, [0, 3])
