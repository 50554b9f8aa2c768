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
against the product's O(n^2); :func:`transform`'s numba kernel runs it on 16
blocks at once, one block a vector lane (each value's additions are the
scalar butterfly's, in its order), over all rows of a call in one kernel call
per thread.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..errors import TbqValueError
from ..half import f16_table
from ..intrinsics import butterfly64, butterfly128
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


#: Values a task of :func:`transform` takes (a call of fewer than two tasks stays on the calling thread).
_TASK_VALUES = 1 << 16

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
    p = np.arange(d, dtype=np.int64) if perm is None else np.ascontiguousarray(perm, dtype=np.int64)
    nn = 0 if n is None else int(n)
    scale = hadamard_scale(nn, np.float32) if nn else np.float32(1.0)
    rows = a.shape[0]
    tasks = a.size // _TASK_VALUES
    if tasks < 2 or default_threads() < 2:
        _transform_rows(a, out, p, nn, scale, inverse)
    else:
        bounds = np.linspace(0, rows, tasks + 1).astype(np.int64)

        def run(i: int) -> None:  # rows are independent: any split, any thread gives the same bits
            lo, hi = bounds[i], bounds[i + 1]
            _transform_rows(a[lo:hi], out[lo:hi], p, nn, scale, inverse)

        run_shared(tasks, default_threads(), run)  # a thread slowed by another process takes fewer tasks
    if q8_0:
        _q8_0_round_trip(out, _F16)
    return torch.from_numpy(out).reshape(shape)


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
    of the rule: :func:`q8_0_simd`, :func:`q8_0_simd_encode` and :func:`transform`
    call it.
    """
    c127 = np.float32(127.0)
    zero = np.float32(0.0)
    amax = zero
    for j in range(b0, b0 + 32):
        v = abs(x[r, j])
        if v > amax:
            amax = v
    return f32_to_f16_bits(amax / c127), (c127 / amax if amax > zero else zero)


@jit
def _q8_0_round_trip(x: Any, f16: Any) -> None:
    """Every row of ``x`` (float32, rows x n*32) replaced in place by its SIMD q8_0 codes times their fp16 scale."""
    for r in range(x.shape[0]):
        for b0 in range(0, x.shape[1], 32):
            bits, inv = _q8_0_scale(x, r, b0)
            d = f16[np.int64(bits)]
            for j in range(b0, b0 + 32):
                x[r, j] = np.float32(np.rint(x[r, j] * inv)) * d


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
