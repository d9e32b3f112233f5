"""pipeline/measurement/latency.py, the one timer: calls taken in turn, percentiles, and the ranking every latency-based choice
uses. Timings are never asserted on (speed goes in benchmarks); what is checked is who runs when, and the shapes."""

from pipeline.measurement.latency import (compare_latency, fastest_first, ranked_profile, time_calls, time_in_blocks,
                                          time_in_turn)


def test_callables_are_timed_in_turn_after_untimed_rounds():
    calls = []
    timings = time_in_turn({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, runs=3, warmup=2)
    assert calls == ["a", "b"] * 5  # 2 warm-up rounds, then 3 timed ones, each round a then b
    assert set(timings) == {"a", "b"}
    assert all(0 <= cell["p50"] <= cell["p90"] and set(cell) == {"p50", "p90"} for cell in timings.values())


def test_runtimes_with_thread_pools_alternate_by_blocks_each_after_a_pause_and_an_untimed_run(monkeypatch):
    import pipeline.measurement.latency as latency

    calls, pauses = [], []
    monkeypatch.setattr(latency.time, "sleep", lambda seconds: (pauses.append(seconds), calls.append("pause")))
    timings = time_in_blocks({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, runs=7, warmup=1,
                             block=3, settle_s=0.25)
    # warm-up round, then blocks of 3, 3 and 1 timed runs, each after a pause and one untimed run
    block = lambda name, timed: ["pause", name] + [name] * timed  # noqa: E731
    assert calls == (["a", "b"] + block("a", 3) + block("b", 3) + block("a", 3) + block("b", 3)
                     + block("a", 1) + block("b", 1))
    assert pauses == [0.25] * 6
    assert all(0 <= cell["p50"] <= cell["p90"] and set(cell) == {"p50", "p90"} for cell in timings.values())


def test_one_callable_is_timed_alone():
    calls = []
    cell = time_calls(lambda: calls.append(1), runs=4, warmup=1)
    assert len(calls) == 5 and 0 <= cell["p50"] <= cell["p90"]


def test_a_profile_keeps_its_largest_operators_per_run_with_their_share_of_the_total():
    rows = ranked_profile({"small": 1.0, "large": 6.0, "middle": 3.0}, runs=2, rows=2)
    assert rows == [{"op": "large", "ms_per_run": 3.0, "share": 0.6}, {"op": "middle", "ms_per_run": 1.5, "share": 0.3}]


def test_the_ranking_is_by_median_and_keeps_the_order_of_equal_ones():
    timings = {"slow": {"p50": 3.0, "p90": 3.1}, "tie-first": {"p50": 1.0, "p90": 9.0},
               "tie-second": {"p50": 1.0, "p90": 1.0}, "middle": {"p50": 2.0, "p90": 2.0}}
    assert fastest_first(timings) == ["tie-first", "tie-second", "middle", "slow"]
    assert fastest_first({}) == []


def test_onnx_graphs_are_compared_on_batch_1_feeds_with_their_run_count(tmp_path):
    from transformers import DistilBertConfig, DistilBertForQuestionAnswering

    from pipeline.export import onnx_graph

    DistilBertForQuestionAnswering(DistilBertConfig(vocab_size=100, dim=16, n_layers=1, n_heads=2, hidden_dim=32,
                                                    max_position_embeddings=64)).save_pretrained(tmp_path / "pytorch")
    onnx_graph.export_fp32(tmp_path / "pytorch", tmp_path / "fp32", None)
    graph = tmp_path / "fp32" / "model.onnx"
    timings = compare_latency({"default": graph, "denormals": graph}, 16, 100, runs=3, warmup=1,
                              option_sets={"denormals": "denormals-as-zero"})
    assert list(timings) == ["default", "denormals"]
    assert all(cell["runs"] == 3 and 0 < cell["p50"] <= cell["p90"] for cell in timings.values())


def test_session_option_sets_change_speed_settings_not_answers(tiny_int8):
    import numpy as np

    from pipeline.measurement.latency import SESSION_OPTIONS, onnx_session, synthetic_feed

    outputs = {}
    for option_set in SESSION_OPTIONS:
        session = onnx_session(tiny_int8 / "int8.onnx", 1, option_set)
        outputs[option_set] = session.run(None, synthetic_feed(session, 32, 200))
    for start, end in outputs.values():
        assert np.allclose(start, outputs["default"][0], atol=1e-5) and np.allclose(end, outputs["default"][1], atol=1e-5)
