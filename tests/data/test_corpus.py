"""The MLM corpus at scale: tokenized once into memory-mapped ids, chunked as the DistilBERT reference does, no
text lost, the same output whatever the workers, token-budget batches sharded by rank, batches masked on the CPU
with their own generators, and a training step that reads no loss tensor on the host between log steps."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from pipeline.data import corpus_writer
from pipeline.data.corpus import MIN_SEQUENCE_TOKENS, TokenizedCorpus, chunk_documents, token_budget_batches
from pipeline.data.corpus_writer import CorpusSource, corpus_source, is_heldout, tokenize_corpus
from pipeline.data.mlm_batches import MaskedBatchCollator
from pipeline.plan.config import ConfigError, DataConfig, TrainConfig
from pipeline.stages import prepare_data, tokenizer as tokenizer_stage
from tests.paths import PROJECT_ROOT
from tests.stage_fixtures import tiny_config

WORDS = "the river city born company worked years north museum painter long short a of in".split()


@pytest.fixture(scope="module")
def trained_tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizer")
    cfg = tiny_config()
    prepare_data.run(cfg, root / "data")
    tokenizer_stage.run(cfg, root / "data", root / "tokenizer")
    from transformers import AutoTokenizer

    return root / "tokenizer", AutoTokenizer.from_pretrained(root / "tokenizer")


def write_corpus(path: Path, n_documents: int = 60, seed: int = 0) -> list[str]:
    """Documents of every kind: headings (a few words), paragraphs, and articles far longer than a sequence."""
    rng = np.random.default_rng(seed)
    documents = []
    for number in range(n_documents):
        n_words = [2, 40, 400][number % 3] + int(rng.integers(0, 5))
        documents.append(" ".join(rng.choice(WORDS, n_words)) + f" {number}.")
    path.write_text("\n".join(documents[:20]) + "\n\n  \n" + "\n".join(documents[20:]) + "\n", encoding="utf-8")
    return documents


def tokenize(tmp_path, tokenizer_dir, source, workers=1, **options):
    out = tmp_path / f"corpus-{workers}"
    vocab_size = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    metrics = tokenize_corpus(source, tokenizer_dir / "tokenizer.json", vocab_size, out, seed=3,
                              heldout_fraction=0.2, workers=workers, **options)
    return out, metrics


def test_every_token_of_every_document_is_stored_once(tmp_path, trained_tokenizer):
    tokenizer_dir, tokenizer = trained_tokenizer
    documents = write_corpus(tmp_path / "corpus.txt")
    out, metrics = tokenize(tmp_path, tokenizer_dir, CorpusSource("text", str(tmp_path / "corpus.txt")))
    expected = [tokenizer(document, add_special_tokens=False)["input_ids"] for document in documents]
    corpus = TokenizedCorpus(out)
    ids = np.fromfile(out / "ids.bin", dtype=np.uint16)
    assert metrics["n_documents"] == len(documents) == len(corpus.doc_offsets) - 1  # blank lines are no documents
    assert ids.tolist() == sum(expected, [])
    assert metrics["n_tokens"] == len(ids) and metrics["dtype"] == "uint16"
    # Token counts: the training documents' ids only (the hold-out's are not counted).
    train_ids = sum((ids_ for ids_, held in zip(expected, corpus.doc_is_heldout) if not held), [])
    assert corpus.token_counts().tolist() == np.bincount(train_ids, minlength=len(tokenizer)).tolist()
    assert not (out / "pieces").exists()


def test_sequences_cut_long_documents_into_chunks_and_drop_only_short_ones(tmp_path, trained_tokenizer):
    tokenizer_dir, tokenizer = trained_tokenizer
    documents = write_corpus(tmp_path / "corpus.txt")
    out, _ = tokenize(tmp_path, tokenizer_dir, CorpusSource("text", str(tmp_path / "corpus.txt")))
    corpus = TokenizedCorpus(out)
    sequences = corpus.sequences("train", max_seq_length=64)
    lengths = sequences.sequence_lengths()
    assert lengths.max() == 64 and lengths.min() >= MIN_SEQUENCE_TOKENS  # [CLS] + 62 ids + [SEP] at most
    # No text lost: the stored sequences hold every training token except those of chunks of 11 tokens or fewer.
    train_documents = [d for d, held in zip(documents, corpus.doc_is_heldout) if not held]
    chunk_lengths = []
    for document in train_documents:
        n = len(tokenizer(document, add_special_tokens=False)["input_ids"])
        chunk_lengths += [min(62, n - begin) for begin in range(0, n, 62)]
    kept = [n for n in chunk_lengths if n + 2 > 11]
    assert len(sequences) == len(kept) and sequences.n_tokens_total() == sum(kept) + 2 * len(kept)
    assert len(kept) < len(chunk_lengths)  # the headings were dropped
    # A long document's chunks are consecutive slices of its ids.
    long_document = next(i for i, d in enumerate(documents) if len(d.split()) > 300 and not corpus.doc_is_heldout[i])
    ids = tokenizer(documents[long_document], add_special_tokens=False)["input_ids"]
    pieces = [sequences[i].tolist() for i in range(len(sequences))]
    assert ids[:62] in pieces and ids[62:124] in pieces


def test_the_stage_counts_the_vocabulary_as_transformers_does_added_tokens_too(tmp_path, trained_tokenizer):
    from transformers import AutoTokenizer

    from pipeline.stages import tokenize_corpus as stage

    tokenizer_dir, _ = trained_tokenizer
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)  # its own copy: the fixture's is shared
    added = tokenizer.add_tokens(["riverbank", "swimmingly"])
    added += tokenizer.add_special_tokens({"additional_special_tokens": ["[EXTRA]"]})
    assert added == 3
    tokenizer.save_pretrained(tmp_path / "extended")
    for folder in (tokenizer_dir, tmp_path / "extended"):
        assert stage._vocab_size(folder) == len(AutoTokenizer.from_pretrained(folder))
    assert stage._vocab_size(tmp_path / "extended") == stage._vocab_size(tokenizer_dir) + added


def test_chunk_boundaries_by_hand():
    offsets = np.array([0, 5, 5 + 130, 5 + 130 + 20])  # documents of 5, 130 and 20 ids
    starts, lengths = chunk_documents(offsets, np.array([0, 1, 2]), max_seq_length=64)
    # 5 ids -> a 7-token sequence: dropped; 130 -> 62 + 62 + 6 (the 8-token tail is dropped); 20 -> kept.
    assert starts.tolist() == [5, 67, 135] and lengths.tolist() == [62, 62, 20]
    with pytest.raises(ValueError, match="max_seq_length"):
        chunk_documents(offsets, np.array([0]), max_seq_length=2)


def test_the_output_is_the_same_whatever_the_workers_and_pieces_split_no_line(tmp_path, trained_tokenizer, monkeypatch):
    tokenizer_dir, _ = trained_tokenizer
    write_corpus(tmp_path / "corpus.txt", n_documents=90)
    monkeypatch.setattr(corpus_writer, "TEXT_PIECE_BYTES", 997)  # many pieces, boundaries inside lines
    source = CorpusSource("text", str(tmp_path / "corpus.txt"))
    one, one_metrics = tokenize(tmp_path, tokenizer_dir, source, workers=1)  # in this process: nothing forks
    two = tokenize_in_a_fresh_process(tmp_path, tokenizer_dir, source, workers=2, piece_bytes=997)
    assert one_metrics["n_pieces"] > 10 and one_metrics["n_documents"] == 90
    for name in ("ids.bin", "doc_offsets.npy", "doc_is_heldout.npy", "token_counts.npy", "corpus.json"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    # The counts summed over many pieces (and the hold-out's taken off) equal one bincount of the training ids.
    corpus = TokenizedCorpus(one)
    ids = np.fromfile(one / "ids.bin", dtype=np.uint16)
    training = [ids[start:end] for start, end, held in zip(corpus.doc_offsets[:-1], corpus.doc_offsets[1:],
                                                            corpus.doc_is_heldout) if not held]
    assert 0 < len(training) < 90
    vocab_size = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    assert corpus.token_counts().tolist() == np.bincount(np.concatenate(training), minlength=vocab_size).tolist()


def tokenize_in_a_fresh_process(tmp_path, tokenizer_dir, source, workers, piece_bytes):
    """tokenize() in a new interpreter, as the stage runs: its workers are forked from a process that runs one
    thread. Forked from this test process, whose other threads (runtimes' pools) may hold a lock at that moment, a
    worker can wait for that lock for ever."""
    out = tmp_path / f"corpus-{workers}"
    script = textwrap.dedent(f"""
        from pathlib import Path
        from tokenizers import Tokenizer
        import pipeline.data.corpus_writer as corpus
        corpus.TEXT_PIECE_BYTES = {piece_bytes}
        tokenizer_file = Path({str(tokenizer_dir / "tokenizer.json")!r})
        corpus.tokenize_corpus(corpus.CorpusSource({source.kind!r}, {source.location!r}), tokenizer_file,
                               Tokenizer.from_file(str(tokenizer_file)).get_vocab_size(), Path({str(out)!r}),
                               seed=3, heldout_fraction=0.2, workers={workers})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=PROJECT_ROOT)
    return out


