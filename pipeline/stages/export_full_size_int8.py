"""Stage export_full_size_int8: a full-size architecture's int8 graph with the recipe the int8 search chose.

The search (rule int8_search) runs on the full-size DistilBERT; this applies its recipe to another full-size
architecture (BERT-base), through the same recipe builder as export_full_size (pipeline.export.full_size), so
"bert-base/onnx-int8-optimized" is the same int8 path applied to BERT-base. The naive recipe is export_full_size's
own graph, copied. Writes <recipe>/model.onnx (with the fp32 export's config and tokenizer) and
full_size_int8.json (architecture, recipe, path, size).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from pipeline.export import int8
from pipeline.export.full_size import build_int8_recipes
from pipeline.export.onnx_graph import MODEL_FILE
from pipeline.outputs.artifacts import atomic_write_json, directory_size_bytes, megabytes, read_json
from pipeline.outputs.manifests import atomic_output_dir
from pipeline.plan.config import PipelineConfig

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, full_size_dir: Path, choice_path: Path, out_dir: Path) -> dict:
    choice = read_json(choice_path)
    name = choice["recipe"]
    architecture = read_json(full_size_dir / "full_size.json")["architecture"]
    with atomic_output_dir(out_dir, cfg) as tmp:
        if name == int8.NAIVE:
            shutil.copytree(full_size_dir / "onnx" / int8.NAIVE, tmp / int8.NAIVE)
        else:
            recipe = int8.Int8Recipe(**choice["int8_recipe"])
            vocab_size = read_json(full_size_dir / "pytorch" / "config.json")["vocab_size"]
            build_int8_recipes(full_size_dir / "onnx", tmp, {name: recipe}, cfg, vocab_size, graphs_dir=tmp / "graphs")
            shutil.rmtree(tmp / "graphs", ignore_errors=True)  # intermediate fp32 graphs, not outputs
        metrics = {"architecture": architecture, "recipe": name, "int8_recipe": choice["int8_recipe"],
                   "path": f"{name}/{MODEL_FILE}", "size_mb": megabytes(directory_size_bytes(tmp / name / MODEL_FILE))}
        atomic_write_json(tmp / "full_size_int8.json", metrics)
    logger.info("export_full_size_int8: %s", json.dumps(metrics))
    return metrics


# `python -m pipeline export-full-size-int8`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "full_size_dir": "export_full_size's folder",
    "choice_path": "int8_search's choice.json",
}
