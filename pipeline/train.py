"""The one training loop every training stage shares.

A stage supplies the trainable module, the examples, a collate function and `compute_loss(batch) -> dict`
of named loss terms (the key "loss" is the one optimised). This loop owns the rest: the DataLoader (workers,
pinned memory), device placement, mixed precision on CUDA, gradient accumulation, AdamW with linear
warm-up/decay, clipping, logging (progress bar, the rule's log, a JSON Lines file), and atomic checkpoints from
which a rerun resumes bit-for-bit on CPU.

Determinism: the batches of epoch e come from (seed, e) alone, never from the global RNG, so resuming only has
to skip the batches already consumed; each batch's collate gets its own generator seeded with (seed, rank,
position), so dynamic masks do not depend on loader workers or on resuming; dropout draws from the global torch
RNG, whose state each checkpoint saves and restores.

Several processes: launched by `torchrun` or `accelerate launch`, the loss is computed through PyTorch's
DistributedDataParallel (NCCL on GPUs, gloo on CPU), whose gradient all-reduce runs once per optimizer step
(`no_sync` during accumulation). Each rank trains on its own batches; `train()` returns on every rank, and
stages leave evaluation and outputs to rank 0.

No host syncs inside a step: loss terms stay on the device and are read once every `log_every` steps; token
counts come from the collate on the CPU, and each micro-batch's share of a step's tokens from the batch plan, so
micro-batches stream to the device one at a time with no collective before the step's gradient all-reduce.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import math
import os
import random
import resource
import shutil
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import psutil
import torch
import torch.distributed
from safetensors.torch import load_model, save_model
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup
from transformers.trainer_pt_utils import get_length_grouped_indices

from pipeline.artifacts import ManifestError, verify_manifest, write_manifest
from pipeline.config import TrainConfig

logger = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]
PRECISIONS = ("no", "bf16", "fp16")


@dataclass
class TrainResult:
    """What a finished run reports; stages copy these into their metrics.json."""

    steps: int
    micro_batches: int
    train_seconds: float
    tokens_per_second: float
    final_terms: dict[str, float]
    peak_memory_mb: float
    resumed_from_step: int
    device: str
    processes: int = 1
    effective_batch_size: int = 0
    mixed_precision: str = "no"
    first_step_seconds: float = 0.0

    def as_metrics(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "train_seconds": round(self.train_seconds, 3),
            "tokens_per_second": round(self.tokens_per_second, 1),  # all processes together
            "tokens_per_second_per_process": round(self.tokens_per_second / self.processes, 1),
            "processes": self.processes,
            "effective_batch_size": self.effective_batch_size,
            "mixed_precision": self.mixed_precision,
            "final_loss_terms": {k: round(v, 6) for k, v in self.final_terms.items()},
            "peak_memory_mb": round(self.peak_memory_mb, 1),
            "resumed_from_step": self.resumed_from_step,
            "device": self.device,
            # From the process's start to the end of the first optimizer step: model and data loading included.
            "first_step_seconds": round(self.first_step_seconds, 3),
        }


# ---------------------------------------------------------------------------------------------------------------
# Processes, device, seeding, threads
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessGroup:
    """This process's place in a `torchrun` / `accelerate launch` job; WORLD_SIZE 1 is the plain single process."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def process_group_from_env() -> ProcessGroup:
    """The launcher's environment variables (torchrun and accelerate set RANK, LOCAL_RANK, WORLD_SIZE)."""
    return ProcessGroup(
        rank=int(os.environ.get("RANK", 0)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
    )


def resolve_device(cfg: TrainConfig, local_rank: int = 0) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device is 'cuda' but no CUDA device is available")
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)  # one GPU per process
    return torch.device("cuda", local_rank)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def configure_cpu_threads(n_threads: int | None) -> None:
    if n_threads:
        torch.set_num_threads(n_threads)


