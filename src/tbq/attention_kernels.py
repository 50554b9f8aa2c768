"""numba kernel of the fused rotated-domain attention (:func:`tbq.attention.attention_rotated`, ``backend="numba"``).

One call handles one KV head and a range of tokens for all the query heads
that share that KV head (GQA: each cache block is read once for all of them),
with a one-pass online softmax over chunks of ``chunk`` tokens
(flash-decoding): per chunk it computes the raw scores, updates the running
maximum ``m``, rescales the running sum ``l`` and the accumulators by
``exp(m_old - m_new)``, and adds ``p_t = exp(s_t - m)`` times the value rows.
The caller splits the tokens of long caches into ranges, runs them on
threads (the kernel releases the GIL) and merges the partial ``(m, l, acc)``.

How each cache is read (``kind``):

- ``KIND_TBQ4`` / ``KIND_TBQ3``: straight from the blocks, in the rotated
  domain. A key block contributes ``d * (q' . c[idx])`` with ``q' = R(q)``
  rotated once by the caller; a value block adds ``(p_t * d) * c[idx]`` to a
  rotated-domain accumulator that the caller rotates back once. The indices
  are looked up two at a time in a pair table (``(c[lo], c[hi])`` per byte for
  4 bits, per 6-bit pair for 3 bits).
- ``KIND_Q8_0`` / ``KIND_Q4_0``: in the original domain, ``code * d`` (exact
  in float32) read from the blocks.
- ``KIND_DENSE``: float32 rows (the sink tokens, and formats without a
  dedicated path, which the caller decodes).

No dequantize pass, no float copy of a TBQ/Q8_0/Q4_0 cache: a chunk of
``chunk`` tokens is decoded into a scratch of ``128 x chunk`` floats that
stays in L1. Keys are decoded transposed (``B[j, t]``) so that a score
``sum_j q_j k_tj`` is a sequential sum over ``j`` for every token while the
loop runs SIMD across tokens (the TBQ codec kernels' lane trick); values are
decoded by rows so that the accumulation runs SIMD along the head dimension.

The exponential is :func:`expf` below (Cody-Waite reduction and a degree-6
polynomial, float32, branch-free so it vectorises; within 1 ulp of the
exact ``exp`` on ``[-87.3, 0]`` (0.97 ulp measured on 3 million points), 0 below). Every operation is a
plain float32 operation (no fastmath), so results do not depend on the
machine; they differ from the float64 reference by the float32 roundings
that :func:`tbq.attention.f32_tolerance` bounds.
"""

from __future__ import annotations

import numpy as np

from .kernels import jit

F32 = np.float32
_0 = F32(0.0)
_1 = F32(1.0)
_NEG_INF = F32(-np.inf)

KIND_DENSE = 0
KIND_TBQ4 = 1
KIND_TBQ3 = 2
KIND_Q8_0 = 3
KIND_Q4_0 = 4

#: Tokens per online-softmax chunk: the key/value scratch (128 x CHUNK float32, 32 KiB) stays in L1.
CHUNK = 64

# expf constants (Cephes): log2(e), ln2 split in a part exact in float32 and the rest
_LOG2E = F32(1.44269504088896341)
_LN2_HI = F32(0.693359375)
_LN2_LO = F32(-2.12194440e-4)
_EXP_LO = F32(-87.33654)  # below: the result is 0 (float32 exp(-87.34) is the smallest normal)
_P0 = F32(1.9875691500e-4)
_P1 = F32(1.3981999507e-3)
_P2 = F32(8.3334519073e-3)
_P3 = F32(4.1665795894e-2)
_P4 = F32(1.6666665459e-1)
_P5 = F32(5.0000001201e-1)
_HALF = F32(0.5)


@jit
def expf(x):
    """float32 ``exp(x)`` for ``x <= 0`` (softmax arguments): 0 below -87.34, within 1 ulp above.

    ``x = k ln2 + r`` with ``|r| <= ln2/2`` (Cody-Waite, two float32 parts of
    ln2), ``exp(r)`` by Cephes' degree-6 polynomial, and ``2**k`` built in
    the exponent bits. Branch-free (selects only), so loops over it vectorise.
    """
    xc = x if x > _EXP_LO else _EXP_LO
    k = np.floor(xc * _LOG2E + _HALF)
    r = xc - k * _LN2_HI
    r = r - k * _LN2_LO
    rr = r * r
    p = _P0
    p = p * r + _P1
    p = p * r + _P2
    p = p * r + _P3
    p = p * r + _P4
    p = p * r + _P5
    p = p * rr + r
    p = p + _1
    two_k = (np.int32(k) + np.int32(127)) << 23
    y = p * np.int32(two_k).view(np.float32)
    return y if x > _EXP_LO else _0


