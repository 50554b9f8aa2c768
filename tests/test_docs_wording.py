"""User docs say what to expect and how to check it, not which issue or round of work changed what.

History belongs in CHANGELOG.md and benchmarks/results/README.md; the pages
under docs/ and the README name no issue number and no numbered or ordinal
round of work.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: How a lab notebook names its history: "issue 22", "issue-19", "issues 18, 20", "issue #7", "the issue's targets",
#: "round 4", "the sixth round", "rounds of issue 21".
HISTORY = re.compile(
    r"\bissues?[ -]#?\d+"
    r"|\b(?:the|this|that) issue\b|\bissue's\b"
    r"|\bround \d"
    r"|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth)\s+rounds?\b"
    r"|\brounds?\s+of\s+(?:the\s+)?issue",
    re.IGNORECASE,
)


def _pages() -> list[str]:
    pages = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
    return [*pages, "README.md"]


def _hits(page: str) -> list[str]:
    hits = []
    for i, line in enumerate((ROOT / page).read_text(encoding="utf-8").splitlines(), 1):
        hits += [f"{page}:{i}: {m.group(0)!r} in {line.strip()[:100]!r}" for m in HISTORY.finditer(line)]
    return hits


def test_the_pattern_catches_what_it_is_for():
    caught = [
        "Issue 22's sixth round",
        "the fuzz run of issue 21",
        "(the issue-19 target: under 10 s)",
        "the targets of issue 13",
        "round 4 replaced the index",
        "see the fifth round below",
        "after the merges of issues 18, 20 and 21",
        "the issue's targets",
        "the rounds of issue 22",
    ]
    kept = [
        "median of 7 interleaved rounds",
        "a value that rounds to fp16 infinity",
        "round-half-up of v",
        "the per-round ratios",
        "best of the rounds",
        "vLLM's PR #38479 rotation",
        "bit for bit on every issue of the file",
    ]
    assert [s for s in caught if not HISTORY.search(s)] == []
    assert [s for s in kept if HISTORY.search(s)] == []


@pytest.mark.parametrize("page", _pages())
def test_user_docs_name_no_issue_or_round(page):
    assert _hits(page) == []
