"""The workload and its two loops: the corpus, the models and data both loops train on, the benchmark's loop, the
stage's loop, each repeat's record, and the profiled steps."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from benchmarks.distill_throughput.device import PhaseTimer, reset_peak_memory, synchronize
from benchmarks.distill_throughput.flops import EncoderShape
from benchmarks.distill_throughput.kernels import profile_summary
from benchmarks.distill_throughput.sequences import CountingCollate, SpanCounts
from benchmarks.distill_throughput.telemetry import GpuTelemetry
from pipeline.data.corpus import token_budget_batches
from pipeline.distillation.chunked_lm_loss import ChunkLayout
from pipeline.measurement.statistics import t_interval
from pipeline.plan.config import DistillPretrainConfig
from pipeline.stages.distill_pretrain import distillation_terms
from pipeline.training.batching import micro_batch_loader, to_device
from pipeline.training.loop import build_optimizer, train
from pipeline.training.run_settings import peak_memory_mib

PHASES = ("data_wait", "forward", "backward", "optimizer")
SEED = 0


class BertTokenIds:
    """What MaskedBatchCollator reads of a tokenizer: bert-base-uncased's special ids and vocabulary size."""

    cls_token_id, sep_token_id, pad_token_id, mask_token_id = 101, 102, 0, 103
    all_special_ids = [0, 100, 101, 102, 103]

    def __len__(self) -> int:
        return 30522


def random_corpus(directory: Path, n_tokens: int, seed: int = 0) -> Path:
    """A tokenize_corpus folder of random ids: documents of 50 to 2,000 ids, so chunks and tails both occur."""
    rng = np.random.default_rng(seed)
    lengths, total = [], 0
    while total < n_tokens:
        lengths.append(int(rng.integers(50, 2000)))
        total += lengths[-1]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rng.integers(1000, 30522, size=int(offsets[-1]), dtype=np.uint16).tofile(directory / "ids.bin")
    np.save(directory / "doc_offsets.npy", offsets)
    np.save(directory / "doc_is_heldout.npy", np.zeros(len(lengths), dtype=bool))
    np.save(directory / "token_counts.npy", np.ones(30522, dtype=np.int64))
    description = {"dtype": "uint16", "vocab_size": 30522, "n_documents": len(lengths), "n_tokens": int(offsets[-1])}
    (directory / "corpus.json").write_text(json.dumps(description))
    return directory


@dataclass
class Workload:
    """The models, config and data both loops train on."""

    student: torch.nn.Module
    teacher: torch.nn.Module
    student_forward: torch.nn.Module
    teacher_forward: torch.nn.Module
    dcfg: DistillPretrainConfig
    device: torch.device
    precision: str  # --precision: bf16 or no
    bf16: bool
    sequences: object
    collate: CountingCollate
    teacher_shape: EncoderShape
    student_shape: EncoderShape
    workers: int
    layout: ChunkLayout  # the loss's chunking and vocabulary padding (LOSS_PATHS)

    def batch_plan(self, epoch: int):
        """distill_pretrain's plan (one process): token-budget batches of the run's seed."""
        return token_budget_batches(self.sequences.sequence_lengths(), self.dcfg.train.max_tokens_per_batch, SEED,
                                    epoch)

    def loss(self, batch: dict) -> dict:
        """distill_pretrain's compute_loss."""
        return distillation_terms(self.student, self.teacher, batch, self.dcfg, self.student_forward,
                                  self.teacher_forward, self.layout)

    def counts(self) -> SpanCounts:
        return SpanCounts(self.teacher_shape, self.student_shape)


