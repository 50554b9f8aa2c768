"""Property-based tests of the packers and codecs, for every format and both backends.

Run with the CI profile (``python -m pytest tests/test_properties.py``) or the
long fuzz profile (``TBQ_HYPOTHESIS_PROFILE=fuzz ...``); see tests/conftest.py
and docs/robustness.md.

Error bounds (derived from the formats, not fitted)
===================================================
``u = 2**-24`` is the float32 unit roundoff; ``d`` is the float32 scale the
spec computes (recomputed here with the spec's float32 operations), ``d16`` the
stored fp16 scale read back as float32, ``v = x / d`` the exact scaled value.

Q8_0. ``inv = fl(1/d)`` is a normal float32 whenever it is finite, so
``fl(x*inv) = (x/d)(1+e1)(1+e2)``: ``|fl(x*inv) - v| <= |v|(2u + u^2)`` (plus
``2**-149`` if the product is subnormal). roundf moves it by at most 1/2, so
``|q - v| <= 1/2 + |v|(2u+u^2) + 2**-149``. Decoding computes ``q * d16``
exactly (an 8-bit integer times an 11-bit fp16 significand fits float32's 24
bits, and the result is >= 2**-24 or 0, never subnormal). Writing
``y - x = d16 (q - v) + v (d16 - d)``::

    |y - x| <= |d16| (1/2 + |v|(2u+u^2) + 2**-149) + |v| |d16 - d|

i.e. half a step of the stored scale, plus the fp16 rounding of the scale
(``|v| <= 127``), plus float32 rounding terms. When ``d = fl(amax/127)``
itself underflows to 0 (``amax <= 127 * 2**-150``), ``inv = 0``, ``y = 0`` and
the bound is ``|x| <= amax <= 127 * 2**-150`` (Q4_0: ``8 * 2**-150``). When ``1/d`` overflows
(``d < 2**-128``) the codes are meaningless (float-to-int of +-Inf/NaN) but
``d16 = 0``, so ``y = 0`` and the bound reads ``|x| <= |v| d``, which holds.

Q4_0. As above ``|fl(x*inv) - v| <= |v|(2u+u^2) + 2**-149``; the second
rounding ``t = fl(fl(x*inv) + 8.5)`` adds at most ``2**-20`` (half an ulp at
16); ``trunc(t) - 8`` is within 1/2 of ``t - 8.5``. But the codes stop at 15
(value +7) while ``v`` reaches +8 for a value of the opposite sign to the
block's max with the same magnitude, so the clamp adds ``max(0, v - 7.5)``::

    |y - x| <= |d16| (1/2 + max(0, v - 7.5) + 2**-20 + |v|(2u+u^2) + 2**-149) + |v| |d16 - d|

So Q4_0 is NOT within half a step in general: a value in ``(15/16 amax,
amax]`` of the opposite sign to the block's largest-magnitude value is off by
up to one full step ``|d|`` (the asymmetric 4-bit code range of ggml's Q4_0).

TBQ4_0 / TBQ3_0. Three exact checks and two derived bounds:

(a) Recomputing ``r = R(u)`` with the spec's float32 arithmetic, every stored
    index ``i`` satisfies ``thresholds[i-1] <= r < thresholds[i]`` (each
    rotated coordinate lies in its codebook cell).
(b) The stored fp16 is ``fp16(norm / recon)`` bit for bit.
(c) The decoded block has the stored norm: decoding is ``fl(fl(H(c*s2)) * C
    * s1) * d16`` with 7 butterfly stages. Each stage multiplies the 2-norm by
    sqrt(2) and adds a rounding error of at most ``u * sqrt(2)`` times the norm
    of its input, so the butterfly output is within ``((1+u)**7 - 1)`` of the
    exact (relative, in 2-norm); the constant C differs from 1/sqrt(128) by the
    relative ``kappa`` (computed, ~1.5e-8), and the two multiplications round
    once each. Hence, with ``cn = ||c[idx]||`` (exact, R is orthonormal)::

        | ||y|| - d16 cn | <= ((1+u)**9 (1+kappa) - 1) d16 cn

(d) And it keeps the input's norm up to the fp16 rounding of the scale: the
    sequential float32 sum of 128 squares and the square root give ``norm``
    within ``rho = sqrt(1 + gamma_128)(1+u) - 1`` (``gamma_n = n u / (1 - n u)``)
    of ``||x||`` plus an underflow term ``sqrt(128 * 2**-150)``, the same for
    ``recon`` against ``cn``, and ``d = fl(norm / recon)`` adds one rounding::

        | ||y|| - ||x|| | <= gamma_c d16 cn + |d16 - d| cn
                             + ||x|| ((1+rho)(1+u)/(1-rho) - 1) + A (1+u)/(1-rho)

    (checked when ``norm > 1e-10``; below that TBQ4_0 zeroes ``u`` and TBQ3_0
    clamps the norm, and ``d16`` is 0 anyway).

Every bound is evaluated in float64 and multiplied by ``1 + 2**-40`` to cover
the float64 rounding of the check itself.

Idempotence (encode(decode(b)) == b for encoder output)
=======================================================
- Q8_0: holds for every block with a non-zero stored scale: the decoded
  block's largest magnitude is ``127 * d16`` exactly, so the re-encoded scale
  is ``d16`` again and every ``q * d16 * fl(1/d16)`` rounds back to ``q``.
  Fails when the scale underflowed to fp16 zero (``amax < 127 * 2**-25``): the
  codes are non-zero but decode to 0, and re-encoding gives all-zero codes.
- Q4_0: the same argument (the first code-0 value is ``-8 * d16``, so the new
  ``d`` is ``d16``) for non-zero scales. All-zero blocks are fixed points too
  (``d = +0 / -8 = -0.0`` as in ggml, decoded to -0.0, re-encoded to the same
  bytes). Fails when a non-zero scale underflowed to fp16 zero
  (``|max| < 8 * 2**-25``): the codes decode to zeros and re-encode as 8.
- TBQ4_0 / TBQ3_0: not idempotent. Re-encoding the decoded block rotates back
  to ``c[idx] / ||c[idx]||``, i.e. the centroids rescaled by ``1/recon``; when
  ``recon`` is far from 1 coordinates move to another cell. Example: a block
  that rotates to a one-hot vector has ``recon ~ 0.27`` with the Lloyd-Max
  table, and all 127 small coordinates move up one cell. See
  ``test_tbq_is_not_idempotent``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import math
import subprocess
import sys
import threading

import naive
import numpy as np
import pytest
from helpers import assert_bytes_equal
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as npst

import tbq
from tbq import packing
from tbq.errors import NonFiniteError, ScaleOverflowError
from tbq.formats import FORMAT_CLASSES
from tbq.testing import strategies as tst

F32 = np.float32
U = 2.0**-24
SLACK = 1 + 2.0**-40
FORMATS = tbq.format_names()
Q_FORMATS = ("q8_0", "q4_0")
TBQ_FORMATS = ("tbq4_0", "tbq3_0")
#: The formats whose error bounds and decoders this module derives by hand (docstring above);
#: every other format is checked against its slow model in tests/naive_<module>.py.
DERIVED = Q_FORMATS + TBQ_FORMATS
#: Families that apply only to the formats listing them in fuzz.hazards.
HAZARD_FAMILIES = set(tst.HAZARD_FAMILIES)
BACKENDS = ("numpy", "numba")
ALL_FAMILIES = [*tst.DEFAULT_FAMILIES, "overflow", "nonfinite"]


@functools.cache
def codec(fmt, backend="numpy", threads=None, on_overflow="raise", codebook=None):
    kw = {} if codebook is None else {"codebook": codebook}
    return tbq.get_codec(fmt, backend=backend, threads=threads, on_overflow=on_overflow, **kw)


def families_for(fmt, extra=()):
    """The default families that apply to ``fmt`` (its own hazard families only), plus ``extra``."""
    own = FORMAT_CLASSES[fmt].fuzz.hazards
    return [f for f in [*tst.DEFAULT_FAMILIES, *extra] if f not in HAZARD_FAMILIES or f in own]


def f16_scale_layout(fmt) -> bool:
    """True when the block starts with one fp16 scale d at bytes 0-1 (what scale_f32 reads)."""
    lay = tbq.format_info(fmt).layout
    return lay[0].name == "d" and lay[0].kind == "f16" and lay[0].offset == 0


def naive_encode(fmt_obj, x2):
    """Bytes of blocks ``x2`` by the slow model (whole rows for a row-rule format)."""
    out = []
    for row in x2:
        b, _ = naive.encode_block(fmt_obj, row)
        out.append(np.frombuffer(b, np.uint8))
    return np.stack(out)


# ---------------------------------------------------------------------------
# Independent spec helpers (float32, one rounding per operation)
#
# They share no table or code with tbq: the fp16 table is built here from the
# bit fields, fp16 rounding is tests/naive.py's by-hand rounding, and the
# rotation is the spec's butterfly written out below with the sign vectors as
# data. (The numpy == numba properties compare two tbq paths that read the same
# tables; a wrong table is caught by these helpers, not by those properties.)
# ---------------------------------------------------------------------------


@functools.cache
def f16_values() -> np.ndarray:
    """float32 of every fp16 bit pattern, from the fields: sign, 5-bit exponent, 10-bit mantissa.

    Normal: (1024 + m) 2**(e-25); subnormal: m 2**-24; exponent 31: Inf, or a NaN
    whose payload moves to the top of the float32 mantissa (what F16C and ggml do).
    """
    b = np.arange(1 << 16, dtype=np.uint32)
    sign, e, m = b >> 15, (b >> 10) & 0x1F, b & 0x3FF
    mag = np.where(e == 0, m * 2.0**-24, (1024 + m) * 2.0 ** (e.astype(np.float64) - 25)).astype(F32)
    bits = mag.view(np.uint32) | (sign << 31)
    special = (sign << 31) | np.uint32(0x7F800000) | (m << 13)
    out = np.where(e == 31, special, bits).astype(np.uint32).view(F32)
    out.setflags(write=False)
    return out


def scale_f32(b2):
    """Stored fp16 scales of a (blocks, type_size) byte array, as float32."""
    bits = b2[:, 0].astype(np.uint16) | (b2[:, 1].astype(np.uint16) << 8)
    return f16_values()[bits], bits


def fp16_bits(d):
    """fp16 bits of float32 values by tests/naive.py's rounding (by hand, round to nearest even)."""
    d = np.asarray(d, F32)
    return np.array([naive.fp16_bits(v) for v in d.reshape(-1)], np.uint16).reshape(d.shape)


