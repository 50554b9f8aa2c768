"""``tbq compare``: encode and decode a KV data set with every format and tabulate the error.

Without a file it uses :func:`tbq.synthetic.builtin_kv` (512 tokens x 8 heads x
128, keys with outlier channels, Gaussian values). With a ``.npy`` file it uses
that array (float16/32/64, last axis a multiple of 128).
"""

from __future__ import annotations

import time

import numpy as np

from .codecs import get_codec
from .errors import BlockShapeError, TbqTypeError, TbqValueError
from .formats import formats
from .metrics import error_summary

__all__ = ["compare", "format_table"]

COLUMNS = [
    ("data", "{}"),
    ("format", "{}"),
    ("bits/value", "{:.3f}"),
    ("bytes", "{:,}"),
    ("NMSE", "{:.3e}"),
    ("SNR dB", "{:.2f}"),
    ("max abs err", "{:.3e}"),
    ("mean cos", "{:.6f}"),
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


def compare(data: dict[str, np.ndarray], fmts=None, *, repeat: int = 3, **config) -> list[dict]:
    """Round-trip every array of ``data`` through every format; one result row per pair.

    Throughput is the best of ``repeat`` timed runs after one warm-up run (the
    warm-up also compiles the numba kernels), in million values per second.
    """
    fmts = tuple(fmts) if fmts is not None else formats()
    rows = []
    for label, x in data.items():
        x = np.asarray(x)
        if x.dtype not in (np.float16, np.float32, np.float64):
            raise TbqTypeError(f"{label}: expected a float array, got dtype {x.dtype}")
        if x.ndim == 0 or x.shape[-1] % 128:
            raise BlockShapeError(
                f"{label}: the last axis must be a multiple of 128 (the largest block size), got shape {x.shape}"
            )
        x = x.astype(np.float32, copy=False)
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
            row["enc Mv/s"] = x.size / t_enc / 1e6
            row["dec Mv/s"] = x.size / t_dec / 1e6
            rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """Aligned text table of :func:`compare` rows."""
    cells = [[name for name, _ in COLUMNS]] + [[fmt.format(r[name]) for name, fmt in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def add_arguments(p) -> None:
    p.add_argument("file", nargs="?", help=".npy file to study (last axis a multiple of 128); default: built-in synthetic KV")
    p.add_argument("--formats", default=",".join(formats()), help="comma-separated formats (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the built-in data set (default 0)")
    p.add_argument("--codebook", default="lloyd-max", help="TBQ codebook: lloyd-max or turboq-mtp")
    p.add_argument("--signs", default="turboq-mtp", help="TBQ sign tables: turboq-mtp or an integer seed")
    p.add_argument("--backend", default=None, choices=("numpy", "numba"), help="default: numba")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per measurement (best is reported)")


def run_cli(args) -> int:
    from .synthetic import builtin_kv

    fmts = [f.strip() for f in args.formats.split(",") if f.strip()]
    if args.file:
        try:
            arr = np.load(args.file, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise TbqValueError(f"cannot read {args.file!r} as a .npy array: {exc}") from None
        data = {args.file: arr}
        desc = f"{args.file}: shape {arr.shape}, dtype {arr.dtype}"
    else:
        data = builtin_kv(seed=args.seed)
        k = data["keys"]
        desc = (
            f"built-in synthetic KV (seed {args.seed}): keys and values of shape {k.shape} "
            "(tokens, heads, head_dim); keys have outlier channels 5, 37, 64, 111 (x20), values are N(0, 1)"
        )
    signs = int(args.signs) if args.signs.lstrip("-").isdigit() else args.signs
    print(desc)
    rows = compare(data, fmts, repeat=args.repeat, codebook=args.codebook, signs=signs, backend=args.backend)
    print(format_table(rows))
    return 0
