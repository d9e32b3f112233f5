"""The offline synthetic world: SQuAD v1.1-format questions about invented people, plus an MLM corpus.

Every paragraph describes several invented people with facts *of the same kind* (each born in a
different city, each founding a different company, ...), so a reader has to match the question's
person to the right fact rather than pick "the city in the paragraph". Sentence templates, sentence
order and name references (full name or surname, never pronouns) vary from paragraph to paragraph.

Dev is kept honest in two ways:
  * held-out entities: dev names are invented from the same syllables but drawn from a pool that
    is disjoint from the train pool (checked explicitly);
  * held-out paraphrases: each fact type has question paraphrases that only dev uses; they reuse the
    content words of the train paraphrases ("born", "city", "founded", ...) in new combinations.

Everything is deterministic from `SyntheticWorldSpec.seed`, pure stdlib, and uses its own
`random.Random` streams (one per purpose, seeded by a string so it does not depend on PYTHONHASHSEED).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from random import Random

# ---------------------------------------------------------------------------------------------
# Spec
# ---------------------------------------------------------------------------------------------


@dataclass
class SyntheticWorldSpec:
    """How big the synthetic world is; the same spec always yields the same world."""

    seed: int = 13
    """Seeds every random stream of the world (names, train, dev, corpus)."""
    n_train_contexts: int = 600
    """Paragraphs in train.json; each carries 6-10 questions."""
    n_dev_contexts: int = 120
    """Paragraphs in dev.json, built from held-out names and including held-out paraphrases."""
    n_corpus_paragraphs: int = 3000
    """Lines of corpus.txt for masked-LM pretraining (train-style and fresh names, never dev names)."""
    min_people_per_context: int = 3
    """Fewest main people per paragraph; at least 2 so that every fact has a same-kind distractor."""
    max_people_per_context: int = 5
    """Most main people per paragraph; more than 6 cannot fit the 60-140 word paragraphs."""

    def __post_init__(self) -> None:
        for name in ("n_train_contexts", "n_dev_contexts", "n_corpus_paragraphs"):
            if getattr(self, name) < 1:
                raise ValueError(f"SyntheticWorldSpec.{name} must be >= 1, got {getattr(self, name)}")
        if not 2 <= self.min_people_per_context <= self.max_people_per_context <= 6:
            raise ValueError(
                "SyntheticWorldSpec needs 2 <= min_people_per_context <= max_people_per_context <= 6, "
                f"got min_people_per_context={self.min_people_per_context}, "
                f"max_people_per_context={self.max_people_per_context}"
            )


# ---------------------------------------------------------------------------------------------
# Vocabulary: invented syllables for names, plain English for everything else
# ---------------------------------------------------------------------------------------------

NAME_ONSETS = (
    "b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
    "br", "dr", "gr", "kr", "tr", "st", "th", "sh", "qu",
)
# Plain vowels listed twice so that diphthongs stay the exception.
NAME_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "u", "ai", "ei", "ou", "ae")
MEDIAL_CODAS = ("", "", "", "l", "n", "r", "s", "m")
FINAL_CODAS = ("", "", "n", "l", "r", "s", "th", "nd", "rn", "x", "m", "ck", "ss", "lt")
NAME_LENGTH_RANGE = (4, 8)

# Each occupation starts with a consonant so templates can say "a {occupation}".
OCCUPATIONS = (
    "marine engineer", "glass blower", "railway surveyor", "court painter", "bridge builder",
    "ship designer", "lens grinder", "map maker", "clock repairer", "stage actor",
    "tax collector", "harbour pilot", "silk weaver", "police inspector", "piano tuner",
    "botanical illustrator", "mining geologist", "newspaper editor", "canal architect",
    "violin maker", "ferry captain", "school teacher", "field surgeon", "weather observer",
    "bookbinder", "stone carver", "tea merchant", "printing press operator", "land surveyor",
    "museum curator", "telegraph operator", "salt trader",
)
COMPANY_KINDS = (
    "Glass Company", "Iron Works", "Shipping Line", "Printing House", "Textile Mill", "Rope Works",
    "Brewery", "Savings Bank", "Clock Company", "Tram Company", "Paper Mill", "Dye Works",
    "Lamp Factory", "Canning Company", "Timber Yard", "Soap Works",
)
MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)

# ---------------------------------------------------------------------------------------------
# Context sentences. A paragraph states the same fact groups for every person in it.
# Placeholders: {name} is a reference to the person (full name on first mention, then full name or
# surname); every other placeholder is an answerable fact whose character span is tracked.
# ---------------------------------------------------------------------------------------------

SENTENCE_TEMPLATES: dict[str, tuple[str, ...]] = {
    "birth": (
        "{name} was born in {birthplace} on {birth_date}.",
        "{name} was born on {birth_date} in {birthplace}.",
        "Born on {birth_date}, {name} was a native of {birthplace}.",
        "{birthplace} is where {name} was born, on {birth_date}.",
        "On {birth_date}, {name} was born in the city of {birthplace}.",
        "The birthplace of {name} was {birthplace}, and {name} was born there on {birth_date}.",
    ),
    # Used instead of separate "birth" and "career" sentences for some people.
    "birth_and_career": (
        "Born in {birthplace} on {birth_date}, {name} worked as a {occupation}.",
        "{name}, a {occupation}, was born on {birth_date} in {birthplace}.",
        "{name} was a {occupation} who was born in {birthplace} on {birth_date}.",
    ),
    "career": (
        "{name} worked as a {occupation}.",
        "By trade, {name} was a {occupation}.",
        "{name} earned a living as a {occupation}.",
        "{name} was a {occupation} by profession.",
        "For most of a long career, {name} was a {occupation}.",
    ),
    "founding": (
        "In {founding_year}, {name} founded the {organisation}, which was based in {org_city}.",
        "{name} founded the {organisation} in {org_city} in {founding_year}.",
        "The {organisation}, based in {org_city}, was founded by {name} in {founding_year}.",
        "{name} established the {organisation} in {founding_year}, and the company was based in {org_city}.",
        "In {org_city}, {name} founded the {organisation} in the year {founding_year}.",
    ),
    # The company is named only in the founding sentence, so the company name stays a unique answer;
    # here it is reached through its founder.
    "workforce": (
        "The company founded by {name} employed {workforce} workers.",
        "{name}'s company employed {workforce} workers.",
        "{name}'s company had a workforce of {workforce} people.",
        "Some {workforce} workers were employed by the company that {name} founded.",
        "{workforce} people worked for the company {name} founded.",
    ),
    "books": (
        "{name} wrote {books} books.",
        "{name} was the author of {books} books.",
        "Over the years, {name} published {books} books.",
        "In total, {books} books were written by {name}.",
    ),
    # The spouse's birthplace is a deliberate near distractor for "Where was {name} born?".
    "marriage": (
        "{name} married {spouse}, who was born in {spouse_birthplace}.",
        "{name} was married to {spouse}, a native of {spouse_birthplace}.",
        "{spouse}, born in {spouse_birthplace}, married {name}.",
        "{name} married {spouse}.",
        "The spouse of {name} was {spouse}.",
    ),
}

# Rough words per sentence of each group, used to pick groups that fit the paragraph length.
GROUP_WORD_COST = {"birth": 10, "career": 7, "founding": 14, "workforce": 9, "books": 7, "marriage": 8}
OPTIONAL_GROUPS = ("career", "founding", "books", "marriage")
CONTEXT_WORD_RANGE = (60, 140)
QUESTIONS_PER_CONTEXT = (6, 10)

# ---------------------------------------------------------------------------------------------
# Questions. {p} is the person (full name or surname); {org} is the person's company.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Paraphrases:
    """Question templates for one fact type: `train` ones appear in both splits, `held_out` only in dev."""

    train: tuple[str, ...]
    held_out: tuple[str, ...]


QUESTION_PARAPHRASES: dict[str, Paraphrases] = {
    "birthplace": Paraphrases(
        train=("Where was {p} born?", "In which city was {p} born?",
               "What is the birthplace of {p}?", "{p} was born in which city?"),
        held_out=("What city was {p} born in?", "Which city was the birthplace of {p}?"),
    ),
    "birth_date": Paraphrases(
        train=("When was {p} born?", "On what date was {p} born?",
               "What is the birth date of {p}?", "{p} was born on which date?"),
        held_out=("On which date was {p} born?", "What was the date of birth of {p}?"),
    ),
    "occupation": Paraphrases(
        train=("What was the occupation of {p}?", "What did {p} work as?",
               "What was {p}'s profession?", "What job did {p} have?"),
        held_out=("What was {p}'s occupation?", "What profession did {p} have?"),
    ),
    "organisation": Paraphrases(
        train=("Which company did {p} found?", "What company was founded by {p}?",
               "What did {p} found?", "{p} founded which company?"),
        held_out=("Which company was founded by {p}?", "What is the name of the company {p} founded?"),
    ),
    "founding_year": Paraphrases(
        train=("When was the {org} founded?", "In which year was the {org} founded?",
               "In what year did {p} found a company?", "{p} founded a company in which year?"),
        held_out=("In what year was the {org} founded?", "When did {p} found a company?"),
    ),
    "org_city": Paraphrases(
        train=("Where was the {org} based?", "In which city was the {org} based?",
               "Where was the company founded by {p} based?", "Which city was {p}'s company based in?"),
        held_out=("In what city was the company founded by {p} based?", "The {org} was based in which city?"),
    ),
    "workforce": Paraphrases(
        train=("How many workers did {p}'s company employ?", "How many people worked for the company founded by {p}?",
               "How many workers did the {org} employ?", "How many workers did the company of {p} employ?"),
        held_out=("How many people did the company founded by {p} employ?",
                  "How many workers were employed by {p}'s company?"),
    ),
    "books": Paraphrases(
        train=("How many books did {p} write?", "How many books did {p} publish?",
               "{p} wrote how many books?", "What number of books did {p} write?"),
        held_out=("How many books were written by {p}?", "How many books were published by {p}?"),
    ),
    "spouse": Paraphrases(
        train=("Whom did {p} marry?", "Who was {p} married to?", "Who was the spouse of {p}?", "{p} married whom?"),
        held_out=("Who did {p} marry?", "Who was {p}'s spouse?"),
    ),
}
FACT_TYPES = tuple(QUESTION_PARAPHRASES)

# ---------------------------------------------------------------------------------------------
# Entities
# ---------------------------------------------------------------------------------------------

# Names per pool; independent of the spec so that a bigger world reuses the same names.
POOL_SIZES = {
    "train": {"first_names": 160, "surnames": 220, "cities": 160, "org_stems": 140},
    "dev": {"first_names": 60, "surnames": 80, "cities": 60, "org_stems": 50},
    "corpus_only": {"first_names": 100, "surnames": 120, "cities": 100, "org_stems": 80},
}


@dataclass(frozen=True)
class EntityPools:
    """Invented names one split may use; the pools of different splits share no name."""

    first_names: tuple[str, ...]
    surnames: tuple[str, ...]
    cities: tuple[str, ...]
    org_stems: tuple[str, ...]

    def all_names(self) -> set[str]:
        return set(self.first_names) | set(self.surnames) | set(self.cities) | set(self.org_stems)

    def merged_with(self, other: EntityPools) -> EntityPools:
        return EntityPools(
            first_names=self.first_names + other.first_names,
            surnames=self.surnames + other.surnames,
            cities=self.cities + other.cities,
            org_stems=self.org_stems + other.org_stems,
        )


def _reserved_text() -> str:
    """All fixed wording, lower-cased: an invented name hidden inside it would make answers ambiguous."""
    templates = [t for group in SENTENCE_TEMPLATES.values() for t in group]
    questions = [t for p in QUESTION_PARAPHRASES.values() for t in p.train + p.held_out]
    return " ".join(templates + questions + list(OCCUPATIONS + COMPANY_KINDS + MONTHS)).lower()


def invent_name(rng: Random) -> str:
    """A pronounceable invented word such as "Kestin" or "Vardaril"."""
    n_syllables = rng.choice((2, 2, 2, 2, 3))
    syllables = []
    for index in range(n_syllables):
        is_last = index == n_syllables - 1
        # Always start with a consonant so that vowels never pile up across syllables.
        syllables.append(rng.choice(NAME_ONSETS) + rng.choice(NAME_VOWELS)
                         + rng.choice(FINAL_CODAS if is_last else MEDIAL_CODAS))
    return "".join(syllables).capitalize()


def build_entity_pools(seed: int) -> dict[str, EntityPools]:
    """Invent the name pools {"train", "dev", "corpus_only"}; raises if any two pools share a name."""
    rng = Random(f"{seed}:names")
    reserved = _reserved_text()
    needed = sum(sum(sizes.values()) for sizes in POOL_SIZES.values())
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < needed:
        name = invent_name(rng)
        if name in seen or not NAME_LENGTH_RANGE[0] <= len(name) <= NAME_LENGTH_RANGE[1] or name.lower() in reserved:
            continue
        seen.add(name)
        names.append(name)

    pools = {}
    position = 0
    for split, sizes in POOL_SIZES.items():
        kinds = {}
        for kind, size in sizes.items():
            kinds[kind] = tuple(names[position:position + size])
            position += size
        pools[split] = EntityPools(**kinds)
    _check_pools_disjoint(pools)
    return pools


def _check_pools_disjoint(pools: dict[str, EntityPools]) -> None:
    splits = list(pools)
    for i, first in enumerate(splits):
        for second in splits[i + 1:]:
            shared = pools[first].all_names() & pools[second].all_names()
            if shared:
                raise AssertionError(f"entity pools {first} and {second} share names: {sorted(shared)[:5]}")


# ---------------------------------------------------------------------------------------------
# Paragraphs
# ---------------------------------------------------------------------------------------------


@dataclass
class Person:
    """An invented person; facts the paragraph does not state stay empty."""

    first_name: str
    surname: str
    birthplace: str
    birth_date: str = ""
    occupation: str = ""
    organisation: str = ""
    founding_year: str = ""
    org_city: str = ""
    workforce: str = ""
    books: str = ""
    spouse: Person | None = None

    @property
    def full_name(self) -> str:
        return f"{self.first_name} {self.surname}"


@dataclass(frozen=True)
class AnswerSpan:
    """Where a fact about `person` sits in the context, found while the context was being built."""

    person: Person
    fact_type: str
    start: int
    text: str


@dataclass
class Paragraph:
    context: str
    people: list[Person]
    """Main people first, then their spouses."""
    answer_spans: list[AnswerSpan]


class _NameRegistry:
    """The names already used in one paragraph. A new name may neither contain nor be contained in
    one of them, so every name occurs in the context only where it is meant to."""

    def __init__(self) -> None:
        self._used: list[str] = []

    def draw(self, rng: Random, pool: tuple[str, ...]) -> str:
        for _ in range(200):
            candidate = rng.choice(pool)
            lowered = candidate.lower()
            if not any(lowered in used or used in lowered for used in self._used):
                self._used.append(lowered)
                return candidate
        raise RuntimeError("could not draw a distinct name; the entity pool is too small")


def _draw_date(rng: Random, year: int) -> str:
    return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {year}"


def _draw_person(rng: Random, pools: EntityPools, names: _NameRegistry, groups: list[str],
                 used_occupations: set[str]) -> Person:
    birth_year = rng.randint(1820, 1915)
    person = Person(
        first_name=names.draw(rng, pools.first_names),
        surname=names.draw(rng, pools.surnames),
        birthplace=names.draw(rng, pools.cities),
        birth_date=_draw_date(rng, birth_year),
    )
    if "career" in groups:
        person.occupation = rng.choice([o for o in OCCUPATIONS if o not in used_occupations])
        used_occupations.add(person.occupation)
    if "founding" in groups:
        person.organisation = f"{names.draw(rng, pools.org_stems)} {rng.choice(COMPANY_KINDS)}"
        person.founding_year = str(birth_year + rng.randint(20, 50))
        person.org_city = names.draw(rng, pools.cities)
    if "workforce" in groups:
        person.workforce = f"{rng.randint(15, 9800):,}"
    if "books" in groups:
        person.books = str(rng.randint(2, 60))
    if "marriage" in groups:
        person.spouse = Person(
            first_name=names.draw(rng, pools.first_names),
            surname=names.draw(rng, pools.surnames),
            birthplace=names.draw(rng, pools.cities),
        )
    return person


def _choose_fact_groups(rng: Random) -> list[str]:
    """The fact groups stated for every person of a paragraph: births plus one to three others."""
    groups = ["birth"] + rng.sample(OPTIONAL_GROUPS, rng.randint(1, 3))
    if "founding" in groups and rng.random() < 0.7:
        groups.append("workforce")
    return groups


def _people_that_fit(rng: Random, groups: list[str], people_range: tuple[int, int]) -> int:
    """How many people to describe: as many as the spec allows and the word range roughly fits."""
    words_per_person = sum(GROUP_WORD_COST[group] for group in groups)
    fewest = max(people_range[0], -(-CONTEXT_WORD_RANGE[0] // words_per_person))
    most = min(people_range[1], CONTEXT_WORD_RANGE[1] // words_per_person)
    return rng.randint(min(fewest, people_range[1]), max(most, people_range[0]))


def _groups_for_one_person(rng: Random, groups: list[str]) -> list[str]:
    """The paragraph's groups, with birth and career sometimes told in one sentence."""
    if "career" not in groups or rng.random() >= 0.35:
        return list(groups)
    return ["birth_and_career"] + [g for g in groups if g not in ("birth", "career")]


