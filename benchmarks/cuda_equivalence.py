"""GPU check (not a test): distill_pretrain's packed path on the device it is built for.

The CPU tests prove the packed encoders and the chunked loss equal to the Hugging Face modules and the whole-grid
loss, but on the CPU the packed attention runs its grid path: the jagged-tensor SDPA (flash attention's
variable-length kernel in bf16), the compiled fused chunk of the loss and the GEMMs on the padded vocabulary only
run on a GPU. This script runs `distillation_terms`, the function the stage calls, on one micro-batch at the paper's model and sequence shapes (a bert-base teacher, the 6-layer student
initialised from it and moved off it by a little noise, sequences of up to 512 tokens from a random corpus, masked
as the stage masks; a 16,384-token budget by default, as the padded path's whole-vocabulary loss holds [tokens x
30,522] fp32 grids), once packed with the chunked loss (the stage's path) and once padded with the
whole-vocabulary loss (the Hugging Face modules: pipeline/distillation/reference_loss.py), and records:

- `fp32`: the two paths' loss terms and every student gradient in fp32 (dropout off, TF32 off), on each of the
  two micro-batches (the plan's first, and half of its second: sequences of other lengths). They compute the same
  sums in other orders: terms within rtol 1e-5, the whole gradient within a relative norm error of 1e-4, and each
  parameter's within 1e-2 (the attention key biases aside: their gradient is zero in exact arithmetic).
- `bf16`: the same under bf16 autocast with a bf16 copy of the teacher (as the stage trains on a GPU), each path's
  error against the fp32 padded reference. The packed path passes when its error is at most twice the padded
  path's (or 1e-3 for the terms, 1e-2 for the gradient, where the padded path's error is smaller than that).
- `attention_dropout`: with every other dropout of a copy of the student at 0, training mode differs from eval
  mode (the attention's dropout is applied; on CUDA under bf16 autocast, in flash attention's kernel) and draws
  from the global RNG (the same seed gives the same output).
- `host_syncs`: the operations that synchronise the host with the device in one bf16 forward and backward of the
  packed path (`torch.cuda.set_sync_debug_mode("warn")`), with where they come from: none may occur. A read of the
  loss on the host afterwards must be seen as one (`control_syncs`), or the count would prove nothing.
- `compile` (with `--checks ...,compile`): the packed encoders under `torch.compile` (as `train.torch_compile`
  compiles them) against eager on both micro-batches (two token counts), fp32 eval forward, rtol 1e-4 on the last
  hidden state. The compiled training step (bf16, backward) is what `python -m benchmarks.distill_throughput
  --compile` runs.

Each check records its numbers, its tolerance and `passed`; one that raises records the error and the rest still
run, and the JSON is written after each check (a run stopped by a time limit keeps the checks it finished;
`complete` and `passed` stay false and null until every check asked for has run). On CPU
(`--device cpu`, a smoke run of the script with small shapes) the packed attention takes its grid path.

    One GPU, the paper's shape (about a minute):
      python -m benchmarks.cuda_equivalence --out benchmarks/results/cuda_equivalence.json
    torch.compile against eager too (about a minute more on an H200):
      python -m benchmarks.cuda_equivalence --checks fp32,bf16,attention_dropout,host_syncs,compile --out ...
    CPU smoke run:
      .venv/bin/python -m benchmarks.cuda_equivalence --device cpu --teacher-layers 2 --student-layers 1 \
        --hidden 64 --intermediate 128 --heads 4 --seq-len 64 --max-tokens 512 --chunked-loss-rows 128 \
        --packed-multiple 32 --out /tmp/cuda_equivalence_cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import platform
import shlex
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import replace
from pathlib import Path

import torch
import transformers
import yaml

from benchmarks.distill_throughput.cli import add_model_shape_arguments, teacher_and_student
from benchmarks.distill_throughput.workload import BertTokenIds, random_corpus

from pipeline.data.corpus import TokenizedCorpus, token_budget_batches  # noqa: E402
from pipeline.data.mlm_batches import MaskedBatchCollator, pack_masked_batch  # noqa: E402
from pipeline.distillation.packed_encoder import PackedDistilBertEncoder, encoder_inputs  # noqa: E402
from pipeline.distillation.reference_loss import reference_distillation_terms  # noqa: E402
from pipeline.distillation.students import freeze  # noqa: E402
from pipeline.outputs.artifacts import atomic_write_json  # noqa: E402
from pipeline.outputs.machine import cpu_description  # noqa: E402
from pipeline.plan.config import load_config  # noqa: E402
from pipeline.stages.distill_pretrain import distillation_terms, encoders  # noqa: E402
from pipeline.startup import libraries_loaded  # noqa: E402
from pipeline.training.batching import to_device  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SEED = 0
CHECKS = ("fp32", "bf16", "attention_dropout", "host_syncs", "compile")
DEFAULT_CHECKS = CHECKS[:-1]
STUDENT_PERTURBATION = 0.05  # standard deviation of the noise added to the student's initial weights
SYNC_WARNING = "called a synchronizing CUDA operation"
KEY_BIASES = ("k_lin.bias", "attention.self.key.bias")
TOLERANCES = {
    # fp32 on an H200 gave 1e-7 on the terms, 1.1e-6 on the gradient and 3e-4 on its worst parameter.
    "fp32": {"terms_rtol": 1e-5, "gradient_relative_norm_error": 1e-4, "worst_parameter_relative_norm_error": 1e-2},
    "bf16": {"packed_error_at_most_times_padded": 2.0, "terms_floor": 1e-3, "gradient_floor": 1e-2},
    "compile": {"hidden_rtol": 1e-4},
}


def relative_norm_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-30))


def micro_batches(args, dcfg) -> list[dict]:
    """The first micro-batches of the stage's own plan over a random corpus, masked as the stage masks them, each
    padded; the packed form is made from the padded one (pack_masked_batch, as the collator does)."""
    with tempfile.TemporaryDirectory(prefix="cuda_equivalence_") as scratch:
        corpus = TokenizedCorpus(random_corpus(Path(scratch), 40 * args.max_tokens, seed=SEED))
        sequences = corpus.sequences("train", dcfg.max_seq_length)
        plan = token_budget_batches(sequences.sequence_lengths(), args.max_tokens, SEED, 0)
        collate = MaskedBatchCollator(BertTokenIds(), dcfg.mlm_mask_prop)
        generator = torch.Generator().manual_seed(SEED)
        # The second is half of the plan's second micro-batch: fewer tokens, so torch.compile sees another shape.
        chosen = [plan[0], plan[1][: max(1, len(plan[1]) // 2)]]
        batches = [collate([sequences[i] for i in indices], generator) for indices in chosen]
        del corpus, sequences  # the memory-mapped ids close before their folder goes
    return batches


def packed(batch: dict, dcfg) -> dict:
    return pack_masked_batch(batch, BertTokenIds.pad_token_id, dcfg.packed_tokens_multiple_of)


def build_models(args, dcfg, device):
    teacher, student = teacher_and_student(args, dcfg.max_seq_length)
    # Freshly initialised BERT layers are close to the identity, so the student would match its teacher almost
    # exactly (a KL term near 1e-5, all rounding). Moved off the teacher, every term has a size worth comparing.
    generator = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for parameter in student.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * STUDENT_PERTURBATION)
    return student.to(device), freeze(teacher).to(device)  # as the stage: eval mode, no gradients


def terms_and_gradients(student, teacher, batch, dcfg, device, bf16: bool) -> tuple[dict, dict]:
    """The stage's loss on a packed batch, the reference's on a padded one; the terms and every student gradient."""
    student.zero_grad(set_to_none=True)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    loss = distillation_terms if "cu_seqlens" in batch else reference_distillation_terms
    with autocast:
        terms = loss(student, teacher, to_device(batch, device), dcfg)
    terms["loss"].backward()
    values = {name: float(value.detach().float()) for name, value in terms.items()}
    gradients = {name: p.grad.detach().float().clone() for name, p in student.named_parameters() if p.grad is not None}
    return values, gradients


def compare(values, gradients, reference_values, reference_gradients) -> dict:
    names = sorted(reference_gradients)
    flat = torch.cat([gradients[name].flatten() for name in names])
    reference_flat = torch.cat([reference_gradients[name].flatten() for name in names])
    # The attention key bias's gradient is zero in exact arithmetic (each query's softmax ignores a shift shared
    # by all its keys): its relative error would measure rounding alone.
    per_parameter = {name: relative_norm_error(gradients[name], reference_gradients[name]) for name in names
                     if not name.endswith(KEY_BIASES)}
    worst = max(per_parameter, key=per_parameter.get)
    return {
        "terms": values,
        "terms_relative_error": {name: abs(values[name] - reference_values[name]) / max(abs(reference_values[name]),
                                                                                         1e-30)
                                 for name in reference_values},
        "gradient_relative_norm_error": relative_norm_error(flat, reference_flat),
        "worst_parameter": {"name": worst, "relative_norm_error": per_parameter[worst]},
        "parameters_compared": len(names),
    }


def check_fp32(student, teacher, batches, dcfg, device) -> dict:
    student.eval()  # dropout off: both paths compute the same function
    tolerance = TOLERANCES["fp32"]
    results = []
    for batch in batches:
        reference_values, reference_gradients = terms_and_gradients(student, teacher, batch, dcfg, device, False)
        values, gradients = terms_and_gradients(student, teacher, packed(batch, dcfg), dcfg, device, False)
        result = compare(values, gradients, reference_values, reference_gradients)
        result["reference_terms"] = reference_values
        result["passed"] = (
            max(result["terms_relative_error"].values()) <= tolerance["terms_rtol"]
            and result["gradient_relative_norm_error"] <= tolerance["gradient_relative_norm_error"]
            and result["worst_parameter"]["relative_norm_error"] <= tolerance["worst_parameter_relative_norm_error"])
        results.append(result)
    return {"micro_batches": results, "tolerance": tolerance, "passed": all(r["passed"] for r in results)}


def check_bf16(student, teacher, batches, dcfg, device) -> dict:
    student.eval()
    # As the stage: the frozen teacher in bf16 where it trains in bf16 (a copy: the fp32 one stays exact).
    teacher_bf16 = copy.deepcopy(teacher).to(torch.bfloat16)
    tolerance = TOLERANCES["bf16"]
    factor = tolerance["packed_error_at_most_times_padded"]
    results = []
    for batch in batches:
        reference_values, reference_gradients = terms_and_gradients(student, teacher, batch, dcfg, device, False)
        padded_result = compare(*terms_and_gradients(student, teacher_bf16, batch, dcfg, device, True),
                                reference_values, reference_gradients)
        packed_result = compare(*terms_and_gradients(student, teacher_bf16, packed(batch, dcfg), dcfg, device, True),
                                reference_values, reference_gradients)
        terms_ok = all(packed_result["terms_relative_error"][name]
                       <= max(factor * padded_result["terms_relative_error"][name], tolerance["terms_floor"])
                       for name in reference_values)
        gradient_ok = (packed_result["gradient_relative_norm_error"]
                       <= max(factor * padded_result["gradient_relative_norm_error"], tolerance["gradient_floor"]))
        results.append({"fp32_reference_terms": reference_values, "padded_bf16": padded_result,
                        "packed_bf16": packed_result, "passed": terms_ok and gradient_ok})
    return {"micro_batches": results, "tolerance": tolerance, "passed": all(r["passed"] for r in results)}


def check_attention_dropout(student, batch, dcfg, device) -> dict:
    """Every other dropout of a copy of the student set to 0, so training mode differs from eval mode only by the
    attention's; on CUDA under bf16 autocast, where SDPA takes flash attention's kernel as the stage trains."""
    isolated = copy.deepcopy(student)
    for module in isolated.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    student_encoder = PackedDistilBertEncoder(isolated.distilbert)
    inputs = encoder_inputs(to_device(packed(batch, dcfg), device))
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                else contextlib.nullcontext())
    outputs = {}
    with torch.no_grad(), autocast:
        isolated.eval()
        outputs["eval"] = student_encoder(**inputs).last_hidden_state
        isolated.train()
        for name in ("train", "train_again"):
            torch.manual_seed(1)
            outputs[name] = student_encoder(**inputs).last_hidden_state
    differs = relative_norm_error(outputs["train"], outputs["eval"])
    repeats = bool(torch.equal(outputs["train"], outputs["train_again"]))
    return {"attention_dropout": isolated.config.attention_dropout, "other_dropouts": 0.0,
            "precision": "bf16 autocast" if device.type == "cuda" else "fp32",
            "train_vs_eval_relative_norm_difference": differs, "same_seed_same_output": repeats,
            "passed": differs > 0 and repeats}


def recorded_syncs(run) -> tuple[list, list[str]]:
    """The syncs `run()` makes under torch.cuda.set_sync_debug_mode("warn"), and the other warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # PyTorch warns "called a synchronizing CUDA operation" at each sync; its notice that the mode is a prototype
    # (which cannot see every sync) is kept beside the count.
    syncs = [w for w in caught if SYNC_WARNING in str(w.message)]
    return syncs, sorted({str(w.message).splitlines()[0] for w in caught if SYNC_WARNING not in str(w.message)})


