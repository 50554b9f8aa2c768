"""f16 and bf16: the shared format battery, the C decoder's random-byte vectors, gguf-py, and each quirk of the spec."""

import numpy as np
import pytest
from helpers import BACKENDS, assert_bits_equal, assert_bytes_equal, check_format, load_npz
from naive_f16 import bf16_bits as naive_bf16_bits
from naive_f16 import f16_to_f32_bits

import tbq

FORMATS = ("f16", "bf16")


def words(fmt, x, backend, **kw):
    """The encoded 16-bit words of float32 values."""
    return tbq.quantize(np.asarray(x, np.float32), fmt, backend=backend, **kw).view("<u2")


def f32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_passes_the_format_battery(fmt):
    check_format(fmt)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_random_vectors(fmt, backend):
    """C decoder on random bytes (f16 words forced finite; bf16 words unrestricted: inf and NaN payloads compare bit for bit)."""
    ref = load_npz(f"decode_random/{fmt}__strict")
    assert_bits_equal(tbq.dequantize(ref["q"], fmt, backend=backend), ref["y"], f"{fmt} decode_random {backend}")
    if fmt == "bf16":
        assert np.isnan(ref["y"]).any()  # the payload comparison above is not vacuous


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_f16_pattern_decodes_like_ggml(backend):
    """All 2**16 words: the exact widening, and signalling NaNs come out quiet (0x7C01 -> 0x7FC02000), as the
    C routine's multiply by 2**-112 makes them; numpy's own cast would give 0x7F802000."""
    h = np.arange(1 << 16, dtype=np.uint32).astype("<u2")
    want = f32([f16_to_f32_bits(int(w)) for w in h])
    y = tbq.dequantize(h.view(np.uint8), "f16", backend=backend)
    assert_bits_equal(y, want, f"f16 {backend}")
    assert y.view(np.uint32)[0x7C01] == 0x7FC02000 and y.view(np.uint32)[0xFC01] == 0xFFC02000
    assert h.view(np.float16).astype(np.float32).view(np.uint32)[0x7C01] == 0x7F802000  # what the quirk is about


def test_the_integer_widening_matches_on_every_f16_word():
    """The decoder's path for CPUs without F16C (``tbq.kernels.f16_widen_bits``), on all 2**16 words, whichever
    path this machine's decoder takes."""
    from tbq.kernels import f16_widen_bits

    want = [f16_to_f32_bits(w) for w in range(1 << 16)]
    assert [int(f16_widen_bits(np.uint16(w))) for w in range(1 << 16)] == want


