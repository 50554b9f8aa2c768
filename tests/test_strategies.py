"""The public hypothesis strategies (tbq.testing.strategies) produce what they promise."""

from __future__ import annotations

import doctest
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument, NonInteractiveExampleWarning

import tbq
from tbq.formats import format_class
from tbq.rotation import RandomizedHadamard
from tbq.testing import strategies as tst

F32 = np.float32
FORMATS = tbq.format_names()
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
    d16 = c.format.fields(b)["d"].reshape(
        -1
    )  # the stored fp16 scale, wherever the layout puts it (vLLM: after the codes)
    with np.errstate(all="ignore"):
        d = np.array([c.format.reference_encode(row[None, :])[1]["d"][0] for row in x2.reshape(-1, c.block_size)], F32)
    return d, d16


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


@pytest.mark.parametrize("fmt", ["vllm_tq4_k", "vllm_tq3_v"])
@pytest.mark.parametrize("head_dim", [64, 256])
@settings(max_examples=25)
@given(data=st.data())
def test_blocks_of_a_format_option_that_sets_the_block_size(fmt, head_dim, data):
    """vLLM's TurboQuant block is one head (``head_dim``, a format option; the registry's row is 128's): every
    default family draws blocks of the instance's size that its codec encodes, and its valid encoded blocks are
    whole blocks of the instance's bytes, produced by that instance."""
    opts = {"head_dim": head_dim}
    codec = tbq.get_codec(fmt, backend="numpy", **opts)
    fam = data.draw(st.sampled_from([f for f in tst.DEFAULT_FAMILIES if f not in tst.HAZARD_FAMILIES]), label="family")
    x = data.draw(tst.float_blocks(fmt, options=opts, families=[fam], min_blocks=2, max_blocks=2, leading_shape=()))
    assert x.shape == (2 * head_dim,)
    codec.encode(x)  # every default family fits: no exception
    b = data.draw(tst.encoded_blocks(fmt, options=opts, min_blocks=1, max_blocks=1, leading_shape=()), label="b")
    assert b.shape == (codec.type_size,)
    assert np.isfinite(codec.decode(b)).all() and np.isfinite(codec.format.fields(b)["d"]).all()
    raw = data.draw(tst.encoded_blocks(fmt, options=opts, valid=False, min_blocks=3, max_blocks=3, leading_shape=()))
    assert raw.shape == (3 * codec.type_size,)


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
    return _f16_midpoint(tr["m"].reshape(-1)[0])  # the block's minimum, stored as fp16


def _f16_bits_table():
    """fp16 values from their bit patterns (sign, 5-bit exponent, 10-bit mantissa), not tbq's table."""
    b = np.arange(1 << 16)
    sign = np.where(b >> 15, -1.0, 1.0)
    e, m = (b >> 10) & 0x1F, b & 0x3FF
    with np.errstate(all="ignore"):
        v = np.where(e == 0, m * 2.0**-24, (1 + m / 1024.0) * 2.0 ** (e - 15.0))
        v = np.where(e == 31, np.where(m == 0, np.inf, np.nan), v)
    return sign * v


_F16_FINITE = np.unique(_f16_bits_table()[np.isfinite(_f16_bits_table())])


def _f16_midpoint(m):
    """True when ``m`` lies exactly halfway between two adjacent finite fp16 numbers."""
    m = float(m)
    i = int(np.searchsorted(_F16_FINITE, m))
    if i == 0 or i >= _F16_FINITE.size or _F16_FINITE[i] == m:
        return False
    return m == (_F16_FINITE[i - 1] + _F16_FINITE[i]) / 2


def _grid_ties_promise(fmt, blk):
    """a = x / d0 on (or one ulp from) a midpoint of the value table, or a block at the tiny-block threshold."""
    if np.abs(blk).max() <= 2e-15:
        return True
    tr = _trace(fmt, blk)
    table = np.asarray(format_class(fmt).fuzz.hazards["grid_ties"]["table"], np.float64)
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
    # on (or within two ulps of) an odd multiple: both conditions, or any value with a 1 in that bit passes
    return bool(abs(scaled - np.round(scaled)) * 2.0**-5 * 2.0**e <= 2 * np.spacing(s) and np.round(scaled) % 2 == 1)


def _binade_top_promise(fmt, blk):
    """The largest magnitude is one of the top 46 float32 values below a power of two."""
    amax = F32(np.abs(blk).max())
    top = F32(2.0 ** np.ceil(np.log2(np.float64(amax))))
    if top == amax:
        top = F32(top * 2)
    steps = int(top.view(np.uint32)) - int(amax.view(np.uint32))
    return 1 <= steps <= 46