def check_host_syncs(student, teacher, batch, dcfg, device) -> dict:
    """One bf16 forward and backward of the packed path (not the optimizer step), then a read of the loss on the
    host: that read must be seen, or the count of the step means nothing."""
    if device.type != "cuda":
        return {"passed": None, "reason": "the sync debug mode reads CUDA synchronisations; none on CPU"}
    device_batch = to_device(packed(batch, dcfg), device)
    teacher_bf16 = copy.deepcopy(teacher).to(torch.bfloat16)
    student.train()
    torch.cuda.synchronize()
    terms = {}

    def forward_and_backward():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            terms.update(distillation_terms(student, teacher_bf16, device_batch, dcfg))
        terms["loss"].backward()

    try:
        syncs, notices = recorded_syncs(forward_and_backward)
        control, _ = recorded_syncs(lambda: terms["loss"].item())
    finally:
        student.eval()
        student.zero_grad(set_to_none=True)
    return {"syncs": len(syncs), "origins": sorted({f"{Path(w.filename).name}:{w.lineno}" for w in syncs}),
            "control_syncs": len(control), "other_warnings": notices,
            "passed": len(syncs) == 0 and len(control) >= 1}


def check_compile(student, teacher, batches, dcfg, device) -> dict:
    student.eval()
    student_encoder, teacher_encoder = encoders(student, teacher)
    result = {"tolerance": TOLERANCES["compile"], "batches": []}
    compiled = {"student": torch.compile(student_encoder), "teacher": torch.compile(teacher_encoder)}
    eager = {"student": student_encoder, "teacher": teacher_encoder}
    passed = True
    for batch in batches:
        inputs = encoder_inputs(to_device(packed(batch, dcfg), device))
        record = {"tokens": int(inputs["input_ids"].shape[0])}
        for name in ("student", "teacher"):
            with torch.no_grad():
                expected = eager[name](**inputs).last_hidden_state
                started = time.perf_counter()
                actual = compiled[name](**inputs).last_hidden_state
                if device.type == "cuda":
                    torch.cuda.synchronize()
                record[f"{name}_seconds"] = round(time.perf_counter() - started, 2)
                error = relative_norm_error(actual, expected)
            record[f"{name}_relative_norm_error"] = error
            passed = passed and error <= TOLERANCES["compile"]["hidden_rtol"]
        result["batches"].append(record)
    result["passed"] = passed
    return result


