"""The batch plan of the training loop: example indices of each micro-batch as a function of (seed, epoch) only,
the loader that collates them ahead of the step, and each micro-batch's planned share of a step's tokens.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from transformers.trainer_pt_utils import get_length_grouped_indices

from pipeline.plan.config import TrainConfig
from pipeline.training.processes import ProcessGroup

Batch = dict[str, torch.Tensor]


def epoch_batches(
    n_examples: int, batch_size: int, seed: int, epoch: int, shuffle: bool = True,
    lengths: Sequence[int] | None = None,
) -> list[list[int]]:
    """Example indices of each batch of one epoch; the order depends only on (seed, epoch).

    With `lengths`, batches hold examples of similar length (see TrainConfig.group_by_length)."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    if lengths is not None:
        if len(lengths) != n_examples:
            raise ValueError(f"{len(lengths)} example lengths for {n_examples} examples")
        order = get_length_grouped_indices(list(lengths), batch_size, generator=generator)
    elif shuffle:
        order = torch.randperm(n_examples, generator=generator).tolist()
    else:
        order = list(range(n_examples))
    return [order[i : i + batch_size] for i in range(0, n_examples, batch_size)]


def shard(global_batch: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's part of a global batch: every world_size-th example, so each rank gets the same length mix.

    A short last batch is padded by repeating its first examples (as torch's DistributedSampler pads), so no
    rank is ever left without data."""
    if world_size == 1:
        return global_batch
    padded = list(global_batch)
    while len(padded) % world_size:
        padded.append(global_batch[(len(padded) - len(global_batch)) % len(global_batch)])
    return padded[rank::world_size]


# An epoch plan: epoch -> every batch of the epoch for all ranks together (a multiple of world_size of them,
# batch b for rank b % world_size), each a list or array of example indices. The MLM stages pass a token-budget
# plan (pipeline.data.corpus.token_budget_batches); without one, batches hold batch_size examples.
EpochPlan = Callable[[int], Sequence[Sequence[int]]]


def examples_per_batch_plan(
    n_examples: int, batch_size: int, seed: int, world_size: int, lengths: Sequence[int] | None = None,
) -> EpochPlan:
    """batch_size examples per rank and micro-batch: global batches of batch_size x world_size examples (length
    grouped when `lengths` are given), each split between the ranks by `shard`."""

    def plan(epoch: int) -> list[list[int]]:
        batches = []
        for global_batch in epoch_batches(n_examples, batch_size * world_size, seed, epoch, lengths=lengths):
            batches.extend(shard(global_batch, rank, world_size) for rank in range(world_size))
        return batches

    return plan


def rank_batches(plan: EpochPlan, epoch: int, group: ProcessGroup) -> Sequence[Sequence[int]]:
    return plan(epoch)[group.rank :: group.world_size]


def planned_positions(
    plan: EpochPlan, start_micro_batch: int, total_micro_batches: int, group: ProcessGroup = ProcessGroup(),
) -> Iterator[tuple[int, Sequence[int]]]:
    """(position, example indices) of this rank's micro-batches in order, epoch after epoch, from
    `start_micro_batch` on. Positions count this rank's micro-batches, the same on every rank, so a resumed run
    restarts every rank where it stopped."""
    epoch, epoch_start = 0, 0  # epoch_start: the position of the epoch's first micro-batch
    while epoch_start < total_micro_batches:
        batches = rank_batches(plan, epoch, group)
        if not batches:
            raise ValueError("an epoch without batches: no training examples")
        for offset in range(max(0, start_micro_batch - epoch_start), len(batches)):
            if epoch_start + offset >= total_micro_batches:
                return
            yield epoch_start + offset, batches[offset]
        epoch_start += len(batches)
        epoch += 1


class _PlannedPositions:
    """The loader's sampler: planned_positions, computed lazily one epoch at a time."""

    def __init__(self, plan: EpochPlan, start: int, total: int, group: ProcessGroup):
        self.plan, self.start, self.total, self.group = plan, start, total, group

    def __iter__(self) -> Iterator[tuple[int, Sequence[int]]]:
        return planned_positions(self.plan, self.start, self.total, self.group)


def batch_generator(seed: int, rank: int, position: int) -> torch.Generator:
    """The random source of one batch's collate (dynamic masking): a function of (seed, rank, position) only."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + rank) * 10_000_019 + position) % 2**63)


class PlannedBatches(torch.utils.data.Dataset):
    """Map-style dataset over (position, indices) items: a loader worker reads the examples of one micro-batch
    and collates them, with that batch's own generator."""

    def __init__(self, examples: Sequence[Any], collate: Callable, seed: int, rank: int):
        self.examples, self.collate, self.seed, self.rank = examples, collate, seed, rank

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, item: tuple[int, Sequence[int]]) -> Batch:
        position, indices = item
        return self.collate([self.examples[int(i)] for i in indices], batch_generator(self.seed, self.rank, position))


def _keep_as_is(batch: Batch) -> Batch:
    return batch


def micro_batch_loader(
    examples: Sequence[Any],
    collate: Callable,
    plan: EpochPlan,
    seed: int,
    start_micro_batch: int,
    total_micro_batches: int,
    group: ProcessGroup = ProcessGroup(),
    workers: int = 0,
    pin_memory: bool = False,
) -> torch.utils.data.DataLoader:
    """This rank's remaining micro-batches through a DataLoader: `workers` processes read and collate them (with
    masking) ahead of the step, in order; pinned memory makes the copy to a GPU asynchronous."""
    return torch.utils.data.DataLoader(
        PlannedBatches(examples, collate, seed, group.rank),
        sampler=_PlannedPositions(plan, start_micro_batch, total_micro_batches, group),
        batch_size=None,  # each item is already a whole micro-batch
        collate_fn=_keep_as_is,
        num_workers=workers,
        pin_memory=pin_memory,
        # The loader's base seed comes from this generator, never from the global RNG that dropout uses.
        generator=torch.Generator().manual_seed(seed),
        persistent_workers=False,
    )


def micro_batch_stream(
    examples: Sequence[Any],
    collate: Callable,
    batch_size: int,
    seed: int,
    start_micro_batch: int,
    total_micro_batches: int,
    lengths: Sequence[int] | None = None,
    group: ProcessGroup = ProcessGroup(),
) -> Iterator[Batch]:
    """The micro-batches of the examples-per-batch plan in order, collated in this process (tests, tools)."""
    plan = examples_per_batch_plan(len(examples), batch_size, seed, group.world_size, lengths)
    dataset = PlannedBatches(examples, collate, seed, group.rank)
    for item in planned_positions(plan, start_micro_batch, total_micro_batches, group):
        yield dataset[item]


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def count_optimizer_steps(cfg: TrainConfig, batches_per_epoch: int) -> tuple[int, int]:
    """(optimizer steps, micro-batches per rank) of the run: max_steps when set, else `epochs` passes over
    epochs of `batches_per_epoch` micro-batches per rank."""
    if cfg.max_steps:
        return cfg.max_steps, cfg.max_steps * cfg.grad_accum_steps
    micro_batches = max(1, math.ceil(cfg.epochs * batches_per_epoch))
    steps = math.ceil(micro_batches / cfg.grad_accum_steps)
    return steps, steps * cfg.grad_accum_steps


def planned_token_weights(
    plan: EpochPlan, example_tokens: Sequence[int], start_step: int, total_steps: int, grad_accum_steps: int,
    group: ProcessGroup = ProcessGroup(),
) -> Iterator[list[tuple[int, float]]]:
    """For each optimizer step from `start_step` on, (tokens, weight) of each of this rank's micro-batches, from the
    batch plan alone: nothing is read from the device and no collective is needed.

    A micro-batch's tokens are the sum of its examples' `example_tokens`; its weight is its share of the tokens of
    the whole step (every micro-batch of every rank), times world_size because DDP averages gradients over ranks.
    Each micro-batch's mean loss times its weight then sums to the per-token mean of the whole step."""
    tokens = np.asarray(example_tokens, dtype=np.int64)
    positions = _tokens_of_every_rank_by_position(plan, tokens, start_step * grad_accum_steps,
                                                  total_steps * grad_accum_steps, group.world_size)
    for _ in range(start_step, total_steps):
        step = [next(positions) for _ in range(grad_accum_steps)]
        step_tokens = sum(int(counts.sum()) for counts in step)
        yield [(int(counts[group.rank]), int(counts[group.rank]) * group.world_size / step_tokens) for counts in step]


def _tokens_of_every_rank_by_position(
    plan: EpochPlan, tokens: np.ndarray, start_micro_batch: int, total_micro_batches: int, world_size: int,
) -> Iterator[np.ndarray]:
    """Token counts [world_size] of every rank's micro-batch at each position, in the order of planned_positions."""
    epoch, epoch_start = 0, 0
    while epoch_start < total_micro_batches:
        batches = plan(epoch)
        per_rank = len(batches) // world_size  # batch b goes to rank b % world_size
        for offset in range(max(0, start_micro_batch - epoch_start), per_rank):
            if epoch_start + offset >= total_micro_batches:
                return
            yield np.array([tokens[np.asarray(batches[offset * world_size + rank], dtype=np.int64)].sum()
                            for rank in range(world_size)])
        epoch_start += per_rank
        epoch += 1


def micro_batch_loss_scale(batch: Batch, planned: tuple[int, float] | None, description: str) -> float | None:
    """The weight of a micro-batch's loss: its planned token share, or None (the loop divides by grad_accum_steps)
    for stages whose examples count alike. The collate's own `loss_tokens` must agree with the plan."""
    if planned is None:
        if "loss_tokens" in batch:
            raise ValueError(f"{description}: the collate reports loss_tokens but train() got no example_tokens, so "
                             "micro-batches would not be weighted by their tokens")
        return None
    tokens, weight = planned
    if "loss_tokens" in batch and int(batch["loss_tokens"]) != tokens:
        raise ValueError(f"{description}: a micro-batch has {int(batch['loss_tokens'])} loss tokens but the plan "
                         f"counts {tokens}: example_tokens does not describe the collate")
    return weight
