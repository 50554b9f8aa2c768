"""Error metrics between a reference array and its reconstruction.

All metrics compute in float64 and take arrays of the same shape. Vector-wise
metrics treat the last axis as the vector.

Three families:

- **Vector error**: :func:`nmse`, :func:`snr_db`, :func:`max_abs_error`,
  :func:`cosine_similarity`, :func:`error_summary`, and the breakdowns
  :func:`per_channel_error` (one number per channel, the last axis) and
  :func:`per_token_error` (one number per token, the first axis).
- **What attention sees**: :func:`inner_product_error` (bias, slope and variance
  of ``q.k_hat - q.k`` over random or given queries), :func:`attention_logits`,
  :func:`logit_error`, :func:`softmax`, :func:`softmax_kl`,
  :func:`topk_agreement`, :func:`attention_output` and :func:`attention_error`
  (everything at once for a quantized K and/or V). Attention is plain float64
  softmax attention, ``softmax(q.k / sqrt(head_dim)) @ v``, computed per head.
- **Reference distortions** of scalar quantizers of a Gaussian, the anchors of
  a rate-distortion plot: :func:`gaussian_distortion` (the exact MSE of any
  codebook on N(0, sigma^2)), :func:`lloyd_max_distortion`,
  :func:`shannon_lower_bound` (``4**-b``), :func:`turboquant_upper_bound`
  (``sqrt(3)*pi/2 * 4**-b``), and :func:`entropy_bits` of an index histogram.
- **Value tables against Lloyd-Max** on the distribution they meet, Gaussian
  or measured: :func:`table_mse` (nearest-level rounding of samples),
  :func:`lloyd_max_samples` (the Lloyd-Max quantizer of an empirical
  distribution) and :func:`table_distortion` (a table's MSE over the
  Lloyd-Max MSE at the same number of levels, and the same at the table's
  best scale).

Shapes for attention: keys and values are ``(tokens, head_dim)`` or
``(tokens, heads, head_dim)``; queries are ``(n_queries, head_dim)`` (the same
queries for every head) or ``(n_queries, heads, head_dim)``. Logits come back
as ``(n_queries, tokens)`` or ``(heads, n_queries, tokens)``.

Why one module of this length: it is the one flat namespace of metrics that the study,
``tbq compare``, ``tbq eval`` and the notebooks import by name; its families are its sections.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .codebooks import lloyd_max_iterate, normal_pdf
from .errors import TbqValueError, check_choice, check_int
from .parallel import require_memory

__all__ = [
    "nmse",
    "snr_db",
    "max_abs_error",
    "cosine_similarity",
    "error_summary",
    "per_channel_error",
    "per_token_error",
    "random_queries",
    "inner_product_error",
    "attention_logits",
    "logit_error",
    "softmax",
    "log_softmax",
    "softmax_kl",
    "topk_agreement",
    "attention_output",
    "attention_error",
    "gaussian_distortion",
    "lloyd_max_distortion",
    "lloyd_max_levels",
    "shannon_lower_bound",
    "turboquant_upper_bound",
    "TURBOQUANT_UPPER_FACTOR",
    "entropy_bits",
    "kurtosis",
    "peak_to_rms",
    "table_mse",
    "lloyd_max_samples",
    "table_distortion",
]

#: ``sqrt(3) * pi / 2``: the constant of the MSE upper bound proved for
#: TurboQuant-style quantizers (random rotation + per-coordinate scalar
#: quantizer), ``D <= sqrt(3)*pi/2 * 4**-b`` for unit vectors.
TURBOQUANT_UPPER_FACTOR = math.sqrt(3.0) * math.pi / 2.0


def _pair(x: ArrayLike, y: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise TbqValueError(f"reference and reconstruction shapes differ: {x.shape} vs {y.shape}")
    return x, y


def nmse(x: ArrayLike, y: ArrayLike) -> float:
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


def snr_db(x: ArrayLike, y: ArrayLike) -> float:
    """Signal-to-noise ratio in dB, ``-10 log10(nmse)``.

    >>> round(snr_db([1.0, 0.0], [1.1, 0.0]), 6)
    20.0
    """
    e = nmse(x, y)
    if e == 0.0:
        return float("inf")
    return float(-10.0 * np.log10(e))


def max_abs_error(x: ArrayLike, y: ArrayLike) -> float:
    """``max |y - x|`` over all elements."""
    x, y = _pair(x, y)
    return float(np.max(np.abs(y - x))) if x.size else 0.0


def cosine_similarity(x: ArrayLike, y: ArrayLike, axis: int = -1) -> np.ndarray:
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


def error_summary(x: ArrayLike, y: ArrayLike) -> dict[str, Any]:
    """NMSE, SNR (dB), max abs error and mean per-vector cosine similarity in one dict."""
    return {
        "nmse": nmse(x, y),
        "snr_db": snr_db(x, y),
        "max_abs_error": max_abs_error(x, y),
        "mean_cosine": float(np.mean(cosine_similarity(x, y))),
    }


# ---------------------------------------------------------------------------
# Breakdowns
# ---------------------------------------------------------------------------

_BREAKDOWN_METRICS = ("nmse", "mse", "rmse", "max_abs", "snr_db")


def _reduce(x: Any, y: Any, axes: Any, metric: Any) -> Any:
    check_choice(metric, "metric", _BREAKDOWN_METRICS, error=TbqValueError)
    d = y - x
    if metric == "max_abs":
        return np.max(np.abs(d), axis=axes) if d.size else np.zeros(())
    se = np.sum(d * d, axis=axes)
    if metric in ("mse", "rmse"):
        n = max(1, int(np.prod([x.shape[a] for a in axes])))
        mse = se / n
        return mse if metric == "mse" else np.sqrt(mse)
    sx = np.sum(x * x, axis=axes)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(sx > 0, se / np.where(sx > 0, sx, 1.0), np.where(se == 0, 0.0, np.inf))
    if metric == "nmse":
        return r
    with np.errstate(divide="ignore"):
        return -10.0 * np.log10(r)


def per_channel_error(x: ArrayLike, y: ArrayLike, metric: str = "nmse") -> np.ndarray:
    """One error value per channel (the last axis), pooled over every other axis.

    ``metric``: ``"nmse"`` (the channel's squared error over its own energy),
    ``"mse"``, ``"rmse"``, ``"max_abs"`` or ``"snr_db"``. For keys of shape
    ``(tokens, heads, head_dim)`` the result has ``head_dim`` entries. Outlier
    channels show up here: an absmax block scale set by an outlier leaves the
    small channels with a large *relative* error.

    >>> per_channel_error([[1.0, 2.0], [1.0, 2.0]], [[1.0, 2.2], [1.0, 1.8]], "mse").round(6)
    array([0.  , 0.04])
    """
    x, y = _pair(x, y)
    if x.ndim == 0:
        raise TbqValueError("per_channel_error needs at least one axis")
    return _reduce(x, y, tuple(range(x.ndim - 1)), metric)


def per_token_error(x: ArrayLike, y: ArrayLike, metric: str = "nmse") -> np.ndarray:
    """One error value per token (the first axis), pooled over every other axis.

    Same ``metric`` choices as :func:`per_channel_error`. For ``(tokens, heads,
    head_dim)`` the result has ``tokens`` entries: a token with a large norm
    (an attention sink) stands out in ``"mse"`` but not in ``"nmse"`` when the
    format's error is relative to the block norm.
    """
    x, y = _pair(x, y)
    if x.ndim == 0:
        raise TbqValueError("per_token_error needs at least one axis")
    return _reduce(x, y, tuple(range(1, x.ndim)), metric)


# ---------------------------------------------------------------------------
# Inner products and attention
# ---------------------------------------------------------------------------


def random_queries(n: int, head_dim: int, heads: int | None = None, *, seed: int = 0) -> np.ndarray:
    """Seeded i.i.d. N(0, 1) queries, float64: ``(n, head_dim)`` or ``(n, heads, head_dim)``.

    The generator is numpy's PCG64 (``np.random.default_rng(seed)``). With unit
    variance queries and unit variance keys the logits ``q.k / sqrt(head_dim)``
    have unit variance.

    >>> random_queries(3, 8, seed=1).shape, random_queries(3, 8, 2).shape
    ((3, 8), (3, 2, 8))
    """
    dims = {"n": n, "head_dim": head_dim} if heads is None else {"n": n, "heads": heads, "head_dim": head_dim}
    for name, v in dims.items():
        check_int(v, name, lo=1)
    shape = tuple(int(v) for v in dims.values())
    require_memory(8 * math.prod(shape), f"{math.prod(shape):,} random query values")
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape)


def inner_product_error(
    x: ArrayLike, y: ArrayLike, queries: ArrayLike | None = None, *, n_queries: int = 64, seed: int = 0
) -> dict[str, Any]:
    """Statistics of ``e = q.y - q.x`` (``y`` the reconstruction of ``x``) over queries and vectors.

    ``x``, ``y``: ``(..., d)``, every vector along the last axis is used.
    ``queries``: ``(n, d)``; when ``None``, ``n_queries`` seeded N(0, 1)
    queries (:func:`random_queries`). Returns a dict:

    - ``bias``: mean of ``e`` (additive bias; near 0 for random queries by
      symmetry, meaningful for given queries),
    - ``variance``, ``std``, ``rmse`` of ``e`` (``rmse**2 = bias**2 + variance``),
    - ``slope``: least-squares ``s`` in ``q.y ~ s * q.x`` (multiplicative bias:
      an MSE-optimal quantizer without correction shrinks, ``s < 1``),
    - ``ref_rms``: RMS of the exact products ``q.x``; ``relative_rmse`` =
      ``rmse / ref_rms`` and ``relative_bias`` = ``bias / ref_rms``.
    """
    x, y = _pair(x, y)
    d = x.shape[-1]
    X = x.reshape(-1, d)
    Y = y.reshape(-1, d)
    Q = random_queries(n_queries, d, seed=seed) if queries is None else np.asarray(queries, dtype=np.float64)
    if Q.ndim != 2 or Q.shape[1] != d:
        raise TbqValueError(f"queries must have shape (n, {d}), got {Q.shape}")
    ref = Q @ X.T
    est = Q @ Y.T
    e = est - ref
    bias = float(np.mean(e))
    var = float(np.var(e))
    rmse = math.sqrt(float(np.mean(e * e)))
    ref_rms = math.sqrt(float(np.mean(ref * ref)))
    den = float(np.sum(ref * ref))
    slope = float(np.sum(ref * est) / den) if den > 0 else float("nan")

    def rel(v: float) -> float:
        return v / ref_rms if ref_rms > 0 else float("nan")

    return {
        "bias": bias,
        "variance": var,
        "std": math.sqrt(var),
        "rmse": rmse,
        "slope": slope,
        "ref_rms": ref_rms,
        "relative_rmse": rel(rmse),
        "relative_bias": rel(bias),
    }


def _qk_shapes(q: ArrayLike, k: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    if k.ndim not in (2, 3):
        raise TbqValueError(f"keys must be (tokens, head_dim) or (tokens, heads, head_dim), got shape {k.shape}")
    d = k.shape[-1]
    if q.shape[-1] != d:
        raise TbqValueError(f"queries have head_dim {q.shape[-1]}, keys {d}")
    if k.ndim == 2:
        if q.ndim != 2:
            raise TbqValueError(f"with 2-D keys the queries must be (n, head_dim), got {q.shape}")
    else:
        h = k.shape[1]
        if q.ndim == 2:
            q = np.broadcast_to(q[:, None, :], (q.shape[0], h, d))
        elif q.ndim != 3 or q.shape[1] != h:
            raise TbqValueError(f"queries must be (n, {d}) or (n, {h}, {d}) for keys of shape {k.shape}, got {q.shape}")
    return q, k


def attention_logits(q: ArrayLike, k: ArrayLike, scale: float | None = None) -> np.ndarray:
    """``q.k * scale`` (default ``scale = 1/sqrt(head_dim)``), float64.

    Returns ``(n_queries, tokens)`` for 2-D keys, ``(heads, n_queries, tokens)``
    for ``(tokens, heads, head_dim)`` keys.
    """
    q, k = _qk_shapes(q, k)
    s = 1.0 / math.sqrt(k.shape[-1]) if scale is None else float(scale)
    if k.ndim == 2:
        return (q @ k.T) * s
    return np.einsum("qhd,thd->hqt", q, k) * s


def log_softmax(logits: ArrayLike, axis: int = -1) -> np.ndarray:
    """Numerically stable ``log(softmax(logits))`` in float64."""
    z = np.asarray(logits, dtype=np.float64)
    m = np.max(z, axis=axis, keepdims=True)
    z = z - m
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


def softmax(logits: ArrayLike, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis`` in float64.

    >>> softmax([0.0, math.log(3.0)]).round(6)
    array([0.25, 0.75])
    """
    return np.exp(log_softmax(logits, axis))


def softmax_kl(ref_logits: ArrayLike, test_logits: ArrayLike, axis: int = -1) -> np.ndarray:
    """``KL(softmax(ref) || softmax(test))`` along ``axis``, in nats, one value per row.

    Zero for identical logits (and for logits that differ by a constant per
    row, which softmax ignores), positive otherwise.

    >>> float(softmax_kl([0.0, 0.0], [0.0, math.log(3.0)]).round(6))
    0.143841
    """
    a, b = _pair(ref_logits, test_logits)
    la = log_softmax(a, axis)
    lb = log_softmax(b, axis)
    kl = np.sum(np.exp(la) * (la - lb), axis=axis)
    return np.maximum(kl, 0.0)  # rounding can give -1e-17


def _topk_idx(z: Any, k: Any) -> Any:
    # Stable: among equal logits the lower token index wins.
    return np.argsort(-z, axis=-1, kind="stable")[..., :k]


def topk_agreement(ref_logits: ArrayLike, test_logits: ArrayLike, k: int = 8) -> np.ndarray:
    """Fraction of the ``k`` largest reference logits that are also among the ``k`` largest test logits.

    Along the last axis, one value per row in ``[0, 1]`` (1 when the top-k
    sets agree as sets; order inside the set does not matter). ``k`` is
    capped at the number of tokens.

    >>> topk_agreement([[3.0, 2.0, 1.0, 0.0]], [[3.0, 0.0, 1.0, 2.0]], k=2)
    array([0.5])
    """
    a, b = _pair(ref_logits, test_logits)
    if a.ndim == 0:
        raise TbqValueError("topk_agreement needs at least one axis")
    n = a.shape[-1]
    k = int(min(max(1, k), n))
    ia = _topk_idx(a, k)
    ib = _topk_idx(b, k)
    hits = (ia[..., :, None] == ib[..., None, :]).any(axis=-1).sum(axis=-1)
    return hits / k


def attention_output(q: ArrayLike, k: ArrayLike, v: ArrayLike, scale: float | None = None) -> np.ndarray:
    """``softmax(q.k * scale) @ v`` in float64.

    Returns ``(n_queries, head_dim)`` for 2-D inputs and ``(n_queries, heads,
    head_dim)`` for 3-D keys and values (the layout of the queries).
    """
    logits = attention_logits(q, k, scale)
    p = softmax(logits)
    v = np.asarray(v, dtype=np.float64)
    if v.shape[:-1] != np.asarray(k).shape[:-1]:
        raise TbqValueError(f"values {v.shape} and keys {np.asarray(k).shape} must have the same tokens (and heads)")
    if v.ndim == 2:
        return p @ v
    return np.einsum("hqt,thd->qhd", p, v)


def logit_error(q: ArrayLike, k: ArrayLike, k_hat: ArrayLike, scale: float | None = None) -> dict[str, Any]:
    """Error of the attention logits ``q.k_hat * scale`` against ``q.k * scale``.

    Returns ``rmse``, ``max_abs``, ``bias`` (mean signed error), ``ref_rms``
    (RMS of the exact logits) and ``relative_rmse`` = ``rmse / ref_rms``.
    Logit errors are in softmax units: an error of 1 changes a weight by a
    factor of e.
    """
    a = attention_logits(q, k, scale)
    b = attention_logits(q, k_hat, scale)
    e = b - a
    rmse = math.sqrt(float(np.mean(e * e)))
    ref_rms = math.sqrt(float(np.mean(a * a)))
    return {
        "rmse": rmse,
        "max_abs": float(np.max(np.abs(e))) if e.size else 0.0,
        "bias": float(np.mean(e)),
        "ref_rms": ref_rms,
        "relative_rmse": rmse / ref_rms if ref_rms > 0 else float("nan"),
    }


def attention_error(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike | None = None,
    k_hat: ArrayLike | None = None,
    v_hat: ArrayLike | None = None,
    *,
    topk: int = 8,
    scale: float | None = None,
) -> dict[str, Any]:
    """How quantizing K and/or V changes attention for the queries ``q``.

    ``k_hat``/``v_hat`` default to the exact ``k``/``v`` (so passing only one
    isolates its effect). ``v`` may be ``None`` for logit-only metrics. Returns:

    - ``logit_rmse``, ``logit_max_abs``: logit error (softmax units),
    - ``kl_mean``, ``kl_max``: ``KL(p || p_hat)`` in nats per (head, query),
    - ``topk_agreement``: mean fraction of the exact top-``topk`` tokens kept,
    - error of the attention output ``p_hat @ v_hat`` against ``p @ v``
      (only when ``v`` is given): ``output_nmse`` pooled over all outputs (so
      dominated by the outputs with the largest norm); the NMSE of each
      (query, head) output vector against its own norm, summarised as
      ``output_nmse_mean``, ``output_nmse_median`` and ``output_nmse_p90``
      (90th percentile: the bad queries); and ``output_cosine`` (mean over
      output vectors).
    """
    k_hat = k if k_hat is None else k_hat
    a = attention_logits(q, k, scale)
    b = a if k_hat is k else attention_logits(q, k_hat, scale)
    e = b - a
    kl = softmax_kl(a, b)
    out = {
        "logit_rmse": math.sqrt(float(np.mean(e * e))),
        "logit_max_abs": float(np.max(np.abs(e))) if e.size else 0.0,
        "kl_mean": float(np.mean(kl)),
        "kl_max": float(np.max(kl)) if kl.size else 0.0,
        "topk_agreement": float(np.mean(topk_agreement(a, b, topk))),
    }
    if v is not None:
        v = np.asarray(v, dtype=np.float64)
        v_hat = v if v_hat is None else np.asarray(v_hat, dtype=np.float64)
        if v_hat.shape != v.shape:
            raise TbqValueError(f"values and their reconstruction differ in shape: {v.shape} vs {v_hat.shape}")
        pa, pb = softmax(a), softmax(b)
        if v.ndim == 2:
            oa, ob = pa @ v, pb @ v_hat
        else:
            oa = np.einsum("hqt,thd->qhd", pa, v)
            ob = np.einsum("hqt,thd->qhd", pb, v_hat)
        out["output_nmse"] = nmse(oa, ob)
        se = np.sum((ob - oa) ** 2, axis=-1)
        sx = np.sum(oa * oa, axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            per = np.where(sx > 0, se / np.where(sx > 0, sx, 1.0), np.where(se == 0, 0.0, np.inf))
        out["output_nmse_mean"] = float(np.mean(per))
        out["output_nmse_median"] = float(np.median(per))
        out["output_nmse_p90"] = float(np.quantile(per, 0.9))
        out["output_cosine"] = float(np.mean(cosine_similarity(oa, ob)))
    return out


# ---------------------------------------------------------------------------
# Reference distortions
# ---------------------------------------------------------------------------


def gaussian_distortion(centroids: ArrayLike, thresholds: ArrayLike, sigma: float = 1.0) -> float:
    """Exact MSE of a scalar quantizer on N(0, sigma^2), divided by sigma^2.

    The quantizer maps ``(thresholds[i-1], thresholds[i]]`` to ``centroids[i]``
    (the outer cells extend to +-infinity). Per cell ``[a, b]`` with centroid
    ``c`` (standardised by sigma) the integral is closed form:
    ``(1 + c^2) (Phi(b) - Phi(a)) - (b phi(b) - a phi(a)) - 2 c (phi(a) - phi(b))``.
    """
    from scipy.special import ndtr

    c = np.asarray(centroids, dtype=np.float64) / sigma
    m = np.asarray(thresholds, dtype=np.float64) / sigma
    if m.size != c.size - 1:
        raise TbqValueError(f"{c.size} centroids need {c.size - 1} thresholds, got {m.size}")
    a = np.concatenate(([-np.inf], m))
    b = np.concatenate((m, [np.inf]))
    pdf = normal_pdf

    def tpdf(t: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.where(np.isfinite(t), np.nan_to_num(t) * pdf(t), 0.0)

    mass = ndtr(b) - ndtr(a)
    d = (1.0 + c * c) * mass - (tpdf(b) - tpdf(a)) - 2.0 * c * (pdf(a) - pdf(b))
    return float(np.sum(d))


@functools.cache
def _lloyd_max_levels_cached(bits: int, tol: float) -> Any:
    from scipy.special import ndtri

    levels = 1 << bits
    # Start at the quantiles of N(0, 3): the asymptotically optimal level density
    # of a Gaussian is proportional to pdf**(1/3) (Panter-Dite), which is N(0, 3).
    start = math.sqrt(3.0) * ndtri((np.arange(levels) + 0.5) / levels)
    c, _, _ = lloyd_max_iterate(start, tol=tol, max_iter=2_000_000, stall=None)
    c.setflags(write=False)
    m = 0.5 * (c[1:] + c[:-1])
    m.setflags(write=False)
    return c, m


def lloyd_max_levels(bits: int, tol: float = 1e-8) -> Any:
    """Float64 Lloyd-Max ``(centroids, thresholds)`` of N(0, 1) with ``2**bits`` levels, any ``bits`` in 1..8.

    The same Lloyd iteration as :func:`tbq.codebooks.lloyd_max` (midpoint
    thresholds, closed-form conditional means), started from the Panter-Dite
    level density and stopped when the largest update is below ``tol``
    (cached). With the default ``tol`` the distortion is within about 1e-8
    (relative) of its limit; 8 bits take a second or two. Unlike the format tables, this is a study
    helper and also works for 6 to 8 bits.
    """
    bits = check_int(bits, "bits", lo=1, hi=8, expected="an integer in 1..8", error=TbqValueError)
    return _lloyd_max_levels_cached(bits, float(tol))


def lloyd_max_distortion(bits: int) -> float:
    """MSE of the ``bits``-bit Lloyd-Max quantizer of a unit-variance Gaussian.

    :func:`gaussian_distortion` of :func:`lloyd_max_levels`: about 0.3634,
    0.1175, 0.03455, 0.009501 for 1..4 bits. It is the NMSE a TBQ format
    reaches when its rotated coordinates are exactly Gaussian.
    """
    c, m = lloyd_max_levels(bits)
    return gaussian_distortion(c, m, 1.0)


def shannon_lower_bound(bits: ArrayLike) -> np.ndarray | float:
    """``4**-bits``: no quantizer of i.i.d. Gaussian data at ``bits`` bits per value has lower NMSE."""
    r = np.power(4.0, -np.asarray(bits, dtype=np.float64))
    return float(r) if r.ndim == 0 else r


def turboquant_upper_bound(bits: ArrayLike) -> np.ndarray | float:
    """``sqrt(3)*pi/2 * 4**-bits`` (about 2.72x the Shannon bound).

    The MSE bound proved for TurboQuant-style quantizers of unit vectors
    (random rotation, then an optimal scalar quantizer per coordinate).
    """
    r = TURBOQUANT_UPPER_FACTOR * np.power(4.0, -np.asarray(bits, dtype=np.float64))
    return float(r) if r.ndim == 0 else r


def entropy_bits(indices_or_counts: ArrayLike, *, counts: bool = False) -> float:
    """Shannon entropy in bits of an index histogram.

    Pass integer indices (any shape), or a histogram with ``counts=True``.
    A ``b``-bit code uses its ``b`` bits fully only when the entropy is ``b``.

    >>> entropy_bits([0, 1, 2, 3]), entropy_bits([5, 5, 0], counts=True)
    (2.0, 1.0)
    """
    a = np.asarray(indices_or_counts)
    if counts:
        c = a.astype(np.float64).ravel()
    else:
        c = np.bincount(a.astype(np.int64).ravel()).astype(np.float64)
    tot = c.sum()
    if tot <= 0:
        return 0.0
    p = c[c > 0] / tot
    return float(-np.sum(p * np.log2(p)) + 0.0)


def kurtosis(x: ArrayLike, axis: int | None = None) -> np.ndarray | float:
    """Excess kurtosis ``E[(x-mu)^4] / var^2 - 3`` (0 for a Gaussian, -1.2 for uniform).

    Large positive values mean heavy tails or a few outliers.
    """
    x = np.asarray(x, dtype=np.float64)
    mu = np.mean(x, axis=axis, keepdims=True)
    z = x - mu
    m2 = np.mean(z * z, axis=axis)
    m4 = np.mean(z**4, axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = m4 / (m2 * m2) - 3.0
    return float(r) if np.ndim(r) == 0 else r


def peak_to_rms(x: ArrayLike, axis: int = -1) -> np.ndarray | float:
    """``max|x| / rms(x)`` along ``axis``: sqrt(n) for a one-hot vector, about 3 for a Gaussian 128-vector.

    It is what decides an absmax block scale's resolution.
    """
    x = np.asarray(x, dtype=np.float64)
    peak = np.max(np.abs(x), axis=axis)
    rms = np.sqrt(np.mean(x * x, axis=axis))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(rms > 0, peak / np.where(rms > 0, rms, 1.0), 0.0)
    return float(r) if np.ndim(r) == 0 else r


# ---------------------------------------------------------------------------
# Value tables against Lloyd-Max
# ---------------------------------------------------------------------------


def _levels(levels: Any) -> np.ndarray:
    v = np.unique(np.asarray(levels, dtype=np.float64).ravel())
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise TbqValueError("a table needs at least one finite level")
    return v


def _samples(samples: Any) -> np.ndarray:
    s = np.asarray(samples, dtype=np.float64).ravel()
    if s.size == 0 or not np.all(np.isfinite(s)):
        raise TbqValueError("samples must be a non-empty array of finite values")
    return s


def table_mse(samples: ArrayLike, levels: ArrayLike, scale: float = 1.0) -> float:
    """Mean squared error of rounding every sample to the nearest of ``scale * levels``.

    The thresholds are the midpoints of adjacent distinct levels (a sample on a
    midpoint is equally far from both, so the tie rule does not change the
    MSE). This is the error of a table at the scale its encoder uses, before
    any correction of the scale (TBQ's corrected norm, IQ4_NL's least-squares
    scale).

    >>> round(table_mse([0.1, 0.9, 1.6], [0.0, 1.0, 2.0]), 12)  # (0.01 + 0.01 + 0.16) / 3
    0.06
    """
    s = _samples(samples)
    c = _levels(levels) * float(scale)
    idx = np.searchsorted(0.5 * (c[1:] + c[:-1]), s, side="right")
    return float(np.mean((s - c[idx]) ** 2))


class _Sorted:
    """Sorted samples with prefix sums: the count, sum and sum of squares of any cell in O(log n)."""

    def __init__(self, samples: ArrayLike) -> None:
        s = np.sort(_samples(samples))
        self.shift = float(np.mean(s))  # centred: the prefix sums of squares stay small
        self.s = s - self.shift
        self.p1 = np.concatenate(([0.0], np.cumsum(self.s)))
        self.p2 = np.concatenate(([0.0], np.cumsum(self.s * self.s)))

    def cells(self, thresholds: ArrayLike) -> Any:
        """Counts, sums and sums of squares of the cells ``[t_(i-1), t_i)`` (shifted units)."""
        k = np.concatenate(([0], np.searchsorted(self.s, thresholds, side="left"), [self.s.size]))
        return np.diff(k), np.diff(self.p1[k]), np.diff(self.p2[k])

    def mse(self, c: Any) -> Any:
        """MSE of nearest-level rounding to the sorted shifted levels ``c``."""
        n, s1, s2 = self.cells(0.5 * (c[1:] + c[:-1]))
        return float(max(np.sum(s2 - 2.0 * c * s1 + c * c * n), 0.0) / self.s.size)


def _panter_dite_start(s: np.ndarray, n_levels: int) -> np.ndarray:
    """Levels at the quantiles of the density**(1/3) of a histogram of the sorted samples ``s``."""
    bins = max(1024, 16 * n_levels)
    h, edges = np.histogram(s, bins=bins, range=(s[0], s[-1]))
    w = np.cbrt(h.astype(np.float64))
    cdf = np.concatenate(([0.0], np.cumsum(w)))
    cdf /= cdf[-1]
    start = np.interp((np.arange(n_levels) + 0.5) / n_levels, cdf, edges)
    if np.all(np.diff(start) > 0):
        return start
    return np.quantile(s, (np.arange(n_levels) + 0.5) / n_levels)  # pragma: no cover - degenerate histograms


def lloyd_max_samples(samples: ArrayLike, n_levels: int, *, tol: float = 1e-10, max_iter: int = 100_000) -> Any:
    """The Lloyd-Max quantizer of an empirical distribution: ``(centroids, thresholds, mse)``.

    Lloyd's iteration on the samples (thresholds at the midpoints of adjacent
    centroids, each centroid the mean of its cell; an empty cell keeps its
    centroid), started from the Panter-Dite level density (the samples'
    density to the power 1/3) and stopped when no centroid moves by more than
    ``tol`` times the samples' range. Every iteration lowers the MSE; the
    result is a local optimum, the global one for a log-concave density such
    as a Gaussian. With at most ``n_levels`` distinct sample values the
    centroids are those values (fewer than ``n_levels``) and the MSE is 0.
    ``mse`` is computed directly from the final table (:func:`table_mse`).

    With enough samples of N(0, 1) it approaches :func:`lloyd_max_distortion`
    from below (a fitted table also fits the sample's noise):

    >>> x = np.random.default_rng(0).standard_normal(200_000)
    >>> c, m, mse = lloyd_max_samples(x, 8)
    >>> abs(mse / lloyd_max_distortion(3) - 1) < 0.01, c.size, m.size
    (True, 8, 7)
    """
    check_int(n_levels, "n_levels", lo=1, expected="a positive integer", error=TbqValueError)
    st = _Sorted(samples)
    distinct = np.unique(st.s)
    if distinct.size <= n_levels:
        c = distinct
    else:
        c = _panter_dite_start(st.s, int(n_levels))
        step = tol * float(st.s[-1] - st.s[0])
        for _ in range(max_iter):
            n, s1, _ = st.cells(0.5 * (c[1:] + c[:-1]))
            new = np.where(n > 0, s1 / np.maximum(n, 1), c)
            change = float(np.max(np.abs(new - c)))
            c = new
            if change <= step:
                break
    c = c + st.shift
    m = 0.5 * (c[1:] + c[:-1])
    return c, m, table_mse(samples, c)


def _best_scale(f: Any, lo: float = 1 / 64, hi: float = 64.0, points: int = 241) -> Any:
    """``(g, f(g))`` minimising ``f`` over ``g`` in ``[lo, hi]``: a log-spaced grid, then a bounded search around its best point."""
    from scipy.optimize import minimize_scalar

    grid = np.geomspace(lo, hi, points)
    vals = np.array([f(g) for g in grid])
    i = int(np.argmin(vals))
    a, b = np.log(grid[max(i - 1, 0)]), np.log(grid[min(i + 1, points - 1)])
    r = minimize_scalar(lambda t: f(math.exp(t)), bounds=(a, b), method="bounded", options={"xatol": 1e-9})
    if r.fun < vals[i]:
        return math.exp(r.x), float(r.fun)
    return float(grid[i]), float(vals[i])


def table_distortion(
    levels: ArrayLike, *, samples: ArrayLike | None = None, sigma: float | None = None, n_levels: int | None = None
) -> dict[str, Any]:
    """A value table against the Lloyd-Max quantizer of the distribution it meets.

    ``levels``: the values the table's codes decode to (sorted and
    deduplicated here), in the units of the distribution. The distribution
    is either the Gaussian N(0, ``sigma**2``) (closed form:
    :func:`gaussian_distortion` against :func:`lloyd_max_distortion`) or
    ``samples`` (measured: :func:`table_mse` against
    :func:`lloyd_max_samples`). ``n_levels``: the number of levels of the
    Lloyd-Max reference, by default the number of distinct levels; pass the
    number of codes (``2**bits``) to charge a table for codes it wastes (a
    power of two for the Gaussian). Returns a dict:

    - ``mse``: the table's MSE on the distribution, at the given scale;
    - ``lloyd_max_mse``: the Lloyd-Max MSE with ``n_levels`` levels;
    - ``ratio``: ``mse / lloyd_max_mse`` (1 for a Lloyd-Max table, above 1
      for any other table of a log-concave distribution);
    - ``best_scale``, ``best_ratio``: the factor ``g`` minimising the MSE of
      ``g * levels`` and the ratio there (the loss of the table's shape alone,
      the scale set right). For the Gaussian, the table fits best the
      distribution N(0, ``(sigma / best_scale)**2``);
    - ``lloyd_max_levels``: the reference's levels (float64);
    - ``n_levels``.

    >>> from tbq.codebooks import lloyd_max
    >>> d = table_distortion(lloyd_max(3, 0.5).centroids, sigma=0.5)
    >>> round(d["ratio"], 6), round(d["best_scale"], 4)
    (1.0, 1.0)
    >>> round(table_distortion([-1.0, 1.0], sigma=1.0)["ratio"], 4)  # +-1 instead of +-0.798: (2 - 2 sqrt(2/pi)) / (1 - 2/pi)
    1.1124
    """
    c = _levels(levels)
    n = c.size if n_levels is None else n_levels
    check_int(n, "n_levels", lo=1, expected="a positive integer", error=TbqValueError)
    if (samples is None) == (sigma is None):
        raise TbqValueError("give exactly one of samples= (a measured distribution) and sigma= (a Gaussian)")
    if sigma is not None:
        sigma = float(sigma)
        bits = int(n).bit_length() - 1
        if not (sigma > 0 and math.isfinite(sigma)):
            raise TbqValueError(f"sigma must be a finite number > 0, got {sigma!r}")
        if n != 1 << bits or not 1 <= bits <= 8:
            raise TbqValueError(f"the Gaussian Lloyd-Max reference needs n_levels = 2**bits, bits in 1..8, got {n}")
        ref = lloyd_max_distortion(bits) * sigma * sigma
        ref_levels = lloyd_max_levels(bits)[0] * sigma

        def mse_at(g: Any) -> Any:
            gc = g * c
            return gaussian_distortion(gc, 0.5 * (gc[1:] + gc[:-1]), sigma) * sigma * sigma
    else:
        assert samples is not None  # exactly one of samples and sigma: checked above
        st = _Sorted(samples)
        ref_levels, _, ref = lloyd_max_samples(samples, int(n))

        def mse_at(g: Any) -> Any:
            return st.mse(g * c - st.shift)

    mse = mse_at(1.0) if samples is None else table_mse(samples, c)
    g, best = _best_scale(mse_at)
    if mse <= best:
        g, best = 1.0, mse
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = mse / ref if ref > 0 else (1.0 if mse == 0 else math.inf)
        best_ratio = best / ref if ref > 0 else (1.0 if best == 0 else math.inf)
    return {
        "mse": mse,
        "lloyd_max_mse": ref,
        "ratio": ratio,
        "best_scale": g,
        "best_ratio": best_ratio,
        "lloyd_max_levels": np.asarray(ref_levels, dtype=np.float64),
        "n_levels": int(n),
    }
