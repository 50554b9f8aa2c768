"""TBQ4_0 and TBQ3_0: the shared format battery with each codebook and seeded signs; the lane kernels' helpers
(the index step TBQ shares with PLANAR/ISO on every CPU path, the sums of squares, the butterfly)."""

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import check_format


@pytest.mark.parametrize("fmt", ["tbq4_0", "tbq3_0"])
@pytest.mark.parametrize(
    "options", [{}, {"codebook": "turboq-mtp"}, {"signs": 12345}], ids=["lloyd-max", "turboq-mtp", "seeded-signs"]
)
def test_tbq_passes_the_format_battery(fmt, options):
    check_format(fmt, **options)


# ---------------------------------------------------------------------------
# The lane kernels' helpers: the index step (kernels.lanes_index: quantize_column16 / 8, a binary search by
# vpermps), the sums of squares, the butterflies
# ---------------------------------------------------------------------------


#: A child process's check, run under each CPU configuration below: the index step (``kernels.lanes_index``, which
#: takes the configuration's path) on every threshold, its float32 neighbours, +-0, +-inf and NaN (in every lane
#: position), against ``searchsorted(side="right")`` and a sequential float32 recon sum; then every rotated
#: encoder against the NumPy specification, and TBQ's decoder on arbitrary bytes.
_INDEX_CHECK = r"""
import numpy as np, numba as nb, tbq, tbq.kernels as k
from tbq.codebooks import named_codebook
assert (k.TARGET_AVX2, k.TARGET_AVX512VL) == WANT, (k.TARGET_AVX2, k.TARGET_AVX512VL)
@nb.njit
def index(T, cs2, thr, csq, K, rec):
    k.lanes_index(T, cs2, thr, csq, K, rec)
f32 = np.float32
tables = []
for bits, name in ((4, "lloyd-max"), (3, "lloyd-max"), (4, "turboq-mtp"), (3, "turboq-mtp")):
    cb = named_codebook(name, bits)
    tables.append((bits, name, cb.thresholds, cb.centroids))
# an asymmetric 16-level table too: the built-in codebooks are symmetric (c[15 - i] == -c[i]), so a look-up that
# confused the halves (entry k against 15 - k) would pass on them alone
cb = named_codebook("lloyd-max", 4)
thr, c = cb.thresholds.copy(), cb.centroids.copy()
c[-1] = np.nextafter(c[-1], f32(np.inf)); thr[-1] = np.nextafter(thr[-1], f32(np.inf))
tables.append((4, "asymmetric", thr, c))
for bits, name, thr, c in tables:
    csq = (c * c).astype(f32)
    pts = np.concatenate([thr, np.nextafter(thr, f32(np.inf)), np.nextafter(thr, f32(-np.inf)),
                          np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30], f32)])
    rng = np.random.default_rng(bits)
    for _ in range(4):
        T = rng.permutation(np.resize(pts, 48 * 32)).reshape(48, 32).astype(f32)
        cs2 = rng.choice(np.array([1.0, -1.0, 0.5], f32), 48)
        K = np.zeros(T.shape, np.int32); rec = np.full(32, np.nan, f32)
        index(T, cs2, thr, csq, K, rec)
        r = T * cs2[:, None]
        want = np.searchsorted(thr, r, side="right")
        want[np.isnan(r)] = 0
        assert np.array_equal(K, want), (bits, name)
        acc = np.zeros(32, f32)
        for j in range(48):
            acc = acc + csq[want[j]]
        assert np.array_equal(rec.view(np.uint32), acc.view(np.uint32)), (bits, name)
rng = np.random.default_rng(0)
x = (rng.standard_normal((4096, 128)) * rng.uniform(1e-3, 1e3, (4096, 1))).astype(np.float32)
x[3] = 0; x[5] = 1e-30; x[7, ::2] = 0.25
for fmt, options in (("tbq4_0", ({}, {"codebook": "turboq-mtp"}, {"signs": 7})), ("tbq3_0", ({}, {"signs": 7})),
                     ("planar3_0", ({},)), ("iso3_0", ({},)), ("planar4_0", ({},)), ("iso4_0", ({},))):
    for opts in options:
        got = tbq.quantize(x[:-3], fmt, backend="numba", **opts)  # a partial last group of lanes too
        assert np.array_equal(got, tbq.quantize(x[:-3], fmt, backend="numpy", **opts)), (fmt, opts)
data = rng.integers(0, 256, (300, 66), dtype=np.uint8)
data[:, 1] &= 0x3B  # finite fp16 scales
for fmt, d in (("tbq4_0", data), ("tbq3_0", data[:, :50])):
    got = tbq.dequantize(d, fmt, backend="numba").view(np.uint32)
    assert np.array_equal(got, tbq.dequantize(d, fmt, backend="numpy").view(np.uint32)), fmt
print("ok")
"""

