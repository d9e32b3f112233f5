"""Benchmark: pretraining-distillation throughput through the real data path (not a test).

A bert-base-sized teacher (random weights: 12 layers, 768 wide, 30,522 tokens) distills into a 6-layer
DistilBERT student initialised from teacher layers 0, 2, 4, 7, 9, 11, with distill_pretrain's own loss
(`distillation_terms`), fed exactly as the stage feeds it: sequences read from a memory-mapped tokenized corpus
(a tokenize_corpus folder, or one written here of random ids in the same layout), token-budget batches, masking
in the DataLoader's workers, pinned memory. Writes tokens/s and a step-time breakdown (waiting for data, forward,
backward, optimizer) as JSON.

    .venv/bin/python benchmarks/distill_throughput.py --steps 3 --max-tokens 2048 --seq-len 128 --workers 0
    on one GPU (the paper's shape): --device cuda --seq-len 512 --max-tokens 65536 --workers 6 --compile --warmup 3
    the packed path (configs/paper.yaml): add --packed (--packed-multiple 1024)

Nothing synchronises the device inside the timed span: tokens/s is taken over the whole span, and on CUDA the
breakdown is the device's time between CUDA events recorded at the phase boundaries (`data_wait`: the device
waiting for the batch and its copy), beside the host's time to issue each phase (`host_breakdown_seconds`; a
phase that reads a device value on the host waits for the device there). On CPU both are wall time. Token-budget
batches change shape from step to step, so under `--compile` the first steps recompile for dynamic shapes: give them
`--warmup` steps. `--precision bf16` (the stage's default on CUDA) trains under bf16 autocast with a bf16 teacher;
`no` is fp32 throughout (TF32 off, PyTorch's default). Several GPUs train at the per-GPU rate each under torchrun.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import BertConfig, BertForMaskedLM

from pipeline.artifacts import atomic_write_json, cpu_description
from pipeline.config import DistillPretrainConfig, TrainConfig
from pipeline.corpus import TokenizedCorpus, token_budget_batches
from pipeline.mlm import MaskedBatchCollator
from pipeline.stages.distill_pretrain import distillation_terms, encoders
from pipeline.students import freeze, init_student_from_teacher, student_config_from_teacher, teacher_layers_for_student
from pipeline.training.batching import micro_batch_loader, to_device
from pipeline.training.loop import build_optimizer
from pipeline.training.run_settings import maybe_compile, peak_memory_mb


class BertTokenIds:
    """What MaskedBatchCollator reads of a tokenizer: bert-base-uncased's special ids and vocabulary size."""

    cls_token_id, sep_token_id, pad_token_id, mask_token_id = 101, 102, 0, 103
    all_special_ids = [0, 100, 101, 102, 103]

    def __len__(self) -> int:
        return 30522


