"""numba twins of :mod:`tbq.formats.q4_1` (same bytes, same float32 bits).

The min/max search, the min/scale header and the ``code * d + min`` decode also serve
:mod:`tbq.formats.q5_kernels` (Q5_1).
"""

from __future__ import annotations

import numpy as np

from ..kernels import (
    F32,
    F32_0,
    F32_1,
    F32_HALF,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SCALE_OVERFLOW,
    f16_is_inf,
    f32_to_f16_bits,
    f32_to_int32,
    jit,
    jit_inline,
    store_f16,
)
from ..packing_kernels import pair4
from ._shared_kernels import (
    decode_blocks,
    dequantize_halves,
    reader_views,
)

_15 = F32(15.0)
_F16_MAX = F32(65504.0)

_KEY_POS_INF = 0x7F800000  # order key of +inf (any key >= it: +inf or a NaN with the sign bit clear)
_KEY_NEG_INF = -0x7F800001  # order key of -inf (any key <= it: -inf or a NaN with the sign bit set)
_KEY_BIG = 0x7FFFFFFF
_KEY_SMALL = -0x80000000


@jit
def order_key(v):
    """An integer that orders like the float32 ``v`` (finite values and infinities; ``-0`` just below ``+0``).

    The sign-magnitude pattern becomes two's complement: negative patterns get
    their magnitude bits flipped. Integer min/max reductions vectorise without
    fastmath, where float ones (``v < m ? v : m``) do not.
    """
    u = np.int64(F32(v).view(np.int32))
    return u ^ ((u >> 31) & 0x7FFFFFFF)


@jit
def _first_zero(xr, bs):
    """The first element of ``xr`` that equals zero (``+0`` or ``-0``: the kept sign)."""
    first = bs
    for j in range(bs):
        c = j if xr[j] == F32_0 else bs
        first = c if c < first else first
    return xr[first]


@jit
def first_min_max(xr, bs):
    """``(min, max, finite)`` of one block: the values of the *first* elements attaining them, as C's strict loop.

    One branch-free pass reduces the order keys. A non-zero extreme is then
    the value itself (equal non-zero floats have equal bits); only a zero
    extreme needs a second pass, for the first zero's sign (``+0 == -0``, so
    C's ``if (v < min) min = v`` keeps the first zero). ``finite`` is False
    when the block holds an Inf or a NaN (its key lies beyond an infinity's).
    """
    kmin = np.int64(_KEY_BIG)
    kmax = np.int64(_KEY_SMALL)
    for j in range(bs):
        k = order_key(xr[j])
        kmin = k if k < kmin else kmin
        kmax = k if k > kmax else kmax
    if not (kmax < _KEY_POS_INF and kmin > _KEY_NEG_INF):
        return F32_0, F32_0, False
    # the extreme values from their keys (the key map is its own inverse)
    vmin = np.int32(kmin ^ ((kmin >> 31) & 0x7FFFFFFF)).view(np.float32)
    vmax = np.int32(kmax ^ ((kmax >> 31) & 0x7FFFFFFF)).view(np.float32)
    if vmin == F32_0:
        vmin = _first_zero(xr, bs)
    if vmax == F32_0:
        vmax = _first_zero(xr, bs)
    return vmin, vmax, True


@jit
def store_f16_at(out, row, off, bits):
    """Write fp16 ``bits`` little-endian at bytes ``off``, ``off+1`` of ``out[row]``."""
    out[row, off] = np.uint8(bits & np.uint16(0xFF))
    out[row, off + 1] = np.uint8(bits >> np.uint16(8))


@jit
def load_f16_at(data, row, off, table):
    """The float32 value of the fp16 at bytes ``off``, ``off+1`` of ``data[row]``."""
    return table[np.int64(data[row, off]) | (np.int64(data[row, off + 1]) << 8)]


@jit
def _code(x, mn, inv):
    """``min(15, trunc((x - min) * id + 0.5))``: three float32 roundings, none fused (no fastmath, no contraction)."""
    t = (x - mn) * inv + F32_HALF
    qi = f32_to_int32(t)  # +-Inf/NaN (1/d overflowed): 0, the low byte of x86's 0x80000000
    return qi if qi < 15 else 15


