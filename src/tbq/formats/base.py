"""The format interface: what one block format module provides, and the registry.

A format is a subclass of :class:`Format` in its own module of
``tbq/formats/`` (see docs/architecture.md, "How to add a format"). Defining
the subclass with an ``info`` row registers it (gguf-py's ``__init_subclass__``
pattern); everything else in tbq (codecs, golden vectors, attention, the
numcodecs codecs, the hypothesis strategies) reaches formats only through
this interface, never by their names.

A :class:`Format` instance is the format with its format options (TBQ's
``codebook`` and ``signs``; none for ggml's types). It knows:

- the table row (:class:`FormatInfo`: sizes, the numcodecs code, the byte layout);
- the NumPy reference, which *is* the spec of docs/formats.md as array code:
  :meth:`Format.reference_encode` returns the bytes and the float32
  intermediates (the *trace*), :meth:`Format.reference_decode` the floats;
- the numba kernels, byte- and bit-identical: :meth:`Format.kernel_encode`,
  :meth:`Format.kernel_decode`;
- :meth:`Format.fields`: the named fields of encoded blocks;
- :meth:`Format.fragile_values` / :meth:`Format.fragile_scales`: where a
  legitimate difference in rounding (FMA, reduction order) may change a code;
- its capabilities (:mod:`tbq.formats.capabilities`): what the checker, the
  attention kernel, golden vectors, the fuzzers and the decoded-domain maps
  need of it, each a small declared object its one consumer reads.

The reference and kernel methods take clean 2-D arrays (one block per row,
C-contiguous float32 or uint8); validation, chunking and threads live in
:mod:`tbq.codecs`. The public :meth:`Format.encode` / :meth:`Format.decode`
validate their input and run the NumPy reference.

Why one module of this length: the interface (:class:`Format`, its layout records
:class:`FormatInfo` and :class:`Field`, the field kinds, the options) and the registry that
refuses inconsistent layouts are what a format module imports, and a format author reads them in
one place; the capabilities are :mod:`tbq.formats.capabilities`'.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..backend import STATUS_SCALE_OVERFLOW
from ..errors import BlockShapeError, ConfigError, EncodedLengthError, ScaleOverflowError, TbqTypeError
from ..half import F16_OVERFLOW, f16_table
from .capabilities import (
    CAPABILITIES,
    AttentionReader,
    AttentionTraits,
    CapabilitySlot,
    CheckTraits,
    DomainTraits,
    FuzzTraits,
    GoldenTraits,
    QuantizerTraits,
    Trace,
)

__all__ = [
    "F16_OVERFLOW_WHY",
    "InfoSizes",
    "Option",
    "option_check",
    "AttentionReader",
    "FieldKind",
    "FIELD_KINDS",
    "register_field_kind",
    "read_field",
    "ordered_field_code",
    "Field",
    "FormatInfo",
    "Format",
    "FORMATS",
    "FORMAT_CLASSES",
    "register",
    "ulp32",
    "band",
    "offset_trunc_fragility",
    "Trace",
]


@dataclass(frozen=True)
class Field:
    """One field of a block's byte layout.

    ``kind`` names a :class:`FieldKind` of :data:`FIELD_KINDS` (how the bytes
    read): ``"f16"`` (a little-endian fp16 scale), ``"bf16"``, ``"int8"``,
    ``"uint8"``, ``"u32"``, ``"u4_halves"`` (ggml's Q4_0 nibble order),
    ``"u4_pairs"`` (adjacent pairs), ``"u3_lanes"`` (24-bit lanes of eight
    3-bit indices); a format module registers any other kind it uses
    (:mod:`tbq.formats.q8_ops`: ``"f32"``, a little-endian float32 scale, and
    ``"int16"``).
    """

    name: str
    offset: int  #: first byte within the block
    size: int  #: bytes
    kind: str
    description: str = ""
    #: Special bit patterns of this field that arbitrary-byte fuzzing injects, ``((name, lowest, highest), ...)``
    #: (inclusive, little-endian integers of the field's bytes). Empty: the fp16 scale patterns of
    #: :data:`tbq.testing.strategies.SPECIAL_SCALES` at bytes 0-1.
    specials: tuple[tuple[str, int, int], ...] = field(default=(), compare=False)
    #: True for a field that is a function of the block's codes (q8_1's ``s``, q8_K's ``bsums``): the checker
    #: requires a target's to be what its own codes give (:meth:`Format.derived`) and then lets it follow them,
    #: so a code one step off at a tie moves the sum without making the block wrong.
    derived: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Option:
    """One format option, declared once on the format (``Format.options = {name: Option(...)}``).

    ``check(value, format_name)`` validates a given value and returns it
    normalised (FP8's ``scale`` as a float32), raising :class:`ConfigError`
    that names the option and the format; ``None`` leaves validation to the
    format's constructor (TBQ's codebook and sign tables). Every feature
    (codecs, golden manifests, ``tbq check``, strategies, compare, the
    numcodecs config, the CLI's ``--option NAME=VALUE``) carries one options
    mapping and reaches the values only through this declaration.

    >>> Option(1.0, "float32, finite, > 0").default
    1.0
    """

    default: object
    kind: str = ""  #: what values it takes, for messages and docs
    description: str = ""
    check: Callable[[object, str], object] | None = field(default=None, compare=False)
    #: Values in use elsewhere (other builds' tables, seeds): ``tbq check`` tries them on a failing kernel and names
    #: the one it matches.
    known: tuple[object, ...] = field(default=(), compare=False)


_T = TypeVar("_T")


def option_check(
    option: str, must: str, ok: Callable[[Any], object], convert: Callable[[Any], _T]
) -> Callable[[object, str], _T]:
    """An :attr:`Option.check`: ``convert(value)`` when ``ok(value)``, else the :class:`ConfigError` "bad
    configuration for <format>: <option> must be <must>, got <value>".

    >>> check = option_check("bits", "3 or 4", lambda v: v in (3, 4), int)
    >>> check(4, "x")
    4
    >>> check(5, "x")
    Traceback (most recent call last):
    tbq.errors.ConfigError: bad configuration for x: bits must be 3 or 4, got 5
    """

    def check(value: object, name: str) -> _T:
        if not ok(value):
            raise ConfigError(f"bad configuration for {name}: {option} must be {must}, got {value!r}")
        return convert(value)

    return check


@dataclass(frozen=True, kw_only=True)
class FormatInfo:
    """Static facts about one block format: its registry entry."""

    name: str
    block_size: int  #: values per block
    #: bytes per block; 0 (the default): the layout's, the sum of its fields' sizes, so a format with a layout
    #: writes its size once (:func:`register` checks a given one against the layout)
    type_size: int = 0
    rotated: bool = False  #: True for formats that quantize in a rotated domain (TBQ)
    index_bits: int  #: bits per stored value code
    description: str
    code: int = 0  #: stable numeric code (the numcodecs header's byte 5); never renumber
    layout: tuple[Field, ...] = field(default=(), compare=False)  #: the block's :class:`Field` s, in byte order
    #: How a KV cache row of ``n_kv_heads x head_dim`` values is tiled into blocks. ``False`` (ggml's
    #: types): llama.cpp needs the block to divide ``head_dim``, so a block never spans two heads.
    #: ``True`` (the fork's TBQ types): its llama-context.cpp checks only the row (``n_embd_k_gqa``),
    #: so at head_dim 64 one 128-value block holds two heads.
    row_tiled: bool = False
    #: ``True`` for a KV cache type (llama.cpp's ``--cache-type-k``, the fork's, vLLM's ``kv_cache_dtype``);
    #: ``False`` for a dot-product operand format that only activations are quantized to (ggml's q8_1 and
    #: q8_K, the right operand of ``ggml_vec_dot_*``): it is left out of the default lists of
    #: ``tbq compare``, ``tbq eval``, the study and the budget, and ``tbq.hf`` refuses it as a cache type (as
    #: llama.cpp does); named explicitly, the library functions still take it (an attention over q8_k keys).
    cache_type: bool = True
    #: ``True`` where the engine that stores this type zero-pads each head to a multiple of the block (the
    #: community fork's turbo types: its llama-kv-cache.cpp pads head_dim 64 to 128, 192 to 256), so a head of
    #: ``head_dim`` values stores :meth:`stored_head_dim` values and any head_dim fits.
    padded_heads: bool = False

    def __post_init__(self) -> None:
        if not self.type_size:
            object.__setattr__(self, "type_size", sum(f.size for f in self.layout))
        if self.type_size <= 0:
            raise ConfigError(
                f"format {self.name!r}: type_size must be positive (give it, or a layout), not {self.type_size}"
            )

    def stored_head_dim(self, head_dim: int) -> int:
        """Values a cache stores per head of ``head_dim``: ``head_dim``, or the next multiple of the block where
        the engine pads heads (:attr:`padded_heads`).

        >>> FORMATS["q8_0"].stored_head_dim(64), FORMATS["turbo3"].stored_head_dim(64), FORMATS["turbo3"].stored_head_dim(192)
        (64, 128, 256)
        """
        if not self.padded_heads:
            return head_dim
        return -(-head_dim // self.block_size) * self.block_size

    def tiles(self, n_kv_heads: int, head_dim: int) -> bool:
        """True when a cache row of ``n_kv_heads`` heads of ``head_dim`` values is whole blocks of this format.

        >>> FORMATS["q8_0"].tiles(8, 64), FORMATS["tbq4_0"].tiles(8, 64), FORMATS["tbq4_0"].tiles(1, 64)
        (True, True, False)
        """
        unit = n_kv_heads * head_dim if self.row_tiled else head_dim
        return unit % self.block_size == 0

    @property
    def bits_per_value(self) -> float:
        """Storage cost including the per-block scale, e.g. 4.125 for tbq4_0."""
        return self.type_size * 8 / self.block_size

    def row_bytes(self, n_values: int) -> int:
        """Bytes of a row of ``n_values`` values (which must be whole blocks)."""
        if n_values % self.block_size:
            raise BlockShapeError(f"{n_values} values is not a multiple of {self.name}'s block size {self.block_size}")
        return n_values // self.block_size * self.type_size


#: kernel module name -> the imported module (:meth:`Format.kernels`).
_KERNEL_MODULES: dict[str, types.ModuleType] = {}

#: name -> :class:`FormatInfo`, in registration order (the order of docs/formats.md).
FORMATS: dict[str, FormatInfo] = {}
#: name -> :class:`Format` subclass.
FORMAT_CLASSES: dict[str, type[Format]] = {}


_F = TypeVar("_F", bound="type[Format]")


def register(cls: _F) -> _F:
    """Add a :class:`Format` subclass to the registry (done by ``__init_subclass__``)."""
    info = cls.info
    if info.name in FORMAT_CLASSES and FORMAT_CLASSES[info.name] is not cls:
        raise ConfigError(
            f"format {info.name!r} is registered twice ({FORMAT_CLASSES[info.name].__name__} and {cls.__name__})"
        )
    codes = {i.code: n for n, i in FORMATS.items() if n != info.name}
    if info.code in codes or info.code <= 0:
        raise ConfigError(f"format {info.name!r}: code {info.code} is not a new positive code (taken: {codes})")
    if sum(f.size for f in info.layout) != info.type_size:
        raise ConfigError(
            f"format {info.name!r}: the layout's fields add up to {sum(f.size for f in info.layout)} bytes, not {info.type_size}"
        )
    end = 0  # the fields tile the block in byte order: with the sum above, every byte is in exactly one field
    for f in info.layout:
        if f.offset != end:
            raise ConfigError(
                f"format {info.name!r}: field {f.name!r} starts at byte {f.offset}, not {end} (where the one before ends)"
            )
        end += f.size
    FORMATS[info.name] = info
    FORMAT_CLASSES[info.name] = cls
    return cls


# ---------------------------------------------------------------------------
# refusal helpers shared by the format modules
# ---------------------------------------------------------------------------


def f16_overflows(a: ArrayLike) -> NDArray[np.bool_]:
    """bool: where ``a`` is stored as an infinite fp16 (``|a| >= 65520``, the first value that rounds to infinity);
    NaN counts too, as it fails the comparison.

    >>> f16_overflows(np.float32([65519.0, 65520.0, np.nan])).tolist()
    [False, True, True]
    """
    return ~(np.abs(a) < np.float32(F16_OVERFLOW))


def overflow_status(over: ArrayLike) -> NDArray[np.int8]:
    """int8 statuses of :meth:`Format.invalid_blocks` from a bool mask: ``STATUS_SCALE_OVERFLOW`` where ``over``, else 0."""
    return np.where(over, STATUS_SCALE_OVERFLOW, 0).astype(np.int8)


def block_trace(fmt: Format, values: NDArray[np.float32]) -> Trace:
    """The encoder's trace of one block of float32 ``values`` (one row of one block where the format's rule is per
    row), with floating-point warnings silenced: what :meth:`Format.encode_error` reads to say why it refused it."""
    with np.errstate(all="ignore"):
        return fmt.reference_encode(np.ascontiguousarray(values, np.float32)[None, :], **fmt._row_kw(1))[1]


#: Why an fp16 field cannot hold a value, as every refusal of one says it.
F16_OVERFLOW_WHY = "(it rounds to infinity; the largest finite fp16 is 65504)"

#: What a refusal of an fp16 field tells the caller to do to store what ggml's C reference stores.
_STORE_AS_C = "Pass on_overflow='inf' to store what the C reference stores (an infinite fp16 field)"


def f16_field_error(
    name: str, block: int, fields: tuple[tuple[str, float], ...], remedy: str = _STORE_AS_C
) -> ScaleOverflowError:
    """The refusal of ``block`` of format ``name`` whose fp16 fields (a scale, a minimum, a sum) do not all fit: it
    names the first of ``fields`` (``(what the message says, the value)``) that rounds to an infinite fp16, or the
    last (a condition the caller checked itself), and ends with ``remedy``."""
    what, value = next((f for f in fields if not abs(f[1]) < F16_OVERFLOW), fields[-1])
    return ScaleOverflowError(
        f"{name}: in block {block}, {what} {F16_OVERFLOW_WHY}. {remedy}",
        block=block,
        scale=value,
    )


# ---------------------------------------------------------------------------
# fragility helpers shared by the format modules
# ---------------------------------------------------------------------------


def ulp32(a: ArrayLike) -> NDArray[np.float64]:
    """Spacing of float32 at ``|a|`` (float64 result; a float32 subnormal step at 0)."""
    return np.spacing(np.abs(np.asarray(a, np.float64)).astype(np.float32)).astype(np.float64)


def band(
    code: Callable[[NDArray[np.float64]], NDArray[Any]], v: ArrayLike, k: int, floor: float | NDArray[np.float64] = 0.0
) -> NDArray[np.bool_]:
    """True where ``code`` differs between ``v - w`` and ``v + w``, ``w = k * ulp32(max(|v|, floor))``.

    ``code`` must be monotone; it is evaluated exactly in float64. This is "v
    lies within k ulps of a boundary": the code can change under a
    perturbation of at most k ulps (a value exactly on a boundary counts).
    ``floor`` is a scalar or an array broadcast against ``v`` (planar/iso's per-value floor).


    >>> band(np.floor, np.float32([1.0, 1.5]), 1).tolist()
    [True, False]
    """
    v64 = np.asarray(v, np.float64)
    w = k * ulp32(np.maximum(np.abs(v64), floor))
    return code(v64 - w) != code(v64 + w)


def offset_trunc_fragility(
    v: ArrayLike, t: ArrayLike, k: int, offset: float, top: float | None = None
) -> NDArray[np.bool_]:
    """Fragility of codes ``min(top, trunc(t))`` with ``t = float32(v + offset)`` (Q4_0, Q5_0, Q4_1, Q5_1).

    A value is fragile when a k-ulp change of ``v`` (through the encoder's
    float32 rounding of ``v + offset``) *or* of ``t`` can change its code.
    ``top=None``: no clamp.

    >>> offset_trunc_fragility(np.float32([0.5, 0.25]), np.float32([9.0, 8.75]), 1, 8.5, 15).tolist()
    [True, False]
    """

    def code_t(tt: NDArray[np.float64]) -> NDArray[np.float64]:
        c = np.trunc(tt)
        return c if top is None else np.minimum(float(top), c)

    def code_v(vv: NDArray[np.float64]) -> NDArray[np.float64]:
        return code_t((np.asarray(vv, np.float64) + offset).astype(np.float32).astype(np.float64))

    return band(code_v, v, k) | band(code_t, t, k)


# ---------------------------------------------------------------------------
# the interface
# ---------------------------------------------------------------------------


def into_c_contiguous(out: NDArray[np.uint8], kernel: Callable[[NDArray[np.uint8]], _T]) -> _T:
    """``kernel(buf)`` with ``buf`` = ``out`` when it is C-contiguous, else a C-contiguous copy of ``out`` that is
    copied back afterwards (also when ``kernel`` raises): for kernels that write whole rows with vector stores.
    Bytes the kernel does not write keep their values either way.

    >>> out = np.zeros((3, 8), np.uint8)[:, :4]  # not C-contiguous
    >>> into_c_contiguous(out, lambda b: b.__setitem__((1, 2), 7)); out[1].tolist()
    [0, 0, 7, 0]
    """
    if out.flags.c_contiguous:
        return kernel(out)
    buf = np.ascontiguousarray(out)
    try:
        return kernel(buf)
    finally:
        out[...] = buf


#: Members that moved from :class:`Format` to a capability under the same name: capability -> names.
_MOVED_AS_IS: dict[str, tuple[str, ...]] = {
    "checker": (
        *("tie_rule", "vec_dot_type", "reciprocal_scale", "symbol_stem"),  # class attributes
        *("dot_parts", "derived", "dot_offset", "undefined_blocks", "equivalent_blocks"),  # methods
    ),
    "quantizer": ("value_table", "rotated_view"),
    "golden": ("ulp_floor",),
    "fuzz": ("hazards",),
    "domain": ("decode_domain", "to_decode_domain", "from_decode_domain"),
}
#: Members that moved from :class:`Format` to its capabilities: old name -> (capability, member).
_MOVED: dict[str, tuple[str, str]] = {
    **{n: (cap, n) for cap, names in _MOVED_AS_IS.items() for n in names},
    **{f"attention_{m}": ("attention", m) for m in ("domain", "read", "tables", "reader")},
    "golden_overflow": ("golden", "on_overflow"),
}


def _warn_moved(owner: str, name: str, where: tuple[str, str]) -> None:
    """The deprecation warning of an old spelling (``fmt.tie_rule``): it still works, through the capability."""
    import warnings

    warnings.warn(
        f"{owner}.{name} is deprecated: read {owner}.{where[0]}.{where[1]} (tbq.formats.capabilities)",
        DeprecationWarning,
        stacklevel=3,
    )


class _FormatType(type):
    """Format's metaclass: the class-level spellings of before the capabilities (``FORMAT_CLASSES[n].hazards``)."""

    if not TYPE_CHECKING:

        def __getattr__(cls, name: str) -> Any:
            where = _MOVED.get(name)
            if where is None:
                raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")
            _warn_moved(cls.__name__, name, where)
            return getattr(getattr(cls, where[0]), where[1])


class _HasInfo(Protocol):
    @property
    def info(self) -> FormatInfo: ...


class InfoSizes:
    """``block_size`` and ``type_size`` read from ``self.info`` (a :class:`FormatInfo`): the sizes a
    :class:`Format`, a :class:`tbq.Codec` and a numcodecs codec all report, written once."""

    @property
    def block_size(self: _HasInfo) -> int:
        """Values a block."""
        return self.info.block_size

    @property
    def type_size(self: _HasInfo) -> int:
        """Bytes a block."""
        return self.info.type_size


class Format(InfoSizes, metaclass=_FormatType):
    """One block format with its format options; subclass it to add a format.

    Its own interface is what every format defines: the layout (``info``), the
    options, the NumPy reference (:meth:`reference_encode`, :meth:`reference_decode`),
    the numba twins (``kernel_module``, :meth:`kernel_encode`, :meth:`kernel_decode`),
    the fragility of its rounding (:meth:`fragile_values`) and what its codec refuses
    (:meth:`invalid_blocks`, :meth:`encode_error`, ``overflow_modes``). Class
    attributes a format module sets:

    ``info``
        the :class:`FormatInfo` row (defining it registers the class);
    ``kernel_module``
        dotted name of the module holding the numba twins (imported on first use);
    ``options``
        ``{option: Option(default, ...)}`` of the format's own options (``{}`` for most).

    What other consumers need is a named capability of
    :mod:`tbq.formats.capabilities`, declared as a class attribute
    (``checker = CapabilitySlot(MyChecks)``) and read only by its consumer:
    ``checker`` (tbq check), ``quantizer`` (value tables, the rotated view),
    ``golden``, ``attention``, ``fuzz`` and ``domain`` (the decoder's domain).
    """

    info: ClassVar[FormatInfo]
    kernel_module: ClassVar[str] = ""
    options: ClassVar[dict[str, Option]] = {}  #: ``{name: Option}``
    #: True when a block's bytes depend on earlier blocks of the same row (IQ4_NL's
    #: tiny-block rule). The codec then never splits a row between chunks and passes
    #: ``row_blocks`` (blocks per row) to :meth:`reference_encode` and :meth:`kernel_encode`.
    row_rule: ClassVar[bool] = False
    #: The codec's ``on_overflow`` choices for this format, the default first: ``"raise"``
    #: refuses a value or scale that does not fit (naming it), ``"inf"`` stores what the C
    #: code stores. A format with more ways of storing it (FP8's ``"saturate"``) lists them
    #: and maps each to keyword arguments of its encoders in :meth:`overflow_kw`.
    overflow_modes: ClassVar[tuple[str, ...]] = ("raise", "inf")
    #: The capabilities (:mod:`tbq.formats.capabilities`): the defaults describe a plain format.
    checker = CapabilitySlot(CheckTraits)
    quantizer = CapabilitySlot(QuantizerTraits)
    golden = CapabilitySlot(GoldenTraits)
    attention = CapabilitySlot(AttentionTraits)
    fuzz = CapabilitySlot(FuzzTraits)
    domain = CapabilitySlot(DomainTraits)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        moved = sorted(n for n in _MOVED if n in cls.__dict__)
        if moved:
            raise ConfigError(
                f"format class {cls.__name__} defines {', '.join(moved)}, which are now members of its capabilities: "
                + "; ".join(f"{n} -> {'.'.join(_MOVED[n])}" for n in moved)
                + " (declare them on a subclass of the capability in tbq.formats.capabilities)"
            )
        for name, base in CAPABILITIES.items():
            slot = cls.__dict__.get(name, CapabilitySlot(base))
            if not (isinstance(slot, CapabilitySlot) and issubclass(slot.cls, base)):
                raise ConfigError(f"format class {cls.__name__}: {name} must be CapabilitySlot(<a {base.__name__}>)")
        if "info" in cls.__dict__:
            register(cls)

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            # The spellings of before the capabilities (fmt.tie_rule, fmt.dot_parts(...)) keep working for code
            # outside tbq: each reads its capability's member. tbq itself reads the capabilities (a test holds it).
            where = _MOVED.get(name)
            if where is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            _warn_moved(type(self).__name__, name, where)
            return getattr(getattr(self, where[0]), where[1])

    def __init__(self, **options: object) -> None:
        self.check_options(options)

    @classmethod
    def option_defaults(cls) -> dict[str, object]:
        """``{option: default}`` of the declared options."""
        return {k: o.default for k, o in cls.options.items()}

    @classmethod
    def check_options(cls, options: Mapping[str, object]) -> dict[str, object]:
        """The given ``options`` validated and normalised by their declarations (:class:`Option`).

        An option the format does not declare is a :class:`ConfigError` naming
        the formats that do take it.
        """
        name = cls.info.name
        unknown = [k for k in options if k not in cls.options]
        if unknown:
            known = ", ".join(cls.options) or "none"
            users = {k: [n for n, c in FORMAT_CLASSES.items() if k in c.options] for k in unknown}
            who = "; ".join(f"{k!r} is an option of {', '.join(u)}" for k, u in users.items() if u)
            raise ConfigError(
                f"bad configuration for {name}: it has no option {', '.join(map(repr, unknown))} (its options: {known})"
                + (f"; {who}" if who else "")
            )
        out: dict[str, object] = {}
        for k, v in options.items():
            check = cls.options[k].check
            out[k] = check(v, name) if check is not None else v
        return out

    # -- identity ---------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.info.name

    def config(self) -> dict[str, Any]:
        """The format options as plain JSON data (``{}`` when the format has none)."""
        return {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Format) and type(other) is type(self) and other.config() == self.config()

    def __hash__(self) -> int:
        return hash((self.name, repr(self.config())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.config().items())})"

    # -- the specification (NumPy) ------------------------------------------------
    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        """Encode clean float32 blocks ``x`` (blocks, block_size): ``(bytes, trace)``.

        (A ``row_rule`` format takes ``row_blocks`` too: ``x`` is whole rows of
        that many blocks.)

        ``bytes`` is uint8 (blocks, type_size). ``trace`` maps names to the
        float32 intermediates of docs/formats.md, one row per block; formats
        with an fp16 scale include ``"d"``, the float32 scale before rounding.
        Inputs must be finite (the codec checks); the result for other
        blocks is unspecified.
        """
        raise NotImplementedError

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        """Decode clean uint8 blocks ``data`` (blocks, type_size) to float32 (blocks, block_size)."""
        raise NotImplementedError

    def _float_blocks(self, v: ArrayLike, what: str) -> NDArray[np.floating[Any]]:
        """``v`` as an array of floats whose last axis is whole blocks, else the one-line typed error naming ``what``."""
        a = np.asarray(v)
        if a.dtype.kind != "f":
            raise TbqTypeError(f"{self.name}: {what} must be float, got dtype {a.dtype}")
        if a.ndim == 0 or a.shape[-1] % self.block_size:
            n = a.shape[-1] if a.ndim else 0
            raise BlockShapeError(
                f"{self.name}: the last axis has {n} values, which is not a multiple of the block size {self.block_size}"
            )
        return a

    def _per_block(
        self, v: ArrayLike, f: Callable[[NDArray[np.floating[Any]]], NDArray[np.floating[Any]]]
    ) -> NDArray[np.floating[Any]]:
        """``f`` applied to each block of ``v`` (float32 or float64 kept, other floats as float32)."""
        a = self._float_blocks(v, "values")
        if a.dtype not in (np.float32, np.float64):
            a = a.astype(np.float32)
        return f(a.reshape(-1, self.block_size)).reshape(a.shape)

    # -- numba twins ----------------------------------------------------------------
    def kernels(self) -> types.ModuleType:
        """The numba kernel module (imported, and so compiled lazily, on first use; then cached, because
        ``importlib`` on every call costs about a microsecond, which small calls feel)."""
        kn = _KERNEL_MODULES.get(self.kernel_module)
        if kn is None:
            kn = _KERNEL_MODULES[self.kernel_module] = importlib.import_module(self.kernel_module)
        return kn

    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        """numba encode of clean blocks into ``out``; returns ``(block, status)`` (see :mod:`tbq.backend`)."""
        raise NotImplementedError

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        """numba decode of clean blocks into ``out``."""
        raise NotImplementedError

    def tables(self) -> dict[str, NDArray[Any]]:
        """The exact value tables this instance uses (name -> array); ``{}`` for formats without any."""
        return {}

    def __getstate__(self) -> dict[str, Any]:
        # A format travels by pickle (Dask's distributed workers, multiprocessing): the compiled
        # attention reader it keeps is process-local (a numba function that cannot be pickled)
        # and is rebuilt on first use in the receiving process, as are its bound capabilities.
        return {k: v for k, v in self.__dict__.items() if k != "_attention_reader" and not k.startswith("_capability_")}

    # -- what the codec refuses (unless on_overflow="inf") ------------------------------
    def scale_overflows(self, trace: Trace) -> NDArray[np.bool_]:
        """bool (blocks,): blocks whose stored scale would be infinite (fp16: ``|d| >= 65520``)."""
        d = trace.get("d")
        if d is None:
            return np.zeros(0, bool)
        return f16_overflows(d)

    def invalid_blocks(self, trace: Trace) -> NDArray[np.int8]:
        """int (blocks,): 0 for a block the codec writes, else the status that refuses it.

        Default: ``STATUS_SCALE_OVERFLOW`` where :meth:`scale_overflows`.
        Formats with other refusals (a value that overflows f16, an exponent
        the C code leaves undefined) override this; the numba kernels return
        the same status for the same first block.
        """
        return overflow_status(self.scale_overflows(trace))

    def encode_error(self, status: int, block: int, values: NDArray[np.float32]) -> Exception:
        """The exception for refused ``block`` (its float32 ``values``) with ``status`` (not NONFINITE)."""
        d = float(block_trace(self, values)["d"][0])
        return ScaleOverflowError(
            f"{self.name}: the scale of block {block} is {d!r}, which does not fit float16 {F16_OVERFLOW_WHY}. "
            "Pass on_overflow='inf' to store "
            "an infinite scale as the C reference does",
            block=block,
            scale=d,
        )

    def overflow_kw(self, on_overflow: str) -> dict[str, bool]:
        """Keyword arguments of :meth:`reference_encode` and :meth:`kernel_encode` for ``on_overflow``.

        ``{}`` for formats with the two common modes (whose encoders store the
        ``"inf"`` result; ``"raise"`` refuses through :meth:`invalid_blocks`).
        """
        return {}

    def _row_kw(self, row_blocks: int) -> dict[str, int]:
        return {"row_blocks": row_blocks} if self.row_rule else {}

    # -- structure ----------------------------------------------------------------------
    def fields(self, data: ArrayLike) -> dict[str, NDArray[Any]]:
        """Named fields of encoded blocks: ``data`` uint8 (..., nbytes) -> arrays (..., n_blocks[, k]).

        Every format gives ``"d"`` (float32 scale per block, decoded from fp16)
        when it has one, and its codes under the names of its layout.
        """
        blocks = self._blocks(data)
        out: dict[str, NDArray[Any]] = {}
        for f in self.info.layout:
            raw = np.ascontiguousarray(blocks[..., f.offset : f.offset + f.size])
            out[f.name] = read_field(f.kind, raw)
        return out

    def _blocks(self, data: ArrayLike) -> NDArray[np.uint8]:
        a = np.asarray(data)
        if a.dtype != np.uint8:
            raise TbqTypeError(f"{self.name}: encoded data must be uint8, got dtype {a.dtype}")
        if a.ndim == 0 or a.shape[-1] % self.type_size:
            n = a.shape[-1] if a.ndim else 0
            raise EncodedLengthError(
                f"{self.name}: the last axis has {n} bytes, which is not a multiple of the block's {self.type_size} bytes"
            )
        return a.reshape(a.shape[:-1] + (a.shape[-1] // self.type_size, self.type_size))

    # -- fragility ------------------------------------------------------------------------
    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        """bool (blocks, block_size): values whose code a k-ulp change of the traced quantity can change."""
        raise NotImplementedError

    def fragile_scales(self, trace: Trace, k: int) -> NDArray[np.bool_]:
        """bool (blocks,): blocks whose stored scale a k-ulp change of ``d`` can change (an fp16 midpoint is near)."""
        d64 = np.asarray(trace["d"], np.float64)
        w = k * ulp32(d64)
        with np.errstate(all="ignore"):
            return (d64 - w).astype(np.float16) != (d64 + w).astype(np.float16)

    def decode_tolerance(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        """float32 (blocks, block_size): the largest legitimate ``|y' - y|`` of a decoded value.

        0 where every correct decoder must return the spec's exact float32
        (the default: products of a code and a scale are exact). Formats whose
        decoder arithmetic a fused multiply-add changes (planar/iso rotations)
        return a derived bound, so golden vectors can tell kernel authors how
        far an FMA build may legitimately be.
        """
        blocks = np.asarray(data).reshape(-1, self.type_size)
        return np.zeros((blocks.shape[0], self.block_size), np.float32)

    # -- public convenience (validated NumPy reference) ----------------------------------------
    @overload
    def encode(self, x: ArrayLike, *, trace: Literal[False] = False) -> NDArray[np.uint8]: ...
    @overload
    def encode(self, x: ArrayLike, *, trace: Literal[True]) -> tuple[NDArray[np.uint8], Trace]: ...
    @overload
    def encode(self, x: ArrayLike, *, trace: bool) -> NDArray[np.uint8] | tuple[NDArray[np.uint8], Trace]: ...

    def encode(self, x: ArrayLike, *, trace: bool = False) -> NDArray[np.uint8] | tuple[NDArray[np.uint8], Trace]:
        """Encode float values with the NumPy reference: uint8 (..., n // block_size * type_size).

        With ``trace=True`` returns ``(bytes, trace)``, the trace's arrays
        shaped ``(..., n_blocks[, k])``. ``x`` must be finite float data whose
        last axis is whole blocks (use :func:`tbq.quantize` for the fast,
        threaded path with the same bytes).
        """
        a = self._float_blocks(x, "input")
        if not np.isfinite(a).all():
            from ..errors import NonFiniteError

            raise NonFiniteError(f"{self.name}: the input holds NaN or Inf, which cannot be encoded")
        lead, nb = a.shape[:-1], a.shape[-1] // self.block_size
        x2 = np.ascontiguousarray(a, np.float32).reshape(-1, self.block_size)
        with np.errstate(all="ignore"):
            data, tr = self.reference_encode(x2, **self._row_kw(nb))
        data = data.reshape(lead + (nb * self.type_size,))
        if not trace:
            return data
        return data, {k: v.reshape(lead + (nb,) + v.shape[1:]) for k, v in tr.items()}

    def decode(self, data: ArrayLike) -> NDArray[np.float32]:
        """Decode uint8 data with the NumPy reference: float32 (..., nbytes // type_size * block_size)."""
        blocks = self._blocks(data)
        d2 = np.ascontiguousarray(blocks).reshape(-1, self.type_size)
        with np.errstate(all="ignore"):
            y = self.reference_decode(d2)
        return y.reshape(blocks.shape[:-2] + (blocks.shape[-2] * self.block_size,))


# ---------------------------------------------------------------------------
# the field-kind registry
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldKind:
    """How the bytes of a :class:`Field` of this ``kind`` read, and what the checker and the fuzzers need of it.

    ``reader(raw)``: uint8 ``(..., size)`` -> the field's values; ``ordered(values)``: float values -> int64
    codes where neighbouring representable values differ by one (``None``: the values are integer codes
    already); ``specials``: ``{name: (lowest, highest)}`` bit patterns (little-endian integers of the
    field's bytes, or of each 16-bit word of a longer field) that arbitrary-byte fuzzing and ``tbq
    check``'s random-bytes phase inject.
    """

    reader: Callable[[NDArray[np.uint8]], NDArray[Any]]
    ordered: Callable[[NDArray[Any]], NDArray[np.int64]] | None = None
    specials: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False)


#: kind name -> :class:`FieldKind`. A format module registers the kinds its layouts use that are not here
#: (:func:`register_field_kind`), so no reader, checker or fuzzer holds a list of kinds.
FIELD_KINDS: dict[str, FieldKind] = {}


def register_field_kind(name: str, kind: FieldKind) -> FieldKind:
    """Register (or look up the same) field kind ``name``; a different second definition is an error."""
    old = FIELD_KINDS.get(name)
    if old is not None and old != kind:
        raise ConfigError(f"field kind {name!r} is registered twice with different readers")
    FIELD_KINDS[name] = kind
    return kind


def read_field(kind: str, raw: NDArray[np.uint8]) -> NDArray[Any]:
    """The values of a field of ``kind`` from its raw bytes ``(..., size)`` (see :data:`FIELD_KINDS`)."""
    try:
        return FIELD_KINDS[kind].reader(raw)
    except KeyError:
        raise ConfigError(f"unknown field kind {kind!r}; registered: {', '.join(FIELD_KINDS)}") from None


def ordered_field_code(values: ArrayLike, kind: str = "") -> NDArray[np.int64]:
    """Field values as int64 codes where neighbours differ by one (integers as they are; floats by their bits).

    >>> ordered_field_code(np.float32([0.0, -0.0, 1.0, 1.0009766]), "f16").tolist()
    [0, -1, 15360, 15361]
    """
    a = np.asarray(values)
    if a.dtype.kind in "iub":
        return a.astype(np.int64)
    fk = FIELD_KINDS.get(kind)
    with np.errstate(all="ignore"):
        if fk is not None and fk.ordered is not None:
            return fk.ordered(a)
        return _sign_magnitude_order(a.astype(np.float32).view(np.uint32).astype(np.int64), 31)


def _sign_magnitude_order(bits: NDArray[np.int64], top: int) -> NDArray[np.int64]:
    mag = bits & ((1 << top) - 1)
    return np.where(bits >> top, -mag - 1, mag)


def _f16_reader(raw: NDArray[np.uint8]) -> NDArray[np.float32]:
    return f16_table()[raw.view("<u2")[..., 0]]


def _bf16_reader(raw: NDArray[np.uint8]) -> NDArray[np.float32]:
    return (raw.view("<u2")[..., 0].astype(np.uint32) << np.uint32(16)).view(np.float32)


def _packing(name: str) -> Callable[[NDArray[np.uint8]], NDArray[np.uint8]]:
    def read(raw: NDArray[np.uint8]) -> NDArray[np.uint8]:
        from .. import packing

        return getattr(packing, name)(raw)

    return read


#: fp16 patterns: infinities, NaNs (any payload), subnormals, zeros, the extremes, either sign, and the two
#: finite ranges (the one list the fuzzers and the checker inject into fp16 fields).
SPECIAL_F16: dict[str, tuple[int, int]] = {
    "+inf": (0x7C00, 0x7C00),
    "-inf": (0xFC00, 0xFC00),
    "nan": (0x7C01, 0x7FFF),
    "-nan": (0xFC01, 0xFFFF),
    "subnormal": (0x0001, 0x03FF),
    "-subnormal": (0x8001, 0x83FF),
    "+0": (0x0000, 0x0000),
    "-0": (0x8000, 0x8000),
    "max": (0x7BFF, 0x7BFF),
    "-max": (0xFBFF, 0xFBFF),
    "min_normal": (0x0400, 0x0400),
    "-min_normal": (0x8400, 0x8400),
    "negative": (0x8400, 0xFBFF),
    "positive": (0x0400, 0x7BFF),
}
SPECIAL_BF16: dict[str, tuple[int, int]] = {
    "+inf": (0x7F80, 0x7F80),
    "-inf": (0xFF80, 0xFF80),
    "nan": (0x7F81, 0x7FFF),
    "-nan": (0xFF81, 0xFFFF),
    "subnormal": (0x0001, 0x007F),
    "-subnormal": (0x8001, 0x807F),
    "+0": (0x0000, 0x0000),
    "-0": (0x8000, 0x8000),
    "max": (0x7F7F, 0x7F7F),
    "-max": (0xFF7F, 0xFF7F),
    "min_normal": (0x0080, 0x0080),
    "-min_normal": (0x8080, 0x8080),
}

register_field_kind(
    "f16",
    FieldKind(
        _f16_reader,
        lambda a: _sign_magnitude_order(a.astype(np.float16).view(np.uint16).astype(np.int64), 15),
        SPECIAL_F16,
    ),
)
register_field_kind(
    "bf16",
    FieldKind(
        _bf16_reader,
        lambda a: _sign_magnitude_order((a.astype(np.float32).view(np.uint32) >> 16).astype(np.int64), 15),
        SPECIAL_BF16,
    ),
)
register_field_kind("int8", FieldKind(lambda raw: raw.view(np.int8)))
register_field_kind("uint8", FieldKind(lambda raw: raw))
register_field_kind("u32", FieldKind(lambda raw: raw.view("<u4")[..., 0].astype(np.uint32)))
register_field_kind("u4_halves", FieldKind(_packing("np_unpack4_halves")))
register_field_kind("u4_pairs", FieldKind(_packing("np_unpack4_pairs")))
register_field_kind("u3_lanes", FieldKind(_packing("np_unpack3")))
