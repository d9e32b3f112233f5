"""Stages distill_squad and student_finetune: the student learns SQuAD, with or without a teacher.

distill_squad (Sanh et al. 2019, second step): DistilBertForQuestionAnswering initialised from the
distill_pretrain output learns from the gold spans and from the frozen teacher_finetune model, with the
objectives `distill_squad.objectives` names (distilbert, pkd, tinybert: pipeline/distillation/squad_objectives.py, which also
holds the loss; the study's variants of them: pipeline/plan/study_runs.py); the teacher's logits are cached when they
are all the objectives read, and TinyBERT's two steps are two phases of the run.
student_finetune (--ce-only): the same student with plain CE and no teacher, so the report shows what the
second distillation step adds.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_file, save_model
from transformers import AutoModelForMaskedLM, AutoTokenizer, BertForQuestionAnswering, DistilBertForQuestionAnswering

from pipeline.data import qa_windows
from pipeline.data.augment import augment_windows
from pipeline.data.squad_loading import load_squad
from pipeline.distillation.squad_objectives import (SquadDistillationLoss, distillation_plan, logits_suffice,
                                                    training_phases)
from pipeline.distillation.students import freeze
from pipeline.export.model_card import qa_student_card, write_model_card
from pipeline.outputs.artifacts import atomic_write_json, atomic_write_text, read_json
from pipeline.outputs.manifests import atomic_output_dir, fingerprint, to_plain, verify_input_dirs
from pipeline.plan.config import ConfigError, PipelineConfig
from pipeline.training.loop import train
from pipeline.training.processes import is_main_process
from pipeline.training.run_settings import prepare_run, seed_everything, use_bf16

logger = logging.getLogger(__name__)


def check_same_vocabulary(student_tokenizer, student_source: str | Path, teacher_dir: str | Path) -> None:
    """Distillation compares the two models' outputs on the same windows: the teacher must read the student's ids."""
    student_vocab = student_tokenizer.get_vocab()
    teacher_vocab = AutoTokenizer.from_pretrained(teacher_dir).get_vocab()
    if student_vocab != teacher_vocab:
        differing = sorted(set(student_vocab.items()) ^ set(teacher_vocab.items()), key=str)[:3]
        raise ConfigError(f"distill_squad: the student {student_source} and the teacher {teacher_dir} have "
                          f"different vocabularies ({len(student_vocab)} and {len(teacher_vocab)} tokens; e.g. "
                          f"{differing}): student.pretrained must use the teacher's tokenizer")


@torch.no_grad()
def teacher_window_logits(
    teacher, windows: dict[str, torch.Tensor], batch_size: int, device, autocast_bf16: bool = False
) -> dict[str, torch.Tensor]:
    """The frozen teacher's start/end logits for every training window, computed once.

    With ``autocast_bf16`` the teacher runs under the same bf16 autocast as the training loop's live teacher
    forward, so cached and live targets agree; they are stored in fp32 either way.
    """
    # Windows of similar length go together and each batch is cut to its longest window, as the training
    # loop's batches are: no time goes to padding. Positions past a batch's longest window hold 0 (padding,
    # which the KD term never reads).
    lengths = windows["attention_mask"].sum(dim=1)
    by_length = torch.argsort(lengths, descending=True, stable=True)
    starts = torch.zeros(windows["input_ids"].shape, dtype=torch.float32)
    ends = torch.zeros(windows["input_ids"].shape, dtype=torch.float32)
    for begin in range(0, len(by_length), batch_size):
        rows = by_length[begin : begin + batch_size]
        width = int(lengths[rows].max())
        batch = {n: t[rows, :width].to(device) for n, t in windows.items() if n in qa_windows.MODEL_INPUT_NAMES}
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=autocast_bf16):
            output = teacher(**qa_windows.model_inputs(batch, teacher))
        starts[rows, :width] = output.start_logits.float().cpu()
        ends[rows, :width] = output.end_logits.float().cpu()
    return {"teacher_start_logits": starts, "teacher_end_logits": ends}


CACHE_SECONDS_KEY = "compute_seconds"  # safetensors metadata: what computing the cache cost


def cached_teacher_logits(
    teacher, windows, batch_size, device, cache_path: Path, autocast_bf16: bool = False
) -> tuple[dict[str, torch.Tensor], float]:
    """(teacher logits for every window, seconds it took to compute them), from ``cache_path`` when present.

    A reused cache reports the seconds its computation took, so throughput figures do not depend on whether
    the file already existed. A cache that does not match the windows raises ValueError naming the file.
    """
    if cache_path.is_file():
        logger.info("reusing cached teacher logits %s", cache_path)
        return _load_teacher_logits(cache_path, windows["input_ids"].shape)
    start = time.perf_counter()
    logits = teacher_window_logits(teacher, windows, batch_size, device, autocast_bf16)
    seconds = time.perf_counter() - start
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    # One temporary name per process: under torchrun every rank computes the same logits, and each rename is atomic.
    tmp = cache_path.with_name(f"{cache_path.name}.tmp-{os.getpid()}")
    save_file(logits, str(tmp), metadata={CACHE_SECONDS_KEY: repr(seconds)})
    tmp.replace(cache_path)
    return logits, seconds


def _load_teacher_logits(cache_path: Path, window_shape: torch.Size) -> tuple[dict[str, torch.Tensor], float]:
    try:
        with safe_open(str(cache_path), framework="pt") as cache:
            logits = {name: cache.get_tensor(name) for name in cache.keys()}
            metadata = cache.metadata() or {}
    except (OSError, SafetensorError) as error:
        raise ValueError(f"{cache_path}: unreadable teacher-logit cache ({error}); delete it to recompute") from None
    expected = {"teacher_start_logits", "teacher_end_logits"}
    if set(logits) != expected:
        raise ValueError(f"{cache_path}: teacher-logit cache holds {sorted(logits)}, expected {sorted(expected)}; "
                         "delete it to recompute")
    for name, tensor in logits.items():
        if tuple(tensor.shape) != tuple(window_shape):
            raise ValueError(
                f"{cache_path}: {name} has shape {list(tensor.shape)} but there are {window_shape[0]} training "
                f"windows of {window_shape[1]} tokens; delete the cache to recompute it"
            )
    return logits, float(metadata.get(CACHE_SECONDS_KEY, "0.0"))


def add_augmented_windows(
    windows: dict[str, torch.Tensor], mlm_teacher: str | Path, tokenizer, cfg: PipelineConfig, device
) -> dict[str, torch.Tensor]:
    """The training windows followed by their teacher-labelled augmented copies, with a ``has_gold`` flag."""
    aug = cfg.distill_squad.augmentation
    mlm_tokenizer = AutoTokenizer.from_pretrained(mlm_teacher)
    if mlm_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ConfigError(f"distill_squad.augmentation: the masked-LM teacher {mlm_teacher} has another vocabulary "
                          "than the student; replacements must be the student's tokens")
    mlm = AutoModelForMaskedLM.from_pretrained(mlm_teacher).to(device)
    generator = torch.Generator().manual_seed(cfg.seed)
    start = time.perf_counter()
    augmented = augment_windows(mlm, windows, tokenizer, aug.copies, aug.replace_probability, aug.top_k, generator,
                                batch_size=cfg.squad.eval_batch_size, device=device)
    replaced = (augmented["input_ids"] != windows["input_ids"].repeat(aug.copies, 1)).sum().item()
    logger.info("augmentation: %d copies of %d windows, %d tokens replaced, %.1f s", aug.copies,
                len(windows["input_ids"]), replaced, time.perf_counter() - start)
    combined = {name: torch.cat([windows[name], augmented[name]]) for name in windows}
    combined["has_gold"] = torch.cat([torch.ones(len(windows["input_ids"]), dtype=torch.bool),
                                      torch.zeros(len(augmented["input_ids"]), dtype=torch.bool)])
    return combined


def phase_log(work_dir: Path, phase: str, n_phases: int) -> Path:
    return work_dir / ("train_log.jsonl" if n_phases == 1 else f"train_log-{phase}.jsonl")


def write_combined_log(work_dir: Path, phases: list[str], out_path: Path) -> None:
    """One train_log.jsonl for the stage: a two-phase run's records carry their phase, steps counted on."""
    if len(phases) == 1:
        shutil.copy(phase_log(work_dir, phases[0], 1), out_path)
        return
    lines, offset = [], 0
    for phase in phases:
        records = [json.loads(line) for line in phase_log(work_dir, phase, 2).read_text().splitlines() if line]
        lines += [json.dumps({**record, "step": record["step"] + offset, "phase": phase}) for record in records]
        offset += records[-1]["step"] if records else 0
    atomic_write_text(out_path, "\n".join(lines) + "\n")


