"""numba twins of :mod:`tbq.formats.q5` (same bytes, same float32 bits).

Lane helper defined here (not in :mod:`tbq.packing_kernels`): :func:`qh_bit`,
bit 4 of a code placed at bit ``i`` of the ``qh`` plane, and its inverse
:func:`hi_bit`.
"""

from __future__ import annotations

import numpy as np

from ..kernels import (
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SCALE_OVERFLOW,
    abs_bits_max,
    f16_is_inf,
    f32_to_f16_bits,
    f32_to_int32,
    jit,
    load_f16,
    reader_aux,
    reader_blocks,
    reader_out,
    store_f16,
)
from ..packing_kernels import hi4, lo4, pair4
from .q4_1_kernels import add_min_nonfinite, load_f16_at, store_min_scale

F32 = np.float32
_0 = F32(0.0)
_1 = F32(1.0)
_HALF = F32(0.5)
_M16 = F32(-16.0)
_16_5 = F32(16.5)
_31 = F32(31.0)
_F16_MAX = F32(65504.0)


@jit
def qh_bit(code, i):
    """Bit 4 of ``code`` moved to bit ``i`` (uint32), one term of ``qh``."""
    return ((np.uint32(code) >> np.uint32(4)) & np.uint32(1)) << np.uint32(i)


@jit
def hi_bit(qh, i):
    """Bit ``i`` of ``qh`` as the code's bit 4 (int32: 0 or 16)."""
    return np.int32((qh >> np.uint32(i)) & np.uint32(1)) << 4


#: Byte offsets of ``qh`` in a Q5_0 / Q5_1 block, as int64 values rather than integer literals (numba compiles a
#: function once per literal argument), and ``qh`` passed as uint32 (type inference also saw it as uint64): one
#: compiled ``store_u32_at`` / ``load_u32_at`` each instead of four and two
_QH_Q5_0, _QH_Q5_1 = np.int64(2), np.int64(4)


@jit
def store_u32_at(out, row, off, v):
    """Write uint32 ``v`` little-endian at bytes ``off .. off+3`` of ``out[row]``."""
    out[row, off] = np.uint8(v & np.uint32(0xFF))
    out[row, off + 1] = np.uint8((v >> np.uint32(8)) & np.uint32(0xFF))
    out[row, off + 2] = np.uint8((v >> np.uint32(16)) & np.uint32(0xFF))
    out[row, off + 3] = np.uint8(v >> np.uint32(24))


@jit
def load_u32_at(data, row, off):
    return (
        np.uint32(data[row, off])
        | (np.uint32(data[row, off + 1]) << np.uint32(8))
        | (np.uint32(data[row, off + 2]) << np.uint32(16))
        | (np.uint32(data[row, off + 3]) << np.uint32(24))
    )


@jit
def _code_q5_0(x, inv):
    """``min(31, trunc(x * id + 16.5))``: product and sum rounded separately (no fastmath: no contraction)."""
    t = x * inv + _16_5
    qi = f32_to_int32(t)  # +-Inf/NaN (1/d overflowed): 0, as x86 C
    return qi if qi < 31 else 31


@jit
def _code_q5_1(x, mn, inv):
    """C's ``(uint8_t)((x - min) * id + 0.5f)``: three roundings, none fused; no clamp (t < 32)."""
    t = (x - mn) * inv + _HALF
    return f32_to_int32(t) & 0xFF  # +-Inf/NaN (1/d overflowed): 0, the low byte of x86's 0x80000000


@jit
def encode_q5_0(x, out, raise_overflow):
    bs = x.shape[1]
    half = bs // 2
    for b in range(x.shape[0]):
        abits, first = abs_bits_max(x, b, bs)
        if abits >= np.uint32(0x7F800000):  # Inf or NaN
            return b, STATUS_NONFINITE
        m = (
            x[b, first] if abits != np.uint32(0) else _0
        )  # signed, first of equal magnitudes; +0 for a zero block (ggml)
        d = m / _M16
        inv = _1 / d if d != _0 else _0
        h = f32_to_f16_bits(d)
        if raise_overflow and f16_is_inf(h):
            return b, STATUS_SCALE_OVERFLOW
        store_f16(out, b, h)
        xr = x[b]
        orow = out[b]
        qh = np.uint32(0)
        for j in range(half):  # both halves per pass; qh is an OR of disjoint bits (order irrelevant, vectorises)
            c0 = _code_q5_0(xr[j], inv)
            c1 = _code_q5_0(xr[j + half], inv)
            orow[6 + j] = pair4(c0 & 15, c1 & 15)
            qh |= qh_bit(c0, j) | qh_bit(c1, j + half)
        store_u32_at(out, b, _QH_Q5_0, np.uint32(qh))
    return -1, STATUS_OK


@jit
def encode_q5_1(x, out, raise_overflow):
    bs = x.shape[1]
    half = bs // 2
    for b in range(x.shape[0]):
        xr = x[b]
        status, mn, inv = store_min_scale(xr, bs, _31, out, b, raise_overflow)
        if status != STATUS_OK:
            return b, status
        orow = out[b]
        qh = np.uint32(0)
        for j in range(half):
            c0 = _code_q5_1(xr[j], mn, inv)
            c1 = _code_q5_1(xr[j + half], mn, inv)
            orow[8 + j] = pair4(c0 & 15, c1 & 15)
            qh |= qh_bit(c0, j) | qh_bit(c1, j + half)
        store_u32_at(out, b, _QH_Q5_1, np.uint32(qh))
    return -1, STATUS_OK


@jit
def decode_q5_0(data, out, table):
    half = out.shape[1] // 2
    for b in range(data.shape[0]):
        d = load_f16(data, b, table)
        qh = load_u32_at(data, b, _QH_Q5_0)
        src = data[b]
        dst = out[b]
        for j in range(half):
            v = src[6 + j]
            dst[j] = F32((lo4(v) | hi_bit(qh, j)) - 16) * d
            dst[j + half] = F32((hi4(v) | hi_bit(qh, j + half)) - 16) * d
    return out


@jit
def decode_q5_1(data, out, table):
    half = out.shape[1] // 2
    for b in range(data.shape[0]):
        d = load_f16(data, b, table)
        m = load_f16_at(data, b, 2, table)
        qh = load_u32_at(data, b, _QH_Q5_1)
        src = data[b]
        dst = out[b]
        if abs(d) <= _F16_MAX:  # every decoded fp16 is finite here: no product is NaN
            for j in range(half):
                v = src[8 + j]
                dst[j] = F32(lo4(v) | hi_bit(qh, j)) * d + m  # exact product, then one rounding (not fused)
                dst[j + half] = F32(hi4(v) | hi_bit(qh, j + half)) * d + m
        else:  # an inf/NaN d (random bytes): NaN payloads fixed, see q4_1_kernels.add_min_nonfinite
            for j in range(half):
                v = src[8 + j]
                dst[j] = add_min_nonfinite(lo4(v) | hi_bit(qh, j), d, m)
                dst[j + half] = add_min_nonfinite(hi4(v) | hi_bit(qh, j + half), d, m)
    return out


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` blocks decoded by
    :func:`decode_q5_0` (the same bits), ``aux`` the fp16 table."""
    decode_q5_0(reader_blocks(src, n_blocks, 22), reader_out(dst, n_blocks, 32), reader_aux(aux, n_aux))


def attention_read_q5_1(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` blocks decoded by
    :func:`decode_q5_1` (the same bits), ``aux`` the fp16 table."""
    decode_q5_1(reader_blocks(src, n_blocks, 24), reader_out(dst, n_blocks, 32), reader_aux(aux, n_aux))
