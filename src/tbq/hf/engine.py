"""What an inference engine does to K and V around its cache: llama.cpp's ``-ctk/-ctv`` semantics.

A cache type is only half of what a model sees: the engine decides which
rows are quantized, in which channel order, after which rotation, and what
happens to Q before the K.Q products. :class:`Engine` holds those decisions
for one layer and applies them to torch tensors; :mod:`tbq.hf.cache` stores
the rows it produces with :func:`tbq.quantize`, and :mod:`tbq.hf.attention`
computes attention in the domain the rows were stored in; the float32
transforms themselves (channel order, rotation, Q's q8_0) are
:mod:`tbq.hf.transforms`' (re-exported here).

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

``"llama.cpp-turbo"``
    The community TurboQuant fork (TheTom/llama-cpp-turboquant at 69d8e4be) with
    ``-ctk/-ctv turbo2|turbo3|turbo4``: a turbo K or V head whose size is not a
    multiple of 128 is zero-padded to the next one; with a turbo K, Q is padded
    the same way and rotated by the fork's ``GGML_OP_TURBO_WHT`` (the codec's
    own 128-point rotation ``R``, :meth:`tbq.formats.capabilities.DomainTraits.to_decode_domain`) and the
    K.Q products take it in float32 (``vec_dot_type`` F32); with a turbo V, the
    attention output is rotated back (``R^-1``) and cropped to head_dim.
    Upstream's Hadamard attention rotation is off (the fork's default), so a
    q8_0/q4_0 cache is stored unrotated, Q converted to q8_0 as upstream does.
    The fork's silent type changes are applied and reported
    (:func:`turbo_layer_types`): ``TURBO_AUTO_ASYMMETRIC`` and
    ``TURBO_LAYER_ADAPTIVE`` mode 7.

``"vllm"``, ``"vllm-prefill"``
    vLLM's ``--kv-cache-dtype turboquant_*`` presets: one slot per (token, KV
    head), keys in the preset's key format and values in its value format,
    the first and last ``min(2, L // 2)`` layers of a dense model unquantized
    (:func:`vllm_skipped_layers`), K and V read back as vLLM's full-dequant
    path gives them (fp16 keys in the model domain, fp16 values). ``"vllm"``:
    every position reads the stored cache (vLLM's decode steps);
    ``"vllm-prefill"``: a cache's first forward pass reads its own raw K/V
    (vLLM's first prefill, flash attention on the batch) and later ones the
    stored cache.

``"plain"``
    The rows as the model computes them: no permutation, no rotation, Q in f32
    (a format that decodes to its own rotated domain is rotated back).

Why one module of this length: it is the one table of what each engine (llama.cpp, its two
forks, vLLM, plain) does with each cache type, which a reader checks against the engines' sources
in one place; the arithmetic it applies is :mod:`tbq.hf.transforms`'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .. import packing
from ..codecs import Codec, get_codec
from ..errors import ConfigError, TbqValueError
from ..formats import FORMATS, cache_formats, format_class, get_format, takes_option
from ..vllm_slots import PRESET_NAMES, preset
from . import ENGINES
from .transforms import gguf_order, gguf_permutation, hadamard, q8_0_simd, q8_0_simd_encode, rotate, transform

__all__ = [
    "ENGINES",
    "F32",
    "Engine",
    "check_block_rule",
    "gguf_permutation",
    "is_llama_cpp_type",
    "hadamard",
    "is_turbo_type",
    "is_vllm_preset",
    "make_engine",
    "turbo_layer_types",
    "vllm_skipped_layers",
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

#: ggml's q8 block types as a ``vec_dot_type`` (q8_1's codes and scale are q8_0's): a K type whose format declares
#: one of them (:attr:`tbq.formats.capabilities.CheckTraits.vec_dot_type`) takes Q converted to q8_0 blocks before the K.Q products.
_Q8_OPERANDS = ("q8_0", "q8_1")

#: The ``vec_dot_type`` of the fork's TBQ types (q8_K, 256-value blocks): no block for a shorter head.
_Q8_K = "q8_k"

#: The community fork's turbo cache types (its graph rotates Q when K has one of them, the output when V has).
_TURBO_TYPES = ("turbo2", "turbo3", "turbo4")

#: The type the fork's silent changes store instead (TURBO_AUTO_ASYMMETRIC's K, TURBO_LAYER_ADAPTIVE's V).
_TURBO_FALLBACK = "q8_0"

#: TURBO_LAYER_ADAPTIVE mode 7 is switched on by itself when V is this type (and the model has >= 8 layers).
_TURBO_ADAPTIVE_V = "turbo2"

#: The type whose CPU-backend quantizer (``from_float``) is not its ``_ref``: written with :func:`q8_0_simd_encode`.
_SIMD_Q8_0 = "q8_0"


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
    """How one of K or V is stored: the codec (None for f32), and the domain it lives in.

    Three domains: the model's (``head_dim`` values per head, its channel
    order); the *stored* one, what the codec encodes (llama.cpp's channel
    order, its attention rotation, heads zero-padded to ``pad_to``); the
    *read* one, what the codec decodes to and the attention reads: the stored
    one, or for a format that decodes to its own rotated domain
    (``rotated_read``: turbo2/3/4) that rotation of it.
    """

    name: str
    codec: Codec | None
    rotation: int | None = None  # the Walsh-Hadamard order, or None
    permutation: np.ndarray | None = field(default=None, repr=False)
    fork_pack3: bool = False
    simd_q8_0: bool = False
    head_dim: int = 0  # the model's head_dim (0: not known, no padding)
    pad_to: int | None = None  # heads zero-padded to this many values (the fork's turbo types), or None
    rotated_read: bool = False  # the codec decodes to its format's rotated domain (its domain capability)
    decode_back: bool = False  # ("plain") rows decoded to a rotated domain are rotated back at once (per row)

    @property
    def stored_head_dim(self) -> int:
        """Values stored per head: ``pad_to`` or the model's head_dim."""
        return self.pad_to or self.head_dim

    def row_bytes(self, row: int) -> int:
        """Bytes of one stored row of ``row`` values."""
        return row * 4 if self.codec is None else row // self.codec.block_size * self.codec.type_size

    # -- model domain <-> stored domain, on (batch, tokens, heads, head_dim) float32 tensors
    def to_stored(self, x: torch.Tensor, q8_0: bool = False) -> torch.Tensor:
        """Model domain -> what the codec encodes (channel order, attention rotation, zero padding; Q's q8_0)."""
        if self.permutation is not None or self.rotation is not None or q8_0:
            x = transform(x, self.permutation, self.rotation, False, q8_0)
        if self.pad_to and self.pad_to != x.shape[-1]:
            x = torch.nn.functional.pad(x, (0, self.pad_to - x.shape[-1]))
        return x

    def to_read(self, x: torch.Tensor, q8_0: bool = False) -> torch.Tensor:
        """Model domain -> the domain the codec decodes to (what the attention reads): Q's transform."""
        y = self.to_stored(x, q8_0)
        if not self.rotated_read:
            return y
        assert self.codec is not None  # rotated_read is set for a codec's format only
        return _per_row(y, self.codec.format.domain.to_decode_domain)

    def to_model(self, x: torch.Tensor) -> torch.Tensor:
        """The read domain -> the model's (``R^-1``, the padding cropped, the model's channel order)."""
        if self.rotated_read:
            assert self.codec is not None
            x = _per_row(x, self.codec.format.domain.from_decode_domain)
        if self.pad_to and x.shape[-1] != self.head_dim:
            x = x[..., : self.head_dim].contiguous()
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
        out = self.codec.decode(data)
        if self.decode_back:
            out = np.ascontiguousarray(self.codec.format.domain.from_decode_domain(out), dtype=np.float32)
        return out


