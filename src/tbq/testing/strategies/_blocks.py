"""The public float_blocks and encoded_blocks strategies (on top of the families).

Part of :mod:`tbq.testing.strategies` (see its docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from numpy.typing import NDArray

import tbq
from tbq.formats.base import FIELD_KINDS, FORMAT_CLASSES, Field

from . import _rng
from ._fit import _fit_blocks
from ._fp4 import _fam_binade_tops, _fam_ue4m3
from ._fp8 import _fam_fp8_grid
from ._generic import (
    _fam_constant,
    _fam_gaussian,
    _fam_heavy_tail,
    _fam_huge,
    _fam_nonfinite,
    _fam_outliers,
    _fam_overflow,
    _fam_sparse,
    _fam_subnormal,
    _fam_zero,
)
from ._hypothesis import npst, st
from ._machinery import (
    _ALIASES,
    _UNFIT,
    DEFAULT_FAMILIES,
    F32,
    FAMILIES,
    HAZARD_FAMILIES,
    SPECIAL_SCALES,
    _check_int,
    _event,
    _fail,
    _Fmt,
    _memo_strategy,
    _resolve_fmt,
    _resolve_leading,
    _sampled,
)
from ._rotated import _fam_thresholds
from ._scalar import _fam_grid_ties, _fam_min_ties, _fam_ties

_FAMILY_FUNCS: dict[str, Callable[[st.DrawFn, np.random.Generator, _Fmt], NDArray[np.float32]]] = {
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
    "fp8_grid": _fam_fp8_grid,
    "thresholds": _fam_thresholds,
    "constant": _fam_constant,
    "zero": _fam_zero,
    "sparse": _fam_sparse,
    "overflow": _fam_overflow,
    "nonfinite": _fam_nonfinite,
}


def _one_block(
    draw: st.DrawFn, rng: np.random.Generator, ctx: _Fmt, families: st.SearchStrategy[str]
) -> tuple[NDArray[np.float32], bool]:
    """One block, and whether it is to be fitted: hypothesis chooses its family (``families``, and the family its
    mode); its numbers come from ``rng``."""
    fam = draw(families)
    _event(f"family: {fam}")
    blk = np.ascontiguousarray(_FAMILY_FUNCS[fam](draw, rng, ctx), dtype=F32)
    if fam in _UNFIT:
        return blk, False
    if not np.isfinite(blk).all():  # e.g. a Cauchy draw scaled up: clip into float32
        blk = np.nan_to_num(blk, nan=0.0, posinf=1e30, neginf=-1e30).astype(F32)
    return blk, True


#: The seed of an example's blocks (built once).
_SEEDS = st.integers(0, 2**32 - 1)


@st.composite
def _float_blocks(
    draw: st.DrawFn,
    ctx: _Fmt,
    min_blocks: int,
    max_blocks: int,
    leading: st.SearchStrategy[tuple[int, ...]],
    families: tuple[str, ...] | None,
    elements: st.SearchStrategy[float] | None,
) -> NDArray[np.float32]:
    lead = tuple(draw(leading))
    nb = draw(st.integers(min_blocks, max_blocks))
    shape = lead + (nb * ctx.bs,)
    if elements is not None:
        return draw(npst.arrays(np.float32, shape, elements=elements))
    total = int(np.prod(lead, dtype=np.int64)) * nb
    if total == 0:
        return np.zeros(shape, F32)
    # One drawn seed per example; block i's numbers come from the generator seeded by (seed, i), so each block is
    # independent of what the others drew (a shrink that changes one block's family leaves the others as they were).
    seed = draw(_SEEDS)
    assert families is not None  # elements is None here
    fams = _sampled(families)
    drawn = [_one_block(draw, np.random.default_rng((seed, i)), ctx, fams) for i in range(total)]
    blocks = _fit_blocks(ctx, [blk for blk, _ in drawn], [fit for _, fit in drawn])
    return np.concatenate(blocks).reshape(shape)


@_memo_strategy
def float_blocks(
    fmt: str | tbq.Codec,
    *,
    min_blocks: int = 1,
    max_blocks: int = 4,
    leading_shape: tuple[int, ...] | st.SearchStrategy[tuple[int, ...]] | None = None,
    families: Iterable[str] | None = None,
    elements: st.SearchStrategy[float] | None = None,
    codebook: Any = None,
    signs: Any = None,
    options: dict[str, Any] | None = None,
) -> st.SearchStrategy[NDArray[np.float32]]:
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
        ``thresholds`` family aims at (default ``"lloyd-max"``, ``"turboq-mtp"``);
        spellings of ``options={"codebook": ..., "signs": ...}``.
    options : the format's own options with a format name, e.g.
        ``{"scale": 0.0173}`` for FP8 (the ``fp8_grid`` family aims at ``x / scale``).
        An option the format does not take is an error naming the formats that do.

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
    ctx = _resolve_fmt(func, fmt, codebook, signs, options)
    min_blocks, max_blocks = _block_range(func, min_blocks, max_blocks)
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


def _block_range(func: str, min_blocks: Any, max_blocks: Any) -> tuple[int, int]:
    """``min_blocks`` and ``max_blocks`` of ``func``'s call checked: integers >= 0, the first at most the second."""
    lo = _check_int(func, "min_blocks", min_blocks, 0, hint="Pass e.g. min_blocks=1.")
    hi = _check_int(func, "max_blocks", max_blocks, 0, hint="Pass e.g. max_blocks=4.")
    if hi < lo:
        _fail(func, f"max_blocks={hi} is smaller than min_blocks={lo}; pass max_blocks >= min_blocks")
    return lo, hi


