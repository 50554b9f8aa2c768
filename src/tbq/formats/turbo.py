"""TURBO2, TURBO3, TURBO4: the KV-cache types ``turbo2``/``turbo3``/``turbo4`` of the community llama.cpp fork.

docs/formats.md, "TURBO2 / TURBO3 / TURBO4" (the CPU reference of the fork's
``ggml-turbo-quant.c``: ``quantize_row_turbo{2,3,4}_0_ref`` and
``dequantize_row_turbo{2,3,4}_0``). Per block of 128 values:

1. ``norm = sqrt(sum x_j^2)``, a sequential float32 sum from +0.0;
2. ``inv = 1/norm`` (0 unless ``norm > 1e-10``) and ``u = x * inv`` (a product, not a division;
   turbo4 sets ``u = +0`` outright when the test fails, which differs only for a NaN norm);
3. ``r = R(u)``: TBQ's randomized Walsh-Hadamard rotation with the ``turboq-mtp`` signs
   (``s1``, the butterfly, then ``* (+-1/sqrt(128))``), :class:`tbq.rotation.RandomizedHadamard`;
4. ``idx = #{k : not (r < t_k)}`` with the C code's 6-digit literal thresholds ``t`` (not the
   exact midpoints): a value on a threshold takes the upper index, ``r = +-0`` the upper middle
   one, and a NaN ``r`` the last one;
5. ``recon = sqrt(sum C[idx_j]^2)`` (sequential), ``d = norm / recon`` (``norm`` when
   ``recon <= 1e-10``, unreachable with these codebooks);
6. store fp16(d) (a NaN as ``sign | 0x7E00``) and the indices: turbo2 four 2-bit indices a byte,
   turbo3 planar3_0's 2-bit ``qs`` plane and bit-2 ``signs`` plane, turbo4 an fp16 ``rnorm`` of
   +0 and then adjacent nibble pairs.

Decoding is ``y_j = C[idx_j] * fp16(d)`` and nothing else: **no inverse rotation**. The decoded
values are the block's coordinates in the rotated domain, ``decode(encode(x))`` approximates
``R(x)``, not ``x`` (the fork rotates the query instead and the attention output back), so these
formats declare ``domain.decode_domain = "rotated"`` and map values with ``fmt.domain.to_decode_domain``.

>>> f = TURBO3()
>>> b = f.encode(np.zeros(128, np.float32))  # r = +-0 takes the upper middle index 4
>>> b[:3].tolist(), b[34:36].tolist()
([0, 0, 0], [255, 255])
>>> x = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
>>> y = f.decode(f.encode(x))
>>> e = ((y - f.domain.to_decode_domain(x)) ** 2).sum() / (x ** 2).sum()
>>> bool(e < 0.04), bool(((y - x) ** 2).sum() / (x ** 2).sum() > 1)  # close to R(x), nowhere near x
(True, True)
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..codebooks import Codebook
from ..float32 import get_f16_scale, put_f16_scale, seq_sum_squares
from ..half import f16_table
from ..packing import np_pack4_pairs, np_unpack4_pairs
from ..rotation import RandomizedHadamard, hadamard_scale, turboq_mtp_signs
from .base import Field, FieldKind, Format, FormatInfo, Option, Trace, option_check, read_field, register_field_kind
from .capabilities import (
    AttentionTraits,
    CapabilitySlot,
    CheckTraits,
    DomainTraits,
)
from .planar_iso import pack_planes3, unpack_planes3
from .tbq import _TBQ

F32 = np.float32
_ONE = F32(1.0)
_EPS = np.uint32(0x2EDBE6FF).view(F32)  # 1e-10f, the C constant


def _bits(hexes: str) -> NDArray[np.float32]:
    a = np.array([int(h, 16) for h in hexes.split()], np.uint32).view(F32)
    a.setflags(write=False)
    return a


#: The fork's float32 tables by bit pattern (its C literals as gcc rounds them; tests compare them with the
#: conformance copy ``tables-turbo.json``). Thresholds: the literals of ``nearest_centroid_{2,3,4}bit``.
TABLES: dict[str, NDArray[np.float32]] = {
    "centroids_2bit": _bits("be08aa43 bd23d0c0 3d23d0c0 3e08aa43"),
    "thresholds_2bit": _bits("bdb19e73 00000000 3db19e73"),
    "centroids_3bit": _bits("be4342ee bdf151e7 bd8696a2 bcafcce2 3cafcce2 3d8696a2 3df151e7 3e4342ee"),
    "thresholds_3bit": _bits("be1df612 bdbbf488 bd328a61 00000000 3d328a61 3dbbf488 3e1df612"),
    "centroids_4bit": _bits(
        "be3219a8 bdf003ef bdb759ef bd8ccff2 bd51f81a bd11ce29 bcabf120 bbe3582a "
        "3be3582a 3cabf120 3d11ce29 3d51f81a 3d8ccff2 3db759ef 3df003ef 3e3219a8"
    ),
    # CPU and Metal: +-0.145560f, +-0.013963f at the ends and next to the middle
    "thresholds_4bit": _bits(
        "be150dae bdd3aeef bda21533 bd75cbff bd31e3a8 bce7c6b9 bc64c511 00000000 "
        "3c64c511 3ce7c6b9 3d31e3a8 3d75cbff 3da21533 3dd3aeef 3e150dae"
    ),
    # CUDA and Vulkan: +-0.145561f, +-0.013964f instead (the other 11 literals are the same)
    "thresholds_4bit_cuda": _bits(
        "be150df1 bdd3aeef bda21533 bd75cbff bd31e3a8 bce7c6b9 bc64c943 00000000 "
        "3c64c943 3ce7c6b9 3d31e3a8 3d75cbff 3da21533 3dd3aeef 3e150df1"
    ),
}

THRESHOLD_SETS = ("cpu", "cuda")


_check_thresholds = option_check(
    "option 'thresholds'", f"one of {', '.join(map(repr, THRESHOLD_SETS))}", lambda v: v in THRESHOLD_SETS, str
)


def turbo_index(r: NDArray[np.float32], thresholds: NDArray[np.float32]) -> NDArray[np.uint8]:
    """``#{k : not (r < t_k)}`` as uint8: the C code's "first k with r < t_k, else n - 1" (a NaN ``r`` takes the
    last index, a value on a threshold the upper one).

    >>> turbo_index(np.float32([-0.0, 0.0, -1e-30, np.nan, 0.1]), TABLES["thresholds_2bit"]).tolist()
    [2, 2, 1, 3, 3]
    """
    idx = np.zeros(np.shape(r), np.uint8)
    for t in thresholds:
        idx += ~(r < t)
    return idx


# --- turbo2's layout: four 2-bit indices a byte, the first in the lowest bits -------------------


def pack_quads2(idx: NDArray[np.integer[Any]]) -> NDArray[np.uint8]:
    """uint8 (..., n/4) of 2-bit indices (..., n): byte ``k`` holds index ``4k + t`` at bits ``2t, 2t+1``.

    >>> pack_quads2(np.array([[0, 1, 2, 3]], np.uint8)).tolist()  # the spec's example: qs[0] = 0xE4
    [[228]]
    """
    i = idx.astype(np.uint8) & np.uint8(3)
    return (i[..., 0::4] | (i[..., 1::4] << 2) | (i[..., 2::4] << 4) | (i[..., 3::4] << 6)).astype(np.uint8)


def unpack_quads2(b: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """2-bit indices (..., 4m) of the bytes (..., m) of :func:`pack_quads2`."""
    out = np.empty(b.shape[:-1] + (4 * b.shape[-1],), np.uint8)
    for t in range(4):
        out[..., t::4] = (b >> np.uint8(2 * t)) & np.uint8(3)
    return out


register_field_kind("u2_quads", FieldKind(unpack_quads2))


class _TurboAttention(AttentionTraits):
    """Turbo's :class:`AttentionTraits`."""

    format: _Turbo

    domain = "rotated"  # the fused kernel reads C[idx] * d as it is, with the query rotated by R
    read = "attention_read"

    def tables(self) -> NDArray[np.float32]:
        return np.concatenate([f16_table(), self.format._k["centroids"]]).astype(F32)  # turbo_kernels.attention_read


