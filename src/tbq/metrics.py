"""Error metrics between a reference array and its reconstruction.

All metrics compute in float64 and take arrays of the same shape. Vector-wise
metrics treat the last axis as the vector.
"""

from __future__ import annotations

import numpy as np

from .errors import TbqValueError

__all__ = ["nmse", "snr_db", "max_abs_error", "cosine_similarity", "error_summary"]


def _pair(x, y):
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise TbqValueError(f"reference and reconstruction shapes differ: {x.shape} vs {y.shape}")
    return x, y


def nmse(x, y) -> float:
    """Normalised mean squared error ``sum((y - x)**2) / sum(x**2)``.

    >>> nmse([1.0, 1.0], [1.0, 0.0])
    0.5
    """
    x, y = _pair(x, y)
    den = float(np.sum(x * x))
    num = float(np.sum((y - x) ** 2))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def snr_db(x, y) -> float:
    """Signal-to-noise ratio in dB, ``-10 log10(nmse)``.

    >>> round(snr_db([1.0, 0.0], [1.1, 0.0]), 6)
    20.0
    """
    e = nmse(x, y)
    if e == 0.0:
        return float("inf")
    return float(-10.0 * np.log10(e))


def max_abs_error(x, y) -> float:
    """``max |y - x|`` over all elements."""
    x, y = _pair(x, y)
    return float(np.max(np.abs(y - x))) if x.size else 0.0


def cosine_similarity(x, y, axis: int = -1) -> np.ndarray:
    """Cosine similarity of the vectors along ``axis`` (1 where both are zero, 0 where one is).

    >>> cosine_similarity([[1.0, 0.0], [0.0, 2.0]], [[2.0, 0.0], [1.0, 1.0]]).round(4)
    array([1.    , 0.7071])
    """
    x, y = _pair(x, y)
    dot = np.sum(x * y, axis=axis)
    nx = np.sqrt(np.sum(x * x, axis=axis))
    ny = np.sqrt(np.sum(y * y, axis=axis))
    den = nx * ny
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(den > 0, dot / np.where(den > 0, den, 1.0), np.where((nx == 0) & (ny == 0), 1.0, 0.0))
    return cos


def error_summary(x, y) -> dict:
    """NMSE, SNR (dB), max abs error and mean per-vector cosine similarity in one dict."""
    return {
        "nmse": nmse(x, y),
        "snr_db": snr_db(x, y),
        "max_abs_error": max_abs_error(x, y),
        "mean_cosine": float(np.mean(cosine_similarity(x, y))),
    }