def _overflows(fmt, x):
    try:
        tbq.quantize(x, fmt, backend="numpy")
    except tbq.ScaleOverflowError:
        return True
    return False


def _fp8_grid_promise(c, blk):
    """x / s is within 2 ulps of a grid midpoint or of the overflow limit, in the subnormal range, or x / s != x * (1/s)."""
    h = c.format.fuzz.hazards["fp8_grid"]
    s = F32(h["scale"])
    v = F32(abs(blk[0]) / s)
    grid = np.asarray(h["values"], np.float64)
    edges = np.concatenate([(grid[:-1] + grid[1:]) / 2, [h["limit"], grid[-1]]]).astype(F32)
    near = np.abs(edges.view(np.uint32).astype(np.int64) - int(v.view(np.uint32))).min() <= 2
    return bool(near or v < h["min_normal"] or F32(abs(blk[0]) / s) != F32(abs(blk[0]) * F32(F32(1) / s)))


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
    own = format_class(fmt).fuzz.hazards
    if family in tst.HAZARD_FAMILIES and family not in own:
        with pytest.raises(InvalidArgument, match="only applies to"):
            tst.float_blocks(fmt, families=[family])
        return
    x = data.draw(tst.float_blocks(fmt, families=[family], min_blocks=1, max_blocks=1, leading_shape=()), label="x")
    bs = tbq.format_info(fmt).block_size
    assert x.shape == (bs,) and x.dtype == np.float32
    c = tbq.get_codec(fmt, backend="numba")
    f16_scale = any(f.name == "d" and f.kind == "f16" for f in c.info.layout)
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
        if f16_scale:  # a scale near fp16's limit, or (q8_1, whose s = d * sum(codes) overflows first) a block
            d, d16 = scale_of(fmt, x[None, :])  # that twice as large would be refused
            assert (abs(float(d[0])) >= 2.0**14 and np.isfinite(d16[0])) or _overflows(fmt, x * F32(2))
        else:  # the value itself is huge: 2**14 or more, or within a factor 2 of what the format stores (FP8_E4M3: 464)
            assert np.abs(x).max() >= 2.0**14 or _overflows(fmt, x * F32(2))
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
    elif family == "fp8_grid":
        assert _fp8_grid_promise(c, x)
    elif family == "sparse" and np.count_nonzero(x) > 4:  # a TBQ block that rotates to an exact one-hot
        r = c.format.encode(x, trace=True)[1]["r"][0]
        assert np.count_nonzero(r) == 1


def _draws(strategy, n):
    """``n`` reproducible draws of a strategy (derandomized, generation only, no database)."""
    out = []

    @settings(
        max_examples=n,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(strategy)
    def collect(x):
        out.append(np.array(x, copy=True))

    collect()
    assert len(out) >= n // 2, f"only {len(out)} distinct draws"
    return out


def _one(fmt, family, n):
    return _draws(tst.float_blocks(fmt, families=[family], min_blocks=1, max_blocks=1, leading_shape=()), n)


# Each family must really produce its hazard in a good share of draws; the per-draw promises
# above allow a family's other modes, so alone they would pass a family that lost its hazard.


def test_subnormal_family_gives_normal_blocks_whose_inverse_scale_overflows():
    """The ``inverse_overflow`` mode: the largest value is a normal float32, yet 1/d overflows to Inf.

    Q8_0 (d = amax/127) is where that happens with a normal amax for a range of d; with the
    smaller divisors of Q4_0 or Q5 the block is mostly subnormal already.
    """
    fmt = "q8_0"
    hits = 0
    draws = _one(fmt, "subnormal", 150)
    for x in draws:
        d = F32(np.abs(_trace(fmt, x)["d"].reshape(-1)[0]))
        with np.errstate(all="ignore"):
            inv = F32(1) / d
        if np.abs(x).max() >= np.finfo(F32).tiny and np.isinf(inv) and d > 0:
            hits += 1
    assert hits >= 0.05 * len(draws), (hits, len(draws))  # one mode of five, part of its range


@pytest.mark.parametrize("fmt", ["tbq4_0", "tbq3_0"])
def test_sparse_family_gives_dense_blocks_that_rotate_to_an_exact_one_hot(fmt):
    c = tbq.get_codec(fmt, backend="numpy")
    draws = _one(fmt, "sparse", 90)
    dense = [x for x in draws if np.count_nonzero(x) > 4]
    assert len(dense) >= 0.15 * len(draws), (len(dense), len(draws))  # one mode of three
    for x in dense:
        r = c.format.encode(x, trace=True)[1]["r"][0]
        assert np.count_nonzero(r) == 1


@pytest.mark.parametrize("fmt", ["q4_1", "q5_1"])
def test_min_ties_family_gives_exact_ties_in_many_draws(fmt):
    """v = (x - min) * (1/d) exactly k + 1/2 (not one ulp off) in a good share of draws."""
    draws = _one(fmt, "min_ties", 120)
    exact = 0
    for x in draws:
        v = _trace(fmt, x)["v"].reshape(-1).astype(np.float64)
        exact += bool(np.any((v - np.floor(v) == 0.5) & (v >= 0.5)))
    assert exact >= 0.4 * len(draws), (exact, len(draws))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "iq4_nl"])
