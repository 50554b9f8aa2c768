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
  4 bits, per 6-bit pair for 3 bits), one 8-byte copy per pair.
- ``KIND_Q8_0`` / ``KIND_Q4_0``: in the original domain, ``code * d`` (exact
  in float32) read from the blocks.
- ``KIND_DENSE``: float32 rows (the sink tokens, and formats without a
  dedicated path, which the caller decodes).

No dequantize pass, no float copy of a TBQ/Q8_0/Q4_0 cache: a chunk of
``chunk`` tokens is decoded into a scratch of ``128 x chunk`` floats that
stays in L1. Keys are decoded transposed (``B[j, t]``) so that the loop of a
score ``sum_j q_j k_tj`` runs SIMD across tokens (the TBQ codec kernels' lane
trick); values are decoded by rows so that the accumulation runs SIMD along
the head dimension. Sums take two channels (or two tokens) per step, so their
order differs from the NumPy model's strictly sequential one; the float32
error stays within :func:`tbq.attention.f32_tolerance` (measured in
tests/test_attention_kernel.py: under 0.4 of it).

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
def _tbq_scale(row, off, f16):
    return f16[np.int64(row[off]) | (np.int64(row[off + 1]) << 8)]


@jit
def _load_key_pairs(kind, data, pair64, f16, g, c0, n, b, ts, B64, DB):
    """TBQ keys of tokens ``c0 .. c0+n``, block ``b``: ``B64[k, t]`` holds the centroids of channels 2k
    and 2k+1 of token t (one 8-byte copy from the pair table per byte of indices); ``DB[t]`` the scale."""
    off = b * ts
    if kind == KIND_TBQ4:
        for t in range(n):
            row = data[c0 + t, g]
            DB[t] = _tbq_scale(row, off, f16)
            for k in range(64):
                B64[k, t] = pair64[np.int64(row[off + 2 + k])]
    else:
        for t in range(n):
            row = data[c0 + t, g]
            DB[t] = _tbq_scale(row, off, f16)
            for lg in range(16):
                o = off + 2 + 3 * lg
                lane = np.int64(row[o]) | (np.int64(row[o + 1]) << 8) | (np.int64(row[o + 2]) << 16)
                B64[4 * lg, t] = pair64[lane & 63]
                B64[4 * lg + 1, t] = pair64[(lane >> 6) & 63]
                B64[4 * lg + 2, t] = pair64[(lane >> 12) & 63]
                B64[4 * lg + 3, t] = pair64[(lane >> 18) & 63]


@jit
def _load_value_pairs(kind, data, pair64, f16, g, c0, n, b, ts, V64, DV):
    """TBQ values by rows: ``V64[t, k]`` holds the centroids of channels 2k and 2k+1 of token t."""
    off = b * ts
    if kind == KIND_TBQ4:
        for t in range(n):
            row = data[c0 + t, g]
            DV[t] = _tbq_scale(row, off, f16)
            vt = V64[t]
            for k in range(64):
                vt[k] = pair64[np.int64(row[off + 2 + k])]
    else:
        for t in range(n):
            row = data[c0 + t, g]
            DV[t] = _tbq_scale(row, off, f16)
            vt = V64[t]
            for lg in range(16):
                o = off + 2 + 3 * lg
                lane = np.int64(row[o]) | (np.int64(row[o + 1]) << 8) | (np.int64(row[o + 2]) << 16)
                vt[4 * lg] = pair64[lane & 63]
                vt[4 * lg + 1] = pair64[(lane >> 6) & 63]
                vt[4 * lg + 2] = pair64[(lane >> 12) & 63]
                vt[4 * lg + 3] = pair64[(lane >> 18) & 63]


@jit
def _load_keys(kind, data, dense, f16, g, c0, n, D, B):
    """Decode the rows of tokens ``c0 .. c0+n`` (Q8_0, Q4_0, dense) transposed into ``B[j, t]``: exact float32 values."""
    if kind == KIND_DENSE:
        for t in range(n):
            src = dense[c0 + t, g]
            for j in range(D):
                B[j, t] = src[j]
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


@jit
def _load_values(kind, data, dense, f16, g, c0, n, D, V):
    """Decode the rows of tokens ``c0 .. c0+n`` (Q8_0, Q4_0, dense) into ``V[t, j]``: exact float32 values."""
    if kind == KIND_DENSE:
        for t in range(n):
            src = dense[c0 + t, g]
            vt = V[t]
            for j in range(D):
                vt[j] = src[j]
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


