"""The MLM corpus at any size: streamed, tokenized once on every core, ids memory-mapped, sequences built.

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

import contextlib
import json
import logging
import multiprocessing
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from pipeline.machine import high_water_mark_mb, largest_child_peak_mb
from pipeline.manifests import read_manifest
from pipeline.config import ConfigError, DataConfig
from pipeline.data_sources import looks_like_a_path

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

MIN_SEQUENCE_TOKENS = 12  # DistilBERT reference (lm_seqs_dataset.remove_short_sequences): keep lengths > 11
SPECIAL_TOKENS_PER_SEQUENCE = 2  # [CLS] ... [SEP]
TEXT_PIECE_BYTES = 16 << 20  # a unit of work: small enough to balance the cores, large enough to amortise a task
HUB_PIECE_ROWS = 5_000
ENCODE_BATCH_DOCUMENTS = 512  # documents per call of the fast tokenizer inside a worker
GENERATED_CORPUS_FILE = "corpus.txt"  # prepare_data writes the synthetic and squad_contexts corpora here


# ------------------------------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class CorpusSource:
    """Where documents come from: a local text file (one document per line), a JSON Lines file (one document per
    record, in `text_column`), or a hub dataset (one document per row)."""

    kind: str  # "text" | "jsonl" | "hub"
    location: str
    config_name: str | None = None
    split: str = "train"
    text_column: str = "text"


def corpus_source(data: DataConfig, data_dir: Path) -> CorpusSource:
    """The configured corpus: prepare_data's generated file for 'synthetic' and 'squad_contexts', else data.corpus."""
    if data.corpus in ("synthetic", "squad_contexts"):
        return CorpusSource("text", str(Path(data_dir) / GENERATED_CORPUS_FILE))
    path = Path(data.corpus).expanduser()
    if not (looks_like_a_path(data.corpus) or data.corpus.endswith(".txt") or path.exists()):
        return CorpusSource("hub", data.corpus, data.corpus_config_name, data.corpus_split, data.corpus_text_column)
    if not path.is_file():
        raise ConfigError(f"data.corpus: file not found: {data.corpus}")
    if data.corpus.endswith((".jsonl", ".json")):
        return CorpusSource("jsonl", str(path), text_column=data.corpus_text_column)
    return CorpusSource("text", str(path))


@dataclass(frozen=True)
class Piece:
    """A unit of tokenization work: a byte range of a file, or a row range of a hub dataset. Pieces depend on the
    source only, never on the number of workers, so the output is the same whatever the cores."""

    number: int
    start: int
    end: int


def source_pieces(source: CorpusSource) -> list[Piece]:
    if source.kind == "hub":
        n_rows = len(_hub_dataset(source))
        bounds = list(range(0, n_rows, HUB_PIECE_ROWS)) + [n_rows]
    else:
        size = Path(source.location).stat().st_size
        bounds = list(range(0, size, TEXT_PIECE_BYTES)) + [size]
    return [Piece(number, start, end) for number, (start, end) in enumerate(zip(bounds[:-1], bounds[1:]))]


def piece_documents(source: CorpusSource, piece: Piece) -> Iterator[str]:
    """The non-empty documents of one piece, stripped. A line belongs to the piece its first byte is in."""
    if source.kind == "hub":
        texts = _hub_dataset(source)[piece.start : piece.end][source.text_column]
        yield from (text.strip() for text in texts if text and text.strip())
        return
    with open(source.location, "rb") as handle:
        if piece.start > 0:
            handle.seek(piece.start - 1)
            if handle.read(1) != b"\n":
                handle.readline()  # the rest of a line that began in the previous piece
        while handle.tell() < piece.end:
            raw = handle.readline()
            if not raw:
                break
            document = _document_from_line(raw, source, piece)
            if document:
                yield document


def _document_from_line(raw: bytes, source: CorpusSource, piece: Piece) -> str:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"data.corpus: {source.location} is not UTF-8 text (near byte {piece.start}): {error}")
    if source.kind == "text":
        return line.strip()
    if not line.strip():
        return ""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ConfigError(f"data.corpus: {source.location}: a line near byte {piece.start} is not JSON ({error})")
    if not isinstance(record, dict) or source.text_column not in record:
        raise ConfigError(f"data.corpus_text_column: {source.text_column!r} is missing from a record of "
                          f"{source.location} (near byte {piece.start})")
    return str(record[source.text_column] or "").strip()


def iter_documents(source: CorpusSource) -> Iterator[str]:
    """Every document of the source in order, streamed (for tokenizer training)."""
    for piece in source_pieces(source):
        yield from piece_documents(source, piece)


