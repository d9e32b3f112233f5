"""The chunked, fused, vocabulary-padded loss distill_pretrain trains with, against its readable reference: the
[N, V] logits of every row and losses.mlm_distillation_terms (whole-vocabulary log-softmaxes and kl_div).

Tolerances (the two compute the same sums in other orders): fp64, rtol 1e-10 and atol 1e-12 on every term and
gradient; fp32, rtol 1e-5 and atol 1e-6; the fp64 analytic gradient also passes torch.autograd.gradcheck. bf16
autocast: the terms within rtol 2e-3 of fp32, the gradients no further from fp32 (relative norm error < 1e-2)
than the reference under the same autocast. Compiled against the reference: fp32's tolerance.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.distillation import chunked_lm_loss
from pipeline.distillation.chunked_lm_loss import (
    ChunkLayout,
    LmHeadLossWeights,
    VocabProjection,
    chunk_shape_rows,
    chunk_terms_and_logit_gradient,
    chunked_lm_head_losses,
)
from pipeline.distillation.losses import IGNORED_LABEL, mlm_distillation_terms, mlm_distillation_terms_in_chunks
from tests.distillation.test_losses import DataDependentOps

N_TOKENS, HIDDEN, TEACHER_HIDDEN = 40, 16, 24
VOCAB = 300  # padded to 320 by the default layout; 320 itself is a vocabulary that needs no padding
MASKED_IN_TOKENS = torch.tensor([0, 3, 4, 11, 17, 18, 25, 38, 39])  # includes the first and last rows
WEIGHTS = {"ce": 5.0, "mlm": 2.0, "cos": 1.0}  # the DistilBERT reference weights (losses.REFERENCE_MLM_WEIGHTS)
TOLERANCE = {torch.float64: {"rtol": 1e-10, "atol": 1e-12}, torch.float32: {"rtol": 1e-5, "atol": 1e-6}}
FP32 = TOLERANCE[torch.float32]
UNPADDED = 1  # a vocab_multiple that pads nothing


def batch_rows(dtype=torch.float32, seed=0, vocab=VOCAB, n_tokens=N_TOKENS, hidden=HIDDEN):
    """A batch as the stage sees it: token rows entering each model's vocabulary projection, the projections, the
    masked rows among the tokens and their labels. The student's tensors are leaves that record gradients."""
    generator = torch.Generator().manual_seed(seed)

    def random(*shape, scale=1.0, grad=False):
        return (torch.randn(*shape, generator=generator, dtype=dtype) * scale).requires_grad_(grad)

    masked = MASKED_IN_TOKENS[MASKED_IN_TOKENS < n_tokens]
    return {
        "student_inputs": random(n_tokens, hidden, grad=True),
        "student_weight": random(vocab, hidden, scale=0.5, grad=True),
        "student_bias": random(vocab, grad=True),
        "teacher_inputs": random(n_tokens, TEACHER_HIDDEN),
        "teacher_weight": random(vocab, TEACHER_HIDDEN, scale=0.5),
        "teacher_bias": random(vocab),
        "teacher_token_hidden": random(n_tokens, hidden),
        "masked_in_tokens": masked,
        "masked_labels": torch.randint(0, vocab, (len(masked),), generator=generator),
    }


def ce_rows_and_masked_rows(batch, restrict_ce_to_mask):
    """Which token rows L_ce reads and where the masked ones sit among them, as the stage selects them."""
    if restrict_ce_to_mask:
        return batch["masked_in_tokens"], None
    return torch.arange(batch["student_inputs"].shape[0]), batch["masked_in_tokens"]


def student_leaves(batch):
    return [batch["student_inputs"], batch["student_weight"], batch["student_bias"]]


def whole_batch_terms(batch, restrict_ce_to_mask, temperature, weights=WEIGHTS):
    """The reference: the [N, V] logits of every L_ce row, then losses.mlm_distillation_terms."""
    ce_rows, masked_rows = ce_rows_and_masked_rows(batch, restrict_ce_to_mask)
    student_logits = F.linear(batch["student_inputs"][ce_rows], batch["student_weight"], batch["student_bias"])
    teacher_logits = F.linear(batch["teacher_inputs"][ce_rows], batch["teacher_weight"], batch["teacher_bias"])
    return mlm_distillation_terms(
        student_logits, teacher_logits, masked_rows, batch["masked_labels"],
        batch["student_inputs"], batch["teacher_token_hidden"], weights, temperature,
    )


