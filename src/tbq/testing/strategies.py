"""Hypothesis strategies for fuzzing block-quantization codecs, packers and kernels.

Use them to test your own kernels against :mod:`tbq` (the NumPy reference is
the oracle), or to test tbq itself::

    from hypothesis import given
    from tbq.testing import strategies as tst
    import tbq

    @given(tst.float_blocks("q8_0"))
    def test_my_kernel_matches_tbq(x):
        assert (my_quantize_q8_0(x) == tbq.quantize(x, "q8_0", backend="numpy")).all()

Requires the ``hypothesis`` package (``pip install 'tbq[test]'``); this is the
only module of tbq that imports it.

Building a strategy for a format loads that format's numba kernels (compiling
them on a cold cache), so the first example of your test does not pay for it
and a plain ``@given`` test passes hypothesis's default 200 ms deadline. Your
own kernel's first call may still be slow: give such tests
``@settings(deadline=None)``. Bad arguments raise
:class:`hypothesis.errors.InvalidArgument` when the strategy is created, with a
message that says what to pass instead.

Public strategies
-----------------
- :func:`float_blocks`: float32 arrays whose last axis is a whole number of
  blocks, drawn from bug-finding families (see :data:`FAMILIES`).
- :func:`encoded_blocks`: byte arrays of whole blocks, produced by the encoder
  or arbitrary (with special fp16 scales).
- :func:`codebooks`, :func:`sign_vectors`, :func:`indices`.

The families use a NumPy generator seeded from a hypothesis-drawn integer for
the bulk of the values and hypothesis draws for every structural choice
(family, scale, positions), so examples replay exactly from hypothesis's
database and shrink towards simple families.
"""

from __future__ import annotations

import functools
import math

try:
    import hypothesis
    import hypothesis.extra.numpy as npst
    import hypothesis.strategies as st
    from hypothesis.errors import InvalidArgument
except ImportError as e:  # pragma: no cover - exercised only without hypothesis
    raise ImportError(
        "`tbq.testing.strategies` requires `hypothesis` to be installed: pip install 'tbq[test]' (or pip install hypothesis)"
    ) from e

import numpy as np

import tbq
from tbq.backend import STATUS_UNDEFINED, numba_available
from tbq.codebooks import Codebook, get_codebook
from tbq.formats import FORMAT_CLASSES, FORMATS, get_format
from tbq.rotation import get_rotation, turboq_mtp_signs

__all__ = [
    "FAMILIES",
    "DEFAULT_FAMILIES",
    "HAZARD_FAMILIES",
    "SPECIAL_SCALES",
    "float_blocks",
    "encoded_blocks",
    "codebooks",
    "sign_vectors",
    "indices",
]

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
    "constant": "every value equal (any sign and magnitude)",
    "zero": "+0.0, -0.0 or a mix of signed zeros",
    "sparse": "one-hot, a few equal-magnitude spikes, and (TBQ, Hadamard rotation) blocks that rotate to an exact one-hot",
    "overflow": "opt-in: finite values whose scale does not fit fp16 (encode raises ScaleOverflowError)",
    "nonfinite": "opt-in: blocks holding NaN, +Inf or -Inf (encode raises NonFiniteError)",
}

#: Families that every format gets by default (all finite, every scale fits fp16).
DEFAULT_FAMILIES = (
    "gaussian", "outliers", "heavy_tail", "subnormal", "huge", "ties", "thresholds", "min_ties", "grid_ties", "ue4m3",
    "binade_tops", "constant", "zero", "sparse",
)

#: Families that apply to a format only when it lists them in ``Format.hazards``.
HAZARD_FAMILIES = ("ties", "thresholds", "min_ties", "grid_ties", "ue4m3", "binade_tops")
#: Old spellings still accepted (golden vectors and the strategies share family names).
_ALIASES = {"heavy_tails": "heavy_tail"}
_UNFIT = ("overflow", "nonfinite")

#: fp16 scale bit patterns :func:`encoded_blocks` injects when ``valid=False``.
SPECIAL_SCALES: dict[str, tuple[int, int]] = {
    # name: (lowest, highest) fp16 bit pattern, inclusive
    "+inf": (0x7C00, 0x7C00),
    "-inf": (0xFC00, 0xFC00),
    "nan": (0x7C01, 0x7FFF),
    "-nan": (0xFC01, 0xFFFF),
    "subnormal": (0x0001, 0x03FF),
    "-subnormal": (0x8001, 0x83FF),
    "+0": (0x0000, 0x0000),
    "-0": (0x8000, 0x8000),
    "max": (0x7BFF, 0x7BFF),
    "-max": (0xFBFF, 0xFBFF),
    "min_normal": (0x0400, 0x0400),
    "negative": (0x8400, 0xFBFF),
    "positive": (0x0400, 0x7BFF),
}

_F16_LIMIT = 65520.0  # float32 scales at or above this round to fp16 infinity
_F16_MAX = 65504.0


def _event(text: str) -> None:
    try:
        hypothesis.event(text)
    except Exception:  # outside a test (e.g. .example()): statistics are not recorded
        pass


# ---------------------------------------------------------------------------
# Argument validation
# ---------------------------------------------------------------------------


def _fail(func: str, message: str):
    raise InvalidArgument(f"{func}: {message}")


def _check_int(func, name, value, lo, hi=None, hint=""):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        _fail(func, f"{name} must be an integer, got {value!r} of type {type(value).__name__}. {hint}".strip())
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        _fail(func, f"{name} must be {rng}, got {value!r}. {hint}".strip())
    return int(value)


