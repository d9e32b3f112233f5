"""What a training run sets up before its first step: CPU threads, seeds, the device, the process group, mixed
precision, compilation, and the peak memory it reports.
"""

from __future__ import annotations

import logging
import os
import random
from datetime import timedelta

import torch
import torch.distributed

from pipeline.outputs.machine import high_water_mark_mib
from pipeline.plan.config import TrainConfig
from pipeline.training.processes import die_with_the_launcher, process_group_from_env

logger = logging.getLogger(__name__)


PRECISIONS = ("no", "bf16", "fp16")


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


def peak_memory_mib(device: torch.device) -> float:
    """Peak memory of this run in MiB: allocated GPU memory on CUDA, the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return high_water_mark_mib() or 0.0


def maybe_compile(module: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.nn.Module:
    """torch.compile for GPU runs when asked; the uncompiled module is what gets saved."""
    if cfg.torch_compile and device.type == "cuda":
        return torch.compile(module)
    return module
