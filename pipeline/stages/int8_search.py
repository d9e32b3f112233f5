"""Stage int8_search: the int8 recipe and onnxruntime session options the full-size DistilBERT runs fastest with
(pipeline.export.int8.search_int8), on this machine.

Every int8 recipe of the full-size DistilBERT (export_full_size) that passed its accuracy gates on every trained
model (quantize_onnx) is timed at the longest benchmarked length with 1 thread, in turn; the two fastest are timed
again under each configured session option set (benchmark.session_options), and the fastest pair is the choice
(its runner-up and every timing recorded in int8_search.json), except that the fastest pair with onnxruntime's
default session options is where it is within export.quantize.latency_tie_fraction of that one (the bundle's tie: a
gain within the noise is not worth special options in an app; the choice says what decided it). choice.json holds the chosen
recipe alone: the full-size builds that apply it (export_full_size_int8) read only that file, so a later search that
picks the same recipe rebuilds nothing. The rule takes every core Snakemake has, so nothing runs beside the timed runs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.export.int8 import search_int8
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.plan.config import PipelineConfig

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, root: Path, out_dir: Path) -> dict:
    search = search_int8(root, cfg)
    recipe = search["choice"]["recipe"]
    atomic_write_json(out_dir / "choice.json",
                      {"recipe": recipe, "int8_recipe": search["candidates"][recipe]["recipe"]})
    atomic_write_json(out_dir / "int8_search.json", search)
    logger.info("int8_search: %s", json.dumps(search["choice"]))
    return search


# `python -m pipeline int8-search`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "root": "the pipeline's output root (its full_size/distilbert and quantized/* folders)",
}