class _Fmt:
    """Everything the families need to know about one codec configuration."""

    def __init__(self, name, codebook=None, rotation=None):
        self.name = name
        self.info = FORMATS[name]
        self.bs = self.info.block_size
        self.ts = self.info.type_size
        self.rotated = self.info.rotated
        self.codebook = codebook
        self.rotation = rotation
        kw = {}
        if codebook is not None:
            kw = dict(codebook=codebook, signs=(rotation.signs1, rotation.signs2))
        self.format = get_format(name, **kw)
        self.hazards = self.format.hazards
        self.row_kw = self.format._row_kw(1)  # each drawn block is a row of its own for the trace
        self.has_min = any(f.name == "m" and f.kind == "f16" for f in self.info.layout)  # Q4_1/Q5_1
        if self.codebook is None and hasattr(self.format, "thresholds") and hasattr(self.format, "centroids"):
            # a rotated format with fixed tables (planar/iso): its thresholds drive the family
            self.codebook = Codebook(self.format.centroids, self.format.thresholds)
        self.codec = tbq.get_codec(name, backend="numpy", on_overflow="inf", **kw)
        _warm(name, kw)

    def trace(self, x2: np.ndarray) -> dict:
        """The format's trace of each block of ``x2`` (one block per row, each its own row)."""
        with np.errstate(all="ignore"):
            return self.format.reference_encode(np.ascontiguousarray(x2, F32), **self.row_kw)[1]

    def scales(self, x2: np.ndarray) -> np.ndarray:
        """float32 scale d of each block (one per row), by the reference arithmetic (the format's trace).

        Formats without one scale per block (f16, bf16, NVFP4) use the block's
        largest magnitude instead, which is what the families size blocks by.
        """
        d = self.trace(x2).get("d")
        if d is not None and np.ndim(d) == 1:
            return d
        return np.max(np.abs(np.asarray(x2, F32)), axis=1)

    def status(self, blk: np.ndarray) -> int:
        """0 when the codec encodes ``blk`` with on_overflow='raise', else the refusing status.

        Asked of the numba kernel (a few microseconds; the NumPy trace costs about a millisecond and
        gives the same status, which the properties check), or of the trace without numba.
        """
        if numba_available():
            out = np.empty((1, self.ts), np.uint8)
            _, status = self.format.kernel_encode(np.ascontiguousarray(blk, F32).reshape(1, self.bs), out, True, **self.row_kw)
            return int(status)
        s = self.format.invalid_blocks(self.trace(blk[None, :]))
        return int(s[0]) if np.size(s) else 0

    def encode(self, x: np.ndarray) -> np.ndarray:
        return self.codec.encode(x)

    def rotated_coords(self, x2: np.ndarray) -> np.ndarray:
        """Normalised, rotated coordinates r = R(u) of each block, by the spec's float32 arithmetic."""
        return self.format.rotate(np.asarray(x2, dtype=F32))[1]

    @functools.cached_property
    def rotation_matrix(self) -> np.ndarray:
        if self.rotation is not None:
            return self.rotation.matrix(np.float64)
        # Fixed-table rotations (planar/iso): the encoder's own rotation of the unit vectors
        # (norm 1, so r = R e_j up to float32 rounding); a starting point for the exact search.
        return self.rotated_coords(np.eye(self.bs, dtype=F32)).T.astype(np.float64)


def _warm(name, kw):
    """Load (or compile) the format's numba kernels now, when the strategy is built.

    A hypothesis test that calls ``tbq.quantize`` would otherwise pay for
    numba loading its cache (several hundred ms; seconds on a cold cache) on
    its first example, and fail with ``DeadlineExceeded`` under hypothesis's
    default 200 ms deadline. Warming here makes a plain ``@given`` test work.
    """
    if not numba_available():  # pragma: no cover - numba is a runtime dependency
        return
    c = tbq.get_codec(name, backend="numba", on_overflow="inf", **kw)
    for n in (1, 64):  # small calls and batches may take different kernels (e.g. one-block TBQ kernels)
        c.decode(c.encode(np.zeros(n * c.block_size, F32)))


def _takes_tables(name) -> bool:
    """True for formats configured by a codebook and sign vectors (the TBQ formats)."""
    return "codebook" in FORMAT_CLASSES[name].options


@functools.lru_cache(maxsize=64)
def _fmt_cached(name, cb_key, sign_key):
    if not _takes_tables(name):
        return _Fmt(name)
    cb = _CB_OBJECTS[cb_key]
    rot = _ROT_OBJECTS[sign_key]
    return _Fmt(name, cb, rot)


_CB_OBJECTS: dict = {}
_ROT_OBJECTS: dict = {}


def _resolve_fmt(func, fmt, codebook, signs) -> _Fmt:
    if isinstance(fmt, tbq.Codec):
        if codebook is not None or signs is not None:
            _fail(func, "pass codebook= and signs= only with a format name; a Codec already carries its own")
        name = fmt.name
        if _takes_tables(name):
            codebook, signs = fmt.codebook, fmt.rotation
    elif isinstance(fmt, str) and fmt in FORMATS:
        name = fmt
    else:
        _fail(
            func,
            f"unknown format {fmt!r}. Pass one of {', '.join(repr(f) for f in FORMATS)} (tbq.formats()) or a tbq.Codec "
            "such as tbq.get_codec('tbq4_0', codebook='turboq-mtp')",
        )
    if not _takes_tables(name):
        if codebook is not None or signs is not None:
            _fail(func, f"codebook= and signs= apply to the TBQ formats only, not to {name!r}; drop them")
        return _fmt_cached(name, None, None)
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


def _resolve_leading(func, leading_shape):
    if leading_shape is None:
        return st.one_of(st.just(()), npst.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=3))
    if isinstance(leading_shape, st.SearchStrategy):
        return leading_shape
    if isinstance(leading_shape, tuple) and all(
        isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in leading_shape
    ):
        return st.just(tuple(int(s) for s in leading_shape))
    _fail(
        func,
        f"leading_shape must be None, a tuple of non-negative ints such as (2, 3), or a strategy of such tuples; "
        f"got {leading_shape!r}",
    )


# ---------------------------------------------------------------------------
# Small float helpers
# ---------------------------------------------------------------------------


def _f16_finite(d) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.isfinite(np.asarray(d, dtype=F32).astype(np.float16))


def _next32(v, direction):
    return np.nextafter(F32(v), F32(direction), dtype=F32)


def _rescale(ctx: _Fmt, blk: np.ndarray, target: float) -> np.ndarray:
    """Scale ``blk`` so that its float32 scale d is close to ``target`` (> 0)."""
    d0 = abs(float(ctx.scales(blk[None, :])[0]))
    if not (d0 > 0 and math.isfinite(d0)):
        return blk
    with np.errstate(all="ignore"):
        out = (blk.astype(np.float64) * (target / d0)).astype(F32)
    return out if np.isfinite(out).all() else blk


def _fit(ctx: _Fmt, blk: np.ndarray) -> np.ndarray:
    """Move ``blk`` until the codec encodes it with on_overflow='raise' (its scale fits, nothing undefined)."""
    for _ in range(64):
        status = ctx.status(blk)
        if status == 0:
            return blk
        if status == STATUS_UNDEFINED:  # e.g. an MXFP4 exponent below E8M0's range: grow
            blk = np.ldexp(blk, 16).astype(F32)
            continue
        d = float(ctx.scales(blk[None, :])[0])
        if not math.isfinite(d):  # e.g. the TBQ norm overflowed float32
            blk = np.ldexp(blk, -64).astype(F32)
            continue
        if abs(d) < 2 * _F16_LIMIT:  # just above the limit: step down a few ulps at a time
            blk = (blk * F32(1 - 2.0**-12)).astype(F32)
            continue
        k = math.ceil(math.log2(abs(d) / _F16_MAX))
        blk = np.ldexp(blk, -max(k, 1)).astype(F32)
    return np.zeros_like(blk)  # pragma: no cover - defensive: never observed


def _gauss(rng, n, scale=1.0):
    return (rng.standard_normal(n) * scale).astype(F32)


# ---------------------------------------------------------------------------
# Families: each returns one block (float32, shape (block_size,))
# ---------------------------------------------------------------------------


def _fam_gaussian(draw, rng, ctx):
    e = draw(st.one_of(st.just(0), st.integers(-30, 20)))
    return _gauss(rng, ctx.bs, 2.0**e)


def _fam_outliers(draw, rng, ctx):
    s = 2.0 ** draw(st.integers(-10, 6))
    blk = _gauss(rng, ctx.bs, s)
    n = draw(st.integers(1, min(4, ctx.bs)))
    chans = draw(st.lists(st.integers(0, ctx.bs - 1), min_size=n, max_size=n, unique=True))
    mult = draw(st.sampled_from([10.0, 25.0, 100.0, 1000.0, 10000.0]))
    for c in chans:  # at least mult * s in magnitude
        blk[c] = F32(np.copysign(max(abs(float(blk[c])), s) * mult, blk[c]))
    return blk


