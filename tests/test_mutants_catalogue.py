"""benchmarks/mutants.py stays plantable: every mutant's original text stands exactly once in its file.

The mutation harness (benchmarks/mutation.py) refuses a mutant whose text is missing or ambiguous, but it runs
outside CI: this test notices when a refactor moves or rewrites a line a mutant targets, in the same commit.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _catalogue():
    spec = importlib.util.spec_from_file_location("tbq_mutants_catalogue", ROOT / "benchmarks" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is made
    spec.loader.exec_module(module)
    return module.CATALOGUE


CATALOGUE = _catalogue()


@pytest.mark.parametrize("mutant", CATALOGUE, ids=[m.name for m in CATALOGUE])
def test_every_mutant_targets_one_line_that_exists(mutant):
    text = (ROOT / mutant.file).read_text()
    assert text.count(mutant.old) == 1, (
        f"{mutant.name}: {mutant.old!r} stands {text.count(mutant.old)} times in {mutant.file}"
    )
    assert mutant.new != mutant.old
    for t in mutant.tests:
        assert (ROOT / t.split("::")[0]).exists(), f"{mutant.name}: no test file {t}"
