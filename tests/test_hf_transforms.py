"""tbq.hf.transforms' rotation at the orders without a register kernel, against the spec's butterfly.

tests/test_hf_cache.py checks the register kernels (n = 64, 128, 256: one code path per order and channel
mode, reached through one switch) bit for bit; here the portable path (other orders, 16 rows a vector lane,
the butterfly's stages in loops), forward and inverse, with a channel order.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tbq.hf import transforms
from tbq.rotation import fwht


@pytest.mark.parametrize(("d", "n"), [(96, 32), (48, 16), (512, 512), (1024, 512)])
def test_the_portable_rotation_is_the_spec_butterfly_bit_for_bit(d, n):
    """``rotate`` at an order outside ``_ROW_ORDERS`` is :func:`tbq.rotation.fwht` (normalised, float32) of
    each n-value block; ``transform`` with a channel order gathers before it (forward) and scatters after it
    (inverse). 37 rows: two groups of 16 lanes and a partial one."""
    assert n not in transforms._ROW_ORDERS
    rng = np.random.default_rng(d + n)
    x = (rng.standard_normal((37, d)) * rng.choice([1e-30, 1.0, 1e4], (37, 1))).astype(np.float32)
    x[0, :4] = [np.inf, -0.0, 0.0, 6.5e4]
    x[1] = -0.0

    def spec(a):
        with np.errstate(invalid="ignore"):
            return fwht(a.reshape(-1, n)).reshape(a.shape)

    got = transforms.rotate(torch.from_numpy(x), n).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), spec(x).view(np.uint32))
    perm = rng.permutation(d)
    got = transforms.transform(torch.from_numpy(x), perm, n, False).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), spec(x[:, perm]).view(np.uint32))
    back = transforms.transform(torch.from_numpy(x), perm, n, True).numpy()
    want = np.empty_like(x)
    want[:, perm] = spec(x)
    np.testing.assert_array_equal(back.view(np.uint32), want.view(np.uint32))
