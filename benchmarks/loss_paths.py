"""GPU check (not a test): distill_pretrain's loss as the stage runs it against the same chunks unpadded and eager,
in one process, at the shape of `configs/paper.yaml`'s distill_pretrain (flags scale it down).

The two paths (`LOSS_PATHS` of benchmarks/distill_throughput/cli.py): `fused`, the stage's (the vocabulary padded
to a multiple of 64, the fused chunk compiled on CUDA), and `unpadded_eager` (30,522 columns, the chunk function
eager). Both share one teacher, one student and, with `--compile`, the same compiled encoders; only the loss
differs. Parts (`--parts`):

- `gemm`: the three vocabulary GEMMs of a chunk (logits x·Wᵀ, input gradient g·W, weight gradient gᵀ·x with gᵀ a
  transposed view) at `--vocabularies` (30,522, 30,528, 30,592 by default), in the operand layouts the loss uses.
- `throughput`: `--rounds` rounds; each runs `--warmup` untimed and `--steps` timed steps of distill_throughput's
  benchmark loop (the stage's loss, data path and optimizer) for each path in turn, so drift falls on both alike.
  Per round and path: tokens/s, model FLOPs, MFU against the GPU's dense peak, peak memory.
- `profile`: `--profile-steps` profiled steps of each path: time by kernel class, the loss's share of the step
  (device time inside the `chunked_lm_head_losses` range, where the loss's gradient work runs too), and every GEMM
  kernel whose name says it is 1- or 2-element aligned (`align1`, `align2`: the slow kernels an unaligned leading
  dimension selects).
- `convergence`: from one initial student, `--convergence-steps` steps of the stage's own training loop
  (`pipeline.training.loop.train`, as distill_pretrain.run calls it) with each path and each of `--seeds` seeds
  (the seed draws the batches, masks and dropout; a path and a seed see the same batches as the other path with
  that seed). The MLM loss of every logged step, each run's final MLM loss (the mean of the last 3 logged), and
  the paths' difference against the seed-to-seed spread.

The JSON is written after each part, so a run stopped by a time limit keeps the parts it finished.

    One H200 (inside benchmarks/gpu_check.sh):
      python -m benchmarks.loss_paths --device cuda --compile --out results/loss_paths.json
    CPU dry run at tiny shapes:
      python -m benchmarks.loss_paths --device cpu --teacher-layers 2 --student-layers 1 --hidden 32 \\
        --intermediate 64 --heads 2 --seq-len 32 --max-tokens 256 --chunked-loss-rows 64 --packed-multiple 16 \\
        --warmup 1 --steps 2 --rounds 2 --profile-steps 1 --convergence-steps 4 --convergence-max-tokens 128 \\
        --vocabularies 30522,30528 --gemm-min-seconds 0.001 --out /tmp/loss_paths.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import shlex
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import transformers
from torch.autograd import DeviceType

from benchmarks.distill_throughput.cli import (
    LOSS_PATHS,
    PAPER_CONFIG,
    add_model_shape_arguments,
    build_workload,
    loss_layout,
    measured_config,
)
from benchmarks.distill_throughput.device import synchronize
from benchmarks.distill_throughput.gemm_ceiling import peak_tflops, vocabulary_gemms
from benchmarks.distill_throughput.kernels import profile_summary
from benchmarks.distill_throughput.telemetry import GpuTelemetry
from benchmarks.distill_throughput.workload import (
    benchmark_loop,
    launch_precision,
    profiled_steps,
    random_corpus,
    repeat_record,
    spread,
)

from pipeline.data.corpus import token_budget_batches  # noqa: E402
from pipeline.distillation.chunked_lm_loss import PROFILER_RANGE  # noqa: E402
from pipeline.outputs.artifacts import atomic_write_json  # noqa: E402
from pipeline.outputs.machine import cpu_description  # noqa: E402
from pipeline.startup import libraries_loaded  # noqa: E402
from pipeline.training.loop import train  # noqa: E402
from pipeline.training.run_settings import seed_everything  # noqa: E402

PARTS = ("gemm", "throughput", "profile", "convergence")
PATH_ORDER = ("unpadded_eager", "fused")  # each round runs them in this order
UNALIGNED_MARKERS = ("align1", "align2")
FINAL_LOGGED_STEPS = 3  # a run's final MLM loss: the mean of its last logged values


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=PAPER_CONFIG,
                        help="the config whose distill_pretrain shape is measured (merged over configs/default.yaml)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    add_model_shape_arguments(parser)
    parser.add_argument("--seq-len", type=int, default=None, help="default: the config's max_seq_length")
    parser.add_argument("--max-tokens", type=int, default=None, help="default: the config's max_tokens_per_batch")
    parser.add_argument("--chunked-loss-rows", type=int, default=None, help="default: the config's")
    parser.add_argument("--packed-multiple", type=int, default=None, help="default: the config's")
    parser.add_argument("--workers", type=int, default=None, help="default: the config's dataloader_workers")
    parser.add_argument("--compile", action="store_true", help="torch.compile both encoders (CUDA only)")
    parser.add_argument("--precision", choices=["bf16", "no"], default="bf16")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--vocabularies", default="30522,30528,30592", help="the GEMM part's vocabulary sizes")
    parser.add_argument("--gemm-min-seconds", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps of each path in every round")
    parser.add_argument("--steps", type=int, default=50, help="timed steps of each path in every round")
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--convergence-steps", type=int, default=150)
    parser.add_argument("--convergence-max-tokens", type=int, default=16384,
                        help="the convergence runs' micro-batch token budget (one micro-batch a step)")
    parser.add_argument("--seeds", default="0,1", help="the convergence runs' seeds")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.parts = [name.strip() for name in args.parts.split(",") if name.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {', '.join(unknown)} (choose from {', '.join(PARTS)})")
    args.vocabularies = [int(v) for v in args.vocabularies.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.threads, args.loss_path = None, "fused"  # what distill_throughput's builders read
    return args


def gemm_part(args, dcfg, device) -> dict:
    dtype = torch.bfloat16 if device.type == "cuda" and args.precision == "bf16" else torch.float32
    rows = dcfg.chunked_loss_rows
    return {"rows": rows, "hidden": args.hidden, "dtype": str(dtype).removeprefix("torch."),
            "gemms": vocabulary_gemms(rows, args.hidden, args.vocabularies, dtype, device, args.gemm_min_seconds)}


def throughput_part(args, workloads: dict, peak: float | None) -> dict:
    telemetry = GpuTelemetry(None, 1.0)
    rounds = {name: [] for name in PATH_ORDER}
    order = []
    for round_number in range(args.rounds):
        for name in PATH_ORDER:
            run = benchmark_loop(workloads[name], args.warmup, args.steps, telemetry)
            record = repeat_record(run, args.steps, len(order), round_number, peak)
            record["last_loss_terms"] = run["last_loss_terms"]
            rounds[name].append(record)
            order.append({"round": round_number, "path": name})
            print(f"throughput round {round_number} {name}: {record['tokens_per_second']:,.0f} tokens/s", flush=True)
    summary = {name: {key: spread([r[key] for r in records])
                      for key in ("tokens_per_second", "seconds_per_step", "mfu", "peak_memory_mib")}
               for name, records in rounds.items()}
    speedup = (summary["fused"]["tokens_per_second"]["mean"]
               / summary["unpadded_eager"]["tokens_per_second"]["mean"])
    return {"order": order, "rounds": rounds, "summary": summary, "fused_over_unpadded_eager": round(speedup, 4)}


def profile_part(args, workloads: dict) -> dict:
    return {name: profile_path(workloads[name], args.profile_steps) for name in PATH_ORDER}


def loss_range_seconds(events, on_gpu: bool) -> tuple[float, int]:
    """The seconds inside the loss's named ranges and how many ranges: the host's ranges only; on a GPU, the device
    time of the kernels launched inside each. On a GPU the profiler also lists each range a second time, as a
    device-side annotation spanning the same kernels: counting both would count the loss twice."""
    ranges = [event for event in events if event.name == PROFILER_RANGE and event.device_type == DeviceType.CPU]
    seconds = sum((event.device_time_total if on_gpu else event.cpu_time_total) for event in ranges) / 1e6
    return seconds, len(ranges)


def profile_path(work, steps: int) -> dict:
    """`steps` profiled steps of the benchmark loop (after one untimed one): kernel classes, the loss's share, and
    the unaligned GEMM kernels."""
    on_gpu = work.device.type == "cuda"
    profiler, wall = profiled_steps(work, steps, seed=0)
    loss_seconds, ranges = loss_range_seconds(profiler.events(), on_gpu)
    unaligned = {}
    for event in profiler.key_averages():
        device_event = event.device_type == DeviceType.CUDA if on_gpu else event.device_type == DeviceType.CPU
        if device_event and any(marker in event.key.lower() for marker in UNALIGNED_MARKERS):
            seconds = (event.self_device_time_total if on_gpu else event.self_cpu_time_total) / 1e6
            unaligned[event.key[:200]] = round(unaligned.get(event.key[:200], 0.0) + seconds, 6)
    return {
        "steps": steps,
        "loss_range": PROFILER_RANGE,
        "loss_seconds": round(loss_seconds, 6),
        "loss_share_of_wall": round(loss_seconds / wall, 4) if wall > 0 else None,
        "loss_ranges_seen": ranges,
        "unaligned_gemm_kernels": unaligned,
        "unaligned_gemm_seconds": round(sum(unaligned.values()), 6),
        **profile_summary(profiler.key_averages(), wall, on_gpu=on_gpu),
    }


def convergence_part(args, workloads: dict, initial_state: dict, scratch: Path) -> dict:
    runs = {name: {} for name in PATH_ORDER}
    for seed in args.seeds:
        for name in PATH_ORDER:
            runs[name][str(seed)] = convergence_run(args, workloads[name], initial_state, seed,
                                                    scratch / f"convergence-{name}-{seed}")
            print(f"convergence {name} seed {seed}: final mlm {runs[name][str(seed)]['final_mlm']:.4f}", flush=True)
    finals = {name: [run["final_mlm"] for run in by_seed.values()] for name, by_seed in runs.items()}
    seed_spread = {name: float(max(values) - min(values)) for name, values in finals.items()}
    path_difference = abs(float(np.mean(finals["fused"])) - float(np.mean(finals["unpadded_eager"])))
    same_seed = {str(seed): abs(runs["fused"][str(seed)]["final_mlm"] - runs["unpadded_eager"][str(seed)]["final_mlm"])
                 for seed in args.seeds}
    largest_spread = max(seed_spread.values())
    return {
        "steps": args.convergence_steps,
        "micro_batch_tokens": args.convergence_max_tokens,
        "seeds": args.seeds,
        "final": f"the mean MLM loss of the last {FINAL_LOGGED_STEPS} logged steps",
        "runs": runs,
        "final_mlm": finals,
        "seed_to_seed_spread": seed_spread,
        "path_difference_of_means": path_difference,
        "path_difference_same_seed": same_seed,
        "within_seed_spread": path_difference <= largest_spread if len(args.seeds) > 1 else None,
    }


def convergence_run(args, work, initial_state: dict, seed: int, scratch: Path) -> dict:
    """The stage's own train() for --convergence-steps steps, from the initial student, with this seed."""
    with torch.no_grad():
        work.student.load_state_dict(initial_state)
    seed_everything(seed)
    steps = args.convergence_steps
    log_every = max(1, min(10, steps // 5))
    cfg = replace(work.dcfg.train, max_steps=steps, grad_accum_steps=1, log_every=log_every,
                  checkpoint_every=steps + 1, max_tokens_per_batch=args.convergence_max_tokens,
                  dataloader_workers=work.workers)
    dcfg = replace(work.dcfg, train=cfg)
    run_work = replace(work, dcfg=dcfg)
    started = time.perf_counter()
    with launch_precision(work.precision):
        result = train(
            module=work.student, compute_loss=run_work.loss, examples=work.sequences, collate=work.collate, cfg=cfg,
            seed=seed, device=work.device, checkpoint_dir=scratch / "checkpoints", log_path=scratch / "log.jsonl",
            fingerprint=f"loss_paths-{seed}", description="distill_pretrain (convergence)",
            batch_plan=lambda epoch: token_budget_batches(work.sequences.sequence_lengths(),
                                                          args.convergence_max_tokens, seed, epoch),
            example_tokens=work.sequences.sequence_lengths(), static_graph=True,
        )
    synchronize(work.device)
    log = [json.loads(line) for line in (scratch / "log.jsonl").read_text().splitlines() if line.strip()]
    mlm = [{"step": entry["step"], "mlm": entry["mlm"], "loss": entry["loss"]} for entry in log]
    return {"seconds": round(time.perf_counter() - started, 2), "steps": result.steps, "logged": mlm,
            "final_mlm": float(np.mean([entry["mlm"] for entry in mlm[-FINAL_LOGGED_STEPS:]]))}


def run_part(name: str, part, record: dict) -> None:
    started = time.perf_counter()
    try:
        record["parts"][name] = part()
    except Exception as error:  # one failing part must not hide the others' numbers
        record["parts"][name] = {"error": f"{type(error).__name__}: {error}",
                                 "traceback": traceback.format_exc(limit=8)}
    record["parts"][name]["seconds"] = round(time.perf_counter() - started, 1)
    print(f"{name}: {record['parts'][name]['seconds']} s{' (error)' if 'error' in record['parts'][name] else ''}",
          flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    dcfg = measured_config(args, device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    bf16 = device.type == "cuda" and args.precision == "bf16"
    peak = peak_tflops(device_name, "bf16" if bf16 else "fp32")
    record = {
        "benchmark": "distill_pretrain's loss paths in one process: the stage's (padded vocabulary, fused chunk "
                     "compiled on CUDA) against the same chunks unpadded and eager",
        "command": shlex.join([Path(sys.executable).name, "-m", "benchmarks.loss_paths",
                               *(sys.argv[1:] if argv is None else argv)]),
        "device": device_name or "cpu",
        "cpu": cpu_description(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "precision": "bf16" if bf16 else "fp32",
        "encoders_compiled": args.compile and device.type == "cuda",
        "paths": {name: {"vocab_multiple": LOSS_PATHS[name][0], "description": LOSS_PATHS[name][2],
                         "chunk_compiled": (device.type == "cuda" if LOSS_PATHS[name][1] is None
                                            else LOSS_PATHS[name][1])} for name in PATH_ORDER},
        "seq_len": dcfg.max_seq_length,
        "max_tokens_per_batch": dcfg.train.max_tokens_per_batch,
        "chunked_loss_rows": dcfg.chunked_loss_rows,
        "packed_tokens_multiple_of": dcfg.packed_tokens_multiple_of,
        "restrict_ce_to_mask": dcfg.restrict_ce_to_mask,
        "model_shapes": {"teacher_layers": args.teacher_layers, "student_layers": args.student_layers,
                         "hidden": args.hidden, "intermediate": args.intermediate, "heads": args.heads},
        "peak": peak,
        "parts_asked": args.parts,
        "parts": {},
    }

    with tempfile.TemporaryDirectory(prefix="loss_paths_") as scratch:
        scratch = Path(scratch)
        need_models = any(part != "gemm" for part in args.parts)
        workloads, initial_state = {}, None
        if need_models:
            steps_needed = args.rounds * (args.warmup + args.steps) + 2 * (args.profile_steps + 1)
            tokens = max(steps_needed * dcfg.train.max_tokens_per_batch,
                         args.convergence_steps * args.convergence_max_tokens) * 2
            work = build_workload(args, dcfg, device, random_corpus(scratch, n_tokens=tokens))
            initial_state = copy.deepcopy(work.student.state_dict())
            workloads = {name: replace(work, layout=loss_layout(name, dcfg.chunked_loss_rows)) for name in PATH_ORDER}
        parts = {
            "gemm": lambda: gemm_part(args, dcfg, device),
            "throughput": lambda: throughput_part(args, workloads, peak["tflops"]),
            "profile": lambda: profile_part(args, workloads),
            "convergence": lambda: convergence_part(args, workloads, initial_state, scratch),
        }
        for name in args.parts:
            run_part(name, parts[name], record)
            record["complete"] = len(record["parts"]) == len(args.parts)
            record["failed_parts"] = [part for part, result in record["parts"].items() if "error" in result]
            atomic_write_json(args.out, record)
        del workloads
    print(f"wrote {args.out}: failed parts {record['failed_parts'] or 'none'}")
    return 1 if record["failed_parts"] else 0


if __name__ == "__main__":
    libraries_loaded()  # collection resumes (benchmarks/__init__.py)
    raise SystemExit(main())
