"""Each distillation loss against a hand computation on tensors small enough to check by eye."""

import math

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import BertForMaskedLM, DistilBertForMaskedLM

from pipeline.distillation.losses import (
    AttentionScoreRecorder,
    hidden_cosine_loss,
    logits_mse_loss,
    masked_lm_loss,
    mlm_distillation_loss,
    pkd_patient_loss,
    pkd_teacher_layers,
    qa_distillation_loss,
    qa_task_loss,
    soft_cross_entropy,
    soft_target_kl_loss,
    tinybert_attention_loss,
    tinybert_embedding_loss,
    tinybert_hidden_loss,
)
from pipeline.distillation.students import init_student_from_teacher, student_config_from_teacher

STUDENT_LOGITS = [[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]]
TEACHER_LOGITS = [[2.0, 1.0, 0.0], [1.0, 1.0, 1.0]]


def softmax(row: list[float]) -> list[float]:
    exps = [math.exp(x) for x in row]
    return [e / sum(exps) for e in exps]


def kl(p: list[float], q: list[float]) -> float:
    """KL(p ‖ q) written out."""
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)


def hand_soft_target_kl(student_rows, teacher_rows, temperature) -> float:
    per_row = [
        kl(softmax([t / temperature for t in t_row]), softmax([s / temperature for s in s_row]))
        for s_row, t_row in zip(student_rows, teacher_rows)
    ]
    return sum(per_row) / len(per_row) * temperature**2


from tests.stage_fixtures import tiny_bert_config  # noqa: E402  (shared tiny BERT shape)


# ---------------------------------------------------------------- prediction-layer losses


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_soft_target_kl_matches_hand_computation(temperature):
    loss = soft_target_kl_loss(torch.tensor(STUDENT_LOGITS), torch.tensor(TEACHER_LOGITS), temperature)
    assert loss.item() == pytest.approx(hand_soft_target_kl(STUDENT_LOGITS, TEACHER_LOGITS, temperature), rel=1e-5)


def test_soft_target_kl_is_scaled_by_temperature_squared():
    student, teacher = torch.tensor(STUDENT_LOGITS), torch.tensor(TEACHER_LOGITS)
    unscaled_kl_at_t2 = hand_soft_target_kl(STUDENT_LOGITS, TEACHER_LOGITS, 2.0) / 4.0
    assert soft_target_kl_loss(student, teacher, 2.0).item() == pytest.approx(4.0 * unscaled_kl_at_t2, rel=1e-5)


def test_soft_target_kl_is_zero_when_student_equals_teacher():
    logits = torch.tensor(TEACHER_LOGITS)
    assert soft_target_kl_loss(logits, logits, 2.0).item() == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_temperature_must_be_positive(temperature):
    logits = torch.tensor(TEACHER_LOGITS)
    with pytest.raises(ValueError, match="temperature"):
        soft_target_kl_loss(logits, logits, temperature)
    with pytest.raises(ValueError, match="temperature"):
        soft_cross_entropy(logits, logits, temperature)


def test_soft_cross_entropy_matches_hand_computation():
    temperature = 2.0
    expected = 0.0
    for s_row, t_row in zip(STUDENT_LOGITS, TEACHER_LOGITS):
        p = softmax([t / temperature for t in t_row])
        q = softmax([s / temperature for s in s_row])
        expected += -sum(pi * math.log(qi) for pi, qi in zip(p, q))
    expected /= 2
    loss = soft_cross_entropy(torch.tensor(STUDENT_LOGITS), torch.tensor(TEACHER_LOGITS), temperature)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_masked_lm_loss_is_cross_entropy_of_the_true_tokens():
    loss = masked_lm_loss(torch.tensor(STUDENT_LOGITS), torch.tensor([1, 2]))
    expected = -(math.log(softmax(STUDENT_LOGITS[0])[1]) + math.log(softmax(STUDENT_LOGITS[1])[2])) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_logits_mse_sums_over_vocabulary_and_averages_over_rows():
    squared = sum((s - t) ** 2 for s_row, t_row in zip(STUDENT_LOGITS, TEACHER_LOGITS) for s, t in zip(s_row, t_row))
    loss = logits_mse_loss(torch.tensor(STUDENT_LOGITS), torch.tensor(TEACHER_LOGITS))
    assert loss.item() == pytest.approx(squared / 2, rel=1e-6)


