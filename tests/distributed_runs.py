"""distill_pretrain under torchrun, run once per test run (tests/conftest.py: the `distributed_runs` fixture);
tests/test_distributed.py checks what the runs wrote.

2 CPU processes (PyTorch DDP on gloo) of distill_pretrain on configs/test.yaml, packed and with gradient
accumulation, beside 1 process with the same tokens per step; and a 2-process run killed with SIGKILL after its
first checkpoint, then resumed on two "nodes": two launchers that meet at a c10d endpoint, each reading the corpus
from its own disk."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.paths import PROJECT_ROOT
from tests.processes import kill_with_descendants

STEPS, LOG_EVERY = 60, 10
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@dataclass
class DistributedRuns:
    root: Path  # one folder per run: two/, one/, killed/ (resumed on two nodes), each with out/ and work/
    corpus: Path  # the tokenized corpus every run read
    metrics: dict  # run name -> its metrics.json (two, one, and the killed run's resumption)
    killed_alive_when_killed: bool  # the run was still training when it was killed
    processes_below_the_killed_launcher: int  # its ranks (and their DataLoader workers) when it was killed
    processes_alive_10s_after_the_kill: list[int]  # any of them still running 10 s after the kill
    checkpoints_after_kill: list[Path]  # the killed run's checkpoints right after the kill
    checkpoints_3s_later: list[Path]  # and 3 s later: a rank that outlived its launcher would have written more
    files_of_the_checkpoint: list[str]  # the names in the killed run's (first) checkpoint then
    out_after_kill: bool  # whether the killed run had written out/ by then
    node_scratch: list[Path]  # each "node's" own folder the corpus was copied to


def distill_command(artifacts: dict, out: Path, processes: int, batch_size: int, launcher: list[str] | None = None,
                    node_local_dir: str = "") -> list[str]:
    from pipeline.plan.config import to_dict
    from tests.stage_fixtures import tiny_config

    # Token-budget batches of up to batch_size sequences of 64 tokens (configs/test.yaml's max_seq_length), two
    # micro-batches per optimizer step, packed (no padding, no attention across sequences); the 2-process runs
    # read, batch and mask in a DataLoader worker.
    cfg = tiny_config(distill_pretrain={"train": {
        "max_steps": STEPS, "batch_size": batch_size, "max_tokens_per_batch": 64 * batch_size, "learning_rate": 5e-3,
        "grad_accum_steps": 2, "log_every": LOG_EVERY, "checkpoint_every": 4,
        "dataloader_workers": 1 if processes > 1 else 0,
    }})
    if launcher is None:
        launcher = ["-m", "pipeline"]
        if processes > 1:  # what the Snakefile runs for compute.processes > 1
            launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", "-m",
                        "pipeline"]
    return [
        sys.executable, *launcher, "distill-pretrain", "--config-json", json.dumps(to_dict(cfg)),
        "--student-dir", str(artifacts["student"]), "--teacher", str(artifacts["mlm_teacher"]),
        "--corpus-dir", str(artifacts["corpus"]),
        "--out-dir", str(out / "out"), "--work-dir", str(out / "work"), f"--node-local-dir={node_local_dir}",
    ]


def start_logged(command: list[str], log: Path, env: dict[str, str] = ENV, **options) -> subprocess.Popen:
    """Start a command with its output in a file (no pipe to fill up)."""
    with log.open("w") as handle:
        return subprocess.Popen(command, cwd=PROJECT_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, **options)


def wait_for(process: subprocess.Popen, log: Path) -> None:
    assert process.wait(timeout=600) == 0, log.read_text()[-3000:]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_distributed(base: Path) -> DistributedRuns:
    """The uninterrupted 2-process and 1-process runs and the killed one, side by side (each process has one
    thread, so they share the cores without waiting on each other's thread pools); then the killed run's
    resumption on two nodes. Each command's output goes to a log file beside its run."""
    from tests.stage_fixtures import build_tiny_artifacts, tiny_config

    # A student with dropout (init_student copies the teacher's): its draws come from each rank's global RNG, so the
    # killed run's bit-for-bit resumption shows that every rank's RNG came back, not only its data position.
    artifacts = build_tiny_artifacts(base / "tiny", tiny_config(teacher={"architecture": {"dropout": 0.1}}))
    commands = {name: distill_command(artifacts, base / name, processes=processes, batch_size=batch_size)
                for name, processes, batch_size in (("two", 2, 8), ("one", 1, 16), ("killed", 2, 8))}
    processes = {name: start_logged(commands[name], base / f"{name}.log") for name in ("two", "one")}

    # SIGKILL torchrun as soon as the first checkpoint exists; its ranks, each in a session of its own, die with it.
    # The wait allows for a busy machine (the other tests run beside it).
    killed = start_logged(commands["killed"], base / "killed.log", start_new_session=True)
    try:
        checkpoints = base / "killed" / "work" / "checkpoints"
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and killed.poll() is None and not list(checkpoints.glob("step-*")):
            time.sleep(0.05)
        alive = killed.poll() is None
        ranks = psutil.Process(killed.pid).children(recursive=True) if alive else []
        if alive:
            os.killpg(killed.pid, signal.SIGKILL)
    except BaseException:  # interrupted: its own session would outlive the tests
        kill_with_descendants(killed.pid)
        raise
    finally:
        killed.wait()
    after_kill = sorted(checkpoints.glob("step-*"))
    _, outliving = psutil.wait_procs(ranks, timeout=10)  # every process below the launcher ends with it
    time.sleep(3)  # a surviving rank would checkpoint again by now
    three_seconds_later = sorted(checkpoints.glob("step-*"))
    files_of_the_checkpoint = sorted(path.name for path in after_kill[0].iterdir()) if after_kill else []
    out_after_kill = (base / "killed" / "out").exists()

    # The killed run goes on as two nodes do (compute.nodes 2, one process each): two torchrun agents on this
    # machine meet at a c10d endpoint on 127.0.0.1, and each copies ids.bin to its own "node-local" folder
    # ($NODE_SCRATCH, expanded by the stage) and reads it there.
    launcher = ["-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=two-nodes", "-m", "pipeline"]
    resume = distill_command(artifacts, base / "killed", processes=2, batch_size=8, launcher=launcher,
                             node_local_dir="$NODE_SCRATCH")
    scratch = [base / f"node{node}" / "scratch" for node in (0, 1)]
    nodes = [start_logged(resume, base / f"node{node}.log", env={**ENV, "NODE_SCRATCH": str(scratch[node])})
             for node in (0, 1)]
    for node, process in enumerate(nodes):
        wait_for(process, base / f"node{node}.log")
    for name, process in processes.items():
        wait_for(process, base / f"{name}.log")
    metrics = {name: json.loads((base / name / "out" / "metrics.json").read_text()) for name in ("two", "one", "killed")}
    return DistributedRuns(base, artifacts["corpus"], metrics, alive, len(ranks),
                           [process.pid for process in outliving], after_kill, three_seconds_later,
                           files_of_the_checkpoint, out_after_kill, scratch)
