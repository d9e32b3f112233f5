"""What every process this project starts does first (`python -m pipeline`, the benchmark's timing workers, the
processes pipeline/spawn.py starts, the scripts of benchmarks/ through that package's __init__, the tests): two
settings of libraries it loads, each applied as the library's module is loaded, so the order of imports does not
matter (`prepare_process`); and the garbage collector paused while the libraries load.

1. transformers imports two installed packages in every process that loads a model, for features no stage uses:
   scikit-learn's metrics, for assisted text generation (`transformers.generation.candidate_generator`), and SciPy's
   optimizers, for the matching losses of object detectors (`transformers.loss.loss_for_object_detection`, which
   `modeling_utils` imports through its loss table). Both are installed for coremltools (k-means palettization).
   Those imports cost every model-loading process, every job of the DAG and every PyTorch timing worker, about a
   fifth of a short stage's time (docs/findings.md, "Two cores"). transformers offers no setting for them, so the two
   flags it reads (`transformers.utils.import_utils._sklearn_available` and `_scipy_available`) are set to False as
   that module is loaded. Both packages stay importable: coremltools imports them where it needs them.
2. OpenVINO's usage telemetry (the openvino-telemetry package, which NNCF and `openvino.convert_model` report
   through) is sent only where the user opted in. Left to itself, that package counts a missing consent file as
   consent: every `nncf.quantize` then sends about 35 events to Google Analytics, each from a new process it waits
   for (up to 3 s each), which about doubled the time of NNCF's int8 of the default run's student, offline
   (docs/findings.md, "Two cores"). The pipeline sends nothing about its users by default, so a missing consent
   file counts as declined in these processes. The consent file (~/intel/openvino_telemetry, one for the user's
   whole account) is left as it is: a user who opted in (`opt_in_out --opt_in` writes "1") still sends, one who
   opted out does not. The package offers no setting for this short of that file (its only other switch is the CI
   variables it looks for).
3. Python's cyclic garbage collector is paused while a process loads its libraries. Loading torch, transformers and
   a stage's other libraries makes about 0.4 million objects that live as long as the process, and each automatic
   full collection on the way walks every object made so far: about a fifth of the CPU time of loading them (a stage
   that loads a model: 3.7 s of CPU, 2.85 s with collection paused, on the AMD EPYC of docs/findings.md), and every
   later full collection walks them again (coremltools collects after each conversion). So an entry point pauses
   collection at its start (`pause_collection_while_loading`) and, once its libraries are loaded, leaves what is
   loaded out of every later collection (gc.freeze) and resumes it (`libraries_loaded`): the pattern of Python's gc
   documentation for gc.freeze. The cyclic garbage made while loading (about 15,000 objects) is kept with the loaded
   modules rather than freed. Objects made after that are collected as usual.
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import sys

TRANSFORMERS_FLAGS_MODULE = "transformers.utils.import_utils"
# transformers' flags for the packages it need not import here (see the module's docstring)
UNUSED_PACKAGE_FLAGS = ("_sklearn_available", "_scipy_available")
TELEMETRY_CONSENT_MODULE = "openvino_telemetry.utils.opt_in_checker"


def _hide_unused_packages(import_utils) -> None:
    for flag in UNUSED_PACKAGE_FLAGS:
        setattr(import_utils, flag, False)


def _no_telemetry_without_consent(opt_in_checker) -> None:
    """OptInChecker.check, which every openvino_telemetry.Telemetry asks, answers "declined" where the library's own
    answer is "no consent file"; an accepted or declined file is answered as the library answers it."""
    checker = opt_in_checker.OptInChecker
    if getattr(checker.check, "declines_without_a_file", False):
        return
    library_check = checker.check
    results = opt_in_checker.ConsentCheckResult

    def check(self, enable_opt_in_dialog, disable_in_ci=False):
        result = library_check(self, enable_opt_in_dialog, disable_in_ci)
        return results.DECLINED if result == results.NO_FILE else result

    check.declines_without_a_file = True
    checker.check = check


# module name -> what is applied to it once it has run
APPLIED_ON_LOAD = {
    TRANSFORMERS_FLAGS_MODULE: _hide_unused_packages,
    TELEMETRY_CONSENT_MODULE: _no_telemetry_without_consent,
}


class _SettingsAppliedOnLoad(importlib.abc.MetaPathFinder):
    """Finds the modules of APPLIED_ON_LOAD as Python would, and applies their setting once each has run."""

    def find_spec(self, name, path, target=None):
        apply = APPLIED_ON_LOAD.get(name)
        if apply is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            apply(module)

        spec.loader.exec_module = exec_module  # this spec's own loader instance
        return spec


def prepare_process() -> None:
    """Before the libraries are imported: the settings of the module's docstring. Idempotent; a module that is loaded
    already gets its setting at once (what it imported stays)."""
    for name, apply in APPLIED_ON_LOAD.items():
        loaded = sys.modules.get(name)
        if loaded is not None:
            apply(loaded)
    if not any(isinstance(finder, _SettingsAppliedOnLoad) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SettingsAppliedOnLoad())


# Whether pause_collection_while_loading paused the collector in this process, for libraries_loaded to resume.
_paused_while_loading = False


def pause_collection_while_loading() -> None:
    """At an entry point's start, before its libraries load: no automatic collection until `libraries_loaded` (the
    module's docstring, 3). A collector that is off already is left as it is."""
    global _paused_while_loading
    if gc.isenabled():
        gc.disable()
        _paused_while_loading = True


def libraries_loaded() -> None:
    """What the process has loaded is left out of every later collection, and collection resumes (the module's
    docstring, 3). Does nothing where this process's collector was not paused at its start: a test that calls an
    entry point's function in its own process keeps its collector as it is."""
    global _paused_while_loading
    if _paused_while_loading:
        gc.freeze()
        gc.enable()
        _paused_while_loading = False
