"""Bounded memory: encoding/decoding allocates the output plus O(chunk), never full-size temporaries.

tracemalloc sees NumPy's allocations (the output array and any temporary);
the numba kernels' scratch (a few tens of kB) is not counted, which is fine
for a bound of this size.
"""

import tracemalloc

import numpy as np
import pytest

import tbq
from tbq.codecs import CHUNK_VALUES

N = 1 << 23  # 8M values: 32 MiB as float32, 64 MiB as float64
SLACK = 40 * CHUNK_VALUES  # generous O(chunk) allowance: 40 bytes per value of one chunk


def peak_of(fn):
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


@pytest.fixture(scope="module")
def x64():
    return np.random.default_rng(0).standard_normal((N // 128, 128))


@pytest.mark.parametrize(
    "fmt,backend",
    [
        ("tbq4_0", "numba"),
        ("tbq3_0", "numba"),
        ("q8_0", "numba"),
        ("q4_0", "numba"),
        ("q8_0", "numpy"),
        ("q4_0", "numpy"),
    ],
)
def test_encode_float64_input_is_converted_chunk_by_chunk(x64, fmt, backend):
    codec = tbq.get_codec(fmt, backend=backend)
    q, peak = peak_of(lambda: codec.encode(x64))
    assert peak <= q.nbytes + SLACK, (peak, q.nbytes)
    # a full float32 copy of the input alone would be N * 4 bytes
    assert peak < q.nbytes + N * 4


@pytest.mark.parametrize("fmt", tbq.format_names())
def test_decode_allocates_only_the_output(x64, fmt):
    codec = tbq.get_codec(fmt)
    q = codec.encode(x64[: N // 8].reshape(-1, max(128, codec.block_size)))  # rows of whole blocks (q8_k: 256)
    y, peak = peak_of(lambda: codec.decode(q))
    assert peak <= y.nbytes + SLACK
    out = np.empty_like(y)
    _, peak_out = peak_of(lambda: codec.decode(q, out=out))
    assert peak_out <= SLACK


def test_roundf_ties_and_near_ties():
    """Q8_0's roundf: half away from zero, exactly, including 0.49999997 (not 1)."""
    from tbq.float32 import roundf

    v = np.float32([0.49999997, -0.49999997, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -0.0, 3.4999998])
    expected = np.float32([0, -0, 1, -1, 2, -2, 3, -3, 127, -0.0, 3])
    np.testing.assert_array_equal(roundf(v), expected)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_non_contiguous_input_is_gathered_chunk_by_chunk(x64, backend):
    """A (heads, tokens, dim) view of a (tokens, heads, dim) cache: no full-size copy."""
    x = x64.reshape(-1, 8, 128).swapaxes(0, 1)  # 64 MiB float64, not C-contiguous
    assert not x.flags.c_contiguous
    codec = tbq.get_codec("q8_0", backend=backend)
    q, peak = peak_of(lambda: codec.encode(x))
    assert peak <= q.nbytes + SLACK + 2 * x.shape[-1] * 8, (peak, q.nbytes)


def test_compare_holds_one_format_at_a_time_and_chunks_its_metrics():
    """``tbq compare``'s work: the input is held once; per format its bytes and its reconstruction, one format at a
    time, and chunked metrics (issue 21: the CLI peaked at 12x a 128 MiB file). benchmarks/bench_compare_memory.py
    measures the whole process (RSS) too."""
    from tbq.compare import compare

    x = np.random.default_rng(0).standard_normal((4096, 8, 128)).astype(np.float32)  # 16 MiB
    rows, peak = peak_of(lambda: compare({"keys": x}, ["f16", "q8_0", "tbq4_0"], repeat=1, n_queries=16))
    assert [r["format"] for r in rows] == ["f16", "q8_0", "tbq4_0"]
    # f16 bytes (0.5x) + the reconstruction (1x) live at once, plus O(chunk) temporaries; x itself was allocated before
    assert peak <= 2 * x.nbytes + SLACK, peak / x.nbytes
