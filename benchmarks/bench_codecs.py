"""Throughput of every registered format, side by side with an in-run C anchor, in one run.

    python benchmarks/bench_codecs.py                     # anchor table (16M values, 5 rounds) + size sweep
    python benchmarks/bench_codecs.py --no-sweep --rounds 9
    python benchmarks/bench_codecs.py --markdown benchmarks/results/bench.json   # the README table
    python benchmarks/bench_codecs.py --targets  benchmarks/results/bench.json   # the performance targets

**The anchor table.** For every format at ``--values`` (16M) float32 values it
times, in interleaved rounds on the same data: the C kernel of ``tests/c``
compiled now with ``cc -O2 -ffp-contract=off`` (``benchmarks/c_anchor.py``;
checked to write tbq's bytes and bits first), tbq's numba kernels on one
thread, and on all cores. Each figure is the median over ``--rounds`` rounds;
the spread (max - min) / median is recorded for every figure. Single-thread
figures are also taken in thread CPU time (``time.thread_time``), which other
processes on a shared machine do not inflate; the ratios to C are reported in
both clocks. The fork's C reference figures the formats were specified
against (:data:`FORK_C`) are listed next to them. A plain memory copy is timed
on one and two threads in the same run: it is the bandwidth ceiling of the
decoders and of the two-thread ratios.

**The size sweep** (``--sizes``, default 4K,1M,16M): NumPy reference, numba on
one thread and on all cores, gguf-py for the formats it has, and peak extra
memory of a call; ``results/throughput.png`` plots it.

Writes ``results/bench.json`` (and the plot).
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
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np

import tbq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from c_anchor import build_anchor, check_anchor  # noqa: E402

SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20}

#: The fork's C reference on this machine kind, single thread, million values per second,
#: (quantize, dequantize) as (low, high) of the runs the format engineers were given.
FORK_C = {
    "f16": ((211, 211), (425, 425)),
    "bf16": ((563, 563), (1130, 1130)),
    "q4_1": ((361, 361), (1500, 1500)),
    "q5_0": ((165, 165), (373, 373)),
    "q5_1": ((206, 206), (381, 381)),
    "iq4_nl": ((31, 31), (614, 614)),
    "mxfp4": ((25, 25), (627, 627)),
    "nvfp4": ((23, 23), (452, 452)),
    "planar3_0": ((43, 43), (240, 240)),
    "iso3_0": ((34, 34), (158, 158)),
    "planar4_0": ((33, 33), (508, 508)),
    "iso4_0": ((39, 39), (193, 193)),
    "q8_0": ((110, 166), (1442, 1568)),
    "q4_0": ((313, 321), (1468, 1591)),
    "tbq4_0": ((37, 39), (99, 167)),
    "tbq3_0": ((46, 47), (86, 101)),
}

#: The single-thread performance targets, as multiples of the C reference:
#: (quantize, dequantize); None = "at least today's ratio" (TODAY).
TARGETS = {"tbq4_0": (8.0, 3.5), "tbq3_0": (8.0, 3.5), "q4_0": (2.0, None), "q8_0": (None, None)}
#: The ratios before the numba kernels were tuned (tbq / C), single thread: (quantize, dequantize).
TODAY = {"q8_0": (2.87, 0.93), "q4_0": (1.29, 1.02), "tbq4_0": (6.72, 2.78), "tbq3_0": (7.11, 3.28)}


def parse_size(s: str) -> int:
    s = s.strip().upper()
    return int(s[:-1]) * SIZE_UNITS[s[-1]] if s[-1] in SIZE_UNITS else int(s)


def label(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10}K"


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def spread(v) -> float:
    return (max(v) - min(v)) / statistics.median(v) if v else 0.0


# --------------------------------------------------------------------------- memory copy


def copy_rate(nbytes: int = 256 << 20, rounds: int = 5) -> dict:
    """GB/s of ``np.copyto`` (read + write counted once, as 'moves N bytes') on one and two threads."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)

    def one(a, b):
        np.copyto(b, a)

    def two():
        h = src.size // 2
        t = threading.Thread(target=one, args=(src[h:], dst[h:]))
        t.start()
        one(src[:h], dst[:h])
        t.join()

    one(src, dst)
    two()
    t1, t2 = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        one(src, dst)
        t1.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        two()
        t2.append(time.perf_counter() - t0)
    return {
        "bytes": nbytes,
        "gb_per_s_1_thread": nbytes / statistics.median(t1) / 1e9,
        "gb_per_s_2_threads": nbytes / statistics.median(t2) / 1e9,
        "float32_mvalues_per_s_1_thread": nbytes / 4 / statistics.median(t1) / 1e6,
        "spread": max(spread(t1), spread(t2)),
    }


