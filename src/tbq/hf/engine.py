"""What an inference engine does to K and V around its cache: llama.cpp's ``-ctk/-ctv`` semantics.

A cache type is only half of what a model sees: the engine decides which
rows are quantized, in which channel order, after which rotation, and what
happens to Q before the K.Q products. :class:`Engine` holds those decisions
for one layer and applies them to torch tensors; :mod:`tbq.hf.cache` stores
the rows it produces with :func:`tbq.quantize`, and :mod:`tbq.hf.attention`
computes attention in the domain the rows were stored in.

Engines (``docs/eval.md`` lists what each mirrors and the agreement measured):

``"llama.cpp"`` (the default)
    What llama.cpp's CPU backend does with ``-ctk K -ctv V -fa on``:

    - one row per token and layer of ``n_kv_heads x head_dim`` values,
      quantized in blocks along it; a ggml type's block must divide head_dim,
      the fork's TBQ types' blocks only the row (:func:`check_block_rule`);
    - K in llama.cpp's channel order: for architectures whose GGUF conversion
      permutes Q/K (llama.cpp applies RoPE to adjacent pairs, transformers to
      the two halves), per head ``gguf[2i] = hf[i]``, ``gguf[2i+1] = hf[i + head_dim/2]``;
    - attention rotation: a quantized K cache (not f16/bf16/f32) with head_dim
      a multiple of 64 stores ``K @ H_n`` and multiplies Q by ``H_n`` (the
      orthonormal Sylvester Walsh-Hadamard matrix, ``n`` the largest power
      of two >= 64 dividing head_dim, in n-value blocks); a quantized V cache
      stores ``V @ H_64`` in 64-value blocks and multiplies the attention
      output by ``H_64`` (``H @ H = I``);
    - Q converted for the K.Q products as ggml's ``vec_dot_type`` of the K
      type says: q8_0 blocks (the CPU backend's SIMD quantizer: ``d = amax/127``
      stored as fp16, codes ``rint(x * 127/amax)``, ties to even) for the
      ggml block types, f32 otherwise;
    - the rows written by the CPU backend's ``from_float``: ``quantize_row_*_ref``
      (:func:`tbq.quantize`) for every type but q8_0, whose SIMD quantizer
      rounds differently (:func:`q8_0_simd_encode`);
    - the fork's TBQ types use the fork's own tables (``codebook="turboq-mtp"``)
      unless the caller passes options.

``"llama.cpp-fork"``
    The same, plus the TurboQuant fork's two defects found on its CPU build,
    named as such: a tbq4_0/tbq3_0 K cache whose head_dim holds whole TBQ
    blocks but is not a multiple of 256 (head_dim 128) gets Q converted to
    q8_K (256-value blocks), so the dot product sees no block and every
    attention score is 0 (at head_dim 64, where one block holds two heads,
    the scores were measured right); tbq3_0 rows are packed by the fork's
    buggy 3-bit packer (:func:`tbq.packing.pack3_fork_bug`).

``"plain"``
    The rows as the model computes them: no permutation, no rotation, Q in f32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .. import packing
from ..codecs import Codec, get_codec
from ..errors import ConfigError, TbqValueError
from ..formats import FORMATS, cache_formats, get_format
from ..half import f16_table
from ..kernels import f32_to_f16_bits, jit
from ..parallel import default_threads, run_groups
from ..rotation import hadamard_scale
from . import ENGINES

__all__ = [
    "ENGINES",
    "F32",
    "Engine",
    "check_block_rule",
    "gguf_permutation",
    "is_llama_cpp_type",
    "hadamard",
    "make_engine",
    "q8_0_simd",
    "q8_0_simd_encode",
    "rotate",
]


#: The pseudo-format that stores float32 rows as they are (4 bytes a value).
F32 = "f32"

#: The ggml types a llama.cpp engine stores: llama.cpp's -ctk/-ctv types, the fork's, and ggml's FP4 block types.
#: Other formats (vLLM's FP8) are not llama.cpp cache types: their rows are stored plain.
_GGML_TYPES = (
    F32,
    "f16",
    "bf16",
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    "iq4_nl",
    "mxfp4",
    "nvfp4",
    "tbq3_0",
    "tbq4_0",
    "planar3_0",
    "iso3_0",
    "planar4_0",
    "iso4_0",
)

#: Cache types llama.cpp treats as unquantized (``ggml_is_quantized`` is false): no attention rotation.
_UNQUANTIZED = (F32, "f16", "bf16")

#: K types whose ggml ``vec_dot_type`` is a q8 block type (q8_0; q8_1 for q4_1/q5_1, whose codes and
#: scale are q8_0's): Q is converted to q8_0 blocks before the K.Q products.
_Q8_VEC_DOT = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4", "nvfp4")

#: The type whose CPU-backend quantizer (``from_float``) is not its ``_ref``: written with :func:`q8_0_simd_encode`.
_SIMD_Q8_0 = "q8_0"

#: The fork's types whose K.Q dot takes Q as q8_K (256-value blocks): no block for a shorter head.
_Q8_K_VEC_DOT = ("tbq3_0", "tbq4_0")

#: transformers model types whose llama.cpp GGUF conversion permutes Q/K: convert_hf_to_gguf.py's LlamaModel and
#: its subclasses that keep ``undo_permute`` (Arcee, AFMoE, Granite and its MoE twins, SmolLM3, Mistral, Mixtral,
#: IQuest-Coder), and the classes calling ``LlamaModel.permute`` themselves (OLMo, InternLM3); read from the fork's
#: converter at c4e5e84 (NEOX-RoPE models such as qwen2/qwen3, gemma, phi3 and gpt-oss are not permuted).
PERMUTED_MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "granite",
    "granitemoe",
    "granitemoeshared",
    "arcee",
    "afmoe",
    "smollm3",
    "iquestcoder",
    "olmo",
    "internlm3",
)


# ---------------------------------------------------------------------------
# the transforms
# ---------------------------------------------------------------------------


def hadamard(n: int) -> torch.Tensor:
    """The orthonormal Sylvester Walsh-Hadamard matrix of order ``n`` (float64, entries +-1/sqrt(n)).

    >>> hadamard(2) * 2 ** 0.5
    tensor([[ 1.,  1.],
            [ 1., -1.]], dtype=torch.float64)
    """
    if n < 1 or n & (n - 1):
        raise TbqValueError(f"the Walsh-Hadamard order must be a power of two, got {n}")
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def rotate(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` (float32, last axis a multiple of ``n``) times the orthonormal ``H_n`` in n-value blocks along the last axis.

    The spec's in-place butterfly in float32 (:func:`tbq.rotation.fwht`'s
    operations, one multiplication by ``float32(1/sqrt(n))`` at the end, in a
    numba kernel), O(n log n) per block.
    ``H_n`` is symmetric and orthonormal, so ``rotate(rotate(x, n), n)`` is ``x``
    up to float32 rounding.
    """
    return transform(x, None, n, False)


