"""tbq.hf: a model's KV cache stored bit-exactly in any tbq format (Hugging Face transformers on PyTorch).

Needs the ``hf`` extra (``pip install 'tbq[hf]'``: torch, transformers,
tokenizers, safetensors, gguf). The names below import torch and
transformers on first use, so ``import tbq.hf`` (and :mod:`tbq.hf.shipped`)
stays light. (Their modules are named apart from them, :mod:`tbq.hf.loader`
and :mod:`tbq.hf.evaluation`, so importing a module never shadows a function.)

- :class:`TbqCache`: a transformers cache whose layers store K and V as
  :func:`tbq.quantize` bytes, mirroring llama.cpp's ``-ctk/-ctv`` by default
  (:mod:`tbq.hf.engine`);
- :func:`prepare`: sets the ``"tbq"`` attention that applies the engine's
  Q transforms (:mod:`tbq.hf.attention`);
- :func:`load`: a causal LM and its tokenizer from a HF directory or a GGUF file;
- :func:`evaluate`: perplexity, KL, top-1 and greedy agreement of cache types
  against the f16 and f32 caches, llama-perplexity's chunking;
- :func:`capture_kv`: the real post-RoPE K and V of a model.

Inside: :mod:`tbq.hf.engine` decides what an engine does with each type,
:mod:`tbq.hf.transforms` computes it (channel order, rotation, q8_0),
:mod:`tbq.hf.store` holds a layer's bytes, :mod:`tbq.hf.stats` and
:mod:`tbq.hf.generation` are :func:`evaluate`'s statistics and
``tbq eval --prompts``' greedy agreement.

See docs/eval.md.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The engines a cache can mirror (:mod:`tbq.hf.engine`); here so the CLI can name them without torch.
ENGINES = ("llama.cpp", "llama.cpp-fork", "llama.cpp-turbo", "vllm", "vllm-prefill", "plain")

__all__ = ["TbqCache", "prepare", "load", "evaluate", "capture_kv", "save_kv", "load_kv", "EvalResult"]

_LAZY = {
    "TbqCache": "tbq.hf.cache",
    "prepare": "tbq.hf.attention",
    "load": "tbq.hf.loader",
    "evaluate": "tbq.hf.evaluation",
    "EvalResult": "tbq.hf.evaluation",
    "capture_kv": "tbq.hf.capture",
    "save_kv": "tbq.hf.capture",
    "load_kv": "tbq.hf.capture",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tbq.hf' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
