"""The README stays a page a user reads to start: under 12 KB, the long tables on the docs/ pages it links."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_is_under_12_kb():
    size = (ROOT / "README.md").stat().st_size
    assert size < 12 * 1024, f"README.md is {size} bytes: move the detail to a docs/ page it links (docs/*.md)"


def test_every_docs_page_the_readme_links_exists():
    readme = (ROOT / "README.md").read_text()
    linked = {word.strip("()[]`,.:;*") for word in readme.split() if "docs/" in word}
    pages = {name[name.index("docs/"):] for name in linked}
    pages = {p[:p.index(".md") + 3] for p in pages if ".md" in p}
    assert pages, "README.md links no docs/ page"
    assert sorted(p for p in pages if not (ROOT / p).is_file()) == []
