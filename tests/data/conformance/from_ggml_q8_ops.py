"""Write q8_1__strict.npz and q8_k__strict.npz from a real ggml build (ctypes), on inputs.npz.

Usage: ``python tests/data/conformance/from_ggml_q8_ops.py [LIBGGML_BASE]``; the library defaults to
``../shared/ggml/upstream/lib/libggml-base.so.0`` beside the repository (a build of ggml-org/ggml, not
part of this repository: see README.md, "Q8_1 and Q8_K"). Run it again and the arrays come out bit for
bit the same, and so do the files (fixed zip dates): ``manifest-q8-ops.json`` records their SHA-256.

- Q8_1: ``quantize_row_q8_1_ref`` once per 128-value row of ``x`` (4 blocks of 36 bytes); ggml has no Q8_1
  decoder, so ``y`` is ``dequantize_row_q8_0`` of the same blocks without their ``s`` field (Q8_1's codes
  and ``d`` are Q8_0's layout once ``s`` is cut out: the decode rule tbq states for Q8_1).
- Q8_K: 256-value blocks, so ``x`` is read as 896 rows of 256 values (rows ``2i`` and ``2i + 1`` of ``x``
  make block ``i``), ``quantize_row_q8_K_ref`` once per block and ``dequantize_row_q8_K`` for ``y``.
  ``family`` is the pair's family (both rows share it), ``kind`` the pair's two kinds, shape (896, 2).

The output buffers are filled with zeros before each call: C leaves an all-zero Q8_K block's ``bsums``
unwritten (there is no such block in these inputs: no pair of rows is all zero), and tbq writes 0 there.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import sys
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_LIB = HERE.parents[3] / "shared" / "ggml" / "upstream" / "lib" / "libggml-base.so.0"
NAMES = ("q8_1__strict.npz", "q8_k__strict.npz")


def load(lib_path: Path = DEFAULT_LIB) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(lib_path))
    f32p, u8p = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_uint8)
    for name, args in (
        ("quantize_row_q8_1_ref", (f32p, u8p, ctypes.c_int64)),
        ("quantize_row_q8_K_ref", (f32p, u8p, ctypes.c_int64)),
        ("dequantize_row_q8_0", (u8p, f32p, ctypes.c_int64)),
        ("dequantize_row_q8_K", (u8p, f32p, ctypes.c_int64)),
    ):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, None
    return lib


def _p(a: np.ndarray, kind):
    return a.ctypes.data_as(ctypes.POINTER(kind))


def quantize(lib: ctypes.CDLL, fmt: str, x: np.ndarray) -> np.ndarray:
    """C's encoder on each row of float32 ``x`` (one call per row), into zero-filled rows."""
    x = np.ascontiguousarray(x, np.float32)
    bs, ts, fn = {"q8_1": (32, 36, lib.quantize_row_q8_1_ref), "q8_k": (256, 292, lib.quantize_row_q8_K_ref)}[fmt]
    q = np.zeros((x.shape[0], x.shape[1] // bs * ts), np.uint8)  # zeros: see the module docstring
    for i in range(x.shape[0]):
        fn(_p(x[i], ctypes.c_float), _p(q[i], ctypes.c_uint8), x.shape[1])
    return q


def dequantize(lib: ctypes.CDLL, fmt: str, q: np.ndarray) -> np.ndarray:
    """The C decoder of each row of ``q``: ``dequantize_row_q8_K``, or for Q8_1 ``dequantize_row_q8_0`` without ``s``."""
    if fmt == "q8_1":
        blocks = q.reshape(q.shape[0], -1, 36)
        q = np.ascontiguousarray(np.concatenate([blocks[..., :2], blocks[..., 4:]], axis=-1).reshape(q.shape[0], -1))
        fn, bs, ts = lib.dequantize_row_q8_0, 32, 34
    else:
        fn, bs, ts = lib.dequantize_row_q8_K, 256, 292
    y = np.zeros((q.shape[0], q.shape[1] // ts * bs), np.float32)
    for i in range(q.shape[0]):
        fn(_p(q[i], ctypes.c_uint8), _p(y[i], ctypes.c_float), y.shape[1])
    return y


def build(lib: ctypes.CDLL, inputs: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """File name -> arrays, from ``inputs.npz``'s arrays."""
    x, family, kind = inputs["x"], inputs["family"], inputs["kind"]
    q1 = quantize(lib, "q8_1", x)
    xk = x.reshape(-1, 256)
    qk = quantize(lib, "q8_k", xk)
    return {
        NAMES[0]: {"q": q1, "y": dequantize(lib, "q8_1", q1), "family": family, "kind": kind},
        NAMES[1]: {
            "q": qk,
            "y": dequantize(lib, "q8_k", qk),
            "family": family.reshape(-1, 2)[:, 0].copy(),
            "kind": kind.reshape(-1, 2).copy(),
        },
    }


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An ``.npz`` (deflated, what ``numpy.load`` reads) with fixed dates, so the same arrays give the same bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, a in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            body = io.BytesIO()
            np.lib.format.write_array(body, np.ascontiguousarray(a), allow_pickle=False)
            z.writestr(info, body.getvalue())
    return buf.getvalue()


def main(argv: list[str]) -> None:
    lib_path = Path(argv[1]) if len(argv) > 1 else DEFAULT_LIB
    with np.load(HERE / "inputs.npz") as z:
        inputs = {k: z[k] for k in z.files}
    files = build(load(lib_path), inputs)
    manifest = {
        "source": "ggml-org/ggml d99724f2b141fed9e1a9f402213506c081433465, libggml-base (cmake Release)",
        "functions": ["quantize_row_q8_1_ref", "dequantize_row_q8_0", "quantize_row_q8_K_ref", "dequantize_row_q8_K"],
        "inputs": "inputs.npz; q8_1: one call per 128-value row; q8_k: rows 2i, 2i+1 as block i, one call per block",
        "output_buffers": "zero-filled before each call",
        "script": "from_ggml_q8_ops.py",
        "files": {},
    }
    for name, arrays in files.items():
        data = npz_bytes(arrays)
        (HERE / name).write_bytes(data)
        manifest["files"][name] = {
            "sha256": hashlib.sha256(data).hexdigest(),
            "arrays": {k: {"dtype": str(a.dtype), "shape": list(a.shape)} for k, a in arrays.items()},
        }
    (HERE / "manifest-q8-ops.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv)
