"""Shared test helpers: conformance data loading and exact comparisons."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data" / "conformance"

#: (conformance file stem, format, TBQ codebook or None)
CONFORMANCE_CASES = [
    ("q8_0__strict", "q8_0", None),
    ("q4_0__strict", "q4_0", None),
    ("tbq4_fork__strict", "tbq4_0", "turboq-mtp"),
    ("tbq4_fitted__strict", "tbq4_0", "lloyd-max"),
    ("tbq3_fixed_fork__strict", "tbq3_0", "turboq-mtp"),
    ("tbq3_fixed_fitted__strict", "tbq3_0", "lloyd-max"),
]

BACKENDS = ("numpy", "numba")


@cache
def load_npz(stem: str) -> dict:
    with np.load(DATA / f"{stem}.npz") as z:
        return {k: z[k] for k in z.files}


@cache
def tables() -> dict:
    return json.loads((DATA / "tables.json").read_text())


def table_f32(entry: dict) -> np.ndarray:
    return np.array([int(b, 16) for b in entry["float32_bits"]], dtype=np.uint32).view(np.float32)


def codec_config(codebook):
    return {} if codebook is None else {"codebook": codebook}


def assert_bits_equal(a: np.ndarray, b: np.ndarray, what: str = "") -> None:
    """Exact float32 equality by bit pattern (distinguishes -0.0, compares NaN payloads)."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    a, b = np.atleast_1d(a), np.atleast_1d(b)  # np.argwhere of a 0-d array finds nothing, even when it differs
    ua, ub = a.view(np.uint32), b.view(np.uint32)
    bad = np.argwhere(ua != ub)
    assert bad.size == 0, (
        f"{what}: {len(bad)} float32 values differ; first at {tuple(bad[0])}: {a[tuple(bad[0])]!r} != {b[tuple(bad[0])]!r}"
    )


def assert_bytes_equal(a: np.ndarray, b: np.ndarray, what: str = "") -> None:
    assert a.dtype == np.uint8 and b.dtype == np.uint8, (a.dtype, b.dtype)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    a, b = np.atleast_1d(a), np.atleast_1d(b)
    bad = np.argwhere(a != b)
    assert bad.size == 0, (
        f"{what}: {len(bad)} bytes differ; first at {tuple(bad[0])}: {a[tuple(bad[0])]:#04x} != {b[tuple(bad[0])]:#04x}"
    )


# ---------------------------------------------------------------------------
# The shared format battery (the numcodecs tests/common.py pattern)
# ---------------------------------------------------------------------------


#: Folders of tests/data/conformance that hold other vectors than a format family's strict encode files.
_NOT_FAMILY_FOLDERS = ("decode_random", "special")


def conformance_cases(fmt: str) -> list[tuple[str, dict]]:
    """(vector file stem, format options) of every strict conformance file for ``fmt``: ``<fmt>__strict.npz`` in
    tests/data/conformance or in a family's folder of it (``turbo/turbo3__strict.npz``)."""
    cases = [(stem, codec_config(cb)) for stem, f, cb in CONFORMANCE_CASES if f == fmt]
    if not cases:
        found = [DATA / f"{fmt}__strict.npz", *sorted(DATA.glob(f"*/{fmt}__strict.npz"))]
        cases = [
            (p.relative_to(DATA).with_suffix("").as_posix(), {})
            for p in found
            if p.exists() and p.parent.name not in _NOT_FAMILY_FOLDERS
        ]
    return cases


def battery_inputs(fmt: str, n_rows: int = 3, seed: int = 0, **options) -> dict:
    """Named float32 inputs (rows of whole blocks of ``fmt`` with its format ``options``) that every format must
    encode."""
    import tbq

    bs = tbq.get_format(fmt, **options).info.block_size  # the instance's: an option may set it (vLLM's head_dim)
    n = max(bs, 128 // bs * bs)
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n_rows, n), dtype=np.float32)
    tie = (rng.integers(-8, 8, (n_rows, n)) + 0.5).astype(np.float32)
    return {
        "gaussian": g,
        "tiny": g * np.float32(1e-6),
        "subnormal": g * np.float32(1e-40),
        "large": g * np.float32(1e3),
        "zeros": np.zeros((n_rows, n), np.float32),
        "neg_zeros": np.full((n_rows, n), -0.0, np.float32),
        "constant": np.full((n_rows, n), 0.75, np.float32),
        "half_integers": tie,
        "one_hot": np.where(np.arange(n) == 5, np.float32(3.0), np.float32(0.0))
        .astype(np.float32)[None, :]
        .repeat(n_rows, 0),
    }


