"""Slow models of vLLM's TurboQuant key and value quantizers (tbq/formats/vllm_turboquant.py), one vector at a time.

Written from the specification (docs/formats-vllm.md, the SPEC's sections 2, 4 and 5.1) with Python
floats, float32 scalars and exact rationals (``fractions.Fraction``), sharing no code with tbq: not its
rotation (the Sylvester matrix is ``(-1)**popcount(i & j)`` here), not its packers, not its fp16 conversion
(tests/naive.py's). The canonical sums are exact: the norm's float64 sum is ``math.fsum`` (correctly
rounded), the rotation is the exact rational sum rounded once to float32, the decoder's un-rotation the exact
rational sum rounded once to fp16. From tbq it takes only the instance's options and its centroid table
(tested against the SPEC's own tables separately).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from naive import fp16_bits, fp16_value

F32 = np.float32


def _rn(fr: Fraction, mant_bits: int, min_exp: int, max_finite: Fraction) -> Fraction | float:
    """An exact zero is +0 (an exact sum of mixed signs, as a GEMM's accumulator from +0 gives).

    ``fr`` rounded to nearest, ties to even, on a binary grid with ``mant_bits`` significant bits and smallest
    exponent ``min_exp`` (the spacing of the subnormals is ``2**(min_exp - mant_bits + 1)``); inf beyond."""
    if fr == 0:
        return Fraction(0)
    sign = -1 if fr < 0 else 1
    a = abs(fr)
    e = min_exp
    while a >= Fraction(2) ** (e + 1):
        e += 1
    step = Fraction(2) ** (e - mant_bits + 1)
    n, rem = divmod(a, step)
    n = int(n)
    if rem > step / 2 or (rem == step / 2 and n % 2):
        n += 1
    r = n * step
    if r > max_finite:
        return sign * math.inf
    if r == 0:
        return math.copysign(0.0, sign)  # a non-zero value rounded to zero keeps its sign
    return sign * r


def rn32(fr: Fraction) -> F32:
    """The float32 nearest to a rational (ties to even)."""
    r = _rn(fr, 24, -126, Fraction(F32(3.4028235e38).item()))
    return F32(float(r))


def rn16(fr: Fraction) -> F32:
    """The fp16 value nearest to a rational (ties to even; 65520 and beyond is inf), as float32."""
    r = _rn(fr, 11, -14, Fraction(65504))
    if isinstance(r, float):
        return F32(r)
    return F32(fp16_value(fp16_bits(F32(float(r)))))


def rn16_f32(v: F32) -> F32:
    """RN16 of a float32 (NaN as the fp16 NaN 0x7FFF)."""
    if math.isnan(v):
        return fp16_value(0x7FFF)
    return fp16_value(fp16_bits(v))


def sylvester(i: int, j: int) -> int:
    return -1 if bin(i & j).count("1") % 2 else 1


def h_of(d: int) -> F32:
    return F32(F32(1.0) / F32(math.sqrt(d)))


def signs_of(fmt) -> list[int]:
    """PR #38479's signs: bit 0 of MT19937's 32-bit outputs, seeded 42 + 1337 * layer (numpy's RandomState)."""
    cfg = fmt.config()
    d = cfg["head_dim"]
    if cfg["rotation"] == "hadamard":
        return [1] * d
    rs = np.random.RandomState(42 + 1337 * cfg["layer"])
    return [2 * (int(u) & 1) - 1 for u in rs.randint(0, 2**32, size=d, dtype=np.uint64)]


def pack_stream(codes: list[int], bits: int) -> bytes:
    """LSB-first bit stream: code i in bits [bits*i, bits*i + bits)."""
    out = bytearray(len(codes) * bits // 8)
    for i, c in enumerate(codes):
        for k in range(bits):
            if (c >> k) & 1:
                pos = bits * i + k
                out[pos // 8] |= 1 << (pos % 8)
    return bytes(out)


def unpack_stream(raw: bytes, bits: int, n: int) -> list[int]:
    return [sum(((raw[(bits * i + k) // 8] >> ((bits * i + k) % 8)) & 1) << k for k in range(bits)) for i in range(n)]


def f16_bytes(v: F32) -> bytes:
    return int(fp16_bits(v)).to_bytes(2, "little")


def f16_at(block: bytes, off: int) -> F32:
    return fp16_value(int.from_bytes(block[off : off + 2], "little"))


# --- keys ---------------------------------------------------------------------------------------


def encode_key(fmt, x) -> tuple[bytes, dict]:
    d = len(x)
    bits = fmt.info.index_bits
    k = [F32(v) for v in x]
    n = F32(math.sqrt(math.fsum(float(v) * float(v) for v in k)))
    den = F32(n + F32(1e-8))
    xh = [F32(v / den) for v in k]
    s = signs_of(fmt)
    h = Fraction(float(h_of(d)))
    y = [rn32(sum(Fraction(float(xh[i])) * s[i] * sylvester(i, j) for i in range(d)) * h) for j in range(d)]
    c = [F32(v) for v in fmt.tables()["centroids"]]
    m = [F32(F32(c[i] + c[i + 1]) / F32(2)) for i in range(len(c) - 1)]
    idx = [sum(1 for t in m if yj >= t) for yj in y]
    block = pack_stream(idx, bits) + f16_bytes(n)
    return block, {"norm": n, "d": n, "r": np.array(y, F32)}


def nc_sum(a: list[F32]) -> F32:
    """The SPEC's fixed order (numpy's pairwise): 8 partial sums p_k = a_k + a_{k+8} + ... per 128 values,
    ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)); longer vectors: the two halves so, then added."""
    if len(a) > 128:
        half = len(a) // 2
        return F32(nc_sum(a[:half]) + nc_sum(a[half:]))
    p = list(a[:8])
    for i in range(8, len(a)):
        p[i % 8] = F32(p[i % 8] + a[i])
    return F32(F32(F32(p[0] + p[1]) + F32(p[2] + p[3])) + F32(F32(p[4] + p[5]) + F32(p[6] + p[7])))


def decode_key_rotated(fmt, block: bytes) -> list[F32]:
    d = fmt.info.block_size
    bits = fmt.info.index_bits
    mb = d * bits // 8
    cent = [F32(v) for v in fmt.tables()["centroids"]]
    c = [cent[i] for i in unpack_stream(block[:mb], bits, d)]
    s = nc_sum([F32(v * v) for v in c])
    r = F32(F32(1.0) / F32(math.sqrt(F32(s + F32(1e-16)))))
    nf = f16_at(block, mb)
    return [rn16_f32(F32(nf * F32(v * r))) for v in c]


def decode_key(fmt, block: bytes) -> list[F32]:
    d = fmt.info.block_size
    yr = decode_key_rotated(fmt, block)
    s = signs_of(fmt)
    h16 = Fraction(float(np.float16(h_of(d))))
    if not all(math.isfinite(v) for v in yr):  # arbitrary bytes: the sum of signed infinities, as IEEE has it
        out = []
        for j in range(d):
            terms = {math.copysign(1.0, float(yr[i]) * sylvester(i, j) * s[j]) for i in range(d) if math.isinf(yr[i])}
            nan = any(math.isnan(v) for v in yr) or len(terms) > 1
            out.append(rn16_f32(F32(math.nan if nan else terms.pop() * math.inf)))
        return out
    return [rn16(sum(Fraction(float(yr[i])) * sylvester(i, j) for i in range(d)) * s[j] * h16) for j in range(d)]


# --- values -------------------------------------------------------------------------------------


def encode_value(fmt, x) -> tuple[bytes, dict]:
    bits = fmt.info.index_bits
    q = (1 << bits) - 1
    v = [F32(a) for a in x]
    vmin, vmax = v[0], v[0]
    for a in v:  # the first of equal extremes (+0 / -0: the first one)
        if a < vmin:
            vmin = a
        if a > vmax:
            vmax = a
    scale = F32(F32(vmax - vmin) / F32(q))
    if not scale > F32(1e-8):
        scale = F32(1e-8)
    quot = [F32(F32(a - vmin) / scale) for a in v]
    t = [F32(a + F32(0.5)) for a in quot]
    codes = [min(max(math.trunc(float(a)), 0), q) if math.isfinite(a) else 0 for a in t]
    block = pack_stream(codes, bits) + f16_bytes(scale) + f16_bytes(vmin)
    return block, {"d": scale, "m": vmin, "v": np.array(quot, F32), "t": np.array(t, F32)}


def decode_value(fmt, block: bytes) -> list[F32]:
    d = fmt.info.block_size
    bits = fmt.info.index_bits
    vdb = d * bits // 8
    sc, z = f16_at(block, vdb), f16_at(block, vdb + 2)
    return [rn16_f32(F32(F32(F32(c) * sc) + z)) for c in unpack_stream(block[:vdb], bits, d)]


# --- tests/naive.py's interface -------------------------------------------------------------------


def encode_block(fmt, x) -> tuple[bytes, dict]:
    return encode_key(fmt, x) if fmt.info.rotated else encode_value(fmt, x)


def decode_block(fmt, block: bytes) -> list[F32]:
    return decode_key(fmt, block) if fmt.info.rotated else decode_value(fmt, block)
