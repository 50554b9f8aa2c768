"""Shared numba building blocks of the format kernels: the ``jit`` settings, fp16, block scans, lane stages.

The helpers every format kernel calls: fp16 conversions, the block scans, the
rotated encoders' stages on the lane layout (``lanes_*``) and the views the
attention readers take of their C pointers. The LLVM intrinsics the helpers
are built on (vector transpositions, look-ups, butterflies) are in
:mod:`tbq.intrinsics`; the ones other modules import from here are re-exported.

Private by design (the stumpy pattern): :mod:`tbq.codecs` validates and
prepares, and the format kernels (``tbq/formats/*_kernels.py``) take clean
C-contiguous 2-D arrays (one block per row) and write into a preallocated
output. Every kernel is compiled with :data:`jit`: ``cache=True`` and
``nogil=True`` (the codec layer runs chunks on a thread pool) and never
``fastmath``: fastmath lets LLVM contract ``a*b + c`` into an FMA and
reassociate sums, and either one changes bytes.

Float32 discipline: every constant is a module-level ``np.float32`` (a Python
float literal is float64 in numba and silently promotes the expression), and
float32 scalars only meet float32 scalars. A single float32 ``+ - * /`` or
``sqrt`` evaluated in float64 and rounded back would still be exact (53 >= 2*24
+ 2 bits), but a chain of them would not, so no float64 appears at all.

Encode kernels return ``(block, status)`` with the codes of
:mod:`tbq.backend`: ``(-1, STATUS_OK)`` when every block was written, else the
first block whose input is not finite (``STATUS_NONFINITE``) or whose fp16
scale overflowed with ``raise_overflow`` (``STATUS_SCALE_OVERFLOW``);
processing stops there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba as nb
import numpy as np
from numba import types

from . import numba_cache  # noqa: F401  (first: it keys the on-disk cache of every tbq kernel by its dependencies)
from .backend import STATUS_NONFINITE, STATUS_OK, STATUS_SCALE_OVERFLOW, STATUS_UNDEFINED  # noqa: F401  (re-exported for the kernels)
from .intrinsics import f16_widen_bits_portable, quantize_column8, quantize_column16, sum_squares32, transpose8

# The intrinsics' home is tbq.intrinsics; these names are also read from tbq.kernels (by the fused attention
# kernel and the tests), so they stay importable from here.
from .intrinsics import (  # noqa: F401  isort: skip
    TARGET_AVX2,
    TARGET_AVX512VL,
    TARGET_F16C,
    address,
    butterfly64,
    butterfly128,
    call_reader,
    lookup8_row,
    lookup16_row,
    store_nibble_rows,
    target_has,
    transpose8_vectors,
)

_target_has = target_has  # the name the tests use


#: Float32 constants for the kernels (a Python float literal would be float64 in numba and promote the expression).
F32 = np.float32
F32_0 = F32(0.0)
F32_1 = F32(1.0)
_M1 = F32(-1.0)
F32_HALF = F32(0.5)
FLT_MAX = F32(3.4028234663852886e38)
_2P31 = F32(2147483648.0)

jit = nb.njit(cache=True, nogil=True, fastmath=False, error_model="numpy", boundscheck=False)
#: For helpers of the format kernels' inner stages: numba inlines them into each caller, so LLVM optimises each
#: use in its caller's loop and a cold start compiles no function of their own.
jit_inline = nb.njit(inline="always", nogil=True, fastmath=False, error_model="numpy", boundscheck=False)


# --- fp16 ---------------------------------------------------------------------------


@jit
def f32_to_f16_bits(f):
    """fp16 bits of a float32, round to nearest even (what numpy's astype does)."""
    x = f32_bits(f)
    sign = (x >> np.uint32(16)) & np.uint32(0x8000)
    a = x & np.uint32(0x7FFFFFFF)
    if a >= np.uint32(0x7F800000):  # Inf or NaN
        if a == np.uint32(0x7F800000):
            return np.uint16(sign | np.uint32(0x7C00))
        return np.uint16(sign | np.uint32(0x7E00) | ((a >> np.uint32(13)) & np.uint32(0x3FF)))
    if a >= np.uint32(0x477FF000):  # >= 65520 rounds to Inf
        return np.uint16(sign | np.uint32(0x7C00))
    if a < np.uint32(0x38800000):  # below the smallest normal fp16 (2**-14)
        if a <= np.uint32(0x33000000):  # <= 2**-25: rounds to (signed) zero, the tie to even
            return np.uint16(sign)
        e = a >> np.uint32(23)
        mant = (a & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
        shift = np.uint32(126) - e  # value = mant * 2**(e-150); unit 2**-24
        q = mant >> shift
        rem = mant & ((np.uint32(1) << shift) - np.uint32(1))
        half = np.uint32(1) << (shift - np.uint32(1))
        if rem > half or (rem == half and (q & np.uint32(1)) != 0):
            q += np.uint32(1)
        return np.uint16(sign | q)
    h = (a >> np.uint32(13)) - np.uint32(0x1C000)  # rebias exponent 127 -> 15, keep 10 mantissa bits
    rem = a & np.uint32(0x1FFF)
    if rem > np.uint32(0x1000) or (rem == np.uint32(0x1000) and (h & np.uint32(1)) != 0):
        h += np.uint32(1)  # a carry into the exponent is the correct rounding
    return np.uint16(sign | h)


@jit
def f32_to_f16_bits_finite(f):
    """:func:`f32_to_f16_bits` without branches, for finite and infinite ``f`` (a NaN gives a quiet NaN).

    The FP16 library's ``fp16_ieee_from_fp32_value`` (ggml's software
    conversion): two exact multiplications by powers of two and one float
    addition do the round-to-nearest-even in the float unit, so a loop over it
    vectorises. Bit-identical to :func:`f32_to_f16_bits` for every float32
    pattern except the NaNs (their payloads), which the encoders never store:
    they refuse non-finite blocks first (checked on all 2**32 patterns,
    tests/test_latency_caching.py checks a sample of every exponent).
    """
    w = f32_bits(f)
    base = (abs(f) * np.uint32(0x77800000).view(np.float32)) * np.uint32(0x08800000).view(np.float32)
    shl1_w = np.uint32(w + w)
    sign = w & np.uint32(0x80000000)
    bias = shl1_w & np.uint32(0xFF000000)
    bias = bias if bias >= np.uint32(0x71000000) else np.uint32(0x71000000)
    base = np.uint32((bias >> np.uint32(1)) + np.uint32(0x07800000)).view(np.float32) + base
    bits = f32_bits(base)
    nonsign = np.uint32((bits >> np.uint32(13)) & np.uint32(0x00007C00)) + (bits & np.uint32(0x00000FFF))
    r = (sign >> np.uint32(16)) | (np.uint32(0x7E00) if shl1_w > np.uint32(0xFF000000) else nonsign)
    return np.uint16(r & np.uint32(0xFFFF))


f16_widen_bits = jit(f16_widen_bits_portable)


@jit
def f16_is_inf(h):
    """True when fp16 bits ``h`` are +-Inf (the scale overflowed)."""
    return (h & np.uint16(0x7FFF)) == np.uint16(0x7C00)


@jit
def f32_bits(f):
    return np.float32(f).view(np.uint32)


@jit
def store_f16(out, row, bits):
    """Write fp16 ``bits`` little-endian at bytes 0-1 of ``out[row]``."""
    out[row, 0] = np.uint8(bits & np.uint16(0xFF))
    out[row, 1] = np.uint8(bits >> np.uint16(8))


@jit
def load_f16(data, row, table):
    """The float32 value of the fp16 at bytes 0-1 of ``data[row]`` (``table`` is :func:`tbq.half.f16_table`)."""
    return table[np.int64(data[row, 0]) | (np.int64(data[row, 1]) << 8)]


# --- block scans --------------------------------------------------------------------


@jit
def block_finite(x, row):
    """True when every value of ``x[row]`` is finite."""
    for j in range(x.shape[1]):
        v = x[row, j]
        if not (abs(v) <= FLT_MAX):
            return False
    return True


@jit
def abs_bits_max(x, b, bs):
    """(largest |x| bit pattern, index of its first occurrence) in block ``b``.

    |x| as uint32 is ordered like |x| for finite floats, and both loops are
    branch-free reductions (max, then min of matching indices), which the loop
    vectoriser handles without fastmath, unlike a float max. Loop bounds are
    run-time values on purpose: with a literal 32 LLVM fully unrolls the loop
    and then does not vectorise it.
    """
    xr = x[b]
    amax = np.uint32(0)
    for j in range(bs):
        a = f32_bits(xr[j]) & np.uint32(0x7FFFFFFF)
        amax = a if a > amax else amax
    first = bs
    for j in range(bs):
        c = j if (f32_bits(xr[j]) & np.uint32(0x7FFFFFFF)) == amax else bs
        first = c if c < first else first
    return amax, first


@jit
def roundf(v):
    """C ``roundf`` of a float32: half away from zero (``v - trunc(v)`` is exact below 2**23)."""
    t = np.trunc(v)
    frac = v - t
    return t + (F32_1 if frac >= F32_HALF else (_M1 if frac <= -F32_HALF else F32_0))


@jit
def f32_to_int32(v):
    """C's ``(int)v`` on x86 for float32 ``v``: truncation, and INT_MIN's low bits (0) for +-Inf/NaN/out of range."""
    return np.int32(v) if abs(v) < _2P31 else np.int32(0)


# --- attention readers ----------------------------------------------------------------------

#: The C signature of a format's attention reader: ``read(src, dst, n_blocks, aux, n_aux)`` decodes the
#: ``n_blocks`` consecutive blocks at ``src`` (uint8) into ``n_blocks * block_size`` float32 values at
#: ``dst``, with ``aux`` (float32, ``n_aux`` values) the format's tables. The fused attention kernel
#: (:mod:`tbq.attention_kernels`) takes readers as C addresses of this one type (:func:`call_reader`), so it is
#: compiled (and cached) once for every format, and a format's reader is compiled only when used.
READER_SIG = types.void(
    types.CPointer(types.uint8), types.CPointer(types.float32), types.int64, types.CPointer(types.float32), types.int64
)

_READERS: dict = {}


def attention_reader(fn: Callable) -> Any:
    """The compiled (and cached on disk) C-callable reader of Python function ``fn`` (signature
    :data:`READER_SIG`), compiled on first use and then kept."""
    r = _READERS.get(fn)
    if r is None:
        r = _READERS[fn] = nb.cfunc(READER_SIG, nopython=True, cache=True, error_model="numpy", boundscheck=False)(fn)
    return r


# --- the rotated encoders' lane stages ------------------------------------------------------


@jit_inline
def lanes_load(x, g0, T):
    """Blocks ``g0 .. g0 + L`` of ``x`` (one block a row, ``L = min(lanes, rows left)``) into the lane layout
    ``T[j, l]`` (``n x lanes``: coordinate j of every block in one row), lanes past ``L`` zero; a pure copy.

    8 x 8 tiles go through :func:`transpose8` (vector shuffles), the last ``L % 8`` blocks one value at a time.
    The TBQ and PLANAR/ISO encoders' first stage.
    """
    n, lanes = T.shape
    L = min(lanes, x.shape[0] - g0)
    xf = x.reshape(x.size)
    Tf = T.reshape(T.size)
    L8 = L - L % 8
    for l0 in range(0, L8, 8):
        for j0 in range(0, n, 8):
            transpose8(xf, (g0 + l0) * n + j0, n, Tf, j0 * lanes + l0, lanes)
    for l in range(L8, L):  # flat pointer steps are faster than 2-D indexing
        row = x[g0 + l]
        p = l
        for j in range(n):
            Tf[p] = row[j]
            p += lanes
    for l in range(L, lanes):
        for j in range(n):
            T[j, l] = F32_0


@jit_inline
def lanes_sum_squares(T, norm2):
    """``norm2[l]`` = the sequential float32 sum of ``T[j, l] ** 2`` over ``j`` (from 0, one chain per lane):
    :func:`sum_squares32` (the sums in registers) when the lanes are a multiple of 32, else the plain loop."""
    n, lanes = T.shape
    if lanes % 32 == 0:
        Tf = T.reshape(T.size)
        for l0 in range(0, lanes, 32):
            sum_squares32(Tf, l0, lanes, n, norm2, l0)
    else:
        for l in range(lanes):
            norm2[l] = F32_0
        for j in range(n):
            for l in range(lanes):
                norm2[l] += T[j, l] * T[j, l]


@jit_inline
def lanes_scratch(n, lanes):
    """The rotated encoders' scratch for groups of ``lanes`` blocks of ``n`` values: the lane layouts ``T``
    (float32 values) and ``K`` (int32 indices), ``n x lanes``, and the per-lane float32 ``norm2``, ``norm``,
    ``scale`` and ``recon2`` (:func:`lanes_norms`, :func:`lanes_index`, :func:`lanes_store_scales`)."""
    return (
        np.zeros((n, lanes), np.float32),
        np.zeros((n, lanes), np.int32),
        np.zeros(lanes, np.float32),
        np.zeros(lanes, np.float32),
        np.zeros(lanes, np.float32),
        np.zeros(lanes, np.float32),
    )


@jit_inline
def lanes_norms(x, g0, norm2, norm, scale, floor, eps):
    """The rotated encoders' norm step on the group of blocks from ``g0`` (``norm2`` from
    :func:`lanes_sum_squares`); returns ``bad``, the first of the group's lanes whose input is not finite (the
    group's block count when none is).

    ``norm2`` Inf or NaN is the cheap sign; only then is the block scanned (:func:`block_finite`: a finite
    block whose squares overflow is not bad). Every lane gets ``norm = sqrt(norm2)``; without ``floor``
    (TBQ4, PLANAR/ISO) ``scale = 1 / norm``, 0 when ``norm <= eps`` (``norm = +inf`` passes: ``1/inf = +0``);
    with ``floor`` (TBQ3, which divides by the norm) the norm is clamped to at least ``eps`` and ``scale`` is
    not written."""
    L = min(norm2.shape[0], x.shape[0] - g0)
    bad = L
    for l in range(L):
        if not (norm2[l] <= FLT_MAX) and not block_finite(x, g0 + l):
            bad = l
            break
    for l in range(norm2.shape[0]):
        nv = np.sqrt(norm2[l])
        if floor:
            nv = nv if nv > eps else eps
        else:
            scale[l] = F32_1 / nv if nv > eps else F32_0
        norm[l] = nv
    return bad


@jit_inline
def lanes_store_scales(recon2, norm, out, g0, bad, raise_overflow, floor, eps):
    """The rotated encoders' scale step on lanes ``l < bad``: ``d = norm[l] / sqrt(recon2[l])`` as fp16 bits in
    bytes 0-1 of row ``g0 + l`` of ``out``. A ``recon`` of at most ``eps`` gives ``d = norm[l]`` (TBQ4,
    PLANAR/ISO), or with ``floor`` ``norm[l] / eps`` (TBQ3's clamp). With ``raise_overflow`` it stops before the
    first lane whose scale is inf in fp16 and returns that lane (its row untouched); else ``bad``."""
    for l in range(bad):
        recon = np.sqrt(recon2[l])
        nv = norm[l]
        if floor:
            d = nv / (recon if recon > eps else eps)
        else:
            d = nv / recon if recon > eps else nv
        h = f32_to_f16_bits(d)
        if raise_overflow and f16_is_inf(h):
            return l
        store_f16(out, g0 + l, h)
    return bad


@jit_inline
def thresholds7(t):
    """The first 7 values of array ``t`` as a tuple: loop-invariant scalars for :func:`count_at_least7`."""
    return (t[0], t[1], t[2], t[3], t[4], t[5], t[6])


@jit_inline
def thresholds15(t):
    """The first 15 values of array ``t`` as a tuple (see :func:`thresholds7`)."""
    return thresholds7(t) + (t[7], t[8], t[9], t[10], t[11], t[12], t[13], t[14])


@jit_inline
def count_at_least7(r, m):
    """The number of the first 7 values of the tuple ``m`` that are ``<= r`` (a NaN ``r``: 0): one compare each,
    added without a branch, so that a loop over lanes around it vectorises."""
    return (
        np.int32(r >= m[0])
        + np.int32(r >= m[1])
        + np.int32(r >= m[2])
        + np.int32(r >= m[3])
        + np.int32(r >= m[4])
        + np.int32(r >= m[5])
        + np.int32(r >= m[6])
    )


@jit_inline
def count_at_least15(r, m):
    """:func:`count_at_least7` over the 15 values of ``m``."""
    return count_at_least7(r, m) + count_at_least7(r, m[7:]) + np.int32(r >= m[14])


@jit_inline
def _lanes_count(T, cs2, K, count, m):
    n, lanes = T.shape
    for j in range(n):
        cj = cs2[j]
        for l in range(lanes):
            K[j, l] = count(T[j, l] * cj, m)


@jit_inline
def lanes_count_at_least(T, cs2, thresholds, K):
    """``K[j, l]`` = the number of ``thresholds`` (15 or 7 of them) that are ``<= T[j, l] * cs2[j]`` (float32), every
    compare of every lane (a NaN counts 0): the portable index step of :func:`lanes_index`."""
    if thresholds.shape[0] == 15:
        _lanes_count(T, cs2, K, count_at_least15, thresholds15(thresholds))
    else:
        _lanes_count(T, cs2, K, count_at_least7, thresholds7(thresholds))


@jit_inline
def lanes_index(T, cs2, thresholds, centroids_sq, K, recon2):
    """The rotated encoders' index step on the lane layout ``T[j, l]``: ``K[j, l]`` = the number of thresholds
    <= ``r = T[j, l] * cs2[j]`` (one rounded product; PLANAR/ISO pass ones: exact), and ``recon2[l]`` = the
    sequential float32 sum of ``centroids_sq[K[j, l]]`` over ``j`` from 0.

    ``thresholds`` holds 15 (4 bits) or 7 (3 bits) strictly increasing values. On AVX2 targets, 8 lanes at a
    time by :func:`quantize_column16` / :func:`quantize_column8` (``lanes`` a multiple of 8); elsewhere
    :func:`lanes_count_at_least` (unrolled compares, so that the loop over lanes vectorises), then the recon sum. A NaN ``r``
    compares false everywhere: index 0 either way.
    """
    n, lanes = T.shape
    if TARGET_AVX2:
        Tf = T.reshape(T.size)
        Kf = K.reshape(K.size)
        for l0 in range(0, lanes, 8):
            if thresholds.shape[0] == 15:
                quantize_column16(Tf, l0, lanes, n, cs2, Kf, recon2, l0, thresholds, centroids_sq)
            else:
                quantize_column8(Tf, l0, lanes, n, cs2, Kf, recon2, l0, thresholds, centroids_sq)
        return
    lanes_count_at_least(T, cs2, thresholds, K)
    for l in range(lanes):
        recon2[l] = F32_0
    for j in range(n):
        for l in range(lanes):
            recon2[l] += centroids_sq[K[j, l]]


@jit
def reader_blocks(src, n_blocks, type_size):
    """uint8 ``(n_blocks, type_size)`` view of a reader's ``src``."""
    return nb.carray(src, (n_blocks, type_size))


@jit
def reader_out(dst, n_blocks, block_size):
    """float32 ``(n_blocks, block_size)`` view of a reader's ``dst``."""
    return nb.carray(dst, (n_blocks, block_size))


@jit
def reader_aux(aux, n_aux):
    """float32 ``(n_aux,)`` view of a reader's tables."""
    return nb.carray(aux, n_aux)
