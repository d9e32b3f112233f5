"""The models a DAG trains, the ones it exports for devices (export.models), the ones of those that also get the
phone builds (export.phone_models), and the stage folder each comes from: the Snakefile, the benchmark and the report
share them.
"""

from __future__ import annotations


# The models a training DAG trains, and the stage folder each comes from (the Snakefile, benchmark and report share
# them through trained_models and exported_models); export.models names the ones exported for devices.
TRAINED_MODELS = {"student": "distill_squad", "student_ce_only": "student_finetune", "teacher": "teacher"}


DEPLOYED_MODELS = {"deployed": "deployed_model"}


def trained_models(cfg) -> dict[str, str]:
    """Model name -> stage folder of every model this config's DAG trains, or with deploy.model set the one model
    deployed as it is."""
    return DEPLOYED_MODELS if cfg.deploy.model else TRAINED_MODELS


def exported_models(cfg) -> dict[str, str]:
    """Model name -> stage folder of every exported model in this config's DAG: the trained models export.models
    names (in TRAINED_MODELS' order), or the deployed one."""
    if cfg.deploy.model:
        return DEPLOYED_MODELS
    return {name: stage for name, stage in TRAINED_MODELS.items() if name in cfg.export.models}


def phone_models(cfg) -> dict[str, str]:
    """Model name -> stage folder of every exported model that also gets the phone builds (CoreML packages, Android
    NPU graphs): those export.phone_models names, or the deployed one."""
    if cfg.deploy.model:
        return DEPLOYED_MODELS
    return {name: stage for name, stage in exported_models(cfg).items() if name in cfg.export.phone_models}


def bundled_model(cfg) -> str:
    """The exported model that the bundle ships: the distilled student, or the deployed model."""
    return "deployed" if cfg.deploy.model else "student"
