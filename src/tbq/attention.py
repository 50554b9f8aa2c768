"""Reference attention over quantized KV caches, and the rotated-domain algorithm.

A fused attention kernel for the TBQ formats never dequantizes the cache.
Because the randomized Hadamard rotation ``R`` is orthonormal, ``q . k =
R(q) . R(k)``, so the kernel rotates the query once, reads every key as
``centroid[idx] * d`` straight from its block, takes the softmax, accumulates
``p_t * d_t * centroid[idx_t]`` for the values, and rotates the output back
once (``SPEC.md``, *Rotated-domain attention*). This module computes both
sides so a kernel has something to be compared with:

- :func:`attention_dequantized`: dequantize K and V, then ordinary attention,
  all in float64;
- :func:`attention_rotated`: the fused-kernel algorithm, in float32 (what a
  kernel computes) or float64.

``attention_rotated(..., backend="numba")`` runs that algorithm as a
compiled kernel (:mod:`tbq.attention_kernels`, also :func:`attention_fused`):
one pass over the blocks of any registered format (each read by its format's
attention reader) with an online softmax over token chunks, GQA heads (and
the query tokens of a prefill call) sharing each cache read, and threads over
token ranges fixed by the cache length, so its bits do not depend on the
number of threads.

In float64 the two agree to about 1e-16 of the largest value (they differ
only in rounding: the rotation is exactly orthonormal in exact arithmetic).
The float32 variant agrees with the float64 reference within
:func:`f32_tolerance`, ``4 * 2**-24 * max|V| * (1 + S)`` where ``S`` is the
largest ``scale * sum_j |q_j| |k_tj|`` (see its docstring for the measurement
and the reasoning).

Shapes
------
- the query ``q``: ``(n_head, head_dim)``;
- a cache (:class:`KVCache`) holds ``T`` tokens x ``n_head_kv`` heads x
  ``head_dim`` values, encoded per token and head (one row of ``head_dim``
  values is ``head_dim / block_size`` blocks);
- grouped-query attention: ``n_head`` is a multiple of ``n_head_kv`` and query
  head ``h`` reads KV head ``h // (n_head // n_head_kv)`` (the llama.cpp
  convention: consecutive query heads share a KV head);
- the softmax scale defaults to ``1/sqrt(head_dim)``.

K and V may use different formats (``q8_0`` keys with ``tbq4_0`` values, for
instance) and a cache can keep its first ``n_sink`` tokens in ``f16``,
``q8_0`` or any other registered format (an attention-sink-preserving cache);
the rotated algorithm then handles those tokens in the original domain and
adds their contribution after rotating the TBQ part back. Formats other than
TBQ (whose blocks are read in the rotated domain) are read in the original
domain through their decoder.

Every reduction is a sequential sum in index order (tokens, then channels), as
in the rest of the library, so results do not depend on the BLAS build. The
exponential is ``np.exp`` in float64 (rounded to float32 in the float32
variant).

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> q = rng.standard_normal((4, 128), dtype=np.float32)
>>> k = rng.standard_normal((16, 2, 128), dtype=np.float32)
>>> v = rng.standard_normal((16, 2, 128), dtype=np.float32)
>>> K, V = encode_kv(k, v, "q8_0", "tbq4_0", n_sink=2)
>>> ref = attention_dequantized(q, K, V)
>>> fused = attention_rotated(q, K, V, dtype=np.float64)
>>> ref.shape, bool(np.max(np.abs(ref - fused)) < 1e-12)
((4, 128), True)
>>> bool(np.max(np.abs(attention_rotated(q, K, V) - ref)) <= f32_tolerance(q, K, V))
True

Why one module of this length: the float64 reference, the rotated-domain reference, the fused
kernel's driver and its NumPy twin compute the same attention and are checked against each other;
the tolerance they are held to (:func:`f32_tolerance`) is derived here from the same operations.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .codecs import Codec, codec_from, get_codec
from .errors import ConfigError, NonFiniteError, TbqTypeError, TbqValueError, check_choice, check_int, check_number
from .formats import Format, format_info, format_name, formats
from .parallel import default_threads, run_shared
from .rotation import RandomizedHadamard, hadamard_scale

__all__ = [
    "KVCache",
    "encode_kv",
    "attention_dequantized",
    "attention_rotated",
    "SINK_FORMATS",
    "f32_tolerance",
    "score_condition",
    "F32_TOLERANCE_FACTOR",
    "ATTENTION_BACKENDS",
    "attention_fused",
]

#: Formats a sink-preserving cache may keep its first ``n_sink`` tokens in: ``f16``,
#: ``q8_0`` and every other registered format (they are decoded to float32 and read
#: in the original domain). ``f16`` and ``q8_0`` are the ones golden headers describe.
SINK_FORMATS = tuple(dict.fromkeys(("f16", "q8_0") + formats()))

#: Backends of :func:`attention_rotated`: the NumPy model and the compiled kernel.
ATTENTION_BACKENDS = ("numpy", "numba")

#: Safety factor of :func:`f32_tolerance` over the worst measured float32 error.
F32_TOLERANCE_FACTOR = 4.0

_F = TypeVar("_F", bound=np.floating[Any])


def _sink_block(fmt: str) -> int:
    """Block size of a sink format (a sink is encoded with the format's default options: its registry row)."""
    return format_info(fmt).block_size


def _tbq_like(fmt: Format) -> bool:
    """True when a :class:`~tbq.formats.Format` is read in its rotated domain (``attention_domain = "rotated"``:
    a randomized Hadamard rotation, a scalar codebook, fp16 norm + index fields: TBQ4_0, TBQ3_0)."""
    return fmt.attention.domain == "rotated"


@dataclass(frozen=True, eq=False)
class KVCache:
    """One encoded cache (K or V): ``T`` tokens x ``n_head_kv`` heads x ``head_dim`` values.

    Build one with :meth:`KVCache.encode` (or :func:`encode_kv` for both caches).

    Attributes
    ----------
    fmt : the format of tokens ``n_sink .. T-1`` (any registered format).
    data : uint8 ``(T - n_sink, n_head_kv, row_bytes)``, each ``head_dim`` row
        encoded as ``head_dim / block_size`` consecutive blocks.
    head_dim : values per head (a multiple of the format's block size).
    config : the codec configuration (keyword arguments of :func:`tbq.get_codec`,
        e.g. ``{"codebook": "turboq-mtp", "signs": 7}``; empty for the defaults).
    sink : uint8 ``(n_sink, n_head_kv, sink_row_bytes)`` or ``None``: the first
        ``n_sink`` tokens in ``sink_format`` (``f16``: little-endian binary16,
        2 bytes per value; a block format: ``head_dim / block_size`` blocks).
    sink_format : one of :data:`SINK_FORMATS` (``"f16"``, ``"q8_0"``, any registered format).
    """

    fmt: str
    data: NDArray[np.uint8]
    head_dim: int
    config: dict[str, Any] = field(default_factory=dict)
    sink: NDArray[np.uint8] | None = None
    sink_format: str = "f16"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", format_name(self.fmt))  # frozen: the canonical name
        object.__setattr__(self, "config", dict(self.config or {}))
        # the instance's sizes: a format option may change them (vLLM's head_dim), so not the registry's row
        info = self.codec.info
        check_choice(self.sink_format, "sink_format", SINK_FORMATS)
        if not isinstance(self.head_dim, (int, np.integer)) or self.head_dim < 1 or self.head_dim % info.block_size:
            raise TbqValueError(
                f"head_dim must be a positive multiple of {self.fmt}'s block size {info.block_size}, got {self.head_dim!r}"
            )
        sb = _sink_block(self.sink_format)
        if self.head_dim % sb:
            raise TbqValueError(
                f"a {self.sink_format} sink needs head_dim to be a multiple of {sb}, got {self.head_dim}"
            )
        data = np.asarray(self.data)
        if data.dtype != np.uint8:
            raise TbqTypeError(f"cache data must be uint8, got {data.dtype}")
        row_bytes = info.row_bytes(self.head_dim)
        if data.ndim != 3 or data.shape[2] != row_bytes:
            raise TbqValueError(
                f"cache data must have shape (tokens, n_head_kv, {row_bytes}) for "
                f"{self.fmt} with head_dim {self.head_dim}, got {data.shape}"
            )
        object.__setattr__(self, "data", data)
        if self.sink is not None:
            sink = np.asarray(self.sink)
            want = (
                sink.shape[0] if sink.ndim == 3 else -1,
                data.shape[1],
                format_info(self.sink_format).row_bytes(self.head_dim),
            )
            if sink.dtype != np.uint8 or sink.ndim != 3 or sink.shape[1:] != want[1:]:
                raise TbqValueError(
                    f"sink must be uint8 of shape (n_sink, {want[1]}, {want[2]}), got {sink.dtype} {sink.shape}"
                )
            object.__setattr__(self, "sink", sink if sink.shape[0] else None)

    # -- construction --
    @classmethod
    def encode(
        cls, x: ArrayLike, fmt: str, *, n_sink: int = 0, sink_format: str = "f16", config: dict[str, Any] | None = None
    ) -> KVCache:
        """Encode float ``x`` of shape ``(T, n_head_kv, head_dim)`` in ``fmt``.

        The first ``n_sink`` tokens are stored in ``sink_format`` instead.
        """
        a = np.asarray(x)
        if a.dtype not in (np.float16, np.float32, np.float64):
            raise TbqTypeError(f"cache values must be float, got dtype {a.dtype}")
        if a.ndim != 3:
            raise TbqValueError(f"cache values must have shape (tokens, n_head_kv, head_dim), got {a.shape}")
        x = a.astype(np.float32, copy=False)
        n_sink = check_int(
            n_sink,
            "n_sink",
            lo=0,
            hi=x.shape[0],
            expected=f"an integer in 0..{x.shape[0]} (the number of tokens)",
            error=TbqValueError,
        )
        check_choice(sink_format, "sink_format", SINK_FORMATS)
        config = dict(config or {})
        codec = codec_from(fmt, config)  # the fast backend: the same bytes as the NumPy spec
        if x.shape[2] % codec.block_size:
            raise TbqValueError(f"head_dim {x.shape[2]} is not a multiple of {fmt}'s block size {codec.block_size}")
        data = codec.encode(x[n_sink:])
        sink: NDArray[np.uint8] | None = None
        if n_sink:
            xs = x[:n_sink]
            if xs.shape[2] % _sink_block(sink_format):
                raise TbqValueError(
                    f"a {sink_format} sink needs head_dim to be a multiple of {_sink_block(sink_format)}, got {xs.shape[2]}"
                )
            # the sink format's own codec: f16 refuses a value that rounds to inf (use sink_format='q8_0' there)
            sink = get_codec(sink_format, backend="numpy").encode(xs)
        return cls(fmt, data, int(x.shape[2]), config, sink, sink_format)

    # -- facts --
    @property
    def n_sink(self) -> int:
        return 0 if self.sink is None else int(self.sink.shape[0])

    @property
    def n_tokens(self) -> int:
        return self.n_sink + int(self.data.shape[0])

    @property
    def n_head_kv(self) -> int:
        return int(self.data.shape[1])

    @property
    def rotated(self) -> bool:
        return self.codec.info.rotated

    @property
    def _rotated_read(self) -> bool:
        """True when the attention algorithms read this cache's blocks in the rotated domain (TBQ)."""
        return _tbq_like(self.codec.format)

    @property
    def codec(self) -> Codec:
        return _codec(self.fmt, self.config)

    # -- decoding --
    def fields(self) -> tuple[NDArray[np.uint8], NDArray[np.float32]]:
        """``(idx, d)`` of a TBQ cache's main part (the format's :meth:`~tbq.formats.Format.fields`).

        ``idx``: uint8 ``(T - n_sink, n_head_kv, nb, 128)`` codebook indices,
        ``d``: float32 ``(T - n_sink, n_head_kv, nb)`` decoded fp16 scales,
        with ``nb = head_dim / 128`` blocks per head.
        """
        if not self.rotated:
            raise TbqValueError(f"fields() is for the rotated formats, not {self.fmt}")
        f = self.codec.format.fields(self.data)
        return f["idx"], f["d"]

    def _sink_values(self) -> NDArray[np.float32]:
        """float32 ``(n_sink, n_head_kv, head_dim)``: the sink format's decoder (f16 and q8_0 decode without rounding)."""
        if self.sink is None:
            return np.zeros((0, self.n_head_kv, self.head_dim), np.float32)
        sink = get_codec(self.sink_format, backend="numpy")
        return sink.format.domain.from_decode_domain(sink.decode(self.sink)).astype(np.float32)

    def dequantize(self, dtype: DTypeLike = np.float32) -> NDArray[np.floating[Any]]:
        """All ``T`` tokens as ``(T, n_head_kv, head_dim)`` floats.

        ``float32``: the library decoder, bit-exact with the C reference, in the tokens' domain (a
        decoder that returns rotated coordinates, turbo2/3/4's, is rotated back with
        :meth:`~tbq.formats.capabilities.DomainTraits.from_decode_domain`, one more float32 rounding).
        ``float64``: the same values computed in float64 from the fields: Q8_0,
        Q4_0 and f16 decode exactly in either precision; for the TBQ formats
        the inverse rotation of the centroids runs in float64 and is multiplied
        by the float64 scale, so there is no float32 rounding (this is the
        "exact" dequantization the float64 reference uses).
        """
        dt = np.dtype(dtype)
        if dt not in (np.float32, np.float64):
            raise TbqTypeError(f"dtype must be float32 or float64, got {dt}")
        sink = self._sink_values().astype(dt)
        main: NDArray[np.floating[Any]]
        if dt == np.float32 or not self._rotated_read:
            # in the tokens' domain: a decoder that returns rotated coordinates (turbo2/3/4) is rotated back
            main = self.codec.format.domain.from_decode_domain(self.codec.decode(self.data)).astype(dt)
        else:
            codec = self.codec
            idx, d = self.fields()
            c = codec.codebook.centroids.astype(np.float64)[idx]
            y = codec.rotation.inverse(c) * d.astype(np.float64)[..., None]
            main = y.reshape(self.data.shape[0], self.n_head_kv, self.head_dim)
        return np.concatenate([sink, main], axis=0)


def _codec(fmt: str, config: dict[str, Any]) -> Codec:
    return codec_from(fmt, config, backend="numpy")


def encode_kv(
    k: ArrayLike,
    v: ArrayLike,
    k_fmt: str,
    v_fmt: str,
    *,
    n_sink: int = 0,
    sink_format: str = "f16",
    k_config: dict[str, Any] | None = None,
    v_config: dict[str, Any] | None = None,
) -> tuple[KVCache, KVCache]:
    """Encode a K and a V cache (each ``(T, n_head_kv, head_dim)``); returns ``(KVCache, KVCache)``.

    ``n_sink`` and ``sink_format`` apply to both caches (the first ``n_sink``
    tokens of each stay in f16 or q8_0).
    """
    K = KVCache.encode(k, k_fmt, n_sink=n_sink, sink_format=sink_format, config=k_config)
    V = KVCache.encode(v, v_fmt, n_sink=n_sink, sink_format=sink_format, config=v_config)
    return K, V


# ---------------------------------------------------------------------------
# the two algorithms
# ---------------------------------------------------------------------------


def _check(
    q_in: ArrayLike, k: KVCache, v: KVCache, scale_in: float | None, dtype: np.dtype[Any]
) -> tuple[NDArray[np.floating[Any]], np.floating[Any], NDArray[np.intp]]:
    """``(q in dtype, the scale in dtype, the KV head of each query head)``, or the error of the first bad argument."""
    if not isinstance(k, KVCache) or not isinstance(v, KVCache):
        raise TbqTypeError("k and v must be KVCache objects (see KVCache.encode / encode_kv)")
    q = np.asarray(q_in)
    if q.dtype not in (np.float16, np.float32, np.float64):
        raise TbqTypeError(f"q must be a float array, got dtype {q.dtype}")
    if q.ndim != 2:
        raise TbqValueError(f"q must have shape (n_head, head_dim), got {q.shape}")
    if not np.isfinite(q).all():
        raise NonFiniteError("q holds a non-finite value")
    n_head, dim = q.shape
    if k.head_dim != dim or v.head_dim != dim:
        raise TbqValueError(f"head_dim mismatch: q has {dim}, K has {k.head_dim}, V has {v.head_dim}")
    if k.n_tokens != v.n_tokens or k.n_tokens < 1:
        raise TbqValueError(f"K and V must hold the same number (>= 1) of tokens, got {k.n_tokens} and {v.n_tokens}")
    if k.n_head_kv != v.n_head_kv:
        raise TbqValueError(f"K and V must have the same number of KV heads, got {k.n_head_kv} and {v.n_head_kv}")
    if n_head % k.n_head_kv:
        raise TbqValueError(f"n_head ({n_head}) must be a multiple of n_head_kv ({k.n_head_kv})")
    scale = 1.0 / math.sqrt(dim) if scale_in is None else check_number(scale_in, "scale")
    kv_of_head = np.arange(n_head) // (n_head // k.n_head_kv)
    return q.astype(dtype), dtype.type(scale), kv_of_head


def _seq_dot(a: NDArray[np.floating[Any]], b: NDArray[np.floating[Any]]) -> NDArray[np.floating[Any]]:
    """``sum_j a[..., j] * b[..., j]`` accumulated sequentially in index order (broadcasting)."""
    acc = np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-1]), np.result_type(a, b))
    for j in range(a.shape[-1]):
        acc += a[..., j] * b[..., j]
    return acc


