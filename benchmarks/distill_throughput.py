"""Benchmark: pretraining-distillation throughput and peak memory at full size (not a test).

A bert-base-sized teacher (random weights: 12 layers, 768 wide, 30,522 tokens) distills into a 6-layer
DistilBERT student initialised from teacher layers 0, 2, 4, 7, 9, 11, with the triple loss of
pipeline/stages/distill_pretrain.py, at sequence length 128. Runs a few optimizer steps (after one warm-up
step) and writes tokens/s, seconds per step and peak memory to a JSON file.

    .venv/bin/python benchmarks/distill_throughput.py --steps 3 --batch-size 8 --out artifacts/benchmarks/distill_throughput_cpu.json
    (on a GPU: --device cuda --batch-size 64 [--compile]; bf16 autocast, bf16 teacher and fused AdamW as in
    the stage; the result then carries tokens/s per GPU. Several GPUs train at that rate each under torchrun.)
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from transformers import BertConfig, BertForMaskedLM

from pipeline.artifacts import atomic_write_json
from pipeline.config import DistillPretrainConfig, TrainConfig
from pipeline.masking import mask_tokens
from pipeline.stages.distill_pretrain import distillation_terms, freeze
from pipeline.students import init_student_from_teacher, student_config_from_teacher, teacher_layers_for_student
from pipeline.train import build_optimizer, maybe_compile, peak_memory_mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--compile", action="store_true", help="torch.compile the student's encoder (CUDA only)")
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
    bf16 = device.type == "cuda"
    if bf16:
        teacher = teacher.to(torch.bfloat16)
    cfg = DistillPretrainConfig()
    student_forward = maybe_compile(student.distilbert, TrainConfig(torch_compile=args.compile), device)
    optimizer = build_optimizer(student, TrainConfig(learning_rate=5e-4), device)

    input_ids = torch.randint(1000, teacher_config.vocab_size, (args.batch_size, args.seq_len), device=device)
    input_ids[:, 0], input_ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    attention_mask = torch.ones_like(input_ids)
    special = torch.zeros_like(input_ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True

    def step() -> dict:
        masked, labels = mask_tokens(input_ids, special, 103, teacher_config.vocab_size, cfg.mlm_mask_prop)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            terms = distillation_terms(student, teacher, masked, labels, attention_mask, cfg, student_forward)
        terms["loss"].backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 5.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return {k: float(v) for k, v in terms.items()}

    step()  # warm-up: allocator, kernels
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        terms = step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = args.steps * args.batch_size * args.seq_len
    result = {
        "benchmark": "distill_pretrain throughput, bert-base teacher -> 6-layer DistilBERT student (random weights)",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor() or platform.machine()})",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "bf16": bf16,
        "torch_compile": args.compile and device.type == "cuda",
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "steps_timed": args.steps,
        "seconds_per_step": round(seconds / args.steps, 4),
        "tokens_per_second": round(tokens / seconds, 1),
        "tokens_per_second_per_gpu": round(tokens / seconds, 1) if device.type == "cuda" else None,
        "peak_memory_mb": round(peak_memory_mb(device), 1),
        "teacher_parameters": teacher.num_parameters(),
        "student_parameters": student.num_parameters(),
        "last_loss_terms": terms,
        "reference": "Sanh et al. 2019 trained on 8 V100 GPUs for about 90 hours",
    }
    atomic_write_json(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
