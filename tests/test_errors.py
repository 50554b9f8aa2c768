"""Bad input gets a clear exception that names what is wrong and where."""

import numpy as np
import pytest
from helpers import BACKENDS

import tbq
from tbq.codebooks import Codebook


def test_error_hierarchy():
    for cls in (
        tbq.BlockShapeError,
        tbq.NonFiniteError,
        tbq.ScaleOverflowError,
        tbq.ConfigError,
        tbq.EncodedLengthError,
    ):
        assert issubclass(cls, tbq.TbqError) and issubclass(cls, ValueError)
    assert issubclass(tbq.TbqTypeError, tbq.TbqError) and issubclass(tbq.TbqTypeError, TypeError)


@pytest.mark.parametrize("fmt,n,bs", [("q8_0", 48, 32), ("q4_0", 33, 32), ("tbq4_0", 96, 128), ("tbq3_0", 130, 128)])
def test_last_axis_not_a_multiple_of_the_block_size(fmt, n, bs):
    with pytest.raises(tbq.BlockShapeError, match=rf"{n} values.*block size {bs}"):
        tbq.quantize(np.zeros((2, n), np.float32), fmt)


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8, bool, np.complex64, object])
def test_non_float_input_is_rejected(dtype):
    with pytest.raises(tbq.TbqTypeError, match="float32"):
        tbq.quantize(np.zeros(128, dtype=dtype), "q8_0")
    with pytest.raises(TypeError):
        tbq.quantize([1, 2, 3], "q8_0")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", tbq.format_names())
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_name_the_first_block(fmt, backend, bad):
    x = np.ones((3, 512), np.float32)
    x[1, 300] = bad
    x[2, 5] = np.nan
    bs = tbq.get_codec(fmt).block_size
    block = (512 + 300) // bs
    with pytest.raises(tbq.NonFiniteError, match=rf"block {block} ") as ei:
        tbq.quantize(x, fmt, backend=backend)
    assert ei.value.block == block


def test_float64_that_overflows_float32_is_reported_as_non_finite():
    with pytest.raises(tbq.NonFiniteError, match="block 0 .*overflows float32"):
        tbq.quantize(np.full(32, 1e39), "q8_0")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fmt,value",
    [("q8_0", 127 * 65520.0), ("q4_0", -8 * 65520.0), ("tbq4_0", 70000.0), ("tbq3_0", 70000.0)],
)
def test_scale_overflow_raises_by_default_and_inf_on_request(fmt, value, backend):
    x = np.ones((2, 256), np.float32)
    x[1, 200:] = value  # lands in the second row
    bs = tbq.get_codec(fmt).block_size
    block = (256 + 200) // bs
    with pytest.raises(tbq.ScaleOverflowError, match=rf"block {block} ") as ei:
        tbq.quantize(x, fmt, backend=backend)
    assert ei.value.block == block and abs(ei.value.scale) >= 65520
    q = tbq.quantize(x, fmt, backend=backend, on_overflow="inf")
    scale = q.reshape(-1, tbq.get_codec(fmt).type_size)[block, :2].view("<f2")[0]
    assert np.isinf(scale)


def test_largest_finite_scale_is_not_an_overflow():
    """d = 65519 still rounds to the finite fp16 65504: stored, not an error."""
    x = np.zeros(32, np.float32)
    x[0] = np.float32(65519 * 127)
    q = tbq.quantize(x, "q8_0")
    assert q[:2].view("<f2")[0] == 65504


@pytest.mark.parametrize("fmt", tbq.format_names())
def test_decode_input_checks(fmt):
    ts = tbq.get_codec(fmt).type_size
    with pytest.raises(tbq.TbqTypeError, match="uint8"):
        tbq.dequantize(np.zeros(ts, np.int8), fmt)
    if ts == 1:  # a one-byte format decodes every length
        return
    with pytest.raises(tbq.EncodedLengthError, match=rf"{ts + 1} bytes.*{ts} bytes"):
        tbq.dequantize(np.zeros((2, ts + 1), np.uint8), fmt)
    with pytest.raises(tbq.EncodedLengthError):
        tbq.dequantize(b"\x00" * (ts - 1), fmt)


