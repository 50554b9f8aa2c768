"""tbq.numcodecs: numcodecs codecs per format, stored fixtures, and Zarr (v3 serializer, v2 filter).

Modelled on numcodecs' own ``tests/common.py`` (``check_encode_decode``,
``check_config``, ``check_repr``, ``check_backwards_compatibility``), with the
exact round trip replaced by the tbq contract: ``decode(encode(x))`` is
bit-identical to ``tbq.dequantize(tbq.quantize(x))`` and within the format's
error bound of ``x``.

Fixtures in ``tests/data/numcodecs_fixtures/<codec id>/`` pin the encoded bytes
(header included) and the decoded float32 bits. They are never written by a
normal run: regenerate deliberately with
``TBQ_REGEN_NUMCODECS_FIXTURES=1 pytest tests/test_numcodecs.py`` (only missing
files are written; delete a file to rewrite it) and review the diff.
"""

from __future__ import annotations

import array
import json
import os
import pickle
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

numcodecs = pytest.importorskip("numcodecs", reason="optional extra 'zarr' (numcodecs) is not installed")

from helpers import assert_bits_equal, assert_bytes_equal  # noqa: E402

import tbq  # noqa: E402
import tbq.numcodecs as tn  # noqa: E402
from tbq.codebooks import lloyd_max  # noqa: E402
from tbq.synthetic import gaussian, keys_with_outliers  # noqa: E402

FIXTURES = Path(__file__).parent / "data" / "numcodecs_fixtures"
REGEN = os.environ.get("TBQ_REGEN_NUMCODECS_FIXTURES") == "1"
FORMATS = tbq.format_names()
IDS = dict(tn.CODEC_IDS)  # "tbq.<format>" for every registered format


def fits(fmt) -> dict:
    """Settings under which the round-trip arrays (values to 3e3) encode: FP8_E4M3 (largest value 448) saturates, as vLLM;
    Q8_1's ``s = fp16(d * sum(codes))`` reaches 32 * 3e3, beyond fp16, and is stored as inf, as ggml stores it."""
    if "saturate" in tbq.get_format(fmt).overflow_modes:
        return {"on_overflow": "saturate"}
    return {"on_overflow": "inf"} if fmt == "q8_1" else {}


