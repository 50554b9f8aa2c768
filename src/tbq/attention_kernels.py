"""numba kernel of the fused attention (:func:`tbq.attention.attention_fused`, ``attention_rotated(..., backend="numba")``).

One call handles a range of tokens of every KV head, for all the query rows
that share each KV head (GQA: the query heads of a KV head, times the query
tokens of a prefill call), with a one-pass online softmax over chunks of
``chunk`` tokens (flash-decoding): per chunk it computes the raw scores,
updates the running maximum ``m``, rescales the running sum ``l`` and the
accumulator by ``exp(m_old - m_new)``, and adds ``p_t = exp(s_t - m)`` times
the value rows. The caller splits the tokens into ranges that depend on the
cache length only, runs them on threads (the kernel releases the GIL) and
merges the partial ``(m, l, acc)`` in range order, so the result does not
depend on the number of threads, bit for bit.

No per-format code: the kernel reads every cache through its format's
*attention reader* (:meth:`tbq.formats.base.Format.attention_reader`), a
C-callable function of one signature (:data:`tbq.kernels.READER_SIG`) that
decodes the blocks of one row (a token's ``head_dim`` values of one KV head)
into float32, in the format's ``attention_domain``: the original domain (the
decoder's exact bits) or, for TBQ, the rotated domain (``c[idx] * d``; the
caller rotates the query once and the output back once). Readers are
run-time arguments (their C addresses, called through
:func:`tbq.kernels.call_reader`), so this kernel is compiled (and cached) once
for every pair of formats, and each format's reader only when it is read.
Float32 rows (sink tokens, exact references) go through :func:`read_f32_rows`.

No dequantize pass, no float copy of the cache: a chunk of ``chunk`` tokens
(all KV heads: consecutive blocks in the cache) is decoded by one reader call
into a scratch of ``chunk x n_head_kv x head_dim`` floats that stays in L2,
and each decoded key serves every query row of its KV head. Keys
are then transposed (``B[j, t]``, 8 x 8 tiles at a time) so that the loop of a
score ``sum_j q_j k_tj`` runs SIMD across tokens; values stay by rows so that
the accumulation runs SIMD along the head dimension. Sums take two channels
(or two tokens) per step, so their order differs from the NumPy model's
strictly sequential one; the float32 error stays within
:func:`tbq.attention.f32_tolerance` (measured in tests/test_attention_kernel.py).

A causal call gives each query row the end of the tokens it sees (``lim``);
later tokens get a score of ``-inf`` (weight 0).

The exponential is :func:`expf` below (Cody-Waite reduction and a degree-6
polynomial, float32, branch-free so it vectorises; within 1 ulp of the
exact ``exp`` on ``[-87.3, 0]`` (0.97 ulp measured on 3 million points), 0 below). Every operation is a
plain float32 operation (no fastmath), so results do not depend on the
machine; they differ from the float64 reference by the float32 roundings
that :func:`tbq.attention.f32_tolerance` bounds.
"""

from __future__ import annotations

import numpy as np

from .kernels import address, call_reader, jit, reader_aux, reader_blocks, transpose8

F32 = np.float32
_0 = F32(0.0)
_1 = F32(1.0)
_NEG_INF = F32(-np.inf)

#: Tokens per online-softmax chunk: the key and value scratch (CHUNK x n_head_kv x head_dim float32 each, 256 KiB
#: at 8 x 128) stay in L2.
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


def read_f32_rows(src, dst, n_blocks, aux, n_aux):
    """The attention reader (:data:`tbq.kernels.READER_SIG`) of float32 rows: ``n_blocks`` values copied."""
    v = reader_blocks(src, n_blocks, 4).reshape(4 * n_blocks).view(np.float32)
    out = reader_aux(dst, n_blocks)
    for j in range(n_blocks):
        out[j] = v[j]


