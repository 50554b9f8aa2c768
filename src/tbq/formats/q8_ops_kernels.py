"""numba twins of :mod:`tbq.formats.q8_ops` (same bytes, same float32 bits): Q8_1 and Q8_K.

Scalar loops, one block at a time: these are activation formats, quantized for a dot product,
not bulk cache data. Q8_1 decodes with Q8_0's decoder (its codes start at byte 4).
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
    f16_is_inf,
    f32_bits,
    f32_to_f16_bits_finite,
    f32_to_int32,
    jit,
    roundf,
    store_f16,
)
from .q4_1_kernels import store_f16_at
from .q8_0_kernels import abs_max
from .q8_0_kernels import decode as q8_0_decode

_127 = F32(127.0)
_M127 = F32(-127.0)
_MAGIC = F32(12582912.0)  # 1.5 * 2**23: ggml's nearest_int
_FINITE = np.uint32(0x7F800000)


@jit
def _int8(c):
    """The int8 value of the low byte of an integer (C's conversion to int8_t on gcc)."""
    return ((c & 0xFF) ^ 0x80) - 0x80


@jit
def encode_q8_1(x, out, raise_overflow):
    """Q8_1 encoder: Q8_0's ``d`` and codes, then ``s = fp16(float32(sum) * d)``; a block is written whole
    once both fp16 fields are known to fit (``raise_overflow``)."""
    nblk = x.shape[0]
    bs = x.shape[1]
    q = np.empty(bs, np.uint8)
    for b in range(nblk):
        amax, m = abs_max(x[b])
        if amax >= _FINITE:  # Inf or NaN
            return b, STATUS_NONFINITE
        d = m / _127
        inv = F32_1 / d if d != F32_0 else F32_0
        h = f32_to_f16_bits_finite(d)
        if raise_overflow and f16_is_inf(h):
            return b, STATUS_SCALE_OVERFLOW
        xr = x[b]
        total = 0
        for j in range(bs):
            c = f32_to_int32(roundf(xr[j] * inv))  # +-Inf/NaN (1/d overflowed) give code 0, as x86 C does
            q[j] = np.uint8(c & 0xFF)
            total += _int8(c)  # C sums the stored int8 codes
        hs = f32_to_f16_bits_finite(F32(total) * d)  # the int converted to float (exact), one product
        if raise_overflow and f16_is_inf(hs):
            return b, STATUS_SCALE_OVERFLOW
        orow = out[b]
        store_f16(out, b, h)
        store_f16_at(out, b, 2, hs)
        for j in range(bs):
            orow[4 + j] = q[j]
    return -1, STATUS_OK


@jit
def decode_q8_1(data, out, table):
    """Q8_1 decoder: Q8_0's, on the codes at byte 4."""
    return q8_0_decode(data, out, table, 4)


@jit
def encode_q8_k(x, out, raise_overflow):
    """Q8_K encoder (nothing to refuse but non-finite input: the float32 ``d`` of a finite block is finite)."""
    nblk = x.shape[0]
    bs = x.shape[1]
    for b in range(nblk):
        amax, first = abs_bits_max(x, b, bs)
        if amax >= _FINITE:
            return b, STATUS_NONFINITE
        orow = out[b]
        if amax == 0:  # C: d = 0, codes 0, bsums left unwritten (tbq: 0)
            for k in range(orow.shape[0]):
                orow[k] = 0
            continue
        xr = x[b]
        iscale = _M127 / xr[first]  # the first largest |x|, with its sign
        for j in range(bs):
            t = iscale * xr[j] + _MAGIC  # two roundings (numba never contracts without fastmath)
            c = np.int32(f32_bits(t) & np.uint32(0x7FFFFF)) - np.int32(0x400000)  # rint, or -2**22 / 0 for Inf / NaN
            c = c if c < 127 else np.int32(127)
            orow[4 + j] = np.uint8(c & 0xFF)
        for g in range(bs // 16):
            s = 0
            for i in range(16):
                s += _int8(np.int32(orow[4 + 16 * g + i]))
            u = s & 0xFFFF  # int16, little-endian
            orow[4 + bs + 2 * g] = np.uint8(u & 0xFF)
            orow[5 + bs + 2 * g] = np.uint8(u >> 8)
        db = f32_bits(F32_1 / iscale)
        for k in range(4):
            orow[k] = np.uint8((db >> np.uint32(8 * k)) & np.uint32(0xFF))
    return -1, STATUS_OK


@jit
def decode_q8_k(data, out):
    """Q8_K decoder: ``y = d * q``, the float32 ``d`` at bytes 0-3."""
    bs = out.shape[1]
    for b in range(data.shape[0]):
        src = data[b]
        bits = np.uint32(src[0]) | (np.uint32(src[1]) << 8) | (np.uint32(src[2]) << 16) | (np.uint32(src[3]) << 24)
        d = np.uint32(bits).view(np.float32)
        dst = out[b]
        for j in range(bs):
            dst[j] = d * F32(np.int8(src[4 + j]))
    return out
