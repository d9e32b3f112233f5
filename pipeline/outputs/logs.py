"""Logging of every command: to stderr, which each Snakemake rule redirects to its log file.
"""

from __future__ import annotations

import logging


def setup_logging() -> None:
    """Stage logs go to stderr, which each Snakemake rule redirects to its `log:` file."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
