"""Stage tokenizer: a pretrained tokenizer, or a BERT-style WordPiece tokenizer trained on this run's text.

The trained tokenizer streams the corpus (it never holds it) through the tokenizers library (BERT normalizer and pre-tokenizer, WordPiece with
[PAD] [UNK] [CLS] [SEP] [MASK]) and is saved as a transformers fast tokenizer (tokenizer.json + config),
so AutoTokenizer and transformers.pipeline load it like any hub tokenizer.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertTokenizerFast, PreTrainedTokenizerFast

from pipeline.data.corpus_writer import corpus_source, training_documents
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.outputs.manifests import atomic_output_dir, verify_input_dirs
from pipeline.plan.config import PipelineConfig, TokenizerConfig

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # BERT's special tokens, ids 0..4


def continuing_subword_alphabet(texts: Iterable[str], tokenizer: Tokenizer) -> list[str]:
    """A "##c" for every character of the normalised text: a superset of the ones the WordPiece trainer
    creates (characters seen after a word's first one); an unused extra costs one vocabulary slot."""
    characters: set[str] = set()
    for text in texts:  # streamed: one text at a time
        characters.update(tokenizer.normalizer.normalize_str(text))
    return ["##" + character for character in sorted(characters) if not character.isspace()]


def train_wordpiece_tokenizer(texts: Iterable[str], cfg: TokenizerConfig, model_max_length: int) -> PreTrainedTokenizerFast:
    """Train on `texts`, which is iterated twice (the alphabet, then the trainer's own pass) and never held whole:
    a list, or a re-iterable stream such as TrainingTexts."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=cfg.lowercase, lowercase=cfg.lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # Reproducibility workaround for huggingface/tokenizers#1794: the trainer gives "##c" tokens ids in
    # hash-map order, and merge ties are broken by id, so two runs on the same text learn different
    # vocabularies. Registering them up front (as if special) fixes their ids, and with them every merge.
    trainer = trainers.WordPieceTrainer(
        vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
        special_tokens=SPECIAL_TOKENS + continuing_subword_alphabet(texts, tokenizer),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # Rebuild from the learned vocabulary so that only BERT's five tokens are special (the "##c" are not).
    trained = tokenizer
    tokenizer = Tokenizer(models.WordPiece(vocab=trained.get_vocab(), unk_token="[UNK]"))
    tokenizer.normalizer = trained.normalizer
    tokenizer.pre_tokenizer = trained.pre_tokenizer
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return BertTokenizerFast(
        tokenizer_object=tokenizer,
        do_lower_case=cfg.lowercase,
        unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
        model_max_length=model_max_length,
    )


class TrainingTexts:
    """The corpus's training documents plus SQuAD training contexts and questions (so questions' words are in
    the vocabulary), streamed anew on every iteration: tokenizers' train_from_iterator reads a generator."""

    def __init__(self, cfg: PipelineConfig, data_dir: Path):
        self.source = corpus_source(cfg.data, data_dir)
        self.cfg, self.data_dir = cfg, data_dir

    def __iter__(self) -> Iterator[str]:
        data = self.cfg.data
        yield from training_documents(self.source, self.cfg.seed, data.mlm_holdout_fraction, data.max_corpus_lines)
        with (self.data_dir / "train.jsonl").open(encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                yield record["context"]
                yield record["question"]


def run(cfg: PipelineConfig, data_dir: Path, out_dir: Path) -> dict:
    verify_input_dirs(data_dir)
    with atomic_output_dir(out_dir, cfg) as tmp:
        if cfg.tokenizer.pretrained:
            # imported here: the auto classes load transformers' model code (about half a second), which a
            # trained tokenizer does not need
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer.pretrained)
            source = cfg.tokenizer.pretrained
        else:
            model_max_length = cfg.teacher.architecture.max_position_embeddings
            tokenizer = train_wordpiece_tokenizer(TrainingTexts(cfg, data_dir), cfg.tokenizer, model_max_length)
            source = "trained WordPiece"
        if not tokenizer.is_fast:
            raise ValueError(f"tokenizer.pretrained: {source} has no fast tokenizer (offset mappings need one)")
        tokenizer.save_pretrained(tmp)
        metrics = {"source": source, "vocab_size": len(tokenizer)}
        atomic_write_json(tmp / "metrics.json", metrics)
    logger.info("tokenizer: %s", metrics)
    return metrics

