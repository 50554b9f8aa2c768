"""The in-run C anchor: the plain scalar C kernels of ``tests/c`` (written from docs/formats.md for
``tbq check``), compiled at benchmark time with ``cc -O2 -ffp-contract=off``, which is the kind
of code the C reference is (ggml's ``*_ref`` row functions, one block at a time, no FMA).

Timing it in the same process, on the same data, interleaved with tbq's kernels gives
ratios that do not depend on how busy the machine is at the moment of the run. Before
it is timed, every kernel is checked to write the same bytes and float32 bits as tbq.

    from c_anchor import build_anchor
    anchor = build_anchor()              # {format: CKernel}, every registered format tests/c covers
    anchor["q8_0"].quantize(x, out)      # x float32 (blocks, block_size), out uint8 (blocks, type_size)
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import tbq

ROOT = Path(__file__).resolve().parents[1]
C_DIR = ROOT / "tests" / "c"
FLAGS = ["-O2", "-ffp-contract=off", "-shared", "-fPIC"]

#: source file of each format's C kernel in tests/c
SOURCES = {"q8_0": "q8_0.c", "q4_0": "q4_0.c", "tbq4_0": "tbq.c", "tbq3_0": "tbq.c"}
SOURCES.update({f: "ggml_extra.c" for f in ("f16", "bf16", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4", "nvfp4")})
SOURCES.update({f: "planar_iso.c" for f in ("planar3_0", "iso3_0", "planar4_0", "iso4_0")})
SOURCES.update(
    {f: "fp8.c" for f in ("fp8_e4m3", "fp8_e5m2")}
)  # scale 1.0 (the default); the anchor data never saturates
#: ggml's names where they are not quantize_row_<fmt>_ref / dequantize_row_<fmt>
SYMBOLS = {
    "f16": ("ggml_fp32_to_fp16_row", "ggml_fp16_to_fp32_row"),
    "bf16": ("ggml_fp32_to_bf16_row_ref", "ggml_bf16_to_fp32_row"),
}


@dataclass
class CKernel:
    fmt: str
    library: Path
    _q: object
    _d: object

    def quantize(self, x: np.ndarray, out: np.ndarray) -> None:
        self._q(x.ctypes.data, out.ctypes.data, ctypes.c_int64(x.size))

    def dequantize(self, data: np.ndarray, out: np.ndarray) -> None:
        self._d(data.ctypes.data, out.ctypes.data, ctypes.c_int64(out.size))


def _tables_headers() -> dict:
    """The kernels' tables, exactly tbq's default ones (the form ``tbq golden`` headers give them)."""
    from tbq.golden import hex_literal

    def arr(name, a):
        return (
            f"static const float {name}[{np.size(a)}] = {{{', '.join(hex_literal(float(v)) for v in np.ravel(a))}}};\n"
        )

    out = {}
    t4, t3 = tbq.get_format("tbq4_0").tables(), tbq.get_format("tbq3_0").tables()
    out["tbq_tables.h"] = (
        "#pragma once\n"
        + arr("TBQ4_CENTROIDS", t4["centroids"])
        + arr("TBQ4_THRESHOLDS", t4["thresholds"])
        + arr("TBQ3_CENTROIDS", t3["centroids"])
        + arr("TBQ3_THRESHOLDS", t3["thresholds"])
        + arr("TBQ_SIGNS1", t4["signs1"])
        + arr("TBQ_SIGNS2", t4["signs2"])
    )
    if all(f in tbq.format_names() for f in ("planar3_0", "iso3_0", "planar4_0")):
        p3, i3, p4 = (tbq.get_format(f).tables() for f in ("planar3_0", "iso3_0", "planar4_0"))
        out["planar_iso_tables.h"] = (
            "#pragma once\n"
            + arr("PI_CENTROIDS3", p3["centroids"])
            + arr("PI_CENTROIDS4", p4["centroids"])
            + arr("GIVENS_COS", p3["givens_cos"])
            + arr("GIVENS_SIN", p3["givens_sin"])
            + "".join(arr("QUAT_" + c.upper(), i3["quat_" + c]) for c in "wxyz")
        )
    return out


def build_anchor(fmts=None, workdir: Path | None = None, log=print) -> dict:
    """Compile the C kernels of ``fmts`` (default: every registered format tests/c covers); ``{fmt: CKernel}``.

    A format whose source is missing or does not compile is left out with a message.
    """
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or not C_DIR.is_dir():
        log("no C compiler or no tests/c: no in-run C anchor")
        return {}
    fmts = [f for f in (fmts or tbq.format_names()) if f in SOURCES]
    out_dir = Path(workdir or tempfile.mkdtemp(prefix="tbq-anchor-"))
    for name, text in _tables_headers().items():
        (out_dir / name).write_text(text)
    libs, kernels = {}, {}
    for fmt in fmts:
        src = C_DIR / SOURCES[fmt]
        if not src.exists():
            log(f"  {fmt}: {src} is missing: no C anchor")
            continue
        if src not in libs:
            lib = out_dir / f"lib{src.stem}.so"
            cmd = [cc, *FLAGS, f"-I{out_dir}", f"-I{C_DIR}", str(src), "-o", str(lib), "-lm"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            libs[src] = None if r.returncode else lib
            if r.returncode:
                log(f"  {src.name} does not compile: {r.stderr.strip()[:200]}")
        if libs[src] is None:
            continue
        dll = ctypes.CDLL(str(libs[src]))
        qn, dn = SYMBOLS.get(fmt, (f"quantize_row_{fmt}_ref", f"dequantize_row_{fmt}"))
        try:
            q, d = getattr(dll, qn), getattr(dll, dn)
        except AttributeError as exc:
            log(f"  {fmt}: {exc}")
            continue
        for fn in (q, d):
            fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
            fn.restype = None
        kernels[fmt] = CKernel(fmt, libs[src], q, d)
    return kernels


def check_anchor(kernel: CKernel, x: np.ndarray) -> str | None:
    """None when the C kernel writes tbq's bytes and float32 bits on ``x`` (rows of whole blocks), else what differs."""
    codec = tbq.get_codec(kernel.fmt, on_overflow="inf")
    want = codec.encode(x)
    got = np.zeros_like(want)
    kernel.quantize(np.ascontiguousarray(x), got)
    if not np.array_equal(got, want):
        return f"{int(np.sum(got != want))} of {want.size} bytes differ"
    y = codec.decode(want)
    yc = np.zeros_like(y)
    kernel.dequantize(want, yc)
    if not np.array_equal(y.view(np.uint32), yc.view(np.uint32)):
        return f"{int(np.sum(y.view(np.uint32) != yc.view(np.uint32)))} of {y.size} float32 values differ"
    return None
