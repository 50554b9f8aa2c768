"""vLLM's TurboQuant key and value formats (tbq/formats/vllm_turboquant.py): the SPEC's vectors bit for bit, its
tables, the battery, the slow model at other head sizes, the quirks, and the option checks."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import BACKENDS, DATA, assert_bits_equal, assert_bytes_equal, check_format, load_npz
from naive_vllm_turboquant import decode_block, decode_key_rotated, encode_block

import tbq
from tbq.codebooks import trapezoid_lloyd_max
from tbq.formats.vllm_turboquant import PRESETS, exact_unrotate, hadamard_h, pr38479_signs, vllm_centroids

FORMATS = ("vllm_tq4_k", "vllm_tq3_k", "vllm_tq4_v", "vllm_tq3_v")
MSE = ("turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
#: (vector file stem, preset, key options)
VECTORS = [(f"vllm/{p}", p, {}) for p in PRESETS] + [
    (f"vllm/{p}__pr38479_signs_layer2", p, {"rotation": "pr38479", "layer": 2}) for p in MSE
]
ROT = {"rotation": "pr38479", "layer": 2}


@pytest.mark.parametrize("fmt", FORMATS)
def test_format_battery(fmt):
    check_format(fmt)


def test_battery_with_pr38479_rotation():
    check_format("vllm_tq3_k", **ROT)


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("fmt", FORMATS)
def test_format_battery_at_other_head_dims(fmt, head_dim):
    """The whole battery on the instance's own block (head_dim values, the registry's row being 128's)."""
    assert tbq.get_format(fmt, head_dim=head_dim).info.block_size == head_dim != tbq.format_info(fmt).block_size
    check_format(fmt, head_dim=head_dim)


# ---------------------------------------------------------------------------
# the SPEC's vectors: every row, both backends
# ---------------------------------------------------------------------------


def _parts(preset: str) -> tuple[int, int]:
    p = PRESETS[preset]
    return p.key_bytes(128), p.value_bytes(128)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stem, preset, kopt", VECTORS, ids=[v[0] for v in VECTORS])
def test_vectors_bit_for_bit(stem, preset, kopt, backend):
    """Key and value bytes of every row, the decoded yk (model domain), yk_rot (rotated) and yv, the traced norm
    and rotated unit key, and the tables the file names."""
    ref = load_npz(stem)
    x = load_npz("inputs")["x"]
    p = PRESETS[preset]
    kp, vp = _parts(preset)
    kopts = {**dict(p.key_options), **kopt}
    kq = tbq.quantize(x, p.key, backend=backend, on_overflow=p.key_overflow, **kopts)
    vq = tbq.quantize(x, p.value, backend=backend, on_overflow=p.value_overflow)
    assert_bytes_equal(kq, ref["q"][:, :kp], f"{stem} key bytes")
    assert_bytes_equal(vq, ref["q"][:, kp : kp + vp], f"{stem} value bytes")
    yk = tbq.dequantize(ref["q"][:, :kp], p.key, backend=backend, **kopts)
    assert_bits_equal(yk, ref["yk"], f"{stem} yk")
    assert_bits_equal(tbq.dequantize(ref["q"][:, kp : kp + vp], p.value, backend=backend), ref["yv"], f"{stem} yv")
    fmt = tbq.get_format(p.key, **kopts)
    if preset != "turboquant_k8v4":
        assert_bits_equal(fmt.decode_rotated(ref["q"][:, :kp], backend=backend), ref["yk_rot"], f"{stem} yk_rot")
        _, trace = fmt.encode(x, trace=True)
        assert_bits_equal(trace["norm"][:, 0], ref["knorm"], f"{stem} knorm")
        assert_bits_equal(trace["r"][:, 0], ref["y_rot"], f"{stem} y_rot")
        assert_bits_equal(fmt.tables()["centroids"], ref["centroids"], f"{stem} centroids")
        assert_bits_equal(fmt.tables()["thresholds"], ref["midpoints"], f"{stem} midpoints")
        if "signs" in ref:
            assert np.array_equal(fmt.tables()["signs"], ref["signs"].astype(np.int8))
    else:  # FP8 keys: yk_rot is yk (no rotation); fp8_e4m3 saturating is vLLM's key writer
        assert_bits_equal(ref["yk_rot"], ref["yk"], f"{stem} yk_rot")
        assert kopts == {"scale": 1.0} and p.key_overflow == "saturate"


