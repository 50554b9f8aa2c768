"""numba twins of :mod:`tbq.formats.q5` (same bytes, same float32 bits).

Q5_0 is encoded by :func:`tbq.formats._shared_kernels.encode_groups` with Q4_0's scale rule
(:func:`tbq.formats.q4_0_kernels.signed_max`, the divisor -16), Q5_1 through Q4_1's min/scale header
(:func:`tbq.formats.q4_1_kernels.store_min_scale`); both write their codes through :func:`store_codes`, and
decode through :func:`tbq.formats._shared_kernels.decode_blocks`.

Lane helper defined here (not in :mod:`tbq.packing_kernels`): :func:`qh_bit`,
bit 4 of a code placed at bit ``i`` of the ``qh`` plane; its inverse is
:func:`tbq.formats._shared_kernels.hi_bit`, which the shared decode loop reads.
"""

from __future__ import annotations

import numpy as np

from ..kernels import F32, F32_0, F32_HALF, STATUS_OK, f32_to_int32, jit, jit_inline
from ..packing_kernels import pair4
from ._shared_kernels import (
    decode_blocks,
    dequantize_halves,
    encode_groups,
    reader_views,
)
from .q4_0_kernels import signed_max
from .q4_1_kernels import dequantize_min, store_min_scale

_M16 = F32(-16.0)
_16_5 = F32(16.5)
_31 = F32(31.0)


@jit
def qh_bit(code, i):
    """Bit 4 of ``code`` moved to bit ``i`` (uint32), one term of ``qh``."""
    return ((np.uint32(code) >> np.uint32(4)) & np.uint32(1)) << np.uint32(i)


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
def _code_q5_0(x, mn, inv):
    """``min(31, trunc(x * id + 16.5))``: product and sum rounded separately (no fastmath: no contraction). Q5_0
    has no minimum: ``mn`` is not read (the signature is :func:`_code_q5_1`'s)."""
    t = x * inv + _16_5
    qi = f32_to_int32(t)  # +-Inf/NaN (1/d overflowed): 0, as x86 C
    return qi if qi < 31 else 31


@jit
def _code_q5_1(x, mn, inv):
    """C's ``(uint8_t)((x - min) * id + 0.5f)``: three roundings, none fused; no clamp (t < 32)."""
    t = (x - mn) * inv + F32_HALF
    return f32_to_int32(t) & 0xFF  # +-Inf/NaN (1/d overflowed): 0, the low byte of x86's 0x80000000


@jit_inline
def store_codes(xr, out, b, qs, qh_off, code, mn, inv):
    """The 5-bit codes ``code(x, mn, inv)`` of block ``xr`` into row ``b`` of ``out``: the low nibbles paired from
    byte ``qs`` (value ``j`` with value ``j + half``), bit 4 of each in the little-endian uint32 ``qh`` at byte
    ``qh_off``."""
    half = xr.shape[0] // 2
    orow = out[b]
    qh = np.uint32(0)
    for j in range(half):  # both halves per pass; qh is an OR of disjoint bits (order irrelevant, vectorises)
        c0 = code(xr[j], mn, inv)
        c1 = code(xr[j + half], mn, inv)
        orow[qs + j] = pair4(c0 & 15, c1 & 15)
        qh |= qh_bit(c0, j) | qh_bit(c1, j + half)
    store_u32_at(out, b, qh_off, np.uint32(qh))


@jit_inline
def _codes_q5_0(xr, out, b, inv):
    store_codes(xr, out, b, 6, _QH_Q5_0, _code_q5_0, F32_0, inv)


@jit
def encode_q5_0(x, out, raise_overflow):
    """Q5_0 encoder: ``d = m / -16`` with ``m`` the signed maximum, codes ``min(31, trunc(x / d + 16.5))``."""
    return encode_groups(x, out, raise_overflow, _M16, signed_max, _codes_q5_0)


@jit
def encode_q5_1(x, out, raise_overflow):
    """Q5_1 encoder: Q4_1's min/scale header with 31 levels, codes ``(x - min) / d + 0.5``."""
    bs = x.shape[1]
    for b in range(x.shape[0]):
        xr = x[b]
        status, mn, inv = store_min_scale(xr, bs, _31, out, b, raise_overflow)
        if status != STATUS_OK:
            return b, status
        store_codes(xr, out, b, 8, _QH_Q5_1, _code_q5_1, mn, inv)
    return -1, STATUS_OK


@jit_inline
def _value_q5_0(c, d, m):
    return F32(c - 16) * d


@jit_inline
def _dequantize_q5_0(data, b, dst, d, table, off):
    dequantize_halves(data[b], dst, off, load_u32_at(data, b, _QH_Q5_0), _value_q5_0, d, F32_0)


@jit
def decode_q5_0(data, out, table):
    """Q5_0 decoder: ``(code - 16) * d``."""
    return decode_blocks(data, out, table, 6, _dequantize_q5_0, False)


@jit_inline
def _dequantize_q5_1(data, b, dst, d, table, off):
    dequantize_min(data, b, dst, d, table, off, load_u32_at(data, b, _QH_Q5_1))


@jit
def decode_q5_1(data, out, table):
    """Q5_1 decoder: ``code * d + min``."""
    return decode_blocks(data, out, table, 8, _dequantize_q5_1, False)


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` blocks decoded by
    :func:`decode_q5_0` (the same bits), ``aux`` the fp16 table."""
    decode_q5_0(*reader_views(src, dst, n_blocks, aux, n_aux, 22))


def attention_read_q5_1(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` blocks decoded by
    :func:`decode_q5_1` (the same bits), ``aux`` the fp16 table."""
    decode_q5_1(*reader_views(src, dst, n_blocks, aux, n_aux, 24))
