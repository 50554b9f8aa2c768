"""A transformers KV cache whose attention layers store K and V as tbq-encoded bytes.

>>> from transformers import LlamaConfig
>>> config = LlamaConfig(hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
...                      head_dim=128, num_hidden_layers=2, intermediate_size=64, vocab_size=32)
>>> cache = TbqCache(config, k="q8_0", v="q4_0", layers={1: ("f16", "f16")})
>>> [(layer.k_type, layer.v_type) for layer in cache.layers]
[('q8_0', 'q4_0'), ('f16', 'f16')]
>>> cache.bytes_per_token()       # (136 + 72) + (256 + 256): q8_0 and q4_0 rows of 128, then f16
720

Each attention layer keeps, per role, the bytes of every token's row
(``n_kv_heads x head_dim`` values, blocks along the row) as
:func:`tbq.quantize` writes them, in the domain the engine chose
(:mod:`tbq.hf.engine`: llama.cpp's channel order and attention rotation by
default). ``update`` writes the new tokens *before* returning the cache's
K/V, so the tokens of a prefill batch already attend to quantized keys and
values, as in llama.cpp.

Layer kinds follow the model's ``config.layer_types`` (transformers'
``get_layer_types_and_kwargs``): a full-attention layer is a
:class:`TbqLayer`; a sliding-window (or chunked) layer is a :class:`TbqLayer`
that keeps only the newest ``window - 1`` tokens between steps, as
transformers' ``DynamicSlidingWindowLayer`` does (llama.cpp's SWA cache keeps
the window too, in ``min(n_ctx, n_swa + n_ubatch)`` cells rounded up to 256);
linear-attention and convolution layers (qwen3_next, qwen3_5) keep
transformers' own cache layers, untouched. Layer kinds tbq cannot store
(a layer with both linear and attention state, KV shared between layers,
indexed sparse attention) are refused, naming the layer.

``residual=N`` keeps the newest ``N`` tokens (and the whole current batch) in
float32 and quantizes each older token once, as it leaves that window: the
idea of transformers' ``QuantizedCache`` (a prefill then sees no
quantization), not its bytes (its ``QuantizedLayer`` re-quantizes the whole
cache, per channel, each time the window fills).

The K/V returned are in the model's own domain, so any attention
implementation works with the cache; with :mod:`tbq.hf.attention`'s tbq
attention (set by :func:`tbq.hf.prepare`) each layer also posts its
stored-domain K/V (:class:`~tbq.hf.attention.LayerRead`), which that
attention reads with the engine's Q transform (rotation, q8_0 conversion):
what makes the products llama.cpp's.

Why one module of this length: :class:`TbqCache` and :class:`TbqLayer` are one concept,
transformers' cache and its layers, with the validation of what a user may ask of them; the rows a
layer keeps are :mod:`tbq.hf.store`'s and the engines' transforms :mod:`tbq.hf.transforms`'.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch
from transformers import cache_utils
from transformers.cache_utils import Cache, CacheLayerMixin

from ..errors import ConfigError, TbqValueError, check_int, is_integer
from . import attention
from .attention import LayerRead
from .engine import (
    F32,
    PERMUTED_MODEL_TYPES,
    Engine,
    Side,
    is_vllm_engine,
    make_engine,
    turbo_layer_types,
    vllm_skipped_layers,
)
from .store import Store

__all__ = ["TbqCache", "TbqLayer", "LayerRead", "cache_kwargs", "geometry", "layer_kinds"]

#: Layer types whose K/V a :class:`TbqLayer` stores (the rest keep transformers' own layers or are refused).
FULL, SLIDING = ("full_attention",), ("sliding_attention", "chunked_attention")

#: Layer types without per-token K/V: they keep transformers' own cache layer.
OWN = ("linear_attention", "conv", "dummy")


def _text_config(config: Any) -> Any:
    if hasattr(config, "get_text_config"):
        try:
            return config.get_text_config(decoder=True)
        except TypeError:  # older signatures
            return config.get_text_config()
    return config


def geometry(config: Any) -> tuple[int, int, int]:
    """``(num_hidden_layers, num_key_value_heads, head_dim)`` of a transformers text config."""
    config = _text_config(config)
    try:
        layers = int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        kv = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    except AttributeError as exc:
        raise ConfigError(
            f"the model config has no attention geometry ({exc}); tbq.hf needs a decoder with a KV cache"
        ) from None
    return layers, kv, int(head_dim)


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``model(...)`` / ``model.generate(...)``: the keyword the installed transformers reads.

    transformers renamed ``past_key_values`` to ``cache`` within 5.x; an
    unknown keyword would be swallowed by ``**kwargs`` and the model would run
    without the cache, so the name is read from the model's own signature.
    """
    import inspect

    params = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}


