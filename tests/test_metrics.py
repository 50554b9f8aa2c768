"""tbq.metrics: vector errors, breakdowns, attention metrics and the reference distortions."""

import math

import numpy as np
import pytest

import tbq
from tbq import metrics
from tbq.errors import TbqValueError
from tbq.synthetic import gaussian, keys_with_outliers


def rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- vector error


def test_nmse_snr_cosine_known_values():
    x = np.array([3.0, 4.0])
    assert metrics.nmse(x, x) == 0.0
    assert metrics.snr_db(x, x) == math.inf
    assert metrics.nmse(x, np.zeros(2)) == 1.0
    assert metrics.nmse(x, 1.1 * x) == pytest.approx(0.01)
    assert metrics.snr_db(x, 1.1 * x) == pytest.approx(20.0)
    assert metrics.max_abs_error(x, [3.0, 4.5]) == 0.5
    assert metrics.cosine_similarity(x, -x) == pytest.approx(-1.0)
    with pytest.raises(TbqValueError):
        metrics.nmse(np.zeros(3), np.zeros(4))


def test_per_channel_error_locates_the_damaged_channel():
    x = rng().standard_normal((50, 4, 16))
    y = x.copy()
    y[..., 7] += 0.5  # only channel 7 is wrong
    mse = metrics.per_channel_error(x, y, "mse")
    assert mse.shape == (16,)
    assert mse[7] == pytest.approx(0.25)
    assert np.all(np.delete(mse, 7) == 0)
    nm = metrics.per_channel_error(x, y, "nmse")
    assert nm[7] == pytest.approx(0.25 / np.mean(x[..., 7] ** 2))
    assert metrics.per_channel_error(x, y, "max_abs")[7] == pytest.approx(0.5)
    assert metrics.per_channel_error(x, y, "snr_db")[0] == math.inf


def test_per_token_error_locates_the_damaged_token():
    x = rng(1).standard_normal((10, 2, 8))
    y = x.copy()
    y[3] *= 1.1
    nm = metrics.per_token_error(x, y)
    assert nm.shape == (10,)
    assert nm[3] == pytest.approx(0.01)
    assert np.all(np.delete(nm, 3) == 0)
    # pooled NMSE is the energy-weighted mean of the per-token NMSE
    w = np.sum(x**2, axis=(1, 2))
    assert metrics.nmse(x, y) == pytest.approx(np.sum(w * nm) / np.sum(w))
    with pytest.raises(TbqValueError):
        metrics.per_token_error(x, y, "bogus")


# ---------------------------------------------------------------- inner products


def test_inner_product_error_exact_is_zero_and_scaling_is_a_slope():
    x = rng(2).standard_normal((200, 32))
    r = metrics.inner_product_error(x, x, n_queries=16)
    assert r["rmse"] == 0 and r["bias"] == 0 and r["variance"] == 0 and r["slope"] == 1
    r = metrics.inner_product_error(x, 0.9 * x, n_queries=16)
    assert r["slope"] == pytest.approx(0.9)
    assert r["relative_rmse"] == pytest.approx(0.1)


def test_inner_product_bias_with_given_queries():
    x = rng(3).standard_normal((300, 16))
    shift = np.zeros(16)
    shift[0] = 0.25
    q = np.zeros((1, 16))
    q[0, 0] = 2.0
    r = metrics.inner_product_error(x, x + shift, q)
    assert r["bias"] == pytest.approx(0.5)  # q.shift
    assert r["variance"] == pytest.approx(0.0, abs=1e-12)
    assert r["rmse"] == pytest.approx(0.5)


def test_inner_product_noise_has_the_predicted_variance():
    x = rng(4).standard_normal((2000, 64))
    noise = 0.1 * rng(5).standard_normal(x.shape)
    q = rng(6).standard_normal((8, 64))
    r = metrics.inner_product_error(x, x + noise, q)
    predicted = 0.01 * np.mean(np.sum(q * q, axis=1))  # Var(q.e) = sigma^2 |q|^2
    assert r["variance"] == pytest.approx(predicted, rel=0.05)
    assert abs(r["bias"]) < 0.05


