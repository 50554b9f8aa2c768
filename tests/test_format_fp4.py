"""mxfp4 and nvfp4: the shared format battery (tests/helpers.py), plus what is particular to them.

docs/formats.md, "MXFP4" and "NVFP4": ggml's first-minimum value search (ties
to the smaller magnitude, zero -> code 0, saturation), MXFP4's correctly
rounded log2f (binade tops round up) and its undefined E8M0 underflow, NVFP4's
UE4M3 rounding (half up, subnormal clamp at 7, 0x7E from 248), gguf-py as an
independent oracle, and the kernels' midpoint counting against the literal search.
"""

import math

import naive
import numba
import numpy as np
import pytest
from helpers import BACKENDS, assert_bits_equal, assert_bytes_equal, check_format, load_npz

import tbq
from tbq.formats.fp4 import (
    e8m0_boundaries,
    e8m0_byte,
    e8m0_exponent,
    e8m0_half,
    fp4_codes,
    ue4m3_from_f32,
    ue4m3_to_f32,
)
from tbq.formats.fp4_kernels import e8m0_E as kernel_e8m0_E
from tbq.formats.fp4_kernels import ue4m3 as kernel_ue4m3

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max
MIDS = (0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0)
GRID = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)


def codec(fmt, backend, **kw):
    return tbq.get_codec(fmt, backend=backend, **kw)


def fx(h: str) -> F32:
    return F32(float.fromhex(h))


def around(points, ulps):
    p = np.asarray(points, np.float32)
    out, lo, hi = [p], p.copy(), p.copy()
    for _ in range(ulps):
        lo = np.nextafter(lo, F32(-np.inf))
        hi = np.nextafter(hi, F32(np.inf))
        out += [lo, hi]
    return np.concatenate(out)


