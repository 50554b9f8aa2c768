"""turbo2, turbo3, turbo4: the shared battery plus what is particular to the fork's KV-cache types.

The spec is docs/formats.md, "TURBO2 / TURBO3 / TURBO4" (and /work/shared/SPEC-turbo.md). Oracles: the
fork's strict conformance vectors (tests/data/conformance/turbo/: the 1792 rows in the battery, the
decode_random bytes with their NaN payloads, the special NaN/inf/overflow rows), the slow per-block
model of tests/naive_turbo.py, the conformance copy of the tables, and the C code's index scan.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import DATA, assert_bits_equal, assert_bytes_equal, check_format, load_npz
from naive import decode_block, encode_block
from naive_turbo import literal_f32

import tbq
from tbq.formats.planar_iso import pack_planes3
from tbq.formats.turbo import TABLES, pack_quads2, turbo_index, unpack_quads2
from tbq.rotation import RandomizedHadamard, hadamard_scale, turboq_mtp_signs

F32 = np.float32
FORMATS = ["turbo2", "turbo3", "turbo4"]
BACKENDS = ("numpy", "numba")
TURBO = DATA / "turbo"


def bits_of(fmt):
    return tbq.format_info(fmt).index_bits


def _json_f32(entry):
    return np.array([int(b, 16) for b in entry["float32_bits"]], np.uint32).view(F32)


def _raw_tables():
    return json.loads((TURBO / "tables-turbo.json").read_text())["tables"]


# ---------------------------------------------------------------------------
# the battery (round trip, numpy == numba, the 1792 conformance rows, bad input, config, naive model)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_battery(fmt):
    check_format(fmt)


def test_battery_cuda_thresholds():
    check_format("turbo4", thresholds="cuda")


def test_registry_rows():
    rows = {f: tbq.format_info(f) for f in FORMATS}
    assert [(i.code, i.block_size, i.type_size, i.index_bits, i.rotated) for i in rows.values()] == [
        (21, 128, 34, 2, True),
        (22, 128, 50, 3, True),
        (23, 128, 68, 4, True),
    ]
    assert [i.bits_per_value for i in rows.values()] == [2.125, 3.125, 4.25]  # SPEC §1
    for f in FORMATS:
        fm = tbq.get_format(f)
        assert fm.domain.decode_domain == "rotated" and fm.attention.domain == "rotated"
        assert fm.fuzz.hazards == {"thresholds": {}}  # the strategies aim at the thresholds and the exact rotated zeros
        assert not fm.decode_tolerance(np.zeros((3, fm.type_size), np.uint8)).any()  # single products: exact
    assert tbq.get_format("turbo4").config() == {"thresholds": "cpu"}
    assert tbq.get_format("turbo2").config() == {} == tbq.get_format("turbo3").config()
    with pytest.raises(tbq.ConfigError, match="'thresholds' is an option of turbo4"):
        tbq.get_format("turbo3", thresholds="cuda")
    with pytest.raises(tbq.ConfigError, match="thresholds"):
        tbq.get_format("turbo4", thresholds="metal")


# ---------------------------------------------------------------------------
# tables and layouts
# ---------------------------------------------------------------------------


def test_tables_are_the_conformance_tables():
    raw = _raw_tables()
    for bits in (2, 3, 4):
        assert_bits_equal(TABLES[f"centroids_{bits}bit"], _json_f32(raw[f"turbo{bits}_centroids"]), f"C{bits}")
        assert_bits_equal(TABLES[f"thresholds_{bits}bit"], _json_f32(raw[f"turbo{bits}_thresholds"]), f"t{bits}")
        f = tbq.get_format(f"turbo{bits}")
        t = f.tables()
        assert set(t) == {"centroids", "thresholds", "signs1", "signs2"}
        assert_bits_equal(t["thresholds"], TABLES[f"thresholds_{bits}bit"])
        # the middle threshold is exactly +0, and the literals are not the exact midpoints (SPEC §4)
        mid = t["thresholds"][len(t["thresholds"]) // 2]
        assert mid.view(np.uint32) == 0
        C = t["centroids"].astype(np.float64)
        # (turbo2's happen to round to the float32 midpoints; turbo3's and turbo4's by up to 5.03e-7)
        gap = np.abs(t["thresholds"].astype(np.float64) - (C[1:] + C[:-1]) / 2).max()
        assert (gap == 0) if bits == 2 else (5e-7 < gap < 5.1e-7)
    s1, s2 = turboq_mtp_signs()
    assert np.array_equal(s1, _json_f32(raw["wht_signs1"]).astype(np.int8))
    assert np.array_equal(s2, _json_f32(raw["wht_signs2"]).astype(np.int8))
    assert hadamard_scale(128, F32).view(np.uint32) == int(raw["inv_sqrt_128"]["float32_bits"][0], 16)
    assert F32(1e-10).view(np.uint32) == int(raw["eps"]["float32_bits"][0], 16)
    # CUDA/Vulkan's 4-bit thresholds: the four literals that differ, as a compiler rounds them (SPEC §10 Q5)
    cpu, cuda = TABLES["thresholds_4bit"], TABLES["thresholds_4bit_cuda"]
    differ = np.flatnonzero(cpu != cuda)
    assert differ.tolist() == [0, 6, 8, 14]
    for i, lit in zip(differ, ("-0.145561f", "-0.013964f", "0.013964f", "0.145561f"), strict=True):
        assert cuda[i] == literal_f32(lit)
    # 67 and 1074 float32 values per positive interval get other indices
    gaps = cuda.view(np.int32)[[8, 14]] - cpu.view(np.int32)[[8, 14]]
    assert gaps.tolist() == [1074, 67]


def test_rotation_is_tbq_rotation_bit_for_bit():
    # SPEC §5 by hand (s1, butterfly, then * fl(INV * s2)) against tbq.rotation with the turboq-mtp signs
    from naive_turbo import rotate

    rot = RandomizedHadamard(*turboq_mtp_signs())
    rng = np.random.default_rng(4)
    for u in rng.standard_normal((6, 128)).astype(F32) * F32(0.09):
        assert_bits_equal(rot.forward(u), np.array(rotate(list(u)), F32), "R(u)")


def test_packing():
    idx = np.zeros((1, 128), np.uint8)
    idx[0, :4] = [0, 1, 2, 3]
    assert pack_quads2(idx)[0, 0] == 0xE4 and not pack_quads2(idx)[0, 1:].any()  # SPEC §2's example
    rng = np.random.default_rng(3)
    for bits in (2, 3, 4):
        f = tbq.get_format(f"turbo{bits}")
        idx = rng.integers(0, 1 << bits, (20, 128)).astype(np.uint8)
        data = np.zeros((20, f.type_size), np.uint8)
        data[:, 0:2] = [0x00, 0x3C]  # d = 1
        data[:, 4 if bits == 4 else 2 :] = f._pack(idx)
        fl = f.fields(data)
        assert fl["idx"].shape == (20, 1, 128) and fl["d"].shape == (20, 1)
        assert np.array_equal(fl["idx"][:, 0], idx) and fl["d"].ravel().tolist() == [1.0] * 20
        assert sorted(fl) == (["d", "idx", "rnorm"] if bits == 4 else ["d", "idx"])
        assert_bits_equal(f.decode(data).reshape(20, 128), f.codebook.centroids[idx], "C[idx] * 1")
        for row in data[:3]:  # the spec's unpacking formulas (the naive model's)
            assert_bits_equal(f.decode(row), np.array(decode_block(f, bytes(row)), F32))
    assert np.array_equal(unpack_quads2(pack_quads2(idx & 3)), idx & 3)
    # turbo3's planes are planar3_0's
    f3 = tbq.get_format("turbo3")
    assert np.array_equal(f3._pack(idx & 7), pack_planes3(idx & 7))


# ---------------------------------------------------------------------------
# the index rule: literal thresholds, ties up, zeros to the upper middle, NaN last
# ---------------------------------------------------------------------------


def c_scan(r, thr):
    """The C loop, vectorised: the first k with r < t_k, else n - 1."""
    r = np.asarray(r, F32)
    out = np.full(r.shape, len(thr), np.uint8)
    for k in range(len(thr) - 1, -1, -1):
        out = np.where(r < thr[k], k, out).astype(np.uint8)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_index_rule_is_the_c_scan(fmt):
    thr = tbq.get_format(fmt).codebook.thresholds
    tb = thr.view(np.uint32).astype(np.int64)
    sign, mag = tb & 0x80000000, tb & 0x7FFFFFFF
    near = ((mag[:, None] + np.arange(-50, 51)) | sign[:, None]).astype(np.uint32).view(F32).reshape(-1)
    rng = np.random.default_rng(9)
    special = np.array([0.0, -0.0, 1e-45, -1e-45, np.nan, -np.nan, np.inf, -np.inf, 1.0, -1.0], F32)
    r = np.concatenate([near, rng.uniform(-0.3, 0.3, 100_000).astype(F32), special])
    assert_bytes_equal(turbo_index(r, thr), c_scan(r, thr), fmt)
    n = len(thr) + 1
    assert turbo_index(np.array([0.0, -0.0, np.nan], F32), thr).tolist() == [n // 2, n // 2, n - 1]
    assert turbo_index(thr, thr).tolist() == list(range(1, n))  # on a threshold: the upper index


def test_zero_blocks_take_the_upper_middle_index_on_both_backends():
    # SPEC §8's bytes for +-0 blocks, subnormal inputs (every square underflows) and norm <= 1e-10
    expect = {
        "turbo2": "0000" + "aa" * 32,
        "turbo3": "0000" + "00" * 32 + "ff" * 16,
        "turbo4": "00000000" + "88" * 64,
    }
    g = np.random.default_rng(2).standard_normal((2, 128)).astype(F32)
    x = np.stack([np.zeros(128, F32), np.full(128, -0.0, F32), g[0] * F32(1e-40), g[1] * F32(5e-12)])
    for fmt in FORMATS:
        for b in BACKENDS:
            q = tbq.get_codec(fmt, backend=b).encode(x)
            assert [bytes(r).hex() for r in q] == [expect[fmt]] * 4, (fmt, b)
            y = tbq.get_codec(fmt, backend=b).decode(q)
            assert not y.any() and not np.signbit(y).any()  # +C[mid] * +0


@pytest.mark.parametrize("fmt", FORMATS)
def test_rotated_exact_zeros_take_the_positive_middle_centroid(fmt):
    inputs = load_npz("inputs")
    ref = load_npz(f"turbo/{fmt}__strict")
    f = tbq.get_format(fmt)
    _, tr = f.reference_encode(inputs["x"])
    r = tr["r"]
    zero = (r == 0) & np.isfinite(r)
    rows = np.flatnonzero(zero.any(axis=1))
    assert rows.size >= 90  # the edge kinds zero, const_+-0.5, two_hot_equal, rotated_one_hot (SPEC §14: 93 rows)
    idx = f.fields(ref["q"])["idx"][:, 0]
    mid = (len(f.codebook.centroids)) // 2
    assert (idx[zero] == mid).all()
    # the tie rule matters on exactly these rows: the lower index would change their bytes
    lower = np.where(zero, mid - 1, idx)
    assert (lower != idx).any(axis=1).sum() == rows.size == 93


def _nearest_centroid(r, C):
    """argmin |r - C_i| (first on ties): the "obvious" alternative to the literal thresholds."""
    e = np.abs(r[..., None].astype(np.float64) - C.astype(np.float64))
    return np.argmin(e, axis=-1).astype(np.uint8)


@pytest.mark.parametrize("fmt,rows", [("turbo2", []), ("turbo3", [1365]), ("turbo4", [22, 793, 836, 1010, 1250, 1699])])
def test_literal_thresholds_are_not_the_nearest_centroid(fmt, rows):
    # SPEC §14: the rows where the 6-digit thresholds and the true nearest centroid disagree (exact zeros aside)
    inputs = load_npz("inputs")
    ref = load_npz(f"turbo/{fmt}__strict")
    f = tbq.get_format(fmt)
    q, tr = f.reference_encode(inputs["x"])
    assert_bytes_equal(q, ref["q"], fmt)
    idx = f.fields(q)["idx"][:, 0]
    near = _nearest_centroid(tr["r"], f.codebook.centroids)
    differ = idx != near
    nonzero = differ & (tr["r"] != 0)
    assert np.flatnonzero(nonzero.any(axis=1)).tolist() == rows
    # SPEC §14's counts of rows whose bytes the nearest-centroid rule changes
    assert differ.any(axis=1).sum() == {"turbo2": 93, "turbo3": 94, "turbo4": 99}[fmt]
    # on those coordinates r lies between the literal threshold and the exact midpoint
    C = f.codebook.centroids.astype(np.float64)
    for b, j in zip(*np.nonzero(nonzero), strict=True):
        k = max(idx[b, j], near[b, j])
        lo, hi = sorted([float(f.codebook.thresholds[k - 1]), (C[k - 1] + C[k]) / 2])
        assert lo <= tr["r"][b, j] < hi or lo < tr["r"][b, j] <= hi


def _value_near(fmt_obj, target, rng):
    """A block whose rotated coordinate 0 is a float32 in [target[0], target[1]) (a few tries around the middle)."""
    rot = fmt_obj.rotation
    for _ in range(200):
        mid = (target[0] + target[1]) / 2
        r = rng.standard_normal(128)
        r *= np.sqrt(1 - mid * mid) / np.sqrt((r[1:] * r[1:]).sum())
        r[0] = mid  # a unit vector with coordinate 0 in the middle of the gap
        x = rot.inverse(r).astype(F32) * F32(3.0)
        rr = fmt_obj.encode(x, trace=True)[1]["r"]
        if target[0] <= rr[0, 0] < target[1]:
            return x, rr
    raise AssertionError("no block found")  # pragma: no cover


@pytest.mark.parametrize("which", [0, 1])
def test_cuda_thresholds_give_other_indices_in_the_gap(which):
    # rotated values in [0.145560, 0.145561) / [0.013963, 0.013964) (and the mirrors): CPU and CUDA differ
    cpu, cuda = tbq.get_format("turbo4"), tbq.get_format("turbo4", thresholds="cuda")
    k = (14, 8)[which]
    lo, hi = float(cpu.codebook.thresholds[k]), float(cuda.codebook.thresholds[k])
    rng = np.random.default_rng(5 + which)
    x, r = _value_near(cpu, (lo, hi), rng)
    for sign in (1, -1):
        xs = x * F32(sign)
        for b in BACKENDS:
            qc = tbq.get_codec("turbo4", backend=b).encode(xs)
            qg = tbq.get_codec("turbo4", backend=b, thresholds="cuda").encode(xs)
            ic, ig = cpu.fields(qc)["idx"][0], cuda.fields(qg)["idx"][0]
            # r >= t_cpu: the upper index on the CPU, the lower one under CUDA's larger literal
            # (mirrored: -r < -t_cpu ... -t_cuda <= -r: CUDA's is the upper one)
            assert (int(ic[0]), int(ig[0])) == ((k + 1, k) if sign == 1 else (15 - k - 1, 15 - k)), (b, sign)
            assert (ic[1:] == ig[1:]).sum() >= 120  # elsewhere (almost) the same
        n = encode_block(cuda, xs)[0]  # the naive model with CUDA's literals agrees
        assert n == bytes(tbq.get_codec("turbo4", backend="numpy", thresholds="cuda").encode(xs))


# ---------------------------------------------------------------------------
# decoding: random bytes (NaN payloads included), the rotated domain
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_random_vectors(fmt, backend):
    ref = load_npz(f"turbo/decode_random/{fmt}__strict")
    y = tbq.dequantize(ref["qr"], fmt, backend=backend)
    assert_bits_equal(y, ref["yr"], f"{fmt} decode_random {backend}")  # NaN payloads by bit pattern
    bad = ~np.isfinite(ref["yr"]).all(axis=1)
    exp31 = ((ref["qr"][:, 1] >> 2) & 0x1F) == 0x1F
    assert np.array_equal(bad, exp31)  # exactly the blocks whose fp16 norm has exponent 31 (SPEC §13)
    assert bad.sum() == {"turbo2": 130, "turbo3": 128, "turbo4": 135}[fmt]
    # a NaN norm comes out as itself in every position (x86 keeps the NaN operand), quiet bit set
    h = ref["qr"][:, 0].astype(np.uint32) | (ref["qr"][:, 1].astype(np.uint32) << 8)
    nan = exp31 & ((h & 0x3FF) != 0)
    want = ((h & 0x8000) << 16) | 0x7FC00000 | ((h & 0x3FF) << 13)
    assert (y[nan].view(np.uint32) == want[nan, None]).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_naive_model_reproduces_the_vectors(fmt):
    f = tbq.get_format(fmt)
    inputs = load_npz("inputs")["x"]
    ref = load_npz(f"turbo/{fmt}__strict")
    rows = sorted({0, 318, 793, 1010, 1365, 1699, *range(1536, 1792, 37), *range(1280, 1536, 41)})
    for i in rows:
        b, _ = encode_block(f, inputs[i])
        assert b == bytes(ref["q"][i]), (fmt, i)
        assert_bits_equal(np.array(decode_block(f, b), F32), ref["y"][i], f"{fmt} row {i}")
    sp = load_npz(f"turbo/special/{fmt}__strict")
    for i, label in enumerate(sp["label"]):
        b, _ = encode_block(f, sp["x"][i])
        assert b == bytes(sp["q"][i]), (fmt, label)
        y = np.array(decode_block(f, b), F32)
        assert np.array_equal(np.isnan(y), np.isnan(sp["y"][i])), (fmt, label)
        ok = ~np.isnan(y)
        assert_bits_equal(y[ok], sp["y"][i][ok], f"{fmt} {label}")
    rr = load_npz(f"turbo/decode_random/{fmt}__strict")
    for i in range(0, 4096, 97):  # NaN payloads are not the model's business: compare NaN positions
        y = np.array(decode_block(f, bytes(rr["qr"][i])), F32)
        assert np.array_equal(np.isnan(y), np.isnan(rr["yr"][i]))
        assert_bits_equal(y[~np.isnan(y)], rr["yr"][i][~np.isnan(y)], f"{fmt} random row {i}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_decoded_values_are_the_rotated_domain(fmt):
    f = tbq.get_format(fmt)
    x = np.random.default_rng(8).standard_normal((64, 256)).astype(F32)
    y = f.decode(f.encode(x))
    rx = f.domain.to_decode_domain(x)
    assert rx.dtype == F32 and rx.shape == x.shape
    assert_bits_equal(rx[:, :128], f.rotation.forward(x[:, :128]), "per block")
    err = float(((y - rx).astype(np.float64) ** 2).sum() / (x.astype(np.float64) ** 2).sum())
    # SPEC §10 Q4's NMSE against R(x) on Gaussians: 0.120, 0.0343, 0.0185
    assert abs(err - {"turbo2": 0.120, "turbo3": 0.0343, "turbo4": 0.0185}[fmt]) < 0.01
    assert ((y - x) ** 2).sum() > (x**2).sum()  # against x itself: no resemblance
    back = f.domain.from_decode_domain(y)
    assert abs(float(((back - x).astype(np.float64) ** 2).sum() / (x.astype(np.float64) ** 2).sum()) - err) < 1e-4
    assert np.abs(f.domain.from_decode_domain(rx) - x).max() < 1e-5  # R^-1 R = 1 up to float32 rounding
    assert f.domain.to_decode_domain(x.astype(np.float64)).dtype == np.float64
    with pytest.raises(tbq.BlockShapeError):
        f.domain.to_decode_domain(np.ones(100, F32))
    q8 = tbq.get_format("q8_0")
    assert (
        q8.domain.decode_domain == "original"
        and q8.domain.to_decode_domain(x) is x
        and q8.domain.from_decode_domain(x) is x
    )


# ---------------------------------------------------------------------------
# the encoder's edge cases (SPEC §8): NaN/inf inputs, overflowing norms
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_special_rows(fmt):
    sp = load_npz(f"turbo/special/{fmt}__strict")
    f = tbq.get_format(fmt)
    x, labels = sp["x"], sp["label"]
    # the NumPy reference writes the C bytes for every row, NaN and infinite inputs included
    q, tr = f.reference_encode(np.ascontiguousarray(x))
    assert_bytes_equal(q, sp["q"], f"{fmt} special rows")
    for b in BACKENDS:
        assert_bits_equal(tbq.dequantize(sp["q"], fmt, backend=b), sp["y"], f"{fmt} special decode {b}")
    finite = np.isfinite(x).all(axis=1)
    assert finite.sum() == 12
    last = len(f.codebook.centroids) - 1
    idx = f.fields(q)["idx"][:, 0]
    for i in np.flatnonzero(~finite):  # the public codec refuses non-finite input, on both backends
        for b in BACKENDS:
            with pytest.raises(tbq.NonFiniteError, match="block 0"):
                tbq.get_codec(fmt, backend=b, on_overflow="inf").encode(x[i])
        has_nan = np.isnan(x[i]).any()
        nan_d = np.isnan(tr["d"][i])
        assert nan_d == has_nan
        if has_nan and fmt == "turbo4":  # u = +0 everywhere: the zero block's indices (SPEC §6 step 2)
            assert (idx[i] == last // 2 + 1).all(), labels[i]
        else:  # every rotated value NaN: the last index
            assert np.isnan(tr["r"][i]).all() and (idx[i] == last).all(), labels[i]
        hi = sp["q"][i, 1]
        assert (hi & 0x7F) == (0x7E if has_nan else 0x7C) and sp["q"][i, 0] == 0  # sign | 0x7E00 / +inf
    # finite rows: the codec writes them when their scale fits, refuses them (ScaleOverflowError) when it does
    # not, and with on_overflow="inf" stores what C stores (d = +inf for Sigma x^2 overflow and norm/recon >= 65520)
    over = f.scale_overflows(tr) & finite
    assert [str(s) for s in labels[over]] == [
        "norm_sq_overflow",
        "max_float",
        "large_norm_6000.0",
        "large_norm_7000.0",
        "large_norm_8000.0",
        "large_norm_12000.0",
    ]
    for b in BACKENDS:
        xf = np.ascontiguousarray(x[finite])
        assert_bytes_equal(
            tbq.get_codec(fmt, backend=b, on_overflow="inf").encode(xf), sp["q"][finite], f"{fmt} {b} inf"
        )
        fits = finite & ~over
        assert_bytes_equal(tbq.get_codec(fmt, backend=b).encode(x[fits]), sp["q"][fits], f"{fmt} {b}")
        for i in np.flatnonzero(over):
            with pytest.raises(tbq.ScaleOverflowError, match="block 0"):
                tbq.get_codec(fmt, backend=b).encode(x[i])


# ---------------------------------------------------------------------------
# fragility, value table, the fused attention
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_fragility_marks_values_on_the_thresholds(fmt):
    f = tbq.get_format(fmt)
    inputs = load_npz("inputs")["x"]
    _, tr = f.reference_encode(inputs)
    frag = f.fragile_values(tr, 2)
    zero = tr["r"] == 0
    assert frag[zero].all()  # exact zeros sit on the middle threshold: fragile
    # a value whose index a 2-ulp move (at the floor's magnitude) changes is marked, and only those
    thr = f.codebook.thresholds.astype(np.float64)
    r = tr["r"].astype(np.float64)
    w = 2 * np.spacing(np.maximum(np.abs(r), f.golden.ulp_floor).astype(F32)).astype(np.float64)
    moved = np.searchsorted(thr, r - w, side="right") != np.searchsorted(thr, r + w, side="right")
    assert np.array_equal(frag, moved) and frag.sum() > zero.sum()
    assert f.fragile_values(tr, 2, ulp_floor=0).sum() < frag.sum()
    assert not f.fragile_scales(tr, 0).any()
    lv, inp = f.quantizer.value_table(tr)
    assert np.array_equal(lv, f.codebook.centroids.astype(np.float64)) and inp.size == r.size
    norm, rv = f.quantizer.rotated_view(tr)
    assert rv is tr["r"] and norm is tr["norm"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_attention_over_turbo_caches(fmt):
    from tbq.attention import attention_dequantized, attention_fused, attention_rotated, encode_kv, f32_tolerance

    rng = np.random.default_rng(1)
    q = rng.standard_normal((4, 256), dtype=F32)
    k = rng.standard_normal((24, 2, 256), dtype=F32)
    v = rng.standard_normal((24, 2, 256), dtype=F32)
    K, V = encode_kv(k, v, fmt, fmt, n_sink=2)
    ref = attention_dequantized(q, K, V)
    assert np.max(np.abs(attention_rotated(q, K, V, dtype=np.float64) - ref)) < 1e-12
    assert np.max(np.abs(attention_rotated(q, K, V) - ref)) <= f32_tolerance(q, K, V)
    assert np.max(np.abs(attention_fused(q, K, V) - ref)) <= f32_tolerance(q, K, V)
    # the dequantized caches are in the tokens' domain, close to k and v (not to R(k))
    for cache, x in ((K, k), (V, v)):
        for dt in (np.float32, np.float64):
            y = cache.dequantize(dt)
            assert y.dtype == dt and y.shape == x.shape
            e = float(((y - x) ** 2).sum() / (x.astype(np.float64) ** 2).sum())
            assert e < {"turbo2": 0.15, "turbo3": 0.05, "turbo4": 0.03}[fmt]
        assert np.abs(cache.dequantize(np.float32) - cache.dequantize(np.float64)).max() < 1e-5


def test_study_and_compare_read_the_decoders_domain():
    from tbq.compare import compare
    from tbq.study import CodecQuantizer

    x = np.random.default_rng(6).standard_normal((32, 2, 128)).astype(F32)
    for fmt in FORMATS:
        y = CodecQuantizer(fmt).roundtrip(x)
        e = float(((y - x) ** 2).sum() / (x.astype(np.float64) ** 2).sum())
        assert e < {"turbo2": 0.15, "turbo3": 0.05, "turbo4": 0.03}[fmt], fmt
    rows = compare({"keys": x}, FORMATS, repeat=1, attention=True, n_queries=4)
    assert [r["format"] for r in rows] == FORMATS
    assert [r["NMSE"] < {"turbo2": 0.15, "turbo3": 0.05, "turbo4": 0.03}[r["format"]] for r in rows] == [True] * 3
    assert all(r["top-k"] > 0.5 for r in rows), [r["top-k"] for r in rows]


@pytest.mark.parametrize("fmt", FORMATS)
def test_numba_equals_numpy_on_many_random_blocks(fmt):
    rng = np.random.default_rng(31)
    g = rng.standard_normal((3000, 128)).astype(F32)
    scale = (10.0 ** rng.uniform(-12, 3, (3000, 1))).astype(F32)  # tiny norms (around 1e-10) to large ones
    x = g * scale
    x[::7] = np.round(x[::7] * 4) / 4  # many exact values: exact zeros and ties in the rotated domain
    opts = [{}] if fmt != "turbo4" else [{}, {"thresholds": "cuda"}]
    for o in opts:
        a = tbq.get_codec(fmt, backend="numpy", **o).encode(x)
        for threads in (1, 2):
            b = tbq.get_codec(fmt, backend="numba", threads=threads, **o).encode(x)
            assert_bytes_equal(b, a, f"{fmt} {o} numba threads={threads}")
        assert_bits_equal(
            tbq.get_codec(fmt, backend="numba", **o).decode(a), tbq.get_codec(fmt, backend="numpy", **o).decode(a)
        )


@pytest.mark.parametrize("fmt", FORMATS)
def test_refusals_in_a_long_chunk_name_the_block_and_keep_the_blocks_before(fmt):
    # the numba encoder's many-block path (32 blocks a group): the first refused block, the blocks before it written
    x = np.random.default_rng(12).standard_normal((100, 128)).astype(F32)
    x[70] *= F32(2e5)  # norm / recon >= 65520: an infinite scale
    ref = tbq.get_codec(fmt, backend="numpy", on_overflow="inf").encode(x)
    for b in BACKENDS:
        out = np.zeros((100, tbq.format_info(fmt).type_size), np.uint8)
        with pytest.raises(tbq.ScaleOverflowError, match="block 70"):
            tbq.get_codec(fmt, backend=b, threads=1).encode(x, out=out)
        assert_bytes_equal(out[:70], ref[:70], f"{fmt} {b}: blocks before the refused one")
        assert_bytes_equal(tbq.get_codec(fmt, backend=b, on_overflow="inf").encode(x), ref, f"{fmt} {b} inf")
        bad = x.copy()
        bad[57, 3] = np.nan
        with pytest.raises(tbq.NonFiniteError, match="block 57"):
            tbq.get_codec(fmt, backend=b, threads=1, on_overflow="inf").encode(bad)


@pytest.mark.parametrize("fmt", FORMATS)
def test_tiny_norms_keep_their_indices_with_a_zero_scale(fmt):
    # the conformance rows of kind tiny_1e-9 (norm a little above 1e-10): real indices, d rounds to fp16 +0
    inputs = load_npz("inputs")
    ref = load_npz(f"turbo/{fmt}__strict")
    rows = np.flatnonzero((inputs["family"] == 6) & (inputs["kind"] == 11))
    assert rows.size > 10
    q = ref["q"][rows]
    f = tbq.get_format(fmt)
    zero_block = f.encode(np.zeros(128, F32))
    assert not q[:, :2].any() and (q != zero_block).any(axis=1).all()
    for b in BACKENDS:
        assert_bytes_equal(tbq.get_codec(fmt, backend=b).encode(inputs["x"][rows]), q, f"{fmt} {b}")
        y = tbq.get_codec(fmt, backend=b).decode(q)
        assert not y.any()


# ---------------------------------------------------------------------------
# the vector readers (planar_iso_kernels.lookup_planes3_row / lookup_qs_row, kernels.lookup16_row)
# ---------------------------------------------------------------------------

_EVERY_BYTE_AT_EVERY_POSITION = """
import sys
import numpy as np
import numba
import tbq.kernels as k
from tbq.formats import get_format