def _plan_sentences(rng: Random, people: list[Person], groups: list[str]) -> list[tuple[str, Person]]:
    """Pick a template per (person, group) and an order: grouped by person, by fact group, or shuffled."""
    per_person = [
        [(group, rng.choice(SENTENCE_TEMPLATES[group]), person) for group in _groups_for_one_person(rng, groups)]
        for person in people
    ]
    layout = rng.choice(("by_person", "by_group", "shuffled"))
    if layout == "by_person":
        rng.shuffle(per_person)
        for sentences in per_person:
            if rng.random() < 0.5:
                rng.shuffle(sentences)
        planned = [sentence for sentences in per_person for sentence in sentences]
    elif layout == "by_group":
        by_group: dict[str, list] = {}
        for sentences in per_person:
            for sentence in sentences:
                by_group.setdefault(sentence[0], []).append(sentence)
        blocks = list(by_group.values())
        rng.shuffle(blocks)
        for block in blocks:
            rng.shuffle(block)
        planned = [sentence for block in blocks for sentence in block]
    else:
        planned = [sentence for sentences in per_person for sentence in sentences]
        rng.shuffle(planned)
    return [(template, person) for _, template, person in planned]


def _fact_for_placeholder(person: Person, placeholder: str) -> tuple[Person, str, str]:
    """(who the fact is about, fact type, text) for a fact placeholder in a sentence template."""
    if placeholder == "spouse":
        return person, "spouse", person.spouse.full_name
    if placeholder == "spouse_birthplace":
        return person.spouse, "birthplace", person.spouse.birthplace
    return person, placeholder, getattr(person, placeholder)


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _render_context(rng: Random, sentences: list[tuple[str, Person]]) -> tuple[str, list[AnswerSpan]]:
    """Join the sentences, recording the character offset of every fact as it is written."""
    context = ""
    spans: list[AnswerSpan] = []
    mentioned: set[int] = set()
    for template, person in sentences:
        if context:
            context += " "
        position = 0
        for match in _PLACEHOLDER.finditer(template):
            context += template[position:match.start()]
            position = match.end()
            placeholder = match.group(1)
            if placeholder == "name":
                # Full name on first mention, so a surname-only question can still be resolved.
                use_surname = id(person) in mentioned and rng.random() < 0.6
                context += person.surname if use_surname else person.full_name
                mentioned.add(id(person))
                continue
            subject, fact_type, text = _fact_for_placeholder(person, placeholder)
            spans.append(AnswerSpan(subject, fact_type, len(context), text))
            context += text
        context += template[position:]
    return context, spans


