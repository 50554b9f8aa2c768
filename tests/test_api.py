"""Public API contract: names, shapes, dtypes, configs, backends."""

import dataclasses
import json

import numpy as np
import pytest
from helpers import BACKENDS, assert_bits_equal, assert_bytes_equal

import tbq
from tbq import codecs
from tbq.codebooks import lloyd_max
from tbq.formats.base import Field, FormatInfo, register

#: (values per block, bytes per block, bits per value), written out from docs/formats.md's overview table
SIZES = {
    "q8_0": (32, 34, 8.5),
    "q4_0": (32, 18, 4.5),
    "tbq4_0": (128, 66, 4.125),
    "tbq3_0": (128, 50, 3.125),
    "f16": (1, 2, 16.0),
    "bf16": (1, 2, 16.0),
    "q4_1": (32, 20, 5.0),
    "q5_0": (32, 22, 5.5),
    "q5_1": (32, 24, 6.0),
    "iq4_nl": (32, 18, 4.5),
    "mxfp4": (32, 17, 4.25),
    "nvfp4": (64, 36, 4.5),
    "planar3_0": (128, 50, 3.125),
    "iso3_0": (128, 50, 3.125),
    "planar4_0": (128, 66, 4.125),
    "iso4_0": (128, 66, 4.125),
    "fp8_e4m3": (1, 1, 8.0),
    "fp8_e5m2": (1, 1, 8.0),
    "q8_1": (32, 36, 9.0),
    "q8_k": (256, 292, 9.125),
    "turbo2": (128, 34, 2.125),
    "turbo3": (128, 50, 3.125),
    "turbo4": (128, 68, 4.25),
    "vllm_tq4_k": (128, 66, 4.125),  # head_dim 128 (the registry's default; an option)
    "vllm_tq3_k": (128, 50, 3.125),
    "vllm_tq4_v": (128, 68, 4.25),
    "vllm_tq3_v": (128, 52, 3.25),
    "f32": (1, 4, 32.0),
}


def row(fmt: str) -> int:
    """A row length of whole blocks for ``fmt``: 128 values, or one block of a longer one (q8_k's 256)."""
    return int(np.lcm(128, tbq.format_info(fmt).block_size))


def test_formats():
    """ggml's names, in the order of their stable numeric codes (docs/formats.md)."""
    assert tbq.format_names() == (
        "q8_0",
        "q4_0",
        "tbq4_0",
        "tbq3_0",
        "f16",
        "bf16",
        "q4_1",
        "q5_0",
        "q5_1",
        "iq4_nl",
        "mxfp4",
        "nvfp4",
        "planar3_0",
        "iso3_0",
        "planar4_0",
        "iso4_0",
        "fp8_e4m3",
        "fp8_e5m2",
        "q8_1",
        "q8_k",
        "turbo2",
        "turbo3",
        "turbo4",
        "vllm_tq4_k",
        "vllm_tq3_k",
        "vllm_tq4_v",
        "vllm_tq3_v",
        "f32",
    )
    assert [tbq.format_info(f).code for f in tbq.format_names()] == list(range(1, 29))


@pytest.mark.parametrize("fmt", tbq.format_names())
def test_codec_attributes(fmt):
    c = tbq.get_codec(fmt)
    assert c.name == fmt
    assert (c.block_size, c.type_size, c.bits_per_value) == SIZES[fmt]


