"""The outputs of a stage, written so that a killed job never leaves a complete-looking one: atomic files and
folders (a folder gets its manifest and the machine's stamp before it appears), and the sizes reported of them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temporary name beside `path`, then rename: a killed job never leaves a complete-looking file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


@contextlib.contextmanager
def atomic_output_dir(final_dir: str | Path, config: Any = None) -> Iterator[Path]:
    """Yield a temporary folder to fill; it replaces `final_dir` only when the block finishes without error.

    Before the rename, `manifest.json` is written beside the outputs (sha256 and bytes of every file, the hash
    of `config`, library versions) unless the stage wrote its own; the next stage checks its inputs against it.
    """
    # Both write through this module's atomic writes, so they are imported here rather than at the top.
    from pipeline.machine import stamp_machine
    from pipeline.manifests import files_manifest, write_manifest

    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = final_dir.with_name(f".{final_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        stamp_machine(tmp / "metrics.json")
        own_manifest = tmp / "manifest.json"
        if own_manifest.is_file():  # the stage wrote its own (the bundle's): keep its fields, list the stamped files
            manifest = read_json(own_manifest)
            manifest["files"] = files_manifest(tmp)
            atomic_write_json(own_manifest, manifest)
        else:
            write_manifest(tmp, config)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(final_dir, ignore_errors=True)
    os.replace(tmp, final_dir)


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
