"""Regression target: the 3-bit shift bug (docs/formats.md, "The 3-bit shift bug").

An earlier TBQ3 packer OR-ed indices 3..7 of every 8-index lane into byte 0
(shift ``bit < 8 ? bit : 0``) and shifted by a negative amount into byte 1
(undefined in C; zero with the reference compiler), so bytes 1 and 2 of each
lane were never written. These tests pin the correct 24-bit lane layout, and
a faithful re-creation of the buggy packer proves they would catch it.
"""

import numpy as np
import pytest
from helpers import BACKENDS, assert_bits_equal, assert_bytes_equal, load_npz

import tbq
from tbq import packing

# --- the old packer, re-created -------------------------------------------------------


def buggy_pack3(idx: np.ndarray) -> np.ndarray:
    """The fork's original packer, bit for bit as it behaved with gcc on x86-64.

    For index ``t`` of a lane, ``bit = 3t``: ``qs[0] |= idx << (bit < 8 ? bit : 0)``
    (truncated to 8 bits), and for ``bit >= 8`` ``qs[1] |= idx >> (8 - bit)``, a
    negative shift that the reference build evaluated to 0.
    """
    idx = np.asarray(idx, dtype=np.uint8)
    lanes = idx.reshape(idx.shape[:-1] + (-1, 8)).astype(np.uint32)
    out = np.zeros(lanes.shape[:-1] + (3,), np.uint32)
    for t in range(8):
        bit = 3 * t
        out[..., 0] |= (lanes[..., t] << (bit if bit < 8 else 0)) & 0xFF
        # bit >= 8: qs[1] |= idx >> (8 - bit) -> negative shift count, observed as 0
    return out.astype(np.uint8).reshape(idx.shape[:-1] + (-1,))


def buggy_encode(x, codebook):
    """TBQ3_0 encoding with the buggy packer: correct scale and indices, wrong lanes."""
    q = tbq.quantize(x, "tbq3_0", codebook=codebook, backend="numpy")
    idx = packing.unpack3(q[:, 2:], backend="numpy")
    return np.concatenate([q[:, :2], buggy_pack3(idx)], axis=1)


# --- the checks ------------------------------------------------------------------------------


def known_patterns():
    """(indices, expected bytes) for one lane."""
    cases = [(list(range(8)), [0x88, 0xC6, 0xFA]), ([7] * 8, [0xFF, 0xFF, 0xFF]), ([0] * 8, [0, 0, 0])]
    for pos in range(8):  # a single non-zero index in each position, 3..7 included
        for v in (1, 5, 7):
            idx = [0] * 8
            idx[pos] = v
            lane = v << (3 * pos)
            cases.append((idx, [lane & 0xFF, (lane >> 8) & 0xFF, lane >> 16]))
    return cases


def check_known_patterns(pack) -> list:
    """Return the failing patterns of packer ``pack``."""
    fails = []
    for idx, expected in known_patterns():
        got = pack(np.array(idx, np.uint8)).tolist()
        if got != expected:
            fails.append((idx, expected, got))
    return fails


