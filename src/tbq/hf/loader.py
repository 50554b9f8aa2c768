"""Load a causal language model and its tokenizer: a Hugging Face directory, a GGUF file, or the shipped model.

>>> model, tokenizer = load()                       # doctest: +SKIP
>>> model, tokenizer = load("path/to/model.gguf")   # doctest: +SKIP

Nothing is downloaded: paths are local (``local_files_only``). A GGUF file
is read by transformers' GGUF loader (which undoes llama.cpp's Q/K
permutation), so the model computes in transformers' channel order and
:class:`tbq.hf.TbqCache` permutes K into llama.cpp's order itself.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import TbqValueError

__all__ = ["load", "resolve_model_path"]


def resolve_model_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The model path to load: ``path``, or the shipped model's directory when ``None``; checked to exist."""
    if path is None:
        from .shipped import MODEL_DIR

        return Path(MODEL_DIR)
    p = Path(path)
    if not p.exists():
        raise TbqValueError(
            f"model {str(path)!r}: no such file or directory (a Hugging Face model directory or a .gguf file)"
        )
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise TbqValueError(
                f"model {str(path)!r}: a directory without config.json is not a Hugging Face model directory"
            )
    elif p.suffix.lower() != ".gguf":
        raise TbqValueError(f"model {str(path)!r}: expected a Hugging Face model directory or a .gguf file")
    return p


@contextmanager
def _quiet_tqdm() -> Any:
    """transformers' GGUF loader wraps its tensor loop in a plain tqdm bar (not its logging's): pass the loop through."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    old = getattr(gguf_utils, "tqdm", None)
    gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable  # type: ignore[attr-defined]  # a module global, not re-exported
    try:
        yield
    finally:
        gguf_utils.tqdm = old  # type: ignore[attr-defined]


def load(path: str | os.PathLike[str] | None = None, *, dtype: Any = "float32", tokenizer: bool = True) -> Any:
    """``(model, tokenizer)`` from a HF directory, a ``.gguf`` file, or the shipped model (``path=None``).

    The model is in eval mode, on the CPU, in ``dtype`` (float32 by default);
    ``tokenizer=False`` returns ``(model, None)``. A model that is not a causal
    LM is refused with one line. transformers' loading progress bars are off.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    p = resolve_model_path(path)
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if p.is_dir():
        where, kw = str(p), {}
    else:
        where, kw = str(p.parent), {"gguf_file": p.name}
    try:
        with _quiet_tqdm():  # transformers' GGUF loader draws a plain tqdm bar
            model = AutoModelForCausalLM.from_pretrained(where, dtype=torch_dtype, local_files_only=True, **kw)
    except (ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TbqValueError(f"model {str(p)!r} cannot be loaded as a causal language model: {first}") from None
    except OSError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TbqValueError(f"model {str(p)!r}: {first}") from None
    tok = None
    if tokenizer:
        try:
            tok = AutoTokenizer.from_pretrained(where, local_files_only=True, **kw)
        except (ValueError, KeyError, OSError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TbqValueError(f"model {str(p)!r}: its tokenizer cannot be loaded: {first}") from None
    return model.eval(), tok