def benchmark_loop(work: Workload, warmup: int, steps: int, telemetry: GpuTelemetry) -> dict:
    """The benchmark's own loop: `warmup` untimed steps, then `steps` timed ones with the time of each phase."""
    loader = micro_batch_loader(work.sequences, work.collate, work.batch_plan, seed=SEED, start_micro_batch=0,
                                total_micro_batches=warmup + steps, workers=work.workers,
                                pin_memory=work.device.type == "cuda")
    optimizer = build_optimizer(work.student, work.dcfg.train, work.device)
    reset_peak_memory(work.device)
    work.student.train()
    timer = PhaseTimer(work.device, PHASES)
    counts = work.counts()
    stream = iter(loader)
    for number in range(warmup + steps):
        timed = number >= warmup  # warm-up steps: the allocator, kernels, compilation, the loader's workers
        if number == warmup:
            timer.start()
            telemetry.start()
        cpu_batch = next(stream)
        batch = to_device(cpu_batch, work.device)
        timer.lap("data_wait", timed)
        with torch.autocast(work.device.type, dtype=torch.bfloat16, enabled=work.bf16):
            terms = work.loss(batch)
        timer.lap("forward", timed)
        terms["loss"].backward()
        timer.lap("backward", timed)
        if work.dcfg.train.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(work.student.parameters(), work.dcfg.train.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timer.lap("optimizer", timed)
        if timed:
            counts.add(cpu_batch)
    synchronize(work.device)
    seconds = time.perf_counter() - timer.started
    gpu = telemetry.stop()
    del stream, loader, optimizer
    return {
        "seconds": seconds,
        "counts": counts,
        "gpu": gpu,
        "step_breakdown_seconds": {name: round(value / steps, 6) for name, value in timer.seconds().items()},
        "host_breakdown_seconds": ({name: round(value / steps, 6) for name, value in timer.host.items()}
                                   if work.device.type == "cuda" else None),
        "peak_memory_mib": round(peak_memory_mib(work.device), 1),
        "last_loss_terms": {name: float(value.detach()) for name, value in terms.items()},
    }


@contextlib.contextmanager
def launch_precision(precision: str):
    """ACCELERATE_MIXED_PRECISION as the rule sets it from compute.mixed_precision (pipeline.training.run_settings.mixed_precision
    reads it on CUDA), for the stage loop only."""
    previous = os.environ.get("ACCELERATE_MIXED_PRECISION")
    os.environ["ACCELERATE_MIXED_PRECISION"] = precision
    try:
        yield
    finally:
        if previous is None:
            del os.environ["ACCELERATE_MIXED_PRECISION"]
        else:
            os.environ["ACCELERATE_MIXED_PRECISION"] = previous


class TimedStageLoss:
    """The stage's compute_loss, counting the micro-batches after the first `untimed` ones: the timed span starts
    as the first of them starts (the device synchronised there, once, before it)."""

    def __init__(self, work: Workload, untimed: int, telemetry: GpuTelemetry):
        self.work, self.untimed, self.telemetry = work, untimed, telemetry
        self.calls, self.started = 0, None
        self.counts = work.counts()

    def __call__(self, batch: dict) -> dict:
        if self.calls == self.untimed:
            synchronize(self.work.device)
            self.started = time.perf_counter()
            self.telemetry.start()
        if self.calls >= self.untimed:
            self.counts.add(batch)  # host numbers the collate added: no device read
        self.calls += 1
        return self.work.loss(batch)


def stage_train_loop(work: Workload, warmup: int, steps: int, grad_accum_steps: int, telemetry: GpuTelemetry,
                     scratch: Path) -> dict:
    """`pipeline.training.loop.train` as distill_pretrain.run calls it (its collate, batch plan, per-token loss weights
    and static graph), for warmup + steps optimizer steps. Timed from the first timed micro-batch's loss to
    train()'s return (the loop's log reads and its loader's shutdown included), the device synchronised."""
    cfg = replace(work.dcfg.train, max_steps=warmup + steps, grad_accum_steps=grad_accum_steps,
                  checkpoint_every=warmup + steps + 1, dataloader_workers=work.workers)
    loss = TimedStageLoss(work, warmup * grad_accum_steps, telemetry)
    with launch_precision(work.precision):
        result = train(
            module=work.student, compute_loss=loss, examples=work.sequences, collate=work.collate, cfg=cfg,
            seed=SEED, device=work.device, checkpoint_dir=scratch / "checkpoints",
            log_path=scratch / "train_log.jsonl", fingerprint="distill_throughput",
            description="distill_pretrain (timed)", batch_plan=work.batch_plan,
            example_tokens=work.sequences.sequence_lengths(), static_graph=True,
        )
    synchronize(work.device)
    seconds = time.perf_counter() - loss.started
    return {
        "seconds": seconds,
        "counts": loss.counts,
        "gpu": telemetry.stop(),
        "peak_memory_mib": round(result.peak_memory_mib, 1),
        "train_result": {key: value for key, value in result.as_metrics().items()
                         if key in ("steps", "train_seconds", "tokens_per_second", "mixed_precision",
                                    "final_loss_terms")},
    }


def repeat_record(run: dict, steps: int, position: int, repeat: int, peak: float | None) -> dict:
    """One repeat of a loop: its rates, model FLOPs and MFU."""
    counts, seconds = run["counts"], run["seconds"]
    achieved = counts.flops["total"] / seconds
    record = {
        "position": position,
        "repeat": repeat,
        "seconds": round(seconds, 4),
        "steps_timed": steps,
        "micro_batches": counts.micro_batches,
        "seconds_per_step": round(seconds / steps, 6),
        "tokens": counts.tokens,
        "executed_tokens": counts.executed_tokens,  # rows the encoders ran on, padding included
        "tokens_per_second": round(counts.tokens / seconds, 1),
        "model_flops": dict(counts.flops),
        "achieved_tflops": round(achieved / 1e12, 6),
        "mfu": round(achieved / (peak * 1e12), 6) if peak else None,
        "peak_memory_mib": run["peak_memory_mib"],
        "gpu_telemetry": run["gpu"],
    }
    for key in ("step_breakdown_seconds", "host_breakdown_seconds", "train_result"):
        if key in run:
            record[key] = run[key]
    return record


def spread(values: list[float]) -> dict | None:
    """Every value, mean, min, max and Student's t 95 % interval of the mean (null without values)."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return None
    interval = t_interval(values, 0.95) if len(values) > 1 else None
    return {"values": values, "mean": float(np.mean(values)), "min": min(values), "max": max(values),
            "ci95": [interval["low"], interval["high"]] if interval else None}


def training_step(work, optimizer, stream):
    """One optimizer step of the stage's loss on the next micro-batch of `stream`, as the training loop takes it
    (bf16 autocast where the workload runs it, gradient clipping, zeroed gradients)."""
    def step() -> None:
        batch = to_device(next(stream), work.device)
        with torch.autocast(work.device.type, dtype=torch.bfloat16, enabled=work.bf16):
            terms = work.loss(batch)
        terms["loss"].backward()
        if work.dcfg.train.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(work.student.parameters(), work.dcfg.train.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def profiled_steps(work: Workload, steps: int, seed: int = SEED):
    """`steps` steps of the benchmark's loop under torch.profiler, after one untimed step: the profiler and the
    steps' wall seconds."""
    from torch.profiler import ProfilerActivity, profile

    loader = micro_batch_loader(work.sequences, work.collate, work.batch_plan, seed=seed, start_micro_batch=0,
                                total_micro_batches=steps + 1, workers=work.workers,
                                pin_memory=work.device.type == "cuda")
    optimizer = build_optimizer(work.student, work.dcfg.train, work.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if work.device.type == "cuda" else [])
    stream = iter(loader)
    step = training_step(work, optimizer, stream)
    step()
    synchronize(work.device)
    with profile(activities=activities) as profiler:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(work.device)
        wall = time.perf_counter() - started
    del stream, loader, optimizer
    return profiler, wall


def profile_steps(work: Workload, steps: int) -> dict:
    """A torch.profiler trace of `steps` steps of the benchmark's loop (after one untimed step), summarised by
    kernel class."""
    profiler, wall = profiled_steps(work, steps)
    return {"steps": steps, **profile_summary(profiler.key_averages(), wall, on_gpu=work.device.type == "cuda")}