def test_the_decoder_compiled_for_a_cpu_without_f16c_decodes_every_word(tmp_path):
    """``NUMBA_CPU_NAME=generic`` (no F16C): ``f16_widen`` must not emit ``fpext half``, which LLVM then lowers to
    a runtime call numba does not link (the process dies); the integer path gives the same bits."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np, tbq, tbq.kernels as k\n"
        "assert not k.TARGET_F16C\n"
        "h = np.arange(1 << 16, dtype=np.uint32).astype('<u2')\n"
        "np.save('y.npy', tbq.dequantize(h.view(np.uint8), 'f16', backend='numba').view(np.uint32))\n"
    )
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NUMBA_CPU_FEATURES", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    want = np.asarray([f16_to_f32_bits(w) for w in range(1 << 16)], np.uint32)
    assert np.array_equal(np.load(tmp_path / "y.npy"), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_bf16_pattern_decodes_to_its_upper_half(backend):
    h = np.arange(1 << 16, dtype=np.uint32)
    y = tbq.dequantize(h.astype("<u2").view(np.uint8), "bf16", backend=backend)
    assert np.array_equal(y.view(np.uint32), h << 16)  # NaN payloads included


def _f16_boundaries():
    """Every finite fp16 value, every midpoint between neighbours, and one float32 ulp either side, both signs."""
    v = np.arange(0x7C00, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)
    mid = (v[:-1] + v[1:]) / 2
    mid = np.append(mid, 65520.0)[:-1]  # 65520 itself overflows: the battery and the quirk tests cover it
    pts = np.concatenate([v, mid]).astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0))])
    pts = pts[np.abs(pts) < 65520]
    return np.concatenate([pts, -pts])


def _bf16_boundaries(rng):
    """Float32 patterns on and next to bf16 rounding ties (low 16 bits 0x7FFF, 0x8000, 0x8001) in every exponent."""
    hi = rng.integers(0, 0x7F7F, 1 << 18, dtype=np.uint32)
    lo = rng.choice(np.array([0x7FFF, 0x8000, 0x8001, 0x0000, 0xFFFF], np.uint32), hi.size)
    u = (hi << np.uint32(16)) | lo
    u |= rng.integers(0, 2, u.size, dtype=np.uint32) << np.uint32(31)
    return u.view(np.float32)


def _oracle_data(name, fmt):
    rng = np.random.default_rng({"gaussian": 11, "student_t": 12, "tiny": 13, "large": 14, "ties": 15}[name])
    n = 1 << 20
    if name == "gaussian":
        return rng.standard_normal(n, dtype=np.float32)
    if name == "student_t":
        return rng.standard_t(2, n).astype(np.float32)
    if name == "tiny":  # fp16 subnormals and underflow to signed zero
        return (rng.standard_normal(n) * 1e-6).astype(np.float32)
    if name == "large":
        return (rng.standard_normal(n) * 1e3).astype(np.float32)
    return _f16_boundaries() if fmt == "f16" else _bf16_boundaries(rng)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dist", ["gaussian", "student_t", "tiny", "large", "ties"])
def test_matches_gguf_py(fmt, dist):
    """gguf-py's quantizer (f16: numpy astype; bf16: the bit rule) and dequantizer, ~1M values per distribution.

    No signed-zero or NaN differences apply here: both formats store the sign of zero as it
    is, and the inputs are finite (NaN is the only input where gguf-py differs from C).
    """
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    qtype = getattr(gguf.GGMLQuantizationType, fmt.upper())
    x = _oracle_data(dist, fmt)
    ref = np.asarray(quants.quantize(x, qtype)).view(np.uint8)  # gguf-py returns f16 as float16 words
    for backend in BACKENDS:
        q = tbq.quantize(x, fmt, backend=backend, on_overflow="inf")  # t(2) tails may pass 65520 (gguf stores inf)
        assert_bytes_equal(q, ref, f"{fmt} {dist} {backend}")
        assert_bits_equal(
            tbq.dequantize(q, fmt, backend=backend), quants.dequantize(ref, qtype), f"{fmt} {dist} {backend} decode"
        )
    if dist == "ties":  # the data does sit on ties: they round to even, not up
        h = ref.view("<u2")
        assert np.count_nonzero(h & 1) < 0.45 * h.size


@pytest.mark.parametrize("backend", BACKENDS)
def test_f16_rounding_quirks(backend):
    t25 = np.float32(2.0**-25)
    cases = [
        (0.0, 0x0000),
        (-0.0, 0x8000),  # signed zero kept
        (t25, 0x0000),  # exactly 2**-25: the tie goes to the even 0
        (-t25, 0x8000),
        (np.nextafter(t25, np.float32(1)), 0x0001),  # just above: the smallest subnormal
        (3 * t25, 0x0002),  # 1.5 subnormal steps: tie to even 2
        (5 * t25, 0x0002),  # 2.5 steps: tie to even 2
        (2.0**-14 - 2.0**-25, 0x0400),  # tie between 0x03FF (odd) and the smallest normal: carries into the exponent
        (2.0**-14, 0x0400),
        (-(2.0**-24), 0x8001),
        (1.0 + 2.0**-11, 0x3C00),  # tie between 1 and 1 + 2**-10: even
        (1.0 + 3 * 2.0**-11, 0x3C02),
        (65504.0, 0x7BFF),
        (65519.99609375, 0x7BFF),  # the largest float32 below 65520 still rounds to 65504
    ]
    x = np.array([v for v, _ in cases], np.float32)
    assert words("f16", x, backend).tolist() == [h for _, h in cases]


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_rounding_quirks(backend):
    cases = {
        0x3F808000: 0x3F80,  # tie, kept part even: stays
        0x3F818000: 0x3F82,  # tie, kept part odd: rounds up to even
        0x3F807FFF: 0x3F80,
        0x3F808001: 0x3F81,
        0x00008000: 0x0000,  # a float32 subnormal tie: rounded on the bits, not flushed
        0x00008001: 0x0001,
        0x00018000: 0x0002,
        0x007FFFFF: 0x0080,  # the largest subnormal carries into the smallest normal bf16
        0x80000000: 0x8000,  # -0
        0x7F7F7FFF: 0x7F7F,  # just below the top tie: the largest finite bf16
        0xFF7F7FFF: 0xFF7F,
    }
    x = f32(list(cases))
    assert words("bf16", x, backend).tolist() == list(cases.values())
    assert words("bf16", x, backend).tolist() == [naive_bf16_bits(v) for v in x]


def test_bf16_nan_rule_of_the_reference_helper():
    """NaN never reaches the encoder (the codec refuses it), but the spec's NaN rule is the reference's: forced quiet."""
    from tbq.formats.f16 import bf16_bits

    u = np.array([0x7F800001, 0xFFFFFFFF, 0x7FC00000, 0xFF812345], np.uint32)
    assert bf16_bits(u.view(np.float32)).tolist() == [0x7FC0, 0xFFFF, 0x7FC0, 0xFFC1]
    assert [naive_bf16_bits(v) for v in u.view(np.float32)] == [0x7FC0, 0xFFFF, 0x7FC0, 0xFFC1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fmt,value,stored",
    [
        ("f16", 65520.0, 0x7C00),  # the tie above 65504 rounds to the even pattern: inf
        ("f16", -70000.0, 0xFC00),
        ("f16", 3.4e38, 0x7C00),
        ("bf16", f32(0x7F7F8000), 0x7F80),  # the top tie: odd kept part rounds up into inf
        ("bf16", f32(0xFF7FFFFF), 0xFF80),  # -FLT_MAX
    ],
)
def test_values_that_round_to_infinity_are_refused_unless_asked(fmt, value, stored, backend):
    n = 5000  # the bad value sits past the numba kernel's first 2048-value chunk
    x = np.ones(n, np.float32)
    x[4321] = value
    x[4500] = np.nan  # a later non-finite value does not hide the first refusal
    with pytest.raises(tbq.ScaleOverflowError, match=r"value 4321 is .*does not fit .*on_overflow='inf'") as e:
        tbq.quantize(x, fmt, backend=backend)
    assert e.value.block == 4321 and e.value.scale == float(np.float32(value))
    assert isinstance(e.value, ValueError) and isinstance(e.value, tbq.TbqError)
    x[4500] = 1.0
    h = words(fmt, x, backend, on_overflow="inf")
    assert h[4321] == stored and h[0] == (0x3C00 if fmt == "f16" else 0x3F80)
    # the last finite value below the overflow is stored, not refused
    below = np.float32(65519.996) if fmt == "f16" else f32(0x7F7F7FFF)
    assert words(fmt, [below], backend)[0] in (0x7BFF, 0x7F7F)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_first_offending_value_wins(fmt, backend):
    """A non-finite value before an overflowing one is reported as non-finite, at its own index."""
    x = np.ones(6000, np.float32)
    x[3000] = np.inf
    x[3001] = 1e38 if fmt == "f16" else np.float32(3.4e38)
    with pytest.raises(tbq.NonFiniteError, match="block 3000 ") as e:
        tbq.quantize(x, fmt, backend=backend)
    assert e.value.block == 3000


@pytest.mark.parametrize("fmt", FORMATS)
def test_fragile_values_mark_rounding_midpoints(fmt):
    f = tbq.get_format(fmt)
    if fmt == "f16":
        mid = np.float32(1 + 2.0**-11)  # the fp16 rounding midpoint between 1 and 1 + 2**-10
        x = np.float32([mid, 1.0, 1.0 + 2.0**-10, np.nextafter(np.nextafter(mid, np.float32(2)), np.float32(2))])
    else:
        x = f32([0x3F808000, 0x3F800000, 0x3F810000, 0x3F808002])
    _, tr = f.reference_encode(x.reshape(-1, 1))
    assert f.fragile_values(tr, 1)[:, 0].tolist() == [True, False, False, False]
    assert f.fragile_values(tr, 2)[:, 0].tolist() == [True, False, False, True]
    assert not f.fragile_scales(tr, 4).any()
