"""The machine a benchmark ran on, as benchmark.json records it: the CPU and its SIMD flags, the cores, Python and
the versions of the libraries whose kernels were timed."""

from __future__ import annotations

import os
import sys
from importlib import metadata

from pipeline.outputs.machine import cpu_description

TIMED_LIBRARIES = ("onnxruntime", "torch", "transformers", "optimum", "coremltools", "onnx", "openvino", "nncf")


def machine_description() -> dict:
    """{"cpu", "cpu_flags", "cores", "python", "versions": {library: version, or None where not installed}}."""
    versions = {}
    for name in TIMED_LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    cpu = cpu_description()
    return {"cpu": cpu["model_name"], "cpu_flags": cpu["simd_flags"], "cores": os.cpu_count(),
            "python": sys.version.split()[0], "versions": versions}
