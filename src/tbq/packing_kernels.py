"""numba twins of :mod:`tbq.packing`: the lane helpers the format kernels call, and array packers.

The helpers below are the only numba statement of each bit layout: the
format kernels pack and unpack through them, and the array functions that
``tbq.packing``'s ``backend="numba"`` reaches are built from them too, so the
layout the property tests check is the one the codecs ship.
"""

from __future__ import annotations

import numpy as np

from .intrinsics import store_nibble_rows
from .kernels import jit, jit_inline

# --- lane helpers (scalars in, scalars out) ------------------------------------------


@jit
def pair4(lo, hi):
    """One byte of two 4-bit codes: ``lo`` in the low nibble, ``hi`` in the high nibble."""
    return np.uint8((np.int32(lo) | (np.int32(hi) << 4)) & 0xFF)


@jit
def lo4(byte):
    """The low-nibble code of a byte (as int32)."""
    return np.int32(byte) & 15


@jit
def hi4(byte):
    """The high-nibble code of a byte (as int32)."""
    return np.int32(byte) >> 4


@jit
def lane3(i0, i1, i2, i3, i4, i5, i6, i7):
    """The 24-bit lane of eight 3-bit indices: ``sum(i_t << 3t)`` (as int32)."""
    return (
        np.int32(i0)
        | (np.int32(i1) << 3)
        | (np.int32(i2) << 6)
        | (np.int32(i3) << 9)
        | (np.int32(i4) << 12)
        | (np.int32(i5) << 15)
        | (np.int32(i6) << 18)
        | (np.int32(i7) << 21)
    )


@jit
def store_lane3(row, off, lane):
    """Write a 24-bit lane little-endian at ``row[off:off+3]``."""
    row[off] = np.uint8(lane & 0xFF)
    row[off + 1] = np.uint8((lane >> 8) & 0xFF)
    row[off + 2] = np.uint8((lane >> 16) & 0xFF)


@jit
def load_lane3(row, off):
    """The 24-bit lane stored little-endian at ``row[off:off+3]`` (as int32)."""
    return np.int32(row[off]) | (np.int32(row[off + 1]) << 8) | (np.int32(row[off + 2]) << 16)


@jit
def idx3(lane, t):
    """Index ``t`` (0..7) of a 24-bit lane."""
    return (lane >> (3 * t)) & 7


