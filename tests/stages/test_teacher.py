"""Stage teacher: a teacher fine-tuned by the real stage answers dev questions through transformers.pipeline."""

import json
from pathlib import Path

import pytest
import transformers
from transformers import AutoTokenizer, BertForMaskedLM

from pipeline.outputs.manifests import write_manifest
from pipeline.stages import prepare_data, teacher, tokenize_corpus, tokenizer
from pipeline.stages.teacher import teacher_config_from_scratch
from tests.stage_fixtures import tiny_config


def keep_questions_about(data_dir: Path, word: str) -> None:
    """Restrict train and dev to one fact type, so that seconds of training learn it."""
    for split in ("train", "dev"):
        path = data_dir / f"{split}.jsonl"
        records = [line for line in path.read_text().splitlines() if word in json.loads(line)["question"]]
        path.write_text("\n".join(records) + "\n")
    write_manifest(data_dir)  # the folder changed on purpose: its manifest must describe it again


def test_fine_tuned_teacher_answers_dev_questions_in_the_transformers_qa_pipeline(tmp_path):
    cfg = tiny_config(
        data={"synthetic": {"n_train_contexts": 400, "n_dev_contexts": 30}},
        teacher={"finetune": {"max_steps": 150, "batch_size": 16, "learning_rate": 2e-3, "checkpoint_every": 1000}},
    )
    data, tok, untrained, out = (tmp_path / name for name in ("data", "tokenizer", "untrained", "teacher"))
    prepare_data.run(cfg, data)
    # "How many children ...?": the answer is the paragraph's only number word, learnable without pretraining.
    keep_questions_about(data, "children")
    tokenizer.run(cfg, data, tok)
    BertForMaskedLM(teacher_config_from_scratch(cfg, AutoTokenizer.from_pretrained(tok))).save_pretrained(untrained)
    metrics = teacher.run_finetune(cfg, data, tok, untrained, out, tmp_path / "work")

    qa_pipeline = transformers.pipeline("question-answering", model=str(out), device="cpu")
    records = [json.loads(line) for line in (data / "dev.jsonl").read_text().splitlines()]
    stage_predictions = json.loads((out / "predictions.json").read_text())
    assert len(records) >= 10
    correct = 0
    for record in records:
        answer = qa_pipeline(question=record["question"], context=record["context"])
        assert record["context"][answer["start"]:answer["end"]] == answer["answer"]
        is_correct = answer["answer"] in record["answers"]["text"]
        correct += is_correct
        # Where the stage's own n-best postprocessing is right, the pipeline is too (it differs only by
        # snapping spans to whole words and capping answers at 15 tokens).
        if stage_predictions[record["id"]] in record["answers"]["text"]:
            assert is_correct, (record["question"], answer["answer"], stage_predictions[record["id"]])
    # Dev people are held out from train.
    assert correct >= 0.8 * len(records), (correct, len(records), metrics["exact_match"])


def test_teacher_mlm_loss_is_the_cross_entropy_at_masked_positions_only(tmp_path, monkeypatch):
    # The loss the stage logs at step 1 was computed on the initial model: recompute it by hand from the
    # recorded masked batch, with cross-entropy at the masked positions only (not at every real token).
    import torch

    from pipeline.data import mlm_batches

    cfg = tiny_config(teacher={"architecture": {"dropout": 0.0},
                               "pretrain": {"max_steps": 1, "log_every": 1, "batch_size": 8}})
    data, tok = tmp_path / "data", tmp_path / "tokenizer"
    prepare_data.run(cfg, data)
    tokenizer.run(cfg, data, tok)
    tokenize_corpus.run(cfg, data, tok, tmp_path / "corpus", workers=1)
    recorded = []
    real_mask_tokens = mlm_batches.mask_tokens

    def spy_mask_tokens(input_ids, *args, **kwargs):
        masked, labels = real_mask_tokens(input_ids, *args, **kwargs)
        recorded.append((input_ids, masked, labels))
        return masked, labels

    monkeypatch.setattr(mlm_batches, "mask_tokens", spy_mask_tokens)  # the batch collator masks through it
    teacher.run_pretrain(cfg, tmp_path / "corpus", tok, tmp_path / "out", tmp_path / "work")
    logged = json.loads((tmp_path / "out" / "train_log.jsonl").read_text().splitlines()[0])

    hf_tokenizer = AutoTokenizer.from_pretrained(tok)
    torch.manual_seed(cfg.seed)  # the stage builds its model right after seeding
    initial = BertForMaskedLM(teacher_config_from_scratch(cfg, hf_tokenizer)).eval()
    input_ids, masked, labels = recorded[0]  # the first training batch (later calls score the hold-out)
    attention_mask = (input_ids != hf_tokenizer.pad_token_id).long()
    with torch.no_grad():
        logits = initial(input_ids=masked, attention_mask=attention_mask).logits
    selected = labels != -100
    expected = torch.nn.functional.cross_entropy(logits[selected], labels[selected]).item()
    every_token = torch.nn.functional.cross_entropy(logits[attention_mask.bool()], input_ids[attention_mask.bool()])
    assert 0 < int(selected.sum()) < int(attention_mask.sum())
    assert logged["loss"] == pytest.approx(expected, abs=2e-6)
    assert abs(every_token.item() - expected) > 1e-3  # the check can tell the two apart
