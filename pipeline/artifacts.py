"""Writing outputs atomically, and the small helpers every stage uses for its outputs."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import platform
import shutil
from pathlib import Path
from typing import Any, Iterator

from pipeline.errors import PipelineError

# Models exported for devices, and the stage folder each comes from (the Snakefile, benchmark and report share it
# through exported_models): the trained models, or with deploy.model set the one model deployed as it is.
EXPORTED_MODELS = {"student": "distill_squad", "student_ce_only": "student_finetune", "teacher": "teacher"}
DEPLOYED_MODELS = {"deployed": "deployed_model"}


def exported_models(cfg) -> dict[str, str]:
    """Model name -> stage folder of every exported model in this config's DAG."""
    return DEPLOYED_MODELS if cfg.deploy.model else EXPORTED_MODELS


def bundled_model(cfg) -> str:
    """The exported model that the bundle ships: the distilled student, or the deployed model."""
    return "deployed" if cfg.deploy.model else "student"


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


def cpu_description() -> dict:
    """lscpu's model name and the SIMD flags that decide int8 speed (and float rounding paths), from /proc/cpuinfo."""
    model, flags = "unknown", []
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            if key.strip() in ("flags", "Features") and not flags:
                flags = value.split()
    interesting = [f for f in flags if f.startswith(("avx", "amx", "fma", "sse4", "asimd", "sve", "i8mm", "dotprod"))]
    return {"model_name": model, "simd_flags": sorted(interesting)}


def stamp_machine(metrics_path: Path) -> None:
    """Add the CPU model, its flags and the core count to a stage's metrics.json: trained metrics differ between
    CPU models (floating-point paths), so every figure carries the machine it came from."""
    if not metrics_path.is_file():
        return
    metrics = read_json(metrics_path)
    if isinstance(metrics, dict) and "machine" not in metrics:
        cpu = cpu_description()
        metrics["machine"] = {"cpu": cpu["model_name"], "cpu_flags": cpu["simd_flags"], "cores": os.cpu_count()}
        atomic_write_json(metrics_path, metrics)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


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


def setup_logging() -> None:
    """Stage logs go to stderr, which each Snakemake rule redirects to its `log:` file."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)


def to_plain(config_section: Any) -> Any:
    """A dataclass config section as plain data (for fingerprints and metrics)."""
    import dataclasses

    return dataclasses.asdict(config_section) if dataclasses.is_dataclass(config_section) else config_section


# ------------------------------------------------------------------------------------------------ manifests


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
                      "onnxruntime", "optimum", "optimum-onnx", "coremltools", "numpy", "snakemake")


def library_versions(names: tuple[str, ...] = MANIFEST_LIBRARIES) -> dict[str, str]:
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


def directory_size_bytes(path: str | Path) -> int:
    """Bytes on disk of a file, or of every file under a folder (an .mlpackage is a folder)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def megabytes(n_bytes: int) -> float:
    """MB as 10^6 bytes, the unit of every size this pipeline reports."""
    return round(n_bytes / 1e6, 3)
