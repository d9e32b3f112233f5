# Helpers of every rule file: the typed config, paths, resources, and the one shell pattern of a stage rule.
import json
import os
import shlex
import sys
from pathlib import Path

from pipeline.plan import study_runs
from pipeline.plan.model_registry import bundled_model, exported_models, phone_models, trained_models
from pipeline.plan.code_inputs import command_code_files
from pipeline.plan.config import PipelineConfig, from_dict, to_dict
from pipeline.plan.data_sources import check_local_files, configured_local_paths, local_data_files
from pipeline.plan.deploy import check_local_model, deploy_root
from pipeline.export.peers import BUILT_PEERS
from pipeline.plan.stage_cli import stage_arguments

CFG = from_dict(PipelineConfig, config)  # cross-field checks the schema cannot express
FULL = to_dict(CFG)
# deploy.model set: the DAG deploys that QA model as it is (target deploy) and trains nothing; its build goes to a
# folder of its own under output_root.
DEPLOYING = CFG.deploy.model is not None
ROOT = deploy_root(CFG) if DEPLOYING else CFG.output_root
EXPORTED_MODELS = exported_models(CFG)  # model name -> the stage folder it comes from
PHONE_MODELS = phone_models(CFG)  # the exported models that also get CoreML packages and NPU graphs
TRAINED_MODELS = trained_models(CFG)  # the exported ones and those export.models leaves out
BUNDLED_MODEL = bundled_model(CFG)  # the model the app bundle ships
PYTHON = sys.executable  # the interpreter running snakemake, i.e. the project's environment
TEACHER_FROM_SCRATCH = CFG.teacher.pretrained is None  # then rule teacher_pretrain trains the MLM teacher
# The MLM teacher that init_student copies from and distill_pretrain learns from: a directory or a hub name.
MLM_TEACHER = f"{ROOT}/teacher_pretrain" if TEACHER_FROM_SCRATCH else CFG.teacher.pretrained
# TinyBERT's task-stage augmentation asks the MLM teacher for replacement words.
AUGMENT = CFG.distill_squad.augmentation.copies > 0
MLM_TEACHER_FOR_AUGMENTATION = str(MLM_TEACHER) if AUGMENT else ""  # '': distill_squad gets none
# Every local file or folder the config names must exist, whatever outputs already do: a missing one stops the
# run here with its key (Snakemake would otherwise keep going on an old build without a word).
check_local_files(CFG)
LOCAL_PATHS = configured_local_paths(CFG)


def folder_files(folder):
    """Every file under a folder the config names, as inputs: Snakemake judges a folder input by the folder's own
    timestamp, which editing a file inside it does not change, so only the files make an edit rerun the rule."""
    return sorted(str(path) for path in Path(folder).rglob("*") if path.is_file())


if "deploy.model" in LOCAL_PATHS:
    check_local_model(CFG.deploy.model, CFG)  # a model the exporters cannot take stops planning, with the reason
# The student the SQuAD stages start from: distilled here (rule distill_pretrain), or student.pretrained (a hub
# name or a folder), which skips init_student and distill_pretrain.
STUDENT_DISTILLED_HERE = CFG.student.pretrained is None
SQUAD_STUDENT = f"{ROOT}/distill_pretrain/main" if STUDENT_DISTILLED_HERE else CFG.student.pretrained
# A local folder is an input too (an edit reruns the SQuAD stages); a hub name is not a file.
SQUAD_STUDENT_INPUT = ([SQUAD_STUDENT] if STUDENT_DISTILLED_HERE
                       else folder_files(SQUAD_STUDENT) if "student.pretrained" in LOCAL_PATHS else [])
# Pretraining-distillation variants: the configured student, and the random-init ablation with the same budget
# (evidence, built by target `study`).
STUDENT_VARIANTS = ["main"] + (["random_init_ablation"] if CFG.distill_pretrain.run_random_init_ablation else [])

# Local SQuAD and corpus files are inputs: editing one reruns what depends on it.
DATA_FILES = (sorted(os.path.normpath(path) for key, path in LOCAL_PATHS.items() if key.startswith("data.")) if DEPLOYING
              else local_data_files(CFG.data.squad, CFG.data.squad_dev, CFG.data.corpus))
# A local corpus file is read where it is by tokenizer and tokenize_corpus: an edit reruns them.
CORPUS_FILES = [f for f in DATA_FILES if f == CFG.data.corpus]

# node_local_dir: where the MLM stages copy the corpus's ids.bin on each node and read it ("": in place); a
# cluster's profile sets it (set-resources). Resources are formatted when the job runs: none is a rule's input.
TRAIN_RESOURCES = {"mem_mb": CFG.compute.training_mem_mb, "gpu": CFG.compute.gpus, "node_local_dir": ""}
if CFG.compute.nodes > 1:
    # SLURM allocates the nodes and the rule's own srun starts one launcher on each (an `mpi` job, which the slurm
    # executor runs as it is instead of under `srun -n1`).
    TRAIN_RESOURCES.update(nodes=CFG.compute.nodes, tasks=CFG.compute.nodes, mpi="srun")
    if CFG.compute.rdzv_endpoint:
        TRAIN_RESOURCES["rdzv_endpoint"] = CFG.compute.rdzv_endpoint
