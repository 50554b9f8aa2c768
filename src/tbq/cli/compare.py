"""``tbq compare``: arguments and printing; the computation is :func:`tbq.compare.compare`."""

from __future__ import annotations

import numpy as np

from ..compare import compare, format_table
from ..errors import TbqValueError
from ..formats import formats


def add_arguments(p) -> None:
    p.add_argument("file", nargs="?", help=".npy file to study (last axis a multiple of 128); default: built-in synthetic KV")
    p.add_argument("--formats", default=",".join(formats()), help="comma-separated formats (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the built-in data set (default 0)")
    p.add_argument("--codebook", default="lloyd-max", help="TBQ codebook: lloyd-max or turboq-mtp")
    p.add_argument("--signs", default="turboq-mtp", help="TBQ sign tables: turboq-mtp or an integer seed")
    p.add_argument("--backend", default=None, choices=("numpy", "numba"), help="default: numba")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per measurement (best is reported)")
    p.add_argument("--queries", type=int, default=16, help="random N(0,1) queries per head for the attention metrics (default 16)")
    p.add_argument("--topk", type=int, default=8, help="k of the top-k agreement column (default 8)")
    p.add_argument("--plot", metavar="FILE.png", default=None, help="also save a figure of the error per format (needs matplotlib)")


def run_cli(args) -> int:
    from ..synthetic import builtin_kv

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
    if args.queries < 1 or args.topk < 1:
        raise TbqValueError("--queries and --topk must be at least 1")
    if args.plot:
        from ..plots import require_matplotlib

        require_matplotlib("tbq compare --plot")
    print(desc)
    rows = compare(
        data,
        fmts,
        repeat=args.repeat,
        codebook=args.codebook,
        signs=signs,
        backend=args.backend,
        n_queries=args.queries,
        topk=args.topk,
        query_seed=args.seed,
    )
    print(format_table(rows))
    print(
        f"attention: {args.queries} random N(0,1) queries per head (seed {args.seed}), logits q.k/sqrt(128); "
        f"softmax KL in nats; top-k = share of the exact top-{args.topk} tokens kept; "
        "out NMSE = attention output error with only this tensor quantized"
    )
    if args.plot:
        from ..plots import plot_compare

        path = plot_compare(rows, args.plot, title=desc.split(":")[0])
        print(f"figure saved to {path}")
    return 0
