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
Float32 rows (sink tokens, exact references) go through the f32 format's reader
(:func:`tbq.formats.f32_kernels.attention_read_f32`).

No dequantize pass, no float copy of the cache: a chunk of ``chunk`` tokens
(all KV heads: consecutive blocks in the cache) is decoded by one reader call
into a scratch of ``chunk x n_head_kv x head_dim`` floats that stays in L2,
and each decoded key serves every query row of its KV head. TBQ4_0, TBQ3_0 and
turbo4/3/2 caches skip the scratch on AVX-512 targets (:func:`_attend_codes`,
the same body as :func:`_attend`): the score and value microkernels look their
codes up themselves, with the reader's per-block table, index spread and
``vpermps``, so every value has the reader's bits.

The arithmetic (docs/formats.md, *Fused attention arithmetic*; its NumPy twin
is ``tbq.attention._attend_numpy``, bit for bit), every operation a
float32 operation rounded once (``fma`` is the fused multiply-add, one
rounding, LLVM's ``llvm.fma``; no fastmath):

- a raw score ``q . k`` over the head dimension ``D``: 16 lane sums, lane
  ``l`` starts at 0 and takes ``a_l = fma(q_j, k_j, a_l)`` for ``j = l,
  l + 16, l + 32, ...`` in order; then the fixed tree ``a_l = a_l + a_{l+8}``
  (``l < 8``), ``a_l = a_l + a_{l+4}`` (``l < 4``), then ``+2``, ``+1``; the
  score is ``a_0 * scale``;
- the softmax weights ``p_t = expf(s_t - m)`` and their sum, a sequential
  chain in token order per chunk, as the running maximum ``m``;
- a value accumulator ``acc_j = fma(p_t, v_tj, acc_j)`` over the tokens in
  order, rescaled by ``expf(m_old - m_new)`` when a chunk raises ``m``.

Two kernels: :func:`_attend`, for a head dimension that is a multiple of 16
(every model's), runs the query rows through two register-blocked LLVM-IR
microkernels (:func:`_make_scores`: four rows times four tokens (two without AVX-512) of 16-lane
``fma`` sums, whose 16 trees are folded together in 15 adds; :func:`_make_values`:
64 accumulators of each of four rows (16 without AVX-512) in registers over the chunk's tokens);
:func:`_attend_any`, for any head dimension, computes the same operations in
scalar loops and is compiled only when such a head dimension is met.

A causal call gives each query row the end of the tokens it sees (``lim``);
later tokens get a score of ``-inf`` (weight 0).

The exponential is :func:`expf` below (Cody-Waite reduction and a degree-6
polynomial, float32, branch-free so it vectorises; within 1 ulp of the
exact ``exp`` on ``[-87.3, 0]`` (0.97 ulp measured on 3 million points), 0 below). Results do not depend on
the machine; they differ from the float64 reference by the float32 roundings
that :func:`tbq.attention.f32_tolerance` bounds.

Why one module of this length: the kernel for any head dimension, the microkernels of the
common one and the float32 readers are one definition of the fused attention's arithmetic
(docs/formats.md, *Fused attention arithmetic*), which its NumPy twin must follow operation for
operation; kept together, a change to one shows beside the others.
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .formats import reader_intrinsics as ri
from .intrinsics import TARGET_AVX512VBMI, emit_switch, prefetch_l2
from .kernels import TARGET_AVX512VL, address, attention_reader, call_reader, jit

F32 = np.float32
_0 = F32(0.0)
_1 = F32(1.0)
_NEG_INF = F32(-np.inf)

#: Kernels compiled only for unusual shapes (a head dimension that is no multiple of 16): left out of the compile
#: cost :func:`tbq.warmup.warm_up` balances its cold-start processes by
_LAZY_KERNELS = ("_attend_any",)

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


@intrinsic
def fmaf(typingctx, a, b, c):
    """float32 ``a * b + c`` rounded once (``llvm.fma.f32``: the FMA instruction, or libm's ``fmaf``)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f], ir.FunctionType(f, [f, f, f]))
        return builder.call(fn, args)

    return sig, codegen


@jit
def _attend(Q, lim, scale, kop, vop, span, chunk, out):
    """:func:`_attend_any` for a head dimension that is a multiple of 16 and a chunk that is a multiple of 16 (every
    model's, and what the caller checks), with the same arguments and exactly the same operations: every query
    row goes through the register-blocked microkernels, 1 to 4 rows a call (:func:`_attend_body`, every operand
    through its reader). The tokens of a chunk past its last multiple of the microkernel's token count get their
    scores from a padded group whose other tokens read stale rows of the scratch and are never used."""
    if (
        Q.shape[2] % 16 or chunk % 16
    ):  # the microkernels' vectors: 16 values of a row, up to 16 tokens (the padded tail)
        raise ValueError("_attend needs a head dimension that is a multiple of 16 and a chunk that is one of 16")
    _attend_body(Q, lim, scale, kop, vop, span, chunk, out, 0, 0)


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
def _scores_rows(qo, K, g, S, n, R):
    """The raw scores of query rows ``0 .. R`` of KV head ``g`` (``qo = Q[g]``) over tokens ``0 .. n`` of the
    decoded keys ``K`` (chunk, G, D), into ``S`` (RQ, chunk): :func:`_scores4` four rows at a time, the last 1 to
    3 rows by its narrower twins, :data:`_SCORE_TOKENS` tokens a group; a group past ``n`` is computed whole from
    the scratch (at most ``chunk``, a multiple of 16)."""
    G = K.shape[1]
    D = K.shape[2]
    chunk = S.shape[1]
    for r in range(0, R, 4):
        nr = min(4, R - r)
        nt = _SCORE_TOKENS[nr - 1]
        groups = (n + nt - 1) // nt
        if nr == 4:
            _scores4(qo, r * D, K, g * D, G * D, S, r * chunk, chunk, groups, D)
        elif nr == 3:
            _scores3(qo, r * D, K, g * D, G * D, S, r * chunk, chunk, groups, D)
        elif nr == 2:
            _scores2(qo, r * D, K, g * D, G * D, S, r * chunk, chunk, groups, D)
        else:
            _scores1(qo, r * D, K, g * D, G * D, S, r * chunk, chunk, groups, D)


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _values_rows(S, V, g, acc, n, R):
    """``acc[r, j] = fma(w_t, v_tj, acc[r, j])`` over tokens ``0 .. n`` in order, for query rows ``0 .. R`` of KV
    head ``g``, values ``V`` (chunk, G, D), weights ``S`` (RQ, chunk): :func:`_values4wide` four rows at a time (64
    channels, then 32 and 16 for the rest of a head dimension; :data:`_VALUE_VECTORS`), the last 1 to 3 rows by its
    narrower twins."""
    G = V.shape[1]
    D = V.shape[2]
    chunk = S.shape[1]
    D64 = D - D % 64
    D32 = D - D % 32
    for r in range(0, R, 4):
        nr = min(4, R - r)
        a = r * D
        w = r * chunk
        if nr == 4:
            _values4wide(S, w, chunk, V, g * D, G * D, acc, a, n, D, 0, D64)
            _values4w2(S, w, chunk, V, g * D, G * D, acc, a, n, D, D64, D32 - D64)
            _values4w1(S, w, chunk, V, g * D, G * D, acc, a, n, D, D32, D - D32)
        elif nr == 3:
            _values3wide(S, w, chunk, V, g * D, G * D, acc, a, n, D, 0, D64)
            _values3w2(S, w, chunk, V, g * D, G * D, acc, a, n, D, D64, D32 - D64)
            _values3w1(S, w, chunk, V, g * D, G * D, acc, a, n, D, D32, D - D32)
        elif nr == 2:
            _values2wide(S, w, chunk, V, g * D, G * D, acc, a, n, D, 0, D64)
            _values2w2(S, w, chunk, V, g * D, G * D, acc, a, n, D, D64, D32 - D64)
            _values2w1(S, w, chunk, V, g * D, G * D, acc, a, n, D, D32, D - D32)
        else:
            _values1wide(S, w, chunk, V, g * D, G * D, acc, a, n, D, 0, D64)
            _values1w2(S, w, chunk, V, g * D, G * D, acc, a, n, D, D64, D32 - D64)
            _values1w1(S, w, chunk, V, g * D, G * D, acc, a, n, D, D32, D - D32)


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
def _attend_any(Q, lim, scale, kop, vop, span, chunk, out):
    """Attention over tokens ``t0 .. t1`` (``span``) of every KV head, for the query rows of each.

    ``Q``: float32 ``(G, RQ, D)``, the ``RQ`` query rows of each of the ``G``
    KV heads (in the K reader's domain); ``lim``: int64 ``(RQ,)``, row ``r``
    sees tokens ``< lim[r]`` (``lim >= t1``: all); ``scale``: the softmax scale.
    ``kop``/``vop``: ``(reader, data, aux, blocks)``, the reader's C address
    (``cfunc.address``, called by :func:`tbq.kernels.call_reader`), the bytes
    uint8 ``(T, G, row_bytes)`` C-contiguous, the reader's float32 table and the
    blocks per row. ``out``: ``(M, L, ACC)``, written per KV head ``g``: the
    running maximum ``M[g]`` (RQ,), the sum ``L[g]`` of ``exp(s_t - m)`` and the
    unnormalised sum ``ACC[g]`` (RQ, D) of ``exp(s_t - m) v_t`` in the V
    reader's domain, all float32.

    Tokens are the outer loop and KV heads the inner one, so the bytes of a
    chunk of tokens (all heads, contiguous in the cache) are read from memory
    once. Scalar loops of the module's arithmetic, for any head dimension.
    """
    G = Q.shape[0]
    RQ = Q.shape[1]
    D = Q.shape[2]
    read_k, kdata, kaux, kblocks = kop
    read_v, vdata, vaux, vblocks = vop
    t0, t1 = span
    M, L, ACC = out
    K = np.empty((chunk, G, D), np.float32)  # a chunk of tokens of every head, decoded by one reader call
    V = np.empty((chunk, G, D), np.float32)
    S = np.empty((RQ, chunk), np.float32)
    F = np.empty(RQ, np.float32)  # each row's running maximum, then the sum of its weights
    lanes = np.empty(16, np.float32)
    kp = address(kaux)
    vp = address(vaux)
    nka = kaux.shape[0]
    nva = vaux.shape[0]
    _init_partials(M, L, ACC)
    for c0 in range(t0, t1, chunk):
        n = min(chunk, t1 - c0)
        call_reader(read_k, address(kdata[c0]), address(K), n * G * kblocks, kp, nka)
        call_reader(read_v, address(vdata[c0]), address(V), n * G * vblocks, vp, nva)
        for g in range(G):
            qo = Q[g]
            m_out = M[g]
            l_out = L[g]
            acc = ACC[g]
            for r in range(RQ):  # scores: 16 lane sums of fma, then the tree 8, 4, 2, 1
                qr = qo[r]
                for t in range(n):
                    kt = K[t, g]
                    for ln in range(16):
                        lanes[ln] = _0
                    for j in range(D):
                        lanes[j & 15] = fmaf(qr[j], kt[j], lanes[j & 15])
                    h = 8
                    while h:
                        for ln in range(h):
                            lanes[ln] = lanes[ln] + lanes[ln + h]
                        h //= 2
                    S[r, t] = lanes[0]
            _online_softmax(S, n, c0, lim, scale, F, m_out, l_out, acc, chunk)
            for t in range(n):  # values: acc = fma(p_t, v_t, acc), token by token
                vt = V[t, g]
                for r in range(RQ):
                    w = S[r, t]
                    ar = acc[r]
                    for j in range(D):
                        ar[j] = fmaf(w, vt[j], ar[j])


# --- register-blocked microkernels ------------------------------------------------------------------------------
# LLVM IR with explicit float32 vectors (any target; numba's loops cannot keep a tile of sums in registers across an
# inner loop). Each computes exactly the operations of the scalar loops in :func:`_attend_any`, element by element in
# the same order (a lane is one element: the vectors only do several elements at once), so the bits are the same.


def _splat(builder, x, vt):
    i32 = ir.IntType(32)
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(i32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, vt.count), [0] * vt.count))


def _vptr(builder, base, off, vt):
    return builder.bitcast(builder.gep(base, [off]), vt.as_pointer())


def _vfma(builder, a, b, c):
    """``fma(a, b, c)`` lane by lane, one rounding (``llvm.fma`` on float32 vectors)."""
    vt = a.type
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]), f"llvm.fma.v{vt.count}f32")
    return builder.call(fn, [a, b, c])


def _fold_trees(builder, vecs):
    """Up to 16 vectors of 16 lane sums -> one vector whose lane ``i`` is vector ``i``'s tree ``l += l+8``, then
    ``+4``, ``+2``, ``+1`` (lane ``l`` always the left operand). Each step pairs the vectors and adds, in one
    instruction, the low and the high halves of every group of both (an odd vector out is paired with zeros): 15
    adds for 16 trees instead of 60."""
    i32 = ir.IntType(32)
    zero = ir.Constant(vecs[0].type, [0.0] * 16)
    size = 16  # lanes per group: each vector holds 16 // size groups, one per tree, in tree order
    while size > 1:
        if len(vecs) % 2:
            vecs = vecs + [zero]
        h = size // 2
        n_groups = 16 // size
        lo = [g * size + i for g in range(n_groups) for i in range(h)]
        lo = lo + [16 + x for x in lo]
        hi = [x + h for x in lo]
        mask_lo = ir.Constant(ir.VectorType(i32, 16), lo)
        mask_hi = ir.Constant(ir.VectorType(i32, 16), hi)
        vecs = [
            builder.fadd(
                builder.shuffle_vector(vecs[2 * i], vecs[2 * i + 1], mask_lo),
                builder.shuffle_vector(vecs[2 * i], vecs[2 * i + 1], mask_hi),
            )
            for i in range(len(vecs) // 2)
        ]
        size = h
    return vecs[0]


def _score_groups(builder, nr, nt, qp, qoff, n_d, sp, soff, sstride, n_groups, keys):
    """The body every score microkernel shares: for each of ``n_groups`` groups of ``nt`` tokens (the first
    ``t = group * nt``), ``nr x nt`` vectors of 16 lane sums from 0, ``keys(t, step)`` emitting the group's
    key vectors 16 values at a time, ``step(j, kv)`` their ``fma`` with values ``j .. j + 15`` of each query row
    (``q[qoff + i*n_d + j ..]``), then the trees (:func:`_fold_trees`) into ``s[soff + i*sstride + t ..]``."""
    i64, i32 = ir.IntType(64), ir.IntType(32)
    vt = ir.VectorType(ir.FloatType(), 16)
    accs = [[cgutils.alloca_once(builder, vt) for _ in range(nt)] for _ in range(nr)]
    zero = ir.Constant(vt, [0.0] * 16)

    def step(j, kv):
        for i in range(nr):
            qv = builder.load(
                _vptr(builder, qp, builder.add(qoff, builder.add(builder.mul(ir.Constant(i64, i), n_d), j)), vt),
                align=4,
            )
            for u in range(nt):
                builder.store(_vfma(builder, qv, kv[u], builder.load(accs[i][u])), accs[i][u])

    with cgutils.for_range(builder, n_groups) as tl:
        t = builder.mul(tl.index, ir.Constant(i64, nt))
        for row in accs:
            for a in row:
                builder.store(zero, a)
        keys(t, step)
        scores16 = _fold_trees(builder, [builder.load(accs[i][u]) for i in range(nr) for u in range(nt)])
        st = ir.VectorType(ir.FloatType(), nt)
        for i in range(nr):
            part = builder.shuffle_vector(
                scores16, scores16, ir.Constant(ir.VectorType(i32, nt), [i * nt + u for u in range(nt)])
            )
            off = builder.add(soff, builder.add(builder.mul(ir.Constant(i64, i), sstride), t))
            builder.store(part, _vptr(builder, sp, off, st), align=4)


def _make_scores(nr: int, nt: int) -> Any:
    @intrinsic
    def scores(typingctx, q, qoff, k, koff, kstride, s, soff, sstride, n_groups, n_d):
        """``nr`` query rows' raw scores over ``n_groups`` groups of ``nt`` tokens, straight from the decoded keys
        (``nr * nt <= 16``): for row ``i`` and token ``t``, 16 lane sums ``a_l = fma(q_j, k_j, a_l)``, ``j = l,
        l + 16, ...`` in order (``q_j = q[qoff + i*n_d + j]``, ``k_j = k[koff + t*kstride + j]``, ``n_d`` a
        multiple of 16), and their tree into ``s[soff + i*sstride + t]``. A group's ``nr * nt`` sums are one
        vector register each; their trees are folded together (:func:`_fold_trees`)."""
        sig = types.void(
            q, types.int64, k, types.int64, types.int64, s, types.int64, types.int64, types.int64, types.int64
        )

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            vt = ir.VectorType(ir.FloatType(), 16)
            qp = context.make_array(signature.args[0])(context, builder, args[0]).data
            kp = context.make_array(signature.args[2])(context, builder, args[2]).data
            sp = context.make_array(signature.args[5])(context, builder, args[5]).data
            qoff, koff, kstride, soff, sstride, n_groups, n_d = (args[c] for c in (1, 3, 4, 6, 7, 8, 9))
            c16 = ir.Constant(i64, 16)

            def keys(t, step):  # the group's keys from the scratch, 16 values of each token a step
                kt = builder.add(koff, builder.mul(t, kstride))
                with cgutils.for_range(builder, builder.udiv(n_d, c16)) as jl:
                    j = builder.mul(jl.index, c16)
                    at = builder.add(kt, j)
                    step(
                        j,
                        [
                            builder.load(
                                _vptr(builder, kp, builder.add(at, builder.mul(ir.Constant(i64, u), kstride)), vt),
                                align=4,
                            )
                            for u in range(nt)
                        ],
                    )

            _score_groups(builder, nr, nt, qp, qoff, n_d, sp, soff, sstride, n_groups, keys)
            return context.get_dummy_value()

        return sig, codegen

    return scores


def _value_pass(builder, nr, width, lanes, wp, woff, wstride, ap, aoff, n_d, j, n_t, token_vectors):
    """The pass every value microkernel shares: the ``width`` vectors of ``lanes`` accumulators from channel ``j``
    of each of ``nr`` rows (``acc[aoff + i*n_d + j ..]``) loaded into registers, ``fma(w_t, v, acc)`` over tokens
    ``t = 0 .. n_t`` in order (``w_t = w[woff + i*wstride + t]``, ``token_vectors(t)`` the token's ``width``
    value vectors), and stored back."""
    i64 = ir.IntType(64)
    vt = ir.VectorType(ir.FloatType(), lanes)
    accs = [[cgutils.alloca_once(builder, vt) for _ in range(width)] for _ in range(nr)]
    aptrs = [
        [
            _vptr(
                builder,
                ap,
                builder.add(
                    aoff,
                    builder.add(builder.mul(ir.Constant(i64, i), n_d), builder.add(j, ir.Constant(i64, lanes * h))),
                ),
                vt,
            )
            for h in range(width)
        ]
        for i in range(nr)
    ]
    for i in range(nr):
        for h in range(width):
            builder.store(builder.load(aptrs[i][h], align=4), accs[i][h])
    with cgutils.for_range(builder, n_t) as tl:
        vv = token_vectors(tl.index)
        for i in range(nr):
            wi = builder.add(woff, builder.add(builder.mul(ir.Constant(i64, i), wstride), tl.index))
            ws = _splat(builder, builder.load(builder.gep(wp, [wi])), vt)
            for h in range(width):
                builder.store(_vfma(builder, ws, vv[h], builder.load(accs[i][h])), accs[i][h])
    for i in range(nr):
        for h in range(width):
            builder.store(builder.load(accs[i][h]), aptrs[i][h], align=4)


def _make_values(nr: int, width: int, lanes: int = 16) -> Any:
    @intrinsic
    def values(typingctx, w, woff, wstride, v, voff, vstride, acc, aoff, n_t, n_d, j0, n_j):
        """``nr`` query rows' ``acc[aoff + i*n_d + j] = fma(w_t, v_t[j], acc[...])`` for tokens ``t = 0 .. n_t`` in
        order and channels ``j = j0 .. j0 + n_j`` (``n_j`` a multiple of ``lanes * width``), ``w_t = w[woff +
        i*wstride + t]``, ``v_t[j] = v[voff + t*vstride + j]``: the scalar loop of :func:`_attend_any`, ``width``
        vectors of ``lanes`` accumulators of each row held in registers over all the tokens."""
        sig = types.void(
            w,
            types.int64,
            types.int64,
            v,
            types.int64,
            types.int64,
            acc,
            types.int64,
            types.int64,
            types.int64,
            types.int64,
            types.int64,
        )

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            vt = ir.VectorType(ir.FloatType(), lanes)
            wp = context.make_array(signature.args[0])(context, builder, args[0]).data
            vp = context.make_array(signature.args[3])(context, builder, args[3]).data
            ap = context.make_array(signature.args[6])(context, builder, args[6]).data
            woff, wstride, voff, vstride, aoff, n_t, n_d, j0, n_j = (args[c] for c in (1, 2, 4, 5, 7, 8, 9, 10, 11))
            step = ir.Constant(i64, lanes * width)
            with cgutils.for_range(builder, builder.udiv(n_j, step)) as jl:
                j = builder.add(j0, builder.mul(jl.index, step))
                vj = builder.add(voff, j)

                def token_vectors(t):
                    vrow = builder.add(vj, builder.mul(t, vstride))
                    return [
                        builder.load(_vptr(builder, vp, builder.add(vrow, ir.Constant(i64, lanes * h)), vt), align=4)
                        for h in range(width)
                    ]

                _value_pass(builder, nr, width, lanes, wp, woff, wstride, ap, aoff, n_d, j, n_t, token_vectors)
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


#: Tokens per group of the score microkernels, for 1 to 4 rows: ``rows x tokens`` sums of 16 lanes held in
#: registers (16 with AVX-512's 32 vector registers; 8 in AVX2's 16, where a 16-lane sum takes two). The grouping
#: changes no operation: every score's sums and tree are its own.
_SCORE_TOKENS = (16, 8, 4, 4) if TARGET_AVX512VL else (8, 4, 2, 2)
_scores1, _scores2, _scores3, _scores4 = (_make_scores(nr, _SCORE_TOKENS[nr - 1]) for nr in (1, 2, 3, 4))
#: The value microkernels' vectors, ``(lanes, vectors a row)`` for passes of 16, 32 and 64 channels. With
#: AVX-512, 16-float vectors, up to 4 a row (16 of its 32 registers for four rows); without, AVX2's 8-float
#: vectors, 2 a row (8 of its 16 registers), for every pass (there a 16-float vector is two registers, and LLVM
#: kept such accumulators in memory: 6x slower, measured).
_VALUE_VECTORS = ((16, 1), (16, 2), (16, 4)) if TARGET_AVX512VL else ((8, 2), (8, 2), (8, 2))
_values1w1, _values2w1, _values3w1, _values4w1 = (_make_values(nr, *_VALUE_VECTORS[0][::-1]) for nr in (1, 2, 3, 4))
_values1w2, _values2w2, _values3w2, _values4w2 = (_make_values(nr, *_VALUE_VECTORS[1][::-1]) for nr in (1, 2, 3, 4))
_values1wide, _values2wide, _values3wide, _values4wide = (
    _make_values(nr, *_VALUE_VECTORS[2][::-1]) for nr in (1, 2, 3, 4)
)
_fold1, _fold2, _fold3, _fold4 = (_make_fold(nr) for nr in (1, 2, 3, 4))


# --- TBQ and turbo codes read in the microkernels (AVX-512) -------------------------------------------------------
# The readers of TBQ4_0, TBQ3_0 and turbo2/3/4 (tbq_kernels.read_rotated / turbo_kernels.read_rotated with
# reader_intrinsics' per-block tables) give the rotated-domain value ``centroid[idx] * d`` of each index: one
# vpermps of 16 indices in the block's table of the 16 (or 8 or 4, repeated) products ``centroid * d``. The
# microkernels below do that look-up on the cache's bytes where the scratch kernels load a decoded float (the
# scores: each key vector as its fmas need it; the values: each value vector), with the same table (the same
# products, each rounded once), the same index spread (reader_intrinsics.index_vectors) and the same vpermps, so
# every float has the reader's bits and every fma is the scratch kernels': the results are the same bits, without
# storing each chunk's floats and loading them back. For targets with AVX-512VL (vpermps on 16 lanes); the 4- and
# 3-bit streams' indices reach their lanes by one vpmultishiftqb of the 8 bytes that hold them with AVX-512 VBMI,
# else (and turbo2's and turbo3's always) as the readers spread them. Other targets (and other formats) read
# through the readers into the scratch. :func:`code_bits` picks the operands.

#: The caches the microkernels read as codes, by the code :func:`code_bits` gives them: ``(index layout
#: (:data:`tbq.formats.reader_intrinsics.STREAMS`, or turbo3's "planes3"), byte offset of the indices in a
#: block, bytes a block)``; every block holds 128 values and starts with its fp16 ``d``. 4 and 3 are TBQ4_0 and
#: TBQ3_0; 14, 13 and 12 turbo4 (its fp16 ``rnorm`` before the indices), turbo3 and turbo2.
CODE_LAYOUTS = {
    4: ("nib4", 2, 66),
    3: ("stream3", 2, 50),
    14: ("nib4", 4, 68),
    13: ("planes3", 2, 50),
    12: ("quads2", 2, 34),
}
#: The index layouts the microkernels are built for, in the order of their kind (``kind`` of :func:`_code_layout`).
_KINDS = ("nib4", "stream3", "quads2", "planes3")
#: Values of a code block.
_CODE_BLOCK = 128
#: Where the centroids start in a TBQ or turbo reader's ``aux`` (after the fp16 table).
_CODE_CENTROIDS = 65536


def _code_decoder(builder, layout, aux_ptr, payload):
    """``(table, vector)`` IR builders for the codes of ``layout`` (``aux_ptr``: the reader's float32 tables;
    ``payload``: the byte offset of the indices in a block, an i64): ``table(block_ptr)`` is the block's 16
    products ``centroid * d`` (:func:`tbq.formats.reader_intrinsics.products`, ``d`` as
    :func:`tbq.kernels.load_f16` reads it), and ``vector(block_ptr, table, h)`` the 16 values ``16h .. 16h +
    15`` of the block: the readers' index spread (:func:`tbq.formats.reader_intrinsics.index_vectors`, or with
    VBMI one ``vpmultishiftqb`` for the 4- and 3-bit streams) and ``vpermps``, so every value has the reader's
    bits. Nothing past the block is read."""
    i16, i64 = ir.IntType(16), ir.IntType(64)
    cent = ri.centroids16(builder, builder.gep(aux_ptr, [ir.Constant(i64, _CODE_CENTROIDS)]), ri.TABLE_SIZE[layout])

    def table(bp):
        h16 = builder.load(builder.bitcast(bp, i16.as_pointer()), align=1)  # fp16 bits, little-endian
        return ri.products(builder, cent, builder.load(builder.gep(aux_ptr, [builder.zext(h16, i64)])))

    def vector(bp, tab, h):
        pp = builder.gep(bp, [payload])
        if TARGET_AVX512VBMI and layout in ("nib4", "stream3"):
            return ri.permute(builder, tab, _multishift_indices(builder, ri.STREAMS[layout][0], pp, h))
        return ri.permute(builder, tab, ri.index_vectors(builder, layout, pp)(h))

    return table, vector


def _multishift_indices(builder, bits, pp, h):
    """VBMI: indices ``16h .. 16h + 15`` of a 4- or 3-bit stream at ``pp`` in their lanes' low bits. The 8 bytes
    that hold them (3 bits, the last 16: the 8 bytes ending at the block's end) in every qword; byte 0 (4) of
    dword 2m (2m + 1) takes the 8 bits from index 2m's (2m + 1's) first bit, whose low 4 bits vpermps reads (for
    3 bits, the 8 entries repeated: bit 3 picks the same value)."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    vb, vq = ir.VectorType(ir.IntType(8), 64), ir.VectorType(i64, 8)
    mshift = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vb, [vb, vb]), "llvm.x86.avx512.pmultishift.qb.512"
    )
    step = 2 * bits  # bytes a 16
    off = step * h - (2 if bits == 3 and h == 7 else 0)
    lo = 16 if bits == 3 and h == 7 else 0
    x = builder.load(builder.bitcast(builder.gep(pp, [ir.Constant(i64, off)]), i64.as_pointer()), align=1)
    xv = builder.insert_element(ir.Constant(vq, ir.Undefined), x, ir.Constant(i32, 0))
    xv = builder.shuffle_vector(xv, xv, ir.Constant(ir.VectorType(i32, 8), [0] * 8))
    ctrl = []
    for m in range(8):
        c = [0] * 8
        c[0] = lo + bits * (2 * m)
        c[4] = lo + bits * (2 * m + 1)
        ctrl += c
    idx = builder.call(mshift, [ir.Constant(vb, ctrl), builder.bitcast(xv, vb)])
    return builder.bitcast(idx, ir.VectorType(i32, 16))


def _emit_scores_codes(builder, nr, layout, ptrs, vals):
    """Emit one case of :func:`_scores_codes` into ``builder``: :func:`_make_scores`'s microkernel for ``nr`` rows
    and groups of ``_SCORE_TOKENS[nr - 1]`` tokens with the keys read from ``layout`` codes. ``ptrs``: the data
    pointers of the intrinsic's arrays ``q, data, aux, s``; ``vals``: its i64 arguments from ``qoff`` on."""
    i64 = ir.IntType(64)
    nt = _SCORE_TOKENS[nr - 1]
    qp, dp, xp, sp = ptrs
    qoff, base, tstride, n_tok, soff, sstride, n_groups, n_blocks, payload, bbytes = vals
    table, vector = _code_decoder(builder, layout, xp, payload)
    n_d = builder.mul(n_blocks, ir.Constant(i64, _CODE_BLOCK))
    last = builder.sub(n_tok, ir.Constant(i64, 1))

    def keys(t, step):  # the group's keys from the codes, block by block, 16 values of each token a step
        rows = []
        for u in range(nt):
            tu = builder.add(t, ir.Constant(i64, u))
            tu = builder.select(builder.icmp_signed(">", tu, last), last, tu)
            rows.append(builder.add(base, builder.mul(tu, tstride)))
        with cgutils.for_range(builder, n_blocks) as bl:
            boff = builder.mul(bl.index, bbytes)
            bps = [builder.gep(dp, [builder.add(r, boff)]) for r in rows]
            tabs = [table(bp) for bp in bps]
            j0 = builder.mul(bl.index, ir.Constant(i64, _CODE_BLOCK))
            for h in range(_CODE_BLOCK // 16):
                j = builder.add(j0, ir.Constant(i64, 16 * h))
                step(j, [vector(bps[u], tabs[u], h) for u in range(nt)])

    _score_groups(builder, nr, nt, qp, qoff, n_d, sp, soff, sstride, n_groups, keys)


def _emit_values_codes(builder, nr, layout, ptrs, vals):
    """Emit one case of :func:`_values_codes` into ``builder``: :func:`_make_values`'s microkernel for ``nr`` rows
    (four vectors of 16 accumulators a row, 64 channels a pass) with the values read from ``layout`` codes.
    ``ptrs``: the data pointers of the intrinsic's arrays ``w, data, aux, acc``; ``vals``: its i64 arguments from
    ``woff`` on."""
    i64 = ir.IntType(64)
    wp, dp, xp, ap = ptrs
    woff, wstride, base, tstride, aoff, n_t, n_blocks, payload, bbytes = vals
    table, vector = _code_decoder(builder, layout, xp, payload)
    n_d = builder.mul(n_blocks, ir.Constant(i64, _CODE_BLOCK))
    with cgutils.for_range(builder, n_blocks) as bl:
        boff = builder.add(base, builder.mul(bl.index, bbytes))
        for half in range(_CODE_BLOCK // 64):
            j = builder.add(builder.mul(bl.index, ir.Constant(i64, _CODE_BLOCK)), ir.Constant(i64, 64 * half))

            def token_vectors(t, half=half):
                bp = builder.gep(dp, [builder.add(boff, builder.mul(t, tstride))])
                tab = table(bp)
                return [vector(bp, tab, 4 * half + h) for h in range(4)]

            _value_pass(builder, nr, 4, 16, wp, woff, wstride, ap, aoff, n_d, j, n_t, token_vectors)


def _codes_codegen(emit):
    """The codegen of an intrinsic whose arguments are ``kind, nr`` (i64) and then arrays and i64 values: the 16
    cases ``emit(builder, nr, _KINDS[kind], ptrs, vals)`` (``ptrs`` the arrays' data pointers and ``vals`` the
    other values, each in argument order) for the layouts and the row counts 1 to 4, each built for its literal
    pair, behind a switch on ``kind`` (any other value as the last layout) and in each a switch on ``nr`` (any
    other value as 1) (:func:`tbq.intrinsics.emit_switch`)."""

    def codegen(context, builder, signature, args):
        typed = list(zip(signature.args, args, strict=True))[2:]
        ptrs = [context.make_array(ty)(context, builder, v).data for ty, v in typed if isinstance(ty, types.Array)]
        vals = [v for ty, v in typed if not isinstance(ty, types.Array)]

        def rows(k):  # the cases of layout _KINDS[k], one a row count
            emit_switch(builder, args[1], (4, 3, 2, 1), lambda nr: emit(builder, nr, _KINDS[k], ptrs, vals))

        emit_switch(builder, args[0], tuple(range(len(_KINDS))), rows)
        return context.get_dummy_value()

    return codegen


@intrinsic
def _scores_codes(
    typingctx, kind, nr, q, qoff, data, base, tstride, n_tok, aux, s, soff, sstride, n_groups, n_blocks, payload, bbytes
):
    """:func:`_make_scores`' microkernel for ``nr`` rows (1 to 4) with the keys read from the codes of index layout
    ``_KINDS[kind]``: token ``t``'s row of one KV head starts at byte ``base + t*tstride`` of ``data``
    (``n_blocks`` blocks of ``bbytes`` bytes, 128 values, the indices from byte ``payload``), the tokens of a
    group past ``n_tok`` read token ``n_tok - 1`` (their scores are never used). Groups of ``_SCORE_TOKENS[nr -
    1]`` tokens. One switch picks the case of ``(kind, nr)``, each built for its literal layout and row count
    (:func:`_codes_codegen`, :func:`_emit_scores_codes`)."""
    sig = types.void(
        types.int64, types.int64, q, types.int64, data, types.int64, types.int64, types.int64, aux, s, types.int64,
        types.int64, types.int64, types.int64, types.int64, types.int64,
    )  # fmt: skip
    return sig, _codes_codegen(_emit_scores_codes)


@intrinsic
def _values_codes(
    typingctx, kind, nr, w, woff, wstride, data, base, tstride, aux, acc, aoff, n_t, n_blocks, payload, bbytes
):
    """:func:`_make_values`' microkernel for ``nr`` rows (1 to 4; four vectors of 16 accumulators a row, 64
    channels a pass) with the values read from the codes of index layout ``_KINDS[kind]``: token ``t``'s row of
    one KV head starts at byte ``base + t*tstride`` of ``data`` (``n_blocks`` blocks of ``bbytes`` bytes, 128
    values, the indices from byte ``payload``); every channel of the rows, in passes of 64. One switch picks the
    case of ``(kind, nr)``, each built for its literal layout and row count (:func:`_codes_codegen`,
    :func:`_emit_values_codes`)."""
    sig = types.void(
        types.int64, types.int64, w, types.int64, types.int64, data, types.int64, types.int64, aux, acc, types.int64,
        types.int64, types.int64, types.int64, types.int64,
    )  # fmt: skip
    return sig, _codes_codegen(_emit_values_codes)


def code_bits(op: tuple, head_dim: int) -> int:
    """The :data:`CODE_LAYOUTS` code of kernel operand ``op`` (``(reader, bytes, tables, blocks per row)``) when it
    is a TBQ4_0 (4), TBQ3_0 (3), turbo4 (14), turbo3 (13) or turbo2 (12) cache that :func:`_attend_codes` reads
    from its codes on this target (AVX-512VL, a head dimension of whole blocks), else 0 (the operand goes through
    its reader)."""
    if not TARGET_AVX512VL or head_dim % _CODE_BLOCK or CHUNK % 16:
        return 0
    from .formats.tbq_kernels import attention_read as tbq_read  # the TBQ formats' reader function
    from .formats.turbo_kernels import attention_read as turbo_read  # the turbo formats'

    nc = op[2].shape[0] - _CODE_CENTROIDS
    if op[0] == attention_reader(tbq_read).address:
        code = {16: 4, 8: 3}.get(nc, 0)
    elif op[0] == attention_reader(turbo_read).address:
        code = {16: 14, 8: 13, 4: 12}.get(nc, 0)
    else:
        return 0
    return code if code and op[1].shape[-1] == CODE_LAYOUTS[code][2] * op[3] else 0


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _code_layout(code):
    """``(kind, payload, bytes a block)`` of a :data:`CODE_LAYOUTS` code; ``kind`` indexes :data:`_KINDS`."""
    if code == 4:
        return 0, 2, 66
    if code == 3:
        return 1, 2, 50
    if code == 14:
        return 0, 4, 68
    if code == 13:
        return 3, 2, 50
    return 2, 2, 34


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _scores_codes_rows(qo, data, base, tstride, n, aux, bits, n_blocks, S, R):
    """:func:`_scores_rows` with the keys read from the codes of layout ``bits`` (a :data:`CODE_LAYOUTS` code;
    token ``t`` of the chunk at byte ``base + t*tstride`` of ``data``): :func:`_scores_codes` four rows at a
    time, then the last 1 to 3."""
    chunk = S.shape[1]
    D = n_blocks * _CODE_BLOCK
    kind, payload, bbytes = _code_layout(bits)
    for r in range(0, R, 4):
        nr = min(4, R - r)
        groups = (n + _SCORE_TOKENS[nr - 1] - 1) // _SCORE_TOKENS[nr - 1]
        _scores_codes(
            kind, nr, qo, r * D, data, base, tstride, n, aux, S, r * chunk, chunk, groups, n_blocks, payload, bbytes
        )


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _values_codes_rows(S, data, base, tstride, n, aux, bits, n_blocks, acc, R):
    """:func:`_values_rows` with the values read from the codes of layout ``bits`` (a :data:`CODE_LAYOUTS` code;
    token ``t`` of the chunk at byte ``base + t*tstride`` of ``data``): :func:`_values_codes` four rows at a
    time, then the last 1 to 3."""
    chunk = S.shape[1]
    D = n_blocks * _CODE_BLOCK
    kind, payload, bbytes = _code_layout(bits)
    for r in range(0, R, 4):
        nr = min(4, R - r)
        _values_codes(kind, nr, S, r * chunk, chunk, data, base, tstride, aux, acc, r * D, n, n_blocks, payload, bbytes)


#: How many chunks ahead :func:`_attend_codes` prefetches the codes into L2 (a hint: no value changes). It reads a
#: chunk head by head (strided), which the hardware's stream prefetchers do not follow as they do the readers'
#: sequential pass; prefetched into L1 as well (``prefetcht0``) the next chunk evicts the current one. Measured
#: on a Zen 5 core, 32K tokens of TBQ4_0 (1 thread, thread CPU time): 10.5 ms with one chunk into L1, 8.6-9.0
#: ms with one to four chunks into L2, 8.3 ms on a cache that fits L2.
CODES_AHEAD = 2


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _prefetch_share(data, start, size, stop, g, G):
    """Prefetch share ``g`` of ``G`` of bytes ``start .. start + size`` of ``data`` into L2, a cache line apart,
    none from byte ``stop`` on (the task's end)."""
    a = start + g * size // G
    e = min(start + (g + 1) * size // G, stop)
    for at in range(a, e, 64):
        prefetch_l2(data, at)


@jit
def _attend_codes(Q, lim, scale, kop, vop, span, chunk, out, kbits, vbits):
    """:func:`_attend` (the same arguments, exactly the same operations) where the key (``kbits``) or value
    (``vbits``) cache is one that the microkernels read from its codes instead of a reader's scratch (a
    :data:`CODE_LAYOUTS` code from :func:`code_bits`: TBQ4_0, TBQ3_0, turbo4/3/2; an operand of 0 goes through its
    reader). For targets with AVX-512VL, a head dimension that is a multiple of 128 (whole blocks) and a chunk
    that is a multiple of 16; the caller checks."""
    if Q.shape[2] % _CODE_BLOCK or chunk % 16:
        raise ValueError("_attend_codes needs a head dimension that is a multiple of 128 and a chunk that is one of 16")
    _attend_body(Q, lim, scale, kop, vop, span, chunk, out, kbits, vbits)


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _attend_body(Q, lim, scale, kop, vop, span, chunk, out, kbits, vbits):
    """The one body of :func:`_attend` (``kbits = vbits = 0``: constants, so numba and LLVM leave the codes paths
    and the prefetches out of it) and :func:`_attend_codes`: per chunk of tokens, the operands read through their
    readers decoded into a scratch by one reader call each (all heads), then per KV head the scores
    (:func:`_scores_rows`, or :func:`_scores_codes_rows` on the codes of layout ``kbits``), the online softmax and
    the values (:func:`_values_rows` / :func:`_values_codes_rows`). Code operands are prefetched into L2
    :data:`CODES_AHEAD` chunks ahead."""
    G = Q.shape[0]
    RQ = Q.shape[1]
    D = Q.shape[2]
    read_k, kdata, kaux, kblocks = kop
    read_v, vdata, vaux, vblocks = vop
    t0, t1 = span
    M, L, ACC = out
    K = np.empty((chunk if kbits == 0 else 0, G, D), np.float32)
    V = np.empty((chunk if vbits == 0 else 0, G, D), np.float32)
    S = np.empty((RQ, chunk), np.float32)
    F = np.empty(RQ, np.float32)
    kp = address(kaux)
    vp = address(vaux)
    nka = kaux.shape[0]
    nva = vaux.shape[0]
    kts = kdata.shape[1] * kdata.shape[2]  # bytes a token (every head)
    vts = vdata.shape[1] * vdata.shape[2]
    _init_partials(M, L, ACC)
    for g in range(G):  # the task's first chunks, which the loop below prefetches for the later ones
        if kbits:
            _prefetch_share(kdata, t0 * kts, CODES_AHEAD * chunk * kts, t1 * kts, g, G)
        if vbits:
            _prefetch_share(vdata, t0 * vts, CODES_AHEAD * chunk * vts, t1 * vts, g, G)
    for c0 in range(t0, t1, chunk):
        n = min(chunk, t1 - c0)
        if kbits == 0:
            call_reader(read_k, address(kdata[c0]), address(K), n * G * kblocks, kp, nka)
        if vbits == 0:
            call_reader(read_v, address(vdata[c0]), address(V), n * G * vblocks, vp, nva)
        for g in range(G):
            m_out = M[g]
            l_out = L[g]
            acc = ACC[g]
            if kbits:  # the codes CODES_AHEAD chunks on, a 1/G share each head
                _prefetch_share(kdata, (c0 + CODES_AHEAD * chunk) * kts, chunk * kts, t1 * kts, g, G)
            if kbits == 0:
                _scores_rows(Q[g], K, g, S, n, RQ)
            else:
                _scores_codes_rows(Q[g], kdata, c0 * kts + g * kdata.shape[2], kts, n, kaux, kbits, kblocks, S, RQ)
            _online_softmax(S, n, c0, lim, scale, F, m_out, l_out, acc, chunk)
            if vbits == 0:
                _values_rows(S, V, g, acc, n, RQ)
            else:
                _prefetch_share(vdata, (c0 + CODES_AHEAD * chunk) * vts, chunk * vts, t1 * vts, g, G)
                _values_codes_rows(S, vdata, c0 * vts + g * vdata.shape[2], vts, n, vaux, vbits, vblocks, acc, RQ)


# ---------------------------------------------------------------------------
# Around the tasks: the query's rotation, the merge of the tasks' partial sums and the output's rotation back.
# tbq.attention._attention_kernel's serial steps compiled (a decode step spent about 1 ms of Python in them,
# a sixth of its time on two threads), each value computed by the operations of the NumPy it replaces, in the
# same order; the NumPy twin (twin=True) keeps that NumPy, the definition (docs/formats.md, *Fused attention
# arithmetic*), and tests/test_attention_arithmetic.py holds the two equal bit for bit.
# ---------------------------------------------------------------------------

from .formats.tbq_kernels import butterfly_1d  # noqa: E402  (the formats' one-block butterfly: fwht's additions)


@nb.njit(inline="always", nogil=True, error_model="numpy", boundscheck=False)
def _rotate_row(v, first, second, scale):
    """``second * (H(first * v) * scale)`` in place on one block ``v`` (:class:`tbq.rotation.RandomizedHadamard`:
    ``forward`` with ``(signs1, signs2)``, ``inverse`` with ``(signs2, signs1)``; the signs as floats of ``v``'s
    dtype and ``scale`` :func:`tbq.rotation.hadamard_scale` in it): the sign flips are exact, the butterfly is
    :func:`tbq.rotation.fwht`'s additions in its order, then one multiplication by the scale."""
    n = v.shape[0]
    for j in range(n):
        v[j] = v[j] * first[j]
    butterfly_1d(v)
    for j in range(n):
        v[j] = v[j] * scale
    for j in range(n):
        v[j] = v[j] * second[j]


@jit
def rotate_rows(x, first, second, scale):
    """:func:`_rotate_row` on every row of ``x`` (``(rows, n)``, C-contiguous, float32 or float64), in place: the
    query rows' rotation into the key cache's domain, block by block."""
    for i in range(x.shape[0]):
        _rotate_row(x[i], first, second, scale)


@jit
def merge_partials(w, L, ACC, n_main, first, second, scale, out):
    """The tasks' partial sums merged into the output, float32 ``out`` ``(n_query, n_head, D)``.

    ``w``: float64 ``(n, G, RQ)``, each task's weight ``exp(m_i - max m)`` (0 for a task that saw nothing);
    ``L`` float32 ``(n, G, RQ)``, ``ACC`` float32 ``(n, G, RQ, D)``: the tasks' sums and accumulators, the first
    ``n_main`` over the cache's tokens (in the value cache's domain), the others over the sink tokens. Row
    ``i * R + r`` of KV head ``g`` is query token ``i``, head ``g * R + r``. In float64, for each row: ``total``
    = the products ``w_i * L_i`` summed in task order from 0; ``o`` = the products ``w_i * ACC_i`` of the main
    tasks summed in task order from 0, rotated back block by block (:func:`_rotate_row` with ``first``,
    ``second``, ``scale``, blocks of ``first.shape[0]`` values) unless ``first`` is empty, then the sink tasks'
    products added in order; ``out = o / total`` rounded to float32."""
    n, G, RQ = w.shape
    D = ACC.shape[3]
    R = out.shape[1] // G
    bs = first.shape[0]
    o = np.empty(D, np.float64)
    for g in range(G):
        for row in range(RQ):
            total = 0.0
            for i in range(n):
                total += w[i, g, row] * np.float64(L[i, g, row])
            for j in range(D):
                o[j] = 0.0
            for i in range(n):
                if i == n_main and bs:  # the main tasks' sum is in the value cache's domain: rotate it back
                    for b in range(0, D, bs):
                        _rotate_row(o[b : b + bs], first, second, scale)
                wi = w[i, g, row]
                a = ACC[i, g, row]
                for j in range(D):
                    o[j] += wi * np.float64(a[j])
            if n == n_main and bs:
                for b in range(0, D, bs):
                    _rotate_row(o[b : b + bs], first, second, scale)
            dst = out[row // R, g * R + row % R]
            for j in range(D):
                dst[j] = np.float32(o[j] / total)
