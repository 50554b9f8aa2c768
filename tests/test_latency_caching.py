"""Small-call latency work: the caches of data-independent work and the short paths stay exact.

Speed itself is measured by ``benchmarks/bench_latency.py``; these tests only
check that caching formats and codecs, the codec's short path for small
C-contiguous calls and the TBQ one-block-at-a-time kernels change no byte, no
bit and no error.
"""

from __future__ import annotations

import numpy as np
import pytest

import tbq
from tbq import codecs
from tbq.codebooks import Codebook, get_codebook
from tbq.errors import ConfigError, NonFiniteError, ScaleOverflowError

CORE = ("q8_0", "q4_0", "tbq4_0", "tbq3_0")


def blocks(fmt, n, seed=0):
    bs = tbq.get_codec(fmt).block_size
    return np.random.default_rng(seed).standard_normal((n, bs)).astype(np.float32)


# --------------------------------------------------------------------------- caches


def test_get_codec_returns_independent_codecs_sharing_one_format():
    a = tbq.get_codec("tbq4_0", signs=7)
    b = tbq.get_codec("tbq4_0", signs=7)
    assert a is not b and a.format is b.format  # the format (tables) is built once
    a.threads = 1
    assert b.threads is None  # settings stay per codec
    assert tbq.get_codec("tbq4_0", signs=8).format is not a.format


def test_cache_keys_carry_the_type_so_bad_values_still_raise():
    tbq.quantize(blocks("tbq4_0", 1), "tbq4_0", signs=1)
    with pytest.raises(ConfigError):
        tbq.quantize(blocks("tbq4_0", 1), "tbq4_0", signs=True)  # True == 1, but a bool seed is refused
    with pytest.raises(ConfigError):
        tbq.get_codec("tbq4_0", signs=True)
    with pytest.raises(ConfigError):
        tbq.quantize(blocks("q8_0", 1), "q8_0", threads=True)
    tbq.quantize(blocks("q8_0", 1), "q8_0", threads=1)
    with pytest.raises(ConfigError):
        tbq.quantize(blocks("q8_0", 1), "q8_0", threads=1.0)
    assert codecs._option_key(0.0) != codecs._option_key(-0.0)
    assert codecs._option_key(1) != codecs._option_key(np.int64(1))


def test_sign_arrays_are_keyed_by_value_and_copied():
    x = blocks("tbq4_0", 3)
    s1, s2 = tbq.rotation.signs_from_seed(3)
    s1, s2 = s1.copy(), s2.copy()
    want = tbq.quantize(x, "tbq4_0", signs=(s1, s2), backend="numpy")
    assert np.array_equal(tbq.quantize(x, "tbq4_0", signs=(s1, s2)), want)
    s1[:5] *= -1  # the caller changes its array: the next call must use the new signs
    changed = tbq.quantize(x, "tbq4_0", signs=(s1, s2))
    assert np.array_equal(changed, tbq.get_codec("tbq4_0", signs=(s1.copy(), s2.copy()), backend="numpy").encode(x))
    assert not np.array_equal(changed, want)
    s1[:5] *= -1  # and back: the first configuration again, not a stale table
    assert np.array_equal(tbq.quantize(x, "tbq4_0", signs=(s1, s2)), want)
    assert np.array_equal(tbq.quantize(x, "tbq4_0", signs=[s1.tolist(), s2.tolist()]), want)
    assert np.array_equal(tbq.quantize(x, "tbq4_0", signs={"signs1": s1.tolist(), "signs2": s2.tolist()}), want)


def test_codebook_objects_and_dicts():
    x = blocks("tbq3_0", 2)
    cb = get_codebook("turboq-mtp", 3)
    want = tbq.get_codec("tbq3_0", codebook="turboq-mtp", backend="numpy").encode(x)
    assert np.array_equal(tbq.quantize(x, "tbq3_0", codebook=cb), want)
    own = Codebook(cb.centroids * np.float32(0.5), cb.thresholds * np.float32(0.5))
    want2 = tbq.get_codec("tbq3_0", codebook=own, backend="numpy").encode(x)
    assert np.array_equal(tbq.quantize(x, "tbq3_0", codebook=own), want2)
    d = {"centroids": own.centroids.tolist(), "thresholds": own.thresholds.tolist()}
    assert np.array_equal(tbq.quantize(x, "tbq3_0", codebook=d), want2)
    assert not np.array_equal(want, want2)


def test_uncacheable_options_still_work():
    x = blocks("tbq4_0", 1)
    s1, s2 = tbq.rotation.signs_from_seed(5)
    rot = tbq.rotation.RandomizedHadamard(s1, s2)  # not a value type the cache knows: built each time
    assert np.array_equal(tbq.quantize(x, "tbq4_0", signs=rot), tbq.quantize(x, "tbq4_0", signs=5))
    with pytest.raises(ConfigError):
        tbq.quantize(x, "tbq4_0", signs=(np.array([object()] * 128), s2))  # object arrays are never keyed


