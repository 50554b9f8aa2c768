"""Families aimed at the scalar grids (Q8_0, Q4_0, Q5_0; Q4_1, Q5_1; IQ4_NL): exact rounding ties of the scaled values.

Part of :mod:`tbq.testing.strategies` (see its docstring).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from . import _rng
from ._hypothesis import st
from ._machinery import F32, _event, _Fmt, _gauss, _next32, _sampled


def _tie_values(
    rng: np.random.Generator, ctx: _Fmt, amax: np.float32, inv: np.float32, count: int
) -> NDArray[np.float32]:
    """``count`` values x with fl(x * inv) exactly a half-integer (or one ulp from it) inside the code range."""
    lo, hi = ctx.hazards["ties"]["codes"]
    ks = rng.integers(lo, hi + 1, count)
    near = _rng.pick(rng, [0, 0, 1, -1])  # 0: exact tie; +-1: one ulp above / below the tie
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


def _fam_ties(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    bs = ctx.bs
    K = ctx.hazards["ties"]["divisor"]  # max|x| / |d|: amax = K * 2**e gives a power-of-two scale
    # the trace quantity the encoder multiplies x by (default 1/d; Q8_K: iscale = -127/max, not 1/d)
    mult = ctx.hazards["ties"].get("multiplier")
    # an exact fp16 tie of the scale only where the scale is stored as fp16 (not Q8_K's float32 d)
    f16_d = any(f.name == "d" and f.kind == "f16" for f in ctx.info.layout)
    mode = draw(_sampled(["pow2", "general", "fp16_tie", "sign_tie"] if f16_d else ["pow2", "general", "sign_tie"]))
    _event(f"ties: {mode}")
    sign = _rng.sign(rng)
    pos = _rng.integer(rng, 0, bs - 1)
    if mode == "sign_tie":  # +a and -a share the largest magnitude; Q4_0 takes the first
        blk = _gauss(rng, bs, 2.0 ** _rng.integer(rng, -6, 4))
        a = F32(1.5) * np.max(np.abs(blk))
        p, q = sorted(_rng.distinct(rng, 2, 0, bs - 1))
        blk[p], blk[q] = sign * a, -sign * a
        return blk
    if mode == "pow2":
        amax = F32(K * 2.0 ** _rng.integer(rng, -20, 12))
    elif mode == "general":
        amax = F32(2.0 ** rng.uniform(-10, 10))
    else:  # the scale lies exactly halfway between two adjacent normal fp16 numbers
        h = _rng.integer(rng, 0x0400, 0x7BFE)
        lo_ = float(np.array(h, np.uint16).view(np.float16))
        hi_ = float(np.array(h + 1, np.uint16).view(np.float16))
        amax = F32(K * (lo_ + hi_) / 2)
    m = sign * amax
    blk = np.empty(bs, F32)
    blk[pos] = m
    lone = np.zeros((1, bs), F32)
    lone[0, pos] = m
    d = ctx.scales(lone)[0]  # the format's own scale of a block whose largest value is m
    inv = F32(1) / d if mult is None else F32(ctx.trace(lone)[mult][0])
    others = np.array([i for i in range(bs) if i != pos])
    if mode == "fp16_tie":
        blk[others] = (rng.uniform(-0.9, 0.9, bs - 1) * amax).astype(F32)
        return blk
    vals = _tie_values(rng, ctx, amax, inv, bs - 1)
    frac = _rng.pick(rng, [1.0, 0.5])
    rand = (rng.uniform(-0.95, 0.95, bs - 1) * amax).astype(F32)
    blk[others] = np.where(rng.random(bs - 1) < frac, vals, rand)
    return blk


def _fam_min_ties(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    """Q4_1/Q5_1: v = (x - min) * (1/d) exactly k + 1/2, where t = v + 0.5 is an integer (round half up)."""
    levels = int(ctx.hazards["min_ties"]["levels"])
    bs = ctx.bs
    mode = draw(_sampled(["pow2", "near", "min_fp16_tie", "random_rest"]))
    _event(f"min_ties: {mode}")
    d = 2.0 ** _rng.integer(rng, -14, 6)
    if mode == "min_fp16_tie":  # min exactly halfway between two fp16 numbers
        h = _rng.integer(rng, 0x0400, 0x7000)
        lo_, hi_ = (float(np.array(v, np.uint16).view(np.float16)) for v in (h, h + 1))
        mn = -F32((lo_ + hi_) / 2)
        d = 2.0 ** math.floor(math.log2(abs(float(mn)) / 4096)) if mn else d  # keep x - min exact
    else:
        mn = F32(_rng.integer(rng, -64, 64) * d)
    blk = np.empty(bs, F32)
    k = rng.integers(0, levels, bs)
    blk[:] = float(mn) + (k + 0.5) * d
    if mode == "near":
        blk = np.nextafter(blk, np.where(rng.random(bs) < 0.5, np.inf, -np.inf).astype(F32), dtype=F32)
    if mode == "random_rest":
        rest = rng.random(bs) < 0.5
        blk[rest] = (float(mn) + rng.uniform(0, levels, rest.sum()) * d).astype(F32)
    p, q = _rng.distinct(rng, 2, 0, bs - 1)
    blk[p] = mn  # pin min and max: d = (max - min) / levels exactly
    blk[q] = F32(float(mn) + levels * d)
    return blk.astype(F32)


def _fam_grid_ties(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    """IQ4_NL: a = x / d0 exactly halfway between two table values (the tie goes to the upper index)."""
    table = np.asarray(ctx.hazards["grid_ties"]["table"], np.float64)
    divisor = F32(ctx.hazards["grid_ties"]["divisor"])
    bs = ctx.bs
    mode = draw(_sampled(["pow2", "pow2", "general", "near", "tiny"]))
    _event(f"grid_ties: {mode}")
    if mode == "tiny":  # max |x| at, just below or just above the 1e-15 tiny-block threshold
        lim = F32(1e-15)
        amax = _rng.pick(rng, [lim, _next32(lim, 0), _next32(lim, np.inf), F32(0), F32(1e-20)])
        blk = (rng.uniform(-1, 1, bs) * float(amax)).astype(F32)
        blk[_rng.integer(rng, 0, bs - 1)] = amax
        return blk
    mids = (table[1:] + table[:-1]) / 2
    sign = _rng.sign(rng)
    e = _rng.integer(rng, -20, 6)
    amax = F32(abs(float(divisor)) * 2.0**e) if mode != "general" else F32(2.0 ** rng.uniform(-10, 6))
    m = sign * amax
    d0 = F32(m / divisor)
    inv = F32(F32(1) / d0)
    blk = (rng.uniform(-0.9, 0.9, bs) * float(amax)).astype(F32)
    pos = _rng.integer(rng, 0, bs - 1)
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