def test_json_lines_sources_max_documents_and_bad_sources(tmp_path, trained_tokenizer):
    tokenizer_dir, tokenizer = trained_tokenizer
    records = [{"text": f"the river city {i} north museum", "id": i} for i in range(10)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    source = corpus_source(DataConfig(corpus=str(tmp_path / "c.jsonl")), tmp_path)
    assert source.kind == "jsonl"
    out, metrics = tokenize(tmp_path, tokenizer_dir, source, max_documents=4)
    assert metrics["n_documents"] == 4
    first_four = sum((tokenizer(r["text"], add_special_tokens=False)["input_ids"] for r in records[:4]), [])
    assert np.fromfile(out / "ids.bin", dtype=np.uint16).tolist() == first_four
    with pytest.raises(ConfigError, match="data.corpus_text_column: 'body'"):
        tokenize(tmp_path / "x", tokenizer_dir, CorpusSource("jsonl", str(tmp_path / "c.jsonl"), text_column="body"))
    with pytest.raises(ConfigError, match="data.corpus: file not found: ./missing.txt"):
        corpus_source(DataConfig(corpus="./missing.txt"), tmp_path)
    assert corpus_source(DataConfig(corpus="wikimedia/wikipedia"), tmp_path).kind == "hub"
    assert corpus_source(DataConfig(corpus="synthetic"), tmp_path).location == str(tmp_path / "corpus.txt")


def test_the_holdout_is_a_seeded_choice_of_documents_by_index():
    index = np.arange(20_000)
    chosen = is_heldout(index, seed=1, fraction=0.05)
    assert 0.04 < chosen.mean() < 0.06
    assert np.array_equal(chosen, is_heldout(index, seed=1, fraction=0.05))  # a function of (seed, index)
    assert not np.array_equal(chosen, is_heldout(index, seed=2, fraction=0.05))
    assert np.array_equal(chosen[500:600], is_heldout(index[500:600], seed=1, fraction=0.05))  # streamable


def test_token_budget_batches_cover_each_sequence_once_per_epoch_and_shard_evenly():
    lengths = np.random.default_rng(0).integers(12, 129, size=1001)
    batches = token_budget_batches(lengths, max_tokens=1024, seed=5, epoch=0)
    assert sorted(np.concatenate(batches).tolist()) == list(range(1001))  # every sequence exactly once
    assert all(len(b) * lengths[b].max() <= 1024 for b in batches)
    padded = sum(len(b) * lengths[b].max() for b in batches)
    assert padded < 1.05 * lengths.sum()  # similar lengths share a batch: little padding
    assert all(np.array_equal(a, b) for a, b in zip(batches, token_budget_batches(lengths, 1024, 5, 0)))
    assert not all(np.array_equal(a, b) for a, b in zip(batches, token_budget_batches(lengths, 1024, 5, 1)))
    # Two ranks: as many batches each; together every sequence, repeats only in the padding batch.
    sharded = token_budget_batches(lengths, 1024, 5, 0, world_size=2)
    ranks = [sharded[rank::2] for rank in range(2)]
    assert len(ranks[0]) == len(ranks[1]) and len(sharded) - len(batches) <= 1
    assert set(np.concatenate(sharded).tolist()) == set(range(1001))
    with pytest.raises(ConfigError, match="max_tokens_per_batch 64"):
        token_budget_batches(lengths, 64, 5, 0)


def test_a_masked_batch_carries_the_rows_each_loss_reads(trained_tokenizer):
    _, tokenizer = trained_tokenizer
    sequences = [np.arange(10, 40), np.arange(50, 62)]
    collator = MaskedBatchCollator(tokenizer, 0.3)
    batch = collator(sequences, torch.Generator().manual_seed(4))
    again = collator(sequences, torch.Generator().manual_seed(4))
    assert all(torch.equal(batch[k], again[k]) for k in batch if isinstance(batch[k], torch.Tensor))  # its generator only
    assert batch["input_ids"].shape == (2, 32) and batch["n_tokens"] == 32 + 14 == batch["loss_tokens"]
    assert batch["attention_mask"][1].sum() == 14
    flat_mask = batch["attention_mask"].flatten()
    assert flat_mask[batch["token_positions"]].all() and len(batch["token_positions"]) == 46
    labels = batch["labels"].flatten()
    assert torch.equal(batch["masked_positions"], labels.ne(-100).nonzero().squeeze(1))
    assert torch.equal(batch["masked_labels"], labels[batch["masked_positions"]])
    assert torch.equal(batch["token_positions"][batch["masked_in_tokens"]], batch["masked_positions"])
    assert len(batch["masked_positions"]) == round(0.3 * 42)  # [CLS] and [SEP] are never chosen
    originals = torch.cat([torch.tensor([tokenizer.cls_token_id]), torch.arange(10, 40),
                           torch.tensor([tokenizer.sep_token_id])])
    assert torch.equal(batch["labels"][0][batch["labels"][0] != -100], originals[batch["labels"][0] != -100])


class TinyMaskedLM(torch.nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, 8)
        self.head = torch.nn.Linear(8, vocab_size)


def test_the_training_step_reads_loss_tensors_on_the_host_only_at_log_steps(tmp_path, trained_tokenizer, monkeypatch):
    # On a GPU every .item() / float() / int() / tolist() of a device tensor waits for the device. The loop's own
    # code (pipeline/) may read tensors only when it logs: count those reads over a run of 12 steps, logging every
    # 4. Batches are built in a loader worker, a process of its own.
    import pipeline
    from pipeline.training import loop

    _, tokenizer = trained_tokenizer
    model = TinyMaskedLM(len(tokenizer))
    sequences = [np.random.default_rng(i).integers(10, 300, size=20 + i % 30) for i in range(64)]
    collator = MaskedBatchCollator(tokenizer, 0.15)

    def compute_loss(batch):
        hidden = model.embedding(batch["input_ids"]).flatten(0, 1).index_select(0, batch["masked_positions"])
        loss = torch.nn.functional.cross_entropy(model.head(hidden), batch["masked_labels"])
        return {"loss": loss, "mlm": loss.detach()}

    reads = []
    pipeline_dir = str(Path(pipeline.__file__).parent)

    def counting(original):
        def read(self, *args, **kwargs):
            import sys

            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(pipeline_dir):
                reads.append(caller)
            return original(self, *args, **kwargs)
        return read

    for name in ("item", "__float__", "__int__", "__bool__", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
    cfg = TrainConfig(max_steps=12, grad_accum_steps=2, log_every=4, checkpoint_every=100, learning_rate=1e-3,
                      dataloader_workers=1, max_tokens_per_batch=256)
    lengths = np.array([len(s) + 2 for s in sequences])
    result = loop.train(
        module=model, compute_loss=compute_loss, examples=sequences, collate=collator, cfg=cfg, seed=1,
        device=torch.device("cpu"), checkpoint_dir=tmp_path / "ckpt", log_path=tmp_path / "log.jsonl",
        fingerprint="f", batch_plan=lambda epoch: token_budget_batches(lengths, 256, 1, epoch),
        example_tokens=lengths,
    )
    assert result.steps == 12 and len((tmp_path / "log.jsonl").read_text().splitlines()) == 3
    assert len(reads) == 3, reads  # one read per log step: every term and count in one transfer
