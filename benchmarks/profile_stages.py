"""Where the TBQ kernels spend their time: each stage timed on its own.

    python benchmarks/profile_stages.py

The TBQ kernels in ``tbq/formats/tbq_kernels.py`` mark their stages with ``# stage: NAME``
comments. For every stage this script compiles a copy of the kernel that keeps
only that stage (plus the loop over block groups and the code between stages),
with the same numba flags (no fastmath, numpy error model, no bounds checks),
and times it on the same 2**22 values (best of 7, one thread). Deleting one
stage from the full kernel and timing the rest is not a usable alternative
here: LLVM's unrolling and vectorisation decisions change with the code around
a loop, and the differences come out negative. The isolated costs add up to
roughly the whole kernel; docs/performance.md quotes this output.
"""

from __future__ import annotations

import inspect
import re
import sys
import time

import numba as nb
import numpy as np

import tbq
from tbq.formats import tbq_kernels as kernels
from tbq.half import f16_table

N_BLOCKS = 1 << 15
REPEAT = 7


def stages(src: str) -> list[tuple[str, int, int]]:
    """(name, first line, last line + 1) of every ``# stage:`` section except ``end``."""
    lines = src.splitlines(keepends=True)
    marks = [(i, m.group(1)) for i, line in enumerate(lines) if (m := re.match(r"\s*# stage: (\S+)", line))]
    return [(name, i + 1, marks[k + 1][0]) for k, (i, name) in enumerate(marks[:-1]) if name != "end"]


def variant(fn, keep=None):
    """The kernel, or a copy keeping only stage ``keep`` (a ``stages()`` entry)."""
    src = inspect.getsource(fn.py_func).replace("@jit\n", "")
    lines = src.splitlines(keepends=True)
    if keep is not None:
        for st in sorted(stages(src), key=lambda t: -t[1]):
            if st != keep:
                lines = lines[: st[1]] + lines[st[2] :]
    name = f"_{fn.__name__}_variant"
    code = "".join(lines).replace(f"def {fn.__name__}(", f"def {name}(", 1)
    ns = dict(vars(kernels))
    exec(code, ns)
    return nb.njit(boundscheck=False, error_model="numpy", fastmath=False, nogil=True)(ns[name]), stages(src)


def best(f, args) -> float:
    f(*args)
    times = []
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        f(*args)
        times.append(time.perf_counter() - t0)
    return min(times) / args[0].shape[0] * 1e9


def profile(fmt: str, direction: str) -> list[tuple[str, float]]:
    codec = tbq.get_codec(fmt)
    k = codec.format._k
    x = np.random.default_rng(0).standard_normal((N_BLOCKS, 128), dtype=np.float32)
    q = codec.encode(x)
    bits = codec.info.index_bits
    if direction == "encode":
        fn = kernels.encode
        args = (x, np.empty_like(q), bits, k["thresholds"], k["centroids_sq"], k["s1"], k["cs2"], True, kernels.LANES)
    else:
        fn = kernels.decode
        args = (q, np.empty_like(x), bits, k["centroids"], k["s2"], k["cs1"], f16_table(), kernels.LANES)
    full, secs = variant(fn)
    rows = [("whole kernel", best(full, args))]
    bare, _ = variant(fn, ("none", 0, 0))
    rows.append(("(loop only)", best(bare, args)))
    for st in secs:
        f, _ = variant(fn, st)
        rows.append((st[0], best(f, args) - rows[1][1]))
    return rows


def main() -> int:
    print(f"ns per 128-value block, one thread, {N_BLOCKS * 128:,} values, best of {REPEAT}")
    for fmt in ("tbq4_0", "tbq3_0"):
        for direction in ("encode", "decode"):
            rows = profile(fmt, direction)
            total = rows[0][1]
            print(f"\n{fmt} {direction}: {total:.0f} ns/block = {128 / total * 1e3:.0f} M values/s")
            for name, v in rows[1:]:
                print(f"  {name:14s} {v:6.0f} ns  ({100 * v / total:3.0f} %)")
            print(f"  {'sum':14s} {sum(v for _, v in rows[1:]):6.0f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
