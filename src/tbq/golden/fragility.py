"""Fragility masks: where a kernel with another reduction order may legitimately differ by one code.

:func:`fragility` recomputes each encoder's own float32 intermediates
(rotated coordinates for TBQ, ``x * id`` for Q8_0/Q4_0), checks them against
the encoded bytes, and marks every value within ``k`` float32 ulps of a code
boundary and every block whose float32 scale lies within ``k`` ulps of an fp16
rounding midpoint. See ``docs/golden-vectors.md`` ("Fragility masks").
"""

from __future__ import annotations

import numpy as np

from .. import reference
from ..codecs import Codec
from ..errors import ConfigError, TbqValueError
from ..packing import unpack3, unpack4_halves, unpack4_pairs

#: Default fragility margin in float32 ulps.
DEFAULT_K = 4
#: Below this magnitude a TBQ rotated coordinate's ulp is taken as that of the
#: floor (2^-4: ulp = 2^-27 ~ 7.5e-9). A rotated coordinate is computed from
#: partial sums of magnitude ~1/sqrt(128), so its rounding error is a few ulps
#: of *that*, not of the (possibly tiny) coordinate; without the floor the
#: mask would be blind at the threshold 0. 0 gives the literal ulp distance.
TBQ_ULP_FLOOR = 2.0**-4


def _ulp32(a: np.ndarray) -> np.ndarray:
    """Spacing of float32 at ``|a|`` (float64 result; a float32 subnormal step at 0)."""
    return np.spacing(np.abs(np.asarray(a, np.float64)).astype(np.float32)).astype(np.float64)


def _band(code, v: np.ndarray, k: int, floor: float = 0.0) -> np.ndarray:
    """True where ``code`` differs between ``v - w`` and ``v + w``, ``w = k * ulp32(max(|v|, floor))``.

    ``code`` must be monotone; it is evaluated exactly in float64. This is "v
    lies within k ulps of a boundary": the code can change under a
    perturbation of at most k ulps (a value exactly on a boundary counts).
    """
    v64 = np.asarray(v, np.float64)
    w = k * _ulp32(np.maximum(np.abs(v64), floor))
    return code(v64 - w) != code(v64 + w)


def _roundf64(y: np.ndarray) -> np.ndarray:
    t = np.trunc(y)
    return t + np.where(np.abs(y - t) >= 0.5, np.sign(y), 0.0)


def _q4_code_t(t: np.ndarray) -> np.ndarray:
    return np.minimum(15.0, np.trunc(t))


def _q4_code_v(v: np.ndarray) -> np.ndarray:
    t = (np.asarray(v, np.float64) + 8.5).astype(np.float32)  # the encoder's second rounding
    return _q4_code_t(t.astype(np.float64))


def rotated_coordinates(codec: Codec, xb: np.ndarray):
    """The TBQ encoder's steps 1-2 on blocks ``xb`` (float32 ``(blocks, 128)``): ``(r, norm)``.

    The same float32 operations as :func:`tbq.reference.encode_tbq` (sequential
    sum of squares, reciprocal or division, the butterfly), so ``r`` is
    bit-identical to the encoder's rotated coordinates.
    """
    norm, r = reference.tbq_rotate(np.ascontiguousarray(xb, np.float32), codec.info.index_bits, codec.rotation)
    return r, norm


