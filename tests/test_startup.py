"""pipeline/startup.py: the processes the pipeline starts load transformers without scikit-learn or SciPy, which
stay importable for coremltools."""

import importlib.metadata
import importlib.util
import subprocess
import sys

from tests.paths import PROJECT_ROOT

# Both entry points run as Python runs them (`python -m pipeline`, the benchmark's worker), asked only for their
# help; then a model class is imported as a stage imports it.
ENTRY_POINTS_THEN_A_MODEL = """
import contextlib, runpy, sys
for module in ("pipeline", "pipeline.measurement.workers"):
    sys.argv = [module, "--help"]
    with contextlib.suppress(SystemExit):  # --help ends with sys.exit
        runpy.run_module(module, run_name="__main__")
from transformers import BertForQuestionAnswering
print("sklearn imported:", "sklearn" in sys.modules, "scipy imported:", "scipy" in sys.modules)
import sklearn.cluster, scipy.optimize
print("importable:", sklearn.cluster.KMeans.__name__, scipy.optimize.linear_sum_assignment.__name__)
"""


def test_the_entry_points_load_a_model_without_scikit_learn_or_scipy_which_stay_importable():
    completed = subprocess.run([sys.executable, "-c", ENTRY_POINTS_THEN_A_MODEL], capture_output=True, text=True,
                               cwd=PROJECT_ROOT, check=True)
    assert "sklearn imported: False scipy imported: False" in completed.stdout
    assert "importable: KMeans linear_sum_assignment" in completed.stdout


def source_of(module: str) -> str:
    spec = importlib.util.find_spec(module)
    return spec.loader.get_source(spec.name)


def test_without_the_flags_transformers_would_import_scikit_learn_and_scipy():
    # What makes the flags worth setting: both are installed (coremltools' palettization uses them), and
    # transformers, left to itself, imports them in every model-loading process: scikit-learn's metrics for
    # assisted generation, SciPy's optimizers for the object-detection losses modeling_utils imports.
    assert importlib.metadata.version("scikit-learn") and importlib.metadata.version("scipy")
    assert "if is_sklearn_available():\n    from sklearn.metrics import" in source_of(
        "transformers.generation.candidate_generator")
    assert "if is_scipy_available():\n    from scipy.optimize import" in source_of(
        "transformers.loss.loss_for_object_detection")
    assert "from .loss.loss_utils import" in source_of("transformers.modeling_utils")
    from transformers.utils import import_utils

    # the tests' own process: tests/conftest.py sets them
    assert import_utils.is_sklearn_available() is False and import_utils.is_scipy_available() is False
