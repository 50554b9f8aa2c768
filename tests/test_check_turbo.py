"""``tbq check`` on turbo2/turbo3/turbo4: the fork's real build passes, planted wrong kernels fail with a diagnosis.

The fork's C row functions carry the type's ``_0`` suffix (``quantize_row_turbo3_0_ref``,
``dequantize_row_turbo3_0``), which the formats declare (``fmt.checker.symbol_stem``) and the checker's
default symbol names read. The real build (``../shared/ggml/turbo``) lives outside the repo: its tests
skip, with the reason, where it is absent, and run in a child process of their own (a process holds
one build's ``libggml-base.so.0``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tbq
from tbq.check import check_kernel, check_library, default_symbol
from tbq.rotation import RandomizedHadamard, turboq_mtp_signs

FORMATS = ("turbo2", "turbo3", "turbo4")
TURBO_LIB = Path(__file__).resolve().parents[1].parent / "shared" / "ggml" / "turbo" / "lib"
FAST = dict(blocks=2000, examples=10)


def test_default_symbols_carry_the_c_type_name():
    for t in FORMATS:
        stem = tbq.get_format(t).checker.symbol_stem
        assert stem == t + "_0"
        assert default_symbol("quantize", t) == f"quantize_row_{t}_0_ref"
        assert default_symbol("dequantize", t) == f"dequantize_row_{t}_0"
    assert default_symbol("quantize", "tbq3_0") == "quantize_row_tbq3_0_ref"  # the name itself where none is declared


# ---------------------------------------------------------------------------
# the fork's real build
# ---------------------------------------------------------------------------


def _in_child(fn) -> None:
    """Run ``fn``, a function of this file, in a child process (one build's base library per process)."""
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import {__name__}; {__name__}.{fn.__name__}()"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"{fn.__name__} in a child process (exit {r.returncode}):\n{r.stderr[-6000:]}"


def _real_lib() -> Path:
    lib = TURBO_LIB / "libggml-base.so.0"
    if not lib.is_file():
        pytest.skip(f"{lib} is absent: the fork's real build lives outside the repo (../shared/ggml/turbo)")
    return lib


def test_real_fork_turbo_row_functions_pass():
    _real_lib()
    _in_child(_real_checks)


def _real_checks():
    lib = TURBO_LIB / "libggml-base.so.0"
    for t in FORMATS:
        r = check_library(lib, t, blocks=5000, examples=30)
        c = r.counts()
        assert r.ok and c["wrong"] == 0 and c["exact"] == c["blocks"] > 10_000, (t, r.text())
        assert r.provenance["quantize"]["symbol"] == f"quantize_row_{t}_0_ref"
        assert r.provenance["dequantize"]["symbol"] == f"dequantize_row_{t}_0"
    # the CPU build under CUDA's 4-bit thresholds: rotated values in [0.145560, 0.145561) and [0.013963, 0.013964)
    # take other indices (24 of the 20,000 golden blocks), and the checker names the table the build follows
    cuda = check_library(lib, "turbo4", options={"thresholds": "cuda"}, blocks=20_000, examples=0)
    assert not cuda.ok and cuda.counts("quantize")["wrong"] > 0 and cuda.counts("dequantize")["wrong"] == 0
    assert any("thresholds='cpu'" in d.title for d in cuda.diagnoses), cuda.text()
    # the build folder's libggml-base.so is a symbolic link flattened into a text file: the file it names is loaded
    flat = check_library(TURBO_LIB / "libggml-base.so", "turbo3", blocks=100, examples=0)
    assert flat.ok and flat.provenance["quantize"]["file"] == str((TURBO_LIB / "libggml-base.so.0").resolve())


def test_real_fork_turbo_on_the_command_line():
    lib = _real_lib()
    r = subprocess.run(
        [sys.executable, "-m", "tbq", "check", "--lib", str(lib), "--format", "turbo3", "--examples", "10"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "quantize: quantize_row_turbo3_0_ref from" in r.stdout and "PASS:" in r.stdout, r.stdout


# ---------------------------------------------------------------------------
# planted wrong kernels (Python callables)
# ---------------------------------------------------------------------------


def _rows(fn, fmt):
    """A row kernel ``rows -> rows`` from a block function of ``fmt``'s blocks."""

    def kernel(x):
        a = np.asarray(x)
        with np.errstate(all="ignore"):  # random bytes: inf * 0, NaN scales
            return fn(np.ascontiguousarray(a.reshape(-1, fmt.block_size if a.dtype.kind == "f" else fmt.type_size)))

    return kernel


@pytest.mark.parametrize("fmt", FORMATS)
def test_nearest_centroid_encoder_fails(fmt):
    # the "obvious" index rule: argmin |r - C_i| (first on ties) instead of the 6-digit literal thresholds
    f = tbq.get_format(fmt)
    C = f.codebook.centroids

    def encode(x):
        q, tr = f.reference_encode(x)
        idx = np.argmin(np.abs(tr["r"][..., None] - C), axis=-1).astype(np.uint8)
        cc = C[idx] * C[idx]
        recon = np.sqrt(np.add.accumulate(cc, axis=1, dtype=np.float32)[:, -1])
        q[:, :2] = (tr["norm"] / recon).astype(np.float16).view(np.uint8).reshape(-1, 2)
        q[:, f._payload :] = f._pack(idx)
        return q

    r = check_kernel(fmt, quantize=_rows(encode, f), blocks=20_000, examples=10)  # the gaps are narrow: many blocks
    c = r.counts()
    # exact zeros in the rotated domain (r = 0, a tie of -C[mid] and +C[mid]) take the lower middle index: a tie
    # rule the checker accepts unless exact; the literal thresholds' gaps (up to 5e-7 off the midpoints) are wrong
    assert c["tie_rule"] > 0, r.text()
    if fmt != "turbo2":  # turbo2's literals are the float32 midpoints: only the ties differ
        assert not r.ok and c["wrong"] > 0 and "between thresholds" in r.text(), r.text()
    exact = check_kernel(fmt, quantize=_rows(encode, f), exact=True, **FAST)
    assert not exact.ok and exact.counts()["tie_rule"] > 0  # under exact=True the other tie rule fails the check


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_wrong_sign_table_is_diagnosed(fmt):
    f = tbq.get_format(fmt)
    s1, s2 = (s.copy() for s in turboq_mtp_signs())
    s2[37] = -s2[37]
    g = tbq.get_format(fmt)
    g.rotation = RandomizedHadamard(s1, s2)  # the encoder of another build: signs2[37] flipped
    r = check_kernel(fmt, quantize=_rows(lambda x: g.reference_encode(x)[0], f), **FAST)
    assert not r.ok
    (d,) = [d for d in r.diagnoses if d.name == "rotated_sign"]
    assert "signs2[37] differs" in d.title


def test_swapped_nibbles_and_an_inverse_rotation_in_the_decoder_are_caught():
    f = tbq.get_format("turbo4")

    def swapped(data):
        d = data.copy()
        d[:, 4:] = (d[:, 4:] >> 4) | (d[:, 4:] << 4)
        return f.reference_decode(d)

    r = check_kernel("turbo4", dequantize=_rows(swapped, f), **FAST)
    assert not r.ok and [d.name for d in r.diagnoses] == ["nibble_order"], r.text()
    # a decoder that rotates back to the input's domain is not the fork's dequantize_row_turbo4_0
    for fmt in FORMATS:
        g = tbq.get_format(fmt)
        with np.errstate(all="ignore"):
            r = check_kernel(
                fmt, dequantize=_rows(lambda d, g=g: g.domain.from_decode_domain(g.reference_decode(d)), g), **FAST
            )
        c = r.counts("dequantize")
        assert not r.ok and c["wrong"] >= FAST["blocks"], r.text()
