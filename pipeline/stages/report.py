"""Stage report: summary.json (schema configs/summary.schema.json), report.md and the plots.

Everything here is read from what the earlier stages measured (benchmark.json, metrics.json, train logs): the
report computes ratios and draws, it measures nothing itself.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.artifacts import atomic_write_json, atomic_write_text, read_json
from pipeline.model_registry import bundled_model, exported_models, trained_models
from pipeline.config import PipelineConfig

logger = logging.getLogger(__name__)

TARGET_SIZE_MB = 207  # DistilBERT on an iPhone 7 Plus (Sanh et al. 2019)
PAPER_CPU_SPEEDUP = 1.6  # "60 % faster" than BERT-base on CPU (Sanh et al. 2019)
SUMMARY_FIELDS = ("name", "model", "format", "precision", "path", "size_mb", "exact_match", "f1", "f1_source",
                  "latency_ms", "untimed_reason", "peak_rss_mb", "recipe", "session_options", "runtime",
                  "runtime_precision")
RANDOM_INIT_ABLATION = "distill_pretrain/random_init_ablation"  # built by target study, not by the default DAG
TRAINING_LOGS = {"teacher_pretrain": "teacher_pretrain", "teacher_finetune": "teacher",
                 "distill_pretrain (main)": "distill_pretrain/main",
                 "distill_pretrain (random init)": RANDOM_INIT_ABLATION,
                 "distill_squad": "distill_squad", "student_finetune": "student_finetune"}
NOT_LOSS_KEYS = {"step", "epoch", "lr", "tokens_per_second", "effective_batch_size", "phase"}


def parameter_count(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    with safe_open(str(model_dir / "model.safetensors"), framework="numpy") as weights:
        for name in weights.keys():
            count = 1
            for dim in weights.get_slice(name).get_shape():
                count *= dim
            total += count
    return total


OPTIMIZED_INT8 = "distilbert/onnx-int8-optimized"  # the search's fastest gate-passing recipe (rule int8_search)


def p50(artifacts: dict, name: str, length: int, threads: int) -> float | None:
    latency = (artifacts.get(name) or {}).get("latency_ms") or {}
    cell = (latency.get(f"seq{length}") or {}).get(f"threads{threads}")
    return cell["p50"] if cell else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator in (None, 0):
        return None
    return round(numerator / denominator, 3)


def summary(cfg: PipelineConfig, root: Path, benchmark: dict) -> dict:
    full_size = set(cfg.export.full_size.architectures)
    items = [{key: item.get(key) for key in SUMMARY_FIELDS} for item in benchmark["artifacts"]]
    by_name = {item["name"]: item for item in items}
    longest = max(cfg.benchmark.sequence_lengths)
    models = {}
    for name, stage in trained_models(cfg).items():  # exported or not (export.models)
        metrics = read_json(root / stage / "metrics.json")
        models[name] = {"params": parameter_count(root / stage), "exact_match": metrics["exact_match"],
                        "f1": metrics["f1"]}
    floor = benchmark.get("gemm_floor")
    model_ms = p50(by_name, OPTIMIZED_INT8, longest, 1)
    ratios = {
        f"distilbert_vs_bert_base_pytorch_fp32_speedup_seq{longest}_threads1":
            ratio(p50(by_name, "bert-base/pytorch-fp32", longest, 1), p50(by_name, "distilbert/pytorch-fp32", longest, 1)),
        f"distilbert_onnx_int8_optimized_vs_bert_base_pytorch_fp32_speedup_seq{longest}_threads1":
            ratio(p50(by_name, "bert-base/pytorch-fp32", longest, 1), model_ms),
        f"distilbert_onnx_int8_optimized_vs_naive_int8_speedup_seq{longest}_threads1":
            ratio(p50(by_name, "distilbert/onnx-int8", longest, 1), model_ms),
        f"bert_base_onnx_int8_optimized_vs_pytorch_fp32_speedup_seq{longest}_threads1":
            ratio(p50(by_name, "bert-base/pytorch-fp32", longest, 1), p50(by_name, "bert-base/onnx-int8-optimized", longest, 1)),
        "target_size_vs_distilbert_onnx_int8": ratio(TARGET_SIZE_MB, (by_name.get(OPTIMIZED_INT8) or {}).get("size_mb")),
        "target_size_vs_distilbert_coreml_4bit": ratio(TARGET_SIZE_MB, (by_name.get("distilbert/coreml-4bit") or {}).get("size_mb")),
        f"target_size_vs_{bundled_model(cfg)}_bundle_onnx": ratio(
            TARGET_SIZE_MB, (by_name.get(f"{bundled_model(cfg)}/ort-int8") or {}).get("size_mb")),
    }
    # The x86 target's recipe at full size (NNCF's int8 on OpenVINO), at each precision: held to the speed goals.
    openvino = [item["name"] for item in items if item["name"].startswith(f"distilbert/{OPENVINO_PEER}-")]
    for name in openvino:
        ratios[f"{name.replace('/', '_').replace('-', '_')}_vs_bert_base_pytorch_fp32_speedup_seq{longest}_threads1"] = \
            ratio(p50(by_name, "bert-base/pytorch-fp32", longest, 1), p50(by_name, name, longest, 1))
    return {
        "target_size_mb": TARGET_SIZE_MB,
        "machine": benchmark["machine"],
        "models": models,
        "artifacts": [item for item in items if item["model"] not in full_size],
        "full_size": [item for item in items if item["model"] in full_size],
        "gemm_floor": None if floor is None else {
            **{k: floor[k] for k in ("sequence_length", "threads", "n_matmul_integer")},
            "latency_ms": floor["latency_ms"]["p50"], "ratio": ratio(model_ms, floor["latency_ms"]["p50"]),
            "openvino": {name: ratio(p50(by_name, name, longest, 1), floor["latency_ms"]["p50"]) for name in openvino},
        },
        "ratios": ratios,
        "peers": peer_comparison(benchmark, cfg),
        "profiles": benchmark.get("profiles") or {},  # per operator at the longest length, 1 thread
        "gates": gate_verdicts(root, cfg),
        "skipped_timings": benchmark.get("skipped_timings", []),
    }


def gate_verdicts(root: Path, cfg: PipelineConfig) -> list[dict]:
    """Every export variant's gate verdicts (value, 95 % interval, threshold, passed), read from export.json,
    quantize.json and coreml.json, and whether the bundle ships it."""
    shipped_model = bundled_model(cfg)
    rows = []
    for model in exported_models(cfg):
        export = read_json(root / "onnx" / model / "export.json")
        for graph in ("fp32", "optimized"):
            rows.append({"model": model, "variant": f"onnx-{graph}", "gates": export[graph].get("gates", {}),
                         "passed": export[graph].get("passed", True), "verdict": export[graph].get("verdict"),
                         "shipped": False,
                         "n_questions": export.get("n_questions")})
        quantized = read_json(root / "quantized" / model / "quantize.json")
        for name, variant in quantized["variants"].items():
            openvino = variant.get("runtime") == "openvino"  # the x86 target: bundled in openvino/ when it passes
            rows.append({"model": model, "variant": name if openvino else f"onnx-{name}", "gates": variant["gates"],
                         "passed": variant["passed"], "verdict": variant.get("verdict"),
                         "fell_back": variant.get("fallback", {}).get("fell_back", []),
                         "shipped": model == shipped_model and (variant["passed"] if openvino
                                                                else name == quantized["bundle_choice"]),
                         "n_questions": quantized.get("n_questions")})
        coreml = read_json(root / "coreml" / model / "coreml.json")
        for name, package in coreml["packages"].items():
            dev = package.get("dev") or {}
            rows.append({"model": model, "variant": f"coreml-{name}", "gates": dev.get("gates", {}),
                         "passed": dev.get("passed", True), "verdict": dev.get("verdict"),
                         "shipped": model == shipped_model and dev.get("passed") is not False,
                         "n_questions": coreml.get("n_questions") if dev else None})
    return rows


def gated_questions(rows: list[dict], dev_questions: int | None) -> str:
    """The dev questions the gates scored, as the exports recorded them: the first export.gates.dev_questions, or
    the whole dev set where it holds fewer (a user's small dev file)."""
    scored = " / ".join(str(n) for n in sorted({row["n_questions"] for row in rows if row.get("n_questions")}))
    if dev_questions is None:
        return f"{scored or 'all'} dev questions (the whole dev set)"
    if not scored or scored == str(dev_questions):
        return f"the first {dev_questions} dev questions (export.gates.dev_questions)"
    return (f"{scored} dev questions (the whole dev set, which holds fewer than export.gates.dev_questions: "
            f"{dev_questions})")


def gate_cell(gate: dict | None) -> str:
    if not gate:
        return ""
    value = gate["value"]
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    if "interval" in gate:
        text += f" [{gate['interval'][0]:.4g}, {gate['interval'][1]:.4g}]"
    bound = gate.get("minimum", gate.get("maximum"))
    sign = ">=" if "minimum" in gate else "<="
    if bound is None:
        return text + " (recorded, not a gate)"
    verdict = gate.get("verdict")
    if verdict == "unproven":
        decide = gate.get("questions_to_decide")
        mark = f" unproven ({decide:,} questions would decide it)" if decide else " unproven (on the threshold)"
    else:
        mark = " **rejected**" if gate["passed"] is False else (f" {verdict}" if verdict else "")
    return f"{text} {sign} {bound:g}{mark}"


def gate_section(rows: list[dict], cfg: PipelineConfig) -> list[str]:
    """One row per export variant: each gate's value, its 95 % interval and threshold, and the verdict."""
    gates = cfg.export.gates
    lines = ["## Gates: what ships", "",
             f"Every export variant against its PyTorch model on {gated_questions(rows, gates.dev_questions)}. "
             "value [95 % interval] threshold: answer agreement by its Wilson interval, F1 drop by a paired "
             "bootstrap over questions. A gate is *rejected* when the value is past the threshold, *proven* when the "
             "whole interval is within it, *unproven* when the value is within it and the interval straddles it "
             "(with the dev questions that would decide it, at the measured spread). A rejected variant is left out "
             "of the bundle and of the full-size int8 search; an unproven one "
             + ("is left out too (export.gates.strict ships proven variants only)." if gates.strict
                else "ships, marked unproven (export.gates.strict ships proven variants only)."), "",
             "| model | variant | answer agreement | F1 drop | logit parity / answerer | verdict |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        found = row["gates"]
        parity = "; ".join(filter(None, (gate_cell(found.get("max_abs_logit_diff")),
                                         gate_cell(found.get("torch_free_answer_agreement")))))
        verdict = (row.get("verdict") or ("rejected" if row["passed"] is False else "passed"))
        verdict = f"**{verdict}**" if verdict == "rejected" else verdict
        if row.get("verdict") == "unproven" and row["passed"] is False:
            verdict += " (not shipped: strict)"
        if row.get("fell_back"):
            verdict += f", {len(row['fell_back'])} layer(s) in fp32"
        verdict += ", **shipped**" if row["shipped"] else ""
        lines.append(f"| {row['model']} | {row['variant']} | {gate_cell(found.get('answer_agreement'))} | "
                     f"{gate_cell(found.get('f1_drop'))} | {parity} | {verdict} |")
    return lines + [""]


def skipped_note(skipped: list[dict]) -> list[str]:
    if not skipped:
        return []
    return ["", "Not timed on this machine: " + "; ".join(f"{item['what']} ({item['reason']})" for item in skipped)
            + "."]


def verdict(peer: dict, ours: dict) -> str:
    """"ahead" when the peer's median is slower than our p90, "behind" when its p90 is faster than our median, and
    "within noise" otherwise: a difference inside the run-to-run spread is not claimed either way."""
    if peer["p50"] > ours["p90"]:
        return "ahead"
    if peer["p90"] < ours["p50"]:
        return "behind"
    return "within noise"


def peer_comparison(benchmark: dict, cfg: PipelineConfig) -> list[dict]:
    """Each peer (rule benchmark's "peer_of" artifacts) beside our int8 graph of the same architecture at every
    length and thread count: both p50 and p90, peer p50 / ours p50 (above 1: ours is faster; sizes likewise) and
    the verdict that the spread allows. The two were timed in one process, in turn by blocks ("in turn"); a pair
    missing from that run falls back to each artifact's own process ("separate processes")."""
    by_name = {item["name"]: item for item in benchmark["artifacts"]}
    rows = []
    for peer in benchmark["artifacts"]:
        if not peer.get("peer_of"):
            continue
        ours = by_name.get(peer["peer_of"]) or {}
        in_turn = peer.get("interleaved_with_ours") or {}
        latency = {}
        for length in cfg.benchmark.sequence_lengths:
            for threads in cfg.benchmark.threads:
                key, count = f"seq{length}", f"threads{threads}"
                pair = (in_turn.get(key) or {}).get(count)
                timing = "in turn"
                if pair is None:
                    pair = {"peer": ((peer.get("latency_ms") or {}).get(key) or {}).get(count),
                            "ours": ((ours.get("latency_ms") or {}).get(key) or {}).get(count)}
                    timing = "separate processes"
                if pair["peer"] and pair["ours"]:
                    latency.setdefault(key, {})[count] = {
                        "peer_p50": pair["peer"]["p50"], "peer_p90": pair["peer"]["p90"],
                        "ours_p50": pair["ours"]["p50"], "ours_p90": pair["ours"]["p90"],
                        "ratio": ratio(pair["peer"]["p50"], pair["ours"]["p50"]),
                        "verdict": verdict(pair["peer"], pair["ours"]), "timing": timing}
        rows.append({"name": peer["name"], "tool": peer["tool"], "ours": peer["peer_of"], "size_mb": peer["size_mb"],
                     "ours_size_mb": ours.get("size_mb"), "size_ratio": ratio(peer["size_mb"], ours.get("size_mb")),
                     "latency": latency})
    return rows


def peer_verdict(row: dict) -> str:
    """One plain sentence: where ours is ahead of this peer beyond the run-to-run spread and by how much, where the
    two are within it, and where ours is behind."""
    points = [(f"seq {key[3:]}, {threads[7:]} thr", cell) for key, by_threads in row["latency"].items()
              for threads, cell in by_threads.items()]
    if not points:
        return f"- {row['name']}: not timed against {row['ours']}."
    parts = []
    for kind, words in (("ahead", "ahead"), ("within noise", "within the run-to-run spread (p50 to p90)"),
                        ("behind", "**behind**")):
        where = [(label, cell["ratio"]) for label, cell in points if cell["verdict"] == kind]
        if where:
            parts.append(f"{words} at {len(where)} of {len(points)} points ("
                         + ", ".join(f"{label}: {r:.2f}x" for label, r in where) + ")")
    size = row["size_ratio"]
    size_text = "" if size is None else f" On disk the peer is {size:.2f}x our size."
    return (f"- {row['name']} ({row['tool']}): {row['ours']} is " + "; ".join(parts)
            + f" (the peer's p50 / ours).{size_text}")


# --------------------------------------------------------------------------------------------------- goals


FLOOR_RATIO_GOAL = 1.35  # the full-size DistilBERT int8 at most this many times its int8 GEMMs alone
SPEEDUP_GOAL = 8.0  # the full-size DistilBERT int8 at least this many times faster than BERT-base PyTorch fp32
OPENVINO_PEER = "openvino-nncf-int8"  # pipeline.export.peers.OPENVINO_PEER (that module imports the export stack)


def goals(summary_data: dict, benchmark: dict, full_size: dict, longest: int) -> list[dict]:
    """The speed and size goals, all measured on the full-size architectures: none without them."""
    if not summary_data["full_size"]:
        return []
    ratios = summary_data["ratios"]
    search = benchmark.get("int8_search") or {}
    chosen = (search.get("choice") or {}).get("recipe", "not searched")
    rows = [
        {"goal": f"distilbert/onnx-int8-optimized ({chosen}) vs bert-base/pytorch-fp32, seq {longest}, 1 thread",
         "target": f">= {SPEEDUP_GOAL:g}x",
         "value": ratios[f"distilbert_onnx_int8_optimized_vs_bert_base_pytorch_fp32_speedup_seq{longest}_threads1"],
         "check": lambda v: v >= SPEEDUP_GOAL, "speed": True},
        {"goal": f"distilbert/onnx-int8-optimized ({chosen}) vs distilbert/onnx-int8 (naive), seq {longest}, 1 thread",
         "target": ">= 1.25x",
         "value": ratios[f"distilbert_onnx_int8_optimized_vs_naive_int8_speedup_seq{longest}_threads1"],
         "check": lambda v: v >= 1.25, "speed": True},
        {"goal": "model latency / GEMM floor (distilbert/onnx-int8-optimized)", "target": f"<= {FLOOR_RATIO_GOAL}",
         "value": (summary_data["gemm_floor"] or {}).get("ratio"), "check": lambda v: v <= FLOOR_RATIO_GOAL,
         "speed": True},
        {"goal": "DistilBERT vs BERT-base, PyTorch fp32 (paper: 1.6x on CPU)", "target": ">= 1.6x",
         "value": ratios[f"distilbert_vs_bert_base_pytorch_fp32_speedup_seq{longest}_threads1"],
         "check": lambda v: v >= PAPER_CPU_SPEEDUP, "speed": False},
    ]
    # The x86 target's recipe at full size (NNCF's int8 on OpenVINO), at each precision, against the same two goals.
    for name, floor_ratio in ((summary_data["gemm_floor"] or {}).get("openvino") or {}).items():
        speedup = ratios.get(f"{name.replace('/', '_').replace('-', '_')}_vs_bert_base_pytorch_fp32_speedup_seq"
                             f"{longest}_threads1")
        rows += [
            {"goal": f"x86 target's recipe: {name} (NNCF int8, OpenVINO) vs bert-base/pytorch-fp32, seq {longest}, "
                     "1 thread", "target": f">= {SPEEDUP_GOAL:g}x", "value": speedup,
             "check": lambda v: v >= SPEEDUP_GOAL, "speed": True},
            {"goal": f"x86 target's recipe: model latency / GEMM floor ({name})", "target": f"<= {FLOOR_RATIO_GOAL}",
             "value": floor_ratio, "check": lambda v: v <= FLOOR_RATIO_GOAL, "speed": True},
        ]
    distilbert = full_size.get("distilbert")
    if distilbert:
        for key, label in (("int8_onnx_mb", "full-size DistilBERT int8 ONNX size (MB)"),
                           ("coreml_4bit_mb", "full-size DistilBERT CoreML 4-bit size (MB)")):
            goal = distilbert["goals"][key]
            rows.append({"goal": label, "target": f"<= {goal['maximum']}", "value": goal["value"],
                         "check": lambda v, limit=goal["maximum"]: v <= limit, "speed": False})
    for row in rows:
        check = row.pop("check")
        row["met"] = None if row["value"] is None else bool(check(row["value"]))
    return rows


# --------------------------------------------------------------------------------------------------- plots


def is_search_recipe(item: dict) -> bool:
    """An int8 search recipe of a trained model: plotted, but unlabelled, so the plot stays readable."""
    return item["format"] == "onnx" and item["precision"].startswith("int8-") and item["precision"] != "int8-optimized"


def point_label(item: dict) -> str:
    """What a plotted point says: its precision; the bundle's .ort says "bundle" (its recipe name is long)."""
    return "bundle" if item["format"] == "ort" else item["precision"]


def plot_accuracy(summary_data: dict, out_dir: Path, length: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [a for a in summary_data["artifacts"] if a["f1"] is not None]
    markers = {"pytorch": "o", "onnx": "s", "ort": "D", "coreml": "^", "openvino": "P"}
    colors = {model: color for model, color in {"student": "tab:blue", "student_ce_only": "tab:orange",
                                                "teacher": "tab:green", "deployed": "tab:purple"}.items()
              if any(item["model"] == model for item in scored)}

    figure, axis = plt.subplots(figsize=(9, 5.5))
    for item in scored:
        axis.scatter(item["size_mb"], item["f1"], marker=markers.get(item["format"], "o"),
                     color=colors.get(item["model"], "grey"), s=45)
        if not is_search_recipe(item):
            axis.annotate(point_label(item), (item["size_mb"], item["f1"]), fontsize=7, xytext=(4, 2),
                          textcoords="offset points")
    axis.axvline(TARGET_SIZE_MB, color="red", linestyle="--")
    axis.text(TARGET_SIZE_MB, axis.get_ylim()[0], " 207 MB (DistilBERT,\n iPhone 7 Plus)", color="red", fontsize=8,
              va="bottom")
    same_size: dict[int, list[dict]] = {}  # full-size artifacts within a few MB share one labelled line
    for item in summary_data["full_size"]:
        if item["model"] == "distilbert":
            same_size.setdefault(round(item["size_mb"] / 5), []).append(item)
    for group in same_size.values():
        size = group[0]["size_mb"]
        axis.axvline(size, color="grey", alpha=0.3, linewidth=1)
        formats_by_precision: dict[str, list[str]] = {}  # one precision's runtimes (onnx, onnx-web, ...) once
        for item in group:
            formats_by_precision.setdefault(item["precision"], []).append(item["format"])
        label = "; ".join(f"{precision} {'/'.join(formats)}" for precision, formats in formats_by_precision.items())
        # Inside the axes, read upwards from their foot and clipped at their top: a long label never squeezes
        # the plot, and its size and first artifacts always show.
        axis.text(size, 0.01, f"{size:.0f} MB: {label}", transform=axis.get_xaxis_transform(), rotation=90,
                  fontsize=6.5, color="dimgrey", va="bottom", ha="right", clip_on=True)
    axis.set_xscale("log")
    axis.set_xlabel("size on disk (MB, log scale); grey lines: full-size DistilBERT artifacts")
    axis.set_ylabel("dev F1")
    axis.set_title("Dev F1 vs size (marker: format; colour: model; unlabelled squares: int8 search recipes)")
    legend_models = [plt.Line2D([], [], color=c, marker="o", linestyle="", label=m) for m, c in colors.items()]
    legend_formats = [plt.Line2D([], [], color="black", marker=m, linestyle="", label=f) for f, m in markers.items()]
    axis.legend(handles=legend_models + legend_formats, fontsize=8, loc="center", bbox_to_anchor=(0.45, 0.5))
    figure.tight_layout()
    figure.savefig(out_dir / "f1_vs_size.png", dpi=120)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(9, 5.5))
    for item in scored:
        cell = ((item["latency_ms"] or {}).get(f"seq{length}") or {}).get("threads1")
        if not cell:
            continue
        axis.scatter(cell["p50"], item["f1"], marker=markers.get(item["format"], "o"),
                     color=colors.get(item["model"], "grey"), s=45)
        if not is_search_recipe(item):
            axis.annotate(point_label(item), (cell["p50"], item["f1"]), fontsize=7, xytext=(4, 2),
                          textcoords="offset points")
    axis.set_xlabel(f"latency p50 (ms), batch 1, {length} tokens, 1 thread")
    axis.set_ylabel("dev F1")
    axis.set_title(f"Dev F1 vs latency on {summary_data['machine']['cpu']} (CoreML not timed on Linux)\n"
                   "unlabelled squares: the int8 search recipes (report.md names each)", fontsize=10)
    axis.legend(handles=legend_models + legend_formats[:3], fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(out_dir / "f1_vs_latency.png", dpi=120)
    plt.close(figure)


def loss_terms(records: list[dict]) -> list[str]:
    """The loss terms of a train_log.jsonl: its numeric keys other than step, lr, throughput and the like."""
    return sorted({key for record in records for key, value in record.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)} - NOT_LOSS_KEYS)


def plot_losses(root: Path, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The random-init ablation's panel appears once target study has built it.
    stages = {title: stage for title, stage in TRAINING_LOGS.items()
              if stage != RANDOM_INIT_ABLATION or (root / stage / "train_log.jsonl").is_file()}
    figure, axes = plt.subplots(2, 3, figsize=(13, 7))
    for axis in list(axes.flat)[len(stages):]:
        axis.set_visible(False)
    for axis, (title, stage) in zip(axes.flat, stages.items()):
        log = root / stage / "train_log.jsonl"
        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.is_file() else []
        terms = loss_terms(records)
        for term in terms:
            axis.plot([r["step"] for r in records if term in r], [r[term] for r in records if term in r],
                      label=term, linewidth=1.2)
        # distill_squad's phases (TinyBERT's intermediate layers, then the prediction layer): where one ends.
        for before, after in zip(records, records[1:]):
            if before.get("phase") != after.get("phase"):
                axis.axvline(after["step"], color="grey", linestyle=":", linewidth=1)
                axis.text(after["step"], 0.98, f" {after['phase']}", transform=axis.get_xaxis_transform(),
                          fontsize=7, color="grey", va="top")
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("optimizer step", fontsize=8)
        axis.set_yscale("log")
        if terms:
            axis.legend(fontsize=7)
        else:
            axis.text(0.5, 0.5, "no training log", ha="center", transform=axis.transAxes)
    figure.suptitle("Training loss terms (log scale)")
    figure.tight_layout()
    figure.savefig(out_dir / "loss_curves.png", dpi=110)
    plt.close(figure)


# -------------------------------------------------------------------------------------------------- report


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def latency_text(item: dict, length: int, threads: int) -> str:
    if item["latency_ms"] is None:
        return "n/a"
    cell = (item["latency_ms"].get(f"seq{length}") or {}).get(f"threads{threads}")
    return f"{cell['p50']:.2f} / {cell['p90']:.2f}" if cell else "n/a"


def timed_threads(items: list[dict], cfg: PipelineConfig) -> list[int]:
    """The thread counts of the table's columns: the benchmark's, and any other an entry was timed at (Chromium's
    benchmark.browser_threads)."""
    found = {int(threads.removeprefix("threads")) for item in items for cell in (item["latency_ms"] or {}).values()
             for threads in (cell or {})}
    return sorted(found | set(cfg.benchmark.threads))


def artifact_table(items: list[dict], cfg: PipelineConfig) -> str:
    lengths, threads = cfg.benchmark.sequence_lengths, timed_threads(items, cfg)
    columns = [f"seq {n}, {t} thr p50 / p90 ms" for n in lengths for t in threads]
    lines = ["| artifact | MB | EM | F1 | F1 from | " + " | ".join(columns) + " | peak RSS MB |",
             "|---|---|---|---|---|" + "---|" * len(columns) + "---|"]
    for item in items:
        cells = [latency_text(item, n, t) for n in lengths for t in threads]
        lines.append(f"| {item['name']} | {fmt(item['size_mb'], 3)} | {fmt(item['exact_match'])} | {fmt(item['f1'])} | "
                     f"{item['f1_source'] or '—'} | " + " | ".join(cells) + f" | {fmt(item['peak_rss_mb'], 0)} |")
    return "\n".join(lines)


RUNTIME_FUSED_OPS = ("SkipLayerNormalization", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "BiasGelu", "Gelu",
                     "FastGelu", "EmbedLayerNormalization")


def speed_analysis(profiles: dict, floor: dict | None) -> list[str]:
    """What the profiles say about the missed speed goals, in numbers (nothing here is assumed)."""
    naive = {op["op"]: op for op in profiles.get("distilbert/onnx-int8", [])}
    fused = {op["op"]: op for op in profiles.get("distilbert/onnx-int8-optimized", [])}
    lines = []
    runtime_fused = [op for op in RUNTIME_FUSED_OPS if op in naive]
    if runtime_fused:
        lines.append(f"- The naive int8 graph already runs fused kernels ({', '.join(runtime_fused)}): onnxruntime "
                     "fuses a graph itself when it loads it, so the offline transformer optimizer adds mainly the "
                     "attention fusion.")
    if "QAttention" in fused and "MatMul" in naive:
        lines.append(f"- Attention: the fused graph's QAttention (input projections and scores) takes "
                     f"{fused['QAttention']['ms_per_run']:.1f} ms per run; the naive graph spends "
                     f"{naive['MatMul']['ms_per_run']:.1f} ms in float MatMuls (the attention scores) plus its share of "
                     f"the int8 projections. Fusing attention moves work rather than removing it on this CPU.")
    if "MatMul" in naive and "MatMul" not in fused:
        lines.append(f"- The chosen graph runs attention's two products in int8 as well; in the naive graph they are "
                     f"float MatMuls taking {naive['MatMul']['ms_per_run']:.1f} ms per run.")
    chosen = profiles.get("distilbert/onnx-int8-optimized", [])
    if floor and floor.get("ratio") and chosen:
        gemm_ops = ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger", "QAttention", "QLinearMatMul")
        rest = [op for op in chosen if op["op"] not in gemm_ops][:4]
        lines.append(f"- The int8 GEMMs alone take {floor['latency_ms']:.1f} ms; the model takes {floor['ratio']:.2f}x "
                     "that. The largest other operators in its profile: "
                     + ", ".join(f"{op['op']} {op['ms_per_run']:.1f} ms" for op in rest)
                     + " (activation quantization is part of DynamicQuantizeMatMul's time).")
    lines += openvino_analysis(profiles)
    return lines


# What each runtime's profile calls the same work: int8 GEMMs, layer norms, and attention with its elementwise
# neighbours (OpenVINO fuses those into "Subgraph" kernels). A profile holds its 10 largest rows; an OpenVINO row
# is "<layer type> (<kernel>)".
ORT_KINDS = {"int8 GEMMs": ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger", "QAttention",
                            "QLinearMatMul", "QGemm"),
             "layer norms": ("SkipLayerNormalization", "LayerNormalization", "EmbedLayerNormalization",
                             "QEmbedLayerNormalization"),
             "attention and elementwise": ("MatMul", "FusedMatMul", "Softmax", "Add", "Gelu", "BiasGelu", "FastGelu",
                                           "Transpose", "Mul", "QuantizeLinear", "DequantizeLinear",
                                           "DynamicQuantizeLinear")}
OPENVINO_KINDS = {"int8 GEMMs": ("FullyConnected", "FullyConnectedQuantizedLegacy"), "layer norms": ("MVN",),
                  "attention and elementwise": ("Subgraph", "Transpose", "Multiply", "Add", "Subtract", "Softmax",
                                                "MatMul", "Convert")}


def kind_times(profile: list[dict], kinds: dict[str, tuple[str, ...]]) -> dict[str, float]:
    """ms per run of each kind of work in a profile, and "other": the profile's total (its rows hold their share of
    it) less the kinds."""
    times = {kind: sum(row["ms_per_run"] for row in profile if row["op"].split(" (")[0] in ops)
             for kind, ops in kinds.items()}
    total = max((row["ms_per_run"] / row["share"] for row in profile if row["share"]), default=0.0)
    times["other"] = max(total - sum(times.values()), 0.0)
    return times


def openvino_analysis(profiles: dict) -> list[str]:
    """Where OpenVINO's kernels win: its profile of each OpenVINO entry beside onnxruntime's of our chosen graph,
    by kind of work."""
    ours = profiles.get("distilbert/onnx-int8-optimized")
    if not ours:
        return []
    ours_times = kind_times(ours, ORT_KINDS)
    lines = []
    for name, profile in profiles.items():
        if "/openvino-" in name:
            theirs = kind_times(profile, OPENVINO_KINDS)
            lines.append(f"- {name} against onnxruntime on distilbert/onnx-int8-optimized, ms per run: "
                         + "; ".join(f"{kind} {theirs[kind]:.1f} vs {ours_times[kind]:.1f}" for kind in ours_times)
                         + ".")
    return lines


def search_section(search: dict) -> list[str]:
    """The int8 search: every candidate's timing, the session options tried, the choice and its runner-up."""
    choice, runner_up = search["choice"], search["runner_up"]
    lines = ["## int8 search (full-size DistilBERT)", "",
             f"Every int8 recipe that passed its accuracy gates on every exported model, timed round-robin at seq "
             f"{search['sequence_length']}, {search['threads']} thread, {search['runs']} runs each; the two fastest "
             "again under each session option set.", "",
             "| recipe | graph | format | weight scales | attention MatMuls | p50 ms | p90 ms |",
             "|---|---|---|---|---|---|---|"]
    ranked = sorted(search["candidates"].items(), key=lambda item: item[1]["latency_ms"]["p50"])
    for name, candidate in ranked:
        recipe = candidate["recipe"]
        lines.append(f"| {name} | {recipe['graph']} | {recipe['format']} | "
                     f"{'per channel' if recipe['per_channel'] else 'per tensor'} | "
                     f"{'int8' if recipe['attention_int8'] else 'fp32'} | {candidate['latency_ms']['p50']:.1f} | "
                     f"{candidate['latency_ms']['p90']:.1f} |")
    lines += ["", "| recipe | session options | p50 ms | p90 ms |", "|---|---|---|---|"]
    for entry in sorted(search["session_options"].values(), key=lambda e: e["latency_ms"]["p50"]):
        lines.append(f"| {entry['recipe']} | {entry['session_options']} | {entry['latency_ms']['p50']:.1f} | "
                     f"{entry['latency_ms']['p90']:.1f} |")
    lines += ["", f"Chosen: **{choice['recipe']}** with session options '{choice['session_options']}' "
                  f"(p50 {choice['latency_ms']['p50']:.1f} ms)."]
    if runner_up:
        lines.append(f"Runner-up: {runner_up['recipe']} with '{runner_up['session_options']}' "
                     f"(p50 {runner_up['latency_ms']['p50']:.1f} ms).")
    if search["rejected_by_gates"]:
        rejected = "; ".join(f"{name} (failed on {', '.join(m for m, ok in verdicts.items() if ok is False)})"
                             for name, verdicts in search["rejected_by_gates"].items())
        lines.append(f"Left out by the accuracy gates: {rejected}.")
    return lines + [""]


def peer_section(rows: list[dict], cfg: PipelineConfig, skipped: dict[str, str] | None = None,
                 settings: dict | None = None) -> list[str]:
    """The peers' table and one sentence per peer; `settings`: the benchmark's, for how the pairs were timed."""
    lengths, threads = cfg.benchmark.sequence_lengths, cfg.benchmark.threads
    settings = settings or {}
    if "in_turn_block_runs" in settings:
        how = (f"At every thread count the two are timed in one process, in turn by blocks of "
               f"{settings['in_turn_block_runs']} runs ({cfg.benchmark.runs} runs each), each block after a "
               f"{settings['in_turn_settle_s']} s pause and one untimed run: a drift in machine speed hits both alike, "
               "and one runtime's threads, still spinning after its run, do not take the cores of the other. A cell "
               "marked 'separate' comes from each artifact's own process instead.")
    else:  # a benchmark.json from before the timing by blocks
        how = ("With 1 thread the two are timed in one process, run for run in turn; the cells marked 'separate' "
               "come from each artifact's own process, as in the full-size table above.")
    columns = [f"seq {n}, {t} thr" for n in lengths for t in threads]
    lines = ["## Peers: the int8 paths a user would otherwise pick, timed in the same run", "",
             "Each cell: the peer's p50 ms / ours (the same architecture's onnx-int8-optimized, with the session "
             "options the int8 search chose; the ORTQuantizer peer runs with onnxruntime's defaults, as its users "
             "get it) p50 ms = ratio (above 1: ours is faster), and the verdict: ahead when the peer's p50 is above "
             f"our p90, behind when its p90 is below our p50, else within the run-to-run spread. {how} The OpenVINO "
             "rows run at precision f32 or at the runtime's default for what is not int8 (the resolved precision is "
             "each entry's runtime_precision in summary.json).", "",
             "| peer | vs | MB (peer / ours) | " + " | ".join(columns) + " |",
             "|---|---|---|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for n in lengths:
            for t in threads:
                cell = (row["latency"].get(f"seq{n}") or {}).get(f"threads{t}")
                separate = ", separate" if cell and cell["timing"] == "separate processes" else ""
                cells.append("n/a" if cell is None else f"{cell['peer_p50']:.1f} / {cell['ours_p50']:.1f} = "
                                                        f"{cell['ratio']:.2f}x, {cell['verdict']}{separate}")
        lines.append(f"| {row['name']} | {row['ours']} | {fmt(row['size_mb'], 1)} / {fmt(row['ours_size_mb'], 1)} | "
                     + " | ".join(cells) + " |")
    lines += [""] + [peer_verdict(row) for row in rows]
    lines += [f"- {name}: not built on this machine: {reason}." for name, reason in (skipped or {}).items()]
    return lines + [""]


def javascript_note(summary_data: dict, cfg: PipelineConfig) -> list[str]:
    """Where the JavaScript rows (rule benchmark_web) were timed; nothing when there are none."""
    javascript = [item for item in summary_data["artifacts"] + summary_data["full_size"] if item["runtime"]]
    if not javascript:
        return []
    runtimes = {item["format"]: item["runtime"] for item in javascript}
    text = "JavaScript rows: " + "; ".join(f"{fmt} in {runtime}" for fmt, runtime in runtimes.items()) + "."
    text += " Node: 1 thread."
    if "onnx-web-chromium" in runtimes:
        text += (f" Chromium: WebAssembly threads {', '.join(map(str, cfg.benchmark.browser_threads))}; its peak "
                 "memory is the page's renderer process.")
    if any(item["model"] not in exported_models(cfg) for item in javascript):
        text += f" The full-size graph: {cfg.benchmark.javascript_full_size_runs} timed runs."
    return ["", text]


def report_markdown(cfg: PipelineConfig, summary_data: dict, benchmark: dict, goal_rows: list[dict]) -> str:
    machine = summary_data["machine"]
    longest = max(cfg.benchmark.sequence_lengths)
    title = (f"# {cfg.deploy.model}, deployed as it is: what was built and how it measures" if cfg.deploy.model
             else "# DistilBERT question answering: what was built and how it measures")
    lines = [
        title,
        "",
        f"Machine: **{machine['cpu']}**, {machine['cores']} cores; SIMD flags: {', '.join(machine.get('cpu_flags', []))}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in machine["versions"].items()) + ".",
        f"Latency: batch 1, every token attended, p50 / p90 over {cfg.benchmark.runs} timed runs after "
        f"{cfg.benchmark.warmup} warm-up runs, threads pinned in onnxruntime and torch; one process per artifact (its "
        "peak resident memory is the last column). Sizes in MB = 10^6 bytes. 'n/a': the model has fewer positions than "
        "the length, or it cannot be timed here (CoreML runs only on macOS; some full-size artifacts are sized only, "
        "see benchmark.timed_full_size).",
        *javascript_note(summary_data, cfg),
        *skipped_note(summary_data["skipped_timings"]),
        "",
        "## Models",
        "",
        "| model | parameters | dev EM | dev F1 |",
        "|---|---|---|---|",
    ]
    for name, model in summary_data["models"].items():
        lines.append(f"| {name} | {model['params']:,} | {model['exact_match']:.2f} | {model['f1']:.2f} |")
    not_exported = [name for name in summary_data["models"] if name not in exported_models(cfg)]
    if not_exported:
        lines += ["", f"Not exported (export.models): {', '.join(not_exported)}; trained and scored above only."]
    which = "the deployed model" if cfg.deploy.model else "the trained models"
    lines += ["", f"## Artifacts of {which}", "", artifact_table(summary_data["artifacts"], cfg), "",
              "CoreML F1 is that of the PyTorch-side compressed proxy run in float16 ('pytorch-proxy'). "
              + ("PyTorch rows score the whole dev set; export rows score "
                 f"{gated_questions(summary_data['gates'], cfg.export.gates.dev_questions)}, on which the PyTorch "
                 "models score as in each export's export.json." if cfg.export.gates.dev_questions else ""),
              "",
              "![F1 vs size](f1_vs_size.png)", "", "![F1 vs latency](f1_vs_latency.png)", ""]
    lines += gate_section(summary_data["gates"], cfg)
    if summary_data["full_size"]:
        lines += ["## Full-size architectures (random weights: sizes and speed only)", "",
                  artifact_table(summary_data["full_size"], cfg), "",
                  "| ratio | value |", "|---|---|"]
        lines += [f"| {name} | {fmt(value, 3)} |" for name, value in summary_data["ratios"].items()]
        if summary_data["gemm_floor"]:
            floor = summary_data["gemm_floor"]
            lines += ["", f"GEMM floor: the {floor['n_matmul_integer']} int8 MatMuls of full-size DistilBERT alone, "
                          f"seq {floor['sequence_length']}, 1 thread: {floor['latency_ms']:.1f} ms; "
                          f"distilbert/onnx-int8-optimized / floor = {fmt(floor['ratio'], 2)}."]
        lines.append("")
    if summary_data["peers"] or benchmark.get("peers_skipped"):
        lines += peer_section(summary_data["peers"], cfg, benchmark.get("peers_skipped"), benchmark.get("settings"))
    if benchmark.get("int8_search"):
        lines += search_section(benchmark["int8_search"])
    lines += ["## Goals", ""]
    if goal_rows:
        lines += ["| goal | target | measured | met |", "|---|---|---|---|"]
    else:
        lines.append("The speed and size goals are measured on the full-size architectures; "
                     "export.full_size.architectures is empty in this build, so none was measured.")
    for row in goal_rows:
        met = "n/a" if row["met"] is None else ("yes" if row["met"] else "**no**")
        lines.append(f"| {row['goal']} | {row['target']} | {fmt(row['value'], 2)} | {met} |")
    missed_speed = [row for row in goal_rows if row["speed"] and row["met"] is False]
    if missed_speed and benchmark.get("profiles"):
        lines += ["", f"Speed goals missed. Where the time goes (onnxruntime's profiler, OpenVINO's performance "
                      f"counters for its rows; seq {longest}, 1 thread, share of kernel time):", ""]
        for name, ops in benchmark["profiles"].items():
            lines.append(f"- {name}: " + ", ".join(f"{o['op']} {o['share']:.0%} ({o['ms_per_run']:.1f} ms)"
                                                    for o in ops[:6]))
        lines += [""] + speed_analysis(benchmark["profiles"], summary_data["gemm_floor"])
    if not cfg.deploy.model:  # a deployed model was trained elsewhere: no training logs here
        lines += ["", "## Training", "", "![Loss curves](loss_curves.png)", ""]
    return "\n".join(lines)


def with_web_timings(benchmark: dict, web_benchmark_path: Path | None) -> dict:
    """The benchmark's artifacts plus the JavaScript runtimes' entries (rule benchmark_web), in the same shape;
    they are timed, not scored, so their accuracy fields are null (the client's answers match onnxruntime's)."""
    if web_benchmark_path is None:
        return benchmark
    web = read_json(web_benchmark_path)
    extra = [{**{key: None for key in SUMMARY_FIELDS}, **{k: v for k, v in item.items() if k in SUMMARY_FIELDS}}
             for item in web["artifacts"]]
    return {**benchmark, "artifacts": benchmark["artifacts"] + extra,
            "skipped_timings": benchmark.get("skipped_timings", []) + web.get("skipped", [])}


def run(cfg: PipelineConfig, root: Path, benchmark: Path, out_dir: Path, web_benchmark: Path | None = None) -> dict:
    """The report from rule benchmark's benchmark.json (`benchmark`) and rule benchmark_web's JSON (`web_benchmark`,
    when the JavaScript timings ran)."""
    import jsonschema

    measured = with_web_timings(read_json(benchmark), web_benchmark)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_data = summary(cfg, root, measured)
    schema = read_json(Path(__file__).resolve().parents[2] / "configs" / "summary.schema.json")
    jsonschema.validate(summary_data, schema)  # other tools read this file: never write one off its schema
    full_size = {a: read_json(root / "full_size" / a / "full_size.json") for a in cfg.export.full_size.architectures}
    longest = max(cfg.benchmark.sequence_lengths)
    goal_rows = goals(summary_data, measured, full_size, longest)
    plot_accuracy(summary_data, out_dir, min(cfg.benchmark.sequence_lengths))
    if not cfg.deploy.model:
        plot_losses(root, out_dir)
    atomic_write_text(out_dir / "report.md", report_markdown(cfg, summary_data, measured, goal_rows))
    atomic_write_json(out_dir / "summary.json", summary_data)  # last: its presence means the report is complete
    return summary_data


# `python -m pipeline report`: run()'s parameters as flags (pipeline/stage_cli.py), with this help.
FLAG_HELP = {
    "root": "the pipeline's output root (artifacts/)",
    "benchmark": "benchmark.json of rule benchmark",
    "web_benchmark": "benchmark_web.json of rule benchmark_web (optional)",
}
