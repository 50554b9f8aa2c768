"""numba twins of :mod:`tbq.formats.vllm_turboquant` (same bytes, same float32 bits).

One row is one (token, kv-head) vector of ``D`` values (``D`` = the row
length of ``x`` or ``out``). Every float32 operation is the reference's, in
its order; the float64 steps (the key's norm and rotation, the decoder's
exact sum) are the reference's float64 operations in the same order, the
butterfly being :func:`tbq.rotation.fwht`'s pairs stage by stage. Any NaN a
decoder produces is stored as the fp16 NaN 0x7FFF, as the reference does
(:func:`tbq.formats.vllm_turboquant.rn16`).

Where the time goes, and what each kernel does about it (docs/formats-vllm.md):

- key encode: :data:`KEY_LANES` keys at a time in a lane layout ``T[j, l]``
  (coordinate ``j`` of key ``l`` in one row, :func:`tbq.kernels.lanes_load`),
  so that the float64 norm, a sequential sum per key, runs as one chain per
  lane side by side, the float64 butterfly runs on whole rows of lanes
  (:func:`butterfly128_f64`: two passes in registers) and the midpoint count
  too (a binary search with ``vpermps`` look-ups on AVX-512,
  :func:`index16_lanes16`; every compare elsewhere). Each key still sees the
  reference's operations in its order.
- key decode: the decoded rotated key takes at most 16 (8) values per row,
  ``RN16(f16(norm) * RN32(c_k * r))`` for each index ``k``: computed once per
  row, then looked up. The un-rotation's float64 sums are exact (fp16 inputs),
  so their order is free: :func:`hadamard_row128` holds a row in 16 vector
  registers. The final rounding (:func:`unrotate_exact`) rounds the exact
  int64 product to odd at 24 bits with one int64 -> float32 conversion and
  its exactness check, instead of ``frexp``/``ldexp``: a loop LLVM vectorises.
- value decode: ``RN16(RN32(code * scale + min))`` takes 16 (8) values per
  row: a table per row, looked up 8 values at a time
  (:func:`tbq.kernels.lookup16_row` / ``lookup8_row``, ``vpermps``).

Why one module of this length: the key and value kernels of vLLM's TurboQuant share the
row-wise float64 norm, rotation and packing stages, each written to match the reference's
operations in order; split apart, a stage would be read away from the reference it mirrors.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..intrinsics import (
    TARGET_AVX2,
    TARGET_AVX512VL,
    TARGET_F16C,
    butterfly128_f64,
    butterfly_in_registers,
    f16_widen,
    lookup8_row,
    lookup16_row,
)
from ..kernels import (
    F32,
    F32_1,
    F32_HALF,
    FLT_MAX,
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_SCALE_OVERFLOW,
    count_at_least7,
    count_at_least15,
    f16_is_inf,
    f32_to_f16_bits,
    f32_to_f16_bits_finite,
    f32_to_int32,
    jit,
    jit_inline,
    lanes_load,
    reader_aux,
    reader_blocks,
    reader_out,
    thresholds7,
    thresholds15,
)
from ..packing_kernels import (
    lanes_store_lane3,
    lanes_store_nibbles,
    pack3_into,
    pack4_pairs_into,
    unpack3_into,
    unpack4_pairs_into,
)
from .q4_1_kernels import first_min_max, load_f16_at, store_f16_at

_EPS_NORM = F32(1e-8)
_EPS_NC = F32(1e-16)
_DBL_MAX = np.float64(1.7976931348623157e308)
_F16_NAN = np.uint16(0x7FFF)
_2P24 = np.float64(2.0**24)

#: Keys encoded at a time (a multiple of 8: the transposition and the butterfly work on 8 columns). 16 keys of
#: D = 128 keep the float32 and float64 lane layouts (8 and 16 KiB) in L1.
KEY_LANES = 16


# --- LLVM IR helpers ----------------------------------------------------------------------------


def _stage_within(builder: ir.IRBuilder, v: ir.Value, h: int) -> ir.Value:
    """The butterfly's stage ``h`` (1, 2 or 4) inside one ``<8 x double>``: lane ``i`` with ``i & h == 0`` becomes
    ``v[i] + v[i + h]``, lane ``i + h`` becomes ``v[i] - v[i + h]`` (the in-place butterfly's operations)."""
    i32 = ir.IntType(32)

    def mask(m: list[int]) -> ir.Constant:
        return ir.Constant(ir.VectorType(i32, 8), m)

    a = builder.shuffle_vector(v, v, mask([i & ~h for i in range(8)]))
    b = builder.shuffle_vector(v, v, mask([i | h for i in range(8)]))
    return builder.shuffle_vector(
        builder.fadd(a, b), builder.fsub(a, b), mask([8 + i if i & h else i for i in range(8)])
    )


def _make_hadamard_row(n: int):
    """The intrinsic ``hadamard_row{n}`` (see :func:`hadamard_row128`)."""

    def hadamard(typingctx, t, off):
        sig = types.void(t, types.int64)

        def codegen(context, builder, signature, args):
            v8d = ir.VectorType(ir.DoubleType(), 8)
            tp = context.make_array(signature.args[0])(context, builder, args[0]).data
            off = context.cast(builder, args[1], signature.args[1], types.int64)
            ps = [
                builder.bitcast(
                    builder.gep(tp, [builder.add(off, ir.Constant(ir.IntType(64), 8 * k))]), v8d.as_pointer()
                )
                for k in range(n // 8)
            ]
            v = [builder.load(p, align=8) for p in ps]
            for h in (1, 2, 4):
                v = [_stage_within(builder, x, h) for x in v]
            butterfly_in_registers(builder, v)
            for p, x in zip(ps, v, strict=True):
                builder.store(x, p, align=8)
            return context.get_dummy_value()

        return sig, codegen

    hadamard.__name__ = hadamard.__qualname__ = f"hadamard_row{n}"
    return intrinsic(hadamard)


#: The butterfly (Sylvester order, unnormalised) of the 128 float64 values ``t.flat[off : off + 128]`` (C-contiguous),
#: in place, held in 16 ``<8 x double>`` registers: stages 1, 2, 4 inside each vector (shuffles), 8 .. 64 between
#: them. The pairs are :func:`fwht64`'s, but an addition's operands are not always in its order; for the key
#: decoder, whose sums are exact (fp16 values: any order gives the same bits), that does not matter.
hadamard_row128 = _make_hadamard_row(128)


def _chunk_indices(builder: ir.IRBuilder, sp: ir.Value, bits: int, m: ir.Value) -> ir.Value:
    """``<8 x i32>``: the indices ``8m .. 8m+7`` of a row of packed codes at the byte pointer ``sp``: 4 bits, bytes
    ``4m .. 4m+3`` (low nibble, then high, per byte: ``pair4``); 3 bits, the 24-bit lane at bytes ``3m .. 3m+2``
    (``lane3``). Only those bytes are read."""
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    v8i, v4i = ir.VectorType(i32, 8), ir.VectorType(i32, 4)
    if bits == 4:
        p = builder.gep(sp, [builder.mul(m, ir.Constant(i64, 4))])
        w = builder.zext(builder.load(builder.bitcast(p, ir.VectorType(i8, 4).as_pointer()), align=1), v4i)
        lo = builder.and_(w, ir.Constant(v4i, [15] * 4))
        hi = builder.lshr(w, ir.Constant(v4i, [4] * 4))
        return builder.shuffle_vector(lo, hi, ir.Constant(v8i, [0, 4, 1, 5, 2, 6, 3, 7]))
    base = builder.mul(m, ir.Constant(i64, 3))
    lane = ir.Constant(i32, 0)
    for e in range(3):
        byte = builder.zext(builder.load(builder.gep(sp, [builder.add(base, ir.Constant(i64, e))])), i32)
        lane = builder.or_(lane, builder.shl(byte, ir.Constant(i32, 8 * e)))
    vl = builder.insert_element(ir.Constant(v8i, ir.Undefined), lane, ir.Constant(i32, 0))
    vl = builder.shuffle_vector(vl, vl, ir.Constant(v8i, [0] * 8))
    return builder.and_(builder.lshr(vl, ir.Constant(v8i, [3 * t for t in range(8)])), ir.Constant(v8i, [7] * 8))


def _table_lookup(builder: ir.IRBuilder, tp: ir.Value, bits: int):
    """A function ``look(idx)`` of ``<8 x i32>`` indices: ``<8 x float>`` of the float32 table at ``tp`` (16 entries
    for 4 bits, 8 for 3), the table held in registers: AVX-512VL ``vpermt2ps`` (16 entries), else ``vpermps`` (8
    entries; 16: two and a select on the half). AVX2 targets only (:data:`tbq.kernels.TARGET_AVX2`)."""
    i32 = ir.IntType(32)
    v8f, v8i = ir.VectorType(ir.FloatType(), 8), ir.VectorType(i32, 8)
    permps = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8f, [v8f, v8i]), "llvm.x86.avx2.permps")
    lo = builder.load(builder.bitcast(tp, v8f.as_pointer()), align=4)
    if bits == 3:
        return lambda idx: builder.call(permps, [lo, idx])
    hi = builder.load(builder.bitcast(builder.gep(tp, [ir.Constant(ir.IntType(64), 8)]), v8f.as_pointer()), align=4)
    if TARGET_AVX512VL:
        vperm2 = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v8f, [v8f, v8i, v8f]), "llvm.x86.avx512.vpermi2var.ps.256"
        )
        return lambda idx: builder.call(vperm2, [lo, idx, hi])
    seven = ir.Constant(v8i, [7] * 8)
    return lambda idx: builder.select(
        builder.icmp_unsigned(">", idx, seven), builder.call(permps, [hi, idx]), builder.call(permps, [lo, idx])
    )


