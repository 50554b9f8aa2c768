"""The fused attention kernel reading TBQ4_0 / TBQ3_0 / turbo4/3/2 codes in its microkernels (``_attend_codes``).

With AVX-512VL the kernel looks the codes of a TBQ cache up in its microkernels instead of decoding each chunk
into a float32 scratch first: the same per-block tables and ``vpermps`` as the format's reader, the same fma's
in the same order, so its ``M``, ``L`` and ``ACC`` must be the scratch kernel's (:func:`_attend`) bit for bit,
on every shape, tail and special value. Each CPU path (VBMI's ``vpmultishiftqb``, AVX-512VL's two words, and
the readers' scratch elsewhere) is also compiled in a child process and checked the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tbq import attention as att
from tbq import attention_kernels as kn
from tbq.attention import KVCache, attention_fused
from tbq.kernels import TARGET_AVX512VL

_F = np.float32
#: Whether this process's kernels read TBQ codes in the microkernels.
CODES = bool(TARGET_AVX512VL)


def _operands(kfmt, vfmt, T, G, D, seed):
    rng = np.random.default_rng(seed)
    k = rng.uniform(-1.7, 1.7, (T, G, D)).astype(_F)
    v = rng.standard_normal((T, G, D)).astype(_F)
    K = KVCache.encode(k, kfmt) if kfmt != "rows" else k
    V = KVCache.encode(v, vfmt) if vfmt != "rows" else v
    return K, V


def _run_both(K, V, G, RQ, D, T, t0, causal, seed):
    """``(M, L, ACC)`` of :func:`_attend` (the readers' scratch) and of :func:`_attend_codes`, same arguments."""
    rng = np.random.default_rng(seed + 1)
    Q = rng.standard_normal((G, RQ, D)).astype(_F)
    lim = (T - RQ + 1 + np.arange(RQ)).astype(np.int64) if causal else np.full(RQ, T, np.int64)
    kop = att._kernel_operand(K, 0)[:4]
    vop = att._kernel_operand(V, 0)[:4]
    bits = (kn.code_bits(kop, D), kn.code_bits(vop, D))
    outs = []
    for codes in (False, True) if CODES else (False,):  # elsewhere the codes kernel is not compiled (no vpermps)
        out = (np.empty((G, RQ), _F), np.empty((G, RQ), _F), np.empty((G, RQ, D), _F))
        with np.errstate(invalid="ignore", over="ignore"):
            if codes:
                kn._attend_codes(Q, lim, _F(1 / np.sqrt(D)), kop, vop, (t0, T), kn.CHUNK, out, *bits)
            else:
                kn._attend(Q, lim, _F(1 / np.sqrt(D)), kop, vop, (t0, T), kn.CHUNK, out)
        outs.append(out)
    return bits, outs


def _same(a, b) -> bool:
    return all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    "kfmt, vfmt",
    [
        ("tbq4_0", "tbq4_0"),
        ("tbq3_0", "tbq3_0"),
        ("tbq4_0", "tbq3_0"),
        ("tbq3_0", "q8_0"),
        ("f16", "tbq4_0"),
        ("turbo4", "turbo4"),
        ("turbo3", "turbo3"),
        ("turbo2", "turbo2"),
        ("turbo3", "tbq4_0"),
        ("q8_0", "turbo2"),
    ],
)
@pytest.mark.parametrize(
    "G, RQ, D, T, t0, causal",
    [
        (2, 4, 128, 200, 0, False),  # GQA 4: four rows by four tokens; a last chunk of 8 tokens
        (2, 7, 128, 133, 0, True),  # a quad and three rows; a tail of 5 tokens (a group past the chunk's end)
        (1, 2, 256, 70, 5, False),  # two blocks a row; 65 tokens, the last chunk one token
        (3, 1, 128, 65, 0, False),  # MHA, sixteen tokens a group, the last chunk one token
        (1, 6, 128, 64, 0, True),  # one whole chunk, a quad and two rows
        (1, 8, 256, 131, 3, True),  # two row quads, causal, a start off the chunk grid
        (2, 5, 128, 20, 16, True),  # rows that see nothing in the task (maximum -inf, weights 0)
    ],
)
def test_the_codes_kernel_gives_the_scratch_kernels_bits(kfmt, vfmt, G, RQ, D, T, t0, causal):
    """Bit for bit, ``_attend_codes`` (TBQ codes looked up in the microkernels) is ``_attend`` (the readers'
    scratch), for either operand read from codes or both, every count of query rows and every tail."""
    K, V = _operands(kfmt, vfmt, T, G, D, G * 100 + RQ + T)
    bits, outs = _run_both(K, V, G, RQ, D, T, t0, causal, G * 100 + RQ + T)
    expect = {"tbq4_0": 4, "tbq3_0": 3, "turbo4": 14, "turbo3": 13, "turbo2": 12}
    assert bits == ((expect.get(kfmt, 0), expect.get(vfmt, 0)) if CODES else (0, 0))
    if CODES:
        want, got = outs
        assert np.isfinite(want[2]).all() and np.abs(want[2]).max() > 0  # a real result, compared below
        assert _same(want, got)


