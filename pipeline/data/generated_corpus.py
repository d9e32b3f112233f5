"""An English-like MLM corpus of any size, generated in chunks with numpy (memory does not grow with the size):
one document per line, headings, paragraphs and articles far longer than 512 tokens, words drawn with Zipf
weights from common English words, invented names and places, and numbers. The data path's scale evidence
(benchmarks/corpus_scale.py) runs the pipeline on it; reproducible for a seed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from pipeline.outputs.artifacts import atomic_write_json

# Bump when the generator's output changes, so files written by an older generator are not reused.
GENERATOR_VERSION = 1
# Common English words, roughly most frequent first (the sampler gives them Zipf weights by this rank).
COMMON_WORDS = """
the of and to in a is that for it as was with be by on not he this are or his from at which but have an they
you were her she there been one all we their has would when if so no will more can who its out into also them
than other some time only first new these two may any then could such after most made over where many years
through between after before under while during because however people state world city part found known called
since later three year used work well high early being both long must great each just much same city country
government system number house river school university war family life group century area water own history
music national second four against power small began name following public general home among local large form
album season film series game team player league club band song record station company party member law court
church language north south east west region village town island valley mountain road bridge building tower
army force battle king queen prince lord council county district province capital population census market trade
industry product service production design model version development research study theory science field method
data report result process energy light sound color image picture story book novel author writer poet artist
painter actor director producer student teacher professor doctor officer minister president leader member child
father mother brother sister son daughter wife husband friend woman man men women children king emperor bishop
saint temple castle palace garden park forest lake sea ocean coast bay harbor port ship boat train station line
route street avenue square center centre museum library theatre hospital prison factory farm mill mine bank store
hotel restaurant office house room door window wall floor roof stone wood iron steel gold silver copper glass paper
cloth wool cotton grain wheat rice corn fruit apple tree flower plant animal horse cattle sheep bird fish dog cat
small large old young good best better little big major minor main local national international royal ancient
modern early late former current original final full common special single several various important certain
private social political military economic cultural religious natural physical human civil federal central
northern southern eastern western upper lower total annual average free open short strong heavy dark white black
red green blue brown golden english french german spanish italian roman greek british american european asian
african chinese japanese indian russian became become remained served held took gave made came went left moved
played won lost built opened closed created founded established published released recorded produced directed
wrote written named described considered included continued returned received married died born lived worked
studied taught joined formed led followed reached increased decreased changed designed developed introduced
located situated based run using making taking giving according although though until within without around
across along toward towards upon about above below near behind beyond despite several often usually sometimes
generally recently originally eventually finally currently together again still already almost nearly only even
""".split()
NAME_ONSETS = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
               "br", "ch", "cl", "dr", "gr", "kr", "sh", "st", "th", "tr", ""]
NAME_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "ie", "y"]
NAME_CODAS = ["", "", "", "n", "r", "l", "s", "th", "nd", "rt", "m", "x", "ck"]
PLACE_SUFFIXES = ["ton", "ville", "burg", "ford", "field", "ham", "mouth", "stad", "dale", "wick"]
N_NAMES = 6000
N_NUMBERS = 3000
# Share of running words: common words (Zipf by rank), invented names and places, numbers.
WORD_SHARES = {"common": 0.85, "names": 0.10, "numbers": 0.05}
# Line kinds: (share of lines, fewest words, most words). Headings and articles make the lengths realistic:
# short lines are dropped as sequences, and articles are cut into many 512-token chunks.
LINE_KINDS = {"heading": (0.12, 1, 6), "paragraph": (0.874, 40, 200), "article": (0.006, 2_000, 20_000)}
MEAN_SENTENCE_WORDS = 18
COMMA_PROBABILITY = 0.06
# Word forms per vocabulary entry: "w ", "W ", "w. ", "w, ", "W. " (every form ends in a space; a line's last
# space becomes its newline).
PLAIN, CAPITALIZED, PERIOD, COMMA, CAPITALIZED_PERIOD = range(5)
CHUNK_BYTES = 8 << 20  # text generated per chunk: the generator's memory is a few times this
SAMPLER_TABLE_SIZE = 1 << 20  # quantized sampling table: one draw is one integer and one lookup


def vocabulary(rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
    """The entries words are drawn from (common words, generated names and places, numbers) and their
    sampling probabilities."""
    syllables = [o + v + c for o in NAME_ONSETS for v in NAME_VOWELS for c in NAME_CODAS]
    names: list[str] = []
    seen: set[str] = set(COMMON_WORDS)
    while len(names) < N_NAMES:
        n_syllables = int(rng.integers(2, 4))
        name = "".join(syllables[i] for i in rng.integers(0, len(syllables), n_syllables))
        if rng.random() < 0.2:
            name += PLACE_SUFFIXES[int(rng.integers(0, len(PLACE_SUFFIXES)))]
        if 3 <= len(name) <= 14 and name not in seen:
            seen.add(name)
            names.append(name.capitalize())
    years = [str(y) for y in range(1200, 2031)]
    counts = np.unique(np.exp(rng.uniform(0, np.log(1e6), N_NUMBERS)).astype(np.int64))
    decimals = [f"{x:.1f}" for x in rng.uniform(0, 100, 200)]
    numbers = years + [str(n) for n in counts] + decimals
    common = list(dict.fromkeys(COMMON_WORDS))  # a word listed twice counts once
    weights = [
        zipf_weights(len(common), 1.0) * WORD_SHARES["common"],
        zipf_weights(len(names), 0.8) * WORD_SHARES["names"],
        np.full(len(numbers), WORD_SHARES["numbers"] / len(numbers)),
    ]
    return common + names + numbers, np.concatenate(weights)


def zipf_weights(n: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** exponent
    return weights / weights.sum()


class WordForms:
    """Every entry's five forms as rows of one padded byte matrix, and which of each row's bytes are text: a
    chunk's text is one gather of rows and one boolean selection."""

    def __init__(self, entries: list[str]):
        forms = []
        for entry in entries:
            capital = entry[:1].upper() + entry[1:]
            forms += [f"{entry} ", f"{capital} ", f"{entry}. ", f"{entry}, ", f"{capital}. "]
        encoded = [form.encode("ascii") for form in forms]
        self.lengths = np.array([len(form) for form in encoded], dtype=np.int64)
        self.width = -(-int(self.lengths.max()) // 8) * 8
        matrix = np.zeros((len(encoded), self.width), dtype=np.uint8)
        for row, form in enumerate(encoded):
            matrix[row, : len(form)] = np.frombuffer(form, dtype=np.uint8)
        is_text = np.arange(self.width) < self.lengths[:, None]
        # Rows as single opaque items: gathering them is a memcpy per row, several times faster than 2-D indexing.
        row_type = np.dtype((np.void, self.width))
        self.rows = matrix.view(row_type).ravel()
        self.is_text = is_text.view(row_type).ravel()

    def text(self, forms: np.ndarray) -> np.ndarray:
        """The bytes of these forms, one after the other."""
        rows = self.rows[forms].view(np.uint8)
        return rows[self.is_text[forms].view(np.bool_)]


def sampling_table(probabilities: np.ndarray) -> np.ndarray:
    """Entry indices repeated in proportion to their probability (each at least once): drawing a uniform index
    into it draws an entry."""
    copies = np.maximum(1, np.round(probabilities * SAMPLER_TABLE_SIZE)).astype(np.int64)
    return np.repeat(np.arange(len(probabilities), dtype=np.int32), copies)


def mean_line_words() -> float:
    return sum(share * (low + high) / 2 for share, low, high in LINE_KINDS.values())


def corpus_chunk(rng: np.random.Generator, forms: WordForms, table: np.ndarray, n_lines: int,
                 max_bytes: int) -> tuple[bytes, dict]:
    """`n_lines` generated lines, cut after the first line that reaches `max_bytes`; the text and its counts."""
    shares = np.array([share for share, _, _ in LINE_KINDS.values()])
    kinds = rng.choice(len(LINE_KINDS), size=n_lines, p=shares / shares.sum())
    lows = np.array([low for _, low, _ in LINE_KINDS.values()])[kinds]
    highs = np.array([high for _, _, high in LINE_KINDS.values()])[kinds]
    words_per_line = rng.integers(lows, highs + 1)
    n_words = int(words_per_line.sum())
    line_starts = np.concatenate([[0], np.cumsum(words_per_line)[:-1]])
    position = np.arange(n_words) - np.repeat(line_starts, words_per_line)
    last = position == np.repeat(words_per_line - 1, words_per_line)
    heading = np.repeat(kinds == list(LINE_KINDS).index("heading"), words_per_line)

    # Sentences (geometric lengths) end with a period and start capitalized; headings are title-cased, unpunctuated.
    sentence_end = ((rng.random(n_words) < 1 / MEAN_SENTENCE_WORDS) | last) & ~heading
    sentence_start = (position == 0) | np.concatenate([[True], sentence_end[:-1]])
    comma = (rng.random(n_words) < COMMA_PROBABILITY) & ~sentence_end & ~sentence_start & ~heading
    capital = sentence_start | (heading & (rng.random(n_words) < 0.6))
    variant = np.where(sentence_end, np.where(capital, CAPITALIZED_PERIOD, PERIOD),
                       np.where(comma, COMMA, np.where(capital, CAPITALIZED, PLAIN)))
    form = table[rng.integers(0, len(table), n_words)].astype(np.int64) * 5 + variant

    lengths = forms.lengths[form]
    line_bytes = np.add.reduceat(lengths, line_starts)
    kept_lines = min(n_lines, int(np.searchsorted(np.cumsum(line_bytes), max_bytes)) + 1)
    kept_words = int(words_per_line[:kept_lines].sum())
    form, lengths = form[:kept_words], lengths[:kept_words]
    text = forms.text(form)
    text[np.cumsum(line_bytes[:kept_lines]) - 1] = ord("\n")  # each line's last space ends the line
    kinds = kinds[:kept_lines]
    counts = {"lines": kept_lines, "words": kept_words}
    counts.update({f"{kind}_lines": int((kinds == i).sum()) for i, kind in enumerate(LINE_KINDS)})
    return text.tobytes(), counts


def generate_corpus(path: str | Path, n_bytes: int, seed: int = 0) -> dict:
    """Write an English-like corpus of about `n_bytes` (at most one line more) to `path`, one document per line,
    in chunks (memory does not grow with the size). Reproducible for a seed; an existing file with the same size
    and seed is reused. Returns the description also stored beside it as `<path>.json`."""
    path = Path(path)
    sidecar = path.with_name(path.name + ".json")
    wanted = {"generator_version": GENERATOR_VERSION, "seed": seed, "requested_bytes": int(n_bytes)}
    if path.is_file() and sidecar.is_file():
        description = json.loads(sidecar.read_text())
        if {k: description.get(k) for k in wanted} == wanted and path.stat().st_size == description["bytes"]:
            return {**description, "path": str(path), "generate_seconds": 0.0, "reused": True}

    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    entries, probabilities = vocabulary(rng)
    forms = WordForms(entries)
    table = sampling_table(probabilities)
    mean_word_bytes = float((probabilities * forms.lengths[PLAIN::5]).sum()) + 0.15  # + punctuation, roughly
    mean_line_bytes = mean_line_words() * mean_word_bytes
    totals = {"bytes": 0, "lines": 0, "words": 0} | {f"{kind}_lines": 0 for kind in LINE_KINDS}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as out:
            while totals["bytes"] < n_bytes:
                remaining = n_bytes - totals["bytes"]
                n_lines = max(1, int(min(remaining, CHUNK_BYTES) / mean_line_bytes * 1.2))
                text, counts = corpus_chunk(rng, forms, table, n_lines, remaining)
                out.write(text)
                totals["bytes"] += len(text)
                for key, value in counts.items():
                    totals[key] += value
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    description = {**wanted, **totals, "vocabulary_entries": len(entries)}
    atomic_write_json(sidecar, description)
    return {**description, "path": str(path), "generate_seconds": round(time.perf_counter() - started, 2),
            "reused": False}


