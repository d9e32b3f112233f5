"""The chunked vocabulary-logit loss against the whole-batch DistilBERT pretraining loss it replaces.

Tolerances, fp32: rtol 1e-5 and atol 1e-6 on every term and gradient (the two compute the same sums in a different
order). fp64: the analytic gradient passes torch.autograd.gradcheck. bf16 autocast: the terms within rtol 2e-3 of fp32, and
the gradients no further from the fp32 ones (relative norm error < 1e-2) than today's path under autocast.
"""

import pytest
import torch
import torch.nn.functional as F

from pipeline.chunked_lm_loss import LmHeadLossWeights, VocabProjection, chunked_lm_head_losses
from pipeline.losses import IGNORED_LABEL, mlm_distillation_terms, mlm_distillation_terms_in_chunks
from tests.test_losses import DataDependentOps

N_TOKENS, HIDDEN, TEACHER_HIDDEN, VOCAB = 40, 16, 24, 300
MASKED_IN_TOKENS = torch.tensor([0, 3, 4, 11, 17, 18, 25, 38, 39])  # includes the first and last rows
WEIGHTS = {"ce": 5.0, "mlm": 2.0, "cos": 1.0}  # the DistilBERT reference weights (losses.REFERENCE_MLM_WEIGHTS)
FP32 = {"rtol": 1e-5, "atol": 1e-6}


def batch_rows(dtype=torch.float32, seed=0):
    """A batch as the stage sees it: token rows entering each model's vocabulary projection, the projections, the
    masked rows among the tokens and their labels. The student's tensors are leaves that record gradients."""
    generator = torch.Generator().manual_seed(seed)

    def random(*shape, scale=1.0, grad=False):
        return (torch.randn(*shape, generator=generator, dtype=dtype) * scale).requires_grad_(grad)

    return {
        "student_inputs": random(N_TOKENS, HIDDEN, grad=True),
        "student_weight": random(VOCAB, HIDDEN, scale=0.5, grad=True),
        "student_bias": random(VOCAB, grad=True),
        "teacher_inputs": random(N_TOKENS, TEACHER_HIDDEN),
        "teacher_weight": random(VOCAB, TEACHER_HIDDEN, scale=0.5),
        "teacher_bias": random(VOCAB),
        "teacher_token_hidden": random(N_TOKENS, HIDDEN),
        "masked_in_tokens": MASKED_IN_TOKENS,
        "masked_labels": torch.randint(0, VOCAB, (len(MASKED_IN_TOKENS),), generator=generator),
    }


def ce_rows_and_masked_rows(batch, restrict_ce_to_mask):
    """Which token rows L_ce reads and where the masked ones sit among them, as the stage selects them."""
    if restrict_ce_to_mask:
        return batch["masked_in_tokens"], None
    return torch.arange(N_TOKENS), batch["masked_in_tokens"]


def student_leaves(batch):
    return [batch["student_inputs"], batch["student_weight"], batch["student_bias"]]


def whole_batch_terms(batch, restrict_ce_to_mask, temperature, weights=WEIGHTS):
    """Today's path: the [N, V] logits of every L_ce row, then losses.mlm_distillation_terms."""
    ce_rows, masked_rows = ce_rows_and_masked_rows(batch, restrict_ce_to_mask)
    student_logits = F.linear(batch["student_inputs"][ce_rows], batch["student_weight"], batch["student_bias"])
    teacher_logits = F.linear(batch["teacher_inputs"][ce_rows], batch["teacher_weight"], batch["teacher_bias"])
    return mlm_distillation_terms(
        student_logits, teacher_logits, masked_rows, batch["masked_labels"],
        batch["student_inputs"], batch["teacher_token_hidden"], weights, temperature,
    )


def chunked_terms(batch, restrict_ce_to_mask, temperature, chunk_rows, weights=WEIGHTS):
    ce_rows, masked_rows = ce_rows_and_masked_rows(batch, restrict_ce_to_mask)
    student = VocabProjection(batch["student_inputs"][ce_rows], batch["student_weight"], batch["student_bias"])
    teacher = VocabProjection(batch["teacher_inputs"][ce_rows], batch["teacher_weight"], batch["teacher_bias"])
    return mlm_distillation_terms_in_chunks(
        student, teacher, masked_rows, batch["masked_labels"],
        batch["student_inputs"], batch["teacher_token_hidden"], weights, temperature, chunk_rows,
    )


