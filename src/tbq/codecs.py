"""Codec objects, the explicit registry, and the public shortcuts.

A codec is a format (:mod:`tbq.formats`) with execution settings. Its
configuration is plain JSON data (the numcodecs pattern):
``get_codec(name, **config)`` builds one, ``codec.get_config()`` returns the
dict (including ``name``) and ``codec_from_config(config)`` rebuilds an equal
codec. This module validates, chunks (threads: :mod:`tbq.parallel`) and checks ``out=``; the
arithmetic is the format's (NumPy reference or numba kernels, byte-identical)
and is reached without ever branching on the format's name.

Arrays follow the ggml row layout: ``x`` of shape ``(..., n)`` with ``n`` a
multiple of the block size encodes to uint8 of shape
``(..., n // block_size * type_size)``, blocks back to back.

Why one module of this length: :class:`Codec` is its one concept; the input validation, the
chunking over threads and the registry of codec classes are what make a format a codec.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, NoReturn

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .backend import BACKENDS, STATUS_NONFINITE, STATUS_OK, numba_available, resolve_backend
from .errors import (
    BlockShapeError,
    ConfigError,
    EncodedLengthError,
    NonFiniteError,
    TbqTypeError,
    TbqValueError,
    check_int,
    deprecated_names,
)
from .formats import FORMATS, Format, FormatInfo, format_class, format_info, format_name
from .formats.base import InfoSizes
from .parallel import default_threads, fork_safe_lock, run_chunks

__all__ = [
    "Codec",
    "Q8_0Codec",
    "Q4_0Codec",
    "TBQ4_0Codec",
    "TBQ3_0Codec",
    "get_codec",
    "codec_from_config",
    "codec_from",
    "register_codec",
    "codec_class",
    "quantize",
    "dequantize",
    "clear_caches",
    "resolve_backend",
    "numba_available",
    "BACKENDS",
    "ON_OVERFLOW",
]

ON_OVERFLOW = ("raise", "inf")

#: Values per work chunk of the numba backend: bounds temporaries (dtype
#: conversion, gathering a non-contiguous input) and is the unit handed to
#: worker threads.
CHUNK_VALUES = 1 << 20
#: Values per work chunk of the NumPy backend, whose array expressions each make a
#: temporary: small enough that they stay in cache (about 2x faster than 1M).
NUMPY_CHUNK_VALUES = 1 << 15
#: With several threads, arrays smaller than ``threads * CHUNK_VALUES`` are split
#: into one chunk per thread, but no chunk is made smaller than this many values:
#: below it, handing work to a thread costs more than it saves. Decoding is about
#: ten times cheaper per value than encoding, so its minimum is larger.
MIN_CHUNK_VALUES = {"encode": 1 << 17, "decode": 1 << 20}
#: Calls up to this many values are a single chunk on one thread whatever the
#: settings (see ``Codec.encode``), so a C-contiguous input takes the short path.
_FAST_VALUES = {k: min(v, CHUNK_VALUES) for k, v in MIN_CHUNK_VALUES.items()}
_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)

# ---------------------------------------------------------------------------
# Caches of data-independent work: format instances and the shortcuts' codecs
# ---------------------------------------------------------------------------


class _Uncacheable(Exception):
    """An option value :func:`_option_key` cannot turn into a value key (the object is then built afresh)."""


def _option_key(v: Any) -> Hashable:
    """A hashable key that equals another's exactly when the two option values are the same data.

    Every key carries the value's exact type, so ``True``, ``1``, ``1.0`` and
    ``np.int64(1)`` never share an entry (``signs=True`` must still raise),
    and floats compare by their bits (``-0.0`` is not ``0.0``). Arrays are
    keyed by dtype, shape and bytes, so an array mutated after a call is a
    new key; lists, tuples and dicts by their items; frozen dataclasses (a
    :class:`~tbq.codebooks.Codebook`) by their fields. Anything else (object
    arrays, mutable objects of unknown kinds) raises :class:`_Uncacheable`.
    """
    t = type(v)
    if t is str or t is int or t is bool or v is None:
        return (t, v)
    if t is float:
        return (t, v.hex())
    if isinstance(v, np.ndarray):
        if v.dtype.hasobject:
            raise _Uncacheable
        return (t, v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, np.generic) and not isinstance(v, np.object_):
        return (t, v.dtype.str, v.tobytes())
    if t is tuple or t is list:
        return (t, tuple(_option_key(e) for e in v))
    if t is dict:
        return (t, tuple((_option_key(k), _option_key(e)) for k, e in v.items()))
    params = getattr(t, "__dataclass_params__", None)
    if params is not None and params.frozen:
        return (t, tuple(_option_key(getattr(v, f.name)) for f in dataclasses.fields(v)))
    raise _Uncacheable


def _private_copy(v: Any) -> Any:
    """``v`` with every array, list and dict copied: a cached object must not alias the caller's mutable data."""
    if isinstance(v, np.ndarray):
        return v.copy()
    if type(v) is list:
        return [_private_copy(e) for e in v]
    if type(v) is tuple:
        return tuple(_private_copy(e) for e in v)
    if type(v) is dict:
        return {k: _private_copy(e) for k, e in v.items()}
    return v


