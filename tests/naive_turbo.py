"""Slow, obviously correct models of turbo2, turbo3 and turbo4 (one block, float32 scalars, loops).

Written from /work/shared/SPEC-turbo.md (sections 2-8) and docs/formats.md, "TURBO2 / TURBO3 / TURBO4",
sharing no code with ``tbq``: the tables come from the conformance copy
``tests/data/conformance/turbo/tables-turbo.json`` (not the package's), the rotation is the spec's
in-place butterfly written as loops (not :mod:`tbq.rotation`), the index is the C code's scan "first k
with r < t_k, else n - 1" (not the library's count), the bits are packed by the spec's formulas, and
fp16 goes through tests/naive.py's hand-written conversion. tests/naive.py dispatches here
(encode_block / decode_block).
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import numpy as np
from naive import fp16_bits, fp16_value

F32 = np.float32
TABLES = Path(__file__).parent / "data" / "conformance" / "turbo" / "tables-turbo.json"
#: CUDA/Vulkan's 4-bit thresholds that differ from the CPU's (SPEC §10, Q5), as C literals
CUDA_4BIT = {"-0.145560f": "-0.145561f", "0.145560f": "0.145561f", "-0.013963f": "-0.013964f", "0.013963f": "0.013964f"}


def literal_f32(lit: str) -> F32:
    """The float32 a C compiler makes of a decimal literal such as ``"0.145561f"``: the nearest float32 to the
    exact decimal (ties to even), found with exact rational arithmetic."""
    from fractions import Fraction

    v = Fraction(lit.rstrip("f"))
    f = F32(float(v))
    cands = [np.nextafter(f, F32(-1)), f, np.nextafter(f, F32(1))]
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - v), int(np.array(c).view(np.uint32)) & 1))


@cache
def tables() -> dict:
    """name -> list of np.float32 scalars (from the raw bits), plus the C literals under ``<name>_literal``."""
    raw = json.loads(TABLES.read_text())["tables"]
    out = {}
    for key, entry in raw.items():
        out[key] = [np.uint32(int(b, 16)).view(F32) for b in entry["float32_bits"]]
        out[key + "_literal"] = entry["c_literal"]
    return out


def tables_of(fmt_obj) -> tuple[list[F32], list[F32]]:
    """(centroids, thresholds) of a turbo format instance, its ``thresholds`` option applied."""
    bits = fmt_obj.info.index_bits
    t = tables()
    C = t[f"turbo{bits}_centroids"]
    thr = t[f"turbo{bits}_thresholds"]
    if fmt_obj.config().get("thresholds") == "cuda":
        thr = [literal_f32(CUDA_4BIT.get(lit, lit)) for lit in t[f"turbo{bits}_thresholds_literal"]]
    return C, thr


def rotate(u: list[F32]) -> list[F32]:
    """SPEC §5: v * s1, the in-place butterfly (h = 1 .. 64), then v * fl(INV * s2)."""
    t = tables()
    s1, s2, inv = t["wht_signs1"], t["wht_signs2"], t["inv_sqrt_128"][0]
    v = [F32(u[j] * s1[j]) for j in range(128)]
    h = 1
    while h < 128:
        for i in range(0, 128, 2 * h):
            for j in range(i, i + h):
                a, b = v[j], v[j + h]
                v[j], v[j + h] = F32(a + b), F32(a - b)
        h *= 2
    return [F32(v[j] * F32(inv * s2[j])) for j in range(128)]


def index(r: F32, thr: list[F32]) -> int:
    """SPEC §6 step 4: the first k with r < t_k; if there is none, n - 1."""
    for k, t in enumerate(thr):
        if r < t:
            return k
    return len(thr)


def encode_block(fmt_obj, x) -> tuple[bytes, dict]:
    bits = fmt_obj.info.index_bits
    C, thr = tables_of(fmt_obj)
    eps = tables()["eps"][0]
    x = [F32(v) for v in np.asarray(x, F32)]
    ss = F32(0)
    for v in x:  # 1. norm
        ss = F32(ss + F32(v * v))
    norm = F32(math.sqrt(ss)) if not math.isnan(ss) else ss
    if norm > eps:  # 2. normalise (a product with the float32 reciprocal)
        inv = F32(F32(1) / norm)
        u = [F32(v * inv) for v in x]
    elif bits == 4:
        u = [F32(0)] * 128
    else:
        u = [F32(v * F32(0)) for v in x]
    r = rotate(u)  # 3.
    idx = [index(v, thr) for v in r]  # 4.
    rs = F32(0)
    for i in idx:  # 5.
        rs = F32(rs + F32(C[i] * C[i]))
    recon = F32(math.sqrt(rs))
    d = F32(norm / recon) if recon > eps else norm  # 6.
    h = fp16_bits(d)
    out = [h & 0xFF, h >> 8]  # 7. store
    if bits == 2:
        out += [sum(idx[4 * k + t] << (2 * t) for t in range(4)) for k in range(32)]
    elif bits == 3:
        out += [sum((idx[4 * k + t] & 3) << (2 * t) for t in range(4)) for k in range(32)]
        out += [sum(((idx[8 * m + t] >> 2) & 1) << t for t in range(8)) for m in range(16)]
    else:
        out += [0, 0]  # rnorm = fp16 +0
        out += [idx[2 * k] | (idx[2 * k + 1] << 4) for k in range(64)]
    return bytes(out), {"norm": norm, "r": r, "recon": recon, "d": d}


def decode_block(fmt_obj, block: bytes) -> list[F32]:
    """SPEC §7: y_j = fl(C[idx_j] * D), D the fp16 norm; no inverse rotation."""
    bits = fmt_obj.info.index_bits
    C, _ = tables_of(fmt_obj)
    q = list(block)
    D = fp16_value(q[0] | (q[1] << 8))
    if bits == 2:
        idx = [(q[2 + (j >> 2)] >> (2 * (j & 3))) & 3 for j in range(128)]
    elif bits == 3:
        idx = [
            ((q[2 + (j >> 2)] >> (2 * (j & 3))) & 3) | (((q[34 + (j >> 3)] >> (j & 7)) & 1) << 2) for j in range(128)
        ]
    else:
        idx = [(q[4 + (j >> 1)] >> (4 * (j & 1))) & 15 for j in range(128)]
    return [F32(C[i] * D) for i in idx]
