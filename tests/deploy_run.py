"""docs/deploy.md's offline command, run exactly as written in a copy of the project with ./my-qa-model (a small QA
model trained elsewhere, as a user brings one) and ./my-dev.json (a part of the real SQuAD 2.0 dev sample) beside
it. It runs once per test run (tests/conftest.py: the `documented_offline_deploy` fixture); tests/test_deploy.py
checks what it built."""

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.documented_commands import documented_commands, project_copy
from tests.processes import run


@dataclass
class DeployRun:
    project: Path  # the copy of the project the command ran in
    command: str  # as docs/deploy.md writes it
    environment: dict[str, str]
    completed: subprocess.CompletedProcess


# Tiny configs of each model type a deploy takes (2 layers, 32 wide, 512 positions as a real model has), with each
# type's own knobs at the shape of its released models: ELECTRA-small's embeddings narrower than its layers, and
# MobileBERT's bottlenecks, its narrow trigram embeddings, NoNorm and stacked feed-forward networks (their defaults).
TINY_QA_CONFIGS = {
    "bert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
    "electra": dict(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64),
    "mobilebert": dict(embedding_size=16, hidden_size=32, intra_bottleneck_size=16, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=32, num_feedforward_networks=2),
}


def tiny_qa_model_with_its_own_vocabulary(folder: Path, dev_file: Path, model_type: str = "bert",
                                          fine_tune_steps: int = 0) -> None:
    """A small QA model of `model_type` (random weights, then `fine_tune_steps` steps on the dev file's questions
    past the first 60) with a WordPiece vocabulary trained on the dev file's text: a model trained elsewhere, as a
    user brings one."""
    import transformers
    from tokenizers import BertWordPieceTokenizer
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    records = json.loads(dev_file.read_text())["data"]
    texts = [paragraph["context"] for article in records for paragraph in article["paragraphs"]]
    texts += [qa["question"] for article in records for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(texts, vocab_size=800)
    folder.mkdir(parents=True)
    trainer.save_model(str(folder))
    tokenizer_class = {"bert": transformers.BertTokenizerFast, "electra": transformers.ElectraTokenizerFast,
                       "mobilebert": transformers.MobileBertTokenizerFast}[model_type]
    tokenizer = tokenizer_class(vocab_file=str(folder / "vocab.txt"))
    tokenizer.save_pretrained(folder)
    config = AutoConfig.for_model(model_type, vocab_size=tokenizer.vocab_size, max_position_embeddings=512,
                                  **TINY_QA_CONFIGS[model_type])
    model = AutoModelForQuestionAnswering.from_config(config)
    if fine_tune_steps:
        fine_tune_briefly(model, tokenizer, dev_file, fine_tune_steps)
    model.save_pretrained(folder)


def fine_tune_briefly(model, tokenizer, dev_file: Path, steps: int, batch_size: int = 16) -> None:
    """`steps` AdamW steps on random batches of the dev file's windows past its first 60 questions (the ones a
    test scores): logits with some margin, as a trained model has, not a random model's near-flat ones."""
    import torch

    from pipeline.data import qa_windows
    from pipeline.data.squad_loading import load_squad
    from pipeline.plan.config import SquadConfig

    examples, _ = load_squad(str(dev_file))
    windows = qa_windows.train_window_tensors(examples.select(range(60, len(examples))), tokenizer,
                                      SquadConfig(max_seq_length=128, doc_stride=32))
    holding_the_answer = windows["start_positions"] > 0  # the others teach only "point at [CLS]"
    windows = {name: tensor[holding_the_answer] for name, tensor in windows.items()}
    # MobileBERT (NoNorm, bottlenecks) barely learns in 60 steps at the others' rate (its answers stay single
    # sub-words); at 1e-2 it answers with spans, as ELECTRA does at 3e-3.
    learning_rate = 1e-2 if model.config.model_type == "mobilebert" else 3e-3
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        rows = torch.randint(len(windows["input_ids"]), (batch_size,), generator=generator)
        batch = {name: tensor[rows] for name, tensor in windows.items()}
        loss = model(**qa_windows.model_inputs(batch, model), start_positions=batch["start_positions"],
                     end_positions=batch["end_positions"]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def write_every_nth_paragraph(dev_sample: Path, out: Path, n: int) -> None:
    """A SQuAD file of every `n`th paragraph of each article of `dev_sample`: about 1/n of its questions, of all
    its articles."""
    squad = json.loads(dev_sample.read_text())
    articles = [{**article, "paragraphs": article["paragraphs"][::n]} for article in squad["data"]]
    out.write_text(json.dumps({**squad, "data": articles}))


def answerable_questions(squad_file: Path) -> int:
    """The questions of a SQuAD file that have an answer: those a deploy scores (SQuAD 2.0's others are left out)."""
    articles = json.loads(squad_file.read_text())["data"]
    return sum(not qa.get("is_impossible", False)
               for article in articles for paragraph in article["paragraphs"] for qa in paragraph["qas"])


def prepare_documented_deploy(base: Path, dev_sample: Path) -> tuple[Path, str, dict[str, str]]:
    """The project copy with ./my-qa-model and ./my-dev.json, the documented command, and its environment."""
    import torch

    (_, command), = [(name, line) for name, line in documented_commands(".venv/bin/snakemake deploy")
                     if "squad_dev: ./my-dev.json" in line]
    project = project_copy(base / "project")
    # A user's own dev file: an eighth of the real sample's paragraphs, 67 answerable questions that the deploy splits
    # by paragraph between the gates and the int8 tuning (every stage scores every dev question: more would multiply
    # the work and test nothing more).
    write_every_nth_paragraph(dev_sample, project / "my-dev.json", 8)
    with torch.random.fork_rng():  # made at the session's start: the tests' random stream is left as it was
        tiny_qa_model_with_its_own_vocabulary(project / "my-qa-model", dev_sample)
    # No hub, and no Chromium (whatever this machine has): benchmark_web is planned and runs without it.
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                   "CHROMIUM_PATH": str(base / "no-chromium")}
    return project, command, environment


def run_documented_deploy(project: Path, command: str, environment: dict[str, str]) -> DeployRun:
    """The command in the project copy, in a process group of its own (tests/processes.py: run)."""
    completed = run(command, timeout=900, shell=True, cwd=project, env=environment)
    return DeployRun(project, command, environment, completed)
