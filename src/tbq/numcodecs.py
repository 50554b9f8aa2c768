"""numcodecs and Zarr 3 codecs for the tbq block formats (optional extra ``zarr``).

Importing this module registers, with numcodecs, one :class:`numcodecs.abc.Codec`
subclass per registered format (every format of :func:`tbq.formats`, plugins
included), for example:

==============  ===================  ===================================
codec id        class                what it stores
==============  ===================  ===================================
``tbq.q8_0``    ``Q8_0Numcodec``     ggml Q8_0 blocks (8.5 bits/value)
``tbq.q4_0``    ``Q4_0Numcodec``     ggml Q4_0 blocks (4.5 bits/value)
``tbq.tbq4_0``  ``TBQ4_0Numcodec``   TBQ4_0 blocks (4.125 bits/value)
``tbq.tbq3_0``  ``TBQ3_0Numcodec``   TBQ3_0 blocks (3.125 bits/value)
==============  ===================  ===================================

(named ``<FORMAT>Numcodec``; the old names ``Q8_0``, ``TBQ4_0``, ... still work,
with a :class:`DeprecationWarning`: the formats' own classes have them)

and, when Zarr >= 3 is installed, the Zarr 3 *serializer* (array -> bytes codec)
:class:`ZarrCodec` under the same names. Nothing here is imported by
``import tbq``: numcodecs and zarr are optional dependencies.

Configuration
-------------
A codec's configuration is the core codec configuration
(:meth:`tbq.Codec.get_config`: ``backend``, ``threads``, ``on_overflow`` and
each format's own options: TBQ's ``codebook`` and ``signs``, FP8's ``scale``)
with the core ``name`` replaced by the numcodecs ``id``::

    >>> import tbq.numcodecs as tn
    >>> tn.Q4_0Numcodec(backend="numpy").get_config()
    {'id': 'tbq.q4_0', 'backend': 'numpy', 'threads': None, 'on_overflow': 'raise'}

``tbq.codec_from_config({"name": fmt, **config_without_id})`` rebuilds the
core codec (also available as :attr:`TbqCodec.codec`).

Encoded layout (how the shape is carried)
-----------------------------------------
A lossy float -> bytes codec must know the chunk's shape to decode it, and a
numcodecs codec sees nothing but the buffer. Every encoded buffer therefore
starts with a small header followed by exactly the bytes
``tbq.quantize(x, fmt)`` gives (C order)::

    offset      size      field
    0           4         magic b"TBQ\\x00"
    4           1         header version, 1
    5           1         format code (FormatInfo.code): 1 q8_0, 2 q4_0, ... 18 fp8_e5m2
    6           1         ndim (1..32) of the float array
    7           1         reserved, 0
    8           8*ndim    shape of the float array, uint64 little-endian
    8+8*ndim    ...       payload: prod(shape[:-1]) rows of
                          shape[-1] / block_size * type_size bytes

So a 3-D chunk costs 32 header bytes (0.1 % of a 64 x 8 x 128 TBQ4_0 chunk).
The format code lets :meth:`TbqCodec.decode` refuse bytes written by a
different format; the codebook and signs of a TBQ format are not in the
header (they are in the configuration, which Zarr stores in the array
metadata). The header is pinned by the stored fixtures in
``tests/data/numcodecs_fixtures``.

Input to ``encode``: a float16/float32/float64 NumPy array of any shape whose
last axis is a multiple of the block size (the blocks run along the last axis,
as in :func:`tbq.quantize`). Any other object exporting the buffer protocol
(``bytes``, ``bytearray``, ``array.array``...) whose items are not floats is
read as raw native float32 values forming one row, which is what numcodecs
codecs conventionally accept. ``decode`` always returns float32 of the stored
shape (or fills ``out``).
"""

from __future__ import annotations

import asyncio
import math
import struct
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

try:
    from numcodecs.abc import Codec as _NumcodecsCodec
    from numcodecs.compat import ensure_contiguous_ndarray, ndarray_copy
    from numcodecs.registry import get_codec as _numcodecs_get_codec
    from numcodecs.registry import register_codec as _numcodecs_register
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tbq.numcodecs needs the optional dependency numcodecs; install it with `pip install 'tbq[zarr]'`"
    ) from _exc

from .codecs import Codec as _CoreCodec
from .codecs import ConfigIdentity
from .codecs import get_codec as _core_get_codec
from .errors import BlockShapeError, ConfigError, EncodedLengthError, TbqTypeError, TbqValueError, deprecated_names
from .formats import FORMATS, FormatInfo, format_name
from .formats.base import InfoSizes