@jit
def _load_keys(kind, data, dense, pair, f16, g, c0, n, b, ts, D, B, DB):
    """Decode block ``b`` (TBQ) or the whole row (other kinds) of tokens ``c0 .. c0+n`` transposed into ``B[j, t]``.

    TBQ: ``B[j, t] = c[idx_j]`` and ``DB[t]`` the block's scale. Q8_0/Q4_0/dense:
    ``B[j, t]`` the exact float32 value of channel ``j``.
    """
    if kind == KIND_TBQ4:
        off = b * ts
        for t in range(n):
            row = data[c0 + t, g]
            DB[t] = f16[np.int64(row[off]) | (np.int64(row[off + 1]) << 8)]
            for k in range(64):
                byte = np.int64(row[off + 2 + k])
                B[2 * k, t] = pair[byte, 0]
                B[2 * k + 1, t] = pair[byte, 1]
    elif kind == KIND_TBQ3:
        off = b * ts
        for t in range(n):
            row = data[c0 + t, g]
            DB[t] = f16[np.int64(row[off]) | (np.int64(row[off + 1]) << 8)]
            for lg in range(16):
                o = off + 2 + 3 * lg
                lane = np.int64(row[o]) | (np.int64(row[o + 1]) << 8) | (np.int64(row[o + 2]) << 16)
                j = 8 * lg
                for u in range(4):
                    pr = (lane >> (6 * u)) & 63
                    B[j + 2 * u, t] = pair[pr, 0]
                    B[j + 2 * u + 1, t] = pair[pr, 1]
    elif kind == KIND_Q8_0:
        for t in range(n):
            row = data[c0 + t, g]
            for blk in range(D // 32):
                off = 34 * blk
                d = f16[np.int64(row[off]) | (np.int64(row[off + 1]) << 8)]
                for j in range(32):
                    B[32 * blk + j, t] = F32(np.int8(row[off + 2 + j])) * d
    elif kind == KIND_Q4_0:
        for t in range(n):
            row = data[c0 + t, g]
            for blk in range(D // 32):
                off = 18 * blk
                d = f16[np.int64(row[off]) | (np.int64(row[off + 1]) << 8)]
                for j in range(16):
                    v = np.int32(row[off + 2 + j])
                    B[32 * blk + j, t] = F32((v & 15) - 8) * d
                    B[32 * blk + j + 16, t] = F32((v >> 4) - 8) * d
    else:
        for t in range(n):
            src = dense[c0 + t, g]
            for j in range(D):
                B[j, t] = src[j]


@jit
def _load_values(kind, data, dense, pair, f16, g, c0, n, b, ts, D, V, DV):
    """Decode values by rows: ``V[t, j]`` (block ``b`` of TBQ, with ``DV[t]`` its scale; whole rows otherwise)."""
    if kind == KIND_TBQ4:
        off = b * ts
        for t in range(n):
            row = data[c0 + t, g]
            DV[t] = f16[np.int64(row[off]) | (np.int64(row[off + 1]) << 8)]
            vt = V[t]
            for k in range(64):
                byte = np.int64(row[off + 2 + k])
                vt[2 * k] = pair[byte, 0]
                vt[2 * k + 1] = pair[byte, 1]
    elif kind == KIND_TBQ3:
        off = b * ts
        for t in range(n):
            row = data[c0 + t, g]
            DV[t] = f16[np.int64(row[off]) | (np.int64(row[off + 1]) << 8)]
            vt = V[t]
            for lg in range(16):
                o = off + 2 + 3 * lg
                lane = np.int64(row[o]) | (np.int64(row[o + 1]) << 8) | (np.int64(row[o + 2]) << 16)
                j = 8 * lg
                for u in range(4):
                    pr = (lane >> (6 * u)) & 63
                    vt[j + 2 * u] = pair[pr, 0]
                    vt[j + 2 * u + 1] = pair[pr, 1]
    elif kind == KIND_Q8_0:
        for t in range(n):
            row = data[c0 + t, g]
            vt = V[t]
            for blk in range(D // 32):
                off = 34 * blk
                d = f16[np.int64(row[off]) | (np.int64(row[off + 1]) << 8)]
                for j in range(32):
                    vt[32 * blk + j] = F32(np.int8(row[off + 2 + j])) * d
    elif kind == KIND_Q4_0:
        for t in range(n):
            row = data[c0 + t, g]
            vt = V[t]
            for blk in range(D // 32):
                off = 18 * blk
                d = f16[np.int64(row[off]) | (np.int64(row[off + 1]) << 8)]
                for j in range(16):
                    v = np.int32(row[off + 2 + j])
                    vt[32 * blk + j] = F32((v & 15) - 8) * d
                    vt[32 * blk + j + 16] = F32((v >> 4) - 8) * d
    else:
        for t in range(n):
            src = dense[c0 + t, g]
            vt = V[t]
            for j in range(D):
                vt[j] = src[j]


@jit
def attend(
    qr, qo, scale,
    kind_k, kdata, kdense, kpair, kts,
    kind_v, vdata, vdense, vpair, vts,
    f16, g, t0, t1, chunk,
    m_out, l_out, accr, acco,
):
    """Attention of the query heads ``qr``/``qo`` (R, D) over tokens ``t0 .. t1`` of KV head ``g``.

    ``qr``: the queries rotated per 128-value block with the K cache's rotation
    (read for TBQ keys); ``qo``: the queries as given (other keys); ``scale``:
    the softmax scale. ``kdata``/``vdata``: uint8 ``(T, G, row_bytes)`` blocks,
    ``kdense``/``vdense``: float32 ``(T, G, D)`` rows (``KIND_DENSE``),
    ``kpair``/``vpair``: float32 pair tables of the TBQ codebooks, ``kts``/``vts``:
    bytes per block, ``f16``: :func:`tbq.half.f16_table`.

    Writes the running maximum ``m_out`` (R,), the sum ``l_out`` (R,) of
    ``exp(s_t - m)`` and the unnormalised sums ``accr`` (R, D; rotated
    domain, TBQ values) and ``acco`` (R, D; original domain, other values),
    all float32. The attention output is ``(R^-1(accr) + acco) / l``.
    """
    R = qo.shape[0]
    D = qo.shape[1]
    nbk = D // 128
    rows = D if D > 128 else 128
    B = np.empty((rows, chunk), np.float32)
    DB = np.empty(chunk, np.float32)
    V = np.empty((chunk, rows), np.float32)
    S = np.empty((R, chunk), np.float32)
    P = np.empty(chunk, np.float32)
    for r in range(R):
        m_out[r] = _NEG_INF
        l_out[r] = _0
        for j in range(D):
            accr[r, j] = _0
            acco[r, j] = _0
    rotated_k = kind_k == KIND_TBQ4 or kind_k == KIND_TBQ3
    rotated_v = kind_v == KIND_TBQ4 or kind_v == KIND_TBQ3
    for c0 in range(t0, t1, chunk):
        n = min(chunk, t1 - c0)
        # scores s[r, t] = scale * q . k_t
        for r in range(R):
            for t in range(n):
                S[r, t] = _0
        if rotated_k:
            for b in range(nbk):
                _load_keys(kind_k, kdata, kdense, kpair, f16, g, c0, n, b, kts, D, B, DB)
                for r in range(R):
                    for t in range(n):
                        P[t] = _0
                    for j in range(128):  # sequential in j for every token, SIMD across tokens
                        qv = qr[r, 128 * b + j]
                        bj = B[j]
                        for t in range(n):
                            P[t] += qv * bj[t]
                    sr = S[r]
                    for t in range(n):  # score = sum over blocks of d_b * (q'_b . c_b)
                        sr[t] += DB[t] * P[t]
        else:
            _load_keys(kind_k, kdata, kdense, kpair, f16, g, c0, n, 0, kts, D, B, DB)
            for r in range(R):
                sr = S[r]
                for j in range(D):
                    qv = qo[r, j]
                    bj = B[j]
                    for t in range(n):
                        sr[t] += qv * bj[t]
        # online softmax: new maximum, rescale what was accumulated, p_t = exp(s_t - m)
        for r in range(R):
            sr = S[r]
            for t in range(n):
                sr[t] = sr[t] * scale
            mc = m_out[r]
            for t in range(n):
                mc = sr[t] if sr[t] > mc else mc
            if mc > m_out[r]:
                if l_out[r] != _0:
                    alpha = expf(m_out[r] - mc)
                    l_out[r] *= alpha
                    for j in range(D):
                        accr[r, j] *= alpha
                        acco[r, j] *= alpha
                m_out[r] = mc
            for t in range(n):  # SIMD (the sum below is a separate, sequential loop)
                sr[t] = expf(sr[t] - mc)
            ls = _0
            for t in range(n):
                ls += sr[t]
            l_out[r] += ls
        # values: acc += p_t * v_t
        if rotated_v:
            for b in range(nbk):
                _load_values(kind_v, vdata, vdense, vpair, f16, g, c0, n, b, vts, D, V, DB)
                for t in range(n):
                    vt = V[t]
                    for r in range(R):
                        w = S[r, t] * DB[t]  # (p_t * d_t) * c[idx_t], as the model
                        ar = accr[r]
                        for j in range(128):
                            ar[128 * b + j] += w * vt[j]
        else:
            _load_values(kind_v, vdata, vdense, vpair, f16, g, c0, n, 0, vts, D, V, DB)
            for t in range(n):
                vt = V[t]
                for r in range(R):
                    w = S[r, t]
                    ar = acco[r]
                    for j in range(D):
                        ar[j] += w * vt[j]
