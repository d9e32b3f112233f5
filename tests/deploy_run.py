"""docs/deploy.md's offline command, run exactly as written in a copy of the project with ./my-qa-model (a small QA
model trained elsewhere, as a user brings one) and ./my-dev.json (the real SQuAD 2.0 dev sample) beside it. It runs
once for the session, in the background from the session's start (tests/background.py, tests/conftest.py);
tests/test_deploy.py checks what it built."""

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tests.documented_commands import documented_commands, project_copy
from tests.stage_fixtures import tiny_bert_config


@dataclass
class DeployRun:
    project: Path  # the copy of the project the command ran in
    command: str  # as docs/deploy.md writes it
    environment: dict[str, str]
    completed: subprocess.CompletedProcess


def tiny_qa_model_with_its_own_vocabulary(folder: Path, dev_file: Path) -> None:
    """A small BERT QA model (random weights, 512 positions as a real one has) with a WordPiece vocabulary
    trained on the dev file's text: a model trained elsewhere, as a user brings one."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertForQuestionAnswering, BertTokenizerFast

    records = json.loads(dev_file.read_text())["data"]
    texts = [paragraph["context"] for article in records for paragraph in article["paragraphs"]]
    texts += [qa["question"] for article in records for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(texts, vocab_size=800)
    folder.mkdir(parents=True)
    trainer.save_model(str(folder))
    tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"))
    tokenizer.save_pretrained(folder)
    config = tiny_bert_config(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                              intermediate_size=64, max_position_embeddings=512)
    BertForQuestionAnswering(config).save_pretrained(folder)


def prepare_documented_deploy(base: Path, dev_sample: Path) -> tuple[Path, str, dict[str, str]]:
    """The project copy with ./my-qa-model and ./my-dev.json, the documented command, and its environment."""
    import torch

    (_, command), = [(name, line) for name, line in documented_commands(".venv/bin/snakemake deploy")
                     if "squad_dev: ./my-dev.json" in line]
    project = project_copy(base / "project")
    (project / "my-dev.json").symlink_to(dev_sample)  # read where it is, never copied
    with torch.random.fork_rng():  # made at the session's start: the tests' random stream is left as it was
        tiny_qa_model_with_its_own_vocabulary(project / "my-qa-model", dev_sample)
    # No hub, and no Chromium (whatever this machine has): benchmark_web is planned and runs without it.
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                   "CHROMIUM_PATH": str(base / "no-chromium")}
    return project, command, environment


def run_documented_deploy(project: Path, command: str, environment: dict[str, str], *,
                          run: Callable[..., subprocess.CompletedProcess], start: Callable) -> DeployRun:
    """The command in the project copy, through `run` (tests/background.py: InBackground)."""
    completed = run(command, timeout=900, shell=True, cwd=project, env=environment)
    return DeployRun(project, command, environment, completed)
