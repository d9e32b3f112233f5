# The DAG, and nothing else: every rule calls one stage's CLI (`python -m pipeline <stage>`).
# Run: snakemake --cores 2                      (embedded offline default, configs/default.yaml)
#      snakemake --cores 2 --configfile configs/paper.yaml   (the paper recipe; merged over the default)
import json
import sys
from pathlib import Path

from snakemake.utils import validate

from pipeline.config import PipelineConfig, from_dict, to_dict

configfile: str(Path(workflow.basedir) / "configs" / "default.yaml")

# A typo or a wrong type stops the run here, before any job, with a message naming the key.
validate(config, str(Path(workflow.basedir) / "configs" / "schema.yaml"))
CFG = from_dict(PipelineConfig, config)  # cross-field checks the schema cannot express
FULL = to_dict(CFG)
ROOT = CFG.output_root
PYTHON = sys.executable  # the interpreter running snakemake, i.e. the project's environment
PACKAGE = Path(workflow.basedir) / "pipeline"
TEACHER_FROM_SCRATCH = CFG.teacher.pretrained is None and CFG.teacher.pretrained_qa is None
TRAIN_RESOURCES = {"mem_mb": CFG.compute.training_mem_mb, "gpu": CFG.compute.gpus}
LIGHT_RESOURCES = {"mem_mb": CFG.compute.light_mem_mb, "gpu": 0}


def stage_config(*sections):
    """The config sections a stage reads, as JSON: editing another section does not rerun it."""
    return json.dumps({name: FULL[name] for name in sections}, sort_keys=True)


def code(*modules):
    """A stage's source files as inputs, so reruns notice code changes."""
    shared = ["__main__", "config", "artifacts"]
    return [str(PACKAGE / f"{m}.py") for m in shared + list(modules)]


rule all:
    input:
        f"{ROOT}/teacher",


rule prepare_data:
    input:
        code=code("stages/prepare_data", "data", "synthetic", "mlm"),
    output:
        directory(f"{ROOT}/data"),
    params:
        python=PYTHON,
        cfg=stage_config("seed", "data"),
    log:
        f"{ROOT}/logs/prepare_data.log",
    benchmark:
        f"{ROOT}/benchmarks/prepare_data.tsv"
    threads: 1
    resources:
        **LIGHT_RESOURCES,
    shell:
        "{params.python:q} -m pipeline prepare-data --config-json {params.cfg:q} --out-dir {output:q} > {log:q} 2>&1"


rule tokenizer:
    input:
        data=rules.prepare_data.output[0],
        code=code("stages/tokenizer", "mlm"),
    output:
        directory(f"{ROOT}/tokenizer"),
    params:
        python=PYTHON,
        cfg=stage_config("tokenizer", "teacher"),
    log:
        f"{ROOT}/logs/tokenizer.log",
    benchmark:
        f"{ROOT}/benchmarks/tokenizer.tsv"
    threads: 1
    resources:
        **LIGHT_RESOURCES,
    shell:
        "{params.python:q} -m pipeline tokenizer --config-json {params.cfg:q} --data-dir {input.data:q}"
        " --out-dir {output:q} > {log:q} 2>&1"


if TEACHER_FROM_SCRATCH:

    rule teacher_pretrain:
        input:
            data=rules.prepare_data.output[0],
            tokenizer=rules.tokenizer.output[0],
            code=code("stages/teacher", "train", "masking", "mlm"),
        output:
            directory(f"{ROOT}/teacher_pretrain"),
        params:
            python=PYTHON,
            cfg=stage_config("seed", "teacher"),
            work=f"{ROOT}/work/teacher_pretrain",
        log:
            f"{ROOT}/logs/teacher_pretrain.log",
        benchmark:
            f"{ROOT}/benchmarks/teacher_pretrain.tsv"
        threads: workflow.cores
        resources:
            **TRAIN_RESOURCES,
        shell:
            "OMP_NUM_THREADS={threads} {params.python:q} -m pipeline teacher-pretrain --config-json {params.cfg:q}"
            " --data-dir {input.data:q} --tokenizer-dir {input.tokenizer:q} --out-dir {output:q}"
            " --work-dir {params.work:q} > {log:q} 2>&1"


rule teacher_finetune:
    input:
        data=rules.prepare_data.output[0],
        tokenizer=rules.tokenizer.output[0],
        pretrained=[f"{ROOT}/teacher_pretrain"] if TEACHER_FROM_SCRATCH else [],
        code=code("stages/teacher", "train", "qa", "squad", "data"),
    output:
        directory(f"{ROOT}/teacher"),
    params:
        python=PYTHON,
        cfg=stage_config("seed", "teacher", "squad"),
        pretrained=lambda wildcards, input: f"--pretrained-dir {input.pretrained[0]}" if input.pretrained else "",
        work=f"{ROOT}/work/teacher_finetune",
    log:
        f"{ROOT}/logs/teacher_finetune.log",
    benchmark:
        f"{ROOT}/benchmarks/teacher_finetune.tsv"
    threads: workflow.cores
    resources:
        **TRAIN_RESOURCES,
    shell:
        "OMP_NUM_THREADS={threads} {params.python:q} -m pipeline teacher-finetune --config-json {params.cfg:q}"
        " --data-dir {input.data:q} --tokenizer-dir {input.tokenizer:q} {params.pretrained}"
        " --out-dir {output:q} --work-dir {params.work:q} > {log:q} 2>&1"
