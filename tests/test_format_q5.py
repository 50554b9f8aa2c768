"""q5_0 and q5_1: the shared format battery, the C decoder's random-byte vectors, gguf-py, and each quirk of the spec."""

import numpy as np
import pytest
from helpers import BACKENDS, assert_bits_equal, check_format, load_npz
from test_format_q4_1 import gguf_case, stored

import tbq

FORMATS = ("q5_0", "q5_1")


def codes(fmt, q):
    """The 5-bit codes of encoded blocks, read independently of tbq: qh bit i is bit 4 of code i."""
    q = np.asarray(q).reshape(-1, tbq.format_info(fmt).type_size)
    off = 2 if fmt == "q5_0" else 4
    qh = q[:, off : off + 4].astype(np.uint32) @ (np.uint32(1) << np.uint32([0, 8, 16, 24]))
    qs = q[:, off + 4 :]
    lo = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.uint32)
    return lo | (((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1) << 4)


@pytest.mark.parametrize("fmt", FORMATS)
def test_passes_the_format_battery(fmt):
    check_format(fmt)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_random_vectors(fmt, backend):
    ref = load_npz(f"decode_random/{fmt}__strict")
    assert_bits_equal(tbq.dequantize(ref["q"], fmt, backend=backend), ref["y"], f"{fmt} decode_random {backend}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dist", ["gaussian", "student_t", "tiny", "large", "ties", "zeros"])
def test_matches_gguf_py(fmt, dist):
    x = gguf_case(fmt, dist)
    if dist == "ties":  # the data does sit on exact half-integers of the scaled values
        with np.errstate(all="ignore"):
            _, tr = tbq.get_format(fmt).reference_encode(x.reshape(-1, 32))
        v = tr["v"]
        assert np.count_nonzero(v - np.floor(v) == 0.5) > 0.4 * v.size


@pytest.mark.parametrize("backend", BACKENDS)
def test_q5_0_zero_block_is_minus_zero_scale_code_16(backend):
    """max = +0 (never replaced), d = +0 / -16 = -0: bytes 00 80 | FF FF FF FF | 00 x16; decodes to -0.0."""
    for first in (0.0, -0.0):
        x = np.zeros(32, np.float32)
        x[0], x[7] = first, -0.0
        q = stored("q5_0", x, backend)
        assert q.tolist() == [0x00, 0x80, 0xFF, 0xFF, 0xFF, 0xFF] + [0] * 16
        y = tbq.dequantize(q, "q5_0", backend=backend)
        assert (y.view(np.uint32) == 0x80000000).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_q5_0_sign_of_the_first_largest_and_the_clamp(backend):
    """The first of +a/-a sets max (d = max / -16: code 0 <-> max); -max gives t = 32.5, clamped to 31."""
    x = np.zeros(32, np.float32)
    x[2], x[20] = 2.0, -2.0
    q = stored("q5_0", x, backend)
    assert q[:2].tolist() == [0x00, 0xB0]  # d = -0.125
    c = codes("q5_0", q)[0]
    assert c[2] == 0 and c[20] == 31 and c[0] == 16
    y = tbq.dequantize(q, "q5_0", backend=backend)
    assert y[2] == 2.0 and y[20] == np.float32(-1.875)  # (31 - 16) * -0.125: the grid is asymmetric
    x[2], x[20] = -2.0, 2.0
    q = stored("q5_0", x, backend)
    assert q[:2].tolist() == [0x00, 0x30] and codes("q5_0", q)[0][2] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_q5_0_ties_round_up(backend):
    """x * id + 16.5 with x * id = k + 1/2 exactly is an integer: trunc keeps it (half rounds up)."""
    x = (np.arange(32) - 15.5).astype(np.float32)  # x_j = j - 15.5: x * id + 16.5 = j + 1 exactly
    x[0] = -16.0  # max = -16 (the largest magnitude), d = 1, id = 1: t = 0.5 -> code 0
    c = codes("q5_0", stored("q5_0", x, backend))[0]
    assert c.tolist() == [0] + list(range(2, 32)) + [31]  # t = 32 for the last value: clamped to 31


@pytest.mark.parametrize("backend", BACKENDS)
def test_q5_1_constant_and_zero_blocks(backend):
    for v, m_bytes in [(0.75, [0x00, 0x3A]), (-3.0, [0x00, 0xC2]), (0.0, [0x00, 0x00])]:
        q = stored("q5_1", np.full(32, v), backend)
        assert q.tolist() == [0, 0] + m_bytes + [0] * 20, v  # d = 0, qh = 0, codes 0
        assert_bits_equal(tbq.dequantize(q, "q5_1", backend=backend), np.full(32, v, np.float32), f"constant {v}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_q5_1_top_code_without_clamp(backend):
    """No min(31, .) in C: (max - min)*id + 0.5 stays below 32 on its own, so max gets code 31 (bit 4 set in qh)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2000, 32)).astype(np.float32)
    q = tbq.quantize(x, "q5_1", backend=backend)
    c = codes("q5_1", q)
    assert c.max() == 31 and (c[np.arange(2000), np.argmax(x, axis=1)] == 31).all()
    assert (c[np.arange(2000), np.argmin(x, axis=1)] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_tiny_scale_writes_code_zero(fmt, backend):
    """1/d overflows (|max| < ~4.7e-38, or max - min < ~4.4e-38): undefined conversion in C, code 0 as on x86."""
    x = np.zeros(32, np.float32)
    x[5], x[6] = np.float32(1e-39), np.float32(-5e-40)
    q = stored(fmt, x, backend)
    with np.errstate(all="ignore"):
        _, tr = tbq.get_format(fmt).reference_encode(x[None, :])
    assert not np.isfinite(tr["t"]).any()
    if fmt == "q5_0":
        assert q.tolist() == [0x00, 0x80] + [0] * 20  # d = -1e-39/16 rounds to fp16 -0
    else:
        assert q.tolist() == [0x00, 0x00, 0x00, 0x80] + [0] * 20  # m = fp16(-5e-40) = -0


@pytest.mark.parametrize("backend", BACKENDS)
def test_overflowing_fields_are_refused_unless_asked(backend):
    x = np.ones((2, 64), np.float32)
    x[1, 40] = 2e6  # q5_0: d = -125000; q5_1: d = 64516 rounds to 64512 (finite)
    with pytest.raises(tbq.ScaleOverflowError, match=r"block 3 .*on_overflow='inf'") as e:
        tbq.quantize(x, "q5_0", backend=backend)
    assert e.value.block == 3
    assert tbq.quantize(x, "q5_0", backend=backend, on_overflow="inf")[1, 22:24].tolist() == [0x00, 0xFC]
    tbq.quantize(x, "q5_1", backend=backend)
    x[1, 40] = 3e6  # q5_1: d = 96774 -> inf
    with pytest.raises(tbq.ScaleOverflowError, match=r"block 3, the scale d = \(max - min\) / 31 is 96774"):
        tbq.quantize(x, "q5_1", backend=backend)
    x[1, 40] = 1.0
    x[1, 33] = -65520.0  # the fp16 tie above 65504: m = -inf
    with pytest.raises(tbq.ScaleOverflowError, match=r"block 3, the minimum m is -65520"):
        tbq.quantize(x, "q5_1", backend=backend)
    assert tbq.quantize(x, "q5_1", backend=backend, on_overflow="inf")[1, 26:28].tolist() == [0x00, 0xFC]


@pytest.mark.parametrize("fmt", FORMATS)
def test_fields_read_the_bit_plane(fmt):
    x = np.random.default_rng(3).standard_normal((5, 64)).astype(np.float32)
    f = tbq.get_format(fmt)
    q = f.encode(x)
    fl = f.fields(q)
    assert fl["qh"].dtype == np.uint32 and fl["qh"].shape == (5, 2)
    full = codes(fmt, q).reshape(5, 2, 32)
    assert np.array_equal(fl["qs"], full & 15)
    assert np.array_equal((fl["qh"][..., None] >> np.arange(32, dtype=np.uint32)) & 1, full >> 4)


def test_q5_0_hazards_match_the_grid():
    """The ties family draws x*id = k + 1/2 for k in codes: every such t = k + 17 is a code boundary inside 0..31."""
    h = tbq.get_format("q5_0").fuzz.hazards["ties"]
    assert h == {"divisor": 16.0, "codes": (-16, 15)}
    x = np.zeros(32, np.float32)
    x[0] = 16.0  # d = -1: x*id = -x
    ks = np.arange(h["codes"][0], h["codes"][1] + 1)
    x[1 : 1 + ks.size - 1] = -(ks[:-1] + 0.5)
    _, tr = tbq.get_format("q5_0").reference_encode(x[None, :])
    assert np.array_equal(tr["v"][0, 1 : ks.size], ks[:-1] + 0.5)
    assert tbq.get_format("q5_0").fragile_values(tr, 1)[0, 1 : ks.size].all()
