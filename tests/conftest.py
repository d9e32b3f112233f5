"""Shared test fixtures: paths, and the real SQuAD 2.0 dev sample read from ../shared (never copied in)."""

import functools
import os
from pathlib import Path

import pytest

# One intra-op thread for torch in the tests and the processes they start, unless a test or a rule asks for more
# (a rule's OMP_NUM_THREADS, benchmark.threads): a second thread does not speed up the tests' tiny models, and where
# another job keeps a core busy, a 2-thread torch waits on it at every operation (docs/findings.md, "Two cores").
# Set here, before any test module imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# As every process the pipeline starts: transformers leaves scikit-learn and SciPy unimported (pipeline/startup.py).
from pipeline.startup import hide_unused_packages_from_transformers  # noqa: E402

hide_unused_packages_from_transformers()

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_SQUAD_SAMPLE = PROJECT_ROOT.parent / "shared" / "data" / "squad2-dev-sample.json"


def machine_line() -> str:
    """The CPU the suite ran on, as every figure names it: its time differs between the CPU kinds it meets."""
    from pipeline.outputs.machine import cpu_description

    cpu = cpu_description()
    return f"cpu: {cpu['model_name']}, {os.cpu_count()} cores ({' '.join(cpu['simd_flags']) or 'no SIMD flags read'})"


def pytest_report_header(config):
    return machine_line()


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(machine_line())  # beside the summary's time, where a log's tail shows both


@pytest.fixture
def squad2_dev_sample() -> Path:
    """Path to the real SQuAD 2.0 dev sample; skips the test when ../shared is absent."""
    if not SHARED_SQUAD_SAMPLE.is_file():
        pytest.skip(f"real SQuAD sample not found at {SHARED_SQUAD_SAMPLE} (../shared is absent)")
    return SHARED_SQUAD_SAMPLE


@pytest.fixture(scope="session")
def exported_student(tmp_path_factory) -> dict:
    """The tiny student exported, quantized, converted to CoreML and bundled once for the whole session (read only):
    tests/test_export.py and tests/test_web_client.py both check these files."""
    from tests.stage_fixtures import export_tiny_student

    return export_tiny_student(tmp_path_factory.mktemp("exported_student"))


# Builds that start with the session and run in the background (tests/background.py), and the fixture each
# test that reads one asks for, in the order their tests run. Each runs at a niceness of its own: the documented
# deploy, the longest chain of jobs that run one after another, at the tests' own; the DAG's just below; the
# torchrun runs, whose processes run side by side, at the lowest. So the torchrun runs take what the others leave
# and are still running while the tests that read the DAG and the deploy (one after another, on one core) run.
BACKGROUND_BUILDS = ("dag_run", "documented_offline_deploy", "distributed_runs")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the marker is what it selects on
def pytest_collection_modifyitems(items):
    """The tests that read a background build are marked `integration` (the end-to-end builds: `pytest -m "not
    integration"` leaves them out) and run last, those of each build together in the order above, so that the
    builds overlap the other tests (and the torchrun runs the tests of the others)."""
    def reads(item) -> int:
        return next((order for order, name in enumerate(BACKGROUND_BUILDS) if name in item.fixturenames), -1)

    for item in items:
        if reads(item) >= 0:
            item.add_marker(pytest.mark.integration)
    items.sort(key=reads)


def selected(request, fixture: str) -> bool:
    return any(fixture in item.fixturenames for item in request.session.items)


def background_build(build, name: str, niceness: int):
    """`build` started in the background at `niceness` (tests/background.py: InBackground), yielded, and stopped
    when the session ends: the body of each *_in_background fixture below."""
    from tests.background import InBackground

    background = InBackground(build, name, niceness)
    yield background
    background.stop()


@pytest.fixture(scope="session", autouse=True)
def dag_run_in_background(request, tmp_path_factory):
    """The session's DAG run (tests/dag_run.py), started with the first test when a selected test reads it."""
    if not selected(request, "dag_run"):
        yield None
        return
    from tests.dag_run import run_dag_killed_and_recovered

    yield from background_build(functools.partial(run_dag_killed_and_recovered, tmp_path_factory.mktemp("dag")),
                                "dag-run", niceness=2)


@pytest.fixture(scope="session")
def dag_run(dag_run_in_background):
    """The whole DAG on configs/test.yaml, killed once and recovered (tests/dag_run.py); its outputs are read only."""
    return dag_run_in_background.result()


@pytest.fixture(scope="session", autouse=True)
def documented_offline_deploy_in_background(request, tmp_path_factory):
    """docs/deploy.md's offline command (tests/deploy_run.py), started with the first test when a selected test
    reads it and the real SQuAD sample is there."""
    if not SHARED_SQUAD_SAMPLE.is_file() or not selected(request, "documented_offline_deploy"):
        yield None
        return
    from tests.deploy_run import prepare_documented_deploy, run_documented_deploy

    prepared = prepare_documented_deploy(tmp_path_factory.mktemp("documented_deploy"), SHARED_SQUAD_SAMPLE)
    yield from background_build(functools.partial(run_documented_deploy, *prepared), "documented-deploy",
                                niceness=0)


@pytest.fixture
def documented_offline_deploy(squad2_dev_sample, documented_offline_deploy_in_background):
    """The documented offline deploy's run (tests/deploy_run.py: DeployRun); skips without the real SQuAD sample."""
    return documented_offline_deploy_in_background.result()


@pytest.fixture(scope="session", autouse=True)
def distributed_runs_in_background(request, tmp_path_factory):
    """The torchrun runs of distill_pretrain (tests/distributed_runs.py), started with the first test when a
    selected test reads them."""
    if not selected(request, "distributed_runs"):
        yield None
        return
    from tests.distributed_runs import run_distributed

    yield from background_build(functools.partial(run_distributed, tmp_path_factory.mktemp("distributed")),
                                "distributed-runs", niceness=19)


@pytest.fixture(scope="session")
def distributed_runs(distributed_runs_in_background):
    """distill_pretrain under torchrun: 2 processes, 1 process, and a killed 2-process run resumed on two nodes
    (tests/distributed_runs.py: DistributedRuns); read only."""
    return distributed_runs_in_background.result()