class _TurboDomain(DomainTraits):
    """Turbo's :class:`DomainTraits`."""

    format: _Turbo

    decode_domain = "rotated"  # dequantize_row_turbo*: no inverse rotation

    def to_decode_domain(self, x: ArrayLike) -> NDArray[np.floating[Any]]:
        """``R(x)`` block by block (float32 or float64 as ``x``): what ``decode(encode(x))`` approximates."""
        return self.format._per_block(x, self.format.rotation.forward)

    def from_decode_domain(self, y: ArrayLike) -> NDArray[np.floating[Any]]:
        """``R^-1(y)`` block by block: decoded values back in the input's domain."""
        return self.format._per_block(y, self.format.rotation.inverse)


class _Turbo(Format):
    """Shared body of TURBO2, TURBO3, TURBO4 (they differ in the codebook, the packing and, for a NaN norm, step 2)."""

    kernel_module = "tbq.formats.turbo_kernels"
    attention = CapabilitySlot(_TurboAttention)
    domain = CapabilitySlot(_TurboDomain)
    # TBQ's rotation, so TBQ's fragility floor; its norm, rotated coordinates and codebook, so TBQ's quantizer;
    # rotated coordinates on the 6-digit thresholds, exact rotated zeros on the middle threshold of 0
    golden = CapabilitySlot(_TBQ.golden)
    quantizer = CapabilitySlot(_TBQ.quantizer)
    fuzz = CapabilitySlot(_TBQ.fuzz)
    #: Byte offset of the indices (turbo4 has its fp16 ``rnorm`` first).
    _payload: ClassVar[int] = 2
    #: turbo4's step 2: ``u = +0`` when ``norm > 1e-10`` fails, instead of ``x * 0``.
    _zero_u: ClassVar[bool] = False

    def __init__(self, **options: object) -> None:
        opts = {**self.option_defaults(), **self.check_options(options)}
        self._config: dict[str, Any] = opts
        bits = self.bits = self.info.index_bits
        suffix = "_cuda" if opts.get("thresholds") == "cuda" else ""
        #: the codebook: centroids and the literal thresholds (float32)
        self.codebook = Codebook(TABLES[f"centroids_{bits}bit"], TABLES[f"thresholds_{bits}bit{suffix}"])
        # the same tables under planar/iso's names, where the fuzzing strategies look for a fixed codebook's
        self.centroids, self.thresholds = self.codebook.centroids, self.codebook.thresholds
        #: the 128-point rotation R (TBQ's, with the ``turboq-mtp`` signs)
        self.rotation = RandomizedHadamard(*turboq_mtp_signs())
        c = self.codebook.centroids
        s1, s2 = (s.astype(F32) for s in turboq_mtp_signs())
        inv = hadamard_scale(self.info.block_size, F32)  # 1/sqrtf(128) = 0x3db504f3
        thr, csq = self.codebook.thresholds, (c * c).astype(F32)
        if bits == 2:  # the encoder is TBQ's, whose index step takes 7 or 15 thresholds: +inf is never reached
            thr = np.concatenate([thr, np.full(4, np.inf, F32)])
            csq = np.concatenate([csq, np.zeros(4, F32)])
        self._k = {  # kernel tables; +-INV is exact (a sign flip of INV)
            "thresholds": np.ascontiguousarray(thr),
            "centroids": np.ascontiguousarray(c),
            "centroids_sq": csq,
            "s1": np.ascontiguousarray(s1),
            "cs2": (inv * s2).astype(F32),
        }

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    # -- spec --------------------------------------------------------------------------------
    def rotate(self, x: NDArray[np.float32]) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
        """Steps 1-3 on float32 blocks (blocks, 128): ``(norm, r)``, the norm and the rotated normalised coordinates."""
        with np.errstate(all="ignore"):
            norm = np.sqrt(seq_sum_squares(x))
            ok = norm > _EPS  # false for NaN; +inf passes and gives 1/inf = +0
            inv = np.zeros_like(norm)
            np.divide(_ONE, norm, out=inv, where=ok)
            u = x * inv[:, None]
            if self._zero_u:
                u[~ok] = F32(0)
            return norm, self.rotation.forward(u)

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        """The C bytes for every float32 input, NaN and infinity included (SPEC §8); the codec refuses
        non-finite input before it gets here."""
        norm, r = self.rotate(x)
        idx = turbo_index(r, self.codebook.thresholds)
        with np.errstate(all="ignore"):
            recon = np.sqrt(seq_sum_squares(self.codebook.centroids[idx]))
            d = norm.copy()
            np.divide(norm, recon, out=d, where=recon > _EPS)
        out = np.zeros((x.shape[0], self.info.type_size), np.uint8)  # turbo4's rnorm: fp16 +0
        put_f16_scale(out, d)
        nan = np.isnan(d)
        if nan.any():  # ggml's fp32 -> fp16 writes a NaN as sign | 0x7E00 (numpy keeps payload bits)
            out[nan, 0] = 0x00
            out[nan, 1] = np.where(np.signbit(d[nan]), 0xFE, 0x7E)
        out[:, self._payload :] = self._pack(idx)
        return out, {"norm": norm, "r": r, "recon": recon, "d": d}

    def _pack(self, idx: NDArray[np.uint8]) -> NDArray[np.uint8]:
        return {2: pack_quads2, 3: pack_planes3, 4: np_pack4_pairs}[self.bits](idx)

    def _indices(self, payload: NDArray[np.uint8]) -> NDArray[np.uint8]:
        return {2: unpack_quads2, 3: unpack_planes3, 4: np_unpack4_pairs}[self.bits](payload)

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        d = get_f16_scale(data)
        return self.codebook.centroids[self._indices(data[:, self._payload :])] * d[:, None]

    # -- kernels ---------------------------------------------------------------------------
    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        k = self._k
        return self.kernels().encode(
            x, out, self.bits, k["thresholds"], k["centroids_sq"], k["s1"], k["cs2"], raise_overflow
        )

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        self.kernels().decode(data, out, self.bits, self._k["centroids"], f16_table())

    # -- structure ---------------------------------------------------------------------------
    def fields(self, data: ArrayLike) -> dict[str, NDArray[Any]]:
        """``{"d": float32 (..., n_blocks), "idx": uint8 (..., n_blocks, 128)}`` (turbo3's planes combined),
        and turbo4's ``"rnorm"`` (float32, always +0 as written)."""
        blocks = self._blocks(data)
        out = {"d": read_field("f16", np.ascontiguousarray(blocks[..., 0:2]))}
        if self._payload == 4:
            out["rnorm"] = read_field("f16", np.ascontiguousarray(blocks[..., 2:4]))
        out["idx"] = self._indices(np.ascontiguousarray(blocks[..., self._payload :]))
        return out

    # TBQ's, on the same attributes (``codebook``, ``rotation``, ``ulp_floor``): the same rotation, a codebook
    # whose thresholds the rotated coordinate ``r`` crosses, the same tables
    fragile_values = _TBQ.fragile_values
    tables = _TBQ.tables