@jit
def attend(
    QR, QO, scale,
    kind_k, kdata, kdense, kpair, kts,
    kind_v, vdata, vdense, vpair, vts,
    f16, g0, g1, t0, t1, chunk,
    M, L, AR, AO,
):
    """Attention over tokens ``t0 .. t1`` of KV heads ``g0 .. g1``, for the query heads of each.

    ``QR``: the queries ``(G, R, D)`` (R query heads per KV head) rotated per
    128-value block with the K cache's rotation (read for TBQ keys); ``QO``:
    the queries as given (other keys); ``scale``: the softmax scale.
    ``kdata``/``vdata``: uint8 ``(T, G, row_bytes)`` blocks, ``kdense``/``vdense``:
    float32 ``(T, G, D)`` rows (``KIND_DENSE``), ``kpair``/``vpair``: float32
    pair tables of the TBQ codebooks, ``kts``/``vts``: bytes per block, ``f16``:
    :func:`tbq.half.f16_table`.

    Tokens are the outer loop and KV heads the inner one, so the bytes of a
    chunk of tokens (all heads, contiguous in the cache) are read from memory
    once. Writes, per KV head ``g`` (row ``g - g0``): the running maximum
    ``M`` (., R), the sum ``L`` (., R) of ``exp(s_t - m)`` and the
    unnormalised sums ``AR`` (., R, D; rotated domain, TBQ values) and ``AO``
    (., R, D; original domain, other values), all float32. The attention
    output of a head is ``(R^-1(accr) + acco) / l``.
    """
    R = QO.shape[1]
    D = QO.shape[2]
    nbk = D // 128
    rows = D if D > 128 else 128
    B = np.empty((rows, chunk), np.float32)
    DB = np.empty(chunk, np.float32)
    V = np.empty((chunk, rows), np.float32)
    S = np.empty((R, chunk), np.float32)
    B64 = np.empty((64, chunk), np.uint64)
    Bf = B64.view(np.float32)  # (64, 2 * chunk): channel 2k of token t at [k, 2t], channel 2k+1 at [k, 2t+1]
    V64 = np.empty((chunk, 64), np.uint64)
    Vf = V64.view(np.float32)  # (chunk, 128): the channels of token t in order
    P2 = np.empty(2 * chunk, np.float32)
    kp64 = kpair.view(np.uint64).reshape(kpair.shape[0])
    vp64 = vpair.view(np.uint64).reshape(vpair.shape[0])
    for i in range(g1 - g0):
        for r in range(R):
            M[i, r] = _NEG_INF
            L[i, r] = _0
            for j in range(D):
                AR[i, r, j] = _0
                AO[i, r, j] = _0
    rotated_k = kind_k == KIND_TBQ4 or kind_k == KIND_TBQ3
    rotated_v = kind_v == KIND_TBQ4 or kind_v == KIND_TBQ3
    for c0 in range(t0, t1, chunk):
        n = min(chunk, t1 - c0)
        for g in range(g0, g1):
            qr = QR[g]
            qo = QO[g]
            m_out = M[g - g0]
            l_out = L[g - g0]
            accr = AR[g - g0]
            acco = AO[g - g0]
            # scores s[r, t] = scale * q . k_t
            for r in range(R):
                for t in range(n):
                    S[r, t] = _0
            if rotated_k:
                for b in range(nbk):
                    _load_key_pairs(kind_k, kdata, kp64, f16, g, c0, n, b, kts, B64, DB)
                    for r in range(R):
                        for u in range(2 * n):
                            P2[u] = _0
                        for k in range(0, 64, 2):  # even and odd channels in two partial sums, SIMD across tokens
                            qe0 = qr[r, 128 * b + 2 * k]
                            qo0 = qr[r, 128 * b + 2 * k + 1]
                            qe1 = qr[r, 128 * b + 2 * k + 2]
                            qo1 = qr[r, 128 * b + 2 * k + 3]
                            b0 = Bf[k]
                            b1 = Bf[k + 1]
                            for t in range(n):
                                P2[2 * t] += qe0 * b0[2 * t] + qe1 * b1[2 * t]
                                P2[2 * t + 1] += qo0 * b0[2 * t + 1] + qo1 * b1[2 * t + 1]
                        sr = S[r]
                        for t in range(n):  # score = sum over blocks of d_b * (q'_b . c_b)
                            sr[t] += DB[t] * (P2[2 * t] + P2[2 * t + 1])
            else:
                _load_keys(kind_k, kdata, kdense, f16, g, c0, n, D, B)
                for r in range(R):
                    sr = S[r]
                    for j in range(0, D - 1, 2):  # two channels per pass over the tokens, SIMD across tokens
                        q0 = qo[r, j]
                        q1 = qo[r, j + 1]
                        b0 = B[j]
                        b1 = B[j + 1]
                        for t in range(n):
                            sr[t] += q0 * b0[t] + q1 * b1[t]
                    if D % 2:
                        qv = qo[r, D - 1]
                        bj = B[D - 1]
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
                    _load_value_pairs(kind_v, vdata, vp64, f16, g, c0, n, b, vts, V64, DB)
                    t = 0
                    while t + 1 < n:  # two tokens per pass over the accumulator
                        v0 = Vf[t]
                        v1 = Vf[t + 1]
                        for r in range(R):
                            w0 = S[r, t] * DB[t]  # (p_t * d_t) * c[idx_t], as the model
                            w1 = S[r, t + 1] * DB[t + 1]
                            ar = accr[r]
                            for j in range(128):
                                ar[128 * b + j] += w0 * v0[j] + w1 * v1[j]
                        t += 2
                    if t < n:
                        vt = Vf[t]
                        for r in range(R):
                            w = S[r, t] * DB[t]
                            ar = accr[r]
                            for j in range(128):
                                ar[128 * b + j] += w * vt[j]
            else:
                _load_values(kind_v, vdata, vdense, f16, g, c0, n, D, V)
                t = 0
                while t + 1 < n:
                    v0 = V[t]
                    v1 = V[t + 1]
                    for r in range(R):
                        w0 = S[r, t]
                        w1 = S[r, t + 1]
                        ar = acco[r]
                        for j in range(D):
                            ar[j] += w0 * v0[j] + w1 * v1[j]
                    t += 2
                if t < n:
                    vt = V[t]
                    for r in range(R):
                        w = S[r, t]
                        ar = acco[r]
                        for j in range(D):
                            ar[j] += w * vt[j]
