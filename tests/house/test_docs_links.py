"""The docs a user finds in two minutes: a README of at most 200 lines, relative links that
lead somewhere, and a docs/index.md that maps every page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 200

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    """Link targets outside code, without URLs, mail addresses and in-page anchors."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", text))
    targets = _INLINE.findall(text) + _REFERENCE.findall(text)
    return [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", t, re.I)]


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail into docs/ and link it"
    )


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to files that do not exist: {broken}"


def test_index_maps_every_page() -> None:
    index = DOCS / "index.md"
    linked = {(index.parent / t.split("#", 1)[0]).resolve() for t in relative_links(index.read_text(encoding="utf-8"))}
    missing = [p.relative_to(ROOT).as_posix() for p in sorted(DOCS.rglob("*.md")) if p != index and p not in linked]
    assert not missing, f"docs/index.md does not link {missing}: add each to its map"


def test_link_finder_sees_what_it_must() -> None:
    """The finder itself: links in prose count; links in code, URLs and anchors do not."""
    text = (
        "See [a](a.md), ![img](img/x.png) and [b](sub/b.md#part).\n"
        "`[not](code.md)` [web](https://example.com) [mail](mailto:x@y) [top](#top)\n"
        "```\n[fenced](fenced.md)\n```\n"
        "[ref]: ref.md\n"
    )
    assert relative_links(text) == ["a.md", "img/x.png", "sub/b.md#part", "ref.md"]
