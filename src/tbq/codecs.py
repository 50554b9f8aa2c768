"""Codec objects, the explicit registry, and the public shortcuts.

A codec's configuration is plain JSON data (the numcodecs pattern):
``get_codec(name, **config)`` builds one, ``codec.get_config()`` returns the
dict (including ``name``) and ``codec_from_config(config)`` rebuilds an equal
codec. Public methods validate and prepare; the arithmetic lives in
:mod:`tbq.reference` (NumPy, the specification) and :mod:`tbq.kernels`
(numba, byte-identical).

Arrays follow the ggml row layout: ``x`` of shape ``(..., n)`` with ``n`` a
multiple of the block size encodes to uint8 of shape
``(..., n // block_size * type_size)``, blocks back to back.
"""

from __future__ import annotations

import math
import os
import concurrent.futures
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import reference
from .codebooks import CODEBOOK_NAMES, Codebook, get_codebook, named_codebook
from .errors import (
    BlockShapeError,
    ConfigError,
    EncodedLengthError,
    NonFiniteError,
    ScaleOverflowError,
    TbqTypeError,
    TbqValueError,
)
from .formats import FORMATS, FormatInfo, format_info
from .half import F16_OVERFLOW, f16_table
from .rotation import RandomizedHadamard, get_rotation, hadamard_scale, turboq_mtp_signs

__all__ = [
    "Codec",
    "Q8_0",
    "Q4_0",
    "TBQ4_0",
    "TBQ3_0",
    "get_codec",
    "codec_from_config",
    "register_codec",
    "quantize",
    "dequantize",
    "resolve_backend",
    "numba_available",
    "BACKENDS",
    "ON_OVERFLOW",
]

BACKENDS = ("numpy", "numba")
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

_numba_state: dict = {}


def numba_available() -> bool:
    """True when numba imports (the kernels compile lazily on first use)."""
    if "ok" not in _numba_state:
        try:
            from . import kernels  # noqa: F401

            _numba_state["ok"] = True
        except ImportError:  # pragma: no cover - numba is a runtime dependency
            _numba_state["ok"] = False
    return _numba_state["ok"]


def resolve_backend(backend) -> str:
    """``None`` -> ``"numba"`` when numba imports, else ``"numpy"``; validates names."""
    if backend is None:
        return "numba" if numba_available() else "numpy"
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "numba" and not numba_available():
        raise ConfigError("backend='numba' was requested but numba cannot be imported")
    return backend


def _default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


_pool_lock = threading.Lock()
_pool: list = []


def _executor() -> ThreadPoolExecutor:
    with _pool_lock:
        if not _pool:
            _pool.append(ThreadPoolExecutor(max_workers=max(2, 2 * _default_threads()), thread_name_prefix="tbq"))
        return _pool[0]


