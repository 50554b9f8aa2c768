"""numba twins of :mod:`tbq.formats.vllm_turboquant` (same bytes, same float32 bits).

One row is one (token, kv-head) vector of ``D`` values (``D`` = the row
length of ``x`` or ``out``). Every float32 operation is the reference's, in
its order; the float64 steps (the key's norm and rotation, the decoder's
exact sum) are the reference's float64 operations in the same order, the
butterfly :func:`fwht64` being :func:`tbq.rotation.fwht`'s pairs stage by
stage. Any NaN a decoder produces is stored as the fp16 NaN 0x7FFF, as the
reference does (:func:`tbq.formats.vllm_turboquant.rn16`).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels import (
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SCALE_OVERFLOW,
    block_finite,
    f16_is_inf,
    f32_to_f16_bits,
    f32_to_int32,
    jit,
    reader_aux,
    reader_blocks,
    reader_out,
)
from ..packing_kernels import hi4, idx3, lane3, lo4, load_lane3, pair4, store_lane3
from .q4_1_kernels import first_min_max, load_f16_at, store_f16_at

F32 = np.float32
_ONE = F32(1.0)
_HALF = F32(0.5)
_EPS_NORM = F32(1e-8)
_EPS_NC = F32(1e-16)
_F16_NAN = np.uint16(0x7FFF)
_2P24 = np.float64(2.0**24)


@jit
def rn16_bits(f):
    """fp16 bits of float32 ``f`` (round to nearest even), any NaN as 0x7FFF."""
    b = f32_to_f16_bits(f)
    return _F16_NAN if (b & np.uint16(0x7FFF)) > np.uint16(0x7C00) else b


@jit
def fwht64(t):
    """In-place float64 Walsh-Hadamard butterfly (Sylvester order, unnormalised): :func:`tbq.rotation.fwht`'s pairs."""
    n = t.shape[0]
    h = 1
    while h < n:
        for i in range(0, n, 2 * h):
            for j in range(i, i + h):
                a = t[j]
                b = t[j + h]
                t[j] = a + b
                t[j + h] = a - b
        h *= 2


