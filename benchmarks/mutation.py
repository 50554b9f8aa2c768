"""Mutation harness: plant one plausible bug at a time and check that the tests catch it.

Each entry of :data:`CATALOGUE` (in ``benchmarks/mutants.py``) names a file, an
exact piece of its text, the text that replaces it and the tests expected to
catch the change. For every mutant the harness

1. copies the tree (``src``, ``tests``, ``pyproject.toml`` and what the tests
   read: ``docs``, ``notebooks``, ``benchmarks``, ``README.md``) into a
   temporary directory, once per worker,
2. replaces the old text with the new one (it must occur exactly once),
3. runs ``python -m pytest -x -q -p no:cacheprovider <tests>`` there with
   ``PYTHONPATH=<clone>/src``, so the clone's code is imported and not an
   editable install, with a per-mutant timeout,
4. restores the file.

A mutant is **killed** when pytest reports a failing test (exit status 1) or
the run times out, **survived** when the tests pass, **stale** when its old
text no longer occurs in the file (another change rewrote the line: update
the entry), **ambiguous** when the old text occurs more than once, and
**error** for any other pytest status (a collection error, no tests ran).
Before the mutants, the union of their tests runs once on the unmutated
clone (``--no-baseline`` skips it): a mutant is only "killed" by tests that
pass without it.

Not part of CI (a full run takes tens of minutes). Usage::

    nice -n 10 python benchmarks/mutation.py                 # every mutant
    python benchmarks/mutation.py --list                     # the catalogue
    python benchmarks/mutation.py --only budget_fits_strict,dask_partial_step
    python benchmarks/mutation.py --package budget --json benchmarks/results/mutation.json
    python benchmarks/mutation.py --check                    # only report stale or ambiguous entries

Exit status: 0 when every mutant run is killed, 1 when any survived, is
stale or ambiguous, or errored, 2 when the baseline fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mutants import CATALOGUE, Mutant  # noqa: E402

COPY = ("src", "tests", "docs", "notebooks", "benchmarks", "pyproject.toml", "README.md")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "*.egg-info", ".pytest_cache")


def make_clone(base: Path) -> Path:
    clone = Path(tempfile.mkdtemp(prefix="tbq-mutant-", dir=base))
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, clone / name, ignore=IGNORE)
        elif src.exists():
            shutil.copy2(src, clone / name)
    return clone


def status_of(m: Mutant, root: Path) -> str:
    """'ok', 'stale' (old text gone, or the file) or 'ambiguous' (old text more than once)."""
    f = root / m.file
    if not f.exists():
        return "stale"
    n = f.read_text().count(m.old)
    return "ok" if n == 1 else ("stale" if n == 0 else "ambiguous")


def run_pytest(clone: Path, tests: list[str], timeout: float) -> tuple[int | None, float, str]:
    env = dict(os.environ, PYTHONPATH=str(clone / "src"), PYTHONDONTWRITEBYTECODE="1")
    env.pop("TBQ_HYPOTHESIS_PROFILE", None)  # the default profile, as in CI
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or b""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return None, time.perf_counter() - t0, out[-3000:]
    return r.returncode, time.perf_counter() - t0, (r.stdout + r.stderr)[-3000:]


def _first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0][:160]
    return ""


def run_mutant(m: Mutant, clone: Path, timeout: float) -> dict:
    row = {"name": m.name, "package": m.package, "file": m.file, "tests": list(m.tests)}
    st = status_of(m, clone)
    if st != "ok":
        row.update(result=st, seconds=0.0)
        return row
    f = clone / m.file
    original = f.read_text()
    stat = f.stat()
    f.write_text(original.replace(m.old, m.new, 1))
    try:
        rc, secs, out = run_pytest(clone, list(m.tests), timeout)
    finally:
        f.write_text(original)
        os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    if rc is None:
        result = "killed (timeout)"
    elif rc == 1:
        result = "killed"
    elif rc == 0:
        result = "survived"
    else:
        result = f"error (pytest exit {rc})"
    row.update(result=result, seconds=round(secs, 1), caught_by=_first_failure(out) if rc == 1 else "")
    if not result.startswith("killed"):
        row["output"] = out[-1500:]
    return row


def markdown(doc: dict) -> str:
    """The summary and the per-package table of a results file (docs/robustness.md quotes them)."""
    rows = doc["mutants"]
    counts = doc["counts"]
    lines = [
        f"{len(rows)} mutants, {', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}; "
        f"wall time {doc['wall_seconds'] / 60:.1f} min with {doc['jobs']} at once on {doc['cores']} cores "
        f"({doc['date']}, load average at the end {', '.join(f'{v:.1f}' for v in doc['load_average_end'] or [])}).",
        "",
        "| package | mutants | killed | not killed |",
        "|---|---|---|---|",
    ]
    for pk in dict.fromkeys(r["package"] for r in rows):
        mine = [r for r in rows if r["package"] == pk]
        killed = sum(r["result"].startswith("killed") for r in mine)
        rest = ", ".join(f"{r['name']} ({r['result']})" for r in mine if not r["result"].startswith("killed")) or "-"
        lines.append(f"| {pk} | {len(mine)} | {killed} | {rest} |")
    lines += ["", "| mutant | file | result | s | first failing test |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['file'].removeprefix('src/tbq/')} | {r['result']} | {r['seconds']:.0f} | {r.get('caught_by', '').removeprefix('FAILED ')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated mutant names")
    ap.add_argument("--package", help="comma-separated packages (the catalogue's 'package' column)")
    ap.add_argument("--list", action="store_true", help="print the catalogue and exit")
    ap.add_argument("--check", action="store_true", help="only report stale or ambiguous entries (no tests run)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant (default 900)")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own clone (default 1)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the tests")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument(
        "--markdown", metavar="RESULTS_JSON", help="print the tables of docs/robustness.md from a results file and exit"
    )
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0

    names = [m.name for m in CATALOGUE]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        print(f"duplicate mutant names: {dup}", file=sys.stderr)
        return 2
    chosen = list(CATALOGUE)
    if args.only:
        want = set(args.only.split(","))
        unknown = want - set(names)
        if unknown:
            print(f"unknown mutants: {sorted(unknown)}", file=sys.stderr)
            return 2
        chosen = [m for m in chosen if m.name in want]
    if args.package:
        pk = set(args.package.split(","))
        chosen = [m for m in chosen if m.package in pk]
    if args.list:
        for m in chosen:
            print(f"{m.name:34s} {m.package:11s} {m.file:40s} {status_of(m, ROOT):9s} {' '.join(m.tests)}")
        print(f"{len(chosen)} mutants over {len({m.package for m in chosen})} packages")
        return 0
    if args.check:
        bad = [(m.name, status_of(m, ROOT)) for m in chosen if status_of(m, ROOT) != "ok"]
        for name, st in bad:
            print(f"{st:9s} {name}")
        print(f"{len(chosen) - len(bad)} of {len(chosen)} mutants apply")
        return 1 if bad else 0

    t_start = time.perf_counter()
    base = Path(tempfile.mkdtemp(prefix="tbq-mutation-"))
    clones = [make_clone(base) for _ in range(max(1, args.jobs))]
    results: list[dict] = []
    try:
        if not args.no_baseline:
            tests = sorted({t for m in chosen if status_of(m, clones[0]) == "ok" for t in m.tests})
            print(f"baseline: {len(tests)} test selections on the unmutated tree ...", flush=True)
            rc, secs, out = run_pytest(clones[0], tests, args.timeout * 4)
            print(f"baseline: pytest exit {rc} in {secs:.0f} s", flush=True)
            if rc != 0:
                print(out, file=sys.stderr)
                return 2
        free = list(clones)

        def job(m):
            clone = free.pop()
            try:
                return run_mutant(m, clone, args.timeout)
            finally:
                free.append(clone)

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(clones)) as ex:
            for i, row in enumerate(ex.map(job, chosen), 1):
                results.append(row)
                print(
                    f"[{i:3d}/{len(chosen)}] {row['result']:18s} {row['seconds']:7.1f} s  {row['name']:34s} {row.get('caught_by', '')}",
                    flush=True,
                )
                if "output" in row and row["result"] == "survived":
                    print("    tests passed with the mutant: " + " ".join(row["tests"]), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    wall = time.perf_counter() - t_start
    counts: dict[str, int] = {}
    for r in results:
        key = r["result"].split(" (")[0]
        counts[key] = counts.get(key, 0) + 1
    print(
        f"\n{len(results)} mutants: "
        + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        + f"; wall time {wall / 60:.1f} min"
    )
    for r in results:
        if not r["result"].startswith("killed"):
            print(f"  {r['result']}: {r['name']} ({r['file']})")
    if args.json:
        doc = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "python": platform.python_version(),
            "cores": os.cpu_count(),
            "jobs": len(clones),
            "load_average_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "wall_seconds": round(wall, 1),
            "counts": counts,
            "mutants": results,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if all(r["result"].startswith("killed") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
