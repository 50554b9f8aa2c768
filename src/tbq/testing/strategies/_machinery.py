"""Shared machinery of the strategies: the family table, argument checks, the per-format context (_Fmt), float helpers.

Part of :mod:`tbq.testing.strategies` (see its docstring).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NoReturn, ParamSpec, TypeVar

import numpy as np
from numpy.typing import NDArray

import tbq
from tbq.backend import numba_available
from tbq.codebooks import Codebook, get_codebook
from tbq.errors import is_integer
from tbq.formats import FORMATS, get_format
from tbq.formats.base import FIELD_KINDS, FORMAT_CLASSES, Trace
from tbq.rotation import RandomizedHadamard, get_rotation, hadamard_scale

from ._hypothesis import InvalidArgument, hypothesis, st

F32 = np.float32

#: Every family name :func:`float_blocks` knows, with what it produces.
FAMILIES: dict[str, str] = {
    "gaussian": "N(0, s^2) values, s a power of two between 2**-30 and 2**20",
    "outliers": "Gaussian block with 1-4 outlier channels x10 .. x10000 (keys in real KV caches)",
    "heavy_tail": "Student-t values with 1 to 3 degrees of freedom (Cauchy included)",
    "subnormal": "float32 subnormal values, and blocks whose scale is an fp16 subnormal, rounds to fp16 zero, "
    "or is so small that 1/d overflows float32",
    "huge": "blocks whose float32 scale is between 2**14 and the largest value that still rounds to a finite fp16 (65504)",
    "ties": "scalar-grid formats (Q8_0, Q4_0): values whose scaled product x*(1/d) is exactly a rounding tie (k + 1/2) or one ulp from one; "
    "scales exactly halfway between two fp16 numbers; +a and -a both at the largest magnitude",
    "thresholds": "rotated codebook formats (TBQ): blocks with rotated, normalised coordinates exactly on a decision threshold or one float32 "
    "ulp from one (exact zeros and +-2**-149 for the middle threshold 0)",
    "min_ties": "min/scale grids (Q4_1, Q5_1): (x - min) / d exactly a rounding tie k + 1/2 (or one ulp from one), "
    "min and max pinned, power-of-two and fp16-midpoint scales",
    "grid_ties": "value-table grids (IQ4_NL): x / d0 exactly halfway between two table values (ties go up) or one ulp "
    "from it, and blocks at and around the 1e-15 tiny-block threshold",
    "ue4m3": "NVFP4: sub-block scales amax/6 exactly on a UE4M3 rounding boundary (round half up), one ulp from it, in "
    "the subnormal clamp range and at saturation; values on E2M1 midpoints",
    "binade_tops": "MXFP4: largest magnitudes among the top floats of a binade (where log2f rounds up to the next "
    "exponent) and next to them; values on E2M1 midpoints",
    "fp8_grid": "FP8 (E4M3, E5M2): x / scale exactly on a rounding midpoint of the grid (ties to even) or one ulp from one, "
    "at the saturation edge, in the subnormal range, and inputs where x / scale and x * (1 / scale) differ",
    "constant": "every value equal (any sign and magnitude)",
    "zero": "+0.0, -0.0 or a mix of signed zeros",
    "sparse": "one-hot, a few equal-magnitude spikes, and (TBQ, Hadamard rotation) blocks that rotate to an exact one-hot",
    "overflow": "opt-in: finite values whose scale does not fit fp16 (encode raises ScaleOverflowError)",
    "nonfinite": "opt-in: blocks holding NaN, +Inf or -Inf (encode raises NonFiniteError)",
}

#: Families that every format gets by default (all finite, every scale fits fp16).
DEFAULT_FAMILIES = (
    "gaussian",
    "outliers",
    "heavy_tail",
    "subnormal",
    "huge",
    "ties",
    "thresholds",
    "min_ties",
    "grid_ties",
    "ue4m3",
    "binade_tops",
    "fp8_grid",
    "constant",
    "zero",
    "sparse",
)

#: Families that apply to a format only when it lists them in its ``fuzz.hazards`` (:class:`tbq.formats.capabilities.FuzzTraits`).
HAZARD_FAMILIES = ("ties", "thresholds", "min_ties", "grid_ties", "ue4m3", "binade_tops", "fp8_grid")

#: Old spellings still accepted (golden vectors and the strategies share family names).
_ALIASES = {"heavy_tails": "heavy_tail"}
_UNFIT = ("overflow", "nonfinite")

#: fp16 scale bit patterns :func:`encoded_blocks` injects when ``valid=False``: name -> (lowest, highest), inclusive.
SPECIAL_SCALES: dict[str, tuple[int, int]] = FIELD_KINDS["f16"].specials

_F16_LIMIT = 65520.0  # float32 scales at or above this round to fp16 infinity
_F16_MAX = 65504.0


def _event(text: str) -> None:
    with contextlib.suppress(Exception):  # outside a test (e.g. .example()): statistics are not recorded
        hypothesis.event(text)


#: Strategies built once and reused (see :func:`_sampled`, :func:`_memo_strategy`). A strategy object is immutable,
#: and hypothesis validates a new one on its first draw (tens of microseconds, per draw when the strategy is built
#: inside a composite): reusing one gives the same draws from the same choices, without that cost.
_SAMPLED: dict[Hashable, st.SearchStrategy[Any]] = {}
_T = TypeVar("_T")
_P = ParamSpec("_P")
_S = TypeVar("_S", bound="st.SearchStrategy[Any]")


def _value_key(v: object) -> Hashable:
    """A hashable key for ``v`` that keeps apart what ``==`` and ``hash`` conflate (1, 1.0, True, 0.0, -0.0, float32 and float64)."""
    t = type(v)
    if t is str or t is int or t is type(None):
        return (t, v)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_value_key(i) for i in v))
    if isinstance(v, dict):
        return ("dict", frozenset((_value_key(k), _value_key(i)) for k, i in v.items()))
    if isinstance(v, (float, np.floating, np.integer, bool, np.bool_)):
        return (type(v).__name__, repr(v))
    hash(v)  # TypeError for what cannot be a key (arrays): the caller does not cache
    return (type(v), v)


def _sampled(options: Sequence[_T]) -> st.SearchStrategy[_T]:
    """``st.sampled_from(options)``, built once per distinct ``options`` (compared by type and repr)."""
    key = _value_key(options)
    strat = _SAMPLED.get(key)
    if strat is None:
        if len(_SAMPLED) >= 4096:  # bounded: options drawn from data (e.g. per-block values) must not grow it forever
            _SAMPLED.clear()
        strat = _SAMPLED[key] = st.sampled_from(options)
    return strat


def _memo_strategy(fn: Callable[_P, _S]) -> Callable[_P, _S]:
    """Return the same strategy object for the same arguments (a public strategy called once per example in a test).

    Arguments that cannot be keys (arrays, for instance) build a new strategy each time;
    bad arguments raise each time (nothing is cached for them).
    """
    cache: dict[Hashable, _S] = {}

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _S:
        try:
            key = (_value_key(args), _value_key(kwargs))
        except TypeError:
            return fn(*args, **kwargs)
        strat = cache.get(key)
        if strat is None:
            if len(cache) >= 1024:
                cache.clear()
            strat = cache[key] = fn(*args, **kwargs)
        return strat

    return wrapper


def _fail(func: str, message: str) -> NoReturn:
    raise InvalidArgument(f"{func}: {message}")


def _check_int(func: str, name: str, value: object, lo: int, hi: int | None = None, hint: str = "") -> int:
    if not is_integer(value):
        _fail(func, f"{name} must be an integer, got {value!r} of type {type(value).__name__}. {hint}".strip())
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        _fail(func, f"{name} must be {rng}, got {value!r}. {hint}".strip())
    return int(value)


class _Fmt:
    """Everything the families need to know about one codec configuration."""

    def __init__(
        self,
        name: str,
        codebook: Codebook | None = None,
        rotation: RandomizedHadamard | None = None,
        options: Mapping[str, object] | None = None,
    ) -> None:
        self.name = name
        self.codebook: Codebook | None = codebook
        self.rotation = rotation
        kw: dict[str, object] = dict(options or {})  # the format's own options (FP8: scale)
        if codebook is not None:
            assert rotation is not None  # a codebook comes with its sign vectors (_fmt_cached passes both)
            kw = dict(codebook=codebook, signs=(rotation.signs1, rotation.signs2))
        self.format = get_format(name, **kw)
        self.info = self.format.info  # the instance's sizes (an option may set them: vLLM's head_dim), not FORMATS'
        self.bs = self.info.block_size
        self.ts = self.info.type_size
        self.rotated = self.info.rotated
        self.hazards = self.format.fuzz.hazards
        self.row_kw = self.format._row_kw(1)  # each drawn block is a row of its own for the trace
        self.has_min = any(f.name == "m" and f.kind == "f16" for f in self.info.layout)  # Q4_1/Q5_1
        if self.codebook is None and hasattr(self.format, "thresholds") and hasattr(self.format, "centroids"):
            # a rotated format with fixed tables (planar/iso, turbo): its thresholds drive the family, and a
            # randomized Hadamard rotation of its own (turbo's) is the rotation the family inverts
            self.codebook = Codebook(self.format.centroids, self.format.thresholds)
            rot = getattr(self.format, "rotation", None)
            if self.rotation is None and isinstance(rot, RandomizedHadamard):
                self.rotation = rot
        self.codec = tbq.get_codec(name, backend="numpy", on_overflow="inf", **kw)
        _warm(name, kw)

    def trace(self, x2: NDArray[Any]) -> Trace:
        """The format's trace of each block of ``x2`` (one block per row, each its own row)."""
        with np.errstate(all="ignore"):
            return self.format.reference_encode(np.ascontiguousarray(x2, F32), **self.row_kw)[1]

    @functools.cached_property
    def _kernel_rotate(self) -> Callable[..., tuple[NDArray[np.float32], ...]] | None:
        """The format's numba twin of its trace's rotation and scale (TBQ), when numba is there."""
        return getattr(self.format, "kernel_rotate", None) if numba_available() else None

    def _fast(self, x2: NDArray[Any]) -> NDArray[np.float32] | None:
        """``x2`` as contiguous float32 blocks when the numba twin can take them (finite), else None."""
        if self._kernel_rotate is None:
            return None
        x = np.ascontiguousarray(x2, F32).reshape(-1, self.bs)
        return x if np.isfinite(x).all() else None

    def scales(self, x2: NDArray[Any]) -> NDArray[np.float32]:
        """float32 scale d of each block (one per row), by the reference arithmetic (the format's trace).

        Formats without one scale per block (f16, bf16, NVFP4) use the block's
        largest magnitude instead, which is what the families size blocks by.
        TBQ blocks that are finite take the trace's numba twin (``kernel_rotate``,
        the same bits, property-tested; about 100x faster for one block).
        """
        x = self._fast(x2)
        if x is not None:
            assert self._kernel_rotate is not None
            return self._kernel_rotate(x)[2]
        d = self.trace(x2).get("d")
        if d is not None and np.ndim(d) == 1:
            return d
        return np.max(np.abs(np.asarray(x2, F32)), axis=1)

    def status(self, blk: NDArray[np.float32]) -> int:
        """0 when the codec encodes ``blk`` (one block, or blocks one per row) with on_overflow='raise', else the
        refusing status of the first block it refuses.

        Asked of the numba kernel (a few microseconds; the NumPy trace costs about a millisecond and
        gives the same status, which the properties check), or of the trace without numba.
        """
        x = np.ascontiguousarray(blk, F32).reshape(-1, self.bs)
        if numba_available():
            out = np.empty((x.shape[0], self.ts), np.uint8)
            _, status = self.format.kernel_encode(x, out, True, **self.row_kw, **self.format.overflow_kw("raise"))
            return int(status)
        s = np.asarray(self.format.invalid_blocks(self.trace(x))).ravel()
        return int(s[np.flatnonzero(s)[0]]) if np.any(s) else 0

    def encode(self, x: NDArray[np.float32]) -> NDArray[np.uint8]:
        return self.codec.encode(x)

    def rotated_coords(self, x2: NDArray[Any]) -> NDArray[np.float32]:
        """Normalised, rotated coordinates r = R(u) of each block, by the spec's float32 arithmetic.

        Finite TBQ blocks take the numba twin (``kernel_rotate``: the same bits, property-tested, about
        4x faster for the threshold search's 96 candidates).
        """
        x = self._fast(x2)
        if x is not None:
            assert self._kernel_rotate is not None
            return self._kernel_rotate(x, False)[1]
        return self.format.rotate(np.asarray(x2, dtype=F32))[1]  # type: ignore[attr-defined]  # rotated formats only (TBQ, planar/iso)

    @functools.cached_property
    def hadamard_scale(self) -> np.floating[Any]:
        """The rotation's normalisation C = fl(1/sqrt(n)) (TBQ: the last rounding of a rotated coordinate before its sign)."""
        return hadamard_scale(self.bs, np.float32)

    @functools.cached_property
    def rotation_matrix(self) -> NDArray[np.floating[Any]]:
        if self.rotation is not None:
            return self.rotation.matrix(np.float64)
        # Fixed-table rotations (planar/iso): the encoder's own rotation of the unit vectors
        # (norm 1, so r = R e_j up to float32 rounding); a starting point for the exact search.
        return self.rotated_coords(np.eye(self.bs, dtype=F32)).T.astype(np.float64)


