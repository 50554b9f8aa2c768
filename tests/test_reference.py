"""tbq.float32: the spec's shared float32 arithmetic (formerly tbq.reference, a deprecated alias now)."""

import numpy as np
import pytest

from tbq import float32 as reference


def sequential_sum_squares(v):
    """The spec's loop, one row at a time: acc = +0.0, then acc += v[j] * v[j] in index order (float32)."""
    out = np.empty(v.shape[0], np.float32)
    for i, row in enumerate(v):
        acc = np.float32(0)
        for x in row:
            acc = np.float32(acc + np.float32(x * x))
        out[i] = acc
    return out


@pytest.mark.parametrize("rows", [1, 2, reference._ACCUMULATE_ROWS, reference._ACCUMULATE_ROWS + 1, 700])
def test_seq_sum_squares_is_the_sequential_sum_on_both_sides_of_the_switch(rows):
    """Both ways of computing it (one accumulate per row, or the loop over columns) give the loop's bits."""
    rng = np.random.default_rng(rows)
    v = (rng.standard_normal((rows, 128)) * 2.0 ** rng.integers(-20, 20, (rows, 1))).astype(np.float32)
    v[0] = 1.0
    v[0, 0] = 4096.0  # 2**24 first: each +1 after it rounds away (ties to even); summed first, the ones survive
    want = sequential_sum_squares(v)
    got = reference.seq_sum_squares(v)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert want[0] == 2.0**24
    # the order matters on these rows: np.sum (pairwise) gives other bits
    assert np.sum(v[:1] * v[:1], axis=1, dtype=np.float32)[0] != want[0]


def test_tbq_reference_is_a_deprecated_alias_of_tbq_float32():
    """The old module name still gives the same objects, with a DeprecationWarning naming the new home; a name
    neither has is an AttributeError."""
    import importlib

    import tbq.float32

    old = importlib.import_module("tbq.reference")
    with pytest.warns(DeprecationWarning, match=r"use tbq\.float32\.roundf"):
        assert old.roundf is tbq.float32.roundf
    with pytest.warns(DeprecationWarning, match="tbq.float32.seq_sum_squares"):
        from tbq.reference import seq_sum_squares
    assert seq_sum_squares is tbq.float32.seq_sum_squares
    with pytest.raises(AttributeError):
        old.no_such_helper  # noqa: B018
    assert "roundf" in dir(old)
    assert not hasattr(old, "__all__")  # a walker of the public API (__all__) does not go through the alias
