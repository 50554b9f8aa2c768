"""``tbq golden``: golden vectors, C headers, fragility masks, the C consumer."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import naive
import numpy as np
import pytest
from helpers import assert_bits_equal, assert_bytes_equal

import tbq
from tbq import golden
from tbq.cli import golden as golden_cli
from tbq.errors import ConfigError, TbqTypeError, TbqValueError
from tbq.packing import unpack3, unpack4_pairs

ROOT = Path(__file__).resolve().parents[1]
CONSUMER = ROOT / "docs" / "examples" / "check_golden.c"
FORMATS = ("q8_0", "q4_0", "tbq4_0", "tbq3_0")
CC = shutil.which("gcc") or shutil.which("cc")
CXX = shutil.which("g++") or shutil.which("c++")
needs_cc = pytest.mark.skipif(
    CC is None, reason="no C compiler (gcc/cc) on PATH: the header and C-consumer checks need one"
)
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++/c++) on PATH")


def parser():
    p = argparse.ArgumentParser(prog="tbq golden")
    golden_cli.add_arguments(p)
    return p


def run_golden(argv):
    return golden_cli.run_cli(parser().parse_args(argv))


@pytest.fixture(scope="module")
def gdir(tmp_path_factory):
    """The four original formats (default rows = one per edge kind), attention with and without sinks.

    (Every other registered format is checked by test_every_format_gets_a_consistent_golden_set.)
    """
    d = tmp_path_factory.mktemp("golden")
    summary = golden.generate(
        d,
        formats=FORMATS,
        attention=True,
        attention_pairs=[("tbq4_0", "tbq4_0"), ("q8_0", "tbq3_0")],
        tokens=12,
        n_head=4,
        n_head_kv=2,
        n_sink=2,
        sink_format="q8_0",
    )
    golden.write_set(golden.build_attention("tbq4_0", "q4_0", tokens=8, n_head=2, n_head_kv=1), d)
    return d, summary


def load(d, name):
    with np.load(d / f"{name}.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, json.loads((d / f"{name}.json").read_text())


def compile_run(args, cwd, run=True, run_args=()):
    subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True)
    if run:
        return subprocess.run([str(Path(cwd) / "a.out"), *run_args], cwd=cwd, capture_output=True, text=True)
    return None


# ---------------------------------------------------------------------------
# files, bytes, manifests
# ---------------------------------------------------------------------------


def test_files_shapes_and_counts(gdir):
    d, summary = gdir
    n_rows = golden.DEFAULT_BLOCKS * len(golden.FAMILIES)
    for fmt in FORMATS:
        info = tbq.format_info(fmt)
        a, m = load(d, fmt)
        nb = n_rows * 128 // info.block_size
        assert m["blocks"] == nb and m["rows"] == n_rows and m["format"] == fmt
        assert a["input"].shape == a["decoded"].shape == a["fragile"].shape == (nb, info.block_size)
        assert a["bytes"].shape == (nb, info.type_size) and a["bytes"].dtype == np.uint8
        assert a["scale_fragile"].shape == a["family"].shape == a["kind"].shape == (nb,)
        # every family is present with its block range and the edge kinds cycle
        for f in m["generator"]["families"]:
            lo, hi = f["blocks"]
            assert (a["family"][lo:hi] == f["index"]).all()
        edge = a["family"] == golden.FAMILIES.index("edge")
        assert sorted(set(a["kind"][edge].tolist())) == list(range(len(golden.EDGE_KINDS)))
        assert (a["kind"][~edge] == 255).all()
        assert (d / f"{fmt}.h").exists()
    assert {r["format"] for r in summary.rows} == set(FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_bytes_and_decoded_are_the_library_codecs(gdir, fmt):
    """A writer test: the files hold what tbq's own codecs give (both backends).

    It says nothing about whether tbq is right; that claim is carried by the C
    consumer (test_c_consumer_decodes_and_encodes_bit_for_bit) and the naive
    models (test_every_format_gets_a_consistent_golden_set).
    """
    d, _ = gdir
    a, m = load(d, fmt)
    cfg = {k: v for k, v in m["codec_config"].items() if k != "name"}
    for backend in ("numpy", "numba"):
        q = tbq.quantize(a["input"], fmt, backend=backend, **cfg)
        np.testing.assert_array_equal(q, a["bytes"], err_msg=f"{fmt} {backend}")
        y = tbq.dequantize(a["bytes"], fmt, backend=backend, **cfg)
        assert np.array_equal(y.view(np.uint32), a["decoded"].view(np.uint32)), (fmt, backend)
    # the codec rebuilt from the manifest's exact config is the codec of the named config
    assert (
        tbq.codec_from_config(m["codec_config"]).get_config()
        == tbq.get_codec(fmt, **{k: v for k, v in m["codec_config_named"].items() if k != "name"}).get_config()
    )


def test_edge_scales_are_finite_and_inputs_hold_negative_zero(gdir):
    d, _ = gdir
    for fmt in FORMATS:
        a, _ = load(d, fmt)
        h = a["bytes"][:, :2].copy().view("<u2")[:, 0]
        assert ((h & 0x7C00) != 0x7C00).all(), f"{fmt}: an fp16 scale is Inf/NaN"
        assert np.isfinite(a["decoded"]).all() and np.isfinite(a["scale_f32"]).all()
        neg0 = (a["input"] == 0) & np.signbit(a["input"])
        assert neg0.any()
    assert "-0x0p+0f" in (d / "q8_0.h").read_text()


def test_manifest_is_complete(gdir):
    d, _ = gdir
    for fmt in FORMATS:
        a, m = load(d, fmt)
        assert m["library"]["version"] == tbq.__version__
        assert set(m["arrays"]) == set(a)
        for name, entry in m["arrays"].items():
            assert entry["sha256"] == golden.sha256_array(a[name])
            assert entry["dtype"] == a[name].dtype.str and entry["shape"] == list(a[name].shape)
        g = m["generator"]
        for f in g["families"]:
            assert f["seed"] == g["seed"] * 1000 + 1 + golden.FAMILIES.index(f["name"])
        if fmt.startswith("tbq"):
            codec = tbq.get_codec(fmt)  # defaults: lloyd-max codebook, turboq-mtp signs
            cb = m["codec_config"]["codebook"]
            assert np.array_equal(np.float32(cb["centroids"]).view(np.uint32), codec.codebook.centroids.view(np.uint32))
            assert np.array_equal(
                np.float32(cb["thresholds"]).view(np.uint32), codec.codebook.thresholds.view(np.uint32)
            )
            assert m["codec_config"]["signs"]["signs1"] == codec.rotation.signs1.tolist()
            assert (
                m["tables"]["centroids"]["float32_bits"][0]
                == f"0x{int(codec.codebook.centroids.view(np.uint32)[0]):08x}"
            )
    assert golden.verify(d) == []


def test_regenerate_from_manifest_bit_for_bit(gdir, tmp_path):
    d, _ = gdir
    for mp in sorted(d.glob("*.json")):
        m = json.loads(mp.read_text())
        gs = golden.regenerate(mp)
        want = {k: v["sha256"] for k, v in m["arrays"].items()}
        got = {k: golden.sha256_array(v) for k, v in gs.arrays.items()}
        assert got == want, mp.name
        assert gs.header == (d / f"{gs.name}.h").read_text(), mp.name
    # the CLI does the same and writes identical files
    assert (
        run_golden(
            [
                "--out",
                str(tmp_path),
                "--quiet",
                "--from-manifest",
                str(d / "tbq3_0.json"),
                str(d / "attention_q8_0_tbq3_0.json"),
            ]
        )
        == 0
    )
    assert (tmp_path / "tbq3_0.h").read_text() == (d / "tbq3_0.h").read_text()
    assert golden.verify(tmp_path) == []


def test_verify_detects_a_changed_array(gdir, tmp_path):
    d, _ = gdir
    for suffix in ("npz", "json", "h"):
        shutil.copy(d / f"q4_0.{suffix}", tmp_path)
    a, _ = load(tmp_path, "q4_0")
    a["bytes"][3, 5] ^= 1
    np.savez(tmp_path / "q4_0.npz", **a)
    assert golden.verify(tmp_path) == ["q4_0.npz: array bytes does not match its SHA-256"]


def test_regeneration_rejects_a_manifest_that_does_not_reproduce(gdir, tmp_path):
    d, _ = gdir
    m = json.loads((d / "q8_0.json").read_text())
    m["arrays"]["input"]["sha256"] = "0" * 64
    p = tmp_path / "q8_0.json"
    p.write_text(json.dumps(m))
    with pytest.raises(TbqValueError, match="differ"):
        run_golden(["--out", str(tmp_path / "o"), "--quiet", "--from-manifest", str(p)])


def test_seeds_are_per_family_and_reproducible():
    full = golden.make_inputs(3, 5)
    edge_only = golden.make_inputs(3, 5, ["edge"])
    assert np.array_equal(full["x"][9:12].view(np.uint32), edge_only["x"].view(np.uint32))
    g = np.random.default_rng(5 * 1000 + 1).standard_normal((3, 128), dtype=np.float32)
    assert np.array_equal(full["x"][:3], g)
    assert not np.array_equal(golden.make_inputs(3, 6)["x"][:3], full["x"][:3])


# ---------------------------------------------------------------------------
# C headers
# ---------------------------------------------------------------------------

_ARRAY = re.compile(r"static const (float|double|uint8_t|int8_t) (\w+)\[[^\]]*\] TBQ_GOLDEN_UNUSED = \{(.*?)\};", re.S)


def header_arrays(text: str) -> dict:
    out = {}
    for ctype, name, body in _ARRAY.findall(text):
        lits = [t.strip() for t in body.replace("\n", " ").split(",") if t.strip()]
        if ctype == "float":
            assert all(t.endswith("f") for t in lits)
            out[name] = np.array([float.fromhex(t[:-1]) for t in lits], np.float64).astype(np.float32)
        elif ctype == "double":
            out[name] = np.array([float.fromhex(t) for t in lits], np.float64)
        else:
            out[name] = np.array([int(t) for t in lits], np.int64)
    return out


def test_header_literals_are_the_arrays_exactly(gdir):
    d, _ = gdir
    for fmt in ("q8_0", "tbq4_0"):
        text = (d / f"{fmt}.h").read_text()
        assert "nan" not in text.lower() and "inf" not in text.lower().replace("info", "")
        h = header_arrays(text)
        a, m = load(d, fmt)
        for name in ("input", "decoded", "scale_f32"):
            got = h[f"tbq_golden_{fmt}_{name}"]
            assert np.array_equal(got.view(np.uint32), a[name].reshape(-1).view(np.uint32)), name  # -0.0 included
        for name in ("bytes", "fragile", "scale_fragile", "family", "kind"):
            assert np.array_equal(h[f"tbq_golden_{fmt}_{name}"], a[name].reshape(-1).astype(np.int64)), name
        assert f"#define TBQ_GOLDEN_{fmt.upper()}_BLOCKS {m['blocks']}\n" in text
        assert f"#define TBQ_GOLDEN_{fmt.upper()}_TYPE_SIZE {m['type_size']}\n" in text
    h = header_arrays((d / "tbq4_0.h").read_text())
    assert np.array_equal(h["tbq_golden_tbq4_0_signs2"], tbq.get_codec("tbq4_0").rotation.signs2)
    a, _ = load(d, "attention_q8_0_tbq3_0")
    h = header_arrays((d / "attention_q8_0_tbq3_0.h").read_text())
    assert np.array_equal(
        h["tbq_golden_attention_q8_0_tbq3_0_out_dequantized"].view(np.uint64),
        a["out_dequantized"].reshape(-1).view(np.uint64),
    )
    assert np.array_equal(h["tbq_golden_attention_q8_0_tbq3_0_k_sink"], a["k_sink"].reshape(-1))


def test_hex_literal():
    assert golden.hex_literal(-0.0) == "-0x0p+0f"
    assert golden.hex_literal(0.0, "") == "0x0p+0"
    assert golden.hex_literal(float(np.float32(1e-45))) == "0x1p-149f"  # float32 subnormal, exact
    for v in (1.0, -2.5, 0.1, 3.4028234663852886e38, float(np.float32(0.1))):
        assert float.fromhex(golden.hex_literal(v, "")) == v
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(TbqValueError):
            golden.hex_literal(bad)


@needs_cc
def test_headers_compile_warning_free_in_c(gdir, tmp_path):
    d, _ = gdir
    headers = sorted(p.name for p in d.glob("*.h"))
    assert len(headers) == 7
    src = tmp_path / "all.c"
    src.write_text("".join(f'#include "{h}"\n' for h in headers) + "int main(void) { return 0; }\n")
    compile_run(
        [CC, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(d), "-c", str(src), "-o", "all.o"],
        tmp_path,
        run=False,
    )


@needs_cxx
def test_headers_compile_warning_free_in_cpp(gdir, tmp_path):
    d, _ = gdir
    src = tmp_path / "all.cpp"
    src.write_text("".join(f'#include "{p.name}"\n' for p in sorted(d.glob("*.h"))) + "int main() { return 0; }\n")
    compile_run(
        [CXX, "-std=c++17", "-Wall", "-Werror", "-I", str(d), "-c", str(src), "-o", "all.o"], tmp_path, run=False
    )


@needs_cc
def test_headers_from_two_translation_units_link(gdir, tmp_path):
    d, _ = gdir
    inc = '#include "tbq4_0.h"\n#include "q4_0.h"\n'
    (tmp_path / "a.c").write_text(
        inc + "#include <stdio.h>\nlong count_b(void);\n"
        "int main(void) { long n = 0; int i;\n"
        "  for (i = 0; i < TBQ_GOLDEN_TBQ4_0_VALUES; i++) n += tbq_golden_tbq4_0_fragile[i];\n"
        '  printf("%ld %ld\\n", n, count_b()); return 0; }\n'
    )
    (tmp_path / "b.c").write_text(
        inc + "long count_b(void) { long n = 0; int i;\n"
        "  for (i = 0; i < TBQ_GOLDEN_Q4_0_BLOCKS * TBQ_GOLDEN_Q4_0_TYPE_SIZE; i++) n += tbq_golden_q4_0_bytes[i];\n"
        "  return n; }\n"
    )
    r = compile_run(
        [CC, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(d), "a.c", "b.c", "-o", "a.out"], tmp_path
    )
    assert r.returncode == 0, r.stderr
    a4, _ = load(d, "tbq4_0")
    a0, _ = load(d, "q4_0")
    assert r.stdout.split() == [str(int(a4["fragile"].sum())), str(int(a0["bytes"].astype(np.int64).sum()))]


# ---------------------------------------------------------------------------
# the C consumer (docs/examples/check_golden.c)
# ---------------------------------------------------------------------------


def build_consumer(gen_dir: Path, work: Path, *extra) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    exe = work / "check_golden"
    subprocess.run(
        [
            CC,
            "-std=c11",
            "-O2",
            "-ffp-contract=off",
            "-Wall",
            "-Wextra",
            "-Werror",
            *extra,
            "-I",
            str(gen_dir),
            str(CONSUMER),
            "-o",
            str(exe),
            "-lm",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return exe


@needs_cc
def test_c_consumer_decodes_and_encodes_bit_for_bit(gdir, tmp_path):
    d, _ = gdir
    exe = build_consumer(d, tmp_path)
    r = subprocess.run([str(exe), "--exact"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PASS") == 5 and "decode mismatches 0" in r.stdout


@needs_cc
def test_c_consumer_fails_on_a_wrong_golden_value(gdir, tmp_path):
    d, _ = gdir
    bad = tmp_path / "bad"
    bad.mkdir()
    for fmt in FORMATS:
        shutil.copy(d / f"{fmt}.h", bad)
    gs = golden.regenerate(d / "tbq3_0.json")
    gs.arrays["decoded"].view(np.uint32)[7, 3] ^= 1  # one ulp in one decoded value
    (bad / "tbq3_0.h").write_text(golden.c_header(gs))
    r = subprocess.run([str(build_consumer(bad, tmp_path / "b"))], capture_output=True, text=True)
    assert r.returncode == 1
    assert "tbq3_0 blocks" in r.stdout and "decode mismatches 1" in r.stdout and "block 7 value 3" in r.stderr


@needs_cc
def test_fragility_masks_absorb_kernel_arithmetic_and_are_needed(tmp_path):
    """A kernel-style encoder (8-lane sums, x/d, fmaf) differs from the reference only where the masks allow.

    With k = 8 every difference is a tolerated one (and there are some: the
    masks are exercised); with k = 0 (no masks) the same encoder fails. k = 8,
    not the default 4: reordering the 128-term sum of squares moves rotated
    coordinates by up to ~9 ulps (at the floor 2^-4), see docs/golden-vectors.md.
    """
    outs = {}
    for k in (8, 0):
        gen = tmp_path / f"k{k}"
        golden.generate(gen, blocks=golden.DEFAULT_BLOCKS, k=k)
        exe = build_consumer(gen, tmp_path / f"exe{k}", "-DCHECK_GOLDEN_KERNEL_ARITHMETIC")
        outs[k] = subprocess.run([str(exe)], capture_output=True, text=True)
    assert outs[8].returncode == 0, outs[8].stdout + outs[8].stderr
    tolerated = [int(x) for x in re.findall(r"tolerated (\d+)", outs[8].stdout)]
    assert sum(tolerated) > 0
    # without masks the same encoder fails, on codes it would otherwise have been allowed
    rows = {
        m[0]: (int(m[1]), int(m[2]), int(m[3]), m[4])
        for m in re.findall(
            r"^(\w+)\s+blocks .*decode mismatches (\d+) .*codes exact \d+ tolerated (\d+) .*failures (\d+)  (PASS|FAIL)$",
            outs[0].stdout,
            flags=re.M,
        )
    }
    assert len(rows) == 4, outs[0].stdout
    assert outs[0].returncode == 1 and "FAILED" in outs[0].stdout
    assert sum(f for _, _, f, _ in rows.values()) > 0
    for name, (mismatch, tol, fails, verdict) in rows.items():
        assert mismatch == 0 and tol == 0, (name, outs[0].stdout)  # k = 0: nothing is tolerated
        assert (verdict == "FAIL") == (fails > 0), (name, outs[0].stdout)


# ---------------------------------------------------------------------------
# fragility masks
# ---------------------------------------------------------------------------


def _steps(v: np.ndarray, k: int, direction: float) -> np.ndarray:
    v = np.asarray(v, np.float32).copy()
    for _ in range(k):
        v = np.nextafter(v, np.float32(direction))
    return v


def brute_force_mask(code, v, k):
    """The literal definition: the code changes between k float32 ulps below and k above (np.nextafter)."""
    return code(_steps(v, k, -np.inf).astype(np.float64)) != code(_steps(v, k, np.inf).astype(np.float64))


def _roundf64(y):
    t = np.trunc(y)
    return t + np.where(np.abs(y - t) >= 0.5, np.sign(y), 0.0)


def _q4_code_t(t):
    return np.minimum(15.0, np.trunc(t))


def _q4_code_v(v):
    return _q4_code_t((np.asarray(v, np.float64) + 8.5).astype(np.float32).astype(np.float64))


def encoder_quantities(fmt, xb):
    """The encoders' float32 intermediates, recomputed here from docs/formats.md."""
    if fmt == "q8_0":
        d = np.max(np.abs(xb), axis=1) / np.float32(127)
        inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
        return xb * inv[:, None], d
    m = xb[np.arange(len(xb)), np.argmax(np.abs(xb), axis=1)]
    m[np.abs(xb).max(axis=1) == 0] = 0.0  # ggml's max starts at +0: a block of (signed) zeros has m = +0
    d = m / np.float32(-8)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    return xb * inv[:, None], d


