"""``tbq compare``: encode and decode a KV data set with every format and tabulate the error.

Without a file it uses :func:`tbq.synthetic.builtin_kv` (512 tokens x 8 heads x
128, keys with outlier channels, Gaussian values). With a ``.npy`` file it uses
that array (float16/32/64, last axis a multiple of 128).

Besides the vector error (NMSE, SNR, max abs error, cosine) every row reports
what the error does to attention, against seeded random N(0, 1) queries
(:func:`tbq.metrics.random_queries`). An array is read as ``(tokens, ...)``:
axis 0 is the token (context) axis and every 128 values of a token are one
head. For a *key* array (the built-in ``keys``, or any user file) the columns
are the RMS error of the logits ``q.k/sqrt(128)``, the mean softmax KL
divergence ``KL(p || p_hat)`` in nats, and the fraction of the exact top-k
tokens that stay in the top k; for the built-in ``values`` these do not apply
(values do not enter the logits) and show ``-``. ``out NMSE`` is the NMSE of the
attention output when only this array is quantized (the other one of the
built-in pair exact); it needs both keys and values and shows ``-`` for a
user file. ``--plot FILE.png`` draws the table (needs matplotlib).
"""

from __future__ import annotations

import time

import numpy as np

from .codecs import get_codec
from .errors import BlockShapeError, TbqTypeError, TbqValueError
from .formats import formats
from .metrics import attention_error, error_summary, random_queries

__all__ = ["compare", "format_table", "attention_columns"]

#: Head size of the attention metrics: every 128 values of a token are one head.
HEAD_DIM = 128

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


def _best_time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _heads(x: np.ndarray) -> np.ndarray:
    """``(tokens, heads, 128)`` view: axis 0 is the token axis, every 128 values of a token one head."""
    if x.ndim == 1:
        x = x[None, :]
    return x.reshape(x.shape[0], -1, HEAD_DIM)


def attention_columns(x, y, *, role: str = "keys", partner=None, queries=None, topk: int = 8) -> dict:
    """The attention columns of a :func:`compare` row for reference ``x`` and reconstruction ``y``.

    ``role="keys"``: logit RMSE, softmax KL and top-k agreement of ``y`` as the
    keys; ``role="values"``: those are ``None``. ``out NMSE`` is the attention
    output error with ``partner`` as the exact other half of the pair (values
    for keys, keys for values), ``None`` without a partner. ``queries`` are
    ``(n, heads, 128)`` or ``(n, 128)``.
    """
    X, Y = _heads(np.asarray(x, np.float32)), _heads(np.asarray(y, np.float32))
    P = None if partner is None else _heads(np.asarray(partner, np.float32))
    out = {"logit rmse": None, "softmax KL": None, "top-k": None, "out NMSE": None}
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


def compare(
    data: dict[str, np.ndarray],
    fmts=None,
    *,
    repeat: int = 3,
    attention: bool = True,
    n_queries: int = 16,
    topk: int = 8,
    query_seed: int = 0,
    **config,
) -> list[dict]:
    """Round-trip every array of ``data`` through every format; one result row per pair.

    Throughput is the best of ``repeat`` timed runs after one warm-up run (the
    warm-up also compiles the numba kernels), in million values per second.

    With ``attention`` (default) each row also holds the attention columns of
    :func:`attention_columns` against ``n_queries`` seeded N(0, 1) queries per
    head (seed ``query_seed``), with top-``topk`` agreement. An array labelled
    ``"values"`` is treated as values and every other one as keys; when
    ``data`` holds both ``"keys"`` and ``"values"`` of the same shape each is the
    exact partner of the other. Without ``attention`` those columns are ``None``.
    """
    fmts = tuple(fmts) if fmts is not None else formats()
    arrays = {}
    for label, x in data.items():
        x = np.asarray(x)
        if x.dtype not in (np.float16, np.float32, np.float64):
            raise TbqTypeError(f"{label}: expected a float array, got dtype {x.dtype}")
        if x.ndim == 0 or x.shape[-1] % 128:
            raise BlockShapeError(
                f"{label}: the last axis must be a multiple of 128 (the largest block size), got shape {x.shape}"
            )
        arrays[label] = x.astype(np.float32, copy=False)
    paired = "keys" in arrays and "values" in arrays and arrays["keys"].shape == arrays["values"].shape
    rows = []
    for label, x in arrays.items():
        role = "values" if label == "values" else "keys"
        partner = None
        if paired and label in ("keys", "values"):
            partner = arrays["values" if label == "keys" else "keys"]
        queries = random_queries(n_queries, HEAD_DIM, _heads(x).shape[1], seed=query_seed) if attention else None
        for fmt in fmts:
            cfg = {k: v for k, v in config.items() if fmt.startswith("tbq") or k not in ("codebook", "signs")}
            codec = get_codec(fmt, **cfg)
            q = codec.encode(x)  # warm-up, compiles the kernels
            y = codec.decode(q)
            t_enc = _best_time(lambda: codec.encode(x, out=q), repeat)
            t_dec = _best_time(lambda: codec.decode(q, out=y), repeat)
            row = {"data": label, "format": fmt, "bits/value": codec.bits_per_value, "bytes": int(q.nbytes)}
            s = error_summary(x, y)
            row.update({"NMSE": s["nmse"], "SNR dB": s["snr_db"], "max abs err": s["max_abs_error"], "mean cos": s["mean_cosine"]})
            if attention:
                row.update(attention_columns(x, y, role=role, partner=partner, queries=queries, topk=topk))
            else:
                row.update({"logit rmse": None, "softmax KL": None, "top-k": None, "out NMSE": None})
            row["enc Mv/s"] = x.size / t_enc / 1e6
            row["dec Mv/s"] = x.size / t_dec / 1e6
            rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """Aligned text table of :func:`compare` rows."""
    cells = [[name for name, _ in COLUMNS]] + [
        ["-" if r.get(name) is None else fmt.format(r[name]) for name, fmt in COLUMNS] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
