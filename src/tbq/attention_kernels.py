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
*attention reader* (:meth:`tbq.formats.capabilities.AttentionTraits.reader`), a
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
and each decoded key serves every query row of its KV head. The query rows
go four at a time through two register-blocked microkernels (LLVM IR with
explicit 8-float vectors, :func:`_scores4` and :func:`_values4`): the scores
transpose 8 x 8 tiles of keys in registers so that the loop of a score
``sum_j q_j k_tj`` runs SIMD across tokens with four rows' sums held in
registers, and the values accumulate SIMD along the head dimension with a
cache line of four rows' accumulators held in registers over the chunk; the
softmax's running maximum and sum of weights, sequential chains over the
tokens, run for four rows side by side (:func:`_fold4`). Two kernels:
:func:`attend`, for a head dimension that is a multiple of 16 (every
model's), runs every row through the microkernels (1 to 4 rows a call, the
last scores from a padded vector of 8 tokens); :func:`attend_any`, for any
head dimension, leaves the rows and tokens over to scalar loops of the same
operations, and is compiled only when such a head dimension is met. Every element
sees the same float32 operations in the same order on either path: a score
is 0 plus, per group of eight channels in order, the tree ``((q0 k0 + q1 k1)
+ (q2 k2 + q3 k3)) + ((q4 k4 + q5 k5) + (q6 k6 + q7 k7))`` (the channels left
over one by one), and an accumulator adds ``(w0 v0 + w1 v1) + (w2 v2 + w3 v3)``
four tokens at a time (the tokens left over one by one). This order differs
from the NumPy model's strictly sequential one; the float32 error stays within
:func:`tbq.attention.f32_tolerance` (measured in tests/test_attention_kernel.py,
which also checks the order itself against a naive model, bit for bit).

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

from typing import Any

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .kernels import address, call_reader, jit, reader_aux, reader_blocks, transpose8, transpose8_vectors

F32 = np.float32
_0 = F32(0.0)
_1 = F32(1.0)
_NEG_INF = F32(-np.inf)

