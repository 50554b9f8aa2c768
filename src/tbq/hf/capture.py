"""A model's real K and V: the post-RoPE keys and the values its attention reads, per layer.

>>> kv = capture_kv(model, tokens, layers=[0, 3])          # doctest: +SKIP
>>> kv[0]["k"].shape                                        # doctest: +SKIP
(512, 2, 128)
>>> save_kv("kv.npz", kv)   # then: tbq compare kv.npz --array layer0_k   # doctest: +SKIP

The arrays are float32 ``(tokens, kv_heads, head_dim)`` in the model's own
channel order, captured through a :class:`~tbq.hf.TbqCache` of float32 rows
(the ``"plain"`` engine: exactly what the model computed). To see them as
llama.cpp stores them, apply :mod:`tbq.hf.engine`'s permutation and rotation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..errors import TbqValueError, is_integer

__all__ = ["capture_kv", "save_kv", "load_kv"]


def capture_kv(
    model: Any, tokens: ArrayLike, layers: Any = None, *, bos: int | None | bool = None
) -> dict[int, dict[str, NDArray[np.float32]]]:
    """``{layer: {"k": K, "v": V}}`` of one forward pass over ``tokens`` (1-d integer array).

    ``layers``: the layer indices to keep (default all). ``bos``: the token that
    replaces the first one (``None``: ``model.config.bos_token_id``; ``False``: keep the text's).
    """
    import torch

    from .cache import TbqCache, cache_kwargs

    t = np.asarray(tokens)
    if t.ndim != 1 or t.size == 0 or not np.issubdtype(t.dtype, np.integer):
        raise TbqValueError(f"tokens must be a non-empty 1-d integer array, got {t.dtype} of shape {t.shape}")
    ids = t.astype(np.int64).copy()
    if bos is None:
        bos = getattr(model.config, "bos_token_id", None)
    if bos is not None and bos is not False:
        ids[0] = int(bos)
    cache = TbqCache(model.config, "f32", "f32", engine="plain")
    attn = {layer.index: layer for layer in cache.tbq_layers}  # attention layers (sliding ones keep their window)
    keep = sorted(attn) if layers is None else list(layers)
    for idx in keep:
        if not is_integer(idx) or idx not in attn:
            raise TbqValueError(
                f"layers: {idx!r} is not an attention layer index of this model ({', '.join(map(str, sorted(attn)))})"
            )
    with torch.no_grad():
        model(torch.from_numpy(ids)[None], use_cache=True, **cache_kwargs(model, cache))
    out: dict[int, dict[str, NDArray[np.float32]]] = {}
    for idx in keep:
        layer = attn[idx]
        heads, dim = layer.engine.kv_heads, layer.engine.head_dim
        kb, vb = layer.key_bytes, layer.value_bytes
        assert kb is not None and vb is not None  # the forward pass above stored every layer's rows
        kb, vb = kb[0], vb[0]
        k = kb.view(np.float32).reshape(-1, heads, dim)
        v = vb.view(np.float32).reshape(-1, heads, dim)
        out[int(idx)] = {"k": k.copy(), "v": v.copy()}
    return out


def save_kv(path: str | os.PathLike[str], kv: dict[int, dict[str, NDArray[Any]]]) -> Path:
    """Write ``capture_kv``'s result as ``.npz``: arrays ``layer{L}_k`` and ``layer{L}_v``."""
    p = Path(path)
    arrays = {f"layer{idx}_{role}": kv[idx][role] for idx in sorted(kv) for role in ("k", "v")}
    np.savez(p, **arrays)  # type: ignore[arg-type]  # NumPy stubs type **kwds as allow_pickle
    return p if p.suffix == ".npz" else p.with_name(p.name + ".npz")


def load_kv(path: str | os.PathLike[str]) -> dict[int, dict[str, NDArray[Any]]]:
    """Read a :func:`save_kv` file back as ``{layer: {"k": K, "v": V}}``."""
    out: dict[int, dict[str, NDArray[Any]]] = {}
    with np.load(path) as data:
        for name in data.files:
            head, _, role = name.rpartition("_")
            if not head.startswith("layer") or role not in ("k", "v"):
                raise TbqValueError(f"{path}: {name!r} is not a layer<L>_k / layer<L>_v array of tbq eval --capture")
            out.setdefault(int(head[5:]), {})[role] = data[name]
    return out