@numba.njit
def read(fn, data, out, aux):
    k.call_reader(fn, k.address(data), k.address(out), data.shape[0], k.address(aux), aux.shape[0])

assert (k.TARGET_AVX2, k.TARGET_AVX512VL) == tuple(map(bool, map(int, sys.argv[1:3]))), (k.TARGET_AVX2, k.TARGET_AVX512VL)
for fmt in ("turbo2", "turbo3", "turbo4"):
    f = get_format(fmt)
    ts = f.info.type_size
    # block b holds byte (b + 7j) % 256 at byte j: every value at every position, a NaN and an infinite scale too
    data = ((np.arange(256)[:, None] + 7 * np.arange(ts)[None, :]) % 256).astype(np.uint8)
    want = f.reference_decode(data)
    out = np.empty((256, 128), np.float32)
    f.kernel_decode(data, out)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), fmt
    r = f.attention.reader()
    out[:] = 0
    read(r.read.address, data, out, r.aux)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), fmt + " reader"
print("ok")
"""


@pytest.mark.parametrize(
    "target",
    [
        pytest.param({}, id="host"),
        pytest.param({"NUMBA_CPU_NAME": "generic"}, id="generic"),  # the scalar loops (no AVX2)
        pytest.param(  # AVX2 without AVX-512VL: the planes' bit select as an and, an and and an or
            {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx,+avx2,+f16c,+fma,+bmi,+bmi2,+popcnt,+sse4.2"},
            id="avx2",
        ),
    ],
)
def test_decoders_and_readers_give_the_references_bits_for_every_byte_at_every_position(target, tmp_path):
    """turbo2/3's readers look their planes up with ``vpermps`` (bits 0-1 from the qs word shifted by 2t, bit 2
    from the signs word shifted by 14 + t; turbo2's 4 centroids repeated so that bit 2 is ignored): every byte
    value at every payload position decodes to the NumPy reference's bits, through the codec's decoder and the
    attention reader, on this CPU and compiled for a CPU without AVX2 and one without AVX-512."""
    import os
    import subprocess
    import sys

    import tbq.kernels as k

    env = {key: v for key, v in os.environ.items() if key not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    env.update(target, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    if target:
        want = ("1", "0") if "haswell" in target.values() else ("0", "0")
    else:
        want = (str(int(k.TARGET_AVX2)), str(int(k.TARGET_AVX512VL)))
    r = subprocess.run(
        [sys.executable, "-c", _EVERY_BYTE_AT_EVERY_POSITION, *want], env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout[-2000:] + r.stderr[-3000:]
