"""Q8_0 (ggml): 32 values -> fp16 scale ``d = amax / 127`` + 32 int8 codes, 34 bytes.

docs/formats.md, "Q8_0". Per block: ``amax = max |x|``, ``d = amax / 127``
(float32), ``id = 1/d`` (0 when ``d == 0``), ``q = roundf(x * id)`` with the
float32 ``d`` (not its fp16 rounding), stored as int8; decode ``y = q * fp16(d)``.

>>> f = Q8_0()
>>> b, tr = f.encode(np.full(32, 0.5, np.float32), trace=True)
>>> b[:2].view("<f2")[0], b[2], float(tr["d"][0])
(np.float16(0.003937), np.uint8(127), 0.003937007859349251)
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..float32 import put_f16_scale, roundf, safe_reciprocal
from ._shared import ScaledInt, ScaledIntChecks
from .base import Field, FormatInfo, Trace, band
from .capabilities import CapabilitySlot, FuzzTraits

_127 = np.float32(127.0)


def _roundf64(y: NDArray[np.float64]) -> NDArray[np.float64]:
    """roundf on float64 values (the fragility code function: boundaries at the half-integers)."""
    t = np.trunc(y)
    return t + np.where(np.abs(y - t) >= 0.5, np.sign(y), 0.0)


def q8_codes(x: NDArray[np.float32]) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.int8]]:
    """Steps 1-3 of Q8_0 (and Q8_1, which adds a sum): ``(d, v, q)``, ``d = amax/127``, ``v = x * id``, int8 ``q``.

    >>> d, v, q = q8_codes(np.float32([[-2.54, 1.27] + [0] * 30]))
    >>> float(d[0]), q[0, :3].tolist()
    (0.019999999552965164, [-127, 64, 0])
    """
    amax = np.max(np.abs(x), axis=1)
    d: NDArray[np.float32] = amax / _127
    inv = safe_reciprocal(d)
    v = x * inv[:, None]
    r = roundf(v)  # the float32 d, not fp16(d)
    if np.isinf(inv).any():
        # d so small that 1/d overflowed: x*id is +-Inf or NaN, whose C float -> int
        # conversion is undefined; x86 (cvttss2si) gives INT_MIN, whose int8 is 0.
        r[~np.isfinite(r)] = 0
    return d, v, r.astype(np.int8)


class Q8_0(ScaledInt):
    info = FormatInfo(
        name="q8_0",
        block_size=32,
        index_bits=8,
        description="ggml Q8_0: fp16 scale + 32 int8 codes",
        code=1,
        layout=(Field("d", 0, 2, "f16", "scale amax/127"), Field("qs", 2, 32, "int8", "codes roundf(x/d)")),
    )
    kernel_module = "tbq.formats.q8_0_kernels"
    code_lo = -128  # int8 codes
    checker = CapabilitySlot(ScaledIntChecks, tie_rule="away", vec_dot_type="q8_0")  # ggml_vec_dot_q8_0_q8_0
    fuzz = CapabilitySlot(FuzzTraits, hazards={"ties": {"divisor": 127.0, "codes": (-127, 126)}})

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        d, v, q = q8_codes(x)
        out = np.empty((x.shape[0], 34), np.uint8)
        put_f16_scale(out, d)
        out[:, 2:] = q.view(np.uint8)
        return out, {"d": d, "v": v}

    def int_values(self, data: NDArray[np.uint8]) -> NDArray[np.int8]:
        return data[:, 2:].view(np.int8)

    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # v = x * id; the code roundf(v) changes at the half-integers.
        return band(_roundf64, trace["v"], k)
