"""The float32 transforms an engine applies to K, V, Q and the attention output: channel order, rotation, q8_0.

What the engine's decisions (:mod:`tbq.hf.engine`) turn into, on torch
tensors whose last axis is a head (``head_dim`` values):

- :func:`gguf_permutation`: llama.cpp's channel order of a permuted K head;
- :func:`rotate`: the attention rotation ``x @ H_n`` in n-value blocks
  (:func:`hadamard` is the matrix);
- :func:`q8_0_simd`: Q as ggml's CPU-backend q8_0 quantizer rounds it, and
  :func:`q8_0_simd_encode` the bytes it writes for a q8_0 cache;
- :func:`transform`: the three in one pass, forward (model -> stored domain)
  or inverse (stored -> model).

How the rotation is computed, and why. llama.cpp multiplies by ``H_n`` as a
float32 matrix product (``ggml_mul_mat``, its own summation order); tbq
computes it as the spec's in-place Walsh-Hadamard butterfly in float32
(:func:`tbq.rotation.fwht`'s operations in its order, then one multiplication
by ``float32(1/sqrt(n))``), so the rows the cache stores are bit for bit the
spec's ``fwht`` of the rows, the same bits on every machine and thread count,
and tests can pin the bytes. Neither is bit-equal to the other; they differ by
float32 rounding (within ``1e-5`` of the float64 product at unit scale), far
below what any cache type's quantization changes, and ``tbq eval`` agrees with
llama-perplexity to 1e-5 (docs/eval.md). The butterfly is O(n log n) a block
against the product's O(n^2). For the engines' orders (n = 64, 128, 256)
:func:`transform`'s numba kernel holds one block of one row in ``n / 16``
vector registers of 16 float32 (:func:`_emit_row_butterfly`): the stages
h = 1 .. 8 pair values inside a register (a lane shuffle, then the sum or the
difference per lane), the stages h >= 16 whole registers; each value sees the
scalar butterfly's additions in its order (same bits). llama.cpp's channel
order (:func:`gguf_permutation`) is folded into the loads (forward) or the
stores (inverse) as an interleave of the head's two halves, and Q's q8_0
round trip runs on each row as soon as it is written, so a call reads and
writes each value once. Other orders and channel orders take the portable
kernel (:func:`_transform_rows`: 16 blocks at once, one a vector lane).
A call is one kernel call, split over threads only when it is large
(:data:`_TASK_VALUES`), never over more threads than torch's own
(``torch.get_num_threads()``: the engine runs inside the model's forward).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..errors import TbqValueError
from ..half import f16_table
from ..intrinsics import butterfly64, butterfly128, butterfly_in_registers, emit_switch
from ..kernels import f32_to_f16_bits, jit, jit_inline
from ..parallel import default_threads, run_shared
from ..rotation import hadamard_scale

__all__ = ["gguf_permutation", "hadamard", "q8_0_simd", "q8_0_simd_encode", "rotate", "transform"]


def hadamard(n: int) -> torch.Tensor:
    """The orthonormal Sylvester Walsh-Hadamard matrix of order ``n`` (float64, entries +-1/sqrt(n)).

    >>> hadamard(2) * 2 ** 0.5
    tensor([[ 1.,  1.],
            [ 1., -1.]], dtype=torch.float64)
    """
    if n < 1 or n & (n - 1):
        raise TbqValueError(f"the Walsh-Hadamard order must be a power of two, got {n}")
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def gguf_permutation(head_dim: int) -> np.ndarray:
    """Indices ``p`` with ``gguf_row = hf_row[p]`` per head: ``p[2i] = i``, ``p[2i+1] = i + head_dim/2``.

    >>> gguf_permutation(8)
    array([0, 4, 1, 5, 2, 6, 3, 7])
    """
    if head_dim % 2:
        raise TbqValueError(f"head_dim {head_dim} is odd: no RoPE pair permutation")
    half = head_dim // 2
    p = np.empty(head_dim, np.int64)
    p[0::2] = np.arange(half)
    p[1::2] = np.arange(half) + half
    return p


def rotate(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` (float32, last axis a multiple of ``n``) times the orthonormal ``H_n`` in n-value blocks along the last axis.

    The spec's in-place butterfly in float32 (:func:`tbq.rotation.fwht`'s
    operations, one multiplication by ``float32(1/sqrt(n))`` at the end, in a
    numba kernel), O(n log n) per block.
    ``H_n`` is symmetric and orthonormal, so ``rotate(rotate(x, n), n)`` is ``x``
    up to float32 rounding.
    """
    return transform(x, None, n, False)


