"""``tbq eval`` on the command line: a random-weight model directory and GGUF made here, and the shipped model."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tbq.cli import main
from tbq.hf.shipped import MODEL_DIR

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _save(path, head_dim=128, kv_heads=2, heads=4, vocab=1024):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=128,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        num_hidden_layers=2,
        intermediate_size=96,
        vocab_size=vocab,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    for f in TOKENIZER_FILES:
        shutil.copy(MODEL_DIR / f, path / f)
    return path


@pytest.fixture(scope="module")
def rand_dir(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("rand") / "model")


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    p = tmp_path_factory.mktemp("text") / "text.txt"
    p.write_text((MODEL_DIR / "heldout.txt").read_text()[:12000])
    return p


def _run(capsys, *argv):
    code = main(["eval", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_eval_json_rows_and_capture(rand_dir, text, tmp_path, capsys):
    cap = tmp_path / "kv.npz"
    code, out, err = _run(
        capsys,
        rand_dir,
        "--text",
        text,
        "--context",
        256,
        "--chunks",
        2,
        "--cache-types",
        "q8_0,q4_0:tbq3_0,tbq4_0@fork",
        "--generate",
        4,
        "--json",
        "--capture",
        cap,
    )
    assert code == 0, err
    res = json.loads(out)
    assert [r["cache"] for r in res["rows"]] == ["f32:f32", "f16:f16", "q8_0:q8_0", "q4_0:tbq3_0", "tbq4_0:tbq4_0@fork"]
    assert res["settings"]["chunks"] == 2 and res["settings"]["scored"] == 2 * 127
    assert res["rows"][2]["bytes_per_token"] == 2 * 2 * (256 // 32 * 34)
    with np.load(cap) as z:
        assert sorted(z.files) == ["layer0_k", "layer0_v", "layer1_k", "layer1_v"]
        assert z["layer0_k"].shape == (256, 2, 128) and z["layer0_k"].dtype == np.float32
    # the captured keys are a tbq compare input
    assert main(["compare", str(cap), "--array", "layer0_k", "--formats", "q8_0", "--json", "--quiet"]) == 0
    capsys.readouterr()


def test_eval_table_fits_100_columns_and_plots(rand_dir, text, tmp_path, capsys):
    png = tmp_path / "eval.png"
    code, out, err = _run(
        capsys,
        rand_dir,
        "--text",
        text,
        "--context",
        256,
        "--chunks",
        2,
        "--cache-types",
        "q4_0",
        "--per-layer",
        "--roles",
        "--generate",
        0,
        "--plot",
        png,
    )
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "q4_0:q4_0 (K)" in out and "q4_0:q4_0 (V)" in out
    assert png.stat().st_size > 10_000


def test_eval_reads_a_gguf_file(rand_dir, text, tmp_path, capsys):
    from tbq.hf.gguf_export import export_gguf

    gguf = export_gguf(rand_dir, tmp_path / "rand.gguf")
    for f in TOKENIZER_FILES:  # transformers reads the tokenizer from the GGUF itself
        assert not (tmp_path / f).exists()
    args = ("--text", text, "--context", 256, "--chunks", 2, "--cache-types", "q4_0", "--generate", 0, "--json")
    code_g, out_g, err = _run(capsys, gguf, *args)
    assert code_g == 0, err
    code_h, out_h, _ = _run(capsys, rand_dir, *args)
    g, h = json.loads(out_g)["rows"], json.loads(out_h)["rows"]
    assert [r["ppl"] for r in g] == [r["ppl"] for r in h]  # the same model, the same tokens, the same figures


def test_eval_option_reaches_the_types_that_take_it(rand_dir, text, capsys):
    args = (rand_dir, "--text", text, "--context", 256, "--chunks", 2, "--generate", 0, "--json")
    runs = {}
    for book in ("turboq-mtp", "lloyd-max"):
        code, out, err = _run(capsys, *args, "--cache-types", "tbq3_0,q8_0", "--option", f"codebook={book}")
        assert code == 0, err
        runs[book] = {r["cache"]: r for r in json.loads(out)["rows"]}
    default = {r["cache"]: r for r in json.loads(_run(capsys, *args, "--cache-types", "tbq3_0,q8_0")[1])["rows"]}
    # a row with options is labelled and recorded with them; a type that takes none is not
    labelled = {book: f"tbq3_0(codebook={book}):tbq3_0(codebook={book})" for book in runs}
    for book, rows in runs.items():
        assert rows[labelled[book]]["options"] == {"K": {"codebook": book}, "V": {"codebook": book}}
        assert rows["q8_0:q8_0"]["options"] == {}
    assert default["tbq3_0:tbq3_0"]["options"] == {}
    # the llama.cpp engine's default is the fork's table; the option replaces it for tbq3_0 only
    assert runs["turboq-mtp"][labelled["turboq-mtp"]]["ppl"] == default["tbq3_0:tbq3_0"]["ppl"]
    assert runs["lloyd-max"][labelled["lloyd-max"]]["ppl"] != default["tbq3_0:tbq3_0"]["ppl"]
    assert runs["lloyd-max"]["q8_0:q8_0"]["ppl"] == default["q8_0:q8_0"]["ppl"]
    # the table shows the whole label, the columns still line up
    code, out, err = _run(capsys, *args[:-1], "--cache-types", "tbq3_0", "--option", "codebook=lloyd-max")
    assert code == 0, err
    lines = out.splitlines()
    row = next(line for line in lines if line.startswith(labelled["lloyd-max"] + " "))
    header = next(line for line in lines if line.startswith("cache K:V"))
    assert len(row) == len(header) and header.index("layer") > len(labelled["lloyd-max"])
    code, out, err = _run(capsys, rand_dir, "--cache-types", "q8_0", "--option", "codebook=lloyd-max")
    assert code == 2 and "the formats that take it: tbq4_0, tbq3_0" in err and err.count("\n") == 1


def test_eval_tokens_file(rand_dir, tmp_path, capsys):
    t = tmp_path / "t.npy"
    np.save(t, np.random.default_rng(0).integers(0, 1024, 600))
    code, out, err = _run(capsys, rand_dir, "--tokens", t, "--context", 256, "--cache-types", "q8_0", "--generate", 0)
    assert code == 0, err
    assert "2 chunks x 256 tokens" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["/no/such/model"], "no such file or directory"),
        (["{rand}", "--cache-types", "q4_0,q3_k"], "unknown cache type 'q3_k'"),
        (["{rand}", "--cache-types", "q4_0,"], "an empty entry"),
        (["{rand}", "--cache-types", "q4_0@sglang"], "unknown engine 'sglang'"),
        (["{rand}", "--text", "{short}"], "needs at least 2 x context = 1024"),
        (["{rand}", "--text", "{text}", "--context", "256", "--chunks", "99"], "not 99"),
        (["{rand}", "--text", "/no/such.txt"], "--text /no/such.txt: no such file"),
        (["{rand}", "--tokens", "{badtok}"], "token ids must be in 0..1023"),
        (["{rand}", "--sink-type", "q9"], "--sink-type 'q9': unknown format"),
        (
            ["{rand80}", "--cache-types", "q8_0", "--text", "{text}", "--context", "256"],
            "its 32-value block does not divide head_dim 80",
        ),
        (["{bert}"], "cannot be loaded as a causal language model"),
        (["{rand}", "--context", "0"], "must be at least 4"),
        (["{rand}", "--plot", "{tmp}"], "is a directory"),
    ],
)
def test_eval_bad_input_is_one_line_and_exit_2(argv, message, rand_dir, text, tmp_path, capsys):
    from transformers import DistilBertConfig, DistilBertModel

    short = tmp_path / "short.txt"
    short.write_text("def f():\n    return 1\n")
    badtok = tmp_path / "bad.npy"
    np.save(badtok, np.arange(2000) + 1000)
    names = {"rand": rand_dir, "text": text, "short": short, "badtok": badtok, "tmp": tmp_path}
    if any("{rand80}" in a for a in argv):
        names["rand80"] = _save(tmp_path / "m80", head_dim=80, kv_heads=1, heads=2)
    if any("{bert}" in a for a in argv):
        DistilBertModel(DistilBertConfig(n_layers=1, dim=32, hidden_dim=32, n_heads=2, vocab_size=50)).save_pretrained(
            tmp_path / "bert"
        )
        names["bert"] = tmp_path / "bert"
    code, out, err = _run(capsys, *[a.format(**names) for a in argv])
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("tbq eval: error:"), err
    assert message in err
    assert out == ""


def test_eval_default_run_in_a_fresh_process():
    """``tbq eval`` with no arguments: the shipped model, held-out text, every format and the mixes."""
    from tbq.cli.eval import default_cache_types

    proc = subprocess.run(
        # the timeout only guards against a hang (no timed assertions: its speed is benchmarks/bench_eval.py's)
        [sys.executable, "-m", "tbq.cli", "eval", "--json"],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    caches = [r["cache"] for r in res["rows"]]
    assert caches == ["f32:f32", "f16:f16"] + default_cache_types()
    rows = {r["cache"]: r for r in res["rows"]}
    # a trained model: f16 is nearly free, q8_0 close to it, 3-bit costs more than q8_0
    assert abs(rows["f16:f16"]["ppl"] / rows["f32:f32"]["ppl"] - 1) < 1e-3
    assert rows["q8_0:q8_0"]["kl_mean"] < rows["tbq3_0:tbq3_0"]["kl_mean"]


def test_eval_refused_type_is_a_row_and_the_others_run(tmp_path, text, capsys):
    m80 = _save(tmp_path / "m80", head_dim=80, kv_heads=1, heads=2)
    args = (m80, "--text", text, "--context", 256, "--chunks", 2, "--generate", 0)
    png = tmp_path / "refused.png"
    code, out, err = _run(capsys, *args, "--cache-types", "f16,q8_0,f32,f16:f16", "--plot", png)
    assert code == 0, err
    assert png.stat().st_size > 10_000  # a refused type has no bars, the figure is still drawn
    lines = out.splitlines()
    assert sum(line.startswith("f16:f16 ") for line in lines) == 1  # the baseline row, once
    refused = next(line for line in lines if line.startswith("q8_0:q8_0 "))
    assert "refused: K cache type q8_0: its 32-value block does not divide head_dim 80" in refused
    code, out, err = _run(capsys, *args, "--cache-types", "q8_0,f16", "--json")
    assert code == 0, err
    rows = {r["cache"]: r for r in json.loads(out)["rows"]}
    assert list(rows) == ["f32:f32", "f16:f16", "q8_0:q8_0"]
    assert rows["q8_0:q8_0"]["ppl"] is None and rows["q8_0:q8_0"]["refused"].startswith("K cache type q8_0")


def test_eval_issue_37s_command_on_the_shipped_model(capsys):
    """Bare turbo types select @turbo, a preset @vllm; a turbo type under another engine and a preset mixed with a
    llama.cpp type are rows saying why; vLLM's boundary layers (all 4 of the shipped model's) are shown."""
    types = "turbo3,turbo4,q8_0:turbo3@turbo,turboquant_4bit_nc@vllm,turbo3@fork,turboquant_3bit_nc:q8_0"
    code, out, err = _run(capsys, "--cache-types", types, "--chunks", 1, "--generate", 0, "--json")
    assert code == 0, err
    rows = {r["cache"]: r for r in json.loads(out)["rows"]}
    assert list(rows)[2:] == [
        "turbo3:turbo3@turbo",
        "turbo4:turbo4@turbo",
        "q8_0:turbo3@turbo",
        "turboquant_4bit_nc@vllm",
        "turbo3:turbo3@fork",
        "turboquant_3bit_nc:q8_0@vllm",
    ]
    assert all(rows[c]["ppl"] > 0 for c in list(rows)[:6])
    assert rows["turbo3:turbo3@turbo"]["ppl"] != rows["f16:f16"]["ppl"]
    assert rows["turbo3:turbo3@turbo"]["bytes_per_token"] == 4 * 2 * 2 * 50  # 4 layers, K and V, 2 heads, 50 B
    assert "unquantized" in rows["turboquant_4bit_nc@vllm"]["changes"][0]
    assert rows["turboquant_4bit_nc@vllm"]["ppl"] == rows["f32:f32"]["ppl"]  # every layer is a boundary layer
    assert "@turbo" in rows["turbo3:turbo3@fork"]["refused"]
    assert "names both K and V" in rows["turboquant_3bit_nc:q8_0@vllm"]["refused"]
    code, out, err = _run(capsys, "--cache-types", "turbo3", "--engine", "vllm", "--chunks", 1, "--generate", 0)
    assert code == 2 and "every cache type was refused" in err and "not a vLLM TurboQuant preset" in err


@pytest.mark.parametrize("arch", ["gemma2", "qwen3_next"])
def test_eval_runs_soft_capping_and_hybrid_models(arch, tmp_path, text, capsys):
    from tbq.hf.arch_compare import tiny_checkpoint

    d = tiny_checkpoint(arch, tmp_path / arch)  # 2 KV heads of 128 values, gemma2's window 64
    code, out, err = _run(
        capsys, d, "--text", text, "--context", 256, "--chunks", 2, "--cache-types", "q4_0", "--generate", 2, "--json"
    )
    from transformers import cache_utils

    if arch == "qwen3_next" and not hasattr(cache_utils, "DYNAMIC_LAYER_TYPE_MAPPING"):  # transformers 5.0
        assert code == 2 and err.count("\n") == 1 and "upgrade transformers for hybrid models" in err, err
        return
    assert code == 0, err
    res = json.loads(out)
    rows = {r["cache"]: r for r in res["rows"]}
    assert rows["f32:f32"]["kl_f32_mean"] == 0.0 and rows["q4_0:q4_0"]["kl_mean"] > 0
    row = 2 * (256 // 32 * 18)  # q4_0 K and V rows of 2 x 128 values
    if arch == "gemma2":  # layer 0 slides over 64 tokens, layer 1 is full
        assert rows["q4_0:q4_0"]["bytes_per_token"] == row and rows["q4_0:q4_0"]["window_bytes"] == row * 63
    else:  # one attention layer after three linear-attention layers (no rows)
        assert rows["q4_0:q4_0"]["bytes_per_token"] == row and res["settings"]["attention_layers"] == [3]
    stats = rows["q4_0:q4_0"]["llama_cpp"]
    assert stats["Mean PPL(Q)"][0] == pytest.approx(rows["q4_0:q4_0"]["ppl"], rel=1e-12)
    assert {"Mean KLD", "99.9% KLD", "Median KLD", "Minimum KLD", "RMS Δp", "Same top p"} <= set(stats)


def test_eval_prompts_and_context_sweep(rand_dir, text, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "import os\\n"}\n{"prompt": "{\\"a\\": "}\n')
    args = (rand_dir, "--text", text, "--context", 256, "--chunks", 2, "--cache-types", "f16,q4_0,tbq3_0")
    code, out, err = _run(capsys, *args, "--generate", 6, "--prompts", prompts, "--contexts", "64,128", "--json")
    assert code == 0, err
    res = json.loads(out)
    gen = res["generation"]
    assert gen["prompts"] == 3 and gen["generate"] == 6
    assert [r["cache"] for r in gen["rows"]] == ["q4_0:q4_0", "tbq3_0:tbq3_0"]  # f16 is the reference
    for r in gen["rows"]:
        assert len(r["first_diff"]) == 3
        assert r["exact_match"] == sum(d is None for d in r["first_diff"]) / 3
        assert all(d is None or 0 <= d < 6 for d in r["first_diff"])
        assert 0 <= r["json_kept"] <= r["json_f16"] <= 3
    assert [s["context"] for s in res["contexts"]] == [64, 128]
    for s in res["contexts"]:
        assert [r["cache"] for r in s["rows"]] == ["f32:f32", "f16:f16", "q4_0:q4_0", "tbq3_0:tbq3_0"]
        assert s["rows"][2]["kl_mean"] > 0
    # the same as text: two more tables under the main one
    code, out, err = _run(capsys, *args, "--generate", 6, "--prompts", prompts, "--contexts", "64")
    assert code == 0, err
    assert "greedy generation from 3 prompts, 6 tokens each, against f16:" in out
    assert "context sweep against f16" in out
    assert max(len(line) for line in out.splitlines()) <= 100


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--contexts", "64,abc"], "--contexts '64,abc': 'abc' is not an integer"),
        (["--contexts", "63"], "must be an even integer of at least 4, got 63"),
        (["--contexts", "2048"], "--contexts: 2048 is beyond the model's limit of 1024 positions"),
        (["--prompts", "/no/such/file"], "--prompts /no/such/file: no such file"),
    ],
)
def test_eval_prompts_and_contexts_errors_are_one_line(argv, message, rand_dir, text, capsys):
    code, out, err = _run(capsys, rand_dir, "--text", text, "--cache-types", "q4_0", *argv)
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_eval_kld_prints_llama_perplexitys_layout(rand_dir, text, capsys):
    code, out, err = _run(
        capsys,
        rand_dir,
        "--text",
        text,
        "--context",
        256,
        "--chunks",
        2,
        "--cache-types",
        "q4_0",
        "--generate",
        0,
        "--kld",
    )
    assert code == 0, err
    block = out[out.index("q4_0:q4_0 against the f16 cache:") :].splitlines()[1:]
    # llama-perplexity's lines, in its order and with its labels (tools/perplexity/perplexity.cpp)
    labels = [line.split(":")[0] for line in block if ":" in line]
    assert labels == [
        "Mean PPL(Q)                   ",
        "Mean PPL(base)                ",
        "Cor(ln(PPL(Q)), ln(PPL(base)))",
        "Mean ln(PPL(Q)/PPL(base))     ",
        "Mean PPL(Q)/PPL(base)         ",
        "Mean PPL(Q)-PPL(base)         ",
        "Mean    KLD", "Maximum KLD", "99.9%   KLD", "99.0%   KLD", "95.0%   KLD", "90.0%   KLD", "Median  KLD",
        "10.0%   KLD", " 5.0%   KLD", " 1.0%   KLD", " 0.1%   KLD", "Minimum KLD",
        "Mean    Δp", "Maximum Δp", "99.9%   Δp", "99.0%   Δp", "95.0%   Δp", "90.0%   Δp", "75.0%   Δp",
        "Median  Δp", "25.0%   Δp", "10.0%   Δp", " 5.0%   Δp", " 1.0%   Δp", " 0.1%   Δp", "Minimum Δp",
        "RMS Δp    ", "Same top p",
    ]  # fmt: skip
    ppl = next(line for line in block if line.startswith("Mean PPL(Q) "))
    row = next(line for line in out.splitlines() if line.startswith("q4_0:q4_0 "))
    assert ppl.split(":")[1].split("±")[0].strip()[:7] == row.split()[3][:7]  # the table's PPL, more digits
