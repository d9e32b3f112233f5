"""The packed (unpadded) encoders against the Hugging Face modules on the padded batch: every layer's hidden states,
the MLM logits and the student's gradients agree to fp32 rounding; a student trained packed loads unchanged."""

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, DistilBertConfig, DistilBertForMaskedLM

from pipeline.data.mlm_batches import MaskedBatchCollator, rows
from pipeline.distillation.packed_encoder import (
    PackedBertEncoder,
    PackedDistilBertEncoder,
    _grid_attention,
    _jagged_attention,
    encoder_inputs,
    sequence_layout,
)
from pipeline.distillation.reference_loss import student_mlm_logits

VOCAB = 60
LENGTHS = [5, 17, 9, 30, 12]  # tokens between [CLS] and [SEP]: every sequence a different length
ATOL = 1e-5  # fp32: the two paths sum in different orders (fused QKV, gathered rows)


class TinyTokenizer:
    """What MaskedBatchCollator reads from a tokenizer."""

    pad_token_id, cls_token_id, sep_token_id, mask_token_id = 0, 1, 2, 3
    all_special_ids = [0, 1, 2, 3]

    def __len__(self):
        return VOCAB


def randomized(model, seed):
    """Every parameter drawn at random: Hugging Face initialises biases to 0 and LayerNorm weights to 1, which
    would hide a query bias swapped with a key bias."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model


def tiny_teacher(**overrides) -> BertForMaskedLM:
    fields = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=3, num_attention_heads=4, intermediate_size=32,
                  max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return randomized(BertForMaskedLM(BertConfig(**(fields | overrides))), seed=0)


def tiny_student(**overrides) -> DistilBertForMaskedLM:
    fields = dict(vocab_size=VOCAB, dim=16, n_layers=2, n_heads=4, hidden_dim=32, max_position_embeddings=64,
                  dropout=0.0, attention_dropout=0.0)
    return randomized(DistilBertForMaskedLM(DistilBertConfig(**(fields | overrides))), seed=1)


def sequences(lengths=LENGTHS, seed=0):
    generator = np.random.default_rng(seed)
    return [generator.integers(4, VOCAB, size=n) for n in lengths]


def batches(multiple_of=8, lengths=LENGTHS, seed=0):
    """The same masked batch, padded and packed (the masks come from the same generator seed)."""
    collate = {packing: MaskedBatchCollator(TinyTokenizer(), 0.3, pack_to_multiple_of=packing)
               for packing in (None, multiple_of)}
    return {name: collate[packing](sequences(lengths, seed), torch.Generator().manual_seed(seed))
            for name, packing in (("padded", None), ("packed", multiple_of))}


def real_rows(tensor, batch):
    """The real tokens' rows [N, ...] of a padded [B, S, ...] or packed [1, T, ...] tensor, in the same order."""
    return rows(tensor, batch["token_positions"])


# --------------------------------------------------------------------------------------------------------------


def test_the_packed_batch_holds_the_real_tokens_of_the_padded_batch_with_its_masks():
    both = batches(multiple_of=32)
    padded, packed = both["padded"], both["packed"]
    n_real = sum(LENGTHS) + 2 * len(LENGTHS)
    assert packed["input_ids"].shape == (96,) and n_real == 83  # 83 real tokens padded up to a multiple of 32
    assert torch.equal(packed["input_ids"][:n_real], padded["input_ids"].flatten()[padded["token_positions"]])
    assert packed["input_ids"][n_real:].eq(TinyTokenizer.pad_token_id).all()
    lengths = [n + 2 for n in LENGTHS] + [96 - n_real]  # the padding is a sequence of its own
    assert packed["cu_seqlens"].tolist() == np.cumsum([0] + lengths).tolist()
    assert packed["cu_seqlens"].dtype == torch.int32 and packed["max_seqlen"] == 32
    assert packed["position_ids"][:7].tolist() == list(range(7)) and packed["position_ids"][n_real:].eq(0).all()
    # The loss reads the same rows with the same labels.
    assert torch.equal(packed["input_ids"][packed["masked_positions"]],
                       padded["input_ids"].flatten()[padded["masked_positions"]])
    assert torch.equal(packed["labels"][packed["masked_positions"]], packed["masked_labels"])
    assert torch.equal(packed["masked_labels"], padded["masked_labels"])
    assert packed["labels"].ne(-100).sum() == len(packed["masked_positions"])
    assert packed["n_tokens"] == packed["loss_tokens"] == n_real == len(packed["token_positions"])
    assert set(encoder_inputs(packed)) == {"input_ids", "position_ids", "cu_seqlens", "max_seqlen"}
    assert set(encoder_inputs(padded)) == {"input_ids", "attention_mask"}