def test_empty_selection_gives_zero_not_nan():
    empty = torch.zeros(0, 3, requires_grad=True)
    assert soft_target_kl_loss(empty, empty.detach(), 2.0).item() == 0.0
    assert masked_lm_loss(empty, torch.zeros(0, dtype=torch.long)).item() == 0.0


# ---------------------------------------------------------------- hidden-state losses


def test_hidden_cosine_loss_averages_one_minus_cosine_over_real_tokens():
    student = torch.tensor([[[1.0, 0.0], [2.0, 2.0], [5.0, -7.0]]])
    teacher = torch.tensor([[[0.0, 1.0], [1.0, 1.0], [1.0, 1.0]]])
    attention_mask = torch.tensor([[1, 1, 0]])  # the last position is padding
    # Orthogonal → 1 − 0 = 1; parallel → 1 − 1 = 0; mean = 0.5.
    assert hidden_cosine_loss(student, teacher, attention_mask).item() == pytest.approx(0.5, abs=1e-6)


# ---------------------------------------------------------------- DistilBERT triple loss


def mlm_batch():
    """One sequence of 4 positions over a vocabulary of 3: position 3 is padding, position 1 is masked."""
    generator = torch.Generator().manual_seed(0)
    student_logits = torch.randn(1, 4, 3, generator=generator, requires_grad=True)
    teacher_logits = torch.randn(1, 4, 3, generator=generator)
    student_hidden = torch.randn(1, 4, 2, generator=generator, requires_grad=True)
    teacher_hidden = torch.randn(1, 4, 2, generator=generator)
    labels = torch.tensor([[-100, 2, -100, -100]])
    attention_mask = torch.tensor([[1, 1, 1, 0]])
    return student_logits, teacher_logits, student_hidden, teacher_hidden, labels, attention_mask


def test_mlm_distillation_loss_combines_the_weighted_terms():
    student_logits, teacher_logits, student_hidden, teacher_hidden, labels, attention_mask = mlm_batch()
    weights = {"ce": 5.0, "mlm": 2.0, "cos": 1.0}
    terms = mlm_distillation_loss(
        student_logits, teacher_logits, student_hidden, teacher_hidden, labels, attention_mask, weights, 2.0
    )

    real = [0, 1, 2]
    expected_ce = hand_soft_target_kl(student_logits[0, real].tolist(), teacher_logits[0, real].tolist(), 2.0)
    expected_mlm = -math.log(softmax(student_logits[0, 1].tolist())[2])
    expected_cos = hidden_cosine_loss(student_hidden, teacher_hidden, attention_mask).item()
    assert set(terms) == {"loss", "ce", "mlm", "cos"}  # no "mse" while its weight is 0
    assert terms["ce"].item() == pytest.approx(expected_ce, rel=1e-5)
    assert terms["mlm"].item() == pytest.approx(expected_mlm, rel=1e-5)
    assert terms["cos"].item() == pytest.approx(expected_cos, rel=1e-6)
    expected_total = 5.0 * expected_ce + 2.0 * expected_mlm + 1.0 * expected_cos
    assert terms["loss"].item() == pytest.approx(expected_total, rel=1e-5)


def test_padding_logits_do_not_change_the_mlm_distillation_loss():
    student_logits, teacher_logits, student_hidden, teacher_hidden, labels, attention_mask = mlm_batch()
    weights = {"ce": 1.0, "mlm": 1.0, "cos": 1.0, "mse": 1.0}
    before = mlm_distillation_loss(
        student_logits, teacher_logits, student_hidden, teacher_hidden, labels, attention_mask, weights, 2.0
    )
    with torch.no_grad():
        teacher_logits[0, 3] = torch.tensor([100.0, -100.0, 0.0])
        teacher_hidden[0, 3] = torch.tensor([-50.0, 9.0])
    after = mlm_distillation_loss(
        student_logits, teacher_logits, student_hidden, teacher_hidden, labels, attention_mask, weights, 2.0
    )
    for name in ("loss", "ce", "mlm", "cos", "mse"):
        assert after[name].item() == pytest.approx(before[name].item(), rel=1e-6), name


