"""Families every format gets: Gaussian, outliers, heavy tails, subnormals, huge values, constants, zeros, sparse blocks, and the opt-in bad inputs.

Part of :mod:`tbq.testing.strategies` (see its docstring).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from . import _rng
from ._fit import _rescale
from ._hypothesis import st
from ._machinery import _F16_LIMIT, _F16_MAX, F32, _event, _Fmt, _gauss, _next32, _sampled

#: The constant family's simple values (and the ends: signed zeros, the smallest subnormal and normal, +-1e4).
_CONSTANT_VALUES = (0.5, -0.5, 1.0, -1.0, 3.0, 0.0, -0.0, 2.0**-149, -(2.0**-126), 1e4, -1e4)


def _fam_gaussian(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    e = 0 if rng.random() < 0.5 else _rng.integer(rng, -30, 20)  # the scale: 1 half the time, 2**-30..2**20
    return _gauss(rng, ctx.bs, 2.0**e)


def _fam_outliers(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    s = 2.0 ** _rng.integer(rng, -10, 6)
    blk = _gauss(rng, ctx.bs, s)
    n = _rng.integer(rng, 1, min(4, ctx.bs))
    chans = _rng.distinct(rng, n, 0, ctx.bs - 1)
    mult = _rng.pick(rng, [10.0, 25.0, 100.0, 1000.0, 10000.0])
    for c in chans:  # at least mult * s in magnitude
        blk[c] = F32(np.copysign(max(abs(float(blk[c])), s) * mult, blk[c]))
    return blk


def _fam_heavy_tail(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    df = _rng.pick(rng, [1.0, 1.5, 2.0, 3.0])
    scale = 2.0 ** _rng.integer(rng, -8, 4)
    with np.errstate(all="ignore"):
        return (rng.standard_t(df, ctx.bs) * scale).astype(F32)


def _fam_subnormal(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    mode = draw(_sampled(["f32_subnormal", "fp16_subnormal_scale", "scale_underflow", "inverse_overflow", "mixed"]))
    _event(f"subnormal: {mode}")
    bs = ctx.bs
    if mode == "f32_subnormal":
        mant = rng.integers(0, 1 << 23, bs, dtype=np.uint32)
        mant[rng.random(bs) < 0.2] = 0
        sign = (rng.integers(0, 2, bs, dtype=np.uint32) << np.uint32(31)).astype(np.uint32)
        return (mant | sign).view(F32)
    if mode == "mixed":
        blk = _gauss(rng, bs, 2.0 ** _rng.integer(rng, -12, 0))
        k = _rng.integer(rng, 1, max(1, bs // 4))
        pos = rng.choice(bs, k, replace=False)
        blk[pos] = (rng.integers(1, 1 << 23, k, dtype=np.uint32)).view(F32) * rng.choice([F32(-1), F32(1)], k)
        return blk
    blk = _gauss(rng, bs)
    if mode == "fp16_subnormal_scale":
        target = 2.0 ** _rng.real(rng, -24.0, -14.01)
    elif mode == "scale_underflow":  # fp16(d) == 0 while the codes are not
        target = 2.0 ** _rng.real(rng, -60.0, -25.5)
    else:  # d so small that 1/d overflows float32 (d < 2**-128)
        target = 2.0 ** _rng.real(rng, -140.0, -128.5)
    return _rescale(ctx, blk, target)


def _fam_huge(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    base = _rng.pick(rng, ["gaussian", "outliers", "constant"])
    blk = {"gaussian": _fam_gaussian, "outliers": _fam_outliers, "constant": _fam_constant}[base](draw, rng, ctx)
    if not np.any(blk):
        blk = _gauss(rng, ctx.bs)
    which = draw(_sampled(["max", "just_below_limit", "range"]))
    _event(f"huge: {which}")
    if which == "max":
        target = _F16_MAX
    elif which == "just_below_limit":
        target = float(_next32(_F16_LIMIT, 0))
    else:
        target = 2.0 ** _rng.real(rng, 14.01, 15.99)
    if ctx.has_min:  # a min/scale format stores fp16(min) too: keep the block non-negative so the min fits
        blk = np.abs(blk).astype(F32)
        blk[_rng.integer(rng, 0, ctx.bs - 1)] = F32(0)
    out = _rescale(ctx, blk, target)
    if not abs(float(ctx.scales(out[None, :])[0])) >= 2.0**14:  # e.g. a subnormal constant: d underflowed
        g = np.abs(_gauss(rng, ctx.bs)) if ctx.has_min else _gauss(rng, ctx.bs)
        out = _rescale(ctx, g.astype(F32), target)
    return out


def _fam_constant(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    u = rng.random()
    if u < 0.4:
        v = _rng.pick(rng, _CONSTANT_VALUES)
    elif u < 0.7:  # any float32 in +-1e4
        v = float(F32(rng.uniform(-1e4, 1e4)))
    else:  # log-uniform magnitudes from the subnormals up to 1e4
        v = float(F32(_rng.sign(rng) * 2.0 ** rng.uniform(-149, 13.28)))
    return np.full(ctx.bs, v, F32)


def _fam_zero(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    mode = draw(_sampled(["+0", "-0", "mixed"]))
    if mode == "+0":
        return np.zeros(ctx.bs, F32)
    if mode == "-0":
        return np.full(ctx.bs, -0.0, F32)
    return np.where(rng.random(ctx.bs) < 0.5, F32(0.0), F32(-0.0)).astype(F32)


def _fam_sparse(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    bs = ctx.bs
    modes = ["one_hot", "spikes"] + (["rotated_one_hot"] if ctx.rotation is not None else [])
    mode = draw(_sampled(modes))
    blk = np.zeros(bs, F32)
    if mode == "one_hot":
        mag = _rng.pick(rng, [1.0, 0.5, 2.75, 100.0, 0.003, 3.0])
        blk[_rng.integer(rng, 0, bs - 1)] = _rng.pick(rng, [mag, -mag])
        return blk
    if mode == "spikes":
        n = _rng.integer(rng, min(2, bs), min(4, bs))  # a one-value block (f16, bf16) has one spike
        pos = _rng.distinct(rng, n, 0, bs - 1)
        mag = F32(2.0 ** _rng.integer(rng, -10, 6))
        for p in pos:
            blk[p] = mag * _rng.sign(rng)
        return blk
    k = _rng.integer(rng, 0, bs - 1)
    c = _rng.pick(rng, [1.0, -1.0, 3.0])
    e = np.zeros(bs, F32)
    e[k] = 1
    assert ctx.rotation is not None  # rotated_one_hot is a mode only with a rotation
    return (ctx.rotation.inverse(e) * F32(c)).astype(F32)


def _fam_overflow(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    blk = _gauss(rng, ctx.bs)
    which = draw(_sampled(["at_limit", "range", "extreme"]))
    if which == "at_limit":
        return _rescale(ctx, blk, _F16_LIMIT * (1 + 2.0**-20))
    if which == "range":
        return _rescale(ctx, blk, 2.0 ** _rng.real(rng, 16.0, 40.0))
    blk[_rng.integer(rng, 0, ctx.bs - 1)] = _rng.pick(rng, [F32(3e38), F32(-3e38), F32(1e20)])
    return blk


def _fam_nonfinite(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    blk = _gauss(rng, ctx.bs)
    n = _rng.integer(rng, 1, min(3, ctx.bs))
    for p in _rng.distinct(rng, n, 0, ctx.bs - 1):
        blk[p] = _rng.pick(rng, [F32(np.nan), F32(np.inf), F32(-np.inf)])
    return blk