#: Values a task of :func:`transform` takes (a call of fewer than two tasks stays on the calling thread): a
#: few milliseconds of work, so that handing a task to another thread (tens of microseconds, far more on a
#: loaded machine) never costs more than it saves.
_TASK_VALUES = 1 << 21

#: float32 value of every fp16 bit pattern (q8_0's scales).
_F16 = f16_table()

#: Blocks rotated at once, one a vector lane (a multiple of 16 float32: whole AVX-512 registers).
_LANES = 16


def transform(x: torch.Tensor, perm: Any, n: Any, inverse: bool, q8_0: bool = False) -> torch.Tensor:
    """One pass over ``x`` (float32, ..., head_dim): each head's channel order, the rotation ``H_n``, q8_0.

    ``inverse=False``: ``y[..., j] = x[..., perm[j]]``, then the rotation (the
    stored domain), then (``q8_0``) ggml's SIMD q8_0 round trip
    (:func:`q8_0_simd`); ``inverse=True``: the rotation, then back to the
    model's order. The same float32 operations as the separate steps, so the
    same bits (tests/test_hf_cache.py).
    """
    shape = x.shape
    d = shape[-1]
    a = x.detach().to(device="cpu", dtype=torch.float32).reshape(-1, d).contiguous().numpy()
    out = np.empty_like(a)
    nn = 0 if n is None else int(n)
    scale = hadamard_scale(nn, np.float32) if nn else np.float32(1.0)
    order = _channel_order(perm, d)
    fast = nn in _ROW_ORDERS and d % nn == 0
    p = np.arange(d, dtype=np.int64) if perm is None else np.ascontiguousarray(perm, dtype=np.int64)
    fused_q8 = fast and q8_0 and not inverse

    def rows(lo: int, hi: int) -> None:  # rows are independent: any split, any thread gives the same bits
        if fast:
            _transform_rows_fast(a[lo:hi], out[lo:hi], p, order, nn, scale, inverse, fused_q8, _F16)
        else:
            _transform_rows(a[lo:hi], out[lo:hi], p, nn, scale, inverse)

    tasks = a.size // _TASK_VALUES
    threads = min(default_threads(), torch.get_num_threads())
    if tasks < 2 or threads < 2:
        rows(0, a.shape[0])
    else:
        bounds = np.linspace(0, a.shape[0], tasks + 1).astype(np.int64)
        # a thread slowed by another process takes fewer tasks
        run_shared(tasks, threads, lambda i: rows(int(bounds[i]), int(bounds[i + 1])))
    if q8_0 and not fused_q8:
        _q8_0_round_trip(out, _F16)
    return torch.from_numpy(out).reshape(shape)


#: The rotation orders :func:`_transform_rows_fast` holds in registers (a block of one row: ``n / 16`` vectors).
_ROW_ORDERS = (64, 128, 256)

#: Channel orders of :func:`_transform_rows_fast`: none, llama.cpp's (an interleave of the halves), any other.
_ORDER_NONE, _ORDER_GGUF, _ORDER_OTHER = 0, 1, 2

_GGUF_ORDERS: dict[int, np.ndarray] = {}


def gguf_order(head_dim: int) -> np.ndarray:
    """:func:`gguf_permutation` as one shared read-only array per ``head_dim``: the engines hold it, and
    :func:`transform` recognises it by identity (no per-call comparison)."""
    p = _GGUF_ORDERS.get(head_dim)
    if p is None:
        p = gguf_permutation(head_dim)
        p.flags.writeable = False
        _GGUF_ORDERS[head_dim] = p
    return p


def _channel_order(perm: Any, d: int) -> int:
    """Which of the three channel orders ``perm`` (None, or indices over a head of ``d`` values) is."""
    if perm is None:
        return _ORDER_NONE
    if d % 16 or d % 2:
        return _ORDER_OTHER
    gguf = gguf_order(d)
    return _ORDER_GGUF if perm is gguf or np.array_equal(np.asarray(perm), gguf) else _ORDER_OTHER


#: float32 values a vector of :func:`_emit_row_butterfly` holds (an AVX-512 register; two AVX2 ones).
_VEC = 16


