"""The budget's report: the model of everything ``tbq budget`` prints (:class:`BudgetReport`, built by
:func:`budget_report` from the arithmetic of :mod:`tbq.budget.arithmetic`) and its text (:func:`format_report`).
The figure is :func:`tbq.plots.plot_budget` (:func:`plot_report` saves it; matplotlib is imported only there).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from ..errors import TbqValueError
from ..formats import FORMATS
from ..units import exact as _exact
from ..units import format_bytes, format_context, format_rate, parse_contexts
from ..vllm_slots import PRESET_NAMES, slot_bytes
from .arithmetic import (
    Number,
    SweepRow,
    _bandwidth,
    _out,
    _size,
    _sweep,
    crossover_tokens,
    decode_tokens_per_s,
    feasibility,
)
from .bits import DEFAULT_CONTEXTS, DEFAULT_FORMATS, PRESET_HEAD_DIM, VLLM_BOUNDARY_LAYERS, _count, _parse_formats

__all__ = ["FormatBudget", "BudgetReport", "budget_report", "format_report", "plot_report", "REPORT_WIDTH"]


@dataclass(frozen=True, kw_only=True)
class FormatBudget:
    """Per-format summary: bytes per token, crossover context and the largest context that fits."""

    format: str
    bits_per_value: float
    kv_bytes_per_token: Number
    kv_per_token: str  #: formatted, e.g. "16.50 KiB"
    crossover_tokens: float | None  #: None without a weight traffic
    max_context: int | None  #: None without VRAM + weights
    max_context_label: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class BudgetReport:
    """Everything ``tbq budget`` prints: inputs (in bytes), per-format summary and the sweep."""

    values_per_token: Number
    source: str  #: where values_per_token came from, in words
    geometry: dict[str, int] | None
    measured: dict[str, Any] | None
    sequences: int
    contexts: list[int]
    formats: list[FormatBudget]
    sweep: list[SweepRow]
    vram_bytes: Number | None
    weights_bytes: Number | None
    workspace_bytes: Number
    available_bytes: Number | None  #: vram - weights - workspace
    weights_traffic_bytes: Number | None
    bandwidth_bytes_per_s: Number | None
    weights_only_tokens_per_s: float | None  #: bandwidth / weights traffic (context 0)
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def tokens_per_s(self, kv_bytes_per_token: Any, context: Any) -> float:
        """:func:`decode_tokens_per_s` with this report's weights traffic, bandwidth and sequences."""
        return decode_tokens_per_s(
            self.weights_traffic_bytes, kv_bytes_per_token, context, self.bandwidth_bytes_per_s, self.sequences
        )

    def row(self, fmt: str, context: int) -> SweepRow:
        """The sweep row of one format and context."""
        for r in self.sweep:
            if r.format == fmt and r.context == context:
                return r
        raise KeyError((fmt, context))


def _k_notes(contexts: list[int]) -> list[str]:
    """Warn when 'NK' looks like a decimal rounding of a power of two (262K vs 256K = 2^18)."""
    notes = []
    for n in contexts:
        if n % 1024 or n & (n - 1) == 0:
            continue
        k = n // 1024
        for e in range(10, 41):
            if 2**e // 1000 == k:
                notes.append(
                    f"{k}K = {k} x 1024 = {n:,} tokens (K = 1024); 2^{e} = {2**e:,} tokens is {format_context(2**e)}"
                )
                break
    return notes