def _resolve_families(func: str, ctx: _Fmt, families: Iterable[str] | None) -> tuple[str, ...]:
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
            kinds = ", ".join(n for n, c in FORMAT_CLASSES.items() if f in c.fuzz.hazards)
            alts = " or ".join(repr(h) for h in ctx.hazards) or "the default families"
            _fail(
                func,
                f"family {f!r} only applies to {kinds}, not to {ctx.name!r}; drop it (or use {alts} for {ctx.name!r})",
            )
    return tuple(dict.fromkeys(fams))


def _applies(fam: str, ctx: _Fmt) -> bool:
    return fam not in HAZARD_FAMILIES or fam in ctx.hazards


def _scale_field(layout: tuple[Field, ...]) -> Field | None:
    """The field the special patterns go into: the scale ``d`` wherever the layout puts it (vLLM's follows the
    codes), else the first field (every other format's ``d`` is its first field)."""
    return next((f for f in layout if f.name == "d"), layout[0] if layout else None)


@st.composite
def _arbitrary_bytes(
    draw: st.DrawFn,
    ctx: _Fmt,
    min_blocks: int,
    max_blocks: int,
    leading: st.SearchStrategy[tuple[int, ...]],
    special_scales: bool,
) -> NDArray[np.uint8]:
    lead = tuple(draw(leading))
    nb = draw(st.integers(min_blocks, max_blocks))
    nblocks = int(np.prod(lead, dtype=np.int64)) * nb
    rng = np.random.default_rng(draw(_SEEDS))
    pattern = draw(_sampled(["random", "zeros", "ones", "alternating", "random"]))
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
        first = _scale_field(ctx.info.layout)
        own = {n: (lo, hi) for n, lo, hi in first.specials} if first is not None and first.specials else None
        if own is None and first is not None and first.size <= 2 and first.kind in FIELD_KINDS:
            own = FIELD_KINDS[first.kind].specials or None  # the first field's kind (f16: SPECIAL_SCALES)
        table = own or SPECIAL_SCALES
        off, size = (first.offset, first.size) if own and first is not None else (0, 2)  # own implies first
        kinds = _sampled(list(table))
        for b in range(nblocks):
            if rng.random() < 0.25:
                continue  # keep the random scale
            kind = draw(kinds)  # a hypothesis choice: a failure shrinks to the kind of scale that fails
            _event(f"scale: {kind}")
            lo, hi = table[kind]
            bits = _rng.integer(rng, lo, hi)
            for k in range(size):
                data[b, off + k] = (bits >> (8 * k)) & 0xFF
    return data.reshape(lead + (nb * ctx.ts,))


@st.composite
def _valid_bytes(draw: st.DrawFn, ctx: _Fmt, xs: st.SearchStrategy[NDArray[np.float32]]) -> NDArray[np.uint8]:
    return ctx.encode(draw(xs))


@_memo_strategy
def encoded_blocks(
    fmt: str | tbq.Codec,
    *,
    valid: bool = True,
    min_blocks: int = 1,
    max_blocks: int = 4,
    leading_shape: tuple[int, ...] | st.SearchStrategy[tuple[int, ...]] | None = None,
    special_scales: bool = True,
    codebook: Any = None,
    signs: Any = None,
    options: dict[str, Any] | None = None,
) -> st.SearchStrategy[NDArray[np.uint8]]:
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
    min_blocks, max_blocks, leading_shape, codebook, signs, options : as in :func:`float_blocks`.

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
    ctx = _resolve_fmt(func, fmt, codebook, signs, options)
    min_blocks, max_blocks = _block_range(func, min_blocks, max_blocks)
    leading = _resolve_leading(func, leading_shape)
    if valid:
        fams = _resolve_families(func, ctx, None)
        return _valid_bytes(ctx, _float_blocks(ctx, min_blocks, max_blocks, leading, fams, None))
    return _arbitrary_bytes(ctx, min_blocks, max_blocks, leading, special_scales)