def whole_blocks(a: np.ndarray, fmt) -> np.ndarray:
    """``a`` itself when its rows are whole blocks of ``fmt``; else its values as rows of ``lcm(row, block)``
    (q8_k's 256-value block takes two 128-value rows), a last incomplete row dropped."""
    bs = tbq.format_info(fmt).block_size
    if a.shape[-1] % bs == 0:
        return a
    n = int(np.lcm(a.shape[-1], bs))
    flat = np.ascontiguousarray(a).reshape(-1)
    return flat[: flat.size // n * n].reshape(-1, n)


def whole_block_kv(x: np.ndarray, chunks: tuple, fmt) -> tuple[np.ndarray, tuple]:
    """A (..., heads, 128) cache and its chunks with rows of whole blocks: q8_k's rows hold two heads."""
    f = int(np.lcm(x.shape[-1], tbq.format_info(fmt).block_size)) // x.shape[-1]
    if f == 1:
        return x, chunks
    return x.reshape(x.shape[:-2] + (x.shape[-2] // f, x.shape[-1] * f)), chunks[:-2] + (
        chunks[-2] // f,
        chunks[-1] * f,
    )


def takes_tables(fmt) -> bool:
    """True for formats configured by codebook and signs (the TBQ formats)."""
    from tbq.formats import FORMAT_CLASSES

    return "codebook" in FORMAT_CLASSES[fmt].options


#: Lloyd-Max distortion of N(0, 1/128) is 0.0095 (4 bits) and 0.0345 (3 bits) per unit energy.
TBQ_BLOCK_NMSE = {"tbq4_0": 0.1, "tbq3_0": 0.2}  # worst single block (measured max ~0.05 / ~0.10 over 16k blocks)
TBQ_ARRAY_NMSE = {"tbq4_0": 0.0125, "tbq3_0": 0.042}  # whole arrays of >= 64 blocks


# ---------------------------------------------------------------------------
# helpers (tbq variants of numcodecs.tests.common)
# ---------------------------------------------------------------------------


def reference(x, fmt, **config):
    """What the codec must reproduce: the in-memory core path."""
    return tbq.dequantize(tbq.quantize(x, fmt, **config), fmt, **config)


def assert_within_bound(x, y, fmt):
    """The format's error bound: per block for Q8_0/Q4_0, NMSE for TBQ; other formats are held to bit-exactness only."""
    if fmt not in ("q8_0", "q4_0") and fmt not in TBQ_BLOCK_NMSE:
        return  # the codec must equal the core path bit for bit (checked by the caller); no bound is claimed here
    info = tbq.format_info(fmt)
    x = np.asarray(x, np.float32).astype(np.float64).reshape(-1, info.block_size)
    y = np.asarray(y, np.float64).reshape(-1, info.block_size)
    err = np.abs(y - x)
    amax = np.abs(x).max(axis=1, keepdims=True)
    f16 = 2.0**-11  # relative rounding of the fp16 scale; 2**-25 covers subnormal scales
    if fmt == "q8_0":  # |x - q d| <= d/2, plus 127 |d - fp16(d)|
        bound = amax / 127 * (0.5 + 127 * f16) * 1.001 + 127 * 2.0**-25
    elif fmt == "q4_0":  # the clipped code (-max -> 7d) is off by |d| = amax/8
        bound = amax / 8 * (1 + 8 * f16) * 1.001 + 8 * 2.0**-25
    elif fmt in TBQ_BLOCK_NMSE:
        energy = np.sum(x * x, axis=1)
        sse = np.sum((y - x) ** 2, axis=1)
        ok = sse <= TBQ_BLOCK_NMSE[fmt] * energy + 1e-30
        assert ok.all(), f"{fmt}: block {int(np.argmin(ok))} has NMSE {sse[~ok][0] / energy[~ok][0]:.4f}"
        if x.shape[0] >= 64:
            nmse = sse.sum() / energy.sum()
            assert nmse <= TBQ_ARRAY_NMSE[fmt], f"{fmt}: NMSE {nmse:.5f} > {TBQ_ARRAY_NMSE[fmt]}"
        return
    bad = err > bound
    assert not bad.any(), f"{fmt}: error {err[bad][0]} above the bound {np.broadcast_to(bound, err.shape)[bad][0]}"


def check_decoded(x, dec, fmt, ref, shape=None):
    """``dec`` (any buffer) is ``ref`` bit for bit (reshaped) and within the bound of ``x``."""
    d = numcodecs.compat.ensure_ndarray(dec).reshape(-1).view(np.float32)
    r = ref.reshape(-1)
    assert_bits_equal(d, r, fmt)
    if shape is not None and isinstance(dec, np.ndarray):
        assert dec.shape == shape and dec.dtype == np.float32
    assert_within_bound(np.asarray(x).reshape(-1), d, fmt)


def check_encode_decode_lossy(arr, codec):
    """numcodecs' ``check_encode_decode`` with the tbq contract instead of exactness."""
    fmt = codec.fmt
    cfg = {k: v for k, v in codec.get_config().items() if k != "id"}  # the core codec's configuration
    ref = reference(arr, fmt, **cfg)

    # encoding accepts a float array (shape kept) ...
    enc = codec.encode(arr)
    assert enc.dtype == np.uint8 and enc.ndim == 1
    assert enc.size == tn.encoded_size(arr.shape, fmt, **cfg)
    assert_bytes_equal(enc[tn.header_size(arr.ndim) :], tbq.quantize(arr, fmt, **cfg).reshape(-1), fmt)
    check_decoded(arr, codec.decode(enc), fmt, ref, shape=arr.shape)

    # ... and any buffer of raw float32 bytes (one row, numcodecs style)
    if arr.dtype == np.float32:
        flat = np.ascontiguousarray(arr).reshape(-1)
        ref_flat = reference(flat, fmt, **cfg)
        for buf in (
            arr.tobytes(),
            bytearray(arr.tobytes()),
            array.array("b", arr.tobytes()),
            memoryview(arr.tobytes()),
        ):
            e = codec.encode(buf)
            check_decoded(flat, codec.decode(e), fmt, ref_flat, shape=flat.shape)

    # decoding accepts any buffer
    enc_bytes = numcodecs.compat.ensure_bytes(enc)
    for buf in (
        enc_bytes,
        bytearray(enc_bytes),
        array.array("b", enc_bytes),
        np.frombuffer(enc_bytes, "u1"),
        memoryview(enc_bytes),
    ):
        check_decoded(arr, codec.decode(buf), fmt, ref, shape=arr.shape)

    # decoding into out: a float32 array of the shape, a flat one, a bytearray
    out = np.empty(arr.shape, np.float32)
    assert codec.decode(enc_bytes, out=out) is out
    check_decoded(arr, out, fmt, ref)
    out = np.empty(arr.size, np.float32)
    codec.decode(enc_bytes, out=out)
    check_decoded(arr, out, fmt, ref)
    out = bytearray(arr.size * 4)
    codec.decode(enc_bytes, out=out)
    check_decoded(arr, out, fmt, ref)


def check_config(codec):
    """numcodecs' ``check_config``: JSON round trip through the registry, plus the core config."""
    config = json.loads(json.dumps(codec.get_config()))
    assert numcodecs.get_codec(config) == codec
    core = dict(config)
    core["name"] = core.pop("id")[len("tbq.") :]
    assert tbq.codec_from_config(core) == codec.codec
    assert core == codec.codec.get_config()


def check_repr(stmt):
    """numcodecs' ``check_repr``: the repr is the instantiation statement."""
    assert repr(eval(stmt, vars(tn))) == stmt


def fixture_arrays() -> list[np.ndarray]:
    k = keys_with_outliers(4, 2, seed=11)  # (4, 2, 128) float32
    g = gaussian(1, 2, 256, seed=12).reshape(512)  # 1-D
    wide = gaussian(2, 1, 384, seed=13, std=3.0).reshape(2, 384).astype(np.float64)  # float64 input
    edge = np.zeros((3, 128), np.float32)  # a zero row, a tiny row, a large row
    edge[1] = np.linspace(-1e-6, 1e-6, 128, dtype=np.float32)
    edge[2] = np.linspace(-3e3, 2e3, 128, dtype=np.float32)  # TBQ norm ~2e4 < fp16 max
    return [k, g, wide, edge]


def round_trip_arrays() -> list[np.ndarray]:
    big = keys_with_outliers(32, 4, seed=21)  # 128 TBQ blocks: whole-array NMSE bound applies
    f_order = np.asfortranarray(gaussian(8, 1, 256, seed=22).reshape(8, 256))
    strided = gaussian(8, 2, 256, seed=23)[:, 1, :]  # non-contiguous view
    half = gaussian(4, 1, 128, seed=24).reshape(4, 128).astype(np.float16)
    empty = np.zeros((0, 3, 128), np.float32)
    return fixture_arrays() + [big, f_order, strided, half, empty]


# ---------------------------------------------------------------------------
# numcodecs codec behaviour
# ---------------------------------------------------------------------------


def test_registered_with_numcodecs():
    for fmt, cid in IDS.items():
        c = numcodecs.get_codec({"id": cid})
        assert type(c) is getattr(tn, f"{fmt.upper()}Numcodec") and c.codec_id == cid and c.fmt == fmt
        assert isinstance(c, numcodecs.abc.Codec)
        assert numcodecs.registry.codec_registry[cid] is type(c)
        assert tn.get_numcodec(fmt) == c == tn.get_numcodec(cid)
        assert (c.block_size, c.type_size) == (tbq.format_info(fmt).block_size, tbq.format_info(fmt).type_size)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_decode(fmt, backend):
    codec = tn.get_numcodec(fmt, backend=backend, **fits(fmt))
    for arr in round_trip_arrays():
        check_encode_decode_lossy(whole_blocks(arr, fmt), codec)


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_decode_tbq_options(fmt):
    extra = {"codebook": "turboq-mtp", "signs": 7} if takes_tables(fmt) else {"on_overflow": "inf"}
    codec = tn.get_numcodec(fmt, threads=2, **extra)
    x = whole_blocks(keys_with_outliers(8, 2, seed=5), fmt)
    assert_bits_equal(codec.decode(codec.encode(x)), reference(x, fmt, **extra), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_config(fmt):
    check_config(tn.get_numcodec(fmt))
    check_config(tn.get_numcodec(fmt, backend="numpy", threads=3, on_overflow="inf"))
    if takes_tables(fmt):
        bits = tbq.format_info(fmt).index_bits
        cb = lloyd_max(bits, sigma=0.1)  # a custom codebook: its config is the tables
        check_config(tn.get_numcodec(fmt, codebook="turboq-mtp", signs=123))
        check_config(tn.get_numcodec(fmt, codebook=cb, signs={"signs1": [1] * 64 + [-1] * 64, "signs2": [-1, 1] * 64}))
    cfg = tn.get_numcodec(fmt).get_config()
    assert cfg["id"] == IDS[fmt] and "name" not in cfg
    assert list(cfg)[0] == "id"


def test_config_values():
    assert tn.Q8_0Numcodec(backend="numpy").get_config() == {
        "id": "tbq.q8_0",
        "backend": "numpy",
        "threads": None,
        "on_overflow": "raise",
    }
    assert tn.TBQ3_0Numcodec(backend="numpy").get_config() == {
        "id": "tbq.tbq3_0",
        "codebook": "lloyd-max",
        "signs": "turboq-mtp",
        "backend": "numpy",
        "threads": None,
        "on_overflow": "raise",
    }
    assert tn.Q8_0Numcodec() != tn.Q8_0Numcodec(on_overflow="inf")
    assert (
        tn.Q8_0Numcodec(backend="numpy") == tn.Q8_0Numcodec(backend="numpy") and tn.Q8_0Numcodec() != tn.Q4_0Numcodec()
    )
    assert hash(tn.TBQ4_0Numcodec()) == hash(tn.TBQ4_0Numcodec())


def test_repr():
    check_repr("Q8_0Numcodec(backend='numpy', threads=None, on_overflow='raise')")
    check_repr("Q4_0Numcodec(backend='numba', threads=2, on_overflow='inf')")
    check_repr(
        "TBQ4_0Numcodec(codebook='lloyd-max', signs='turboq-mtp', backend='numpy', threads=None, on_overflow='raise')"
    )
    check_repr("TBQ3_0Numcodec(codebook='turboq-mtp', signs=7, backend='numpy', threads=1, on_overflow='raise')")


def test_header_layout():
    """The documented header, byte by byte."""
    x = np.ones((2, 3, 64), np.float32)
    enc = tn.Q4_0Numcodec().encode(x)
    head = bytes(enc[:32])
    assert head[:4] == b"TBQ\x00" and head[4] == 1 and head[5] == 2 and head[6] == 3 and head[7] == 0
    assert struct.unpack("<3Q", head[8:32]) == (2, 3, 64)
    assert tn.read_header(enc) == ("q4_0", (2, 3, 64), 32)
    assert tn.header_size(3) == 32 and enc.size == 32 + 2 * 3 * 2 * 18
    for fmt, code in {"q8_0": 1, "q4_0": 2, "tbq4_0": 3, "tbq3_0": 4}.items():
        assert tn.get_numcodec(fmt).encode(np.ones(128, np.float32))[5] == code
        assert tn.FORMAT_CODES[fmt] == code


def test_encode_errors():
    c = tn.Q8_0Numcodec()
    with pytest.raises(
        tbq.BlockShapeError, match=r"chunk of shape \(4, 100\).*last axis has 100 values.*multiple of the block size 32"
    ):
        c.encode(np.zeros((4, 100), np.float32))
    with pytest.raises(tbq.BlockShapeError, match="block size 128"):
        tn.TBQ4_0Numcodec().encode(np.zeros(96, np.float32))
    with pytest.raises(tbq.BlockShapeError, match="0-d"):
        c.encode(np.float32(1.0).reshape(()))
    with pytest.raises(tbq.TbqTypeError, match="int32"):
        c.encode(np.zeros(32, np.int32))
    with pytest.raises(tbq.BlockShapeError, match="multiple of 4"):
        c.encode(b"\x00" * 130)
    with pytest.raises(tbq.TbqTypeError, match="cannot encode a list"):
        c.encode([1.0] * 32)
    with pytest.raises(tbq.NonFiniteError):
        c.encode(np.full(32, np.nan, np.float32))
    with pytest.raises(tbq.ScaleOverflowError):
        c.encode(np.full(32, 1e9, np.float32))
    assert np.isinf(
        tn.Q8_0Numcodec(on_overflow="inf").decode(
            tn.Q8_0Numcodec(on_overflow="inf").encode(np.full(32, 1e9, np.float32))
        )
    ).any()


def test_decode_errors():
    enc = tn.TBQ4_0Numcodec().encode(np.ones((2, 128), np.float32))
    with pytest.raises(tbq.TbqValueError, match="holds tbq4_0 blocks.*not q8_0"):
        tn.Q8_0Numcodec().decode(enc)
    with pytest.raises(tbq.EncodedLengthError, match="truncated or corrupt"):
        tn.TBQ4_0Numcodec().decode(enc[:-1])
    with pytest.raises(tbq.EncodedLengthError, match="truncated or corrupt"):
        tn.TBQ4_0Numcodec().decode(np.concatenate([enc, enc[-1:]]))
    with pytest.raises(tbq.EncodedLengthError, match="header"):
        tn.TBQ4_0Numcodec().decode(enc[:5])
    with pytest.raises(tbq.EncodedLengthError, match="declares 2 axes"):
        tn.TBQ4_0Numcodec().decode(enc[:12])
    bad = enc.copy()
    bad[0] = ord("X")
    with pytest.raises(tbq.TbqValueError, match="not a tbq-encoded buffer"):
        tn.TBQ4_0Numcodec().decode(bad)
    bad = enc.copy()
    bad[4] = 9
    with pytest.raises(tbq.TbqValueError, match="header version 9"):
        tn.TBQ4_0Numcodec().decode(bad)
    bad = enc.copy()
    bad[5] = 77
    with pytest.raises(tbq.TbqValueError, match="unknown format code 77"):
        tn.TBQ4_0Numcodec().decode(bad)


def test_config_errors():
    with pytest.raises(tbq.ConfigError):
        tn.get_numcodec("q9_9")
    with pytest.raises(tbq.ConfigError):
        tn.Q8_0Numcodec(name="q8_0")
    with pytest.raises(tbq.ConfigError, match="bad configuration"):
        tn.Q8_0Numcodec(codebook="lloyd-max")  # not a Q8_0 parameter
    with pytest.raises(tbq.ConfigError, match="not 'tbq.q8_0'"):
        tn.Q8_0Numcodec.from_config({"id": "tbq.q4_0"})
    with pytest.raises(TypeError, match="abstract"):
        tn.TbqCodec()


def test_docs_doctest():
    """The interactive examples of docs/scale-out.md."""
    import doctest

    doc = Path(__file__).resolve().parents[1] / "docs" / "scale-out.md"
    result = doctest.testfile(str(doc), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted >= 2


def test_not_imported_by_tbq():
    code = "import sys, tbq, tbq.codecs, tbq.metrics; print(sorted(m for m in ('tbq.numcodecs', 'tbq.dask', 'numcodecs', 'zarr', 'dask') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout


# ---------------------------------------------------------------------------
# Stored fixtures (numcodecs' check_backwards_compatibility, pinning the bytes too)
# ---------------------------------------------------------------------------


def fixture_codecs(fmt):
    codecs = [tn.get_numcodec(fmt, **fits(fmt))]
    if takes_tables(fmt):
        codecs.append(tn.get_numcodec(fmt, codebook="turboq-mtp", signs=7))
    if "scale" in tbq.get_format(fmt).options:  # FP8: a calibrated per-tensor scale, vLLM's saturation
        codecs.append(tn.get_numcodec(fmt, scale=0.0173, on_overflow="saturate"))
    return codecs


def _write_missing(path: Path, data: bytes):
    if path.exists():
        return
    if not REGEN:
        pytest.fail(f"missing fixture {path}; regenerate with TBQ_REGEN_NUMCODECS_FIXTURES=1 and review the diff")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _npy_bytes(a: np.ndarray) -> bytes:
    import io

    b = io.BytesIO()
    np.save(b, a, allow_pickle=False)
    return b.getvalue()


@pytest.mark.parametrize("fmt", FORMATS)
def test_backwards_compatibility(fmt):
    cid = IDS[fmt]
    root = FIXTURES / cid
    arrays = [whole_blocks(a, fmt) for a in fixture_arrays()]  # (the same arrays for every 128-dividing block)
    for i, arr in enumerate(arrays):
        _write_missing(root / f"array.{i:02d}.npy", _npy_bytes(arr))
    stored = sorted(root.glob("array.*.npy"))
    assert len(stored) == len(arrays)
    for j, codec in enumerate(fixture_codecs(fmt)):
        cdir = root / f"codec.{j:02d}"
        cfg = {k: v for k, v in codec.get_config().items() if k not in ("backend", "threads")}
        _write_missing(cdir / "config.json", (json.dumps(cfg, sort_keys=True, indent=4) + "\n").encode())
        stored_cfg = json.loads((cdir / "config.json").read_text())
        for backend in ("numpy", "numba"):
            c = numcodecs.get_codec({**stored_cfg, "backend": backend})
            assert c.get_config() == {**codec.get_config(), "backend": backend}
            for arr_fn in stored:
                i = int(arr_fn.name.split(".")[1])
                arr = np.load(arr_fn, allow_pickle=False)
                enc_fn = cdir / f"encoded.{i:02d}.dat"
                dec_fn = cdir / f"decoded.{i:02d}.npy"
                enc = c.encode(arr)
                _write_missing(enc_fn, enc.tobytes())
                _write_missing(dec_fn, _npy_bytes(c.decode(enc)))
                want = np.frombuffer(enc_fn.read_bytes(), np.uint8)
                assert_bytes_equal(enc, want, f"{cid} codec.{j:02d} array.{i:02d} ({backend}): encoded bytes changed")
                dec = c.decode(want)
                assert_bits_equal(
                    dec, np.load(dec_fn), f"{cid} codec.{j:02d} array.{i:02d} ({backend}): decoded bits changed"
                )
                assert dec.shape == arr.shape


# ---------------------------------------------------------------------------
# Zarr
# ---------------------------------------------------------------------------


def _zarr():
    zarr = pytest.importorskip("zarr", reason="optional extra 'zarr' (zarr>=3) is not installed")
    if int(zarr.__version__.split(".")[0]) < 3:
        pytest.skip(f"zarr>=3 is needed, found {zarr.__version__}")
    return zarr


def synthetic_kv(tokens=48, layers=3, heads=4, head_dim=128, seed=0):
    """tokens x layers x heads x head_dim keys with outlier channels."""
    return keys_with_outliers(tokens, layers * heads, head_dim, seed=seed).reshape(tokens, layers, heads, head_dim)


def test_zarr3_codec_object():
    _zarr()
    z = tn.zarr_codec("tbq4_0", codebook="turboq-mtp")
    assert z.to_dict() == {
        "name": "tbq.tbq4_0",
        "configuration": {k: v for k, v in tn.TBQ4_0Numcodec(codebook="turboq-mtp").get_config().items() if k != "id"},
    }
    assert type(z).from_dict(json.loads(json.dumps(z.to_dict()))) == z
    assert z.numcodec == tn.TBQ4_0Numcodec(codebook="turboq-mtp")
    from zarr.registry import get_codec_class

    for cid in IDS.values():
        assert get_codec_class(cid) is tn.ZarrCodec
    with pytest.raises(tbq.ConfigError):
        tn.zarr_codec("tbq2_0")


@pytest.mark.parametrize("compressors", [None, "zstd"])
def test_zarr3_serializer_round_trip(tmp_path, compressors):
    """In-process write/read of every format; a bytes->bytes compressor may follow the serializer."""
    zarr = _zarr()
    x = synthetic_kv()
    comp = None if compressors is None else [zarr.codecs.ZstdCodec(level=1)]
    x0 = x
    for fmt in FORMATS:
        x, chunks = whole_block_kv(x0, (16, 1, 4, 128), fmt)
        a = zarr.create_array(
            store=tmp_path / f"{fmt}.zarr",
            shape=x.shape,
            chunks=chunks,
            dtype="float32",
            serializer=tn.zarr_codec(fmt),
            compressors=comp,
        )
        a[:] = x
        b = zarr.open_array(tmp_path / f"{fmt}.zarr", mode="r")
        assert_bits_equal(b[:], reference(x, fmt), fmt)
        assert_bits_equal(b[5:20, 1], reference(x, fmt)[5:20, 1], fmt)
        meta = json.loads((tmp_path / f"{fmt}.zarr" / "zarr.json").read_text())
        assert meta["codecs"][0]["name"] == IDS[fmt]
        if compressors is None:  # a stored chunk is exactly the numcodecs encoding of that chunk
            chunk = (tmp_path / f"{fmt}.zarr" / "c" / "1" / "2" / "0" / "0").read_bytes()
            assert chunk == tn.get_numcodec(fmt).encode(x[16:32, 2:3]).tobytes()


@pytest.mark.parametrize("head_dim", [64, 256])
def test_a_format_option_that_sets_the_block_sizes_the_stored_chunks(tmp_path, head_dim):
    """vLLM's TurboQuant block is one head (``head_dim``, a format option; the registry's row is 128's): the
    numcodecs codec, encoded_size and a sharded Zarr store (whose shard index needs each chunk's encoded size)
    take the instance's sizes, and a process reading the store back gets the values bit for bit."""
    zarr = _zarr()
    from types import SimpleNamespace

    x = synthetic_kv(head_dim=head_dim)
    for fmt in ("vllm_tq4_k", "vllm_tq3_v"):
        codec = tn.get_numcodec(fmt, head_dim=head_dim)
        assert codec.get_config()["head_dim"] == head_dim and codec.block_size == head_dim
        check_encode_decode_lossy(x, codec)  # encoded_size with the config is the buffer's length
        zc = tn.zarr_codec(fmt, head_dim=head_dim)
        chunk = x[:8, :1]
        size = zc.compute_encoded_size(0, SimpleNamespace(shape=chunk.shape))
        assert size == codec.encode(chunk).size == tn.encoded_size(chunk.shape, fmt, head_dim=head_dim)
        path = tmp_path / f"{fmt}.zarr"
        a = zarr.create_array(
            store=path, shape=x.shape, chunks=chunk.shape, shards=(24, 3, 4, head_dim), dtype="float32",
            serializer=zc, compressors=None,
        )  # fmt: skip
        a[:] = x
        b = zarr.open_array(path, mode="r")
        assert_bits_equal(b[:], reference(x, fmt, head_dim=head_dim), f"{fmt} head_dim {head_dim}")


def test_zarr3_sharded(tmp_path):
    """The serializer also works inside a sharding codec (many chunks per file)."""
    zarr = _zarr()
    x = synthetic_kv()
    a = zarr.create_array(
        store=tmp_path / "s.zarr",
        shape=x.shape,
        chunks=(8, 1, 4, 128),
        shards=(48, 3, 4, 128),
        dtype="float32",
        serializer=tn.zarr_codec("tbq3_0"),
        compressors=None,
    )
    a[:] = x
    assert_bits_equal(zarr.open_array(tmp_path / "s.zarr", mode="r")[:], reference(x, "tbq3_0"))


def test_zarr3_validation(tmp_path):
    zarr = _zarr()
    with pytest.raises(tbq.BlockShapeError, match=r"chunks' last dimension.*block size 32.*\(4, 48\)"):
        zarr.create_array(
            store=tmp_path / "a.zarr", shape=(8, 96), chunks=(4, 48), dtype="float32", serializer=tn.zarr_codec("q8_0")
        )
    with pytest.raises(tbq.BlockShapeError, match=r"array's last dimension.*\(8, 100\)"):
        zarr.create_array(
            store=tmp_path / "b.zarr",
            shape=(8, 100),
            chunks=(4, 128),
            dtype="float32",
            serializer=tn.zarr_codec("q8_0"),
        )
    with pytest.raises(tbq.TbqTypeError, match="must be float32.*float64"):
        zarr.create_array(
            store=tmp_path / "c.zarr",
            shape=(8, 128),
            chunks=(4, 128),
            dtype="float64",
            serializer=tn.zarr_codec("tbq4_0"),
        )
    # a numcodecs object is not a Zarr 3 codec: Zarr rejects it as a v3 filter or compressor
    with pytest.raises(TypeError, match="ArrayArrayCodec"):
        zarr.create_array(
            store=tmp_path / "d.zarr", shape=(8, 128), chunks=(4, 128), dtype="float32", filters=[tn.Q8_0Numcodec()]
        )
    with pytest.raises(TypeError, match="BytesBytesCodec"):
        zarr.create_array(
            store=tmp_path / "e.zarr", shape=(8, 128), chunks=(4, 128), dtype="float32", compressors=[tn.Q8_0Numcodec()]
        )


def test_zarr3_empty_chunks(tmp_path):
    """All-zero chunks: Zarr skips them by default and reads back +0.0 where the codec gives -0.0."""
    zarr = _zarr()
    x = np.zeros((4, 128), np.float32)
    x[2:] = gaussian(2, 1, 128, seed=3).reshape(2, 128)
    for fmt in ("q4_0", "tbq4_0"):
        ref = reference(x, fmt)
        assert np.signbit(ref[:2]).any()  # dequantize(quantize(0)) has negative zeros in these formats
        a = zarr.create_array(
            store=tmp_path / f"{fmt}-skip.zarr",
            shape=x.shape,
            chunks=(2, 128),
            dtype="float32",
            serializer=tn.zarr_codec(fmt),
        )
        a[:] = x
        y = a[:]
        np.testing.assert_array_equal(y, ref)  # equal values ...
        assert not np.signbit(y[:2]).any()  # ... but +0.0: the chunk was never stored
        a = zarr.create_array(
            store=tmp_path / f"{fmt}-keep.zarr",
            shape=x.shape,
            chunks=(2, 128),
            dtype="float32",
            serializer=tn.zarr_codec(fmt),
            config={"write_empty_chunks": True},
        )
        a[:] = x
        assert_bits_equal(a[:], ref, fmt)


def test_zarr2_filter(tmp_path):
    """Zarr format 2 takes numcodecs codecs directly; the tbq codec works as a filter."""
    zarr = _zarr()
    x0 = synthetic_kv(tokens=16)
    for fmt in FORMATS:
        x, chunks = whole_block_kv(x0, (8, 1, 4, 128), fmt)
        a = zarr.create_array(
            store=tmp_path / f"{fmt}.zarr",
            shape=x.shape,
            chunks=chunks,
            dtype="float32",
            filters=[tn.get_numcodec(fmt)],
            compressors=None,
            zarr_format=2,
        )
        a[:] = x
        meta = json.loads((tmp_path / f"{fmt}.zarr" / ".zarray").read_text())
        assert meta["filters"][0]["id"] == IDS[fmt]
        assert_bits_equal(zarr.open_array(tmp_path / f"{fmt}.zarr", mode="r")[:], reference(x, fmt), fmt)


def test_zarr3_reopen_in_new_process(tmp_path):
    """Write a synthetic KV cache with each format; a fresh interpreter reads it back bit-exactly."""
    zarr = _zarr()
    x0 = synthetic_kv(tokens=64, layers=4, heads=2, seed=7)
    xs = {}
    for fmt in FORMATS:
        x, chunks = xs[fmt] = whole_block_kv(x0, (32, 2, 2, 128), fmt)
        a = zarr.create_array(
            store=tmp_path / f"{fmt}.zarr",
            shape=x.shape,
            chunks=chunks,
            dtype="float32",
            serializer=tn.zarr_codec(fmt, **({"codebook": "turboq-mtp", "signs": 3} if fmt == "tbq3_0" else {})),
            compressors=[zarr.codecs.ZstdCodec(level=1)],
            attributes={"tbq_format": fmt},
        )
        a[:] = x
    child = textwrap.dedent(
        """
        import sys, numpy as np, zarr
        # no tbq import: the package's entry points (numcodecs.codecs, zarr.codecs) find the codecs
        root, fmts = sys.argv[1], sys.argv[2].split(",")
        for fmt in fmts:
            a = zarr.open_array(f"{root}/{fmt}.zarr", mode="r")
            assert a.attrs["tbq_format"] == fmt
            np.save(f"{root}/{fmt}.npy", a[:])
        assert "tbq.numcodecs" in sys.modules  # loaded through the entry point
        print("ok")
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", child, str(tmp_path), ",".join(FORMATS)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    for fmt in FORMATS:
        cfg = {"codebook": "turboq-mtp", "signs": 3} if fmt == "tbq3_0" else {}
        x = xs[fmt][0]
        y = np.load(tmp_path / f"{fmt}.npy")
        assert y.dtype == np.float32
        assert_bits_equal(y, reference(x, fmt, **cfg), f"{fmt} read back in a new process")
        assert y.tobytes() == reference(x, fmt, **cfg).tobytes()


def test_scale_out_doc_lists_every_registered_codec():
    """docs/scale-out.md's codec table has one row per registered format, with the format's bits per value."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "scale-out.md").read_text()
    rows = re.findall(
        r"^\| `(tbq\.[a-z0-9_]+)` \| `tbq\.numcodecs\.([A-Z0-9_]+)Numcodec` \| .*? \| ([0-9.]+) \|$", doc, flags=re.M
    )
    assert [r[0] for r in rows] == list(tn.CODEC_IDS.values())
    for cid, cls, bits in rows:
        fmt = cid[4:]
        assert cls == fmt.upper() and float(bits) == tbq.format_info(fmt).bits_per_value


def test_codec_ids_follow_the_naming_rule():
    """docs/formats.md's rule: any case on input, the lowercase id written."""
    c = tn.get_numcodec("TBQ.Q8_0")
    assert c.codec_id == "tbq.q8_0" and c.get_config()["id"] == "tbq.q8_0"
    assert tn.Q8_0Numcodec.from_config({"id": "TBQ.Q8_0"}) == tn.Q8_0Numcodec()
    with pytest.raises(tbq.ConfigError):
        tn.Q8_0Numcodec.from_config({"id": "tbq.q4_0"})


def test_the_numcodecs_classes_have_names_of_their_own_and_the_old_ones_still_work():
    """``tbq.numcodecs.Q8_0Numcodec`` is not the format class ``tbq.formats.q8_0.Q8_0`` nor the core codec
    ``tbq.codecs.Q8_0Codec``; the old spellings give the same classes with a DeprecationWarning naming the new."""
    import tbq.codecs
    from tbq.formats.q8_0 import Q8_0

    names = {Q8_0.__name__, tbq.codecs.Q8_0Codec.__name__, tn.Q8_0Numcodec.__name__}
    assert names == {"Q8_0", "Q8_0Codec", "Q8_0Numcodec"}
    for fmt in FORMATS:
        cls = getattr(tn, f"{fmt.upper()}Numcodec")
        assert cls.fmt == fmt and cls.__qualname__ == cls.__name__
        with pytest.warns(DeprecationWarning, match=rf"use tbq\.numcodecs\.{fmt.upper()}Numcodec"):
            assert getattr(tn, fmt.upper()) is cls
    for old in ("Q8_0", "Q4_0", "TBQ4_0", "TBQ3_0"):
        with pytest.warns(DeprecationWarning, match=rf"use tbq\.codecs\.{old}Codec"):
            assert getattr(tbq.codecs, old) is getattr(tbq.codecs, f"{old}Codec")
    with pytest.raises(AttributeError):
        tn.NO_SUCH_FORMAT  # noqa: B018
    assert pickle.loads(pickle.dumps(tn.Q8_0Numcodec(backend="numpy"))) == tn.Q8_0Numcodec(backend="numpy")
