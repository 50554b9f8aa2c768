"""How long `tbq check --attention` takes against a C kernel: 1,000 decode steps at a 4K context and a prefill of
512 query tokens, judged against ggml's CPU flash attention (the target: under 30 s on two cores).

    PYTHONPATH=src python benchmarks/bench_check_attention.py [--ggml ../shared/ggml/upstream] [--type q4_0]
        [--steps 1000] [--context 4096] [--caches 8] [--prefill 512] [--threads 2]

The decode steps are ``--steps`` queries (8 query heads, 2 KV heads, head_dim 128) spread over ``--caches``
caches of ``--context`` tokens (a decode step of a model reads one cache with a new query; the target runs the
steps over one cache in one graph call); the prefill family adds two causal calls of ``--prefill`` query tokens
(over ``--prefill`` and ``--prefill + 37`` tokens). Uses the build's ``lib-avx512/`` where the CPU has its flags
and the build runs here, else ``lib/``, and says which. Prints the wall time of the whole check and of its parts:
making and encoding the cases (timed on their own, before the check), the kernel's calls, and the rest (the
float64 reference, the derived bound, the verdicts). Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tbq.check import AttentionSettings, GgmlAttention, TargetError, check_attention  # noqa: E402
from tbq.check.attention import make_cases  # noqa: E402

AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512_vnni", "avx512_bf16")


class Timed(GgmlAttention):
    """The ggml target, adding up the seconds its kernel calls take."""

    seconds = 0.0
    calls = 0

    def run_many(self, cases, s):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = super().run_many(cases, s)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


def _flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ggml", default=str(ROOT.parent / "shared" / "ggml" / "upstream"))
    ap.add_argument("--type", default="q4_0", help="the K and V caches' format")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--caches", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.steps % args.caches:
        ap.error("--steps must be a multiple of --caches")
    folders = (["lib-avx512"] if all(f in _flags() for f in AVX512_FLAGS) else []) + ["lib"]
    s = AttentionSettings(
        args.type,
        args.type,
        head_dim=128,
        contexts=(args.context,) * args.caches,
        queries=args.steps // args.caches,
        prefill=(args.prefill,),
        families=("decode", "prefill"),
    )
    for folder in folders:
        lib = Path(args.ggml) / folder / "libggml-cpu.so.0"
        if not lib.is_file():
            continue
        target = Timed(lib, threads=args.threads)
        try:
            target.check_settings(s)
        except TargetError as exc:
            print(f"{folder}: cannot run here ({exc}); trying the next build", file=sys.stderr)
            continue
        t0 = time.perf_counter()
        cases = make_cases(s)
        t_cases = time.perf_counter() - t0
        del cases
        t0 = time.perf_counter()
        report = check_attention(target, s)
        wall = time.perf_counter() - t0
        c = report.counts()
        print(
            f"{lib} ({os.cpu_count()} CPUs visible, {args.threads} threads): {args.steps} decode steps at "
            f"{args.context} tokens over {args.caches} caches + 2 prefill calls of {args.prefill} query tokens, "
            f"{args.type} K and V"
        )
        print(
            f"  check {wall:.2f} s: making and encoding the cases {t_cases:.2f} s (timed apart), kernel "
            f"{target.seconds:.2f} s in {target.calls} batches, reference + bound + verdicts "
            f"{wall - t_cases - target.seconds:.2f} s"
        )
        print(f"  {report.verdict()}  ({c['blocks']:,} output rows)")
        return 0 if report.ok else 1
    print(f"no ggml build under {args.ggml} runs here", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
