"""Stage prepare_data: SQuAD train/dev and the MLM corpus, validated and written in one layout.

Outputs (in --out-dir): train.jsonl and dev.jsonl (datasets squad columns), dev.json (SQuAD v1.1 layout, for
`python -m pipeline evaluate-predictions`), corpus.txt (one document per line) when the corpus is generated here
('synthetic' or 'squad_contexts'; tokenize_corpus reads other corpora where they are), metrics.json (counts).
With `data.squad: synthetic` the offline world is generated first (synthetic/). A deploy (deploy.model set)
trains nothing: it writes the dev set only (data.squad_dev, or data.squad's dev split), with no training
questions and no corpus.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import datasets

from pipeline.data import synthetic
from pipeline.data.corpus_writer import GENERATED_CORPUS_FILE, corpus_source, iter_documents
from pipeline.data.squad_loading import DataError, HubDatasetError, load_squad
from pipeline.export.dev_split import dev_source as dev_set_name
from pipeline.export.dev_split import split_for
from pipeline.outputs.artifacts import atomic_write_json
from pipeline.outputs.manifests import atomic_output_dir
from pipeline.plan.config import ConfigError, PipelineConfig
from pipeline.plan.data_sources import deploy_dev_source, looks_like_a_path
from pipeline.runtime.squad import whole_column

logger = logging.getLogger(__name__)

# What to set instead of a hub dataset that cannot be loaded (offline, or a machine without network)
OFFLINE_DEV_SET = "offline, give a local SQuAD dev file instead (data.squad_dev: ./my-dev.json)"
OFFLINE_TRAINING_SETS = ("offline, give local SQuAD files instead (data.squad: ./train.json and data.squad_dev: "
                         "./dev.json), or generate them (data.squad: synthetic)")


def _is_local_file(source: str) -> bool:
    """A local file, not a hub name: hub names may hold one "/" ("wikimedia/wikipedia"), see looks_like_a_path."""
    return looks_like_a_path(source) or source.endswith(".txt") or Path(source).exists()


def squad_sources(cfg: PipelineConfig, synthetic_dir: Path) -> tuple[str, str]:
    """(train source, dev source) for load_squad."""
    data = cfg.data
    if data.squad == "synthetic":
        return str(synthetic_dir / "train.json"), str(synthetic_dir / "dev.json")
    if _is_local_file(data.squad):
        if not data.squad_dev:
            raise ConfigError("data.squad_dev: a dev file is required when data.squad is a local file")
        return data.squad, data.squad_dev
    return data.squad, data.squad  # hub dataset: the splits tell train from dev


def write_generated_corpus(cfg: PipelineConfig, synthetic_dir: Path, train: datasets.Dataset, out_dir: Path) -> int:
    """The corpora this stage makes (one document per line in corpus.txt): the synthetic world's, or the unique
    SQuAD training contexts. A local file or a hub corpus is read where it is, by tokenizer and tokenize_corpus.
    Returns the documents written (0 when the corpus is not generated here)."""
    data = cfg.data
    if data.corpus == "synthetic":
        if data.squad != "synthetic":
            raise ConfigError("data.corpus: 'synthetic' needs data.squad: synthetic (use 'squad_contexts' or a file)")
        shutil.copyfile(synthetic_dir / "corpus.txt", out_dir / GENERATED_CORPUS_FILE)
    elif data.corpus == "squad_contexts":
        with (out_dir / GENERATED_CORPUS_FILE).open("w", encoding="utf-8") as handle:
            for context in dict.fromkeys(whole_column(train, "context")):
                handle.write(" ".join(context.split()) + "\n")  # one line per document
    else:
        source = corpus_source(data, out_dir)  # a missing local file stops the run here, with the key named
        # A local corpus without one document stops here too: reading stops at its first document.
        if source.kind != "hub" and next(iter_documents(source), None) is None:
            raise DataError(f"{data.corpus}: the MLM corpus has no non-empty lines")
        return 0
    with (out_dir / GENERATED_CORPUS_FILE).open(encoding="utf-8") as handle:
        return sum(1 for line in handle if line.strip())


def write_jsonl(dataset: datasets.Dataset, path: Path) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for record in dataset:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def to_squad_v1_json(dataset: datasets.Dataset) -> dict:
    """The official v1.1 layout, grouped by title and context, for the evaluate-predictions CLI."""
    articles: dict[str, dict[str, list]] = {}
    for record in dataset:
        paragraphs = articles.setdefault(record["title"], {})
        paragraphs.setdefault(record["context"], []).append(
            {
                "id": record["id"],
                "question": record["question"],
                "answers": [
                    {"text": t, "answer_start": s}
                    for t, s in zip(record["answers"]["text"], record["answers"]["answer_start"])
                ],
            }
        )
    data = [
        {"title": title, "paragraphs": [{"context": c, "qas": qas} for c, qas in paragraphs.items()]}
        for title, paragraphs in articles.items()
    ]
    return {"version": "1.1", "data": data}


def run(cfg: PipelineConfig, out_dir: Path) -> dict:
    if cfg.deploy.model is not None:
        return run_for_deploy(cfg, out_dir)
    with atomic_output_dir(out_dir, cfg) as tmp:
        synthetic_dir = tmp / "synthetic"
        world_stats = {}
        if cfg.data.squad == "synthetic":
            world_stats = synthetic.write_world(world_spec(cfg), synthetic_dir)
        train_source, dev_source = squad_sources(cfg, synthetic_dir)
        dev_key = "data.squad_dev" if cfg.data.squad_dev and dev_source == cfg.data.squad_dev else "data.squad"
        train, train_report = load_configured_squad(cfg, "data.squad", train_source, cfg.data.train_split,
                                                    OFFLINE_TRAINING_SETS)
        dev, dev_report = load_configured_squad(cfg, dev_key, dev_source, cfg.data.dev_split, OFFLINE_TRAINING_SETS)
        if cfg.data.max_train_examples:
            train = train.select(range(min(cfg.data.max_train_examples, len(train))))
        if cfg.data.max_dev_examples:
            dev = dev.select(range(min(cfg.data.max_dev_examples, len(dev))))
        n_corpus_documents = write_generated_corpus(cfg, synthetic_dir, train, tmp)
        # refused here when too small, naming the key
        split = split_for(whole_column(dev, "context"), cfg, dev_set_name(cfg))
        write_jsonl(train, tmp / "train.jsonl")
        write_jsonl(dev, tmp / "dev.jsonl")
        (tmp / "dev.json").write_text(json.dumps(to_squad_v1_json(dev), ensure_ascii=False))
        metrics = {
            "squad_source": cfg.data.squad,
            "n_train_examples": len(train),
            "n_dev_examples": len(dev),
            "n_train_unanswerable_excluded": train_report.n_unanswerable_excluded,
            "n_dev_unanswerable_excluded": dev_report.n_unanswerable_excluded,
            "n_train_skipped": train_report.n_skipped,
            "n_dev_skipped": dev_report.n_skipped,
            "corpus_source": cfg.data.corpus,
            "n_corpus_documents_generated": n_corpus_documents,
            "synthetic_world": world_stats,
            "dev_split": split.record(),
        }
        atomic_write_json(tmp / "metrics.json", metrics)
    logger.info("prepare_data: %s", json.dumps(metrics))
    return metrics


def run_for_deploy(cfg: PipelineConfig, out_dir: Path) -> dict:
    """A deploy trains nothing: only the dev set it is gated and scored on (deploy_dev_source), no training
    questions, no MLM corpus."""
    (key, configured), = deploy_dev_source(cfg).items()
    source = configured
    with atomic_output_dir(out_dir, cfg) as tmp:
        world_stats = {}
        if source == "synthetic":
            world_stats = synthetic.write_world(world_spec(cfg), tmp / "synthetic")
            source = str(tmp / "synthetic" / "dev.json")
        dev, dev_report = load_configured_squad(cfg, key, source, cfg.data.dev_split, OFFLINE_DEV_SET)
        if cfg.data.max_dev_examples:
            dev = dev.select(range(min(cfg.data.max_dev_examples, len(dev))))
        # refused here when too small, naming the key
        split = split_for(whole_column(dev, "context"), cfg, f"{key} {configured}")
        write_jsonl(dev, tmp / "dev.jsonl")
        (tmp / "dev.json").write_text(json.dumps(to_squad_v1_json(dev), ensure_ascii=False))
        metrics = {
            "squad_source": configured, "dev_source_key": key, "deploy": True, "dev_split": split.record(),
            "n_train_examples": 0, "n_dev_examples": len(dev),
            "n_dev_unanswerable_excluded": dev_report.n_unanswerable_excluded, "n_dev_skipped": dev_report.n_skipped,
            "corpus_source": None, "n_corpus_documents_generated": 0, "synthetic_world": world_stats,
        }
        atomic_write_json(tmp / "metrics.json", metrics)
    logger.info("prepare_data (deploy: the dev set only): %s", json.dumps(metrics))
    return metrics


def load_configured_squad(cfg: PipelineConfig, key: str, source: str, split: str, offline_alternative: str):
    """load_squad of the source config `key` names, its errors prefixed with the key; a hub dataset that cannot be
    loaded also says what to set instead (`offline_alternative`)."""
    try:
        return load_squad(source, split=split, on_bad_example=cfg.data.on_bad_example)
    except HubDatasetError as error:
        raise HubDatasetError(f"{key}: {error}; {offline_alternative}") from None
    except DataError as error:
        raise DataError(f"{key}: {error}") from None


def world_spec(cfg: PipelineConfig) -> synthetic.SyntheticWorldSpec:
    return synthetic.SyntheticWorldSpec(
        seed=cfg.data.synthetic.seed,
        n_train_contexts=cfg.data.synthetic.n_train_contexts,
        n_dev_contexts=cfg.data.synthetic.n_dev_contexts,
        n_corpus_paragraphs=cfg.data.synthetic.n_corpus_paragraphs,
    )