def _warm(name: str, kw: Mapping[str, object]) -> None:
    """Load (or compile) the format's numba kernels now, when the strategy is built.

    A hypothesis test that calls ``tbq.quantize`` would otherwise pay for numba loading its cache (several
    hundred ms; seconds on a cold cache) on its first example, and fail with ``DeadlineExceeded`` under
    hypothesis's default 200 ms deadline. Warming here makes a plain ``@given`` test work.
    """
    if not numba_available():  # pragma: no cover - numba is a runtime dependency
        return
    c = tbq.get_codec(name, backend="numba", on_overflow="inf", **kw)
    for n in (1, 64):  # small calls and batches may take different kernels (e.g. one-block TBQ kernels)
        c.decode(c.encode(np.zeros(n * c.block_size, F32)))


def _takes_tables(name: str) -> bool:
    """True for formats configured by a codebook and sign vectors (the TBQ formats)."""
    return "codebook" in FORMAT_CLASSES[name].options


@functools.lru_cache(maxsize=64)
def _fmt_cached(name: str, cb_key: Hashable, sign_key: Hashable) -> _Fmt:
    if not _takes_tables(name):
        return _Fmt(name)
    cb = _CB_OBJECTS[cb_key]
    rot = _ROT_OBJECTS[sign_key]
    return _Fmt(name, cb, rot)


