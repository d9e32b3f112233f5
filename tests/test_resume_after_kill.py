"""A training stage killed with SIGKILL resumes from its last checkpoint and ends at the same step count."""

import json
import os
import signal
import subprocess
import sys
import time

from pipeline.config import to_dict
from tests.conftest import PROJECT_ROOT
from tests.stage_fixtures import build_tiny_artifacts, tiny_config


def test_kill_9_then_rerun_resumes_and_finishes(tmp_path):
    cfg = tiny_config(distill_pretrain={"train": {"max_steps": 400, "checkpoint_every": 5, "log_every": 5}})
    artifacts = build_tiny_artifacts(tmp_path / "tiny", cfg)
    command = [
        sys.executable, "-m", "pipeline", "distill-pretrain", "--config-json", json.dumps(to_dict(cfg)),
        "--student-dir", str(artifacts["student"]), "--teacher", str(artifacts["mlm_teacher"]),
        "--data-dir", str(artifacts["data"]), "--token-counts", str(artifacts["counts"] / "token_counts.json"),
        "--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoints = tmp_path / "work" / "checkpoints"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if any(p.name.startswith("step-") for p in checkpoints.glob("step-*")):
            break
        time.sleep(0.2)
    assert process.poll() is None, "the run ended before it could be killed; raise max_steps"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "out").exists()  # no complete-looking output after a kill

    completed = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr[-2000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["resumed_from_step"] > 0
    assert metrics["steps"] == 400
