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
#: valuable (the bit layouts, the error bounds, numba == NumPy, decoding any bytes),
#: the costliest first (CPU per example measured by ``--examples 2000``), so that
#: the processes started last are short ones and the two cores finish together.
PLAN = [
    "tests/test_properties.py::test_encode_finite_never_raises_and_meets_the_error_bound[tbq4_0-numba]",
    "tests/test_properties.py::test_numba_bytes_equal_numpy_bytes[tbq4_0-raise]",
    "tests/test_properties.py::test_encode_finite_never_raises_and_meets_the_error_bound[tbq3_0-numba]",
    "tests/test_properties.py::test_encode_finite_never_raises_and_meets_the_error_bound[q4_0-numba]",
    "tests/test_properties.py::test_encode_finite_never_raises_and_meets_the_error_bound[q8_0-numba]",
    "tests/test_properties.py::test_decode_arbitrary_bytes[tbq3_0-numba]",
    "tests/test_properties.py::test_decode_arbitrary_bytes[q4_0-numba]",
    "tests/test_properties.py::test_pack_then_unpack_is_identity[pack3-numba]",
    "tests/test_properties.py::test_unpack_then_pack_is_identity[pack3-numba]",
]

#: hypothesis's statistics line (6.170, the test extra's minimum): "N passing, N failing, and N invalid test cases".
_STATS = re.compile(r"(\d+) passing, (\d+) failing, and (\d+) invalid")
_PLUGIN = """
from hypothesis import HealthCheck, settings
settings.register_profile("runfuzz", max_examples={n}, deadline=None, print_blob=True, suppress_health_check=list(HealthCheck))
"""
#: A pytest plugin that counts the test function's executions (every example hypothesis runs,
#: valid or not) into the file $TBQ_FUZZ_COUNT_FILE, so that a run stopped by the budget still
#: says how far it got (hypothesis prints its statistics only at the end), with the wall and CPU
#: time of the process since the first example began (the examples' cost, without pytest's
#: start-up) and, about every second, a snapshot (executions, wall, CPU) from which cost()
#: takes the cost of the later examples, after one-time work (numba loading its cache, the
#: strategies' tables) is done. CPU time is what the load of the machine changes least.
_COUNTER = """
import atexit, json, os, time
import hypothesis.core as _core


_path = os.environ.get("TBQ_FUZZ_COUNT_FILE")
_orig = _core.StateForActualGivenExecution.execute_once
_state = {"n": 0, "t": 0.0, "wall0": None, "cpu0": None, "wall": 0.0, "cpu": 0.0, "start": time.monotonic(), "snaps": []}


def _write():
    if _path:
        doc = {"executions": _state["n"], "wall_s": _state["wall"], "cpu_s": _state["cpu"],
               "startup_wall_s": (_state["wall0"] or time.monotonic()) - _state["start"], "startup_cpu_s": _state["cpu0"],
               "snapshots": _state["snaps"] + [(_state["n"], _state["wall"], _state["cpu"])]}
        with open(_path + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(_path + ".tmp", _path)


def execute_once(self, *args, **kwargs):
    if _state["wall0"] is None:
        _state["wall0"], _state["cpu0"] = time.monotonic(), time.process_time()
    try:
        return _orig(self, *args, **kwargs)
    finally:
        _state["n"] += 1
        now = time.monotonic()
        _state["wall"], _state["cpu"] = now - _state["wall0"], time.process_time() - _state["cpu0"]
        if now - _state["t"] > 1.0:  # at most a second behind when the run is stopped
            _state["t"] = now
            _state["snaps"].append((_state["n"], _state["wall"], _state["cpu"]))
            _write()


atexit.register(_write)


_core.StateForActualGivenExecution.execute_once = execute_once
"""


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
    load_samples = []  # (seconds since the start, 1-minute load average), every minute
    started_utc = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    t_start = time.perf_counter()
    pending = list(nodes)
    running = {}
    results = []

    def start(node):
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            node,
            "-q",
            "-p",
            "no:cacheprovider",
            "--hypothesis-show-statistics",
            "-p",
            "no:randomly",
            "-p",
            "tbq_runfuzz_counter",
        ]
        if args.examples:
            cmd[3:3] = ["-p", "tbq_runfuzz_profile"]
        log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - outlives this call: finish() reads and closes it
        count_file = Path(plugin_dir, f"count-{len(results) + len(running)}.txt")
        penv = dict(env, TBQ_FUZZ_COUNT_FILE=str(count_file))
        running[node] = (
            subprocess.Popen(cmd, cwd=ROOT, env=penv, stdout=log, stderr=subprocess.STDOUT),
            log,
            time.perf_counter(),
            count_file,
        )
        print(f"[{time.perf_counter() - t_start:6.0f} s] start {node}", file=sys.stderr, flush=True)

    def finish(node, killed=False):
        proc, log, t0, count_file = running.pop(node)
        if killed:
            proc.kill()
        proc.wait()
        try:
            counted = json.loads(count_file.read_text())
        except (OSError, ValueError):
            counted = {}
        log.seek(0)
        text = log.read()
        log.close()
        m = _STATS.findall(text)
        passing, failing, invalid = (int(v) for v in m[-1]) if m else (None, None, None)
        status = (
            "stopped by the budget"
            if killed
            else ("pass" if proc.returncode == 0 else f"fail (exit {proc.returncode})")
        )
        r = {
            "node": node,
            "status": status,
            "seconds": time.perf_counter() - t0,
            "passing": passing,
            "failing": failing,
            "invalid": invalid,
            "executions_counted": counted.get("executions"),
            "examples_wall_s": counted.get("wall_s"),
            "examples_cpu_s": counted.get("cpu_s"),
            "startup_wall_s": counted.get("startup_wall_s"),
            "startup_cpu_s": counted.get("startup_cpu_s"),
            "snapshots": counted.get("snapshots"),
        }
        r.update(cost(r))
        snaps = r["snapshots"] or []
        if len(snaps) > 100:  # kept for the record, thinned to about 100 (the cost above used them all)
            r["snapshots"] = snaps[:: len(snaps) // 100][:100] + [snaps[-1]]
        if proc.returncode not in (0, None) and not killed:
            r["tail"] = text[-3000:]
        results.append(r)
        per = f", {r['cpu_ms']:.2f} ms CPU per example" if r.get("cpu_ms") else ""
        print(
            f"[{time.perf_counter() - t_start:6.0f} s] {status}: {node}: {passing} passing, {invalid} invalid in {r['seconds']:.0f} s{per}",
            file=sys.stderr,
            flush=True,
        )

    while pending or running:
        while pending and len(running) < args.jobs and time.perf_counter() - t_start < args.budget:
            start(pending.pop(0))
        time.sleep(1.0)
        if time.perf_counter() - t_start >= 60 * len(load_samples):
            load_samples.append((round(time.perf_counter() - t_start), os.getloadavg()[0]))
        for node in list(running):
            if running[node][0].poll() is not None:
                finish(node)
        if time.perf_counter() - t_start >= args.budget:
            for node in list(running):
                finish(node, killed=True)
            for node in pending:
                results.append(
                    {
                        "node": node,
                        "status": "not started (budget)",
                        "seconds": 0,
                        "passing": None,
                        "failing": None,
                        "invalid": None,
                    }
                )
            pending = []
    doc = {
        "profile": profile,
        "examples": args.examples or 100_000,
        "jobs": args.jobs,
        "budget_s": args.budget,
        "wall_s": time.perf_counter() - t_start,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "load_samples": load_samples,
        "started_utc": started_utc,
        "results": sorted(results, key=lambda r: nodes.index(r["node"])),
    }
    doc["projection"] = projection(doc)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(markdown(doc))
    return 0 if all(r["status"] == "pass" for r in results) else 1


#: The examples per property the fuzz profile asks for (tests/conftest.py), which the projection is for.
TARGET = 100_000


def cost(r: dict) -> dict:
    """Cost per example of one property's run: CPU and wall milliseconds, and the projected time for TARGET examples.

    The counter times the examples only (pytest's start-up is not in it). The cost per example
    is the slope over the second half of the run (from the snapshot nearest half the
    executions to the end), so one-time work in the first examples (numba loading its cache,
    the strategies building their tables) does not inflate it; that work is in the projection
    once, with the first half as measured. Per example means per valid example (hypothesis's
    ``max_examples`` counts those; the invalid ones it also ran are in the cost) when
    hypothesis printed its statistics; for a run the budget stopped, per execution. The CPU
    time is what an example costs on a core of its own: ``projected_s`` (start-up CPU, the
    first half as measured, the rest up to TARGET examples at the slope) is the quiet-machine
    estimate; a loaded machine stretches the wall time far more than the CPU time.
    """
    n_exec, cpu, wall = r.get("executions_counted"), r.get("examples_cpu_s"), r.get("examples_wall_s")
    if not n_exec or cpu is None:
        return {}
    snaps = [tuple(s) for s in (r.get("snapshots") or [])] or [(n_exec, wall, cpu)]
    end = snaps[-1]
    mid = min(snaps, key=lambda s: abs(s[0] - n_exec / 2))
    if end[0] - mid[0] < max(50, n_exec // 4):  # too few snapshots to split: the whole run's average
        mid = (0, 0.0, 0.0)
    per_exec_cpu = (end[2] - mid[2]) / (end[0] - mid[0])
    per_exec_wall = (end[1] - mid[1]) / (end[0] - mid[0])
    valid = (r["passing"] or 0) + (r["failing"] or 0) if r.get("passing") is not None else None
    exec_per = n_exec / valid if valid else 1.0
    out = {
        "per": "valid example" if valid else "execution",
        "cpu_ms": 1e3 * per_exec_cpu * exec_per,
        "wall_ms": 1e3 * per_exec_wall * exec_per,
        "slope_from_execution": mid[0],
    }
    out["projected_s"] = (r.get("startup_cpu_s") or 0.0) + mid[2] + per_exec_cpu * max(0.0, TARGET * exec_per - mid[0])
    return out


def projection(doc: dict) -> dict | None:
    """The plan's wall time for TARGET examples on quiet cores: each property's projected_s, ``jobs`` at a time in plan order."""
    times = [r.get("projected_s") for r in doc["results"]]
    if not times or any(t is None for t in times):
        return None
    free = [0.0] * doc["jobs"]
    for t in times:  # as main() schedules them: the next property starts on the first core to come free
        i = free.index(min(free))
        free[i] += t
    return {"examples": TARGET, "cpu_s": sum(times), "plan_wall_s": max(free), "jobs": doc["jobs"]}


def markdown(doc: dict) -> str:
    lines = [
        "| property | examples (passing + invalid) | wall time | CPU ms / example | wall ms / example | "
        f"projected for {TARGET:,} (quiet core) | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        if r["passing"] is not None:
            ex = f"{r['passing']:,} + {r['invalid']:,}"
        elif r.get("executions_counted"):
            ex = f"about {r['executions_counted']:,} executed (counted; no statistics for a stopped run)"
        else:
            ex = "unknown" if r["seconds"] else "–"
        c = cost(r) if "cpu_ms" not in r else r
        per = " (per execution)" if c.get("per") == "execution" else ""
        cpu = f"{c['cpu_ms']:.2f}{per}" if c.get("cpu_ms") is not None else "–"
        wall = f"{c['wall_ms']:.2f}" if c.get("wall_ms") is not None else "–"
        proj = f"{c['projected_s']:.0f} s" if c.get("projected_s") is not None else "–"
        if per and c.get("projected_s") is not None:  # a stopped run: invalid examples unknown, so executions
            proj += f" ({TARGET:,} executions, valid or not)"
        lines.append(
            f"| `{r['node'].split('::')[1]}` | {ex} | {r['seconds']:.0f} s | {cpu} | {wall} | {proj} | {r['status']} |"
        )
    lines.append("")
    lines.append(
        f"Profile `{doc['profile']}` ({doc['examples']:,} examples per property), {doc['jobs']} processes at a time, "
        f"budget {doc['budget_s']:.0f} s, whole plan {doc['wall_s']:.0f} s wall; load average {doc['load_before'][0]:.1f} "
        f"before, {doc['load_after'][0]:.1f} after."
    )
    if doc.get("load_samples"):
        loads = [v for _, v in doc["load_samples"]]
        lines.append(
            f"1-minute load average sampled every minute: {min(loads):.1f} to {max(loads):.1f} (median {sorted(loads)[len(loads) // 2]:.1f})."
        )
    proj = doc.get("projection") or projection(doc)
    if proj:
        lines.append(
            f"Projected for {proj['examples']:,} examples per property on {proj['jobs']} quiet cores (CPU cost per example "
            f"measured here): {proj['cpu_s']:.0f} core-seconds, the plan in about {proj['plan_wall_s'] / 60:.1f} minutes of wall time."
        )
        if (doc.get("examples") or proj["examples"]) < proj["examples"]:  # a short run: its examples are the cheap ones
            lines.append(
                "A short run underestimates: hypothesis's cost per example grows with the examples it has seen "
                "(1.2-1.4x by 100,000 examples in the committed full runs, benchmarks/results/fuzz_plan_100k*.json)."
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