#: (NUMBA_CPU_NAME, NUMBA_CPU_FEATURES, the expected (TARGET_AVX2, TARGET_AVX512VL)): the host, an AVX2 CPU
#: without AVX-512 (two vpermps and a select per 16-entry look-up) and a CPU without AVX2 (the portable loop).
_CPUS = {
    "avx2": ("haswell", "+avx,+avx2,+f16c,+fma,+bmi,+bmi2,+popcnt,+sse4.2", (True, False)),
    "generic": ("generic", None, (False, False)),
}


@pytest.mark.parametrize("cpu", ["host", *_CPUS])
def test_the_encoders_index_step_matches_the_specification_on_every_cpu_path(cpu, tmp_path):
    """The encoders' index step (TBQ's and PLANAR/ISO's) has three paths (vpermt2ps on AVX-512VL, two vpermps
    with a select on AVX2, the count of compares elsewhere): each gives the specification's indices and recon
    sums, ties and non-finite values included, every encoder the NumPy path's bytes and TBQ's decoder its bits.
    Each runs in a child compiled for that CPU (a new numba cache): the host (with AVX-512VL or not) and the
    two others by name; the AVX2 one only where the host has AVX2 (its code would not run elsewhere)."""
    import platform

    import tbq.kernels as k

    if cpu == "avx2" and not (platform.machine().lower() in ("x86_64", "amd64") and k._target_has("avx2")):
        pytest.skip("the AVX2 configuration's code runs only on an x86 CPU with AVX2")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NUMBA_CPU_NAME", None)
    env.pop("NUMBA_CPU_FEATURES", None)
    if cpu == "host":
        want = (k.TARGET_AVX2, k.TARGET_AVX512VL)
    else:
        name, features, want = _CPUS[cpu]
        env["NUMBA_CPU_NAME"] = name
        if features:
            env["NUMBA_CPU_FEATURES"] = features
    code = _INDEX_CHECK.replace("WANT", repr(want))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "ok"


def test_nibble_rows_are_pair4s_bytes_of_each_block_and_touch_nothing_else():
    """``kernels.store_nibble_rows`` (the 4-bit encoders' store, 8 blocks at once): block t's 64 bytes are
    ``pair4(K[2i, t], K[2i+1, t])`` at its own row offset, at any lane offset, lane stride and (odd) byte
    offset; the bytes around them keep their value."""
    import numba as nb

    from tbq.kernels import store_nibble_rows

    @nb.njit
    def run(K, koff, kstride, dst, doff, dstride):
        store_nibble_rows(K.reshape(K.size), koff, kstride, dst.reshape(dst.size), doff, dstride)

    rng = np.random.default_rng(5)
    for width in (40, 32, 64):  # the lane stride
        K = rng.integers(0, 16, (128, width)).astype(np.int32)
        K[:, 0], K[:, 1], K[:, 9] = 15, 0, np.arange(128) % 16  # all ones, all zeros, every code in order
        for koff, doff, dstride in ((0, 2, 66), (8, 2, 66), (9, 5, 70), (width - 8, 131, 67)):
            dst = np.full((10, dstride), 0xA5, np.uint8)
            assert doff + 7 * dstride + 64 <= dst.size  # the kernel writes where it is told: in bounds
            run(K, koff, width, dst, doff, dstride)
            flat = dst.reshape(-1)
            want = np.full(flat.size, 0xA5, np.uint8)
            for t in range(8):
                col = K[:, koff + t]
                want[doff + t * dstride : doff + t * dstride + 64] = (col[0::2] | col[1::2] << 4).astype(np.uint8)
            assert np.array_equal(flat, want), (width, koff, doff, dstride)

    from tbq.packing_kernels import lanes_store_nibbles

    @nb.njit
    def lanes(K, out, g0, stop):
        lanes_store_nibbles(K, out, g0, stop, 2)

    K = rng.integers(0, 16, (128, 32)).astype(np.int32)
    for g0 in (0, 3):
        for stop in (0, 7, 8, 13, 32):  # no block, the byte loop only, one group, a group and a tail, every lane
            out = np.full((40, 66), 0xA5, np.uint8)
            lanes(K, out, g0, stop)
            want = np.full_like(out, 0xA5)
            for l in range(stop):
                want[g0 + l, 2:] = (K[0::2, l] | K[1::2, l] << 4).astype(np.uint8)
            assert np.array_equal(out, want), (g0, stop)


