"""TBQ4_0 and TBQ3_0: randomized Hadamard rotation + scalar codebook + fp16 corrected norm.

docs/formats.md, "TBQ4_0 / TBQ3_0". Per block of 128 values:

1. ``norm = sqrt(sum x_j^2)``, a sequential float32 sum from +0.0;
2. ``u = x * (1/norm)`` (TBQ4_0; ``1/norm`` is 0 when ``norm <= 1e-10``) or
   ``u = x / max(norm, 1e-10)`` (TBQ3_0, a division), then ``r = s2 * H(s1 * u)``
   with the butterfly of :func:`tbq.rotation.fwht` and the scale ``1/sqrt(128)``;
3. ``idx = number of thresholds <= r`` (the codebook);
4. ``recon = sqrt(sum c[idx_j]^2)`` (sequential), ``d = norm / recon`` (TBQ4_0:
   ``norm`` when ``recon <= 1e-10``; TBQ3_0: ``norm / max(recon, 1e-10)``);
5. store fp16(d) and the indices: 4-bit adjacent pairs (66 bytes) or 3-bit
   24-bit lanes (50 bytes).

Decoding: ``y = s1 * H(s2 * c[idx]) * fp16(d)``.

Options: ``codebook`` (``"lloyd-max"`` default, ``"turboq-mtp"``, or a
:class:`~tbq.codebooks.Codebook`) and ``signs`` (``"turboq-mtp"`` default, an
integer seed, or a pair of +-1 arrays of length 128).

>>> f = TBQ4_0(signs=3)
>>> b, tr = f.encode(np.linspace(-1, 1, 128, dtype=np.float32), trace=True)
>>> b.shape, sorted(tr)
((66,), ['d', 'norm', 'r', 'recon'])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..codebooks import CODEBOOK_NAMES, Codebook, get_codebook, named_codebook
from ..errors import ConfigError, is_integer
from ..float32 import get_f16_scale, put_f16_scale, seq_sum_squares
from ..half import f16_table
from ..packing import np_pack3, np_pack4_pairs, np_unpack3, np_unpack4_pairs
from ..rotation import RandomizedHadamard, get_rotation, hadamard_scale, turboq_mtp_signs
from .base import Field, Format, FormatInfo, Option, Trace, band, into_c_contiguous
from .capabilities import AttentionTraits, CapabilitySlot, CheckTraits, FuzzTraits, GoldenTraits, QuantizerTraits

F32 = np.float32
_ONE = F32(1.0)
_EPS_NORM = F32(1e-10)

#: Fragility of rotated coordinates: a coordinate below this magnitude counts
#: ulps at this magnitude. The butterfly builds each coordinate from partial
#: sums of magnitude ~1/sqrt(128), so its rounding error is a few ulps of
#: *that*, not of the (possibly tiny) coordinate; without the floor the mask
#: would be blind at the threshold 0. 0 gives the literal ulp distance.
TBQ_ULP_FLOOR = 2.0**-4


def _codebook_config(cb: Codebook, bits: int) -> str | dict[str, list[float]]:
    for name in CODEBOOK_NAMES:
        try:
            if cb == named_codebook(name, bits):
                return name
        except ConfigError:
            pass
    return cb.to_config()


def _signs_config(spec: object, rot: RandomizedHadamard) -> int | str | dict[str, list[int]]:
    if is_integer(spec):
        return int(spec)
    s1, s2 = turboq_mtp_signs()
    if np.array_equal(rot.signs1, s1) and np.array_equal(rot.signs2, s2):
        return "turboq-mtp"
    return {"signs1": rot.signs1.tolist(), "signs2": rot.signs2.tolist()}


class _TBQAttention(AttentionTraits):
    """TBQ's :class:`AttentionTraits`."""

    format: _TBQ

    domain = "rotated"
    read = "attention_read"

    def tables(self) -> NDArray[np.float32]:
        return np.concatenate([self.format._k["f16"], self.format._k["centroids"]]).astype(
            np.float32
        )  # tbq_kernels.attention_read