def _softmax(s: NDArray[np.floating[Any]], dtype: np.dtype[Any]) -> NDArray[np.floating[Any]]:
    """Softmax over the last axis in ``dtype``: max-subtracted, exp in float64, sequential sum."""
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp((s - m).astype(np.float64)).astype(dtype)
    total = np.zeros(s.shape[:-1], dtype)
    for t in range(s.shape[-1]):
        total += e[..., t]
    return e / total[..., None]


def _weighted_sum(p: NDArray[np.floating[Any]], rows: NDArray[_F]) -> NDArray[_F]:
    """``sum_t p[h, t] * rows[h, t, :]`` sequentially over t (``p`` (H, T), ``rows`` (H, T, D))."""
    acc = np.zeros((rows.shape[0], rows.shape[2]), rows.dtype)
    for t in range(rows.shape[1]):
        acc += p[:, t, None] * rows[:, t, :]
    return acc


def attention_dequantized(q: ArrayLike, k: KVCache, v: KVCache, *, scale: float | None = None) -> NDArray[np.float64]:
    """Ordinary attention over the dequantized caches, in float64.

    K and V are dequantized exactly in float64 (:meth:`KVCache.dequantize`),
    then for each query head ``h`` (KV head ``g = h // (n_head / n_head_kv)``):
    ``s_t = scale * q_h . K[t, g]``, ``p = softmax(s)``, ``o_h = sum_t p_t V[t, g]``.
    Returns float64 ``(n_head, head_dim)``.
    """
    dtype = np.dtype(np.float64)
    qd, sc, kvh = _check(q, k, v, scale, dtype)
    K = k.dequantize(np.float64)[:, kvh, :].transpose(1, 0, 2)  # (H, T, D)
    V = v.dequantize(np.float64)[:, kvh, :].transpose(1, 0, 2)
    s = _seq_dot(qd[:, None, :], K) * sc
    return _weighted_sum(_softmax(s, dtype), V)


