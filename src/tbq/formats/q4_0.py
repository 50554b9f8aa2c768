"""Q4_0 (ggml): 32 values -> fp16 scale ``d = max / -8`` + 32 4-bit codes, 18 bytes.

docs/formats.md, "Q4_0". Per block: ``max`` is the signed value of largest
magnitude (the first on a tie), ``d = max / -8``, ``id = 1/d`` (0 when
``d == 0``), ``q = min(15, trunc(x * id + 8.5))`` (a product, then a sum: two
roundings), stored in ggml's split order (byte ``j`` = code ``j`` | code
``j+16`` << 4); decode ``y = (q - 8) * fp16(d)``.

>>> Q4_0().encode(np.zeros(32, np.float32))[:2].tolist()  # ggml: an all-zero block has d = -0
[0, 128]
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..float32 import put_f16_scale, safe_reciprocal
from ..packing import np_pack4_halves, np_unpack4_halves
from ._shared import ScaledInt, ScaledIntChecks
from .base import Field, FormatInfo, Trace, offset_trunc_fragility
from .capabilities import CapabilitySlot, FuzzTraits

F32 = np.float32
_M8 = F32(-8.0)
_8_5 = F32(8.5)


def max_scale_trace(
    x: NDArray[np.float32], divisor: np.float32, offset: np.float32
) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.float32], NDArray[np.float32]]:
    """Steps 1-3 shared by Q4_0 and Q5_0: ``(d, id, v, t)`` with ``d = max / divisor``, ``v = x * id``,
    ``t = v + offset`` (two roundings: the product, then the sum)."""
    rows = np.arange(x.shape[0])
    a = np.abs(x)
    m = x[rows, np.argmax(a, axis=1)]  # signed; argmax keeps the first on a tie
    # ggml starts from max = +0 and replaces it only on a strictly larger |x|, so a block of
    # zeros (of either sign) has m = +0 and d = +0 / divisor = -0 (bytes 00 80).
    m[a.max(axis=1) == 0] = F32(0)
    d = m / divisor
    inv = safe_reciprocal(d)
    v = x * inv[:, None]
    return d, inv, v, v + offset


class Q4_0(ScaledInt):
    info = FormatInfo(
        name="q4_0",
        block_size=32,
        index_bits=4,
        description="ggml Q4_0: fp16 scale + 32 4-bit codes (split halves)",
        code=2,
        layout=(
            Field("d", 0, 2, "f16", "scale max/-8"),
            Field("qs", 2, 16, "u4_halves", "codes trunc(x/d + 8.5), byte j = q[j] | q[j+16] << 4"),
        ),
    )
    kernel_module = "tbq.formats.q4_0_kernels"
    code_lo = -8
    checker = CapabilitySlot(ScaledIntChecks, tie_rule="up", vec_dot_type="q8_0")  # ggml_vec_dot_q4_0_q8_0
    fuzz = CapabilitySlot(FuzzTraits, hazards={"ties": {"divisor": 8.0, "codes": (-8, 7)}})

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        d, inv, v, t = max_scale_trace(x, _M8, _8_5)
        q = np.minimum(np.trunc(t), F32(15))
        if np.isinf(inv).any():
            # Non-finite t (1/d overflowed): code 0, what x86 C gives for (int8_t)(+-Inf or NaN).
            q[~np.isfinite(t)] = 0
        out = np.empty((x.shape[0], 18), np.uint8)
        put_f16_scale(out, d)
        out[:, 2:] = np_pack4_halves(q.astype(np.uint8))
        return out, {"d": d, "v": v, "t": t}

    def int_values(self, data: NDArray[np.uint8]) -> NDArray[np.int32]:
        return np_unpack4_halves(data[:, 2:]).astype(np.int32) - 8

    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # Fragile if a k-ulp change of v = x*id or of t = float32(v + 8.5) can change min(15, trunc(t)).
        return offset_trunc_fragility(trace["v"], trace["t"], k, 8.5, 15)
