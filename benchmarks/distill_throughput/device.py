"""The device helpers the timed spans use: synchronising, resetting the peak memory, timing phases."""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


class PhaseTimer:
    """Time per phase of the timed steps, with no synchronisation inside them: on CUDA the device's time between
    events recorded at the phase boundaries, and the host's time to issue each phase; on CPU the wall time."""

    def __init__(self, device: torch.device, names: tuple[str, ...]):
        self.cuda = device.type == "cuda"
        self.device = device
        self.host = dict.fromkeys(names, 0.0)
        self.intervals: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self.started = self.clock = 0.0
        self.event = None

    def _record(self):
        if not self.cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        synchronize(self.device)
        self.started = self.clock = time.perf_counter()
        self.event = self._record()

    def lap(self, name: str, timed: bool) -> None:
        if not timed:
            return
        now = time.perf_counter()
        self.host[name] += now - self.clock
        self.clock = now
        if self.cuda:
            event = self._record()
            self.intervals.append((name, self.event, event))
            self.event = event

    def seconds(self) -> dict[str, float]:
        """Per phase, summed over the timed steps (call after synchronising)."""
        if not self.cuda:
            return dict(self.host)
        device_seconds = dict.fromkeys(self.host, 0.0)
        for name, begin, end in self.intervals:
            device_seconds[name] += begin.elapsed_time(end) / 1000
        return device_seconds
