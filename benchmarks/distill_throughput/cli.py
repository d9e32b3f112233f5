"""The command line: its flags, the measured config, the workload it builds, the rounds of the protocol, and the JSON
it writes."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import transformers
import yaml
from transformers import BertConfig, BertForMaskedLM

from benchmarks import distill_throughput as package
from benchmarks.distill_throughput.flops import FLOP_FORMULA, EncoderShape
from benchmarks.distill_throughput.gemm_ceiling import gemm_round, peak_tflops, step_matmul_shapes
from benchmarks.distill_throughput.sequences import CountingCollate
from benchmarks.distill_throughput.telemetry import GpuTelemetry, gpu_identifiers, gpu_reader
from benchmarks.distill_throughput.workload import (
    SEED,
    BertTokenIds,
    Workload,
    benchmark_loop,
    profile_steps,
    random_corpus,
    repeat_record,
    spread,
    stage_train_loop,
)
from pipeline.data.corpus import TokenizedCorpus
from pipeline.data.masking import selection_weights_from_counts
from pipeline.data.mlm_batches import MaskedBatchCollator, special_token_ids
from pipeline.distillation.chunked_lm_loss import ChunkLayout
from pipeline.distillation.students import (freeze, init_student_from_teacher, student_config_from_teacher,
                                            teacher_layers_for_student)
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.outputs.machine import cpu_description
from pipeline.plan.config import DistillPretrainConfig, load_config
from pipeline.stages.distill_pretrain import encoders
from pipeline.training.run_settings import maybe_compile

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "default.yaml"
PAPER_CONFIG = PROJECT_ROOT / "configs" / "paper.yaml"
REFERENCE = "Sanh et al. 2019 trained on 8 V100 GPUs for about 90 hours"
MINIMUM_PROTOCOL = {"repeats": 3, "steps": 50}  # what a reported figure needs; smaller runs are smoke runs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {package.__name__}", description=package.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=PAPER_CONFIG,
                        help="the config whose distill_pretrain shape is measured (merged over configs/default.yaml)")
    parser.add_argument("--steps", type=int, default=50, help="timed optimizer steps per repeat (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first in every repeat of each loop")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of (benchmark loop, stage loop, GEMM)")
    parser.add_argument("--profile-steps", type=int, default=5, help="profiled steps of the benchmark loop")
    parser.add_argument("--grad-accum-steps", type=int, default=1,
                        help="micro-batches per optimizer step of the stage's loop (paper.yaml: 16)")
    parser.add_argument("--seq-len", type=int, default=None, help="default: the config's max_seq_length")
    parser.add_argument("--max-tokens", type=int, default=None, help="default: the config's max_tokens_per_batch")
    parser.add_argument("--chunked-loss-rows", type=int, default=None, help="default: the config's chunked_loss_rows")
    parser.add_argument("--loss-path", choices=sorted(LOSS_PATHS), default="fused",
                        help="; ".join(f"{name}: {description}" for name, (_, _, description) in LOSS_PATHS.items()))
    parser.add_argument("--packed-multiple", type=int, default=None,
                        help="default: the config's packed_tokens_multiple_of")
    add_model_shape_arguments(parser)
    parser.add_argument("--corpus-dir", type=Path, default=None, help="a tokenize_corpus folder (bert-base ids)")
    parser.add_argument("--workers", type=int, default=None,
                        help="DataLoader worker processes (default: the config's dataloader_workers)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--compile", action="store_true", help="torch.compile both encoders (CUDA only)")
    parser.add_argument("--precision", choices=["bf16", "no"], default="bf16",
                        help="CUDA: bf16 autocast and a bf16 teacher (as the stage), or fp32; CPU is always fp32")
    parser.add_argument("--gemm-min-seconds", type=float, default=0.2, help="time per GEMM shape and repeat")
    parser.add_argument("--telemetry-interval", type=float, default=0.5, help="seconds between GPU reads")
    parser.add_argument("--out", type=Path, default=Path("artifacts/benchmarks/distill_throughput.json"))
    args = parser.parse_args(argv)
    for name in ("steps", "warmup", "repeats", "profile_steps", "grad_accum_steps", "chunked_loss_rows"):
        if getattr(args, name) is not None and getattr(args, name) < (0 if name == "warmup" else 1):
            parser.error(f"--{name.replace('_', '-')} must be at least {0 if name == 'warmup' else 1}")
    return args


def add_model_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The teacher's shape (bert-base by default) and the student's depth (also cuda_equivalence.py's flags)."""
    parser.add_argument("--teacher-layers", type=int, default=12)
    parser.add_argument("--student-layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--heads", type=int, default=12)


