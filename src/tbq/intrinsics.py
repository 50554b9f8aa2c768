"""The LLVM intrinsics of the numba kernels: IR that numba's loops cannot express, and the target's CPU features.

Each function here is a numba ``@intrinsic``: called from a jitted kernel, it
emits LLVM IR directly (vector loads, ``shufflevector``, x86 ``vpermps``
look-ups, non-temporal stores, prefetches, in-register butterflies). They are
private building blocks of the format kernels; :mod:`tbq.kernels` holds the
``jit`` settings and the shared scalar helpers, and re-exports the names other
modules import from it.

Every intrinsic keeps each value's float32 operations and their order as in
the scalar loop it replaces (one IEEE multiply or add per step, never a fused
or reassociated one), so the bytes and bits are the same; what changes is how
many values an instruction handles. The x86-only ones (``lookup16_row``,
``lookup8_row``, ``quantize_column16``/``8``) are for targets with AVX2
(:data:`TARGET_AVX2`); their callers keep a portable loop otherwise. The
``TARGET_*`` flags are read from the CPU numba compiles for
(``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` when set, else the host).

Why one module of this length: it is the one place where tbq
writes IR by hand, so a reader checking that an intrinsic keeps the scalar
loop's operations finds every builder idiom it shares with the others here
(:func:`transpose8_vectors`, :func:`butterfly_in_registers`, the look-up
prologue), and the rest of the package holds no ``llvmlite`` code outside the
few intrinsics of one kernel (a format's kernel module, the fused attention kernel).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

F32 = np.float32


_U32 = np.uint32
_F16_SUB_STEP = F32(2.0**-24)  # the fp16 subnormal step


def f16_widen_bits_portable(h):
    """float32 bits (uint32) of fp16 bits ``h`` (uint16), integer arithmetic only: the fallback of :func:`f16_widen`.

    Normal words: exponent and mantissa shifted into place (``<< 13``), the
    exponent rebiased 15 -> 127 (``+ 112 << 23``). Exponent 31 (inf, NaN):
    exponent 255, the mantissa shifted, bit 22 set when it is not 0 (a
    signalling NaN comes out quiet, as from ``ggml_compute_fp16_to_fp32``;
    docs/formats.md, F16). Exponent 0 (zero, subnormal): ``m * 2**-24``; the
    int -> float32 conversion of the 10-bit ``m`` and the product with a
    power of two are exact. Every intermediate is wrapped in uint32 (numba
    widens integer arithmetic to 64 bits, which halves the vector lanes).
    """
    u = _U32(h)
    a = _U32(u & _U32(0x7FFF))
    m = _U32(u & _U32(0x03FF))
    e = _U32(a >> _U32(10))
    shifted = _U32(a << _U32(13))
    normal = _U32(shifted + _U32(112 << 23))
    quiet = _U32(0x00400000) if m != _U32(0) else _U32(0)
    special = _U32(_U32(shifted | _U32(0x7F800000)) | quiet)
    sub = F32(F32(np.int32(m)) * _F16_SUB_STEP).view(np.uint32)
    r = sub if e == _U32(0) else normal
    r = special if e == _U32(31) else r
    return _U32(_U32(_U32(u & _U32(0x8000)) << _U32(16)) | r)


def target_has(feature: str) -> bool:
    """Whether numba compiles for a CPU with ``feature`` (an LLVM feature name: ``"f16c"``, ``"avx2"``).

    The host CPU's features, unless ``NUMBA_CPU_NAME`` names another CPU
    (then only an explicit ``+feature`` in ``NUMBA_CPU_FEATURES`` counts).
    Code that emits an instruction of such a feature (an x86 intrinsic, or
    ``fpext half``, which LLVM lowers without F16C to a runtime-library call
    that numba's JIT does not link: a segfault) asks this first and has a
    portable path otherwise.
    """
    from llvmlite import binding

    if nb.config.CPU_FEATURES:
        return f"+{feature}" in nb.config.CPU_FEATURES.split(",")
    if nb.config.CPU_NAME:
        return False
    return bool(binding.get_host_cpu_features().get(feature, False))


#: Whether the kernels are compiled for a CPU with F16C (:func:`f16_widen` emits ``fpext half``).
TARGET_F16C = target_has("f16c")
#: Whether they are compiled for a CPU with AVX2 (the TBQ readers' ``vpermps`` lookups, :func:`lookup16_row`).
TARGET_AVX2 = target_has("avx2")
#: Whether they are compiled for a CPU with AVX-512VL (:func:`quantize_column16`'s ``vpermt2ps`` look-ups).
TARGET_AVX512VL = target_has("avx512vl")
#: Whether they are compiled for a CPU with AVX-512 VBMI (the fused attention's ``vpmultishiftqb`` index spread).
TARGET_AVX512VBMI = target_has("avx512vbmi")


@intrinsic
def f16_widen(typingctx, h):
    """float32 bits (uint32) of fp16 bits ``h`` (uint16), exact, NaNs quieted: ggml's fp16 -> fp32.

    With F16C this is LLVM's ``fpext half -> float``, which a loop vectorises
    into ``vcvtph2ps`` (8 values an instruction, 8x the integer path); the
    instruction widens exactly and quiets a signalling NaN (bit 22), exactly
    what docs/formats.md specifies (all 2**16 words are tested, both paths).
    Without F16C: :func:`f16_widen_bits`. Returns the bits, so that the
    caller never holds a NaN in a float variable.
    """
    sig = types.uint32(types.uint16)

    def codegen(context, builder, signature, args):
        if TARGET_F16C:
            f = builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
            return builder.bitcast(f, ir.IntType(32))
        return context.compile_internal(builder, f16_widen_bits_portable, signature, args)

    return sig, codegen


# --- data movement ------------------------------------------------------------------

_SHUF = (
    ([0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]),  # interleave pairs of rows
    ([0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]),  # interleave pairs of pairs
    ([0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]),  # join the halves
)


def transpose8_vectors(builder: ir.IRBuilder, rows: list) -> list:
    """The 8 columns (``<8 x float>``, lane ``r`` from row ``r``) of 8 rows ``<8 x float>``: the classic 24
    ``shufflevector`` steps (pairs, pairs of pairs, halves), a pure copy. IR for :func:`transpose8` and the
    attention microkernels that transpose tiles in registers."""

    def sh(a, b, mask):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), 8), mask))

    lo, hi = _SHUF[0]
    t = [v for i in range(4) for v in (sh(rows[2 * i], rows[2 * i + 1], lo), sh(rows[2 * i], rows[2 * i + 1], hi))]
    lo, hi = _SHUF[1]
    u: list = [None] * 8
    for base in (0, 4):
        u[base], u[base + 1] = sh(t[base], t[base + 2], lo), sh(t[base], t[base + 2], hi)
        u[base + 2], u[base + 3] = sh(t[base + 1], t[base + 3], lo), sh(t[base + 1], t[base + 3], hi)
    lo, hi = _SHUF[2]
    cols: list = [None] * 8
    for k in range(4):
        cols[k], cols[k + 4] = sh(u[k], u[k + 4], lo), sh(u[k], u[k + 4], hi)
    return cols


@intrinsic
def transpose8(typingctx, src, si, ss, dst, di, ds):
    """Copy an 8 x 8 float32 tile transposed: ``dst[di + c*ds + r] = src[si + r*ss + c]`` for ``r, c < 8``.

    ``src`` and ``dst`` are C-contiguous float32 arrays addressed by flat
    indices (``si``, ``di``) and row strides in elements (``ss``, ``ds``). It
    emits eight 8-wide vector loads, the classic 24 ``shufflevector`` steps
    and eight vector stores (LLVM IR, so any target; on x86 unpck/shuf/perm
    instructions), which numba's loops cannot express: the scalar
    transposition into the TBQ kernels' lane layout was their largest single
    cost. A pure copy: no value changes.
    """
    sig = types.void(src, si, ss, dst, di, ds)

    def codegen(context, builder, signature, args):
        s_arr = context.make_array(signature.args[0])(context, builder, args[0])
        d_arr = context.make_array(signature.args[3])(context, builder, args[3])
        i64 = ir.IntType(64)
        vt = ir.VectorType(ir.FloatType(), 8)

        def as64(k):
            return context.cast(builder, args[k], signature.args[k], types.int64)

        si_, ss_, di_, ds_ = as64(1), as64(2), as64(4), as64(5)

        def ptr(arr, base, stride, k):
            off = builder.add(base, builder.mul(stride, ir.Constant(i64, k)))
            return builder.bitcast(builder.gep(arr.data, [off]), vt.as_pointer())

        rows = [builder.load(ptr(s_arr, si_, ss_, r), align=4) for r in range(8)]
        for c, col in enumerate(transpose8_vectors(builder, rows)):
            builder.store(col, ptr(d_arr, di_, ds_, c), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def store_nibble_rows(typingctx, K, koff, kstride, dst, doff, dstride):
    """Pack and store the 4-bit indices of 8 blocks of a 128-row lane layout: for ``t < 8`` and ``i < 64``,
    ``dst.flat[doff + t*dstride + i] = K[2i, t] | K[2i+1, t] << 4`` with ``K[j, t] = K.flat[koff + j*kstride + t]``
    (every index in 0 .. 15: a 16-level quantizer's counts). ``pair4``'s bytes, written 32 at a time.

    Eight indices of a block make one little-endian uint32 of its output (``sum K[8g+e] << 4e``, bytes
    ``4g .. 4g+3``), built for all 8 blocks at once from 8 vector loads, shifts and ors; two 8 x 8
    transpositions (:func:`transpose8_vectors`) turn the 16 words of each block into two vectors, stored
    unaligned. Where the TBQ4 encoder stored 64 bytes a block one at a time, this is 2 stores a block. Plain
    LLVM IR (any little-endian target: numba's are). ``K`` is C-contiguous int32 (``kstride`` in elements),
    ``dst`` C-contiguous uint8.
    """
    ok = (
        isinstance(K, types.Array)
        and K.dtype == types.int32
        and K.layout == "C"
        and isinstance(dst, types.Array)
        and dst.dtype == types.uint8
        and dst.layout == "C"
    )
    if not ok:  # the pointer arithmetic below assumes both: no signature, a typing error for anything else
        return None
    sig = types.void(K, koff, kstride, dst, doff, dstride)

    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        v8i = ir.VectorType(i32, 8)
        kp = context.make_array(signature.args[0])(context, builder, args[0]).data
        dp = context.make_array(signature.args[3])(context, builder, args[3]).data
        koff, kstride, doff, dstride = (
            context.cast(builder, args[k], signature.args[k], types.int64) for k in (1, 2, 4, 5)
        )
        words = []
        for g in range(16):  # word g of every block: indices 8g .. 8g+7
            q = None
            for e in range(8):
                p = builder.gep(kp, [builder.add(koff, builder.mul(kstride, ir.Constant(i64, 8 * g + e)))])
                row = builder.load(builder.bitcast(p, v8i.as_pointer()), align=4)
                part = builder.shl(row, ir.Constant(v8i, [4 * e] * 8)) if e else row
                q = part if q is None else builder.or_(q, part)
            words.append(q)
        halves = (transpose8_vectors(builder, words[:8]), transpose8_vectors(builder, words[8:]))
        for t in range(8):  # block t: words 0-7, then 8-15
            base = builder.add(doff, builder.mul(dstride, ir.Constant(i64, t)))
            for h, cols in enumerate(halves):
                p = builder.gep(dp, [builder.add(base, ir.Constant(i64, 32 * h))])
                builder.store(cols[t], builder.bitcast(p, v8i.as_pointer()), align=1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def store_nontemporal(typingctx, arr, idx, val):
    """``arr.flat[idx] = val`` (C-contiguous ``arr``) as a non-temporal (streaming) store.

    A large output written this way goes to memory without first being read
    into the cache (no read-for-ownership) and without evicting the working
    set. The value is exactly the same; only its way to memory differs. Call
    :func:`store_fence` before the kernel returns.
    """
    sig = types.void(arr, idx, val)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.int64)
        v = context.cast(builder, args[2], signature.args[2], signature.args[0].dtype)
        st = builder.store(v, builder.gep(a.data, [i]))
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


def _prefetch_codegen(locality: int):
    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        i8p = ir.PointerType(ir.IntType(8))
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [i8p, ir.IntType(32), ir.IntType(32), ir.IntType(32)]),
            "llvm.prefetch.p0i8",
        )
        ptr = builder.bitcast(builder.gep(a.data, [args[1]]), i8p)
        i32 = ir.IntType(32)
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, locality), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return codegen


@intrinsic
def prefetch(typingctx, arr, idx):
    """Hint that ``arr.flat[idx]`` will be read soon (``llvm.prefetch``: read, keep in all cache levels).

    A hint only: no value changes, and an index past the array's end is harmless (x86's prefetch does not
    fault). The TBQ encoder prefetches the next group of blocks while it works on the current one.
    """
    return types.void(arr, types.int64), _prefetch_codegen(3)


@intrinsic
def prefetch_l2(typingctx, arr, idx):
    """:func:`prefetch` into the outer caches only (locality 2: x86's ``prefetcht1``, L2 and L3, not L1).

    For data read a while later: a stream prefetched into L1 as far ahead evicts the lines being worked on.
    The fused attention kernel reads TBQ codes this way, two chunks ahead.
    """
    return types.void(arr, types.int64), _prefetch_codegen(2)


@intrinsic
def store_fence(typingctx):
    """A full memory fence: streaming stores are ordered before anything the caller does next."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen


# --- attention readers and the TBQ lane kernels ---------------------------------------------


def _lookup_row_operands(context, builder, signature, args, w=8):
    """The shared prologue of :func:`lookup16_row` and :func:`lookup8_row`: the source and destination
    pointers at their flat offsets, the table's pointer, the permute of ``w`` lanes (``llvm.x86.avx2.permps``,
    or ``llvm.x86.avx512.permvar.sf.512`` for 16) and ``scale`` in all ``w`` lanes."""
    i32 = ir.IntType(32)
    vf, vi = ir.VectorType(ir.FloatType(), w), ir.VectorType(i32, w)
    s_ = context.make_array(signature.args[0])(context, builder, args[0])
    d_ = context.make_array(signature.args[2])(context, builder, args[2])
    t_ = context.make_array(signature.args[4])(context, builder, args[4])
    sp = builder.gep(s_.data, [context.cast(builder, args[1], signature.args[1], types.int64)])
    dp = builder.gep(d_.data, [context.cast(builder, args[3], signature.args[3], types.int64)])
    name = "llvm.x86.avx512.permvar.sf.512" if w == 16 else "llvm.x86.avx2.permps"
    perm = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vi]), name)
    sc = builder.insert_element(ir.Constant(vf, ir.Undefined), args[5], ir.Constant(i32, 0))
    sc = builder.shuffle_vector(sc, sc, ir.Constant(vi, [0] * w))
    return sp, dp, t_.data, perm, sc


