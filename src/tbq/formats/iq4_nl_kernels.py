"""numba twins of :mod:`tbq.formats.iq4_nl` (same bytes, same float32 bits).

``best(a)`` is computed as the number of midpoints ``<= a`` (15 branch-free
compares that vectorise) instead of the C binary search with its float32
``lo < hi`` test; :func:`tbq.formats.iq4_nl.iq4_nl_best` explains why the two
agree for every float32 and the tests compare them around every midpoint.
The spec's sums stay sequential in ``j`` (one chain each for ``sumqx`` and
``sumq2``), so the scale has exactly the C rounding.
"""

from __future__ import annotations

import numpy as np

from ..kernels import (
    F32,
    F32_0,
    F32_1,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SCALE_OVERFLOW,
    abs_bits_max,
    f32_to_f16_bits,
    jit,
    jit_inline,
    store_f16,
)
from ..packing_kernels import pair4
from ._shared_kernels import (
    decode_blocks,
    dequantize_halves,
    reader_views,
)

_M127 = F32(-127.0)
#: 1e-15f as a bit pattern: for non-negative floats ``a < 1e-15f`` iff ``bits(a) < _TINY_BITS``.
_TINY_BITS = np.uint32(np.float32(1e-15).view(np.uint32))
_NONFINITE_BITS = np.uint32(0x7F800000)
_F16_EXP = np.uint16(0x7C00)
_NO_QH = np.uint32(0)

#: kvalues_iq4nl as float32 (a global array: numba freezes it into the compiled code).
_KF = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
# The 15 midpoints (K[i] + K[i+1]) / 2, exact in float32.
_M0 = F32(-115.5)
_M1 = F32(-93.5)
_M2 = F32(-74.0)
_M3 = F32(-57.0)
_M4 = F32(-42.0)
_M5 = F32(-28.5)
_M6 = F32(-16.0)
_M7 = F32(-4.5)
_M8 = F32(7.0)
_M9 = F32(19.0)
_M10 = F32(31.5)
_M11 = F32(45.5)
_M12 = F32(61.0)
_M13 = F32(79.0)
_M14 = F32(101.0)


@jit
def _ge(a, m):
    return np.int32(1) if a >= m else np.int32(0)


@jit
def best(a):
    """``best_index_int8(16, K, a)``: the number of midpoints ``<= a`` (an exact tie goes up, as in C)."""
    return (
        _ge(a, _M0)
        + _ge(a, _M1)
        + _ge(a, _M2)
        + _ge(a, _M3)
        + _ge(a, _M4)
        + _ge(a, _M5)
        + _ge(a, _M6)
        + _ge(a, _M7)
        + _ge(a, _M8)
        + _ge(a, _M9)
        + _ge(a, _M10)
        + _ge(a, _M11)
        + _ge(a, _M12)
        + _ge(a, _M13)
        + _ge(a, _M14)
    )


@jit
def encode(x, out, raise_overflow, row_blocks):
    n, bs = x.shape
    half = bs // 2
    R = row_blocks
    L = np.empty(bs, np.int32)  # C's L[32]: the indices of the row's most recent computed block
    li = np.empty(bs, np.int32)
    qv = np.empty(bs, np.float32)
    amaxs = np.empty(R, np.uint32)
    firsts = np.empty(R, np.int64)
    for r in range(n // R):
        b0 = r * R
        for i in range(R):
            abits, first = abs_bits_max(x, b0 + i, bs)
            amaxs[i] = abits
            firsts[i] = first
        for j in range(bs):
            L[j] = 8  # no computed block yet in this row: C reads uninitialised memory; the vectors define 8
        for i in range(R):
            b = b0 + i
            orow = out[b]
            if amaxs[i] >= _NONFINITE_BITS:  # blocks are refused in order: earlier blocks' refusals come first
                return b, STATUS_NONFINITE
            if amaxs[i] < _TINY_BITS:  # tiny block: d = +0, the row's current indices
                orow[0] = np.uint8(0)
                orow[1] = np.uint8(0)
                for j in range(half):
                    orow[2 + j] = pair4(L[j], L[j + half])
                continue
            xr = x[b]
            d0 = xr[firsts[i]] / _M127  # signed max, the first of equal magnitudes
            inv = F32_1 / d0
            for j in range(bs):  # branch-free: vectorises
                l = best(inv * xr[j])
                li[j] = l
                qv[j] = _KF[l]
            sumqx = F32_0
            sumq2 = F32_0
            for j in range(bs):  # sequential from +0, each product and sum rounded on its own (no fastmath: no FMA)
                xj = xr[j]
                t = (xj * xj) * qv[j]
                sumqx = sumqx + t * xj
                sumq2 = sumq2 + t * qv[j]
            d = sumqx / sumq2 if sumq2 > F32_0 else F32_0
            h = f32_to_f16_bits(d)
            if raise_overflow and (h & _F16_EXP) == _F16_EXP:  # +-Inf or NaN (x*x overflowed)
                return b, STATUS_SCALE_OVERFLOW
            store_f16(out, b, h)
            for j in range(bs):
                L[j] = li[j]
            for j in range(half):
                orow[2 + j] = pair4(li[j], li[j + half])
    return -1, STATUS_OK


@jit_inline
def _value(c, d, m):
    return d * _KF[c]


@jit_inline
def _dequantize(data, b, dst, d, table, off):
    dequantize_halves(data[b], dst, off, _NO_QH, _value, d, F32_0)


@jit
def decode(data, out, table):
    """IQ4_NL decoder: ``d * kvalues_iq4nl[code]``."""
    return decode_blocks(data, out, table, 2, _dequantize, False)


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` blocks decoded by
    :func:`decode` (the same bits), ``aux`` the fp16 table."""
    decode(*reader_views(src, dst, n_blocks, aux, n_aux, 18))
