"""Every relative link in README.md and docs/*.md names a file that exists, and a `#section` of a
Markdown page names one of its headings (as GitHub makes them into anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infra.settings import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(path: Path) -> str:
    """The page without its fenced code blocks (a link there is not rendered)."""
    return FENCE.sub("", path.read_text())


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens,
    a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(_prose(path)):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(path: Path) -> list[str]:
    return [a or b for a, b in LINK.findall(_prose(path))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor in {resolved.name}")
    assert not broken, f"{page.relative_to(REPO_ROOT)}: " + "; ".join(broken)


def test_the_anchors_are_githubs():
    page = REPO_ROOT / "docs" / "metrics.md"
    assert "the-api-get-metrics" in anchors(page)  # "## The API: `GET /metrics`"
