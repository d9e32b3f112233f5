"""Stage outputs carry manifest.json; stages refuse inputs that differ from it; the code loads nothing unsafely."""

import json
import re

import pytest

import pipeline.outputs.manifests
from pipeline.__main__ import main
from pipeline.outputs.manifests import (ManifestError, atomic_output_dir, config_sha256, fingerprint, verify_input_dirs,
                                        verify_manifest)
from pipeline.plan.config import PipelineConfig
from tests.paths import PROJECT_ROOT


def test_a_stage_output_folder_gets_a_manifest_of_every_file_with_config_hash_and_versions(tmp_path):
    cfg = PipelineConfig()
    with atomic_output_dir(tmp_path / "stage", cfg) as tmp:
        (tmp / "model.safetensors").write_bytes(b"\x00" * 100)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "metrics.json").write_text("{}")
    manifest = verify_manifest(tmp_path / "stage")
    assert manifest["files"]["model.safetensors"]["bytes"] == 100
    assert set(manifest["files"]) == {"model.safetensors", "sub/metrics.json"}
    assert manifest["config_sha256"] == config_sha256(cfg) and len(manifest["config_sha256"]) == 64
    assert {"python", "torch", "transformers", "onnxruntime", "snakemake"} <= manifest["library_versions"].keys()


def test_library_versions_are_read_once_and_each_caller_gets_its_own_copy():
    from importlib import metadata

    from pipeline.outputs.manifests import library_versions

    first = library_versions(("numpy", "not-a-package-here"))
    assert first == {"python": first["python"], "numpy": metadata.version("numpy"),
                     "not-a-package-here": "not installed"}
    first["numpy"] = "0.0.0"  # a caller adding to or changing its dict leaves the next caller's as read
    assert library_versions(("numpy", "not-a-package-here"))["numpy"] == metadata.version("numpy")


def test_a_manifest_the_stage_wrote_itself_keeps_its_fields_and_covers_the_stamped_metrics(tmp_path):
    from pipeline.outputs.manifests import files_manifest

    with atomic_output_dir(tmp_path / "bundle") as tmp:
        (tmp / "metrics.json").write_text(json.dumps({"f1": 1.0}))
        (tmp / "manifest.json").write_text(json.dumps({"files": files_manifest(tmp), "written_by": "the stage"}))
    manifest = verify_manifest(tmp_path / "bundle")  # metrics.json gained its machine stamp after the stage's manifest
    assert manifest["written_by"] == "the stage"
    assert "machine" in json.loads((tmp_path / "bundle" / "metrics.json").read_text())


def test_a_failed_stage_leaves_neither_folder_nor_manifest(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_output_dir(tmp_path / "stage") as tmp:
            (tmp / "half.bin").write_bytes(b"1")
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "weights.bin").write_bytes(b"\x01" * 64), r"weights.bin: sha256 differs from the manifest"),
        (lambda d: (d / "weights.bin").write_bytes(b"\x00" * 10), r"weights.bin: 10 bytes, the manifest says 64"),
        (lambda d: (d / "weights.bin").unlink(), r"weights.bin: listed in the manifest but missing"),
        (lambda d: (d / "manifest.json").write_text("{"), r"manifest.json: unreadable manifest"),
    ],
    ids=["changed", "truncated", "deleted", "bad-manifest"],
)
def test_inputs_that_differ_from_their_manifest_are_refused_by_name(tmp_path, damage, message):
    with atomic_output_dir(tmp_path / "teacher") as tmp:
        (tmp / "weights.bin").write_bytes(b"\x00" * 64)
    verify_input_dirs(tmp_path / "teacher")
    damage(tmp_path / "teacher")
    with pytest.raises(ManifestError, match=message):
        verify_input_dirs("bert-base-uncased", None, tmp_path / "teacher")


