"""Every ``>>>`` example in the public docstrings runs and prints what it says."""

import doctest
import importlib

import numpy as np
import pytest

MODULES = [
    "tbq",
    "tbq.formats",
    "tbq.codebooks",
    "tbq.rotation",
    "tbq.packing",
    "tbq.codecs",
    "tbq.metrics",
    "tbq.synthetic",
    "tbq.budget",
    "tbq.golden",
    "tbq.attention",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"np": np}, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
    if name not in ("tbq.budget", "tbq.golden"):  # some modules' examples are checked by their own tests too
        assert result.attempted > 0, f"{name} has no examples"
