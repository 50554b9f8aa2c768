"""The ``"tbq"`` attention implementation: attention in the domain a :class:`~tbq.hf.TbqCache` stored K and V in.

:func:`prepare` registers it with transformers and sets it on a model. For a
layer whose cache rows carry a :class:`~tbq.hf.cache.LayerRead`, it computes

    softmax(scale * Q' K_stored^T + mask) V_stored, then the engine's output transform,

with ``Q' = engine.query(Q)`` (K's permutation and rotation, then ggml's q8_0
conversion where llama.cpp's K type takes it; zeros for the fork's q8_K
defect). Everything else, and every layer whose engine leaves Q alone,
goes to transformers' own ``sdpa`` attention with the K/V as given, so an
f32 cache reproduces the model's logits exactly.
"""

from __future__ import annotations

from typing import Any

from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..errors import ConfigError

__all__ = ["NAME", "prepare", "tbq_attention"]

#: The attention implementation's registered name.
NAME = "tbq"


def tbq_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> tuple[Any, Any]:
    """A transformers attention function (the ``AttentionInterface`` signature)."""
    read = getattr(key, "_tbq_read", None)
    if read is None or not (read.engine.q_transformed or read.engine.v.rotation is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    eng = read.engine
    dtype = query.dtype
    q = eng.query(query.float()) if eng.q_transformed else query.float()
    k = read.keys if eng.q_transformed else key.float()
    v = read.values if eng.v.rotation is not None else value.float()
    out, weights = sdpa_attention_forward(module, q, k, v, attention_mask, **kwargs)
    return eng.output(out).to(dtype), weights


def prepare(model: Any) -> Any:
    """Register the ``"tbq"`` attention and set it on ``model`` (in place); return the model.

    Needed for the llama.cpp engines' Q transforms; a :class:`~tbq.hf.TbqCache`
    also works with any other attention, reading K/V back in the model's domain.
    """
    ALL_ATTENTION_FUNCTIONS.register(NAME, tbq_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    if getattr(model.config, "_attn_implementation", None) != NAME:
        try:
            model.set_attn_implementation(NAME)
        except (ValueError, KeyError, AttributeError) as exc:
            raise ConfigError(f"cannot set the tbq attention on {type(model).__name__}: {exc}") from None
    return model