def test_restrict_ce_to_mask_uses_only_masked_positions():
    student_logits, teacher_logits, student_hidden, teacher_hidden, labels, attention_mask = mlm_batch()
    arguments = (student_logits, teacher_logits, student_hidden, teacher_hidden, labels, attention_mask)
    everywhere = mlm_distillation_loss(*arguments, {"ce": 1.0}, 2.0, restrict_ce_to_mask=False)
    masked_only = mlm_distillation_loss(*arguments, {"ce": 1.0}, 2.0, restrict_ce_to_mask=True)

    expected = hand_soft_target_kl([student_logits[0, 1].tolist()], [teacher_logits[0, 1].tolist()], 2.0)
    assert masked_only["ce"].item() == pytest.approx(expected, rel=1e-5)
    assert masked_only["ce"].item() != pytest.approx(everywhere["ce"].item(), rel=1e-3)
    assert masked_only["mlm"].item() == pytest.approx(everywhere["mlm"].item(), rel=1e-6)


def test_mse_term_appears_when_weighted():
    student_logits, teacher_logits, student_hidden, teacher_hidden, labels, attention_mask = mlm_batch()
    terms = mlm_distillation_loss(
        student_logits, teacher_logits, student_hidden, teacher_hidden, labels, attention_mask, {"mse": 1.0}, 2.0
    )
    real = slice(0, 3)
    expected = ((student_logits[0, real] - teacher_logits[0, real]) ** 2).sum().item() / 3
    assert terms["mse"].item() == pytest.approx(expected, rel=1e-5)
    assert terms["loss"].item() == pytest.approx(expected, rel=1e-5)


def test_unknown_weight_is_rejected():
    with pytest.raises(ValueError, match="alpha_ce"):
        mlm_distillation_loss(*mlm_batch(), {"alpha_ce": 1.0}, 2.0)


def test_gradients_reach_the_student_and_never_the_teacher_tensors():
    student_logits, teacher_logits, student_hidden, teacher_hidden, labels, attention_mask = mlm_batch()
    teacher_logits.requires_grad_(True)  # even a teacher tensor that could take gradients gets none
    teacher_hidden.requires_grad_(True)
    weights = {"ce": 5.0, "mlm": 2.0, "cos": 1.0, "mse": 1.0}
    terms = mlm_distillation_loss(
        student_logits, teacher_logits, student_hidden, teacher_hidden, labels, attention_mask, weights, 2.0
    )
    terms["loss"].backward()
    assert teacher_logits.grad is None and teacher_hidden.grad is None
    assert student_logits.grad.abs().sum() > 0 and student_hidden.grad.abs().sum() > 0
    assert torch.all(student_logits.grad[0, 3] == 0)  # padding gets no gradient


