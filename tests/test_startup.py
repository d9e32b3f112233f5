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


# Garbage collection while a process loads its libraries (pipeline/startup.py, 3): each case runs in a process of
# its own, as an entry point starts one, and prints the collector's state as "enabled frozen-objects".
COLLECTOR_STATE = "import gc\ndef state():\n    print(gc.isenabled(), gc.get_freeze_count())\n"
COLLECTOR_CASES = {
    "paused, loaded, resumed": """
from pipeline.startup import libraries_loaded, pause_collection_while_loading
pause_collection_while_loading()
state()
import json, email.mime.text
libraries_loaded()
state()
libraries_loaded()  # a second call changes nothing
state()
""",
    "off already": """
from pipeline.startup import libraries_loaded, pause_collection_while_loading
gc.disable()
pause_collection_while_loading()
libraries_loaded()
state()
""",
    "never paused": """
from pipeline.startup import libraries_loaded
libraries_loaded()
state()
""",
    # `python -m pipeline`: paused before main(), resumed once the command's module is loaded (here --help ends it)
    "python -m pipeline": """
import contextlib, runpy, sys
sys.argv = ["pipeline", "evaluate-predictions", "--help"]
with contextlib.redirect_stdout(None), contextlib.suppress(SystemExit):
    runpy.run_module("pipeline", run_name="__main__")
state()
""",
    # a timing worker: paused at its start (workers.py), resumed where its timing starts
    "timer": """
from pipeline.startup import pause_collection_while_loading
pause_collection_while_loading()
from pipeline.measurement.latency import time_in_turn
state()
time_in_turn({"nothing": lambda: None}, runs=1, warmup=0)
state()
""",
    # benchmarks/ imported by another module (a test): its scripts' pause is for `python -m benchmarks.<name>` only
    "benchmarks imported": """
import benchmarks
state()
""",
}


def collector_states(case: str) -> list[tuple[bool, int]]:
    completed = subprocess.run([sys.executable, "-c", COLLECTOR_STATE + COLLECTOR_CASES[case]], capture_output=True,
                               text=True, cwd=PROJECT_ROOT, check=True)
    return [(enabled == "True", int(frozen)) for enabled, frozen in map(str.split, completed.stdout.splitlines())]


def test_collection_waits_while_the_libraries_load_then_skips_what_they_loaded():
    (paused, _), (resumed, frozen), again = collector_states("paused, loaded, resumed")
    assert not paused and resumed and frozen > 10_000  # the interpreter's and json's objects at least
    assert again == (True, frozen)
    assert collector_states("off already") == [(False, 0)]  # a collector someone else turned off stays off
    assert collector_states("never paused") == [(True, 0)]  # a process that did not pause keeps its collector


def test_each_entry_point_resumes_collection_once_it_has_loaded():
    (enabled, frozen), = collector_states("python -m pipeline")
    assert enabled and frozen > 10_000
    (before_timing, _), (timing, frozen) = collector_states("timer")
    assert not before_timing and timing and frozen > 10_000
    assert collector_states("benchmarks imported") == [(True, 0)]


def collector_state() -> tuple[bool, int]:
    import gc

    return gc.isenabled(), gc.get_freeze_count()


def test_a_spawned_process_collects_once_the_function_and_the_libraries_it_names_are_loaded():
    enabled, frozen = in_spawned_process(collector_state)
    assert enabled and frozen > 10_000
    # the libraries named are imported before collection resumes: their objects are frozen with the rest
    enabled, frozen_with_libraries = in_spawned_process(collector_state, libraries=("xml.dom.minidom", "tarfile"))
    assert enabled and frozen_with_libraries > frozen