def _per_row(x: torch.Tensor, f: Any) -> torch.Tensor:
    """``f`` (a format's per-block map, NumPy float32) over the last axis of ``x`` (a multiple of the block:
    the padded heads of the ``"llama.cpp-turbo"`` engine, so a block never spans two heads)."""
    a = np.ascontiguousarray(x.detach().to(device="cpu", dtype=torch.float32).numpy())
    return torch.from_numpy(np.ascontiguousarray(f(a), dtype=np.float32))


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
    #: the first forward pass of a cache reads its own raw K/V (vLLM's first prefill), later ones the stored cache
    raw_first_prefill: bool = False

    @property
    def q_transformed(self) -> bool:
        """True when the K.Q products need Q in K's read domain (rotated, padded, converted, or replaced).

        A permutation alone reorders both operands of every dot product, so
        without it the attention reads K back in the model's own order.
        """
        k = self.k
        return k.rotation is not None or k.rotated_read or bool(k.pad_to) or self.q_to_q8_0 or self.zero_scores

    @property
    def v_transformed(self) -> bool:
        """True when the attention reads V in its stored domain and its output needs :meth:`output`."""
        return self.v.rotation is not None or self.v.rotated_read or bool(self.v.pad_to)

    def query(self, q: torch.Tensor) -> torch.Tensor:
        """Q (batch, heads, tokens, head_dim) as the K.Q products of this engine see it."""
        if self.zero_scores:
            return torch.zeros_like(q)
        return self.k.to_read(q, q8_0=self.q_to_q8_0)  # one pass: order, rotation, q8_0; padding, R

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """The attention output (..., V's read head_dim) back in the model's domain (``H_64`` or ``R^-1``, cropped)."""
        if self.v.rotated_read or self.v.pad_to:
            return self.v.to_model(out)
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


