"""``tbq check``: arguments and printing; the work is :mod:`tbq.check`.

Exit status: 0 when nothing is wrong, 1 when a block is wrong (or fragile
with ``--exact``, or the target wrote outside its buffers), 2 for a usage or
loading error (a library that does not load, a missing symbol, an ``--exec``
command that fails; one line on stderr, from the dispatcher).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..check import (
    DEFAULT_BLOCKS,
    DEFAULT_EXAMPLES,
    DEFAULT_K,
    CheckSettings,
    LibraryTarget,
    ProgramTarget,
    check_target,
    resolve_format,
)
from ..check.attention import (
    DEFAULT_FAMILIES,
    PRECISIONS,
    Q_TYPES,
    Arithmetic,
    AttentionSettings,
    ProgramAttention,
    check_attention,
)
from ..check.dot import LibraryDot, check_dot, check_dot_accept, right_format
from ..check.ggml_graph import GgmlAttention
from ..check.runner import check_accept, check_memory, require_hypothesis
from ..check.targets import PLACEHOLDERS
from ..errors import ConfigError, TbqValueError
from ..formats import Format, format_class, format_name, formats, parse_option
from ..golden import check_out_dir
from ..parallel import require_memory
from . import check_output_file, int_at_least, table_spec

#: The longest --timeout / --seconds taken: a year.
MAX_SECONDS = 365 * 24 * 3600.0


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not v > 0 or v != v:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    if v > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SECONDS:g} seconds (a year), got {text}")
    return v


def _format_arg(text: str) -> str:
    """``--format``: a format name, any case (the naming rule of docs/formats.md)."""
    try:
        return format_name(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"unknown format {text!r}; choose from {', '.join(formats())}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``tbq check``."""
    t = p.add_argument_group("the kernel under test (one of --lib and --exec)")
    t.add_argument("--lib", metavar="PATH", help="shared library with ggml's row functions (loaded with ctypes)")
    t.add_argument("--quantize", metavar="SYMBOL", help="--lib: the encoder's symbol (default: quantize_row_<fmt>_ref)")
    t.add_argument("--dequantize", metavar="SYMBOL", help="--lib: the decoder's symbol (default: dequantize_row_<fmt>)")
    t.add_argument(
        "--exec",
        dest="exec_cmd",
        metavar="CMD",
        help='external program reading {in} and writing {out}, e.g. "./kernel {op} {in} {out}"; placeholders: '
        + ", ".join("{" + k + "}" for k in PLACEHOLDERS),
    )
    t.add_argument(
        "--init",
        action="append",
        default=[],
        metavar="SYMBOL",
        help="--lib: a void f(void) function called once after loading, repeatable (ggml's CPU backend: ggml_cpu_init)",
    )
    t.add_argument(
        "--strict-lib",
        action="store_true",
        help="--lib: refuse a symbol that the library's dependencies define rather than the library itself",
    )
    t.add_argument(
        "--dot",
        metavar="SYMBOL",
        help="--lib: check a dot-product kernel with ggml's vec_dot signature instead of row functions, e.g. "
        "ggml_vec_dot_q4_0_q8_0 (its left operand in --format, the right in --rhs)",
    )
    pairs = ", ".join(
        f"{n} x {format_class(n).checker.vec_dot_type}" for n in formats() if format_class(n).checker.vec_dot_type
    )
    t.add_argument(
        "--rhs",
        type=_format_arg,
        metavar="FMT",
        help=f"--dot: the right operand's format (default: the one ggml pairs --format with; checked pairs: {pairs})",
    )
    t.add_argument("--only", choices=("quantize", "dequantize"), help="check one direction (default: both)")
    t.add_argument(
        "--timeout", type=_positive_float, default=600.0, metavar="S", help="--exec: seconds one run may take"
    )
    f = p.add_argument_group("format")
    f.add_argument(
        "--format",
        type=_format_arg,
        metavar="FMT",
        help=f"the block format the kernel implements (required, except with --attention): {', '.join(formats())}",
    )
    f.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a format option, repeatable, e.g. --option scale=0.0173 (FP8's per-tensor scale)",
    )
    f.add_argument(
        "--codebook",
        help="formats with a codebook option (TBQ): lloyd-max, turboq-mtp or a JSON file of exact "
        "tables (default: the format's default)",
    )
    f.add_argument(
        "--signs",
        help="formats with a signs option (TBQ): turboq-mtp, an integer seed or a JSON file "
        "{signs1, signs2} (default: the format's default)",
    )
    r = p.add_argument_group("what runs")
    r.add_argument(
        "--blocks",
        type=int_at_least(0),
        default=DEFAULT_BLOCKS,
        metavar="N",
        help="blocks of the golden phase and of the decoders' random-bytes phase; 0 skips both",
    )
    fz = r.add_mutually_exclusive_group()
    fz.add_argument(
        "--examples",
        type=int_at_least(0),
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help="hypothesis examples per direction (each a batch of rows); 0 skips the fuzz phase",
    )
    fz.add_argument(
        "--seconds", type=_positive_float, metavar="T", help="fuzz for T seconds per direction instead of --examples"
    )
    r.add_argument(
        "--seed", type=int_at_least(0), default=0, metavar="S", help="seed of the golden families and of the fuzz"
    )
    c = p.add_argument_group("classification")
    c.add_argument(
        "--exact",
        action="store_true",
        help="refuse fragile, tie-rule and undefined differences too (default: accepted)",
    )
    c.add_argument(
        "--accept",
        action="append",
        default=[],
        metavar="CLASS_OR_DIAGNOSIS",
        help="waive a known deviation and go on to the next distinct one, repeatable: a class (fragile, tie_rule, "
        "undefined) or a diagnosis name (e.g. nibble_order, signed_zero, scale_ulp; with --dot: fragile or "
        "unsigned_codes)",
    )
    c.add_argument(
        "-k",
        "--fragile-ulps",
        type=int_at_least(0),
        default=DEFAULT_K,
        metavar="K",
        help="fragility margin in float32 ulps",
    )
    a = p.add_argument_group("attention kernels (--attention; docs/checking-kernels.md, section 4)")
    a.add_argument(
        "--attention",
        action="store_true",
        help="check a fused attention kernel over quantized caches: --lib a ggml build's libggml-cpu.so "
        "(ggml_flash_attn_ext) or --exec a program with {q} {k} {v} {out} (and {mask}, {sinks}, {meta}, {n_head}, ...; "
        "docs/checking-kernels.md)",
    )
    a.add_argument("--k-type", type=_format_arg, metavar="FMT", help="--attention: the K cache's format")
    a.add_argument("--v-type", type=_format_arg, metavar="FMT", help="--attention: the V cache's format")
    a.add_argument("--head-dim", type=int_at_least(1), default=128, metavar="D", help="--attention: values per head")
    a.add_argument(
        "--contexts",
        type=_int_list,
        metavar="T,T,...",
        help="--attention: cache lengths of the decode family (default 1,2,5,16,33,100,512,4096,32768)",
    )
    a.add_argument(
        "--prefill",
        type=_int_list,
        metavar="N,N,...",
        help="--attention: query tokens of the prefill calls (default 7,64,256)",
    )
    a.add_argument("--ratios", type=_int_list, metavar="R,R,...", help="--attention: GQA ratios (default 1,4,8)")
    a.add_argument(
        "--families",
        type=lambda t: tuple(x for x in t.split(",") if x),
        metavar="F,F,...",
        help="--attention: which families run (default " + ",".join(DEFAULT_FAMILIES) + "; also: overflow, value "
        "caches beyond an f16 accumulator's range)",
    )
    a.add_argument(
        "--queries", type=int_at_least(1), default=2, metavar="N", help="--attention: decode steps per cache"
    )
    a.add_argument(
        "--q-type",
        choices=Q_TYPES,
        help="--attention: the query's conversion before the scores (default: the target's; ggml: the K type's "
        "vec_dot_type, float32 where head_dim is not a multiple of its block)",
    )
    a.add_argument(
        "--softmax", choices=PRECISIONS[:2], default="float32", help="--attention: the precision of the weights"
    )
    a.add_argument(
        "--v-acc",
        choices=PRECISIONS[:2],
        help="--attention: the accumulator of the weighted values (default: the target's; ggml: float16 for an f16 V)",
    )
    a.add_argument("--threads", type=int_at_least(1), default=2, metavar="N", help="--attention --lib: ggml threads")
    a.add_argument(
        "--bare",
        action="store_true",
        help="--attention --lib: do not rotate the query and the output around the kernel for formats decoded in a "
        "rotated domain (turbo types): check the bare kernel",
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--json",
        metavar="FILE",
        help="also write the report as JSON to FILE ('-': stdout, and the table goes to stderr)",
    )
    o.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="directory for the counterexamples (.npz and a C repro), written only when something fails "
        "(default: tbq-check-<fmt> in the working directory, made only then)",
    )
    o.add_argument("--quiet", action="store_true", help="print the verdict line only, no progress")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        v = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return v


