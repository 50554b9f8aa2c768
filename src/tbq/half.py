"""IEEE binary16 (fp16) scales: float32 -> fp16 bits and back.

The NumPy path uses ``astype(np.float16)``, which rounds to nearest with ties
to even, produces subnormals and signed zero, and overflows to +-Inf at and
above 65520 (the same as F16C and the C reference). Decoding goes through a
65,536-entry float32 table, which is exact for every bit pattern (NaN payloads
included) and is what the numba kernels read too.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["f32_to_f16_bits", "f16_bits_to_f32", "f16_table", "F16_MAX", "F16_OVERFLOW"]

#: Largest finite fp16 value.
F16_MAX = 65504.0
#: Smallest float32 magnitude that rounds to fp16 infinity.
F16_OVERFLOW = 65520.0


def f32_to_f16_bits(x: ArrayLike) -> NDArray[np.uint16]:
    """fp16 bit patterns (uint16) of float32 values, round to nearest even."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


@functools.cache
def f16_table() -> NDArray[np.float32]:
    """float32 value of every fp16 bit pattern (index = the uint16 bits)."""
    t = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    t.setflags(write=False)
    return t


def f16_bits_to_f32(bits: ArrayLike) -> NDArray[np.float32]:
    """float32 values of fp16 bit patterns (exact)."""
    return f16_table()[np.asarray(bits, dtype=np.uint16)]
