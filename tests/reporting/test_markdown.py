"""pipeline/reporting/markdown.py: the report's int8 search section says what was chosen and what decided it."""

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
