"""Exception types.

Every error raised by tbq at its public boundary subclasses :class:`TbqError`
and one of the built-in ``ValueError`` / ``TypeError``, so callers can catch
either the library-specific or the generic family.
"""

from __future__ import annotations

import math
import numbers
import re
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeGuard

import numpy as np

__all__ = [
    "TbqError",
    "TbqValueError",
    "TbqTypeError",
    "BlockShapeError",
    "NonFiniteError",
    "ScaleOverflowError",
    "EncodedLengthError",
    "ConfigError",
    "MemoryLimitError",
    "is_integer",
    "check_int",
    "check_number",
    "check_choice",
    "deprecated_names",
]


#: A NumPy scalar's repr (NumPy 2 writes ``np.float32(inf)``, ``np.int64(-3)``), as it lands in a message.
_NUMPY_REPR = re.compile(r"\bnp\.(?:float|int|uint|bool|complex|longdouble|str_|bytes_)\w*\(([^()]*)\)")


def plain(message: str) -> str:
    """``message`` with NumPy scalar reprs shown as their values: ``np.float32(inf)`` -> ``inf``.

    >>> plain("got np.float32(inf) and np.int64(-3), not np.str_('x')")
    "got inf and -3, not 'x'"
    """
    return _NUMPY_REPR.sub(r"\1", message)


class TbqError(Exception):
    """Base class of every exception tbq raises on bad input or configuration.

    A message never shows NumPy reprs: ``got np.float64(nan)`` reads ``got nan`` (:func:`plain`).
    """

    def __init__(self, *args: object) -> None:
        if args and isinstance(args[0], str):
            args = (plain(args[0]),) + args[1:]
        super().__init__(*args)


class TbqValueError(TbqError, ValueError):
    """A value is wrong (shape, content, configuration)."""


class TbqTypeError(TbqError, TypeError):
    """An argument has the wrong type or dtype."""


class BlockShapeError(TbqValueError):
    """The last axis is not a whole number of blocks (or of encoded blocks)."""


class EncodedLengthError(BlockShapeError):
    """An encoded byte buffer's last axis is not a multiple of the type size."""


class NonFiniteError(TbqValueError):
    """The input holds NaN or +-Inf; ``block`` is the first offending block (flat index)."""

    def __init__(self, message: str, block: int | None = None) -> None:
        super().__init__(message)
        self.block = block


class ScaleOverflowError(TbqValueError):
    """A block's fp16 scale would round to infinity.

    ``block`` is the flat block index and ``scale`` the float32 value that does not fit.
    """

    def __init__(self, message: str, block: int | None = None, scale: float | None = None) -> None:
        super().__init__(message)
        self.block = block
        self.scale = scale


class ConfigError(TbqValueError):
    """An invalid codec configuration: unknown format, bad codebook, bad sign vectors."""


class MemoryLimitError(TbqValueError):
    """Work whose memory is known in advance would not fit in the memory available; refused before it starts.

    ``needed`` and ``available`` are in bytes.
    """

    def __init__(self, message: str, needed: int | None = None, available: int | None = None) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available


# ---------------------------------------------------------------------------
# Argument checks: one helper per kind of argument (as hypothesis.extra.numpy
# validates every argument through hypothesis.internal.validation), so every
# public function refuses the same things with the same words.
# ---------------------------------------------------------------------------


