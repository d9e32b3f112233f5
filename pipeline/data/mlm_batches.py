"""Masked-language-model batches shared by teacher pretraining and pretraining distillation.

A batch is built and masked on the CPU (in a DataLoader worker when the stage has some), and carries the flat
indices of the rows each loss reads, so the step on the device selects rows with index_select and never needs
a boolean mask's count from the host (a GPU sync).
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np
import torch

from pipeline.data.masking import mask_tokens


def special_token_ids(tokenizer: Any) -> list[int]:
    return sorted(set(tokenizer.all_special_ids))


class MaskedBatchCollator:
    """Sequences of ids (no [CLS]/[SEP]) -> a dynamically masked batch.

    Keys: input_ids (masked) and attention_mask [B, S]; labels [B, S] (-100 except at selected positions);
    token_positions (flat indices of the non-padding positions), masked_positions (flat indices of the selected
    ones), masked_labels (their true ids), masked_in_tokens (where each selected position sits among
    token_positions); n_tokens and loss_tokens (host integers: real tokens, for throughput and per-token loss
    weighting).

    With `pack_to_multiple_of`, the same masked batch comes packed: one flat sequence of its real tokens with
    cumulative sequence lengths, padded to a multiple of that many tokens (pipeline.distillation.packed_encoder)."""

    def __init__(self, tokenizer: Any, mlm_probability: float, selection_weights: torch.Tensor | None = None,
                 pack_to_multiple_of: int | None = None):
        self.cls_id, self.sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        self.pad_id, self.mask_id = tokenizer.pad_token_id, tokenizer.mask_token_id
        self.vocab_size = len(tokenizer)
        self.special_ids = torch.tensor(special_token_ids(tokenizer))
        self.mlm_probability = mlm_probability
        self.selection_weights = None if selection_weights is None else selection_weights.cpu()
        self.pack_to_multiple_of = pack_to_multiple_of

    def __call__(self, sequences: Sequence[np.ndarray], generator: torch.Generator | None = None) -> dict:
        batch = self.pad(sequences)
        masked, labels = mask_tokens(
            batch["input_ids"], batch["special_tokens_mask"], self.mask_id, self.vocab_size, self.mlm_probability,
            selection_weights=self.selection_weights, generator=generator,
        )
        flat_labels = labels.flatten()
        token_positions = batch["attention_mask"].flatten().nonzero().squeeze(1)
        masked_positions = flat_labels.ne(-100).nonzero().squeeze(1)
        padded = {
            "input_ids": masked,
            "attention_mask": batch["attention_mask"],
            "labels": labels,
            "token_positions": token_positions,
            "masked_positions": masked_positions,
            "masked_labels": flat_labels[masked_positions],
            "masked_in_tokens": torch.searchsorted(token_positions, masked_positions),
            "n_tokens": len(token_positions),
            "loss_tokens": len(token_positions),
        }
        if self.pack_to_multiple_of:
            return pack_masked_batch(padded, self.pad_id, self.pack_to_multiple_of)
        return padded

    def pad(self, sequences: Sequence[np.ndarray]) -> dict[str, torch.Tensor]:
        """[CLS] ids [SEP], right-padded to the batch's longest; special_tokens_mask marks what is never masked."""
        length = max(len(s) for s in sequences) + 2
        input_ids = torch.full((len(sequences), length), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
        for row, sequence in enumerate(sequences):
            n = len(sequence)
            input_ids[row, 0] = self.cls_id
            input_ids[row, 1 : n + 1] = torch.from_numpy(np.asarray(sequence, dtype=np.int64))
            input_ids[row, n + 1] = self.sep_id
            attention_mask[row, : n + 2] = 1
        special_tokens_mask = torch.isin(input_ids, self.special_ids)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "special_tokens_mask": special_tokens_mask}