def _code_chunks(context, builder: ir.IRBuilder, signature, args, table_arg: int, bits: int):
    """A function ``chunk(m)`` (``m`` an i64 value) for the intrinsics that read a row of packed codes (arguments
    0 and 1: ``data.flat[soff:]``): the ``<8 x float>`` values of its indices ``8m .. 8m+7``
    (:func:`_chunk_indices`) in the table of argument ``table_arg`` (:func:`_table_lookup`, loaded here once)."""
    dp = context.make_array(signature.args[0])(context, builder, args[0]).data
    sp = builder.gep(dp, [context.cast(builder, args[1], signature.args[1], types.int64)])
    table = context.make_array(signature.args[table_arg])(context, builder, args[table_arg]).data
    look = _table_lookup(builder, table, bits)
    return lambda m: look(_chunk_indices(builder, sp, bits, m))


def _make_nc_sum(bits: int):
    """The intrinsic ``nc_sum{bits}`` (see :func:`nc_sum4`)."""

    def nc_sum(typingctx, data, soff, chunks, csq):
        sig = types.float32(data, types.int64, types.int64, csq)

        def codegen(context, builder, signature, args):
            i32, i64 = ir.IntType(32), ir.IntType(64)
            chunk = _code_chunks(context, builder, signature, args, 3, bits)
            chunks = context.cast(builder, args[2], signature.args[2], types.int64)
            acc = cgutils.alloca_once_value(builder, chunk(ir.Constant(i64, 0)))
            with cgutils.for_range(builder, builder.sub(chunks, ir.Constant(i64, 1))) as loop:
                c = chunk(builder.add(loop.index, ir.Constant(i64, 1)))
                builder.store(builder.fadd(builder.load(acc), c), acc)
            p = [builder.extract_element(builder.load(acc), ir.Constant(i32, k)) for k in range(8)]
            a = builder.fadd(builder.fadd(p[0], p[1]), builder.fadd(p[2], p[3]))
            b = builder.fadd(builder.fadd(p[4], p[5]), builder.fadd(p[6], p[7]))
            return builder.fadd(a, b)

        return sig, codegen

    nc_sum.__name__ = nc_sum.__qualname__ = f"nc_sum{bits}"
    return intrinsic(nc_sum)


