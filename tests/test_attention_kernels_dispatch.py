"""The codes microkernels' dispatch (:mod:`tbq.attention_kernels`): one intrinsic a side, ``_scores_codes`` and
``_values_codes``, whose IR switches on the index layout and the row count (:func:`tbq.intrinsics.emit_switch`) and runs the
microkernel built for that literal pair.

Each case is checked on its own against the NumPy definition of its arithmetic: the keys and values as the
readers give them (:func:`tbq.attention._twin_rows`, ``c[idx] * d`` rounded once), the scores by 16 lane fma
sums and the fixed tree (:func:`tbq.attention._score_lanes`), the values by one fma a token and channel in
token order (:func:`tbq.attention._fma32`), bit for bit; and each writes its own rows and token groups, nothing
else. A case wired to another layout reads other indices, one wired to another row count fills other rows, so
either fails here.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import pytest
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from tbq import attention as att
from tbq import attention_kernels as kn
from tbq.attention import KVCache
from tbq.intrinsics import emit_switch
from tbq.kernels import TARGET_AVX512VL

_F = np.float32
#: The caches whose codes the microkernels read, by their index layout.
_LAYOUT_FORMATS = {"nib4": ("tbq4_0", "turbo4"), "stream3": ("tbq3_0",), "quads2": ("turbo2",), "planes3": ("turbo3",)}
_CASES = [(fmt, nr) for fmts in _LAYOUT_FORMATS.values() for fmt in fmts for nr in (1, 2, 3, 4)]
#: Tokens, KV heads, head dimension (two blocks a row) and the KV head read: a last group past the tokens.
T, G, D, HEAD = 37, 2, 256, 1

codes_only = pytest.mark.skipif(not TARGET_AVX512VL, reason="the codes microkernels need AVX-512VL (vpermps)")


@intrinsic
def _which(typingctx, x, y):
    """``10 * a + b`` for the keys ``a`` of ``x`` in ``(7, 3, 5)`` and ``b`` of ``y`` in ``(2, 1)``, chosen by two
    nested :func:`tbq.intrinsics.emit_switch` switches (any other value as the last key)."""
    sig = types.int64(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        out = cgutils.alloca_once(builder, i64)

        def inner(a):
            emit_switch(builder, args[1], (2, 1), lambda b: builder.store(ir.Constant(i64, 10 * a + b), out))

        emit_switch(builder, args[0], (7, 3, 5), inner)
        return builder.load(out)

    return sig, codegen


@nb.njit
def _which_all(xs, ys, out):
    for i in range(xs.shape[0]):
        out[i] = _which(xs[i], ys[i])


def test_dispatch_runs_the_case_of_the_value_and_the_last_for_any_other():
    """Each listed value runs its own case, once; an unlisted one (0, negative, between or past the keys, beyond
    32 bits) runs the last key's, as the ``else`` of the if/elif chain the switch replaces."""
    xs = np.array([7, 3, 5, 7, 3, 5, 0, -1, 4, 8, 2**40, 7], np.int64)
    ys = np.array([2, 2, 2, 1, 1, 1, 2, 1, 2, 0, 3, -(2**40)], np.int64)
    out = np.zeros_like(xs)
    _which_all(xs, ys, out)
    assert out.tolist() == [72, 32, 52, 71, 31, 51, 52, 51, 52, 51, 51, 71]


@nb.njit
def _scores(kind, nr, q, data, base, tstride, n, aux, S, groups, n_blocks, payload, bbytes):
    kn._scores_codes(kind, nr, q, 0, data, base, tstride, n, aux, S, 0, S.shape[1], groups, n_blocks, payload, bbytes)


@nb.njit
def _values(kind, nr, w, data, base, tstride, aux, acc, n, n_blocks, payload, bbytes):
    kn._values_codes(kind, nr, w, 0, w.shape[1], data, base, tstride, aux, acc, 0, n, n_blocks, payload, bbytes)


