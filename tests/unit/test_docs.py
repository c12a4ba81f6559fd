"""The README and docs/: every relative link and anchor resolves, every doc is reachable
from the README, and the README stays short enough to read first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _anchor(heading: str) -> str:
    # GitHub's rule: lower case, drop punctuation but `-` and `_`, spaces become `-`.
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def _links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def _broken(page: Path) -> list[str]:
    broken = []
    for link in _links(page):
        if re.match(r"^[a-z]+:", link):
            continue  # an absolute URL: not checked offline
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        missing_anchor = anchor and path.suffix == ".md" and anchor not in _anchors(path)
        if not path.exists() or missing_anchor:
            broken.append(link)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    assert _broken(page) == []


def test_every_doc_is_linked_from_the_readme() -> None:
    linked = {
        (ROOT / link.partition("#")[0]).resolve()
        for link in _links(ROOT / "README.md")
        if link.startswith("docs/")
    }
    assert [d.name for d in DOCS if d.resolve() not in linked] == []


def test_the_readme_fits_on_a_screen_or_so() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_the_check_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [bad](#nowhere) [gone](missing.md)\n")
    assert _broken(page) == ["#nowhere", "missing.md"]
