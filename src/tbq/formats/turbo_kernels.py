"""numba twins of :mod:`tbq.formats.turbo` (same bytes, same float32 bits).

The encoder is TBQ4_0's (:mod:`tbq.formats.tbq_kernels`: the sequential sum of squares, ``x * (1/norm)``,
signs1, the butterfly, ``* (+-1/sqrt(128))``, the count of thresholds, the corrected norm), run with turbo's
tables into a scratch of TBQ4_0 blocks (fp16 ``d`` + the indices in nibble pairs), whose indices
:func:`repack` then writes in turbo's layout; that is turbo's arithmetic step for step on finite input.
Finite input never gives a NaN rotated coordinate, so the count ``#{k : r >= t_k}`` is the spec's
``#{k : not (r < t_k)}``; non-finite input is refused (``STATUS_NONFINITE``), as by every format. turbo2's
three thresholds are padded with +inf to the 3-bit kernels' seven (no finite coordinate reaches them).

The decoder is one rounded product per value, ``C[idx] * d``, with no inverse rotation.
"""

from __future__ import annotations

import numpy as np

from ..intrinsics import TARGET_AVX2, TARGET_AVX512VL, lookup16_row
from ..kernels import STATUS_OK, jit, load_f16, reader_aux, reader_blocks, reader_out
from ..packing_kernels import hi4, lo4
from . import tbq_kernels
from .planar_iso_kernels import (
    _I0,
    _I1,
    _I2,
    _I3,
    _I4,
    _I5,
    _I6,
    _I7,
    idx3_planes,
    lookup_planes3_row,
    lookup_qs_row,
    qs_byte,
    signs_byte,
)
from .reader_intrinsics import (
    lookup16_row_table,
    lookup_planes3_row_table,
    lookup_qs_row_table,
)

_SHIFTS2 = np.array([0, 2, 4, 6], np.int64)
#: bytes of a TBQ4_0 block, the encoder's scratch layout
_TBQ4_BYTES = 66


def encode(x, out, bits, thresholds, centroids_sq, s1, cs2, raise_overflow):
    """turbo2 (bits=2) / turbo3 (3) / turbo4 (4) encoder; returns ``(block, status)`` as every encode kernel.

    ``thresholds`` / ``centroids_sq``: 15 and 16 values, or 7 and 8 (turbo2's padded); ``cs2`` is
    ``INV * signs2`` (exact: +-INV), ``centroids_sq`` the exact float32 terms of the recon sum.
    """
    n = x.shape[0]
    scratch = np.empty((n, _TBQ4_BYTES), np.uint8)
    if n < tbq_kernels.SMALL_BLOCKS:
        b, status = tbq_kernels.encode_blocks(x, scratch, 4, thresholds, centroids_sq, s1, cs2, raise_overflow)
    else:
        b, status = tbq_kernels.encode(
            x, scratch, 4, thresholds, centroids_sq, s1, cs2, raise_overflow, tbq_kernels.LANES
        )
    repack(scratch, out, bits, n if status == STATUS_OK else b)
    return b, status


@jit
def repack(scratch, out, bits, n):
    """The first ``n`` TBQ4_0 blocks of ``scratch`` (fp16 ``d``, indices in nibble pairs) in turbo's layout."""
    for b in range(n):
        src = scratch[b]
        orow = out[b]
        orow[0] = src[0]
        orow[1] = src[1]
        if bits == 4:
            orow[2] = np.uint8(0)  # rnorm: fp16 +0
            orow[3] = np.uint8(0)
            for k in range(64):
                orow[4 + k] = src[2 + k]
            continue
        for k in range(32):  # qs: four indices a byte (the low 2 bits of turbo3's)
            v0, v1 = src[2 + 2 * k], src[3 + 2 * k]
            orow[2 + k] = np.uint8(qs_byte(lo4(v0), hi4(v0), lo4(v1), hi4(v1)))
        if bits == 3:
            for m in range(16):  # signs: bit 2 of eight indices a byte
                o = 2 + 4 * m
                a, c, e, g = src[o], src[o + 1], src[o + 2], src[o + 3]
                orow[34 + m] = np.uint8(signs_byte(lo4(a), hi4(a), lo4(c), hi4(c), lo4(e), hi4(e), lo4(g), hi4(g)))


@jit
def decode(data, out, bits, centroids, table):
    """turbo decoder: ``out[b, j] = centroids[idx_j] * d`` (one rounded product; no inverse rotation)."""
    for b in range(data.shape[0]):
        src = data[b]
        dst = out[b]
        d = load_f16(data, b, table)
        if TARGET_AVX2:  # the same products, looked up by vpermps (kernels.lookup16_row, the planes' twins)
            if bits == 4:
                lookup16_row(data, b * data.shape[1] + 4, out, b * out.shape[1], centroids, d)
            elif bits == 3:
                lookup_planes3_row(data, b * data.shape[1] + 2, out, b * out.shape[1], centroids, d)
            else:
                lookup_qs_row(data, b * data.shape[1] + 2, out, b * out.shape[1], centroids, d)
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


@jit
def read_rotated(data, out, bits, centroids, table):
    """The attention reader's body: :func:`decode`'s products, the same bits (with AVX-512VL looked up in a
    per-block table of products, :mod:`tbq.formats.reader_intrinsics`; with AVX2 alone by :func:`decode`'s
    intrinsics; elsewhere :func:`decode` itself), the cache's bytes prefetched ahead
    (:func:`tbq.formats.tbq_kernels.prefetch_block`)."""
    if not TARGET_AVX2:
        return decode(data, out, bits, centroids, table)
    for b in range(data.shape[0]):
        tbq_kernels.prefetch_block(data, b)
        d = load_f16(data, b, table)
        if bits == 4 and TARGET_AVX512VL:  # a per-block table of products (reader_intrinsics)
            lookup16_row_table(data, b * data.shape[1] + 4, out, b * out.shape[1], centroids, d)
        elif bits == 4:
            lookup16_row(data, b * data.shape[1] + 4, out, b * out.shape[1], centroids, d)
        elif bits == 3 and TARGET_AVX512VL:  # a per-block table of products (reader_intrinsics)
            lookup_planes3_row_table(data, b * data.shape[1] + 2, out, b * out.shape[1], centroids, d)
        elif bits == 3:
            lookup_planes3_row(data, b * data.shape[1] + 2, out, b * out.shape[1], centroids, d)
        elif TARGET_AVX512VL:
            lookup_qs_row_table(data, b * data.shape[1] + 2, out, b * out.shape[1], centroids, d)
        else:
            lookup_qs_row(data, b * data.shape[1] + 2, out, b * out.shape[1], centroids, d)
    return out


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`) of turbo2/3/4: their decoder's values,
    already the rotated domain's (:func:`read_rotated`); ``aux`` is the fp16 table followed by the 4, 8 or 16 centroids."""
    a = reader_aux(aux, n_aux)
    nc = n_aux - 65536
    bits = 4 if nc == 16 else (3 if nc == 8 else 2)
    read_rotated(
        reader_blocks(src, n_blocks, 2 + 16 * bits + (2 if bits == 4 else 0)),
        reader_out(dst, n_blocks, 128),
        bits,
        a[65536:],
        a[:65536],
    )
