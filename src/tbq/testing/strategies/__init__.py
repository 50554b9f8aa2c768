"""Hypothesis strategies for fuzzing block-quantization codecs, packers and kernels.

Use them to test your own kernels against :mod:`tbq` (the NumPy reference is
the oracle), or to test tbq itself::

    from hypothesis import given
    from tbq.testing import strategies as tst
    import tbq

    @given(tst.float_blocks("q8_0"))
    def test_my_kernel_matches_tbq(x):
        assert (my_quantize_q8_0(x) == tbq.quantize(x, "q8_0", backend="numpy")).all()

Requires the ``hypothesis`` package (``pip install 'tbq[test]'``); this is the
only package of tbq that imports it.

Building a strategy for a format loads that format's numba kernels (compiling
them on a cold cache), so the first example of your test does not pay for it
and a plain ``@given`` test passes hypothesis's default 200 ms deadline. Your
own kernel's first call may still be slow: give such tests
``@settings(deadline=None)``. Bad arguments raise
:class:`hypothesis.errors.InvalidArgument` when the strategy is created, with a
message that says what to pass instead.

Public strategies
-----------------
- :func:`float_blocks`: float32 arrays whose last axis is a whole number of
  blocks, drawn from bug-finding families (see :data:`FAMILIES`).
- :func:`encoded_blocks`: byte arrays of whole blocks, produced by the encoder
  or arbitrary (with special fp16 scales).
- :func:`codebooks`, :func:`sign_vectors`, :func:`indices`.

Hypothesis chooses the shape, each block's family and the family's mode; a
block's numbers (scales, positions, signs, which threshold) come from a NumPy
generator seeded by a hypothesis-drawn integer and the block's index, with the
ends of each range favoured as hypothesis's own draws favour them. Examples
replay exactly from hypothesis's database and shrink towards fewer blocks and
simpler families and modes; each hypothesis choice costs tens of microseconds,
so a block makes two or three instead of five to twelve.
"""

from __future__ import annotations

from ._blocks import encoded_blocks, float_blocks
from ._machinery import DEFAULT_FAMILIES, FAMILIES, HAZARD_FAMILIES, SPECIAL_SCALES
from ._tables import codebooks, indices, sign_vectors

__all__ = [
    "FAMILIES",
    "DEFAULT_FAMILIES",
    "HAZARD_FAMILIES",
    "SPECIAL_SCALES",
    "float_blocks",
    "encoded_blocks",
    "codebooks",
    "sign_vectors",
    "indices",
]

# The public functions are documented (and their examples run) as members of this package.
for _f in (float_blocks, encoded_blocks, codebooks, sign_vectors, indices):
    _f.__module__ = __name__
del _f
