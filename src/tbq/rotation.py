"""The randomized Walsh-Hadamard rotation used by the TBQ formats.

``R(x) = s2 * (H (s1 * x))`` with ``H`` the orthonormal Walsh-Hadamard matrix
in Sylvester order and ``s1``, ``s2`` vectors of +-1. ``H`` is computed by the
in-place radix-2 butterfly of the spec, followed by one multiplication by the
float32 constant nearest 1/sqrt(n) (for n = 128: 0x1.6a09e6p-4). The butterfly
order and the single final scaling are what make the float32 result bit-exact
with the C reference; any other order rounds differently.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .errors import ConfigError, TbqTypeError, TbqValueError, check_int

__all__ = [
    "fwht",
    "hadamard_scale",
    "matrix",
    "RandomizedHadamard",
    "signs_from_seed",
    "turboq_mtp_signs",
    "get_rotation",
]


def _check_pow2(n: int) -> None:
    if n < 1 or n & (n - 1):
        raise TbqValueError(f"the Walsh-Hadamard length must be a power of two, got {n}")


def hadamard_scale(n: int, dtype: DTypeLike = np.float32) -> np.floating[Any]:
    """The normalisation 1/sqrt(n), rounded once to ``dtype``.

    For n = 128 and float32 this is 0x1.6a09e6p-4 = 0.08838834764831845 rounded
    to float32, the constant of the spec.
    """
    _check_pow2(n)
    return np.dtype(dtype).type(1.0 / math.sqrt(n))  # type: ignore[call-overload]  # a floating dtype: fwht checks


def fwht(
    x: ArrayLike, *, normalize: bool = True, out: NDArray[np.floating[Any]] | None = None
) -> NDArray[np.floating[Any]]:
    """Fast Walsh-Hadamard transform along the last axis (Sylvester order).

    Works for float32 and float64 (other dtypes are rejected), any power-of-two
    length, batched over leading axes. Stage ``h`` (1, 2, 4, ..., n/2) replaces
    each pair ``(v[j], v[j+h])`` by ``(a + b, a - b)`` exactly as the spec's
    in-place butterfly; vectorised over pairs, every addition is the same
    float operation in the same order, so the result is bit-identical.
    With ``normalize`` the result is multiplied once by :func:`hadamard_scale`.

    >>> fwht(np.float32([1, 0, 0, 0]), normalize=False)
    array([1., 1., 1., 1.], dtype=float32)
    >>> fwht(np.float64([1, 1, 1, 1]))
    array([2., 0., 0., 0.])
    """
    v = np.asarray(x)
    if v.dtype not in (np.float32, np.float64):
        raise TbqTypeError(f"fwht works on float32 or float64 arrays, got {v.dtype}")
    if v.ndim == 0:
        raise TbqValueError("fwht needs at least one axis")
    n = v.shape[-1]
    _check_pow2(n)
    lead = v.shape[:-1]
    w: NDArray[Any] = np.array(v, copy=True).reshape(-1, n)
    h = 1
    while h < n:
        blocks = w.reshape(-1, n // (2 * h), 2, h)
        a = blocks[:, :, 0, :].copy()
        b = blocks[:, :, 1, :]
        blocks[:, :, 0, :] += b  # a + b
        np.subtract(a, b, out=blocks[:, :, 1, :])  # a - b
        h *= 2
    if normalize:
        w *= hadamard_scale(n, w.dtype)
    w = w.reshape(lead + (n,))
    if out is not None:
        out[...] = w
        return out
    return w


def matrix(n: int, *, normalize: bool = True, dtype: DTypeLike = np.float64) -> NDArray[np.floating[Any]]:
    """The ``n x n`` Walsh-Hadamard matrix in Sylvester order (for tests and study).

    ``fwht(x) == x @ matrix(n).T`` up to rounding; with ``normalize`` it is orthonormal.

    >>> matrix(2, normalize=False)
    array([[ 1.,  1.],
           [ 1., -1.]])
    """
    _check_pow2(n)
    H = np.ones((1, 1), dtype=np.float64)
    while H.shape[0] < n:
        H = np.block([[H, H], [H, -H]])
    if normalize:
        H = H / math.sqrt(n)
    return H.astype(dtype)


def signs_from_seed(seed: int, n: int = 128) -> tuple[NDArray[np.int8], NDArray[np.int8]]:
    """Two Rademacher sign vectors from an integer seed.

    The PRNG is numpy's PCG64 (``np.random.Generator(np.random.PCG64(seed))``);
    ``signs1`` is drawn first, then ``signs2``, each as
    ``1 - 2 * rng.integers(0, 2, size=n)`` (int8). The same seed gives the same
    vectors on every platform and numpy >= 1.17.

    >>> s1, s2 = signs_from_seed(0, 8)
    >>> s1.dtype, sorted(set(s1.tolist()) | set(s2.tolist()))
    (dtype('int8'), [-1, 1])
    """
    seed = check_int(seed, "a sign seed", lo=0, expected="a non-negative integer", error=ConfigError)
    _check_pow2(n)
    rng = np.random.Generator(np.random.PCG64(int(seed)))
    s1 = (1 - 2 * rng.integers(0, 2, size=n)).astype(np.int8)
    s2 = (1 - 2 * rng.integers(0, 2, size=n)).astype(np.int8)
    return s1, s2


@functools.cache
def turboq_mtp_signs() -> tuple[NDArray[np.int8], NDArray[np.int8]]:
    """The sign tables of the deployed kernels (``wht_signs1``, ``wht_signs2``, n = 128)."""
    from .codebooks import tables

    t = tables()["sign_tables"]
    s1 = np.array(t["wht_signs1"], dtype=np.int8)
    s2 = np.array(t["wht_signs2"], dtype=np.int8)
    s1.setflags(write=False)
    s2.setflags(write=False)
    return s1, s2


def _as_signs(v: Any, label: str, n: int) -> NDArray[np.int8]:
    a = np.asarray(v)
    if a.dtype.kind not in "iuf" or a.ndim != 1:
        raise ConfigError(f"{label} must be a 1-D array of +-1, got dtype {a.dtype} and shape {a.shape}")
    if a.size != n:
        raise ConfigError(f"{label} must have {n} entries, got {a.size}")
    bad = np.flatnonzero((a != 1) & (a != -1))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"{label}[{i}] = {a[i]!r}; sign vectors may only hold +1 and -1")
    out = a.astype(np.int8)
    out.setflags(write=False)
    return out


class RandomizedHadamard:
    """``R(x) = s2 * H(s1 * x)`` and its inverse ``R^-1(y) = s1 * H(s2 * y)``.

    Parameters
    ----------
    signs1, signs2 : numpy.ndarray
        1-D arrays of +-1 with the same power-of-two length.

    Notes
    -----
    The sign flips are exact, so the float rounding is that of :func:`fwht`.

    >>> rot = RandomizedHadamard(*signs_from_seed(1, 16))
    >>> x = np.arange(16, dtype=np.float32)
    >>> bool(np.allclose(rot.inverse(rot.forward(x)), x, atol=1e-5))
    True
    """

    def __init__(self, signs1: ArrayLike, signs2: ArrayLike) -> None:
        n1, n2 = np.asarray(signs1).size, np.asarray(signs2).size
        if n1 != n2:
            raise ConfigError(f"signs1 has {n1} entries and signs2 has {n2}; both need the same power-of-two length")
        if n1 < 1 or n1 & (n1 - 1):
            raise ConfigError(f"sign vectors need a power-of-two length, got {n1}")
        self.signs1 = _as_signs(signs1, "signs1", n1)
        self.signs2 = _as_signs(signs2, "signs2", n1)
        self.n = n1

    def _apply(self, x: ArrayLike, first: NDArray[np.int8], second: NDArray[np.int8]) -> NDArray[np.floating[Any]]:
        v = np.asarray(x)
        if v.dtype not in (np.float32, np.float64):
            raise TbqTypeError(f"the rotation works on float32 or float64 arrays, got {v.dtype}")
        if v.shape[-1:] != (self.n,):
            raise TbqValueError(f"the rotation needs a last axis of {self.n}, got shape {v.shape}")
        w = fwht(v * first.astype(v.dtype))
        w *= second.astype(v.dtype)
        return w

    def forward(self, x: ArrayLike) -> NDArray[np.floating[Any]]:
        """``s2 * H(s1 * x)`` along the last axis, in the dtype of ``x``."""
        return self._apply(x, self.signs1, self.signs2)

    def inverse(self, y: ArrayLike) -> NDArray[np.floating[Any]]:
        """``s1 * H(s2 * y)`` along the last axis, in the dtype of ``y``."""
        return self._apply(y, self.signs2, self.signs1)

    def matrix(self, dtype: DTypeLike = np.float64) -> NDArray[np.floating[Any]]:
        """The rotation as an orthonormal ``n x n`` matrix ``M`` with ``forward(x) ~= M @ x``."""
        H = matrix(self.n, dtype=np.float64)
        M = self.signs2[:, None].astype(np.float64) * H * self.signs1[None, :].astype(np.float64)
        return M.astype(dtype)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RandomizedHadamard)
            and np.array_equal(self.signs1, other.signs1)
            and np.array_equal(self.signs2, other.signs2)
        )

    def __hash__(self) -> int:
        return hash((self.signs1.tobytes(), self.signs2.tobytes()))

    def __repr__(self) -> str:
        return f"RandomizedHadamard(signs1={self.signs1.tolist()}, signs2={self.signs2.tolist()})"


def get_rotation(spec: Any, n: int = 128) -> RandomizedHadamard:
    """Resolve a ``signs=`` spec: ``"turboq-mtp"``, an integer seed, or a pair of +-1 arrays.

    A dict ``{"signs1": [...], "signs2": [...]}`` (the config form) is accepted too.
    """
    if isinstance(spec, RandomizedHadamard):
        rot = spec
    elif isinstance(spec, str):
        if spec != "turboq-mtp":
            raise ConfigError(f"unknown sign table {spec!r}; use 'turboq-mtp', an integer seed or a pair of +-1 arrays")
        rot = RandomizedHadamard(*turboq_mtp_signs())
    elif isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        rot = RandomizedHadamard(*signs_from_seed(int(spec), n))
    elif isinstance(spec, dict):
        if set(spec) != {"signs1", "signs2"}:
            raise ConfigError(f"a signs dict needs exactly the keys 'signs1' and 'signs2', got {sorted(spec)}")
        rot = RandomizedHadamard(spec["signs1"], spec["signs2"])
    elif isinstance(spec, (tuple, list)) and len(spec) == 2:
        rot = RandomizedHadamard(spec[0], spec[1])
    else:
        raise ConfigError(
            f"signs must be 'turboq-mtp', an integer seed or a pair of +-1 arrays, got {type(spec).__name__}"
        )
    if rot.n != n:
        raise ConfigError(f"this format rotates blocks of {n} values; the sign vectors have {rot.n} entries")
    return rot
