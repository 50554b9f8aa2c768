"""numba twins of :mod:`tbq.formats.q4_0` (same bytes, same float32 bits)."""

from __future__ import annotations

import numpy as np

from ..intrinsics import store_fence, store_nontemporal
from ..kernels import (
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SCALE_OVERFLOW,
    f16_is_inf,
    f32_bits,
    f32_to_f16_bits_finite,
    f32_to_int32,
    jit,
    load_f16,
    reader_aux,
    reader_blocks,
    reader_out,
    store_f16,
)
from ..packing_kernels import hi4, lo4, pair4

F32 = np.float32
_0 = F32(0.0)
_1 = F32(1.0)
_M8 = F32(-8.0)
_8_5 = F32(8.5)


#: Blocks whose scalar work (largest magnitude, scale, reciprocal, fp16) is done side by side.
GROUP = 16


@jit
def encode(x, out, raise_overflow):
    """Q4_0 encoder, ``GROUP`` blocks at a time: one pass finds every block's signed maximum, one SIMD
    pass computes the group's scales, reciprocals and fp16 bits, then each block is coded and packed."""
    nblk = x.shape[0]
    bs = x.shape[1]
    half = bs // 2
    AB = np.empty(GROUP, np.uint32)
    M = np.empty(GROUP, np.float32)
    INV = np.empty(GROUP, np.float32)
    H = np.empty(GROUP, np.uint16)
    for g0 in range(0, nblk, GROUP):
        L = min(GROUP, nblk - g0)
        for l in range(L):
            xr = x[g0 + l]
            key = np.uint64(0)
            for j in range(bs):  # the largest |x| bits and its first index: one max of (bits << 8 | 255 - j)
                a = np.uint64(f32_bits(xr[j]) & np.uint32(0x7FFFFFFF))
                k = (a << np.uint64(8)) | np.uint64(255 - j)
                key = k if k > key else key
            ab = np.uint32(key >> np.uint64(8))
            AB[l] = ab
            # signed, first of equal magnitudes; +0 for a zero block (ggml)
            M[l] = xr[255 - np.int64(key & np.uint64(255))] if ab != np.uint32(0) else _0
        for l in range(L):
            d = M[l] / _M8
            INV[l] = _1 / d if d != _0 else _0
            H[l] = f32_to_f16_bits_finite(d)  # a NaN block's d is never stored (refused below)
        for l in range(L):
            b = g0 + l
            if AB[l] >= np.uint32(0x7F800000):  # Inf or NaN
                return b, STATUS_NONFINITE
            h = H[l]
            if raise_overflow and f16_is_inf(h):
                return b, STATUS_SCALE_OVERFLOW
            store_f16(out, b, h)
            xr = x[b]
            orow = out[b]
            inv = INV[l]
            for j in range(half):
                p0 = xr[j] * inv
                p1 = xr[j + half] * inv
                q0 = f32_to_int32(p0 + _8_5)  # rounded separately: no contraction without fastmath
                q1 = f32_to_int32(p1 + _8_5)  # +-Inf/NaN (1/d overflowed): 0, as x86 C
                orow[2 + j] = pair4(q0 if q0 < 15 else 15, q1 if q1 < 15 else 15)
    return -1, STATUS_OK


#: Outputs of at least this many bytes are written with streaming stores (larger than a core's L2).
STREAM_BYTES = 1 << 21


@jit
def decode(data, out, table):
    """Q4_0 decoder. A large output (``STREAM_BYTES`` or more) is built block by block in a scratch row
    and written with streaming stores, two values at a time (no read-for-ownership of the output's
    cache lines: about 1.6x at 16M values; the same bits either way)."""
    half = out.shape[1] // 2
    if out.size * 4 >= STREAM_BYTES:
        of = out.view(np.uint64).reshape(out.size // 2)
        tmp = np.empty(2 * half, np.float32)
        t64 = tmp.view(np.uint64)
        for b in range(data.shape[0]):
            d = load_f16(data, b, table)
            src = data[b]
            for j in range(half):
                v = src[2 + j]
                tmp[j] = F32(lo4(v) - 8) * d
                tmp[j + half] = F32(hi4(v) - 8) * d
            base = b * half
            for k in range(half):
                store_nontemporal(of, base + k, t64[k])
        store_fence()
        return out
    for b in range(data.shape[0]):
        d = load_f16(data, b, table)
        src = data[b]
        dst = out[b]
        for j in range(half):
            v = src[2 + j]
            dst[j] = F32(lo4(v) - 8) * d
            dst[j + half] = F32(hi4(v) - 8) * d
    return out


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` blocks decoded by
    :func:`decode` (the same bits), ``aux`` the fp16 table."""
    decode(reader_blocks(src, n_blocks, 18), reader_out(dst, n_blocks, 32), reader_aux(aux, n_aux))
