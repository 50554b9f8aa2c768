"""hypothesis, imported once for the strategies package, with the one message a user without it sees.

Part of :mod:`tbq.testing.strategies` (see its docstring): every module of the package imports
hypothesis through here, so the import guard and its message live in one place.
"""

from __future__ import annotations

try:
    import hypothesis
    import hypothesis.extra.numpy as npst
    import hypothesis.strategies as st
    from hypothesis.errors import InvalidArgument
except ImportError as e:  # pragma: no cover - exercised only without hypothesis
    raise ImportError(
        "`tbq.testing.strategies` requires `hypothesis` to be installed: pip install 'tbq[test]' (or pip install hypothesis)"
    ) from e

__all__ = ["hypothesis", "npst", "st", "InvalidArgument"]
