"""Snakemake profiles and the paper recipe: the whole DAG plans offline with each profile, launch commands come
from the config, and a failing job's own error reaches the console. The profiles and the failing job go through
the command line; what a dry run plans is read from one planned in this process (tests/dry_run.py)."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import PROJECT_ROOT
from tests.dry_run import command_line_dry_run, dry_run

pytestmark = pytest.mark.integration

PROFILES = PROJECT_ROOT / "profiles"
EXPORT_AND_BENCHMARK_RULES = {"export_onnx", "quantize_onnx", "export_coreml", "export_full_size", "bundle",
                              "int8_search", "export_full_size_int8", "export_peers", "export_gemm_floor",
                              "benchmark", "report"}


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """The snakemake command line; a dry run goes through it in this process (tests/dry_run.py)."""
    arguments = ["--snakefile", str(PROJECT_ROOT / "Snakefile"), "--directory", str(workdir), *args]
    if "-n" in args:
        return command_line_dry_run(arguments, cwd=workdir)
    return subprocess.run([sys.executable, "-m", "snakemake", *arguments], capture_output=True, text=True, timeout=600)


def planned_jobs(output: str) -> dict[str, int]:
    """The `Job stats` table of a dry run: rule -> count."""
    lines = output[output.index("Job stats:"):].splitlines()[3:]
    jobs = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        jobs[parts[0]] = int(parts[1])
    return jobs


@pytest.mark.parametrize("profile", [None, "local", "slurm"])
def test_the_paper_recipe_plans_the_whole_dag_offline(tmp_path, profile):
    options = ["--profile", str(PROFILES / profile)] if profile else ["--cores", "8"]
    completed = snakemake(tmp_path, "-n", *options, "--configfile", str(PROJECT_ROOT / "configs" / "paper.yaml"),
                          "--config", f"output_root={tmp_path / 'paper'}")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    jobs = planned_jobs(completed.stdout + completed.stderr)
    assert EXPORT_AND_BENCHMARK_RULES <= jobs.keys(), jobs
    # A hub teacher: no teacher_pretrain; the student and every export are planned (the random-init ablation is
    # built by target study).
    assert "teacher_pretrain" not in jobs and jobs["distill_pretrain"] == 1 and jobs["export_onnx"] == 3
    # The full-size builds the benchmark times: BERT-base's searched int8 graph, DistilBERT's peers (the ones
    # benchmark.timed_full_size names), the GEMM floor.
    assert jobs["export_full_size"] == 2 and jobs["export_full_size_int8"] == jobs["export_peers"] == 1
    assert not (tmp_path / "paper").exists()


@pytest.mark.parametrize("profile", ["local", "slurm"])
def test_each_profile_dry_runs_the_test_dag(tmp_path, profile):
    completed = snakemake(tmp_path, "-n", "--profile", str(PROFILES / profile), "--configfile",
                          str(PROJECT_ROOT / "configs" / "test.yaml"), "--config", f"output_root={tmp_path / 'out'}")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert {"teacher_pretrain", "distill_squad", "bundle", "report"} <= planned_jobs(completed.stdout).keys()


def shell_commands(output: str) -> list[list[str]]:
    """The shell commands a `-p` dry run prints, split as a POSIX shell splits them."""
    printed = [line.split("Shell command: ", 1)[1] for line in output.splitlines() if "Shell command: " in line]
    return [shlex.split(command) for command in printed if command != "None"]  # None: a rule without a shell


def test_paths_with_spaces_and_quotes_reach_every_job_as_single_arguments(tmp_path):
    root = tmp_path / "out dir \"double\" 'single' $HOME `x`"
    squad = root.parent / "squad files" / "it's train.json"
    squad.parent.mkdir()
    squad.write_text(json.dumps({"version": "1.1", "data": []}))
    config = tmp_path / "config.yaml"
    config.write_text(f"output_root: {json.dumps(str(root))}\ndata:\n  squad: {json.dumps(str(squad))}\n"
                      f"  squad_dev: {json.dumps(str(squad))}\n  corpus: squad_contexts\n")
    completed = dry_run(tmp_path, [PROJECT_ROOT / "configs" / "test.yaml", config], print_shell_commands=True)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    commands = shell_commands(completed.stdout)
    assert len(commands) >= 15
    path_options = {"--out-dir", "--data-dir", "--tokenizer-dir", "--pretrained-dir", "--work-dir", "--student-dir",
                    "--teacher-dir", "--teacher", "--model-dir", "--onnx-dir", "--root", "--token-counts"}
    seen = set()
    for words in commands:
        # An optional flag is one word, --option=value (tests/plan/test_stage_cli.py); a required one two.
        options = [part for word in words for part in (word.split("=", 1) if word.startswith("--") else [word])]
        for option, value in zip(options, options[1:]):
            if option in path_options:
                assert value.startswith(str(root)), (option, value)
                seen.add(option)
            if option == "--config-json" and "data" in json.loads(value):
                assert json.loads(value)["data"]["squad"] == str(squad)
        assert words[-3] == ">" and words[-2].startswith(str(root)) and words[-1] == "2>&1"
    assert {"--out-dir", "--data-dir", "--pretrained-dir", "--work-dir", "--teacher"} <= seen


def test_training_rules_are_launched_from_the_compute_section(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"output_root: {json.dumps(str(tmp_path / 'out'))}\n"
                      "compute:\n  processes: 2\n  mixed_precision: fp16\n")
    completed = dry_run(tmp_path, [PROJECT_ROOT / "configs" / "test.yaml", config], cores=4, print_shell_commands=True)
    assert completed.returncode == 0, completed.stdout[-3000:]
    launched = {}
    for words in shell_commands(completed.stdout):
        if "torch.distributed.run" in words:
            stage = words[words.index("pipeline") + 1]
            launched[stage] = words
            assert "--nproc_per_node=2" in words and "--standalone" in words
            assert "ACCELERATE_MIXED_PRECISION=fp16" in words
            # The shell computes the threads per process from the rule's threads (4 cores at most): t // 2, >= 1
            start = words.index("OMP_NUM_THREADS=$((")
            rule_threads = int(words[start + 1])
            assert words[start + 1:start + 13] == [str(rule_threads), "/", "2", ">", "0", "?", str(rule_threads), "/",
                                                   "2", ":", "1", "))"], words[start:start + 13]
            assert 1 <= max(1, rule_threads // 2) <= 2
        elif "-m" in words and words[words.index("-m") + 1] == "pipeline":
            assert words[words.index("pipeline") + 1] not in ("teacher-pretrain", "distill-pretrain")
    assert {"teacher-pretrain", "teacher-finetune", "distill-pretrain", "distill-squad"} <= launched.keys()


def test_several_nodes_start_one_torchrun_per_node_at_a_c10d_rendezvous(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"output_root: {json.dumps(str(tmp_path / 'out'))}\n"
                      "compute:\n  nodes: 2\n  processes: 4\n  gpus: 4\n  rdzv_endpoint: head-node:29400\n")
    # A cluster's profile names the node-local folder per rule (set-resources); here the same option on the CLI.
    completed = snakemake(tmp_path, "-n", "-p", "--cores", "8", "--resources", "gpu=4", "--configfile",
                          str(PROJECT_ROOT / "configs" / "test.yaml"), str(config),
                          "--set-resources", "distill_pretrain:node_local_dir=/local/scratch")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    launched = {words[words.index("pipeline") + 1]: words for words in shell_commands(completed.stdout)
                if "torch.distributed.run" in words}
    assert {"teacher-pretrain", "teacher-finetune", "distill-pretrain", "distill-squad"} <= launched.keys()
    for stage, words in launched.items():
        srun = words.index("srun")
        assert words[srun + 1:srun + 3] == ["--nodes=2", "--ntasks-per-node=1"], words
        assert {"--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=head-node:29400",
                "--rdzv-id=$SLURM_JOB_ID"} <= set(words), words
        assert "--standalone" not in words
        config_json = json.loads(words[words.index("--config-json") + 1])
        assert config_json["compute"] == {"mixed_precision": "bf16", "nodes": 2, "processes": 4}
    assert "--node-local-dir=/local/scratch" in launched["distill-pretrain"]
    assert "--node-local-dir=" in launched["teacher-pretrain"]  # no node-local folder named: read in place


@pytest.mark.parametrize("profile", [[], ["--profile", str(PROFILES / "local")]], ids=["readme-command", "local"])
def test_a_failing_jobs_own_error_reaches_the_console(tmp_path, profile):
    """As the README's `snakemake --cores 2` runs it (the workflow's profiles/default) and with profiles/local."""
    broken = tmp_path / "train.json"
    broken.write_text('{"version": "1.1", "data": [}')
    config = tmp_path / "config.yaml"
    config.write_text(f"output_root: {json.dumps(str(tmp_path / 'out'))}\ndata:\n  squad: {json.dumps(str(broken))}\n"
                      f"  squad_dev: {json.dumps(str(broken))}\n  corpus: squad_contexts\n")
    completed = snakemake(tmp_path, str(tmp_path / "out" / "data"), *profile, "--cores", "1", "--configfile",
                          str(PROJECT_ROOT / "configs" / "test.yaml"), str(config))
    assert completed.returncode != 0
    console = completed.stdout + completed.stderr
    assert f"error: data.squad: {broken}: invalid JSON at line 1 column" in console  # the key, then the file
    assert not (tmp_path / "out" / "data").exists()


def test_a_pretrained_student_skips_pretraining_distillation(tmp_path):
    student = tmp_path / "my student"
    student.mkdir()  # a local folder (a DistilBERT saved elsewhere); the dry run only plans
    config = tmp_path / "config.yaml"
    config.write_text(f"output_root: {json.dumps(str(tmp_path / 'out'))}\n"
                      f"student:\n  pretrained: {json.dumps(str(student))}\n")
    completed = dry_run(tmp_path, [PROJECT_ROOT / "configs" / "test.yaml", config], print_shell_commands=True)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    jobs = planned_jobs(completed.stdout)
    assert "init_student" not in jobs and "distill_pretrain" not in jobs
    assert {"teacher_finetune", "distill_squad", "student_finetune", "bundle", "report"} <= jobs.keys()
    squad_stages = [words for words in shell_commands(completed.stdout) if "distill-squad" in words]
    assert len(squad_stages) == 2
    assert all(words[words.index("--student-dir") + 1] == str(student) for words in squad_stages)


def planned_priorities(output: str) -> dict[str, int]:
    """Each planned job of a dry run ("rule" or "rule[wildcards]") -> its priority (Snakemake's default 0)."""
    priorities, job = {}, None
    for line in output.splitlines():
        if line.startswith(("rule ", "localrule ")):
            job = line.split()[1].rstrip(":")
            priorities[job] = 0
        elif job and line.strip().startswith("wildcards:"):
            priorities[f"{job}[{line.split(':', 1)[1].strip()}]"] = priorities.pop(job)
            job = f"{job}[{line.split(':', 1)[1].strip()}]"
        elif job and line.strip().startswith("priority:"):
            priorities[job] = int(line.split(":")[1])
        elif not line.strip():
            job = None
    return priorities


def test_the_default_plan_runs_the_critical_path_first_and_the_bundled_models_exports_next(tmp_path):
    """At --cores 2 the training chain to distill_squad goes first; the full-size exports wait for prepare_data (an
    ordering input: started at once, they would hold the core the 2-thread tokenizer and pretraining need); the
    bundled student's exports, ready last, take the next free core before the full-size and the other exports."""
    completed = dry_run(tmp_path, [PROJECT_ROOT / "configs" / "default.yaml"], print_shell_commands=True)
    priorities = planned_priorities(completed.stdout)
    for job in ("prepare_data", "tokenizer", "tokenize_corpus", "teacher_pretrain", "distill_squad"):
        assert priorities[job] >= 3, job
    for kind in ("export_onnx", "quantize_onnx", "export_coreml", "export_npu"):
        assert priorities[f"{kind}[model=student]"] == 2, kind
    for kind in ("export_onnx", "quantize_onnx"):
        assert priorities[f"{kind}[model=teacher]"] == priorities[f"{kind}[model=student_ce_only]"] == 0, kind
    for kind in ("export_coreml", "export_npu"):  # the phone builds: the student's alone (export.phone_models)
        assert not any(job.startswith(f"{kind}[model=") and job != f"{kind}[model=student]" for job in priorities)
    assert priorities["export_full_size[architecture=distilbert]"] == 1
    full_size_block = completed.stdout[completed.stdout.index("rule export_full_size:"):].split("\n\n")[0]
    inputs = next(line for line in full_size_block.splitlines() if line.strip().startswith("input:"))
    assert "artifacts/data" in inputs.split(":", 1)[1].strip().split(", ")  # the data folder: an ordering input
