"""A question's logits do not depend on the questions scored with it (pipeline/runtime/answering.py
question_batches): under a dynamic int8 graph, whose activation scales span the whole input, the answerer and the
gates run each question on its own windows, as an app answering one question does."""

import json

import numpy as np
import onnx
import onnxruntime

from pipeline.runtime import answering


def dev_examples(data_dir, count):
    records = [json.loads(line) for line in (data_dir / "dev.jsonl").read_text().splitlines()[:count]]
    return [{"id": r["id"], "question": r["question"], "context": r["context"]} for r in records]


def logits_by_question(answerer, examples):
    windows = answerer.windows(examples)
    starts, ends = answerer.window_logits(windows)
    found = {}
    for row, qid in enumerate(windows.example_ids):
        found.setdefault(qid, []).append((starts[row], ends[row]))
    return found


def test_a_question_scores_the_same_alone_first_last_or_among_others_under_dynamic_int8(exported_student):
    graph = exported_student["quantized"] / "int8" / "model.onnx"  # quantize_dynamic: DynamicQuantizeLinear
    answerer = answering.QuestionAnswerer.with_squad_settings(graph, graph.parent / "tokenizer.json",
                                                            exported_student["cfg"].squad, threads=1)
    assert any(node.op_type == "DynamicQuantizeLinear" for node in onnx.load(str(graph)).graph.node)
    examples = dev_examples(exported_student["data"], 12)
    together = logits_by_question(answerer, examples)
    for order in (examples, examples[::-1], examples[5:] + examples[:5]):
        assert_same(logits_by_question(answerer, order), together)
    for example in examples:
        alone = logits_by_question(answerer, [example])
        assert_same(alone, {example["id"]: together[example["id"]]})
        assert answerer.predict([example]) == {example["id"]: answerer.predict(examples)[example["id"]]}


def test_batching_other_questions_together_would_change_the_logits(exported_student):
    """Why the rule exists: the same windows run as one padded batch of several questions give other logits."""
    graph = exported_student["quantized"] / "int8" / "model.onnx"
    answerer = answering.QuestionAnswerer.with_squad_settings(graph, graph.parent / "tokenizer.json",
                                                            exported_student["cfg"].squad, threads=1)
    windows = answerer.windows(dev_examples(exported_student["data"], 12))
    own = answerer.window_logits(windows)[0]
    session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    length = int(windows.attention_mask.sum(axis=1).max())
    feed = {i.name: getattr(windows, i.name)[:, :length].astype(np.int64) for i in session.get_inputs()}
    mixed = session.run(["start_logits"], feed)[0]
    mask = windows.attention_mask[:, :length].astype(bool)
    assert np.abs(mixed[mask] - own[:, :length][mask]).max() > 0


def assert_same(found, expected):
    assert set(found) == set(expected)
    for qid, rows in expected.items():
        assert len(found[qid]) == len(rows)
        for (start, end), (start_expected, end_expected) in zip(found[qid], rows):
            np.testing.assert_array_equal(start, start_expected)
            np.testing.assert_array_equal(end, end_expected)