#: numpy's pairwise float32 sum (a block of at most 128 values) of ``csq[idx_j]`` over the ``8 * chunks`` indices of
#: the packed 4-bit codes at ``data.flat[soff:]`` (C-contiguous uint8): the 8 partial sums ``p_k = a_k + a_{k+8} +
#: ...`` are the lanes of one ``<8 x float>`` accumulated chunk by chunk (in order, from the first chunk), then
#: ``((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7))``: :func:`pairwise_sum32`'s operations. ``csq`` float32, 16 entries. AVX2
#: targets only; ``nc_sum3`` is the 3-bit twin (8 entries).
nc_sum4 = _make_nc_sum(4)
nc_sum3 = _make_nc_sum(3)


def _make_unrotate_input(bits: int):
    """The intrinsic ``hadamard_lookup{bits}`` (see :func:`hadamard_lookup4`)."""

    def hadamard_lookup(typingctx, data, soff, yt, t):
        sig = types.void(data, types.int64, yt, t)

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            v8d = ir.VectorType(ir.DoubleType(), 8)
            chunk = _code_chunks(context, builder, signature, args, 2, bits)
            tp = context.make_array(signature.args[3])(context, builder, args[3]).data
            v = [builder.fpext(chunk(ir.Constant(i64, m)), v8d) for m in range(16)]
            for h in (1, 2, 4):
                v = [_stage_within(builder, x, h) for x in v]
            butterfly_in_registers(builder, v)
            for m, x in enumerate(v):
                builder.store(x, builder.bitcast(builder.gep(tp, [ir.Constant(i64, 8 * m)]), v8d.as_pointer()), align=8)
            return context.get_dummy_value()

        return sig, codegen

    hadamard_lookup.__name__ = hadamard_lookup.__qualname__ = f"hadamard_lookup{bits}"
    return intrinsic(hadamard_lookup)


#: ``t[0:128]`` (float64, C-contiguous) = the butterfly (Sylvester order, unnormalised) of ``yt[idx_j]`` (widened to
#: float64, exact) over the 128 packed 4-bit codes at ``data.flat[soff:]``: the key decoder's un-rotation sums, the
#: row held in 16 ``<8 x double>`` registers (stages 1, 2, 4 inside each vector, 8 .. 64 between them). The pairs
#: are :func:`fwht64`'s, but an addition's operands are not always in its order: for finite fp16 inputs every sum
#: is exact, so any order gives the same bits (callers pass only rows whose ``yt`` is finite). ``yt`` float32, 16
#: entries. AVX2 targets only; ``hadamard_lookup3`` is the 3-bit twin (8 entries).
hadamard_lookup4 = _make_unrotate_input(4)
hadamard_lookup3 = _make_unrotate_input(3)


