"""The budget's arithmetic: bits per value of every format, bytes per token, cache sizes, crossover, decode
speed, feasibility, and the context sweeps over formats x contexts.

Exact: sizes are :class:`fractions.Fraction` inside and come out as ``int`` when whole. The report model and its
text are :mod:`tbq.budget.report`; everything public is importable from :mod:`tbq.budget`.

>>> kv_bytes_per_token(48, 8, 128, "f16")        # 2 * 48 * 8 * 128 values * 2 bytes
196608
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from ..errors import TbqValueError
from ..units import exact as _exact
from ..units import (  # re-exported: tbq.budget was their home before tbq.units
    format_bytes,
    format_context,
    format_rate,
    parse_bytes,
    parse_context,
    parse_contexts,
    parse_rate,
)
from .bits import (
    DEFAULT_CONTEXTS,
    DEFAULT_FORMATS,
    _count,
    _parse_formats,
    format_bits,
)

__all__ = [
    "kv_values_per_token",
    "kv_bytes_per_token",
    "bytes_per_token",
    "values_per_token",
    "cache_bytes",
    "cache_bytes_from_geometry",
    "context_sweep",
    "crossover_tokens",
    "decode_tokens_per_s",
    "feasibility",
    "parse_bytes",
    "parse_rate",
    "parse_context",
    "parse_contexts",
    "parse_measured",
    "format_bytes",
    "format_rate",
    "format_context",
    "Feasibility",
    "SweepRow",
]

Number = int | float

# ---------------------------------------------------------------------------
# Exact number handling
# ---------------------------------------------------------------------------


def _out(v: Fraction) -> Number:
    """An exact Fraction as an int when whole, else the nearest float."""
    return int(v) if v.denominator == 1 else float(v)


def _size(x: Any, what: str, *, positive: bool = False) -> Fraction:
    """A byte size given as a number of bytes or a string with a unit."""
    if isinstance(x, str):
        v = Fraction(parse_bytes(x))
        if positive and v == 0:
            raise TbqValueError(f"{what} must be positive, got {x!r}")
        return v
    return _exact(x, what, positive=positive)


def _bandwidth(x: Any) -> Fraction:
    if isinstance(x, str):
        return Fraction(parse_rate(x))
    return _exact(x, "bandwidth (bytes/s)", positive=True)


# ---------------------------------------------------------------------------
# Parsing (the units themselves are tbq.units)
# ---------------------------------------------------------------------------


def parse_measured(spec: str) -> tuple[int, int, str]:
    """``"SIZE@CONTEXT:FORMAT"`` -> (cache bytes, context tokens, format), e.g. a cache size a server reported.

    >>> parse_measured("4224MiB@262144:tbq4_0")
    (4429185024, 262144, 'tbq4_0')
    """
    m = re.fullmatch(r"\s*([^@]+)@([^:]+):(.+?)\s*", spec) if isinstance(spec, str) else None
    if m is None:
        raise TbqValueError(f"cannot read {spec!r}: expected SIZE@CONTEXT:FORMAT, e.g. 4224MiB@262144:tbq4_0")
    size, ctx, fmt = m.groups()
    name, _ = format_bits(fmt)
    return parse_bytes(size.strip()), parse_context(ctx.strip()), name


# ---------------------------------------------------------------------------
# Formulas
# ---------------------------------------------------------------------------


def kv_values_per_token(n_layers: int, n_kv_heads: int, head_dim: int) -> int:
    """Cached values per token: ``2 (K and V) x n_layers x n_kv_heads x head_dim``.

    Count only the full-attention layers (a hybrid model with linear-attention
    layers passes its number of attention layers).

    >>> kv_values_per_token(48, 8, 128)
    98304
    """
    return 2 * _count(n_layers, "n_layers") * _count(n_kv_heads, "n_kv_heads") * _count(head_dim, "head_dim")


def bytes_per_token(values_per_token: Any, fmt: Any) -> Number:
    """KV bytes per token for a number of cached values per token: ``values x bits_per_value / 8``.

    >>> bytes_per_token(32768, "f16"), bytes_per_token(32768, "tbq4_0")   # 64 KiB, 16.5 KiB
    (65536, 16896)
    """
    return _out(_bpt(values_per_token, fmt))


def _bpt(values: Any, fmt: Any, geometry: dict[str, int] | None = None) -> Fraction:
    return _exact(values, "values per token", positive=True) * format_bits(fmt, geometry)[1] / 8


def _geometry(n_layers: int, n_kv_heads: int, head_dim: int) -> dict[str, int]:
    return {"n_layers": n_layers, "n_kv_heads": n_kv_heads, "head_dim": head_dim}


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, fmt: Any) -> Number:
    """KV cache bytes per token: ``2 x n_layers x n_kv_heads x head_dim x bits_per_value / 8``.

    ``fmt`` is a format name (f32, f16, bf16, fp8_e4m3, fp8_e5m2 (alias fp8), q8_0, q4_0, tbq4_0, tbq3_0,
    nvfp4, mxfp4, turbo3, ...), a ``"K:V"`` pair, a vLLM TurboQuant preset (``turboquant_4bit_nc``, ...) or a
    number of bits per value; the geometry sizes what depends on it (turbo's padded heads, a preset's slots and
    boundary layers: see :func:`format_bits`). Count only full-attention layers.
    The result is exact: an ``int`` when whole, else a ``float``.

    >>> kv_bytes_per_token(48, 8, 128, "f16")       # 98,304 values x 2 bytes
    196608
    >>> kv_bytes_per_token(48, 8, 128, "tbq4_0")    # 98,304 x 4.125 / 8
    50688
    >>> kv_bytes_per_token(1, 1, 1, "tbq3_0")       # 2 x 3.125 / 8
    0.78125
    >>> kv_bytes_per_token(32, 8, 128, "turboquant_4bit_nc")  # 28 layers x 8 heads x 134 B + 4 x 8 x 512 B
    46400
    """
    geometry = _geometry(n_layers, n_kv_heads, head_dim)
    return _out(_bpt(kv_values_per_token(n_layers, n_kv_heads, head_dim), fmt, geometry))


def values_per_token(cache_bytes: Any, context: Any, fmt: Any, sequences: int = 1) -> Number:
    """Invert a reported cache size: ``cache_bytes x 8 / (context x sequences x bits_per_value)``.

    ``cache_bytes`` is a number of bytes or a string with a unit. Example: a
    4,224 MiB tbq4_0 cache at 262,144 tokens is 4,429,185,024 / 262,144 =
    16,896 bytes per token, and 16,896 x 8 / 4.125 = 32,768 values per token.

    >>> values_per_token("4224MiB", 262144, "tbq4_0")
    32768
    >>> values_per_token(16 * 2**30, "256K", "f16")
    32768
    """
    size = _size(cache_bytes, "cache size", positive=True)
    ctx = parse_context(context)
    if ctx == 0:
        raise TbqValueError("context must be at least 1 token to invert a cache size")
    seqs = _count(sequences, "sequences")
    return _out(size * 8 / (ctx * seqs * format_bits(fmt)[1]))


def cache_bytes(values_per_token: Any, fmt: Any, context: Any, sequences: int = 1) -> Number:
    """KV cache bytes: ``values_per_token x bits_per_value / 8 x context x sequences``.

    >>> cache_bytes(32768, "f16", 262144)            # 64 KiB x 262,144 = 16 GiB
    17179869184
    >>> cache_bytes(32768, "tbq4_0", "256K", sequences=4) == 4 * 4224 * 2**20
    True
    """
    return _out(_bpt(values_per_token, fmt) * parse_context(context) * _count(sequences, "sequences"))


def cache_bytes_from_geometry(
    n_layers: int, n_kv_heads: int, head_dim: int, fmt: Any, context: Any, sequences: int = 1
) -> Number:
    """KV cache bytes from a model geometry: ``kv_bytes_per_token(...) x context x sequences``.

    >>> format_bytes(cache_bytes_from_geometry(48, 8, 128, "q8_0", "128K"))   # 104,448 B x 131,072
    '12.75 GiB'
    """
    vpt = kv_values_per_token(n_layers, n_kv_heads, head_dim)
    bpt = _bpt(vpt, fmt, _geometry(n_layers, n_kv_heads, head_dim))
    return _out(bpt * parse_context(context) * _count(sequences, "sequences"))


def crossover_tokens(weights_bytes: Any, kv_bytes_per_token: Any, sequences: int = 1) -> float:
    """Context at which one decode step reads as many KV bytes as weight bytes: ``weights / (kv x sequences)``.

    Each decode step reads the weights once (``weights_bytes``, the weight
    *traffic*: for a mixture of experts only the active weights) and the whole
    cache of every sequence (``context x kv_bytes_per_token x sequences``).
    Past the crossover the cache dominates the bandwidth bill.

    >>> crossover_tokens(16 * 2**30, 65536)          # 16 GiB of weights, 64 KiB/token
    262144.0
    >>> round(crossover_tokens("15.88GB", 196608))   # 15.88e9 / 196,608 = 80,769.85
    80770
    """
    w = _size(weights_bytes, "weights traffic")
    kv = _size(kv_bytes_per_token, "KV bytes per token", positive=True)
    return float(w / (kv * _count(sequences, "sequences")))


def decode_tokens_per_s(
    weights_bytes: Any, kv_bytes_per_token: Any, context: Any, bandwidth_bytes_per_s: Any, sequences: int = 1
) -> float:
    """Bandwidth-bound decode speed: ``bandwidth / (weights + context x kv_bytes_per_token x sequences)``.

    An upper estimate: one decode step must read the weights and the cache, so
    steps per second cannot exceed bandwidth / bytes read. With several
    sequences the value is per sequence (the aggregate is ``x sequences``).

    >>> decode_tokens_per_s(16 * 2**30, 65536, 262144, 1024 * 2**30)     # 1 TiB/s / (16 GiB + 16 GiB)
    32.0
    >>> round(decode_tokens_per_s("15.88GB", 50688, "128K", "1296GB/s"), 2)   # 1296e9 / (15.88e9 + 131,072 x 50,688)
    57.54
    """
    w = _size(weights_bytes, "weights traffic")
    kv = _size(kv_bytes_per_token, "KV bytes per token")
    step = w + parse_context(context) * kv * _count(sequences, "sequences")
    if step == 0:
        raise TbqValueError("nothing is read per decode step (weights and cache are both 0 bytes)")
    return float(_bandwidth(bandwidth_bytes_per_s) / step)


@dataclass(frozen=True, kw_only=True)
class Feasibility:
    """Whether a KV cache fits next to the weights. Sizes in bytes, plus formatted strings."""

    fits: bool
    context: int  #: tokens per sequence
    sequences: int
    kv_bytes_per_token: Number
    cache_bytes: Number  #: context x kv_bytes_per_token x sequences
    vram_bytes: Number
    weights_bytes: Number
    workspace_bytes: Number
    available_bytes: Number  #: vram - weights - workspace: the room for the cache (may be negative)
    headroom_bytes: Number  #: available - cache; negative when the cache does not fit
    max_context: int  #: the largest context per sequence whose cache fits (0 when none does)
    max_sequences: int | None  #: how many sequences of ``context`` tokens fit (None for context 0)
    cache: str
    available: str
    headroom: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def feasibility(
    vram_bytes: Any,
    weights_bytes: Any,
    workspace_bytes: Any,
    kv_bytes_per_token: Any,
    context: Any,
    sequences: int = 1,
) -> Feasibility:
    """Does the cache fit? ``available = vram - weights - workspace``; fits when ``cache <= available``.

    ``headroom = available - cache`` and the largest context that fits is
    ``floor(available / (kv_bytes_per_token x sequences))``.

    >>> f = feasibility("32GB", "18.8GiB", "1GiB", 196608, "32K")
    >>> f.fits, f.available, f.cache, f.headroom, f.max_context
    (True, '10.00 GiB', '6.00 GiB', '4.00 GiB', 54626)
    >>> feasibility("32GB", "18.8GiB", "1GiB", 196608, "32K", sequences=4).headroom
    '-14.00 GiB'
    """
    vram = _size(vram_bytes, "VRAM")
    w = _size(weights_bytes, "weights")
    ws = _size(workspace_bytes, "workspace")
    kv = _size(kv_bytes_per_token, "KV bytes per token", positive=True)
    ctx = parse_context(context)
    seqs = _count(sequences, "sequences")
    available = vram - w - ws
    cache = ctx * kv * seqs
    headroom = available - cache
    max_context = max(0, math.floor(available / (kv * seqs)))
    max_sequences = max(0, math.floor(available / (ctx * kv))) if ctx else None
    return Feasibility(
        fits=headroom >= 0,
        context=ctx,
        sequences=seqs,
        kv_bytes_per_token=_out(kv),
        cache_bytes=_out(cache),
        vram_bytes=_out(vram),
        weights_bytes=_out(w),
        workspace_bytes=_out(ws),
        available_bytes=_out(available),
        headroom_bytes=_out(headroom),
        max_context=max_context,
        max_sequences=max_sequences,
        cache=format_bytes(cache),
        available=format_bytes(available),
        headroom=format_bytes(headroom),
    )


# ---------------------------------------------------------------------------
# Sweeps and the full report
# ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SweepRow:
    """One (format, context) cell of a context sweep."""

    format: str
    bits_per_value: float
    context: int  #: tokens per sequence
    context_label: str  #: e.g. "128K"
    sequences: int
    kv_bytes_per_token: Number
    cache_bytes: Number  #: all sequences
    cache: str
    decode_tokens_per_s: float | None = None  #: per sequence; None without weights traffic + bandwidth
    fits: bool | None = None  #: None without VRAM + weights
    headroom_bytes: Number | None = None
    headroom: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def context_sweep(
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
) -> list[SweepRow]:
    """A table over formats x contexts: cache size, and when given the inputs, decode speed and fit.

    ``formats`` and ``contexts`` are lists or comma-separated strings
    (``"f16,tbq4_0"``, ``"8K,128K"``). Decode speed needs the weight traffic
    (defaults to ``weights_bytes``) and the bandwidth; the fit needs the VRAM
    and the weights.

    >>> rows = context_sweep(32768, "f16,tbq4_0", "8K,256K")
    >>> for r in rows:
    ...     print(r.format, r.context_label, r.cache)
    f16 8K 512.00 MiB
    f16 256K 16.00 GiB
    tbq4_0 8K 132.00 MiB
    tbq4_0 256K 4.12 GiB
    """
    return _sweep(
        _exact(values_per_token, "values per token", positive=True),
        _parse_formats(formats),
        parse_contexts(contexts),
        _count(sequences, "sequences"),
        vram_bytes=vram_bytes,
        weights_bytes=weights_bytes,
        workspace_bytes=workspace_bytes,
        weights_traffic_bytes=weights_traffic_bytes,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
    )


def _sweep(
    vpt: Fraction,
    fmts: list[tuple[str, Fraction]],
    ctxs: list[int],
    seqs: int,
    *,
    vram_bytes: Any,
    weights_bytes: Any,
    workspace_bytes: Any,
    weights_traffic_bytes: Any,
    bandwidth_bytes_per_s: Any,
) -> list[SweepRow]:
    traffic = weights_traffic_bytes if weights_traffic_bytes is not None else weights_bytes
    speed = traffic is not None and bandwidth_bytes_per_s is not None
    fit = vram_bytes is not None and weights_bytes is not None
    rows = []
    for name, bits in fmts:
        kv = vpt * bits / 8
        for ctx in ctxs:
            cache = kv * ctx * seqs
            f = feasibility(vram_bytes, weights_bytes, workspace_bytes, kv, ctx, seqs) if fit else None
            rows.append(
                SweepRow(
                    format=name,
                    bits_per_value=float(bits),
                    context=ctx,
                    context_label=format_context(ctx),
                    sequences=seqs,
                    kv_bytes_per_token=_out(kv),
                    cache_bytes=_out(cache),
                    cache=format_bytes(cache),
                    decode_tokens_per_s=(
                        decode_tokens_per_s(traffic, kv, ctx, bandwidth_bytes_per_s, seqs) if speed else None
                    ),
                    fits=f.fits if f else None,
                    headroom_bytes=f.headroom_bytes if f else None,
                    headroom=f.headroom if f else None,
                )
            )
    return rows
