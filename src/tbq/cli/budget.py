"""``tbq budget``: arguments and printing; the model is :mod:`tbq.budget`."""

from __future__ import annotations

import sys
from fractions import Fraction
from typing import Any

from ..budget import (
    _BITS,
    DEFAULT_CONTEXTS,
    DEFAULT_FORMATS,
    BudgetReport,
    _count,
    _out,
    _parse_formats,
    budget_report,
    format_report,
    incompatible_formats,
    kv_values_per_token,
    parse_measured,
    values_per_token,
)
from ..errors import TbqValueError
from ..plots import INSTALL_HINT
from ..units import MAX_QUANTITY, format_bytes, parse_bytes, parse_contexts, parse_rate
from . import check_figure_file, int_at_least

#: The most contexts one report takes: each is a column of the tables, which stay within 100 columns.
MAX_CONTEXTS = 8
#: The largest --layers, --kv-heads and --head-dim taken (no model comes near a million of any).
MAX_GEOMETRY = 10**6


def add_arguments(parser: Any) -> None:
    """Add the ``tbq budget`` options to an argparse (sub-)parser."""
    g = parser.add_argument_group("model (the geometry, or --values-per-token, or --measured)")
    g.add_argument(
        "--layers",
        type=int_at_least(1, MAX_GEOMETRY),
        help="number of full-attention layers (not linear-attention ones)",
    )
    g.add_argument("--kv-heads", type=int_at_least(1, MAX_GEOMETRY), help="KV heads per layer")
    g.add_argument(
        "--head-dim",
        type=int_at_least(1, MAX_GEOMETRY),
        help="head dimension; a block format is only offered when its block size divides it",
    )
    src = g.add_mutually_exclusive_group()
    src.add_argument(
        "--values-per-token", metavar="N", help="cached values per token (2 x layers x kv-heads x head-dim)"
    )
    src.add_argument(
        "--measured",
        metavar="SIZE@CONTEXT:FORMAT",
        help="derive values per token from a reported cache size, e.g. 4224MiB@262144:tbq4_0",
    )
    s = parser.add_argument_group("sweep")
    s.add_argument(
        "--formats",
        default=None,
        help=f"comma-separated formats ({', '.join(_BITS)}) or bits per value (default: {','.join(DEFAULT_FORMATS)}, "
        "without the block formats whose blocks do not divide --head-dim)",
    )
    s.add_argument(
        "--contexts",
        default=",".join(DEFAULT_CONTEXTS),
        help="comma-separated contexts in tokens; K = 1024, so 256K = 262144 (default: %(default)s)",
    )
    s.add_argument("--sequences", type=int_at_least(1), default=1, help="concurrent sequences (default: 1)")
    m = parser.add_argument_group("memory and bandwidth (explicit units: GB = 10^9 bytes, GiB = 2^30 bytes)")
    m.add_argument("--vram", metavar="SIZE", help="device memory, e.g. 32GB")
    m.add_argument("--weights", metavar="SIZE", help="resident weights, e.g. 18.8GiB")
    m.add_argument("--workspace", metavar="SIZE", default="0B", help="compute buffers etc., e.g. 1GiB (default: 0B)")
    m.add_argument(
        "--weights-traffic", metavar="SIZE", help="weight bytes read per decode step, e.g. 15.88GB (default: --weights)"
    )
    m.add_argument("--bandwidth", metavar="RATE", help="memory bandwidth, e.g. 1296GB/s")
    o = parser.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the report as JSON")
    o.add_argument("--plot", metavar="FILE.png", help=f"save a plot (needs matplotlib: {INSTALL_HINT})")


def _number(v: Any) -> str:
    """A count for the report: ``65,536`` when whole, else two decimals (``65,551.52``), never a raw float."""
    return f"{v:,}" if isinstance(v, int) else f"{v:,.2f}"


def _flag(flag: str, fn: Any, value: Any) -> Any:
    try:
        return fn(value)
    except TbqValueError as exc:
        raise type(exc)(f"{flag}: {exc}") from None


