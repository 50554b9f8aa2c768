"""Scalar codebooks for the TBQ formats.

A :class:`Codebook` is ``2**bits`` float32 centroids in increasing order and
``2**bits - 1`` float32 decision thresholds. A rotated coordinate ``r`` gets
index ``i`` = the first ``i`` with ``r < thresholds[i]``, else ``2**bits - 1``;
equivalently the number of thresholds ``<= r``.

Two named sets exist:

- ``"lloyd-max"`` (default): Lloyd-Max levels for N(0, sigma^2), sigma =
  1/sqrt(128), fitted here with SciPy by :func:`lloyd_max` and bit-identical to
  the ``fitted`` tables of the conformance set.
- ``"turboq-mtp"``: the literal tables shipped by the llama.cpp-turboq-mtp fork
  (the ``fork`` tables), for golden vectors of kernels built with them.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import ConfigError, check_int

__all__ = [
    "Codebook",
    "lloyd_max",
    "lloyd_max_iterate",
    "normal_pdf",
    "named_codebook",
    "get_codebook",
    "fork_vs_lloyd_max",
    "trapezoid_lloyd_max",
    "CODEBOOK_NAMES",
    "tables",
]

#: Names accepted by :func:`get_codebook` (and the TBQ codecs' ``codebook=``).
CODEBOOK_NAMES = ("lloyd-max", "turboq-mtp")

#: sigma of the rotated coordinates of a unit-norm 128-vector.
SIGMA_128 = 1.0 / math.sqrt(128.0)


@dataclass(frozen=True, eq=False)
class Codebook:
    """Float32 centroids and decision thresholds of a scalar quantizer.

    Parameters
    ----------
    centroids : array_like, ``2**bits`` values, strictly increasing, finite.
    thresholds : array_like, ``2**bits - 1`` values, strictly increasing, finite.
    name : optional label recorded in configs (``"lloyd-max"``, ``"turboq-mtp"`` or ``None``).

    Values are converted to float32 once, here; a value that is not exactly a
    float32 is rounded to nearest.

    >>> cb = Codebook([-1.0, 1.0], [0.0])
    >>> cb.bits, cb.index(np.float32([-0.5, 0.0, 2.0]))
    (1, array([0, 1, 1], dtype=uint8))
    """

    centroids: NDArray[np.float32]
    thresholds: NDArray[np.float32]
    name: str | None = None

    def __post_init__(self) -> None:
        c = _as_f32_vector(self.centroids, "centroids")
        m = _as_f32_vector(self.thresholds, "thresholds")
        n = c.size
        bits = n.bit_length() - 1
        if n < 2 or n != 1 << bits or bits > 8:
            raise ConfigError(f"codebook needs 2**bits centroids with 1 <= bits <= 8, got {n}")
        if m.size != n - 1:
            raise ConfigError(f"codebook with {n} centroids needs {n - 1} thresholds, got {m.size}")
        for label, v in (("centroids", c), ("thresholds", m)):
            bad = np.flatnonzero(~(v[1:] > v[:-1]))
            if bad.size:
                i = int(bad[0])
                raise ConfigError(
                    f"codebook {label} must be strictly increasing: "
                    f"{label}[{i}] = {v[i]!r} >= {label}[{i + 1}] = {v[i + 1]!r}"
                )
        c.setflags(write=False)
        m.setflags(write=False)
        object.__setattr__(self, "centroids", c)
        object.__setattr__(self, "thresholds", m)

    @property
    def bits(self) -> int:
        return int(self.centroids.size).bit_length() - 1

    def index(self, r: NDArray[np.float32]) -> NDArray[np.uint8]:
        """Indices of float32 values ``r``: the number of thresholds ``<= r`` (uint8).

        This is the spec's "first i with r < m_i, else 2**bits - 1": a value
        equal to a threshold takes the upper index, and -0.0 compares equal to
        a threshold of 0.
        """
        return np.searchsorted(self.thresholds, np.asarray(r, dtype=np.float32), side="right").astype(np.uint8)

    def to_config(self) -> str | dict[str, list[float]]:
        """The name for a named table, else a JSON dict of exact float values."""
        if self.name in CODEBOOK_NAMES:
            return self.name
        return {"centroids": [float(v) for v in self.centroids], "thresholds": [float(v) for v in self.thresholds]}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Codebook):
            return NotImplemented
        return (
            self.centroids.view(np.uint32).tobytes() == other.centroids.view(np.uint32).tobytes()
            and self.thresholds.view(np.uint32).tobytes() == other.thresholds.view(np.uint32).tobytes()
        )

    def __hash__(self) -> int:
        return hash((self.centroids.tobytes(), self.thresholds.tobytes()))

    def __repr__(self) -> str:
        if self.name in CODEBOOK_NAMES:
            return f"get_codebook({self.name!r}, bits={self.bits})"
        return f"Codebook(centroids={self.centroids.tolist()!r}, thresholds={self.thresholds.tolist()!r})"


def _as_f32_vector(values: ArrayLike, label: str) -> NDArray[np.float32]:
    try:
        a = np.asarray(values)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise ConfigError(f"codebook {label} is not array-like: {exc}") from None
    if a.dtype.kind not in "fiu" or a.dtype.kind == "b":
        raise ConfigError(f"codebook {label} must be real numbers, got dtype {a.dtype}")
    if a.ndim > 1:
        raise ConfigError(f"codebook {label} must be one-dimensional")
    v = np.array(a, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(v)):
        i = int(np.flatnonzero(~np.isfinite(v))[0])
        raise ConfigError(f"codebook {label}[{i}] is not finite ({v[i]!r})")
    return v


# ---------------------------------------------------------------------------
# Lloyd-Max fitting
# ---------------------------------------------------------------------------


def normal_pdf(t: Any) -> Any:
    """The standard normal density ``exp(-t^2/2) / sqrt(2 pi)`` (float64; 0 at +-inf).

    >>> float(normal_pdf(0.0)) == 1 / math.sqrt(2 * math.pi)
    True
    """
    t = np.asarray(t, dtype=np.float64)
    return np.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)


def lloyd_max_iterate(
    start: ArrayLike, tol: float = 1e-15, max_iter: int = 1_000_000, stall: int | None = 2000
) -> tuple[NDArray[np.float64], int, float]:
    """Lloyd-Max levels of N(0, 1) in float64, from the sorted centroids ``start``.

    Alternates the two optimality conditions: thresholds are midpoints of
    adjacent centroids, and each centroid is the conditional mean of its cell,
    ``(phi(a) - phi(b)) / (Phi(b) - Phi(a))``. Stops when the largest centroid
    change is below ``tol``. With 64 or more levels the outer centroids are
    large enough that float64 rounding noise in the update exceeds 1e-15, so
    (unless ``stall`` is None) the iteration also stops once the largest
    change has not reached a new minimum for ``stall`` iterations while below
    1e-12 (the fixed point to float64 precision). Returns (centroids,
    iterations, last change). This is the one fitter in tbq: the shipped
    tables (:func:`lloyd_max`) and the study's reference distortions
    (:func:`tbq.metrics.lloyd_max_levels`) both use it.
    """
    from scipy.special import ndtr

    c = np.asarray(start, dtype=np.float64)
    best, best_it = math.inf, 0
    for it in range(1, max_iter + 1):
        edges = np.concatenate(([-np.inf], 0.5 * (c[1:] + c[:-1]), [np.inf]))
        a, b = edges[:-1], edges[1:]
        # Use the upper tail for positive cells so tiny probabilities keep precision.
        mass = np.where(a >= 0, ndtr(-a) - ndtr(-b), ndtr(b) - ndtr(a))
        new = (normal_pdf(a) - normal_pdf(b)) / mass
        new = 0.5 * (new - new[::-1])  # exact symmetry of the symmetric problem
        change = float(np.max(np.abs(new - c)))
        c = new
        if change < tol:
            return c, it, change
        if change < best:
            best, best_it = change, it
        elif stall is not None and change < 1e-12 and it - best_it >= stall:
            return c, it, change
    raise RuntimeError(f"Lloyd-Max did not reach {tol} in {max_iter} iterations")  # pragma: no cover


def _lloyd_max_standard_normal(levels: int) -> tuple[NDArray[np.float64], int, float]:
    """Lloyd-Max levels of N(0, 1), started from the Gaussian quantiles ``Phi^-1((i + 0.5) / levels)``."""
    from scipy.special import ndtri

    return lloyd_max_iterate(ndtri((np.arange(levels) + 0.5) / levels))


@functools.cache
def _lloyd_max_cached(bits: int, sigma: float) -> Codebook:
    c64, _, _ = _lloyd_max_standard_normal(1 << bits)
    c64 = c64 * sigma
    mids = 0.5 * (c64[1:] + c64[:-1])
    name = "lloyd-max" if sigma == SIGMA_128 else None
    return Codebook(c64.astype(np.float32), mids.astype(np.float32), name=name)


def lloyd_max(bits: int, sigma: float = SIGMA_128) -> Codebook:
    """Lloyd-Max codebook for N(0, sigma**2) with ``2**bits`` levels (cached).

    Fitted in float64 on the standard normal (iterating the closed-form
    conditional means until the update is below 1e-15), scaled by ``sigma``
    and rounded to float32. Thresholds are the float32 values of the float64
    midpoints of adjacent float64 centroids, so the middle threshold is exactly 0.

    >>> cb = lloyd_max(4)
    >>> cb.centroids.dtype, cb.centroids.size, float(cb.thresholds[7])
    (dtype('float32'), 16, 0.0)
    """
    bits = check_int(bits, "lloyd_max bits", lo=1, hi=8, expected="an integer in 1..8", error=ConfigError)
    sigma = float(sigma)
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ConfigError(f"lloyd_max sigma must be a finite number > 0, got {sigma!r}")
    return _lloyd_max_cached(int(bits), sigma)


# ---------------------------------------------------------------------------
# Shipped tables
# ---------------------------------------------------------------------------


@functools.cache
def tables() -> dict[str, Any]:
    """The parsed ``tables.json`` of the conformance set (sign tables and codebooks)."""
    text = resources.files("tbq").joinpath("data/tables.json").read_text()
    return json.loads(text)


def _table_f32(entry: dict[str, Any]) -> NDArray[np.float32]:
    # The bit patterns are the exact values; decimal strings are only for reading.
    return np.array([int(b, 16) for b in entry["float32_bits"]], dtype=np.uint32).view(np.float32)


@functools.cache
def _fork_codebook(bits: int) -> Codebook:
    t = tables()["fork"]
    key = {4: "tbq4", 3: "tbq3"}[bits]
    return Codebook(_table_f32(t[f"{key}_centroids"]), _table_f32(t[f"{key}_midpoints"]), name="turboq-mtp")


def named_codebook(name: str, bits: int) -> Codebook:
    """The named codebook ``"lloyd-max"`` (any bits) or ``"turboq-mtp"`` (bits 3 and 4)."""
    if name == "lloyd-max":
        return lloyd_max(bits)
    if name == "turboq-mtp":
        if bits not in (3, 4):
            raise ConfigError(f"the turboq-mtp tables exist for 3 and 4 bits only, not {bits}")
        return _fork_codebook(bits)
    raise ConfigError(f"unknown codebook {name!r}; use one of {CODEBOOK_NAMES} or a Codebook object")


def get_codebook(spec: Any, bits: int) -> Codebook:
    """Resolve a codebook spec: a name, a :class:`Codebook`, or a config dict.

    The result must have ``2**bits`` centroids.
    """
    if isinstance(spec, Codebook):
        cb = spec
    elif isinstance(spec, str):
        cb = named_codebook(spec, bits)
    elif isinstance(spec, dict):
        if set(spec) != {"centroids", "thresholds"}:
            raise ConfigError(
                f"a codebook dict needs exactly the keys 'centroids' and 'thresholds', got {sorted(spec)}"
            )
        cb = Codebook(spec["centroids"], spec["thresholds"])
    else:
        raise ConfigError(f"codebook must be a name {CODEBOOK_NAMES}, a Codebook or a dict, got {type(spec).__name__}")
    if cb.bits != bits:
        raise ConfigError(
            f"this format needs a {bits}-bit codebook ({1 << bits} centroids), got {cb.centroids.size} centroids"
        )
    return cb


def fork_vs_lloyd_max() -> dict[str, Any]:
    """How far the ``turboq-mtp`` tables are from the fitted Lloyd-Max tables.

    Returns, for 4 bits, the largest relative centroid difference
    ``|fork/fitted - 1|``, and for 3 bits the range of the ratio ``fork/fitted``
    (the fork's 3-bit levels are scaled for a different sigma). These are the
    numbers quoted in ``docs/formats.md``.
    """
    rel4 = np.abs(named_codebook("turboq-mtp", 4).centroids.astype(np.float64) / lloyd_max(4).centroids - 1)
    ratio3 = named_codebook("turboq-mtp", 3).centroids.astype(np.float64) / lloyd_max(3).centroids
    return {
        "tbq4_max_relative_difference": float(rel4.max()),
        "tbq3_ratio_min": float(ratio3.min()),
        "tbq3_ratio_max": float(ratio3.max()),
    }


# ---------------------------------------------------------------------------
# vLLM's TurboQuant tables (a trapezoid-rule Lloyd-Max solver, reproduced as it runs)
# ---------------------------------------------------------------------------


def _trapezoid(f: Any, a: float, b: float, n: int = 200) -> float:
    """``(0.5 * (f(a) + f(b)) + f(a + h) + ... + f(a + (n-1) h)) * h`` with ``h = (b - a) / n``, summed left to right."""
    h = (b - a) / n
    s = 0.5 * (f(a) + f(b))
    for i in range(1, n):
        s += f(a + i * h)
    return s * h


@functools.cache
def trapezoid_lloyd_max(bits: int, dim: int) -> tuple[NDArray[np.float64], int]:
    """vLLM's TurboQuant centroids for N(0, 1/dim) with ``2**bits`` levels, in float64, and the iterations run.

    docs/formats-vllm.md, "Centroid tables": Python floats (``math.exp``), the
    starting grid ``lo + (hi - lo) * (i + 0.5) / L`` on ``[-3.5 sigma, 3.5 sigma]``,
    cells ``[3 lo, b_0, ..., 3 hi]``, each cell's mean by two 200-step
    trapezoid sums, at most 200 updates, and a stop (keeping the centroids
    *before* the last update) once the largest update is below 1e-10. The
    4-bit tables never meet that tolerance: they are the 200th iterate, not
    the Lloyd-Max optimum of :func:`lloyd_max`. Cast to float32 they are the
    tables vLLM serves with (:mod:`tbq.formats.vllm_turboquant`).

    >>> c, it = trapezoid_lloyd_max(3, 128)
    >>> it, hex(int(c.astype(np.float32).view(np.uint32)[-1]))
    (138, '0x3e42a09f')
    """
    levels = 1 << bits
    sigma2 = 1.0 / dim
    sigma = math.sqrt(sigma2)
    norm = 1.0 / math.sqrt(2 * math.pi * sigma2)

    def pdf(x: float) -> float:
        return norm * math.exp(-x * x / (2 * sigma2))

    def xpdf(x: float) -> float:
        return x * pdf(x)

    lo, hi = -3.5 * sigma, 3.5 * sigma
    c = [lo + (hi - lo) * (i + 0.5) / levels for i in range(levels)]
    it = 0
    while it < 200:
        edges = [lo * 3] + [(c[i] + c[i + 1]) / 2.0 for i in range(levels - 1)] + [hi * 3]
        new = []
        for i in range(levels):
            num = _trapezoid(xpdf, edges[i], edges[i + 1])
            den = _trapezoid(pdf, edges[i], edges[i + 1])
            new.append(num / den if den > 1e-15 else c[i])
        it += 1
        if max(abs(new[i] - c[i]) for i in range(levels)) < 1e-10:
            break
        c = new
    out = np.array(c, np.float64)
    out.setflags(write=False)
    return out, it
