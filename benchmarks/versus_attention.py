"""Is the fused attention kernel slower than at another commit? One decode step of two trees, side by side.

    python benchmarks/versus_attention.py --ref HEAD                       # f16, bf16, q8_0, tbq4_0; 1 and 2 threads
    python benchmarks/versus_attention.py --ref HEAD~3 --formats q4_0 --tokens 8K --rounds 9

The attention twin of ``bench_versus.py``: the source of ``--ref`` (``git
archive``) and this checkout's ``src/`` are timed in alternating rounds, one
child process per tree per round, each child on the same data (a uniform
[-1.7, 1.7] cache of ``--tokens`` x 8 KV heads x 128, K and V in the format, 32
query heads: ``bench_attention.py``'s decode step) and the best of ``--repeat``
calls of ``tbq.attention.attention_fused`` per format and thread count after a
first, untimed call (numba compilation and the first reader call are not
timed). The table gives each tree's median milliseconds and the ratio old/new
(above 1: this checkout is faster) with its spread over the rounds. The
children run without NumPy's transparent huge pages unless ``--hugepages``, as
``bench_versus.py``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import numpy as np
from tbq.attention import KVCache, attention_fused

formats, tokens, threads, repeat = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3].split(","), int(sys.argv[4])
rng = np.random.default_rng(0)
x = rng.uniform(-1.7, 1.7, (tokens, 8, 128)).astype(np.float32)
q = rng.uniform(-1.7, 1.7, (32, 128)).astype(np.float32)
out = {}
for fmt in formats:
    K, V = KVCache.encode(x, fmt), KVCache.encode(x, fmt)
    for th in map(int, threads):
        attention_fused(q, K, V, threads=th)
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter(); attention_fused(q, K, V, threads=th); best = min(best, time.perf_counter() - t)
        out[f"{fmt}/{th}"] = best * 1e3
print(json.dumps(out))
"""


def _run(src: Path, formats: str, tokens: int, threads: str, repeat: int, hugepages: bool) -> dict[str, float]:
    from bench_versus import run_child

    return run_child(src, CHILD, [formats, str(tokens), threads, str(repeat)], hugepages, "versus_attention")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="the git commit (or tag, branch) to compare against")
    ap.add_argument("--formats", default="f16,bf16,q8_0,tbq4_0", help="comma-separated cache formats")
    ap.add_argument("--tokens", default="32K", help="cached tokens (K = 1024; default 32K)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    ap.add_argument("--repeat", type=int, default=7, help="timed calls per case per round, best kept (default 7)")
    ap.add_argument("--json", type=Path, help="write the per-round figures here")
    ap.add_argument(
        "--hugepages", action="store_true", help="let NumPy ask for transparent huge pages (bimodal on some VMs)"
    )
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeat < 1:
        raise SystemExit("versus_attention: --rounds and --repeat must be at least 1")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_codecs import parse_size
    from bench_versus import ref_tree

    tokens = parse_size(args.tokens)
    with tempfile.TemporaryDirectory(prefix="tbq-versus-attention-") as tmp:
        trees = {"old": ref_tree(args.ref, Path(tmp), "versus_attention"), "new": ROOT / "src"}
        rounds = []
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")  # neither tree always runs first
            rounds.append(
                {
                    name: _run(trees[name], args.formats, tokens, args.threads, args.repeat, args.hugepages)
                    for name in order
                }
            )
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"new = this checkout, old = {args.ref}; {tokens:,} tokens x 8 x 128, 32 query heads, {args.rounds} rounds")
    print(f"{'format/threads':<16} {'old ms':>8} {'new ms':>8} {'old/new':>8} {'spread':>11}")
    for case in rounds[0]["old"]:
        o = np.array([rd["old"][case] for rd in rounds])
        w = np.array([rd["new"][case] for rd in rounds])
        ratio = o / w
        print(
            f"{case:<16} {np.median(o):>8.1f} {np.median(w):>8.1f} {np.median(ratio):>8.2f} "
            f"{ratio.min():.2f}..{ratio.max():.2f}"
        )
    if args.json:
        doc = {"ref": args.ref, "tokens": tokens, "hugepages": args.hugepages, "rounds": rounds}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
