"""A transformers KV cache whose layers store K and V as tbq-encoded bytes.

>>> from transformers import LlamaConfig
>>> config = LlamaConfig(hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
...                      head_dim=128, num_hidden_layers=2, intermediate_size=64, vocab_size=32)
>>> cache = TbqCache(config, k="q8_0", v="q4_0", layers={1: ("f16", "f16")})
>>> [(layer.k_type, layer.v_type) for layer in cache.layers]
[('q8_0', 'q4_0'), ('f16', 'f16')]
>>> cache.bytes_per_token()       # (136 + 72) + (256 + 256): q8_0 and q4_0 rows of 128, then f16
720

Each layer keeps, per role, the bytes of every token's row (``n_kv_heads x
head_dim`` values, blocks along the row) as :func:`tbq.quantize` writes
them, in the domain the engine chose (:mod:`tbq.hf.engine`: llama.cpp's
channel order and attention rotation by default). ``update`` writes the new
tokens *before* returning the cache's K/V, so the tokens of a prefill batch
already attend to quantized keys and values, as in llama.cpp. ``residual=N``
instead keeps the newest ``N`` tokens (and the whole current batch) in
float32, as transformers' own ``QuantizedCache`` does: then a prefill sees
no quantization at all.

The K/V returned are in the model's own domain, so any attention
implementation works with the cache; :mod:`tbq.hf.attention`'s ``"tbq"``
attention (set by :func:`tbq.hf.prepare`) reads the stored domain instead
and applies the engine's Q transform (rotation, q8_0 conversion), which is
what makes the products llama.cpp's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ..errors import ConfigError, TbqValueError, check_int, is_integer
from .engine import PERMUTED_MODEL_TYPES, Engine, Side, make_engine

__all__ = ["TbqCache", "TbqLayer", "LayerRead", "geometry"]


def geometry(config: Any) -> tuple[int, int, int]:
    """``(num_hidden_layers, num_key_value_heads, head_dim)`` of a transformers text config."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
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


@dataclass
class LayerRead:
    """What the ``"tbq"`` attention reads: the engine and the cache's K/V in their stored domain (B, H_kv, T, D)."""

    engine: Engine
    keys: torch.Tensor
    values: torch.Tensor


class _Store:
    """The bytes of one role of one layer: sink rows, main rows, and the float32 residual window."""

    def __init__(self, side: Side, sink_side: Side | None, row: int) -> None:
        self.side, self.sink_side, self.row = side, sink_side, row
        self.sink: np.ndarray | None = None  # (B, s, sink row bytes)
        self.main: np.ndarray | None = None  # (B, n, row bytes)
        self.resid: torch.Tensor | None = None  # (B, r, row) float32, stored domain

    @staticmethod
    def _cat(a: np.ndarray | None, b: np.ndarray) -> np.ndarray:
        return b if a is None else np.concatenate([a, b], axis=1)

    def write(self, rows: torch.Tensor, first: int, sinks: int, residual: int) -> None:
        """Store ``rows`` (B, T, row) float32, the tokens at positions ``first, first + 1, ...``."""
        n_sink = min(max(sinks - first, 0), rows.shape[1])
        if n_sink:
            assert self.sink_side is not None  # sinks > 0: the store was built with a sink side
            self.sink = self._cat(self.sink, self.sink_side.encode(rows[:, :n_sink].numpy()))
            rows = rows[:, n_sink:]
        if rows.shape[1] == 0:
            return
        if residual:
            self.resid = rows.clone() if self.resid is None else torch.cat([self.resid, rows], 1)
        else:
            self.main = self._cat(self.main, self.side.encode(rows.numpy()))

    def flush(self, residual: int) -> None:
        """Encode the residual window's oldest tokens until at most ``residual`` are left."""
        if self.resid is None or self.resid.shape[1] <= residual:
            return
        cut = self.resid.shape[1] - residual
        self.main = self._cat(self.main, self.side.encode(self.resid[:, :cut].numpy()))
        self.resid = self.resid[:, cut:].clone()

    def read(self) -> torch.Tensor:
        """Every stored token's row, decoded: (B, T, row) float32 in the stored domain."""
        parts = []
        if self.sink is not None:
            assert self.sink_side is not None  # sink bytes exist only with a sink side
            parts.append(torch.from_numpy(self.sink_side.decode(self.sink, self.row)))
        if self.main is not None:
            parts.append(torch.from_numpy(self.side.decode(self.main, self.row)))
        if self.resid is not None:
            parts.append(self.resid)
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    @property
    def nbytes(self) -> int:
        n = sum(a.nbytes for a in (self.sink, self.main) if a is not None)
        return n + (0 if self.resid is None else self.resid.numel() * 4)