_CB_OBJECTS: dict[Hashable, Codebook] = {}
_ROT_OBJECTS: dict[Hashable, RandomizedHadamard] = {}
_OPT_OBJECTS: dict[tuple[str, Hashable], dict[str, object]] = {}


@functools.lru_cache(maxsize=64)
def _fmt_with_options(name: str, opt_key: Hashable) -> _Fmt:
    return _Fmt(name, options=_OPT_OBJECTS[(name, opt_key)])


def _resolve_fmt(func: str, fmt: object, codebook: object, signs: object, options: object = None) -> _Fmt:
    """The family context of ``fmt`` (a name or a Codec) with one options mapping (``codebook``/``signs`` are its spellings)."""
    opts = {} if options is None else options
    if not isinstance(opts, dict):
        _fail(func, f"options must be a dict of format options, e.g. {{'scale': 0.0173}}, got {options!r}")
    opts = dict(opts)
    for opt, value in (("codebook", codebook), ("signs", signs)):
        if value is not None:
            opts[opt] = value
    if isinstance(fmt, tbq.Codec):
        if opts:
            _fail(func, "pass codebook=, signs= and options= only with a format name; a Codec already carries its own")
        name = fmt.name
        if _takes_tables(name):
            opts = {"codebook": fmt.codebook, "signs": fmt.rotation}
        else:
            opts = fmt.format.config()
    elif isinstance(fmt, str) and fmt in FORMATS:
        name = fmt
    else:
        _fail(
            func,
            f"unknown format {fmt!r}. Pass one of {', '.join(repr(f) for f in FORMATS)} (tbq.format_names()) or a tbq.Codec "
            "such as tbq.get_codec('tbq4_0', codebook='turboq-mtp')",
        )
    try:
        checked = FORMAT_CLASSES[name].check_options(opts)
    except tbq.TbqError as exc:
        _fail(func, f"{exc}; drop it or pass a format that takes it")
    if not _takes_tables(name):
        if not checked:
            return _fmt_cached(name, None, None)
        key = tuple(sorted((k, repr(v)) for k, v in checked.items()))
        _OPT_OBJECTS.setdefault((name, key), checked)
        return _fmt_with_options(name, key)
    codebook, signs = checked.get("codebook"), checked.get("signs")
    bits = FORMATS[name].index_bits
    try:
        cb = get_codebook("lloyd-max" if codebook is None else codebook, bits)
        rot = get_rotation("turboq-mtp" if signs is None else signs, FORMATS[name].block_size)
    except tbq.TbqError as exc:
        _fail(func, f"bad TBQ configuration for {name!r}: {exc}")
    cb_key = (cb.centroids.tobytes(), cb.thresholds.tobytes())
    sign_key = (rot.signs1.tobytes(), rot.signs2.tobytes())
    _CB_OBJECTS.setdefault(cb_key, cb)
    _ROT_OBJECTS.setdefault(sign_key, rot)
    return _fmt_cached(name, cb_key, sign_key)