def test_distilling_a_real_model_leaves_the_teacher_without_gradients():
    torch.manual_seed(0)
    teacher = BertForMaskedLM(tiny_bert_config()).eval()
    student = init_student_from_teacher(teacher, student_config_from_teacher(teacher.config, 2), [0, 3])
    input_ids = torch.tensor([[2, 7, 4, 3, 0]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 0]])
    labels = torch.tensor([[-100, 9, -100, -100, -100]])

    with torch.no_grad():
        teacher_out = teacher(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    student_out = student(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    terms = mlm_distillation_loss(
        student_out.logits,
        teacher_out.logits,
        student_out.hidden_states[-1],
        teacher_out.hidden_states[-1],
        labels,
        attention_mask,
        {"ce": 5.0, "mlm": 2.0, "cos": 1.0},
        2.0,
    )
    terms["loss"].backward()
    assert all(parameter.grad is None for parameter in teacher.parameters())
    assert student.distilbert.transformer.layer[0].attention.q_lin.weight.grad is not None


# ---------------------------------------------------------------- question answering


def test_qa_distillation_ignores_positions_outside_the_context():
    # Window of 4 tokens: 0 is the question, 1-2 the context, 3 padding.
    context_mask = torch.tensor([[False, True, True, False]])
    student_start = torch.tensor([[9.0, 1.0, 2.0, -3.0]], requires_grad=True)
    student_end = torch.tensor([[0.0, 0.5, -0.5, 7.0]], requires_grad=True)
    teacher_start = torch.tensor([[-4.0, 2.0, 0.0, 6.0]])
    teacher_end = torch.tensor([[3.0, 1.0, 1.0, 0.0]])

    loss = qa_distillation_loss(student_start, student_end, teacher_start, teacher_end, context_mask, 2.0)

    start = hand_soft_target_kl([[1.0, 2.0]], [[2.0, 0.0]], 2.0)
    end = hand_soft_target_kl([[0.5, -0.5]], [[1.0, 1.0]], 2.0)
    assert loss.item() == pytest.approx((start + end) / 2, rel=1e-5)
    loss.backward()
    assert student_start.grad[0, 0] == 0 and student_start.grad[0, 3] == 0
    assert student_start.grad[0, 1] != 0


def test_qa_distillation_averages_over_windows():
    context_mask = torch.tensor([[True, True], [True, True]])
    student = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    teacher = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    loss = qa_distillation_loss(student, student, teacher, teacher, context_mask, 1.0)
    # The second window matches exactly, so the mean is half the first window's KL.
    assert loss.item() == pytest.approx(hand_soft_target_kl([[1.0, 0.0]], [[0.0, 1.0]], 1.0) / 2, rel=1e-5)


def test_qa_task_loss_averages_start_and_end_cross_entropy():
    start_logits = torch.tensor([[1.0, 2.0, 0.0]])
    end_logits = torch.tensor([[0.0, 0.0, 3.0]])
    loss = qa_task_loss(start_logits, end_logits, torch.tensor([1]), torch.tensor([2]))
    expected = (-math.log(softmax([1.0, 2.0, 0.0])[1]) - math.log(softmax([0.0, 0.0, 3.0])[2])) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)


# ---------------------------------------------------------------- PKD


def test_pkd_teacher_layers_follow_the_paper():
    assert pkd_teacher_layers(12, 6, "skip") == [1, 3, 5, 7, 9]  # paper's {2,4,6,8,10}, 1-based
    assert pkd_teacher_layers(12, 6, "last") == [6, 7, 8, 9, 10]  # paper's {7,...,11}, 1-based
    assert pkd_teacher_layers(12, 3, "skip") == [3, 7]  # paper's {4, 8}
    assert pkd_teacher_layers(12, 1, "last") == []  # a 1-layer student is taught by predictions only
    with pytest.raises(ValueError, match=r"^pkd\.teacher_layers:"):
        pkd_teacher_layers(4, 6, "skip")
    with pytest.raises(ValueError, match="skip"):
        pkd_teacher_layers(12, 6, "middle")


def test_pkd_patient_loss_compares_normalised_cls_vectors():
    student = [torch.tensor([[3.0, 4.0]]), torch.tensor([[1.0, 0.0]])]
    teacher = [torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.0]])]
    # Layer 1: (0.6, 0.8) vs (1, 0) → 0.4² + 0.8² = 0.8. Layer 2: same direction → 0.
    # Mean over 1 example × 2 layers × 2 hidden units = 0.8 / 4.
    assert pkd_patient_loss(student, teacher).item() == pytest.approx(0.2, rel=1e-6)


