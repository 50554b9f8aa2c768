"""F16 and BF16 (ggml): one 16-bit float per value, 2 bytes, no scale.

docs/formats.md, "F16 / BF16". A "block" is one value (block size 1):
value ``i`` of a row is the little-endian 16-bit word at byte ``2i``.

- **F16** encode ``h = fp16(x)``: round to nearest, ties to even, subnormals
  and signed zero kept, ``|x| >= 65520`` -> +-inf (``0x7C00``/``0xFC00``).
  Decode is the exact widening, except that the C routine builds normal
  values with a float multiply by 2**-112, so a signalling fp16 NaN comes out
  *quieted* (``0x7C01`` -> ``0x7FC02000``; numpy's cast gives ``0x7F802000``).
- **BF16** encode on the float32 bit pattern ``u``:
  ``h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16`` (round to nearest even on the
  bits; subnormals rounded, not flushed; ``0x7F7FFFFF`` -> ``0x7F80`` = inf),
  NaN -> ``(u >> 16) | 0x0040``. Decode ``bits = h << 16``, exact for every pattern.

A finite value that rounds to infinity is refused (``ScaleOverflowError``
naming the value's index) unless ``on_overflow="inf"``, which stores +-inf
as the C code does.

>>> F16().encode(np.float32([1.0, -0.0, 65519.0, 1e-8])).view("<u2").tolist()
[15360, 32768, 31743, 0]
>>> [hex(h) for h in BF16().encode(np.float32([1.0, 1.00390625, 1.01171875])).view("<u2")]  # ties to even
['0x3f80', '0x3f80', '0x3f82']
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..errors import ScaleOverflowError
from ..half import f16_table
from .base import Field, Format, FormatInfo, Trace, band
from .capabilities import AttentionTraits, CapabilitySlot

F32 = np.float32

#: |x| bit patterns at and above these round to infinity (finite inputs):
#: 65520 = 0x477FF000 (the fp16 tie above 65504, which rounds to even = inf);
#: 0x7F7F8000 (the bf16 tie above 0x7F7F, whose last kept bit is odd).
F16_OVERFLOW_BITS = 0x477FF000
BF16_OVERFLOW_BITS = 0x7F7F8000


@functools.cache
def f16_decode_table() -> NDArray[np.uint32]:
    """float32 bit patterns (uint32) of ggml's fp16 -> fp32 for all 2**16 fp16 patterns.

    The exact widening (:func:`tbq.half.f16_table`), with one quirk of
    ``ggml_compute_fp16_to_fp32``: NaNs come out quiet (bit 22 set), because
    the C code multiplies the rebiased pattern by 2**-112 and x86 quiets a
    signalling NaN operand. Quiet NaNs and every other pattern are unchanged.
    """
    t = f16_table().view(np.uint32).copy()
    nan = (t & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    t[nan] |= np.uint32(0x00400000)
    t.setflags(write=False)
    return t


def bf16_bits(x: ArrayLike) -> NDArray[np.uint16]:
    """bf16 bit patterns (uint16) of float32 values by ggml's rule (``ggml_compute_fp32_to_bf16``)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    h = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():  # forced quiet, payload's upper bits kept (the sum above may have carried: recompute)
        h = np.where(nan, (u >> np.uint32(16)) | np.uint32(0x0040), h)
    return h.astype(np.uint16)


def _f16_code(y: NDArray[np.float64]) -> NDArray[np.float16]:
    """fp16 rounding of float64 values (monotone; the fragility code function)."""
    with np.errstate(over="ignore"):
        return np.asarray(y, np.float64).astype(np.float16)


def _bf16_code(y: NDArray[np.float64]) -> NDArray[np.float64]:
    """bf16 rounding (8 significant bits, ties to even, bf16 subnormal step 2**-133) of float64 values."""
    y = np.asarray(y, np.float64)
    _, e = np.frexp(y)  # y = m * 2**e, 0.5 <= |m| < 1
    step = np.ldexp(1.0, np.maximum(e, -125) - 8)  # 2**-125 * 0.5 = 2**-126, the smallest normal bf16
    return np.rint(y / step) * step


