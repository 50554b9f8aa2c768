"""q4_1: the shared format battery, the C decoder's random-byte vectors, gguf-py, and each quirk of the spec."""

import numpy as np
import pytest
from helpers import BACKENDS, assert_bits_equal, check_format, load_npz

import tbq

N = 1 << 20  # values per oracle distribution

# (levels, offset of m or None, offset of the codes) of the formats these helpers serve (q5 tests import them)
LAYOUT = {"q4_1": (15, 2), "q5_1": (31, 2), "q5_0": (16, None)}


def oracle_data(dist: str, fmt: str) -> np.ndarray:
    """~1M float32 values, rows of 128, of one distribution; ``ties`` puts values exactly on code boundaries."""
    rng = np.random.default_rng(
        {"gaussian": 21, "student_t": 22, "tiny": 23, "large": 24, "ties": 25, "zeros": 26}[dist]
    )
    shape = (N // 128, 128)
    if dist == "gaussian":
        return rng.standard_normal(shape, dtype=np.float32)
    if dist == "student_t":
        return rng.standard_t(2, size=shape).astype(np.float32)
    if dist == "tiny":
        return (rng.standard_normal(shape) * 1e-6).astype(np.float32)
    if dist == "large":
        return (rng.standard_normal(shape) * 1e3).astype(np.float32)
    nb = N // 32
    if dist == "zeros":  # signed zeros: all-zero blocks of random signs, and blocks whose minimum is a zero
        x = np.where(rng.random((nb, 32)) < 0.5, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
        pos = rng.random(nb) < 0.5
        x[pos] = np.where(
            rng.random((int(pos.sum()), 32)) < 0.3, x[pos], np.abs(rng.standard_normal((int(pos.sum()), 32)))
        ).astype(np.float32)
        return x.reshape(-1, 128)
    # ties: per block a power-of-two step s; for the min formats min = -h*s, max = (levels - h)*s, values
    # (k + 1/2)*s in between, so (x - min)/d is exactly a half-integer; for q5_0 the Q4_0 construction with 16
    levels, _ = LAYOUT[fmt]
    s = np.ldexp(1.0, rng.integers(-6, 3, size=(nb, 1)))
    h = levels // 2 + 1 if fmt != "q5_0" else 16
    k = rng.integers(-h, levels - h, size=(nb, 32)) if fmt != "q5_0" else rng.integers(-16, 16, size=(nb, 32))
    x = (k + 0.5) * s
    if fmt == "q5_0":
        x[:, 0] = np.where(rng.integers(0, 2, nb) == 1, 16, -16) * s[:, 0]
    else:
        x[:, 0] = -h * s[:, 0]
        x[:, 1] = (levels - h) * s[:, 0]
    return x.astype(np.float32).reshape(-1, 128)


def first_zero_negative(blocks: np.ndarray) -> np.ndarray:
    """Per block: True when its first zero (C's kept zero) is -0."""
    zero = blocks == 0
    first = np.argmax(zero, axis=1)
    return np.signbit(blocks[np.arange(len(blocks)), first])


def compare_with_gguf(fmt: str, x: np.ndarray, q: np.ndarray, ref: np.ndarray) -> int:
    """Assert tbq's bytes ``q`` equal gguf-py's ``ref`` except for the signed-zero differences the spec lists.

    q4_1/q5_1: gguf-py takes ``np.min``/``np.max``, which may return either zero where C keeps the
    first one. A differing block must then have a zero minimum (or be all zeros, where ``max - min``
    is a difference of zeros), differ only in the sign bits of ``m`` (byte 3) and/or ``d`` (byte 1),
    and tbq's ``m`` must carry the sign of the block's first zero, its ``d`` be ``+0`` (C's ``x0 - x0``).
    q5_0: gguf-py takes ``x[argmax|x|]`` also for an all-zero block, so a block starting with ``-0``
    gets ``d = +0`` (``00 00``) where C has ``max = +0``, ``d = -0`` (``00 80``).
    Returns the number of blocks that differ in this permitted way.
    """
    ts = tbq.format_info(fmt).type_size
    qb, rb = q.reshape(-1, ts), ref.reshape(-1, ts)
    xb = x.reshape(-1, 32)
    # C's rule on every block it concerns, whether or not gguf-py happens to agree there
    allzero = (xb == 0).all(axis=1)
    if fmt == "q5_0":
        assert (qb[allzero, :2] == [0x00, 0x80]).all(), "C's zero block has max = +0, d = -0"
    else:
        zmin = xb.min(axis=1) == 0
        assert np.array_equal((qb[zmin, 3] & 0x80) != 0, first_zero_negative(xb[zmin])), (
            "m carries the first zero's sign"
        )
        assert (qb[allzero, :2] == 0).all(), "an all-zero block has d = x0 - x0 = +0"
    bad = np.flatnonzero((qb != rb).any(axis=1))
    if not bad.size:
        return 0
    diff = qb[bad] ^ rb[bad]
    if fmt == "q5_0":
        assert (xb[bad] == 0).all(), f"{fmt}: non-zero blocks differ from gguf-py: {bad[:5]}"
        assert (diff[:, [0] + list(range(2, ts))] == 0).all() and (diff[:, 1] == 0x80).all()
        return bad.size
    assert (xb[bad].min(axis=1) == 0).all(), f"{fmt}: blocks whose minimum is not zero differ from gguf-py: {bad[:5]}"
    mask = np.zeros(ts, np.uint8)
    mask[1] = mask[3] = 0x80
    assert not (diff & ~mask).any(), f"{fmt}: more than the sign bits of d and m differ"
    return bad.size


def gguf_case(fmt, dist, backends=BACKENDS):
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    qtype = getattr(gguf.GGMLQuantizationType, fmt.upper())
    x = oracle_data(dist, fmt)
    ref = np.asarray(quants.quantize(x, qtype)).view(np.uint8)
    for backend in backends:
        q = tbq.quantize(x, fmt, backend=backend)
        allowed = compare_with_gguf(fmt, x, q, ref)
        assert_bits_equal(
            tbq.dequantize(ref, fmt, backend=backend), quants.dequantize(ref, qtype), f"{fmt} {dist} {backend} decode"
        )
        if dist == "zeros":
            assert allowed > 0, f"{backend}: the zeros data should hit the documented signed-zero difference"
        else:
            assert allowed == 0, f"{backend}: {allowed} blocks differ from gguf-py"
    return x


def stored(fmt, x, backend, **kw):
    return tbq.quantize(np.asarray(x, np.float32).reshape(1, -1), fmt, backend=backend, **kw)[0]


# ---------------------------------------------------------------------------


def test_passes_the_format_battery():
    check_format("q4_1")


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_random_vectors(backend):
    ref = load_npz("decode_random/q4_1__strict")
    assert_bits_equal(tbq.dequantize(ref["q"], "q4_1", backend=backend), ref["y"], f"q4_1 decode_random {backend}")


@pytest.mark.parametrize("dist", ["gaussian", "student_t", "tiny", "large", "ties", "zeros"])
def test_matches_gguf_py(dist):
    x = gguf_case("q4_1", dist)
    if dist == "ties":  # the data does sit on exact half-integers of (x - min)/d: half rounds up
        f = tbq.get_format("q4_1")
        _, tr = f.reference_encode(x.reshape(-1, 32))
        v = tr["v"]
        assert np.count_nonzero(v - np.floor(v) == 0.5) > 0.4 * v.size


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_and_zero_blocks(backend):
    """A constant block stores d = 0, m = fp16(min), codes 0, and decodes to fp16(min) everywhere."""
    for v, m_bytes in [(0.5, [0x00, 0x38]), (-0.5, [0x00, 0xB8]), (0.1, [0x66, 0x2E]), (0.0, [0x00, 0x00])]:
        q = stored("q4_1", np.full(32, v), backend)
        assert q.tolist() == [0, 0] + m_bytes + [0] * 16, v
        y = tbq.dequantize(q, "q4_1", backend=backend)
        assert_bits_equal(y, np.full(32, np.float16(v), np.float32), f"constant {v}")
    # all -0.0: min = the first -0, max - min = -0 - -0 = +0; decodes to 0*(+0) + (-0) = +0
    q = stored("q4_1", np.full(32, -0.0), backend)
    assert q.tolist() == [0, 0, 0x00, 0x80] + [0] * 16
    assert_bits_equal(tbq.dequantize(q, "q4_1", backend=backend), np.zeros(32, np.float32), "all -0")


@pytest.mark.parametrize("backend", BACKENDS)
def test_minimum_is_the_first_zero(backend):
    """C updates min on a strict <: of +0 and -0 the first one stays (the sign bit of m). np.min may differ."""
    x = np.full(32, 1.0, np.float32)
    x[3], x[9] = 0.0, -0.0
    assert stored("q4_1", x, backend)[2:4].tolist() == [0x00, 0x00]
    x[3], x[9] = -0.0, 0.0
    assert stored("q4_1", x, backend)[2:4].tolist() == [0x00, 0x80]


@pytest.mark.parametrize("backend", BACKENDS)
def test_codes_use_the_float32_scale_and_minimum(backend):
    """Codes come from the float32 d, id and min, not their fp16 roundings; blocks where the two differ exist."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4096, 32)) * 3 + 0.3).astype(np.float32)
    f = tbq.get_format("q4_1")
    q, tr = f.reference_encode(x)
    d16 = tr["d"].astype(np.float16).astype(np.float32)
    m16 = tr["m"].astype(np.float16).astype(np.float32)
    inv16 = np.float32(1) / d16
    alt = np.minimum(np.trunc((x - m16[:, None]) * inv16[:, None] + np.float32(0.5)), 15).astype(np.uint8)
    codes = f.fields(q)["qs"]
    differ = (codes != alt).any(axis=1)
    assert differ.sum() > 100  # the rule is observable on this data
    from naive_q4_1 import encode_block

    for i in np.flatnonzero(differ)[:20]:
        b, _ = encode_block(f, x[i])
        assert stored("q4_1", x[i], backend).tobytes() == b


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_rounds_up_in_float32(backend):
    """v = (x - min)*id exactly k + 1/2 rounds up (t = v + 0.5 is an integer); the largest value gets 15."""
    x = (np.arange(32) % 16 + 0.5).astype(np.float32)  # min 0.5, max 15.5: d = 1, v = j % 16 exactly
    x[31] = 15.5
    x[30] = 7.0  # v = 6.5: a tie
    q = stored("q4_1", x, backend)
    codes = tbq.get_format("q4_1").fields(q)["qs"][0]
    assert codes[30] == 7 and codes[31] == 15 and codes[0] == 0 and codes[15] == 15


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_range_writes_code_zero(backend):
    """max - min below ~4.4e-38: 1/d overflows, (x - min)*inf is NaN (x = min) or inf: undefined in C, code 0 on x86."""
    x = np.zeros(32, np.float32)
    x[5] = np.float32(1e-39)  # d = 6.7e-41, 1/d = inf
    x[6] = np.float32(-2e-39)
    q = stored("q4_1", x, backend)
    assert q.tolist() == [0, 0, 0x00, 0x80] + [0] * 16  # d and m round to fp16 zero (m = -0), all codes 0
    f = tbq.get_format("q4_1")
    with np.errstate(all="ignore"):
        _, tr = f.reference_encode(x[None, :])
        assert np.isinf(np.float32(1) / tr["d"][0]) and not np.isfinite(tr["t"]).any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_overflowing_scale_or_minimum_is_refused_unless_asked(backend):
    """fp16(d) = inf (max - min >= 982800) or fp16(m) = inf (min <= -65520): ScaleOverflowError naming d or m."""
    ok = np.ones((3, 32), np.float32)
    cases = [
        (np.float32([0, 1e6] + [0] * 30), r"the scale d = \(max - min\) / 15 is 66666", [0x00, 0x7C, 0x00, 0x00]),
        (np.float32([-70000, -69999] + [-69999.5] * 30), r"the minimum m is -70000", [0x44, 0x2C, 0x00, 0xFC]),
    ]
    for blk, msg, head in cases:
        x = ok.copy()
        x[2] = blk
        with pytest.raises(tbq.ScaleOverflowError, match=rf"block 2, {msg}.*on_overflow='inf'") as e:
            tbq.quantize(x, "q4_1", backend=backend)
        assert e.value.block == 2
        q = tbq.quantize(x, "q4_1", backend=backend, on_overflow="inf")
        assert q[2, :4].tolist() == head
    # max - min overflows float32: d = inf, id = 0, (x - min)*0 is 0 or NaN -> codes 0; decodes to NaN
    x = np.float32([-3e38, 3e38] + [0] * 30)
    q = stored("q4_1", x, backend, on_overflow="inf")
    assert q.tolist() == [0x00, 0x7C, 0x00, 0xFC] + [0] * 16
    assert np.isnan(tbq.dequantize(q, "q4_1", backend=backend)).all()


def test_fragile_values_mark_ties():
    f = tbq.get_format("q4_1")
    x = (np.arange(32) % 16 + 0.5).astype(np.float32)
    x[30] = 7.0  # v = 6.5 exactly
    x[29] = np.nextafter(np.nextafter(np.float32(6.0), np.float32(7)), np.float32(7))  # v = 5.5 + 2 ulps(6)
    _, tr = f.reference_encode(x[None, :])
    fr = f.fragile_values(tr, 1)[0]
    assert fr[30] and not fr[29] and not fr[:16].any()
    assert f.fragile_values(tr, 4)[0][29]


def nan_payload_case(fmt):
    """Blocks whose d is +inf and whose m is a signalling NaN: y = c*inf + NaN, two NaN sources at c = 0."""
    ts = tbq.format_info(fmt).type_size
    data = np.zeros((2, ts), np.uint8)
    data[:, 0:2] = [0x00, 0x7C]  # d = +inf
    data[0, 2:4] = [0x22, 0xFD]  # m = 0xFD22, a negative signalling NaN
    data[1, 2:4] = [0x00, 0x3C]  # m = 1.0
    data[:, -16:] = 0x10  # codes: 0 in the low nibbles (c*inf = NaN), 1 in the high ones (inf)
    return data


@pytest.mark.parametrize("fmt", ["q4_1", "q5_1"])
def test_nan_payloads_are_the_same_on_both_backends(fmt):
    """A NaN product keeps its payload (x86 default NaN for 0*inf) even when m is NaN too; else m's NaN, quieted."""
    data = nan_payload_case(fmt)
    ys = [tbq.dequantize(data, fmt, backend=b).reshape(2, 32).view(np.uint32) for b in BACKENDS]
    assert np.array_equal(ys[0], ys[1])
    y = ys[0]
    assert (y[0, :16] == 0xFFC00000).all()  # 0 * inf: the default NaN, not m's payload
    assert (y[0, 16:] == 0xFFE44000).all()  # inf + sNaN(m): m's payload, quieted
    assert (y[1, :16] == 0xFFC00000).all() and (y[1, 16:] == 0x7F800000).all()
