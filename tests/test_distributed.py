"""Training stages under torchrun: 2 CPU processes (PyTorch DDP on gloo) of distill_pretrain on configs/test.yaml,
packed and with gradient accumulation, learn like one process with the same tokens per step, every rank returns
from training, and a 2-process run killed with SIGKILL resumes to the very same weights on two "nodes": two
launchers that meet at a c10d endpoint, each reading the corpus from its own disk."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.config import to_dict
from pipeline.training.batching import epoch_batches, shard
from pipeline.training.processes import ProcessGroup
from tests.conftest import PROJECT_ROOT
from tests.stage_fixtures import build_tiny_artifacts, tiny_config

pytestmark = [pytest.mark.integration, pytest.mark.several_processes]

STEPS, LOG_EVERY = 60, 10
# The two runs see different batches and masks (each rank takes its own token-budget batches, masked with its own
# seeds), so their losses agree only up to noise. Measured on an AMD EPYC (AVX-512): the mean loss of the last two
# logged intervals differs by 0.01 between the runs, while training lowers the loss by 0.41 from the first log to
# the last.
LOSS_TOLERANCE = 0.1
MIN_LOSS_DROP = 0.3


def distill_command(artifacts: dict, out: Path, processes: int, batch_size: int, launcher: list[str] | None = None,
                    node_local_dir: str = "") -> list[str]:
    # Token-budget batches of up to batch_size sequences of 64 tokens (configs/test.yaml's max_seq_length), two
    # micro-batches per optimizer step, packed (no padding, no attention across sequences); the 2-process runs
    # read, batch and mask in a DataLoader worker.
    cfg = tiny_config(distill_pretrain={"packed_attention": True, "train": {
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


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def out_dir(command: list[str]) -> Path:
    return Path(command[command.index("--out-dir") + 1])


def start(command: list[str], log: Path, env: dict[str, str] = ENV, **options) -> subprocess.Popen:
    """Start a command with its output in a file (no pipe to fill up)."""
    with log.open("w") as handle:
        return subprocess.Popen(command, cwd=PROJECT_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, **options)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def kill_after_first_checkpoint(command: list[str], run_dir: Path) -> dict:
    """Start a 2-process run and SIGKILL torchrun as soon as the first checkpoint exists; what was seen then."""
    process = start(command, run_dir.parent / f"{run_dir.name}.log", start_new_session=True)
    checkpoints = run_dir / "work" / "checkpoints"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None and not list(checkpoints.glob("step-*")):
        time.sleep(0.05)
    alive = process.poll() is None
    if alive:
        os.killpg(process.pid, signal.SIGKILL)  # torchrun; its ranks, each in a session of its own, die with it
    process.wait()
    return {"alive_when_killed": alive, "killed_at": time.monotonic(), "checkpoints": sorted(checkpoints.glob("step-*"))}


def logged_losses_by_step(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "out" / "train_log.jsonl").read_text().splitlines()]
    return {record["step"]: record["loss"] for record in records}


def logged_losses(run_dir: Path) -> list[float]:
    return list(logged_losses_by_step(run_dir).values())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted 2-process and 1-process runs, and a 2-process run killed after its first checkpoint, all
    started side by side: each process has one thread, so they share the cores without waiting on each other's
    thread pools."""
    root = tmp_path_factory.mktemp("distributed")
    artifacts = build_tiny_artifacts(root / "tiny", tiny_config())
    commands = {name: distill_command(artifacts, root / name, processes=processes, batch_size=batch_size)
                for name, processes, batch_size in (("two", 2, 8), ("one", 1, 16), ("killed", 2, 8))}
    processes = {name: start(commands[name], root / f"{name}.log") for name in ("two", "one")}
    killed = kill_after_first_checkpoint(commands["killed"], root / "killed")
    results = {"root": root, "artifacts": artifacts, "killed": killed}
    for name, process in processes.items():
        assert process.wait(timeout=600) == 0, (root / f"{name}.log").read_text()[-3000:]
        results[name] = json.loads((out_dir(commands[name]) / "metrics.json").read_text())
    return results