def teacher_and_student(args: argparse.Namespace, max_seq_length: int) -> tuple[BertForMaskedLM, torch.nn.Module]:
    """A random-weight teacher of the flags' shape and the student initialised from every other of its layers,
    on the CPU, drawn from SEED."""
    torch.manual_seed(SEED)
    teacher_config = BertConfig(num_hidden_layers=args.teacher_layers, hidden_size=args.hidden,
                                intermediate_size=args.intermediate, num_attention_heads=args.heads,
                                max_position_embeddings=max(512, max_seq_length))
    teacher = BertForMaskedLM(teacher_config)
    layers = teacher_layers_for_student("every_other", args.teacher_layers, args.student_layers)
    student = init_student_from_teacher(teacher, student_config_from_teacher(teacher_config, args.student_layers),
                                        layers)
    return teacher, student


def measured_config(args: argparse.Namespace, device: torch.device) -> DistillPretrainConfig:
    """The config's distill_pretrain (merged over configs/default.yaml, as Snakemake merges --configfile), with the
    flags' scaled-down values where given."""
    overrides = yaml.safe_load(args.config.read_text()) or {}
    dcfg = load_config(DEFAULT_CONFIG, overrides if args.config.resolve() != DEFAULT_CONFIG else None).distill_pretrain
    train_cfg = replace(
        dcfg.train, device=device.type, torch_compile=args.compile, bf16=args.precision == "bf16",
        max_tokens_per_batch=args.max_tokens or dcfg.train.max_tokens_per_batch,
        dataloader_workers=dcfg.train.dataloader_workers if args.workers is None else args.workers,
    )
    return replace(
        dcfg, train=train_cfg,
        max_seq_length=args.seq_len or dcfg.max_seq_length,
        chunked_loss_rows=args.chunked_loss_rows or dcfg.chunked_loss_rows,
        packed_tokens_multiple_of=args.packed_multiple or dcfg.packed_tokens_multiple_of,
    )


# The loss as the stage runs it, and as it ran before its vocabulary was padded and its chunk fused and compiled
# (the same chunking and math, eager, on 30,522 columns): (vocab_multiple, compile_chunks, description).
LOSS_PATHS = {
    "fused": (64, None, "the stage's loss: vocabulary padded to a multiple of 64, the fused chunk compiled on CUDA"),
    "unpadded_eager": (1, False, "the same chunks on the unpadded vocabulary, the chunk function eager"),
}


def loss_layout(path: str, chunk_rows: int) -> ChunkLayout:
    vocab_multiple, compile_chunks, _ = LOSS_PATHS[path]
    return ChunkLayout(chunk_rows, vocab_multiple, compile_chunks)


def build_workload(args: argparse.Namespace, dcfg: DistillPretrainConfig, device: torch.device,
                   corpus_dir: Path) -> Workload:
    teacher, student = teacher_and_student(args, dcfg.max_seq_length)
    student = student.to(device)
    teacher = freeze(teacher).to(device)
    bf16 = device.type == "cuda" and args.precision == "bf16"
    if bf16:
        teacher = teacher.to(torch.bfloat16)  # as the stage: a frozen bf16 teacher where the loop trains in bf16
    student_encoder, teacher_encoder = encoders(student, teacher)
    corpus = TokenizedCorpus(corpus_dir)
    tokens = BertTokenIds()
    selection_weights = (selection_weights_from_counts(corpus.token_counts(), special_token_ids(tokens),
                                                       dcfg.smoothing_exponent)
                         if dcfg.token_frequency_smoothing else None)
    collator = MaskedBatchCollator(tokens, dcfg.mlm_mask_prop, selection_weights, dcfg.packed_tokens_multiple_of)
    return Workload(
        student=student, teacher=teacher, dcfg=dcfg, device=device, precision=args.precision, bf16=bf16,
        student_forward=maybe_compile(student_encoder, dcfg.train, device),
        teacher_forward=maybe_compile(teacher_encoder, dcfg.train, device),
        sequences=corpus.sequences("train", dcfg.max_seq_length),
        collate=CountingCollate(collator, dcfg.restrict_ce_to_mask),
        teacher_shape=EncoderShape.of(teacher.config), student_shape=EncoderShape.of(student.config),
        workers=dcfg.train.dataloader_workers, layout=loss_layout(args.loss_path, dcfg.chunked_loss_rows),
    )