# --------------------------------------------------------------------------- the anchor table


def anchor_table(fmts, n: int, rounds: int, log) -> list[dict]:
    """C anchor / numba-1 / numba-all, both directions, interleaved rounds, for every format."""
    threads_all = cores()
    rng = np.random.default_rng(0)
    data = rng.standard_normal(n, dtype=np.float32)
    log(f"building the C anchor (tests/c, cc {' '.join(['-O2', '-ffp-contract=off'])}) ...")
    anchor = build_anchor(fmts, log=log)
    rows = []
    for fmt in fmts:
        c1 = tbq.get_codec(fmt, threads=1)
        call = tbq.get_codec(fmt, threads=threads_all)
        x = data.reshape(-1, 128 if 128 % c1.block_size == 0 else c1.block_size)
        q = c1.encode(x)
        y = c1.decode(q)
        ck = anchor.get(fmt)
        problem = check_anchor(ck, data[: 1 << 16].reshape(-1, 128)) if ck else "no C kernel"
        if problem and ck:
            log(f"  {fmt}: the C anchor differs from tbq ({problem}); not timed")
        use_c = ck is not None and problem is None
        qa, ya = np.empty_like(q), np.empty_like(y)
        fns = {
            ("numba-1", "encode"): lambda: c1.encode(x, out=q),
            ("numba-1", "decode"): lambda: c1.decode(q, out=y),
            (f"numba-{threads_all}", "encode"): lambda: call.encode(x, out=q),
            (f"numba-{threads_all}", "decode"): lambda: call.decode(q, out=y),
        }
        if use_c:
            xc = np.ascontiguousarray(x)
            fns[("C", "encode")] = lambda: ck.quantize(xc, qa)
            fns[("C", "decode")] = lambda: ck.dequantize(q, ya)
        for fn in fns.values():
            fn()  # warm-up (compiles numba kernels)
        wall = {k: [] for k in fns}
        cpu = {k: [] for k in fns if k[0] in ("C", "numba-1")}
        for _ in range(rounds):
            for k, fn in fns.items():
                t0, c0 = time.perf_counter(), time.thread_time()
                fn()
                t1, c1_ = time.perf_counter(), time.thread_time()
                wall[k].append(t1 - t0)
                if k in cpu:
                    cpu[k].append(c1_ - c0)
        for (backend, direction), ts in wall.items():
            rows.append(
                {
                    "format": fmt,
                    "direction": direction,
                    "backend": backend,
                    "values": n,
                    "mvalues_per_s": n / statistics.median(ts) / 1e6,
                    "spread": spread(ts),
                    "mvalues_per_s_cpu": n / statistics.median(cpu[(backend, direction)]) / 1e6
                    if (backend, direction) in cpu
                    else None,
                    "rounds": rounds,
                }
            )
        by = {(r["backend"], r["direction"]): r for r in rows if r["format"] == fmt}
        msg = "  ".join(
            f"{b} {by[(b, 'encode')]['mvalues_per_s']:.0f}/{by[(b, 'decode')]['mvalues_per_s']:.0f}"
            for b in ("C", "numba-1", f"numba-{threads_all}")
            if (b, "encode") in by
        )
        log(f"  {fmt:9s} {msg}  (Mv/s enc/dec, largest spread {max(by[k]['spread'] for k in by):.0%})")
    return rows


# --------------------------------------------------------------------------- the size sweep


def timed(fn, repeat: int) -> float:
    fn()
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


def sweep(fmts, sizes, repeat: int, log) -> list[dict]:
    threads_all = cores()
    data = np.random.default_rng(0).standard_normal(max(sizes), dtype=np.float32)
    results = []
    for n in sizes:
        for fmt in fmts:
            x = data[:n].reshape(-1, 128)
            q = tbq.quantize(x, fmt)
            out_y, out_q = np.empty_like(x), np.empty_like(q)
            runs = []
            for lab, cfg in (
                ("numpy", {"backend": "numpy"}),
                ("numba-1", {"threads": 1}),
                (f"numba-{threads_all}", {"threads": threads_all}),
            ):
                c = tbq.get_codec(fmt, **cfg)
                runs.append((lab, lambda c=c: c.encode(x, out=out_q), lambda c=c: c.decode(q, out=out_y)))
            try:
                import gguf
                from gguf import quants

                qt = getattr(gguf.GGMLQuantizationType, fmt.upper(), None)
                if qt is not None:
                    quants.dequantize(quants.quantize(x[:1], qt), qt)  # raises when gguf-py lacks this type
                    runs.append(("gguf-py", lambda: quants.quantize(x, qt), lambda: quants.dequantize(q, qt)))
            except (ImportError, NotImplementedError, KeyError, ValueError, TypeError):
                pass
            for lab, enc, dec in runs:
                if lab in ("numpy", "gguf-py") and n > (1 << 20):
                    continue  # the slow references only up to 1M values (minutes otherwise)
                for direction, fn in (("encode", enc), ("decode", dec)):
                    t = timed(fn, repeat)
                    results.append(
                        {
                            "format": fmt,
                            "direction": direction,
                            "values": n,
                            "backend": lab,
                            "seconds": t,
                            "mvalues_per_s": n / t / 1e6,
                            "peak_extra_bytes": peak_extra(fn),
                        }
                    )
            log(f"  sweep {fmt:9s} {label(n):>4s} done")
    return results