def _butterfly(v):
    """The spec's Walsh-Hadamard butterfly on float32 rows: (a, b) -> (a + b, a - b), h = 1, 2, 4, ...

    Stage h pairs w[i + t] with w[i + h + t] for every i = 0, 2h, 4h, ... and t < h: viewing each
    row as (n / 2h, 2, h) puts a at [:, 0, :] and b at [:, 1, :], so one float32 addition and one
    subtraction per pair, each rounded once, as in the spec's loop.
    """
    w = np.array(v, F32, copy=True)
    rows, n, h = w.shape[0], w.shape[-1], 1
    while h < n:
        pairs = w.reshape(rows, n // (2 * h), 2, h)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        w = np.stack((a + b, a - b), axis=2).reshape(rows, n)
        h *= 2
    return w


def rot_forward(rotation, u):
    """r = s2 * (C * H(s1 * u)), C = float32(1/sqrt(n)): the encoder's rotation (spec order of roundings)."""
    s1, s2 = (np.asarray(s, F32) for s in (rotation.signs1, rotation.signs2))
    return (_butterfly(u * s1) * F32(1.0 / math.sqrt(u.shape[-1]))) * s2


def rot_inverse(rotation, v):
    """s1 * (C * H(s2 * v)): the decoder's rotation."""
    s1, s2 = (np.asarray(s, F32) for s in (rotation.signs1, rotation.signs2))
    v = np.atleast_2d(np.asarray(v, F32))
    return (_butterfly(v * s2) * F32(1.0 / math.sqrt(v.shape[-1]))) * s1


def test_independent_helpers_agree_with_the_slow_model_and_known_values():
    """The helpers above against tests/naive.py (one block) and values known by hand."""
    t = f16_values()
    assert t[0x3C00] == 1.0 and t[0x0001] == 2.0**-24 and t[0x03FF] == 1023 * 2.0**-24 and t[0x7BFF] == 65504.0
    assert t[0x8000] == 0 and np.signbit(t[0x8000]) and np.isinf(t[0xFC00]) and t[0xFC00] < 0
    assert t[0x7E01].view(np.uint32) == 0x7FC02000  # NaN payload kept
    assert all(naive.fp16_value(b) == t[b] for b in range(0, 1 << 16, 97) if (b >> 10) & 0x1F != 31)
    assert fp16_bits(F32([65519.0, 65520.0, 2.0**-25, -(2.0**-24) * 1.5])).tolist() == [0x7BFF, 0x7C00, 0x0000, 0x8002]
    c = codec("tbq4_0", "numpy")
    u = np.random.default_rng(5).standard_normal((1, 128)).astype(F32)
    s1, s2 = c.rotation.signs1, c.rotation.signs2
    want = [
        F32(F32(a * F32(1.0 / math.sqrt(128))) * F32(s))
        for a, s in zip(naive.butterfly([F32(a * F32(s)) for a, s in zip(u[0], s1, strict=True)]), s2, strict=True)
    ]
    assert np.array_equal(rot_forward(c.rotation, u)[0].view(np.uint32), np.array(want, F32).view(np.uint32))
    # the sum of squares against the spec's loop, one float32 rounding per operation, on rows whose
    # order matters (a pairwise or reordered sum gives other bits on most of them)
    v = (
        np.random.default_rng(6).standard_normal((8, 128)).astype(F32)
        * F32(2.0) ** np.arange(-60, 68, 16, dtype=F32)[:, None]
    )
    v[0, ::7] = F32(1e18)
    for row, got in zip(v, seq_sum_squares(v), strict=True):
        acc = F32(0)
        for val in row:
            acc = F32(acc + F32(val * val))
        assert got.view(np.uint32) == acc.view(np.uint32)


def seq_sum_squares(v):
    """Row-wise float32 sum of squares in index order from +0.0 (the spec's loop).

    ``np.add.accumulate`` adds strictly left to right (unlike ``np.sum``'s pairwise sums); its
    first partial sum is the first square itself, which is ``+0.0 + v0*v0`` (a square is never -0.0).
    """
    v = np.asarray(v, F32)
    if v.shape[1] == 0:
        return np.zeros(v.shape[0], F32)
    return np.add.accumulate(v * v, axis=1, dtype=F32)[:, -1]


def unpack_codes(fmt, b2):
    """Codes of each block by the spec's layout (written independently of tbq.packing)."""
    q = b2[:, 2:]
    if fmt == "q8_0":
        return q.view(np.int8).astype(np.int32)
    if fmt == "q4_0":
        return np.concatenate((q & 0x0F, q >> 4), axis=1).astype(np.int32)
    if fmt == "tbq4_0":
        out = np.empty((q.shape[0], 128), np.int32)
        out[:, 0::2] = q & 0x0F
        out[:, 1::2] = q >> 4
        return out
    lanes = q.reshape(-1, 16, 3).astype(np.uint32)
    lane = lanes[..., 0] | (lanes[..., 1] << 8) | (lanes[..., 2] << 16)
    return np.stack([(lane >> (3 * t)) & 7 for t in range(8)], axis=-1).reshape(-1, 128).astype(np.int32)


def tbq_rotated(fmt, x2, rotation):
    with np.errstate(all="ignore"):
        norm = np.sqrt(seq_sum_squares(x2))
        if fmt == "tbq4_0":
            inv = np.zeros_like(norm)
            np.divide(F32(1), norm, out=inv, where=norm > F32(1e-10))
            u = x2 * inv[:, None]
        else:
            norm = np.maximum(norm, F32(1e-10))
            u = x2 / norm[:, None]
        return norm, rot_forward(rotation, u)


def same_float32(a, b):
    """Bitwise equality, where any NaN equals any NaN."""
    a = np.asarray(a, F32)
    b = np.asarray(b, F32)
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a.view(np.uint32)[~nan], b.view(np.uint32)[~nan]))


def outcome(c, x):
    try:
        return ("ok", c.encode(x).tobytes())
    except (NonFiniteError, ScaleOverflowError) as exc:
        return (type(exc).__name__, exc.block)


# ---------------------------------------------------------------------------
# Packers
# ---------------------------------------------------------------------------

PACKERS = {
    # name: (pack, unpack, bits, indices per packing unit, bytes per unit)
    "pack4_pairs": (packing.pack4_pairs, packing.unpack4_pairs, 4, 2, 1),
    "pack4_halves": (packing.pack4_halves, packing.unpack4_halves, 4, 32, 16),
    "pack3": (packing.pack3, packing.unpack3, 3, 8, 3),
}
# () half the time, else 1-2 axes of sides 0-3 (zero-size arrays too), as one hypothesis choice: array_shapes makes
# about six, more than half a millisecond of an example that otherwise costs two or three.
_SHAPES = [(a,) for a in range(4)] + [(a, b) for a in range(4) for b in range(4)]
small_leading = st.sampled_from([()] * len(_SHAPES) + _SHAPES)


