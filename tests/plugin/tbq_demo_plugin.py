"""A complete tbq format defined outside the package, in one file: the plugin recipe of docs/architecture.md.

DEMO_Q8R: 32 values -> fp16 scale ``d = amax / 127`` + 32 int8 codes ``rint(x / d)`` (a float32 division, ties to
even; 0 when d is 0), 34 bytes; decode ``code * fp16(d)``. It differs from ggml's Q8_0 in the division and the tie
rule on purpose, so nothing in tbq already computes it.

Registering: this package's metadata has an entry point ``demo_q8r = "tbq_demo_plugin"`` in the group
``tbq.formats`` (and ``tbq.demo_q8r`` in ``numcodecs.codecs`` / ``zarr.codecs`` for fresh-process Zarr reads).
Importing tbq imports this module; defining the class registers the format. Run as a program it is also a
kernel for ``tbq check --exec "python -c 'import sys, tbq_demo_plugin as p; sys.exit(p._main(sys.argv[1:]))' {op}
{in} {out}"`` (imported, not run as ``__main__``, which would define the format a second time): it quantizes or
dequantizes raw little-endian rows with the NumPy reference below.
"""

from __future__ import annotations

import numpy as np

from tbq.backend import STATUS_NONFINITE, STATUS_OK, STATUS_SCALE_OVERFLOW
from tbq.formats.base import Field, Format, FormatInfo, band
from tbq.half import F16_OVERFLOW, f16_table

F32 = np.float32
_127 = F32(127.0)
_F16_OVER = F32(F16_OVERFLOW)


class DEMO_Q8R(Format):
    info = FormatInfo(
        name="demo_q8r",
        block_size=32,
        type_size=34,
        rotated=False,
        index_bits=8,
        description="demo plugin: fp16 scale amax/127 + 32 int8 codes rint(x/d)",
        code=200,
        layout=(Field("d", 0, 2, "f16", "scale amax/127"), Field("qs", 2, 32, "int8", "codes rint(x/d)")),
    )

    # -- the spec (NumPy) ----------------------------------------------------------------
    def reference_encode(self, x):
        d = np.max(np.abs(x), axis=1) / _127
        with np.errstate(all="ignore"):
            v = np.where(d[:, None] > 0, x / np.where(d > 0, d, F32(1))[:, None], F32(0)).astype(F32)
        out = np.empty((x.shape[0], 34), np.uint8)
        with np.errstate(over="ignore"):
            out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
        out[:, 2:] = np.rint(v).astype(np.int8).view(np.uint8)
        return out, {"d": d, "v": v}

    def reference_decode(self, data):
        d = f16_table()[np.ascontiguousarray(data[:, :2]).view("<u2")[:, 0]]
        return data[:, 2:].view(np.int8).astype(F32) * d[:, None]

    # -- numba twins (compiled on first use, with tbq's jit settings: never fastmath) ---------
    def kernel_encode(self, x, out, raise_overflow):
        return _kernels()[0](x, out, raise_overflow, f16_table())

    def kernel_decode(self, data, out):
        _kernels()[1](data, out, f16_table())

    # -- fragility: v = x / d rounds to even at the half-integers --------------------------------
    def fragile_values(self, trace, k, ulp_floor=None):
        return band(np.rint, trace["v"], k)


def _encode_py(x, out, raise_overflow, table):
    for b in range(x.shape[0]):
        amax = F32(0.0)
        for j in range(32):
            a = abs(x[b, j])
            if not (a <= F32(3.4028234663852886e38)):
                return b, STATUS_NONFINITE
            amax = a if a > amax else amax
        d = amax / _127
        if raise_overflow and not (d < _F16_OVER):
            return b, STATUS_SCALE_OVERFLOW
        h = f32_to_f16_bits(d)  # noqa: F821 - tbq's numba fp16 rounding, bound in _kernels()
        out[b, 0] = np.uint8(h & np.uint16(0xFF))
        out[b, 1] = np.uint8(h >> np.uint16(8))
        for j in range(32):
            v = x[b, j] / d if d > F32(0.0) else F32(0.0)
            out[b, 2 + j] = np.uint8(np.int8(np.rint(v)) & np.int8(-1))
    return -1, STATUS_OK


def _decode_py(data, out, table):
    for b in range(data.shape[0]):
        d = table[np.int64(data[b, 0]) | (np.int64(data[b, 1]) << 8)]
        for j in range(32):
            out[b, j] = F32(np.int8(data[b, 2 + j])) * d


_KERNELS: list = []


def _kernels():
    if not _KERNELS:
        import numba as nb

        jit = nb.njit(nogil=True, fastmath=False, error_model="numpy", boundscheck=False)
        from tbq.kernels import f32_to_f16_bits

        g = _encode_py.__globals__
        g["f32_to_f16_bits"] = f32_to_f16_bits
        _KERNELS.extend([jit(_encode_py), jit(_decode_py)])
    return _KERNELS


def _main(argv):
    """``python tbq_demo_plugin.py {quantize|dequantize} IN OUT``: the NumPy reference on raw little-endian rows."""
    op, src, dst = argv
    f = DEMO_Q8R()
    if op == "quantize":
        x = np.fromfile(src, "<f4").reshape(-1, 32)
        f.reference_encode(x)[0].tofile(dst)
    else:
        y = f.reference_decode(np.fromfile(src, np.uint8).reshape(-1, 34))
        y.astype("<f4").tofile(dst)
    return 0