def transform(x: torch.Tensor, perm: Any, n: Any, inverse: bool, q8_0: bool = False) -> torch.Tensor:
    """One pass over ``x`` (float32, ..., head_dim): each head's channel order, the rotation ``H_n``, q8_0.

    ``inverse=False``: ``y[..., j] = x[..., perm[j]]``, then the rotation (the
    stored domain), then (``q8_0``) ggml's SIMD q8_0 round trip
    (:func:`q8_0_simd`); ``inverse=True``: the rotation, then back to the
    model's order. The same float32 operations as the separate steps, so the
    same bits (tests/test_hf_cache.py).
    """
    shape = x.shape
    d = shape[-1]
    a = np.ascontiguousarray(x.detach().to(device="cpu", dtype=torch.float32).numpy()).reshape(-1, d)
    out = np.empty_like(a)
    if perm is None:
        p = np.arange(d, dtype=np.int64)
    else:
        p = (np.argsort(perm) if inverse else np.asarray(perm)).astype(np.int64)
    nn = 0 if n is None else int(n)
    scale = hadamard_scale(nn, np.float32) if nn else np.float32(1.0)
    table = f16_table()
    rows = a.shape[0]
    parts = min(default_threads(), max(1, a.size // _PARALLEL_VALUES))
    bounds = np.linspace(0, rows, parts + 1).astype(int)

    def run(ids: Any) -> None:  # rows are independent: any split gives the same bits
        for i in ids:
            lo, hi = bounds[i], bounds[i + 1]
            _transform_rows(a[lo:hi], out[lo:hi], p, nn, scale, inverse, q8_0, table)

    run_groups(parts, parts, run)
    return torch.from_numpy(out.reshape(shape))


#: Values per thread below which :func:`transform` stays on the calling thread.
_PARALLEL_VALUES = 1 << 16


@jit
def _butterfly(w: Any, r: Any, start: Any, n: Any, scale: Any) -> None:
    """Values ``start .. start+n`` of row ``r``: the spec's in-place butterfly, then ``* scale``."""
    h = 1
    while h < n:
        for s0 in range(start, start + n, 2 * h):
            for j in range(s0, s0 + h):
                a = w[r, j]
                b = w[r, j + h]
                w[r, j] = a + b
                w[r, j + h] = a - b
        h *= 2
    for j in range(start, start + n):
        w[r, j] = w[r, j] * scale


@jit
def _transform_rows(x: Any, out: Any, perm: Any, n: Any, scale: Any, inverse: Any, q8_0: Any, f16: Any) -> None:
    rows, d = x.shape
    c127 = np.float32(127.0)
    zero = np.float32(0.0)
    tmp = np.empty(d, np.float32)
    for r in range(rows):
        if inverse:
            for j in range(d):
                tmp[j] = x[r, j]
            if n:
                for start in range(0, d, n):
                    _butterfly_1d(tmp, start, n, scale)
            for j in range(d):
                out[r, j] = tmp[perm[j]]
        else:
            for j in range(d):
                out[r, j] = x[r, perm[j]]
            if n:
                for start in range(0, d, n):
                    _butterfly(out, r, start, n, scale)
        if q8_0:
            for b0 in range(0, d, 32):
                amax = zero
                for j in range(b0, b0 + 32):
                    v = abs(out[r, j])
                    if v > amax:
                        amax = v
                dq = f16[np.int64(f32_to_f16_bits(amax / c127))]
                inv = c127 / amax if amax > zero else zero
                for j in range(b0, b0 + 32):
                    out[r, j] = np.float32(np.rint(out[r, j] * inv)) * dq


@jit
def _butterfly_1d(w: Any, start: Any, n: Any, scale: Any) -> None:
    h = 1
    while h < n:
        for s0 in range(start, start + n, 2 * h):
            for j in range(s0, s0 + h):
                a = w[j]
                b = w[j + h]
                w[j] = a + b
                w[j + h] = a - b
        h *= 2
    for j in range(start, start + n):
        w[j] = w[j] * scale


def gguf_permutation(head_dim: int) -> np.ndarray:
    """Indices ``p`` with ``gguf_row = hf_row[p]`` per head: ``p[2i] = i``, ``p[2i+1] = i + head_dim/2``.

    >>> gguf_permutation(8)
    array([0, 4, 1, 5, 2, 6, 3, 7])
    """
    if head_dim % 2:
        raise TbqValueError(f"head_dim {head_dim} is odd: no RoPE pair permutation")
    half = head_dim // 2
    p = np.empty(head_dim, np.int64)
    p[0::2] = np.arange(half)
    p[1::2] = np.arange(half) + half
    return p


def _q8_0_simd_parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's CPU-backend q8_0 quantizer (``quantize_row_q8_0``, AVX): per 32 values, the fp16 scale and the codes.

    ``amax = max |x|``, ``d = fp16(amax / 127)``, codes ``rint(x * (127 / amax))``
    rounded half to even (``_mm256_round_ps``), 0 when ``amax`` is 0.
    ``quantize_row_q8_0_ref`` (``tbq.quantize(x, "q8_0")``) differs in two
    places: it multiplies by ``1 / d`` (``1/(amax/127)``, which can be one ulp
    away from ``127/amax``) and rounds half away from zero.
    """
    shape = x.shape
    b = x.reshape(*shape[:-1], shape[-1] // 32, 32).to(torch.float32)
    amax = b.abs().amax(dim=-1, keepdim=True)
    d = (amax / 127.0).to(torch.float16)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    inv = torch.where(amax > 0, torch.tensor(127.0, dtype=torch.float32) / safe, torch.zeros_like(amax))
    codes = torch.round(b * inv)  # torch.round: half to even
    return d, codes


def q8_0_simd(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32, last axis a multiple of 32) through ggml's SIMD q8_0 quantizer, decoded: ``code * d``.

    What a q8_0 x q8_0 dot product sees of Q (exact in float32); see :func:`q8_0_simd_encode`.

    >>> q8_0_simd(torch.full((32,), 0.5)).unique()
    tensor([0.5000])
    """
    d, codes = _q8_0_simd_parts(x)
    return (codes * d.to(torch.float32)).reshape(x.shape)


def q8_0_simd_encode(rows: np.ndarray) -> np.ndarray:
    """q8_0 bytes of float32 ``rows`` (..., n x 32) as ggml's CPU backend writes a q8_0 KV cache.

    The layout is Q8_0's (fp16 scale, 32 int8 codes per block); the rule is
    :func:`_q8_0_simd_parts`'s. ``tbq.dequantize(..., "q8_0")`` reads them.

    >>> q8_0_simd_encode(np.full((32,), 0.5, np.float32))[:3]
    array([  8,  28, 127], dtype=uint8)
    """
    d, codes = _q8_0_simd_parts(torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)))
    lead = rows.shape[:-1]
    nb = rows.shape[-1] // 32
    out = np.empty(lead + (nb, 34), np.uint8)
    out[..., :2] = d.numpy().view(np.uint8).reshape(lead + (nb, 2))
    out[..., 2:] = codes.to(torch.int8).numpy().view(np.uint8).reshape(lead + (nb, 32))
    return out.reshape(lead + (nb * 34,))