def _check_round_trip_and_shapes(fmt, opts):
    import tbq

    info = tbq.get_format(fmt, **opts).info  # the instance's sizes, not the registry's row
    bs, ts = info.block_size, info.type_size
    codec = tbq.get_codec(fmt, backend="numpy", **opts)
    for shape in [(bs,), (3, 2 * bs), (2, 0, bs), (0, bs), (2, 3, bs)]:
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        q = codec.encode(x)
        assert q.dtype == np.uint8 and q.shape == shape[:-1] + (shape[-1] // bs * ts,), (fmt, shape, q.shape)
        y = codec.decode(q)
        assert y.dtype == np.float32 and y.shape == shape, (fmt, shape, y.shape)
    x = np.random.default_rng(2).standard_normal((4, 2 * bs)).astype(np.float32)
    q = codec.encode(x)
    # other float widths are converted to float32 first
    assert np.array_equal(codec.encode(x.astype(np.float64)), q)
    assert np.array_equal(codec.encode(x.astype(">f4")), q)
    # bytes-like input decodes like the uint8 array
    assert_bits_equal(codec.decode(q[0].tobytes()), codec.decode(q[0]), f"{fmt} bytes input")
    # out= receives the same result
    out = np.empty_like(q)
    assert codec.encode(x, out=out) is out and np.array_equal(out, q)
    yout = np.empty(x.shape, np.float32)
    assert codec.decode(q, out=yout) is yout
    assert_bits_equal(yout, codec.decode(q), f"{fmt} out=")
    # finite input whose scales fit decodes to finite values
    y = codec.decode(q)
    assert np.isfinite(y).all()
    # ... close to the input, in the domain the decoder returns (turbo2/3/4: R(x) per block), not merely any
    # finite numbers: every format's relative squared error on Gaussian data is below 1/2 (the largest, 0.41, is
    # tbq3_0 with the fork's turboq-mtp tables, levels 7-9x too wide; turbo2's is 0.12), and a decoded value
    # compared in the wrong domain gives about 2
    ref = codec.format.domain.to_decode_domain(x).astype(np.float64)
    assert ((y - ref) ** 2).sum() < 0.5 * (ref**2).sum(), f"{fmt}: decode(encode(x)) is far from x"
    assert np.allclose(codec.format.domain.from_decode_domain(ref), x, atol=1e-5)


def _check_backends_agree(fmt, opts):
    import tbq

    info = tbq.get_format(fmt, **opts).info  # the instance's sizes, not the registry's row
    ref = tbq.get_codec(fmt, backend="numpy", on_overflow="inf", **opts)
    for threads in (1, 2):
        fast = tbq.get_codec(fmt, backend="numba", threads=threads, on_overflow="inf", **opts)
        for name, x in battery_inputs(fmt, **opts).items():
            qa, qb = ref.encode(x), fast.encode(x)
            assert_bytes_equal(qb, qa, f"{fmt} {name} numba(threads={threads}) vs numpy encode")
            assert_bits_equal(fast.decode(qa), ref.decode(qa), f"{fmt} {name} numba vs numpy decode")
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, (64, 4 * info.type_size), dtype=np.uint8)  # any bytes decode: Inf/NaN/subnormal scales
    ya, yb = ref.decode(raw), tbq.get_codec(fmt, backend="numba", **opts).decode(raw)
    nan = np.isnan(ya)
    assert np.array_equal(nan, np.isnan(yb)), f"{fmt}: NaN positions differ on random bytes"
    assert np.array_equal(ya.view(np.uint32)[~nan], yb.view(np.uint32)[~nan]), (
        f"{fmt}: numba vs numpy decode of random bytes"
    )