@jit
def _pack_row(idx, out, b, bits, d):
    if bits == 4:
        for t in range(d // 2):
            out[b, t] = pair4(idx[2 * t], idx[2 * t + 1])
    else:
        row = out[b]
        for g in range(d // 8):
            i = 8 * g
            lane = lane3(idx[i], idx[i + 1], idx[i + 2], idx[i + 3], idx[i + 4], idx[i + 5], idx[i + 6], idx[i + 7])
            store_lane3(row, 3 * g, lane)


@jit
def _unpack_row(data, b, bits, idx):
    d = idx.shape[0]
    if bits == 4:
        for t in range(d // 2):
            byte = data[b, t]
            idx[2 * t] = lo4(byte)
            idx[2 * t + 1] = hi4(byte)
    else:
        row = data[b]
        for g in range(d // 8):
            lane = load_lane3(row, 3 * g)
            for s in range(8):
                idx[8 * g + s] = idx3(lane, s)


# --- keys -------------------------------------------------------------------------------------


@jit
def encode_keys(x, out, bits, mids, sh, raise_overflow):
    """Keys: norm (float64, index order), ``xh = x / (n + 1e-8)``, ``y = RN32(butterfly(xh * s * h))`` in float64,
    indices = midpoints ``<= y``, packed, then fp16 ``n``."""
    rows, d = x.shape
    mb = d * bits // 8
    n_mid = mids.shape[0]
    t = np.empty(d, np.float64)
    idx = np.empty(d, np.int32)
    for b in range(rows):
        if not block_finite(x, b):
            return b, STATUS_NONFINITE
        acc = np.float64(0.0)
        for j in range(d):
            v = np.float64(x[b, j])
            acc += v * v
        n = F32(np.sqrt(acc))
        nbits = f32_to_f16_bits(n)
        if raise_overflow and f16_is_inf(nbits):
            return b, STATUS_SCALE_OVERFLOW
        den = F32(n + _EPS_NORM)
        for j in range(d):
            t[j] = np.float64(F32(x[b, j] / den)) * sh[j]
        fwht64(t)
        for j in range(d):
            y = F32(t[j] + 0.0)  # an exact zero sum is +0, as the reference
            c = 0
            for i in range(n_mid):
                if y >= mids[i]:
                    c += 1
            idx[j] = c
        _pack_row(idx, out, b, bits, d)
        store_f16_at(out, b, mb, nbits)
    return -1, STATUS_OK


@jit
def _pw_block(a, lo, n):
    """numpy's pairwise block of ``n`` (8..128, a multiple of 8) float32 values from ``a[lo]``."""
    p0, p1, p2, p3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    p4, p5, p6, p7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    for i in range(lo + 8, lo + n, 8):
        p0 += a[i]
        p1 += a[i + 1]
        p2 += a[i + 2]
        p3 += a[i + 3]
        p4 += a[i + 4]
        p5 += a[i + 5]
        p6 += a[i + 6]
        p7 += a[i + 7]
    return ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))


@jit
def pairwise_sum32(a):
    """numpy's pairwise float32 sum of ``a`` (a power-of-two length >= 8): 128-value blocks, halves added pairwise."""
    n = a.shape[0]
    if n <= 128:
        return _pw_block(a, 0, n)
    m = n // 128
    sums = np.empty(m, np.float32)
    for i in range(m):
        sums[i] = _pw_block(a, 128 * i, 128)
    while m > 1:
        for i in range(m // 2):
            sums[i] = sums[2 * i] + sums[2 * i + 1]
        m //= 2
    return sums[0]


@jit
def round_odd_f32(p, k):
    """``p * 2**k`` (int64 ``p``) rounded to odd at 24 significant bits, as float32 (see ``_round_odd_f32``)."""
    if p == 0:
        return F32(0.0)
    a = p if p > 0 else -p
    e = math.frexp(np.float64(a))[1]
    if (a >> (e - 1)) == 0:
        e -= 1
    d = e - 24 if e > 24 else 0
    m = a >> d
    if (a & ((np.int64(1) << d) - 1)) != 0:
        m |= 1
    f = F32(math.ldexp(np.float64(m), d + k))
    return -f if p < 0 else f


@jit
def unrotate_bits(s, sgn, mant, exp):
    """fp16 bits of the exact ``s * sgn * mant * 2**exp`` (``s`` an exact float64 sum of fp16 values)."""
    if not np.isfinite(s):
        return rn16_bits(F32(s * np.float64(sgn)))
    p = np.int64(s * _2P24) * np.int64(mant) * np.int64(sgn)
    return rn16_bits(round_odd_f32(p, exp - 24))


@jit
def decode_keys(data, out, bits, cents, s16, mant, exp, table, rotated):
    """Keys: NC-corrected centroids times the fp16 norm, rounded to fp16 (``rotated``: stop there), then the exact
    fp16 un-rotation (:func:`fwht64` on the fp16 values, exact, then one rounding)."""
    rows, d = out.shape
    mb = d * bits // 8
    idx = np.empty(d, np.int32)
    c = np.empty(d, np.float32)
    cc = np.empty(d, np.float32)
    t = np.empty(d, np.float64)
    for b in range(rows):
        _unpack_row(data, b, bits, idx)
        for j in range(d):
            c[j] = cents[idx[j]]
            cc[j] = c[j] * c[j]
        s = pairwise_sum32(cc)
        r = F32(_ONE / F32(np.sqrt(F32(s + _EPS_NC))))
        nf = load_f16_at(data, b, mb, table)
        for j in range(d):
            yr = table[np.int64(rn16_bits(F32(nf * F32(c[j] * r))))]
            if rotated:
                out[b, j] = yr
            else:
                t[j] = np.float64(yr)
        if rotated:
            continue
        fwht64(t)
        for j in range(d):
            out[b, j] = table[np.int64(unrotate_bits(t[j], s16[j], mant, exp))]


# --- values -----------------------------------------------------------------------------------


@jit
def encode_values(x, out, bits, raise_overflow, table):
    """Values: ``scale = max(RN32(RN32(max - min) / Q), 1e-8)``, codes ``clamp(trunc(RN32(RN32((v - min) / scale) + 0.5)))``,
    packed, then fp16 scale and fp16 min. ``raise_overflow``: stop at a block whose fp16 scale or minimum is
    infinite or whose top code decodes to an infinite fp16 value (the reference's ``invalid_blocks``)."""
    rows, d = x.shape
    q = (1 << bits) - 1
    qf = F32(q)
    vdb = d * bits // 8
    codes = np.empty(d, np.int32)
    for b in range(rows):
        vmin, vmax, fin = first_min_max(x[b], d)
        if not fin:
            return b, STATUS_NONFINITE
        sc = F32(F32(vmax - vmin) / qf)
        if not (sc > _EPS_NORM):
            sc = _EPS_NORM
        dbits = f32_to_f16_bits(sc)
        mbits = f32_to_f16_bits(vmin)
        if raise_overflow and (f16_is_inf(dbits) or f16_is_inf(mbits)):
            return b, STATUS_SCALE_OVERFLOW
        qmax = 0
        for j in range(d):
            u = F32(F32(F32(x[b, j] - vmin) / sc) + _HALF)
            qi = f32_to_int32(u)
            qi = q if qi > q else qi
            qi = 0 if qi < 0 else qi
            codes[j] = qi
            qmax = qi if qi > qmax else qmax
        if raise_overflow:
            top = F32(F32(F32(qmax) * table[np.int64(dbits)]) + table[np.int64(mbits)])
            if f16_is_inf(f32_to_f16_bits(top)):
                return b, STATUS_SCALE_OVERFLOW
        _pack_row(codes, out, b, bits, d)
        store_f16_at(out, b, vdb, dbits)
        store_f16_at(out, b, vdb + 2, mbits)
    return -1, STATUS_OK


@jit
def decode_values(data, out, bits, table):
    """Values: ``RN16(RN32(code * scale + min))``."""
    rows, d = out.shape
    vdb = d * bits // 8
    codes = np.empty(d, np.int32)
    for b in range(rows):
        sc = load_f16_at(data, b, vdb, table)
        z = load_f16_at(data, b, vdb + 2, table)
        _unpack_row(data, b, bits, codes)
        for j in range(d):
            out[b, j] = table[np.int64(rn16_bits(F32(F32(F32(codes[j]) * sc) + z)))]


# --- the fused attention kernel's readers (tbq.kernels.READER_SIG), original domain -------------


def attention_read_keys(src, dst, n_blocks, aux, n_aux):
    """``n_blocks`` keys decoded as :func:`decode_keys` (model domain); ``aux`` = [D, bits, mant, exp, centroids,
    signs, the f16 table] (:meth:`tbq.formats.vllm_turboquant._Keys.attention_tables`)."""
    a = reader_aux(aux, n_aux)
    d = np.int64(a[0])
    bits = np.int64(a[1])
    n_c = np.int64(1) << bits
    s16 = np.empty(d, np.int64)
    for j in range(d):
        s16[j] = np.int64(a[4 + n_c + j])
    decode_keys(
        reader_blocks(src, n_blocks, d * bits // 8 + 2),
        reader_out(dst, n_blocks, d),
        bits,
        a[4 : 4 + n_c],
        s16,
        np.int64(a[2]),
        np.int64(a[3]),
        a[4 + n_c + d :],
        False,
    )


def attention_read_values(src, dst, n_blocks, aux, n_aux):
    """``n_blocks`` values decoded as :func:`decode_values`; ``aux`` = [D, bits, the f16 table]."""
    a = reader_aux(aux, n_aux)
    d = np.int64(a[0])
    bits = np.int64(a[1])
    decode_values(reader_blocks(src, n_blocks, d * bits // 8 + 4), reader_out(dst, n_blocks, d), bits, a[2:])
