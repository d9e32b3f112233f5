"""Stage report: summary.json (schema configs/summary.schema.json), report.md and the plots.

Everything here is read from what the earlier stages measured (benchmark.json, metrics.json, train logs): the
report computes ratios and draws, it measures nothing itself (pipeline/reporting/: summary, markdown, plots).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.outputs.artifacts import atomic_write_json, atomic_write_text, read_json
from pipeline.plan.config import PipelineConfig
from pipeline.reporting.markdown import report_markdown
from pipeline.reporting.plots import plot_accuracy, plot_losses
from pipeline.reporting.summary import goals, summary, with_web_timings


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


# `python -m pipeline report`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "root": "the pipeline's output root (artifacts/)",
    "benchmark": "benchmark.json of rule benchmark",
    "web_benchmark": "benchmark_web.json of rule benchmark_web (optional)",
}