def fragility(codec: Codec, xb: np.ndarray, data: np.ndarray, k: int = DEFAULT_K, ulp_floor: float | None = None) -> dict:
    """Fragility masks of blocks ``xb`` (float32 ``(blocks, block_size)``) encoded as ``data``.

    Returns ``{"fragile": uint8 (blocks, block_size), "scale_fragile": uint8
    (blocks,), "scale_f32": float32 (blocks,)}`` plus ``"norm"`` for TBQ.

    Per value, with the encoder's own float32 quantity ``v``:

    - TBQ: ``v = r``, the rotated coordinate; boundaries: the thresholds;
    - Q8_0: ``v = x * id``; boundaries: the half-integers (``roundf``);
    - Q4_0: ``v = x * id`` and ``t = float32(v + 8.5)``; boundaries: the
      integers of ``t`` where ``min(15, trunc(t))`` changes; a value is
      fragile if a k-ulp change of ``v`` *or* of ``t`` can change the code.

    A value is fragile when its code changes somewhere in ``[v - w, v + w]``,
    ``w = k * ulp(max(|v|, floor))`` (float32 ulps; ``floor`` =
    :data:`TBQ_ULP_FLOOR` for TBQ, 0 otherwise). Per block, the float32 scale
    ``d`` is fragile when ``fp16(d - w) != fp16(d + w)`` with ``w = k *
    ulp(d)``: an fp16 rounding boundary (a midpoint) lies within k ulps.

    The codes recomputed from these quantities are checked against the bytes,
    so the masks are guaranteed to describe the encoder's actual arithmetic.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise TbqValueError(f"k (the fragility margin in ulps) must be a non-negative integer, got {k!r}")
    k = int(k)
    xb = np.ascontiguousarray(xb, np.float32)
    data = np.ascontiguousarray(data, np.uint8)
    name = codec.name
    out: dict = {}
    with np.errstate(all="ignore"):
        if codec.info.rotated:
            bits = codec.info.index_bits
            floor = TBQ_ULP_FLOOR if ulp_floor is None else float(ulp_floor)
            r, norm = rotated_coordinates(codec, xb)
            idx = unpack4_pairs(data[:, 2:], backend="numpy") if bits == 4 else unpack3(data[:, 2:], backend="numpy")
            if not np.array_equal(codec.codebook.index(r), idx):
                raise AssertionError(f"{name}: recomputed rotated coordinates do not give the encoded indices")
            thr = codec.codebook.thresholds.astype(np.float64)
            fragile = _band(lambda y: np.searchsorted(thr, y, side="right"), r, k, floor)
            d = reference.encode_tbq(xb, bits, codec.codebook, codec.rotation)[1]
            out["norm"] = norm.astype(np.float32)
        elif name == "q8_0":
            amax = np.max(np.abs(xb), axis=1)
            d = amax / np.float32(127)
            v = xb * reference._safe_reciprocal(d)[:, None]
            if not np.array_equal(reference.roundf(v).astype(np.int8), data[:, 2:].view(np.int8)):
                raise AssertionError("q8_0: recomputed x*id does not give the encoded codes")
            fragile = _band(_roundf64, v, k)
        elif name == "q4_0":
            m = xb[np.arange(xb.shape[0]), np.argmax(np.abs(xb), axis=1)]
            d = m / np.float32(-8)
            v = xb * reference._safe_reciprocal(d)[:, None]
            t = v + np.float32(8.5)
            q = np.minimum(np.trunc(t), np.float32(15)).astype(np.uint8)
            if not np.array_equal(q, unpack4_halves(data[:, 2:], backend="numpy")):
                raise AssertionError("q4_0: recomputed x*id + 8.5 does not give the encoded codes")
            fragile = _band(_q4_code_v, v, k) | _band(_q4_code_t, t, k)
        else:  # pragma: no cover
            raise ConfigError(f"no fragility rule for {name}")
        d = np.asarray(d, np.float32)
        d16 = data[:, 0:2].copy().view("<f2")[:, 0]
        if not np.array_equal(d.astype(np.float16), d16):  # by value: +0 == -0
            raise AssertionError(f"{name}: recomputed float32 scale does not give the stored fp16 scale")
        d64 = d.astype(np.float64)
        w = k * _ulp32(d64)
        scale_fragile = (d64 - w).astype(np.float16) != (d64 + w).astype(np.float16)
    out["fragile"] = fragile.astype(np.uint8)
    out["scale_fragile"] = scale_fragile.astype(np.uint8)
    out["scale_f32"] = d
    return out