def test_pkd_patient_loss_is_the_reference_mean_over_batch_layers_and_hidden():
    # The reference (intersun/PKD patience_loss) is F.mse_loss of the normalised [B, layers, H] states:
    # one mean over every element. Written out with loops over B = 2, layers = 3, H = 4.
    generator = torch.Generator().manual_seed(1)
    student = [torch.randn(2, 4, generator=generator) for _ in range(3)]
    teacher = [torch.randn(2, 4, generator=generator) for _ in range(3)]
    total, count = 0.0, 0
    for student_layer, teacher_layer in zip(student, teacher):
        for s_row, t_row in zip(student_layer.tolist(), teacher_layer.tolist()):
            s_norm, t_norm = math.sqrt(sum(x * x for x in s_row)), math.sqrt(sum(x * x for x in t_row))
            for s, t in zip(s_row, t_row):
                total += (s / s_norm - t / t_norm) ** 2
                count += 1
    assert count == 2 * 3 * 4
    assert pkd_patient_loss(student, teacher).item() == pytest.approx(total / count, rel=1e-5)
    # β keeps the paper's meaning: the value does not grow with the width or the number of layers.
    wide = [torch.cat([layer, layer], dim=-1) / math.sqrt(2) for layer in student]
    wide_teacher = [torch.cat([layer, layer], dim=-1) / math.sqrt(2) for layer in teacher]
    assert pkd_patient_loss(wide, wide_teacher).item() == pytest.approx(total / count / 2, rel=1e-5)
    repeated_layers = pkd_patient_loss(student + student, teacher + teacher)  # 6 layer pairs, same errors
    assert repeated_layers.item() == pytest.approx(total / count, rel=1e-5)


def test_pkd_patient_loss_ignores_vector_length():
    generator = torch.Generator().manual_seed(0)
    student = [torch.randn(4, 8, generator=generator)]
    teacher = [torch.randn(4, 8, generator=generator)]
    scaled = [student[0] * torch.tensor([[0.1], [3.0], [7.0], [1.0]])]
    assert pkd_patient_loss(scaled, teacher).item() == pytest.approx(pkd_patient_loss(student, teacher).item(), rel=1e-5)


# ---------------------------------------------------------------- TinyBERT


def test_tinybert_attention_loss_excludes_padded_queries_and_keys():
    attention_mask = torch.tensor([[1, 1, 0]])
    student = torch.zeros(1, 1, 3, 3)
    teacher = torch.zeros(1, 1, 3, 3)
    teacher[0, 0, :2, :2] = torch.tensor([[1.0, 2.0], [0.0, 3.0]])
    teacher[0, 0, 2, :] = 50.0  # padded query row
    teacher[0, 0, :, 2] = -50.0  # padded key column
    # Valid entries: the top-left 2x2 block; mean squared error = (1 + 4 + 0 + 9) / 4 = 3.5, two layers.
    loss = tinybert_attention_loss([student, student], [teacher, teacher], attention_mask)
    assert loss.item() == pytest.approx(7.0)


def test_tinybert_attention_loss_requires_equal_heads():
    with pytest.raises(ValueError, match="heads"):
        tinybert_attention_loss([torch.zeros(1, 2, 3, 3)], [torch.zeros(1, 4, 3, 3)], torch.ones(1, 3))


def test_tinybert_hidden_loss_projects_the_student_and_skips_padding():
    student = torch.tensor([[[1.0, 2.0], [9.0, 9.0]]])
    teacher = torch.tensor([[[2.0, 4.0, 1.0], [0.0, 0.0, 0.0]]])
    attention_mask = torch.tensor([[1, 0]])
    projection = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        projection.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]]))  # (x, y) → (2x, 2y, 0)
    # Projected (2, 4, 0) vs (2, 4, 1): squared errors 0, 0, 1 → mean 1/3.
    loss = tinybert_hidden_loss([student], [teacher], projection, attention_mask)
    assert loss.item() == pytest.approx(1 / 3, rel=1e-6)
    assert tinybert_embedding_loss(student, teacher, projection, attention_mask).item() == pytest.approx(1 / 3)


def test_tinybert_hidden_loss_without_projection_needs_equal_widths():
    student, teacher = torch.zeros(1, 2, 4), torch.ones(1, 2, 8)
    with pytest.raises(ValueError, match="pass a projection"):
        tinybert_hidden_loss([student], [teacher], None, torch.ones(1, 2))
    same_width = tinybert_hidden_loss([torch.zeros(1, 2, 8)], [teacher], None, torch.ones(1, 2))
    assert same_width.item() == pytest.approx(1.0)


# ---------------------------------------------------------------- attention score recorder


def padded_batch():
    input_ids = torch.tensor([[2, 7, 11, 3, 0], [2, 5, 3, 0, 0]])
    return input_ids, (input_ids != 0).long()


