"""vLLM's TurboQuant KV cache (``--kv-cache-dtype turboquant_*``): its key and value quantizers, bit-exact.

docs/formats-vllm.md. One block is one (token, kv-head) vector of ``head_dim``
(D) values; D is an option (default 128), so an instance carries its own
:class:`~tbq.formats.FormatInfo` (block size D, the byte count of D).

Keys, ``vllm_tq4_k`` / ``vllm_tq3_k`` (the MSE presets):

1. ``n = RN32(sqrt_f64(sum_f64 k_j^2))`` (the squares exact in float64, summed
   in index order), ``den = RN32(n + RN32(1e-8))``, ``xh_j = RN32(k_j / den)``;
2. ``y = RN32(xh @ PiT)`` with ``PiT = diag(s) * h * Hs`` (``Hs`` Sylvester,
   ``h = RN32(1 / RN32(sqrt(D)))``, ``s`` all +1, or PR #38479's per-layer
   signs): each product exact in float64, the float64 butterfly, one rounding
   (an exact zero is +0);
3. ``idx_j`` = the number of float32 midpoints ``m_i <= y_j`` (ties up, NaN 0);
4. store the indices (4-bit pairs, or the 3-bit LSB-first stream = 24-bit
   lanes), then ``RN16(n)``.

Decoding is vLLM's ``_tq_full_dequant_kv``: ``c = C[idx]``, ``s = sum RN32(c^2)``
(numpy's pairwise order), ``c' = RN32(c * RN32(1 / RN32(sqrt(RN32(s + 1e-16)))))``,
``yk_rot = RN16(RN32(f16(norm) * c'))`` (the rotated domain: :meth:`VLLM_TQ4_K.decode_rotated`),
then ``yk = RN16(exact sum_i yk_rot_i * f16(Pi[i][j]))`` (the model domain:
:meth:`~tbq.formats.Format.decode`).

Values, ``vllm_tq4_v`` / ``vllm_tq3_v``: ``scale = RN32(RN32(max - min) / Q)``
(at least ``RN32(1e-8)``), ``code = clamp(trunc(RN32(RN32(RN32(v - min) / scale) + 0.5)), 0, Q)``,
codes then ``RN16(scale)`` then ``RN16(min)``; decode ``RN16(RN32(code * sc + z))``.

:data:`PRESETS` holds the four ``--kv-cache-dtype`` presets as data (the key
and value formats of each); :mod:`tbq.vllm_slots` lays them out as vLLM's slots.

>>> k = VLLM_TQ4_K(head_dim=64)
>>> k.info.block_size, k.info.type_size, VLLM_TQ3_V().info.type_size
(64, 34, 52)
>>> b = k.encode(np.linspace(-1, 1, 64, dtype=np.float32))
>>> b[32:].view("<f2").tolist()  # the stored norm
[4.69140625]

Why one module of this length: vLLM's key and value formats and its four presets are one
family whose reference steps (the float64 norm and rotation, the trapezoid Lloyd-Max tables, the
fp16 roundings) are shared and follow SPEC-vllm-turboquant.md in its order.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..backend import resolve_backend
from ..codebooks import trapezoid_lloyd_max
from ..errors import ConfigError, is_integer
from ..half import f16_table, f32_to_f16_bits
from ..packing import np_pack3, np_pack4_pairs, np_unpack3, np_unpack4_pairs
from ..rotation import RandomizedHadamard, fwht, matrix
from .base import (
    Field,
    Format,
    FormatInfo,
    Option,
    Trace,
    band,
    block_trace,
    f16_field_error,
    f16_overflows,
    offset_trunc_fragility,
    option_check,
    overflow_status,
)
from .capabilities import AttentionTraits, CapabilitySlot, CheckTraits, FuzzTraits, GoldenTraits, QuantizerTraits
from .q4_1 import first_min_max, get_f16_at, min_overflow_status, put_f16_at, trunc_codes
from .tbq import TBQ_ULP_FLOOR

F32 = np.float32
_EPS_NORM = F32(1e-8)  #: ``norm + 1e-8`` (0x322BCC77) and the value scale's floor
_EPS_NC = F32(1e-16)  #: the NC denominator's ``+ 1e-16``
_HALF = F32(0.5)
_ONE = F32(1.0)
#: The fp16 NaN both decoders store for any NaN (NVIDIA's canonical 0x7FFF; vLLM's own never meets one).
F16_NAN = 0x7FFF
#: Largest head_dim: the decoder's exact integer sum needs ``2**24 * 65504 * D * 2**11 < 2**63``.
MAX_HEAD_DIM = 1024

ROTATIONS = ("hadamard", "pr38479")


# ---------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------


_check_key_head_dim = option_check(
    "head_dim",
    f"a power of two from 8 to {MAX_HEAD_DIM} (vLLM's MSE keys build a Sylvester Hadamard matrix of order head_dim "
    "and pack indices in groups of 8)",
    lambda v: is_integer(v) and 8 <= v <= MAX_HEAD_DIM and not v & (v - 1),
    int,
)
_check_value_head_dim = option_check(
    "head_dim",
    f"a multiple of 8 from 8 to {MAX_HEAD_DIM} (the codes are packed in whole 3-byte groups of 8)",
    lambda v: is_integer(v) and 8 <= v <= MAX_HEAD_DIM and not v % 8,
    int,
)
_check_rotation = option_check(
    "rotation",
    "'hadamard' (vLLM main, after PR #40194) or 'pr38479' (per-layer random signs, with layer=)",
    lambda v: v in ROTATIONS,
    str,
)
_check_layer = option_check(
    "layer",
    "a non-negative integer (the decoder layer index)",
    lambda v: v is None or (is_integer(v) and v >= 0),
    lambda v: None if v is None else int(v),
)


# ---------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------


def hadamard_h(head_dim: int) -> np.float32:
    """The entry magnitude of vLLM's rotation: ``RN32(1 / RN32(sqrt(D)))`` (0x3DB504F3 at D = 128).

    >>> hex(int(hadamard_h(128).view(np.uint32))), float(hadamard_h(64))
    ('0x3db504f3', 0.125)
    """
    return F32(_ONE / np.sqrt(F32(head_dim)))


def pr38479_signs(layer: int, head_dim: int) -> NDArray[np.int8]:
    """PR #38479's rotation signs of decoder ``layer``: ``s_i = 2 (u_i mod 2) - 1``, ``u`` the 32-bit outputs of
    MT19937 seeded (``init_genrand``) with ``42 + 1337 * layer``: torch's ``randint(0, 2)`` on a CPU generator,
    the stream of ``numpy.random.RandomState``.

    >>> pr38479_signs(2, 128)[:8].tolist()
    [1, -1, 1, -1, -1, -1, -1, -1]
    """
    u = np.random.RandomState(42 + 1337 * int(layer)).randint(0, 2**32, size=head_dim, dtype=np.uint64)
    s = (2 * (u & 1).astype(np.int8) - 1).astype(np.int8)
    s.setflags(write=False)
    return s


def vllm_centroids(bits: int, head_dim: int) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """``(centroids, midpoints)`` float32 that vLLM serves with: the trapezoid solver's float64 centroids
    (:func:`tbq.codebooks.trapezoid_lloyd_max`) rounded to float32, and ``RN32(c_i + c_{i+1}) / 2``.

    >>> c, m = vllm_centroids(3, 128)
    >>> float(m[3]), hex(int(m[4].view(np.uint32)))
    (0.0, '0x3d35221b')
    """
    c = trapezoid_lloyd_max(bits, head_dim)[0].astype(F32)
    m = ((c[1:] + c[:-1]) / F32(2)).astype(F32)
    c.setflags(write=False)
    m.setflags(write=False)
    return c, m


def _f16_parts(v: float) -> tuple[int, int]:
    """``(mant, exp)`` integers with ``fp16(v) = mant * 2**exp`` (``v`` > 0, an fp16 normal)."""
    h = float(np.float16(v))
    frac, e = math.frexp(h)
    return int(frac * 2048), e - 11


# ---------------------------------------------------------------------------
# shared arithmetic (NumPy)
# ---------------------------------------------------------------------------


def rn16(v: NDArray[np.float32]) -> NDArray[np.float32]:
    """``RN16(v)`` as float32: round to the nearest fp16 (ties to even), any NaN to the fp16 NaN :data:`F16_NAN`."""
    bits = f32_to_f16_bits(v).copy()
    bits[(bits & 0x7FFF) > 0x7C00] = F16_NAN
    return f16_table()[bits]


def pairwise_sum32(a: NDArray[np.float32]) -> NDArray[np.float32]:
    """Row sums of float32 ``a`` in numpy's pairwise order (``np.add.reduce``): below 8 values a sequential sum from
    +0; up to 128, eight partial sums ``p_k = a_k + a_{k+8} + ...`` combined as ``((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7))``
    and the tail added in order; above, the two halves (the first a multiple of 8) summed so and added.

    >>> a = np.arange(256, dtype=np.float32)[None] / 7
    >>> bool(pairwise_sum32(a)[0] == np.add.reduce(a[0]))
    True
    """
    n = a.shape[1]
    if n < 8:
        s = np.zeros(a.shape[0], F32)
        for j in range(n):
            s += a[:, j]
        return s
    if n <= 128:
        p = a[:, :8].copy()
        end = n - n % 8
        for i in range(8, end, 8):
            p += a[:, i : i + 8]
        s = ((p[:, 0] + p[:, 1]) + (p[:, 2] + p[:, 3])) + ((p[:, 4] + p[:, 5]) + (p[:, 6] + p[:, 7]))
        for j in range(end, n):
            s += a[:, j]
        return s
    h = n // 2
    h -= h % 8
    return pairwise_sum32(a[:, :h]) + pairwise_sum32(a[:, h:])


def _round_odd_f32(p: NDArray[np.int64], k: int) -> NDArray[np.float32]:
    """``p * 2**k`` (int64 ``p``) rounded to 24 significant bits *to odd* (the dropped bits' OR kept in the last
    bit), as float32: a later rounding to fp16 (11 bits) then gives the correctly rounded fp16 of ``p * 2**k``."""
    a = np.abs(p)
    e = np.frexp(a.astype(np.float64))[1].astype(np.int64)  # a <= 2**e; the conversion may round a up to 2**e
    e = np.where((a > 0) & ((a >> np.maximum(e - 1, 0)) == 0), e - 1, e)
    d = np.maximum(e - 24, 0)
    m = (a >> d) | ((a & ((np.int64(1) << d) - 1)) != 0)
    f = np.ldexp(m.astype(np.float64), d + k).astype(F32)
    return np.where(p < 0, -f, f).astype(F32)


def exact_unrotate(yk_rot: NDArray[np.float32], sh16: NDArray[np.float64], mant: int, exp: int) -> NDArray[np.float32]:
    """``RN16(sum_i yk_rot_i * sh16_j * Hs[i][j])``: vLLM's fp16 ``yk_rot @ fp16(Pi)`` with the exact sum rounded once.

    ``yk_rot`` holds fp16 values, so ``yk_rot * 2**24`` are integers below ``2**40`` and the float64 butterfly
    ``S = Hs yk_rot`` is exact. ``fp16(h) = mant * 2**exp``, so ``S_j * fp16(h) * 2**(24 - exp)`` is the int64
    ``S_j * 2**24 * mant``, rounded to odd at 24 bits and then to fp16 (ties to even): the correctly rounded
    fp16 of the exact sum. An exact zero is +0. A row holding inf or NaN (arbitrary bytes) takes the float64
    butterfly's inf/NaN. ``sh16`` is ``+-1`` (the signs ``s_j`` of ``Pi``).
    """
    S = fwht(yk_rot.astype(np.float64), normalize=False)
    fin = np.isfinite(S)
    with np.errstate(invalid="ignore"):
        p = np.where(fin, S * 2.0**24, 0).astype(np.int64) * np.int64(mant) * sh16.astype(np.int64)
    y = _round_odd_f32(p, exp - 24)
    if not fin.all():
        with np.errstate(invalid="ignore", over="ignore"):
            y = np.where(fin, y, (S * sh16).astype(F32))
    return rn16(y)


def _unpack(bits: int, raw: NDArray[np.uint8]) -> NDArray[np.uint8]:
    return np_unpack4_pairs(raw) if bits == 4 else np_unpack3(raw)


def _pack(bits: int, idx: NDArray[np.uint8]) -> NDArray[np.uint8]:
    return np_pack4_pairs(idx) if bits == 4 else np_pack3(idx)


def _codes_kind(bits: int) -> str:
    return "u4_pairs" if bits == 4 else "u3_lanes"


def _codes_layout(bits: int) -> str:
    return (
        "byte t = c[2t] | c[2t+1] << 4" if bits == 4 else "LSB-first 3-bit stream: 8 codes a 24-bit little-endian lane"
    )


def _key_layout(bits: int, mb: int) -> tuple[Field, ...]:
    return (
        Field("idx", 0, mb, _codes_kind(bits), f"centroid indices, {_codes_layout(bits)}"),
        Field("d", mb, 2, "f16", "the key's norm n = ||k||"),
    )


def _value_layout(bits: int, vdb: int) -> tuple[Field, ...]:
    return (
        Field("qs", 0, vdb, _codes_kind(bits), f"codes trunc((v - min) / scale + 0.5), {_codes_layout(bits)}"),
        Field("d", vdb, 2, "f16", f"scale (max - min) / {(1 << bits) - 1}, at least RN32(1e-8)"),
        Field("m", vdb + 2, 2, "f16", "the vector's minimum (the zero point)"),
    )


def _info(name: str, *, code: int, bits: int, description: str, keys: bool) -> FormatInfo:
    """The registry's row of a key (``keys``: rotated) or value format, at head_dim 128 (see :func:`_own_info`)."""
    layout = _key_layout(bits, 16 * bits) if keys else _value_layout(bits, 16 * bits)
    return FormatInfo(
        name=name,
        block_size=128,
        rotated=keys,
        index_bits=bits,
        description=description,
        code=code,
        layout=layout,
    )


