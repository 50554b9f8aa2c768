"""q8_1 and q8_k: the shared format battery, each quirk of the spec, and the real ggml build on special inputs.

The ggml tests load ``../shared/ggml/upstream/lib/libggml-base.so.0`` (a build of ggml-org/ggml outside
the repository) by ctypes and are skipped, saying so, where it is absent.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import BACKENDS, DATA, assert_bits_equal, assert_bytes_equal, check_format, load_npz

import tbq

FORMATS = ("q8_1", "q8_k")
LIB = Path(__file__).resolve().parents[1].parent / "shared" / "ggml" / "upstream" / "lib" / "libggml-base.so.0"


def _script():
    spec = importlib.util.spec_from_file_location("from_ggml_q8_ops", DATA / "from_ggml_q8_ops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def ggml():
    """(the vector script's module, the loaded upstream libggml-base)."""
    if not LIB.is_file():
        pytest.skip(
            f"{LIB} is absent: the real ggml builds live outside the repo (../shared/ggml), not on users' machines"
        )
    mod = _script()
    return mod, mod.load(LIB)


def c_bytes(ggml, fmt, x):
    mod, lib = ggml
    return mod.quantize(lib, fmt, np.asarray(x, np.float32).reshape(1, -1))[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_passes_the_format_battery(fmt):
    check_format(fmt)


def test_operand_formats_are_registered_but_no_cache_types():
    for fmt, code in (("q8_1", 19), ("q8_k", 20)):
        info = tbq.format_info(fmt)
        assert info.code == code and not info.cache_type
        assert fmt in tbq.format_names() and fmt not in tbq.formats.cache_formats()
    assert tbq.format_info("Q8_K").name == "q8_k"  # ggml's spelling q8_K is the same format
    assert (tbq.format_info("q8_1").type_size, tbq.format_info("q8_k").type_size) == (36, 292)
    for left in ("q4_1", "q5_1"):
        assert tbq.formats.format_class(left).checker.vec_dot_type == "q8_1"


@pytest.mark.parametrize("backend", BACKENDS)
def test_q8_1_is_q8_0_plus_the_sum_field(backend):
    """Bytes 0-1 and the codes are Q8_0's; s = fp16(float32(sum(codes)) * d) with the float32 d."""
    x = np.random.default_rng(3).standard_normal((64, 32)).astype(np.float32) * np.float32(3)
    q1 = tbq.quantize(x, "q8_1", backend=backend)
    q0 = tbq.quantize(x, "q8_0", backend=backend)
    assert_bytes_equal(np.concatenate([q1[:, :2], q1[:, 4:]], axis=1), q0, "q8_1 without s vs q8_0")
    d = (np.abs(x).max(axis=1) / np.float32(127)).astype(np.float32)
    s = (q0[:, 2:].view(np.int8).astype(np.int64).sum(axis=1).astype(np.float32) * d).astype(np.float16)
    assert np.array_equal(q1[:, 2:4].copy().view("<f2")[:, 0].view(np.uint16), s.view(np.uint16))
    # s uses the float32 d, not fp16(d): some blocks differ from the sum times the stored scale
    total = q0[:, 2:].view(np.int8).astype(np.int64).sum(axis=1).astype(np.float32)
    s16 = (total * q0[:, :2].copy().view("<f2")[:, 0].astype(np.float32)).astype(np.float16)
    assert (s16 != s).any()
    assert_bits_equal(
        tbq.dequantize(q1, "q8_1", backend=backend), tbq.dequantize(q0, "q8_0", backend=backend), "decode"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_q8_1_sum_overflow_is_refused_unless_inf(backend):
    x = np.full((1, 32), 3000.0, np.float32)  # d = 23.6 fits fp16, s = 32 * 127 * d = 96000 does not
    with pytest.raises(tbq.ScaleOverflowError, match=r"block 0, s = sum \* d is 9\d{4}"):
        tbq.quantize(x, "q8_1", backend=backend)
    q = tbq.quantize(x, "q8_1", backend=backend, on_overflow="inf")
    assert q[0, 2:4].tolist() == [0x00, 0x7C] and q[0, :2].copy().view("<f2")[0] == np.float16(3000 / 127)


@pytest.mark.parametrize("backend", BACKENDS)
def test_q8_k_zero_block_sign_of_max_and_ties_to_even(backend):
    z = tbq.quantize(np.full(256, -0.0, np.float32), "q8_k", backend=backend)
    assert z.tolist() == [0] * 292  # d = +0, codes 0, bsums 0 (C leaves them unwritten)
    x = np.zeros(256, np.float32)
    x[3], x[9] = 2.0, -2.0  # the first largest |x| (+2) sets max: iscale = -63.5, d = -2/127
    q = tbq.quantize(x, "q8_k", backend=backend)
    d = q[:4].copy().view("<f4")[0]
    assert d == np.float32(1) / np.float32(-63.5) and q[4 + 3] == 0x81 and q[4 + 9] == 127
    # ties: max = 127 s (s a power of two), values (k + 1/2) s: iscale * x = -(k + 1/2) exactly, rounded to even
    s = np.float32(0.25)
    k = np.arange(-127, 127)
    t = np.concatenate([[127], k + 0.5, [0.5]]).astype(np.float32) * s
    q = tbq.quantize(t, "q8_k", backend=backend)
    assert np.array_equal(q[4:260].view(np.int8)[1:255], np.rint(-(k + 0.5)).astype(np.int8))
    assert np.array_equal(q[260:].view("<i2"), q[4:260].view(np.int8).astype(np.int64).reshape(16, 16).sum(axis=1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_q8_k_tiny_max_codes_zero_and_undefined(backend):
    """|max| < 127 / FLT_MAX: iscale = -inf, codes 0 (nearest_int of +-inf / NaN), d = 1/iscale = -0 (max > 0)."""
    x = np.zeros(256, np.float32)
    x[0], x[1] = 1e-37, -5e-38
    q = tbq.quantize(x, "q8_k", backend=backend)
    assert q[:4].tolist() == [0, 0, 0, 0x80] and not q[4:].any()
    f = tbq.get_format("q8_k")
    _, tr = f.encode(np.stack([x, x * np.float32(1e3)]), trace=True)
    mask, rule = f.checker.undefined_blocks(tr)
    assert mask.tolist() == [True, False] and "iscale" in rule


def test_q8_k_bsums_are_checked_except_where_both_scales_are_zero():
    f = tbq.get_format("q8_k")
    x = np.stack([np.linspace(-1, 1, 256, dtype=np.float32), np.zeros(256, np.float32)])
    ref = f.encode(x).reshape(2, 292)
    got = ref.copy()
    got[:, 270] ^= 0x01  # a bsum of each block
    assert f.checker.equivalent_blocks(ref, got).tolist() == [False, True]
    q1 = tbq.get_format("q8_1")
    r1 = q1.encode(np.linspace(-1, 1, 32, dtype=np.float32)).reshape(1, 36)
    g1 = r1.copy()
    g1[0, 2] ^= 0x01  # s: not in the decoded values, but in every q4_1 / q5_1 dot product
    assert q1.checker.equivalent_blocks(r1, g1).tolist() == [False]


@pytest.mark.parametrize("fmt", ["q8_1", "q8_k", "q4_1", "q5_1"])
def test_dot_parts_and_offset_give_the_decoded_values(fmt):
    """codes * scale (+ offset) in float64, rounded to float32, is the decoder's value, bit for bit."""
    f = tbq.get_format(fmt)
    bs = f.block_size
    x = np.random.default_rng(5).standard_normal((8, bs)).astype(np.float32) * np.float32(7)
    data = f.encode(x).reshape(8, f.type_size)
    codes, scale = f.checker.dot_parts(data)
    off = f.checker.dot_offset(data)
    assert codes.dtype == np.int64 and codes.shape == (8, bs) and scale.dtype == np.float64 and scale.shape == (8,)
    assert (off is None) == (fmt == "q8_k")
    v = codes * scale[:, None]
    if fmt in ("q4_1", "q5_1"):  # a left operand's offset is its minimum: each value is codes * d + m
        v = v + off[:, None]
    assert_bits_equal(v.astype(np.float32), f.decode(data).reshape(8, bs), f"{fmt} dot parts")
    if fmt == "q8_1":  # a right operand's offset is its stored block sum s
        assert np.array_equal(off, data[:, 2:4].copy().view("<f2")[:, 0].astype(np.float64))
        assert np.allclose(off, codes.sum(axis=1) * (np.abs(x).max(axis=1) / 127), rtol=2e-3)


# ---------------------------------------------------------------------------
# the real ggml build
# ---------------------------------------------------------------------------


def test_vectors_regenerate_bit_for_bit(ggml):
    mod, lib = ggml
    built = mod.build(lib, load_npz("inputs"))
    manifest = json.loads((DATA / "manifest-q8-ops.json").read_text())
    for name, arrays in built.items():
        stored = load_npz(name[:-4])
        assert sorted(stored) == sorted(arrays)
        for key, a in arrays.items():
            assert a.dtype == stored[key].dtype and np.array_equal(a.view(np.uint8), stored[key].view(np.uint8)), key
        data = mod.npz_bytes(arrays)
        assert hashlib.sha256(data).hexdigest() == manifest["files"][name]["sha256"]
        assert (DATA / name).read_bytes() == data


@pytest.mark.parametrize("backend", BACKENDS)
def test_q8_1_special_inputs_match_ggml(ggml, backend):
    s = np.float32(2.0**-3)
    k = np.random.default_rng(9).integers(-127, 127, 31)
    cases = {
        "zeros": np.zeros(32, np.float32),
        "neg_zeros": np.full(32, -0.0, np.float32),
        # amax = 1e-39: d subnormal, 1/d overflows, x * id = +-inf or NaN: C's conversion is undefined, x86 gives 0
        "subnormal_amax": np.random.default_rng(8).uniform(-1e-39, 1e-39, 32).astype(np.float32),
        # x * id = k + 1/2 exactly (d = s, a power of two): roundf sends the tie away from zero
        "ties": np.concatenate([[-127], k + 0.5]).astype(np.float32) * s,
        "gaussian": np.random.default_rng(10).standard_normal(32).astype(np.float32),
    }
    f = tbq.get_format("q8_1")
    for name, x in cases.items():
        assert_bytes_equal(tbq.quantize(x, "q8_1", backend=backend), c_bytes(ggml, "q8_1", x), f"q8_1 {name}")
    _, tr = f.encode(cases["subnormal_amax"], trace=True)
    assert f.checker.undefined_blocks(tr)[0].tolist() == [True]
    v = f.encode(cases["ties"], trace=True)[1]["v"][0]
    assert np.count_nonzero(v - np.floor(v) == 0.5) == 31


def test_q8_1_nan_is_refused_and_what_ggml_does_with_it(ggml):
    """tbq refuses NaN; C's MAX(a, b) = a > b ? a : b forgets a NaN at the next value, so the NaN's
    successors set d (for information: docs/formats.md, "Q8_1")."""
    x = np.linspace(-1, 1, 32, dtype=np.float32)
    x[0] = 8.0
    x[5] = np.nan
    with pytest.raises(tbq.NonFiniteError, match="block 0"):
        tbq.quantize(x, "q8_1")
    q = c_bytes(ggml, "q8_1", x)
    d = q[:2].copy().view("<f2")[0]
    assert d == np.float16(np.abs(x[6:]).max() / np.float32(127))  # not 8 / 127: the NaN reset amax
    assert q[4 + 5] == 0  # roundf(NaN) to int8: undefined; x86 gives 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_q8_k_special_inputs_match_ggml(ggml, backend):
    s = np.float32(2.0**-2)
    k = np.random.default_rng(11).integers(-127, 127, 255)
    tiny = np.zeros(256, np.float32)
    tiny[[3, 200]] = [-2e-37, 1e-37]
    cases = {
        # iscale * x = -(k + 1/2) exactly: nearest_int rounds half to even
        "ties": np.concatenate([[127], k + 0.5]).astype(np.float32) * s,
        "neg_max_ties": np.concatenate([[-127], k + 0.5]).astype(np.float32) * s,
        "tiny_max": tiny,  # iscale = 127 / 2e-37 overflows: codes 0, d = +0 (max < 0)
        "subnormal": np.random.default_rng(12).uniform(-1e-40, 1e-40, 256).astype(np.float32),
        "just_above_tiny": tiny * np.float32(2),  # iscale finite (about 3.2e38)
        "sign_tie": np.where(np.arange(256) == 7, 3.0, np.where(np.arange(256) == 2, -3.0, 0.5)).astype(np.float32),
        "gaussian": np.random.default_rng(13).standard_normal(256).astype(np.float32),
    }
    for name, x in cases.items():
        assert_bytes_equal(tbq.quantize(x, "q8_k", backend=backend), c_bytes(ggml, "q8_k", x), f"q8_k {name}")
    v = tbq.get_format("q8_k").encode(cases["ties"], trace=True)[1]["v"][0]
    assert np.count_nonzero(v - np.floor(v) == 0.5) == 255


def test_q8_k_non_finite_is_refused_and_what_ggml_does_with_it(ggml):
    """For information (docs/formats.md, "Q8_K"): C skips a NaN in the search and codes it nearest_int(NaN);
    an infinity becomes max: iscale = -0, every code 0, d = 1/-0 = -inf."""
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    x[5] = np.float32(np.nan)  # the default quiet NaN 0x7FC00000
    with pytest.raises(tbq.NonFiniteError, match="block 0"):
        tbq.quantize(x, "q8_k")
    q = c_bytes(ggml, "q8_k", x)
    assert q[:4].copy().view("<f4")[0] == np.float32(1) / (np.float32(-127) / np.float32(-1)) and q[4 + 5] == 0
    x[5] = np.inf
    q = c_bytes(ggml, "q8_k", x)
    assert q[:4].tolist() == [0, 0, 0x80, 0xFF] and not q[4:].any()  # -inf, codes and bsums 0


def test_q8_k_zero_block_bsums_are_not_written_by_ggml(ggml):
    """The spec's claim: an all-zero block gets d = 0 and codes 0, its bsums keep what the buffer held."""
    mod, lib = ggml
    x = np.zeros(256, np.float32)
    q = np.full(292, 0xAB, np.uint8)
    lib.quantize_row_q8_K_ref(mod._p(x, mod.ctypes.c_float), mod._p(q, mod.ctypes.c_uint8), 256)
    assert not q[:260].any() and (q[260:] == 0xAB).all()
    f = tbq.get_format("q8_k")
    ref = f.encode(x).reshape(1, 292)
    assert not ref[0, 260:].any() and f.checker.equivalent_blocks(ref, q.reshape(1, 292)).tolist() == [True]


def test_tbq_check_passes_ggml_q8_k_reference_functions(ggml):
    """tbq check reads q8_k through the format interface alone (a float32 scale, int16 sums): ggml's own
    quantize_row_q8_K_ref / dequantize_row_q8_K are exact, and a flipped bsums bit is wrong."""
    from tbq.check import check_kernel, check_library

    r = check_library(LIB, "q8_k", quantize="quantize_row_q8_K_ref", dequantize="dequantize_row_q8_K", blocks=300)
    c = r.counts()
    # C leaves an all-zero block's bsums unwritten (whatever the output buffer held): such blocks may be
    # equivalent (d = 0 on both sides, bsums ignored); everything else is exact
    assert r.ok and c["wrong"] == 0 and c["exact"] + c["equivalent"] == c["blocks"], r.text()

    def broken(x):
        q = tbq.quantize(x, "q8_k").reshape(-1, 292)
        q[:, 270] ^= 0x10  # bsums[5]
        return q

    bad = check_kernel("q8_k", quantize=broken, blocks=300, examples=0)
    assert bad.counts("quantize", "golden")["wrong"] > 0, bad


def _q8_1_rint(x):
    """Q8_1 with the codes rounded half to even (as ggml's SIMD quantize_row_q8_1) and s from those codes."""
    x = np.asarray(x, np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.rint(x * inv[:, None]).astype(np.int8)
    out = np.empty((x.shape[0], 36), np.uint8)
    out[:, 0:2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = (q.astype(np.int32).sum(axis=1).astype(np.float32) * d).astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 4:] = q.view(np.uint8)
    return out


def test_q8_1_sum_follows_codes_off_at_a_tie_but_a_wrong_sum_is_wrong():
    # s is a function of the codes: a kernel rounding ties to even writes another code and so another s; the
    # checker lets s follow its own codes (the tie-rule class), and only an s its codes do not give is wrong
    from tbq.check import check_kernel

    r = check_kernel("q8_1", quantize=_q8_1_rint, blocks=2000, examples=0)
    c = r.counts("quantize")
    assert r.ok and c["tie_rule"] > 0 and c["wrong"] == 0, c

    def fp16_d_sum(x):  # s from the fp16 d instead of the float32 one: a real deviation
        out = tbq.quantize(np.asarray(x, np.float32), "q8_1").reshape(-1, 36).copy()
        d16 = out[:, 0:2].copy().view("<f2").astype(np.float32).reshape(-1)
        s = out[:, 4:].view(np.int8).astype(np.int32).sum(axis=1).astype(np.float32) * d16
        out[:, 2:4] = s.astype("<f2").view(np.uint8).reshape(-1, 2)
        return out

    bad = check_kernel("q8_1", quantize=fp16_d_sum, blocks=2000, examples=0)
    assert not bad.ok and bad.counts("quantize")["wrong"] > 0


def test_derived_fields_are_recomputed_from_the_blocks_own_codes():
    f = tbq.get_format("q8_k")
    x = np.stack([np.linspace(-1, 1, 256, dtype=np.float32), np.zeros(256, np.float32)])
    data, trace = f.reference_encode(x)
    assert np.array_equal(f.checker.derived(data, trace), data)  # the reference is consistent
    moved = data.copy()
    moved[0, 4 + 17] = np.uint8((int(moved[0, 4 + 17]) + 1) % 256)  # code 17: group 1
    moved[1, 260:] = 0xAB  # an all-zero block's bsums, unwritten by C: kept
    got = f.checker.derived(moved, trace)
    sums = got[:, 260:].copy().view("<i2")
    assert int(sums[0, 1]) == int(data[:, 260:].copy().view("<i2")[0, 1]) + 1 and (got[1, 260:] == 0xAB).all()
    q1 = tbq.get_format("q8_1")
    d1, t1 = q1.reference_encode(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32))
    assert np.array_equal(q1.checker.derived(d1, t1), d1)
