"""The MLM corpus written: its sources (a text or JSON Lines file, or a hub dataset, in pieces), the hold-out chosen
by document index, and the tokenize_corpus folder, tokenized once on every core in the layout pipeline/data/corpus.py
documents and reads.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from pipeline.data.corpus import read_ids
from pipeline.outputs.machine import high_water_mark_mib, largest_child_peak_mib
from pipeline.plan.config import ConfigError, DataConfig
from pipeline.plan.data_sources import looks_like_a_path

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
        "peak_rss_mib": peak_rss_mib(),
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


def peak_rss_mib() -> dict:
    """Peak resident memory of this process and of its largest child (the tokenizing workers), in MiB."""
    return {
        "self": round(high_water_mark_mib() or 0.0, 1),
        "largest_child": round(largest_child_peak_mib(), 1),
    }
