"""Is any format slower than at another commit? Encode and decode throughput of two trees, side by side.

The same machine, the same run: the source of ``--ref`` (``git archive``) and
this checkout's ``src/`` are timed in alternating rounds, one child process per
tree per round (each warms its kernels first and allocates its outputs once,
so neither numba compilation nor page faults are timed), every format the two
trees share on one thread. The table gives each
tree's median throughput and the ratio new/old with its spread over the rounds
(min..max of the per-round ratios), so a slower format shows even on a loaded
machine as long as the load is the same for both trees in a round.

The children run with ``NUMPY_MADVISE_HUGEPAGE=0`` unless ``--hugepages``:
NumPy asks Linux for transparent huge pages for large arrays, and whether a
process gets them depends on the memory free at the moment. On the 2-core
AMD EPYC VM (AVX2) this was measured on, that split the children into a fast
and a slow mode (q4_0 decode about 3,150 or 2,100 M values/s, the same code),
and the per-round ratio of unchanged code ranged 0.65-1.73, 5 of 9 rounds
above 1.3; without huge pages it stayed within 0.95-1.05 in 3 to 6 of 7
rounds (``results/versus_nibble_store_16M*.json``).

    python benchmarks/bench_versus.py --ref fb33a2a^1          # before the generic format interface
    python benchmarks/bench_versus.py --ref v0.2.0 --formats q8_0,tbq4_0 --values 1M --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

#: Run in a child with ``sys.path[0]`` the tree's ``src``: one JSON line per format.
CHILD = r"""
import json, sys, time
import numpy as np
import tbq

n, repeat, wanted = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
rng = np.random.default_rng(0)
x = (rng.standard_normal(n) * 0.5).astype(np.float32).reshape(-1, 4096)
out = {}
for fmt in wanted:
    if fmt not in tbq.format_names():
        continue
    codec = tbq.get_codec(fmt, threads=1)
    b = codec.encode(x)  # compile or load the kernels (every path the timed calls take): not timed
    y = codec.decode(b)  # the outputs are allocated once, as in bench_codecs.py: the kernels are timed, not page faults
    best_e = best_d = float("inf")
    for _ in range(repeat):
        t = time.perf_counter(); codec.encode(x, out=b); best_e = min(best_e, time.perf_counter() - t)
        t = time.perf_counter(); codec.decode(b, out=y); best_d = min(best_d, time.perf_counter() - t)
    out[fmt] = {"encode": n / best_e / 1e6, "decode": n / best_d / 1e6}
print(json.dumps(out))
"""


def ref_tree(ref: str, tmp: Path, who: str) -> Path:
    """The ``src`` folder of commit ``ref`` (``git archive``), extracted under ``tmp``."""
    old = tmp / "old"
    old.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"{who}: git archive {ref}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    return old / "src"


def _values(text: str) -> int:
    from bench_codecs import parse_size  # the benchmarks' one size syntax (K = 1024, M = 1024K)

    n = parse_size(text)
    if n < 4096 or n % 4096:
        raise SystemExit(f"bench_versus: --values must be a positive multiple of 4096, got {text}")
    return n


def run_child(src: Path, child: str, argv: list[str], hugepages: bool, who: str) -> Any:
    """Run ``child`` (Python source) in a new interpreter with the tree ``src`` first on ``sys.path`` and
    ``NUMPY_MADVISE_HUGEPAGE`` set by ``hugepages``; the JSON of its last line of output."""
    code = f"import sys; sys.path.insert(0, {str(src)!r})\n" + child
    env = dict(os.environ, NUMPY_MADVISE_HUGEPAGE="1" if hugepages else "0")
    res = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=False, cwd=src.parent, env=env
    )
    if res.returncode != 0:
        raise SystemExit(f"{who}: the child for {src} failed:\n{res.stderr.strip()}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _run(src: Path, n: int, repeat: int, formats: list[str], hugepages: bool) -> dict[str, dict[str, float]]:
    return run_child(src, CHILD, [str(n), str(repeat), ",".join(formats)], hugepages, "bench_versus")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="the git commit (or tag, branch) to compare against")
    ap.add_argument("--formats", help="comma-separated (default: every format both trees have)")
    ap.add_argument("--values", default="4M", help="values per call (K = 1024, M = 1024K; default 4M)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    ap.add_argument("--repeat", type=int, default=3, help="timed calls per format per round, best kept (default 3)")
    ap.add_argument("--json", type=Path, help="write the per-round figures here")
    ap.add_argument(
        "--hugepages", action="store_true", help="let NumPy ask for transparent huge pages (bimodal on some VMs)"
    )
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeat < 1:
        raise SystemExit("bench_versus: --rounds and --repeat must be at least 1")
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    n = _values(args.values)
    import tbq

    formats = args.formats.split(",") if args.formats else list(tbq.format_names())
    with tempfile.TemporaryDirectory(prefix="tbq-versus-") as tmp:
        trees = {"old": ref_tree(args.ref, Path(tmp), "bench_versus"), "new": ROOT / "src"}
        rounds: list[dict[str, dict[str, dict[str, float]]]] = []
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")  # neither tree always runs first
            got = {name: _run(trees[name], n, args.repeat, formats, args.hugepages) for name in order}
            rounds.append(got)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    shared = [f for f in formats if all(f in rd["old"] and f in rd["new"] for rd in rounds)]
    print(f"new = this checkout, old = {args.ref}; {n:,} values per call, one thread, {args.rounds} rounds")
    print(
        f"{'format':<11} {'encode old':>10} {'new M/s':>8} {'new/old':>8} {'spread':>11}   "
        f"{'decode old':>10} {'new M/s':>8} {'new/old':>8} {'spread':>11}"
    )
    for f in shared:
        cells = []
        for way in ("encode", "decode"):
            o = np.array([rd["old"][f][way] for rd in rounds])
            w = np.array([rd["new"][f][way] for rd in rounds])
            ratio = w / o
            spread = f"{ratio.min():.2f}..{ratio.max():.2f}"
            cells.append(f"{np.median(o):>10.0f} {np.median(w):>8.0f} {np.median(ratio):>8.2f} {spread:>11}")
        print(f"{f:<11} " + "   ".join(cells))
    only = sorted(set(formats) - set(shared))
    if only:
        print(f"(not in both trees: {', '.join(only)})")
    if args.json:
        args.json.write_text(
            json.dumps({"ref": args.ref, "values": n, "hugepages": args.hugepages, "rounds": rounds}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
