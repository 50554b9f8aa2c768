"""Slow model of Q4_1 (tbq/formats/q4_1.py), one block at a time with float32 scalars, from docs/formats.md.

Shares no code with tbq (fp16 by hand from tests/naive.py). The min/max
search is the C loop itself: start from +-FLT_MAX and update on a strict
comparison.
"""

from __future__ import annotations

import math

import numpy as np
from naive import fp16_bits, fp16_value

F32 = np.float32
FLT_MAX = F32(3.4028234663852886e38)


def min_max(x):
    mn, mx = FLT_MAX, -FLT_MAX
    for v in x:
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    return mn, mx


def min_codes(x, levels: int):
    """(d, min, v list, t list, code list) of the Q4_1/Q5_1 arithmetic; the codes before any clamp."""
    x = [F32(a) for a in x]
    mn, mx = min_max(x)
    d = F32(F32(mx - mn) / F32(levels))
    idd = F32(F32(1) / d) if d != 0 else F32(0)
    vs, ts, cs = [], [], []
    for a in x:
        v = F32(F32(a - mn) * idd)
        t = F32(v + F32(0.5))
        vs.append(v)
        ts.append(t)
        cs.append(int(t) if math.isfinite(t) else 0)  # x86: (int)(+-inf or NaN) = 0x80000000, low byte 0
    return d, mn, vs, ts, cs


def le16(h: int) -> list:
    return [h & 0xFF, h >> 8]


def encode_block(fmt_obj, x):
    with np.errstate(all="ignore"):
        d, mn, vs, ts, cs = min_codes(x, 15)
    q = [min(15, c) for c in cs]
    payload = [q[j] | (q[j + 16] << 4) for j in range(16)]
    trace = {"d": d, "m": mn, "v": np.array(vs, F32), "t": np.array(ts, F32)}
    return bytes(le16(fp16_bits(d)) + le16(fp16_bits(mn)) + payload), trace


def decode_block(fmt_obj, block: bytes):
    d = fp16_value(block[0] | (block[1] << 8))
    m = fp16_value(block[2] | (block[3] << 8))
    q = [b & 15 for b in block[4:20]] + [b >> 4 for b in block[4:20]]
    return [F32(F32(F32(c) * d) + m) for c in q]
