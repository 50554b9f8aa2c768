"""Slow model of F32 (tbq/formats/f32.py), one value at a time, written from docs/formats.md, "F32".

Python integers only; nothing from tbq. ``encode_block`` takes a block of one
value and returns ``(4 bytes, {"v": [x]})``: the little-endian bytes of the
value's float32 bit pattern; ``decode_block`` reads the pattern back.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def f32_bits(v) -> int:
    """The float32 bit pattern of ``v`` as a Python integer (a view, never a float conversion)."""
    return int(np.array([v], np.float32).view(np.uint32)[0])


def encode_block(fmt_obj, x):
    (v,) = [F32(a) for a in x]
    return f32_bits(v).to_bytes(4, "little"), {"v": [v]}


def decode_block(fmt_obj, block: bytes):
    return [np.array([int.from_bytes(block[:4], "little")], np.uint32).view(np.float32)[0]]
