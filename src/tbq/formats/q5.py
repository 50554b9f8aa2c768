"""Q5_0 and Q5_1 (ggml): 32 5-bit codes per block, the fifth bits in a 32-bit plane ``qh``.

docs/formats.md, "Q5_0 / Q5_1". Codes ``c`` (0..31) are stored as their
low 4 bits in ggml's split-half nibble order (byte ``j`` of ``qs`` = ``c[j] &
15`` | ``(c[j+16] & 15) << 4``) and their bit 4 in the little-endian uint32
``qh`` (bit ``i`` = bit 4 of ``c[i]``).

- **Q5_0** (22 bytes: ``d`` fp16, ``qh``, ``qs``), like Q4_0 with 32 levels:
  ``max`` = the signed value of largest magnitude (the first on a tie; ``+0``
  for a block of zeros), ``d = max / -16``, ``id = 1/d`` (0 when ``d == 0``),
  ``t = float32(float32(x * id) + 16.5)``, ``c = min(31, trunc(t))``; decode
  ``y = (c - 16) * d16``. An all-zero block stores ``d = -0`` and codes 16
  (bytes ``00 80 FF FF FF FF 00 ...``) and decodes to ``-0.0``.
- **Q5_1** (24 bytes: ``d``, ``m`` fp16, ``qh``, ``qs``), like Q4_1 with 31
  steps: ``d = (max - min) / 31``, ``c = trunc(float32(float32((x - min) *
  id) + 0.5))`` with **no** clamp (``t < 32`` always); decode
  ``y = c * d16 + m16``.

Codes use the float32 ``d``/``id``/``min``, not the stored fp16 values. When
``1/d`` overflows (tiny blocks) the C conversion of ``+-inf``/NaN is
undefined; tbq writes code 0 there (what x86-64 gcc produces).

>>> b = Q5_0().encode(np.float32([-16, 15.5] + [0] * 30))  # max = -16: d = 1; t = 0.5, 32 (-> 31), 16.5
>>> b[:2].view("<f2")[0], hex(int(b[2:6].view("<u4")[0])), b[6:8].tolist()  # codes 0, 31, 16, ...
(np.float16(1.0), '0xfffffffe', [0, 15])
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from ..float32 import put_f16_scale
from ..half import f16_table
from ..packing import np_pack4_halves, np_unpack4_halves
from ._shared import ScaledInt, ScaledIntChecks
from .base import Field, FormatInfo, Trace, offset_trunc_fragility
from .capabilities import AttentionTraits, CapabilitySlot, FuzzTraits
from .q4_0 import max_scale_trace
from .q4_1 import MinScaled, min_scale_trace, put_f16_at, trunc_codes

F32 = np.float32
_M16 = F32(-16.0)
_16_5 = F32(16.5)
_31 = F32(31.0)
_BIT = np.arange(32, dtype=np.uint32)


def pack_qh(c: NDArray[np.int32]) -> NDArray[np.uint8]:
    """Little-endian uint32 bytes (blocks, 4) of ``qh = sum(((c_i >> 4) & 1) << i)``."""
    qh = np.zeros(c.shape[0], np.uint32)
    for i in range(32):  # OR of disjoint bits: the order does not matter
        qh |= ((c[:, i].astype(np.uint32) >> np.uint32(4)) & np.uint32(1)) << np.uint32(i)
    return qh.astype("<u4").view(np.uint8).reshape(-1, 4)


def unpack_codes(data: NDArray[np.uint8], qh_off: int) -> NDArray[np.int32]:
    """The 5-bit codes (blocks, 32) from ``qh`` at ``qh_off`` and the 16 nibble bytes after it."""
    qh = np.ascontiguousarray(data[:, qh_off : qh_off + 4]).view("<u4").reshape(-1, 1).astype(np.uint32)
    lo = np_unpack4_halves(data[:, qh_off + 4 : qh_off + 20]).astype(np.uint32)
    return (lo | (((qh >> _BIT) & np.uint32(1)) << np.uint32(4))).astype(np.int32)


class _Q5(ScaledInt):
    """Shared structure of Q5_0 and Q5_1: the ``qh`` plane before the nibbles, read as a uint32 field."""

    kernel_module = "tbq.formats.q5_kernels"
    #: byte offset of ``qh`` (Q5_1 has its minimum first)
    _qh: ClassVar[int] = 2

    def int_values(self, data: NDArray[np.uint8]) -> NDArray[np.int32]:
        return unpack_codes(data, self._qh) + self.code_lo

    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        return getattr(self.kernels(), f"encode_{self.name}")(x, out, raise_overflow)  # encode_q5_0 / encode_q5_1

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        getattr(self.kernels(), f"decode_{self.name}")(data, out, f16_table())


class Q5_0(_Q5):
    info = FormatInfo(
        name="q5_0",
        block_size=32,
        index_bits=5,
        description="ggml Q5_0: fp16 scale + 32 5-bit codes (bit plane + split-half nibbles)",
        code=8,
        layout=(
            Field("d", 0, 2, "f16", "scale max/-16"),
            Field("qh", 2, 4, "u32", "bit i = bit 4 of code i"),
            Field(
                "qs", 6, 16, "u4_halves", "low 4 bits of codes min(31, trunc(x/d + 16.5)), byte j = q[j] | q[j+16] << 4"
            ),
        ),
    )
    code_lo = -16
    checker = CapabilitySlot(
        ScaledIntChecks, tie_rule="up", vec_dot_type="q8_0"
    )  # trunc(v + 16.5); ggml_vec_dot_q5_0_q8_0
    fuzz = CapabilitySlot(FuzzTraits, hazards={"ties": {"divisor": 16.0, "codes": (-16, 15)}})

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        d, _, v, t = max_scale_trace(x, _M16, _16_5)
        c = trunc_codes(t, 31)
        out = np.empty((x.shape[0], 22), np.uint8)
        put_f16_scale(out, d)
        out[:, 2:6] = pack_qh(c)
        out[:, 6:] = np_pack4_halves((c & 15).astype(np.uint8))
        return out, {"d": d, "v": v, "t": t}

    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # Fragile if a k-ulp change of v = x*id or of t = float32(v + 16.5) can change min(31, trunc(t)).
        return offset_trunc_fragility(trace["v"], trace["t"], k, 16.5, 31)


class Q5_1(_Q5, MinScaled):
    info = FormatInfo(
        name="q5_1",
        block_size=32,
        index_bits=5,
        description="ggml Q5_1: fp16 scale + fp16 minimum + 32 5-bit codes (bit plane + split-half nibbles)",
        code=9,
        layout=(
            Field("d", 0, 2, "f16", "scale (max - min)/31"),
            Field("m", 2, 2, "f16", "the block's minimum"),
            Field("qh", 4, 4, "u32", "bit i = bit 4 of code i"),
            Field(
                "qs", 8, 16, "u4_halves", "low 4 bits of codes trunc((x - min)/d + 0.5), byte j = q[j] | q[j+16] << 4"
            ),
        ),
    )
    _qh = 4
    attention = CapabilitySlot(AttentionTraits, read="attention_read_q5_1")
    fuzz = CapabilitySlot(
        FuzzTraits, hazards={"min_ties": {"levels": 31}}
    )  # (x - min) / d exactly k + 1/2: round half up

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        d, mn, v, t = min_scale_trace(x, _31)
        c = trunc_codes(t, None) & 0xFF  # C: (uint8_t)t, no clamp; t < 32, so the code is trunc(t)
        out = np.empty((x.shape[0], 24), np.uint8)
        put_f16_scale(out, d)
        put_f16_at(out, 2, mn)
        out[:, 4:8] = pack_qh(c)
        out[:, 8:] = np_pack4_halves((c & 15).astype(np.uint8))
        return out, {"d": d, "m": mn, "v": v, "t": t}

    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # Fragile if a k-ulp change of v = (x - min)*id or of t = float32(v + 0.5) can change trunc(t).
        # (fragile_scales is the default on d; the minimum is one of the inputs, exact, and cannot move.)
        return offset_trunc_fragility(trace["v"], trace["t"], k, 0.5)  # no clamp: t < 32 always
