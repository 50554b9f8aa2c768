"""What a golden run writes, in one frozen record: :func:`tbq.golden.generate`'s settings, validated once here.

:func:`~tbq.golden.generate` takes them as keywords (``formats=``,
``families=``, ...; the CLI flags) or as one :class:`GoldenSettings`
(``settings=``) and hands the record down.

>>> s = GoldenSettings(formats="q8_0,q4_0", families="edge", rows_per_family=2)
>>> s.formats, s.families, s.rows_per_family, s.attention
(('q8_0', 'q4_0'), ('edge',), 2, False)
>>> GoldenSettings(n_head=8, n_head_kv=3)
Traceback (most recent call last):
...
tbq.errors.TbqValueError: n_head (8) must be a multiple of n_head_kv (3)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from ..attention import SINK_FORMATS
from ..errors import ConfigError, TbqTypeError, TbqValueError, check_choice, check_int, check_number
from ..formats import FORMATS, check_options, config_for, format_class, format_name, quantizes
from .families import (
    DEFAULT_SEED,
    FAMILIES,
    ROW_SIZE,
    _check_families,
    _check_seed,
    _names,
    _resolve_tables,
    _rows_per_family,
    _Tables,
)
from .fragility import DEFAULT_K

__all__ = [
    "GoldenSettings",
    "settings_with",
    "refuse_keywords_beside",
    "DEFAULT_ATTENTION_PAIRS",
    "MAX_K",
    "golden_formats",
]

DEFAULT_ATTENTION_PAIRS = (("tbq4_0", "tbq4_0"), ("q8_0", "tbq4_0"))
#: The widest fragility margin taken, in float32 ulps (2^22: half a binade).
MAX_K = 1 << 22


def golden_formats() -> tuple[str, ...]:
    """The formats of a default golden run, in :func:`tbq.formats` order: those that quantize
    (:func:`tbq.formats.quantizes`: not f32, which rounds nothing, so its set would pin nothing down) and whose
    block divides a golden row of :data:`ROW_SIZE` values (not q8_k, whose 256-value block would span two rows;
    the default of :func:`generate` and ``tbq golden``). Named explicitly, f32 gets a set too.

    >>> "q8_0" in golden_formats(), "q8_k" in golden_formats(), "f32" in golden_formats()
    (True, False, False)
    """
    return tuple(name for name, info in FORMATS.items() if ROW_SIZE % info.block_size == 0 and quantizes(name))


def _plain(x: Any) -> str:
    """A number for a message, never a NumPy repr (``np.float64(nan)`` shows as ``nan``)."""
    return (
        repr(float(x))
        if isinstance(x, (float, np.floating))
        else repr(int(x))
        if isinstance(x, (int, np.integer))
        else repr(x)
    )


def _check_k(k: Any) -> int:
    k = check_int(k, "k (the fragility margin in ulps)", lo=0, expected="a non-negative integer", error=TbqValueError)
    if k > MAX_K:
        raise TbqValueError(
            f"k (the fragility margin in ulps) must be at most 2^22 = {MAX_K:,} (a margin that wide spans a whole binade), got {int(k):,}"
        )
    return int(k)


def _check_ulp_floor(ulp_floor: Any) -> None:
    if ulp_floor is None:
        return
    check_number(ulp_floor, "ulp_floor", lo=0, expected="a finite number >= 0 (0 = literal ulps)", error=TbqValueError)
    if ulp_floor > 1:
        raise TbqValueError(
            f"ulp_floor must be at most 1 (the rotated coordinates of a unit-norm block are at most 1), got {_plain(ulp_floor)}"
        )


def _check_formats(fmts: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(format_name(f) for f in _names(fmts, "format")))


def _check_pairs(pairs: Any) -> tuple[Any, ...]:
    if isinstance(pairs, str):
        items = [p for p in pairs.split(",") if p]
        pairs = []
        for it in items:
            if it.count(":") != 1:
                raise ConfigError(f"an attention pair is K_FORMAT:V_FORMAT, got {it!r}")
            pairs.append(tuple(it.split(":")))
    out = []
    for pr in pairs:
        kf, vf = pr
        out.append((format_name(kf), format_name(vf)))
    return tuple(dict.fromkeys(out))


def _check_attention_args(tokens: Any, n_head: Any, n_head_kv: Any, n_sink: Any, sink_format: Any) -> None:
    for label, val, lo in (
        ("tokens", tokens, 1),
        ("n_head", n_head, 1),
        ("n_head_kv", n_head_kv, 1),
        ("n_sink", n_sink, 0),
    ):
        check_int(val, label, lo=lo, expected=f"an integer >= {lo}", error=TbqValueError)
    if n_head % n_head_kv:
        raise TbqValueError(f"n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv})")
    if n_sink > tokens:
        raise TbqValueError(f"n_sink ({n_sink}) cannot exceed tokens ({tokens})")
    check_choice(sink_format, "sink_format", SINK_FORMATS)


@dataclass(frozen=True, kw_only=True)
class GoldenSettings:
    """The golden sets :func:`tbq.golden.generate` writes (every field keyword-only, validated at construction in
    the order below; lists may be given as comma-separated strings and are stored as tuples)."""

    #: Format names (default: :func:`golden_formats`).
    formats: Any = None
    #: Input families (default: all of :data:`tbq.golden.FAMILIES`).
    families: Any = FAMILIES
    #: Rows of 128 values per family (None: :data:`tbq.golden.DEFAULT_ROWS_PER_FAMILY`).
    rows_per_family: Any = None
    #: The families' seed.
    seed: int = DEFAULT_SEED
    #: TBQ's codebook: a name, a :class:`~tbq.codebooks.Codebook`, or exact values.
    codebook: Any = "lloyd-max"
    #: TBQ's signs: a name, an integer seed, or exact values.
    signs: Any = "turboq-mtp"
    #: The fragility margin in float32 ulps.
    k: int = DEFAULT_K
    #: The fragility margin's floor for rotated coordinates (None: the format's own).
    ulp_floor: float | None = None
    #: Whether to write the attention sets too.
    attention: bool = False
    #: (K format, V format) pairs of the attention sets (or ``"k:v,k:v"``), read only with ``attention``.
    attention_pairs: Any = DEFAULT_ATTENTION_PAIRS
    #: Tokens of an attention set. This and the four fields below are the attention sets' defaults in one place:
    #: :func:`~tbq.golden.generate`, :func:`~tbq.golden.build_attention` and ``tbq golden``'s flags read them
    #: here (``GoldenSettings.tokens``, ...). A head is one golden row of :data:`~tbq.golden.ROW_SIZE` values.
    tokens: int = 32
    #: Query heads of an attention set.
    n_head: int = 8
    #: KV heads of an attention set (divides ``n_head``).
    n_head_kv: int = 2
    #: Leading tokens both caches keep in ``sink_format``.
    n_sink: int = 0
    #: The sink tokens' storage.
    sink_format: str = "f16"
    #: Format options (FP8's ``scale``), each going to the formats that take it.
    options: Any = None
    #: The TBQ tables ``codebook`` and ``signs`` resolve to.
    tables: _Tables = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: the checked values are set once, here
        fmts = _check_formats(self.formats if self.formats is not None else golden_formats())
        put(self, "formats", fmts)
        put(self, "families", _check_families(self.families))
        put(self, "rows_per_family", _rows_per_family(self.rows_per_family))
        put(self, "seed", _check_seed(self.seed))
        if self.attention:  # the pairs are read (and checked) only with attention
            put(self, "attention_pairs", _check_pairs(self.attention_pairs))
        _check_attention_args(self.tokens, self.n_head, self.n_head_kv, self.n_sink, self.sink_format)
        put(self, "k", _check_k(self.k))
        _check_ulp_floor(self.ulp_floor)
        put(self, "tables", _resolve_tables(self.codebook, self.signs))
        if self.options is not None and not isinstance(self.options, dict):
            raise TbqTypeError(
                f"options must be a dict of format options, e.g. {{'scale': 0.0173}}, got {self.options!r}"
            )
        options = dict(self.options or {})
        check_options(fmts, options)
        for fmt in fmts:  # every value checked before any work
            format_class(fmt).check_options(config_for(fmt, options))
        put(self, "options", options)

    @classmethod
    def of(cls, settings: GoldenSettings | None = None, keywords: Mapping[str, Any] | None = None) -> GoldenSettings:
        """``settings`` with ``keywords`` (names of its fields) replaced; ``GoldenSettings(**keywords)`` without it."""
        return settings_with(cls, settings, keywords, "tbq.golden.GoldenSettings")


_R = TypeVar("_R")


def settings_with(cls: type[_R], settings: _R | None, keywords: Mapping[str, Any] | None, what: str) -> _R:
    """A frozen settings record of dataclass ``cls``: ``settings`` with ``keywords`` (names of its init fields)
    replaced, or ``cls(**keywords)`` without it. A keyword that is not a field, or ``settings`` of another class,
    is refused in one line naming ``what`` (the record's public name). Shared by :class:`GoldenSettings` and
    :class:`tbq.check.CheckSettings`."""
    keywords = dict(keywords or {})
    names = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(keywords) - names)
    if unknown:
        raise ConfigError(
            f"unknown {what} field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
            f"the settings are {', '.join(sorted(names))}"
        )
    if settings is None:
        return cls(**keywords)
    if not isinstance(settings, cls):
        raise ConfigError(f"settings must be a {what}, got {type(settings).__name__}")
    return dataclasses.replace(settings, **keywords) if keywords else settings  # type: ignore[type-var]


def refuse_keywords_beside(given: Mapping[str, Any], defaults: Mapping[str, Any], what: str) -> None:
    """Refuse settings given both ways: a function that takes a settings record (``settings=``) or its fields as
    keywords was given the record and ``given`` (its keywords' values), some changed from their ``defaults``; those
    are named in one line that says ``what`` the settings are. A value is unchanged when it is its default or equals
    it (an array-like value, whose ``==`` is no truth value, never is). Shared by :func:`tbq.golden.generate` and
    :func:`tbq.check.check_kernel`."""
    changed = [name for name, value in given.items() if not _same(value, defaults[name])]
    if changed:
        raise ConfigError(f"give {what} as settings= or as keywords, not both ({', '.join(changed)} given as keywords)")


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a is b or a == b)
    except Exception:  # an array-like setting (a codebook's values): not the default
        return False