def _check_conformance(fmt, opts):
    import tbq

    cases = conformance_cases(fmt)
    x = load_npz("inputs")["x"]
    for stem, case_opts in cases:
        if opts and case_opts and case_opts != opts:
            continue
        ref = load_npz(stem)
        # a format whose block is longer than an input row (q8_k: 256 values) reads consecutive rows as one
        # row of its vector file: y has the file's row length
        xr = x.reshape(-1, ref["y"].shape[-1])
        for backend in BACKENDS:
            q = tbq.quantize(xr, fmt, backend=backend, **case_opts)
            assert_bytes_equal(q, ref["q"], f"{stem} {backend} encode")
            y = tbq.dequantize(ref["q"], fmt, backend=backend, **case_opts)
            assert_bits_equal(y, ref["y"], f"{stem} {backend} decode")
    return len(cases)


def _check_bad_input(fmt, opts):
    import pytest

    import tbq

    info = tbq.get_format(fmt, **opts).info  # the instance's sizes, not the registry's row
    bs, ts = info.block_size, info.type_size
    for backend in BACKENDS:
        codec = tbq.get_codec(fmt, backend=backend, **opts)
        good = np.ones((2, 2 * bs), np.float32)
        if bs > 1:
            with pytest.raises(tbq.BlockShapeError, match=str(bs)):
                codec.encode(np.ones(bs + 1, np.float32))
        with pytest.raises(tbq.BlockShapeError):
            codec.encode(np.float32(1.0))
        for bad_dtype in (np.int32, np.bool_, np.complex64):
            with pytest.raises(tbq.TbqTypeError):
                codec.encode(good.astype(bad_dtype))
        for bad in (np.nan, np.inf, -np.inf):
            x = good.copy()
            x[1, 2 * bs - 1] = bad  # row 1, second block: flat block 3 (any block size)
            with pytest.raises(tbq.NonFiniteError, match="block 3") as e:
                codec.encode(x)
            assert e.value.block == 3
            assert isinstance(e.value, ValueError) and isinstance(e.value, tbq.TbqError)
        with pytest.raises(tbq.TbqTypeError):
            codec.decode(np.zeros(ts, np.int8))
        if ts > 1:  # (a one-byte format decodes every length)
            with pytest.raises(tbq.EncodedLengthError, match=str(ts)):
                codec.decode(np.zeros(ts + 1, np.uint8))
        with pytest.raises(tbq.TbqValueError):
            codec.encode(good, out=np.empty((2, 3), np.uint8))
        with pytest.raises(tbq.TbqTypeError):
            codec.encode(good, out=np.empty((2, 2 * ts), np.int8))
        # a scale that does not fit the format raises (and says which block), unless on_overflow="inf"
        huge = np.full((1, bs), 3e38, np.float32)
        huge[0, 0] = 1.0
        _, trace = codec.format.reference_encode(huge)
        if codec.format.scale_overflows(trace).any():
            with pytest.raises(tbq.ScaleOverflowError, match="block 0"):
                codec.encode(huge)
            tbq.get_codec(fmt, backend=backend, on_overflow="inf", **opts).encode(huge)
    with pytest.raises(tbq.ConfigError):
        tbq.get_codec(fmt, no_such_option=1)
    with pytest.raises(tbq.ConfigError):
        tbq.get_codec(fmt, backend="fortran")


def _check_config(fmt, opts):
    import json

    import tbq

    for backend in BACKENDS:
        codec = tbq.get_codec(fmt, backend=backend, threads=2, on_overflow="inf", **opts)
        cfg = codec.get_config()
        assert cfg["name"] == fmt
        assert json.loads(json.dumps(cfg)) == cfg, "config must be plain JSON data"
        again = tbq.codec_from_config(cfg)
        assert again == codec and hash(again) == hash(codec)
        assert again.get_config() == cfg
        assert repr(again) == repr(codec) and fmt.upper() in repr(codec)
        assert codec != tbq.get_codec(fmt, backend=backend, threads=1, on_overflow="inf", **opts)
        assert codec.format == tbq.get_format(fmt, **opts)