def tiny_distilbert() -> DistilBertForMaskedLM:
    config = student_config_from_teacher(tiny_bert_config(), n_layers=2)
    config._attn_implementation = "eager"
    return DistilBertForMaskedLM(config)


@pytest.mark.parametrize(
    "build_model",
    [
        lambda: BertForMaskedLM(tiny_bert_config(attn_implementation="eager")),
        tiny_distilbert,
    ],
    ids=["bert", "distilbert"],
)
def test_recorded_scores_give_the_models_own_attention_probabilities(build_model):
    torch.manual_seed(0)
    model = build_model().eval()
    input_ids, attention_mask = padded_batch()

    with AttentionScoreRecorder(model) as recorder:
        attentions = model(input_ids, attention_mask=attention_mask, output_attentions=True).attentions
    scores = recorder.scores

    assert len(scores) == len(attentions)
    padded_key = attention_mask[:, None, None, :] == 0
    for layer_scores, layer_attention in zip(scores, attentions):
        assert layer_scores.shape == (2, 2, 5, 5)
        probabilities = layer_scores.masked_fill(padded_key, torch.finfo(layer_scores.dtype).min).softmax(dim=-1)
        assert torch.allclose(probabilities, layer_attention, atol=1e-6)


def test_recorder_removes_its_hooks_and_keeps_the_graph():
    model = tiny_distilbert()
    input_ids, attention_mask = padded_batch()
    with AttentionScoreRecorder(model) as recorder:
        model(input_ids, attention_mask=attention_mask)
    assert recorder.scores[0].requires_grad  # a student can learn from its scores
    assert all(not module._forward_hooks for module in model.modules())


# ---------------------------------------------------------------- edges: empty selections, shapes, messages


def test_every_loss_gives_a_differentiable_zero_on_an_empty_selection():
    rows = torch.zeros(0, 3, requires_grad=True)
    for loss in (soft_target_kl_loss(rows, rows.detach(), 2.0), soft_cross_entropy(rows, rows.detach(), 2.0),
                 masked_lm_loss(rows, torch.zeros(0, dtype=torch.long)), logits_mse_loss(rows, rows.detach())):
        assert loss.item() == 0.0
        loss.backward()
    # All padding: the selection is empty although the tensors are not; still 0, and no gradient anywhere.
    hidden = torch.randn(2, 3, 4, requires_grad=True)
    padding_only = torch.zeros(2, 3)
    cosine = hidden_cosine_loss(hidden, torch.randn(2, 3, 4), padding_only)
    tinybert = tinybert_hidden_loss([hidden, hidden], [torch.randn(2, 3, 4)] * 2, None, padding_only)
    for loss in (cosine, tinybert):
        assert loss.item() == 0.0
        loss.backward()
    assert torch.all(hidden.grad == 0)


def test_single_row_losses_are_not_mistaken_for_empty_ones():
    student, teacher = torch.tensor([STUDENT_LOGITS[0]]), torch.tensor([TEACHER_LOGITS[0]])
    assert soft_cross_entropy(student, teacher, 1.0).item() > 0
    assert logits_mse_loss(student, teacher).item() == pytest.approx(sum((s - t) ** 2 for s, t in zip(STUDENT_LOGITS[0], TEACHER_LOGITS[0])))
    one_token = torch.tensor([[1]])
    cosine = hidden_cosine_loss(torch.tensor([[[1.0, 0.0]]]), torch.tensor([[[0.0, 1.0]]]), one_token)
    assert cosine.item() == pytest.approx(1.0)


def test_soft_cross_entropy_takes_rows_from_all_leading_dimensions_and_defaults_to_t_1():
    generator = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 3, 5, generator=generator), torch.randn(2, 3, 5, generator=generator)
    expected = sum(
        -sum(p * math.log(q) for p, q in zip(softmax(t_row), softmax(s_row)))
        for s_row, t_row in zip(student.reshape(6, 5).tolist(), teacher.reshape(6, 5).tolist())
    ) / 6
    assert soft_cross_entropy(student, teacher).item() == pytest.approx(expected, rel=1e-5)
    assert soft_cross_entropy(student, teacher, 1.0).item() == pytest.approx(expected, rel=1e-5)