def combine_phase_metrics(phase_results: list[dict], cache_seconds: float) -> dict:
    """The stage's training metrics over its phases. Time and throughput include the teacher-logit cache, so a
    cached run compares fairly with a live-teacher run."""
    last = phase_results[-1]
    seconds = sum(result["train_seconds"] for result in phase_results) + cache_seconds
    tokens = sum(result["tokens"] for result in phase_results)
    training = {key: value for key, value in last.items() if key not in ("phase", "tokens", "reused")}
    training["steps"] = sum(result["steps"] for result in phase_results)
    training["train_seconds"] = round(seconds, 3)
    training["tokens_per_second"] = round(tokens / max(seconds, 1e-9), 1)
    training["tokens_per_second_per_process"] = round(training["tokens_per_second"] / last["processes"], 1)
    if len(phase_results) > 1:
        training["phases"] = [{key: result[key] for key in ("phase", "steps", "train_seconds", "resumed_from_step")}
                              for result in phase_results]
        # The step of the whole run that a rerun started from: inside a phase, or after a finished one it loaded.
        training["resumed_from_step"], offset = 0, 0
        for result in phase_results:
            if result.get("reused") or result["resumed_from_step"]:
                training["resumed_from_step"] = offset + (result["steps"] if result.get("reused")
                                                          else result["resumed_from_step"])
            offset += result["steps"]
    return training


