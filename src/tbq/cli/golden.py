"""``tbq golden``: arguments, progress and printing; the work is :mod:`tbq.golden`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import TbqValueError
from ..formats import parse_option
from ..golden import (
    DEFAULT_ATTENTION_PAIRS,
    DEFAULT_K,
    DEFAULT_ROWS_PER_FAMILY,
    DEFAULT_SEED,
    FAMILIES,
    ROW_SIZE,
    TBQ_ULP_FLOOR,
    GoldenSettings,
    Summary,
    check_out_dir,
    generate,
    golden_formats,
    load_manifest,
    manifest_memory,
    regenerate,
    write_set,
)
from ..parallel import require_memory
from ..progress import Progress
from . import table_spec

PROGRESS_LABEL = "tbq golden"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``tbq golden`` (every help text states its default)."""
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="output directory, created if needed (required; no default)"
    )
    parser.add_argument(
        "--formats",
        default=",".join(golden_formats()),
        help=f"comma-separated formats, any case (default: every format whose block fits a {ROW_SIZE}-value row: "
        f"{', '.join(golden_formats())})",
    )
    parser.add_argument(
        "--families",
        default=",".join(FAMILIES),
        help=f"comma-separated input families (default: {', '.join(FAMILIES)})",
    )
    parser.add_argument(
        "--rows-per-family",
        "--blocks",
        dest="rows_per_family",
        type=int,
        default=DEFAULT_ROWS_PER_FAMILY,
        metavar="N",
        help="rows of 128 values per family; a Q8_0/Q4_0 row is 4 blocks, a TBQ row 1 block "
        "(--blocks is the old name; default: %(default)s = one row per edge kind)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        metavar="S",
        help="base seed; family i uses S*1000+1+i (default: %(default)s)",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a format option, repeatable, e.g. --option scale=0.0173 (FP8's per-tensor scale; default: none, each format's defaults), for the formats "
        "that take it (recorded in the manifests)",
    )
    parser.add_argument(
        "--codebook",
        default="lloyd-max",
        help="TBQ codebook: lloyd-max, turboq-mtp, or a JSON file with exact tables (default: %(default)s)",
    )
    parser.add_argument(
        "--signs",
        default="turboq-mtp",
        help="TBQ sign vectors: turboq-mtp, an integer seed, or a JSON file {signs1, signs2} (default: %(default)s)",
    )
    parser.add_argument(
        "-k",
        "--fragile-ulps",
        type=int,
        default=DEFAULT_K,
        metavar="K",
        help="fragility margin in float32 ulps, >= 0 (default: %(default)s)",
    )
    parser.add_argument(
        "--ulp-floor",
        type=float,
        default=None,
        metavar="F",
        help=f"TBQ rotated coordinates below F count ulps at F; 0 = literal ulps (default: {TBQ_ULP_FLOOR} = 2^-4)",
    )
    parser.add_argument(
        "--attention", action="store_true", help="also write attention_<k>_<v> reference sets (default: off)"
    )
    parser.add_argument(
        "--attention-pairs",
        default=",".join(f"{a}:{b}" for a, b in DEFAULT_ATTENTION_PAIRS),
        metavar="K:V,...",
        help=f"K:V format pairs for --attention (default: {', '.join(f'{a}:{b}' for a, b in DEFAULT_ATTENTION_PAIRS)})",
    )
    for flag, setting, metavar, text in (  # the attention set's shape: each default is GoldenSettings's
        ("--tokens", "tokens", "T", "attention: tokens per cache, >= 1"),
        ("--heads", "n_head", "H", "attention: query heads"),
        ("--kv-heads", "n_head_kv", "H", "attention: KV heads; --heads must be a multiple"),
        ("--n-sink", "n_sink", "T", "attention: first tokens kept in --sink-format, at most --tokens"),
    ):
        parser.add_argument(
            flag,
            type=int,
            default=getattr(GoldenSettings, setting),
            metavar=metavar,
            help=f"{text} (default: %(default)s)",
        )
    parser.add_argument(
        "--sink-format",
        default=GoldenSettings.sink_format,
        choices=("f16", "q8_0"),
        help="attention: format of the sink tokens (default: %(default)s)",
    )
    parser.add_argument(
        "--from-manifest",
        nargs="+",
        metavar="JSON",
        help="regenerate these sets bit for bit; the other generation flags are ignored (default: none, generate)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress and no table (default: off; progress only on a terminal)"
    )


def _from_manifests(args: argparse.Namespace, enabled: bool | None) -> Summary:
    """Regenerate every ``--from-manifest`` set, refusing any whose arrays do not reproduce."""
    check_out_dir(args.out)
    wanted = []
    for mp in args.from_manifest:  # read every manifest before any work
        arrays = load_manifest(mp).get("arrays")
        if not isinstance(arrays, dict) or not all(isinstance(v, dict) and "sha256" in v for v in arrays.values()):
            raise TbqValueError(f"{mp}: not a tbq golden manifest (no SHA-256 per array)")
        wanted.append({k: v["sha256"] for k, v in arrays.items()})
        require_memory(manifest_memory(mp), f"--from-manifest {mp}")
    rows: list[dict[str, Any]] = []
    att: list[dict[str, Any]] = []
    paths: list[Path] = []
    with Progress(len(wanted), PROGRESS_LABEL, enabled=enabled) as bar:
        for mp, want in zip(args.from_manifest, wanted, strict=True):
            gs = regenerate(mp)
            if want != {k: v["sha256"] for k, v in gs.manifest["arrays"].items()}:
                raise TbqValueError(
                    f"{mp}: the regenerated arrays differ from the manifest's SHA-256 (library version {__version__})"
                )
            paths += write_set(gs, args.out)
            (att if gs.manifest["kind"] == "tbq-golden-attention" else rows).extend(gs.summary)
            bar.step(gs.name)
    return Summary(rows, att, paths)


def _generate(args: argparse.Namespace, enabled: bool | None) -> Summary:
    with Progress(0, PROGRESS_LABEL, enabled=enabled) as bar:

        def report(label: str, done: int, total: int) -> None:
            bar.total = total
            bar.step(label)

        return generate(
            args.out,
            formats=args.formats,
            families=args.families,
            rows_per_family=args.rows_per_family,
            seed=args.seed,
            codebook=table_spec(args.codebook, "codebook"),
            signs=table_spec(args.signs, "signs"),
            options=dict(parse_option(o) for o in args.option),
            k=args.fragile_ulps,
            ulp_floor=args.ulp_floor,
            attention=args.attention,
            attention_pairs=args.attention_pairs,
            tokens=args.tokens,
            n_head=args.heads,
            n_head_kv=args.kv_heads,
            n_sink=args.n_sink,
            sink_format=args.sink_format,
            progress=report,
        )


def run_cli(args: argparse.Namespace) -> int:
    """Run ``tbq golden`` with parsed ``args``; prints the summary table. Returns 0.

    Bad arguments (and an ``--out`` that cannot be written) raise a
    :class:`~tbq.errors.TbqError` before any work; the dispatcher prints it
    as one line and exits 2.
    """
    enabled = False if args.quiet else None  # None: progress only when stderr is a terminal
    summary = _from_manifests(args, enabled) if args.from_manifest else _generate(args, enabled)
    if not args.quiet:
        print(summary.table())
        print(f"\nwrote {len(summary.paths)} files to {args.out}")
    return 0