# Each property draws its whole case with one data.draw of a composite: a draw at the test's level costs about twice
# one inside a composite (hypothesis snapshots the global random state around it and formats a note).


@functools.cache  # one strategy object per packer (hypothesis validates a new one on its first draw)
@st.composite
def index_cases(draw, name):
    """``(units, idx)``: an index array of ``units`` whole units of packer ``name``."""
    _, _, bits, per, _ = PACKERS[name]
    units = draw(st.integers(0, 24))
    return units, draw(tst.indices(bits, units * per, leading_shape=small_leading))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(PACKERS))
@given(data=st.data())
def test_pack_then_unpack_is_identity(name, backend, data):
    """pack is injective on index arrays of its width, unpack is its left inverse (and numba == NumPy)."""
    pack, unpack, bits, per, nbytes = PACKERS[name]
    units, idx = data.draw(index_cases(name), label="units, idx")
    b = pack(idx, backend=backend)
    assert b.dtype == np.uint8 and b.shape == idx.shape[:-1] + (units * nbytes,)
    assert np.array_equal(unpack(b, backend=backend), idx)
    other = "numpy" if backend == "numba" else "numba"
    assert np.array_equal(pack(idx, backend=other), b)


@functools.cache
def byte_arrays(shape):
    """Any uint8 array of ``shape``, built once per shape (hypothesis validates each new strategy on its first draw).

    One ``binary`` draw is one hypothesis choice (a bytes choice, shrunk and mutated as bytes), where
    ``npst.arrays(np.uint8, shape)`` makes one per element: 23 % of the unpack property's time.
    """
    n = math.prod(shape)
    return st.binary(min_size=n, max_size=n).map(lambda b: np.frombuffer(b, np.uint8).reshape(shape).copy())


@functools.cache  # one strategy object per packer (hypothesis validates a new one on its first draw)
@st.composite
def byte_cases(draw, name):
    """``(shape, b)``: a uint8 array of whole units of packer ``name`` (any bytes)."""
    nbytes = PACKERS[name][4]
    units = draw(st.integers(0, 24))
    shape = draw(small_leading) + (units * nbytes,)
    return shape, draw(byte_arrays(shape))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(PACKERS))
@given(data=st.data())
def test_unpack_then_pack_is_identity(name, backend, data):
    """unpack is defined on every byte string of whole units and pack is its left inverse: together a bijection."""
    pack, unpack, bits, per, nbytes = PACKERS[name]
    shape, b = data.draw(byte_cases(name), label="shape, bytes")
    units = shape[-1] // nbytes
    idx = unpack(b, backend=backend)
    assert idx.dtype == np.uint8 and idx.shape == shape[:-1] + (units * per,)
    assert idx.size == 0 or int(idx.max()) < (1 << bits)
    assert np.array_equal(pack(idx, backend=backend), b)


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
def test_pack_rejects_indices_that_do_not_fit(backend, data):
    for name, (pack, _, bits, per, _) in PACKERS.items():
        idx = data.draw(tst.indices(bits, per), label=name).copy()
        pos = data.draw(st.integers(0, per - 1))
        idx[pos] = data.draw(st.integers(1 << bits, 255))
        with pytest.raises(tbq.TbqValueError, match="does not fit"):
            pack(idx, backend=backend)


# The exhaustive 2**24-lane check of pack3/unpack3 is tests/test_tbq3_shift_bug.py::test_exhaustive_all_2_24_lanes_numba
# (run once; it used to run here too). The spec's worked example:


def test_pack3_worked_example():
    assert packing.pack3(np.arange(8, dtype=np.uint8), backend="numba").tolist() == [0x88, 0xC6, 0xFA]


# ---------------------------------------------------------------------------
# Decoding arbitrary bytes
# ---------------------------------------------------------------------------


