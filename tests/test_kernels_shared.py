"""The numba helpers several kernels share, against their definitions, bit for bit.

Each helper here serves two or more kernels that had their own copy of it (the rotated encoders' norm step and
scratch, the 8-index lane packer, PLANAR/ISO's rotations in both directions):
each is checked on its own against the NumPy statement of what every caller needs from it, on the inputs that
tell the callers' old copies apart (non-finite and overflowing blocks, the norm clamp, signed zeros).
"""

from __future__ import annotations

import numba
import numpy as np

from tbq import kernels
from tbq.formats import planar_iso_kernels as pk
from tbq.formats.planar_iso import pack_planes3
from tbq.packing import pack3
from tbq.packing_kernels import lane3, lanes_pack8

F32 = np.float32


@numba.njit
def _norms(x, g0, norm2, norm, scale, floor, eps):
    return kernels.lanes_norms(x, g0, norm2, norm, scale, floor, eps)


def test_lanes_norms_finds_the_first_nonfinite_block_and_makes_both_encoders_norms():
    """``bad`` is the first lane of the group whose block holds an inf or NaN (a finite block whose squares
    overflow is not bad), the group's block count when none does; ``norm = sqrt(norm2)``, and without ``floor``
    ``scale = 1/norm`` (0 at or below eps, +0 for an infinite norm), with ``floor`` the norm clamped to eps and
    ``scale`` untouched."""
    eps = F32(1e-10)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((45, 16)).astype(F32)
    x[32 + 3, 5] = F32(3e30)  # overflows norm2, finite: not bad
    x[32 + 6, 2] = np.inf
    x[32 + 8, 0] = np.nan
    x[32 + 1] = 0.0
    x[32 + 2] = F32(1e-12)  # norm below eps
    lanes = 16
    for g0, want_bad in ((0, 16), (16, 16), (32, 6), (40, 0)):
        L = min(lanes, x.shape[0] - g0)
        norm2 = np.zeros(lanes, F32)
        for j in range(x.shape[1]):  # the sequential float32 chain of lanes_sum_squares
            with np.errstate(over="ignore", invalid="ignore"):
                norm2[:L] = norm2[:L] + x[g0 : g0 + L, j] * x[g0 : g0 + L, j]
        want_norm = np.sqrt(norm2)
        for floor in (False, True):
            norm = np.full(lanes, -1.0, F32)
            scale = np.full(lanes, -1.0, F32)
            assert _norms(x, g0, norm2, norm, scale, floor, eps) == (want_bad if want_bad < L else L)
            if floor:
                np.testing.assert_array_equal(norm, np.where(want_norm > eps, want_norm, eps))
                assert (scale == -1.0).all()
            else:
                with np.errstate(divide="ignore"):
                    want_scale = np.where(want_norm > eps, F32(1) / want_norm, F32(0)).astype(F32)
                np.testing.assert_array_equal(norm, want_norm)
                np.testing.assert_array_equal(scale.view(np.uint32), want_scale.view(np.uint32))
    assert _norms(x, 32, np.full(16, np.inf, F32), np.empty(16, F32), np.empty(16, F32), False, eps) == 6
    scale = np.empty(16, F32)
    _norms(x, 0, np.full(16, np.inf, F32), np.empty(16, F32), scale, False, eps)
    assert (scale.view(np.uint32) == 0).all()  # 1/inf = +0


@numba.njit
def _pack8(K, which, P, p0):
    if which == 0:
        lanes_pack8(K, lane3, P, p0)
    else:
        lanes_pack8(K, pk.signs_byte, P, p0)


