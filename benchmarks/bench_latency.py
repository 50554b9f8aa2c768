"""Small-call latency: 1, 4 and 64 blocks per call, through a codec object and through the shortcuts.

    python benchmarks/bench_latency.py                 # every registered format
    python benchmarks/bench_latency.py --formats q8_0,tbq4_0
    python benchmarks/bench_latency.py --markdown benchmarks/results/latency.json

For each format and block count it times ``codec.encode`` / ``codec.decode`` on
a prebuilt codec and ``tbq.quantize`` / ``tbq.dequantize`` (which build or
fetch the codec on every call), numba backend, warm. Each figure is the median
over ``--rounds`` batches of ``--calls`` calls (microseconds per call); the
rounds of all variants are interleaved, and the spread (max - min) / median of
the batches is recorded. The targets: one block in at most 5 us
through a codec object and 10 us through the shortcuts.

Writes ``results/latency.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import tbq

HERE = Path(__file__).resolve().parent
BLOCKS = (1, 4, 64)
TARGET_US = {"codec": 5.0, "shortcut": 10.0}


def measure(fmts, calls: int, rounds: int, log) -> list[dict]:
    rows = []
    for fmt in fmts:
        codec = tbq.get_codec(fmt)
        variants = {}
        for nb in BLOCKS:
            x = np.random.default_rng(nb).standard_normal((nb, codec.block_size)).astype(np.float32)
            q = codec.encode(x)
            variants[(nb, "codec.encode")] = lambda x=x: codec.encode(x)
            variants[(nb, "codec.decode")] = lambda q=q: codec.decode(q)
            variants[(nb, "tbq.quantize")] = lambda x=x: tbq.quantize(x, fmt)
            variants[(nb, "tbq.dequantize")] = lambda q=q: tbq.dequantize(q, fmt)
        for fn in variants.values():  # warm: compiled, cached
            for _ in range(50):
                fn()
        times = {k: [] for k in variants}
        for _ in range(rounds):
            for k, fn in variants.items():
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                times[k].append((time.perf_counter() - t0) / calls * 1e6)
        for (nb, what), ts in times.items():
            rows.append(
                {
                    "format": fmt,
                    "blocks": nb,
                    "call": what,
                    "us_median": statistics.median(ts),
                    "us_min": min(ts),
                    "spread": (max(ts) - min(ts)) / statistics.median(ts),
                }
            )
        one = {r["call"]: r["us_median"] for r in rows if r["format"] == fmt and r["blocks"] == 1}
        log(f"  {fmt:9s} 1 block: " + "  ".join(f"{k} {v:.1f}" for k, v in one.items()) + " us")
    return rows


def markdown_table(path: Path) -> str:
    doc = json.loads(Path(path).read_text())
    by = {(r["format"], r["blocks"], r["call"]): r for r in doc["rows"]}
    fmts = list(dict.fromkeys(r["format"] for r in doc["rows"]))
    head = (
        "| format | "
        + " | ".join(f"{nb} block{'s' if nb > 1 else ''}: codec | {nb}: quantize / dequantize" for nb in BLOCKS)
        + " |"
    )
    lines = [head, "|---|" + "---|---|" * len(BLOCKS)]
    for fmt in fmts:
        cells = []
        for nb in BLOCKS:
            g = lambda c: by[(fmt, nb, c)]["us_median"]  # noqa: E731
            cells.append(f"{g('codec.encode'):.1f} / {g('codec.decode'):.1f}")
            cells.append(f"{g('tbq.quantize'):.1f} / {g('tbq.dequantize'):.1f}")
        lines.append(f"| {fmt} | " + " | ".join(cells) + " |")
    worst = max(r["spread"] for r in doc["rows"])
    one = [r for r in doc["rows"] if r["blocks"] == 1]
    codec_max = max(r["us_median"] for r in one if r["call"].startswith("codec"))
    short_max = max(r["us_median"] for r in one if r["call"].startswith("tbq"))
    note = (
        f"\nMicroseconds per call (median of {doc['rounds']} interleaved batches of {doc['calls']} calls; the largest "
        f"batch-to-batch spread was {worst:.0%}), numba backend, warm, {doc['cores']} cores, load average "
        f"{doc['load_before'][0]:.1f} before / {doc['load_after'][0]:.1f} after. One block, slowest format: "
        f"{codec_max:.1f} us through a codec object (target 5), {short_max:.1f} us through tbq.quantize/dequantize (target 10)."
    )
    return "\n".join(lines) + "\n" + note


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formats", default=",".join(tbq.format_names()))
    p.add_argument("--calls", type=int, default=200, help="calls per timed batch")
    p.add_argument("--rounds", type=int, default=21, help="batches per figure (median reported)")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--markdown", metavar="LATENCY_JSON", help="print the table from a latency.json and exit")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown_table(Path(args.markdown)))
        return 0
    load_before = os.getloadavg()
    rows = measure(
        [f for f in args.formats.split(",") if f],
        args.calls,
        args.rounds,
        lambda m: print(m, file=sys.stderr, flush=True),
    )
    doc = {
        "rows": rows,
        "calls": args.calls,
        "rounds": args.rounds,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latency.json").write_text(json.dumps(doc, indent=1))
    print(markdown_table(out / "latency.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
