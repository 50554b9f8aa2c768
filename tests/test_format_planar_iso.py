"""planar3_0, iso3_0, planar4_0, iso4_0: the shared battery plus what is particular to these formats.

The spec is docs/formats.md, "PLANAR3_0 / ISO3_0 / PLANAR4_0 / ISO4_0". Oracles:
the C reference's strict conformance vectors (in the battery), the slow
models of tests/naive_planar_iso.py (trace, bytes, decoded bits, random
bytes), the C code's literal nearest-centroid search (against the threshold
form both backends use), and an exact emulation of fused multiply-adds (the
decoder tolerance and the fragility mask). gguf-py has no planar/iso
functions, and the conformance set has no decode_random file for them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import DATA, assert_bits_equal, assert_bytes_equal, check_format, load_npz
from naive import decode_block, encode_block
from naive_planar_iso import nearest

import tbq
from tbq.formats.planar_iso import pack_planes3, planar_iso_tables, threshold_index, unpack_planes3

F32 = np.float32
FORMATS = ["planar3_0", "iso3_0", "planar4_0", "iso4_0"]
BACKENDS = ("numpy", "numba")
ZERO_PAYLOAD = {3: bytes([0xFF] * 32 + [0x00] * 16), 4: bytes([0x77] * 64)}  # every index 3 (3-bit) / 7 (4-bit)


def bits_of(fmt):
    return tbq.format_info(fmt).index_bits


def is_quat(fmt):
    return fmt.startswith("iso")


# ---------------------------------------------------------------------------
# the battery
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_battery(fmt):
    # fields() is {"d", "idx"} (the 3-bit planes combined into idx); test_fields checks it.
    check_format(fmt)


# ---------------------------------------------------------------------------
# tables, fields, packing
# ---------------------------------------------------------------------------


def _json_f32(entry):
    return np.array([int(b, 16) for b in entry["float32_bits"]], np.uint32).view(F32)


def test_shipped_tables_are_the_conformance_tables():
    raw = json.loads((DATA / "tables-planar-iso.json").read_text())
    shipped = planar_iso_tables()
    assert "cuda" not in shipped and not any(k.startswith("cuda") for k in shipped)
    for key in (
        "eps_1e-10f",
        "centroids_3bit",
        "centroids_4bit",
        "givens_cos",
        "givens_sin",
        "quat_w",
        "quat_x",
        "quat_y",
        "quat_z",
        "derived_thresholds_3bit",
        "derived_thresholds_4bit",
    ):
        assert_bits_equal(shipped[key], _json_f32(raw[key]), key)
    assert shipped["eps_1e-10f"].view(np.uint32)[0] == 0x2EDBE6FF
    # the spec's quirk: the middle thresholds sit one ulp above 2**-30 / 2**-32
    assert shipped["derived_thresholds_3bit"].view(np.uint32)[3] == 0x30800001
    assert shipped["derived_thresholds_4bit"].view(np.uint32)[7] == 0x2F800001
    for fmt in FORMATS:
        f = tbq.get_format(fmt)
        t = f.tables()
        rot = {"givens_cos", "givens_sin"} if not is_quat(fmt) else {"quat_w", "quat_x", "quat_y", "quat_z"}
        assert set(t) == {"centroids", "thresholds"} | rot
        assert_bits_equal(t["centroids"], _json_f32(raw[f"centroids_{bits_of(fmt)}bit"]), fmt)
        assert_bits_equal(t["thresholds"], _json_f32(raw[f"derived_thresholds_{bits_of(fmt)}bit"]), fmt)
        assert_bits_equal(f.centroids, t["centroids"])
        assert_bits_equal(f.thresholds, t["thresholds"])
        for k in rot:
            assert_bits_equal(t[k], _json_f32(raw[k]), k)
        assert f.config() == {} and f.options == {} and f.fuzz.hazards == {"thresholds": {}}
        with pytest.raises(tbq.ConfigError):
            tbq.get_format(fmt, codebook="cuda")


def test_spec_packing_example():
    # spec: indices 0..7 at j = 0..7 give qs[0] = qs[1] = 0xE4 and signs[0] = 0xF0
    idx = np.zeros((1, 128), np.uint8)
    idx[0, :8] = np.arange(8)
    planes = pack_planes3(idx)
    assert planes[0, 0] == 0xE4 and planes[0, 1] == 0xE4 and planes[0, 32] == 0xF0
    assert not planes[0, 2:32].any() and not planes[0, 33:].any()
    for fmt in ("planar3_0", "iso3_0"):
        block = np.concatenate([[0, 0x3C], planes[0]]).astype(np.uint8)  # d = 1.0
        fl = tbq.get_format(fmt).fields(block)
        assert fl["idx"].shape == (1, 128) and fl["idx"].dtype == np.uint8
        assert fl["idx"][0, :8].tolist() == list(range(8)) and not fl["idx"][0, 8:].any()
        assert fl["d"].tolist() == [1.0]
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 8, (50, 128)).astype(np.uint8)
    assert np.array_equal(unpack_planes3(pack_planes3(idx)), idx)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fields(fmt):
    f = tbq.get_format(fmt)
    x = np.random.default_rng(5).standard_normal((3, 2, 256)).astype(F32)
    q, tr = f.encode(x, trace=True)
    fl = f.fields(q)
    assert set(fl) == {"d", "idx"}
    assert fl["d"].shape == (3, 2, 2) and fl["d"].dtype == np.float32
    assert fl["idx"].shape == (3, 2, 2, 128) and fl["idx"].dtype == np.uint8
    assert_bits_equal(fl["d"], tr["d"].astype(np.float16).astype(F32), "d")
    assert np.array_equal(fl["idx"], threshold_index(tr["r"], f.thresholds))  # the indices are the traced r's
    # the spec's formula, by hand, for every block
    from naive_planar_iso import unpack

    for b in q.reshape(-1, f.type_size)[:3]:
        assert unpack(bytes(b[2:]), bits_of(fmt)) == f.fields(b)["idx"][0].tolist()
    assert sum(fl.size for fl in f.info.layout) == f.type_size
    assert [fl.name for fl in f.info.layout] == (["d", "qs", "signs"] if bits_of(fmt) == 3 else ["d", "qs"])


# ---------------------------------------------------------------------------
# the index rule: threshold form == the C nearest-centroid search
# ---------------------------------------------------------------------------


def literal_search(r, C):
    """The C loop, vectorised: the first i minimising |fl(r - C[i])|, strict <, scanning upward."""
    r = np.asarray(r, F32)
    best = np.zeros(r.shape, np.uint8)
    be = np.abs(r - C[0])
    for i in range(1, len(C)):
        e = np.abs(r - C[i])
        upd = e < be
        best[upd] = i
        be = np.where(upd, e, be)
    return best


@pytest.mark.parametrize("bits", [3, 4])
def test_threshold_form_equals_the_nearest_centroid_search(bits):
    t = planar_iso_tables()
    C, thr = t[f"centroids_{bits}bit"], t[f"derived_thresholds_{bits}bit"]
    assert len(thr) == len(C) - 1 and np.all(np.diff(thr) > 0)
    # a dense scan of 2 * 200 ulps around each threshold, both sides
    tb = thr.view(np.uint32).astype(np.int64)
    sign, mag = tb & 0x80000000, tb & 0x7FFFFFFF
    r = ((mag[:, None] + np.arange(-200, 201)) | sign[:, None]).astype(np.uint32).view(F32).reshape(-1)
    assert all(np.isin(thr, r)) and r.size == len(thr) * 401
    rng = np.random.default_rng(11)
    rand = rng.uniform(-1.5, 1.5, 1_000_000).astype(F32)
    # random bit patterns with |r| <= 1.5 (every exponent, subnormals, the tiny middle threshold's region)
    pat = rng.integers(0, 0x3FC00001, 300_000, dtype=np.uint32) | (rng.integers(0, 2, 300_000, dtype=np.uint32) << 31)
    special = np.array([0.0, -0.0, 2.0**-30, -(2.0**-30), 2.0**-32, 1e-45, -1e-45, 1.5, -1.5, 1.0, -1.0, np.nan], F32)
    every = np.concatenate([r, rand, pat.view(F32), special, C, (C[1:] + C[:-1]) / F32(2)])
    assert_bytes_equal(
        threshold_index(every, thr), literal_search(every, C), f"{bits}-bit threshold form vs the literal search"
    )
    # the naive model's scalar loop agrees too (a sample)
    for v in np.concatenate([special, r[::97]]):
        assert nearest(v, list(C)) == int(threshold_index(np.array([v]), thr)[0]), v
    # each t_k is the smallest float32 the search maps to an index >= k
    below = np.nextafter(thr, F32(-np.inf))
    assert np.array_equal(literal_search(thr, C), np.arange(1, len(C), dtype=np.uint8))
    assert np.array_equal(literal_search(below, C), np.arange(0, len(C) - 1, dtype=np.uint8))
    # r = +-0 and tiny positive r take the negative centroid; a NaN takes index 0
    mid = len(C) // 2 - 1
    p2 = F32(2.0**-30 if bits == 3 else 2.0**-32)  # the middle threshold is one ulp above this power of two
    assert threshold_index(np.array([0.0, -0.0, p2, 1e-45], F32), thr).tolist() == [mid] * 4
    assert threshold_index(np.array([np.nextafter(p2, F32(1))], F32), thr).tolist() == [mid + 1]
    assert threshold_index(np.array([np.nan], F32), thr).tolist() == [0]


# ---------------------------------------------------------------------------
# the spec's special cases, exact bytes on both backends
# ---------------------------------------------------------------------------


def _both(fmt, x, **kw):
    out = [tbq.get_codec(fmt, backend=b, **kw).encode(x) for b in BACKENDS]
    assert_bytes_equal(out[1], out[0], f"{fmt} numba vs numpy")
    return out[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_and_underflowing_blocks_are_the_zero_block(fmt):
    zero = bytes([0, 0]) + ZERO_PAYLOAD[bits_of(fmt)]
    rng = np.random.default_rng(2)
    g = rng.standard_normal((4, 128)).astype(F32)
    x = np.stack(
        [
            np.zeros(128, F32),
            np.full(128, -0.0, F32),
            g[0] * F32(1e-40),  # subnormal inputs: every square underflows, norm^2 = 0
            g[1]
            / np.sqrt((g[1].astype(np.float64) ** 2).sum()).astype(F32)
            * F32(9e-11),  # 1e-19 < norm <= 1e-10: inv = 0
        ]
    )
    q = _both(fmt, x)
    for i in range(len(x)):
        assert bytes(q[i]) == zero, (fmt, i, bytes(q[i]).hex())
    f = tbq.get_format(fmt)
    _, tr = f.encode(x, trace=True)
    C = f.centroids
    mid = C[len(C) // 2 - 1]
    recon2 = F32(0)
    for _ in range(128):
        recon2 = F32(recon2 + F32(mid * mid))
    recon = np.sqrt(recon2)
    assert_bits_equal(tr["recon"][:, 0], np.full(4, recon, F32), "recon of the zero block")
    assert tr["d"][3, 0] > 0 and tr["d"][3, 0].astype(np.float16) == 0  # d = norm/recon, rounds to fp16 +0
    assert_bits_equal(tr["d"][3, 0], F32(tr["norm"][3, 0] / recon))
    assert abs(recon - (0.2428 if bits_of(fmt) == 3 else 0.0785)) < 1e-4  # the spec's figures
    for b in BACKENDS:  # decodes to signed zeros: f * (+0)
        y = tbq.get_codec(fmt, backend=b).decode(q)
        assert not y.any() and y.dtype == F32
        assert_bits_equal(y[0], np.array(decode_block(f, bytes(q[0])), F32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_tiny_blocks_keep_their_indices_with_a_zero_scale(fmt):
    # the conformance rows of kind tiny_1e-9: d rounds to fp16 +0 while the indices are real
    inputs = load_npz("inputs")
    ref = load_npz(f"{fmt}__strict")
    rows = np.flatnonzero(inputs["kind"] == 11)
    assert rows.size > 10
    q = ref["q"][rows]
    assert not q[:, :2].any()
    assert (q[:, 2:] != np.frombuffer(ZERO_PAYLOAD[bits_of(fmt)], np.uint8)).any(axis=1).all()
    for b in BACKENDS:
        assert_bytes_equal(tbq.get_codec(fmt, backend=b).encode(inputs["x"][rows]), q, f"{fmt} {b}")
        assert not tbq.get_codec(fmt, backend=b).decode(q).any()


def _scaled_to(fmt, target, rng):
    """A Gaussian block scaled so that its float32 d lies in [target[0], target[1])."""
    f = tbq.get_format(fmt)
    for _ in range(100):
        g = rng.standard_normal(128).astype(F32)
        d0 = f.encode(g, trace=True)[1]["d"][0]
        x = g * F32(sum(target) / 2 / d0)
        d = f.encode(x, trace=True)[1]["d"][0]
        if target[0] <= d < target[1]:
            return x, d
    raise AssertionError("no block found")  # pragma: no cover


@pytest.mark.parametrize("fmt", FORMATS)
def test_scale_overflow(fmt):
    rng = np.random.default_rng(4)
    # 65504 <= d < 65520 stores the largest finite fp16 (7B FF), no error
    x, d = _scaled_to(fmt, (65504.0, 65520.0), rng)
    q = _both(fmt, x[None])
    assert q[0, :2].tolist() == [0xFF, 0x7B]
    # d >= 65520: ScaleOverflowError by default (naming the block and d), +inf (00 7C) with on_overflow="inf"
    xo, d = _scaled_to(fmt, (65520.0, 70000.0), rng)
    blocks = np.stack([x, xo, np.full(128, np.inf, F32)])
    for b in BACKENDS:
        with pytest.raises(tbq.ScaleOverflowError, match="block 1") as e:
            tbq.get_codec(fmt, backend=b).encode(blocks)
        assert isinstance(e.value, ValueError) and e.value.block == 1 and "on_overflow='inf'" in str(e.value)
        with pytest.raises(tbq.NonFiniteError, match="block 2"):
            tbq.get_codec(fmt, backend=b, on_overflow="inf").encode(blocks)
    q = _both(fmt, xo[None], on_overflow="inf")
    assert q[0, :2].tolist() == [0x00, 0x7C]
    for b in BACKENDS:
        y = tbq.get_codec(fmt, backend=b).decode(q)
        assert np.isinf(y).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_norm_squared_overflow_of_finite_input(fmt):
    # sum x^2 > FLT_MAX: norm = +inf, inv = 1/inf = +0, u = +-0: the zero block's indices, d = +inf
    x = np.full((1, 128), 3e18, F32)
    x[0, ::3] = -3e18
    for b in BACKENDS:
        with pytest.raises(tbq.ScaleOverflowError, match="block 0"):
            tbq.get_codec(fmt, backend=b).encode(x)
    q = _both(fmt, x, on_overflow="inf")
    assert bytes(q[0]) == bytes([0x00, 0x7C]) + ZERO_PAYLOAD[bits_of(fmt)]
    y = tbq.get_codec(fmt).decode(q)
    assert np.isinf(y).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_non_finite_input_in_the_reference(fmt):
    # The codec refuses Inf/NaN (the battery checks that); the NumPy reference still follows
    # the C code: the Inf/NaN coordinate's pair/group is NaN after the rotation and takes
    # index 0, every other coordinate the zero block's index; d = +inf (Inf) or NaN (7E00).
    f = tbq.get_format(fmt)
    g = 2 if not is_quat(fmt) else 4
    mid = len(f.centroids) // 2 - 1
    for bad, d16 in ((np.inf, 0x7C00), (np.nan, 0x7E00)):
        x = np.random.default_rng(6).standard_normal((1, 128)).astype(F32)
        x[0, 9] = bad
        with np.errstate(all="ignore"):
            q, tr = f.reference_encode(x)
        assert q[0, :2].view("<u2")[0] == d16, (bad, hex(q[0, :2].view("<u2")[0]))
        idx = f.fields(q)["idx"][0, 0]
        want = np.full(128, mid)
        want[9 // g * g : 9 // g * g + g] = 0
        assert idx.tolist() == want.tolist()
        b, _ = encode_block(f, x[0])
        assert b == bytes(q[0])


# ---------------------------------------------------------------------------
# decoding any bytes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_bytes_decode_like_the_naive_model(fmt):
    f = tbq.get_format(fmt)
    rng = np.random.default_rng(8)
    raw = rng.integers(0, 256, (24, f.type_size), dtype=np.uint8)
    scales = [0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE00, 0x0001, 0x8000, 0x0000, 0x7BFF, 0x03FF]
    raw[: len(scales), :2] = np.array(scales, "<u2").view(np.uint8).reshape(-1, 2)
    ys = [tbq.get_codec(fmt, backend=b).decode(raw) for b in BACKENDS]
    for i, row in enumerate(raw):
        want = np.array(decode_block(f, bytes(row)), F32)
        for y in ys:
            nan = np.isnan(want)
            assert np.array_equal(np.isnan(y[i]), nan), (fmt, i)
            assert_bits_equal(y[i][~nan], want[~nan], f"{fmt} block {i}")


# ---------------------------------------------------------------------------
# fused multiply-adds: an exact emulation
# ---------------------------------------------------------------------------

# One output line = sum of (sign, coefficient table, input slot), evaluated left to right.
LINES = {
    ("givens", "forward"): [
        [(1, "givens_cos", 0), (-1, "givens_sin", 1)],
        [(1, "givens_sin", 0), (1, "givens_cos", 1)],
    ],
    ("givens", "inverse"): [
        [(1, "givens_cos", 0), (1, "givens_sin", 1)],
        [(-1, "givens_sin", 0), (1, "givens_cos", 1)],
    ],
    ("quat", "forward"): [
        [(1, "quat_w", 0), (-1, "quat_x", 1), (-1, "quat_y", 2), (-1, "quat_z", 3)],
        [(1, "quat_w", 1), (1, "quat_x", 0), (1, "quat_y", 3), (-1, "quat_z", 2)],
        [(1, "quat_w", 2), (-1, "quat_x", 3), (1, "quat_y", 0), (1, "quat_z", 1)],
        [(1, "quat_w", 3), (1, "quat_x", 2), (-1, "quat_y", 1), (1, "quat_z", 0)],
    ],
    ("quat", "inverse"): [
        [(1, "quat_w", 0), (1, "quat_x", 1), (1, "quat_y", 2), (1, "quat_z", 3)],
        [(1, "quat_w", 1), (-1, "quat_x", 0), (-1, "quat_y", 3), (1, "quat_z", 2)],
        [(1, "quat_w", 2), (1, "quat_x", 3), (-1, "quat_y", 0), (-1, "quat_z", 1)],
        [(1, "quat_w", 3), (-1, "quat_x", 2), (1, "quat_y", 1), (-1, "quat_z", 0)],
    ],
}


def _rnd32(a):
    return a.astype(F32).astype(np.float64)


def _add32(a, b):
    """float32(a + b) of exact float64 values, correctly rounded: a round-to-odd float64 sum, then one rounding."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)  # TwoSum: s + e == a + b exactly
    bits = s.view(np.int64).copy()
    fix = (e != 0) & ((bits & 1) == 0)  # inexact and even: take the odd neighbour on e's side
    step = np.where(np.signbit(e) == np.signbit(s), 1, -1)
    bits[fix] += step[fix]
    return bits.view(np.float64).astype(F32).astype(np.float64)


