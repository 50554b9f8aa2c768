"""numba twins of :mod:`tbq.formats.fp4` (MXFP4, NVFP4): same bytes, same float32 bits.

Value selection: the spec's literal search (the first code minimising
``|float32(V[i] * d) - x|``) is replaced by counting the midpoints ``m * d``
(m = 0.5, 1.5, 2.5, 3.5, 5, 7, 10) strictly below ``|x|`` and adding the sign
bit 8 when the count is not 0. The two agree bit for bit: between adjacent
grid values ``g_i < g_{i+1}`` (``g_{i+1} <= 2 g_i`` for i >= 1) both
differences ``|x| - g_i`` and ``g_{i+1} - |x|`` are exact (Sterbenz; for i = 0
``|x| - 0`` is exact and ``d - |x| > |x|`` below d/2), so "``err_{i+1} <
err_i``" is exactly "``|x| > midpoint``", an exact tie keeping the smaller
magnitude; a negative code's error is never below the matching positive
code's, and the zero codes 0/8 tie, so code 0 wins. Above the top grid value
the differences are inexact for very large ``|x|``, and the kernel counts the
rounded ties there (see ``_codes``). ``m * d`` is exact (d a
power of two, or a 4-bit UE4M3 value). Where ``V * d`` overflows float32 (MXFP4
e = 253, and the wrapped e >= 254 of the undefined case) its error is inf and
never wins: its threshold is +inf. NVFP4's ``dd = 0`` makes every error
``|x|``: code 0 (thresholds +inf). tests/test_format_fp4.py compares the
kernels with the literal search around every midpoint of every scale.

Every loop over values has a run-time trip count and a branch-free body (so it
vectorises); the block maximum is taken on uint32 bit patterns.
"""

from __future__ import annotations

import numpy as np

from ..kernels import STATUS_NONFINITE, STATUS_OK, STATUS_UNDEFINED, f32_bits, jit, reader_blocks, reader_out
from ..packing_kernels import hi4, lo4, pair4
from .fp4 import _HALF, _VF, F32, _0, _6, _448, _512, e8m0_half, ue4m3_to_f32

_INF = F32(np.inf)
_FLT_MAX = F32(3.4028234663852886e38)
_NONFINITE_BITS = np.uint32(0x7F800000)
_ABS = np.uint32(0x7FFFFFFF)

# midpoints of the magnitude grid 0, 1, 2, 3, 4, 6, 8, 12 and the grid value above each
_T0, _T1, _T2, _T3, _T4, _T5, _T6 = F32(0.5), F32(1.5), F32(2.5), F32(3.5), F32(5.0), F32(7.0), F32(10.0)
_G1, _G2, _G3, _G4, _G5, _G6, _G7 = F32(1.0), F32(2.0), F32(3.0), F32(4.0), F32(6.0), F32(8.0), F32(12.0)

#: half(e) of every E8M0 byte; ue4m3_to_fp32 of every byte (global arrays: frozen into the code, as ``_VF``,
#: kvalues_mxfp4 as float32).
_HALF_E = e8m0_half(np.arange(256, dtype=np.uint8)).copy()
_DD = ue4m3_to_f32(np.arange(256, dtype=np.uint8)).copy()


@jit
def _f32(bits):
    return np.uint32(bits).view(np.float32)


@jit
def _amax_bits(xr, lo, hi):
    """Largest |x| bit pattern of ``xr[lo:hi]`` (uint32 order = |x| order for finite values; Inf/NaN sort above)."""
    m = np.uint32(0)
    for j in range(lo, hi):
        a = f32_bits(xr[j]) & _ABS
        m = a if a > m else m
    return m


@jit
def _thr(d, g, m):
    """Threshold ``m * d`` (exact) below grid value ``g * d``, or +inf where ``g * d`` overflows float32."""
    return m * d if g * d <= _FLT_MAX else _INF


@jit
def _gt(a, t):
    return np.int32(1) if a > t else np.int32(0)


@jit
def _eq(a, b):
    return np.int32(1) if a == b else np.int32(0)


@jit
def _codes(xr, lo, hi, d, c):
    """Codes of ``xr[lo:hi]`` into ``c[0:hi-lo]`` for grid ``V * d`` (d > 0); the literal argmin's result (module docstring)."""
    t0 = _thr(d, _G1, _T0)
    t1 = _thr(d, _G2, _T1)
    t2 = _thr(d, _G3, _T2)
    t3 = _thr(d, _G4, _T3)
    t4 = _thr(d, _G5, _T4)
    t5 = _thr(d, _G6, _T5)
    t6 = _thr(d, _G7, _T6)
    top = _G7 * d
    g0, g1, g2, g3, g4, g5, g6 = _0, _G1 * d, _G2 * d, _G3 * d, _G4 * d, _G5 * d, _G6 * d
    for j in range(lo, hi):
        v = xr[j]
        a = abs(v)
        mag = _gt(a, t0) + _gt(a, t1) + _gt(a, t2) + _gt(a, t3) + _gt(a, t4) + _gt(a, t5) + _gt(a, t6)
        # Beyond the top grid value the differences |x| - g are no longer exact: when |x| is
        # ~2**22 times the grid or more, fl(|x| - g) rounds equal for the top values, and the
        # literal search keeps the FIRST (smallest-magnitude) of the tied minima; if even
        # fl(|x| - 0) ties, every code ties and code 0 wins. (NVFP4 reaches this when a
        # sub-block scale saturates at 448.) The minimum is fl(|x| - 12d); count how many
        # smaller grid values tie with it.
        e = a - top
        ties = (
            _eq(a - g0, e)
            + _eq(a - g1, e)
            + _eq(a - g2, e)
            + _eq(a - g3, e)
            + _eq(a - g4, e)
            + _eq(a - g5, e)
            + _eq(a - g6, e)
        )
        mag = mag if not (a > t6) else np.int32(7) - ties
        neg = np.int32(8) if (v < _0 and mag != 0) else np.int32(0)  # -0 and values rounding to 0: code 0
        c[j - lo] = mag + neg