def _scores(
    qd: NDArray[np.floating[Any]], cache: KVCache, kvh: NDArray[np.intp], dtype: np.dtype[Any]
) -> NDArray[np.floating[Any]]:
    """Raw scores ``q . k_t`` (H, T) the way a fused kernel computes them, in ``dtype``."""
    n_head, dim = qd.shape
    parts = []
    if cache.n_sink:
        ks = cache._sink_values().astype(dtype)[:, kvh, :].transpose(1, 0, 2)
        parts.append(_seq_dot(qd[:, None, :], ks))
    if cache.data.shape[0]:
        if cache._rotated_read:
            codec = cache.codec
            nb = dim // codec.block_size
            qr = codec.rotation.forward(qd.reshape(n_head, nb, codec.block_size))  # rotate the query once
            idx, d = cache.fields()  # (T', G, nb, 128), (T', G, nb)
            c = codec.codebook.centroids.astype(dtype)[idx[:, kvh]].transpose(1, 0, 2, 3)  # (H, T', nb, 128)
            dd = d.astype(dtype)[:, kvh].transpose(1, 0, 2)  # (H, T', nb)
            partial = _seq_dot(qr[:, None, :, :], c)  # (H, T', nb): sum_j q'_j c[idx_j]
            acc = np.zeros(partial.shape[:2], dtype)
            for b in range(nb):  # score = sum over blocks of d_b * (q'_b . c_b)
                acc += dd[..., b] * partial[..., b]
            parts.append(acc)
        else:
            km = cache.codec.decode(cache.data).astype(dtype)[:, kvh, :].transpose(1, 0, 2)  # exact
            parts.append(_seq_dot(qd[:, None, :], km))
    return np.concatenate(parts, axis=1)


