"""Stage teacher: a teacher fine-tuned by the real stage answers dev questions through transformers.pipeline."""

import json
from pathlib import Path

import transformers
from transformers import AutoTokenizer, BertForMaskedLM

from pipeline.stages import prepare_data, teacher, tokenizer
from pipeline.stages.teacher import teacher_config_from_scratch
from tests.stage_fixtures import tiny_config


def keep_questions_about(data_dir: Path, word: str) -> None:
    """Restrict train and dev to one fact type, so that seconds of training learn it."""
    for split in ("train", "dev"):
        path = data_dir / f"{split}.jsonl"
        records = [line for line in path.read_text().splitlines() if word in json.loads(line)["question"]]
        path.write_text("\n".join(records) + "\n")


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
