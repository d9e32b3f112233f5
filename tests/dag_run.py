"""The whole Snakemake DAG on configs/test.yaml, run once for the session the hard way: killed, then recovered.

snakemake and its teacher_pretrain job are killed with SIGKILL (the process group, as when a node goes down) as
soon as the job has written its first checkpoint; then the recovery commands of docs/scale.md, `--unlock` and
`--rerun-incomplete`, finish the DAG. tests/test_resume_after_kill.py checks the recovery, tests/test_pipeline_dag.py
what the finished DAG wrote, tests/test_web_client.py the JavaScript client's parity on its bundle: one run of the
DAG serves them all (tests/conftest.py: the `dag_run` fixture).
"""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.paths import PROJECT_ROOT
from tests.dry_run import dry_run
from tests.processes import kill_with_descendants, run, start

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


def run_dag_killed_and_recovered(base: Path) -> DagRun:
    """`start(command, **Popen options)` and `run(command, timeout)` (tests/processes.py) start each
    snakemake command in a process group of its own: the killed run is killed with its group."""
    workdir, root = base / "workdir", base / AWKWARD_NAME
    workdir.mkdir()
    config = workdir / "config.yaml"
    config.write_text(f"output_root: {json.dumps(str(root))}\n"
                      f"teacher:\n  pretrain:\n    max_steps: {PRETRAIN_STEPS}\n"
                      f"    checkpoint_every: {PRETRAIN_CHECKPOINT_EVERY}\n    log_every: {PRETRAIN_CHECKPOINT_EVERY}\n")
    killed_run_log = base / "killed_run.log"
    with killed_run_log.open("w") as log:
        process = start(snakemake_command(workdir, config), stdout=log, stderr=subprocess.STDOUT)
        try:
            checkpoints = root / "work" / "teacher_pretrain" / "checkpoints"
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and process.poll() is None and not list(checkpoints.glob("step-*")):
                time.sleep(0.2)
            assert process.poll() is None, "snakemake ended before it could be killed; raise PRETRAIN_STEPS"
            os.killpg(process.pid, signal.SIGKILL)
        finally:  # on an interruption too: the run is in a session of its own
            kill_with_descendants(process.pid)
            process.wait()
    pretrain_output_after_kill = (root / "teacher_pretrain").exists()

    locked = run(snakemake_command(workdir, config), timeout=900)
    unlocked = run(snakemake_command(workdir, config, "--unlock"), timeout=900)
    rerun = run(snakemake_command(workdir, config, "--rerun-incomplete"), timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    return DagRun(root, workdir, config, killed_run_log, pretrain_output_after_kill, locked, unlocked, rerun)