__all__ = [
    "TbqCodec",
    "CODEC_IDS",
    "FORMAT_CODES",
    "MAGIC",
    "HEADER_VERSION",
    "header_size",
    "encoded_size",
    "read_header",
    "get_numcodec",
    "zarr_codec",
    "ZarrCodec",
]

MAGIC = b"TBQ\x00"
HEADER_VERSION = 1
#: Format code stored at byte 5 of the header: each format's registry ``code``, fixed forever.
FORMAT_CODES = {name: info.code for name, info in FORMATS.items()}
_CODE_FORMATS = {v: k for k, v in FORMAT_CODES.items()}
#: numcodecs codec id (and Zarr 3 codec name) of each format.
CODEC_IDS = {fmt: f"tbq.{fmt}" for fmt in FORMAT_CODES}
_FIXED = struct.Struct("<4sBBBB")
_MAX_NDIM = 32


def header_size(ndim: int) -> int:
    """Bytes of the header for a float array with ``ndim`` axes: ``8 + 8 * ndim``."""
    return _FIXED.size + 8 * int(ndim)


def encoded_size(shape: Any, fmt: str, **config: Any) -> int:
    """Total encoded bytes (header + payload) of a float array of ``shape`` in ``fmt`` with ``config`` (the keyword
    arguments of :func:`tbq.get_codec`: a format option may change the block's sizes, vLLM's ``head_dim``).

    >>> encoded_size((4, 128), "vllm_tq4_k"), encoded_size((4, 128), "vllm_tq4_k", head_dim=64)
    (288, 296)
    """
    info = _core_get_codec(fmt, **config).info
    return _encoded_size(shape, info.block_size, info.type_size)


