"""Slow, obviously correct models of MXFP4 and NVFP4 (docs/formats.md, "MXFP4", "NVFP4"), from the spec.

One value at a time with float32 scalars and Python's own ``math.log2``;
shares no code with tbq.
"""

from __future__ import annotations

import math
import struct

import numpy as np

F32 = np.float32
V = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]


def f32_bits(v) -> int:
    return struct.unpack("<I", struct.pack("<f", float(v)))[0]


def bits_f32(u: int) -> F32:
    return F32(struct.unpack("<f", struct.pack("<I", u))[0])


def best_index(x: F32, d: F32) -> int:
    """best_index_mxfp4: the first i with the smallest |V[i]*d - x| (strict <)."""
    best, best_err = 0, F32(abs(F32(F32(V[0]) * d) - x))
    for i in range(1, 16):
        err = F32(abs(F32(F32(V[i]) * d) - x))
        if err < best_err:
            best, best_err = i, err
    return best


def e8m0_half(e: int) -> F32:
    return bits_f32(0x00200000 << e if e < 2 else (e - 1) << 23)


def ue4m3(s: F32) -> int:
    """ggml_fp32_to_ue4m3, step by step."""
    if not s > 0:
        return 0
    s = min(s, F32(448))
    bits = f32_bits(s)
    fe = ((bits >> 23) & 255) - 127
    fm = (bits >> 20) & 7
    ue = fe + 7
    if ue <= 0:
        m = int(F32(F32(s * F32(512)) + F32(0.5)))
        m = min(m, 7)
        return m if m >= 1 else 0
    if ue >= 15:
        return 0x7E
    m = fm + ((bits >> 19) & 1)
    if m > 7:
        m, ue = 0, ue + 1
        if ue >= 15:
            return 0x7E
    return (ue << 3) | m


def ue4m3_value(u: int) -> F32:
    """ggml_ue4m3_to_fp32: half the UE4M3 value (bit 7 ignored; 0x00 and 0x7F are 0)."""
    if u in (0, 0x7F):
        return F32(0)
    E, M = (u >> 3) & 15, u & 7
    raw = math.ldexp(M, -9) if E == 0 else math.ldexp(1 + M / 8, E - 7)
    return F32(raw * 0.5)


def _amax(xs) -> F32:
    a = F32(0)
    for v in xs:
        if a < F32(abs(v)):
            a = F32(abs(v))
    return a


def encode_block(fmt_obj, x) -> tuple[bytes, dict]:
    x = [F32(v) for v in x]
    if fmt_obj.name == "mxfp4":
        amax = _amax(x)
        if amax > 0:
            l2 = F32(math.log2(float(amax)))
            e = (math.floor(l2) - 2 + 127) % 256  # x86-64 gcc's wrap where C is undefined
        else:
            l2, e = F32(-np.inf), 0
        d = e8m0_half(e)
        c = [best_index(v, d) for v in x]
        data = bytes([e] + [c[j] | (c[j + 16] << 4) for j in range(16)])
        return data, {"amax": amax, "log2amax": l2, "e": F32(e), "d": d}
    if fmt_obj.name == "nvfp4":
        us, qs, tr = [], [], {"amax": [], "s": [], "dd": []}
        for sb in range(4):
            xb = x[16 * sb : 16 * sb + 16]
            amax = _amax(xb)
            s = F32(amax / F32(6))
            u = ue4m3(s)
            dd = ue4m3_value(u)
            c = [best_index(v, dd) for v in xb]
            us.append(u)
            qs += [c[j] | (c[j + 8] << 4) for j in range(8)]
            tr["amax"].append(amax)
            tr["s"].append(s)
            tr["dd"].append(dd)
        return bytes(us + qs), {k: np.array(v, F32) for k, v in tr.items()}
    raise KeyError(fmt_obj.name)


def decode_block(fmt_obj, block: bytes) -> list:
    if fmt_obj.name == "mxfp4":
        d = e8m0_half(block[0])
        c = [b & 15 for b in block[1:17]] + [b >> 4 for b in block[1:17]]
        return [F32(F32(V[i]) * d) for i in c]
    out = []
    for sb in range(4):
        dd = ue4m3_value(block[sb])
        q = block[4 + 8 * sb : 12 + 8 * sb]
        out += [F32(F32(V[b & 15]) * dd) for b in q] + [F32(F32(V[b >> 4]) * dd) for b in q]
    return out