class TbqLayer(CacheLayerMixin):
    """One layer of a :class:`TbqCache`: K and V rows stored as tbq bytes (see the module docstring)."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(
        self,
        engine: Engine,
        *,
        sinks: int = 0,
        residual: int = 0,
        sink_engine: Engine | None = None,
        tbq_attention: bool = False,
    ) -> None:
        super().__init__()
        self.engine = engine
        #: the "tbq" attention reads K (V) in the stored domain: update() returns that side untransformed
        self.stored_k = tbq_attention and engine.q_transformed
        self.stored_v = tbq_attention and engine.v.rotation is not None
        self.sinks, self.residual = int(sinks), int(residual)
        row = engine.kv_heads * engine.head_dim
        ks = vs = None
        if sinks:
            assert sink_engine is not None  # TbqCache builds one whenever sinks > 0
            # sink rows live in the layer's domain (same rotation and order), in the sink type
            ks = replace(sink_engine.k, rotation=engine.k.rotation, permutation=engine.k.permutation)
            vs = replace(sink_engine.v, rotation=engine.v.rotation, permutation=None)
        self._k = _Store(engine.k, ks, row)
        self._v = _Store(engine.v, vs, row)
        self.cumulative_length = 0

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

    def bytes_per_token(self) -> int:
        """Bytes of one token's K and V rows in the main types."""
        row = self.engine.kv_heads * self.engine.head_dim
        return self.engine.k.row_bytes(row) + self.engine.v.row_bytes(row)

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
                f"the cache was built for {self.engine.kv_heads} KV heads of {self.engine.head_dim} values, "
                f"got states of {h} heads of {d}"
            )
        x = states.detach().to(device="cpu", dtype=torch.float32).transpose(1, 2)
        return side.to_stored(x).reshape(b, t, h * d).contiguous()

    def _heads(self, rows: torch.Tensor) -> torch.Tensor:
        b, t, _ = rows.shape
        return rows.reshape(b, t, self.engine.kv_heads, self.engine.head_dim)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Store the new tokens' K and V, then return every token's K and V (B, H_kv, T, D), model domain."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        first = self.cumulative_length
        k_rows, v_rows = self._rows(key_states, self.engine.k), self._rows(value_states, self.engine.v)
        self._k.write(k_rows, first, self.sinks, self.residual)
        self._v.write(v_rows, first, self.sinks, self.residual)
        self.cumulative_length += key_states.shape[-2]
        k_stored, v_stored = self._heads(self._k.read()), self._heads(self._v.read())
        if self.residual:
            self._k.flush(self.residual)
            self._v.flush(self.residual)
        read = LayerRead(self.engine, k_stored.transpose(1, 2), v_stored.transpose(1, 2))
        # With the "tbq" attention, a side it reads in the stored domain is returned as it is (no transform
        # back); any other attention gets the model's domain.
        k_model = read.keys if self.stored_k else self.engine.k.to_model(k_stored).transpose(1, 2)
        v_model = read.values if self.stored_v else self.engine.v.to_model(v_stored).transpose(1, 2)
        k_model = k_model.to(device=self.device, dtype=self.dtype)
        v_model = v_model.to(device=self.device, dtype=self.dtype)
        k_model._tbq_read = read  # type: ignore[attr-defined]  # where the "tbq" attention finds the stored domain
        return k_model, v_model

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cumulative_length + query_length, 0

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        row = self.engine.kv_heads * self.engine.head_dim
        self._k = _Store(self._k.side, self._k.sink_side, row)
        self._v = _Store(self._v.side, self._v.sink_side, row)
        self.cumulative_length = 0
        self.is_initialized = False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        idx = beam_idx.cpu().numpy()
        for store in (self._k, self._v):
            store.sink = None if store.sink is None else store.sink[idx]
            store.main = None if store.main is None else store.main[idx]
            store.resid = None if store.resid is None else store.resid[torch.from_numpy(idx)]


