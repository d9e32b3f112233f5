"""The models a DAG exports for devices, and the stage folder each comes from: the Snakefile, the benchmark and
the report share them.
"""

from __future__ import annotations


# Models exported for devices, and the stage folder each comes from (the Snakefile, benchmark and report share it
# through exported_models): the trained models, or with deploy.model set the one model deployed as it is.
EXPORTED_MODELS = {"student": "distill_squad", "student_ce_only": "student_finetune", "teacher": "teacher"}


DEPLOYED_MODELS = {"deployed": "deployed_model"}


def exported_models(cfg) -> dict[str, str]:
    """Model name -> stage folder of every exported model in this config's DAG."""
    return DEPLOYED_MODELS if cfg.deploy.model else EXPORTED_MODELS


def bundled_model(cfg) -> str:
    """The exported model that the bundle ships: the distilled student, or the deployed model."""
    return "deployed" if cfg.deploy.model else "student"