def _emit_row_butterfly(context: Any, builder: Any, signature: Any, args: Any, scale: Any, n: int, mode: int) -> None:
    """The code of :func:`_row_butterfly_typing` for one order ``n`` and ``mode``: one n-value block of one row,
    butterflied and scaled.

    ``(src, srow, dst, drow, start, half)`` (``args[0:6]``) and ``scale``: the block's values ``start
    .. start + n - 1`` of the row at flat offset ``srow`` of ``src`` (C-contiguous
    float32) are loaded into ``n / 16`` vectors of 16; the stages h = 1, 2, 4, 8
    pair lanes of one vector (a shuffle gives each lane its partner ``e ^ h``;
    the lower lane of a pair takes ``a + b``, the upper ``a - b``, ``a`` the
    lower value), the stages h = 16 .. n/2 whole vectors
    (:func:`tbq.intrinsics.butterfly_in_registers`), in the scalar butterfly's
    order, then each value is multiplied by ``scale``, one IEEE operation per
    step (the scalar loop's bits), and stored at ``drow + start`` of ``dst``.
    ``mode`` 1 loads the block in llama.cpp's channel order instead (value
    ``2i`` of the head is ``i``, value ``2i + 1`` is ``half + i``: two 8-value
    loads interleaved per vector); ``mode`` 2 stores it back in the model's
    order (even lanes at ``i``, odd ones at ``half + i``). Plain LLVM vector
    IR: any target.
    """
    nv = n // _VEC
    f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
    vt, ht = ir.VectorType(f32, _VEC), ir.VectorType(f32, _VEC // 2)
    sp = context.make_array(signature.args[0])(context, builder, args[0]).data
    dp = context.make_array(signature.args[2])(context, builder, args[2]).data
    so, do, st, hf = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (1, 3, 4, 5))

    def mask(values: list[int]) -> Any:
        return ir.Constant(ir.VectorType(i32, len(values)), values)

    def ptr(base: Any, off: Any, ty: Any) -> Any:
        return builder.bitcast(builder.gep(base, [off]), ty.as_pointer())

    def at(i: int) -> Any:  # the offset in the row of vector i of the block
        return builder.add(st, ir.Constant(i64, i * _VEC))

    def first_half(i: int) -> Any:  # mode 1/2: where its values come from (go to) in the head's halves
        return builder.lshr(at(i), ir.Constant(i64, 1))

    v = []
    for i in range(nv):
        if mode == 1:
            lo = builder.load(ptr(sp, builder.add(so, first_half(i)), ht), align=4)
            hi = builder.load(ptr(sp, builder.add(so, builder.add(hf, first_half(i))), ht), align=4)
            v.append(builder.shuffle_vector(lo, hi, mask([k // 2 + _VEC // 2 * (k % 2) for k in range(_VEC)])))
        else:
            v.append(builder.load(ptr(sp, builder.add(so, at(i)), vt), align=4))
    h = 1
    while h < _VEC:  # the stages inside a vector
        partner = mask([e ^ h for e in range(_VEC)])
        upper = ir.Constant(ir.VectorType(ir.IntType(1), _VEC), [bool(e & h) for e in range(_VEC)])
        for i in range(nv):
            b = builder.shuffle_vector(v[i], v[i], partner)
            v[i] = builder.select(upper, builder.fsub(b, v[i]), builder.fadd(v[i], b))
        h *= 2
    butterfly_in_registers(builder, v)  # the stages across vectors (h = 16, 32, ...)
    sc = builder.insert_element(ir.Constant(vt, ir.Undefined), scale, ir.Constant(i32, 0))
    sc = builder.shuffle_vector(sc, sc, mask([0] * _VEC))
    for i in range(nv):
        y = builder.fmul(v[i], sc)
        if mode == 2:
            even = builder.shuffle_vector(y, y, mask(list(range(0, _VEC, 2))))
            odd = builder.shuffle_vector(y, y, mask(list(range(1, _VEC, 2))))
            builder.store(even, ptr(dp, builder.add(do, first_half(i)), ht), align=4)
            builder.store(odd, ptr(dp, builder.add(do, builder.add(hf, first_half(i))), ht), align=4)
        else:
            builder.store(y, ptr(dp, builder.add(do, at(i)), vt), align=4)


def _row_butterfly_typing(
    typingctx: Any, src: Any, srow: Any, dst: Any, drow: Any, start: Any, half: Any, n: Any, mode: Any, scale: Any
) -> Any:
    """``(src, srow, dst, drow, start, half, n, mode, scale)``: one n-value block of one row, butterflied and
    scaled (:func:`_emit_row_butterfly`), for the orders ``n`` of :data:`_ROW_ORDERS` (64, 128; any other value:
    256) and the ``mode`` 0, 1 (any other value: 2): a switch on ``n``, then on ``mode``, to the code of each
    (:func:`tbq.intrinsics.emit_switch`)."""
    sig = types.void(
        src, types.int64, dst, types.int64, types.int64, types.int64, types.int64, types.int64, types.float32
    )

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        n_, mode_ = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (6, 7))

        def modes(o: int) -> None:  # the three modes' code of order o
            emit_switch(
                builder,
                mode_,
                (0, 1, 2),
                lambda m: _emit_row_butterfly(context, builder, signature, args, args[8], o, m),
            )

        emit_switch(builder, n_, _ROW_ORDERS, modes)
        return context.get_dummy_value()

    return sig, codegen


_row_butterfly: Any = intrinsic(_row_butterfly_typing)


@jit
def _transform_rows_fast(
    x: Any, out: Any, perm: Any, order: Any, n: Any, scale: Any, inverse: Any, q8_0: Any, f16: Any
) -> None:
    """:func:`_transform_rows` for an order ``n`` of :data:`_ROW_ORDERS`, a row at a time in registers
    (:func:`_emit_row_butterfly`), then (``q8_0``, forward) the row's q8_0 round trip
    (:func:`_q8_0_round_trip_row`): the same bits.

    ``order``: :data:`_ORDER_GGUF` folds llama.cpp's channel order into the loads or stores;
    :data:`_ORDER_OTHER` gathers (forward) or scatters (inverse) the row through ``perm`` in a scratch row.
    """
    rows, d = x.shape
    xf = x.reshape(-1)
    of = out.reshape(-1)
    tmp = np.empty(d, np.float32)
    half = d // 2
    mode = 0 if order != _ORDER_GGUF else (2 if inverse else 1)
    for r in range(rows):
        base = r * d
        if order == _ORDER_OTHER and inverse:
            for s in range(0, d, n):
                _row_butterfly(xf, base, tmp, 0, s, half, n, 0, scale)
            for j in range(d):
                out[r, perm[j]] = tmp[j]
        elif order == _ORDER_OTHER:
            for j in range(d):
                tmp[j] = x[r, perm[j]]
            for s in range(0, d, n):
                _row_butterfly(tmp, 0, of, base, s, half, n, 0, scale)
        else:
            for s in range(0, d, n):
                _row_butterfly(xf, base, of, base, s, half, n, mode, scale)
        if q8_0:
            _q8_0_round_trip_row(of, base, d, f16)


@jit
def _transform_rows(x: Any, out: Any, perm: Any, n: Any, scale: Any, inverse: Any) -> None:
    """Rows of ``x`` -> ``out``: forward ``out[r, j] = x[r, perm[j]]`` then the butterfly of each n-value block,
    inverse the butterfly then ``out[r, perm[j]]``.

    ``_LANES`` rows at a time: block ``j`` of those rows is held transposed (value-major, a row a lane), so
    each butterfly stage is one vector addition and one subtraction per pair of values; every lane sees the
    scalar butterfly's operations in its order (same bits).
    """
    rows, d = x.shape
    lanes = _LANES
    tmp = np.empty((max(n, 1), lanes), np.float32)
    flat = tmp.reshape(-1)
    for r0 in range(0, rows, lanes):
        m = min(lanes, rows - r0)
        if n == 0:
            for r in range(r0, r0 + m):
                if inverse:
                    for j in range(d):
                        out[r, perm[j]] = x[r, j]
                else:
                    for j in range(d):
                        out[r, j] = x[r, perm[j]]
        else:
            for start in range(0, d, n):
                for j in range(n):
                    src = start + j if inverse else perm[start + j]
                    for k in range(m):
                        tmp[j, k] = x[r0 + k, src]
                    for k in range(m, lanes):
                        tmp[j, k] = 0.0
                if n == 128:
                    for k0 in range(0, lanes, 8):  # in registers, two passes (kernels.butterfly128)
                        butterfly128(flat, k0, lanes)
                elif n == 64:
                    for k0 in range(0, lanes, 8):
                        butterfly64(flat, k0, lanes)
                else:  # other orders (head_dim 256, 512, ...): the same stages in loops
                    _butterfly_loops(tmp, n)
                for j in range(n):
                    dst = perm[start + j] if inverse else start + j
                    for k in range(m):
                        out[r0 + k, dst] = tmp[j, k] * scale


@jit
def _butterfly_loops(tmp: Any, n: Any) -> None:
    """The in-place butterfly's stages on the columns of ``tmp`` (n values a column), then nothing else."""
    h = 1
    while h < n:
        for s0 in range(0, n, 2 * h):
            for j in range(s0, s0 + h):
                for k in range(tmp.shape[1]):
                    a = tmp[j, k]
                    b = tmp[j + h, k]
                    tmp[j, k] = a + b
                    tmp[j + h, k] = a - b
        h *= 2


@jit_inline
def _q8_0_scale(x: Any, r: Any, b0: Any) -> tuple[Any, Any]:
    """ggml's CPU-backend q8_0 quantizer (``quantize_row_q8_0``, AVX) on values ``b0 .. b0+31`` of row ``r``:
    ``(fp16 bits of d, 127 / amax)``; the codes are ``rint(x * (127 / amax))`` (ties to even).

    ``amax = max |x|``, ``d = fp16(amax / 127)``, the codes 0 when ``amax`` is 0
    (``_mm256_round_ps``). ``quantize_row_q8_0_ref`` (``tbq.quantize(x, "q8_0")``)
    differs in two places: it multiplies by ``1 / d`` (``1/(amax/127)``, which can
    be one ulp away from ``127/amax``) and rounds half away from zero. The one copy
    of the rule: :func:`q8_0_simd_encode` calls it, :func:`q8_0_simd` and
    :func:`transform` its two parts (:func:`_amax32`, :func:`_q8_0_block_scale`)
    on rows they hold flat.
    """
    return _q8_0_block_scale(_amax32(x[r], b0))


@jit_inline
def _q8_0_block_scale(amax: Any) -> tuple[Any, Any]:
    """``(fp16 bits of amax / 127, 127 / amax)`` of a block whose ``max |x|`` is ``amax`` (0 when ``amax`` is 0)."""
    c127 = np.float32(127.0)
    zero = np.float32(0.0)
    return f32_to_f16_bits(amax / c127), (c127 / amax if amax > zero else zero)


def _amax32_typing(typingctx: Any, x: Any, off: Any) -> Any:
    """``max |x[off + j]|`` over ``j < 32`` (``x`` C-contiguous float32), at least 0, a NaN skipped.

    The scalar rule is ``amax = 0; amax = |v| if |v| > amax``: a NaN never
    compares greater, so the result is the largest non-NaN ``|v|`` (or 0),
    whatever the order. Here each of 16 lanes keeps that rule over its two
    values, then the lanes are folded pairwise with the same compare (none of
    them is a NaN): the same value. ``|v|`` is the sign bit cleared (``fabs``).
    """
    sig = types.float32(x, types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        vt, iv = ir.VectorType(f32, _VEC), ir.VectorType(i32, _VEC)
        xp = context.make_array(signature.args[0])(context, builder, args[0]).data
        off = context.cast(builder, args[1], signature.args[1], types.int64)
        m = ir.Constant(vt, [0.0] * _VEC)
        for i in range(2):
            p = builder.bitcast(builder.gep(xp, [builder.add(off, ir.Constant(i64, i * _VEC))]), vt.as_pointer())
            a = builder.load(p, align=4)
            a = builder.bitcast(builder.and_(builder.bitcast(a, iv), ir.Constant(iv, [0x7FFFFFFF] * _VEC)), vt)
            m = builder.select(builder.fcmp_ordered(">", a, m), a, m)
        w = _VEC
        while w > 1:
            w //= 2
            hi = builder.shuffle_vector(m, m, ir.Constant(iv, [(k + w) % _VEC for k in range(_VEC)]))
            m = builder.select(builder.fcmp_ordered(">", hi, m), hi, m)
        return builder.extract_element(m, ir.Constant(i32, 0))

    return sig, codegen


_amax32: Any = intrinsic(_amax32_typing)


def _scale_round32_typing(typingctx: Any, x: Any, off: Any, inv: Any, d: Any) -> Any:
    """``x[off + j] = rint(x[off + j] * inv) * d`` for ``j < 32`` (``x`` C-contiguous float32), in place.

    Two IEEE float32 products and ``llvm.rint`` (round to nearest, ties to
    even: ``np.rint``'s rule) per value, 16 values a vector: the scalar loop's bits.
    """
    sig = types.void(x, types.int64, types.float32, types.float32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        vt = ir.VectorType(f32, _VEC)
        xp = context.make_array(signature.args[0])(context, builder, args[0]).data
        off = context.cast(builder, args[1], signature.args[1], types.int64)
        rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt]), f"llvm.rint.v{_VEC}f32")

        def splat(value: Any) -> Any:
            v = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(i32, 0))
            return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, _VEC), [0] * _VEC))

        inv, d = splat(args[2]), splat(args[3])
        for i in range(2):
            p = builder.bitcast(builder.gep(xp, [builder.add(off, ir.Constant(i64, i * _VEC))]), vt.as_pointer())
            y = builder.fmul(builder.call(rint, [builder.fmul(builder.load(p, align=4), inv)]), d)
            builder.store(y, p, align=4)
        return context.get_dummy_value()

    return sig, codegen


