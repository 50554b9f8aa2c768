"""numba twins of :mod:`tbq.formats.q8_0` (same bytes, same float32 bits).

The row loops (the grouped scale pass and its refusals, the streaming decode) are
:mod:`tbq.formats._shared_kernels`'; the per-block pieces are here. Loop
bounds come from array shapes (run-time values) rather than the literal 32:
with a compile-time trip count LLVM fully unrolls the loops and then does not
vectorise them; with a run-time count the loop vectoriser does (about 2.5x
faster here).
"""

from __future__ import annotations

import numpy as np

from ..kernels import F32, f32_bits, f32_to_int32, jit, jit_inline, roundf
from ._shared_kernels import (  # noqa: F401  (STREAM_BYTES: the tests' threshold)
    STREAM_BYTES,
    decode_blocks,
    encode_groups,
    reader_views,
)

_127 = F32(127.0)


@jit_inline
def abs_max(xr):
    """``(largest |x| bits, largest |x|)`` of block ``xr``: |x| as uint32 bits is ordered like |x|, and a
    vectorisable max."""
    amax = np.uint32(0)
    for j in range(xr.shape[0]):
        a = f32_bits(xr[j]) & np.uint32(0x7FFFFFFF)
        amax = a if a > amax else amax
    return amax, np.uint32(amax).view(np.float32)


@jit_inline
def _codes(xr, out, b, inv):
    orow = out[b]
    for j in range(xr.shape[0]):
        # +-Inf/NaN (1/d overflowed) give code 0, as x86 C does
        orow[2 + j] = np.uint8(f32_to_int32(roundf(xr[j] * inv)) & np.int32(0xFF))  # int8 two's complement


@jit
def encode(x, out, raise_overflow):
    """Q8_0 encoder: ``d = max|x| / 127``, codes ``roundf(x / d)`` as int8."""
    return encode_groups(x, out, raise_overflow, _127, abs_max, _codes)


@jit_inline
def _dequantize(data, b, dst, d, table, off):
    src = data[b]
    for j in range(dst.shape[0]):
        dst[j] = F32(np.int8(src[off + j])) * d


@jit
def decode(data, out, table, off=2):
    """Q8_0 decoder: ``int8(code) * d``.

    ``off``: the byte offset of the codes after the fp16 scale at bytes 0-1 (Q8_1 passes 4: its sum
    ``s`` sits between). Omitted, numba compiles it as the constant 2, so Q8_0's loop is unchanged."""
    return decode_blocks(data, out, table, off, _dequantize, True)


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` blocks decoded by
    :func:`decode` (the same bits), ``aux`` the fp16 table."""
    decode(*reader_views(src, dst, n_blocks, aux, n_aux, 34))