def _values(
    p: NDArray[np.floating[Any]], cache: KVCache, kvh: NDArray[np.intp], dtype: np.dtype[Any]
) -> NDArray[np.floating[Any]]:
    """``sum_t p_t v_t`` (H, D), accumulating TBQ tokens in the rotated domain and rotating back once."""
    n_head = p.shape[0]
    dim = cache.head_dim
    ns = cache.n_sink
    out: NDArray[np.floating[Any]] | None = None
    if cache.data.shape[0]:
        pm = p[:, ns:]
        if cache._rotated_read:
            codec = cache.codec
            nb = dim // codec.block_size
            idx, d = cache.fields()
            c = codec.codebook.centroids.astype(dtype)[idx[:, kvh]].transpose(1, 0, 2, 3)  # (H, T', nb, 128)
            dd = d.astype(dtype)[:, kvh].transpose(1, 0, 2)  # (H, T', nb)
            acc = np.zeros((n_head, nb, codec.block_size), dtype)
            for t in range(pm.shape[1]):  # o' += (p_t * d_t) * c[idx_t]
                acc += (pm[:, t, None] * dd[:, t, :])[..., None] * c[:, t]
            out = codec.rotation.inverse(acc).reshape(n_head, dim)  # rotate the output back once
        else:
            vm = cache.codec.decode(cache.data).astype(dtype)[:, kvh, :].transpose(1, 0, 2)
            out = _weighted_sum(pm, vm)
    if ns:
        vs = cache._sink_values().astype(dtype)[:, kvh, :].transpose(1, 0, 2)
        o_sink = _weighted_sum(p[:, :ns], vs)
        out = o_sink if out is None else out + o_sink
    assert out is not None  # _check: a cache holds at least one token, a sink or a main one
    return out


def attention_rotated(
    q: ArrayLike,
    k: KVCache,
    v: KVCache,
    *,
    scale: float | None = None,
    dtype: DTypeLike = np.float32,
    backend: str = "numpy",
    threads: int | None = None,
) -> NDArray[np.floating[Any]]:
    """The fused-kernel algorithm of ``SPEC.md`` in ``dtype`` (float32 or float64).

    For a TBQ K cache: ``q' = R(q)`` once per head, then for each token
    ``s_t = scale * d_t * (q' . c[idx_t])`` straight from the block fields.
    For a TBQ V cache: ``o' = sum_t (p_t * d_t) * c[idx_t]``, then ``o = R^-1(o')``
    once. Q8_0/Q4_0 caches and sink tokens are read in the original domain
    (Q8_0/Q4_0/f16 values are exact in float32; other formats through their
    decoder). ``p`` is the softmax of the scores (max-subtracted).

    ``backend="numpy"`` (default) is the model: every sum sequential in index
    order, the golden vectors' ``out_rotated_*``. ``backend="numba"`` is the
    compiled kernel (float32 only; ``threads`` workers, default all cores):
    the same algorithm in one pass with an online softmax over token chunks,
    within :func:`f32_tolerance` of :func:`attention_dequantized` like the
    float32 model (its own float32 arithmetic, fma lane sums over chunks, so its
    bits differ from the model's: docs/formats.md, *Fused attention arithmetic*).
    Returns ``(n_head, head_dim)`` in ``dtype``.
    """
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise TbqTypeError(f"dtype must be float32 or float64, got {dt}")
    check_choice(backend, "backend", ATTENTION_BACKENDS)
    n_threads = _check_threads(threads)
    if backend == "numba":
        if dt != np.float32:
            raise TbqTypeError("the numba attention kernel computes in float32; use backend='numpy' for float64")
        qd, sc, _ = _check(q, k, v, scale, dt)
        return _attention_kernel(qd[None], k, v, float(sc), n_threads)[0]
    qd, sc, kvh = _check(q, k, v, scale, dt)
    s = _scores(qd, k, kvh, dt) * sc
    p = _softmax(s, dt)
    return _values(p, v, kvh, dt)


def _check_threads(threads: object) -> int | None:
    """``threads`` of the compiled kernel: a positive integer, or None (all cores)."""
    if threads is None:
        return None
    return check_int(threads, "threads", lo=1, expected="a positive integer or None (all cores)", error=ConfigError)


# ---------------------------------------------------------------------------
# the compiled kernel: preparing the caches, splitting the work, merging
# ---------------------------------------------------------------------------

#: Tokens per task of the compiled kernel (at least; a long cache is cut into at most
#: :data:`MAX_TASKS` tasks). The tasks and the order their partial sums merge in depend on the
#: cache's length only, never on the number of threads, so neither do the bits of the result.
TASK_TOKENS = 512
#: Most tasks one call makes (their partial sums are merged in float64 afterwards).
MAX_TASKS = 64

_NO_AUX = np.zeros(1, np.float32)