_D = Field("d", 0, 2, "f16", "the C struct's norm: fp16 corrected norm norm / recon")


def _info(*fields: Field, bits: int, code: int, description: str) -> FormatInfo:
    """turbo<bits>'s table row: 128 values, the norm ``_D`` and ``fields``; it decodes to the rotated domain."""
    return FormatInfo(
        name=f"turbo{bits}",
        block_size=128,
        rotated=True,
        index_bits=bits,
        description=f"turbo{bits} (llama.cpp fork): {description}; decodes to the rotated domain",
        code=code,
        padded_heads=True,  # llama-kv-cache.cpp zero-pads K and V heads to a multiple of 128
        layout=(_D, *fields),
    )


class TURBO2(_Turbo):
    """turbo2: 128 values -> fp16 corrected norm + 128 rotated 2-bit indices (34 bytes)."""

    checker = CapabilitySlot(CheckTraits, symbol_stem="turbo2_0")  # quantize_row_turbo2_0_ref, dequantize_row_turbo2_0
    info = _info(
        Field("qs", 2, 32, "u2_quads", "index j at byte j/4, bits 2(j%4)..2(j%4)+1"),
        bits=2,
        code=21,
        description="fp16 norm + 128 WHT-rotated 2-bit indices",
    )


class TURBO3(_Turbo):
    """turbo3: 128 values -> fp16 corrected norm + 128 rotated 3-bit indices in two bit planes (50 bytes)."""

    checker = CapabilitySlot(CheckTraits, symbol_stem="turbo3_0")  # quantize_row_turbo3_0_ref, dequantize_row_turbo3_0
    info = _info(
        Field("qs", 2, 32, "uint8", "low 2 bits of index j at byte j/4, bits 2(j%4)..2(j%4)+1"),
        Field("signs", 34, 16, "uint8", "bit 2 of index j at byte j/8, bit j%8"),
        bits=3,
        code=22,
        description="fp16 norm + 128 WHT-rotated 3-bit indices",
    )


class TURBO4(_Turbo):
    """turbo4: 128 values -> fp16 corrected norm, fp16 rnorm = +0, 128 rotated 4-bit indices (68 bytes)."""

    checker = CapabilitySlot(CheckTraits, symbol_stem="turbo4_0")  # quantize_row_turbo4_0_ref, dequantize_row_turbo4_0
    info = _info(
        Field("rnorm", 2, 2, "f16", "always written as fp16 +0; the decoder ignores it"),
        Field("qs", 4, 64, "u4_pairs", "indices, byte k = idx[2k] | idx[2k+1] << 4"),
        bits=4,
        code=23,
        description="fp16 norm + fp16 0 + 128 WHT-rotated 4-bit indices",
    )
    options = {
        "thresholds": Option(
            "cpu",
            "'cpu' or 'cuda'",
            "the literal thresholds: the CPU and Metal code's +-0.145560/+-0.013963 or the CUDA and Vulkan "
            "code's +-0.145561/+-0.013964 (the other 11 are the same)",
            check=_check_thresholds,
            known=THRESHOLD_SETS,
        )
    }
    _payload = 4
    _zero_u = True