def chunked_terms(batch, restrict_ce_to_mask, temperature, layout, weights=WEIGHTS):
    ce_rows, masked_rows = ce_rows_and_masked_rows(batch, restrict_ce_to_mask)
    student = VocabProjection(batch["student_inputs"][ce_rows], batch["student_weight"], batch["student_bias"])
    teacher = VocabProjection(batch["teacher_inputs"][ce_rows], batch["teacher_weight"], batch["teacher_bias"])
    return mlm_distillation_terms_in_chunks(
        student, teacher, masked_rows, batch["masked_labels"],
        batch["student_inputs"], batch["teacher_token_hidden"], weights, temperature, layout,
    )


def values_and_gradients(compute_terms, batch):
    terms = compute_terms(batch)
    gradients = torch.autograd.grad(terms["loss"], student_leaves(batch))
    return {name: value.detach() for name, value in terms.items()}, gradients


def assert_equal_to_the_reference(batch, restrict_ce_to_mask, temperature, layout, weights=WEIGHTS, tolerance=None):
    tolerance = tolerance or TOLERANCE[batch["student_inputs"].dtype]
    expected_terms, expected_grads = values_and_gradients(
        lambda b: whole_batch_terms(b, restrict_ce_to_mask, temperature, weights), batch)
    terms, grads = values_and_gradients(
        lambda b: chunked_terms(b, restrict_ce_to_mask, temperature, layout, weights), batch)
    assert terms.keys() == expected_terms.keys()
    for name, value in expected_terms.items():
        torch.testing.assert_close(terms[name], value, **tolerance, msg=name)
    for name, grad, expected in zip(["inputs", "weight", "bias"], grads, expected_grads):
        assert grad.shape == expected.shape and grad.dtype == expected.dtype, name
        assert expected.abs().max() > 0, name
        torch.testing.assert_close(grad, expected, **tolerance, msg=name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
@pytest.mark.parametrize("restrict_ce_to_mask", [False, True])
@pytest.mark.parametrize("vocab_multiple", [64, UNPADDED])
@pytest.mark.parametrize("chunk_rows", [3, 16, 1000])
def test_chunked_terms_and_gradients_equal_the_whole_batch_loss(dtype, temperature, restrict_ce_to_mask,
                                                               vocab_multiple, chunk_rows):
    # 40 or 9 rows: chunks that leave padding rows in the last one, and one larger than the batch.
    assert_equal_to_the_reference(batch_rows(dtype), restrict_ce_to_mask, temperature,
                                  ChunkLayout(chunk_rows, vocab_multiple, compile_chunks=False))


@pytest.mark.parametrize("vocab", [320, 321])
def test_a_vocabulary_already_aligned_and_one_just_past_it_give_the_reference(vocab):
    # 320 pads nothing; 321 pads 63 columns, all but one of a 64-column block.
    batch = batch_rows(torch.float64, vocab=vocab)
    assert_equal_to_the_reference(batch, False, 2.0, ChunkLayout(16, compile_chunks=False))


# Summed over the vocabulary, the logit MSE would dwarf the other terms at weight 1.
@pytest.mark.parametrize("weights", [{"ce": 1.0}, {"mlm": 1.0}, {"mse": 0.01}, {**WEIGHTS, "mse": 0.01}])
@pytest.mark.parametrize("restrict_ce_to_mask", [False, True])
def test_each_term_alone_and_the_logit_mse_equal_the_whole_batch_loss(restrict_ce_to_mask, weights):
    assert_equal_to_the_reference(batch_rows(), restrict_ce_to_mask, 2.0, ChunkLayout(4), weights)


def test_the_temperature_enters_the_soft_gradient_once_as_t():
    # d(T²·KL(softmax(t/T) ‖ softmax(s/T)))/ds = T·(softmax(s/T) − softmax(t/T)): T² from the loss, 1/T from the
    # chain rule. At T = 4 a gradient with T² (the chain rule forgotten) or with no T at all (the loss's T²
    # forgotten) is 4x off; the comparison with autograd on the loss itself must see either.
    generator = torch.Generator().manual_seed(3)
    student = torch.randn(6, 70, generator=generator, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(6, 70, generator=generator, dtype=torch.float64)
    temperature = 4.0
    loss = F.kl_div(F.log_softmax(student / temperature, 1), F.softmax(teacher / temperature, 1),
                    reduction="sum") * temperature**2
    (expected,) = torch.autograd.grad(loss, student)
    no_rows = torch.zeros(6, dtype=torch.float64)
    _, _, _, gradient, _ = chunk_terms_and_logit_gradient(
        student.detach(), teacher, torch.zeros(6, dtype=torch.long), torch.ones(6, dtype=torch.float64), no_rows,
        torch.tensor(0.0, dtype=torch.float64), n_columns=70, temperature=temperature, ce_weight=1.0,
        mse_weight=0.0, with_gradient=True)
    torch.testing.assert_close(gradient, expected, **TOLERANCE[torch.float64])
    # Either mistake moves the gradient far outside the tolerance the assertion above holds it to.
    for wrong in (expected * temperature, expected / temperature):
        assert not torch.allclose(gradient, wrong, **TOLERANCE[torch.float32])


def test_the_padding_columns_never_give_nan_even_where_the_teacher_is_certain():
    # fp32 logits 100x the usual: many teacher probabilities underflow to exactly 0, as the padding columns' are. A
    # -inf log-probability multiplied by such a 0 would make the KL NaN; the terms and gradients must stay the
    # reference's (atol 1e-5: terms near 100 and gradients near 1 carry fp32 rounding of a few 1e-6, the
    # reference's own error against fp64 is of that size too).
    batch = batch_rows(torch.float32)
    with torch.no_grad():
        batch["teacher_weight"].mul_(100)
    teacher_logits = F.linear(batch["teacher_inputs"], batch["teacher_weight"], batch["teacher_bias"])
    assert F.softmax(teacher_logits / 2.0, dim=1).eq(0).float().mean() > 0.3
    terms = chunked_terms(batch, False, 2.0, ChunkLayout(16))
    assert all(torch.isfinite(value) for value in terms.values())
    assert_equal_to_the_reference(batch, False, 2.0, ChunkLayout(16), tolerance={"rtol": 1e-5, "atol": 1e-5})


class MatmulShapes(TorchDispatchMode):
    """Records the shapes and strides of every matrix product's operands."""

    PRODUCTS = {"aten.mm", "aten.addmm", "aten.addmm_", "aten.bmm", "aten.matmul", "aten.linear"}

    def __init__(self):
        super().__init__()
        self.operands = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func.overloadpacket) in self.PRODUCTS:
            self.operands.append([(tuple(a.shape), a.stride()) for a in args if isinstance(a, torch.Tensor)])
        return func(*args, **(kwargs or {}))


def test_every_vocabulary_gemm_runs_on_the_padded_vocabulary_with_its_real_layouts():
    # BERT's 30,522 words, a narrow model: the logits (x·Wᵀ), the input gradient (g·W) and the weight gradient
    # (gᵀ·x, gᵀ a transposed view whose leading dimension is the vocabulary) must all see 30,528, never 30,522, in
    # a size or a stride.
    batch = batch_rows(vocab=30522, n_tokens=12, hidden=8)
    with MatmulShapes() as recorder:
        terms = chunked_terms(batch, False, 2.0, ChunkLayout(8))
        terms["loss"].backward()
    vocabulary_products = [ops for ops in recorder.operands
                           if any(30522 in shape or 30528 in shape for shape, _ in ops)]
    assert len(vocabulary_products) >= 2 * 4  # per chunk: student and teacher logits, input and weight gradient
    for operands in vocabulary_products:
        for shape, strides in operands:
            assert 30522 not in shape and 30522 not in strides, operands
    transposed = [shape for ops in vocabulary_products for shape, strides in ops
                  if len(shape) == 2 and shape[0] == 30528 and strides == (1, 30528)]
    assert transposed, "the weight gradient's gᵀ operand"


def test_the_gradients_keep_the_models_vocabulary():
    # The padding lives inside the loss: the student's weight and bias gradients have its 30,522 rows, and they
    # are the unpadded loss's.
    batch = batch_rows(torch.float64, vocab=30522, n_tokens=12, hidden=8)
    padded = values_and_gradients(lambda b: chunked_terms(b, False, 2.0, ChunkLayout(8)), batch)
    unpadded = values_and_gradients(lambda b: chunked_terms(b, False, 2.0, ChunkLayout(8, UNPADDED)), batch)
    for grad, leaf, other in zip(padded[1], student_leaves(batch), unpadded[1]):
        assert grad.shape == leaf.shape
        torch.testing.assert_close(grad, other, **TOLERANCE[torch.float64])


def test_every_chunk_of_a_batch_has_one_shape():
    assert [chunk_shape_rows(n, 2048) for n in (0, 1, 64, 65, 2047, 2048, 5000)] == [64, 64, 64, 128, 2048, 2048,
                                                                                      2048]
    assert chunk_shape_rows(10, 3) == 3  # never above chunk_rows
    seen = []

    def recording(student_logits, *args, **kwargs):
        seen.append(tuple(student_logits.shape))
        return chunk_terms_and_logit_gradient(student_logits, *args, **kwargs)

    original = chunked_lm_loss.chunk_function
    chunked_lm_loss.chunk_function = lambda compiled: recording  # the shapes the compiled function would see
    try:
        batch = batch_rows()
        compiled = chunked_terms(batch, False, 2.0, ChunkLayout(16, compile_chunks=True))
        compiled["loss"].backward()  # 40 rows: 16 + 16 + 8 real rows and 8 padding rows
        assert seen == [(16, 320)] * 3
        seen.clear()
        eager = chunked_terms(batch, False, 2.0, ChunkLayout(16, compile_chunks=False))
        assert seen == [(16, 320), (16, 320), (8, 320)]  # eager: a short last chunk, no padding rows to compute
    finally:
        chunked_lm_loss.chunk_function = original
    for name, value in eager.items():  # the zero-weight rows change nothing
        torch.testing.assert_close(compiled[name], value, **FP32, msg=name)


def test_the_compiled_chunk_gives_the_reference():
    # torch.compile's CPU code (inductor, C++): one shape and setting, so one compilation (about 10 s).
    batch = batch_rows()
    assert_equal_to_the_reference(batch, False, 2.0, ChunkLayout(16, compile_chunks=True), {**WEIGHTS, "mse": 0.01})


def test_the_analytic_gradient_passes_gradcheck():
    # Finite differences in fp64 on a very small head (gradcheck perturbs every input element); 11 words padded to
    # 16, 6 rows in chunks of 4.
    generator = torch.Generator().manual_seed(0)
    inputs, weight, bias = (torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)
                            for shape in [(6, 3), (11, 3), (11,)])
    teacher = VocabProjection(*(torch.randn(*shape, generator=generator, dtype=torch.float64)
                                for shape in [(6, 4), (11, 4), (11,)]))
    row_labels = torch.tensor([IGNORED_LABEL, 3, IGNORED_LABEL, 0, 10, IGNORED_LABEL])

    def weighted_loss(inputs, weight, bias):
        return chunked_lm_head_losses(VocabProjection(inputs, weight, bias), teacher, row_labels, 2.0,
                                      LmHeadLossWeights(ce=5.0, mlm=2.0, mse=0.5), ChunkLayout(4, 16))["loss"]

    assert torch.autograd.gradcheck(weighted_loss, (inputs, weight, bias))


