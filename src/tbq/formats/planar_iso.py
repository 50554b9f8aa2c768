"""PLANAR3_0, ISO3_0, PLANAR4_0, ISO4_0 ("RotorQuant"): a fixed rotation + scalar codebook + fp16 corrected norm.

docs/formats.md, "PLANAR3_0 / ISO3_0 / PLANAR4_0 / ISO4_0" (the CPU reference of
the fork's ``ggml-planar-quant.c``, ``ggml-iso-quant.c``, ``ggml-planar4-quant.c``
and ``ggml-iso4-quant.c``). Per block of 128 values:

1. ``norm = sqrt(sum x_j^2)``, a sequential float32 sum from +0.0;
2. ``inv = 1/norm`` (0 when ``norm <= 1e-10``) and ``u = x * inv`` (a product, not a division);
3. ``r = R(u)``: planar = 64 independent Givens rotations of the pairs
   ``(2p, 2p+1)``, ``r0 = c*u0 - s*u1``, ``r1 = s*u0 + c*u1``; iso = 32
   quaternion left-multiplications ``q (x) u`` of the groups ``4g..4g+3``, each
   line evaluated left to right (``r0 = ((w*u0 - x*u1) - y*u2) - z*u3``, ...),
   every product and sum rounded;
4. ``idx = #{k : r >= t_k}`` with the derived thresholds ``t``: exactly the C
   nearest-centroid search (first index minimising ``|fl(r - C[i])|``) for
   ``|r| <= 1.5``; note ``t`` is asymmetric around 0, so ``r = +-0`` takes the
   negative centroid (index 3, or 7 for 4 bits);
5. ``recon = sqrt(sum C[idx_j]^2)`` (sequential), ``d = norm / recon`` (``norm``
   when ``recon <= 1e-10``, unreachable with these codebooks);
6. store fp16(d) and the indices: 3-bit as a 2-bit plane ``qs`` (4 per byte)
   and a bit-2 plane ``signs`` (8 per byte), 50 bytes; 4-bit as TBQ4_0's
   adjacent nibble pairs, 66 bytes.

Decoding: centroids, the inverse rotation (planar: ``c*q0 + s*q1``,
``(-s)*q0 + c*q1``; iso: ``conj(q) (x) v`` with the same line order), then
``y = f * fp16(d)``. The tables are the C code's float32 constants
(``tbq/data/planar_iso.json``, read by bit pattern); there are no options.

>>> b = PLANAR3_0().encode(np.zeros(128, np.float32))  # r = +-0 takes index 3 (the negative centroid)
>>> b[:4].tolist(), b[34:36].tolist()
([0, 0, 255, 255], [0, 0])
>>> f = ISO4_0()
>>> x = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
>>> q, tr = f.encode(x, trace=True)
>>> q.shape, sorted(tr)
((528,), ['d', 'norm', 'r', 'recon'])
>>> y = f.decode(q)
>>> bool(((y - x) ** 2).sum() / (x ** 2).sum() < 0.03)  # relative squared error about 0.018
True
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..float32 import get_f16_scale, put_f16_scale, seq_sum_squares
from ..half import f16_table
from ..packing import np_pack4_pairs, np_unpack4_pairs
from .base import Field, Format, FormatInfo, Trace, band, into_c_contiguous, ulp32
from .capabilities import AttentionTraits, CapabilitySlot, FuzzTraits, QuantizerTraits

F32 = np.float32
_ONE = F32(1.0)


@functools.cache
def planar_iso_tables() -> dict[str, NDArray[np.float32]]:
    """The shipped float32 tables (``tbq/data/planar_iso.json``), read by bit pattern: name -> read-only array."""
    raw = json.loads(resources.files("tbq").joinpath("data/planar_iso.json").read_text())
    out: dict[str, NDArray[np.float32]] = {}
    for key, entry in raw.items():
        if isinstance(entry, dict) and "float32_bits" in entry:
            a = np.array([int(b, 16) for b in entry["float32_bits"]], dtype=np.uint32).view(np.float32)
            a.setflags(write=False)
            out[key] = a
    return out


def _eps() -> np.float32:
    return planar_iso_tables()["eps_1e-10f"][0]  # 1e-10f = 0x2edbe6ff


def threshold_index(r: NDArray[np.float32], thresholds: NDArray[np.float32]) -> NDArray[np.uint8]:
    """``#{k : r >= t_k}`` as uint8: the spec's index rule (a NaN ``r`` gives 0, as the C search does).

    >>> t = planar_iso_tables()["derived_thresholds_3bit"]
    >>> threshold_index(np.float32([-0.0, 0.0, 2.0**-30, 1e-9, np.nan, 1.0]), t).tolist()
    [3, 3, 3, 4, 0, 7]
    """
    idx = np.zeros(np.shape(r), np.uint8)
    for t in thresholds:
        idx += r >= t  # NaN >= t is False for every t
    return idx


# --- the 3-bit planes (qs: 2 bits, 4 per byte; signs: bit 2, 8 per byte) -------------------


def pack_planes3(idx: NDArray[np.integer[Any]]) -> NDArray[np.uint8]:
    """uint8 (blocks, 48): ``qs[32]`` then ``signs[16]`` of 3-bit indices (blocks, 128).

    >>> pack_planes3(np.arange(128, dtype=np.uint8)[None] % 8)[0, [0, 1, 32]].tolist()  # qs[0], qs[1], signs[0]
    [228, 228, 240]
    """
    i = idx.astype(np.uint8)
    lo = i & np.uint8(3)
    qs = lo[:, 0::4] | (lo[:, 1::4] << 2) | (lo[:, 2::4] << 4) | (lo[:, 3::4] << 6)
    hi = (i >> 2) & np.uint8(1)
    signs = np.zeros((i.shape[0], i.shape[1] // 8), np.uint8)
    for t in range(8):
        signs |= hi[:, t::8] << t
    return np.concatenate([qs, signs], axis=1)


def unpack_planes3(planes: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """3-bit indices (..., 128) of the planes (..., 48) (``qs[32]`` then ``signs[16]``)."""
    qs, signs = planes[..., :32], planes[..., 32:48]
    j = np.arange(128)
    lo = (qs[..., j >> 2] >> (2 * (j & 3)).astype(np.uint8)) & np.uint8(3)
    hi = (signs[..., j >> 3] >> (j & 7).astype(np.uint8)) & np.uint8(1)
    return (lo | (hi << 2)).astype(np.uint8)


def _rotate(u: NDArray[np.float32], t: dict[str, NDArray[np.float32]]) -> NDArray[np.float32]:
    """The C rotation's lines on blocks (blocks, 128) with the tables ``t``: 64 Givens pairs (``givens_cos``,
    ``givens_sin``) or 32 quaternion products on the left (``quat_w`` .. ``quat_z``), in the C expressions' order of
    roundings."""
    r = np.empty_like(u)
    if "givens_cos" in t:
        c, s = t["givens_cos"], t["givens_sin"]
        u0, u1 = u[:, 0::2], u[:, 1::2]
        r[:, 0::2] = c * u0 - s * u1
        r[:, 1::2] = s * u0 + c * u1
    else:
        w, x, y, z = (t[k] for k in ("quat_w", "quat_x", "quat_y", "quat_z"))
        u0, u1, u2, u3 = u[:, 0::4], u[:, 1::4], u[:, 2::4], u[:, 3::4]
        r[:, 0::4] = ((w * u0 - x * u1) - y * u2) - z * u3
        r[:, 1::4] = ((w * u1 + x * u0) + y * u3) - z * u2
        r[:, 2::4] = ((w * u2 - x * u3) + y * u0) + z * u1
        r[:, 3::4] = ((w * u3 + x * u2) - y * u1) + z * u0
    return r


class _PlanarIsoQuantizer(QuantizerTraits):
    """PlanarIso's :class:`QuantizerTraits`."""

    format: _PlanarIso

    def rotated_view(self, trace: Trace) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
        return trace["norm"], trace["r"]

    def value_table(self, trace: Trace) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        # the centroids, met by r: the unit-norm block after the Givens / quaternion rotations
        return np.asarray(self.format.tables()["centroids"], np.float64), np.asarray(trace["r"], np.float64).ravel()


