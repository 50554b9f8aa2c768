"""Seeded synthetic KV-cache data.

Every generator takes a ``seed`` (numpy PCG64 via ``np.random.default_rng``)
and returns float32 of shape ``(tokens, heads, head_dim)``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["gaussian", "keys_with_outliers", "builtin_kv", "DEFAULT_OUTLIER_CHANNELS"]

#: Channels scaled up by :func:`keys_with_outliers` by default (one per 32-value sub-block).
DEFAULT_OUTLIER_CHANNELS = (5, 37, 64, 111)


def gaussian(tokens: int, heads: int, head_dim: int = 128, *, seed: int = 0, std: float = 1.0) -> np.ndarray:
    """i.i.d. N(0, std**2) values.

    >>> gaussian(4, 2, seed=1).shape
    (4, 2, 128)
    """
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((tokens, heads, head_dim), dtype=np.float32) * np.float32(std)).astype(np.float32)


def keys_with_outliers(
    tokens: int,
    heads: int,
    head_dim: int = 128,
    *,
    seed: int = 0,
    channels=DEFAULT_OUTLIER_CHANNELS,
    factor: float = 20.0,
) -> np.ndarray:
    """Gaussian keys whose ``channels`` (same in every head) are multiplied by ``factor``.

    Outlier channels are what ruin a per-block absmax scale and what the TBQ
    rotation spreads out.
    """
    k = gaussian(tokens, heads, head_dim, seed=seed)
    ch = [c for c in channels if c < head_dim]
    k[..., ch] *= np.float32(factor)
    return k


def builtin_kv(seed: int = 0, tokens: int = 512, heads: int = 8, head_dim: int = 128) -> dict[str, np.ndarray]:
    """The built-in data set of ``tbq compare``.

    ``keys``: :func:`keys_with_outliers` (channels 5, 37, 64, 111 scaled by 20);
    ``values``: standard Gaussian. Both ``(tokens, heads, head_dim)`` float32,
    by default 512 x 8 x 128 = 524,288 values each. Keys use ``seed`` and
    values ``seed + 1``.
    """
    return {
        "keys": keys_with_outliers(tokens, heads, head_dim, seed=seed),
        "values": gaussian(tokens, heads, head_dim, seed=seed + 1),
    }