_HUB_DATASETS: dict[CorpusSource, Any] = {}


def _hub_dataset(source: CorpusSource, num_proc: int | None = None):
    """A hub corpus through `datasets`: downloaded and converted once into its Arrow cache, then memory-mapped
    (a forked worker shares the mapping, it holds no copy)."""
    if source not in _HUB_DATASETS:
        import datasets

        dataset = datasets.load_dataset(source.location, source.config_name, split=source.split, num_proc=num_proc)
        if source.text_column not in dataset.column_names:
            raise ConfigError(f"data.corpus_text_column: {source.text_column!r} is not a column of "
                              f"{source.location} (columns: {dataset.column_names})")
        _HUB_DATASETS[source] = dataset
    return _HUB_DATASETS[source]


# ------------------------------------------------------------------------------------------------- hold-out


def is_heldout(document_index: np.ndarray, seed: int, fraction: float) -> np.ndarray:
    """Whether each document (by its index in the corpus) is in the hold-out: a seeded hash of the index below
    `fraction`. Decided per document and without knowing the corpus size, so a stream can apply it."""
    with np.errstate(over="ignore"):  # splitmix64 relies on wrap-around
        x = np.asarray(document_index, dtype=np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) % 2**64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(2**53) < fraction


def training_documents(
    source: CorpusSource, seed: int, heldout_fraction: float, max_documents: int | None = None,
    block: int = 10_000,
) -> Iterator[str]:
    """The documents outside the hold-out (of the first `max_documents`), streamed in order; the hold-out is
    decided for `block` documents at a time."""
    documents = iter_documents(source)
    first = 0
    while max_documents is None or first < max_documents:
        size = block if max_documents is None else min(block, max_documents - first)
        batch = [document for _, document in zip(range(size), documents)]
        held = is_heldout(np.arange(first, first + len(batch)), seed, heldout_fraction)
        yield from (document for document, is_held in zip(batch, held) if not is_held)
        if len(batch) < size:
            return
        first += len(batch)


# ------------------------------------------------------------------------------------------------- tokenizing


def ids_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


@dataclass
class PieceResult:
    number: int
    ids_path: str
    document_lengths: np.ndarray  # int64, one per document
    counts: np.ndarray  # int64 [vocab]
    text_bytes: int


_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_file: str, source: CorpusSource, out_dir: str, vocab_size: int) -> None:
    # One process per core: the tokenizer's own thread pool would only compete with the other workers.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    _WORKER.update(tokenizer=Tokenizer.from_file(tokenizer_file), source=source, out_dir=out_dir,
                   vocab_size=vocab_size, dtype=ids_dtype(vocab_size))


def _tokenize_piece(piece: Piece) -> PieceResult:
    tokenizer, vocab_size, dtype = _WORKER["tokenizer"], _WORKER["vocab_size"], _WORKER["dtype"]
    ids_path = Path(_WORKER["out_dir"]) / f"piece-{piece.number:06d}.bin"
    counts = np.zeros(vocab_size, dtype=np.int64)
    lengths: list[int] = []
    text_bytes = 0
    with ids_path.open("wb") as out:
        batch: list[str] = []
        for document in _with_end_marker(piece_documents(_WORKER["source"], piece)):
            if document is not None:
                batch.append(document)
                text_bytes += len(document.encode("utf-8"))
            if batch and (document is None or len(batch) == ENCODE_BATCH_DOCUMENTS):
                encoded = [encoding.ids for encoding in tokenizer.encode_batch(batch, add_special_tokens=False)]
                lengths.extend(len(ids) for ids in encoded)
                ids = np.concatenate([np.asarray(document_ids, dtype=dtype) for document_ids in encoded])
                out.write(ids.tobytes())
                counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]  # one count per batch, not per line
                batch = []
    return PieceResult(piece.number, str(ids_path), np.asarray(lengths, dtype=np.int64), counts, text_bytes)


def _with_end_marker(documents: Iterator[str]) -> Iterator[str | None]:
    yield from documents
    yield None


@contextlib.contextmanager
def tokenized_pieces(pieces: list[Piece], workers: int, arguments: tuple) -> Iterator[Iterator[PieceResult]]:
    """Each piece's result, in piece order: in this process for one worker (nothing to fork), else from a pool of
    `workers` forked processes, which share the parent's memory-mapped hub dataset instead of loading it again."""
    if workers <= 1:
        _init_worker(*arguments)
        yield map(_tokenize_piece, pieces)
        return
    with multiprocessing.get_context("fork").Pool(workers, _init_worker, arguments) as pool:
        yield pool.imap(_tokenize_piece, pieces)


