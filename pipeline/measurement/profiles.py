"""Where an ONNX graph's time goes: onnxruntime's profiler at 1 thread, time per operator type, largest first (the
rows latency.ranked_profile makes, as OpenVINO's performance counters are read in pipeline.export.peers)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from pipeline.measurement.latency import ranked_profile, synthetic_feed


def profile_ops(path: Path, sequence_length: int, vocab_size: int, runs: int, scratch: Path) -> list[dict]:
    """Time per operator type under onnxruntime's profiler (1 thread), largest first."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(scratch / path.parent.name)
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = synthetic_feed(session, sequence_length, vocab_size)
    session.run(None, feed)
    for _ in range(runs):
        session.run(None, feed)
    trace = json.loads(Path(session.end_profiling()).read_text())
    ms_by_op: dict[str, float] = {}
    for event in trace:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            ms_by_op[op] = ms_by_op.get(op, 0.0) + event["dur"] / 1000  # microseconds in the trace
    return ranked_profile(ms_by_op, runs + 1)


def profile_graphs(paths: dict[str, Path], sequence_length: int, vocab_size: int, runs: int) -> dict[str, list]:
    """profile_ops of each named graph, on the same input."""
    with tempfile.TemporaryDirectory() as traces:  # onnxruntime's profiler writes one trace file per session
        return {name: profile_ops(path, sequence_length, vocab_size, runs, Path(traces))
                for name, path in paths.items()}
