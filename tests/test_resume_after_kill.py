"""Snakemake and its training job killed with SIGKILL: the recovery commands of docs/scale.md finish the DAG, and the
job resumes from its last checkpoint and ends at the same step count.

The killed and recovered run is the session's DAG run (tests/dag_run.py), whose outputs tests/test_pipeline_dag.py
checks. A stage killed on its own is tested in tests/test_distributed.py (distill_pretrain, resumed to the same
weights)."""

import json

from tests.dag_run import PRETRAIN_STEPS


def test_killed_snakemake_recovers_with_unlock_and_rerun_incomplete_and_the_job_resumes(dag_run):
    assert not dag_run.pretrain_output_after_kill  # no complete-looking output after a kill
    locked = dag_run.locked
    assert locked.returncode != 0 and "--unlock" in locked.stdout + locked.stderr
    assert dag_run.unlocked.returncode == 0, dag_run.unlocked.stderr[-2000:]
    assert dag_run.rerun.returncode == 0, dag_run.rerun.stdout[-2000:] + dag_run.rerun.stderr[-2000:]

    root = dag_run.root
    pretrain = json.loads((root / "teacher_pretrain" / "metrics.json").read_text())
    assert pretrain["resumed_from_step"] > 0 and pretrain["steps"] == PRETRAIN_STEPS
    assert (root / "teacher" / "model.safetensors").is_file()  # teacher_finetune got --pretrained-dir intact
    assert json.loads((root / "teacher" / "manifest.json").read_text())["files"]["model.safetensors"]["bytes"] > 0
