"""Every ``>>>`` example in the public docstrings runs and prints what it says."""

import doctest
import importlib
import warnings

import numpy as np
import pytest


def _modules():
    """Every module of the package (walked, so a new module is never forgotten); numba kernels have no examples."""
    import pkgutil

    import tbq

    names = ["tbq"]
    for info in pkgutil.walk_packages(tbq.__path__, "tbq."):
        if info.name.endswith(("_kernels", "__main__")) or info.name == "tbq.kernels":
            continue
        names.append(info.name)
    return names


MODULES = _modules()
#: Public modules whose docstrings must carry runnable examples.
MUST_HAVE_EXAMPLES = {
    "tbq",
    "tbq.codebooks",
    "tbq.rotation",
    "tbq.packing",
    "tbq.codecs",
    "tbq.metrics",
    "tbq.synthetic",
    "tbq.attention",
    "tbq.progress",
}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    with warnings.catch_warnings():
        # The strategies' examples show a draw with hypothesis' ``.example()``, the way a reader
        # explores a strategy; hypothesis warns about ``.example()`` outside an interactive session.
        # Only that warning of that package is ignored, only here.
        from hypothesis.errors import NonInteractiveExampleWarning

        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        result = doctest.testmod(module, extraglobs={"np": np}, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
    if name in MUST_HAVE_EXAMPLES:
        assert result.attempted > 0, f"{name} has no examples"