def _target(args: argparse.Namespace, fmt: Any) -> Any:
    if (args.lib is None) == (args.exec_cmd is None):
        raise TbqValueError(
            "give the kernel under test: --lib PATH (a shared library) or --exec CMD (a program), one of them"
        )
    if args.exec_cmd is not None:
        for flag in ("quantize", "dequantize"):
            if getattr(args, flag) is not None:
                raise TbqValueError(f"--{flag} names a library symbol; with --exec use --only to pick a direction")
        if args.init or args.strict_lib:
            raise TbqValueError(f"--{'init' if args.init else 'strict-lib'} applies to --lib, not to --exec")
        return ProgramTarget(args.exec_cmd, fmt, only=args.only, timeout=args.timeout)
    return LibraryTarget(
        args.lib,
        fmt,
        quantize=args.quantize,
        dequantize=args.dequantize,
        only=args.only,
        init=args.init,
        strict_lib=args.strict_lib,
    )


def run_cli(args: argparse.Namespace) -> int:
    """Run ``tbq check``; prints the report. Returns 0 (nothing wrong) or 1 (something wrong)."""
    if args.attention:
        return _run_attention(args)
    for flag in ("k_type", "v_type", "contexts", "prefill", "ratios", "families", "q_type", "v_acc"):
        if getattr(args, flag) is not None:
            raise TbqValueError(f"--{flag.replace('_', '-')} goes with --attention")
    if args.format is None:
        raise TbqValueError("give --format FMT (the block format the kernel implements), or --attention")
    options = dict(parse_option(o) for o in args.option)
    fmt = resolve_format(args.format, table_spec(args.codebook, "codebook"), table_spec(args.signs, "signs"), options)
    json_path = None if args.json in (None, "-") else check_output_file(args.json, "--json")
    # --out is checked before any work; the default folder is only made when something fails
    out_dir = check_out_dir(args.out) if args.out else Path(f"tbq-check-{fmt.name}")
    if args.dot or args.rhs:
        check_dot_accept(args.accept)  # before any work, as for row functions
    else:
        check_accept(args.accept)
    if not args.blocks and not args.examples and not args.seconds:
        raise TbqValueError(
            "--blocks 0 with --examples 0 checks nothing; give --blocks N or --examples N (or --seconds T)"
        )
    if args.examples or args.seconds:
        require_hypothesis()  # before loading anything: say so at once
    require_memory(check_memory(fmt, args.blocks), f"--blocks {args.blocks:,} ({fmt.name})")  # before any work
    if args.dot or args.rhs:
        return _run_dot(args, fmt, out_dir, json_path)
    target = _target(args, fmt)
    settings = CheckSettings(
        blocks=args.blocks,
        examples=args.examples if not args.seconds else 0,
        seconds=args.seconds,
        exact=args.exact,
        k=args.fragile_ulps,
        seed=args.seed,
        out=out_dir,
        accept=args.accept,
        progress=False if args.quiet else None,
    )
    report = check_target(target, settings)
    return _emit(args, report, json_path)