_scale_round32: Any = intrinsic(_scale_round32_typing)


@jit_inline
def _q8_0_round_trip_row(xf: Any, base: Any, d: Any, f16: Any) -> None:
    """Values ``base .. base + d - 1`` of the flat ``xf`` (``d`` a multiple of 32) through the SIMD q8_0 round trip."""
    for b0 in range(base, base + d, 32):
        bits, inv = _q8_0_block_scale(_amax32(xf, b0))
        _scale_round32(xf, b0, inv, f16[np.int64(bits)])


@jit
def _q8_0_round_trip(x: Any, f16: Any) -> None:
    """Every row of ``x`` (float32, rows x n*32, C-contiguous) replaced in place by its SIMD q8_0 codes times
    their fp16 scale."""
    xf = x.reshape(-1)
    for r in range(x.shape[0]):
        _q8_0_round_trip_row(xf, r * x.shape[1], x.shape[1], f16)


@jit
def _q8_0_encode_rows(x: Any, out: Any) -> None:
    """Q8_0 blocks (fp16 scale little-endian, 32 int8 codes) of every row of ``x`` into ``out`` (rows x n*34)."""
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            bits, inv = _q8_0_scale(x, r, 32 * b)
            o = 34 * b
            out[r, o] = np.uint8(bits & np.uint16(0xFF))
            out[r, o + 1] = np.uint8(bits >> np.uint16(8))
            for j in range(32):
                out[r, o + 2 + j] = np.uint8(np.int8(np.rint(x[r, 32 * b + j] * inv)) & 0xFF)