def test_hub_names_and_folders_from_elsewhere_are_taken_as_they_are(tmp_path):
    (tmp_path / "downloaded").mkdir()
    (tmp_path / "downloaded" / "config.json").write_text("{}")
    verify_input_dirs("bert-base-uncased", tmp_path / "downloaded", None)


# --------------------------------------------------------------------------------------- integrity at scale


def write_stage_folder(folder, **files):
    """A stage output folder with a manifest, holding `files` (name -> bytes)."""
    with atomic_output_dir(folder) as tmp:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
    return folder


@pytest.fixture
def small_full_hash_limit(monkeypatch):
    """Files over 16 bytes count as large, so a test needs no 64 MiB file."""
    monkeypatch.setattr(pipeline.outputs.manifests, "FULL_HASH_MAX_BYTES", 16)
    monkeypatch.delenv("PIPELINE_VERIFY_FULL", raising=False)


def test_a_large_file_whose_size_changed_is_refused_by_name_without_hashing(tmp_path, small_full_hash_limit):
    corpus = write_stage_folder(tmp_path / "corpus", **{"ids.bin": b"\x00" * 32})
    (corpus / "ids.bin").write_bytes(b"\x00" * 33)
    with pytest.raises(ManifestError, match=r"ids.bin: 33 bytes, the manifest says 32"):
        verify_manifest(corpus)


def test_a_large_file_changed_in_place_passes_the_size_check_and_fails_a_full_verify(
    tmp_path, small_full_hash_limit, monkeypatch
):
    corpus = write_stage_folder(tmp_path / "corpus", **{"ids.bin": b"\x00" * 32})
    (corpus / "ids.bin").write_bytes(b"\x01" * 32)  # same size: only rehashing notices
    verify_manifest(corpus)
    verify_input_dirs(corpus)
    with pytest.raises(ManifestError, match=r"ids.bin: sha256 differs from the manifest"):
        verify_manifest(corpus, full=True)
    with pytest.raises(ManifestError, match=r"ids.bin: sha256 differs from the manifest"):
        verify_input_dirs(corpus, full=True)
    monkeypatch.setenv("PIPELINE_VERIFY_FULL", "1")
    with pytest.raises(ManifestError, match=r"ids.bin: sha256 differs from the manifest"):
        verify_manifest(corpus)


def test_a_small_file_changed_in_place_is_refused_by_default(tmp_path, small_full_hash_limit):
    folder = write_stage_folder(tmp_path / "tokenizer", **{"vocab.txt": b"\x00" * 16})  # at the limit: still hashed
    (folder / "vocab.txt").write_bytes(b"\x01" * 16)
    with pytest.raises(ManifestError, match=r"vocab.txt: sha256 differs from the manifest"):
        verify_manifest(folder)


def test_fingerprint_of_a_folder_with_a_manifest_reads_the_manifest_not_the_files(tmp_path, monkeypatch):
    corpus = write_stage_folder(tmp_path / "corpus", **{"ids.bin": b"\x00" * 32})
    before = fingerprint("run", files=[corpus])
    open_file = pipeline.outputs.manifests.Path.open

    def open_anything_but_the_corpus(path, *args, **kwargs):
        assert path.name != "ids.bin", "fingerprint read a file its manifest already hashes"
        return open_file(path, *args, **kwargs)

    monkeypatch.setattr(pipeline.outputs.manifests.Path, "open", open_anything_but_the_corpus)
    assert fingerprint("run", files=[corpus]) == before