def _try_build_paragraph(rng: Random, pools: EntityPools, people_range: tuple[int, int]) -> Paragraph | None:
    groups = _choose_fact_groups(rng)
    n_people = _people_that_fit(rng, groups, people_range)
    names = _NameRegistry()
    used_occupations: set[str] = set()
    people = [_draw_person(rng, pools, names, groups, used_occupations) for _ in range(n_people)]
    context, spans = _render_context(rng, _plan_sentences(rng, people, groups))

    n_words = len(context.split())
    if not CONTEXT_WORD_RANGE[0] <= n_words <= CONTEXT_WORD_RANGE[1]:
        return None
    # A number such as "14" may also sit inside "1914"; such paragraphs are redrawn.
    if any(context.count(span.text) != 1 for span in spans):
        return None
    spouses = [p.spouse for p in people if p.spouse is not None]
    return Paragraph(context=context, people=people + spouses, answer_spans=spans)


def build_paragraph(rng: Random, pools: EntityPools, people_range: tuple[int, int] = (3, 5)) -> Paragraph:
    """One paragraph about people_range[0]..people_range[1] people drawn from `pools`, spouses aside;
    every stated fact occurs exactly once in the context."""
    for _ in range(200):
        paragraph = _try_build_paragraph(rng, pools, people_range)
        if paragraph is not None:
            return paragraph
    raise RuntimeError(f"could not build a paragraph of {CONTEXT_WORD_RANGE} words for {people_range} people")


