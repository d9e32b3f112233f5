"""GPU clocks and power: the device's names, a reader through pynvml or nvidia-smi, sampling during a timed span."""

from __future__ import annotations

import os
import subprocess
import threading

import numpy as np
import torch

SMI_FIELDS = {"clocks.sm": "sm_clock_mhz", "clocks.mem": "memory_clock_mhz", "power.draw": "power_w",
              "temperature.gpu": "temperature_c", "utilization.gpu": "utilization_percent"}
SMI_STATIC_FIELDS = {"clocks.max.sm": "max_sm_clock_mhz", "power.limit": "power_limit_w"}


def _smi_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def gpu_identifiers(device: torch.device) -> list[str]:
    """Names nvidia-smi and NVML may know the device by, best first: its UUID, then its index (through
    CUDA_VISIBLE_DEVICES when that lists indices: CUDA's numbering is then not the driver's)."""
    names = []
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        names.append(text if text.startswith("GPU-") else f"GPU-{text}")
    index = device.index or 0
    visible = [name.strip() for name in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if name.strip()]
    names.append(visible[index] if index < len(visible) else str(index))
    return names


def _nvml_handle(pynvml, names: list[str]):
    for name in names:
        try:
            if name.startswith("GPU-"):
                return pynvml.nvmlDeviceGetHandleByUUID(name)
            if name.isdigit():
                return pynvml.nvmlDeviceGetHandleByIndex(int(name))
        except pynvml.NVMLError:
            continue
    raise LookupError(f"NVML knows none of {names}")


def gpu_reader(device: torch.device):
    """(read, static values, source) for the device's clocks, power, temperature and utilisation, or
    (None, None, reason) where none can be read."""
    if device.type != "cuda":
        return None, None, "device is cpu: no GPU clocks or power to read"
    names = gpu_identifiers(device)
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = _nvml_handle(pynvml, names)

        def read_nvml() -> dict:
            return {
                "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "memory_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,  # NVML reports milliwatts
                "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                "utilization_percent": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            }

        static = {"max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
                  "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000}
        read_nvml()
        return read_nvml, static, "pynvml"
    except Exception:  # not installed, or NVML refuses: nvidia-smi reads the same counters
        pass

    def query(fields: dict, name: str) -> dict:
        line = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                               "-i", name], capture_output=True, text=True, timeout=30, check=True).stdout
        return {key: _smi_number(value.strip()) for key, value in zip(fields.values(), line.strip().split(","))}

    errors = []
    for name in names:
        try:
            static = query(SMI_STATIC_FIELDS, name)
            query(SMI_FIELDS, name)
        except (OSError, subprocess.SubprocessError) as error:
            errors.append(f"-i {name}: {error}")
            continue
        return (lambda: query(SMI_FIELDS, name)), static, "nvidia-smi"
    return None, None, f"neither pynvml nor nvidia-smi could read the GPU ({'; '.join(errors)})"


class GpuTelemetry:
    """Samples the GPU's clocks and power in a thread while a timed span runs (a read every `interval` seconds)."""

    def __init__(self, reader, interval: float):
        self.reader, self.interval = reader, interval
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> None:
        if self.reader is None:
            return
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.samples.append(self.reader())
            except Exception:  # a failed read loses one sample, never the run
                pass
            if self._stop.wait(self.interval):
                return

    def stop(self) -> dict | None:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._thread = None
        summary = {"samples": len(self.samples)}
        for name in SMI_FIELDS.values():
            values = [s[name] for s in self.samples if s.get(name) is not None]
            summary[name] = ({"mean": round(float(np.mean(values)), 1), "min": min(values), "max": max(values)}
                             if values else None)
        return summary
