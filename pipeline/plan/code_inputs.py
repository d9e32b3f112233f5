"""The source files a stage runs, as Snakemake inputs: the import closure of `python -m pipeline <command>`
within this package, read from the code with `ast` (imports inside functions count; other packages do not).

A rule lists exactly these files, so editing any module its stage reaches reruns it, and editing one it does not
reach leaves it alone.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from pipeline.plan.commands import COMMANDS

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # pipeline/, above this plan/ package
PACKAGE = PACKAGE_DIR.name
DISPATCHER = f"{PACKAGE}.__main__"


def module_file(module: str) -> Path | None:
    """The file of a module of this package (a package's __init__.py), or None for anything else."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of the code. `from a import b` names both a and a.b, since b may
    be a submodule; names that are not modules resolve to no file."""
    stat = path.stat()
    return set(_imported_modules(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=None)
def _imported_modules(path: str, mtime_ns: int, size: int) -> frozenset[str]:
    # Each version of a file is parsed once per process: the Snakefile asks for the closure of every rule's
    # command, the closures share most files, and re-parsing them was most of the time Snakemake took to plan.
    modules = set()
    for node in ast.walk(ast.parse(Path(path).read_text(), filename=path)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise ValueError(f"{path}:{node.lineno}: relative import; the package uses absolute imports only")
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(modules)


def import_closure(*modules: str) -> list[Path]:
    """The files of `modules` and of everything they import within the package, with the packages' __init__.py
    files that importing them runs, sorted."""
    seen: set[Path] = set()
    pending = list(modules)
    while pending:
        module = pending.pop()
        path = module_file(module)
        if path is None or path in seen:
            continue
        seen.add(path)
        parts = module.split(".")
        pending += [".".join(parts[:depth]) for depth in range(1, len(parts))]  # parent packages run first
        pending += imported_modules(path)
    return sorted(seen)


def command_code_files(command: str) -> list[str]:
    """The files `python -m pipeline <command>` runs: the dispatcher's closure and its entry module's."""
    entry_module, _ = COMMANDS[command]
    return [str(path) for path in import_closure(DISPATCHER, entry_module)]
