"""Float32 arithmetic shared by the NumPy reference encoders (``tbq/formats/*.py``).

(Formerly ``tbq.reference``, which stays as a deprecated alias: the reference of a format is its own NumPy path;
this module holds the float32 helpers those paths share.)

The formats' NumPy paths are the specification written as array code
(docs/formats.md). Each float32 operation is one IEEE float32 operation of the
spec, rounded on its own: numpy never fuses a multiply and an add, and every
constant is a ``np.float32`` so nothing is promoted to float64. Sums that the
spec accumulates sequentially are written as explicit loops over the block
axis (vectorised across blocks), never as ``np.sum``, which uses pairwise
summation and rounds differently.

>>> roundf(np.float32([0.5, 1.5, -2.5, 0.49999997]))
array([ 1.,  2., -3.,  0.], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from .half import f16_table, f32_to_f16_bits

F32 = np.float32
_ONE = F32(1.0)
_HALF = F32(0.5)

__all__ = ["roundf", "seq_sum_squares", "safe_reciprocal", "put_f16_scale", "get_f16_scale"]


#: Up to this many rows, :func:`seq_sum_squares` accumulates along each row in one ufunc call
#: (``np.add.accumulate`` is strictly sequential, unlike ``np.sum``); above it the loop over the
#: columns, vectorised across rows, is faster. Both give the same bits. For 128 columns the two
#: cost the same near 500 rows (AMD EPYC, AVX2: 56 us against 198 us at 96 rows, 1.1 ms against
#: 0.77 ms at 2,000); the strategies' threshold search rotates 96 candidates at a time.
_ACCUMULATE_ROWS = 384


def seq_sum_squares(v: np.ndarray) -> np.ndarray:
    """Row-wise ``sum_j v[:, j] * v[:, j]``, accumulated in index order from +0.0 (float32).

    >>> seq_sum_squares(np.float32([[3, 4], [1, 1]]))
    array([25.,  2.], dtype=float32)
    """
    if 0 < v.shape[0] <= _ACCUMULATE_ROWS and v.shape[1]:
        # the first partial sum is v0*v0 itself, which equals +0.0 + v0*v0 (a square is never -0.0)
        return np.add.accumulate(v * v, axis=1, dtype=np.float32)[:, -1].copy()
    acc = np.zeros(v.shape[0], np.float32)
    for j in range(v.shape[1]):
        acc += v[:, j] * v[:, j]
    return acc


def safe_reciprocal(d: np.ndarray) -> np.ndarray:
    """``1/d`` where ``d != 0``, else 0 (float32)."""
    out = np.zeros_like(d)
    np.divide(_ONE, d, out=out, where=d != 0)
    return out


def put_f16_scale(out: np.ndarray, d: np.ndarray) -> None:
    """Store float32 scales ``d`` as little-endian fp16 at bytes 0-1 of each row of ``out``."""
    out[:, 0:2] = f32_to_f16_bits(d).astype("<u2").view(np.uint8).reshape(-1, 2)


def get_f16_scale(data: np.ndarray) -> np.ndarray:
    """The float32 values of the little-endian fp16 at bytes 0-1 of each row of ``data``."""
    bits = np.ascontiguousarray(data[:, 0:2]).view("<u2").reshape(-1)
    return f16_table()[bits]


def roundf(v: np.ndarray) -> np.ndarray:
    """C ``roundf``: round half away from zero (float32 in, float32 out).

    ``np.rint`` rounds half to even, which differs from ``roundf`` only at exact
    ties; those are found exactly because ``v - trunc(v)`` is exact for every
    float32 below 2**23, and moved away from zero. (``floor(|v| + 0.5)`` would
    be wrong: 0.49999997 + 0.5 rounds up to 1.0 in float32.)
    """
    r = np.rint(v)
    t = np.trunc(v)
    tie = np.abs(v - t) == _HALF
    if tie.any():
        r[tie] = t[tie] + np.sign(v[tie])
    return r