class _LRU:
    """A small thread-safe least-recently-used map (building twice in a race is harmless).

    Its lock is rebuilt in a forked child (:func:`tbq.parallel.fork_safe_lock`).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.data: OrderedDict[Hashable, Any] = OrderedDict()
        self.lock = fork_safe_lock()

    def get(self, key: Hashable) -> Any:
        with self.lock:
            v = self.data.get(key)
            if v is not None:
                self.data.move_to_end(key)
            return v

    def put(self, key: Hashable, value: Any) -> None:
        with self.lock:
            self.data[key] = value
            self.data.move_to_end(key)
            while len(self.data) > self.size:
                self.data.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.data.clear()


#: ``(format name, option key) -> Format``: building a format (TBQ: resolving the
#: codebook and the sign tables, the kernel tables) does not depend on the data,
#: so it happens once per distinct configuration.
_FORMAT_CACHE = _LRU(256)
#: ``(format name, config key) -> Codec`` for :func:`quantize` / :func:`dequantize`
#: (private: never handed to the caller, who could change its settings).
_CODEC_CACHE = _LRU(256)


def _build_format(name: str, options: dict[str, Any]) -> Format:
    """The format ``name`` with ``options``, from the cache when the same options were seen before."""
    cls: type[Format] = format_class(name)
    options = cls.check_options(
        options
    )  # the declared options, validated (an unknown one names the formats that take it)
    key: tuple[Hashable, ...]
    if not options:
        key = (name,)
    else:
        try:
            key = (name, _option_key(options))
        except _Uncacheable:
            return cls(**options)
    fmt = _FORMAT_CACHE.get(key)
    if fmt is None:
        fmt = cls(**_private_copy(options)) if options else cls()
        _FORMAT_CACHE.put(key, fmt)
    return fmt


def clear_caches() -> None:
    """Forget the cached formats and codecs (they are rebuilt on the next call; results never change)."""
    _FORMAT_CACHE.clear()
    _CODEC_CACHE.clear()


class _Blocks:
    """Blocks ``[s, e)`` of an array whose last axis is whole blocks, as a C-contiguous 2-D array.

    A C-contiguous input is viewed as ``(nblocks, width)`` without a copy. Any
    other layout is gathered a few rows at a time, so that memory stays
    bounded by the chunk rather than by the whole array. ``dtype`` converts
    (float16/float64/other byte orders to native float32) chunk by chunk too.
    """

    def __init__(self, a: NDArray[Any], width: int, dtype: DTypeLike) -> None:
        self.a, self.width, self.dtype = a, width, np.dtype(dtype)
        n = a.shape[-1]
        self.per_row = n // width if width else 0
        self.lead = a.shape[:-1]
        self.flat = a.reshape(-1, width) if a.flags.c_contiguous else None
        self.n = int(np.prod(self.lead, dtype=np.int64)) * self.per_row

    def raw(self, s: int, e: int) -> np.ndarray:
        """Blocks ``[s, e)`` in the input's own dtype (a view where possible)."""
        if self.flat is not None:
            return self.flat[s:e]
        r0, r1 = s // self.per_row, -(-e // self.per_row)
        rows = self.a[np.unravel_index(np.arange(r0, r1), self.lead)] if self.lead else self.a[None, :]
        return rows.reshape(-1, self.width)[s - r0 * self.per_row : e - r0 * self.per_row]

    def get(self, s: int, e: int) -> np.ndarray:
        with np.errstate(over="ignore"):  # float64 beyond float32 becomes Inf: reported by the caller
            return np.ascontiguousarray(self.raw(s, e), dtype=self.dtype)