def test_the_gradient_follows_the_incoming_gradient():
    # The training loop scales each micro-batch's loss by its share of tokens; backward must pass that on.
    batch = batch_rows()
    terms = chunked_terms(batch, False, 2.0, 8)
    unit = torch.autograd.grad(terms["loss"], student_leaves(batch), retain_graph=True)
    scaled = torch.autograd.grad(terms["loss"] * 0.25, student_leaves(batch))
    for half, whole in zip(scaled, unit):
        torch.testing.assert_close(half, whole * 0.25)


def test_a_batch_without_masked_tokens_gives_a_zero_mlm_term_as_the_reference():
    no_mask = {**batch_rows(), "masked_in_tokens": torch.zeros(0, dtype=torch.long),
               "masked_labels": torch.zeros(0, dtype=torch.long)}
    expected_terms, expected_grads = values_and_gradients(lambda b: whole_batch_terms(b, False, 2.0), no_mask)
    terms, grads = values_and_gradients(lambda b: chunked_terms(b, False, 2.0, 6), no_mask)
    assert terms["mlm"] == expected_terms["mlm"] == 0 and terms["ce"] > 0
    for grad, expected in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected, **FP32)


def test_no_rows_give_zero_terms_and_zero_gradients():
    batch = batch_rows()
    student = VocabProjection(batch["student_inputs"][:0], batch["student_weight"], batch["student_bias"])
    teacher = VocabProjection(batch["teacher_inputs"][:0], batch["teacher_weight"], batch["teacher_bias"])
    terms = chunked_lm_head_losses(student, teacher, torch.zeros(0, dtype=torch.long), 2.0,
                                   LmHeadLossWeights(ce=5.0, mlm=2.0, mse=0.5), 4)
    assert all(value == 0 for value in terms.values())
    grads = torch.autograd.grad(terms["loss"], student_leaves(batch))
    assert all(grad.abs().sum() == 0 for grad in grads)