def test_qa_task_loss_ignores_answers_outside_the_window_and_keeps_cls():
    start_logits = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.0, 1.5]])
    end_logits = torch.tensor([[0.5, 0.0, 3.0], [2.0, 1.0, 0.0]])
    # Window 2's labels lie past the window (position 7 > S = 3): it is ignored, not clamped onto a token.
    loss = qa_task_loss(start_logits, end_logits, torch.tensor([0, 7]), torch.tensor([2, 7]))
    expected = (-math.log(softmax([1.0, 2.0, 0.0])[0]) - math.log(softmax([0.5, 0.0, 3.0])[2])) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # A negative label is clamped onto [CLS] (position 0), the no-answer label.
    negative = qa_task_loss(start_logits[:1], end_logits[:1], torch.tensor([-3]), torch.tensor([-1]))
    assert negative.item() == pytest.approx((-math.log(softmax([1.0, 2.0, 0.0])[0])
                                             - math.log(softmax([0.5, 0.0, 3.0])[0])) / 2, rel=1e-6)


def test_mlm_loss_weights_may_be_zero_or_fractional_but_not_negative():
    batch = mlm_batch()
    terms = mlm_distillation_loss(*batch, {"ce": 0.0, "mlm": 0.5, "cos": 0.0}, 2.0)
    assert terms["loss"].item() == pytest.approx(0.5 * terms["mlm"].item(), rel=1e-6)
    with pytest.raises(ValueError, match=r"^loss weights must be >= 0, got \{'cos': -1\.0\}$"):
        mlm_distillation_loss(*batch, {"cos": -1.0}, 2.0)
    with pytest.raises(ValueError, match=r"^unknown loss weight\(s\) \['alpha_ce'\]; valid terms are ce, mlm, cos, mse$"):
        mlm_distillation_loss(*batch, {"alpha_ce": 1.0}, 2.0)


def test_tinybert_attention_loss_averages_over_heads_and_valid_entries():
    student = torch.tensor([[[[1.0]], [[2.0]]]])  # [B=1, heads=2, S=1, S=1]
    teacher = torch.tensor([[[[-1.0]], [[0.0]]]])
    # (1 - (-1))² = 4 and (2 - 0)² = 4 over 2 valid entries (one per head): 4.
    assert tinybert_attention_loss([student], [teacher], torch.ones(1, 1)).item() == pytest.approx(4.0)
    one_head = tinybert_attention_loss([student[:, :1]], [teacher[:, :1]], torch.ones(1, 1))
    assert one_head.item() == pytest.approx(4.0)  # a single valid entry is divided by 1
    with pytest.raises(ValueError, match=r"^tinybert_attention_loss: student has 2 attention heads and the teacher 4;"):
        tinybert_attention_loss([torch.zeros(1, 2, 3, 3)], [torch.zeros(1, 4, 3, 3)], torch.ones(1, 3))


