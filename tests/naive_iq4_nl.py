"""Slow, obviously correct model of IQ4_NL (docs/formats.md, "IQ4_NL"), written from the spec.

One value at a time with float32 scalars; shares no code with tbq. The row
rule is modelled as the C code has it: one index array ``L`` per call (row),
overwritten by every computed block and packed as it stands for a tiny block
(never written before: index 8, as the conformance vectors define).
"""

from __future__ import annotations

import numpy as np
from naive import fp16_bits, fp16_value

F32 = np.float32
K = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
TINY = F32(1e-15)


def best(a: F32) -> int:
    """best_index_int8: the nearest level; between K[i] <= a < K[i+1], i if (a - K[i]) < (K[i+1] - a) in float32, else i + 1."""
    if a <= F32(K[0]):
        return 0
    if a >= F32(K[15]):
        return 15
    i = 0
    while F32(K[i + 1]) <= a:
        i += 1
    lo = F32(a - F32(K[i]))
    hi = F32(F32(K[i + 1]) - a)
    return i if lo < hi else i + 1


def encode_block(fmt_obj, x) -> tuple[bytes, dict]:
    """Encode the row prefix ``x`` (whole 32-value blocks, one C call): (bytes of every block, trace rows per block)."""
    x = [F32(v) for v in x]
    L = [8] * 32  # uninitialised in C; the vectors define index 8
    computed = False
    out: list[int] = []
    tr: dict[str, list] = {"d0": [], "a": [], "d": [], "carried": []}
    for b in range(len(x) // 32):
        xb = x[32 * b : 32 * b + 32]
        amax, mx = F32(0), F32(0)
        for v in xb:
            if F32(abs(v)) > amax:
                amax, mx = F32(abs(v)), v
        if amax < TINY:
            d0, d, a, carried = F32(0), F32(0), [F32(0)] * 32, (1 if computed else 2)
        else:
            d0 = F32(mx / F32(-127))
            inv = F32(F32(1) / d0)
            sumqx, sumq2 = F32(0), F32(0)
            a = []
            for j, v in enumerate(xb):
                al = F32(inv * v)
                a.append(al)
                L[j] = best(al)
                q = F32(K[L[j]])
                w = F32(v * v)
                sumqx = F32(sumqx + F32(F32(w * q) * v))
                sumq2 = F32(sumq2 + F32(F32(w * q) * q))
            d = F32(sumqx / sumq2) if sumq2 > 0 else F32(0)
            computed, carried = True, 0
        h = fp16_bits(d)
        out += [h & 0xFF, h >> 8] + [L[j] | (L[j + 16] << 4) for j in range(16)]
        tr["d0"].append(d0)
        tr["a"].append(a)
        tr["d"].append(d)
        tr["carried"].append(F32(carried))
    return bytes(out), {k: np.array(v, F32) for k, v in tr.items()}


def decode_block(fmt_obj, block: bytes) -> list:
    d = fp16_value(block[0] | (block[1] << 8))
    idx = [b & 15 for b in block[2:18]] + [b >> 4 for b in block[2:18]]
    return [F32(d * F32(K[i])) for i in idx]
