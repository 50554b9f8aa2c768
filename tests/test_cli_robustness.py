"""Every sub-command fed malformed arguments and files: one line on stderr, exit status 2, no traceback.

The cases run in-process through ``tbq.cli.main(argv)`` (fast); a few run in a
subprocess, to prove that no traceback reaches a real terminal either. Every
error must come before any work: the cases use the default sizes and would
take seconds if they computed anything first.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tbq.golden  # noqa: F401 (sys.modules['tbq.golden.generate'])
from tbq import cli


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A directory of bad (and a few good) inputs; ``{d}`` in a case's argv is this directory."""
    d = tmp_path_factory.mktemp("robust")
    rng = np.random.default_rng(0)
    np.save(d / "empty.npy", np.zeros((0, 8, 128), np.float32))
    np.save(d / "zerowidth.npy", np.zeros((4, 0), np.float32))
    np.save(d / "small.npy", rng.standard_normal((4, 128)).astype(np.float32))
    np.save(d / "ints.npy", np.zeros((4, 128), np.int32))
    np.save(d / "scalar.npy", np.float32(1.0))
    np.save(d / "width96.npy", np.zeros((4, 96), np.float32))
    huge = rng.standard_normal((4, 128)).astype(np.float32)
    huge[0, 0] = 1e30
    np.save(d / "huge.npy", huge)
    nan = rng.standard_normal((4, 128)).astype(np.float32)
    nan[1, 3] = np.nan
    np.save(d / "nan.npy", nan)
    np.savez(d / "two.npz", keys=np.zeros((4, 128), np.float32), values=np.zeros((4, 128), np.float32))
    np.savez(d / "none.npz")
    (d / "corrupt.npz").write_bytes(b"PK\x03\x04 not really a zip file")
    (d / "text.npy").write_text("not numpy\n")
    full = (d / "small.npy").read_bytes()
    (d / "truncated.npy").write_bytes(full[: len(full) // 2])
    (d / "afile").write_text("a regular file\n")
    (d / "adir").mkdir()
    (d / "bad.json").write_text("{not json")
    return d


# (argv with {d} for the files directory, text the one-line message must contain)
CASES = [
    # --- tbq compare: files
    (["compare", "{d}/empty.npy"], "no values"),
    (["compare", "{d}/zerowidth.npy"], "no values"),
    (["compare", "{d}/two.npz"], "pick one with --array"),
    (["compare", "{d}/two.npz", "--array", "nope"], "no such array; it holds keys, values"),
    (["compare", "{d}/none.npz"], "no arrays"),
    (["compare", "{d}/corrupt.npz"], "cannot read"),
    (["compare", "{d}/text.npy"], "cannot read"),
    (["compare", "{d}/truncated.npy"], "cannot read"),
    (["compare", "{d}/missing.npy"], "No such file or directory"),
    (["compare", "{d}/adir"], "cannot read"),
    (["compare", "{d}/ints.npy"], "float16, float32 or float64"),
    (["compare", "{d}/scalar.npy"], "got a scalar"),
    (
        ["compare", "{d}/width96.npy", "--formats", "tbq4_0"],
        "tbq4_0 (blocks of 128 must divide the row of 1 x 96 = 96 values)",
    ),
    (["compare", "{d}/width96.npy", "--formats", "Q8_0,nvfp4"], "nvfp4 (blocks of 64 must divide head_dim 96)"),
    (["compare", "{d}/huge.npy", "--repeat", "1"], "--on-overflow inf"),
    (["compare", "{d}/nan.npy", "--repeat", "1"], "non-finite"),
    (["compare", "{d}/small.npy", "--array", "keys"], "--array is for .npz files"),
    (["compare", "--role", "keys"], "--role describes FILE"),
    # --- tbq compare: numbers and names
    (["compare", "--repeat", "0"], "--repeat: must be at least 1"),
    (["compare", "--repeat", "x"], "--repeat: expected an integer"),
    (["compare", "--queries", "0"], "--queries: must be at least 1"),
    (["compare", "--topk", "0"], "--topk: must be at least 1"),
    (["compare", "--topk", "100000"], "--topk 100000 is more than the 512 tokens"),
    (["compare", "{d}/small.npy", "--topk", "5"], "--topk 5 is more than the 4 tokens"),
    (["compare", "--seed", "-1"], "--seed: must be at least 0"),
    (["compare", "--formats", "q9_0"], "--formats: unknown format 'q9_0'"),
    (["compare", "--formats", ","], "--formats: no format given"),
    (["compare", "--codebook", "nope"], "--codebook"),
    (["compare", "--signs", "nope"], "--signs"),
    (["compare", "--backend", "cuda"], "--backend: invalid choice"),
    (["compare", "--on-overflow", "clip"], "--on-overflow: invalid choice"),
    (["compare", "--role", "queries"], "--role: invalid choice"),
    (["compare", "--bogus"], "unrecognized arguments: --bogus"),
    # --- tbq compare: output paths, checked before any work
    (["compare", "--plot", "{d}/afile/x.png"], "is a file, not a directory"),
    (["compare", "--plot", "{d}/adir"], "is a directory"),
    (["compare", "--plot", "{d}/x.notanimage"], "--plot"),
    # --- tbq budget
    (["budget"], "give the model geometry"),
    (["budget", "--layers", "0", "--kv-heads", "8", "--head-dim", "128"], "--layers: must be at least 1"),
    (["budget", "--layers", "4", "--kv-heads", "x", "--head-dim", "128"], "--kv-heads: expected an integer"),
    (
        ["budget", "--layers", "4", "--kv-heads", "8", "--head-dim", "100", "--formats", "f16,q8_0,tbq4_0"],
        "--head-dim 100 is not a multiple of the block size of q8_0 (32 values) and tbq4_0 (128 values)",
    ),
    (["budget", "--values-per-token", "1e5", "--sequences", "0"], "--sequences: must be at least 1"),
    (["budget", "--values-per-token", "abc"], "--values-per-token: expected a number"),
    (["budget", "--values-per-token", "-5"], "--values-per-token must be positive"),
    (["budget", "--values-per-token", "1e5", "--contexts", "0"], "at least 1 token"),
    (["budget", "--values-per-token", "1e5", "--formats", "q5_k"], "unknown KV format 'q5_k'"),
    (["budget", "--values-per-token", "1e5", "--vram", "32G", "--weights", "1GB"], "'32G' is ambiguous"),
    (["budget", "--measured", "4224MiB"], "expected SIZE@CONTEXT:FORMAT"),
    (["budget", "--values-per-token", "1e5", "--plot", "{d}/afile/x.png"], "is a file, not a directory"),
    # --- tbq golden (another module's code; the dispatcher makes its failures one line)
    (["golden"], "--out"),
    (["golden", "--out", "{d}/g", "--formats", "q9_0"], "unknown format 'q9_0'"),
    (["golden", "--out", "{d}/g", "--blocks", "0"], "must be a positive integer, got 0"),
    (["golden", "--out", "{d}/g", "--blocks", "x"], "--blocks: invalid int value"),
    (["golden", "--out", "{d}/afile"], "afile"),
    (["golden", "--out", "{d}/afile/sub"], "afile/sub"),
    (["golden", "--out", "{d}/g", "--families", "nope"], "unknown family 'nope'"),
    (["golden", "--out", "{d}/g", "--seed", "-1"], "seed"),
    (["golden", "--out", "{d}/g", "--codebook", "{d}/bad.json"], "bad.json"),
    (["golden", "--out", "{d}/g", "--from-manifest", "{d}/missing.json"], "missing.json"),
    (["golden", "--out", "{d}/g", "--attention", "--kv-heads", "3"], "multiple of"),
    (["golden", "--out", "{d}/g", "--blocks", "1", "--formats", "q8_0", "--ulp-floor", "-1"], "ulp"),
    # --- the dispatcher
    ([], "give a command"),
    (["nope"], "invalid choice: 'nope'"),
]


# --------------------------------------------------------------------------- every numeric flag: huge, negative, NaN, zero

EXEC = ["--exec", "prog {in} {out}", "--only", "quantize"]
ATT_EXEC = [
    "--exec",
    "prog {q} {k} {v} {mask} {out}",
]  # an attention program (never run: the numbers are refused first)
#: (command argv before the flag, flag, unit appended to the number for sizes/rates, values where the number is valid)
NUMERIC_FLAGS = [
    (["compare"], "--repeat", "", ()),
    (["compare"], "--queries", "", ()),
    (["compare"], "--topk", "", ()),
    (["compare"], "--seed", "", ("0",)),
    (["budget", "--values-per-token", "1e5"], "--sequences", "", ()),
    (["budget", "--values-per-token", "1e5"], "--contexts", "", ()),
    (["budget", "--values-per-token", "1e5"], "--contexts", "K", ()),
    (["budget"], "--values-per-token", "", ()),
    (["budget"], "--measured", "MiB@262144:tbq4_0", ()),
    (["budget", "--kv-heads", "8", "--head-dim", "128"], "--layers", "", ()),
    (["budget", "--layers", "8", "--head-dim", "128"], "--kv-heads", "", ()),
    (["budget", "--layers", "8", "--kv-heads", "8"], "--head-dim", "", ()),
    (["budget", "--values-per-token", "1e5", "--weights", "1GB"], "--vram", "GB", ("0", "1e-400")),  # rounds to 0 bytes
    (["budget", "--values-per-token", "1e5", "--vram", "32GB"], "--weights", "GB", ("0", "1e-400")),
    (
        ["budget", "--values-per-token", "1e5", "--vram", "32GB", "--weights", "1GB"],
        "--workspace",
        "GiB",
        ("0", "1e-400"),
    ),
    (["budget", "--values-per-token", "1e5", "--bandwidth", "1TB/s"], "--weights-traffic", "GB", ("0", "1e-400")),
    (["budget", "--values-per-token", "1e5", "--weights", "1GB"], "--bandwidth", "GB/s", ()),
    (["budget", "--values-per-token", "1e5"], "--vram", "", ()),  # no unit at all: refused for every number
    (["golden", "--out", "{d}/g"], "--rows-per-family", "", ()),
    (["golden", "--out", "{d}/g"], "--seed", "", ("0", "99999999999999999999999999999999999999")),  # any size of seed
    (["golden", "--out", "{d}/g"], "--fragile-ulps", "", ("0",)),
    (["golden", "--out", "{d}/g"], "--ulp-floor", "", ("0", "1e-400")),  # 1e-400 is 0.0 as a float
    (["golden", "--out", "{d}/g", "--attention"], "--tokens", "", ()),
    (["golden", "--out", "{d}/g", "--attention"], "--heads", "", ()),
    (["golden", "--out", "{d}/g", "--attention"], "--kv-heads", "", ()),
    (["golden", "--out", "{d}/g", "--attention"], "--n-sink", "", ("0",)),
    (["check", "--format", "q8_0", *EXEC], "--timeout", "", ()),
    (["check", "--format", "q8_0", *EXEC], "--blocks", "", ("0",)),
    (["check", "--format", "q8_0", *EXEC], "--examples", "", ("0",)),
    (["check", "--format", "q8_0", *EXEC], "--seconds", "", ()),
    (["check", "--format", "q8_0", *EXEC], "--seed", "", ("0",)),
    (["check", "--format", "q8_0", *EXEC], "--fragile-ulps", "", ("0",)),
    (["check", "--attention", "--k-type", "q8_0", "--v-type", "q8_0", *ATT_EXEC], "--head-dim", "", ()),
    (["check", "--attention", "--k-type", "q8_0", "--v-type", "q8_0", *ATT_EXEC], "--queries", "", ()),
    (["check", "--attention", "--k-type", "q8_0", "--v-type", "q8_0", *ATT_EXEC], "--threads", "", ()),
    (["eval"], "--context", "", ()),
    (["eval"], "--chunks", "", ()),
    (["eval"], "--sinks", "", ("0",)),
    (["eval"], "--generate", "", ("0",)),
]
NUMBERS = ("1e400", "-1", "nan", "0", "inf", "-inf", "1e-400", "99999999999999999999999999999999999999", "abc")


def _numeric_cases():
    for base, flag, unit, valid in NUMERIC_FLAGS:
        for number in NUMBERS:
            if number in valid:
                continue
            yield pytest.param(base + [flag, number + unit], flag, id=f"{base[0]} {flag} {number}{unit}")


@pytest.mark.parametrize("argv, flag", list(_numeric_cases()))
def test_every_numeric_flag_refuses_bad_numbers_in_one_line(files, capsys, argv, flag, monkeypatch):
    """Huge, tiny, negative, NaN, infinite and non-numbers: a one-line error naming the flag, before any work."""
    import tbq.cli.compare

    def boom(*a, **k):
        raise AssertionError("the work started although an argument was bad")

    monkeypatch.setattr(tbq.cli.compare, "compare", boom)
    monkeypatch.setattr(sys.modules["tbq.golden.generate"], "make_inputs", boom)
    rc = cli.main(_argv(argv, files))
    err = capsys.readouterr().err
    _assert_one_line_error(rc, err, "error")
    dest = flag.lstrip("-").replace("-", "_")
    # the message names the flag (or, for the library's checks of golden's numbers, the parameter)
    names = {
        flag,
        dest,
        dest.replace("_", " "),
        "n_head" if flag == "--heads" else flag,
        "n_head_kv" if flag == "--kv-heads" else flag,
        "fragility margin" if flag == "--fragile-ulps" else flag,
        "ulp_floor" if flag == "--ulp-floor" else flag,
        "rows per family" if flag == "--rows-per-family" else flag,
    }
    assert any(n in err for n in names), err
    assert "np.float" not in err and "np.int" not in err  # no NumPy reprs in messages
    assert not (files / "g").exists()


def test_there_is_a_numeric_case_for_every_numeric_flag():
    parser = cli.build_parser()
    numeric = set()
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            t = getattr(action, "type", None)
            if t is int or t is float or getattr(t, "__name__", "").startswith(("integer", "number", "_positive")):
                numeric.add((name, next(o for o in action.option_strings if o.startswith("--"))))
    covered = {(base[0], flag) for base, flag, _, _ in NUMERIC_FLAGS}
    assert numeric <= covered, numeric - covered


# --------------------------------------------------------------------------- work too large for memory: refused first

BIG = [
    (["check", "--format", "q8_0", *EXEC, "--blocks", "100000000000", "--out", "{d}/ck"], "--blocks 100,000,000,000"),
    (["golden", "--out", "{d}/g", "--rows-per-family", "100000000"], "100,000,000 rows per family"),
    (["golden", "--out", "{d}/g", "--attention", "--tokens", "100000000"], "100,000,000 tokens"),
    (["golden", "--out", "{d}/g", "--from-manifest", "{d}/huge_manifest.json"], "huge_manifest.json"),
    (["compare", "{d}/huge_header.npy", "--plot", "{d}/g/x.png"], "comparing"),  # the header alone says 10^12 values
]


@pytest.mark.parametrize("argv, needle", BIG, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BIG])
def test_work_that_cannot_fit_is_refused_before_it_starts(files, capsys, argv, needle, monkeypatch):
    import json

    manifest = {
        "kind": "tbq-golden-format",
        "format": "q8_0",
        "arrays": {"input": {"sha256": "0" * 64}},
        "generator": {"rows_per_family": 10**12, "seed": 0, "families": [{"name": "gaussian", "seed": 1}]},
    }
    (files / "huge_manifest.json").write_text(json.dumps(manifest))
    with open(files / "huge_header.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (10**9, 8, 128)})
    monkeypatch.setattr("tbq.parallel.memory_available", lambda: 8 * 2**30)  # the same answer on any machine

    def boom(*a, **k):
        raise AssertionError("the work started although it cannot fit")

    monkeypatch.setattr(sys.modules["tbq.golden.generate"], "make_inputs", boom)
    monkeypatch.setattr(sys.modules["tbq.golden.generate"], "build_format", boom)
    rc = cli.main(_argv(argv, files))
    err = capsys.readouterr().err
    _assert_one_line_error(rc, err, needle)
    assert "needs about" in err and "8.00 GiB are available" in err and "nothing was computed or written" in err
    assert not (files / "g").exists() and not (files / "ck").exists()


def _argv(argv, d):
    return [a.replace("{d}", str(d)) for a in argv]


def _assert_one_line_error(rc, err, needle):
    assert rc == 2, err
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert ": error: " in err and err.startswith("tbq"), err
    assert needle in err, err


def _values(case):
    """(argv, needle) of a case, plain or ``pytest.param``."""
    return case.values if hasattr(case, "marks") else case


def _case_id(case):
    return " ".join(a.replace("{d}/", "") for a in _values(case)[0])[:60] or "no-command"


@pytest.mark.parametrize("argv, needle", CASES, ids=[_case_id(c) for c in CASES])
def test_malformed_input_is_one_line_exit_2(files, capsys, argv, needle):
    rc = cli.main(_argv(argv, files))
    err = capsys.readouterr().err
    _assert_one_line_error(rc, err, needle)


def test_there_are_enough_cases():
    assert len(CASES) >= 25
    assert {(_values(c)[0] or [""])[0] for c in CASES} >= {"compare", "budget", "golden", ""}


def test_output_paths_are_checked_before_any_work(files, capsys, monkeypatch):
    import tbq.cli.budget
    import tbq.cli.compare

    def boom(*a, **k):
        raise AssertionError("the computation ran before the output path was checked")

    monkeypatch.setattr(tbq.cli.compare, "compare", boom)
    monkeypatch.setattr(tbq.cli.budget, "budget_report", boom)
    for argv in (
        ["compare", "--plot", f"{files}/afile/x.png"],
        ["compare", "--plot", str(files / "adir")],
        ["budget", "--values-per-token", "1", "--plot", f"{files}/afile/x.png"],
    ):
        assert cli.main(argv) == 2
        assert "--plot" in capsys.readouterr().err


def test_oserror_while_writing_is_one_line(files, capsys, monkeypatch):
    # a disk that fills up (or a file that vanishes) while writing: a message, not a traceback
    import tbq.cli.budget

    def full(*a, **k):
        raise OSError(28, "No space left on device", str(files / "x.png"))

    monkeypatch.setattr(tbq.cli.budget, "format_report", full)
    rc = cli.main(["budget", "--values-per-token", "1", "--contexts", "8K"])
    _assert_one_line_error(rc, capsys.readouterr().err, "x.png: No space left on device")


def test_a_genuine_bug_keeps_its_traceback(monkeypatch):
    # only the failures a user can cause become messages; anything else is a bug and must show where it is
    import tbq.cli.budget

    def bug(*a, **k):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(tbq.cli.budget, "format_report", bug)
    with pytest.raises(ZeroDivisionError):
        cli.main(["budget", "--values-per-token", "1", "--contexts", "8K"])


# --------------------------------------------------------------------------- in a real process

RUN_CLI = "import sys; from tbq.cli import main; sys.exit(main())"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["compare", "{d}/two.npz"], "pick one with --array"),
        (["compare", "--repeat", "0"], "--repeat: must be at least 1"),
        (["budget", "--layers", "4", "--kv-heads", "8", "--head-dim", "100", "--formats", "q4_0"], "--head-dim 100"),
    ],
)
def test_subprocess_prints_no_traceback(files, argv, needle):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", RUN_CLI, *_argv(argv, files)], capture_output=True, text=True, env=env)
    _assert_one_line_error(proc.returncode, proc.stderr, needle)
    assert proc.stdout == ""