def pack_masked_batch(batch: dict, pad_token_id: int, tokens_multiple_of: int) -> dict:
    """A padded, masked batch (MaskedBatchCollator's keys) as one flat sequence of its real tokens, the input of
    pipeline.distillation.packed_encoder.

    Keys: input_ids, position_ids, labels [T] (T = the real tokens rounded up to a multiple of
    tokens_multiple_of); cu_seqlens int32 [sequences + 1], where the padding, when there is some, is cut into
    sequences of its own no longer than the batch's longest (so it never widens the attention); max_seqlen (host
    int, the longest sequence); and the row indices every loss reads, unchanged in meaning: real token k of the
    padded batch (in row-major order) is flat token k, so token_positions is 0..n-1 and masked_positions is the
    padded batch's masked_in_tokens. Masks, labels, n_tokens and loss_tokens are the padded batch's."""
    real = batch["attention_mask"].bool()
    lengths = real.sum(dim=1).tolist()
    n_real, longest = sum(lengths), max(lengths)
    n_tokens = -(-n_real // tokens_multiple_of) * tokens_multiple_of
    padding = n_tokens - n_real
    padding_lengths = [longest] * (padding // longest) + ([padding % longest] if padding % longest else [])
    sequence_lengths = lengths + padding_lengths

    input_ids = torch.full((n_tokens,), pad_token_id, dtype=torch.long)
    input_ids[:n_real] = batch["input_ids"][real]
    labels = torch.full((n_tokens,), -100, dtype=torch.long)
    labels[:n_real] = batch["labels"][real]
    position_ids = torch.zeros(n_tokens, dtype=torch.long)  # padding tokens sit at position 0
    position_ids[:n_real] = torch.arange(real.shape[1]).expand_as(real)[real]
    cu_seqlens = torch.zeros(len(sequence_lengths) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.tensor(sequence_lengths).cumsum(0)
    return {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "cu_seqlens": cu_seqlens,
        "max_seqlen": longest,
        "labels": labels,
        "token_positions": torch.arange(n_real),
        "masked_positions": batch["masked_in_tokens"],
        "masked_labels": batch["masked_labels"],
        "masked_in_tokens": batch["masked_in_tokens"],
        "n_tokens": batch["n_tokens"],
        "loss_tokens": batch["loss_tokens"],
    }


def rows(hidden: torch.Tensor, flat_positions: torch.Tensor) -> torch.Tensor:
    """Rows of a [B, S, H] tensor at flat positions (b * S + s): [N, H], with no host sync."""
    return hidden.flatten(0, 1).index_select(0, flat_positions)


# Held-out sequences scored: about 60,000 masked tokens at 128 tokens a sequence (a standard error near 0.2
# points), whatever the corpus: the hold-out of a 1 GB corpus alone would take hours to score twice on a CPU.
MAX_HELDOUT_SEQUENCES = 4096


@torch.no_grad()
def masked_token_accuracy(
    models: dict[str, torch.nn.Module],
    sequences: Sequence[np.ndarray],
    collator: MaskedBatchCollator,
    seed: int,
    device: torch.device,
    batch_size: int = 64,
) -> dict[str, float]:
    """Top-1 accuracy at masked positions on held-out sequences, for each model on the SAME masks.

    The masks come from a generator seeded with `seed`, so student and teacher are scored on identical
    inputs and the number is reproducible. Smoothing is off: every real token is equally likely to be scored.
    At most MAX_HELDOUT_SEQUENCES sequences are scored.
    """
    generator = torch.Generator().manual_seed(seed)
    uniform = copy.copy(collator)
    uniform.selection_weights = None
    uniform.pack_to_multiple_of = None  # scored by the Hugging Face models themselves, on padded batches
    correct = {name: 0 for name in models}
    total = 0
    states = {name: model.training for name, model in models.items()}
    for model in models.values():
        model.eval()
    n_scored = min(len(sequences), MAX_HELDOUT_SEQUENCES)  # the first ones: the hold-out is a random set already
    for begin in range(0, n_scored, batch_size):
        batch = uniform([sequences[i] for i in range(begin, min(begin + batch_size, n_scored))], generator)
        total += len(batch["masked_positions"])
        for name, model in models.items():
            logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)).logits
            predictions = rows(logits, batch["masked_positions"].to(device)).argmax(-1).cpu()
            correct[name] += int((predictions == batch["masked_labels"]).sum())
    for name, model in models.items():
        model.train(states[name])
    return {name: correct[name] / max(total, 1) for name in models} | {"n_masked_tokens": total}