# ---------------------------------------------------------------- attention


def test_softmax_kl_zero_for_identical_and_shift_positive_otherwise():
    z = rng(7).standard_normal((5, 40)) * 3
    assert np.all(metrics.softmax_kl(z, z) == 0)
    assert np.allclose(metrics.softmax_kl(z, z + 7.0), 0, atol=1e-12)  # softmax ignores a constant
    w = z + 0.1 * rng(8).standard_normal(z.shape)
    kl = metrics.softmax_kl(z, w)
    assert np.all(kl > 0)
    # second-order expansion: KL ~ Var_p(delta) / 2 for small perturbations
    p = metrics.softmax(z)
    d = w - z
    var = np.sum(p * d * d, axis=1) - np.sum(p * d, axis=1) ** 2
    assert np.allclose(kl, var / 2, rtol=0.1)


def test_softmax_kl_hand_value():
    # KL([.5,.5] || [.25,.75]) = .5 ln 2 + .5 ln(2/3)
    assert metrics.softmax_kl([0.0, 0.0], [0.0, math.log(3)])[()] == pytest.approx(
        0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    )


def test_topk_agreement():
    z = rng(9).standard_normal((6, 100))
    assert np.all(metrics.topk_agreement(z, z, 8) == 1.0)
    assert np.all(metrics.topk_agreement(z, -z, 8) == 0.0)  # top 8 become the bottom 8
    w = z.copy()
    top = np.argsort(-z[0])[:4]
    w[0, top[0]] = -100.0  # knock one of the top 4 out
    a = metrics.topk_agreement(z, w, 4)
    assert a[0] == pytest.approx(0.75) and np.all(a[1:] == 1)
    assert metrics.topk_agreement(z[:, :3], w[:, :3], 8).shape == (6,)  # k capped at the context


def test_attention_logits_and_output_match_a_direct_computation():
    r = rng(10)
    q = r.standard_normal((3, 2, 16))
    k = r.standard_normal((20, 2, 16))
    v = r.standard_normal((20, 2, 16))
    lg = metrics.attention_logits(q, k)
    assert lg.shape == (2, 3, 20)
    h, i, t = 1, 2, 5
    assert lg[h, i, t] == pytest.approx(q[i, h] @ k[t, h] / 4.0)
    out = metrics.attention_output(q, k, v)
    p = np.exp(lg[h, i] - lg[h, i].max())
    p /= p.sum()
    assert np.allclose(out[i, h], p @ v[:, h])
    # 2-D inputs and shared queries
    assert metrics.attention_logits(q[:, 0], k[:, 0]).shape == (3, 20)
    assert np.allclose(metrics.attention_logits(q[:, 0], k)[1], q[:, 0] @ k[:, 1].T / 4.0)


def test_attention_error_identical_and_isolated_effects():
    r = rng(11)
    q = r.standard_normal((4, 2, 32))
    k = r.standard_normal((64, 2, 32))
    v = r.standard_normal((64, 2, 32))
    m = metrics.attention_error(q, k, v, k, v)
    assert m["logit_rmse"] == 0 and m["kl_mean"] == 0 and m["topk_agreement"] == 1 and m["output_nmse"] == 0
    vh = v + 0.1 * r.standard_normal(v.shape)
    m = metrics.attention_error(q, k, v, v_hat=vh)  # values only: the weights do not move
    assert m["kl_mean"] == 0 and m["topk_agreement"] == 1 and m["output_nmse"] > 0
    kh = k + 0.1 * r.standard_normal(k.shape)
    m = metrics.attention_error(q, k, v, k_hat=kh)
    assert m["kl_mean"] > 0 and m["logit_rmse"] > 0 and m["output_nmse"] > 0
    le = metrics.logit_error(q, k, kh)
    assert le["rmse"] == pytest.approx(m["logit_rmse"])
    assert "output_nmse" not in metrics.attention_error(q, k, None, kh)