def _make_index_lanes16(levels: int):
    """The intrinsic ``index16_lanes{levels}`` (see :func:`index16_lanes16`)."""

    def index16_lanes(typingctx, T, toff, stride, n, K, mids16):
        sig = types.void(T, types.int64, types.int64, types.int64, K, mids16)

        def codegen(context, builder, signature, args):
            i32, i64 = ir.IntType(32), ir.IntType(64)
            v8d, v16f, v16i = (
                ir.VectorType(ir.DoubleType(), 8),
                ir.VectorType(ir.FloatType(), 16),
                ir.VectorType(i32, 16),
            )
            tp, kp, mp = (context.make_array(signature.args[k])(context, builder, args[k]).data for k in (0, 4, 5))
            toff, stride, n = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (1, 2, 3))
            perm = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v16f, [v16f, v16i]), "llvm.x86.avx512.permvar.sf.512"
            )
            m = builder.load(builder.bitcast(mp, v16f.as_pointer()), align=4)

            def splat(k):
                return builder.shuffle_vector(m, m, ir.Constant(v16i, [k] * 16))

            def step(k, thr, bit, y):  # k + bit where y >= thr (ordered: false for NaN, as numpy's y >= m)
                ge = builder.sext(builder.fcmp_ordered(">=", y, thr), v16i)
                return builder.add(k, builder.and_(ge, ir.Constant(v16i, [bit] * 16)))

            with cgutils.for_range(builder, n) as loop:
                off = builder.add(toff, builder.mul(loop.index, stride))
                halves = []
                for h in range(2):
                    p = builder.gep(tp, [builder.add(off, ir.Constant(i64, 8 * h))])
                    halves.append(
                        builder.fptrunc(
                            builder.load(builder.bitcast(p, v8d.as_pointer()), align=8),
                            ir.VectorType(ir.FloatType(), 8),
                        )
                    )
                y = builder.shuffle_vector(halves[0], halves[1], ir.Constant(v16i, list(range(16))))
                top = levels // 2  # the first compare: midpoint top - 1 decides the half
                k = step(ir.Constant(v16i, [0] * 16), splat(top - 1), top, y)
                bit = top // 2
                while bit:
                    thr = builder.call(perm, [m, builder.add(k, ir.Constant(v16i, [bit - 1] * 16))])
                    k = step(k, thr, bit, y)
                    bit //= 2
                builder.store(k, builder.bitcast(builder.gep(kp, [off]), v16i.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    index16_lanes.__name__ = index16_lanes.__qualname__ = f"index16_lanes{levels}"
    return intrinsic(index16_lanes)


#: The key encoder's index step on 16 lanes of its float64 lane layout (AVX-512 targets only,
#: :data:`tbq.kernels.TARGET_AVX512VL`): ``K.flat[toff + j*stride + t]`` = the number of midpoints ``<=
#: RN32(T.flat[toff + j*stride + t])`` for ``j < n``, ``t < 16``, by binary search in the strictly increasing
#: midpoints ``mids16`` (15 of them, padded to 16 float32): the compare with midpoint 7 decides the half, each
#: next one looks its midpoint up with one ``vpermps`` in the 16 entries. For sorted midpoints that is the count
#: :func:`index_lanes` takes (a NaN compares false everywhere: 0 either way). ``index16_lanes8``: 7 midpoints,
#: 8 levels. ``T`` float64, ``K`` int32, both C-contiguous.
index16_lanes16 = _make_index_lanes16(16)
index16_lanes8 = _make_index_lanes16(8)


@intrinsic
def f32_to_f16_rn(typingctx, f):
    """fp16 bits (uint16) of float32 ``f``, round to nearest even: with F16C LLVM's ``fptrunc float -> half``
    (``vcvtps2ph``, one instruction, which a loop vectorises 8 or 16 values at a time), else
    :func:`tbq.kernels.f32_to_f16_bits_finite`. Exact for finite and infinite ``f`` (tests compare it with
    :func:`tbq.kernels.f32_to_f16_bits` on every exponent); a NaN gives some NaN (callers that store one fix it).
    (A candidate for :mod:`tbq.kernels`, written here because that module is shared.)"""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        if TARGET_F16C:
            return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
        return context.compile_internal(builder, f32_to_f16_bits_finite.py_func, signature, args)

    return sig, codegen


# --- scalar helpers -----------------------------------------------------------------------------


@jit
def rn16_bits(f):
    """fp16 bits of float32 ``f`` (round to nearest even), any NaN as 0x7FFF."""
    b = f32_to_f16_bits(f)
    return _F16_NAN if (b & np.uint16(0x7FFF)) > np.uint16(0x7C00) else b


@jit
def fwht64(t):
    """In-place float64 Walsh-Hadamard butterfly (Sylvester order, unnormalised): :func:`tbq.rotation.fwht`'s pairs."""
    n = t.shape[0]
    h = 1
    while h < n:
        for i in range(0, n, 2 * h):
            for j in range(i, i + h):
                a = t[j]
                b = t[j + h]
                t[j] = a + b
                t[j + h] = a - b
        h *= 2


@jit
def _pack_row(idx, out, b, bits, d):
    """The ``d`` indices ``idx`` packed at the start of row ``b`` of ``out`` (4 bits: :func:`pack4_pairs_into`; 3
    bits: :func:`pack3_into`)."""
    if bits == 4:
        pack4_pairs_into(idx[:d], out[b])
    else:
        pack3_into(idx[:d], out[b])


@jit
def _unpack_row(data, b, bits, idx):
    """The inverse of :func:`_pack_row`: the ``idx.shape[0]`` indices of row ``b`` of ``data``."""
    if bits == 4:
        unpack4_pairs_into(data[b], idx)
    else:
        unpack3_into(data[b], idx)


# --- keys -------------------------------------------------------------------------------------


@jit
def fwht_lanes(T):
    """:func:`fwht64` on every column of the lane layout ``T`` (n x lanes, float64), in place: the same pairs, stage
    by stage, in each column."""
    n, nl = T.shape
    h = 1
    while h < n:
        for i in range(0, n, 2 * h):
            for j in range(i, i + h):
                for l in range(nl):
                    a = T[j, l]
                    b = T[j + h, l]
                    T[j, l] = a + b
                    T[j + h, l] = a - b
        h *= 2


@jit_inline
def _count_lanes(T64, K, count, m):
    d, lanes = T64.shape
    for j in range(d):
        for l in range(lanes):
            K[j, l] = count(F32(T64[j, l]), m)


@jit
def index_lanes(T64, K, mids):
    """``K[j, l]`` = the number of midpoints ``<= RN32(T64[j, l])`` (15 or 7 of them; a NaN counts 0), every
    compare of every lane (:func:`tbq.kernels.count_at_least15` / ``7``): a loop over lanes that vectorises (the
    comparison of ``-0`` and ``+0`` with a midpoint is the same, so the reference's ``+ 0.0`` changes no count)."""
    if mids.shape[0] == 15:
        _count_lanes(T64, K, count_at_least15, thresholds15(mids))
    else:
        _count_lanes(T64, K, count_at_least7, thresholds7(mids))


@jit
def encode_keys(x, out, bits, mids, sh, raise_overflow, lanes):
    """Keys: norm (float64, index order), ``xh = x / (n + 1e-8)``, ``y = RN32(butterfly(xh * s * h))`` in float64,
    indices = midpoints ``<= y``, packed, then fp16 ``n``; ``lanes`` keys at a time (a multiple of 8).

    A key whose input is not finite (its float64 sum of squares is inf or NaN: finite float32 squares cannot
    overflow it) stops the kernel there (``STATUS_NONFINITE``), as does, with ``raise_overflow``, a norm that is
    inf in fp16 (``STATUS_SCALE_OVERFLOW``); the keys before it are written, it and those after are not.
    """
    rows, d = x.shape
    mb = d * bits // 8
    T = np.zeros((d, lanes), np.float32)
    T64 = np.zeros((d, lanes), np.float64)
    T64f = T64.reshape(T64.size)
    K = np.zeros((d, lanes), np.int32)
    Kf = K.reshape(K.size)
    P = np.zeros((d // 8, lanes), np.int32)  # 3 bits: the 24-bit lanes
    acc = np.zeros(lanes, np.float64)
    den = np.ones(lanes, np.float32)
    nbits = np.zeros(lanes, np.uint16)
    n_mid = mids.shape[0]
    m16 = np.zeros(16, np.float32)
    for i in range(n_mid):
        m16[i] = mids[i]
    for g0 in range(0, rows, lanes):
        L = min(lanes, rows - g0)
        lanes_load(x, g0, T)
        # the norm: each key's float64 sum of exact squares in index order (one chain per lane)
        for l in range(lanes):
            acc[l] = 0.0
        for j in range(d):
            for l in range(lanes):
                v = np.float64(T[j, l])
                acc[l] += v * v
        stop = L
        status = STATUS_OK
        for l in range(L):
            if not (acc[l] <= _DBL_MAX):
                stop, status = l, STATUS_NONFINITE
                break
            n = F32(np.sqrt(acc[l]))
            h = f32_to_f16_bits(n)
            if raise_overflow and f16_is_inf(h):
                stop, status = l, STATUS_SCALE_OVERFLOW
                break
            nbits[l] = h
            den[l] = F32(n + _EPS_NORM)
        for l in range(stop, lanes):
            den[l] = F32_1
        # xh = RN32(x / den), times s_j * h (exact in float64), then the float64 butterfly
        for j in range(d):
            s = sh[j]
            for l in range(lanes):
                T64[j, l] = np.float64(T[j, l] / den[l]) * s
        if d == 128:
            for l0 in range(0, lanes, 8):
                butterfly128_f64(T64f, l0, lanes)
        else:
            fwht_lanes(T64)
        if TARGET_AVX512VL and lanes % 16 == 0:
            for l0 in range(0, lanes, 16):
                if n_mid == 15:
                    index16_lanes16(T64f, l0, lanes, d, Kf, m16)
                else:
                    index16_lanes8(T64f, l0, lanes, d, Kf, m16)
        else:
            index_lanes(T64, K, mids)
        # store the indices and the norms of the keys before ``stop``
        if bits == 4:
            lanes_store_nibbles(K, out, g0, stop, 0)  # the indices first, the norm after them
        else:
            lanes_store_lane3(K, P, out, g0, stop, 0)
        for l in range(stop):
            store_f16_at(out, g0 + l, mb, nbits[l])
        if stop < L:
            return g0 + stop, status
    return -1, STATUS_OK


@jit
def _pw_block(a, lo, n):
    """numpy's pairwise block of ``n`` (8..128, a multiple of 8) float32 values from ``a[lo]``."""
    p0, p1, p2, p3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    p4, p5, p6, p7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    for i in range(lo + 8, lo + n, 8):
        p0 += a[i]
        p1 += a[i + 1]
        p2 += a[i + 2]
        p3 += a[i + 3]
        p4 += a[i + 4]
        p5 += a[i + 5]
        p6 += a[i + 6]
        p7 += a[i + 7]
    return ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))


@jit
def pairwise_sum32(a, sums):
    """numpy's pairwise float32 sum of ``a`` (a power-of-two length >= 8): 128-value blocks, halves added pairwise;
    ``sums`` a scratch of at least ``len(a) // 128`` values."""
    n = a.shape[0]
    if n <= 128:
        return _pw_block(a, 0, n)
    m = n // 128
    for i in range(m):
        sums[i] = _pw_block(a, 128 * i, 128)
    while m > 1:
        for i in range(m // 2):
            sums[i] = sums[2 * i] + sums[2 * i + 1]
        m //= 2
    return sums[0]


@jit
def round_odd_f32(p, k):
    """``p * 2**k`` (int64 ``p``) rounded to odd at 24 significant bits, as float32 (see ``_round_odd_f32``)."""
    if p == 0:
        return F32(0.0)
    a = p if p > 0 else -p
    e = math.frexp(np.float64(a))[1]
    if (a >> (e - 1)) == 0:
        e -= 1
    d = e - 24 if e > 24 else 0
    m = a >> d
    if (a & ((np.int64(1) << d) - 1)) != 0:
        m |= 1
    f = F32(math.ldexp(np.float64(m), d + k))
    return -f if p < 0 else f


@jit
def unrotate_bits(s, sgn, mant, exp):
    """fp16 bits of the exact ``s * sgn * mant * 2**exp`` (``s`` an exact float64 sum of fp16 values)."""
    if not np.isfinite(s):
        return rn16_bits(F32(s * np.float64(sgn)))
    p = np.int64(s * _2P24) * np.int64(mant) * np.int64(sgn)
    return rn16_bits(round_odd_f32(p, exp - 24))


@jit
def unrotate_exact(s, m, scale):
    """fp16 bits of ``RN16(s * m * 2**(exp - 24))`` (``scale = 2**(exp - 24)``) for a finite ``s``, an exact float64
    sum of fp16 values (so ``s * 2**24`` is an integer below ``2**50``), and ``m = mant * sign`` (``|m| < 2**11``):
    :func:`unrotate_bits`'s value, without ``frexp``/``ldexp``.

    ``p = s * 2**24 * m`` is an exact int64; ``f = RN32(p)`` (one conversion), and when ``f`` is inexact
    (``int64(f) != p``) with an even last bit, the neighbour of ``f`` on ``p``'s side (bits +- 1): ``p`` rounded
    to odd at 24 bits. Times ``scale``, a power of two, it stays exact (``|p * scale|`` lies in ``[2**-29,
    2**26]`` for every ``head_dim``: float32 normals); rounded to fp16 (ties to even, exact for finite values)
    it is the correctly rounded fp16 of the exact product. ``p = 0`` gives +0. Branch-free: a loop vectorises.
    """
    p = np.int64(s * _2P24) * m
    f = F32(p)
    back = np.int64(f)
    fb = f.view(np.uint32)
    up = (p > back) == (p > 0)  # the exact value lies beyond f in magnitude
    adj = np.uint32(fb | np.uint32(1)) if up else np.uint32(fb - np.uint32(1))
    fb = adj if (back != p and np.uint32(fb & np.uint32(1)) == np.uint32(0)) else fb
    return f32_to_f16_rn(np.uint32(fb).view(np.float32) * scale)


@jit
def nc_sum_row(data, b, bits, d, csq, idx, cc, sums):
    """The NC sum of row ``b``: numpy's pairwise float32 sum of ``csq[idx_j]`` (:func:`pairwise_sum32`), with AVX2 by
    :func:`nc_sum4` / ``nc_sum3`` per block of 128 (the blocks then added pairwise), else unpacked into ``idx``
    and ``cc``."""
    if TARGET_AVX2:
        off = b * data.shape[1]
        if d <= 128:
            return nc_sum4(data, off, d // 8, csq) if bits == 4 else nc_sum3(data, off, d // 8, csq)
        m = d // 128
        for i in range(m):
            o = off + i * 16 * bits
            sums[i] = nc_sum4(data, o, 16, csq) if bits == 4 else nc_sum3(data, o, 16, csq)
        while m > 1:
            for i in range(m // 2):
                sums[i] = sums[2 * i] + sums[2 * i + 1]
            m //= 2
        return sums[0]
    _unpack_row(data, b, bits, idx)
    for j in range(d):
        cc[j] = csq[idx[j]]
    return pairwise_sum32(cc, sums)


@jit
def decode_keys(data, out, bits, cents, s16, mant, exp, table, rotated):
    """Keys: NC-corrected centroids times the fp16 norm, rounded to fp16 (``rotated``: stop there), then the exact
    fp16 un-rotation (the butterfly on the fp16 values, exact, then one rounding).

    Per row: the NC sum over ``RN32(c^2)[idx]`` in numpy's pairwise order (:func:`nc_sum_row`; an order-dependent
    float32 sum, not a function of the index counts), then the row's rotated values ``yt[k] = RN16(f16(norm) *
    RN32(c_k * r))`` for the 16 (8) indices, looked up. A row whose ``yt`` holds an inf or NaN (arbitrary bytes:
    an inf or NaN norm, or an overflow) takes the reference's order of the float64 butterfly (:func:`fwht64`)
    and its per-value rounding (:func:`unrotate_bits`); a finite row, whose sums are exact in any order,
    :func:`hadamard_lookup4` / ``3`` (AVX2, D = 128), :func:`hadamard_row128` (D = 128) or :func:`fwht64`, then
    :func:`unrotate_exact`."""
    rows, d = out.shape
    ts = data.shape[1]
    mb = d * bits // 8
    nc = cents.shape[0]
    csq = np.zeros(16, np.float32)
    for k in range(nc):
        csq[k] = cents[k] * cents[k]
    mj = np.empty(d, np.int64)
    for j in range(d):
        mj[j] = np.int64(mant) * np.int64(s16[j])
    scale = F32(math.ldexp(1.0, exp - 24))
    idx = np.empty(d, np.int32)
    cc = np.empty(d, np.float32)
    sums = np.empty(d // 128 + 1, np.float32)
    t = np.empty(d, np.float64)
    yt = np.zeros(16, np.float32)
    lookup = TARGET_AVX2 and d % 128 == 0
    for b in range(rows):
        s = nc_sum_row(data, b, bits, d, csq, idx, cc, sums)
        r = F32(F32_1 / F32(np.sqrt(F32(s + _EPS_NC))))
        nf = load_f16_at(data, b, mb, table)
        for k in range(nc):  # RN16 with any NaN as 0x7FFF (rn16_bits), branch-free: one vector loop
            h = f32_to_f16_rn(F32(nf * F32(cents[k] * r)))
            h = _F16_NAN if np.uint16(h & np.uint16(0x7FFF)) > np.uint16(0x7C00) else h
            yt[k] = np.uint32(f16_widen(h)).view(np.float32)
        finite = True
        for k in range(nc):
            finite = finite and abs(yt[k]) <= FLT_MAX
        orow = out[b]
        if rotated and lookup:
            for c in range(d // 128):
                if bits == 4:
                    lookup16_row(data, b * ts + 64 * c, out, b * d + 128 * c, yt, F32_1)
                else:
                    lookup8_row(data, b * ts + 48 * c, out, b * d + 128 * c, yt, F32_1)
            continue
        if finite and lookup and d == 128:
            if bits == 4:
                hadamard_lookup4(data, b * ts, yt, t)
            else:
                hadamard_lookup3(data, b * ts, yt, t)
        else:
            _unpack_row(data, b, bits, idx)
            if rotated:
                for j in range(d):
                    orow[j] = yt[idx[j]]
                continue
            for j in range(d):
                t[j] = np.float64(yt[idx[j]])
            if finite and d == 128:
                hadamard_row128(t, 0)
            else:
                fwht64(t)
            if not finite:
                for j in range(d):
                    orow[j] = table[np.int64(unrotate_bits(t[j], s16[j], mant, exp))]
                continue
        for j in range(d):
            orow[j] = np.uint32(f16_widen(unrotate_exact(t[j], mj[j], scale))).view(np.float32)


# --- values -----------------------------------------------------------------------------------


@jit
def encode_values(x, out, bits, raise_overflow, table):
    """Values: ``scale = max(RN32(RN32(max - min) / Q), 1e-8)``, codes ``clamp(trunc(RN32(RN32((v - min) / scale) + 0.5)))``,
    packed, then fp16 scale and fp16 min. ``raise_overflow``: stop at a block whose fp16 scale or minimum is
    infinite or whose top code decodes to an infinite fp16 value (the reference's ``invalid_blocks``)."""
    rows, d = x.shape
    q = (1 << bits) - 1
    qf = F32(q)
    vdb = d * bits // 8
    codes = np.empty(d, np.int32)
    for b in range(rows):
        vmin, vmax, fin = first_min_max(x[b], d)
        if not fin:
            return b, STATUS_NONFINITE
        sc = F32(F32(vmax - vmin) / qf)
        if not (sc > _EPS_NORM):
            sc = _EPS_NORM
        dbits = f32_to_f16_bits(sc)
        mbits = f32_to_f16_bits(vmin)
        if raise_overflow and (f16_is_inf(dbits) or f16_is_inf(mbits)):
            return b, STATUS_SCALE_OVERFLOW
        qmax = 0
        for j in range(d):
            u = F32(F32(F32(x[b, j] - vmin) / sc) + F32_HALF)
            qi = f32_to_int32(u)
            qi = q if qi > q else qi
            qi = 0 if qi < 0 else qi
            codes[j] = qi
            qmax = qi if qi > qmax else qmax
        if raise_overflow:
            top = F32(F32(F32(qmax) * table[np.int64(dbits)]) + table[np.int64(mbits)])
            if f16_is_inf(f32_to_f16_bits(top)):
                return b, STATUS_SCALE_OVERFLOW
        _pack_row(codes, out, b, bits, d)
        store_f16_at(out, b, vdb, dbits)
        store_f16_at(out, b, vdb + 2, mbits)
    return -1, STATUS_OK


@jit
def decode_values(data, out, bits, table):
    """Values: ``RN16(RN32(code * scale + min))``: per row the 16 (8) values of the codes, then looked up (AVX2 and
    D a multiple of 128: :func:`tbq.kernels.lookup16_row` / ``lookup8_row``, whose product by 1 is exact)."""
    rows, d = out.shape
    ts = data.shape[1]
    vdb = d * bits // 8
    nc = 1 << bits
    yt = np.zeros(16, np.float32)
    codes = np.empty(d, np.int32)
    fast = TARGET_AVX2 and d % 128 == 0
    for b in range(rows):
        sc = load_f16_at(data, b, vdb, table)
        z = load_f16_at(data, b, vdb + 2, table)
        for k in range(nc):
            yt[k] = table[np.int64(rn16_bits(F32(F32(F32(k) * sc) + z)))]
        if fast:
            for c in range(d // 128):
                if bits == 4:
                    lookup16_row(data, b * ts + 64 * c, out, b * d + 128 * c, yt, F32_1)
                else:
                    lookup8_row(data, b * ts + 48 * c, out, b * d + 128 * c, yt, F32_1)
        else:
            _unpack_row(data, b, bits, codes)
            orow = out[b]
            for j in range(d):
                orow[j] = yt[codes[j]]


# --- the fused attention kernel's readers (tbq.kernels.READER_SIG), original domain -------------


def attention_read_keys(src, dst, n_blocks, aux, n_aux):
    """``n_blocks`` keys decoded as :func:`decode_keys` (model domain); ``aux`` = [D, bits, mant, exp, centroids,
    signs, the f16 table] (:meth:`tbq.formats.vllm_turboquant._Keys.attention_tables`)."""
    a = reader_aux(aux, n_aux)
    d = np.int64(a[0])
    bits = np.int64(a[1])
    n_c = np.int64(1) << bits
    s16 = np.empty(d, np.int64)
    for j in range(d):
        s16[j] = np.int64(a[4 + n_c + j])
    decode_keys(
        reader_blocks(src, n_blocks, d * bits // 8 + 2),
        reader_out(dst, n_blocks, d),
        bits,
        a[4 : 4 + n_c],
        s16,
        np.int64(a[2]),
        np.int64(a[3]),
        a[4 + n_c + d :],
        False,
    )


def attention_read_values(src, dst, n_blocks, aux, n_aux):
    """``n_blocks`` values decoded as :func:`decode_values`; ``aux`` = [D, bits, the f16 table]."""
    a = reader_aux(aux, n_aux)
    d = np.int64(a[0])
    bits = np.int64(a[1])
    decode_values(reader_blocks(src, n_blocks, d * bits // 8 + 4), reader_out(dst, n_blocks, d), bits, a[2:])
