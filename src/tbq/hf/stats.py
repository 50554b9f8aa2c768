"""llama-perplexity's statistics of a cache type against its base, from per-position values.

:func:`kld_statistics` computes what ``llama-perplexity --kl-divergence``
prints, under its names (tools/perplexity/perplexity.cpp's definitions);
:class:`Stats` accumulates a run's per-position NLL, KL divergence against
the f16 and f32 baselines and top-1 agreement over chunks and gives the
fields of its :class:`~tbq.hf.evaluation.Row`. Split from :mod:`tbq.hf.evaluation`, which
runs the model.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["Stats", "kld_lines", "kld_statistics"]


#: llama-perplexity's percentiles of the per-position KL divergence, as it prints them (fraction, name).
KLD_PERCENTILES = ((0.999, "99.9%"), (0.99, "99.0%"), (0.95, "95.0%"), (0.90, "90.0%"))
KLD_LOW = ((0.10, "10.0%"), (0.05, "5.0%"), (0.01, "1.0%"), (0.001, "0.1%"))
DP_PERCENTILES = KLD_PERCENTILES + ((0.75, "75.0%"),)
DP_LOW = ((0.25, "25.0%"),) + KLD_LOW


def _mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """llama-perplexity's ``mean_and_uncertainty``: the mean and its standard error (0 with 10 values or fewer)."""
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    return f, math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0


def _covariance(a: float, b: float, ab: float, count: int) -> float:
    """llama-perplexity's ``covariance`` of two means (0 with fewer than 10 values)."""
    if count < 10:
        return 0.0
    return (ab / count - (a / count) * (b / count)) / (count - 1)


def _percentile(values: np.ndarray, fraction: float) -> float:
    """llama-perplexity's ``percentile``: linear interpolation between the sorted values."""
    if fraction <= 0:
        return float(values[0])
    if fraction >= 1:
        return float(values[-1])
    p = fraction * (values.size - 1)
    ip = int(p)
    p -= ip
    return float((1 - p) * values[ip] + p * values[min(ip + 1, values.size - 1)])


