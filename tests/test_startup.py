"""pipeline/startup.py: the processes the pipeline starts load transformers without scikit-learn, which stays
importable for coremltools."""

import importlib.metadata
import importlib.util
import subprocess
import sys

from tests.conftest import PROJECT_ROOT

# Both entry points run as Python runs them (`python -m pipeline`, the benchmark's worker), asked only for their
# help; then a model class is imported as a stage imports it.
ENTRY_POINTS_THEN_A_MODEL = """
import contextlib, runpy, sys
for module in ("pipeline", "pipeline.stages.benchmark"):
    sys.argv = [module, "--help"]
    with contextlib.suppress(SystemExit):  # --help ends with sys.exit
        runpy.run_module(module, run_name="__main__")
from transformers import BertForQuestionAnswering
print("sklearn imported:", "sklearn" in sys.modules)
import sklearn.cluster
print("sklearn.cluster:", sklearn.cluster.KMeans.__name__)
"""


def test_the_entry_points_load_a_model_without_scikit_learn_which_stays_importable():
    completed = subprocess.run([sys.executable, "-c", ENTRY_POINTS_THEN_A_MODEL], capture_output=True, text=True,
                               cwd=PROJECT_ROOT, check=True)
    assert "sklearn imported: False" in completed.stdout and "sklearn.cluster: KMeans" in completed.stdout


def test_without_the_flag_transformers_would_import_scikit_learn():
    # What makes the flag worth setting: scikit-learn is installed (coremltools' palettization uses it), and
    # transformers, left to itself, imports its metrics in every model-loading process.
    assert importlib.util.find_spec("sklearn") is not None and importlib.metadata.version("scikit-learn")
    generation = importlib.util.find_spec("transformers.generation.candidate_generator")
    source = generation.loader.get_source(generation.name)
    assert "if is_sklearn_available():\n    from sklearn.metrics import" in source
    from transformers.utils import import_utils

    assert import_utils.is_sklearn_available() is False  # the tests' own process: tests/conftest.py sets it