@pytest.mark.parametrize("kind", ["teacher", "student"])
def test_every_layer_and_the_mlm_logits_match_the_hugging_face_model_on_the_padded_batch(kind):
    model = (tiny_teacher() if kind == "teacher" else tiny_student()).eval()
    encoder = model.bert if kind == "teacher" else model.distilbert
    packed_encoder = PackedBertEncoder(encoder) if kind == "teacher" else PackedDistilBertEncoder(encoder)
    both = batches()
    padded, packed = both["padded"], both["packed"]
    with torch.no_grad():
        reference = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                          output_hidden_states=True)
        output = packed_encoder(**encoder_inputs(packed), output_hidden_states=True)
        head = model.cls if kind == "teacher" else (lambda hidden: student_mlm_logits(model, hidden))
        logits = head(real_rows(output.last_hidden_state, packed))
    assert len(output.hidden_states) == len(reference.hidden_states) == model.config.num_hidden_layers + 1
    for layer, (expected, actual) in enumerate(zip(reference.hidden_states, output.hidden_states)):
        torch.testing.assert_close(real_rows(actual, packed), real_rows(expected, padded), atol=ATOL, rtol=0,
                                   msg=lambda message: f"layer {layer}: {message}")
    torch.testing.assert_close(real_rows(output.last_hidden_state, packed),
                               real_rows(reference.hidden_states[-1], padded), atol=ATOL, rtol=0)
    torch.testing.assert_close(logits, real_rows(reference.logits, padded), atol=ATOL, rtol=0)


def test_the_students_gradients_match_the_hugging_face_model():
    student = tiny_student()
    reference = tiny_student()  # the same seed: the same weights
    student.train(), reference.train()  # training mode, without dropout draws (dropout 0)
    both = batches()
    padded, packed = both["padded"], both["packed"]
    projection = torch.randn(VOCAB, generator=torch.Generator().manual_seed(3))

    def loss_of(logits):  # any function of every real token's logits
        return (logits.log_softmax(-1) * projection).sum()

    hidden = PackedDistilBertEncoder(student.distilbert)(**encoder_inputs(packed)).last_hidden_state
    loss_of(student_mlm_logits(student, real_rows(hidden, packed))).backward()
    expected = reference(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]).logits
    loss_of(real_rows(expected, padded)).backward()
    reference_grads = dict(reference.named_parameters())
    for name, parameter in student.named_parameters():
        expected_grad = reference_grads[name].grad
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
        torch.testing.assert_close(parameter.grad, expected_grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_padding_tokens_change_no_real_token():
    student = tiny_student().eval()
    packed_encoder = PackedDistilBertEncoder(student.distilbert)
    with torch.no_grad():
        exact = batches(multiple_of=1)["packed"]
        padded_up = batches(multiple_of=64)["packed"]
        assert exact["input_ids"].shape[0] == 83 and padded_up["input_ids"].shape[0] == 128
        # 45 padding tokens: sequences of at most the longest real one (32), so the attention is no wider.
        assert padded_up["cu_seqlens"].diff()[-2:].tolist() == [32, 13] and padded_up["max_seqlen"] == 32
        first = packed_encoder(**encoder_inputs(exact)).last_hidden_state[0, :83]
        second = packed_encoder(**encoder_inputs(padded_up)).last_hidden_state[0, :83]
    torch.testing.assert_close(first, second, atol=ATOL, rtol=0)


def test_attention_dropout_stays_in_the_students_training_forward():
    packed = batches()["packed"]
    student = tiny_student(attention_dropout=0.5)
    packed_encoder = PackedDistilBertEncoder(student.distilbert)
    with torch.no_grad():
        student.eval()
        evaluated = packed_encoder(**encoder_inputs(packed)).last_hidden_state
        student.train()
        torch.manual_seed(0)
        trained = packed_encoder(**encoder_inputs(packed)).last_hidden_state
        torch.manual_seed(0)
        again = packed_encoder(**encoder_inputs(packed)).last_hidden_state
    assert not torch.allclose(trained, evaluated, atol=1e-3)  # attention weights were dropped
    assert torch.equal(trained, again)  # from the global RNG, as every other dropout


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")  # CPU's math kernel
def test_the_jagged_attention_of_cuda_runs_computes_the_cpu_grids_attention():
    # The CUDA path (nested tensors through SDPA) runs here on the CPU's math kernel: same layout, same result.
    cu_seqlens = torch.tensor([0, 7, 19, 28, 31], dtype=torch.int32)
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(31, 4, 8, generator=generator, requires_grad=True) for _ in range(3))
    layout = sequence_layout(cu_seqlens, 12, 31)
    on_grid = _grid_attention(query, key, value, layout, dropout_p=0.0)
    jagged = _jagged_attention(query, key, value, layout, dropout_p=0.0)
    torch.testing.assert_close(jagged, on_grid, atol=ATOL, rtol=0)
    grid_gradients = torch.autograd.grad(on_grid.pow(2).sum(), (query, key, value))
    jagged_gradients = torch.autograd.grad(jagged.pow(2).sum(), (query, key, value))
    for expected, actual in zip(grid_gradients, jagged_gradients):
        torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)
    query, key, value, on_grid = query.detach(), key.detach(), value.detach(), on_grid.detach()
    # Sequence by sequence, as plain SDPA would attend each one alone.
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        alone = torch.nn.functional.scaled_dot_product_attention(
            *(x[start:end].transpose(0, 1) for x in (query, key, value))).transpose(0, 1)
        torch.testing.assert_close(on_grid[start:end], alone, atol=ATOL, rtol=0)