def test_quantized_keys_give_worse_attention_at_fewer_bits():
    k = keys_with_outliers(128, 2, seed=0)
    q = metrics.random_queries(8, 128, 2, seed=1)
    m8 = metrics.attention_error(q, k, None, tbq.dequantize(tbq.quantize(k, "q8_0"), "q8_0"))
    m3 = metrics.attention_error(q, k, None, tbq.dequantize(tbq.quantize(k, "tbq3_0"), "tbq3_0"))
    assert 0 < m8["kl_mean"] < m3["kl_mean"]
    assert m8["topk_agreement"] > m3["topk_agreement"]


# ---------------------------------------------------------------- anchors


def test_lloyd_max_distortion_matches_the_known_values():
    assert metrics.lloyd_max_distortion(1) == pytest.approx(1 - 2 / math.pi, rel=1e-9)
    assert metrics.lloyd_max_distortion(2) == pytest.approx(0.1175, abs=1e-4)
    assert metrics.lloyd_max_distortion(3) == pytest.approx(0.03455, abs=1e-5)
    assert metrics.lloyd_max_distortion(4) == pytest.approx(0.009501, abs=1e-6)
    # every Lloyd-Max point lies between the Shannon bound and the TurboQuant upper bound
    for b in range(1, 6):
        assert metrics.shannon_lower_bound(b) < metrics.lloyd_max_distortion(b) < metrics.turboquant_upper_bound(b)


def test_lloyd_max_distortion_agrees_with_the_library_tables_and_monte_carlo():
    from tbq.codebooks import lloyd_max

    for b in (3, 4):
        cb = lloyd_max(b, 1.0)
        assert metrics.gaussian_distortion(cb.centroids, cb.thresholds) == pytest.approx(
            metrics.lloyd_max_distortion(b), rel=1e-6
        )
    x = rng(12).standard_normal(400_000)
    cb = lloyd_max(3, 1.0)
    mc = np.mean((cb.centroids[cb.index(x.astype(np.float32))] - x) ** 2)
    assert mc == pytest.approx(metrics.lloyd_max_distortion(3), rel=0.02)


def test_tbq_on_gaussian_data_reaches_lloyd_max():
    x = gaussian(256, 4, seed=3)
    for fmt, b in (("tbq4_0", 4), ("tbq3_0", 3)):
        e = metrics.nmse(x, tbq.dequantize(tbq.quantize(x, fmt), fmt))
        assert e == pytest.approx(metrics.lloyd_max_distortion(b), rel=0.06)
    assert 0.0090 < metrics.lloyd_max_distortion(4) < 0.0096 and 0.034 < metrics.lloyd_max_distortion(3) < 0.035


def test_bounds_and_entropy_and_shape_statistics():
    assert metrics.shannon_lower_bound(4) == 4.0**-4
    assert metrics.turboquant_upper_bound(3) == pytest.approx(math.sqrt(3) * math.pi / 2 / 64)
    assert np.allclose(metrics.shannon_lower_bound(np.array([1, 2])), [0.25, 0.0625])
    assert metrics.entropy_bits(np.arange(16)) == pytest.approx(4.0)
    assert metrics.entropy_bits(np.zeros(10, int)) == 0.0
    assert metrics.entropy_bits([1, 1, 2, 0], counts=True) == pytest.approx(1.5)
    g = rng(13).standard_normal(200_000)
    assert abs(metrics.kurtosis(g)) < 0.05
    assert metrics.kurtosis(rng(14).uniform(-1, 1, 200_000)) == pytest.approx(-1.2, abs=0.02)
    one_hot = np.zeros(128)
    one_hot[3] = 5.0
    assert metrics.peak_to_rms(one_hot) == pytest.approx(math.sqrt(128))
    assert metrics.peak_to_rms(np.ones(8)) == 1.0


