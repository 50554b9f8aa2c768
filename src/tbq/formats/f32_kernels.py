"""numba twins of :mod:`tbq.formats.f32` (same bytes, same float32 bits).

Both directions copy 32-bit patterns as integers (uint32 views of the floats
and of the little-endian bytes), so no value, NaN payload included, ever passes
through a float register. Encoding scans each chunk of :data:`CHUNK` values
for its largest ``|x|`` pattern first (a branch-free uint32 max, which
vectorises); only a chunk that holds Inf or NaN is copied value by value, to
stop at the first one (reported as the block: block = value here).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..backend import STATUS_NONFINITE, STATUS_OK
from ..kernels import jit, reader_blocks, reader_out

#: Values per scan/copy chunk (small enough to stay in L1 between the two passes).
CHUNK = 2048

_ABS = np.uint32(0x7FFFFFFF)
_INF32 = np.uint32(0x7F800000)


@jit
def _amax(u: NDArray[np.uint32]) -> Any:
    """Largest ``|x|`` bit pattern of a chunk of float32 patterns ``u`` (uint32)."""
    amax = np.uint32(0)
    for j in range(u.shape[0]):
        a = u[j] & _ABS
        amax = a if a > amax else amax
    return amax


@jit
def _copy(u: NDArray[np.uint32], w: NDArray[np.uint32]) -> None:
    for j in range(u.shape[0]):
        w[j] = u[j]


@jit
def encode_f32(u: NDArray[np.uint32], w: NDArray[np.uint32]) -> tuple[int, int]:
    """``w`` (uint32, the little-endian words of the bytes) = the float32 patterns ``u``; returns ``(value,
    STATUS_NONFINITE)`` at the first Inf or NaN (the words before it written), else ``(-1, STATUS_OK)``."""
    n = u.shape[0]
    for s in range(0, n, CHUNK):
        e = min(s + CHUNK, n)
        if _amax(u[s:e]) >= _INF32:
            for j in range(s, e):  # slow path: stop at the first non-finite value
                if (u[j] & _ABS) >= _INF32:
                    return j, STATUS_NONFINITE
                w[j] = u[j]
        else:
            _copy(u[s:e], w[s:e])
    return -1, STATUS_OK


@jit
def decode_f32(w: NDArray[np.uint32], out: NDArray[np.uint32]) -> NDArray[np.uint32]:
    """``out`` (uint32 bit patterns) = the words ``w``: every pattern, NaN payloads included, unchanged."""
    for j in range(w.shape[0]):
        out[j] = w[j]
    return out


def attention_read_f32(src: Any, dst: Any, n_blocks: int, aux: Any, n_aux: int) -> None:
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` float32 values by
    :func:`decode_f32` (no table: ``aux`` is not read)."""
    decode_f32(
        reader_blocks(src, n_blocks, 4).reshape(4 * n_blocks).view(np.uint32),
        reader_out(dst, n_blocks, 1).reshape(n_blocks).view(np.uint32),
    )
