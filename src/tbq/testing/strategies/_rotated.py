"""The thresholds family of the rotated codebook formats (TBQ, planar/iso): rotated coordinates on a decision threshold.

Part of :mod:`tbq.testing.strategies` (see its docstring).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from . import _rng
from ._generic import _fam_gaussian
from ._hypothesis import st
from ._machinery import F32, _event, _Fmt, _next32, _sampled


def _threshold_targets(ctx: _Fmt) -> list[float]:
    assert ctx.codebook is not None  # the thresholds family applies only to codebook formats
    thr = ctx.codebook.thresholds
    return [
        float(t) for t in thr if abs(t) > 2.0**-20 and abs(t) < 0.7
    ]  # (a threshold next to 0 is hit by the zero modes)


@functools.lru_cache(maxsize=1024)
def _reachable(scale: float, v: float) -> bool:
    """Whether ``v`` is ``fl(C * h)`` for some float32 ``h`` (``C`` = ``scale``), i.e. a possible rotated coordinate.

    The Hadamard rotation's last rounding is the multiplication by ``C = fl(1/sqrt(n))``
    (then the sign ``s2``, exact): ``r = s2 * fl(C * h)`` with ``h`` the butterfly's float32
    output. ``h -> fl(C * h)`` is monotone, and where ``C * ulp(h)`` exceeds ``ulp(C * h)``
    (the upper part of a binade of ``r``) it skips about 3 values in 10: such a ``v`` is never a
    rotated coordinate, whatever the input, so a search for it cannot succeed. ``h`` near
    ``v / C`` decides it: the largest ``h`` with ``fl(C * h) <= |v|`` is within a few ulps of it.
    Depends only on the codebook and the rotation, never on the draw: cached.
    """
    c, t = F32(scale), abs(F32(v))
    if t == 0 or not np.isfinite(t):
        return True
    h = F32(float(t) / float(c))
    for _ in range(8):  # walk down to below the target, then up through it
        if F32(c * h) < t:
            break
        h = _next32(h, -np.inf)
    for _ in range(16):
        got = F32(c * h)
        if got == t:
            return True
        if got > t:
            return False
        h = _next32(h, np.inf)
    return True  # pragma: no cover - never reached: let the search decide


def _search_threshold_block(
    rng: np.random.Generator,
    ctx: _Fmt,
    targets_j: Sequence[int],
    targets_v: Sequence[np.float32],
    iters: int = 60,
    ncand: int = 96,
) -> NDArray[np.float32] | None:
    """Find x whose rotated coordinates r[targets_j] equal targets_v exactly (float32), or None.

    A target that no rotated coordinate can take (:func:`_reachable`) returns None at once,
    before any random draw: the full search would have returned None after ``iters`` rounds
    (the caller then retries from a fresh random start either way).
    """
    if ctx.rotation is not None and not all(_reachable(float(ctx.hadamard_scale), float(v)) for v in targets_v):
        return None
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


def _pair_zero_block(rng: np.random.Generator, ctx: _Fmt, mode: str) -> NDArray[np.float32]:
    bs = ctx.bs
    # x_p = a, x_q = +-a with p, q differing in bit 0: the butterfly's first stage gives exactly 0
    # (or 2a), so half of the rotated coordinates are exact (signed) zeros; a tiny x_k then puts
    # those coordinates at +-(the tiny value), e.g. one ulp (2**-149) from the threshold 0.
    m = _rng.integer(rng, 0, bs // 2 - 1)
    p, q = 2 * m, 2 * m + 1
    lo_e = -6 if mode == "exact_zero" else 0
    a = F32(2.0 ** _rng.integer(rng, lo_e, 6) * _rng.pick(rng, [1.0, -1.0, 1.5]))
    blk = np.zeros(bs, F32)
    blk[p] = a
    rel = _rng.sign(rng)
    blk[q] = a * rel
    if mode == "exact_zero":
        if rng.random() < 0.5:
            # more pairs with the same relation after the first sign flip s1 (the butterfly sees s1 * x):
            # then every pair cancels in the same half of the coordinates, which stay exactly 0
            assert ctx.rotation is not None  # a 0 threshold: a TBQ codebook, so a Hadamard rotation
            s1 = ctx.rotation.signs1.astype(F32)
            eff = rel * s1[p] * s1[q]
            for mm in _rng.distinct(rng, _rng.integer(rng, 0, 3), 0, bs // 2 - 1):
                if mm != m:
                    sgn = _rng.sign(rng)
                    blk[2 * mm] = a * sgn
                    blk[2 * mm + 1] = a * sgn * eff * s1[2 * mm] * s1[2 * mm + 1]
        return blk
    k = _rng.pick(rng, [i for i in range(bs) if i not in (p, q)])
    # The cancelled coordinates become +-fl(fl(x_k / norm) * C): try a batch of tiny x_k
    # (j * 2**-149 * norm, j = 1..64) and keep one that lands exactly on +-2**-149.
    cands = np.repeat(blk[None, :], 64, axis=0)
    norm = float(abs(a)) * math.sqrt(2.0)
    cands[:, k] = (np.arange(1, 65) * 2.0**-149 * norm).astype(F32)
    rr = ctx.rotated_coords(cands)
    one_ulp = np.any(np.abs(rr) == F32(2.0**-149), axis=1)
    pick = int(np.flatnonzero(one_ulp)[0]) if one_ulp.any() else _rng.integer(rng, 0, 63)
    return cands[pick]


def _fam_thresholds(draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt) -> NDArray[np.float32]:
    bs = ctx.bs
    assert ctx.codebook is not None  # the thresholds family applies only to codebook formats
    thr = ctx.codebook.thresholds
    has_zero = bool(np.any(thr == 0))
    modes = (["exact_zero", "next_to_zero"] if has_zero else []) + (["on_threshold"] if _threshold_targets(ctx) else [])
    if not modes:  # a custom codebook without reachable thresholds
        return _fam_gaussian(draw, rng, ctx)
    mode = draw(_sampled(modes))
    _event(f"thresholds: {mode}")
    if mode in ("exact_zero", "next_to_zero"):
        return _pair_zero_block(rng, ctx, mode)
    targets = _threshold_targets(ctx)
    n = _rng.integer(rng, 1, 2)
    J = _rng.distinct(rng, n, 0, bs - 1)

    def target() -> np.float32:  # a threshold, or one float32 step either side of it
        t = F32(_rng.pick(rng, targets))
        nudge = _rng.pick(rng, [0, 0, 1, -1])
        return _next32(t, nudge * np.inf) if nudge else t

    V = [target() for _ in range(n)]
    x = None
    for attempt in range(3 if has_zero else 12):  # without zero modes to fall back on, search longer
        x = _search_threshold_block(rng, ctx, J, V)
        if x is not None:
            break
        if len(J) > 1:  # two at once is harder: fall back to one
            J, V = J[:1], V[:1]
        elif attempt >= 2:  # another coordinate, and (no zero modes: planar/iso) another target, which
            J = [int(rng.integers(0, bs))]  # may be one no coordinate of this rotation takes
            if not has_zero and attempt % 2:
                V = [target()]
    if (
        x is None
    ):  # ~3 % of this family's blocks (most: a target no coordinate takes): exact zeros on the middle threshold
        _event("thresholds: search failed, fell back to exact_zero")
        if has_zero:
            return _pair_zero_block(rng, ctx, "exact_zero")
        return _fam_gaussian(draw, rng, ctx)  # pragma: no cover - custom codebook without a 0 threshold
    e = _rng.integer(rng, -10, 10)  # a power of two leaves the rotated coordinates bit-identical
    return np.ldexp(x, e).astype(F32)
