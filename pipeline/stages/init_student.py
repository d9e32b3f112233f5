"""Stage init_student: a DistilBERT student built from the MLM teacher (Sanh et al. 2019).

The student has the teacher's width, half its layers by default, no token-type embeddings and no pooler.
With `student.init: teacher` its embeddings, its layers (copied from teacher layers chosen by
`student.layer_mapping`) and its MLM head come from the teacher; `--init random` builds the ablation.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Literal

from transformers import AutoTokenizer, BertForMaskedLM

from pipeline.distillation.students import (
    init_student_from_teacher,
    random_student,
    student_config_from_teacher,
    validate_student_against_teacher,
)
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.outputs.manifests import atomic_output_dir, verify_input_dirs
from pipeline.plan.config import PipelineConfig

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, teacher: str, tokenizer_dir: Path, out_dir: Path,
        init: Literal["teacher", "random"] | None = None) -> dict:
    verify_input_dirs(teacher, tokenizer_dir)
    init = init or cfg.student.init
    teacher_model = BertForMaskedLM.from_pretrained(teacher)
    n_layers = cfg.student.n_layers or max(1, teacher_model.config.num_hidden_layers // 2)
    teacher_layers = validate_student_against_teacher(teacher_model.config, n_layers, cfg.student.layer_mapping)
    student_config = student_config_from_teacher(teacher_model.config, n_layers)
    if init == "teacher":
        student = init_student_from_teacher(
            teacher_model, student_config, teacher_layers,
            fold_token_type_into_positions=cfg.student.fold_token_type_into_positions,
        )
    else:
        student = random_student(student_config, seed=cfg.seed)
    metrics = {
        "init": init,
        "teacher": teacher,
        "n_teacher_layers": teacher_model.config.num_hidden_layers,
        "n_student_layers": n_layers,
        "teacher_layers_for_student_layers": teacher_layers if init == "teacher" else None,
        "n_parameters": student.num_parameters(),
        "n_teacher_parameters": teacher_model.num_parameters(),
    }
    with atomic_output_dir(out_dir, cfg) as tmp:
        student.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(tmp)
        atomic_write_json(tmp / "metrics.json", metrics)
    logger.info("init_student: %s", json.dumps(metrics))
    return metrics


# `python -m pipeline init-student`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "teacher": "teacher_pretrain output directory or a hub BERT name",
    "init": "default: student.init",
}