class _PlanarIsoAttention(AttentionTraits):
    """PlanarIso's :class:`AttentionTraits`."""

    format: _PlanarIso

    read = "attention_read"

    def tables(self) -> NDArray[np.float32]:
        rot = self.format._decode_tables()
        head = np.array(
            [self.format.bits, self.format._rot == "quat", self.format._k["centroids"].size, rot[0].size], np.float32
        )
        return np.concatenate([head, self.format._k["centroids"], *rot, f16_table()]).astype(np.float32)


class _PlanarIso(Format):
    """Shared body of the four formats: they differ in the rotation (``_rot``) and the codebook (``index_bits``)."""

    kernel_module = "tbq.formats.planar_iso_kernels"
    # rotated coordinates on the (asymmetric) derived thresholds
    fuzz = CapabilitySlot(FuzzTraits, hazards={"thresholds": {}})
    quantizer = CapabilitySlot(_PlanarIsoQuantizer)
    attention = CapabilitySlot(_PlanarIsoAttention)

    @property
    def _rot(self) -> str:
        """The rotation, which the format's name gives: ``"givens"`` (planar) or ``"quat"`` (iso)."""
        return _rotation_of(self.name)

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        t = planar_iso_tables()
        self.bits = self.info.index_bits
        #: the codebook, float32 (8 or 16 sorted values)
        self.centroids = t[f"centroids_{self.bits}bit"]
        #: the derived thresholds t_k (7 or 15): ``idx = #{k : r >= t_k}``
        self.thresholds = t[f"derived_thresholds_{self.bits}bit"]
        names = ("givens_cos", "givens_sin") if self._rot == "givens" else ("quat_w", "quat_x", "quat_y", "quat_z")
        self._rt: dict[str, NDArray[np.float32]] = {k: t[k] for k in names}
        #: the inverse rotation's tables: the conjugate (cos and w kept, the sines and x, y, z negated)
        self._rt_conj = {k: v if k in ("givens_cos", "quat_w") else -v for k, v in self._rt.items()}
        # Kernel tables (contiguous float32). (-s), (-x), ... are exact negations: (-s)*q == -(s*q).
        self._k = {k: np.ascontiguousarray(v) for k, v in self._rt.items()}
        self._k.update({"n" + k: np.ascontiguousarray(-v) for k, v in self._rt.items()})
        self._k["centroids"] = np.ascontiguousarray(self.centroids)
        self._k["thresholds"] = np.ascontiguousarray(self.thresholds)
        self._k["centroids_sq"] = (self.centroids * self.centroids).astype(F32)  # the exact float32 terms of recon^2
        # every kernel table read-only (copies where needed): numba types a read-only array apart from a writable
        # one, so a mix (the negated tables were writable, the shipped ones are not) compiled the decoder twice
        for name, a in self._k.items():
            if a.flags.writeable:
                a = a.copy()
                a.setflags(write=False)
                self._k[name] = a

    def tables(self) -> dict[str, NDArray[Any]]:
        """The exact float32 tables of this format: centroids, thresholds and the rotation (cos/sin or w/x/y/z)."""
        out = {"centroids": self.centroids.copy(), "thresholds": self.thresholds.copy()}
        out.update({k: v.copy() for k, v in self._rt.items()})
        return out

    # -- spec --------------------------------------------------------------------------------
    def _forward(self, u: NDArray[np.float32]) -> NDArray[np.float32]:
        """``r = R(u)`` on normalised blocks (blocks, 128), the C expressions' order of roundings."""
        return _rotate(u, self._rt)

    def _inverse(self, v: NDArray[np.float32]) -> NDArray[np.float32]:
        """``f = R^-1(v)`` on centroid values (blocks, 128), the C expressions' order of roundings.

        ``R^-1`` is ``R`` with the conjugate rotation (the sines, or the quaternions' x, y, z, negated), and the
        forward lines on the negated tables are the C decoder's lines bit for bit: ``(-s)*q == -(s*q)`` and
        ``a - (-b) == a + b`` exactly in IEEE arithmetic."""
        return _rotate(v, self._rt_conj)

    def rotate(self, x: NDArray[np.float32]) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
        """Steps 1-3 on clean float32 blocks (blocks, 128): ``(norm, r)``, the norm and the rotated normalised coordinates."""
        with np.errstate(all="ignore"):
            norm = np.sqrt(seq_sum_squares(x))
            inv = np.zeros_like(norm)
            # norm = +inf (norm^2 overflowed) passes the test and gives 1/inf = +0; NaN fails it: 0
            np.divide(_ONE, norm, out=inv, where=norm > _eps())
            u = x * inv[:, None]
            return norm, self._forward(u)

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        norm, r = self.rotate(x)
        idx = threshold_index(r, self.thresholds)
        with np.errstate(all="ignore"):
            recon = np.sqrt(seq_sum_squares(self.centroids[idx]))
            d = norm.copy()
            np.divide(norm, recon, out=d, where=recon > _eps())
        out = np.empty((x.shape[0], self.info.type_size), np.uint8)
        put_f16_scale(out, d)
        out[:, 2:] = np_pack4_pairs(idx) if self.bits == 4 else pack_planes3(idx)
        return out, {"norm": norm, "r": r, "recon": recon, "d": d}

    def _indices(self, payload: NDArray[np.uint8]) -> NDArray[np.uint8]:
        return np_unpack4_pairs(payload) if self.bits == 4 else unpack_planes3(payload)

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        d = get_f16_scale(data)
        return self._inverse(self.centroids[self._indices(data[:, 2:])]) * d[:, None]

    # -- kernels ---------------------------------------------------------------------------
    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        kn, k = self.kernels(), self._k
        quat = self._rot != "givens"
        if quat:
            rot = (k["quat_w"], k["quat_x"], k["quat_y"], k["quat_z"])
        else:
            rot = (k["givens_cos"], k["givens_sin"], k["givens_sin"], k["givens_sin"])  # unused slots: same shape
        return into_c_contiguous(  # the lane kernel stores 8 rows of indices at a time (vector stores)
            out,
            lambda o: kn.encode(
                x, o, self.bits, quat, k["thresholds"], k["centroids_sq"], *rot, raise_overflow, kn.LANES
            ),
        )

    def _decode_tables(
        self,
    ) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.float32], NDArray[np.float32]]:
        """The rotation tables of :func:`~tbq.formats.planar_iso_kernels.decode` (cos, sin, -sin, sin or w, x, y, z)."""
        k = self._k
        if self._rot == "givens":
            return (k["givens_cos"], k["givens_sin"], k["ngivens_sin"], k["givens_sin"])
        return (k["quat_w"], k["quat_x"], k["quat_y"], k["quat_z"])

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        kn, k = self.kernels(), self._k
        if self._rot == "givens":
            rot = (k["givens_cos"], k["givens_sin"], k["ngivens_sin"], k["givens_sin"])
            kn.decode(data, out, self.bits, False, k["centroids"], *rot, f16_table(), kn.LANES)
        else:
            rot = (k["quat_w"], k["quat_x"], k["quat_y"], k["quat_z"])
            kn.decode(data, out, self.bits, True, k["centroids"], *rot, f16_table(), kn.LANES)

    # -- structure ---------------------------------------------------------------------------
    def fields(self, data: ArrayLike) -> dict[str, NDArray[Any]]:
        """``{"d": float32 (..., n_blocks), "idx": uint8 (..., n_blocks, 128)}``, the 3-bit planes combined."""
        blocks = self._blocks(data)
        d = f16_table()[np.ascontiguousarray(blocks[..., 0:2]).view("<u2")[..., 0]]
        payload = blocks[..., 2:]
        if self.bits == 4:
            idx = np_unpack4_pairs(np.ascontiguousarray(payload).reshape(-1, payload.shape[-1])).reshape(
                payload.shape[:-1] + (128,)
            )
        else:
            idx = unpack_planes3(payload)
        return {"d": d, "idx": idx.astype(np.uint8)}

    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # v = r, the rotated coordinate; boundaries: the derived thresholds (r >= t_k).
        #
        # Magnitude floor. A rotated coordinate is a 2-term (Givens) or 4-term
        # (quaternion) sum of products coef*u_i with |coef| <= 1, so a legitimate
        # difference in rounding (an FMA skipping a product's rounding, another
        # summation order) moves it by a few ulps of the *terms*, not of r: at
        # the middle threshold (2**-30 / 2**-32) r is a cancellation and its own
        # ulp is tiny, which would make the mask blind there. The terms are
        # bounded by the norm of the pair/group, and the rotation is orthonormal
        # to about one ulp, so the floor of each coordinate is the 2-norm of its
        # own pair/group of r (the largest partial sum of a quaternion line is at
        # most 2x that, one more ulp of margin, which k covers). Data-dependent,
        # so the floor adapts to outlier groups where a single scalar would not.
        # An explicit ``ulp_floor`` replaces it by that scalar (0 = literal ulps).
        r = np.asarray(trace["r"], np.float32)
        if ulp_floor is None:
            g = 2 if self._rot == "givens" else 4
            r64 = r.astype(np.float64)
            grp = np.sqrt((r64 * r64).reshape(r.shape[:-1] + (r.shape[-1] // g, g)).sum(-1))
            floor: float | NDArray[np.float64] = np.repeat(grp, g, axis=-1)

        else:
            floor = float(ulp_floor)
        thr = self.thresholds.astype(np.float64)
        return band(lambda v: np.searchsorted(thr, v, side="right"), r, k, floor)

    def decode_tolerance(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        # How far a decoder that contracts a*b + c into fused multiply-adds may land from
        # the strict y (the spec's FMA section), per value, from the magnitudes of its terms.
        #
        # One output line is f = ((p_0 + p_1) + p_2) + ... with n = 2 (Givens) or 4
        # (quaternion) exact products p_i = coef * C[idx] (|coef| <= 1). Strictly every
        # p_i and every partial sum is rounded. Contraction turns each of the n-1
        # additions into an FMA that takes one product unrounded (fma(coef, v, s)):
        # at most n-1 product roundings are skipped, each worth at most ulp(P)/2
        # with P = max|p_i|. Every partial sum is still rounded on both sides, but
        # of arguments that now differ, so each of the n-1 sum roundings can land
        # one ulp apart: at most ulp(S) each, S = sum|p_i| >= every partial sum
        # (|rnd(A) - rnd(B)| <= |A - B| + ulp(max)). By induction over the chain:
        #     |f' - f| <= (n-1) * (ulp(P)/2 + ulp(S)).
        # The final y = f * D (D = fp16(d), exact) cannot be contracted; it scales
        # that by D and its own rounding of two different arguments adds one ulp:
        #     |y' - y| <= D * (n-1) * (ulp(P)/2 + ulp(S)) + ulp(S * D).
        # (Givens: n-1 = 1; quaternion: a chain of up to three FMAs, n-1 = 3.)
        # Sizes: 3-bit P <= 0.191, S <= 0.27 (Givens) / 0.38 (quaternion), so the
        # bound is at most ~1.2 (planar) / ~3.4 (iso) * 2**-24 * d; the spec measured
        # 1.14 * 2**-24 * d. D = 0 gives +-0 either way (0); Inf/NaN D: unbounded (inf).
        blocks = np.asarray(data, np.uint8).reshape(-1, self.type_size)
        D = np.abs(get_f16_scale(blocks).astype(np.float64))[
            :, None
        ]  # a bound: |D| (arbitrary bytes may hold a negative scale)
        v = self.centroids[self._indices(blocks[:, 2:])].astype(np.float64)
        n = 2 if self._rot == "givens" else 4
        if n == 2:
            c, s = (self._rt[k].astype(np.float64) for k in ("givens_cos", "givens_sin"))
            a0, a1 = np.abs(c * v[:, 0::2]), np.abs(s * v[:, 1::2])  # line 2p: c*q0 + s*q1
            b0, b1 = np.abs(s * v[:, 0::2]), np.abs(c * v[:, 1::2])  # line 2p+1: (-s)*q0 + c*q1
            P = np.empty_like(v)
            S = np.empty_like(v)
            P[:, 0::2], S[:, 0::2] = np.maximum(a0, a1), a0 + a1
            P[:, 1::2], S[:, 1::2] = np.maximum(b0, b1), b0 + b1
        else:
            q = np.stack([self._rt[k].astype(np.float64) for k in ("quat_w", "quat_x", "quat_y", "quat_z")])
            av = np.abs(v).reshape(v.shape[0], 32, 4)
            # every line of a group multiplies each of the 4 values by one of |w|,|x|,|y|,|z|, a permutation:
            # line 0: (w,x,y,z).(v0,v1,v2,v3); 1: (x,w,z,y); 2: (y,z,w,x); 3: (z,y,x,w) (up to signs)
            perms = ((0, 1, 2, 3), (1, 0, 3, 2), (2, 3, 0, 1), (3, 2, 1, 0))
            aq = np.abs(q).T  # (32, 4)
            P = np.empty_like(av)
            S = np.empty_like(av)
            for line, perm in enumerate(perms):
                terms = aq[None, :, list(perm)] * av  # |coef_i * v_i|
                P[:, :, line] = terms.max(-1)
                S[:, :, line] = terms.sum(-1)
            P, S = P.reshape(v.shape), S.reshape(v.shape)
        slack = 1.0 + 2.0**-20  # partial sums may round up past S: take the ulp just above it
        with np.errstate(all="ignore"):
            tol = D * (n - 1) * (ulp32(P) / 2 + ulp32(S * slack)) + ulp32(S * slack * D)
            tol = np.where(D == 0, 0.0, tol)
            tol = np.where(np.isfinite(D), tol, np.inf)
        return tol.astype(np.float32)


_LAYOUT = {
    3: (
        Field("d", 0, 2, "f16", "corrected norm"),
        Field("qs", 2, 32, "uint8", "low 2 bits of index j at byte j/4, bits 2(j%4)..2(j%4)+1"),
        Field("signs", 34, 16, "uint8", "bit 2 of index j at byte j/8, bit j%8"),
    ),
    4: (
        Field("d", 0, 2, "f16", "corrected norm"),
        Field("qs", 2, 64, "u4_pairs", "indices, byte k = idx[2k] | idx[2k+1] << 4"),
    ),
}
_ROTATIONS = {"givens": "64 Givens rotations", "quat": "32 quaternion rotations"}


def _rotation_of(name: str) -> str:
    """``"givens"`` for planar3_0 and planar4_0, ``"quat"`` for iso3_0 and iso4_0."""
    return "givens" if name.startswith("planar") else "quat"


def _info(name: str, *, code: int, bits: int) -> FormatInfo:
    """The family's table row: 128 values, an fp16 norm and ``bits``-bit indices after the format's rotation."""
    return FormatInfo(
        name=name,
        block_size=128,
        rotated=True,
        index_bits=bits,
        description=f"{name.upper()}: fp16 norm + 128 {bits}-bit indices after {_ROTATIONS[_rotation_of(name)]}",
        code=code,
        layout=_LAYOUT[bits],
    )


class PLANAR3_0(_PlanarIso):
    """PLANAR3_0: 128 values -> fp16 corrected norm + 3-bit indices after 64 Givens rotations (50 bytes)."""

    info = _info("planar3_0", code=13, bits=3)


class ISO3_0(_PlanarIso):
    """ISO3_0: 128 values -> fp16 corrected norm + 3-bit indices after 32 quaternion left-multiplications (50 bytes)."""

    info = _info("iso3_0", code=14, bits=3)


class PLANAR4_0(_PlanarIso):
    """PLANAR4_0: 128 values -> fp16 corrected norm + 4-bit indices after 64 Givens rotations (66 bytes)."""

    info = _info("planar4_0", code=15, bits=4)


class ISO4_0(_PlanarIso):
    """ISO4_0: 128 values -> fp16 corrected norm + 4-bit indices after 32 quaternion left-multiplications (66 bytes)."""

    info = _info("iso4_0", code=16, bits=4)