def fill_blocks(heads, vals, width):
    """Rows of ``width`` values: ``heads`` (one per row, the amax) then ``vals`` (zeros after the last)."""
    per = width - 1
    n = -(-vals.size // per)
    x = np.zeros((n, width), np.float32)
    x[:, 0] = heads
    x[:, 1:].flat[: vals.size] = vals
    return x


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_passes_the_format_battery(fmt):
    check_format(fmt)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_decode_random_vectors(fmt, backend):
    ref = load_npz(f"decode_random/{fmt}__strict")  # scale bytes unrestricted: MXFP4 e = 253..255 overflow to +-inf
    y = tbq.dequantize(ref["q"], fmt, backend=backend)
    assert_bits_equal(y, ref["y"], f"{fmt} decode_random {backend}")  # no NaN can come out; -0 for NVFP4 dd = 0


# ---------------------------------------------------------------------------
# gguf-py: MXFP4 quantize + dequantize, NVFP4 dequantize and its fp32_to_ue4m3 helper
# ---------------------------------------------------------------------------

N = 1 << 20


def distributions():
    rng = np.random.default_rng(11)
    g = rng.standard_normal((N // 128, 128), dtype=np.float32)
    nb = N // 32
    E = rng.integers(-20, 20, nb)
    d = np.ldexp(1.0, E - 3)
    ties = rng.choice(np.array([*MIDS, *GRID, 0.0]), (nb, 32)) * rng.choice([-1.0, 1.0], (nb, 32))
    ties[:, 7] = 12.0  # amax = 12 d = 1.5 * 2**E: the block's E
    return {
        "gaussian": g,
        "student_t": rng.standard_t(3, (N // 128, 128)).astype(np.float32),
        "tiny_1e-6": g * F32(1e-6),
        "large_1e3": g * F32(1e3),
        "ties": (ties * d[:, None]).astype(np.float32).reshape(-1, 128),
    }


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_gguf_py_agrees_bit_for_bit(fmt):
    from gguf import quants

    qt = getattr(quants.GGMLQuantizationType, fmt.upper())
    ref = load_npz(f"decode_random/{fmt}__strict")
    with np.errstate(over="ignore"):  # MXFP4 e >= 253: V * d overflows to inf, as in C
        assert_bits_equal(quants.dequantize(ref["q"], qt), ref["y"], f"gguf-py {fmt} on the decode_random vectors")
    fast = codec(fmt, "numba", threads=1)
    for name, x in distributions().items():
        q = fast.encode(x)
        if name in ("gaussian", "ties"):
            assert_bytes_equal(codec(fmt, "numpy").encode(x), q, f"{fmt} {name}: numpy vs numba")
        if fmt == "mxfp4":
            # the same first-minimum argmin: zeros of either sign get code 0 in both (no signed-zero case)
            assert_bytes_equal(quants.quantize(x, qt), q, f"{fmt} {name}: gguf-py quantize")
        assert_bits_equal(quants.dequantize(q, qt), fast.decode(q), f"{fmt} {name}: gguf-py dequantize")


def dense_scales():
    """Positive float32 around every UE4M3 decision point, over the whole range, plus a dense grid."""
    vals = ue4m3_to_f32(np.arange(1, 0x7F, dtype=np.uint8)).astype(np.float64) * 2  # the UE4M3 values
    mids = np.concatenate([(vals[1:] + vals[:-1]) / 2, vals, [2.0**-10, 2.0**-6, 248.0, 256.0, 448.0, 480.0, 1e30]])
    e = np.arange(-149, 128)
    mant = np.array([0, 1, 2, 0x3FFFF, 0x40000, 0x40001, 0x7FFFF, 0x80000, 0x80001, 0x7FFFFF, 0x7FFFFE])
    grid = ((np.clip(e + 127, 0, 254)[:, None].astype(np.uint32) << 23) | mant[None, :].astype(np.uint32)).view(
        np.float32
    )
    return np.concatenate(
        [around(mids, 3), grid.reshape(-1), np.random.default_rng(4).uniform(0, 300, 1 << 18).astype(np.float32)]
    )


@numba.njit
def _kernel_ue4m3(s, out):
    for i in range(s.size):
        out[i] = kernel_ue4m3(s[i])


def test_ue4m3_matches_gguf_py_the_naive_model_and_the_kernel():
    import naive_fp4
    from gguf.quants import NVFP4

    s = dense_scales()
    mine = ue4m3_from_f32(s)
    assert np.array_equal(NVFP4.fp32_to_ue4m3(s), mine)  # gguf-py's unused helper (it differs only for NaN: 0x7E vs 0)
    k = np.empty(s.size, np.int32)
    _kernel_ue4m3(s, k)
    assert np.array_equal(k, mine)
    sub = s[:: max(1, s.size // 20000)]
    assert [naive_fp4.ue4m3(v) for v in sub] == mine[:: max(1, s.size // 20000)].tolist()
    assert ue4m3_from_f32(np.float32([np.nan, -1.0, -0.0, 0.0])).tolist() == [0, 0, 0, 0]
    # decode: every byte against gguf-py and the naive model
    u = np.arange(256, dtype=np.uint8)
    assert_bits_equal(ue4m3_to_f32(u), NVFP4.ue4m3_to_fp32(u).astype(np.float32), "ue4m3_to_f32 vs gguf-py")
    assert_bits_equal(ue4m3_to_f32(u), np.array([naive_fp4.ue4m3_value(int(b)) for b in u], np.float32), "vs naive")


# ---------------------------------------------------------------------------
# MXFP4: E = floor(log2f(amax))
# ---------------------------------------------------------------------------


def spec_n(b):
    """How many of the top floats of binade b have log2f rounding up to b + 1 (docs/formats.md, "MXFP4")."""
    a = abs(b + 1) if b < 0 else b  # the table is symmetric in |b| for b >= 2 and |b + 1| for b <= -3
    if b in (-2, -1, 0, 1):
        return 0
    for lo, hi, n in ((2, 3, 1), (4, 7, 2), (8, 15, 5), (16, 31, 11), (32, 63, 22), (64, 127, 44)):
        if lo <= a <= hi:
            return n
    raise AssertionError(b)


@numba.njit
def _kernel_E(bits, bounds, out):
    for i in range(bits.size):
        out[i] = kernel_e8m0_E(bits[i], bounds)


def test_e8m0_exponent_binade_tops_follow_the_spec_table():
    bs, tops, want = [], [], []
    for b in range(-126, 128):
        n = spec_n(b)
        for k in range(n + 2):
            bits = np.uint32(((b + 127) << 23) | (0x7FFFFF - k))
            bs.append(b)
            tops.append(bits)
            want.append(b + 1 if k < n else b)
    f = np.array(tops, np.uint32).view(np.float32)
    assert e8m0_exponent(f).tolist() == want
    got = np.empty(f.size, np.int32)
    _kernel_E(f.view(np.uint32), e8m0_boundaries(), got)
    assert got.tolist() == want
    assert e8m0_exponent(np.float32([fx("0x1.fffffep+2"), fx("0x1.fffffcp+2")])).tolist() == [3, 2]


def test_kernel_exponent_table_equals_log2_everywhere_sampled():
    rng = np.random.default_rng(8)
    bits = np.concatenate(
        [
            rng.integers(1, 0x7F800000, 1 << 20, dtype=np.uint32),
            ((np.arange(0, 255, dtype=np.uint32) << 23)[:, None] + np.arange(0, 64, dtype=np.uint32)[None, :]).reshape(
                -1
            ),  # binade bottoms
            ((np.arange(1, 256, dtype=np.uint32) << 23)[:, None] - np.arange(1, 65, dtype=np.uint32)[None, :]).reshape(
                -1
            ),  # binade tops
            np.arange(1, 1 << 12, dtype=np.uint32),  # the smallest subnormals
        ]
    )
    bits = bits[(bits > 0) & (bits < 0x7F800000)]
    got = np.empty(bits.size, np.int32)
    _kernel_E(bits, e8m0_boundaries(), got)
    assert np.array_equal(got, e8m0_exponent(bits.view(np.float32)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_mxfp4_binade_top_per_group_through_the_encoder(backend):
    """One binade of each n group: the n-th float from the top still rounds up, the next does not."""
    c = codec("mxfp4", backend)
    for b in (2, -3, 5, -6, 9, -10, 20, -20, 40, -40, 100, -100, 127):
        n = spec_n(b)
        up = np.uint32(((b + 127) << 23) | (0x7FFFFF - (n - 1))).view(np.float32)
        down = np.nextafter(up, F32(0))
        q = c.encode(np.float32([up] + [0] * 31 + [down] + [0] * 31)).reshape(2, 17)
        assert q[:, 0].tolist() == [b + 1 + 125, b + 125], b
    for b in (-2, -1, 0, 1):  # n = 0: the top float keeps E = b
        top = np.uint32(((b + 127) << 23) | 0x7FFFFF).view(np.float32)
        assert c.encode(np.float32([top] + [0] * 31))[0] == b + 125


@pytest.mark.parametrize("backend", BACKENDS)
def test_mxfp4_spec_example_and_ties(backend):
    x = np.zeros(32, np.float32)
    x[0] = fx("0x1.fffffep+2")  # 7.9999995: log2f rounds to 3 -> e = 128, d = 1, decodes to 8
    x[1:15] = [1.5, -1.5, 3.5, -3.5, 10.0, -10.0, 0.5, -0.5, 5.0, 7.0, 2.5, 11.0, -0.0, -0.25]
    q = codec("mxfp4", backend).encode(x)
    assert q[0] == 128
    codes = tbq.get_format("mxfp4").fields(q)["qs"][0, :15].tolist()
    #          amax  1.5 -1.5 3.5 -3.5 10  -10  .5 -.5  5  7  2.5 11 -0 -.25
    assert codes == [6, 1, 9, 3, 11, 6, 14, 0, 0, 4, 5, 2, 7, 0, 0]  # ties to the smaller magnitude, zero -> code 0
    y = codec("mxfp4", backend).decode(q)
    assert y[:15].tolist() == [8, 1, -1, 3, -3, 8, -8, 0, 0, 4, 6, 2, 12, 0, 0]
    assert (y.view(np.uint32)[[7, 8, 13, 14]] == 0).all()  # decoded zeros are +0 (V[8] = 0)
    assert codec("mxfp4", backend).encode(np.zeros(32, np.float32)).tolist() == [0] * 17
    assert codec("mxfp4", backend).encode(np.full(32, -0.0, np.float32)).tolist() == [0] * 17


@pytest.mark.parametrize("backend", BACKENDS)
def test_mxfp4_near_flt_max_skips_overflowing_grid_values(backend):
    x = np.zeros(32, np.float32)
    x[0] = FLT_MAX  # log2f rounds to 128: e = 253, d = 2**125; 8 d and 12 d overflow (error inf, never chosen)
    x[1] = -FLT_MAX
    x[2] = F32(1.75 * 2.0**127)  # the 7d "midpoint" next to an infinite grid value: still 6 d
    q = codec("mxfp4", backend).encode(x)
    assert q[0] == 253
    assert tbq.get_format("mxfp4").fields(q)["qs"][0, :3].tolist() == [5, 13, 5]
    raw = np.zeros(17, np.uint8)
    raw[0], raw[1] = 253, 0x76  # codes 6 (8 d) and 7 (12 d) decode to +inf
    assert codec("mxfp4", backend).decode(raw)[[0, 16]].tolist() == [math.inf, math.inf]


@pytest.mark.parametrize("backend", BACKENDS)
def test_mxfp4_exponent_underflow_is_refused_unless_asked(backend):
    x = np.zeros((3, 32), np.float32)
    x[0, 0] = 1.0
    x[1, 0] = fx("0x1.fffffep-126")  # within the 44 largest floats below 2**-125: log2f = -125, e = 0, fine
    x[2, 0] = F32(2.0**-126)  # E = -126: E + 125 = -1 to uint8_t is undefined in C
    with pytest.raises(tbq.ScaleOverflowError, match="block 2") as e:
        codec("mxfp4", backend).encode(x)
    msg = str(e.value)
    assert "E8M0 exponent underflows" in msg and "on_overflow='inf'" in msg and repr(float(2.0**-126)) in msg
    assert isinstance(e.value, ValueError) and isinstance(e.value, tbq.TbqError) and e.value.block == 2
    q = codec("mxfp4", backend, on_overflow="inf").encode(x).reshape(3, 17)
    assert q[1, 0] == 0
    assert q[2].tolist() == [255] + [0] * 16  # x86-64 gcc: -1 wraps to 255; d = 2**127, codes 0
    assert codec("mxfp4", backend).decode(q[2]).view(np.uint32).tolist() == [0] * 32
    sub = np.zeros(32, np.float32)
    sub[3] = -np.float32(1e-45)  # the smallest subnormal: E = -149, e = 232
    assert codec("mxfp4", backend, on_overflow="inf").encode(sub)[0] == 232
    assert e8m0_byte(np.float32([1e-45, 2.0**-126, 0.0])).tolist() == [232, 255, 0]


def mxfp4_midpoint_data():
    heads = []
    for E in range(-125, 129):
        amax = F32(1.5 * 2.0**E) if E <= 127 else FLT_MAX
        d = 2.0 ** (E - 3)
        with np.errstate(over="ignore"):
            pts = np.array([m * d for m in MIDS + GRID], np.float64).astype(np.float32)
        v = around(pts[np.isfinite(pts)], 3)
        v = v[(v <= amax) & (v > 0)]
        v = np.concatenate([v, -v])
        x = fill_blocks(amax, v, 32)
        assert (e8m0_byte(np.abs(x).max(axis=1)) == E + 125).all()
        heads.append(x)
    return np.concatenate(heads)


def test_mxfp4_kernel_equals_the_literal_search_around_every_midpoint_of_every_scale():
    x = mxfp4_midpoint_data()
    rng = np.random.default_rng(9)
    r = rng.standard_normal((4096, 32)).astype(np.float32) * np.ldexp(1.0, rng.integers(-120, 120, (4096, 1))).astype(
        np.float32
    )
    for data in (x, r):
        q_np = codec("mxfp4", "numpy").encode(data)
        assert_bytes_equal(codec("mxfp4", "numba").encode(data), q_np, "midpoints: kernel vs literal argmin")
        assert np.array_equal(
            tbq.get_format("mxfp4").fields(q_np)["qs"].reshape(data.shape),
            fp4_codes(data, e8m0_half(q_np.reshape(-1, 17)[:, 0])),
        )
    # the wrapped exponents of the undefined case (on_overflow="inf") agree as well
    u = rng.standard_normal((512, 32)).astype(np.float32) * np.ldexp(1.0, rng.integers(-170, -125, (512, 1))).astype(
        np.float32
    )
    assert_bytes_equal(
        codec("mxfp4", "numba", on_overflow="inf").encode(u),
        codec("mxfp4", "numpy", on_overflow="inf").encode(u),
        "undefined",
    )


def test_mxfp4_fragility():
    f = tbq.get_format("mxfp4")
    x = np.zeros((3, 32), np.float32)
    x[0, :3] = [12.0, 1.5, 1.25]  # d = 1: 1.5 is a tie, 1.25 is not
    x[1, 0] = fx("0x1.fffffep+2")  # log2f(amax) within an ulp of 3: the exponent is fragile
    x[2, 0] = 8.0  # a power of two: exact log2, not fragile
    _, tr = f.reference_encode(x)
    fr = f.fragile_values(tr, 1)
    assert fr[0, 1] and not fr[0, 2] and not fr[0, 0]
    assert f.fragile_scales(tr, 1).tolist() == [False, True, False]


# ---------------------------------------------------------------------------
# NVFP4
# ---------------------------------------------------------------------------

UE4M3_EXAMPLES = [  # s -> byte (docs/formats.md, "NVFP4", checked against the C encoder)
    (0.3125, 0x2A),
    (1.0625, 0x39),
    (240.0, 0x77),
    (250.0, 0x7E),
    (0.0146484375, 0x07),
    (0.015609741, 0x07),
    (2.0**-10, 0x01),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_ue4m3_examples_of_the_spec(backend):
    s = np.float32([v for v, _ in UE4M3_EXAMPLES])
    assert ue4m3_from_f32(s).tolist() == [u for _, u in UE4M3_EXAMPLES]
    assert (ue4m3_to_f32(ue4m3_from_f32(s)) * 2).tolist() == [
        0.3125,
        1.125,
        240,
        448,
        0.013671875,
        0.013671875,
        2.0**-9,
    ]
    assert ue4m3_to_f32(np.uint8([0x7F, 0x80, 0xFF, 0x7E, 0x00])).tolist() == [0.0, 0.0, 240.0, 224.0, 0.0]
    # through the encoder: a sub-block whose amax / 6 is exactly s
    amax = s * F32(6)
    ok = amax / F32(6) == s
    x = np.zeros((ok.sum(), 64), np.float32)
    x[:, 16] = amax[ok]  # sub-block 1
    q = codec("nvfp4", backend).encode(x)
    assert q[:, 1].tolist() == np.array([u for _, u in UE4M3_EXAMPLES])[ok].tolist()
    assert q[:, [0, 2, 3]].tolist() == [[0, 0, 0]] * int(ok.sum())


@pytest.mark.parametrize("backend", BACKENDS)
def test_nvfp4_small_sub_blocks_vanish_and_large_ones_saturate(backend):
    x = np.zeros(64, np.float32)
    x[0:3] = [0.005, -0.004, -0.0]  # amax / 6 below 2**-10: u = 0, dd = 0, every code 0 (all errors tie at |x|)
    x[16:18] = [3000.0, -5000.0]  # amax >= 1488: u = 0x7E, dd = 224, |x| > 2688 clamps
    x[32] = F32(6 * 2.0**-10)  # s = 2**-10: u = 1 (2**-10 * 512 + 0.5 = 1.0)
    q = codec("nvfp4", backend).encode(x)
    assert q[:4].tolist() == [0x00, 0x7E, 0x01, 0x00]
    assert q[4:12].tolist() == [0] * 8
    y = codec("nvfp4", backend).decode(q)
    assert y[:16].view(np.uint32).tolist() == [0] * 16  # +0 even for the negative values
    assert y[16:18].tolist() == [2688.0, -2688.0]
    raw = np.zeros(36, np.uint8)
    raw[0], raw[4] = 0x7F, 0x99  # UE4M3 0x7F decodes to 0: codes 9 (-1) give -0
    assert codec("nvfp4", backend).decode(raw)[[0, 8]].view(np.uint32).tolist() == [0x80000000, 0x80000000]


@pytest.mark.parametrize("backend", BACKENDS)
def test_nvfp4_layout_and_ties(backend):
    x = np.zeros(64, np.float32)
    sub = np.float32([12, 0.5, 1.5, 2.5, 3.5, 5, 7, 10, -12, -0.5, -1.5, -2.5, -3.5, -5, -7, -10])
    x[16:32] = sub * F32(0.25)  # amax = 3, s = 0.5 = UE4M3 0x30, dd = 0.25: the values sit on the midpoints
    q = codec("nvfp4", backend).encode(x)
    assert q[1] == 0x30
    c = [0x7, 0, 1, 2, 3, 4, 5, 6, 0xF, 0, 9, 10, 11, 12, 13, 14]  # every tie to the smaller magnitude; -0.5 dd -> 0
    assert q[12:20].tolist() == [c[j] | (c[j + 8] << 4) for j in range(8)]  # byte 8s+j: value 16s+j low, 16s+8+j high
    assert tbq.get_format("nvfp4").fields(q)["qs"][0, 16:32].tolist() == c


def nvfp4_midpoint_data():
    us = [u for u in range(1, 0x7F) if ue4m3_to_f32(np.uint8(u)) > 0]
    rows = []
    for u in us:
        dd = float(ue4m3_to_f32(np.uint8(u)))
        amax = F32(12 * dd)
        if ue4m3_from_f32(amax / F32(6)) != u:
            continue  # not a byte the encoder produces (0x78..0x7D)
        v = around(np.array([m * dd for m in MIDS + GRID], np.float32), 3)
        v = v[(v <= amax) & (v > 0)]
        rows.append(fill_blocks(amax, np.concatenate([v, -v]), 16))
    sub = np.concatenate(rows)
    sub = np.concatenate([sub, np.zeros((-sub.shape[0] % 4, 16), np.float32)])
    return sub.reshape(-1, 64), len(rows)


def test_nvfp4_kernel_equals_the_literal_search_around_every_midpoint_of_every_scale():
    x, n_scales = nvfp4_midpoint_data()
    assert n_scales == 120  # every UE4M3 byte the encoder produces except 0: 0x01..0x77 and 0x7E
    rng = np.random.default_rng(12)
    r = rng.standard_normal((8192, 64)).astype(np.float32) * np.ldexp(1.0, rng.integers(-12, 10, (8192, 1))).astype(
        np.float32
    )
    for data in (x, r):
        assert_bytes_equal(
            codec("nvfp4", "numba").encode(data), codec("nvfp4", "numpy").encode(data), "kernel vs literal argmin"
        )


def test_nvfp4_fragility():
    f = tbq.get_format("nvfp4")
    x = np.zeros((2, 64), np.float32)
    x[0, :3] = [3.0, 0.375, 0.3]  # dd = 0.25: 0.375 = 1.5 dd is a tie
    x[1, 0] = F32(6 * 1.0625)  # s = 1.0625: exactly the half-up tie of UE4M3
    _, tr = f.reference_encode(x)
    fr = f.fragile_values(tr, 1)
    assert fr[0, 1] and not fr[0, 2] and not fr[0, 0]
    assert f.fragile_scales(tr, 1).tolist() == [False, True]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_regression_huge_values_over_a_saturated_scale_tie_to_the_first_code(backend):
    """Found by the property tests: with NVFP4's sub-block scale saturated at 448 (dd = 224), a value
    ~2**25 times the grid makes fl(|x| - g) equal for several grid values g; the literal search keeps
    the first (smallest magnitude) of the tied minima, and code 0 when even fl(|x| - 0) ties. The
    numba kernel's midpoint shortcut once saturated to code 7 there."""
    x = np.full(64, 1e10, np.float32)
    x[1], x[2], x[3] = -3.4e10, 1e12, 5e9
    q = tbq.quantize(x, "nvfp4", backend=backend, on_overflow="inf")
    b, _ = naive.encode_block(tbq.get_format("nvfp4"), x)
    assert bytes(q) == b
    c = tbq.get_format("nvfp4").fields(q)["qs"].reshape(-1)
    assert c[2] == 0  # 1e12: every error rounds to 1e12, code 0 (decodes to 0)
    assert c[0] == 7  # 1e10: fl(1e10 - 12 dd) is still the single smallest error
    assert c[1] == 8 + 5  # -3.4e10 (ulp 2048): |x| - 6dd, - 8dd and - 12dd all round to |x| - 2048; -6dd comes first
