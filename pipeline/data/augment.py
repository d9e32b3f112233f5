"""Task-stage data augmentation (Jiao et al. 2019, TinyBERT): training windows the teacher labels.

Each augmented copy of a training window replaces some whole words by words a masked language model predicts
in their place, so the student sees new contexts and questions, with soft targets from the QA teacher and no
gold span. TinyBERT's recipe: every single-piece word is, with probability p_t, masked and replaced by one of
the MLM's K most likely words (p_t 0.4, K 15); words of several pieces take GloVe neighbours there, which this
pipeline has no vectors for, so they stay as they are.

The replacement happens on token ids inside the windows, so every window keeps its length and layout
([CLS] question [SEP] context [SEP]). Differences from the reference, both for speed: all chosen words of a
window are masked in one forward pass instead of one pass per word, and the language model scores only the
masked positions.
"""

from __future__ import annotations

import torch

from pipeline.runtime import squad

NO_GOLD_POSITION = -1  # start/end label of an augmented window: the task loss skips it


def replaceable_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, tokenizer) -> torch.Tensor:
    """[windows, seq] bool: tokens that are whole single-piece words (no special token, no ## piece before or after).

    A window's last real token may be the first piece of a word cut by the window edge; its continuation is not
    visible, so it is treated as a whole word (replacing it keeps the window well formed either way).
    """
    continuation = continuation_token_mask(tokenizer)[input_ids]
    special = torch.zeros_like(input_ids, dtype=torch.bool)
    for token_id in tokenizer.all_special_ids:
        special |= input_ids == token_id
    followed_by_piece = torch.zeros_like(continuation)
    followed_by_piece[:, :-1] = continuation[:, 1:]
    return attention_mask.bool() & ~special & ~continuation & ~followed_by_piece


def continuation_token_mask(tokenizer) -> torch.Tensor:
    """[vocab] bool: word-piece continuations ("##ing"), which cannot stand as a word."""
    mask = torch.zeros(len(tokenizer), dtype=torch.bool)
    for token, token_id in tokenizer.get_vocab().items():
        if token.startswith("##"):
            mask[token_id] = True
    return mask


@torch.no_grad()
def augment_windows(
    mlm,
    windows: dict[str, torch.Tensor],
    tokenizer,
    copies: int,
    replace_probability: float,
    top_k: int,
    generator: torch.Generator,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """``copies`` augmented versions of every window, stacked copy after copy.

    Inputs other than ``input_ids`` are repeated unchanged; start and end labels become NO_GOLD_POSITION.
    Candidates exclude special tokens and ## pieces, so a replacement is always a whole word.
    """
    if copies < 1:
        raise ValueError(f"augment_windows: copies must be at least 1, got {copies}")
    banned = continuation_token_mask(tokenizer)
    banned[tokenizer.all_special_ids] = True
    banned = banned.to(device)
    eligible = replaceable_positions(windows["input_ids"], windows["attention_mask"], tokenizer)
    mlm.eval()
    head = _mlm_head(mlm)
    # Windows are right-padded; batches of similar length, each cut to its longest window, skip most padding.
    batches = list(squad.batches_by_length(windows["attention_mask"].sum(dim=1).numpy(), batch_size))
    augmented_ids = []
    for _ in range(copies):
        ids = windows["input_ids"].clone()
        chosen = eligible & (torch.rand(ids.shape, generator=generator) < replace_probability)
        # One uniform draw per chosen position picks among the K candidates (TinyBERT samples uniformly).
        picks = torch.randint(0, top_k, ids.shape, generator=generator)
        for rows, length in batches:
            rows = torch.from_numpy(rows)
            batch_chosen = chosen[rows, :length]
            if not batch_chosen.any():
                continue
            batch_ids = ids[rows, :length]
            inputs = {"input_ids": batch_ids.masked_fill(batch_chosen, tokenizer.mask_token_id).to(device),
                      "attention_mask": windows["attention_mask"][rows, :length].to(device)}
            if "token_type_ids" in windows and getattr(mlm.config, "type_vocab_size", 0) > 1:
                inputs["token_type_ids"] = windows["token_type_ids"][rows, :length].to(device)
            hidden = mlm.base_model(**inputs).last_hidden_state
            logits = head(hidden[batch_chosen.to(device)]).float().masked_fill(banned, float("-inf"))
            candidates = logits.topk(top_k, dim=-1).indices
            replacement = candidates.gather(1, picks[rows, :length][batch_chosen].to(device)[:, None]).squeeze(1)
            batch_ids[batch_chosen] = replacement.cpu()
            ids[rows, :length] = batch_ids
        augmented_ids.append(ids)
    out = {name: tensor.repeat(copies, *[1] * (tensor.dim() - 1)) for name, tensor in windows.items()}
    out["input_ids"] = torch.cat(augmented_ids)
    for label in ("start_positions", "end_positions"):
        if label in out:
            out[label] = torch.full_like(out[label], NO_GOLD_POSITION)
    return out


def _mlm_head(mlm):
    """The prediction head of a masked-LM model: BERT's ``cls``, DistilBERT's transform + projector."""
    if hasattr(mlm, "cls"):
        return mlm.cls
    if hasattr(mlm, "vocab_projector"):
        def head(hidden):
            hidden = mlm.activation(mlm.vocab_transform(hidden))
            return mlm.vocab_projector(mlm.vocab_layer_norm(hidden))
        return head
    raise ValueError(f"{type(mlm).__name__}: no known masked-LM head (expected BERT's cls or DistilBERT's projector)")