def is_integer(value: object) -> TypeGuard[int | np.integer[Any]]:
    """``True`` for a Python or NumPy integer, ``False`` for anything else, bools included.

    >>> is_integer(3), is_integer(np.int8(3)), is_integer(True), is_integer(3.0)
    (True, True, False, False)
    """
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _range_words(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"between {lo} and {hi}"
    return f"at least {lo}" if lo is not None else f"at most {hi}"


def check_int(
    value: object,
    name: str,
    *,
    lo: int | None = None,
    hi: int | None = None,
    expected: str | None = None,
    error: type[TbqError] | None = None,
) -> int:
    """``value`` as an ``int`` if it is an integer (not a bool) in ``[lo, hi]``; otherwise raise.

    Without ``expected``, a non-integer raises :class:`TbqTypeError` ("``name``
    must be an integer") and an integer out of range :class:`TbqValueError`
    ("``name`` must be at least ``lo``"). With ``expected`` (the whole
    requirement, e.g. ``"a positive integer or None (all cores)"``) both
    failures say ``name must be <expected>, got <value>``. ``error`` replaces
    the exception class of both failures (e.g. :class:`ConfigError` for a
    codec setting).

    >>> check_int(np.int64(5), "tokens", lo=1)
    5
    >>> check_int(0, "tokens", lo=1)
    Traceback (most recent call last):
    ...
    tbq.errors.TbqValueError: tokens must be at least 1, got 0
    >>> check_int(True, "seed", lo=0, expected="a non-negative integer", error=TbqValueError)
    Traceback (most recent call last):
    ...
    tbq.errors.TbqValueError: seed must be a non-negative integer, got True
    """
    if not is_integer(value):
        raise (error or TbqTypeError)(f"{name} must be {expected or 'an integer'}, got {value!r}")
    n = int(value)

    if (lo is not None and n < lo) or (hi is not None and n > hi):
        raise (error or TbqValueError)(f"{name} must be {expected or _range_words(lo, hi)}, got {n}")
    return n


def check_number(
    value: object,
    name: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    expected: str | None = None,
    error: type[TbqError] | None = None,
) -> float:
    """``value`` as a finite ``float`` if it is a real number (not a bool) in its range; otherwise raise.

    ``lo``/``hi`` bound it (``lo_open``: ``value > lo`` instead of ``>=``);
    NaN and infinities are always refused. The messages and ``error`` work as
    in :func:`check_int`.

    >>> check_number(np.float32(0.5), "scale", lo=0, lo_open=True)
    0.5
    >>> check_number(float("nan"), "scale", lo=0, lo_open=True, expected="a finite number > 0")
    Traceback (most recent call last):
    ...
    tbq.errors.TbqValueError: scale must be a finite number > 0, got nan
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise (error or TbqTypeError)(f"{name} must be {expected or 'a real number'}, got {value!r}")
    x = float(value)
    below = lo is not None and (x <= lo if lo_open else x < lo)
    if not math.isfinite(x) or below or (hi is not None and x > hi):
        if expected is None:
            words = "finite" if lo is None and hi is None else _range_words(lo, hi)
            if lo_open and lo is not None and hi is None:
                words = f"greater than {lo}"
            expected = words
        raise (error or TbqValueError)(f"{name} must be {expected}, got {x}")
    return x


def check_choice(value: Any, name: str, choices: Collection[Any], *, error: type[TbqError] | None = None) -> Any:
    """``value`` if it is one of ``choices``; otherwise :class:`ConfigError` (or ``error``) naming them.

    >>> check_choice("numba", "backend", ("numpy", "numba"))
    'numba'
    >>> check_choice("cuda", "backend", ("numpy", "numba"))
    Traceback (most recent call last):
    ...
    tbq.errors.ConfigError: backend must be one of ('numpy', 'numba'), got 'cuda'
    """
    try:
        ok = value in choices
    except TypeError:  # an unhashable value and a set or dict of choices
        ok = False
    if not ok:
        raise (error or ConfigError)(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def deprecated_names(module: str, renames: Mapping[str, str], value: Callable[[str], Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving the old names of classes renamed because they shared a format class's
    name: ``renames`` maps old -> new, ``value(new)`` gives the object; each read warns, naming the new spelling.

    >>> import warnings
    >>> get = deprecated_names("tbq.example", {"Q8_0": "Q8_0Codec"}, {"Q8_0Codec": 1}.__getitem__)
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     get("Q8_0"), str(w[0].message)
    (1, 'tbq.example.Q8_0 is deprecated (the format class tbq.formats.*.Q8_0 has the same name): use tbq.example.Q8_0Codec')
    """

    def __getattr__(name: str) -> Any:
        new = renames.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is deprecated (the format class tbq.formats.*.{name} has the same name): use "
            f"{module}.{new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return value(new)

    return __getattr__
