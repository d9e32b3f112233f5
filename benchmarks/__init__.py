"""Benchmarks and evidence scripts, run as modules from the project root: `python -m benchmarks.<name>`. They
import each other (and `pipeline`) as packages, so tests import them as any module.

Every script's process is prepared as the pipeline's are (pipeline/startup.py): this package is imported before any
script's own imports, so the settings reach transformers and OpenVINO however a script imports them.
"""

from pipeline.startup import prepare_process

prepare_process()