def test_the_rotated_4bit_encoders_write_any_layout_of_out():
    """``Format.kernel_encode`` of the lane kernels (vector stores of whole rows) into an ``out`` that is not
    C-contiguous: the bytes of a C-contiguous one, and the bytes around it unchanged."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((45, 128)).astype(np.float32)  # 32 + 8 + 5 blocks: a group, a group of 8, a tail
    from tbq import get_codec

    for name in ("tbq4_0", "planar4_0", "iso4_0", "tbq3_0"):
        fmt = get_codec(name).format
        assert fmt.info.block_size == 128
        ts = fmt.info.type_size
        want = np.full((45, ts), 0xA5, np.uint8)
        assert fmt.kernel_encode(x, want, False) == (-1, 0)
        big = np.full((45, ts + 7), 0x3C, np.uint8)
        assert fmt.kernel_encode(x, big[:, 3 : 3 + ts], False) == (-1, 0)
        assert np.array_equal(big[:, 3 : 3 + ts], want), name
        assert (big[:, :3] == 0x3C).all() and (big[:, 3 + ts :] == 0x3C).all(), name


def test_the_encoders_sum_of_squares_is_the_sequential_float32_chain_of_each_lane():
    """``kernels.sum_squares32`` (step 1 in registers): each of 32 lanes is ``s = s + x * x`` from 0 in row order,
    two roundings a step, at any lane offset and row stride; overflow to inf and NaN propagate as in the chain."""
    import numba as nb

    from tbq.kernels import sum_squares32

    @nb.njit
    def run(T, toff, stride, n, out, ooff):
        sum_squares32(T.reshape(T.size), toff, stride, n, out, ooff)

    f32 = np.float32
    rng = np.random.default_rng(3)
    T = (rng.standard_normal((100, 64)) * rng.choice(np.array([1e-20, 1.0, 1e18], f32), (100, 64))).astype(f32)
    T[7, 3], T[9, 40], T[11, 41] = np.nan, np.inf, 3e19
    for toff, n in ((0, 100), (32, 100), (5, 57)):
        out = np.full(40, -1.0, f32)
        run(T, toff, 64, n, out, 3)
        acc = np.zeros(32, f32)
        with np.errstate(over="ignore", invalid="ignore"):
            for j in range(n):
                x = T[j, toff : toff + 32]
                acc = acc + x * x
        assert np.array_equal(out[3:35].view(np.uint32), acc.view(np.uint32))
        assert (out[:3] == -1).all() and (out[35:] == -1).all()

    from tbq.kernels import lanes_sum_squares

    @nb.njit
    def lanes(T, out):
        lanes_sum_squares(T, out)

    for width in (64, 40):  # sum_squares32 twice, and the plain loop (lanes not a multiple of 32)
        out = np.full(width, -1.0, f32)
        lanes(np.ascontiguousarray(T[:, :width]), out)
        with np.errstate(over="ignore", invalid="ignore"):
            acc = np.zeros(width, f32)
            for j in range(T.shape[0]):
                acc = acc + T[j, :width] * T[j, :width]
        assert np.array_equal(out.view(np.uint32), acc.view(np.uint32)), width


@pytest.mark.parametrize("n", [64, 128])
def test_the_butterfly_in_registers_gives_the_in_place_butterflys_bits(n):
    """``kernels.butterfly64`` / ``butterfly128`` (two passes in vector registers) against the in-place
    stage-by-stage butterfly (``_butterfly_lanes``), bit for bit, on every 8-column group of a lane layout;
    the columns outside the group are untouched. Magnitudes from 1e-30 to 1e30 make every rounding count."""
    import numba as nb

    from tbq.formats.tbq_kernels import _butterfly_lanes
    from tbq.kernels import butterfly64, butterfly128

    kernel = butterfly128 if n == 128 else butterfly64

    @nb.njit
    def run(T, toff, stride):
        kernel(T.reshape(T.size), toff, stride)

    rng = np.random.default_rng(n)
    T = (rng.standard_normal((n, 40)) * 10.0 ** rng.integers(-30, 30, (n, 40))).astype(np.float32)
    T[5, 9], T[17, 10] = np.inf, np.nan
    want = T.copy()
    with np.errstate(invalid="ignore", over="ignore"):
        _butterfly_lanes(want)
    for c0 in (0, 8, 32):
        got = T.copy()
        run(got, c0, 40)
        g, w = got[:, c0 : c0 + 8], want[:, c0 : c0 + 8]
        assert np.array_equal(np.isnan(g), np.isnan(w))  # a NaN's payload may differ (operand order of a+b)
        assert np.array_equal(np.where(np.isnan(g), 0, g).view(np.uint32), np.where(np.isnan(w), 0, w).view(np.uint32))
        rest = np.ones(40, bool)
        rest[c0 : c0 + 8] = False
        assert np.array_equal(got[:, rest].view(np.uint32), T[:, rest].view(np.uint32))