def decode_model(fmt, b2, c):
    """What the C decoder computes: float(code) * float(d16) in IEEE float32 (Inf/NaN products included).

    Formats other than Q8_0/Q4_0/TBQ: their slow models (tests/naive_<module>.py), block by block.
    """
    if fmt not in DERIVED:
        with np.errstate(all="ignore"):
            return np.array([naive.decode_block(c.format, bytes(row)) for row in b2], F32)
    d, _ = scale_f32(b2)
    q = unpack_codes(fmt, b2)
    with np.errstate(all="ignore"):
        if fmt == "q8_0":
            return q.astype(F32) * d[:, None]
        if fmt == "q4_0":
            return (q - 8).astype(F32) * d[:, None]
        y = rot_inverse(c.rotation, c.codebook.centroids[q])
        return y * d[:, None]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_decode_arbitrary_bytes(fmt, backend, data):
    """Any bytes of whole blocks decode, to float32 of the right shape, exactly as the C decoder (IEEE products)."""
    b = data.draw(tst.encoded_blocks(fmt, valid=False), label="bytes")
    c = codec(fmt, backend)
    y = c.decode(b)
    info = tbq.format_info(fmt)
    assert y.dtype == np.float32
    assert y.shape == b.shape[:-1] + (b.shape[-1] // info.type_size * info.block_size,)
    b2 = b.reshape(-1, info.type_size)
    want = decode_model(fmt, b2, c)
    assert same_float32(y.reshape(want.shape), want)
    # and as a bytes object
    if b.ndim == 1:
        assert same_float32(c.decode(b.tobytes()), y)


# ---------------------------------------------------------------------------
# Encoding: never raises on finite input whose scale fits fp16; error bounds
# ---------------------------------------------------------------------------


def check_q8_0(x2, b2, y2):
    amax = np.max(np.abs(x2), axis=1)
    d = amax / F32(127)
    d16, bits = scale_f32(b2)
    assert np.array_equal(bits, fp16_bits(d)), "stored scale is not fp16(amax / 127)"
    d64, d16_64, x64 = d.astype(np.float64)[:, None], d16.astype(np.float64)[:, None], x2.astype(np.float64)
    with np.errstate(all="ignore"):
        v = np.where(d64 != 0, x64 / np.where(d64 != 0, d64, 1), 0.0)
    bound = np.abs(d16_64) * (0.5 + np.abs(v) * (2 * U + U * U) + 2.0**-149) + np.abs(v) * np.abs(d16_64 - d64)
    bound = np.where(d64 == 0, 127 * 2.0**-150, bound)  # amax / 127 underflowed to 0: y = 0 and |x| <= amax
    err = np.abs(y2.astype(np.float64) - x64)
    bad = err > bound * SLACK
    assert not bad.any(), (
        f"Q8_0 bound violated at {np.argwhere(bad)[:3].tolist()}: err {err[bad][:3]}, bound {bound[bad][:3]}"
    )


def check_q4_0(x2, b2, y2):
    rows = np.arange(x2.shape[0])
    m = x2[rows, np.argmax(np.abs(x2), axis=1)]  # the first of equal magnitudes, with its sign
    m[np.max(np.abs(x2), axis=1) == 0] = F32(0)  # ggml starts from max = +0: zero blocks get d = -0.0
    d = m / F32(-8)
    d16, bits = scale_f32(b2)
    assert np.array_equal(bits, fp16_bits(d)), "stored scale is not fp16(max / -8)"
    d64, d16_64, x64 = d.astype(np.float64)[:, None], d16.astype(np.float64)[:, None], x2.astype(np.float64)
    with np.errstate(all="ignore"):
        v = np.where(d64 != 0, x64 / np.where(d64 != 0, d64, 1), 0.0)
    step = 0.5 + np.maximum(0.0, v - 7.5) + 2.0**-20 + np.abs(v) * (2 * U + U * U) + 2.0**-149
    bound = np.abs(d16_64) * step + np.abs(v) * np.abs(d16_64 - d64)
    bound = np.where(d64 == 0, 8 * 2.0**-150, bound)  # m / -8 underflowed to 0: y = 0 and |x| <= |m|
    err = np.abs(y2.astype(np.float64) - x64)
    bad = err > bound * SLACK
    assert not bad.any(), (
        f"Q4_0 bound violated at {np.argwhere(bad)[:3].tolist()}: err {err[bad][:3]}, bound {bound[bad][:3]}"
    )
    if np.any(np.maximum(0.0, v - 7.5) > 0):
        event("q4_0: clamped code (error above half a step)")


def gamma(n):
    return n * U / (1 - n * U)


KAPPA = abs(float(F32(1.0 / math.sqrt(128))) * math.sqrt(128.0) - 1.0)
GAMMA_DECODE = (1 + U) ** 9 * (1 + KAPPA) - 1
RHO = math.sqrt(1 + gamma(128)) * (1 + U) - 1
UNDERFLOW_A = math.sqrt(128 * 2.0**-150)


def check_tbq(fmt, c, x2, b2, y2):
    cb, K = c.codebook, 1 << c.info.index_bits
    norm, r = tbq_rotated(fmt, x2, c.rotation)
    idx = unpack_codes(fmt, b2)
    thr = cb.thresholds
    lo = np.where(idx > 0, thr[np.maximum(idx - 1, 0)], -np.inf)
    hi = np.where(idx < K - 1, thr[np.minimum(idx, K - 2)], np.inf)
    inside = (lo <= r) & (r < hi)
    assert inside.all(), f"(a) rotated coordinates outside their cell at {np.argwhere(~inside)[:3].tolist()}"
    if np.isin(r, thr).any():
        event("tbq: a rotated coordinate exactly on a threshold")
    # (b) the stored scale
    cen = cb.centroids[idx]
    recon = np.sqrt(seq_sum_squares(cen))
    with np.errstate(all="ignore"):
        if fmt == "tbq4_0":
            d = np.where(recon > F32(1e-10), norm / np.where(recon > 0, recon, 1), norm).astype(F32)
        else:
            d = norm / np.maximum(recon, F32(1e-10))
    d16, bits = scale_f32(b2)
    assert np.array_equal(bits, fp16_bits(d)), "(b) stored scale is not fp16(norm / recon)"
    # (c) the decoded block has the stored norm
    cn = np.sqrt(np.sum(cen.astype(np.float64) ** 2, axis=1))
    yn = np.sqrt(np.sum(y2.astype(np.float64) ** 2, axis=1))
    d16_64 = d16.astype(np.float64)
    assert np.all(np.abs(yn - d16_64 * cn) <= GAMMA_DECODE * d16_64 * cn * SLACK), (
        "(c) decoded norm != d16 * ||c[idx]||"
    )
    # (d) ... which is the input's norm up to the fp16 rounding of the scale
    xn = np.sqrt(np.sum(x2.astype(np.float64) ** 2, axis=1))
    big = norm > F32(1e-10)
    bound = (
        GAMMA_DECODE * d16_64 * cn
        + np.abs(d16_64 - d.astype(np.float64)) * cn
        + xn * ((1 + RHO) * (1 + U) / (1 - RHO) - 1)
        + UNDERFLOW_A * (1 + U) / (1 - RHO)
    )
    ok = np.abs(yn - xn) <= bound * SLACK
    assert ok[big].all(), f"(d) decoded norm too far from the input norm: {yn[big & ~ok][:3]} vs {xn[big & ~ok][:3]}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_encode_finite_never_raises_and_meets_the_error_bound(fmt, backend, data):
    x = data.draw(tst.float_blocks(fmt), label="x")
    c = codec(fmt, backend)
    b = c.encode(x)  # every default family is finite with a scale that fits fp16
    info = c.info
    assert b.dtype == np.uint8 and b.shape == x.shape[:-1] + (x.shape[-1] // info.block_size * info.type_size,)
    y = c.decode(b)
    x2, b2, y2 = x.reshape(-1, info.block_size), b.reshape(-1, info.type_size), y.reshape(-1, info.block_size)
    if fmt == "q8_0":
        check_q8_0(x2, b2, y2)
    elif fmt == "q4_0":
        check_q4_0(x2, b2, y2)
    elif fmt in TBQ_FORMATS:
        check_tbq(fmt, c, x2, b2, y2)
    else:  # the independent slow model of the spec gives the same bytes (rows whole: the row rule of IQ4_NL)
        rows = x.reshape(-1, x.shape[-1]) if c.format.row_rule else x2
        want = naive_encode(c.format, rows).reshape(b2.shape)
        assert_bytes_equal(b2, want, f"{fmt} vs tests/naive")


@pytest.mark.parametrize("fmt", TBQ_FORMATS)
@given(data=st.data())
def test_tbq_cells_and_norm_with_random_codebooks_and_signs(fmt, data):
    """The cell and stored-scale checks (a), (b), (c) hold for any valid codebook and sign vectors."""
    bits = tbq.format_info(fmt).index_bits
    cb = data.draw(tst.codebooks(bits), label="codebook")
    signs = data.draw(tst.sign_vectors(128), label="signs")
    c = tbq.get_codec(fmt, backend="numpy", codebook=cb, signs=signs, on_overflow="inf")
    x = data.draw(tst.float_blocks(c, families=["gaussian", "outliers", "thresholds", "sparse", "zero"]), label="x")
    b = c.encode(x)
    assert np.array_equal(tbq.get_codec(fmt, backend="numba", codebook=cb, signs=signs, on_overflow="inf").encode(x), b)
    x2, b2 = x.reshape(-1, 128), b.reshape(-1, c.type_size)
    d16, _ = scale_f32(b2)
    finite = np.isfinite(d16)
    y2 = c.decode(b).reshape(-1, 128)
    norm, r = tbq_rotated(fmt, x2, c.rotation)
    idx = unpack_codes(fmt, b2)
    K = 1 << bits
    thr = cb.thresholds
    lo = np.where(idx > 0, thr[np.maximum(idx - 1, 0)], -np.inf)
    hi = np.where(idx < K - 1, thr[np.minimum(idx, K - 2)], np.inf)
    assert ((lo <= r) & (r < hi)).all()
    cen = cb.centroids[idx].astype(np.float64)
    cn = np.sqrt(np.sum(cen**2, axis=1))
    yn = np.sqrt(np.sum(y2.astype(np.float64) ** 2, axis=1))
    dd = d16.astype(np.float64)
    assert np.all((np.abs(yn - dd * cn) <= GAMMA_DECODE * dd * cn * SLACK)[finite])


# ---------------------------------------------------------------------------
# Idempotence
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", Q_FORMATS)
@given(data=st.data())
def test_q_formats_reencode_is_identity_for_nonzero_scales(fmt, backend, data):
    c = codec(fmt, backend)
    b = data.draw(tst.encoded_blocks(fmt, valid=True), label="b")
    b2 = b.reshape(-1, c.type_size)
    again = c.encode(c.decode(b)).reshape(-1, c.type_size)
    d16, _ = scale_f32(b2)
    nz = d16 != 0
    assert np.array_equal(again[nz], b2[nz])
    # zero scales (underflow, or the Q4_0 sign of zero): the decoded block is all (signed) zeros
    if (~nz).any():
        event(f"{fmt}: zero scale, not idempotent")
        assert not np.any(c.decode(again[~nz]))


def test_q4_0_zero_blocks_are_fixed_points():
    """Zero blocks of either sign encode as ggml does (max starts at +0: d = +0 / -8 = -0.0, bytes 00 80),
    decode to -0.0 and re-encode to the same bytes."""
    for backend in BACKENDS:
        c = codec("q4_0", backend)
        for z in (np.zeros(32, F32), np.full(32, -0.0, F32)):
            b = c.encode(z)
            assert b[:2].tolist() == [0x00, 0x80]
            assert np.array_equal(c.encode(c.decode(b)), b)


@pytest.mark.parametrize("fmt", TBQ_FORMATS)
def test_tbq_is_not_idempotent(fmt):
    """A block that rotates to a one-hot vector: recon ~ 0.27, and re-encoding moves 127 coordinates a cell up."""
    c = codec(fmt, "numpy")
    e = np.zeros(128, F32)
    e[5] = 1
    x = rot_inverse(c.rotation, e)[0]
    b = c.encode(x)
    again = c.encode(c.decode(b))
    assert not np.array_equal(again, b)
    i1, i2 = unpack_codes(fmt, b[None]), unpack_codes(fmt, again[None])
    assert int(np.sum(i1 != i2)) >= 100


# ---------------------------------------------------------------------------
# Backends, threads, determinism, concurrency
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("on_overflow", ["raise", "inf"])
@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_numba_bytes_equal_numpy_bytes(fmt, on_overflow, data):
    """Same bytes, or the same error at the same block, including bad blocks (overflow, NaN/Inf)."""
    x = data.draw(tst.float_blocks(fmt, families=families_for(fmt, ("overflow", "nonfinite"))), label="x")
    ref = outcome(codec(fmt, "numpy", on_overflow=on_overflow), x)
    got = outcome(codec(fmt, "numba", on_overflow=on_overflow), x)
    event(f"outcome: {ref[0]}")
    assert got == ref
    if ref[0] == "ok":
        b = np.frombuffer(ref[1], np.uint8).reshape(x.shape[:-1] + (-1,))
        assert same_float32(codec(fmt, "numba").decode(b), codec(fmt, "numpy").decode(b))


@pytest.mark.parametrize("fmt", TBQ_FORMATS)
@given(data=st.data())
def test_tbq_kernel_rotate_equals_the_trace(fmt, data):
    """The numba twin the strategies use (kernel_rotate) gives the NumPy trace's norm, r and d bit for bit,
    on finite blocks of every default family and overflowing ones, for any codebook and sign vectors."""
    kw = {}
    if data.draw(st.booleans(), label="random tables"):
        kw = dict(
            codebook=data.draw(tst.codebooks(tbq.format_info(fmt).index_bits)), signs=data.draw(tst.sign_vectors(128))
        )
    f = tbq.get_codec(fmt, backend="numpy", **kw).format
    x = data.draw(tst.float_blocks(fmt, families=families_for(fmt, ("overflow", "huge"))), label="x").reshape(-1, 128)
    with np.errstate(all="ignore"):
        _, trace = f.reference_encode(x)
    for with_scale in (True, False):
        got = f.kernel_rotate(x, with_scale)
        for name, a in zip(("norm", "r", "d"), got, strict=True):
            if name == "d" and not with_scale:
                assert not a.any()
                continue
            assert np.array_equal(a.view(np.uint32), np.asarray(trace[name], np.float32).view(np.uint32)), name


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_numba_decode_equals_numpy_decode_on_arbitrary_bytes(fmt, data):
    b = data.draw(tst.encoded_blocks(fmt, valid=False), label="b")
    y1 = codec(fmt, "numba").decode(b)
    y0 = codec(fmt, "numpy").decode(b)
    assert np.array_equal(y1.view(np.uint32), y0.view(np.uint32))  # NaN payloads and signed zeros included


class small_chunks:
    """Temporarily shrink the codec work chunk so that small arrays span many chunks (and threads)."""

    def __init__(self, values):
        self.values = values

    def __enter__(self):
        self.saved = tbq.codecs.CHUNK_VALUES
        tbq.codecs.CHUNK_VALUES = self.values

    def __exit__(self, *exc):
        tbq.codecs.CHUNK_VALUES = self.saved


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_results_do_not_depend_on_threads(fmt, data):
    """Arrays spanning several work chunks give the same bytes and floats with 1, 2, 3 threads and the default."""
    x = data.draw(tst.float_blocks(fmt, max_blocks=3, leading_shape=st.tuples(st.integers(1, 8))), label="x")
    chunk_blocks = data.draw(st.integers(1, 7), label="blocks per chunk")
    bs = tbq.format_info(fmt).block_size
    with small_chunks(chunk_blocks * bs):
        outs = [codec(fmt, "numba", threads=t).encode(x) for t in (1, 2, 3, None)]
        ys = [codec(fmt, "numba", threads=t).decode(outs[0]) for t in (1, 2, 3, None)]
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])
    for y in ys[1:]:
        assert np.array_equal(y.view(np.uint32), ys[0].view(np.uint32))
    assert np.array_equal(codec(fmt, "numba").encode(x), outs[0])  # the real chunk size


