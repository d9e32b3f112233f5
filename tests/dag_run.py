"""The whole Snakemake DAG on configs/test.yaml, run once for the session the hard way: killed, then recovered.

snakemake and its teacher_pretrain job are killed with SIGKILL (the process group, as when a node goes down) as
soon as the job has written its first checkpoint; then the recovery commands of docs/scale.md, `--unlock` and
`--rerun-incomplete`, finish the DAG. tests/test_resume_after_kill.py checks the recovery, tests/test_pipeline_dag.py
what the finished DAG wrote: one run of the DAG serves both. It starts with the session, in the background, when a
selected test needs it (tests/conftest.py).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tests.conftest import PROJECT_ROOT
from tests.dry_run import dry_run

# The output root's name has spaces and both kinds of quotes: every path reaches the jobs' shells quoted, or the
# DAG breaks.
AWKWARD_NAME = "out dir \"double\" 'single'"
# Enough steps that teacher_pretrain is still training when its first checkpoint (step 3) appears.
PRETRAIN_STEPS = 60
PRETRAIN_CHECKPOINT_EVERY = 3


@dataclass
class DagRun:
    root: Path  # the output root
    workdir: Path  # snakemake's --directory: its locks and metadata
    config: Path  # merged over configs/test.yaml
    killed_run_log: Path
    pretrain_output_after_kill: bool  # whether teacher_pretrain/ existed right after the kill
    locked: subprocess.CompletedProcess  # a plain rerun of the killed DAG
    unlocked: subprocess.CompletedProcess  # --unlock
    rerun: subprocess.CompletedProcess  # --rerun-incomplete

    def snakemake_command(self, *extra: str, target: str | None = None) -> list[str]:
        return snakemake_command(self.workdir, self.config, *extra, target=target)

    def dry_run(self, cores: int = 2) -> subprocess.CompletedProcess:
        """`snakemake -n` of this build, planned in the test process (tests/dry_run.py)."""
        return dry_run(self.workdir, [PROJECT_ROOT / "configs" / "test.yaml", self.config], cores=cores)


def snakemake_command(workdir: Path, config: Path, *extra: str, target: str | None = None) -> list[str]:
    return [sys.executable, "-m", "snakemake", *([target] if target else []), "--cores", "2", "--snakefile",
            str(PROJECT_ROOT / "Snakefile"), "--directory", str(workdir), "--configfile",
            str(PROJECT_ROOT / "configs" / "test.yaml"), str(config), *extra]


def start_in_own_session(command: list[str], **options) -> subprocess.Popen:
    """Start a command in a process group of its own (so that it and its jobs can be killed together)."""
    return subprocess.Popen(command, start_new_session=True, **options)


def run_dag_killed_and_recovered(base: Path, start: Callable[..., subprocess.Popen] = start_in_own_session) -> DagRun:
    """`start(command, **Popen options)` starts each snakemake command; it must start it in a process group of its
    own (the killed run is killed with its group)."""
    workdir, root = base / "workdir", base / AWKWARD_NAME
    workdir.mkdir()
    config = workdir / "config.yaml"
    config.write_text(f"output_root: {json.dumps(str(root))}\n"
                      f"teacher:\n  pretrain:\n    max_steps: {PRETRAIN_STEPS}\n"
                      f"    checkpoint_every: {PRETRAIN_CHECKPOINT_EVERY}\n    log_every: {PRETRAIN_CHECKPOINT_EVERY}\n")
    killed_run_log = base / "killed_run.log"
    with killed_run_log.open("w") as log:
        process = start(snakemake_command(workdir, config), stdout=log, stderr=subprocess.STDOUT)
        checkpoints = root / "work" / "teacher_pretrain" / "checkpoints"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and process.poll() is None and not list(checkpoints.glob("step-*")):
            time.sleep(0.2)
        assert process.poll() is None, "snakemake ended before it could be killed; raise PRETRAIN_STEPS"
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    pretrain_output_after_kill = (root / "teacher_pretrain").exists()

    def run(*extra: str) -> subprocess.CompletedProcess:
        command = snakemake_command(workdir, config, *extra)
        process = start(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            stdout, stderr = process.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    locked = run()
    unlocked = run("--unlock")
    rerun = run("--rerun-incomplete")
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    return DagRun(root, workdir, config, killed_run_log, pretrain_output_after_kill, locked, unlocked, rerun)


class DagRunInBackground:
    """run_dag_killed_and_recovered in a thread of its own, started with the session: its jobs leave a core idle
    much of the time (one job after another on the critical path, the rerun's planning), which the tests that run
    in the meantime use. result() waits for it; stop() kills what it still runs (a session that ends first)."""

    def __init__(self, base: Path):
        self._processes: list[subprocess.Popen] = []
        self._stopping = threading.Event()
        self._outcome: DagRun | BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(base,), name="dag-run", daemon=True)
        self._thread.start()

    def _run(self, base: Path) -> None:
        try:
            self._outcome = run_dag_killed_and_recovered(base, self._start)
        except BaseException as error:  # raised again by result(), in the test that needs the run
            self._outcome = error

    def _start(self, command: list[str], **options) -> subprocess.Popen:
        if self._stopping.is_set():
            raise RuntimeError("the test session ended before the DAG run")
        process = start_in_own_session(command, **options)
        self._processes.append(process)
        return process

    def result(self) -> DagRun:
        self._thread.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome

    def stop(self) -> None:
        self._stopping.set()
        while self._thread.is_alive():  # again while it runs: a command may have started just as it was told
            for process in self._processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
            self._thread.join(timeout=1)
