"""The OpenVINO runtime behind onnxruntime's session interface (get_inputs, run), for the x86 target: the answerer
(pipeline.runtime.answering), the gates and the benchmark run an OpenVINO model (.xml) as they run an ONNX graph.

openvino is imported when a session opens: an app that ships only the ONNX graph never needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

# OpenVINO's element types as onnxruntime names them, for callers that build feeds from get_inputs()
ONNX_TYPES = {"i64": "tensor(int64)", "i32": "tensor(int32)", "f32": "tensor(float)"}


@dataclass(frozen=True)
class Input:
    """What onnxruntime's NodeArg says of an input: its name and type."""

    name: str
    type: str


class OpenVinoSession:
    """An OpenVINO model (.xml with its .bin, or an ONNX graph OpenVINO reads) compiled for the CPU: `threads`
    inference threads (None: the runtime's choice), one stream, the latency hint, and a precision hint for what is
    not int8 (`default`: the runtime's own choice on this CPU: bf16 where it has AVX512-BF16 or AMX, else f32);
    `precision` says what the hint resolved to. `profile` turns on the runtime's performance counters."""

    def __init__(self, path: str | Path, threads: int | None = None, precision: str = "default",
                 profile: bool = False):
        import openvino

        config: dict = {"NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY", "PERF_COUNT": profile}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        if precision != "default":
            config["INFERENCE_PRECISION_HINT"] = precision
        self.compiled = openvino.Core().compile_model(str(path), "CPU", config)
        self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        self.request = self.compiled.create_infer_request()
        self._inputs = [Input(port.any_name, ONNX_TYPES.get(port.get_element_type().get_type_name(), "tensor(int64)"))
                        for port in self.compiled.inputs]
        self._outputs = [port.any_name for port in self.compiled.outputs]

    def get_inputs(self) -> list[Input]:
        return list(self._inputs)

    def run(self, output_names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The named outputs (all when None) for one feed, as onnxruntime's InferenceSession.run returns them."""
        results = self.request.infer(feed)
        by_name = {port.any_name: value for port, value in results.items()}
        return [np.asarray(by_name[name]) for name in (output_names or self._outputs)]

    def profile(self) -> dict[str, float]:
        """ms of the last run per "<layer type> (<kernel>)" (needs profile=True)."""
        per_op: dict[str, float] = {}
        for layer in self.request.profiling_info:
            key = f"{layer.node_type} ({layer.exec_type})"
            per_op[key] = per_op.get(key, 0.0) + layer.real_time.total_seconds() * 1000
        return per_op
