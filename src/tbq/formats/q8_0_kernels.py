"""numba twins of :mod:`tbq.formats.q8_0` (same bytes, same float32 bits).

Loop bounds come from array shapes (run-time values) rather than the literal
32: with a compile-time trip count LLVM fully unrolls the loops and then does
not vectorise them; with a run-time count the loop vectoriser does (about
2.5x faster here).
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
    roundf,
    store_f16,
)

F32 = np.float32
_0 = F32(0.0)
_1 = F32(1.0)
_127 = F32(127.0)


@jit
def encode(x, out, raise_overflow):
    bs = x.shape[1]
    for b in range(x.shape[0]):
        abits, first = abs_bits_max(x, b, bs)
        if abits >= np.uint32(0x7F800000):  # Inf or NaN
            return b, STATUS_NONFINITE
        amax = abs(x[b, first])
        d = amax / _127
        inv = _1 / d if d != _0 else _0
        h = f32_to_f16_bits(d)
        if raise_overflow and f16_is_inf(h):
            return b, STATUS_SCALE_OVERFLOW
        store_f16(out, b, h)
        xr = x[b]
        orow = out[b]
        for j in range(bs):
            # +-Inf/NaN (1/d overflowed) give code 0, as x86 C does
            orow[2 + j] = np.uint8(f32_to_int32(roundf(xr[j] * inv)) & np.int32(0xFF))  # int8 two's complement
    return -1, STATUS_OK


@jit
def decode(data, out, table):
    bs = out.shape[1]
    for b in range(data.shape[0]):
        d = load_f16(data, b, table)
        src = data[b]
        dst = out[b]
        for j in range(bs):
            dst[j] = F32(np.int8(src[2 + j])) * d
    return out
