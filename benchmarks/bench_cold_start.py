"""The first ``tbq compare`` in a fresh environment: when it says what it is doing, and when it is done.

    python benchmarks/bench_cold_start.py                       # the four core formats, then every format
    python benchmarks/bench_cold_start.py --formats q8_0,tbq4_0

Each case runs ``python -m tbq.cli compare [--formats ...]`` with an empty numba
cache (``NUMBA_CACHE_DIR`` in a new temporary directory), its stderr a pipe (as
under a script or CI, where only the compile notice is printed), records when
the "compiling numba kernels" notice appears and when the command ends; then
again in a pseudo-terminal with the cache filled (warm), and cold in a
pseudo-terminal (where the progress lines show too, first row timed). Also the
time of ``python -c "import tbq"`` (best of 5).

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


def run_in_pty(cmd, env, terminal: bool = True) -> dict:
    """Run ``cmd``; its stdout and stderr go to a pseudo-terminal (``terminal``) or to a pipe (stderr only)."""
    t0 = time.perf_counter()
    if terminal:
        master, slave = pty.openpty()
        p = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    else:
        master, slave = os.pipe()
        p = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave, env=env, close_fds=True
        )
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
    os.close(master)
    done = [line for line in out.replace("\r", "\n").splitlines() if "compiling numba kernels" in line]
    return {
        "total_s": time.perf_counter() - t0,
        "exit": p.returncode,
        **first,
        "notice": done[-1].strip() if done else None,
        "notices": len(done),
    }


def import_time(env, rounds: int = 5) -> float:
    """Best wall time of ``python -c "import tbq"`` (a fresh interpreter each time)."""
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import tbq"], env=env, check=True)
        ts.append(time.perf_counter() - t0)
    return min(ts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formats", action="append", help=f"formats of a case (repeatable; default: {CORE}, then all)")
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    cases = args.formats or [CORE, None]
    rows = []
    imp = import_time(dict(os.environ))
    for fmts in cases:
        cmd = [sys.executable, "-m", "tbq.cli", "compare"] + (["--formats", fmts] if fmts else [])
        load = os.getloadavg()
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache)
            cold = run_in_pty(cmd, env, terminal=False)
            warm = run_in_pty(cmd, env)
        with tempfile.TemporaryDirectory() as cache:
            cold_tty = run_in_pty(cmd, dict(os.environ, NUMBA_CACHE_DIR=cache))
        rows.append(
            {
                "formats": fmts or "all",
                "load_before": load,
                "load_after": os.getloadavg(),
                "cold": cold,
                "warm": warm,
                "cold_tty": cold_tty,
            }
        )
        print(
            f"{fmts or 'all'}: notice at {cold.get('notice_s', float('nan')):.2f} s (stderr a pipe; {cold['notices']} line), "
            f"cold {cold['total_s']:.2f} s, warm {warm['total_s']:.2f} s, cold on a terminal {cold_tty['total_s']:.2f} s "
            f"(notice {cold_tty.get('notice_s', float('nan')):.2f} s) (load {load[0]:.1f}); {cold['notice']}",
            file=sys.stderr,
        )
    doc = {"cores": len(os.sched_getaffinity(0)), "import_s": imp, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cold_start.json").write_text(json.dumps(doc, indent=1))
    print(markdown(doc))
    return 0


def markdown(doc: dict) -> str:
    lines = [
        "| `tbq compare` formats | notice (stderr a pipe) | cold, stderr a pipe | cold, terminal | warm | load before / after |",
        "|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        c, t, w = r["cold"], r["cold_tty"], r["warm"]
        lines.append(
            f"| {r['formats']} | {c.get('notice_s', float('nan')):.2f} s ({c['notices']} line) | {c['total_s']:.1f} s | "
            f"{t['total_s']:.1f} s | {w['total_s']:.1f} s | {r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} |"
        )
    return "\n".join(lines) + (
        f"\n\nEmpty numba cache for each cold run, {doc['cores']} cores; "
        f'`python -c "import tbq"` {doc["import_s"]:.2f} s (best of 5).'
    )


if __name__ == "__main__":
    sys.exit(main())
