"""What one decode step of the fused attention kernel costs per cache type, on one thread, in thread CPU time.

    python benchmarks/profile_attention.py                  # 8K tokens, float32 rows and every format
    python benchmarks/profile_attention.py --tokens 32K --formats tbq4_0,q8_0

A quick profile for kernel work (thread CPU time, which other processes on a
shared machine inflate less than wall time; best of ``--rounds``): 32 query
heads over ``--tokens`` tokens x 8 KV heads x 128, K and V in the same format.
``rows`` is float32 rows read by a plain copy (the kernel without any
decoding: the difference to a format is what its reader costs). The
comparison with ggml is ``bench_attention.py``.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import tbq
from tbq.attention import KVCache, attention_fused

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_codecs import parse_size


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="8K")
    p.add_argument("--formats", default="rows," + ",".join(tbq.formats()))
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    T = parse_size(args.tokens)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1.7, 1.7, (T, 8, 128)).astype(np.float32)
    q = rng.uniform(-1.7, 1.7, (32, 128)).astype(np.float32)
    print(f"| cache | 1 thread, thread CPU time ({T // 1024}K tokens, best of {args.rounds}) |\n|---|---|")
    for f in args.formats.split(","):
        K, V = (x, x) if f == "rows" else (KVCache.encode(x, f), KVCache.encode(x, f))
        attention_fused(q, K, V, threads=1)
        ts = []
        for _ in range(args.rounds):
            t0 = time.thread_time()
            attention_fused(q, K, V, threads=1)
            ts.append(time.thread_time() - t0)
        print(f"| {f} | {min(ts) * 1e3:.1f} ms |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
