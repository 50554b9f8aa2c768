"""Slow models of FP8_E4M3 and FP8_E5M2 (tbq/formats/fp8.py), one value at a time, written from docs/formats.md.

Exact rational arithmetic (``fractions.Fraction``) on the FP8 grid, nothing
from tbq but the format's ``scale``: the quotient ``v = x / s`` is the one
float32 division of the spec (numpy's float32 ``/``), then ``v`` is rounded to
the nearest grid value, ties to the even code, with the exponent unbounded
above; a result beyond the largest finite value overflows.
``encode_block(fmt, x)`` stores the non-saturating result on overflow (what
``Format.encode`` stores); ``saturate=True`` the largest finite value.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

F32 = np.float32

#: name -> (mantissa bits, exponent bias, largest finite magnitude code, non-saturating overflow code, has inf)
GRIDS = {"fp8_e4m3": (3, 7, 0x7E, 0x7F, False), "fp8_e5m2": (2, 15, 0x7B, 0x7C, True)}


def value(name: str, code: int) -> Fraction | float:
    """The exact value of an FP8 byte (a Fraction, or inf/nan as floats)."""
    m, bias, _, _, has_inf = GRIDS[name]
    sign = -1 if code & 0x80 else 1
    e, mant = (code >> m) & ((1 << (7 - m)) - 1), code & ((1 << m) - 1)
    top = (1 << (7 - m)) - 1
    if has_inf and e == top:
        return sign * float("inf") if mant == 0 else float("nan")
    if not has_inf and (code & 0x7F) == 0x7F:
        return float("nan")
    if e == 0:
        return sign * Fraction(mant, 1 << m) * Fraction(2) ** (1 - bias)
    return sign * (1 + Fraction(mant, 1 << m)) * Fraction(2) ** (e - bias)


def round_code(name: str, v: F32, saturate: bool) -> int:
    m, bias, max_code, nosat_code, _ = GRIDS[name]
    sign = 0x80 if np.signbit(v) else 0
    if np.isinf(v):
        return sign | (max_code if saturate else nosat_code)
    a = abs(Fraction(float(v)))
    # exponent of a's binade, at least the smallest normal exponent
    e = 1 - bias
    while a >= Fraction(2) ** (e + 1):
        e += 1
    step = Fraction(2) ** (e - m)
    n, rem = divmod(a, step)
    n = int(n)
    if rem > step / 2 or (rem == step / 2 and n % 2 == 1):
        n += 1
    r = n * step
    if r > value(name, max_code):
        return sign | (max_code if saturate else nosat_code)
    # the code of r: search the grid (slow and plain)
    for c in range(max_code + 1):
        if value(name, c) == r:
            return sign | c
    raise AssertionError((name, v, r))  # pragma: no cover


def encode_block(fmt_obj, x, saturate: bool = False):
    (xv,) = np.asarray(x, np.float32).reshape(-1)
    with np.errstate(all="ignore"):
        v = F32(xv) / F32(fmt_obj.scale)
    return bytes([round_code(fmt_obj.name, v, saturate)]), {"v": [v]}


def decode_block(fmt_obj, block: bytes):
    val = value(fmt_obj.name, block[0])
    if isinstance(val, float) and np.isnan(val):
        return [np.array([0x7FFFFFFF], np.uint32).view(np.float32)[0]]
    mag = F32(abs(float(val)))
    with np.errstate(all="ignore"):
        return [(-mag if block[0] & 0x80 else mag) * F32(fmt_obj.scale)]  # -0 keeps its sign
