# mypy: ignore-errors
# (numba intrinsics: untyped by nature, as the kernel modules pyproject exempts)
"""The rotated readers' look-ups with AVX-512 VBMI: ``table[idx_j] * scale`` for the 128 indices of a block.

The attention readers of TBQ4_0, TBQ3_0 and turbo4 (``tbq_kernels.read_rotated``,
``turbo_kernels.read_rotated``) turn each index into ``centroid[idx] * d``. With
AVX-512 VBMI (``vpermb``, any byte of a 64-byte register to any lane) a
block's indices are loaded once and each 16 values take one ``vpermb`` (the
byte holding index j into lane j), one shift and one ``vpermps``, against three
shuffles per 16 values in :func:`tbq.intrinsics.lookup16_row` /
``lookup8_row``. The products come from a per-block table: the 16 (or 8)
centroids times ``scale``, one IEEE float32 multiply each with the operands in
the scalar loop's order (``centroid * scale``), so every value has exactly the
bits of its own product ``centroid[idx] * scale`` (a NaN scale gives the same
quiet NaN either way). Nothing past the block's indices is read.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..intrinsics import TARGET_AVX512VL, target_has

#: Whether the kernels are compiled for a CPU with AVX-512 VBMI and VL (:func:`lookup_row_vbmi`'s ``vpermb``).
TARGET_VBMI = TARGET_AVX512VL and target_has("avx512vbmi")


def _codegen(bits: int):
    nbytes = 16 * bits  # the block's index bytes

    def codegen(context, builder, signature, args):
        i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
        v16f, v16i, v64b = ir.VectorType(ir.FloatType(), 16), ir.VectorType(i32, 16), ir.VectorType(i8, 64)
        s_, d_, t_ = (context.make_array(signature.args[a])(context, builder, args[a]) for a in (0, 2, 4))
        sp = builder.gep(s_.data, [context.cast(builder, args[1], signature.args[1], types.int64)])
        dp = builder.gep(d_.data, [context.cast(builder, args[3], signature.args[3], types.int64)])
        permps = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v16f, [v16f, v16i]), "llvm.x86.avx512.permvar.sf.512"
        )
        permb = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v64b, [v64b, v64b]), "llvm.x86.avx512.permvar.qi.512"
        )
        sc = builder.insert_element(ir.Constant(v16f, ir.Undefined), args[5], ir.Constant(i32, 0))
        sc = builder.shuffle_vector(sc, sc, ir.Constant(v16i, [0] * 16))
        n_tab = 1 << bits
        tn = builder.load(builder.bitcast(t_.data, ir.VectorType(ir.FloatType(), n_tab).as_pointer()), align=4)
        # the centroids repeated to the 16 entries vpermps indexes with an index's low 4 bits (3 bits: bit 3 is
        # the next index's and picks the same value), times the scale: one product per entry, centroid * scale
        table = builder.fmul(builder.shuffle_vector(tn, tn, ir.Constant(v16i, [t % n_tab for t in range(16)])), sc)
        if nbytes == 64:
            row = builder.load(builder.bitcast(sp, v64b.as_pointer()), align=1)
        else:  # a masked load of the 48 bytes (no fault past them), the other lanes 0
            mload = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(v64b, [v64b.as_pointer(), i32, ir.VectorType(ir.IntType(1), 64), v64b]),
                "llvm.masked.load.v64i8.p0v64i8",
            )
            mask = ir.Constant(ir.VectorType(ir.IntType(1), 64), [int(j < nbytes) for j in range(64)])
            row = builder.call(
                mload, [builder.bitcast(sp, v64b.as_pointer()), ir.Constant(i32, 1), mask, ir.Constant(v64b, None)]
            )
        for h in range(8):  # values 16h .. 16h + 15
            sel, shifts = [], []
            for j in range(16):
                t = 16 * h + j
                if bits == 4:  # index t: nibble t % 2 of byte t // 2
                    first, shift = t // 2, 4 * (t % 2)
                else:  # index t: bits 3t .. 3t + 2 of the little-endian payload (two bytes hold them)
                    first, shift = 3 * t // 8, 3 * t % 8
                sel += [first, min(first + 1, nbytes - 1), first, first]  # the bytes above an index's are ignored
                shifts.append(shift)
            w = builder.bitcast(builder.call(permb, [row, ir.Constant(v64b, sel)]), v16i)
            idx = builder.lshr(w, ir.Constant(v16i, shifts))
            out = builder.call(permps, [table, idx])
            builder.store(out, builder.bitcast(builder.gep(dp, [ir.Constant(i64, 16 * h)]), v16f.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def lookup16_row_vbmi(typingctx, src, soff, dst, doff, table, scale):
    """:func:`tbq.intrinsics.lookup16_row` (4-bit indices, low nibble first) with ``vpermb``: for targets with
    :data:`TARGET_VBMI` only. ``dst.flat[doff + 2k + e] = table[nibble e of src.flat[soff + k]] * scale``."""
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)
    return sig, _codegen(4)


@intrinsic
def lookup8_row_vbmi(typingctx, src, soff, dst, doff, table, scale):
    """:func:`tbq.intrinsics.lookup8_row` (3-bit indices, index t at bits 3t .. 3t + 2 of the 48 little-endian
    payload bytes) with ``vpermb``: for targets with :data:`TARGET_VBMI` only."""
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)
    return sig, _codegen(3)


def _planes_codegen(signs: bool):
    """:func:`tbq.formats.planar_iso_kernels.lookup_planes3_row`'s AVX-512 body (16 indices a register: the qs
    word shifted by ``2t``, the signs word by ``14 + t``, one ``vpternlogd`` bit select, one ``vpermps``) with
    the per-block table of products."""

    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        vf, vi = ir.VectorType(ir.FloatType(), 16), ir.VectorType(i32, 16)
        s_, d_, t_ = (context.make_array(signature.args[a])(context, builder, args[a]) for a in (0, 2, 4))
        sp = builder.gep(s_.data, [context.cast(builder, args[1], signature.args[1], types.int64)])
        dp = builder.gep(d_.data, [context.cast(builder, args[3], signature.args[3], types.int64)])
        perm = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vf, [vf, vi]), "llvm.x86.avx512.permvar.sf.512"
        )
        ternlog = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vi, [vi, vi, vi, i32]), "llvm.x86.avx512.pternlog.d.512"
        )

        def splat(x, ty):
            v = builder.insert_element(ir.Constant(ty, ir.Undefined), x, ir.Constant(i32, 0))
            return builder.shuffle_vector(v, v, ir.Constant(vi, [0] * 16))

        n_tab = 8 if signs else 4
        tn = builder.load(builder.bitcast(t_.data, ir.VectorType(ir.FloatType(), n_tab).as_pointer()), align=4)
        # the centroids repeated to 16 entries (the bits above an index's pick the same value), times the scale
        table = builder.fmul(
            builder.shuffle_vector(tn, tn, ir.Constant(vi, [t % n_tab for t in range(16)])), splat(args[5], vf)
        )
        three = ir.Constant(vi, [3] * 16)

        def word(off):  # the 4 bytes at payload offset ``off`` (little-endian), in all lanes
            x = builder.load(builder.bitcast(builder.gep(sp, [ir.Constant(i64, off)]), i32.as_pointer()), align=1)
            return splat(x, vi)

        for h in range(8):  # indices 16h + t: qs bytes 4h .. 4h+3, signs bytes 2h, 2h+1 (the word at 30 + 2h)
            idx = builder.lshr(word(4 * h), ir.Constant(vi, [2 * t for t in range(16)]))
            if signs:
                sg = builder.lshr(word(30 + 2 * h), ir.Constant(vi, [14 + t for t in range(16)]))
                idx = builder.call(ternlog, [idx, sg, three, ir.Constant(i32, 0xE4)])  # bits 0-1 of idx, bit 2 of sg
            out = builder.call(perm, [table, idx])
            builder.store(out, builder.bitcast(builder.gep(dp, [ir.Constant(i64, 16 * h)]), vf.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def lookup_planes3_row_table(typingctx, src, soff, dst, doff, table, scale):
    """:func:`tbq.formats.planar_iso_kernels.lookup_planes3_row` (turbo3's qs and signs planes) with the
    per-block table of ``centroid * scale`` products: for targets with AVX-512VL only."""
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)
    return sig, _planes_codegen(True)


@intrinsic
def lookup_qs_row_table(typingctx, src, soff, dst, doff, table, scale):
    """:func:`tbq.formats.planar_iso_kernels.lookup_qs_row` (turbo2's qs plane) with the per-block table of
    ``centroid * scale`` products: for targets with AVX-512VL only."""
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)
    return sig, _planes_codegen(False)
