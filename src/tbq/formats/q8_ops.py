"""Q8_1 and Q8_K (ggml): the 8-bit formats ggml quantizes a dot product's right operand (the activation) to.

docs/formats.md, "Q8_1 / Q8_K". Neither is a KV cache type (``cache_type=False``):
``ggml_vec_dot_q4_1_q8_1`` / ``_q5_1_q8_1`` take the activation as Q8_1, the
K-quants' and the TurboQuant fork's ``ggml_vec_dot_*_q8_K`` as Q8_K, and
``tbq check --dot`` needs both bit for bit.

- **Q8_1** (32 values, 36 bytes: fp16 ``d``, fp16 ``s``, 32 int8 codes) is Q8_0
  plus ``s = fp16(float32(sum(q)) * d)`` with the float32 ``d``. Its codes and
  ``d`` are Q8_0's (:func:`tbq.formats.q8_0.q8_codes`); ggml has no Q8_1
  decoder, tbq decodes ``q * fp16(d)`` as Q8_0 does.
- **Q8_K** (256 values, 292 bytes: float32 ``d``, 256 int8 codes, 16 int16
  ``bsums``): ``max`` = the signed value of largest magnitude (the first),
  ``iscale = -127/max``, ``q = min(127, nearest_int(iscale * x))`` (ties to
  even), ``bsums[g]`` = the sum of codes ``16g .. 16g+15``, ``d = 1/iscale``;
  decode ``y = d * q`` (float32, one rounding). An all-zero block has
  ``d = 0`` and codes 0, and C leaves its ``bsums`` unwritten (tbq writes 0).

>>> b = Q8_1().encode(np.full(32, 0.5, np.float32))
>>> b[:4].view("<f2").tolist(), b[4]  # d = 0.5/127, s = fp16(32 * 127 * d) = 16
([0.003936767578125, 16.0], np.uint8(127))
>>> k = Q8_K().encode(np.linspace(-1, 0.5, 256, dtype=np.float32))
>>> float(k[:4].view("<f4")[0]), k[4:6].view(np.int8).tolist()  # max = -1: iscale = 127, d = 1/127
(0.007874015718698502, [-127, -126])
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..float32 import put_f16_scale
from ..half import f16_table
from ._shared import ScaledIntChecks
from .base import (
    Field,
    FieldKind,
    Format,
    FormatInfo,
    Trace,
    band,
    block_trace,
    f16_field_error,
    f16_overflows,
    overflow_status,
    register_field_kind,
)
from .capabilities import AttentionTraits, CapabilitySlot, CheckTraits, FuzzTraits, QuantizerTraits
from .q4_1 import get_f16_at, put_f16_at
from .q8_0 import Q8_0, q8_codes

F32 = np.float32
_M127 = F32(-127.0)
_1 = F32(1.0)
#: 1.5 * 2**23: adding it to |v| < 2**22 leaves round-half-even(v) + 2**22 in the low 23 bits (ggml's nearest_int)
_MAGIC = F32(12582912.0)

register_field_kind("f32", FieldKind(lambda raw: raw.view("<f4")[..., 0].astype(np.float32)))
register_field_kind("int16", FieldKind(lambda raw: raw.view("<i2").astype(np.int16)))

#: float32 patterns for the Q8_K scale (little-endian 32-bit integers), injected by arbitrary-byte fuzzing.
SPECIAL_F32 = (
    ("+inf", 0x7F800000, 0x7F800000),
    ("-inf", 0xFF800000, 0xFF800000),
    ("nan", 0x7F800001, 0x7FFFFFFF),
    ("-nan", 0xFF800001, 0xFFFFFFFF),
    ("subnormal", 0x00000001, 0x007FFFFF),
    ("-subnormal", 0x80000001, 0x807FFFFF),
    ("+0", 0x00000000, 0x00000000),
    ("-0", 0x80000000, 0x80000000),
    ("max", 0x7F7FFFFF, 0x7F7FFFFF),
    ("-max", 0xFF7FFFFF, 0xFF7FFFFF),
    ("positive", 0x00800000, 0x7F7FFFFF),
    ("negative", 0x80800000, 0xFF7FFFFF),
)


def _q8_1_sum(qs: NDArray[np.uint8], d: NDArray[np.float32]) -> NDArray[np.float32]:
    """Q8_1's ``s`` before its fp16 rounding: ``float32(sum(codes)) * d`` for codes (blocks, 32) stored as uint8."""
    total = qs.view(np.int8).astype(np.int32).sum(axis=1)  # an integer sum: exact in any order
    with np.errstate(over="ignore"):  # d near FLT_MAX / 127: the product is +-inf in C too (then fp16 inf)
        return total.astype(F32) * d  # C: sum * d, the int converted to float (exact), one float32 product