@pytest.mark.parametrize(
    "centroids,thresholds,match",
    [
        (np.linspace(-1, 1, 15), np.linspace(-1, 1, 14), "2\\*\\*bits"),
        (np.linspace(-1, 1, 16), np.linspace(-1, 1, 16), "15 thresholds"),
        (np.linspace(1, -1, 16), np.linspace(-1, 1, 15), "strictly increasing"),
        (np.r_[np.linspace(-1, 1, 15), np.nan], np.linspace(-1, 1, 15), "not finite"),
        (np.r_[np.linspace(-1, 1, 15), np.inf], np.linspace(-1, 1, 15), "not finite"),
    ],
)
def test_invalid_codebooks(centroids, thresholds, match):
    with pytest.raises(tbq.ConfigError, match=match):
        tbq.get_codec("tbq4_0", codebook=Codebook(centroids, thresholds))


def test_codebook_with_wrong_bit_width_for_the_format():
    with pytest.raises(tbq.ConfigError, match="3-bit"):
        tbq.get_codec("tbq3_0", codebook=tbq.codebooks.lloyd_max(4))


@pytest.mark.parametrize(
    "signs,match",
    [
        ((np.ones(128), np.r_[np.ones(127), 0]), r"signs2\[127\]"),
        ((np.ones(64), np.ones(64)), "128 values"),
        ((np.ones(128), np.ones(100)), "signs1 has 128 entries and signs2 has 100"),
        ((np.ones(96), np.ones(96)), "power-of-two length, got 96"),
        ("other", "unknown sign table"),
        (-1, "non-negative"),
        (1.5, "signs must be"),
    ],
)
def test_invalid_signs(signs, match):
    with pytest.raises(tbq.ConfigError, match=match):
        tbq.get_codec("tbq4_0", signs=signs)


def test_unknown_format_and_options():
    with pytest.raises(tbq.ConfigError, match="known formats"):
        tbq.get_codec("q9_9")
    with pytest.raises(tbq.ConfigError, match="backend"):
        tbq.get_codec("q8_0", backend="cuda")
    with pytest.raises(tbq.ConfigError, match="threads"):
        tbq.get_codec("q8_0", threads=0)
    with pytest.raises(tbq.ConfigError, match="on_overflow"):
        tbq.get_codec("q8_0", on_overflow="clip")
    with pytest.raises(tbq.ConfigError, match="codebook"):
        tbq.get_codec("q8_0", codebook="lloyd-max")


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_that_overlaps_the_input_is_refused(backend):
    """Chunks (and threads) would read input that was already overwritten: refuse, like a clear error."""
    x = np.random.default_rng(0).standard_normal((4096, 128)).astype(np.float32)
    c = tbq.get_codec("q8_0", backend=backend)
    nbytes = 4096 * 4 * 34
    with pytest.raises(tbq.TbqValueError, match="shares memory"):
        c.encode(x, out=x.view(np.uint8).reshape(-1)[:nbytes].reshape(4096, 136))
    q = c.encode(x)
    buf = np.empty(x.shape, np.float32)
    alias = buf.view(np.uint8).reshape(-1)[: q.size].reshape(q.shape)
    alias[...] = q
    with pytest.raises(tbq.TbqValueError, match="shares memory"):
        c.decode(alias, out=buf)
    # separate arrays from the same allocation that do not overlap are fine
    big = np.empty(2 * nbytes, np.uint8)
    c.encode(x, out=big[nbytes:].reshape(4096, 136))


