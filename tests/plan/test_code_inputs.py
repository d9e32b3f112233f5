"""pipeline/plan/code_inputs.py and the rules' code inputs: each rule lists exactly its stage's import closure (so an
edit to any module it reaches reruns it), and no stage module imports another stage."""

import functools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.plan import code_inputs
from pipeline.plan.commands import COMMANDS
from tests.paths import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "pipeline"


def write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pipeline"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return package


def test_the_closure_follows_imports_at_any_depth_and_runs_parent_packages(tmp_path, monkeypatch):
    package = write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "import json\nfrom pipeline import b\n",
        "b.py": "def f():\n    from pipeline.sub.c import g  # inside a function\n    return g\n",
        "sub/__init__.py": "",
        "sub/c.py": "from pipeline.sub import d\n",
        "sub/d.py": "",
        "unrelated.py": "",
    })
    monkeypatch.setattr(code_inputs, "PACKAGE_DIR", package)
    closure = [path.relative_to(package).as_posix() for path in code_inputs.import_closure("pipeline.a")]
    assert closure == ["__init__.py", "a.py", "b.py", "sub/__init__.py", "sub/c.py", "sub/d.py"]


def test_a_relative_import_is_refused_by_file_and_line(tmp_path, monkeypatch):
    package = write_package(tmp_path, {"__init__.py": "", "a.py": "\nfrom . import b\n", "b.py": ""})
    monkeypatch.setattr(code_inputs, "PACKAGE_DIR", package)
    with pytest.raises(ValueError, match=r"a\.py:2: relative import"):
        code_inputs.import_closure("pipeline.a")


def test_the_teacher_stage_reaches_the_modules_its_imports_reach():
    files = {Path(path).relative_to(PACKAGE).as_posix() for path in code_inputs.command_code_files("teacher-finetune")}
    assert {"stages/teacher.py", "training/loop.py", "training/batching.py", "distillation/students.py",
            "distillation/losses.py", "errors.py", "__main__.py"} <= files
    assert "stages/distill_squad.py" not in files and "runtime/answering.py" not in files


@functools.lru_cache(maxsize=None)
def workflow_rules() -> dict:
    """Each rule of the default DAG and the study: its shell command and its `code` inputs, as Snakemake parsed
    them (the Snakemake API, no job runs)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    with SnakemakeApi(OutputSettings()) as api:
        workflow = api.workflow(resource_settings=ResourceSettings(cores=2),
                                config_settings=ConfigSettings(config={"output_root": "/nonexistent/out"}),
                                snakefile=PROJECT_ROOT / "Snakefile", workdir=PROJECT_ROOT)._workflow
        return {rule.name: (rule.shellcmd or "", list(rule.input.get("code", []))) for rule in workflow.rules}


# Imports every stage module in one interpreter with `__import__` recording which package module imports which:
# one process instead of one per stage (each would import torch, transformers and onnxruntime again).
RECORD_IMPORTS = r"""
import builtins, importlib, json, sys

from pipeline.startup import pause_collection_while_loading, prepare_process

prepare_process()  # as `python -m pipeline` does first (pipeline/startup.py), before the recording starts
pause_collection_while_loading()  # this process only loads modules
edges = {}
real_import = builtins.__import__


def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    module = real_import(name, globals, locals, fromlist, level)
    importer = (globals or {}).get("__name__", "")
    if importer.split(".")[0] == "pipeline" and name.split(".")[0] == "pipeline":
        imported = [name] + [f"{name}.{item}" for item in fromlist or () if f"{name}.{item}" in sys.modules]
        edges.setdefault(importer, set()).update(imported)
    return module


builtins.__import__ = recording_import
for stage in sys.argv[1:]:
    importlib.import_module(stage)
files = {name: module.__file__ for name, module in list(sys.modules.items())
         if name.split(".")[0] == "pipeline" and getattr(module, "__file__", None)}
print(json.dumps({"edges": {k: sorted(v) for k, v in edges.items()}, "files": files}))
"""


@functools.lru_cache(maxsize=None)
def recorded_import_graph(modules: tuple[str, ...]) -> dict:
    completed = subprocess.run([sys.executable, "-c", RECORD_IMPORTS, *modules], capture_output=True, text=True,
                               check=True, cwd=PROJECT_ROOT)
    return json.loads(completed.stdout)


def runtime_imports(module: str) -> frozenset[str]:
    """The package's files that importing `module` loads, seen by Python itself (module-level imports only): the
    modules it imports at any depth, each with its parent packages, whose `__init__` runs first."""
    graph = recorded_import_graph(tuple(sorted({module for module, _ in COMMANDS.values()})))
    edges, files = graph["edges"], graph["files"]

    def with_parents(name: str) -> list[str]:
        parts = name.split(".")
        return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]

    reached, pending = set(), with_parents(module)
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        reached.add(name)
        for imported in edges.get(name, ()):
            pending.extend(with_parents(imported))
    return frozenset(str(Path(files[name]).resolve()) for name in reached if name in files)


def test_every_stage_rule_lists_exactly_its_import_closure():
    rules = workflow_rules()
    stage_rules = {name: rule for name, rule in rules.items() if " -m pipeline " in rule[0]}
    assert {"prepare_data", "teacher_finetune", "student_finetune", "benchmark", "study_run"} <= stage_rules.keys()
    for name, (shell, code) in stage_rules.items():
        command = shell.split(" -m pipeline ", 1)[1].split()[0]
        expected = set(code_inputs.command_code_files(command))
        python_files = {path for path in code if path.endswith(".py")}
        assert python_files == expected, name
        # Python's own view agrees: every module the stage loads when imported is an input of its rule.
        module = COMMANDS[command][0]
        missing = runtime_imports(module) - {str(Path(path).resolve()) for path in python_files}
        assert not missing, (name, missing)


def test_the_javascript_timing_reruns_when_the_client_changes():
    _, code = workflow_rules()["benchmark_web"]
    client = PROJECT_ROOT / "clients" / "web"
    expected = {*(client / "scripts" / name for name in ("bench.mjs", "chromium.mjs", "serve-demo.mjs")),
                client / "package-lock.json", client / "bench" / "index.html", client / "bench" / "bench.js",
                client / "bench" / "latency.js",
                *(client / "src").glob("*.js")}
    assert expected <= {Path(path) for path in code}


def test_no_stage_module_imports_another_stage():
    stages = {path.stem for path in (PACKAGE / "stages").glob("*.py") if path.stem != "__init__"}
    for path in (PACKAGE / "stages").glob("*.py"):
        for module in code_inputs.imported_modules(path):
            parts = module.split(".")
            if parts[:2] == ["pipeline", "stages"] and len(parts) > 2 and parts[2] in stages:
                assert parts[2] == path.stem, f"{path.name} imports the stage {module}"


def test_the_modules_the_rules_plan_with_import_no_torch():
    # Every `snakemake` command (a plan, a dry run, each rerun) imports what the rules import: torch and
    # transformers there would add seconds to each.
    plans = [PROJECT_ROOT / "Snakefile", *(PROJECT_ROOT / "rules").glob("*.smk")]
    imports = sorted({line.strip() for path in plans for line in path.read_text().splitlines()
                      if line.strip().startswith(("from pipeline", "import pipeline"))})
    assert any("study_runs" in line for line in imports) and any("config" in line for line in imports)
    heavy = "print(sorted({'torch', 'transformers', 'onnxruntime'} & set(sys.modules)))"
    script = "\n".join([*imports, "import sys", heavy])
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                               cwd=PROJECT_ROOT)
    assert completed.stdout.strip() == "[]", imports