def test_gaussian_and_heavy_tail_families_have_their_tails(fmt):
    """Pooled kurtosis of the blocks (each scaled by its own RMS): about 3 for gaussian, far above for heavy_tail."""

    def pooled_kurtosis(draws):
        z = np.concatenate([(x / np.sqrt(np.mean(x.astype(np.float64) ** 2))) for x in draws if np.any(x)])
        return float(np.mean(z**4) / np.mean(z**2) ** 2)

    # (a per-block bound on max|x| / RMS could not fail: it is at most sqrt(32) for any block of 32)
    assert 2.5 <= pooled_kurtosis(_one(fmt, "gaussian", 60)) <= 3.6
    assert pooled_kurtosis(_one(fmt, "heavy_tail", 60)) >= 6.0


# The promises must reject what the family does not aim at: random blocks pass at most rarely.

_PROMISES = {
    "ties": (["q8_0", "q4_0", "q5_0"], lambda fmt, x: _ties_promise(fmt, x)),
    "min_ties": (["q4_1", "q5_1"], lambda fmt, x: _min_ties_promise(fmt, x)),
    "grid_ties": (["iq4_nl"], lambda fmt, x: _grid_ties_promise(fmt, x)),
    "ue4m3": (["nvfp4"], lambda fmt, x: _ue4m3_promise(fmt, x)),
    "binade_tops": (["mxfp4"], lambda fmt, x: _binade_top_promise(fmt, x)),
    "thresholds": (
        ["tbq4_0", "tbq3_0", "planar3_0", "iso4_0"],
        lambda fmt, x: _threshold_promise(tbq.get_codec(fmt), x),
    ),
}


@pytest.mark.parametrize("family,fmt", [(f, m) for f, (fmts, _) in _PROMISES.items() for m in fmts])
def test_promise_checks_reject_random_blocks(family, fmt):
    check = _PROMISES[family][1]
    bs = tbq.format_info(fmt).block_size
    r = np.random.default_rng(2024)
    n = 200
    accepted = sum(bool(check(fmt, (r.standard_normal(bs) * 2.0 ** r.uniform(-4, 4)).astype(F32))) for _ in range(n))
    assert accepted <= 0.05 * n, f"{family} promise accepted {accepted} of {n} random N(0, s^2) blocks"


