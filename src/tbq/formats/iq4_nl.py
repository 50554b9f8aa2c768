"""IQ4_NL (ggml): 32 values -> fp16 scale + 32 4-bit indices into a non-linear table, 18 bytes.

docs/formats.md, "IQ4_NL". ``quantize_row_iq4_nl_ref`` with ``ntry = -1``: one
pass, no scale search. Per block:

1. ``w_j = x_j * x_j``; ``max`` = the signed value of the first element of
   largest magnitude;
2. a block with ``amax < 1e-15f`` is *tiny* (see below);
3. ``d0 = max / -127``, ``id = 1 / d0``; ``a_j = id * x_j``;
   ``l_j = best(a_j)``, the nearest entry of
   ``K = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]``
   (between ``K[i] <= a < K[i+1]``: ``i`` if ``float32(a - K[i]) <
   float32(K[i+1] - a)``, else ``i + 1``: an exact tie goes to the *upper* index);
4. ``sumqx += (w_j * q_j) * x_j``, ``sumq2 += (w_j * q_j) * q_j``
   (``q_j = K[l_j]``, sequential float32 sums from +0) and ``d = sumqx / sumq2``;
   store ``fp16(d)`` and the indices in ggml's split-half order. The indices
   stay those chosen with ``d0``.

Decode: ``y_j = fp16(d) * K[l_j]``.

Tiny blocks (the row rule): C does not compute indices for them but packs its
index array as the previous block of the *same call* left it. tbq encodes every
row (the last axis) as one call: a tiny block repeats the indices of the
nearest earlier non-tiny block of its row and stores ``d = +0``; a tiny block
with no earlier non-tiny block in its row reads uninitialised memory in C
(undefined behaviour) and gets index 8 everywhere (bytes ``0x88``), as the
conformance vectors define. The trace's ``"carried"`` says which case applied
(0 computed, 1 carried, 2 undefined in C: index 8). Decoded tiny blocks are
``0 * K[l]``: ``+0`` for indices 8..15 and ``-0`` for 0..7.

A scale that does not fit fp16 (``|max| >~ 8.3e6``, or NaN when ``x*x``
overflows float32) is refused unless ``on_overflow="inf"``.

>>> x = np.zeros(64, np.float32); x[0] = -127.0  # a one-hot block, then an all-zero block
>>> q = IQ4_NL().encode(x)
>>> q[:4].tolist(), q[18:22].tolist()  # d = 1.0; the zero block stores d = +0 and repeats the indices
([0, 60, 128, 136], [0, 0, 128, 136])
>>> IQ4_NL().decode(q)[32:34].tolist()  # 0 * K[0] = -0.0
[-0.0, 0.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..errors import ScaleOverflowError
from ..float32 import put_f16_scale
from ..packing import np_pack4_halves, np_unpack4_halves
from ._shared import ScaledInt, ScaledIntChecks
from .base import F16_OVERFLOW_WHY, Field, FormatInfo, Trace, band, block_trace
from .capabilities import CapabilitySlot, FuzzTraits, QuantizerTraits

__all__ = ["IQ4_NL", "IQ4_NL_VALUES", "IQ4_NL_MIDPOINTS", "iq4_nl_best"]

F32 = np.float32
_0 = F32(0.0)
_1 = F32(1.0)
_M127 = F32(-127.0)
_TINY = F32(1e-15)  # GROUP_MAX_EPS = 1e-15f = 0x1.203afap-50

#: ``kvalues_iq4nl``: the 16 levels (int8).
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
_KF = IQ4_NL_VALUES.astype(np.float32)
#: The 15 midpoints ``(K[i] + K[i+1]) / 2`` (exact in float32). ``best(a)`` equals the
#: number of midpoints ``<= a`` for every float32 ``a`` (see :func:`iq4_nl_best`).
IQ4_NL_MIDPOINTS = ((IQ4_NL_VALUES[:-1].astype(np.float32) + IQ4_NL_VALUES[1:].astype(np.float32)) / F32(2)).astype(
    np.float32
)


def iq4_nl_best(a: ArrayLike) -> NDArray[np.intp]:
    """``best_index_int8(16, K, a)`` of the spec, literally, on float32 ``a`` (int64 indices).

    ``a <= -127`` -> 0, ``a >= 113`` -> 15; otherwise with ``K[i] <= a < K[i+1]``:
    ``i`` if ``float32(a - K[i]) < float32(K[i+1] - a)`` else ``i + 1``.

    The numba kernel instead counts the midpoints ``<= a``. The two agree for
    every float32: near a midpoint ``m`` both differences lie in ``a``'s binade
    or below, so they are exact and ``lo < hi`` is ``a < m`` exactly; away from
    it they differ by far more than their rounding. (Checked exhaustively
    over all float32 in [-128, 114]; tests/test_format_iq4_nl.py checks every
    midpoint and level +-64 ulps.)

    >>> iq4_nl_best(np.float32([-4.5, 7.0, 6.9999995, 0.0])).tolist()
    [8, 9, 8, 8]
    """
    a = np.asarray(a, np.float32)
    i = np.clip(np.searchsorted(_KF, a, side="right") - 1, 0, 14)
    with np.errstate(invalid="ignore"):
        lo = a - _KF[i]
        hi = _KF[i + 1] - a
    best = np.where(lo < hi, i, i + 1)
    best = np.where(a <= _KF[0], 0, best)
    return np.where(a >= _KF[15], 15, best)  # NaN would give 15 in C; never reached from finite input


def _code64(a: NDArray[np.float64]) -> NDArray[np.intp]:
    """The index as a monotone function of ``a`` (float64): midpoints count, ties up."""
    return np.searchsorted(IQ4_NL_MIDPOINTS.astype(np.float64), a, side="right")


class IQ4_NLQuantizer(QuantizerTraits):
    """IQ4_NL's :class:`QuantizerTraits`."""

    format: IQ4_NL

    def value_table(self, trace: Trace) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        # the int8 table K, met by a = x / d0 (d0 = max / -127)
        return np.asarray(self.format.tables()["values"], np.float64), np.asarray(trace["a"], np.float64).ravel()


