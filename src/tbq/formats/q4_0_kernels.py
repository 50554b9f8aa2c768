"""numba twins of :mod:`tbq.formats.q4_0` (same bytes, same float32 bits)."""

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
    store_f16,
)
from ..packing_kernels import hi4, lo4, pair4

F32 = np.float32
_0 = F32(0.0)
_1 = F32(1.0)
_M8 = F32(-8.0)
_8_5 = F32(8.5)


@jit
def encode(x, out, raise_overflow):
    bs = x.shape[1]
    half = bs // 2
    q = np.empty(bs, np.int32)
    for b in range(x.shape[0]):
        abits, first = abs_bits_max(x, b, bs)
        if abits >= np.uint32(0x7F800000):  # Inf or NaN
            return b, STATUS_NONFINITE
        m = x[b, first] if abits != np.uint32(0) else _0  # signed, first of equal magnitudes; +0 for a zero block (ggml)
        d = m / _M8
        inv = _1 / d if d != _0 else _0
        h = f32_to_f16_bits(d)
        if raise_overflow and f16_is_inf(h):
            return b, STATUS_SCALE_OVERFLOW
        store_f16(out, b, h)
        xr = x[b]
        for j in range(bs):
            p = xr[j] * inv
            t = p + _8_5  # rounded separately: no contraction without fastmath
            qi = f32_to_int32(t)  # +-Inf/NaN (1/d overflowed): 0, as x86 C
            q[j] = qi if qi < 15 else 15
        orow = out[b]
        for j in range(half):
            orow[2 + j] = pair4(q[j], q[j + half])
    return -1, STATUS_OK


@jit
def decode(data, out, table):
    half = out.shape[1] // 2
    for b in range(data.shape[0]):
        d = load_f16(data, b, table)
        src = data[b]
        dst = out[b]
        for j in range(half):
            v = src[2 + j]
            dst[j] = F32(lo4(v) - 8) * d
            dst[j + half] = F32(hi4(v) - 8) * d
    return out