_TooHardError = getattr(np, "exceptions", np).TooHardError


def _check_overlap(out: np.ndarray, a: np.ndarray, what: str) -> None:
    """Refuse an ``out`` that shares memory with the input: chunks would read what was already written."""
    if not np.may_share_memory(out, a):
        return
    try:
        overlap = np.shares_memory(out, a, max_work=100_000)  # type: ignore[arg-type]  # any bound works; NumPy stubs list only -1/0
    except _TooHardError:  # pragma: no cover - only for exotic strides
        overlap = True
    if overlap:
        raise TbqValueError(f"out shares memory with the {what}; pass a separate output array (or none)")


# ---------------------------------------------------------------------------
# Codec base class
# ---------------------------------------------------------------------------


class ConfigIdentity:
    """Equality, hash and repr from ``get_config()``, shared by the codec classes (:class:`Codec` and
    :class:`tbq.numcodecs.TbqCodec`): two codecs of one family (the class that first takes this one as a base, and
    its subclasses) are equal when their configs are, and the repr spells the config as keyword arguments, leaving out
    :attr:`_config_key`, the format, which the class's name already says."""

    _config_key = "name"  #: the config entry naming the format
    _family: type[ConfigIdentity]  #: set for each class that takes this one as a base

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if ConfigIdentity in cls.__bases__:
            cls._family = cls

    def get_config(self) -> dict[str, Any]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, self._family):
            return NotImplemented
        return self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(repr(self))

    def __repr__(self) -> str:
        cfg = self.get_config()
        del cfg[self._config_key]
        args = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
        return f"{type(self).__name__}({args})"


