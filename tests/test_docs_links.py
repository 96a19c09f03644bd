"""Every link from README.md and docs/*.md to a page or a section leads to one.

Sections move between pages (session 20 moved the per-session measurement logs of
broker.md, filemq.md and bridges.md to performance.md): a link such as
``[Paging](broker.md#paging-session-5)`` or ``[the log](#persistence)`` must still name
a page that exists and a heading on it.  Anchors are made as GitHub makes them (lower
case, punctuation dropped, spaces to hyphens); lines inside fenced code are not read.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: ``](target#anchor)`` and ``](#anchor)``; the target may be empty (this page).
_ANCHORED = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")
#: ``](page.md)`` without an anchor.
_PAGE = re.compile(r"\]\(([^)#\s]+\.md)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text (``Direct I/O`` -> ``direct-io``)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def prose(page: Path) -> list[tuple[int, str]]:
    """(line number, line) of a page outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def anchors(page: Path) -> set[str]:
    return {anchor(line.lstrip("#")) for _, line in prose(page) if re.match(r"#{1,6} ", line)}


def broken_links(page: Path) -> list[str]:
    found = []
    for number, line in prose(page):
        for target, name in _ANCHORED.findall(line):
            if target.startswith(("http://", "https://")):
                continue
            dest = (page.parent / target).resolve() if target else page
            if not dest.is_file() or name not in anchors(dest):
                found.append(f"{page.name}:{number}: {target}#{name}")
        for target in _PAGE.findall(line):
            external = target.startswith(("http://", "https://"))
            if not external and not (page.parent / target).is_file():
                found.append(f"{page.name}:{number}: {target} (no such page)")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_leads_to_a_page_and_a_section(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, "\n".join(broken)


def test_a_link_to_a_moved_section_is_found(tmp_path: Path) -> None:
    """The check is live: a section that left its page breaks the links to it."""
    (tmp_path / "a.md").write_text("# A\n\n## Kept\n\nsee [it](b.md#moved) and [here](#kept)\n")
    (tmp_path / "b.md").write_text("# B\n\n```\n## Moved\n```\n\n[gone](c.md)\n")
    assert broken_links(tmp_path / "a.md") == ["a.md:5: b.md#moved"]
    assert broken_links(tmp_path / "b.md") == ["b.md:7: c.md (no such page)"]
    assert anchor("## Paging (session 5)".lstrip("#")) == "paging-session-5"
