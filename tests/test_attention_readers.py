"""The rotated formats' attention readers (TBQ4_0, TBQ3_0, turbo2/3/4): ``centroid[idx] * d`` bit for bit.

The fused attention kernel reads these caches in the rotated domain through a C-callable reader per format
(``tbq_kernels.attention_read``, ``turbo_kernels.attention_read``): each value is the block's centroid times its
fp16 scale widened to float32, one rounded float32 product, with no inverse rotation. The readers are vector
code (``vpermps`` look-ups) that prefetches the cache ahead of the block it decodes; these tests hold them to
the NumPy product on random blocks, on every byte value at every position, on the special scales (signed zeros,
subnormals, the largest fp16, infinities, quiet and signalling NaNs), in calls of any number of blocks, and check
that the prefetch past the last block of a cache never faults.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

import tbq
import tbq.kernels as k

F32 = np.float32
FORMATS = ("tbq4_0", "tbq3_0", "turbo2", "turbo3", "turbo4")

#: fp16 bit patterns of the scale: +-0, the smallest subnormal, the largest normal, +-inf, a quiet NaN, a
#: signalling NaN (widened and multiplied it must come out quiet, as NumPy's product does), a negative NaN with
#: a payload, and ordinary values of both signs
SPECIAL_SCALES = (
    0x0000,
    0x8000,
    0x0001,
    0x8001,
    0x03FF,
    0x7BFF,
    0xFBFF,
    0x7C00,
    0xFC00,
    0x7E00,
    0x7C01,
    0xFE55,
    0x3C00,
    0xB4CD,
)


@numba.njit
def _read(fn, data, out, aux, sizes):
    """``data``'s blocks through reader ``fn`` in consecutive calls of ``sizes[i]`` blocks (cycling), as the
    fused kernel calls it chunk by chunk."""
    b = 0
    i = 0
    while b < data.shape[0]:
        n = min(sizes[i % sizes.shape[0]], data.shape[0] - b)
        k.call_reader(fn, k.address(data[b]), k.address(out[b]), n, k.address(aux), aux.shape[0])
        b += n
        i += 1


def _want(f, data: np.ndarray) -> np.ndarray:
    """NumPy's rotated-domain values: ``centroid[idx] * d`` in float32 (one rounding)."""
    fl = f.fields(data)
    with np.errstate(all="ignore"):
        return (f.codebook.centroids.astype(F32)[fl["idx"]] * fl["d"].astype(F32)[:, None]).reshape(len(data), 128)