# --- MXFP4 --------------------------------------------------------------------------


@jit
def e8m0_E(A, bounds):
    """``floor(log2f(amax))`` from the bit pattern ``A > 0`` of a finite amax, via :func:`tbq.formats.fp4.e8m0_boundaries`.

    A normal amax of binary exponent b has E = b, or b + 1 from the first float
    of its binade whose correctly rounded log2f reaches b + 1 (one compare).
    Subnormal amax (always the undefined case) counts the boundaries below it.
    """
    f = np.int32(A >> np.uint32(23))
    if f != 0:
        b = f - np.int32(127)
        return b + (np.int32(1) if A >= bounds[b + 150] else np.int32(0))  # noqa: SIM300 (A is a variable, the amax bit pattern)
    E = np.int32(-150)
    for i in range(25):
        if bounds[i] <= A:
            E += np.int32(1)
    return E


@jit
def encode_mxfp4(x, out, raise_overflow, bounds):
    n, bs = x.shape
    half = bs // 2
    c = np.empty(bs, np.int32)
    for b in range(n):
        xr = x[b]
        A = _amax_bits(xr, 0, bs)
        if A >= _NONFINITE_BITS:
            return b, STATUS_NONFINITE
        e = np.int32(0)
        if A != np.uint32(0):  # noqa: SIM300 (A is a variable, the amax bit pattern)
            E = e8m0_E(A, bounds)
            if E <= np.int32(-126) and raise_overflow:  # noqa: SIM300 (E is a variable, the exponent floor(log2 amax))
                return b, STATUS_UNDEFINED
            e = (E + np.int32(125)) & np.int32(255)  # C: (uint8_t)(E - 2 + 127); below 0 x86-64 gcc wraps mod 256
        d = _HALF_E[e]
        _codes(xr, 0, bs, d, c)
        orow = out[b]
        orow[0] = np.uint8(e)
        for j in range(half):
            orow[1 + j] = pair4(c[j], c[j + half])
    return -1, STATUS_OK


@jit
def decode_mxfp4(data, out):
    half = out.shape[1] // 2
    for b in range(data.shape[0]):
        src = data[b]
        dst = out[b]
        d = _HALF_E[src[0]]
        for j in range(half):
            v = src[1 + j]
            dst[j] = _VF[lo4(v)] * d
            dst[j + half] = _VF[hi4(v)] * d
    return out


# --- NVFP4 --------------------------------------------------------------------------


@jit
def ue4m3(s):
    """``ggml_fp32_to_ue4m3`` of a float32 (the bit rule: half up, subnormal clamp at 7, 0x7E from 248)."""
    if not (s > _0):  # zero, negative, NaN
        return np.int32(0)
    if s > _448:
        s = _448
    bits = f32_bits(s)
    ue = np.int32((bits >> np.uint32(23)) & np.uint32(255)) - np.int32(120)  # exponent - 127 + 7
    if ue <= 0:
        t = s * _512 + _HALF  # two roundings; the product is exact, so a contraction could not change it either
        M = np.int32(t)  # trunc; 0.5 <= t < 8.5
        if M > 7:
            M = np.int32(7)
        return M if M >= 1 else np.int32(0)
    if ue >= 15:
        return np.int32(0x7E)
    M = np.int32((bits >> np.uint32(20)) & np.uint32(7)) + np.int32((bits >> np.uint32(19)) & np.uint32(1))
    if M > 7:
        M = np.int32(0)
        ue += np.int32(1)
        if ue >= 15:
            return np.int32(0x7E)
    return (ue << 3) | M


@jit
def encode_nvfp4(x, out):
    n, bs = x.shape
    sub = bs // 4
    hs = sub // 2
    c = np.empty(sub, np.int32)
    A = np.empty(4, np.uint32)
    for b in range(n):
        xr = x[b]
        top = np.uint32(0)
        for s in range(4):
            A[s] = _amax_bits(xr, s * sub, s * sub + sub)
            top = A[s] if A[s] > top else top
        if top >= _NONFINITE_BITS:
            return b, STATUS_NONFINITE
        orow = out[b]
        for s in range(4):
            u = ue4m3(_f32(A[s]) / _6)
            dd = _DD[u]
            if dd > _0:
                _codes(xr, s * sub, s * sub + sub, dd, c)
            else:
                for j in range(sub):  # every error is |x|: the first code, 0
                    c[j] = np.int32(0)
            orow[s] = np.uint8(u)
            for j in range(hs):
                orow[4 + s * hs + j] = pair4(c[j], c[j + hs])
    return -1, STATUS_OK


@jit
def decode_nvfp4(data, out):
    sub = out.shape[1] // 4
    hs = sub // 2
    for b in range(data.shape[0]):
        src = data[b]
        dst = out[b]
        for s in range(4):
            dd = _DD[src[s]]
            for j in range(hs):
                v = src[4 + s * hs + j]
                dst[s * sub + j] = _VF[lo4(v)] * dd
                dst[s * sub + hs + j] = _VF[hi4(v)] * dd
    return out


def attention_read_mxfp4(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): MXFP4 blocks by :func:`decode_mxfp4`."""
    decode_mxfp4(reader_blocks(src, n_blocks, 17), reader_out(dst, n_blocks, 32))


def attention_read_nvfp4(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader: NVFP4 blocks by :func:`decode_nvfp4`."""
    decode_nvfp4(reader_blocks(src, n_blocks, 36), reader_out(dst, n_blocks, 64))
