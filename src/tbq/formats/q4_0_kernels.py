"""numba twins of :mod:`tbq.formats.q4_0` (same bytes, same float32 bits).

The row loops (the grouped scale pass and its refusals, the streaming decode) are
:mod:`tbq.formats._shared_kernels`'; the per-block pieces are here.
"""

from __future__ import annotations

import numpy as np

from ..kernels import F32, F32_0, f32_bits, f32_to_int32, jit, jit_inline
from ..packing_kernels import pair4
from ._shared_kernels import (  # noqa: F401  (STREAM_BYTES: the tests' threshold)
    STREAM_BYTES,
    decode_blocks,
    dequantize_halves,
    encode_groups,
    reader_views,
)

_M8 = F32(-8.0)
_NO_QH = np.uint32(0)
_8_5 = F32(8.5)


@jit_inline
def signed_max(xr):
    """:func:`~tbq.formats._shared_kernels.encode_groups`' ``scan`` of Q4_0 (and Q5_0): ``(largest |x| bits, m)`` of block ``xr``, ``m`` the signed
    value of the first element of largest magnitude, +0 for a zero block (ggml). One pass: the max of ``(|x| bits << 8 | 255 - j)`` (at most 256 values)."""
    key = np.uint64(0)
    for j in range(xr.shape[0]):
        a = np.uint64(f32_bits(xr[j]) & np.uint32(0x7FFFFFFF))
        k = (a << np.uint64(8)) | np.uint64(255 - j)
        key = k if k > key else key
    ab = np.uint32(key >> np.uint64(8))
    return ab, (xr[255 - np.int64(key & np.uint64(255))] if ab != np.uint32(0) else F32_0)


@jit_inline
def _codes(xr, out, b, inv):
    half = xr.shape[0] // 2
    orow = out[b]
    for j in range(half):
        p0 = xr[j] * inv
        p1 = xr[j + half] * inv
        q0 = f32_to_int32(p0 + _8_5)  # rounded separately: no contraction without fastmath
        q1 = f32_to_int32(p1 + _8_5)  # +-Inf/NaN (1/d overflowed): 0, as x86 C
        orow[2 + j] = pair4(q0 if q0 < 15 else 15, q1 if q1 < 15 else 15)


@jit
def encode(x, out, raise_overflow):
    """Q4_0 encoder: ``d = m / -8`` with ``m`` the signed maximum, codes ``min(15, trunc(x / d + 8.5))``."""
    return encode_groups(x, out, raise_overflow, _M8, signed_max, _codes)


@jit_inline
def _value(c, d, m):
    return F32(c - 8) * d


@jit_inline
def _dequantize(data, b, dst, d, table, off):
    dequantize_halves(data[b], dst, off, _NO_QH, _value, d, F32_0)


@jit
def decode(data, out, table):
    """Q4_0 decoder: ``(code - 8) * d``."""
    return decode_blocks(data, out, table, 2, _dequantize, True)


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` blocks decoded by
    :func:`decode` (the same bits), ``aux`` the fp16 table."""
    decode(*reader_views(src, dst, n_blocks, aux, n_aux, 18))
