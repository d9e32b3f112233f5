"""The one training loop every training stage shares.

A stage supplies the trainable module, the examples, a collate function and `compute_loss(batch) -> dict`
of named loss terms (the key "loss" is the one optimised). This loop owns the rest: device placement, bf16
autocast on CUDA, gradient accumulation, AdamW with linear warm-up/decay, clipping, logging (progress bar,
the rule's log, a JSON Lines file), and atomic checkpoints from which a rerun resumes bit-for-bit on CPU.

Determinism: the data order of epoch e comes from its own generator seeded with (seed, e), never from the
global RNG, so resuming only has to skip the batches already consumed; dropout and dynamic masking draw
from the global torch RNG, whose state each checkpoint saves and restores.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import resource
import shutil
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from safetensors.torch import load_model, save_model
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup
from transformers.trainer_pt_utils import get_length_grouped_indices

from pipeline.config import TrainConfig

logger = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]


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

    def as_metrics(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "train_seconds": round(self.train_seconds, 3),
            "tokens_per_second": round(self.tokens_per_second, 1),
            "final_loss_terms": {k: round(v, 6) for k, v in self.final_terms.items()},
            "peak_memory_mb": round(self.peak_memory_mb, 1),
            "resumed_from_step": self.resumed_from_step,
            "device": self.device,
        }


# ---------------------------------------------------------------------------------------------------------------
# Device, seeding, threads
# ---------------------------------------------------------------------------------------------------------------


def resolve_device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device is 'cuda' but no CUDA device is available")
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def configure_cpu_threads(n_threads: int | None) -> None:
    if n_threads:
        torch.set_num_threads(n_threads)


def prepare_run(cfg: TrainConfig, seed: int) -> torch.device:
    """What every training stage does first: CPU threads, the device, and all seeds."""
    configure_cpu_threads(cfg.cpu_threads)
    seed_everything(seed)
    return resolve_device(cfg)


def use_bf16(cfg: TrainConfig, device: torch.device) -> bool:
    return cfg.bf16 and device.type == "cuda" and torch.cuda.is_bf16_supported()


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


def micro_batch_stream(
    examples: Sequence[Any],
    collate: Callable[[list[Any]], Batch],
    batch_size: int,
    seed: int,
    start_micro_batch: int,
    total_micro_batches: int,
    lengths: Sequence[int] | None = None,
) -> Iterator[Batch]:
    """The run's micro-batches in order, epoch after epoch, starting after the ones already consumed."""
    batches_per_epoch = math.ceil(len(examples) / batch_size)
    position = start_micro_batch
    while position < total_micro_batches:
        epoch, offset = divmod(position, batches_per_epoch)
        for indices in epoch_batches(len(examples), batch_size, seed, epoch, lengths=lengths)[offset:]:
            if position >= total_micro_batches:
                return
            yield collate([examples[i] for i in indices])
            position += 1


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def count_optimizer_steps(cfg: TrainConfig, n_examples: int) -> tuple[int, int]:
    """(optimizer steps, micro-batches) of the run: max_steps when set, else `epochs` passes."""
    batches_per_epoch = math.ceil(n_examples / cfg.batch_size)
    if cfg.max_steps:
        return cfg.max_steps, cfg.max_steps * cfg.grad_accum_steps
    micro_batches = max(1, math.ceil(cfg.epochs * batches_per_epoch))
    steps = math.ceil(micro_batches / cfg.grad_accum_steps)
    return steps, steps * cfg.grad_accum_steps


# ---------------------------------------------------------------------------------------------------------------
# Optimiser
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


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------------

CHECKPOINT_PREFIX = "step-"


