"""The fused attention kernel's float32 arithmetic and its NumPy twin (docs/formats.md, *Fused attention arithmetic*).

- :func:`tbq.attention._fma32` is a correctly rounded float32 fused multiply-add: equal, bit for bit, to
  the kernel's ``llvm.fma`` (:func:`tbq.attention_kernels.fmaf`) and to exact rational arithmetic, on random
  and adversarial inputs (ties, cancellation, exponent gaps, subnormals, signed zeros, infinities);
- the whole kernel (tasks, chunks, sinks, GQA, causal rows, both kernels) equals its twin
  (``_attention_kernel(..., twin=True)``) bit for bit, over formats, head dimensions, token counts, chunk
  sizes and 1 or 2 threads; and stays within :func:`tbq.attention.f32_tolerance` of the float64 reference.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from test_attention import data

from tbq import attention as att
from tbq import attention_kernels as kn
from tbq.attention import attention_dequantized, encode_kv, f32_tolerance
from tbq.kernels import jit

F = np.float32


@jit
def _fma_rows(a, b, c, out):
    for i in range(a.shape[0]):
        out[i] = kn.fmaf(a[i], b[i], c[i])


def _kernel_fma(a, b, c):
    out = np.empty(a.shape, F)
    _fma_rows(a.astype(F), b.astype(F), c.astype(F), out)
    return out


def _exact_fma(a: float, b: float, c: float) -> np.float32:
    """The float32 nearest to ``a * b + c`` (ties to even) by rational arithmetic: an oracle independent of
    floating point (the float32 candidates around the float64 sum, the nearest chosen exactly)."""
    x = Fraction(a) * Fraction(b) + Fraction(c)
    if x == 0:
        return np.float32(a) * np.float32(b) + np.float32(c)  # the sign of an exact zero: IEEE's rule
    with np.errstate(over="ignore"):
        guess = np.float32(float(x))
    if not np.isfinite(guess):
        lim = Fraction(float(np.finfo(F).max)) + Fraction(2) ** 103  # the overflow threshold (ties overflow)
        return guess if abs(x) >= lim else np.float32(np.sign(float(x)) * np.finfo(F).max)
    cands = [guess, np.nextafter(guess, F(np.inf)), np.nextafter(guess, F(-np.inf))]
    cands = [y for y in cands if np.isfinite(y)]
    dist = [abs(Fraction(float(y)) - x) for y in cands]
    best = min(dist)
    near = [y for y, d in zip(cands, dist, strict=True) if d == best]
    return min(near, key=lambda y: int(np.float32(y).view(np.uint32)) & 1)  # a tie: the even significand


def _adversarial(rng, n):
    """Triples that break a naive float64 ``a * b + c`` rounded to float32: products halfway between float32
    values (plus a tiny c), c cancelling the product, exponent gaps, subnormals, signed zeros."""
    out = []
    for _ in range(n):
        a = F(rng.integers(1 << 23, 1 << 24) * 2.0**-23)
        b = F(rng.integers(1 << 23, 1 << 24) * 2.0**-23)
        p = float(a) * float(b)
        r = float(F(p))
        half = (float(np.nextafter(F(r), F(np.inf))) - r) / 2
        tie = F(r + half - p) if np.isfinite(F(r + half - p)) else F(0)  # c making p + c a float32 tie
        out += [
            (a, b, tie),
            (a, b, F(float(tie) + 2.0**-60) if tie else F(2.0**-60)),  # just past a tie: sticky bits matter
            (a, b, F(-np.float32(p))),  # cancellation: only the product's low bits remain
            (a, b, F(2.0**-100)),  # c far below the product
            (F(a * F(2.0**-70)), b, F(3.0e38)),  # the product far below c
            (F(a * F(2.0**-75)), F(b * F(2.0**-70)), F(1.0e-45)),  # a subnormal product and c
            (F(a * F(2.0**-63)), F(-b * F(2.0**-63)), F(2.0**-126)),  # a result in the subnormals
            (F(0.0), b, F(-0.0)),
            (F(-0.0), b, F(0.0)),
            (a, F(-b), F(p)),  # an exact zero from opposite signs
            (F(3.0e38), F(2.0), F(-3.0e38)),  # a product past float32's range, brought back by c
        ]
        # double rounding: c = m 2**e (m odd), a * b = 2**(e-24) (1 - 2**-30): a * b + c lies just below the
        # float32 tie c + ulp/2, but its float64 sum rounds onto the tie (then to the even c + ulp)
        m, e, sg = int(rng.integers(1 << 22, 1 << 23)) * 2 + 1, int(rng.integers(-60, 60)), float(rng.choice([-1, 1]))
        out.append((F(sg * (1 + 2.0**-15) * 2.0**e), F((1 - 2.0**-15) * 2.0**-24), F(sg * m * 2.0 ** (e - 23))))
    return [np.array(col, F) for col in zip(*out, strict=True)]


def test_fma32_is_the_kernels_fma_and_the_exact_rounding():
    rng = np.random.default_rng(0)
    a, b, c = _adversarial(rng, 300)
    sets = [(a, b, c)]
    for lo, hi in ((-3, 3), (-40, 40), (-140, -100), (60, 64)):  # random exponents, wide, subnormal, near overflow
        e = rng.integers(lo, hi, (3, 3000))
        x = (rng.uniform(1, 2, (3, 3000)) * rng.choice([-1.0, 1.0], (3, 3000)) * 2.0**e).astype(F)
        sets.append((x[0], x[1], x[2]))
    naive_differs = 0
    for a, b, c in sets:
        with np.errstate(over="ignore", invalid="ignore"):
            got = att._fma32(a, b, c)
            naive = (a.astype(np.float64) * b + c).astype(F)
        want = _kernel_fma(a, b, c)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        naive_differs += int(np.sum(got.view(np.uint32) != naive.view(np.uint32)))
        for i in range(0, len(a), 7):  # the rational oracle on a sample (slow)
            exact = _exact_fma(float(a[i]), float(b[i]), float(c[i]))
            assert got[i].view(np.uint32) == np.float32(exact).view(np.uint32), (a[i], b[i], c[i], got[i], exact)
    assert naive_differs > 0  # the inputs do reach the double rounding the round-to-odd step avoids


def test_fma32_special_values():
    inf, nan = F(np.inf), F(np.nan)
    a = np.array([inf, inf, 0, 1, nan, 1, -inf], F)
    b = np.array([1, 0, 1, 1, 1, 2, 1], F)
    c = np.array([1, 1, -inf, nan, 0, inf, inf], F)
    with np.errstate(invalid="ignore"):
        got = att._fma32(a, b, c)
    want = _kernel_fma(a, b, c)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])
    assert np.isnan(got[[1, 3, 4, 6]]).all() and got[0] == inf and got[2] == -inf and got[5] == inf


def _same_bits(x, y):
    return np.array_equal(x.view(np.uint32), y.view(np.uint32))


@pytest.mark.parametrize(
    "kf, vf, D, T, H, G, n_sink",
    [
        ("tbq4_0", "tbq4_0", 128, 300, 8, 2, 0),
        ("tbq3_0", "q8_0", 128, 129, 6, 2, 2),
        ("q4_0", "f16", 64, 65, 4, 4, 0),
        ("q8_0", "bf16", 96, 200, 5, 1, 1),
        ("f16", "q8_0", 32, 1, 8, 2, 0),
        ("turbo3", "turbo4", 128, 90, 8, 2, 0),
        ("f16", "f16", 40, 77, 7, 1, 0),  # a head dimension that is no multiple of 16: _attend_any
    ],
)
@pytest.mark.parametrize("chunk", [16, 64, 24])  # 24: no multiple of 16, _attend_any for every head dimension
def test_the_kernel_is_its_numpy_twin_bit_for_bit(kf, vf, D, T, H, G, n_sink, chunk, monkeypatch):
    monkeypatch.setattr(kn, "CHUNK", chunk)
    monkeypatch.setattr(att, "TASK_TOKENS", 48)  # several tasks, merged in order
    q, k, v = data(D + T, T, H, G, D)
    K, V = encode_kv(k, v, kf, vf, n_sink=n_sink)
    sc = 1 / np.sqrt(D)
    qs = np.random.default_rng(T).standard_normal((min(3, T), H, D)).astype(F)  # causal: at most T query tokens
    for causal in (False, True):
        want = att._attention_kernel(qs, K, V, sc, 1, causal, twin=True)
        for threads in (1, 2):
            got = att._attention_kernel(qs, K, V, sc, threads, causal)
            assert _same_bits(got, want), (causal, threads)
    out = att._attention_kernel(q[None], K, V, sc, 2, twin=True)[0]
    assert np.max(np.abs(out - attention_dequantized(q, K, V))) <= f32_tolerance(q, K, V)


def test_the_twin_is_not_the_sequential_model():
    """The twin computes the kernel's arithmetic, not the NumPy model's sequential sums (so the bit-for-bit
    test above tests the order): on a long row the two differ in the last bits, both within the tolerance."""
    q, k, v = data(7, 500, 8, 2, 128)
    K, V = encode_kv(k, v, "q8_0", "q8_0")
    twin = att._attention_kernel(q[None], K, V, 1 / np.sqrt(128), 1, twin=True)[0]
    model = att.attention_rotated(q, K, V)
    assert not _same_bits(twin, model)
    tol = f32_tolerance(q, K, V)
    ref = attention_dequantized(q, K, V)
    assert np.max(np.abs(twin - ref)) <= tol and np.max(np.abs(model - ref)) <= tol


def test_the_same_bits_on_a_cpu_without_fma_or_avx512(tmp_path):
    """Compiled for a generic x86-64 CPU (no FMA instruction: llvm.fma becomes libm's fmaf; no AVX-512: the score
    microkernels group fewer tokens), the kernel is still its NumPy twin, bit for bit, and _fma32 the kernel's fma."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NUMBA_CPU_FEATURES", None)
    here = Path(__file__).resolve().parent
    probe = (
        "import tbq.attention_kernels as k; assert k._SCORE_TOKENS == (8, 4, 2, 2) and k._VALUE_VECTORS[2] == (8, 2)"
    )
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here / "test_attention_arithmetic.py"),
         "-k", "fma32_is or (twin_bit and (64-tbq4_0 or 16-q8_0 or 64-f16-q8_0))"],
        env=env, cwd=here.parent, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "6 passed" in r.stdout, r.stdout[-3000:]