def run_rounds(args: argparse.Namespace, work: Workload, gemm_dtype: torch.dtype, telemetry: GpuTelemetry,
               scratch: Path) -> tuple[list, list[dict], tuple[int, int]]:
    """The protocol: `--repeats` rounds of (benchmark loop, stage loop, GEMM microbenchmark), one after the other.
    Returns (loop, repeat, what it measured) in the order they ran, the GEMM shapes and the micro-batch rows they
    come from (the median micro-batch of the first timed span)."""
    rounds, shapes, gemm_rows = [], None, None
    for repeat in range(args.repeats):
        rounds.append(("benchmark_loop", repeat, benchmark_loop(work, args.warmup, args.steps, telemetry)))
        rounds.append(("stage_train", repeat, stage_train_loop(work, args.warmup, args.steps, args.grad_accum_steps,
                                                                telemetry, scratch / f"stage-{repeat}")))
        if shapes is None:
            rows = sorted(rounds[0][2]["counts"].batch_rows)
            gemm_rows = rows[len(rows) // 2]
            shapes = step_matmul_shapes(work.teacher_shape, work.student_shape, gemm_rows[0], gemm_rows[1],
                                        work.layout.chunk_rows, work.layout.vocab_multiple,
                                        padded_chunks=work.layout.resolved_compile(work.device))
        rounds.append(("gemm", repeat, gemm_round(shapes, gemm_dtype, work.device, args.gemm_min_seconds)))
    return rounds, shapes, gemm_rows


LOOP_DESCRIPTIONS = {
    "benchmark_loop": "this script's loop over distill_pretrain's loss, data path and optimizer (AdamW, clipping), "
                      "one micro-batch per optimizer step",
    "stage_train": "pipeline.training.loop.train with distill_pretrain's arguments (the stage's own loop)",
}


def loop_results(rounds: list, steps: int, peak: float | None, ceiling: float) -> dict:
    """Per loop: every repeat's record (with its fraction of the GEMM ceiling) and the spread of each rate."""
    loops = {}
    for name, description in LOOP_DESCRIPTIONS.items():
        repeats = []
        for position, (loop, repeat, run) in enumerate(rounds):
            if loop == name:
                record = repeat_record(run, steps, position, repeat, peak)
                record["fraction_of_gemm_ceiling"] = round(record["achieved_tflops"] / ceiling, 4)
                repeats.append(record)
        loops[name] = {
            "description": description,
            "repeats": repeats,
            "summary": {key: spread([r[key] for r in repeats])
                        for key in ("tokens_per_second", "seconds_per_step", "achieved_tflops", "mfu",
                                    "fraction_of_gemm_ceiling")},
        }
    return loops


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    dcfg = measured_config(args, device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    bf16 = device.type == "cuda" and args.precision == "bf16"
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    precision = "bf16" if bf16 else ("tf32" if tf32 else "fp32")
    peak = peak_tflops(device_name, precision)
    reader, gpu_static, gpu_source = gpu_reader(device)
    telemetry = GpuTelemetry(reader, args.telemetry_interval)
    load_at_start = host_load()

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        micro_batches = (args.warmup + args.steps) * args.grad_accum_steps
        corpus_dir = args.corpus_dir or random_corpus(
            scratch, n_tokens=(micro_batches + args.profile_steps + 1) * dcfg.train.max_tokens_per_batch * 4)
        work = build_workload(args, dcfg, device, corpus_dir)
        gemm_dtype = torch.bfloat16 if bf16 else torch.float32
        rounds, shapes, gemm_rows = run_rounds(args, work, gemm_dtype, telemetry, scratch)
        profile = profile_steps(work, args.profile_steps) if args.profile_steps else None

    gemm_repeats = [dict(record, position=position, repeat=repeat)
                    for position, (loop, repeat, record) in enumerate(rounds) if loop == "gemm"]
    loops = loop_results(rounds, args.steps, peak["tflops"],
                         ceiling=float(np.mean([r["achieved_tflops"] for r in gemm_repeats])))

    result = {
        **machine_record(args, argv, device, device_name, work, load_at_start),
        **settings_record(args, dcfg, device, work, bf16, precision, tf32, rounds),
        **rates_record(loops, peak),
        "gemm": gemm_record(gemm_dtype, gemm_rows, shapes, gemm_repeats, peak),
        "loops": loops,
        "gpu_clocks": gpu_clocks_record(reader, gpu_static, gpu_source),
        "profile": profile,
        **models_record(work, loops, rounds),
    }
    atomic_write_json(args.out, result)
    print(json.dumps({key: result[key] for key in ("device", "tokens_per_second", "seconds_per_step", "mfu")}
                     | {"summary": {name: loop["summary"] for name, loop in loops.items()}}, indent=2))
    return result


def machine_record(args: argparse.Namespace, argv: list[str] | None, device: torch.device, device_name: str | None,
                   work: Workload, load_at_start: float | None) -> dict:
    """What ran, on what: the benchmark, its command, the device and host, the libraries' versions."""
    return {
        "benchmark": f"distill_pretrain throughput and MFU through the corpus data path, {models_description(args)} "
                     "(random weights)",
        "command": shlex.join([Path(sys.executable).name, "-m", "benchmarks.distill_throughput",
                               *(sys.argv[1:] if argv is None else argv)]),
        "device": device_name or "cpu",
        "gpu": gpu_description(device),
        "cpu": cpu_description(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        # Runnable processes averaged over a minute, at the start and the end: above the core count, other work
        # shared the CPU with this run.
        "host_load_average_1min": {"start": load_at_start, "end": host_load()},
        "threads": torch.get_num_threads(),
        "loader_workers": work.workers,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def settings_record(args: argparse.Namespace, dcfg: DistillPretrainConfig, device: torch.device, work: Workload,
                    bf16: bool, precision: str, tf32: bool, rounds: list) -> dict:
    """What was measured, and how: precision, the config's shape, the loss path, the corpus, the models' shapes, the
    steps and repeats, and the order the rounds ran in."""
    return {
        "bf16": bf16,
        "precision": precision,
        "tf32_matmul": tf32,
        "torch_compile": args.compile and device.type == "cuda",
        "config": str(args.config.resolve().relative_to(PROJECT_ROOT)) if args.config.resolve().is_relative_to(
            PROJECT_ROOT) else str(args.config),
        "packed_tokens_multiple_of": dcfg.packed_tokens_multiple_of,
        "chunked_loss_rows": dcfg.chunked_loss_rows,
        "loss_path": {"name": args.loss_path, "description": LOSS_PATHS[args.loss_path][2],
                      "vocab_multiple": work.layout.vocab_multiple,
                      "chunk_compiled": work.layout.resolved_compile(device)},
        "restrict_ce_to_mask": dcfg.restrict_ce_to_mask,
        "seq_len": dcfg.max_seq_length,
        "max_tokens_per_batch": dcfg.train.max_tokens_per_batch,
        "grad_accum_steps_stage_loop": args.grad_accum_steps,
        "corpus": str(args.corpus_dir) if args.corpus_dir else "random ids",
        "model_shapes": {"teacher": vars(work.teacher_shape), "student": vars(work.student_shape)},
        "steps_warmup": args.warmup,
        "steps_timed": args.steps,
        "repeats": args.repeats,
        "protocol": {
            "order": "each round: benchmark_loop, stage_train, gemm; rounds repeated",
            "minimum_for_reported_figures": MINIMUM_PROTOCOL,
            "meets_minimum": args.repeats >= MINIMUM_PROTOCOL["repeats"] and args.steps >= MINIMUM_PROTOCOL["steps"],
        },
        "order": [{"position": position, "loop": loop, "repeat": repeat}
                  for position, (loop, repeat, _) in enumerate(rounds)],
    }


def rates_record(loops: dict, peak: dict) -> dict:
    """The headline: the benchmark loop's mean s/step, tokens/s and phase times, each loop's MFU, and what MFU is
    computed from (the FLOP formula, the peak)."""
    headline = loops["benchmark_loop"]["repeats"]

    def mean_of(key: str) -> dict | None:
        if headline[0].get(key) is None:
            return None
        return {name: round(float(np.mean([r[key][name] for r in headline])), 6) for name in headline[0][key]}

    return {
        "seconds_per_step": round(float(np.mean([r["seconds_per_step"] for r in headline])), 4),
        "tokens_per_second": round(float(np.mean([r["tokens_per_second"] for r in headline])), 1),
        "step_breakdown_seconds": mean_of("step_breakdown_seconds"),
        "host_breakdown_seconds": mean_of("host_breakdown_seconds"),
        "mfu": {
            "benchmark_loop": loops["benchmark_loop"]["summary"]["mfu"]["mean"] if peak["tflops"] else None,
            "stage_train": loops["stage_train"]["summary"]["mfu"]["mean"] if peak["tflops"] else None,
            "reason": None if peak["tflops"] else peak["reason"],
        },
        "flop_formula": FLOP_FORMULA,
        "peak": peak,
    }


def gemm_record(gemm_dtype: torch.dtype, gemm_rows: tuple[int, int], shapes: list[dict], gemm_repeats: list[dict],
                peak: dict) -> dict:
    """The GEMM ceiling: the step's matmul shapes, the micro-batch they come from, every repeat and its spread."""
    return {
        "what": "the step's own matmul shapes and operand layouts, each timed alone with torch.mm; "
                "achieved_tflops = the step's matmul FLOPs / the time those shapes take alone (the realistic "
                "ceiling)",
        "dtype": str(gemm_dtype).removeprefix("torch."),
        "from_micro_batch": {"encoder_rows": gemm_rows[0], "head_rows": gemm_rows[1],
                             "chosen": "the median micro-batch of the first timed span"},
        "shapes": shapes,
        "repeats": gemm_repeats,
        "achieved_tflops": spread([r["achieved_tflops"] for r in gemm_repeats]),
        "peak_tflops": peak["tflops"],
    }


def gpu_clocks_record(reader, gpu_static: dict | None, gpu_source: str) -> dict:
    """Where the GPU telemetry came from and the GPU's static limits, or why there is none."""
    return ({"source": gpu_source, **gpu_static, "per_repeat": "loops.*.repeats[].gpu_telemetry"}
            if reader else {"available": False, "reason": gpu_source})


def models_record(work: Workload, loops: dict, rounds: list) -> dict:
    """The models: peak memory, parameters, the last step's loss terms, and the reference run."""
    return {
        "peak_memory_mib": max(r["peak_memory_mib"] for loop in loops.values() for r in loop["repeats"]),
        "teacher_parameters": work.teacher.num_parameters(),
        "student_parameters": work.student.num_parameters(),
        "last_loss_terms": [run for loop, _, run in rounds if loop == "benchmark_loop"][-1]["last_loss_terms"],
        "reference": REFERENCE,
    }


def models_description(args: argparse.Namespace) -> str:
    if (args.teacher_layers, args.student_layers, args.hidden, args.intermediate) == (12, 6, 768, 3072):
        return "bert-base teacher -> 6-layer DistilBERT student"
    return (f"{args.teacher_layers}-layer teacher -> {args.student_layers}-layer DistilBERT student, width "
            f"{args.hidden}, feed-forward {args.intermediate}")


def gpu_description(device: torch.device) -> dict | None:
    """The GPU, its driver and the CUDA runtime PyTorch was built with (None on CPU)."""
    if device.type != "cuda":
        return None
    properties = torch.cuda.get_device_properties(device)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i",
                                 gpu_identifiers(device)[0]], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = None
    return {
        "name": properties.name,
        "memory_gb": round(properties.total_memory / 1e9, 1),
        "compute_capability": f"{properties.major}.{properties.minor}",
        "multiprocessors": properties.multi_processor_count,
        "driver": driver or None,
        "cuda_runtime": torch.version.cuda,
    }


def host_load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not every platform reports one
        return None
