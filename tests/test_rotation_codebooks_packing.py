"""Building blocks: the Walsh-Hadamard transform, Lloyd-Max fitting, the packers."""

import math

import numpy as np
import pytest
from helpers import BACKENDS, assert_bits_equal, assert_bytes_equal
from scipy import integrate, stats

import tbq
from tbq import packing
from tbq.codebooks import Codebook, lloyd_max
from tbq.rotation import RandomizedHadamard, fwht, matrix, signs_from_seed


def butterfly_reference(v: np.ndarray) -> np.ndarray:
    """The spec's in-place butterfly, written as the obvious scalar loops (slow, float32)."""
    v = v.astype(np.float32).copy()
    n = v.size
    h = 1
    while h < n:
        for i in range(0, n, 2 * h):
            for j in range(i, i + h):
                a, b = v[j], v[j + h]
                v[j], v[j + h] = a + b, a - b
        h *= 2
    return v * np.float32(1 / math.sqrt(n))


@pytest.mark.parametrize("n", [1, 2, 8, 128, 256])
def test_fwht_matches_the_scalar_butterfly_bit_for_bit(n):
    x = np.random.default_rng(n).standard_normal((3, n)).astype(np.float32)
    got = fwht(x)
    for row in range(3):
        assert_bits_equal(got[row], butterfly_reference(x[row]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fwht_is_the_sylvester_matrix_and_an_involution(dtype):
    x = np.random.default_rng(0).standard_normal((4, 2, 64)).astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(fwht(x), x @ matrix(64).T, atol=tol)
    np.testing.assert_allclose(fwht(fwht(x)), x, atol=tol)
    assert fwht(x).dtype == dtype
    H = matrix(64)
    np.testing.assert_allclose(H @ H.T, np.eye(64), atol=1e-12)


def test_fwht_rejects_bad_input():
    with pytest.raises(tbq.TbqValueError, match="power of two"):
        fwht(np.zeros(12, np.float32))
    with pytest.raises(tbq.TbqTypeError):
        fwht(np.zeros(8, np.int32))


def test_randomized_hadamard_forward_inverse_and_matrix():
    rot = RandomizedHadamard(*signs_from_seed(3, 32))
    x = np.random.default_rng(1).standard_normal((5, 32))
    M = rot.matrix()
    np.testing.assert_allclose(rot.forward(x), x @ M.T, atol=1e-12)
    np.testing.assert_allclose(rot.inverse(rot.forward(x)), x, atol=1e-12)
    np.testing.assert_allclose(M @ M.T, np.eye(32), atol=1e-12)
    # forward is s2 * H(s1 * x), with the float32 rounding of fwht
    x32 = x.astype(np.float32)
    assert_bits_equal(rot.forward(x32), fwht(x32 * rot.signs1) * rot.signs2)


def test_rotation_spreads_a_one_hot_block():
    rot = tbq.get_codec("tbq4_0").rotation
    e = np.zeros(128, np.float32)
    e[5] = 1
    r = rot.forward(e)
    assert np.all(np.abs(r) == np.float32(1 / math.sqrt(128)))


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6])
def test_lloyd_max_satisfies_the_optimality_conditions(bits):
    """Independent check with scipy.integrate: each centroid is its cell's conditional mean."""
    sigma = 0.3
    cb = lloyd_max(bits, sigma)
    c = cb.centroids.astype(np.float64)
    edges = np.r_[-np.inf, cb.thresholds.astype(np.float64), np.inf]
    for i in range(c.size):
        a, b = edges[i], edges[i + 1]
        mass = stats.norm.cdf(b, scale=sigma) - stats.norm.cdf(a, scale=sigma)
        mean = integrate.quad(lambda t: t * stats.norm.pdf(t, scale=sigma), a, b)[0] / mass
        assert mean == pytest.approx(c[i], rel=1e-6, abs=1e-9)
    np.testing.assert_allclose(cb.thresholds, (c[1:] + c[:-1]) / 2, rtol=1e-6)
    assert_bits_equal(cb.centroids, -cb.centroids[::-1])  # symmetric


def test_lloyd_max_known_distortion_and_validation():
    # Lloyd-Max MSE for N(0,1): 0.009497 at 4 bits, 0.03454 at 3 bits (Max, 1960)
    for bits, mse in ((4, 0.009497), (3, 0.03454)):
        cb = lloyd_max(bits, 1.0)
        z = np.random.default_rng(0).standard_normal(2_000_000).astype(np.float32)
        err = np.mean((cb.centroids[cb.index(z)] - z) ** 2)
        assert err == pytest.approx(mse, rel=0.01)
    assert lloyd_max(4) is lloyd_max(4)  # cached
    for bad in (0, 9, 2.5, True):
        with pytest.raises(tbq.ConfigError):
            lloyd_max(bad)
    with pytest.raises(tbq.ConfigError, match="sigma"):
        lloyd_max(4, -1.0)


def test_codebook_index_rule():
    cb = Codebook([-3.0, -1.0, 1.0, 3.0], [-2.0, 0.0, 2.0])
    r = np.float32([-5, -2, np.nextafter(np.float32(-2), np.float32(0)), -0.0, 0.0, 1.9, 2.0, 9])
    assert cb.index(r).tolist() == [0, 1, 1, 2, 2, 2, 3, 3]


PACKERS = [
    (packing.pack4_pairs, packing.unpack4_pairs, 16, 2),
    (packing.pack4_halves, packing.unpack4_halves, 16, 32),
    (packing.pack3, packing.unpack3, 8, 8),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pack,unpack,limit,group", PACKERS, ids=["pairs", "halves", "pack3"])
def test_packers_round_trip_and_agree(pack, unpack, limit, group, backend):
    idx = np.random.default_rng(limit).integers(0, limit, size=(3, 256), dtype=np.uint8)
    b = pack(idx, backend=backend)
    assert_bytes_equal(b, pack(idx, backend="numpy"))
    assert_bytes_equal(unpack(b, backend=backend), idx)
    with pytest.raises(tbq.TbqValueError, match="does not fit"):
        pack(np.full(group, limit, np.uint8), backend=backend)
    with pytest.raises(tbq.BlockShapeError):
        pack(np.zeros(group + 1 if group > 1 else 3, np.uint8), backend=backend)
    with pytest.raises(tbq.TbqTypeError):
        pack(np.zeros(group * 2, np.int64), backend=backend)


def test_packed_layouts_by_example():
    assert packing.pack4_pairs(np.uint8([1, 2])).tolist() == [0x21]
    q = np.zeros(32, np.uint8)
    q[0], q[16] = 3, 9
    assert packing.pack4_halves(q)[0] == 0x93
    assert packing.pack3(np.arange(8, dtype=np.uint8)).tolist() == [0x88, 0xC6, 0xFA]
