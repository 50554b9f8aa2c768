"""The first ``tbq compare`` in a fresh environment: when it says what it is doing, and when it is done.

    python benchmarks/bench_cold_start.py                       # the four core formats, then every format
    python benchmarks/bench_cold_start.py --formats q8_0,tbq4_0

Each case runs ``python -m tbq.cli compare [--formats ...]`` in a pseudo-terminal
(progress and notices are shown only on a terminal) with an empty numba cache
(``NUMBA_CACHE_DIR`` in a new temporary directory), records when the
"compiling numba kernels" notice and the first progress line appear and when
the command ends, then runs it again with the cache filled (warm).

Writes ``results/cold_start.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORE = "q8_0,q4_0,tbq4_0,tbq3_0"


def run_in_pty(cmd, env) -> dict:
    t0 = time.perf_counter()
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    first = {}
    buf = b""
    while True:
        r, _, _ = select.select([master], [], [], 0.02)
        if r:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            buf += data
            now = time.perf_counter() - t0
            text = buf.decode(errors="replace")
            if "compiling numba kernels" in text:
                first.setdefault("notice_s", now)
            if "tbq compare: 1/" in text:
                first.setdefault("first_row_s", now)
        elif p.poll() is not None:
            break
    p.wait()
    out = buf.decode(errors="replace")
    done = [line for line in out.replace("\r", "\n").splitlines() if "compiling numba kernels" in line]
    return {"total_s": time.perf_counter() - t0, "exit": p.returncode, **first, "notice": done[-1].strip() if done else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formats", action="append", help=f"formats of a case (repeatable; default: {CORE}, then all)")
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    cases = args.formats or [CORE, None]
    rows = []
    for fmts in cases:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache)
            cmd = [sys.executable, "-m", "tbq.cli", "compare"] + (["--formats", fmts] if fmts else [])
            load = os.getloadavg()
            cold = run_in_pty(cmd, env)
            warm = run_in_pty(cmd, env)
        rows.append({"formats": fmts or "all", "load_before": load, "cold": cold, "warm": warm})
        print(f"{fmts or 'all'}: notice at {cold.get('notice_s', float('nan')):.2f} s, cold {cold['total_s']:.2f} s, "
              f"warm {warm['total_s']:.2f} s (load {load[0]:.1f}); {cold['notice']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cold_start.json").write_text(json.dumps({"cores": len(os.sched_getaffinity(0)), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