def type_name(spec: Any) -> str:
    """The format name of a cache type spec (a name, ``(name, options)`` or a :class:`tbq.Codec`)."""
    if isinstance(spec, Codec):
        return spec.name
    if isinstance(spec, tuple) and len(spec) == 2:
        return str(spec[0])
    return str(spec)


def is_turbo_type(spec: Any) -> bool:
    """True for the community fork's turbo2/turbo3/turbo4 (the ``"llama.cpp-turbo"`` engine's own types).

    >>> is_turbo_type("turbo3"), is_turbo_type("q8_0")
    (True, False)
    """
    return type_name(spec) in _TURBO_TYPES


def is_vllm_preset(spec: Any) -> bool:
    """True for vLLM's ``--kv-cache-dtype turboquant_*`` preset names (:data:`tbq.vllm_slots.PRESET_NAMES`)."""
    return isinstance(spec, str) and spec in PRESET_NAMES


def _q_as_q8_0(name: str) -> bool:
    """Whether llama.cpp converts Q to q8_0 for the K.Q products with K type ``name`` (its format's vec_dot_type)."""
    if name == F32 or name not in FORMATS:
        return False
    return format_class(name).checker.vec_dot_type in _Q8_OPERANDS


def turbo_layer_types(
    k: Any,
    v: Any,
    *,
    layer: int,
    n_layers: int,
    n_head: int,
    n_head_kv: int,
    auto_asymmetric: bool = True,
    layer_adaptive: bool = True,
) -> tuple[Any, Any, list[str]]:
    """The types the fork's llama-kv-cache.cpp (69d8e4be) stores in ``layer`` for ``-ctk k -ctv v``, and why.

    ``TURBO_AUTO_ASYMMETRIC`` (on unless ``=0``: ``auto_asymmetric=False``):
    when K is a turbo type, V the same type and ``n_head // n_head_kv >= 6``
    (layer 0's heads), K becomes q8_0. ``TURBO_LAYER_ADAPTIVE`` mode 7 (on by
    itself when V is turbo2 and the model has >= 8 layers, unless ``=0``:
    ``layer_adaptive=False``): V of the first 2 and last 2 layers becomes q8_0,
    the others' turbo2. Returns ``(k, v, notes)``, a note per change.

    >>> turbo_layer_types("turbo3", "turbo3", layer=0, n_layers=4, n_head=28, n_head_kv=4)[::2]
    ('q8_0', ['K turbo3 -> q8_0 (TURBO_AUTO_ASYMMETRIC, n_head/n_head_kv = 28/4)'])
    """
    kn, vn = type_name(k), type_name(v)
    notes = []
    ratio = n_head // n_head_kv if n_head_kv > 0 else 1
    if auto_asymmetric and kn in _TURBO_TYPES and kn == vn and ratio >= 6:
        notes.append(f"K {kn} -> {_TURBO_FALLBACK} (TURBO_AUTO_ASYMMETRIC, n_head/n_head_kv = {n_head}/{n_head_kv})")
        k = _TURBO_FALLBACK
    if layer_adaptive and vn == _TURBO_ADAPTIVE_V and n_layers >= 8 and (layer < 2 or layer >= n_layers - 2):
        notes.append(f"V {vn} -> {_TURBO_FALLBACK} (TURBO_LAYER_ADAPTIVE mode 7, the first and last 2 layers)")
        v = _TURBO_FALLBACK
    return k, v, notes


