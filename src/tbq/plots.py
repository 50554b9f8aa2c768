"""Figures of the quantization-error study, saved as PNG.

matplotlib is an optional dependency (the ``plot`` and ``notebooks`` extras):
it is imported inside the functions, never at module import, and only its
object-oriented API is used (``matplotlib.figure.Figure``, no ``pyplot``), so
the functions work headless and do not touch the global backend or leave
figures open. Every ``plot_*`` function takes the data to draw and a ``path``,
writes a PNG there (creating the directory) and returns the path.

Helpers for the notebooks: :func:`small_mode` (the ``TBQ_NOTEBOOK_SMALL``
environment variable, set by the test suite to shrink the data) and
:func:`figure_path` (``TBQ_FIGURE_DIR``, default ``figures`` in the working
directory).

Why one module of this length: every figure tbq draws is here, so matplotlib (an optional
dependency) is imported in this module only, and the figures share its axes helpers and its
install hint.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .errors import ConfigError

__all__ = [
    "require_matplotlib",
    "small_mode",
    "figure_path",
    "plot_compare",
    "plot_budget",
    "plot_rate_distortion",
    "plot_rotation_block",
    "plot_lines",
    "plot_bars",
    "plot_codebooks",
    "plot_index_histograms",
    "plot_format_metrics",
    "plot_rotated_blocks",
    "plot_value_tables",
]

DPI = 110


#: How to install the optional plotting dependency. tbq is installed from its
#: checkout, so the extra is spelled ``'.[plot]'`` (a ``tbq`` on PyPI is not this package).
INSTALL_HINT = "pip install '.[plot]' in the tbq checkout, or pip install matplotlib"


def require_matplotlib(what: str = "plotting") -> Any:
    """Import and return matplotlib, or raise :class:`~tbq.errors.ConfigError` saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            f"{what} needs matplotlib, which is not installed: {INSTALL_HINT} ('.[notebooks]' for the study notebooks)"
        ) from None
    return matplotlib


def small_mode() -> bool:
    """True when ``TBQ_NOTEBOOK_SMALL`` is set to something other than ``""``/``0``: notebooks shrink their data."""
    return os.environ.get("TBQ_NOTEBOOK_SMALL", "") not in ("", "0")


def figure_path(name: str) -> Path:
    """``$TBQ_FIGURE_DIR/name``, the directory created; without the variable, ``figures/name`` in the working directory.

    Jupyter starts a notebook's kernel in the notebook's directory, so a
    notebook opened there saves to ``notebooks/figures/`` (git-ignored).
    """
    d = Path(os.environ.get("TBQ_FIGURE_DIR", "figures"))
    d.mkdir(parents=True, exist_ok=True)
    return d / name


