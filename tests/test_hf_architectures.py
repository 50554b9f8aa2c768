"""tbq.hf on the architectures people run: sinks, soft-capping, sliding windows, hybrid layers, head_dim 80.

Every model is a tiny random-weight one built here (``tbq.hf.arch_compare.tiny_model``, ``from_config``: no
download). The oracle is the model's own computation: transformers'
``DynamicCache`` with the model's declared attention (sdpa, or its eager
where it declares ``_supports_sdpa = False``: gemma2's soft-capping, gpt-oss's
learned sinks). An f32 TbqCache under the tbq attention must give the same
logits bit for bit, in one prefill and token by token.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers as tf
from transformers import DynamicCache, cache_utils

from tbq.errors import ConfigError, TbqValueError
from tbq.hf import TbqCache, prepare
from tbq.hf import attention as attn
from tbq.hf.arch_compare import tiny_model
from tbq.hf.cache import TbqLayer, cache_kwargs, geometry
from tbq.hf.evaluation import evaluate, kld_statistics

WINDOW = 8  # shorter than the 24-token inputs: the sliding layers drop tokens


def _model(arch, seed=0):
    if arch == "qwen3_5" and not hasattr(tf, "Qwen3_5ForCausalLM"):
        pytest.skip(f"transformers {tf.__version__} has no qwen3_5")
    if arch.startswith("qwen3_") and not hasattr(cache_utils, "DYNAMIC_LAYER_TYPE_MAPPING"):
        pytest.skip(f"transformers {tf.__version__} has no cache layers for hybrids (refused: see below)")
    """A tiny random model: 4 heads over 2 KV heads of 64 values, vocabulary 97 (gemma3: one sliding layer, one full)."""
    return tiny_model(
        arch, hidden_size=64, head_dim=64, layers=2, window=WINDOW, vocab_size=97, bos=1, eos=2, softcap=1.0, seed=seed
    )


ARCHS = ["llama", "qwen3", "phi3", "gemma2", "gemma3", "gpt_oss", "qwen3_next", "qwen3_5", "llama_head_dim_80"]


def _logits(model, ids, cache=None, **kw):
    with torch.no_grad():
        return model(ids, use_cache=True, **kw, **cache_kwargs(model, cache)).logits


def _ids(n=24, batch=1, seed=1):
    return torch.from_numpy(np.random.default_rng(seed).integers(2, 97, (batch, n)))


def _quantized(model):
    return "q4_0" if geometry(model.config)[2] % 32 == 0 else "f16"


@pytest.fixture(scope="module", params=ARCHS)
def arch(request):
    """(name, the model's own logits (prefill, then 12 + 12 steps), the prepared model)."""
    m = _model(request.param)
    if m.config._attn_implementation == "sdpa" and getattr(m.config, "attn_logit_softcapping", None):
        m.set_attn_implementation(
            "eager"
        )  # transformers 5.0's sdpa drops gemma2's soft-capping: its eager is the model
    ids = _ids()
    own = _logits(m, ids, DynamicCache(config=m.config))
    cache = DynamicCache(config=m.config)
    steps = [_logits(m, ids[:, :12], cache)] + [_logits(m, ids[:, t : t + 1], cache) for t in range(12, 24)]
    declared = m.config._attn_implementation
    return request.param, own, steps, declared, prepare(m), ids


def test_f32_cache_is_the_models_own_computation_exactly(arch):
    name, own, steps, declared, model, ids = arch
    assert model.config._attn_implementation == attn._name(declared)  # the tbq attention over the model's own
    assert torch.equal(_logits(model, ids, TbqCache(model.config, "f32", "f32")), own), name
    cache = TbqCache(model.config, "f32", "f32")
    got = [_logits(model, ids[:, :12], cache)] + [_logits(model, ids[:, t : t + 1], cache) for t in range(12, 24)]
    for i, (a, b) in enumerate(zip(got, steps, strict=True)):
        assert torch.equal(a, b), (name, i)


def test_a_quantized_cache_changes_the_logits(arch):
    name, own, _, _, model, ids = arch
    t = _quantized(model)
    out = _logits(model, ids, TbqCache(model.config, t, t))
    assert not torch.equal(out, own), name


def test_the_stored_domain_computes_the_models_own_attention(arch):
    """Rotated K and V (tbq4_0; Q rotated, not rounded): the same as the model's function on the decoded K/V.

    The model without the tbq attention reads the same stored rows back in its
    own domain; the two differ only by the rotation's float32 rounding, so
    soft-capping, sinks and windows are applied alike on both paths.
    """
    name, _, _, _, model, ids = arch
    if geometry(model.config)[2] % 64:
        pytest.skip(f"{name}: head_dim {geometry(model.config)[2]} has no attention rotation")
    plain = copy.deepcopy(model)
    plain.set_attn_implementation(attn.base_implementation(model.config._attn_implementation))
    taken = []
    real_take = attn._take

    def counting(module, key, value):
        read = real_take(module, key, value)
        taken.append(read is not None)
        return read

    attn._take = counting
    try:
        a = _logits(model, ids, TbqCache(model.config, "tbq4_0", "tbq4_0"))
    finally:
        attn._take = real_take
    b = _logits(plain, ids, TbqCache(plain.config, "tbq4_0", "tbq4_0"))
    n_attn = sum(isinstance(layer, TbqLayer) for layer in TbqCache(model.config).layers)
    assert taken == [True] * n_attn  # every attention layer read the stored domain
    torch.testing.assert_close(a, b, rtol=0, atol=2e-4)
    assert not torch.equal(a, b)  # Q and K were rotated: not the same float operations


def test_sinks_and_soft_capping_are_what_the_stored_path_applies():
    """gpt-oss's sinks and gemma2's soft-capping change the logits; the tbq attention keeps them (see above)."""
    for arch, param, value in (("gpt_oss", "sinks", 0.0), ("gemma2", None, None)):
        m = prepare(_model(arch))
        ids = _ids()
        with_feature = _logits(m, ids, TbqCache(m.config, "tbq4_0", "tbq4_0"))
        other = copy.deepcopy(m)
        if param:
            with torch.no_grad():
                for name, p in other.named_parameters():
                    if name.endswith(param):
                        p.fill_(value)
        else:
            other.config.attn_logit_softcapping = None
            for layer in other.model.layers:
                layer.self_attn.attn_logit_softcapping = None
        without = _logits(other, ids, TbqCache(other.config, "tbq4_0", "tbq4_0"))
        assert (with_feature - without).abs().max() > 1e-2, arch


def test_sliding_layers_keep_the_window_and_their_bytes_say_so():
    m = prepare(_model("gemma3"))
    ids = _ids()
    cache = TbqCache(m.config, "q8_0", "q4_0")
    _logits(m, ids, cache)
    sliding, full = cache.layers
    assert sliding.window == WINDOW and full.window is None
    assert sliding.stored_tokens == WINDOW - 1 and full.stored_tokens == 24
    row = 2 * 64
    per_token = row // 32 * 34 + row // 32 * 18
    assert cache.bytes_per_token() == per_token  # the full-attention layer only
    assert cache.window_bytes() == per_token * (WINDOW - 1)
    assert cache.nbytes == per_token * 24 + cache.window_bytes()
    assert cache.get_seq_length(0) == 24 == cache.get_seq_length(1)
    # token by token: the window slides, the kept rows are the newest ones written
    step = TbqCache(m.config, "q8_0", "q4_0")
    _logits(m, ids[:, :10], step)
    for t in range(10, 24):
        _logits(m, ids[:, t : t + 1], step)
        assert step.layers[0].stored_tokens == WINDOW - 1
    np.testing.assert_array_equal(step.layers[0].key_bytes, sliding.key_bytes)


@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_5"])
def test_hybrid_model_only_attention_layers_get_tbq_layers(arch):
    m = prepare(_model(arch))
    cache = TbqCache(m.config, "q8_0", "q8_0", layers={3: ("q4_0", "q4_0")})
    kinds = [type(layer).__name__ for layer in cache.layers]
    assert kinds == ["LinearAttentionLayer"] * 3 + ["TbqLayer"]
    assert [(layer.index, layer.k_type) for layer in cache.tbq_layers] == [(3, "q4_0")]
    assert cache.bytes_per_token() == 2 * (2 * 64 // 32 * 18)  # the attention layer's K and V rows only
    _logits(m, _ids(), cache)
    assert cache.nbytes == cache.bytes_per_token() * 24
    with pytest.raises(ConfigError, match=f"layer 0 of {m.config.model_type} is a 'linear_attention' layer"):
        TbqCache(m.config, "q8_0", "q8_0", layers={0: ("f16", "f16")})


def test_hybrid_refused_without_transformers_own_layers(monkeypatch):
    m = _model("qwen3_next")
    monkeypatch.delattr(cache_utils, "DYNAMIC_LAYER_TYPE_MAPPING")  # transformers 5.0 had none
    with pytest.raises(ConfigError, match="qwen3_next: layer 0 is a 'linear_attention' layer and this transformers"):
        TbqCache(m.config, "q8_0", "q8_0")


def test_layer_kinds_tbq_cannot_store_are_refused_naming_the_layer():
    cfg = _model("llama").config
    cfg.layer_types = ["full_attention", "hybrid"]
    with pytest.raises(ConfigError, match="llama: layer 1 is a 'hybrid' layer"):
        TbqCache(cfg, "q8_0", "q8_0")


def test_a_replaced_tensor_is_refused_not_mixed():
    m = prepare(_model("llama"))
    cache = TbqCache(m.config, "q4_0", "q4_0")
    layer = cache.layers[1]
    real = layer.update
    layer.update = lambda k, v, *a, **kw: tuple(t.clone() for t in real(k, v, *a, **kw))
    with pytest.raises(TbqValueError, match="layer 1: the K/V reaching the tbq attention are not the tensors"):
        _logits(m, _ids(), cache)
    # the same cache types without replacement run; an f16 layer posts nothing to check (no transform)
    _logits(m, _ids(), TbqCache(m.config, "q4_0", "q4_0"))


def test_evaluate_refuses_when_the_attention_never_reads_the_stored_domain(monkeypatch):
    """An attention module the tbq attention cannot match to its layer: the engine's Q would go untransformed."""
    m = _model("llama")
    tokens = np.random.default_rng(5).integers(2, 97, 300)
    monkeypatch.setattr(attn, "_take", lambda module, key, value: None)
    with pytest.raises(TbqValueError, match=r"llama: the tbq attention did not read the stored K/V of layer\(s\) 0, 1"):
        evaluate(m, tokens, ["q8_0"], context=128)
    evaluate(m, tokens, ["f16"], context=128)  # f16 transforms nothing and posts nothing: fine


def test_without_the_tbq_attention_the_cache_returns_the_model_domain():
    m = _model("llama")
    ids = _ids()
    own = _logits(m, ids)
    assert torch.equal(_logits(m, ids, TbqCache(m.config, "f32", "f32")), own)
    q = _logits(m, ids, TbqCache(m.config, "q8_0", "q8_0"))
    torch.testing.assert_close(q, own, rtol=0, atol=0.05)  # q8_0 rows read back unrotated, unpermuted
    assert not torch.equal(q, own)


# --------------------------------------------------------------------------- the cache API


def test_generate_greedy_sampling_and_beam_search():
    m = _model("gpt_oss")
    ids = _ids(10)
    for prepared in (False, True):
        model = prepare(copy.deepcopy(m)) if prepared else m
        greedy = model.generate(
            ids, max_new_tokens=12, do_sample=False, **cache_kwargs(model, DynamicCache(config=m.config))
        )
        got = model.generate(
            ids, max_new_tokens=12, do_sample=False, **cache_kwargs(model, TbqCache(model.config, "f32", "f32"))
        )
        assert torch.equal(got, greedy), prepared
        for seed_run in range(2):
            torch.manual_seed(7)
            a = model.generate(
                ids, max_new_tokens=12, do_sample=True, **cache_kwargs(model, DynamicCache(config=m.config))
            )
            torch.manual_seed(7)
            b = model.generate(
                ids, max_new_tokens=12, do_sample=True, **cache_kwargs(model, TbqCache(model.config, "f32", "f32"))
            )
            assert torch.equal(a, b), (prepared, seed_run)
        beams = model.generate(ids, max_new_tokens=12, num_beams=3, do_sample=False)
        got = model.generate(
            ids,
            max_new_tokens=12,
            num_beams=3,
            do_sample=False,
            **cache_kwargs(model, TbqCache(model.config, "f32", "f32")),
        )
        assert torch.equal(got, beams), prepared
        q = model.generate(
            ids,
            max_new_tokens=12,
            num_beams=3,
            do_sample=False,
            **cache_kwargs(model, TbqCache(model.config, "q8_0", "q4_0")),
        )
        assert q.shape == (1, 22)


def test_batch_with_padding_equals_the_models_own():
    m = prepare(_model("gemma3"))
    ids = _ids(20, batch=2)
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # the second row left-padded
    own = _logits(m, ids, DynamicCache(config=m.config), attention_mask=mask)
    got = _logits(m, ids, TbqCache(m.config, "f32", "f32"), attention_mask=mask)
    assert torch.equal(got, own)
    a = m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    b = m.generate(
        ids, attention_mask=mask, max_new_tokens=6, do_sample=False, **cache_kwargs(m, TbqCache(m.config, "f32", "f32"))
    )
    assert torch.equal(a, b)


def test_batch_operations_and_crop_match_transformers_cache():
    m = prepare(_model("llama"))
    ids = _ids(16, batch=3)
    own, ours = DynamicCache(config=m.config), TbqCache(m.config, "f32", "f32")
    _logits(m, ids, own)
    _logits(m, ids, ours)
    for op, arg in (
        ("reorder_cache", torch.tensor([2, 0, 0])),
        ("batch_select_indices", torch.tensor([1, 2])),
        ("batch_repeat_interleave", 2),
        ("crop", -5),
    ):
        getattr(own, op)(arg)
        getattr(ours, op)(arg)
        for a, b in zip(own.layers, ours.layers, strict=True):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), op
        assert own.get_seq_length() == ours.get_seq_length()
    nxt = _ids(3, batch=4, seed=9)
    assert torch.equal(_logits(m, nxt, own), _logits(m, nxt, ours))
    with pytest.raises(TbqValueError, match="negative count"):
        ours.crop(3)


def test_crop_of_a_sliding_layer_past_its_window_is_refused():
    m = prepare(_model("gemma3"))
    cache = TbqCache(m.config, "f32", "f32")
    _logits(m, _ids(6), cache)
    cache.crop(-2)  # within the window: fine
    assert cache.get_seq_length(0) == 4 and cache.layers[0].stored_tokens == 4
    _logits(m, _ids(20), cache)
    with pytest.raises(TbqValueError, match="layer 0: a sliding-window layer that dropped tokens"):
        cache.crop(-1)


def test_offload_and_prefetch_leave_the_cache_working():
    m = prepare(_model("llama"))
    ids = _ids()
    cache = TbqCache(m.config, "q8_0", "q8_0")
    _logits(m, ids[:, :20], cache)
    for layer in cache.layers:
        layer.offload()
        layer.prefetch()
    whole = TbqCache(m.config, "q8_0", "q8_0")
    _logits(m, ids[:, :20], whole)
    assert torch.equal(_logits(m, ids[:, 20:], cache), _logits(m, ids[:, 20:], whole))
    cache.reset()  # empty again: the same as a new cache
    assert cache.get_seq_length() == 0 and cache.nbytes == 0 and cache.layers[0].keys is None
    assert torch.equal(_logits(m, ids, cache), _logits(m, ids, TbqCache(m.config, "q8_0", "q8_0")))


def test_prepare_refuses_what_it_cannot_wrap():
    m = _model("llama")
    m.config._attn_implementation_internal = "flash_attention_2"
    with pytest.raises(ConfigError, match="llama: its attention implementation is 'flash_attention_2'"):
        prepare(m)
    m = _model("gemma2")
    declared = m.config._attn_implementation  # eager (transformers 5.0 declared sdpa for gemma2)
    prepare(m)
    assert prepare(m).config._attn_implementation == attn._name(declared)  # twice: unchanged


# --------------------------------------------------------------------------- llama-perplexity's statistics


def test_kld_statistics_are_llama_perplexitys_definitions():
    rng = np.random.default_rng(0)
    n = 500
    base = rng.gamma(2.0, 1.0, n)
    q = base + rng.normal(0, 0.1, n)
    kld = np.abs(rng.normal(0, 0.01, n))
    top = rng.random(n) < 0.9
    s = kld_statistics(q, base, kld, top)

    def mean_unc(x):  # perplexity.cpp's mean_and_uncertainty, written out again
        return x.mean(), np.sqrt(((x * x).mean() - x.mean() ** 2) / (n - 1))

    lq, lb = mean_unc(q), mean_unc(base)
    cov = ((q * base).mean() - q.mean() * base.mean()) / (n - 1)
    assert s["Mean PPL(Q)"] == pytest.approx([np.exp(lq[0]), np.exp(lq[0]) * lq[1]], rel=1e-12)
    ratio_unc = np.sqrt(lq[1] ** 2 + lb[1] ** 2 - 2 * cov)
    assert s["Mean ln(PPL(Q)/PPL(base))"] == pytest.approx([lq[0] - lb[0], ratio_unc], rel=1e-9)
    assert s["Mean PPL(Q)/PPL(base)"][0] == pytest.approx(np.exp(lq[0] - lb[0]), rel=1e-12)
    assert s["Cor(ln(PPL(Q)), ln(PPL(base)))"] == pytest.approx(100 * np.corrcoef(q, base)[0, 1], rel=1e-6)
    k = np.sort(kld)
    assert s["Mean KLD"] == pytest.approx(list(mean_unc(kld)), rel=1e-9)
    assert s["Maximum KLD"] == k[-1] and s["Minimum KLD"] == k[0]
    assert s["Median KLD"] == pytest.approx((k[249] + k[250]) / 2)
    assert s["99.0% KLD"] == pytest.approx(np.percentile(kld, 99.0), rel=1e-12)  # NumPy's linear = perplexity.cpp's
    assert s["0.1% KLD"] == pytest.approx(np.percentile(kld, 0.1), rel=1e-12)
    dp = np.exp(-q) - np.exp(-base)
    assert s["Mean Δp"][0] == pytest.approx(100 * dp.mean(), rel=1e-9)
    assert s["75.0% Δp"] == pytest.approx(100 * np.percentile(dp, 75), rel=1e-9)
    assert s["RMS Δp"][0] == pytest.approx(100 * np.sqrt((dp * dp).mean()), rel=1e-12)
    p = top.mean()
    assert s["Same top p"] == pytest.approx([100 * p, 100 * np.sqrt(p * (1 - p) / (n - 1))], rel=1e-12)
    names = [key for key in s if key.endswith("KLD")]
    assert names == [
        "Mean KLD", "Maximum KLD", "99.9% KLD", "99.0% KLD", "95.0% KLD", "90.0% KLD", "Median KLD",
        "10.0% KLD", "5.0% KLD", "1.0% KLD", "0.1% KLD", "Minimum KLD",
    ]  # fmt: skip


def test_evaluate_reports_refusals_f16_once_and_the_kld_statistics():
    m = _model("llama_head_dim_80")
    tokens = np.random.default_rng(5).integers(2, 97, 300)
    res = evaluate(m, tokens, ["f16", "q8_0", "f16:f16", "f32"], context=128)
    assert [r.cache for r in res.rows] == ["f32:f32", "f16:f16", "q8_0:q8_0"]
    row = res.row("q8_0:q8_0")
    assert row.refused == "K cache type q8_0: its 32-value block does not divide head_dim 80 (llama.cpp requires it)"
    assert res.to_dict()["rows"][2]["ppl"] is None
    assert "q8_0:q8_0" in res.table() and "refused: K cache type q8_0" in res.table()
    f32 = res.row("f32:f32").llama_cpp
    assert f32["Mean PPL(base)"][0] == pytest.approx(res.row("f16:f16").ppl, rel=1e-12)
    assert f32["Same top p"][0] == pytest.approx(100 * res.row("f32:f32").top1)
    with pytest.raises(ConfigError, match="every cache type was refused: q8_0:q8_0: K cache type q8_0"):
        evaluate(m, tokens, ["q8_0"], context=128)
    with pytest.raises(ConfigError, match="training mode"):
        evaluate(m.train(), tokens, ["f16"], context=128)
    m.eval()
    m3 = _model("gemma3")
    res = evaluate(m3, tokens, ["q4_0"], context=128, per_layer=True)
    assert [r.layer for r in res.per_layer] == [0, 1] and res.settings["attention_layers"] == [0, 1]
    assert res.row("q4_0:q4_0").window_bytes == (128 // 32 * 18) * 2 * (WINDOW - 1)
