# The DAG: every rule calls one stage's command line (`python -m pipeline <stage>`).
# Run: snakemake --cores 2                                     (the offline default, configs/default.yaml)
#      snakemake --cores 2 --configfile configs/paper.yaml     (the paper recipe, merged over the default)
# rules/common.smk holds the helpers; the rules are in rules/, by part of the DAG.
import gc
from pathlib import Path

from snakemake.utils import validate

# Snakemake's libraries are loaded by now: its later garbage collections, while rules/ build the DAG and while it
# schedules the jobs, leave them out (gc.freeze; pipeline/startup.py, 3, says why this pays).
gc.freeze()

configfile: str(Path(workflow.basedir) / "configs" / "default.yaml")


# A typo or a wrong type stops the run here, before any job, with a message naming the key.
validate(config, str(Path(workflow.basedir) / "configs" / "schema.yaml"))


include: "rules/common.smk"


# What every build delivers: the exports, the full-size references, the bundle and the report.
DELIVERED = [
    expand(f"{ROOT}/{{kind}}/{{model}}", kind=["onnx", "quantized"], model=list(EXPORTED_MODELS)),
    expand(f"{ROOT}/coreml/{{model}}", model=list(PHONE_MODELS)),
    expand(f"{ROOT}/npu/{{model}}", model=list(PHONE_MODELS) if NPU_BUILT else []),
    expand(f"{ROOT}/full_size/{{architecture}}", architecture=CFG.export.full_size.architectures),
    f"{ROOT}/bundle",
    f"{ROOT}/report/summary.json",
]


rule all:
    input:
        [] if DEPLOYING else [f"{ROOT}/teacher", f"{ROOT}/distill_squad", f"{ROOT}/student_finetune"],
        [f"{ROOT}/distill_pretrain/main"] if STUDENT_DISTILLED_HERE and not DEPLOYING else [],
        DELIVERED,


def deploy_needs_a_model(wildcards):
    raise ValueError("target deploy needs deploy.model (a hub name or ./folder of a question-answering model), "
                     "e.g. --configfile configs/deploy.yaml --config deploy='{model: ./my-qa-model}'")


# Deploy an existing QA model as it is: snakemake deploy --configfile configs/deploy.yaml (deploy.model set).
rule deploy:
    input:
        DELIVERED if DEPLOYING else deploy_needs_a_model,


include: "rules/data_and_teacher.smk"
include: "rules/distillation.smk"
include: "rules/export.smk"
include: "rules/measurement.smk"
include: "rules/study.smk"


# The one line a user must see when the bundle ships no int8 graph (why, and what would help): the stages' own
# output goes to their logs.
onsuccess:
    import json

    bundle_metrics = Path(ROOT) / "bundle" / "metrics.json"
    if bundle_metrics.is_file() and json.loads(bundle_metrics.read_text()).get("int8_note"):
        print(f"bundle ({bundle_metrics.parent}): {json.loads(bundle_metrics.read_text())['int8_note']}")
