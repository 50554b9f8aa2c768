"""Slow, obviously correct models of the formats (the stumpy ``tests/naive.py`` pattern).

Written from docs/formats.md one block and one value at a time with float32
scalars, sharing no code with ``tbq`` (not its packers, not its rotation, not
its fp16 conversion): if the library and these models agree on bytes and
bits, they agree because both follow the spec. Use them on a few blocks;
they are far too slow for bulk data.
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32


def fp16_bits(v) -> int:
    """fp16 bits of a float32 scalar by hand: round to nearest even, Inf at 65520 and above."""
    f = float(F32(v))
    sign = 0x8000 if math.copysign(1.0, f) < 0 else 0
    a = abs(f)
    if math.isnan(a):
        return sign | 0x7E00
    if a >= 65520.0:
        return sign | 0x7C00
    # scale to units of the fp16 spacing at a's binade (subnormal spacing 2**-24 below 2**-14)
    e = max(math.frexp(a)[1] - 1, -14) if a else -14
    unit = 2.0 ** (e - 10)
    q, r = divmod(a, unit)
    q = int(q)
    if r > unit / 2 or (r == unit / 2 and q % 2):
        q += 1
    if e == -14 and q < 1024:
        return sign | q  # subnormal (or the carry into the smallest normal, 1024 -> exponent 1)
    # normal: q in [1024, 2048]; a carry to 2048 moves to the next binade
    if q == 2048:
        q, e = 1024, e + 1
        if e > 15:
            return sign | 0x7C00
    return sign | ((e + 15) << 10) | (q - 1024)


def fp16_value(bits: int) -> F32:
    """The float32 value of fp16 bits, by hand."""
    sign = -1.0 if bits & 0x8000 else 1.0
    e = (bits >> 10) & 0x1F
    m = bits & 0x3FF
    if e == 0x1F:
        return F32(sign * (math.inf if m == 0 else math.nan))
    if e == 0:
        return F32(sign * m * 2.0**-24)
    return F32(sign * (1024 + m) * 2.0 ** (e - 25))


def roundf(v: F32) -> F32:
    """C roundf: half away from zero (non-finite values pass through)."""
    if not math.isfinite(v):
        return v
    t = F32(math.trunc(float(v)))
    frac = F32(v - t)
    if frac >= F32(0.5):
        return F32(t + F32(1))
    if frac <= F32(-0.5):
        return F32(t - F32(1))
    return t


def seq_sum_squares(v) -> F32:
    acc = F32(0)
    for a in v:
        acc = F32(acc + F32(F32(a) * F32(a)))
    return acc


def unpack_codes(fmt: str, payload: np.ndarray) -> list[int]:
    """Codes of one block's payload bytes by the layout of docs/formats.md."""
    q = [int(b) for b in payload]
    if fmt == "q8_0":
        return [b - 256 if b >= 128 else b for b in q]
    if fmt == "q4_0":
        return [b & 15 for b in q] + [b >> 4 for b in q]
    if fmt == "tbq4_0":
        out = []
        for b in q:
            out += [b & 15, b >> 4]
        return out
    if fmt == "tbq3_0":
        out = []
        for g in range(0, len(q), 3):
            lane = q[g] | (q[g + 1] << 8) | (q[g + 2] << 16)
            out += [(lane >> (3 * t)) & 7 for t in range(8)]
        return out
    raise KeyError(fmt)


def _le16(bits: int) -> list[int]:
    return [bits & 0xFF, bits >> 8]


# --- Q8_0 / Q4_0 ---------------------------------------------------------------


def encode_q8_0(x) -> tuple[bytes, F32]:
    x = [F32(v) for v in x]
    amax = F32(0)
    for v in x:
        amax = max(amax, F32(abs(v)))
    d = F32(amax / F32(127))
    inv = F32(F32(1) / d) if d != 0 else F32(0)
    codes = []
    for v in x:
        r = roundf(F32(v * inv))
        codes.append(int(r) & 0xFF if math.isfinite(r) else 0)
    return bytes(_le16(fp16_bits(d)) + codes), d


def encode_q4_0(x) -> tuple[bytes, F32]:
    x = [F32(v) for v in x]
    amax, m = F32(0), F32(0)  # ggml: max starts at +0 and changes only on a strictly larger |x|
    for v in x:
        if F32(abs(v)) > amax:
            amax, m = F32(abs(v)), v
    d = F32(m / F32(-8))
    inv = F32(F32(1) / d) if d != 0 else F32(0)
    q = []
    for v in x:
        t = F32(F32(v * inv) + F32(8.5))
        q.append(min(15, int(t)) if math.isfinite(t) else 0)
    half = len(x) // 2
    return bytes(_le16(fp16_bits(d)) + [q[j] | (q[j + half] << 4) for j in range(half)]), d


def decode_scalar(fmt: str, block: bytes) -> list[F32]:
    d = fp16_value(block[0] | (block[1] << 8))
    codes = unpack_codes(fmt, np.frombuffer(block[2:], np.uint8))
    off = 0 if fmt == "q8_0" else 8
    return [F32(F32(c - off) * d) for c in codes]


# --- TBQ -------------------------------------------------------------------------


def butterfly(v) -> list[F32]:
    """The spec's in-place Walsh-Hadamard butterfly on float32 scalars (no scale)."""
    v = [F32(a) for a in v]
    n, h = len(v), 1
    while h < n:
        for i in range(0, n, 2 * h):
            for j in range(i, i + h):
                a, b = v[j], v[j + h]
                v[j], v[j + h] = F32(a + b), F32(a - b)
        h *= 2
    return v


