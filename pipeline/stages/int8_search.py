"""Stage int8_search: the int8 recipe and onnxruntime session options the full-size DistilBERT runs fastest with
(pipeline.export.int8.search_int8), on this machine.

Every int8 recipe of the full-size DistilBERT (export_full_size) that passed its accuracy gates on every trained
model (quantize_onnx) is timed at the longest benchmarked length with 1 thread, in turn; the two fastest are timed
again under each configured session option set (benchmark.session_options), and the fastest pair is the choice
(its runner-up and every timing recorded in int8_search.json). choice.json holds the chosen recipe alone: the
full-size builds that apply it (export_full_size_int8) read only that file, so a later search that picks the same
recipe rebuilds nothing. The rule takes every core Snakemake has, so nothing runs beside the timed runs.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from pipeline.artifacts import atomic_write_json, setup_logging
from pipeline.config import PipelineConfig, config_from_json
from pipeline.export.int8 import search_int8

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, root: Path, out_dir: Path) -> dict:
    search = search_int8(root, cfg)
    recipe = search["choice"]["recipe"]
    atomic_write_json(out_dir / "choice.json",
                      {"recipe": recipe, "int8_recipe": search["candidates"][recipe]["recipe"]})
    atomic_write_json(out_dir / "int8_search.json", search)
    logger.info("int8_search: %s", json.dumps(search["choice"]))
    return search


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline int8-search", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--root", required=True, type=Path,
                        help="the pipeline's output root (its full_size/distilbert and quantized/* folders)")
    parser.add_argument("--out-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    setup_logging()
    run(config_from_json(args.config_json), args.root, args.out_dir)
    return 0
