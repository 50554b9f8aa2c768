"""Comparison quantizers and mixed cache policies, for studying quantization error.

Nothing in this module is a byte format. The quantizers here return the
*reconstruction* of their input (quantize, then dequantize, in floating point)
and report the storage cost they would have (``bits_per_value``); they are
meant to be compared against the real formats of :mod:`tbq.codecs`, not to
produce caches. Only :class:`CodecQuantizer` wraps a real, bit-exact format.

Quantizers (all have ``name``, ``bits_per_value`` and ``roundtrip(x)``, also
callable as ``q(x)``; input float, output float32 of the same shape):

- :class:`CodecQuantizer`: a real format (``q8_0``, ``q4_0``, ``tbq4_0``,
  ``tbq3_0``) through ``encode``/``decode``; TBQ with any codebook and signs.
- :class:`F16Quantizer`, :class:`Identity`: fp16 rounding, and no quantization without a codec (the
  registered formats ``f16`` and ``f32`` are the same roundings through :class:`CodecQuantizer`).
- :class:`KIVI`: asymmetric min/max integer quantization with a zero point,
  per channel (keys) or per token (values), in groups (KIVI, Liu et al. 2024).
- :class:`LloydMaxNoRotation`: a TBQ-like block quantizer *without* the
  rotation (unit-norm block, Lloyd-Max codebook, corrected norm), to isolate
  what the rotation does.
- :class:`RotatedLloydMax`: the TBQ algorithm at any bit width 1..8 and any
  power-of-two block (float32, not bit-exact), to draw a rate-distortion curve.

:func:`get_quantizer` builds one from a short name (see its docstring), and
:class:`CachePolicy` combines a K quantizer, a V quantizer and the first
``n_sink`` tokens kept in f16 or q8_0.

Measurements over the real formats:

- :func:`rate_distortion_rows`: bits per value, NMSE and the attention
  metrics of every format (or quantizer) on every data set, one row each.
- :func:`table_levels` and :func:`table_inputs`: a format's value table and
  the values it meets, read from the format's own encoder trace (for the
  rotated formats the unit-norm rotated coordinates), to set against the
  Lloyd-Max optimum with :func:`tbq.metrics.table_distortion`.
- :func:`rotated_nmse`: the NMSE of a rotated format with its own rotation
  and any value table, to separate what the rotation does from what the
  table does.

Why one module of this length: the comparison quantizers and the mixed cache policies are the
study's one vocabulary (all take and return float rows, none is a byte format); the metrics are
:mod:`tbq.metrics`' and the figures :mod:`tbq.plots`'.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from . import metrics
from .codebooks import Codebook, get_codebook, lloyd_max
from .codecs import Codec, get_codec
from .errors import ConfigError, TbqValueError, check_choice, check_int
from .formats import FORMATS, cache_formats, get_format
from .rotation import get_rotation

__all__ = [
    "Quantizer",
    "CodecQuantizer",
    "F16Quantizer",
    "Identity",
    "KIVI",
    "LloydMaxNoRotation",
    "RotatedLloydMax",
    "get_quantizer",
    "CachePolicy",
    "round_f16_down",
    "round_f16_up",
    "rate_distortion_rows",
    "table_levels",
    "table_inputs",
    "rotated_nmse",
]


class Quantizer:
    """Base class of the study quantizers: ``roundtrip(x)`` returns the reconstruction.

    Not a byte format: subclasses other than :class:`CodecQuantizer` compute
    in floating point and only *account* for their storage in
    ``bits_per_value``.
    """

    name: str = ""
    #: storage cost including every scale, zero point or norm
    bits_per_value: float = float("nan")
    #: bits of the per-value code alone (the ``b`` of ``2**b`` levels)
    code_bits: int = 0

    def roundtrip(self, x: ArrayLike) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, x: ArrayLike) -> np.ndarray:
        return self.roundtrip(x)

    def __repr__(self) -> Any:
        return f"<{type(self).__name__} {self.name} ({self.bits_per_value:g} bits/value)>"


def _as_f32(x: Any) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise TbqValueError(f"expected a float array, got dtype {a.dtype}")
    return a.astype(np.float32, copy=False)


class CodecQuantizer(Quantizer):
    """A real byte format (:func:`tbq.get_codec`) used as a quantizer: ``decode(encode(x))`` in the input's domain
    (:meth:`~tbq.formats.capabilities.DomainTraits.from_decode_domain`: turbo2/3/4's rotated decoded values are rotated back).

    ``fmt`` is a format name or a :class:`~tbq.codecs.Codec`; ``config`` goes to
    :func:`tbq.get_codec` (``codebook=``, ``signs=``, ``backend=`` ...). The name
    is the format name, with ``:<codebook>`` appended for a TBQ format whose
    codebook is not the default and ``:signs=<seed>`` for seeded signs.
    This is the one quantizer of this module whose output is a real cache's.
    """

    def __init__(self, fmt: str | Codec, **config: Any) -> None:
        self.codec: Codec = fmt if isinstance(fmt, Codec) else get_codec(fmt, **config)
        cfg = self.codec.get_config()
        name = cfg["name"]
        if "codebook" in cfg and cfg["codebook"] != "lloyd-max":
            name += ":" + (cfg["codebook"] if isinstance(cfg["codebook"], str) else "custom")
        if "signs" in cfg and cfg["signs"] != "turboq-mtp":
            name += ":signs=" + (str(cfg["signs"]) if isinstance(cfg["signs"], int) else "custom")
        self.name = name
        self.bits_per_value = self.codec.bits_per_value
        self.code_bits = self.codec.info.index_bits

    def roundtrip(self, x: ArrayLike) -> np.ndarray:
        # in the input's domain: a decoder that returns rotated coordinates (turbo2/3/4) is rotated back
        return self.codec.format.domain.from_decode_domain(self.codec.decode(self.codec.encode(_as_f32(x))))


class F16Quantizer(Quantizer):
    """IEEE half precision (round to nearest even): 16 bits per value. Not a block format."""

    name = "f16"
    bits_per_value = 16.0
    code_bits = 16

    def roundtrip(self, x: ArrayLike) -> np.ndarray:
        with np.errstate(over="ignore"):
            return _as_f32(x).astype(np.float16).astype(np.float32)


class Identity(Quantizer):
    """No quantization (float32, 32 bits per value), without a codec: the spec ``"none"``.

    The spec ``"f32"`` is the registered format f32 (:class:`CodecQuantizer`), which gives the same values for
    finite input and, like every format, refuses NaN and Inf.
    """

    name = "f32"
    bits_per_value = 32.0
    code_bits = 32

    def roundtrip(self, x: ArrayLike) -> np.ndarray:
        return np.array(_as_f32(x), copy=True)


# ---------------------------------------------------------------------------
# KIVI
# ---------------------------------------------------------------------------


def round_f16_down(v: ArrayLike) -> np.ndarray:
    """Largest float16 ``<= v`` (elementwise; float64 in, float16 out)."""
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(over="ignore"):
        h = v.astype(np.float16)
    bad = h.astype(np.float64) > v
    if bad.any():
        h[bad] = np.nextafter(h[bad], np.float16(-np.inf))
    return h


def round_f16_up(v: ArrayLike) -> np.ndarray:
    """Smallest float16 ``>= v`` (elementwise; float64 in, float16 out)."""
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(over="ignore"):
        h = v.astype(np.float16)
    bad = h.astype(np.float64) < v
    if bad.any():
        h[bad] = np.nextafter(h[bad], np.float16(np.inf))
    return h


AXES = ("channel", "token")


class KIVI(Quantizer):
    """KIVI-style asymmetric integer quantization (study only, **not a byte format**).

    Each group of ``group_size`` values gets a minimum ``z`` (the zero point)
    and a step ``s = (max - z) / (2**bits - 1)``; a value becomes the integer
    ``q = clip(round((x - z) / s), 0, 2**bits - 1)`` and is reconstructed as
    ``q * s + z``. The groups run

    - ``axis="channel"`` (KIVI's choice for keys): along the **token** axis
      (axis 0), one group per channel (and head) per ``group_size`` consecutive
      tokens. A last partial group of tokens gets its own min/max. An outlier
      channel gets its own scale, so it costs the other channels nothing.
    - ``axis="token"`` (KIVI's choice for values): along the **channel** axis
      (the last axis), one group per token per ``group_size`` channels; the
      last axis must be a multiple of ``group_size``.

    ``z`` and ``s`` are stored as float16 (``param_dtype``), as KIVI does; they
    are rounded *outward* (``z`` down, ``s`` up) so the grid always covers the
    group, which guarantees ``|x_hat - x| <= s / 2`` for every element (up to
    float32 rounding of the reconstruction). Values beyond the float16 range
    need ``param_dtype=np.float32``. ``bits_per_value = bits + 2 * 16 /
    group_size`` (two float16 parameters per group). The KIVI paper also keeps
    the most recent tokens in full precision; model that with
    :class:`CachePolicy` if needed.
    """

    def __init__(
        self, bits: int = 2, group_size: int = 32, axis: str = "channel", param_dtype: Any = np.float16
    ) -> None:
        check_int(bits, "KIVI bits", lo=1, hi=8, expected="an integer in 1..8", error=ConfigError)
        check_int(group_size, "KIVI group_size", lo=1, expected="a positive integer", error=ConfigError)
        check_choice(axis, "KIVI axis", AXES)
        self.bits = self.code_bits = int(bits)
        self.group_size = int(group_size)
        self.axis = axis
        self.param_dtype = np.dtype(param_dtype)
        if self.param_dtype not in (np.float16, np.float32):
            raise ConfigError(f"param_dtype must be float16 or float32, got {self.param_dtype}")
        self.levels = (1 << self.bits) - 1
        self.name = f"kivi{self.bits}-g{self.group_size}-{axis}"
        self.bits_per_value = self.bits + 2 * 8 * self.param_dtype.itemsize / self.group_size

    # grouped view: (..., group_size) with the reduction on the last axis
    def _grouped(self, x: np.ndarray) -> Any:
        G = self.group_size
        if self.axis == "token":
            if x.shape[-1] % G:
                raise TbqValueError(f"{self.name}: the last axis ({x.shape[-1]}) must be a multiple of group_size {G}")
            return x.reshape(x.shape[:-1] + (x.shape[-1] // G, G)), None
        T = x.shape[0]
        rest = x.shape[1:]
        x2 = x.reshape(T, -1)
        pad = (-T) % G
        if pad:  # repeat the last token: leaves the last group's min/max unchanged
            x2 = np.concatenate([x2, np.repeat(x2[-1:], pad, axis=0)], axis=0)
        g = x2.reshape(-1, G, x2.shape[1]).transpose(0, 2, 1)  # (groups, M, G)
        return g, (T, rest, pad)

    def _ungroup(self, g: np.ndarray, shape: Any, info: Any) -> Any:
        if self.axis == "token":
            return g.reshape(shape)
        T, rest, pad = info
        x2 = g.transpose(0, 2, 1).reshape(-1, g.shape[1])
        return x2[:T].reshape((T,) + rest)

    def quantize(self, x: ArrayLike) -> Any:
        """Integer codes and group parameters: ``(codes uint8, scale, zero)``.

        ``codes`` has the grouped shape ``(..., group_size)``; ``scale`` and
        ``zero`` (``param_dtype``) have that shape without the last axis.
        Reconstruct with :meth:`dequantize`.
        """
        x = _as_f32(x)
        if x.ndim == 0:
            raise TbqValueError("KIVI needs at least one axis")
        if not np.all(np.isfinite(x)):
            raise TbqValueError(f"{self.name}: the input holds NaN or Inf")
        g, _ = self._grouped(x)
        g = g.astype(np.float64)
        lo, hi = g.min(axis=-1), g.max(axis=-1)
        if self.param_dtype == np.float16:
            z = round_f16_down(lo)
            s = round_f16_up((hi - z.astype(np.float64)) / self.levels)
        else:
            z = lo.astype(np.float32)
            z = np.where(z.astype(np.float64) > lo, np.nextafter(z, np.float32(-np.inf)), z)
            s = ((hi - z.astype(np.float64)) / self.levels).astype(np.float32)
            s = np.where(s.astype(np.float64) * self.levels < hi - z, np.nextafter(s, np.float32(np.inf)), s)
        if not (np.all(np.isfinite(z)) and np.all(np.isfinite(s))):
            raise TbqValueError(
                f"{self.name}: a group's range does not fit {self.param_dtype}; use param_dtype=np.float32"
            )
        s64 = s.astype(np.float64)[..., None]
        with np.errstate(invalid="ignore", divide="ignore"):
            q = np.where(s64 > 0, np.rint((g - z.astype(np.float64)[..., None]) / np.where(s64 > 0, s64, 1.0)), 0.0)
        codes = np.clip(q, 0, self.levels).astype(np.uint8)
        return codes, s, z

    def dequantize(self, codes: Any, scale: Any, zero: Any, shape: Any) -> np.ndarray:
        """``codes * scale + zero`` in float32, back in the layout ``shape`` of the input."""
        g = codes.astype(np.float32) * scale.astype(np.float32)[..., None] + zero.astype(np.float32)[..., None]
        info = None
        if self.axis == "channel":
            T = shape[0]
            info = (T, tuple(shape[1:]), (-T) % self.group_size)
        return self._ungroup(g, tuple(shape), info)

    def roundtrip(self, x: ArrayLike) -> np.ndarray:
        x = _as_f32(x)
        codes, s, z = self.quantize(x)
        return self.dequantize(codes, s, z, x.shape)

    def step(self, x: ArrayLike) -> np.ndarray:
        """The quantization step ``s`` of the group of every element of ``x`` (same shape as ``x``, float64)."""
        x = _as_f32(x)
        _, s, _ = self.quantize(x)
        return self._spread(s, x.shape)

    def _spread(self, s: Any, shape: Any) -> Any:
        g = np.broadcast_to(s.astype(np.float64)[..., None], s.shape + (self.group_size,))
        info = None
        if self.axis == "channel":
            T = shape[0]
            info = (T, tuple(shape[1:]), (-T) % self.group_size)
        return self._ungroup(np.ascontiguousarray(g), tuple(shape), info)


# ---------------------------------------------------------------------------
# Block Lloyd-Max with and without rotation
# ---------------------------------------------------------------------------


def _gaussian_codebook(bits: int, sigma: float) -> Codebook:
    """Lloyd-Max codebook of N(0, sigma^2): the library's tables up to 5 bits, the study fitter above."""
    if bits <= 5:
        return lloyd_max(bits, sigma)
    c, m = metrics.lloyd_max_levels(bits)
    return Codebook((c * sigma).astype(np.float32), (m * sigma).astype(np.float32))


class _BlockLloydMax(Quantizer):
    def __init__(self, bits: int, block_size: int, codebook: Any, rotation: Any) -> None:
        check_int(bits, "bits", lo=1, hi=8, expected="an integer in 1..8", error=ConfigError)
        if block_size < 2 or block_size & (block_size - 1):
            raise ConfigError(f"block_size must be a power of two >= 2, got {block_size}")
        self.bits = self.code_bits = int(bits)
        self.block_size = int(block_size)
        sigma = 1.0 / math.sqrt(self.block_size)
        self.codebook: Codebook = (
            _gaussian_codebook(self.bits, sigma) if codebook is None else get_codebook(codebook, self.bits)
        )
        self.rotation = rotation
        self.bits_per_value = self.bits + 16.0 / self.block_size

    def indices(self, x: ArrayLike) -> np.ndarray:
        """Codebook indices of every value (in the rotated domain when rotating), shape of ``x``."""
        u, _ = self._normalised(x)
        return self.codebook.index(u).reshape(np.shape(x))

    def _normalised(self, x: Any) -> Any:
        x = _as_f32(x)
        n = self.block_size
        if x.ndim == 0 or x.shape[-1] % n:
            raise TbqValueError(f"{self.name}: the last axis must be a multiple of the block size {n}, got {x.shape}")
        b = x.reshape(-1, n)
        norm = np.sqrt(np.sum(b.astype(np.float64) ** 2, axis=1)).astype(np.float32)
        inv = np.where(norm > 1e-10, np.float32(1) / np.where(norm > 1e-10, norm, np.float32(1)), np.float32(0))
        u = b * inv[:, None]
        if self.rotation is not None:
            u = self.rotation.forward(u)
        return u, norm

    def roundtrip(self, x: ArrayLike) -> np.ndarray:
        x = _as_f32(x)
        u, norm = self._normalised(x)
        c = self.codebook.centroids
        r = c[self.codebook.index(u)]
        recon = np.sqrt(np.sum(r.astype(np.float64) ** 2, axis=1)).astype(np.float32)
        d = np.where(recon > 1e-10, norm / np.where(recon > 1e-10, recon, np.float32(1)), norm)
        with np.errstate(over="ignore"):
            d = d.astype(np.float16).astype(np.float32)  # the fp16 scale a block format would store
        if self.rotation is not None:
            r = self.rotation.inverse(r)
        return (r * d[:, None]).astype(np.float32).reshape(x.shape)


class LloydMaxNoRotation(_BlockLloydMax):
    """TBQ's quantizer **without** the rotation (study only, **not a byte format**).

    Per block of ``block_size`` values: divide by the block's norm, code every
    coordinate with the ``bits``-bit Lloyd-Max codebook for N(0, 1/block_size)
    (or ``codebook=``), and rescale by the corrected norm ``norm / |c[idx]|``
    rounded to fp16, exactly as TBQ does, but with no Hadamard transform in
    between. On Gaussian data it matches TBQ; on a block with outlier channels
    it shows what the rotation buys. ``bits_per_value = bits + 16/block_size``.
    """

    def __init__(self, bits: int = 4, block_size: int = 128, *, codebook: Any = None) -> None:
        super().__init__(bits, block_size, codebook, None)
        self.name = f"lm{self.bits}-norot"


class RotatedLloydMax(_BlockLloydMax):
    """The TBQ algorithm at any width (study only, **not a byte format**).

    Unit-norm block, randomized Hadamard rotation (``signs``: an integer seed,
    ``"turboq-mtp"`` for 128-blocks, or a pair of +-1 arrays), Lloyd-Max
    codebook for N(0, 1/block_size) with ``2**bits`` levels (or ``codebook=``),
    corrected fp16 norm. Float32 arithmetic without the bit-exact ordering of
    the codecs: for 3 and 4 bits use :class:`CodecQuantizer` (``tbq3_0``,
    ``tbq4_0``) for real caches; this class draws the curve between and beyond.
    ``bits_per_value = bits + 16/block_size``.
    """

    def __init__(self, bits: int = 4, block_size: int = 128, *, signs: Any = 0, codebook: Any = None) -> None:
        super().__init__(bits, block_size, codebook, get_rotation(signs, block_size))
        self.name = f"rlm{self.bits}"


# ---------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------

_KIVI_RE = re.compile(r"^kivi(\d)(?:-g(\d+))?(?:-(channel|token))?$")
_LM_RE = re.compile(r"^lm(\d)(?:-norot)?$")
_RLM_RE = re.compile(r"^rlm(\d)$")


def get_quantizer(spec: Any, *, role: str | None = None, **config: Any) -> Quantizer:
    """Build a quantizer from a short name (or return a :class:`Quantizer` unchanged).

    ``q8_0`` ... ``tbq3_0`` (any format name)
        the real format (:class:`CodecQuantizer`); a suffix ``:turboq-mtp``
        selects the fork's codebook; ``config`` goes to :func:`tbq.get_codec`
    ``f16``, ``f32``
        formats too: fp16 rounding, and no quantization (the float32 values themselves)
    ``none``
        :class:`Identity`: no quantization, without a codec
    ``kivi<b>[-g<G>][-channel|-token]``
        :class:`KIVI` with ``b`` bits, group size ``G`` (default 32); the axis
        defaults to ``channel`` for ``role="key"`` and ``token`` otherwise
    ``lm<b>``
        :class:`LloydMaxNoRotation`
    ``rlm<b>``
        :class:`RotatedLloydMax` (``signs=`` in config, default 0)

    >>> get_quantizer("kivi2", role="key").name, get_quantizer("kivi4-g64-token").bits_per_value
    ('kivi2-g32-channel', 4.5)
    """
    if isinstance(spec, Quantizer):
        return spec
    if isinstance(spec, Codec):
        return CodecQuantizer(spec)
    if not isinstance(spec, str):
        raise ConfigError(f"a quantizer spec is a name or a Quantizer, got {type(spec).__name__}")
    name, _, suffix = spec.partition(":")
    if name in FORMATS:
        cfg = dict(config)
        if suffix:
            cfg["codebook"] = suffix
        return CodecQuantizer(name, **cfg)
    if suffix:
        raise ConfigError(f"only format names take a ':codebook' suffix, got {spec!r}")
    if name == "none":
        return Identity()
    m = _KIVI_RE.match(name)
    if m:
        axis = m.group(3) or ("channel" if role == "key" else "token")
        return KIVI(int(m.group(1)), int(m.group(2) or 32), axis, **config)
    m = _LM_RE.match(name)
    if m:
        return LloydMaxNoRotation(int(m.group(1)), **config)
    m = _RLM_RE.match(name)
    if m:
        return RotatedLloydMax(int(m.group(1)), **config)
    raise ConfigError(
        f"unknown quantizer {spec!r}: use a format ({', '.join(FORMATS)}), kivi<b>[-g<G>][-channel|-token], "
        "lm<b>, rlm<b> or none"
    )


# ---------------------------------------------------------------------------
# Cache policies
# ---------------------------------------------------------------------------


class CachePolicy:
    """A mixed KV-cache policy: K format, V format, and sink tokens kept in higher precision.

    ``k``, ``v``: quantizer specs (:func:`get_quantizer`; a bare ``kivi<b>``
    means per-channel for K and per-token for V). ``n_sink``: the first
    ``n_sink`` tokens of both K and V are stored with ``sink`` (``"f16"`` or
    ``"q8_0"``, or any spec) instead. Inputs are ``(tokens, ..., head_dim)``.

    >>> p = CachePolicy("tbq3_0", "tbq4_0", n_sink=4)
    >>> p.label, round(p.bits_per_value(1024), 4)
    ('K tbq3_0 / V tbq4_0 + 4 sink f16', 3.6733)
    """

    def __init__(self, k: Any = "tbq4_0", v: Any = "tbq4_0", *, n_sink: int = 0, sink: Any = "f16") -> None:
        self.k = get_quantizer(k, role="key")
        self.v = get_quantizer(v, role="value")
        self.n_sink = check_int(n_sink, "n_sink", lo=0, expected="a non-negative integer", error=ConfigError)
        self.sink = get_quantizer(sink)
        label = f"K {self.k.name} / V {self.v.name}"
        if self.n_sink:
            label += f" + {self.n_sink} sink {self.sink.name}"
        self.label = label

    def _apply(self, q: Quantizer, x: Any) -> Any:
        x = _as_f32(x)
        n = min(self.n_sink, x.shape[0])
        out = np.empty(x.shape, np.float32)
        if n:
            out[:n] = self.sink.roundtrip(x[:n])
        if n < x.shape[0]:
            out[n:] = q.roundtrip(x[n:])
        return out

    def apply_keys(self, keys: Any) -> np.ndarray:
        """Reconstructed keys under this policy."""
        return self._apply(self.k, keys)

    def apply_values(self, values: Any) -> np.ndarray:
        """Reconstructed values under this policy."""
        return self._apply(self.v, values)

    def apply(self, keys: Any, values: Any) -> Any:
        """``(k_hat, v_hat)``: both reconstructions."""
        return self.apply_keys(keys), self.apply_values(values)

    def bits_per_value(self, tokens: int) -> float:
        """Average storage bits per cached value (K and V together) for a context of ``tokens``."""
        n = min(self.n_sink, tokens)
        if tokens <= 0:
            raise TbqValueError(f"tokens must be positive, got {tokens}")
        rest = tokens - n
        kb = (n * self.sink.bits_per_value + rest * self.k.bits_per_value) / tokens
        vb = (n * self.sink.bits_per_value + rest * self.v.bits_per_value) / tokens
        return (kb + vb) / 2

    def __repr__(self) -> Any:
        return f"<CachePolicy {self.label}>"


# ---------------------------------------------------------------------------
# Measurements over the real formats
# ---------------------------------------------------------------------------


def rate_distortion_rows(
    datasets: dict[str, Any], specs: Any = None, *, n_queries: int = 16, topk: int = 8, seed: int = 0
) -> list[dict[str, Any]]:
    """One row per data set and format: bits per value, vector error and what attention sees.

    ``datasets``: ``{name: array}``, each ``(tokens, heads, head_dim)`` or
    ``(tokens, head_dim)``, quantized as a **key** cache. ``specs``: formats
    or quantizer specs (:func:`get_quantizer`), by default every cache type that
    quantizes (:func:`tbq.formats.cache_formats`; ``"f32"`` adds the unquantized
    baseline's row). The queries are :func:`tbq.metrics.random_queries`
    (``n_queries`` per head, ``seed``), the same for every format of a data
    set. Each row holds ``dataset``, ``name``, ``bits_per_value`` (for a
    format, its codec's ``bits_per_value``: every scale and minimum included,
    at the instance's block size), ``code_bits``, ``nmse``, ``snr_db``, and from
    :func:`tbq.metrics.attention_error` with only the keys quantized
    ``logit_rmse``, ``kl_mean`` (softmax KL, nats) and ``topk_agreement``
    (share of the exact top-``topk`` tokens kept), plus ``topk``.

    >>> from tbq import synthetic
    >>> rows = rate_distortion_rows({"g": synthetic.gaussian(64, 2, seed=0)}, ["q8_0", "tbq3_0"], n_queries=4)
    >>> [(r["name"], r["bits_per_value"], r["nmse"] < 0.04, r["topk_agreement"] <= 1) for r in rows]
    [('q8_0', 8.5, True, True), ('tbq3_0', 3.125, True, True)]
    """
    specs = list(cache_formats()) if specs is None else list(specs)
    rows = []
    for ds, x in datasets.items():
        x = _as_f32(x)
        if x.ndim not in (2, 3):
            raise TbqValueError(
                f"data set {ds!r}: expected (tokens, heads, head_dim) or (tokens, head_dim), got {x.shape}"
            )
        q = metrics.random_queries(n_queries, x.shape[-1], x.shape[1] if x.ndim == 3 else None, seed=seed)
        for spec in specs:
            quant = get_quantizer(spec)
            y = quant(x)
            att = metrics.attention_error(q, x, None, y, topk=topk)
            e = metrics.nmse(x, y)
            rows.append(
                {
                    "dataset": ds,
                    "name": quant.name,
                    "bits_per_value": quant.bits_per_value,  # a format's: its codec's instance (head_dim may set it)
                    "code_bits": quant.code_bits,
                    "nmse": e,
                    "snr_db": float(-10.0 * np.log10(e)) if e > 0 else math.inf,
                    "logit_rmse": att["logit_rmse"],
                    "kl_mean": att["kl_mean"],
                    "topk_agreement": att["topk_agreement"],
                    "topk": topk,
                }
            )
    return rows


def _table(fmt: Any, trace: Any, **options: Any) -> Any:
    """``(levels, inputs)`` of a format from its encoder trace: the format's declared value table
    (:meth:`tbq.formats.capabilities.QuantizerTraits.value_table`; see :func:`table_levels`)."""
    table = get_format(fmt, **options).quantizer.value_table(trace)
    if table is None:
        raise ConfigError(f"{fmt} stores every value on its own (no scale, no value table)")
    return table


def table_levels(fmt: str, **options: Any) -> np.ndarray:
    """The values a format's codes decode to, sorted, in the units of :func:`table_inputs` (float64).

    ``options`` are format options (TBQ's ``codebook=``, FP8's ``scale=``). Each
    format declares its table (:meth:`~tbq.formats.capabilities.QuantizerTraits.value_table`, on its
    encoder trace; docs/formats.md):

    ========================== =========================== ===========================================
    formats                    levels                      units (what :func:`table_inputs` returns)
    ========================== =========================== ===========================================
    tbq, planar, iso           the codebook's centroids    ``r``: the unit-norm block, rotated
    iq4_nl                     the int8 table ``K``        ``a = x / d0``, ``d0 = max / -127``
    mxfp4, nvfp4               the doubled E2M1 values     ``x / d`` with the block's (sub-block's) halved scale
    q4_0, q5_0                 ``-2**(b-1) .. 2**(b-1)-1`` ``v = x / d``, ``d = max / -2**(b-1)``
    q4_1, q5_1                 ``0 .. 2**b - 1``           ``v = (x - min) / d``
    q8_0                       ``-128 .. 127``             ``v = x / d``, ``d = amax / 127``
    fp8_e4m3, fp8_e5m2         every finite byte's value   ``v = x / scale``
    ========================== =========================== ===========================================

    Duplicates are kept (FP4 has two codes for zero), so ``len`` is the
    number of codes, ``2**index_bits``; f16 and bf16 have no table.

    >>> table_levels("q4_0")[[0, -1]], table_levels("iq4_nl")[:3], len(table_levels("mxfp4"))
    (array([-8.,  7.]), array([-127., -104.,  -83.]), 16)
    """
    fm = get_format(fmt, **options)  # the instance's block (vLLM's head_dim option sets it), not the registry's row
    probe = np.linspace(-1.0, 1.0, fm.info.block_size, dtype=np.float32)
    _, trace = fm.encode(probe, trace=True)
    return np.sort(_table(fmt, trace, **options)[0])


def table_inputs(fmt: str, x: ArrayLike, **options: Any) -> np.ndarray:
    """The values a format's table meets when it encodes ``x``, from its encoder trace (flat float64).

    The units and quantities are those of :func:`table_levels`'s table: for a
    rotated format the coordinates of the unit-norm block after the format's
    own rotation (about N(0, 1/128) when the rotation makes them Gaussian),
    for the block formats the block-normalised values the encoder rounds.
    FP4 sub-blocks whose scale is zero are left out.

    >>> from tbq import synthetic
    >>> r = table_inputs("tbq4_0", synthetic.gaussian(64, 2, seed=0))
    >>> r.size, round(float(np.sum(r * r)) / 128, 4)  # 128 blocks of unit norm
    (16384, 1.0)
    """
    a = _as_f32(x)
    _, trace = get_format(fmt, **options).encode(a, trace=True)
    return _table(fmt, trace, **options)[1]


def rotated_nmse(fmt: str, x: ArrayLike, levels: ArrayLike | None = None, **options: Any) -> float:
    """NMSE of a rotated format's scheme with its own rotation and the value table ``levels``.

    The format's encoder (with its ``options``) supplies the unit-norm rotated
    coordinates ``r`` and the norms of every block; each coordinate is rounded
    to the nearest of ``levels`` (default: the format's own centroids), and
    the block is rescaled by the corrected norm ``norm / |c|`` as the format
    does. The rotation is orthonormal, so the error in the rotated domain is
    the error of the decoded block:
    ``sum_blocks norm**2 |r - c / |c||**2 / sum_blocks norm**2``, in float64
    and without the fp16 rounding of the stored norm. With the format's own
    table this is the format's NMSE to within that rounding; with another
    table it is what the same rotation would give with that table.

    >>> from tbq import synthetic
    >>> from tbq.codebooks import lloyd_max
    >>> k = synthetic.keys_with_outliers(64, 2, seed=1)
    >>> own, lm = rotated_nmse("planar4_0", k), rotated_nmse("planar4_0", k, lloyd_max(4).centroids)
    >>> lm < own  # planar4_0's rotation with TBQ's 4-bit Lloyd-Max table instead of its own
    True
    """
    fm = get_format(fmt, **options)
    a = _as_f32(x)
    _, trace = fm.encode(a, trace=True)
    view = fm.quantizer.rotated_view(trace)
    if view is None:
        raise ConfigError(f"{fmt} is not a rotated format")
    n = fm.info.block_size
    r = np.asarray(view[1], np.float64).reshape(-1, n)
    norm = np.asarray(view[0], np.float64).reshape(-1)
    c = np.unique(np.asarray(fm.tables()["centroids"] if levels is None else levels, np.float64).ravel())
    q = c[np.searchsorted(0.5 * (c[1:] + c[:-1]), r, side="right")]
    qn = np.sqrt(np.sum(q * q, axis=1, keepdims=True))
    est = np.where(qn > 0, q / np.where(qn > 0, qn, 1.0), 0.0)
    err = np.sum((r - est) ** 2, axis=1) * norm * norm
    den = float(np.sum(norm * norm))
    return float(np.sum(err) / den) if den > 0 else 0.0