def q8_0_simd(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32, last axis a multiple of 32) through ggml's SIMD q8_0 quantizer, decoded: ``code * d``.

    What a q8_0 x q8_0 dot product sees of Q (exact in float32); see :func:`q8_0_simd_encode`.

    >>> q8_0_simd(torch.full((32,), 0.5)).unique()
    tensor([0.5000])
    """
    shape = x.shape
    a = x.detach().to(device="cpu", dtype=torch.float32).reshape(-1, shape[-1]).numpy().copy()
    _q8_0_round_trip(a, _F16)
    return torch.from_numpy(a).reshape(shape)


def q8_0_simd_encode(rows: np.ndarray) -> np.ndarray:
    """q8_0 bytes of float32 ``rows`` (..., n x 32) as ggml's CPU backend writes a q8_0 KV cache.

    The layout is Q8_0's (fp16 scale, 32 int8 codes per block); the rule is
    :func:`_q8_0_scale`'s. ``tbq.dequantize(..., "q8_0")`` reads them.

    >>> q8_0_simd_encode(np.full((32,), 0.5, np.float32))[:3]
    array([  8,  28, 127], dtype=uint8)
    """
    x = np.ascontiguousarray(rows, dtype=np.float32)
    lead, d = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, d)
    out = np.empty((flat.shape[0], d // 32 * 34), np.uint8)
    _q8_0_encode_rows(flat, out)
    return out.reshape(lead + (d // 32 * 34,))
