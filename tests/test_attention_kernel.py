"""The fused rotated-domain attention kernel (``attention_rotated(..., backend="numba")``).

It must agree with the float64 reference :func:`tbq.attention.attention_dequantized`
within :func:`tbq.attention.f32_tolerance`, like the float32 NumPy model: on the
cases of tests/test_attention.py, on the golden attention sets, on long caches
split over threads and chunks, and on fuzzed caches. Its speed is measured by
``benchmarks/bench_attention.py``, not here.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_attention import CASES, build, data

import tbq
from tbq import attention as att
from tbq.attention import KVCache, attention_dequantized, attention_rotated, encode_kv, f32_tolerance
from tbq.errors import ConfigError, TbqTypeError, TbqValueError
from tbq.kernels import address
from tbq.kernels import jit as njit_cache

#: The KV cache types, the unquantized f32 included: attention reads a cache, and the dot-product operand formats
#: (q8_1, q8_k: cache_type=False) are no cache type (llama.cpp refuses them as --cache-type-k/-v)
CACHE_FORMATS = tbq.formats.cache_types()

CORE = ("q8_0", "q4_0", "tbq4_0", "tbq3_0")


def check(q, K, V, **kw):
    """The kernel's error against the float64 reference, in units of f32_tolerance; also the model's."""
    ref = attention_dequantized(q, K, V, scale=kw.get("scale"))
    tol = f32_tolerance(q, K, V, scale=kw.get("scale"))
    out = attention_rotated(q, K, V, backend="numba", **kw)
    assert out.dtype == np.float32 and out.shape == q.shape
    err = float(np.max(np.abs(out.astype(np.float64) - ref)))
    assert err <= tol, (err, tol)
    return err / tol


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-T{c[2]}-H{c[3]}x{c[4]}-sink{c[5]}{c[6]}-d{c[7]}-x{c[8]}"
)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_kernel_within_tolerance_on_the_reference_cases(case, threads):
    q, K, V = build(case, CASES.index(case))
    check(q, K, V, threads=threads)


def test_kernel_on_the_golden_attention_sets():
    """Every K/V pair of the core formats, with and without sinks, on the golden data (tbq golden --attention)."""
    from tbq.golden import build_attention

    for kf in CORE:
        for vf in CORE:
            for n_sink, sink in ((0, "f16"), (3, "q8_0")):
                gs = build_attention(kf, vf, seed=5, tokens=40, n_head=8, n_head_kv=2, n_sink=n_sink, sink_format=sink)
                a = gs.arrays
                q, k, v = (a[n].astype(np.float32) for n in ("q", "k_input", "v_input"))
                K, V = encode_kv(k, v, kf, vf, n_sink=n_sink, sink_format=sink)
                assert np.array_equal(K.data, a["k_bytes"]) and np.array_equal(V.data, a["v_bytes"])
                out = attention_rotated(q, K, V, backend="numba")
                err = np.max(np.abs(out.astype(np.float64) - a["out_dequantized"].astype(np.float64)))
                assert err <= f32_tolerance(q, K, V), (kf, vf, n_sink)


@pytest.mark.parametrize("T", [1, 2, 63, 64, 65, 200, 5000])
def test_chunk_and_split_boundaries(T, monkeypatch):
    monkeypatch.setattr(att, "TASK_TOKENS", 64)  # split short caches into tasks too
    q, k, v = data(T, T, 8, 2)
    K, V = encode_kv(k, v, "tbq4_0", "tbq3_0", n_sink=min(2, T - 1))
    r1 = check(q, K, V, threads=1)
    r3 = check(q, K, V, threads=3)
    assert max(r1, r3) < 0.5  # well inside: a few float32 roundings, not a systematic error


def test_long_cache_over_threads():
    q, k, v = data(7, 20000, 4, 1)
    for kf, vf in (("tbq4_0", "tbq4_0"), ("q8_0", "q4_0")):
        K, V = encode_kv(k, v, kf, vf, n_sink=4)
        assert check(q, K, V, threads=2) < 0.5


@pytest.mark.parametrize("sink_format", att.SINK_FORMATS)
def test_any_registered_format_holds_the_sinks(sink_format):
    q, k, v = data(11, 50, 4, 2, dim=256)
    K, V = encode_kv(k, v, "tbq4_0", "tbq4_0", n_sink=5, sink_format=sink_format)
    assert K.n_sink == 5 and K.sink_format == sink_format
    if sink_format != "f16":
        assert np.array_equal(K.sink, tbq.get_codec(sink_format, backend="numpy").encode(k[:5]))
        # the cache's values are in the input's domain; turbo's decoder returns the rotated one
        back = tbq.get_format(sink_format).domain.from_decode_domain(tbq.dequantize(K.sink, sink_format))
        assert np.array_equal(K.dequantize()[:5], back)
    ref = attention_dequantized(q, K, V)
    assert np.max(np.abs(attention_rotated(q, K, V, dtype=np.float64) - ref)) < 1e-12
    check(q, K, V)


@pytest.mark.parametrize("fmt", CACHE_FORMATS)
def test_any_registered_format_as_the_main_cache(fmt):
    """Every format is read through its attention reader, as keys or as values, beside another format."""
    q, k, v = data(12, 40, 4, 2)
    K, V = encode_kv(k, v, fmt, "tbq4_0", n_sink=2)
    check(q, K, V)
    K, V = encode_kv(k, v, "tbq3_0", fmt)
    check(q, K, V)


def test_the_f16_and_q8_0_sinks_are_unchanged():
    """The sink bytes and values of f16 and q8_0 are exactly what they were before any format could hold sinks."""
    q, k, v = data(3, 20, 4, 2)
    k[0, 0, 0] = 1e-3
    K, _ = encode_kv(k, v, "tbq3_0", "tbq4_0", n_sink=5, sink_format="f16")
    assert np.array_equal(K.sink, np.ascontiguousarray(k[:5].astype("<f2")).view(np.uint8))
    assert np.array_equal(K._sink_values(), k[:5].astype(np.float16).astype(np.float32))
    K, _ = encode_kv(k, v, "tbq3_0", "tbq4_0", n_sink=5, sink_format="q8_0")
    assert np.array_equal(K.sink, tbq.get_codec("q8_0", backend="numpy").encode(k[:5]))


def test_expf():
    from numba import njit

    from tbq.attention_kernels import expf

    @njit
    def run(x, out):
        for i in range(x.size):
            out[i] = expf(x[i])

    x = np.concatenate(
        [np.linspace(-87.3, 0, 200_001).astype(np.float32), np.float32([-0.0, -1e-30, -87.4, -100, -np.inf])]
    )
    y = np.empty_like(x)
    run(x, y)
    exact = np.exp(x.astype(np.float64))
    ok = exact >= np.finfo(np.float32).tiny
    ulp = np.abs(y[ok] - exact[ok]) / np.spacing(exact[ok].astype(np.float32)).astype(np.float64)
    assert ulp.max() <= 1.0
    assert np.array_equal(y[~ok], np.zeros((~ok).sum(), np.float32))
    assert y[-5] == 1.0


def test_kernel_errors():
    q, k, v = data(5, 8, 4, 2)
    K, V = encode_kv(k, v, "tbq4_0", "tbq4_0")
    with pytest.raises(ConfigError):
        attention_rotated(q, K, V, backend="cuda")
    with pytest.raises(TbqTypeError):
        attention_rotated(q, K, V, backend="numba", dtype=np.float64)
    for bad in (0, True, 1.5):
        with pytest.raises(ConfigError):
            attention_rotated(q, K, V, backend="numba", threads=bad)


@settings(max_examples=60, deadline=None)
@given(
    kf=st.sampled_from(CORE),
    vf=st.sampled_from(CORE),
    T=st.integers(1, 300),
    heads=st.sampled_from([(1, 1), (4, 1), (4, 2), (6, 3), (8, 8)]),
    dim=st.sampled_from([128, 256]),
    n_sink=st.integers(0, 4),
    sink_format=st.sampled_from(["f16", "q8_0"]),
    key_scale=st.sampled_from([0.01, 1.0, 4.0, 16.0]),
    seed=st.integers(0, 2**31),
    threads=st.integers(1, 3),
)
def test_fuzzed_caches(kf, vf, T, heads, dim, n_sink, sink_format, key_scale, seed, threads):
    H, G = heads
    q, k, v = data(seed, T, H, G, dim, key_scale)
    n_sink = min(n_sink, T)
    K, V = encode_kv(k, v, kf, vf, n_sink=n_sink, sink_format=sink_format)
    check(q, K, V, threads=threads)


def test_kvcache_from_parts_reads_the_same_in_both_backends():
    q, k, v = data(9, 70, 4, 2)
    K, V = encode_kv(k, v, "tbq4_0", "q8_0", n_sink=3, sink_format="q8_0")
    K2 = KVCache(K.fmt, np.asfortranarray(K.data), K.head_dim, K.config, K.sink, K.sink_format)  # any layout
    a = attention_rotated(q, K, V, backend="numba", threads=1)
    b = attention_rotated(q, K2, V, backend="numba", threads=1)
    assert np.array_equal(a, b)


def test_k_and_v_with_different_sink_counts():
    q, k, v = data(13, 60, 4, 2)
    for nk, nv in ((2, 5), (5, 0), (0, 3)):
        K = KVCache.encode(k, "tbq4_0", n_sink=nk)
        V = KVCache.encode(v, "tbq3_0", n_sink=nv, sink_format="q8_0")
        ref = attention_dequantized(q, K, V)
        assert np.max(np.abs(attention_rotated(q, K, V, dtype=np.float64) - ref)) < 1e-12
        check(q, K, V, threads=2)


def test_attention_fused_on_exact_rows():
    """Float rows on either side (tbq compare's exact reference and its one-side-quantized outputs)."""
    q, k, v = data(14, 90, 8, 2)
    K, V = encode_kv(k, v, "tbq4_0", "q4_0", n_sink=3)
    exact = att.attention_fused(q, k, v)
    s = np.einsum("hd,thd->ht", q.astype(np.float64), k.astype(np.float64)[:, np.arange(8) // 4]) / np.sqrt(128)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = np.einsum("ht,thd->hd", p / p.sum(axis=1, keepdims=True), v.astype(np.float64)[:, np.arange(8) // 4])
    assert np.max(np.abs(exact - want)) < 1e-5
    for kk, vv in ((K, v), (k, V), (K, V)):
        kd = kk.dequantize(np.float64) if isinstance(kk, KVCache) else kk.astype(np.float64)
        vd = vv.dequantize(np.float64) if isinstance(vv, KVCache) else vv.astype(np.float64)
        s = np.einsum("hd,thd->ht", q.astype(np.float64), kd[:, np.arange(8) // 4]) / np.sqrt(128)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        want = np.einsum("ht,thd->hd", p / p.sum(axis=1, keepdims=True), vd[:, np.arange(8) // 4])
        assert np.max(np.abs(att.attention_fused(q, kk, vv, threads=2) - want)) < 1e-5
    with pytest.raises(TbqValueError):
        att.attention_fused(q, k[:10], v)


# ---------------------------------------------------------------------------
# every format through its reader; bits independent of the threads; prefill
# ---------------------------------------------------------------------------


@njit_cache
def _read_rows(read, data, aux, n_blocks, out):
    for i in range(data.shape[0]):
        read(address(data[i]), address(out[i]), n_blocks, address(aux), aux.shape[0])


@pytest.mark.parametrize("fmt", CACHE_FORMATS)
def test_every_format_declares_a_reader_that_gives_the_decoders_bits(fmt):
    """No registered format is decoded first: its reader gives exactly the decoder's float32 bits
    (original domain) or ``c[idx] * d`` rounded once (rotated domain), on arbitrary bytes too."""
    f = tbq.get_codec(fmt).format
    r = f.attention.reader()
    assert r is not None, f"{fmt} has no attention reader"
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 256)).astype(np.float32)
    for blocks in (tbq.quantize(x, fmt), rng.integers(0, 256, (50, f.info.row_bytes(256)), dtype=np.uint8)):
        out = np.empty((50, 256), np.float32)
        _read_rows(r.read, np.ascontiguousarray(blocks), r.aux, 256 // f.block_size, out)
        if f.attention.domain == "rotated":
            fl = f.fields(blocks)
            with np.errstate(all="ignore"):
                want = (f.codebook.centroids[fl["idx"]] * fl["d"][..., None]).reshape(50, 256)
        else:
            want = tbq.get_codec(fmt).decode(blocks)
        assert np.array_equal(out.view(np.uint32), want.astype(np.float32).view(np.uint32)), fmt


@settings(max_examples=40, deadline=None)
@given(
    kf=st.sampled_from(CACHE_FORMATS),
    vf=st.sampled_from(CACHE_FORMATS),
    T=st.integers(1, 200),
    heads=st.sampled_from([(1, 1), (4, 1), (8, 2), (6, 3)]),
    n_sink=st.integers(0, 3),
    sink_format=st.sampled_from(att.SINK_FORMATS),
    seed=st.integers(0, 2**31),
)
def test_fuzzed_mixed_formats(kf, vf, T, heads, n_sink, sink_format, seed):
    """K and V in any two formats, sinks in any format: within the float32 tolerance of the float64 reference."""
    H, G = heads
    q, k, v = data(seed, T, H, G, 256)
    K, V = encode_kv(k, v, kf, vf, n_sink=min(n_sink, T), sink_format=sink_format)
    check(q, K, V, threads=2)


@pytest.mark.parametrize(
    "kf, vf", [("tbq4_0", "tbq3_0"), ("q8_0", "f16"), ("bf16", "q4_0"), ("fp8_e4m3", "nvfp4"), ("iso4_0", "q5_1")]
)
def test_the_bits_do_not_depend_on_the_threads(kf, vf, monkeypatch):
    """Several tasks (a cache of 2600 tokens in 64-token tasks) and sinks: threads 1, 2 and 3 give the same bits."""
    monkeypatch.setattr(att, "TASK_TOKENS", 64)
    q, k, v = data(21, 2600, 8, 2)
    K, V = encode_kv(k, v, kf, vf, n_sink=3, sink_format="q8_0")
    outs = [attention_rotated(q, K, V, backend="numba", threads=t) for t in (1, 2, 3)]
    assert len(att.task_bounds(K.n_tokens - 3)) - 1 == 41
    assert all(np.array_equal(o.view(np.uint32), outs[0].view(np.uint32)) for o in outs[1:])
    assert check(q, K, V, threads=2) < 0.5


@pytest.mark.parametrize("kf, vf, n_sink", [("tbq4_0", "tbq4_0", 0), ("q8_0", "tbq3_0", 2), ("f16", "bf16", 0)])
def test_prefill_is_causal_attention_of_every_query_token(kf, vf, n_sink):
    """A (n_query, n_head, D) call with causal=True: query token i sees the cache's tokens 0 .. T - n_query + i,
    each row within the tolerance of the float64 reference on the truncated cache; without causal, all of them."""
    nq, T = 9, 150
    q, k, v = data(23, T, 8, 2)
    qs = np.random.default_rng(5).standard_normal((nq, 8, 128)).astype(np.float32)
    K, V = encode_kv(k, v, kf, vf, n_sink=n_sink)
    out = att.attention_fused(qs, K, V, causal=True, threads=2)
    assert out.shape == (nq, 8, 128) and out.dtype == np.float32
    assert np.array_equal(out, att.attention_fused(qs, K, V, causal=True, threads=1))
    for i in range(nq):
        n = T - nq + i + 1
        Ki = KVCache(K.fmt, K.data[: n - n_sink], K.head_dim, K.config, K.sink, K.sink_format)
        Vi = KVCache(V.fmt, V.data[: n - n_sink], V.head_dim, V.config, V.sink, V.sink_format)
        err = np.max(np.abs(out[i] - attention_dequantized(qs[i], Ki, Vi)))
        assert err <= f32_tolerance(qs[i], Ki, Vi), (i, err)
    full = att.attention_fused(qs, K, V)
    for i in (0, nq - 1):
        assert np.array_equal(full[i], att.attention_fused(qs[i], K, V))
    assert not np.array_equal(full[0], out[0])
    with pytest.raises(TbqValueError):
        att.attention_fused(np.zeros((T + 1, 8, 128), np.float32), K, V, causal=True)


@pytest.mark.parametrize("fmt", [f for f in CACHE_FORMATS if tbq.get_codec(f).format.attention.domain == "original"])
def test_a_cache_read_in_the_original_domain_gives_the_bits_of_its_decoded_rows(fmt):
    """The reader is the decoder, so the kernel on the cache and on its decoded rows agree bit for bit
    (``tbq compare`` passes the decoded rows and compiles no reader)."""
    q, k, v = data(31, 700, 8, 2)
    K, V = encode_kv(k, v, fmt, fmt)
    a = att.attention_fused(q, K, V, threads=2)
    b = att.attention_fused(q, K.dequantize(), V.dequantize(), threads=1)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("fmt", ["q8_0", "tbq4_0"])
def test_a_codec_whose_reader_was_built_still_pickles(fmt):
    """Dask's distributed workers receive codecs by (cloud)pickle; the compiled reader stays behind and is rebuilt."""
    import pickle

    codec = tbq.get_codec(fmt)
    r = codec.format.attention.reader()
    assert r is not None
    back = pickle.loads(pickle.dumps(codec))
    assert "_attention_reader" not in back.format.__dict__ and "_attention_reader" in codec.format.__dict__
    x = np.random.default_rng(5).standard_normal((4, 256)).astype(np.float32)
    assert back.encode(x).tobytes() == codec.encode(x).tobytes()
    out = np.empty((4, 256), np.float32)
    _read_rows(back.format.attention.reader().read, codec.encode(x), r.aux, 256 // codec.block_size, out)
    want = np.empty_like(out)
    _read_rows(r.read, codec.encode(x), r.aux, 256 // codec.block_size, want)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def test_the_portable_readers_give_the_same_bits_on_a_cpu_without_avx2_or_f16c(tmp_path):
    """Compiled for ``NUMBA_CPU_NAME=generic`` (no AVX2, no F16C), the TBQ4 reader takes its scalar lookup
    instead of ``kernels.lookup16_row`` (vpermps) and the f16 reader its integer widening: the reader test
    above, in a child process, must pass the same way."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NUMBA_CPU_FEATURES", None)
    here = Path(__file__).resolve().parent
    probe = "import tbq.kernels as k; assert not k.TARGET_AVX2 and not k.TARGET_F16C"
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here / "test_attention_kernel.py"),
         "-k", "declares_a_reader and (tbq4_0 or tbq3_0 or f16)"],
        env=env, cwd=here.parent, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout


# ---------------------------------------------------------------------------
# the kernel's documented arithmetic: its NumPy twin, bit for bit
# ---------------------------------------------------------------------------

_F = np.float32


@pytest.mark.parametrize(
    "G, RQ, D, T, t0, causal",
    [
        (2, 4, 128, 200, 0, False),  # GQA 4: four rows by four tokens; a last chunk of 8 tokens
        (2, 7, 32, 133, 0, True),  # a quad and three rows; a tail of 5 tokens (scores from a padded group)
        (1, 2, 16, 70, 5, False),  # two rows (eight tokens a group); 65 tokens, the last chunk one token
        (2, 6, 64, 64, 0, True),  # one whole chunk, a quad and two rows
        (1, 5, 32, 135, 0, False),  # a last chunk of 7 tokens; one row left (16 tokens a group)
        (1, 8, 32, 20, 16, True),  # causal rows 0-2 see nothing in the task (maximum -inf, weights 0)
        (1, 8, 64, 131, 3, True),  # two row quads, causal, a start off the chunk grid
        (2, 4, 40, 67, 0, True),  # D a multiple of 8, not 16: _attend_any's scalar loops, lanes 8-15 short
        (3, 5, 48, 77, 0, True),  # a row left after the quad; 48 channels: values 32 a pass, then 16
        (2, 3, 40, 70, 0, False),  # fewer rows than a quad, D not a multiple of 16
        (1, 4, 12, 33, 0, False),  # D under 16: lanes 12-15 stay 0
        (2, 1, 128, 9, 0, False),  # MHA, one token past a tile
    ],
)
@pytest.mark.parametrize("special", [False, True], ids=["finite", "nonfinite"])
def test_attend_performs_the_documented_operations_in_order(G, RQ, D, T, t0, causal, special):
    """Bit for bit, the kernel's M, L and ACC are its NumPy twin's (:func:`tbq.attention._attend_numpy`, the
    documented arithmetic: 16 lane fma sums and a fixed tree per score, an fma per token and channel for the
    values): any restructuring of its loops (register tiles, microkernels, SIMD widths) must keep every element's
    operations and their order."""
    from tbq import attention_kernels as kn

    rng = np.random.default_rng(G * 1000 + RQ * 100 + D + T)
    Q = rng.standard_normal((G, RQ, D)).astype(_F)
    Kr = (rng.standard_normal((T, G, D)) * 1.5).astype(_F)
    Vr = rng.standard_normal((T, G, D)).astype(_F)
    lim = (T - RQ + 1 + np.arange(RQ)).astype(np.int64) if causal else np.full(RQ, T, np.int64)
    scale = _F(1 / np.sqrt(D))
    if special:  # non-finite keys and values, zero query rows: NaN scores the maximum skips, +-0 ties, inf weights
        Kr[3, 0, :5] = np.nan
        Kr[T // 2, :, 7] = np.inf
        Kr[T - 1, 0] = -np.inf
        Vr[T // 3, 0, :3] = np.inf
        Q[0, RQ - 1] = 0.0
        Q[-1, 0] = -0.0
    kop = att._rows_operand(Kr)[:4]
    vop = att._rows_operand(Vr)[:4]
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, 0 * inf: NaN, as in the kernel
        want = att._attend_numpy(Q, lim, scale, (Kr, Vr), (t0, T), kn.CHUNK)
    # _attend_any for any head dimension; _attend (microkernels only) for multiples of 16
    kernels = [kn._attend_any, kn._attend] if D % 16 == 0 else [kn._attend_any]
    for kernel in kernels:
        out = (np.empty((G, RQ), _F), np.empty((G, RQ), _F), np.empty((G, RQ, D), _F))
        kernel(Q, lim, scale, kop, vop, (t0, T), kn.CHUNK, out)
        for name, got, w in zip("MLA", out, want, strict=True):
            same = got.view(np.uint32) == w.view(np.uint32)
            assert np.all(same | (np.isnan(got) & np.isnan(w))), (kernel.__name__, name)  # NaN: any payload
            assert np.isnan(got).sum() == np.isnan(w).sum()
        if special and t0 == 0:
            assert not np.isfinite(out[2]).all()  # the special values reached the sums


def test_attend_refuses_what_its_vectors_cannot_hold():
    """_attend's microkernels take 16 values of a row and up to 16 tokens a group: another head dimension or chunk
    is refused (the caller picks _attend_any), never read past the scratch."""
    from tbq import attention_kernels as kn

    Kr = np.ones((9, 1, 40), _F)
    op = att._rows_operand(Kr)[:4]
    out = (np.empty((1, 4), _F), np.empty((1, 4), _F), np.empty((1, 4, 40), _F))
    q = np.ones((1, 4, 40), _F)
    lim = np.full(4, 9, np.int64)
    with pytest.raises(ValueError, match="multiple of 16"):
        kn._attend(q, lim, _F(0.1), op, op, (0, 9), kn.CHUNK, out)
    Kr = np.ones((9, 1, 32), _F)
    op = att._rows_operand(Kr)[:4]
    out = (np.empty((1, 4), _F), np.empty((1, 4), _F), np.empty((1, 4, 32), _F))
    with pytest.raises(ValueError, match="chunk"):
        kn._attend(q[..., :32].copy(), lim, _F(0.1), op, op, (0, 9), 24, out)
