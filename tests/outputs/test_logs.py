"""Every command's logging (pipeline/outputs/logs.py): the pipeline's INFO lines, and only warnings and errors from the
libraries that log every step they take."""

import logging

import pytest

from pipeline.outputs import logs


@pytest.fixture
def restored_logging():
    """The root logger's handlers and level, and the quiet loggers' levels, as they were before the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in logs.QUIET_LOGGERS}
    yield
    root.handlers[:], root.level = handlers, level
    for name, quiet_level in levels.items():
        logging.getLogger(name).setLevel(quiet_level)


def test_coremltools_logs_only_warnings_and_the_pipeline_its_info(restored_logging, monkeypatch):
    monkeypatch.setenv(logs.COREMLTOOLS_OPTIMIZE_LEVEL, "unset")  # recorded, so the test's own setting is undone
    monkeypatch.delenv(logs.COREMLTOOLS_OPTIMIZE_LEVEL)
    logs.setup_logging()
    assert logging.getLogger("pipeline.stages.export_coreml").isEnabledFor(logging.INFO)
    for name in ("coremltools", "coremltools.converters.mil.frontend.torch.ops", "coremltools.optimize.torch._utils"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger(name).isEnabledFor(logging.WARNING), name
    # coremltools.optimize.torch sets its level from the environment when it is imported, after this or before
    from coremltools.optimize.torch import _logging

    _logging.init_root_logger()
    assert not logging.getLogger("coremltools.optimize.torch._utils.k_means").isEnabledFor(logging.INFO)


def test_a_users_own_coremltools_level_is_kept(restored_logging, monkeypatch):
    monkeypatch.setenv(logs.COREMLTOOLS_OPTIMIZE_LEVEL, "debug")
    logs.setup_logging()
    from coremltools.optimize.torch import _logging

    _logging.init_root_logger()
    assert logging.getLogger("coremltools.optimize.torch._utils.k_means").isEnabledFor(logging.DEBUG)