def prepare_run(cfg: TrainConfig, seed: int) -> torch.device:
    """What every training stage does first: CPU threads, the device, all seeds, and (when launched with
    several processes) the process group: NCCL between GPUs, gloo on CPU."""
    configure_cpu_threads(cfg.cpu_threads)
    seed_everything(seed)  # the same on every rank: models built from random draws start identical
    group = process_group_from_env()
    device = resolve_device(cfg, group.local_rank)
    if group.distributed and not torch.distributed.is_initialized():
        die_with_the_launcher()
        # A long first step (torch.compile, a cold file cache) must not trip the collective timeout.
        torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                             timeout=timedelta(minutes=cfg.process_group_timeout_minutes))
    return device


def die_with_the_launcher() -> None:
    """torchrun starts each rank in a session of its own, so a launcher killed outright (SIGKILL: no chance to
    stop its ranks, as when Snakemake and its job are killed) would leave them training beside the rerun. On
    Linux each rank asks the kernel for SIGKILL when its parent, the launcher, dies."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    pr_set_pdeathsig = 1  # from <sys/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def mixed_precision(cfg: TrainConfig, device: torch.device) -> str:
    """no / bf16 / fp16 autocast. CUDA only; the launch decides (compute.mixed_precision, which the Snakefile
    passes as accelerate's ACCELERATE_MIXED_PRECISION), else train.bf16."""
    if device.type != "cuda":
        return "no"
    choice = os.environ.get("ACCELERATE_MIXED_PRECISION") or ("bf16" if cfg.bf16 else "no")
    if choice not in PRECISIONS:
        raise ValueError(f"ACCELERATE_MIXED_PRECISION={choice!r}: expected one of {list(PRECISIONS)}")
    if choice == "bf16" and not torch.cuda.is_bf16_supported():
        logger.warning("this GPU has no bf16: training in fp16 with loss scaling instead")
        return "fp16"
    return choice


def use_bf16(cfg: TrainConfig, device: torch.device) -> bool:
    return mixed_precision(cfg, device) == "bf16"


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this run: allocated GPU memory on CUDA, the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def maybe_compile(module: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.nn.Module:
    """torch.compile for GPU runs when asked; the uncompiled module is what gets saved."""
    if cfg.torch_compile and device.type == "cuda":
        return torch.compile(module)
    return module


# ---------------------------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------------------------


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
# plan (pipeline.corpus.token_budget_batches); without one, batches hold batch_size examples.
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


def seconds_since_process_start() -> float:
    return time.time() - psutil.Process().create_time()


# ---------------------------------------------------------------------------------------------------------------
# Optimiser and gradient averaging
# ---------------------------------------------------------------------------------------------------------------


def build_optimizer(module: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; biases and LayerNorm weights (all 1-d tensors) get no weight decay, as in BERT."""
    decay, no_decay = [], []
    for parameter in module.parameters():
        if parameter.requires_grad:
            (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = device.type == "cuda"  # fused AdamW kernels exist for CUDA tensors
    return torch.optim.AdamW(
        groups, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps, fused=fused
    )


class LossComputation(torch.nn.Module):
    """The trained module with the stage's loss as its forward, so that DistributedDataParallel wraps the whole
    loss computation: DDP arms its gradient all-reduce in its own forward, and a stage's loss calls submodules
    (student.distilbert, model.cls) and a frozen teacher that a wrapper of the model alone would never see.
    Only `module` is registered: the teacher takes no part in DDP (no broadcast, no gradients)."""

    def __init__(self, module: torch.nn.Module, compute_loss: Callable[[Batch], dict[str, torch.Tensor]]):
        super().__init__()
        self.module = module
        self.compute_loss = compute_loss

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        return self.compute_loss(batch)


def wrap_for_processes(
    module: torch.nn.Module, compute_loss: Callable, group: ProcessGroup, device: torch.device,
    find_unused_parameters: bool = False, static_graph: bool = False,
) -> torch.nn.Module:
    """The loss computation, under DDP when there are several processes.

    Gradients are views into DDP's all-reduce buckets (gradient_as_bucket_view): no second copy of every gradient.
    `static_graph` tells DDP that every step runs the same graph; the loop passes it only without gradient
    accumulation: with `no_sync` micro-batches, torch 2.13's DDP fails its first backward under static_graph
    (reducer.cpp `expect_autograd_hooks_` assertion, pytorch/pytorch#143580)."""
    computation = LossComputation(module, compute_loss)
    if not group.distributed:
        return computation
    return torch.nn.parallel.DistributedDataParallel(
        computation, device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=find_unused_parameters, gradient_as_bucket_view=True, static_graph=static_graph,
    )


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


def all_ranks_sum(values: list[float], group: ProcessGroup, device: torch.device) -> list[float]:
    """Sum numbers over all processes (tokens, loss sums): what the log reports is the whole job's."""
    if not group.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor.tolist()


def all_ranks_sum_tensors(
    device_values: list[torch.Tensor], host_values: list[float], group: ProcessGroup, device: torch.device,
) -> list[float]:
    """Sum 0-d device tensors and host numbers over all processes, read back to the host in one transfer."""
    host = torch.tensor(host_values, dtype=torch.float64, device=device)
    stacked = torch.cat([torch.stack(device_values).double(), host]) if device_values else host
    if group.distributed:
        torch.distributed.all_reduce(stacked, op=torch.distributed.ReduceOp.SUM)
    return stacked.tolist()


def barrier(group: ProcessGroup) -> None:
    if group.distributed:
        torch.distributed.barrier()


def once_per_node(action: Callable[[], Any], group: ProcessGroup) -> None:
    """Run `action` in each node's first process (local rank 0) while every other rank waits for it."""
    if group.local_rank == 0:
        action()
    barrier(group)


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------------

CHECKPOINT_PREFIX = "step-"


def _checkpoint_dirs(checkpoint_dir: Path) -> list[Path]:
    if not checkpoint_dir.is_dir():
        return []
    found = [p for p in checkpoint_dir.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    return sorted((p for p in found if p.name[len(CHECKPOINT_PREFIX) :].isdigit()), key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


def _rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    state = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def save_checkpoint(
    checkpoint_dir: Path,
    step: int,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    fingerprint: str,
    keep: int,
    group: ProcessGroup = ProcessGroup(),
    scaler: torch.amp.GradScaler | None = None,
) -> Path:
    """Write a checkpoint atomically: into a temporary folder, renamed into place when complete.

    Every rank saves its own RNG state (dropout and masking differ per rank); rank 0 saves the weights,
    optimizer and schedule (identical on every rank) and the manifest, then renames."""
    final = checkpoint_dir / f"{CHECKPOINT_PREFIX}{step:08d}"
    tmp = checkpoint_dir / f".tmp-{final.name}"
    if group.is_main:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier(group)
    torch.save(_rng_state(), tmp / f"rng-rank{group.rank}.pt")
    barrier(group)
    if group.is_main:
        save_model(module, str(tmp / "model.safetensors"))  # handles tied weights
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        if scaler is not None and scaler.is_enabled():
            torch.save(scaler.state_dict(), tmp / "scaler.pt")
        state = {"step": step, "fingerprint": fingerprint, "world_size": group.world_size}
        (tmp / "trainer_state.json").write_text(json.dumps(state))
        write_manifest(tmp)  # a truncated or altered file is refused by name on resume
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in _checkpoint_dirs(checkpoint_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    barrier(group)
    return final


def latest_checkpoint(checkpoint_dir: Path, fingerprint: str, world_size: int = 1) -> Path | None:
    """The newest complete checkpoint of this same run; checkpoints of another config are discarded.

    A checkpoint whose files differ from its manifest raises ManifestError naming the file: resuming from it
    would silently train from damaged state."""
    for candidate in reversed(_checkpoint_dirs(checkpoint_dir)):
        state_file = candidate / "trainer_state.json"
        if not state_file.is_file() or not (candidate / "manifest.json").is_file():
            logger.warning("discarding checkpoint %s: it is incomplete (no trainer_state.json or manifest.json)",
                           candidate)
            shutil.rmtree(candidate, ignore_errors=True)
            continue
        state = json.loads(state_file.read_text())
        if state.get("fingerprint") == fingerprint and state.get("world_size", 1) == world_size:
            try:
                verify_manifest(candidate)
            except ManifestError as error:
                raise ManifestError(f"{error}; delete {candidate} to resume from an earlier checkpoint") from None
            return candidate
        logger.warning("discarding checkpoint %s: it belongs to a run with a different config, inputs or number "
                       "of processes", candidate)
        shutil.rmtree(candidate, ignore_errors=True)
    return None


def load_checkpoint(
    path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, device: torch.device,
    group: ProcessGroup = ProcessGroup(), scaler: torch.amp.GradScaler | None = None,
) -> int:
    """Restore weights, optimizer, schedule and this rank's RNG states; returns the step to continue from."""
    missing, unexpected = load_model(module, str(path / "model.safetensors"), device=str(device))
    if unexpected:
        raise RuntimeError(f"{path}: checkpoint has unexpected tensors {unexpected[:5]}")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    if scaler is not None and scaler.is_enabled() and (path / "scaler.pt").is_file():
        scaler.load_state_dict(torch.load(path / "scaler.pt", weights_only=True))
    _set_rng_state(torch.load(path / f"rng-rank{group.rank}.pt", weights_only=True))
    state = json.loads((path / "trainer_state.json").read_text())
    return int(state["step"])


def _find_and_load_checkpoint(checkpoint_dir, fingerprint, module, optimizer, scheduler, device, group, scaler):
    """Rank 0 picks (and cleans) the checkpoint; every rank loads the same one. Returns the start step."""
    found = [latest_checkpoint(checkpoint_dir, fingerprint, group.world_size) if group.is_main else None]
    if group.distributed:
        torch.distributed.broadcast_object_list(found, src=0)
    if found[0] is None:
        return 0
    return load_checkpoint(Path(found[0]), module, optimizer, scheduler, device, group, scaler)


# ---------------------------------------------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------------------------------------------


def _truncate_log_after(log_path: Path, step: int) -> None:
    """On resume, drop log lines a killed run wrote after its last checkpoint (they are re-done)."""
    if not log_path.is_file():
        return
    kept = [line for line in log_path.read_text().splitlines() if line and json.loads(line).get("step", 0) <= step]
    log_path.write_text("".join(line + "\n" for line in kept))


# ---------------------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------------------


def train(
    *,
    module: torch.nn.Module,
    compute_loss: Callable[[Batch], dict[str, torch.Tensor]],
    examples: Sequence[Any],
    collate: Callable[[list[Any], torch.Generator], Batch],
    cfg: TrainConfig,
    seed: int,
    device: torch.device,
    checkpoint_dir: Path,
    log_path: Path,
    fingerprint: str,
    description: str = "train",
    example_lengths: Sequence[int] | None = None,
    batch_plan: EpochPlan | None = None,
    example_tokens: Sequence[int] | None = None,
    find_unused_parameters: bool = False,
    static_graph: bool = False,
    final: bool = True,
) -> TrainResult:
    """Train `module` (every parameter that requires grad) by minimising compute_loss(batch)["loss"].

    `collate(examples, generator)` builds a micro-batch on the CPU (in a loader worker when
    cfg.dataloader_workers > 0); `compute_loss` receives it on `device`, under autocast on CUDA, and returns the
    named loss terms; every term is logged. Batches are `batch_plan`'s when given (token budgets), else
    batch_size examples. Tokens per second count the batch's `n_tokens`, else its attention_mask.

    `example_tokens` (the MLM stages: each sequence's tokens) makes the optimised loss a per-token mean over each
    whole step, across gradient accumulation and ranks: every micro-batch's loss counts by its share of the step's
    tokens, computed from the batch plan on the host (planned_token_weights). Without it each micro-batch counts
    1 / grad_accum_steps.

    `static_graph`: the stage runs the same modules and loss terms in every micro-batch, so DDP may treat the graph
    as static (applied only when grad_accum_steps is 1; see wrap_for_processes).

    Under a launcher with several processes every rank returns; the process group is destroyed after the
    stage's last training (``final``), and a stage that trains again afterwards passes ``final=False``.
    """
    if len(examples) == 0:
        raise ValueError(f"{description}: no training examples")
    if batch_plan is None and cfg.group_by_length and example_lengths is None:
        raise ValueError(f"{description}: group_by_length is set but the stage passed no example_lengths")
    group = process_group_from_env()
    if batch_plan is None:
        lengths = example_lengths if cfg.group_by_length else None
        batch_plan = examples_per_batch_plan(len(examples), cfg.batch_size, seed, group.world_size, lengths)
    # The step count, the loader and the token weights all read each epoch's plan: build it once, keep one epoch.
    batch_plan = functools.lru_cache(maxsize=1)(batch_plan)
    batches_per_epoch = len(rank_batches(batch_plan, 0, group))
    total_steps, total_micro_batches = count_optimizer_steps(cfg, batches_per_epoch)
    optimizer = build_optimizer(module, cfg, device)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * total_steps), total_steps)
    precision = mixed_precision(cfg, device)
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")  # fp16 needs loss scaling, bf16 does not
    effective_batch = cfg.batch_size * group.world_size * cfg.grad_accum_steps
    if group.distributed:
        # Dropout must differ between ranks, or every shard would see the same dropout masks.
        seed_everything(seed * 1_000_003 + group.rank)

    start_step = _find_and_load_checkpoint(checkpoint_dir, fingerprint, module, optimizer, scheduler, device,
                                           group, scaler)
    loss_computation = wrap_for_processes(module, compute_loss, group, device, find_unused_parameters,
                                          static_graph=static_graph and cfg.grad_accum_steps == 1)
    if group.is_main:
        if start_step:
            logger.info("%s: resuming from step %d of %d", description, start_step, total_steps)
            _truncate_log_after(log_path, start_step)
        elif log_path.exists():
            log_path.unlink()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        logger.info(
            "%s: %d process(es) x %d micro-batches per step, %d steps; precision %s on %s; %d loader worker(s)",
            description, group.world_size, cfg.grad_accum_steps, total_steps, precision, device,
            cfg.dataloader_workers,
        )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    module.train()
    loader = micro_batch_loader(
        examples, collate, batch_plan, seed, start_step * cfg.grad_accum_steps, total_micro_batches, group,
        workers=cfg.dataloader_workers, pin_memory=device.type == "cuda",
    )
    stream = iter(loader)
    progress = tqdm(
        total=total_steps, initial=start_step, desc=description, file=sys.stderr, mininterval=2.0, dynamic_ncols=True,
        disable=not group.is_main,
    )
    interval_terms: dict[str, torch.Tensor] = {}  # on the device: read once per log interval
    interval_micro_batches = 0
    interval_tokens = 0
    total_tokens = 0
    first_step_seconds = 0.0
    final_terms: dict[str, float] = {}
    run_start = interval_start = time.perf_counter()

    # Each micro-batch's weight is known from the plan before its step starts; micro-batches then go to the device
    # one at a time, each forward and backward as it arrives.
    step_weights = (planned_token_weights(batch_plan, example_tokens, start_step, total_steps, cfg.grad_accum_steps,
                                          group) if example_tokens is not None else None)
    step = start_step
    while step < total_steps:
        planned = next(step_weights) if step_weights is not None else [None] * cfg.grad_accum_steps
        for number, planned_micro_batch in enumerate(planned):
            cpu_batch = next(stream)
            scale = micro_batch_loss_scale(cpu_batch, planned_micro_batch, description)
            tokens = _batch_tokens(cpu_batch)  # counted on the CPU, before the copy to the device
            batch = to_device(cpu_batch, device)
            last = number == len(planned) - 1
            # DDP all-reduces gradients in the backward of the step's last micro-batch only.
            accumulate = loss_computation.no_sync() if group.distributed and not last else nullcontext()
            with accumulate:
                with torch.autocast(device_type=device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                    terms = loss_computation(batch)
                loss = terms["loss"] / cfg.grad_accum_steps if scale is None else terms["loss"] * scale
                scaler.scale(loss).backward()
            for name, value in terms.items():
                value = value.detach().float()
                interval_terms[name] = interval_terms[name] + value if name in interval_terms else value
            interval_micro_batches += 1
            interval_tokens += tokens
            total_tokens += tokens
            del batch, terms, loss  # this micro-batch's device tensors go before the next one is copied
        scaler.unscale_(optimizer)
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        progress.update(1)
        if step == start_step + 1:
            first_step_seconds = seconds_since_process_start()

        if step % cfg.log_every == 0 or step == total_steps:
            elapsed = time.perf_counter() - interval_start
            names = sorted(interval_terms)
            # The one host read of the interval: every term, summed over the ranks with the micro-batch and
            # token counts, so the log describes the whole job and not rank 0's shard.
            sums = all_ranks_sum_tensors([interval_terms[n] for n in names],
                                         [interval_micro_batches, interval_tokens], group, device)
            n_micro_batches, job_tokens = sums[-2], sums[-1]
            final_terms = {name: total / n_micro_batches for name, total in zip(names, sums)}
            record = {
                "step": step,
                "epoch": round(step * cfg.grad_accum_steps / batches_per_epoch, 4),
                "lr": scheduler.get_last_lr()[0],
                "tokens_per_second": round(job_tokens / max(elapsed, 1e-9), 1),
                "effective_batch_size": effective_batch,
                **{name: round(value, 6) for name, value in final_terms.items()},
            }
            if group.is_main:
                with log_path.open("a") as handle:
                    handle.write(json.dumps(record) + "\n")
                logger.info("%s %s", description, " ".join(f"{k}={v}" for k, v in record.items()))
                progress.set_postfix(loss=f"{final_terms['loss']:.4f}")
            interval_terms.clear()
            interval_micro_batches = interval_tokens = 0
            interval_start = time.perf_counter()

        if step % cfg.checkpoint_every == 0 and step < total_steps:
            save_checkpoint(checkpoint_dir, step, module, optimizer, scheduler, fingerprint, cfg.keep_checkpoints,
                            group, scaler)
    progress.close()
    del stream, loader  # ends the loader's workers

    train_seconds = time.perf_counter() - run_start
    total_tokens = int(all_ranks_sum([total_tokens], group, device)[0])  # a collective: every rank is done here
    if group.is_main:
        # Checkpoints exist to survive a crash; the finished run's outputs replace them (optimizer states are large).
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    result = TrainResult(
        steps=step,
        micro_batches=step * cfg.grad_accum_steps,
        train_seconds=train_seconds,
        tokens_per_second=total_tokens / max(train_seconds, 1e-9),
        final_terms=final_terms,
        peak_memory_mb=peak_memory_mb(device),
        resumed_from_step=start_step,
        device=str(device),
        processes=group.world_size,
        effective_batch_size=effective_batch,
        mixed_precision=precision,
        first_step_seconds=first_step_seconds,
    )
    if group.distributed and final:
        # The DDP wrapper (its reducer holds the process group) goes first: a gloo group destroyed while the
        # reducer still refers to it can deadlock at exit (its worker thread waits for the GIL).
        del loss_computation
        gc.collect()
        torch.distributed.destroy_process_group()
    return result


def _batch_tokens(batch: Batch) -> int:
    if "n_tokens" in batch:
        return int(batch["n_tokens"])
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    return batch["input_ids"].numel()


def is_main_process() -> bool:
    """Rank 0 under a launcher, or the only process: the one that writes shared files."""
    return process_group_from_env().is_main
