"""The public hypothesis strategies (tbq.testing.strategies) produce what they promise."""

from __future__ import annotations

import doctest
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument, NonInteractiveExampleWarning

import tbq
from tbq.formats import format_class
from tbq.half import f16_table
from tbq.rotation import RandomizedHadamard
from tbq.testing import strategies as tst

F32 = np.float32
FORMATS = tbq.formats()
Q_FORMATS = ("q8_0", "q4_0")


def test_import_is_cheap_and_hypothesis_stays_optional():
    """Neither ``import tbq`` nor ``import tbq.testing`` imports hypothesis; the strategies module does."""
    code = (
        "import sys, tbq, tbq.testing\n"
        "assert 'hypothesis' not in sys.modules, 'hypothesis imported too early'\n"
        "from tbq.testing import strategies as tst\n"
        "assert 'hypothesis' in sys.modules and tbq.testing.strategies is tst\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_docstring_examples_run():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        result = doctest.testmod(tst, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 8 and result.failed == 0
    for name in tst.__all__:
        obj = getattr(tst, name)
        if callable(obj):
            assert obj.__doc__ and ">>>" in obj.__doc__, f"{name} needs a docstring with an example"


# ---------------------------------------------------------------------------
# float_blocks
# ---------------------------------------------------------------------------


def scale_of(fmt, x2, codebook=None):
    c = tbq.get_codec(fmt, backend="numpy", on_overflow="inf", **({} if codebook is None else {"codebook": codebook}))
    b = c.encode(x2).reshape(-1, c.type_size)
    bits = b[:, 0].astype(np.uint16) | (b[:, 1].astype(np.uint16) << 8)
    with np.errstate(all="ignore"):
        d = np.array([c.format.reference_encode(row[None, :])[1]["d"][0] for row in x2.reshape(-1, c.block_size)], F32)
    return d, f16_table()[bits]


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_float_blocks_shape_dtype_and_fit(fmt, data):
    lo = data.draw(st.integers(0, 3), label="min_blocks")
    hi = data.draw(st.integers(lo, 5), label="max_blocks")
    lead = data.draw(st.sampled_from([(), (2,), (1, 3)]), label="leading_shape")
    x = data.draw(tst.float_blocks(fmt, min_blocks=lo, max_blocks=hi, leading_shape=lead), label="x")
    bs = tbq.format_info(fmt).block_size
    assert x.dtype == np.float32 and x.flags.c_contiguous
    assert x.shape[:-1] == lead and x.shape[-1] % bs == 0 and lo <= x.shape[-1] // bs <= hi
    assert np.isfinite(x).all()
    tbq.get_codec(fmt, backend="numpy").encode(x)  # every default family fits fp16: no exception


def _trace(fmt, blk):
    f = tbq.get_format(fmt)
    with np.errstate(all="ignore"):
        return f.encode(blk, trace=True)[1] if np.isfinite(blk).all() else {}


def _near_half(v):
    """True where v is exactly k + 1/2 or within one float32 ulp of it (|v| >= 1/2)."""
    v = np.asarray(v, F32)
    frac = v - np.floor(v)
    return (np.abs(frac - F32(0.5)) <= np.spacing(np.abs(v))) & (np.abs(v) >= 0.5)


def _ties_promise(fmt, blk):
    """Half-integer products x*(1/d), an exact fp16 tie in the scale, or +a and -a at the largest magnitude."""
    a = np.abs(blk)
    amax = a.max()
    if np.any(blk == amax) and np.any(blk == -amax) and amax > 0:
        return True
    tr = _trace(fmt, blk)
    d = F32(tr["d"].reshape(-1)[0])
    h = np.float16(d)
    lo_, hi_ = sorted([float(h), float(np.nextafter(h, np.float16(np.inf) if float(h) <= d else np.float16(-np.inf)))])
    if float(d) == (lo_ + hi_) / 2:
        return True
    return bool(_near_half(tr["v"].reshape(-1)).any())


def _min_ties_promise(fmt, blk):
    """(x - min) * (1/d) exactly k + 1/2 (or one ulp of x from it) somewhere, or the min an fp16 midpoint."""
    tr = _trace(fmt, blk)
    v = tr["v"].reshape(-1)
    d = float(tr["d"].reshape(-1)[0])
    tol = float(np.spacing(F32(np.abs(blk).max()))) / d if d else 0.0  # one ulp of x, in units of d
    if (np.abs(v - np.floor(v) - 0.5) <= tol).any():
        return True
    m = F32(tr["m"].reshape(-1)[0])
    h = np.float16(m)
    return float(np.float16(np.nextafter(m, F32(np.inf)))) != float(np.float16(np.nextafter(m, F32(-np.inf)))) or float(h) != float(m)


def _grid_ties_promise(fmt, blk):
    """a = x / d0 on (or one ulp from) a midpoint of the value table, or a block at the tiny-block threshold."""
    if np.abs(blk).max() <= 2e-15:
        return True
    tr = _trace(fmt, blk)
    table = np.asarray(format_class(fmt).hazards["grid_ties"]["table"], np.float64)
    mids = ((table[1:] + table[:-1]) / 2).astype(F32)
    near = np.concatenate([mids, np.nextafter(mids, F32(np.inf)), np.nextafter(mids, F32(-np.inf))])
    return bool(np.isin(tr["a"].reshape(-1), near).any())


def _ue4m3_promise(fmt, blk):
    """Sub-block 0's s = amax/6 is a UE4M3 half-up tie (or one ulp from one), subnormal-range, or saturating."""
    s = F32(_trace(fmt, blk)["s"].reshape(-1, 4)[0, 0])
    if s < 2.0**-6 or s >= 240:
        return True
    m, e = np.frexp(np.float64(s))  # s = m * 2**e, m in [0.5, 1): 4 bits of mantissa plus the tie bit
    scaled = m * 2**5  # the tie sits at an odd multiple of 2**-5 of the binade
    return bool(abs(scaled - np.round(scaled)) * 2.0**-5 * 2.0**e <= 2 * np.spacing(s) or np.round(scaled) % 2 == 1)


def _binade_top_promise(fmt, blk):
    """The largest magnitude is one of the top 46 float32 values below a power of two."""
    amax = F32(np.abs(blk).max())
    top = F32(2.0 ** np.ceil(np.log2(np.float64(amax))))
    if top == amax:
        top = F32(top * 2)
    steps = int(top.view(np.uint32)) - int(amax.view(np.uint32))
    return 1 <= steps <= 46


def _threshold_promise(c, blk):
    r = c.format.encode(blk, trace=True)[1]["r"][0]  # the encoder's own rotated coordinates
    thr = c.format.thresholds if hasattr(c.format, "thresholds") else c.codebook.thresholds
    up = np.nextafter(thr, np.inf, dtype=F32)
    down = np.nextafter(thr, -np.inf, dtype=F32)
    return bool(np.isin(r, np.concatenate((thr, up, down))).any())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", list(tst.FAMILIES))
@given(data=st.data())
def test_each_family_keeps_its_promise(fmt, family, data):
    own = format_class(fmt).hazards
    if family in tst.HAZARD_FAMILIES and family not in own:
        with pytest.raises(InvalidArgument, match="only applies to"):
            tst.float_blocks(fmt, families=[family])
        return
    x = data.draw(tst.float_blocks(fmt, families=[family], min_blocks=1, max_blocks=1, leading_shape=()), label="x")
    bs = tbq.format_info(fmt).block_size
    assert x.shape == (bs,) and x.dtype == np.float32
    c = tbq.get_codec(fmt, backend="numba")
    f16_scale = any(f.name == "d" and f.kind == "f16" and f.offset == 0 for f in c.info.layout)
    if family == "nonfinite":
        assert not np.isfinite(x).all()
        with pytest.raises(tbq.NonFiniteError):
            c.encode(x)
        return
    assert np.isfinite(x).all()
    if family == "overflow":
        if f16_scale or fmt == "f16":  # a scale (or an f16 value) that does not fit fp16
            with pytest.raises(tbq.TbqValueError) as e:
                c.encode(x)
            assert not isinstance(e.value, tbq.NonFiniteError)
        tbq.get_codec(fmt, backend="numba", on_overflow="inf").encode(x)
        return
    c.encode(x)
    if family == "zero":
        assert not np.any(x)
    elif family == "constant":
        assert np.all(x == x[0])
    elif family == "outliers":
        assert np.max(np.abs(x)) >= 5 * np.median(np.abs(x)) or bs == 1
    elif family == "subnormal":
        sub = (x != 0) & (np.abs(x) < np.finfo(F32).tiny)
        d = _trace(fmt, x).get("d")  # the scale the family sized (largest magnitude without one)
        small = abs(float(d.reshape(-1)[0])) if d is not None and d.size == 1 else float(np.abs(x).max())
        assert sub.any() or small <= 2.0**-14
    elif family == "huge":
        if f16_scale:
            d, d16 = scale_of(fmt, x[None, :])
            assert 2.0**14 <= abs(float(d[0])) and np.isfinite(d16[0])
        else:
            assert 2.0**14 <= np.abs(x).max()
    elif family == "ties":
        assert _ties_promise(fmt, x)
    elif family == "thresholds":
        assert _threshold_promise(c, x)
    elif family == "min_ties":
        assert _min_ties_promise(fmt, x)
    elif family == "grid_ties":
        assert _grid_ties_promise(fmt, x)
    elif family == "ue4m3":
        assert _ue4m3_promise(fmt, x)
    elif family == "binade_tops":
        assert _binade_top_promise(fmt, x)
    elif family == "sparse":
        if np.count_nonzero(x) > 4:  # a TBQ block that rotates to an exact one-hot
            r = c.format.encode(x, trace=True)[1]["r"][0]
            assert np.count_nonzero(r) == 1


@pytest.mark.parametrize("fmt", ["tbq4_0", "tbq3_0"])
@given(data=st.data())
def test_thresholds_follow_the_codec_configuration(fmt, data):
    """With a codec (or codebook=/signs=), the thresholds family aims at that codebook and rotation."""
    c = tbq.get_codec(fmt, codebook="turboq-mtp", signs=data.draw(st.integers(0, 2**16), label="seed"))
    x = data.draw(tst.float_blocks(c, families=["thresholds"], min_blocks=1, max_blocks=1, leading_shape=()), label="x")
    assert _threshold_promise(c, x)


@given(tst.float_blocks("q4_0", elements=st.floats(-2, 2, width=32), leading_shape=(2,)))
def test_elements_replace_the_families(x):
    assert x.shape[0] == 2 and x.shape[1] % 32 == 0 and np.all(np.abs(x) <= 2)


# ---------------------------------------------------------------------------
# encoded_blocks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_valid_encoded_blocks_come_from_the_encoder(fmt, data):
    b = data.draw(tst.encoded_blocks(fmt, valid=True), label="b")
    info = tbq.format_info(fmt)
    assert b.dtype == np.uint8 and b.shape[-1] % info.type_size == 0
    b2 = b.reshape(-1, info.type_size)
    # the encoder's output decodes to finite values (the strategy builds it with on_overflow="inf"
    # from finite families whose scales fit)
    assert np.isfinite(tbq.dequantize(b, fmt, backend="numpy")).all()
    if not any(f.name == "d" and f.kind == "f16" and f.offset == 0 for f in info.layout):
        return
    bits = b2[:, 0].astype(np.uint16) | (b2[:, 1].astype(np.uint16) << 8)
    d = f16_table()[bits]
    assert np.isfinite(d).all()
    if fmt in ("q8_0", "tbq4_0", "tbq3_0"):  # amax/127 and norm/recon are never negative
        assert not np.signbit(d).any() or not np.any(d)
    if fmt == "q8_0":
        assert not np.any(b2[:, 2:].view(np.int8) == -128)  # roundf(x / d) stays in [-127, 127]


@pytest.mark.parametrize("fmt", FORMATS)
def test_arbitrary_encoded_blocks_cover_every_special_scale(fmt):
    seen = set()
    ts = tbq.format_info(fmt).type_size

    @settings(max_examples=400, database=None, suppress_health_check=list(HealthCheck))
    @given(tst.encoded_blocks(fmt, valid=False))
    def collect(b):
        assert b.dtype == np.uint8 and b.shape[-1] % ts == 0
        b2 = b.reshape(-1, ts)
        for bits in (b2[:, 0].astype(int) | (b2[:, 1].astype(int) << 8)).tolist():
            for name, (lo, hi) in tst.SPECIAL_SCALES.items():
                if lo <= bits <= hi:
                    seen.add(name)

    collect()
    for wanted in ("+inf", "-inf", "nan", "subnormal", "-0", "+0"):
        assert wanted in seen, (wanted, sorted(seen))


# ---------------------------------------------------------------------------
# codebooks, sign_vectors, indices
# ---------------------------------------------------------------------------


@given(data=st.data())
def test_codebooks_are_valid_and_usable(data):
    bits = data.draw(st.integers(1, 8), label="bits")
    sym = data.draw(st.sampled_from([None, True, False]), label="symmetric")
    cb = data.draw(tst.codebooks(bits, symmetric=sym), label="codebook")
    assert isinstance(cb, tbq.Codebook) and cb.bits == bits
    c, m = cb.centroids, cb.thresholds
    assert np.all(np.diff(c) > 0) and np.all(np.diff(m) > 0)
    assert np.all(m >= c[:-1]) and np.all(m <= c[1:])
    if sym and cb.name is None:
        assert np.array_equal(c, -c[::-1]) and np.array_equal(m, -m[::-1])
    if bits in (3, 4):
        tbq.get_codec("tbq4_0" if bits == 4 else "tbq3_0", codebook=cb, backend="numpy")


@given(data=st.data())
def test_sign_vectors(data):
    n = 1 << data.draw(st.integers(0, 9), label="log2 n")
    s1, s2 = data.draw(tst.sign_vectors(n), label="pair")
    for s in (s1, s2):
        assert s.dtype == np.int8 and s.shape == (n,) and np.all(np.abs(s) == 1)
    RandomizedHadamard(s1, s2)
    one = data.draw(tst.sign_vectors(n, pair=False), label="one")
    assert isinstance(one, np.ndarray) and one.shape == (n,)


@given(data=st.data())
def test_indices(data):
    bits = data.draw(st.integers(1, 8), label="bits")
    n = data.draw(st.integers(0, 300), label="n")
    lead = data.draw(st.sampled_from([(), (3,), (2, 2)]), label="leading")
    idx = data.draw(tst.indices(bits, n, leading_shape=lead), label="idx")
    assert idx.dtype == np.uint8 and idx.shape == lead + (n,)
    assert idx.size == 0 or int(idx.max()) < (1 << bits)


# ---------------------------------------------------------------------------
# Bad arguments: InvalidArgument, eagerly, with a message that says the fix
# ---------------------------------------------------------------------------

BAD_ARGUMENTS = [
    (lambda: tst.float_blocks("q9_0"), "Pass one of 'q8_0'"),
    (lambda: tst.float_blocks(8), "Pass one of"),
    (lambda: tst.float_blocks("q8_0", max_blocks=0, min_blocks=1), "pass max_blocks >= min_blocks"),
    (lambda: tst.float_blocks("q8_0", max_blocks=-1), "max_blocks must be >= 0"),
    (lambda: tst.float_blocks("q8_0", max_blocks=2.5), "max_blocks must be an integer"),
    (lambda: tst.float_blocks("q8_0", families=["gaussian", "bogus"]), "choose from"),
    (lambda: tst.float_blocks("q8_0", families="gaussian"), "families=['gaussian']"),
    (lambda: tst.float_blocks("q8_0", families=[]), "pass at least one"),
    (lambda: tst.float_blocks("q8_0", families=["thresholds"]), "use 'ties'"),
    (lambda: tst.float_blocks("tbq4_0", families=["ties"]), "use 'thresholds'"),
    (lambda: tst.float_blocks("q8_0", elements=[1.0]), "st.floats(-1, 1, width=32)"),
    (lambda: tst.float_blocks("q8_0", elements=st.floats(), families=["zero"]), "not both"),
    (lambda: tst.float_blocks("q8_0", leading_shape=[2]), "tuple of non-negative ints"),
    (lambda: tst.float_blocks("q8_0", codebook="lloyd-max"), "drop them"),
    (lambda: tst.float_blocks("tbq4_0", codebook="nope"), "bad TBQ configuration"),
    (lambda: tst.float_blocks(tbq.get_codec("tbq4_0"), signs=3), "a Codec already carries"),
    (lambda: tst.encoded_blocks("q8_0", valid="yes"), "valid must be True"),
    (lambda: tst.encoded_blocks("q8_0", valid=False, special_scales=None), "special_scales must be"),
    (lambda: tst.encoded_blocks("q9_0"), "Pass one of"),
    (lambda: tst.encoded_blocks("q8_0", min_blocks=3, max_blocks=2), "pass max_blocks >= min_blocks"),
    (lambda: tst.codebooks(0), "TBQ4_0 uses bits=4"),
    (lambda: tst.codebooks(9), "between 1 and 8"),
    (lambda: tst.codebooks(3, symmetric="yes"), "symmetric must be None, True or False"),
    (lambda: tst.codebooks(3, scale=-1.0), "positive finite float"),
    (lambda: tst.sign_vectors(100), "power of two"),
    (lambda: tst.sign_vectors(0), "TBQ blocks use n=128"),
    (lambda: tst.sign_vectors(128, pair=1), "pair must be True"),
    (lambda: tst.indices(3, -1), "n=128 for one TBQ block"),
    (lambda: tst.indices(True, 8), "pack3 takes bits=3"),
    (lambda: tst.indices(3, 8, leading_shape=3), "tuple of non-negative ints"),
]


@pytest.mark.parametrize("call,fix", BAD_ARGUMENTS, ids=[f"bad{i}" for i in range(len(BAD_ARGUMENTS))])
def test_bad_arguments_raise_invalid_argument_with_the_fix(call, fix):
    with pytest.raises(InvalidArgument) as info:
        call()  # raised when the strategy is created, before any example is drawn
    assert fix in str(info.value), str(info.value)


def test_a_plain_given_test_passes_the_default_deadline_in_a_fresh_process(tmp_path):
    """The fuzzing trap: numba's first load used to exceed hypothesis's 200 ms deadline on example one.

    Building the strategy warms the format's kernels, so a user's plain @given test with
    hypothesis's default settings (deadline 200 ms) passes in a fresh interpreter.
    """
    import subprocess
    import sys
    import textwrap

    test = tmp_path / "test_user_fuzz.py"
    test.write_text(textwrap.dedent('''
        from hypothesis import given, settings
        import tbq
        from tbq.testing import strategies as tst

        @settings(max_examples=5, deadline=200)  # hypothesis's default deadline, stated
        @given(tst.float_blocks("tbq4_0"))
        def test_user(x):
            q = tbq.quantize(x, "tbq4_0")
            assert tbq.dequantize(q, "tbq4_0").shape == x.shape
    '''))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(test)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 passed" in r.stdout


@pytest.mark.parametrize("fmt", tbq.formats())
def test_the_kernel_status_the_fit_loop_asks_equals_the_spec_trace(fmt):
    """_Fmt.status asks the numba kernel (fast); the NumPy trace's refusal must be the same on blocks of any size."""
    from tbq.testing import strategies as s

    ctx = s._resolve_fmt("test", fmt, None, None)
    rng = np.random.default_rng(1)
    for _ in range(200):
        blk = (rng.standard_normal(ctx.bs) * 2.0 ** rng.integers(-140, 125)).astype(np.float32)
        blk = np.nan_to_num(blk, nan=0.0, posinf=1e30, neginf=-1e30).astype(np.float32)
        want = ctx.format.invalid_blocks(ctx.trace(blk[None, :]))
        assert ctx.status(blk) == (int(want[0]) if np.size(want) else 0)
