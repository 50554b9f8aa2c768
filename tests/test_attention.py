"""Rotated-domain attention reference (tbq.attention)."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

import tbq
import tbq.attention as att
from tbq.attention import KVCache, attention_dequantized, attention_rotated, encode_kv, f32_tolerance, score_condition
from tbq.errors import ConfigError, NonFiniteError, TbqTypeError, TbqValueError

OUTLIERS = [5, 37, 64, 111]


def data(seed, T, H, G, dim=128, key_scale=1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((H, dim), dtype=np.float32)
    k = rng.standard_normal((T, G, dim), dtype=np.float32)
    k[..., [c for c in OUTLIERS if c < dim]] *= np.float32(8)
    k *= np.float32(key_scale)
    v = rng.standard_normal((T, G, dim), dtype=np.float32)
    return q, k, v


def naive_attention(q, K, V, scale):
    """Textbook attention in float64 with numpy's own reductions (a different code path)."""
    H, G = q.shape[0], K.shape[1]
    out = np.empty(q.shape)
    for h in range(H):
        g = h // (H // G)
        s = K[:, g, :] @ q[h].astype(np.float64) * scale
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ V[:, g, :]
    return out


# (K format, V format, tokens, heads, KV heads, n_sink, sink format, head_dim, key scale, K/V config)
CASES = [
    ("tbq4_0", "tbq4_0", 64, 8, 2, 0, "f16", 128, 1.0, {}),
    ("q8_0", "tbq4_0", 48, 8, 8, 4, "f16", 128, 1.0, {}),
    ("tbq3_0", "tbq3_0", 200, 4, 1, 0, "f16", 128, 1.0, {"codebook": "turboq-mtp"}),
    ("tbq4_0", "q4_0", 96, 4, 2, 8, "q8_0", 128, 1.0, {"signs": 12}),
    ("tbq4_0", "tbq3_0", 512, 2, 1, 3, "q8_0", 128, 4.0, {}),
    ("q4_0", "q8_0", 32, 4, 2, 0, "f16", 128, 1.0, {}),
    ("tbq4_0", "tbq4_0", 40, 4, 2, 2, "f16", 256, 1.0, {}),  # two TBQ blocks per head
    ("q8_0", "tbq3_0", 128, 8, 2, 0, "f16", 128, 16.0, {}),  # peaked softmax, large S
]


def build(case, seed):
    kf, vf, T, H, G, ns, sf, dim, ks, cfg = case
    q, k, v = data(seed, T, H, G, dim, ks)
    kc = cfg if kf.startswith("tbq") else {}
    vc = cfg if vf.startswith("tbq") else {}
    K, V = encode_kv(k, v, kf, vf, n_sink=ns, sink_format=sf, k_config=kc, v_config=vc)
    return q, K, V


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-T{c[2]}-H{c[3]}x{c[4]}-sink{c[5]}{c[6]}-d{c[7]}-x{c[8]}"
)
def test_rotated_algorithm_equals_dequantized_attention(case):
    q, K, V = build(case, CASES.index(case))
    ref = attention_dequantized(q, K, V)
    vmax = np.max(np.abs(V.dequantize(np.float64)))
    # float64: the two algorithms are equal in exact arithmetic (R is orthonormal); only rounding separates them
    r64 = attention_rotated(q, K, V, dtype=np.float64)
    assert r64.dtype == np.float64 and ref.shape == (q.shape[0], q.shape[1])
    assert np.max(np.abs(r64 - ref)) <= 1e-12 * max(1.0, vmax)
    # float32: within the stated tolerance (see tbq.attention.f32_tolerance: 4 * 2^-24 * max|V| * (1 + S))
    r32 = attention_rotated(q, K, V)
    assert r32.dtype == np.float32
    err = np.max(np.abs(r32.astype(np.float64) - ref))
    tol = f32_tolerance(q, K, V)
    assert err <= tol, (err, tol)
    # the tolerance is not vacuous: a few float32 ulps scaled by the score condition, far below a quantization error
    assert tol == pytest.approx(4 * 2.0**-24 * vmax * (1 + score_condition(q, K)))
    assert tol < 1e-3 * vmax
    # and the reference is ordinary attention over the dequantized caches
    naive = naive_attention(q, K.dequantize(np.float64), V.dequantize(np.float64), 1 / math.sqrt(q.shape[1]))
    assert np.max(np.abs(naive - ref)) <= 1e-12 * max(1.0, vmax)


