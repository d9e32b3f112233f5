"""Stage token_counts: how often each vocabulary id occurs in the MLM corpus, computed once and cached.

Pretraining distillation uses the counts for token-frequency smoothing of the masking probabilities
(DistilBERT reference distiller: selection probability proportional to max(count, 1) ** -0.7).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch
from transformers import AutoTokenizer

from pipeline.artifacts import atomic_output_dir, atomic_write_json, setup_logging, verify_input_dirs
from pipeline.config import PipelineConfig, config_from_json
from pipeline.mlm import read_corpus_lines, tokenize_corpus

logger = logging.getLogger(__name__)


def count_tokens(sequences: list[list[int]], vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for sequence in sequences:
        counts += torch.bincount(torch.tensor(sequence, dtype=torch.long), minlength=vocab_size)
    return counts


def load_token_counts(path: Path, vocab_size: int) -> torch.Tensor:
    counts = json.loads(Path(path).read_text())["counts"]
    if len(counts) != vocab_size:
        raise ValueError(f"{path}: counts cover {len(counts)} ids but the tokenizer has {vocab_size}")
    return torch.tensor(counts, dtype=torch.long)


def run(cfg: PipelineConfig, data_dir: Path, tokenizer_dir: Path, out_dir: Path) -> dict:
    verify_input_dirs(data_dir, tokenizer_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    sequences = tokenize_corpus(
        read_corpus_lines(data_dir / "corpus_train.txt"), tokenizer, cfg.distill_pretrain.max_seq_length
    )
    counts = count_tokens(sequences, len(tokenizer))
    metrics = {
        "vocab_size": len(tokenizer),
        "n_tokens": int(counts.sum()),
        "n_ids_seen": int((counts > 0).sum()),
    }
    with atomic_output_dir(out_dir, cfg) as tmp:
        (tmp / "token_counts.json").write_text(json.dumps({"counts": counts.tolist()}))
        atomic_write_json(tmp / "metrics.json", metrics)
    logger.info("token_counts: %s", metrics)
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline token-counts", description=__doc__)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--tokenizer-dir", required=True, type=Path)
    parser.add_argument("--out-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    setup_logging()
    run(config_from_json(args.config_json), args.data_dir, args.tokenizer_dir, args.out_dir)
    return 0