class IQ4_NL(ScaledInt):
    """IQ4_NL: fp16 least-squares scale + 32 4-bit indices into ``kvalues_iq4nl`` (split halves)."""

    info = FormatInfo(
        name="iq4_nl",
        block_size=32,
        index_bits=4,
        description="ggml IQ4_NL: fp16 scale + 32 4-bit indices into a non-linear table (split halves)",
        code=10,
        layout=(
            Field("d", 0, 2, "f16", "least-squares scale sum(w q x) / sum(w q q), w = x*x"),
            Field(
                "qs",
                2,
                16,
                "u4_halves",
                "indices into kvalues_iq4nl chosen with max/-127, byte j = l[j] | l[j+16] << 4",
            ),
        ),
    )
    kernel_module = "tbq.formats.iq4_nl_kernels"
    # ggml_vec_dot_iq4_nl_q8_0; the encoder's reciprocal is of d0 = max/-127, not of the traced least-squares d
    checker = CapabilitySlot(ScaledIntChecks, vec_dot_type="q8_0", reciprocal_scale=False)
    #: the strategies aim at x/d0 halfway between two table values (ties go up) and at the 1e-15 tiny-block rule
    fuzz = CapabilitySlot(
        FuzzTraits, hazards={"grid_ties": {"table": tuple(int(v) for v in IQ4_NL_VALUES), "divisor": -127.0}}
    )
    quantizer = CapabilitySlot(IQ4_NLQuantizer)
    row_rule = True

    # -- spec ----------------------------------------------------------------------
    def reference_encode(
        self, x: NDArray[np.float32], row_blocks: int | None = None
    ) -> tuple[NDArray[np.uint8], Trace]:
        """Encode whole rows of ``row_blocks`` blocks each (None: all of ``x`` is one row, one C call)."""
        n = x.shape[0]
        if n == 0:  # no rows (e.g. a row whose first block is not finite: nothing before it to write)
            z = np.zeros(0, np.float32)
            return np.empty((0, self.info.type_size), np.uint8), {
                "d0": z,
                "a": np.zeros((0, 32), np.float32),
                "d": z,
                "carried": z,
            }
        rows = np.arange(n)
        ax = np.abs(x)
        amax = ax.max(axis=1)
        m = x[rows, np.argmax(ax, axis=1)]  # signed, the first of equal magnitudes (C: strict > from 0)
        tiny = amax < _TINY
        m = np.where(tiny, _M127, m)  # tiny blocks compute nothing; keep their arithmetic harmless
        with np.errstate(all="ignore"):
            d0 = m / _M127
            inv = _1 / d0
            a = inv[:, None] * x
            a[tiny] = _0
            l = iq4_nl_best(a)
            q = _KF[l]
            w = x * x
            sumqx = np.zeros(n, np.float32)
            sumq2 = np.zeros(n, np.float32)
            for j in range(x.shape[1]):  # sequential, from +0; every product rounded on its own
                t = w[:, j] * q[:, j]
                sumqx = sumqx + t * x[:, j]
                sumq2 = sumq2 + t * q[:, j]
            d = np.zeros(n, np.float32)
            np.divide(sumqx, sumq2, out=d, where=sumq2 > _0)
        d[tiny] = _0
        d0[tiny] = _0
        # the row rule: a tiny block repeats the indices of the nearest earlier non-tiny block of its row
        R = max(n if row_blocks is None else int(row_blocks), 1)
        lr = l.reshape(-1, R, x.shape[1])
        tr = tiny.reshape(-1, R)
        carried = np.zeros(tr.shape, np.float32)
        last = np.full((lr.shape[0], x.shape[1]), 8, l.dtype)  # C: uninitialised; the vectors define index 8
        have = np.zeros(lr.shape[0], bool)
        for b in range(R):
            t = tr[:, b]
            lr[:, b] = np.where(t[:, None], last, lr[:, b])
            carried[:, b] = np.where(t, np.where(have, F32(1), F32(2)), _0)
            last = lr[:, b].copy()
            have |= ~t
        out = np.empty((n, 18), np.uint8)
        put_f16_scale(out, d)
        out[:, 2:] = np_pack4_halves(lr.reshape(n, -1).astype(np.uint8))
        return out, {"d0": d0, "a": a, "d": d, "carried": carried.reshape(n)}

    def int_values(self, data: NDArray[np.uint8]) -> NDArray[np.int8]:
        return IQ4_NL_VALUES[np_unpack4_halves(data[:, 2:])]

    def tables(self) -> dict[str, NDArray[Any]]:
        """``values`` (int8, kvalues_iq4nl) and ``midpoints`` (float32)."""
        return {"values": IQ4_NL_VALUES.copy(), "midpoints": IQ4_NL_MIDPOINTS.copy()}

    # -- kernels -------------------------------------------------------------------
    def kernel_encode(
        self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool, row_blocks: int | None = None
    ) -> tuple[int, int]:

        return self.kernels().encode(
            x, out, raise_overflow, max(x.shape[0] if row_blocks is None else int(row_blocks), 1)
        )

    # -- refusals --------------------------------------------------------------------
    def encode_error(self, status: int, block: int, values: NDArray[np.float32]) -> Exception:
        d = float(block_trace(self, values)["d"][0])
        if d != d:
            why = (
                "is NaN: x*x overflows float32 (|x| >= ~1.8e19), so sum(w q x) / sum(w q q) is inf/inf; "
                "the C reference stores the fp16 NaN 0xFE00"
            )
        else:
            why = f"does not fit float16 {F16_OVERFLOW_WHY}"
        return ScaleOverflowError(
            f"{self.name}: the scale of block {block} is {d!r}, which {why}. "
            "Pass on_overflow='inf' to store what the C reference stores",
            block=block,
            scale=d,
        )

    # -- fragility --------------------------------------------------------------------
    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # v = a = id * x; best(a) changes at the midpoints (an exact midpoint counts: the tie rule).
        # A tiny block's indices are copies of the nearest earlier computed block of its row
        # (carried == 1; the flat order finds it, as no row boundary lies in between), so
        # they are fragile where that block's are (they decode to +-0: only the zero's sign).
        a = np.asarray(trace["a"])
        fr = band(_code64, a, k)
        carried = np.asarray(trace["carried"]).reshape(-1)
        fr2 = fr.reshape(-1, a.shape[-1])
        blocks = np.arange(carried.shape[0])
        src = np.maximum.accumulate(np.where(carried == 0, blocks, -1)) if blocks.size else blocks
        take = (carried == 1) & (src >= 0)
        fr2[take] = fr2[src[take]]
        fr2[carried == 2] = False
        return fr2.reshape(fr.shape)
