"""tbq.hf.TbqCache and its engines on small random-weight Llama models (built here, no download).

The oracles are independent of the cache: transformers' own DynamicCache holds
the post-RoPE K/V the model computed; the Walsh-Hadamard matrix is scipy's;
the GGUF permutation and ggml's SIMD q8_0 rule are written out again here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import tbq
from tbq import budget
from tbq.errors import ConfigError, TbqValueError
from tbq.hf import TbqCache, prepare
from tbq.hf import engine as eng
from tbq.hf.cache import cache_kwargs
from tbq.hf.capture import capture_kv, load_kv, save_kv
from tbq.hf.evaluation import evaluate, parse_cache_type, perplexity_chunks


def _model(head_dim=128, kv_heads=2, heads=4, layers=3, seed=0, vocab=97):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=128,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        num_hidden_layers=layers,
        intermediate_size=96,
        vocab_size=vocab,
        max_position_embeddings=1024,
        bos_token_id=1,
    )
    m = LlamaForCausalLM(cfg).eval()
    # larger attention weights than the init, so quantization errors show in the logits
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    return m


@pytest.fixture(scope="module")
def model():
    return prepare(_model())


@pytest.fixture(scope="module")
def ids():
    return torch.from_numpy(np.random.default_rng(1).integers(0, 97, (1, 96)))


def _logits(model, ids, cache=None):
    with torch.no_grad():
        return model(ids, use_cache=True, **cache_kwargs(model, cache)).logits


def _dynamic_kv(model, ids):
    """The post-RoPE K and V the model computed, from transformers' own cache: (tokens, heads, head_dim) per layer."""
    cache = DynamicCache(config=model.config)
    _logits(model, ids, cache)
    return [(l.keys[0].transpose(0, 1).numpy(), l.values[0].transpose(0, 1).numpy()) for l in cache.layers]