def test_under_no_grad_the_values_are_the_same():
    batch = batch_rows()
    with_grad = chunked_terms(batch, False, 2.0, 8)
    with torch.no_grad():
        without = chunked_terms(batch, False, 2.0, 8)
    assert not without["loss"].requires_grad
    for name, value in with_grad.items():
        torch.testing.assert_close(without[name], value.detach(), msg=name)


@pytest.mark.parametrize("vocab_multiple", [64, UNPADDED])
def test_under_bf16_autocast_the_chunked_loss_is_as_close_to_fp32_as_the_reference(vocab_multiple):
    # On CUDA the training loop runs the loss under bf16 autocast: the projections (and here the gradient matmuls)
    # in bf16, the softmaxes in fp32. CPU autocast takes the same path. Both round to bf16, differently, so each is
    # compared with the fp32 result: the chunked one must be no further from it than the reference.
    batch = batch_rows()
    exact_terms, exact_grads = values_and_gradients(lambda b: whole_batch_terms(b, False, 2.0), batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference_terms, reference_grads = values_and_gradients(lambda b: whole_batch_terms(b, False, 2.0), batch)
        terms, grads = values_and_gradients(
            lambda b: chunked_terms(b, False, 2.0, ChunkLayout(8, vocab_multiple)), batch)
    for name, value in exact_terms.items():
        torch.testing.assert_close(terms[name].float(), value, rtol=2e-3, atol=1e-4, msg=name)
    for grad, reference, exact, leaf in zip(grads, reference_grads, exact_grads, student_leaves(batch)):
        assert grad.dtype == leaf.dtype == torch.float32
        chunked_error = (grad - exact).norm() / exact.norm()
        reference_error = (reference - exact).norm() / exact.norm()
        assert chunked_error < 1e-2 and chunked_error <= 1.5 * reference_error


def test_the_chunked_loss_never_reads_a_value_on_the_host():
    # It runs every step of distill_pretrain: selecting the labelled rows and counting them stay on the device.
    batch = batch_rows()
    with DataDependentOps() as recorder:
        chunked_terms(batch, False, 2.0, 8)["loss"].backward()
    assert recorder.found == []


def test_bad_layouts_are_refused():
    batch = batch_rows()
    with pytest.raises(ValueError, match="chunk_rows"):
        chunked_terms(batch, False, 2.0, 0)
    with pytest.raises(ValueError, match="vocab_multiple"):
        ChunkLayout(8, vocab_multiple=0)
