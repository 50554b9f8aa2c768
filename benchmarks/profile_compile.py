"""What numba compiles on a cold start, and how long each function takes: numba's ``numba:compile`` events.

    python benchmarks/profile_compile.py                              # the four core formats and attention
    python benchmarks/profile_compile.py --formats tbq4_0,tbq3_0 --no-attention
    python benchmarks/profile_compile.py --head-dim 40                # attention_kernels._attend_any instead
    python benchmarks/profile_compile.py --formats all                # the default tbq compare's 18 formats

Runs ``tbq.warmup``'s cold-start warm-up (``_warm``: one encode and decode of
each format's kernels, its attention reader, and the fused attention kernel)
in a child process with an empty numba cache (``NUMBA_CACHE_DIR`` in a new
temporary directory), in one process (no helper), and prints the seconds of
compilation per function, exclusive of the functions it compiles in turn
(numba compiles a callee as a function of its own, under the caller's
event), largest first. ``--head-dim`` other than 128 runs the attention
kernel on float rows of that head dimension after the warm-up. The
cold-start wall times of ``tbq compare`` itself are ``bench_cold_start.py``.

It also splits the warm-up's wall time into LLVM's part (llvmlite's module
and function pass managers and ``finalize_object``, the machine code, timed
around each call) and the rest, numba's own Python (typing, its IR passes,
building the LLVM IR).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import collections, json, sys, threading, time
from llvmlite.binding import executionengine as _ee, newpassmanagers as _npm
llvm = collections.Counter()
def _timed(cls, name, key):
    f = getattr(cls, name)
    def g(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            llvm[key] += time.perf_counter() - t0
    setattr(cls, name, g)
_timed(_npm.ModulePassManager, "run", "passes")
_timed(_npm.FunctionPassManager, "run", "passes")
_timed(_ee.ExecutionEngine, "finalize_object", "machine code")
from numba.core import event as ev
excl = collections.defaultdict(float); count = collections.Counter(); stacks = collections.defaultdict(list)
class Timer(ev.Listener):
    def on_start(self, e):
        stacks[threading.get_ident()].append([time.perf_counter(), 0.0])
    def on_end(self, e):
        st = stacks[threading.get_ident()]
        t0, child = st.pop()
        dt = time.perf_counter() - t0
        f = e.data["dispatcher"].py_func
        name = f"{f.__module__}.{f.__qualname__}"
        excl[name] += dt - child
        count[name] += 1
        if st:
            st[-1][1] += dt
ev.register("numba:compile", Timer())
import numpy as np
import tbq.warmup as c
job = json.loads(sys.argv[1])
t = time.perf_counter()
c._warm(job["formats"], {}, job["attention"] and job["head_dim"] == 128, job["attention"])
if job["attention"] and job["head_dim"] != 128:
    from tbq.attention import attention_fused
    x = np.ones((64, 8, job["head_dim"]), np.float32)
    attention_fused(np.ones((8, job["head_dim"]), np.float32), x, x, threads=1)
wall = time.perf_counter() - t
print(json.dumps({"wall": wall, "llvm": dict(llvm), "functions": [[k, v, count[k]] for k, v in sorted(excl.items(), key=lambda kv: -kv[1])]}))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--formats", default="q8_0,q4_0,tbq4_0,tbq3_0", help="comma-separated, or all (the default compare's)"
    )
    p.add_argument("--no-attention", action="store_true")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    if args.formats == "all":
        from tbq.formats import cache_formats

        args.formats = ",".join(cache_formats())
    job = {"formats": args.formats.split(","), "attention": not args.no_attention, "head_dim": args.head_dim}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(job)], env=env, capture_output=True, text=True)
    if r.returncode:
        sys.stderr.write(r.stderr)
        return 1
    res = json.loads(r.stdout.strip().splitlines()[-1])
    total = sum(v for _, v, _ in res["functions"])
    att = "" if args.no_attention else f" and attention (head dim {args.head_dim})"
    print(
        f"Cold warm-up of {args.formats}{att}, one process: {res['wall']:.2f} s, of which compilation "
        f"{total:.2f} s over {len(res['functions'])} functions (exclusive seconds, largest first):"
    )
    lv = res["llvm"]
    rest = res["wall"] - sum(lv.values())
    print(
        f"  of the wall time: LLVM passes {lv.get('passes', 0):.2f} s, LLVM machine code {lv.get('machine code', 0):.2f} s, "
        f"the rest (numba's Python: typing, IR passes, building the IR) {rest:.2f} s ({rest / res['wall']:.0%})"
    )
    for name, sec, n in res["functions"][: args.top]:
        print(f"  {sec:6.2f} s  {name}" + (f"  ({n} signatures)" if n > 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
