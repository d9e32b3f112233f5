"""The synthetic world: deterministic, well-formed SQuAD, same-kind distractors, and a dev split that cannot be memorised."""

import json
import re
from random import Random

import pytest

from pipeline.data.synthetic import (
    CONTEXT_WORD_RANGE,
    FACT_KINDS,
    FACT_TYPES,
    QUESTION_PARAPHRASES,
    askable_spans,
    SyntheticWorldSpec,
    build_entity_pools,
    build_paragraph,
    generate_world,
    write_world,
)

SMALL_SPEC = SyntheticWorldSpec(seed=5, n_train_contexts=40, n_dev_contexts=20, n_corpus_paragraphs=30)

# Capitalised words that can open a question; any other capitalised word is part of a name.
QUESTION_OPENERS = {"Where", "When", "What", "Which", "Who", "Whom", "How", "In", "On", "The", "For", "Under", "From"}


@pytest.fixture(scope="module")
def world() -> dict:
    return generate_world(SMALL_SPEC)


def all_qas(squad: dict):
    """(context, qa) for every question of a SQuAD v1.1 dict."""
    for article in squad["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                yield paragraph["context"], qa


def question_shape(question: str) -> str:
    """The question with names blanked: "Where was Tomas Kell born?" -> "Where was <N> born?"."""
    words = [
        word if word in QUESTION_OPENERS or not word[:1].isupper() else "<N>"
        for word in re.findall(r"[\w,]+|'s|\?", question)
    ]
    return re.sub(r"(<N> )+<N>", "<N>", " ".join(words))


def template_shape(template: str) -> str:
    return question_shape(template.format(p="Some Person", org="Some Glass Company", spouse="Other Person"))


def test_same_spec_gives_the_same_world_and_another_seed_a_different_one(world):
    assert json.dumps(generate_world(SMALL_SPEC)) == json.dumps(world)
    other = generate_world(SyntheticWorldSpec(seed=6, n_train_contexts=40, n_dev_contexts=20, n_corpus_paragraphs=30))
    assert json.dumps(other) != json.dumps(world)


def test_every_answer_start_points_at_an_answer_that_occurs_once(world):
    for split in ("train", "dev"):
        for context, qa in all_qas(world[split]):
            (answer,) = qa["answers"]
            start, text = answer["answer_start"], answer["text"]
            assert context[start:start + len(text)] == text
            assert context.count(text) == 1, (text, context)


def test_question_ids_are_unique_and_name_their_split_and_context(world):
    ids = [qa["id"] for split in ("train", "dev") for _, qa in all_qas(world[split])]
    assert len(ids) == len(set(ids))
    assert ids[0] == "syn-train-000000-00"
    assert all(re.fullmatch(r"syn-(train|dev)-\d{6}-\d{2}", qa_id) for qa_id in ids)


def test_contexts_are_multi_sentence_with_six_to_ten_questions(world):
    for split in ("train", "dev"):
        assert world[split]["version"] == "1.1"
        for article in world[split]["data"]:
            (paragraph,) = article["paragraphs"]
            assert CONTEXT_WORD_RANGE[0] <= len(paragraph["context"].split()) <= CONTEXT_WORD_RANGE[1]
            assert paragraph["context"].count(". ") >= 3
            assert 6 <= len(paragraph["qas"]) <= 10


def test_the_other_people_in_a_paragraph_never_share_a_name_with_the_main_person():
    pools = build_entity_pools(seed=1)["train"]
    rng = Random(0)
    for _ in range(50):
        person = build_paragraph(rng, pools).person
        words = [person.first_name, person.surname] + [w for name in person.other_people() for w in name.split()]
        assert len(words) == len(set(words))


def test_every_asked_fact_has_a_same_kind_distractor_in_its_context():
    pools = build_entity_pools(seed=1)["train"]
    rng = Random(3)
    for _ in range(100):
        paragraph = build_paragraph(rng, pools)
        kinds = [FACT_KINDS[span.fact_type] for span in paragraph.answer_spans]
        for span in askable_spans(paragraph):
            assert kinds.count(FACT_KINDS[span.fact_type]) >= 2, (span, paragraph.context)


def test_dev_names_are_held_out_from_train(world):
    pools = build_entity_pools(SMALL_SPEC.seed)
    assert not pools["dev"].all_names() & pools["train"].all_names()
    assert not pools["dev"].all_names() & pools["corpus_only"].all_names()

    train_words = {word for context, _ in all_qas(world["train"]) for word in re.findall(r"[A-Za-z]+", context)}
    dev_answer_names = {
        word
        for _, qa in all_qas(world["dev"])
        for word in re.findall(r"[A-Z][a-z]+", qa["answers"][0]["text"])
        if word in pools["dev"].all_names()
    }
    assert dev_answer_names, "dev answers should include invented names"
    assert not dev_answer_names & train_words


def test_train_uses_only_train_paraphrases_and_dev_adds_held_out_ones(world):
    train_templates = {template_shape(t) for p in QUESTION_PARAPHRASES.values() for t in p.train}
    held_out_templates = {template_shape(t) for p in QUESTION_PARAPHRASES.values() for t in p.held_out}
    assert not train_templates & held_out_templates

    train_shapes = {question_shape(qa["question"]) for _, qa in all_qas(world["train"])}
    dev_shapes = {question_shape(qa["question"]) for _, qa in all_qas(world["dev"])}
    assert train_shapes <= train_templates
    assert dev_shapes - train_shapes, "dev should ask some questions in paraphrases train never saw"
    assert dev_shapes & train_shapes, "dev should also ask in the train paraphrases"
    assert 0.1 < world["stats"]["dev_held_out_paraphrase_fraction"] < 0.6


def test_every_fact_type_is_asked_in_both_splits(world):
    assert len(FACT_TYPES) >= 6
    for split in ("train", "dev"):
        asked = world["stats"][f"{split}_questions_by_fact_type"]
        assert set(asked) == set(FACT_TYPES), split


def test_corpus_is_one_paragraph_per_line_and_never_states_a_dev_fact(world):
    corpus = world["corpus"]
    assert len(corpus) == SMALL_SPEC.n_corpus_paragraphs
    assert all(line and "\n" not in line for line in corpus)
    dev_contexts = {context for context, _ in all_qas(world["dev"])}
    assert not dev_contexts & set(corpus)
    # Dev names are known words of the corpus (as SQuAD dev names are in BERT's pretraining text) ...
    dev_pools = build_entity_pools(SMALL_SPEC.seed)["dev"]
    corpus_words = {word for line in corpus for word in re.findall(r"[A-Za-z]+", line)}
    assert corpus_words & dev_pools.all_names()
    # ... but no dev person (first name + surname) is ever described there.
    dev_people = {
        f"{first} {last}"
        for context, _ in all_qas(world["dev"])
        for first, last in re.findall(r"([A-Z][a-z]+) ([A-Z][a-z]+)", context)
        if first in dev_pools.first_names and last in dev_pools.surnames
    }
    assert dev_people
    assert not any(person in line for person in dev_people for line in corpus)


def test_stats_count_what_was_generated(world):
    stats = world["stats"]
    assert stats["n_train_contexts"] == SMALL_SPEC.n_train_contexts
    assert stats["n_dev_contexts"] == SMALL_SPEC.n_dev_contexts
    assert stats["n_train_questions"] == len(list(all_qas(world["train"])))
    assert stats["n_dev_questions"] == len(list(all_qas(world["dev"])))
    assert stats["n_corpus_paragraphs"] == len(world["corpus"])
    assert stats["n_corpus_words"] == sum(len(line.split()) for line in world["corpus"])


def test_write_world_writes_three_files_that_round_trip_and_no_temp_files(tmp_path):
    out_dir = tmp_path / "world"
    stats = write_world(SMALL_SPEC, out_dir)

    assert sorted(p.name for p in out_dir.iterdir()) == ["corpus.txt", "dev.json", "train.json"]
    world = generate_world(SMALL_SPEC)
    assert json.loads((out_dir / "train.json").read_text()) == world["train"]
    assert json.loads((out_dir / "dev.json").read_text()) == world["dev"]
    assert (out_dir / "corpus.txt").read_text().splitlines() == world["corpus"]
    assert stats == world["stats"]


@pytest.mark.parametrize(
    "bad_field",
    [{"n_train_contexts": 0}, {"n_dev_contexts": -1}, {"n_corpus_paragraphs": 0}],
)
def test_invalid_specs_fail_naming_the_field(bad_field):
    with pytest.raises(ValueError, match=next(iter(bad_field))):
        SyntheticWorldSpec(**bad_field)


def test_corpus_asks_questions_in_held_out_wordings_too(world):
    question_lines = [line for line in world["corpus"] if line.endswith("?")]
    assert 0.3 * len(world["corpus"]) < len(question_lines) < 0.9 * len(world["corpus"])
    held_out_patterns = [
        re.escape(template).replace(r"\{p\}", ".+").replace(r"\{org\}", ".+").replace(r"\{spouse\}", ".+") + "$"
        for paraphrases in QUESTION_PARAPHRASES.values() for template in paraphrases.held_out
    ]
    assert any(re.search(pattern, line) for pattern in held_out_patterns for line in question_lines)