def _blocks(f, n: int, seed: int) -> np.ndarray:
    """``n`` random blocks, every special scale among them, and 256 blocks holding every byte value at every
    position (block b holds ``(b + 7j) % 256`` at byte j)."""
    ts = f.info.type_size
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, ts), dtype=np.uint8)
    data[:, 1] = rng.integers(0x20, 0x40, n)  # ordinary positive scales for most blocks (byte 1: sign, exponent)
    data[1::2, 1] |= 0x80  # and negative ones
    sp = np.array(SPECIAL_SCALES, np.uint16)
    for i, h in enumerate(np.resize(sp, n // 3)):  # every third block a special scale
        data[3 * i, 0], data[3 * i, 1] = h & 0xFF, h >> 8
    every = ((np.arange(256)[:, None] + 7 * np.arange(ts)[None, :]) % 256).astype(np.uint8)
    return np.concatenate([data, every])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("sizes", [(512,), (1,), (7, 1, 64, 3)], ids=["chunks", "one", "mixed"])
def test_readers_give_numpys_centroid_times_scale_bits(fmt: str, sizes: tuple) -> None:
    f = tbq.get_format(fmt)
    assert f.attention.domain == "rotated"
    data = _blocks(f, 1500, seed=len(fmt) + sum(sizes))
    want = _want(f, data)
    assert np.isnan(want).any() and np.isinf(want).any() and (np.signbit(want) & (want == 0)).any()
    r = f.attention.reader()
    out = np.full((len(data), 128), F32(-1.5))
    _read(r.read.address, data, out, r.aux, np.array(sizes, np.int64))
    bad = np.flatnonzero((out.view(np.uint32) != want.view(np.uint32)).any(axis=1))
    assert bad.size == 0, (fmt, bad[:5], data[bad[:1]], out[bad[:1]], want[bad[:1]])


@pytest.mark.parametrize("fmt", FORMATS)
def test_readers_decode_encoded_blocks_as_the_codec_decodes_them(fmt: str) -> None:
    """Blocks the codec encoded (a zero block, a tiny one among them) read as the product of their fields; for
    turbo, whose decoder gives the rotated values themselves, exactly the NumPy reference decoder's bits."""
    f = tbq.get_format(fmt)
    x = np.random.default_rng(3).standard_normal((600, 128)).astype(F32)
    x[5] = 0.0  # a zero block: scale 0
    x[7] *= F32(1e-30)  # a tiny one
    q = tbq.get_codec(fmt).encode(x).reshape(600, f.info.type_size)
    r = f.attention.reader()
    out = np.empty((600, 128), F32)
    _read(r.read.address, q, out, r.aux, np.array([64], np.int64))
    assert np.array_equal(out.view(np.uint32), _want(f, q).view(np.uint32))
    if fmt.startswith("turbo"):
        assert np.array_equal(out.view(np.uint32), f.reference_decode(q).view(np.uint32))


_GUARD = """
import ctypes, mmap, sys
import numpy as np, numba
import tbq, tbq.kernels as k

@numba.njit
def read(fn, data, out, aux):
    k.call_reader(fn, k.address(data), k.address(out), data.shape[0], k.address(aux), aux.shape[0])

page = mmap.PAGESIZE
guard = mmap.mmap(-1, 3 * page)
base = ctypes.addressof(ctypes.c_char.from_buffer(guard))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.mprotect(ctypes.c_void_p(base + 2 * page), ctypes.c_size_t(page), 0) == 0, ctypes.get_errno()
for fmt in sys.argv[1:]:
    f = tbq.get_format(fmt)
    ts = f.info.type_size
    n = (2 * page) // ts  # the last block ends where the inaccessible page begins
    data = np.frombuffer(guard, np.uint8, n * ts, 2 * page - n * ts).reshape(n, ts)
    data[:] = np.arange(n * ts).reshape(n, ts) * 37 % 256
    data[:, 1] = 0x3C
    r = f.attention.reader()
    out = np.empty((n, 128), np.float32)
    read(r.read.address, data, out, r.aux)
    assert np.isfinite(out).all()
print("ok")
"""


def test_the_prefetch_past_a_caches_last_block_never_faults() -> None:
    """The readers prefetch bytes ahead of the block they decode, past the cache's end for its last blocks: a
    cache whose last block ends where an inaccessible page begins is read whole (a load there, instead of a
    prefetch, kills the child with SIGSEGV)."""
    r = subprocess.run(
        [sys.executable, "-c", _GUARD, *FORMATS], env=dict(os.environ), capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout[-2000:], r.stderr[-3000:])


_PATHS_CHILD = """
import sys
import numpy as np
import tbq, tbq.kernels as k
sys.path.insert(0, sys.argv[1])
import test_attention_readers as t

assert (k.TARGET_AVX2, k.TARGET_AVX512VL) == tuple(map(bool, map(int, sys.argv[2:4])))
for fmt in t.FORMATS:
    for sizes in ((512,), (7, 1, 64, 3)):
        t.test_readers_give_numpys_centroid_times_scale_bits(fmt, sizes)
print("ok")
"""

_BASE = "+avx,+avx2,+f16c,+fma,+bmi,+bmi2,+popcnt,+sse4.2"


@pytest.mark.parametrize(
    "target, want",
    [
        pytest.param({"NUMBA_CPU_NAME": "skylake-avx512", "NUMBA_CPU_FEATURES": _BASE + ",+avx512f,+avx512vl,+avx512bw,+avx512dq"}, "11", id="avx512"),
        pytest.param({"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": _BASE}, "10", id="avx2"),
        pytest.param({"NUMBA_CPU_NAME": "generic"}, "00", id="generic"),
    ],
)  # fmt: skip
def test_every_code_path_of_the_readers_gives_the_same_bits(target: dict, want: str, tmp_path) -> None:
    """The readers' paths (the per-block product tables with AVX-512VL, the 8-lane look-ups with AVX2, the
    scalar loops elsewhere), each compiled in a child process for its CPU: the bits test above on all five
    formats."""
    from llvmlite import binding

    host = binding.get_host_cpu_features()
    needs = {"11": "avx512vl", "10": "avx2"}.get(want)
    if needs and not host.get(needs, False):
        pytest.skip(f"this CPU has no {needs}: code compiled for it would die of SIGILL")
    env = {key: v for key, v in os.environ.items() if key not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    env.update(target, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    here = str(Path(__file__).resolve().parent)
    r = subprocess.run(
        [sys.executable, "-c", _PATHS_CHILD, here, *want], env=env, capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout[-2000:] + r.stderr[-3000:]
