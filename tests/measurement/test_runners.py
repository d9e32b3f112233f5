"""pipeline/measurement/runners.py: an artifact run once on a batch-1 input, and its latency at every length and
thread count (timings are never asserted on: only who runs and the shapes)."""

from pipeline.measurement.runners import latency_table, runner, torch_inputs
from pipeline.plan.config import BenchmarkConfig


def test_the_latency_table_has_every_thread_count_and_null_beyond_the_model_positions(tiny_int8):
    item = {"name": "tiny", "format": "onnx", "path": str(tiny_int8 / "int8.onnx"), "max_positions": 128,
            "vocab_size": 200, "session_options": "denormals-as-zero"}
    table = latency_table(item, BenchmarkConfig(sequence_lengths=[16, 256], threads=[1, 2], runs=2, warmup=0))
    assert table["seq256"] is None and set(table["seq16"]) == {"threads1", "threads2"}
    assert all(0 < cell["p50"] <= cell["p90"] for cell in table["seq16"].values())


def test_a_pytorch_model_runs_on_the_same_kind_of_input_as_a_graph(tiny_int8):
    from transformers import AutoModelForQuestionAnswering

    inputs = torch_inputs(200, 24)
    assert inputs["input_ids"].shape == (1, 24) and bool(inputs["attention_mask"].all())
    assert int(inputs["input_ids"].min()) >= 5  # past the special tokens, as the ONNX feeds
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_int8 / "pytorch").eval()
    calls = []
    model.register_forward_hook(lambda module, args, output: calls.append(output.start_logits.shape))
    item = {"format": "pytorch", "vocab_size": 200}
    runner(item, 24, 1, model)()
    assert calls == [(1, 24)]
