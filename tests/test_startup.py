"""pipeline/startup.py: the processes the pipeline starts load transformers without scikit-learn or SciPy, which
stay importable for coremltools, and send OpenVINO's usage telemetry only where the user opted in."""

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.spawn import in_spawned_process
from tests.paths import PROJECT_ROOT

# The benchmarks package (`python -m benchmarks.<name>` imports it before the script) prepares its process: checked,
# then undone, as it imports no library. Both entry points then run as Python runs them (`python -m pipeline`, the
# benchmark's worker), asked only for their help; then a model class is imported as a stage imports it.
ENTRY_POINTS_THEN_A_MODEL = """
import contextlib, runpy, sys
import benchmarks
from pipeline.startup import _SettingsAppliedOnLoad
prepared = [finder for finder in sys.meta_path if isinstance(finder, _SettingsAppliedOnLoad)]
print("benchmarks prepared:", bool(prepared), "libraries loaded:", "transformers" in sys.modules)
sys.meta_path[:] = [finder for finder in sys.meta_path if finder not in prepared]
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
    assert "benchmarks prepared: True libraries loaded: False" in completed.stdout
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


# What NNCF and openvino.convert_model build before each report: consent read from the user's consent file, and
# the events it would send. The sender is the library's own (a new process per event); each one started is counted.
TELEMETRY_CONSENT = """
import json, multiprocessing, sys
started = []
multiprocessing.Process.start = lambda process: started.append(process)
if sys.argv[1] == "prepared":
    from pipeline.startup import prepare_process
    prepare_process()
from openvino_telemetry import Telemetry
telemetry = Telemetry(app_name="nncf", app_version="0", tid="G-TEST", backend="ga4", enable_opt_in_dialog=False,
                      disable_in_ci=True)
telemetry.send_event("quantize", "test", "label")
print(json.dumps({"consent": telemetry.consent, "processes_started": len(started)}))
"""


def telemetry_in_a_process(home: Path, prepared: bool) -> dict:
    # outside any CI: the library declines in CI by itself (its CI variables), which would hide what is tested
    env = {key: value for key, value in os.environ.items() if key not in ("CI", "TF_BUILD", "JENKINS_URL")}
    completed = subprocess.run([sys.executable, "-c", TELEMETRY_CONSENT, "prepared" if prepared else "plain"],
                               capture_output=True, text=True, cwd=PROJECT_ROOT, check=True,
                               env={**env, "HOME": str(home)})
    return json.loads(completed.stdout.splitlines()[-1])


def consent_file(home: Path, content: str | None) -> Path:
    home.mkdir()
    if content is not None:
        (home / "intel").mkdir()
        (home / "intel" / "openvino_telemetry").write_text(content)
    return home


def test_without_a_consent_file_the_library_would_send_and_our_processes_do_not(tmp_path):
    home = consent_file(tmp_path / "home", None)
    assert telemetry_in_a_process(home, prepared=False) == {"consent": True, "processes_started": 1}
    assert telemetry_in_a_process(home, prepared=True) == {"consent": False, "processes_started": 0}


@pytest.mark.parametrize("content, consent", [("1", True), ("0", False)])
def test_a_users_own_consent_file_decides_as_the_library_reads_it(tmp_path, content, consent):
    home = consent_file(tmp_path / "home", content)
    assert telemetry_in_a_process(home, prepared=True) == {"consent": consent, "processes_started": int(consent)}


def telemetry_consent() -> bool:
    from openvino_telemetry import Telemetry

    return Telemetry(app_name="nncf", app_version="0", tid="G-TEST", backend="ga4", enable_opt_in_dialog=False,
                     disable_in_ci=True).consent


def test_a_spawned_process_of_the_stages_sends_no_telemetry_without_consent(tmp_path, monkeypatch):
    # where the stages run NNCF and OpenVINO (pipeline/spawn.py): no entry point of ours runs there
    monkeypatch.setenv("HOME", str(consent_file(tmp_path / "home", None)))
    for variable in ("CI", "TF_BUILD", "JENKINS_URL"):
        monkeypatch.delenv(variable, raising=False)
    assert in_spawned_process(telemetry_consent) is False
