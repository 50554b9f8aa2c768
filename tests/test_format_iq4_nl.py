"""iq4_nl: the shared format battery (tests/helpers.py), plus what is particular to IQ4_NL.

docs/formats.md, "IQ4_NL": the upper index on an exact tie, the row rule for
tiny blocks (carry within a row, index 8 at a row start, never across rows),
the least-squares scale, and gguf-py's dequantizer as an independent oracle.
"""

import numba
import numpy as np
import pytest
from helpers import BACKENDS, assert_bits_equal, assert_bytes_equal, check_format, load_npz

import tbq
from tbq.formats.iq4_nl import IQ4_NL_MIDPOINTS, IQ4_NL_VALUES, iq4_nl_best
from tbq.formats.iq4_nl_kernels import best as kernel_best

F32 = np.float32
K = IQ4_NL_VALUES.astype(np.float32)


def codec(backend, **kw):
    return tbq.get_codec("iq4_nl", backend=backend, **kw)


def blocks(q):
    return q.reshape(-1, 18)


def indices(q):
    return tbq.get_format("iq4_nl").fields(q)["qs"].reshape(-1, 32)


def test_iq4_nl_passes_the_format_battery():
    check_format("iq4_nl")


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_random_vectors(backend):
    ref = load_npz("decode_random/iq4_nl__strict")
    y = tbq.dequantize(ref["q"], "iq4_nl", backend=backend)
    assert_bits_equal(y, ref["y"], f"iq4_nl decode_random {backend}")  # fp16 scales forced finite: no NaN


# ---------------------------------------------------------------------------
# gguf-py: dequantize only (it has no IQ4_NL quantizer)
# ---------------------------------------------------------------------------

N = 1 << 20


