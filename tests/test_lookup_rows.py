"""``tbq.kernels.lookup16_row`` / ``lookup8_row`` (the TBQ4_0/TBQ3_0 and turbo4 readers' look-ups) on each code path.

The intrinsics emit a different body per target: 16 values a zmm register with AVX-512VL, 8 a ymm register with
AVX2 alone, and their callers keep a scalar loop without AVX2. Each path is compiled in a child process for its
CPU (``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES``, a fresh ``NUMBA_CACHE_DIR``) and checked bit for bit against
NumPy on every byte value at every index position: the intrinsics themselves (a table of 16 or 8 distinct values,
so a wrong shift, lane or nibble order gives another value), then the decoders and attention readers of the
formats that call them, against the NumPy reference decoder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_CHILD = """
import sys
import numpy as np
import numba
import tbq.kernels as k
from tbq.formats import get_format

assert (k.TARGET_AVX2, k.TARGET_AVX512VL) == tuple(map(bool, map(int, sys.argv[1:3]))), (k.TARGET_AVX2, k.TARGET_AVX512VL)
F32 = np.float32
rows = np.arange(256)[:, None]

if k.TARGET_AVX2:  # the intrinsics exist for AVX2 targets only (callers keep a scalar loop otherwise)
    @numba.njit
    def look16(src, dst, table, scale):
        for b in range(src.shape[0]):
            k.lookup16_row(src, b * src.shape[1] + min(3, src.shape[1] - 64), dst, b * dst.shape[1] + 5, table, scale)

    @numba.njit
    def look8(src, dst, table, scale):
        for b in range(src.shape[0]):
            k.lookup8_row(src, b * src.shape[1] + min(3, src.shape[1] - 48), dst, b * dst.shape[1] + 5, table, scale)

    rng = np.random.default_rng(0)
    for scale in (F32(1.0), F32(0.3), F32(-7.1e-3)):
        for bits, look, nbytes in ((4, look16, 64), (3, look8, 48)):
            # row b holds byte (b + 7j) % 256 at payload byte j: every value at every position (at an odd offset)
            src = np.zeros((256, nbytes + 4), np.uint8)
            src[:, 3 : 3 + nbytes] = (rows + 7 * np.arange(nbytes)[None, :]) % 256
            src[:, :3], src[:, 3 + nbytes :] = 0xA5, 0x5A
            table = rng.permutation(np.linspace(-2.0, 2.0, 1 << bits)).astype(F32)
            payload = src[:, 3 : 3 + nbytes].astype(np.int64)
            if bits == 4:  # low nibble, then high
                idx = np.stack([payload & 15, payload >> 4], axis=2).reshape(256, 128)
            else:  # eight 3-bit indices per little-endian 24-bit lane
                lanes = payload.reshape(256, 16, 3) @ np.array([1, 256, 65536])
                idx = ((lanes[:, :, None] >> (3 * np.arange(8))) & 7).reshape(256, 128)
            want = np.full((256, 128 + 9), -1.0, F32)
            want[:, 5 : 5 + 128] = table[idx] * scale
            got = np.full_like(want, -1.0)
            look(src, got, table, scale)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (bits, float(scale))

    # nothing past the row is read: a row whose last byte ends a page followed by an inaccessible one (a read past
    # it kills the process with SIGSEGV)
    import ctypes, mmap
    page = mmap.PAGESIZE
    guard = mmap.mmap(-1, 2 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(guard))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(base + page), ctypes.c_size_t(page), 0) == 0, ctypes.get_errno()
    for bits, look, nbytes in ((4, look16, 64), (3, look8, 48)):
        edge = np.frombuffer(guard, np.uint8, nbytes, page - nbytes).reshape(1, nbytes)
        edge[:] = np.arange(nbytes) * 37 % 256
        table = np.linspace(-2.0, 2.0, 1 << bits).astype(F32)
        got = np.empty((1, 128 + 9), F32)
        look(edge, got, table, F32(1.0))


@numba.njit
def read(fn, data, out, aux):
    k.call_reader(fn, k.address(data), k.address(out), data.shape[0], k.address(aux), aux.shape[0])


for fmt in ("tbq4_0", "tbq3_0", "turbo4"):
    f = get_format(fmt)
    ts = f.info.type_size
    # block b holds byte (b + 7j) % 256 at byte j: every value at every position, NaN and infinite scales too
    data = ((rows + 7 * np.arange(ts)[None, :]) % 256).astype(np.uint8)
    want = f.reference_decode(data)
    out = np.empty((256, 128), F32)
    f.kernel_decode(data, out)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), fmt + " decoder"
    if f.attention.domain == "rotated":  # TBQ's reader stays in the rotated domain: c[idx] * d, rounded once
        fl = f.fields(data)
        with np.errstate(all="ignore"):
            want = (f.codebook.centroids.astype(F32)[fl["idx"]] * fl["d"].astype(F32)[:, None]).reshape(256, 128)
    r = f.attention.reader()
    out[:] = 0
    read(r.read.address, data, out, r.aux)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), fmt + " reader"
print("ok")
"""


#: The CPUs a path is compiled for: features given explicitly (``tbq.kernels._target_has`` then reads only them).
_BASE = "+avx,+avx2,+f16c,+fma,+bmi,+bmi2,+popcnt,+sse4.2"
TARGETS = {
    "avx512": ({"NUMBA_CPU_NAME": "skylake-avx512", "NUMBA_CPU_FEATURES": _BASE + ",+avx512f,+avx512vl,+avx512bw,+avx512dq"}, ("1", "1")),
    "avx2": ({"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": _BASE}, ("1", "0")),
    "generic": ({"NUMBA_CPU_NAME": "generic"}, ("0", "0")),
}  # fmt: skip


def _host_has(feature: str) -> bool:
    from llvmlite import binding

    return bool(binding.get_host_cpu_features().get(feature, False))


@pytest.mark.parametrize("target", list(TARGETS))
def test_lookup_rows_and_their_readers_give_numpys_bits_for_every_byte_at_every_position(
    target: str, tmp_path: Path
) -> None:
    """Each path of ``lookup16_row`` / ``lookup8_row`` (16 lanes on AVX-512VL, 8 on AVX2, the callers' scalar
    loops on a generic CPU), compiled in a child process for its CPU: the intrinsics give NumPy's
    ``table[idx] * scale`` bits for every byte value at every payload position (at odd source and destination
    offsets, nothing written outside the 128 values, nothing read past a row that ends a page before an
    inaccessible one), and tbq4_0's, tbq3_0's and turbo4's decoders and attention
    readers the reference's bits on the same bytes (NaN and infinite scales included)."""
    env_target, want = TARGETS[target]
    needs = {"avx512": "avx512vl", "avx2": "avx2"}.get(target)
    if needs and not _host_has(needs):
        pytest.skip(f"this CPU has no {needs}: code compiled for it would die of SIGILL")
    env = {key: v for key, v in os.environ.items() if key not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    env.update(env_target, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", _CHILD, *want], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout[-2000:] + r.stderr[-3000:]
