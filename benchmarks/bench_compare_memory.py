"""Peak memory of ``tbq compare`` on a file, against the file's size.

Each run is a fresh process (``python -m tbq compare FILE ...``) whose peak
resident set (``ru_maxrss`` of the child) is read after it exits. The fixed
overhead (interpreter, NumPy, numba, the compiled kernels) is the peak on a
tiny file of the same geometry; the figure of merit is
``(peak - fixed) / input``, which the target bounds at 4.

    python benchmarks/bench_compare_memory.py                     # 32 and 128 MiB, the default formats
    python benchmarks/bench_compare_memory.py --mib 128 --formats q8_0,f16,tbq4_0
    python benchmarks/bench_compare_memory.py --json benchmarks/results/compare_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

#: The bound: peak memory at most this many times the input, plus the fixed overhead.
LIMIT = 4.0


def _peak_mib(argv: list[str]) -> float:
    """Peak RSS in MiB of ``python -m tbq`` with ``argv``, in a fresh process."""
    code = (
        "import resource, sys\n"
        "from tbq.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"tbq {' '.join(argv)} failed:\n{proc.stderr}")
    return int(proc.stderr.strip().splitlines()[-1]) / 1024  # Linux reports KiB


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", default="32,128", help="input sizes in MiB, comma-separated (default: 32,128)")
    p.add_argument("--heads", type=int, default=8, help="KV heads (default: 8)")
    p.add_argument("--head-dim", type=int, default=128, help="head_dim (default: 128)")
    p.add_argument("--formats", default=None, help="tbq compare --formats (default: every format)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    row = args.heads * args.head_dim
    extra = ["--repeat", "1", "--quiet"] + (["--formats", args.formats] if args.formats else [])
    results = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "load_before": os.getloadavg(),
        "heads": args.heads,
        "head_dim": args.head_dim,
        "formats": args.formats or "all",
        "limit": LIMIT,
        "runs": [],
    }
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        tiny = Path(d) / "tiny.npy"
        np.save(tiny, rng.standard_normal((16, args.heads, args.head_dim), dtype=np.float32))
        fixed = _peak_mib(["compare", str(tiny), *extra])
        results["fixed_mib"] = fixed
        print(f"fixed overhead (16 tokens): {fixed:.0f} MiB peak")
        print(f"{'input':>10}  {'tokens':>8}  {'peak':>10}  {'(peak - fixed) / input':>23}")
        for mib in [float(m) for m in args.mib.split(",")]:
            tokens = int(mib * 2**20 / 4 / row)
            f = Path(d) / f"kv{mib:g}.npy"
            np.save(f, rng.standard_normal((tokens, args.heads, args.head_dim), dtype=np.float32))
            size = tokens * row * 4 / 2**20
            peak = _peak_mib(["compare", str(f), *extra])
            ratio = (peak - fixed) / size
            f.unlink()
            results["runs"].append({"input_mib": size, "tokens": tokens, "peak_mib": peak, "ratio": ratio})
            print(f"{size:>6.0f} MiB  {tokens:>8,}  {peak:>6.0f} MiB  {ratio:>23.2f}")
    results["load_after"] = os.getloadavg()
    worst = max(r["ratio"] for r in results["runs"])
    print(
        f"worst ratio {worst:.2f} (bound {LIMIT:g}); load average before {results['load_before'][0]:.2f}, "
        f"after {results['load_after'][0]:.2f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if worst <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