def test_tinybert_hidden_loss_sums_over_layers():
    mask = torch.ones(1, 1)
    first = tinybert_hidden_loss([torch.ones(1, 1, 2)], [torch.zeros(1, 1, 2)], None, mask)
    second = tinybert_hidden_loss([torch.full((1, 1, 2), 3.0)], [torch.zeros(1, 1, 2)], None, mask)
    both = tinybert_hidden_loss([torch.ones(1, 1, 2), torch.full((1, 1, 2), 3.0)], [torch.zeros(1, 1, 2)] * 2, None, mask)
    assert (first.item(), second.item()) == (1.0, 9.0) and both.item() == 10.0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: hidden_cosine_loss(torch.zeros(1, 2, 4), torch.zeros(1, 2, 8), torch.ones(1, 2)),
         r"^hidden_cosine_loss: student width 4 differs from the teacher's 8$"),
        (lambda: pkd_patient_loss([torch.zeros(2, 4)], [torch.zeros(2, 8)]),
         r"^pkd_patient_loss: student width 4 differs from the teacher's 8$"),
        (lambda: pkd_patient_loss([torch.zeros(2, 4)] * 2, [torch.zeros(2, 4)]),
         r"^pkd_patient_loss: 2 student layers but 1 teacher layers$"),
        (lambda: pkd_patient_loss([], []), r"^pkd_patient_loss: no layers given$"),
        (lambda: tinybert_attention_loss([], [], torch.ones(1, 1)), r"^tinybert_attention_loss: no layers given$"),
        (lambda: tinybert_hidden_loss([torch.zeros(1, 1, 2)], [], None, torch.ones(1, 1)),
         r"^tinybert_hidden_loss: 1 student layers but 0 teacher layers$"),
        (lambda: tinybert_hidden_loss([torch.zeros(1, 2, 4)], [torch.zeros(1, 2, 8)], None, torch.ones(1, 2)),
         r"^student hidden size 4 differs from the teacher's 8; pass a projection such as nn\.Linear\(4, 8\)$"),
        (lambda: tinybert_hidden_loss([torch.zeros(1, 2, 4)], [torch.zeros(1, 2, 8)], nn.Linear(4, 6), torch.ones(1, 2)),
         r"^projection outputs width 6 but the teacher hidden size is 8$"),
        (lambda: AttentionScoreRecorder(nn.Linear(2, 2)), r"^Linear has no BERT or DistilBERT self-attention layers"),
    ],
)
def test_shape_errors_name_the_loss_and_the_sizes(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_recorder_can_be_used_again():
    model = tiny_distilbert()
    input_ids, attention_mask = padded_batch()
    recorder = AttentionScoreRecorder(model)
    for _ in range(2):
        with recorder:
            model(input_ids, attention_mask=attention_mask)
        assert len(recorder.scores) == 2 and all(not m._forward_hooks for m in model.modules())


def test_the_teacher_trains_on_the_students_task_loss():
    # teacher_finetune trains on BertForQuestionAnswering's own loss; the students' task term is qa_task_loss:
    # the teacher-student comparison holds only while the two are one loss (answers past the window included).
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(0)
    model = BertForQuestionAnswering(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=32)).eval()
    input_ids = torch.randint(5, 50, (3, 9))
    starts, ends = torch.tensor([0, 4, 12]), torch.tensor([0, 6, 12])  # no answer, an answer, past the window
    out = model(input_ids=input_ids, start_positions=starts, end_positions=ends)
    expected = qa_task_loss(out.start_logits, out.end_logits, starts, ends)
    assert torch.allclose(out.loss, expected, rtol=1e-6)


class DataDependentOps(TorchDispatchMode):
    """Records the operations that read a tensor's values on the host: on a GPU each one waits for the device."""

    READS = {"aten.nonzero", "aten._local_scalar_dense", "aten.masked_select", "aten.is_nonzero"}

    def __init__(self):
        super().__init__()
        self.found = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        boolean_index = name in ("aten.index", "aten.index_put") and any(
            isinstance(index, torch.Tensor) and index.dtype == torch.bool for index in (args[1] or []))
        if name in self.READS or boolean_index:
            self.found.append(name)
        return func(*args, **(kwargs or {}))


def test_tinybert_losses_never_read_the_mask_on_the_host():
    # The intermediate-layer losses run every step of distill_squad's first phase: forward and backward must not
    # count the padding mask on the host (a boolean index does), and the value is the MSE over real tokens.
    generator = torch.Generator().manual_seed(0)
    attention_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    student = torch.randn(2, 4, 3, generator=generator, requires_grad=True)
    teacher = torch.randn(2, 4, 5, generator=generator)
    projection = nn.Linear(3, 5)
    scores = torch.randn(2, 2, 4, 4, generator=generator, requires_grad=True)
    with DataDependentOps() as recorder:
        hidden = tinybert_hidden_loss([student, student], [teacher, teacher], projection, attention_mask)
        embedding = tinybert_embedding_loss(student, teacher, projection, attention_mask)
        attention = tinybert_attention_loss([scores], [torch.randn(2, 2, 4, 4, generator=generator)], attention_mask)
        (hidden + embedding + attention).backward()
    assert recorder.found == []
    keep = attention_mask.bool()
    expected = nn.functional.mse_loss(projection(student[keep]), teacher[keep])
    assert torch.allclose(hidden, 2 * expected) and torch.allclose(embedding, expected)
