"""Names a reader can trust: one class per name, no module that is also a function, old spellings deprecated."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tbq


def test_format_names_lists_the_formats_and_calling_the_package_is_deprecated():
    """``tbq.format_names()`` is the listing; ``tbq.formats`` stays the package of format modules, and calling
    it still answers the same tuple with a DeprecationWarning naming the new spelling."""
    import tbq.formats.q4_0

    names = tbq.format_names()
    assert names == tuple(tbq.formats.FORMATS) and names[:2] == ("q8_0", "q4_0")
    assert tbq.formats.format_names is tbq.format_names and tbq.formats.formats is tbq.format_names
    with pytest.warns(DeprecationWarning, match=r"use tbq\.format_names\(\)"):
        assert tbq.formats() == names
    assert tbq.formats.q4_0.Q4_0.__name__ == "Q4_0"  # the package still holds its modules


def test_tbq_itself_never_calls_a_deprecated_spelling():
    """Importing tbq and its public modules with DeprecationWarning as an error raises nothing: no module of the
    package calls tbq.formats() or reads a deprecated alias (tbq.reference, tbq.codecs.Q8_0, ...)."""
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import tbq, tbq.codecs, tbq.compare, tbq.budget, tbq.golden, tbq.check, tbq.attention, tbq.study\n"
        "print(len(tbq.format_names()))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) == len(tbq.formats.FORMATS)