def _check_count(value: Any, what: str) -> int:
    return check_int(value, what, lo=0, expected="a non-negative integer", error=ConfigError)


class TbqCache(Cache):
    """A transformers ``Cache`` storing every layer's K and V as tbq-encoded bytes.

    Parameters
    ----------
    config : the model's config (``model.config``): layers, KV heads and head_dim.
    k, v : the K and V cache types: a format name (``tbq.formats()``), ``"f32"``
        (float32 rows as they are), a :class:`tbq.Codec` (format options,
        e.g. ``tbq.get_codec("tbq4_0", codebook="lloyd-max")``) or ``(name, options)``.
    layers : ``{layer: (k, v)}`` for layers that use other types.
    sinks : the first ``sinks`` tokens are stored in ``sink_type`` (default f16).
    residual : keep the newest ``residual`` tokens and the current batch in
        float32 (transformers' ``QuantizedCache`` behaviour; ``engine="plain"``
        only); 0 (default) quantizes every token before attention reads it,
        as llama.cpp does.
    engine : ``"llama.cpp"`` (default), ``"llama.cpp-fork"`` or ``"plain"``
        (:mod:`tbq.hf.engine`).
    rotate_attention : llama.cpp's attention rotation (``False`` is its
        ``LLAMA_ATTN_ROT_DISABLE=1``).
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
    ) -> None:
        n_layers, kv_heads, head_dim = geometry(config)
        sinks = _check_count(sinks, "sinks")
        residual = _check_count(residual, "residual")
        if residual and engine != "plain":
            raise ConfigError(
                f"residual={residual} is transformers' QuantizedCache behaviour (full-precision newest tokens and prefill); "
                "llama.cpp quantizes every token before attention: use engine = 'plain' with residual"
            )
        per_layer: dict[Any, Any] = dict(layers or {})
        for idx in per_layer:
            if not is_integer(idx) or not 0 <= idx < n_layers:
                raise ConfigError(f"layers: {idx!r} is not a layer index of this model (0..{n_layers - 1})")
            pair = per_layer[idx]
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise ConfigError(f"layers[{idx}] must be a (k, v) pair of cache types, got {pair!r}")
        if permute is None:
            model_type = getattr(
                config.get_text_config() if hasattr(config, "get_text_config") else config, "model_type", ""
            )
            permute = engine != "plain" and model_type in PERMUTED_MODEL_TYPES
        tbq_attention = getattr(config, "_attn_implementation", None) == "tbq"  # tbq.hf.prepare(model) sets it
        kw: dict[str, Any] = dict(
            head_dim=head_dim,
            kv_heads=kv_heads,
            permute=bool(permute) and engine != "plain",
            rotate_attention=rotate_attention,
        )
        sink_engine = make_engine(engine, sink_type, sink_type, **kw) if sinks else None
        built: list[Any] = []
        for idx in range(n_layers):
            lk, lv = per_layer.get(idx, (k, v))
            eng = make_engine(engine, lk, lv, **kw)
            built.append(
                TbqLayer(eng, sinks=sinks, residual=residual, sink_engine=sink_engine, tbq_attention=tbq_attention)
            )
        super().__init__(layers=built)
        self.engine, self.sinks, self.residual = engine, sinks, residual
        self.kv_heads, self.head_dim = kv_heads, head_dim

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds now: every layer's stored rows (plus any float32 residual window)."""
        return sum(layer.nbytes for layer in cast("list[TbqLayer]", self.layers))

    def bytes_per_token(self) -> int:
        """Bytes one token's K and V rows take in every layer's main types (what ``tbq budget`` counts)."""
        return sum(layer.bytes_per_token() for layer in cast("list[TbqLayer]", self.layers))

    def __repr__(self) -> str:
        kinds = sorted({(layer.k_type, layer.v_type) for layer in cast("list[TbqLayer]", self.layers)})
        return f"TbqCache(engine={self.engine!r}, types={kinds}, sinks={self.sinks}, residual={self.residual}, tokens={self.get_seq_length()})"
