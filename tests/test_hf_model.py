"""The shipped model (src/tbq/data/model): files, checkpoint, GGUF, tokenizer, training determinism, llama.cpp.

docs/model.md describes the model; tbq.hf.train made it and tbq.hf.gguf_export
wrote its GGUF. The llama.cpp tests need /work/shared/llama.cpp (the binaries
next to this checkout) and skip, saying so, without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, TokenType
from helpers import unless_sigill

from tbq.hf import gguf_export, shipped, train
from tbq.hf.loader import load

LLAMA_CPP = Path(__file__).resolve().parents[1].parent / "shared" / "llama.cpp"
needs_llama_cpp = pytest.mark.skipif(
    not (LLAMA_CPP / "bin" / "llama-perplexity").is_file() or not (LLAMA_CPP / "bin" / "dump_logits").is_file(),
    reason=f"llama.cpp's llama-perplexity and dump_logits are not at {LLAMA_CPP}/bin",
)
MB = 1_000_000


@pytest.fixture(scope="module")
def config():
    return json.loads((shipped.MODEL_DIR / "config.json").read_text())


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(2)
    return load(tokenizer=False)[0]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shipped.MODEL_DIR))


@pytest.fixture(scope="module")
def heldout_ids(tokenizer):
    return tokenizer(shipped.heldout_text())["input_ids"]


@pytest.fixture(scope="module")
def reader():
    return GGUFReader(str(shipped.gguf_path()))


def _field(reader, key):
    return reader.fields[key].contents()


# ------------------------------------------------------------------------------------------ files


def test_the_shipped_files_exist_and_stay_under_20_mb():
    sizes = {name: (shipped.MODEL_DIR / name).stat().st_size for name in shipped.FILES}
    assert sorted(p.name for p in shipped.MODEL_DIR.iterdir() if p.is_file()) == sorted(shipped.FILES)
    assert sum(sizes.values()) < 20 * MB, sizes


def test_importing_shipped_imports_no_torch():
    code = (
        "import sys, tbq.hf; before = set(sys.modules); import tbq.hf.shipped as s; "
        "new = set(sys.modules) - before; "
        "assert not any(m.split('.')[0] in ('torch', 'transformers', 'tokenizers') for m in new), sorted(new); "
        "assert s.gguf_path().is_file() and s.heldout_text()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------ checkpoint


def test_the_checkpoint_has_the_geometry_every_format_needs(model, config):
    c = model.config
    assert c.model_type == "llama" and type(model).__name__ == "LlamaForCausalLM"
    assert c.head_dim == 128  # TBQ's 128-value blocks and every 32/64-value format fit a head
    assert c.num_key_value_heads == 2 < c.num_attention_heads  # GQA: one cache row is 256 values
    assert c.max_position_embeddings >= 1024 and c.hidden_act == "silu"
    assert c.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == shipped.train_log()["parameters"]
    assert config["dtype"] == "float32"


def test_the_training_log_records_the_corpus_and_the_held_out_loss():
    log = shipped.train_log()
    assert log["corpus"]["python"] == "3.11.7" and len(log["corpus"]["sha256"]) == 64
    assert "textwrap.py" in log["corpus"]["heldout_files"]
    assert not set(log["corpus"]["heldout_files"]) & set(log["corpus"]["train_files"])
    assert len(log["train_loss"]) >= 10 and log["train_loss"][-1]["step"] == log["config"]["steps"]
    assert log["heldout"]["loss"] < log["train_loss"][0]["loss_mean"]


def test_the_held_out_text_is_the_standard_library_files_on_this_interpreter():
    log = shipped.train_log()
    if train.platform.python_version() != log["corpus"]["python"]:
        pytest.skip(
            f"the corpus is CPython {log['corpus']['python']}'s standard library, this is {train.platform.python_version()}"
        )
    stdlib = train.stdlib_dir()
    names = train.corpus_files(stdlib)
    assert train.corpus_sha256(stdlib, names) == log["corpus"]["sha256"]
    assert shipped.heldout_text() == "".join(train.read_file(stdlib, n) for n in train.HELDOUT_FILES)


# ------------------------------------------------------------------------------------------ tokenizer


def test_the_tokenizer_round_trips_the_held_out_text(tokenizer, heldout_ids):
    text = shipped.heldout_text()
    assert heldout_ids[0] == tokenizer.bos_token_id == 0 and tokenizer.eos_token_id == 1
    assert tokenizer.convert_ids_to_tokens([0, 1]) == ["<|bos|>", "<|eos|>"]
    assert 0 not in heldout_ids[1:] and 1 not in heldout_ids
    assert tokenizer.decode(heldout_ids, skip_special_tokens=True) == text
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == heldout_ids[1:]
    assert len(heldout_ids) >= 8 * 512


# ------------------------------------------------------------------------------------------ GGUF


def test_the_gguf_loads_through_transformers_to_the_same_logits(model, heldout_ids):
    from transformers import AutoModelForCausalLM

    g = AutoModelForCausalLM.from_pretrained(str(shipped.MODEL_DIR), gguf_file="model.gguf", dtype=torch.float32).eval()
    assert g.config.tie_word_embeddings and g.lm_head.weight is g.model.embed_tokens.weight
    a, b = model.state_dict(), g.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.tensor([heldout_ids[512:1024]])
    x[0, 0] = 0
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, g(input_ids=x).logits)


def test_the_gguf_tokenizer_through_transformers_tokenizes_the_same(tokenizer, heldout_ids):
    from transformers import AutoTokenizer

    g = AutoTokenizer.from_pretrained(str(shipped.MODEL_DIR), gguf_file="model.gguf")
    assert g(shipped.heldout_text())["input_ids"] == heldout_ids
    assert g(TRICKY)["input_ids"] == tokenizer(TRICKY)["input_ids"]


def test_the_gguf_has_the_llama_converters_metadata(reader, config, tokenizer):
    f = lambda k: _field(reader, k)  # noqa: E731
    assert f("general.architecture") == "llama" and f("general.file_type") == 0  # ALL_F32
    expect = {
        "llama.block_count": config["num_hidden_layers"],
        "llama.context_length": config["max_position_embeddings"],
        "llama.embedding_length": config["hidden_size"],
        "llama.feed_forward_length": config["intermediate_size"],
        "llama.attention.head_count": config["num_attention_heads"],
        "llama.attention.head_count_kv": config["num_key_value_heads"],
        "llama.attention.key_length": 128,
        "llama.attention.value_length": 128,
        "llama.rope.dimension_count": 128,
        "llama.vocab_size": config["vocab_size"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
    }
    assert {k: f(k) for k in expect} == expect
    assert f("llama.rope.freq_base") == config["rope_parameters"]["rope_theta"]
    assert f("llama.attention.layer_norm_rms_epsilon") == np.float32(config["rms_norm_eps"])
    assert f("tokenizer.ggml.model") == "gpt2" and f("tokenizer.ggml.pre") == "gpt-2"
    assert f("tokenizer.ggml.add_bos_token") is True
    tokens = f("tokenizer.ggml.tokens")
    vocab = tokenizer.get_vocab()
    assert len(tokens) == config["vocab_size"] and all(vocab[t] == i for i, t in enumerate(tokens))
    types = f("tokenizer.ggml.token_type")
    assert types[:2] == [TokenType.CONTROL] * 2 and set(types[2:]) == {TokenType.NORMAL}
    merges = json.loads((shipped.MODEL_DIR / "tokenizer.json").read_text())["model"]["merges"]
    assert f("tokenizer.ggml.merges") == [" ".join(m) if isinstance(m, list) else m for m in merges]


def test_the_gguf_tensors_are_the_checkpoints_with_q_and_k_permuted(reader, model, config):
    n_layer, n_head, n_kv = config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]
    hf = {k: v.numpy() for k, v in model.state_dict().items()}
    expect = {"token_embd.weight": hf["model.embed_tokens.weight"], "output_norm.weight": hf["model.norm.weight"]}
    for i in range(n_layer):
        p = f"model.layers.{i}."
        expect |= {
            f"blk.{i}.attn_norm.weight": hf[p + "input_layernorm.weight"],
            f"blk.{i}.attn_q.weight": gguf_export.permute_qk(hf[p + "self_attn.q_proj.weight"], n_head),
            f"blk.{i}.attn_k.weight": gguf_export.permute_qk(hf[p + "self_attn.k_proj.weight"], n_kv),
            f"blk.{i}.attn_v.weight": hf[p + "self_attn.v_proj.weight"],
            f"blk.{i}.attn_output.weight": hf[p + "self_attn.o_proj.weight"],
            f"blk.{i}.ffn_norm.weight": hf[p + "post_attention_layernorm.weight"],
            f"blk.{i}.ffn_gate.weight": hf[p + "mlp.gate_proj.weight"],
            f"blk.{i}.ffn_up.weight": hf[p + "mlp.up_proj.weight"],
            f"blk.{i}.ffn_down.weight": hf[p + "mlp.down_proj.weight"],
        }
    got = {t.name: t for t in reader.tensors}
    assert sorted(got) == sorted(expect)  # tied: no output.weight
    for name, want in expect.items():
        assert got[name].tensor_type == GGMLQuantizationType.F32, name
        assert np.array_equal(np.asarray(got[name].data), want), name
    q = hf["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(got["blk.0.attn_q.weight"].data, q)  # the permutation is not the identity
    assert np.array_equal(gguf_export.unpermute_qk(gguf_export.permute_qk(q, n_head), n_head), q)


def test_the_permutation_turns_rotate_half_into_adjacent_pairs():
    """RoPE on halves (transformers) of W x equals RoPE on adjacent pairs (llama.cpp) of permute(W) x, permuted."""
    rng = np.random.default_rng(0)
    n_head, d, n_in = 2, 8, 5
    w = rng.standard_normal((n_head * d, n_in))
    x = rng.standard_normal(n_in)
    theta = 0.7 ** np.arange(d // 2)
    c, s = np.cos(3 * theta), np.sin(3 * theta)
    hf = (w @ x).reshape(n_head, d)
    a, b = hf[:, : d // 2], hf[:, d // 2 :]
    hf_rot = np.concatenate([a * c - b * s, b * c + a * s], axis=1)  # rotate_half
    cpp = (gguf_export.permute_qk(w, n_head) @ x).reshape(n_head, d // 2, 2)
    cpp_rot = np.stack([cpp[..., 0] * c - cpp[..., 1] * s, cpp[..., 1] * c + cpp[..., 0] * s], axis=-1)
    assert np.allclose(gguf_export.permute_qk(hf_rot.reshape(-1, 1), n_head).ravel(), cpp_rot.ravel())


def test_the_shipped_gguf_is_the_export_of_the_shipped_checkpoint(tmp_path):
    out = gguf_export.export_gguf(shipped.MODEL_DIR, tmp_path / "model.gguf", name=train.MODEL_NAME)
    assert out.read_bytes() == shipped.gguf_path().read_bytes()


# ------------------------------------------------------------------------------------------ training


TINY = [
    "--steps",
    "3",
    "--hidden-size",
    "32",
    "--num-layers",
    "1",
    "--num-heads",
    "2",
    "--num-kv-heads",
    "1",
    "--head-dim",
    "16",
    "--intermediate-size",
    "64",
    "--vocab-size",
    "300",
    "--seq-len",
    "64",
    "--batch-size",
    "2",
    "--max-files",
    "3",
    "--log-every",
    "1",
    "--warmup",
    "1",
    "--eval-max-chunks",
    "2",
    "--threads",
    "1",
]


def test_training_is_deterministic(tmp_path):
    """Two processes (each its own hash seed), one thread each, run side by side: byte-identical results."""
    outs = [tmp_path / "a", tmp_path / "b"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tbq.hf.train", "--out", str(out), *TINY],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for out in outs
    ]
    for proc in procs:
        output = proc.communicate(timeout=300)[0]
        assert proc.returncode == 0, output.decode(errors="replace")
    for name in ("model.safetensors", "tokenizer.json", "model.gguf", "heldout.txt", "config.json"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    logs = [json.loads((o / "train_log.json").read_text()) for o in outs]
    assert [r["loss"] for r in logs[0]["train_loss"]] == [r["loss"] for r in logs[1]["train_loss"]]
    assert logs[0]["heldout"] == logs[1]["heldout"]


# ------------------------------------------------------------------------------------------ llama.cpp


@pytest.fixture(scope="module")
def llama_cpp(tmp_path_factory):
    return unless_sigill(
        gguf_export.compare_with_llama_cpp,
        shipped.MODEL_DIR,
        LLAMA_CPP,
        n_ctx=512,
        n_chunks=4,
        work_dir=tmp_path_factory.mktemp("llama"),
    )


@needs_llama_cpp
def test_llama_cpp_tokenizes_like_the_hf_tokenizer(llama_cpp):
    assert llama_cpp["tokens_equal"], llama_cpp["token_mismatches"]


#: What the GPT-2 regex splits in less obvious ways: whitespace runs before text and at the end, tabs, CR,
#: contractions in both cases, digit runs, punctuation runs, and letters/symbols outside ASCII (Latin-1
#: letters as in shlex.py, Cyrillic, CJK, Khmer combining marks, an emoji ZWJ sequence with a variation selector).
TRICKY = (
    "\n \n\n \n\t\t x\r\n  \n   y    \n I'm you'RE he'll We'Ve it'S 's 'd 3 33 333 4444 3.14 1e-5 "
    "a...b !!!??? ------===== \"\"\"''''``` ßàáâãäåæçèéêëìíîïðñòóôõöøùúûüýþÿ нещо на Български "
    "我想在apple工作1314151天～ កាន់តែពិសេសអាច 🚀 😶\u200d🌫️ ✅ 🦙🦙 tail   "
)


@needs_llama_cpp
def test_llama_cpp_tokenizes_awkward_text_like_the_hf_tokenizer(tokenizer, tmp_path):
    text = TRICKY * 8
    path = tmp_path / "tricky.txt"
    path.write_bytes(text.encode("utf-8"))
    ids = tokenizer(text)["input_ids"]
    n_ctx = 64
    n_chunks = len(ids) // n_ctx
    assert n_chunks >= 4
    tokens, _ = unless_sigill(
        gguf_export.run_dump_logits, LLAMA_CPP, shipped.gguf_path(), path, tmp_path / "out.bin", n_ctx, n_chunks
    )
    expected = np.array(ids[: n_chunks * n_ctx]).reshape(n_chunks, n_ctx)
    expected[:, 0] = tokenizer.bos_token_id
    assert np.array_equal(tokens, expected)


@needs_llama_cpp
def test_llama_perplexity_matches_the_python_float32_computation(llama_cpp):
    assert abs(llama_cpp["python_ppl_f32"] - llama_cpp["llama_perplexity"]) <= 1e-3 * llama_cpp["llama_perplexity"]
    # its full-precision logits agree closer still, closest with K/V rounded to f16 like llama.cpp's cache
    assert llama_cpp["rel_diff_f32_vs_dump"] < 1e-5 and llama_cpp["rel_diff_f16_kv_vs_dump"] < 1e-5
    assert llama_cpp["logits_max_abs_diff_f16_kv"] <= llama_cpp["logits_max_abs_diff"] < 1e-2
