"""Stage tokenizer: a trained WordPiece tokenizer is reproducible and loads as a BERT fast tokenizer."""

from transformers import AutoTokenizer

from pipeline.data.synthetic import SyntheticWorldSpec, generate_world
from pipeline.plan.config import TokenizerConfig
from pipeline.stages.tokenizer import SPECIAL_TOKENS, train_wordpiece_tokenizer


def _texts() -> list[str]:
    world = generate_world(SyntheticWorldSpec(seed=5, n_train_contexts=40, n_dev_contexts=2, n_corpus_paragraphs=150))
    return world["corpus"] + [p["context"] for a in world["train"]["data"] for p in a["paragraphs"]]


def test_training_twice_gives_the_same_vocabulary():
    # huggingface/tokenizers#1794: without the workaround, repeated trainings on the same text (even in one
    # process) disagree on "##" ids and, through merge ties, on the vocabulary itself.
    texts = _texts()
    cfg = TokenizerConfig(vocab_size=700)
    vocabularies = [train_wordpiece_tokenizer(texts, cfg, model_max_length=128).get_vocab() for _ in range(6)]
    assert all(vocabulary == vocabularies[0] for vocabulary in vocabularies[1:])


def test_only_berts_tokens_are_special_and_they_come_first(tmp_path):
    tokenizer = train_wordpiece_tokenizer(_texts(), TokenizerConfig(vocab_size=700), model_max_length=128)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert sorted(loaded.all_special_tokens) == sorted(SPECIAL_TOKENS)
    assert [loaded.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    vocabulary = loaded.get_vocab()
    assert "##a" in vocabulary and len(vocabulary) <= 700
    # "##" pieces are ordinary tokens: they are produced by splitting words and may be masked for MLM.
    encoding = loaded("Vardarilstone was born in 1850.", return_special_tokens_mask=True)
    pieces = loaded.convert_ids_to_tokens(encoding["input_ids"])
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]" and any(p.startswith("##") for p in pieces)
    assert encoding["special_tokens_mask"] == [1] + [0] * (len(pieces) - 2) + [1]
    assert loaded.decode(encoding["input_ids"], skip_special_tokens=True) == "vardarilstone was born in 1850."
