"""The rotated readers' look-ups on AVX-512: ``table[idx_j] * scale`` for the 128 indices of a block.

The attention readers of TBQ4_0, TBQ3_0 and turbo2/3/4 (``tbq_kernels.read_rotated``,
``turbo_kernels.read_rotated``) turn each index into ``centroid[idx] * d``. Here the products come from a
per-block table: the 16 (or 8, or 4) centroids times ``scale``, one IEEE float32 multiply each with the operands
in the scalar loop's order (``centroid * scale``), so every value has exactly the bits of its own product
``centroid[idx] * scale`` (a NaN scale gives the same quiet NaN either way), and each 16 values are one
``vpermps`` in that table with no multiply. The indices reach their lanes by shifting broadcast little-endian
words (one shift per lane to the index's first bit; ``vpermps`` reads an index's low 4 bits). Against
:func:`tbq.intrinsics.lookup16_row` / ``lookup8_row`` (three shuffles and a multiply per 16 values) a
32K-token cache reads 15-20 % faster on a Zen 5 core; a ``vpermb`` (AVX-512 VBMI) spread of the index bytes
was no faster, as LLVM rewrites a constant ``vpermb`` into two shuffles. For targets with AVX-512VL only
(:data:`tbq.intrinsics.TARGET_AVX512VL`); the callers keep the AVX2 and scalar paths. Nothing past the block's
indices is read.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


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


def _words_codegen(bits: int):
    """The body of :func:`lookup16_row_table` (``bits`` 4) and :func:`lookup8_row_table` (3): per 16 indices
    (``2 * bits`` bytes from byte ``2 * bits * h``) the little-endian word at that byte in the lanes of the
    indices it holds whole and the word ``bits`` bytes further (4 bits) or 2 bytes further (3 bits) in the
    others, one shift per lane to the index's first bit, one ``vpermps`` in the per-block table of products
    (3 bits: the 8 entries repeated, bit 3 is the next index's and picks the same value)."""
    step, split, second = (8, 8, 4) if bits == 4 else (6, 10, 2)  # bytes a 16, lanes from the first word, 2nd word

    def codegen(context, builder, signature, args):
        i1, i32, i64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
        vf, vi = ir.VectorType(ir.FloatType(), 16), ir.VectorType(i32, 16)
        s_, d_, t_ = (context.make_array(signature.args[a])(context, builder, args[a]) for a in (0, 2, 4))
        sp = builder.gep(s_.data, [context.cast(builder, args[1], signature.args[1], types.int64)])
        dp = builder.gep(d_.data, [context.cast(builder, args[3], signature.args[3], types.int64)])
        perm = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vf, [vf, vi]), "llvm.x86.avx512.permvar.sf.512"
        )

        def splat(x, ty):
            v = builder.insert_element(ir.Constant(ty, ir.Undefined), x, ir.Constant(i32, 0))
            return builder.shuffle_vector(v, v, ir.Constant(vi, [0] * 16))

        n_tab = 1 << bits
        tn = builder.load(builder.bitcast(t_.data, ir.VectorType(ir.FloatType(), n_tab).as_pointer()), align=4)
        table = builder.fmul(
            builder.shuffle_vector(tn, tn, ir.Constant(vi, [t % n_tab for t in range(16)])), splat(args[5], vf)
        )

        def word(off):
            x = builder.load(builder.bitcast(builder.gep(sp, [ir.Constant(i64, off)]), i32.as_pointer()), align=1)
            return splat(x, vi)

        first = ir.Constant(ir.VectorType(i1, 16), [int(t < split) for t in range(16)])
        shifts = ir.Constant(vi, [bits * t if t < split else bits * t - 8 * second for t in range(16)])
        for h in range(8):
            w = builder.select(first, word(step * h), word(step * h + second))
            out = builder.call(perm, [table, builder.lshr(w, shifts)])
            builder.store(out, builder.bitcast(builder.gep(dp, [ir.Constant(i64, 16 * h)]), vf.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def lookup16_row_table(typingctx, src, soff, dst, doff, table, scale):
    """:func:`tbq.intrinsics.lookup16_row` (4-bit indices, low nibble first) with the per-block table of
    products, for targets with AVX-512VL: indices 16h .. 16h + 7 from the word at byte 8h shifted by 4t, the
    next eight from the word at 8h + 4. Nothing past the 64 bytes is read."""
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)
    return sig, _words_codegen(4)


@intrinsic
def lookup8_row_table(typingctx, src, soff, dst, doff, table, scale):
    """:func:`tbq.intrinsics.lookup8_row` (TBQ3_0's 3-bit indices, index t at bits 3t .. 3t + 2 of the 48
    little-endian payload bytes) with the per-block table of products, for targets with AVX-512VL: indices
    16h .. 16h + 9 from the word at byte 6h shifted by 3t, the next six from the word at 6h + 2 shifted by
    3t - 16. Nothing past the 48 bytes is read."""
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)
    return sig, _words_codegen(3)
