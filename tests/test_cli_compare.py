"""The main job, ``tbq compare``."""

import numpy as np
import pytest

import tbq
from tbq import cli
from tbq.compare import compare
from tbq.synthetic import builtin_kv


def test_compare_builtin_data_prints_every_format(capsys):
    assert cli.main(["compare", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "built-in synthetic KV" in out
    for fmt in ("q8_0", "q4_0", "tbq4_0", "tbq3_0"):
        assert out.count(f" {fmt} ") == 2  # keys and values


def test_compare_numbers_are_the_formats_errors():
    rows = compare(builtin_kv(tokens=16, heads=2), ["q8_0", "tbq3_0"], repeat=1)
    by = {(r["data"], r["format"]): r for r in rows}
    # 8-bit error is far below 3-bit error; Gaussian values at 3 bits sit near Lloyd-Max's 0.0345
    assert by[("values", "q8_0")]["NMSE"] < 1e-4
    assert 0.025 < by[("values", "tbq3_0")]["NMSE"] < 0.045
    assert by[("keys", "tbq3_0")]["bytes"] == 16 * 2 * 50
    assert all(r["enc Mv/s"] > 0 and r["dec Mv/s"] > 0 for r in rows)


@pytest.mark.parametrize("head_dim", [64, 256])
def test_compare_reads_each_format_instances_own_block(head_dim):
    """vLLM's TurboQuant block is one head (``head_dim``, a format option; the registry's row is 128's): compare
    tiles rows with the instance's block, charges its bytes, and its errors are the codec's round trip."""
    kv = builtin_kv(tokens=16, heads=2, head_dim=head_dim)
    rows = compare(kv, ["vllm_tq4_k", "vllm_tq3_v"], repeat=1, head_dim=head_dim)
    by = {(r["data"], r["format"]): r for r in rows}
    for (label, fmt), r in by.items():
        codec = tbq.get_codec(fmt, head_dim=head_dim)
        assert r["bytes"] == 16 * 2 * codec.type_size and r["bits/value"] == codec.type_size * 8 / head_dim
        x = kv[label].astype(np.float64)
        y = codec.decode(codec.encode(kv[label])).astype(np.float64)
        assert r["NMSE"] == pytest.approx(float(np.sum((y - x) ** 2) / np.sum(x * x)), rel=1e-9)
        assert r["out NMSE"] is not None  # keys and values are each other's exact partner
    # without the option the default instance's 128-value block cannot tile a head of 64 (named: refused)
    if head_dim == 64:
        with pytest.raises(tbq.BlockShapeError, match="vllm_tq4_k \\(blocks of 128 must divide head_dim 64\\)"):
            compare(kv, ["vllm_tq4_k"], repeat=1)


def test_compare_user_file(tmp_path, capsys):
    f = tmp_path / "kv.npy"
    np.save(f, np.random.default_rng(0).standard_normal((4, 256)).astype(np.float64))
    assert cli.main(["compare", str(f), "--formats", "q4_0,tbq4_0", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "q4_0" in out and "tbq4_0" in out and "q8_0" not in out


def test_the_command_line_tiles_rows_with_each_formats_own_options(tmp_path, capsys):
    # --option head_dim=64 makes vLLM's block one head of 64: the command's own tiling check reads it
    f = tmp_path / "k64.npy"
    np.save(f, np.random.default_rng(0).standard_normal((16, 2, 64)).astype(np.float32))
    assert cli.main(["compare", str(f), "--formats", "vllm_tq4_k", "--option", "head_dim=64", "--repeat", "1"]) == 0
    assert "vllm_tq4_k  4.25" in capsys.readouterr().out  # 34 bytes per 64 values
    assert cli.main(["compare", str(f), "--formats", "vllm_tq4_k", "--repeat", "1"]) == 2  # the default, 128
    assert "vllm_tq4_k (blocks of 128 must divide head_dim 64)" in capsys.readouterr().err


def test_compare_user_file_whose_rows_a_named_format_cannot_tile(tmp_path, capsys):
    f = tmp_path / "bad.npy"
    np.save(f, np.zeros((4, 96), np.float32))  # 2-D: one head of 96 per token
    assert cli.main(["compare", str(f), "--formats", "q8_0,tbq4_0"]) == 2
    err = capsys.readouterr().err
    assert "tbq4_0 (blocks of 128 must divide the row of 1 x 96 = 96 values)" in err and "q8_0" not in err


@pytest.mark.parametrize("shape", [(32, 8, 64), (32, 4, 96), (32, 2, 256), (32, 1, 64)])
def test_compare_any_head_dim_tiles_rows_as_llama_cpp(tmp_path, capsys, shape):
    """head_dim 64 (Llama 3.2 1B), 96, 256 (Gemma): blocks along kv_heads x head_dim; TBQ's only need the row."""
    import json

    from tbq.formats import FORMATS, cache_formats

    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    f = tmp_path / "kv.npy"
    np.save(f, x)
    assert cli.main(["compare", str(f), "--repeat", "1", "--queries", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    _, heads, hd = shape
    got = [r["format"] for r in d["rows"]]
    # the default list is the cache types (the operand formats q8_1, q8_k are none)
    cache = list(cache_formats())
    want = [n for n in cache if (heads * hd if FORMATS[n].row_tiled else hd) % FORMATS[n].block_size == 0]
    assert got == want and d["input"]["head_dim"] == hd and d["input"]["heads"] == heads
    assert set(d["input"].get("skipped", [])) == set(cache) - set(want)
    if heads * hd % 128 == 0 and hd == 64:
        assert "tbq4_0" in got  # at head_dim 64 a TBQ block holds two heads
    # the bytes are those of the rows, encoded as one row of kv_heads x head_dim per token
    for fmt in got[:3]:
        assert np.array_equal(
            tbq.quantize(x.reshape(32, -1), fmt).reshape(32, -1), tbq.quantize(x.reshape(32, -1), fmt)
        )
    text_rc = cli.main(["compare", str(f), "--repeat", "1", "--queries", "2"])
    out = capsys.readouterr().out
    assert text_rc == 0 and f"x head_dim {hd}" in out and "blocks along the row" in out
    assert all(len(line) <= 100 for line in out.splitlines()), max(out.splitlines(), key=len)


def test_compare_unreadable_file(tmp_path, capsys):
    f = tmp_path / "x.npy"
    f.write_text("not numpy")
    assert cli.main(["compare", str(f)]) == 2
    assert "cannot read" in capsys.readouterr().err


# --------------------------------------------------------------------------- what the output says


def _small(tmp_path, name="kv.npy", shape=(16, 2, 128), seed=0):
    f = tmp_path / name
    np.save(f, np.random.default_rng(seed).standard_normal(shape).astype(np.float32))
    return f


def test_default_table_fits_100_columns_and_wide_has_every_column(capsys):
    assert cli.main(["compare", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "top-8" in out and "--wide" in out  # the legend says where the other columns are
    assert cli.main(["compare", "--repeat", "1", "--wide", "--formats", "q8_0"]) == 0
    wide = capsys.readouterr().out
    assert "max abs err" in wide and "mean cos" in wide and "bytes" in wide


def test_user_file_says_it_is_read_as_keys_and_why_out_nmse_is_missing(tmp_path, capsys):
    f = _small(tmp_path)
    assert cli.main(["compare", str(f), "--formats", "q8_0", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "read as keys (--role)" in " ".join(" ".join(out.splitlines()[:2]).split())
    assert "16 tokens (axis 0) x 2 KV heads x head_dim 128" in " ".join(out.split())
    assert "shows - for a single file" in out
    assert cli.main(["compare", str(f), "--formats", "q8_0", "--repeat", "1", "--role", "values"]) == 0
    out = capsys.readouterr().out
    assert "read as values" in " ".join(out.split()) and "\nvalues  q8_0" in out


def test_topk_defaults_to_the_tokens_when_fewer_than_8(tmp_path, capsys):
    f = _small(tmp_path, shape=(4, 128))
    assert cli.main(["compare", str(f), "--formats", "q8_0", "--repeat", "1"]) == 0
    assert "top-4" in capsys.readouterr().out


def test_npz_with_one_array_or_a_chosen_one(tmp_path, capsys):
    rng = np.random.default_rng(1)
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    np.savez(one, k=rng.standard_normal((8, 128)).astype(np.float32))
    np.savez(two, k=rng.standard_normal((8, 128)).astype(np.float32), v=rng.standard_normal((8, 256)))
    # the heading wraps at the terminal width wherever the path's length puts it: compare without white space
    assert cli.main(["compare", str(one), "--formats", "q4_0", "--repeat", "1"]) == 0
    assert _squeezed(f"{one}[k]: shape (8, 128)") in _squeezed(capsys.readouterr().out)
    assert cli.main(["compare", str(two), "--array", "v", "--formats", "q4_0", "--repeat", "1"]) == 0
    assert _squeezed(f"{two}[v]: shape (8, 256)") in _squeezed(capsys.readouterr().out)


def _squeezed(text: str) -> str:
    return "".join(text.split())


def test_json_is_the_only_thing_on_stdout(tmp_path, capsys):
    import json

    f = _small(tmp_path)
    argv = ["compare", str(f), "--formats", "q8_0,tbq3_0", "--repeat", "1", "--json", "--queries", "4"]
    assert cli.main(argv) == 0
    cap = capsys.readouterr()
    d = json.loads(cap.out)
    assert cap.err == ""  # not a terminal: no progress either
    assert d["input"]["role"] == "keys" and d["input"]["shape"] == [16, 2, 128]
    assert d["settings"]["queries"] == 4 and d["settings"]["topk"] == 8
    assert [r["format"] for r in d["rows"]] == ["q8_0", "tbq3_0"]
    r = d["rows"][0]
    assert r["bits_per_value"] == 8.5 and 0 < r["nmse"] < 1e-3 and r["output_nmse"] is None


def test_on_overflow_inf_is_passed_to_the_codecs(tmp_path, capsys):
    x = np.random.default_rng(0).standard_normal((8, 128)).astype(np.float32)
    x[0, 0] = 1e30
    f = tmp_path / "big.npy"
    np.save(f, x)
    assert cli.main(["compare", str(f), "--formats", "q8_0", "--repeat", "1"]) == 2
    assert "Pass --on-overflow inf" in capsys.readouterr().err
    assert cli.main(["compare", str(f), "--formats", "q8_0", "--repeat", "1", "--on-overflow", "inf", "--json"]) == 0
    cap = capsys.readouterr()
    import json

    assert json.loads(cap.out)["rows"][0]["nmse"] is None  # not finite: null in strict JSON
    assert "Warning" not in cap.err


def test_progress_on_a_terminal_and_quiet(tmp_path, capsys, monkeypatch):
    import tbq.progress

    f = _small(tmp_path)
    argv = ["compare", str(f), "--formats", "q8_0,q4_0", "--repeat", "1"]
    monkeypatch.setattr(tbq.progress, "stderr_is_terminal", lambda stream=None: True)
    assert cli.main(argv) == 0
    assert "tbq compare: 2/2 keys q4_0" in capsys.readouterr().err
    assert cli.main(argv + ["--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_help_shows_the_defaults(capsys):
    assert cli.main(["compare", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "timed runs per throughput figure (the best counts) (default: 3)" in out
    assert "(default: raise)" in out and "(default: 16)" in out and "(default: 0)" in out
