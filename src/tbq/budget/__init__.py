"""KV cache budget: bytes per token, context sweeps, crossover, decode speed, feasibility.

This module is independent of the codecs: it only needs the storage cost of a
format in bits per value (every registered format, plugins included, comes
from :data:`tbq.formats.FORMATS`, f32 among them). See ``docs/budget.md`` for the formulas and a full
worked example.

Units are explicit. Functions take sizes in **bytes** as numbers, or as strings
with a unit (``"18.8GiB"``, ``"32GB"``); bandwidths in bytes per second, or as
strings like ``"1296GB/s"``; contexts in **tokens**, as integers or strings
like ``"128K"`` (K = 1024 tokens). The parsing and formatting of those units
lives in :mod:`tbq.units` (``parse_bytes``, ``format_bytes``, ... are
re-exported here). The figure is :func:`tbq.plots.plot_budget`.

One module per concern: :mod:`tbq.budget.arithmetic` (formats' bits, the formulas,
feasibility, the sweeps) and :mod:`tbq.budget.report` (the report model and its
text); every public name is importable from here.

>>> kv_bytes_per_token(48, 8, 128, "f16")        # 2 * 48 * 8 * 128 values * 2 bytes
196608
>>> format_bytes(cache_bytes(32768, "f16", "256K"))
'16.00 GiB'
>>> values_per_token("4224MiB", 262144, "tbq4_0")
32768
"""

from __future__ import annotations

from .arithmetic import (
    Feasibility,
    SweepRow,
    bytes_per_token,
    cache_bytes,
    cache_bytes_from_geometry,
    context_sweep,
    crossover_tokens,
    decode_tokens_per_s,
    feasibility,
    format_bytes,
    format_context,
    format_rate,
    kv_bytes_per_token,
    kv_values_per_token,
    parse_bytes,
    parse_context,
    parse_contexts,
    parse_measured,
    parse_rate,
    values_per_token,
)
from .arithmetic import _out as _out
from .bits import _BITS as _BITS  # tbq.cli.budget reads these four private names
from .bits import (
    DEFAULT_CONTEXTS,
    DEFAULT_FORMATS,
    KV_FORMAT_BITS,
    PRESET_HEAD_DIM,
    VLLM_BOUNDARY_LAYERS,
    bits_per_value,
    format_bits,
    format_block_size,
    incompatible_formats,
)
from .bits import _count as _count
from .bits import _parse_formats as _parse_formats
from .report import (
    REPORT_WIDTH,
    BudgetReport,
    FormatBudget,
    budget_report,
    format_report,
    plot_report,
)

#: The public names of the three modules (every one importable from here).
__all__ = [
    "bits_per_value",
    "format_bits",
    "budget_report",
    "BudgetReport",
    "bytes_per_token",
    "cache_bytes",
    "cache_bytes_from_geometry",
    "context_sweep",
    "crossover_tokens",
    "decode_tokens_per_s",
    "DEFAULT_CONTEXTS",
    "DEFAULT_FORMATS",
    "feasibility",
    "Feasibility",
    "format_block_size",
    "format_bytes",
    "format_context",
    "format_rate",
    "format_report",
    "FormatBudget",
    "incompatible_formats",
    "kv_bytes_per_token",
    "KV_FORMAT_BITS",
    "kv_values_per_token",
    "parse_bytes",
    "parse_context",
    "parse_contexts",
    "parse_measured",
    "parse_rate",
    "plot_report",
    "PRESET_HEAD_DIM",
    "REPORT_WIDTH",
    "SweepRow",
    "values_per_token",
    "VLLM_BOUNDARY_LAYERS",
]