def test_typed_memoryview_is_not_read_as_raw_bytes():
    with pytest.raises(tbq.TbqTypeError, match="uint8"):
        tbq.dequantize(memoryview(np.zeros(17, np.float32)), "q8_0")
    q = tbq.quantize(np.ones(32, np.float32), "q8_0")
    np.testing.assert_array_equal(tbq.dequantize(memoryview(q), "q8_0"), tbq.dequantize(q, "q8_0"))


# --------------------------------------------------------------------------- issue 21: messages and scalars


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_zero_d_array_is_a_block_shape_error_on_both_backends(backend):
    with pytest.raises(tbq.BlockShapeError, match="at least one axis"):
        tbq.quantize(np.float32(1.0), "q8_0", backend=backend)
    with pytest.raises(tbq.BlockShapeError, match="at least one axis"):
        tbq.quantize(np.array(1.0, np.float32), "q8_0", backend=backend)
    with pytest.raises(tbq.EncodedLengthError, match="at least one axis"):
        tbq.dequantize(np.array(1, np.uint8), "q8_0", backend=backend)


@pytest.mark.parametrize(
    "call",
    [
        lambda: tbq.get_codec("q8_0", threads=np.float32(2.5)),
        lambda: tbq.quantize(np.array([np.inf] + [1.0] * 31, np.float32), "q8_0"),
        lambda: __import__("tbq.budget").budget.kv_values_per_token(np.float64(2.5), 8, 128),
        lambda: __import__("tbq.budget").budget.cache_bytes(1000, "q8_0", np.float32(1.5)),
    ],
)
def test_messages_show_values_not_numpy_reprs(call):
    with pytest.raises(tbq.TbqError) as info:
        call()
    assert "np." not in str(info.value), str(info.value)


BAD_NUMBERS = [1e400, -1, float("nan"), 0, float("inf"), 10**40, np.float32(np.nan), "abc", None, True, 2.5]


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
@pytest.mark.parametrize(
    "call",
    [
        lambda v: tbq.get_codec("q8_0", threads=v),
        lambda v: __import__("tbq.metrics").metrics.random_queries(v, 128),
        lambda v: __import__("tbq.metrics").metrics.random_queries(4, v),
        lambda v: __import__("tbq.synthetic").synthetic.builtin_kv(tokens=v),
        lambda v: __import__("tbq.synthetic").synthetic.gaussian(4, v),
        lambda v: __import__("tbq.synthetic").synthetic.heavy_tailed_values(v, 1),
        lambda v: __import__("tbq.budget").budget.cache_bytes(v, "q8_0", 1024),
        lambda v: __import__("tbq.budget").budget.cache_bytes(1000, "q8_0", v),
        lambda v: __import__("tbq.budget").budget.feasibility(v, 1, 0, 1000, 1024),
        lambda v: __import__("tbq.budget").budget.decode_tokens_per_s(10**9, 1000, 1024, v),
        lambda v: __import__("tbq.attention").attention.attention_fused(
            np.ones((2, 128), np.float32), np.ones((4, 2, 128), np.float32), np.ones((4, 2, 128), np.float32), threads=v
        ),
        lambda v: __import__("tbq.attention").attention.attention_fused(
            np.ones((2, 128), np.float32),
            np.ones((4, 2, 128), np.float32),
            np.ones((4, 2, 128), np.float32),
            scale=v if v != 2.5 else -2.5,
        ),
    ],
    ids=[
        "threads",
        "queries n",
        "queries head_dim",
        "builtin tokens",
        "gaussian heads",
        "heavy tokens",
        "budget values",
        "budget context",
        "feasibility vram",
        "decode bandwidth",
        "attention threads",
        "attention scale",
    ],
)
def test_library_numbers_are_tbq_errors_never_tracebacks(call, value):
    """Huge, negative, NaN, infinite, zero and non-numbers at the library boundary: a TbqError or a valid result."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warnings on the way either
        try:
            call(value)
        except tbq.TbqError as exc:
            assert isinstance(exc, (ValueError, TypeError)) and "np." not in str(exc)