def _run_chunks(n_items: int, chunk: int, threads: int, fn, min_chunk: int = 1):
    """Call ``fn(start, stop)`` over ``[0, n_items)`` in chunks; ``threads`` contiguous groups.

    Returns the results in chunk order. Each group runs its chunks in order, so
    the first error (by position) is the first non-None result.
    """
    if threads > 1:  # give every thread work on mid-sized arrays too
        chunk = min(chunk, max(min_chunk, -(-n_items // threads)))
    bounds = [(s, min(s + chunk, n_items)) for s in range(0, n_items, chunk)]
    if threads <= 1 or len(bounds) <= 1:
        results = []
        for s, e in bounds:
            r = fn(s, e)
            results.append(r)
            if r is not None:
                break
        return results
    groups = np.array_split(np.arange(len(bounds)), min(threads, len(bounds)))

    def run_group(ids):
        out = []
        for i in ids:
            r = fn(*bounds[i])
            out.append(r)
            if r is not None:
                break
        return out

    futures = [_executor().submit(run_group, g) for g in groups[1:]]
    try:
        results = run_group(groups[0])
    finally:  # never return (or raise) while workers still write into the output
        concurrent.futures.wait(futures)
    for f in futures:
        results.extend(f.result())
    return results


class _Blocks:
    """Blocks ``[s, e)`` of an array whose last axis is whole blocks, as a C-contiguous 2-D array.

    A C-contiguous input is viewed as ``(nblocks, width)`` without a copy. Any
    other layout is gathered a few rows at a time, so that memory stays
    bounded by the chunk rather than by the whole array. ``dtype`` converts
    (float16/float64/other byte orders to native float32) chunk by chunk too.
    """

    def __init__(self, a: np.ndarray, width: int, dtype):
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
        overlap = np.shares_memory(out, a, max_work=100_000)
    except _TooHardError:  # pragma: no cover - only for exotic strides
        overlap = True
    if overlap:
        raise TbqValueError(f"out shares memory with the {what}; pass a separate output array (or none)")


# ---------------------------------------------------------------------------
# Codec base class
# ---------------------------------------------------------------------------


class Codec:
    """A block format with its configuration.

    Parameters (keyword-only, common to every format)
    ----------
    backend : ``"numba"`` (default when numba imports) or ``"numpy"`` (the reference).
        Both give identical bytes and identical float32 bits.
    threads : worker threads for the numba backend (default ``None`` = all cores).
        Results do not depend on it.
    on_overflow : ``"raise"`` (default) raises :class:`ScaleOverflowError` when a
        block's scale rounds to fp16 infinity (``|d| >= 65520``); ``"inf"``
        stores the infinite scale as the C code does.
    """

    name: str = ""
    info: FormatInfo

    def __init__(self, *, backend=None, threads=None, on_overflow="raise"):
        self.backend = resolve_backend(backend)
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1):
            raise ConfigError(f"threads must be a positive integer or None (all cores), got {threads!r}")
        self.threads = None if threads is None else int(threads)
        if on_overflow not in ON_OVERFLOW:
            raise ConfigError(f"on_overflow must be one of {ON_OVERFLOW}, got {on_overflow!r}")
        self.on_overflow = on_overflow

    # -- static facts --
    @property
    def block_size(self) -> int:
        return self.info.block_size

    @property
    def type_size(self) -> int:
        return self.info.type_size

    @property
    def bits_per_value(self) -> float:
        return self.info.bits_per_value

    # -- config --
    def _format_config(self) -> dict:
        return {}

    def get_config(self) -> dict:
        """Plain JSON-serialisable config, including ``name``; see :func:`codec_from_config`."""
        cfg = {"name": self.name}
        cfg.update(self._format_config())
        cfg.update(backend=self.backend, threads=self.threads, on_overflow=self.on_overflow)
        return cfg

    def __eq__(self, other):
        if not isinstance(other, Codec):
            return NotImplemented
        return self.get_config() == other.get_config()

    def __hash__(self):
        return hash(repr(self))

    def __repr__(self):
        cfg = self.get_config()
        del cfg["name"]
        args = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
        return f"{type(self).__name__}({args})"

    # -- encode --
    def _n_threads(self) -> int:
        return self.threads if self.threads is not None else _default_threads()

    def encode(self, x, out=None) -> np.ndarray:
        """Encode float values to bytes.

        ``x``: float32 (float16 and float64 are converted to float32 first) of
        any shape whose last axis is a multiple of :attr:`block_size`. Returns
        uint8 of shape ``x.shape[:-1] + (n // block_size * type_size,)``,
        written into ``out`` when given (uint8, that shape, C-contiguous).
        """
        x = _check_float_input(x)
        bs, ts = self.block_size, self.type_size
        n = x.shape[-1]
        if n % bs:
            raise BlockShapeError(
                f"{self.name}: the last axis has {n} values, which is not a multiple of the block size {bs} "
                f"({n // bs} whole blocks and {n % bs} values left over)"
            )
        out_shape = x.shape[:-1] + (n // bs * ts,)
        out = _check_out(out, out_shape, np.uint8, x, "input")
        src = _Blocks(x, bs, np.float32)
        out2 = out.reshape(-1, ts)
        nblocks = src.n
        raise_overflow = self.on_overflow == "raise"
        chunk = max(1, (CHUNK_VALUES if self.backend == "numba" else NUMPY_CHUNK_VALUES) // bs)

        def work(s, e):
            xc = src.get(s, e)
            if self.backend == "numba":
                b, kind = self._kernel_encode(xc, out2[s:e], raise_overflow)
                return None if b < 0 else (s + int(b), int(kind))
            if np.isfinite(xc).all():
                first_bad = e - s
            else:
                first_bad = int(np.argmax(~np.isfinite(xc).all(axis=1)))
            with np.errstate(all="ignore"):
                data, d = self._ref_encode(xc[:first_bad])
            if raise_overflow:
                over = ~(np.abs(d) < F16_OVERFLOW)  # exactly the scales that fp16 rounds to +-Inf
                if over.any():
                    i = int(np.argmax(over))
                    out2[s : s + i] = data[:i]
                    return (s + i, 2)
            out2[s : s + first_bad] = data
            return None if first_bad == e - s else (s + first_bad, 1)

        threads = self._n_threads() if self.backend == "numba" else 1
        for r in _run_chunks(nblocks, chunk, threads, work, max(1, MIN_CHUNK_VALUES["encode"] // bs)):
            if r is not None:
                self._raise_encode_error(src, *r)
        return out

    def _raise_encode_error(self, src, block, kind):
        vals = src.get(block, block + 1)[0]
        if kind == 1:
            j = int(np.argmax(~np.isfinite(vals)))
            orig = src.raw(block, block + 1)[0][j]
            what = f"{orig!r}" if not np.isfinite(orig) else f"{orig!r}, which overflows float32"
            raise NonFiniteError(
                f"{self.name}: input block {block} holds a non-finite value "
                f"({what} at position {j} of the block, i.e. flat value index {block * self.block_size + j}); "
                "NaN and Inf cannot be encoded",
                block=block,
            )
        with np.errstate(all="ignore"):
            d = float(self._ref_encode(vals[None, :])[1][0])
        raise ScaleOverflowError(
            f"{self.name}: the scale of block {block} is {d!r}, which does not fit float16 "
            f"(it rounds to infinity; the largest finite fp16 is 65504). Pass on_overflow='inf' to store "
            "an infinite scale as the C reference does",
            block=block,
            scale=d,
        )

    # -- decode --
    def decode(self, data, out=None) -> np.ndarray:
        """Decode bytes to float32.

        ``data``: uint8 array (or a bytes-like object) whose last axis is a
        multiple of :attr:`type_size`. Returns float32 of shape
        ``data.shape[:-1] + (nbytes // type_size * block_size,)``, written into
        ``out`` when given. Any byte content decodes: fp16 scales that are
        Inf, NaN or subnormal give what the C decoder gives (Inf/NaN products).
        """
        data = _check_byte_input(data)
        bs, ts = self.block_size, self.type_size
        nbytes = data.shape[-1]
        if nbytes % ts:
            raise EncodedLengthError(
                f"{self.name}: the last axis has {nbytes} bytes, which is not a multiple of the block's "
                f"{ts} bytes ({nbytes // ts} whole blocks and {nbytes % ts} bytes left over)"
            )
        out_shape = data.shape[:-1] + (nbytes // ts * bs,)
        out = _check_out(out, out_shape, np.float32, data, "encoded data")
        src = _Blocks(data, ts, np.uint8)
        out2 = out.reshape(-1, bs)
        chunk = max(1, (CHUNK_VALUES if self.backend == "numba" else NUMPY_CHUNK_VALUES) // bs)

        def work(s, e):
            if self.backend == "numba":
                self._kernel_decode(src.get(s, e), out2[s:e])
            else:
                with np.errstate(all="ignore"):
                    out2[s:e] = self._ref_decode(src.get(s, e))

        threads = self._n_threads() if self.backend == "numba" else 1
        _run_chunks(src.n, chunk, threads, work, max(1, MIN_CHUNK_VALUES["decode"] // bs))
        return out

    # subclasses provide these
    def _ref_encode(self, x2):  # pragma: no cover
        raise NotImplementedError

    def _ref_decode(self, d2):  # pragma: no cover
        raise NotImplementedError

    def _kernel_encode(self, x2, out2, raise_overflow):  # pragma: no cover
        raise NotImplementedError

    def _kernel_decode(self, d2, out2):  # pragma: no cover
        raise NotImplementedError


def _check_float_input(x) -> np.ndarray:
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


def _check_byte_input(data) -> np.ndarray:
    if isinstance(data, (bytes, bytearray)):
        a = np.frombuffer(data, dtype=np.uint8)
    else:  # a memoryview keeps its item type, so a view of float32 is refused below
        a = np.asarray(data)
    if a.dtype != np.uint8:
        raise TbqTypeError(f"encoded data must be uint8, got dtype {a.dtype}")
    if a.ndim == 0:
        raise EncodedLengthError("encoded data must have at least one axis, got a scalar")
    return a


def _check_out(out, shape, dtype, source: np.ndarray, what: str) -> np.ndarray:
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
# Formats
# ---------------------------------------------------------------------------


class Q8_0(Codec):
    """ggml Q8_0: 32 values -> fp16 scale ``d = amax/127`` + 32 int8 codes (34 bytes).

    >>> c = Q8_0(backend="numpy")
    >>> b = c.encode(np.full(32, 0.5, np.float32))
    >>> b[:2].view("<f2")[0], b[2]
    (np.float16(0.003937), np.uint8(127))
    """

    name = "q8_0"
    info = FORMATS["q8_0"]

    def _ref_encode(self, x2):
        return reference.encode_q8_0(x2)

    def _ref_decode(self, d2):
        return reference.decode_q8_0(d2)

    def _kernel_encode(self, x2, out2, raise_overflow):
        from . import kernels

        return kernels.encode_q8_0(x2, out2, raise_overflow)

    def _kernel_decode(self, d2, out2):
        from . import kernels

        kernels.decode_q8_0(d2, out2, f16_table())


class Q4_0(Codec):
    """ggml Q4_0: 32 values -> fp16 scale ``d = max/-8`` + 32 4-bit codes (18 bytes)."""

    name = "q4_0"
    info = FORMATS["q4_0"]

    def _ref_encode(self, x2):
        return reference.encode_q4_0(x2)

    def _ref_decode(self, d2):
        return reference.decode_q4_0(d2)

    def _kernel_encode(self, x2, out2, raise_overflow):
        from . import kernels

        return kernels.encode_q4_0(x2, out2, raise_overflow)

    def _kernel_decode(self, d2, out2):
        from . import kernels

        kernels.decode_q4_0(d2, out2, f16_table())


class _TBQ(Codec):
    """Rotated formats: randomized Hadamard transform + Lloyd-Max codebook + fp16 norm.

    Extra parameters
    ----------------
    codebook : ``"lloyd-max"`` (default, fitted tables), ``"turboq-mtp"`` (the
        fork's tables) or a :class:`~tbq.codebooks.Codebook` with ``2**bits`` centroids.
    signs : ``"turboq-mtp"`` (default, the deployed sign tables), an integer
        seed (see :func:`tbq.rotation.signs_from_seed`) or a pair of +-1 arrays
        of length 128.
    """

    def __init__(self, *, codebook="lloyd-max", signs="turboq-mtp", **kwargs):
        super().__init__(**kwargs)
        bits = self.info.index_bits
        self.codebook: Codebook = get_codebook(codebook, bits)
        self.rotation: RandomizedHadamard = get_rotation(signs, self.block_size)
        self._codebook_cfg = _codebook_config(self.codebook, bits)
        self._signs_cfg = _signs_config(signs, self.rotation)
        c = self.codebook.centroids
        C = hadamard_scale(self.block_size, np.float32)
        s1 = self.rotation.signs1.astype(np.float32)
        s2 = self.rotation.signs2.astype(np.float32)
        # Kernel tables. Folding the +-1 signs into a constant is exact: x*(+-C) == +-(x*C).
        self._k = dict(
            thresholds=np.ascontiguousarray(self.codebook.thresholds),
            centroids=np.ascontiguousarray(c),
            centroids_sq=(c * c).astype(np.float32),
            s1=s1,
            s2=s2,
            cs1=(C * s1).astype(np.float32),
            cs2=(C * s2).astype(np.float32),
        )

    def _format_config(self):
        return {"codebook": self._codebook_cfg, "signs": self._signs_cfg}

    def _ref_encode(self, x2):
        return reference.encode_tbq(x2, self.info.index_bits, self.codebook, self.rotation)

    def _ref_decode(self, d2):
        return reference.decode_tbq(d2, self.info.index_bits, self.codebook, self.rotation)

    def _kernel_encode(self, x2, out2, raise_overflow):
        from . import kernels

        k = self._k
        return kernels.encode_tbq(
            x2, out2, self.info.index_bits, k["thresholds"], k["centroids_sq"], k["s1"], k["cs2"], raise_overflow, kernels.LANES
        )

    def _kernel_decode(self, d2, out2):
        from . import kernels

        k = self._k
        kernels.decode_tbq(d2, out2, self.info.index_bits, k["centroids"], k["s2"], k["cs1"], f16_table(), kernels.LANES)


class TBQ4_0(_TBQ):
    __doc__ = "TBQ4_0: 128 values -> fp16 corrected norm + 128 4-bit indices in adjacent pairs (66 bytes).\n" + (
        _TBQ.__doc__ or ""
    )
    name = "tbq4_0"
    info = FORMATS["tbq4_0"]


class TBQ3_0(_TBQ):
    __doc__ = "TBQ3_0: 128 values -> fp16 corrected norm + 128 3-bit indices in 24-bit lanes (50 bytes).\n" + (
        _TBQ.__doc__ or ""
    )
    name = "tbq3_0"
    info = FORMATS["tbq3_0"]


def _codebook_config(cb: Codebook, bits: int):
    for name in CODEBOOK_NAMES:
        try:
            if cb == named_codebook(name, bits):
                return name
        except ConfigError:
            pass
    return cb.to_config()


def _signs_config(spec, rot: RandomizedHadamard):
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return int(spec)
    s1, s2 = turboq_mtp_signs()
    if np.array_equal(rot.signs1, s1) and np.array_equal(rot.signs2, s2):
        return "turboq-mtp"
    return {"signs1": rot.signs1.tolist(), "signs2": rot.signs2.tolist()}


# ---------------------------------------------------------------------------
# Registry and shortcuts
# ---------------------------------------------------------------------------

_REGISTRY: dict[str, type[Codec]] = {}


def register_codec(cls: type[Codec]) -> type[Codec]:
    """Add a codec class to the registry under ``cls.name`` (explicit, like numcodecs)."""
    if cls.name not in FORMATS:
        raise ConfigError(f"{cls.__name__}.name = {cls.name!r} is not in the format table")
    _REGISTRY[cls.name] = cls
    return cls


for _cls in (Q8_0, Q4_0, TBQ4_0, TBQ3_0):
    register_codec(_cls)


def get_codec(name: str, **config) -> Codec:
    """Build the codec ``name`` with keyword configuration.

    >>> get_codec("tbq3_0", codebook="turboq-mtp", signs=7, backend="numpy").get_config()["signs"]
    7
    """
    format_info(name)  # raises ConfigError with the list of formats
    cls = _REGISTRY[name]
    try:
        return cls(**config)
    except TypeError as exc:
        raise ConfigError(f"bad configuration for {name}: {exc}") from None


def codec_from_config(config: dict) -> Codec:
    """Inverse of :meth:`Codec.get_config`."""
    if not isinstance(config, dict) or "name" not in config:
        raise ConfigError(f"a codec config is a dict with a 'name' key, got {config!r}")
    cfg = dict(config)
    return get_codec(cfg.pop("name"), **cfg)


def quantize(x, fmt: str, *, out=None, **config) -> np.ndarray:
    """Encode ``x`` (float, last axis a multiple of the block size) in format ``fmt``.

    >>> quantize(np.ones((3, 64), np.float32), "q4_0").shape
    (3, 36)
    """
    return get_codec(fmt, **config).encode(x, out=out)


def dequantize(data, fmt: str, *, out=None, **config) -> np.ndarray:
    """Decode uint8 ``data`` (last axis a multiple of the type size) in format ``fmt`` to float32.

    >>> dequantize(quantize(np.ones((3, 64), np.float32), "q4_0"), "q4_0")[0, :3]
    array([1., 1., 1.], dtype=float32)
    """
    return get_codec(fmt, **config).decode(data, out=out)
