"""How long `tbq check` takes on a C row kernel: 100,000 golden blocks (plus as many decoded and random-byte
blocks), fuzz excluded, for the project's own kernels of tests/c (the target: under 10 s).

    PYTHONPATH=src python benchmarks/bench_check.py [--blocks N] [--formats q8_0,q4_0,...]

Prints one line per format: the phases' seconds and the whole check's wall time (the phases, the smoke call,
building the golden rows, the report). Needs a C compiler. Timings on a shared machine are noisy: compare the
formats of one run.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from tbq.check import check_library  # noqa: E402

SOURCES = {"q8_0": "q8_0.c", "q4_0": "q4_0.c", "q5_0": "ggml_extra.c", "iq4_nl": "ggml_extra.c", "tbq4_0": "tbq.c"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--formats", default="q8_0,q4_0,q5_0,iq4_nl,tbq4_0")
    args = ap.parse_args()
    unknown = [f for f in args.formats.split(",") if f not in SOURCES]
    if unknown:
        ap.error(f"--formats: no C kernel here for {', '.join(unknown)}; choose from {', '.join(SOURCES)}")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        print("no C compiler on PATH", file=sys.stderr)
        return 2
    from test_check import _tables_headers  # the rotated kernels' tables, exactly tbq's

    with tempfile.TemporaryDirectory() as tmp:
        for name, text in _tables_headers().items():
            (Path(tmp) / name).write_text(text)
        print(f"{'format':<8}{'blocks':>9}{'golden q':>10}{'golden dq':>10}{'bytes dq':>10}{'total':>9}")
        for fmt in args.formats.split(","):
            lib = Path(tmp) / f"lib{fmt}.so"
            subprocess.run(
                [
                    cc,
                    "-O2",
                    "-shared",
                    "-fPIC",
                    "-ffp-contract=off",
                    f"-I{tmp}",
                    f"-I{ROOT / 'tests' / 'c'}",
                    str(ROOT / "tests" / "c" / SOURCES[fmt]),
                    "-o",
                    str(lib),
                    "-lm",
                ],
                check=True,
            )
            t0 = time.perf_counter()
            r = check_library(lib, fmt, blocks=args.blocks, examples=0)
            wall = time.perf_counter() - t0
            sec = {(p.direction, p.phase): p.seconds for p in r.phases}
            print(
                f"{fmt:<8}{args.blocks:>9,}{sec[('quantize', 'golden')]:>9.2f}s{sec[('dequantize', 'golden')]:>9.2f}s"
                f"{sec[('dequantize', 'bytes')]:>9.2f}s{wall:>8.2f}s  {r.verdict()}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