def run(
    cfg: PipelineConfig,
    student_dir: str | Path,
    teacher_dir: Path | None,
    data_dir: Path,
    out_dir: Path,
    work_dir: Path,
    mlm_teacher_dir: str | Path | None = None,
    ce_only: bool = False,
) -> dict:
    """Train the student on SQuAD from teacher_dir; with ce_only (and no teacher), plain CE: the student_finetune
    baseline.

    ``mlm_teacher_dir`` (a directory or hub name of a masked-LM with the student's vocabulary) is needed when
    distill_squad.augmentation.copies > 0.
    """
    if ce_only == (teacher_dir is not None):
        raise ConfigError("distill_squad: give exactly one of the teacher (--teacher-dir) and ce_only (--ce-only)")
    verify_input_dirs(student_dir, teacher_dir, data_dir)
    dcfg = cfg.distill_squad
    device = prepare_run(dcfg.train, cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    student = DistilBertForQuestionAnswering.from_pretrained(student_dir).to(device)
    student = qa_windows.prepare_for_qa_training(student, cfg.squad)
    teacher = None
    plan: dict = {}
    projection = None
    if teacher_dir is not None:
        check_same_vocabulary(tokenizer, student_dir, teacher_dir)
        teacher = freeze(BertForQuestionAnswering.from_pretrained(teacher_dir)).to(device)
        plan = distillation_plan(dcfg, student.config, teacher.config)
        if plan["needs_projection"]:
            projection = torch.nn.Linear(student.config.dim, teacher.config.hidden_size).to(device)
    trainable = torch.nn.ModuleDict({"student": student} | ({"projection": projection} if projection else {}))

    train_examples, _ = load_squad(str(data_dir / "train.jsonl"))
    dev, _ = load_squad(str(data_dir / "dev.jsonl"))
    windows = qa_windows.train_window_tensors(train_examples, tokenizer, cfg.squad)
    n_gold_windows = len(windows["input_ids"])
    augment = teacher is not None and dcfg.augmentation.copies > 0
    if augment:
        if mlm_teacher_dir is None:
            raise ConfigError("distill_squad.augmentation.copies > 0 needs the masked-LM teacher (--mlm-teacher-dir)")
        windows = add_augmented_windows(windows, mlm_teacher_dir, tokenizer, cfg, device)
    local_mlm = [Path(mlm_teacher_dir)] if augment and Path(mlm_teacher_dir).is_dir() else []
    local_student = Path(student_dir).exists()
    run_id = fingerprint(
        "distill_squad" if teacher else "student_finetune", to_plain(dcfg), to_plain(cfg.squad), cfg.seed,
        *([] if local_student else [f"hub student {student_dir}", getattr(student.config, "_commit_hash", None)]),
        files=[data_dir / "train.jsonl", *([student_dir] if local_student else []),
               *([teacher_dir] if teacher_dir else []), *local_mlm],
    )
    phases = training_phases(dcfg) if teacher is not None else [("main", dcfg)]
    cached_logits: dict[str, torch.Tensor] = {}
    cache_seconds = 0.0
    phase_results: list[dict] = []
    for number, (phase, phase_cfg) in enumerate(phases):
        last = number == len(phases) - 1
        phase_id = run_id if len(phases) == 1 else fingerprint(run_id, phase)
        phase_windows = windows
        use_cache = teacher is not None and phase_cfg.cache_teacher_logits and logits_suffice(phase_cfg)
        if use_cache:
            if not cached_logits:
                # The cache runs in the precision the live teacher would run in during training (bf16 on CUDA).
                autocast_bf16 = use_bf16(dcfg.train, device)
                cache_path = work_dir / f"teacher_logits-{run_id}-{'bf16' if autocast_bf16 else 'fp32'}.safetensors"
                cached_logits, cache_seconds = cached_teacher_logits(
                    teacher, windows, cfg.squad.eval_batch_size, device, cache_path, autocast_bf16
                )
            phase_windows = windows | cached_logits
        finished = work_dir / f"{phase}-{phase_id}.safetensors"  # an earlier phase that a rerun need not repeat
        if not last and finished.is_file():
            logger.info("%s: phase %s finished earlier, loading %s", "distill_squad", phase, finished)
            load_model(trainable, str(finished))
            with safe_open(str(finished), framework="pt") as handle:
                phase_results.append({**json.loads(handle.metadata()["result"]), "reused": True})
            continue
        if number > 0:
            # The same random state whether or not the first phase ran in this process (a rerun loads it).
            seed_everything(cfg.seed + number)
        description = ("distill_squad" if teacher else "student_finetune") + ("" if len(phases) == 1 else f" {phase}")
        result = train(
            module=trainable,
            compute_loss=SquadDistillationLoss(student, teacher, phase_cfg, plan, projection, tokenizer.sep_token_id),
            examples=list(range(len(phase_windows["input_ids"]))), collate=qa_windows.window_collate(phase_windows),
            cfg=phase_cfg.train, seed=cfg.seed, device=device,
            checkpoint_dir=work_dir / ("checkpoints" if len(phases) == 1 else f"checkpoints-{phase}"),
            log_path=phase_log(work_dir, phase, len(phases)), fingerprint=phase_id, description=description,
            example_lengths=qa_windows.window_lengths(phase_windows), final=last,
            # TinyBERT's phases leave the QA head (first) or the width projection (second) out of the loss.
            find_unused_parameters=len(phases) > 1,
        )
        phase_results.append({"phase": phase, **result.as_metrics(),
                              "tokens": result.tokens_per_second * result.train_seconds})
        if not last and is_main_process():
            tmp = finished.with_name(f"{finished.name}.tmp-{os.getpid()}")
            save_model(trainable, str(tmp), metadata={"result": json.dumps(phase_results[-1])})
            tmp.replace(finished)
    if not is_main_process():
        return phase_results[-1]  # evaluation and outputs are rank 0's
    dev_metrics, predictions = qa_windows.evaluate_qa(student, tokenizer, dev, cfg.squad, device)
    training = combine_phase_metrics(phase_results, cache_seconds)
    metrics = {
        **dev_metrics,
        **training,
        "objectives": list(dcfg.objectives) if teacher else [],
        "alpha_task": dcfg.alpha_task,
        "teacher_logits_cached": use_cache,
        "teacher_cache_seconds": round(cache_seconds, 3),
        "layer_plan": {k: v for k, v in plan.items() if k != "needs_projection"},
        "n_train_windows": n_gold_windows,
        "n_augmented_windows": len(windows["input_ids"]) - n_gold_windows,
        "n_parameters": student.num_parameters(),
    }
    if teacher_dir is not None and (teacher_dir / "metrics.json").is_file():
        teacher_metrics = read_json(teacher_dir / "metrics.json")
        metrics["teacher_f1"] = teacher_metrics["f1"]
        metrics["teacher_exact_match"] = teacher_metrics["exact_match"]
        metrics["f1_relative_to_teacher"] = round(metrics["f1"] / max(teacher_metrics["f1"], 1e-9), 4)
    # The folder loads in transformers.pipeline("question-answering"), which feeds the model every input the
    # tokenizer names: DistilBERT takes no token_type_ids (a BERT WordPiece tokenizer names them by default).
    # save_pretrained writes the attribute of each key of init_kwargs.
    accepted = inspect.signature(student.forward).parameters
    tokenizer.model_input_names = [name for name in tokenizer.model_input_names if name in accepted]
    tokenizer.init_kwargs["model_input_names"] = tokenizer.model_input_names
    with atomic_output_dir(out_dir, cfg) as tmp:
        student.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / "predictions.json", predictions)
        write_combined_log(work_dir, [phase for phase, _ in phases], tmp / "train_log.jsonl")
        atomic_write_json(tmp / "metrics.json", metrics)
        write_model_card(qa_student_card(cfg, metrics, student_dir, teacher_dir, data_dir, str(out_dir)), tmp)
    logger.info("%s: %s", "distill_squad" if teacher else "student_finetune", json.dumps(metrics))
    return metrics


# `python -m pipeline distill-squad`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "student_dir": "output of distill_pretrain, or student.pretrained (a folder or a hub name)",
    "teacher_dir": "output of teacher_finetune",
    "ce_only": "no teacher: the student_finetune baseline",
    "mlm_teacher_dir": "masked-LM teacher for distill_squad.augmentation (a directory or hub name)",
    "work_dir": "checkpoints, teacher-logit cache, live log",
}