class _Rotation(Protocol):
    """A format's orthonormal per-block rotation (:attr:`tbq.formats.Format.rotation`)."""

    def forward(self, x: NDArray[np.float32]) -> NDArray[np.floating[Any]]: ...

    def inverse(self, y: NDArray[np.float64]) -> NDArray[np.floating[Any]]: ...


#: The signs of :func:`_compiled_rotation`: a rotation as the compiled merge takes it.
_Signs = tuple[NDArray[np.floating[Any]], NDArray[np.floating[Any]], np.floating[Any]]

#: :func:`tbq.attention_kernels.merge_partials`' rotation argument when the output needs none (float64, no blocks).
_NO_ROTATION: _Signs = (np.zeros(0, np.float64), np.zeros(0, np.float64), np.float64(1.0))


def _compiled_rotation(rot: object, block_size: int, dtype: np.dtype[Any], *, inverse: bool) -> _Signs | None:
    """``(first signs, second signs, scale)`` in ``dtype`` with which :func:`tbq.attention_kernels.rotate_rows` and
    :func:`~tbq.attention_kernels.merge_partials` compute ``rot.forward`` (or ``rot.inverse``) on blocks of
    ``block_size`` values, bit for bit; ``None`` for a rotation they do not know (then ``rot`` itself is called)."""
    if not isinstance(rot, RandomizedHadamard) or rot.n != block_size:
        return None
    return _hadamard_signs(rot, dtype, inverse)


@functools.lru_cache(maxsize=64)
def _hadamard_signs(rot: RandomizedHadamard, dtype: np.dtype[Any], inverse: bool) -> _Signs:
    """:func:`_compiled_rotation` of a randomized Hadamard rotation, once per rotation (they are equal by signs):
    ``forward`` is ``signs1``, the butterfly, ``hadamard_scale``, ``signs2``; ``inverse`` swaps the signs."""
    first, second = (rot.signs2, rot.signs1) if inverse else (rot.signs1, rot.signs2)
    return first.astype(dtype), second.astype(dtype), hadamard_scale(rot.n, dtype)


#: A kernel operand: ``(reader, bytes, tables, blocks per row, rotation or None)``.
_Operand = tuple[int, NDArray[np.uint8], NDArray[np.float32], int, "_Rotation | None"]  # (reader address, ...)
#: An operand without its rotation, as :func:`tbq.attention_kernels._attend` takes it.
_Read = tuple[int, NDArray[np.uint8], NDArray[np.float32], int]  # (reader address, bytes, tables, blocks per row)


# ---------------------------------------------------------------------------
# the compiled kernel's arithmetic in NumPy, bit for bit (its twin)
# ---------------------------------------------------------------------------


def _fma32(a: ArrayLike, b: ArrayLike, c: ArrayLike) -> NDArray[np.float32]:
    """float32 ``a * b + c`` rounded once (a fused multiply-add), elementwise, in NumPy.

    The float64 product of two float32 values is exact (48 significant bits); the float64 sum ``s = p + c``
    is rounded to odd (where the sum is inexact, its error ``e`` from TwoSum, and ``s``'s last significand bit
    even, ``s`` moves one float64 ulp towards ``e``), so rounding ``s`` to float32 afterwards gives the correctly
    rounded result (53 >= 2 * 24 + 2 bits: no double rounding). Infinities and NaN follow the float64 sum.

    >>> float(_fma32(np.float32(1 + 2**-23), np.float32(1 - 2**-23), np.float32(-1)))  # a * b - 1 = -2**-46
    -1.4210854715202004e-14
    """
    a64 = np.asarray(a, np.float32).astype(np.float64)
    b64 = np.asarray(b, np.float32).astype(np.float64)
    c64 = np.asarray(c, np.float32).astype(np.float64)
    p = a64 * b64
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c64
        bv = s - p  # TwoSum (Knuth): s + e == p + c exactly, for finite p, c
        e = (p - (s - bv)) + (c64 - bv)
    bits = np.asarray(s).view(np.uint64)
    nudge = np.isfinite(s) & (e != 0) & ((bits & np.uint64(1)) == 0)
    if np.any(nudge):
        s = np.where(nudge, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    with np.errstate(over="ignore"):
        return np.asarray(s.astype(np.float32))


def _expf32(x: ArrayLike) -> NDArray[np.float32]:
    """:func:`tbq.attention_kernels.expf`, operation for operation in NumPy float32 (for ``x <= 0``)."""
    from . import attention_kernels as kn

    x = np.asarray(x, np.float32)
    xc = np.where(x > kn._EXP_LO, x, kn._EXP_LO)
    k = np.floor(xc * kn._LOG2E + kn._HALF)
    r = xc - k * kn._LN2_HI
    r = r - k * kn._LN2_LO
    rr = r * r
    p = np.full_like(r, kn._P0)
    for c in (kn._P1, kn._P2, kn._P3, kn._P4, kn._P5):
        p = p * r + c
    p = p * rr + r
    p = p + np.float32(1)
    with np.errstate(invalid="ignore"):
        two_k = ((k.astype(np.int32) + np.int32(127)) << np.int32(23)).view(np.float32)
    y = p * two_k
    return np.where(x > kn._EXP_LO, y, np.float32(0)).astype(np.float32)


def _score_lanes(q: NDArray[np.float32], k: NDArray[np.float32]) -> NDArray[np.float32]:
    """The kernel's raw scores ``q . k`` (no scale) of rows ``q`` ``(R, D)`` and keys ``k`` ``(T, D)``: ``(R, T)``.

    16 lane sums, lane ``l`` taking ``fma(q_j, k_j, a_l)`` for ``j = l, l + 16, ...`` in order from 0, then the
    tree ``a_l + a_{l+8}`` (``l < 8``), ``+4``, ``+2``, ``+1``."""
    R, D = q.shape
    lanes = np.zeros((R, k.shape[0], 16), np.float32)
    for j in range(0, D, 16):
        w = min(16, D - j)
        lanes[..., :w] = _fma32(q[:, None, j : j + w], k[None, :, j : j + w], lanes[..., :w])
    for h in (8, 4, 2, 1):
        lanes[..., :h] = lanes[..., :h] + lanes[..., h : 2 * h]
    return lanes[..., 0]


def _attend_numpy(
    Q: NDArray[np.float32],
    lim: NDArray[np.int64],
    scale: np.float32,
    rows: tuple[NDArray[np.float32], NDArray[np.float32]],
    span: tuple[int, int],
    chunk: int,
) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.float32]]:
    """:func:`tbq.attention_kernels._attend` in NumPy, bit for bit: ``(M, L, ACC)`` of tokens ``span`` of the
    decoded rows ``(K, V)`` (float32 ``(T, G, D)``, in the readers' domains), ``Q`` ``(G, RQ, D)``, row ``r``
    seeing tokens ``< lim[r]``. Vectorised across rows, tokens and channels only (lanes are independent
    elements); every element's operations are the kernel's, in its order (docs/formats.md, *Fused attention
    arithmetic*)."""
    Kr, Vr = rows
    t0, t1 = span
    G, RQ, D = Q.shape
    f32 = np.float32
    M = np.full((G, RQ), -np.inf, f32)
    L = np.zeros((G, RQ), f32)
    ACC = np.zeros((G, RQ, D), f32)
    for c0 in range(t0, t1, chunk):
        n = min(chunk, t1 - c0)
        for g in range(G):
            v = Vr[c0 : c0 + n, g]
            S = _score_lanes(Q[g], Kr[c0 : c0 + n, g]) * f32(scale)
            for r in range(RQ):
                if lim[r] < c0 + n:
                    S[r, max(0, lim[r] - c0) :] = -np.inf
                mc = M[g, r]
                for s in S[r]:  # the running maximum's chain: a NaN never replaces it, a tie keeps the first
                    mc = s if s > mc else mc
                if mc == -np.inf:
                    S[r] = 0
                    continue
                if mc > M[g, r]:
                    if L[g, r] != 0:
                        alpha = _expf32(np.array([M[g, r] - mc], np.float32))[0]
                        L[g, r] *= alpha
                        ACC[g, r] *= alpha
                    M[g, r] = mc
                S[r] = _expf32(S[r] - mc)
                total = f32(0)
                for p in S[r]:  # the chunk's sequential float32 sum, then added to the running one
                    total = f32(total + p)
                L[g, r] += total
            for t in range(n):
                ACC[g] = _fma32(S[:, t, None], v[None, t], ACC[g])
    return M, L, ACC


