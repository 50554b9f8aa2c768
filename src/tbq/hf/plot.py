"""Figures of :func:`tbq.hf.evaluate`'s results (matplotlib, object-oriented API, PNG)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..plots import DPI, require_matplotlib

__all__ = ["plot_eval"]


def plot_eval(result: Any, path: str | os.PathLike[str]) -> Path:
    """Bars of the perplexity change and mean KL per cache type; with per-layer rows, a layer x type map.

    Returns the path written (the directory is created).
    """
    require_matplotlib("tbq eval --plot")
    from matplotlib.figure import Figure

    from .evaluation import BASELINES

    rows = [r for r in result.rows if r.cache not in BASELINES and r.refused is None]  # a refused type has no bars
    layer_rows = [r for r in result.per_layer if r.layer is not None]
    n_panels = 3 if layer_rows else 2
    fig = Figure(figsize=(5.2 * n_panels, 0.28 * max(len(rows), 8) + 1.6), dpi=DPI)
    labels = [r.cache for r in rows]
    y = np.arange(len(rows))
    for k, (attr, title) in enumerate(
        (("delta_ppl_pct", "perplexity change vs f16 cache (%)"), ("kl_mean", "mean KL vs f16 cache (nats)"))
    ):
        ax = fig.add_subplot(1, n_panels, k + 1)
        vals = np.array([getattr(r, attr) for r in rows], dtype=float)
        ax.barh(y, vals, color=["#c44e52" if v > 0 else "#4c72b0" for v in vals])
        ax.set_yticks(y)
        ax.set_yticklabels(labels if k == 0 else [""] * len(labels), fontsize=7)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
        if attr == "kl_mean" and vals.size and np.all(vals > 0):
            ax.set_xscale("log")
        ax.grid(axis="x", alpha=0.3)
    if layer_rows:
        caches = sorted({r.cache for r in layer_rows}, key=[r.cache for r in layer_rows].index)
        layers = sorted({r.layer for r in layer_rows})
        grid = np.full((len(caches), len(layers)), np.nan)
        for r in layer_rows:
            grid[caches.index(r.cache), layers.index(r.layer)] = r.kl_mean
        ax = fig.add_subplot(1, n_panels, n_panels)
        im = ax.imshow(grid, aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(layers)))
        ax.set_xticklabels([str(l) for l in layers], fontsize=7)
        ax.set_yticks(range(len(caches)))
        ax.set_yticklabels(caches, fontsize=7)
        ax.set_xlabel("layer in the cache type (the rest f16)", fontsize=8)
        ax.set_title("mean KL vs f16 cache, one layer at a time", fontsize=9)
        fig.colorbar(im, ax=ax)
    s = result.settings
    fig.suptitle(f"{s['model']}: {s['chunks']} chunks x {s['context']} tokens", fontsize=10)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p)
    return p
