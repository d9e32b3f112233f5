"""The report's plots: F1 against size and against latency, and the training loss curves."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.reporting.summary import TARGET_SIZE_MB

RANDOM_INIT_ABLATION = "distill_pretrain/random_init_ablation"  # built by target study, not by the default DAG


TRAINING_LOGS = {"teacher_pretrain": "teacher_pretrain", "teacher_finetune": "teacher",
                 "distill_pretrain (main)": "distill_pretrain/main",
                 "distill_pretrain (random init)": RANDOM_INIT_ABLATION,
                 "distill_squad": "distill_squad", "student_finetune": "student_finetune"}


NOT_LOSS_KEYS = {"step", "epoch", "lr", "tokens_per_second", "effective_batch_size", "phase"}


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
    timed_formats = [handle for handle in legend_formats if handle.get_label() != "coreml"]  # timed on macOS only
    axis.legend(handles=legend_models + timed_formats, fontsize=8, loc="lower right")
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
