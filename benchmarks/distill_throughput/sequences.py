"""What the FLOP count reads of a batch: each sequence's real length, counted in the collate, summed per timed span."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from benchmarks.distill_throughput.flops import EncoderShape, model_flops

LENGTHS_KEY, HEAD_ROWS_KEY, EXECUTED_TOKENS_KEY = "count_sequence_lengths", "count_head_rows", "count_executed_tokens"


def real_sequence_lengths(batch: dict) -> tuple[int, ...]:
    """Each sequence's real tokens ([CLS] and [SEP] included) of a MaskedBatchCollator batch on the CPU: the rows of
    its attention mask, or the packed layout's sequences before its padding sequences."""
    if "cu_seqlens" not in batch:
        return tuple(int(n) for n in batch["attention_mask"].sum(dim=1).tolist())
    n_real, lengths, total = int(batch["n_tokens"]), [], 0
    for length in batch["cu_seqlens"].diff().tolist():
        if total >= n_real:
            break  # the padding sequences come after the real ones (pipeline.data.mlm_batches.pack_masked_batch)
        lengths.append(int(length))
        total += int(length)
    if total != n_real:
        raise ValueError(f"packed batch: its sequences hold {total} tokens before the padding, n_tokens says {n_real}")
    return tuple(lengths)


class CountingCollate:
    """The stage's collate, plus three host numbers the FLOP count reads: each sequence's real length, the rows
    the vocabulary head reads, and the rows the encoders run on (padding included). Counted on the CPU, in the
    loader's worker: nothing is read back from the device."""

    def __init__(self, collate, restrict_ce_to_mask: bool):
        self.collate, self.restrict_ce_to_mask = collate, restrict_ce_to_mask

    def __call__(self, sequences, generator=None) -> dict:
        batch = self.collate(sequences, generator)
        batch[LENGTHS_KEY] = real_sequence_lengths(batch)
        batch[HEAD_ROWS_KEY] = len(batch["masked_positions"]) if self.restrict_ce_to_mask else int(batch["n_tokens"])
        batch[EXECUTED_TOKENS_KEY] = batch["input_ids"].numel()
        return batch


@dataclass
class SpanCounts:
    """Tokens and model FLOPs of the micro-batches of a timed span."""

    teacher: EncoderShape
    student: EncoderShape
    micro_batches: int = 0
    tokens: int = 0
    executed_tokens: int = 0
    flops: collections.Counter = field(default_factory=collections.Counter)
    batch_rows: list = field(default_factory=list)  # (encoder rows, head rows) of each micro-batch

    def add(self, batch: dict) -> None:
        self.micro_batches += 1
        self.tokens += int(batch["n_tokens"])
        self.executed_tokens += int(batch[EXECUTED_TOKENS_KEY])
        self.flops.update(model_flops(self.teacher, self.student, batch[LENGTHS_KEY], batch[HEAD_ROWS_KEY]))
        self.batch_rows.append((int(batch[EXECUTED_TOKENS_KEY]), int(batch[HEAD_ROWS_KEY])))
