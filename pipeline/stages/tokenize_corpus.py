"""Stage tokenize_corpus: the MLM corpus tokenized once, on every core the rule gets, into memory-mapped ids.

Streams the configured corpus (prepare_data's generated corpus.txt, a local text or JSON Lines file, or a hub
dataset) through the fast tokenizer in fixed pieces, one worker process per core, and writes the flat ids file,
the document offsets, the hold-out (by document index) and the training documents' token counts for masking
smoothing, all from the one pass (layout: pipeline/data/corpus.py). teacher_pretrain and distill_pretrain, in every
rank, read these files and never tokenize or hash the corpus again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.data.corpus_writer import corpus_source, tokenize_corpus
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.outputs.manifests import atomic_output_dir, verify_input_dirs
from pipeline.plan.config import ConfigError, PipelineConfig

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, data_dir: Path, tokenizer_dir: Path, out_dir: Path, workers: int = 1) -> dict:
    verify_input_dirs(data_dir, tokenizer_dir)
    tokenizer_file = Path(tokenizer_dir) / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ConfigError(f"{tokenizer_dir}: no tokenizer.json (tokenize_corpus needs a fast tokenizer)")
    vocab_size = _vocab_size(tokenizer_dir)
    source = corpus_source(cfg.data, data_dir)
    with atomic_output_dir(out_dir, cfg) as tmp:
        metrics = tokenize_corpus(
            source, tokenizer_file, vocab_size, tmp, seed=cfg.seed, heldout_fraction=cfg.data.mlm_holdout_fraction,
            workers=workers, max_documents=cfg.data.max_corpus_lines,
        )
        atomic_write_json(tmp / "metrics.json", metrics)
    logger.info("tokenize_corpus: %s", json.dumps(metrics))
    return metrics


def _vocab_size(tokenizer_dir: Path) -> int:
    """len(tokenizer) as transformers counts it (base vocabulary plus added tokens), read with the tokenizers
    library the corpus is tokenized with: a fast tokenizer's tokenizer.json holds its added tokens too, and the
    stage needs no transformers (or torch) import."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


# `python -m pipeline tokenize-corpus`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "data_dir": "output of prepare_data",
    "workers": "tokenizing processes (the rule's threads)",
}
