"""numba kernels, byte-identical to :mod:`tbq.reference`.

Private by design (the stumpy pattern): :mod:`tbq.codecs` validates and
prepares, and these kernels take clean C-contiguous 2-D arrays (one block per
row) and write into a preallocated output. They are compiled with
``cache=True`` and ``nogil=True`` (the codec layer runs chunks on a thread
pool) and never with ``fastmath``: fastmath lets LLVM contract ``a*b + c``
into an FMA and reassociate sums, and either one changes bytes.

Float32 discipline: every constant is a module-level ``np.float32`` (a Python
float literal is float64 in numba and silently promotes the expression), and
float32 scalars only meet float32 scalars. A single float32 ``+ - * /`` or
``sqrt`` evaluated in float64 and rounded back would still be exact (53 >= 2*24
+ 2 bits), but a chain of them would not, so no float64 appears at all.

Encode kernels return ``(block, kind)``: ``(-1, 0)`` when every block was
written, else the first block (row index) whose input is not finite
(``kind = 1``) or whose fp16 scale overflowed with ``raise_overflow``
(``kind = 2``); processing stops there.
"""

from __future__ import annotations

import numba as nb
import numpy as np

F32 = np.float32
_0 = F32(0.0)
_1 = F32(1.0)
_HALF = F32(0.5)
_127 = F32(127.0)
_M8 = F32(-8.0)
_8_5 = F32(8.5)
_EPS_NORM = F32(1e-10)
_FLT_MAX = F32(3.4028234663852886e38)

jit = nb.njit(cache=True, nogil=True, fastmath=False, error_model="numpy", boundscheck=False)


# --- fp16 ---------------------------------------------------------------------------


@jit
def f32_to_f16_bits(f):
    """fp16 bits of a float32, round to nearest even (what numpy's astype does)."""
    x = _f32_bits(f)
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
    h = ((a >> np.uint32(13)) - np.uint32(0x1C000))  # rebias exponent 127 -> 15, keep 10 mantissa bits
    rem = a & np.uint32(0x1FFF)
    if rem > np.uint32(0x1000) or (rem == np.uint32(0x1000) and (h & np.uint32(1)) != 0):
        h += np.uint32(1)  # a carry into the exponent is the correct rounding
    return np.uint16(sign | h)


@jit
def _f32_bits(f):
    return np.float32(f).view(np.uint32)


@jit
def _store_f16(out, row, bits):
    out[row, 0] = np.uint8(bits & np.uint16(0xFF))
    out[row, 1] = np.uint8(bits >> np.uint16(8))


@jit
def _load_f16(data, row, table):
    return table[np.int64(data[row, 0]) | (np.int64(data[row, 1]) << 8)]


@jit
def f32_to_f16_bits_array(x, out):
    for i in range(x.size):
        out[i] = f32_to_f16_bits(x[i])


@jit
def _block_finite(x, row):
    for j in range(x.shape[1]):
        v = x[row, j]
        if not (abs(v) <= _FLT_MAX):
            return False
    return True


# --- packers ------------------------------------------------------------------------


