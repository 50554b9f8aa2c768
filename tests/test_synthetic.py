"""tbq.synthetic: each generator has the structure its docstring promises."""

import math

import numpy as np
import pytest

from tbq import metrics, synthetic
from tbq.errors import TbqValueError

GENERATORS = [
    lambda s: synthetic.gaussian(16, 2, seed=s),
    lambda s: synthetic.keys_with_outliers(16, 2, seed=s),
    lambda s: synthetic.rope_keys(16, 2, seed=s),
    lambda s: synthetic.heavy_tailed_values(16, 2, seed=s),
    lambda s: synthetic.keys_with_sink(16, 2, seed=s),
    lambda s: synthetic.llm_like_kv(16, 2, seed=s)["keys"],
    lambda s: synthetic.llm_like_kv(16, 2, seed=s)["values"],
]


@pytest.mark.parametrize("gen", GENERATORS)
def test_seeded_float32_tokens_heads_dim(gen):
    a, b, c = gen(3), gen(3), gen(4)
    assert a.dtype == np.float32 and a.shape == (16, 2, 128)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.all(np.isfinite(a))


def test_outlier_channels_are_where_the_docstring_says():
    ch = (3, 50, 127)
    k = synthetic.keys_with_outliers(2000, 2, seed=0, channels=ch, factor=15.0)
    rms = np.sqrt(np.mean(k.astype(np.float64) ** 2, axis=(0, 1)))
    assert set(np.argsort(rms)[-3:]) == set(ch)
    assert np.allclose(rms[list(ch)], 15.0, rtol=0.05)
    assert np.allclose(np.delete(rms, ch), 1.0, rtol=0.1)
    # same base data as gaussian() with the same seed
    g = synthetic.gaussian(2000, 2, seed=0)
    assert np.array_equal(np.delete(k, ch, axis=-1), np.delete(g, ch, axis=-1))
    # default channels
    k = synthetic.keys_with_outliers(500, 1, seed=1)
    rms = np.sqrt(np.mean(k.astype(np.float64) ** 2, axis=(0, 1)))
    assert set(np.argsort(rms)[-4:]) == set(synthetic.DEFAULT_OUTLIER_CHANNELS)


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_rope_rotates_each_channel_pair_by_position_times_frequency(pairing):
    T, d, base = 64, 128, 10000.0
    k = synthetic.rope_keys(T, 3, d, seed=5, noise=0.0, pairing=pairing, base=base).astype(np.float64)
    if pairing == "half":
        i, j = np.arange(d // 2), np.arange(d // 2) + d // 2
    else:
        i, j = np.arange(0, d, 2), np.arange(1, d, 2)
    ang = np.arctan2(k[..., j], k[..., i])  # (T, heads, d/2)
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    expected = np.arange(T)[:, None, None] * theta[None, None, :]
    diff = np.angle(np.exp(1j * (ang - ang[:1] - expected)))  # wrapped to (-pi, pi]
    assert np.max(np.abs(diff)) < 1e-4
    # the pair norms do not change with position
    r = np.hypot(k[..., i], k[..., j])
    assert np.allclose(r, r[:1], rtol=1e-5)
    # pair 0 really turns (1 rad per position), the last pair barely
    assert abs(ang[1, 0, 0] - ang[0, 0, 0]) > 0.5


def test_rope_positions_and_apply_rope_inverse():
    x = np.random.default_rng(0).standard_normal((10, 2, 16))
    pos = np.arange(10) * 3 + 7
    y = synthetic.apply_rope(x, pos)
    back = synthetic.apply_rope(y, -pos)
    assert np.allclose(back, x)
    assert np.allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1))
    with pytest.raises(TbqValueError):
        synthetic.rope_frequencies(7)
    with pytest.raises(TbqValueError):
        synthetic.apply_rope(x, pairing="diagonal")


def test_rope_outlier_pairs_are_large_in_both_channels():
    k = synthetic.rope_keys(256, 2, seed=1, outlier_pairs=(60,), outlier_factor=10.0).astype(np.float64)
    rms = np.sqrt(np.mean(k**2, axis=(0, 1)))
    assert set(np.argsort(rms)[-2:]) == {60, 124}  # pair 60 = channels 60 and 60 + 64


def test_heavy_tailed_values_unit_variance_and_excess_kurtosis():
    v = synthetic.heavy_tailed_values(4000, 4, seed=2, df=8.0).astype(np.float64)
    assert np.var(v) == pytest.approx(1.0, rel=0.03)
    assert metrics.kurtosis(v) == pytest.approx(6 / (8 - 4), rel=0.25)  # 1.5 for df = 8
    assert metrics.kurtosis(synthetic.heavy_tailed_values(4000, 4, seed=2)) > 3  # default df = 5: 6
    with pytest.raises(TbqValueError):
        synthetic.heavy_tailed_values(4, 1, df=2.0)


def test_sink_token_has_the_documented_norm_and_draws_attention():
    k = synthetic.keys_with_sink(300, 4, seed=0, scale=8.0, n_sink=2)
    n = np.linalg.norm(k.astype(np.float64), axis=-1)
    assert np.allclose(n[:2], 8.0 * math.sqrt(128), rtol=1e-5)
    assert np.median(n[2:]) == pytest.approx(math.sqrt(128), rel=0.05)
    assert np.array_equal(k[2:], synthetic.gaussian(300, 4, seed=0)[2:])
    q = metrics.random_queries(64, 128, 4, seed=1)
    p = metrics.softmax(metrics.attention_logits(q, k))
    assert p[..., :2].sum(-1).mean() > 0.3  # two tokens out of 300 take a large share
    with pytest.raises(TbqValueError):
        synthetic.add_sink(k, n_sink=301)


def test_llm_like_kv_structure():
    kv = synthetic.llm_like_kv(256, 2, seed=0, sink_scale=6.0)
    k, v = kv["keys"].astype(np.float64), kv["values"]
    n = np.linalg.norm(k, axis=-1)
    typical = np.sqrt(
        np.mean(np.sum(synthetic.llm_like_kv(256, 2, seed=0, sink_scale=0)["keys"].astype(np.float64) ** 2, -1))
    )
    assert np.allclose(n[0], 6.0 * typical, rtol=1e-4)
    rms = np.sqrt(np.mean(k[1:] ** 2, axis=(0, 1)))
    big = set(np.argsort(rms)[-8:])
    assert big == {60, 61, 62, 63, 124, 125, 126, 127}  # the outlier pairs, both channels
    assert metrics.kurtosis(v) > 2


def test_builtin_kv_unchanged():
    kv = synthetic.builtin_kv(tokens=8, heads=2)
    assert np.array_equal(kv["keys"], synthetic.keys_with_outliers(8, 2, seed=0))
    assert np.array_equal(kv["values"], synthetic.gaussian(8, 2, seed=1))
