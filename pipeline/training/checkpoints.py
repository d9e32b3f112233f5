"""Atomic checkpoints of the training loop (weights, optimizer, scheduler, RNG states, the manifest), the choice of
the newest usable one on resume, and the log lines written after it dropped.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed
from safetensors.torch import load_model, save_model

from pipeline.outputs.manifests import ManifestError, verify_manifest, write_manifest
from pipeline.training.processes import ProcessGroup, barrier

logger = logging.getLogger(__name__)


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


def find_and_load_checkpoint(checkpoint_dir, fingerprint, module, optimizer, scheduler, device, group, scaler):
    """Rank 0 picks (and cleans) the checkpoint; every rank loads the same one. Returns the start step."""
    found = [latest_checkpoint(checkpoint_dir, fingerprint, group.world_size) if group.is_main else None]
    if group.distributed:
        torch.distributed.broadcast_object_list(found, src=0)
    if found[0] is None:
        return 0
    return load_checkpoint(Path(found[0]), module, optimizer, scheduler, device, group, scaler)


def truncate_log_after(log_path: Path, step: int) -> None:
    """On resume, drop log lines a killed run wrote after its last checkpoint (they are re-done)."""
    if not log_path.is_file():
        return
    kept = [line for line in log_path.read_text().splitlines() if line and json.loads(line).get("step", 0) <= step]
    log_path.write_text("".join(line + "\n" for line in kept))
