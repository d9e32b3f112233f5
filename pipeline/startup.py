"""What the processes this project starts do first (`python -m pipeline`, the benchmark's timing workers, the tests).

transformers imports two installed packages in every process that loads a model, for features no stage uses:
scikit-learn's metrics, for assisted text generation (`transformers.generation.candidate_generator`), and SciPy's
optimizers, for the matching losses of object detectors (`transformers.loss.loss_for_object_detection`, which
`modeling_utils` imports through its loss table). Both are installed for coremltools (k-means palettization).
Those imports cost every model-loading process, every job of the DAG and every PyTorch timing worker, about a
fifth of a short stage's time (docs/findings.md, "Two cores"). transformers offers no setting for them, so the two flags it reads
(`transformers.utils.import_utils._sklearn_available` and `_scipy_available`) are set to False as that module
is loaded. Both packages stay importable: coremltools imports them where it needs them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

FLAGGED_MODULE = "transformers.utils.import_utils"
# transformers' flags for the packages it need not import here (see the module's docstring)
UNUSED_PACKAGE_FLAGS = ("_sklearn_available", "_scipy_available")


def _set_flags(import_utils) -> None:
    for flag in UNUSED_PACKAGE_FLAGS:
        setattr(import_utils, flag, False)


class _UnusedPackagesHiddenFromTransformers(importlib.abc.MetaPathFinder):
    """Finds transformers' import_utils as Python would, and sets its flags once the module has run."""

    def find_spec(self, name, path, target=None):
        if name != FLAGGED_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            _set_flags(module)

        spec.loader.exec_module = exec_module  # this spec's own loader instance
        return spec


def hide_unused_packages_from_transformers() -> None:
    """Before transformers is imported: it will not import scikit-learn or SciPy (see the module's docstring).
    Idempotent; where transformers' import_utils is loaded already, its flags are set (what it imported stays)."""
    loaded = sys.modules.get(FLAGGED_MODULE)
    if loaded is not None:
        _set_flags(loaded)
        return
    if not any(isinstance(finder, _UnusedPackagesHiddenFromTransformers) for finder in sys.meta_path):
        sys.meta_path.insert(0, _UnusedPackagesHiddenFromTransformers())
