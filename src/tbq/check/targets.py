"""The kernels ``tbq check`` runs: a shared library (ctypes), a Python callable, an external program.

Every target works on whole rows, as ggml's row functions do:

- ``quantize(x)``: float32 ``(rows, k)`` (``k`` a multiple of the block size)
  -> uint8 ``(rows, k / block_size * type_size)``;
- ``dequantize(data)``: uint8 ``(rows, nbytes)`` -> float32 ``(rows, nbytes / type_size * block_size)``.

A target is called with many rows at once wherever it allows it: a library
gets one C call per chunk of rows (blocks are independent, so a chunk of rows
is one long row; formats whose blocks depend on earlier blocks of their row,
``Format.row_rule``, get one call per row), a callable gets every row in one
call, a program one process per batch. Anything that makes a target unusable
(a library that does not load, a missing symbol, a program that fails or
writes the wrong number of bytes, a callable that returns the wrong shape)
raises :class:`TargetError`: the CLI prints it as one line and exits 2.

>>> import tbq
>>> t = CallableTarget(tbq.get_format("q8_0"), quantize=lambda x: tbq.quantize(x, "q8_0"))
>>> t.directions, t.quantize(np.zeros((2, 64), np.float32)).shape
(('quantize',), (2, 68))

Why one module of this length: the three kinds of target share :class:`Target`'s chunking,
its fills of the output buffers and its bookkeeping of faults; each kind is the transport alone.
"""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import subprocess
import tempfile
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import DTypeLike, NDArray

from ..errors import TbqValueError
from ..formats import FORMATS, Format, format_class
from .sharedlib import Probe, load_library, probe_calls, resolve_library, signal_words

__all__ = [
    "TargetError",
    "Target",
    "LibraryTarget",
    "CallableTarget",
    "ProgramTarget",
    "DIRECTIONS",
    "default_symbol",
    "defining_file",
]

#: The two directions a kernel can implement, in the order they are checked.
DIRECTIONS = ("quantize", "dequantize")
#: Values per C call (and per program run) when blocks are independent: big enough that
#: the call overhead vanishes, small enough that one call's buffers stay modest.
CALL_VALUES = 1 << 20
#: Bytes after every output buffer that a library must leave alone.
GUARD_BYTES = 64
_GUARD = 0xA5
#: What a library's output buffer holds before the call (bytes a kernel forgets to write show up as this).
FILL_BYTE = 0x5A
FILL_FLOAT_BITS = 0x7FA5A5A5  # a NaN that no decoder produces by arithmetic

#: A Python kernel: rows in, whatever it returns (anything array-like, checked by the target).
Kernel = Callable[[NDArray[Any]], Any]


class TargetError(TbqValueError):
    """The target cannot be used: it does not load, lacks a symbol, fails to run or returns the wrong shape."""


def default_symbol(direction: str, fmt: str) -> str:
    """ggml's name of a row function: ``quantize_row_<stem>_ref`` and ``dequantize_row_<stem>``, the stem being the
    format's name or the C type name it declares (:attr:`tbq.formats.capabilities.CheckTraits.symbol_stem`).

    >>> default_symbol("quantize", "q8_0"), default_symbol("dequantize", "q8_0")
    ('quantize_row_q8_0_ref', 'dequantize_row_q8_0')
    >>> default_symbol("quantize", "turbo3")
    'quantize_row_turbo3_0_ref'
    """
    stem = (format_class(fmt).checker.symbol_stem if fmt in FORMATS else "") or fmt
    return f"quantize_row_{stem}_ref" if direction == "quantize" else f"dequantize_row_{stem}"


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _dladdr() -> Any:
    """The C library's ``dladdr`` (glibc >= 2.34 and macOS have it in the process; older glibc in libdl), or None."""
    import ctypes.util

    for name in (None, ctypes.util.find_library("dl")):
        try:
            fn = ctypes.CDLL(name).dladdr
        except (OSError, AttributeError, TypeError):
            continue
        fn.argtypes = (ctypes.c_void_p, ctypes.POINTER(_DlInfo))
        fn.restype = ctypes.c_int
        return fn
    return None


