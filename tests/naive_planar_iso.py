"""Slow, obviously correct models of planar3_0, iso3_0, planar4_0 and iso4_0 (one block, float32 scalars).

Written from the spec (docs/formats.md, "PLANAR3_0 / ISO3_0 / PLANAR4_0 / ISO4_0")
and sharing no code with ``tbq``: the tables come from the conformance copy
``tests/data/conformance/tables-planar-iso.json`` (not the package's
``tbq/data/planar_iso.json``), the index is the C code's literal
nearest-centroid scan (not the library's threshold count), the bits are packed
by the spec's formula, and the decoder's quaternion step is the C code's
``quat_mul`` called with the negated (x, y, z), not the library's expanded
lines. tests/naive.py dispatches here (encode_block / decode_block).
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import numpy as np
from naive import fp16_bits, fp16_value

F32 = np.float32
TABLES = Path(__file__).parent / "data" / "conformance" / "tables-planar-iso.json"


@cache
def tables() -> dict:
    """name -> list of np.float32 scalars, read from the raw bits."""
    raw = json.loads(TABLES.read_text())
    out = {}
    for key, entry in raw.items():
        if isinstance(entry, dict) and "float32_bits" in entry:
            out[key] = [np.uint32(int(b, 16)).view(F32) for b in entry["float32_bits"]]
    return out


def kind(name: str) -> tuple[str, int]:
    """("planar" | "iso", bits) of a format name."""
    fam, bits = {"planar3_0": ("planar", 3), "iso3_0": ("iso", 3), "planar4_0": ("planar", 4), "iso4_0": ("iso", 4)}[
        name
    ]
    return fam, bits


def nearest(r: F32, C) -> int:
    """The C loop: the first i minimising |fl(r - C[i])|, scanning upward with a strict <."""
    best, be = 0, F32(abs(F32(r - C[0])))
    for i in range(1, len(C)):
        e = F32(abs(F32(r - C[i])))
        if e < be:
            best, be = i, e
    return best


def givens(c: F32, s: F32, a: F32, b: F32) -> tuple[F32, F32]:
    """(c*a - s*b, s*a + c*b), every product and sum rounded."""
    return F32(F32(c * a) - F32(s * b)), F32(F32(s * a) + F32(c * b))


def quat_mul(w: F32, x: F32, y: F32, z: F32, u) -> list[F32]:
    """The Hamilton product (w + xi + yj + zk)(u0 + u1 i + u2 j + u3 k), each line left to right."""
    u0, u1, u2, u3 = u
    return [
        F32(F32(F32(F32(w * u0) - F32(x * u1)) - F32(y * u2)) - F32(z * u3)),
        F32(F32(F32(F32(w * u1) + F32(x * u0)) + F32(y * u3)) - F32(z * u2)),
        F32(F32(F32(F32(w * u2) - F32(x * u3)) + F32(y * u0)) + F32(z * u1)),
        F32(F32(F32(F32(w * u3) + F32(x * u2)) - F32(y * u1)) + F32(z * u0)),
    ]


def seq_sum_squares(v) -> F32:
    acc = F32(0)
    for a in v:
        acc = F32(acc + F32(a * a))
    return acc


def pack(idx, bits: int) -> list[int]:
    if bits == 4:
        return [idx[2 * k] | (idx[2 * k + 1] << 4) for k in range(len(idx) // 2)]
    qs, signs = [0] * (len(idx) // 4), [0] * (len(idx) // 8)
    for j, i in enumerate(idx):
        qs[j >> 2] |= (i & 3) << (2 * (j & 3))
        signs[j >> 3] |= ((i >> 2) & 1) << (j & 7)
    return qs + signs


def unpack(payload: bytes, bits: int) -> list[int]:
    if bits == 4:
        out = []
        for b in payload:
            out += [b & 15, b >> 4]
        return out
    qs, signs = payload[:32], payload[32:48]
    return [((qs[j >> 2] >> (2 * (j & 3))) & 3) | (((signs[j >> 3] >> (j & 7)) & 1) << 2) for j in range(128)]


def encode_block(fmt_obj, x) -> tuple[bytes, dict]:
    fam, bits = kind(fmt_obj.name)
    t = tables()
    C = t[f"centroids_{bits}bit"]
    eps = t["eps_1e-10f"][0]
    x = [F32(v) for v in x]
    n = len(x)
    norm = F32(math.sqrt(seq_sum_squares(x)))  # sqrt of a float32 in double, rounded once: correctly rounded
    inv = F32(F32(1) / norm) if norm > eps else F32(0)
    u = [F32(v * inv) for v in x]
    r = []
    if fam == "planar":
        for p in range(n // 2):
            r += givens(t["givens_cos"][p], t["givens_sin"][p], u[2 * p], u[2 * p + 1])
    else:
        for g in range(n // 4):
            r += quat_mul(t["quat_w"][g], t["quat_x"][g], t["quat_y"][g], t["quat_z"][g], u[4 * g : 4 * g + 4])
    idx = [nearest(v, C) for v in r]
    recon = F32(math.sqrt(seq_sum_squares([C[i] for i in idx])))
    d = F32(norm / recon) if recon > eps else norm
    h = fp16_bits(d)
    trace = {"norm": norm, "r": np.array(r, F32), "recon": recon, "d": d}
    return bytes([h & 0xFF, h >> 8] + pack(idx, bits)), trace


def decode_block(fmt_obj, block: bytes) -> list[F32]:
    fam, bits = kind(fmt_obj.name)
    t = tables()
    C = t[f"centroids_{bits}bit"]
    D = fp16_value(block[0] | (block[1] << 8))
    v = [C[i] for i in unpack(bytes(block[2:]), bits)]
    n = len(v)
    f = []
    if fam == "planar":
        for p in range(n // 2):
            c, s = t["givens_cos"][p], t["givens_sin"][p]
            q0, q1 = v[2 * p], v[2 * p + 1]
            f += [F32(F32(c * q0) + F32(s * q1)), F32(F32(F32(-s) * q0) + F32(c * q1))]
    else:
        for g in range(n // 4):  # the C code: quat_mul with the conjugate (w, -x, -y, -z)
            w, x, y, z = t["quat_w"][g], t["quat_x"][g], t["quat_y"][g], t["quat_z"][g]
            f += quat_mul(w, F32(-x), F32(-y), F32(-z), v[4 * g : 4 * g + 4])
    return [F32(a * D) for a in f]
