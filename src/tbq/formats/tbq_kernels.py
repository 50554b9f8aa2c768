"""numba twins of :mod:`tbq.formats.tbq` (same bytes, same float32 bits).

The TBQ kernels work on ``lanes`` blocks at a time, transposed into a scratch
array T[j, lane]: coordinate j of every block in the group sits in one row.
Every loop over lanes is then a plain SIMD loop, and the spec's sequential
sums (sum of x_j^2, sum of c[idx_j]^2) stay sequential in j for each block
while ``lanes`` independent chains run side by side. This changes no
rounding: each block still sees exactly the spec's operations in the spec's
order. The lane count is a run-time value on purpose: with a compile-time
constant LLVM fully unrolls the lane loops and then fails to vectorise them
(it cannot prove the rows j and j+h do not alias); with a run-time trip
count the loop vectoriser adds an overlap check and uses full-width SIMD.
"""

from __future__ import annotations

import numpy as np

from ..intrinsics import (
    TARGET_AVX2,
    TARGET_AVX512VL,
    butterfly64,
    butterfly128,
    lookup8_row,
    lookup16_row,
    prefetch,
    store_fence,
    store_nontemporal,
)
from ..kernels import (
    F32,
    F32_0,
    F32_1,
    FLT_MAX,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SCALE_OVERFLOW,
    block_finite,
    f16_is_inf,
    f32_to_f16_bits,
    jit,
    lanes_index,
    lanes_load,
    lanes_norms,
    lanes_scratch,
    lanes_store_scales,
    lanes_sum_squares,
    load_f16,
    reader_aux,
    reader_blocks,
    reader_out,
    store_f16,
)
from ..packing_kernels import (
    hi4,
    idx3,
    lane3,
    lanes_store_lane3,
    lanes_store_nibbles,
    lo4,
    load_lane3,
    pair4,
    store_lane3,
)
from .reader_intrinsics import lookup8_row_table, lookup16_row_table

_EPS_NORM = F32(1e-10)

#: Blocks per group; a multiple of 8 (the transposition works on 8 x 8 tiles).
LANES = 32
#: Calls with fewer blocks than this run the one-block-at-a-time kernels
#: (:func:`encode_blocks`, :func:`decode_blocks`): a 32-lane group costs as
#: much for one block as for 32, and small calls (a fuzzer's one to four
#: blocks) are about latency, not throughput.
SMALL_BLOCKS = 8


@jit
def _butterfly_lanes(T):
    """The spec's butterfly applied to every column of T (n x lanes), in place, stage pairs at a time: the
    reference the lane kernels' :func:`tbq.kernels.butterfly128` / ``butterfly64`` are tested against (they
    hold a pass's rows in registers and are 1.2-2x faster).

    Stages h and 2h are fused (radix 4) to halve the passes over T; each
    output is still built from exactly the same additions in the same order:
    stage h gives (a+b, a-b, c+d, c-d) and stage 2h combines (a+b) with (c+d)
    and (a-b) with (c-d), as the in-place butterfly does.
    """
    n = T.shape[0]
    nl = T.shape[1]
    h = 1
    while 2 * h < n:
        for i in range(0, n, 4 * h):
            for j in range(i, i + h):
                for l in range(nl):
                    a = T[j, l]
                    b = T[j + h, l]
                    c = T[j + 2 * h, l]
                    d = T[j + 3 * h, l]
                    ab = a + b
                    amb = a - b
                    cd = c + d
                    cmd = c - d
                    T[j, l] = ab + cd
                    T[j + h, l] = amb + cmd
                    T[j + 2 * h, l] = ab - cd
                    T[j + 3 * h, l] = amb - cmd
        h *= 4
    if h < n:  # one radix-2 stage left (n = 2 * 4**k)
        for j in range(h):
            for l in range(nl):
                a = T[j, l]
                c = T[j + h, l]
                T[j, l] = a + c
                T[j + h, l] = a - c


