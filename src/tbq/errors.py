"""Exception types.

Every error raised by tbq at its public boundary subclasses :class:`TbqError`
and one of the built-in ``ValueError`` / ``TypeError``, so callers can catch
either the library-specific or the generic family.
"""

from __future__ import annotations

import re

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

    def __init__(self, *args):
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

    def __init__(self, message: str, block: int | None = None):
        super().__init__(message)
        self.block = block


class ScaleOverflowError(TbqValueError):
    """A block's fp16 scale would round to infinity.

    ``block`` is the flat block index and ``scale`` the float32 value that does not fit.
    """

    def __init__(self, message: str, block: int | None = None, scale: float | None = None):
        super().__init__(message)
        self.block = block
        self.scale = scale


class ConfigError(TbqValueError):
    """An invalid codec configuration: unknown format, bad codebook, bad sign vectors."""


class MemoryLimitError(TbqValueError):
    """Work whose memory is known in advance would not fit in the memory available; refused before it starts.

    ``needed`` and ``available`` are in bytes.
    """

    def __init__(self, message: str, needed: int | None = None, available: int | None = None):
        super().__init__(message)
        self.needed = needed
        self.available = available
