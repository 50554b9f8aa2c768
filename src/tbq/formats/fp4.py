"""MXFP4 and NVFP4 (ggml): 4-bit E2M1 codes with an E8M0 or UE4M3 block scale.

docs/formats.md, "MXFP4" and "NVFP4". Both use ggml's *doubled* E2M1 table
``V = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]`` (code = sign
bit 3 + magnitude bits) with a scale that is half the nominal one, and pick
for each value the *first* code minimising ``|float32(V[i] * d) - x|``
(strict ``<``): an exact midpoint goes to the smaller magnitude (not the OCP
round-to-nearest-even), zero always gets code 0, and ``|x| > 10 d`` saturates
at ``12 d``.

MXFP4, 32 values -> 17 bytes: ``e`` (E8M0) then 16 bytes of codes in ggml's
split-half order. ``E = floor(log2f(amax))`` with glibc's correctly rounded
``log2f`` (= ``floor(float32(log2(float64(amax))))``; for the top few floats
of a binade it rounds up to the next integer), ``e = E + 125``, scale
``d = half(e) = 2**(e - 128)``; an all-zero block has ``e = 0``. For ``0 <
amax`` with ``E <= -126`` (``amax < 2**-125`` except the 44 largest floats
below it) the C code converts a negative float to ``uint8_t``: undefined
behaviour. tbq refuses such blocks unless ``on_overflow="inf"``, which
stores what x86-64 gcc stores (the exponent wraps mod 256: ``amax = 2**-126``
gives ``e = 255``, ``d = 2**127``, codes 0).

NVFP4, 64 values -> 36 bytes: four UE4M3 scales (one per 16 values) then 32
bytes of codes, each 16-value sub-block split in halves of 8. Per sub-block
``u = ue4m3(amax / 6)`` (round half *up*, the subnormal range clamps at code 7,
everything from 248 saturates at ``0x7E``), ``dd = ue4m3_to_f32(u)`` (half the
UE4M3 value). No per-tensor scale. ``amax / 6`` below about ``2**-10`` gives
``u = 0``, ``dd = 0`` and codes 0: such sub-blocks decode to zeros.

Decode: ``y = V[c] * d`` (exact).

>>> q = MXFP4().encode(np.float32([7.9999995, 1.5, -1.5, 0.25] + [0.0] * 28))
>>> int(q[0]), [int(c) for c in MXFP4().fields(q)["qs"][0, :4]]  # log2f rounds up: E = 3, d = 1; ties go down
(128, [6, 1, 9, 0])
>>> MXFP4().decode(q)[:4].tolist()
[8.0, 1.0, -1.0, 0.0]
>>> int(ue4m3_from_f32(np.float32(1.0625))), float(ue4m3_to_f32(np.uint8(0x39)))  # half up, not to even
(57, 0.5625)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..backend import STATUS_UNDEFINED
from ..errors import ScaleOverflowError, TbqValueError
from ..packing import np_pack4_halves, np_unpack4_halves
from .base import Field, Format, FormatInfo, Trace, band, block_trace
from .capabilities import AttentionTraits, CapabilitySlot, CheckTraits, FuzzTraits, QuantizerTraits

__all__ = [
    "MXFP4",
    "NVFP4",
    "E2M1_VALUES",
    "e8m0_exponent",
    "e8m0_byte",
    "e8m0_half",
    "e8m0_boundaries",
    "ue4m3_from_f32",
    "ue4m3_to_f32",
    "fp4_codes",
]

F32 = np.float32
_0 = F32(0.0)
_HALF = F32(0.5)
_6 = F32(6.0)
_448 = F32(448.0)
_512 = F32(512.0)

#: ``kvalues_mxfp4``: the E2M1 values doubled (int8), indexed by the 4-bit code.
E2M1_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
_VF = E2M1_VALUES.astype(np.float32)
#: Midpoints of the magnitude grid 0, 1, 2, 3, 4, 6, 8, 12 (units of the scale).
_MID = np.array([0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0])
_MAG = np.array([0, 1, 2, 3, 4, 6, 8, 12], np.float64)


# ---------------------------------------------------------------------------
# E8M0 (MXFP4)
# ---------------------------------------------------------------------------


def e8m0_exponent(amax: ArrayLike) -> NDArray[np.int32]:
    """``E = floor(log2f(amax))`` of positive float32 ``amax`` (int32), as glibc's correctly rounded ``log2f``.

    Computed as ``floor(float32(log2(float64(amax))))``, which equals
    ``floorf(log2f(amax))`` for every positive float32 (docs/formats.md,
    "MXFP4"). It is the binary exponent ``b`` of ``amax`` except for the top
    ``n`` floats of a binade, where ``log2f`` rounds up to ``b + 1`` (``n = 1``
    for b in {2, 3, -3, -4} ... ``n = 44`` for b in 64..127 and -65..-126).

    >>> e8m0_exponent(np.float32([float.fromhex("0x1.fffffep+2"), float.fromhex("0x1.fffffcp+2"), 1.0, 3e-39])).tolist()
    [3, 2, 0, -128]
    """
    a = np.asarray(amax, np.float32)
    if np.any(~(a > 0)) or not np.isfinite(a).all():
        raise TbqValueError(
            "e8m0_exponent needs positive finite float32 values (an all-zero block has e = 0 and no exponent)"
        )
    return np.floor(np.log2(a.astype(np.float64)).astype(np.float32)).astype(np.int32)


def e8m0_byte(amax: ArrayLike) -> NDArray[np.uint8]:
    """The E8M0 byte ``e`` MXFP4 stores for block maxima ``amax`` (uint8).

    ``E + 125`` for ``amax > 0``, ``0`` for ``amax == 0``. Where C's conversion is
    undefined (``E <= -126``) this is x86-64 gcc's result, ``(E + 125) mod 256``.

    >>> e8m0_byte(np.float32([0.0, 1.0, 7.9999995, 2.0**-125, 2.0**-126])).tolist()
    [0, 125, 128, 0, 255]
    """
    a = np.asarray(amax, np.float32)
    pos = a > 0
    E = e8m0_exponent(np.where(pos, a, F32(1)))
    return np.where(pos, (E.astype(np.int64) + 125) & 255, 0).astype(np.uint8)


def e8m0_half(e: ArrayLike) -> NDArray[np.float32]:
    """``ggml_e8m0_to_fp32_half``: ``2**(e - 128)`` as float32 for every byte ``e`` (subnormal for e = 0, 1).

    >>> e8m0_half(np.uint8([0, 1, 2, 128, 255])).tolist()
    [2.938735877055719e-39, 5.877471754111438e-39, 1.1754943508222875e-38, 1.0, 1.7014118346046923e+38]
    """
    e = np.asarray(e, np.uint8).astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


@functools.cache
def e8m0_boundaries() -> NDArray[np.uint32]:
    """uint32 (278,): entry ``i`` is the bit pattern of the smallest positive float32 whose ``E`` is ``>= i - 149``.

    ``E(amax) = -150 + #(entries <= bits(amax))``; the kernels read the one
    entry that matters for a normal ``amax`` (``E`` is ``b`` or ``b + 1``).
    Found by bisection on :func:`e8m0_exponent` (``E`` is monotone in ``amax``).

    >>> hex(e8m0_boundaries()[3 + 149])  # E >= 3 from 0x1.fffffep+2 = 7.9999995 on
    '0x40ffffff'
    """
    target = np.arange(-149, 129, dtype=np.int64)
    lo = np.ones(target.size, np.int64)
    hi = np.full(target.size, 0x7F800000, np.int64)  # +inf: E >= every target
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        f = np.minimum(mid, 0x7F7FFFFF).astype(np.uint32).view(np.float32)
        ok = (e8m0_exponent(f) >= target) | (mid > 0x7F7FFFFF)
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid + 1)
    out = lo.astype(np.uint32)
    out.setflags(write=False)
    return out


# ---------------------------------------------------------------------------
# UE4M3 (NVFP4)
# ---------------------------------------------------------------------------


def ue4m3_from_f32(s: ArrayLike) -> NDArray[np.uint8]:
    """``ggml_fp32_to_ue4m3`` of float32 ``s`` (uint8), the C bit rule.

    Not ``s > 0`` (zero, negative, NaN) -> 0; ``s = min(s, 448)``; below 2**-6
    ``M = min(7, trunc(float32(s * 512 + 0.5)))`` (0 if M < 1: the subnormal
    range clamps at 7 instead of rounding up to 0x08); from 256 -> 0x7E;
    otherwise the top 3 mantissa bits rounded half *up* on the first dropped
    bit, a carry moving to the next exponent (0x7E again from 248).
    ml_dtypes' float8 types round to even and are not this rule.

    >>> [hex(v) for v in ue4m3_from_f32(np.float32([0.3125, 1.0625, 240, 250, 0.0146484375, 2.0**-10, -1.0]))]
    ['0x2a', '0x39', '0x77', '0x7e', '0x7', '0x1', '0x0']
    """
    s = np.asarray(s, np.float32)
    pos = s > _0  # False for NaN
    sc = np.minimum(np.where(pos, s, _0), _448)
    bits = sc.view(np.uint32)
    fe = ((bits >> np.uint32(23)) & np.uint32(255)).astype(np.int32) - 127
    fm = ((bits >> np.uint32(20)) & np.uint32(7)).astype(np.int32)
    ue = fe + 7
    t = sc * _512 + _HALF  # two float32 roundings (the product is exact)
    m_sub = np.minimum(np.trunc(t), F32(7)).astype(np.int32)
    sub = np.where(m_sub >= 1, m_sub, 0)
    m = fm + ((bits >> np.uint32(19)) & np.uint32(1)).astype(np.int32)  # half up: only the first dropped bit
    carry = m > 7
    m = np.where(carry, 0, m)
    ue2 = np.where(carry, ue + 1, ue)
    normal = np.where(ue2 >= 15, 0x7E, (ue2 << 3) | m)
    out = np.where(ue <= 0, sub, np.where(ue >= 15, 0x7E, normal))
    return np.where(pos, out, 0).astype(np.uint8)


def ue4m3_to_f32(u: ArrayLike) -> NDArray[np.float32]:
    """``ggml_ue4m3_to_fp32``: *half* the UE4M3 value of byte ``u`` (float32, exact).

    0x00 and 0x7F -> 0; bit 7 is ignored (0x80 -> 0, 0xFF -> 240);
    exponent 0: ``M * 2**-9``, else ``(1 + M/8) * 2**(E-7)``; then times 0.5.

    >>> ue4m3_to_f32(np.uint8([0x00, 0x01, 0x39, 0x7E, 0x7F, 0xFF])).tolist()
    [0.0, 0.0009765625, 0.5625, 224.0, 0.0, 240.0]
    """
    u = np.asarray(u, np.uint8)
    E = ((u >> 3) & 15).astype(np.int32)
    M = (u & 7).astype(np.float32)
    raw = np.where(E == 0, M * F32(2.0**-9), (F32(1) + M / F32(8)) * np.ldexp(F32(1), E - 7).astype(np.float32))
    return np.where((u == 0) | (u == 0x7F), _0, raw.astype(np.float32) * _HALF).astype(np.float32)


# ---------------------------------------------------------------------------
# value selection
# ---------------------------------------------------------------------------


def fp4_codes(x: ArrayLike, d: ArrayLike) -> NDArray[np.uint8]:
    """The spec's ``best_index_mxfp4`` literally: the first code minimising ``|float32(V[i] * d) - x|`` (uint8).

    ``x`` float32 (..., n), ``d`` float32 broadcastable to ``x.shape[:-1]``.
    (The kernels compare ``|x|`` with the midpoints instead; tests check the two agree.)

    >>> fp4_codes(np.float32([[1.5, -1.5, 10.0, 11.0, -0.0]]), np.float32([1.0])).tolist()
    [[1, 9, 6, 7, 0]]
    """
    x = np.asarray(x, np.float32)
    d = np.asarray(d, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        g = d[..., None, None] * _VF  # exact unless it overflows to +-inf (err inf: never chosen)
        err = np.abs(g - x[..., None])
    return np.argmin(err, axis=-1).astype(np.uint8)  # the first minimum: strict < in C


def _thresholds(d: ArrayLike) -> NDArray[np.float64]:
    """float64 (..., 7): the magnitudes where the code steps up (exclusive), inf where the upper grid value overflows."""
    d64 = np.asarray(d, np.float64)[..., None]
    upper = (_MAG[1:] * d64).astype(np.float32)  # V * d in float32: inf beyond FLT_MAX
    t = np.where(np.isinf(upper), np.inf, _MID * d64)
    return np.where(d64 == 0, np.inf, t)  # d = 0: every code ties, code 0


def _signed_level(thr: NDArray[np.float64]) -> Callable[[NDArray[np.float64]], NDArray[np.float64]]:
    """A monotone function of v (float64): sign(v) * (number of thresholds below |v|)."""

    def code(v: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.sign(v) * (np.abs(v)[..., None] > thr[..., None, :]).sum(axis=-1)

    return code


def _pack16(c: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """NVFP4 codes (n, 4, 16) -> (n, 32): byte 8s + j = c[s, j] | c[s, j + 8] << 4."""
    return (c[..., :8] | (c[..., 8:] << 4)).astype(np.uint8).reshape(c.shape[0], 32)


def _unpack16(b: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """NVFP4 code bytes (..., 32k) -> codes (..., 64k) in value order."""
    lead, n = b.shape[:-1], b.shape[-1]
    g = b.reshape(lead + (n // 8, 8))
    return np.concatenate((g & 0x0F, g >> 4), axis=-1).reshape(lead + (2 * n,))


# ---------------------------------------------------------------------------
# formats
# ---------------------------------------------------------------------------


class _FP4Checks(CheckTraits):
    """The :class:`CheckTraits` of MXFP4 and NVFP4."""

    tie_rule = "toward"  # best_index keeps the first (smaller) level on a tie


class _FP4Quantizer(QuantizerTraits):
    """The :class:`QuantizerTraits` of MXFP4 and NVFP4."""

    format: _FP4

    def value_table(self, trace: Trace) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The doubled E2M1 values and what they meet: x / d with the block's (sub-blocks') halved scale.

        A flushed (zero-scale) block or sub-block meets no table.
        """
        d = np.asarray(trace[self.format._scale], np.float64)
        x = np.asarray(trace["x"], np.float64).reshape(d.shape + (-1,))
        keep = np.broadcast_to(d[..., None] > 0, x.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            v = x / d[..., None]
        return np.asarray(self.format.tables()["values"], np.float64), v[keep]


class _FP4(Format):
    """Shared body of MXFP4 and NVFP4: E2M1 codes (``E2M1_VALUES``) times a block or sub-block scale."""

    kernel_module = "tbq.formats.fp4_kernels"
    checker = CapabilitySlot(_FP4Checks)
    quantizer = CapabilitySlot(_FP4Quantizer)
    #: the trace's halved scale the codes are chosen against: the block's ``d`` or the sub-blocks' ``dd``
    _scale: ClassVar[str] = "d"

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        getattr(self.kernels(), f"decode_{self.name}")(data, out)  # decode_mxfp4 / decode_nvfp4


class MXFP4Checks(_FP4Checks):
    """MXFP4's :class:`CheckTraits`."""

    format: MXFP4

    vec_dot_type = "q8_0"  # ggml_vec_dot_mxfp4_q8_0

    def dot_parts(self, data: NDArray[np.uint8]) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        # ggml sums kvalues_mxfp4[c] * q8 as integers and scales by half(e) * d: the codes are the doubled values
        return E2M1_VALUES[np_unpack4_halves(data[:, 1:])].astype(np.int64), e8m0_half(data[:, 0]).astype(np.float64)

    def undefined_blocks(self, trace: Trace) -> tuple[NDArray[np.bool_], str]:
        # (uint8_t)(E - 2 + 127) of a negative int: the exponent byte of a block below E8M0's range
        amax = np.asarray(trace["amax"], np.float32).reshape(-1)
        l2 = np.asarray(trace["log2amax"], np.float32).reshape(-1)
        with np.errstate(invalid="ignore"):
            below = (amax > 0) & (np.floor(l2) <= -126)
        return below, (
            "amax below 2**-125 (floor(log2 amax) <= -126): the C code converts a negative float exponent to uint8_t, "
            "which is undefined"
        )


class MXFP4(_FP4):
    """MXFP4: E8M0 shared exponent + 32 E2M1 codes (split halves), 17 bytes."""

    info = FormatInfo(
        name="mxfp4",
        block_size=32,
        index_bits=4,
        description="MXFP4 (ggml): E8M0 exponent + 32 E2M1 codes (split halves)",
        code=11,
        layout=(
            Field("e", 0, 1, "uint8", "E8M0 exponent: the codes' scale is half(e) = 2**(e - 128)"),
            Field("qs", 1, 16, "u4_halves", "E2M1 codes (bit 3 = sign), byte j = c[j] | c[j+16] << 4"),
        ),
    )
    checker = CapabilitySlot(MXFP4Checks)
    attention = CapabilitySlot(AttentionTraits, read="attention_read_mxfp4")
    # amax where floor(log2f) rounds up to the next exponent; E2M1 midpoints
    fuzz = CapabilitySlot(FuzzTraits, hazards={"binade_tops": {}})

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        n = x.shape[0]
        amax = np.abs(x).max(axis=1)
        with np.errstate(divide="ignore"):
            # glibc's correctly rounded log2f, stated as the spec does (see e8m0_exponent); -inf for 0
            l2 = np.log2(amax.astype(np.float64)).astype(np.float32)
        pos = amax > _0
        E = np.where(pos, np.floor(l2), _0).astype(np.int64)
        e = np.where(pos, (E + 125) & 255, 0).astype(np.uint8)  # C: (uint8_t)(E - 2 + 127); x86-64 gcc wraps below 0
        d = e8m0_half(e)
        c = fp4_codes(x, d)
        out = np.empty((n, 17), np.uint8)
        out[:, 0] = e
        out[:, 1:] = np_pack4_halves(c)
        return out, {"amax": amax, "log2amax": l2, "e": e.astype(np.float32), "d": d, "x": x.copy()}

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        d = e8m0_half(data[:, 0])
        return _VF[np_unpack4_halves(data[:, 1:])] * d[:, None]

    def tables(self) -> dict[str, NDArray[Any]]:
        """``values`` (int8, kvalues_mxfp4: E2M1 doubled) and ``e8m0_boundaries`` (uint32)."""
        return {"values": E2M1_VALUES.copy(), "e8m0_boundaries": e8m0_boundaries().copy()}

    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        return self.kernels().encode_mxfp4(x, out, raise_overflow, e8m0_boundaries())

    # -- refusals ---------------------------------------------------------------------
    def scale_overflows(self, trace: Trace) -> NDArray[np.bool_]:
        return np.zeros(np.shape(trace["amax"]), bool)  # an E8M0 exponent never overflows (amax <= FLT_MAX: e <= 253)

    def invalid_blocks(self, trace: Trace) -> NDArray[np.int8]:
        amax = np.asarray(trace["amax"])
        with np.errstate(invalid="ignore"):
            und = (amax > 0) & (np.floor(np.asarray(trace["log2amax"])) <= -126)
        return np.where(und, STATUS_UNDEFINED, 0).astype(np.int8)

    def encode_error(self, status: int, block: int, values: NDArray[np.float32]) -> Exception:
        tr = block_trace(self, values)
        amax = float(tr["amax"][0])
        E = int(np.floor(tr["log2amax"][0]))
        return ScaleOverflowError(
            f"{self.name}: block {block} has amax {amax!r}, so E = floor(log2(amax)) = {E} <= -126 and the C "
            f"reference's E8M0 exponent underflows: E + 125 = {E + 125} is converted to uint8_t, which is "
            f"undefined behaviour (MXFP4 stores block maxima from 2**-125 on; 0 is fine). Pass on_overflow='inf' "
            f"to store what x86-64 gcc stores (e = {int(tr['e'][0])}, the exponent wrapped mod 256; codes 0)",
            block=block,
            scale=float(2.0 ** (E - 3)),
        )

    # -- fragility --------------------------------------------------------------------
    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # The code is read from x itself against the exact grid V * d (d is a power of two):
        # it steps at |x| = m * d, m in 0.5, 1.5, 2.5, 3.5, 5, 7, 10 (an exact midpoint counts:
        # the tie rule). Steps whose upper grid value overflows float32 (e = 253) never happen.
        thr = _thresholds(trace["d"])
        return band(_signed_level(thr), trace["x"], k)

    def fragile_scales(self, trace: Trace, k: int) -> NDArray[np.bool_]:
        # e follows from floor(log2f(amax)); amax is exact (a max), so only log2f's rounding
        # matters: a block is fragile when a k-ulp change of float32 log2f(amax) changes its
        # floor. Exact powers of two are not: their log2 is an exactly representable integer,
        # which every faithful log2f returns.
        amax = np.asarray(trace["amax"], np.float32)
        l2 = np.asarray(trace["log2amax"], np.float32)
        with np.errstate(all="ignore"):
            near = band(np.floor, l2, k)
        pow2 = np.frexp(amax)[0] == 0.5
        return near & (amax > 0) & ~pow2


class NVFP4(_FP4):
    """NVFP4: four UE4M3 sub-block scales + 64 E2M1 codes, 36 bytes (no per-tensor scale)."""

    info = FormatInfo(
        name="nvfp4",
        block_size=64,
        index_bits=4,
        description="NVFP4 (ggml): 4 UE4M3 scales (one per 16 values) + 64 E2M1 codes",
        code=12,
        layout=(
            Field(
                "d",
                0,
                4,
                "uint8",
                "UE4M3 scale bytes of the 16-value sub-blocks (the codes' scale is half their value)",
            ),
            Field("qs", 4, 32, "u4_halves16", "E2M1 codes, byte 8s+j = c[16s+j] | c[16s+8+j] << 4"),
        ),
    )
    # ggml's CPU backend converts the other operand to q8_0 (ggml_vec_dot_nvfp4_q8_0: each 16-value sub-block's
    # integer sum against half a q8_0 block, times its scale and q8_0's). Its scale is per sub-block, not per
    # block, so the dot-product check takes the decoded values (exact: code times scale) value by value.
    checker = CapabilitySlot(_FP4Checks, vec_dot_type="q8_0")
    attention = CapabilitySlot(AttentionTraits, read="attention_read_nvfp4")
    # sub-block scales on UE4M3 rounding boundaries; E2M1 midpoints
    fuzz = CapabilitySlot(FuzzTraits, hazards={"ue4m3": {"sub_block": 16}})
    _scale = "dd"

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        n = x.shape[0]
        xs = x.reshape(n, 4, 16)
        amax = np.abs(xs).max(axis=2)
        s = amax / _6
        u = ue4m3_from_f32(s)
        dd = ue4m3_to_f32(u)
        c = fp4_codes(xs, dd)
        out = np.empty((n, 36), np.uint8)
        out[:, :4] = u
        out[:, 4:] = _pack16(c)
        return out, {"amax": amax, "s": s, "dd": dd, "x": x.copy()}

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        n = data.shape[0]
        dd = ue4m3_to_f32(data[:, :4])
        c = _unpack16(data[:, 4:]).reshape(n, 4, 16)
        return (_VF[c] * dd[:, :, None]).reshape(n, 64)

    def tables(self) -> dict[str, NDArray[Any]]:
        """``values`` (int8, kvalues_mxfp4) and ``ue4m3`` (float32 (256,), :func:`ue4m3_to_f32` of every byte)."""
        return {"values": E2M1_VALUES.copy(), "ue4m3": ue4m3_to_f32(np.arange(256, dtype=np.uint8))}

    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        return self.kernels().encode_nvfp4(x, out)

    def fields(self, data: ArrayLike) -> dict[str, NDArray[Any]]:
        """``d``: the UE4M3 bytes (..., n_blocks, 4); ``qs``: the codes (..., n_blocks, 64) in value order."""
        blocks = self._blocks(data)
        return {"d": np.ascontiguousarray(blocks[..., 0:4]), "qs": _unpack16(np.ascontiguousarray(blocks[..., 4:]))}

    def scale_overflows(self, trace: Trace) -> NDArray[np.bool_]:
        return np.zeros(np.shape(trace["s"])[:-1], bool)  # UE4M3 saturates at 0x7E (448): nothing to refuse

    def invalid_blocks(self, trace: Trace) -> NDArray[np.int8]:
        return np.zeros(np.shape(trace["s"])[:-1], np.int8)

    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # As MXFP4 per 16-value sub-block with the grid V * dd (dd = 0: every code ties, code 0).
        x = np.asarray(trace["x"])
        xs = x.reshape(x.shape[:-1] + (4, 16))
        thr = _thresholds(trace["dd"])  # (..., 4, 7)
        return band(_signed_level(thr), xs, k).reshape(x.shape)

    def fragile_scales(self, trace: Trace, k: int) -> NDArray[np.bool_]:
        # A block is fragile when a k-ulp change of any sub-block's s = amax / 6 changes its UE4M3 byte.
        s = np.asarray(trace["s"], np.float32)
        with np.errstate(all="ignore"):
            # (np.asarray: numpy's stubs type ndarray.any(axis=...) as "np.bool or an array"; here always an array)
            return np.asarray(band(lambda v: ue4m3_from_f32(v.astype(np.float32)), s, k).any(axis=-1))