def values_and_gradients(compute_terms, batch):
    terms = compute_terms(batch)
    gradients = torch.autograd.grad(terms["loss"], student_leaves(batch))
    return {name: value.detach() for name, value in terms.items()}, gradients


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
@pytest.mark.parametrize("restrict_ce_to_mask", [False, True])
def test_chunked_terms_and_gradients_equal_the_whole_batch_loss(restrict_ce_to_mask, temperature):
    batch = batch_rows()
    expected_terms, expected_grads = values_and_gradients(
        lambda b: whole_batch_terms(b, restrict_ce_to_mask, temperature), batch)
    terms, grads = values_and_gradients(
        lambda b: chunked_terms(b, restrict_ce_to_mask, temperature, chunk_rows=4), batch)

    assert terms.keys() == expected_terms.keys() == {"loss", "ce", "mlm", "cos"}
    for name, value in expected_terms.items():
        torch.testing.assert_close(terms[name], value, **FP32, msg=name)
    for name, grad, expected in zip(["inputs", "weight", "bias"], grads, expected_grads):
        assert expected.abs().max() > 0, name
        torch.testing.assert_close(grad, expected, **FP32, msg=name)


# Summed over the vocabulary, the logit MSE would dwarf the other terms at weight 1.
@pytest.mark.parametrize("weights", [{"ce": 1.0}, {"mlm": 1.0}, {"mse": 0.01}, {**WEIGHTS, "mse": 0.01}])
@pytest.mark.parametrize("restrict_ce_to_mask", [False, True])
def test_each_term_alone_and_the_logit_mse_equal_the_whole_batch_loss(restrict_ce_to_mask, weights):
    batch = batch_rows()
    expected_terms, expected_grads = values_and_gradients(
        lambda b: whole_batch_terms(b, restrict_ce_to_mask, 2.0, weights), batch)
    terms, grads = values_and_gradients(
        lambda b: chunked_terms(b, restrict_ce_to_mask, 2.0, chunk_rows=4, weights=weights), batch)
    assert terms.keys() == expected_terms.keys()
    for name, value in expected_terms.items():
        torch.testing.assert_close(terms[name], value, **FP32, msg=name)
    for grad, expected in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected, **FP32)


@pytest.mark.parametrize("chunk_rows", [1, 3, 7, 39, 40, 41, 1000])
def test_the_result_does_not_depend_on_the_chunk_size(chunk_rows):
    # 40 rows: chunk sizes that divide it, that leave a short last chunk, and one larger than the batch.
    batch = batch_rows()
    reference_terms, reference_grads = values_and_gradients(lambda b: chunked_terms(b, False, 2.0, 40), batch)
    terms, grads = values_and_gradients(lambda b: chunked_terms(b, False, 2.0, chunk_rows), batch)
    for name, value in reference_terms.items():
        torch.testing.assert_close(terms[name], value, **FP32, msg=name)
    for grad, expected in zip(grads, reference_grads):
        torch.testing.assert_close(grad, expected, **FP32)


def test_the_analytic_gradient_passes_gradcheck():
    # Finite differences in fp64 on a very small head (gradcheck perturbs every input element).
    generator = torch.Generator().manual_seed(0)
    inputs, weight, bias = (torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)
                            for shape in [(6, 3), (11, 3), (11,)])
    teacher = VocabProjection(*(torch.randn(*shape, generator=generator, dtype=torch.float64)
                                for shape in [(6, 4), (11, 4), (11,)]))
    row_labels = torch.tensor([IGNORED_LABEL, 3, IGNORED_LABEL, 0, 10, IGNORED_LABEL])

    def weighted_loss(inputs, weight, bias):
        return chunked_lm_head_losses(VocabProjection(inputs, weight, bias), teacher, row_labels, 2.0,
                                      LmHeadLossWeights(ce=5.0, mlm=2.0, mse=0.5), chunk_rows=4)["loss"]

    assert torch.autograd.gradcheck(weighted_loss, (inputs, weight, bias))