def _run_kv(model, ids, cache):
    """Run ``model`` with ``cache`` and return the post-RoPE K and V each layer computed in that run.

    Recomputed from each attention module's inputs with transformers' own
    projections and ``apply_rotary_pos_emb``, independently of the cache
    (layers after the first see the quantized cache's effect on their inputs).
    """
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    seen, hooks = [], []

    def pre(mod, args, kwargs):
        h = kwargs.get("hidden_states", args[0] if args else None)
        cos, sin = kwargs["position_embeddings"]
        shape = (*h.shape[:-1], -1, mod.head_dim)
        k = mod.k_proj(h).view(shape).transpose(1, 2)
        v = mod.v_proj(h).view(shape).transpose(1, 2)
        q = mod.q_proj(h).view(shape).transpose(1, 2)
        _, k = apply_rotary_pos_emb(q, k, cos, sin)
        seen.append((k[0].transpose(0, 1).detach().numpy(), v[0].transpose(0, 1).detach().numpy()))

    for layer in model.model.layers:
        hooks.append(layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        _logits(model, ids, cache)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _gguf_order(k):
    """Per head: gguf[2i] = hf[i], gguf[2i+1] = hf[i + d/2] (llama.cpp's converter, written out again)."""
    d = k.shape[-1]
    out = np.empty_like(k)
    out[..., 0::2] = k[..., : d // 2]
    out[..., 1::2] = k[..., d // 2 :]
    return out


def _simd_q8_0(rows):
    """ggml's AVX quantize_row_q8_0, written out again in NumPy: fp16(amax/127), rint(x * (127/amax)) half to even."""
    b = rows.reshape(*rows.shape[:-1], -1, 32).astype(np.float32)
    amax = np.abs(b).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    codes = np.rint(b * inv).astype(np.int8)
    d = (amax / np.float32(127)).astype(np.float16)
    out = np.concatenate([d.view(np.uint8), codes.view(np.uint8)], axis=-1)
    return out.reshape(*rows.shape[:-1], -1)


def _llama_cpp_bytes(rows, fmt, **options):
    """What llama.cpp's CPU backend writes: quantize_row_*_ref (tbq.quantize), except q8_0's SIMD quantizer."""
    return _simd_q8_0(rows) if fmt == "q8_0" else tbq.quantize(rows, fmt, **options)


def _rot(x, n):
    """x times H_n / sqrt(n) in n-value blocks: the spec's in-place butterfly in float32, written out again."""
    s = x.shape
    w = x.reshape(-1, n).astype(np.float32).copy()
    h = 1
    while h < n:
        for start in range(0, n, 2 * h):
            a = w[:, start : start + h].copy()
            b = w[:, start + h : start + 2 * h].copy()
            w[:, start : start + h] = a + b
            w[:, start + h : start + 2 * h] = a - b
        h *= 2
    return (w * np.float32(1.0 / math.sqrt(n))).reshape(s)


# --------------------------------------------------------------------------- exactness


def test_f32_cache_reproduces_the_models_own_logits_exactly(model, ids):
    ref = _logits(model, ids)  # transformers' DynamicCache, sdpa
    for engine in ("llama.cpp", "plain"):
        out = _logits(model, ids, TbqCache(model.config, "f32", "f32", engine=engine))
        assert torch.equal(out, ref), engine


def test_f32_cache_reproduces_generation_step_by_step(model, ids):
    ref_cache, cache = DynamicCache(config=model.config), TbqCache(model.config, "f32", "f32")
    a, b = _logits(model, ids[:, :40], ref_cache), _logits(model, ids[:, :40], cache)
    assert torch.equal(a, b)
    for t in range(40, 48):
        assert torch.equal(_logits(model, ids[:, t : t + 1], ref_cache), _logits(model, ids[:, t : t + 1], cache))


@pytest.mark.parametrize("k,v", [("q4_0", "q8_0"), ("tbq4_0", "tbq3_0"), ("iq4_nl", "q5_1"), ("f16", "bf16")])
def test_stored_bytes_are_tbq_quantize_of_llama_cpp_rows(model, ids, k, v):
    cache = TbqCache(model.config, k, v)
    kv = _run_kv(model, ids, cache)
    assert len(kv) == 3

    def opts(f):
        return {"codebook": "turboq-mtp"} if f.startswith("tbq") else {}  # the fork's own tables

    for (keys, values), layer in zip(kv, cache.layers, strict=True):
        rows_k = _gguf_order(keys)
        if k not in ("f16", "bf16"):
            rows_k = _rot(rows_k, 128)  # head_dim 128: H_128
        rows_v = values if v in ("f16", "bf16") else _rot(values, 64)  # V: H_64 blocks
        want_k = _llama_cpp_bytes(rows_k.reshape(len(rows_k), -1), k, **opts(k))
        want_v = _llama_cpp_bytes(rows_v.reshape(len(rows_v), -1), v, **opts(v))
        np.testing.assert_array_equal(layer.key_bytes[0], want_k)
        np.testing.assert_array_equal(layer.value_bytes[0], want_v)


def test_plain_engine_stores_the_models_rows(model, ids):
    cache = TbqCache(model.config, "q4_0", "tbq4_0", engine="plain")
    kv = _run_kv(model, ids, cache)
    for (keys, values), layer in zip(kv, cache.layers, strict=True):
        np.testing.assert_array_equal(layer.key_bytes[0], tbq.quantize(keys.reshape(len(keys), -1), "q4_0"))
        np.testing.assert_array_equal(layer.value_bytes[0], tbq.quantize(values.reshape(len(values), -1), "tbq4_0"))


def test_no_rotation_stores_permuted_unrotated_rows(model, ids):
    cache = TbqCache(model.config, "q8_0", "q8_0", rotate_attention=False)
    kv = _run_kv(model, ids, cache)
    keys, values = kv[0]
    np.testing.assert_array_equal(cache.layers[0].key_bytes[0], _simd_q8_0(_gguf_order(keys).reshape(len(keys), -1)))
    np.testing.assert_array_equal(cache.layers[0].value_bytes[0], _simd_q8_0(values.reshape(len(values), -1)))


def test_generation_appends_rows_token_by_token(model, ids):
    cache = TbqCache(model.config, "q4_0", "q4_0")
    _logits(model, ids[:, :50], cache)
    for t in range(50, 60):
        _logits(model, ids[:, t : t + 1], cache)
    whole = TbqCache(model.config, "q4_0", "q4_0")
    _logits(model, ids[:, :60], whole)
    # rows are per token: writing one at a time stores the same bytes as one prefill
    np.testing.assert_array_equal(cache.layers[0].key_bytes, whole.layers[0].key_bytes)
    assert cache.get_seq_length() == 60


# --------------------------------------------------------------------------- semantics


def test_prefill_attends_to_quantized_rows_but_residual_does_not(model, ids):
    ref = _logits(model, ids)
    f16 = _logits(model, ids, TbqCache(model.config, "f16", "f16"))
    q4 = _logits(model, ids, TbqCache(model.config, "q4_0", "q4_0"))
    assert not torch.equal(q4, f16)
    assert (q4 - f16).abs().max() > 10 * (f16 - ref).abs().max()  # the q4_0 rows, not f16 rounding
    # transformers' QuantizedCache behaviour: the prefill batch is returned in full precision
    res = _logits(model, ids, TbqCache(model.config, "q4_0", "q4_0", engine="plain", residual=16))
    assert torch.equal(res, ref)


def test_residual_quantizes_tokens_that_leave_the_window(model, ids):
    cache = TbqCache(model.config, "q4_0", "q4_0", engine="plain", residual=16)
    _logits(model, ids[:, :40], cache)
    assert cache.layers[0].key_bytes.shape == (1, 24, 2 * 128 // 32 * 18)
    _logits(model, ids[:, 40:41], cache)
    assert cache.layers[0].key_bytes.shape[1] == 25
    with pytest.raises(ConfigError, match="residual"):
        TbqCache(model.config, "q4_0", "q4_0", residual=16)


def test_per_layer_types_land_in_their_layers(model, ids):
    cache = TbqCache(model.config, "q8_0", "q8_0", layers={1: ("q4_0", "tbq3_0"), 2: ("f16", "f32")})
    _logits(model, ids, cache)
    types = [(l.k_type, l.v_type) for l in cache.layers]
    assert types == [("q8_0", "q8_0"), ("q4_0", "tbq3_0"), ("f16", "f32")]
    row = 2 * 128
    widths = [(l.key_bytes.shape[-1], l.value_bytes.shape[-1]) for l in cache.layers]
    assert widths == [(row // 32 * 34, row // 32 * 34), (row // 32 * 18, row // 128 * 50), (row * 2, row * 4)]
    with pytest.raises(ConfigError, match="layer index"):
        TbqCache(model.config, "q8_0", "q8_0", layers={3: ("f16", "f16")})


def test_sinks_are_stored_in_the_sink_type(model, ids):
    cache = TbqCache(model.config, "q4_0", "q4_0", sinks=4)
    _logits(model, ids[:, :10], cache)
    k_sink, v_sink = cache.layers[0].sink_bytes
    assert k_sink.shape == (1, 4, 256 * 2) and cache.layers[0].key_bytes.shape == (1, 6, 144)
    keys = _dynamic_kv(model, ids[:, :10])[0][0]
    rows = _rot(_gguf_order(keys), 128).reshape(10, -1)  # sinks live in the layer's rotated domain
    np.testing.assert_array_equal(k_sink[0], tbq.quantize(rows[:4], "f16"))
    np.testing.assert_array_equal(cache.layers[0].key_bytes[0], tbq.quantize(rows[4:], "q4_0"))
    # a prompt longer than the sinks: the rest goes to the main type; sinks change the logits
    a = _logits(model, ids, TbqCache(model.config, "q4_0", "q4_0"))
    b = _logits(model, ids, TbqCache(model.config, "q4_0", "q4_0", sinks=4))
    assert not torch.equal(a, b)


def test_nbytes_is_bytes_per_token_times_tokens_and_matches_budget(model, ids):
    for k, v in (("q8_0", "q4_0"), ("tbq4_0", "tbq3_0"), ("f16", "f16")):
        cache = TbqCache(model.config, k, v)
        _logits(model, ids, cache)
        assert cache.nbytes == cache.bytes_per_token() * ids.shape[1]
        want = budget.kv_bytes_per_token(3, 2, 128, k) / 2 + budget.kv_bytes_per_token(3, 2, 128, v) / 2
        assert cache.bytes_per_token() == want
    cache = TbqCache(model.config, "q4_0", "q4_0", sinks=8)
    _logits(model, ids, cache)
    assert cache.nbytes == 3 * (8 * 2 * 256 * 2 + (ids.shape[1] - 8) * 2 * 144)


def test_block_rules_are_llama_cpps():
    m64 = _model(head_dim=64, layers=1)
    TbqCache(m64.config, "tbq4_0", "tbq3_0")  # the fork's TBQ blocks need only divide the row (2 x 64)
    with pytest.raises(TbqValueError, match="planar3_0: its 128-value block does not divide head_dim 64"):
        TbqCache(m64.config, "planar3_0", "f16")
    m80 = _model(head_dim=80, kv_heads=1, layers=1)
    with pytest.raises(TbqValueError, match="V cache type q8_0: its 32-value block does not divide head_dim 80"):
        TbqCache(m80.config, "f16", "q8_0")
    with pytest.raises(TbqValueError, match=r"row of 1 x 80 = 80 values"):
        TbqCache(m80.config, "tbq4_0", "f16")
    with pytest.raises(ConfigError, match="unknown cache type"):
        TbqCache(m64.config, "q3_k", "f16")


def test_tbq_block_spans_two_heads_at_head_dim_64():
    m = prepare(_model(head_dim=64, layers=1))
    ids = torch.arange(20)[None]
    cache = TbqCache(m.config, "tbq4_0", "f16")
    kv = _run_kv(m, ids, cache)
    rows = _rot(_gguf_order(kv[0][0]), 64).reshape(20, 128)  # head_dim 64: H_64; one block = both heads
    np.testing.assert_array_equal(cache.layers[0].key_bytes[0], tbq.quantize(rows, "tbq4_0", codebook="turboq-mtp"))


def test_rotation_order_and_hadamard():
    assert [eng._k_rotation_order(d) for d in (64, 128, 192, 256, 320)] == [64, 128, 64, 256, 64]
    np.testing.assert_array_equal(eng.hadamard(16).numpy(), scipy.linalg.hadamard(16) / 4.0)
    # the rotation the cache applies is H_n: against the float64 matrix, within float32 rounding
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32))
    want = (x.double().reshape(8, 2, 128) @ eng.hadamard(128)).reshape(8, 256)
    torch.testing.assert_close(eng.rotate(x, 128).double(), want, rtol=0, atol=1e-5)
    # and bit for bit the spec's NumPy butterfly
    for n in (64, 128, 256):
        np.testing.assert_array_equal(
            eng.rotate(x, n).numpy().view(np.uint32),
            tbq.rotation.fwht(x.numpy().reshape(-1, n)).reshape(8, 256).view(np.uint32),
        )


def test_the_fused_transform_is_the_separate_steps_bit_for_bit():
    rng = np.random.default_rng(4)
    x = torch.from_numpy((rng.standard_normal((3, 5, 2, 128)) * 4).astype(np.float32))
    perm = eng.gguf_permutation(128)
    stepwise = eng.rotate(x[..., torch.from_numpy(perm)], 128)
    np.testing.assert_array_equal(
        eng.transform(x, perm, 128, False).numpy().view(np.uint32), stepwise.numpy().view(np.uint32)
    )
    np.testing.assert_array_equal(
        eng.transform(x, perm, 128, False, q8_0=True).numpy(), eng.q8_0_simd(stepwise).numpy()
    )
    back = eng.rotate(stepwise, 128)[..., torch.from_numpy(np.argsort(perm))]
    np.testing.assert_array_equal(eng.transform(stepwise, perm, 128, True).numpy(), back.numpy())
    np.testing.assert_array_equal(eng.transform(x, None, 64, True).numpy(), eng.rotate(x, 64).numpy())


@pytest.mark.parametrize(("d", "n"), [(128, 128), (128, 64), (192, 64), (256, 256), (512, 128), (64, 64)])
def test_every_channel_order_and_direction_is_the_written_out_butterfly_bit_for_bit(d, n):
    """transform's kernels (registers for n = 64/128/256, llama.cpp's order folded into the loads and stores, any
    other order gathered) against _rot and the orders written out again, with q8_0 against _simd_q8_0."""
    rng = np.random.default_rng(d + n)
    x = (rng.standard_normal((3, 11, 2, d)) * rng.choice([1e-30, 1e-3, 1.0, 1e4], (3, 11, 2, 1))).astype(np.float32)
    x[0, 0, 0, :5] = [np.inf, -np.inf, -0.0, 0.0, 6.5e4]
    x[0, 1, 1] = 0.0  # a zero head: every q8_0 block's amax is 0
    t = torch.from_numpy(x)
    shuffled = rng.permutation(d)
    for perm, ordered in ((None, x), (eng.gguf_permutation(d), _gguf_order(x)), (shuffled, x[..., shuffled])):
        with np.errstate(invalid="ignore"):  # inf - inf in the butterfly: NaN, the same NaN either way
            want = _rot(ordered, n)
        got = eng.transform(t, perm, n, False).numpy()
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        back = eng.transform(torch.from_numpy(want), perm, n, True).numpy()
        order = np.arange(d) if perm is None else np.argsort(perm)
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(back.view(np.uint32), _rot(want, n)[..., order].view(np.uint32))
        finite = np.isfinite(want).all(-1)  # q8_0 of rows without inf/NaN (a NaN code has no int8)
        q8 = eng.transform(t, perm, n, False, q8_0=True).numpy()[finite]
        b = _simd_q8_0(want[finite]).reshape(-1, d // 32, 34)
        scale = b[..., :2].copy().view(np.float16).astype(np.float32)
        codes = b[..., 2:].view(np.int8).astype(np.float32)
        np.testing.assert_array_equal(q8, (codes * scale).reshape(q8.shape))


def test_q8_0_amax_skips_a_nan_as_the_scalar_compare_does():
    x = np.random.default_rng(8).standard_normal((4, 64)).astype(np.float32)
    x[0, [3, 31]] = np.nan  # the amax of a block is the largest other |x|; a NaN's code is NaN
    x[2, 40] = x[3, 63] = np.nan  # the first and the last value of a vector lane (the kernel's fold order)
    x[1, :32] = np.nan  # amax 0: every code 0, and NaN * 0 is NaN
    got = eng.q8_0_simd(torch.from_numpy(x)).numpy()
    clean = np.where(np.isnan(x), np.float32(0), x)
    want = eng.q8_0_simd(torch.from_numpy(clean)).numpy()
    assert np.isnan(got[1, :32]).all() and np.isnan(got).sum() == 36
    keep = ~np.isnan(x)
    np.testing.assert_array_equal(got[keep], want[keep])


def test_q8_0_simd_rounds_ties_to_even_with_the_fp16_scale():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    x[0] = np.float32(127.0) / 127 * np.arange(-16, 16) + np.float32(0.5)  # codes k + 0.5: exact ties
    x[0, 0] = 127.0  # amax 127: 127/amax = 1, codes = x exactly
    x[1] = 0.0
    got = eng.q8_0_simd(torch.from_numpy(x)).numpy()
    amax = np.abs(x).max(1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, 0).astype(np.float32)
    want = np.rint(x * inv) * d  # np.rint: half to even
    np.testing.assert_array_equal(got, want)
    assert got[0, 1] == np.float32(-14.0)  # -14.5 -> -14 (even), not -15
    # the cache's q8_0 bytes: the same rule, Q8_0's layout (tbq.dequantize reads them); _ref rounds the tie away
    b = eng.q8_0_simd_encode(x)
    np.testing.assert_array_equal(b, _simd_q8_0(x))
    np.testing.assert_array_equal(tbq.dequantize(b, "q8_0"), got)
    assert not np.array_equal(b[0], tbq.quantize(x[0], "q8_0")) and np.array_equal(b[2:], tbq.quantize(x[2:], "q8_0"))


# --------------------------------------------------------------------------- the fork's defects


def test_fork_tbq_k_cache_at_head_dim_128_gives_uniform_attention():
    m = prepare(_model(layers=1))
    ids = torch.from_numpy(np.random.default_rng(2).integers(0, 97, (1, 24)))
    fork = TbqCache(m.config, "tbq4_0", "f32", engine="llama.cpp-fork")
    captured = {}
    attn = m.model.layers[0].self_attn
    hook = attn.register_forward_hook(lambda mod, a, out: captured.update(out=out[0]) and None)
    try:
        _logits(m, ids, fork)
    finally:
        hook.remove()
    # every score 0: each query's output is the mean of the values it may see
    v = _dynamic_kv(m, ids)[0][1]  # (tokens, kv heads, d)
    groups = m.config.num_attention_heads // m.config.num_key_value_heads
    means = np.cumsum(v, 0) / np.arange(1, 25)[:, None, None]
    heads = np.repeat(means, groups, axis=1).reshape(24, -1)
    want = torch.from_numpy(heads.astype(np.float32)) @ attn.o_proj.weight.T.detach()
    torch.testing.assert_close(captured["out"][0], want, rtol=1e-5, atol=1e-5)


def test_fork_zero_scores_are_absent_at_head_dim_64():
    """At head_dim 64 one TBQ block holds two heads; llama-perplexity's scores there are the correct engine's."""
    m = prepare(_model(head_dim=64, layers=1))
    ids = torch.arange(30)[None] % 97
    a = _logits(m, ids, TbqCache(m.config, "tbq4_0", "f16", engine="llama.cpp-fork"))
    b = _logits(m, ids, TbqCache(m.config, "tbq4_0", "f16"))
    assert torch.equal(a, b)
    assert not TbqCache(m.config, "tbq4_0", "f16", engine="llama.cpp-fork").layers[0].engine.zero_scores


def test_fork_defect_is_absent_at_head_dim_256():
    m = prepare(_model(head_dim=256, heads=2, kv_heads=1, layers=1))
    ids = torch.arange(30)[None] % 97
    a = _logits(m, ids, TbqCache(m.config, "tbq4_0", "f16", engine="llama.cpp-fork"))
    b = _logits(m, ids, TbqCache(m.config, "tbq4_0", "f16"))
    assert torch.equal(a, b)


def test_fork_tbq3_rows_are_packed_by_the_buggy_packer(model, ids):
    a, b = TbqCache(model.config, "f16", "tbq3_0", engine="llama.cpp-fork"), TbqCache(model.config, "f16", "tbq3_0")
    _logits(model, ids, a)
    _logits(model, ids, b)
    good = b.layers[0].value_bytes.reshape(-1, 50)
    bad = a.layers[0].value_bytes.reshape(-1, 50)
    np.testing.assert_array_equal(bad[:, :2], good[:, :2])  # the norm is right
    np.testing.assert_array_equal(bad[:, 2:], tbq.packing.pack3_fork_bug(tbq.packing.unpack3(good[:, 2:])))


def test_pack3_fork_bug_reproduces_the_forks_bytes():
    from helpers import load_npz

    d = load_npz("tbq3_buggy_vs_fixed__strict")
    q = d["q_fixed"].copy()
    q[:, 2:] = tbq.packing.pack3_fork_bug(tbq.packing.unpack3(q[:, 2:]))
    np.testing.assert_array_equal(q, d["q_buggy"])


# --------------------------------------------------------------------------- evaluate and capture


def test_perplexity_chunks_are_llama_perplexitys():
    c = perplexity_chunks(np.arange(2000), 512, bos=7)
    assert c.shape == (3, 512) and (c[:, 0] == 7).all() and c[1, 1] == 513
    with pytest.raises(TbqValueError, match="at least 2 x context = 1024"):
        perplexity_chunks(np.arange(1000), 512)
    with pytest.raises(TbqValueError, match="holds 3 chunks"):
        perplexity_chunks(np.arange(2000), 512, chunks=4)


def test_parse_cache_type():
    assert parse_cache_type("q8_0").label == "q8_0:q8_0"
    assert parse_cache_type("tbq4_0:tbq3_0@fork").engine == "llama.cpp-fork"
    for bad in ("", "a:b:c", "q8_0@sglang", ":q4_0"):
        with pytest.raises(ConfigError):
            parse_cache_type(bad)


def test_evaluate_against_a_direct_computation(model):
    tokens = np.random.default_rng(5).integers(0, 97, 300)
    res = evaluate(model, tokens, ["q4_0", "q8_0:tbq3_0"], context=128, generate=6, model_name="random")
    chunks = perplexity_chunks(tokens, 128, bos=1)
    nll, kl, top = [], [], []
    for c in chunks:
        ids = torch.from_numpy(c)[None]
        base = torch.log_softmax(_logits(model, ids, TbqCache(model.config, "f16", "f16"))[0].double(), -1)[64:-1]
        lp = torch.log_softmax(_logits(model, ids, TbqCache(model.config, "q4_0", "q4_0"))[0].double(), -1)[64:-1]
        nll.append(-lp[torch.arange(63), torch.from_numpy(c[65:])].numpy())
        kl.append((base.exp() * (base - lp)).sum(-1).numpy())
        top.append((base.argmax(-1) == lp.argmax(-1)).numpy())
    row = res.row("q4_0:q4_0")
    assert row.ppl == pytest.approx(math.exp(np.concatenate(nll).mean()), rel=1e-12)
    assert row.kl_mean == pytest.approx(np.concatenate(kl).mean(), rel=1e-9)
    assert row.kl_p99 == pytest.approx(np.percentile(np.concatenate(kl), 99), rel=1e-9)
    assert row.top1 == pytest.approx(np.concatenate(top).mean())
    assert res.settings["scored"] == 2 * 63
    assert res.row("f16:f16").kl_mean == 0.0 and res.row("f16:f16").delta_ppl_pct == 0.0
    assert len(res.table().splitlines()[1]) <= 100
    assert res.settings["greedy_f16"] is not None and len(res.settings["greedy_f16"]) == 6


def test_evaluate_per_layer_and_roles(model):
    tokens = np.random.default_rng(6).integers(0, 97, 256)
    res = evaluate(model, tokens, ["q4_0"], context=128, per_layer=True, roles=True)
    kinds = sorted((-1 if r.layer is None else r.layer, r.role) for r in res.per_layer)
    assert kinds == [(-1, "K"), (-1, "V"), (0, "K+V"), (1, "K+V"), (2, "K+V")]
    # one layer quantized: that layer's bytes only
    assert res.row("q4_0:q4_0", layer=1).bytes_per_token == 2 * (512 + 512) + (144 + 144)
    assert res.row("q4_0:q4_0", role="K").bytes_per_token == 3 * (144 + 512)


def test_capture_kv_is_the_models_k_and_v(model, ids, tmp_path):
    kv = capture_kv(model, ids[0].numpy(), layers=[0, 2], bos=False)
    want = _dynamic_kv(model, ids)
    assert sorted(kv) == [0, 2]
    for idx in (0, 2):
        np.testing.assert_array_equal(kv[idx]["k"], want[idx][0])
        np.testing.assert_array_equal(kv[idx]["v"], want[idx][1])
    path = save_kv(tmp_path / "kv.npz", kv)
    back = load_kv(path)
    np.testing.assert_array_equal(back[2]["v"], kv[2]["v"])
    with pytest.raises(TbqValueError, match="layer index"):
        capture_kv(model, ids[0].numpy(), layers=[5])


@pytest.mark.parametrize("types", [("q4_0", "q8_0"), ("q8_0", "f16"), ("f16", "tbq4_0")])
def test_model_domain_false_skips_the_inverse_transform_and_keeps_the_logits(types):
    """``model_domain=False`` (what tbq eval builds) returns a rotated side as stored and leaves the logits'
    bits unchanged: the tbq attention reads the stored domain either way."""
    m = prepare(_model(layers=2))
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        a = m(ids, **cache_kwargs(m, TbqCache(m.config, *types))).logits
        cache = TbqCache(m.config, *types, model_domain=False)
        b = m(ids, **cache_kwargs(m, cache)).logits
    np.testing.assert_array_equal(a.numpy().view(np.uint32), b.numpy().view(np.uint32))
    layer = cache.layers[0]
    assert (layer.stored_k, layer.stored_v) == (types[0] != "f16", types[1] != "f16")
    k = torch.randn(1, 2, 5, 128)
    got_k, got_v = layer.update(k, k.clone())
    stored_k = layer._k.read().reshape(1, -1, 2, 128).transpose(1, 2)
    model_k = layer.keys
    assert torch.equal(got_k, stored_k if layer.stored_k else model_k)
    if layer.stored_k:  # a rotated K's stored rows are not the model's K
        assert not torch.equal(got_k, model_k)
    from tbq.hf import attention

    attention.clear()