class _TBQQuantizer(QuantizerTraits):
    """TBQ's :class:`QuantizerTraits`."""

    format: _TBQ

    def rotated_view(self, trace: Trace) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
        return trace["norm"], trace["r"]

    def value_table(self, trace: Trace) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        # the codebook's centroids, met by r: the unit-norm block, rotated
        return self.format.codebook.centroids.astype(np.float64), np.asarray(trace["r"], np.float64).ravel()


class _TBQ(Format):
    """Shared body of TBQ4_0 and TBQ3_0 (they differ in step 1's division and the packing)."""

    options = {
        "codebook": Option(
            "lloyd-max",
            "'lloyd-max', 'turboq-mtp' or a tbq.Codebook",
            "the scalar codebook of the rotated coordinates",
            known=("lloyd-max", "turboq-mtp"),
        ),
        "signs": Option(
            "turboq-mtp",
            "'turboq-mtp', an integer seed or a pair of +-1 arrays",
            "the rotation's two sign vectors",
            known=("turboq-mtp", 0, 1, 42),
        ),
    }
    kernel_module = "tbq.formats.tbq_kernels"
    attention = CapabilitySlot(_TBQAttention)
    golden = CapabilitySlot(GoldenTraits, ulp_floor=TBQ_ULP_FLOOR)
    fuzz = CapabilitySlot(FuzzTraits, hazards={"thresholds": {}})
    #: The fork's ggml_vec_dot_tbq{4,3}_0_q8_K: no integer form (dot_parts is None), so the dot-product check
    #: takes the decoded values against q8_K's codes * d, 256 values (two blocks) a unit.
    checker = CapabilitySlot(CheckTraits, vec_dot_type="q8_k")
    quantizer = CapabilitySlot(_TBQQuantizer)

    def __init__(
        self,
        *,
        codebook: str | Codebook | dict[str, ArrayLike] = "lloyd-max",
        signs: str
        | int
        | np.integer[Any]
        | RandomizedHadamard
        | dict[str, ArrayLike]
        | Sequence[ArrayLike] = "turboq-mtp",
    ) -> None:
        bits = self.info.index_bits
        self.bits = bits
        self.codebook: Codebook = get_codebook(codebook, bits)
        self.rotation: RandomizedHadamard = get_rotation(signs, self.info.block_size)
        self._config: dict[str, Any] = {
            "codebook": _codebook_config(self.codebook, bits),
            "signs": _signs_config(signs, self.rotation),
        }
        c = self.codebook.centroids
        C = hadamard_scale(self.info.block_size, np.float32)
        s1 = self.rotation.signs1.astype(np.float32)
        s2 = self.rotation.signs2.astype(np.float32)
        # Kernel tables. Folding the +-1 signs into a constant is exact: x*(+-C) == +-(x*C).
        self._k = dict(
            thresholds=np.ascontiguousarray(self.codebook.thresholds),
            centroids=np.ascontiguousarray(c),
            centroids_sq=(c * c).astype(np.float32),
            s1=s1,
            s2=s2,
            cs1=(C * s1).astype(np.float32),
            cs2=(C * s2).astype(np.float32),
            f16=f16_table(),
        )

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    # -- spec ----------------------------------------------------------------------------
    def rotate(self, x: NDArray[np.float32]) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
        """Steps 1-2 on clean float32 blocks: ``(norm, r)``, the norm and the rotated normalised coordinates."""
        with np.errstate(all="ignore"):
            norm = np.sqrt(seq_sum_squares(x))
            if self.bits == 4:
                inv = np.zeros_like(norm)
                np.divide(_ONE, norm, out=inv, where=norm > _EPS_NORM)
                u = x * inv[:, None]
            else:
                norm = np.maximum(norm, _EPS_NORM)
                u = x / norm[:, None]  # a division, not a multiply by the reciprocal
            return norm, self.rotation.forward(u)

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        norm, r = self.rotate(x)
        idx = self.codebook.index(r)
        recon = np.sqrt(seq_sum_squares(self.codebook.centroids[idx]))
        if self.bits == 4:
            d = norm.copy()
            np.divide(norm, recon, out=d, where=recon > _EPS_NORM)
        else:
            d = norm / np.maximum(recon, _EPS_NORM)
        out = np.empty((x.shape[0], self.info.type_size), np.uint8)
        put_f16_scale(out, d)
        out[:, 2:] = np_pack4_pairs(idx) if self.bits == 4 else np_pack3(idx)
        return out, {"norm": norm, "r": r, "recon": recon, "d": d}

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        d = get_f16_scale(data)
        idx = np_unpack4_pairs(data[:, 2:]) if self.bits == 4 else np_unpack3(data[:, 2:])
        return self.rotation.inverse(self.codebook.centroids[idx]) * d[:, None]

    # -- kernels ---------------------------------------------------------------------------

    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        kn, k = self.kernels(), self._k
        if x.shape[0] < kn.SMALL_BLOCKS:
            return kn.encode_blocks(
                x, out, self.bits, k["thresholds"], k["centroids_sq"], k["s1"], k["cs2"], raise_overflow
            )
        return into_c_contiguous(  # the lane kernel stores 8 rows of indices at a time (vector stores)
            out,
            lambda o: kn.encode(
                x, o, self.bits, k["thresholds"], k["centroids_sq"], k["s1"], k["cs2"], raise_overflow, kn.LANES
            ),
        )

    def kernel_rotate(
        self, x: NDArray[np.float32], with_scale: bool = True
    ) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.float32]]:
        """``(norm, r, d)`` of finite float32 blocks by the numba kernel: the trace's, bit for bit
        (``d`` all zero without ``with_scale``).

        For the fuzzing strategies (:mod:`tbq.testing.strategies`), which ask for the rotated coordinates
        and scales of candidate blocks thousands of times per example; not for NaN or infinite input.
        """
        kn, k = self.kernels(), self._k
        n = x.shape[0]
        norm, d = np.empty(n, np.float32), np.zeros(n, np.float32)
        r = np.empty_like(x)
        kn.rotate_blocks(x, self.bits, k["thresholds"], k["centroids_sq"], k["s1"], k["cs2"], norm, r, d, with_scale)
        return norm, r, d

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        kn, k = self.kernels(), self._k
        if data.shape[0] < kn.SMALL_BLOCKS:
            kn.decode_blocks(data, out, self.bits, k["centroids"], k["s2"], k["cs1"], k["f16"])
        else:
            kn.decode(data, out, self.bits, k["centroids"], k["s2"], k["cs1"], k["f16"], kn.LANES)

    # -- structure ---------------------------------------------------------------------------
    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # v = r, the rotated coordinate; boundaries: the codebook's thresholds.
        floor = self.golden.ulp_floor if ulp_floor is None else float(ulp_floor)
        thr = self.codebook.thresholds.astype(np.float64)
        return band(lambda y: np.searchsorted(thr, y, side="right"), trace["r"], k, floor)

    def tables(self) -> dict[str, NDArray[Any]]:
        """The exact tables this instance uses: centroids, thresholds (float32), signs1, signs2 (int8)."""
        return {
            "centroids": self.codebook.centroids.copy(),
            "thresholds": self.codebook.thresholds.copy(),
            "signs1": self.rotation.signs1.astype(np.int8),
            "signs2": self.rotation.signs2.astype(np.int8),
        }


def _info(*, bits: int, code: int, idx: Field) -> FormatInfo:
    """TBQ<bits>_0's table row: 128 values, the fp16 norm and the indices ``idx``; a block may span two heads."""
    return FormatInfo(
        name=f"tbq{bits}_0",
        block_size=128,
        rotated=True,
        index_bits=bits,
        description=f"TBQ{bits}_0: fp16 norm + 128 rotated {bits}-bit Lloyd-Max indices",
        code=code,
        row_tiled=True,
        layout=(Field("d", 0, 2, "f16", "corrected norm"), idx),
    )


class TBQ4_0(_TBQ):
    """TBQ4_0: 128 values -> fp16 corrected norm + 128 4-bit indices in adjacent pairs (66 bytes)."""

    info = _info(
        bits=4, code=3, idx=Field("idx", 2, 64, "u4_pairs", "codebook indices, byte k = idx[2k] | idx[2k+1] << 4")
    )


class TBQ3_0(_TBQ):
    """TBQ3_0: 128 values -> fp16 corrected norm + 128 3-bit indices in 24-bit lanes (50 bytes)."""

    info = _info(
        bits=3, code=4, idx=Field("idx", 2, 48, "u3_lanes", "codebook indices, 8 per 24-bit little-endian lane")
    )