# ---------------------------------------------------------------------------------------------
# Questions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuestionRecord:
    id: str
    question: str
    answer_text: str
    answer_start: int
    fact_type: str
    template: str
    held_out_paraphrase: bool


# Births are stated in every paragraph; counting them as already asked once lets rarer facts go first.
BIRTH_FACTS_HEADSTART = {"birthplace": 1, "birth_date": 1}


def _pick_spans_to_ask(rng: Random, spans: list[AnswerSpan]) -> list[AnswerSpan]:
    """6-10 facts, spread over fact types and people: always take the least-asked combination."""
    candidates = list(spans)
    rng.shuffle(candidates)
    wanted = min(len(candidates), rng.randint(*QUESTIONS_PER_CONTEXT))
    asked_per_type: Counter[str] = Counter(BIRTH_FACTS_HEADSTART)
    asked_per_person: Counter[int] = Counter()
    chosen = []
    for _ in range(wanted):
        span = min(candidates, key=lambda s: (asked_per_type[s.fact_type], asked_per_person[id(s.person)]))
        candidates.remove(span)
        asked_per_type[span.fact_type] += 1
        asked_per_person[id(span.person)] += 1
        chosen.append(span)
    return chosen


def _templates_for_split(fact_type: str, use_held_out: bool) -> list[tuple[str, bool]]:
    paraphrases = QUESTION_PARAPHRASES[fact_type]
    templates = [(t, False) for t in paraphrases.train]
    if use_held_out:
        templates += [(t, True) for t in paraphrases.held_out]
    return templates


