"""Families aimed at ggml's FP4 types: NVFP4's UE4M3 sub-block scales, MXFP4's binade tops.

Part of :mod:`tbq.testing.strategies` (see its docstring).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from . import _rng
from ._hypothesis import st
from ._machinery import F32, _event, _Fmt, _next32, _sampled


def _e2m1_midpoints(blk_scale: float) -> NDArray[np.float64]:
    """Midpoints of the doubled E2M1 grid 0, 1, 2, 3, 4, 6, 8, 12 times ``blk_scale`` (exact ties: smaller magnitude wins)."""
    v = np.array([0, 1, 2, 3, 4, 6, 8, 12], np.float64)
    return (v[1:] + v[:-1]) / 2 * blk_scale


def _fp4_fill(rng: np.random.Generator, amax: float | np.float32, scale: float, n: int) -> NDArray[np.float32]:
    """``n`` values below ``amax``: half uniform, half on E2M1 midpoints of ``scale`` (either sign)."""
    vals = rng.uniform(-1, 1, n) * float(amax)
    mids = _e2m1_midpoints(float(scale))
    mids = mids[mids < float(amax)]
    if mids.size and float(scale) > 0:
        on = rng.random(n) < 0.5
        vals[on] = rng.choice(mids, on.sum()) * rng.choice([-1.0, 1.0], on.sum())
    return vals.astype(F32)


def _fam_ue4m3(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    """NVFP4: each sub-block's s = amax/6 on a UE4M3 rounding boundary (half up), near it, subnormal or saturated."""
    sub = int(ctx.hazards["ue4m3"].get("sub_block", 16))
    bs = ctx.bs
    blk = np.empty(bs, F32)
    for s0 in range(0, bs, sub):
        kinds = ["half_up", "near", "subnormal", "saturate"] + (["random"] if s0 else [])  # sub-block 0 always aims
        mode = draw(_sampled(kinds))
        _event(f"ue4m3: {mode}")
        if mode in ("half_up", "near"):
            ue, mnt = _rng.integer(rng, 1, 14), _rng.integer(rng, 0, 7)
            s = (1 + (mnt + 0.5) / 8) * 2.0 ** (ue - 7)  # the first dropped mantissa bit is 1, the rest 0
        elif mode == "subnormal":
            s = _rng.pick(
                rng, [7.5 * 2**-9, float(_next32(2.0**-6, 0)), 2.0**-10, (_rng.integer(rng, 0, 6) + 0.5) * 2**-9]
            )
        elif mode == "saturate":
            s = _rng.pick(rng, [240.0, 248.0, 250.0, 256.0, 447.0, 448.0, 1000.0])
        else:
            s = 2.0 ** rng.uniform(-12, 8)
        amax = F32(6 * s)  # s has at most 5 significant bits: 6 * s and amax / 6 are exact
        if mode == "near":
            amax = _next32(amax, _rng.pick(rng, [np.inf, -np.inf]))
        vals = _fp4_fill(rng, amax, float(amax) / 6 / 1.0, sub)
        vals[_rng.integer(rng, 0, sub - 1)] = amax * _rng.sign(rng)
        blk[s0 : s0 + sub] = vals
    return blk


def _fam_binade_tops(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    """MXFP4: amax among the top floats of its binade, where floor(log2f(amax)) rounds up to the next exponent."""
    bs = ctx.bs
    b = _rng.integer(rng, -40, 40)
    i = draw(_sampled([0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 21, 22, 23, 43, 44, 45]))  # the mode: ulps below the top
    top = np.float32(2.0 ** (b + 1))
    amax = top
    for _ in range(i + 1):
        amax = _next32(amax, 0)  # i + 1 ulps below the next power of two
    _event(f"binade_tops: {i + 1} ulps below 2**{b + 1}")
    d = float(ctx.scales(np.full((1, bs), amax, F32))[0])  # the format's own scale for this amax
    blk = _fp4_fill(rng, amax, d, bs)
    blk[_rng.integer(rng, 0, bs - 1)] = amax * _rng.sign(rng)
    return blk