@jit_inline
def lanes_store_nibbles(K, out, g0, stop, off):
    """A lane encoder's 4-bit index store: bytes ``off ..`` of rows ``g0 + l`` of ``out``, ``l < stop``, are the
    :func:`pair4` bytes of lane ``l`` of the lane layout ``K[j, l]`` (indices 0 .. 15); ``off`` is 2 for the
    rotated formats (after the fp16 norm), 0 for vLLM's keys (the norm follows).

    Whole groups of 8 lanes of a 128-row layout by :func:`tbq.kernels.store_nibble_rows` (two vector stores a
    block), the rest byte by byte; the same bytes either way. ``out`` C-contiguous.
    """
    n, lanes = K.shape
    ts = out.shape[1]
    s8 = stop - stop % 8 if n == 128 else 0
    if s8:
        Kf = K.reshape(K.size)
        outf = out.reshape(out.size)
        for l0 in range(0, s8, 8):
            store_nibble_rows(Kf, l0, lanes, outf, (g0 + l0) * ts + off, ts)
    for l in range(s8, stop):
        orow = out[g0 + l]
        for k in range(n // 2):
            orow[off + k] = pair4(K[2 * k, l], K[2 * k + 1, l])


@jit_inline
def lanes_pack8(K, pack, P, p0):
    """``P[p0 + g, l]`` = ``pack`` of the eight indices ``K[8g, l] .. K[8g + 7, l]``, for every lane ``l`` of the
    lane layout ``K[j, l]`` and ``g < n // 8``: ``pack`` is :func:`lane3` (TBQ3's 24-bit lanes) or
    :func:`tbq.formats.planar_iso_kernels.signs_byte` (the 3-bit planes' bit 2)."""
    n, lanes = K.shape
    for g in range(n // 8):
        for l in range(lanes):
            P[p0 + g, l] = pack(
                K[8 * g, l],
                K[8 * g + 1, l],
                K[8 * g + 2, l],
                K[8 * g + 3, l],
                K[8 * g + 4, l],
                K[8 * g + 5, l],
                K[8 * g + 6, l],
                K[8 * g + 7, l],
            )


@jit_inline
def lanes_store_lane3(K, P, out, g0, stop, off):
    """A lane encoder's 3-bit index store: the indices of every lane of ``K[j, l]`` (0 .. 7) packed into the
    24-bit lanes ``P[g, l]`` (:func:`lane3`) at once, then bytes ``off ..`` of rows ``g0 + l``, ``l < stop``,
    written group by group (:func:`store_lane3`); ``off`` as in :func:`lanes_store_nibbles`."""
    n = K.shape[0]
    lanes_pack8(K, lane3, P, 0)
    for l in range(stop):
        orow = out[g0 + l]
        for g in range(n // 8):
            store_lane3(orow, off + 3 * g, P[g, l])


# --- array packers (1-D in, 1-D out), built on the helpers ---------------------------


@jit
def pack4_pairs_into(idx, out):
    """``out[k]`` = :func:`pair4` of indices ``2k`` and ``2k + 1`` of ``idx``, for ``k < idx.size // 2``."""
    for k in range(idx.size // 2):
        out[k] = pair4(idx[2 * k], idx[2 * k + 1])


@jit
def pack4_pairs(idx):
    out = np.empty(idx.size // 2, np.uint8)
    pack4_pairs_into(idx, out)
    return out


@jit
def unpack4_pairs_into(b, idx):
    """The inverse of :func:`pack4_pairs_into`: the ``idx.size`` indices of bytes ``b[: idx.size // 2]``."""
    for k in range(idx.size // 2):
        idx[2 * k] = lo4(b[k])
        idx[2 * k + 1] = hi4(b[k])


@jit
def unpack4_pairs(b):
    out = np.empty(b.size * 2, np.uint8)
    unpack4_pairs_into(b, out)
    return out


@jit
def pack4_halves(q):
    out = np.empty(q.size // 2, np.uint8)
    for blk in range(q.size // 32):
        for j in range(16):
            out[16 * blk + j] = pair4(q[32 * blk + j], q[32 * blk + j + 16])
    return out


@jit
def unpack4_halves(b):
    out = np.empty(b.size * 2, np.uint8)
    for blk in range(b.size // 16):
        for j in range(16):
            v = b[16 * blk + j]
            out[32 * blk + j] = lo4(v)
            out[32 * blk + j + 16] = hi4(v)
    return out


@jit
def pack3_into(idx, out):
    """The ``idx.size // 8`` 24-bit lanes (:func:`lane3`) of the indices ``idx`` at bytes ``0, 3, 6, ..`` of ``out``."""
    for g in range(idx.size // 8):
        i = 8 * g
        store_lane3(
            out,
            3 * g,
            lane3(idx[i], idx[i + 1], idx[i + 2], idx[i + 3], idx[i + 4], idx[i + 5], idx[i + 6], idx[i + 7]),
        )


@jit
def pack3(idx):
    out = np.empty(idx.size // 8 * 3, np.uint8)
    pack3_into(idx, out)
    return out


@jit
def unpack3_into(b, idx):
    """The inverse of :func:`pack3_into`: the ``idx.size`` indices of the lanes at the start of ``b``."""
    for g in range(idx.size // 8):
        lane = load_lane3(b, 3 * g)
        for t in range(8):
            idx[8 * g + t] = idx3(lane, t)


@jit
def unpack3(b):
    out = np.empty(b.size // 3 * 8, np.uint8)
    unpack3_into(b, out)
    return out