def _fam_heavy_tail(draw, rng, ctx):
    df = draw(st.sampled_from([1.0, 1.5, 2.0, 3.0]))
    scale = 2.0 ** draw(st.integers(-8, 4))
    with np.errstate(all="ignore"):
        return (rng.standard_t(df, ctx.bs) * scale).astype(F32)


def _fam_subnormal(draw, rng, ctx):
    mode = draw(st.sampled_from(["f32_subnormal", "fp16_subnormal_scale", "scale_underflow", "inverse_overflow", "mixed"]))
    _event(f"subnormal: {mode}")
    bs = ctx.bs
    if mode == "f32_subnormal":
        mant = rng.integers(0, 1 << 23, bs, dtype=np.uint32)
        mant[rng.random(bs) < 0.2] = 0
        sign = (rng.integers(0, 2, bs, dtype=np.uint32) << np.uint32(31)).astype(np.uint32)
        return (mant | sign).view(F32)
    if mode == "mixed":
        blk = _gauss(rng, bs, 2.0 ** draw(st.integers(-12, 0)))
        k = draw(st.integers(1, max(1, bs // 4)))
        pos = rng.choice(bs, k, replace=False)
        blk[pos] = (rng.integers(1, 1 << 23, k, dtype=np.uint32)).view(F32) * rng.choice([F32(-1), F32(1)], k)
        return blk
    blk = _gauss(rng, bs)
    if mode == "fp16_subnormal_scale":
        target = 2.0 ** draw(st.floats(-24.0, -14.01))
    elif mode == "scale_underflow":  # fp16(d) == 0 while the codes are not
        target = 2.0 ** draw(st.floats(-60.0, -25.5))
    else:  # d so small that 1/d overflows float32 (d < 2**-128)
        target = 2.0 ** draw(st.floats(-140.0, -128.5))
    return _rescale(ctx, blk, target)


def _fam_huge(draw, rng, ctx):
    base = draw(st.sampled_from(["gaussian", "outliers", "constant"]))
    blk = {"gaussian": _fam_gaussian, "outliers": _fam_outliers, "constant": _fam_constant}[base](draw, rng, ctx)
    if not np.any(blk):
        blk = _gauss(rng, ctx.bs)
    which = draw(st.sampled_from(["max", "just_below_limit", "range"]))
    _event(f"huge: {which}")
    if which == "max":
        target = _F16_MAX
    elif which == "just_below_limit":
        target = float(_next32(_F16_LIMIT, 0))
    else:
        target = 2.0 ** draw(st.floats(14.01, 15.99))
    if ctx.has_min:  # a min/scale format stores fp16(min) too: keep the block non-negative so the min fits
        blk = np.abs(blk).astype(F32)
        blk[draw(st.integers(0, ctx.bs - 1))] = F32(0)
    out = _rescale(ctx, blk, target)
    if not abs(float(ctx.scales(out[None, :])[0])) >= 2.0**14:  # e.g. a subnormal constant: d underflowed
        g = np.abs(_gauss(rng, ctx.bs)) if ctx.has_min else _gauss(rng, ctx.bs)
        out = _rescale(ctx, g.astype(F32), target)
    return out


def _tie_values(draw, rng, ctx, amax, inv, count):
    """``count`` values x with fl(x * inv) exactly a half-integer (or one ulp from it) inside the code range."""
    lo, hi = ctx.hazards["ties"]["codes"]
    ks = rng.integers(lo, hi + 1, count)
    near = draw(st.sampled_from([0, 0, 1, -1]))  # 0: exact tie; +-1: one ulp above / below the tie
    out = np.empty(count, F32)
    for i, k in enumerate(ks):
        v = F32(k + 0.5)
        if near:
            v = _next32(v, near * np.inf)
        x0 = F32(float(v) / float(inv))
        best = x0
        cand = x0
        for _ in range(6):  # walk a few ulps until the float32 product hits v exactly
            if F32(cand * inv) == v:
                best = cand
                break
            cand = _next32(cand, np.inf if F32(cand * inv) < v else -np.inf)
        if abs(best) >= amax:  # must stay below the block's largest magnitude
            best = x0
        out[i] = best
    return out


def _fam_ties(draw, rng, ctx):
    bs = ctx.bs
    K = ctx.hazards["ties"]["divisor"]  # max|x| / |d|: amax = K * 2**e gives a power-of-two scale
    mode = draw(st.sampled_from(["pow2", "general", "fp16_tie", "sign_tie"]))
    _event(f"ties: {mode}")
    sign = draw(st.sampled_from([F32(1), F32(-1)]))
    pos = draw(st.integers(0, bs - 1))
    if mode == "sign_tie":  # +a and -a share the largest magnitude; Q4_0 takes the first
        blk = _gauss(rng, bs, 2.0 ** draw(st.integers(-6, 4)))
        a = F32(1.5) * np.max(np.abs(blk))
        p, q = sorted(draw(st.lists(st.integers(0, bs - 1), min_size=2, max_size=2, unique=True)))
        blk[p], blk[q] = sign * a, -sign * a
        return blk
    if mode == "pow2":
        amax = F32(K * 2.0 ** draw(st.integers(-20, 12)))
    elif mode == "general":
        amax = F32(2.0 ** rng.uniform(-10, 10))
    else:  # the scale lies exactly halfway between two adjacent normal fp16 numbers
        h = draw(st.integers(0x0400, 0x7BFE))
        lo_ = float(np.array(h, np.uint16).view(np.float16))
        hi_ = float(np.array(h + 1, np.uint16).view(np.float16))
        amax = F32(K * (lo_ + hi_) / 2)
    m = sign * amax
    blk = np.empty(bs, F32)
    blk[pos] = m
    lone = np.zeros((1, bs), F32)
    lone[0, pos] = m
    d = ctx.scales(lone)[0]  # the format's own scale of a block whose largest value is m
    inv = F32(1) / d
    others = np.array([i for i in range(bs) if i != pos])
    if mode == "fp16_tie":
        blk[others] = (rng.uniform(-0.9, 0.9, bs - 1) * amax).astype(F32)
        return blk
    vals = _tie_values(draw, rng, ctx, amax, inv, bs - 1)
    frac = draw(st.sampled_from([1.0, 0.5]))
    rand = (rng.uniform(-0.95, 0.95, bs - 1) * amax).astype(F32)
    blk[others] = np.where(rng.random(bs - 1) < frac, vals, rand)
    return blk


def _fam_constant(draw, rng, ctx):
    v = draw(
        st.one_of(
            st.sampled_from([0.5, -0.5, 1.0, -1.0, 3.0]),
            st.floats(-1e4, 1e4, width=32, allow_nan=False, allow_infinity=False),
        )
    )
    return np.full(ctx.bs, v, F32)


def _fam_zero(draw, rng, ctx):
    mode = draw(st.sampled_from(["+0", "-0", "mixed"]))
    if mode == "+0":
        return np.zeros(ctx.bs, F32)
    if mode == "-0":
        return np.full(ctx.bs, -0.0, F32)
    return np.where(rng.random(ctx.bs) < 0.5, F32(0.0), F32(-0.0)).astype(F32)


def _fam_sparse(draw, rng, ctx):
    bs = ctx.bs
    modes = ["one_hot", "spikes"] + (["rotated_one_hot"] if ctx.rotation is not None else [])
    mode = draw(st.sampled_from(modes))
    blk = np.zeros(bs, F32)
    if mode == "one_hot":
        mag = draw(st.sampled_from([1.0, 0.5, 2.75, 100.0, 0.003, 3.0]))
        blk[draw(st.integers(0, bs - 1))] = draw(st.sampled_from([mag, -mag]))
        return blk
    if mode == "spikes":
        n = draw(st.integers(min(2, bs), min(4, bs)))  # a one-value block (f16, bf16) has one spike
        pos = draw(st.lists(st.integers(0, bs - 1), min_size=n, max_size=n, unique=True))
        mag = F32(2.0 ** draw(st.integers(-10, 6)))
        for p in pos:
            blk[p] = mag * draw(st.sampled_from([F32(1), F32(-1)]))
        return blk
    k = draw(st.integers(0, bs - 1))
    c = draw(st.sampled_from([1.0, -1.0, 3.0]))
    e = np.zeros(bs, F32)
    e[k] = 1
    return (ctx.rotation.inverse(e) * F32(c)).astype(F32)


def _threshold_targets(ctx):
    thr = ctx.codebook.thresholds
    return [float(t) for t in thr if abs(t) > 2.0**-20 and abs(t) < 0.7]  # (a threshold next to 0 is hit by the zero modes)


def _search_threshold_block(rng, ctx, targets_j, targets_v, iters=60, ncand=96):
    """Find x whose rotated coordinates r[targets_j] equal targets_v exactly (float32), or None."""
    bs = ctx.bs
    M = ctx.rotation_matrix
    r = rng.standard_normal(bs) / math.sqrt(bs)
    J = np.asarray(targets_j)
    T = np.asarray(targets_v, F32)
    rest = np.ones(bs, bool)
    rest[J] = False
    room = 1.0 - float(np.sum(T.astype(np.float64) ** 2))
    if room <= 0.05:
        return None
    r[J] = T
    r[rest] *= math.sqrt(room / float(np.sum(r[rest] ** 2)))
    x = (M.T @ r).astype(F32)
    # perturb only the inputs the target coordinates depend on (all of them for a Hadamard
    # rotation; the pair or group of a Givens or quaternion rotation)
    support = np.flatnonzero(np.abs(M[J]).sum(axis=0) > 1e-12)
    spacing_T = np.spacing(np.abs(T)).astype(np.float64)
    best_err = None
    for it in range(iters):
        cand = np.repeat(x[None, :], ncand, axis=0)
        if it or best_err is None:
            scale = 1 if best_err is None else max(1, int(min(64, best_err)))
            k = rng.integers(1, 9)
            cols = rng.choice(support, (ncand, k))
            steps = rng.integers(-scale, scale + 1, (ncand, k))
            rows = np.repeat(np.arange(ncand)[:, None], k, axis=1)
            ulp = np.spacing(np.abs(cand[rows, cols])).astype(np.float64)
            cand[rows, cols] = (cand[rows, cols] + steps * ulp).astype(F32)
            cand[0] = x
        rr = ctx.rotated_coords(cand)
        err = np.abs(rr[:, J].astype(np.float64) - T) / spacing_T
        tot = err.sum(axis=1)
        hit = np.flatnonzero(tot == 0)
        if hit.size:
            return cand[hit[0]]
        b = int(np.argmin(tot))
        x = cand[b]
        best_err = float(err[b].max())
    return None


def _pair_zero_block(draw, ctx, mode):
    bs = ctx.bs
    # x_p = a, x_q = +-a with p, q differing in bit 0: the butterfly's first stage gives exactly 0
    # (or 2a), so half of the rotated coordinates are exact (signed) zeros; a tiny x_k then puts
    # those coordinates at +-(the tiny value), e.g. one ulp (2**-149) from the threshold 0.
    m = draw(st.integers(0, bs // 2 - 1))
    p, q = 2 * m, 2 * m + 1
    lo_e = -6 if mode == "exact_zero" else 0
    a = F32(2.0 ** draw(st.integers(lo_e, 6)) * draw(st.sampled_from([1.0, -1.0, 1.5])))
    blk = np.zeros(bs, F32)
    blk[p] = a
    rel = draw(st.sampled_from([F32(1), F32(-1)]))
    blk[q] = a * rel
    if mode == "exact_zero":
        if draw(st.booleans()):
            # more pairs with the same relation after the first sign flip s1 (the butterfly sees s1 * x):
            # then every pair cancels in the same half of the coordinates, which stay exactly 0
            s1 = ctx.rotation.signs1.astype(F32)
            eff = rel * s1[p] * s1[q]
            for mm in draw(st.lists(st.integers(0, bs // 2 - 1), max_size=3, unique=True)):
                if mm != m:
                    sgn = draw(st.sampled_from([F32(1), F32(-1)]))
                    blk[2 * mm] = a * sgn
                    blk[2 * mm + 1] = a * sgn * eff * s1[2 * mm] * s1[2 * mm + 1]
        return blk
    k = draw(st.integers(0, bs - 1).filter(lambda i: i not in (p, q)))
    # The cancelled coordinates become +-fl(fl(x_k / norm) * C): try a batch of tiny x_k
    # (j * 2**-149 * norm, j = 1..64) and keep one that lands exactly on +-2**-149.
    cands = np.repeat(blk[None, :], 64, axis=0)
    norm = float(abs(a)) * math.sqrt(2.0)
    cands[:, k] = (np.arange(1, 65) * 2.0**-149 * norm).astype(F32)
    rr = ctx.rotated_coords(cands)
    one_ulp = np.any(np.abs(rr) == F32(2.0**-149), axis=1)
    pick = int(np.flatnonzero(one_ulp)[0]) if one_ulp.any() else draw(st.integers(0, 63))
    return cands[pick]


def _fam_thresholds(draw, rng, ctx):
    bs = ctx.bs
    thr = ctx.codebook.thresholds
    has_zero = bool(np.any(thr == 0))
    modes = (["exact_zero", "next_to_zero"] if has_zero else []) + (["on_threshold"] if _threshold_targets(ctx) else [])
    if not modes:  # a custom codebook without reachable thresholds
        return _fam_gaussian(draw, rng, ctx)
    mode = draw(st.sampled_from(modes))
    _event(f"thresholds: {mode}")
    if mode in ("exact_zero", "next_to_zero"):
        return _pair_zero_block(draw, ctx, mode)
    targets = _threshold_targets(ctx)
    n = draw(st.integers(1, 2))
    J = draw(st.lists(st.integers(0, bs - 1), min_size=n, max_size=n, unique=True))
    V = []
    for _ in range(n):
        t = F32(draw(st.sampled_from(targets)))
        nudge = draw(st.sampled_from([0, 0, 1, -1]))
        V.append(_next32(t, nudge * np.inf) if nudge else t)
    x = None
    for attempt in range(3 if has_zero else 12):  # without zero modes to fall back on, search longer
        x = _search_threshold_block(rng, ctx, J, V)
        if x is not None:
            break
        if len(J) > 1:  # two at once is harder: fall back to one
            J, V = J[:1], V[:1]
        elif attempt >= 2:  # another coordinate (the same target)
            J = [int(rng.integers(0, bs))]
    if x is None:  # rare (about 1 in 100): fall back to exact zeros on the middle threshold
        _event("thresholds: search failed, fell back to exact_zero")
        if has_zero:
            return _pair_zero_block(draw, ctx, "exact_zero")
        return _fam_gaussian(draw, rng, ctx)  # pragma: no cover - custom codebook without a 0 threshold
    e = draw(st.integers(-10, 10))  # a power of two leaves the rotated coordinates bit-identical
    return np.ldexp(x, e).astype(F32)


# --- families aimed at the newer formats' hazards ------------------------------------


def _fam_min_ties(draw, rng, ctx):
    """Q4_1/Q5_1: v = (x - min) * (1/d) exactly k + 1/2, where t = v + 0.5 is an integer (round half up)."""
    levels = int(ctx.hazards["min_ties"]["levels"])
    bs = ctx.bs
    mode = draw(st.sampled_from(["pow2", "near", "min_fp16_tie", "random_rest"]))
    _event(f"min_ties: {mode}")
    d = 2.0 ** draw(st.integers(-14, 6))
    if mode == "min_fp16_tie":  # min exactly halfway between two fp16 numbers
        h = draw(st.integers(0x0400, 0x7000))
        lo_, hi_ = (float(np.array(v, np.uint16).view(np.float16)) for v in (h, h + 1))
        mn = -F32((lo_ + hi_) / 2)
        d = 2.0 ** math.floor(math.log2(abs(float(mn)) / 4096)) if mn else d  # keep x - min exact
    else:
        mn = F32(draw(st.integers(-64, 64)) * d)
    blk = np.empty(bs, F32)
    k = rng.integers(0, levels, bs)
    blk[:] = (float(mn) + (k + 0.5) * d)
    if mode == "near":
        blk = np.nextafter(blk, np.where(rng.random(bs) < 0.5, np.inf, -np.inf).astype(F32), dtype=F32)
    if mode == "random_rest":
        rest = rng.random(bs) < 0.5
        blk[rest] = (float(mn) + rng.uniform(0, levels, rest.sum()) * d).astype(F32)
    p, q = draw(st.lists(st.integers(0, bs - 1), min_size=2, max_size=2, unique=True))
    blk[p] = mn  # pin min and max: d = (max - min) / levels exactly
    blk[q] = F32(float(mn) + levels * d)
    return blk.astype(F32)


def _fam_grid_ties(draw, rng, ctx):
    """IQ4_NL: a = x / d0 exactly halfway between two table values (the tie goes to the upper index)."""
    table = np.asarray(ctx.hazards["grid_ties"]["table"], np.float64)
    divisor = F32(ctx.hazards["grid_ties"]["divisor"])
    bs = ctx.bs
    mode = draw(st.sampled_from(["pow2", "pow2", "general", "near", "tiny"]))
    _event(f"grid_ties: {mode}")
    if mode == "tiny":  # max |x| at, just below or just above the 1e-15 tiny-block threshold
        lim = F32(1e-15)
        amax = draw(st.sampled_from([lim, _next32(lim, 0), _next32(lim, np.inf), F32(0), F32(1e-20)]))
        blk = (rng.uniform(-1, 1, bs) * float(amax)).astype(F32)
        blk[draw(st.integers(0, bs - 1))] = amax
        return blk
    mids = (table[1:] + table[:-1]) / 2
    sign = draw(st.sampled_from([F32(1), F32(-1)]))
    e = draw(st.integers(-20, 6))
    amax = F32(abs(float(divisor)) * 2.0**e) if mode != "general" else F32(2.0 ** rng.uniform(-10, 6))
    m = sign * amax
    d0 = F32(m / divisor)
    inv = F32(F32(1) / d0)
    blk = (rng.uniform(-0.9, 0.9, bs) * float(amax)).astype(F32)
    pos = draw(st.integers(0, bs - 1))
    for j in rng.choice(bs, bs // 2, replace=False):
        if j == pos:
            continue
        target = F32(rng.choice(mids))
        if mode == "near":
            target = _next32(target, rng.choice([np.inf, -np.inf]))
        x = F32(float(target) / float(inv))
        for _ in range(6):  # walk a few ulps until the float32 product hits the target
            if F32(x * inv) == target:
                break
            x = _next32(x, np.inf if F32(x * inv) < target else -np.inf)
        if abs(x) < amax:
            blk[j] = x
    blk[pos] = m  # the first value of largest magnitude, written last so nothing above overrides it
    blk[np.abs(blk) >= amax] = (blk[np.abs(blk) >= amax] * F32(0.5)).astype(F32)
    blk[pos] = m
    return blk


def _e2m1_midpoints(blk_scale: float) -> np.ndarray:
    """Midpoints of the doubled E2M1 grid 0, 1, 2, 3, 4, 6, 8, 12 times ``blk_scale`` (exact ties: smaller magnitude wins)."""
    v = np.array([0, 1, 2, 3, 4, 6, 8, 12], np.float64)
    return (v[1:] + v[:-1]) / 2 * blk_scale


def _fp4_fill(rng, amax, scale, n):
    """``n`` values below ``amax``: half uniform, half on E2M1 midpoints of ``scale`` (either sign)."""
    vals = rng.uniform(-1, 1, n) * float(amax)
    mids = _e2m1_midpoints(float(scale))
    mids = mids[mids < float(amax)]
    if mids.size and float(scale) > 0:
        on = rng.random(n) < 0.5
        vals[on] = rng.choice(mids, on.sum()) * rng.choice([-1.0, 1.0], on.sum())
    return vals.astype(F32)


def _fam_ue4m3(draw, rng, ctx):
    """NVFP4: each sub-block's s = amax/6 on a UE4M3 rounding boundary (half up), near it, subnormal or saturated."""
    sub = int(ctx.hazards["ue4m3"].get("sub_block", 16))
    bs = ctx.bs
    blk = np.empty(bs, F32)
    for s0 in range(0, bs, sub):
        kinds = ["half_up", "near", "subnormal", "saturate"] + (["random"] if s0 else [])  # sub-block 0 always aims
        mode = draw(st.sampled_from(kinds))
        _event(f"ue4m3: {mode}")
        if mode in ("half_up", "near"):
            ue, mnt = draw(st.integers(1, 14)), draw(st.integers(0, 7))
            s = (1 + (mnt + 0.5) / 8) * 2.0 ** (ue - 7)  # the first dropped mantissa bit is 1, the rest 0
        elif mode == "subnormal":
            s = draw(st.sampled_from([7.5 * 2**-9, float(_next32(2.0**-6, 0)), 2.0**-10, (draw(st.integers(0, 6)) + 0.5) * 2**-9]))
        elif mode == "saturate":
            s = draw(st.sampled_from([240.0, 248.0, 250.0, 256.0, 447.0, 448.0, 1000.0]))
        else:
            s = 2.0 ** rng.uniform(-12, 8)
        amax = F32(6 * s)  # s has at most 5 significant bits: 6 * s and amax / 6 are exact
        if mode == "near":
            amax = _next32(amax, draw(st.sampled_from([np.inf, -np.inf])))
        vals = _fp4_fill(rng, amax, float(amax) / 6 / 1.0, sub)
        vals[draw(st.integers(0, sub - 1))] = amax * draw(st.sampled_from([F32(1), F32(-1)]))
        blk[s0 : s0 + sub] = vals
    return blk


def _fam_binade_tops(draw, rng, ctx):
    """MXFP4: amax among the top floats of its binade, where floor(log2f(amax)) rounds up to the next exponent."""
    bs = ctx.bs
    b = draw(st.integers(-40, 40))
    i = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 21, 22, 23, 43, 44, 45]))
    top = np.float32(2.0 ** (b + 1))
    amax = top
    for _ in range(i + 1):
        amax = _next32(amax, 0)  # i + 1 ulps below the next power of two
    _event(f"binade_tops: {i + 1} ulps below 2**{b + 1}")
    d = float(ctx.scales(np.full((1, bs), amax, F32))[0])  # the format's own scale for this amax
    blk = _fp4_fill(rng, amax, d, bs)
    blk[draw(st.integers(0, bs - 1))] = amax * draw(st.sampled_from([F32(1), F32(-1)]))
    return blk


def _fam_overflow(draw, rng, ctx):
    blk = _gauss(rng, ctx.bs)
    which = draw(st.sampled_from(["at_limit", "range", "extreme"]))
    if which == "at_limit":
        return _rescale(ctx, blk, _F16_LIMIT * (1 + 2.0**-20))
    if which == "range":
        return _rescale(ctx, blk, 2.0 ** draw(st.floats(16.0, 40.0)))
    blk[draw(st.integers(0, ctx.bs - 1))] = draw(st.sampled_from([F32(3e38), F32(-3e38), F32(1e20)]))
    return blk


def _fam_nonfinite(draw, rng, ctx):
    blk = _gauss(rng, ctx.bs)
    n = draw(st.integers(1, min(3, ctx.bs)))
    for p in draw(st.lists(st.integers(0, ctx.bs - 1), min_size=n, max_size=n, unique=True)):
        blk[p] = draw(st.sampled_from([F32(np.nan), F32(np.inf), F32(-np.inf)]))
    return blk


_FAMILY_FUNCS = {
    "gaussian": _fam_gaussian,
    "outliers": _fam_outliers,
    "heavy_tail": _fam_heavy_tail,
    "subnormal": _fam_subnormal,
    "huge": _fam_huge,
    "ties": _fam_ties,
    "min_ties": _fam_min_ties,
    "grid_ties": _fam_grid_ties,
    "ue4m3": _fam_ue4m3,
    "binade_tops": _fam_binade_tops,
    "thresholds": _fam_thresholds,
    "constant": _fam_constant,
    "zero": _fam_zero,
    "sparse": _fam_sparse,
    "overflow": _fam_overflow,
    "nonfinite": _fam_nonfinite,
}


@st.composite
def _one_block(draw, ctx: _Fmt, families: tuple):
    fam = draw(st.sampled_from(families))
    _event(f"family: {fam}")
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    blk = np.ascontiguousarray(_FAMILY_FUNCS[fam](draw, rng, ctx), dtype=F32)
    if fam not in _UNFIT:
        if not np.isfinite(blk).all():  # e.g. a Cauchy draw scaled up: clip into float32
            blk = np.nan_to_num(blk, nan=0.0, posinf=1e30, neginf=-1e30).astype(F32)
        blk = _fit(ctx, blk)
    return blk


@st.composite
def _float_blocks(draw, ctx, min_blocks, max_blocks, leading, families, elements):
    lead = tuple(draw(leading))
    nb = draw(st.integers(min_blocks, max_blocks))
    shape = lead + (nb * ctx.bs,)
    if elements is not None:
        return draw(npst.arrays(np.float32, shape, elements=elements))
    total = int(np.prod(lead, dtype=np.int64)) * nb
    if total == 0:
        return np.zeros(shape, F32)
    blocks = [draw(_one_block(ctx, families)) for _ in range(total)]
    return np.concatenate(blocks).reshape(shape)


def float_blocks(
    fmt,
    *,
    min_blocks: int = 1,
    max_blocks: int = 4,
    leading_shape=None,
    families=None,
    elements=None,
    codebook=None,
    signs=None,
) -> st.SearchStrategy[np.ndarray]:
    """float32 arrays whose last axis is a whole number of blocks of ``fmt``.

    Requires the hypothesis package to be installed.

    Parameters
    ----------
    fmt : ``"q8_0"``, ``"q4_0"``, ``"tbq4_0"``, ``"tbq3_0"`` or a :class:`tbq.Codec`
        (a TBQ codec brings its codebook and sign vectors, which the
        ``thresholds`` family needs).
    min_blocks, max_blocks : number of blocks along the last axis (default 1..4).
    leading_shape : ``None`` (draws ``()`` or a small 1-2 axis shape), a fixed
        tuple such as ``(2, 3)``, or a strategy of tuples.
    families : names from :data:`FAMILIES`; each block draws one of them.
        Default: :data:`DEFAULT_FAMILIES` that apply to ``fmt`` (``ties`` for
        Q8_0/Q4_0, ``thresholds`` for TBQ). All default families are finite and
        every block's scale fits fp16, so ``encode`` with ``on_overflow="raise"``
        succeeds. ``"overflow"`` and ``"nonfinite"`` are opt-in bad inputs.
    elements : a strategy of floats (e.g. ``st.floats(-1, 1, width=32)``); when
        given, every value is drawn from it instead of from the families.
    codebook, signs : with a TBQ format name, the codec configuration the
        ``thresholds`` family aims at (default ``"lloyd-max"``, ``"turboq-mtp"``).

    Examples
    --------
    >>> from tbq.testing import strategies as tst
    >>> x = tst.float_blocks("q8_0", max_blocks=2).example()
    >>> x.dtype, x.shape[-1] % 32, 32 <= x.shape[-1] <= 64
    (dtype('float32'), 0, True)
    >>> tst.float_blocks("tbq4_0", families=["thresholds"], max_blocks=1, leading_shape=()).example().shape
    (128,)

    See Also
    --------
    encoded_blocks
    """
    func = "float_blocks"
    ctx = _resolve_fmt(func, fmt, codebook, signs)
    min_blocks = _check_int(func, "min_blocks", min_blocks, 0, hint="Pass e.g. min_blocks=1.")
    max_blocks = _check_int(func, "max_blocks", max_blocks, 0, hint="Pass e.g. max_blocks=4.")
    if max_blocks < min_blocks:
        _fail(func, f"max_blocks={max_blocks} is smaller than min_blocks={min_blocks}; pass max_blocks >= min_blocks")
    leading = _resolve_leading(func, leading_shape)
    if elements is not None:
        if families is not None:
            _fail(func, "pass either elements= (every value from one strategy) or families=, not both")
        if not isinstance(elements, st.SearchStrategy):
            _fail(
                func,
                f"elements must be a hypothesis strategy of floats such as st.floats(-1, 1, width=32), got {elements!r}",
            )
        return _float_blocks(ctx, min_blocks, max_blocks, leading, None, elements)
    fams = _resolve_families(func, ctx, families)
    return _float_blocks(ctx, min_blocks, max_blocks, leading, fams, None)


def _resolve_families(func, ctx, families):
    if families is None:
        fams = [f for f in DEFAULT_FAMILIES if _applies(f, ctx)]
        return tuple(fams)
    if isinstance(families, str):
        _fail(func, f"families must be a list of names, e.g. families=[{families!r}], not a bare string")
    try:
        fams = [_ALIASES.get(f, f) if isinstance(f, str) else f for f in families]
    except TypeError:
        _fail(func, f"families must be a list of names from {sorted(FAMILIES)}, got {families!r}")
    unknown = [f for f in fams if f not in FAMILIES]
    if unknown:
        _fail(func, f"unknown families {unknown}; choose from {sorted(FAMILIES)}")
    if not fams:
        _fail(func, f"families is empty; pass at least one of {sorted(FAMILIES)} or None for the defaults")
    for f in fams:
        if not _applies(f, ctx):
            kinds = ", ".join(n for n, c in FORMAT_CLASSES.items() if f in c.hazards)
            alts = " or ".join(repr(h) for h in ctx.hazards) or "the default families"
            _fail(func, f"family {f!r} only applies to {kinds}, not to {ctx.name!r}; drop it (or use {alts} for {ctx.name!r})")
    return tuple(dict.fromkeys(fams))


def _applies(fam, ctx):
    return fam not in HAZARD_FAMILIES or fam in ctx.hazards


# ---------------------------------------------------------------------------
# Encoded blocks
# ---------------------------------------------------------------------------


@st.composite
def _arbitrary_bytes(draw, ctx, min_blocks, max_blocks, leading, special_scales):
    lead = tuple(draw(leading))
    nb = draw(st.integers(min_blocks, max_blocks))
    nblocks = int(np.prod(lead, dtype=np.int64)) * nb
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    pattern = draw(st.sampled_from(["random", "zeros", "ones", "alternating", "random"]))
    _event(f"bytes: {pattern}")
    if pattern == "random":
        data = rng.integers(0, 256, (nblocks, ctx.ts), dtype=np.uint8)
    elif pattern == "zeros":
        data = np.zeros((nblocks, ctx.ts), np.uint8)
    elif pattern == "ones":
        data = np.full((nblocks, ctx.ts), 0xFF, np.uint8)
    else:
        data = np.tile(np.array([0x0F, 0xF0, 0x55, 0xAA], np.uint8), (nblocks, ctx.ts // 4 + 1))[:, : ctx.ts].copy()
    if special_scales:
        names = list(SPECIAL_SCALES)
        for b in range(nblocks):
            if draw(st.integers(0, 3)) == 0:
                continue  # keep the random scale
            kind = draw(st.sampled_from(names))
            _event(f"scale: {kind}")
            lo, hi = SPECIAL_SCALES[kind]
            bits = draw(st.integers(lo, hi))
            data[b, 0] = bits & 0xFF
            data[b, 1] = bits >> 8
    return data.reshape(lead + (nb * ctx.ts,))


@st.composite
def _valid_bytes(draw, ctx, xs):
    return ctx.encode(draw(xs))


def encoded_blocks(
    fmt,
    *,
    valid: bool = True,
    min_blocks: int = 1,
    max_blocks: int = 4,
    leading_shape=None,
    special_scales: bool = True,
    codebook=None,
    signs=None,
) -> st.SearchStrategy[np.ndarray]:
    """uint8 arrays whose last axis is a whole number of encoded blocks of ``fmt``.

    Requires the hypothesis package to be installed.

    Parameters
    ----------
    fmt : a format name or a :class:`tbq.Codec` (as in :func:`float_blocks`).
    valid : ``True`` gives blocks produced by the NumPy reference encoder from
        :func:`float_blocks` (every scale finite); ``False`` gives arbitrary
        bytes (random, all-zero, all-0xFF and alternating nibble patterns).
    special_scales : with ``valid=False``, most blocks get an fp16 scale drawn
        from :data:`SPECIAL_SCALES`: +-Inf, NaN (any payload, either sign),
        subnormals, +-0, +-65504, the smallest normal.
    min_blocks, max_blocks, leading_shape, codebook, signs : as in :func:`float_blocks`.

    Examples
    --------
    >>> from tbq.testing import strategies as tst
    >>> b = tst.encoded_blocks("tbq3_0", valid=False, leading_shape=()).example()
    >>> b.dtype, b.shape[-1] % 50
    (dtype('uint8'), 0)
    >>> tst.encoded_blocks("q4_0", min_blocks=2, max_blocks=2, leading_shape=(3,)).example().shape
    (3, 36)
    """
    func = "encoded_blocks"
    if not isinstance(valid, bool):
        _fail(func, f"valid must be True (encoder output) or False (arbitrary bytes), got {valid!r}")
    if not isinstance(special_scales, bool):
        _fail(func, f"special_scales must be True or False, got {special_scales!r}")
    ctx = _resolve_fmt(func, fmt, codebook, signs)
    min_blocks = _check_int(func, "min_blocks", min_blocks, 0, hint="Pass e.g. min_blocks=1.")
    max_blocks = _check_int(func, "max_blocks", max_blocks, 0, hint="Pass e.g. max_blocks=4.")
    if max_blocks < min_blocks:
        _fail(func, f"max_blocks={max_blocks} is smaller than min_blocks={min_blocks}; pass max_blocks >= min_blocks")
    leading = _resolve_leading(func, leading_shape)
    if valid:
        fams = _resolve_families(func, ctx, None)
        return _valid_bytes(ctx, _float_blocks(ctx, min_blocks, max_blocks, leading, fams, None))
    return _arbitrary_bytes(ctx, min_blocks, max_blocks, leading, special_scales)


# ---------------------------------------------------------------------------
# Codebooks, sign vectors, indices
# ---------------------------------------------------------------------------


@st.composite
def _codebooks(draw, bits, named, symmetric, scale):
    n = 1 << bits
    if named and draw(st.integers(0, 3)) == 0:
        names = ["lloyd-max"] + (["turboq-mtp"] if bits in (3, 4) else [])
        return get_codebook(draw(st.sampled_from(names)), bits)
    sym = draw(st.booleans()) if symmetric is None else symmetric
    s = scale * 2.0 ** draw(st.integers(-4, 4))
    pos = st.floats(2.0**-20, 6.0, width=32).map(lambda v: F32(v * s))
    if sym:
        half = draw(st.lists(pos, min_size=n // 2, max_size=n // 2, unique=True))
        h = np.unique(np.asarray(half, F32))
        if h.size < n // 2:  # scaling merged two values: spread them out deterministically
            h = (np.arange(1, n // 2 + 1) * F32(s / n)).astype(F32)
        c = np.concatenate((-h[::-1], h)).astype(F32)
    else:
        full = draw(st.lists(pos.map(lambda v: F32(v - F32(3 * s))), min_size=n, max_size=n, unique=True))
        c = np.unique(np.asarray(full, F32))
        if c.size < n:
            c = ((np.arange(n) - n / 2 + 0.5) * (s / n)).astype(F32)
    mode = draw(st.sampled_from(["midpoint", "random"]))
    lo, hi = c[:-1].astype(np.float64), c[1:].astype(np.float64)
    if mode == "midpoint":
        f = np.full(n - 1, 0.5)
    else:
        f = np.asarray(draw(st.lists(st.floats(0.0, 1.0), min_size=n - 1, max_size=n - 1)))
    m = (lo + f * (hi - lo)).astype(F32)
    m = np.where(m >= c[1:], c[:-1], m)  # thresholds[i] in [c[i], c[i+1]): strictly increasing
    # (the symmetric mirror below turns the lower half into (c[i], c[i+1]]: still between the centroids)
    if sym:
        m[: n // 2 - 1] = -m[n // 2 :][::-1]
        m[n // 2 - 1] = 0
    return Codebook(c, m)


def codebooks(bits: int, *, named: bool = True, symmetric=None, scale: float = 1.0 / math.sqrt(128)):
    """Valid :class:`tbq.Codebook` objects with ``2**bits`` centroids.

    Requires the hypothesis package to be installed.

        Centroids are distinct float32 values in increasing order (around
    ``scale``, default sigma = 1/sqrt(128), times a power of two); thresholds
    are strictly increasing and lie between adjacent centroids
    (``c[i] <= m[i] <= c[i+1]``), at midpoints or anywhere in the gap.
    ``named=True`` sometimes returns the shipped ``"lloyd-max"`` (and, for 3
    and 4 bits, ``"turboq-mtp"``) tables; ``symmetric=True`` gives sign-symmetric
    codebooks (middle threshold exactly 0), ``False`` asymmetric ones, ``None``
    both.

    Examples
    --------
    >>> from tbq.testing import strategies as tst
    >>> cb = tst.codebooks(3).example()
    >>> cb.centroids.size, cb.thresholds.size, bool((cb.centroids[1:] > cb.centroids[:-1]).all())
    (8, 7, True)
    >>> import tbq
    >>> tbq.get_codec("tbq3_0", codebook=tst.codebooks(3).example()).block_size
    128
    """
    func = "codebooks"
    bits = _check_int(func, "bits", bits, 1, 8, hint="TBQ4_0 uses bits=4, TBQ3_0 bits=3.")
    if not isinstance(named, bool):
        _fail(func, f"named must be True or False, got {named!r}")
    if symmetric is not None and not isinstance(symmetric, bool):
        _fail(func, f"symmetric must be None, True or False, got {symmetric!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (0 < scale < 1e30):
        _fail(func, f"scale must be a positive finite float such as 1/sqrt(128), got {scale!r}")
    return _codebooks(bits, named, symmetric, float(scale))


@st.composite
def _sign_vector(draw, n):
    patterns = ["random", "all_plus", "all_minus", "alternating"] + (["turboq-mtp"] if n == 128 else [])
    kind = draw(st.sampled_from(patterns))
    if kind == "random":
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        return (1 - 2 * rng.integers(0, 2, n)).astype(np.int8)
    if kind == "all_plus":
        return np.ones(n, np.int8)
    if kind == "all_minus":
        return -np.ones(n, np.int8)
    if kind == "alternating":
        return np.where(np.arange(n) % 2 == 0, 1, -1).astype(np.int8)
    return turboq_mtp_signs()[draw(st.integers(0, 1))].copy()


def sign_vectors(n: int = 128, *, pair: bool = True):
    """Vectors of +1/-1 (int8) of length ``n``, as the TBQ ``signs=`` option takes them.

    Requires the hypothesis package to be installed.

    ``pair=True`` (default) gives a tuple ``(signs1, signs2)`` that can be passed
    as ``signs=`` or to :class:`tbq.rotation.RandomizedHadamard`; ``pair=False``
    gives one vector. Patterns: random, all +1, all -1, alternating, and (for
    n = 128) the deployed ``turboq-mtp`` tables.

    Examples
    --------
    >>> from tbq.testing import strategies as tst
    >>> s1, s2 = tst.sign_vectors(128).example()
    >>> s1.dtype, s1.shape, sorted(set(s1.tolist()) | set(s2.tolist())) in ([-1], [1], [-1, 1])
    (dtype('int8'), (128,), True)
    """
    func = "sign_vectors"
    n = _check_int(func, "n", n, 1, 1 << 20, hint="TBQ blocks use n=128.")
    if n & (n - 1):
        _fail(func, f"n must be a power of two (the Walsh-Hadamard length), such as 128; got {n}")
    if not isinstance(pair, bool):
        _fail(func, f"pair must be True (a (signs1, signs2) tuple) or False (one vector), got {pair!r}")
    one = _sign_vector(n)
    return st.tuples(one, one) if pair else one


@st.composite
def _indices(draw, bits, n, leading):
    lead = tuple(draw(leading))
    shape = lead + (n,)
    size = int(np.prod(shape, dtype=np.int64))
    top = (1 << bits) - 1
    kind = draw(st.sampled_from(["random", "zeros", "max", "alternating", "ramp", "one_value"]))
    if kind == "random":
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        a = rng.integers(0, top + 1, size, dtype=np.uint16)
    elif kind == "zeros":
        a = np.zeros(size, np.uint16)
    elif kind == "max":
        a = np.full(size, top, np.uint16)
    elif kind == "alternating":
        a = np.where(np.arange(size) % 2 == 0, 0, top)
    elif kind == "ramp":
        a = np.arange(size) % (top + 1)
    else:
        a = np.zeros(size, np.uint16)
        if size:
            a[draw(st.integers(0, size - 1))] = draw(st.integers(1, top)) if top else 0
    return np.asarray(a, np.uint8).reshape(shape)


def indices(bits: int, n: int, *, leading_shape=()):
    """uint8 arrays of ``n`` codebook indices in ``[0, 2**bits)`` along the last axis.

    Requires the hypothesis package to be installed.

    Patterns: random, all zero, all ``2**bits - 1``, alternating 0 / max, a
    ramp ``0, 1, ..., 2**bits - 1, 0, ...`` (for bits=3 the spec's example lane
    ``0..7 -> 0x88 0xC6 0xFA``) and a single non-zero value. ``leading_shape``
    is a tuple or a strategy of tuples (default ``()``).

    Examples
    --------
    >>> from tbq.testing import strategies as tst
    >>> from tbq.packing import pack3, unpack3
    >>> idx = tst.indices(3, 16).example()
    >>> idx.shape, bool(idx.max() < 8), bool((unpack3(pack3(idx)) == idx).all())
    ((16,), True, True)
    """
    func = "indices"
    bits = _check_int(func, "bits", bits, 1, 8, hint="pack3 takes bits=3, pack4_* bits=4.")
    n = _check_int(func, "n", n, 0, hint="Pass the number of indices per row, e.g. n=128 for one TBQ block.")
    leading = _resolve_leading(func, leading_shape)
    return _indices(bits, n, leading)