def test_cached_results_equal_fresh_results_and_clear_caches():
    x = blocks("tbq4_0", 5)
    first = tbq.quantize(x, "tbq4_0", codebook="turboq-mtp", signs=11)
    codecs.clear_caches()
    assert np.array_equal(first, tbq.get_codec("tbq4_0", codebook="turboq-mtp", signs=11, backend="numpy").encode(x))
    assert np.array_equal(tbq.quantize(x, "tbq4_0", codebook="turboq-mtp", signs=11), first)


def test_cache_is_bounded():
    for seed in range(codecs._FORMAT_CACHE.size + 10):
        tbq.get_codec("tbq3_0", signs=seed)
    assert len(codecs._FORMAT_CACHE.data) <= codecs._FORMAT_CACHE.size


# --------------------------------------------------------------------------- the short path


@pytest.mark.parametrize("fmt", CORE)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 9, 31, 32, 33, 65])
def test_small_calls_are_bit_exact(fmt, n):
    """Every block count around the TBQ one-block/lane-group switch and the 32-lane groups."""
    rng = np.random.default_rng(n)
    x = blocks(fmt, n, seed=n)
    x[0] *= np.float32(1e-3)
    if n > 2:
        x[1] = 0
        x[2, ::3] = -x[2, ::3] * np.float32(40)
    fast = tbq.get_codec(fmt)
    ref = tbq.get_codec(fmt, backend="numpy")
    q = fast.encode(x)
    assert np.array_equal(q, ref.encode(x))
    assert np.array_equal(fast.decode(q).view(np.uint32), ref.decode(q).view(np.uint32))
    junk = rng.integers(0, 256, q.shape, dtype=np.uint8)
    assert np.array_equal(fast.decode(junk).view(np.uint32), ref.decode(junk).view(np.uint32))
    # the same through the long path (strided input, out=) and through the shortcuts
    xs = np.repeat(x, 2, axis=0)[::2]
    assert np.array_equal(fast.encode(xs), q)
    out = np.empty_like(q)
    fast.encode(x, out=out)
    assert np.array_equal(out, q)
    assert np.array_equal(tbq.quantize(x.reshape(1, -1), fmt), q.reshape(1, -1))
    assert np.array_equal(tbq.dequantize(q, fmt).view(np.uint32), fast.decode(q).view(np.uint32))


@pytest.mark.parametrize("fmt", CORE)
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_small_calls_raise_the_same_errors(fmt, backend):
    c = tbq.get_codec(fmt, backend=backend)
    x = blocks(fmt, 4)
    x[2, 5] = np.nan
    with pytest.raises(NonFiniteError) as e:
        c.encode(x)
    assert e.value.block == 2
    x = blocks(fmt, 4)
    x[1] *= np.float32(1e7)
    if fmt.startswith("tbq"):
        x[1] *= np.float32(1e2)
    with pytest.raises(ScaleOverflowError) as e:
        c.encode(x)
    assert e.value.block == 1
    assert tbq.get_codec(fmt, backend=backend, on_overflow="inf").encode(x).shape == c.encode(blocks(fmt, 4)).shape