def _encoded_size(shape: Any, block_size: int, type_size: int) -> int:
    shape = tuple(int(s) for s in shape)
    rows = math.prod(shape[:-1])
    return header_size(len(shape)) + rows * (shape[-1] // block_size * type_size)


def _pack_header(fmt: str, shape: Any) -> bytes:
    return _FIXED.pack(MAGIC, HEADER_VERSION, FORMAT_CODES[fmt], len(shape), 0) + struct.pack(f"<{len(shape)}Q", *shape)


def read_header(buf: Any) -> tuple[str, tuple[int, ...], int]:
    """Parse the header of an encoded buffer: ``(format, float shape, payload offset)``.

    Raises :class:`tbq.TbqValueError` for a buffer that is not tbq-encoded and
    :class:`tbq.EncodedLengthError` when it is too short to hold its header.
    """
    b = _as_bytes_array(buf)
    if b.size < _FIXED.size:
        raise EncodedLengthError(
            f"tbq.numcodecs: an encoded buffer starts with an {_FIXED.size}-byte header, got only {b.size} bytes"
        )
    magic, version, code, ndim, _reserved = _FIXED.unpack(b[: _FIXED.size].tobytes())
    if magic != MAGIC:
        raise TbqValueError(
            f"tbq.numcodecs: not a tbq-encoded buffer (magic {magic!r}, expected {MAGIC!r}); "
            "was it written by a different codec?"
        )
    if version != HEADER_VERSION:
        raise TbqValueError(
            f"tbq.numcodecs: header version {version} is not supported (this tbq reads version {HEADER_VERSION})"
        )
    if code not in _CODE_FORMATS:
        raise TbqValueError(f"tbq.numcodecs: unknown format code {code} in the header (known: {FORMAT_CODES})")
    if not 1 <= ndim <= _MAX_NDIM:
        raise TbqValueError(f"tbq.numcodecs: header ndim {ndim} is outside 1..{_MAX_NDIM}")
    hs = header_size(ndim)
    if b.size < hs:
        raise EncodedLengthError(
            f"tbq.numcodecs: the header declares {ndim} axes ({hs} header bytes) but the buffer has only {b.size} bytes"
        )
    shape = struct.unpack(f"<{ndim}Q", b[_FIXED.size : hs].tobytes())
    return _CODE_FORMATS[code], tuple(int(s) for s in shape), hs


def _as_bytes_array(buf: Any) -> np.ndarray:
    """Any buffer-protocol object as a flat uint8 view (no copy when contiguous)."""
    return ensure_contiguous_ndarray(buf, flatten=True).reshape(-1).view(np.uint8)


def _as_float_array(buf: Any) -> np.ndarray:
    if isinstance(buf, np.ndarray):
        if buf.dtype not in (np.float16, np.float32, np.float64):
            raise TbqTypeError(
                f"tbq.numcodecs: can only encode float16/float32/float64 arrays, got dtype {buf.dtype}; "
                "an integer/bool array is rejected rather than reinterpreted (pass raw bytes to have them read as float32)"
            )
        return buf
    try:
        a = np.asarray(memoryview(buf))
    except TypeError:
        raise TbqTypeError(
            f"tbq.numcodecs: cannot encode a {type(buf).__name__}: pass a float NumPy array or a buffer of float32 bytes"
        ) from None
    if a.dtype in (np.float16, np.float32, np.float64):
        return a
    raw = a.reshape(-1).view(np.uint8) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    if raw.size % 4:
        raise BlockShapeError(
            f"tbq.numcodecs: a raw buffer is read as native float32 values, but it has {raw.size} bytes, "
            "which is not a multiple of 4"
        )
    return raw.view(np.float32)


class TbqCodec(ConfigIdentity, InfoSizes, _NumcodecsCodec):  # type: ignore[misc]  # numcodecs is untyped: its Codec base is Any
    """numcodecs codec for one tbq block format (use ``Q8_0Numcodec``, ``Q4_0Numcodec``, ... or :func:`get_numcodec`).

    Keyword arguments are those of :func:`tbq.get_codec` for the format
    (``backend``, ``threads``, ``on_overflow``; ``codebook`` and ``signs`` for
    the TBQ formats). Encoding is lossy: ``decode(encode(x))`` equals
    ``tbq.dequantize(tbq.quantize(x, fmt), fmt)`` bit for bit, reshaped to
    ``x.shape``.
    """

    codec_id: str | None = None
    fmt: str = ""
    _config_key = "id"  # equality, hash and repr from the config (ConfigIdentity), whose "id" names the format

    def __init__(self, **config: Any) -> None:
        if not self.fmt:
            raise TypeError("TbqCodec is abstract: use Q8_0Numcodec, Q4_0Numcodec, ... (or get_numcodec(fmt))")
        if "name" in config or "id" in config:
            raise ConfigError(
                f"{type(self).__name__}: pass the configuration without 'name'/'id' "
                "(use numcodecs.get_codec or tbq.numcodecs.get_numcodec for a full config dict)"
            )
        self._codec = _core_get_codec(self.fmt, **config)

    # -- facts --
    @property
    def codec(self) -> _CoreCodec:
        """The core :class:`tbq.Codec` doing the arithmetic."""
        return self._codec

    @property
    def info(self) -> FormatInfo:
        """The core codec's :class:`~tbq.formats.FormatInfo` (its sizes: ``block_size``, ``type_size``, ...)."""
        return self._codec.info

    # -- config --
    def get_config(self) -> dict[str, Any]:
        cfg = self._codec.get_config()
        del cfg["name"]
        return {"id": self.codec_id, **cfg}

    @classmethod
    def from_config(cls, config: Any) -> Any:
        cfg = dict(config)
        cid = cfg.pop("id", cls.codec_id)
        if cid != cls.codec_id and (
            not isinstance(cid, str) or not cid[:4].lower() == "tbq." or _fmt_of(cid) != cls.fmt
        ):
            raise ConfigError(f"{cls.__name__}.from_config: config id {cid!r} is not {cls.codec_id!r}")
        return cls(**cfg)

    # -- encode / decode --
    def encode(self, buf: Any) -> np.ndarray:
        """Header + ``tbq.quantize(x)`` bytes as a flat uint8 array (see the module docstring)."""
        x = _as_float_array(buf)
        if x.ndim == 0:
            raise BlockShapeError(f"{self.codec_id}: cannot encode a 0-d array; a chunk needs at least one axis")
        if x.ndim > _MAX_NDIM:
            raise BlockShapeError(f"{self.codec_id}: at most {_MAX_NDIM} axes are supported, got {x.ndim}")
        bs, ts = self.block_size, self.type_size
        n = x.shape[-1]
        if n % bs:
            raise BlockShapeError(
                f"{self.codec_id}: cannot encode a chunk of shape {x.shape}: its last axis has {n} values, "
                f"which is not a multiple of the block size {bs} ({n // bs} whole blocks and {n % bs} left over). "
                f"Use chunks whose last dimension is a multiple of {bs}"
            )
        header = _pack_header(self.fmt, x.shape)
        payload_shape = x.shape[:-1] + (n // bs * ts,)
        out = np.empty(len(header) + math.prod(payload_shape), np.uint8)
        out[: len(header)] = np.frombuffer(header, np.uint8)
        self._codec.encode(x, out=out[len(header) :].reshape(payload_shape))
        return out

    def decode(self, buf: Any, out: Any = None) -> Any:
        """float32 array of the encoded shape (written into ``out`` when given, numcodecs-style)."""
        b = _as_bytes_array(buf)
        fmt, shape, off = read_header(b)
        if fmt != self.fmt:
            raise TbqValueError(
                f"{self.codec_id}: the buffer holds {fmt} blocks (codec id {CODEC_IDS[fmt]!r}), not {self.fmt}"
            )
        bs, ts = self.block_size, self.type_size
        n = shape[-1]
        if n % bs:
            raise BlockShapeError(f"{self.codec_id}: corrupt header: last axis {n} is not a multiple of {bs}")
        payload_shape = shape[:-1] + (n // bs * ts,)
        want = math.prod(payload_shape)
        got = b.size - off
        if got != want:
            raise EncodedLengthError(
                f"{self.codec_id}: the header says shape {shape}, i.e. {want} payload bytes, "
                f"but the buffer holds {got} payload bytes (truncated or corrupt data)"
            )
        data = b[off:].reshape(payload_shape)
        if out is None:
            return self._codec.decode(data)
        if (
            isinstance(out, np.ndarray)
            and out.dtype == np.float32
            and out.flags.c_contiguous
            and out.flags.writeable
            and out.size == math.prod(shape)
        ):
            self._codec.decode(data, out=out.reshape(shape))
            return out
        dec = self._codec.decode(data)
        if isinstance(out, np.ndarray) and out.shape == dec.shape:
            np.copyto(out, dec)
            return out
        return ndarray_copy(dec, out)


def _numcodec_class(fmt: str) -> type[TbqCodec]:
    info = FORMATS[fmt]
    doc = f"{info.description} numcodecs codec (id ``tbq.{fmt}``): {info.type_size} bytes per {info.block_size} values."
    name = f"{fmt.upper()}Numcodec"
    return type(
        name,
        (TbqCodec,),
        {"codec_id": CODEC_IDS[fmt], "fmt": fmt, "__doc__": doc, "__module__": __name__, "__qualname__": name},
    )


#: One numcodecs class per format of the registry, named ``<FORMAT>Numcodec`` (``Q8_0Numcodec``, ...): the
#: format's own class is ``tbq.formats.q8_0.Q8_0``, the core codec ``tbq.codecs.Q8_0Codec``.
_CLASSES: dict[str, type[TbqCodec]] = {fmt: _numcodec_class(fmt) for fmt in FORMATS}
#: The classes by name, module globals (the formats, plugins included, decide which exist; numcodecs' repr
#: convention evaluates ``repr(codec)`` in this module's namespace).
_BY_NAME: dict[str, type[TbqCodec]] = {c.__name__: c for c in _CLASSES.values()}
globals().update(_BY_NAME)
#: The old names (``Q8_0``, the format's own name), still served with a DeprecationWarning.
_DEPRECATED_NAMES: dict[str, str] = {fmt.upper(): c.__name__ for fmt, c in _CLASSES.items()}
__all__ += list(_BY_NAME)


__getattr__ = deprecated_names(__name__, _DEPRECATED_NAMES, _BY_NAME.__getitem__)


for _cls in _CLASSES.values():
    _numcodecs_register(_cls)


def _fmt_of(name: str) -> str:
    """``"q8_0"`` or ``"tbq.q8_0"`` -> ``"q8_0"`` (ConfigError listing the choices otherwise)."""
    if isinstance(name, str):
        key = name.strip()
        fmt = key[4:] if key[:4].lower() == "tbq." else key
        try:
            fmt = format_name(fmt)  # the naming rule of docs/formats.md: any case
        except ConfigError:
            fmt = ""
        if fmt in _CLASSES:
            return fmt
    raise ConfigError(f"unknown tbq codec {name!r}; known: {', '.join(CODEC_IDS.values())} (or the bare format names)")


def get_numcodec(fmt: str, **config: Any) -> TbqCodec:
    """The numcodecs codec for ``fmt`` (``"tbq4_0"`` or ``"tbq.tbq4_0"``) with core configuration ``config``.

    Equivalent to ``numcodecs.get_codec({"id": "tbq." + fmt, **config})``.
    """
    return _numcodecs_get_codec({"id": CODEC_IDS[_fmt_of(fmt)], **config})


# ---------------------------------------------------------------------------
# Zarr 3: an array -> bytes codec ("serializer")
# ---------------------------------------------------------------------------

try:
    import zarr as _zarr
    from zarr.abc.codec import ArrayBytesCodec as _ArrayBytesCodec

    _HAVE_ZARR3 = int(_zarr.__version__.split(".")[0]) >= 3
except ImportError:  # zarr is optional even within the extra's code path
    _HAVE_ZARR3 = False


def zarr_codec(fmt: str, **config: Any) -> Any:
    """A Zarr 3 serializer for ``fmt``: ``zarr.create_array(..., serializer=zarr_codec("tbq4_0"))``.

    Requires zarr >= 3. See :class:`ZarrCodec`.
    """
    if not _HAVE_ZARR3:
        raise ImportError("tbq.numcodecs.zarr_codec needs zarr>=3; install it with `pip install 'tbq[zarr]'`")
    return ZarrCodec(fmt, **config)


if _HAVE_ZARR3:
    from zarr.core.common import parse_named_configuration as _parse_named_configuration
    from zarr.registry import register_codec as _zarr_register

    @dataclass(frozen=True)
    class ZarrCodec(_ArrayBytesCodec):
        """Zarr 3 array -> bytes codec (a *serializer*) storing each chunk in a tbq format.

        ``ZarrCodec("tbq4_0", **config)``; its metadata is
        ``{"name": "tbq.tbq4_0", "configuration": {...core config...}}`` and
        each stored chunk is exactly what :meth:`TbqCodec.encode` gives for it
        (header included), so a chunk file can be decoded without Zarr.

        The array must be float32 (the formats decode to float32) and the
        chunk's last dimension (and the array's) a multiple of the block size.
        """

        is_fixed_size = True

        name: str
        configuration: dict[str, Any]

        def __init__(self, fmt: str, **config: Any) -> None:
            numcodec = _CLASSES[_fmt_of(fmt)](**config)  # validates the configuration
            cfg = numcodec.get_config()
            object.__setattr__(self, "name", cfg.pop("id"))
            object.__setattr__(self, "configuration", cfg)

        @cached_property
        def numcodec(self) -> TbqCodec:
            """The numcodecs codec doing the work."""
            return _CLASSES[_fmt_of(self.name)](**self.configuration)

        @classmethod
        def from_dict(cls, data: dict[str, Any]) -> Any:
            name, cfg = _parse_named_configuration(data, require_configuration=False)
            return cls(name, **(cfg or {}))  # unknown names raise ConfigError listing the codecs

        def to_dict(self) -> Any:
            return {"name": self.name, "configuration": dict(self.configuration)}

        def __repr__(self) -> Any:
            return (
                f"ZarrCodec({_fmt_of(self.name)!r}, {', '.join(f'{k}={v!r}' for k, v in self.configuration.items())})"
            )

        def validate(self, *, shape: Any, dtype: Any, chunk_grid: Any) -> None:
            native = dtype.to_native_dtype()
            if native != np.dtype(np.float32):
                raise TbqTypeError(
                    f"{self.name}: a Zarr array stored with a tbq codec must be float32 (the formats decode to "
                    f"float32), got {native}; cast the data to float32 first"
                )
            bs = self.numcodec.block_size
            if not shape or shape[-1] % bs:
                raise BlockShapeError(
                    f"{self.name}: the array's last dimension must be a multiple of the block size {bs}, "
                    f"got shape {tuple(shape)}"
                )
            chunk_shape = getattr(chunk_grid, "chunk_shape", None)
            if chunk_shape is not None and chunk_shape[-1] % bs:
                raise BlockShapeError(
                    f"{self.name}: the chunks' last dimension must be a multiple of the block size {bs}, "
                    f"got chunk shape {tuple(chunk_shape)}"
                )

        def compute_encoded_size(self, input_byte_length: int, chunk_spec: Any) -> int:
            # the codec instance's sizes (a format option may change them: vLLM's head_dim), not the registry's row
            return _encoded_size(chunk_spec.shape, self.numcodec.block_size, self.numcodec.type_size)

        def _decode_sync(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
            dec = self.numcodec.decode(chunk_bytes.as_numpy_array())
            if dec.shape != tuple(chunk_spec.shape):
                raise TbqValueError(
                    f"{self.name}: a stored chunk holds shape {dec.shape}, but the array's chunks are {tuple(chunk_spec.shape)}"
                )
            return chunk_spec.prototype.nd_buffer.from_numpy_array(dec)

        def _encode_sync(self, chunk_array: Any, chunk_spec: Any) -> Any:
            enc = self.numcodec.encode(np.ascontiguousarray(chunk_array.as_numpy_array()))
            return chunk_spec.prototype.buffer.from_array_like(enc)

        async def _decode_single(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
            return await asyncio.to_thread(self._decode_sync, chunk_bytes, chunk_spec)

        async def _encode_single(self, chunk_array: Any, chunk_spec: Any) -> Any:
            return await asyncio.to_thread(self._encode_sync, chunk_array, chunk_spec)

    for _fmt in FORMAT_CODES:
        _zarr_register(CODEC_IDS[_fmt], ZarrCodec)
