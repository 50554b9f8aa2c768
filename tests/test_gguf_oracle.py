"""Q8_0 and Q4_0 against gguf-py (the official ggml Python quantizer), an independent oracle."""

import numpy as np
import pytest
from helpers import BACKENDS, assert_bits_equal, assert_bytes_equal

import tbq

gguf = pytest.importorskip("gguf", reason="the test extra installs gguf")
from gguf import quants  # noqa: E402

N = 1 << 20  # values per distribution


def _ties(rng, fmt):
    """Exact rounding ties: per 32-block scale s = 2**e and values (k + 1/2) s."""
    nb = N // 32
    e = rng.integers(-6, 3, size=(nb, 1))
    s = np.ldexp(1.0, e)
    if fmt == "q4_0":
        k = rng.integers(-8, 8, size=(nb, 32))
        x = (k + 0.5) * s
        x[:, 0] = np.where(rng.integers(0, 2, nb) == 1, 8, -8) * s[:, 0]
    else:
        k = rng.integers(-127, 127, size=(nb, 32))
        x = (k + 0.5) * s
        x[:, 0] = np.where(rng.integers(0, 2, nb) == 1, 127, -127) * s[:, 0]
    return x.astype(np.float32).reshape(-1, 128)


def _data(name, fmt):
    rng = np.random.default_rng({"gaussian": 1, "heavy": 2, "tiny": 3, "large": 4, "ties": 5}[name])
    if name == "gaussian":
        return rng.standard_normal((N // 128, 128), dtype=np.float32)
    if name == "heavy":
        return rng.standard_t(2, size=(N // 128, 128)).astype(np.float32)
    if name == "tiny":
        return (rng.standard_normal((N // 128, 128)) * 1e-6).astype(np.float32)
    if name == "large":
        return (rng.standard_normal((N // 128, 128)) * 1e3).astype(np.float32)
    return _ties(rng, fmt)


QTYPE = {"q8_0": "Q8_0", "q4_0": "Q4_0"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("dist", ["gaussian", "heavy", "tiny", "large", "ties"])
def test_matches_gguf_py(dist, fmt, backend):
    x = _data(dist, fmt)
    qtype = getattr(gguf.GGMLQuantizationType, QTYPE[fmt])
    ref_q = quants.quantize(x, qtype)
    q = tbq.quantize(x, fmt, backend=backend)
    assert_bytes_equal(q, ref_q, f"{fmt} {dist} {backend}")
    assert_bits_equal(tbq.dequantize(q, fmt, backend=backend), quants.dequantize(ref_q, qtype), f"{fmt} {dist}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_q4_0_zero_block_scale_sign_follows_ggml(backend):
    """ggml's quantize_row_q4_0_ref starts from max = +0 and keeps it for a block of zeros,
    so d = +0 / -8 = -0 (bytes 00 80) whatever the signs of the zeros. gguf-py instead takes
    x[argmax|x|] = x[0], which gives +0 when x[0] is -0.0; tbq follows the C code."""
    for first in (0.0, -0.0):
        x = np.zeros(32, np.float32)
        x[0] = first
        x[5] = -0.0
        q = tbq.quantize(x, "q4_0", backend=backend)
        assert q[:2].tolist() == [0x00, 0x80]
        assert q[2:].tolist() == [0x88] * 16
    # for any block with a non-zero value the two agree (covered by test_matches_gguf_py)
