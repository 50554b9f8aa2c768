"""Seeded synthetic KV-cache data.

Every generator takes a ``seed`` (numpy PCG64 via ``np.random.default_rng``)
and returns float32 of shape ``(tokens, heads, head_dim)``; the same arguments
give the same array on every platform. What each one models:

- :func:`gaussian`: i.i.d. N(0, std^2), the case the TBQ codebook is fitted
  for after rotation. Values in real models are close to this.
- :func:`keys_with_outliers`: Gaussian keys whose listed channels (the same in
  every head) are ``factor`` times larger. Real keys have a few such channels;
  they set an absmax block scale and leave the other channels with few levels.
- :func:`rope_keys`: keys with rotary-position structure: each head has a
  content vector (shared by all tokens, plus per-token noise) whose channel
  pairs ``(i, i + head_dim/2)`` (``pairing="half"``, the Llama/NeoX layout) or
  ``(2i, 2i+1)`` (``"interleaved"``) are rotated by the angle
  ``position * base**(-2i/head_dim)``. Low pairs spin fast, high pairs slowly.
- :func:`heavy_tailed_values`: Student-t values scaled to unit variance.
- :func:`add_sink` / :func:`keys_with_sink`: an attention-sink token: the first
  ``n_sink`` tokens get a key ``scale`` times the typical key norm.
- :func:`llm_like_kv`: all of the above at once, a more realistic test case.
- :func:`builtin_kv`: the data set of ``tbq compare``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import TbqValueError, check_choice, check_int
from .parallel import require_memory

__all__ = [
    "gaussian",
    "keys_with_outliers",
    "rope_frequencies",
    "apply_rope",
    "rope_keys",
    "heavy_tailed_values",
    "add_sink",
    "keys_with_sink",
    "llm_like_kv",
    "builtin_kv",
    "DEFAULT_OUTLIER_CHANNELS",
]

#: Channels scaled up by :func:`keys_with_outliers` by default (one per 32-value sub-block).
DEFAULT_OUTLIER_CHANNELS = (5, 37, 64, 111)


def _shape(tokens: object, heads: object, head_dim: object, itemsize: int = 8) -> tuple[int, int, int]:
    """``(tokens, heads, head_dim)`` checked: positive integers whose array fits in memory."""
    t, h, d = (check_int(v, name, lo=1) for name, v in (("tokens", tokens), ("heads", heads), ("head_dim", head_dim)))
    require_memory(2 * itemsize * t * h * d, f"a synthetic array of {t:,} x {h:,} x {d:,} values")
    return t, h, d


def gaussian(tokens: int, heads: int, head_dim: int = 128, *, seed: int = 0, std: float = 1.0) -> np.ndarray:
    """i.i.d. N(0, std**2) values.

    >>> gaussian(4, 2, seed=1).shape
    (4, 2, 128)
    """
    tokens, heads, head_dim = _shape(tokens, heads, head_dim)
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((tokens, heads, head_dim), dtype=np.float32) * np.float32(std)).astype(np.float32)


def keys_with_outliers(
    tokens: int,
    heads: int,
    head_dim: int = 128,
    *,
    seed: int = 0,
    channels: Sequence[int] = DEFAULT_OUTLIER_CHANNELS,
    factor: float = 20.0,
) -> np.ndarray:
    """Gaussian keys whose ``channels`` (same in every head) are multiplied by ``factor``.

    Outlier channels are what ruin a per-block absmax scale and what the TBQ
    rotation spreads out. The base data is exactly :func:`gaussian` with the
    same ``seed``; channels ``>= head_dim`` are ignored. The RMS of an outlier
    channel is therefore ``factor`` (the others 1).
    """
    k = gaussian(tokens, heads, head_dim, seed=seed)
    ch = [c for c in channels if c < head_dim]
    k[..., ch] *= np.float32(factor)
    return k


# ---------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------

PAIRINGS = ("half", "interleaved")


def rope_frequencies(head_dim: int, base: float = 10000.0) -> np.ndarray:
    """Angular frequencies ``theta_i = base**(-2i/head_dim)``, ``i = 0 .. head_dim/2 - 1`` (float64, radians per position)."""
    if head_dim % 2:
        raise TbqValueError(f"RoPE needs an even head_dim, got {head_dim}")
    return base ** (-2.0 * np.arange(head_dim // 2) / head_dim)


def _pair_index(head_dim: int, pairing: str) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    h = head_dim // 2
    if pairing == "half":
        return np.arange(h), np.arange(h) + h
    if pairing == "interleaved":
        return 2 * np.arange(h), 2 * np.arange(h) + 1
    check_choice(pairing, "pairing", PAIRINGS, error=TbqValueError)
    raise AssertionError(f"PAIRINGS lists {pairing!r} but _pairs has no rule for it")  # pragma: no cover


def apply_rope(
    x: ArrayLike, positions: ArrayLike | None = None, *, base: float = 10000.0, pairing: str = "half"
) -> NDArray[np.float32]:
    """Rotate channel pairs of ``x`` (``(tokens, ..., head_dim)``) by ``position * theta_i``.

    Pair ``i`` is ``(i, i + head_dim/2)`` for ``pairing="half"`` and
    ``(2i, 2i + 1)`` for ``"interleaved"``; ``(a, b)`` becomes
    ``(a cos - b sin, a sin + b cos)``. ``positions`` default to
    ``0, 1, ..., tokens-1``. Computed in float64, returned as float64.
    """
    x = np.asarray(x, dtype=np.float64)
    T, d = x.shape[0], x.shape[-1]
    pos = np.arange(T, dtype=np.float64) if positions is None else np.asarray(positions, dtype=np.float64)
    if pos.shape != (T,):
        raise TbqValueError(f"positions must have shape ({T},), got {pos.shape}")
    ang = pos[:, None] * rope_frequencies(d, base)[None, :]  # (T, d/2)
    ang = ang.reshape((T,) + (1,) * (x.ndim - 2) + (d // 2,))
    c, s = np.cos(ang), np.sin(ang)
    i, j = _pair_index(d, pairing)
    a, b = x[..., i], x[..., j]
    out = np.empty_like(x)
    out[..., i] = a * c - b * s
    out[..., j] = a * s + b * c
    return out


def rope_keys(
    tokens: int,
    heads: int,
    head_dim: int = 128,
    *,
    seed: int = 0,
    noise: float = 0.5,
    base: float = 10000.0,
    pairing: str = "half",
    positions: ArrayLike | None = None,
    outlier_pairs: Sequence[int] = (),
    outlier_factor: float = 8.0,
) -> np.ndarray:
    """Keys with rotary-position structure.

    Each head ``h`` has a content vector ``c_h ~ N(0, I)``; token ``t`` gets
    ``c_h + noise * z_t`` (``z_t ~ N(0, I)``), then :func:`apply_rope` at
    position ``positions[t]`` (default ``t``). With ``noise=0`` the angle of
    pair ``i`` at position ``p`` is exactly ``angle(c_h, pair i) + p * theta_i``
    (mod 2 pi), ``theta_i = base**(-2i/head_dim)``, and the pair's norm does
    not change with position.

    ``outlier_pairs``: pair indices ``i`` whose two channels are multiplied by
    ``outlier_factor`` before rotation (in real models large key channels sit
    in slowly rotating, i.e. high-``i``, pairs).
    """
    tokens, heads, head_dim = _shape(tokens, heads, head_dim)
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((1, heads, head_dim))
    z = rng.standard_normal((tokens, heads, head_dim))
    x = c + noise * z
    if len(outlier_pairs):
        i, j = _pair_index(head_dim, pairing)
        p = np.asarray(outlier_pairs, dtype=np.int64)
        x[..., i[p]] *= outlier_factor
        x[..., j[p]] *= outlier_factor
    return apply_rope(x, positions, base=base, pairing=pairing).astype(np.float32)


# ---------------------------------------------------------------------------
# Values and sinks
# ---------------------------------------------------------------------------


def heavy_tailed_values(tokens: int, heads: int, head_dim: int = 128, *, seed: int = 0, df: float = 5.0) -> np.ndarray:
    """Student-t values with ``df`` degrees of freedom, scaled to unit variance.

    The scale is ``sqrt((df - 2) / df)`` (so ``df > 2`` is required). The
    excess kurtosis is ``6 / (df - 4)`` for ``df > 4`` (6 at the default 5;
    a Gaussian has 0), i.e. occasional large values in every channel.
    """
    if not df > 2:
        raise TbqValueError(f"df must be > 2 for a finite variance, got {df}")
    tokens, heads, head_dim = _shape(tokens, heads, head_dim)
    rng = np.random.default_rng(seed)
    t = rng.standard_t(df, size=(tokens, heads, head_dim))
    return (t * math.sqrt((df - 2.0) / df)).astype(np.float32)


def add_sink(x: ArrayLike, *, scale: float = 8.0, n_sink: int = 1, seed: int = 0) -> NDArray[np.float32]:
    """Copy of ``x`` whose first ``n_sink`` tokens are attention-sink keys.

    Each sink vector (per token and head) points in a seeded random direction
    and has norm ``scale * sqrt(head_dim)``, i.e. ``scale`` times the expected
    norm of a unit-variance key. Random queries then give the sink logits with
    standard deviation ``scale`` instead of 1, so many queries put most of
    their weight on it, as real attention sinks do.
    """
    x = np.array(x, dtype=np.float32, copy=True)
    if not 0 <= n_sink <= x.shape[0]:
        raise TbqValueError(f"n_sink must be in 0..{x.shape[0]}, got {n_sink}")
    d = x.shape[-1]
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((n_sink,) + x.shape[1:])
    u /= np.linalg.norm(u, axis=-1, keepdims=True)
    x[:n_sink] = (u * (scale * math.sqrt(d))).astype(np.float32)
    return x


def keys_with_sink(
    tokens: int, heads: int, head_dim: int = 128, *, seed: int = 0, scale: float = 8.0, n_sink: int = 1
) -> np.ndarray:
    """:func:`gaussian` keys with :func:`add_sink` applied to the first ``n_sink`` tokens (sink seed ``seed + 1``)."""
    return add_sink(gaussian(tokens, heads, head_dim, seed=seed), scale=scale, n_sink=n_sink, seed=seed + 1)


def llm_like_kv(
    tokens: int,
    heads: int,
    head_dim: int = 128,
    *,
    seed: int = 0,
    sink_scale: float = 8.0,
    outlier_pairs: Sequence[int] = (60, 61, 62, 63),
    outlier_factor: float = 6.0,
    df: float = 5.0,
) -> dict[str, np.ndarray]:
    """A KV set with the structure of real caches, for attention studies.

    ``keys``: :func:`rope_keys` (seed ``seed``, noise 0.5) with the slowly
    rotating ``outlier_pairs`` scaled by ``outlier_factor``, then token 0 made
    an attention sink of ``sink_scale`` times the typical key norm
    (:func:`add_sink`, seed ``seed + 2``). ``values``:
    :func:`heavy_tailed_values` (seed ``seed + 1``, ``df``). Both
    ``(tokens, heads, head_dim)`` float32.
    """
    k = rope_keys(tokens, heads, head_dim, seed=seed, outlier_pairs=outlier_pairs, outlier_factor=outlier_factor)
    if sink_scale and tokens:
        # The sink norm is relative to this key set's typical norm.
        typical = float(np.sqrt(np.mean(np.sum(k.astype(np.float64) ** 2, axis=-1))))
        k = add_sink(k, scale=sink_scale * typical / math.sqrt(head_dim), n_sink=1, seed=seed + 2)
    return {"keys": k, "values": heavy_tailed_values(tokens, heads, head_dim, seed=seed + 1, df=df)}


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
