"""The main job, ``tbq compare``."""

import numpy as np
import pytest

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


def test_compare_user_file(tmp_path, capsys):
    f = tmp_path / "kv.npy"
    np.save(f, np.random.default_rng(0).standard_normal((4, 256)).astype(np.float64))
    assert cli.main(["compare", str(f), "--formats", "q4_0,tbq4_0", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "q4_0" in out and "tbq4_0" in out and "q8_0" not in out


def test_compare_user_file_bad_last_axis(tmp_path, capsys):
    f = tmp_path / "bad.npy"
    np.save(f, np.zeros((4, 96), np.float32))
    assert cli.main(["compare", str(f)]) == 2
    assert "multiple of 128" in capsys.readouterr().err


def test_compare_unreadable_file(tmp_path, capsys):
    f = tmp_path / "x.npy"
    f.write_text("not numpy")
    assert cli.main(["compare", str(f)]) == 2
    assert "cannot read" in capsys.readouterr().err
