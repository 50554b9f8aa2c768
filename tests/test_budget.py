"""Tests of tbq.budget: KV cache bytes per token, sweeps, crossover, decode speed, feasibility.

Every expected number is worked out by hand in the comment next to it.
"""

from __future__ import annotations

import doctest
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tbq import budget
from tbq.budget import (
    KV_FORMAT_BITS,
    bits_per_value,
    budget_report,
    bytes_per_token,
    cache_bytes,
    cache_bytes_from_geometry,
    context_sweep,
    crossover_tokens,
    decode_tokens_per_s,
    feasibility,
    format_bytes,
    format_context,
    format_rate,
    format_report,
    kv_bytes_per_token,
    kv_values_per_token,
    parse_bytes,
    parse_context,
    parse_contexts,
    parse_measured,
    parse_rate,
    values_per_token,
)
from tbq.errors import ConfigError, TbqError, TbqValueError
from tbq.formats import FORMATS, cache_formats, cache_types

KiB, MiB, GiB = 2**10, 2**20, 2**30

# The model of the CLI example in the issue: 48 attention layers, 8 KV heads, head_dim 128.
# Values per token = 2 (K and V) x 48 x 8 x 128 = 98,304.
GEOMETRY = (48, 8, 128)

# VRAM 32 GB = 32,000,000,000 bytes; weights 18.8 GiB = 18.8 x 1,073,741,824 = 20,186,346,291.2
# -> 20,186,346,291 bytes; workspace 1 GiB = 1,073,741,824 bytes.
# Room for the cache: 32,000,000,000 - 20,186,346,291 - 1,073,741,824 = 10,739,911,885 bytes.
AVAILABLE = 10_739_911_885


# --------------------------------------------------------------------------- the acceptance examples


def test_worked_example_f16_32768_values():
    # 32,768 values x 16 bits / 8 = 65,536 bytes = 64 KiB per token
    assert bytes_per_token(32768, "f16") == 65536 == 64 * KiB
    # 65,536 bytes x 262,144 tokens = 2^16 x 2^18 = 2^34 bytes = 16 GiB
    assert cache_bytes(32768, "f16", 262144) == 2**34 == 16 * GiB
    assert format_bytes(cache_bytes(32768, "f16", "256K")) == "16.00 GiB"


def test_worked_example_tbq4_0_32768_values():
    # tbq4_0: 66-byte blocks of 128 values -> 66 x 8 / 128 = 4.125 bits per value;
    # 32,768 x 4.125 / 8 = 16,896 bytes = 16.5 x 1024 = 16.5 KiB per token
    assert bytes_per_token(32768, "tbq4_0") == 16896
    assert format_bytes(16896) == "16.50 KiB"
    # ... and 16,896 x 262,144 = 4,429,185,024 bytes = 4,224 MiB at 262,144 tokens
    assert cache_bytes(32768, "tbq4_0", 262144) == 4224 * MiB == 4_429_185_024


def test_worked_example_inversion():
    # 4,224 MiB = 4,224 x 1,048,576 = 4,429,185,024 bytes; / 262,144 tokens = 16,896 bytes per token;
    # 16,896 x 8 bits / 4.125 bits per value = 135,168 / 4.125 = 32,768 values per token.
    assert values_per_token("4224MiB", 262144, "tbq4_0") == 32768
    assert values_per_token(4_429_185_024, "256K", "tbq4_0") == 32768
    # the same cache size reported for 4 sequences of 65,536 tokens: 4,429,185,024 / 262,144 again
    assert values_per_token("4224MiB", "64K", "tbq4_0", sequences=4) == 32768
    assert parse_measured("4224MiB@262144:tbq4_0") == (4_429_185_024, 262144, "tbq4_0")
    # a size that does not divide evenly gives a float: 1,000 bytes x 8 / (3 tokens x 16 bits) = 166.67
    assert values_per_token(1000, 3, "f16") == pytest.approx(1000 * 8 / (3 * 16))


# --------------------------------------------------------------------------- format table


def test_bits_per_value_table():
    assert bits_per_value("f32") == 32
    assert bits_per_value("f16") == bits_per_value("bf16") == 16
    assert (
        bits_per_value("fp8") == bits_per_value("fp8_e4m3") == bits_per_value("fp8_e5m2") == 8
    )  # fp8: vLLM's name for E4M3
    assert bits_per_value("q8_0") == 8.5  # 34-byte blocks of 32 values: 34 x 8 / 32
    assert bits_per_value("q4_0") == 4.5  # 18 x 8 / 32
    assert bits_per_value("tbq4_0") == 4.125  # 66 x 8 / 128
    assert bits_per_value("tbq3_0") == 3.125  # 50 x 8 / 128
    assert bits_per_value("nvfp4") == 4.5  # 4 bits + four 8-bit scales per 64 values: 4 + 32 / 64
    assert bits_per_value("mxfp4") == 4.25  # 4 bits + one 8-bit scale per 32 values: 4 + 8 / 32
    # the block formats come from tbq.formats, not from a second copy of the numbers
    for name, info in FORMATS.items():
        assert bits_per_value(info) == info.bits_per_value
        if info.cache_type:
            assert KV_FORMAT_BITS[name] == info.bits_per_value
    # the dot-product operand formats (q8_1, q8_k) are no KV cache types: no budget names them
    assert tuple(KV_FORMAT_BITS)[3:] == tuple(n for n in cache_types() if n not in ("f32", "f16", "bf16"))
    assert set(KV_FORMAT_BITS) == {"f32"} | set(cache_formats()) == set(cache_types()) and "q8_k" not in KV_FORMAT_BITS
    assert list(KV_FORMAT_BITS)[:3] == ["f32", "f16", "bf16"]


