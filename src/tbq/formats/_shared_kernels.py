"""Kernel pieces that several format kernel modules share, written once (the numba side of :mod:`._shared`).

Today: the numba row loops of the block formats whose block starts with an fp16 scale ``d`` (bytes 0-1).

Q4_0, Q5_0 and Q8_0 encode through :func:`encode_groups` (one scale rule, ``d = m / divisor`` with ``m`` from a
per-format scan, and one refusal order); Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 and IQ4_NL decode through
:func:`decode_blocks` (Q4_0's and Q8_0's with streaming stores for a large output), the nibble formats' codes through
:func:`dequantize_halves` (ggml's layout: values ``j`` and ``j + half`` share a byte, Q5's bit 4 in a ``qh``
plane); their attention readers take the views of :func:`reader_views`. Each format's kernels module passes its
own per-block pieces (``@jit_inline`` functions, inlined into the format's kernel): only the loops around them,
and the float32 constants they all use, live here.
"""

from __future__ import annotations

import numpy as np

from ..intrinsics import store_fence, store_nontemporal
from ..kernels import (
    F32_0,
    F32_1,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SCALE_OVERFLOW,
    f16_is_inf,
    f32_to_f16_bits_finite,
    jit,
    jit_inline,
    load_f16,
    reader_aux,
    reader_blocks,
    reader_out,
    store_f16,
)
from ..packing_kernels import hi4, lo4

#: Blocks whose scalar work (largest magnitude, scale, reciprocal, fp16) :func:`encode_groups` does side by side.
GROUP = 16

#: Outputs of at least this many bytes are written with streaming stores (larger than a core's L2).
STREAM_BYTES = 1 << 21


@jit_inline
def encode_groups(x, out, raise_overflow, divisor, scan, codes):
    """Encode the blocks of ``x`` (one a row) into ``out``, ``GROUP`` blocks at a time; ``(block, status)`` as
    every encoder (:mod:`tbq.kernels`).

    ``scan(xr)`` gives a block's largest ``|x|`` bit pattern and the float32 ``m`` its scale is made of, ``d = m /
    divisor``. One SIMD pass computes the group's ``1/d`` (0 for ``d = 0``) and fp16 bits; then each block in turn
    is refused when not finite (``STATUS_NONFINITE``) or, with ``raise_overflow``, when its fp16 ``d`` is inf
    (``STATUS_SCALE_OVERFLOW``), else its fp16 ``d`` goes to bytes 0-1 and ``codes(xr, out, b, inv)`` writes the
    rest of row ``b``. A NaN block's ``d`` is never stored (refused first), so the branch-free fp16 conversion
    serves.
    """
    nblk = x.shape[0]
    AB = np.empty(GROUP, np.uint32)
    M = np.empty(GROUP, np.float32)
    INV = np.empty(GROUP, np.float32)
    H = np.empty(GROUP, np.uint16)
    for g0 in range(0, nblk, GROUP):
        L = min(GROUP, nblk - g0)
        for l in range(L):
            AB[l], M[l] = scan(x[g0 + l])
        for l in range(L):
            d = M[l] / divisor
            INV[l] = F32_1 / d if d != F32_0 else F32_0
            H[l] = f32_to_f16_bits_finite(d)
        for l in range(L):
            b = g0 + l
            if AB[l] >= np.uint32(0x7F800000):  # Inf or NaN
                return b, STATUS_NONFINITE
            h = H[l]
            if raise_overflow and f16_is_inf(h):
                return b, STATUS_SCALE_OVERFLOW
            store_f16(out, b, h)
            codes(x[b], out, b, INV[l])
    return -1, STATUS_OK


@jit_inline
def decode_blocks(data, out, table, off, dequantize, stream):
    """Decode the blocks of ``data`` (one a row, the fp16 ``d`` at bytes 0-1, the codes from byte ``off``) into
    ``out``: ``dequantize(data, b, dst, d, table, off)`` writes the values ``dst`` of block ``b`` (its fp16 ``d``
    decoded through ``table``, :func:`tbq.half.f16_table`).

    With ``stream``, a large output (``STREAM_BYTES`` or more, an even block size) is built block by block in a
    scratch row and written with streaming stores, two values at a time: a plain store would first read every
    output cache line from memory (about 2x for Q8_0 at 16M values, 1.6x for Q4_0; the same bits either way).
    Q4_1, Q5_0, Q5_1 and IQ4_NL pass False: their block decode is slower, and the scratch row's round trip cost
    them a fifth to a third at 4M values (benchmarks/bench_versus.py)."""
    bs = out.shape[1]
    if stream and out.size * 4 >= STREAM_BYTES and bs % 2 == 0:
        h = bs // 2
        of = out.view(np.uint64).reshape(out.size // 2)
        tmp = np.empty(bs, np.float32)
        t64 = tmp.view(np.uint64)
        for b in range(data.shape[0]):
            dequantize(data, b, tmp, load_f16(data, b, table), table, off)
            base = b * h
            for k in range(h):
                store_nontemporal(of, base + k, t64[k])
        store_fence()
        return out
    for b in range(data.shape[0]):
        dequantize(data, b, out[b], load_f16(data, b, table), table, off)
    return out


@jit
def hi_bit(qh, i):
    """Bit ``i`` of ``qh`` as a code's bit 4 (int32: 0 or 16)."""
    return np.int32((qh >> np.uint32(i)) & np.uint32(1)) << 4


@jit_inline
def dequantize_halves(src, dst, off, qh, value, d, m):
    """``dst`` (the block's ``2 * half`` values) from its codes: value ``j`` from the low nibble of byte ``off + j``
    of ``src``, value ``j + half`` from the high nibble, each with bit 4 from bit ``j`` (or ``j + half``) of the
    uint32 ``qh`` (Q5_0, Q5_1; 0 for the 4-bit formats). ``value(code, d, m)`` makes a value of a code, ``d`` and
    ``m`` (the block's minimum; formats without one pass 0 and do not read it)."""
    half = dst.shape[0] // 2
    for j in range(half):
        v = src[off + j]
        dst[j] = value(lo4(v) | hi_bit(qh, j), d, m)
        dst[j + half] = value(hi4(v) | hi_bit(qh, j + half), d, m)


@jit
def reader_views(src, dst, n_blocks, aux, n_aux, type_size):
    """An attention reader's arguments (:data:`tbq.kernels.READER_SIG`) as a scaled block format's decoder takes
    them: ``n_blocks`` blocks of ``type_size`` bytes, their 32 values each, and ``aux`` (the fp16 table)."""
    return reader_blocks(src, n_blocks, type_size), reader_out(dst, n_blocks, 32), reader_aux(aux, n_aux)
