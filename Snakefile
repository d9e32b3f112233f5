# The DAG, and nothing else: every rule calls one stage's CLI (`python -m pipeline <stage>`).
# Run: snakemake --cores 2                      (embedded offline default, configs/default.yaml)
#      snakemake --cores 2 --configfile configs/paper.yaml   (the paper recipe; merged over the default)
import json
import shlex
import sys
from pathlib import Path

from snakemake.utils import validate

from pipeline.artifacts import EXPORTED_MODELS
from pipeline.config import PipelineConfig, from_dict, to_dict
from pipeline.data import local_data_files

configfile: str(Path(workflow.basedir) / "configs" / "default.yaml")

# A typo or a wrong type stops the run here, before any job, with a message naming the key.
validate(config, str(Path(workflow.basedir) / "configs" / "schema.yaml"))
CFG = from_dict(PipelineConfig, config)  # cross-field checks the schema cannot express
FULL = to_dict(CFG)
ROOT = CFG.output_root
PYTHON = sys.executable  # the interpreter running snakemake, i.e. the project's environment
PACKAGE = Path(workflow.basedir) / "pipeline"
TEACHER_FROM_SCRATCH = CFG.teacher.pretrained is None  # then rule teacher_pretrain trains the MLM teacher
# The MLM teacher that init_student copies from and distill_pretrain learns from: a directory or a hub name.
MLM_TEACHER = f"{ROOT}/teacher_pretrain" if TEACHER_FROM_SCRATCH else CFG.teacher.pretrained
# Pretraining-distillation variants: the configured student, and the random-init ablation with the same budget
# (evidence, built by target `study`).
# TinyBERT's task-stage augmentation asks the MLM teacher for replacement words.
AUGMENT = CFG.distill_squad.augmentation.copies > 0
MLM_TEACHER_ARG = f"--mlm-teacher-dir {shlex.quote(str(MLM_TEACHER))}" if AUGMENT else ""
STUDENT_VARIANTS = ["main"] + (["random_init_ablation"] if CFG.distill_pretrain.run_random_init_ablation else [])
TRAIN_RESOURCES = {"mem_mb": CFG.compute.training_mem_mb, "gpu": CFG.compute.gpus}
# Local SQuAD and corpus files are inputs: editing one reruns what depends on it, a missing one stops the run here.
DATA_FILES = local_data_files(CFG.data.squad, CFG.data.squad_dev, CFG.data.corpus)
LIGHT_RESOURCES = {"mem_mb": CFG.compute.light_mem_mb, "gpu": 0}
DATA_RESOURCES = {"mem_mb": CFG.compute.data_mem_mb, "gpu": 0}
EXPORT_RESOURCES = {"mem_mb": CFG.compute.export_mem_mb, "gpu": 0}
# A local corpus file is read where it is by tokenizer and tokenize_corpus: an edit reruns them.
CORPUS_FILES = [f for f in DATA_FILES if f == CFG.data.corpus]
# Rules that can run side by side (the two distill_pretrain variants; student_finetune and distill_squad)
# take half the cores each: small models use two threads poorly, so on this 2-core machine two 1-thread jobs
# finish in about 60 % of the time of one 2-thread job after the other.
PAIRED_THREADS = max(1, workflow.cores // 2)


def training_threads(train_cfg, default):
    """Cores a training rule asks for: its configured torch threads (cpu_threads) per process when set, so the
    trained weights do not depend on --cores (float sums differ with the thread count); `default` otherwise."""
    if train_cfg.cpu_threads:
        return train_cfg.cpu_threads * CFG.compute.processes
    return default


# Teacher rules that take every core cannot start while a one-thread job holds a core, and Snakemake's
# scheduler fills a free core with any job that fits: jobs that would delay such a rule wait for the last one
# instead (ancient(): ordering only, a retrained teacher does not make them rerun).
if training_threads(CFG.teacher.finetune, workflow.cores) >= workflow.cores:
    AFTER_EVERY_CORE_TEACHER = [ancient(f"{ROOT}/teacher")]
elif TEACHER_FROM_SCRATCH and training_threads(CFG.teacher.pretrain, workflow.cores) >= workflow.cores:
    AFTER_EVERY_CORE_TEACHER = [ancient(f"{ROOT}/teacher_pretrain")]
else:
    AFTER_EVERY_CORE_TEACHER = []
EXPORT_SECTIONS = ("seed", "squad", "export")


def stage_config(*sections):
    """The config sections a stage reads, as JSON: editing another section does not rerun it."""
    return json.dumps({name: FULL[name] for name in sections}, sort_keys=True)


def check_layer_mappings():
    """A from-scratch teacher's depth is known now: a layer mapping outside it stops the run before any job."""
    if not TEACHER_FROM_SCRATCH:
        return  # a hub teacher's depth is known once it is loaded; init_student and distill_squad check it then
    from pipeline.students import teacher_layers_for_student

    n_teacher = CFG.teacher.architecture.num_layers
    n_student = CFG.student.n_layers or max(1, n_teacher // 2)
    teacher_layers_for_student(CFG.student.layer_mapping, n_teacher, n_student, key="student.layer_mapping")
    if "tinybert" in CFG.distill_squad.objectives:
        teacher_layers_for_student(CFG.distill_squad.tinybert.layer_mapping, n_teacher, n_student,
                                   key="distill_squad.tinybert.layer_mapping")


check_layer_mappings()


def launch(stage, threads):
    """The command that starts a training stage, each word shell-quoted: `python -m pipeline <stage>` for one
    process; torchrun (PyTorch DDP) with compute.processes processes otherwise. The precision travels as
    accelerate's ACCELERATE_MIXED_PRECISION, which `accelerate launch --mixed_precision` sets the same way."""
    processes = CFG.compute.processes
    env = [f"ACCELERATE_MIXED_PRECISION={CFG.compute.mixed_precision}",
           f"OMP_NUM_THREADS={max(1, threads // processes)}"]
    if processes == 1:
        command = [PYTHON, "-m", "pipeline", stage]
    else:
        command = [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
                   "-m", "pipeline", stage]
    return " ".join(shlex.quote(word) for word in env + command)


def training_config(*sections):
    """stage_config plus the launch settings that change what training computes (not memory requests)."""
    chosen = {name: FULL[name] for name in sections}
    chosen["compute"] = {key: FULL["compute"][key] for key in ("processes", "mixed_precision")}
    return json.dumps(chosen, sort_keys=True)


def code(*modules):
    """A stage's source files as inputs, so reruns notice code changes."""
    shared = ["__main__", "config", "artifacts"]
    return [str(PACKAGE / f"{m}.py") for m in shared + list(modules)]


rule all:
    input:
        f"{ROOT}/teacher",
        f"{ROOT}/distill_pretrain/main",
        f"{ROOT}/distill_squad",
        f"{ROOT}/student_finetune",
        expand(f"{ROOT}/{{kind}}/{{model}}", kind=["onnx", "quantized", "coreml"], model=list(EXPORTED_MODELS)),
        expand(f"{ROOT}/reference/{{architecture}}", architecture=CFG.export.reference.architectures),
        f"{ROOT}/bundle",
        f"{ROOT}/report/summary.json",


rule prepare_data:
    input:
        data_files=DATA_FILES,
        code=code("stages/prepare_data", "data", "synthetic", "corpus"),
    output:
        directory(f"{ROOT}/data"),
    params:
        python=PYTHON,
        cfg=stage_config("seed", "data"),
    log:
        f"{ROOT}/logs/prepare_data.log",
    benchmark:
        f"{ROOT}/benchmarks/prepare_data.tsv"
    priority: 3  # the chain to distill_squad is the critical path; other jobs fill the idle core
    threads: 1
    resources:
        **DATA_RESOURCES,
    shell:
        "{params.python:q} -m pipeline prepare-data --config-json {params.cfg:q} --out-dir {output:q} > {log:q} 2>&1"


rule tokenizer:
    input:
        data=rules.prepare_data.output[0],
        corpus_file=CORPUS_FILES,
        code=code("stages/tokenizer", "corpus", "data"),
    output:
        directory(f"{ROOT}/tokenizer"),
    params:
        python=PYTHON,
        cfg=stage_config("seed", "data", "tokenizer", "teacher"),  # the corpus source and its hold-out
    log:
        f"{ROOT}/logs/tokenizer.log",
    benchmark:
        f"{ROOT}/benchmarks/tokenizer.tsv"
    priority: 3  # the chain to distill_squad is the critical path; other jobs fill the idle core
    threads: CFG.compute.data_threads  # the WordPiece trainer's own thread pool
    resources:
        **DATA_RESOURCES,
    shell:
        "RAYON_NUM_THREADS={threads} {params.python:q} -m pipeline tokenizer --config-json {params.cfg:q} --data-dir {input.data:q}"
        " --out-dir {output:q} > {log:q} 2>&1"


# The corpus, tokenized once into memory-mapped ids (one worker process per thread); every MLM stage and rank
# reads these files.
rule tokenize_corpus:
    input:
        data=rules.prepare_data.output[0],
        tokenizer=rules.tokenizer.output[0],
        corpus_file=CORPUS_FILES,
        code=code("stages/tokenize_corpus", "corpus", "data"),
    output:
        directory(f"{ROOT}/corpus"),
    params:
        python=PYTHON,
        cfg=stage_config("seed", "data"),
    log:
        f"{ROOT}/logs/tokenize_corpus.log",
    benchmark:
        f"{ROOT}/benchmarks/tokenize_corpus.tsv"
    priority: 3  # the chain to distill_squad is the critical path; other jobs fill the idle core
    threads: CFG.compute.data_threads
    resources:
        **DATA_RESOURCES,
    shell:
        "{params.python:q} -m pipeline tokenize-corpus --config-json {params.cfg:q} --data-dir {input.data:q}"
        " --tokenizer-dir {input.tokenizer:q} --out-dir {output:q} --workers {threads} > {log:q} 2>&1"


if TEACHER_FROM_SCRATCH:

    rule teacher_pretrain:
        input:
            corpus=rules.tokenize_corpus.output[0],
            tokenizer=rules.tokenizer.output[0],
            code=code("stages/teacher", "train", "masking", "mlm", "corpus", "losses", "qa", "squad", "data"),
        output:
            directory(f"{ROOT}/teacher_pretrain"),
        params:
            python=PYTHON,
            cfg=training_config("seed", "teacher"),
            launch=lambda wildcards, threads: launch("teacher-pretrain", threads),
            work=f"{ROOT}/work/teacher_pretrain",
        log:
            f"{ROOT}/logs/teacher_pretrain.log",
        benchmark:
            f"{ROOT}/benchmarks/teacher_pretrain.tsv"
        priority: 3  # the chain to distill_squad is the critical path; other jobs fill the idle core
        threads: training_threads(CFG.teacher.pretrain, workflow.cores)
        resources:
            **TRAIN_RESOURCES,
        shell:
            "{params.launch} --config-json {params.cfg:q}"
            " --corpus-dir {input.corpus:q} --tokenizer-dir {input.tokenizer:q} --out-dir {output:q}"
            " --work-dir {params.work:q} > {log:q} 2>&1"


rule teacher_finetune:
    input:
        data=rules.prepare_data.output[0],
        tokenizer=rules.tokenizer.output[0],
        pretrained=[f"{ROOT}/teacher_pretrain"] if TEACHER_FROM_SCRATCH else [],
        code=code("stages/teacher", "train", "qa", "squad", "data", "masking", "mlm", "corpus", "losses"),
    output:
        directory(f"{ROOT}/teacher"),
    params:
        python=PYTHON,
        cfg=training_config("seed", "teacher", "squad"),
        launch=lambda wildcards, threads: launch("teacher-finetune", threads),
        pretrained=lambda wildcards, input: f"--pretrained-dir {shlex.quote(input.pretrained[0])}" if input.pretrained else "",
        work=f"{ROOT}/work/teacher_finetune",
    log:
        f"{ROOT}/logs/teacher_finetune.log",
    benchmark:
        f"{ROOT}/benchmarks/teacher_finetune.tsv"
    # First among the jobs that become ready with it: it is the longest on the way to distill_squad, and where it
    # takes every core, a 1-thread job started first would keep it waiting beside an idle core.
    priority: 4
    threads: training_threads(CFG.teacher.finetune, workflow.cores)
    resources:
        **TRAIN_RESOURCES,
    shell:
        "{params.launch} --config-json {params.cfg:q}"
        " --data-dir {input.data:q} --tokenizer-dir {input.tokenizer:q} {params.pretrained}"
        " --out-dir {output:q} --work-dir {params.work:q} > {log:q} 2>&1"


rule init_student:
    input:
        teacher=[MLM_TEACHER] if TEACHER_FROM_SCRATCH else [],
        tokenizer=rules.tokenizer.output[0],
        code=code("stages/init_student", "students"),
    output:
        directory(f"{ROOT}/student_init/{{variant}}"),
    wildcard_constraints:
        variant="main|random_init_ablation",
    params:
        python=PYTHON,
        cfg=stage_config("seed", "student"),
        teacher=MLM_TEACHER,
        init=lambda wildcards: "random" if wildcards.variant == "random_init_ablation" else CFG.student.init,
    log:
        f"{ROOT}/logs/init_student_{{variant}}.log",
    benchmark:
        f"{ROOT}/benchmarks/init_student_{{variant}}.tsv"
    # the main student is on the critical path; the random-init ablation waits for idle cores
    priority: lambda wildcards: 3 if wildcards.variant == "main" else 1
    threads: 1
    resources:
        **LIGHT_RESOURCES,
    shell:
        "{params.python:q} -m pipeline init-student --config-json {params.cfg:q} --teacher {params.teacher:q}"
        " --tokenizer-dir {input.tokenizer:q} --init {params.init:q} --out-dir {output:q} > {log:q} 2>&1"


rule distill_pretrain:
    input:
        student=f"{ROOT}/student_init/{{variant}}",
        teacher=[MLM_TEACHER] if TEACHER_FROM_SCRATCH else [],
        corpus=rules.tokenize_corpus.output[0],
        code=code("stages/distill_pretrain", "train", "losses", "masking", "mlm", "corpus", "students", "data"),
    output:
        directory(f"{ROOT}/distill_pretrain/{{variant}}"),
    wildcard_constraints:
        variant="main|random_init_ablation",
    params:
        python=PYTHON,
        cfg=training_config("seed", "distill_pretrain"),
        launch=lambda wildcards, threads: launch("distill-pretrain", threads),
        teacher=MLM_TEACHER,
        work=lambda wildcards: f"{ROOT}/work/distill_pretrain_{wildcards.variant}",
    log:
        f"{ROOT}/logs/distill_pretrain_{{variant}}.log",
    benchmark:
        f"{ROOT}/benchmarks/distill_pretrain_{{variant}}.tsv"
    # the main student is on the critical path; the random-init ablation waits for idle cores
    priority: lambda wildcards: 3 if wildcards.variant == "main" else 1
    threads: training_threads(CFG.distill_pretrain.train, PAIRED_THREADS)
    resources:
        **TRAIN_RESOURCES,
    shell:
        "{params.launch} --config-json {params.cfg:q}"
        " --student-dir {input.student:q} --teacher {params.teacher:q} --corpus-dir {input.corpus:q}"
        " --out-dir {output:q} --work-dir {params.work:q}"
        " > {log:q} 2>&1"


rule distill_squad:
    input:
        student=f"{ROOT}/distill_pretrain/main",
        teacher=rules.teacher_finetune.output[0],
        mlm_teacher=[MLM_TEACHER] if AUGMENT and TEACHER_FROM_SCRATCH else [],
        data=rules.prepare_data.output[0],
        code=code("stages/distill_squad", "augment", "train", "losses", "qa", "squad", "students", "data"),
    output:
        directory(f"{ROOT}/distill_squad"),
    params:
        python=PYTHON,
        cfg=training_config("seed", "squad", "distill_squad"),
        launch=lambda wildcards, threads: launch("distill-squad", threads),
        mlm_teacher=MLM_TEACHER_ARG,
        work=f"{ROOT}/work/distill_squad",
    log:
        f"{ROOT}/logs/distill_squad.log",
    benchmark:
        f"{ROOT}/benchmarks/distill_squad.tsv"
    priority: 3  # the chain to distill_squad is the critical path; other jobs fill the idle core
    threads: training_threads(CFG.distill_squad.train, PAIRED_THREADS)
    resources:
        **TRAIN_RESOURCES,
    shell:
        "{params.launch} --config-json {params.cfg:q}"
        " --student-dir {input.student:q} --teacher-dir {input.teacher:q} {params.mlm_teacher} --data-dir {input.data:q}"
        " --out-dir {output:q} --work-dir {params.work:q} > {log:q} 2>&1"


rule student_finetune:
    input:
        student=f"{ROOT}/distill_pretrain/main",
        # ordering only: never in the way of a teacher rule that needs every core
        after_teacher=AFTER_EVERY_CORE_TEACHER,
        data=rules.prepare_data.output[0],
        code=code("stages/distill_squad", "augment", "train", "losses", "qa", "squad", "students", "data"),
    output:
        directory(f"{ROOT}/student_finetune"),
    params:
        python=PYTHON,
        cfg=training_config("seed", "squad", "distill_squad"),
        launch=lambda wildcards, threads: launch("distill-squad", threads),
        work=f"{ROOT}/work/student_finetune",
    log:
        f"{ROOT}/logs/student_finetune.log",
    benchmark:
        f"{ROOT}/benchmarks/student_finetune.tsv"
    priority: 2  # the CE-only baseline: off the critical path, ahead of the exports
    threads: training_threads(CFG.distill_squad.train, PAIRED_THREADS)
    resources:
        **TRAIN_RESOURCES,
    shell:
        "{params.launch} --ce-only --config-json {params.cfg:q}"
        " --student-dir {input.student:q} --data-dir {input.data:q}"
        " --out-dir {output:q} --work-dir {params.work:q} > {log:q} 2>&1"


rule export_onnx:
    input:
        model=lambda wildcards: f"{ROOT}/{EXPORTED_MODELS[wildcards.model]}",
        data=rules.prepare_data.output[0],
        code=code("stages/export_onnx", "mobile", "qa", "squad", "gates", "data"),
    output:
        directory(f"{ROOT}/onnx/{{model}}"),
    wildcard_constraints:
        model="|".join(EXPORTED_MODELS),
    params:
        python=PYTHON,
        cfg=stage_config(*EXPORT_SECTIONS),
    log:
        f"{ROOT}/logs/export_onnx_{{model}}.log",
    benchmark:
        f"{ROOT}/benchmarks/export_onnx_{{model}}.tsv"
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        "OMP_NUM_THREADS={threads} {params.python:q} -m pipeline export-onnx --config-json {params.cfg:q}"
        " --model-dir {input.model:q} --data-dir {input.data:q} --out-dir {output:q} > {log:q} 2>&1"


# Times its int8 variants to pick the bundle's: it takes every core, so nothing runs beside the timed runs.
rule quantize_onnx:
    input:
        onnx=f"{ROOT}/onnx/{{model}}",
        model=lambda wildcards: f"{ROOT}/{EXPORTED_MODELS[wildcards.model]}",
        data=rules.prepare_data.output[0],
        code=code("stages/quantize", "mobile", "squad", "gates", "latency", "data"),
    output:
        directory(f"{ROOT}/quantized/{{model}}"),
    wildcard_constraints:
        model="|".join(EXPORTED_MODELS),
    params:
        python=PYTHON,
        cfg=stage_config(*EXPORT_SECTIONS),
    log:
        f"{ROOT}/logs/quantize_onnx_{{model}}.log",
    benchmark:
        f"{ROOT}/benchmarks/quantize_onnx_{{model}}.tsv"
    threads: workflow.cores
    resources:
        **EXPORT_RESOURCES,
    shell:
        "OMP_NUM_THREADS={threads} {params.python:q} -m pipeline quantize-onnx --config-json {params.cfg:q}"
        " --onnx-dir {input.onnx:q} --model-dir {input.model:q} --data-dir {input.data:q} --out-dir {output:q}"
        " --threads {threads} > {log:q} 2>&1"


rule export_coreml:
    input:
        model=lambda wildcards: f"{ROOT}/{EXPORTED_MODELS[wildcards.model]}",
        data=rules.prepare_data.output[0],
        code=code("stages/export_coreml", "qa", "squad", "gates", "data"),
    output:
        directory(f"{ROOT}/coreml/{{model}}"),
    wildcard_constraints:
        model="|".join(EXPORTED_MODELS),
    params:
        python=PYTHON,
        cfg=stage_config(*EXPORT_SECTIONS),
    log:
        f"{ROOT}/logs/export_coreml_{{model}}.log",
    benchmark:
        f"{ROOT}/benchmarks/export_coreml_{{model}}.tsv"
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        "OMP_NUM_THREADS={threads} {params.python:q} -m pipeline export-coreml --config-json {params.cfg:q}"
        " --model-dir {input.model:q} --data-dir {input.data:q} --out-dir {output:q} > {log:q} 2>&1"


# The references need nothing from training (random weights). Where a teacher rule takes every core, the
# references wait for it, so their one-thread jobs fill cores beside the one-thread training rules instead of
# holding a core the teacher needs at the start; where the teacher leaves a core free, they fill it from the start.
rule export_reference:
    input:
        after_teacher=AFTER_EVERY_CORE_TEACHER,
        code=code("stages/reference", "stages/export_onnx", "stages/quantize", "stages/export_coreml", "mobile",
                  "gates", "qa", "squad", "latency", "data"),
    output:
        directory(f"{ROOT}/reference/{{architecture}}"),
    wildcard_constraints:
        architecture="distilbert|bert-base",
    params:
        python=PYTHON,
        cfg=stage_config(*EXPORT_SECTIONS),
    log:
        f"{ROOT}/logs/export_reference_{{architecture}}.log",
    benchmark:
        f"{ROOT}/benchmarks/export_reference_{{architecture}}.tsv"
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        "OMP_NUM_THREADS={threads} {params.python:q} -m pipeline export-reference --config-json {params.cfg:q}"
        " --architecture {wildcards.architecture:q} --out-dir {output:q} > {log:q} 2>&1"


rule bundle:
    input:
        quantized=f"{ROOT}/quantized/student",
        coreml=f"{ROOT}/coreml/student",
        model=f"{ROOT}/{EXPORTED_MODELS['student']}",
        data=rules.prepare_data.output[0],
        code=code("stages/bundle", "mobile", "squad", "gates", "data"),
    output:
        directory(f"{ROOT}/bundle"),
    params:
        python=PYTHON,
        cfg=stage_config(*EXPORT_SECTIONS),
    log:
        f"{ROOT}/logs/bundle.log",
    benchmark:
        f"{ROOT}/benchmarks/bundle.tsv"
    threads: 1
    resources:
        **LIGHT_RESOURCES,
    shell:
        "OMP_NUM_THREADS={threads} {params.python:q} -m pipeline bundle --config-json {params.cfg:q}"
        " --quantized-dir {input.quantized:q} --coreml-dir {input.coreml:q} --model-dir {input.model:q}"
        " --data-dir {input.data:q} --out-dir {output:q} > {log:q} 2>&1"


# Times every artifact: it takes every core, so nothing runs beside the timed runs.
rule benchmark:
    input:
        exports=expand(f"{ROOT}/{{kind}}/{{model}}", kind=["onnx", "quantized", "coreml"], model=list(EXPORTED_MODELS)),
        references=expand(f"{ROOT}/reference/{{architecture}}", architecture=CFG.export.reference.architectures),
        bundle=rules.bundle.output[0],
        code=code("stages/benchmark", "latency", "stages/quantize", "stages/reference", "stages/export_onnx", "gates"),
    output:
        directory(f"{ROOT}/benchmark"),
    params:
        python=PYTHON,
        cfg=stage_config("seed", "squad", "export", "benchmark"),
        root=ROOT,
    log:
        f"{ROOT}/logs/benchmark.log",
    benchmark:
        f"{ROOT}/benchmarks/benchmark.tsv"
    threads: workflow.cores
    resources:
        **EXPORT_RESOURCES,
    shell:
        "{params.python:q} -m pipeline benchmark --config-json {params.cfg:q} --root {params.root:q}"
        " --out-dir {output:q} > {log:q} 2>&1"


rule benchmark_web:
    input:
        bundle=rules.bundle.output[0],
        after_benchmark=rules.benchmark.output[0],  # never timed beside it; it names the searched int8 graph
        client=str(Path(workflow.basedir) / "clients" / "web" / "package-lock.json"),
        code=code("stages/benchmark_web", "latency"),
    output:
        f"{ROOT}/benchmark_web/benchmark_web.json",
    params:
        python=PYTHON,
        cfg=stage_config("benchmark"),
        root=ROOT,
    log:
        f"{ROOT}/logs/benchmark_web.log",
    benchmark:
        f"{ROOT}/benchmarks/benchmark_web.tsv"
    threads: workflow.cores
    resources:
        **LIGHT_RESOURCES,
    shell:
        "{params.python:q} -m pipeline benchmark-web --config-json {params.cfg:q} --root {params.root:q}"
        " --out {output:q} > {log:q} 2>&1"


WEB_BENCHMARK = rules.benchmark_web.output[0] if CFG.benchmark.javascript else []


rule report:
    input:
        benchmark=rules.benchmark.output[0],
        web=WEB_BENCHMARK,
        schema=str(Path(workflow.basedir) / "configs" / "summary.schema.json"),
        code=code("stages/report"),
    output:
        summary=report(f"{ROOT}/report/summary.json", category="Summary", caption="report/summary.rst"),
        markdown=f"{ROOT}/report/report.md",
        f1_vs_size=report(f"{ROOT}/report/f1_vs_size.png", category="Accuracy", caption="report/f1_vs_size.rst"),
        f1_vs_latency=report(f"{ROOT}/report/f1_vs_latency.png", category="Accuracy",
                             caption="report/f1_vs_latency.rst"),
        loss_curves=report(f"{ROOT}/report/loss_curves.png", category="Training", caption="report/loss_curves.rst"),
    params:
        python=PYTHON,
        cfg=stage_config("squad", "export", "benchmark"),
        root=ROOT,
        out_dir=f"{ROOT}/report",
        web=lambda wildcards, input: f"--web-benchmark {shlex.quote(str(input.web))}" if input.web else "",
    log:
        f"{ROOT}/logs/report.log",
    benchmark:
        f"{ROOT}/benchmarks/report.tsv"
    threads: 1
    resources:
        **LIGHT_RESOURCES,
    shell:
        "{params.python:q} -m pipeline report --config-json {params.cfg:q} --root {params.root:q}"
        " --benchmark {input.benchmark:q}/benchmark.json {params.web} --out-dir {params.out_dir:q} > {log:q} 2>&1"


include: "rules/study.smk"
