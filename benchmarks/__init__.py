"""Benchmarks and evidence scripts, run as modules from the project root: `python -m benchmarks.<name>`. They
import each other (and `pipeline`) as packages, so tests import them as any module.

Every script's process is prepared as the pipeline's are (pipeline/startup.py): this package is imported before any
script's own imports, so the settings reach transformers and OpenVINO however a script imports them; and where it is
imported to run a script (`python -m` sets sys.argv[0] to "-m" while it locates the module), garbage collection
waits until the script's libraries are loaded: each script's __main__ block resumes it (libraries_loaded).
"""

import sys

from pipeline.startup import pause_collection_while_loading, prepare_process

prepare_process()
if sys.argv[0] == "-m":  # a process of its own, about to run a script; not a test or another module importing one
    pause_collection_while_loading()
