"""Bit packing of the three index layouts, NumPy and numba twins.

- ``pack4_pairs``  (TBQ4_0): byte ``k`` = index ``2k`` (low nibble) | index ``2k+1`` (high nibble).
- ``pack4_halves`` (Q4_0):   per 32-value block, byte ``j`` = code ``j`` (low) | code ``j+16`` (high).
- ``pack3``        (TBQ3_0): each 8 indices form a 24-bit little-endian lane
  ``L = sum(idx[8g+t] << 3t)``, stored as bytes ``L & 0xFF, (L >> 8) & 0xFF, L >> 16``.
  Indices 0..7 pack to ``0x88 0xC6 0xFA``.

Every function works along the last axis, batched over leading axes, and
takes ``backend="numpy"`` or ``"numba"`` (default: numba when available). Both
give identical bytes. Pack functions reject indices that do not fit the
field width instead of masking them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .backend import resolve_backend
from .errors import BlockShapeError, TbqTypeError, TbqValueError

__all__ = ["pack4_pairs", "unpack4_pairs", "pack4_halves", "unpack4_halves", "pack3", "unpack3", "pack3_fork_bug"]


def _uint8(a: ArrayLike, what: str) -> NDArray[np.uint8]:
    a = np.asarray(a)
    if a.dtype != np.uint8:
        raise TbqTypeError(f"{what} must be uint8, got {a.dtype}")
    if a.ndim == 0:
        raise TbqValueError(f"{what} needs at least one axis")
    return np.ascontiguousarray(a)


def _check_len(a: NDArray[Any], multiple: int, what: str) -> None:
    if a.shape[-1] % multiple:
        raise BlockShapeError(f"{what}: last axis {a.shape[-1]} is not a multiple of {multiple}")


def _check_max(idx: NDArray[Any], limit: int) -> None:
    if idx.size and int(idx.max()) >= limit:
        pos = np.unravel_index(int(np.argmax(idx >= limit)), idx.shape)
        raise TbqValueError(
            f"index {int(idx[pos])} at position {tuple(int(p) for p in pos)} does not fit in {limit.bit_length() - 1} bits"
        )


def _backend(backend: str | None) -> str:
    return resolve_backend(backend)


# --- NumPy twins: the layouts written as array expressions --------------------


def np_pack4_pairs(idx: NDArray[np.uint8]) -> NDArray[np.uint8]:
    return (idx[..., 0::2] | (idx[..., 1::2] << 4)).astype(np.uint8)


def np_unpack4_pairs(b: NDArray[np.uint8]) -> NDArray[np.uint8]:
    out = np.empty(b.shape[:-1] + (2 * b.shape[-1],), np.uint8)
    out[..., 0::2] = b & 0x0F
    out[..., 1::2] = b >> 4
    return out


# Shapes are spelled out rather than inferred with -1, which numpy cannot do for
# arrays with a zero-length axis.


def np_pack4_halves(q: NDArray[np.uint8]) -> NDArray[np.uint8]:
    lead, n = q.shape[:-1], q.shape[-1]
    blk = q.reshape(lead + (n // 32, 32))
    return (blk[..., :16] | (blk[..., 16:] << 4)).astype(np.uint8).reshape(lead + (n // 2,))


def np_unpack4_halves(b: NDArray[np.uint8]) -> NDArray[np.uint8]:
    lead, n = b.shape[:-1], b.shape[-1]
    blk = b.reshape(lead + (n // 16, 16))
    return np.concatenate((blk & 0x0F, blk >> 4), axis=-1).reshape(lead + (2 * n,))


def np_pack3(idx: NDArray[np.uint8]) -> NDArray[np.uint8]:
    lead, n = idx.shape[:-1], idx.shape[-1]
    g = idx.reshape(lead + (n // 8, 8)).astype(np.uint32)
    lane = np.zeros(g.shape[:-1], np.uint32)
    for t in range(8):
        lane |= g[..., t] << np.uint32(3 * t)
    out = np.stack(((lane & 0xFF), (lane >> 8) & 0xFF, lane >> 16), axis=-1).astype(np.uint8)
    return out.reshape(lead + (n // 8 * 3,))


def np_unpack3(b: NDArray[np.uint8]) -> NDArray[np.uint8]:
    lead, n = b.shape[:-1], b.shape[-1]
    g = b.reshape(lead + (n // 3, 3)).astype(np.uint32)
    lane = g[..., 0] | (g[..., 1] << 8) | (g[..., 2] << 16)
    out = np.stack([(lane >> np.uint32(3 * t)) & 7 for t in range(8)], axis=-1).astype(np.uint8)
    return out.reshape(lead + (n // 3 * 8,))


# --- public dispatch ------------------------------------------------------------


def _run(
    np_fn: Callable[[NDArray[np.uint8]], NDArray[np.uint8]],
    a: ArrayLike,
    what: str,
    backend: str | None,
    per_in: int,
    per_out: int,
    limit: int = 0,
) -> NDArray[np.uint8]:
    """One layout function: ``np_fn`` or its numba twin (``packing_kernels`` names it without the ``np_``) along the
    last axis of ``a``, every ``per_in`` entries giving ``per_out``. ``a`` (``what``: "indices", "packed bytes") is
    checked first: uint8, whole groups of ``per_in``, and with a ``limit`` (a packer's field) every value below it."""
    name = np_fn.__name__.removeprefix("np_")
    a = _uint8(a, what)
    _check_len(a, per_in, name)
    if limit:
        _check_max(a, limit)
    if _backend(backend) == "numba":
        from . import packing_kernels

        out_shape = a.shape[:-1] + (a.shape[-1] // per_in * per_out,)
        return getattr(packing_kernels, name)(a.reshape(a.size)).reshape(out_shape)
    return np_fn(a)


def pack4_pairs(idx: ArrayLike, *, backend: str | None = None) -> NDArray[np.uint8]:
    """Pack 4-bit indices in adjacent pairs (TBQ4_0 layout).

    >>> pack4_pairs(np.uint8([1, 2, 15, 0]), backend="numpy")
    array([33, 15], dtype=uint8)
    """
    return _run(np_pack4_pairs, idx, "indices", backend, 2, 1, limit=16)


def unpack4_pairs(data: ArrayLike, *, backend: str | None = None) -> NDArray[np.uint8]:
    """Inverse of :func:`pack4_pairs`: each byte gives (low nibble, high nibble)."""
    return _run(np_unpack4_pairs, data, "packed bytes", backend, 1, 2)


def pack4_halves(q: ArrayLike, *, backend: str | None = None) -> NDArray[np.uint8]:
    """Pack 4-bit codes in Q4_0 order: per 32 codes, byte j = q[j] | q[j+16] << 4.

    >>> pack4_halves(np.arange(32, dtype=np.uint8) % 16, backend="numpy")[:3]
    array([ 0, 17, 34], dtype=uint8)
    """
    return _run(np_pack4_halves, q, "codes", backend, 32, 16, limit=16)


def unpack4_halves(data: ArrayLike, *, backend: str | None = None) -> NDArray[np.uint8]:
    """Inverse of :func:`pack4_halves` (last axis a multiple of 16 bytes)."""
    return _run(np_unpack4_halves, data, "packed bytes", backend, 16, 32)


def pack3(idx: ArrayLike, *, backend: str | None = None) -> NDArray[np.uint8]:
    """Pack 3-bit indices into 24-bit little-endian lanes (TBQ3_0 layout).

    >>> pack3(np.arange(8, dtype=np.uint8), backend="numpy")
    array([136, 198, 250], dtype=uint8)
    """
    return _run(np_pack3, idx, "indices", backend, 8, 3, limit=8)


def pack3_fork_bug(idx: ArrayLike) -> NDArray[np.uint8]:
    """The TurboQuant fork's original 3-bit packer, as it behaved with gcc on x86-64 (NumPy only).

    docs/formats.md, "The 3-bit shift bug": index ``t`` of each 8-index lane
    (``bit = 3t``) is OR-ed into byte 0 as ``idx << (bit < 8 ? bit : 0)``
    truncated to 8 bits, and ``qs[1] |= idx >> (8 - bit)`` for ``bit >= 8`` is
    a negative shift that the reference build evaluated to no change: bytes 1
    and 2 of every lane stay 0. Kept to reproduce what the fork's caches store.

    >>> pack3_fork_bug(np.arange(8, dtype=np.uint8))
    array([143,   0,   0], dtype=uint8)
    """
    idx = _uint8(idx, "indices")
    _check_len(idx, 8, "pack3_fork_bug")
    _check_max(idx, 8)
    lead, n = idx.shape[:-1], idx.shape[-1]
    lanes = idx.reshape(lead + (n // 8, 8)).astype(np.uint32)
    out = np.zeros(lanes.shape[:-1] + (3,), np.uint32)
    for t in range(8):
        bit = 3 * t
        out[..., 0] |= (lanes[..., t] << np.uint32(bit if bit < 8 else 0)) & 0xFF
    return out.astype(np.uint8).reshape(lead + (n // 8 * 3,))


def unpack3(data: ArrayLike, *, backend: str | None = None) -> NDArray[np.uint8]:
    """Inverse of :func:`pack3`: every 3 bytes give 8 indices."""
    return _run(np_unpack3, data, "packed bytes", backend, 3, 8)
