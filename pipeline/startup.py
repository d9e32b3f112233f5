"""What the processes this project starts do first (`python -m pipeline`, the benchmark's timing workers, the tests).

transformers imports scikit-learn's metrics whenever scikit-learn is installed, for assisted text generation
(`transformers.generation.candidate_generator`), which no stage uses. scikit-learn is installed for coremltools'
k-means palettization, and that import (scikit-learn, SciPy's stats, pandas) is 1.5 CPU-seconds of every process
that loads a model (measured on an AMD EPYC: 7.4 s against 5.9 s to import BertForQuestionAnswering): some
20 % of a short stage's time, in every job of the DAG. transformers offers no setting for it, so the one flag it
reads (`transformers.utils.import_utils._sklearn_available`) is set to False as that module is loaded.
scikit-learn itself stays importable: coremltools imports it where it needs it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

FLAGGED_MODULE = "transformers.utils.import_utils"


class _SklearnHiddenFromTransformers(importlib.abc.MetaPathFinder):
    """Finds transformers' import_utils as Python would, and sets its scikit-learn flag once the module has run."""

    def find_spec(self, name, path, target=None):
        if name != FLAGGED_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            module._sklearn_available = False

        spec.loader.exec_module = exec_module  # this spec's own loader instance
        return spec


def hide_sklearn_from_transformers() -> None:
    """Before transformers is imported: it will not import scikit-learn (see the module's docstring). Idempotent;
    where transformers' import_utils is loaded already, its flag is set (what it imported stays)."""
    loaded = sys.modules.get(FLAGGED_MODULE)
    if loaded is not None:
        loaded._sklearn_available = False
        return
    if not any(isinstance(finder, _SklearnHiddenFromTransformers) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SklearnHiddenFromTransformers())