# ---------------------------------------------------------------- value tables against Lloyd-Max


def test_table_mse_hand_values_and_scale():
    assert metrics.table_mse([0.1, 0.9, 1.6], [0.0, 1.0, 2.0]) == pytest.approx(0.18 / 3, rel=1e-12)
    x = rng(20).standard_normal(1000)
    assert metrics.table_mse(x, x) == 0.0  # every sample is a level
    assert metrics.table_mse(x, [3.0, -1.0, 3.0]) == metrics.table_mse(x, [-1.0, 3.0])  # sorted and deduplicated
    # scaling the table by g is scaling the samples by 1/g (the MSE by g^2)
    lv = np.array([-1.5, -0.5, 0.5, 1.5])
    assert metrics.table_mse(x, lv, 2.0) == pytest.approx(4 * metrics.table_mse(x / 2, lv), rel=1e-12)
    # a unit grid on values spread evenly over its cells: MSE 1/12 (midpoint sums of k/n offsets)
    n = 2000
    u = (np.arange(8)[:, None] + (np.arange(n) + 0.5) / n - 0.5).ravel()
    assert metrics.table_mse(u, np.arange(8.0)) == pytest.approx((1 - 1 / n**2) / 12, rel=1e-9)


def test_lloyd_max_samples_fixed_point_and_exact_cases():
    # at most n_levels distinct values: the values themselves, zero error
    c, m, mse = metrics.lloyd_max_samples([2.0, -1.0, 2.0, 0.5], 4)
    assert c.tolist() == [-1.0, 0.5, 2.0] and mse == 0.0
    x = rng(21).standard_normal(100_000)
    c, m, mse = metrics.lloyd_max_samples(x, 8)
    # the two Lloyd conditions hold: thresholds are midpoints, each centroid is the mean of its cell
    assert np.allclose(m, 0.5 * (c[1:] + c[:-1]), rtol=0, atol=1e-15)
    cell = np.searchsorted(m, x, side="right")
    means = np.array([x[cell == i].mean() for i in range(8)])
    assert np.allclose(c, means, rtol=0, atol=1e-9)
    assert mse == pytest.approx(metrics.table_mse(x, c), rel=1e-12)
    # a Gaussian sample: close to the Gaussian Lloyd-Max distortion, and no worse than the Gaussian table on it
    from tbq.codebooks import lloyd_max

    assert mse == pytest.approx(metrics.lloyd_max_distortion(3), rel=0.02)
    assert mse <= metrics.table_mse(x, lloyd_max(3, 1.0).centroids) * (1 + 1e-9)
    # uniform samples: the optimum is the uniform grid, MSE width^2 / (12 L^2)
    u = rng(22).uniform(-1, 1, 200_000)
    c, _, mse = metrics.lloyd_max_samples(u, 16)
    assert np.allclose(np.diff(c), 2 / 16, atol=0.01)
    assert mse == pytest.approx(4 / (12 * 256), rel=0.02)
    with pytest.raises(TbqValueError):
        metrics.lloyd_max_samples(x, 0)
    with pytest.raises(TbqValueError):
        metrics.lloyd_max_samples([np.nan, 1.0], 2)