def _rows_operand(rows: NDArray[np.floating[Any]]) -> _Operand:
    """float32 rows ``(T, n_head_kv, head_dim)`` as a kernel operand: the blocks of the f32 format, read by its
    reader (one value a block, the bits copied)."""
    from .formats.f32_kernels import attention_read_f32
    from .kernels import attention_reader

    r32 = np.ascontiguousarray(rows, np.float32)
    return attention_reader(attention_read_f32).address, r32.view(np.uint8), _NO_AUX, r32.shape[2], None


def _kernel_operand(cache: KVCache | NDArray[np.float32], n_sink: int) -> _Operand:
    """``(reader, bytes, tables, blocks per row, rotation or None)`` of tokens ``n_sink ..`` for
    :func:`tbq.attention_kernels._attend`: the format's attention reader on its bytes as they are, or
    (a format declaring none) its decoder's float32 rows."""
    if isinstance(cache, np.ndarray):  # exact float rows
        return _rows_operand(cache[n_sink:])
    codec = cache.codec
    fmt = codec.format
    data = np.ascontiguousarray(cache.data[n_sink - cache.n_sink :])  # a view of a C-contiguous cache
    reader = fmt.attention.reader()
    if reader is None:
        return _rows_operand(codec_from(cache.fmt, cache.config).decode(data))
    # the rotated formats' rotation (an attribute of their instances, read through the codec)
    rotation: _Rotation | None = codec.rotation if fmt.attention.domain == "rotated" else None
    return reader.read.address, data, reader.aux, cache.head_dim // fmt.block_size, rotation


def _sink_rows(cache: KVCache | NDArray[np.float32], n_sink: int) -> NDArray[np.float32]:
    """float32 ``(n_sink, n_head_kv, head_dim)``: the first ``n_sink`` tokens as rows (the sinks, then decoded tokens)."""
    if isinstance(cache, np.ndarray):
        return np.ascontiguousarray(cache[:n_sink], np.float32)
    rows = cache._sink_values()
    if n_sink > cache.n_sink:  # the other cache keeps more sink tokens: read these few in the original domain too
        extra = cache.codec.format.domain.from_decode_domain(cache.codec.decode(cache.data[: n_sink - cache.n_sink]))
        rows = np.concatenate([rows, extra], axis=0)
    return np.ascontiguousarray(rows, np.float32)


def attention_fused(
    q: ArrayLike,
    k: KVCache | ArrayLike,
    v: KVCache | ArrayLike,
    *,
    scale: float | None = None,
    threads: int | None = None,
    causal: bool = False,
) -> NDArray[np.float32]:
    """The numba kernel on caches and/or exact float rows: float32 ``(n_head, head_dim)``.

    ``k`` and ``v`` are each a :class:`KVCache` (any registered format, read
    through its attention reader) or a float array ``(T, n_head_kv,
    head_dim)`` of exact rows (read in the original domain), so that the same
    kernel computes a reference output from the exact data and the output of
    a quantized cache (``tbq compare``'s ``out NMSE``).
    ``attention_rotated(q, K, V, backend="numba")`` is this with two caches.

    ``q`` may also be ``(n_query, n_head, head_dim)``: several query tokens
    (a prefill step) read each decoded key and value once; the result is then
    ``(n_query, n_head, head_dim)``. With ``causal=True`` query token ``i``
    is the cache's token ``T - n_query + i`` and sees the tokens up to
    itself. The result does not depend on ``threads``, bit for bit; its
    float32 arithmetic is documented in docs/formats.md (*Fused attention
    arithmetic*) and reproduced in NumPy by :func:`_attend_numpy`.
    """
    kc = k if isinstance(k, KVCache) else _float_rows(k, "k")
    vc = v if isinstance(v, KVCache) else _float_rows(v, "v")
    q = np.asarray(q)
    if q.dtype.kind != "f" or q.ndim not in (2, 3):
        raise TbqTypeError(
            f"q must be a float array (n_head, head_dim) or (n_query, n_head, head_dim), got {q.dtype} {q.shape}"
        )
    shapes = [(x.n_tokens, x.n_head_kv, x.head_dim) if isinstance(x, KVCache) else x.shape for x in (kc, vc)]
    if shapes[0] != shapes[1] or shapes[0][2] != q.shape[-1] or q.shape[-2] % shapes[0][1] or not shapes[0][0]:
        raise TbqValueError(
            f"q {q.shape}, K {shapes[0]} and V {shapes[1]} do not fit: (n_head, D), (T, n_head_kv, D) twice, T >= 1"
        )
    if not isinstance(causal, (bool, np.bool_)):
        raise TbqTypeError(f"causal must be True or False, got {causal!r}")
    if causal and q.ndim == 3 and q.shape[0] > shapes[0][0]:
        raise TbqValueError(f"a causal call needs at most T = {shapes[0][0]} query tokens, got {q.shape[0]}")
    if not np.isfinite(q).all():
        raise NonFiniteError("q holds a non-finite value")
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else _check_scale(scale)
    n_threads = _check_threads(threads)
    out = _attention_kernel(q.astype(np.float32).reshape((-1,) + q.shape[-2:]), kc, vc, sc, n_threads, bool(causal))
    return out if q.ndim == 3 else out[0]