#: Kernels compiled only for unusual shapes (a head dimension that is no multiple of 16): left out of the compile
#: cost :func:`tbq.compare.warm_up` balances its cold-start processes by
_LAZY_KERNELS = ("attend_any",)

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
    """:func:`attend_any` for a head dimension that is a multiple of 16 and a chunk that is a multiple of 8 (every
    model's, and what the caller checks), with the same arguments and exactly the same operations: every query
    row goes through the register-blocked microkernels, 1 to 4 rows a call. The tokens of a chunk past its last
    multiple of 8 get their scores from a full 8-token vector whose other lanes read stale rows of the scratch and
    are never used; the tokens past the last multiple of 4 are added to the accumulators one by one, as in
    :func:`attend_any`. Without the scalar paths this compiles in about 75 % of the time (1.5 s against 2.0 s here,
    ``benchmarks/profile_compile.py``)."""
    G = Q.shape[0]
    RQ = Q.shape[1]
    D = Q.shape[2]
    if D % 16 or chunk % 8:  # the microkernels' vectors: 16 values of a row, 8 tokens (the padded tail <= chunk)
        raise ValueError("attend needs a head dimension that is a multiple of 16 and a chunk that is one of 8")
    K = np.empty((chunk, G, D), np.float32)  # a chunk of tokens of every head, decoded by one reader call
    V = np.empty((chunk, G, D), np.float32)
    S = np.empty((RQ, chunk), np.float32)
    F = np.empty(RQ, np.float32)  # each row's running maximum, then the sum of its weights
    kp = address(kaux)
    vp = address(vaux)
    nka = kaux.shape[0]
    nva = vaux.shape[0]
    _init_partials(M, L, ACC)
    for c0 in range(t0, t1, chunk):
        n = min(chunk, t1 - c0)
        nU = (n + 7) // 8 * 8  # scores for whole vectors of 8 tokens (<= chunk)
        n4 = n - n % 4
        call_reader(read_k, address(kdata[c0]), address(K), n * G * kblocks, kp, nka)
        call_reader(read_v, address(vdata[c0]), address(V), n * G * vblocks, vp, nva)
        for g in range(G):
            qo = Q[g]
            m_out = M[g]
            l_out = L[g]
            acc = ACC[g]
            _scores_rows(qo, K, g, S, nU, RQ)  # scores s[r, t] = q . k_t
            _online_softmax(S, n, c0, lim, scale, F, m_out, l_out, acc, chunk)
            # values: acc += p_t * v_t, every quad of tokens in order, then the tail one by one
            _values_rows(S, V, g, acc, n4, RQ)
            _values_tail(S, V, g, acc, n4, n)


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _init_partials(M, L, ACC):
    """Every row's running maximum ``-inf``, sum 0 and accumulator 0, before the first chunk."""
    for g in range(M.shape[0]):
        for r in range(M.shape[1]):
            M[g, r] = _NEG_INF
            L[g, r] = _0
            for j in range(ACC.shape[2]):
                ACC[g, r, j] = _0


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _scores_rows(qo, K, g, S, n_t, R):
    """The raw scores of query rows ``0 .. R`` of KV head ``g`` (``qo = Q[g]``) over tokens ``0 .. n_t`` (a
    multiple of 8) of the decoded keys ``K`` (chunk, G, D), into ``S`` (RQ, chunk): :func:`_scores4` four rows at a
    time, the last 1 to 3 rows by its narrower twins."""
    G = K.shape[1]
    D = K.shape[2]
    chunk = S.shape[1]
    for r in range(0, R, 4):
        nr = min(4, R - r)
        if nr == 4:
            _scores4(qo, r * D, K, g * D, G * D, S, r * chunk, chunk, n_t, D)
        elif nr == 3:
            _scores3(qo, r * D, K, g * D, G * D, S, r * chunk, chunk, n_t, D)
        elif nr == 2:
            _scores2(qo, r * D, K, g * D, G * D, S, r * chunk, chunk, n_t, D)
        else:
            _scores1(qo, r * D, K, g * D, G * D, S, r * chunk, chunk, n_t, D)


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _values_rows(S, V, g, acc, n4, R):
    """``acc[r] += (w0 v0 + w1 v1) + (w2 v2 + w3 v3)`` for query rows ``0 .. R`` of KV head ``g`` over every quad
    of tokens ``0 .. n4`` (a multiple of 4) of the decoded values ``V`` (chunk, G, D), weights ``S`` (RQ, chunk):
    :func:`_values4` four rows at a time, the last 1 to 3 rows by its narrower twins."""
    G = V.shape[1]
    D = V.shape[2]
    chunk = S.shape[1]
    for r in range(0, R, 4):
        nr = min(4, R - r)
        if nr == 4:
            _values4(S, r * chunk, chunk, V, g * D, G * D, acc, r * D, n4 // 4, D)
        elif nr == 3:
            _values3(S, r * chunk, chunk, V, g * D, G * D, acc, r * D, n4 // 4, D)
        elif nr == 2:
            _values2(S, r * chunk, chunk, V, g * D, G * D, acc, r * D, n4 // 4, D)
        else:
            _values1(S, r * chunk, chunk, V, g * D, G * D, acc, r * D, n4 // 4, D)


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _values_tail(S, V, g, acc, t0, n):
    """``acc[r] += w_t v_t`` one token at a time for tokens ``t0 .. n`` (those after the last quad), every row."""
    D = V.shape[2]
    for t in range(t0, n):
        vt = V[t, g]
        for r in range(S.shape[0]):
            w = S[r, t]
            ar = acc[r]
            for j in range(D):
                ar[j] += w * vt[j]


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _online_softmax(S, n, c0, lim, scale, F, m_out, l_out, acc, chunk):
    """One chunk's online-softmax step for the rows of one KV head (inlined into both kernels by numba): the raw
    scores ``S[r, :n]`` times ``scale``, the tokens a causal row does not see at ``-inf``, the new running maximum
    (the rows' sequential chains four side by side, :func:`_fold4`), the accumulated ``l`` and ``acc`` rescaled by
    ``exp(m_old - m_new)``, ``S`` replaced by the weights ``exp(s_t - m)``, and their sequential sum added to ``l``.
    A row that has seen nothing yet (maximum ``-inf``) gets weights 0 and keeps ``l``."""
    RQ = S.shape[0]
    D = acc.shape[1]
    for r in range(RQ):
        sr = S[r]
        for t in range(n):
            sr[t] = sr[t] * scale
        if lim[r] < c0 + n:  # causal: the tokens after this row's own are not seen
            for t in range(max(0, lim[r] - c0), n):
                sr[t] = _NEG_INF
        F[r] = m_out[r]
    _fold_rows(S, chunk, n, F, RQ, False)
    for r in range(RQ):
        sr = S[r]
        mc = F[r]
        if mc == _NEG_INF:  # nothing seen yet: weights 0 (and a sum of 0, not added below)
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
        for t in range(n):  # SIMD (the sum is a separate, sequential chain)
            sr[t] = expf(sr[t] - mc)
    for r in range(RQ):
        F[r] = _0
    _fold_rows(S, chunk, n, F, RQ, True)
    for r in range(RQ):
        if m_out[r] != _NEG_INF:
            l_out[r] += F[r]


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _fold_rows(S, chunk, n, F, RQ, add):
    """:func:`_fold4` over rows ``0 .. RQ`` of ``S`` (row stride ``chunk``), four at a time, then the rest.
    Inlined into the kernels by numba (not compiled on its own)."""
    for r in range(0, RQ, 4):
        nr = min(4, RQ - r)
        if nr == 4:
            _fold4(S, r * chunk, chunk, n, F, r, add)
        elif nr == 3:
            _fold3(S, r * chunk, chunk, n, F, r, add)
        elif nr == 2:
            _fold2(S, r * chunk, chunk, n, F, r, add)
        else:
            _fold1(S, r * chunk, chunk, n, F, r, add)


@jit
def attend_any(
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
    F = np.empty(RQ, np.float32)  # each row's running maximum, then the sum of its weights
    kp = address(kaux)
    vp = address(vaux)
    nka = kaux.shape[0]
    nva = vaux.shape[0]
    _init_partials(M, L, ACC)
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
            # scores s[r, t] = q . k_t: rows in fours by the register-blocked microkernel, straight from K (8 x 8
            # tiles transposed in registers, SIMD across tokens), every other row and the tail tokens here from the
            # keys transposed into B; the same operations in the same order either way
            R4 = RQ - RQ % 4 if D % 8 == 0 else 0
            nL = n8 if R4 else 0
            _scores_rows(qo, K, g, S, nL, R4)
            for t in range(0, n8 if R4 < RQ else 0, 8):
                for j in range(0, D, 8):
                    transpose8(K, (t * G + g) * D + j, G * D, B, j * chunk + t, chunk)
            for t in range(n8, n):
                kt = K[t, g]
                for j in range(D):
                    B[j, t] = kt[j]
            for r in range(RQ):
                tlo = nL if r < R4 else 0
                sr = S[r]
                for t in range(tlo, n):
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
                    for t in range(tlo, n):
                        sr[t] += ((q0 * b0[t] + q1 * b1[t]) + (q2 * b2[t] + q3 * b3[t])) + (
                            (q4 * b4[t] + q5 * b5[t]) + (q6 * b6[t] + q7 * b7[t])
                        )
                for j in range(D8, D):
                    qv = qo[r, j]
                    bj = B[j]
                    for t in range(tlo, n):
                        sr[t] += qv * bj[t]
            _online_softmax(S, n, c0, lim, scale, F, m_out, l_out, acc, chunk)
            # values: acc += p_t * v_t; rows in fours through the microkernel (every quad of tokens, then the
            # tail below), the rest here
            RV = RQ - RQ % 4 if D % 16 == 0 else 0
            n4 = n - n % 4
            _values_rows(S, V, g, acc, n4, RV)
            t = 0
            while t + 3 < n:  # four tokens per pass over the accumulator (SIMD along the head dimension)
                v0 = V[t, g]
                v1 = V[t + 1, g]
                v2 = V[t + 2, g]
                v3 = V[t + 3, g]
                for r in range(RV, RQ):
                    w0 = S[r, t]
                    w1 = S[r, t + 1]
                    w2 = S[r, t + 2]
                    w3 = S[r, t + 3]
                    ar = acc[r]
                    for j in range(D):
                        ar[j] += (w0 * v0[j] + w1 * v1[j]) + (w2 * v2[j] + w3 * v3[j])
                t += 4
            _values_tail(S, V, g, acc, t, n)


# --- register-blocked microkernels ------------------------------------------------------------------------------
# LLVM IR with explicit float32 vectors (any target; numba's loops cannot keep a tile of sums in registers across an
# inner loop). Each computes exactly the operations of the scalar loops in :func:`attend_any`, element by element in
# the same order (a lane is one element: the vectors only do several elements at once), so the bits are the same.
# Each comes in four variants, for 1 to 4 query rows (``_scores[nr]`` and so on).


def _splat(builder, x, vt):
    i32 = ir.IntType(32)
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(i32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, vt.count), [0] * vt.count))


def _vptr(builder, base, off, vt):
    return builder.bitcast(builder.gep(base, [off]), vt.as_pointer())


def _splat_mul(builder, base, off, v):
    """``base[off] * v``: the scalar at ``base[off]`` in every lane, times vector ``v`` (scalar first, as in the
    scalar loops)."""
    return builder.fmul(_splat(builder, builder.load(builder.gep(base, [off])), v.type), v)


def _make_scores(nr: int) -> Any:
    @intrinsic
    def scores(typingctx, q, qoff, k, koff, kstride, s, soff, sstride, n_t, n_d):
        """``nr`` query rows' raw scores over ``n_t`` tokens (a multiple of 8), 8 tokens a vector, straight from
        the decoded keys: ``s[soff + i*sstride + t] = sum over channel groups j8 (in order, from 0) of the tree
        ((q0 b0 + q1 b1) + (q2 b2 + q3 b3)) + ((q4 b4 + q5 b5) + (q6 b6 + q7 b7))`` with ``qc = q[qoff + i*n_d +
        j8 + c]`` and ``bc = k[koff + t*kstride + j8 + c]`` (``n_d`` a multiple of 8): the scalar loop of
        :func:`attend_any`. Each 8 x 8 tile of keys is transposed in registers
        (:func:`tbq.kernels.transpose8_vectors`; its shuffles overlap the multiplies) and the rows' sums stay
        in registers across the channel groups."""
        sig = types.void(
            q, types.int64, k, types.int64, types.int64, s, types.int64, types.int64, types.int64, types.int64
        )

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            vt = ir.VectorType(ir.FloatType(), 8)
            qp = context.make_array(signature.args[0])(context, builder, args[0]).data
            kp = context.make_array(signature.args[2])(context, builder, args[2]).data
            sp = context.make_array(signature.args[5])(context, builder, args[5]).data
            qoff, koff, kstride, soff, sstride, n_t, n_d = (args[c] for c in (1, 3, 4, 6, 7, 8, 9))
            accs = [cgutils.alloca_once(builder, vt) for _ in range(nr)]
            c8 = ir.Constant(i64, 8)
            zero = ir.Constant(vt, [0.0] * 8)
            with cgutils.for_range(builder, builder.udiv(n_t, c8)) as tl:
                t = builder.mul(tl.index, c8)
                for a in accs:
                    builder.store(zero, a)
                kt = builder.add(koff, builder.mul(t, kstride))
                with cgutils.for_range(builder, builder.udiv(n_d, c8)) as gl:
                    j8 = builder.mul(gl.index, c8)
                    kj = builder.add(kt, j8)
                    rows = [
                        builder.load(
                            _vptr(builder, kp, builder.add(kj, builder.mul(ir.Constant(i64, r), kstride)), vt), align=4
                        )
                        for r in range(8)
                    ]
                    b = transpose8_vectors(builder, rows)
                    for i in range(nr):
                        qrow = builder.add(qoff, builder.add(builder.mul(ir.Constant(i64, i), n_d), j8))
                        p = [_splat_mul(builder, qp, builder.add(qrow, ir.Constant(i64, c)), b[c]) for c in range(8)]
                        tree = builder.fadd(
                            builder.fadd(builder.fadd(p[0], p[1]), builder.fadd(p[2], p[3])),
                            builder.fadd(builder.fadd(p[4], p[5]), builder.fadd(p[6], p[7])),
                        )
                        builder.store(builder.fadd(builder.load(accs[i]), tree), accs[i])
                for i in range(nr):
                    off = builder.add(soff, builder.add(builder.mul(ir.Constant(i64, i), sstride), t))
                    builder.store(builder.load(accs[i]), _vptr(builder, sp, off, vt), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return scores


def _make_values(nr: int) -> Any:
    @intrinsic
    def values(typingctx, w, woff, wstride, v, voff, vstride, acc, aoff, n_q, n_d):
        """``nr`` query rows' ``acc[aoff + i*n_d + j] += (w0 v0[j] + w1 v1[j]) + (w2 v2[j] + w3 v3[j])`` for
        ``n_q`` quads of tokens in order, ``wk = w[woff + i*wstride + 4u + k]``, ``vk[j] = v[voff + (4u + k)*vstride
        + j]`` (``n_d`` a multiple of 16): the scalar loop of :func:`attend_any`, 16 values of ``acc`` a row (two
        vectors, a cache line of each value row) held in registers over all the quads instead of loaded and stored
        for each."""
        sig = types.void(
            w, types.int64, types.int64, v, types.int64, types.int64, acc, types.int64, types.int64, types.int64
        )

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            vt = ir.VectorType(ir.FloatType(), 8)
            wp = context.make_array(signature.args[0])(context, builder, args[0]).data
            vp = context.make_array(signature.args[3])(context, builder, args[3]).data
            ap = context.make_array(signature.args[6])(context, builder, args[6]).data
            woff, wstride, voff, vstride, aoff, n_q, n_d = (args[c] for c in (1, 2, 4, 5, 7, 8, 9))
            accs = [[cgutils.alloca_once(builder, vt) for _ in range(2)] for _ in range(nr)]
            c16 = ir.Constant(i64, 16)
            with cgutils.for_range(builder, builder.udiv(n_d, c16)) as jl:
                j = builder.mul(jl.index, c16)
                aptrs = [
                    [
                        _vptr(
                            builder,
                            ap,
                            builder.add(
                                aoff,
                                builder.add(
                                    builder.mul(ir.Constant(i64, i), n_d), builder.add(j, ir.Constant(i64, 8 * h))
                                ),
                            ),
                            vt,
                        )
                        for h in range(2)
                    ]
                    for i in range(nr)
                ]
                for i in range(nr):
                    for h in range(2):
                        builder.store(builder.load(aptrs[i][h], align=4), accs[i][h])
                with cgutils.for_range(builder, n_q) as ql:
                    t = builder.mul(ql.index, ir.Constant(i64, 4))
                    vj = builder.add(voff, j)
                    vv = [
                        [
                            builder.load(
                                _vptr(
                                    builder,
                                    vp,
                                    builder.add(
                                        builder.add(vj, ir.Constant(i64, 8 * h)),
                                        builder.mul(builder.add(t, ir.Constant(i64, c)), vstride),
                                    ),
                                    vt,
                                ),
                                align=4,
                            )
                            for h in range(2)
                        ]
                        for c in range(4)
                    ]
                    for i in range(nr):
                        wrow = builder.add(woff, builder.add(builder.mul(ir.Constant(i64, i), wstride), t))
                        for h in range(2):
                            p = [
                                _splat_mul(builder, wp, builder.add(wrow, ir.Constant(i64, c)), vv[c][h])
                                for c in range(4)
                            ]
                            tree = builder.fadd(builder.fadd(p[0], p[1]), builder.fadd(p[2], p[3]))
                            builder.store(builder.fadd(builder.load(accs[i][h]), tree), accs[i][h])
                for i in range(nr):
                    for h in range(2):
                        builder.store(builder.load(accs[i][h]), aptrs[i][h], align=4)
            return context.get_dummy_value()

        return sig, codegen

    return values


def _make_fold(nr: int) -> Any:
    @intrinsic
    def fold(typingctx, s, soff, sstride, n_t, f, foff, add):
        """``nr`` rows' sequential chains over ``n_t`` tokens, side by side in the lanes of one vector: with
        ``add``, ``f[foff + i] = (((f0 + s_0) + s_1) + ...)`` (``f0 = f[foff + i]``), else the running maximum
        ``m = s_t if s_t > m else m`` from ``m = f[foff + i]``; ``s_t = s[soff + i*sstride + t]``. Each row's
        chain is the scalar loop's, operation for operation, in token order (a NaN never replaces the maximum,
        as there); the chains only no longer wait for one another."""
        sig = types.void(s, types.int64, types.int64, types.int64, f, types.int64, types.boolean)

        def codegen(context, builder, signature, args):
            i64, i32 = ir.IntType(64), ir.IntType(32)
            vt = ir.VectorType(ir.FloatType(), 4)
            sp = context.make_array(signature.args[0])(context, builder, args[0]).data
            fp = context.make_array(signature.args[4])(context, builder, args[4]).data
            soff, sstride, n_t, foff, add = args[1], args[2], args[3], args[5], args[6]
            acc = cgutils.alloca_once(builder, vt)
            v0 = ir.Constant(vt, [0.0] * 4)
            for i in range(nr):
                x = builder.load(builder.gep(fp, [builder.add(foff, ir.Constant(i64, i))]))
                v0 = builder.insert_element(v0, x, ir.Constant(i32, i))
            builder.store(v0, acc)
            rows = [builder.add(soff, builder.mul(ir.Constant(i64, i), sstride)) for i in range(nr)]
            with builder.if_else(add) as (then, otherwise):
                for is_add in (True, False):
                    with then if is_add else otherwise, cgutils.for_range(builder, n_t) as tl:
                        v = ir.Constant(vt, [0.0] * 4)
                        for i in range(nr):
                            x = builder.load(builder.gep(sp, [builder.add(rows[i], tl.index)]))
                            v = builder.insert_element(v, x, ir.Constant(i32, i))
                        a = builder.load(acc)
                        if is_add:
                            builder.store(builder.fadd(a, v), acc)
                        else:
                            builder.store(builder.select(builder.fcmp_ordered(">", v, a), v, a), acc)
            out = builder.load(acc)
            for i in range(nr):
                builder.store(
                    builder.extract_element(out, ir.Constant(i32, i)),
                    builder.gep(fp, [builder.add(foff, ir.Constant(i64, i))]),
                )
            return context.get_dummy_value()

        return sig, codegen

    return fold


_scores1, _scores2, _scores3, _scores4 = (_make_scores(nr) for nr in (1, 2, 3, 4))
_values1, _values2, _values3, _values4 = (_make_values(nr) for nr in (1, 2, 3, 4))
_fold1, _fold2, _fold3, _fold4 = (_make_fold(nr) for nr in (1, 2, 3, 4))
