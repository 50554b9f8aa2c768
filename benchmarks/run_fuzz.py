"""Run the fuzz profile's plan: each property in its own pytest process, on every core, with a wall-clock budget.

    python benchmarks/run_fuzz.py                         # the plan below, 100,000 examples each (profile fuzz)
    python benchmarks/run_fuzz.py --examples 2000         # a quick estimate of the per-example cost
    python benchmarks/run_fuzz.py --markdown benchmarks/results/fuzz.json

Each property runs as ``TBQ_HYPOTHESIS_PROFILE=fuzz python -m pytest NODE
--hypothesis-show-statistics`` (the profile of tests/conftest.py: 100,000
examples per property, no deadline, every health check off), ``--jobs``
processes at a time (default: one per core). The examples hypothesis ran
(passing, failing, invalid) come from its statistics, the wall time from the
process. A property still running when ``--budget`` seconds have passed since
the start is stopped and recorded as such; hypothesis prints no statistics
for a killed run, so a small plugin counts the test function's executions
(every example, valid or not) into a file as it goes. With ``--examples N`` a
temporary profile with N examples replaces ``fuzz`` (same settings
otherwise), to estimate the cost per example.

Writes ``results/fuzz.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: The fuzz plan of docs/robustness.md: the properties whose examples are most
#: valuable (the bit layouts, the error bounds, numba == NumPy, decoding any bytes).
PLAN = [
    "tests/test_properties.py::test_pack_then_unpack_is_identity[pack3-numba]",
    "tests/test_properties.py::test_unpack_then_pack_is_identity[pack3-numba]",
    "tests/test_properties.py::test_encode_finite_never_raises_and_meets_the_error_bound[tbq3_0-numba]",
    "tests/test_properties.py::test_encode_finite_never_raises_and_meets_the_error_bound[tbq4_0-numba]",
    "tests/test_properties.py::test_encode_finite_never_raises_and_meets_the_error_bound[q8_0-numba]",
    "tests/test_properties.py::test_encode_finite_never_raises_and_meets_the_error_bound[q4_0-numba]",
    "tests/test_properties.py::test_numba_bytes_equal_numpy_bytes[tbq4_0-raise]",
    "tests/test_properties.py::test_decode_arbitrary_bytes[tbq3_0-numba]",
    "tests/test_properties.py::test_decode_arbitrary_bytes[q4_0-numba]",
]

_STATS = re.compile(r"(\d+) passing examples?, (\d+) failing examples?, (\d+) invalid examples?")
_PLUGIN = '''
from hypothesis import HealthCheck, settings
settings.register_profile("runfuzz", max_examples={n}, deadline=None, print_blob=True, suppress_health_check=list(HealthCheck))
'''
#: A pytest plugin that counts the test function's executions (every example hypothesis runs,
#: valid or not) into the file $TBQ_FUZZ_COUNT_FILE, so that a run stopped by the budget still
#: says how far it got (hypothesis prints its statistics only at the end).
_COUNTER = '''
import atexit, os, time
import hypothesis.core as _core

_path = os.environ.get("TBQ_FUZZ_COUNT_FILE")
_orig = _core.StateForActualGivenExecution.execute_once
_state = {"n": 0, "t": 0.0}


def _write():
    if _path:
        with open(_path, "w") as f:
            f.write(str(_state["n"]))


def execute_once(self, *args, **kwargs):
    _state["n"] += 1
    now = time.monotonic()
    if now - _state["t"] > 1.0:  # at most a second behind when the run is stopped
        _state["t"] = now
        _write()
    return _orig(self, *args, **kwargs)


atexit.register(_write)


_core.StateForActualGivenExecution.execute_once = execute_once
'''


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("nodes", nargs="*", help="pytest node ids (default: the plan)")
    p.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2)
    p.add_argument("--budget", type=float, default=1800.0, help="seconds for the whole plan (default 30 minutes)")
    p.add_argument("--examples", type=int, default=None, help="a profile with this many examples instead of 'fuzz'")
    p.add_argument("--out", default=str(HERE / "results" / "fuzz.json"))
    p.add_argument("--markdown", metavar="FUZZ_JSON")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    nodes = args.nodes or PLAN
    env = dict(os.environ)
    plugin_dir = tempfile.mkdtemp(prefix="tbq-fuzz-")
    Path(plugin_dir, "tbq_runfuzz_counter.py").write_text(_COUNTER)
    env["PYTHONPATH"] = plugin_dir + os.pathsep + env.get("PYTHONPATH", "")
    if args.examples:
        Path(plugin_dir, "tbq_runfuzz_profile.py").write_text(_PLUGIN.format(n=args.examples))
        env["TBQ_HYPOTHESIS_PROFILE"] = "runfuzz"
    else:
        env["TBQ_HYPOTHESIS_PROFILE"] = "fuzz"
    profile = env["TBQ_HYPOTHESIS_PROFILE"]
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    pending = list(nodes)
    running = {}
    results = []

    def start(node):
        cmd = [sys.executable, "-m", "pytest", node, "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics", "-p", "no:randomly",
               "-p", "tbq_runfuzz_counter"]
        if args.examples:
            cmd[3:3] = ["-p", "tbq_runfuzz_profile"]
        log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - outlives this call: finish() reads and closes it
        count_file = Path(plugin_dir, f"count-{len(results) + len(running)}.txt")
        penv = dict(env, TBQ_FUZZ_COUNT_FILE=str(count_file))
        running[node] = (subprocess.Popen(cmd, cwd=ROOT, env=penv, stdout=log, stderr=subprocess.STDOUT), log, time.perf_counter(), count_file)
        print(f"[{time.perf_counter() - t_start:6.0f} s] start {node}", file=sys.stderr, flush=True)

    def finish(node, killed=False):
        proc, log, t0, count_file = running.pop(node)
        if killed:
            proc.kill()
        proc.wait()
        try:
            executed = int(count_file.read_text())
        except (OSError, ValueError):
            executed = None
        log.seek(0)
        text = log.read()
        log.close()
        m = _STATS.findall(text)
        passing, failing, invalid = (int(v) for v in m[-1]) if m else (None, None, None)
        status = "stopped by the budget" if killed else ("pass" if proc.returncode == 0 else f"fail (exit {proc.returncode})")
        r = {"node": node, "status": status, "seconds": time.perf_counter() - t0, "passing": passing, "failing": failing, "invalid": invalid,
             "executions_counted": executed}
        if proc.returncode not in (0, None) and not killed:
            r["tail"] = text[-3000:]
        results.append(r)
        print(f"[{time.perf_counter() - t_start:6.0f} s] {status}: {node}: {passing} passing, {invalid} invalid in {r['seconds']:.0f} s",
              file=sys.stderr, flush=True)

    while pending or running:
        while pending and len(running) < args.jobs and time.perf_counter() - t_start < args.budget:
            start(pending.pop(0))
        time.sleep(1.0)
        for node in list(running):
            if running[node][0].poll() is not None:
                finish(node)
        if time.perf_counter() - t_start >= args.budget:
            for node in list(running):
                finish(node, killed=True)
            for node in pending:
                results.append({"node": node, "status": "not started (budget)", "seconds": 0, "passing": None, "failing": None, "invalid": None})
            pending = []
    doc = {"profile": profile, "examples": args.examples or 100_000, "jobs": args.jobs, "budget_s": args.budget,
           "wall_s": time.perf_counter() - t_start, "load_before": load_before, "load_after": os.getloadavg(),
           "results": sorted(results, key=lambda r: nodes.index(r["node"]))}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(markdown(doc))
    return 0 if all(r["status"] == "pass" for r in results) else 1


def markdown(doc: dict) -> str:
    lines = ["| property | examples (passing + invalid) | wall time | result |", "|---|---|---|---|"]
    for r in doc["results"]:
        if r["passing"] is not None:
            ex = f"{r['passing']:,} + {r['invalid']:,}"
        elif r.get("executions_counted"):
            ex = f"about {r['executions_counted']:,} executed (counted; no statistics for a stopped run)"
        else:
            ex = "unknown" if r["seconds"] else "–"
        lines.append(f"| `{r['node'].split('::')[1]}` | {ex} | {r['seconds']:.0f} s | {r['status']} |")
    lines.append("")
    lines.append(f"Profile `{doc['profile']}` ({doc['examples']:,} examples per property), {doc['jobs']} processes at a time, "
                 f"budget {doc['budget_s']:.0f} s, whole plan {doc['wall_s']:.0f} s wall; load average {doc['load_before'][0]:.1f} "
                 f"before, {doc['load_after'][0]:.1f} after.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
