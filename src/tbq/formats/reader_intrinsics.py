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

The IR builders (:func:`index_vectors`, :func:`centroids16`, :func:`products`, :func:`permute`) are also what
the fused attention's microkernels use to read the same codes without a scratch
(:mod:`tbq.attention_kernels`), so both look the indices up in one way, with the same bits.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I1, _I32, _I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
_VF, _VI = ir.VectorType(ir.FloatType(), 16), ir.VectorType(_I32, 16)

#: The index layouts: ``(bits, bytes a 16 indices from, lanes from the first word, bytes to the second word)`` for
#: the stream layouts (index ``t`` of a block at bits ``bits*t ..`` of its little-endian index bytes): TBQ4_0's and
#: turbo4's nibble pairs ("nib4") and TBQ3_0's 3-bit stream ("stream3"); turbo2's four 2-bit indices a byte
#: ("quads2") is the stream of 2 bits whose 16 indices fit one word. turbo3's two planes ("planes3") are
#: :func:`index_vectors`' own case.
STREAMS = {"nib4": (4, 8, 8, 4), "stream3": (3, 6, 10, 2), "quads2": (2, 4, 16, 0)}
#: Entries of each layout's table (3 bits: 8, repeated to 16 by :func:`centroids16`).
TABLE_SIZE = {"nib4": 16, "stream3": 8, "quads2": 4, "planes3": 8}


def splat(builder: ir.IRBuilder, x: ir.Value, ty: ir.VectorType) -> ir.Value:
    """``x`` in all 16 lanes of a vector of type ``ty``."""
    v = builder.insert_element(ir.Constant(ty, ir.Undefined), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(_VI, [0] * 16))


def centroids16(builder: ir.IRBuilder, ptr: ir.Value, n_tab: int) -> ir.Value:
    """The ``n_tab`` float32 centroids at ``ptr`` (float*) repeated to 16 lanes: an index's bits above its own pick
    the same entry, so ``vpermps`` (which reads 4 bits) needs no mask."""
    tn = builder.load(builder.bitcast(ptr, ir.VectorType(ir.FloatType(), n_tab).as_pointer()), align=4)
    return builder.shuffle_vector(tn, tn, ir.Constant(_VI, [t % n_tab for t in range(16)]))


def products(builder: ir.IRBuilder, cent16: ir.Value, scale: ir.Value) -> ir.Value:
    """The block's table: ``centroid * scale`` lane by lane, one rounded multiply each (the scalar order)."""
    return builder.fmul(cent16, splat(builder, scale, _VF))


def permute(builder: ir.IRBuilder, table: ir.Value, idx: ir.Value) -> ir.Value:
    """``vpermps``: lane ``l`` is ``table[idx_l & 15]``."""
    perm = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_VF, [_VF, _VI]), "llvm.x86.avx512.permvar.sf.512"
    )
    return builder.call(perm, [table, idx])


