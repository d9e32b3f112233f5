"""What the config's data and model keys name: a file or folder on this machine, a hub name, or a built-in source
('synthetic', 'squad_contexts'). The Snakefile reads this module while it plans the DAG (local files become rule
inputs, and a missing one stops the run naming its key), so it imports nothing heavy.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from pipeline.plan.config import PipelineConfig


class MissingSourceError(PipelineError, FileNotFoundError):
    """A file or folder the config names is not there. The message names the key and the path."""


def local_data_files(squad: str, squad_dev: str | None, corpus: str) -> list[str]:
    """The configured data sources that are local files (not 'synthetic', 'squad_contexts' or a hub name).

    The Snakefile declares them as inputs of prepare_data, tokenizer and tokenize_corpus: an edited file reruns what
    depends on it (check_local_files reports a missing one)."""
    squad_files = [squad, squad_dev] if names_a_local_path(squad) else []  # squad_dev is read only beside a local squad
    return [source for source in squad_files + [corpus] if names_a_local_path(source)]


def configured_local_paths(cfg: PipelineConfig) -> dict[str, str]:
    """Every file or folder the config names on this machine, by key: the data sources and the pretrained models
    given as paths (hub names and the built-in sources are not paths)."""
    if cfg.deploy.model is not None:  # a deploy reads the model and its dev set, nothing else
        sources = {"deploy.model": cfg.deploy.model, **deploy_dev_source(cfg)}
        return {key: source for key, source in sources.items() if names_a_local_path(source)}
    sources = {
        "data.squad": cfg.data.squad, "data.squad_dev": cfg.data.squad_dev, "data.corpus": cfg.data.corpus,
        "tokenizer.pretrained": cfg.tokenizer.pretrained, "teacher.pretrained": cfg.teacher.pretrained,
        "teacher.pretrained_qa": cfg.teacher.pretrained_qa, "student.pretrained": cfg.student.pretrained,
        "export.full_size.distilbert_pretrained": cfg.export.full_size.distilbert_pretrained,
        "export.full_size.bert_base_pretrained": cfg.export.full_size.bert_base_pretrained,
        "deploy.model": cfg.deploy.model,
    }
    return {key: source for key, source in sources.items() if names_a_local_path(source)}


def deploy_dev_source(cfg: PipelineConfig) -> dict[str, str]:
    """The one data source a deploy reads, by key: data.squad_dev when set, else data.squad (its dev split for a
    hub dataset or the synthetic world; a local file is then the dev file itself)."""
    return {"data.squad_dev": cfg.data.squad_dev} if cfg.data.squad_dev else {"data.squad": cfg.data.squad}


def check_local_files(cfg: PipelineConfig) -> None:
    """Stop with the key and the path when a local file or folder the config names does not exist. Called when the
    DAG is planned, whatever outputs already exist."""
    missing = [f"{key}: {path}" for key, path in configured_local_paths(cfg).items() if not Path(path).exists()]
    if missing:
        raise MissingSourceError("no such file or directory: " + "; ".join(missing))


def names_a_local_path(source: str | None) -> bool:
    """True when a config value names a file or folder here, not 'synthetic', 'squad_contexts' or a hub name."""
    if not source or source in ("synthetic", "squad_contexts"):
        return False
    return looks_like_a_path(source) or source.endswith(".txt") or Path(source).exists()


def looks_like_a_path(source: str) -> bool:
    """True when `source` is meant as a file, so a missing one is "file not found" rather than a hub lookup.

    Hub names are "name" or "owner/name", so one "/" alone does not make a path.
    """
    return (
        source.endswith((".json", ".jsonl"))
        or source.startswith(("/", "./", "../", "~"))
        or "\\" in source
        or source.count("/") > 1
    )