def jit_times() -> dict:
    """First calls in fresh processes: an empty numba cache, then the cache filled (every format)."""
    code = (
        "import time; t0 = time.perf_counter(); import numpy as np, tbq; t1 = time.perf_counter()\n"
        "x = np.ones((64, 128), np.float32)\n"
        "for f in tbq.format_names():\n"
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


# --------------------------------------------------------------------------- tables


def _by(doc):
    return {(r["format"], r["direction"], r["backend"]): r for r in doc.get("anchor", [])}


def markdown_table(path: Path) -> str:
    """Every registered format against the C figures: the fork's reference and the in-run anchor."""
    doc = json.loads(Path(path).read_text())
    by = _by(doc)
    nall = f"numba-{doc['machine']['cores']}"
    lines = [
        "| format | C fork (given) q / dq | C in-run q / dq | numba 1 thread q / dq | x C fork q / dq | x C in-run q / dq | 2 threads / 1 q / dq |",
        "|---|---|---|---|---|---|---|",
    ]
    fmts = list(dict.fromkeys(r["format"] for r in doc.get("anchor", [])))
    for fmt in fmts:

        def v(b, d):
            r = by.get((fmt, d, b))
            return r["mvalues_per_s"] if r else None

        q1, d1 = v("numba-1", "encode"), v("numba-1", "decode")
        qc, dc = v("C", "encode"), v("C", "decode")
        qa, da = v(nall, "encode"), v(nall, "decode")
        fork = FORK_C.get(fmt)

        def rng(p):
            return f"{p[0]}" if p[0] == p[1] else f"{p[0]}-{p[1]}"

        def xr(a, p):
            if a is None or p is None:
                return "–"
            lo, hi = a / p[1], a / p[0]
            return f"{lo:.1f}x" if abs(hi - lo) < 0.05 else f"{lo:.1f}-{hi:.1f}x"

        cells = [
            fmt,
            f"{rng(fork[0])} / {rng(fork[1])}" if fork else "–",
            f"{qc:.0f} / {dc:.0f}" if qc else "–",
            f"{q1:.0f} / {d1:.0f}",
            f"{xr(q1, fork[0]) if fork else '–'} / {xr(d1, fork[1]) if fork else '–'}",
            f"{q1 / qc:.2f}x / {d1 / dc:.2f}x" if qc else "–",
            f"{qa / q1:.2f} / {da / d1:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    m, cp = doc["machine"], doc.get("copy", {})
    note = (
        f"\nMillion values per second at {label(doc['anchor_values'])} values, median of {doc['rounds']} interleaved rounds, "
        f"{m['processor']}, {m['cores']} cores, load average {doc['load_before'][0]:.1f} before / {doc['load_after'][0]:.1f} after the run. "
        f"C in-run: tests/c compiled with `cc -O2 -ffp-contract=off` in the same run (checked bit-exact first). "
        f"A plain memory copy moved {cp.get('gb_per_s_1_thread', float('nan')):.1f} GB/s on one thread and "
        f"{cp.get('gb_per_s_2_threads', float('nan')):.1f} GB/s on two."
    )
    return "\n".join(lines) + "\n" + note


def targets_table(path: Path) -> str:
    """The single-thread performance targets against the in-run anchor and against the fork's figures."""
    doc = json.loads(Path(path).read_text())
    by = _by(doc)
    nall = f"numba-{doc['machine']['cores']}"
    lines = [
        "| codec | direction | target (x C) | numba-1 Mv/s | x C in-run (wall) | x C in-run (CPU time) | x C fork | met vs in-run | met vs fork | 2 threads / 1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fmt in ("q8_0", "q4_0", "tbq4_0", "tbq3_0"):
        for i, d in enumerate(("encode", "decode")):
            r1, rc, ra = by.get((fmt, d, "numba-1")), by.get((fmt, d, "C")), by.get((fmt, d, nall))
            if r1 is None:
                continue
            target = TARGETS[fmt][i] if TARGETS[fmt][i] is not None else TODAY[fmt][i]
            tlabel = f">= {target:g}" + ("" if TARGETS[fmt][i] is not None else " (today)")
            xw = r1["mvalues_per_s"] / rc["mvalues_per_s"] if rc else None
            xc = r1["mvalues_per_s_cpu"] / rc["mvalues_per_s_cpu"] if rc and rc.get("mvalues_per_s_cpu") else None
            lo, hi = FORK_C[fmt][i]
            xf = (r1["mvalues_per_s"] / hi, r1["mvalues_per_s"] / lo)
            lines.append(
                f"| {fmt} | {d} | {tlabel} | {r1['mvalues_per_s']:.0f} | {xw:.2f} | {xc:.2f} | {xf[0]:.1f}-{xf[1]:.1f} | "
                f"{'yes' if xw is not None and xw >= target else 'no'} | {'yes' if xf[0] >= target else 'no'} | "
                f"{ra['mvalues_per_s'] / r1['mvalues_per_s']:.2f} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formats", default=",".join(tbq.format_names()))
    p.add_argument("--values", default="16M", help="values per call of the anchor table (default 16M)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the anchor table (medians reported)")
    p.add_argument("--sizes", default="4K,1M,16M", help="sizes of the sweep (K = 1024, M = 1024K)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per sweep figure (median)")
    p.add_argument("--no-sweep", action="store_true", help="only the anchor table")
    p.add_argument("--no-jit", action="store_true", help="skip the cold/warm first-call measurement")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--markdown", metavar="BENCH_JSON", help="print the all-format table from a bench.json and exit")
    p.add_argument("--targets", metavar="BENCH_JSON", help="print the targets table from a bench.json and exit")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown_table(Path(args.markdown)))
        return 0
    if args.targets:
        print(targets_table(Path(args.targets)))
        return 0

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    fmts = [f for f in args.formats.split(",") if f]
    load_before = os.getloadavg()
    copy = copy_rate()
    log(
        f"memory copy: {copy['gb_per_s_1_thread']:.1f} GB/s (1 thread), {copy['gb_per_s_2_threads']:.1f} GB/s (2 threads)"
    )
    n = parse_size(args.values)
    anchor = anchor_table(fmts, n, args.rounds, log)
    results = [] if args.no_sweep else sweep(fmts, [parse_size(s) for s in args.sizes.split(",")], args.repeat, log)
    jit = None if args.no_jit else jit_times()
    machine = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cores": cores(),
        "tbq": tbq.__version__,
        # NumPy's transparent huge pages ("0": off); on some VMs whether a process gets them splits runs in two
        "NUMPY_MADVISE_HUGEPAGE": os.environ.get("NUMPY_MADVISE_HUGEPAGE"),
    }
    try:
        import numba

        machine["numba"] = numba.__version__
    except ImportError:  # pragma: no cover
        pass
    doc = {
        "machine": machine,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "copy": copy,
        "anchor_values": n,
        "rounds": args.rounds,
        "anchor": anchor,
        "jit": jit,
        "results": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(doc, indent=1))
    print(markdown_table(out / "bench.json"))
    print()
    print(targets_table(out / "bench.json"))
    if results:
        _plot(results, out / "throughput.png", machine)
    print(f"\nwrote {out / 'bench.json'}", file=sys.stderr)
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
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    fmts = list(dict.fromkeys(r["format"] for r in results))
    cols = min(4, len(fmts))
    rows_n = -(-len(fmts) // cols)
    fig, axes = plt.subplots(2 * rows_n, cols, figsize=(4 * cols, 3.2 * 2 * rows_n), squeeze=False)
    for i, fmt in enumerate(fmts):
        for k, direction in enumerate(("encode", "decode")):
            ax = axes[2 * (i // cols) + k][i % cols]
            for backend in dict.fromkeys(r["backend"] for r in results):
                pts = [
                    (r["values"], r["mvalues_per_s"])
                    for r in results
                    if r["format"] == fmt and r["direction"] == direction and r["backend"] == backend
                ]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=backend)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{fmt} {direction}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
    for j in range(len(fmts), rows_n * cols):
        for k in range(2):
            axes[2 * (j // cols) + k][j % cols].axis("off")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"tbq throughput, million values/s ({machine['processor']}, {machine['cores']} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    sys.exit(main())