class _Half(Format):
    """Shared body of F16 and BF16: block size 1, no scale, a refusal for values that round to infinity."""

    _overflow_bits: ClassVar[int] = 0
    _type_name: ClassVar[str] = ""  #: "float16" / "bfloat16", for messages
    _limit: ClassVar[str] = ""  #: the largest finite value, for messages

    kernel_module = "tbq.formats.f16_kernels"

    def _code(self, y: NDArray[np.float64]) -> NDArray[Any]:
        """The type's rounding of float64 values (monotone; the fragility code function)."""
        raise NotImplementedError

    def _bits(self, x: NDArray[np.float32]) -> NDArray[np.uint16]:
        """The 16-bit patterns of the float32 values ``x`` (the type's rounding)."""
        raise NotImplementedError

    def _values(self, h: NDArray[np.uint16]) -> NDArray[np.float32]:
        """float32 values of the 16-bit patterns ``h``."""
        raise NotImplementedError

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        out = np.ascontiguousarray(self._bits(x).astype("<u2")).view(np.uint8).reshape(x.shape[0], 2)
        return out, {"v": x.copy()}

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        return self._values(np.ascontiguousarray(data).view("<u2").reshape(-1)).reshape(-1, 1)

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        decode = getattr(self.kernels(), f"decode_{self.name}")
        decode(data.view("<u2").reshape(-1), out.view(np.uint32).reshape(-1))

    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # v = x itself: fragile when a k-ulp change of x crosses a rounding midpoint of the 16-bit type.
        return band(self._code, trace["v"], k)

    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        # x is (n, 1) float32 and out (n, 2) uint8, both C-contiguous: the kernel runs over the flat
        # values and writes little-endian 16-bit words ("<u2": a big-endian host gets a numba type
        # error, never wrong bytes).
        encode = getattr(self.kernels(), f"encode_{self.name}")
        return encode(x.reshape(-1), out.view("<u2").reshape(-1), raise_overflow)

    def scale_overflows(self, trace: Trace) -> NDArray[np.bool_]:
        """bool (values,): values that round to +-inf (there is no scale: the value itself overflows)."""
        a = np.asarray(trace["v"], np.float32).reshape(-1).view(np.uint32) & np.uint32(0x7FFFFFFF)
        return a >= np.uint32(self._overflow_bits)  # NaN never reaches the encoder (the codec refuses it)

    def encode_error(self, status: int, block: int, values: NDArray[np.float32]) -> Exception:
        v = float(np.float32(values[0]))
        return ScaleOverflowError(
            f"{self.name}: value {block} is {v!r}, which does not fit {self._type_name} (it rounds to "
            f"{'-' if v < 0 else '+'}inf; the largest finite {self._type_name} is {self._limit}). "
            "Pass on_overflow='inf' to store what the C reference stores (an infinity)",
            block=block,
            scale=v,
        )

    def fragile_scales(self, trace: Trace, k: int) -> NDArray[np.bool_]:
        # No scale: nothing but the value itself is rounded.
        return np.zeros(np.asarray(trace["v"]).shape[0], bool)

    def fields(self, data: ArrayLike) -> dict[str, NDArray[Any]]:
        blocks = self._blocks(data)
        return {"v": self._values(np.ascontiguousarray(blocks).view("<u2")[..., 0])}


def _info(name: str, *, code: int, description: str, value: str) -> FormatInfo:
    """The table row of a 16-bit float type ``name``: one value a block, its 2 bytes described by ``value``."""
    return FormatInfo(
        name=name,
        block_size=1,
        index_bits=16,
        description=description,
        code=code,
        layout=(Field("v", 0, 2, name, value),),
    )


class F16(_Half):
    info = _info(
        "f16", code=5, description="IEEE binary16 per value (ggml F16)", value="fp16(x), round to nearest even"
    )
    attention = CapabilitySlot(AttentionTraits, read="attention_read_f16")
    _overflow_bits = F16_OVERFLOW_BITS
    _type_name = "float16"
    _limit = "65504"

    def _code(self, y: NDArray[np.float64]) -> NDArray[Any]:
        return _f16_code(y)

    def _bits(self, x: NDArray[np.float32]) -> NDArray[np.uint16]:
        # numpy's cast rounds to nearest even with subnormals and overflow at 65520, exactly
        # ggml_compute_fp32_to_fp16 for every non-NaN input (NaN never reaches the encoder).
        with np.errstate(over="ignore"):
            return x.astype(np.float16).view(np.uint16)

    def _values(self, h: NDArray[np.uint16]) -> NDArray[np.float32]:
        return f16_decode_table()[h].view(np.float32)


class BF16(_Half):
    info = _info(
        "bf16",
        code=6,
        description="bfloat16 per value (ggml BF16): the upper half of a float32, rounded to nearest even",
        value="bf16(x): the float32 bits >> 16, rounded to nearest even",
    )
    attention = CapabilitySlot(AttentionTraits, read="attention_read_bf16")
    _overflow_bits = BF16_OVERFLOW_BITS
    _type_name = "bfloat16"
    _limit = "3.3895314e+38"

    def _code(self, y: NDArray[np.float64]) -> NDArray[Any]:
        return _bf16_code(y)

    def _bits(self, x: NDArray[np.float32]) -> NDArray[np.uint16]:
        return bf16_bits(x).reshape(-1)

    def _values(self, h: NDArray[np.uint16]) -> NDArray[np.float32]:
        return (np.asarray(h).astype(np.uint32) << np.uint32(16)).view(np.float32)


__all__ = ["F16", "BF16", "f16_decode_table", "bf16_bits"]