def test_the_vectors_hold_the_hazards_they_are_said_to():
    """Sanity of the data the tests lean on: values above FP8's 448 (saturation), rows whose rotated coordinates are
    exact zeros on the midpoint 0 (SPEC section 7), and 1792 rows."""
    x = load_npz("inputs")["x"]
    assert x.shape == (1792, 128) and np.abs(x).max() > 464
    y = load_npz("vllm/turboquant_4bit_nc")["y_rot"]
    assert ((y == 0).sum(axis=1) > 64).sum() >= 20


def test_ml_dtypes_e4m3fn_agrees_with_the_vectors_below_448():
    ml = pytest.importorskip("ml_dtypes")
    x = load_npz("inputs")["x"]
    q = load_npz("vllm/turboquant_k8v4")["q"][:, :128]
    inside = np.abs(x) <= 448  # ml_dtypes does not saturate: beyond 464 it gives NaN
    got = x.astype(ml.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(got[inside], q[inside]) and (~inside).sum() > 0
    assert set(np.unique(q[~inside]).tolist()) <= {0x7E, 0xFE}


# ---------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------


def _tables_txt() -> dict[tuple[int, int, str], np.ndarray]:
    out = {}
    key = None
    for line in (DATA / "vllm" / "tables.txt").read_text().splitlines():
        m = re.match(r"### d=(\d+) bits=(\d+)", line)
        if m:
            key = (int(m[1]), int(m[2]))
        m = re.match(r"(centroids|midpoints)_hex: (.*)", line)
        if m:
            out[key + (m[1],)] = np.array([int(h, 16) for h in m[2].split(", ")], np.uint32).view(np.float32)
    return out


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("bits", [3, 4])
def test_tables_are_the_solvers_bit_for_bit(d, bits):
    want = _tables_txt()
    c, m = vllm_centroids(bits, d)
    assert_bits_equal(c, want[(d, bits, "centroids")], f"D={d} {bits}-bit centroids")
    assert_bits_equal(m, want[(d, bits, "midpoints")], f"D={d} {bits}-bit midpoints")
    fmt = tbq.get_format("vllm_tq4_k" if bits == 4 else "vllm_tq3_k", head_dim=d)
    assert_bits_equal(fmt.tables()["centroids"], c, "the format's table")
    # exactly antisymmetric, the middle midpoint exactly 0
    assert np.array_equal(c, -c[::-1]) and m[len(m) // 2] == 0 and not np.signbit(m[len(m) // 2])


def test_solver_iterations_4bit_unconverged_3bit_converged():
    """SPEC section 6: the 4-bit tables are the 200th iterate (never below the 1e-10 tolerance), the 3-bit ones stop
    earlier; D=256 is exactly half of D=64 (sigma scales by a power of two)."""
    for d in (64, 128, 256):
        assert trapezoid_lloyd_max(4, d)[1] == 200
        assert 130 < trapezoid_lloyd_max(3, d)[1] < 200
    for bits in (3, 4):
        assert_bits_equal(vllm_centroids(bits, 256)[0], vllm_centroids(bits, 64)[0] / np.float32(2), "D=256 = D=64 / 2")


def test_hadamard_entries():
    assert [hex(int(hadamard_h(d).view(np.uint32))) for d in (64, 128, 256)] == [
        "0x3e000000",
        "0x3db504f3",
        "0x3d800000",
    ]
    h = hadamard_h(128)  # vLLM un-rotates with fp16(h): docs/formats-vllm.md's 0.08837890625 and scale 0.999893
    assert float(np.float16(h)) == 0.08837890625 and round(float(np.float16(h)) / float(h), 6) == 0.999893
    f = tbq.get_format("vllm_tq4_k", head_dim=64, **ROT)
    P = f.hadamard().astype(np.float64)
    assert np.allclose(P @ P.T, np.eye(64), atol=1e-6)
    assert np.array_equal(np.sign(P[:, 0]), f.tables()["signs"])  # row i scaled by s_i


# ---------------------------------------------------------------------------
# other head sizes: backends, the slow model, exactness
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("fmt", FORMATS)
def test_head_dims_backends_agree_and_sizes(fmt, d):
    c_np = tbq.get_codec(fmt, head_dim=d, backend="numpy", on_overflow="inf")
    c_nb = tbq.get_codec(fmt, head_dim=d, backend="numba", on_overflow="inf")
    bits = c_np.info.index_bits
    assert c_np.block_size == d and c_np.type_size == d * bits // 8 + (2 if c_np.info.rotated else 4)
    rng = np.random.default_rng(d)
    x = rng.standard_normal((40, 2 * d)).astype(np.float32) * np.float32(3)
    x[3, :d] = 0.5  # the exact-zero hazard
    x[4] = 0
    q = c_np.encode(x)
    assert q.shape == (40, 2 * c_np.type_size)
    assert_bytes_equal(c_nb.encode(x), q, f"{fmt} D={d} encode")
    assert_bits_equal(c_nb.decode(q), c_np.decode(q), f"{fmt} D={d} decode")
    raw = rng.integers(0, 256, (64, c_np.type_size), dtype=np.uint8)
    a, b = c_np.decode(raw), c_nb.decode(raw)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{fmt} D={d}: random bytes (NaNs canonical)"


@pytest.mark.parametrize(
    "fmt, d, opts",
    [(f, d, {}) for f in FORMATS for d in (64, 256)] + [(f, d, ROT) for f in FORMATS[:2] for d in (64, 128)],
)
def test_slow_model_at_other_head_dims(fmt, d, opts):
    f = tbq.get_format(fmt, head_dim=d, **opts)
    rng = np.random.default_rng(3)
    rows = np.stack([rng.standard_normal(d) * 2, np.full(d, 0.5), rng.standard_normal(d) * 1e-3]).astype(np.float32)
    q, trace = f.encode(rows, trace=True)
    for i, row in enumerate(rows):
        b, tr = encode_block(f, row)
        assert bytes(q[i]) == b, f"{fmt} D={d} {opts} row {i}: bytes vs the slow model"
        for key, v in tr.items():
            assert_bits_equal(trace[key][i, 0], np.asarray(v, np.float32), f"{fmt} row {i} trace {key}")
        assert_bits_equal(f.decode(q[i]), np.array(decode_block(f, b), np.float32), f"{fmt} row {i} decode")
        if f.info.rotated:
            assert_bits_equal(
                f.decode_rotated(q[i], backend="numpy"), np.array(decode_key_rotated(f, b), np.float32), "yk_rot"
            )


def test_exact_unrotate_is_the_correctly_rounded_fp16_of_the_exact_sum():
    """Rows of fp16 values with a wide range and sums landing on fp16 midpoints: the integer path against exact
    rationals (a float32 or float64 accumulation would round twice)."""
    from fractions import Fraction

    from naive_vllm_turboquant import rn16, sylvester

    rng = np.random.default_rng(5)
    d = 16
    h = tbq.get_format("vllm_tq4_k", head_dim=128).h16_mant, tbq.get_format("vllm_tq4_k").h16_exp
    rows = (
        (rng.standard_normal((30, d)) * np.exp2(rng.integers(-20, 12, (30, d)))).astype(np.float16).astype(np.float32)
    )
    rows[0] = 0
    rows[1, :] = np.float16(2**-24)  # the smallest subnormal everywhere
    rows[2, :] = 65504
    sh = np.ones(d)
    got = exact_unrotate(rows, sh, *h)
    h16 = Fraction(h[0]) * Fraction(2) ** h[1]
    for r in range(rows.shape[0]):
        want = [rn16(sum(Fraction(float(rows[r, i])) * sylvester(i, j) for i in range(d)) * h16) for j in range(d)]
        assert_bits_equal(got[r], np.array(want, np.float32), f"row {r}")
    assert not np.signbit(got[0]).any()  # an exact zero sum is +0


# ---------------------------------------------------------------------------
# quirks (SPEC section 9)
# ---------------------------------------------------------------------------


def test_constant_key_decodes_far_from_itself_without_signs():
    """Quirk 1: a constant +0.5 key rotates to one coordinate; the other 127 are exact zeros on the midpoint 0 and
    all take the smallest positive centroid, so k[0] decodes to 3.08 (4-bit) instead of 0.5; PR #38479's signs
    spread the same key and it decodes close to 0.5. The vectors hold the same row."""
    x = np.full((1, 128), 0.5, np.float32)
    inputs = load_npz("inputs")["x"]
    row = int(np.flatnonzero((inputs == np.float32(0.5)).all(axis=1))[0])
    assert load_npz("vllm/turboquant_4bit_nc")["yk"][row, 0] == np.float32(3.078125)
    for fmt, k0, signed in (("vllm_tq4_k", 3.078125, 0.08), ("vllm_tq3_k", None, 0.19)):
        f = tbq.get_format(fmt)
        q, trace = f.encode(x, trace=True)
        r = trace["r"][0, 0]
        assert abs(r[0] - 1) < 1e-6 and (r[1:] == 0).all() and not np.signbit(r[1:]).any()
        idx = f.fields(q)["idx"][0, 0]
        assert (idx[1:] == (1 << f.info.index_bits) // 2).all()
        y = f.decode(q)[0]
        rel = np.linalg.norm(y - x[0]) / np.linalg.norm(x[0])
        if k0 is not None:
            assert y[0] == np.float32(k0) and 0.47 < rel < 0.49
        else:
            assert 0.87 < rel < 0.89
        yr = tbq.get_format(fmt, **ROT).decode(tbq.get_format(fmt, **ROT).encode(x))[0]
        assert np.linalg.norm(yr - x[0]) / np.linalg.norm(x[0]) < signed


def test_value_scale_subnormal_and_zero():
    """Quirk 4: a scale below 6.1e-5 is stored as an fp16 subnormal (coarse), below 3e-8 as 0; a constant vector
    stores scale 0, codes 0 and decodes to fp16(min)."""
    f = tbq.get_format("vllm_tq4_v")
    x = np.stack(
        [
            np.linspace(0, 15 * 2.0**-20, 128),  # scale 2**-20: an fp16 subnormal, exact
            np.linspace(1.0, 1.0 + 15 * 3e-6, 128),  # scale ~3e-6: subnormal, rounded
            np.full(128, 0.3),  # constant: scale clamps to RN32(1e-8), stored as 0
        ]
    ).astype(np.float32)
    q, tr = f.encode(x, trace=True)
    fl = f.fields(q)
    assert fl["d"][0, 0] == np.float32(2.0**-20) and q[0, 64:66].view("<u2")[0] == 0x0010
    assert 0 < q[1, 64:66].view("<u2")[0] < 0x0400  # a subnormal fp16
    assert tr["d"][2, 0] == np.float32(1e-8) and q[2, 64:66].tolist() == [0, 0] and (fl["qs"][2] == 0).all()
    y = f.decode(q)
    assert (y[2] == np.float32(np.float16(0.3))).all()
    assert np.abs(y[0] - x[0]).max() <= 2.0**-21  # half a step


def test_tiny_key_is_quantized_as_a_vector_of_norm_one_half():
    """Quirk 7: norm + 1e-8 in the denominator: a key of norm 1e-8 is rotated as a vector of norm 0.5, and its fp16
    norm is 0 (below half the smallest subnormal), so it decodes to zeros."""
    f = tbq.get_format("vllm_tq4_k")
    x = np.zeros((1, 128), np.float32)
    x[0, 5] = 1e-8
    q, tr = f.encode(x, trace=True)
    r = tr["r"][0, 0].astype(np.float64)
    assert abs(np.linalg.norm(r) - 0.5) < 1e-6
    assert f.fields(q)["d"][0, 0] == 0 and (f.decode(q) == 0).all()


def test_norm_overflow_raises_or_stores_inf():
    f = tbq.get_codec("vllm_tq3_k", backend="numpy")
    x = np.full((1, 128), 6000.0, np.float32)  # norm 67882 > 65504
    with pytest.raises(tbq.ScaleOverflowError, match="block 0"):
        f.encode(x)
    for backend in BACKENDS:
        q = tbq.get_codec("vllm_tq3_k", backend=backend, on_overflow="inf").encode(x)
        assert q[0, 48:50].view("<u2")[0] == 0x7C00
    for backend in BACKENDS:
        v = tbq.get_codec("vllm_tq4_v", backend=backend)
        with pytest.raises(tbq.ScaleOverflowError, match="minimum"):
            v.encode(np.full((1, 128), -70000.0, np.float32))
        # finite fields, but the top code decodes beyond fp16 (quirk 6): fp16(65010) = 65024, + 15 * fp16(509 / 15)
        near = np.linspace(65010, 65519, 128, dtype=np.float32)[None, :]
        with pytest.raises(tbq.ScaleOverflowError, match="decodes to 65533.06"):
            v.encode(np.concatenate([np.zeros((1, 128), np.float32), near]))
        y = tbq.get_codec("vllm_tq4_v", backend=backend, on_overflow="inf").decode(
            tbq.get_codec("vllm_tq4_v", backend=backend, on_overflow="inf").encode(near)
        )
        assert np.isposinf(y[0, -1]) and np.isfinite(y[0, :100]).all()  # the top codes only


# ---------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt, opts, words",
    [
        ("vllm_tq4_k", {"head_dim": 96}, "power of two"),
        ("vllm_tq3_k", {"head_dim": 2048}, "power of two"),
        ("vllm_tq4_k", {"head_dim": True}, "power of two"),
        ("vllm_tq4_v", {"head_dim": 100}, "multiple of 8"),
        ("vllm_tq4_k", {"rotation": "qr"}, "'hadamard'"),
        ("vllm_tq4_k", {"rotation": "pr38479"}, "needs layer="),
        ("vllm_tq4_k", {"layer": 3}, "needs layer="),
        ("vllm_tq4_k", {"rotation": "pr38479", "layer": -1}, "non-negative"),
        ("vllm_tq4_v", {"rotation": "pr38479"}, "no option"),
    ],
)
def test_bad_options_are_one_line_config_errors(fmt, opts, words):
    with pytest.raises(tbq.ConfigError, match=words) as e:
        tbq.get_codec(fmt, **opts)
    assert fmt in str(e.value) and "\n" not in str(e.value)


def test_value_head_dim_need_not_be_a_power_of_two():
    c = tbq.get_codec("vllm_tq4_v", head_dim=96, backend="numpy")
    assert (c.block_size, c.type_size) == (96, 52)
    assert tbq.get_codec("vllm_tq4_k", head_dim=64, backend="numpy").get_config()["head_dim"] == 64


def test_pr38479_signs_are_mt19937_bits():
    s = pr38479_signs(2, 128)
    u = np.random.RandomState(2716).randint(0, 2**32, size=128, dtype=np.uint64)
    assert np.array_equal(s, 2 * (u % 2).astype(np.int8) - 1)
    assert not np.array_equal(pr38479_signs(0, 128), s)


def test_fused_attention_reads_the_decoded_model_domain():
    """The fused attention kernel reads these formats in the original domain (their decoders' bits): the
    kernel's output equals the float64 reference on the decoded caches to float32 accuracy."""
    from tbq.attention import attention_dequantized, attention_fused, encode_kv

    rng = np.random.default_rng(0)
    k = rng.standard_normal((40, 2, 128)).astype(np.float32)
    v = rng.standard_normal((40, 2, 128)).astype(np.float32)
    q = rng.standard_normal((4, 128)).astype(np.float32)
    for kf, vf in (("vllm_tq4_k", "vllm_tq4_v"), ("vllm_tq3_k", "vllm_tq3_v")):
        K, V = encode_kv(k, v, kf, vf)
        ref = attention_dequantized(q, K, V)
        out = attention_fused(q, K, V)
        assert np.abs(out - ref).max() < 1e-4


def test_tbq_check_passes_the_reference_and_names_the_pr38479_rotation():
    """tbq check on Python kernels: tbq's own passes; one that rotates with PR #38479's layer-2 signs fails and the
    diagnosis names the options it follows (the declared known values)."""
    from tbq.check import check_kernel

    good = check_kernel(
        "vllm_tq3_k",
        quantize=lambda x: tbq.quantize(x, "vllm_tq3_k"),
        dequantize=lambda d: tbq.dequantize(d, "vllm_tq3_k"),
        blocks=300,
        examples=0,
    )
    assert good.ok, good
    bad = check_kernel(
        "vllm_tq3_k", quantize=lambda x: tbq.quantize(x, "vllm_tq3_k", on_overflow="inf", **ROT), blocks=300, examples=0
    )
    assert not bad.ok
    assert any(d.name == "format_options" and "rotation='pr38479', layer=2" in d.title for d in bad.diagnoses)
