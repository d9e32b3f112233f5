"""Deploy an existing question-answering model as it is (deploy.model): where its build goes, and whether the
exporters can take it.

What the export path is built and tested for (pipeline/plan/model_types.py): BERT, DistilBERT, ELECTRA and
MobileBERT encoders with a question-answering head and a WordPiece tokenizer. The fusion checks of export_onnx
(what onnxruntime's optimizer fuses in each type's graph), the CoreML wrapper (each type's embeddings and encoder),
and the bundle's torch-free and JavaScript tokenizers (WordPiece) are written for these, so any other model is
refused here, with the reason, before a job runs on it.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.plan.config import PipelineConfig
from pipeline.plan.data_sources import names_a_local_path
from pipeline.plan.model_types import EXPORTABLE, OTHER_TOKENIZERS, supported_types

SUPPORTED_MODEL_TYPES = tuple(EXPORTABLE)
QA_HEAD = "qa_outputs"  # the span head of every supported type's ...ForQuestionAnswering
OFFLINE_MODEL = ("a hub model is downloaded, or read from the hub cache: offline, give a local save_pretrained "
                 "folder instead (deploy.model: ./my-qa-model)")


class DeployError(PipelineError, ValueError):
    """deploy.model is not a model the exporters can take; the message says why."""


def deploy_root(cfg: PipelineConfig) -> str:
    """Where a deploy build goes: <output_root>/deploy/<name>, so it never mixes with the training DAG's outputs.
    name: a local folder's own name (resolved, so "." and ".." name a real folder), a hub model's owner--name, and
    --<revision> when one is pinned. Deploying another model of the same name replaces that build."""
    source = cfg.deploy.model
    name = Path(source).resolve().name if names_a_local_path(source) else source.strip("/").replace("/", "--")
    if cfg.deploy.revision:
        name += f"--{cfg.deploy.revision}"
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")
    if not name:
        raise DeployError(f"deploy.model {source!r}: names no folder or hub model")
    return f"{cfg.output_root}/deploy/{name}"


def check_model_type(model_type: str | None, source: str) -> None:
    """A supported model type, or DeployError naming the model, its type, the types taken and what this one lacks."""
    if model_type in SUPPORTED_MODEL_TYPES:
        return
    tokenizer = (f"; its tokenizer is {OTHER_TOKENIZERS[model_type]}, and the bundle's Python and JavaScript "
                 "answerers implement WordPiece only" if model_type in OTHER_TOKENIZERS else "")
    raise DeployError(
        f"deploy.model {source}: model_type {model_type!r} is not one the exporters take; they take "
        f"{supported_types()}. For {model_type!r} there is no export path built and tested: no expected onnxruntime "
        f"fusions for export_onnx to check, no CoreML wrapper of its embeddings and encoder{tokenizer} "
        "(pipeline/plan/model_types.py lists what each type needs)")


def check_positions(max_positions: int | None, cfg: PipelineConfig, source: str) -> None:
    """The windows (squad.max_seq_length) and the CoreML lengths must fit the model's position embeddings, or
    evaluation and conversion would fail deep inside a library."""
    if max_positions is None:
        return
    too_long = {key: length for key, length in (("squad.max_seq_length", cfg.squad.max_seq_length),
                                               ("export.coreml.sequence_lengths", max(cfg.export.coreml.sequence_lengths)))
                if length > max_positions}
    if too_long:
        raise DeployError(f"deploy.model {source} has {max_positions} positions; "
                          + ", ".join(f"{key} asks for {length}" for key, length in too_long.items())
                          + f": set them to at most {max_positions}")


def check_local_model(folder: str, cfg: PipelineConfig) -> None:
    """At planning: a local deploy.model folder has a config.json of a supported model type whose positions fit."""
    import json

    config_path = Path(folder) / "config.json"
    if not config_path.is_file():
        raise DeployError(f"deploy.model {folder}: no config.json; give a save_pretrained folder of a QA model")
    try:
        config = json.loads(config_path.read_text())
        model_type = config.get("model_type")
    except (json.JSONDecodeError, AttributeError) as error:
        raise DeployError(f"{config_path}: not a model config ({error})") from error
    check_model_type(model_type, folder)
    check_positions(config.get("max_position_embeddings"), cfg, folder)


def load_deployable(cfg: PipelineConfig):
    """(model, tokenizer) of deploy.model, or DeployError saying why the exporters cannot take it. Remote code is
    never run: a model that needs it is refused by transformers' own check."""
    from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoTokenizer

    source, revision = cfg.deploy.model, cfg.deploy.revision
    try:
        config = AutoConfig.from_pretrained(source, revision=revision)
    except (OSError, ValueError) as error:
        raise unreadable(source, "config", error) from error
    check_model_type(config.model_type, source)
    check_positions(getattr(config, "max_position_embeddings", None), cfg, source)
    try:
        model, loading = AutoModelForQuestionAnswering.from_pretrained(source, revision=revision,
                                                                       output_loading_info=True)
    except OSError as error:  # a hub model whose config is cached but not its weights
        raise unreadable(source, "weights", error) from error
    untrained_head = [name for name in loading["missing_keys"] if name.startswith(QA_HEAD)]
    if untrained_head:
        raise DeployError(f"deploy.model {source}: no trained question-answering head ({', '.join(untrained_head)} "
                          "missing from its weights): it is a base model; fine-tune it on SQuAD first, or let the "
                          "training DAG do it")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision)
    except OSError as error:
        raise unreadable(source, "tokenizer", error) from error
    if not tokenizer.is_fast or type(tokenizer.backend_tokenizer.model).__name__ != "WordPiece":
        raise DeployError(f"deploy.model {source}: its tokenizer ({type(tokenizer).__name__}) is not a WordPiece "
                          "tokenizer with a tokenizer.json, which the bundle's torch-free and JavaScript answerers "
                          "implement")
    return model.eval(), tokenizer


def unreadable(source: str, part: str, error: Exception) -> DeployError:
    """deploy.model's `part` (config, weights, tokenizer) could not be read: the first line of the library's message
    (transformers' go on for several), and for a hub name what to give offline."""
    lines = str(error).strip().splitlines()
    reason = lines[0] if lines else type(error).__name__
    offline = "" if names_a_local_path(source) else f"; {OFFLINE_MODEL}"
    return DeployError(f"deploy.model {source}: cannot read its {part} ({reason}){offline}")
