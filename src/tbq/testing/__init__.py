"""Testing helpers for users of :mod:`tbq` (and for tbq's own test suite).

The hypothesis strategies live in :mod:`tbq.testing.strategies`; import them
explicitly (hypothesis is an optional dependency, installed by ``tbq[test]``)::

    from tbq.testing import strategies as tst

Importing :mod:`tbq.testing` itself is cheap: it does not import hypothesis.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["strategies"]


def __getattr__(name: str) -> ModuleType:
    # ``tbq.testing.strategies`` as an attribute, imported on first use only.
    if name == "strategies":
        import importlib

        return importlib.import_module(".strategies", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