def _bsums(qs: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """Q8_K's ``bsums`` bytes (blocks, 32): the int16 sums of each 16 codes of codes (blocks, 256) stored as uint8."""
    sums = qs.view(np.int8).astype(np.int32).reshape(qs.shape[0], 16, 16).sum(axis=2)  # integer sums: exact
    return sums.astype("<i2").view(np.uint8).reshape(qs.shape[0], 32)


def _same_number(a: NDArray[np.float32], b: NDArray[np.float32]) -> NDArray[np.bool_]:
    return (a == b) | (np.isnan(a) & np.isnan(b))


class Q8_1Checks(ScaledIntChecks):
    """Q8_1's :class:`CheckTraits`: Q8_0's codes, and the block sum ``s`` that the dot product and the checker read."""

    format: Q8_1

    tie_rule = "away"  # Q8_0's roundf
    vec_dot_type = ""  # a right operand only: ggml has no q8_1 x q8_1 dot product

    def dot_offset(self, data: NDArray[np.uint8]) -> NDArray[np.float64]:
        return get_f16_at(data, 2).astype(np.float64)  # s: ggml adds m_x * s_y outside the integer sum

    def derived(self, data: NDArray[np.uint8], trace: Trace) -> NDArray[np.uint8]:
        # s = fp16(sum(qs) * d) with the float32 d of the trace (the block holds only fp16(d))
        out = np.array(data, np.uint8, copy=True)
        put_f16_at(out, 2, _q8_1_sum(out[:, 4:], np.asarray(trace["d"], F32).reshape(-1)))
        return out

    def equivalent_blocks(self, ref: NDArray[np.uint8], got: NDArray[np.uint8]) -> NDArray[np.bool_]:
        # s does not enter the decoded values but every q4_1/q5_1 dot product (m * s): equal as numbers too
        same = super().equivalent_blocks(ref, got)
        return same & _same_number(get_f16_at(ref, 2), get_f16_at(got, 2))


class Q8_1(Q8_0):
    """Q8_0's codes and scale, and the block sum ``s``; a dot-product operand, not a cache type."""

    info = FormatInfo(
        name="q8_1",
        block_size=32,
        index_bits=8,
        description="ggml Q8_1: fp16 scale + fp16 d*sum(codes) + 32 int8 codes (the activation of q4_1/q5_1 dot products)",
        code=19,
        layout=(
            Field("d", 0, 2, "f16", "scale amax/127"),
            Field("s", 2, 2, "f16", "fp16(sum(qs) * d), the float32 d", derived=True),
            Field("qs", 4, 32, "int8", "codes roundf(x/d)"),
        ),
        cache_type=False,
    )
    kernel_module = "tbq.formats.q8_ops_kernels"
    attention = CapabilitySlot(AttentionTraits)  # not a cache type: no fused attention reader
    checker = CapabilitySlot(Q8_1Checks)

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        d, v, q = q8_codes(x)
        s = _q8_1_sum(q.view(np.uint8), d)
        out = np.empty((x.shape[0], 36), np.uint8)
        put_f16_scale(out, d)
        put_f16_at(out, 2, s)
        out[:, 4:] = q.view(np.uint8)
        return out, {"d": d, "v": v, "s": s}

    def int_values(self, data: NDArray[np.uint8]) -> NDArray[np.int8]:
        return data[:, 4:].view(np.int8)  # the decoder is Q8_0's rule (ggml has none for Q8_1)

    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        return self.kernels().encode_q8_1(x, out, raise_overflow)

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        self.kernels().decode_q8_1(data, out, f16_table())

    def invalid_blocks(self, trace: Trace) -> NDArray[np.int8]:
        # d as every fp16 scale, and s too: |s| reaches 32 * amax, so s overflows fp16 from amax ~ 2048 on
        return overflow_status(self.scale_overflows(trace) | f16_overflows(np.asarray(trace["s"], F32)))

    def encode_error(self, status: int, block: int, values: NDArray[np.float32]) -> Exception:
        tr = block_trace(self, values)
        d, s = float(tr["d"][0]), float(tr["s"][0])
        return f16_field_error(
            self.name,
            block,
            (
                (f"the scale d = amax / 127 is {d!r}, which does not fit float16", d),
                (f"s = sum * d is {s!r}, which does not fit float16", s),
            ),
        )


def q8_k_codes(x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
    """Q8_K's arithmetic on float32 blocks (blocks, 256): ``(codes as uint8, trace)`` (see :class:`Q8_K`)."""
    n = x.shape[0]
    rows = np.arange(n)
    a = np.abs(x)
    first = np.argmax(a, axis=1)  # the first largest |x|: C updates on a strictly larger one
    mx = x[rows, first]
    zero = a[rows, first] == 0
    mx[zero] = F32(0)  # C's max stays +0 there (unused: such a block is written as zeros)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        iscale = np.where(zero, F32(0), _M127 / np.where(zero, _1, mx)).astype(F32)
        v = x * iscale[:, None]  # one float32 product, then nearest_int's addition: two roundings
        t = v + _MAGIC
        d = np.where(zero, F32(0), _1 / np.where(iscale == 0, _1, iscale)).astype(F32)
    # nearest_int: the low 23 bits of t less 2**22. For |v| < 2**22 that is rint(v) (half to even); for
    # v = +-inf or NaN (iscale overflowed) it is -2**22 or 0, whose int8 (gcc: the low byte) is 0.
    c = (t.view(np.uint32) & np.uint32(0x7FFFFF)).astype(np.int32) - np.int32(0x400000)
    c = np.minimum(c, np.int32(127))  # MIN(127, v): only -127 * max / max rounding up could reach 128
    q = (c & 0xFF).astype(np.uint8)
    q[zero] = 0
    return q, {"max": mx, "iscale": iscale, "d": d, "v": v}


class Q8_KChecks(CheckTraits):
    """Q8_K's :class:`CheckTraits`."""

    format: Q8_K

    tie_rule = "even"  # nearest_int: the 1.5 * 2**23 addition rounds half to even

    def dot_parts(self, data: NDArray[np.uint8]) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        return data[:, 4:260].view(np.int8).astype(np.int64), self.format._d(data).astype(np.float64)

    def undefined_blocks(self, trace: Trace) -> tuple[NDArray[np.bool_], str]:
        iscale = np.asarray(trace["iscale"], F32).reshape(-1)
        return np.isinf(iscale), (
            "|max| below 127 / FLT_MAX (about 3.7e-37): iscale = -127/max overflows float32, nearest_int's "
            "assert (|iscale * x| <= 4194303) fails (a debug build aborts) and the codes are the magic-number "
            "trick applied to +-Inf and NaN (a release build writes 0)"
        )

    def derived(self, data: NDArray[np.uint8], trace: Trace) -> NDArray[np.uint8]:
        # bsums from the block's own codes; an all-zero block's are unwritten by C (kept as they are)
        out = np.array(data, np.uint8, copy=True)
        unwritten = (self.format._d(out) == 0) & ~out[:, 4:260].any(axis=1)
        out[~unwritten, 260:] = _bsums(np.ascontiguousarray(out[~unwritten, 4:260]))
        return out

    def equivalent_blocks(self, ref: NDArray[np.uint8], got: NDArray[np.uint8]) -> NDArray[np.bool_]:
        # bsums do not enter the decoded values but every K-quant dot product (times d): they must be equal,
        # except where both scales are zero (C leaves an all-zero block's bsums unwritten; d * bsums is 0).
        same = super().equivalent_blocks(ref, got)
        sums = (ref[:, 260:] == got[:, 260:]).all(axis=1)
        return same & (sums | ((self.format._d(ref) == 0) & (self.format._d(got) == 0)))


class Q8_KQuantizer(QuantizerTraits):
    """Q8_K's :class:`QuantizerTraits`."""

    format: Q8_K

    def value_table(self, trace: Trace) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return self.int_levels(-128, 256, trace["v"])  # int8 codes rint(v), v = x * iscale


class Q8_K(Format):
    """ggml's Q8_K: float32 scale, 256 int8 codes, 16 int16 group sums; a dot-product operand, not a cache type."""

    info = FormatInfo(
        name="q8_k",
        block_size=256,
        index_bits=8,
        description="ggml Q8_K: float32 scale + 256 int8 codes + 16 int16 sums of 16 codes (the activation of K-quant dot products)",
        code=20,
        layout=(
            Field("d", 0, 4, "f32", "scale 1/iscale = max/-127 (float32)", specials=SPECIAL_F32),
            Field("qs", 4, 256, "int8", "codes min(127, rint(x * iscale)), iscale = -127/max"),
            Field("bsums", 260, 32, "int16", "bsums[g] = sum of codes 16g .. 16g+15", derived=True),
        ),
        cache_type=False,
    )
    kernel_module = "tbq.formats.q8_ops_kernels"
    checker = CapabilitySlot(Q8_KChecks)
    # the encoder multiplies by the traced iscale = -127/max, not by 1/d: the ties family aims at x * iscale
    fuzz = CapabilitySlot(
        FuzzTraits, hazards={"ties": {"divisor": 127.0, "codes": (-127, 126), "multiplier": "iscale"}}
    )
    quantizer = CapabilitySlot(Q8_KQuantizer)

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        n = x.shape[0]
        q, trace = q8_k_codes(x)
        out = np.empty((n, 292), np.uint8)
        out[:, :4] = trace["d"].astype("<f4").view(np.uint8).reshape(n, 4)
        out[:, 4:260] = q
        out[:, 260:] = _bsums(q)  # all zero in an all-zero block
        return out, trace

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        d = self._d(data)
        return d[:, None] * data[:, 4:260].view(np.int8).astype(F32)  # dequantize_row_q8_K: one float32 product

    @staticmethod
    def _d(data: NDArray[np.uint8]) -> NDArray[np.float32]:
        return np.ascontiguousarray(data[:, :4]).view("<f4").reshape(-1).astype(F32)

    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        return self.kernels().encode_q8_k(x, out, raise_overflow)

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        self.kernels().decode_q8_k(data, out)

    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # v = x * iscale; the code rint(v) changes at the half-integers.
        return band(np.rint, trace["v"], k)

    def fragile_scales(self, trace: Trace, k: int) -> NDArray[np.bool_]:
        # d is stored as the float32 it is, so any k >= 1 ulp change of d is a change of the stored scale
        # (a kernel computing max / -127 instead of 1 / iscale lands an ulp away); a zero d is exact.
        d = np.asarray(trace["d"], F32)
        return (d != 0) & (k > 0)

    def scale_overflows(self, trace: Trace) -> NDArray[np.bool_]:
        # d = 1/iscale is a finite float32 for every finite block (|d| <= FLT_MAX / 127): nothing to refuse
        return np.zeros(np.shape(trace["d"])[0], bool)
