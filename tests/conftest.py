"""Shared test fixtures: the real SQuAD 2.0 dev sample read from ../shared (never copied in), the exported tiny
student and the end-to-end builds; the process settings every test runs with. Test modules import their helpers from
modules (tests/paths.py, tests/stage_fixtures.py), never from here: pytest imports this file itself."""

import gc
import os
from pathlib import Path

import pytest

from tests.paths import SHARED_SQUAD_SAMPLE

# One intra-op thread for torch in the tests and the processes they start, unless a test or a rule asks for more
# (a rule's OMP_NUM_THREADS, benchmark.threads): a second thread does not speed up the tests' tiny models, and where
# another job keeps a core busy, a 2-thread torch waits on it at every operation (docs/findings.md, "Two cores").
# Set here, before any test module imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# As every process the pipeline starts: transformers leaves scikit-learn and SciPy unimported, OpenVINO sends no
# telemetry without the user's consent (pipeline/startup.py).
from pipeline.startup import libraries_loaded, pause_collection_while_loading, prepare_process  # noqa: E402

prepare_process()
# And as they do, no garbage collection while the tests load their libraries: collection resumes once the tests are
# collected (or at once in pytest-xdist's controller, which collects none), with what is loaded frozen.
pause_collection_while_loading()


def pytest_sessionstart(session):
    if session.config.pluginmanager.hasplugin("dsession"):  # pytest-xdist's controller: the workers collect
        libraries_loaded()


def pytest_collection_finish(session):
    libraries_loaded()
    # In the tests' processes, a full collection at most once every 100 collections of the middle generation rather
    # than 10: they hold far more objects than a stage (every library their tests load after collection, the
    # session's fixtures), which each full collection walks; their cyclic garbage waits a little longer.
    gen0, gen1, _ = gc.get_threshold()
    gc.set_threshold(gen0, gen1, 100)


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
    tests/stages/test_export.py, tests/test_web_client.py and the tuning tests check these files (one xdist group:
    below)."""
    from tests.stage_fixtures import export_tiny_student

    return export_tiny_student(tmp_path_factory.mktemp("exported_student"))


@pytest.fixture(scope="session")
def tiny_int8(tmp_path_factory) -> Path:
    """A 2-layer DistilBERT QA model (pytorch/), its fp32 ONNX export (fp32/model.onnx) and a naive int8 graph of it
    (int8.onnx), built once per test process for the timing tests of tests/measurement/ (read only)."""
    from transformers import DistilBertConfig, DistilBertForQuestionAnswering

    from pipeline.export import int8, onnx_graph

    root = tmp_path_factory.mktemp("tiny_int8")
    model = DistilBertForQuestionAnswering(DistilBertConfig(vocab_size=200, dim=32, n_layers=2, n_heads=2,
                                                            hidden_dim=64, max_position_embeddings=128))
    model.save_pretrained(root / "pytorch")
    onnx_graph.export_fp32(root / "pytorch", root / "fp32", None)
    naive = int8.Int8Recipe("plain", "qoperator", per_channel=False, attention_int8=False)
    int8.quantize_int8(root / "fp32" / "model.onnx", root / "int8.onnx", naive, reduce_range=False)
    return root


# The end-to-end builds: each is made once per run by the worker that runs its tests (below), and read only. The
# fourth is benchmarks/gpu_check.sh's dry run (tests/benchmarks/test_gpu_check.py).
# exported_student: the tiny student through five stages (export_onnx, quantize_onnx, export_coreml, export_npu,
# bundle; tests/stage_fixtures.py), an end-to-end build of the export chain that took a minute of the edit-test loop
# before its first test; the export modules' own tests (tests/export/test_npu_graph.py, test_neural_engine.py,
# test_coreml_package_weights.py, ...) build what they check from the tiny models directly and stay in the loop.
# deployed_family: an ELECTRA and a MobileBERT model each fine-tuned, then through six deploy stages
# (tests/test_deploy_family.py), about half a minute of the loop; the export modules' tests check each step.
# built_peers: stage export_peers on a stand-in (torch, ORTQuantizer and NNCF builds), which the benchmark's peer
# timing then runs in worker processes (tests/export/test_peers.py); the peers' report and summary rows stay in the loop.
# Listed from the longest to build and read to the shortest, as their groups took their worker in runs of the suite
# on 2 cores (the test DAG and the exported student's tests about 2 minutes each, the documented deploy 1 to 2, the
# others under 1). With pytest-xdist their groups are handed out in this order, before every other test
# (pyproject.toml: --no-loadscope-reorder), so the longest do not start last beside an idle worker.
END_TO_END_BUILDS = ("dag_run", "exported_student", "documented_offline_deploy", "gpu_check_dry_run",
                     "distributed_runs", "built_peers", "deployed_family")


# pytest-xdist's options that pyproject.toml's addopts give (the tests on every core), and its flag there.
XDIST_ADDOPTS = ("--numprocesses", "--maxprocesses", "--dist")
XDIST_ADDOPTS_FLAGS = ("--no-loadscope-reorder",)


def pytest_addoption(parser, pluginmanager):
    """With pytest-xdist left out (`pytest -p no:xdist`), the xdist options of pyproject.toml's addopts are accepted
    and do nothing, so the tests run in this one process; with it, they are xdist's own."""
    if pluginmanager.hasplugin("xdist"):
        return
    group = parser.getgroup("xdist", "pytest-xdist's options in addopts, ignored: the plugin is not loaded")
    for option in XDIST_ADDOPTS:
        group.addoption(option, dest=f"ignored_xdist_{option.strip('-')}", help="ignored without pytest-xdist")
    for flag in XDIST_ADDOPTS_FLAGS:
        group.addoption(flag, dest=f"ignored_xdist_{flag.strip('-')}", action="store_true",
                        help="ignored without pytest-xdist")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the marker is what it selects on