def test_a_student_trained_packed_saves_and_loads_as_a_plain_distilbert(tmp_path):
    student = tiny_student(dropout=0.1, attention_dropout=0.1)
    packed_encoder = PackedDistilBertEncoder(student.distilbert)
    assert {id(p) for p in packed_encoder.parameters()} == {id(p) for p in student.distilbert.parameters()}
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-2)
    before = {name: tensor.clone() for name, tensor in student.state_dict().items()}
    student.train()
    for step in range(4):
        packed = batches(seed=step)["packed"]
        hidden = packed_encoder(**encoder_inputs(packed)).last_hidden_state
        logits = student_mlm_logits(student, rows(hidden, packed["masked_positions"]))
        torch.nn.functional.cross_entropy(logits, packed["masked_labels"]).backward()
        optimizer.step()
        optimizer.zero_grad()
    student.save_pretrained(tmp_path, safe_serialization=True)

    loaded = DistilBertForMaskedLM.from_pretrained(tmp_path).eval()
    student.eval()
    trained = student.state_dict()
    assert loaded.state_dict().keys() == trained.keys()
    assert all(torch.equal(loaded.state_dict()[name], trained[name]) for name in trained)
    assert not torch.equal(trained["distilbert.transformer.layer.0.attention.q_lin.weight"],
                           before["distilbert.transformer.layer.0.attention.q_lin.weight"])  # training moved it
    padded = batches(seed=9)["padded"]
    packed = batches(seed=9)["packed"]
    with torch.no_grad():
        loaded_logits = loaded(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]).logits
        trained_logits = student(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]).logits
        hidden = PackedDistilBertEncoder(loaded.distilbert)(**encoder_inputs(packed)).last_hidden_state
        packed_logits = student_mlm_logits(loaded, real_rows(hidden, packed))
    assert torch.equal(loaded_logits, trained_logits)
    torch.testing.assert_close(packed_logits, real_rows(loaded_logits, padded), atol=ATOL, rtol=0)


def test_the_packed_encoders_compile_as_one_graph_across_batch_shapes():
    # torch.compile (train.torch_compile) traces each encoder whole, with no graph break, for batches of other
    # token counts; the eager backend compiles nothing, so this runs on CPU (the grid path; CUDA traces the jagged).
    for model, wrap in ((tiny_teacher().eval(), lambda m: PackedBertEncoder(m.bert)),
                        (tiny_student().eval(), lambda m: PackedDistilBertEncoder(m.distilbert))):
        plain = wrap(model)
        compiled = torch.compile(wrap(model), backend="eager", fullgraph=True)
        for seed, multiple_of in ((0, 8), (1, 16)):
            packed = batches(multiple_of=multiple_of, seed=seed)["packed"]
            with torch.no_grad():
                assert torch.equal(compiled(**encoder_inputs(packed)).last_hidden_state,
                                   plain(**encoder_inputs(packed)).last_hidden_state)