def test_format_names_and_numbers():
    assert bits_per_value("F16") == bits_per_value(" fp16 ") == 16  # case and an alias
    assert bits_per_value(6) == 6.0 and bits_per_value("5.5") == 5.5
    with pytest.raises(ConfigError, match=r"unknown KV format 'q5_k'.*tbq4_0.*number"):
        bits_per_value("q5_k")
    with pytest.raises(TbqValueError, match=r"bits per value must be in \(0, 64\]"):
        bits_per_value(0)
    with pytest.raises(TbqValueError, match="bits per value"):
        bits_per_value(128)
    with pytest.raises(TbqError):
        bits_per_value(True)


# --------------------------------------------------------------------------- bytes per token


def test_kv_bytes_per_token_per_format():
    # 98,304 values per token x bits / 8:
    assert kv_values_per_token(*GEOMETRY) == 98304
    expected = {
        "f32": 393216,  # x 4 bytes
        "f16": 196608,  # x 2 bytes = 192 KiB
        "bf16": 196608,
        "fp8": 98304,  # x 1 byte = 96 KiB
        "q8_0": 104448,  # x 8.5 / 8 = 102 KiB
        "q4_0": 55296,  # x 4.5 / 8 = 54 KiB
        "nvfp4": 55296,  # 4.5 bits too
        "mxfp4": 52224,  # x 4.25 / 8 = 51 KiB
        "tbq4_0": 50688,  # x 4.125 / 8 = 49.5 KiB
        "tbq3_0": 38400,  # x 3.125 / 8 = 37.5 KiB
    }
    for fmt, n in expected.items():
        got = kv_bytes_per_token(*GEOMETRY, fmt)
        assert got == n and isinstance(got, int), fmt


def test_kv_bytes_per_token_hybrid_and_fractional():
    # A hybrid model passes only its full-attention layers: 12 layers x 2 KV heads x head_dim 256
    # -> 2 x 12 x 2 x 256 = 12,288 values -> 24,576 bytes in f16.
    assert kv_bytes_per_token(12, 2, 256, "f16") == 24576
    # bits as a number: 12,288 x 6 / 8 = 9,216
    assert kv_bytes_per_token(12, 2, 256, 6) == 9216
    # not a whole number of bytes: 2 x 1 x 1 x 1 values x 3.125 / 8 = 0.78125
    assert kv_bytes_per_token(1, 1, 1, "tbq3_0") == 0.78125


def test_geometry_must_be_positive_integers():
    with pytest.raises(TbqValueError, match="n_layers must be at least 1"):
        kv_bytes_per_token(0, 8, 128, "f16")
    with pytest.raises(TbqError, match="n_kv_heads must be an integer"):
        kv_bytes_per_token(48, 8.5, 128, "f16")


# --------------------------------------------------------------------------- cache size


def test_cache_bytes_geometry_and_sequences():
    # q8_0, 128K = 131,072 tokens: 104,448 x 131,072 = 13,690,208,256 bytes = 12.75 GiB
    assert cache_bytes_from_geometry(*GEOMETRY, "q8_0", "128K") == 13_690_208_256
    assert format_bytes(13_690_208_256) == "12.75 GiB"
    # 4 sequences of 262,144 f16 tokens with 32,768 values: 4 x 16 GiB = 64 GiB = 2^36
    assert cache_bytes(32768, "f16", 262144, sequences=4) == 2**36
    # context 0 is an empty cache
    assert cache_bytes(32768, "f16", 0) == 0
    with pytest.raises(TbqValueError, match="values per token must be positive"):
        cache_bytes(-1, "f16", 1024)
    with pytest.raises(TbqValueError, match="a context cannot be negative"):
        cache_bytes(32768, "f16", -5)
    with pytest.raises(TbqValueError, match="at least 1 token"):
        values_per_token("1GiB", 0, "f16")
    with pytest.raises(TbqValueError, match="cache size must be positive"):
        values_per_token("0B", 1024, "f16")