def _ask(rng: Random, span: AnswerSpan, question_id: str, use_held_out: bool) -> QuestionRecord:
    template, held_out = rng.choice(_templates_for_split(span.fact_type, use_held_out))
    person = span.person
    reference = person.surname if rng.random() < 0.4 else person.full_name
    return QuestionRecord(
        id=question_id,
        question=template.format(p=reference, org=person.organisation),
        answer_text=span.text,
        answer_start=span.start,
        fact_type=span.fact_type,
        template=template,
        held_out_paraphrase=held_out,
    )


def _questions_for(rng: Random, paragraph: Paragraph, id_prefix: str, use_held_out: bool) -> list[QuestionRecord]:
    questions = []
    for index, span in enumerate(_pick_spans_to_ask(rng, paragraph.answer_spans)):
        record = _ask(rng, span, f"{id_prefix}-{index:02d}", use_held_out)
        assert paragraph.context[record.answer_start:record.answer_start + len(record.answer_text)] == record.answer_text
        questions.append(record)
    return questions


# ---------------------------------------------------------------------------------------------
# Splits and the world
# ---------------------------------------------------------------------------------------------


@dataclass
class _SplitBuild:
    paragraphs: list[Paragraph] = field(default_factory=list)
    questions: list[list[QuestionRecord]] = field(default_factory=list)


