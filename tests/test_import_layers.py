"""How the package's modules import each other: the folders are the layers (docs/rules.md, "Architecture"), each
imports only its own layer and those below it, never in a circle (no stage imports another:
tests/plan/test_code_inputs.py), and the layers that must stay light stay so (the planning layer, which Snakemake
imports while it plans the DAG, and the runtime an app or a server imports to answer questions). The tests import
their helpers from modules (tests/paths.py, tests/stage_fixtures.py), never from a conftest.py, which pytest imports
itself."""

import ast
import re
import subprocess
import sys

from pipeline.plan.code_inputs import PACKAGE_DIR, imported_modules
from tests.paths import PROJECT_ROOT

# The layers, top first: a module imports its own layer's modules and those of the layers after it.
LAYERS = ["stages", "reporting", "export", "distillation", "training", "data", "measurement", "runtime", "plan",
          "outputs"]
# What every layer may import: the package itself, its error base class, process start-up and spawning.
SHARED = {"pipeline", "pipeline.errors", "pipeline.startup", "pipeline.spawn"}
DISPATCHER = "pipeline.__main__"


def modules_in(layer: str) -> list[str]:
    return sorted(name for name in module_graph() if name.startswith(f"pipeline.{layer}."))


def snakemake_imports() -> list[str]:
    """The package's modules the Snakefile and rules/*.smk import while Snakemake plans: each `import X` and each
    `from X import a, b` (X, and X.a where a is a module)."""
    sources = [PROJECT_ROOT / "Snakefile", *sorted((PROJECT_ROOT / "rules").glob("*.smk"))]
    modules = set(module_graph())
    found = set()
    for source in sources:
        text = source.read_text()
        found.update(re.findall(r"^\s*import (pipeline[\w.]*)", text, flags=re.M))
        for module, names in re.findall(r"^\s*from (pipeline[\w.]*) import \(?([\w, ]+)", text, flags=re.M):
            submodules = {f"{module}.{name.strip()}" for name in names.split(",")}
            found.update({module} | (submodules & modules))
    return sorted(found)


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 2 and parts[1] in LAYERS else None


def module_graph() -> dict[str, set[str]]:
    """Every module of the package -> the package's modules it imports anywhere in its code (inside functions and
    TYPE_CHECKING blocks too: pipeline.plan.code_inputs reads imports so)."""
    modules = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {name: {other for other in imported_modules(path) if other in modules and other != name}
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_the_package_imports_itself_back():
    assert cycles(module_graph()) == []


def test_the_cycle_finder_finds_a_cycle_through_several_modules():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_module_is_in_a_layer_and_imports_only_its_layer_and_those_below():
    layer_packages = {f"pipeline.{layer}" for layer in LAYERS}
    upward = []
    for module, imports in module_graph().items():
        if module in SHARED:
            assert imports <= SHARED, f"{module}, which every layer imports, imports {sorted(imports - SHARED)}"
            continue
        if module == DISPATCHER or module in layer_packages:
            continue
        assert layer_of(module) is not None, f"{module} is in no layer: move it into pipeline/<layer>/ ({LAYERS})"
        upward += [f"{module} -> {other}" for other in imports
                   if layer_of(other) is not None and layer_of(other) < layer_of(module)]
    assert upward == []


def test_the_layer_check_sees_an_upward_import():
    assert layer_of("pipeline.runtime.answering") > layer_of("pipeline.export.gates")
    assert layer_of("pipeline.errors") is None and layer_of("pipeline.plan") is None


def test_the_planning_and_runtime_layers_import_neither_torch_nor_transformers():
    planning = sorted(set(modules_in("plan")) | set(snakemake_imports()))
    assert {"pipeline.plan.config", "pipeline.export.peers", "pipeline.distillation.students"} <= set(planning)
    for layer in (planning, modules_in("runtime")):
        code = ("import sys; " + "; ".join(f"import {module}" for module in layer)
                + "; heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules); print(heavy)")
        result = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "[]", (layer, result.stdout)


def test_no_test_module_imports_from_a_conftest():
    importers = []
    for path in sorted((PROJECT_ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(name.split(".")[-1] == "conftest" for name in names):
                importers.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno}")
    assert importers == []