def test_the_gradient_follows_the_incoming_gradient():
    # The training loop scales each micro-batch's loss by its share of tokens; backward must pass that on.
    batch = batch_rows()
    terms = chunked_terms(batch, False, 2.0, chunk_rows=8)
    unit = torch.autograd.grad(terms["loss"], student_leaves(batch), retain_graph=True)
    scaled = torch.autograd.grad(terms["loss"] * 0.25, student_leaves(batch))
    for half, whole in zip(scaled, unit):
        torch.testing.assert_close(half, whole * 0.25)


def test_a_batch_without_masked_tokens_gives_a_zero_mlm_term_as_today():
    no_mask = {**batch_rows(), "masked_in_tokens": torch.zeros(0, dtype=torch.long),
               "masked_labels": torch.zeros(0, dtype=torch.long)}
    expected_terms, expected_grads = values_and_gradients(lambda b: whole_batch_terms(b, False, 2.0), no_mask)
    terms, grads = values_and_gradients(lambda b: chunked_terms(b, False, 2.0, chunk_rows=6), no_mask)
    assert terms["mlm"] == expected_terms["mlm"] == 0 and terms["ce"] > 0
    for grad, expected in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected, **FP32)


def test_no_rows_give_zero_terms_and_zero_gradients():
    batch = batch_rows()
    student = VocabProjection(batch["student_inputs"][:0], batch["student_weight"], batch["student_bias"])
    teacher = VocabProjection(batch["teacher_inputs"][:0], batch["teacher_weight"], batch["teacher_bias"])
    terms = chunked_lm_head_losses(student, teacher, torch.zeros(0, dtype=torch.long), 2.0,
                                   LmHeadLossWeights(ce=5.0, mlm=2.0, mse=0.5), chunk_rows=4)
    assert all(value == 0 for value in terms.values())
    grads = torch.autograd.grad(terms["loss"], student_leaves(batch))
    assert all(grad.abs().sum() == 0 for grad in grads)


def test_under_no_grad_the_values_are_the_same():
    batch = batch_rows()
    with_grad = chunked_terms(batch, False, 2.0, chunk_rows=8)
    with torch.no_grad():
        without = chunked_terms(batch, False, 2.0, chunk_rows=8)
    assert not without["loss"].requires_grad
    for name, value in with_grad.items():
        torch.testing.assert_close(without[name], value.detach(), msg=name)


def test_under_bf16_autocast_the_chunked_loss_is_as_close_to_fp32_as_today():
    # On CUDA the training loop runs the loss under bf16 autocast: the projections (and here the gradient matmuls)
    # in bf16, the softmaxes in fp32. CPU autocast takes the same path. Both round to bf16, differently, so each is
    # compared with the fp32 result: the chunked one must be no further from it than today's.
    batch = batch_rows()
    exact_terms, exact_grads = values_and_gradients(lambda b: whole_batch_terms(b, False, 2.0), batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        today_terms, today_grads = values_and_gradients(lambda b: whole_batch_terms(b, False, 2.0), batch)
        terms, grads = values_and_gradients(lambda b: chunked_terms(b, False, 2.0, chunk_rows=8), batch)
    for name, value in exact_terms.items():
        torch.testing.assert_close(terms[name].float(), value, rtol=2e-3, atol=1e-4, msg=name)
    for grad, today, exact, leaf in zip(grads, today_grads, exact_grads, student_leaves(batch)):
        assert grad.dtype == leaf.dtype == torch.float32
        chunked_error = (grad - exact).norm() / exact.norm()
        today_error = (today - exact).norm() / exact.norm()
        assert chunked_error < 1e-2 and chunked_error <= 1.5 * today_error


def test_the_chunked_loss_never_reads_a_value_on_the_host():
    # It runs every step of distill_pretrain: selecting the labelled rows and counting them stay on the device.
    batch = batch_rows()
    with DataDependentOps() as recorder:
        chunked_terms(batch, False, 2.0, chunk_rows=8)["loss"].backward()
    assert recorder.found == []


def test_bad_chunk_sizes_are_refused():
    batch = batch_rows()
    with pytest.raises(ValueError, match="chunk_rows"):
        chunked_terms(batch, False, 2.0, chunk_rows=0)
