"""numba twins of :mod:`tbq.formats.f16` (same bytes, same float32 bits).

The kernels run over the flat values (block size 1): ``x`` float32 (n,), the
encoded words ``h`` uint16 (n,) (a little-endian view of the bytes), the
decoded floats as their uint32 bit patterns (n,), so that no decoded NaN is
ever held in a float variable: bf16 words are shifted as integers (payloads
unchanged) and f16 words widened by :func:`tbq.kernels.f16_widen` (F16C's
``vcvtph2ps`` where the CPU has it), which returns the bits.

Encoding works in chunks of :data:`CHUNK` values: one branch-free pass finds
the chunk's largest ``|x|`` bit pattern (a uint32 max reduction, which
vectorises); only a chunk that holds a non-finite value (or, when raising, a
value that rounds to infinity) is re-run value by value to stop at the first
offending value, which is reported as the block (block = value here). Every
other chunk is converted by a second branch-free pass.
"""

from __future__ import annotations

import numpy as np

from ..intrinsics import f16_widen
from ..kernels import STATUS_NONFINITE, STATUS_OK, STATUS_SCALE_OVERFLOW, jit, reader_blocks, reader_out

F32 = np.float32
_HALF = F32(0.5)

#: Values per scan/convert chunk (small enough to stay in L1 between the two passes).
CHUNK = 2048

_ABS = np.uint32(0x7FFFFFFF)
_INF32 = np.uint32(0x7F800000)
_F16_OVER = np.uint32(0x477FF000)  # |x| >= 65520 rounds to fp16 inf
_BF16_OVER = np.uint32(0x7F7F8000)  # |x| >= this rounds to bf16 inf
_F16_MIN_NORMAL = np.uint32(0x38800000)  # 2**-14
_HALF_BITS = np.uint32(0x3F000000)  # bits of 0.5f


@jit
def _bits(v):
    return F32(v).view(np.uint32)


@jit
def f16_word(v):
    """fp16 bits of a float32 (finite or inf), round to nearest even, branch-free.

    Normal results: the 13 dropped mantissa bits are rounded to nearest even
    on the integer pattern (``+ 0xFFF + lowest kept bit``; a carry into the
    exponent is the correct rounding), then the exponent is rebiased
    127 -> 15 (``- 112 << 10``); everything at or above 65520 (the tie above
    65504 rounds to the even 0x7C00) saturates at 0x7C00 = inf.
    Subnormal results (|x| < 2**-14): ``|x| + 0.5f`` in float32 puts |x| in
    the binade [0.5, 1), whose ulp is 2**-24 = the fp16 subnormal step, so the
    hardware's own round-to-nearest-even float add yields ``0.5 + m * 2**-24``
    with ``m`` the rounded fp16 subnormal code (1024 = the carry into the
    smallest normal, which is its correct encoding 0x0400); subtracting the
    bits of 0.5f leaves ``m``. Both branches are computed and one is selected,
    so the loop vectorises.
    """
    u = _bits(v)
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & _ABS
    hn = ((a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)) - np.uint32(0x1C000)
    hn = hn if hn < np.uint32(0x7C00) else np.uint32(0x7C00)
    hs = _bits(abs(F32(v)) + _HALF) - _HALF_BITS
    return np.uint16(sign | (hs if a < _F16_MIN_NORMAL else hn))


@jit
def bf16_word(v):
    """bf16 bits of a non-NaN float32: ggml's ``(u + 0x7FFF + ((u >> 16) & 1)) >> 16`` on the uint32 pattern."""
    u = _bits(v)
    return np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@jit
def _amax(x):
    """Largest ``|x|`` bit pattern of a (chunk) array.

    A uint32 max is a branch-free reduction the vectoriser handles (a float
    max is not, without fastmath). Loops run over a slice from index 0: with
    ``range(s, e)`` on the whole array LLVM cannot prove the index
    non-negative (numba wraps negative indices) and emits gathers.
    """
    amax = np.uint32(0)
    for j in range(x.shape[0]):
        a = _bits(x[j]) & _ABS
        amax = a if a > amax else amax
    return amax


@jit
def _convert_f16(x, h):
    for j in range(x.shape[0]):
        h[j] = f16_word(x[j])


@jit
def _convert_bf16(x, h):
    for j in range(x.shape[0]):
        h[j] = bf16_word(x[j])


@jit
def _encode_words(x, h, limit, bf16):
    """The f16 (``bf16`` False) or bf16 words of ``x`` into ``h``: chunks whose largest magnitude is below
    ``limit`` by the vectorised conversion, the others value by value, stopping at the first one at or above
    ``limit`` (:data:`STATUS_NONFINITE` for Inf/NaN, else :data:`STATUS_SCALE_OVERFLOW`)."""
    n = x.shape[0]
    for s in range(0, n, CHUNK):
        e = min(s + CHUNK, n)
        if _amax(x[s:e]) >= limit:
            for j in range(s, e):  # slow path: stop at the first offending value
                a = _bits(x[j]) & _ABS
                if a >= _INF32:
                    return j, STATUS_NONFINITE
                if a >= limit:
                    return j, STATUS_SCALE_OVERFLOW
                h[j] = bf16_word(x[j]) if bf16 else f16_word(x[j])
        elif bf16:
            _convert_bf16(x[s:e], h[s:e])
        else:
            _convert_f16(x[s:e], h[s:e])
    return -1, STATUS_OK


@jit
def encode_f16(x, h, raise_overflow):
    return _encode_words(x, h, _F16_OVER if raise_overflow else _INF32, False)


@jit
def encode_bf16(x, h, raise_overflow):
    return _encode_words(x, h, _BF16_OVER if raise_overflow else _INF32, True)


@jit
def decode_f16(h, out):
    """``out`` (uint32 bit patterns) = ggml's fp16 -> fp32 of every word of ``h`` (:func:`tbq.kernels.f16_widen`)."""
    for j in range(h.shape[0]):
        out[j] = f16_widen(h[j])
    return out


@jit
def decode_bf16(h, out):
    """``out`` (uint32 bit patterns) = ``h << 16``: integer only, so NaN payloads pass unchanged."""
    for j in range(h.shape[0]):  # the shift wrapped in uint32: numba widens it to 64 bits, half the vector lanes
        out[j] = np.uint32(np.uint32(h[j]) << np.uint32(16))
    return out


def attention_read_f16(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` fp16 values by
    :func:`decode_f16` (no table: ``aux`` is not read)."""
    decode_f16(
        reader_blocks(src, n_blocks, 2).reshape(2 * n_blocks).view(np.uint16),
        reader_out(dst, n_blocks, 1).reshape(n_blocks).view(np.uint32),
    )


def attention_read_bf16(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader: ``n_blocks`` bf16 values by :func:`decode_bf16`."""
    decode_bf16(
        reader_blocks(src, n_blocks, 2).reshape(2 * n_blocks).view(np.uint16),
        reader_out(dst, n_blocks, 1).reshape(n_blocks).view(np.uint32),
    )