def test_context_sweep_rows():
    rows = context_sweep(32768, "f16,tbq4_0", "8K,256K")
    cells = {(r.format, r.context): r for r in rows}
    # f16 at 8,192 tokens: 65,536 x 8,192 = 536,870,912 bytes = 512 MiB
    assert cells["f16", 8192].cache_bytes == 512 * MiB and cells["f16", 8192].cache == "512.00 MiB"
    # tbq4_0 at 262,144 tokens: 16,896 x 262,144 = 4,224 MiB = 4.125 GiB
    r = cells["tbq4_0", 262144]
    assert r.cache_bytes == 4224 * MiB and r.context_label == "256K" and r.kv_bytes_per_token == 16896
    assert r.decode_tokens_per_s is None and r.fits is None  # not asked for
    # f16 and bf16 have the same width but stay two rows
    both = context_sweep(32768, ["f16", "bf16"], [1024])
    assert [r.format for r in both] == ["f16", "bf16"]


def test_context_sweep_with_speed_and_fit():
    rows = context_sweep(
        98304,
        ["f16"],
        ["32K"],
        vram_bytes="32GB",
        weights_bytes="18.8GiB",
        workspace_bytes="1GiB",
        weights_traffic_bytes="15.88GB",
        bandwidth_bytes_per_s="1296GB/s",
    )
    (r,) = rows
    # 1296e9 / (15.88e9 + 32,768 x 196,608) = 1296e9 / 22,322,450,944 = 58.058
    assert r.decode_tokens_per_s == pytest.approx(58.05814, rel=1e-6)
    # cache 32,768 x 196,608 = 6,442,450,944 (6 GiB); headroom 10,739,911,885 - 6,442,450,944 = 4,297,460,941
    assert r.fits is True and r.headroom_bytes == 4_297_460_941 and r.headroom == "4.00 GiB"


# --------------------------------------------------------------------------- crossover and decode speed


def test_crossover_tokens():
    # weights traffic 15.88 GB = 15,880,000,000 bytes; f16 196,608 bytes/token:
    # 15,880,000,000 / 196,608 = 80,769.86 tokens
    assert crossover_tokens("15.88GB", 196608) == pytest.approx(80769.857, abs=1e-3)
    assert crossover_tokens(15_880_000_000, 196608) == 15_880_000_000 / 196608
    # 4 sequences read 4 caches per step: 15,880,000,000 / (4 x 196,608) = 20,192.46
    assert crossover_tokens("15.88GB", 196608, sequences=4) == pytest.approx(20192.464, abs=1e-3)
    # 16 GiB of weights, 64 KiB/token -> 2^34 / 2^16 = 2^18 = 262,144 tokens
    assert crossover_tokens(16 * GiB, 64 * KiB) == 262144.0
    with pytest.raises(TbqValueError, match="KV bytes per token must be positive"):
        crossover_tokens("1GB", 0)


def test_decode_tokens_per_s():
    # weights only: 1,296,000,000,000 / 15,880,000,000 = 81.612 tok/s
    assert decode_tokens_per_s("15.88GB", 196608, 0, "1296GB/s") == pytest.approx(81.61209, rel=1e-6)
    # at the crossover the step reads twice the weights: half the weights-only speed
    x = crossover_tokens(16 * GiB, 64 * KiB)
    assert decode_tokens_per_s(16 * GiB, 64 * KiB, int(x), "1TiB/s") == 32.0  # 2^40 / 2^35 = 32
    # 4 sequences at 32K, f16: 1296e9 / (15.88e9 + 4 x 6,442,450,944) = 1296e9 / 41,649,803,776 = 31.117
    assert decode_tokens_per_s("15.88GB", 196608, "32K", "1296GB/s", sequences=4) == pytest.approx(31.11659, rel=1e-6)
    with pytest.raises(TbqValueError, match="bandwidth must be positive"):
        decode_tokens_per_s("15.88GB", 196608, 0, "0GB/s")


# --------------------------------------------------------------------------- feasibility


def test_feasibility_fits_with_headroom():
    f = feasibility("32GB", "18.8GiB", "1GiB", 196608, "32K")
    assert f.weights_bytes == 20_186_346_291
    assert f.available_bytes == AVAILABLE and f.available == "10.00 GiB"  # 10,739,911,885 / 2^30 = 10.002
    # cache 32,768 x 196,608 = 6,442,450,944 = 6 GiB; headroom 4,297,460,941 = 4.00 GiB
    assert f.cache_bytes == 6 * GiB and f.cache == "6.00 GiB"
    assert f.fits and f.headroom_bytes == 4_297_460_941 and f.headroom == "4.00 GiB"
    # largest context: floor(10,739,911,885 / 196,608) = 54,626
    # (54,626 x 196,608 = 10,739,908,608 fits; 54,627 x 196,608 = 10,740,105,216 does not)
    assert f.max_context == 54626
    # sequences of 32K that fit: floor(10,739,911,885 / 6,442,450,944) = 1
    assert f.max_sequences == 1
    assert f.to_dict()["headroom"] == "4.00 GiB"


def test_feasibility_does_not_fit():
    f = feasibility("32GB", "18.8GiB", "1GiB", 196608, "32K", sequences=4)
    # 4 x 6,442,450,944 = 25,769,803,776; headroom 10,739,911,885 - 25,769,803,776 = -15,029,891,891
    assert not f.fits and f.headroom_bytes == -15_029_891_891 and f.headroom == "-14.00 GiB"
    # floor(10,739,911,885 / (4 x 196,608)) = floor(13,656.5) = 13,656
    assert f.max_context == 13656
    # weights larger than the VRAM: nothing fits, not even an empty cache
    g = feasibility("16GB", "18.8GiB", 0, 196608, 0)
    assert not g.fits and g.max_context == 0 and g.max_sequences is None
    with pytest.raises(TbqValueError, match="a size cannot be negative"):
        feasibility("-32GB", "1GB", 0, 1, 1)
    with pytest.raises(TbqValueError, match="weights must be non-negative"):
        feasibility(32e9, -1, 0, 1, 1)


# --------------------------------------------------------------------------- units


@pytest.mark.parametrize(
    "text, expected",
    [
        ("32GB", 32_000_000_000),  # decimal: 32 x 10^9
        ("32GiB", 34_359_738_368),  # binary: 32 x 2^30
        ("18.8GiB", 20_186_346_291),  # 18.8 x 1,073,741,824 = 20,186,346,291.2 -> nearest byte
        ("4224MiB", 4_429_185_024),  # 4,224 x 1,048,576
        ("15.88GB", 15_880_000_000),
        ("1.5 kB", 1500),
        ("1KiB", 1024),
        ("16GIB", 16 * GiB),  # the binary prefix's case does not matter
        ("2kib".replace("b", "B"), 2048),  # "2kiB"
        ("512B", 512),
        ("4096 bytes", 4096),
        ("1_000MB", 10**9),
        (" 2TB ", 2 * 10**12),
        (4096, 4096),  # a number is bytes
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("32", r"'32' has no unit; write 32B for bytes, or a unit such as 32GB \(10\^9 bytes\) or 32GiB"),
        ("32b", r"'32b' is in bits; sizes here are in bytes: write 32B"),
        ("32G", r"'32G' is ambiguous: 'G' could mean decimal or binary bytes; write 32GB .* or 32GiB"),
        ("32Gi", r"is ambiguous.*32GiB"),
        ("32KB", r"'KB' is used for both 1000 and 1024 bytes; write 32kB \(1000\) or 32KiB \(1024\)"),
        ("32Gb", r"a lowercase 'b' means bits.*32GB \(decimal\) or 32GiB \(binary\)"),
        ("32gb", r"a lowercase 'b' means bits"),
        ("32Kb", r"a lowercase 'b' means bits.*32kB.*32KiB"),
        ("32Gib", r"a lowercase 'b' means bits"),
        ("32mB", r"millibytes"),
        ("32XB", r"unknown byte unit 'XB'"),
        ("32 gigs", r"unknown byte unit 'gigs'"),
        ("-1GB", r"a size cannot be negative: '-1GB'"),
        ("GB", r"cannot read a size 'GB'"),
        ("", r"cannot read a size ''"),
    ],
)
def test_parse_bytes_errors(text, message):
    with pytest.raises(TbqValueError, match=message) as info:
        parse_bytes(text)
    assert isinstance(info.value, ValueError)


def test_parse_rate():
    assert parse_rate("1296GB/s") == 1_296_000_000_000
    assert parse_rate("900 GiB/s") == 900 * GiB
    assert parse_rate("1.5TB/sec") == 1_500_000_000_000
    assert parse_rate(10**9) == 10**9
    with pytest.raises(TbqValueError, match=r"lowercase 'b' means bits.*100GB/s \(decimal\) or 100GiB/s"):
        parse_rate("100Gb/s")
    with pytest.raises(TbqValueError, match="is a bit rate"):
        parse_rate("100Gbps")
    with pytest.raises(TbqValueError, match=r"'100GBps'.*with '/s', e.g. GB/s"):
        parse_rate("100GBps")
    with pytest.raises(TbqValueError, match=r"'1296GB' is not a bandwidth; use a byte unit per second"):
        parse_rate("1296GB")
    with pytest.raises(TbqValueError, match=r"'1296G/s' is ambiguous.*1296GB/s .* 1296GiB/s"):
        parse_rate("1296G/s")
    with pytest.raises(TbqValueError, match="has no unit"):
        parse_rate("1296")
    with pytest.raises(TbqValueError, match="must be positive"):
        parse_rate("0GB/s")


def test_parse_context():
    assert parse_context("8K") == 8192
    assert parse_context("128K") == 131072  # 128 x 1024
    assert parse_context("256K") == 262144  # 2^18
    assert parse_context("262K") == 268288  # 262 x 1024, NOT 262,144 (that is 256K)
    assert parse_context("8k") == 8192
    assert parse_context("1M") == 1048576  # 1024 x 1024
    assert parse_context("1.5K") == 1536
    assert parse_context(262144) == 262144
    assert parse_context("262144") == 262144
    assert parse_context(4096.0) == 4096
    assert parse_contexts("8K,32K, 128K,262K") == [8192, 32768, 131072, 268288]
    assert parse_contexts(["8K", 8192, 1024]) == [8192, 1024]  # duplicates dropped, order kept


@pytest.mark.parametrize(
    "text, message",
    [
        ("8KB", r"a context counts tokens, not bytes"),
        ("8KiB", r"a context counts tokens, not bytes"),
        ("1.3K", r"1331.2 tokens, not a whole number"),
        ("-1K", r"a context cannot be negative"),
        ("8T", r"cannot read context '8T'"),
        ("lots", r"cannot read context 'lots'"),
    ],
)
def test_parse_context_errors(text, message):
    with pytest.raises(TbqValueError, match=message):
        parse_context(text)


def test_parse_errors_for_bad_lists_and_measured():
    with pytest.raises(TbqValueError, match="empty entry"):
        parse_contexts("8K,,32K")
    with pytest.raises(TbqValueError, match=r"expected SIZE@CONTEXT:FORMAT"):
        parse_measured("4224MiB:tbq4_0")
    with pytest.raises(ConfigError, match="unknown KV format 'tbq5_0'"):
        parse_measured("4224MiB@262144:tbq5_0")
    with pytest.raises(TbqValueError, match="ambiguous"):
        parse_measured("4224M@262144:tbq4_0")


def test_format_helpers():
    assert format_bytes(65536) == "64.00 KiB"
    assert format_bytes(2**34) == "16.00 GiB"
    assert format_bytes(32 * 10**9) == "29.80 GiB"  # 32e9 / 2^30 = 29.802
    assert format_bytes(32 * 10**9, binary=False) == "32.00 GB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1024 * 1024 - 1) == "1.00 MiB"  # 1023.999 KiB rounds up a unit
    assert format_bytes(-15_029_891_891) == "-14.00 GiB"
    assert format_rate(1_296_000_000_000) == "1.296 TB/s"
    assert format_context(262144) == "256K" and format_context(268288) == "262K"
    assert format_context(54626) == "54,626"


# --------------------------------------------------------------------------- the report


def test_budget_report_numbers_and_json():
    r = budget_report(
        98304,
        "f16,tbq4_0",
        "8K,262K",
        1,
        vram_bytes="32GB",
        weights_bytes="18.8GiB",
        workspace_bytes="1GiB",
        weights_traffic_bytes="15.88GB",
        bandwidth_bytes_per_s="1296GB/s",
    )
    f16, tbq4 = r.formats
    assert (f16.kv_bytes_per_token, tbq4.kv_bytes_per_token) == (196608, 50688)
    # crossover: 15,880,000,000 / 50,688 = 313,289.14 tokens
    assert tbq4.crossover_tokens == pytest.approx(313289.14, abs=0.01)
    # largest tbq4_0 context: floor(10,739,911,885 / 50,688) = floor(211,882.7) = 211,882
    assert tbq4.max_context == 211882
    assert r.available_bytes == AVAILABLE
    assert r.weights_only_tokens_per_s == pytest.approx(81.61209, rel=1e-6)
    # 262K is 268,288 tokens: f16 cache 268,288 x 196,608 = 52,747,567,104 bytes = 49.125 GiB
    assert r.row("f16", 268288).cache_bytes == 52_747_567_104
    assert r.notes == ["262K = 262 x 1024 = 268,288 tokens (K = 1024); 2^18 = 262,144 tokens is 256K"]
    d = json.loads(r.to_json())
    assert d["formats"][1]["kv_per_token"] == "49.50 KiB"
    assert d["sweep"][0]["cache"] == "1.50 GiB"  # 8,192 x 196,608 = 1,610,612,736 = 1.5 GiB
    text = format_report(r)
    assert "tbq4_0" in text and "211,882" in text


def test_budget_report_weights_traffic_defaults_to_weights():
    r = budget_report(
        32768, ["f16"], ["256K"], vram_bytes="32GB", weights_bytes="18.8GiB", bandwidth_bytes_per_s="1TB/s"
    )
    assert r.weights_traffic_bytes == 20_186_346_291
    # 20,186,346,291 / 65,536 = 308,019.2 tokens
    assert r.formats[0].crossover_tokens == pytest.approx(308019.2, abs=0.1)
    with pytest.raises(TbqValueError, match="needs the weights size"):
        budget_report(32768, vram_bytes="32GB")
    with pytest.raises(TbqValueError, match="weights read per step"):
        budget_report(32768, bandwidth_bytes_per_s="1TB/s")


def test_module_doctests():
    # every example in the docstrings is true (the unit parsing moved to tbq.units)
    from tbq import units
    from tbq.budget import arithmetic, bits, report

    results = [doctest.testmod(m) for m in (budget, bits, arithmetic, report, units)]
    assert sum(r.attempted for r in results) >= 40 and sum(r.failed for r in results) == 0


def test_old_names_still_import_from_budget():
    # parse_bytes & co. live in tbq.units now; tbq.budget re-exports them, plot_report draws through tbq.plots
    from tbq import plots, units

    for name in units.__all__:
        assert getattr(budget, name) is getattr(units, name) and name in budget.__all__
    assert callable(budget.plot_report) and callable(plots.plot_budget)


def test_the_budget_is_one_module_per_concern_and_every_public_name_imports_from_tbq_budget():
    """The arithmetic and the report are separate modules; ``tbq.budget`` names every public object of both,
    the same objects (so ``from tbq.budget import budget_report`` and pickles keep working)."""
    from tbq.budget import arithmetic, bits, report

    assert set(budget.__all__) == set(bits.__all__) | set(arithmetic.__all__) | set(report.__all__)
    for mod in (bits, arithmetic, report):
        for name in mod.__all__:
            assert getattr(budget, name) is getattr(mod, name)
    assert not hasattr(arithmetic, "format_report")  # the text is the report's


DOC = Path(__file__).resolve().parents[1] / "docs" / "budget.md"


def test_docs_python_examples():
    # the ``>>>`` examples in docs/budget.md are true
    result = doctest.testfile(str(DOC), module_relative=False)
    assert result.attempted >= 5 and result.failed == 0


def test_matplotlib_is_imported_lazily():
    code = "import sys, tbq.budget; print('matplotlib' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    r = budget_report(32768, "f16", "8K")
    # tbq is installed from its checkout: the extra is '.[plot]' (a 'tbq' on PyPI would be another package)
    with pytest.raises(ConfigError, match=r"pip install '\.\[plot\]'"):
        budget.plot_report(r, str(tmp_path / "x.png"))


# --------------------------------------------------------------------------- CLI (through tbq.cli.main)

EXAMPLE = [
    "budget",
    "--layers",
    "48",
    "--kv-heads",
    "8",
    "--head-dim",
    "128",
    "--formats",
    "f16,q8_0,q4_0,tbq4_0,tbq3_0",
    "--contexts",
    "8K,32K,128K,262K",
]
MEMORY = [
    "--vram",
    "32GB",
    "--weights",
    "18.8GiB",
    "--workspace",
    "1GiB",
    "--weights-traffic",
    "15.88GB",
    "--bandwidth",
    "1296GB/s",
]


@pytest.fixture
def cli_main():
    """tbq.cli.main, which dispatches ``tbq budget``."""
    from tbq import cli

    assert "budget" in cli.COMMANDS
    return cli.main


def _lines(text):
    return [" ".join(line.split()) for line in text.splitlines()]


def test_cli_example(cli_main, capsys):
    assert cli_main(EXAMPLE + MEMORY) == 0
    lines = _lines(capsys.readouterr().out)
    # bytes per token: 98,304 values x bits / 8
    assert "f16 16 196,608 192.00 KiB" in lines
    assert "q8_0 8.5 104,448 102.00 KiB" in lines
    assert "tbq4_0 4.125 50,688 49.50 KiB" in lines
    assert "tbq3_0 3.125 38,400 37.50 KiB" in lines
    # cache at 128K = 131,072 tokens: f16 24 GiB, q8_0 12.75 GiB, q4_0 6.75 GiB, tbq4_0 6.1875, tbq3_0 4.6875
    assert "128K 131,072 24.00 GiB 12.75 GiB 6.75 GiB 6.19 GiB 4.69 GiB" in lines
    # crossover f16: 15.88e9 / 196,608 = 80,769.9 -> 80,770 (78.9K)
    assert "f16 80,770 (78.9K)" in lines
    # decode at 32K, f16: 58.06 tok/s (see test_context_sweep_with_speed_and_fit)
    assert any(line.startswith("32K 32,768 58.1 ") for line in lines)
    assert "weights only (context 0): 81.6 tok/s" in lines
    # feasibility at 32K, f16: +4.00 GiB; largest f16 context 54,626 = 53.3K
    assert any(line.startswith("32K 32,768 yes +4.0 GiB") for line in lines)
    assert any(line.startswith("largest 54,626 ") for line in lines)
    assert any("262K = 262 x 1024 = 268,288 tokens" in line for line in lines)


def test_cli_sequences(cli_main, capsys):
    assert cli_main(EXAMPLE + MEMORY + ["--sequences", "4"]) == 0
    lines = _lines(capsys.readouterr().out)
    # 4 x 6 GiB = 24 GiB at 32K in f16 -> does not fit: 10.00 - 24.00 = -14.00 GiB
    assert any(line.startswith("32K 32,768 NO -14.0 GiB") for line in lines)
    # largest f16 context with 4 sequences: 13,656 (see test_feasibility_does_not_fit)
    assert any(line.startswith("largest 13,656 ") for line in lines)


def test_cli_json(cli_main, capsys):
    assert cli_main(EXAMPLE + MEMORY + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["values_per_token"] == 98304
    assert d["geometry"] == {"n_layers": 48, "n_kv_heads": 8, "head_dim": 128}
    assert d["contexts"] == [8192, 32768, 131072, 268288]
    assert [f["kv_bytes_per_token"] for f in d["formats"]] == [196608, 104448, 55296, 50688, 38400]
    assert d["available_bytes"] == AVAILABLE
    assert len(d["sweep"]) == 5 * 4


def test_cli_measured_and_values_per_token(cli_main, capsys):
    argv = ["budget", "--measured", "4224MiB@262144:tbq4_0", "--formats", "f16,tbq4_0", "--contexts", "256K", "--json"]
    assert cli_main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["values_per_token"] == 32768
    assert d["measured"]["bytes_per_token"] == 16896
    assert d["sweep"][0]["cache"] == "16.00 GiB"
    assert cli_main(["budget", "--values-per-token", "32768", "--formats", "tbq4_0", "--contexts", "256K"]) == 0
    assert "256K 262,144 4.12 GiB" in _lines(capsys.readouterr().out)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--vram", "32G", "--weights", "18.8GiB"], "--vram: '32G' is ambiguous"),
        (["--vram", "32gb", "--weights", "18.8GiB"], "--vram: '32gb': a lowercase 'b' means bits"),
        (["--bandwidth", "1296Gb/s", "--weights", "1GB"], "--bandwidth: '1296Gb/s': a lowercase 'b' means bits"),
        (["--contexts", "8KB"], "--contexts: context '8KB': a context counts tokens, not bytes"),
        (["--formats", "f16,q5_k"], "--formats: unknown KV format 'q5_k'"),
        (["--vram", "32GB"], "--vram needs --weights"),
    ],
)
def test_cli_errors(cli_main, capsys, extra, message):
    assert cli_main(["budget", "--values-per-token", "32768", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tbq budget: error: ") and message in err


def test_cli_needs_a_model(cli_main, capsys):
    assert cli_main(["budget"]) == 2
    assert "give the model geometry" in capsys.readouterr().err
    assert cli_main(["budget", "--layers", "48", "--kv-heads", "8"]) == 2
    assert "missing --head-dim" in capsys.readouterr().err
    assert cli_main(EXAMPLE + ["--values-per-token", "1"]) == 2
    assert "not both" in capsys.readouterr().err


def test_cli_plot(cli_main, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "budget.png"
    assert cli_main(EXAMPLE + MEMORY + ["--plot", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_docs_cli_output_is_real(cli_main, capsys, tmp_path, monkeypatch):
    # every "$ tbq budget ..." block in docs/budget.md is what the command prints today
    blocks = re.findall(r"```\n\$ tbq (budget .*?)\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)  # the worked example writes budget.png
    for command, rest in blocks:
        lines = rest.splitlines()
        while lines and lines[0].startswith("    "):  # the command's continuation lines
            command = command.rstrip("\\ ") + " " + lines.pop(0).strip()
        if "--plot" in command:
            pytest.importorskip("matplotlib")
        assert cli_main(shlex.split(command)) == 0
        assert capsys.readouterr().out.rstrip("\n") == "\n".join(lines).rstrip("\n"), command


# --------------------------------------------------------------------------- head sizes a block format cannot store


def test_block_sizes_come_from_the_format_table():
    for name in cache_types():  # f32 included: a registered format like f16
        assert budget.format_block_size(name) == FORMATS[name].block_size
    assert budget.format_block_size("nvfp4") == 64 and budget.format_block_size("mxfp4") == 32  # ggml's blocks
    assert (
        budget.format_block_size("f16") == 1
        and budget.format_block_size("f32") == 1
        and budget.format_block_size(5.5) is None
    )
    # 100 = 3 x 32 + 4 = 0 x 128 + 100: no block format tiles it; 96 = 3 x 32 is fine for the 32-value blocks
    assert budget.incompatible_formats(100, "f16,q8_0,q4_0,nvfp4,tbq4_0,tbq3_0,6") == [
        ("q8_0", 32),
        ("q4_0", 32),
        ("nvfp4", 64),
        ("tbq4_0", 128),
        ("tbq3_0", 128),
    ]
    assert budget.incompatible_formats(96, "q8_0,mxfp4,tbq4_0") == [("tbq4_0", 128)]
    assert budget.incompatible_formats(256, budget.DEFAULT_FORMATS) == []


def test_cli_default_formats_leave_out_what_the_head_cannot_use(cli_main, capsys):
    # one KV head of 96: the row is 96 values, which no 128-value TBQ block tiles
    assert cli_main(["budget", "--layers", "32", "--kv-heads", "1", "--head-dim", "96", "--contexts", "8K"]) == 0
    out = capsys.readouterr().out
    assert "Note: tbq4_0, tbq3_0 (128 values) cannot store this cache" in out
    assert "the row of 1 x 96 = 96 values" in " ".join(out.split())
    lines = _lines(out)
    assert "q8_0 8.5 6,528 6.38 KiB" in lines  # 2 x 32 x 1 x 96 = 6,144 values x 8.5 / 8
    assert not any(line.startswith("tbq4_0") for line in lines)
    assert (
        cli_main(["budget", "--layers", "32", "--kv-heads", "1", "--head-dim", "96", "--contexts", "8K", "--json"]) == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert [f["format"] for f in d["formats"]] == ["f16", "q8_0", "q4_0"] and "head_dim 96" in d["notes"][0]


def test_cli_tbq_blocks_tile_the_row_not_the_head(cli_main, capsys):
    # the fork checks n_embd_k_gqa for TBQ: 8 heads x 96 = 768 = 6 blocks of 128; ggml's nvfp4 (64) must divide the head
    assert (
        cli_main(["budget", "--layers", "32", "--kv-heads", "8", "--head-dim", "96", "--contexts", "8K", "--json"]) == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert [f["format"] for f in d["formats"]] == ["f16", "q8_0", "q4_0", "tbq4_0", "tbq3_0"] and not d["notes"]
    assert (
        cli_main(
            [
                "budget",
                "--layers",
                "16",
                "--kv-heads",
                "8",
                "--head-dim",
                "64",
                "--formats",
                "tbq4_0,nvfp4",
                "--contexts",
                "8K",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        cli_main(
            [
                "budget",
                "--layers",
                "16",
                "--kv-heads",
                "8",
                "--head-dim",
                "96",
                "--formats",
                "nvfp4",
                "--contexts",
                "8K",
            ]
        )
        == 2
    )
    assert "nvfp4 (64 values)" in capsys.readouterr().err


def test_cli_named_formats_that_cannot_store_the_head_are_an_error(cli_main, capsys):
    argv = ["budget", "--layers", "32", "--kv-heads", "1", "--head-dim", "96", "--formats", "f16,tbq3_0"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "--head-dim 96 is not a multiple of the block size of tbq3_0 (128 values)" in err
    # --values-per-token and --measured carry no head size: nothing to check
    assert cli_main(["budget", "--values-per-token", "49152", "--formats", "tbq3_0", "--contexts", "8K"]) == 0


def test_cli_plot_hint_names_the_checkout_extra(cli_main, capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli_main(["budget", "--values-per-token", "1", "--plot", str(tmp_path / "b.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install '.[plot]'" in err and "tbq[plot]" not in err


# --------------------------------------------------------------------------- K:V pairs, padded heads, vLLM presets


def test_a_kv_pair_costs_the_mean_of_its_sides():
    assert budget.kv_bytes_per_token(32, 8, 128, "q8_0:turbo3") == 32 * 8 * 128 * (34 + 50 / 4) // 32
    assert budget.bits_per_value("q4_0:q4_0") == 4.5 and budget.bits.format_bits("q4_0:q4_0")[0] == "q4_0"
    with pytest.raises(ConfigError, match="two formats joined by one ':'"):
        budget.bits_per_value("q8_0:")


def test_turbo_heads_are_padded_to_whole_blocks_and_never_refused():
    # llama-kv-cache.cpp zero-pads a head of 64 (80, 192) values to 128 (128, 256): those bytes are stored
    for head_dim, stored in ((64, 128), (80, 128), (128, 128), (192, 256)):
        want = 2 * 32 * 8 * stored // 128 * 50  # K and V, 32 layers, 8 heads, 50-byte turbo3 blocks
        assert budget.kv_bytes_per_token(32, 8, head_dim, "turbo3") == want, head_dim
    assert budget.incompatible_formats(80, "q8_0,turbo2,turbo3,turbo4,q8_0:turbo3", n_kv_heads=1) == [("q8_0", 32)]


def test_vllm_presets_cost_their_slots_and_boundary_layers():
    # slot bytes per (token, KV head) from the SPEC's table, not from tbq: 196/134/118/102 at 128, 70 at 64
    slots = {"turboquant_k8v4": 196, "turboquant_4bit_nc": 134, "turboquant_k3v4_nc": 118, "turboquant_3bit_nc": 102}
    for name, s in slots.items():
        assert budget.bits_per_value(name) == s * 8 / 256  # no geometry: head_dim 128, boundary layers not counted
        # 32 layers: the first and last 2 keep bf16 K and V (2 x 128 values x 2 bytes per head)
        assert budget.kv_bytes_per_token(32, 8, 128, name) == 28 * 8 * s + 4 * 8 * 512
    assert budget.kv_bytes_per_token(3, 2, 64, "turboquant_4bit_nc") == 1 * 2 * 70 + 2 * 2 * 256  # min(2, 3 // 2) = 1
    with pytest.raises(ConfigError, match="head_dim must be a power of two"):
        budget.kv_bytes_per_token(32, 8, 80, "turboquant_4bit_nc")
    r = budget.budget_report(65536, "turboquant_3bit_nc", "4K")
    assert any("102-byte slot" in n and "give the geometry" in n for n in r.notes), r.notes