def test_lanes_pack8_is_each_lanes_3bit_lane_and_signs_bytes():
    """Column ``l`` of ``P`` (from row ``p0``) is what the NumPy packers make of column ``l`` of ``K``: TBQ3's
    24-bit lanes (:func:`tbq.packing.pack3`) and PLANAR3/ISO3's signs plane (:func:`pack_planes3`' last 16
    bytes); the rows before ``p0`` are not written."""
    rng = np.random.default_rng(1)
    K = rng.integers(0, 8, (128, 24)).astype(np.int32)
    P = np.full((16 + 5, 24), -7, np.int32)
    _pack8(K, 0, P, 5)
    assert (P[:5] == -7).all()
    for l in range(24):
        b = pack3(K[:, l].astype(np.uint8))
        assert P[5:, l].tolist() == [
            int(b[3 * g]) | int(b[3 * g + 1]) << 8 | int(b[3 * g + 2]) << 16 for g in range(16)
        ]
    P = np.full((32 + 16, 24), -7, np.int32)
    _pack8(K, 1, P, 32)
    assert (P[:32] == -7).all()
    np.testing.assert_array_equal(P[32:].T, pack_planes3(K.T)[:, 32:])


@numba.njit
def _rotate_lanes(c, s, w, x, y, z, u):
    g = np.empty_like(u[:2])
    q = np.empty_like(u)
    for l in range(u.shape[1]):
        g[0, l], g[1, l] = pk.givens_rotate(c, s, u[0, l], u[1, l])
        q[0, l], q[1, l], q[2, l], q[3, l] = pk.quat_rotate(w, x, y, z, u[0, l], u[1, l], u[2, l], u[3, l])
    return g, q


def test_the_rotations_are_the_specs_forward_lines_and_with_the_conjugate_its_inverse_lines():
    """:func:`givens_rotate` / :func:`quat_rotate` with ``(c, s)`` / ``q`` are the spec's forward expressions
    (``PlanarIso._forward``), and with ``(c, -s)`` / ``conj(q)`` its inverse ones (``_inverse``), bit for bit
    (the decoder's use), signed zeros included."""
    rng = np.random.default_rng(3)
    u = rng.standard_normal((4, 4000)).astype(F32)
    u[:, :8] = [[0.0, -0.0, 0.0, -0.0, 1.0, -1.0, 0.0, -0.0]] * 4
    u[1, 8:16] = -0.0
    for c, s, w, x, y, z in rng.standard_normal((20, 6)).astype(F32).tolist() + [[0.0, -0.0, 1.0, 0.0, -0.0, 0.0]]:
        c, s, w, x, y, z = (F32(v) for v in (c, s, w, x, y, z))
        g, q = _rotate_lanes(c, s, w, x, y, z, u)
        np.testing.assert_array_equal(g[0].view(np.uint32), (c * u[0] - s * u[1]).view(np.uint32))
        np.testing.assert_array_equal(g[1].view(np.uint32), (s * u[0] + c * u[1]).view(np.uint32))
        fwd = (
            ((w * u[0] - x * u[1]) - y * u[2]) - z * u[3],
            ((w * u[1] + x * u[0]) + y * u[3]) - z * u[2],
            ((w * u[2] - x * u[3]) + y * u[0]) + z * u[1],
            ((w * u[3] + x * u[2]) - y * u[1]) + z * u[0],
        )
        np.testing.assert_array_equal(q.view(np.uint32), np.stack(fwd).view(np.uint32))
        g, q = _rotate_lanes(c, -s, w, -x, -y, -z, u)
        np.testing.assert_array_equal(g[0].view(np.uint32), (c * u[0] + s * u[1]).view(np.uint32))
        np.testing.assert_array_equal(g[1].view(np.uint32), ((-s) * u[0] + c * u[1]).view(np.uint32))
        inv = (
            ((w * u[0] + x * u[1]) + y * u[2]) + z * u[3],
            ((w * u[1] - x * u[0]) - y * u[3]) + z * u[2],
            ((w * u[2] + x * u[3]) - y * u[0]) - z * u[1],
            ((w * u[3] - x * u[2]) + y * u[1]) - z * u[0],
        )
        np.testing.assert_array_equal(q.view(np.uint32), np.stack(inv).view(np.uint32))
