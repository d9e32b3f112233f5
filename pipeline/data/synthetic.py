"""The offline synthetic world: SQuAD v1.1-format questions about invented people, plus an MLM corpus.

Every paragraph is a short biography of one invented person that also names other entities (a spouse, a
teacher, companies, several cities) and states several facts *of the same kind*: a birthplace, a place of
death and a company's city; a birth date, a death date, a founding year and a wedding year; numbers of
books, workers and children; a spouse and a teacher. A reader has to pick the fact the question's relation
asks for ("born" vs "died" vs "based"), not "the city in the paragraph". Sentence templates, sentence order
and name references (full name or surname, never pronouns) vary from paragraph to paragraph.

Why one main person per paragraph: binding a question to one of several people with the same kinds of
facts ("Where was A born?" with A and B both born somewhere) is a two-hop attention circuit that a small BERT
trained from scratch does not discover within the default's CPU budget. On a minimal version of that task
(two people, single-token names, 4 layers, width 64) accuracy stayed at chance after 6,000 steps, while
copying a token from the question was learned after about 1,000. Relation-level distractors keep the task
extractive and non-trivial (a 2-layer model trails the teacher) while a 5-minute teacher can learn it.

Dev is kept honest in two ways:
  * held-out entities: dev people, spouses, teachers, cities and companies come from a name pool disjoint
    from the train pool (checked explicitly), so no dev fact can be memorised from train;
  * held-out paraphrases: each fact type has question paraphrases that only dev uses; they reuse the
    content words of the train paraphrases ("born", "city", "founded", ...) in new combinations, and every
    noun they ask with ("date of birth", "place of death", "occupation", "spouse") also occurs in some
    context template, so the MLM corpus teaches what it means.
The MLM corpus describes people drawn from every pool, dev's included, in freshly drawn biographies: as with
BERT, whose pretraining text contains the names in SQuAD's dev articles, the names are known words but no
dev fact is ever stated (no dev person's full name occurs in the corpus; checked explicitly). Most corpus
biographies end with a question about themselves in any wording, held-out paraphrases included (without the
answer), as web text contains questions in every wording; QA training itself never sees a held-out wording.

Everything is deterministic from `SyntheticWorldSpec.seed`, pure stdlib, and uses its own
`random.Random` streams (one per purpose, seeded by a string so it does not depend on PYTHONHASHSEED).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from random import Random

from pipeline.outputs.artifacts import atomic_write_text

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
    """Lines of corpus.txt for masked-LM pretraining (fresh biographies; never a dev person)."""

    def __post_init__(self) -> None:
        for name in ("n_train_contexts", "n_dev_contexts", "n_corpus_paragraphs"):
            if getattr(self, name) < 1:
                raise ValueError(f"SyntheticWorldSpec.{name} must be >= 1, got {getattr(self, name)}")


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

CHILDREN_COUNTS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "eleven", "twelve")

# ---------------------------------------------------------------------------------------------
# Context sentences. A paragraph is built from fact groups, one sentence each.
# Placeholders: {name} is a reference to the main person (full name on first mention, then full name or
# surname); every other placeholder is a fact whose character span is tracked.
# ---------------------------------------------------------------------------------------------

SENTENCE_TEMPLATES: dict[str, tuple[str, ...]] = {
    "birth": (
        "{name} was born in {birthplace} on {birth_date}.",
        "{name} was born on {birth_date} in {birthplace}.",
        "On {birth_date}, {name} was born in the city of {birthplace}.",
        "{birthplace} is where {name} was born, on {birth_date}.",
        "The birthplace of {name} was {birthplace}, where {name} was born on {birth_date}.",
        "{name} was born in {birthplace}, and the date of birth of {name} was {birth_date}.",
        "The date of birth of {name} was {birth_date}, and the place of birth was {birthplace}.",
    ),
    # Used instead of separate "birth" and "career" sentences in some paragraphs.
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
        "By occupation, {name} was a {occupation}.",
    ),
    # The teacher's occupation is a same-kind distractor for "What did {p} work as?".
    "training": (
        "{name} trained under {mentor}, a {mentor_occupation}.",
        "As a young apprentice, {name} learned the trade from {mentor}, a {mentor_occupation}.",
        "{mentor}, a {mentor_occupation}, was the teacher of {name}.",
        "{name} was taught by {mentor}, a well-known {mentor_occupation}.",
    ),
    "employment": (
        "{name} first worked for the {employer}.",
        "The first employer of {name} was the {employer}.",
        "{name} was first employed by the {employer}.",
        "Early on, {name} held a post at the {employer}.",
    ),
    "founding": (
        "In {founding_year}, {name} founded the {organisation}, which was based in {org_city}.",
        "{name} founded the {organisation} in {org_city} in {founding_year}.",
        "The {organisation}, based in {org_city}, was founded by {name} in {founding_year}.",
        "{name} established the {organisation} in {founding_year}, and the company was based in {org_city}.",
    ),
    # The company is named only in the founding sentence, so the company name stays a unique answer.
    "workforce": (
        "The company founded by {name} employed {workforce} workers.",
        "{name}'s company employed {workforce} workers.",
        "{name}'s company had a workforce of {workforce} people.",
        "Some {workforce} workers were employed by the company that {name} founded.",
    ),
    "books": (
        "{name} wrote {books} books.",
        "{name} was the author of {books} books.",
        "Over the years, {name} published {books} books.",
        "In total, {books} books were written by {name}.",
    ),
    # The spouse's home town is a same-kind distractor for the birthplace and the place of death.
    "marriage": (
        "In {marriage_year}, {name} married {spouse}, a native of {spouse_hometown}.",
        "{name} married {spouse} of {spouse_hometown} in {marriage_year}.",
        "{spouse}, who came from {spouse_hometown}, married {name} in {marriage_year}.",
        "{name} and {spouse} were married in {marriage_year} in {spouse_hometown}.",
        "The spouse of {name} was {spouse} of {spouse_hometown}, whom {name} married in {marriage_year}.",
    ),
    "children": (
        "{name} had {children} children.",
        "{name} was the parent of {children} children.",
        "{name} raised {children} children.",
    ),
    "death": (
        "{name} died in {death_place} on {death_date}.",
        "{name} died on {death_date} in {death_place}.",
        "On {death_date}, {name} died in {death_place}.",
        "{name} later moved to {death_place} and died there on {death_date}.",
        "The death of {name} came on {death_date} in {death_place}.",
        "The place of death of {name} was {death_place}, and the death date was {death_date}.",
    ),
}

# Groups told in the middle of a biography, in shuffled order; birth opens it and death closes it.
MIDDLE_GROUPS = ("career", "training", "employment", "founding", "books", "marriage", "children")
MIDDLE_GROUPS_PER_PARAGRAPH = (3, 6)
CONTEXT_WORD_RANGE = (40, 130)
QUESTIONS_PER_CONTEXT = (6, 10)

# What kind of thing each fact is: every asked fact has another fact of its kind in the paragraph.
FACT_KINDS = {
    "birthplace": "city", "death_place": "city", "org_city": "city", "spouse_hometown": "city",
    "birth_date": "time", "death_date": "time", "founding_year": "time", "marriage_year": "time",
    "books": "number", "workforce": "number", "children": "number",
    "spouse": "person", "mentor": "person",
    "organisation": "company", "employer": "company",
    "occupation": "occupation", "mentor_occupation": "occupation",
}

# ---------------------------------------------------------------------------------------------
# Questions. {p} is the main person (full name or surname); {org} the founded company; {spouse} the spouse.
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
    "death_place": Paraphrases(
        train=("Where did {p} die?", "In which city did {p} die?",
               "What was the place of death of {p}?", "{p} died in which city?"),
        held_out=("What city did {p} die in?", "Which city was the place of death of {p}?"),
    ),
    "death_date": Paraphrases(
        train=("When did {p} die?", "On what date did {p} die?",
               "What is the date of death of {p}?", "{p} died on which date?"),
        held_out=("On which date did {p} die?", "What was the death date of {p}?"),
    ),
    "occupation": Paraphrases(
        train=("What was the occupation of {p}?", "What did {p} work as?",
               "What was {p}'s profession?", "What job did {p} have?"),
        held_out=("What was {p}'s occupation?", "What profession did {p} have?"),
    ),
    "mentor": Paraphrases(
        train=("Who trained {p}?", "Under whom did {p} train?",
               "Who was the teacher of {p}?", "From whom did {p} learn the trade?"),
        held_out=("Who was {p}'s teacher?", "Who taught {p} the trade?"),
    ),
    "employer": Paraphrases(
        train=("For which company did {p} first work?", "Which company first employed {p}?",
               "What was the first employer of {p}?", "{p} first worked for which company?"),
        held_out=("Which company did {p} first work for?", "Who was the first employer of {p}?"),
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
    "marriage_year": Paraphrases(
        train=("When did {p} marry?", "In which year did {p} marry {spouse}?",
               "In what year did {p} get married?", "{p} married {spouse} in which year?"),
        held_out=("In which year did {p} get married?", "When did {p} marry {spouse}?"),
    ),
    "children": Paraphrases(
        train=("How many children did {p} have?", "How many children were born to {p}?",
               "{p} had how many children?", "What number of children did {p} have?"),
        held_out=("How many children did {p} raise?", "How many children was {p} the parent of?"),
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
    return " ".join(templates + questions + list(OCCUPATIONS + COMPANY_KINDS + MONTHS + CHILDREN_COUNTS)).lower()


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
class Biography:
    """One invented person and the facts a paragraph states about them; unstated facts stay empty."""

    first_name: str
    surname: str
    facts: dict[str, str] = field(default_factory=dict)

    @property
    def full_name(self) -> str:
        return f"{self.first_name} {self.surname}"

    def other_people(self) -> list[str]:
        """Full names of the other people the paragraph names (spouse, teacher)."""
        return [self.facts[key] for key in ("spouse", "mentor") if key in self.facts]


@dataclass(frozen=True)
class AnswerSpan:
    """Where a fact sits in the context, found while the context was being built."""

    fact_type: str
    start: int
    text: str


@dataclass
class Paragraph:
    context: str
    person: Biography
    answer_spans: list[AnswerSpan]
    """Every stated fact, asked or not (the teacher's occupation and the spouse's home town are only distractors)."""


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


def _company(rng: Random, pools: EntityPools, names: _NameRegistry, kinds_used: set[str]) -> str:
    kind = rng.choice([k for k in COMPANY_KINDS if k not in kinds_used])
    kinds_used.add(kind)
    return f"{names.draw(rng, pools.org_stems)} {kind}"


def _draw_biography(rng: Random, pools: EntityPools, groups: list[str]) -> Biography:
    names = _NameRegistry()
    person = Biography(first_name=names.draw(rng, pools.first_names), surname=names.draw(rng, pools.surnames))
    facts = person.facts
    birth_year = rng.randint(1820, 1900)
    facts["birthplace"] = names.draw(rng, pools.cities)
    facts["birth_date"] = _draw_date(rng, birth_year)
    occupations = rng.sample(OCCUPATIONS, 2)
    company_kinds: set[str] = set()
    if "career" in groups:
        facts["occupation"] = occupations[0]
    if "training" in groups:
        facts["mentor"] = f"{names.draw(rng, pools.first_names)} {names.draw(rng, pools.surnames)}"
        facts["mentor_occupation"] = occupations[1]
    if "employment" in groups:
        facts["employer"] = _company(rng, pools, names, company_kinds)
    if "founding" in groups:
        facts["organisation"] = _company(rng, pools, names, company_kinds)
        facts["founding_year"] = str(birth_year + rng.randint(22, 45))
        facts["org_city"] = names.draw(rng, pools.cities)
    if "workforce" in groups:
        facts["workforce"] = f"{rng.randint(15, 9800):,}"
    if "books" in groups:
        facts["books"] = str(rng.randint(2, 60))
    if "marriage" in groups:
        facts["spouse"] = f"{names.draw(rng, pools.first_names)} {names.draw(rng, pools.surnames)}"
        facts["spouse_hometown"] = names.draw(rng, pools.cities)
        facts["marriage_year"] = str(birth_year + rng.randint(19, 40))
    if "children" in groups:
        facts["children"] = rng.choice(CHILDREN_COUNTS)
    if "death" in groups:
        facts["death_place"] = names.draw(rng, pools.cities)
        facts["death_date"] = _draw_date(rng, birth_year + rng.randint(50, 90))
    return person


def _choose_groups(rng: Random) -> list[str]:
    """Birth first, a shuffled middle, death last (in most paragraphs); the workforce follows a founding."""
    middle = rng.sample(MIDDLE_GROUPS, rng.randint(*MIDDLE_GROUPS_PER_PARAGRAPH))
    if "founding" in middle and rng.random() < 0.7:
        middle.insert(middle.index("founding") + 1, "workforce")
    groups = ["birth"] + middle
    if rng.random() < 0.8:
        groups.append("death")
    return groups


def _plan_sentences(rng: Random, groups: list[str]) -> list[str]:
    """A template per group, sometimes telling birth and career in one sentence; a few paragraphs
    are fully shuffled so that position alone never gives a fact away."""
    if "career" in groups and rng.random() < 0.35:
        groups = ["birth_and_career" if g == "birth" else g for g in groups if g != "career"]
    if rng.random() < 0.25:
        groups = list(groups)
        rng.shuffle(groups)
    return [rng.choice(SENTENCE_TEMPLATES[group]) for group in groups]


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _render_context(rng: Random, person: Biography, templates: list[str]) -> tuple[str, list[AnswerSpan]]:
    """Join the sentences, recording the character offset of every fact as it is written."""
    context = ""
    spans: list[AnswerSpan] = []
    mentioned = False
    for template in templates:
        if context:
            context += " "
        position = 0
        for match in _PLACEHOLDER.finditer(template):
            context += template[position:match.start()]
            position = match.end()
            placeholder = match.group(1)
            if placeholder == "name":
                # Full name on first mention, so a surname-only question can still be resolved.
                context += person.surname if mentioned and rng.random() < 0.6 else person.full_name
                mentioned = True
                continue
            text = person.facts[placeholder]
            spans.append(AnswerSpan(placeholder, len(context), text))
            context += text
        context += template[position:]
    return context, spans


def _try_build_paragraph(rng: Random, pools: EntityPools) -> Paragraph | None:
    groups = _choose_groups(rng)
    person = _draw_biography(rng, pools, groups)
    context, spans = _render_context(rng, person, _plan_sentences(rng, groups))
    if not CONTEXT_WORD_RANGE[0] <= len(context.split()) <= CONTEXT_WORD_RANGE[1]:
        return None
    # A number such as "14" may also sit inside "1914"; such paragraphs are redrawn.
    if any(context.count(span.text) != 1 for span in spans):
        return None
    return Paragraph(context=context, person=person, answer_spans=spans)


def build_paragraph(rng: Random, pools: EntityPools) -> Paragraph:
    """One biography drawn from `pools`; every stated fact occurs exactly once in the context."""
    for _ in range(200):
        paragraph = _try_build_paragraph(rng, pools)
        if paragraph is not None:
            return paragraph
    raise RuntimeError(f"could not build a paragraph of {CONTEXT_WORD_RANGE} words")


def askable_spans(paragraph: Paragraph) -> list[AnswerSpan]:
    """Facts with a question type and at least one other fact of the same kind in the paragraph."""
    kinds = Counter(FACT_KINDS[span.fact_type] for span in paragraph.answer_spans)
    return [s for s in paragraph.answer_spans if s.fact_type in QUESTION_PARAPHRASES and kinds[FACT_KINDS[s.fact_type]] >= 2]


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


def _templates_for_split(fact_type: str, use_held_out: bool) -> list[tuple[str, bool]]:
    paraphrases = QUESTION_PARAPHRASES[fact_type]
    templates = [(t, False) for t in paraphrases.train]
    if use_held_out:
        templates += [(t, True) for t in paraphrases.held_out]
    return templates


def _ask(rng: Random, person: Biography, span: AnswerSpan, question_id: str, use_held_out: bool) -> QuestionRecord:
    template, held_out = rng.choice(_templates_for_split(span.fact_type, use_held_out))
    reference = person.surname if rng.random() < 0.4 else person.full_name
    return QuestionRecord(
        id=question_id,
        question=template.format(p=reference, org=person.facts.get("organisation", ""),
                                 spouse=person.facts.get("spouse", "")),
        answer_text=span.text,
        answer_start=span.start,
        fact_type=span.fact_type,
        template=template,
        held_out_paraphrase=held_out,
    )


def _questions_for(rng: Random, paragraph: Paragraph, id_prefix: str, use_held_out: bool) -> list[QuestionRecord]:
    candidates = askable_spans(paragraph)
    chosen = rng.sample(candidates, min(len(candidates), rng.randint(*QUESTIONS_PER_CONTEXT)))
    questions = []
    for index, span in enumerate(chosen):
        record = _ask(rng, paragraph.person, span, f"{id_prefix}-{index:02d}", use_held_out)
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


def _build_qa_split(spec: SyntheticWorldSpec, split: str, pools: EntityPools, n_contexts: int,
                    use_held_out: bool) -> _SplitBuild:
    rng = Random(f"{spec.seed}:{split}")
    build = _SplitBuild()
    while len(build.paragraphs) < n_contexts:
        paragraph = build_paragraph(rng, pools)
        if len(askable_spans(paragraph)) < QUESTIONS_PER_CONTEXT[0]:
            continue  # too few facts with a same-kind distractor to ask about
        prefix = f"syn-{split}-{len(build.paragraphs):06d}"
        build.paragraphs.append(paragraph)
        build.questions.append(_questions_for(rng, paragraph, prefix, use_held_out))
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
    """Every invented name the paragraphs use (people, cities, company stems)."""
    names = set()
    for paragraph in paragraphs:
        person = paragraph.person
        names.update((person.first_name, person.surname))
        for fact_type, text in person.facts.items():
            if FACT_KINDS[fact_type] in ("city", "person"):
                names.update(text.split())
            elif FACT_KINDS[fact_type] == "company":
                names.add(text.split()[0])
    return names


def _full_names_in(paragraphs: list[Paragraph]) -> set[str]:
    return {name for p in paragraphs for name in [p.person.full_name, *p.person.other_people()]}


def _check_dev_names_unseen_in_train(train: _SplitBuild, dev: _SplitBuild) -> None:
    train_words = {word for p in train.paragraphs for word in re.findall(r"[A-Za-z]+", p.context)}
    leaked = _names_in(dev.paragraphs) & train_words
    if leaked:
        raise AssertionError(f"dev names appear in train contexts: {sorted(leaked)[:5]}")


# Share of corpus biographies followed by a question about them, worded with any paraphrase.
CORPUS_QUESTION_PROBABILITY = 0.6


def _corpus_line(rng: Random, paragraph: Paragraph) -> str:
    """The biography, often followed by one question about it (no answer) in any of its fact type's
    wordings, held-out ones included: text on the web asks questions in every wording, so pretraining
    learns that "what city" and "which city" are used alike, while QA training never shows a held-out one."""
    askable = askable_spans(paragraph)
    if not askable or rng.random() >= CORPUS_QUESTION_PROBABILITY:
        return paragraph.context
    question = _ask(rng, paragraph.person, rng.choice(askable), "corpus", use_held_out=True).question
    return f"{paragraph.context} {question}"


def _build_corpus(spec: SyntheticWorldSpec, pools: EntityPools, dev_people: set[str]) -> list[str]:
    """Fresh biographies; one that happens to name a dev person (first name + surname) is redrawn."""
    rng = Random(f"{spec.seed}:corpus")
    lines: list[str] = []
    while len(lines) < spec.n_corpus_paragraphs:
        paragraph = build_paragraph(rng, pools)
        if not _full_names_in([paragraph]) & dev_people:
            lines.append(_corpus_line(rng, paragraph))
    return lines


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
    every_pool = pools["train"].merged_with(pools["dev"]).merged_with(pools["corpus_only"])
    corpus = _build_corpus(spec, every_pool, _full_names_in(dev.paragraphs))
    return {
        "train": _to_squad("train", train),
        "dev": _to_squad("dev", dev),
        "corpus": corpus,
        "stats": _stats(spec, train, dev, corpus),
    }


def write_world(spec: SyntheticWorldSpec, out_dir: Path) -> dict:
    """Write out_dir/train.json, out_dir/dev.json (SQuAD v1.1 layout) and out_dir/corpus.txt
    (one paragraph per line); return the world's stats."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    world = generate_world(spec)
    atomic_write_text(out_dir / "train.json", json.dumps(world["train"], ensure_ascii=False))
    atomic_write_text(out_dir / "dev.json", json.dumps(world["dev"], ensure_ascii=False))
    atomic_write_text(out_dir / "corpus.txt", "".join(line + "\n" for line in world["corpus"]))
    return world["stats"]

