"""Snakemake and its training job killed with SIGKILL: the README's recovery commands finish the DAG, and the job
resumes from its last checkpoint and ends at the same step count.

A stage killed on its own is tested in tests/test_distributed.py (distill_pretrain, resumed to the same weights)."""

import json
import os
import signal
import subprocess
import sys
import time

from tests.conftest import PROJECT_ROOT


# A folder name with spaces and both kinds of quotes: every path reaches the jobs' shells quoted, or this breaks.
AWKWARD_NAME = "out dir \"double\" 'single'"


def snakemake_command(workdir, config, target, *extra):
    return [sys.executable, "-m", "snakemake", target, "--cores", "2", "--snakefile", str(PROJECT_ROOT / "Snakefile"),
            "--directory", str(workdir), "--configfile", str(PROJECT_ROOT / "configs" / "test.yaml"), str(config),
            *extra]


def test_killed_snakemake_recovers_with_unlock_and_rerun_incomplete_and_the_job_resumes(tmp_path):
    # The README's recovery commands, on a real run: snakemake and its job die together (SIGKILL to the process
    # group, as when a node goes down), then `--unlock` and `--rerun-incomplete` finish the DAG from the checkpoint.
    workdir, root = tmp_path / "workdir", tmp_path / AWKWARD_NAME
    workdir.mkdir()
    config = workdir / "config.yaml"
    config.write_text(f"output_root: {json.dumps(str(root))}\n"
                      "teacher:\n  pretrain:\n    max_steps: 60\n    checkpoint_every: 3\n    log_every: 3\n")
    target = str(root / "teacher")
    log = (tmp_path / "first_run.log").open("w")
    process = subprocess.Popen(snakemake_command(workdir, config, target), stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    checkpoints = root / "work" / "teacher_pretrain" / "checkpoints"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None and not list(checkpoints.glob("step-*")):
        time.sleep(0.2)
    assert process.poll() is None, "snakemake ended before it could be killed; raise max_steps"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (root / "teacher_pretrain").exists()  # no complete-looking output after a kill

    locked = subprocess.run(snakemake_command(workdir, config, target), capture_output=True, text=True)
    assert locked.returncode != 0 and "--unlock" in locked.stdout + locked.stderr
    unlocked = subprocess.run(snakemake_command(workdir, config, target, "--unlock"), capture_output=True, text=True)
    assert unlocked.returncode == 0, unlocked.stderr[-2000:]
    rerun = subprocess.run(snakemake_command(workdir, config, target, "--rerun-incomplete"), capture_output=True,
                           text=True)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]

    pretrain = json.loads((root / "teacher_pretrain" / "metrics.json").read_text())
    assert pretrain["resumed_from_step"] > 0 and pretrain["steps"] == 60
    assert (root / "teacher" / "model.safetensors").is_file()  # teacher_finetune got --pretrained-dir intact
    assert json.loads((root / "teacher" / "manifest.json").read_text())["files"]["model.safetensors"]["bytes"] > 0
