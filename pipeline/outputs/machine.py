"""The machine a figure comes from: the CPU's model name and SIMD flags, stamped into every metrics file; and a
process's peak resident memory as the kernel counts it.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

from pipeline.outputs.artifacts import atomic_write_json, read_json


def cpu_description() -> dict:
    """lscpu's model name and the SIMD flags that decide int8 speed (and float rounding paths), from /proc/cpuinfo."""
    model, flags = "unknown", []
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            if key.strip() in ("flags", "Features") and not flags:
                flags = value.split()
    interesting = [f for f in flags if f.startswith(("avx", "amx", "fma", "sse4", "asimd", "sve", "i8mm", "dotprod"))]
    return {"model_name": model, "simd_flags": sorted(interesting)}


def stamp_machine(metrics_path: Path) -> None:
    """Add the CPU model, its flags and the core count to a stage's metrics.json: trained metrics differ between
    CPU models (floating-point paths), so every figure carries the machine it came from."""
    if not metrics_path.is_file():
        return
    metrics = read_json(metrics_path)
    if isinstance(metrics, dict) and "machine" not in metrics:
        cpu = cpu_description()
        metrics["machine"] = {"cpu": cpu["model_name"], "cpu_flags": cpu["simd_flags"], "cores": os.cpu_count()}
        atomic_write_json(metrics_path, metrics)


def high_water_mark_mib(pid: int | str = "self") -> float | None:
    """A process's resident-memory high-water mark in MiB (the kernel's VmHWM, which only grows); without /proc
    (macOS), this process's own peak from getrusage, None for another one. The one reader of peak memory, with
    largest_child_peak_mib. VmHWM, not getrusage: rusage keeps the parent's peak from before exec, which would
    charge a worker with its parent's memory."""
    status = Path(f"/proc/{pid}/status")
    if not status.is_file():
        return _rusage_mib(resource.RUSAGE_SELF) if pid == "self" else None
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    return None


def largest_child_peak_mib() -> float:
    """The largest resident-memory peak among this process's finished children (workers that have exited), in MiB."""
    return _rusage_mib(resource.RUSAGE_CHILDREN)


def _rusage_mib(who: int) -> float:
    peak = resource.getrusage(who).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux
