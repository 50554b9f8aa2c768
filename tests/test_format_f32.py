"""f32: the shared format battery, every class of bit pattern both ways, gguf-py, and the unquantized cache type's
place in the registry (a cache type that the quantizer defaults leave out) and in the study, the budget and eval."""

from argparse import Namespace
from fractions import Fraction

import numpy as np
import pytest
from helpers import BACKENDS, assert_bits_equal, assert_bytes_equal, check_format
from naive_f32 import decode_block, encode_block

import tbq
from tbq.formats import cache_formats, cache_types, format_names, quantizes


def test_passes_the_format_battery():
    check_format("f32")


def _patterns():
    """float32 bit patterns (uint32): both ends of every class (zeros, subnormals, normals, infinities, signalling
    and quiet NaNs), either sign, and 2**20 random patterns."""
    ends = [0, 1, 0x007FFFFF, 0x00800000, 0x3F800000, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FBFFFFF, 0x7FC00000]
    ends += [0x7FFFFFFF] + [e | 0x80000000 for e in ends]
    rng = np.random.default_rng(32)
    return np.concatenate([np.array(ends, np.uint32), rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint32)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_pattern_decodes_to_itself(backend):
    """Decode copies the bits (ggml copies f32 rows): a signalling NaN stays signalling, payloads and signs are kept,
    where a float conversion on the way would quiet 0x7F800001 to 0x7FC00001."""
    u = _patterns()
    y = tbq.dequantize(u.astype("<u4").view(np.uint8), "f32", backend=backend)
    assert np.array_equal(y.view(np.uint32), u), backend
    assert np.isnan(y).sum() > 1000 and y.view(np.uint32)[7] == 0x7F800001  # not vacuous: NaNs of every kind


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_finite_pattern_encodes_to_its_own_bytes(backend):
    u = _patterns()
    u = u[(u & np.uint32(0x7FFFFFFF)) < np.uint32(0x7F800000)]
    x = u.view(np.float32)
    q = tbq.quantize(x, "f32", backend=backend)
    assert_bytes_equal(q, u.astype("<u4").view(np.uint8), f"f32 {backend} encode")
    assert_bits_equal(tbq.dequantize(q, "f32", backend=backend), x, f"f32 {backend} round trip")
    assert np.signbit(x).any() and (x == 0).any() and (np.abs(x) < np.finfo(np.float32).tiny).sum() > 2


def test_the_slow_model_is_the_bit_pattern():
    """tests/naive_f32.py on the edge patterns (the battery runs it on its inputs): the bytes are the pattern."""
    f = tbq.get_format("f32")
    for u in _patterns()[:21]:
        v = np.array([u], np.uint32).view(np.float32)
        if not np.isfinite(v[0]):
            continue
        b, tr = encode_block(f, v)
        assert b == int(u).to_bytes(4, "little") and bytes(f.encode(v)) == b
        assert_bits_equal(np.float32(decode_block(f, b)), v, hex(u))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", [0, 2047, 2048, 5000, 9999])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_is_refused_by_its_index(backend, where, bad):
    """Block = value: the error names the first non-finite value, in any chunk of the numba scan (2048 values)."""
    x = np.linspace(-1, 1, 10000, dtype=np.float32)
    x[where] = bad
    x[min(where + 3, 9999)] = np.nan  # a later one is not the one reported
    with pytest.raises(tbq.NonFiniteError, match=f"block {where} ") as e:
        tbq.quantize(x, "f32", backend=backend)
    assert e.value.block == where


@pytest.mark.parametrize("dist", ["gaussian", "tiny", "huge"])
def test_matches_gguf_py(dist):
    """gguf-py's F32 quantizer and dequantizer: the float32 values themselves."""
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    rng = np.random.default_rng(3)
    x = rng.standard_normal(1 << 16).astype(np.float32) * np.float32({"gaussian": 1, "tiny": 1e-41, "huge": 1e37}[dist])
    ref = np.ascontiguousarray(quants.quantize(x, gguf.GGMLQuantizationType.F32)).view(np.uint8)
    for backend in BACKENDS:
        q = tbq.quantize(x, "f32", backend=backend)
        assert_bytes_equal(q, ref, f"f32 {dist} {backend}")
        assert_bits_equal(
            tbq.dequantize(q, "f32", backend=backend),
            quants.dequantize(ref, gguf.GGMLQuantizationType.F32),
            f"f32 {dist} {backend} decode",
        )


def test_nothing_is_fragile_and_nothing_overflows():
    """No rounding: no value or scale is fragile at any margin, and the largest float32 is stored, not refused."""
    f = tbq.get_format("f32")
    x = np.float32([[3.4028235e38], [-1e-45], [0.5], [-0.0]])
    _, tr = f.reference_encode(x)
    assert not f.fragile_values(tr, 1 << 22).any() and f.fragile_values(tr, 1).shape == (4, 1)
    assert not f.fragile_scales(tr, 1 << 22).any() and not f.invalid_blocks(tr).any()
    assert_bits_equal(tbq.dequantize(tbq.quantize(x, "f32"), "f32"), x)
    assert_bits_equal(f.fields(f.encode(x.reshape(-1)))["v"], x.reshape(-1))


def test_f32_is_a_registered_cache_type_but_not_a_quantizer():
    """f32 has the newest numeric code (28: codes are never renumbered, so it is listed last); it is a KV cache type,
    and the one format that does not quantize, so the default lists of quantizers leave it out."""
    info = tbq.format_info("F32")
    assert (info.block_size, info.type_size, info.bits_per_value, info.index_bits) == (1, 4, 32.0, 32)
    assert (info.code, info.cache_type, info.rotated, format_names()[-1]) == (28, True, False, "f32")
    assert [n for n in format_names() if not quantizes(n)] == ["f32"]
    assert quantizes("f16") and quantizes("bf16") and quantizes("q8_k")
    assert cache_types()[-1] == "f32" and "q8_k" not in cache_types()
    assert cache_formats() == cache_types()[:-1]


def test_the_study_reaches_f32_through_the_registry():
    from tbq import synthetic
    from tbq.study import CodecQuantizer, Identity, get_quantizer, rate_distortion_rows

    q = get_quantizer("f32")
    assert isinstance(q, CodecQuantizer) and (q.name, q.bits_per_value, q.code_bits) == ("f32", 32.0, 32)
    assert isinstance(get_quantizer("none"), Identity)
    x = synthetic.gaussian(64, 2, seed=0)
    assert_bits_equal(q(x), x.astype(np.float32), "study f32")
    (row,) = rate_distortion_rows({"g": x}, ["f32"], n_queries=4)
    assert (row["name"], row["bits_per_value"], row["nmse"], row["topk_agreement"]) == ("f32", 32.0, 0.0, 1.0)
    with pytest.raises(tbq.ConfigError, match="unknown quantizer 'f64'.*f32"):
        get_quantizer("f64")


def test_the_budget_takes_f32_from_the_registry():
    from tbq import budget

    assert budget.format_bits("f32") == ("f32", Fraction(32)) == budget.format_bits("float32")
    assert budget.format_block_size("f32") == 1
    assert list(budget.KV_FORMAT_BITS)[:3] == ["f32", "f16", "bf16"]
    assert budget.kv_bytes_per_token(48, 8, 128, "f32") == 2 * 48 * 8 * 128 * 4


def test_eval_takes_f32_as_a_cache_type_of_the_registry():
    pytest.importorskip("transformers")
    from tbq.cli.eval import _cache_types

    types = _cache_types(Namespace(cache_types="f32:f32,f32:q4_0", engine="llama.cpp", option=None))
    assert [(t.k, t.v) for t in types] == [("f32", "f32"), ("f32", "q4_0")]
    with pytest.raises(tbq.TbqValueError, match="unknown cache type 'f64'; known: .*f16.*f32"):
        _cache_types(Namespace(cache_types="f64", engine="llama.cpp", option=None))