def _figure(
    nrows: Any = 1, ncols: Any = 1, width: Any = None, height: Any = None, *, what: str = "plotting", **kw: Any
) -> Any:
    require_matplotlib(what)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width or 4.6 * ncols, height or 3.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _legend(fig: Any, axes: Any, **kw: Any) -> int:
    """One figure legend of the labels of ``axes`` (an iterable of axes), each label once, in the order first
    drawn; ``kw`` go to ``fig.legend``. Returns the number of labels."""
    seen: dict[Any, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    if "ncols" in kw and callable(kw["ncols"]):
        kw["ncols"] = kw["ncols"](len(seen))
    fig.legend(seen.values(), seen.keys(), **kw)
    return len(seen)


def _titled(fig: Any, path: Any, title: str | None) -> Path:
    """Set the figure's title when given, then :func:`_save` it."""
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def _save(fig: Any, path: Any) -> Path:
    """Save ``fig`` to ``path`` and return the file written (``.png`` added to a name without extension, as
    matplotlib does, so the path reported is the file that exists)."""
    path = Path(path)
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def _colors(n: Any) -> Any:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


# ---------------------------------------------------------------------------
# tbq compare
# ---------------------------------------------------------------------------


def plot_compare(rows: list[dict[str, Any]], path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Grouped bars of :func:`tbq.compare.compare` rows: NMSE, softmax KL (keys) and attention-output NMSE per format."""
    datas = list(dict.fromkeys(r["data"] for r in rows))
    fmts = list(dict.fromkeys(r["format"] for r in rows))
    panels = [
        ("NMSE", "NMSE of the tensor"),
        ("softmax KL", "softmax KL (nats), keys"),
        ("out NMSE", "attention output NMSE"),
    ]
    panels = [p for p in panels if any(r.get(p[0]) is not None for r in rows)]
    fig, axes = _figure(1, len(panels))
    colors = dict(zip(datas, _colors(len(datas)), strict=True))
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        series = {}
        for d in datas:
            vals = []
            for f in fmts:
                r = next((r for r in rows if r["data"] == d and r["format"] == f), None)
                v = None if r is None else r.get(key)
                vals.append(np.nan if v is None or v <= 0 else v)
            if not np.all(np.isnan(vals)):
                series[d] = vals
        width = 0.8 / max(1, len(series))
        for j, (d, vals) in enumerate(series.items()):
            ax.bar(
                np.arange(len(fmts)) + (j - (len(series) - 1) / 2) * width, vals, width, label=str(d), color=colors[d]
            )
        ax.set_xticks(np.arange(len(fmts)), fmts, rotation=30, ha="right")
        ax.set_yscale("log")
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize="small")
    return _titled(fig, path, title)


# ---------------------------------------------------------------------------
# tbq budget
# ---------------------------------------------------------------------------


def plot_budget(report: Any, path: str | os.PathLike[str], *, what: str = "plot_budget") -> Path:
    """Cache size and predicted tokens/s against context per format, with the VRAM budget line.

    ``report`` is a :class:`tbq.budget.BudgetReport`; the tokens/s panel is
    drawn when it has a bandwidth. ``what`` names the caller in the message
    raised when matplotlib is missing.
    """
    from .units import format_bytes, format_context, format_rate

    r = report
    speed = r.bandwidth_bytes_per_s is not None
    ctxs = sorted(r.contexts)
    lo, hi = max(1, ctxs[0]), max(ctxs[-1], 2)
    if lo == hi:
        lo = max(1, hi // 8)
    n = 200
    grid = sorted({round(lo * (hi / lo) ** (i / (n - 1))) for i in range(n)} | set(ctxs))

    fig, axes = _figure(1, 2 if speed else 1, width=12 if speed else 7, height=4.8, what=what)
    axes = axes[0]
    gib = float(2**30)
    ax = axes[0]
    for f in r.formats:
        kv = f.kv_bytes_per_token
        label = f"{f.format} ({f.kv_per_token}/token)"
        (line,) = ax.plot(grid, [c * kv * r.sequences / gib for c in grid], label=label)
        ax.plot(ctxs, [c * kv * r.sequences / gib for c in ctxs], "o", color=line.get_color(), markersize=4)
    if r.available_bytes is not None:
        ax.axhline(
            r.available_bytes / gib,
            color="black",
            linestyle="--",
            label=f"KV budget: VRAM - weights - workspace = {format_bytes(r.available_bytes)}",
        )
    seq = f", {r.sequences} sequences" if r.sequences != 1 else ""
    ax.set_title(f"KV cache size{seq}")
    ax.set_ylabel("KV cache (GiB)")
    ax.legend(fontsize="small")

    if speed:
        ax = axes[1]
        for f in r.formats:
            kv = f.kv_bytes_per_token

            def speed_at(c: int, kv: Any = kv) -> float:
                return r.tokens_per_s(kv, c)

            (line,) = ax.plot(grid, [speed_at(c) for c in grid], label=f.format)
            ax.plot(ctxs, [speed_at(c) for c in ctxs], "o", color=line.get_color(), markersize=4)
        if r.weights_only_tokens_per_s:
            ax.axhline(r.weights_only_tokens_per_s, color="gray", linestyle=":", label="weights only")
        ax.set_title(f"Predicted decode tokens/s (bandwidth {format_rate(r.bandwidth_bytes_per_s)})")
        ax.set_ylabel("tokens/s per sequence" if r.sequences != 1 else "tokens/s")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")

    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ctxs)
        ax.set_xticklabels([format_context(c) for c in ctxs])
        ax.minorticks_off()
        ax.set_xlabel("context (tokens, K = 1024)")
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"KV cache budget: {r.source}")
    return _save(fig, path)


# ---------------------------------------------------------------------------
# Rate-distortion
# ---------------------------------------------------------------------------


def plot_rate_distortion(
    results: list[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    bits_range: Any = (1.0, 9.0),
    title: str | None = None,
) -> Path:
    """NMSE (SNR on the right axis) against bits per value, one column per data set, with the anchors.

    ``results``: dicts with ``dataset``, ``name``, ``bits_per_value`` and
    ``nmse``; a ``family`` key (e.g. ``"rotated Lloyd-Max"``) joins the points
    of that family by a line. Anchors: Shannon ``4**-b``, the TurboQuant upper
    bound ``sqrt(3)*pi/2 * 4**-b`` and the Gaussian Lloyd-Max distortion at
    integer ``b`` (:mod:`tbq.metrics`). The second row shows the same points as
    NMSE divided by the Shannon bound at their bits per value, where the two
    bounds are the horizontal lines 1 and ``sqrt(3)*pi/2``.
    """
    from .metrics import TURBOQUANT_UPPER_FACTOR, lloyd_max_distortion, shannon_lower_bound, turboquant_upper_bound

    datasets = list(dict.fromkeys(r["dataset"] for r in results))
    nd = len(datasets)
    fig, axes = _figure(2, nd, width=6.0 * nd + 2.6, height=8.6, sharex=True, height_ratios=[3, 2])
    b = np.linspace(bits_range[0], bits_range[1], 200)
    bi = np.arange(max(1, math.ceil(bits_range[0])), min(8, math.floor(bits_range[1])) + 1)
    lm = np.array([lloyd_max_distortion(int(k)) for k in bi])
    names = list(dict.fromkeys(r["name"] for r in results if not r.get("family")))
    families = list(dict.fromkeys(r["family"] for r in results if r.get("family")))
    colors = dict(zip(names + families, _colors(len(names) + len(families)), strict=True))
    markers = "osD^v<>pPhX*"
    for col, ds in enumerate(datasets):
        for row, rel in enumerate((False, True)):
            ax = axes[row][col]
            f: Callable[[Any, Any], Any] = (lambda bb, y: y / shannon_lower_bound(bb)) if rel else (lambda bb, y: y)
            ax.fill_between(
                b,
                f(b, shannon_lower_bound(b)),
                f(b, turboquant_upper_bound(b)),
                color="0.9",
                label="between the bounds",
            )
            ax.plot(b, f(b, shannon_lower_bound(b)), "k-", lw=1, label=r"Shannon lower bound $4^{-b}$")
            ax.plot(b, f(b, turboquant_upper_bound(b)), "k--", lw=1, label=r"upper bound $(\sqrt{3}\pi/2)\,4^{-b}$")
            ax.plot(bi, f(bi, lm), "k:", marker="x", lw=1, label="Gaussian Lloyd-Max")
            for fam in families:
                pts = sorted(
                    (r["bits_per_value"], r["nmse"]) for r in results if r["dataset"] == ds and r.get("family") == fam
                )
                if pts:
                    x, y = map(np.asarray, zip(*pts, strict=True))
                    ax.plot(x, f(x, y), "-", marker=".", color=colors[fam], alpha=0.8, label=fam)
            for i, nm in enumerate(names):
                for r in results:
                    if r["dataset"] == ds and r["name"] == nm and not r.get("family"):
                        ax.plot(
                            r["bits_per_value"],
                            f(r["bits_per_value"], r["nmse"]),
                            markers[i % len(markers)],
                            color=colors[nm],
                            ms=7,
                            label=nm,
                        )
            ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
            if rel:
                ax.set_xlabel("bits per value (storage, including scales)")
                ax.set_ylabel("NMSE / 4^-b" if col == 0 else "")
                lo, hi = ax.get_ylim()
                ax.set_ylim(max(lo, 0.5), min(hi, 100.0))
                ax.axhline(TURBOQUANT_UPPER_FACTOR, color="k", ls="--", lw=1)
            else:
                ax.set_title(str(ds))
                ax.set_ylabel("NMSE" if col == 0 else "")
                lo, hi = ax.get_ylim()
                tw = ax.twinx()
                tw.set_ylim(-10 * math.log10(lo), -10 * math.log10(hi))
                if col == nd - 1:
                    tw.set_ylabel("SNR (dB)")
    _legend(fig, (ax for row in axes for ax in row), loc="outside right center", fontsize="small")
    return _titled(fig, path, title)


# ---------------------------------------------------------------------------
# Rotation
# ---------------------------------------------------------------------------


def plot_rotation_block(
    block: Any, rotated: Any, path: str | os.PathLike[str], *, peak_rms: Any = None, title: str | None = None
) -> Path:
    """One block before/after the rotation, and (optionally) max/RMS over many blocks.

    ``block``, ``rotated``: 1-D arrays of one block in the original and the
    rotated domain. Drawn per coordinate (stem plot), as histograms scaled to
    unit RMS against the N(0, 1) density. ``peak_rms``: optional dict
    ``{label: array of max/RMS per block}`` for a third panel.
    """
    block = np.asarray(block, dtype=np.float64)
    rotated = np.asarray(rotated, dtype=np.float64)
    n = 3 if peak_rms else 2
    fig, axes = _figure(1, n, width=5.0 * n, height=3.8)
    ax = axes[0][0]
    idx = np.arange(block.size)
    rb = np.sqrt(np.mean(block**2)) or 1.0
    rr = np.sqrt(np.mean(rotated**2)) or 1.0
    ax.plot(idx, block / rb, ".", ms=4, label="before")
    ax.plot(idx, rotated / rr, ".", ms=4, label="after rotation")
    ax.set_xlabel("channel")
    ax.set_ylabel("value / block RMS")
    ax.set_title("one block, per coordinate")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    ax = axes[0][1]
    lim = max(np.max(np.abs(block / rb)), np.max(np.abs(rotated / rr)), 4.0)
    bins = np.linspace(-lim, lim, 61)
    ax.hist(block / rb, bins=bins, alpha=0.6, density=True, label="before")
    ax.hist(rotated / rr, bins=bins, alpha=0.6, density=True, label="after rotation")
    t = np.linspace(-lim, lim, 400)
    ax.plot(t, np.exp(-t * t / 2) / math.sqrt(2 * math.pi), "k-", lw=1, label="N(0, 1)")
    ax.set_yscale("log")
    ax.set_ylim(1e-3, None)
    ax.set_xlabel("value / block RMS")
    ax.set_title("histogram of the block")
    ax.legend(fontsize="small")
    if peak_rms:
        ax = axes[0][2]
        allv = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in peak_rms.values()])
        bins = np.linspace(0, max(float(allv.max()) * 1.05, 1.0), 60)
        for label, v in peak_rms.items():
            ax.hist(np.asarray(v).ravel(), bins=bins, alpha=0.6, label=label)
        ax.set_xlabel("max|x| / RMS per block")
        ax.set_ylabel("blocks")
        ax.set_title("peak-to-RMS over all blocks")
        ax.legend(fontsize="small")
    return _titled(fig, path, title)


# ---------------------------------------------------------------------------
# Generic panels
# ---------------------------------------------------------------------------


def plot_lines(
    x: ArrayLike,
    panels: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    xlabel: str = "",
    logx: bool = False,
    logy: bool = True,
    ylim: dict[str, Any] | None = None,
    styles: dict[str, Any] | None = None,
    title: str | None = None,
    ncols: int | None = None,
) -> Path:
    """One panel per entry of ``panels`` = ``{panel title: {series label: y values over x}}``.

    ``logy``: bool for every panel, or a dict ``{panel title: bool}``;
    ``logx``: ``False``, ``True`` (base 2) or a base such as 10.
    ``styles``: optional ``{series label: format string}`` (e.g. ``"--"``).
    """
    titles = list(panels)
    ncols = ncols or min(len(titles), 4)
    nrows = math.ceil(len(titles) / ncols)
    single = len(titles) == 1
    fig, axes = _figure(nrows, ncols, width=7.0 if single else 4.4 * ncols, height=4.2 if single else 3.5 * nrows)
    labels = list(dict.fromkeys(lab for p in panels.values() for lab in p))
    colors = dict(zip(labels, _colors(len(labels)), strict=True))
    x = np.asarray(x)
    for k, t in enumerate(titles):
        ax = axes[k // ncols][k % ncols]
        for lab, y in panels[t].items():
            ax.plot(
                x,
                np.asarray(y, dtype=np.float64),
                (styles or {}).get(lab, "-"),
                marker=".",
                color=colors[lab],
                label=lab,
            )
        if logx:
            ax.set_xscale("log", base=2 if logx is True else logx)
        ly = logy.get(t, True) if isinstance(logy, dict) else logy
        if ly:
            ax.set_yscale("log")
        if ylim and t in ylim:
            ax.set_ylim(*ylim[t])
        ax.set_title(t, fontsize="medium")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3, which="both")
    for k in range(len(titles), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    if single:
        axes[0][0].legend(fontsize="small")
    else:
        _legend(
            fig,
            (ax for row in axes for ax in row),
            loc="outside lower center",
            ncols=lambda n: min(4, n),
            fontsize="small",
        )
    return _titled(fig, path, title)


def plot_bars(
    panels: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    logy: bool = True,
    title: str | None = None,
    ncols: int | None = None,
    hline: Any = None,
) -> Path:
    """Bar panels: ``{panel title: {bar label: value}}``; ``logy`` a bool or ``{panel: bool}``.

    ``hline``: optional ``{panel title: (y, label)}`` reference line.
    """
    titles = list(panels)
    ncols = ncols or min(len(titles), 3)
    nrows = math.ceil(len(titles) / ncols)
    fig, axes = _figure(nrows, ncols, width=4.8 * ncols, height=3.9 * nrows)
    for k, t in enumerate(titles):
        ax = axes[k // ncols][k % ncols]
        labs = list(panels[t])
        vals = [panels[t][lab] for lab in labs]
        ax.bar(np.arange(len(labs)), vals, color=_colors(len(labs)))
        ax.set_xticks(np.arange(len(labs)), labs, rotation=35, ha="right", fontsize="small")
        ly = logy.get(t, True) if isinstance(logy, dict) else logy
        if ly:
            ax.set_yscale("log")
        if hline and t in hline:
            y, lab = hline[t]
            ax.axhline(y, color="k", ls="--", lw=1, label=lab)
            ax.legend(fontsize="small")
        ax.set_title(t, fontsize="medium")
        ax.grid(axis="y", alpha=0.3, which="both")
    for k in range(len(titles), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    return _titled(fig, path, title)


# ---------------------------------------------------------------------------
# Codebooks
# ---------------------------------------------------------------------------


def plot_codebooks(
    tables: dict[str, Any], path: str | os.PathLike[str], *, sigma: float, title: str | None = None
) -> Path:
    """Codebook levels against the N(0, sigma^2) density they should fit.

    ``tables``: ``{panel title: {label: Codebook}}`` (e.g. one panel per bit
    width, fitted vs fork). Centroids are drawn as vertical ticks, thresholds
    as dotted lines, over the density of the rotated coordinates.
    """
    titles = list(tables)
    fig, axes = _figure(1, len(titles), width=5.6 * len(titles), height=3.8)
    for ax, t in zip(axes[0], titles, strict=True):
        cbs = tables[t]
        lim = max(4.5 * sigma, max(float(np.max(np.abs(cb.centroids))) for cb in cbs.values()) * 1.1)
        xs = np.linspace(-lim, lim, 600)
        pdf = np.exp(-0.5 * (xs / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
        ax.fill_between(xs, pdf, color="0.88", label=f"density N(0, sigma^2), sigma = {sigma:.4f}")
        top = float(pdf.max())
        colors = _colors(len(cbs))
        for j, (lab, cb) in enumerate(cbs.items()):
            y0, y1 = top * (1.05 + 0.12 * j), top * (1.15 + 0.12 * j)
            ax.vlines(cb.centroids, y0, y1, color=colors[j], lw=2, label=f"{lab} centroids")
            ax.vlines(cb.thresholds, 0, y0, color=colors[j], lw=0.8, ls=":", alpha=0.8, label=f"{lab} thresholds")
        ax.set_xlim(-lim, lim)
        ax.set_xlabel("rotated coordinate of a unit-norm block")
        ax.set_title(t)
        ax.set_yticks([])
    _legend(fig, axes[0], loc="outside lower center", ncols=3, fontsize="small")
    return _titled(fig, path, title)


def plot_index_histograms(hists: dict[str, Any], path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Index histograms: ``{panel title: {label: counts per index}}``, bars side by side, as fractions."""
    titles = list(hists)
    fig, axes = _figure(1, len(titles), width=5.2 * len(titles), height=3.6)
    for ax, t in zip(axes[0], titles, strict=True):
        series = hists[t]
        colors = _colors(len(series))
        w = 0.8 / max(1, len(series))
        for j, (lab, counts) in enumerate(series.items()):
            c = np.asarray(counts, dtype=np.float64)
            frac = c / c.sum() if c.sum() else c
            ax.bar(np.arange(c.size) + (j - (len(series) - 1) / 2) * w, frac, w, color=colors[j], label=lab)
        n = max(len(np.asarray(c)) for c in series.values())
        ax.set_xticks(np.arange(n))
        ax.set_xlabel("index")
        ax.set_ylabel("fraction of coordinates")
        ax.set_title(t)
        ax.legend(fontsize="small")
        ax.grid(axis="y", alpha=0.3)
    return _titled(fig, path, title)


# ---------------------------------------------------------------------------
# Every format, every metric
# ---------------------------------------------------------------------------


def plot_format_metrics(
    rows: list[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    metrics: dict[str, Any],
    groups: dict[str, Any] | None = None,
    logy: bool = True,
    compress_above: float = 9.0,
    title: str | None = None,
) -> Path:
    """Metrics against bits per value: one column per data set, one row per metric, one marker per format.

    ``rows``: dicts with ``dataset``, ``name``, ``bits_per_value`` and the
    keys of ``metrics`` = ``{key: axis label}`` (e.g. the rows of
    :func:`tbq.study.rate_distortion_rows`). ``groups``: optional ``{name:
    group}``; formats of a group share a colour and differ by marker (the
    legend says ``name (group)``, grouped). ``logy``: a bool or ``{key:
    bool}``. The x axis is linear up to ``compress_above`` bits per value and
    compressed seven-fold beyond it (so 16-bit formats fit next to 3-bit ones
    without squeezing the interesting range); the tick labels are true values.
    """
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    names = list(dict.fromkeys(r["name"] for r in rows))
    groups = groups or {}
    glist = list(dict.fromkeys(groups.get(n, n) for n in names))
    gcol = dict(zip(glist, _colors(len(glist)), strict=True))
    names = sorted(names, key=lambda n: glist.index(groups.get(n, n)))  # legend grouped
    cut = float(compress_above)

    def fwd(b: Any) -> Any:
        b = np.asarray(b, dtype=np.float64)
        return np.where(b <= cut, b, cut + (b - cut) / 7.0)

    def inv(u: Any) -> Any:
        u = np.asarray(u, dtype=np.float64)
        return np.where(u <= cut, u, cut + (u - cut) * 7.0)

    markers = "osD^v<>pPhX*"
    seen_in_group: dict[str, Any] = {}
    style = {}
    for n in names:
        g = groups.get(n, n)
        k = seen_in_group.get(g, 0)
        seen_in_group[g] = k + 1
        style[n] = (gcol[g], markers[k % len(markers)], f"{n} ({g})" if n in groups else n)
    keys = list(metrics)
    nr, nc = len(keys), len(datasets)
    fig, axes = _figure(nr, nc, width=4.6 * nc + 2.4, height=2.9 * nr + 0.6, sharex=True)
    bits = sorted({float(r["bits_per_value"]) for r in rows})
    ticks = list(range(math.floor(min(bits)), math.ceil(min(max(bits), cut)) + 1))
    ticks += sorted({round(b) for b in bits if b > cut})
    for j, ds in enumerate(datasets):
        for i, key in enumerate(keys):
            ax = axes[i][j]
            for n in names:
                for r in rows:
                    if r["dataset"] == ds and r["name"] == n and r.get(key) is not None:
                        c, m, lab = style[n]
                        ax.plot(r["bits_per_value"], r[key], m, color=c, ms=7, label=lab, alpha=0.9)
            ax.set_xscale("function", functions=(fwd, inv))
            ax.set_xticks(ticks)
            ax.set_xticklabels([str(t) for t in ticks])
            ax.set_xlim(min(bits) - 0.4, max(bits) + 0.6 * (7.0 if max(bits) > cut else 1.0))
            if max(bits) > cut:
                ax.axvline(cut, color="0.5", lw=0.8, ls=":")
            ly = logy.get(key, True) if isinstance(logy, dict) else logy
            if ly:
                ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
            if i == 0:
                ax.set_title(str(ds))
            if j == 0:
                ax.set_ylabel(metrics[key])
            if i == nr - 1:
                ax.set_xlabel(
                    f"bits per value (axis compressed above {cut:g})" if max(bits) > cut else "bits per value"
                )
    _legend(fig, (ax for row in axes for ax in row), loc="outside right center", fontsize="small")
    return _titled(fig, path, title)


# ---------------------------------------------------------------------------
# Rotations compared
# ---------------------------------------------------------------------------


def plot_rotated_blocks(
    blocks: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    mark: Any = None,
    distributions: dict[str, Any] | None = None,
    ncols: int = 3,
    title: str | None = None,
) -> Path:
    """One block in several domains, coordinate by coordinate, and per-block statistics as histograms.

    ``blocks``: ``{panel title: 1-D array}`` (e.g. a key block before any
    rotation and after each rotation), drawn as ``value / RMS`` per
    coordinate; ``mark``: coordinate indices to shade in those panels (e.g.
    the outlier channels and their Givens pairs or quaternion groups).
    ``distributions``: ``{panel title: {label: per-block values}}``, drawn as
    overlaid histograms (e.g. max/RMS for each rotation).
    """
    distributions = distributions or {}
    n = len(blocks) + len(distributions)
    nrows = math.ceil(n / ncols)
    fig, axes = _figure(nrows, ncols, width=4.8 * ncols, height=3.4 * nrows)
    flat = [ax for row in axes for ax in row]
    lim = 0.0
    scaled = {}
    for t, b in blocks.items():
        b = np.asarray(b, dtype=np.float64)
        rms = math.sqrt(float(np.mean(b * b))) or 1.0
        scaled[t] = b / rms
        lim = max(lim, float(np.max(np.abs(scaled[t]))))
    for ax, (t, v) in zip(flat, scaled.items(), strict=False):
        idx = np.arange(v.size)
        if mark is not None and len(mark):
            for m in np.asarray(mark).ravel():
                ax.axvspan(m - 0.5, m + 0.5, color="0.85", lw=0)
        ax.vlines(idx, 0, v, lw=1.2)
        ax.axhline(0, color="k", lw=0.5)
        ax.set_ylim(-1.08 * lim, 1.08 * lim)
        ax.set_xlim(-1, v.size)
        ax.set_title(t, fontsize="medium")
        ax.set_xlabel("coordinate")
        ax.set_ylabel("value / block RMS")
    for ax, (t, series) in zip(flat[len(blocks) :], distributions.items(), strict=False):
        allv = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in series.values()])
        bins = np.linspace(float(allv.min()), float(allv.max()) * 1.02 + 1e-12, 60)
        for (lab, v), c in zip(series.items(), _colors(len(series)), strict=True):
            ax.hist(np.asarray(v, dtype=np.float64).ravel(), bins=bins, alpha=0.55, color=c, label=lab)
        ax.set_title(t, fontsize="medium")
        ax.set_ylabel("blocks")
        ax.legend(fontsize="small")
    for ax in flat[n:]:
        ax.set_visible(False)
    return _titled(fig, path, title)


# ---------------------------------------------------------------------------
# Value tables over the values they meet
# ---------------------------------------------------------------------------


def plot_value_tables(
    panels: dict[str, Any], path: str | os.PathLike[str], *, ncols: int = 4, title: str | None = None
) -> Path:
    """Value tables drawn over the distribution of the values they quantize.

    ``panels``: ``{panel title: {"samples": array, "tables": {label: levels}}}``.
    The samples are drawn as a density histogram (log scale), each table's
    levels as a row of ticks above it (e.g. a shipped table and the Lloyd-Max
    table of the same samples).
    """
    titles = list(panels)
    nrows = math.ceil(len(titles) / ncols)
    fig, axes = _figure(nrows, ncols, width=4.4 * ncols, height=3.1 * nrows + 0.5)
    flat = [ax for row in axes for ax in row]
    labels = list(dict.fromkeys(lab for p in panels.values() for lab in p.get("tables", {})))
    colors = dict(zip(labels, _colors(len(labels)), strict=True))
    for ax, t in zip(flat, titles, strict=False):
        s = np.asarray(panels[t]["samples"], dtype=np.float64).ravel()
        tabs = panels[t].get("tables", {})
        lo, hi = float(s.min()), float(s.max())
        for lv in tabs.values():
            lv = np.asarray(lv, dtype=np.float64)
            lo, hi = min(lo, float(lv.min())), max(hi, float(lv.max()))
        pad = 0.04 * (hi - lo or 1.0)
        h, edges = np.histogram(s, bins=120, range=(lo - pad, hi + pad), density=True)
        ax.stairs(h, edges, fill=True, color="0.75", label="values met")
        top = float(h.max()) if h.size and h.max() > 0 else 1.0
        floor = top * 1e-4
        ax.set_yscale("log")
        for k, (lab, lv) in enumerate(tabs.items()):
            y0, y1 = top * 2.0 * 2.2**k, top * 2.0 * 2.2**k * 1.8
            ax.vlines(np.asarray(lv, dtype=np.float64), y0, y1, color=colors[lab], lw=1.6, label=lab)
        ax.set_ylim(floor, top * 2.0 * 2.2 ** len(tabs) * 1.2)
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_title(t, fontsize="medium")
        ax.set_yticks([])
        ax.minorticks_off()
    for ax in flat[len(titles) :]:
        ax.set_visible(False)
    _legend(fig, flat, loc="outside lower center", ncols=lambda n: min(4, n), fontsize="small")
    return _titled(fig, path, title)