def test_the_fp16_midpoint_check_reads_the_bit_patterns():
    one_plus = 1 + 2.0**-10  # the fp16 number after 1
    assert _f16_midpoint(F32((1 + one_plus) / 2)) and not _f16_midpoint(F32(1.0)) and not _f16_midpoint(F32(1.0002))
    assert _f16_midpoint(F32(2.0**-25)) and _f16_midpoint(F32(-(65504 + 65472) / 2))
    assert not _f16_midpoint(F32(2.0**-26))  # between 0 and the smallest subnormal, not halfway
    t = _f16_bits_table()
    assert t[0x3C00] == 1.0 and t[0x0001] == 2.0**-24 and t[0x7BFF] == 65504.0 and t[0x8400] == -(2.0**-14)
    assert np.isinf(t[0x7C00]) and np.isnan(t[0x7E00])


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
    if not any(f.name == "d" and f.kind == "f16" for f in info.layout):
        return
    d = tbq.get_format(fmt).fields(b2)["d"].reshape(-1)  # wherever the layout puts it (vLLM: after the codes)
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
        words = sum(b2[:, off + k].astype(int) << (8 * k) for k in range(nbytes))  # little-endian field bits
        for bits in words.tolist():
            for name, (lo, hi) in table.items():
                if lo <= bits <= hi:
                    seen.add(name)

    from tbq.formats.base import FIELD_KINDS

    lay = tbq.format_info(fmt).layout
    first = next((f for f in lay if f.name == "d"), lay[0])  # the scale wherever it is (vLLM's follows the codes)
    # a field that declares its own special patterns (FP8's one byte), else its kind's (f16, bf16), else fp16 at bytes 0-1
    table = {n: (lo, hi) for n, lo, hi in first.specials} if first.specials else None
    if table is None and first.size <= 2 and FIELD_KINDS[first.kind].specials:
        table = FIELD_KINDS[first.kind].specials
    nbytes = first.size if table is not None else 2  # the field's own bytes (FP8: 1, q8_k's float32 d: 4)
    off = first.offset if table is not None else 0
    table = table or tst.SPECIAL_SCALES
    collect()
    assert seen == set(table), sorted(set(table) - seen)  # every special pattern of the field, not a few


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
    (lambda: tst.float_blocks("q8_0", codebook="lloyd-max"), "an option of tbq4_0, tbq3_0; drop it"),
    (lambda: tst.float_blocks("q8_0", options={"scale": 2.0}), "an option of fp8_e4m3, fp8_e5m2"),
    (lambda: tst.float_blocks("fp8_e4m3", options={"scale": -1.0}), "scale must be finite and > 0"),
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
    test.write_text(
        textwrap.dedent("""
        from hypothesis import given, settings
        import tbq
        from tbq.testing import strategies as tst

        @settings(max_examples=5, deadline=200)  # hypothesis's default deadline, stated
        @given(tst.float_blocks("tbq4_0"))
        def test_user(x):
            q = tbq.quantize(x, "tbq4_0")
            assert tbq.dequantize(q, "tbq4_0").shape == x.shape
    """)
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(test)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 passed" in r.stdout


@pytest.mark.parametrize("fmt", tbq.format_names())
def test_the_kernel_status_the_fit_loop_asks_equals_the_spec_trace(fmt):
    """_Fmt.status asks the numba kernel (fast); the NumPy trace's refusal must be the same on blocks of any size."""
    from tbq.testing.strategies._machinery import _resolve_fmt

    ctx = _resolve_fmt("test", fmt, None, None)
    rng = np.random.default_rng(1)
    for _ in range(200):
        blk = (rng.standard_normal(ctx.bs) * 2.0 ** rng.integers(-140, 125)).astype(np.float32)
        blk = np.nan_to_num(blk, nan=0.0, posinf=1e30, neginf=-1e30).astype(np.float32)
        want = ctx.format.invalid_blocks(ctx.trace(blk[None, :]))
        assert ctx.status(blk) == (int(want[0]) if np.size(want) else 0)


def _rotated_values_around(t, half_width=64):
    """fl(C * h) for the 2 * half_width + 1 float32 h nearest t / C (C = the rotation's constant), in increasing h."""
    C = F32(1.0 / np.sqrt(128.0))
    h0 = F32(float(t) / float(C))
    bits = h0.view(np.int32) + np.arange(
        -half_width, half_width + 1, dtype=np.int32
    )  # t > 0: h0 > 0, so bits increase with h
    h = bits.view(F32)
    return (h * C).astype(F32)


@pytest.mark.parametrize("fmt", ["tbq4_0", "tbq3_0"])
def test_threshold_targets_skipped_are_those_no_rotated_coordinate_takes(fmt):
    """The on_threshold search is skipped for a target fl(C * h) takes for no float32 h: proved here by an exhaustive
    window. h -> fl(C * h) is monotone, so a window whose images run from below t to above t without t settles it."""
    from tbq.testing.strategies._machinery import _resolve_fmt
    from tbq.testing.strategies._rotated import _reachable, _threshold_targets

    ctx = _resolve_fmt("test", fmt, None, None)
    C = float(ctx.hadamard_scale)
    assert float(F32(1.0 / np.sqrt(128.0))) == C
    skipped = []
    for t in _threshold_targets(ctx):
        for v in (np.nextafter(F32(t), F32(-np.inf)), F32(t), np.nextafter(F32(t), F32(np.inf))):
            img = _rotated_values_around(abs(v))
            assert img[0] < abs(v) < img[-1]  # the window brackets the target
            assert _reachable(C, float(v)) == bool(np.any(img == abs(v))), (fmt, float(v))
            if not _reachable(C, float(v)):
                skipped.append(float(v))
    # the shipped Lloyd-Max tables have such targets (exact thresholds among them), a minority of all
    assert 0 < len(skipped) < len(_threshold_targets(ctx))
    assert any(float(F32(t)) in skipped for t in _threshold_targets(ctx))


def test_a_skipped_threshold_search_is_one_that_cannot_succeed(monkeypatch):
    """Run the full search (the skip disabled) on a target that no rotated coordinate takes: it fails; on a target the
    rotation reaches, the same search succeeds, with the coordinate exactly on it."""
    from tbq.testing.strategies import _rotated
    from tbq.testing.strategies._machinery import _resolve_fmt

    ctx = _resolve_fmt("test", "tbq3_0", None, None)
    C = float(ctx.hadamard_scale)
    targets = [F32(t) for t in _rotated._threshold_targets(ctx)]
    never = next(t for t in targets if not _rotated._reachable(C, float(t)))
    taken = next(t for t in targets if _rotated._reachable(C, float(t)))
    rng = np.random.default_rng(3)
    assert _rotated._search_threshold_block(rng, ctx, [5], [never]) is None
    assert rng.integers(0, 2**63) == np.random.default_rng(3).integers(0, 2**63)  # skipped before any draw
    monkeypatch.setattr(_rotated, "_reachable", lambda scale, v: True)
    assert _rotated._search_threshold_block(np.random.default_rng(3), ctx, [5], [never], iters=30) is None
    found = [_rotated._search_threshold_block(np.random.default_rng(s), ctx, [5], [taken]) for s in range(4)]
    hits = [x for x in found if x is not None]
    assert hits and all(ctx.rotated_coords(x[None, :])[0, 5] == taken for x in hits)


# ---------------------------------------------------------------------------
# The block's numbers (strategies/_rng.py): ranges kept, ends favoured, positions distinct
# ---------------------------------------------------------------------------


def test_rng_helpers_keep_their_ranges_and_return_the_ends_often():
    from tbq.testing.strategies import _rng

    rng = np.random.default_rng(0)
    ints = [_rng.integer(rng, -30, 20) for _ in range(4000)]
    assert min(ints) == -30 and max(ints) == 20 and set(ints) == set(range(-30, 21))
    for end in (-30, 20):  # 1/8 each, plus the uniform part's 1/51 of the other 3/4
        frac = ints.count(end) / len(ints)
        assert abs(frac - (1 / 8 + 0.75 / 51)) < 0.02, (end, frac)
    reals = [_rng.real(rng, -24.0, -14.01) for _ in range(4000)]
    assert all(-24.0 <= r <= -14.01 for r in reals)
    assert (
        reals.count(-24.0) > 300 and reals.count(-14.01) > 300
    )  # the exact ends: 2**-24 is the smallest fp16 subnormal
    for n in (1, 2, 4, 128):
        pos = _rng.distinct(rng, n, 0, 127)
        assert len(set(pos)) == n and all(0 <= p <= 127 for p in pos)
    assert sorted(_rng.distinct(rng, 3, 5, 7)) == [5, 6, 7]
    assert {_rng.pick(rng, "abc") for _ in range(100)} == set("abc")
    signs = [_rng.sign(rng) for _ in range(1000)]
    assert {float(s) for s in signs} == {1.0, -1.0} and all(s.dtype == np.float32 for s in signs)


@settings(max_examples=30)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_float_blocks_block_i_comes_from_the_generator_seeded_by_seed_and_i(data, seed):
    """Block i's numbers come from ``default_rng((seed, i))``, whatever the other blocks drew: a shrink of one
    block's family leaves the others as they were. (Families that make no hypothesis choice of their own, and
    blocks that fit q8_0 as drawn.)"""
    from tbq.testing.strategies import _blocks
    from tbq.testing.strategies._machinery import _resolve_fmt

    ctx = _resolve_fmt("t", "q8_0", None, None)
    fams = ["outliers", "constant"]
    saved, _blocks._SEEDS = _blocks._SEEDS, st.just(seed)  # the seed the strategy draws, fixed
    try:
        x = data.draw(tst.float_blocks("q8_0", families=fams, min_blocks=3, max_blocks=3, leading_shape=()))
    finally:
        _blocks._SEEDS = saved
    for i, got in enumerate(x.reshape(3, 32)):
        candidates = [_blocks._FAMILY_FUNCS[f](None, np.random.default_rng((seed, i)), ctx) for f in fams]
        assert any(np.array_equal(got, c) for c in candidates), i
