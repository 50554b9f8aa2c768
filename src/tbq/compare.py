"""``tbq compare``: encode and decode a KV data set with every format and tabulate the error.

Without a file it uses :func:`tbq.synthetic.builtin_kv` (512 tokens x 8 heads x
128, keys with outlier channels, Gaussian values). With a ``.npy`` file it uses
that array (float16/32/64).

An array is read as ``(tokens, kv_heads, head_dim)`` (:func:`kv_geometry`):
axis 0 is the token (context) axis, the last axis one head, any axes between
the KV heads; a 2-D array is one head per token. Any head_dim works. As in
llama.cpp each token's row of ``kv_heads x head_dim`` values is quantized in
blocks along the row: a ggml type's block must divide head_dim (it never spans
two heads), the fork's TBQ blocks only the row (``FormatInfo.tiles``); a
format that cannot tile the rows is skipped (the default list) or refused (a
named one).

Besides the vector error (NMSE, SNR, max abs error, cosine) every row reports
what the error does to attention, against seeded random N(0, 1) queries
(:func:`tbq.metrics.random_queries`). For a *key* array (the built-in ``keys``, or any user file) the columns
are the RMS error of the logits ``q.k/sqrt(head_dim)``, the mean softmax KL
divergence ``KL(p || p_hat)`` in nats, and the fraction of the exact top-k
tokens that stay in the top k; for the built-in ``values`` these do not apply
(values do not enter the logits) and show ``-``. ``out NMSE`` is the NMSE of the
attention output when only this array is quantized (the other one of the
built-in pair exact); it needs both keys and values and shows ``-`` for a
user file. ``--plot FILE.png`` draws the table (needs matplotlib).

This module computes and formats; it prints nothing. The command line
(:mod:`tbq.cli.compare`) reads files, reports progress and prints.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .attention import KVCache, attention_fused
from .codecs import EXECUTION_SETTINGS, get_codec
from .errors import BlockShapeError, TbqTypeError, TbqValueError, check_int
from .formats import (
    FormatInfo,
    cache_formats,
    check_options,
    config_for,
    format_class,
    format_name,
    get_format,
)
from .metrics import attention_error, cosine_similarity, nmse, random_queries, softmax_kl, topk_agreement
from .warmup import WarmUp, kernels_cached, start_warm_up, warm_up

__all__ = [
    "compare",
    "kv_geometry",
    "untileable",
    "format_table",
    "attention_columns",
    "to_records",
    "kernels_cached",
    "warm_up",
    "start_warm_up",
    "WarmUp",
    "COLUMNS",
    "COMPACT_COLUMNS",
    "JSON_KEYS",
]

#: Head size of the built-in data set.
HEAD_DIM = 128
#: Values per step of the chunked error metrics (bounds their float64 temporaries to a few MiB).
METRIC_STEP = 1 << 18

COLUMNS = [
    ("data", "{}"),
    ("format", "{}"),
    ("bits/value", "{:.3f}"),
    ("bytes", "{:,}"),
    ("NMSE", "{:.3e}"),
    ("SNR dB", "{:.2f}"),
    ("max abs err", "{:.3e}"),
    ("mean cos", "{:.6f}"),
    ("logit rmse", "{:.3e}"),
    ("softmax KL", "{:.3e}"),
    ("top-k", "{:.3f}"),
    ("out NMSE", "{:.3e}"),
    ("enc Mv/s", "{:.0f}"),
    ("dec Mv/s", "{:.0f}"),
]


#: The default (compact) table: under 100 characters for the built-in data.
#: (row key, header, format, group); the groups are printed above the headers.
COMPACT_COLUMNS = [
    ("data", "data", "{}", ""),
    ("format", "format", "{}", ""),
    ("bits/value", "bits", "{:g}", ""),
    ("NMSE", "NMSE", "{:.2e}", "tensor error"),
    ("SNR dB", "SNR dB", "{:.2f}", "tensor error"),
    ("logit rmse", "logit", "{:.2e}", "attention"),
    ("softmax KL", "KL", "{:.2e}", "attention"),
    ("top-k", "top-k", "{:.3f}", "attention"),
    ("out NMSE", "out NMSE", "{:.2e}", "attention"),
    ("enc Mv/s", "enc", "{:.0f}", "Mv/s"),
    ("dec Mv/s", "dec", "{:.0f}", "Mv/s"),
]

#: Row key -> key of :func:`to_records` (``--json``): snake_case, units in the name.
JSON_KEYS = {
    "data": "data",
    "format": "format",
    "bits/value": "bits_per_value",
    "bytes": "bytes",
    "NMSE": "nmse",
    "SNR dB": "snr_db",
    "max abs err": "max_abs_error",
    "mean cos": "mean_cosine",
    "logit rmse": "logit_rmse",
    "softmax KL": "softmax_kl",
    "top-k": "topk_agreement",
    "out NMSE": "output_nmse",
    "enc Mv/s": "encode_mvalues_per_s",
    "dec Mv/s": "decode_mvalues_per_s",
}


def _best_time(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def kv_geometry(x: ArrayLike) -> tuple[int, int, int]:
    """``(tokens, kv_heads, head_dim)`` of an array as :func:`compare` reads it.

    Axis 0 is the tokens, the last axis one head, the axes between are the KV
    heads; a 2-D array is one head per token and a 1-D array one token.

    >>> kv_geometry(np.zeros((16, 8, 64))), kv_geometry(np.zeros((16, 2, 4, 96))), kv_geometry(np.zeros((5, 256)))
    ((16, 8, 64), (16, 8, 96), (5, 1, 256))
    """
    shape = np.shape(x)
    if len(shape) == 0:
        return (1, 1, 1)
    if len(shape) == 1:
        return (1, 1, int(shape[0]))
    return int(shape[0]), int(np.prod(shape[1:-1], dtype=np.int64)), int(shape[-1])


def _instance_info(fmt: str, options: dict[str, Any] | None) -> FormatInfo:
    """The :class:`~tbq.formats.FormatInfo` of ``fmt`` with its own options of ``options`` (the others and the
    execution settings ignored): an option may change the sizes (vLLM's ``head_dim``), so not the registry's row."""
    name = format_name(fmt)
    own = {k: v for k, v in (options or {}).items() if k in format_class(name).options}
    return get_format(name, **own).info


def untileable(fmts: Any, kv_heads: int, head_dim: int, options: dict[str, Any] | None = None) -> list[str]:
    """The formats of ``fmts`` whose blocks cannot tile rows of ``kv_heads x head_dim`` values (``FormatInfo.tiles``),
    each with its own options of ``options`` (one mapping for every format, as :func:`compare` takes it).

    >>> untileable(["q8_0", "nvfp4", "tbq4_0"], 8, 96), untileable(["q8_0", "tbq4_0"], 1, 64)
    (['nvfp4'], ['tbq4_0'])
    >>> untileable(["vllm_tq4_k"], 8, 64), untileable(["vllm_tq4_k"], 8, 64, {"head_dim": 64})
    (['vllm_tq4_k'], [])
    """
    return [f for f in fmts if not _instance_info(f, options).tiles(kv_heads, head_dim)]


def _heads(x: np.ndarray) -> np.ndarray:
    """``(tokens, kv_heads, head_dim)`` view (:func:`kv_geometry`)."""
    return x.reshape(kv_geometry(x))


def _logits(queries: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``q.k / sqrt(128)`` in float64, ``(heads, n, tokens)``, one BLAS product per head
    (the values of :func:`tbq.metrics.attention_logits`, without its einsum's cost)."""
    q = np.asarray(queries, np.float64)
    if q.ndim == 2:
        q = np.broadcast_to(q[:, None, :], (q.shape[0], X.shape[1], q.shape[1]))
    out = np.empty((X.shape[1], q.shape[0], X.shape[0]))
    for h in range(X.shape[1]):
        np.matmul(q[:, h, :], X[:, h, :].astype(np.float64).T, out=out[h])
    return out * (1.0 / math.sqrt(X.shape[2]))


def attention_columns(
    x: ArrayLike,
    y: ArrayLike,
    *,
    role: str = "keys",
    partner: Any = None,
    queries: ArrayLike | None = None,
    topk: int = 8,
    encoded: Any = None,
    threads: Any = None,
) -> dict[str, Any]:
    """The attention columns of a :func:`compare` row for reference ``x`` and reconstruction ``y``.

    ``role="keys"``: logit RMSE, softmax KL and top-k agreement of ``y`` as the
    keys; ``role="values"``: those are ``None``. ``out NMSE`` is the attention
    output error with ``partner`` as the exact other half of the pair (values
    for keys, keys for values), ``None`` without a partner. ``queries`` are
    ``(n, heads, 128)`` or ``(n, 128)``.

    With ``encoded=(bytes, codec)`` (the encoding of ``x`` that ``y``
    decodes) the attention outputs come from the fused kernel
    (:func:`tbq.attention.attention_fused`) reading the quantized blocks
    directly, the exact output from the same kernel on ``x``, and the logits
    from one BLAS product per head: the same metrics, cheap for long caches
    (the outputs are float32, whose rounding is about 1e-7 of the output, far
    below any quantization error).
    """
    X, Y = _heads(np.asarray(x, np.float32)), _heads(np.asarray(y, np.float32))
    P = None if partner is None else _heads(np.asarray(partner, np.float32))
    out: dict[str, Any] = {"logit rmse": None, "softmax KL": None, "top-k": None, "out NMSE": None}
    if encoded is not None and _fused_ok(encoded[1], X.shape[2]):
        return _attention_columns_fused(X, Y, role, P, queries, topk, encoded, threads)
    if queries is None:
        raise TbqValueError("attention_columns needs queries (tbq.metrics.random_queries)")
    if role == "keys":
        m = attention_error(queries, X, P, k_hat=Y, topk=topk)
        out.update({"logit rmse": m["logit_rmse"], "softmax KL": m["kl_mean"], "top-k": m["topk_agreement"]})
    elif P is not None:
        m = attention_error(queries, P, X, v_hat=Y, topk=topk)
    else:
        m = {}
    if P is not None:
        out["out NMSE"] = m["output_nmse"]
    return out


def _fused_ok(codec: Any, head_dim: int) -> bool:
    """Whether the fused kernel reads this cache: its blocks (the codec instance's) within a head."""
    return head_dim % codec.info.block_size == 0


def _attention_columns_fused(
    X: Any, Y: Any, role: Any, P: Any, queries: Any, topk: Any, encoded: Any, threads: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {"logit rmse": None, "softmax KL": None, "top-k": None, "out NMSE": None}
    if role == "keys":  # one head at a time: the float64 logits of all heads at once were 1.5x the input
        q = np.asarray(queries, np.float64)
        if q.ndim == 2:
            q = np.broadcast_to(q[:, None, :], (q.shape[0], X.shape[1], q.shape[1]))
        se = kl = agree = 0.0
        for h in range(X.shape[1]):
            a, b = _logits(q[:, h : h + 1], X[:, h : h + 1]), _logits(q[:, h : h + 1], Y[:, h : h + 1])
            e = b - a
            se += float(np.sum(e * e))
            kl += float(np.sum(softmax_kl(a, b)))
            agree += float(np.sum(topk_agreement(a, b, topk)))
            del a, b, e
        n_logits, n_rows = X.shape[1] * q.shape[0] * X.shape[0], X.shape[1] * q.shape[0]
        out["logit rmse"] = math.sqrt(se / n_logits)
        out["softmax KL"] = kl / n_rows
        out["top-k"] = agree / n_rows
    if P is not None:
        data, codec = encoded
        heads = X.shape[1]
        q = np.asarray(queries, np.float32)
        if q.ndim == 2:
            q = np.broadcast_to(q[:, None, :], (q.shape[0], heads, q.shape[1]))
        q = np.ascontiguousarray(q.transpose(1, 0, 2)).reshape(
            -1, X.shape[2]
        )  # query heads (head, query): GQA over the heads
        cache: KVCache | np.ndarray
        if codec.format.attention.domain == "rotated":  # read in the rotated domain, from the blocks
            cache = KVCache(
                codec.name, np.asarray(data).reshape(X.shape[0], heads, -1), X.shape[2], codec.format.config()
            )
        else:  # the decoded rows: the format's reader gives exactly these bits (the same result), and compiles nothing
            cache = np.asarray(Y, np.float32)
        with np.errstate(all="ignore"):
            if role == "keys":
                exact, approx = attention_fused(q, X, P, threads=threads), attention_fused(q, cache, P, threads=threads)
            else:
                exact, approx = attention_fused(q, P, X, threads=threads), attention_fused(q, P, cache, threads=threads)
            out["out NMSE"] = nmse(exact, approx)
    return out


def _check_count(value: object, name: str, minimum: int = 1) -> int:
    return check_int(value, name, lo=minimum)


def tokens_of(x: ArrayLike) -> int:
    """Tokens of an array as :func:`compare` reads it: ``shape[0]``, or 1 for a 1-D array."""
    shape = np.shape(x)
    return 1 if len(shape) <= 1 else int(shape[0])


def check_array(label: str, x: ArrayLike) -> np.ndarray:
    """``x`` as float32 if :func:`compare` can study it, else a :class:`~tbq.errors.TbqError` naming ``label``.

    It must be a float16/32/64 array (any byte order) with at least one axis
    and at least one value; its geometry is :func:`kv_geometry`'s.
    """
    x = np.asarray(x)
    if x.dtype.kind != "f" or x.dtype.itemsize not in (2, 4, 8):
        raise TbqTypeError(f"{label}: expected a float16, float32 or float64 array, got dtype {x.dtype}")
    if x.ndim == 0:
        raise BlockShapeError(f"{label}: expected an array of (tokens, kv_heads, head_dim), got a scalar")
    if x.size == 0:
        raise TbqValueError(f"{label}: the array has no values (shape {x.shape})")
    return x.astype(np.float32, copy=False)


def compare(
    data: dict[str, np.ndarray],
    fmts: Any = None,
    *,
    repeat: int = 3,
    attention: bool = True,
    n_queries: int = 16,
    topk: int = 8,
    query_seed: int = 0,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    **config: Any,
) -> list[dict[str, Any]]:
    """Round-trip every array of ``data`` through every format; one result row per pair.

    Throughput is the best of ``repeat`` timed runs after one warm-up run (the
    warm-up also compiles the numba kernels), in million values per second.

    With ``attention`` (default) each row also holds the attention columns of
    :func:`attention_columns` against ``n_queries`` seeded N(0, 1) queries per
    head (seed ``query_seed``), with top-``topk`` agreement (``topk`` at most
    the number of tokens). An array labelled ``"values"`` is treated as values
    and every other one as keys; when ``data`` holds both ``"keys"`` and
    ``"values"`` of the same shape each is the exact partner of the other.
    Without ``attention`` those columns are ``None``.

    Each array is read as ``(tokens, kv_heads, head_dim)`` (:func:`kv_geometry`)
    and its rows of ``kv_heads x head_dim`` values are encoded as llama.cpp
    does. A format that cannot tile those rows (:func:`untileable`) raises
    :class:`~tbq.errors.BlockShapeError` when named in ``fmts``; with
    ``fmts=None`` (every format) it is left out of the rows.

    ``config`` goes to :func:`tbq.get_codec` (each format's own options only:
    ``codebook`` and ``signs`` to the TBQ formats, ``scale`` to FP8; an option
    no format of ``fmts`` takes is an error), e.g. ``on_overflow="inf"``; metrics of a
    reconstruction holding infinities are then ``inf`` or ``nan``.
    ``on_row(row)``, if given, is called after each row (progress reports).
    """
    named = fmts is not None
    fmts = tuple(dict.fromkeys(format_name(f) for f in fmts)) if named else cache_formats()
    check_options(fmts, {k: v for k, v in config.items() if k not in EXECUTION_SETTINGS})
    repeat = _check_count(repeat, "repeat")
    if attention:
        n_queries = _check_count(n_queries, "n_queries")
        topk = _check_count(topk, "topk")
    arrays = {label: check_array(label, x) for label, x in data.items()}
    for label, x in arrays.items():
        _, heads, head_dim = kv_geometry(x)
        bad = untileable(fmts, heads, head_dim, config)
        if bad and named:
            raise BlockShapeError(f"{label}: {tiling_message(bad, heads, head_dim, config)}")
    if attention:
        for label, x in arrays.items():
            if topk > tokens_of(x):
                raise TbqValueError(
                    f"{label}: topk={topk} is more than its {tokens_of(x)} tokens (axis 0); "
                    "top-k agreement needs topk <= tokens"
                )
    paired = "keys" in arrays and "values" in arrays and arrays["keys"].shape == arrays["values"].shape
    rows = []
    for label, x in arrays.items():
        role = "values" if label == "values" else "keys"
        partner = None
        if paired and label in ("keys", "values"):
            partner = arrays["values" if label == "keys" else "keys"]
        tokens, heads, head_dim = kv_geometry(x)
        rows2 = x.reshape(tokens, heads * head_dim)  # one row per token, tiled in blocks as llama.cpp does
        queries = random_queries(n_queries, head_dim, heads, seed=query_seed) if attention else None
        for fmt in fmts:
            if fmt in untileable([fmt], heads, head_dim, config):
                continue  # the default list: left out (a named format was refused above)
            cfg = config_for(fmt, config)
            codec = get_codec(fmt, **cfg)
            q = codec.encode(rows2)  # warm-up, compiles the kernels
            y2 = codec.decode(q)
            t_enc = _best_time(functools.partial(codec.encode, rows2, out=q), repeat)
            t_dec = _best_time(functools.partial(codec.decode, q, out=y2), repeat)
            y = codec.format.domain.from_decode_domain(y2).reshape(x.shape)  # turbo2/3/4 decode to R(x): rotate back
            row = {"data": label, "format": fmt, "bits/value": codec.bits_per_value, "bytes": int(q.nbytes)}
            with np.errstate(all="ignore"):  # inf/nan metrics of an on_overflow="inf" reconstruction are the answer
                s = chunked_error_summary(_heads(x), _heads(y))
                row.update(
                    {
                        "NMSE": s["nmse"],
                        "SNR dB": s["snr_db"],
                        "max abs err": s["max_abs_error"],
                        "mean cos": s["mean_cosine"],
                    }
                )
                if attention:
                    row.update(
                        attention_columns(
                            x, y, role=role, partner=partner, queries=queries, topk=topk, encoded=(q, codec)
                        )
                    )
                else:
                    row.update({"logit rmse": None, "softmax KL": None, "top-k": None, "out NMSE": None})
            row["enc Mv/s"] = x.size / t_enc / 1e6
            row["dec Mv/s"] = x.size / t_dec / 1e6
            del q, y2, y  # before the next format allocates its own: peak memory is one format's, not two
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def tiling_message(bad: Any, heads: int, head_dim: int, options: dict[str, Any] | None = None) -> str:
    """Why the formats ``bad`` (with their own options of ``options``) cannot store rows of ``heads x head_dim``
    values (docs/formats.md, row tiling)."""
    parts = []
    for f in bad:
        info = _instance_info(f, options)
        unit = (
            f"the row of {heads} x {head_dim} = {heads * head_dim} values" if info.row_tiled else f"head_dim {head_dim}"
        )
        parts.append(f"{f} (blocks of {info.block_size} must divide {unit})")
    return "cannot tile the rows: " + "; ".join(parts)


def chunked_error_summary(x: np.ndarray, y: np.ndarray, step: int = METRIC_STEP) -> dict[str, Any]:
    """:func:`tbq.metrics.error_summary` of ``(tokens, heads, head_dim)`` arrays, a few tokens at a time.

    The sums are float64 as there; the temporaries are bounded by ``step``
    values, not by the arrays (a 128 MiB file no longer needs gigabytes). The
    cosine is per head vector, as before.
    """
    tokens = x.shape[0]
    per = max(1, step // max(1, x[0].size))
    sx = se = 0.0
    mx = 0.0
    cos_sum = 0.0
    n_vec = 0
    for s0 in range(0, tokens, per):
        a = x[s0 : s0 + per].astype(np.float64)
        b = y[s0 : s0 + per].astype(np.float64)
        d = b - a
        sx += float(np.sum(a * a))
        se += float(np.sum(d * d))
        if d.size:
            m = float(np.max(np.abs(d)))
            mx = float("nan") if (m != m or mx != mx) else max(mx, m)  # NaN propagates as in np.max
        c = cosine_similarity(a, b)
        cos_sum += float(np.sum(c))
        n_vec += c.size
    if sx == 0.0:
        e = 0.0 if se == 0.0 else float("inf")
    else:
        e = se / sx
    snr = float("inf") if e == 0.0 else float(-10.0 * np.log10(e))
    return {"nmse": e, "snr_db": snr, "max_abs_error": mx, "mean_cosine": cos_sum / n_vec if n_vec else float("nan")}


def to_records(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`compare` rows with the snake_case keys of :data:`JSON_KEYS`, ready for ``json.dumps``.

    Columns that do not apply stay ``None`` (JSON ``null``); so do values
    that are not finite (strict JSON has no NaN or infinity).

    >>> to_records([{"data": "keys", "format": "q8_0", "NMSE": 1e-4, "top-k": None, "SNR dB": float("nan")}])
    [{'data': 'keys', 'format': 'q8_0', 'nmse': 0.0001, 'topk_agreement': None, 'snr_db': None}]
    """
    out = []
    for r in rows:
        rec = {}
        for k, v in r.items():
            if isinstance(v, float) and not math.isfinite(v):
                v = None
            rec[JSON_KEYS.get(k, k)] = v
        out.append(rec)
    return out


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return fmt.format(value)


def format_table(rows: list[dict[str, Any]], *, wide: bool = True, topk: int | None = None) -> str:
    """Aligned text table of :func:`compare` rows.

    ``wide=True`` (default) has one column per row key (:data:`COLUMNS`);
    ``wide=False`` is the compact table of :data:`COMPACT_COLUMNS` (no bytes,
    max abs error or cosine; short headers under group labels) that fits
    100 columns for the built-in data. ``topk`` names the top-k column
    (``top-8``).
    """
    if wide:
        spec = [(key, key, fmt, "") for key, fmt in COLUMNS]
    else:
        spec = COMPACT_COLUMNS
    if topk is not None:
        spec = [(k, f"top-{topk}" if k == "top-k" else h, f, g) for k, h, f, g in spec]
    cells = [[header for _, header, _, _ in spec]] + [[_cell(r.get(key), fmt) for key, _, fmt, _ in spec] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(spec))]
    lines = []
    groups = [g for _, _, _, g in spec]
    if any(groups):
        line = ""
        i = 0
        while i < len(spec):
            j = i
            while j + 1 < len(spec) and groups[j + 1] == groups[i]:
                j += 1
            span = sum(widths[i : j + 1]) + 2 * (j - i)
            label = f" {groups[i]} " if groups[i] else ""
            text = label.center(span, "-") if groups[i] else " " * span
            line += ("  " if i else "") + text
            i = j + 1
        lines.append(line.rstrip())
    for n, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
