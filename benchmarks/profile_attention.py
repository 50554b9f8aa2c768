"""What one decode step of the fused attention kernel costs per cache type, on one thread, in thread CPU time.

    python benchmarks/profile_attention.py                  # 8K tokens, float32 rows and every format
    python benchmarks/profile_attention.py --tokens 32K --formats tbq4_0,q8_0
    python benchmarks/profile_attention.py --tokens 32K --formats tbq4_0,tbq3_0 --split

A quick profile for kernel work (thread CPU time, which other processes on a
shared machine inflate less than wall time; best of ``--rounds``): 32 query
heads over ``--tokens`` tokens x 8 KV heads x 128, K and V in the same format.
``rows`` is float32 rows read by a plain copy (the kernel without any
decoding: the difference to a format is what its reader costs). The
comparison with ggml is ``bench_attention.py``.

``--split`` also times the parts on their own, in the same thread CPU time:
the reader (decoding every chunk of one cache into the kernel's scratch, once
for K and once for V), the score microkernel and the value microkernel (four
query rows, the whole cache's chunks over a scratch that stays in L1/L2); the
rest of a call is the online softmax, the partial merge and the calls.
Where the kernel reads TBQ4_0 / TBQ3_0 codes in its microkernels (AVX-512:
``attention_kernels.code_bits``), ``--split`` also times those microkernels
on one chunk of the format's codes: the reader's time is then not spent.
"""

from __future__ import annotations

import argparse
import sys
import time

import numba as nb
import numpy as np

import tbq
from tbq import attention as att
from tbq import attention_kernels as kn
from tbq.attention import KVCache, attention_fused
from tbq.kernels import address, call_reader

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_codecs import parse_size


@nb.njit(nogil=True)
def _reader_only(op, T, G, D, chunk):
    """Every chunk of one cache decoded into a chunk scratch, as the kernel's reader calls do."""
    read, data, aux, blocks = op
    K = np.empty((chunk, G, D), np.float32)
    for c0 in range(0, T, chunk):
        n = min(chunk, T - c0)
        call_reader(read, address(data[c0]), address(K), n * G * blocks, address(aux), aux.shape[0])
    return K[0, 0, 0]


@nb.njit(nogil=True)
def _scores_only(Q, K, S, reps):
    """The score microkernel (4 rows) over ``reps`` chunks of every KV head, from one decoded chunk."""
    G, D, chunk = K.shape[1], K.shape[2], S.shape[1]
    for _ in range(reps):
        for g in range(G):
            kn._scores4(Q[g], 0, K, g * D, G * D, S, 0, chunk, chunk // 4, D)
    return S[0, 0]


@nb.njit(nogil=True)
def _values_only(S, V, ACC, reps):
    """The value microkernel (4 rows, the widest) over ``reps`` chunks of every KV head."""
    G, D, chunk = V.shape[1], V.shape[2], S.shape[1]
    for _ in range(reps):
        for g in range(G):
            kn._values4wide(S, 0, chunk, V, g * D, G * D, ACC[g], 0, chunk, D, 0, D)
    return ACC[0, 0, 0]


@nb.njit(nogil=True)
def _codes_only(Q, data, aux, bits, S, ACC, reps):
    """The score and value microkernels on codes (4 rows) over ``reps`` chunks of every KV head, from one
    chunk of the cache's bytes."""
    G, chunk = data.shape[1], S.shape[1]
    ts = data.shape[1] * data.shape[2]
    for _ in range(reps):
        for g in range(G):
            kn._scores_codes_rows(Q[g], data, g * data.shape[2], ts, chunk, aux, bits, 1, S, 4)
            kn._values_codes_rows(S, data, g * data.shape[2], ts, chunk, aux, bits, 1, ACC[g], 4)
    return S[0, 0]


def _best(rounds, f, *a) -> float:
    f(*a)
    ts = []
    for _ in range(rounds):
        t0 = time.thread_time()
        f(*a)
        ts.append(time.thread_time() - t0)
    return min(ts) * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="8K")
    p.add_argument("--formats", default="rows," + ",".join(tbq.format_names()))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--split", action="store_true", help="also time the reader and the two microkernels alone")
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
        if args.split and f != "rows":
            r = _best(args.rounds, _reader_only, att._kernel_operand(K, 0)[:4], T, 8, 128, kn.CHUNK)
            print(f"|   {f} reader, K and V | {2 * r:.1f} ms |", flush=True)
            op = att._kernel_operand(K, 0)[:4]
            bits = kn.code_bits(op, 128)
            if bits:
                Q = rng.uniform(-1, 1, (8, 4, 128)).astype(np.float32)
                S = rng.uniform(0, 1, (4, kn.CHUNK)).astype(np.float32)
                ACC = np.zeros((8, 4, 128), np.float32)
                c = _best(args.rounds, _codes_only, Q, op[1][: kn.CHUNK], op[2], bits, S, ACC, T // kn.CHUNK)
                print(f"|   {f} scores and values on codes (no reader) | {c:.1f} ms |", flush=True)
    if args.split:
        K = rng.uniform(-1, 1, (kn.CHUNK, 8, 128)).astype(np.float32)
        Q = rng.uniform(-1, 1, (8, 4, 128)).astype(np.float32)
        S = np.empty((4, kn.CHUNK), np.float32)
        ACC = np.zeros((8, 4, 128), np.float32)
        reps = T // kn.CHUNK
        print(f"| scores, 4 rows x 8 heads | {_best(args.rounds, _scores_only, Q, K, S, reps):.1f} ms |")
        print(f"| values, 4 rows x 8 heads | {_best(args.rounds, _values_only, S, K, ACC, reps):.1f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