def ties_and_integers(rng, n_blocks, top, tie: bool):
    """Blocks of (k + 0.5) * 2^e (tie) or k * 2^e, with one value +-top * 2^e (the largest magnitude)."""
    x = np.empty((n_blocks, 32), np.float32)
    for b in range(n_blocks):
        s = 2.0 ** int(rng.integers(-5, 3))
        lo = -top if tie else -top + 1
        v = (rng.integers(lo, top if tie else top, 32) + (0.5 if tie else 0.0)) * s
        v[rng.integers(32)] = rng.choice([-top, top]) * s
        x[b] = v
    return x


@pytest.mark.parametrize("fmt,top", [("q8_0", 127), ("q4_0", 8)])
def test_scalar_masks_on_ties_far_values_and_random_data(fmt, top):
    rng = np.random.default_rng(11)
    codec = tbq.get_codec(fmt, backend="numpy")
    k = 4
    ties = ties_and_integers(rng, 20, top, tie=True)
    far = ties_and_integers(rng, 20, top, tie=False)
    rand = rng.standard_normal((200, 32), dtype=np.float32)
    for name, xb in (("ties", ties), ("far", far), ("random", rand)):
        data = codec.encode(xb)
        fr = golden.fragility(codec, xb, data, k)
        v, d = encoder_quantities(fmt, xb)
        if fmt == "q8_0":
            want = brute_force_mask(_roundf64, v, k)
        else:
            t = v + np.float32(8.5)
            want = brute_force_mask(_q4_code_v, v, k) | brute_force_mask(_q4_code_t, t, k)
        assert np.array_equal(fr["fragile"].astype(bool), want), name
        want_scale = _steps(d, k, -np.inf).astype(np.float16) != _steps(d, k, np.inf).astype(np.float16)
        assert np.array_equal(fr["scale_fragile"].astype(bool), want_scale), name
        if name == "ties":
            # every value sits on a rounding boundary, except the +-top one and (Q4_0) t = 16, where min(15, .) clamps
            assert fr["fragile"].sum() >= 20 * 28
            assert not fr["scale_fragile"].any()  # d = 2^e is an fp16 number
        if name == "far":
            assert not fr["fragile"].any() and not fr["scale_fragile"].any()
    # k = 0: nothing can change under a zero perturbation, even on exact ties
    assert not golden.fragility(codec, ties, codec.encode(ties), 0)["fragile"].any()


