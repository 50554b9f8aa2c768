"""No module of src/tbq is over ~600 lines unless its docstring says why (docs/architecture.md, "one concept per module").

A module that grows past the limit either splits by concern or states, in a paragraph of its docstring
starting "Why one module of this length:", what keeps it one concept; a reader then knows the length is a
decision. The paragraph must not outlive the length: a module back under the limit drops it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tbq"
LIMIT = 600
WHY = "Why one module of this length:"
MODULES = sorted(SRC.rglob("*.py"))


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(SRC)) for p in MODULES])
def test_a_long_module_says_why(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    n = _lines(path)
    if n > LIMIT:
        assert WHY in doc, f"{path.relative_to(SRC)} has {n} lines: split it by concern or say why in its docstring"
        (paragraph,) = [p for p in doc.split("\n\n") if p.startswith(WHY)]
        assert len(paragraph) > len(WHY) + 40, f"{path.relative_to(SRC)}: the reason is too short to be one"
    else:
        assert WHY not in doc, f"{path.relative_to(SRC)} has {n} lines now: drop its '{WHY}' paragraph"


def test_the_rule_sees_a_long_module():
    long = [p for p in MODULES if _lines(p) > LIMIT]
    assert long, "no module is over the limit: the test above checks nothing but the reverse rule"