def pytest_collection_modifyitems(config, items):
    """A test that reads an end-to-end build is marked `integration` (`pytest -m "not integration"` leaves them
    out). With pytest-xdist, every test joins a group (`--dist loadgroup`, pyproject.toml), which runs in one worker:
    the tests of a build, which that worker makes once; the modules that read the exported tiny student, which one
    worker builds while the other runs other tests; every other test beside its module's, whose module-scoped
    fixtures are then made once. A group follows from the fixtures a test uses, so it is given here rather than
    written in each module."""
    reading_the_student = {item.module.__name__ for item in items if "exported_student" in item.fixturenames}
    grouped = config.pluginmanager.hasplugin("xdist")  # the group marker is pytest-xdist's
    group_of = {}
    for item in items:
        build = next((name for name in END_TO_END_BUILDS if name in item.fixturenames), None)
        if build is not None:
            item.add_marker(pytest.mark.integration)
        if not grouped:
            continue
        module = item.module.__name__
        group = build or ("exported_student" if module in reading_the_student else module)
        item.add_marker(pytest.mark.xdist_group(group))
        group_of[item] = group
    if grouped:
        # the builds' groups first, the longest first (END_TO_END_BUILDS); every other test in its collected order
        last = len(END_TO_END_BUILDS)
        items.sort(key=lambda item: END_TO_END_BUILDS.index(group_of[item]) if group_of[item] in END_TO_END_BUILDS
                   else last)


@pytest.fixture(scope="session")
def dag_run(tmp_path_factory):
    """The whole DAG on configs/test.yaml, killed once and recovered (tests/dag_run.py); its outputs are read only."""
    from tests.dag_run import run_dag_killed_and_recovered

    return run_dag_killed_and_recovered(tmp_path_factory.mktemp("dag"))


@pytest.fixture(scope="session")
def documented_offline_deploy(tmp_path_factory):
    """docs/deploy.md's offline command in a copy of the project (tests/deploy_run.py: DeployRun); skips without the
    real SQuAD sample."""
    if not SHARED_SQUAD_SAMPLE.is_file():
        pytest.skip(f"real SQuAD sample not found at {SHARED_SQUAD_SAMPLE} (../shared is absent)")
    from tests.deploy_run import prepare_documented_deploy, run_documented_deploy

    return run_documented_deploy(*prepare_documented_deploy(tmp_path_factory.mktemp("documented_deploy"),
                                                            SHARED_SQUAD_SAMPLE))


@pytest.fixture(scope="session")
def distributed_runs(tmp_path_factory):
    """distill_pretrain under torchrun: 2 processes, 1 process, and a killed 2-process run resumed on two nodes
    (tests/distributed_runs.py: DistributedRuns); read only."""
    from tests.distributed_runs import run_distributed

    return run_distributed(tmp_path_factory.mktemp("distributed"))