def _people_range(spec: SyntheticWorldSpec) -> tuple[int, int]:
    return spec.min_people_per_context, spec.max_people_per_context


def _build_qa_split(spec: SyntheticWorldSpec, split: str, pools: EntityPools, n_contexts: int,
                    use_held_out: bool) -> _SplitBuild:
    rng = Random(f"{spec.seed}:{split}")
    build = _SplitBuild()
    for index in range(n_contexts):
        paragraph = build_paragraph(rng, pools, _people_range(spec))
        build.paragraphs.append(paragraph)
        build.questions.append(_questions_for(rng, paragraph, f"syn-{split}-{index:06d}", use_held_out))
    return build


def _to_squad(split: str, build: _SplitBuild) -> dict:
    articles = []
    for index, (paragraph, questions) in enumerate(zip(build.paragraphs, build.questions)):
        qas = [
            {"id": q.id, "question": q.question, "answers": [{"text": q.answer_text, "answer_start": q.answer_start}]}
            for q in questions
        ]
        articles.append({"title": f"syn-{split}-{index:06d}", "paragraphs": [{"context": paragraph.context, "qas": qas}]})
    return {"version": "1.1", "data": articles}


def _names_in(paragraphs: list[Paragraph]) -> set[str]:
    names = set()
    for paragraph in paragraphs:
        for person in paragraph.people:
            names.update((person.first_name, person.surname, person.birthplace))
            if person.organisation:
                names.update((person.organisation.split()[0], person.org_city))
    return names


