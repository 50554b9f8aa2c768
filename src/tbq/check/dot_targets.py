"""The dot-product kernels a check runs: a shared library's ``vec_dot`` (:class:`LibraryDot`) or a Python
function (:class:`CallableDot`), behind :class:`DotTarget`."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..formats import Format
from .dot_reference import pair_unit
from .sharedlib import Probe, load_library, probe_calls
from .targets import TargetError, defining_file


class DotTarget:
    """A dot-product kernel: ``dot(x, y, n) -> float`` on encoded rows of ``left`` and ``right``."""

    kind = "dot"

    def __init__(self, left: Format, right: Format, description: str, symbol: str) -> None:
        self.left, self.right = left, right
        self.description, self.symbol = description, symbol
        self.faults: dict[str, list[str]] = {}

    def dot(self, x: NDArray[np.uint8], y: NDArray[np.uint8], n: int) -> np.float32:  # pragma: no cover - abstract
        raise NotImplementedError

    def provenance(self) -> dict[str, dict[str, Any]]:
        return {}

    def link_libraries(self) -> list[str]:
        return []

    def close(self) -> None:
        """Nothing to release by default."""


class LibraryDot(DotTarget):
    """ggml's ``vec_dot`` signature from a shared library (ctypes), with optional ``init`` functions."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        symbol: str,
        left: Format,
        right: Format,
        init: str | Iterable[str] = (),
        strict_lib: bool = False,
    ) -> None:
        path = os.fspath(path)
        if "/" in path and not Path(path).is_file():
            raise TargetError(f"cannot load {path}: no such file")
        real = os.path.realpath(path) if Path(path).exists() else path
        init = (init,) if isinstance(init, str) else tuple(init or ())
        # every function once in a child process first: a build for another CPU dies of SIGILL there, not here
        k = pair_unit(left, right)
        probes = [Probe("init", name, "--init") for name in init if isinstance(name, str)]
        probes.append(
            Probe(
                "dot",
                symbol,
                "--dot",
                k,
                k // left.block_size * left.type_size,
                k // right.block_size * right.type_size,
            )
        )
        probe_calls(real, probes, TargetError)
        lib = load_library(real, TargetError)
        super().__init__(left, right, f"library {Path(path).name}", symbol)
        self.path, self.lib = real, lib
        self._prov: dict[str, dict[str, Any]] = {}
        fns = []
        for name, key in [(n, f"init {n}") for n in init] + [(symbol, "dot")]:
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise TargetError(
                    f"{path} has no symbol {name!r} ({key}); check the name (nm -D shows the exported symbols)"
                ) from None
            where = defining_file(fn)
            elsewhere = bool(where and Path(real).exists() and where != real)
            if elsewhere and strict_lib:
                raise TargetError(
                    f"{name} ({key}) is defined in {where}, not in {real} (the dynamic loader found it in a dependency)"
                )
            self._prov[key] = {"symbol": name, "file": where, "library": real, "elsewhere": elsewhere}
            fns.append(fn)
        for fn in fns[:-1]:
            fn.argtypes, fn.restype = (), None
            fn()
        self.fn = fns[-1]
        self.fn.argtypes = (
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_float),
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
        )
        self.fn.restype = None

    def dot(self, x: NDArray[np.uint8], y: NDArray[np.uint8], n: int) -> np.float32:
        s = (ctypes.c_float * 2)(np.nan, 12345.0)  # s[1] is a guard: nrc = 1 writes s[0] only
        xa, ya = np.array(x, np.uint8, copy=True), np.array(y, np.uint8, copy=True)
        self.fn(int(n), s, 0, xa.ctypes.data, 0, ya.ctypes.data, 0, 1)
        if s[1] != 12345.0:
            self.faults.setdefault("dot", [f"{self.symbol} writes past *s (s[1]) with nrc = 1"])
        if not (np.array_equal(xa, x) and np.array_equal(ya, y)):
            self.faults.setdefault("dot", [f"{self.symbol} writes into its inputs (declared const)"])
        return np.float32(s[0])

    def provenance(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self._prov.items()}

    def link_libraries(self) -> list[str]:
        libs = [self.path]
        where = self._prov.get("dot", {}).get("file")
        return libs + ([where] if where and where != self.path else [])


class CallableDot(DotTarget):
    """A Python dot product ``fn(x, y, n) -> float``: ``x``, ``y`` uint8 encoded rows, ``n`` the number of values."""

    def __init__(
        self,
        left: Format,
        right: Format,
        fn: Callable[[NDArray[np.uint8], NDArray[np.uint8], int], Any],
        name: str | None = None,
    ) -> None:
        if not callable(fn):
            raise TargetError(f"dot must be a function (x, y, n) -> float, got {type(fn).__name__}")
        super().__init__(left, right, name or f"python {getattr(fn, '__qualname__', type(fn).__name__)}", "vec_dot")
        self.fn = fn

    def dot(self, x: NDArray[np.uint8], y: NDArray[np.uint8], n: int) -> np.float32:
        out = self.fn(x.copy(), y.copy(), int(n))
        try:
            return np.float32(out)
        except (TypeError, ValueError):
            raise TargetError(
                f"{self.description} returned {type(out).__name__}; return the dot product as a float"
            ) from None


# Their public home stays tbq.check.dot (the name in pickles, reprs and the API's records).
for _cls in (DotTarget, LibraryDot, CallableDot):
    _cls.__module__ = "tbq.check.dot"