class Codec(ConfigIdentity, InfoSizes):
    """A block format with its configuration: ``Codec("q8_0", backend="numpy")``.

    The per-format classes (``Q8_0Codec``, ``TBQ4_0Codec``, ... from :func:`codec_class`)
    fix the format; :func:`get_codec` is the usual way to build one.

    Parameters
    ----------
    fmt : str, optional
        The format name (implied by a per-format class).
    backend : {"numba", "numpy"}, optional
        Execution setting (keyword-only, as the next two, common to every
        format): ``"numba"`` (default when numba imports) or ``"numpy"`` (the
        reference). Both give identical bytes and identical float32 bits.
    threads : int, optional
        Worker threads for the numba backend (default ``None`` = all cores).
        Results do not depend on it.
    on_overflow : str, optional
        ``"raise"`` (default) raises :class:`ScaleOverflowError` when a
        block's scale rounds to fp16 infinity (``|d| >= 65520``); ``"inf"``
        stores the infinite scale as the C code does. A format may offer more
        choices (``Format.overflow_modes``: FP8's ``"saturate"``).
    **format_options
        The format's own options (TBQ: ``codebook``, ``signs``; see
        :func:`tbq.formats.get_format`).
    """

    name: str = ""
    info: FormatInfo

    def __init__(
        self,
        fmt: str | None = None,
        *,
        backend: str | None = None,
        threads: int | None = None,
        on_overflow: str = "raise",
        **format_options: Any,
    ) -> None:
        if fmt is not None and fmt != self.name:
            canonical = format_name(fmt)
            if self.name and canonical != self.name:
                raise ConfigError(f"{type(self).__name__} is the {self.name} codec, not {fmt!r}")
            self.name = canonical
            self.info = FORMATS[canonical]
        if not self.name:
            raise ConfigError("Codec needs a format name, e.g. Codec('q8_0')")
        #: the :class:`tbq.formats.Format` with this codec's format options
        self.format: Format = _build_format(self.name, format_options)
        #: the instance's sizes: a format option may change them (vLLM's ``head_dim``), so the codec reads the
        #: format instance's :class:`FormatInfo`, not the registry's row of the class
        self.info = self.format.info
        self.backend = resolve_backend(backend)
        self.threads = (
            None
            if threads is None
            else check_int(
                threads, "threads", lo=1, expected="a positive integer or None (all cores)", error=ConfigError
            )
        )
        modes = self.format.overflow_modes
        if not isinstance(on_overflow, str) or on_overflow not in modes:
            raise ConfigError(f"on_overflow must be one of {modes} for {self.name}, got {on_overflow!r}")
        self.on_overflow = on_overflow
        self._overflow_kw = self.format.overflow_kw(on_overflow)

    @property
    def bits_per_value(self) -> float:
        """Storage cost including the per-block scale, e.g. 4.125 for tbq4_0."""
        return self.info.bits_per_value

    def __getattr__(self, attr: str) -> Any:
        # Format-level attributes (TBQ's ``codebook``, ``rotation``) read through to the format.
        if attr.startswith("_") or attr == "format":
            raise AttributeError(attr)
        try:
            return getattr(self.__dict__["format"], attr)
        except (KeyError, AttributeError):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}") from None

    # -- config --
    def _format_config(self) -> dict[str, Any]:
        return self.format.config()

    def get_config(self) -> dict[str, Any]:
        """Plain JSON-serialisable config, including ``name``; see :func:`codec_from_config`."""
        cfg: dict[str, Any] = {"name": self.name}
        cfg.update(self._format_config())
        cfg.update(backend=self.backend, threads=self.threads, on_overflow=self.on_overflow)
        return cfg

    # -- encode --
    def _n_threads(self) -> int:
        return self.threads if self.threads is not None else default_threads()

    def encode(self, x: ArrayLike, out: NDArray[np.uint8] | None = None) -> NDArray[np.uint8]:
        """Encode float values to bytes.

        ``x``: float32 (float16 and float64 are converted to float32 first) of
        any shape whose last axis is a multiple of :attr:`block_size`. Returns
        uint8 of shape ``x.shape[:-1] + (n // block_size * type_size,)``,
        written into ``out`` when given (uint8, that shape, C-contiguous).
        """
        if out is None and type(x) is np.ndarray and x.dtype is _F32 and self.backend == "numba":
            # Fast path for small calls (a fuzzer's one to four blocks): one chunk, no thread,
            # no gathering; the same kernel call and the same errors as below.
            n = x.shape[-1] if x.ndim else 0
            bs = self.info.block_size
            if x.ndim and 0 < x.size <= _FAST_VALUES["encode"] and n % bs == 0 and x.flags.c_contiguous:
                ts = self.info.type_size
                out = np.empty(x.shape[:-1] + (n // bs * ts,), np.uint8)
                fmt = self.format
                x2 = x.reshape(-1, bs)
                if fmt.row_rule:
                    b, status = fmt.kernel_encode(  # type: ignore[call-arg]  # a row-rule format's kernel takes row_blocks
                        x2, out.reshape(-1, ts), self.on_overflow == "raise", row_blocks=n // bs, **self._overflow_kw
                    )
                else:
                    b, status = fmt.kernel_encode(
                        x2, out.reshape(-1, ts), self.on_overflow == "raise", **self._overflow_kw
                    )
                if status != STATUS_OK:
                    self._raise_encode_error(_Blocks(x, bs, np.float32), int(b), int(status))
                return out
        x = _check_float_input(x)
        bs = self.block_size
        src, out, out2 = self._blocks_io(x, "values", out)
        nblocks = src.n
        raise_overflow = self.on_overflow == "raise"
        fmt = self.format
        # A row-rule format sees whole rows: chunks (and threads) split only between rows.
        unit = max(1, src.per_row) if fmt.row_rule else 1
        row_kw = {**fmt._row_kw(unit), **self._overflow_kw}
        chunk = max(1, (CHUNK_VALUES if self.backend == "numba" else NUMPY_CHUNK_VALUES) // (bs * unit))

        def work(su: int, eu: int) -> tuple[int, int] | None:
            s, e = su * unit, eu * unit
            xc = src.get(s, e)
            if self.backend == "numba":
                b, status = fmt.kernel_encode(xc, out2[s:e], raise_overflow, **row_kw)
                return None if status == STATUS_OK else (s + int(b), int(status))
            if np.isfinite(xc).all():
                first_bad = e - s
            else:
                first_bad = int(np.argmax(~np.isfinite(xc).all(axis=1)))
            # Encode through the end of the row holding the first non-finite block: a row-rule
            # block depends only on earlier blocks of its row, so the blocks before the bad one
            # come out exactly as without it (what follows is discarded).
            keep = -(-first_bad // unit) * unit
            with np.errstate(all="ignore"):
                data, trace = fmt.reference_encode(xc[:keep], **row_kw)
            if raise_overflow:
                refused = np.asarray(fmt.invalid_blocks(trace))[:first_bad]
                if refused.size and refused.any():
                    i = int(np.argmax(refused != 0))
                    out2[s : s + i] = data[:i]
                    return (s + i, int(refused[i]))

            out2[s : s + first_bad] = data[:first_bad]
            return None if first_bad == e - s else (s + first_bad, STATUS_NONFINITE)

        threads = self._n_threads() if self.backend == "numba" else 1
        n_units = nblocks // unit if unit else 0
        min_units = max(1, MIN_CHUNK_VALUES["encode"] // (bs * unit))
        for r in run_chunks(n_units, chunk, threads, work, min_units):
            if r is not None:
                self._raise_encode_error(src, *r)
        return out

    def _raise_encode_error(self, src: _Blocks, block: int, kind: int) -> NoReturn:
        vals = src.get(block, block + 1)[0]
        if kind == STATUS_NONFINITE:
            j = int(np.argmax(~np.isfinite(vals)))
            orig = src.raw(block, block + 1)[0][j]
            shown = repr(float(orig))  # the value, never a NumPy repr such as np.float32(inf)
            what = shown if not np.isfinite(orig) else f"{shown}, which overflows float32"
            raise NonFiniteError(
                f"{self.name}: input block {block} holds a non-finite value "
                f"({what} at position {j} of the block, i.e. flat value index {block * self.block_size + j}); "
                "NaN and Inf cannot be encoded",
                block=block,
            )
        raise self.format.encode_error(kind, block, vals)

    def _blocks_io(self, a: NDArray[Any], unit: str, out: Any) -> tuple[_Blocks, NDArray[Any], NDArray[Any]]:
        """The blocks of a checked input ``a`` of ``unit`` ("values" to encode, "bytes" to decode), the output (new,
        or ``out`` checked) and the output as one block a row; a last axis of partial blocks is refused."""
        encoding = unit == "values"
        size_in, size_out = (self.block_size, self.type_size) if encoding else (self.type_size, self.block_size)
        n = a.shape[-1]
        problem = partial_blocks(n, size_in, unit)
        if problem:
            raise (BlockShapeError if encoding else EncodedLengthError)(f"{self.name}: {problem}")
        out_dtype = np.uint8 if encoding else np.float32
        out = _check_out(
            out, a.shape[:-1] + (n // size_in * size_out,), out_dtype, a, "input" if encoding else "encoded data"
        )
        return _Blocks(a, size_in, np.float32 if encoding else np.uint8), out, out.reshape(-1, size_out)

    # -- decode --
    def decode(
        self, data: ArrayLike | bytes | bytearray | memoryview, out: NDArray[np.float32] | None = None
    ) -> NDArray[np.float32]:
        """Decode bytes to float32.

        ``data``: uint8 array (or a bytes-like object) whose last axis is a
        multiple of :attr:`type_size`. Returns float32 of shape
        ``data.shape[:-1] + (nbytes // type_size * block_size,)``, written into
        ``out`` when given. Any byte content decodes: fp16 scales that are
        Inf, NaN or subnormal give what the C decoder gives (Inf/NaN products).
        """
        if out is None and type(data) is np.ndarray and data.dtype is _U8 and self.backend == "numba":
            nbytes = data.shape[-1] if data.ndim else 0
            ts = self.info.type_size
            if (
                data.ndim
                and data.size > 0
                and nbytes % ts == 0
                and data.size // ts * self.info.block_size <= _FAST_VALUES["decode"]
                and data.flags.c_contiguous
            ):
                bs = self.info.block_size
                out = np.empty(data.shape[:-1] + (nbytes // ts * bs,), np.float32)
                self.format.kernel_decode(data.reshape(-1, ts), out.reshape(-1, bs))
                return out
        data = _check_byte_input(data)
        bs = self.block_size
        src, out, out2 = self._blocks_io(data, "bytes", out)
        chunk = max(1, (CHUNK_VALUES if self.backend == "numba" else NUMPY_CHUNK_VALUES) // bs)
        fmt = self.format

        def work(s: int, e: int) -> None:
            if self.backend == "numba":
                fmt.kernel_decode(src.get(s, e), out2[s:e])
            else:
                with np.errstate(all="ignore"):
                    out2[s:e] = fmt.reference_decode(src.get(s, e))

        threads = self._n_threads() if self.backend == "numba" else 1
        run_chunks(src.n, chunk, threads, work, max(1, MIN_CHUNK_VALUES["decode"] // bs))
        return out


def _check_float_input(x: ArrayLike) -> NDArray[Any]:
    if isinstance(x, np.ndarray):
        a = x
    else:
        try:
            a = np.asarray(x)
        except Exception as exc:
            raise TbqTypeError(f"input must be array-like of floats: {exc}") from None
    if a.dtype.kind != "f" or a.dtype.itemsize not in (2, 4, 8):
        raise TbqTypeError(
            f"input must be float32 (float16 and float64 are converted), got dtype {a.dtype}; "
            "integer, bool, complex and object arrays are rejected rather than guessed at"
        )
    if a.ndim == 0:
        raise BlockShapeError("input must have at least one axis (a row of values), got a scalar")
    return a


def _check_byte_input(data: Any) -> NDArray[np.uint8]:
    if isinstance(data, (bytes, bytearray)):
        a = np.frombuffer(data, dtype=np.uint8)
    else:  # a memoryview keeps its item type, so a view of float32 is refused below
        a = np.asarray(data)
    if a.dtype != np.uint8:
        raise TbqTypeError(f"encoded data must be uint8, got dtype {a.dtype}")
    if a.ndim == 0:
        raise EncodedLengthError("encoded data must have at least one axis, got a scalar")
    return a


def partial_blocks(n: int, size: int, unit: str) -> str:
    """``""`` when a last axis of ``n`` ``unit`` ("values", "bytes") is whole blocks of ``size`` of them, else what
    every codec front end (:class:`Codec`, :mod:`tbq.dask`) says of it: how many whole blocks and how many left over.

    >>> partial_blocks(64, 32, "values")
    ''
    >>> partial_blocks(35, 34, "bytes")
    "the last axis has 35 bytes, which is not a multiple of the block's 34 bytes (1 whole blocks and 1 bytes left over)"
    """
    if not n % size:
        return ""
    block = f"the block size {size}" if unit == "values" else f"the block's {size} bytes"
    return (
        f"the last axis has {n} {unit}, which is not a multiple of {block} "
        f"({n // size} whole blocks and {n % size} {unit} left over)"
    )


def _check_out(out: Any, shape: tuple[int, ...], dtype: DTypeLike, source: NDArray[Any], what: str) -> NDArray[Any]:
    """A new output array, or ``out`` checked for dtype, shape, layout and overlap with ``source``."""
    if out is None:
        return np.empty(shape, dtype)
    if not isinstance(out, np.ndarray):
        raise TbqTypeError(f"out must be a numpy array, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TbqTypeError(f"out must have dtype {np.dtype(dtype)}, got {out.dtype}")
    if out.shape != shape:
        raise TbqValueError(f"out must have shape {shape}, got {out.shape}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise TbqValueError("out must be C-contiguous and writeable")
    _check_overlap(out, source, what)
    return out


# ---------------------------------------------------------------------------
# Per-format codec classes and the registry
# ---------------------------------------------------------------------------

_CLASSES: dict[str, type] = {}


def codec_class(name: str) -> type:
    """The codec class of format ``name`` (built once from the format registry).

    The class is named ``<FORMAT>Codec`` (``Q8_0Codec``): the format's own class is
    :class:`tbq.formats.q8_0.Q8_0`, the numcodecs codec ``tbq.numcodecs.Q8_0Numcodec``.

    >>> codec_class("q8_0")(backend="numpy")
    Q8_0Codec(backend='numpy', threads=None, on_overflow='raise')
    """
    name = format_name(name)
    if name not in _CLASSES:
        info = format_info(name)
        parts = (f"{info.description}.", format_class(name).__doc__, Codec.__doc__)
        doc = "\n\n".join(inspect.cleandoc(p) for p in parts if p)  # one indentation, so it renders as reST
        cls_name = f"{name.upper()}Codec"
        _CLASSES[name] = type(
            cls_name,
            (Codec,),
            {"name": name, "info": info, "__doc__": doc, "__module__": __name__, "__qualname__": cls_name},
        )
    return _CLASSES[name]


def register_codec(cls: type[Codec]) -> type[Codec]:
    """Use ``cls`` (a :class:`Codec` subclass with a registered format ``name``) for that format."""
    if cls.name not in FORMATS:
        raise ConfigError(f"{cls.__name__}.name = {cls.name!r} is not in the format table")
    _CLASSES[cls.name] = cls
    return cls


Q8_0Codec = codec_class("q8_0")
Q4_0Codec = codec_class("q4_0")
TBQ4_0Codec = codec_class("tbq4_0")
TBQ3_0Codec = codec_class("tbq3_0")

#: The old spellings of the four classes above, which shared their names with the formats' classes
#: (``tbq.formats.q8_0.Q8_0``) and the numcodecs codecs: still served, with a DeprecationWarning.
_DEPRECATED_NAMES = {"Q8_0": "Q8_0Codec", "Q4_0": "Q4_0Codec", "TBQ4_0": "TBQ4_0Codec", "TBQ3_0": "TBQ3_0Codec"}


__getattr__ = deprecated_names(__name__, _DEPRECATED_NAMES, globals().__getitem__)


def get_codec(name: str, **config: Any) -> Codec:
    """Build the codec ``name`` with keyword configuration.

    >>> get_codec("tbq3_0", codebook="turboq-mtp", signs=7, backend="numpy").get_config()["signs"]
    7
    """
    cls = codec_class(name)  # raises ConfigError with the list of formats
    try:
        return cls(**config)
    except TypeError as exc:
        raise ConfigError(f"bad configuration for {name}: {exc}") from None


#: Keys of a codec config that are execution settings, not format options.
EXECUTION_SETTINGS = ("backend", "threads", "on_overflow")


def codec_from(fmt: str, config: dict[str, Any] | None = None, **settings: Any) -> Codec:
    """The codec of ``fmt`` with the format options of ``config`` and the execution ``settings``.

    ``config`` may be a :meth:`Codec.get_config` dict (its ``name`` must match
    and its ``backend``/``threads`` are dropped: the caller's ``settings``
    decide where it runs) or a plain dict of format options.

    >>> codec_from("tbq4_0", {"name": "tbq4_0", "signs": 7, "backend": "numba"}, backend="numpy")
    TBQ4_0Codec(codebook='lloyd-max', signs=7, backend='numpy', threads=None, on_overflow='raise')
    """
    cfg = dict(config or {})
    fmt = format_name(fmt)
    name = cfg.pop("name", fmt)
    if format_name(name) != fmt:
        raise ConfigError(f"the config is for {name!r}, not {fmt!r}")
    for key in ("backend", "threads"):
        cfg.pop(key, None)
    cfg.update(settings)
    return get_codec(fmt, **cfg)


def codec_from_config(config: dict[str, Any]) -> Codec:
    """Inverse of :meth:`Codec.get_config`."""
    if not isinstance(config, dict) or "name" not in config:
        raise ConfigError(f"a codec config is a dict with a 'name' key, got {config!r}")
    cfg = dict(config)
    return get_codec(cfg.pop("name"), **cfg)


def _shortcut_codec(fmt: str, config: dict[str, Any]) -> Codec:
    """The codec of :func:`quantize` / :func:`dequantize`: built once per distinct configuration.

    ``backend=None`` resolves the same way on every call (numba when it
    imports) and ``threads=None`` is read at call time, so a cached codec
    behaves exactly like a new one.
    """
    try:
        key = (fmt, _option_key(config)) if config else (fmt,)
        hash(key)
    except (_Uncacheable, TypeError):
        return get_codec(fmt, **config)
    codec = _CODEC_CACHE.get(key)
    if codec is None:
        codec = get_codec(fmt, **config)
        _CODEC_CACHE.put(key, codec)
    return codec


def quantize(x: ArrayLike, fmt: str, *, out: NDArray[np.uint8] | None = None, **config: Any) -> NDArray[np.uint8]:
    """Encode ``x`` (float, last axis a multiple of the block size) in format ``fmt``.

    The codec of a configuration is built once and reused (:func:`clear_caches`).

    >>> quantize(np.ones((3, 64), np.float32), "q4_0").shape
    (3, 36)
    """
    return _shortcut_codec(fmt, config).encode(x, out=out)


def dequantize(
    data: ArrayLike, fmt: str, *, out: NDArray[np.float32] | None = None, **config: Any
) -> NDArray[np.float32]:
    """Decode uint8 ``data`` (last axis a multiple of the type size) in format ``fmt`` to float32.

    >>> dequantize(quantize(np.ones((3, 64), np.float32), "q4_0"), "q4_0")[0, :3]
    array([1., 1., 1.], dtype=float32)
    """
    return _shortcut_codec(fmt, config).decode(data, out=out)