def budget_report(
    values_per_token: Any,
    formats: Any = DEFAULT_FORMATS,
    contexts: Any = DEFAULT_CONTEXTS,
    sequences: int = 1,
    *,
    vram_bytes: Any = None,
    weights_bytes: Any = None,
    workspace_bytes: Any = 0,
    weights_traffic_bytes: Any = None,
    bandwidth_bytes_per_s: Any = None,
    source: str | None = None,
    geometry: dict[str, int] | None = None,
    measured: dict[str, Any] | None = None,
    notes: Iterable[str] = (),
) -> BudgetReport:
    """The whole budget (what ``tbq budget`` prints) for a number of cached values per token.

    The weight traffic per decode step defaults to ``weights_bytes``. ``notes``
    are printed under the heading, after the notes the report adds itself.

    >>> r = budget_report(32768, "f16,tbq4_0", "256K", vram_bytes="32GB", weights_bytes="18.8GiB",
    ...                   workspace_bytes="1GiB", bandwidth_bytes_per_s="1296GB/s")
    >>> [(f.format, f.kv_per_token, round(f.crossover_tokens), f.max_context) for f in r.formats]
    [('f16', '64.00 KiB', 308019, 163878), ('tbq4_0', '16.50 KiB', 1194741, 635648)]
    """
    vpt = _exact(values_per_token, "values per token", positive=True)
    fmts = _parse_formats(formats, geometry)
    ctxs = parse_contexts(contexts)
    seqs = _count(sequences, "sequences")
    vram = None if vram_bytes is None else _size(vram_bytes, "VRAM")
    w = None if weights_bytes is None else _size(weights_bytes, "weights")
    ws = _size(workspace_bytes if workspace_bytes is not None else 0, "workspace")
    if vram is not None and w is None:
        raise TbqValueError("a VRAM size needs the weights size too (the cache gets VRAM - weights - workspace)")
    traffic = w if weights_traffic_bytes is None else _size(weights_traffic_bytes, "weights traffic")
    bw = None if bandwidth_bytes_per_s is None else _bandwidth(bandwidth_bytes_per_s)
    if bw is not None and traffic is None:
        raise TbqValueError("a decode estimate needs the bytes of weights read per step (weights traffic or weights)")
    available = None if vram is None or w is None else vram - w - ws  # (w is given with vram: checked above)

    sweep = _sweep(
        vpt,
        fmts,
        ctxs,
        seqs,
        vram_bytes=vram,
        weights_bytes=w,
        workspace_bytes=ws,
        weights_traffic_bytes=traffic,
        bandwidth_bytes_per_s=bw,
    )

    summary = []
    for name, bits in fmts:
        kv = vpt * bits / 8
        cross = crossover_tokens(traffic, kv, seqs) if traffic is not None else None
        maxc = feasibility(vram, w, ws, kv, 0, seqs).max_context if vram is not None else None
        summary.append(
            FormatBudget(
                format=name,
                bits_per_value=float(bits),
                kv_bytes_per_token=_out(kv),
                kv_per_token=format_bytes(kv),
                crossover_tokens=cross,
                max_context=maxc,
                max_context_label=None if maxc is None else format_context(maxc),
            )
        )
    if source is None:
        source = f"{_out(vpt):,} cached values per token"
    return BudgetReport(
        values_per_token=_out(vpt),
        source=source,
        geometry=geometry,
        measured=measured,
        sequences=seqs,
        contexts=ctxs,
        formats=summary,
        sweep=sweep,
        vram_bytes=None if vram is None else _out(vram),
        weights_bytes=None if w is None else _out(w),
        workspace_bytes=_out(ws),
        available_bytes=None if available is None else _out(available),
        weights_traffic_bytes=None if traffic is None else _out(traffic),
        bandwidth_bytes_per_s=None if bw is None else _out(bw),
        weights_only_tokens_per_s=None if bw is None or not traffic else float(bw / traffic),
        notes=_k_notes(ctxs) + _shape_notes([n for n, _ in fmts], geometry) + [str(n) for n in notes],
    )


