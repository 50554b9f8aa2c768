"""The fast paths of tbq/formats/vllm_turboquant_kernels.py against their definitions, bit for bit.

Each helper the kernels use instead of the reference's arithmetic is checked against the thing it replaces on
every input class it can take (the fp16 rounding on every exponent and rounding case, the exact un-rotation's
rounding on ties and near-ties at every head_dim, the register butterflies against the loop butterflies, the
NC sum's vector lanes against numpy's pairwise order); then the kernels themselves against the NumPy reference
on many rows (the lane encoder's groups, partial groups and stops), on every byte value at every position
(the decoders, NaN and infinite norms and scales included), and compiled for CPUs without AVX-512 and without
AVX2 / F16C in child processes (their other code paths).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numba
import numpy as np
import pytest

import tbq
from tbq.backend import STATUS_NONFINITE, STATUS_OK, STATUS_SCALE_OVERFLOW
from tbq.formats import vllm_turboquant_kernels as vk
from tbq.formats.vllm_turboquant import _f16_parts, hadamard_h, pairwise_sum32, vllm_centroids
from tbq.kernels import f32_to_f16_bits

F32 = np.float32
HEAD_DIMS = (8, 16, 64, 128, 256, 1024)


@numba.njit
def _rn(a, out):
    for i in range(a.shape[0]):
        out[i] = vk.f32_to_f16_rn(a[i])


@numba.njit
def _rn_ref(a, out):
    for i in range(a.shape[0]):
        out[i] = f32_to_f16_bits(a[i])


def _f32_patterns() -> np.ndarray:
    """Every exponent with the mantissas that decide a rounding to fp16 (ties, one ulp either side, the ends), both
    signs, infinities; plus two million random patterns."""
    mants = [0, 1, 2, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000, 0x5000, 0x7FF000, 0x7FEFFF, 0x7FFFFF, 0x400000]
    sub = [(1 << s) + e for s in range(13, 23) for e in (-1, 0, 1)]  # subnormal fp16 ties: the dropped bits' half
    pats = [(e << 23) | m for e in range(255) for m in mants + sub]
    pats += [0x7F800000]
    pats = np.array(pats, np.uint32)
    pats = np.concatenate([pats, pats | np.uint32(0x80000000)])
    rnd = np.random.default_rng(0).integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([pats, rnd[(rnd & 0x7F800000) != 0x7F800000]])


def test_f32_to_f16_rn_is_the_exact_rounding():
    """``f32_to_f16_rn`` (F16C's ``vcvtps2ph`` here) equals ``tbq.kernels.f32_to_f16_bits`` on every exponent and
    rounding case and two million random finite patterns; a NaN gives a NaN."""
    a = _f32_patterns().view(F32)
    got, want = np.empty(a.size, np.uint16), np.empty(a.size, np.uint16)
    _rn(a, got)
    _rn_ref(a, want)
    assert np.array_equal(got, want)
    nan = np.array([0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x7FBFFFFF], np.uint32).view(F32)
    out = np.empty(4, np.uint16)
    _rn(nan, out)
    assert np.all((out & 0x7FFF) > 0x7C00)


@numba.njit
def _unrot(S, sgn, mant, exp, got, want):
    scale = F32(math.ldexp(1.0, exp - 24))
    for i in range(S.shape[0]):
        got[i] = vk.unrotate_exact(S[i], np.int64(mant) * np.int64(sgn[i]), scale)
        want[i] = vk.unrotate_bits(S[i], sgn[i], mant, exp)


def _exact_sums(rng: np.random.Generator) -> np.ndarray:
    """float64 values ``k * 2**-24`` (``|k| < 2**50``, what an exact sum of up to 1024 fp16 values can be): odd
    ``k`` with 1 to 13 significant bits at every shift (the products by the fp16 entry land on fp16 ties and
    halfway cases), those plus and minus one unit (sticky bits below the tie), random ones of every size, 0."""
    odd = np.arange(1, 1 << 13, 2, dtype=np.int64)
    k = [odd << s for s in range(0, 38, 3)]
    k = np.concatenate(k)
    k = np.concatenate([k, k + 1, k - 1, rng.integers(1, 2**50, 20000, dtype=np.int64) >> rng.integers(0, 50, 20000)])
    k = k[(k != 0) & (np.abs(k) < 2**50)]
    k = np.concatenate([k, -k, [0]])
    return k.astype(np.float64) * 2.0**-24


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_unrotate_exact_is_the_round_to_odd_rounding(d):
    """``unrotate_exact`` (one int64 -> float32 conversion and its exactness check) gives ``unrotate_bits``'s fp16
    bits (``frexp``/``ldexp`` round to odd) for every head_dim's fp16 entry, both signs, ties and near-ties."""
    mant, exp = _f16_parts(float(hadamard_h(d)))
    rng = np.random.default_rng(d)
    S = _exact_sums(rng)
    sgn = rng.choice(np.array([-1, 1], np.int64), S.size)
    got, want = np.empty(S.size, np.uint16), np.empty(S.size, np.uint16)
    _unrot(S, sgn, mant, exp, got, want)
    assert np.array_equal(got, want)
    assert got[S == 0].tolist() == [0]  # +0


@numba.njit
def _had128(t):
    for b in range(t.shape[0]):
        vk.hadamard_row128(t[b], 0)


@numba.njit
def _fwht_rows(t):
    for b in range(t.shape[0]):
        vk.fwht64(t[b])


def _fp16_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """float64 rows of fp16 values of every size (signed zeros, subnormals, 65504)."""
    h = rng.integers(0, 0x7C00, (n, d)).astype(np.uint16) | (rng.integers(0, 2, (n, d)) << 15).astype(np.uint16)
    h[0] = 0x7BFF
    h[1, ::2] = 0x8000
    return h.view(np.float16).astype(np.float64)


def test_register_butterfly_of_fp16_rows_is_the_exact_sum():
    """``hadamard_row128`` (stages 1, 2, 4 inside vectors) equals :func:`fwht64` on rows of fp16 values: each sum
    is exact, so the operands' order, which differs, does not matter."""
    t = _fp16_rows(np.random.default_rng(1), 300, 128)
    a, b = t.copy(), t.copy()
    _had128(a)
    _fwht_rows(b)
    assert np.array_equal(a.view(np.uint64), b.view(np.uint64))


@numba.njit
def _lanes128(T):
    Tf = T.reshape(T.size)
    for l0 in range(0, T.shape[1], 8):
        vk.butterfly128_f64(Tf, l0, T.shape[1])


def test_lane_butterfly_is_the_loop_butterfly_bit_for_bit():
    """The key encoder's ``butterfly128_f64`` (two register passes) equals :func:`fwht_lanes` and :func:`fwht64` on
    every column, on rounded float64 sums (where the order of operations matters), signed zeros included."""
    rng = np.random.default_rng(2)
    T = rng.standard_normal((128, 32)) * np.exp2(rng.integers(-40, 40, (128, 32)))
    T[:, 3] = -0.0
    T[::3, 5] = 0.0
    a, b = T.copy(), T.copy()
    _lanes128(a)
    vk.fwht_lanes(b)
    assert np.array_equal(a.view(np.uint64), b.view(np.uint64))
    c = np.ascontiguousarray(T.T)
    _fwht_rows(c)
    assert np.array_equal(a.T.view(np.uint64), c.view(np.uint64))


@numba.njit
def _index16(T, K, m16, levels):
    Tf, Kf = T.reshape(T.size), K.reshape(K.size)
    for l0 in range(0, T.shape[1], 16):
        if levels == 16:
            vk.index16_lanes16(Tf, l0, T.shape[1], T.shape[0], Kf, m16)
        else:
            vk.index16_lanes8(Tf, l0, T.shape[1], T.shape[0], Kf, m16)


@pytest.mark.skipif(not vk.TARGET_AVX512VL, reason="the binary-search index is for AVX-512 targets")
@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("d", [8, 128, 1024])
def test_binary_search_index_is_the_midpoint_count(bits, d):
    """``index16_lanes16`` / ``8`` (a binary search with ``vpermps`` look-ups) equal :func:`index_lanes` (every
    compare) on float64 values at each midpoint, one float32 ulp either side, halfway between float32 neighbours
    (the conversion's ties), +-0, NaN, +-inf and random ones."""
    _, mids = vllm_centroids(bits, d)
    m16 = np.zeros(16, F32)
    m16[: mids.size] = mids
    m = mids.astype(F32)
    near = np.concatenate([m, np.nextafter(m, np.inf), np.nextafter(m, -np.inf)]).astype(np.float64)
    halfway = (m.astype(np.float64) + np.nextafter(m, np.inf).astype(np.float64)) / 2
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e300, -1e-300])
    rnd = np.random.default_rng(bits).standard_normal(4000) / np.sqrt(d)
    v = np.concatenate([near, halfway, np.nextafter(halfway, 0), np.nextafter(halfway, 1), special, rnd])
    v = np.concatenate([v, -v])
    v = np.resize(v, (len(v) + 31) // 32 * 32).reshape(-1, 32)  # (rows, 32 lanes)
    got, want = np.empty(v.shape, np.int32), np.empty(v.shape, np.int32)
    with np.errstate(over="ignore"):
        _index16(v, got, m16, 1 << bits)
        vk.index_lanes(v, want, mids)
    assert np.array_equal(got, want)


@numba.njit
def _nc(data, chunks, csq, bits, out):
    for b in range(data.shape[0]):
        if bits == 4:
            out[b] = vk.nc_sum4(data, b * data.shape[1], chunks, csq)
        else:
            out[b] = vk.nc_sum3(data, b * data.shape[1], chunks, csq)


def _unpack(data: np.ndarray, bits: int, n: int) -> np.ndarray:
    p = data.astype(np.int64)
    if bits == 4:
        return np.stack([p & 15, p >> 4], axis=2).reshape(len(p), -1)[:, :n]
    lanes = p[:, : n // 8 * 3].reshape(len(p), -1, 3) @ np.array([1, 256, 65536])
    return ((lanes[:, :, None] >> (3 * np.arange(8))) & 7).reshape(len(p), -1)[:, :n]


@pytest.mark.skipif(not vk.TARGET_AVX2, reason="the NC sum's vector path is for AVX2 targets")
@pytest.mark.parametrize("bits", [4, 3])
def test_nc_sum_lanes_are_numpys_pairwise_order(bits):
    """``nc_sum4`` / ``nc_sum3`` equal numpy's pairwise float32 sum of ``RN32(c^2)[idx]`` for 1 to 16 chunks of 8
    indices (8 to 128 values), on every byte value at every position and on random bytes."""
    for d in (128, 64):
        c, _ = vllm_centroids(bits, d)
        csq = np.zeros(16, F32)
        csq[: c.size] = c * c
        rows = np.arange(256)[:, None]
        data = np.concatenate(
            [((rows + 7 * np.arange(64)) % 256), np.random.default_rng(bits).integers(0, 256, (2000, 64))]
        ).astype(np.uint8)
        for chunks in range(1, 17):
            got = np.empty(len(data), F32)
            _nc(data, chunks, csq, bits, got)
            want = pairwise_sum32(csq[_unpack(data, bits, 8 * chunks)])
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (d, chunks)


def test_the_nc_sum_is_not_a_function_of_the_index_counts():
    """Why the kernel sums per row instead of looking the NC factor up by the 16 index counts: numpy's pairwise
    float32 sum depends on the order: permutations of a row's indices (the same counts) give sums an ulp or two
    apart."""
    c, _ = vllm_centroids(4, 128)
    csq = (c * c).astype(F32)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 16, 128)
    perms = np.stack([rng.permutation(idx) for _ in range(100)])
    sums = pairwise_sum32(csq[perms])
    assert len(set(sums.tolist())) > 1 and np.count_nonzero(sums != sums[0]) >= 10


@numba.njit
def _look(data, yt, t, bits):
    for b in range(data.shape[0]):
        if bits == 4:
            vk.hadamard_lookup4(data, b * data.shape[1], yt, t[b])
        else:
            vk.hadamard_lookup3(data, b * data.shape[1], yt, t[b])


@pytest.mark.skipif(not vk.TARGET_AVX2, reason="the look-up butterfly is for AVX2 targets")
@pytest.mark.parametrize("bits", [4, 3])
def test_lookup_butterfly_is_the_exact_sum_of_the_looked_up_row(bits):
    """``hadamard_lookup4`` / ``3``: the butterfly of ``yt[idx]`` (fp16 values) equals :func:`fwht64` of the
    unpacked row, for every byte value at every position and random tables."""
    rng = np.random.default_rng(3)
    rows = np.arange(256)[:, None]
    data = np.concatenate([((rows + 7 * np.arange(66)) % 256), rng.integers(0, 256, (500, 66))]).astype(np.uint8)
    for _ in range(5):
        yt = np.zeros(16, F32)
        yt[: 1 << bits] = _fp16_rows(rng, 2, 16)[0, : 1 << bits].astype(F32)
        got = np.empty((len(data), 128))
        _look(data, yt, got, bits)
        want = yt[_unpack(data, bits, 128)].astype(np.float64)
        _fwht_rows(want)
        assert np.array_equal(got.view(np.uint64), want.view(np.uint64))


# --------------------------------------------------------------------------- the kernels against the reference


def _keys(fmt: str, d: int, **opts: object):
    return tbq.get_format(fmt, head_dim=d, **opts)


def _inputs(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """Keys of every scale (norms 1e-9 .. 1e4), structured ones (constant, one-hot, signed zeros) among them."""
    x = rng.standard_normal((n, d)) * 10.0 ** rng.uniform(-10, 3, (n, 1))
    x[::7] = 0.5
    x[1::11] = 0.0
    x[2::13] = -0.0
    x[3::17, 0] = 1.0
    return x.astype(F32)


@pytest.mark.parametrize("fmt", ["vllm_tq4_k", "vllm_tq3_k"])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_key_kernels_match_the_reference(fmt, d):
    """Encoder (lanes: full and partial groups) and decoder (model and rotated domains) against the NumPy
    reference on keys of every scale, both rotations."""
    rng = np.random.default_rng(d)
    for opts in ({}, {"rotation": "pr38479", "layer": 2}):
        f = _keys(fmt, d, **opts)
        for n in (1, 7, 16, 17, 40):
            x = _inputs(rng, n, d)
            out = np.zeros((n, f.info.type_size), np.uint8)
            assert f.kernel_encode(x, out, False) == (-1, STATUS_OK)
            want, _ = f.reference_encode(x)
            assert np.array_equal(out, want), (opts, n)
            y = np.empty((n, d), F32)
            f.kernel_decode(out, y)
            assert np.array_equal(y.view(np.uint32), f.reference_decode(out).view(np.uint32)), (opts, n)
            r = f.decode_rotated(out, backend="numba").reshape(n, d)
            assert np.array_equal(r.view(np.uint32), f.decode_rotated_reference(out).view(np.uint32))


@pytest.mark.parametrize("fmt", ["vllm_tq4_k", "vllm_tq3_k"])
@pytest.mark.parametrize("bad", [0, 5, 15, 16, 21, 39])
@pytest.mark.parametrize("kind", ["nan", "inf", "overflow"])
def test_key_encoder_stops_at_the_first_refused_key(fmt, bad, kind):
    """A non-finite key, or with ``raise_overflow`` a norm beyond fp16, anywhere in a group of lanes: the encoder
    returns it with its status, the keys before it are the reference's bytes and it and those after are not
    written; without ``raise_overflow`` an overflowing norm is stored (inf)."""
    f = _keys(fmt, 128)
    x = _inputs(np.random.default_rng(bad), 40, 128)
    x[bad, 3] = {"nan": np.nan, "inf": -np.inf, "overflow": 1e5}[kind]
    if bad + 3 < 40:
        x[bad + 3, 0] = np.nan  # a later refusal changes nothing
    out = np.full((40, f.info.type_size), 0xA5, np.uint8)
    status = STATUS_SCALE_OVERFLOW if kind == "overflow" else STATUS_NONFINITE
    assert f.kernel_encode(x, out, True) == (bad, status)
    want, _ = f.reference_encode(x[:bad])
    assert np.array_equal(out[:bad], want)
    assert np.all(out[bad:] == 0xA5)
    if kind == "overflow":
        out[:] = 0
        b, st = f.kernel_encode(x[: bad + 1], out[: bad + 1], False)
        assert (b, st) == (-1, STATUS_OK)
        assert np.array_equal(out[: bad + 1], f.reference_encode(x[: bad + 1])[0])


def _every_byte(ts: int, extra: int = 500, seed: int = 0) -> np.ndarray:
    """Row b holds byte (b + 7j) % 256 at byte j (every value at every position: NaN and infinite fp16 fields
    too), then random rows."""
    rows = np.arange(256)[:, None]
    rnd = np.random.default_rng(seed).integers(0, 256, (extra, ts))
    return np.concatenate([(rows + 7 * np.arange(ts)) % 256, rnd]).astype(np.uint8)


@pytest.mark.parametrize("fmt", ["vllm_tq4_k", "vllm_tq3_k"])
@pytest.mark.parametrize("d", (8, 64, 128, 256))
def test_key_decoder_on_arbitrary_bytes(fmt, d):
    """Every byte value at every position and random rows, infinite and NaN norms and overflowing products
    included (the reference's float64 butterfly order and NaN 0x7FFF), both domains."""
    f = _keys(fmt, d)
    data = _every_byte(f.info.type_size, seed=d)
    y = np.empty((len(data), d), F32)
    f.kernel_decode(data, y)
    with np.errstate(all="ignore"):
        want = f.reference_decode(data)
        assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
        r = f.decode_rotated(data, backend="numba").reshape(len(data), d)
        assert np.array_equal(r.view(np.uint32), f.decode_rotated_reference(data).view(np.uint32))


@pytest.mark.parametrize("fmt", ["vllm_tq4_v", "vllm_tq3_v"])
@pytest.mark.parametrize("d", (8, 96, 128, 256))
def test_value_decoder_on_arbitrary_bytes(fmt, d):
    """The per-row table and its look-ups: the reference's bits on every byte value at every position and
    random rows (NaN and infinite scales and minimums included), D a multiple of 128 or not."""
    f = tbq.get_format(fmt, head_dim=d)
    data = _every_byte(f.info.type_size, seed=d)
    y = np.empty((len(data), d), F32)
    f.kernel_decode(data, y)
    with np.errstate(all="ignore"):
        assert np.array_equal(y.view(np.uint32), f.reference_decode(data).view(np.uint32))


# --------------------------------------------------------------------------- the other CPUs' code paths

_CHILD = """
import sys
import numpy as np
import tbq
import tbq.kernels as k

assert (k.TARGET_AVX2, k.TARGET_AVX512VL, k.TARGET_F16C) == tuple(map(bool, map(int, sys.argv[1:4])))
F32 = np.float32
rng = np.random.default_rng(0)
rows = np.arange(256)[:, None]
for fmt in ("vllm_tq4_k", "vllm_tq3_k", "vllm_tq4_v", "vllm_tq3_v"):
    for d in (64, 128):
        f = tbq.get_format(fmt, head_dim=d)
        x = (rng.standard_normal((40, d)) * 10.0 ** rng.uniform(-6, 3, (40, 1))).astype(F32)
        out = np.zeros((40, f.info.type_size), np.uint8)
        assert f.kernel_encode(x, out, False)[1] == 0
        assert np.array_equal(out, f.reference_encode(x)[0]), (fmt, d, "encode")
        ts = f.info.type_size
        data = np.concatenate([(rows + 7 * np.arange(ts)) % 256, rng.integers(0, 256, (300, ts))]).astype(np.uint8)
        data = np.concatenate([data, out])
        y = np.empty((len(data), d), F32)
        f.kernel_decode(data, y)
        with np.errstate(all="ignore"):
            assert np.array_equal(y.view(np.uint32), f.reference_decode(data).view(np.uint32)), (fmt, d, "decode")
            if fmt.endswith("_k"):
                r = f.decode_rotated(data, backend="numba").reshape(len(data), d)
                assert np.array_equal(r.view(np.uint32), f.decode_rotated_reference(data).view(np.uint32)), fmt
print("ok")
"""

_BASE = "+avx,+avx2,+f16c,+fma,+bmi,+bmi2,+popcnt,+sse4.2"
#: The CPUs a path is compiled for (``tbq.kernels._target_has`` reads only the features given), and the flags
#: (AVX2, AVX-512VL, F16C) the child must see. The host's own path is the tests above.
TARGETS = {
    "avx2": ({"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": _BASE}, ("1", "0", "1")),
    "generic": ({"NUMBA_CPU_NAME": "generic"}, ("0", "0", "0")),
}


def _host_has(feature: str) -> bool:
    from llvmlite import binding

    return bool(binding.get_host_cpu_features().get(feature, False))


@pytest.mark.parametrize("target", list(TARGETS))
def test_the_other_cpus_paths_match_the_reference(target, tmp_path):
    """Compiled in a child process for an AVX2 CPU without AVX-512 (two ``vpermps`` and a select per 16-entry
    look-up) and for a generic CPU (no AVX2, no F16C: the scalar loops, the integer fp16 rounding), all four
    formats' encoders and decoders give the reference's bytes and bits (arbitrary bytes for the decoders)."""
    env_target, flags = TARGETS[target]
    if target == "avx2" and not _host_has("avx2"):
        pytest.skip("this CPU has no avx2: code compiled for it would die of SIGILL")
    env = {key: v for key, v in os.environ.items() if key not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    env.update(env_target, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", _CHILD, *flags], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout[-2000:] + r.stderr[-3000:]