def _own_info(fmt: Format, layout: tuple[Field, ...]) -> None:
    """Give ``fmt`` its own :class:`FormatInfo`: its ``head_dim``'s block size and ``layout``, whose fields give its
    byte size (``type_size=0``: derived again, not the class's). The class's ``info``, the registry's row, is head_dim
    128's; the codec and every size reads ``fmt.info``."""
    head_dim: int = fmt.head_dim  # type: ignore[attr-defined]
    vars(fmt)["info"] = dataclasses.replace(type(fmt).info, block_size=head_dim, type_size=0, layout=layout)


# ---------------------------------------------------------------------------
# keys
# ---------------------------------------------------------------------------


class _KeysAttention(AttentionTraits):
    """Keys's :class:`AttentionTraits`."""

    format: _Keys

    read = "attention_read_keys"

    def tables(self) -> NDArray[np.float32]:
        # vllm_turboquant_kernels.attention_read_keys: [D, bits, mant, exp, centroids, signs, f16 table]
        head = np.array([self.format.head_dim, self.format.bits, self.format.h16_mant, self.format.h16_exp], F32)
        return np.concatenate([head, self.format.centroids, self.format.signs.astype(F32), f16_table()]).astype(F32)


class _KeysQuantizer(QuantizerTraits):
    """Keys's :class:`QuantizerTraits`."""

    format: _Keys

    def rotated_view(self, trace: Trace) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
        return trace["norm"], trace["r"]

    def value_table(self, trace: Trace) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return self.format.centroids.astype(np.float64), np.asarray(trace["r"], np.float64).ravel()


