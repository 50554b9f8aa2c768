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

__all__ = ["FormatInfo", "Format", "Field", "FORMATS", "formats", "format_name", "format_info", "format_class", "get_format"]


def formats() -> tuple[str, ...]:
    """Names of the block formats, in the order of docs/formats.md.

    >>> formats()[0]
    'q8_0'
    """
    return tuple(FORMATS)


def format_name(name: str) -> str:
    """The canonical name of format ``name``: the naming rule of docs/formats.md.

    A format name is matched ignoring letter case and surrounding white space
    (``"Q8_0"``, ``" q8_0 "`` and ``"q8_0"`` are one format); tbq always
    writes it the one way :func:`formats` lists it, in lowercase. Nothing else
    is guessed: no other spelling (``"q8-0"``, ``"q80"``) is a format name.

    >>> format_name("Q8_0"), format_name(" TBQ4_0 ")
    ('q8_0', 'tbq4_0')
    """
    if type(name) is str:
        if name in FORMATS:
            return name
        key = name.strip().lower()
        if key in FORMATS:
            return key
    raise ConfigError(f"unknown format {name!r}; known formats: {', '.join(FORMATS)}")


def format_info(name: str) -> FormatInfo:
    """The :class:`FormatInfo` row of ``name`` (any case, see :func:`format_name`; ``ConfigError`` when unknown)."""
    return FORMATS[format_name(name)]


def format_class(name: str) -> type:
    """The :class:`Format` subclass of ``name`` (any case, see :func:`format_name`)."""
    return FORMAT_CLASSES[format_name(name)]


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
