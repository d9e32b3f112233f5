"""Benchmark: where a training stage makes the host wait for the GPU (not a test; needs CUDA).

Runs one stage, `python -m pipeline <command> ...`, in this process under
`torch.cuda.set_sync_debug_mode("warn")`: every operation that blocks the host until the device catches up (a
device tensor read on the host, a blocking copy, a boolean mask's count) raises a warning, which is recorded with
its Python stack. Each one is attributed to an optimizer step of the training loop (`pipeline.training.loop.train`'s
`step`) or to the stage outside the loop, and located by the innermost frame of pipeline/ and the innermost frame
of any library. Writes JSON: the host syncs of each loop step apart from the log reads, and where they happen.

    python -m benchmarks.host_syncs --out syncs.json -- distill-pretrain --config-json '...' --student-dir ...

The arguments after `--` are those of `python -m pipeline` (the rule's command line, see rules/*.smk).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import traceback
import warnings
from pathlib import Path

import torch

import pipeline
from pipeline.training import loop as training_loop
from pipeline.__main__ import main as pipeline_main
from pipeline.startup import libraries_loaded

PIPELINE_DIR = str(Path(pipeline.__file__).parent)
SYNC_MESSAGE = "called a synchronizing CUDA operation"
# The loop's one read per log interval: every loss term and count in one transfer.
LOG_READS = ("all_ranks_sum_tensors", "all_ranks_sum")
CHECKPOINTS = ("save_checkpoint",)


def _location(frame: traceback.FrameSummary) -> str:
    """file:line function, the file relative to the import path it was found on (pipeline/..., transformers/...)."""
    filename = frame.filename
    if filename.startswith(PIPELINE_DIR):
        filename = "pipeline" + filename[len(PIPELINE_DIR):]
    else:
        roots = sorted((p for p in sys.path if p and filename.startswith(p.rstrip("/") + "/")), key=len, reverse=True)
        if roots:
            filename = filename[len(roots[0].rstrip("/")) + 1:]
    return f"{filename}:{frame.lineno} {frame.name}"


class SyncRecorder:
    def __init__(self) -> None:
        self.events: list[dict] = []
        self._original = warnings.showwarning

    def install(self) -> None:
        warnings.filterwarnings("always", message=SYNC_MESSAGE)
        warnings.showwarning = self.show

    def show(self, message, category, filename, lineno, file=None, line=None) -> None:
        if SYNC_MESSAGE not in str(message):
            return self._original(message, category, filename, lineno, file, line)
        frame = sys._getframe(1)
        step, in_train = None, False
        walker = frame
        while walker is not None:
            if walker.f_code is training_loop.train.__code__:
                in_train = True
                step = walker.f_locals.get("step")
                break
            walker = walker.f_back
        stack = [f for f in traceback.extract_stack(frame) if not f.filename.endswith(("warnings.py", __file__))]
        ours = [f for f in stack if f.filename.startswith(PIPELINE_DIR)]
        functions = {f.name for f in ours}
        if not in_train or step is None:
            kind = "outside_loop"
        elif functions & set(LOG_READS):
            kind = "log_read"
        elif functions & set(CHECKPOINTS):
            kind = "checkpoint"
        else:
            kind = "step"
        self.events.append({
            "thread": threading.current_thread().name,
            "kind": kind,
            "step": step,
            "pipeline": _location(ours[-1]) if ours else None,
            "innermost": _location(stack[-1]) if stack else f"{filename}:{lineno}",
        })
        return None

    def summary(self) -> dict:
        kinds = collections.Counter(e["kind"] for e in self.events)
        loop_steps = sorted({e["step"] for e in self.events if e["kind"] != "outside_loop"})
        in_step = [e for e in self.events if e["kind"] == "step"]
        per_step = collections.Counter(e["step"] for e in in_step)

        def places(events, limit=None):
            counted = collections.Counter((e["pipeline"], e["innermost"], e["thread"]) for e in events)
            return [{"pipeline": p, "innermost": i, "thread": t, "count": n}
                    for (p, i, t), n in counted.most_common(limit)]

        return {
            "syncs_total": len(self.events),
            "syncs_by_kind": dict(kinds),
            "loop_steps_seen": len(loop_steps),
            "syncs_per_step_apart_from_log_reads_and_checkpoints": {str(s): per_step.get(s, 0) for s in loop_steps},
            "in_step_locations": places(in_step),
            "log_read_locations": places([e for e in self.events if e["kind"] == "log_read"]),
            "checkpoint_locations": places([e for e in self.events if e["kind"] == "checkpoint"], 10),
            "outside_loop_locations": places([e for e in self.events if e["kind"] == "outside_loop"], 15),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mode", choices=["warn", "error"], default="warn")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- <pipeline command> <its arguments>")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    recorder = SyncRecorder()
    recorder.install()
    torch.cuda.set_sync_debug_mode(args.mode)
    try:
        code = pipeline_main(command)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        result = {"command": command[:1], "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                  **recorder.summary()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if not k.endswith("locations")}, indent=2))
        print(json.dumps(result["in_step_locations"][:10], indent=2))
    return code


if __name__ == "__main__":
    libraries_loaded()  # collection resumes (benchmarks/__init__.py)
    sys.exit(main())
