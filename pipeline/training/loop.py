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
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import psutil
import torch
import torch.distributed
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from pipeline.plan.config import TrainConfig
from pipeline.training.batching import (
    Batch, EpochPlan, count_optimizer_steps, examples_per_batch_plan, micro_batch_loader,
    micro_batch_loss_scale, planned_token_weights, rank_batches, to_device,
)
from pipeline.training.checkpoints import find_and_load_checkpoint, truncate_log_after, save_checkpoint
from pipeline.training.processes import (
    all_ranks_parameter_digests, all_ranks_sum, all_ranks_sum_tensors, process_group_from_env, wrap_for_processes,
)
from pipeline.training.run_settings import mixed_precision, peak_memory_mib, seed_everything

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a finished run reports; stages copy these into their metrics.json."""

    steps: int
    micro_batches: int
    train_seconds: float
    tokens_per_second: float
    final_terms: dict[str, float]
    peak_memory_mib: float
    resumed_from_step: int
    device: str
    processes: int = 1
    effective_batch_size: int = 0
    mixed_precision: str = "no"
    first_step_seconds: float = 0.0
    parameter_digests: tuple[str, ...] = ()  # each rank's trained parameters (processes.parameter_digest), by rank

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
            "peak_memory_mib": round(self.peak_memory_mib, 1),
            "resumed_from_step": self.resumed_from_step,
            "device": self.device,
            # From the process's start to the end of the first optimizer step: model and data loading included.
            "first_step_seconds": round(self.first_step_seconds, 3),
            # Equal on every rank: DDP kept the processes' models one model.
            "parameter_digests_by_rank": list(self.parameter_digests),
        }


def seconds_since_process_start() -> float:
    return time.time() - psutil.Process().create_time()


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

    start_step = find_and_load_checkpoint(checkpoint_dir, fingerprint, module, optimizer, scheduler, device,
                                           group, scaler)
    loss_computation = wrap_for_processes(module, compute_loss, group, device, find_unused_parameters,
                                          static_graph=static_graph and cfg.grad_accum_steps == 1)
    if group.is_main:
        start_log(log_path, start_step, total_steps, description)
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
    interval = LogInterval(log_path, description, group, device)
    total_tokens = 0
    first_step_seconds = 0.0
    final_terms: dict[str, float] = {}
    run_start = time.perf_counter()

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
            interval.add(terms, tokens)
            total_tokens += tokens
            del batch, terms, loss  # this micro-batch's device tensors go before the next one is copied
        optimizer_step(module, optimizer, scheduler, scaler, cfg.max_grad_norm)
        step += 1
        progress.update(1)
        if step == start_step + 1:
            first_step_seconds = seconds_since_process_start()

        if step % cfg.log_every == 0 or step == total_steps:
            final_terms = interval.write(step=step, epoch=round(step * cfg.grad_accum_steps / batches_per_epoch, 4),
                                         lr=scheduler.get_last_lr()[0], effective_batch_size=effective_batch)
            progress.set_postfix(loss=f"{final_terms['loss']:.4f}")

        if step % cfg.checkpoint_every == 0 and step < total_steps:
            save_checkpoint(checkpoint_dir, step, module, optimizer, scheduler, fingerprint, cfg.keep_checkpoints,
                            group, scaler)
    progress.close()
    del stream, loader  # ends the loader's workers

    train_seconds = time.perf_counter() - run_start
    total_tokens = int(all_ranks_sum([total_tokens], group, device)[0])  # a collective: every rank is done here
    digests = all_ranks_parameter_digests(module, group, device)
    if len(set(digests)) > 1:
        logger.warning("%s: the ranks ended with different parameters (digests by rank %s)", description, digests)
    if group.is_main:
        # Checkpoints exist to survive a crash; the finished run's outputs replace them (optimizer states are large).
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    result = TrainResult(
        steps=step,
        micro_batches=step * cfg.grad_accum_steps,
        train_seconds=train_seconds,
        tokens_per_second=total_tokens / max(train_seconds, 1e-9),
        final_terms=final_terms,
        peak_memory_mib=peak_memory_mib(device),
        resumed_from_step=start_step,
        device=str(device),
        processes=group.world_size,
        effective_batch_size=effective_batch,
        mixed_precision=precision,
        first_step_seconds=first_step_seconds,
        parameter_digests=tuple(digests),
    )
    if group.distributed and final:
        # The DDP wrapper (its reducer holds the process group) goes first: a gloo group destroyed while the
        # reducer still refers to it can deadlock at exit (its worker thread waits for the GIL).
        del loss_computation
        gc.collect()
        torch.distributed.destroy_process_group()
    return result


def optimizer_step(module: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, scaler: torch.amp.GradScaler,
                   max_grad_norm: float) -> None:
    """The accumulated gradients, unscaled (fp16) and clipped, make one AdamW step; the schedule advances."""
    scaler.unscale_(optimizer)
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(module.parameters(), max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def start_log(log_path: Path, start_step: int, total_steps: int, description: str) -> None:
    """The run's JSON Lines log: kept up to the checkpoint a resumed run starts from, else started afresh."""
    if start_step:
        logger.info("%s: resuming from step %d of %d", description, start_step, total_steps)
        truncate_log_after(log_path, start_step)
    elif log_path.exists():
        log_path.unlink()
    log_path.parent.mkdir(parents=True, exist_ok=True)


class LogInterval:
    """The loss terms, micro-batches and tokens of the steps since the last log line. Terms stay on the device
    until write(), the interval's one host read."""

    def __init__(self, log_path: Path, description: str, group, device: torch.device):
        self.log_path, self.description, self.group, self.device = log_path, description, group, device
        self.terms: dict[str, torch.Tensor] = {}
        self.micro_batches = self.tokens = 0
        self.start = time.perf_counter()

    def add(self, terms: dict[str, torch.Tensor], tokens: int) -> None:
        for name, value in terms.items():
            value = value.detach().float()
            self.terms[name] = self.terms[name] + value if name in self.terms else value
        self.micro_batches += 1
        self.tokens += tokens

    def write(self, step: int, **fields: Any) -> dict[str, float]:
        """Log the interval's mean terms and throughput (rank 0 writes) and start the next; returns the means."""
        elapsed = time.perf_counter() - self.start
        names = sorted(self.terms)
        # Every term summed over the ranks with the micro-batch and token counts, so the log describes the whole
        # job and not rank 0's shard.
        sums = all_ranks_sum_tensors([self.terms[n] for n in names], [self.micro_batches, self.tokens],
                                     self.group, self.device)
        n_micro_batches, job_tokens = sums[-2], sums[-1]
        means = {name: total / n_micro_batches for name, total in zip(names, sums)}
        record = {"step": step, "epoch": fields["epoch"], "lr": fields["lr"],
                  "tokens_per_second": round(job_tokens / max(elapsed, 1e-9), 1),
                  "effective_batch_size": fields["effective_batch_size"],
                  **{name: round(value, 6) for name, value in means.items()}}
        if self.group.is_main:
            with self.log_path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            logger.info("%s %s", self.description, " ".join(f"{k}={v}" for k, v in record.items()))
        self.terms.clear()
        self.micro_batches = self.tokens = 0
        self.start = time.perf_counter()
        return means


def _batch_tokens(batch: Batch) -> int:
    if "n_tokens" in batch:
        return int(batch["n_tokens"])
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    return batch["input_ids"].numel()
