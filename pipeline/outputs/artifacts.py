"""The outputs of a stage, written so that a killed job never leaves a complete-looking one: atomic files (the
atomic folder, which gets its manifest and the machine's stamp before it appears, is
pipeline.outputs.manifests.atomic_output_dir), JSON reading, and the sizes reported of them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temporary name beside `path`, then rename: a killed job never leaves a complete-looking file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


# ------------------------------------------------------------------------------------------------ manifests


def directory_size_bytes(path: str | Path) -> int:
    """Bytes on disk of a file, or of every file under a folder (an .mlpackage is a folder)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def megabytes(n_bytes: int) -> float:
    """MB as 10^6 bytes, the unit of every size this pipeline reports."""
    return round(n_bytes / 1e6, 3)
