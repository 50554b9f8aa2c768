"""The block formats: one module per format family, each registering itself.

``tbq.formats`` is the registry: :data:`FORMATS` (name -> :class:`FormatInfo`,
the sizes and layout), :func:`get_format` (a :class:`Format` with its options:
the NumPy spec, the numba kernels, fields, trace and fragility). Modules:

- :mod:`tbq.formats.base`: the interface and the registry;
- :mod:`tbq.formats.q8_0`, :mod:`tbq.formats.q4_0`: ggml's types;
- :mod:`tbq.formats.tbq`: TBQ4_0 and TBQ3_0.

Each has a ``*_kernels`` sibling with its numba twins. Every module of the
package is imported (and so registered) automatically; listings follow the
formats' numeric codes. Adding a format is the recipe in docs/architecture.md.

>>> formats()[:4]
('q8_0', 'q4_0', 'tbq4_0', 'tbq3_0')
>>> get_format("q4_0").fields(np.zeros((2, 18), np.uint8))["qs"].shape
(2, 1, 32)
"""

from __future__ import annotations

import numpy as np  # noqa: F401  (doctest namespace)

import importlib
import pkgutil
import sys
import types

from ..errors import ConfigError
from .base import FORMAT_CLASSES, FORMATS, Field, Format, FormatInfo


def _discover() -> None:
    """Import every format module of this package (a module defining a Format subclass registers it).

    ``*_kernels`` modules (numba) are left for first use. Afterwards the
    registry is ordered by the formats' stable numeric codes, the order of
    docs/formats.md and of every listing.
    """
    for m in pkgutil.iter_modules(__path__):
        if m.name != "base" and not m.name.endswith("_kernels") and not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")
    order = sorted(FORMATS, key=lambda name: FORMATS[name].code)
    for registry in (FORMATS, FORMAT_CLASSES):
        items = {name: registry[name] for name in order}
        registry.clear()
        registry.update(items)


_discover()

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


class _CallableModule(types.ModuleType):
    """``tbq.formats`` is this package *and* callable: ``tbq.formats()`` lists the names.

    So ``tbq.formats()``, ``tbq.formats.FORMATS`` and ``import tbq.formats.q4_0``
    all work, with no function shadowing the package.
    """

    def __call__(self) -> tuple[str, ...]:
        return formats()


sys.modules[__name__].__class__ = _CallableModule
