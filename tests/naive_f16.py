"""Slow models of F16 and BF16 (tbq/formats/f16.py), one value at a time, written from docs/formats.md.

Python integers and floats only; nothing from tbq. ``encode_block`` takes a
block of one value and returns ``(2 bytes, {"v": [x]})``.
"""

from __future__ import annotations

import math
import struct

import numpy as np
from naive import fp16_bits

F32 = np.float32


def f32_bits(v) -> int:
    return struct.unpack("<I", struct.pack("<f", float(F32(v))))[0]


def bits_f32(u: int) -> F32:
    return np.array([u], np.uint32).view(np.float32)[0]


def bf16_bits(v) -> int:
    """ggml_compute_fp32_to_bf16 on the float32 pattern, in Python integers."""
    u = f32_bits(v)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 0x0040
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def f16_to_f32_bits(h: int) -> int:
    """ggml_compute_fp16_to_fp32 as float32 bits: exact widening, NaNs come out quiet (bit 22 set)."""
    sign = (h & 0x8000) << 16
    e, m = (h >> 10) & 0x1F, h & 0x3FF
    if e == 0x1F:
        return sign | 0x7F800000 | ((0x400000 | (m << 13)) if m else 0)
    if e == 0:
        if m == 0:
            return sign
        return sign | f32_bits(m * 2.0**-24)  # subnormal fp16: exact in float32
    return sign | ((e - 15 + 127) << 23) | (m << 13)


def encode_block(fmt_obj, x):
    (v,) = [F32(a) for a in x]
    h = fp16_bits(v) if fmt_obj.name == "f16" else bf16_bits(v)
    assert not math.isnan(v)
    return bytes([h & 0xFF, h >> 8]), {"v": [v]}


def decode_block(fmt_obj, block: bytes):
    h = block[0] | (block[1] << 8)
    u = f16_to_f32_bits(h) if fmt_obj.name == "f16" else h << 16
    return [bits_f32(u)]
