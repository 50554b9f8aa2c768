"""Slow models of Q8_1 and Q8_K (tbq/formats/q8_ops.py), one block at a time with float32 scalars.

Written from docs/formats.md and the C loops of ggml's quantize_row_q8_1_ref / quantize_row_q8_K_ref,
sharing no code with tbq (fp16 by hand from tests/naive.py; nearest_int as C writes it, on the float's
bytes through ``struct``).
"""

from __future__ import annotations

import struct

import numpy as np
from naive import encode_q8_0, fp16_bits, fp16_value

F32 = np.float32


def _int8(c: int) -> int:
    c &= 0xFF
    return c - 256 if c >= 128 else c


def _le16(h: int) -> list[int]:
    return [h & 0xFF, (h >> 8) & 0xFF]


def nearest_int(fval) -> int:
    """ggml's nearest_int: the float ``fval + 12582912.f``, its bits as an int, ``(i & 0x7fffff) - 0x400000``."""
    val = F32(F32(fval) + F32(12582912.0))
    (i,) = struct.unpack("<i", np.float32(val).tobytes())  # the float's 4 bytes read as an int (C's memcpy)
    return (i & 0x007FFFFF) - 0x00400000


def encode_q8_1(x):
    """Q8_0's slow model (tests/naive.py), then s = fp16(float32(sum of the stored codes) * the float32 d)."""
    b0, d = encode_q8_0(x)
    total = sum(_int8(c) for c in b0[2:])
    s = F32(F32(total) * d)
    return b0[:2] + bytes(_le16(fp16_bits(s))) + b0[2:], {"d": d, "s": s}


def encode_q8_k(x):
    x = [F32(v) for v in x]
    mx, amax = F32(0), F32(0)
    for v in x:
        ax = F32(abs(v))
        if ax > amax:
            amax, mx = ax, v
    if not amax:
        # C stops here; tbq's trace keeps iscale = 0 and v = x * 0 (signed zeros) for such a block
        return bytes(292), {"max": F32(0), "iscale": F32(0), "d": F32(0), "v": np.array([F32(v * F32(0)) for v in x])}
    iscale = F32(F32(-127) / mx)
    qs, vs = [], []
    for v in x:
        p = F32(iscale * v)
        vs.append(p)
        qs.append(_int8(min(127, nearest_int(p))))
    bsums = [sum(qs[16 * g : 16 * g + 16]) for g in range(16)]
    d = F32(F32(1) / iscale)
    b = np.float32(d).tobytes() + bytes(q & 0xFF for q in qs) + b"".join(struct.pack("<h", s) for s in bsums)
    return b, {"max": mx, "iscale": iscale, "d": d, "v": np.array(vs, F32)}


def encode_block(fmt_obj, x):
    return (encode_q8_1 if fmt_obj.name == "q8_1" else encode_q8_k)(x)


def decode_block(fmt_obj, block: bytes):
    if fmt_obj.name == "q8_1":
        d = fp16_value(block[0] | (block[1] << 8))
        return [F32(F32(_int8(c)) * d) for c in block[4:36]]
    (d,) = struct.unpack("<f", block[:4])
    return [F32(F32(d) * F32(_int8(c))) for c in block[4:260]]