def distributions():
    rng = np.random.default_rng(10)
    g = rng.standard_normal((N // 128, 128), dtype=np.float32)
    ties = (rng.integers(-127, 114, (N // 128, 128)) + F32(0.5)).astype(np.float32)
    ties[:, ::32] = F32(-127)  # max = -127: d0 = 1, id = 1, a = x lands on the midpoints
    return {
        "gaussian": g,
        "student_t": rng.standard_t(3, (N // 128, 128)).astype(np.float32),
        "tiny_1e-6": g * F32(1e-6),
        "large_1e3": g * F32(1e3),
        "ties": ties,
    }


def test_gguf_dequantize_agrees_bit_for_bit():
    from gguf import quants

    qt = quants.GGMLQuantizationType.IQ4_NL
    ref = load_npz("decode_random/iq4_nl__strict")
    assert_bits_equal(quants.dequantize(ref["q"], qt), ref["y"], "gguf-py on the decode_random vectors")
    fast = codec("numba", threads=1)
    for name, x in distributions().items():
        q = fast.encode(x)
        if name in ("gaussian", "ties"):  # the NumPy spec on a million values too
            assert_bytes_equal(codec("numpy").encode(x), q, f"{name}: numpy vs numba")
        # no signed-zero difference: both compute fp16(d) * K[l], so 0 * K[l] is -0 for l < 8 in both
        assert_bits_equal(quants.dequantize(q, qt), fast.decode(q), f"{name}: gguf-py dequantize")


# ---------------------------------------------------------------------------
# best(): the kernels' midpoint count is the C search, bit for bit
# ---------------------------------------------------------------------------


@numba.njit
def _kernel_best(a, out):
    for i in range(a.size):
        out[i] = kernel_best(a[i])


def _around(points, ulps):
    p = np.asarray(points, np.float32)
    out = [p]
    lo, hi = p.copy(), p.copy()
    for _ in range(ulps):
        lo = np.nextafter(lo, F32(-np.inf))
        hi = np.nextafter(hi, F32(np.inf))
        out += [lo, hi]
    return np.concatenate(out)


def test_midpoint_count_equals_the_c_search_around_every_midpoint():
    a = np.concatenate(
        [
            _around(IQ4_NL_MIDPOINTS, 64),
            _around(K, 64),
            _around([0.0, -0.0, 127.0, -130.0, 114.0], 8),
            np.random.default_rng(3).uniform(-130, 130, 1 << 20).astype(np.float32),
        ]
    )
    got = np.empty(a.size, np.int32)
    _kernel_best(a, got)
    want = iq4_nl_best(a)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} differ, e.g. a = {a[bad[0]]!r}: kernel {got[bad[0]]}, spec {want[bad[0]]}"
    # and the search is the spec's: an exact midpoint goes up, one ulp below goes down
    assert iq4_nl_best(IQ4_NL_MIDPOINTS).tolist() == list(range(1, 16))
    assert iq4_nl_best(np.nextafter(IQ4_NL_MIDPOINTS, F32(-np.inf))).tolist() == list(range(0, 15))


@pytest.mark.parametrize("backend", BACKENDS)
def test_encoder_indices_are_best_of_x_when_d0_is_one(backend):
    """max = -127 gives d0 = 1 and id = 1, so a = x exactly: the stored indices are best(x)."""
    vals = _around(np.concatenate([IQ4_NL_MIDPOINTS, K]), 3)
    vals = vals[(vals > -127) & (vals < 127)]
    n = -(-vals.size // 31)
    x = np.zeros((n, 32), np.float32)
    x[:, 0] = F32(-127)
    x[:, 1:].flat[: vals.size] = vals
    q = codec(backend).encode(x.reshape(-1))
    assert np.array_equal(indices(q), iq4_nl_best(x))


# ---------------------------------------------------------------------------
# quirks of the spec, exact bytes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_tie_goes_to_the_upper_index(backend):
    x = np.zeros(32, np.float32)
    x[0], x[1], x[2], x[3] = -127, -4.5, 7.0, 61.0  # d0 = 1: a = x; -4.5 ties -10/1, 7 ties 1/13, 61 ties 53/69
    x[4], x[5] = np.nextafter(F32(-4.5), F32(-9)), np.nextafter(F32(7.0), F32(0))
    li = indices(codec(backend).encode(x))[0]
    assert li[:6].tolist() == [0, 8, 9, 13, 7, 8]
    y = np.zeros(32, np.float32)
    y[0], y[1] = 127, 4.5  # max = +127: d0 = -1, id = -1, a = -x = -4.5: the tie goes up to index 8 (value 1)
    assert indices(codec(backend).encode(y))[0][:2].tolist() == [0, 8]


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_hot_then_zero_block_exact_bytes(backend):
    x = np.zeros(64, np.float32)
    x[0] = -127.0
    q = codec(backend).encode(x)
    # d = sumqx / sumq2 = 1.0 (fp16 0x3C00); index 0 for -127, 8 for the zeros (best(0) = 8)
    assert q[:18].tolist() == [0x00, 0x3C, 0x80] + [0x88] * 15
    # the zero block: d = +0 and the indices the C array L still holds
    assert q[18:].tolist() == [0x00, 0x00, 0x80] + [0x88] * 15
    y = codec(backend).decode(q)
    assert y[32:].view(np.uint32).tolist() == [0x80000000] + [0] * 31  # 0 * K[0] = -0


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_blocks_carry_within_a_row_only(backend):
    rng = np.random.default_rng(5)
    A = rng.standard_normal(32).astype(np.float32)
    B = rng.standard_normal(32).astype(np.float32)
    Z = np.zeros(32, np.float32)
    T = (rng.standard_normal(32) * 1e-16).astype(np.float32)  # amax < 1e-15f: tiny, not zero
    row0 = np.concatenate([Z, A, Z, T, B, -Z])
    row1 = np.concatenate([T, Z, A, B, Z, Z])  # starts tiny although row 0 ended with computed data
    x = np.stack([row0, row1])
    q = blocks(codec(backend).encode(x))
    qa = blocks(codec(backend).encode(A))[0]
    qb = blocks(codec(backend).encode(B))[0]
    zero = [0, 0] + [0x88] * 16
    tail = lambda b: [0, 0] + b[2:].tolist()  # noqa: E731
    assert q[0].tolist() == zero  # row start: C reads uninitialised memory; the vectors define index 8
    assert q[1].tolist() == qa.tolist()
    assert q[2].tolist() == tail(qa) and q[3].tolist() == tail(qa)  # carried from the most recent computed block
    assert q[4].tolist() == qb.tolist()
    assert q[5].tolist() == tail(qb)
    assert q[6].tolist() == zero and q[7].tolist() == zero  # no carry across rows
    assert q[10].tolist() == tail(qb) and q[11].tolist() == tail(qb)
    _, tr = tbq.get_format("iq4_nl").encode(x, trace=True)
    assert tr["carried"].tolist() == [[2, 0, 1, 1, 0, 1], [2, 2, 0, 0, 1, 1]]
    assert tr["d"][tr["carried"] > 0].view(np.uint32).tolist() == [0] * 8  # d = +0


def test_rows_never_carry_across_chunks_or_threads():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3000, 160)).astype(np.float32)  # 5 blocks per row; rows split between chunks/threads
    x.reshape(3000, 5, 32)[rng.random((3000, 5)) < 0.4] = 0  # many tiny blocks, row starts included
    ref = codec("numpy").encode(x)
    for threads in (1, 2, 3):
        assert_bytes_equal(codec("numba", threads=threads).encode(x), ref, f"threads={threads}")
    # the same rows one at a time give the same bytes: each row is its own call
    assert_bytes_equal(np.stack([codec("numba").encode(r) for r in x[:50]]), ref[:50], "row by row")


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_threshold_is_1e_15f(backend):
    t = F32(1e-15)
    x = np.zeros((2, 32), np.float32)
    x[0, 3] = t  # amax = 1e-15f: computed (the test is amax < 1e-15f)
    x[1, 3] = np.nextafter(t, F32(0))  # one ulp below: tiny
    q = blocks(codec(backend).encode(x))
    assert q[0, :2].tolist() != [0, 0] and indices(q[0])[0][3] == 0  # max maps to index 0 (value -127)
    assert q[1].tolist() == [0, 0] + [0x88] * 16


@pytest.mark.parametrize("backend", BACKENDS)
def test_scale_overflow_and_nan_scale(backend):
    big = np.zeros((2, 32), np.float32)
    big[0, 0] = 1.0
    big[1, 0] = 1e7  # |max| >= ~8.3e6: fp16(d) is -inf (d has the sign opposite to max)
    with pytest.raises(tbq.ScaleOverflowError, match="block 1") as e:
        codec(backend).encode(big)
    assert "on_overflow='inf'" in str(e.value) and e.value.block == 1
    q = blocks(codec(backend, on_overflow="inf").encode(big))
    assert q[1, :2].tolist() == [0x00, 0xFC]
    huge = np.full(32, 2e19, np.float32)  # x*x overflows: sumqx / sumq2 = inf / inf = NaN
    with pytest.raises(tbq.ScaleOverflowError, match="NaN"):
        codec(backend).encode(huge)
    q = codec(backend, on_overflow="inf").encode(huge)
    assert q[:2].tolist() == [0x00, 0xFE]  # the x86 default NaN is negative: fp16 0xFE00


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_first_refused_block_is_reported_even_inside_a_row(backend):
    """Blocks are refused in order, as for every other format: an overflowing block 4 comes before a NaN in
    block 6 of the same row (a row-rule block depends only on earlier blocks, so both backends can tell)."""
    x = np.zeros((2, 128), np.float32)
    x[0, :32] = 1.0
    x[1, 0] = 1e7  # block 4 overflows ...
    x[1, 70] = np.nan  # ... and block 6 of the same row is NaN
    with pytest.raises(tbq.ScaleOverflowError) as e:
        codec(backend).encode(x)
    assert e.value.block == 4
    x[1, 0] = 0
    with pytest.raises(tbq.NonFiniteError) as e1:
        codec(backend).encode(x)
    assert e1.value.block == 6


def test_fragile_values_mark_ties_and_follow_carried_indices():
    f = tbq.get_format("iq4_nl")
    x = np.zeros(96, np.float32)
    x[0], x[1], x[2] = -127, 7.0, 6.0  # a = 7 is a tie (fragile), a = 6 is not
    _, tr = f.encode(x, trace=True)
    fr = f.fragile_values({k: v.reshape((-1,) + v.shape[1:]) for k, v in tr.items()}, 1)
    assert fr[0, 1] and not fr[0, 2] and not fr[0, 0]
    assert np.array_equal(fr[1], fr[0]) and np.array_equal(fr[2], fr[0])  # tiny blocks repeat block 0's indices
    x2 = np.zeros(32, np.float32)
    _, tr2 = f.encode(x2, trace=True)
    assert not f.fragile_values(tr2, 4).any()  # index 8 by definition: nothing to round


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_regression_nonfinite_first_block_of_a_row_raises_nonfinite_error(backend):
    """Found by the property tests: a NaN in a row's first block left the NumPy path no whole row
    to encode before it, and an empty reference_encode failed with a reshape error."""
    x = np.zeros((2, 64), np.float32)
    x[1, 0] = np.nan
    with pytest.raises(tbq.NonFiniteError) as e:
        tbq.quantize(x, "iq4_nl", backend=backend)
    assert e.value.block == 2
