"""The block formats: one module per format family, each registering itself.

``tbq.formats`` is the registry: :data:`FORMATS` (name -> :class:`FormatInfo`,
the sizes and layout), :func:`get_format` (a :class:`Format` with its options:
the NumPy spec, the numba kernels, fields, trace and fragility). Modules:

- :mod:`tbq.formats.base`: the interface and the registry;
- :mod:`tbq.formats.q8_0`, :mod:`tbq.formats.q4_0`: ggml's types;
- :mod:`tbq.formats.tbq`: TBQ4_0 and TBQ3_0;
- :mod:`tbq.formats.f16`, :mod:`tbq.formats.f32`: the per-value float types (f32, the unquantized cache type,
  is registered like the others; :func:`quantizes` tells it from the quantizers).

Each has a ``*_kernels`` sibling with its numba twins. Every module of the
package is imported (and so registered) automatically, and so is every module
another package names in the ``tbq.formats`` entry point group (a plugin
format); listings follow the formats' numeric codes. Adding a format is the
recipe in docs/architecture.md.

>>> format_names()[:4]
('q8_0', 'q4_0', 'tbq4_0', 'tbq3_0')
>>> get_format("q4_0").fields(np.zeros((2, 18), np.uint8))["qs"].shape
(2, 1, 32)
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import types
import warnings
from collections.abc import Iterable, Mapping
from typing import TypeVar

import numpy as np  # noqa: F401  (doctest namespace)

from ..errors import ConfigError
from .base import FORMAT_CLASSES, FORMATS, Field, Format, FormatInfo, Option

#: The entry point group through which another package adds formats: each entry point names a
#: module (or an object in one) whose import defines ``Format`` subclasses, which registers them.
PLUGIN_GROUP = "tbq.formats"
_T = TypeVar("_T")
_V = TypeVar("_V")

#: entry point name -> the error that kept a plugin from loading (it is skipped, with a warning).
PLUGIN_ERRORS: dict[str, Exception] = {}


def _load_plugins() -> None:
    """Import the modules of the ``tbq.formats`` entry points (other packages' formats).

    A plugin that fails to import, or whose format clashes with a registered
    one (name or numeric code), is skipped with a :class:`RuntimeWarning`
    naming it; tbq's own formats always load.
    """
    import warnings
    from importlib.metadata import entry_points

    try:
        eps = entry_points(group=PLUGIN_GROUP)
    except Exception as exc:  # pragma: no cover - broken metadata on sys.path
        warnings.warn(f"tbq: cannot read the {PLUGIN_GROUP!r} entry points: {exc}", RuntimeWarning, stacklevel=2)
        return
    for ep in sorted(eps, key=lambda e: e.name):
        try:
            ep.load()
        except Exception as exc:  # a broken plugin must not break tbq
            PLUGIN_ERRORS[ep.name] = exc
            warnings.warn(
                f"tbq: format plugin {ep.name!r} ({ep.value}) was not loaded: {exc}", RuntimeWarning, stacklevel=2
            )


def _discover() -> None:
    """Import every format module of this package (a module defining a Format subclass registers it).

    ``*_kernels`` modules (numba) are left for first use. Afterwards the
    registry is ordered by the formats' stable numeric codes, the order of
    docs/formats.md and of every listing.
    """
    for m in pkgutil.iter_modules(__path__):
        if m.name != "base" and not m.name.endswith("_kernels") and not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")
    _load_plugins()
    order = sorted(FORMATS, key=lambda name: FORMATS[name].code)
    _reorder(FORMATS, order)
    _reorder(FORMAT_CLASSES, order)


def _reorder(registry: dict[str, _T], order: list[str]) -> None:
    items = {name: registry[name] for name in order}
    registry.clear()
    registry.update(items)


_discover()

__all__ = [
    "FormatInfo",
    "Format",
    "Field",
    "Option",
    "FORMATS",
    "format_names",
    "formats",
    "cache_formats",
    "cache_types",
    "quantizes",
    "format_name",
    "format_info",
    "format_class",
    "get_format",
    "options_of",
    "takes_option",
    "config_for",
    "check_options",
    "parse_option",
]


def format_names() -> tuple[str, ...]:
    """Names of the block formats, in the order of docs/formats.md (``tbq.format_names()``).

    >>> format_names()[0]
    'q8_0'
    """
    return tuple(FORMATS)


#: The same function under its first name (``from tbq.formats import formats``); calling the package itself,
#: ``tbq.formats()``, is deprecated: use :func:`format_names`.
formats = format_names


def quantizes(name: str) -> bool:
    """Whether format ``name`` (any case) stores fewer bits per value than its float32 input: a quantizer.

    Every format but f32, which stores the float32 itself (32 bits per value, decoded bit for bit): the
    unquantized baseline that the quantizers are measured against. It is read from the registry's sizes
    (:attr:`FormatInfo.bits_per_value`), so a plugin format follows the same rule.

    >>> quantizes("q8_0"), quantizes("f16"), quantizes("f32")
    (True, True, False)
    """
    return format_info(name).bits_per_value < 32


def cache_types() -> tuple[str, ...]:
    """Names of every KV cache type (:attr:`FormatInfo.cache_type`), f32 included, in :func:`format_names` order.

    What a cache can be stored in: the types ``tbq eval --cache-types``, ``tbq.hf`` and the KV budget take
    (llama.cpp's ``-ctk``/``-ctv``); the dot-product operand formats (``cache_type=False``) are left out.

    >>> cache_types()[-1], "q8_k" in cache_types()
    ('f32', False)
    """
    return tuple(name for name, info in FORMATS.items() if info.cache_type)


def cache_formats() -> tuple[str, ...]:
    """Names of the KV cache types that quantize (:func:`cache_types` that :func:`quantizes`), in :func:`formats` order.

    The default list of ``tbq compare``, ``tbq eval`` and the study: f32, the unquantized cache type, is the
    baseline each of them measures against (a row of it would be all zeros), and the dot-product operand formats
    (``cache_type=False``) are no cache types; named explicitly, both are taken.

    >>> set(cache_formats()) <= set(formats()), cache_formats()[:2], "f32" in cache_formats()
    (True, ('q8_0', 'q4_0'), False)
    """
    return tuple(name for name in cache_types() if quantizes(name))


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


def format_class(name: str) -> type[Format]:
    """The :class:`Format` subclass of ``name`` (any case, see :func:`format_name`)."""
    return FORMAT_CLASSES[format_name(name)]


def get_format(name: str, **options: object) -> Format:
    """The format ``name`` with its format options (e.g. TBQ's ``codebook``, ``signs``).

    >>> get_format("tbq3_0", codebook="turboq-mtp").config()["codebook"]
    'turboq-mtp'
    """
    cls = format_class(name)
    return cls(**cls.check_options(options))


def options_of(name: str) -> dict[str, object]:
    """``{option: default}`` of the format ``name``'s own options (``{}`` for most ggml types).

    >>> options_of("fp8_e4m3"), options_of("q8_0")
    ({'scale': 1.0}, {})
    """
    return format_class(name).option_defaults()


def takes_option(name: str, option: str) -> bool:
    return option in format_class(name).options


def config_for(name: str, config: Mapping[str, _V]) -> dict[str, _V]:
    """``config`` without the format options that ``name`` does not take (execution settings are kept).

    One options mapping can so configure a comparison of several formats: TBQ's
    ``codebook`` reaches the TBQ formats, FP8's ``scale`` the FP8 formats.

    >>> config_for("q8_0", {"scale": 0.5, "codebook": "turboq-mtp", "backend": "numpy"})
    {'backend': 'numpy'}
    """
    every = {o for cls in FORMAT_CLASSES.values() for o in cls.options}
    own = format_class(name).options
    return {k: v for k, v in config.items() if k in own or k not in every}


def check_options(names: Iterable[str], options: Mapping[str, object]) -> None:
    """Refuse an option that no format of ``names`` takes, naming the formats that do.

    >>> check_options(["q8_0"], {"codebook": "turboq-mtp"})
    Traceback (most recent call last):
    ...
    tbq.errors.ConfigError: option 'codebook' is not an option of q8_0; the formats that take it: tbq4_0, tbq3_0
    """
    names = list(names)
    for opt in options:
        if not any(takes_option(n, opt) for n in names):
            users = [n for n, cls in FORMAT_CLASSES.items() if opt in cls.options]
            who = f"the formats that take it: {', '.join(users)}" if users else "no format takes it"
            raise ConfigError(f"option {opt!r} is not an option of {', '.join(names)}; {who}")


def parse_option(text: str) -> tuple[str, object]:
    """``"name=value"`` (the CLI's ``--option``) as ``(name, value)``: an int, else a float, else the string.

    >>> parse_option("scale=0.0173"), parse_option("signs=7"), parse_option("codebook=turboq-mtp")
    (('scale', 0.0173), ('signs', 7), ('codebook', 'turboq-mtp'))
    """
    name, sep, value = str(text).partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"an option is NAME=VALUE, e.g. scale=0.0173, got {text!r}")
    value = value.strip()
    for conv in (int, float):
        try:
            return name, conv(value)
        except ValueError:
            pass
    return name, value


class _CallableModule(types.ModuleType):
    """``tbq.formats`` is this package; calling it, ``tbq.formats()``, is a deprecated spelling of
    :func:`format_names` that still works, with a :class:`DeprecationWarning`.

    The package was made callable so that one name listed the formats and held their modules; a module
    that is also a function confuses type checkers and readers (``tbq.formats`` has no ``__call__`` in any
    stub), so the listing is the function :func:`tbq.format_names` and the call stays only for old code.
    """

    def __call__(self) -> tuple[str, ...]:
        warnings.warn(
            "calling the package tbq.formats() is deprecated: use tbq.format_names()", DeprecationWarning, stacklevel=2
        )
        return format_names()


sys.modules[__name__].__class__ = _CallableModule
