"""numba twins of :mod:`tbq.formats.turbo` (same bytes, same float32 bits).

The encoder is TBQ4_0's one-block path (:mod:`tbq.formats.tbq_kernels`: the sequential sum of squares,
``x * (1/norm)``, signs1, the butterfly, ``* (+-1/sqrt(128))``, the count of thresholds, the corrected
norm), which is turbo's arithmetic step for step on finite input, followed by turbo's packing
(turbo3's planes are planar3_0's, :mod:`tbq.formats.planar_iso_kernels`). Finite input never gives a
NaN rotated coordinate, so the count ``#{k : r >= t_k}`` is the spec's ``#{k : not (r < t_k)}``;
non-finite input is refused (``STATUS_NONFINITE``), as by every format.

The decoder is one rounded product per value, ``C[idx] * d``, with no inverse rotation.
"""

from __future__ import annotations

import numpy as np

from ..kernels import (
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SCALE_OVERFLOW,
    TARGET_AVX2,
    block_finite,
    f16_is_inf,
    f32_to_f16_bits,
    jit,
    load_f16,
    lookup16_row,
    reader_aux,
    reader_blocks,
    reader_out,
    store_f16,
)
from ..packing_kernels import hi4, lo4, pair4
from .planar_iso_kernels import _I0, _I1, _I2, _I3, _I4, _I5, _I6, _I7, idx3_planes, qs_byte, signs_byte
from .tbq_kernels import _index_scale_1d, _rotate_1d, _sum_squares_1d

F32 = np.float32
_FLT_MAX = F32(3.4028234663852886e38)
_SHIFTS2 = np.array([0, 2, 4, 6], np.int64)


@jit
def encode(x, out, bits, thresholds, centroids_sq, s1, cs2, raise_overflow):
    """turbo2 (bits=2) / turbo3 (3) / turbo4 (4) encoder, one block at a time; returns ``(block, status)``.

    ``cs2`` is ``INV * signs2`` (exact: +-INV), ``centroids_sq`` the exact float32 terms of the recon sum.
    """
    nblk = x.shape[0]
    n = x.shape[1]
    v = np.empty(n, np.float32)
    K = np.empty(n, np.int32)
    for b in range(nblk):
        row = x[b]
        norm2 = _sum_squares_1d(row)  # 1.
        if not (norm2 <= _FLT_MAX) and not block_finite(x, b):
            return b, STATUS_NONFINITE
        nv = _rotate_1d(row, norm2, v, 4, s1, cs2)  # 2.-3.: x * (1/norm or 0), R
        d = _index_scale_1d(v, nv, K, 4, thresholds, centroids_sq)  # 4.-5.: indices, norm / recon
        h = f32_to_f16_bits(d)
        if raise_overflow and f16_is_inf(h):
            return b, STATUS_SCALE_OVERFLOW
        store_f16(out, b, h)  # 6. store
        orow = out[b]
        if bits == 2:
            for k in range(n // 4):
                orow[2 + k] = np.uint8(qs_byte(K[4 * k], K[4 * k + 1], K[4 * k + 2], K[4 * k + 3]))
        elif bits == 3:
            for k in range(n // 4):
                orow[2 + k] = np.uint8(qs_byte(K[4 * k], K[4 * k + 1], K[4 * k + 2], K[4 * k + 3]))
            for m in range(n // 8):
                o = 8 * m
                orow[2 + n // 4 + m] = np.uint8(
                    signs_byte(K[o], K[o + 1], K[o + 2], K[o + 3], K[o + 4], K[o + 5], K[o + 6], K[o + 7])
                )
        else:
            orow[2] = np.uint8(0)  # rnorm: fp16 +0
            orow[3] = np.uint8(0)
            for k in range(n // 2):
                orow[4 + k] = pair4(K[2 * k], K[2 * k + 1])
    return -1, STATUS_OK


@jit
def decode(data, out, bits, centroids, table):
    """turbo decoder: ``out[b, j] = centroids[idx_j] * d`` (one rounded product; no inverse rotation)."""
    for b in range(data.shape[0]):
        src = data[b]
        dst = out[b]
        d = load_f16(data, b, table)
        if bits == 4 and TARGET_AVX2:  # the same products, looked up by vpermps (kernels.lookup16_row)
            lookup16_row(data, b * data.shape[1] + 4, out, b * out.shape[1], centroids, d)
        elif bits == 4:
            for k in range(64):
                v = src[4 + k]
                dst[2 * k] = centroids[lo4(v)] * d
                dst[2 * k + 1] = centroids[hi4(v)] * d
        elif bits == 3:
            for m in range(16):  # 8 indices: qs bytes 2m, 2m+1 and signs byte m
                qa = src[2 + 2 * m]
                qb = src[3 + 2 * m]
                sg = src[34 + m]
                o = 8 * m
                dst[o] = centroids[idx3_planes(qa, sg, _I0, _I0)] * d
                dst[o + 1] = centroids[idx3_planes(qa, sg, _I1, _I1)] * d
                dst[o + 2] = centroids[idx3_planes(qa, sg, _I2, _I2)] * d
                dst[o + 3] = centroids[idx3_planes(qa, sg, _I3, _I3)] * d
                dst[o + 4] = centroids[idx3_planes(qb, sg, _I0, _I4)] * d
                dst[o + 5] = centroids[idx3_planes(qb, sg, _I1, _I5)] * d
                dst[o + 6] = centroids[idx3_planes(qb, sg, _I2, _I6)] * d
                dst[o + 7] = centroids[idx3_planes(qb, sg, _I3, _I7)] * d
        else:
            for k in range(32):
                v = np.int64(src[2 + k])
                for t in range(4):
                    dst[4 * k + t] = centroids[(v >> _SHIFTS2[t]) & 3] * d
    return out


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`) of turbo2/3/4: their decoder, whose
    values are already the rotated domain's; ``aux`` is the fp16 table followed by the 4, 8 or 16 centroids."""
    a = reader_aux(aux, n_aux)
    nc = n_aux - 65536
    bits = 4 if nc == 16 else (3 if nc == 8 else 2)
    decode(
        reader_blocks(src, n_blocks, 2 + 16 * bits + (2 if bits == 4 else 0)),
        reader_out(dst, n_blocks, 128),
        bits,
        a[65536:],
        a[:65536],
    )