def _by_block(bad: list[tuple[str, int]]) -> str:
    """``q8_0, q4_0 (32 values) and tbq4_0 (128 values)`` from (format, block size) pairs."""
    sizes: dict[int, list[str]] = {}
    for name, size in bad:
        sizes.setdefault(size, []).append(name)
    parts = [f"{', '.join(names)} ({size} values)" for size, names in sizes.items()]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _report_from_args(args: Any) -> BudgetReport:
    geo = {"layers": args.layers, "kv-heads": args.kv_heads, "head-dim": args.head_dim}
    given = [k for k, v in geo.items() if v is not None]
    other = args.values_per_token is not None or args.measured is not None
    geometry = measured = None
    if given and other:
        raise TbqValueError(
            "give either the geometry (--layers/--kv-heads/--head-dim) or --values-per-token/--measured, not both"
        )
    if given:
        missing = [f"--{k}" for k, v in geo.items() if v is None]
        if missing:
            raise TbqValueError(f"the geometry needs --layers, --kv-heads and --head-dim; missing {', '.join(missing)}")
        vpt: Any = kv_values_per_token(args.layers, args.kv_heads, args.head_dim)
        geometry = {"n_layers": args.layers, "n_kv_heads": args.kv_heads, "head_dim": args.head_dim}
        source = (
            f"{args.layers} attention layers x {args.kv_heads} KV heads x head_dim {args.head_dim} x 2 (K, V)"
            f" = {vpt:,} values per token"
        )
    elif args.values_per_token is not None:
        text = str(args.values_per_token)
        try:
            v = Fraction(text.replace("_", "")) if len(text) <= 60 else None
        except (ValueError, ZeroDivisionError):
            v = None
        if v is None:
            raise TbqValueError(f"--values-per-token: expected a number, got {text[:40]!r}")
        if v <= 0:
            raise TbqValueError(f"--values-per-token must be positive, got {text!r}")
        if v < 1:
            raise TbqValueError(
                f"--values-per-token must be at least 1 (a token caches at least one value), got {text!r}"
            )
        if v > MAX_QUANTITY:
            raise TbqValueError(f"--values-per-token {text!r} is too large: at most 10^30 is taken")
        vpt = _out(v)
        source = f"{_number(vpt)} values per token (given)"
    elif args.measured is not None:
        size, ctx, fmt = _flag("--measured", parse_measured, args.measured)
        vpt = _flag("--measured", lambda _: values_per_token(size, ctx, fmt), None)
        measured = {"cache_bytes": size, "context": ctx, "format": fmt, "bytes_per_token": _out(Fraction(size, ctx))}
        source = (
            f"{_number(vpt)} values per token, from a measured {fmt} cache of {size:,} bytes ({format_bytes(size)})"
            f" at {ctx:,} tokens = {_number(_out(Fraction(size, ctx)))} bytes ({format_bytes(Fraction(size, ctx))}) per token"
        )
    else:
        raise TbqValueError(
            "give the model geometry (--layers, --kv-heads, --head-dim), --values-per-token or --measured"
        )

    contexts = _flag("--contexts", parse_contexts, args.contexts)
    if 0 in contexts:
        raise TbqValueError("--contexts: a context must be at least 1 token")
    if len(contexts) > MAX_CONTEXTS:
        raise TbqValueError(
            f"--contexts: {len(contexts)} contexts given; at most {MAX_CONTEXTS} fit a table of 100 columns (run several times)"
        )
    notes = []
    if not isinstance(vpt, int):
        notes.append(
            f"{_number(vpt)} values per token is not a whole number: a real cache holds 2 x layers x KV heads x head_dim "
            "values per token; a measured size is usually rounded, or includes other buffers"
        )
    formats = _flag(
        "--formats",
        lambda f: _parse_formats(f, geometry),  # the geometry sizes turbo's padded heads and vLLM's slots
        args.formats if args.formats is not None else DEFAULT_FORMATS,
    )
    if geometry is not None:
        bad = incompatible_formats(args.head_dim, [n for n, _ in formats], args.kv_heads)
        row = args.kv_heads * args.head_dim
        if bad and args.formats is not None:
            raise TbqValueError(
                f"--head-dim {args.head_dim} is not a multiple of the block size of {_by_block(bad)}: "
                f"these formats cannot store this cache (ggml's blocks must divide head_dim, the fork's TBQ blocks "
                f"the row of {args.kv_heads} x {args.head_dim} = {row} values); leave them out of --formats"
            )
        if bad:
            dropped = {n for n, _ in bad}
            formats = [f for f in formats if not dropped & set(f[0].split(":"))]  # a K:V pair with either side
            notes.append(
                f"{_by_block(bad)} cannot store this cache (ggml's blocks must divide head_dim {args.head_dim}, "
                f"the fork's TBQ blocks the row of {args.kv_heads} x {args.head_dim} = {row} values); "
                "they are left out (--formats to choose)"
            )
    sizes: dict[str, Any] = {}
    for attr in ("vram", "weights", "workspace", "weights_traffic"):
        flag, value = "--" + attr.replace("_", "-"), getattr(args, attr)
        sizes[attr] = None if value is None else _flag(flag, parse_bytes, value)
    bandwidth = None if args.bandwidth is None else _flag("--bandwidth", parse_rate, args.bandwidth)
    if sizes["vram"] is not None and sizes["weights"] is None:
        raise TbqValueError("--vram needs --weights (the cache gets VRAM - weights - workspace)")
    if sizes["vram"] is not None and sizes["weights"] + (sizes["workspace"] or 0) > sizes["vram"]:
        what = "the weights alone" if sizes["weights"] > sizes["vram"] else "the weights and the workspace"
        notes.append(
            f"{what} ({format_bytes(sizes['weights'] + (sizes['workspace'] if what != 'the weights alone' else 0))}) "
            f"do not fit in the VRAM ({format_bytes(sizes['vram'])}): no cache fits at any context"
        )
    if bandwidth is not None and sizes["weights_traffic"] is None and sizes["weights"] is None:
        raise TbqValueError(
            "--bandwidth needs --weights-traffic (or --weights): the bytes of weights read per decode step"
        )
    return budget_report(
        vpt,
        [b if n.endswith("-bit") else n for n, b in formats],  # numbers stay bits per value
        contexts,
        _count(args.sequences, "--sequences"),
        vram_bytes=sizes["vram"],
        weights_bytes=sizes["weights"],
        workspace_bytes=sizes["workspace"] or 0,
        weights_traffic_bytes=sizes["weights_traffic"],
        bandwidth_bytes_per_s=bandwidth,
        source=source,
        geometry=geometry,
        measured=measured,
        notes=notes,
    )


def run_cli(args: Any) -> int:
    """Run ``tbq budget`` with parsed arguments; prints the tables (or JSON) and returns 0."""
    if args.plot:  # before any work: matplotlib installed, the file writable
        check_figure_file(args.plot, "--plot")
    report = _report_from_args(args)
    if args.json:
        print(report.to_json())
    else:
        print(format_report(report))
    if args.plot:
        from ..plots import plot_budget

        path = plot_budget(report, args.plot, what="tbq budget --plot")
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0
