"""Writing outputs atomically, and the small helpers every stage uses for its outputs."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
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
def atomic_output_dir(final_dir: str | Path) -> Iterator[Path]:
    """Yield a temporary folder to fill; it replaces `final_dir` only when the block finishes without error."""
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = final_dir.with_name(f".{final_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(final_dir, ignore_errors=True)
    os.replace(tmp, final_dir)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def fingerprint(*parts: Any, files: list[str | Path] = ()) -> str:
    """A hash of the run's config and its input files' contents: checkpoints resume only the same run."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    for file in files:
        file = Path(file)
        paths = sorted(p for p in file.rglob("*") if p.is_file()) if file.is_dir() else [file]
        for p in paths:
            digest.update(p.name.encode())
            with p.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


def setup_logging() -> None:
    """Stage logs go to stderr, which each Snakemake rule redirects to its `log:` file."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)


def to_plain(config_section: Any) -> Any:
    """A dataclass config section as plain data (for fingerprints and metrics)."""
    import dataclasses

    return dataclasses.asdict(config_section) if dataclasses.is_dataclass(config_section) else config_section
