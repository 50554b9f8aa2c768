"""Fragility masks: where a kernel with another reduction order may legitimately differ by one code.

:func:`fragility` takes each encoder's own float32 intermediates from the
format's trace (rotated coordinates for TBQ, ``x * id`` for Q8_0/Q4_0),
checks the traced bytes against the encoded bytes, and marks every value within ``k`` float32 ulps of a code
boundary and every block whose float32 scale lies within ``k`` ulps of an fp16
rounding midpoint. See ``docs/golden-vectors.md`` ("Fragility masks").
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..codecs import Codec
from ..errors import TbqValueError, check_int
from ..formats import Format

#: Default fragility margin in float32 ulps.
DEFAULT_K = 4


def fragility(
    codec: Codec,
    xb: np.ndarray,
    data: np.ndarray,
    k: int = DEFAULT_K,
    ulp_floor: float | None = None,
    *,
    row_blocks: int = 1,
) -> dict[str, NDArray[Any]]:
    """Fragility masks of blocks ``xb`` (float32 ``(blocks, block_size)``) encoded as ``data``.

    Returns ``{"fragile": uint8 (blocks, block_size), "scale_fragile": uint8
    (blocks,)}``, plus ``"scale_f32"`` (float32 (blocks,)) for formats with an
    fp16 scale and ``"norm"`` where the format traces one (TBQ, planar/iso).

    Built on the format's trace (:meth:`tbq.formats.Format.reference_encode`):
    the encoder's own float32 intermediates, so the masks describe the
    encoder's actual arithmetic (the traced bytes are checked against
    ``data``). Per value, the format's :meth:`~tbq.formats.Format.fragile_values`
    marks values whose code changes somewhere in ``[v - w, v + w]``, ``w = k *
    ulp(max(|v|, floor))``, with ``v`` the quantity the code is read from:

    - TBQ: ``v = r``, the rotated coordinate; boundaries: the thresholds
      (``floor`` = ``tbq.formats.tbq.TBQ_ULP_FLOOR``, 2**-4, unless ``ulp_floor`` says otherwise);
    - Q8_0: ``v = x * id``; boundaries: the half-integers (``roundf``);
    - Q4_0: ``v = x * id`` and ``t = float32(v + 8.5)``; boundaries: the
      integers of ``t`` where ``min(15, trunc(t))`` changes; a value is
      fragile if a k-ulp change of ``v`` *or* of ``t`` can change the code.

    ``row_blocks``: blocks per row of ``xb`` for a row-rule format (IQ4_NL),
    whose blocks depend on earlier blocks of their row.

    Per block, the float32 scale ``d`` is fragile when ``fp16(d - w) != fp16(d
    + w)`` with ``w = k * ulp(d)``: an fp16 rounding boundary (a midpoint) lies
    within k ulps.
    """
    k = check_int(k, "k (the fragility margin in ulps)", lo=0, expected="a non-negative integer", error=TbqValueError)
    fmt = codec.format
    xb = np.ascontiguousarray(xb, np.float32)
    data = np.ascontiguousarray(data, np.uint8)
    with np.errstate(all="ignore"):
        traced, trace = fmt.reference_encode(xb, **fmt._row_kw(row_blocks), **fmt.overflow_kw(codec.on_overflow))
        if not np.array_equal(traced, data):
            bad = int(np.argmax((traced != data).any(axis=1)))
            raise AssertionError(f"{fmt.name}: the traced encode differs from the encoded bytes (first in block {bad})")
        fragile = fmt.fragile_values(trace, k, ulp_floor)
        scale_fragile = fmt.fragile_scales(trace, k)
    out: dict[str, NDArray[Any]] = {}
    view = fmt.quantizer.rotated_view(trace)  # a rotated format's (norm, r): golden sets store the norm
    if view is not None:
        out["norm"] = np.asarray(view[0], np.float32)
    out["fragile"] = fragile.astype(np.uint8)
    out["scale_fragile"] = np.asarray(scale_fragile).astype(np.uint8)
    if has_f16_scale(fmt):  # the float32 d the stored fp16 scale rounds from
        out["scale_f32"] = np.asarray(trace["d"], np.float32)
    return out


def has_f16_scale(fmt: Format) -> bool:
    """True when the format stores one fp16 scale ``d`` per block (its layout has an ``f16`` field named ``d``)."""
    return any(f.name == "d" and f.kind == "f16" for f in fmt.info.layout)