def _shape_notes(names: list[str], geometry: dict[str, int] | None) -> list[str]:
    """What the cost of a padded format or a vLLM preset in ``names`` assumed (see :func:`format_bits`)."""
    geo = geometry or {}
    head_dim, layers = geo.get("head_dim"), geo.get("n_layers")
    notes = []
    for name in names:
        if name in PRESET_NAMES:
            d = head_dim or PRESET_HEAD_DIM
            s, s_al = slot_bytes(name, d)
            shape = f"at head_dim {d}" + ("" if head_dim else " (no geometry given: vLLM's usual head_dim)")
            skip = None if layers is None else min(VLLM_BOUNDARY_LAYERS, layers // 2)
            tail = (
                f"the first and last {skip} of the {layers} layers keep the model's dtype (counted at 16 bits)"
                if skip is not None
                else f"vLLM also keeps the first and last {VLLM_BOUNDARY_LAYERS} layers of a dense model in the model's "
                "dtype: give the geometry (--layers) to count them"
            )
            rounded = f" ({s} bytes rounded up to even)" if s_al != s else ""
            notes.append(
                f"{name} (vLLM): one {s_al}-byte slot per token and KV head for K and V{rounded}, {shape}; {tail}"
            )
    padded = sorted({side for n in names for side in n.split(":") if side in FORMATS and FORMATS[side].padded_heads})
    if head_dim is not None:
        grown = [n for n in padded if FORMATS[n].stored_head_dim(head_dim) != head_dim]
        if grown:
            stored = FORMATS[grown[0]].stored_head_dim(head_dim)
            notes.append(
                f"{', '.join(grown)}: the engine zero-pads each head of {head_dim} values to {stored}, "
                "and the bytes count the padding"
            )
    return notes


# ---------------------------------------------------------------------------
# Text output
# ---------------------------------------------------------------------------


def _table(headers: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    """Aligned columns: the first ``left`` columns left-aligned, the rest right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        parts = [
            str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return ("  " + "  ".join(parts)).rstrip()

    return [line(headers)] + [line(r) for r in rows]


def _bits_str(bits: float) -> str:
    return f"{bits:g}"


def _tokens_str(x: float) -> str:
    n = round(x)
    k = x / 1024
    return f"{n:,} ({k:,.1f}K)" if x >= 1024 else f"{n:,}"


#: Width of the text report: headers and notes are wrapped to it; the tables of the default formats fit it.
REPORT_WIDTH = 100


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, REPORT_WIDTH, subsequent_indent="  ", break_on_hyphens=False) or [""]


def _count_str(v: Number) -> str:
    """``65,536`` when whole, else two decimals: never a raw float like ``65,551.51515151515``."""
    return f"{v:,}" if isinstance(v, int) else f"{v:,.2f}"


def format_report(report: BudgetReport) -> str:
    """The aligned text tables ``tbq budget`` prints (headers and notes wrapped to :data:`REPORT_WIDTH` columns)."""
    r = report
    names = [f.format for f in r.formats]
    seq_word = f"{r.sequences} sequence{'s' if r.sequences != 1 else ''}"
    out = _wrap(f"KV cache budget: {r.source}") + [f"Sequences: {r.sequences}"]
    for note in r.notes:
        out += _wrap(f"Note: {note}")

    out += ["", "Bytes per token (K and V, all attention layers)"]
    out += _table(
        ["format", "bits/value", "bytes/token", "per token"],
        [[f.format, _bits_str(f.bits_per_value), _count_str(f.kv_bytes_per_token), f.kv_per_token] for f in r.formats],
    )

    ctx_rows = [[format_context(c), f"{c:,}"] for c in r.contexts]
    out += ["", f"KV cache size ({seq_word})"]
    out += _table(
        ["context", "tokens", *names],
        [row + [r.row(n, c).cache for n in names] for row, c in zip(ctx_rows, r.contexts, strict=True)],
        left=1,
    )

    out += [""]
    if r.weights_traffic_bytes is not None:
        per = "" if r.sequences == 1 else f"; the step reads the caches of all {r.sequences} sequences"
        out += _wrap(
            "Crossover: the context where one decode step reads as many KV bytes as weight bytes "
            f"(weights read per step: {format_bytes(r.weights_traffic_bytes, binary=False)}"
            f" = {format_bytes(r.weights_traffic_bytes)}{per})"
        )
        out += _table(
            ["format", "crossover (tokens)"],
            [[f.format, _tokens_str(cast(float, f.crossover_tokens))] for f in r.formats],  # set: weights traffic given
        )
    else:
        out.append("Crossover: give --weights-traffic (or --weights) to compute it")

    out += [""]
    if r.bandwidth_bytes_per_s is not None:
        per = "" if r.sequences == 1 else f"; per sequence, the aggregate is {r.sequences}x"
        out += _wrap(
            f"Predicted decode tokens/s (bandwidth-bound upper estimate: {format_rate(r.bandwidth_bytes_per_s)}"
            f" / (weights + context x KV bytes/token{' x sequences' if r.sequences != 1 else ''}){per})"
        )
        if r.weights_only_tokens_per_s is None:
            out.append("  weights only (context 0): no bytes read per step (weights traffic 0)")
        else:
            out.append(f"  weights only (context 0): {r.weights_only_tokens_per_s:,.1f} tok/s")
        out += _table(
            ["context", "tokens", *names],
            [
                row + [f"{r.row(n, c).decode_tokens_per_s:,.1f}" for n in names]
                for row, c in zip(ctx_rows, r.contexts, strict=True)
            ],
        )
    else:
        out.append("Decode tokens/s: give --bandwidth and --weights-traffic (or --weights) to estimate it")

    out += [""]
    if r.vram_bytes is not None:
        out += _wrap(
            f"Feasibility ({seq_word}): VRAM {format_bytes(r.vram_bytes, binary=False)} ({format_bytes(r.vram_bytes)})"
            f" - weights {format_bytes(r.weights_bytes)} - workspace {format_bytes(r.workspace_bytes)}"
            f" = {format_bytes(r.available_bytes)} for the KV cache; cells show fit and headroom"
            " (1 decimal); the last row is the largest context that fits, in tokens"
        )

        def cell(row: SweepRow) -> str:
            h = cast(Number, row.headroom_bytes)  # set on every row when VRAM is given
            return f"{'yes' if row.fits else 'NO'} {'+' if h >= 0 else ''}{format_bytes(h, precision=1)}"

        table_rows = [row + [cell(r.row(n, c)) for n in names] for row, c in zip(ctx_rows, r.contexts, strict=True)]
        table_rows.append(["largest", ""] + [f"{f.max_context:,}" for f in r.formats])
        out += _table(["context", "tokens", *names], table_rows)
    else:
        out.append("Feasibility: give --vram and --weights (and --workspace) to check it")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Plot (the figure is drawn by tbq.plots; matplotlib is imported only there)
# ---------------------------------------------------------------------------


def plot_report(report: BudgetReport, path: Any) -> Path:
    """Save the figure of :func:`tbq.plots.plot_budget` (cache size and tokens/s against context) to ``path``."""
    from ..plots import plot_budget

    return plot_budget(report, path, what="plot_report")