# ---------------------------------------------------------------------------
# rules
# ---------------------------------------------------------------------------


def check_block_rule(name: str, block_size: int, head_dim: int, kv_heads: int, role: str) -> None:
    """Refuse a cache type llama.cpp refuses: a block must divide head_dim (the fork's TBQ types: the row).

    >>> check_block_rule("tbq4_0", 128, 64, 2, "K")   # one TBQ block holds two heads: allowed
    >>> check_block_rule("q8_0", 32, 80, 2, "K")
    Traceback (most recent call last):
    ...
    tbq.errors.TbqValueError: K cache type q8_0: its 32-value block does not divide head_dim 80 (llama.cpp requires it)
    """
    row = head_dim * kv_heads
    if FORMATS[name].row_tiled:  # the fork's TBQ types: llama-context.cpp checks n_embd_k_gqa for them
        if row % block_size:
            raise TbqValueError(
                f"{role} cache type {name}: its {block_size}-value block does not divide the row of "
                f"{kv_heads} x {head_dim} = {row} values (llama.cpp requires it)"
            )
    elif head_dim % block_size:
        raise TbqValueError(
            f"{role} cache type {name}: its {block_size}-value block does not divide head_dim {head_dim} (llama.cpp requires it)"
        )


def is_llama_cpp_type(name: str) -> bool:
    """True for the types a llama.cpp engine stores (ggml's and the fork's); vLLM's FP8 is not one.

    >>> is_llama_cpp_type("q4_0"), is_llama_cpp_type("fp8_e4m3")
    (True, False)
    """
    return name in _GGML_TYPES


