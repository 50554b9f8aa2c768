"""Moving drawn blocks until the codec takes them: rescaling to a target scale, fitting into fp16's range.

Part of :mod:`tbq.testing.strategies` (see its docstring).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from tbq.backend import STATUS_UNDEFINED

from ._machinery import _F16_LIMIT, _F16_MAX, F32, _Fmt


def _rescale(ctx: _Fmt, blk: NDArray[np.float32], target: float) -> NDArray[np.float32]:
    """Scale ``blk`` so that its float32 scale d is close to ``target`` (> 0)."""
    d0 = abs(float(ctx.scales(blk[None, :])[0]))
    if not (d0 > 0 and math.isfinite(d0)):
        return blk
    with np.errstate(all="ignore"):
        out = (blk.astype(np.float64) * (target / d0)).astype(F32)
    return out if np.isfinite(out).all() else blk


def _fit(ctx: _Fmt, blk: NDArray[np.float32]) -> NDArray[np.float32]:
    """Move ``blk`` until the codec encodes it with on_overflow='raise' (its scale fits, nothing undefined)."""
    for attempt in range(64):
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
        if _F16_LIMIT <= abs(d) < 2 * _F16_LIMIT and attempt < 8:  # d just above: ulps down (not when s or m overflow)
            blk = (blk * F32(1 - 2.0**-12)).astype(F32)
            continue
        k = math.ceil(math.log2(abs(d) / _F16_MAX))
        blk = np.ldexp(blk, -max(k, 1)).astype(F32)
    return np.zeros_like(blk)  # pragma: no cover - defensive: never observed


def _fit_blocks(ctx: _Fmt, blocks: list[NDArray[np.float32]], fit: list[bool]) -> list[NDArray[np.float32]]:
    """``_fit`` of every block whose ``fit`` is true, the others as they are.

    Most drawn blocks already fit: one codec call on all of them says so (it refuses the first block it cannot
    encode), and only when it refuses one is each block fitted on its own. The same blocks either way.
    """
    todo = [i for i, f in enumerate(fit) if f]
    if not todo or ctx.status(np.stack([blocks[i] for i in todo])) == 0:
        return blocks
    return [_fit(ctx, b) if f else b for b, f in zip(blocks, fit, strict=True)]