def test_tbq_one_block_kernels_equal_the_lane_kernels():
    """encode_blocks/decode_blocks (calls under SMALL_BLOCKS) against the 32-lane kernels, on many blocks."""
    from tbq.formats import tbq_kernels as kn

    rng = np.random.default_rng(1)
    for fmt in ("tbq4_0", "tbq3_0"):
        for cfg in ({}, {"codebook": "turboq-mtp", "signs": 3}):
            f = tbq.get_codec(fmt, **cfg).format
            k = f._k
            x = rng.standard_normal((300, 128)).astype(np.float32)
            x[::7] *= np.float32(1e-30)
            x[1::11] = np.float32(0)
            x[2::13, ::2] *= np.float32(1e6)  # scales that overflow fp16: stored as inf (raise_overflow=False)
            a = np.zeros((300, f.type_size), np.uint8)
            b = np.zeros_like(a)
            ra = kn.encode(x, a, f.bits, k["thresholds"], k["centroids_sq"], k["s1"], k["cs2"], False, kn.LANES)
            rb = kn.encode_blocks(x, b, f.bits, k["thresholds"], k["centroids_sq"], k["s1"], k["cs2"], False)
            assert tuple(ra) == tuple(rb) == (-1, 0)
            assert np.array_equal(a, b)
            # the same first refused block with raise_overflow, and the same blocks written before it
            a[:] = 0
            b[:] = 0
            ra = kn.encode(x, a, f.bits, k["thresholds"], k["centroids_sq"], k["s1"], k["cs2"], True, kn.LANES)
            rb = kn.encode_blocks(x, b, f.bits, k["thresholds"], k["centroids_sq"], k["s1"], k["cs2"], True)
            assert tuple(ra) == tuple(rb) and ra[0] == 2
            assert np.array_equal(a[: ra[0]], b[: ra[0]])
            x2 = x.copy()
            x2[40, 3] = np.inf
            x2[2::13] = 0
            ra = kn.encode(x2, a, f.bits, k["thresholds"], k["centroids_sq"], k["s1"], k["cs2"], True, kn.LANES)
            rb = kn.encode_blocks(x2, b, f.bits, k["thresholds"], k["centroids_sq"], k["s1"], k["cs2"], True)
            assert tuple(ra) == tuple(rb) == (40, 1)
            junk = rng.integers(0, 256, a.shape, dtype=np.uint8)
            for data in (a, junk):
                ya = np.empty((300, 128), np.float32)
                yb = np.empty_like(ya)
                kn.decode(data, ya, f.bits, k["centroids"], k["s2"], k["cs1"], k["f16"], kn.LANES)
                kn.decode_blocks(data, yb, f.bits, k["centroids"], k["s2"], k["cs1"], k["f16"])
                assert np.array_equal(ya.view(np.uint32), yb.view(np.uint32))


def test_branch_free_fp16_conversion_equals_the_reference_conversion():
    """kernels.f32_to_f16_bits_finite (the Q8_0/Q4_0 encoders' vectorised fp16) on every exponent and rounding case.

    (All 2**32 patterns were checked once: only the NaN payloads differ, which no encoder stores.)
    """
    from numba import njit

    from tbq.kernels import f32_to_f16_bits, f32_to_f16_bits_finite

    @njit
    def both(u, a, b):
        for i in range(u.size):
            f = np.uint32(u[i]).view(np.float32)
            a[i] = f32_to_f16_bits_finite(f)
            b[i] = f32_to_f16_bits(f)

    rng = np.random.default_rng(0)
    exps = np.arange(256, dtype=np.uint32) << np.uint32(23)
    low = np.uint32([0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000, 0x7FFFFF, 0x7FF000, 0x7FE000, 0x400000])
    patterns = [(e | m | s) for e in exps for m in low for s in (np.uint32(0), np.uint32(0x80000000))]
    u = np.concatenate(
        [np.array(patterns, np.uint32), rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32)]
    )
    u = u[(u & np.uint32(0x7FFFFFFF)) <= np.uint32(0x7F800000)]  # finite and +-inf
    a = np.empty(u.size, np.uint16)
    b = np.empty(u.size, np.uint16)
    both(u, a, b)
    assert np.array_equal(a, b)
    with np.errstate(over="ignore"):  # values beyond the fp16 range become +-inf: part of what is compared
        assert np.array_equal(a, u.view(np.float32).astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("fmt", ["tbq4_0", "tbq3_0"])
def test_streaming_store_decode_is_bit_exact(fmt):
    """Outputs of STREAM_BYTES or more are written with non-temporal stores: the same float32 bits."""
    from tbq.formats import tbq_kernels as kn

    c = tbq.get_codec(fmt, threads=2)
    nblk = kn.STREAM_BYTES // (128 * 4) + 37  # just over the threshold, not a whole number of lane groups
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, (nblk, c.type_size), dtype=np.uint8)
    data[:, 1] &= 0x3F  # finite scales mostly (arbitrary bytes decode too)
    y = np.empty((nblk, 128), np.float32)
    f = c.format
    k = f._k
    kn.decode(data, y, f.bits, k["centroids"], k["s2"], k["cs1"], k["f16"], kn.LANES)
    assert y.nbytes >= kn.STREAM_BYTES
    want = tbq.get_codec(fmt, backend="numpy").decode(data)
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(c.decode(data).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_streaming_store_decode_is_bit_exact_q(fmt):
    kn = tbq.get_codec(fmt).format.kernels()
    nblk = kn.STREAM_BYTES // (32 * 4) + 3
    data = np.random.default_rng(6).integers(0, 256, (nblk, tbq.get_codec(fmt).type_size), dtype=np.uint8)
    want = tbq.get_codec(fmt, backend="numpy").decode(data)
    got = tbq.get_codec(fmt, threads=1).decode(data)
    assert got.nbytes >= kn.STREAM_BYTES
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    small = tbq.get_codec(fmt).decode(data[:100])
    assert np.array_equal(small.view(np.uint32), want[:100].view(np.uint32))
