"""The README and docs/: relative links point at files that exist, and the README stays short."""

import re
from pathlib import Path

import pytest

from tests.paths import PROJECT_ROOT

README = PROJECT_ROOT / "README.md"
DOCS = sorted((PROJECT_ROOT / "docs").glob("*.md"))
MAX_README_LINES = 150

FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
MARKDOWN_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def relative_links(markdown: Path) -> list[str]:
    """Every relative link target of a Markdown file, outside fenced code blocks, without its #anchor; links
    that are only an anchor (same page) or external are left out."""
    text = FENCE.sub("", markdown.read_text(encoding="utf-8"))
    targets = []
    for target in MARKDOWN_LINK.findall(text):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def missing_targets(markdown: Path) -> list[str]:
    return [target for target in relative_links(markdown) if not (markdown.parent / target).exists()]


def test_the_docs_folder_has_pages():
    assert DOCS, "docs/*.md: no pages found"


def test_readme_links_to_docs_and_markdown_files_resolve():
    targets = relative_links(README)
    assert any(target.startswith("docs/") for target in targets), "README.md links to no page of docs/"
    readme_doc_links = [t for t in targets if t.startswith("docs/") or t.endswith(".md")]
    missing = [t for t in readme_doc_links if not (PROJECT_ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_relative_link_of_the_readme_resolves():
    assert not missing_targets(README), f"README.md: broken relative links {missing_targets(README)}"


def test_readme_is_at_most_150_lines():
    n_lines = len(README.read_text(encoding="utf-8").splitlines())
    assert n_lines <= MAX_README_LINES, f"README.md has {n_lines} lines; at most {MAX_README_LINES}"


def test_every_page_of_docs_is_linked_from_the_readme():
    linked = {(PROJECT_ROOT / t).resolve() for t in relative_links(README)}
    unlinked = [page.name for page in DOCS if page.resolve() not in linked]
    assert not unlinked, f"docs pages missing from the README's map of the docs: {unlinked}"


@pytest.mark.parametrize("page", DOCS, ids=[page.name for page in DOCS])
def test_relative_links_of_each_docs_page_resolve(page: Path):
    missing = missing_targets(page)
    assert not missing, f"docs/{page.name} links to files that do not exist: {missing}"


def test_the_link_finder_sees_links_and_skips_code_and_external_ones(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("See [a](a.md#part), [b](sub/b.txt), [web](https://example.org/x.md), [here](#top).\n"
                    "```bash\necho [c](c.md)\n```\n", encoding="utf-8")
    assert relative_links(page) == ["a.md", "sub/b.txt"]
    (tmp_path / "a.md").write_text("", encoding="utf-8")
    assert missing_targets(page) == ["sub/b.txt"]
