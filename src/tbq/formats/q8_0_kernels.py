"""numba twins of :mod:`tbq.formats.q8_0` (same bytes, same float32 bits).

Loop bounds come from array shapes (run-time values) rather than the literal
32: with a compile-time trip count LLVM fully unrolls the loops and then does
not vectorise them; with a run-time count the loop vectoriser does (about
2.5x faster here).
"""

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
    roundf,
    store_f16,
)

F32 = np.float32
_0 = F32(0.0)
_1 = F32(1.0)
_127 = F32(127.0)


#: Blocks whose scalar work (largest magnitude, scale, reciprocal, fp16) is done side by side.
GROUP = 16


@jit
def encode(x, out, raise_overflow):
    """Q8_0 encoder, ``GROUP`` blocks at a time: the scales, reciprocals and fp16 bits of a group in
    one SIMD pass, then each block's codes."""
    nblk = x.shape[0]
    bs = x.shape[1]
    AB = np.empty(GROUP, np.uint32)
    INV = np.empty(GROUP, np.float32)
    H = np.empty(GROUP, np.uint16)
    for g0 in range(0, nblk, GROUP):
        L = min(GROUP, nblk - g0)
        for l in range(L):
            xr = x[g0 + l]
            amax = np.uint32(0)
            for j in range(bs):  # |x| as uint32 bits: ordered like |x|, and a vectorisable max
                a = f32_bits(xr[j]) & np.uint32(0x7FFFFFFF)
                amax = a if a > amax else amax
            AB[l] = amax
        for l in range(L):
            d = np.uint32(AB[l]).view(np.float32) / _127
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
            for j in range(bs):
                # +-Inf/NaN (1/d overflowed) give code 0, as x86 C does
                orow[2 + j] = np.uint8(f32_to_int32(roundf(xr[j] * inv)) & np.int32(0xFF))  # int8 two's complement
    return -1, STATUS_OK


#: Outputs of at least this many bytes are written with streaming stores (larger than a core's L2).
STREAM_BYTES = 1 << 21


@jit
def decode(data, out, table, off=2):
    """Q8_0 decoder. A large output (``STREAM_BYTES`` or more) is built block by block in a scratch row
    and written with streaming stores, two values at a time: a plain store would first read every
    output cache line from memory (about 2x at 16M values; the same bits either way).

    ``off``: the byte offset of the codes after the fp16 scale at bytes 0-1 (Q8_1 passes 4: its sum
    ``s`` sits between). Omitted, numba compiles it as the constant 2, so Q8_0's loop is unchanged."""
    bs = out.shape[1]
    if out.size * 4 >= STREAM_BYTES and bs % 2 == 0:
        h = bs // 2
        of = out.view(np.uint64).reshape(out.size // 2)
        tmp = np.empty(bs, np.float32)
        t64 = tmp.view(np.uint64)
        for b in range(data.shape[0]):
            d = load_f16(data, b, table)
            src = data[b]
            for j in range(bs):
                tmp[j] = F32(np.int8(src[off + j])) * d
            base = b * h
            for k in range(h):
                store_nontemporal(of, base + k, t64[k])
        store_fence()
        return out
    for b in range(data.shape[0]):
        d = load_f16(data, b, table)
        src = data[b]
        dst = out[b]
        for j in range(bs):
            dst[j] = F32(np.int8(src[off + j])) * d
    return out


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` blocks decoded by
    :func:`decode` (the same bits), ``aux`` the fp16 table."""
    decode(reader_blocks(src, n_blocks, 34), reader_out(dst, n_blocks, 32), reader_aux(aux, n_aux))
