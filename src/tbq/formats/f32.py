"""F32 (ggml): each value stored as its own IEEE binary32 bits, 4 bytes, unquantized.

docs/formats.md, "F32". A "block" is one value (block size 1): value ``i``
of a row is the little-endian float32 at byte ``4i``. This is llama.cpp's
unquantized cache type (``-ctk f32``): encode writes the float32 bit pattern
of each value, decode reads it back, bit for bit (signed zeros, subnormals and,
on decode, every NaN payload unchanged: ggml copies the rows). Nothing is
rounded, so no value is fragile and nothing overflows; the codec still refuses
NaN and Inf input, as it does for every format.

It is a KV cache type (``tbq eval --cache-types f32:f32``, ``tbq budget --formats f32``)
but not a quantizer: storing 32 bits per value, it is the baseline the
quantizers are measured against, and the default lists of quantizers
(:func:`tbq.formats.cache_formats`) leave it out.

>>> F32().encode(np.float32([1.0, -0.0, 1e-45])).view("<u4").tolist()
[1065353216, 2147483648, 1]
>>> F32().decode(np.uint32([0x7FA00001]).view(np.uint8)).view(np.uint32).tolist() == [0x7FA00001]  # payload kept
True
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from .base import Field, Format, FormatInfo, Trace
from .capabilities import AttentionTraits, CapabilitySlot

# The field kind "f32" (a little-endian float32) and its special patterns are declared by q8_ops, whose Q8_K
# scale is one; importing them registers the kind before the layout below is read.
from .q8_ops import SPECIAL_F32


class F32Attention(AttentionTraits):
    """F32's :class:`AttentionTraits`: the fused attention kernel reads the values as they are."""

    format: F32

    read = "attention_read_f32"


class F32(Format):
    """The float32 values themselves (ggml F32): the unquantized cache type."""

    info = FormatInfo(
        name="f32",
        block_size=1,
        index_bits=32,
        description="IEEE binary32 per value (ggml F32): the float32 itself, unquantized",
        code=28,
        layout=(Field("v", 0, 4, "f32", "x, the float32 bit pattern as it is", specials=SPECIAL_F32),),
    )
    kernel_module = "tbq.formats.f32_kernels"
    attention = CapabilitySlot(F32Attention)

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        out = np.ascontiguousarray(x, "<f4").view(np.uint8).reshape(x.shape[0], 4).copy()
        return out, {"v": x.copy()}

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        # a view of the bits (never a float conversion, which may quiet a signalling NaN), copied out
        return np.ascontiguousarray(data).view("<u4").astype(np.uint32).view(np.float32).reshape(-1, 1)

    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        # x is (n, 1) float32 and out (n, 4) uint8, both C-contiguous: the kernel copies the values' bit patterns
        # as little-endian 32-bit words ("<u4": a big-endian host gets a numba type error, never wrong bytes).
        return self.kernels().encode_f32(x.reshape(-1).view(np.uint32), out.view("<u4").reshape(-1))

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        self.kernels().decode_f32(data.view("<u4").reshape(-1), out.view(np.uint32).reshape(-1))

    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # Nothing is rounded: no perturbation of the input changes a stored value other than its own.
        return np.zeros(np.shape(trace["v"]), bool)

    def fragile_scales(self, trace: Trace, k: int) -> NDArray[np.bool_]:
        # No scale.
        return np.zeros(np.shape(trace["v"])[0], bool)

    def scale_overflows(self, trace: Trace) -> NDArray[np.bool_]:
        """bool (values,): all False (a finite float32 always fits; the codec refuses NaN and Inf before this)."""
        return np.zeros(np.shape(trace["v"])[0], bool)

    def fields(self, data: Any) -> dict[str, NDArray[Any]]:
        blocks = self._blocks(data)
        return {"v": np.ascontiguousarray(blocks).view("<u4")[..., 0].astype(np.uint32).view(np.float32)}


__all__ = ["F32"]