def test_table_distortion_gaussian_closed_form():
    from tbq.codebooks import SIGMA_128, lloyd_max

    # a Lloyd-Max table is its own reference
    for b in (1, 3, 4):
        d = metrics.table_distortion(lloyd_max(b).centroids, sigma=SIGMA_128)
        assert d["ratio"] == pytest.approx(1.0, abs=1e-6) and d["best_ratio"] == pytest.approx(1.0, abs=1e-6)
        assert d["best_scale"] == pytest.approx(1.0, abs=1e-4) and d["n_levels"] == 1 << b
        assert np.allclose(d["lloyd_max_levels"], lloyd_max(b).centroids, rtol=1e-6)
    # two levels at +-1: MSE 2 - 2 sqrt(2/pi); the best scale is the 1-bit Lloyd-Max level sqrt(2/pi)
    d = metrics.table_distortion([-1.0, 1.0], sigma=1.0)
    assert d["mse"] == pytest.approx(2 - 2 * math.sqrt(2 / math.pi), rel=1e-9)
    assert d["ratio"] == pytest.approx((2 - 2 * math.sqrt(2 / math.pi)) / (1 - 2 / math.pi), rel=1e-9)
    assert d["best_scale"] == pytest.approx(math.sqrt(2 / math.pi), rel=1e-6)
    assert d["best_ratio"] == pytest.approx(1.0, abs=1e-9)
    # sigma is a unit: the same table scaled with sigma has the same ratio
    d2 = metrics.table_distortion([-3.0, 3.0], sigma=3.0)
    assert d2["ratio"] == pytest.approx(d["ratio"], rel=1e-9) and d2["mse"] == pytest.approx(9 * d["mse"], rel=1e-9)
    # n_levels charges unused codes: the 1-bit table against 2-bit Lloyd-Max
    assert metrics.table_distortion([-1.0, 1.0], sigma=1.0, n_levels=4)["ratio"] == pytest.approx(
        (2 - 2 * math.sqrt(2 / math.pi)) / metrics.lloyd_max_distortion(2), rel=1e-9
    )
    with pytest.raises(TbqValueError):
        metrics.table_distortion([-1.0, 0.0, 1.0], sigma=1.0)  # 3 levels: no 2**b Gaussian reference
    with pytest.raises(TbqValueError):
        metrics.table_distortion([-1.0, 1.0], sigma=1.0, samples=[0.0, 1.0])
    with pytest.raises(TbqValueError):
        metrics.table_distortion([-1.0, 1.0])


def test_every_shipped_rotated_table_is_at_least_lloyd_max_on_the_gaussian():
    """Lloyd-Max is the global optimum for the (log-concave) Gaussian: every table's ratio is >= 1, at any scale."""
    from tbq.codebooks import SIGMA_128

    for fmt, opts in (
        ("tbq4_0", {}),
        ("tbq3_0", {}),
        ("tbq4_0", {"codebook": "turboq-mtp"}),
        ("tbq3_0", {"codebook": "turboq-mtp"}),
        ("planar4_0", {}),
        ("planar3_0", {}),
    ):
        c = tbq.get_format(fmt, **opts).tables()["centroids"]
        d = metrics.table_distortion(c, sigma=SIGMA_128)
        assert d["ratio"] >= 1 - 1e-6 and 1 - 1e-6 <= d["best_ratio"] <= d["ratio"] + 1e-12, (fmt, opts, d)
    # the fork's 3-bit levels are 7.29x to 8.66x Lloyd-Max's: the scale that fits them lies in between
    d = metrics.table_distortion(tbq.get_format("tbq3_0", codebook="turboq-mtp").tables()["centroids"], sigma=SIGMA_128)
    assert 1 / 8.66 < d["best_scale"] < 1 / 7.29


def test_table_distortion_on_samples():
    x = rng(23).standard_normal(200_000)
    c, _, mse = metrics.lloyd_max_samples(x, 16)
    d = metrics.table_distortion(c, samples=x)
    assert d["ratio"] == pytest.approx(1.0, abs=1e-12) and d["lloyd_max_mse"] == mse
    # the measured ratio of a Gaussian table agrees with the closed form on a large sample
    from tbq.codebooks import lloyd_max

    two = [-1.0, 1.0]
    assert metrics.table_distortion(two, samples=x)["ratio"] == pytest.approx(
        metrics.table_distortion(two, sigma=1.0)["ratio"], rel=0.01
    )
    d = metrics.table_distortion(2.0 * lloyd_max(4, 1.0).centroids, samples=x)
    assert (
        d["ratio"] > 1.5
        and d["best_scale"] == pytest.approx(0.5, rel=0.02)
        and d["best_ratio"] == pytest.approx(1.0, abs=0.01)
    )
