"""numba twins of :mod:`tbq.formats.fp8` (same bytes, same float32 bits).

The kernels run over the flat values (block size 1): ``x`` float32 (n,), the
codes ``q`` uint8 (n,), the decoded floats as their uint32 bit patterns (n,)
(a lookup in the instance's 256-entry table, so NaN bits are copied, never
passed through a float register).

Encoding converts chunks of :data:`CHUNK` values in one branch-free pass
(the float32 division ``x / s``, then :mod:`tbq.formats.fp8`'s integer
rounding of both the normal and the subnormal case, one selected) that also
keeps the largest ``|x|`` and ``|x / s|`` bit patterns (uint32 max
reductions, which vectorise). Only a chunk holding a non-finite input (or,
when raising, a value that overflows) is re-run value by value to stop at the
first offending value, reported as the block (block = value here).
"""

from __future__ import annotations

import numpy as np

from ..kernels import STATUS_NONFINITE, STATUS_OK, STATUS_SCALE_OVERFLOW, jit, reader_aux, reader_blocks, reader_out

F32 = np.float32

#: Values per convert chunk.
CHUNK = 4096

_ABS = np.uint32(0x7FFFFFFF)
_INF32 = np.uint32(0x7F800000)
_ONE = np.uint32(1)
_24 = np.uint32(24)
_SIGN8 = np.uint32(0x80)


@jit
def _code(v, shift, rebias, min_normal, sub_add, sub_add_f, over_bits, over_code):
    """The FP8 byte of float32 ``v`` (see :func:`tbq.formats.fp8.fp8_codes`)."""
    u = F32(v).view(np.uint32)
    sign = (u >> _24) & _SIGN8
    a = u & _ABS
    normal = ((a + ((_ONE << (shift - _ONE)) - _ONE) + ((a >> shift) & _ONE)) >> shift) - rebias
    sub = F32(abs(F32(v)) + sub_add_f).view(np.uint32) - sub_add
    code = sub if a < min_normal else normal
    code = over_code if a >= over_bits else code
    return np.uint8(code | sign)


@jit
def _convert(x, q, s, shift, rebias, min_normal, sub_add, sub_add_f, over_bits, over_code):
    """Convert a chunk; returns the largest |x| and |x / s| bit patterns."""
    amax = np.uint32(0)
    vmax = np.uint32(0)
    for j in range(x.shape[0]):
        xa = F32(x[j]).view(np.uint32) & _ABS
        v = F32(F32(x[j]) / s)
        va = F32(v).view(np.uint32) & _ABS
        amax = xa if xa > amax else amax
        vmax = va if va > vmax else vmax
        q[j] = _code(v, shift, rebias, min_normal, sub_add, sub_add_f, over_bits, over_code)
    return amax, vmax


@jit
def encode(x, q, s, raise_overflow, saturate, shift, rebias, min_normal, sub_add, max_code, nosat_code, over_bits):
    n = x.shape[0]
    s = F32(s)
    sub_add_f = F32(np.uint32(sub_add).view(np.float32))
    over_code = max_code if saturate else nosat_code
    for c in range(0, n, CHUNK):
        e = min(c + CHUNK, n)
        amax, vmax = _convert(x[c:e], q[c:e], s, shift, rebias, min_normal, sub_add, sub_add_f, over_bits, over_code)
        if amax >= _INF32 or (raise_overflow and vmax >= over_bits):
            for j in range(c, e):  # slow path: stop at the first offending value
                if (F32(x[j]).view(np.uint32) & _ABS) >= _INF32:
                    return j, STATUS_NONFINITE
                if raise_overflow and (F32(F32(x[j]) / s).view(np.uint32) & _ABS) >= over_bits:
                    return j, STATUS_SCALE_OVERFLOW
    return -1, STATUS_OK


@jit
def decode(q, out, table):
    """``out`` (uint32 bit patterns) = ``table[q]``; the table holds ``float32(fp8) * s`` for every byte."""
    for j in range(q.shape[0]):
        out[j] = table[np.int64(q[j])]
    return out


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` values by
    :func:`decode`, ``aux`` the 256 scaled values (either FP8 format: one reader, its table)."""
    decode(
        reader_blocks(src, n_blocks, 1).reshape(n_blocks),
        reader_out(dst, n_blocks, 1).reshape(n_blocks).view(np.uint32),
        reader_aux(aux, n_aux).view(np.uint32),
    )