def test_format_info_takes_its_byte_size_from_the_layout():
    """``type_size`` left out is the layout's (the sum of its fields' sizes) and ``rotated`` is False; a given
    ``type_size`` the layout disagrees with, or fields that do not tile the block, are refused on registration, and
    neither a size nor a layout at all at construction (test_codec_attributes pins every registered format's sizes
    against docs/formats.md)."""
    layout = (Field("d", 0, 2, "f16", "scale"), Field("qs", 2, 16, "u4_halves", "codes"))
    info = FormatInfo(name="x", block_size=32, index_bits=4, description="d", code=999, layout=layout)
    assert (info.type_size, info.rotated, info.bits_per_value) == (18, False, 4.5)
    assert dataclasses.replace(info, type_size=0, layout=layout[:1]).type_size == 2
    bad = dataclasses.replace(info, type_size=20)
    with pytest.raises(tbq.ConfigError, match="the layout's fields add up to 18 bytes, not 20"):
        register(type("X", (), {"info": bad}))
    gap = dataclasses.replace(info, layout=(layout[0], dataclasses.replace(layout[1], offset=3)))  # byte 2 in no field
    with pytest.raises(tbq.ConfigError, match="field 'qs' starts at byte 3, not 2"):
        register(type("X", (), {"info": gap}))
    assert "x" not in tbq.format_names()
    with pytest.raises(tbq.ConfigError, match="type_size must be positive"):
        FormatInfo(name="x", block_size=32, index_bits=4, description="d")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", tbq.format_names())