def _emit(args: argparse.Namespace, report: Any, json_path: Path | None) -> int:
    """Print the report (the verdict alone with ``--quiet``; on stderr when the JSON goes to stdout), write
    ``--json``; the exit status: 0 nothing wrong, 1 something wrong."""
    text_stream = sys.stderr if args.json == "-" else sys.stdout
    print(report.verdict() if args.quiet else report.text(), file=text_stream)
    if args.json == "-":
        print(report.to_json())
    elif json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(report.to_json() + "\n")
    return 0 if report.ok else 1


def _run_dot(args: argparse.Namespace, fmt: Format, out_dir: Path, json_path: Path | None) -> int:
    """``tbq check --dot SYMBOL``: a dot-product kernel of a library."""
    if not args.dot or args.lib is None:
        raise TbqValueError("--dot SYMBOL checks a dot-product kernel of --lib PATH (--rhs only goes with --dot)")
    for flag in ("quantize", "dequantize", "only", "exec_cmd"):
        if getattr(args, flag) is not None:
            raise TbqValueError(
                f"--{flag.replace('_cmd', '')} is for row functions; --dot checks a dot-product kernel alone"
            )
    if args.seconds:
        raise TbqValueError("--seconds is for row functions; a dot-product check's fuzz phase takes --examples N")
    target = LibraryDot(
        args.lib, args.dot, fmt, right_format(fmt, args.rhs), init=args.init, strict_lib=args.strict_lib
    )
    report = check_dot(
        target,
        blocks=max(1, args.blocks),
        examples=args.examples,
        exact=args.exact,
        seed=args.seed,
        out=out_dir,
        accept=args.accept,
    )
    return _emit(args, report, json_path)


