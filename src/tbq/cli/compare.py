"""``tbq compare``: arguments, reading the file, progress and printing; the computation is :func:`tbq.compare.compare`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import zipfile
from typing import Any

import numpy as np

from ..compare import (
    WarmUp,
    check_array,
    compare,
    format_table,
    kernels_cached,
    kv_geometry,
    start_warm_up,
    tiling_message,
    to_records,
    tokens_of,
    untileable,
    warm_up,
)
from ..errors import ScaleOverflowError, TbqValueError
from ..formats import cache_formats, check_options, config_for, format_name, formats, parse_option
from . import check_figure_file, int_at_least

DEFAULT_TOPK = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "file",
        nargs="?",
        help=".npy or .npz file of keys or values, shape (tokens, kv_heads, head_dim) with any head_dim "
        "(2-D: one head per token), float16/32/64; default: the built-in synthetic keys and values",
    )
    d = p.add_argument_group("data")
    d.add_argument(
        "--role",
        choices=("keys", "values"),
        default=None,
        help="what FILE holds; keys get the logit/KL/top-k columns (default: keys)",
    )
    d.add_argument("--array", metavar="NAME", help="the array of a .npz FILE to use (needed when it holds several)")
    d.add_argument(
        "--seed", type=int_at_least(0), default=0, help="seed of the built-in data set and of the random queries"
    )
    c = p.add_argument_group("codecs")
    c.add_argument(
        "--formats",
        default=None,
        help="comma-separated formats, any case (default: every format whose blocks tile the rows)",
    )
    c.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a format option, repeatable, e.g. --option scale=0.0173 (FP8's per-tensor scale); it goes to "
        "the formats that take it, and one that no listed format takes is an error",
    )
    c.add_argument(
        "--codebook", default=None, help="TBQ codebook: lloyd-max (default) or turboq-mtp (= --option codebook=...)"
    )
    c.add_argument(
        "--signs", default=None, help="TBQ sign tables: turboq-mtp (default) or an integer seed (= --option signs=...)"
    )
    c.add_argument(
        "--backend",
        default=None,
        choices=("numba", "numpy"),
        help="codec implementation (default: numba when it is installed, else numpy)",
    )
    c.add_argument(
        "--on-overflow",
        default="raise",
        choices=("raise", "inf", "saturate"),
        help="a block whose float16 scale (or norm, or FP8 value) overflows: stop with an error, "
        "or store an infinite scale as the C reference does (FP8: the non-saturating result); "
        "saturate: FP8 only, the largest finite value (vLLM)",
    )
    m = p.add_argument_group("measurement")
    m.add_argument(
        "--repeat", type=int_at_least(1), default=3, help="timed runs per throughput figure (the best counts)"
    )
    m.add_argument(
        "--queries", type=int_at_least(1), default=16, help="random N(0,1) queries per head for the attention columns"
    )
    m.add_argument(
        "--topk",
        type=int_at_least(1),
        default=None,
        help=f"k of the top-k agreement, at most the number of tokens (default: {DEFAULT_TOPK}, "
        "or the number of tokens if fewer)",
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--wide",
        action="store_true",
        help="the full table (bytes, max abs error, mean cosine; long headers): about 140 columns",
    )
    o.add_argument(
        "--json",
        action="store_true",
        help="print the settings and rows as JSON on stdout (nothing else goes to stdout)",
    )
    o.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also save a figure of the errors (needs matplotlib; missing directories are created)",
    )
    o.add_argument(
        "--quiet", action="store_true", help="no progress messages on stderr (they appear only on a terminal)"
    )


# --------------------------------------------------------------------------- input


def _read_file(path: str, array: str | None) -> tuple[np.ndarray, str | None]:
    """The array of a .npy file, or of one entry of a .npz file, and the entry's name.

    The file is opened here and always closed (NumPy leaves the handle of a corrupt .npz open).
    """
    try:
        fh = open(path, "rb")  # noqa: SIM115 - a failure to open is its own message; `with fh` below closes it
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TbqValueError(f"cannot read {path!r} as a .npy or .npz file: {reason}") from None
    with fh:
        return _read_open_file(fh, path, array)


def _read_open_file(fh: Any, path: str, array: str | None) -> tuple[np.ndarray, str | None]:
    try:
        loaded = np.load(fh, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
        raise TbqValueError(f"cannot read {path!r} as a .npy or .npz file: {reason}") from None
    if isinstance(loaded, np.ndarray):
        if array is not None:
            raise TbqValueError(
                f"--array {array}: {path} is a .npy file with a single array; --array is for .npz files"
            )
        return loaded, None
    with loaded:  # an NpzFile
        names = list(loaded.files)
        if not names:
            raise TbqValueError(f"{path} is a .npz file with no arrays in it")
        if array is None:
            if len(names) > 1:
                raise TbqValueError(
                    f"{path} holds {len(names)} arrays ({', '.join(names)}); pick one with --array NAME"
                )
            array = names[0]
        elif array not in names:
            raise TbqValueError(f"--array {array}: {path} has no such array; it holds {', '.join(names)}")
        try:
            return loaded[array], array
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise TbqValueError(f"cannot read array {array!r} of {path!r}: {' '.join(str(exc).split())}") from None


#: Peak memory of tbq compare per float32 value of its input (benchmarks/bench_compare_memory.py measures 3.0),
#: plus the input itself when it must be converted to float32; rounded up.
BYTES_PER_VALUE = 4 * 4


def _array_header(path: str, array: str | None) -> Any:
    """(shape, dtype) of a .npy file or of one .npz entry, read from its header only; None if it cannot be read."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                names = [n for n in z.namelist() if n.endswith(".npy")]
                member = f"{array}.npy" if array is not None else (names[0] if len(names) == 1 else None)
                if member is None or member not in names:
                    return None
                with z.open(member) as f:
                    return _header_of(f)
        with open(path, "rb") as f:
            return _header_of(f)
    except Exception:
        return None