def _check_scale(scale: object) -> float:
    """A logit scale: a finite positive number that float32 can hold."""
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TbqTypeError(f"scale must be a number or None (1/sqrt(head_dim)), got {scale!r}")
    # the type refused above in its own words; the range in check_number's, with the whole requirement
    return check_number(
        scale,
        "scale",
        lo=0,
        lo_open=True,
        hi=float(np.finfo(np.float32).max),
        expected="a finite positive float32 number or None (1/sqrt(head_dim))",
    )


def _float_rows(x: ArrayLike, name: str) -> NDArray[np.float32]:
    a = np.asarray(x)
    if a.dtype.kind != "f" or a.ndim != 3:
        raise TbqTypeError(f"{name} must be a KVCache or float rows (T, n_head_kv, head_dim), got {a.dtype} {a.shape}")
    return np.ascontiguousarray(a, np.float32)


def task_bounds(n_tokens: int) -> NDArray[np.int_]:
    """The token ranges of the compiled kernel's tasks for a cache part of ``n_tokens`` tokens (boundaries,
    multiples of the kernel's chunk): they depend on ``n_tokens`` only (see :data:`TASK_TOKENS`).

    >>> task_bounds(1300).tolist(), len(task_bounds(1 << 20)) - 1
    ([0, 512, 1024, 1300], 64)
    """
    from .attention_kernels import CHUNK

    step = max(TASK_TOKENS, -(-n_tokens // MAX_TASKS))
    step = -(-step // CHUNK) * CHUNK
    return np.append(np.arange(0, n_tokens, step), n_tokens) if n_tokens else np.zeros(1, int)


def _twin_rows(cache: KVCache | NDArray[np.float32], n_sink: int) -> NDArray[np.float32]:
    """float32 rows ``(T - n_sink, n_head_kv, head_dim)`` of tokens ``n_sink ..`` as the kernel's readers give them,
    computed in NumPy: ``c[idx] * d`` rounded once (rotated domain), else the decoder's rows."""
    if isinstance(cache, np.ndarray):
        return np.ascontiguousarray(cache[n_sink:], np.float32)
    fmt = cache.codec.format
    data = cache.data[n_sink - cache.n_sink :]
    if fmt.attention.domain == "rotated":
        f = fmt.fields(data)
        with np.errstate(all="ignore"):
            rows = cache.codec.codebook.centroids.astype(np.float32)[f["idx"]] * f["d"].astype(np.float32)[..., None]
        return np.ascontiguousarray(rows.reshape(data.shape[0], data.shape[1], cache.head_dim), np.float32)
    return np.ascontiguousarray(cache.codec.decode(data), np.float32)


def _attention_kernel(
    q: NDArray[np.float32],
    k: KVCache | NDArray[np.float32],
    v: KVCache | NDArray[np.float32],
    scale: float,
    threads: int | None,
    causal: bool = False,
    twin: bool = False,
) -> NDArray[np.float32]:
    """``q`` float32 ``(n_query, n_head, D)`` -> float32 ``(n_query, n_head, D)``. ``twin``: every task computed
    by :func:`_attend_numpy` on :func:`_twin_rows` instead of the compiled kernel (the same bits, slowly)."""
    from . import attention_kernels as kn

    n_q, n_head, dim = q.shape
    G = k.n_head_kv if isinstance(k, KVCache) else k.shape[1]
    R = n_head // G
    n_total = k.n_tokens if isinstance(k, KVCache) else k.shape[0]
    # K and V may keep different numbers
    n_sink = max(k.n_sink if isinstance(k, KVCache) else 0, v.n_sink if isinstance(v, KVCache) else 0)
    T = n_total - n_sink
    # the query rows of each KV head: (G, n_q * R, D), row i * R + r is query token i, head g * R + r
    qo = np.ascontiguousarray(q.reshape(n_q, G, R, dim).transpose(1, 0, 2, 3).reshape(G, n_q * R, dim))
    lim = np.repeat(np.arange(n_total - n_q + 1, n_total + 1) if causal else np.full(n_q, n_total), R).astype(np.int64)
    tasks: list[tuple[NDArray[np.float32], NDArray[np.int64], _Read, _Read, int, int]] = []
    # (queries, lim, K operand, V operand, first token, end token)
    rot_v: _Rotation | None = None
    if T:
        kop, vop = _kernel_operand(k, n_sink), _kernel_operand(v, n_sink)
        rot_k, rot_v = kop[4], vop[4]
        qr = qo
        if rot_k is not None:  # rotate the query once, per block, with the key cache's rotation
            assert isinstance(k, KVCache)  # _kernel_operand: float rows have no rotation
            bs = k.codec.block_size
            signs = None if twin else _compiled_rotation(rot_k, bs, np.dtype(np.float32), inverse=False)
            if signs is None:
                qr = np.ascontiguousarray(
                    rot_k.forward(qo.reshape(G, n_q * R, dim // bs, bs)).reshape(qo.shape), np.float32
                )
            else:  # the same operations, compiled
                qr = qo.copy()
                kn.rotate_rows(qr.reshape(-1, bs), *signs)
        bounds = task_bounds(T)
        for s, e in zip(bounds[:-1], bounds[1:], strict=True):
            tasks.append((qr, lim - n_sink, kop[:4], vop[:4], int(s), int(e)))
    n_main = len(tasks)
    if n_sink:  # the sink tokens: float32 rows in the original domain
        tasks.append(
            (qo, lim, _rows_operand(_sink_rows(k, n_sink))[:4], _rows_operand(_sink_rows(v, n_sink))[:4], 0, n_sink)
        )
    n = len(tasks)
    M = np.empty((n, G, n_q * R), np.float32)
    L = np.empty((n, G, n_q * R), np.float32)
    ACC = np.empty((n, G, n_q * R, dim), np.float32)
    sc = np.float32(scale)

    # the kernel without scalar paths where the head dimension allows (every model's), compiled only then
    attend = kn._attend if dim % 16 == 0 and kn.CHUNK % 16 == 0 else kn._attend_any
    rows: list[tuple[NDArray[np.float32], NDArray[np.float32]]] = []
    if twin:
        if T:
            rows = [(_twin_rows(k, n_sink), _twin_rows(v, n_sink))] * n_main
        if n_sink:
            rows.append((_sink_rows(k, n_sink), _sink_rows(v, n_sink)))

    # the operands whose TBQ codes the kernel reads itself (kn.code_bits: AVX-512, whole blocks): the tasks of
    # the cache's tokens share them; the sink tokens are float rows
    bits_main = (kn.code_bits(tasks[0][2], dim), kn.code_bits(tasks[0][3], dim)) if n_main else (0, 0)
    if attend is not kn._attend:
        bits_main = (0, 0)

    def run(i: int) -> None:
        Q, lm, kop, vop, t0, t1 = tasks[i]
        if twin:
            M[i], L[i], ACC[i] = _attend_numpy(Q, lm, sc, rows[i], (t0, t1), kn.CHUNK)
            return
        bits = bits_main if i < n_main else (0, 0)
        if bits != (0, 0):  # TBQ codes read in the microkernels: the same operations, the same bits
            kn._attend_codes(Q, lm, sc, kop, vop, (t0, t1), kn.CHUNK, (M[i], L[i], ACC[i]), *bits)
        else:
            attend(Q, lm, sc, kop, vop, (t0, t1), kn.CHUNK, (M[i], L[i], ACC[i]))

    # threads take the next task as they finish (each task writes its own M, L, ACC): returns when all are done
    run_shared(n, threads if threads is not None else default_threads(), run)
    # merge the partial softmax sums in task order (float64; the tasks do not depend on the threads)
    with np.errstate(invalid="ignore"):
        Mx = M.max(axis=0).astype(np.float64)
        w = np.exp(M.astype(np.float64) - Mx)  # a task that saw nothing: m = -inf, weight 0
    w[~np.isfinite(w)] = 0.0
    if not twin:
        inv: _Signs | None = _NO_ROTATION
        if rot_v is not None:
            assert isinstance(v, KVCache)  # _kernel_operand: float rows have no rotation
            inv = _compiled_rotation(rot_v, v.codec.block_size, np.dtype(np.float64), inverse=True)
        if inv is not None:  # the NumPy below, compiled: the same operations in the same order
            res = np.empty((n_q, n_head, dim), np.float32)
            kn.merge_partials(w, L, ACC, n_main, *inv, res)
            return res
    bs = v.codec.block_size if isinstance(v, KVCache) else dim
    return _merge_numpy(w, L, ACC, n_main, rot_v, bs, n_q, R)


def _merge_numpy(
    w: NDArray[np.float64],
    L: NDArray[np.float32],
    ACC: NDArray[np.float32],
    n_main: int,
    rot_v: _Rotation | None,
    block_size: int,
    n_q: int,
    R: int,
) -> NDArray[np.float32]:
    """The tasks' ``(w, L, ACC)`` merged into float32 ``(n_q, n_head, D)``, the definition (docs/formats.md,
    *Fused attention arithmetic*): ``w`` float64 ``(n, G, n_q * R)`` the tasks' weights, the first ``n_main``
    tasks over the cache's tokens (rotated back by ``rot_v``, blocks of ``block_size``, after their sum), the
    others over the sinks.
    :func:`tbq.attention_kernels.merge_partials` computes the same bits."""
    n, G = w.shape[:2]
    dim = ACC.shape[3]
    total = np.zeros((G, n_q * R))
    out: NDArray[Any] = np.zeros((G, n_q * R, dim))
    wl = w * L  # each product rounded once, then summed in task order
    for i in range(n):
        total += wl[i]
    for i in range(n_main):
        out += w[i][..., None] * ACC[i]
    if rot_v is not None:  # rotate the output back once
        bs = block_size
        out = rot_v.inverse(out.reshape(G, n_q * R, dim // bs, bs)).reshape(out.shape)
    for i in range(n_main, n):
        out += w[i][..., None] * ACC[i]
    out = out / total[..., None]
    return out.reshape(G, n_q, R, dim).transpose(1, 0, 2, 3).reshape(n_q, G * R, dim).astype(np.float32)


def score_condition(q: ArrayLike, k: KVCache, *, scale: float | None = None) -> float:
    """``S = max_{h,t} scale * sum_j |q_hj| * |k_tj|`` over the dequantized keys (float64).

    The absolute rounding error of a score is proportional to ``S``, not to
    the score itself (the terms of the dot product cancel), so ``S`` measures
    how hard the scores are to compute in float32.
    """
    qd, sc, kvh = _check(q, k, k, scale, np.dtype(np.float64))
    K = np.abs(k.dequantize(np.float64))[:, kvh, :].transpose(1, 0, 2)  # (H, T, D)
    return float(np.max(_seq_dot(np.abs(qd)[:, None, :], K)) * sc)


def f32_tolerance(q: ArrayLike, k: KVCache, v: KVCache, *, scale: float | None = None) -> float:
    """Absolute tolerance of :func:`attention_rotated` in float32 against :func:`attention_dequantized`.

    ``F32_TOLERANCE_FACTOR * 2**-24 * max|V| * (1 + S)`` with ``S`` from
    :func:`score_condition` and ``V`` the dequantized values.

    Why this form: the output is a convex combination of value rows, so the
    rounding of the weights and of the accumulation costs a few float32 ulps
    of ``max|V|`` (the ``1``); a score is a 128-term float32 dot product whose
    absolute error is a small multiple of ``2**-24 * S`` (not of the score:
    the terms cancel), and the softmax turns score errors ``ds`` into output
    errors ``sum_t p_t (ds_t - sum_u p_u ds_u) v_t``, at most ``2 max|ds| max|V|``.

    Measured (``tests/test_attention.py`` and a wider sweep of 108 runs: K in
    tbq4_0/q8_0/tbq3_0, V in tbq4_0/q4_0/tbq3_0, T from 8 to 1024, keys with
    outlier channels scaled so that ``S`` ranges from 3 to 270, sinks in f16
    and q8_0, GQA): the largest error was ``0.78 * 2**-24 * max|V| * (1 + S)``;
    the factor 4 leaves a 5x margin. A real defect (a wrong sign table, a
    missing rotation, a wrong centroid) gives errors of order 1e-2 * max|V|,
    millions of times larger.
    """
    V = v.dequantize(np.float64)
    return float(F32_TOLERANCE_FACTOR * 2.0**-24 * np.max(np.abs(V)) * (1.0 + score_condition(q, k, scale=scale)))