def variants(n_terms):
    """(first, fuse_rest): first 0 = no FMA in the first addition, 1/2 = its first/second product fused."""
    rest = [()] if n_terms == 2 else [(a, b) for a in (False, True) for b in (False, True)]
    return [(first, fr) for first in (0, 1, 2) for fr in rest]


def emulate(fmt, direction, v, variant):
    """The rotation (forward, or inverse without the final * D) of float32 values ``v`` (blocks, 128), contracted as ``variant`` says."""
    rot = "quat" if is_quat(fmt) else "givens"
    tabs = planar_iso_tables()
    lines = LINES[(rot, direction)]
    g = len(lines)
    vg = v.astype(np.float64).reshape(v.shape[0], -1, g)
    out = np.empty_like(vg)
    first, fuse_rest = variant
    for li, line in enumerate(lines):
        P = [sgn * tabs[name].astype(np.float64) * vg[:, :, slot] for sgn, name, slot in line]  # exact products
        if first == 0:
            acc = _add32(_rnd32(P[0]), _rnd32(P[1]))
        elif first == 1:
            acc = _add32(P[0], _rnd32(P[1]))
        else:
            acc = _add32(_rnd32(P[0]), P[1])
        for p, fused in zip(P[2:], fuse_rest, strict=True):
            acc = _add32(acc, p if fused else _rnd32(p))
        out[:, :, li] = acc
    return out.reshape(v.shape).astype(F32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_tolerance_covers_fused_decoders(fmt):
    f = tbq.get_format(fmt)
    ref = load_npz(f"{fmt}__strict")
    q, y = ref["q"], ref["y"]
    D = f.fields(q)["d"][:, 0]
    v = f.centroids[f.fields(q)["idx"][:, 0]]
    tol = f.decode_tolerance(q).astype(np.float64)
    assert tol.shape == y.shape and f.decode_tolerance(q).dtype == F32
    nz = (D != 0) & np.isfinite(D)
    assert not tol[~nz & np.isfinite(D)].any()  # d = 0: every decoder gives +-0
    n_terms = 2 if not is_quat(fmt) else 4
    worst = np.zeros(y.shape)
    for var in variants(n_terms):
        yv = emulate(fmt, "inverse", v, var) * D[:, None]
        if var[0] == 0 and not any(var[1]):
            assert_bits_equal(yv, y, f"{fmt}: the strict emulation is the C decoder")
        worst = np.maximum(worst, np.abs(yv.astype(np.float64) - y))
    assert (worst <= tol).all(), (
        f"{fmt}: an FMA decoder lands {np.max(worst / np.where(tol > 0, tol, 1)):.3g}x beyond the bound"
    )
    # contraction really changes decoded bits (the spec: every row with d != 0), and the bound is tight:
    # within ~4x of the measured 1.14 * 2**-24 * d
    assert (worst[nz] > 0).any(axis=1).mean() > 0.9
    rel_obs = (worst[nz] / D[nz, None]).max() * 2.0**24
    rel_tol = (tol[nz] / D[nz, None]).max() * 2.0**24
    print(f"{fmt}: FMA emulation max |y' - y| = {rel_obs:.3f}, bound max = {rel_tol:.3f} (x 2**-24 d)")
    assert 0.25 < rel_obs <= rel_tol <= 4 * 1.14, (fmt, rel_obs, rel_tol)
    # non-finite scales: no bound
    bad = q[:2].copy()
    bad[0, :2] = [0x00, 0x7C]
    bad[1, :2] = [0x00, 0x7E]
    assert np.isinf(f.decode_tolerance(bad)).all()


# ---------------------------------------------------------------------------
# fragility, on blocks built to put r within a few ulps of the thresholds
# ---------------------------------------------------------------------------


def rotation_matrix(fmt):
    """R (128 x 128, float64) of the float32 tables: r = R u."""
    e = np.eye(128)
    return np.stack([emulate_exact(fmt, e[i]) for i in range(128)], axis=1)


def emulate_exact(fmt, u):
    tabs = planar_iso_tables()
    lines = LINES[("quat" if is_quat(fmt) else "givens", "forward")]
    g = len(lines)
    ug = u.reshape(-1, g)
    out = np.empty_like(ug)
    for li, line in enumerate(lines):
        out[:, li] = sum(sgn * tabs[name].astype(np.float64) * ug[:, slot] for sgn, name, slot in line)
    return out.reshape(-1)


def near_threshold_blocks(fmt, n_blocks, seed):
    """Blocks whose rotated coordinates 0..47 land within a few ulps of a random threshold (norm ~ 1)."""
    f = tbq.get_format(fmt)
    thr = f.thresholds
    R = rotation_matrix(fmt)
    rng = np.random.default_rng(seed)
    r = np.empty((n_blocks, 128))
    k = rng.integers(0, len(thr), (n_blocks, 48))
    jitter = rng.integers(-3, 4, (n_blocks, 48))
    t = thr[k]
    r[:, :48] = (t.view(np.int32) + jitter.astype(np.int32)).view(F32)  # a few ulps either side
    rest = np.maximum(1.0 - (r[:, :48] ** 2).sum(axis=1), 0.05)
    r[:, 48:] = np.sqrt(rest / 80)[:, None] * rng.choice([-1.0, 1.0], (n_blocks, 80))
    return np.linalg.solve(R, r.T).T.astype(F32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fragility_covers_fused_encoders(fmt):
    f = tbq.get_format(fmt)
    x = near_threshold_blocks(fmt, 400, seed=21)
    q, tr = f.encode(x, trace=True)
    # the numba kernel's index step agrees with the reference on these boundary cases
    assert_bytes_equal(tbq.get_codec(fmt, backend="numba").encode(x), q, f"{fmt} numba vs numpy near thresholds")
    r = tr["r"][:, 0]
    idx = threshold_index(r, f.thresholds)
    dist = np.abs(r[:, :48, None].view(np.int32).astype(np.int64) - f.thresholds.view(np.int32)).min(-1)
    assert np.median(dist) < 50  # the construction works: r lands a few ulps from a threshold
    norm = tr["norm"][:, 0]
    inv = (F32(1) / norm).astype(F32)
    u = x * inv[:, None]
    changed = np.zeros(r.shape, bool)
    for var in variants(2 if not is_quat(fmt) else 4):
        rv = emulate(fmt, "forward", u, var)
        if var[0] == 0 and not any(var[1]):
            assert_bits_equal(rv, r, f"{fmt}: the strict emulation is the encoder's r")
        changed |= threshold_index(rv, f.thresholds) != idx
    fragile = f.fragile_values({k: v[:, 0] for k, v in tr.items()}, 4)
    assert fragile.shape == r.shape and fragile.dtype == bool
    assert changed.sum() > 20, "the emulation must change some indices for this test to mean anything"
    missed = changed & ~fragile
    assert not missed.any(), f"{fmt}: {missed.sum()} FMA index changes are not marked fragile"
    # the mask is not everything: blocks of ordinary data are mostly not fragile
    g = np.random.default_rng(1).standard_normal((200, 128)).astype(F32)
    _, tg = f.encode(g, trace=True)
    assert f.fragile_values({k: v[:, 0] for k, v in tg.items()}, 4).mean() < 0.01
    # a value exactly on a threshold is fragile (k >= 1); r = +-0 (index 3/7) needs the floor: with
    # literal ulps (ulp_floor=0) the middle threshold 2**-30 is invisible from 0, with the group floor it is not
    on = {"r": f.thresholds[None, :1].repeat(128, 1)}
    assert f.fragile_values(on, 1).all() and not f.fragile_values(on, 0).any()
    zero = {"r": np.tile(np.array([0.0, 0.1, 0.2, 0.3], F32), 32)[None]}
    assert f.fragile_values(zero, 4)[0, 0::4].all()
    assert not f.fragile_values(zero, 4, ulp_floor=0)[0, 0::4].any()


# ---------------------------------------------------------------------------
# rotate(): the encoder's steps 1-3
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_rotate_is_the_encoders_rotation(fmt):
    f = tbq.get_format(fmt)
    inputs = load_npz("inputs")
    x = inputs["x"]
    norm, r = f.rotate(x)
    assert norm.dtype == F32 and r.dtype == F32 and r.shape == x.shape
    ref = load_npz(f"{fmt}__strict")
    assert np.array_equal(threshold_index(r, f.thresholds), f.fields(ref["q"])["idx"][:, 0])
    _, tr = f.encode(x, trace=True)
    assert_bits_equal(tr["r"][:, 0], r)
    assert_bits_equal(tr["norm"][:, 0], norm)
    # the rotation is orthonormal to about an ulp: |r| == |u| closely
    live = norm > 1e-10
    rn = np.sqrt((r[live].astype(np.float64) ** 2).sum(1))
    assert np.abs(rn - 1).max() < 1e-6


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_tolerance_is_never_negative_even_for_negative_scales(fmt):
    """Arbitrary bytes may hold a negative fp16 scale; the tolerance is a bound on |y' - y| (found by tbq check)."""
    f = tbq.get_format(fmt)
    data = np.random.default_rng(3).integers(0, 256, (200, f.type_size), dtype=np.uint8)
    data[:, 1] |= 0x80  # negative scales
    data[:, 1] &= 0xFB  # keep them finite (exponent not all ones)
    tol = f.decode_tolerance(data)
    assert (tol >= 0).all() and (tol > 0).any()