def encode_tbq(x, bits: int, centroids, thresholds, signs1, signs2) -> tuple[bytes, dict]:
    """TBQ4_0 (bits 4) / TBQ3_0 (bits 3), one block; returns (bytes, trace)."""
    x = [F32(v) for v in x]
    n = len(x)
    C = F32(1.0 / math.sqrt(n))
    eps = F32(1e-10)
    norm = F32(math.sqrt(seq_sum_squares(x)))  # sqrt of a float32 is correctly rounded either way
    if bits == 4:
        inv = F32(F32(1) / norm) if norm > eps else F32(0)
        u = [F32(v * inv) for v in x]
    else:
        norm = max(norm, eps)
        u = [F32(v / norm) for v in x]
    w = butterfly([F32(a * F32(s)) for a, s in zip(u, signs1, strict=True)])
    r = [F32(F32(a * C) * F32(s)) for a, s in zip(w, signs2, strict=True)]
    idx = [sum(1 for m in thresholds if v >= m) for v in r]
    recon = F32(math.sqrt(seq_sum_squares([centroids[i] for i in idx])))
    if bits == 4:
        d = F32(norm / recon) if recon > eps else norm
    else:
        d = F32(norm / max(recon, eps))
    if bits == 4:
        payload = [idx[2 * k] | (idx[2 * k + 1] << 4) for k in range(n // 2)]
    else:
        payload = []
        for g in range(n // 8):
            lane = 0
            for t in range(8):
                lane |= idx[8 * g + t] << (3 * t)
            payload += [lane & 0xFF, (lane >> 8) & 0xFF, lane >> 16]
    trace = {"norm": norm, "r": np.array(r, F32), "recon": recon, "d": d}
    return bytes(_le16(fp16_bits(d)) + payload), trace


def decode_tbq(block: bytes, fmt: str, centroids, signs1, signs2) -> list[F32]:
    d = fp16_value(block[0] | (block[1] << 8))
    idx = unpack_codes(fmt, np.frombuffer(block[2:], np.uint8))
    n = len(idx)
    C = F32(1.0 / math.sqrt(n))
    w = butterfly([F32(F32(centroids[i]) * F32(s)) for i, s in zip(idx, signs2, strict=True)])
    return [F32(F32(F32(a * C) * F32(s)) * d) for a, s in zip(w, signs1, strict=True)]


# --- dispatch ----------------------------------------------------------------------
#
# The models above cover the formats of tbq/formats/q8_0.py, q4_0.py and tbq.py.
# A format module tbq/formats/<module>.py may have its slow model in
# tests/naive_<module>.py, providing encode_block(fmt_obj, x) -> (bytes, trace)
# and decode_block(fmt_obj, block) -> list of float32; has_model finds it.


def _module_of(fmt_obj) -> str:
    return type(fmt_obj).__module__.rsplit(".", 1)[-1]


def _extra(fmt_obj):
    import importlib

    try:
        return importlib.import_module(f"naive_{_module_of(fmt_obj)}")
    except ModuleNotFoundError:
        return None


def encode_block(fmt_obj, x) -> tuple[bytes, dict]:
    """The naive model of ``fmt_obj`` (a :class:`tbq.formats.Format`) on one block: (bytes, trace)."""
    with np.errstate(all="ignore"):  # 1/d may overflow for tiny blocks, as in C
        return _encode_block(fmt_obj, x)


def _encode_block(fmt_obj, x):
    name = fmt_obj.name
    if name == "q8_0":
        b, d = encode_q8_0(x)
        return b, {"d": d}
    if name == "q4_0":
        b, d = encode_q4_0(x)
        return b, {"d": d}
    if name in ("tbq4_0", "tbq3_0"):
        t = fmt_obj.tables()
        return encode_tbq(
            x,
            fmt_obj.info.index_bits,
            [F32(c) for c in t["centroids"]],
            [F32(m) for m in t["thresholds"]],
            t["signs1"],
            t["signs2"],
        )
    mod = _extra(fmt_obj)
    if mod is None:
        raise KeyError(f"no naive model of {name}")
    return mod.encode_block(fmt_obj, x)


def decode_block(fmt_obj, block: bytes) -> list[F32]:
    name = fmt_obj.name
    if name in ("q8_0", "q4_0"):
        return decode_scalar(name, block)
    if name in ("tbq4_0", "tbq3_0"):
        t = fmt_obj.tables()
        return decode_tbq(block, name, [F32(c) for c in t["centroids"]], t["signs1"], t["signs2"])
    mod = _extra(fmt_obj)
    if mod is None:
        raise KeyError(f"no naive model of {name}")
    with np.errstate(all="ignore"):
        return mod.decode_block(fmt_obj, block)


def has_model(fmt_obj) -> bool:
    """True when this file or a tests/naive_<module>.py models the format."""
    return fmt_obj.name in ("q8_0", "q4_0", "tbq4_0", "tbq3_0") or _extra(fmt_obj) is not None


def naive_attention(q, K, V, scale):
    """Textbook attention in float64 with numpy's own reductions (a different code path)."""
    H, G = q.shape[0], K.shape[1]
    out = np.empty(q.shape)
    for h in range(H):
        g = h // (H // G)
        s = K[:, g, :] @ q[h].astype(np.float64) * scale
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ V[:, g, :]
    return out
