"""Q4_1 (ggml): 32 values -> fp16 scale ``d`` + fp16 minimum ``m`` + 32 4-bit codes, 20 bytes.

docs/formats.md, "Q4_1". Per block: ``min`` / ``max`` = the smallest / largest
value (the first occurrence: the C loop updates on a strict comparison, which
matters only for the sign of a zero), ``d = (max - min) / 15``, ``id = 1/d``
(0 when ``d == 0``), ``v = (x - min) * id``, ``t = v + 0.5`` (three float32
roundings: subtract, multiply, add), ``q = min(15, trunc(t))``; the codes use
the float32 ``d``, ``id`` and ``min``, not their fp16 roundings. Stored:
``fp16(d)``, ``fp16(min)``, the codes in ggml's split-half order (byte ``j`` =
code ``j`` | code ``j+16`` << 4). Decode ``y = q * d16 + m16`` (an exact
product, one rounding in the sum).

A constant block (all-zero included) has ``d = 0``, codes 0 and decodes to
``fp16(min)``. A block whose ``d`` or ``fp16(min)`` is infinite is refused
(``ScaleOverflowError``) unless ``on_overflow="inf"``. When ``1/d`` overflows
(``max - min`` below about 4.4e-38) the C conversion of ``+-inf``/NaN is
undefined; tbq writes code 0 there, what x86-64 gcc produces.

>>> b = Q4_1().encode(np.arange(32, dtype=np.float32))
>>> b[:4].view("<f2").tolist(), b[4:8].tolist()  # d = 31/15, m = 0; codes 0,0,1,1 | 8,8,9,9 << 4
([2.06640625, 0.0], [128, 128, 145, 145])
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..float32 import put_f16_scale, safe_reciprocal
from ..half import f16_table, f32_to_f16_bits
from ..packing import np_pack4_halves, np_unpack4_halves
from ._shared import ScaledInt, ScaledIntChecks
from .base import (
    Field,
    Format,
    FormatInfo,
    Trace,
    block_trace,
    f16_field_error,
    f16_overflows,
    offset_trunc_fragility,
    overflow_status,
)
from .capabilities import CapabilitySlot, FuzzTraits

F32 = np.float32
_15 = F32(15.0)
_HALF = F32(0.5)


def first_min_max(x: NDArray[np.float32]) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """Row-wise ``(min, max)`` of float32 blocks, each the *first* element attaining it (C's strict updates).

    ``np.argmin``/``np.argmax`` return the first index of the extreme value,
    and ``+0 == -0``, so the kept zero is the first one, as in the C loop
    (``np.min`` may return either zero).
    """
    rows = np.arange(x.shape[0])
    return x[rows, np.argmin(x, axis=1)], x[rows, np.argmax(x, axis=1)]


def put_f16_at(out: NDArray[np.uint8], offset: int, v: NDArray[np.float32]) -> None:
    """Store float32 ``v`` as little-endian fp16 at bytes ``offset``, ``offset+1`` of each row of ``out``."""
    out[:, offset : offset + 2] = f32_to_f16_bits(v).astype("<u2").view(np.uint8).reshape(-1, 2)


def get_f16_at(data: NDArray[np.uint8], offset: int) -> NDArray[np.float32]:
    """float32 values of the little-endian fp16 at bytes ``offset``, ``offset+1`` of each row of ``data``."""
    bits = np.ascontiguousarray(data[:, offset : offset + 2]).view("<u2").reshape(-1)
    return f16_table()[bits]


def min_scale_trace(
    x: NDArray[np.float32], levels: np.float32
) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.float32], NDArray[np.float32]]:
    """Steps 1-3 shared by Q4_1 and Q5_1: ``(d, min, v, t)`` with ``d = (max - min) / levels``."""
    mn, mx = first_min_max(x)
    d: NDArray[np.float32] = (mx - mn) / levels  # type: ignore[assignment]  # float32 / np.float32 is float32 (numpy's stubs say float64)

    inv = safe_reciprocal(d)
    v = (x - mn[:, None]) * inv[:, None]  # two roundings: the difference, then the product
    t = v + _HALF  # the third rounding
    return d, mn, v, t


def trunc_codes(t: NDArray[np.float32], top: int | None) -> NDArray[np.int32]:
    """``trunc(t)`` (capped at ``top`` when given) as int32; non-finite ``t`` (1/d overflowed) -> 0.

    x86-64 converts +-inf/NaN to the "integer indefinite" 0x80000000, whose
    low byte, the stored code, is 0.
    """
    q = np.trunc(t)
    fin = np.isfinite(q)  # before the cap: min(15, inf) would be 15
    if not fin.all():
        q = np.where(fin, q, F32(0))
    if top is not None:
        q = np.minimum(q, F32(top))
    return q.astype(np.int32)


def add_min(prod: NDArray[np.float32], m: NDArray[np.float32]) -> NDArray[np.float32]:
    """``prod + m`` per block, with a fixed NaN payload: a NaN product is kept as it is.

    When both operands are NaN, x86 returns the first operand's payload, and
    which operand comes first is the compiler's choice (numpy's broadcasting
    loop puts ``m`` first, LLVM may swap a commutative add). Taking the
    product's NaN when there is one (what gcc's ``mulss; addss m`` sequence
    for ``x0*d + m`` gives) makes both backends bit-identical on any bytes.
    Not reached by finite fields: a product of a code and a finite d is finite.
    """
    y = prod + m[:, None]
    nan = np.isnan(prod)
    if nan.any():
        y[nan] = prod[nan]
    return y


def min_overflow_status(fmt: Format, trace: Trace) -> NDArray[np.int8]:
    """Refusals of a format with an fp16 scale ``d`` and an fp16 minimum ``m``: either one infinite."""
    return overflow_status(fmt.scale_overflows(trace) | f16_overflows(np.asarray(trace["m"], np.float32)))


def min_overflow_error(fmt: Format, block: int, values: NDArray[np.float32]) -> Exception:
    """The refusal of ``block`` (its float32 ``values``) of such a format: its scale, or else its minimum, is named."""
    tr = block_trace(fmt, values)
    d, m = float(tr["d"][0]), float(tr["m"][0])
    levels = (1 << fmt.info.index_bits) - 1
    return f16_field_error(
        fmt.name,
        block,
        (
            (f"the scale d = (max - min) / {levels} is {d!r}, which does not fit float16", d),
            (f"the minimum m is {m!r}, which does not fit float16", m),
        ),
    )


class MinScaledChecks(ScaledIntChecks):
    """The :class:`CheckTraits` of a :class:`MinScaled` type: each value is ``int_values * d + m``, and ggml pairs it
    with q8_1, whose block sum takes the minimum's term (``ggml_vec_dot_q4_1_q8_1``)."""

    tie_rule = "away"  # trunc(v + 0.5), v >= 0
    vec_dot_type = "q8_1"

    def dot_offset(self, data: NDArray[np.uint8]) -> NDArray[np.float64]:
        return get_f16_at(data, 2).astype(np.float64)  # m: each value is codes * d + m