def test_fingerprint_of_a_folder_with_a_manifest_follows_the_listed_hashes_only(tmp_path):
    corpus = write_stage_folder(tmp_path / "corpus", **{"ids.bin": b"\x00" * 32})
    manifest_path = corpus / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    before = fingerprint("run", files=[corpus])

    manifest["library_versions"]["numpy"] = "0.0.0"  # not a property of the data
    manifest_path.write_text(json.dumps(manifest))
    assert fingerprint("run", files=[corpus]) == before

    manifest["files"]["ids.bin"]["sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    changed = fingerprint("run", files=[corpus])
    assert changed != before and len(changed) == 16
    assert fingerprint("another run", files=[corpus]) != changed


def test_fingerprint_of_a_plain_file_and_a_folder_without_manifest_hashes_their_bytes(tmp_path):
    (tmp_path / "downloaded").mkdir()
    (tmp_path / "downloaded" / "config.json").write_text("{}")
    (tmp_path / "train.jsonl").write_text("{}\n")
    inputs = [tmp_path / "train.jsonl", tmp_path / "downloaded"]
    before = fingerprint("run", files=inputs)
    (tmp_path / "downloaded" / "config.json").write_text("[]")
    after_folder = fingerprint("run", files=inputs)
    (tmp_path / "train.jsonl").write_text("[]\n")
    assert len({before, after_folder, fingerprint("run", files=inputs)}) == 3


def test_the_verify_command_rehashes_every_file_and_prints_one_line_per_folder(tmp_path, capsys, small_full_hash_limit):
    model = write_stage_folder(tmp_path / "model", **{"weights.bin": b"\x00" * 1_500_000, "config.json": b"{}"})
    corpus = write_stage_folder(tmp_path / "corpus", **{"ids.bin": b"\x00" * 32})
    assert main(["verify", str(model), str(corpus)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"ok: {model} (2 files, 1.5 MB)", f"ok: {corpus} (1 files, 0.0 MB)"]

    (corpus / "ids.bin").write_bytes(b"\x01" * 32)  # over the limit, so only a full verify notices
    assert main(["verify", str(model), str(corpus)]) == 2
    output = capsys.readouterr()
    assert output.out.splitlines() == [f"ok: {model} (2 files, 1.5 MB)"]
    assert output.err.startswith(f"error: {corpus / 'ids.bin'}: sha256 differs from the manifest")

    assert main(["verify", str(tmp_path / "nowhere")]) == 2
    assert "manifest.json: missing" in capsys.readouterr().err


# --------------------------------------------------------------------------------------- safe loading


def source_files():
    files = sorted((PROJECT_ROOT / "pipeline").rglob("*.py")) + sorted((PROJECT_ROOT / "benchmarks").rglob("*.py"))
    return files + [PROJECT_ROOT / "Snakefile"]


def test_the_code_loads_weights_and_configs_safely_and_never_runs_remote_code():
    problems = []
    for path in source_files():
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(PROJECT_ROOT)
        for call in re.finditer(r"torch\.load\((?:[^()]|\([^()]*\))*\)", text):
            if "weights_only=True" not in call.group(0):
                problems.append(f"{name}: {call.group(0)} without weights_only=True")
        for pattern, why in [
            (r"trust_remote_code\s*=\s*True", "trust_remote_code=True"),
            (r"\bimport pickle\b|\bpickle\.loads?\(", "pickle"),
            (r"\byaml\.load\(", "yaml.load (use yaml.safe_load)"),
            (r"(?<![\w.])eval\(|(?<![\w.])exec\(", "eval/exec"),
            (r"shell\s*=\s*True|os\.system\(", "a shell built from a string"),
        ]:
            if re.search(pattern, text):
                problems.append(f"{name}: {why}")
    assert problems == []
    assert len(source_files()) > 20  # the scan saw the whole package


def test_every_stage_metrics_json_names_the_cpu_it_ran_on(tmp_path):
    from pipeline.outputs.artifacts import atomic_write_json, read_json
    from pipeline.outputs.machine import cpu_description
    from pipeline.outputs.manifests import atomic_output_dir

    with atomic_output_dir(tmp_path / "stage") as tmp:
        atomic_write_json(tmp / "metrics.json", {"f1": 90.0})
    machine = read_json(tmp_path / "stage" / "metrics.json")["machine"]
    assert machine["cpu"] == cpu_description()["model_name"] and machine["cores"] >= 1
    assert isinstance(machine["cpu_flags"], list)
