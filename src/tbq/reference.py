"""Deprecated alias of :mod:`tbq.float32`, the float32 helpers the formats' NumPy references share.

The module was named ``tbq.reference``, but it is not the reference (each format's NumPy path is): import
from :mod:`tbq.float32` instead. Reading a name here still works and gives the same object, with a
:class:`DeprecationWarning`.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import float32 as _float32


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # module machinery (__all__, __path__, ...): this alias has none of float32's
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_float32, name)  # AttributeError for a name float32 does not have either
    warnings.warn(
        f"tbq.reference is deprecated: it holds float32 helpers, not the reference; use tbq.float32.{name}",
        DeprecationWarning,
        stacklevel=2,
    )
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_float32.__all__))
