"""This process's place among a launcher's processes and what the processes share: the rank, the death of the
launcher, DDP around the loss computation, sums over ranks, the ranks' parameter digests, barriers.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed


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


class LossComputation(torch.nn.Module):
    """The trained module with the stage's loss as its forward, so that DistributedDataParallel wraps the whole
    loss computation: DDP arms its gradient all-reduce in its own forward, and a stage's loss calls submodules
    (student.distilbert, model.cls) and a frozen teacher that a wrapper of the model alone would never see.
    Only `module` is registered: the teacher takes no part in DDP (no broadcast, no gradients)."""

    def __init__(self, module: torch.nn.Module,
                 compute_loss: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]):
        super().__init__()
        self.module = module
        self.compute_loss = compute_loss

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:  # a batch of batching.py
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


def parameter_digest(module: torch.nn.Module) -> str:
    """The first 64 bits of the sha256 of every parameter's name and bytes, in the module's order, as hex."""
    digest = hashlib.sha256()
    for name, parameter in module.named_parameters():
        digest.update(name.encode())
        digest.update(parameter.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def all_ranks_parameter_digests(module: torch.nn.Module, group: ProcessGroup, device: torch.device) -> list[str]:
    """Every rank's parameter_digest, by rank (a collective). DDP keeps the ranks' parameters bit for bit equal
    (each applies the same all-reduced gradients); ranks that trained apart differ."""
    own = parameter_digest(module)
    if not group.distributed:
        return [own]
    local = torch.tensor([int(own, 16) - 2**63], dtype=torch.int64, device=device)  # 64 bits in an int64
    gathered = [torch.empty_like(local) for _ in range(group.world_size)]
    torch.distributed.all_gather(gathered, local)
    return [f"{int(value.item()) + 2**63:016x}" for value in gathered]


def barrier(group: ProcessGroup) -> None:
    if group.distributed:
        torch.distributed.barrier()


def once_per_node(action: Callable[[], Any], group: ProcessGroup) -> None:
    """Run `action` in each node's first process (local rank 0) while every other rank waits for it."""
    if group.local_rank == 0:
        action()
    barrier(group)


def is_main_process() -> bool:
    """Rank 0 under a launcher, or the only process: the one that writes shared files."""
    return process_group_from_env().is_main
