"""One pass of a format's attention reader over a 32K x 8 x 128 cache, as the fused kernel reads it (chunks of 64
tokens x 8 heads into a 256 KiB scratch that stays in L2), best of 15 passes, 1 thread; old and new tree in
alternating child processes (issue 40's reader figures; the whole decode step is versus_attention.py's).

    python benchmarks/results/attention_lookup16_reader.py OLD_SRC NEW_SRC ROUNDS
"""

import json
import os
import subprocess
import sys

import numpy as np

CHILD = r"""
import json, sys, time
import numba, numpy as np
import tbq, tbq.kernels as k
from tbq.attention import KVCache

@numba.njit
def one_pass(fn, data, scratch, aux, per):
    for c in range(0, data.shape[0], per):
        k.call_reader(fn, k.address(data[c:]), k.address(scratch), per, k.address(aux), aux.shape[0])

x = np.random.default_rng(0).uniform(-1.7, 1.7, (32768 * 8, 128)).astype(np.float32)
out = {}
for fmt in sys.argv[1].split(","):
    f = tbq.get_format(fmt)
    data = tbq.get_codec(fmt).encode(x)
    r = f.attention.reader()
    scratch = np.empty((64 * 8, 128), np.float32)
    one_pass(r.read.address, data, scratch, r.aux, 64 * 8)
    best = float("inf")
    for _ in range(15):
        t = time.perf_counter(); one_pass(r.read.address, data, scratch, r.aux, 64 * 8); best = min(best, time.perf_counter() - t)
    out[fmt] = best * 1e3
print(json.dumps(out))
"""


def run(src: str, formats: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=src, NUMBA_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", CHILD, formats], env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    old, new, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    formats = "tbq4_0,tbq3_0,turbo4,q8_0"
    res = []
    for i in range(rounds):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        res.append({name: run(old if name == "old" else new, formats) for name in order})
    print(f"one reader pass over 32K x 8 blocks of 128, 1 thread, best of 15 per round; {rounds} alternating rounds")
    print(f"{'format':<8} {'old ms':>8} {'new ms':>8} {'old/new':>8} {'spread':>11}")
    for f in formats.split(","):
        o = np.array([r["old"][f] for r in res])
        n = np.array([r["new"][f] for r in res])
        q = o / n
        print(f"{f:<8} {np.median(o):>8.2f} {np.median(n):>8.2f} {np.median(q):>8.2f} {q.min():.2f}..{q.max():.2f}")
    print(json.dumps(res))
