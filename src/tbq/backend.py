"""Backends and the encoder status codes: the bottom layer every other module may use.

``backend="numpy"`` is the specification written as array code;
``backend="numba"`` runs compiled kernels that give identical bytes and bits.
Kernels report how an encode ended with one of the ``STATUS_*`` codes.
"""

from __future__ import annotations

from .errors import ConfigError, check_choice

__all__ = [
    "BACKENDS",
    "resolve_backend",
    "numba_available",
    "STATUS_OK",
    "STATUS_NONFINITE",
    "STATUS_SCALE_OVERFLOW",
    "STATUS_UNDEFINED",
]

BACKENDS = ("numpy", "numba")

#: Encode kernels return ``(block, status)``. Every block was written:
STATUS_OK = 0
#: ``block`` (a row index of the kernel's 2-D input) holds a NaN or an Inf; nothing from it on was written.
STATUS_NONFINITE = 1
#: ``block``'s fp16 scale rounds to infinity and the caller asked to raise; nothing from it on was written.
STATUS_SCALE_OVERFLOW = 2
#: ``block`` is a case the C reference leaves undefined (e.g. an MXFP4 exponent below
#: the E8M0 range) and the caller asked to raise; nothing from it on was written.
STATUS_UNDEFINED = 3

_numba_state: dict[str, bool] = {}


def numba_available() -> bool:
    """True when numba imports (the kernels compile lazily on first use)."""
    if "ok" not in _numba_state:
        try:
            import numba  # noqa: F401

            _numba_state["ok"] = True
        except ImportError:  # pragma: no cover - numba is a runtime dependency
            _numba_state["ok"] = False
    return _numba_state["ok"]


def resolve_backend(backend: str | None) -> str:
    """``None`` -> ``"numba"`` when numba imports, else ``"numpy"``; validates names.

    >>> resolve_backend("numpy")
    'numpy'
    """
    if backend is None:
        return "numba" if numba_available() else "numpy"
    check_choice(backend, "backend", BACKENDS)
    if backend == "numba" and not numba_available():
        raise ConfigError("backend='numba' was requested but numba cannot be imported")
    return backend
