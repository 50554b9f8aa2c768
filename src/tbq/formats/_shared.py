"""What several format modules declare alike, written once.

A format names one of these capabilities in its slot (``attention = CapabilitySlot(BlockAttention)``) where its
own would only repeat it; a format with a difference declares its own subclass (docs/architecture.md, "How to
add a format", step 6). :class:`ScaledInt` is the body of ggml's fp16-scale integer types (q4_0, q5_0, q8_0,
q8_1, iq4_nl and, with their minimum, q4_1 and q5_1): each module gives its encoder and how its codes are stored
(:meth:`ScaledInt.int_values`); the decoder, the dot-product parts and the value table follow from that one
reading.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ..float32 import get_f16_scale
from ..half import f16_table
from .base import Format
from .capabilities import AttentionTraits, CapabilitySlot, CheckTraits, QuantizerTraits, Trace

__all__ = ["BlockAttention", "ScaledInt", "ScaledIntChecks", "ScaledIntQuantizer"]


class BlockAttention(AttentionTraits):
    """The :class:`AttentionTraits` of a format whose kernel module reads its blocks with ``attention_read`` and
    the default tables (ggml's fp16-scale types: q4_0, q4_1, q5_0, q8_0, iq4_nl)."""

    read = "attention_read"


class ScaledIntChecks(CheckTraits):
    """The :class:`CheckTraits` of a :class:`ScaledInt` type: its C encoder multiplies by ``id = 1/d`` (iq4_nl's slot
    says otherwise: its reciprocal is of another scale), and each value is ``int_values * d`` exactly (plus the minimum, which q4_1's and q5_1's add as :meth:`dot_offset`).
    A format names its ``tie_rule`` and ``vec_dot_type`` in its slot."""

    format: ScaledInt

    reciprocal_scale = True

    def dot_parts(self, data: NDArray[np.uint8]) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        return self.format.int_values(data).astype(np.int64), get_f16_scale(data).astype(np.float64)


class ScaledIntQuantizer(QuantizerTraits):
    """The :class:`QuantizerTraits` of a :class:`ScaledInt` type: its ``2**index_bits`` integer levels from
    ``code_lo`` on, met by the traced ``v`` (``x / d``; ``(x - min) / d`` with a minimum)."""

    format: ScaledInt

    def value_table(self, trace: Trace) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        f = self.format
        return self.int_levels(f.code_lo, 1 << f.info.index_bits, trace["v"])


class ScaledInt(Format):
    """Shared body of ggml's fp16-scale integer types: an fp16 scale ``d`` at bytes 0-1 and codes whose values in
    units of ``d`` (:meth:`int_values`: q4_0's nibble - 8, q8_0's int8 as it is) are the ``2**index_bits``
    integers from ``code_lo`` on (iq4_nl's: its table of 16, with a quantizer of its own), decoded as
    ``int_values * fp16(d)`` (one exact product). A subclass gives
    ``code_lo``, :meth:`int_values` and its encoder; its kernel module has ``encode(x, out, raise_overflow)``
    and ``decode(data, out, f16_table)`` unless it says otherwise."""

    #: the lowest level in units of ``d`` (``-2**(index_bits - 1)`` for the symmetric types, 0 with a minimum)
    code_lo: ClassVar[int] = 0
    checker: CapabilitySlot[CheckTraits] = CapabilitySlot(ScaledIntChecks)
    quantizer: CapabilitySlot[QuantizerTraits] = CapabilitySlot(ScaledIntQuantizer)
    attention: CapabilitySlot[AttentionTraits] = CapabilitySlot(BlockAttention)

    def int_values(self, data: NDArray[np.uint8]) -> NDArray[np.integer[Any]]:
        """The codes of clean blocks ``data`` (blocks, type_size) as integers in units of ``d`` (blocks, block_size).
        The decoder and the dot product both read the codes through it."""
        raise NotImplementedError

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        return self.int_values(data).astype(np.float32) * get_f16_scale(data)[:, None]

    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        return self.kernels().encode(x, out, raise_overflow)

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        self.kernels().decode(data, out, f16_table())
