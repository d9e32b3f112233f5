#!/usr/bin/env bash
# Set-up for a fresh machine with Python 3.11: a virtual environment in .venv with the exact,
# locked dependency set. torch goes first, pinned, so that nothing pulls a newer CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
"$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[dev]"
# The JavaScript client (clients/web): its npm packages at the locked versions, where Node.js is installed.
if command -v npm >/dev/null; then
    (cd clients/web && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --loglevel=error)
fi
.venv/bin/python -c "import torch, transformers, snakemake; print('set-up done: torch', torch.__version__, '| transformers', transformers.__version__)"
