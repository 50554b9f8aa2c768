"""What each consumer of a format needs beyond its core: one named capability per consumer.

A :class:`~tbq.formats.base.Format`'s own interface is what every format must
define: its layout (``info``), its options, the NumPy reference encoder and
decoder, the numba kernels and what the codec refuses. Everything a *consumer*
needs beyond that is a capability, declared on the format as a class attribute
naming a subclass of one of the classes below, and read by that consumer only::

    class MyChecks(CheckTraits):
        tie_rule = "away"
        vec_dot_type = "q8_0"

        def dot_parts(self, data): ...  # self.format is the format instance


    class MyFormat(Format):
        info = FormatInfo(name="my_format", ...)
        checker = CapabilitySlot(MyChecks)
        fuzz = CapabilitySlot(FuzzTraits, hazards={"binade_tops": {}})  # only data: declared in the slot

On an instance, ``fmt.checker`` is the capability bound to it (made on first
use and kept; ``self.format`` inside it is ``fmt``); on the class,
``MyFormat.checker`` is the capability class, whose declared data (``tie_rule``)
reads without an instance. A format that declares nothing gets the defaults
below, which describe a plain format: no checker rules, the original domain,
no fused attention reader, no fuzzing hazards.

========================  ==================  ==========================================================
attribute                 capability          consumer
========================  ==================  ==========================================================
``checker``               :class:`CheckTraits`      ``tbq check`` (:mod:`tbq.check`), ``tbq.hf``'s dot products
``quantizer``             :class:`QuantizerTraits`  the checker's diagnoses, golden fragility, the study
``golden``                :class:`GoldenTraits`     golden vectors (:mod:`tbq.golden`) and ``tbq check``
``attention``             :class:`AttentionTraits`  the fused attention kernel (:mod:`tbq.attention`)
``fuzz``                  :class:`FuzzTraits`       the hypothesis strategies (:mod:`tbq.testing.strategies`)
``domain``                :class:`DomainTraits`     whatever compares decoded values with inputs
========================  ==================  ==========================================================
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..half import f16_table

__all__ = [
    "Capability",
    "CapabilitySlot",
    "CheckTraits",
    "QuantizerTraits",
    "GoldenTraits",
    "AttentionTraits",
    "FuzzTraits",
    "DomainTraits",
    "CAPABILITIES",
    "AttentionReader",
    "FormatCore",
    "Trace",
    "TIE_RULES",
    "DOMAINS",
]

#: The tie rules :attr:`CheckTraits.tie_rule` may name (``""``: not declared).
TIE_RULES = ("", "away", "toward", "up", "even")
#: The domains :attr:`AttentionTraits.domain` and :attr:`DomainTraits.decode_domain` may name.
DOMAINS = ("original", "rotated")

_C = TypeVar("_C", bound="Capability", covariant=True)
_MISSING = object()

#: An encoder's trace (:meth:`Format.reference_encode`): name -> the intermediates of docs/formats.md, one row
#: per block (float32 quantities; a format may add integer or boolean ones, IQ4_NL's ``"carried"``).
Trace = dict[str, NDArray[Any]]


class FormatCore(Protocol):
    """What the default capabilities use of the format they are bound to (a :class:`~tbq.formats.base.Format`)."""

    @property
    def name(self) -> str: ...
    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]: ...
    def kernels(self) -> types.ModuleType: ...


@dataclass(frozen=True, eq=False)
class AttentionReader:
    """How the fused attention kernel reads a format's blocks (:meth:`AttentionTraits.reader`).

    ``read``: the compiled C-callable reader (:func:`tbq.kernels.attention_reader`), which decodes a
    row's blocks to float32 in the format's :attr:`AttentionTraits.domain`; ``aux``: the float32 tables
    it reads (:meth:`AttentionTraits.tables`).
    """

    read: Any  # a numba CFunc: .address is its C address
    aux: NDArray[np.float32]


class Capability:
    """A capability bound to one format instance (:attr:`format`); subclass one of the named capabilities below."""

    format: FormatCore

    def __init__(self, fmt: FormatCore) -> None:
        self.format = fmt

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.format!r})"


class CapabilitySlot(Generic[_C]):
    """The descriptor a :class:`Format` declares a capability with: ``checker = CapabilitySlot(CheckTraits)``
    on the base class; a format overrides it with its own capability class (``checker = CapabilitySlot(MXFP4Checks)``).

    A capability that differs from its class only in declared data is declared in the slot, without a class of
    its own: ``fuzz = CapabilitySlot(FuzzTraits, hazards={"min_ties": {"levels": 15}})`` is the subclass of
    ``FuzzTraits`` with that ``hazards``, named after the format and the slot (``Q4_1.fuzz``). Only data the
    class already declares may be given (a misspelt name is an error, not a new attribute), never a hook.

    On the class it gives the capability class (its declared data reads without an instance); on an instance,
    the capability bound to that instance, made on first use and kept in the instance's ``__dict__`` (dropped
    when the format is pickled: a bound capability may hold compiled, process-local code).

    >>> class _F:
    ...     fuzz = CapabilitySlot(FuzzTraits, hazards={"ties": {}})
    >>> _F.fuzz.__qualname__, _F.fuzz.hazards, issubclass(_F.fuzz, FuzzTraits)
    ('_F.fuzz', {'ties': {}}, True)
    >>> CapabilitySlot(FuzzTraits, hazard={})
    Traceback (most recent call last):
    TypeError: FuzzTraits declares no data member 'hazard' (a hook goes on a subclass)
    """

    def __init__(self, cls: type[_C], **data: Any) -> None:
        for k in data:
            old = getattr(cls, k, _MISSING)
            if k.startswith("_") or old is _MISSING or callable(old) or isinstance(old, property):
                raise TypeError(f"{cls.__name__} declares no data member {k!r} (a hook goes on a subclass)")
        #: the capability class: ``cls`` itself, or its subclass with ``data`` (named in :meth:`__set_name__`)
        self.cls: type[_C] = (
            types.new_class(cls.__name__, (cls,), exec_body=lambda ns: ns.update(data)) if data else cls
        )
        self._data = tuple(data)
        self.key = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = f"_capability_{name}"
        if self._data:
            base = self.cls.__mro__[1].__name__
            self.cls.__name__ = self.cls.__qualname__ = f"{owner.__qualname__}.{name}"
            self.cls.__module__ = owner.__module__
            self.cls.__doc__ = f"{owner.__name__}'s :class:`{base}`: declares {', '.join(self._data)}."

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> type[_C]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _C: ...

    def __get__(self, obj: object, owner: type | None = None) -> type[_C] | _C:
        if obj is None:
            return self.cls
        d = obj.__dict__
        cap = d.get(self.key)
        if cap is None:
            cap = d[self.key] = self.cls(obj)  # type: ignore[arg-type]
        return cap


# ---------------------------------------------------------------------------
# tbq check
# ---------------------------------------------------------------------------


class CheckTraits(Capability):
    """What ``tbq check`` (:mod:`tbq.check`) needs to judge a C or numba kernel of the format beyond "same bytes".

    Data (class attributes):

    ``tie_rule``
        how the C encoder rounds an exact tie between two levels of :meth:`QuantizerTraits.value_table`:
        ``"away"`` (half away from zero, roundf), ``"toward"`` (half toward zero), ``"up"`` (half up,
        ``trunc(v + k + 1/2)``), ``"even"``; ``""`` where not declared (one of :data:`TIE_RULES`). The checker
        names another tie rule against it.
    ``vec_dot_type``
        the format ggml pairs this one with in its dot product ``ggml_vec_dot_<fmt>_<vec_dot_type>`` (the
        right operand, a registered format); ``""`` where tbq cannot check that dot product. ``tbq check
        --dot`` and ``tbq.hf``'s attention read it.
    ``reciprocal_scale``
        ``True`` for formats whose C encoder multiplies by ``id = 1/d`` (the traced float32 ``d``): when ``1/d``
        overflows, ``x * id`` is +-Inf or NaN and C's float-to-integer conversion of it is undefined
        (:meth:`undefined_blocks`).
    ``symbol_stem``
        the type's name in its C reference's row functions when it is not the format's name (``""``: the
        name): ``tbq check`` calls ``quantize_row_<stem>_ref`` and ``dequantize_row_<stem>`` (turbo3:
        ``turbo3_0``).

    Hooks (methods; :attr:`format` is the format instance): :meth:`dot_parts`, :meth:`dot_offset`,
    :meth:`derived`, :meth:`undefined_blocks`, :meth:`equivalent_blocks`.
    """

    tie_rule: ClassVar[str] = ""
    vec_dot_type: ClassVar[str] = ""
    reciprocal_scale: ClassVar[bool] = False
    symbol_stem: ClassVar[str] = ""

    def dot_parts(self, data: NDArray[np.uint8]) -> tuple[NDArray[np.int64], NDArray[np.float64]] | None:
        """``(codes, scale)`` of encoded blocks ``data`` (uint8, blocks x type_size) for dot products: int64 codes
        (blocks, block_size) and the float64 scale per block (blocks,) such that each value is exactly
        ``codes * scale``, so that a block's dot product has an exact integer part. ``None`` for formats
        without that form."""
        return None

    def derived(self, data: NDArray[np.uint8], trace: Trace) -> NDArray[np.uint8] | None:
        """``data`` (blocks, type_size) with its :attr:`Field.derived` fields recomputed from its own codes (and the
        reference ``trace`` of the same blocks, for a float the bytes do not hold, such as q8_1's float32 ``d``);
        ``None`` for a format without derived fields. Where C leaves a derived field unwritten, keep it."""
        return None

    def dot_offset(self, data: NDArray[np.uint8]) -> NDArray[np.float64] | None:
        """The float64 term per block (blocks,) that ggml's dot product adds outside the integer sum; ``None`` when
        there is none. A left operand's minimum (q4_1, q5_1: each value is ``codes * d + m``), a right operand's
        stored block sum (q8_1: ``s = fp16(d * sum(codes))``): ggml's block term is then
        ``sumi * dx * dy + mx * sy`` (``ggml_vec_dot_q4_1_q8_1``), and a left operand with an offset pairs only
        with a right operand that has one."""
        return None

    def undefined_blocks(self, trace: Trace) -> tuple[NDArray[np.bool_], str]:
        """``(mask, rule)``: blocks (bool, blocks) whose C reference result is undefined behaviour, and the rule in
        one line. A kernel may write anything there; the checker accepts a difference on them unless ``exact``.

        Default: with :attr:`reciprocal_scale`, the blocks whose ``1/d`` overflows float32; otherwise none.
        """
        d = trace.get("d") if self.reciprocal_scale else None
        if d is None:
            n = next((np.shape(v)[0] for v in trace.values() if np.ndim(v)), 0)
            return np.zeros(n, bool), ""
        d = np.asarray(d, np.float32).reshape(-1)
        with np.errstate(all="ignore"):
            over = (d != 0) & np.isfinite(d) & np.isinf(np.float32(1) / d)
        return over, (
            "1/d overflows float32 (|d| below 2**-128, amax about 1e-37 or less): x * (1/d) is +-Inf or NaN, and "
            "C's conversion of it to an integer code is undefined"
        )

    def equivalent_blocks(self, ref: NDArray[np.uint8], got: NDArray[np.uint8]) -> NDArray[np.bool_]:
        """bool (blocks,): encoded blocks ``got`` (uint8, blocks x type_size) that differ from ``ref`` but decode to the
        same values (equal as numbers, so +0 and -0 alike, NaN where NaN): a zero scale with any codes, a zero of
        either sign. Default: the format's :meth:`~Format.reference_decode` of both, compared value by value.

        >>> import tbq; q = tbq.get_format("q8_0"); a = q.encode(np.zeros((1, 32), np.float32)); b = a.copy(); b[0, 2:] = 0x80
        >>> q.checker.equivalent_blocks(a, b).tolist()
        [True]
        """
        dec = self.format.reference_decode
        with np.errstate(all="ignore"):
            yr = dec(np.ascontiguousarray(ref, np.uint8)).reshape(ref.shape[0], -1)
            yg = dec(np.ascontiguousarray(got, np.uint8)).reshape(got.shape[0], -1)
            same = (yr == yg) | (np.isnan(yr) & np.isnan(yg))
        return same.all(axis=1)


# ---------------------------------------------------------------------------
# the quantizer's structure: study, diagnoses, golden fragility
# ---------------------------------------------------------------------------


class QuantizerTraits(Capability):
    """What the encoder rounds onto what, read from its trace: the study's tables (:func:`tbq.study.table_levels`),
    the checker's diagnoses and scale rule (:mod:`tbq.check.classify`, :mod:`tbq.check.diagnose`) and golden
    fragility (:mod:`tbq.golden.fragility`, the ``norm`` array). Both hooks return ``None`` by default (a format
    without one value table, such as f16, or that quantizes in the original domain).
    """

    def value_table(self, trace: Trace) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
        """``(levels, inputs)``: the values the codes decode to (float64, duplicates kept) and the flat float64
        values the encoder rounds onto them, in the same units, read from this instance's encoder ``trace``.
        ``None`` for a format without one value table (f16, bf16); docs/formats.md gives each format's units.
        """
        return None

    def rotated_view(self, trace: Trace) -> tuple[NDArray[np.float32], NDArray[np.float32]] | None:
        """``(norm, r)`` of a rotated format from its encoder ``trace``: the float32 norm of each block (its step 1)
        and the normalised, rotated coordinates the codebook rounds (blocks, block_size); ``None`` for a format
        that quantizes in the original domain."""
        return None

    @staticmethod
    def int_levels(lo: int, n: int, v: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Integer codes ``lo .. lo + n - 1`` met by the traced ``v`` (a helper for :meth:`value_table`)."""
        return np.arange(lo, lo + n, dtype=np.float64), np.asarray(v, np.float64).ravel()


# ---------------------------------------------------------------------------
# golden vectors
# ---------------------------------------------------------------------------


class GoldenTraits(Capability):
    """How golden vectors (:mod:`tbq.golden`) and ``tbq check`` write and judge this format's sets.

    ``ulp_floor``
        float32 magnitude below which fragility counts ulps at this magnitude (:func:`tbq.formats.base.band`;
        TBQ's rotated coordinates: ``TBQ_ULP_FLOOR``); passed to :meth:`~Format.fragile_values`.
    ``on_overflow``
        the codec's ``on_overflow`` mode golden vectors are written with and ``tbq check`` runs: what the
        format's writers store. ``"raise"`` (the golden inputs fit); FP8 ``"saturate"`` (vLLM saturates: the
        shared golden inputs reach 464 and beyond, E4M3's limit at scale 1). One of the format's
        :attr:`~Format.overflow_modes`.
    """

    ulp_floor: ClassVar[float] = 0.0
    on_overflow: ClassVar[str] = "raise"


# ---------------------------------------------------------------------------
# the fused attention kernel
# ---------------------------------------------------------------------------


class AttentionTraits(Capability):
    """How the fused attention kernel (:mod:`tbq.attention_kernels`, through :mod:`tbq.attention`) reads this
    format's blocks as they are.

    ``domain``
        ``"original"`` (the values, as the decoder gives them) or ``"rotated"`` (the block's coordinates in the
        domain of the format's ``rotation``, an orthonormal map of each ``block_size`` values with ``forward``
        and ``inverse``: the kernel rotates the query once and the output back once; TBQ4_0, TBQ3_0, turbo).
    ``read``
        name of the function of the format's ``kernel_module`` that reads blocks (signature
        :data:`tbq.kernels.READER_SIG`, with :meth:`tables` as its ``aux``); ``""``: the format has none, and
        the kernel reads its cache decoded to float32 rows first (a plugin format's default).

    :meth:`tables` gives the reader's float32 tables; :meth:`reader` the compiled reader.
    """

    domain: ClassVar[str] = "original"
    read: ClassVar[str] = ""

    def tables(self) -> NDArray[np.float32]:
        """float32 tables the reader gets as ``aux`` (default: :func:`tbq.half.f16_table`, for an fp16 scale)."""
        return f16_table()

    def reader(self) -> AttentionReader | None:
        """The :class:`~tbq.formats.base.AttentionReader` of this instance (compiled on first use, then kept), or
        ``None`` when the format declares no :attr:`read` (its cache is then decoded to float32 rows first)."""
        kept = self.format.__dict__  # dropped when the format is pickled (a compiled reader is process-local)
        r: AttentionReader | None = kept.get("_attention_reader")
        if r is None and self.read:
            from ..kernels import attention_reader

            aux = np.ascontiguousarray(self.tables(), np.float32).reshape(-1)
            r = kept["_attention_reader"] = AttentionReader(
                attention_reader(getattr(self.format.kernels(), self.read)), aux
            )
        return r


# ---------------------------------------------------------------------------
# fuzzing
# ---------------------------------------------------------------------------


class FuzzTraits(Capability):
    """What the hypothesis strategies (:mod:`tbq.testing.strategies`) aim at.

    ``hazards``
        the rounding hazards, ``{family: parameters}``: ``"ties"`` (scalar grids: ``divisor`` = ``max|x| /
        |d|``, ``codes`` = the range of ``k`` whose ties ``x/d = k + 1/2`` lie inside the grid, optional
        ``multiplier`` = the trace key of what the encoder multiplies ``x`` by when it is not ``1/d``: Q8_K's
        ``iscale``), ``"thresholds"`` (codebook decision thresholds in a rotated domain), ``"min_ties"``,
        ``"grid_ties"``, ``"binade_tops"``, ``"ue4m3"``, ``"fp8_grid"``. Each family names a strategy of
        :mod:`tbq.testing.strategies`. A class attribute for most formats; FP8's is a property of the instance
        (its grid limits scale with ``scale``).
    """

    hazards: dict[str, dict[str, Any]] = {}


# ---------------------------------------------------------------------------
# the decoder's domain
# ---------------------------------------------------------------------------


class DomainTraits(Capability):
    """The domain the format's decoders (the reference, the kernels, the C reference's dequantizer) return values
    in. Whatever compares decoded values with an input maps one to the other's domain through it: the format
    battery, the study's quantizer, ``tbq compare``, the checker, ``KVCache.dequantize``, ``tbq.hf``.

    ``decode_domain``
        ``"original"`` (``decode(encode(x))`` approximates ``x``; both maps are the identity) or ``"rotated"``
        (it approximates :meth:`to_decode_domain` of ``x``: turbo2/3/4 decode to ``C[idx] * d`` without the
        inverse rotation, as the fork's ``dequantize_row_turbo*`` does).
    """

    decode_domain: ClassVar[str] = "original"

    def to_decode_domain(self, x: ArrayLike) -> NDArray[np.floating[Any]]:
        """Original-domain values ``x`` (float, last axis whole blocks) mapped to the domain the decoder returns,
        so that ``decode(encode(x))`` can be compared with them. The identity (``x`` as an array) unless the
        decoder returns another domain (turbo2/3/4: ``R(x)`` per block).

        >>> import tbq; x = np.float32([[1, 2] * 16]); tbq.get_format("q8_0").domain.to_decode_domain(x) is x
        True
        """
        return np.asarray(x)

    def from_decode_domain(self, y: ArrayLike) -> NDArray[np.floating[Any]]:
        """Decoded values ``y`` mapped back to the input's domain: the inverse of :meth:`to_decode_domain`."""
        return np.asarray(y)


#: attribute name on a format -> the capability class it declares (the defaults).
CAPABILITIES: dict[str, type[Capability]] = {
    "checker": CheckTraits,
    "quantizer": QuantizerTraits,
    "golden": GoldenTraits,
    "attention": AttentionTraits,
    "fuzz": FuzzTraits,
    "domain": DomainTraits,
}
