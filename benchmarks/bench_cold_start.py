"""The first ``tbq compare`` in a fresh environment: when it says what it is doing, and when it is done.

    python benchmarks/bench_cold_start.py                       # the four core formats, then every format
    python benchmarks/bench_cold_start.py --formats q8_0,tbq4_0
    python benchmarks/bench_cold_start.py --ref HEAD~1 --rounds 3  # and the cold runs of another commit, alternating

Each case runs ``python -m tbq.cli compare [--formats ...]`` with an empty numba
cache (``NUMBA_CACHE_DIR`` in a new temporary directory), its stderr a pipe (as
under a script or CI, where only the compile notice is printed), records when
the "compiling numba kernels" notice appears and when the command ends; then
again in a pseudo-terminal with the cache filled (warm), and cold in a
pseudo-terminal (where the progress lines show too, first row timed). Also the
time of ``python -c "import tbq"`` (best of 5).

``--rounds N`` repeats each cold run (stderr a pipe) N times and reports the
median and the range; ``--ref REV`` also runs the source of another commit
(``git archive``, put first on ``PYTHONPATH``, so the CLI and its helper
processes import it), in alternating rounds with this checkout's, so a
change shows even when the machine's speed drifts between runs.

Writes ``results/cold_start.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
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


def _tree_env(src: Path, cache: str) -> dict:
    """The environment of a run of the tree whose ``src`` is given: it comes first on ``PYTHONPATH`` (the CLI's
    helper processes inherit it), with numba's cache in ``cache``."""
    path = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
    return dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=path)


def _spread(ts: list) -> dict:
    return {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "rounds_s": ts}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formats", action="append", help=f"formats of a case (repeatable; default: {CORE}, then all)")
    p.add_argument("--rounds", type=int, default=1, help="cold runs (stderr a pipe) per case and tree (default 1)")
    p.add_argument("--ref", help="also time the cold runs of this git commit, in alternating rounds")
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    cases = args.formats or [CORE, None]
    rows = []
    here = ROOT / "src"
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this": here}
        if args.ref:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.ref, "src"], capture_output=True)
            if archive.returncode:
                p.error(f"--ref {args.ref}: {archive.stderr.decode().strip()}")
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            trees = {"ref": Path(tmp) / "src", "this": here}
        imp = import_time(_tree_env(here, tmp))
        for fmts in cases:
            cmd = [sys.executable, "-m", "tbq.cli", "compare"] + (["--formats", fmts] if fmts else [])
            load = os.getloadavg()
            runs: dict = {name: [] for name in trees}
            with tempfile.TemporaryDirectory() as filled:  # the cache this checkout's first cold run fills
                for i in range(args.rounds):
                    for name, src in trees.items():
                        with tempfile.TemporaryDirectory() as cache:
                            c = filled if (name, i) == ("this", 0) else cache
                            runs[name].append(run_in_pty(cmd, _tree_env(src, c), terminal=False))
                warm = run_in_pty(cmd, _tree_env(here, filled))
            cold = runs["this"][0]
            with tempfile.TemporaryDirectory() as cache:
                cold_tty = run_in_pty(cmd, _tree_env(here, cache))
            row = {
                "formats": fmts or "all",
                "load_before": load,
                "load_after": os.getloadavg(),
                "cold": cold,
                "warm": warm,
                "cold_tty": cold_tty,
                "cold_rounds": {name: _spread([r["total_s"] for r in rs]) for name, rs in runs.items()},
            }
            if any(r["exit"] for rs in runs.values() for r in rs):
                print(f"{fmts or 'all'}: a cold run failed", file=sys.stderr)
                return 1
            rows.append(row)
            print(
                f"{fmts or 'all'}: notice at {cold.get('notice_s', float('nan')):.2f} s (stderr a pipe; "
                f"{cold['notices']} line), cold {row['cold_rounds']['this']['median_s']:.2f} s, warm "
                f"{warm['total_s']:.2f} s, cold on a terminal {cold_tty['total_s']:.2f} s (notice "
                f"{cold_tty.get('notice_s', float('nan')):.2f} s) (load {load[0]:.1f}); {cold['notice']}",
                file=sys.stderr,
            )
    doc = {"cores": len(os.sched_getaffinity(0)), "import_s": imp, "rounds": args.rounds, "ref": args.ref, "rows": rows}
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
    many = doc.get("rounds", 1) > 1
    for r in doc["rows"]:
        c, t, w = r["cold"], r["cold_tty"], r["warm"]
        cold = f"{c['total_s']:.1f} s"
        if "cold_rounds" in r:
            s = r["cold_rounds"]["this"]
            cold = f"{s['median_s']:.1f} s" + (f" ({s['min_s']:.1f}-{s['max_s']:.1f})" if many else "")
        lines.append(
            f"| {r['formats']} | {c.get('notice_s', float('nan')):.2f} s ({c['notices']} line) | {cold} | "
            f"{t['total_s']:.1f} s | {w['total_s']:.1f} s | {r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} |"
        )
    text = "\n".join(lines) + (
        f"\n\nEmpty numba cache for each cold run, {doc['cores']} cores; "
        f'`python -c "import tbq"` {doc["import_s"]:.2f} s (best of 5).'
    )
    if many:
        text += f" Cold, stderr a pipe: the median (range) of {doc['rounds']} rounds."
    if doc.get("ref"):
        text += (
            f"\n\n| `tbq compare` formats | cold at {doc['ref']} | cold here | here / {doc['ref']} |\n|---|---|---|---|"
        )
        for r in doc["rows"]:
            a, b = r["cold_rounds"]["ref"], r["cold_rounds"]["this"]
            ratios = [y / x for x, y in zip(a["rounds_s"], b["rounds_s"], strict=True)]
            text += (
                f"\n| {r['formats']} | {a['median_s']:.1f} s ({a['min_s']:.1f}-{a['max_s']:.1f}) | {b['median_s']:.1f} s "
                f"({b['min_s']:.1f}-{b['max_s']:.1f}) | {statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f}) |"
            )
        text += "\n\nAlternating rounds, each cold run with an empty numba cache; the ratio is per round."
    return text


if __name__ == "__main__":
    sys.exit(main())
