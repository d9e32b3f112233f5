"""What a folder written by a stage holds, hashed: its manifest.json (sha256 and bytes of every file, the config's
hash, library versions), written as the folder is made atomically (atomic_output_dir), checked by the next stage
that reads the folder and by `python -m pipeline verify`; and the fingerprint of a run's config and inputs, which
a checkpoint must match to be resumed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import platform
import shutil
from pathlib import Path
from typing import Any, Iterator

from pipeline.errors import PipelineError
from pipeline.outputs.artifacts import atomic_write_json, megabytes, read_json
from pipeline.outputs.machine import stamp_machine


@contextlib.contextmanager
def atomic_output_dir(final_dir: str | Path, config: Any = None) -> Iterator[Path]:
    """Yield a temporary folder to fill; it replaces `final_dir` only when the block finishes without error.

    Before the rename, `manifest.json` is written beside the outputs (sha256 and bytes of every file, the hash
    of `config`, library versions) unless the stage wrote its own; the next stage checks its inputs against it.
    """
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


def fingerprint(*parts: Any, files: list[str | Path] = ()) -> str:
    """A hash of the run's config and its input files' contents: checkpoints resume only the same run.

    A folder with a manifest.json contributes the manifest's hashes rather than its bytes, so a 20 GB corpus is
    hashed once, when it is written, not again by every stage that fingerprints it.
    """
    digest = hashlib.sha256()
    for part in parts:
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    for file in files:
        file = Path(file)
        if file.is_dir() and (file / "manifest.json").is_file():
            digest.update(listed_files_digest(file))
            continue
        paths = sorted(p for p in file.rglob("*") if p.is_file()) if file.is_dir() else [file]
        for p in paths:
            digest.update(p.name.encode())
            with p.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


def listed_files_digest(root: Path) -> bytes:
    """Canonical JSON of the path, sha256 and bytes of every file in `root`'s manifest (its other fields, such as
    library versions, do not describe the data and stay out)."""
    files = read_manifest(root)["files"]
    listed = {relative: {"sha256": entry["sha256"], "bytes": entry["bytes"]} for relative, entry in files.items()}
    return json.dumps(listed, sort_keys=True, separators=(",", ":")).encode()


def to_plain(config_section: Any) -> Any:
    """A dataclass config section as plain data (for fingerprints and metrics)."""
    import dataclasses

    return dataclasses.asdict(config_section) if dataclasses.is_dataclass(config_section) else config_section


class ManifestError(PipelineError, ValueError):
    """A file is missing, truncated or changed with respect to the manifest written beside it."""


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def files_manifest(root: str | Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file under `root` (mlpackage folders included), keyed by relative path."""
    root = Path(root)
    entries = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != "manifest.json"):
        entries[path.relative_to(root).as_posix()] = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
    return entries


# Rehashed on every read only up to this size: a bigger file (a tokenized corpus) is hashed once, when written.
FULL_HASH_MAX_BYTES = 64 * 2**20


def read_manifest(root: str | Path) -> dict[str, Any]:
    """`root`/manifest.json, with a "files" mapping; raise ManifestError when it is missing or unreadable."""
    manifest_path = Path(root) / "manifest.json"
    if not manifest_path.is_file():
        raise ManifestError(f"{manifest_path}: missing; this folder was not written by the pipeline or is incomplete")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ManifestError(f"{manifest_path}: unreadable manifest ({error})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ManifestError(f"{manifest_path}: unreadable manifest (no \"files\" mapping)")
    return manifest


def full_verify_requested(full: bool) -> bool:
    """True when asked by the caller or by PIPELINE_VERIFY_FULL=1 (to rehash everything in one run)."""
    return full or os.environ.get("PIPELINE_VERIFY_FULL") == "1"


def verify_manifest(root: str | Path, full: bool = False) -> dict[str, Any]:
    """Check every file listed in `root`/manifest.json; raise ManifestError naming the first bad file.

    Every file must exist with its listed size. Its sha256 is recomputed when it is at most FULL_HASH_MAX_BYTES,
    or for every file with `full=True` or PIPELINE_VERIFY_FULL=1.
    """
    root = Path(root)
    manifest = read_manifest(root)
    files = manifest["files"]
    for relative, expected in files.items():  # sizes first: cheap, and they catch a truncated file before any hashing
        path = root / relative
        if not path.is_file():
            raise ManifestError(f"{path}: listed in the manifest but missing")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise ManifestError(f"{path}: {size} bytes, the manifest says {expected['bytes']} (truncated or replaced)")
    rehash_all = full_verify_requested(full)
    for relative, expected in files.items():
        if not rehash_all and expected["bytes"] > FULL_HASH_MAX_BYTES:
            continue
        if file_sha256(root / relative) != expected["sha256"]:
            raise ManifestError(f"{root / relative}: sha256 differs from the manifest (the file was changed)")
    return manifest


# Libraries whose versions decide what a stage writes; every manifest records them.
MANIFEST_LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "datasets", "accelerate", "onnx",
                      "onnxruntime", "optimum", "optimum-onnx", "coremltools", "openvino", "nncf", "numpy",
                      "snakemake")


def library_versions(names: tuple[str, ...] = MANIFEST_LIBRARIES) -> dict[str, str]:
    return dict(_installed_versions(names))  # a copy: callers may add to it


@functools.lru_cache(maxsize=None)
def _installed_versions(names: tuple[str, ...]) -> dict[str, str]:
    # Read once per process: each read scans the installed distributions' metadata (about 15 ms for the list
    # above), and a training run writes a manifest with every checkpoint.
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def config_sha256(config: Any) -> str | None:
    """sha256 of a config (a dataclass or plain data) as canonical JSON; None without a config."""
    if config is None:
        return None
    return hashlib.sha256(json.dumps(to_plain(config), sort_keys=True, default=str).encode()).hexdigest()


def write_manifest(root: str | Path, config: Any = None) -> dict[str, Any]:
    """Write `root`/manifest.json for the files under `root` (written last, so it covers all of them)."""
    manifest = {
        "files": files_manifest(root),
        "config_sha256": config_sha256(config),
        "library_versions": library_versions(),
    }
    atomic_write_json(Path(root) / "manifest.json", manifest)
    return manifest


def verify_input_dirs(*sources: str | Path | None, full: bool = False) -> None:
    """Check the manifest of every input folder that has one; raise ManifestError naming the first bad file.

    Folders written by a pipeline stage always carry a manifest. A folder without one (a model downloaded or
    trained elsewhere) and a hub name are taken as they are. `full` is passed to verify_manifest.
    """
    for source in sources:
        if source is None:
            continue
        path = Path(source)
        if path.is_dir() and (path / "manifest.json").is_file():
            verify_manifest(path, full=full)


def verify_main(argv: list[str] | None = None) -> int:
    """Rehash every file listed in each folder's manifest.json and compare it with the manifest."""
    parser = argparse.ArgumentParser(prog="python -m pipeline verify", description=verify_main.__doc__)
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="a folder written by a pipeline stage")
    args = parser.parse_args(argv)
    for directory in args.dirs:
        files = verify_manifest(directory, full=True)["files"]  # a bad file raises; the dispatcher prints "error: ..."
        total_bytes = sum(entry["bytes"] for entry in files.values())
        print(f"ok: {directory} ({len(files)} files, {megabytes(total_bytes)} MB)")
    return 0