#: Default leading shape: () or 1-2 axes of sides 1-3, about as often as one_of(just(()), array_shapes(...)) gave
#: each (measured: () 42 %, (1,) 14 %, ...), as one choice (array_shapes makes about six: 0.6 ms an example).
_DEFAULT_LEADING = st.sampled_from([()] * 17 + [(1,)] * 5 + [(2,), (3,)] * 3 + [(1, 1), (2, 2), (3, 3)] * 2
                                   + [(1, 2), (1, 3), (2, 1), (2, 3), (3, 1), (3, 2)])  # fmt: skip


def _resolve_leading(func: str, leading_shape: object) -> st.SearchStrategy[tuple[int, ...]]:
    if leading_shape is None:
        return _DEFAULT_LEADING
    if isinstance(leading_shape, st.SearchStrategy):
        return leading_shape
    if isinstance(leading_shape, tuple) and all(is_integer(s) and s >= 0 for s in leading_shape):
        return st.just(tuple(int(s) for s in leading_shape))
    _fail(
        func,
        f"leading_shape must be None, a tuple of non-negative ints such as (2, 3), or a strategy of such tuples; "
        f"got {leading_shape!r}",
    )


def _next32(v: float | np.floating[Any], direction: float | np.floating[Any]) -> np.float32:
    return np.nextafter(F32(v), F32(direction), dtype=F32)


def _gauss(rng: np.random.Generator, n: int, scale: float = 1.0) -> NDArray[np.float32]:
    return (rng.standard_normal(n) * scale).astype(F32)