@pytest.mark.parametrize("n, n_main, G, RQ, D, rotated", [(5, 4, 3, 7, 128, True), (3, 0, 1, 1, 16, False),
                                                          (4, 4, 2, 6, 256, True), (2, 1, 2, 3, 48, False)])  # fmt: skip
def test_the_compiled_merge_is_the_numpy_merge_bit_for_bit(n, n_main, G, RQ, D, rotated):
    """:func:`tbq.attention_kernels.merge_partials` (and the compiled rotations) against :func:`_merge_numpy` and
    :class:`~tbq.rotation.RandomizedHadamard`, bit for bit, on odd shapes: tasks of weight 0 and of tiny weights,
    sinks after the rotation back, several query tokens (R = 1 or 3 heads a KV head)."""
    from tbq.rotation import RandomizedHadamard, signs_from_seed

    rng = np.random.default_rng(n * 100 + D)
    w = np.exp(rng.uniform(-60, 0, (n, G, RQ)))
    w[0, 0] = 0.0  # a task that saw nothing
    L = rng.uniform(0.5, 70, (n, G, RQ)).astype(F)
    ACC = (rng.standard_normal((n, G, RQ, D)) * 10.0 ** rng.integers(-3, 4, (n, G, RQ, 1))).astype(F)
    rot = RandomizedHadamard(*signs_from_seed(3, 128)) if rotated else None
    R = 3 if RQ % 3 == 0 else 1
    n_q = RQ // R
    want = att._merge_numpy(w, L, ACC, n_main, rot, 128 if rot else D, n_q, R)
    inv = att._compiled_rotation(rot, 128, np.dtype(np.float64), inverse=True) if rot else att._NO_ROTATION
    got = np.empty((n_q, G * R, D), F)
    kn.merge_partials(w, L, ACC, n_main, *inv, got)
    assert _same_bits(got, want)
    if rot is not None:  # the query's rotation, float32
        x = rng.standard_normal((9, 128)).astype(F) * F(1e3)
        y = x.copy()
        kn.rotate_rows(y, *att._compiled_rotation(rot, 128, np.dtype(F), inverse=False))
        assert _same_bits(y, rot.forward(x).astype(F)) and not _same_bits(y, x)
    assert att._compiled_rotation(rot, 64, np.dtype(F), inverse=False) is None  # blocks of another size: NumPy