# --------------------------------------------------------------------------- the other findings of issue 21


def test_python_dash_m_tbq_is_the_command(files):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run(
        [sys.executable, "-m", "tbq", "budget", "--values-per-token", "1000", "--contexts", "8K"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("KV cache budget: 1,000 values per token")
    proc = subprocess.run(
        [sys.executable, "-m", "tbq", "budget", "--contexts", "-8K", "--values-per-token", "1"],
        capture_output=True,
        text=True,
        env=env,
    )
    _assert_one_line_error(proc.returncode, proc.stderr, "--contexts: a context cannot be negative: '-8K'")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["budget", "--values-per-token", "1e5", "--contexts", "-8K"],
            "--contexts: a context cannot be negative: '-8K'",
        ),
        (
            ["budget", "--values-per-token", "1e5", "--weights", "1GB", "--bandwidth", "-5GB/s"],
            "--bandwidth: a bandwidth must be positive",
        ),
        (
            ["budget", "--values-per-token", "1e5", "--vram", "8GB", "--weights", "1GB", "--workspace", "-1GiB"],
            "--workspace: a size cannot be negative",
        ),
        (["budget", "--values-per-token", "1e5", "--vram", "-inf"], "--vram"),
    ],
)
def test_negative_values_reach_the_flag_not_expected_one_argument(capsys, argv, needle):
    rc = cli.main(argv)
    err = capsys.readouterr().err
    _assert_one_line_error(rc, err, needle)
    assert "expected one argument" not in err


