"""Behaviours of the code around the codecs that no other test pinned down.

Each test here was written against a planted bug that survived the rest of the
suite (issue #24's mutation run); the mutant it kills is in
``benchmarks/mutation.py`` under the same behaviour. The expected values are
computed directly (loops, exact integer arithmetic), not with the function
under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tbq
from tbq import budget, metrics

# ---------------------------------------------------------------------------
# tbq.budget: the feasibility boundary
# ---------------------------------------------------------------------------


def test_a_cache_exactly_the_size_of_the_free_memory_fits():
    """``cache == available`` fits with zero headroom; one byte more does not (``>=``, not ``>``)."""
    kv, ctx = 196608, 32768  # bytes per token, tokens: a 6 GiB cache
    cache = kv * ctx
    weights, workspace = 5 * 2**30, 2**30
    exact = budget.feasibility(cache + weights + workspace, weights, workspace, kv, ctx)
    assert exact.fits is True
    assert exact.headroom_bytes == 0 and exact.cache_bytes == exact.available_bytes == cache
    assert exact.max_context == ctx and exact.max_sequences == 1
    short = budget.feasibility(cache + weights + workspace - 1, weights, workspace, kv, ctx)
    assert short.fits is False and short.headroom_bytes == -1
    assert short.max_context == ctx - 1 and short.max_sequences == 0
    # four sequences: exactly four fit, one byte less and only three do
    four = budget.feasibility(4 * cache, 0, 0, kv, ctx, sequences=4)
    assert four.fits is True and four.max_sequences == 4
    assert budget.feasibility(4 * cache - 1, 0, 0, kv, ctx, sequences=4).max_sequences == 3


# ---------------------------------------------------------------------------
# tbq.metrics: the per-output attention statistics
# ---------------------------------------------------------------------------


def _direct_output_stats(q, k, v, k_hat, v_hat):
    """Per (query, head) output vectors by explicit loops: softmax(q.k / sqrt(d)) @ v in float64."""
    nq, nh, dim = q.shape
    per, cos = [], []

    def out(qh, h, keys, vals):
        z = np.array([float(qh @ keys[t, h]) / math.sqrt(dim) for t in range(keys.shape[0])])
        w = np.exp(z - z.max())
        w /= w.sum()
        return sum(w[t] * vals[t, h].astype(np.float64) for t in range(keys.shape[0]))

    for i in range(nq):
        for h in range(nh):
            a, b = out(q[i, h], h, k, v), out(q[i, h], h, k_hat, v_hat)
            per.append(float(np.sum((b - a) ** 2) / np.sum(a * a)))
            cos.append(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
    return np.array(per), np.array(cos)


def test_per_output_attention_statistics_are_over_each_query_and_head():
    """``output_nmse_mean/median/p90`` and ``output_cosine`` are over the (query, head) output vectors.

    The heads get very different value scales, so statistics taken over another
    axis (per channel, per query pooled over heads) give different numbers.
    """
    r = np.random.default_rng(24)
    nq, nt, nh, dim = 5, 48, 3, 16
    q = r.standard_normal((nq, nh, dim))
    k = r.standard_normal((nt, nh, dim))
    v = r.standard_normal((nt, nh, dim)) * np.array([1.0, 10.0, 0.1])[None, :, None]
    k_hat = k + 0.2 * r.standard_normal(k.shape)
    v_hat = v + 0.05 * r.standard_normal(v.shape) * np.array([3.0, 0.1, 1.0])[None, :, None]
    m = metrics.attention_error(q, k, v, k_hat, v_hat)
    per, cos = _direct_output_stats(q, k, v, k_hat, v_hat)
    assert per.size == nq * nh
    assert m["output_nmse_mean"] == pytest.approx(per.mean(), rel=1e-12)
    assert m["output_nmse_median"] == pytest.approx(np.sort(per)[per.size // 2], rel=1e-12)  # 15 values: the 8th
    # the 90th percentile with linear interpolation between order statistics (numpy's default)
    s = np.sort(per)
    pos = 0.9 * (per.size - 1)
    lo = int(math.floor(pos))
    assert m["output_nmse_p90"] == pytest.approx(s[lo] + (pos - lo) * (s[lo + 1] - s[lo]), rel=1e-12)
    assert m["output_cosine"] == pytest.approx(cos.mean(), rel=1e-12)
    # and the statistics are not degenerate: the heads really differ
    assert per.max() > 10 * per.min() and m["output_nmse_p90"] > m["output_nmse_median"]


# ---------------------------------------------------------------------------
# tbq.numcodecs: the largest number of axes the header allows
# ---------------------------------------------------------------------------


def test_an_array_with_the_most_axes_the_header_allows_round_trips():
    tn = pytest.importorskip("tbq.numcodecs")
    pytest.importorskip("numcodecs")
    shape = (1,) * 29 + (2, 1, 64)  # 32 axes: the header's limit (ndim is 1..32)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    codec = tn.Q8_0Numcodec()
    enc = codec.encode(x)
    assert enc[6] == 32  # the header's ndim byte
    y = codec.decode(enc)
    assert y.shape == shape
    want = tbq.dequantize(tbq.quantize(x, "q8_0"), "q8_0")
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
    with pytest.raises(tbq.BlockShapeError, match="at most 32 axes"):
        codec.encode(x.reshape((1,) + shape))


# ---------------------------------------------------------------------------
# tbq.dask: the last, partial step of a long chunk counts
# ---------------------------------------------------------------------------


def test_dask_block_statistics_include_the_last_partial_step():
    da = pytest.importorskip("dask.array")
    import tbq.dask as td

    n = td.METRICS_STEP + 96  # one chunk: a full step and a partial one
    x = np.ones(n, np.float32)
    y = x.copy()
    y[-96:] += np.float32(0.5)  # every error sits in the partial step
    y[-1] = np.float32(4.0)
    res = td.error_metrics(da.from_array(x, chunks=n), da.from_array(y, chunks=n), compute=True)
    assert res["count"] == n
    assert res["sum_squares"] == float(n)  # exact: integers in float64
    assert res["sum_squared_error"] == 95 * 0.25 + 9.0
    assert res["max_abs_error"] == 3.0


# ---------------------------------------------------------------------------
# tbq.codecs with threads: the error names the first bad block in input order
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["q8_0", "tbq4_0"])
def test_threaded_encode_reports_the_first_bad_block_in_input_order(fmt):
    """NaN at blocks 40 and 32,000 with threads=2: both threads meet a bad block; the error names block 40."""
    bs = tbq.format_info(fmt).block_size
    nblocks = 32_768
    x = np.random.default_rng(1).standard_normal(nblocks * bs).astype(np.float32)
    x[40 * bs + 3] = np.nan
    x[32_000 * bs + 7] = np.inf
    with pytest.raises(tbq.NonFiniteError) as e:
        tbq.quantize(x, fmt, threads=2)
    assert e.value.block == 40 and "block 40 " in str(e.value)
    x2 = x.reshape(64, -1)  # the same data as rows: the block index is flat, in input order
    with pytest.raises(tbq.NonFiniteError) as e:
        tbq.quantize(x2, fmt, threads=2)
    assert e.value.block == 40


# ---------------------------------------------------------------------------
# tbq.kernels: the numba fp16 conversion the q4_1, q5, iq4_nl and planar/iso kernels store scales with
# ---------------------------------------------------------------------------


def _hard_fp16_inputs() -> np.ndarray:
    """float32 patterns at every fp16 rounding decision: each midpoint between adjacent fp16 numbers
    (normal and subnormal), one float32 ulp either side, the fp16 numbers themselves, and the
    overflow and underflow edges."""
    h = np.arange(0x7C00, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)  # +0 .. 65504
    mids = (h[:-1] + h[1:]) / 2
    mids = np.append(mids, (65504.0 + 65536.0) / 2)  # 65520: the tie with the next power of two
    v = np.concatenate([h, mids, [2.0**-25, 2.0**-26, 3 * 2.0**-26]]).astype(np.float32)
    v = np.concatenate([v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(-np.inf))])
    v = np.concatenate([v, np.float32([65536.0, 1e5, 3e38, np.inf])])
    return np.concatenate([v, -v])


def test_numba_fp16_conversion_rounds_every_tie_to_even():
    """tbq.kernels.f32_to_f16_bits against IEEE round-to-nearest-even (NumPy's cast), at every tie.

    A subsample is also checked against tests/naive.py's conversion by hand, so the
    claim does not rest on NumPy alone.
    """
    import naive
    import numba

    from tbq.kernels import f32_to_f16_bits

    @numba.njit(cache=False)
    def convert(v):
        out = np.empty(v.size, np.uint16)
        for i in range(v.size):
            out[i] = f32_to_f16_bits(v[i])
        return out

    v = _hard_fp16_inputs()
    got = convert(v)
    with np.errstate(over="ignore"):
        want = v.astype(np.float16).view(np.uint16)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} values; first {v[bad[0]]!r}: {got[bad[0]]:#06x} != {want[bad[0]]:#06x}"
    for i in range(0, v.size, 211):
        assert got[i] == naive.fp16_bits(v[i]), v[i]