def _header_of(f: Any) -> Any:
    version = np.lib.format.read_magic(f)
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read is None:
        return None
    shape, _, dtype = read(f)
    return shape, dtype


def _require_memory_for(path: str, array: str | None) -> None:
    """Refuse, before reading it, a file whose comparison cannot fit in the memory available."""
    from ..parallel import require_memory

    head = _array_header(path, array)
    if head is None:
        return
    shape, dtype = head
    n = int(np.prod(shape, dtype=np.float64)) if shape else 1
    if n <= 0:
        return
    need = n * BYTES_PER_VALUE + (n * dtype.itemsize if dtype != np.float32 else 0)
    require_memory(need, f"comparing {path} ({n:,} values of {dtype})")


def _row_tiled() -> list[str]:
    """The formats whose blocks tile the whole row (``FormatInfo.row_tiled``: the fork's TBQ types)."""
    from ..formats import FORMATS

    return [name for name, info in FORMATS.items() if info.row_tiled]


def _load(args: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(data for :func:`compare`, a description for --json, header lines for the table)."""
    from ..synthetic import DEFAULT_OUTLIER_CHANNELS, builtin_kv

    if not args.file:
        for flag, value in (("--role", args.role), ("--array", args.array)):
            if value is not None:
                raise TbqValueError(f"{flag} describes FILE; without a file the built-in keys and values are used")
        data = builtin_kv(seed=args.seed)
        shape = data["keys"].shape
        channels = ", ".join(map(str, DEFAULT_OUTLIER_CHANNELS))
        info = {
            "source": "built-in",
            "seed": args.seed,
            "arrays": ["keys", "values"],
            "shape": list(shape),
            "dtype": "float32",
        }
        header = [
            f"built-in synthetic KV (seed {args.seed}): keys and values of shape {shape} (tokens, heads, head_dim)",
            f"keys: N(0, 1) with outlier channels {channels} (x20); values: N(0, 1)",
        ]
        return data, info, header
    _require_memory_for(args.file, args.array)  # before reading the data: the header says its size
    arr, name = _read_file(args.file, args.array)
    role = args.role or "keys"
    label = args.file if name is None else f"{args.file}[{name}]"
    try:
        arr = check_array(label, arr)  # before any work: dtype, shape, empty
    except MemoryError:
        raise TbqValueError(f"{label}: not enough memory to convert the array to float32") from None
    tokens, heads, head_dim = kv_geometry(arr)
    info = {
        "source": args.file,
        "array": name,
        "role": role,
        "shape": list(arr.shape),
        "tokens": tokens,
        "heads": heads,
        "head_dim": head_dim,
    }
    header = [
        f"{label}: shape {arr.shape}, read as {role} (--role): {tokens} token{'s' if tokens != 1 else ''} "
        f"(axis 0) x {heads} KV head{'s' if heads != 1 else ''} x head_dim {head_dim}",
        f"each token's row of {heads} x {head_dim} = {heads * head_dim} values is quantized in blocks along the row, "
        f"as llama.cpp does (ggml types: blocks within a head; {'/'.join(_row_tiled())}: along the row)",
    ]
    return {role: arr}, info, header


def _legend(rows: list[dict[str, Any]], args: Any, topk: int, wide: bool, width: int = 100) -> list[str]:
    """The lines under the table that say what the columns are, wrapped to fit ``width`` columns."""
    logit, kl, speed = ("logit rmse", "softmax KL", "enc/dec Mv/s") if wide else ("logit", "KL", "enc, dec")
    items = [
        "bits: storage bits per value, scales included. NMSE: |x - x^|^2 / |x|^2; SNR dB: -10 log10 NMSE.",
        f"attention: {args.queries} random N(0,1) queries per head (seed {args.seed}). {logit}: RMS error of the "
        f"logits q.k/sqrt(head_dim); {kl}: mean softmax KL(p || p^) in nats; top-{topk}: share of the exact "
        f"top-{topk} tokens kept. Keys only: values do not enter the logits, so these show - for values.",
        "out NMSE: error of the attention output with only this tensor quantized and the other one exact"
        + (
            "; it needs keys and values of the same shape, so it shows - for a single file."
            if any(r.get("out NMSE") is None for r in rows)
            else "."
        ),
        f"{speed}: million values per second, best of {args.repeat} run{'s' if args.repeat != 1 else ''}.",
    ]
    if not wide:
        items.append("--wide adds bytes, max abs error and mean cosine; --json gives every column to scripts.")
    return [line for item in items for line in textwrap.wrap(item, width - 1, subsequent_indent="  ")]


def _overflow_message(exc: ScaleOverflowError) -> str:
    text = " ".join(str(exc).split())
    text = text.split(" Pass on_overflow=")[0].rstrip(". ")
    return (
        f"{text}. Pass --on-overflow inf to store an infinite scale as the C reference does "
        "(the errors of such rows are then inf or nan)"
    )


# --------------------------------------------------------------------------- run


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def run_cli(args: argparse.Namespace) -> int:
    named = args.formats is not None
    names = [f.strip() for f in args.formats.split(",") if f.strip()] if named else list(cache_formats())
    if not names:
        raise TbqValueError(f"--formats: no format given; choose from {', '.join(formats())}")
    try:
        fmts = list(dict.fromkeys(format_name(f) for f in names))  # the naming rule: any case
    except TbqValueError as exc:
        raise TbqValueError(f"--formats: {exc}") from None
    options = dict(parse_option(o) for o in args.option)
    for flag in ("codebook", "signs"):  # the older spellings of --option codebook=... / signs=...
        if getattr(args, flag) is not None:
            options[flag] = parse_option(f"{flag}={getattr(args, flag)}")[1]
    try:
        check_options(fmts, options)
    except TbqValueError as exc:
        raise TbqValueError(f"--option: {exc}") from None
    config = {**options, "backend": args.backend, "on_overflow": args.on_overflow}
    # The first run in a fresh environment compiles the numba kernels: say so at once (before building the
    # codecs or reading the data), on stderr whether or not it is a terminal, as one whole line.
    numba_fmts = fmts if args.backend != "numpy" else []
    attention = not args.file  # the built-in data holds keys and values: out NMSE runs the fused attention kernel
    cores = _cores()
    cold = bool(numba_fmts) and kernels_cached(numba_fmts, attention) is False
    if cold and not args.quiet:
        print(
            f"tbq compare: compiling numba kernels on {cores} core{'s' if cores != 1 else ''} (first run only)...",
            file=sys.stderr,
            flush=True,
        )
    # the helper processes start compiling now, while this one builds the codecs and the data
    pending = start_warm_up(numba_fmts, config, attention=attention, processes=cores) if cold else None
    try:
        return _run_compare(args, fmts, named, options, config, pending)
    except BaseException:
        if pending is not None:
            pending.cancel()
        raise


def _run_compare(args: Any, fmts: Any, named: bool, options: Any, config: Any, pending: WarmUp | None) -> int:
    """The rest of ``tbq compare`` once the kernels compile (``pending``: the cold start's helpers, None when the
    cache is warm)."""
    from ..codecs import get_codec
    from ..progress import Progress, slow_notice

    signs = options.get("signs", "turboq-mtp")
    codecs = {}
    for fmt in fmts:  # every configuration error before any work
        cfg = config_for(fmt, config)
        try:
            codecs[fmt] = get_codec(fmt, **cfg)
        except TbqValueError as exc:
            msg = " ".join(str(exc).split())
            flag = next(
                (
                    f"--{k}: " if k in ("codebook", "signs") else f"--option {k}: "
                    for k in options
                    if k.rstrip("s") in msg
                ),
                "",
            )
            raise TbqValueError(flag + msg) from None
    if args.plot:
        check_figure_file(args.plot, "--plot")

    data, info, header = _load(args)
    for x in data.values():  # which formats can tile the rows: refuse a named one, leave out a default one
        _, heads, head_dim = kv_geometry(x)
        bad = untileable(fmts, heads, head_dim, options)  # each format with its own options (vLLM's head_dim)
        if bad and named:
            raise TbqValueError(
                f"--formats: {tiling_message(bad, heads, head_dim, options)}; leave them out of --formats"
            )
        if bad:
            header.append(f"left out: {tiling_message(bad, heads, head_dim, options)}")
            info["skipped"] = bad
            fmts = [f for f in fmts if f not in bad]
            codecs = {f: c for f, c in codecs.items() if f not in bad}
    if not fmts:
        raise TbqValueError("no format can tile these rows; see docs/formats.md (how a KV cache row is tiled)")
    tokens = min(tokens_of(x) for x in data.values())
    if args.topk is not None and args.topk > tokens:
        raise TbqValueError(
            f"--topk {args.topk} is more than the {tokens} tokens of the data; top-k agreement needs k <= tokens"
        )
    topk = args.topk if args.topk is not None else min(DEFAULT_TOPK, tokens)

    show = False if args.quiet else None  # None: only when stderr is a terminal
    out = sys.stderr if args.json else sys.stdout
    if not args.json:
        print("\n".join(w for line in header for w in textwrap.wrap(line, 99, subsequent_indent="  ")), flush=True)
    # cold: this process's share, while the helpers (started in run_cli) fill numba's on-disk cache with theirs
    numba_fmts = [f for f, c in codecs.items() if c.backend == "numba"]
    attention = "keys" in data and "values" in data
    # cached (or a stale cache numba recompiles): a notice only if it takes long, on a terminal
    notice = slow_notice(
        "compiling numba kernels (first run only)...", after=1.0, enabled=False if pending is not None else show
    )
    with notice:
        if pending is not None:
            pending.finish(numba_fmts)
        else:
            warm_up(numba_fmts, config, attention=attention, processes=1)
    with Progress(len(data) * len(fmts), "tbq compare", enabled=show) as bar:
        try:
            rows = compare(
                data,
                fmts,
                repeat=args.repeat,
                n_queries=args.queries,
                topk=topk,
                query_seed=args.seed,
                on_row=lambda r: bar.step(f"{r['data']} {r['format']}"),
                **config,
            )
        except ScaleOverflowError as exc:
            raise TbqValueError(_overflow_message(exc)) from None
        except MemoryError:
            raise TbqValueError(
                f"not enough memory for this data with {args.queries} queries per head; "
                "try fewer --queries or a smaller file"
            ) from None

    if args.json:
        settings = {
            "formats": fmts,
            "codebook": options.get("codebook", "lloyd-max"),
            "signs": signs,
            "options": options,
            "backend": getattr(next(iter(codecs.values())), "backend", args.backend),
            "on_overflow": args.on_overflow,
            "repeat": args.repeat,
            "queries": args.queries,
            "topk": topk,
            "query_seed": args.seed,
        }
        print(json.dumps({"input": info, "settings": settings, "rows": to_records(rows)}, indent=2))
    else:
        print(format_table(rows, wide=args.wide, topk=topk))
        print("\n".join(_legend(rows, args, topk, args.wide)))
    if args.plot:
        from ..plots import plot_compare

        title = header[0].split(":")[0]
        path = plot_compare(rows, args.plot, title=title)
        print(f"figure saved to {path}", file=out)
    return 0
