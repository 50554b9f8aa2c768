"""The block formats: one module per format family, each registering itself.

``tbq.formats`` is the registry: :data:`FORMATS` (name -> :class:`FormatInfo`,
the sizes and layout), :func:`get_format` (a :class:`Format` with its options:
the NumPy spec, the numba kernels, fields, trace and fragility). Modules:

- :mod:`tbq.formats.base`: the interface and the registry;
- :mod:`tbq.formats.q8_0`, :mod:`tbq.formats.q4_0`: ggml's types;
- :mod:`tbq.formats.tbq`: TBQ4_0 and TBQ3_0.

Each has a ``*_kernels`` sibling with its numba twins. Adding a format is the
recipe in docs/architecture.md.

>>> formats()[:4]
('q8_0', 'q4_0', 'tbq4_0', 'tbq3_0')
>>> get_format("q4_0").fields(np.zeros((2, 18), np.uint8))["qs"].shape
(2, 1, 32)
"""

from __future__ import annotations

import numpy as np  # noqa: F401  (doctest namespace)

from ..errors import ConfigError
from .base import FORMAT_CLASSES, FORMATS, Field, Format, FormatInfo

# Registration order is the order of docs/formats.md and of every listing.
from . import q8_0 as _q8_0  # noqa: E402,F401
from . import q4_0 as _q4_0  # noqa: E402,F401
from . import tbq as _tbq  # noqa: E402,F401

__all__ = ["FormatInfo", "Format", "Field", "FORMATS", "formats", "format_info", "format_class", "get_format"]


def formats() -> tuple[str, ...]:
    """Names of the block formats, in the order of docs/formats.md.

    >>> formats()[0]
    'q8_0'
    """
    return tuple(FORMATS)


def format_info(name: str) -> FormatInfo:
    """The :class:`FormatInfo` row of ``name`` (raises ``ConfigError`` when unknown)."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown format {name!r}; known formats: {', '.join(FORMATS)}") from None


def format_class(name: str) -> type:
    """The :class:`Format` subclass of ``name``."""
    format_info(name)
    return FORMAT_CLASSES[name]


def get_format(name: str, **options) -> Format:
    """The format ``name`` with its format options (e.g. TBQ's ``codebook``, ``signs``).

    >>> get_format("tbq3_0", codebook="turboq-mtp").config()["codebook"]
    'turboq-mtp'
    """
    return format_class(name)(**options)