def vllm_skipped_layers(n_layers: int, hybrid: bool) -> list[int]:
    """The layers vLLM keeps unquantized (``kv_cache_dtype_skip_layers``): the first and last ``min(2, L // 2)``
    of a dense model, none of a hybrid one (SPEC-vllm-turboquant section 8).

    >>> vllm_skipped_layers(6, False), vllm_skipped_layers(3, False), vllm_skipped_layers(48, True)
    ([0, 1, 4, 5], [0, 2], [])
    """
    if hybrid:
        return []
    n = min(2, n_layers // 2)
    return sorted(set(range(n)) | set(range(n_layers - n, n_layers)))


def _vllm_side(spec: Any, role: str, head_dim: int) -> Side:
    """One side under the vLLM engines: a preset's key (K) or value (V) format per (token, KV head), or f32."""
    name = type_name(spec)
    if name == F32:
        return Side(F32, None, head_dim=head_dim)
    if not is_vllm_preset(name) or not isinstance(spec, str):
        raise ConfigError(
            f"{role} cache type {name} is not a vLLM TurboQuant preset; the vllm engines take "
            f"{', '.join(PRESET_NAMES)} (or f32 for an unquantized side)"
        )
    p = preset(name)
    fmt = p.key if role == "K" else p.value
    opts: dict[str, Any] = dict(p.key_options) if role == "K" else {}
    if takes_option(fmt, "head_dim"):
        opts["head_dim"] = head_dim
    try:
        codec = get_codec(fmt, on_overflow=p.key_overflow if role == "K" else p.value_overflow, **opts)
    except TbqValueError as exc:
        raise ConfigError(f"{role} cache type {name} at head_dim {head_dim}: {exc}") from None
    if head_dim % codec.block_size:
        raise ConfigError(
            f"{role} cache type {name}: its {codec.block_size}-value slot part does not fit head_dim {head_dim}"
        )
    return Side(name, codec, head_dim=head_dim)


def make_engine(
    engine: str, k: Any, v: Any, *, head_dim: int, kv_heads: int, permute: bool, rotate_attention: bool = True
) -> Engine:
    """The :class:`Engine` of one layer with K cache type ``k`` and V cache type ``v``.

    ``permute``: the model's K rows are stored in llama.cpp's GGUF channel
    order (see :data:`PERMUTED_MODEL_TYPES`). ``rotate_attention=False`` is
    llama.cpp's ``LLAMA_ATTN_ROT_DISABLE=1`` (the ``"llama.cpp-turbo"``
    engine never rotates: the fork's default). The fork's per-layer type
    changes are :func:`turbo_layer_types`' (the cache applies them first).
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if engine in _VLLM_ENGINES:
        names = {type_name(t) for t in (k, v) if type_name(t) != F32}
        if len(names) > 1:
            raise ConfigError(
                f"{type_name(k)}:{type_name(v)}: a vLLM preset names both K and V; write one preset alone "
                "(e.g. turboquant_4bit_nc@vllm)"
            )
        ks, vs = _vllm_side(k, "K", head_dim), _vllm_side(v, "V", head_dim)
        return Engine(engine, ks, vs, head_dim, kv_heads, raw_first_prefill=engine == "vllm-prefill")
    k_name, k_codec = _codec(k, engine)
    v_name, v_codec = _codec(v, engine)
    turbo = engine == "llama.cpp-turbo"
    for role, name in (("K", k_name), ("V", v_name)):
        if name in _TURBO_TYPES and engine not in ("plain", "llama.cpp-turbo"):
            raise ConfigError(
                f"{role} cache type {name} is the community TurboQuant fork's: use engine='llama.cpp-turbo' "
                f"({name}@turbo), the llama.cpp that has it"
            )
    pads: dict[str, int | None] = {}
    for role, name, codec in (("K", k_name, k_codec), ("V", v_name, v_codec)):
        pads[role] = None
        if codec is None:
            continue
        if turbo and name in _TURBO_TYPES:
            pads[role] = FORMATS[name].stored_head_dim(head_dim)  # llama-kv-cache.cpp: zero-padded to 128k
        else:
            check_block_rule(name, codec.block_size, head_dim, kv_heads, role)
    if engine == "plain":
        return Engine(
            engine, _plain_side(k_name, k_codec, head_dim), _plain_side(v_name, v_codec, head_dim), head_dim, kv_heads
        )
    for role, name in (("K", k_name), ("V", v_name)):
        if not is_llama_cpp_type(name) and not (turbo and name in _TURBO_TYPES):
            raise ConfigError(
                f"{role} cache type {name} is not a llama.cpp cache type; use engine='plain' ({name}@plain), "
                "which stores the rows as they are"
            )
    fork = engine == "llama.cpp-fork"
    rotate_attention = rotate_attention and not turbo  # the turbo fork: upstream's rotation is off by default
    k_quantized, v_quantized = k_name not in _UNQUANTIZED, v_name not in _UNQUANTIZED
    k_rot = _k_rotation_order(head_dim) if rotate_attention and k_quantized and head_dim % 64 == 0 else None
    v_rot = 64 if rotate_attention and v_quantized and head_dim % 64 == 0 else None
    perm = gguf_order(head_dim) if permute else None  # one shared array: transform knows it at once
    k_side = _llama_side(k_name, k_codec, k_rot, perm, fork, head_dim, pads["K"])
    v_side = _llama_side(v_name, v_codec, v_rot, None, fork, head_dim, pads["V"])
    # The fork's q8_K defect, as measured: at head_dim 128 every score is 0; at 256 none is; at 64, where one TBQ
    # block holds two heads, the scores are right (llama-perplexity agrees with the correct engine there).
    whole_blocks = k_codec is not None and head_dim % k_codec.block_size == 0
    q8_k = k_name in FORMATS and format_class(k_name).checker.vec_dot_type == _Q8_K
    return Engine(
        engine,
        k_side,
        v_side,
        head_dim,
        kv_heads,
        q_to_q8_0=_q_as_q8_0(k_name),  # a turbo K's vec_dot_type is F32 (its format declares none): Q stays f32
        zero_scores=fork and q8_k and head_dim % 256 != 0 and whole_blocks,
    )


def _llama_side(
    name: str, codec: Codec | None, rot: int | None, perm: np.ndarray | None, fork: bool, head_dim: int, pad: int | None
) -> Side:
    """A side of a llama.cpp engine: its rotation and channel order, the fork's 3-bit packer, q8_0's SIMD writer,
    a turbo head's padding (read in its format's rotated domain)."""
    return Side(
        name,
        codec,
        rot,
        perm,
        fork_pack3=fork and name == "tbq3_0",
        simd_q8_0=name == _SIMD_Q8_0,
        head_dim=head_dim,
        pad_to=pad,
        rotated_read=pad is not None,
    )


def _plain_side(name: str, codec: Codec | None, head_dim: int) -> Side:
    """A side of the ``"plain"`` engine: the rows as they are; a format decoding to its rotated domain read back."""
    rotated = codec is not None and codec.format.domain.decode_domain == "rotated"
    return Side(name, codec, head_dim=head_dim, decode_back=rotated)


#: The engines that store vLLM's presets.
_VLLM_ENGINES = ("vllm", "vllm-prefill")


def is_vllm_engine(engine: str) -> bool:
    """True for the engines that store vLLM's presets (``"vllm"``, ``"vllm-prefill"``)."""
    return engine in _VLLM_ENGINES


def unquantized_type(engine: str) -> str:
    """The unquantized cache type of ``engine``: llama.cpp's default f16; the model's own K/V (f32) under vLLM,
    whose unquantized layers keep the model dtype."""
    return F32 if engine in _VLLM_ENGINES else "f16"