def run_check(name: str, check, results: dict) -> None:
    started = time.perf_counter()
    try:
        results[name] = check()
    except Exception as error:  # one failing check must not hide the others' numbers
        results[name] = {"passed": False, "error": f"{type(error).__name__}: {error}",
                         "traceback": traceback.format_exc(limit=8)}
    results[name]["seconds"] = round(time.perf_counter() - started, 1)
    print(f"{name}: passed={results[name].get('passed')} ({results[name]['seconds']} s)", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=PROJECT_ROOT / "configs" / "paper.yaml",
                        help="the config whose distill_pretrain is checked (merged over configs/default.yaml)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    add_model_shape_arguments(parser)
    parser.add_argument("--seq-len", type=int, default=None, help="default: the config's max_seq_length")
    parser.add_argument("--max-tokens", type=int, default=16384, help="the micro-batch's token budget")
    parser.add_argument("--chunked-loss-rows", type=int, default=None, help="default: the config's")
    parser.add_argument("--packed-multiple", type=int, default=None, help="default: the config's")
    parser.add_argument("--checks", default=",".join(DEFAULT_CHECKS),
                        help=f"comma-separated, of {', '.join(CHECKS)} (compile takes minutes at the paper's shape)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.checks = [name.strip() for name in args.checks.split(",") if name.strip()]
    unknown = sorted(set(args.checks) - set(CHECKS))
    if unknown:
        parser.error(f"--checks: unknown {', '.join(unknown)} (choose from {', '.join(CHECKS)})")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default, stated: fp32 means fp32 here
    overrides = yaml.safe_load(args.config.read_text()) or {}
    dcfg = load_config(PROJECT_ROOT / "configs" / "default.yaml", overrides).distill_pretrain
    dcfg = replace(dcfg, max_seq_length=args.seq_len or dcfg.max_seq_length,
                   chunked_loss_rows=args.chunked_loss_rows or dcfg.chunked_loss_rows,
                   packed_tokens_multiple_of=args.packed_multiple or dcfg.packed_tokens_multiple_of)
    student, teacher = build_models(args, dcfg, device)
    batches = micro_batches(args, dcfg)
    batch = batches[0]

    results: dict = {}
    record = {
        "benchmark": "distill_pretrain's packed path and chunked loss against the padded path, on the device",
        "command": shlex.join([Path(sys.executable).name, "-m", "benchmarks.cuda_equivalence",
                                *(sys.argv[1:] if argv is None else argv)]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cpu": cpu_description(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "config": str(args.config.relative_to(PROJECT_ROOT) if args.config.is_absolute() else args.config),
        "model_shapes": {"teacher_layers": args.teacher_layers, "student_layers": args.student_layers,
                         "hidden": args.hidden, "intermediate": args.intermediate, "heads": args.heads},
        "micro_batches": [{"sequences": int(b["input_ids"].shape[0]), "longest": int(b["input_ids"].shape[1]),
                           "real_tokens": int(b["attention_mask"].sum()),
                           "masked_tokens": int(b["masked_positions"].numel()),
                           "packed_tokens": int(packed(b, dcfg)["input_ids"].shape[0])} for b in batches],
        "checked_on": "fp32, bf16 and compile: every micro-batch; attention_dropout and host_syncs: the first",
        "chunked_loss_rows": dcfg.chunked_loss_rows,
        "restrict_ce_to_mask": dcfg.restrict_ce_to_mask,
        "tolerances": TOLERANCES,
        "checks_asked": args.checks,
        "checks": results,
    }
    checks = {
        "fp32": lambda: check_fp32(student, teacher, batches, dcfg, device),
        "bf16": lambda: check_bf16(student, teacher, batches, dcfg, device),
        "attention_dropout": lambda: check_attention_dropout(student, batch, dcfg, device),
        "host_syncs": lambda: check_host_syncs(student, teacher, batch, dcfg, device),
        "compile": lambda: check_compile(student, teacher, batches, dcfg, device),
    }
    for name in args.checks:
        run_check(name, checks[name], results)
        # Written after every check: a run stopped by a time limit keeps the checks it finished, and says it is
        # incomplete (passed null) until every check asked for has run.
        record["complete"] = len(results) == len(args.checks)
        failed = any(check.get("passed") is False for check in results.values())
        record["passed"] = False if failed else (True if record["complete"] else None)
        atomic_write_json(args.out, record)
    print(f"wrote {args.out}: passed={record['passed']}")
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    libraries_loaded()  # collection resumes (benchmarks/__init__.py)
    raise SystemExit(main())
