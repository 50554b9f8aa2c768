"""Side-by-side throughput of every codec and backend, in one run on the same data.

    python benchmarks/bench_codecs.py                 # sizes 4K .. 64M values
    python benchmarks/bench_codecs.py --sizes 4K,1M   # a quick look

For every format x direction (encode, decode) x size it times the NumPy
reference, numba on 1 thread and numba on all cores, plus gguf-py for q8_0 and
q4_0 when the ``gguf`` package is installed, on the same standard-normal
float32 input. Each figure is the median of ``--repeat`` runs after a warm-up
run, writing into a preallocated ``out=`` array. It prints a table (million
values per second, GB/s of float32 traffic, ratios to gguf-py and to the NumPy
path, peak extra memory of one call), and writes ``results/bench.json`` and
``results/throughput.png`` (throughput against size, log axes).

Peak memory is what one call allocates beyond its inputs and output, measured
with ``tracemalloc`` (which sees NumPy's allocations; the numba kernels'
scratch is a few tens of kB per call and is not seen by it). The JIT section
measures a cold first call (empty numba cache) and a warm one (cache filled by
the previous process) in fresh subprocesses.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

import tbq

HERE = Path(__file__).resolve().parent
SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20}


def parse_size(s: str) -> int:
    s = s.strip().upper()
    if s[-1] in SIZE_UNITS:
        return int(s[:-1]) * SIZE_UNITS[s[-1]]
    return int(s)


def label(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10}K"


def timed(fn, repeat: int) -> float:
    fn()  # warm-up (compiles numba kernels on the first call)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_extra(fn) -> int:
    tracemalloc.start()
    tracemalloc.reset_peak()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def runners(fmt: str, x: np.ndarray, q: np.ndarray, threads_all: int):
    """(backend label, encode callable, decode callable, returns-out) for one format."""
    out_y = np.empty_like(x)
    out_q = np.empty_like(q)
    rows = []
    for lab, cfg in (("numpy", {"backend": "numpy"}), ("numba-1", {"backend": "numba", "threads": 1}), (f"numba-{threads_all}", {"backend": "numba", "threads": threads_all})):
        c = tbq.get_codec(fmt, **cfg)
        rows.append((lab, lambda c=c: c.encode(x, out=out_q), lambda c=c: c.decode(q, out=out_y)))
    if fmt in ("q8_0", "q4_0"):
        try:
            import gguf
            from gguf import quants
        except ImportError:
            pass
        else:
            qt = getattr(gguf.GGMLQuantizationType, fmt.upper())
            rows.append(("gguf-py", lambda: quants.quantize(x, qt), lambda: quants.dequantize(q, qt)))
    return rows


def jit_times() -> dict:
    """First-call time in a fresh process with an empty numba cache, then with the cache filled."""
    code = (
        "import time; t0 = time.perf_counter(); import numpy as np, tbq; t1 = time.perf_counter()\n"
        "x = np.ones((4, 128), np.float32)\n"
        "for f in tbq.formats():\n"
        "    tbq.dequantize(tbq.quantize(x, f), f)\n"
        "t2 = time.perf_counter(); print(t1 - t0, t2 - t1)"
    )
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for key in ("cold", "warm"):
            r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            imp, first = map(float, r.stdout.split())
            out[key] = {"import_s": imp, "first_calls_s": first}
    return out


def markdown_table(path: Path, values: int = 1 << 24) -> str:
    """The README's performance table, from a ``bench.json`` written by this script."""
    doc = json.loads(Path(path).read_text())
    rows = [r for r in doc["results"] if r["values"] == values]
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    by = {(r["format"], r["direction"], r["backend"]): r for r in rows}
    head = "| format | direction | " + " | ".join(backends) + " | numba-1 / gguf-py | numba-all / numba-1 |"
    lines = [head, "|" + "---|" * (len(backends) + 4)]
    all_lab = [b for b in backends if b.startswith("numba-") and b != "numba-1"][0]
    for fmt in dict.fromkeys(r["format"] for r in rows):
        for d in ("encode", "decode"):
            cells = [f"{by[(fmt, d, b)]['mvalues_per_s']:.0f}" if (fmt, d, b) in by else "–" for b in backends]
            g = by.get((fmt, d, "gguf-py"))
            one = by[(fmt, d, "numba-1")]["mvalues_per_s"]
            vs_g = f"{one / g['mvalues_per_s']:.1f}x" if g else "–"
            scale = by[(fmt, d, all_lab)]["mvalues_per_s"] / one
            lines.append(f"| {fmt} | {d} | " + " | ".join(cells) + f" | {vs_g} | {scale:.2f}x |")
    m = doc["machine"]
    jit = doc.get("jit")
    note = (
        f"\nMillion values per second at {label(values)} values (median of the run's repeats), "
        f"{m['processor']}, {m['cores']} cores, Python {m['python']}, numpy {m['numpy']}, numba {m.get('numba', '?')}."
    )
    if jit:
        note += (
            f" First calls in a fresh process: {jit['cold']['first_calls_s']:.1f} s with an empty numba cache, "
            f"{jit['warm']['first_calls_s']:.2f} s with the cache filled (`cache=True`)."
        )
    return "\n".join(lines) + "\n" + note


