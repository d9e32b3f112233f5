"""Logging of every command: to stderr, which each Snakemake rule redirects to its log file.
"""

from __future__ import annotations

import logging
import os

# Library loggers whose INFO lines say nothing a user acts on: coremltools logs every op it converts and every pass it
# runs, and its PyTorch-side compression every layer it clusters (about 2,400 lines of a CoreML export of the default
# student, 8,000 of the full-size DistilBERT's). Their warnings and errors still reach the log.
QUIET_LOGGERS = ("coremltools", "coremltools.optimize.torch")
# coremltools.optimize.torch sets its logger's level from this variable when it is imported (a user's value is kept)
COREMLTOOLS_OPTIMIZE_LEVEL = "COREMLTOOLS_OPTIMIZE_TORCH_LOG_LEVEL"


def setup_logging() -> None:
    """Stage logs go to stderr, which each Snakemake rule redirects to its `log:` file."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    os.environ.setdefault(COREMLTOOLS_OPTIMIZE_LEVEL, "warning")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
