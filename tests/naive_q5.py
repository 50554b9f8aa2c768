"""Slow models of Q5_0 and Q5_1 (tbq/formats/q5.py), one block at a time with float32 scalars.

Written from docs/formats.md; shares no code with tbq (fp16 by hand from
tests/naive.py, the Q5_1 min/max arithmetic from tests/naive_q4_1.py).
"""

from __future__ import annotations

import math

import numpy as np
from naive import fp16_bits, fp16_value
from naive_q4_1 import le16, min_codes

F32 = np.float32


def pack(q) -> list:
    """qh (4 bytes, little-endian) then the 16 split-half nibble bytes."""
    qh = 0
    for i, c in enumerate(q):
        qh |= ((c >> 4) & 1) << i
    return [(qh >> s) & 0xFF for s in (0, 8, 16, 24)] + [(q[j] & 15) | ((q[j + 16] & 15) << 4) for j in range(16)]


def unpack(body: bytes) -> list:
    qh = body[0] | (body[1] << 8) | (body[2] << 16) | (body[3] << 24)
    lo = [b & 15 for b in body[4:20]] + [b >> 4 for b in body[4:20]]
    return [c | (((qh >> i) & 1) << 4) for i, c in enumerate(lo)]


def encode_q5_0(x):
    x = [F32(a) for a in x]
    amax, m = F32(0), F32(0)  # max starts at +0 and changes only on a strictly larger |x|
    for v in x:
        if F32(abs(v)) > amax:
            amax, m = F32(abs(v)), v
    d = F32(m / F32(-16))
    idd = F32(F32(1) / d) if d != 0 else F32(0)
    vs, ts, q = [], [], []
    for a in x:
        v = F32(a * idd)
        t = F32(v + F32(16.5))
        vs.append(v)
        ts.append(t)
        q.append(min(31, int(t)) if math.isfinite(t) else 0)
    trace = {"d": d, "v": np.array(vs, F32), "t": np.array(ts, F32)}
    return bytes(le16(fp16_bits(d)) + pack(q)), trace


def encode_q5_1(x):
    d, mn, vs, ts, cs = min_codes(x, 31)
    q = [c & 0xFF for c in cs]  # (uint8_t) conversion, no clamp
    trace = {"d": d, "m": mn, "v": np.array(vs, F32), "t": np.array(ts, F32)}
    return bytes(le16(fp16_bits(d)) + le16(fp16_bits(mn)) + pack(q)), trace


def encode_block(fmt_obj, x):
    with np.errstate(all="ignore"):
        return encode_q5_0(x) if fmt_obj.name == "q5_0" else encode_q5_1(x)


def decode_block(fmt_obj, block: bytes):
    d = fp16_value(block[0] | (block[1] << 8))
    if fmt_obj.name == "q5_0":
        return [F32(F32(c - 16) * d) for c in unpack(block[2:22])]
    m = fp16_value(block[2] | (block[3] << 8))
    return [F32(F32(F32(c) * d) + m) for c in unpack(block[4:24])]
