"""numba twins of :mod:`tbq.formats.planar_iso` (same bytes, same float32 bits).

Like :mod:`tbq.formats.tbq_kernels`, the kernels work on ``lanes`` blocks at a
time, transposed into a scratch array T[j, lane]: coordinate j of every block
in the group sits in one row. Each Givens pair (rows 2p, 2p+1) and each
quaternion group (rows 4g..4g+3) is then a plain SIMD loop over lanes, and
the spec's sequential sums (sum of x_j^2, sum of C[idx_j]^2) stay sequential
in j for each block while ``lanes`` independent chains run side by side. No
rounding changes: every block sees exactly the spec's operations in the
spec's order. The lane count is a run-time value on purpose (a literal trip
count gets fully unrolled and then not vectorised).

No FMA: the kernels are compiled without fastmath, so ``c*u0 - s*u1`` is a
rounded product, a rounded product and a rounded difference, as in the strict
C build (an FMA would change decoded bits in every value; see the spec's FMA
section).

Rotation tables come in as four float32 arrays: (cos, sin, -sin, unused) for
the Givens rotation, (w, x, y, z) for the quaternions.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..intrinsics import TARGET_AVX512VL, prefetch
from ..kernels import (
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SCALE_OVERFLOW,
    jit,
    jit_inline,
    lanes_index,
    lanes_load,
    lanes_norms,
    lanes_scratch,
    lanes_store_scales,
    lanes_sum_squares,
    load_f16,
    reader_aux,
    reader_blocks,
    reader_out,
)
from ..packing_kernels import hi4, lanes_pack8, lanes_store_nibbles, lo4

F32 = np.float32
_0 = F32(0.0)
_EPS_NORM = F32(1e-10)  # 1e-10f = 0x2edbe6ff, the C constant

LANES = 32


# --- the 3-bit planes: lane helpers of this layout (not in packing_kernels: only these formats use it) ---


@jit
def qs_byte(i0, i1, i2, i3):
    """One ``qs`` byte: the low 2 bits of four consecutive indices, the first in the lowest bits."""
    return (np.int32(i0) & 3) | ((np.int32(i1) & 3) << 2) | ((np.int32(i2) & 3) << 4) | ((np.int32(i3) & 3) << 6)


@jit
def signs_byte(i0, i1, i2, i3, i4, i5, i6, i7):
    """One ``signs`` byte: bit 2 of eight consecutive indices, the first in bit 0."""
    return (
        ((np.int32(i0) >> 2) & 1)
        | (((np.int32(i1) >> 2) & 1) << 1)
        | (((np.int32(i2) >> 2) & 1) << 2)
        | (((np.int32(i3) >> 2) & 1) << 3)
        | (((np.int32(i4) >> 2) & 1) << 4)
        | (((np.int32(i5) >> 2) & 1) << 5)
        | (((np.int32(i6) >> 2) & 1) << 6)
        | (((np.int32(i7) >> 2) & 1) << 7)
    )


#: Plane and bit positions as int64 values, not integer literals: numba compiles a function once per literal
#: argument, and idx3_planes' eight call sites made eight specialisations of it
_I0, _I1, _I2, _I3, _I4, _I5, _I6, _I7 = (np.int64(i) for i in range(8))


@jit
def idx3_planes(q, sg, t, k):
    """Index of a 3-bit block: low 2 bits at position ``t`` (0..3) of qs byte ``q``, bit 2 at bit ``k`` (0..7) of ``sg``."""
    return ((np.int32(q) >> (2 * t)) & 3) | (((np.int32(sg) >> k) & 1) << 2)


def _lookup_planes_codegen(signs: bool):
    """Codegen of :func:`lookup_planes3_row` (``signs``: the qs and signs planes) and :func:`lookup_qs_row` (qs only)."""

    def codegen(context, builder, signature, args):
        w = 16 if TARGET_AVX512VL else 8  # lanes: a zmm register with AVX-512, else a ymm
        i32, i64 = ir.IntType(32), ir.IntType(64)
        vf, vi = ir.VectorType(ir.FloatType(), w), ir.VectorType(i32, w)
        s_, d_, t_ = (context.make_array(signature.args[k])(context, builder, args[k]) for k in (0, 2, 4))
        sp = builder.gep(s_.data, [context.cast(builder, args[1], signature.args[1], types.int64)])
        dp = builder.gep(d_.data, [context.cast(builder, args[3], signature.args[3], types.int64)])
        name = "llvm.x86.avx512.permvar.sf.512" if w == 16 else "llvm.x86.avx2.permps"
        perm = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vi]), name)

        def splat(x, ty):
            v = builder.insert_element(ir.Constant(ty, ir.Undefined), x, ir.Constant(i32, 0))
            return builder.shuffle_vector(v, v, ir.Constant(vi, [0] * w))

        sc = splat(args[5], vf)
        # the table repeated to the w entries the permute indexes with the low log2(w) bits: the bits above an
        # index's (the next index's) pick the same value
        n_tab = 8 if signs else 4
        tn = builder.load(builder.bitcast(t_.data, ir.VectorType(ir.FloatType(), n_tab).as_pointer()), align=4)
        table = builder.shuffle_vector(tn, tn, ir.Constant(vi, [t % n_tab for t in range(w)]))
        three = ir.Constant(vi, [3] * w)
        if TARGET_AVX512VL:  # bits 0-1 of a, the others of b: one vpternlogd (LLVM makes an and and a ternlog)
            ternlog = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vi, [vi, vi, vi, i32]), "llvm.x86.avx512.pternlog.d.512"
            )

            def select(a, b):
                return builder.call(ternlog, [a, b, three, ir.Constant(i32, 0xE4)])  # c ? a : b, bit by bit
        else:

            def select(a, b):
                return builder.or_(builder.and_(a, three), builder.and_(b, ir.Constant(vi, [~3] * w)))

        def word(off):  # the 4 bytes at payload offset ``off`` (little-endian), in all lanes
            x = builder.load(builder.bitcast(builder.gep(sp, [ir.Constant(i64, off)]), i32.as_pointer()), align=1)
            return splat(x, vi)

        for h in range(8):  # 16 indices 16h + t: qs bytes 4h .. 4h+3 and signs bytes 2h, 2h+1 (payload 32 + 2h ..)
            vq = word(4 * h)  # index 16h + t's low 2 bits at bits 2t
            if signs:  # its bit 2 at bit 16 + t: the word at 30 + 2h ends with signs bytes 2h, 2h+1 (and never
                vs = word(30 + 2 * h)  # reaches past the 48 payload bytes)
            for e in range(0, 16, w):  # 16 indices a register, or 8 and 8
                idx = builder.lshr(vq, ir.Constant(vi, [2 * (t + e) for t in range(w)]))
                if signs:
                    idx = select(idx, builder.lshr(vs, ir.Constant(vi, [14 + t + e for t in range(w)])))
                out = builder.fmul(builder.call(perm, [table, idx]), sc)
                dst = builder.gep(dp, [ir.Constant(i64, 16 * h + e)])
                builder.store(out, builder.bitcast(dst, vf.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def lookup_planes3_row(typingctx, src, soff, dst, doff, table, scale):
    """``dst.flat[doff + j] = table[idx_j] * scale`` for the 128 indices of the 3-bit planes at ``src.flat[soff:]``
    (32 qs bytes, then 16 signs bytes; index ``j`` is :func:`idx3_planes` of qs byte ``j // 4`` at ``j % 4`` and
    signs byte ``j // 8`` at bit ``j % 8``).

    For AVX2 targets only (:data:`tbq.kernels.TARGET_AVX2`; callers keep the :func:`idx3_planes` loop otherwise),
    the plane twin of :func:`tbq.kernels.lookup8_row`: per 16 indices, the qs word of bytes ``4h .. 4h + 3`` and
    the word whose upper half is signs bytes ``2h``, ``2h + 1`` (bytes ``30 + 2h ..`` of the payload: nothing
    past the block is read) are broadcast and shifted by ``2t`` and by ``14 + t``; bits 0-1 of the first and bit 2
    of the second index ``table`` (repeated in the permute's entries: the bits above 2 pick the same value) and
    each value is multiplied by ``scale`` (one IEEE float32 multiply per value, the scalar loop's operands in its
    order: the same bits). With AVX-512VL (:data:`tbq.kernels.TARGET_AVX512VL`) 16 indices are one register: one
    ``vpternlogd`` bit select and one ``vpermps`` in 16 entries; with AVX2, 8 and 8: an and, an and and an or,
    ``vpermps`` in 8 entries. Per-value extraction (:func:`idx3_planes`' loop) took 5x the time of the AVX-512 path.
    ``src``, ``dst`` and ``table`` are C-contiguous (flat offsets).
    """
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)
    return sig, _lookup_planes_codegen(True)


@intrinsic
def lookup_qs_row(typingctx, src, soff, dst, doff, table, scale):
    """:func:`lookup_planes3_row` for the qs plane alone (128 2-bit indices in 32 bytes, four a byte, the first
    in the lowest bits: turbo2's layout) and a 4-entry ``table``: the same qs words, no signs and no mask (the table
    is repeated in the permute's entries, so the bits above an index's pick the same value)."""
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)
    return sig, _lookup_planes_codegen(False)


# --- the rotations ---------------------------------------------------------------------------------


@jit_inline
def givens_rotate(c, s, u0, u1):
    """A Givens pair rotated by ``(c, s)``: ``(c*u0 - s*u1, s*u0 + c*u1)``, the C expressions' roundings. The
    encoder passes ``(cos, sin)``; the decoder's inverse passes ``(cos, -sin)``: ``c*q0 - (-s)*q1`` is
    ``c*q0 + s*q1`` bit for bit (``(-s)*q == -(s*q)`` and ``a - (-b) == a + b`` in IEEE arithmetic)."""
    return c * u0 - s * u1, s * u0 + c * u1


@jit_inline
def quat_rotate(w, qx, qy, qz, u0, u1, u2, u3):
    """A group of four rotated by the quaternion ``(w, qx, qy, qz)`` (``q (x) u``), each line in the C
    expression's order. The decoder's inverse passes the conjugate ``(w, -qx, -qy, -qz)``: the negated products
    give the C inverse's lines bit for bit (see :func:`givens_rotate`)."""
    return (
        ((w * u0 - qx * u1) - qy * u2) - qz * u3,
        ((w * u1 + qx * u0) + qy * u3) - qz * u2,
        ((w * u2 - qx * u3) + qy * u0) + qz * u1,
        ((w * u3 + qx * u2) - qy * u1) + qz * u0,
    )


# --- encode ------------------------------------------------------------------------------------


@jit
def encode(x, out, bits, quat, thresholds, centroids_sq, ta, tb, tc, td, raise_overflow, lanes):
    """PLANAR/ISO encoder (``quat`` False: Givens tables (cos, sin, -, -); True: (w, x, y, z)), ``lanes`` blocks at a time
    (``lanes`` a multiple of 8: the lane helpers of :mod:`tbq.kernels` work on 8 x 8 tiles and 8-lane columns).

    ``centroids_sq`` is ``C*C`` in float32, the exact terms of the recon sum.
    """
    nblk = x.shape[0]
    n = x.shape[1]
    nb = n // 4 + n // 8 if bits == 3 else n // 2  # payload bytes
    T, K, norm2, norm, scale, recon2 = lanes_scratch(n, lanes)
    xf = x.reshape(x.size)
    ones = np.ones(n, np.float32)  # the index kernels' per-channel factor: a product by 1 is exact
    P = np.zeros((nb if bits == 3 else 0, lanes), np.int32)  # PLANAR3/ISO3's bytes
    for g0 in range(0, nblk, lanes):
        L = min(lanes, nblk - g0)
        nxt = (g0 + lanes) * n  # the next group's first value: its cache lines are prefetched, 16 floats each
        # stage: transpose-in
        lanes_load(x, g0, T)
        # stage: norm
        # 1. norm^2: a sequential float32 sum per block (one chain per lane)
        lanes_sum_squares(T, norm2)
        # the first lane whose input is not finite, and 2. inv = 1/norm, or 0 when norm <= 1e-10 (norm = +inf
        # passes: 1/inf = +0, so u = +-0)
        bad = lanes_norms(x, g0, norm2, norm, scale, False, _EPS_NORM)
        # stage: rotate
        # 3. u = x * inv (rounded), then the rotation, each line in the C expression's order
        if quat:
            for g in range(n // 4):
                w, qx, qy, qz = ta[g], tb[g], tc[g], td[g]
                j = 4 * g
                for l in range(lanes):
                    sc = scale[l]
                    T[j, l], T[j + 1, l], T[j + 2, l], T[j + 3, l] = quat_rotate(
                        w, qx, qy, qz, T[j, l] * sc, T[j + 1, l] * sc, T[j + 2, l] * sc, T[j + 3, l] * sc
                    )
                for p in range(0, 4 * lanes, 16):  # spread over the pass (see tbq_kernels.encode)
                    prefetch(xf, nxt + lanes * j + p)
        else:
            for pr in range(n // 2):
                c, s = ta[pr], tb[pr]
                j = 2 * pr
                for l in range(lanes):
                    sc = scale[l]
                    T[j, l], T[j + 1, l] = givens_rotate(c, s, T[j, l] * sc, T[j + 1, l] * sc)
                for p in range(0, 2 * lanes, 16):
                    prefetch(xf, nxt + lanes * j + p)
        # stage: index
        # 4. idx = #{k : r >= t_k} (branch-free; equals the C nearest-centroid search, see the spec);
        # NaN r compares false everywhere: index 0, as in C; and 5. recon^2, a sequential float32 sum of
        # C[idx]^2 per block (C*C is the exact rounded product): kernels.lanes_index, r * 1 = r
        lanes_index(T, ones, thresholds, centroids_sq, K, recon2)
        # stage: pack+store
        # 6. the scales of the finite lanes (up to an overflow raised), then the indices of those lanes
        stop = lanes_store_scales(recon2, norm, out, g0, bad, raise_overflow, False, _EPS_NORM)
        if bits == 4:
            lanes_store_nibbles(K, out, g0, stop, 2)
        else:  # pack the indices of all lanes at once, then store block by block
            for k in range(n // 4):
                for l in range(lanes):
                    P[k, l] = qs_byte(K[4 * k, l], K[4 * k + 1, l], K[4 * k + 2, l], K[4 * k + 3, l])
            lanes_pack8(K, signs_byte, P, n // 4)
            for l in range(stop):
                orow = out[g0 + l]
                for k in range(nb):
                    orow[2 + k] = np.uint8(P[k, l])
        if stop < bad:
            return g0 + stop, STATUS_SCALE_OVERFLOW
        # stage: end
        if bad < L:
            return g0 + bad, STATUS_NONFINITE
    return -1, STATUS_OK


# --- decode ------------------------------------------------------------------------------------


@jit
def decode(data, out, bits, quat, centroids, ta, tb, tc, td, table, lanes):
    """PLANAR/ISO decoder, ``lanes`` blocks at a time: ``y = R^-1(C[idx]) * d``.

    Tables: (cos, sin, -sin, unused) for Givens, (w, x, y, z) for quaternions
    (the conjugate's negated x, y, z are folded into the line signs, which is
    bit-identical: ``a - (-b) == a + b`` and ``(-x)*v == -(x*v)``).
    """
    nblk = data.shape[0]
    n = out.shape[1]
    T = np.zeros((n, lanes), np.float32)
    Tf = T.reshape(n * lanes)
    D = np.zeros(lanes, np.float32)
    for g0 in range(0, nblk, lanes):
        L = min(lanes, nblk - g0)
        # stage: unpack
        for l in range(L):  # unpack and look up, transposing into T (flat pointer steps)
            row = g0 + l
            D[l] = load_f16(data, row, table)
            drow = data[row]
            p = l
            if bits == 4:
                for k in range(n // 2):
                    byte = drow[2 + k]
                    Tf[p] = centroids[lo4(byte)]
                    Tf[p + lanes] = centroids[hi4(byte)]
                    p += 2 * lanes
            else:
                o = 2 + n // 4
                for m in range(n // 8):  # 8 indices: qs bytes 2m, 2m+1 and signs byte m, unrolled by hand
                    qa = drow[2 + 2 * m]
                    qb = drow[3 + 2 * m]
                    sg = drow[o + m]
                    Tf[p] = centroids[idx3_planes(qa, sg, _I0, _I0)]
                    Tf[p + lanes] = centroids[idx3_planes(qa, sg, _I1, _I1)]
                    Tf[p + 2 * lanes] = centroids[idx3_planes(qa, sg, _I2, _I2)]
                    Tf[p + 3 * lanes] = centroids[idx3_planes(qa, sg, _I3, _I3)]
                    Tf[p + 4 * lanes] = centroids[idx3_planes(qb, sg, _I0, _I4)]
                    Tf[p + 5 * lanes] = centroids[idx3_planes(qb, sg, _I1, _I5)]
                    Tf[p + 6 * lanes] = centroids[idx3_planes(qb, sg, _I2, _I6)]
                    Tf[p + 7 * lanes] = centroids[idx3_planes(qb, sg, _I3, _I7)]
                    p += 8 * lanes
        for l in range(L, lanes):
            D[l] = _0
            for j in range(n):
                T[j, l] = _0
        # stage: rotate
        # R^-1 (the forward rotation by the conjugate: see decode's docstring), each line in the C expression's
        # order, then one rounded product with D
        if quat:
            for g in range(n // 4):
                w, nx, ny, nz = ta[g], -tb[g], -tc[g], -td[g]
                j = 4 * g
                for l in range(lanes):
                    dl = D[l]
                    f0, f1, f2, f3 = quat_rotate(w, nx, ny, nz, T[j, l], T[j + 1, l], T[j + 2, l], T[j + 3, l])
                    T[j, l] = f0 * dl
                    T[j + 1, l] = f1 * dl
                    T[j + 2, l] = f2 * dl
                    T[j + 3, l] = f3 * dl
        else:
            for pr in range(n // 2):
                c, ns = ta[pr], tc[pr]  # -sin: the C code's negated sine
                j = 2 * pr
                for l in range(lanes):
                    dl = D[l]
                    f0, f1 = givens_rotate(c, ns, T[j, l], T[j + 1, l])
                    T[j, l] = f0 * dl
                    T[j + 1, l] = f1 * dl
        # stage: transpose-out
        for l in range(L):
            orow = out[g0 + l]
            p = l
            for j in range(n):
                orow[j] = Tf[p]
                p += lanes
    return out


def attention_read(src, dst, n_blocks, aux, n_aux):
    """The fused attention kernel's reader (:data:`tbq.kernels.READER_SIG`): ``n_blocks`` blocks decoded by
    :func:`decode` (the same bits), for all four PLANAR/ISO formats: ``aux`` is ``[bits, quat, nc, nr]``,
    the ``nc`` centroids, the four rotation tables of ``nr`` values and the fp16 table
    (``attention_tables`` of :mod:`tbq.formats.planar_iso`)."""
    a = reader_aux(aux, n_aux)
    bits = np.int64(a[0])
    nc = np.int64(a[2])
    nr = np.int64(a[3])
    o = 4 + nc
    decode(
        reader_blocks(src, n_blocks, 2 + 16 * bits),
        reader_out(dst, n_blocks, 128),
        bits,
        a[1] != _0,
        a[4:o],
        a[o : o + nr],
        a[o + nr : o + 2 * nr],
        a[o + 2 * nr : o + 3 * nr],
        a[o + 3 * nr : o + 4 * nr],
        a[o + 4 * nr :],
        LANES,
    )