with np.errstate(invalid="ignore"):
    #: The platform's default NaN, what the hardware gives for 0 * inf (0xFFC00000 on x86), as float32 bits.
    _DEFAULT_NAN = np.uint32((np.zeros(1, np.float32) * np.float32(np.inf)).view(np.uint32)[0])


@jit
def add_min_nonfinite(c, d, m):
    """``c * d + m`` for a block whose fp16 ``d`` is inf or NaN (arbitrary bytes only), with fixed NaN payloads.

    When the product is NaN and ``m`` is NaN too, x86 returns the first
    operand's payload, and LLVM may swap the operands of the commutative add
    (and fold a float "isnan ? p : p + m" select back into the add). So the
    product's NaN is written from integers: ``d``'s pattern quieted when ``d``
    is NaN, the platform's default NaN for ``0 * inf``; this is what the NumPy
    reference (:func:`tbq.formats.q4_1.add_min`) returns. Every other case has
    at most one NaN operand, so its payload is fixed.
    """
    db = F32(d).view(np.uint32)
    if (db & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint32(db | np.uint32(0x00400000)).view(np.float32)
    if c == 0:
        return np.uint32(_DEFAULT_NAN).view(np.float32)
    return F32(c) * d + m


@jit_inline
def store_min_scale(xr, bs, levels, out, b, raise_overflow):
    """The min/scale header of the Q4_1/Q5_1 block ``xr`` (``bs`` values, codes ``0 .. levels``): ``d = (max -
    min) / levels`` and ``min`` as fp16 at bytes 0-1 and 2-3 of ``out[b]``. Returns ``(status, min, 1/d)`` (1/d
    is 0 for d = 0): :data:`STATUS_NONFINITE` for a non-finite block, :data:`STATUS_SCALE_OVERFLOW` when
    ``raise_overflow`` and either fp16 is inf (nothing written then), else :data:`STATUS_OK`."""
    mn, mx, finite = first_min_max(xr, bs)
    if not finite:
        return STATUS_NONFINITE, mn, F32_0
    d = (mx - mn) / levels
    inv = F32_1 / d if d != F32_0 else F32_0
    hd = f32_to_f16_bits(d)
    hm = f32_to_f16_bits(mn)
    if raise_overflow and (f16_is_inf(hd) or f16_is_inf(hm)):
        return STATUS_SCALE_OVERFLOW, mn, inv
    store_f16(out, b, hd)
    store_f16_at(out, b, 2, hm)
    return STATUS_OK, mn, inv


@jit
def encode(x, out, raise_overflow):
    bs = x.shape[1]
    half = bs // 2
    for b in range(x.shape[0]):
        xr = x[b]
        status, mn, inv = store_min_scale(xr, bs, _15, out, b, raise_overflow)
        if status != STATUS_OK:
            return b, status
        orow = out[b]
        for j in range(half):  # both halves in one pass: one vector of codes per output byte lane
            orow[4 + j] = pair4(_code(xr[j], mn, inv), _code(xr[j + half], mn, inv))
    return -1, STATUS_OK


@jit_inline
def add_min(c, d, m):
    """``c * d + m`` for a block whose fp16 ``d`` is finite (no product is NaN): the exact product, then one
    rounding (not fused)."""
    return F32(c) * d + m


@jit_inline
def dequantize_min(data, b, dst, d, table, off, qh):
    """The values ``code * d + min`` of block ``b`` (the fp16 ``min`` at bytes 2-3): Q4_1's, and Q5_1's with its
    bit-4 plane ``qh``. An inf/NaN ``d`` (arbitrary bytes) goes through :func:`add_min_nonfinite`."""
    m = load_f16_at(data, b, 2, table)
    if abs(d) <= _F16_MAX:
        dequantize_halves(data[b], dst, off, qh, add_min, d, m)
    else:
        dequantize_halves(data[b], dst, off, qh, add_min_nonfinite, d, m)


@jit_inline
def _dequantize(data, b, dst, d, table, off):
    dequantize_min(data, b, dst, d, table, off, np.uint32(0))


@jit
def decode(data, out, table):
    """Q4_1 decoder: ``code * d + min``."""
    return decode_blocks(data, out, table, 4, _dequantize, False)


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` blocks decoded by
    :func:`decode` (the same bits), ``aux`` the fp16 table."""
    decode(*reader_views(src, dst, n_blocks, aux, n_aux, 20))
