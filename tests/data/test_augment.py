"""TinyBERT task-stage augmentation: which tokens may change, what they change into, and what stays put."""

import pytest
import torch
from transformers import BertForMaskedLM, BertTokenizerFast

from pipeline.data.augment import NO_GOLD_POSITION, augment_windows, continuation_token_mask, replaceable_positions
from tests.stage_fixtures import tiny_bert_config

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "who", "was", "born", "in", "paris", "lyon", "nice",
         "the", "city", "of", "grand", "##ville", "##s", "a", "b"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    vocab_file = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab_file.write_text("\n".join(VOCAB) + "\n")
    return BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=True)


@pytest.fixture(scope="module")
def windows(tokenizer):
    encoded = tokenizer(["who was born in paris"], ["grandville was the city of lyon"], padding="max_length",
                        max_length=16, return_tensors="pt")
    two = {name: torch.cat([tensor, tensor]) for name, tensor in encoded.items()}
    two["start_positions"] = torch.tensor([12, 0])
    two["end_positions"] = torch.tensor([12, 0])
    return two


@pytest.fixture(scope="module")
def mlm(tokenizer):
    torch.manual_seed(0)
    return BertForMaskedLM(tiny_bert_config(vocab_size=len(VOCAB))).eval()


def tokens(tokenizer, ids):
    return tokenizer.convert_ids_to_tokens(ids.tolist())


def test_only_whole_single_piece_words_are_replaceable(tokenizer, windows):
    eligible = replaceable_positions(windows["input_ids"], windows["attention_mask"], tokenizer)[0]
    pieces = tokens(tokenizer, windows["input_ids"][0])
    chosen = [piece for piece, ok in zip(pieces, eligible.tolist()) if ok]
    # "grand ##ville" is one word of two pieces: neither piece; special tokens and padding: never.
    assert chosen == ["who", "was", "born", "in", "paris", "was", "the", "city", "of", "lyon"]


def test_continuation_mask_marks_word_pieces_only(tokenizer):
    mask = continuation_token_mask(tokenizer)
    assert [VOCAB[i] for i in mask.nonzero().flatten().tolist()] == ["##ville", "##s"]


def test_every_chosen_word_becomes_a_whole_word_and_nothing_else_moves(tokenizer, windows, mlm):
    out = augment_windows(mlm, windows, tokenizer, copies=2, replace_probability=1.0, top_k=3,
                          generator=torch.Generator().manual_seed(0))
    assert out["input_ids"].shape == (4, 16)
    eligible = replaceable_positions(windows["input_ids"], windows["attention_mask"], tokenizer).repeat(2, 1)
    original = windows["input_ids"].repeat(2, 1)
    assert torch.equal(out["input_ids"][~eligible], original[~eligible])
    replacements = out["input_ids"][eligible]
    banned = set(tokenizer.all_special_ids) | {VOCAB.index("##ville"), VOCAB.index("##s")}
    assert not banned & set(replacements.tolist())
    for name in ("attention_mask", "token_type_ids"):
        assert torch.equal(out[name], windows[name].repeat(2, 1))
    assert out["start_positions"].tolist() == [NO_GOLD_POSITION] * 4
    assert out["end_positions"].tolist() == [NO_GOLD_POSITION] * 4


def test_top_1_takes_the_language_models_best_whole_word(tokenizer, windows, mlm):
    out = augment_windows(mlm, windows, tokenizer, copies=1, replace_probability=1.0, top_k=1,
                          generator=torch.Generator().manual_seed(0))
    eligible = replaceable_positions(windows["input_ids"], windows["attention_mask"], tokenizer)
    masked = windows["input_ids"].masked_fill(eligible, tokenizer.mask_token_id)
    with torch.no_grad():
        logits = mlm(input_ids=masked, attention_mask=windows["attention_mask"],
                     token_type_ids=windows["token_type_ids"]).logits
    logits[..., tokenizer.all_special_ids] = float("-inf")
    logits[..., continuation_token_mask(tokenizer)] = float("-inf")
    assert torch.equal(out["input_ids"][eligible], logits.argmax(-1)[eligible])


def test_replace_probability_sets_the_share_of_words_replaced(tokenizer, windows):
    # A language model that always predicts "a" (a word absent from the windows) marks every replaced position.
    torch.manual_seed(0)
    always_a = BertForMaskedLM(tiny_bert_config(vocab_size=len(VOCAB))).eval()
    with torch.no_grad():
        always_a.cls.predictions.bias[VOCAB.index("a")] = 1e4
    many = {name: tensor.repeat(200, *[1] * (tensor.dim() - 1)) for name, tensor in windows.items()}
    eligible = replaceable_positions(many["input_ids"], many["attention_mask"], tokenizer)
    out = augment_windows(always_a, many, tokenizer, 1, 0.4, 1, torch.Generator().manual_seed(1))
    replaced = out["input_ids"] == VOCAB.index("a")
    assert not (replaced & ~eligible).any()
    share = replaced.sum().item() / eligible.sum().item()
    assert 0.37 < share < 0.43  # 2,000 draws of p = 0.4: the standard error is 0.011
    unchanged = augment_windows(always_a, many, tokenizer, 1, 0.0, 1, torch.Generator().manual_seed(1))
    assert torch.equal(unchanged["input_ids"], many["input_ids"])


def test_same_generator_seed_same_augmentation(tokenizer, windows, mlm):
    first = augment_windows(mlm, windows, tokenizer, 1, 0.5, 5, torch.Generator().manual_seed(7))
    again = augment_windows(mlm, windows, tokenizer, 1, 0.5, 5, torch.Generator().manual_seed(7))
    assert torch.equal(first["input_ids"], again["input_ids"])


def test_zero_copies_is_refused(tokenizer, windows, mlm):
    with pytest.raises(ValueError, match="copies must be at least 1"):
        augment_windows(mlm, windows, tokenizer, 0, 0.5, 5, torch.Generator())