def _options_for(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options among ``options`` that format ``name`` takes (--codebook/--signs/--option name both caches)."""
    return {k: v for k, v in options.items() if k in format_class(name).option_defaults()}


def _run_attention(args: argparse.Namespace) -> int:
    """``tbq check --attention``: a fused attention kernel (docs/checking-kernels.md, section 4)."""
    if args.k_type is None or args.v_type is None:
        raise TbqValueError("--attention needs --k-type FMT and --v-type FMT (the formats of the K and V caches)")
    for flag in ("format", "quantize", "dequantize", "only", "dot", "rhs", "seconds"):
        if getattr(args, flag) is not None:
            raise TbqValueError(f"--{flag} is for row and dot-product kernels, not --attention")
    for flag in ("exact", "strict_lib", "accept", "init"):
        if getattr(args, flag):
            raise TbqValueError(
                f"--{flag.replace('_', '-')} is for row and dot-product kernels, not --attention (a ggml build's "
                "ggml_cpu_init is called by the check itself)"
            )
    if (args.lib is None) == (args.exec_cmd is None):
        raise TbqValueError("give the kernel under test: --lib PATH (a ggml build's libggml-cpu.so) or --exec CMD")
    options = dict(parse_option(o) for o in args.option)
    for key, spec in (("codebook", args.codebook), ("signs", args.signs)):
        table = table_spec(spec, key)
        if table is not None:
            options[key] = table
    k_opts, v_opts = _options_for(args.k_type, options), _options_for(args.v_type, options)
    unused = set(options) - set(k_opts) - set(v_opts)
    if unused:
        raise TbqValueError(f"neither {args.k_type} nor {args.v_type} takes the option {sorted(unused)[0]}")
    extra: dict[str, Any] = {
        k: getattr(args, k) for k in ("contexts", "prefill", "ratios", "families") if getattr(args, k) is not None
    }
    settings = AttentionSettings(
        args.k_type,
        args.v_type,
        head_dim=args.head_dim,
        k_options=k_opts,
        v_options=v_opts,
        queries=args.queries,
        seed=args.seed,
        arithmetic=Arithmetic(args.q_type, args.softmax, args.v_acc),
        **extra,
    )
    json_path = None if args.json in (None, "-") else check_output_file(args.json, "--json")
    out_dir = check_out_dir(args.out) if args.out else Path(f"tbq-check-attention-{args.k_type}-{args.v_type}")
    target: Any
    if args.exec_cmd is not None:
        target = ProgramAttention(args.exec_cmd, timeout=args.timeout)
    else:
        target = GgmlAttention(args.lib, threads=args.threads, rotate=not args.bare)
    report = check_attention(target, settings, out=out_dir)
    return _emit(args, report, json_path)