@jit
def encode(x, out, bits, thresholds, centroids_sq, s1, cs2, raise_overflow, lanes):
    """TBQ4_0 (bits=4) / TBQ3_0 (bits=3) encoder, ``lanes`` blocks at a time (rows of 128 values, TBQ's block;
    ``lanes`` a multiple of 8).

    ``cs2`` is ``hadamard_scale * signs2`` as float32: multiplying by +-C is the
    same single rounding as multiplying by C and then flipping the sign.
    ``centroids_sq`` is ``c*c`` in float32, the exact terms of the recon sum.
    """
    nblk = x.shape[0]
    n = x.shape[1]
    T, K, norm2, norm, scale, recon2 = lanes_scratch(n, lanes)
    Tf = T.reshape(n * lanes)
    xf = x.reshape(x.size)
    P = np.zeros((n // 8 if bits == 3 else 0, lanes), np.int32)  # TBQ3's 24-bit lanes
    for g0 in range(0, nblk, lanes):
        L = min(lanes, nblk - g0)
        nxt = (g0 + lanes) * n  # the next group's first value: its cache lines are prefetched, 16 floats each
        # stage: transpose-in
        lanes_load(x, g0, T)
        # stage: norm
        # 1. norm: a sequential float32 sum per block (one chain per lane)
        lanes_sum_squares(T, norm2)
        # stage: end
        # the first lane whose input is not finite, and the norms (TBQ4: 1/norm; TBQ3: the norm at least 1e-10)
        bad = lanes_norms(x, g0, norm2, norm, scale, bits == 3, _EPS_NORM)
        # stage: normalise
        # 2. normalise and apply signs1 (exact), then the butterfly
        for j in range(n):
            sj = s1[j]
            if bits == 4:
                for l in range(lanes):
                    T[j, l] = (T[j, l] * scale[l]) * sj
            else:
                for l in range(lanes):
                    T[j, l] = (T[j, l] / norm[l]) * sj
            for p in range(0, lanes, 16):  # spread over the pass: a burst of prefetches waits for free fill buffers
                prefetch(xf, nxt + lanes * j + p)
        # stage: butterfly
        for l0 in range(0, lanes, 8):  # in registers, two passes (kernels.butterfly128)
            butterfly128(Tf, l0, lanes)
        # stage: index
        # 3. r = T * (+-1/sqrt(n)); index = number of thresholds <= r; and
        # 4. recon: a sequential float32 sum of c[idx]^2 per block, in the same pass (kernels.lanes_index)
        lanes_index(T, cs2, thresholds, centroids_sq, K, recon2)
        # stage: pack+store
        # 5. the scales of the finite lanes (up to an overflow raised), then the indices of those lanes
        stop = lanes_store_scales(recon2, norm, out, g0, bad, raise_overflow, bits == 3, _EPS_NORM)
        if bits == 4:
            lanes_store_nibbles(K, out, g0, stop, 2)
        else:  # pack the indices of all lanes at once, then store block by block
            lanes_store_lane3(K, P, out, g0, stop, 2)
        if stop < bad:
            return g0 + stop, STATUS_SCALE_OVERFLOW
        # stage: end
        if bad < L:
            return g0 + bad, STATUS_NONFINITE
    return -1, STATUS_OK


#: Outputs of at least this many bytes are written with streaming stores (larger than a core's L2).
STREAM_BYTES = 1 << 21


@jit
def decode(data, out, bits, centroids, s2, cs1, table, lanes):
    """TBQ decoder, ``lanes`` blocks at a time (128 values a block; ``lanes`` a multiple of 4):
    ``y = (H(s2 * c[idx]) * (C * s1)) * d``.

    The scratch holds channel pairs: ``T[k, 2l + e]`` is channel ``2k + e`` of
    block ``l``, so the two centroids of a byte of indices (4 bits) or of a
    6-bit pair (3 bits) are one 8-byte copy from a pair table, and so is each
    pair on the way out. The butterfly's first stage (channels 2k, 2k+1) runs
    inside the rows; its other stages run on the rows in vector registers
    (:func:`tbq.kernels.butterfly64`). Every value sees the spec's operations in the
    spec's order. An output of ``STREAM_BYTES`` or more is written with
    streaming stores: at 16M values the decoder was bound by reading the
    output's cache lines before writing them (about +50% without).
    """
    nblk = data.shape[0]
    n = out.shape[1]
    h = n // 2
    T = np.zeros((h, 2 * lanes), np.float32)
    Tf = T.reshape(T.size)
    T64 = T.view(np.uint64)  # (h, lanes): the pair of channels 2k, 2k+1 of block l
    out64 = out.view(np.uint64)  # (blocks, h)
    outf64 = out64.reshape(out64.size)
    stream = out.size * 4 >= STREAM_BYTES
    nc = centroids.shape[0]
    pair = np.empty(2 * nc * nc, np.float32)
    for v in range(nc * nc):  # pair v = (c[v % nc], c[v // nc]): a byte (4 bits) or a 6-bit pair (3 bits)
        pair[2 * v] = centroids[v % nc]
        pair[2 * v + 1] = centroids[v // nc]
    pair64 = pair.view(np.uint64)
    d = np.zeros(lanes, np.float32)
    for g0 in range(0, nblk, lanes):
        L = min(lanes, nblk - g0)
        # stage: unpack
        for l in range(L):  # look up the pairs, transposing into T
            row = g0 + l
            d[l] = load_f16(data, row, table)
            drow = data[row]
            if bits == 4:
                for k in range(h):
                    T64[k, l] = pair64[np.int64(drow[2 + k])]
            else:
                for g in range(n // 8):
                    lane = np.int64(load_lane3(drow, 2 + 3 * g))
                    T64[4 * g, l] = pair64[lane & 63]
                    T64[4 * g + 1, l] = pair64[(lane >> 6) & 63]
                    T64[4 * g + 2, l] = pair64[(lane >> 12) & 63]
                    T64[4 * g + 3, l] = pair64[(lane >> 18) & 63]
        # stage: end
        for l in range(L, lanes):
            for k in range(h):
                T64[k, l] = np.uint64(0)
        # stage: signs2
        for k in range(h):  # signs2 (exact), then the butterfly's first stage: channels 2k and 2k+1
            se = s2[2 * k]
            so = s2[2 * k + 1]
            tk = T[k]
            for l in range(lanes):
                a = tk[2 * l] * se
                b = tk[2 * l + 1] * so
                tk[2 * l] = a + b
                tk[2 * l + 1] = a - b
        # stage: butterfly
        for c0 in range(0, 2 * lanes, 8):  # stages 2 .. n/2 of the channels are stages 1 .. n/4 of the rows
            butterfly64(Tf, c0, 2 * lanes)  # in registers, two passes (kernels.butterfly64)
        # stage: scale
        for k in range(h):  # (v * (+-C)) * d: two roundings, as the spec's R^-1 then the scale
            ce = cs1[2 * k]
            co = cs1[2 * k + 1]
            tk = T[k]
            for l in range(lanes):
                tk[2 * l] = (tk[2 * l] * ce) * d[l]
                tk[2 * l + 1] = (tk[2 * l + 1] * co) * d[l]
        # stage: transpose-out
        if stream:  # a large output: streaming stores (no read-for-ownership of the output's cache lines)
            for l in range(L):
                base = (g0 + l) * h
                for k in range(h):
                    store_nontemporal(outf64, base + k, T64[k, l])
        else:
            for l in range(L):  # transpose out, a pair at a time
                o = out64[g0 + l]
                for k in range(h):
                    o[k] = T64[k, l]
        # stage: end
    if stream:
        store_fence()
    return out


# ---------------------------------------------------------------------------
# One block at a time (small calls): the same operations in the same order
# ---------------------------------------------------------------------------


@jit
def butterfly_1d(v):
    """:func:`_butterfly_lanes` for one block (``v`` of length n): the same additions, the same order."""
    n = v.shape[0]
    h = 1
    while 2 * h < n:
        for i in range(0, n, 4 * h):
            for j in range(i, i + h):
                a = v[j]
                b = v[j + h]
                c = v[j + 2 * h]
                d = v[j + 3 * h]
                ab = a + b
                amb = a - b
                cd = c + d
                cmd = c - d
                v[j] = ab + cd
                v[j + h] = amb + cmd
                v[j + 2 * h] = ab - cd
                v[j + 3 * h] = amb - cmd
        h *= 4
    if h < n:
        for j in range(h):
            a = v[j]
            c = v[j + h]
            v[j] = a + c
            v[j + h] = a - c


@jit
def _sum_squares_1d(row):
    """Step 1 of one block: the sequential float32 sum of x_j^2."""
    norm2 = F32_0
    for j in range(row.shape[0]):
        norm2 += row[j] * row[j]
    return norm2


@jit
def _rotate_1d(row, norm2, v, bits, s1, cs2):
    """Steps 2-3 of one block whose sum of squares is ``norm2``: ``v`` = r (normalise, signs1, butterfly,
    +-1/sqrt(n)); returns the norm (clamped below at 1e-10 for 3 bits, as the spec)."""
    n = row.shape[0]
    nv = np.sqrt(norm2)
    if bits == 4:
        sc = F32_1 / nv if nv > _EPS_NORM else F32_0
        for j in range(n):
            v[j] = (row[j] * sc) * s1[j]
    else:
        nv = nv if nv > _EPS_NORM else _EPS_NORM
        for j in range(n):
            v[j] = (row[j] / nv) * s1[j]
    butterfly_1d(v)
    for j in range(n):
        v[j] = v[j] * cs2[j]
    return nv


@jit
def _index_scale_1d(r, nv, K, bits, thresholds, centroids_sq):
    """Steps 3-4 of one block: ``K`` = the number of thresholds <= r, and the scale d = norm / ||c[K]||
    (``c[K]^2`` summed sequentially in float32)."""
    nt = thresholds.shape[0]
    recon2 = F32_0
    for j in range(r.shape[0]):
        k = np.int32(0)
        for i in range(nt):
            k += np.int32(r[j] >= thresholds[i])
        K[j] = k
        recon2 += centroids_sq[k]
    recon = np.sqrt(recon2)
    if bits == 4:
        return nv / recon if recon > _EPS_NORM else nv
    return nv / (recon if recon > _EPS_NORM else _EPS_NORM)


@jit
def encode_blocks(x, out, bits, thresholds, centroids_sq, s1, cs2, raise_overflow):
    """:func:`encode` one block at a time (for calls of a few blocks); identical bytes and status."""
    nblk = x.shape[0]
    n = x.shape[1]
    v = np.empty(n, np.float32)
    K = np.empty(n, np.int32)
    for b in range(nblk):
        row = x[b]
        norm2 = _sum_squares_1d(row)  # 1.
        if not (norm2 <= FLT_MAX) and not block_finite(x, b):
            return b, STATUS_NONFINITE
        nv = _rotate_1d(row, norm2, v, bits, s1, cs2)  # 2.-3.
        d = _index_scale_1d(v, nv, K, bits, thresholds, centroids_sq)  # 3.-4.
        h = f32_to_f16_bits(d)
        if raise_overflow and f16_is_inf(h):
            return b, STATUS_SCALE_OVERFLOW
        store_f16(out, b, h)  # 5. store
        orow = out[b]
        if bits == 4:
            for k in range(n // 2):
                orow[2 + k] = pair4(K[2 * k], K[2 * k + 1])
        else:
            for g in range(n // 8):
                store_lane3(
                    orow,
                    2 + 3 * g,
                    lane3(
                        K[8 * g],
                        K[8 * g + 1],
                        K[8 * g + 2],
                        K[8 * g + 3],
                        K[8 * g + 4],
                        K[8 * g + 5],
                        K[8 * g + 6],
                        K[8 * g + 7],
                    ),
                )
    return -1, STATUS_OK


@jit
def rotate_blocks(x, bits, thresholds, centroids_sq, s1, cs2, norm, r, d, with_scale):
    """Steps 1-4 of :func:`encode_blocks` for finite blocks, without the store: each block's norm, rotated
    coordinates and float32 scale, the ``norm``, ``r`` and ``d`` of the NumPy trace (``reference_encode``),
    bit for bit (the same helpers as the encoder). For the fuzzing strategies, which ask for rotated
    coordinates and scales thousands of times per example; a NaN or infinite input is not handled here
    (the NumPy clamp of a NaN norm differs): callers pass finite blocks only. Without ``with_scale``
    only ``norm`` and ``r`` are written.
    """
    K = np.empty(x.shape[1], np.int32)
    for b in range(x.shape[0]):
        row = x[b]
        norm[b] = _rotate_1d(row, _sum_squares_1d(row), r[b], bits, s1, cs2)
        if with_scale:
            d[b] = _index_scale_1d(r[b], norm[b], K, bits, thresholds, centroids_sq)


@jit
def decode_blocks(data, out, bits, centroids, s2, cs1, table):
    """:func:`decode` one block at a time (for calls of a few blocks); identical float32 bits."""
    nblk = data.shape[0]
    n = out.shape[1]
    v = np.empty(n, np.float32)
    for b in range(nblk):
        d = load_f16(data, b, table)
        drow = data[b]
        if bits == 4:
            for k in range(n // 2):
                byte = drow[2 + k]
                v[2 * k] = centroids[lo4(byte)] * s2[2 * k]
                v[2 * k + 1] = centroids[hi4(byte)] * s2[2 * k + 1]
        else:
            for g in range(n // 8):
                lane = load_lane3(drow, 2 + 3 * g)
                for t in range(8):
                    v[8 * g + t] = centroids[idx3(lane, t)] * s2[8 * g + t]
        butterfly_1d(v)
        orow = out[b]
        for j in range(n):
            orow[j] = (v[j] * cs1[j]) * d
    return out


#: How far ahead of the block it decodes an attention reader prefetches the cache's bytes (a hint: no value
#: changes). The fused kernel calls a reader once per chunk of consecutive blocks and the next chunk follows in
#: memory, so the last blocks of a call prefetch the next call's first ones. Without it a reader streaming a
#: cache larger than L2 stalled on its loads: tbq4_0's reader took 2.5 ms per 32K-token cache where the same
#: work on bytes already in cache took 1.75 ms (1 thread, AMD EPYC Zen 5); 2-4 KiB ahead closed the gap.
READ_AHEAD = 4096


@jit
def prefetch_block(data, b):
    """Prefetch the bytes of the block :data:`READ_AHEAD` bytes past block ``b`` of ``data`` (its first and
    last byte: a block of more than 64 bytes can span two cache lines beyond the first's)."""
    ts = data.shape[1]
    at = b * ts + READ_AHEAD
    prefetch(data, at)
    prefetch(data, at + ts - 1)


@jit
def read_rotated(data, out, table, centroids):
    """Blocks in the rotated domain: ``out[b, j] = centroids[idx_j] * d`` (one rounded product; no inverse rotation),
    the cache's bytes prefetched ahead (:func:`prefetch_block`)."""
    for b in range(data.shape[0]):
        src = data[b]
        dst = out[b]
        prefetch_block(data, b)
        d = load_f16(data, b, table)
        if centroids.shape[0] == 16 and TARGET_AVX512VL:  # two broadcast words a 16 (reader_intrinsics)
            lookup16_row_table(data, b * data.shape[1] + 2, out, b * out.shape[1], centroids, d)
        elif centroids.shape[0] == 8 and TARGET_AVX512VL:  # two broadcast words a 16 (reader_intrinsics)
            lookup8_row_table(data, b * data.shape[1] + 2, out, b * out.shape[1], centroids, d)
        elif centroids.shape[0] == 16 and TARGET_AVX2:  # the same products, looked up by vpermps (kernels.lookup16_row)
            lookup16_row(data, b * data.shape[1] + 2, out, b * out.shape[1], centroids, d)
        elif centroids.shape[0] == 16:
            for k in range(64):
                v = src[2 + k]
                dst[2 * k] = centroids[lo4(v)] * d
                dst[2 * k + 1] = centroids[hi4(v)] * d
        elif TARGET_AVX2:  # 3 bits: one vpermps per 8 indices (kernels.lookup8_row)
            lookup8_row(data, b * data.shape[1] + 2, out, b * out.shape[1], centroids, d)
        else:
            for lg in range(16):
                lane = load_lane3(src, 2 + 3 * lg)
                for t in range(8):
                    dst[8 * lg + t] = centroids[idx3(lane, t)] * d
    return out


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`) of TBQ4_0 and TBQ3_0, in the rotated
    domain (:func:`read_rotated`): ``aux`` is the fp16 table followed by the 16 or 8 centroids."""
    a = reader_aux(aux, n_aux)
    nc = n_aux - 65536
    read_rotated(
        reader_blocks(src, n_blocks, 2 + 16 * (4 if nc == 16 else 3)),
        reader_out(dst, n_blocks, 128),
        a[:65536],
        a[65536:],
    )
