"""Dynamic masking for masked-language modelling: fresh masks every batch, no next-sentence prediction.

Follows BERT (Devlin et al. 2019) and the DistilBERT reference distiller (Sanh et al. 2019): select
`mlm_probability` of the real tokens (see `mask_tokens` for how the count differs from the reference's), then
replace 80% of them with [MASK], 10% with a random token of the whole vocabulary and keep 10%. With token-frequency smoothing the selection probability of a token is proportional to
max(count, 1) ** -0.7, so frequent tokens are masked less often (DistilBERT's `mlm_smoothing`).
"""

from __future__ import annotations

import torch

MASK_RANDOM_KEEP = (0.8, 0.1, 0.1)  # BERT: [MASK] 80%, random token 10%, unchanged 10%
SMOOTHING_EXPONENT = 0.7  # DistilBERT reference distiller: mlm_smoothing = 0.7


def selection_weights_from_counts(
    counts: torch.Tensor, special_token_ids: list[int], exponent: float = SMOOTHING_EXPONENT
) -> torch.Tensor:
    """Per-vocabulary-id selection weights max(count, 1) ** -exponent; special tokens are never selected."""
    weights = counts.clamp(min=1).double().pow(-exponent).float()
    weights[special_token_ids] = 0.0
    return weights


def mask_tokens(
    input_ids: torch.Tensor,
    special_tokens_mask: torch.Tensor,
    mask_token_id: int,
    vocab_size: int,
    mlm_probability: float,
    selection_weights: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (masked input ids, labels); labels are -100 except at the selected positions.

    `special_tokens_mask` is True at [CLS]/[SEP]/[PAD] (never selected). Exactly
    max(1, round(mlm_probability x maskable tokens)) positions are selected per batch, where the maskable tokens
    are the non-special ones, drawn without replacement (weighted by `selection_weights` when given).

    How this differs from the DistilBERT reference distiller: it selects ceil(mlm_probability x all tokens) per
    batch, counting [CLS] and [SEP] although they can never be selected, so its real masked fraction is
    mlm_probability x (n + 2) / n for lines of n tokens (0.15 -> 0.165 on 20-token lines; more on short lines).
    Counting only maskable tokens keeps `mlm_probability` what it says (BERT's fraction of masked tokens) for
    any line length; round instead of ceil changes the count by at most one token per batch.
    """
    eligible = ~special_tokens_mask.bool()
    weights = eligible.float()
    if selection_weights is not None:
        weights = weights * selection_weights.to(input_ids.device)[input_ids]
    flat_weights = weights.flatten()
    n_eligible = int((flat_weights > 0).sum())
    labels = torch.full_like(input_ids, -100)
    if n_eligible == 0:
        return input_ids.clone(), labels
    n_selected = min(n_eligible, max(1, round(mlm_probability * int(eligible.sum()))))
    chosen = torch.multinomial(flat_weights, n_selected, replacement=False, generator=generator)
    selected = torch.zeros_like(flat_weights, dtype=torch.bool)
    selected[chosen] = True
    selected = selected.view_as(input_ids)

    labels[selected] = input_ids[selected]
    masked = input_ids.clone()
    # Split the selected positions into [MASK] / random token / unchanged.
    action = torch.multinomial(
        torch.tensor(MASK_RANDOM_KEEP), n_selected, replacement=True, generator=generator
    ).to(input_ids.device)
    positions = selected.nonzero(as_tuple=True)
    random_tokens = torch.randint(vocab_size, (n_selected,), generator=generator).to(input_ids.device)
    replacement = torch.where(action == 0, torch.full_like(random_tokens, mask_token_id), random_tokens)
    replacement = torch.where(action == 2, input_ids[positions], replacement)
    masked[positions] = replacement
    return masked, labels