def all_lane_bytes() -> np.ndarray:
    """Every 24-bit lane value as 3 little-endian bytes: shape (2**24 * 3,)."""
    lanes = np.arange(1 << 24, dtype=np.uint32)
    return np.stack([lanes & 0xFF, (lanes >> 8) & 0xFF, lanes >> 16], axis=-1).astype(np.uint8).reshape(-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_known_lane_patterns(backend):
    assert check_known_patterns(lambda i: packing.pack3(i, backend=backend)) == []


def test_position_3_to_7_each_alone_lands_in_its_own_bits():
    for pos in range(3, 8):
        idx = np.zeros(8, np.uint8)
        idx[pos] = 7
        b = packing.pack3(idx)
        lane = int(b[0]) | int(b[1]) << 8 | int(b[2]) << 16
        assert lane == 7 << (3 * pos), pos
        assert packing.unpack3(b).tolist() == idx.tolist()


def test_exhaustive_all_2_24_lanes_numba():
    """All 16,777,216 lane values through the numba packers, once: index 8g+t is (L >> 3t) & 7, and pack3 inverts.

    (The one exhaustive run in the suite; the NumPy packers get a strided subset below and are
    compared with numba on random indices by tests/test_properties.py.)
    """
    lanes = np.arange(1 << 24, dtype=np.uint32)
    b = all_lane_bytes()
    idx = packing.unpack3(b, backend="numba")
    assert idx.shape == (8 << 24,)
    idx8 = idx.reshape(-1, 8)
    for t in range(8):
        assert np.array_equal(idx8[:, t], ((lanes >> np.uint32(3 * t)) & np.uint32(7)).astype(np.uint8)), t
    assert_bytes_equal(packing.pack3(idx, backend="numba"), b, "pack3(unpack3(lane))")


def test_strided_lanes_numpy():
    """Every 37th lane value (453,438 lanes: every 3-bit value at every position) through the NumPy packers."""
    lanes = np.arange(0, 1 << 24, 37, dtype=np.uint32)
    b = np.stack([lanes & 0xFF, (lanes >> 8) & 0xFF, lanes >> 16], axis=-1).astype(np.uint8).reshape(-1)
    idx = packing.unpack3(b, backend="numpy").reshape(-1, 8)
    for t in range(8):
        assert np.array_equal(idx[:, t], ((lanes >> np.uint32(3 * t)) & np.uint32(7)).astype(np.uint8)), t
        assert set(np.unique(idx[:, t]).tolist()) == set(range(8))
    assert_bytes_equal(packing.pack3(idx.reshape(-1), backend="numpy"), b, "pack3(unpack3(lane))")


@pytest.mark.parametrize("suffix,codebook", [("", "turboq-mtp"), ("_fitted", "lloyd-max")])
def test_recreation_is_faithful_to_the_fork(suffix, codebook):
    z = load_npz("tbq3_buggy_vs_fixed__strict")
    assert_bytes_equal(buggy_encode(z["x"], codebook), z["q_buggy" + suffix], "re-created buggy packer")
    assert_bytes_equal(tbq.quantize(z["x"], "tbq3_0", codebook=codebook), z["q_fixed" + suffix], "fixed packer")
    # the reference's own reading of the buggy bytes
    assert_bytes_equal(packing.unpack3(z["q_buggy" + suffix][:, 2:]), z["idx_unpacked_from_buggy" + suffix])
    assert_bytes_equal(packing.unpack3(z["q_fixed" + suffix][:, 2:]), z["idx_true" + suffix])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("suffix,codebook", [("", "turboq-mtp"), ("_fitted", "lloyd-max")])
def test_decoding_buggy_and_fixed_bytes_matches_the_fork(suffix, codebook, backend):
    z = load_npz("tbq3_buggy_vs_fixed__strict")
    for which in ("buggy", "fixed"):
        y = tbq.dequantize(z[f"q_{which}{suffix}"], "tbq3_0", codebook=codebook, backend=backend)
        assert_bits_equal(y, z[f"y_{which}{suffix}"], which)


def test_the_checks_have_teeth():
    """The buggy packer fails every check above; positions 3..7 are what it loses."""
    fails = check_known_patterns(buggy_pack3)
    assert [0, 1, 2, 3, 4, 5, 6, 7] in [f[0] for f in fails]
    failing_positions = {f[0].index(max(f[0])) for f in fails if sum(1 for v in f[0] if v) == 1}
    assert failing_positions >= {2, 3, 4, 5, 6, 7}  # position 2 loses its high bit for v >= 4
    b = all_lane_bytes()[: 3 * 4096]
    assert not np.array_equal(buggy_pack3(packing.unpack3(b)), b)
    z = load_npz("tbq3_buggy_vs_fixed__strict")
    lost = packing.unpack3(buggy_encode(z["x"], "turboq-mtp")[:, 2:]).reshape(16, 16, 8) != z["idx_true"].reshape(
        16, 16, 8
    )
    per_position = lost.mean(axis=(0, 1))
    assert per_position[1] == 0  # index 1 survives
    assert np.all(per_position[3:] > 0.5)  # indices 3..7 are read back as 0 whenever they were not 0