def unit_rows_in_cells(cb, rot, rng, n, on_thresholds: bool):
    """Rows whose rotated coordinates are thresholds (or cell centres), plus one large filler, unit norm."""
    m = cb.thresholds.astype(np.float64)
    centres = (m[1:] + m[:-1]) / 2
    rows, targets = [], []
    for _ in range(n):
        r = np.zeros(128)
        s = 0.0
        pos = rng.permutation(128)
        for p in pos[:-1]:
            v = rng.choice(m) if on_thresholds else rng.choice(centres)
            if s + v * v <= 1 - 0.35**2:
                r[p], s = v, s + v * v
            elif not on_thresholds:
                r[p] = 0.0 if centres.size % 2 else centres[centres.size // 2]
                s += r[p] ** 2
        r[pos[-1]] = np.sqrt(1 - s)
        rows.append(rot.inverse(r) * rng.uniform(0.5, 3))
        targets.append(r)
    return np.array(rows).astype(np.float32), np.array(targets)


@pytest.mark.parametrize("fmt", ["tbq4_0", "tbq3_0"])
def test_tbq_masks_near_and_far_from_thresholds(fmt):
    rng = np.random.default_rng(3)
    codec = tbq.get_codec(fmt, backend="numpy")
    near, rt = unit_rows_in_cells(codec.codebook, codec.rotation, rng, 6, on_thresholds=True)
    fr = golden.fragility(codec, near, codec.encode(near), 4)["fragile"].astype(bool)
    on = np.isin(rt, codec.codebook.thresholds.astype(np.float64)) & (rt != rt.max(axis=1, keepdims=True))
    assert fr[on].mean() > 0.9, fr[on].mean()  # (almost) every coordinate placed on a threshold is flagged
    assert not fr[~on].any()  # the filler coordinate is far above every threshold
    far, _ = unit_rows_in_cells(codec.codebook, codec.rotation, rng, 6, on_thresholds=False)
    assert not golden.fragility(codec, far, codec.encode(far), 4)["fragile"].any()
    assert not golden.fragility(codec, far, codec.encode(far), 1000)["fragile"].any()


@pytest.mark.parametrize("fmt", ["tbq4_0", "tbq3_0"])
def test_tbq_mask_is_the_literal_ulp_definition_without_floor(fmt):
    rng = np.random.default_rng(4)
    codec = tbq.get_codec(fmt, backend="numpy", codebook="turboq-mtp", signs=9)
    near, _ = unit_rows_in_cells(codec.codebook, codec.rotation, rng, 4, on_thresholds=True)
    xb = np.concatenate([near, rng.standard_normal((40, 128), dtype=np.float32)])
    data = codec.encode(xb)
    r = np.array([naive.encode_block(codec.format, row)[1]["r"] for row in xb])  # the slow model's own r
    thr = codec.codebook.thresholds.astype(np.float64)
    assert np.array_equal(
        codec.codebook.index(r), (unpack4_pairs if fmt == "tbq4_0" else unpack3)(data[:, 2:], backend="numpy")
    )
    for k in (1, 4, 64):
        want = brute_force_mask(lambda y: np.searchsorted(thr, y, side="right"), r, k)
        got = golden.fragility(codec, xb, data, k, ulp_floor=0.0)["fragile"].astype(bool)
        assert np.array_equal(got, want), k
        # the floor only widens the band: every literal-fragile value stays fragile
        floored = golden.fragility(codec, xb, data, k)["fragile"].astype(bool)
        assert (floored >= got).all() and floored.sum() >= got.sum()


def test_tbq_floor_flags_values_next_to_the_zero_threshold():
    codec = tbq.get_codec("tbq4_0", backend="numpy")
    r = np.zeros((1, 128))
    r[0, 0] = np.sqrt(1 - 3e-8**2 - 0.3**2)
    r[0, 1] = 0.3
    r[0, 2] = 3e-8  # 4 ulps at 2^-4 = 2.98e-8: just outside
    r[0, 3] = 2e-8  # inside the floored band, billions of subnormal ulps away from 0
    x = codec.rotation.inverse(r).astype(np.float32)
    data = codec.encode(x)
    rr = naive.encode_block(codec.format, x[0])[1]["r"][None, :]
    lit = golden.fragility(codec, x, data, 4, ulp_floor=0.0)["fragile"][0]
    flo = golden.fragility(codec, x, data, 4)["fragile"][0]
    j = int(np.argmin(np.abs(rr[0] - 2e-8)))
    assert abs(rr[0, j] - 2e-8) < 1e-8 and flo[j] == 1 and lit[j] == 0


def test_scale_mask_on_fp16_ties_and_exact_fp16_scales():
    rng = np.random.default_rng(5)
    codec = tbq.get_codec("q8_0", backend="numpy")
    # d = t exactly halfway between two fp16 numbers: fragile even with k = 1; d = an fp16 number: not even with k = 100
    t = (1 + (np.arange(8) * 37 % 1023 + 0.5) / 1024) * 2.0 ** rng.integers(-8, 4, 8)
    tie = (rng.uniform(-0.9, 0.9, (8, 32)) * 127 * t[:, None]).astype(np.float32)
    tie[:, 0] = 127 * t
    exact = tie.copy()
    exact[:, 0] = 127 * np.float16(t).astype(np.float32)
    exact[:, 1:] = np.clip(exact[:, 1:], -exact[:, :1], exact[:, :1])
    assert golden.fragility(codec, tie, codec.encode(tie), 1)["scale_fragile"].all()
    assert not golden.fragility(codec, exact, codec.encode(exact), 100)["scale_fragile"].any()


def test_summary_counts_are_the_masks(gdir):
    d, summary = gdir
    for row in summary.rows:
        a, m = load(d, row["format"])
        fam = golden.FAMILIES.index(row["family"])
        sel = a["family"] == fam
        assert row["blocks"] == int(sel.sum())
        assert row["fragile_values"] == int(a["fragile"][sel].sum())
        assert row["fragile_blocks"] == int(a["scale_fragile"][sel].sum())
    by = {(r["format"], r["family"]): r for r in summary.rows}
    # the edge family is built to hit boundaries: exact Q8/Q4 ties, fp16 ties, TBQ thresholds
    for fmt in FORMATS:
        assert by[(fmt, "edge")]["fragile_values"] > 50
    assert by[("q8_0", "edge")]["fragile_blocks"] >= 4 and by[("q4_0", "edge")]["fragile_blocks"] >= 4


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def test_cli_writes_files_progress_and_table(tmp_path, capsys, monkeypatch):
    import tbq.progress

    monkeypatch.setattr(
        tbq.progress, "stderr_is_terminal", lambda stream=None: True
    )  # progress only draws on a terminal
    out = tmp_path / "o"
    assert (
        run_golden(
            [
                "--formats",
                "q8_0,tbq4_0",
                "--families",
                "gaussian,edge",
                "--rows-per-family",
                "3",
                "--seed",
                "2",
                "--codebook",
                "turboq-mtp",
                "--signs",
                "17",
                "-k",
                "2",
                "--attention",
                "--attention-pairs",
                "q4_0:tbq4_0",
                "--tokens",
                "5",
                "--heads",
                "4",
                "--kv-heads",
                "4",
                "--n-sink",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    cap = capsys.readouterr()
    assert (
        "format  family" in cap.out and "fragile values  fragile scales" in cap.out and "fragile blocks" not in cap.out
    )
    assert golden.generate.__globals__["SUMMARY_NOTE"] in cap.out  # lines under the table explain both counts
    assert all(len(line) <= 100 for line in cap.out.splitlines())  # the tables fit 100 columns
    assert re.search(r"tbq4_0\s+edge\s+3\s+384", cap.out)
    assert "attention K" in cap.out and "q4_0" in cap.out
    # progress on stderr only: inputs, 2 formats, 1 attention pair
    assert "tbq golden: 3/4 tbq4_0" in cap.err and "tbq golden: 4/4 attention q4_0/tbq4_0" in cap.err
    assert "tbq golden" not in cap.out
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{s}.{e}" for s in ("q8_0", "tbq4_0", "attention_q4_0_tbq4_0") for e in ("npz", "json", "h")
    )
    m = json.loads((out / "tbq4_0.json").read_text())
    assert m["codec_config_named"]["codebook"] == "turboq-mtp" and m["fragility"]["k"] == 2
    assert m["generator"]["seed"] == 2 and [f["seed"] for f in m["generator"]["families"]] == [2001, 2004]
    assert tbq.codec_from_config(m["codec_config"]).rotation == tbq.get_codec("tbq4_0", signs=17).rotation
    am = json.loads((out / "attention_q4_0_tbq4_0.json").read_text())
    assert am["n_sink"] == 1 and am["n_head_kv"] == 4


def test_cli_codebook_and_signs_from_json(tmp_path, capsys):
    cb = tbq.get_codec("tbq3_0", codebook="turboq-mtp").codebook
    (tmp_path / "cb.json").write_text(
        json.dumps({"tbq3_0": {"centroids": cb.centroids.tolist(), "thresholds": cb.thresholds.tolist()}})
    )
    s1, s2 = tbq.get_codec("tbq3_0", signs=3).rotation.signs1, tbq.get_codec("tbq3_0", signs=3).rotation.signs2
    (tmp_path / "signs.json").write_text(json.dumps({"signs1": s1.tolist(), "signs2": s2.tolist()}))
    assert (
        run_golden(
            [
                "--formats",
                "tbq3_0",
                "--rows-per-family",
                "1",
                "--quiet",
                "--codebook",
                str(tmp_path / "cb.json"),
                "--signs",
                str(tmp_path / "signs.json"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == ""
    a, m = load(tmp_path / "o", "tbq3_0")
    assert np.array_equal(tbq.quantize(a["input"], "tbq3_0", codebook="turboq-mtp", signs=3), a["bytes"])


@pytest.mark.parametrize(
    "argv,exc,msg",
    [
        (["--formats", "q9_9"], ConfigError, "unknown format"),
        (["--families", "gaussian,laplace"], ConfigError, "unknown family"),
        (["--rows-per-family", "0"], TbqValueError, "positive integer"),
        (["--blocks", "-3"], TbqValueError, "positive integer"),
        (["--seed", "-1"], TbqValueError, "non-negative"),
        (["-k", "-1"], TbqValueError, "non-negative"),
        (["--codebook", "nope"], ConfigError, "unknown codebook"),
        (["--attention", "--attention-pairs", "q8_0-tbq4_0"], ConfigError, "K_FORMAT:V_FORMAT"),
        (["--attention", "--heads", "6", "--kv-heads", "4"], TbqValueError, "multiple"),
        (["--tokens", "0"], TbqValueError, "tokens must be an integer >= 1"),
        (["--kv-heads", "0"], TbqValueError, "n_head_kv must be an integer >= 1"),
        (["--n-sink", "40"], TbqValueError, "cannot exceed tokens"),
        (["--ulp-floor", "-1"], TbqValueError, "ulp_floor"),
        (["--ulp-floor", "nan"], TbqValueError, "ulp_floor"),
    ],
)
def test_cli_bad_input(tmp_path, argv, exc, msg):
    with pytest.raises(exc, match=msg):
        run_golden(["--quiet", "--formats", "q8_0", "--rows-per-family", "1", *argv, "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()  # validated before anything is written


def test_tbq_cli_main(tmp_path, capsys):
    from tbq import cli

    assert cli.main(["golden", "--formats", "q4_0", "--rows-per-family", "1", "--out", str(tmp_path)]) == 0
    assert "q4_0" in capsys.readouterr().out and (tmp_path / "q4_0.h").exists()
    assert cli.main(["golden", "--formats", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown format" in capsys.readouterr().err


def _cli_error(capsys, argv) -> str:
    """Run ``tbq golden argv`` in-process: exit code 2 and exactly one stderr line, which is returned."""
    from tbq import cli

    assert cli.main(["golden", *argv]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tbq golden: error: "), cap.err
    assert "Traceback" not in cap.err and cap.out == ""
    return lines[0]


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--rows-per-family", "0"], "rows per family"),
        (["--blocks", "0"], "rows per family"),
        (["--tokens", "0"], "tokens must be an integer >= 1, got 0"),
        (["-k", "-1"], "fragility margin"),
        (["--heads", "6", "--kv-heads", "4"], "n_head (6) must be a multiple of n_head_kv (4)"),
        (["--kv-heads", "0"], "n_head_kv must be an integer >= 1"),
        (["--formats", "q4_0,q9_9"], "unknown format"),
        (["--families", "gaussian,laplace"], "unknown family 'laplace'"),
        (["--seed", "-2"], "seed must be a non-negative integer"),
    ],
)
def test_cli_out_of_range_numbers_exit_2_with_one_line(tmp_path, capsys, argv, msg):
    line = _cli_error(capsys, ["--formats", "q8_0", *argv, "--out", str(tmp_path / "o")])
    assert msg in line
    assert not (tmp_path / "o").exists()


def test_cli_refuses_an_out_under_a_regular_file_before_any_work(tmp_path, capsys, monkeypatch):
    f = tmp_path / "file"
    f.write_text("x")
    gen = importlib.import_module("tbq.golden.generate")  # the module (tbq.golden.generate is the function)
    called = []
    monkeypatch.setattr(gen, "make_inputs", lambda *a, **k: called.append(1))
    assert "output directory" in _cli_error(capsys, ["--out", str(f / "sub")]) and not called
    assert f"{f} is not a directory" in _cli_error(capsys, ["--out", str(f / "sub" / "deeper")])
    assert "exists and is not a directory" in _cli_error(capsys, ["--out", str(f)])
    # --from-manifest: refused before anything is regenerated
    assert "is not a directory" in _cli_error(capsys, ["--from-manifest", "nonexistent.json", "--out", str(f / "sub")])
    assert f.read_text() == "x" and not called


def test_cli_refuses_an_unwritable_out(tmp_path, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root may write anywhere: simulate the permission check for this one directory
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == ro else real(p, mode, **kw))
    else:
        ro.chmod(0o500)
    try:
        assert f"output directory {ro} is not writable" in _cli_error(capsys, ["--out", str(ro)])
        assert f"{ro} is not writable" in _cli_error(capsys, ["--out", str(ro / "new")])
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


def test_cli_bad_manifests_exit_2_with_one_line(tmp_path, capsys):
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text(json.dumps({"kind": "something else", "arrays": {}}))
    (tmp_path / "cut.json").write_text(
        json.dumps({"kind": "tbq-golden-format", "arrays": {"input": {"sha256": "0" * 64}}})
    )
    out = str(tmp_path / "o")
    assert "cannot read the manifest" in _cli_error(
        capsys, ["--from-manifest", str(tmp_path / "missing.json"), "--out", out]
    )
    assert "not a tbq golden manifest" in _cli_error(
        capsys, ["--from-manifest", str(tmp_path / "list.json"), "--out", out]
    )
    assert "not a tbq golden manifest" in _cli_error(
        capsys, ["--from-manifest", str(tmp_path / "other.json"), "--out", out]
    )
    assert "incomplete tbq golden manifest" in _cli_error(
        capsys, ["--from-manifest", str(tmp_path / "cut.json"), "--out", out]
    )


def test_cli_help_shows_every_default():
    p = parser()  # a plain argparse parser: the help texts themselves state the defaults
    text = " ".join(p.format_help().split())
    for action in p._actions:
        if action.dest == "help":
            continue
        assert action.help and "default" in action.help, action.option_strings
    assert "--rows-per-family N, --blocks N" in text
    assert "default: 18 = one row per edge kind)" in text and "(default: 0.0625 = 2^-4)" in text


def test_rows_per_family_and_its_old_name_blocks(tmp_path):
    a = parser().parse_args(["--blocks", "5", "--out", "x"])
    b = parser().parse_args(["--rows-per-family", "5", "--out", "x"])
    assert a.rows_per_family == b.rows_per_family == 5 and not hasattr(a, "blocks")
    assert golden.DEFAULT_ROWS_PER_FAMILY == golden.DEFAULT_BLOCKS == len(golden.EDGE_KINDS)
    s1 = golden.generate(tmp_path / "a", formats=["q8_0"], families=["edge"], rows_per_family=2)
    s2 = golden.generate(tmp_path / "b", formats=["q8_0"], families=["edge"], blocks=2)
    assert s1.rows == s2.rows and s1.rows[0]["blocks"] == 8
    assert (tmp_path / "a" / "q8_0.h").read_text() == (tmp_path / "b" / "q8_0.h").read_text()
    assert np.array_equal(golden.make_inputs(rows_per_family=2)["x"], golden.make_inputs(blocks=2)["x"])
    with pytest.raises(TbqValueError, match="disagree"):
        golden.make_inputs(rows_per_family=2, blocks=3)


def test_generate_reports_progress_and_prints_nothing(tmp_path, capsys):
    seen = []
    golden.generate(
        tmp_path,
        formats=["q8_0", "q4_0"],
        families=["gaussian"],
        rows_per_family=1,
        attention=True,
        attention_pairs="q8_0:q8_0",
        tokens=2,
        n_head=1,
        n_head_kv=1,
        progress=lambda label, done, total: seen.append((label, done, total)),
    )
    assert seen == [("inputs", 1, 4), ("q8_0", 2, 4), ("q4_0", 3, 4), ("attention q8_0/q8_0", 4, 4)]
    assert capsys.readouterr() == ("", "")
    with pytest.raises(TbqTypeError, match="progress"):
        golden.generate(tmp_path, formats=["q8_0"], progress=True)


def test_package_modules_import_one_way():
    """families, manifest, cheader at the bottom, then fragility, the settings, then generate; no module imports one
    above it."""
    order = ["families", "manifest", "cheader", "fragility", "settings", "generate"]
    src = Path(golden.__file__).parent
    for i, name in enumerate(order):
        text = (src / f"{name}.py").read_text()
        imported = set(re.findall(r"^from \.(\w+) import", text, re.M))
        assert imported <= set(order[:i]), (name, imported)
        assert not re.search(r"^[ \t]+(from|import) ", text, re.M), f"{name}: function-level import"


def test_attention_golden_outputs(gdir):
    d, summary = gdir
    from tbq.attention import KVCache, attention_dequantized

    a, m = load(d, "attention_q8_0_tbq3_0")
    assert a["k_sink"].shape == (2, 2, 136) and a["k_bytes"].shape == (10, 2, 136) and a["v_bytes"].shape == (10, 2, 50)
    K = KVCache("q8_0", a["k_bytes"], 128, {}, a["k_sink"], "q8_0")
    V = KVCache(
        "tbq3_0", a["v_bytes"], 128, {k: v for k, v in m["v_config"].items() if k != "name"}, a["v_sink"], "q8_0"
    )
    ref = attention_dequantized(a["q"], K, V)
    assert np.array_equal(ref, a["out_dequantized"])
    assert np.max(np.abs(a["out_rotated_f64"] - ref)) < 1e-12
    assert np.max(np.abs(a["out_rotated_f32"] - ref)) <= m["f32_tolerance"]
    assert np.array_equal(a["k_bytes"], tbq.quantize(a["k_input"][2:], "q8_0"))
    assert {(r["k_format"], r["v_format"]) for r in summary.attention} == {("tbq4_0", "tbq4_0"), ("q8_0", "tbq3_0")}


def test_module_docstring_examples():
    import doctest

    result = doctest.testmod(golden, extraglobs={"np": np})
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_golden_trace_fields_equal_the_encoder_on_zero_and_tie_edges(tmp_path, fmt):
    """Regression: scale_f32 (and TBQ's norm) is the encoder's own value on every edge block.

    The Q4_0 scale of an all -0.0 block is -0.0 (ggml's max starts at +0, d = +0 / -8);
    golden files once recorded +0.0 there. Checked against the slow model of tests/naive.py,
    bit for bit, on the zero, -0, constant and tie edge kinds.
    """
    gs = golden.build_format(fmt, rows_per_family=len(golden.EDGE_KINDS), families=["edge"], seed=3)
    a = gs.arrays
    kinds = [
        golden.EDGE_KINDS.index(k)
        for k in (
            "zero",
            "neg_zero",
            "const_0.5",
            "const_-0.5",
            "q4_ties",
            "q8_ties",
            "maxabs_sign_tie",
            "fp16_tie_q4",
            "fp16_tie_q8",
            "fp16_tie_tbq4",
        )
    ]
    rows = np.flatnonzero(np.isin(a["kind"], kinds))
    assert rows.size >= len(kinds)
    f = tbq.get_format(fmt)
    for i in rows:
        b, tr = naive.encode_block(f, a["input"][i])
        assert bytes(a["bytes"][i]) == b, (fmt, i)
        assert np.float32(a["scale_f32"][i]).view(np.uint32) == np.float32(tr["d"]).view(np.uint32), (
            fmt,
            i,
            a["scale_f32"][i],
            tr["d"],
        )
        if "norm" in a:
            assert np.float32(a["norm"][i]).view(np.uint32) == np.float32(tr["norm"]).view(np.uint32), (fmt, i)
    if fmt == "q4_0":
        neg = np.flatnonzero(a["kind"] == golden.EDGE_KINDS.index("neg_zero"))
        assert np.signbit(a["scale_f32"][neg]).all() and (a["bytes"][neg, :2] == [0, 0x80]).all()


def test_a_format_whose_block_spans_golden_rows_has_no_golden_set():
    """Golden sets are rows of 128 values, one C call per row: q8_k's 256-value block does not fit one (its
    C vectors and tbq check read two rows per block instead); it is refused by name and left out by default."""
    assert golden.golden_formats() == tuple(f for f in tbq.format_names() if f not in ("q8_k", "f32"))
    with pytest.raises(tbq.ConfigError, match="q8_k's 256-value block does not fit"):
        golden.build_format("q8_k", rows_per_family=1)


@pytest.mark.parametrize("fmt", ["vllm_tq4_k", "vllm_tq3_v"])
def test_a_golden_set_at_another_head_dim_has_that_instances_sizes_and_regenerates(tmp_path, fmt):
    """vLLM's TurboQuant block is one head (``head_dim`` is a format option; the registry's row is 128's): a golden
    set at head_dim 64 is two blocks per row with the instance's bytes, its manifest and header say so, and it
    regenerates from its manifest bit for bit; at head_dim 256 the block does not fit a row and is refused."""
    opts = {"head_dim": 64}
    gs = golden.build_format(fmt, rows_per_family=2, seed=3, options=opts)
    a, m = gs.arrays, gs.manifest
    info = tbq.get_format(fmt, **opts).info
    assert (m["block_size"], m["type_size"], m["blocks_per_row"]) == (64, info.type_size, 2)
    assert m["codec_config"]["head_dim"] == 64
    rows = a["input"].reshape(-1, 128)
    assert a["bytes"].shape == (2 * rows.shape[0], info.type_size)
    assert_bytes_equal(a["bytes"].reshape(rows.shape[0], -1), tbq.quantize(rows, fmt, backend="numpy", **opts), fmt)
    assert a["fragile"].shape == a["input"].shape == (2 * rows.shape[0], 64)
    P = f"TBQ_GOLDEN_{fmt.upper()}"
    assert f"#define {P}_BLOCK_SIZE 64\n" in gs.header and f"#define {P}_TYPE_SIZE {info.type_size}\n" in gs.header
    golden.write_set(gs, tmp_path)
    again = golden.regenerate(tmp_path / f"{fmt}.json")
    assert again.manifest["arrays"] == m["arrays"] and again.header == gs.header
    with pytest.raises(tbq.ConfigError, match=f"{fmt}'s with .*256-value block does not fit"):
        golden.build_format(fmt, rows_per_family=1, options={"head_dim": 256})


@pytest.mark.parametrize("fmt", [*golden.golden_formats(), "f32"])  # every format but q8_k (the test above)
def test_every_format_gets_a_consistent_golden_set(tmp_path, fmt):
    """Any registered format: bytes and decoded floats equal the library's, masks are 0/1 and shaped,
    scale_f32 exists exactly for fp16-scale formats, and the set regenerates from its manifest bit for bit."""
    gs = golden.build_format(fmt, rows_per_family=3, seed=2)
    a, m = gs.arrays, gs.manifest
    info = tbq.format_info(fmt)
    rows = a["input"].reshape(-1, 128)
    assert_bytes_equal(a["bytes"].reshape(rows.shape[0], -1), tbq.quantize(rows, fmt, backend="numpy"), fmt)
    assert_bits_equal(a["decoded"], tbq.dequantize(a["bytes"], fmt, backend="numpy"), fmt)
    nb = rows.shape[0] * 128 // info.block_size
    assert a["fragile"].shape == (nb, info.block_size) and set(np.unique(a["fragile"])) <= {0, 1}
    assert a["scale_fragile"].shape == (nb,) and set(np.unique(a["scale_fragile"])) <= {0, 1}
    has_d = any(f.name == "d" and f.kind == "f16" for f in info.layout)
    assert ("scale_f32" in a) == has_d
    if has_d:  # the stored fp16 scale is fp16 of scale_f32, signed zeros included
        stored = tbq.get_format(fmt).fields(a["bytes"])["d"].reshape(-1)
        assert_bits_equal(stored, a["scale_f32"].astype(np.float16).astype(np.float32), fmt)
    if "decode_tolerance" in a:
        assert (a["decode_tolerance"] >= 0).all() and a["decode_tolerance"].shape == a["decoded"].shape
    assert set(m["array_meaning"]) == set(a)
    # the correctness claim: the slow independent model (tests/naive*.py) gives the same bytes and floats
    f = tbq.codec_from_config(m["codec_config"]).format
    if naive.has_model(f) and not f.row_rule:
        blocks = a["input"].reshape(nb, info.block_size)
        for i in range(0, nb, max(1, nb // 48)):  # about 48 blocks over every family
            b, _ = naive.encode_block(f, blocks[i])
            assert bytes(a["bytes"][i]) == b, (fmt, i)
            want = np.array(naive.decode_block(f, b), np.float32)
            assert_bits_equal(a["decoded"][i], want, f"{fmt} block {i}")
    golden.write_set(gs, tmp_path)
    again = golden.regenerate(tmp_path / f"{fmt}.json")
    for key in a:
        assert np.array_equal(again.arrays[key].view(np.uint8), a[key].view(np.uint8)), (fmt, key)


def test_generate_takes_its_settings_as_keywords_or_as_one_golden_settings(tmp_path):
    """The same files either way; a GoldenSettings is frozen and checked at construction; both ways at once is
    refused naming the keywords."""
    import dataclasses

    from tbq.errors import ConfigError, TbqValueError
    from tbq.golden.settings import GoldenSettings

    a = golden.generate(tmp_path / "a", formats=["q8_0"], families=["edge"], rows_per_family=2, seed=5)
    s = GoldenSettings(formats="q8_0", families="edge", rows_per_family=2, seed=5)
    b = golden.generate(tmp_path / "b", settings=s)
    for p, q in zip(a.paths, b.paths, strict=True):
        assert p.name == q.name and p.read_bytes() == q.read_bytes()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 1  # type: ignore[misc]
    with pytest.raises(TbqValueError, match="n_sink"):
        GoldenSettings(tokens=4, n_sink=5)
    with pytest.raises(ConfigError, match=r"not both \(seed given as keywords\)"):
        golden.generate(tmp_path / "c", settings=s, seed=6)
    with pytest.raises(ConfigError, match=r"not both \(seed, blocks given as keywords\)"):  # blocks: the old name
        golden.generate(tmp_path / "c", settings=s, seed=6, blocks=2)
    with pytest.raises(ConfigError, match="unknown tbq.golden.GoldenSettings field colour"):
        GoldenSettings.of(s, {"colour": 1})
    assert GoldenSettings.of(s, {"seed": 6}).seed == 6
