"""The ``"tbq"`` attention: the model's own attention function, run in the domain a :class:`~tbq.hf.TbqCache` stored K and V in.

:func:`prepare` records the attention implementation the model declared
(transformers picks ``sdpa`` where the model's ``_supports_sdpa`` allows it,
else ``eager``: gemma2's soft-capping and gpt-oss's learned sinks need their
``eager``) and replaces it by ``"tbq"`` (``"tbq+eager"``, ... for another
base). The tbq attention calls that same function with

    Q' = engine.query(Q), K and V as stored, then the engine's output transform on the result,

so every argument the model passes (scaling, soft-capping, sliding window,
learned sinks, GQA, dropout off in eval) reaches the function that honours it:
the engine's transforms are an orthonormal rotation and a permutation of the
head_dim axis (dot products and weighted sums keep their meaning) plus Q's
q8_0 rounding, so the scores the model's function post-processes are
llama.cpp's. A layer whose engine leaves Q, K and V alone (f16, f32) runs the
model's function on the cache's K/V unchanged, so an f32 cache reproduces the
model's logits exactly.

The cache and the attention meet through an explicit object, not a tensor
attribute: ``TbqCache.update`` returns K/V in the model's own domain (any
attention may read them) and posts a :class:`LayerRead` for its layer index
holding the tensors it returned and their stored-domain twins; the tbq
attention takes the read of its module's layer and uses the stored domain
only when the K and V it received *are* the tensors the cache returned. A
replaced tensor is refused (one line naming the layer), never mixed with a
transformed Q.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..errors import ConfigError, TbqValueError
from .engine import Engine

__all__ = ["NAME", "LayerRead", "base_implementation", "is_tbq", "post", "prepare", "tbq_attention", "unread"]

#: The registered name of the tbq attention over the model's ``sdpa``; over another base ``"tbq+<base>"``.
NAME = "tbq"

#: The attention implementations a tbq attention can wrap (the mask each needs is transformers' own for it).
BASES = ("sdpa", "eager", "flex_attention")


#: Arguments of a model's attention that transformers' sdpa function cannot honour.
_SDPA_CANNOT = ("softcap", "s_aux")


def _name(base: str) -> str:
    return NAME if base == "sdpa" else f"{NAME}+{base}"


def is_tbq(implementation: Any) -> bool:
    """True when ``implementation`` (a config's ``_attn_implementation``) is a tbq attention."""
    return isinstance(implementation, str) and (implementation == NAME or implementation.startswith(NAME + "+"))


def base_implementation(implementation: str) -> str:
    """The model's own implementation under a tbq attention name (``"tbq"`` -> ``"sdpa"``); others as they are."""
    if implementation == NAME:
        return "sdpa"
    return implementation[len(NAME) + 1 :] if is_tbq(implementation) else implementation


@dataclass
class LayerRead:
    """One layer's K/V as a :class:`~tbq.hf.TbqCache` returned them and in its stored domain, (B, H_kv, T, D).

    ``key``/``value`` are the very tensors ``update`` returned (model domain);
    ``stored_keys``/``stored_values`` the same rows in the engine's stored
    domain (float32), which the tbq attention reads with the engine's Q.
    """

    layer: int
    engine: Engine
    key: Any
    value: Any
    stored_keys: Any
    stored_values: Any


_BOARD = threading.local()


def _board() -> dict[int, LayerRead]:
    board = getattr(_BOARD, "reads", None)
    if board is None:
        board = _BOARD.reads = {}
    return board


def post(read: LayerRead) -> None:
    """Post ``read`` for the attention of its layer (the cache calls this from ``update``)."""
    _board()[read.layer] = read


def clear() -> None:
    """Forget every posted read of this thread (a new cache starts from nothing)."""
    _board().clear()


def unread() -> list[int]:
    """The layers whose posted read no tbq attention took (then forgotten): their Q was not transformed."""
    board = _board()
    left = sorted(board)
    board.clear()
    return left


def _take(module: Any, key: Any, value: Any) -> LayerRead | None:
    idx = getattr(module, "layer_idx", None)
    if idx is None:
        return None
    read = _board().pop(int(idx), None)
    if read is None:
        return None
    if read.key is not key or read.value is not value:
        raise TbqValueError(
            f"layer {idx}: the K/V reaching the tbq attention are not the tensors the TbqCache returned "
            "(something replaced them between the cache and the attention); refusing to pair them with the "
            "engine's transformed Q"
        )
    return read


def _base_function(module: Any, base: str) -> Callable[..., Any]:
    if base == "eager":
        fn = getattr(importlib.import_module(type(module).__module__), "eager_attention_forward", None)
        if fn is None:
            raise ConfigError(
                f"{type(module).__name__}: its module defines no eager_attention_forward; tbq cannot call the "
                "model's own eager attention"
            )
        return fn
    return ALL_ATTENTION_FUNCTIONS[base]


def _make(base: str) -> Callable[..., tuple[Any, Any]]:
    def tbq_attention(
        module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        """A transformers attention function (the ``AttentionInterface`` signature) over the model's own ``base``."""
        fn = _base_function(module, base)
        if base == "sdpa" and any(kwargs.get(name) is not None for name in _SDPA_CANNOT):
            # sdpa cannot soft-cap scores or add learned sinks (transformers 5.0's silently drops soft-capping):
            # the model's own eager attention computes what the model defines
            fn = _base_function(module, "eager")
        read = _take(module, key, value)
        eng = None if read is None else read.engine
        if read is None or eng is None or not (eng.q_transformed or eng.v_transformed):
            return fn(module, query, key, value, attention_mask, **kwargs)
        dtype = query.dtype
        q = eng.query(query.float()) if eng.q_transformed else query.float()
        k = read.stored_keys if eng.q_transformed else key.float()
        v = read.stored_values if eng.v_transformed else value.float()
        out, weights = fn(module, q, k, v, attention_mask, **kwargs)
        return eng.output(out).to(dtype), weights

    tbq_attention.__name__ = f"tbq_attention_{base}"
    return tbq_attention


#: The tbq attention over transformers' sdpa (the base most models declare).
tbq_attention = _make("sdpa")


def _register(base: str) -> str:
    name = _name(base)
    if name not in ALL_ATTENTION_FUNCTIONS.valid_keys():
        ALL_ATTENTION_FUNCTIONS.register(name, tbq_attention if base == "sdpa" else _make(base))
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


def prepare(model: Any) -> Any:
    """Set the tbq attention over the model's own implementation (in place); return the model.

    The model's declared implementation (``model.config._attn_implementation``,
    chosen by transformers from the model's ``_supports_sdpa`` and the like)
    is kept as the base the tbq attention calls. A model whose attention does
    not go through transformers' ``AttentionInterface``, or whose own
    implementation is not one of :data:`BASES`, is refused with one line.
    A :class:`~tbq.hf.TbqCache` also works without this, with any attention,
    reading K/V in the model's domain (then Q is not transformed as llama.cpp's is).
    """
    config = model.config
    current = getattr(config, "_attn_implementation", None) or "eager"
    if is_tbq(current):
        return model
    model_type = getattr(config, "model_type", type(model).__name__)
    if current not in BASES:
        raise ConfigError(
            f"{model_type}: its attention implementation is {current!r}; the tbq attention wraps "
            f"{', '.join(BASES)} (load the model with one of them)"
        )
    name = _register(current)
    try:
        model.set_attn_implementation(name)
    except (ValueError, KeyError, AttributeError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{model_type}: cannot set the tbq attention: {first}") from None
    if getattr(model.config, "_attn_implementation", None) != name:
        raise ConfigError(
            f"{model_type}: its attention does not go through transformers' AttentionInterface, "
            "so the tbq attention cannot be set"
        )
    return model