@pytest.mark.parametrize("dim", [64, 256])
def test_a_cache_whose_block_is_an_option_reads_its_own_sizes(dim):
    """vLLM's TurboQuant blocks are one head (``head_dim`` is a format option): a cache at head_dim 64 or 256 takes
    the instance's block and byte sizes (the registry's row is head_dim 128's), and every algorithm over it equals
    float64 attention over the decoded values."""
    q, k, v = data(7, 24, 4, 2, dim)
    cfg = {"head_dim": dim}
    K, V = encode_kv(k, v, "vllm_tq4_k", "vllm_tq3_v", k_config=cfg, v_config=cfg)
    kinfo, vinfo = tbq.get_format("vllm_tq4_k", **cfg).info, tbq.get_format("vllm_tq3_v", **cfg).info
    assert (kinfo.block_size, kinfo.type_size, vinfo.type_size) == (dim, dim // 2 + 2, dim * 3 // 8 + 4)
    assert K.data.shape == (24, 2, kinfo.type_size) and V.data.shape == (24, 2, vinfo.type_size)
    Kd, Vd = K.dequantize(np.float64), V.dequantize(np.float64)
    assert np.array_equal(Kd, tbq.dequantize(K.data, "vllm_tq4_k", **cfg).astype(np.float64))
    ref = attention_dequantized(q, K, V)
    vmax = float(np.max(np.abs(Vd)))
    naive = naive_attention(q, Kd, Vd, 1 / math.sqrt(dim))
    assert np.max(np.abs(naive - ref)) <= 1e-12 * vmax
    tol = f32_tolerance(q, K, V)
    assert tol < 1e-3 * vmax
    for backend in ("numpy", "numba"):
        assert np.max(np.abs(attention_rotated(q, K, V, backend=backend).astype(np.float64) - ref)) <= tol, backend
    # the row's bytes are the instance's: the same bytes given to half-head blocks are refused (two blocks a row)
    with pytest.raises(TbqValueError, match=f"shape \\(tokens, n_head_kv, {dim // 2 + 4}\\)"):
        KVCache("vllm_tq4_k", K.data, dim, {"head_dim": dim // 2})


def test_measured_float32_error_stays_well_inside_the_tolerance():
    """The measurement behind F32_TOLERANCE_FACTOR = 4.

    The worst error over a wider sweep (108 runs, S up to 270) was 0.78 of
    ``2^-24 * max|V| * (1 + S)``; here: the error is at least sometimes a
    sizeable fraction of that unit (the tolerance is not loose by orders of
    magnitude) and never above the factor 4.
    """
    ratios = []
    for i, case in enumerate(CASES):
        q, K, V = build(case, 100 + i)
        ref = attention_dequantized(q, K, V)
        unit = 2.0**-24 * np.max(np.abs(V.dequantize(np.float64))) * (1 + score_condition(q, K))
        ratios.append(np.max(np.abs(attention_rotated(q, K, V).astype(np.float64) - ref)) / unit)
    assert max(ratios) <= att.F32_TOLERANCE_FACTOR
    assert max(ratios) > 0.05  # float32 really is being measured


def test_wrong_tables_are_caught_by_the_tolerance():
    q, k, v = data(1, 64, 4, 2)
    K, V = encode_kv(k, v, "tbq4_0", "tbq4_0")
    ref = attention_dequantized(q, K, V)
    tol = f32_tolerance(q, K, V)
    # the same bytes read with other sign vectors (a kernel with the wrong table): far outside the tolerance
    V_bad = KVCache(V.fmt, V.data, V.head_dim, {"signs": 1})
    K_bad = KVCache(K.fmt, K.data, K.head_dim, {"signs": 1})
    assert np.max(np.abs(attention_rotated(q, K, V_bad) - ref)) > 1000 * tol
    assert np.max(np.abs(attention_rotated(q, K_bad, V) - ref)) > 1000 * tol
    # other centroids
    V_cb = KVCache(V.fmt, V.data, V.head_dim, {"codebook": "turboq-mtp"})
    assert np.max(np.abs(attention_rotated(q, K, V_cb) - ref)) > 10 * tol


def test_dequantize_float64_is_the_exact_decode():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((10, 3, 256), dtype=np.float32)
    for fmt in ("q8_0", "q4_0", "tbq4_0", "tbq3_0"):
        c = KVCache.encode(x, fmt, n_sink=2)
        y32 = c.dequantize()
        y64 = c.dequantize(np.float64)
        # float32 is the library decoder, bit for bit
        assert np.array_equal(y32[2:].view(np.uint32), tbq.dequantize(c.data, fmt).view(np.uint32))
        if fmt.startswith("tbq"):
            # float64: d * M^T c with the orthonormal rotation matrix M (inverse = transpose)
            idx, d = c.fields()
            M = c.codec.rotation.matrix()
            cent = c.codec.codebook.centroids.astype(np.float64)[idx]
            want = np.einsum("ji,tgbj->tgbi", M, cent) * d.astype(np.float64)[..., None]
            assert np.max(np.abs(y64[2:] - want.reshape(8, 3, 256))) < 1e-15 * np.max(np.abs(want))
            assert np.max(np.abs(y64 - y32)) < 1e-6 * np.max(np.abs(y64))
            assert not np.array_equal(y64, y32.astype(np.float64))  # float32 rounding of the rotation is gone
        else:
            assert np.array_equal(y64, y32.astype(np.float64))  # Q8_0/Q4_0 decode exactly in float32


def test_sink_tokens_are_kept_in_f16_or_q8_0():
    q, k, v = data(3, 20, 4, 2)
    k[0, 0, 0] = 1e-3
    for sf in ("f16", "q8_0"):
        K, V = encode_kv(k, v, "tbq3_0", "tbq4_0", n_sink=5, sink_format=sf)
        assert K.n_sink == V.n_sink == 5 and K.n_tokens == 20 and K.data.shape[0] == 15
        kd = K.dequantize()
        if sf == "f16":
            assert K.sink.shape == (5, 2, 256)
            assert np.array_equal(kd[:5], k[:5].astype(np.float16).astype(np.float32))
        else:
            assert np.array_equal(K.sink, tbq.quantize(k[:5], "q8_0"))
            assert np.array_equal(kd[:5], tbq.dequantize(K.sink, "q8_0"))
        assert np.array_equal(kd[5:], tbq.dequantize(tbq.quantize(k[5:], "tbq3_0"), "tbq3_0"))
        ref = attention_dequantized(q, K, V)
        assert np.max(np.abs(attention_rotated(q, K, V, dtype=np.float64) - ref)) < 1e-12
    # sinks change the result (the first tokens are nearly exact now)
    K0, V0 = encode_kv(k, v, "tbq3_0", "tbq4_0")
    assert np.max(np.abs(attention_dequantized(q, K0, V0) - ref)) > 1e-4
    # every token a sink: the rotated algorithm reads no TBQ block at all
    K, V = encode_kv(k, v, "tbq4_0", "tbq4_0", n_sink=20)
    assert K.data.shape[0] == 0
    assert np.max(np.abs(attention_rotated(q, K, V, dtype=np.float64) - attention_dequantized(q, K, V))) < 1e-12


def test_gqa_head_mapping_and_scale():
    q, k, v = data(4, 16, 6, 3)
    K, V = encode_kv(k, v, "tbq4_0", "q8_0")
    Vd = V.dequantize(np.float64)
    out = attention_dequantized(q, K, V, scale=0.3)
    for h in range(6):
        g = h // 2  # heads 0,1 -> KV head 0; 2,3 -> 1; 4,5 -> 2
        single = attention_dequantized(
            q[h : h + 1],
            KVCache(K.fmt, K.data[:, g : g + 1], 128),
            KVCache(V.fmt, V.data[:, g : g + 1], 128),
            scale=0.3,
        )
        np.testing.assert_allclose(out[h], single[0], rtol=0, atol=1e-15)
    # scale 0: uniform weights, the mean of the value rows
    flat = attention_rotated(q, K, V, scale=0.0, dtype=np.float64)
    np.testing.assert_allclose(flat, Vd.mean(axis=0)[np.arange(6) // 2], rtol=0, atol=1e-12)
    # default scale is 1/sqrt(head_dim)
    assert np.array_equal(attention_dequantized(q, K, V), attention_dequantized(q, K, V, scale=1 / math.sqrt(128)))
    # one token: the output is that token's value row
    K1, V1 = encode_kv(k[:1], v[:1], "tbq4_0", "tbq4_0")
    np.testing.assert_allclose(
        attention_rotated(q, K1, V1, dtype=np.float64), V1.dequantize(np.float64)[0][np.arange(6) // 2], atol=1e-15
    )


def test_errors():
    q, k, v = data(5, 8, 4, 2)
    K, V = encode_kv(k, v, "tbq4_0", "tbq4_0")
    with pytest.raises(TbqValueError, match="multiple of n_head_kv"):
        attention_dequantized(q[:3], K, V)
    with pytest.raises(TbqValueError, match="head_dim"):
        attention_rotated(q[:, :64], K, V)
    K2, _ = encode_kv(k[:5], v[:5], "tbq4_0", "tbq4_0")
    with pytest.raises(TbqValueError, match="same number"):
        attention_rotated(q, K2, V)
    with pytest.raises(TbqTypeError):
        attention_rotated(q.astype(np.int32), K, V)
    with pytest.raises(TbqTypeError):
        attention_rotated(q, k, V)
    bad = q.copy()
    bad[0, 0] = np.nan
    with pytest.raises(NonFiniteError):
        attention_dequantized(bad, K, V)
    with pytest.raises(ConfigError):
        KVCache.encode(k, "tbq4_0", n_sink=1, sink_format="q9_0")  # any registered format holds sinks; this is none
    with pytest.raises(TbqValueError, match="multiple of 128"):
        KVCache.encode(
            k[..., :96], "q8_0", n_sink=1, sink_format="tbq4_0"
        )  # a sink format's block must divide head_dim
    with pytest.raises(TbqValueError, match="n_sink"):
        KVCache.encode(k, "tbq4_0", n_sink=9)
    big = k.copy()
    big[0, 0, 0] = 1e6
    with pytest.raises(TbqValueError, match="float16"):
        KVCache.encode(big, "tbq4_0", n_sink=1)
    assert KVCache.encode(big, "q8_0", n_sink=1, sink_format="q8_0").n_sink == 1
    with pytest.raises(TbqValueError, match="shape"):
        KVCache("tbq4_0", K.data[..., :10], 128)
    with pytest.raises(TbqTypeError):
        attention_rotated(q, K, V, dtype=np.float16)


def test_scale_must_be_a_real_number():
    """The models' scale is any finite real number (0 and negative included), never a string or a bool:
    ``float(scale)`` once took ``"0.5"`` as 0.5, ``True`` as 1 and failed on ``"x"`` with a bare ValueError."""
    q, k, v = data(4, 8, 2, 1)
    K, V = encode_kv(k, v, "tbq4_0", "q8_0")
    for f in (attention_dequantized, attention_rotated):
        for bad in ("0.5", "x", True, None.__class__):
            with pytest.raises(TbqTypeError, match="scale must be a real number, got "):
                f(q, K, V, scale=bad)
        with pytest.raises(TbqValueError, match=r"^scale must be finite, got inf$"):
            f(q, K, V, scale=np.float32(np.inf))
    assert np.array_equal(
        attention_dequantized(q, K, V, scale=np.float32(0.5)), attention_dequantized(q, K, V, scale=0.5)
    )
    assert np.isfinite(attention_rotated(q, K, V, scale=-2)).all()


def test_module_docstring_example():
    assert doctest.testmod(att).failed == 0