def _check_dev_names_unseen_in_train(train: _SplitBuild, dev: _SplitBuild) -> None:
    train_words = {word for p in train.paragraphs for word in re.findall(r"[A-Za-z]+", p.context)}
    leaked = _names_in(dev.paragraphs) & train_words
    if leaked:
        raise AssertionError(f"dev names appear in train contexts: {sorted(leaked)[:5]}")


def _build_corpus(spec: SyntheticWorldSpec, pools: EntityPools) -> list[str]:
    rng = Random(f"{spec.seed}:corpus")
    return [build_paragraph(rng, pools, _people_range(spec)).context for _ in range(spec.n_corpus_paragraphs)]


def _stats(spec: SyntheticWorldSpec, train: _SplitBuild, dev: _SplitBuild, corpus: list[str]) -> dict:
    train_questions = [q for qs in train.questions for q in qs]
    dev_questions = [q for qs in dev.questions for q in qs]
    n_held_out = sum(q.held_out_paraphrase for q in dev_questions)
    context_words = [len(p.context.split()) for p in train.paragraphs + dev.paragraphs]
    return {
        "seed": spec.seed,
        "n_train_contexts": len(train.paragraphs),
        "n_dev_contexts": len(dev.paragraphs),
        "n_train_questions": len(train_questions),
        "n_dev_questions": len(dev_questions),
        "dev_held_out_paraphrase_fraction": round(n_held_out / max(1, len(dev_questions)), 4),
        "n_train_context_words": sum(len(p.context.split()) for p in train.paragraphs),
        "n_dev_context_words": sum(len(p.context.split()) for p in dev.paragraphs),
        "context_words_min": min(context_words),
        "context_words_max": max(context_words),
        "n_corpus_paragraphs": len(corpus),
        "n_corpus_words": sum(len(line.split()) for line in corpus),
        "n_train_entity_names": len(_names_in(train.paragraphs)),
        "n_dev_entity_names": len(_names_in(dev.paragraphs)),
        "train_questions_by_fact_type": dict(sorted(Counter(q.fact_type for q in train_questions).items())),
        "dev_questions_by_fact_type": dict(sorted(Counter(q.fact_type for q in dev_questions).items())),
    }


def generate_world(spec: SyntheticWorldSpec) -> dict:
    """Returns {"train": squad_v11_dict, "dev": squad_v11_dict, "corpus": list[str], "stats": dict}."""
    pools = build_entity_pools(spec.seed)
    train = _build_qa_split(spec, "train", pools["train"], spec.n_train_contexts, use_held_out=False)
    dev = _build_qa_split(spec, "dev", pools["dev"], spec.n_dev_contexts, use_held_out=True)
    _check_dev_names_unseen_in_train(train, dev)
    # Pretraining sees train names and fresh ones, never dev names, so dev stays unmemorised.
    corpus = _build_corpus(spec, pools["train"].merged_with(pools["corpus_only"]))
    return {
        "train": _to_squad("train", train),
        "dev": _to_squad("dev", dev),
        "corpus": corpus,
        "stats": _stats(spec, train, dev, corpus),
    }


def _write_atomically(path: Path, text: str) -> None:
    """Write to a temporary file next to `path`, then rename: a killed run never leaves a complete-looking file."""
    handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent,
                                         prefix=f".{path.name}.", suffix=".tmp", delete=False)
    try:
        with handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


def write_world(spec: SyntheticWorldSpec, out_dir: Path) -> dict:
    """Write out_dir/train.json, out_dir/dev.json (SQuAD v1.1 layout) and out_dir/corpus.txt
    (one paragraph per line); return the world's stats."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    world = generate_world(spec)
    _write_atomically(out_dir / "train.json", json.dumps(world["train"], ensure_ascii=False))
    _write_atomically(out_dir / "dev.json", json.dumps(world["dev"], ensure_ascii=False))
    _write_atomically(out_dir / "corpus.txt", "".join(line + "\n" for line in world["corpus"]))
    return world["stats"]

