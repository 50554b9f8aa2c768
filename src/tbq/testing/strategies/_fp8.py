"""The fp8_grid family aimed at FP8's hazards (ties on the grid, the saturation edge, subnormals, the scale division).

Part of :mod:`tbq.testing.strategies` (see its docstring).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from . import _rng
from ._hypothesis import st
from ._machinery import F32, _event, _Fmt, _next32, _sampled


def _fam_fp8_grid(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    """One value (block size 1) whose quotient v = x / s sits on an FP8 hazard; ``hazards["fp8_grid"]`` gives the
    grid's finite magnitudes, the overflow limit (the midpoint above the largest value) and the scale."""
    h = ctx.hazards["fp8_grid"]
    grid = np.asarray(h["values"], np.float64)
    s = F32(h["scale"])
    mids = (grid[:-1] + grid[1:]) / 2
    mode = draw(_sampled(["tie", "near_tie", "saturation", "subnormal", "division"]))
    _event(f"fp8_grid: {mode}")
    sign = _rng.sign(rng)
    if mode == "saturation":
        v = _rng.pick(
            rng,
            [grid[-1], float(h["limit"]), float(_next32(F32(h["limit"]), 0)), float(_next32(F32(grid[-1]), np.inf))],
        )
    elif mode == "subnormal":
        sub = grid[grid < float(h["min_normal"])]
        v = float(_rng.pick(rng, list(sub[:-1] + np.diff(sub) / 2) + list(sub[1:]) + [sub[1] / 2]))
    else:
        v = float(mids[_rng.integer(rng, 0, mids.size - 1)])
    target = F32(v)
    if mode == "near_tie":
        target = _next32(target, _rng.pick(rng, [np.inf, -np.inf]))
    with np.errstate(all="ignore"):
        x = F32(float(target) * float(s))
        best = x
        for _ in range(8):  # walk a few ulps until the float32 quotient hits the target
            q = F32(x / s)
            if q == target:
                best = x
                break
            x = _next32(x, np.inf if q < target else -np.inf)
        if mode == "division":  # the nearest input whose x / s and x * (1/s) differ, if one is close
            inv = F32(F32(1) / s)
            for k in range(64):
                c = (best.view(np.uint32) + np.uint32(k)).view(F32)
                if F32(c / s) != F32(c * inv):
                    best = c
                    break
    blk = np.array([sign * best], F32)
    for _ in range(16):  # at the saturation edge: the largest value below the overflow that still encodes
        if mode != "saturation" or ctx.status(blk) == 0:
            break
        blk = np.array([_next32(blk[0], 0)], F32)
    return blk