class _Keys(Format):
    """Shared body of VLLM_TQ4_K and VLLM_TQ3_K."""

    options = {
        "head_dim": Option(
            128, "a power of two, 8..1024", "D, the values of one (token, kv-head) key", _check_key_head_dim
        ),
        "rotation": Option(
            "hadamard",
            "'hadamard' or 'pr38479'",
            "the rotation: Sylvester Hadamard / sqrt(D) (vLLM main), or PR #38479's with per-layer random signs",
            _check_rotation,
            known=ROTATIONS,
        ),
        "layer": Option(
            None,
            "None, or a decoder layer index >= 0",
            "the layer of rotation='pr38479' (seed 42 + 1337 * layer)",
            _check_layer,
            known=(None, 2),  # 2: the first layer vLLM quantizes (it keeps the first two in the model's dtype)
        ),
    }
    kernel_module = "tbq.formats.vllm_turboquant_kernels"
    attention = CapabilitySlot(_KeysAttention)
    golden = CapabilitySlot(GoldenTraits, ulp_floor=TBQ_ULP_FLOOR)
    quantizer = CapabilitySlot(_KeysQuantizer)
    #: the ``1e-8`` of ``den = n + 1e-8``: the encoder is scale-equivariant (``2**k x`` gives the same indices)
    #: only while that addition leaves ``n`` unchanged, i.e. for norms of 0.25 and more
    norm_epsilon = float(_EPS_NORM)

    def __init__(self, *, head_dim: int = 128, rotation: str = "hadamard", layer: int | None = None) -> None:
        name = type(self).info.name
        d = _check_key_head_dim(head_dim, name)
        rotation = _check_rotation(rotation, name)
        layer = _check_layer(layer, name)
        if (rotation == "pr38479") != (layer is not None):
            raise ConfigError(
                f"bad configuration for {name}: rotation='pr38479' needs layer= (the decoder layer index), and only "
                f"it takes one; got rotation={rotation!r}, layer={layer!r}"
            )
        self.head_dim, self.bits, self.layer, self.rotation_name = d, type(self).info.index_bits, layer, rotation
        mb = d * self.bits // 8
        _own_info(self, _key_layout(self.bits, mb))
        self.centroids, self.midpoints = vllm_centroids(self.bits, d)
        self.signs = pr38479_signs(layer, d) if layer is not None else np.ones(d, np.int8)
        #: vLLM's rotation as an orthonormal map, ``forward(x) = (x * s) @ H`` (float32 butterfly; the encoder's
        #: canonical arithmetic is the float64 one of :meth:`rotate`)
        self.rotation = RandomizedHadamard(self.signs, np.ones(d, np.int8))
        self.h = hadamard_h(d)
        self._sh = self.signs.astype(np.float64) * np.float64(self.h)  # s_i * h, exact in float64
        self.h16_mant, self.h16_exp = _f16_parts(float(self.h))
        self._k = dict(
            mids=np.ascontiguousarray(self.midpoints),
            cents=np.ascontiguousarray(self.centroids),
            sh=np.ascontiguousarray(self._sh),
            s16=self.signs.astype(np.int64),
            f16=f16_table(),
        )

    def config(self) -> dict[str, Any]:
        return {"head_dim": self.head_dim, "rotation": self.rotation_name, "layer": self.layer}

    # -- spec ----------------------------------------------------------------------------
    def rotate(self, x: NDArray[np.float32]) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
        """Steps 1-2 on clean float32 keys: ``(n, y)``, the float32 norm and the rotated unit key."""
        x64 = x.astype(np.float64)
        acc = np.zeros(x.shape[0], np.float64)
        for j in range(x.shape[1]):  # index order, each square exact in float64
            acc += x64[:, j] * x64[:, j]
        with np.errstate(over="ignore"):
            n = np.sqrt(acc).astype(F32)
        xh = x / (n + _EPS_NORM)[:, None]
        y = fwht(xh.astype(np.float64) * self._sh, normalize=False)  # products exact, the butterfly in float64
        return n, (y + 0.0).astype(F32)  # an exact zero sum is +0 (the butterfly gives -0 for all -0 inputs)

    def index(self, y: NDArray[np.float32]) -> NDArray[np.uint8]:
        """The number of midpoints ``m_i <= y`` (ties up; +-0 -> L/2; NaN -> 0), as uint8."""
        idx = np.zeros(y.shape, np.uint8)
        for m in self.midpoints:
            idx += y >= m
        return idx

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        n, y = self.rotate(x)
        mb = self.type_size - 2
        out = np.empty((x.shape[0], self.type_size), np.uint8)
        out[:, :mb] = _pack(self.bits, self.index(y))
        put_f16_at(out, mb, n)
        return out, {"norm": n, "d": n, "r": y}

    def decode_rotated_reference(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        """``yk_rot`` of clean blocks (blocks, type_size): the NC-corrected centroids times the fp16 norm, rounded to
        fp16, in the rotated domain (``_tq_full_dequant_kv`` before its inverse rotation)."""
        mb = self.type_size - 2
        c = self.centroids[_unpack(self.bits, data[:, :mb])]
        s = pairwise_sum32(c * c)
        r = _ONE / np.sqrt(s + _EPS_NC)
        with np.errstate(invalid="ignore", over="ignore"):
            return rn16(get_f16_at(data, mb)[:, None] * (c * r[:, None]))

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        yr = self.decode_rotated_reference(data)
        return exact_unrotate(yr, self.signs.astype(np.float64), self.h16_mant, self.h16_exp)

    def decode_rotated(self, data: ArrayLike, *, backend: str | None = None) -> NDArray[np.float32]:
        """The rotated-domain keys ``yk_rot`` (float32 of fp16 values) of encoded ``data`` (uint8, last axis whole
        blocks): what vLLM's ``_tq_full_dequant_kv`` computes before un-rotating, and what its fused decode
        kernel scores against the rotated query. ``backend`` as in :func:`tbq.get_codec` (same bits).

        A constant key rotates to one non-zero coordinate (docs/formats-vllm.md, quirk 1): the 127 exact zeros
        take the smallest positive centroid, which the NC correction then weighs against the one large one.

        >>> f = VLLM_TQ3_K(); q = f.encode(np.ones(128, np.float32))
        >>> f.decode_rotated(q, backend="numpy")[:2].tolist()
        [6.953125, 0.7919921875]
        """
        blocks = self._blocks(data)
        d2 = np.ascontiguousarray(blocks).reshape(-1, self.type_size)
        if resolve_backend(backend) == "numba":
            y = np.empty((d2.shape[0], self.block_size), F32)
            self.kernels().decode_keys(d2, y, self.bits, *self._kernel_tables(), True)
        else:
            y = self.decode_rotated_reference(d2)
        return y.reshape(blocks.shape[:-2] + (blocks.shape[-2] * self.block_size,))

    # -- kernels ---------------------------------------------------------------------------
    def _kernel_tables(self) -> tuple[Any, ...]:
        k = self._k
        return k["cents"], k["s16"], self.h16_mant, self.h16_exp, k["f16"]

    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        k = self.kernels()
        return k.encode_keys(x, out, self.bits, self._k["mids"], self._k["sh"], raise_overflow, k.KEY_LANES)

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        self.kernels().decode_keys(data, out, self.bits, *self._kernel_tables(), False)

    # -- structure ---------------------------------------------------------------------------
    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # v = y, the rotated unit key; boundaries: the float32 midpoints (ties up).
        floor = self.golden.ulp_floor if ulp_floor is None else float(ulp_floor)
        m = self.midpoints.astype(np.float64)
        return band(lambda y: np.searchsorted(m, y, side="right"), trace["r"], k, floor)

    def decode_tolerance(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        """One fp16 ulp of each decoded key: a GPU's float32 GEMM accumulation (rounded twice), its tree-order NC
        sum and approximate ``sqrt``/division may move the last fp16 bit (docs/formats-vllm.md, "Real GPUs")."""
        y = np.abs(self.reference_decode(np.asarray(data).reshape(-1, self.type_size)))
        with np.errstate(all="ignore"):
            t = np.spacing(np.where(np.isfinite(y), y, 0).astype(np.float16)).astype(F32)
        return t

    def tables(self) -> dict[str, NDArray[Any]]:
        """The exact tables of this instance: centroids and thresholds (float32; vLLM's float32 midpoints, under tbq's
        name for a codebook's decision thresholds), the rotation's signs (int8) and its float32 entry magnitude
        ``h`` (one value)."""
        return {
            "centroids": self.centroids.copy(),
            "thresholds": self.midpoints.copy(),
            "signs": self.signs.copy(),
            "h": np.array([self.h], F32),
        }

    def hadamard(self) -> NDArray[np.float32]:
        """vLLM's float32 ``PiT`` (D x D): ``PiT[i][j] = s_i * h * Hs[i][j]`` (``y = xh @ PiT``; ``Pi = PiT.T``)."""
        return (self.signs[:, None] * matrix(self.head_dim, normalize=False) * self.h).astype(F32)


class VLLM_TQ4_K(_Keys):
    """vLLM ``turboquant_4bit_nc`` keys: 4-bit Lloyd-Max indices of the rotated unit key + fp16 norm (66 bytes at D=128)."""

    info = _info(
        "vllm_tq4_k",
        code=24,
        bits=4,
        description="vLLM TurboQuant keys (4bit_nc): Hadamard-rotated 4-bit Lloyd-Max indices + fp16 norm",
        keys=True,
    )


class VLLM_TQ3_K(_Keys):
    """vLLM ``turboquant_k3v4_nc`` / ``turboquant_3bit_nc`` keys: 3-bit indices + fp16 norm (50 bytes at D=128)."""

    info = _info(
        "vllm_tq3_k",
        code=25,
        bits=3,
        description="vLLM TurboQuant keys (k3v4_nc, 3bit_nc): Hadamard-rotated 3-bit Lloyd-Max indices + fp16 norm",
        keys=True,
    )


# ---------------------------------------------------------------------------
# values
# ---------------------------------------------------------------------------


class _ValuesAttention(AttentionTraits):
    """Values's :class:`AttentionTraits`."""

    format: _Values

    read = "attention_read_values"

    def tables(self) -> NDArray[np.float32]:
        # vllm_turboquant_kernels.attention_read_values: [D, bits, f16 table]
        return np.concatenate([np.array([self.format.head_dim, self.format.bits], F32), f16_table()]).astype(F32)


class _ValuesQuantizer(QuantizerTraits):
    """Values's :class:`QuantizerTraits`."""

    format: _Values

    def value_table(self, trace: Trace) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return self.int_levels(0, self.format.levels + 1, trace["v"])


class _Values(Format):
    """Shared body of VLLM_TQ4_V and VLLM_TQ3_V."""

    options = {
        "head_dim": Option(
            128, "a multiple of 8, 8..1024", "D, the values of one (token, kv-head) value", _check_value_head_dim
        ),
    }
    kernel_module = "tbq.formats.vllm_turboquant_kernels"
    attention = CapabilitySlot(_ValuesAttention)
    checker = CapabilitySlot(CheckTraits, tie_rule="up")
    quantizer = CapabilitySlot(_ValuesQuantizer)

    def __init__(self, *, head_dim: int = 128) -> None:
        d = _check_value_head_dim(head_dim, type(self).info.name)
        self.head_dim, self.bits = d, type(self).info.index_bits
        self.levels = (1 << self.bits) - 1
        vdb = d * self.bits // 8
        _own_info(self, _value_layout(self.bits, vdb))

    def config(self) -> dict[str, Any]:
        return {"head_dim": self.head_dim}

    def reference_encode(self, x: NDArray[np.float32]) -> tuple[NDArray[np.uint8], Trace]:
        vmin, vmax = first_min_max(x)
        scale = (vmax - vmin) / F32(self.levels)
        scale = np.where(scale > _EPS_NORM, scale, _EPS_NORM).astype(F32)  # "if not scale > 1e-8" (NaN too)
        v = (x - vmin[:, None]) / scale[:, None]
        t = v + _HALF
        codes = self._codes(t)
        vdb = self.type_size - 4
        out = np.empty((x.shape[0], self.type_size), np.uint8)
        out[:, :vdb] = _pack(self.bits, codes)
        put_f16_at(out, vdb, scale)
        put_f16_at(out, vdb + 2, vmin)
        return out, {"d": scale, "m": vmin, "v": v, "t": t}

    def _codes(self, t: NDArray[np.float32]) -> NDArray[np.uint8]:
        return np.maximum(trunc_codes(t, self.levels), 0).astype(np.uint8)

    def decoded_top(self, trace: Trace) -> NDArray[np.float32]:
        """float32 (blocks,): ``RN32(max code * f16(scale) + f16(min))``, the largest value a block decodes to before
        the final fp16 rounding (from the encoder's ``trace``)."""
        qmax = self._codes(np.asarray(trace["t"], F32)).max(axis=-1).astype(F32)
        with np.errstate(all="ignore"):
            d16 = np.asarray(trace["d"], F32).astype(np.float16).astype(F32)
            m16 = np.asarray(trace["m"], F32).astype(np.float16).astype(F32)
            return (qmax * d16 + m16).astype(F32)

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        vdb = self.type_size - 4
        codes = _unpack(self.bits, data[:, :vdb]).astype(F32)
        with np.errstate(invalid="ignore"):
            return rn16(codes * get_f16_at(data, vdb)[:, None] + get_f16_at(data, vdb + 2)[:, None])

    def kernel_encode(self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool) -> tuple[int, int]:
        return self.kernels().encode_values(x, out, self.bits, raise_overflow, f16_table())

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        self.kernels().decode_values(data, out, self.bits, f16_table())

    def invalid_blocks(self, trace: Trace) -> NDArray[np.int8]:
        """The fp16 scale or minimum is infinite, or the block decodes to an infinite value (its top code times the
        fp16 scale plus the fp16 minimum rounds beyond 65504): refused unless ``on_overflow="inf"`` (vLLM's store)."""
        return overflow_status((min_overflow_status(self, trace) != 0) | f16_overflows(self.decoded_top(trace)))

    def encode_error(self, status: int, block: int, values: NDArray[np.float32]) -> Exception:
        tr = block_trace(self, values)
        d, m, top = float(tr["d"][0]), float(tr["m"][0]), float(self.decoded_top(tr)[0])
        return f16_field_error(
            self.name,
            block,
            (
                (f"the scale (max - min) / {self.levels} is {d!r}, which does not fit float16", d),
                (f"the minimum is {m!r}, which does not fit float16", m),
                (f"its top code decodes to {top!r} (fp16 scale and minimum), beyond float16", top),
            ),
            "Pass on_overflow='inf' to store it as vLLM does",
        )

    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # codes trunc(RN32(v + 0.5)) capped at Q: fragile when a k-ulp change of v or of t = v + 0.5 moves one.
        return offset_trunc_fragility(trace["v"], trace["t"], k, 0.5, self.levels)


class VLLM_TQ4_V(_Values):
    """vLLM TurboQuant values (k8v4, 4bit_nc, k3v4_nc): 4-bit asymmetric codes + fp16 scale + fp16 min (68 bytes at D=128)."""

    info = _info(
        "vllm_tq4_v",
        code=26,
        bits=4,
        description="vLLM TurboQuant values (k8v4, 4bit_nc, k3v4_nc): 4-bit uniform codes + fp16 scale + fp16 min",
        keys=False,
    )
    fuzz = CapabilitySlot(
        FuzzTraits, hazards={"min_ties": {"levels": 15}}
    )  # (v - min) / scale exactly k + 1/2: round half up


class VLLM_TQ3_V(_Values):
    """vLLM TurboQuant values (3bit_nc): 3-bit asymmetric codes + fp16 scale + fp16 min (52 bytes at D=128)."""

    info = _info(
        "vllm_tq3_v",
        code=27,
        bits=3,
        description="vLLM TurboQuant values (3bit_nc): 3-bit uniform codes + fp16 scale + fp16 min",
        keys=False,
    )
    fuzz = CapabilitySlot(FuzzTraits, hazards={"min_ties": {"levels": 7}})


# ---------------------------------------------------------------------------
# the four presets (vLLM's --kv-cache-dtype values), as data
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    """One ``--kv-cache-dtype turboquant_*`` preset: its key and value formats and how vLLM stores them.

    ``key_overflow`` / ``value_overflow``: the codec ``on_overflow`` mode that stores what vLLM's store
    kernel stores (FP8 keys saturate at 448; an fp16 norm, scale or minimum beyond 65504 is stored as inf).
    ``qgroup4``: whether vLLM has the page-plane layout for it (4bit_nc and k3v4_nc).
    """

    name: str
    key: str
    value: str
    key_overflow: str
    value_overflow: str
    qgroup4: bool
    #: options of the key format that vLLM fixes (FP8: no scale)
    key_options: tuple[tuple[str, object], ...] = ()

    def key_bytes(self, head_dim: int) -> int:
        """Bytes of the key part of one slot (``KP``)."""
        return _part_bytes(self.key, head_dim, dict(self.key_options))

    def value_bytes(self, head_dim: int) -> int:
        """Bytes of the value part of one slot (``VP``)."""
        return _part_bytes(self.value, head_dim, {})


def _part_bytes(name: str, head_dim: int, options: dict[str, object]) -> int:
    from . import format_class

    cls = format_class(name)
    if "head_dim" in cls.options:
        options = {**options, "head_dim": head_dim}
    info = cls(**options).info
    return info.row_bytes(head_dim)


#: vLLM's presets by their ``--kv-cache-dtype`` names (config.py at vLLM 1471680b; docs/formats-vllm.md).
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("turboquant_k8v4", "fp8_e4m3", "vllm_tq4_v", "saturate", "inf", False, (("scale", 1.0),)),
        Preset("turboquant_4bit_nc", "vllm_tq4_k", "vllm_tq4_v", "inf", "inf", True),
        Preset("turboquant_k3v4_nc", "vllm_tq3_k", "vllm_tq4_v", "inf", "inf", True),
        Preset("turboquant_3bit_nc", "vllm_tq3_k", "vllm_tq3_v", "inf", "inf", False),
    )
}

__all__ = [
    "VLLM_TQ4_K",
    "VLLM_TQ3_K",
    "VLLM_TQ4_V",
    "VLLM_TQ3_V",
    "PRESETS",
    "Preset",
    "hadamard_h",
    "pr38479_signs",
    "vllm_centroids",
    "pairwise_sum32",
    "exact_unrotate",
    "rn16",
]