def layer_kinds(config: Any) -> list[tuple[str, dict[str, Any]]]:
    """Each layer's cache type and its arguments, as transformers' ``DynamicCache`` reads them from ``config``.

    ``[("full_attention", {}), ("sliding_attention", {"sliding_window": 512}), ("linear_attention", {...}), ...]``
    """
    text = _text_config(config)
    n = geometry(text)[0]
    get = getattr(cache_utils, "get_layer_types_and_kwargs", None)
    if get is not None:
        types, kwargs = get(text)
        return list(zip(types, kwargs, strict=True))
    types = getattr(text, "layer_types", None)
    window = getattr(text, "sliding_window", None)
    if types is None:
        types = ["sliding_attention" if window is not None else "full_attention"] * n
    return [(t, {"sliding_window": window} if t in SLIDING else {}) for t in types]


class TbqLayer(CacheLayerMixin):
    """One attention layer of a :class:`TbqCache`: K and V rows stored as tbq bytes (see the module docstring).

    ``window``: a sliding-window layer's window (transformers' ``sliding_window``):
    between steps it keeps the newest ``window - 1`` tokens, as transformers'
    ``DynamicSlidingWindowLayer`` does; ``None`` keeps every token.

    The bytes live in host memory (NumPy arrays), so ``offload`` and
    ``prefetch`` have nothing to move; ``keys`` and ``values`` decode the stored
    rows back to the model's domain (B, H_kv, T, D) on each read.
    """

    is_compileable = False
    is_croppable = True

    def __init__(
        self,
        engine: Engine,
        *,
        index: int = 0,
        window: int | None = None,
        sinks: int = 0,
        residual: int = 0,
        sink_engine: Engine | None = None,
        tbq_attention: bool = False,
        model_domain: bool = True,
    ) -> None:
        super().__init__()
        self.engine = engine
        self.index = int(index)
        self.window = None if window is None else int(window)
        self.is_sliding = self.window is not None
        #: post the stored-domain K/V for the tbq attention (only when the engine transforms Q, K or V)
        self.posts = tbq_attention and (engine.q_transformed or engine.v_transformed)
        #: return a side the tbq attention reads in the stored domain as stored, skipping its inverse transform
        self.stored_k = self.posts and not model_domain and engine.q_transformed
        self.stored_v = self.posts and not model_domain and engine.v_transformed
        self.sinks, self.residual = int(sinks), int(residual)
        ks = vs = None
        if sinks:
            assert sink_engine is not None  # TbqCache builds one whenever sinks > 0
            # sink rows live in the layer's domain (same rotation and order), in the sink type
            ks = replace(sink_engine.k, rotation=engine.k.rotation, permutation=engine.k.permutation)
            vs = replace(sink_engine.v, rotation=engine.v.rotation, permutation=None)
        self._k = Store(engine.k, ks, self._row(engine.k))
        self._v = Store(engine.v, vs, self._row(engine.v))
        #: the fork's silent type changes applied to this layer (TbqCache fills it)
        self.type_changes: list[str] = []
        self.cumulative_length = 0
        self.device: Any = torch.device("cpu")
        self.dtype: Any = torch.float32

    # -- facts
    @property
    def k_type(self) -> str:
        return self.engine.k.name

    @property
    def v_type(self) -> str:
        return self.engine.v.name

    @property
    def key_bytes(self) -> np.ndarray | None:
        """The stored K rows of the main type, uint8 (batch, tokens, row bytes), as :func:`tbq.quantize` wrote them."""
        return self._k.main

    @property
    def value_bytes(self) -> np.ndarray | None:
        """The stored V rows of the main type (see :attr:`key_bytes`)."""
        return self._v.main

    @property
    def sink_bytes(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The stored K and V rows of the sink tokens, in the sink type."""
        return self._k.sink, self._v.sink

    @property
    def nbytes(self) -> int:
        """Bytes this layer holds: stored rows plus any float32 residual window."""
        return self._k.nbytes + self._v.nbytes

    @property
    def stored_tokens(self) -> int:
        """Tokens whose rows the layer holds now (a sliding layer: at most ``window - 1`` between steps)."""
        return self._k.length

    def _row(self, side: Side) -> int:
        """Values of one stored row of ``side``: KV heads x the stored head_dim (zero-padded heads included)."""
        return self.engine.kv_heads * (side.stored_head_dim or self.engine.head_dim)

    def bytes_per_token(self) -> int:
        """Bytes of one token's K and V rows in the main types."""
        return self.engine.k.row_bytes(self._row(self.engine.k)) + self.engine.v.row_bytes(self._row(self.engine.v))

    # -- the model's domain, on demand
    def _model(self, store: Store, side: Side) -> torch.Tensor | None:
        rows = store.read()
        if rows is None:
            return None
        return self._to_model(side, self._heads(rows))

    @property
    def keys(self) -> torch.Tensor | None:
        """Every stored token's K, decoded to the model's domain (B, H_kv, T, D); None when empty."""
        return self._model(self._k, self.engine.k)

    @keys.setter
    def keys(self, value: Any) -> None:
        if value is not None:  # CacheLayerMixin.__init__ sets None
            raise TbqValueError("TbqLayer.keys are the stored rows decoded; write K/V through update()")

    @property
    def values(self) -> torch.Tensor | None:
        """Every stored token's V, decoded to the model's domain (B, H_kv, T, D); None when empty."""
        return self._model(self._v, self.engine.v)

    @values.setter
    def values(self, value: Any) -> None:
        if value is not None:
            raise TbqValueError("TbqLayer.values are the stored rows decoded; write K/V through update()")

    # -- the CacheLayerMixin API
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.dtype = key_states.dtype
        self.is_initialized = True

    def _rows(self, states: torch.Tensor, side: Side) -> torch.Tensor:
        """(B, H, T, D) model-domain states -> (B, T, H*D) float32 rows in the stored domain."""
        b, h, t, d = states.shape
        if h != self.engine.kv_heads or d != self.engine.head_dim:
            raise TbqValueError(
                f"layer {self.index}: the cache was built for {self.engine.kv_heads} KV heads of "
                f"{self.engine.head_dim} values, got states of {h} heads of {d}"
            )
        x = states.detach().to(device="cpu", dtype=torch.float32).transpose(1, 2)
        return side.to_stored(x).reshape(b, t, self._row(side)).contiguous()

    def _heads(self, rows: torch.Tensor) -> torch.Tensor:
        b, t, _ = rows.shape
        return rows.reshape(b, t, self.engine.kv_heads, -1)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Store the new tokens' K and V, then return the K and V the attention reads (B, H_kv, T, D), model domain.

        A full layer returns every token; a sliding layer the kept ``window - 1``
        and the new ones, then keeps only the newest ``window - 1``.
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        first = self.cumulative_length
        new = key_states.shape[-2]
        if self.engine.raw_first_prefill and first and new > _VLLM_CONTINUATION_DECODE:
            raise TbqValueError(
                f"layer {self.index}: a continuation of {new} tokens: vLLM reads a continuation prefill of more than "
                f"{_VLLM_CONTINUATION_DECODE} tokens with the chunk's own raw K/V, which engine 'vllm-prefill' "
                "does not mirror; feed at most that many tokens per step after the first"
            )
        k_rows, v_rows = self._rows(key_states, self.engine.k), self._rows(value_states, self.engine.v)
        self._k.write(k_rows, first, self.sinks, self.residual)
        self._v.write(v_rows, first, self.sinks, self.residual)
        self.cumulative_length += key_states.shape[-2]
        k_read, v_read = self._k.read(), self._v.read()
        assert k_read is not None and v_read is not None  # the rows just written are there
        k_stored, v_stored = self._heads(k_read), self._heads(v_read)
        if self.residual:
            self._k.flush(self.residual)
            self._v.flush(self.residual)
        if self.window is not None:
            n = self._k.length
            lo = max(n - (self.window - 1), 0)
            self._k.keep(lo, n)
            self._v.keep(lo, n)
        if self.engine.raw_first_prefill and first == 0:
            # vLLM's first prefill: flash attention on the batch's own K/V; the stored slots are read from then on
            return key_states, value_states
        k_att, v_att = k_stored.transpose(1, 2), v_stored.transpose(1, 2)
        k_model = k_att if self.stored_k else self._to_model(self.engine.k, k_stored)
        v_model = v_att if self.stored_v else self._to_model(self.engine.v, v_stored)
        if self.posts:
            attention.post(LayerRead(self.index, self.engine, k_model, v_model, k_att, v_att))
        return k_model, v_model

    def _to_model(self, side: Side, stored: torch.Tensor) -> torch.Tensor:
        return side.to_model(stored).transpose(1, 2).to(device=self.device, dtype=self.dtype)

    def get_mask_sizes(self, query_length: Any) -> tuple[int, int]:
        if isinstance(query_length, torch.Tensor):  # transformers 5.0 passes cache_position
            query_length = int(query_length.shape[0])
        if self.window is None:
            return self.cumulative_length + query_length, 0
        # transformers' DynamicSlidingWindowLayer: the kept window - 1 tokens and the new ones
        offset = max(self.cumulative_length - self.window + 1, 0)
        if self.cumulative_length >= self.window:
            return self.window - 1 + query_length, offset
        return self.cumulative_length + query_length, offset

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1 if self.window is None else self.window

    def get_max_cache_shape(self) -> int:  # the name of get_max_length in transformers 5.0
        return self.get_max_length()

    def reset(self) -> None:
        self._k = Store(self._k.side, self._k.sink_side, self._row(self._k.side))
        self._v = Store(self._v.side, self._v.sink_side, self._row(self._v.side))
        self.cumulative_length = 0
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the newest ``-tokens_to_remove`` tokens (transformers' convention: a negative count).

        A sliding layer that already dropped tokens out of its window cannot
        be rolled back (transformers' ``DynamicSlidingWindowLayer`` refuses it
        too without past recording): refused.
        """
        if tokens_to_remove > 0:
            raise TbqValueError(
                f"crop({tokens_to_remove}): pass a negative count of tokens to remove, as transformers' layers take"
            )
        n = -int(tokens_to_remove)
        if n == 0:
            return
        if self.window is not None and self.cumulative_length > self._k.length:
            raise TbqValueError(
                f"layer {self.index}: a sliding-window layer that dropped tokens out of its window cannot be cropped"
            )
        keep = max(self._k.length - n, 0)
        self._k.keep(0, keep)
        self._v.keep(0, keep)
        self.cumulative_length = max(self.cumulative_length - n, 0)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._batch(beam_idx.cpu().numpy())

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._batch(np.asarray(indices.cpu().numpy() if isinstance(indices, torch.Tensor) else indices))

    def batch_repeat_interleave(self, repeats: int) -> None:
        b = self.batch_size
        if b:
            self._batch(np.repeat(np.arange(b), int(repeats)))

    def _batch(self, index: np.ndarray) -> None:
        index = np.asarray(index, dtype=np.int64)
        if index.ndim != 1:
            raise TbqValueError(f"a batch index must be 1-d, got shape {index.shape}")
        self._k.batch(index)
        self._v.batch(index)

    @property
    def batch_size(self) -> int:
        for a in (self._k.sink, self._k.main, self._k.resid):
            if a is not None:
                return int(a.shape[0])
        return 0

    def offload(self) -> None:
        """Nothing to move: the stored bytes are NumPy arrays in host memory."""

    def prefetch(self) -> None:
        """Nothing to move: :meth:`update` returns K/V on the device the model's states came from."""


#: vLLM reads a continuation prefill of at most this many tokens from its stored slots (``_CONTINUATION_DECODE_THRESHOLD``).
_VLLM_CONTINUATION_DECODE = 128

#: The engines whose rows tbq can store with sinks and a residual window (those of llama.cpp and plain rows).
_SINK_ENGINES = ("llama.cpp", "llama.cpp-fork", "plain")


def _check_count(value: Any, what: str) -> int:
    return check_int(value, what, lo=0, expected="a non-negative integer", error=ConfigError)


class TbqCache(Cache):
    """A transformers ``Cache`` storing every attention layer's K and V as tbq-encoded bytes.

    Parameters
    ----------
    config : the model's config (``model.config``): layers, their kinds (``layer_types``), KV heads and head_dim.
    k, v : the K and V cache types: a format name (``tbq.format_names()``), ``"f32"``
        (float32 rows as they are), a :class:`tbq.Codec` (format options,
        e.g. ``tbq.get_codec("tbq4_0", codebook="lloyd-max")``) or ``(name, options)``.
    layers : ``{layer: (k, v)}`` for attention layers (model layer indices) that use other types.
    sinks : the first ``sinks`` tokens are stored in ``sink_type`` (default f16).
    residual : keep the newest ``residual`` tokens and the current batch in
        float32, quantizing each token once as it leaves that window
        (``engine="plain"`` only); 0 (default) quantizes every token before
        attention reads it, as llama.cpp does.
    engine : ``"llama.cpp"`` (default), ``"llama.cpp-fork"``, ``"llama.cpp-turbo"``,
        ``"vllm"``, ``"vllm-prefill"`` or ``"plain"`` (:mod:`tbq.hf.engine`).
    rotate_attention : llama.cpp's attention rotation (``False`` is its
        ``LLAMA_ATTN_ROT_DISABLE=1``; the turbo fork has it off).
    turbo_auto_asymmetric, turbo_layer_adaptive : the turbo fork's silent type
        changes (``TURBO_AUTO_ASYMMETRIC``, ``TURBO_LAYER_ADAPTIVE`` mode 7; on,
        as in the fork; ``False`` is its ``=0``), engine ``"llama.cpp-turbo"``;
        :attr:`type_changes` says which applied.
    vllm_skip_layers : vLLM's unquantized boundary layers (the first and last
        ``min(2, L // 2)`` of a dense model; on, as in vLLM), the vllm engines.
    model_domain : ``update`` returns K and V in the model's domain (default:
        any attention may read them). ``False``, with the tbq attention set
        (:func:`tbq.hf.prepare`): a side that attention reads in the stored
        domain (a rotated K or V) is returned as stored, skipping its inverse
        transform; the tbq attention takes it by identity and refuses any other
        tensor, and any other attention would read the stored domain (what
        ``tbq eval`` uses, where every layer's read is checked as taken).
    permute : store K in llama.cpp's GGUF channel order; default: when the
        model type is one llama.cpp's converter permutes (``engine.PERMUTED_MODEL_TYPES``).

    Block sizes that llama.cpp refuses for the geometry are refused here, naming the size.
    """

    def __init__(
        self,
        config: Any,
        k: Any = "f16",
        v: Any = "f16",
        *,
        layers: dict[int, tuple[Any, Any]] | None = None,
        sinks: int = 0,
        sink_type: Any = "f16",
        residual: int = 0,
        engine: str = "llama.cpp",
        rotate_attention: bool = True,
        permute: bool | None = None,
        turbo_auto_asymmetric: bool = True,
        turbo_layer_adaptive: bool = True,
        vllm_skip_layers: bool = True,
        model_domain: bool = True,
    ) -> None:
        text = _text_config(config)
        n_layers, kv_heads, head_dim = geometry(text)
        model_type = getattr(text, "model_type", "") or ""
        sinks = _check_count(sinks, "sinks")
        residual = _check_count(residual, "residual")
        if residual and engine != "plain":
            raise ConfigError(
                f"residual={residual} keeps the newest tokens and the prefill in full precision; "
                "llama.cpp quantizes every token before attention: use engine = 'plain' with residual"
            )
        kinds = layer_kinds(text)
        if getattr(text, "kv_sharing_modes", None) is not None or getattr(text, "num_kv_shared_layers", None):
            raise ConfigError(f"{model_type}: its layers share K/V between layers; tbq.hf does not store shared K/V")
        for idx, (kind, _) in enumerate(kinds):
            if kind not in FULL + SLIDING + OWN:
                raise ConfigError(
                    f"{model_type}: layer {idx} is a {kind!r} layer; tbq.hf stores the K/V of full and "
                    "sliding-window attention layers only"
                )
        own_layers = getattr(cache_utils, "DYNAMIC_LAYER_TYPE_MAPPING", None)
        for idx, (kind, _) in enumerate(kinds):
            if kind in OWN and own_layers is None:
                raise ConfigError(
                    f"{model_type}: layer {idx} is a {kind!r} layer and this transformers has no cache layer "
                    "for it (DYNAMIC_LAYER_TYPE_MAPPING): upgrade transformers for hybrid models"
                )
        attn = [i for i, (kind, _) in enumerate(kinds) if kind in FULL + SLIDING]
        if not attn:
            raise ConfigError(f"{model_type}: no attention layer with a K/V cache")
        per_layer: dict[Any, Any] = dict(layers or {})
        for idx in per_layer:
            if not is_integer(idx) or not 0 <= idx < n_layers:
                raise ConfigError(f"layers: {idx!r} is not a layer index of this model (0..{n_layers - 1})")
            if idx not in attn:
                raise ConfigError(
                    f"layers: layer {idx} of {model_type} is a {kinds[idx][0]!r} layer, without a K/V cache; "
                    f"its attention layers are {_ranges(attn)}"
                )
            pair = per_layer[idx]
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise ConfigError(f"layers[{idx}] must be a (k, v) pair of cache types, got {pair!r}")
        if sinks and engine not in _SINK_ENGINES:
            raise ConfigError(f"sinks={sinks}: engine {engine!r} has no sink tokens; use a llama.cpp engine or 'plain'")
        vllm = is_vllm_engine(engine)
        if permute is None:
            permute = engine != "plain" and not vllm and model_type in PERMUTED_MODEL_TYPES
        tbq_attention = attention.is_tbq(getattr(text, "_attn_implementation", None)) or attention.is_tbq(
            getattr(config, "_attn_implementation", None)
        )
        kw: dict[str, Any] = dict(
            head_dim=head_dim,
            kv_heads=kv_heads,
            permute=bool(permute) and engine != "plain",
            rotate_attention=rotate_attention,
        )
        sink_engine = make_engine(engine, sink_type, sink_type, **kw) if sinks else None
        hybrid = any(kind in OWN for kind, _ in kinds)
        skipped = vllm_skipped_layers(n_layers, hybrid) if vllm and vllm_skip_layers else []
        n_head = int(getattr(text, "num_attention_heads", kv_heads) or kv_heads)
        changes: dict[str, list[int]] = {}
        built: list[Any] = []
        for idx, (kind, kind_kw) in enumerate(kinds):
            if kind in OWN:  # no per-token K/V: transformers' own layer
                assert own_layers is not None  # refused above otherwise
                built.append(own_layers[kind](**kind_kw))
                continue
            lk, lv = per_layer.get(idx, (k, v))
            notes: list[str] = []
            if engine == "llama.cpp-turbo":
                lk, lv, notes = turbo_layer_types(
                    lk,
                    lv,
                    layer=idx,
                    n_layers=n_layers,
                    n_head=n_head,
                    n_head_kv=kv_heads,
                    auto_asymmetric=turbo_auto_asymmetric,
                    layer_adaptive=turbo_layer_adaptive,
                )
            elif idx in skipped and (lk, lv) != (F32, F32):
                make_engine(engine, lk, lv, **kw)  # what vLLM would refuse is refused on a skipped layer too
                lk, lv = F32, F32  # vLLM's kv_cache_dtype_skip_layers: the model's own K/V
                notes = ["unquantized (vLLM's boundary layers, the first and last min(2, L // 2))"]
            for note in notes:
                changes.setdefault(note, []).append(idx)
            eng = make_engine(engine, lk, lv, **kw)
            window = kind_kw.get("sliding_window") if kind in SLIDING else None
            built.append(
                TbqLayer(
                    eng,
                    index=idx,
                    window=window,
                    sinks=sinks,
                    residual=residual,
                    sink_engine=sink_engine,
                    tbq_attention=tbq_attention,
                    model_domain=model_domain,
                )
            )
            built[-1].type_changes = notes
        attention.clear()  # reads a failed run left on this thread are not this cache's
        super().__init__(layers=built)
        #: what the engine stored instead of the types asked for, one line each with its layers (empty: none)
        self.type_changes = [f"layers {_ranges(idx)}: {note}" for note, idx in changes.items()]
        self.engine, self.sinks, self.residual = engine, sinks, residual
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.model_type = model_type

    @property
    def tbq_layers(self) -> list[TbqLayer]:
        """The layers that store tbq bytes (attention layers), in model order."""
        return [layer for layer in self.layers if isinstance(layer, TbqLayer)]

    @property
    def nbytes(self) -> int:
        """Bytes the attention layers hold now: stored rows (sliding layers: their window), plus any residual window."""
        return sum(layer.nbytes for layer in self.tbq_layers)

    def bytes_per_token(self) -> int:
        """Bytes one token's K and V rows take in the full-attention layers (what grows with the context).

        Sliding-window layers are not counted: they hold at most ``window - 1``
        tokens between steps (:meth:`window_bytes`); linear-attention layers
        hold a fixed state and no rows.
        """
        return sum(layer.bytes_per_token() for layer in self.tbq_layers if layer.window is None)

    def window_bytes(self) -> int:
        """Bytes the sliding-window layers hold once their windows are full (``window - 1`` tokens each)."""
        return sum(layer.bytes_per_token() * (layer.window - 1) for layer in self.tbq_layers if layer.window)

    def __repr__(self) -> str:
        kinds = sorted({(layer.k_type, layer.v_type) for layer in self.tbq_layers})
        return (
            f"TbqCache(engine={self.engine!r}, types={kinds}, sinks={self.sinks}, residual={self.residual}, "
            f"tokens={self.get_seq_length(self.tbq_layers[0].index)})"
        )


def _ranges(idx: list[int]) -> str:
    return ", ".join(str(i) for i in idx) if len(idx) <= 8 else f"{', '.join(map(str, idx[:8]))}, ..."