def defining_file(fn: Any) -> str | None:
    """The shared object that defines the ctypes function ``fn`` (``dladdr`` of its address), or None where unknown.

    >>> import ctypes, os
    >>> os.path.basename(defining_file(ctypes.CDLL(None).printf) or "libc").startswith("libc")
    True
    """
    dladdr = _dladdr()
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    if dladdr is None or not addr:
        return None
    info = _DlInfo()
    if not dladdr(addr, ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(os.fsdecode(info.dli_fname))


def defining_file_of_handle(lib: ctypes.CDLL, path: str) -> str | None:
    """The real path of the file a ctypes library handle loaded (``path`` resolved; a bare name through ``dladdr``)."""
    if os.path.exists(path):
        return os.path.realpath(path)
    return None


def _check_only(only: str | None) -> tuple[str, ...]:
    if only is None:
        return DIRECTIONS
    if only not in DIRECTIONS:
        raise TargetError(f"only must be 'quantize', 'dequantize' or None (both), got {only!r}")
    return (only,)


class Target:
    """A kernel under test. Subclasses implement :meth:`_quantize` and/or :meth:`_dequantize`.

    ``directions`` lists what it implements; ``description`` names it in
    reports; ``symbols`` gives the C names the counterexample's C file calls.
    """

    kind = "target"

    def __init__(self, fmt: Format, directions: tuple[str, ...], description: str) -> None:
        self.format = fmt
        self.directions = tuple(d for d in DIRECTIONS if d in directions)
        self.description = description
        self.symbols = {d: default_symbol(d, fmt.name) for d in DIRECTIONS}
        #: problems seen while calling (a write past the output, a modified input): direction -> messages
        self.faults: dict[str, list[str]] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description} ({', '.join(self.directions)})>"

    @property
    def row_rule(self) -> bool:
        return bool(self.format.row_rule)

    def _fault(self, direction: str, message: str) -> None:
        seen = self.faults.setdefault(direction, [])
        if message not in seen:
            seen.append(message)

    # -- the public calls: checked shapes ---------------------------------------------------
    def quantize(self, x: NDArray[np.float32], fill: int | None = None) -> NDArray[np.uint8]:
        """Encode float32 rows ``(rows, k)``; ``fill`` (libraries only) is the output buffer's byte before the call."""
        return self._checked_call("quantize", x, FILL_BYTE if fill is None else fill)

    def dequantize(self, data: NDArray[np.uint8], fill: int | None = None) -> NDArray[np.float32]:
        """Decode uint8 rows ``(rows, nbytes)``; ``fill`` (libraries only) is the output's float32 bit pattern before the call."""
        return self._checked_call("dequantize", data, FILL_FLOAT_BITS if fill is None else fill)

    def _checked_call(self, direction: str, rows: NDArray[Any], fill: int) -> NDArray[Any]:
        """The target's ``direction`` of ``rows`` (C-contiguous, in the direction's input type), checked to be the
        output rows of that direction's type and width."""
        if direction not in self.directions:
            raise TargetError(f"{self.description} has no {direction} function")
        bs, ts = self.format.block_size, self.format.type_size
        run: Callable[[Any, int], Any]
        dtype: DTypeLike
        if direction == "quantize":
            rows = np.ascontiguousarray(rows, np.float32)
            per_block_in, per_block_out, dtype, run = bs, ts, np.uint8, self._quantize
        else:
            rows = np.ascontiguousarray(rows, np.uint8)
            per_block_in, per_block_out, dtype, run = ts, bs, np.float32, self._dequantize
        n, width = rows.shape
        return _shaped(
            run(rows, fill), (n, width // per_block_in * per_block_out), dtype, f"{self.description}: {direction}"
        )

    def _quantize(self, x: NDArray[np.float32], fill: int) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _dequantize(self, data: NDArray[np.uint8], fill: int) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _row_chunks(self, rows: int, k: int) -> Iterator[tuple[int, int]]:
        """Row ranges ``[r0, r1)`` handed to one call: one row for row-rule formats, else up to :data:`CALL_VALUES` values."""
        per = 1 if self.row_rule else max(1, CALL_VALUES // max(1, k))
        for r0 in range(0, rows, per):
            yield r0, min(rows, r0 + per)

    def close(self) -> None:
        """Release what the target holds (temporary files); the default holds nothing."""

    def link_libraries(self, direction: str) -> list[str]:
        """Shared libraries a C repro of ``direction`` links with (none: the repro names a placeholder)."""
        return []

    def provenance(self) -> dict[str, dict[str, Any]]:
        """Per direction (and init function), what was called: ``{"symbol", "file", ...}`` (empty where not known)."""
        return {}


def _to_numpy(obj: Any) -> NDArray[Any]:
    """A NumPy array from what a kernel returned (NumPy, a PyTorch tensor on any device, bytes, anything array-like)."""
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return np.frombuffer(obj, np.uint8)
    if hasattr(obj, "detach") and hasattr(obj, "cpu"):  # torch.Tensor, without importing torch
        obj = obj.detach().cpu()
        return obj.numpy() if hasattr(obj, "numpy") else np.asarray(obj)
    if hasattr(obj, "get") and type(obj).__module__.startswith("cupy"):  # cupy: device -> host
        return obj.get()
    return np.asarray(obj)


def _shaped(out: Any, shape: tuple[int, ...], dtype: DTypeLike, what: str) -> NDArray[Any]:
    if out is None:
        raise TargetError(
            f"{what} returned None; return the {'encoded rows (uint8)' if dtype == np.uint8 else 'decoded rows (float32)'}"
            f", {int(np.prod(shape))} {'bytes' if dtype == np.uint8 else 'values'}, shape {shape} (a kernel that "
            "writes into its argument must return it too)"
        )
    a = _to_numpy(out)
    if a.dtype == object:
        raise TargetError(
            f"{what} returned {type(out).__name__} that NumPy reads as Python objects (shape {a.shape}); "
            f"return a {np.dtype(dtype)} array, shape {shape}"
        )
    dtype = np.dtype(dtype)
    if dtype == np.uint8 and a.dtype.kind in "iub" and a.dtype.itemsize == 1:
        a = a.view(np.uint8)
    if a.dtype != dtype:
        raise TargetError(f"{what} returned dtype {a.dtype}; tbq compares {dtype} exactly, so return {dtype}")
    n = int(np.prod(shape))
    if a.size != n:
        raise TargetError(f"{what} returned {a.size} values (shape {a.shape}); expected {n}, shape {shape}")
    return np.ascontiguousarray(a.reshape(shape))


# ---------------------------------------------------------------------------
# a shared library (ctypes)
# ---------------------------------------------------------------------------


class LibraryTarget(Target):
    """A shared library with ggml's row functions, loaded with ctypes.

    ``void quantize_row_X(const float *x, void *y, int64_t k)`` and
    ``void dequantize_row_X(const void *x, float *y, int64_t k)``; ``k`` is
    the number of values. ``quantize`` / ``dequantize`` name the symbols
    (default: ggml's names, :func:`default_symbol`); ``only`` checks one
    direction.

    Every call gets a fresh output buffer pre-filled with :data:`FILL_BYTE`
    (or a NaN pattern), followed by :data:`GUARD_BYTES` guard bytes, and a
    private copy of the input: a write past the end of the row or into the
    input is recorded in :attr:`faults` (the check reports it as wrong).
    """

    kind = "library"

    def __init__(
        self,
        path: str | os.PathLike[str],
        fmt: Format,
        *,
        quantize: str | None = None,
        dequantize: str | None = None,
        only: str | None = None,
        init: str | Iterable[str] = (),
        strict_lib: bool = False,
    ) -> None:
        want = _check_only(only)
        path = os.fspath(path)
        p = Path(path)
        if "/" in path or p.exists():
            if not p.exists():
                raise TargetError(f"cannot load {path}: no such file")
            if p.is_dir():
                raise TargetError(f"cannot load {path}: it is a directory, not a shared library")
            path = resolve_library(str(p.resolve()))  # a flattened symbolic link: the file it names
            p = Path(path)
        if isinstance(init, str):
            init = (init,)
        init = tuple(init or ())
        for name in init:
            if not isinstance(name, str) or not name:
                raise TargetError(f"init must name functions void f(void), got {name!r}")
        names = {"quantize": quantize, "dequantize": dequantize}
        # every function once in a child process first: a build for another CPU dies of SIGILL there, not here
        probes = [Probe("init", name, "--init") for name in init] + [
            Probe(d, names[d] or default_symbol(d, fmt.name), d, fmt.block_size, fmt.type_size)
            for d in DIRECTIONS
            if d in want
        ]
        probe_calls(path, probes, TargetError)
        self.lib = load_library(path, TargetError)
        super().__init__(fmt, want, f"library {p.name}")
        self.path = path
        self.file = defining_file_of_handle(self.lib, path)
        self.strict_lib = bool(strict_lib)
        other = {"quantize": "dequantize", "dequantize": "quantize"}
        self.functions: dict[str, Any] = {}  # direction -> the ctypes function
        self._provenance: dict[str, dict[str, Any]] = {}
        for name in init:
            try:
                fn = getattr(self.lib, name)
            except AttributeError:
                raise TargetError(
                    f"{path} has no symbol {name!r} (--init); check the name (nm -D shows the exported symbols)"
                ) from None
            fn.argtypes, fn.restype = (), None
            self._resolved(f"init {name}", name, fn)
        for d in DIRECTIONS:
            if d not in want:
                if names[d] is not None:
                    raise TargetError(
                        f"--{d} {names[d]} names a function of the direction that --only {only} leaves out"
                    )
                continue
            sym = names[d] or default_symbol(d, fmt.name)
            try:
                fn = getattr(self.lib, sym)
            except AttributeError:
                if names[d]:
                    hint = "check the name (nm -D shows the exported symbols)"
                else:
                    hint = (
                        f"name the function with --{d} SYMBOL ({d}= in Python), or check the other direction "
                        f"alone with --only {other[d]}"
                    )
                raise TargetError(f"{path} has no symbol {sym!r} ({d} for {fmt.name}); {hint}") from None
            fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
            fn.restype = None
            self._resolved(d, sym, fn)
            self.functions[d] = fn
            self.symbols[d] = sym
        for name in init:  # once, after every symbol resolved (a missing symbol fails before any side effect)
            getattr(self.lib, name)()

    def _resolved(self, key: str, sym: str, fn: Any) -> None:
        """Record where ``sym`` comes from; refuse it under ``strict_lib`` when another file defines it."""
        where = defining_file(fn)
        elsewhere = where is not None and self.file is not None and where != self.file
        if elsewhere and self.strict_lib:
            raise TargetError(
                f"{sym} ({key}) is defined in {where}, not in {self.path} (the dynamic loader found it in a "
                "dependency); without --strict-lib (strict_lib=False) it is checked from there"
            )
        self._provenance[key] = {"symbol": sym, "file": where, "library": self.path, "elsewhere": bool(elsewhere)}

    def provenance(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self._provenance.items()}

    def link_libraries(self, direction: str) -> list[str]:
        """The library given, and the one that defines the symbol when it is another (a dependency)."""
        libs = [self.path]
        where = self._provenance.get(direction, {}).get("file")
        if where and where not in (self.path, self.file):
            libs.append(where)
        return libs

    def _call(
        self,
        direction: str,
        src: NDArray[Any],
        out_width_bytes: int,
        fill_bytes: bytes,
        out_dtype: DTypeLike,
        k_of_chunk: Callable[[int], int],
    ) -> NDArray[Any]:
        fn = self.functions[direction]
        rows = src.shape[0]
        out = np.empty((rows, out_width_bytes), np.uint8)
        for r0, r1 in self._row_chunks(rows, k_of_chunk(1)):
            n = (r1 - r0) * out_width_bytes
            buf = np.empty(n + GUARD_BYTES, np.uint8)
            reps = -(-n // len(fill_bytes))
            buf[:n] = np.frombuffer(fill_bytes * reps, np.uint8)[:n]
            buf[n:] = _GUARD
            mine = np.array(src[r0:r1], copy=True, order="C")
            fn(mine.ctypes.data, buf.ctypes.data, k_of_chunk(r1 - r0))
            if (buf[n:] != _GUARD).any():
                last = int(np.flatnonzero(buf[n:] != _GUARD)[-1]) + 1
                self._fault(
                    direction,
                    f"{self.symbols[direction]} writes past the end of its output: at least {last} "
                    f"byte(s) after the {n} bytes of a call with k = {k_of_chunk(r1 - r0)}",
                )
            if not np.array_equal(mine.view(np.uint8), np.ascontiguousarray(src[r0:r1]).view(np.uint8)):
                self._fault(
                    direction, f"{self.symbols[direction]} writes into its input (declared const in ggml's signature)"
                )
            out[r0:r1] = buf[:n].reshape(r1 - r0, out_width_bytes)
        return out if out_dtype == np.uint8 else out.view(out_dtype)

    def _quantize(self, x: NDArray[np.float32], fill: int) -> NDArray[np.uint8]:
        bs, ts = self.format.block_size, self.format.type_size
        k = x.shape[1]
        return self._call("quantize", x, k // bs * ts, bytes([fill & 0xFF]), np.uint8, lambda r: r * k)

    def _dequantize(self, data: NDArray[np.uint8], fill: int) -> NDArray[np.float32]:
        bs, ts = self.format.block_size, self.format.type_size
        k = data.shape[1] // ts * bs
        pattern = np.array([fill], "<u4").tobytes()
        return self._call("dequantize", data, k * 4, pattern, np.float32, lambda r: r * k)


# ---------------------------------------------------------------------------
# a Python callable
# ---------------------------------------------------------------------------


def _raises(fn: Kernel, rows: NDArray[Any]) -> bool:
    try:
        fn(rows.copy())
    except Exception:
        return True
    return False


class CallableTarget(Target):
    """Python functions: ``quantize(x)`` and/or ``dequantize(data)`` on whole rows.

    ``quantize`` receives float32 ``(rows, k)`` (C-contiguous, a private copy)
    and returns the encoded rows: anything array-like with ``rows * k /
    block_size * type_size`` bytes (uint8 or int8; a PyTorch tensor on any
    device, bytes, a flat array). ``dequantize`` receives uint8 ``(rows,
    nbytes)`` and returns float32 with ``rows * nbytes / type_size *
    block_size`` values. Every row of a call is one ggml row (what matters
    for row-rule formats such as IQ4_NL).
    """

    kind = "callable"

    def __init__(
        self, fmt: Format, quantize: Kernel | None = None, dequantize: Kernel | None = None, name: str | None = None
    ) -> None:
        fns = {"quantize": quantize, "dequantize": dequantize}
        for d, fn in fns.items():
            if fn is not None and not callable(fn):
                raise TargetError(f"{d} must be a function (rows in, rows out), got {type(fn).__name__}")
        if quantize is None and dequantize is None:
            raise TargetError("give quantize=, dequantize= or both: there is nothing to check")
        names = [getattr(fn, "__qualname__", type(fn).__name__) for fn in fns.values() if fn is not None]
        super().__init__(fmt, tuple(d for d, fn in fns.items() if fn is not None), name or f"python {', '.join(names)}")
        self.fns = fns

    def _quantize(self, x: NDArray[np.float32], fill: int) -> Any:
        return self._guarded("quantize", x)

    def _dequantize(self, data: NDArray[np.uint8], fill: int) -> Any:
        return self._guarded("dequantize", data)

    def _guarded(self, direction: str, rows: NDArray[Any]) -> Any:
        """Call the kernel; an exception becomes a :class:`TargetError` naming the smallest input that raises it."""
        fn = self.fns[direction]
        assert fn is not None  # Target.quantize/dequantize: only the directions given are called
        try:
            return fn(rows.copy())
        except Exception as exc:
            culprit, what = self._culprit(fn, rows, direction)
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
            shown = (
                ", ".join(f"{v}" for v in culprit.reshape(-1)[:8])
                if culprit.dtype == np.float32
                else culprit.tobytes().hex(" ")[:96]
            )
            raise TargetError(
                f"{self.description}: {direction} raised {type(exc).__name__}: {exc} on {what} "
                f"({culprit.size} {'values' if culprit.dtype == np.float32 else 'bytes'}: {shown}"
                f"{' ...' if culprit.size > 8 else ''}); the kernel's traceback:\n{tb}"
            ) from exc

    def _culprit(self, fn: Kernel, rows: NDArray[Any], direction: str) -> tuple[NDArray[Any], str]:
        """The first row, then block of that row (when blocks are independent), on which ``fn`` raises by itself."""
        width = self.format.block_size if direction == "quantize" else self.format.type_size
        for r in range(rows.shape[0]):
            row = rows[r : r + 1]
            if not _raises(fn, row):
                continue
            if not self.row_rule:
                for b in range(row.shape[1] // width):
                    blk = np.ascontiguousarray(row[:, b * width : (b + 1) * width])
                    if _raises(fn, blk):
                        return blk, f"block {b} of row {r} (alone it raises too)"
            return row, f"row {r} of a batch of {rows.shape[0]}"
        return rows, f"a batch of {rows.shape[0]} rows (no row alone raises)"


# ---------------------------------------------------------------------------
# an external program
# ---------------------------------------------------------------------------

#: Placeholders of an ``--exec`` command.
PLACEHOLDERS = {
    "in": "the input file: raw float32 (quantize) or the encoded bytes (dequantize), rows back to back",
    "out": "the file the program writes: the encoded bytes (quantize) or raw float32 (dequantize)",
    "op": "quantize or dequantize",
    "k": "values per row (row-rule formats need it; otherwise the whole file may be treated as one row)",
    "rows": "rows in the input file",
    "format": "the format name, e.g. q8_0",
}
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


class ProgramTarget(Target):
    """An external program (a GPU binary, a simulator) that reads one file and writes another.

    ``command`` is a shell-like command line with placeholders (see
    :data:`PLACEHOLDERS`): ``{in}`` and ``{out}`` are required; ``{op}``
    lets one program serve both directions (without it, ``only`` must say
    which one the program implements). Files are little-endian: float32
    values or encoded bytes, rows back to back. The program must exit with
    status 0 and write exactly the expected number of bytes.
    """

    kind = "program"

    def __init__(self, command: str, fmt: Format, *, only: str | None = None, timeout: float = 600.0) -> None:
        if not isinstance(command, str) or not command.strip():
            raise TargetError('--exec needs a command line such as "./mykernel {op} {in} {out}"')
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise TargetError(f"--exec {command!r}: cannot split it into arguments ({exc})") from None
        used = {m for a in argv for m in _PLACEHOLDER.findall(a)}
        unknown = sorted(used - set(PLACEHOLDERS))
        if unknown:
            raise TargetError(
                f"--exec: unknown placeholder {{{unknown[0]}}}; known: {' '.join('{' + p + '}' for p in PLACEHOLDERS)}"
            )
        missing = [p for p in ("in", "out") if p not in used]
        if missing:
            raise TargetError(
                f"--exec {command!r} has no {{{missing[0]}}} placeholder; the program must take {{in}} and {{out}} file names"
            )
        if only is None and "op" not in used:
            raise TargetError(
                f"--exec {command!r} has no {{op}} placeholder, so the program implements one direction: "
                "say which with --only quantize or --only dequantize (only= in Python)"
            )
        want = _check_only(only)
        super().__init__(fmt, want, f"program {Path(argv[0]).name}")
        self.command, self.argv, self.used = command, argv, used
        self.timeout = float(timeout)
        self._tmp = tempfile.TemporaryDirectory(prefix="tbq-check-")

    def close(self) -> None:
        self._tmp.cleanup()

    def _row_chunks(self, rows: int, k: int) -> Iterator[tuple[int, int]]:
        if self.row_rule and "k" not in self.used:
            return super()._row_chunks(rows, k)  # one row per run: the program sees whole rows only
        per = max(1, (CALL_VALUES * 4) // max(1, k))
        return ((r0, min(rows, r0 + per)) for r0 in range(0, rows, per))

    def _run(self, op: str, payload: NDArray[Any], k: int, out_bytes: int) -> bytes:
        tmp = Path(self._tmp.name)
        src, dst = tmp / f"{op}.in", tmp / f"{op}.out"
        src.write_bytes(payload.tobytes())
        if dst.exists():
            dst.unlink()
        values = {
            "in": str(src),
            "out": str(dst),
            "op": op,
            "k": str(k),
            "rows": str(payload.shape[0]),
            "format": self.format.name,
        }
        argv = [_PLACEHOLDER.sub(lambda m: values[m.group(1)], a) for a in self.argv]
        try:
            res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=self.timeout)
        except FileNotFoundError:
            raise TargetError(f"--exec: command not found: {argv[0]}") from None
        except PermissionError:
            raise TargetError(f"--exec: {argv[0]} is not executable (permission denied)") from None
        except OSError as exc:
            raise TargetError(f"--exec: cannot run {argv[0]}: {exc.strerror or exc}") from None
        except subprocess.TimeoutExpired:
            raise TargetError(f"--exec: `{shlex.join(argv)}` did not finish within {self.timeout:g} s") from None
        if res.returncode != 0:
            tail = (res.stderr or res.stdout or b"").decode(errors="replace").strip().splitlines()
            why = f": {tail[-1]}" if tail else ""
            status = (
                f"died of {signal_words(-res.returncode)}"
                if res.returncode < 0
                else f"exited with status {res.returncode}"
            )
            raise TargetError(
                f"--exec: `{shlex.join(argv)}` {status} ({op}, {payload.shape[0]} row(s) of k = {k}){why}"
            )
        if not dst.exists():
            raise TargetError(f"--exec: the program exited with status 0 but wrote no {{out}} file ({op})")
        data = dst.read_bytes()
        if len(data) != out_bytes:
            raise TargetError(
                f"--exec: the program wrote {len(data)} bytes to {{out}} for {op} of {payload.shape[0]} row(s) of "
                f"k = {k}; expected {out_bytes}"
            )
        return data

    def _quantize(self, x: NDArray[np.float32], fill: int) -> NDArray[np.uint8]:
        bs, ts = self.format.block_size, self.format.type_size
        k = x.shape[1]
        width = k // bs * ts
        out = np.empty((x.shape[0], width), np.uint8)
        for r0, r1 in self._row_chunks(x.shape[0], k):
            raw = self._run("quantize", x[r0:r1].astype("<f4"), k, (r1 - r0) * width)
            out[r0:r1] = np.frombuffer(raw, np.uint8).reshape(r1 - r0, width)
        return out

    def _dequantize(self, data: NDArray[np.uint8], fill: int) -> NDArray[np.float32]:
        bs, ts = self.format.block_size, self.format.type_size
        k = data.shape[1] // ts * bs
        out = np.empty((data.shape[0], k), np.float32)
        for r0, r1 in self._row_chunks(data.shape[0], k):
            raw = self._run("dequantize", data[r0:r1], k, (r1 - r0) * k * 4)
            out[r0:r1] = np.frombuffer(raw, "<f4").reshape(r1 - r0, k)
        return out