@jit
def pack4_pairs(idx):
    out = np.empty(idx.size // 2, np.uint8)
    for k in range(out.size):
        out[k] = idx[2 * k] | (idx[2 * k + 1] << np.uint8(4))
    return out


@jit
def unpack4_pairs(b):
    out = np.empty(b.size * 2, np.uint8)
    for k in range(b.size):
        out[2 * k] = b[k] & np.uint8(0x0F)
        out[2 * k + 1] = b[k] >> np.uint8(4)
    return out


@jit
def pack4_halves(q):
    out = np.empty(q.size // 2, np.uint8)
    for blk in range(q.size // 32):
        for j in range(16):
            out[16 * blk + j] = q[32 * blk + j] | (q[32 * blk + j + 16] << np.uint8(4))
    return out


@jit
def unpack4_halves(b):
    out = np.empty(b.size * 2, np.uint8)
    for blk in range(b.size // 16):
        for j in range(16):
            v = b[16 * blk + j]
            out[32 * blk + j] = v & np.uint8(0x0F)
            out[32 * blk + j + 16] = v >> np.uint8(4)
    return out


@jit
def pack3(idx):
    out = np.empty(idx.size // 8 * 3, np.uint8)
    for g in range(idx.size // 8):
        lane = np.uint32(0)
        for t in range(8):
            lane |= np.uint32(idx[8 * g + t]) << np.uint32(3 * t)
        out[3 * g] = np.uint8(lane & np.uint32(0xFF))
        out[3 * g + 1] = np.uint8((lane >> np.uint32(8)) & np.uint32(0xFF))
        out[3 * g + 2] = np.uint8(lane >> np.uint32(16))
    return out


@jit
def unpack3(b):
    out = np.empty(b.size // 3 * 8, np.uint8)
    for g in range(b.size // 3):
        lane = np.uint32(b[3 * g]) | (np.uint32(b[3 * g + 1]) << np.uint32(8)) | (np.uint32(b[3 * g + 2]) << np.uint32(16))
        for t in range(8):
            out[8 * g + t] = np.uint8((lane >> np.uint32(3 * t)) & np.uint32(7))
    return out


@jit
def pack3_unpack3_identity_failures(start, stop):
    """Count lane values in [start, stop) for which pack3(unpack3(lane)) != lane (exhaustive test helper)."""
    bad = 0
    idx = np.empty(8, np.uint8)
    for lane in range(start, stop):
        for t in range(8):
            idx[t] = np.uint8((lane >> (3 * t)) & 7)
        back = 0
        for t in range(8):
            back |= np.int64(idx[t]) << (3 * t)
        b0 = back & 0xFF
        b1 = (back >> 8) & 0xFF
        b2 = back >> 16
        if (b0 | (b1 << 8) | (b2 << 16)) != lane:
            bad += 1
    return bad


# --- Q8_0 ---------------------------------------------------------------------------


@jit
def encode_q8_0(x, out, raise_overflow):
    for b in range(x.shape[0]):
        amax = _0
        finite = True
        for j in range(32):
            a = abs(x[b, j])
            if not (a <= _FLT_MAX):
                finite = False
            if a > amax:
                amax = a
        if not finite:
            return b, 1
        d = amax / _127
        inv = _1 / d if d != _0 else _0
        h = f32_to_f16_bits(d)
        if raise_overflow and (h & np.uint16(0x7FFF)) == np.uint16(0x7C00):
            return b, 2
        _store_f16(out, b, h)
        for j in range(32):
            v = x[b, j] * inv
            t = np.int32(v)  # truncation toward zero
            frac = v - F32(t)  # exact
            if frac >= _HALF:
                t += 1
            elif frac <= -_HALF:
                t -= 1
            out[b, 2 + j] = np.uint8(t & 0xFF)  # int8 two's complement
    return -1, 0


@jit
def decode_q8_0(data, out, table):
    for b in range(data.shape[0]):
        d = _load_f16(data, b, table)
        for j in range(32):
            out[b, j] = F32(np.int8(data[b, 2 + j])) * d
    return out


# --- Q4_0 ---------------------------------------------------------------------------


@jit
def encode_q4_0(x, out, raise_overflow):
    q = np.empty(32, np.uint8)
    for b in range(x.shape[0]):
        amax = _0
        m = _0
        finite = True
        for j in range(32):
            v = x[b, j]
            a = abs(v)
            if not (a <= _FLT_MAX):
                finite = False
            if a > amax:  # strict: the first of equal magnitudes wins
                amax = a
                m = v
        if not finite:
            return b, 1
        d = m / _M8
        inv = _1 / d if d != _0 else _0
        h = f32_to_f16_bits(d)
        if raise_overflow and (h & np.uint16(0x7FFF)) == np.uint16(0x7C00):
            return b, 2
        _store_f16(out, b, h)
        for j in range(32):
            p = x[b, j] * inv
            t = p + _8_5  # rounded separately: no contraction without fastmath
            qi = np.int32(t)
            q[j] = np.uint8(15 if qi > 15 else qi)
        for j in range(16):
            out[b, 2 + j] = q[j] | (q[j + 16] << np.uint8(4))
    return -1, 0


@jit
def decode_q4_0(data, out, table):
    for b in range(data.shape[0]):
        d = _load_f16(data, b, table)
        for j in range(16):
            v = data[b, 2 + j]
            out[b, j] = F32(np.int32(v & np.uint8(0x0F)) - 8) * d
            out[b, j + 16] = F32(np.int32(v >> np.uint8(4)) - 8) * d
    return out


# --- TBQ ----------------------------------------------------------------------------


@jit
def _butterfly(v):
    n = v.size
    h = 1
    while h < n:
        for i in range(0, n, 2 * h):
            for j in range(i, i + h):
                a = v[j]
                c = v[j + h]
                v[j] = a + c
                v[j + h] = a - c
        h *= 2


@jit
def encode_tbq(x, out, bits, thresholds, centroids_sq, s1, cs2, raise_overflow):
    """TBQ4_0 (bits=4) / TBQ3_0 (bits=3) encoder.

    ``cs2`` is ``hadamard_scale * signs2`` as float32: multiplying by +-C is the
    same single rounding as multiplying by C and then flipping the sign.
    ``centroids_sq`` is ``c*c`` in float32, the exact terms of the recon sum.
    """
    n = x.shape[1]
    v = np.empty(n, np.float32)
    idx = np.empty(n, np.uint8)
    nthr = thresholds.size
    for b in range(x.shape[0]):
        norm2 = _0
        for j in range(n):
            e = x[b, j]
            norm2 += e * e
        if not (norm2 <= _FLT_MAX) and not _block_finite(x, b):
            return b, 1
        norm = np.sqrt(norm2)
        if bits == 4:
            inv = _1 / norm if norm > _EPS_NORM else _0
            for j in range(n):
                v[j] = (x[b, j] * inv) * s1[j]
        else:
            norm = norm if norm > _EPS_NORM else _EPS_NORM
            for j in range(n):
                v[j] = (x[b, j] / norm) * s1[j]
        _butterfly(v)
        recon2 = _0
        for j in range(n):
            r = v[j] * cs2[j]
            k = 0
            for t in range(nthr):
                if r >= thresholds[t]:
                    k += 1
            idx[j] = np.uint8(k)
            recon2 += centroids_sq[k]
        recon = np.sqrt(recon2)
        if bits == 4:
            d = norm / recon if recon > _EPS_NORM else norm
        else:
            d = norm / (recon if recon > _EPS_NORM else _EPS_NORM)
        h = f32_to_f16_bits(d)
        if raise_overflow and (h & np.uint16(0x7FFF)) == np.uint16(0x7C00):
            return b, 2
        _store_f16(out, b, h)
        if bits == 4:
            for k in range(n // 2):
                out[b, 2 + k] = idx[2 * k] | (idx[2 * k + 1] << np.uint8(4))
        else:
            for g in range(n // 8):
                lane = np.uint32(0)
                for t in range(8):
                    lane |= np.uint32(idx[8 * g + t]) << np.uint32(3 * t)
                out[b, 2 + 3 * g] = np.uint8(lane & np.uint32(0xFF))
                out[b, 3 + 3 * g] = np.uint8((lane >> np.uint32(8)) & np.uint32(0xFF))
                out[b, 4 + 3 * g] = np.uint8(lane >> np.uint32(16))
    return -1, 0


@jit
def decode_tbq(data, out, bits, centroids, s2, cs1, table):
    """TBQ decoder: ``y = (H(s2 * c[idx]) * (C * s1)) * d``."""
    n = out.shape[1]
    v = np.empty(n, np.float32)
    for b in range(data.shape[0]):
        d = _load_f16(data, b, table)
        if bits == 4:
            for k in range(n // 2):
                byte = data[b, 2 + k]
                v[2 * k] = centroids[byte & np.uint8(0x0F)] * s2[2 * k]
                v[2 * k + 1] = centroids[byte >> np.uint8(4)] * s2[2 * k + 1]
        else:
            for g in range(n // 8):
                lane = (
                    np.uint32(data[b, 2 + 3 * g])
                    | (np.uint32(data[b, 3 + 3 * g]) << np.uint32(8))
                    | (np.uint32(data[b, 4 + 3 * g]) << np.uint32(16))
                )
                for t in range(8):
                    v[8 * g + t] = centroids[(lane >> np.uint32(3 * t)) & np.uint32(7)] * s2[8 * g + t]
        _butterfly(v)
        for j in range(n):
            out[b, j] = (v[j] * cs1[j]) * d
    return out
