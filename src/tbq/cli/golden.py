"""``tbq golden``: arguments and printing; the work is :mod:`tbq.golden`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import __version__
from ..errors import ConfigError, TbqValueError
from ..formats import formats
from ..golden import (
    DEFAULT_ATTENTION_PAIRS,
    DEFAULT_BLOCKS,
    DEFAULT_K,
    DEFAULT_SEED,
    FAMILIES,
    TBQ_ULP_FLOOR,
    Summary,
    _load_manifest,
    _Progress,
    generate,
    regenerate,
    write_set,
)


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def _spec_from_cli(value: str, what: str):
    """A CLI table spec: a name, an integer (signs), or a JSON file."""
    if value.isdigit():
        if what == "signs":
            return int(value)
        raise ConfigError(f"--codebook takes a name or a JSON file, got {value!r}")
    p = Path(value)
    if value.endswith(".json") or p.exists():
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read --{what} file {value}: {exc}") from None
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``tbq golden``."""
    parser.add_argument("--out", required=True, help="output directory (created if needed)")
    parser.add_argument("--formats", default=",".join(formats()), help="comma-separated formats (default: all: %(default)s)")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated input families (default: %(default)s)")
    parser.add_argument("--blocks", type=int, default=DEFAULT_BLOCKS, metavar="N",
                        help="rows of 128 values per family (a Q8_0/Q4_0 row is 4 blocks; default %(default)s = one row per edge kind)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, metavar="S", help="base seed; family i uses S*1000+1+i (default %(default)s)")
    parser.add_argument("--codebook", default="lloyd-max", help="TBQ codebook: lloyd-max, turboq-mtp, or a JSON file with exact tables")
    parser.add_argument("--signs", default="turboq-mtp", help="TBQ sign vectors: turboq-mtp, an integer seed, or a JSON file {signs1, signs2}")
    parser.add_argument("-k", "--fragile-ulps", type=int, default=DEFAULT_K, metavar="K", help="fragility margin in float32 ulps (default %(default)s)")
    parser.add_argument("--ulp-floor", type=float, default=None, metavar="F",
                        help=f"TBQ rotated coordinates below F count ulps at F (default {TBQ_ULP_FLOOR}; 0 = literal ulps)")
    parser.add_argument("--attention", action="store_true", help="also write attention_<k>_<v> reference sets")
    parser.add_argument("--attention-pairs", default=",".join(f"{a}:{b}" for a, b in DEFAULT_ATTENTION_PAIRS),
                        metavar="K:V,...", help="K:V format pairs for --attention (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=32, help="attention: tokens per cache (default %(default)s)")
    parser.add_argument("--heads", type=int, default=8, help="attention: query heads (default %(default)s)")
    parser.add_argument("--kv-heads", type=int, default=2, help="attention: KV heads; heads must be a multiple (default %(default)s)")
    parser.add_argument("--n-sink", type=int, default=0, help="attention: first tokens kept in --sink-format (default %(default)s)")
    parser.add_argument("--sink-format", default="f16", choices=("f16", "q8_0"), help="attention: format of the sink tokens")
    parser.add_argument("--from-manifest", nargs="+", metavar="JSON", help="regenerate these sets bit for bit (other generation flags are ignored)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no table")


def run_cli(args) -> int:
    """Run ``tbq golden`` with parsed ``args``; prints the summary table. Returns 0."""
    progress = not args.quiet
    if args.from_manifest:
        bar = _Progress(len(args.from_manifest), progress)
        rows, att, paths = [], [], []
        for mp in args.from_manifest:
            gs = regenerate(mp)
            original = _load_manifest(mp)["arrays"]
            if {k: v["sha256"] for k, v in original.items()} != {k: v["sha256"] for k, v in gs.manifest["arrays"].items()}:
                raise TbqValueError(f"{mp}: the regenerated arrays differ from the manifest's SHA-256 (library version {__version__})")
            paths += write_set(gs, args.out)
            (att if gs.manifest["kind"] == "tbq-golden-attention" else rows).extend(gs.summary)
            bar.step(gs.name)
        summary = Summary(rows, att, paths)
    else:
        summary = generate(
            args.out,
            formats=args.formats,
            families=args.families,
            blocks=args.blocks,
            seed=args.seed,
            codebook=_spec_from_cli(args.codebook, "codebook"),
            signs=_spec_from_cli(args.signs, "signs"),
            k=args.fragile_ulps,
            ulp_floor=args.ulp_floor,
            attention=args.attention,
            attention_pairs=args.attention_pairs,
            tokens=args.tokens,
            n_head=args.heads,
            n_head_kv=args.kv_heads,
            n_sink=args.n_sink,
            sink_format=args.sink_format,
            progress=progress,
        )
    if not args.quiet:
        print(summary.table())
        print(f"\nwrote {len(summary.paths)} files to {args.out}")
    return 0