@pytest.mark.parametrize("fmt", ["tbq4_0", "tbq3_0", "turbo4", "turbo3", "turbo2"])
def test_the_codes_kernel_gives_the_readers_bits_on_special_scales(fmt):
    """Blocks whose fp16 ``d`` is +-inf, NaN, -0, subnormal or the largest half: the table's products (inf,
    NaN, signed zeros) are the reader's, so scores and sums are the same bits, NaN where the reader's are."""
    G, RQ, D, T = 2, 4, 128, 150
    K, V = _operands(fmt, fmt, T, G, D, 7)
    for cache, rows in ((K, (3, 40, 77)), (V, (5, 90, 149))):
        data = cache.data  # fp16 d at bytes 0-1 of each block (one block a row here)
        for t, bits16 in zip(rows, (0x7C00, 0x8000, 0x0001), strict=True):
            data[t, 0, 0:2] = np.array([bits16], "<u2").view(np.uint8)
        data[rows[0] + 1, 1, 0:2] = np.array([0x7E00], "<u2").view(np.uint8)  # NaN
        data[rows[1] + 1, 1, 0:2] = np.array([0xFBFF], "<u2").view(np.uint8)  # -65504
    _, outs = _run_both(K, V, G, RQ, D, T, 0, False, 7)
    assert not np.isfinite(outs[0][2]).all()  # the special values reached the sums
    if not CODES:
        return
    want, got = outs
    for w, g in zip(want, got, strict=True):
        same = w.view(np.uint32) == g.view(np.uint32)
        assert np.all(same | (np.isnan(w) & np.isnan(g)))
        assert np.isnan(w).sum() == np.isnan(g).sum()


def test_the_public_kernel_reads_tbq_codes_where_it_can():
    """``code_bits`` picks TBQ4_0 (4), TBQ3_0 (3), turbo4 (14), turbo3 (13) and turbo2 (12) with AVX-512VL and
    whole 128-value blocks, nothing else (other formats and float rows go through their readers); and
    ``attention_fused`` on such caches is its NumPy twin, bit for bit, on 1 and 2 threads."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1.7, 1.7, (300, 2, 128)).astype(_F)
    for fmt, want in (
        ("tbq4_0", 4),
        ("tbq3_0", 3),
        ("turbo4", 14),
        ("turbo3", 13),
        ("turbo2", 12),
        ("q4_0", 0),
        ("f16", 0),
    ):
        op = att._kernel_operand(KVCache.encode(x, fmt), 0)[:4]
        assert kn.code_bits(op, 128) == (want if CODES else 0), fmt
    assert kn.code_bits(att._rows_operand(x)[:4], 128) == 0
    q = rng.standard_normal((3, 8, 128)).astype(_F)
    for kf, vf in (("tbq4_0", "tbq3_0"), ("tbq3_0", "tbq4_0"), ("turbo4", "turbo2"), ("turbo3", "turbo4")):
        K, V = KVCache.encode(x, kf), KVCache.encode(x * 0.5, vf)
        for causal in (False, True):
            twin = att._attention_kernel(q, K, V, float(1 / np.sqrt(128)), 1, causal=causal, twin=True)
            for th in (1, 2):
                out = attention_fused(q, K, V, threads=th, causal=causal)
                assert np.array_equal(out.view(np.uint32), twin.view(np.uint32)), (kf, vf, causal, th)


_PATHS_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
import tbq.kernels as k, tbq.intrinsics as i
import test_attention_codes as t

assert (k.TARGET_AVX2, k.TARGET_AVX512VL, i.TARGET_AVX512VBMI) == tuple(map(bool, map(int, sys.argv[2])))
for fmts in (("tbq4_0", "tbq4_0"), ("tbq3_0", "tbq4_0"), ("tbq4_0", "f16"), ("turbo4", "turbo3"), ("turbo2", "q8_0")):
    t.test_the_codes_kernel_gives_the_scratch_kernels_bits(*fmts, 2, 7, 128, 133, 0, True)
    t.test_the_codes_kernel_gives_the_scratch_kernels_bits(*fmts, 1, 1, 256, 70, 5, False)
for fmt in ("tbq4_0", "tbq3_0", "turbo4", "turbo3", "turbo2"):
    t.test_the_codes_kernel_gives_the_readers_bits_on_special_scales(fmt)
t.test_the_public_kernel_reads_tbq_codes_where_it_can()
print("ok")
"""

_BASE = "+avx,+avx2,+f16c,+fma,+bmi,+bmi2,+popcnt,+sse4.2"
_AVX512 = _BASE + ",+avx512f,+avx512vl,+avx512bw,+avx512dq,+avx512cd"


@pytest.mark.parametrize(
    "target, want",
    [
        pytest.param({"NUMBA_CPU_NAME": "icelake-server", "NUMBA_CPU_FEATURES": _AVX512 + ",+avx512vbmi"}, "111", id="vbmi"),
        pytest.param({"NUMBA_CPU_NAME": "skylake-avx512", "NUMBA_CPU_FEATURES": _AVX512}, "110", id="avx512vl"),
        pytest.param({"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": _BASE}, "100", id="avx2"),
        pytest.param({"NUMBA_CPU_NAME": "generic"}, "000", id="generic"),
    ],
)  # fmt: skip
def test_every_code_path_of_the_codes_kernel_gives_the_same_bits(target: dict, want: str, tmp_path) -> None:
    """Each path compiled in a child process for its CPU: the index spread by ``vpmultishiftqb`` (VBMI), by two
    broadcast words (AVX-512VL without VBMI), and no codes kernel at all (AVX2, generic: ``code_bits`` is 0 and
    the readers fill the scratch); the tests above must pass the same way on each."""
    from llvmlite import binding

    host = binding.get_host_cpu_features()
    needs = {"111": "avx512vbmi", "110": "avx512vl", "100": "avx2"}.get(want)
    if needs and not host.get(needs, False):
        pytest.skip(f"this CPU has no {needs}: code compiled for it would die of SIGILL")
    env = {key: v for key, v in os.environ.items() if key not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    env.update(target, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    here = str(Path(__file__).resolve().parent)
    r = subprocess.run(
        [sys.executable, "-c", _PATHS_CHILD, here, want], env=env, capture_output=True, text=True, timeout=1200
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout[-2000:] + r.stderr[-3000:]