@intrinsic
def lookup16_row(typingctx, src, soff, dst, doff, table, scale):
    """``dst.flat[doff + 2k + e] = table[nibble e of src.flat[soff + k]] * scale`` for ``k < 64`` (128 values).

    For AVX2 targets only (:data:`TARGET_AVX2`; callers keep a portable loop
    otherwise). With AVX-512VL (:data:`TARGET_AVX512VL`) 16 values are one
    register: 8 bytes of indices are widened to 32 bits, each repeated in two
    lanes and shifted by 0 (low nibble) or 4 (high), and one ``vpermps`` in the
    16 entries looks them up (it reads only an index's low 4 bits, so the low
    nibble needs no mask). With AVX2, each 4 bytes become 8 indices (low
    nibble, then high, per byte), looked up with two ``vpermps`` (entries 0-7
    and 8-15) and a select on index > 7. Either way each value is then
    multiplied by ``scale`` (one IEEE float32 multiply per value, operands in
    the scalar loop's order: the same bits). A gather from a 16-entry table
    is what LLVM makes of the scalar loop; this is a few register operations.
    ``src``, ``dst`` and ``table`` are C-contiguous (flat offsets).
    """
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)

    def codegen(context, builder, signature, args):
        i32, i8, i64 = ir.IntType(32), ir.IntType(8), ir.IntType(64)
        if TARGET_AVX512VL:  # 16 values a zmm register: one vpermps in 16 entries
            v16f, v16i, v8b, v8i = (
                ir.VectorType(ir.FloatType(), 16),
                ir.VectorType(i32, 16),
                ir.VectorType(i8, 8),
                ir.VectorType(i32, 8),
            )
            sp, dp, tp, perm, sc = _lookup_row_operands(context, builder, signature, args, 16)
            t16 = builder.load(builder.bitcast(tp, v16f.as_pointer()), align=4)
            twice = ir.Constant(v16i, [j // 2 for j in range(16)])  # byte j // 2 in lanes j: low, then high nibble
            shifts = ir.Constant(v16i, [0, 4] * 8)
            for k in range(8):
                b = builder.load(builder.bitcast(builder.gep(sp, [ir.Constant(i64, 8 * k)]), v8b.as_pointer()), align=1)
                w = builder.zext(b, v8i)
                idx = builder.lshr(builder.shuffle_vector(w, w, twice), shifts)
                out = builder.fmul(builder.call(perm, [t16, idx]), sc)
                dst = builder.gep(dp, [ir.Constant(i64, 16 * k)])
                builder.store(out, builder.bitcast(dst, v16f.as_pointer()), align=4)
            return context.get_dummy_value()
        v8f, v8i, v4b, v4i = (
            ir.VectorType(ir.FloatType(), 8),
            ir.VectorType(i32, 8),
            ir.VectorType(i8, 4),
            ir.VectorType(i32, 4),
        )
        sp, dp, tp, permps, sc = _lookup_row_operands(context, builder, signature, args)
        lo8 = builder.load(builder.bitcast(tp, v8f.as_pointer()), align=4)
        hi8 = builder.load(builder.bitcast(builder.gep(tp, [ir.Constant(i64, 8)]), v8f.as_pointer()), align=4)
        fifteen = ir.Constant(v4i, [15] * 4)
        four = ir.Constant(v4i, [4] * 4)
        seven = ir.Constant(v8i, [7] * 8)
        interleave = ir.Constant(v8i, [0, 4, 1, 5, 2, 6, 3, 7])
        for k in range(16):
            b = builder.load(builder.bitcast(builder.gep(sp, [ir.Constant(i64, 4 * k)]), v4b.as_pointer()), align=1)
            w = builder.zext(b, v4i)
            idx = builder.shuffle_vector(builder.and_(w, fifteen), builder.lshr(w, four), interleave)
            a = builder.call(permps, [lo8, idx])
            h = builder.call(permps, [hi8, idx])
            v = builder.select(builder.icmp_unsigned(">", idx, seven), h, a)
            out = builder.fmul(v, sc)
            builder.store(out, builder.bitcast(builder.gep(dp, [ir.Constant(i64, 8 * k)]), v8f.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def lookup8_row(typingctx, src, soff, dst, doff, table, scale):
    """``dst.flat[doff + 8g + t] = table[index t of the 24-bit lane g at src.flat[soff + 3g]] * scale`` for ``g < 16``.

    The 3-bit twin of :func:`lookup16_row` (AVX2 targets only): each little-endian
    24-bit lane (three byte loads, so nothing past the row is read) is
    broadcast, shifted by ``3t`` per lane and masked to its 8 indices, looked
    up in the 8-entry ``table`` with one ``vpermps`` and multiplied by
    ``scale`` (the scalar loop's one multiply, same operand order: the same bits).
    With AVX-512VL (:data:`TARGET_AVX512VL`) 16 indices (6 bytes) are one
    register: 8 bytes are loaded (the last step's from payload byte 40, so
    nothing past the row is read), the two bytes holding each index's bits are
    shuffled into its 16-bit lane, widened to 32 bits and shifted by ``3t mod
    8``, and one ``vpermps`` looks them up in the 8 entries repeated to 16: it
    reads an index's low 4 bits, and bit 3 (the next index's) picks the same
    value, so no mask. The byte loads of the AVX2 body made the AVX-512 twin
    of this one no faster than 8 a register.
    """
    sig = types.void(src, types.int64, dst, types.int64, table, types.float32)

    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        if TARGET_AVX512VL:  # 16 indices (6 bytes) a zmm register
            i8, i16 = ir.IntType(8), ir.IntType(16)
            v16f, v16i = ir.VectorType(ir.FloatType(), 16), ir.VectorType(i32, 16)
            sp, dp, tp, perm, sc = _lookup_row_operands(context, builder, signature, args, 16)
            c8 = builder.load(builder.bitcast(tp, ir.VectorType(ir.FloatType(), 8).as_pointer()), align=4)
            table = builder.shuffle_vector(c8, c8, ir.Constant(v16i, [t % 8 for t in range(16)]))  # the 8 twice
            shifts = ir.Constant(v16i, [3 * t % 8 for t in range(16)])
            for h in range(8):  # indices 16h .. 16h + 15: bits 3t .. 3t + 2 of the 6 bytes at 6h
                base = min(6 * h, 40)  # 8 bytes loaded, the last step's from 40: nothing past the 48 is read
                v = builder.load(
                    builder.bitcast(builder.gep(sp, [ir.Constant(i64, base)]), ir.VectorType(i8, 8).as_pointer()),
                    align=1,
                )
                pairs = []  # index t's byte and the next (bits above the index's 3 are ignored: any byte past 47)
                for t in range(16):
                    lo = 6 * h - base + 3 * t // 8
                    pairs += [lo, min(lo + 1, 7)]
                w16 = builder.bitcast(
                    builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, 32), pairs)), ir.VectorType(i16, 16)
                )
                idx = builder.lshr(builder.zext(w16, v16i), shifts)
                out = builder.fmul(builder.call(perm, [table, idx]), sc)
                dst = builder.gep(dp, [ir.Constant(i64, 16 * h)])
                builder.store(out, builder.bitcast(dst, v16f.as_pointer()), align=4)
            return context.get_dummy_value()
        v8f, v8i = ir.VectorType(ir.FloatType(), 8), ir.VectorType(i32, 8)
        sp, dp, tp, permps, sc = _lookup_row_operands(context, builder, signature, args)
        c8 = builder.load(builder.bitcast(tp, v8f.as_pointer()), align=4)
        shifts = ir.Constant(v8i, [3 * t for t in range(8)])
        seven = ir.Constant(v8i, [7] * 8)
        for g in range(16):
            lane = ir.Constant(i32, 0)
            for e in range(3):
                byte = builder.zext(builder.load(builder.gep(sp, [ir.Constant(i64, 3 * g + e)])), i32)
                lane = builder.or_(lane, builder.shl(byte, ir.Constant(i32, 8 * e)))
            vl = builder.insert_element(ir.Constant(v8i, ir.Undefined), lane, ir.Constant(i32, 0))
            vl = builder.shuffle_vector(vl, vl, ir.Constant(v8i, [0] * 8))
            idx = builder.and_(builder.lshr(vl, shifts), seven)
            out = builder.fmul(builder.call(permps, [c8, idx]), sc)
            builder.store(out, builder.bitcast(builder.gep(dp, [ir.Constant(i64, 8 * g)]), v8f.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


def _quantize_column_codegen(n_levels: int):
    """Codegen of :func:`quantize_column16` (``n_levels=16``) and :func:`quantize_column8` (8)."""

    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        f32 = ir.FloatType()
        v8f, v8i = ir.VectorType(f32, 8), ir.VectorType(i32, 8)
        tp_, cs_, kp_, rp_, thr_, csq_ = (
            context.make_array(signature.args[k])(context, builder, args[k]).data for k in (0, 4, 5, 6, 8, 9)
        )
        toff, stride, n, roff = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (1, 2, 3, 7))
        permps = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v8f, [v8f, v8i]), "llvm.x86.avx2.permps"
        )

        def vec_at(ptr, idxs):  # <8 x float> of ptr[i] for i in idxs, the other lanes 0
            v = ir.Constant(v8f, [0.0] * 8)
            for lane, i in enumerate(idxs):
                e = builder.load(builder.gep(ptr, [ir.Constant(i64, i)]))
                v = builder.insert_element(v, e, ir.Constant(i32, lane))
            return v

        def vec_of(ptr, first, count):  # <8 x float> of ptr[first .. first+count), the other lanes 0
            return vec_at(ptr, range(first, first + count))

        def splat(x, ty):
            v = builder.insert_element(ir.Constant(ty, ir.Undefined), x, ir.Constant(i32, 0))
            return builder.shuffle_vector(v, v, ir.Constant(v8i, [0] * 8))

        def ivec(k):
            return ir.Constant(v8i, [k] * 8)

        def extract(v, t):
            return builder.extract_element(v, ir.Constant(i32, t))

        if n_levels == 16 and TARGET_AVX512VL:  # vpermt2ps: one look-up in 16 entries
            vperm2 = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v8f, [v8f, v8i, v8f]), "llvm.x86.avx512.vpermi2var.ps.256"
            )

            def look(lo, hi, k, upper):
                return builder.call(vperm2, [lo, k, hi])
        else:  # two vpermps and a select on the half

            def look(lo, hi, k, upper):
                return builder.select(upper, builder.call(permps, [hi, k]), builder.call(permps, [lo, k]))

        if n_levels == 16:
            t_lo, t_hi = vec_of(thr_, 0, 8), vec_of(thr_, 8, 7)
            c_lo, c_hi = vec_of(csq_, 0, 8), vec_of(csq_, 8, 8)
            t7 = splat(extract(t_lo, 7), v8f)
            t3, t11 = splat(extract(t_lo, 3), v8f), splat(extract(t_hi, 3), v8f)
            if not TARGET_AVX512VL:
                # the third and fourth compares' thresholds, t[k + 1] for k in {0, 4, 8, 12} and t[k] for even k:
                # tables of 4 and 8 entries, so that each is one vpermps (indexed k >> 2, k >> 1) without halves
                t_q, t_e = vec_at(thr_, (1, 5, 9, 13)), vec_at(thr_, (0, 2, 4, 6, 8, 10, 12, 14))
        else:
            t8v, c8v = vec_of(thr_, 0, 7), vec_of(csq_, 0, 8)
            t3 = splat(extract(t8v, 3), v8f)
        acc = cgutils.alloca_once_value(builder, ir.Constant(v8f, [0.0] * 8))
        with cgutils.for_range(builder, n) as loop:
            j = loop.index
            off = builder.add(toff, builder.mul(j, stride))
            t = builder.load(builder.bitcast(builder.gep(tp_, [off]), v8f.as_pointer()), align=4)
            r = builder.fmul(t, splat(builder.load(builder.gep(cs_, [j])), v8f))  # the scalar loop's one product

            def ge(thr):  # lanes where r >= thr (an ordered compare: false for NaN, as numpy's r >= m)
                return builder.fcmp_ordered(">=", r, thr)

            def step(k, thr, bit):  # k + bit where r >= thr
                return builder.add(k, builder.and_(builder.sext(ge(thr), v8i), ivec(bit)))

            if n_levels == 16:
                m1 = ge(t7)  # count >= 8: the upper half (a table is one register per half)
                k = step(step(ivec(0), t7, 8), builder.select(m1, t11, t3), 4)
                if TARGET_AVX512VL:
                    k = step(k, look(t_lo, t_hi, builder.add(k, ivec(1)), m1), 2)
                    k = step(k, look(t_lo, t_hi, k, m1), 1)
                else:  # the same thresholds from the 4- and 8-entry tables, one vpermps each
                    k = step(k, builder.call(permps, [t_q, builder.lshr(k, ivec(2))]), 2)
                    k = step(k, builder.call(permps, [t_e, builder.lshr(k, ivec(1))]), 1)
                c2 = look(c_lo, c_hi, k, m1)
            else:
                k = step(ivec(0), t3, 4)
                k = step(k, builder.call(permps, [t8v, builder.add(k, ivec(1))]), 2)
                k = step(k, builder.call(permps, [t8v, k]), 1)
                c2 = builder.call(permps, [c8v, k])
            builder.store(k, builder.bitcast(builder.gep(kp_, [off]), v8i.as_pointer()), align=4)
            builder.store(builder.fadd(builder.load(acc), c2), acc)  # the recon sum, in channel order
        builder.store(builder.load(acc), builder.bitcast(builder.gep(rp_, [roff]), v8f.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def _make_quantize_column(levels: int) -> Any:
    """The intrinsic ``quantize_column{levels}`` (see :func:`quantize_column16`)."""

    def quantize_column(typingctx, T, toff, stride, n, cs2, K, recon2, roff, thresholds, centroids_sq):
        sig = types.void(
            T, types.int64, types.int64, types.int64, cs2, K, recon2, types.int64, thresholds, centroids_sq
        )
        return sig, _quantize_column_codegen(levels)

    quantize_column.__name__ = quantize_column.__qualname__ = f"quantize_column{levels}"
    quantize_column.__doc__ = """``K.flat[toff + j*stride + t]`` = the number of thresholds <= ``r``, ``r = T.flat[toff + j*stride + t] *
    cs2[j]``, and ``recon2[roff + t]`` = the float32 sum of ``centroids_sq[K]`` over ``j < n`` in order, for the
    8 lanes ``t < 8`` (the TBQ encoder's steps 3-4 on 8 blocks of its lane layout).

    For AVX2 targets only (:data:`TARGET_AVX2`; :func:`lanes_index` keeps a portable loop otherwise). The count
    is a binary search, which equals the count of a sorted table (a codebook's thresholds are strictly
    increasing, and a NaN ``r`` compares false everywhere, 0 either way). With 16 levels: the first compare,
    against threshold 7, decides the half; the second compares with threshold 11 or 3 (a select between two
    broadcasts); the last two look their threshold up, and ``centroids_sq[K]`` is one more look-up. On AVX-512VL
    (:data:`TARGET_AVX512VL`) each is one ``vpermt2ps`` in the 16 entries. On AVX2 the thresholds come from
    tables of just those the compare can need, one ``vpermps`` each: ``t[k + 1]`` for ``k`` in {0, 4, 8, 12}
    (indexed ``k >> 2``), then ``t[k]`` for even ``k`` (indexed ``k >> 1``); ``centroids_sq[K]`` takes two
    ``vpermps`` and a select on the half. With 8 levels each look-up is one ``vpermps``. The product and each addition are
    the scalar loop's IEEE float32 operations, in its order: the same indices and bits.
    ``thresholds`` holds ``levels - 1`` values and ``centroids_sq`` ``levels``; all arrays C-contiguous.
    """
    return intrinsic(quantize_column)


#: TBQ4's index step (16 levels), and TBQ3's (8 levels: one ``vpermps`` per look-up, no halves).
quantize_column16 = _make_quantize_column(16)
quantize_column8 = _make_quantize_column(8)


@intrinsic
def sum_squares32(typingctx, T, toff, stride, n, out, ooff):
    """``out[ooff + t]`` = the float32 sum of ``T.flat[toff + j*stride + t] ** 2`` over ``j < n`` in order, for
    the 32 lanes ``t < 32`` (the TBQ encoder's step 1 on 32 blocks of its lane layout).

    Each lane is the scalar loop's chain (``s = s + x * x``: a rounded product, then a rounded sum, from
    ``s = 0``), held in a ``<32 x float>`` register value over the whole loop; numba's loop keeps the 32 sums
    in memory and waits for each store to reach the next load. Plain LLVM vector IR: any target.
    ``T`` and ``out`` are C-contiguous float32.
    """
    sig = types.void(T, types.int64, types.int64, types.int64, out, types.int64)

    def codegen(context, builder, signature, args):
        v32 = ir.VectorType(ir.FloatType(), 32)
        tp = context.make_array(signature.args[0])(context, builder, args[0]).data
        op = context.make_array(signature.args[4])(context, builder, args[4]).data
        toff, stride, n, ooff = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (1, 2, 3, 5))
        acc = cgutils.alloca_once_value(builder, ir.Constant(v32, [0.0] * 32))
        with cgutils.for_range(builder, n) as loop:
            p = builder.gep(tp, [builder.add(toff, builder.mul(loop.index, stride))])
            x = builder.load(builder.bitcast(p, v32.as_pointer()), align=4)
            builder.store(builder.fadd(builder.load(acc), builder.fmul(x, x)), acc)
        builder.store(builder.load(acc), builder.bitcast(builder.gep(op, [ooff]), v32.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


def butterfly_in_registers(builder: ir.IRBuilder, v: list) -> None:
    """The in-place butterfly's stages h = 1, 2, 4, ... < len(v) on a list of vectors, in place: stage by stage,
    each pair (a, b) h apart becoming (a + b, a - b)."""
    h = 1
    while h < len(v):
        for i in range(0, len(v), 2 * h):
            for j in range(i, i + h):
                a, b = v[j], v[j + h]
                v[j], v[j + h] = builder.fadd(a, b), builder.fsub(a, b)
        h *= 2


def emit_switch(builder: ir.IRBuilder, value: Any, keys: Sequence[int], emit: Callable[[int], None]) -> None:
    """Emit an LLVM ``switch`` on the integer ``value``: ``emit(k)`` in a block of its own for each of ``keys``, the
    last one taking every value not listed (as the ``else`` of an if/elif chain), all joining after it, where the
    builder is left. The cases' code is only what ``emit`` makes: one of them runs, chosen by one branch. How an
    intrinsic built for literal sizes (an order, a row count, a layout) picks its case from runtime values."""
    end = builder.append_basic_block("switch.end")
    blocks = [builder.append_basic_block(f"switch.{k}") for k in keys]
    switch = builder.switch(value, blocks[-1])
    for k, block in zip(keys[:-1], blocks[:-1], strict=True):
        switch.add_case(ir.Constant(value.type, k), block)
    for k, block in zip(keys, blocks, strict=True):
        builder.position_at_end(block)
        emit(k)
        builder.branch(end)
    builder.position_at_end(end)


def _make_butterfly(n: int, double: bool = False) -> Any:
    """The intrinsic ``butterfly{n}`` (``n`` = 64 or 128; see :func:`butterfly128`), or with ``double`` its float64
    twin ``butterfly{n}_f64`` (rows of float64: vLLM's key encoder, whose butterfly is exact in float64)."""
    g = 16 if n == 128 else 8  # rows of a group in the first pass; the second pass has n / g rows g apart
    elem, size = (ir.DoubleType(), 8) if double else (ir.FloatType(), 4)

    def butterfly(typingctx, T, toff, stride):
        sig = types.void(T, types.int64, types.int64)

        def codegen(context, builder, signature, args):
            v8f = ir.VectorType(elem, 8)
            i64 = ir.IntType(64)
            tp = context.make_array(signature.args[0])(context, builder, args[0]).data
            toff, stride = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (1, 2))

            def ptr(j):
                return builder.bitcast(builder.gep(tp, [builder.add(toff, builder.mul(j, stride))]), v8f.as_pointer())

            for groups, rows, step in ((n // g, g, 1), (g, n // g, g)):  # (groups, rows a group, row distance)
                with cgutils.for_range(builder, ir.Constant(i64, groups)) as loop:
                    first = builder.mul(loop.index, ir.Constant(i64, rows)) if step == 1 else loop.index
                    ps = [ptr(builder.add(first, ir.Constant(i64, step * t))) for t in range(rows)]
                    v = [builder.load(p, align=size) for p in ps]
                    butterfly_in_registers(builder, v)
                    for p, x in zip(ps, v, strict=True):
                        builder.store(x, p, align=size)
            return context.get_dummy_value()

        return sig, codegen

    butterfly.__name__ = butterfly.__qualname__ = f"butterfly{n}" + ("_f64" if double else "")
    butterfly.__doc__ = f"""The spec's butterfly (stages h = 1 .. {n // 2}) on 8 columns of an {n}-row lane layout: rows
    ``T.flat[toff + j*stride : +8]``, ``j < {n}``, in place.

    Two passes instead of {4 if n == 128 else 3}: stages 1 .. {g // 2} on each {g} consecutive rows, then the
    others on the {n // g} rows {g} apart, each pass holding its rows in vector registers. A value's
    operations are those of the in-place butterfly in its order (the stages within a group of rows do not
    depend on the other groups), so the bits are :func:`tbq.formats.tbq_kernels._butterfly_lanes`'s, but for
    the payload of a NaN (LLVM may swap the operands of an addition; a NaN reaches the butterfly only in a
    block that is refused, or in none). Plain LLVM vector IR: any target. Rows are 8 columns at ``toff``: the
    lanes of a group are a multiple of 8 (the kernels' ``LANES`` is 32).
    """
    return intrinsic(butterfly)


#: The TBQ encoder's butterfly (128 channels) and the decoder's (64 rows of channel pairs).
butterfly128 = _make_butterfly(128)
butterfly64 = _make_butterfly(64)
#: :func:`butterfly128` on rows of float64 (8 columns a row, ``T`` float64): vLLM's key encoder.
butterfly128_f64 = _make_butterfly(128, double=True)


@intrinsic
def call_reader(typingctx, fn, src, dst, n_blocks, aux, n_aux):
    """Call the attention reader whose C address is ``fn`` (an int64: ``cfunc.address``) with :data:`READER_SIG`'s
    arguments.

    The fused attention kernel takes its readers as addresses, not as numba
    first-class functions: a first-class function argument costs about 15 us
    of type resolution per call in the dispatcher (``typeof`` of a ``CFunc``),
    paid under the GIL by each of the kernel's tasks (64 per decode step at
    32K tokens). The call itself is the same indirect call either way.
    """
    sig = types.void(types.int64, src, dst, types.int64, aux, types.int64)

    def codegen(context, builder, signature, args):
        f32p = ir.PointerType(ir.FloatType())
        fnty = ir.FunctionType(
            ir.VoidType(), [ir.PointerType(ir.IntType(8)), f32p, ir.IntType(64), f32p, ir.IntType(64)]
        )
        ptr = builder.inttoptr(args[0], fnty.as_pointer())
        builder.call(
            ptr,
            [
                builder.bitcast(args[1], ir.PointerType(ir.IntType(8))),
                builder.bitcast(args[2], f32p),
                context.cast(builder, args[3], signature.args[3], types.int64),
                builder.bitcast(args[4], f32p),
                context.cast(builder, args[5], signature.args[5], types.int64),
            ],
        )
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def address(typingctx, arr):
    """The data pointer of array ``arr`` (a view's first element), for passing rows to a reader."""
    sig = types.CPointer(arr.dtype)(arr)

    def codegen(context, builder, signature, args):
        return context.make_array(signature.args[0])(context, builder, args[0]).data

    return sig, codegen