def _cache(fmt: str, seed: int):
    """``(kind, payload, bytes a block, bytes, tables, reader's rows of HEAD)`` of a ``fmt`` cache of random rows."""
    rng = np.random.default_rng(seed)
    cache = KVCache.encode(rng.standard_normal((T, G, D)).astype(_F), fmt)
    op = att._kernel_operand(cache, 0)[:4]
    bits = kn.code_bits(op, D)
    layout, payload, bbytes = kn.CODE_LAYOUTS[bits]
    assert layout in _LAYOUT_FORMATS and fmt in _LAYOUT_FORMATS[layout]
    rows = att._twin_rows(cache, 0)[:, HEAD]
    assert np.isfinite(rows).all() and np.abs(rows).max() > 0
    return kn._KINDS.index(layout), payload, bbytes, op[1], op[2], rows


def _same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a, _F).view(np.uint32), np.asarray(b, _F).view(np.uint32))


@codes_only
@pytest.mark.parametrize("fmt, nr", _CASES)
def test_the_scores_case_of_each_layout_and_row_count_is_the_definition(fmt, nr):
    """Rows ``0 .. nr`` of the scores are the documented sums of the codes' values (the tokens of the last group
    past ``n`` are scores of the last token, never used); the other rows and the columns past the last group keep
    what they held."""
    kind, payload, bbytes, data, aux, rows = _cache(fmt, nr)
    rb = data.shape[2]
    q = np.random.default_rng(nr + 10).standard_normal((5, D)).astype(_F)
    nt = kn._SCORE_TOKENS[nr - 1]
    groups = -(-T // nt)
    S = np.full((5, 64), np.nan, _F)
    _scores(kind, nr, q, data, HEAD * rb, G * rb, T, aux, S, groups, D // 128, payload, bbytes)
    tail = np.concatenate([rows, np.repeat(rows[-1:], groups * nt - T, axis=0)])  # the group past n: token n - 1
    assert _same_bits(S[:nr, : groups * nt], att._score_lanes(q[:nr], tail))
    assert np.isnan(S[nr:]).all() and np.isnan(S[:, groups * nt :]).all()


@codes_only
@pytest.mark.parametrize("fmt, nr", _CASES)
def test_the_values_case_of_each_layout_and_row_count_is_the_definition(fmt, nr):
    """Rows ``0 .. nr`` of the accumulators take ``fma(w_t, v_t, acc)`` over every token in order, from the values
    they held; the other rows keep theirs."""
    kind, payload, bbytes, data, aux, rows = _cache(fmt, 20 + nr)
    rb = data.shape[2]
    rng = np.random.default_rng(nr + 30)
    w = rng.uniform(0, 1, (5, 64)).astype(_F)
    acc = rng.standard_normal((5, D)).astype(_F)
    want = acc.copy()
    for t in range(T):
        want[:nr] = att._fma32(w[:nr, t, None], rows[t][None], want[:nr])
    assert (want[:nr] != acc[:nr]).all()  # every accumulator of the rows moves: a case left out would show
    _values(kind, nr, w, data, HEAD * rb, G * rb, aux, acc, T, D // 128, payload, bbytes)
    assert _same_bits(acc, want)


@codes_only
def test_an_unlisted_layout_or_row_count_runs_the_last_case():
    """The switches' default cases: a kind past the layouts reads the last one's codes (planes3, turbo3's), a row
    count outside 1 .. 4 computes one row, as the if/elif chains they replace did."""
    kind, payload, bbytes, data, aux, rows = _cache("turbo3", 40)
    assert kind == len(kn._KINDS) - 1
    rb = data.shape[2]
    q = np.random.default_rng(41).standard_normal((5, D)).astype(_F)
    S = np.full((5, 64), np.nan, _F)
    _scores(len(kn._KINDS), 5, q, data, HEAD * rb, G * rb, T, aux, S, -(-T // 16), D // 128, payload, bbytes)
    assert _same_bits(S[:1, :T], att._score_lanes(q[:1], rows))
    assert np.isnan(S[1:]).all()
