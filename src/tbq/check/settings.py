"""The settings of a row-function check, in one frozen record passed down from the public API to the runner.

:func:`tbq.check.check_kernel`, :func:`~tbq.check.check_library`,
:func:`~tbq.check.check_program` and :func:`~tbq.check.check_target` accept
the settings as keywords (``blocks=``, ``examples=``, ...) or as one
:class:`CheckSettings` (``settings=``); either way they build one record,
validated once here, and hand it down unchanged.

>>> s = CheckSettings(blocks=400, examples=0, accept="nibble_order")
>>> s.blocks, s.fuzzes, sorted(s.accept)
(400, False, ['nibble_order'])
>>> CheckSettings(blocks=0, examples=0)
Traceback (most recent call last):
...
tbq.errors.TbqValueError: blocks and examples are both 0: nothing would be checked; give blocks >= 1 or examples >= 1 (or seconds)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import TbqValueError, check_int, check_number
from ..golden.settings import settings_with
from .diagnose import DIAGNOSES

__all__ = ["CheckSettings", "DEFAULT_BLOCKS", "DEFAULT_EXAMPLES", "DEFAULT_K", "accept_names", "check_accept"]

#: The fragility margin in float32 ulps unless told otherwise. ``tbq golden`` marks 4 ulps, but
#: a TBQ kernel that sums the norm's squares pairwise instead of sequentially moves rotated
#: coordinates by up to 6 ulps (measured on 100,000 golden blocks of TBQ4_0 and TBQ3_0; 5 leaves
#: 10 blocks outside the mask), so the check accepts 8.
DEFAULT_K = 8
#: Blocks of the golden phase (and of the decoders' bytes phase) unless told otherwise.
DEFAULT_BLOCKS = 20_000
#: Hypothesis examples per direction unless told otherwise.
DEFAULT_EXAMPLES = 100


def accept_names(accept: str | Iterable[str] | None) -> frozenset[str]:
    """``accept`` (one name, names, or None) as a set of names; not names at all is refused. What the names may be
    is the caller's to check (:func:`check_accept`, :func:`tbq.check.dot.check_dot_accept`)."""
    if isinstance(accept, str):
        accept = (accept,)
    try:
        return frozenset(accept or ())
    except TypeError:
        raise TbqValueError(f"accept must be names of classes or diagnoses, got {accept!r}") from None


def check_accept(accept: str | Iterable[str] | None) -> frozenset[str]:
    """``accept`` as a set of names, each a waivable class or a diagnosis name; anything else is refused naming the choices."""
    names = accept_names(accept)
    choices = ("fragile", "tie_rule", "undefined") + DIAGNOSES
    bad = sorted(str(n) for n in names if n not in choices)
    if bad:
        raise TbqValueError(
            f"cannot accept {', '.join(map(repr, bad))}: choose classes fragile, tie_rule, undefined or a diagnosis: "
            f"{', '.join(DIAGNOSES)} (equivalent blocks are always accepted, wrong ones only through a diagnosis)"
        )
    return names


def _int(name: str, v: object, lo: int) -> int:
    return check_int(v, name, lo=lo, expected=f"an integer >= {lo}", error=TbqValueError)


@dataclass(frozen=True, kw_only=True)
class CheckSettings:
    """How hard and how a row-function check looks (every field keyword-only, validated at construction).

    ``accept`` may be given as one name or any iterable of names; it is stored as a ``frozenset``.
    """

    #: Blocks of the golden phase and of the decoders' bytes phase (0 skips both).
    blocks: int = DEFAULT_BLOCKS
    #: Hypothesis examples per direction (0 skips the fuzz phase, which needs hypothesis).
    examples: int = DEFAULT_EXAMPLES
    #: A time budget per direction for the fuzz phase instead of ``examples`` (None: count examples).
    seconds: float | None = None
    #: Fragile blocks (reduction-order or FMA differences inside the golden masks) fail too.
    exact: bool = False
    #: The fragility margin in float32 ulps.
    k: int = DEFAULT_K
    #: The golden families' seed and the fuzz's.
    seed: int = 0
    #: Progress on stderr: True, False, or None (when stderr is a terminal).
    progress: bool | None = False
    #: Class names (fragile, tie_rule, undefined: accepted even under ``exact``) or diagnosis names the check waives,
    #: so that it goes on to the next distinct failure.
    accept: frozenset[str] = field(default=frozenset())
    #: A directory for the counterexamples' ``.npz`` and ``.c`` files, written only when something fails.
    out: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: the normalised values are set once, here
        put(self, "blocks", _int("blocks", self.blocks, 0))
        put(self, "examples", _int("examples", self.examples, 0))
        put(self, "k", _int("k (the fragility margin in ulps)", self.k, 0))
        put(self, "seed", _int("seed", self.seed, 0))
        if self.seconds is not None:
            put(
                self,
                "seconds",
                check_number(
                    self.seconds,
                    "seconds",
                    lo=0,
                    lo_open=True,
                    expected="a positive number of seconds or None",
                    error=TbqValueError,
                ),
            )
        if not isinstance(self.exact, (bool, np.bool_)):
            raise TbqValueError(f"exact must be True or False, got {self.exact!r}")
        put(self, "exact", bool(self.exact))
        if not self.blocks and not self.examples and not self.seconds:
            raise TbqValueError(
                "blocks and examples are both 0: nothing would be checked; give blocks >= 1 or examples >= 1 (or seconds)"
            )
        put(self, "accept", check_accept(self.accept))

    @property
    def fuzzes(self) -> bool:
        """Whether the fuzz phase runs (``examples`` or ``seconds`` given)."""
        return bool(self.examples) or bool(self.seconds)

    @classmethod
    def of(cls, settings: CheckSettings | None = None, keywords: Mapping[str, Any] | None = None) -> CheckSettings:
        """``settings`` with ``keywords`` (names of its fields) replaced; ``CheckSettings(**keywords)`` without it.
        A keyword that is not a setting is refused naming the settings."""
        return settings_with(cls, settings, keywords, "tbq.check.CheckSettings")

    def report_settings(self, reference_backend: str) -> dict[str, Any]:
        """The settings a :class:`~tbq.check.report.CheckReport` records (with the reference codec's backend and
        hypothesis' version)."""
        try:
            import hypothesis

            hv = hypothesis.__version__
        except ImportError:
            hv = None
        return {
            "blocks": self.blocks,
            "examples": self.examples,
            "seconds": self.seconds,
            "exact": self.exact,
            "accept": sorted(self.accept),
            "fragile_ulps": self.k,
            "seed": self.seed,
            "reference_backend": reference_backend,
            "hypothesis": hv,
        }