LIGHT_RESOURCES = {"mem_mb": CFG.compute.light_mem_mb, "gpu": 0}
DATA_RESOURCES = {"mem_mb": CFG.compute.data_mem_mb, "gpu": 0}
EXPORT_RESOURCES = {"mem_mb": CFG.compute.export_mem_mb, "gpu": 0}
# Rules that can run side by side (the two distill_pretrain variants; student_finetune and distill_squad)
# take half the cores each: small models use two threads poorly, so two 1-thread jobs side by side finish sooner
# than the two one after the other with every core (docs/findings.md, "Two cores").
PAIRED_THREADS = max(1, workflow.cores // 2)
EXPORT_SECTIONS = ("seed", "squad", "export")
# The full-size builds around the benchmark: the int8 search runs on the full-size DistilBERT, and its recipe is
# built for the other architectures (export_full_size_int8); the peers benchmark.timed_full_size names are built per
# architecture (export_peers).
FULL_SIZE = CFG.export.full_size.architectures
INT8_SEARCHED = "distilbert" in FULL_SIZE
NPU_BUILT = CFG.export.npu.enabled  # the Android NPU graphs (rule export_npu)
SEARCHED_INT8_BUILT_FOR = [architecture for architecture in FULL_SIZE if INT8_SEARCHED and architecture != "distilbert"]
PEERS_BUILT = {architecture: [peer for peer in BUILT_PEERS
                              if f"{architecture}/{peer}" in CFG.benchmark.timed_full_size]
               for architecture in FULL_SIZE}
PEERS_BUILT = {architecture: names for architecture, names in PEERS_BUILT.items() if names}
# Priorities: the chain to distill_squad is the critical path, then the CE-only baseline and the bundled model's
# exports (export_priority), then the full-size exports (which need nothing from training); the other export rules
# fill idle cores.
CRITICAL, BASELINE, FULL_SIZE_FIRST, FILLER = 3, 2, 1, 0


def export_priority(wildcards):
    """An export rule's priority: the bundled model's exports are ready last (its training ends the critical path) and
    needed first (the bundle, and int8_search reads every model's quantize_onnx), so they take the next free core;
    the other models' fill idle cores."""
    return BASELINE if wildcards.model == BUNDLED_MODEL else FILLER


def training_threads(train_cfg, default):
    """Cores a training rule asks for: its configured torch threads (cpu_threads) per process when set, so the
    trained weights do not depend on --cores (float sums differ with the thread count); `default` otherwise."""
    if train_cfg.cpu_threads:
        return train_cfg.cpu_threads * CFG.compute.processes
    return default


def check_layer_mappings():
    """A from-scratch teacher's depth is known now: a layer mapping outside it stops the run before any job."""
    if not TEACHER_FROM_SCRATCH:
        return  # a hub teacher's depth is known once it is loaded; init_student and distill_squad check it then
    from pipeline.distillation.students import teacher_layers_for_student

    n_teacher = CFG.teacher.architecture.num_layers
    n_student = CFG.student.n_layers or max(1, n_teacher // 2)
    teacher_layers_for_student(CFG.student.layer_mapping, n_teacher, n_student, key="student.layer_mapping")
    if "tinybert" in CFG.distill_squad.objectives:
        teacher_layers_for_student(CFG.distill_squad.tinybert.layer_mapping, n_teacher, n_student,
                                   key="distill_squad.tinybert.layer_mapping")


check_layer_mappings()


def stage_config(*sections, export_models=False):
    """The config sections a stage reads, as JSON: editing another section does not rerun it. export.models and
    export.phone_models only with `export_models`: which models are exported decides which export jobs run, not what
    any of them computes, so it reaches only the rules that read the whole set (the int8 search, the benchmark, the
    report), and adding a model does not rerun the others' exports."""
    sections = {name: FULL[name] for name in sections}
    if "export" in sections and not export_models:
        sections["export"] = {key: value for key, value in sections["export"].items()
                              if key not in ("models", "phone_models")}
    return json.dumps(sections, sort_keys=True)


# The launch settings that change what training computes (the number of ranks, the precision).
TRAINING_LAUNCH_KEYS = ("nodes", "processes", "mixed_precision")
# c10d rendezvous of a multi-node job without compute.rdzv_endpoint: torchrun's default port on the allocation's
# first node, looked up by the job's shell.
FIRST_SLURM_NODE_ENDPOINT = '"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)":29500'


def search_config():
    """The settings the int8 search reads: its timing settings, not the rest of the benchmark section (a change of
    benchmark.runs does not search again), the exported models whose gate verdicts it reads and the latency tie
    (export.quantize.latency_tie_fraction) within which it keeps onnxruntime's default session options."""
    keys = ("sequence_lengths", "warmup", "search_runs", "session_options")
    tie = {"latency_tie_fraction": FULL["export"]["quantize"]["latency_tie_fraction"]}
    return json.dumps({"benchmark": {key: FULL["benchmark"][key] for key in keys}, "deploy": FULL["deploy"],
                       "export": {"models": FULL["export"]["models"], "quantize": tie}}, sort_keys=True)


def training_config(*sections):
    """stage_config plus the launch settings that change what training computes (not memory requests)."""
    chosen = {name: FULL[name] for name in sections}
    chosen["compute"] = {key: FULL["compute"][key] for key in TRAINING_LAUNCH_KEYS}
    return json.dumps(chosen, sort_keys=True)


def code(command, *extra):
    """The files `python -m pipeline <command>` runs (its import closure within pipeline/), and `extra` paths,
    as inputs: editing any of them reruns the rule."""
    return command_code_files(command) + list(extra)


def stage_shell(command, training=False, threads_variable=None, **arguments):
    """The shell command of a stage rule: `python -m pipeline <command> --config-json {params.cfg:q}` and one flag
    per keyword, its output to the rule's log. The keywords are the stage function's parameter names and their
    values shell text, mostly placeholders (model_dir="{input.model:q}" gives --model-dir {input.model:q}); a
    keyword the stage does not take, or a required parameter left out, stops planning (pipeline/plan/stage_cli.py).
    training=True launches it as compute.processes processes (torchrun, PyTorch DDP) on each of compute.nodes nodes
    with the precision as accelerate's ACCELERATE_MIXED_PRECISION and OMP_NUM_THREADS the rule's threads per
    process; threads_variable (OMP_NUM_THREADS, RAYON_NUM_THREADS) is set to the rule's threads. Threads are
    formatted by Snakemake when the job runs, so --cores never changes a rule's inputs or params."""
    processes = CFG.compute.processes if training else 1
    env = []
    if training:
        env.append(f"ACCELERATE_MIXED_PRECISION={shlex.quote(CFG.compute.mixed_precision)}")
        threads_variable = "OMP_NUM_THREADS"
    if threads_variable:
        # threads // processes, at least 1 (bash arithmetic: formatted when the job runs)
        per_process = ("{threads}" if processes == 1
                       else f"$(( {{threads}} / {processes} > 0 ? {{threads}} / {processes} : 1 ))")
        env.append(f"{threads_variable}={per_process}")
    python = shlex.quote(PYTHON)
    nodes = CFG.compute.nodes if training else 1
    if nodes > 1:
        # One torchrun per node (srun), meeting the others at the c10d endpoint; the SLURM job id names the run.
        endpoint = "{resources.rdzv_endpoint:q}" if CFG.compute.rdzv_endpoint else FIRST_SLURM_NODE_ENDPOINT
        start = (f"srun --nodes={nodes} --ntasks-per-node=1 {python} -m torch.distributed.run --nnodes={nodes} "
                 f"--nproc-per-node={processes} --rdzv-backend=c10d --rdzv-endpoint={endpoint} "
                 f'--rdzv-id="$SLURM_JOB_ID" -m pipeline {command}')
    elif processes > 1:
        start = f"{python} -m torch.distributed.run --standalone --nproc_per_node={processes} -m pipeline {command}"
    else:
        start = f"{python} -m pipeline {command}"
    flags = stage_arguments(command, {"cfg": "{params.cfg:q}", **arguments})
    return " ".join(env + [start, flags, "> {log:q} 2>&1"])


def log_file(job):
    return f"{ROOT}/logs/{job}.log"


def benchmark_file(job):
    return f"{ROOT}/benchmarks/{job}.tsv"


def caption(name):
    """A report entry's caption (report/<name>.rst), by absolute path: the rule files are not beside the Snakefile."""
    return str(Path(workflow.basedir) / "report" / f"{name}.rst")


WEB_CLIENT = Path(workflow.basedir) / "clients" / "web"
# What rule benchmark_web runs: the timing script, the Chromium driver and server, the latency page, the
# client's sources and the locked packages.
WEB_CLIENT_FILES = [*(str(WEB_CLIENT / "scripts" / name) for name in ("bench.mjs", "chromium.mjs", "serve-demo.mjs")),
                    str(WEB_CLIENT / "package-lock.json"),
                    *sorted(str(path) for path in (WEB_CLIENT / "bench").glob("*")),
                    *sorted(str(path) for path in (WEB_CLIENT / "src").glob("*.js"))]


# Target `study`: the runs (objective x seed) its rules build.
STUDY_RUNS = study_runs.run_names(CFG.study.variants)
for _run in STUDY_RUNS:  # a run config that does not validate stops here, before any job
    from_dict(PipelineConfig, study_runs.run_config(FULL, _run, CFG.study.seeds[0]))


def study_run_config(wildcards):
    """The config sections a study run reads: its variant's distill_squad settings and seed."""
    chosen = study_runs.run_config(FULL, wildcards.run, int(wildcards.seed))
    sections = {name: chosen[name] for name in ("seed", "squad", "distill_squad")}
    sections["compute"] = {key: chosen["compute"][key] for key in TRAINING_LAUNCH_KEYS}
    return json.dumps(sections, sort_keys=True)
