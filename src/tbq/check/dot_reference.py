"""The dot-product check's reference: the right-hand format ggml pairs with a left one, and tbq's exact dot
product of two quantized rows with its derived bound (:func:`reference_dot`)."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from ..errors import TbqValueError
from ..formats import Format, get_format
from ..formats.base import FORMAT_CLASSES

U32 = 2.0**-24
#: Roundings a term meets besides one addition per block: dx * dy, the partial sum's product, a horizontal sum
#: of up to 16 lanes (4 levels), and the final conversion; a first-order bound, widened by 1%.
ROUNDINGS = 8


def right_format(left: Format, rhs: str | Format | None = None) -> Format:
    """The right operand's format: ``rhs`` when given, else the one ggml pairs ``left`` with (``vec_dot_type``)."""
    if isinstance(rhs, Format):
        right = rhs
    elif rhs is not None:
        right = get_format(rhs)
    elif left.checker.vec_dot_type:
        right = get_format(left.checker.vec_dot_type)
    else:
        pairs = ", ".join(
            f"{n} x {c.checker.vec_dot_type}" for n, c in FORMAT_CLASSES.items() if c.checker.vec_dot_type
        )
        raise TbqValueError(
            f"tbq does not check {left.name} dot products yet: its vec_dot type is not a registered format with an "
            f"exact integer form; the pairs it checks: {pairs}"
        )
    zl, zr = np.zeros((1, left.type_size), np.uint8), np.zeros((1, right.type_size), np.uint8)
    _dot_parts(right, zr)  # refused here, before any work, if it has none
    if left.checker.dot_parts(zl) is not None and left.block_size != right.block_size:
        raise TbqValueError(
            f"{left.name} ({left.block_size} values a block) and {right.name} ({right.block_size}) do not pair"
        )
    if left.checker.dot_offset(zl) is not None and right.checker.dot_offset(zr) is None:
        raise TbqValueError(
            f"{left.name} blocks have a minimum (values codes * d + m): ggml pairs them only with a right operand "
            f"that stores its block sum ({left.checker.vec_dot_type or 'q8_1'}), not {right.name}"
        )
    return right


def pair_unit(left: Format, right: Format) -> int:
    """Values of the shortest row both operands tile: the least common multiple of the two block sizes.

    >>> import tbq
    >>> pair_unit(tbq.get_format("q4_0"), tbq.get_format("q8_0")), pair_unit(tbq.get_format("tbq4_0"), tbq.get_format("q8_0"))
    (32, 128)
    """
    return math.lcm(left.block_size, right.block_size)


def _dot_parts(fmt: Format, data: NDArray[np.uint8]) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """``fmt.checker.dot_parts(data)`` of a format :func:`right_format` accepted (it refuses one without them)."""
    parts = fmt.checker.dot_parts(data)
    if parts is None:
        raise TbqValueError(
            f"{fmt.name} has no exact integer form (dot_parts), so tbq cannot check dot products with it"
        )
    return parts


def reference_dot(
    left: Format, right: Format, x: bytes | NDArray[np.uint8], y: bytes | NDArray[np.uint8]
) -> tuple[np.float32, float]:
    """``(exact, bound)`` of one dot product: the float32 of the exact sum and the derived accumulation bound.

    >>> import tbq
    >>> q4, q8 = tbq.get_format("q4_0"), tbq.get_format("q8_0")
    >>> v = np.linspace(-1, 1, 64, dtype=np.float32)[None, :]
    >>> s, b = reference_dot(q4, q8, q4.encode(v), q8.encode(v))
    >>> float(s) == float(np.dot(q4.decode(q4.encode(v))[0].astype(np.float64), q8.decode(q8.encode(v))[0].astype(np.float64))), b < 1e-4
    (True, True)
    """
    xb = np.frombuffer(bytes(x), np.uint8).reshape(-1, left.type_size)
    yb = np.frombuffer(bytes(y), np.uint8).reshape(-1, right.type_size)
    terms, mags = _terms(left, right, xb, yb)
    if not np.isfinite(terms).all():
        return np.float32(np.nan), math.inf
    total = math.fsum(terms.tolist())
    with np.errstate(over="ignore"):
        exact = np.float32(total)
    m = mags.size  # additions: one per block (integer path) or per value (value path)
    bound = 1.01 * (m + ROUNDINGS) * U32 * float(mags.sum()) + m * 2.0**-149
    return exact, bound


def _split12(a: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(hi, lo)`` with ``hi + lo == a`` exactly and 12 (13) significant bits each, for a float32-valued ``a``.

    Veltkamp's split with the factor ``2**41 + 1``: ``hi`` keeps the top 53 - 41 = 12 bits; the rest of a 24-bit
    mantissa fits ``lo``. A 32-bit product ``x_j * cy_j`` times either half is then exact in float64.
    """
    c = a * (2.0**41 + 1.0)
    hi = c - (c - a)
    return hi, a - hi


def _terms(
    left: Format, right: Format, xb: NDArray[np.uint8], yb: NDArray[np.uint8]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(terms, magnitudes)``: exact float64 terms whose sum is the dot product, and the magnitudes the bound weighs.

    Integer path: one term per block (``sumi * dx * dy`` and, with offsets, ``mx * sy``); value path: two per value.
    """
    cy, dy = _dot_parts(right, yb)
    parts = left.checker.dot_parts(xb)
    with np.errstate(all="ignore"):
        if parts is not None:
            cx, dx = parts
            sumi = (cx * cy).sum(axis=1)  # exact integers
            terms = sumi.astype(np.float64) * dx * dy  # exact: < 2**16 times two 11-bit mantissas
            # a kernel may split each block's integer sum into partial sums (SIMD lanes) that it rounds separately:
            # the bound weighs the magnitudes of the code products, not of their sum
            mags = np.abs(cx * cy).sum(axis=1).astype(np.float64) * np.abs(dx * dy)
            ox, oy = left.checker.dot_offset(xb), right.checker.dot_offset(yb)
            if ox is not None and oy is not None:  # ggml: sumi * dx * dy + mx * sy (two fp16 values: exact)
                terms = np.concatenate([terms, ox * oy])
                mags = mags + np.abs(ox * oy)
            return terms, mags
    hi, lo, mags = _value_terms(left, right, xb, yb)
    return np.concatenate([hi, lo]), mags


def _value_terms(
    left: Format, right: Format, xb: NDArray[np.uint8], yb: NDArray[np.uint8]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """The value path, per value ``j``: ``x_j * cy_j`` times the two halves of ``dy`` (exact), and ``|x_j cy_j dy|``."""
    cy, dy = _dot_parts(right, yb)
    with np.errstate(all="ignore"):
        xv = left.decode(xb).reshape(-1).astype(np.float64)
        prod = xv * cy.reshape(-1)  # exact: a float32 times an 8-bit code
        scale = np.repeat(dy, right.block_size)
        hi, lo = _split12(scale)
        return prod * hi, prod * lo, np.abs(prod * scale)


# Their public home stays tbq.check.dot (the name in the API's records).
for _fn in (right_format, pair_unit, reference_dot):
    _fn.__module__ = "tbq.check.dot"