def test_two_processes_learn_like_one_with_the_same_effective_batch(runs):
    two, one = runs["two"], runs["one"]
    assert two["processes"] == 2 and one["processes"] == 1
    assert two["effective_batch_size"] == one["effective_batch_size"] == 32  # processes x sequences x 2 micro-batches
    assert two["steps"] == one["steps"] == STEPS
    assert two["tokens_per_second"] == pytest.approx(2 * two["tokens_per_second_per_process"], rel=1e-3)
    two_losses, one_losses = logged_losses(runs["root"] / "two"), logged_losses(runs["root"] / "one")
    assert len(two_losses) == len(one_losses) == STEPS // LOG_EVERY
    assert one_losses[0] - one_losses[-1] >= MIN_LOSS_DROP  # training moved the loss far more than the tolerance
    late_two, late_one = sum(two_losses[-2:]) / 2, sum(one_losses[-2:]) / 2
    assert abs(late_two - late_one) <= LOSS_TOLERANCE, (two_losses, one_losses)
    log = json.loads((runs["root"] / "two" / "out" / "train_log.jsonl").read_text().splitlines()[-1])
    assert log["effective_batch_size"] == 32 and log["tokens_per_second"] > 0
    # Only rank 0 wrote: one output folder, no leftovers of another rank's atomic writes.
    assert sorted(p.name for p in (runs["root"] / "two").iterdir()) == ["out", "work"]


def test_a_run_killed_with_sigkill_resumes_on_two_nodes_to_the_same_weights(runs, tmp_path):
    killed, run_dir = runs["killed"], runs["root"] / "killed"
    assert killed["alive_when_killed"], "the run ended before it could be killed; raise STEPS"
    checkpoint, = killed["checkpoints"]
    time.sleep(max(0.0, killed["killed_at"] + 3 - time.monotonic()))  # a surviving rank would checkpoint again by now
    assert sorted((run_dir / "work" / "checkpoints").glob("step-*")) == [checkpoint], \
        "a rank outlived its launcher and trained on"
    assert not (run_dir / "out").exists()
    assert {"rng-rank0.pt", "rng-rank1.pt", "model.safetensors", "manifest.json"} <= {p.name for p in checkpoint.iterdir()}

    # The run goes on as two nodes do (compute.nodes 2, one process each): two torchrun agents on this machine
    # meet at a c10d endpoint on 127.0.0.1, and each copies ids.bin to its own "node-local" folder
    # ($NODE_SCRATCH, expanded by the stage) and reads it there.
    launcher = ["-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=two-nodes", "-m", "pipeline"]
    command = distill_command(runs["artifacts"], run_dir, processes=2, batch_size=8, launcher=launcher,
                              node_local_dir="$NODE_SCRATCH")
    nodes = []
    for node in (0, 1):
        environment = {"NODE_SCRATCH": str(tmp_path / f"node{node}" / "scratch")}
        nodes.append(start(command, tmp_path / f"node{node}.log", env={**ENV, **environment}))
    for node, process in enumerate(nodes):
        assert process.wait(timeout=600) == 0, (tmp_path / f"node{node}.log").read_text()[-3000:]
    resumed = json.loads((run_dir / "out" / "metrics.json").read_text())
    assert resumed["resumed_from_step"] > 0 and resumed["steps"] == STEPS and resumed["processes"] == 2
    corpus_ids = (runs["artifacts"]["corpus"] / "ids.bin").read_bytes()
    for node in (0, 1):
        copies = list((tmp_path / f"node{node}" / "scratch").iterdir())
        assert [path.name.startswith("ids-") for path in copies] == [True]  # one whole copy, no partial file
        assert copies[0].read_bytes() == corpus_ids

    # Every rank's RNG and data position came back: the result is the uninterrupted run's, bit for bit.
    reference = load_file(runs["root"] / "two" / "out" / "model.safetensors")
    weights = load_file(run_dir / "out" / "model.safetensors")
    assert reference.keys() == weights.keys()
    assert all(torch.equal(reference[name], weights[name]) for name in reference)
    # The log too, except the interval the kill cut: it averages only the steps re-done after the checkpoint.
    cut = -(-resumed["resumed_from_step"] // LOG_EVERY) * LOG_EVERY
    assert {s: loss for s, loss in logged_losses_by_step(run_dir).items() if s != cut} == {
        s: loss for s, loss in logged_losses_by_step(runs["root"] / "two").items() if s != cut}


def test_shards_split_each_length_grouped_global_batch_evenly_between_ranks():
    lengths = [(i * 37) % 50 + 1 for i in range(45)]
    for global_batch in epoch_batches(45, 16, seed=3, epoch=0, lengths=lengths):
        parts = [shard(global_batch, rank, 2) for rank in range(2)]
        assert len(parts[0]) == len(parts[1]) >= 1
        assert set(parts[0]) | set(parts[1]) == set(global_batch)  # the short last batch pads by repeating
    assert shard([1, 2, 3], 0, 1) == [1, 2, 3] and ProcessGroup().world_size == 1