def test_plot_without_extension_reports_the_file_written(files, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "out" / "plotnoext"
    assert cli.main(["budget", "--values-per-token", "1000", "--contexts", "8K", "--plot", str(target)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {target}.png" in out and (tmp_path / "out" / "plotnoext.png").exists() and not target.exists()
    np.save(tmp_path / "kv.npy", np.random.default_rng(0).standard_normal((16, 1, 128)).astype(np.float32))
    assert (
        cli.main(
            [
                "compare",
                str(tmp_path / "kv.npy"),
                "--formats",
                "q8_0",
                "--repeat",
                "1",
                "--queries",
                "1",
                "--plot",
                str(tmp_path / "cmp"),
            ]
        )
        == 0
    )
    assert f"figure saved to {tmp_path / 'cmp'}.png" in capsys.readouterr().out and (tmp_path / "cmp.png").exists()


def test_budget_measured_prints_no_raw_floats_and_says_values_per_token_is_not_whole(capsys):
    assert cli.main(["budget", "--measured", "4225MiB@262144:tbq4_0", "--contexts", "8K"]) == 0
    out = capsys.readouterr().out
    assert "65,551.52" in out and "65,551.515" not in out
    assert "is not a whole number" in " ".join(out.split())
    assert all(len(line) <= 100 for line in out.splitlines())


def test_budget_says_when_the_weights_alone_do_not_fit(capsys):
    assert (
        cli.main(["budget", "--values-per-token", "1000", "--contexts", "8K", "--vram", "8GB", "--weights", "9GB"]) == 0
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "the weights alone (8.38 GiB) do not fit in the VRAM (7.45 GiB)" in out


def test_budget_refuses_more_contexts_than_a_table_can_show(capsys):
    many = ",".join(f"{k}K" for k in range(1, 10))
    rc = cli.main(["budget", "--values-per-token", "1000", "--contexts", many])
    _assert_one_line_error(rc, capsys.readouterr().err, "9 contexts given; at most 8")


def test_default_tables_fit_100_columns(capsys):
    # the budget feasibility table was 106 columns (headers 150); golden --attention's 128 (tested in test_golden)
    assert (
        cli.main(
            [
                "budget",
                "--layers",
                "48",
                "--kv-heads",
                "8",
                "--head-dim",
                "128",
                "--vram",
                "32GB",
                "--weights",
                "18.8GiB",
                "--weights-traffic",
                "15.88GB",
                "--bandwidth",
                "1296GB/s",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    for command in ("compare", "budget", "golden", "check"):
        assert cli.main([command, "--help"]) == 0
        text = capsys.readouterr().out
        for name in ("tbq4_0", "planar3_0", "iq4_nl"):  # no format name broken across lines
            assert not any(line.rstrip().endswith(name[:-2]) for line in text.splitlines()), (command, name)
