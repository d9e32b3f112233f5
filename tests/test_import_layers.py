"""How the package's modules import each other: no cycle, and the layers that must stay light stay so (what
Snakemake imports while planning the DAG, and the runtime an app or a server imports to answer questions)."""

import subprocess
import sys

from pipeline.code_inputs import PACKAGE_DIR, imported_modules
from tests.conftest import PROJECT_ROOT

# What the Snakefile and rules/*.smk import while planning, and the torch-free answerer with its x86 runtime.
PLANNING = ["pipeline.commands", "pipeline.code_inputs", "pipeline.stage_cli", "pipeline.config",
            "pipeline.data_sources", "pipeline.deploy", "pipeline.study_runs", "pipeline.model_registry",
            "pipeline.students", "pipeline.export.peers"]
RUNTIME = ["pipeline.onnx_qa", "pipeline.openvino_session", "pipeline.squad"]


def module_graph() -> dict[str, set[str]]:
    """Every module of the package -> the package's modules it imports anywhere in its code (inside functions and
    TYPE_CHECKING blocks too: pipeline.code_inputs reads imports so)."""
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


def test_the_planning_and_runtime_layers_import_neither_torch_nor_transformers():
    for layer in (PLANNING, RUNTIME):
        code = ("import sys; " + "; ".join(f"import {module}" for module in layer)
                + "; heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules); print(heavy)")
        result = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "[]", (layer, result.stdout)