def _k_rotation_order(head_dim: int) -> int:
    """The largest power of two >= 64 dividing head_dim (head_dim a multiple of 64)."""
    n = 64
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


# ---------------------------------------------------------------------------
# the engine of one layer
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """How one of K or V is stored: the codec (None for f32), and the domain it lives in."""

    name: str
    codec: Codec | None
    rotation: int | None = None  # the Walsh-Hadamard order, or None
    permutation: np.ndarray | None = field(default=None, repr=False)
    fork_pack3: bool = False
    simd_q8_0: bool = False

    def row_bytes(self, row: int) -> int:
        """Bytes of one stored row of ``row`` values."""
        return row * 4 if self.codec is None else row // self.codec.block_size * self.codec.type_size

    # -- model domain <-> stored domain, on (batch, tokens, heads, head_dim) float32 tensors
    def to_stored(self, x: torch.Tensor, q8_0: bool = False) -> torch.Tensor:
        if self.permutation is None and self.rotation is None and not q8_0:
            return x
        return transform(x, self.permutation, self.rotation, False, q8_0)

    def to_model(self, x: torch.Tensor) -> torch.Tensor:
        if self.permutation is None and self.rotation is None:
            return x
        return transform(x, self.permutation, self.rotation, True)

    # -- rows <-> bytes, on numpy (..., row) arrays
    def encode(self, rows: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if self.codec is None:
            return rows.view(np.uint8).copy()
        if self.simd_q8_0:
            return q8_0_simd_encode(rows)
        data = self.codec.encode(rows)
        if self.fork_pack3:
            data = _fork_tbq3(data)
        return data

    def decode(self, data: np.ndarray, row: int) -> np.ndarray:
        if self.codec is None:
            return data.view(np.float32).reshape(data.shape[:-1] + (row,))
        return self.codec.decode(data)


def _fork_tbq3(data: np.ndarray) -> np.ndarray:
    """TBQ3_0 bytes re-packed by the fork's buggy 3-bit packer: same norm, codes' bytes 1-2 of each lane lost."""
    lead = data.shape[:-1]
    blocks = data.reshape(-1, 50)
    idx = packing.unpack3(blocks[:, 2:])
    out = blocks.copy()
    out[:, 2:] = packing.pack3_fork_bug(idx)
    return out.reshape(lead + (data.shape[-1],))


@dataclass(frozen=True)
class Engine:
    """One layer's K and V sides and the Q transform the attention applies."""

    name: str
    k: Side
    v: Side
    head_dim: int
    kv_heads: int
    q_to_q8_0: bool = False
    zero_scores: bool = False

    @property
    def q_transformed(self) -> bool:
        """True when the K.Q products need Q in K's stored domain (rotated, or converted, or replaced).

        A permutation alone reorders both operands of every dot product, so
        without it the attention reads K back in the model's own order.
        """
        return self.k.rotation is not None or self.q_to_q8_0 or self.zero_scores

    def query(self, q: torch.Tensor) -> torch.Tensor:
        """Q (batch, heads, tokens, head_dim) as the K.Q products of this engine see it."""
        if self.zero_scores:
            return torch.zeros_like(q)
        return self.k.to_stored(q, q8_0=self.q_to_q8_0)  # one pass: order, rotation, q8_0

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """The attention output (..., head_dim) back from V's stored domain."""
        return out if self.v.rotation is None else transform(out, None, self.v.rotation, True)


def _codec(spec: Any, engine: str) -> tuple[str, Codec | None]:
    """A cache type as (name, codec): a format name, ``"f32"``, a :class:`tbq.Codec`, or ``(name, options)``."""
    if isinstance(spec, Codec):
        return spec.name, spec
    options: dict[str, Any] = {}
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], dict):
        spec, options = spec
    if not isinstance(spec, str):
        raise ConfigError(f"a cache type is a format name, 'f32', a tbq.Codec or (name, options), got {spec!r}")
    if spec == F32:
        if options:
            raise ConfigError("the f32 cache type takes no options")
        return F32, None
    if spec not in FORMATS:
        raise ConfigError(f"unknown cache type {spec!r}; known: f32, {', '.join(cache_formats())}")
    if not FORMATS[spec].cache_type:
        raise ConfigError(
            f"{spec} is a dot-product operand format (activations), not a KV cache type; known: f32, "
            f"{', '.join(cache_formats())}"
        )
    if engine != "plain" and not options and "codebook" in get_format(spec).options:
        # llama.cpp stores the fork's types with the fork's own tables
        options = {"codebook": "turboq-mtp"}
    return spec, get_codec(spec, **options)