def test_results_do_not_depend_on_threads_at_the_real_chunk_size():
    rng = np.random.default_rng(7)
    for fmt in FORMATS:
        n = max(128, tbq.format_info(fmt).block_size)  # rows of whole blocks (q8_k: one block of 256)
        x = rng.standard_normal((3 * tbq.codecs.CHUNK_VALUES // n + 5, n)).astype(F32)
        outs = [codec(fmt, "numba", threads=t).encode(x) for t in (1, 2, 3)]
        assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
        ys = [codec(fmt, "numba", threads=t).decode(outs[0]) for t in (1, 3)]
        assert np.array_equal(ys[0], ys[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_deterministic_across_calls_and_codec_objects(fmt, backend, data):
    x = data.draw(tst.float_blocks(fmt), label="x")
    b = codec(fmt, backend).encode(x)
    assert np.array_equal(codec(fmt, backend).encode(x), b)
    assert np.array_equal(tbq.get_codec(fmt, backend=backend).encode(x.copy()), b)
    out = np.empty_like(b)
    assert np.array_equal(codec(fmt, backend).encode(x, out=out), b)
    # strided / non-contiguous and float64 inputs give the same bytes
    if x.ndim == 1 and x.size > 1:  # (a one-value view is contiguous whatever its stride)
        wide = np.zeros((x.size, 2), F32)
        wide[:, 0] = x
        strided = wide[:, 0]  # a view with an 8-byte stride
        assert not strided.flags.c_contiguous
        assert np.array_equal(codec(fmt, backend).encode(strided), b)
    assert np.array_equal(codec(fmt, backend).encode(x.astype(np.float64)), b)


_PROCESS_SCRIPT = r"""
import json, sys, hashlib, numpy as np, tbq
out = {}
with np.load(sys.argv[1]) as z:
    for fmt in tbq.format_names():
        for backend in ("numpy", "numba"):
            c = tbq.get_codec(fmt, backend=backend)
            b = c.encode(z[fmt])
            y = c.decode(b)
            out[f"{fmt}/{backend}"] = [hashlib.sha256(b.tobytes()).hexdigest(), hashlib.sha256(y.tobytes()).hexdigest()]
print(json.dumps(out))
"""


def test_deterministic_across_processes(tmp_path):
    """A corpus drawn from the strategies encodes to the same bytes in a fresh interpreter (fresh numba cache load)."""
    import hashlib

    corpus = {}
    for fmt in FORMATS:
        rows = []

        @settings(max_examples=25, database=None, suppress_health_check=list(HealthCheck))
        @given(tst.float_blocks(fmt, min_blocks=1, max_blocks=1, leading_shape=()))
        def collect(x):
            rows.append(x)  # noqa: B023  # collect() runs (and ends) within this iteration

        collect()
        corpus[fmt] = np.stack(rows)
    path = tmp_path / "corpus.npz"
    np.savez(path, **corpus)
    res = subprocess.run(
        [sys.executable, "-c", _PROCESS_SCRIPT, str(path)], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr
    theirs = json.loads(res.stdout.strip().splitlines()[-1])
    for fmt in FORMATS:
        for backend in BACKENDS:
            c = codec(fmt, backend)
            b = c.encode(corpus[fmt])
            y = c.decode(b)
            mine = [hashlib.sha256(b.tobytes()).hexdigest(), hashlib.sha256(y.tobytes()).hexdigest()]
            assert theirs[f"{fmt}/{backend}"] == mine, (fmt, backend)


@settings(max_examples=max(3, min(settings().max_examples, 2000) // 8))
@given(data=st.data())
def test_concurrent_python_threads_give_identical_results(data):
    """Several Python threads encode/decode at once (numba releases the GIL): no shared scratch state."""
    jobs = []
    for fmt in FORMATS:
        x = data.draw(tst.float_blocks(fmt, max_blocks=4, leading_shape=(4,)), label=fmt)
        for backend, threads in (("numba", 1), ("numba", 2), ("numpy", None)):
            jobs.append((fmt, backend, threads, np.tile(x, (16, 1))))
    with small_chunks(4 * 128):
        serial = [codec(f, be, th).encode(x) for f, be, th, x in jobs]
        serial_y = [codec(f, be, th).decode(b) for (f, be, th, _), b in zip(jobs, serial, strict=True)]
    start = threading.Barrier(len(jobs))
    lock = threading.Lock()
    active = [0, 0]  # threads inside the work loop now, the most at once

    def run(i):
        f, be, th, x = jobs[i]
        start.wait(timeout=60)  # a broken barrier fails the test: every thread must start together
        with lock:
            active[0] += 1
            active[1] = max(active[1], active[0])
        res = []
        for _ in range(3):
            b = codec(f, be, th).encode(x)
            res.append((b, codec(f, be, th).decode(b)))
        with lock:
            active[0] -= 1
        return res

    with small_chunks(4 * 128), concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(run, range(len(jobs))))
    assert active[1] >= 2, "the threads ran one at a time"
    for i, res in enumerate(results):
        for b, y in res:
            assert np.array_equal(b, serial[i]), jobs[i][:3]
            assert np.array_equal(y.view(np.uint32), serial_y[i].view(np.uint32)), jobs[i][:3]


# ---------------------------------------------------------------------------
# Invariances
# ---------------------------------------------------------------------------


def _pow2_range(fmt, c, x):
    """Exponents k for which scaling x by 2**k provably changes only the scale (see the test's docstring)."""
    nz = np.abs(x[x != 0]).astype(np.float64)
    b = c.encode(x)
    d16 = float(c.format.fields(b)["d"].reshape(-1)[0])  # wherever the layout puts it (vLLM: after the codes)
    if nz.size == 0 or not (2.0**-14 <= abs(d16) <= 2.0**15):
        return None  # zero block, or a scale that is not a normal fp16 to begin with
    lo_x, hi_x = math.log2(nz.min()), math.log2(nz.max())
    # the other fp16 fields scale too: Q4_1/Q5_1's stored min m, Q8_1's s = fp16(d * sum(codes))
    others = [
        float(c.format.fields(b)[f.name].reshape(-1)[0]) for f in c.info.layout if f.kind == "f16" and f.name != "d"
    ]
    if any(v != 0 and not 2.0**-14 <= abs(v) <= 2.0**15 for v in others):
        return None
    if c.format.row_rule or fmt in TBQ_FORMATS or c.info.rotated:
        # squares stay normal (x^2 >= 2**-126) and the sum of 128 of them finite (|x| <= 2**60);
        # the norm stays above the 1e-10 cut-off
        klo = math.ceil(-63 - lo_x)
        khi = math.floor(60 - hi_x)
        norm = math.sqrt(float(np.sum(nz**2)))
        klo = max(klo, math.ceil(math.log2(2e-10 / norm)))
        eps = getattr(c.format, "norm_epsilon", 0.0)
        if eps:  # vLLM's keys divide by RN32(n + eps): equivariant only where RN32(n + eps) == n for n and 2**k n.
            # n >= 2**e with e = floor(log2(eps)) + 25 gives half an ulp of n, 2**(e - 24) >= 2**(floor(log2 eps) + 1),
            # above eps: the addition rounds back to n. n is the encoder's own float32 norm, which scales exactly.
            n_min = 2.0 ** (math.floor(math.log2(eps)) + 25)
            view = c.format.quantizer.rotated_view(c.format.encode(x, trace=True)[1])
            n32 = float(np.asarray(view[0]).reshape(-1)[0]) if view is not None else norm
            if n32 < n_min:
                return None
            klo = max(klo, math.ceil(math.log2(n_min / n32)))
        if c.format.row_rule:  # IQ4_NL: above the 1e-15 tiny-block threshold, and w*q*x (~127 |x|^3) normal and finite
            klo = max(klo, math.ceil(math.log2(2e-15 / nz.max())), math.ceil(-40 - lo_x))
            khi = min(khi, math.floor(38 - hi_x))
    else:
        # every |x| and the float32 scale stay normal, and 1/d stays finite
        klo = math.ceil(-126 - lo_x + 8)
        khi = math.floor(127 - hi_x - 8)
    # the fp16 scale (and min) stay normal fp16 numbers and finite: 2**-14 <= |s| * 2**k <= 2**15
    for s in (d16, *others):
        if s:
            klo = max(klo, math.ceil(-14 - math.log2(abs(s))))
            khi = min(khi, math.floor(15 - math.log2(abs(s))))
    # a refusal beyond the fp16 fields (vLLM's values: a top code whose decoded value, q * d16 + m16, passes 65504)
    # scales with 2**k too, so it holds from some k on: step khi down to the largest k the codec writes
    while klo <= khi and _refused(c, np.ldexp(x, khi).astype(F32)):
        khi -= 1
    return (klo, khi) if klo <= khi else None


def _refused(c, x):
    try:
        c.encode(x)
    except tbq.ScaleOverflowError:
        return True
    return False


#: Formats whose encoders are exactly scale-equivariant (docstring below): every float the spec
#: computes scales by 2**k or is unchanged, so only the fp16 fields change. Not f16/bf16 (no
#: scale: every value changes), MXFP4 (the scale is the exponent byte; covered by its own tests),
#: NVFP4 (UE4M3 sub-block scales round differently at different magnitudes).
#: formats with one fp16 scale d per block (not f16/bf16's values, the FP4 exponent bytes or FP8's per-tensor scale)
POW2_FORMATS = [f for f in FORMATS if any(fl.name == "d" and fl.kind == "f16" for fl in tbq.format_info(f).layout)]


@pytest.mark.parametrize("fmt", POW2_FORMATS)
@given(data=st.data())
def test_power_of_two_scaling_changes_only_the_scale(fmt, data):
    """encode(2**k x) has the same codes and the scale 2**k * d16 (TBQ: the rotated, normalised block is bit-identical).

    Holds while nothing under- or overflows: squares stay normal float32 and
    their sum finite (TBQ), the float32 scale and 1/d stay normal (Q formats),
    and both fp16 scales are normal fp16 numbers. ``_pow2_range`` picks k in
    that range.
    """
    x = data.draw(tst.float_blocks(fmt, min_blocks=1, max_blocks=1, leading_shape=()), label="x")
    c = codec(fmt, "numba")
    rng_k = _pow2_range(fmt, c, x)
    if rng_k is None:
        event("no admissible power of two (zero block or out-of-range scale)")
        return
    k = data.draw(st.integers(*rng_k).filter(lambda k: k != 0) if rng_k != (0, 0) else st.just(0), label="k")
    b = c.encode(x)
    bk = c.encode(np.ldexp(x, k).astype(F32))
    f16_fields = [f for f in c.info.layout if f.kind == "f16"]  # d (and Q4_1/Q5_1's m)
    other = np.ones(c.type_size, bool)
    for f in f16_fields:
        other[f.offset : f.offset + f.size] = False
    assert np.array_equal(bk[other], b[other]), "codes changed"
    fb, fk = c.format.fields(b), c.format.fields(bk)
    for f in f16_fields:
        assert float(fk[f.name].reshape(-1)[0]) == math.ldexp(float(fb[f.name].reshape(-1)[0]), k), f.name


@pytest.mark.parametrize("bits", range(1, 9))
def test_lloyd_max_codebooks_are_sign_symmetric(bits):
    cb = tbq.codebooks.lloyd_max(bits)
    assert np.array_equal(cb.centroids, -cb.centroids[::-1])
    assert np.array_equal(cb.thresholds, -cb.thresholds[::-1])
    mid = cb.thresholds[(1 << bits) // 2 - 1]
    assert mid == 0 and not np.signbit(mid)


@settings(max_examples=max(5, min(settings().max_examples, 200) // 4))
@given(bits=st.integers(1, 5), sigma=st.floats(1e-3, 1e3))
def test_lloyd_max_sign_symmetric_for_any_sigma(bits, sigma):
    cb = tbq.codebooks.lloyd_max(bits, sigma)
    assert np.array_equal(cb.centroids, -cb.centroids[::-1])
    assert np.array_equal(cb.thresholds, -cb.thresholds[::-1])


#: Formats whose encoder is odd by its spec: Q8_0 (roundf is odd); Q4_0 and Q5_0 (m, d and 1/d
#: change sign, x*(1/d) and the codes do not); f16/bf16 (sign-magnitude rounding); MXFP4/NVFP4
#: (the scale depends on |x|, the grid is symmetric and ties go to the smaller magnitude on both
#: sides). Not Q4_1/Q5_1 (min/max grid, round half up), IQ4_NL (asymmetric table) or planar/iso
#: (asymmetric thresholds: r = 0 takes the negative centroid).
ODD_FORMATS = ("q8_0", "q4_0", "q5_0", "f16", "bf16", "mxfp4", "nvfp4")


# The codebook matters only to TBQ: every other format runs once (no id that returns at once).
NEGATION_CASES = [pytest.param(f, None, id=f) for f in ODD_FORMATS if f not in TBQ_FORMATS] + [
    pytest.param(f, cb, id=f"{f}-{cb}") for f in TBQ_FORMATS for cb in ("lloyd-max", "turboq-mtp")
]


@pytest.mark.parametrize("fmt,codebook", NEGATION_CASES)
@given(data=st.data())
def test_negating_the_input_negates_the_output(fmt, codebook, data):
    """decode(encode(-x)) == -decode(encode(x)); TBQ indices mirror (K-1-i) except on threshold ties.

    Q8_0: roundf is odd. Q4_0: m, d and 1/d all change sign, so x*(1/d) and the
    codes are unchanged and only the scale flips. TBQ: R(-u) = -R(u) exactly
    and symmetric codebooks map cell i to K-1-i, except a coordinate exactly on
    a threshold (it takes the upper cell on both sides). The other odd formats:
    see ODD_FORMATS.
    """
    c = codec(fmt, "numba", codebook=codebook)
    x = data.draw(tst.float_blocks(c), label="x")
    b, bn = c.encode(x), c.encode(-x)
    y, yn = c.decode(b), c.decode(bn)
    if fmt not in TBQ_FORMATS:
        assert np.array_equal(yn, -y)  # == on floats: -0.0 == 0.0
        return
    x2 = x.reshape(-1, 128)
    _, r = tbq_rotated(fmt, x2, c.rotation)
    tie = np.isin(r, c.codebook.thresholds)
    K = 1 << c.info.index_bits
    i1 = unpack_codes(fmt, b.reshape(-1, c.type_size))
    i2 = unpack_codes(fmt, bn.reshape(-1, c.type_size))
    assert np.array_equal(i2[~tie], (K - 1 - i1)[~tie])
    clean = ~tie.any(axis=1)
    if (~clean).any():
        event("tbq: threshold tie, mirrored except the tied coordinates")
    assert np.array_equal(yn.reshape(-1, 128)[clean], -y.reshape(-1, 128)[clean])


# ---------------------------------------------------------------------------
# Bad input: errors with the right type (the table in docs/robustness.md)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_bad_blocks_raise_at_the_first_bad_block(fmt, backend, data):
    """NaN/Inf -> NonFiniteError, fp16 scale overflow -> ScaleOverflowError, with .block = the first bad block."""
    x = data.draw(tst.float_blocks(fmt, families=families_for(fmt, ("overflow", "nonfinite")), max_blocks=3), label="x")
    info = tbq.format_info(fmt)
    fmt_obj = tbq.get_format(fmt)
    x2 = x.reshape(-1, info.block_size)
    nonfinite = ~np.isfinite(x2).all(axis=1)
    # the format's own refusals (fp16 scale or value overflow, undefined cases), block by block
    status = np.zeros(x2.shape[0], np.int64)
    with np.errstate(all="ignore"):
        for i in np.flatnonzero(~nonfinite):
            s = fmt_obj.invalid_blocks(fmt_obj.reference_encode(x2[i : i + 1])[1])
            status[i] = int(s[0]) if np.size(s) else 0
    refused = ~nonfinite & (status != 0)
    bad = nonfinite | refused
    c = codec(fmt, backend)
    if not bad.any():
        c.encode(x)
        return
    first = int(np.argmax(bad))
    exc_type = NonFiniteError if nonfinite[first] else tbq.TbqValueError
    event(f"first bad block: {'NonFiniteError' if nonfinite[first] else 'refused'}")
    with pytest.raises(exc_type) as info_:
        c.encode(x)
    assert info_.value.block == first
    assert isinstance(info_.value, ValueError) and isinstance(info_.value, tbq.TbqError)
    if not nonfinite[first]:
        assert not isinstance(info_.value, NonFiniteError)
    if (
        not nonfinite.any() and f16_scale_layout(fmt) and fmt in DERIVED
    ):  # on_overflow="inf" stores the infinite scale, as C does
        b = codec(fmt, backend, on_overflow="inf").encode(x)
        assert np.isinf(scale_f32(b.reshape(-1, info.type_size))[0][refused]).all()


BAD_DTYPES = st.one_of(
    npst.integer_dtypes(), npst.unsigned_integer_dtypes(), npst.boolean_dtypes(), npst.complex_number_dtypes()
)


@pytest.mark.parametrize("fmt", FORMATS)
@given(data=st.data())
def test_wrong_dtypes_and_shapes_are_rejected(fmt, data):
    c = codec(fmt, "numba")
    info = c.info
    dt = data.draw(BAD_DTYPES, label="dtype")
    with pytest.raises(tbq.TbqTypeError, match="dtype"):
        c.encode(np.zeros((2, info.block_size), dt))
    if info.block_size > 1:  # every length is whole blocks of one value
        n = data.draw(st.integers(1, 4 * info.block_size).filter(lambda n: n % info.block_size), label="n")
        with pytest.raises(tbq.BlockShapeError, match="multiple of the block size"):
            c.encode(np.zeros(n, F32))
    if info.type_size > 1:  # every length is whole blocks of one byte
        m = data.draw(st.integers(1, 4 * info.type_size).filter(lambda m: m % info.type_size), label="m")
        with pytest.raises(tbq.EncodedLengthError, match="multiple of the block"):
            c.decode(np.zeros(m, np.uint8))
        with pytest.raises(tbq.EncodedLengthError):
            c.decode(bytes(m))
    bdt = data.draw(BAD_DTYPES.filter(lambda d: d != np.uint8) | npst.floating_dtypes(), label="byte dtype")
    with pytest.raises(tbq.TbqTypeError, match="uint8"):
        c.decode(np.zeros(info.type_size, bdt))


def _bad_calls():
    """(id, call, expected exception type, message fragment): every kind of bad argument tried."""
    import tbq.codebooks as cbm
    from tbq.rotation import RandomizedHadamard, signs_from_seed

    q8 = lambda **kw: tbq.get_codec("q8_0", **kw)  # noqa: E731
    t4 = lambda **kw: tbq.get_codec("tbq4_0", backend="numpy", **kw)  # noqa: E731
    z = np.zeros(32, F32)
    s1 = np.ones(128, np.int8)
    return [
        # input arrays
        ("int input", lambda: q8().encode(np.zeros(32, np.int32)), tbq.TbqTypeError, "dtype int32"),
        ("bool input", lambda: q8().encode(np.zeros(32, bool)), tbq.TbqTypeError, "dtype bool"),
        ("complex input", lambda: q8().encode(np.zeros(32, complex)), tbq.TbqTypeError, "complex"),
        ("object input", lambda: q8().encode(np.array([None] * 32)), tbq.TbqTypeError, "dtype object"),
        ("string input", lambda: q8().encode("abc"), tbq.TbqTypeError, "dtype"),
        ("long double input", lambda: q8().encode(np.zeros(32, np.longdouble)), tbq.TbqTypeError, "got dtype float128"),
        ("scalar input", lambda: q8().encode(np.float32(1)), tbq.BlockShapeError, "scalar"),
        ("float64 beyond float32", lambda: q8().encode(np.full(32, 1e300)), tbq.NonFiniteError, "overflows float32"),
        (
            "ragged input",
            lambda: q8().encode(np.zeros(33, F32)),
            tbq.BlockShapeError,
            "not a multiple of the block size",
        ),
        ("NaN input", lambda: q8().encode(np.full(32, np.nan, F32)), tbq.NonFiniteError, "non-finite"),
        ("Inf input", lambda: t4().encode(np.full(128, np.inf, F32)), tbq.NonFiniteError, "non-finite"),
        ("scale overflow", lambda: q8().encode(np.full(32, 1e7, F32)), tbq.ScaleOverflowError, "on_overflow='inf'"),
        (
            "TBQ norm overflow",
            lambda: t4().encode(np.full(128, 1e20, F32)),
            tbq.ScaleOverflowError,
            "does not fit float16",
        ),
        # encoded bytes
        ("wrong byte length", lambda: q8().decode(np.zeros(35, np.uint8)), tbq.EncodedLengthError, "34 bytes"),
        ("bytes object, wrong length", lambda: q8().decode(b"\0" * 35), tbq.EncodedLengthError, "34 bytes"),
        ("int8 bytes", lambda: q8().decode(np.zeros(34, np.int8)), tbq.TbqTypeError, "uint8"),
        ("float bytes", lambda: q8().decode(np.zeros(34, F32)), tbq.TbqTypeError, "uint8"),
        ("scalar bytes", lambda: q8().decode(np.uint8(0)), tbq.EncodedLengthError, "scalar"),
        ("list of ints as bytes", lambda: q8().decode([0] * 34), tbq.TbqTypeError, "uint8"),
        # out=
        ("out wrong dtype", lambda: q8().encode(z, out=np.zeros(34, np.int8)), tbq.TbqTypeError, "dtype uint8"),
        ("out wrong shape", lambda: q8().encode(z, out=np.zeros(35, np.uint8)), tbq.TbqValueError, "shape"),
        ("out not an array", lambda: q8().encode(z, out=bytearray(34)), tbq.TbqTypeError, "numpy array"),
        (
            "out read-only",
            lambda: q8().encode(z, out=np.frombuffer(bytes(34), np.uint8)),
            tbq.TbqValueError,
            "writeable",
        ),
        (
            "out not contiguous",
            lambda: q8().encode(z, out=np.zeros(68, np.uint8)[::2]),
            tbq.TbqValueError,
            "C-contiguous",
        ),
        # codec configuration
        ("unknown format", lambda: tbq.get_codec("q9_0"), tbq.ConfigError, "known formats"),
        ("unknown backend", lambda: q8(backend="cuda"), tbq.ConfigError, "backend must be one of"),
        ("threads=0", lambda: q8(threads=0), tbq.ConfigError, "positive integer"),
        ("threads=True", lambda: q8(threads=True), tbq.ConfigError, "positive integer"),
        ("threads=1.5", lambda: q8(threads=1.5), tbq.ConfigError, "positive integer"),
        ("on_overflow='clip'", lambda: q8(on_overflow="clip"), tbq.ConfigError, "on_overflow must be one of"),
        ("unknown keyword", lambda: q8(codebook="lloyd-max"), tbq.ConfigError, "bad configuration"),
        # codebooks
        ("unknown codebook name", lambda: t4(codebook="uniform"), tbq.ConfigError, "unknown codebook"),
        ("3-bit codebook for TBQ4", lambda: t4(codebook=cbm.lloyd_max(3)), tbq.ConfigError, "4-bit codebook"),
        ("codebook wrong type", lambda: t4(codebook=3), tbq.ConfigError, "codebook must be"),
        ("codebook dict keys", lambda: t4(codebook={"centroids": [0, 1]}), tbq.ConfigError, "exactly the keys"),
        ("centroids not increasing", lambda: tbq.Codebook([1.0, 0.0], [0.5]), tbq.ConfigError, "strictly increasing"),
        ("repeated centroid", lambda: tbq.Codebook([0.0, 0.0], [0.0]), tbq.ConfigError, "strictly increasing"),
        (
            "thresholds not increasing",
            lambda: tbq.Codebook([0, 1, 2, 3], [2, 1, 0]),
            tbq.ConfigError,
            "strictly increasing",
        ),
        ("NaN centroid", lambda: tbq.Codebook([np.nan, 1.0], [0.5]), tbq.ConfigError, "not finite"),
        ("Inf threshold", lambda: tbq.Codebook([0.0, 1.0], [np.inf]), tbq.ConfigError, "not finite"),
        ("3 centroids", lambda: tbq.Codebook([0, 1, 2], [0.5, 1.5]), tbq.ConfigError, "2**bits centroids"),
        ("wrong threshold count", lambda: tbq.Codebook([0, 1, 2, 3], [0.5]), tbq.ConfigError, "needs 3 thresholds"),
        ("2-D centroids", lambda: tbq.Codebook([[0, 1], [2, 3]], [0.5, 1, 2]), tbq.ConfigError, "one-dimensional"),
        ("string centroids", lambda: tbq.Codebook(["a", "b"], [0.5]), tbq.ConfigError, "real numbers"),
        ("complex centroids", lambda: tbq.Codebook([1j, 2j], [0.5]), tbq.ConfigError, "real numbers"),
        ("lloyd_max bits=0", lambda: cbm.lloyd_max(0), tbq.ConfigError, "1..8"),
        ("lloyd_max sigma<0", lambda: cbm.lloyd_max(3, -1.0), tbq.ConfigError, "sigma"),
        # signs
        ("unknown sign table", lambda: t4(signs="random"), tbq.ConfigError, "unknown sign table"),
        ("negative seed", lambda: t4(signs=-1), tbq.ConfigError, "non-negative"),
        ("bool seed", lambda: t4(signs=True), tbq.ConfigError, "signs must be"),
        ("float seed", lambda: t4(signs=1.5), tbq.ConfigError, "signs must be"),
        ("signs with a 0", lambda: t4(signs=(np.zeros(128), s1)), tbq.ConfigError, "only hold +1 and -1"),
        ("signs of 0.5", lambda: t4(signs=(s1 * 0.5, s1)), tbq.ConfigError, "only hold +1 and -1"),
        ("signs1 too short", lambda: t4(signs=(s1[:64], s1)), tbq.ConfigError, "signs1 has 64 entries"),
        ("signs2 too short", lambda: t4(signs=(s1, s1[:64])), tbq.ConfigError, "signs2 has 64"),
        ("both signs of 64", lambda: t4(signs=(s1[:64], s1[:64])), tbq.ConfigError, "128"),
        ("signs 2-D", lambda: t4(signs=(s1.reshape(2, 64), s1)), tbq.ConfigError, "1-D"),
        (
            "signs not power of two",
            lambda: RandomizedHadamard(np.ones(100), np.ones(100)),
            tbq.ConfigError,
            "power-of-two",
        ),
        ("one sign vector", lambda: t4(signs=s1), tbq.ConfigError, "signs must be"),
        ("signs dict keys", lambda: t4(signs={"signs1": s1}), tbq.ConfigError, "exactly the keys"),
        ("seed n not power of two", lambda: signs_from_seed(0, 100), tbq.TbqValueError, "power of two"),
    ]


BAD_CALLS = _bad_calls()


@pytest.mark.parametrize("case", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_table(case):
    """Each bad input gets a tbq exception of the documented type (listed in docs/robustness.md)."""
    _, call, exc_type, fragment = case
    with pytest.raises(exc_type) as info_:
        call()
    assert isinstance(info_.value, tbq.TbqError)
    assert fragment in str(info_.value), str(info_.value)


# ---------------------------------------------------------------------------
# Regression tests for core bugs found by this fuzzing (fail until fixed)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["q4_0", "tbq3_0", "q8_0", "tbq4_0"])
def test_regression_numpy_backend_first_block_nonfinite_raises_nonfinite_error(fmt):
    """BUG 1: the NumPy backend raised a bare ValueError (reshape of 0 rows in the packer) instead of
    NonFiniteError when the first block of a work chunk holds NaN/Inf (Q4_0 and TBQ3_0)."""
    bs = tbq.format_info(fmt).block_size
    x = np.zeros(2 * bs, F32)
    x[0] = np.nan
    for backend in BACKENDS:
        with pytest.raises(NonFiniteError) as info_:
            codec(fmt, backend).encode(x)
        assert info_.value.block == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(PACKERS))
def test_regression_packers_accept_zero_rows(name, backend):
    """BUG 2: every packer raised ValueError ("cannot reshape array of size 0") on a zero-length leading axis."""
    pack, unpack, bits, per, nbytes = PACKERS[name]
    assert pack(np.zeros((0, per), np.uint8), backend=backend).shape == (0, nbytes)
    assert unpack(np.zeros((0, nbytes), np.uint8), backend=backend).shape == (0, per)


def test_regression_q4_0_negative_zero_block_same_bytes_on_both_backends():
    """BUG 3 (fixed in 8fffa57, zero blocks now follow ggml): an all -0.0 block gave fp16 0x0000 with
    the NumPy backend (m = x[0] = -0.0) and 0x8000 with numba (m kept its +0.0 start value)."""
    x = np.full(32, -0.0, F32)
    b = codec("q4_0", "numpy").encode(x)
    assert np.array_equal(codec("q4_0", "numba").encode(x), b)
    assert b[:2].tolist() == [0x00, 0x80]


@pytest.mark.parametrize("amax", [1e-37, 1e-39, 1e-40])
@pytest.mark.parametrize("fmt", Q_FORMATS)
def test_regression_tiny_block_same_bytes_on_both_backends(fmt, amax):
    """BUG 4: when 1/d overflows float32 (Q8_0: amax < ~3.7e-37, Q4_0: |m| < ~2.4e-38), x * (1/d) is
    +-Inf or NaN and the float-to-int conversion differs: NumPy and numba write different codes.
    Q8_0 agrees since cecc996 (numba's roundf rewrite); Q4_0 still differs: NumPy clamps +Inf to code 15,
    numba's int32(+Inf) is INT_MIN, giving code 0 (what ggml's C gives on x86). Decoded values agree
    up to the sign of zero (the fp16 scale is 0)."""
    x = np.zeros(32, F32)
    x[0], x[1], x[5] = amax, -amax / 2, amax
    assert np.array_equal(codec(fmt, "numba").encode(x), codec(fmt, "numpy").encode(x))


def test_regression_lloyd_max_6_bits_converges():
    """BUG 5 (fixed in 02fa357): lloyd_max accepted bits 1..8 but raised RuntimeError after 10**6
    iterations (~30 s) for bits >= 6. (8 bits is covered by test_lloyd_max_codebooks_are_sign_symmetric.)"""
    cb = tbq.codebooks.lloyd_max(6)
    assert cb.bits == 6 and np.array_equal(cb.centroids, -cb.centroids[::-1])


def test_long_profiles_freeze_the_survivors_of_full_collections():
    """conftest's gc callback (long fuzz runs only) freezes after a full collection and after nothing else."""
    import gc

    from conftest import _freeze_after_full_collections

    assert (_freeze_after_full_collections in gc.callbacks) == (settings().max_examples > 1000)
    before = gc.get_freeze_count()
    try:
        _freeze_after_full_collections("start", {"generation": 2})
        _freeze_after_full_collections("stop", {"generation": 1})
        assert gc.get_freeze_count() == before
        gc.collect(0)  # something young to freeze
        _ = [[] for _ in range(10)]
        _freeze_after_full_collections("stop", {"generation": 2})
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("run", ["fuzz_plan_100k.json"])
def test_robustness_md_pastes_the_committed_fuzz_run(run):
    """docs/robustness.md's table of the fuzz run is what run_fuzz.py --markdown prints for the committed results."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("run_fuzz", root / "benchmarks" / "run_fuzz.py")
    run_fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_fuzz)
    table = run_fuzz.markdown(json.loads((root / "benchmarks" / "results" / run).read_text()))
    assert table.strip() in (root / "docs" / "robustness.md").read_text()
