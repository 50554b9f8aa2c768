"""The ``"llama.cpp-turbo"`` engine (the community fork's turbo2/3/4) and the vLLM engines (vLLM's TurboQuant presets).

What each engine does to K, V and Q is held against an independent statement of it: the fork's
``GGML_OP_TURBO_WHT`` written out here (signs, butterfly, ``1/sqrtf(128)``), its llama-kv-cache.cpp rules
(``TURBO_AUTO_ASYMMETRIC``, ``TURBO_LAYER_ADAPTIVE`` mode 7, the zero padding), vLLM's slots
(:mod:`tbq.vllm_slots`) and boundary layers. The agreement with the fork's own llama-perplexity is in
tests/test_hf_llama_cpp.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import tbq
import tbq.hf
from tbq.errors import TbqError
from tbq.hf.cache import TbqCache, cache_kwargs
from tbq.hf.engine import gguf_permutation, make_engine, turbo_layer_types, vllm_skipped_layers
from tbq.hf.evaluation import evaluate, parse_cache_type
from tbq.rotation import turboq_mtp_signs
from tbq.vllm_slots import decode_slots, encode_slots, preset


def _model(head_dim=128, layers=2, heads=4, kv_heads=2, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=16 * heads,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        num_hidden_layers=layers,
        intermediate_size=96,
        vocab_size=256,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(cfg).eval()


def _logits(model, ids, cache=None):
    with torch.no_grad():
        if cache is None:
            return model(ids).logits
        return model(ids, **cache_kwargs(model, cache)).logits


def _fork_wht(x: np.ndarray, inverse: bool = False) -> np.ndarray:
    """ggml_compute_forward_turbo_wht_f32 at group 128, float32: x * s_first, the butterfly, * (1/sqrtf(128)) * s_second."""
    s1, s2 = (s.astype(np.float32) for s in turboq_mtp_signs())
    first, second = (s2, s1) if inverse else (s1, s2)
    inv = np.float32(1.0) / np.sqrt(np.float32(128))
    w = (x.reshape(-1, 128) * first).astype(np.float32)
    h = 1
    while h < 128:
        for i in range(0, 128, 2 * h):
            a = w[:, i : i + h].copy()
            b = w[:, i + h : i + 2 * h].copy()
            w[:, i : i + h] = a + b
            w[:, i + h : i + 2 * h] = a - b
        h *= 2
    return ((w * inv) * second).astype(np.float32).reshape(x.shape)


# ---------------------------------------------------------------------------
# the turbo engine: Q, K and V transforms
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim", [128, 64])
def test_turbo_q_rotation_is_the_forks_wht_and_the_codecs_r_bit_for_bit(head_dim):
    eng = make_engine("llama.cpp-turbo", "turbo3", "turbo3", head_dim=head_dim, kv_heads=2, permute=False)
    q = torch.randn(1, 4, 7, head_dim) * 3
    got = eng.query(q).numpy()
    assert got.shape == (1, 4, 7, 128)  # padded to 128 before the rotation
    padded = np.zeros((1, 4, 7, 128), np.float32)
    padded[..., :head_dim] = q.numpy()
    assert np.array_equal(got.view(np.uint32), _fork_wht(padded).view(np.uint32))
    r = tbq.get_format("turbo3").domain.to_decode_domain(padded)
    assert np.array_equal(got.view(np.uint32), np.asarray(r, np.float32).view(np.uint32))
    assert not eng.q_to_q8_0  # vec_dot_turbo*_f32: Q stays float32


def test_turbo_output_is_the_forks_inverse_wht_cropped():
    eng = make_engine("llama.cpp-turbo", "q8_0", "turbo4", head_dim=64, kv_heads=2, permute=False)
    out = torch.randn(1, 5, 4, 128)
    got = eng.output(out).numpy()
    assert got.shape == (1, 5, 4, 64)
    assert np.array_equal(got.view(np.uint32), _fork_wht(out.numpy(), inverse=True)[..., :64].view(np.uint32))


def test_turbo_heads_zero_padded_to_128_at_head_dim_64():
    model = _model(head_dim=64)
    cache = TbqCache(model.config, "turbo3", "turbo4", engine="llama.cpp-turbo")
    _logits(model, torch.randint(0, 256, (1, 9)), cache)
    layer = cache.layers[0]
    assert layer.key_bytes.shape == (1, 9, 2 * 50)  # two KV heads, one 128-value turbo3 block each
    assert layer.value_bytes.shape == (1, 9, 2 * 68)
    assert cache.bytes_per_token() == 2 * (100 + 136)
    x = torch.randn(1, 3, 2, 64)
    stored = layer.engine.k.to_stored(x)
    assert stored.shape == (1, 3, 2, 128) and bool((stored[..., 64:] == 0).all())
    assert torch.equal(stored[..., :64], x[..., gguf_permutation(64)])  # llama: K in the GGUF channel order


def test_turbo_engine_has_no_attention_rotation_and_reads_vec_dot_type():
    turbo = make_engine("llama.cpp-turbo", "q8_0", "q4_0", head_dim=128, kv_heads=2, permute=False)
    assert turbo.k.rotation is None and turbo.v.rotation is None  # the fork: upstream's rotation off
    assert turbo.q_to_q8_0  # q8_0's vec_dot_type: Q as q8_0
    upstream = make_engine("llama.cpp", "q8_0", "q4_0", head_dim=128, kv_heads=2, permute=False)
    assert upstream.k.rotation == 128 and upstream.v.rotation == 64
    for name, q8 in (("q4_1", True), ("nvfp4", True), ("f16", False), ("tbq4_0", False)):
        assert make_engine("llama.cpp", name, "f16", head_dim=256, kv_heads=1, permute=False).q_to_q8_0 is q8, name


def test_turbo_types_need_the_turbo_engine():
    for engine in ("llama.cpp", "llama.cpp-fork"):
        with pytest.raises(TbqError, match=r"turbo3@turbo"):
            make_engine(engine, "turbo3", "f16", head_dim=128, kv_heads=2, permute=False)


@pytest.mark.parametrize(
    ("n_head", "n_head_kv", "fires"), [(12, 2, True), (11, 2, False), (6, 1, True), (5, 1, False), (28, 4, True)]
)
def test_auto_asymmetric_fires_exactly_at_gqa_ratio_6(n_head, n_head_kv, fires):
    k, v, notes = turbo_layer_types("turbo3", "turbo3", layer=0, n_layers=4, n_head=n_head, n_head_kv=n_head_kv)
    assert (k == "q8_0") is fires and v == "turbo3" and bool(notes) is fires
    # not for different K and V types, nor when turned off (TURBO_AUTO_ASYMMETRIC=0)
    assert turbo_layer_types("turbo3", "turbo4", layer=0, n_layers=4, n_head=n_head, n_head_kv=n_head_kv)[0] == "turbo3"
    off = turbo_layer_types(
        "turbo3", "turbo3", layer=0, n_layers=4, n_head=n_head, n_head_kv=n_head_kv, auto_asymmetric=False
    )
    assert off == ("turbo3", "turbo3", [])


def test_auto_asymmetric_in_the_cache_and_its_note():
    model = _model(heads=12, kv_heads=2, head_dim=64)
    cache = TbqCache(model.config, "turbo3", "turbo3", engine="llama.cpp-turbo")
    assert [layer.k_type for layer in cache.layers] == ["q8_0", "q8_0"]
    assert [layer.v_type for layer in cache.layers] == ["turbo3", "turbo3"]
    assert any("TURBO_AUTO_ASYMMETRIC" in c for c in cache.type_changes)
    off = TbqCache(model.config, "turbo3", "turbo3", engine="llama.cpp-turbo", turbo_auto_asymmetric=False)
    assert [layer.k_type for layer in off.layers] == ["turbo3", "turbo3"] and off.type_changes == []


def test_layer_adaptive_mode_7_for_a_turbo2_v():
    def v_types(n_layers, v="turbo2", **kw):
        return [
            turbo_layer_types("turbo3", v, layer=i, n_layers=n_layers, n_head=4, n_head_kv=2, **kw)[1]
            for i in range(n_layers)
        ]

    assert v_types(8) == ["q8_0", "q8_0", "turbo2", "turbo2", "turbo2", "turbo2", "q8_0", "q8_0"]
    assert v_types(7) == ["turbo2"] * 7  # fewer than 8 layers: not enabled
    assert v_types(8, v="turbo3") == ["turbo3"] * 8  # enabled by itself for turbo2 V only
    assert v_types(8, layer_adaptive=False) == ["turbo2"] * 8  # TURBO_LAYER_ADAPTIVE=0


def test_turbo_cache_attention_equals_the_models_attention_on_the_decoded_kv():
    """The stored-domain path (Q padded and rotated, V's output rotated back) against the model's own attention
    on the K/V the cache returns (R^-1 of the decoded rows, cropped): R is orthonormal, so they agree to float32."""
    ids = torch.randint(0, 256, (1, 24))
    for head_dim in (128, 64):
        model = _model(head_dim=head_dim)
        ref = _logits(model, ids, TbqCache(model.config, "turbo3", "turbo4", engine="llama.cpp-turbo"))
        tbq.hf.prepare(model)
        cache = TbqCache(model.config, "turbo3", "turbo4", engine="llama.cpp-turbo")
        got = _logits(model, ids, cache)
        assert float((got - ref).abs().max()) < 2e-4, head_dim
        f32 = _logits(model, ids, TbqCache(model.config, "f32", "f32", engine="llama.cpp-turbo"))
        assert torch.equal(f32, _logits(model, ids))  # f32 is the model's own, bit for bit
        assert float((got - f32).abs().max()) > 1e-3  # a turbo cache changes the logits


# ---------------------------------------------------------------------------
# the vLLM engines
# ---------------------------------------------------------------------------


def test_vllm_boundary_layers():
    assert vllm_skipped_layers(6, False) == [0, 1, 4, 5]
    assert vllm_skipped_layers(2, False) == [0, 1]
    assert vllm_skipped_layers(1, False) == []
    assert vllm_skipped_layers(40, True) == []  # hybrid: none
    model = _model(layers=6)
    cache = TbqCache(model.config, "turboquant_4bit_nc", "turboquant_4bit_nc", engine="vllm")
    assert [layer.k_type for layer in cache.layers] == ["f32", "f32"] + ["turboquant_4bit_nc"] * 2 + ["f32", "f32"]
    assert cache.type_changes and "layers 0, 1, 4, 5" in cache.type_changes[0]
    every = TbqCache(model.config, "turboquant_4bit_nc", "turboquant_4bit_nc", engine="vllm", vllm_skip_layers=False)
    assert {layer.k_type for layer in every.layers} == {"turboquant_4bit_nc"} and every.type_changes == []


@pytest.mark.parametrize("name", ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"])
def test_vllm_rows_are_the_slots_and_read_back_as_the_full_dequant(name):
    model = _model(layers=2)
    cache = TbqCache(model.config, name, name, engine="vllm", vllm_skip_layers=False)
    layer = cache.layers[0]
    k = torch.randn(1, 2, 5, 128) * 2
    v = torch.randn(1, 2, 5, 128)
    k_read, v_read = layer.update(k, v)
    slots = encode_slots(k.transpose(1, 2).numpy(), v.transpose(1, 2).numpy(), name)  # (1, 5, 2, S_al)
    kp, vp = preset(name).key_bytes(128), preset(name).value_bytes(128)
    assert np.array_equal(layer.key_bytes.reshape(1, 5, 2, kp), slots[..., :kp])
    assert np.array_equal(layer.value_bytes.reshape(1, 5, 2, vp), slots[..., kp : kp + vp])
    yk, yv = decode_slots(slots, name, head_dim=128)
    assert np.array_equal(k_read.transpose(1, 2).numpy(), yk)
    assert np.array_equal(v_read.transpose(1, 2).numpy(), yv)


def test_vllm_decode_regime_changes_the_logits_and_prefill_regime_reads_raw_kv_first():
    model = _model(layers=6)
    tbq.hf.prepare(model)
    ids = torch.randint(0, 256, (1, 30))
    own = _logits(model, ids)
    name = "turboquant_3bit_nc"
    decode = _logits(model, ids, TbqCache(model.config, name, name, engine="vllm"))
    assert float((decode - own).abs().max()) > 1e-3  # every position reads the quantized cache (layers 2, 3)
    cache = TbqCache(model.config, name, name, engine="vllm-prefill")
    assert torch.equal(_logits(model, ids, cache), own)  # a first prefill reads its own raw K/V
    nxt = torch.tensor([[5]])
    step = _logits(model, nxt, cache)[0, -1]  # a decode step reads the stored slots
    assert float((step - _logits(model, torch.cat([ids, nxt], 1))[0, -1]).abs().max()) > 1e-4
    assert cache.layers[2].stored_tokens == 31
    with pytest.raises(TbqError, match="continuation of 129 tokens"):
        _logits(model, torch.randint(0, 256, (1, 129)), cache)


def test_vllm_refuses_what_vllm_has_not():
    for k, v, msg in (
        ("q8_0", "q8_0", "not a vLLM TurboQuant preset"),
        ("turboquant_4bit_nc", "turboquant_3bit_nc", "names both K and V"),
    ):
        with pytest.raises(TbqError, match=msg):
            make_engine("vllm", k, v, head_dim=128, kv_heads=2, permute=False)
    with pytest.raises(TbqError, match="head_dim must be a power of two"):
        make_engine("vllm", "turboquant_4bit_nc", "turboquant_4bit_nc", head_dim=96, kv_heads=2, permute=False)
    with pytest.raises(TbqError, match="no sink tokens"):
        TbqCache(_model().config, "turboquant_4bit_nc", "turboquant_4bit_nc", engine="vllm", sinks=4)


# ---------------------------------------------------------------------------
# spelling
# ---------------------------------------------------------------------------


def test_a_type_only_one_engine_has_selects_it():
    assert parse_cache_type("turbo3").engine == "llama.cpp-turbo"
    assert parse_cache_type("turbo3").label == "turbo3:turbo3@turbo"
    assert parse_cache_type("q8_0:turbo3").label == "q8_0:turbo3@turbo"
    assert parse_cache_type("turboquant_4bit_nc").label == "turboquant_4bit_nc@vllm"
    assert parse_cache_type("turboquant_k8v4@vllm-prefill").label == "turboquant_k8v4@vllm-prefill"
    assert parse_cache_type("q8_0").engine == "llama.cpp"
    assert parse_cache_type("turbo3@fork").engine == "llama.cpp-fork"  # written: kept, and refused by the engine


def test_evaluate_rows_show_the_changes_and_refusals():
    model = _model(layers=6, heads=12, kv_heads=2, head_dim=64)
    tokens = np.random.default_rng(0).integers(0, 256, 64)
    res = evaluate(model, tokens, ["turbo3", "turboquant_4bit_nc", "turbo3@fork"], context=32, chunks=2)
    row = res.row("turbo3:turbo3@turbo")
    assert row.changes and "TURBO_AUTO_ASYMMETRIC" in row.changes[0]
    assert "^ layers 0, 1, 2, 3, 4, 5: K turbo3 -> q8_0" in res.table()
    assert "layers 0, 1, 4, 5" in res.row("turboquant_4bit_nc@vllm").changes[0]
    assert "turbo3@turbo" in res.row("turbo3:turbo3@fork").refused
    assert row.ppl != res.row("f16:f16").ppl


def test_plain_engine_reads_a_rotated_domain_format_back_in_the_models_domain():
    model = _model(head_dim=128)
    layer = TbqCache(model.config, "turbo4", "turbo4", engine="plain").layers[0]
    k = torch.randn(1, 2, 6, 128)
    k_read, _ = layer.update(k, k)
    err = float(((k_read - k) ** 2).sum() / (k**2).sum())
    assert err < 0.05  # turbo4's error (about 0.02), in the model's domain
    rotated = torch.from_numpy(tbq.get_format("turbo4").domain.to_decode_domain(k.numpy()))
    assert float(((k_read - rotated) ** 2).sum() / (k**2).sum()) > 0.5  # not the rotated values
