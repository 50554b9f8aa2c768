"""tbq: bit-exact reference codecs for KV-cache block quantization.

Formats: ggml's Q8_0 and Q4_0, and the rotated TBQ4_0 / TBQ3_0 (randomized
Walsh-Hadamard transform + Lloyd-Max codebook). See ``docs/formats.md``.

>>> import numpy as np, tbq
>>> x = np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 128)
>>> q = tbq.quantize(x, "tbq4_0")
>>> q.shape, q.dtype
((2, 66), dtype('uint8'))
>>> tbq.dequantize(q, "tbq4_0").shape
(2, 128)
"""

__version__ = "0.1.0"

from .errors import (  # noqa: E402
    BlockShapeError,
    ConfigError,
    EncodedLengthError,
    NonFiniteError,
    ScaleOverflowError,
    TbqError,
    TbqTypeError,
    TbqValueError,
)
from .formats import FORMATS, FormatInfo, format_info, formats, get_format  # noqa: E402
from .codebooks import Codebook  # noqa: E402
from .codecs import Codec, codec_from_config, dequantize, get_codec, quantize  # noqa: E402

__all__ = [
    "__version__",
    "formats",
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