class MinScaled(ScaledInt):
    """Shared body of Q4_1 and Q5_1: a :class:`ScaledInt` with the block's minimum ``m`` (fp16 at bytes 2-3) added
    to each decoded value; a block whose ``d`` or ``m`` does not fit fp16 is refused."""

    checker = CapabilitySlot(MinScaledChecks)

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        # the exact product, then the sum: one rounding
        return add_min(super().reference_decode(data), get_f16_at(data, 2))

    def invalid_blocks(self, trace: Trace) -> NDArray[np.int8]:
        return min_overflow_status(self, trace)

    def encode_error(self, status: int, block: int, values: NDArray[np.float32]) -> Exception:
        return min_overflow_error(self, block, values)


class Q4_1(MinScaled):
    info = FormatInfo(
        name="q4_1",
        block_size=32,
        index_bits=4,
        description="ggml Q4_1: fp16 scale + fp16 minimum + 32 4-bit codes (split halves)",
        code=7,
        layout=(
            Field("d", 0, 2, "f16", "scale (max - min)/15"),
            Field("m", 2, 2, "f16", "the block's minimum"),
            Field("qs", 4, 16, "u4_halves", "codes min(15, trunc((x - min)/d + 0.5)), byte j = q[j] | q[j+16] << 4"),
        ),
    )
    kernel_module = "tbq.formats.q4_1_kernels"
    fuzz = CapabilitySlot(
        FuzzTraits, hazards={"min_ties": {"levels": 15}}
    )  # (x - min) / d exactly k + 1/2: round half up

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        d, mn, v, t = min_scale_trace(x, _15)
        q = trunc_codes(t, 15)
        out = np.empty((x.shape[0], 20), np.uint8)
        put_f16_scale(out, d)
        put_f16_at(out, 2, mn)
        out[:, 4:] = np_pack4_halves(q.astype(np.uint8))
        return out, {"d": d, "m": mn, "v": v, "t": t}

    def int_values(self, data: NDArray[np.uint8]) -> NDArray[np.uint8]:
        return np_unpack4_halves(data[:, 4:])

    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # Fragile if a k-ulp change of v = (x - min)*id or of t = float32(v + 0.5) can change min(15, trunc(t)).
        # (fragile_scales is the default on d; the minimum is one of the inputs, exact, and cannot move.)
        return offset_trunc_fragility(trace["v"], trace["t"], k, 0.5, 15)