def _median(values: np.ndarray) -> float:
    n = values.size
    return float(0.5 * (values[n // 2] + values[n // 2 - 1]) if n % 2 == 0 else values[n // 2])


def kld_statistics(nll: ArrayLike, nll_base: ArrayLike, kld: ArrayLike, same_top: ArrayLike) -> dict[str, Any]:
    """The statistics ``llama-perplexity --kl-divergence`` prints, under its names, from per-position values.

    ``nll``/``nll_base``: the negative log-likelihood of the correct token with
    the cache type (Q) and the base (the f16 cache); ``kld``: ``KL(base || Q)``
    of each position's next-token distribution; ``same_top``: whether the two
    argmaxes agree. Quantities printed with ``±`` are ``[value, uncertainty]``;
    ``Δp`` (``p(Q) - p(base)`` of the correct token) and ``Same top p`` are in
    percent, as printed. The definitions are tools/perplexity/perplexity.cpp's
    (``mean_and_uncertainty``, ``covariance``, ``percentile``); llama.cpp
    prints them only from 100 positions on.

    >>> s = kld_statistics([1.0, 2.0], [1.0, 2.0], [0.0, 0.0], [True, True])
    >>> s["Mean PPL(Q)/PPL(base)"], s["Same top p"]
    ([1.0, 0.0], [100.0, 0.0])
    """
    q = np.asarray(nll, np.float64)
    b = np.asarray(nll_base, np.float64)
    k = np.sort(np.asarray(kld, np.float64))
    n = q.size
    log_ppl = _mean_and_uncertainty(q.sum(), (q * q).sum(), n)
    log_base = _mean_and_uncertainty(b.sum(), (b * b).sum(), n)
    cov = _covariance(q.sum(), b.sum(), (q * b).sum(), n)
    ppl, ppl_unc = math.exp(log_ppl[0]), math.exp(log_ppl[0]) * log_ppl[1]
    base, base_unc = math.exp(log_base[0]), math.exp(log_base[0]) * log_base[1]
    ratio_log = log_ppl[0] - log_base[0]
    ratio_log_unc = math.sqrt(max(log_ppl[1] ** 2 + log_base[1] ** 2 - 2.0 * cov, 0.0))
    denom = log_ppl[1] * log_base[1]
    diff_unc = math.sqrt(max(ppl_unc**2 + base_unc**2 - 2.0 * ppl * base * cov, 0.0))
    out: dict[str, Any] = {
        "Mean PPL(Q)": [ppl, ppl_unc],
        "Mean PPL(base)": [base, base_unc],
        "Cor(ln(PPL(Q)), ln(PPL(base)))": 100.0 * cov / denom if denom else None,
        "Mean ln(PPL(Q)/PPL(base))": [ratio_log, ratio_log_unc],
        "Mean PPL(Q)/PPL(base)": [math.exp(ratio_log), math.exp(ratio_log) * ratio_log_unc],
        "Mean PPL(Q)-PPL(base)": [ppl - base, diff_unc],
        "Mean KLD": list(_mean_and_uncertainty(k.sum(), (k * k).sum(), n)),
        "Maximum KLD": float(k[-1]),
    }
    out.update({f"{name} KLD": _percentile(k, f) for f, name in KLD_PERCENTILES})
    out["Median KLD"] = _median(k)
    out.update({f"{name} KLD": _percentile(k, f) for f, name in KLD_LOW})
    out["Minimum KLD"] = float(k[0])
    dp = np.exp(-q) - np.exp(-b)
    d = np.sort(dp)
    mean_dp = _mean_and_uncertainty(dp.sum(), (dp * dp).sum(), n)
    out["Mean Δp"] = [100.0 * mean_dp[0], 100.0 * mean_dp[1]]
    out["Maximum Δp"] = 100.0 * float(d[-1])
    out.update({f"{name} Δp": 100.0 * _percentile(d, f) for f, name in DP_PERCENTILES})
    out["Median Δp"] = 100.0 * _median(d)
    out.update({f"{name} Δp": 100.0 * _percentile(d, f) for f, name in DP_LOW})
    out["Minimum Δp"] = 100.0 * float(d[0])
    mse = _mean_and_uncertainty((dp * dp).sum(), (dp**4).sum(), n)
    rms = math.sqrt(mse[0])
    out["RMS Δp"] = [100.0 * rms, 100.0 * (0.5 / rms * mse[1] if rms else 0.0)]
    top = float(np.mean(np.asarray(same_top, bool)))
    out["Same top p"] = [100.0 * top, 100.0 * math.sqrt(top * (1.0 - top) / (n - 1)) if n > 1 else 0.0]
    return out


def kld_lines(s: dict[str, Any]) -> list[str]:
    """:func:`kld_statistics` printed as ``llama-perplexity --kl-divergence`` prints its final statistics.

    >>> kld_lines(kld_statistics([1.0, 2.0], [1.0, 2.0], [0.0, 0.0], [True, True]))[1]
    'Mean PPL(Q)                   :   4.481689 ±   0.000000'
    """

    def pm(key: str, fmt: str = "10.6f", ufmt: str = "10.6f") -> str:
        v, u = s[key]
        return f"{v:{fmt}} ± {u:{ufmt}}"

    cor = s["Cor(ln(PPL(Q)), ln(PPL(base)))"]
    lines = [
        "====== Perplexity statistics ======",
        f"Mean PPL(Q)                   : {pm('Mean PPL(Q)')}",
        f"Mean PPL(base)                : {pm('Mean PPL(base)')}",
        f"Cor(ln(PPL(Q)), ln(PPL(base))): {'nan' if cor is None else f'{cor:6.2f}'}%",
        f"Mean ln(PPL(Q)/PPL(base))     : {pm('Mean ln(PPL(Q)/PPL(base))')}",
        f"Mean PPL(Q)/PPL(base)         : {pm('Mean PPL(Q)/PPL(base)')}",
        f"Mean PPL(Q)-PPL(base)         : {pm('Mean PPL(Q)-PPL(base)')}",
        "",
        "====== KL divergence statistics ======",
        f"Mean    KLD: {pm('Mean KLD')}",
    ]
    for key in [k for k in s if k.endswith(" KLD") and k != "Mean KLD"]:
        name = key[: -len(" KLD")]
        label = {"Maximum": "Maximum", "Median": "Median ", "Minimum": "Minimum"}.get(name, f"{name:>5}  ")
        lines.append(f"{label} KLD: {s[key]:10.6f}")
    lines += ["", "====== Token probability statistics ======", f"Mean    Δp: {pm('Mean Δp', '6.3f', '5.3f')} %"]
    for key in [k for k in s if k.endswith(" Δp") and k not in ("Mean Δp", "RMS Δp")]:
        name = key[: -len(" Δp")]
        label = {"Maximum": "Maximum", "Median": "Median ", "Minimum": "Minimum"}.get(name, f"{name:>5}  ")
        lines.append(f"{label} Δp: {s[key]:6.3f}%")
    lines.append(f"RMS Δp    : {pm('RMS Δp', '6.3f', '5.3f')} %")
    lines.append(f"Same top p: {pm('Same top p', '6.3f', '5.3f')} %")
    return lines


class Stats:
    """Per-position NLL, KL against the two baselines and top-1 agreement, accumulated over chunks."""

    def __init__(self) -> None:
        self.nll: list[Any] = []
        self.nll16: list[Any] = []
        self.kl16: list[Any] = []
        self.kl32: list[Any] = []
        self.top16: list[Any] = []
        self.top32: list[Any] = []
        self.bytes_per_token = 0
        self.window_bytes = 0
        self.changes: list[str] = []

    def add(self, lp: Any, targets: Any, base16: Any, base32: Any, sizes: tuple[int, int, list[str]]) -> None:
        self.bytes_per_token, self.window_bytes, self.changes = sizes
        self.nll.append(-lp.gather(1, targets[:, None])[:, 0].numpy())
        self.nll16.append(-base16.gather(1, targets[:, None])[:, 0].numpy())
        for base, kl, top in ((base16, self.kl16, self.top16), (base32, self.kl32, self.top32)):
            p = base.exp()
            kl.append((p * (base - lp)).sum(-1).numpy())  # unclamped: llama.cpp's KLD can go below 0 by rounding
            top.append((base.argmax(-1) == lp.argmax(-1)).numpy())

    def fields(self, ppl16: float | None) -> dict[str, Any]:
        """The measured fields of an evaluation row (:class:`~tbq.hf.evaluation.Row`), against f16's perplexity."""
        nll = np.concatenate(self.nll)
        ppl = float(math.exp(nll.mean()))
        kl16 = np.concatenate(self.kl16)
        kl32 = np.concatenate(self.kl32)
        top16 = np.concatenate(self.top16)
        return dict(
            bytes_per_token=int(self.bytes_per_token),
            ppl=ppl,
            delta_ppl_pct=0.0 if ppl16 is None else 100.0 * (ppl / ppl16 - 1.0),
            kl_mean=float(np.maximum(kl16, 0.0).mean()),
            kl_p99=float(np.percentile(np.maximum(kl16, 0.0), 99)),
            top1=float(top16.mean()),
            kl_f32_mean=float(np.maximum(kl32, 0.0).mean()),
            top1_f32=float(np.concatenate(self.top32).mean()),
            window_bytes=int(self.window_bytes),
            changes=list(self.changes),
            llama_cpp=kld_statistics(nll, np.concatenate(self.nll16), kl16, top16),
        )