def _check_trace(fmt, opts):
    from naive import decode_block, encode_block, has_model

    import tbq

    f = tbq.get_format(fmt, **opts)
    info = f.info
    for name, x in battery_inputs(fmt, **opts).items():
        q, trace = f.encode(x, trace=True)
        # (on_overflow="inf": the battery's subnormal input is refused by MXFP4 by default; the bytes are the point here)
        assert_bytes_equal(
            q,
            tbq.quantize(x, fmt, backend="numpy", on_overflow="inf", **opts),
            f"{fmt} {name}: Format.encode vs quantize",
        )
        nb = x.shape[-1] // info.block_size
        for key, a in trace.items():
            assert a.dtype == np.float32 and a.shape[:2] == (x.shape[0], nb), (fmt, name, key, a.dtype, a.shape)
        fields = f.fields(q)
        f16_scale = any(fl.name == "d" and fl.kind == "f16" for fl in info.layout)
        assert ("d" in fields) == f16_scale or not f16_scale, (fmt, sorted(fields))
        for key, a in fields.items():  # one row of fields per block
            assert a.shape[:2] == (x.shape[0], nb), (fmt, name, key, a.shape)
        if f16_scale:
            # the stored scale is the traced float32 d rounded to fp16 (bit for bit, signed zeros included)
            d16 = np.asarray(trace["d"], np.float32).astype(np.float16).astype(np.float32)
            assert_bits_equal(fields["d"], d16, f"{fmt} {name}: fields d vs fp16(trace d)")
        assert_bits_equal(f.decode(q), tbq.dequantize(q, fmt, backend="numpy", **opts), f"{fmt} {name}: Format.decode")
        if has_model(f):  # the slow model agrees on the first two blocks of each input (row_rule: one row)
            xb = np.ascontiguousarray(x.reshape(-1, info.block_size)[:2])
            for i, row in enumerate(xb):
                b, tr = encode_block(
                    f, x[0][: (i + 1) * info.block_size] if f.row_rule else row
                )  # a row model sees the row so far
                if f.row_rule:  # the model returns the whole prefix; compare its last block
                    b = b[-info.type_size :]
                    tr = {k: np.asarray(v)[-1] for k, v in tr.items()}
                assert bytes(q.reshape(-1, info.type_size)[i]) == b, f"{fmt} {name} block {i}: bytes vs tests/naive.py"
                for key, v in tr.items():
                    got = trace[key].reshape((-1,) + trace[key].shape[2:])[i]
                    assert_bits_equal(
                        got, np.asarray(v, np.float32), f"{fmt} {name} block {i}: trace {key} vs tests/naive.py"
                    )
                y = decode_block(f, b)
                assert_bits_equal(
                    f.decode(np.frombuffer(b, np.uint8)),
                    np.array(y, np.float32),
                    f"{fmt} {name} block {i}: decode vs tests/naive.py",
                )


def check_format(fmt: str, **options) -> None:
    """Every check one format must pass, with its format ``options``; each format's test module calls this.

    Round trip and shapes; numpy == numba on bytes and float32 bits (threads 1
    and 2, finite inputs and random bytes); the conformance vectors whenever a
    file for the format exists in tests/data/conformance; every bad-input kind;
    config round trip; trace consistency (the traced bytes are the encoder's,
    the stored scale is fp16 of the traced ``d``, fields match the layout, and
    the slow model of tests/naive.py agrees where it has one).
    """
    _check_round_trip_and_shapes(fmt, options)
    _check_backends_agree(fmt, options)
    _check_conformance(fmt, options)
    _check_bad_input(fmt, options)
    _check_config(fmt, options)
    _check_trace(fmt, options)


def unless_sigill(fn, *args, **kwargs):
    """``fn(...)``, skipping the test where a llama.cpp build in ../shared cannot run on this CPU (SIGILL: built for
    AVX-512 CPUs); any other crash is raised."""
    import pytest

    from tbq.hf.gguf_export import LlamaCppCrashed

    try:
        return fn(*args, **kwargs)
    except LlamaCppCrashed as exc:
        if exc.signal != 4:
            raise
        pytest.skip(f"{exc.program} cannot run on this CPU (SIGILL: built for AVX-512 CPUs)")
