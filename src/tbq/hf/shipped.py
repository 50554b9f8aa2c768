"""The model shipped in the package: a 2.3M-parameter Llama trained on Python's standard library.

``MODEL_DIR`` is a Hugging Face checkpoint folder (``AutoModelForCausalLM`` /
``AutoTokenizer`` load it offline) that also holds the same model as a llama.cpp
GGUF, the held-out text and the training log. How it was made: docs/model.md
(:mod:`tbq.hf.train`, :mod:`tbq.hf.gguf_export`).

Importing this module imports neither torch nor transformers; the loaders do.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

#: The folder of the shipped model (``tbq/data/model`` inside the installed package).
MODEL_DIR: Path = Path(str(resources.files("tbq").joinpath("data").joinpath("model")))

#: Every file of MODEL_DIR.
FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.gguf",
    "heldout.txt",
    "train_log.json",
)


def gguf_path() -> Path:
    """The llama.cpp GGUF (``llama`` architecture, F32) of the shipped model."""
    return MODEL_DIR / "model.gguf"


def heldout_text() -> str:
    """The held-out text (CPython 3.11.7's textwrap.py, shlex.py, fnmatch.py; never trained on), exactly as stored."""
    return (MODEL_DIR / "heldout.txt").read_bytes().decode("utf-8")


def train_log() -> dict[str, Any]:
    """The training log (configuration, corpus hash, loss curve, held-out loss)."""
    import json

    return json.loads((MODEL_DIR / "train_log.json").read_text())