def make_engine(
    engine: str, k: Any, v: Any, *, head_dim: int, kv_heads: int, permute: bool, rotate_attention: bool = True
) -> Engine:
    """The :class:`Engine` of one layer with K cache type ``k`` and V cache type ``v``.

    ``permute``: the model's K rows are stored in llama.cpp's GGUF channel
    order (see :data:`PERMUTED_MODEL_TYPES`). ``rotate_attention=False`` is
    llama.cpp's ``LLAMA_ATTN_ROT_DISABLE=1``.
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    k_name, k_codec = _codec(k, engine)
    v_name, v_codec = _codec(v, engine)
    for role, name, codec in (("K", k_name, k_codec), ("V", v_name, v_codec)):
        if codec is not None:
            check_block_rule(name, codec.block_size, head_dim, kv_heads, role)
    if engine == "plain":
        return Engine(engine, Side(k_name, k_codec), Side(v_name, v_codec), head_dim, kv_heads)
    for role, name in (("K", k_name), ("V", v_name)):
        if not is_llama_cpp_type(name):
            raise ConfigError(
                f"{role} cache type {name} is not a llama.cpp cache type; use engine='plain' ({name}@plain), "
                "which stores the rows as they are"
            )
    fork = engine == "llama.cpp-fork"
    k_quantized, v_quantized = k_name not in _UNQUANTIZED, v_name not in _UNQUANTIZED
    k_rot = _k_rotation_order(head_dim) if rotate_attention and k_quantized and head_dim % 64 == 0 else None
    v_rot = 64 if rotate_attention and v_quantized and head_dim % 64 == 0 else None
    perm = gguf_permutation(head_dim) if permute else None
    k_side = Side(k_name, k_codec, k_rot, perm, fork_pack3=fork and k_name == "tbq3_0", simd_q8_0=k_name == _SIMD_Q8_0)
    v_side = Side(v_name, v_codec, v_rot, None, fork_pack3=fork and v_name == "tbq3_0", simd_q8_0=v_name == _SIMD_Q8_0)
    # The fork's q8_K defect, as measured: at head_dim 128 every score is 0; at 256 none is; at 64, where one TBQ
    # block holds two heads, the scores are right (llama-perplexity agrees with the correct engine there).
    whole_blocks = k_codec is not None and head_dim % k_codec.block_size == 0
    return Engine(
        engine,
        k_side,
        v_side,
        head_dim,
        kv_heads,
        q_to_q8_0=k_name in _Q8_VEC_DOT,
        zero_scores=fork and k_name in _Q8_K_VEC_DOT and head_dim % 256 != 0 and whole_blocks,
    )