def _checkpoint_dirs(checkpoint_dir: Path) -> list[Path]:
    if not checkpoint_dir.is_dir():
        return []
    found = [p for p in checkpoint_dir.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    return sorted((p for p in found if p.name[len(CHECKPOINT_PREFIX) :].isdigit()), key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


def save_checkpoint(
    checkpoint_dir: Path,
    step: int,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    fingerprint: str,
    keep: int,
) -> Path:
    """Write a checkpoint atomically: into a temporary folder, renamed into place when complete."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir / f"{CHECKPOINT_PREFIX}{step:08d}"
    tmp = checkpoint_dir / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(module, str(tmp / "model.safetensors"))  # handles tied weights
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, tmp / "rng.pt")
    state = {"step": step, "fingerprint": fingerprint, "python_random": _python_rng_to_json(random.getstate())}
    (tmp / "trainer_state.json").write_text(json.dumps(state))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in _checkpoint_dirs(checkpoint_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _python_rng_to_json(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _python_rng_from_json(state: list) -> tuple:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def latest_checkpoint(checkpoint_dir: Path, fingerprint: str) -> Path | None:
    """The newest complete checkpoint of this same run; checkpoints of another config are discarded."""
    for candidate in reversed(_checkpoint_dirs(checkpoint_dir)):
        state_file = candidate / "trainer_state.json"
        if not state_file.is_file():
            continue
        state = json.loads(state_file.read_text())
        if state.get("fingerprint") == fingerprint:
            return candidate
        logger.warning("discarding checkpoint %s: it belongs to a run with a different config or inputs", candidate)
        shutil.rmtree(candidate, ignore_errors=True)
    return None


def load_checkpoint(
    path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, device: torch.device
) -> int:
    """Restore weights, optimizer, schedule and RNG states; returns the step to continue from."""
    missing, unexpected = load_model(module, str(path / "model.safetensors"), device=str(device))
    if unexpected:
        raise RuntimeError(f"{path}: checkpoint has unexpected tensors {unexpected[:5]}")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    state = json.loads((path / "trainer_state.json").read_text())
    random.setstate(_python_rng_from_json(state["python_random"]))
    return int(state["step"])


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
    collate: Callable[[list[Any]], Batch],
    cfg: TrainConfig,
    seed: int,
    device: torch.device,
    checkpoint_dir: Path,
    log_path: Path,
    fingerprint: str,
    description: str = "train",
    example_lengths: Sequence[int] | None = None,
) -> TrainResult:
    """Train `module` (every parameter that requires grad) by minimising compute_loss(batch)["loss"].

    `compute_loss` receives each micro-batch already on `device`, under bf16 autocast on CUDA, and returns the
    named loss terms; every term is logged. Tokens per second count the batch's attention_mask (or input_ids).
    """
    if len(examples) == 0:
        raise ValueError(f"{description}: no training examples")
    if cfg.group_by_length and example_lengths is None:
        raise ValueError(f"{description}: group_by_length is set but the stage passed no example_lengths")
    total_steps, total_micro_batches = count_optimizer_steps(cfg, len(examples))
    optimizer = build_optimizer(module, cfg, device)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * total_steps), total_steps)
    autocast_bf16 = use_bf16(cfg, device)

    start_step = 0
    checkpoint = latest_checkpoint(checkpoint_dir, fingerprint)
    if checkpoint is not None:
        start_step = load_checkpoint(checkpoint, module, optimizer, scheduler, device)
        logger.info("%s: resuming from %s (step %d of %d)", description, checkpoint, start_step, total_steps)
        _truncate_log_after(log_path, start_step)
    elif log_path.exists():
        log_path.unlink()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    module.train()
    stream = micro_batch_stream(
        examples, collate, cfg.batch_size, seed, start_step * cfg.grad_accum_steps, total_micro_batches,
        lengths=example_lengths if cfg.group_by_length else None,
    )
    progress = tqdm(
        total=total_steps, initial=start_step, desc=description, file=sys.stderr, mininterval=2.0, dynamic_ncols=True
    )
    interval_terms: dict[str, float] = defaultdict(float)
    interval_micro_batches = 0
    interval_tokens = 0
    total_tokens = 0
    final_terms: dict[str, float] = {}
    run_start = interval_start = time.perf_counter()

    step = start_step
    while step < total_steps:
        for _ in range(cfg.grad_accum_steps):
            batch = to_device(next(stream), device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
                terms = compute_loss(batch)
            (terms["loss"] / cfg.grad_accum_steps).backward()
            for name, value in terms.items():
                interval_terms[name] += float(value.detach())
            interval_micro_batches += 1
            tokens = int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
            interval_tokens += tokens
            total_tokens += tokens
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        progress.update(1)

        if step % cfg.log_every == 0 or step == total_steps:
            elapsed = time.perf_counter() - interval_start
            final_terms = {name: total / interval_micro_batches for name, total in interval_terms.items()}
            record = {
                "step": step,
                "epoch": round(step * cfg.grad_accum_steps * cfg.batch_size / len(examples), 4),
                "lr": scheduler.get_last_lr()[0],
                "tokens_per_second": round(interval_tokens / max(elapsed, 1e-9), 1),
                **{name: round(value, 6) for name, value in final_terms.items()},
            }
            with log_path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            logger.info("%s %s", description, " ".join(f"{k}={v}" for k, v in record.items()))
            progress.set_postfix(loss=f"{final_terms['loss']:.4f}")
            interval_terms.clear()
            interval_micro_batches = interval_tokens = 0
            interval_start = time.perf_counter()

        if step % cfg.checkpoint_every == 0 and step < total_steps:
            save_checkpoint(checkpoint_dir, step, module, optimizer, scheduler, fingerprint, cfg.keep_checkpoints)
    progress.close()

    train_seconds = time.perf_counter() - run_start
    # Checkpoints exist to survive a crash; the finished run's outputs replace them (optimizer states are large).
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    return TrainResult(
        steps=step,
        micro_batches=step * cfg.grad_accum_steps,
        train_seconds=train_seconds,
        tokens_per_second=total_tokens / max(train_seconds, 1e-9),
        final_terms=final_terms,
        peak_memory_mb=peak_memory_mb(device),
        resumed_from_step=start_step,
        device=str(device),
    )
