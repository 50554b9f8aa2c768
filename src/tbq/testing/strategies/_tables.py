"""The public codebooks, sign_vectors and indices strategies.

Part of :mod:`tbq.testing.strategies` (see its docstring).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tbq.codebooks import Codebook, get_codebook
from tbq.rotation import turboq_mtp_signs

from ._hypothesis import st
from ._machinery import F32, _check_int, _fail, _memo_strategy, _resolve_leading, _sampled


@st.composite
def _codebooks(draw: st.DrawFn, bits: int, named: bool, symmetric: bool | None, scale: float) -> Codebook:
    n = 1 << bits
    if named and draw(st.integers(0, 3)) == 0:
        names = ["lloyd-max"] + (["turboq-mtp"] if bits in (3, 4) else [])
        return get_codebook(draw(_sampled(names)), bits)
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
    mode = draw(_sampled(["midpoint", "random"]))
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


@_memo_strategy
def codebooks(
    bits: int, *, named: bool = True, symmetric: bool | None = None, scale: float = 1.0 / math.sqrt(128)
) -> st.SearchStrategy[Codebook]:
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
def _sign_vector(draw: st.DrawFn, n: int) -> NDArray[np.int8]:
    patterns = ["random", "all_plus", "all_minus", "alternating"] + (["turboq-mtp"] if n == 128 else [])
    kind = draw(_sampled(patterns))
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


@_memo_strategy
def sign_vectors(
    n: int = 128, *, pair: bool = True
) -> st.SearchStrategy[tuple[NDArray[np.int8], NDArray[np.int8]]] | st.SearchStrategy[NDArray[np.int8]]:
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
def _indices(draw: st.DrawFn, bits: int, n: int, leading: st.SearchStrategy[tuple[int, ...]]) -> NDArray[np.uint8]:
    lead = tuple(draw(leading))
    shape = lead + (n,)
    size = int(np.prod(shape, dtype=np.int64))
    top = (1 << bits) - 1
    kind = draw(_sampled(["random", "zeros", "max", "alternating", "ramp", "one_value"]))
    a: NDArray[np.integer[Any]]
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


@_memo_strategy
def indices(
    bits: int, n: int, *, leading_shape: tuple[int, ...] | st.SearchStrategy[tuple[int, ...]] = ()
) -> st.SearchStrategy[NDArray[np.uint8]]:
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
