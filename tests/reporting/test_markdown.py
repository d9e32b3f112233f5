"""pipeline/reporting/markdown.py: the report's int8 search section says what was chosen and what decided it; a row
that is another row's run says so."""

from pipeline.reporting import markdown

RECIPE = {"graph": "plain", "format": "qoperator", "per_channel": False, "attention_int8": False}


def search(choice_extra: dict) -> dict:
    timing = {"p50": 266.0, "p90": 268.0}
    return {
        "sequence_length": 384, "threads": 1, "runs": 5, "rejected_by_gates": {},
        "candidates": {"int8": {"recipe": RECIPE, "latency_ms": timing}},
        "session_options": {"int8|default": {"recipe": "int8", "session_options": "default",
                                             "latency_ms": {"p50": 266.9, "p90": 268.2}},
                            "int8|denormals-as-zero": {"recipe": "int8", "session_options": "denormals-as-zero",
                                                       "latency_ms": timing}},
        "choice": {"recipe": "int8", "session_options": "default", "latency_ms": {"p50": 266.9, "p90": 268.2},
                   **choice_extra},
        "runner_up": None,
    }


def test_the_choice_names_what_decided_it():
    why = ("a tie: denormals-as-zero 266.0 ms against 266.9 ms with the default options, within 5%, so the default "
           "options")
    lines = markdown.search_section(search({"decided_by": why}))
    assert f"Chosen: **int8** with session options 'default' (p50 266.9 ms; {why})." in lines


def test_a_search_recorded_before_the_tie_rule_still_renders():
    assert "Chosen: **int8** with session options 'default' (p50 266.9 ms)." in markdown.search_section(search({}))


def test_a_row_that_is_another_rows_run_says_so_and_the_summary_schema_takes_it():
    import json

    import jsonschema

    from pipeline.plan.config import BenchmarkConfig, PipelineConfig
    from pipeline.reporting.summary import SUMMARY_FIELDS
    from tests.paths import PROJECT_ROOT

    latency = {"seq384": {"threads1": {"p50": 274.5, "p90": 288.7}}}
    naive = {key: None for key in SUMMARY_FIELDS} | {
        "name": "distilbert/onnx-int8", "model": "distilbert", "format": "onnx", "precision": "int8",
        "path": "full_size/distilbert/onnx/int8/model.onnx", "size_mb": 66.9, "latency_ms": latency,
        "peak_rss_mib": 310.0}
    optimized = naive | {"name": "distilbert/onnx-int8-optimized", "precision": "int8-optimized", "recipe": "int8",
                         "session_options": "default", "same_run_as": "distilbert/onnx-int8"}
    table = markdown.artifact_table([naive, optimized], PipelineConfig(benchmark=BenchmarkConfig(
        sequence_lengths=[384], threads=[1])))
    assert "| distilbert/onnx-int8 | 66.900 |" in table
    assert "| distilbert/onnx-int8-optimized (the same run as distilbert/onnx-int8) | 66.900 |" in table
    schema = json.loads((PROJECT_ROOT / "configs" / "summary.schema.json").read_text())
    jsonschema.validate(optimized, {**schema, "$ref": "#/definitions/artifact"})