def index_vectors(builder: ir.IRBuilder, layout: str, payload: ir.Value) -> Callable[[int], ir.Value]:
    """``idx(h)``: the 16 indices ``16h .. 16h + 15`` of the block whose index bytes start at ``payload`` (i8*),
    each in the low bits of its lane (above them other indices' bits, which :func:`centroids16`'s repeated table
    ignores). Stream layouts (:data:`STREAMS`): the word at the 16's first byte in the lanes of the indices it holds
    whole and the word ``second`` bytes further in the others, one shift per lane to the index's first bit.
    turbo3's planes: the qs word shifted by ``2t``, the signs word by ``14 + t``, one ``vpternlogd`` bit select
    (bits 0-1 from qs, bit 2 from signs). Nothing past the block's index bytes is read."""

    def word(off: int) -> ir.Value:  # the 4 bytes at payload offset ``off`` (little-endian), in all lanes
        p = builder.bitcast(builder.gep(payload, [ir.Constant(_I64, off)]), _I32.as_pointer())
        return splat(builder, builder.load(p, align=1), _VI)

    if layout == "planes3":
        ternlog = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VI, [_VI, _VI, _VI, _I32]), "llvm.x86.avx512.pternlog.d.512"
        )
        three = ir.Constant(_VI, [3] * 16)

        def planes(h: int) -> ir.Value:  # qs bytes 4h .. 4h+3, signs bytes 2h, 2h+1 (the word at 30 + 2h)
            idx = builder.lshr(word(4 * h), ir.Constant(_VI, [2 * t for t in range(16)]))
            sg = builder.lshr(word(30 + 2 * h), ir.Constant(_VI, [14 + t for t in range(16)]))
            return builder.call(ternlog, [idx, sg, three, ir.Constant(_I32, 0xE4)])

        return planes
    bits, step, split, second = STREAMS[layout]
    first = ir.Constant(ir.VectorType(_I1, 16), [int(t < split) for t in range(16)])
    shifts = ir.Constant(_VI, [bits * t if t < split else bits * t - 8 * second for t in range(16)])

    def stream(h: int) -> ir.Value:
        w = word(step * h) if split == 16 else builder.select(first, word(step * h), word(step * h + second))
        return builder.lshr(w, shifts)

    return stream


def _row_codegen(layout: str):
    """The body of the ``*_row_table`` intrinsics: ``(src, soff, dst, doff, table, scale)``, the 128 values of the
    block whose ``layout`` indices start at ``src[soff]`` into ``dst[doff ..]``, by :func:`index_vectors` and one
    ``vpermps`` per 16 in the table of ``table[:n] * scale``."""

    def codegen(context, builder, signature, args):
        s_, d_, t_ = (context.make_array(signature.args[a])(context, builder, args[a]) for a in (0, 2, 4))
        sp = builder.gep(s_.data, [context.cast(builder, args[1], signature.args[1], types.int64)])
        dp = builder.gep(d_.data, [context.cast(builder, args[3], signature.args[3], types.int64)])
        table = products(builder, centroids16(builder, t_.data, TABLE_SIZE[layout]), args[5])
        idx = index_vectors(builder, layout, sp)
        for h in range(8):
            out = permute(builder, table, idx(h))
            builder.store(out, builder.bitcast(builder.gep(dp, [ir.Constant(_I64, 16 * h)]), _VF.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def lookup_planes3_row_table(typingctx, src, soff, dst, doff, table, scale):
    """:func:`tbq.formats.planar_iso_kernels.lookup_planes3_row` (turbo3's qs and signs planes) with the
    per-block table of ``centroid * scale`` products: for targets with AVX-512VL only."""
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)
    return sig, _row_codegen("planes3")


@intrinsic
def lookup_qs_row_table(typingctx, src, soff, dst, doff, table, scale):
    """:func:`tbq.formats.planar_iso_kernels.lookup_qs_row` (turbo2's qs plane) with the per-block table of
    ``centroid * scale`` products: for targets with AVX-512VL only."""
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)
    return sig, _row_codegen("quads2")


@intrinsic
def lookup16_row_table(typingctx, src, soff, dst, doff, table, scale):
    """:func:`tbq.intrinsics.lookup16_row` (4-bit indices, low nibble first) with the per-block table of
    products, for targets with AVX-512VL: indices 16h .. 16h + 7 from the word at byte 8h shifted by 4t, the
    next eight from the word at 8h + 4. Nothing past the 64 bytes is read."""
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)
    return sig, _row_codegen("nib4")


@intrinsic
def lookup8_row_table(typingctx, src, soff, dst, doff, table, scale):
    """:func:`tbq.intrinsics.lookup8_row` (TBQ3_0's 3-bit indices, index t at bits 3t .. 3t + 2 of the 48
    little-endian payload bytes) with the per-block table of products, for targets with AVX-512VL: indices
    16h .. 16h + 9 from the word at byte 6h shifted by 3t, the next six from the word at 6h + 2 shifted by
    3t - 16. Nothing past the 48 bytes is read."""
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)
    return sig, _row_codegen("stream3")