@jit
def attend(
    Q,
    lim,
    scale,
    read_k,
    kdata,
    kaux,
    kblocks,
    read_v,
    vdata,
    vaux,
    vblocks,
    t0,
    t1,
    chunk,
    M,
    L,
    ACC,
):
    """Attention over tokens ``t0 .. t1`` of every KV head, for the query rows of each.

    ``Q``: float32 ``(G, RQ, D)``, the ``RQ`` query rows of each of the ``G``
    KV heads (in the K reader's domain); ``lim``: int64 ``(RQ,)``, row ``r``
    sees tokens ``< lim[r]`` (``lim >= t1``: all); ``scale``: the softmax scale.
    ``read_k``/``read_v``: the readers' C addresses (``cfunc.address``,
    called by :func:`tbq.kernels.call_reader`), ``kdata``/``vdata`` uint8 ``(T, G,
    row_bytes)`` C-contiguous, ``kaux``/``vaux`` their float32 tables,
    ``kblocks``/``vblocks`` blocks per row.

    Tokens are the outer loop and KV heads the inner one, so the bytes of a
    chunk of tokens (all heads, contiguous in the cache) are read from memory
    once. Writes, per KV head ``g``: the running maximum ``M[g]`` (RQ,), the
    sum ``L[g]`` of ``exp(s_t - m)`` and the unnormalised sum ``ACC[g]`` (RQ,
    D) of ``exp(s_t - m) v_t`` in the V reader's domain, all float32.
    """
    G = Q.shape[0]
    RQ = Q.shape[1]
    D = Q.shape[2]
    K = np.empty((chunk, G, D), np.float32)  # a chunk of tokens of every head, decoded by one reader call
    B = np.empty((D, chunk), np.float32)
    V = np.empty((chunk, G, D), np.float32)
    S = np.empty((RQ, chunk), np.float32)
    kp = address(kaux)
    vp = address(vaux)
    nka = kaux.shape[0]
    nva = vaux.shape[0]
    for g in range(G):
        for r in range(RQ):
            M[g, r] = _NEG_INF
            L[g, r] = _0
            for j in range(D):
                ACC[g, r, j] = _0
    for c0 in range(t0, t1, chunk):
        n = min(chunk, t1 - c0)
        n8 = n - n % 8 if D % 8 == 0 else 0
        # the chunk's rows of all heads are contiguous in the cache: one reader call for K and one for V
        call_reader(read_k, address(kdata[c0]), address(K), n * G * kblocks, kp, nka)
        call_reader(read_v, address(vdata[c0]), address(V), n * G * vblocks, vp, nva)
        for g in range(G):
            qo = Q[g]
            m_out = M[g]
            l_out = L[g]
            acc = ACC[g]
            # keys: transpose (8 x 8 tiles), scores s[r, t] = scale * q . k_t SIMD across tokens
            for t in range(0, n8, 8):
                for j in range(0, D, 8):
                    transpose8(K, (t * G + g) * D + j, G * D, B, j * chunk + t, chunk)
            for t in range(n8, n):
                kt = K[t, g]
                for j in range(D):
                    B[j, t] = kt[j]
            for r in range(RQ):
                sr = S[r]
                for t in range(n):
                    sr[t] = _0
                D8 = D - D % 8
                for j in range(0, D8, 8):  # eight channels per pass over the tokens (SIMD across tokens)
                    q0 = qo[r, j]
                    q1 = qo[r, j + 1]
                    q2 = qo[r, j + 2]
                    q3 = qo[r, j + 3]
                    q4 = qo[r, j + 4]
                    q5 = qo[r, j + 5]
                    q6 = qo[r, j + 6]
                    q7 = qo[r, j + 7]
                    b0 = B[j]
                    b1 = B[j + 1]
                    b2 = B[j + 2]
                    b3 = B[j + 3]
                    b4 = B[j + 4]
                    b5 = B[j + 5]
                    b6 = B[j + 6]
                    b7 = B[j + 7]
                    for t in range(n):
                        sr[t] += ((q0 * b0[t] + q1 * b1[t]) + (q2 * b2[t] + q3 * b3[t])) + (
                            (q4 * b4[t] + q5 * b5[t]) + (q6 * b6[t] + q7 * b7[t])
                        )
                for j in range(D8, D):
                    qv = qo[r, j]
                    bj = B[j]
                    for t in range(n):
                        sr[t] += qv * bj[t]
            # online softmax: new maximum, rescale what was accumulated, p_t = exp(s_t - m)
            for r in range(RQ):
                sr = S[r]
                for t in range(n):
                    sr[t] = sr[t] * scale
                if lim[r] < c0 + n:  # causal: the tokens after this row's own are not seen
                    for t in range(max(0, lim[r] - c0), n):
                        sr[t] = _NEG_INF
                mc = m_out[r]
                for t in range(n):
                    mc = sr[t] if sr[t] > mc else mc
                if mc == _NEG_INF:  # nothing seen yet: weights 0
                    for t in range(n):
                        sr[t] = _0
                    continue
                if mc > m_out[r]:
                    if l_out[r] != _0:
                        alpha = expf(m_out[r] - mc)
                        l_out[r] *= alpha
                        ar = acc[r]
                        for j in range(D):
                            ar[j] *= alpha
                    m_out[r] = mc
                for t in range(n):  # SIMD (the sum below is a separate, sequential loop)
                    sr[t] = expf(sr[t] - mc)
                ls = _0
                for t in range(n):
                    ls += sr[t]
                l_out[r] += ls
            # values: acc += p_t * v_t
            t = 0
            while t + 3 < n:  # four tokens per pass over the accumulator (SIMD along the head dimension)
                v0 = V[t, g]
                v1 = V[t + 1, g]
                v2 = V[t + 2, g]
                v3 = V[t + 3, g]
                for r in range(RQ):
                    w0 = S[r, t]
                    w1 = S[r, t + 1]
                    w2 = S[r, t + 2]
                    w3 = S[r, t + 3]
                    ar = acc[r]
                    for j in range(D):
                        ar[j] += (w0 * v0[j] + w1 * v1[j]) + (w2 * v2[j] + w3 * v3[j])
                t += 4
            while t < n:
                vt = V[t, g]
                for r in range(RQ):
                    w = S[r, t]
                    ar = acc[r]
                    for j in range(D):
                        ar[j] += w * vt[j]
                t += 1
