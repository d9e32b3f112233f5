"""The dev set's split into gated and tuning questions (pipeline/export/dev_split.py)."""

import pytest

from pipeline.export.dev_split import DevSplitError, split_dev


def paragraphs(*sizes: int) -> list[str]:
    """Contexts of consecutive questions: `sizes[i]` questions on paragraph i."""
    return [f"paragraph {index}" for index, size in enumerate(sizes) for _ in range(size)]


def assert_no_paragraph_on_both_sides(split, contexts):
    assert not {contexts[row] for row in split.gated_rows} & {contexts[row] for row in split.tuning_rows}


def test_a_dev_set_large_enough_gates_the_first_questions_and_tunes_on_the_next_other_paragraphs():
    contexts = paragraphs(*[10] * 50)  # 500 questions
    split = split_dev(contexts, dev_questions=205, tuning_questions=100, tuning_share=0.5, min_questions=20,
                      source="data.squad_dev dev.json")
    assert split.gated_rows == list(range(205)) and split.tuning_rows == list(range(210, 310))
    assert "the first 205" in split.rule
    assert_no_paragraph_on_both_sides(split, contexts)


def test_a_small_dev_set_tunes_on_its_last_whole_paragraphs_by_the_tuning_share():
    contexts = paragraphs(*[8] * 29)  # 232 questions, as a user's small dev file
    split = split_dev(contexts, dev_questions=1000, tuning_questions=200, tuning_share=0.5, min_questions=20,
                      source="data.squad_dev dev.json")
    assert split.n_tuning == 112 and split.n_gated == 120  # 14 whole paragraphs: as near 116 as 15 would be
    assert split.gated_rows == list(range(120)) and split.tuning_rows == list(range(120, 232))
    assert "export.gates.tuning_share 0.5" in split.rule and split.record()["gated"] == 120
    assert_no_paragraph_on_both_sides(split, contexts)


def test_questions_of_a_paragraph_need_not_be_consecutive():
    contexts = [f"paragraph {row % 6}" for row in range(48)]  # six paragraphs, their questions interleaved
    split = split_dev(contexts, dev_questions=1000, tuning_questions=200, tuning_share=0.5, min_questions=8,
                      source="x")
    assert split.n_gated == split.n_tuning == 24
    assert_no_paragraph_on_both_sides(split, contexts)


def test_the_gated_part_is_capped_at_dev_questions():
    contexts = paragraphs(*[10] * 20)  # 200 questions, fewer than 120 gated + 100 tuning
    split = split_dev(contexts, dev_questions=60, tuning_questions=100, tuning_share=0.5, min_questions=20,
                      source="x")
    assert split.n_tuning == 100 and split.gated_rows == list(range(60))


@pytest.mark.parametrize("contexts", [[], paragraphs(1), paragraphs(39), paragraphs(60)])
def test_too_few_dev_questions_or_paragraphs_is_one_line_naming_the_key_and_the_count(contexts):
    with pytest.raises(DevSplitError) as refused:
        split_dev(contexts, 1000, 200, 0.5, 20, "data.squad_dev ./my-dev.json")
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"data.squad_dev ./my-dev.json: {len(contexts)} answerable dev")
    assert "at least 40" in message
