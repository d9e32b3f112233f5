"""The MLM corpus at any size, read: ids memory-mapped, sequences built, batches by token budget. The folder is
written (streamed, tokenized once on every core) by pipeline/data/corpus_writer.py.

Layout of a tokenized corpus folder (the tokenize_corpus stage writes it, every MLM stage and rank reads it):

    ids.bin             every document's token ids, no special tokens, one after the other (uint16 when the
                        vocabulary fits, else uint32): the nanoGPT / Megatron-LM flat ids file, memory-mapped
    doc_offsets.npy     int64 [n_documents + 1]: document d is ids[doc_offsets[d]:doc_offsets[d + 1]]
    doc_is_heldout.npy  bool [n_documents]: the masked-token-accuracy hold-out, chosen by document index
    token_counts.npy    int64 [vocab]: how often each id occurs in the training documents (masking smoothing)
    corpus.json         dtype, sizes, the hold-out rule's seed and fraction

Sequences follow the DistilBERT reference (`lm_seqs_dataset.py`): a document longer than max_seq_length is cut
into chunks of max_seq_length - 2 ids, each wrapped in [CLS] ... [SEP], so no text is lost to truncation; then
sequences of 11 tokens or fewer (with [CLS] and [SEP]) are dropped. Batches are built by token budget.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.outputs.manifests import read_manifest
from pipeline.plan.config import ConfigError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

MIN_SEQUENCE_TOKENS = 12  # DistilBERT reference (lm_seqs_dataset.remove_short_sequences): keep lengths > 11
SPECIAL_TOKENS_PER_SEQUENCE = 2  # [CLS] ... [SEP]


# ------------------------------------------------------------------------------------------------- reading


def read_ids(path: Path, dtype: np.dtype, n_tokens: int, start: int, count: int) -> np.ndarray:
    """ids[start:start + count] of a flat ids file, through a memory map opened for this read only.

    A map kept open for a whole run would count every page it ever touched in the process's resident memory
    (an epoch touches the whole file); a map per read, as nanoGPT's train.py makes one per batch, keeps a
    process's memory flat in the corpus size. Opening one costs microseconds."""
    ids = np.memmap(path, dtype=dtype, mode="r", shape=(n_tokens,))
    return np.array(ids[start : start + count])


class TokenizedCorpus:
    """A tokenize_corpus folder, memory-mapped: nothing but the per-document offsets is read into memory.

    `ids_path`: where to read ids.bin from instead of the folder (a node-local copy, see copy_ids_to_node)."""

    def __init__(self, directory: str | Path, ids_path: str | Path | None = None):
        self.directory = Path(directory)
        self.ids_path = Path(ids_path) if ids_path is not None else self.directory / "ids.bin"
        description_path = self.directory / "corpus.json"
        if not description_path.is_file():
            raise FileNotFoundError(f"{description_path}: missing; not a tokenize_corpus output")
        self.description = json.loads(description_path.read_text())
        self.dtype = np.dtype(self.description["dtype"])
        self.vocab_size = int(self.description["vocab_size"])
        self.doc_offsets = np.load(self.directory / "doc_offsets.npy", mmap_mode="r")
        self.doc_is_heldout = np.load(self.directory / "doc_is_heldout.npy")

    def token_counts(self) -> torch.Tensor:
        import torch  # here, not at the top: the stages that make the corpus read this module and need no torch

        return torch.from_numpy(np.load(self.directory / "token_counts.npy"))

    def sequences(self, split: str, max_seq_length: int) -> "CorpusSequences":
        """The training ('train') or hold-out ('heldout') sequences for models of `max_seq_length` positions."""
        if split not in ("train", "heldout"):
            raise ValueError(f"split {split!r}: expected 'train' or 'heldout'")
        documents = np.flatnonzero(self.doc_is_heldout if split == "heldout" else ~self.doc_is_heldout)
        starts, lengths = chunk_documents(np.asarray(self.doc_offsets), documents, max_seq_length)
        return CorpusSequences(self.ids_path, self.dtype, int(self.description["n_tokens"]), starts, lengths)


def node_local_ids_path(corpus_dir: str | Path, node_local_dir: str | Path) -> Path:
    """Where a node keeps its copy of a corpus's ids.bin: named by the file's sha256 in the corpus's manifest, so
    a copy of another corpus, or of an earlier build, is never read in its place. Environment variables in
    node_local_dir ($TMPDIR, set per job on many clusters) are expanded on the node."""
    sha256 = read_manifest(corpus_dir)["files"]["ids.bin"]["sha256"]
    return Path(os.path.expandvars(str(node_local_dir))).expanduser() / f"ids-{sha256[:24]}.bin"


