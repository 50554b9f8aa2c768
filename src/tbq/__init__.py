"""tbq: bit-exact reference codecs for KV-cache block quantization.

Formats: every KV-cache type of llama.cpp and its TurboQuant fork (ggml's
f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl; the rotated tbq4_0, tbq3_0,
planar3_0, iso3_0, planar4_0, iso4_0), ggml's FP4 types (mxfp4, nvfp4) and
vLLM's FP8 KV cache (fp8_e4m3, fp8_e5m2, with a per-tensor scale).
See ``docs/formats.md``; ``tbq.format_names()`` lists them and ``tbq.formats``
is the package of format modules (calling it, ``tbq.formats()``, is the
deprecated spelling of ``tbq.format_names()``).

>>> import numpy as np, tbq
>>> len(tbq.format_names()) == len(tbq.formats.FORMATS), tbq.formats.FORMATS["iq4_nl"].type_size
(True, 18)
>>> x = np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 128)
>>> q = tbq.quantize(x, "tbq4_0")
>>> q.shape, q.dtype
((2, 66), dtype('uint8'))
>>> tbq.dequantize(q, "tbq4_0").shape
(2, 128)
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__: str = _version("tbq")  # single source: pyproject.toml's [project] version
except _PackageNotFoundError:  # pragma: no cover - a source tree on sys.path that was never installed
    __version__ = "0+unknown"

from . import formats
from .codebooks import Codebook
from .codecs import Codec, codec_from_config, dequantize, get_codec, quantize
from .errors import (
    BlockShapeError,
    ConfigError,
    EncodedLengthError,
    NonFiniteError,
    ScaleOverflowError,
    TbqError,
    TbqTypeError,
    TbqValueError,
)
from .formats import FORMATS, FormatInfo, format_info, format_names, get_format

__all__ = [
    "__version__",
    "formats",
    "format_names",
    "format_info",
    "get_format",
    "FORMATS",
    "FormatInfo",
    "get_codec",
    "codec_from_config",
    "quantize",
    "dequantize",
    "Codec",
    "Codebook",
    "TbqError",
    "TbqValueError",
    "TbqTypeError",
    "BlockShapeError",
    "EncodedLengthError",
    "NonFiniteError",
    "ScaleOverflowError",
    "ConfigError",
]