def random_corpus(directory: Path, n_tokens: int, seed: int = 0) -> Path:
    """A tokenize_corpus folder of random ids: documents of 50 to 2,000 ids, so chunks and tails both occur."""
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < n_tokens:
        lengths.append(int(rng.integers(50, 2000)))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rng.integers(1000, 30522, size=int(offsets[-1]), dtype=np.uint16).tofile(directory / "ids.bin")
    np.save(directory / "doc_offsets.npy", offsets)
    np.save(directory / "doc_is_heldout.npy", np.zeros(len(lengths), dtype=bool))
    np.save(directory / "token_counts.npy", np.ones(30522, dtype=np.int64))
    description = {"dtype": "uint16", "vocab_size": 30522, "n_documents": len(lengths), "n_tokens": int(offsets[-1])}
    (directory / "corpus.json").write_text(json.dumps(description))
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after the warm-up steps)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (allocator, kernels, compilation)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=2048, help="token budget of a batch (padded tokens)")
    parser.add_argument("--corpus-dir", type=Path, default=None, help="a tokenize_corpus folder (bert-base ids)")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--compile", action="store_true", help="torch.compile both encoders (CUDA only)")
    parser.add_argument("--packed", action="store_true", help="distill_pretrain.packed_attention: real tokens only")
    parser.add_argument("--packed-multiple", type=int, default=1024, help="packed_tokens_multiple_of")
    parser.add_argument("--precision", choices=["bf16", "no"], default="bf16",
                        help="CUDA: bf16 autocast and a bf16 teacher (as the stage), or fp32; CPU is always fp32")
    parser.add_argument("--out", type=Path, default=Path("artifacts/benchmarks/distill_throughput.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu")
    torch.manual_seed(0)

    teacher_config = BertConfig()  # bert-base-uncased shape
    teacher = BertForMaskedLM(teacher_config)
    layers = teacher_layers_for_student("every_other", 12, 6)
    student = init_student_from_teacher(teacher, student_config_from_teacher(teacher_config, 6), layers).to(device)
    teacher = freeze(teacher).to(device)
    bf16 = device.type == "cuda" and args.precision == "bf16"
    if bf16:
        teacher = teacher.to(torch.bfloat16)
    cfg = DistillPretrainConfig(max_seq_length=args.seq_len, packed_attention=args.packed,
                                packed_tokens_multiple_of=args.packed_multiple)
    train_cfg = TrainConfig(learning_rate=5e-4, torch_compile=args.compile)
    student_encoder, teacher_encoder = encoders(student, teacher, args.packed)
    student_forward = maybe_compile(student_encoder, train_cfg, device)
    teacher_forward = maybe_compile(teacher_encoder, train_cfg, device)
    optimizer = build_optimizer(student, train_cfg, device)

    with tempfile.TemporaryDirectory() as scratch:
        total_steps = args.warmup + args.steps
        corpus_dir = args.corpus_dir or random_corpus(Path(scratch), n_tokens=total_steps * args.max_tokens * 4)
        sequences = TokenizedCorpus(corpus_dir).sequences("train", args.seq_len)
        collator = MaskedBatchCollator(BertTokenIds(), cfg.mlm_mask_prop,
                                       pack_to_multiple_of=args.packed_multiple if args.packed else None)
        lengths = sequences.sequence_lengths()
        loader = micro_batch_loader(
            sequences, collator, lambda epoch: token_budget_batches(lengths, args.max_tokens, 0, epoch), seed=0,
            start_micro_batch=0, total_micro_batches=total_steps, workers=args.workers,
            pin_memory=device.type == "cuda",
        )
        timer = PhaseTimer(device, ("data_wait", "forward", "backward", "optimizer"))
        tokens = 0
        stream = iter(loader)
        for number in range(total_steps):
            timed = number >= args.warmup  # warm-up steps: the allocator, kernels and compilation
            if number == args.warmup:
                timer.start()
            cpu_batch = next(stream)
            batch = to_device(cpu_batch, device)
            timer.lap("data_wait", timed)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                terms = distillation_terms(student, teacher, batch, cfg, student_forward, teacher_forward)
            timer.lap("forward", timed)
            terms["loss"].backward()
            timer.lap("backward", timed)
            torch.nn.utils.clip_grad_norm_(student.parameters(), 5.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            timer.lap("optimizer", timed)
            if timed:
                tokens += int(cpu_batch["n_tokens"])
        synchronize(device)
        seconds = time.perf_counter() - timer.started
    result = {
        "benchmark": "distill_pretrain throughput through the corpus data path, bert-base teacher -> 6-layer "
                     "DistilBERT student (random weights)",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "gpu": gpu_description(device),
        "cpu": cpu_description(),
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
        "loader_workers": args.workers,
        "torch": torch.__version__,
        "bf16": bf16,
        "precision": "bf16" if bf16 else "fp32",
        "tf32_matmul": device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32,
        "torch_compile": args.compile and device.type == "cuda",
        "packed_attention": args.packed,
        "packed_tokens_multiple_of": args.packed_multiple if args.packed else None,
        "seq_len": args.seq_len,
        "max_tokens_per_batch": args.max_tokens,
        "corpus": str(args.corpus_dir) if args.corpus_dir else "random ids",
        "steps_warmup": args.warmup,
        "steps_timed": args.steps,
        "seconds_per_step": round(seconds / args.steps, 4),
        "tokens_per_second": round(tokens / seconds, 1),
        "step_breakdown_seconds": {name: round(value / args.steps, 4) for name, value in timer.seconds().items()},
        "host_breakdown_seconds": ({name: round(value / args.steps, 4) for name, value in timer.host.items()}
                                   if device.type == "cuda" else None),
        "peak_memory_mb": round(peak_memory_mb(device), 1),
        "teacher_parameters": teacher.num_parameters(),
        "student_parameters": student.num_parameters(),
        "last_loss_terms": {name: float(value) for name, value in terms.items()},
        "paper": "Sanh et al. 2019 trained on 8 V100 GPUs for about 90 hours",
    }
    atomic_write_json(args.out, result)
    print(json.dumps(result, indent=2))


def gpu_description(device: torch.device) -> dict | None:
    """The GPU, its driver and the CUDA runtime PyTorch was built with (None on CPU)."""
    if device.type != "cuda":
        return None
    properties = torch.cuda.get_device_properties(device)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i",
                                 str(device.index or 0)], capture_output=True, text=True, timeout=30).stdout.strip()
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


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseTimer:
    """Time per phase of the timed steps, with no synchronisation inside them: on CUDA the device's time between
    events recorded at the phase boundaries, and the host's time to issue each phase; on CPU the wall time."""

    def __init__(self, device: torch.device, names: tuple[str, ...]):
        self.cuda = device.type == "cuda"
        self.device = device
        self.host = dict.fromkeys(names, 0.0)
        self.intervals: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self.started = self.clock = 0.0
        self.event = None

    def _record(self):
        if not self.cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        synchronize(self.device)
        self.started = self.clock = time.perf_counter()
        self.event = self._record()

    def lap(self, name: str, timed: bool) -> None:
        if not timed:
            return
        now = time.perf_counter()
        self.host[name] += now - self.clock
        self.clock = now
        if self.cuda:
            event = self._record()
            self.intervals.append((name, self.event, event))
            self.event = event

    def seconds(self) -> dict[str, float]:
        """Per phase, summed over the timed steps (call after synchronising)."""
        if not self.cuda:
            return dict(self.host)
        device_seconds = dict.fromkeys(self.host, 0.0)
        for name, begin, end in self.intervals:
            device_seconds[name] += begin.elapsed_time(end) / 1000
        return device_seconds


if __name__ == "__main__":
    main()
