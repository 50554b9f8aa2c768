"""A block's numbers, from the block's own seeded generator: the families' helpers for everything but the family and its mode.

Part of :mod:`tbq.testing.strategies` (see its docstring).

Hypothesis chooses each block's family, the family's mode (the ``family: ...``
and ``<family>: <mode>`` events of ``--hypothesis-show-statistics``) and an
integer seed; everything else about the block (scales, positions, signs,
exponents, which threshold) comes from ``numpy.random.default_rng(seed)``
through the functions here. One hypothesis choice costs tens of microseconds
of the engine's bookkeeping whatever it draws, and a block used to make five
to twelve of them: that was most of the cost of a fuzz example. The same seed
gives the same block, so an example still replays exactly and a failing one
still shrinks to the fewest blocks and the simplest families and modes.

Like hypothesis's own ``integers`` and ``floats``, these return the ends of
their range more often than a uniform draw would (one time in eight each),
because the ends are often the hazard: ``2**-24``, the smallest fp16
subnormal, is an end of the subnormal family's range.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

_T = TypeVar("_T")

#: How often each end of a range is returned (the rest is uniform over the range).
END_WEIGHT = 1 / 8


def _end(rng: np.random.Generator, lo: _T, hi: _T) -> _T | None:
    """``lo`` or ``hi`` with probability :data:`END_WEIGHT` each, else ``None`` (then draw from the range)."""
    u = rng.random()
    if u < END_WEIGHT:
        return lo
    if u < 2 * END_WEIGHT:
        return hi
    return None


def integer(rng: np.random.Generator, lo: int, hi: int) -> int:
    """An integer in ``[lo, hi]`` (both ends included), each end with probability about 1/8."""
    end = _end(rng, lo, hi)
    return int(rng.integers(lo, hi + 1)) if end is None else end


def real(rng: np.random.Generator, lo: float, hi: float) -> float:
    """A float in ``[lo, hi]``, each end exactly with probability about 1/8."""
    end = _end(rng, lo, hi)
    return float(rng.uniform(lo, hi)) if end is None else end


def pick(rng: np.random.Generator, options: Sequence[_T]) -> _T:
    """One of ``options``, uniformly (repeat an option to weight it)."""
    return options[int(rng.integers(0, len(options)))]


def distinct(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[int]:
    """``n`` distinct integers of ``[lo, hi]`` in random order (``n <= hi - lo + 1``)."""
    return [int(v) + lo for v in rng.choice(hi - lo + 1, n, replace=False)]


def sign(rng: np.random.Generator) -> np.float32:
    """``+1`` or ``-1`` as float32, each with probability 1/2."""
    return np.float32(1) if rng.random() < 0.5 else np.float32(-1)
