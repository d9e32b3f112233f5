"""pipeline/data/generated_corpus.py: the size, the kinds of line, reproducibility and reuse of a generated corpus."""

from pipeline.data.generated_corpus import generate_corpus


def test_generated_corpus_has_the_requested_size_and_realistic_lines(tmp_path):
    path = tmp_path / "corpus.txt"
    description = generate_corpus(path, 2_000_000, seed=3)

    text = path.read_bytes()
    assert len(text) == description["bytes"]
    assert abs(len(text) - 2_000_000) / 2_000_000 < 0.03  # the last line overshoots a little
    lines = text.decode("ascii").split("\n")
    assert lines[-1] == ""  # every line ends with a newline
    words = [len(line.split()) for line in lines[:-1]]
    assert len(words) == description["lines"] and sum(words) == description["words"]
    assert min(words) >= 1  # no empty documents
    assert any(n <= 6 for n in words)  # headings
    assert sum(40 <= n <= 200 for n in words) > 0.8 * len(words)  # mostly paragraphs
    assert any(n > 2_000 for n in words)  # articles, far longer than 512 tokens
    paragraph = next(line for line in lines if 40 <= len(line.split()) <= 200)
    assert paragraph[0].isupper() and paragraph.endswith(".")  # sentences: capitalized, ended by a period
    assert all(sentence[0].isupper() or sentence[0].isdigit() for sentence in paragraph.split(". ")[1:])


def test_generated_corpus_is_reproducible_for_a_seed_and_reused(tmp_path):
    first = generate_corpus(tmp_path / "a.txt", 300_000, seed=7)
    again = generate_corpus(tmp_path / "b.txt", 300_000, seed=7)
    other = generate_corpus(tmp_path / "c.txt", 300_000, seed=8)
    assert (tmp_path / "a.txt").read_bytes() == (tmp_path / "b.txt").read_bytes()
    assert (tmp_path / "a.txt").read_bytes() != (tmp_path / "c.txt").read_bytes()
    assert not first["reused"] and not again["reused"] and not other["reused"]

    modified = (tmp_path / "a.txt").stat().st_mtime_ns
    reused = generate_corpus(tmp_path / "a.txt", 300_000, seed=7)
    assert reused["reused"] and reused["lines"] == first["lines"]
    assert (tmp_path / "a.txt").stat().st_mtime_ns == modified

    regenerated = generate_corpus(tmp_path / "a.txt", 300_000, seed=9)  # another seed: not reused
    assert not regenerated["reused"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "a.txt.json", "b.txt", "b.txt.json", "c.txt",
                                                           "c.txt.json"]  # no temporary file left