def copy_ids_to_node(corpus_dir: str | Path, node_local_dir: str | Path) -> Path:
    """Copy a corpus's ids.bin to node-local disk unless a complete copy is there; return the copy's path.

    Every rank reads the ids at random offsets for a whole run: from a node's own disk instead of a shared file
    system. The copy is written under a name of this process's own and renamed when complete, so a killed copy is
    never read and two processes copying at once each rename a whole file."""
    destination = node_local_ids_path(corpus_dir, node_local_dir)
    size = read_manifest(corpus_dir)["files"]["ids.bin"]["bytes"]
    if destination.is_file() and destination.stat().st_size == size:
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(f".{destination.name}.{socket.gethostname()}.{os.getpid()}")
    started = time.perf_counter()
    shutil.copyfile(Path(corpus_dir) / "ids.bin", partial)
    os.replace(partial, destination)
    logger.info("copied %s (%.1f MB) to %s in %.1f s", Path(corpus_dir) / "ids.bin", size / 1e6, destination,
                time.perf_counter() - started)
    return destination


def chunk_documents(doc_offsets: np.ndarray, documents: np.ndarray, max_seq_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(start in ids.bin, number of ids) of every sequence of the chosen documents: each document cut into chunks
    of max_seq_length - 2 ids, chunks whose sequence would have 11 tokens or fewer dropped. Vectorised: one pass
    of numpy over the documents, whatever their number."""
    width = max_seq_length - SPECIAL_TOKENS_PER_SEQUENCE
    if width < 1:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for tokens between [CLS] and [SEP]")
    document_starts = doc_offsets[documents]
    document_lengths = doc_offsets[documents + 1] - document_starts
    chunks_per_document = -(-document_lengths // width)
    first_chunk = np.repeat(np.cumsum(chunks_per_document) - chunks_per_document, chunks_per_document)
    chunk_number = np.arange(int(chunks_per_document.sum()), dtype=np.int64) - first_chunk
    starts = np.repeat(document_starts, chunks_per_document) + chunk_number * width
    lengths = np.minimum(width, np.repeat(document_lengths, chunks_per_document) - chunk_number * width)
    keep = lengths + SPECIAL_TOKENS_PER_SEQUENCE >= MIN_SEQUENCE_TOKENS
    return starts[keep], lengths[keep].astype(np.int32)


class CorpusSequences:
    """Sequences (ids without [CLS]/[SEP]) read from the memory-mapped ids file (see read_ids); holds only the
    sequences' starts and lengths, so it is cheap to pickle into loader workers. A map-style dataset for torch's
    DataLoader (its __len__ and __getitem__ are all the loader reads), defined without importing torch: the stages
    that make the corpus (prepare_data, tokenizer, tokenize_corpus) read this module and need no torch."""

    def __init__(self, ids_path: Path, dtype: np.dtype, n_tokens: int, starts: np.ndarray, lengths: np.ndarray):
        self.ids_path, self.dtype, self.n_tokens = Path(ids_path), dtype, n_tokens
        self.starts, self.lengths = starts, lengths

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> np.ndarray:
        return read_ids(self.ids_path, self.dtype, self.n_tokens, int(self.starts[index]), int(self.lengths[index]))

    def sequence_lengths(self) -> np.ndarray:
        """Tokens of each sequence with [CLS] and [SEP]."""
        return self.lengths + SPECIAL_TOKENS_PER_SEQUENCE

    def n_tokens_total(self) -> int:
        return int(self.sequence_lengths().sum())


# ------------------------------------------------------------------------------------------------- batches


def token_budget_batches(
    lengths: np.ndarray, max_tokens: int, seed: int, epoch: int, world_size: int = 1, sort_window: int = 50,
) -> list[np.ndarray]:
    """One epoch's micro-batches, each at most `max_tokens` padded tokens (sequences x the longest one).

    The order depends only on (seed, epoch): a seeded shuffle, then windows of `sort_window` x the typical batch
    sorted by length (similar lengths share a batch, little padding; 50 as transformers' length-grouped
    sampler, so a batch still mixes documents of different kinds), then the batches shuffled. The number of
    batches is padded to a multiple of `world_size` by repeating the first ones (as DistributedSampler pads), so
    every rank takes as many; batch b goes to rank b % world_size. Every sequence is in exactly one batch of the
    unpadded list."""
    lengths = np.asarray(lengths)
    if len(lengths) == 0:
        return []
    longest = int(lengths.max())
    if longest > max_tokens:
        raise ConfigError(f"max_tokens_per_batch {max_tokens} is below the longest sequence ({longest} tokens)")
    generator = np.random.default_rng([seed, epoch])
    order = generator.permutation(len(lengths))
    window = max(1, sort_window * max(1, max_tokens // max(1, int(np.median(lengths)))))
    batches: list[np.ndarray] = []
    for begin in range(0, len(order), window):
        part = order[begin : begin + window]
        part = part[np.argsort(-lengths[part], kind="stable")]
        batches.extend(_fill_to_budget(part, lengths[part], max_tokens))
    batches = [batches[i] for i in generator.permutation(len(batches))]
    n_padding = -len(batches) % world_size
    return batches + [batches[i % len(batches)] for i in range(n_padding)]


def _fill_to_budget(indices: np.ndarray, sorted_lengths: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Cut indices sorted by decreasing length into batches: each takes as many as fit beside its first (longest)."""
    batches = []
    begin = 0
    while begin < len(indices):
        size = max(1, max_tokens // int(sorted_lengths[begin]))
        batches.append(indices[begin : begin + size])
        begin += size
    return batches
