"""Masked-language-model data shared by teacher pretraining and pretraining distillation."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.data import read_corpus_lines  # noqa: F401 (the MLM stages read their corpus through here)
from pipeline.masking import mask_tokens


def tokenize_corpus(lines: list[str], tokenizer: Any, max_seq_length: int) -> list[list[int]]:
    """One [CLS] line [SEP] sequence per corpus line, truncated; no sentence pairs (no NSP)."""
    encoded = tokenizer(lines, truncation=True, max_length=max_seq_length, add_special_tokens=True)
    return encoded["input_ids"]


def collate_sequences(sequences: list[list[int]], pad_token_id: int, special_token_ids: list[int]) -> dict:
    """Pad a batch on the right; mark special tokens (never masked)."""
    length = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention_mask[row, : len(sequence)] = 1
    special_tokens_mask = torch.isin(input_ids, torch.tensor(special_token_ids))
    return {"input_ids": input_ids, "attention_mask": attention_mask, "special_tokens_mask": special_tokens_mask}


def special_token_ids(tokenizer: Any) -> list[int]:
    return sorted(set(tokenizer.all_special_ids))


@torch.no_grad()
def masked_token_accuracy(
    models: dict[str, torch.nn.Module],
    sequences: list[list[int]],
    tokenizer: Any,
    mlm_probability: float,
    seed: int,
    device: torch.device,
    batch_size: int = 64,
) -> dict[str, float]:
    """Top-1 accuracy at masked positions on held-out sequences, for each model on the SAME masks.

    The masks come from a generator seeded with `seed`, so student and teacher are scored on identical
    inputs and the number is reproducible.
    """
    generator = torch.Generator().manual_seed(seed)
    specials = special_token_ids(tokenizer)
    correct = {name: 0 for name in models}
    total = 0
    states = {name: model.training for name, model in models.items()}
    for model in models.values():
        model.eval()
    for begin in range(0, len(sequences), batch_size):
        batch = collate_sequences(sequences[begin : begin + batch_size], tokenizer.pad_token_id, specials)
        masked, labels = mask_tokens(
            batch["input_ids"], batch["special_tokens_mask"], tokenizer.mask_token_id, len(tokenizer),
            mlm_probability, generator=generator,
        )
        selected = labels != -100
        total += int(selected.sum())
        for name, model in models.items():
            logits = model(input_ids=masked.to(device), attention_mask=batch["attention_mask"].to(device)).logits
            predictions = logits[selected.to(device)].argmax(-1).cpu()
            correct[name] += int((predictions == labels[selected]).sum())
    for name, model in models.items():
        model.train(states[name])
    return {name: correct[name] / max(total, 1) for name in models} | {"n_masked_tokens": total}