def test_shapes_and_dtypes(fmt, backend):
    bs, ts, _ = SIZES[fmt]
    x = np.random.default_rng(0).standard_normal((2, 3, 2 * 128)).astype(np.float32)
    q = tbq.quantize(x, fmt, backend=backend)
    assert q.dtype == np.uint8 and q.shape == (2, 3, 256 // bs * ts)
    y = tbq.dequantize(q, fmt, backend=backend)
    assert y.dtype == np.float32 and y.shape == x.shape
    # 1-D and empty leading axes
    assert tbq.quantize(x[0, 0], fmt, backend=backend).shape == (256 // bs * ts,)
    n = row(fmt)
    assert tbq.quantize(np.zeros((0, n), np.float32), fmt, backend=backend).shape == (0, n // bs * ts)


@pytest.mark.parametrize("fmt", tbq.format_names())
def test_float16_and_float64_are_converted_to_float32_first(fmt):
    x64 = np.random.default_rng(1).standard_normal((4, row(fmt)))
    assert_bytes_equal(tbq.quantize(x64, fmt), tbq.quantize(x64.astype(np.float32), fmt))
    x16 = x64.astype(np.float16)
    assert_bytes_equal(tbq.quantize(x16, fmt), tbq.quantize(x16.astype(np.float32), fmt))


@pytest.mark.parametrize("fmt", tbq.format_names())
def test_non_contiguous_input(fmt):
    x = np.random.default_rng(2).standard_normal((256, 6)).astype(np.float32).T  # (6, 256) F-order
    assert_bytes_equal(tbq.quantize(x, fmt), tbq.quantize(np.ascontiguousarray(x), fmt))


@pytest.mark.parametrize("fmt", tbq.format_names())
def test_out_arguments(fmt):
    c = tbq.get_codec(fmt)
    x = np.random.default_rng(3).standard_normal((5, row(fmt))).astype(np.float32)
    out = np.empty((5, row(fmt) // c.block_size * c.type_size), np.uint8)
    assert c.encode(x, out=out) is out
    assert_bytes_equal(out, c.encode(x))
    y = np.empty_like(x)
    assert c.decode(out, out=y) is y
    assert_bits_equal(y, c.decode(out))
    with pytest.raises(tbq.TbqValueError, match="shape"):
        c.encode(x, out=np.empty((5, 1), np.uint8))
    with pytest.raises(tbq.TbqTypeError, match="dtype"):
        c.decode(out, out=np.empty(x.shape, np.float64))


@pytest.mark.parametrize("fmt", tbq.format_names())
def test_bytes_like_decode(fmt):
    x = np.random.default_rng(4).standard_normal(256).astype(np.float32)
    q = tbq.quantize(x, fmt)
    assert_bits_equal(tbq.dequantize(q.tobytes(), fmt), tbq.dequantize(q, fmt))


CONFIGS = [
    ("q8_0", {}),
    ("q4_0", {"backend": "numpy", "threads": 1}),
    ("tbq4_0", {"codebook": "turboq-mtp", "signs": 12345}),
    ("tbq3_0", {"codebook": lloyd_max(3), "signs": "turboq-mtp", "on_overflow": "inf"}),
    ("tbq4_0", {"codebook": tbq.Codebook(np.linspace(-0.2, 0.2, 16), np.linspace(-0.18, 0.18, 15))}),
    ("tbq3_0", {"signs": (np.ones(128), -np.ones(128))}),
]


@pytest.mark.parametrize("fmt,cfg", CONFIGS)
def test_config_round_trip_equality_and_repr(fmt, cfg):
    c = tbq.get_codec(fmt, **cfg)
    conf = c.get_config()
    assert conf["name"] == fmt
    again = tbq.codec_from_config(json.loads(json.dumps(conf)))
    assert again == c and again.get_config() == conf
    assert eval(repr(c), vars(codecs)) == c
    x = np.random.default_rng(5).standard_normal((3, 128)).astype(np.float32)
    assert_bytes_equal(again.encode(x), c.encode(x))


def test_named_tables_are_recorded_by_name_and_differ_when_they_should():
    a = tbq.get_codec("tbq4_0")
    assert a.get_config()["codebook"] == "lloyd-max" and a.get_config()["signs"] == "turboq-mtp"
    assert tbq.get_codec("tbq4_0", codebook=lloyd_max(4)) == a
    assert tbq.get_codec("tbq4_0", signs=1) != a
    assert tbq.get_codec("tbq4_0", codebook="turboq-mtp") != a


def test_seeded_signs_documented_prng():
    s1, s2 = tbq.rotation.signs_from_seed(42)
    rng = np.random.Generator(np.random.PCG64(42))
    assert s1.tolist() == (1 - 2 * rng.integers(0, 2, size=128)).tolist()
    assert s2.tolist() == (1 - 2 * rng.integers(0, 2, size=128)).tolist()
    c = tbq.get_codec("tbq4_0", signs=42)
    assert np.array_equal(c.rotation.signs1, s1) and np.array_equal(c.rotation.signs2, s2)


@pytest.mark.parametrize(
    "fmt,cfg",
    [(f, {}) for f in tbq.format_names()]
    + [(f, c) for f in ("tbq4_0", "tbq3_0") for c in ({"signs": 7}, {"codebook": "turboq-mtp"})],
)
def test_backends_and_thread_counts_agree(fmt, cfg):
    rng = np.random.default_rng(6)
    x = (rng.standard_t(3, size=(300, 1024)) * rng.uniform(1e-4, 1e3, size=(300, 1))).astype(np.float32)
    cfg = dict(
        cfg, on_overflow="inf"
    )  # heavy tails x 1e3 overflow some fp16 scales (planar/iso): agreement is the point
    ref = tbq.quantize(x, fmt, backend="numpy", **cfg)
    for threads in (1, 2, 3):
        assert_bytes_equal(tbq.quantize(x, fmt, backend="numba", threads=threads, **cfg), ref, f"threads={threads}")
    y = tbq.dequantize(ref, fmt, backend="numpy", **cfg)
    for threads in (1, 2):
        assert_bits_equal(tbq.dequantize(ref, fmt, backend="numba", threads=threads, **cfg), y, f"threads={threads}")


@pytest.mark.parametrize("fmt", tbq.format_names())
def test_arbitrary_bytes_decode_identically_in_both_backends(fmt):
    """Any byte content decodes (NaN/Inf/subnormal scales included) the same way in both paths."""
    c = tbq.get_codec(fmt)
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, size=(4000, max(2, c.type_size)), dtype=np.uint8)  # (two values of a 1-byte format)
    specials = [0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE00, 0x0001, 0x8001, 0x03FF, 0x8000, 0x0000, 0x7BFF]
    for i, h in enumerate(specials):
        data[i, 0], data[i, 1] = h & 0xFF, h >> 8
    a = tbq.dequantize(data, fmt, backend="numpy")
    b = tbq.dequantize(data, fmt, backend="numba")
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    fin = ~np.isnan(a)
    assert_bits_equal(a[fin], b[fin])
    # A format whose only float field is an fp16 scale d at bytes 0-1 decodes code * d: an
    # infinite scale gives +-inf or NaN (0 * inf), a +0 scale gives zeros.
    layout = tbq.format_info(fmt).layout
    if layout[0].name == "d" and layout[0].kind == "f16" and sum(f.kind == "f16" for f in layout) == 1:
        inf_rows = a[0]
        assert np.all(np.isinf(inf_rows) | np.isnan(inf_rows))
        assert np.all(a[9] == 0)  # +0 scale


@pytest.mark.parametrize("fmt", tbq.format_names())
def test_other_byte_orders_are_converted(fmt):
    x = np.random.default_rng(8).standard_normal((3, row(fmt))).astype(np.float32)
    for dt in (">f4", ">f8", ">f2"):
        xb = x.astype(dt)
        assert_bytes_equal(tbq.quantize(xb, fmt), tbq.quantize(xb.astype(np.float32), fmt))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", tbq.format_names())
def test_non_contiguous_layouts_of_every_kind(fmt, backend):
    """Transposed leading axes, negative strides, 1-D strided rows, and non-contiguous encoded bytes."""
    rng = np.random.default_rng(9)
    base = rng.standard_normal((5, 7, 256)).astype(np.float64)
    c = tbq.get_codec(fmt, backend=backend)
    for x in (base.swapaxes(0, 1), base[::-1, ::2], base[2, 3, :]):
        assert not x.flags.c_contiguous or x.ndim == 1
        q = c.encode(x)
        assert_bytes_equal(q, c.encode(np.ascontiguousarray(x)))
        qt = np.ascontiguousarray(q.swapaxes(0, -2)).swapaxes(0, -2) if q.ndim > 1 else q
        assert_bits_equal(c.decode(qt), c.decode(q))


# --------------------------------------------------------------------------- one naming rule (docs/formats.md)


@pytest.mark.parametrize("spelling", ["Q8_0", " q8_0 ", "Q8_0\n", "q8_0"])
def test_a_format_name_is_matched_ignoring_case_and_spaces_and_written_lowercase(spelling):
    from tbq.formats import format_name
    from tbq.numcodecs import get_numcodec

    assert format_name(spelling) == "q8_0"
    c = tbq.get_codec(spelling)
    assert c.name == "q8_0" and c.get_config()["name"] == "q8_0" and c == tbq.get_codec("q8_0")
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    assert np.array_equal(tbq.quantize(x, spelling), tbq.quantize(x, "q8_0"))
    assert tbq.format_info(spelling) is tbq.format_info("q8_0")
    assert get_numcodec("tbq." + spelling.strip().upper()).get_config()["id"] == "tbq.q8_0"


@pytest.mark.parametrize("bad", ["q8-0", "q80", "Q8_0x", "", None, 8])
def test_no_other_spelling_is_a_format(bad):
    from tbq.formats import format_name

    with pytest.raises(tbq.ConfigError, match="unknown format"):
        format_name(bad)


@pytest.mark.parametrize(
    "command",
    [
        ["budget", "--values-per-token", "1000", "--formats", "Q8_0", "--contexts", "8K", "--json"],
        [
            "golden",
            "--formats",
            "Q8_0",
            "--rows-per-family",
            "1",
            "--families",
            "gaussian",
            "--quiet",
            "--out",
            "{tmp}/g",
        ],
        ["compare", "--formats", "Q8_0", "--repeat", "1", "--queries", "1", "--json", "{tmp}/x.npy"],
    ],
)
def test_every_command_takes_any_case(command, tmp_path, capsys):
    from tbq import cli

    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((16, 2, 64)).astype(np.float32))
    assert cli.main([a.replace("{tmp}", str(tmp_path)) for a in command]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    if command[0] == "golden":
        assert (tmp_path / "g" / "q8_0.json").exists()
    else:
        assert '"q8_0"' in out and "Q8_0" not in out


def test_check_takes_any_case(capsys):
    from tbq import cli

    # an unknown program fails after the format was read: the format name itself is accepted
    rc = cli.main(
        [
            "check",
            "--format",
            "Q8_0",
            "--exec",
            "/nonexistent/prog {in} {out}",
            "--only",
            "quantize",
            "--blocks",
            "1",
            "--examples",
            "0",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert "invalid choice" not in err and "unknown format" not in err
    assert rc == 2