def tokenize_corpus(
    source: CorpusSource,
    tokenizer_file: Path,
    vocab_size: int,
    out_dir: Path,
    seed: int,
    heldout_fraction: float,
    workers: int,
    max_documents: int | None = None,
) -> dict:
    """Stream `source` through the fast tokenizer on `workers` processes and write the layout in the module
    docstring into `out_dir`. Memory stays flat: each worker holds one batch of documents; ids go to disk."""
    out_dir = Path(out_dir)
    pieces_dir = out_dir / "pieces"
    pieces_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if source.kind == "hub":
        _hub_dataset(source, num_proc=workers)  # download and convert once, on every core, before forking
    pieces = source_pieces(source)
    dtype = ids_dtype(vocab_size)
    counts = np.zeros(vocab_size, dtype=np.int64)
    document_lengths: list[np.ndarray] = []
    n_documents = n_tokens = text_bytes = 0
    arguments = (str(tokenizer_file), source, str(pieces_dir), vocab_size)
    with tokenized_pieces(pieces, workers, arguments) as results, (out_dir / "ids.bin").open("wb") as ids_file:
        for result in results:  # in piece order: the output never depends on `workers`
            lengths = result.document_lengths
            if max_documents is not None and n_documents + len(lengths) > max_documents:
                lengths = lengths[: max_documents - n_documents]
                counts += _count_prefix(result.ids_path, dtype, int(lengths.sum()), vocab_size)
            else:
                counts += result.counts
            _append_prefix(result.ids_path, ids_file, int(lengths.sum()) * dtype.itemsize)
            os.remove(result.ids_path)
            document_lengths.append(lengths)
            n_documents += len(lengths)
            n_tokens += int(lengths.sum())
            text_bytes += result.text_bytes
            if max_documents is not None and n_documents >= max_documents:
                break  # leaving tokenized_pieces stops the workers
    for leftover in pieces_dir.glob("*.bin"):  # pieces after max_documents
        leftover.unlink()
    pieces_dir.rmdir()
    if n_documents == 0:
        raise ConfigError(f"data.corpus: {source.location} has no non-empty documents")
    lengths = np.concatenate(document_lengths)
    offsets = np.zeros(n_documents + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    heldout = is_heldout(np.arange(n_documents), seed, heldout_fraction)
    for document in np.flatnonzero(heldout):  # the hold-out is small: take its ids back out of the counts
        start, end = int(offsets[document]), int(offsets[document + 1])
        held_ids = read_ids(out_dir / "ids.bin", dtype, n_tokens, start, end - start)
        counts -= np.bincount(held_ids, minlength=vocab_size)[:vocab_size]
    tokenize_seconds = time.perf_counter() - started
    np.save(out_dir / "doc_offsets.npy", offsets)
    np.save(out_dir / "doc_is_heldout.npy", heldout)
    np.save(out_dir / "token_counts.npy", counts)
    description = {
        "dtype": dtype.name, "vocab_size": vocab_size, "n_documents": n_documents, "n_tokens": n_tokens,
        "n_heldout_documents": int(heldout.sum()), "heldout_seed": seed, "heldout_fraction": heldout_fraction,
        "source": {"kind": source.kind, "location": source.location},
    }
    (out_dir / "corpus.json").write_text(json.dumps(description, indent=2) + "\n")
    return {
        **{k: v for k, v in description.items() if k != "source"},
        "text_megabytes": round(text_bytes / 1e6, 3),
        "tokenize_seconds": round(tokenize_seconds, 3),
        "tokenize_mb_per_second": round(text_bytes / 1e6 / max(tokenize_seconds, 1e-9), 3),
        "workers": workers,
        "n_pieces": len(pieces),
        "peak_rss_mb": peak_rss_mb(),
    }


def _append_prefix(piece_path: str, out, n_bytes: int) -> None:
    with open(piece_path, "rb") as piece:
        while n_bytes > 0:
            chunk = piece.read(min(n_bytes, 16 << 20))
            if not chunk:
                break
            out.write(chunk)
            n_bytes -= len(chunk)


def _count_prefix(piece_path: str, dtype: np.dtype, n_ids: int, vocab_size: int) -> np.ndarray:
    ids = np.fromfile(piece_path, dtype=dtype, count=n_ids)
    return np.bincount(ids, minlength=vocab_size)[:vocab_size].astype(np.int64)


def peak_rss_mb() -> dict:
    """Peak resident memory of this process and of its largest child (the tokenizing workers), in MB."""
    return {
        "self": round(high_water_mark_mb() or 0.0, 1),
        "largest_child": round(largest_child_peak_mb(), 1),
    }


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