#: Single-thread figures of the C reference (gcc -O2, no contraction) on this
#: machine kind, 16M values, from the performance issue: (quantize, dequantize).
C_REFERENCE = {"q8_0": (311, 4089), "q4_0": (732, 4007), "tbq4_0": (59, 287), "tbq3_0": (93, 295)}
#: The issue's single-thread targets: (multiple of the C figure, M values/s) for
#: (quantize, dequantize); the TBQ figures are the issue's rounded 500 / 750 / 900.
TARGETS = {
    "q8_0": ((2, 622), (0.8, 3271)),
    "q4_0": ((2, 1464), (0.8, 3206)),
    "tbq4_0": ((8, 500), (3, 900)),
    "tbq3_0": ((8, 750), (3, 900)),
}


def targets_table(path: Path, values: int = 1 << 24) -> str:
    """Measured numba single-thread throughput against the performance issue's targets."""
    doc = json.loads(Path(path).read_text())
    by = {(r["format"], r["direction"], r["backend"]): r for r in doc["results"] if r["values"] == values}
    lines = ["| codec | direction | C reference | target | numba-1 | x C | met |", "|---|---|---|---|---|---|---|"]
    for fmt, (cq, cd) in C_REFERENCE.items():
        for d, c, (f, t) in (("encode", cq, TARGETS[fmt][0]), ("decode", cd, TARGETS[fmt][1])):
            r = by.get((fmt, d, "numba-1"))
            if r is None:
                continue
            v = r["mvalues_per_s"]
            lines.append(f"| {fmt} | {d} | {c} | >= {t} ({f:g}x C) | {v:.0f} | {v / c:.2f}x | {'yes' if v >= t else 'no'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M", help="values per run, comma separated (K = 1024, M = 1024K)")
    p.add_argument("--formats", default=",".join(tbq.formats()))
    p.add_argument("--repeat", type=int, default=5, help="timed runs per figure (median reported)")
    p.add_argument("--out", default=str(HERE / "results"), help="folder for bench.json and throughput.png")
    p.add_argument("--no-jit", action="store_true", help="skip the JIT compile-time measurement")
    p.add_argument("--markdown", metavar="BENCH_JSON", help="print the README table from an existing bench.json and exit")
    p.add_argument("--targets", metavar="BENCH_JSON", help="print the table of the performance targets from an existing bench.json and exit")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown_table(Path(args.markdown)))
        return 0
    if args.targets:
        print(targets_table(Path(args.targets)))
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    fmts = args.formats.split(",")
    threads_all = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rng = np.random.default_rng(0)
    data = rng.standard_normal(max(sizes), dtype=np.float32)

    results = []
    for n in sizes:
        x = data[:n].reshape(-1, 128)
        for fmt in fmts:
            q = tbq.quantize(x, fmt)
            for lab, enc, dec in runners(fmt, x, q, threads_all):
                for direction, fn in (("encode", enc), ("decode", dec)):
                    reps = args.repeat if n <= (1 << 22) or lab != "numpy" else max(1, min(args.repeat, 3))
                    t = timed(fn, reps)
                    results.append(
                        {
                            "format": fmt,
                            "direction": direction,
                            "values": n,
                            "backend": lab,
                            "seconds": t,
                            "mvalues_per_s": n / t / 1e6,
                            "float32_gb_per_s": 4 * n / t / 1e9,
                            "peak_extra_bytes": peak_extra(fn),
                        }
                    )
                    print(f"  {fmt:7s} {direction:6s} {label(n):>4s} {lab:8s} {n / t / 1e6:9.1f} Mv/s", file=sys.stderr)

    by = {(r["format"], r["direction"], r["values"], r["backend"]): r for r in results}
    for r in results:
        g = by.get((r["format"], r["direction"], r["values"], "gguf-py"))
        npy = by[(r["format"], r["direction"], r["values"], "numpy")]
        r["vs_gguf"] = r["mvalues_per_s"] / g["mvalues_per_s"] if g else None
        r["vs_numpy"] = r["mvalues_per_s"] / npy["mvalues_per_s"]

    header = f"{'format':7s} {'dir':6s} {'values':>6s} {'backend':8s} {'Mv/s':>9s} {'GB/s':>7s} {'x gguf':>7s} {'x numpy':>8s} {'peak extra':>11s}"
    lines = [header, "-" * len(header)]
    for r in results:
        vg = f"{r['vs_gguf']:.2f}" if r["vs_gguf"] is not None else "-"
        lines.append(
            f"{r['format']:7s} {r['direction']:6s} {label(r['values']):>6s} {r['backend']:8s} {r['mvalues_per_s']:9.1f} "
            f"{r['float32_gb_per_s']:7.2f} {vg:>7s} {r['vs_numpy']:8.2f} {r['peak_extra_bytes'] / 2**20:9.2f}MiB"
        )
    print("\n".join(lines))

    jit = None if args.no_jit else jit_times()
    if jit:
        print(
            f"\nJIT: cold first calls (empty numba cache) {jit['cold']['first_calls_s']:.1f} s; "
            f"warm (cache filled) {jit['warm']['first_calls_s']:.2f} s; import {jit['warm']['import_s']:.2f} s"
        )
    machine = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cores": threads_all,
        "tbq": tbq.__version__,
    }
    try:
        import numba

        machine["numba"] = numba.__version__
    except ImportError:  # pragma: no cover
        pass
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"machine": machine, "jit": jit, "results": results}, indent=1))
    _plot(results, out / "throughput.png", machine)
    print(f"\nwrote {out / 'bench.json'} and {out / 'throughput.png'}")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _plot(results, path: Path, machine: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install '.[plot]' in the tbq checkout)", file=sys.stderr)
        return
    fmts = list(dict.fromkeys(r["format"] for r in results))
    fig, axes = plt.subplots(2, len(fmts), figsize=(4 * len(fmts), 7), sharex=True, squeeze=False)
    for col, fmt in enumerate(fmts):
        for row, direction in enumerate(("encode", "decode")):
            ax = axes[row][col]
            for backend in dict.fromkeys(r["backend"] for r in results):
                pts = [(r["values"], r["mvalues_per_s"]) for r in results if r["format"] == fmt and r["direction"] == direction and r["backend"] == backend]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=backend)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{fmt} {direction}")
            ax.grid(True, which="both", alpha=0.3)
            if col == 0:
                ax.set_ylabel("million values / s")
            if row == 1:
                ax.set_xlabel("values per call")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"tbq throughput ({machine['processor']}, {machine['cores']} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
