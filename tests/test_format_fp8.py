"""fp8_e4m3 and fp8_e5m2: the format battery, NVIDIA's conformance vectors (every scale, both overflow modes, every
byte pattern), NVIDIA's host conversion compiled from the CUDA toolkit's header as an oracle, the slow model, the
scale option and each rule of docs/formats.md ("FP8_E4M3 / FP8_E5M2")."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import BACKENDS, assert_bits_equal, assert_bytes_equal, check_format, load_npz
from naive_fp8 import encode_block as naive_encode

import tbq

FORMATS = ("fp8_e4m3", "fp8_e5m2")
C_DIR = Path(__file__).parent / "c"


def f32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


@pytest.mark.parametrize("scale", [1.0, 0.0173])
@pytest.mark.parametrize("fmt", FORMATS)
def test_passes_the_format_battery(fmt, scale):
    check_format(fmt, scale=scale)


# ---------------------------------------------------------------------------
# NVIDIA's vectors (tests/data/conformance/fp8_*__cuda.npz, from cuda_fp8.hpp's host path)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_conformance_vectors(fmt, backend):
    ref = load_npz(f"{fmt}__cuda")
    x = load_npz("inputs")["x"]
    assert ref["scales"].tolist() == [1.0, 0.0625, np.float32(0.0173), np.float32(7.3)]
    overflowed = 0
    for i, s in enumerate(ref["scales"]):
        q = tbq.quantize(x, fmt, scale=s, on_overflow="saturate", backend=backend)
        assert_bytes_equal(q, ref[f"q_{i}"], f"{fmt} scale {s} saturating encode ({backend})")
        qn = tbq.quantize(x, fmt, scale=s, on_overflow="inf", backend=backend)
        assert_bytes_equal(qn, ref[f"q_nosat_{i}"], f"{fmt} scale {s} non-saturating encode ({backend})")
        assert_bits_equal(
            tbq.dequantize(ref[f"q_{i}"], fmt, scale=s, backend=backend), ref[f"y_{i}"], f"{fmt} scale {s} decode"
        )
        every = tbq.dequantize(np.arange(256, dtype=np.uint8), fmt, scale=s, backend=backend)
        assert_bits_equal(every, ref[f"dec_all_{i}"], f"{fmt} scale {s}: every byte decoded ({backend})")
        overflowed += int((q != qn).sum())
        # the default refuses, naming the first value whose x / s does not fit
        over = np.flatnonzero(q.reshape(-1) != qn.reshape(-1))
        if over.size:
            with pytest.raises(tbq.ScaleOverflowError, match=f"value {over[0]} ") as e:
                tbq.quantize(x, fmt, scale=s, backend=backend)
            assert e.value.block == over[0]
        else:
            assert_bytes_equal(tbq.quantize(x, fmt, scale=s, backend=backend), q, f"{fmt} scale {s} default")
    assert overflowed > 0  # the vectors exercise both overflow behaviours


def test_vectors_hold_the_hazards():
    """The vectors are not vacuous: subnormal codes, saturated codes, NaN/inf bytes and signed zeros occur."""
    for fmt, sat, nosat in (("fp8_e4m3", 0x7E, 0x7F), ("fp8_e5m2", 0x7B, 0x7C)):
        ref = load_npz(f"{fmt}__cuda")
        q = np.concatenate([ref[f"q_{i}"].reshape(-1) for i in range(4)])
        qn = np.concatenate([ref[f"q_nosat_{i}"].reshape(-1) for i in range(4)])
        mag = q & 0x7F
        assert ((mag > 0) & (mag < (8 if fmt == "fp8_e4m3" else 4))).any()  # subnormals
        assert (mag == sat).any() and ((qn & 0x7F) == nosat).any() and (q == 0x80).any()


# ---------------------------------------------------------------------------
# NVIDIA's host conversion (cuda_fp8.hpp) as an oracle, compiled with g++ where the header exists
# ---------------------------------------------------------------------------


def _cuda_include():
    cands = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(str(Path(os.path.realpath(nvcc)).parents[1]))
    cands += sorted(str(p) for p in Path("/usr/local").glob("cuda-*"))
    for c in cands:
        if c and (Path(c) / "include" / "cuda_fp8.hpp").exists():
            return Path(c) / "include"
    return None


@pytest.fixture(scope="module")
def cuda_oracle(tmp_path_factory):
    inc, cxx = _cuda_include(), shutil.which("g++") or shutil.which("c++")
    if inc is None:
        pytest.skip(
            "no CUDA toolkit header cuda_fp8.hpp on this machine (CUDA_HOME, nvcc, /usr/local/cuda*): NVIDIA's host conversion is not available as an oracle"
        )
    if cxx is None:
        pytest.skip("no C++ compiler (g++ or c++) on PATH: cannot build the cuda_fp8.hpp oracle")
    exe = tmp_path_factory.mktemp("fp8oracle") / "oracle"
    subprocess.run(
        [cxx, "-O1", "-ffp-contract=off", f"-I{inc}", str(C_DIR / "fp8_cuda_oracle.cpp"), "-o", str(exe)],
        check=True,
        capture_output=True,
    )

    def run(x, s):
        x = np.ascontiguousarray(x, np.float32).reshape(-1)
        inp = np.float32(s).tobytes() + np.uint32(x.size).tobytes() + x.tobytes()
        out = subprocess.run([str(exe)], input=inp, capture_output=True, check=True).stdout
        n, res, pos = x.size, {}, 0
        for fmt in FORMATS:
            res[fmt] = {}
            for key in ("sat", "nosat"):
                res[fmt][key] = np.frombuffer(out, np.uint8, n, pos)
                pos += n
            res[fmt]["decode"] = np.frombuffer(out, np.float32, 256, pos)
            pos += 1024
        return res

    return run


def _hard_values() -> np.ndarray:
    """Every finite value of both grids, every midpoint between neighbours, one and two float32 ulps either side,
    the saturation edges, float32 subnormals, huge values and random bits, both signs."""
    vals = []
    for fmt in FORMATS:
        g = tbq.get_format(fmt).grid.values.astype(np.float64)
        fin = np.unique(np.abs(g[np.isfinite(g)]))
        mids = (fin[:-1] + fin[1:]) / 2
        top = fin[-1] + (fin[-1] - fin[-2]) / 2  # the tie above the largest finite value
        vals += [fin, mids, [top, 2 * fin[-1], fin[-1] * 1.0001]]
    v = np.concatenate([np.asarray(a, np.float64) for a in vals]).astype(np.float32)
    u = v.view(np.uint32)
    near = np.concatenate([u, u + 1, u - 1, u + 2, u - 2]).view(np.float32)
    extra = np.float32([1e-45, 1e-40, 1.1754942e-38, 3e38, np.finfo(np.float32).max, 0.0])
    rng = np.random.default_rng(5)
    rand = rng.integers(0, 0x7F800000, 20000, dtype=np.uint32).view(np.float32)
    a = np.concatenate([near, extra, rand])
    a = a[np.isfinite(a)]
    return np.concatenate([a, -a])


@pytest.mark.parametrize("scale", [1.0, 0.0173, 7.3, 2.0**-20, 1e-3, 3.0e30])
def test_nvidia_host_conversion_oracle(cuda_oracle, scale):
    x = _hard_values()
    want = cuda_oracle(x, scale)
    for fmt in FORMATS:
        for backend in BACKENDS:
            got = tbq.quantize(x, fmt, scale=scale, on_overflow="saturate", backend=backend)
            assert_bytes_equal(got, want[fmt]["sat"], f"{fmt} scale {scale} saturating vs cuda_fp8.hpp ({backend})")
            got = tbq.quantize(x, fmt, scale=scale, on_overflow="inf", backend=backend)
            assert_bytes_equal(
                got, want[fmt]["nosat"], f"{fmt} scale {scale} non-saturating vs cuda_fp8.hpp ({backend})"
            )
            every = tbq.dequantize(np.arange(256, dtype=np.uint8), fmt, scale=scale, backend=backend)
            assert_bits_equal(every, want[fmt]["decode"], f"{fmt} scale {scale} decode vs cuda_fp8.hpp ({backend})")


# ---------------------------------------------------------------------------
# the rules, one at a time
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_round_to_even_and_the_saturation_edge(backend):
    q = lambda fmt, v, **kw: tbq.quantize(np.float32(v), fmt, backend=backend, **kw).tolist()  # noqa: E731
    # E4M3: 1.0625 is halfway between 1.0 (0x38) and 1.125 (0x39): even 0x38; 1.1875 -> 1.25 (0x3A)
    assert q("fp8_e4m3", [1.0625, 1.1875, -1.0625]) == [0x38, 0x3A, 0xB8]
    # 448 < |v| <= 464 rounds to 448 (the tie 464 goes to the even 0x7E); above 464 overflows
    assert q("fp8_e4m3", [449.0, 464.0]) == [0x7E, 0x7E]
    with pytest.raises(tbq.ScaleOverflowError, match="value 0 is 464.00003"):
        q("fp8_e4m3", [np.nextafter(np.float32(464), np.float32(1e9))])
    assert q("fp8_e4m3", [465.0, -1e30], on_overflow="saturate") == [0x7E, 0xFE]
    assert q("fp8_e4m3", [465.0, -1e30], on_overflow="inf") == [0x7F, 0xFF]
    # E5M2: the tie 61440 above 57344 rounds to the even code 0x7C (inf): an overflow
    assert q("fp8_e5m2", [57344.0, 61439.996]) == [0x7B, 0x7B]
    assert q("fp8_e5m2", [61440.0, -61440.0], on_overflow="saturate") == [0x7B, 0xFB]
    assert q("fp8_e5m2", [61440.0, -61440.0], on_overflow="inf") == [0x7C, 0xFC]
    # subnormals, and the half of the smallest one rounds to (signed) zero
    assert q("fp8_e4m3", [2.0**-9, 2.0**-10, -(2.0**-10), 1.5 * 2.0**-9, 2.0**-7 * 0.999]) == [1, 0, 0x80, 2, 4]
    assert q("fp8_e5m2", [2.0**-16, 2.0**-17, 3 * 2.0**-17]) == [1, 0, 2]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [7.3, 0.011])
def test_the_scale_divides(backend, scale):
    """x / s is a float32 division: values where x * (1/s) rounds differently encode as the division says.

    (For 0.0173, x / s and x * (1/s) differ for under 1 % of inputs and never next to a midpoint in this search;
    for 7.3 and 0.011 they differ for 23 % and 45 % and change bytes.)"""
    s = np.float32(scale)
    g = tbq.get_format("fp8_e4m3").grid
    fin = np.unique(np.abs(g.values[np.isfinite(g.values)]).astype(np.float64))
    mids = ((fin[:-1] + fin[1:]) / 2 * np.float64(s)).astype(np.float32).view(np.uint32)
    x = np.concatenate([(mids.astype(np.int64) + k).astype(np.uint32) for k in range(-64, 65)]).view(
        np.float32
    )  # inputs next to rounding midpoints
    div, mul = x / s, x * (np.float32(1) / s)
    from tbq.formats.fp8 import fp8_codes

    differ = fp8_codes(div, g, True) != fp8_codes(mul, g, True)
    assert differ.any()  # a multiply by the reciprocal would give other bytes here
    got = tbq.quantize(x[differ], "fp8_e4m3", scale=s, on_overflow="saturate", backend=backend)
    assert_bytes_equal(got, fp8_codes(div[differ], g, True), "division")


def test_the_slow_model_agrees_on_hard_values():
    x = _hard_values()[::7]
    for fmt in FORMATS:
        for scale in (1.0, 0.0173):
            f = tbq.get_format(fmt, scale=scale)
            for saturate, mode in ((False, "inf"), (True, "saturate")):
                got = tbq.quantize(x, fmt, scale=scale, on_overflow=mode, backend="numpy")
                want = np.frombuffer(b"".join(naive_encode(f, [v], saturate)[0] for v in x), np.uint8)
                assert_bytes_equal(got, want, f"{fmt} scale {scale} {mode} vs tests/naive_fp8.py")


@pytest.mark.parametrize("fmt", FORMATS)
def test_scale_option(fmt):
    f = tbq.get_format(fmt, scale=0.0173)
    assert f.config() == {"scale": float(np.float32(0.0173))} and f.scale.dtype == np.float32
    assert tbq.get_format(fmt, **f.config()) == f != tbq.get_format(fmt)
    assert tbq.get_format(fmt).config() == {"scale": 1.0}
    assert tbq.get_codec(fmt, scale=2).get_config()["scale"] == 2.0
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-50, 1e39, True, "1.0", None, [1.0]):
        with pytest.raises(tbq.ConfigError, match=f"{fmt}: scale"):
            tbq.get_format(fmt, scale=bad)
    with pytest.raises(tbq.ConfigError, match="on_overflow must be one of"):
        tbq.get_codec("q8_0", on_overflow="saturate")  # a choice of the FP8 formats only
    with pytest.raises(tbq.ConfigError, match="no option 'scale'"):
        tbq.get_codec("q8_0", scale=1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_specials(backend):
    y = lambda fmt, b, s=1.0: tbq.dequantize(np.uint8(b), fmt, scale=s, backend=backend).view(np.uint32).tolist()  # noqa: E731
    assert y("fp8_e4m3", [0x7F, 0xFF, 0x80, 0x7E, 0x01], 2.0) == [
        0x7FFFFFFF,
        0x7FFFFFFF,
        0x80000000,
        f32(0).dtype.type(896).view(np.uint32),
        f32(0).dtype.type(2.0**-8).view(np.uint32),
    ]
    assert y("fp8_e5m2", [0x7C, 0xFC, 0x7D, 0xFE, 0x7B]) == [
        0x7F800000,
        0xFF800000,
        0x7FFFFFFF,
        0x7FFFFFFF,
        np.float32(57344).view(np.uint32),
    ]


def test_c_kernel_matches(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (gcc or cc) on PATH: tests/c/fp8.c cannot be built")
    import ctypes

    x = _hard_values()
    for scale, sat in ((1.0, 0), (0.0173, 1)):
        lib = tmp_path / f"libfp8_{sat}.so"
        subprocess.run(
            [
                cc,
                "-O2",
                "-shared",
                "-fPIC",
                "-ffp-contract=off",
                f"-DFP8_SCALE={float(np.float32(scale)).hex()}f",
                f"-DFP8_SATURATE={sat}",
                str(C_DIR / "fp8.c"),
                "-o",
                str(lib),
            ],
            check=True,
            capture_output=True,
        )
        dll = ctypes.CDLL(str(lib))
        for fmt in FORMATS:
            want = tbq.quantize(x, fmt, scale=scale, on_overflow="saturate" if sat else "inf")
            got = np.zeros_like(want)
            getattr(dll, f"quantize_row_{fmt}_ref")(
                x.ctypes.data_as(ctypes.c_void_p), got.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.size)
            )
            assert_bytes_equal(got, want, f"tests/c/fp8.c {fmt} scale {scale}")
            b = np.arange(256, dtype=np.uint8)
            yc = np.zeros(256, np.float32)
            getattr(dll, f"dequantize_row_{fmt}")(
                b.ctypes.data_as(ctypes.c_void_p), yc.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(256)
            )
            assert_bits_equal(yc, tbq.dequantize(b, fmt, scale=scale), f"tests/c/fp8.c {fmt} decode")


def test_tbq_check_cli_with_the_scale_option(tmp_path, capsys):
    """`tbq check --option scale=...` checks a kernel built for that scale: exact with the right scale, wrong with another."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (gcc or cc) on PATH: tests/c/fp8.c cannot be built")
    from tbq.cli import main

    lib = tmp_path / "libfp8.so"
    subprocess.run(
        [
            cc,
            "-O2",
            "-shared",
            "-fPIC",
            "-ffp-contract=off",
            f"-DFP8_SCALE={float(np.float32(0.0173)).hex()}f",
            str(C_DIR / "fp8.c"),
            "-o",
            str(lib),
        ],
        check=True,
        capture_output=True,
    )
    common = [
        "check",
        "--lib",
        str(lib),
        "--format",
        "fp8_e5m2",
        "--examples",
        "0",
        "--blocks",
        "2000",
        "--quiet",
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(common + ["--option", "scale=0.0173"]) == 0
    assert main(common) == 1  # the default scale 1.0 is not what this kernel divides by
    capsys.readouterr()
    assert main(["compare", "--formats", "q8_0", "--option", "scale=2"]) == 2
    assert "'scale' is not an option of q8_0; the formats that take it: fp8_e4m3, fp8_e5m2" in capsys.readouterr().err


def test_golden_records_the_scale_and_regenerates_bit_for_bit(tmp_path):
    from tbq.golden import generate, regenerate

    generate(tmp_path / "g", formats=["fp8_e4m3", "q8_0"], rows_per_family=8, options={"scale": 0.0173})
    m = __import__("json").loads((tmp_path / "g" / "fp8_e4m3.json").read_text())
    assert m["codec_config"] == {"name": "fp8_e4m3", "on_overflow": "saturate", "scale": float(np.float32(0.0173))}
    again = regenerate(tmp_path / "g" / "fp8_e4m3.json")
    with np.load(tmp_path / "g" / "fp8_e4m3.npz") as z:
        for key in z.files:
            assert z[key].tobytes() == np.asarray(again.arrays[key]).tobytes(), key
        x = z["input"].view(np.float32).reshape(-1)
        assert_bytes_equal(
            z["bytes"].reshape(-1), tbq.quantize(x, "fp8_e4m3", scale=0.0173, on_overflow="saturate"), "golden bytes"
        )
    with pytest.raises(tbq.ConfigError, match="the formats that take it: fp8_e4m3, fp8_e5m2"):
        generate(tmp_path / "h", formats=["q8_0"], options={"scale": 2.0})
