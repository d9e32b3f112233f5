"""Stage study_summary: what the second distillation step adds, with its noise (target `study`).

One run of distill_squad against one run of student_finetune is a single draw: another seed, or another CPU
model's floating point, moves dev F1 by about as much as the difference between them. The study reruns every
variant (config section `study`) over N seeds from the same distilled student and teacher, and reports:
  - per variant: dev EM / F1 mean, standard deviation over seeds, and a `confidence` interval of the mean
    (Student's t with N-1 degrees of freedom);
  - per variant: the paired difference to ce_only (same seed: same head initialisation and data order), its mean
    and interval; a difference whose interval excludes 0 is called significant, nothing else is;
  - per run: the bootstrap standard error of its dev F1 over questions (how much one seed's figure can be trusted);
  - per variant: training seconds (mean), as the runs measured them on this machine.

Run configs (pipeline/plan/study_runs.py, `run_config`): each variant is distill_squad's config with its objectives changed and
the seed replaced; TinyBERT runs its two steps (intermediate layers, then prediction layer) as two phases of one run.

  python -m pipeline study-summary --config-json CFG --runs-dir artifacts/study --data-dir artifacts/data
      --teacher-dir artifacts/teacher --out-dir artifacts/study   (writes summary.md, then summary.json)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from pipeline.measurement.statistics import bootstrap_standard_error, per_question_f1, t_interval
from pipeline.outputs.artifacts import atomic_write_json, atomic_write_text, read_json
from pipeline.plan.config import PipelineConfig
from pipeline.plan.study_runs import BASELINE

logger = logging.getLogger(__name__)


# -------------------------------------------------------------------------------------------------- run


def read_run(run_dir: Path) -> dict:
    metrics = read_json(run_dir / "metrics.json")
    return {"exact_match": metrics["exact_match"], "f1": metrics["f1"], "train_seconds": metrics.get("train_seconds"),
            "predictions": read_json(run_dir / "predictions.json")}


def summarize(cfg: PipelineConfig, runs_dir: Path, gold: dict[str, list[str]], teacher_f1: float | None) -> dict:
    scfg = cfg.study
    runs = {variant: {seed: read_run(runs_dir / variant / f"seed{seed}") for seed in scfg.seeds}
            for variant in scfg.variants}
    variants = {}
    for variant, by_seed in runs.items():
        f1 = [by_seed[seed]["f1"] for seed in scfg.seeds]
        standard_errors = [bootstrap_standard_error(per_question_f1(by_seed[seed]["predictions"], gold),
                                                    scfg.bootstrap_samples, seed) for seed in scfg.seeds]
        entry = {
            "f1_by_seed": dict(zip(map(str, scfg.seeds), f1)),
            "exact_match": t_interval([by_seed[seed]["exact_match"] for seed in scfg.seeds], scfg.confidence),
            "f1": t_interval(f1, scfg.confidence),
            "f1_bootstrap_standard_error_by_seed": dict(zip(map(str, scfg.seeds), standard_errors)),
            "train_seconds_mean": round(float(np.mean([by_seed[s]["train_seconds"] or 0 for s in scfg.seeds])), 1),
            "f1_relative_to_teacher": None if not teacher_f1 else round(float(np.mean(f1)) / teacher_f1, 4),
        }
        if variant != BASELINE:
            differences = [by_seed[seed]["f1"] - runs[BASELINE][seed]["f1"] for seed in scfg.seeds]
            paired = t_interval(differences, scfg.confidence)
            entry["f1_minus_ce_only"] = {**paired, "significant": paired["low"] > 0 or paired["high"] < 0}
        variants[variant] = entry
    return {
        "seeds": scfg.seeds,
        "confidence": scfg.confidence,
        "n_dev_questions": len(gold),
        "teacher_f1": teacher_f1,
        "variants": variants,
    }


def markdown(summary: dict, machine: dict) -> str:
    level = f"{summary['confidence']:.0%}"
    lines = [
        "# Distillation study",
        "",
        f"{len(summary['seeds'])} seeds ({', '.join(map(str, summary['seeds']))}) per variant, every run from the same "
        f"distilled student and teacher (teacher dev F1 {summary['teacher_f1']}), {summary['n_dev_questions']} dev "
        f"questions. CPU: {machine['model_name']}. Intervals: {level}, Student's t over seeds; 'vs CE-only' pairs "
        "runs with the same seed.",
        "",
        f"| objective | dev F1 mean ± std | {level} interval | % of teacher | vs CE-only (paired) | {level} interval "
        "| one run's SE (bootstrap) | train s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant, entry in summary["variants"].items():
        f1 = entry["f1"]
        relative = f"{entry['f1_relative_to_teacher']:.1%}" if entry["f1_relative_to_teacher"] else "—"
        paired = entry.get("f1_minus_ce_only")
        versus = "—" if paired is None else f"{paired['mean']:+.2f}" + (" (significant)" if paired["significant"] else "")
        versus_interval = "—" if paired is None else f"[{paired['low']:+.2f}, {paired['high']:+.2f}]"
        standard_error = max(entry["f1_bootstrap_standard_error_by_seed"].values())
        lines.append(f"| {variant} | {f1['mean']:.2f} ± {f1['std']:.2f} | [{f1['low']:.2f}, {f1['high']:.2f}] | "
                     f"{relative} | {versus} | {versus_interval} | ≤ {standard_error:.2f} | "
                     f"{entry['train_seconds_mean']:.0f} |")
    return "\n".join(lines) + "\n"


def run(cfg: PipelineConfig, runs_dir: Path, data_dir: Path, teacher_dir: Path | None, out_dir: Path) -> dict:
    from pipeline.data.squad_loading import load_squad
    from pipeline.outputs.machine import cpu_description
    from pipeline.runtime import squad

    dev, _ = load_squad(str(data_dir / "dev.jsonl"))
    gold = squad.gold_answers(dev)
    teacher_f1 = read_json(teacher_dir / "metrics.json")["f1"] if teacher_dir else None
    summary = summarize(cfg, runs_dir, gold, teacher_f1)
    machine = cpu_description()
    summary["machine"] = machine
    atomic_write_text(out_dir / "summary.md", markdown(summary, machine))
    atomic_write_json(out_dir / "summary.json", summary)  # last: its presence means the study is complete
    logger.info("study: %s", json.dumps(summary["variants"]))
    return summary


# `python -m pipeline study-summary`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "runs_dir": "artifacts/study: <variant>/seed<N>/ per run",
    "teacher_dir": "teacher_finetune output (its dev F1)",
}
