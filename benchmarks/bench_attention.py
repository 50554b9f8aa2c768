"""The fused attention kernel against ggml's CPU flash attention, measured in the same run.

    python benchmarks/bench_attention.py --ggml ../shared/ggml/upstream          # everything, ~10 min
    python benchmarks/bench_attention.py --ggml ../shared/ggml/upstream --formats q8_0,tbq4_0 --no-sweep --no-prefill
    python benchmarks/bench_attention.py                                          # no ggml build: reference figures
    python benchmarks/bench_attention.py --markdown benchmarks/results/attention.json

One decode step (1 query token): 32 query heads over ``--tokens`` (32K) cached
tokens x 8 KV heads x head_dim 128 (GQA, 4 query heads per KV head), K and V
in the same format, on 1 and 2 threads:

- ``tbq``: :func:`tbq.attention.attention_fused` (every registered format,
  read through its attention reader);
- ``ggml``: ``ggml_flash_attn_ext(q, k, v, NULL, 1/sqrt(128), 0, 0)`` computed
  by ggml's CPU backend (``benchmarks/ggml_fa_bench.c``, the harness of
  ``../shared/ggml/fa_bench.c`` with every timing printed), compiled at
  benchmark time against the ggml build given by ``--ggml`` (a folder with
  ``include/`` and ``lib/``, and ``lib-avx512/`` where the CPU has its flags: the faster of the two that runs,
  recorded as ``ggml_lib``) and run in a subprocess (a build for another
  CPU dies on an illegal instruction without taking the benchmark with it),
  on every cache type ggml has. Both fill K and V with uniform values in
  [-1.7, 1.7] (ggml quantizes with ``ggml_quantize_chunk``, tbq with its codecs).

For each case the two are timed back to back in every round (``--rounds``,
default 7), so machine load hits both alike, each after one untimed warm-up
computation in the round (ggml's harness computes once before it times); the tables give the best time
and the ratio ggml / tbq, and the memory floor: the bytes of the two caches
at the rate of a plain ``np.copyto`` of 256 MiB measured in the same run (the
median of 5, on as many threads, 2 at most), and tbq's time over it. Then the growth of tbq4_0
and tbq3_0 from 1K to 256K tokens (2 threads), and a prefill-shaped call:
64 query tokens, causal, over ``--prefill-tokens`` (4K) tokens, against ggml
with the causal mask. Without ``--ggml`` the ggml columns show reference
figures (:data:`REFERENCE_MS`, labelled so: not measured in this run).

Before timing, every tbq result is checked against dequantize + float64
attention (relative error printed). Writes ``results/attention.json`` and
prints the tables (Markdown, to paste as they are).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import tbq
from tbq.attention import KVCache, attention_fused

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_codecs import copy_rate, parse_size  # noqa: E402

HARNESS = HERE / "ggml_fa_bench.c"
#: tbq formats that are also ggml cache types (ggml's type names)
GGML_TYPES = (
    "f16",
    "bf16",
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    "iq4_nl",
    "mxfp4",
    "nvfp4",
    "turbo2",
    "turbo3",
    "turbo4",
)
#: (the turbo types are the community fork's: only its build, ../shared/ggml/turbo, has them; another build's
#: harness says "unknown type", and the ggml column stays empty)
#: reference figures without --ggml (ggml-org/ggml d99724f, -DGGML_NATIVE=ON, best of 7, 32K tokens, a Xeon)
REFERENCE_MS = {
    ("f16", 1): 39.4,
    ("f16", 2): 18.5,
    ("q8_0", 1): 62.8,
    ("q8_0", 2): 34.3,
    ("q4_0", 1): 88.5,
    ("q4_0", 2): 45.5,
}
G, H, D = 8, 32, 128


# ---------------------------------------------------------------------------
# ggml
# ---------------------------------------------------------------------------


def _elf(lib_dir: Path, stem: str) -> Path:
    """The real shared library ``stem.so*`` in ``lib_dir`` (some copies keep a symlink as a text file)."""
    for p in sorted(lib_dir.glob(stem + ".so*")):
        if p.is_file() and p.read_bytes()[:4] == b"\x7fELF":
            return p
    raise SystemExit(f"no {stem}.so in {lib_dir}")


#: CPU flags of ``lib-avx512/`` builds (../shared/ggml/README.md): without them such a build dies of SIGILL
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512_vnni", "avx512_bf16")


def lib_folders(path: Path) -> list[str]:
    """The library folders of the ggml build at ``path`` that can run on this CPU: ``lib/`` (portable) and, where
    the CPU has :data:`AVX512_FLAGS`, ``lib-avx512/``."""
    try:
        flags = set(
            " ".join(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")).split()
        )
    except OSError:
        flags = set()
    out = ["lib-avx512"] if all(f in flags for f in AVX512_FLAGS) and (path / "lib-avx512").is_dir() else []
    return out + (["lib"] if (path / "lib").is_dir() else [])


def pick_build(path: Path, log=print) -> tuple[Path, dict]:
    """The harness built against the faster library folder of ``path`` that runs here (the anchor is the best ggml
    for the machine), and what was measured to choose it: q4_0, 4K tokens, 2 threads, best of 5."""
    probe: dict = {}
    exes = {}
    for folder in lib_folders(path):
        exes[folder] = build_ggml(path, folder)
        t = ggml_times(exes[folder], 4096, "q4_0", 2, 1, False, 5)
        probe[folder] = min(t) if isinstance(t, list) else t
        log(f"  ggml {folder}/: {probe[folder] if isinstance(t, str) else f'{probe[folder]:.2f} ms'} (probe)")
    timed = {f: v for f, v in probe.items() if isinstance(v, float)}
    if not timed:
        raise SystemExit(f"no ggml library folder of {path} runs here: {probe}")
    best = min(timed, key=timed.__getitem__)
    log(f"ggml build used: {path}/{best}/")
    return exes[best], {"folder": best, "probe_ms": probe}


def build_ggml(path: Path, folder: str = "lib") -> Path:
    """Compile the harness against the ggml build at ``path`` (``include/``, ``folder``); the executable's path."""
    lib = path / folder
    exe = Path(tempfile.mkdtemp(prefix="tbq-ggml-")) / "ggml_fa_bench"
    cmd = [
        "cc",
        "-O2",
        "-I",
        str(path / "include"),
        str(HARNESS),
        "-o",
        str(exe),
        str(_elf(lib, "libggml-base")),
        str(_elf(lib, "libggml-cpu")),
        f"-Wl,-rpath,{lib}",
        "-lm",
    ]
    subprocess.run(cmd, check=True)
    return exe


def ggml_times(exe: Path, tokens: int, fmt: str, threads: int, n_query: int, causal: bool, reps: int):
    """ggml's times in ms (``reps`` computes after a warm-up), the reason there are none, or None where the build
    has no such type."""
    r = subprocess.run(
        [str(exe), str(tokens), fmt, str(threads), str(n_query), str(int(causal)), str(reps)],
        capture_output=True,
        text=True,
    )
    if r.returncode == 2 and "unknown type" in r.stderr:
        return None  # not a type of this build
    if r.returncode:
        why = f"signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
        return f"ggml failed ({why}{': illegal instruction, a build for another CPU' if r.returncode == -4 else ''})"
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("ms")][0]
    return [float(x) for x in line.split()[1:]]


# ---------------------------------------------------------------------------
# tbq
# ---------------------------------------------------------------------------


def make(tokens: int, fmt: str, n_query: int = 1, seed: int = 3):
    """q and the K and V caches of ``fmt`` (the same values in both, as the ggml harness)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.7, 1.7, (tokens, G, D)).astype(np.float32)
    K = KVCache.encode(x, fmt)
    V = KVCache.encode(x, fmt)
    del x
    q = rng.uniform(-1.7, 1.7, (n_query, H, D)).astype(np.float32)
    return (q[0] if n_query == 1 else q), K, V


def check(q, K, V, causal=False) -> float:
    """Relative error of the kernel against dequantize + float64 attention on the first 2K tokens."""
    n = min(K.n_tokens, 2048)
    Ks, Vs = KVCache(K.fmt, K.data[:n], D, K.config), KVCache(V.fmt, V.data[:n], D, V.config)
    qq = q if q.ndim == 2 else q[-1]
    kd, vd = Ks.dequantize(np.float64), Vs.dequantize(np.float64)
    s = np.einsum("hd,thd->ht", qq.astype(np.float64), kd[:, np.arange(H) // (H // G)]) / np.sqrt(D)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = np.einsum("ht,thd->hd", p / p.sum(axis=1, keepdims=True), vd[:, np.arange(H) // (H // G)])
    got = attention_fused(qq, Ks, Vs)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def tbq_time(q, K, V, threads: int, causal: bool = False) -> float:
    t0 = time.perf_counter()
    attention_fused(q, K, V, threads=threads, causal=causal)
    return (time.perf_counter() - t0) * 1e3


def side_by_side(exe, tokens, fmt, threads_list, rounds, n_query=1, causal=False, *, log=print, copy=None) -> dict:
    """Best and median times of tbq and ggml, ``rounds`` rounds, the two back to back in each (``copy``: the copy
    rates, to log the memory floor beside each time)."""
    q, K, V = make(tokens, fmt, n_query)
    row = {
        "format": fmt,
        "tokens": tokens,
        "n_query": n_query,
        "causal": causal,
        "cache_bytes": K.data.nbytes + V.data.nbytes,
        "rel_err": check(q, K, V),
    }
    for th in threads_list:
        tbq_time(q, K, V, th, causal)  # warm-up (and compile)
        ts, gs, gerr = [], [], None
        for _ in range(rounds):
            if exe is not None and fmt in GGML_TYPES and gerr is None:
                g = ggml_times(exe, tokens, fmt, th, n_query, causal, 1)
                if g is None:  # the build has no such type
                    exe = None
                elif isinstance(g, str):
                    gerr = g
                else:
                    gs += g
            # one warm-up call first, as the ggml harness computes once before it times: right after
            # another process (ggml's) a first call runs on cold caches, up to 1.4x slower (measured)
            tbq_time(q, K, V, th, causal)
            ts.append(tbq_time(q, K, V, th, causal))
        row[f"tbq_{th}"] = {"best": min(ts), "median": float(np.median(ts)), "all": ts}
        if gs:
            row[f"ggml_{th}"] = {"best": min(gs), "median": float(np.median(gs)), "all": gs}
        elif gerr:
            row[f"ggml_{th}"] = {"error": gerr}
        elif exe is None and (fmt, th) in REFERENCE_MS and tokens == 32768 and n_query == 1:  # their shape only
            row[f"ggml_{th}"] = {"best": REFERENCE_MS[(fmt, th)], "reference": True}
        g = row.get(f"ggml_{th}", {})
        fl = f", floor {floor_ms(row['cache_bytes'], copy, th):.2f} ms" if copy else ""
        log(
            f"  {fmt} T={tokens} nq={n_query} threads={th}: tbq {min(ts):.2f} ms{fl}"
            + (
                f", ggml {g['best']:.2f} ms{' (reference)' if g.get('reference') else ''}"
                if "best" in g
                else f", {g.get('error', 'no ggml type')}"
            )
        )
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ggml", metavar="PATH", help="a ggml build (include/, lib/), e.g. ../shared/ggml/upstream")
    p.add_argument("--tokens", default="32K")
    p.add_argument("--formats", default="all", help="comma-separated, or 'all' registered formats")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument(
        "--sweep", default="1K,4K,16K,32K,64K,256K", help="token counts of the growth table (tbq4_0, tbq3_0, 2 threads)"
    )
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--prefill-tokens", default="4K")
    p.add_argument("--prefill-formats", default="f16,q8_0,q4_0,tbq4_0,tbq3_0")
    p.add_argument("--no-prefill", action="store_true")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--markdown", metavar="ATTENTION_JSON")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0

    def log(m):
        print(m, file=sys.stderr, flush=True)

    exe, ggml_lib = pick_build(Path(args.ggml).resolve(), log) if args.ggml else (None, None)
    load_before = os.getloadavg()
    copy = copy_rate()
    threads = [int(t) for t in args.threads.split(",")]
    fmts = tbq.format_names() if args.formats == "all" else tuple(args.formats.split(","))
    untiled = [f for f in fmts if f in tbq.format_names() and D % tbq.format_info(f).block_size]
    if untiled and args.formats != "all":  # named: refuse before any work, as tbq compare does
        p.error(f"--formats: {', '.join(untiled)} cannot tile head_dim {D} (block size does not divide it)")
    for f in untiled:  # the default list: skip with a note (q8_k's 256-value blocks span two heads of 128)
        log(f"skipped {f}: its {tbq.format_info(f).block_size}-value blocks do not tile head_dim {D}")
    fmts = tuple(f for f in fmts if f not in untiled)
    T = parse_size(args.tokens)
    log(
        f"copy rate: {copy['gb_per_s_1_thread']:.1f} GB/s (1 thread), {copy['gb_per_s_2_threads']:.1f} GB/s (2 threads)"
    )
    rows = [side_by_side(exe, T, f, threads, args.rounds, log=log, copy=copy) for f in fmts]
    sweep = []
    if not args.no_sweep:
        for f in ("tbq4_0", "tbq3_0"):
            for s in args.sweep.split(","):
                t = parse_size(s)
                q, K, V = make(t, f)
                tbq_time(q, K, V, 2)
                ts = [tbq_time(q, K, V, 2) for _ in range(max(3, args.rounds // 2))]
                sweep.append(
                    {
                        "format": f,
                        "tokens": t,
                        "best": min(ts),
                        "median": float(np.median(ts)),
                        "cache_bytes": K.data.nbytes + V.data.nbytes,
                    }
                )
                log(f"  sweep {f} {s}: {min(ts):.2f} ms")
                del q, K, V
    prefill = []
    if not args.no_prefill:
        for f in args.prefill_formats.split(","):
            prefill.append(
                side_by_side(
                    exe,
                    parse_size(args.prefill_tokens),
                    f,
                    threads,
                    max(3, args.rounds // 2),
                    64,
                    True,
                    log=log,
                    copy=copy,
                )
            )
    doc = {
        "rows": rows,
        "sweep": sweep,
        "prefill": prefill,
        "copy": copy,
        "rounds": args.rounds,
        "threads": threads,
        "ggml": str(args.ggml) if args.ggml else None,
        "ggml_lib": ggml_lib,  # the library folder used (lib-avx512 or lib) and the probe that chose it
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        # NumPy's transparent huge pages for tbq's caches ("0": off; ggml allocates its own)
        "NUMPY_MADVISE_HUGEPAGE": os.environ.get("NUMPY_MADVISE_HUGEPAGE"),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention.json").write_text(json.dumps(doc, indent=1))
    print(markdown(doc))
    return 0


def _ms(cell: dict | None) -> str:
    if not cell:
        return "–"
    if "error" in cell:
        return "failed"
    return f"{cell['best']:.1f} ms" + (" (ref.)" if cell.get("reference") else "")


def _ratio(g: dict | None, t: dict) -> str:
    return f"{g['best'] / t['best']:.2f}x" if g and "best" in g else "–"


def floor_ms(cache_bytes: int, copy: dict, threads: int) -> float:
    """The memory floor: ``cache_bytes`` at the copy rate measured on ``threads`` threads (2 at most), in ms."""
    rate = copy["gb_per_s_1_thread"] if threads == 1 else copy["gb_per_s_2_threads"]
    return cache_bytes / (rate * 1e9) * 1e3


def _table(rows, threads, doc, first: str) -> list:
    head = (
        f"| {first} | "
        + " | ".join(
            f"ggml FA, {t} thr | tbq fused, {t} thr | ggml / tbq, {t} thr | floor, {t} thr | tbq / floor, {t} thr"
            for t in threads
        )
        + " |"
    )
    lines = [head, "|---|" + "---|" * (5 * len(threads))]
    for r in rows:
        cells = []
        for t in threads:
            g, tb = r.get(f"ggml_{t}"), r[f"tbq_{t}"]
            fl = floor_ms(r["cache_bytes"], doc["copy"], t)
            cells += [_ms(g), f"{tb['best']:.1f} ms", _ratio(g, tb), f"{fl:.1f} ms", f"{tb['best'] / fl:.2f}x"]
        lines.append(f"| {r['format']} | " + " | ".join(cells) + " |")
    return lines


def markdown(doc: dict) -> str:
    th = doc["threads"]
    rows = doc["rows"]
    r0 = rows[0]
    lines = _table(rows, th, doc, "cache")
    spread = max(
        (max(c["all"]) - min(c["all"])) / min(c["all"])
        for r in rows
        for k, c in r.items()
        if isinstance(c, dict) and "all" in c
    )
    fails = sorted(
        {c["error"] for r in rows + doc.get("prefill", []) for c in r.values() if isinstance(c, dict) and "error" in c}
    )
    anchor = (
        f"ggml: the build at `{doc['ggml']}`"
        + (f" (`{doc['ggml_lib']['folder']}/`, the faster that runs here)" if doc.get("ggml_lib") else "")
        + ", measured in this run back to back with tbq in each round"
        if doc["ggml"]
        else "ggml: **reference figures, not measured in this run** (pass `--ggml PATH` to measure)"
    )
    text = "\n".join(lines) + (
        f"\n\nOne decode step: 1 query token, {H} query heads, {r0['tokens']:,} cached tokens x {G} KV heads x head_dim {D}, "
        f"K and V in the same format; best of {doc['rounds']} rounds (the largest spread of a cell's rounds: {spread:.0%}). {anchor}. "
        f"{doc['cores']} cores, load average {doc['load_before'][0]:.1f} before / {doc['load_after'][0]:.1f} after. "
        f"A plain memory copy moved {doc['copy']['gb_per_s_1_thread']:.1f} GB/s (1 thread) / {doc['copy']['gb_per_s_2_threads']:.1f} GB/s "
        f"(2 threads) in the same run; the floor is the two caches' bytes at that rate. tbq's largest relative error against dequantize + float64 attention: "
        f"{max(r['rel_err'] for r in rows):.1e}."
    )
    if fails:
        text += " ggml cells marked failed: " + "; ".join(fails) + "."
    if doc.get("sweep"):
        text += (
            "\n\n| tokens | "
            + " | ".join(f"{f}, 2 thr | {f} per 1K tokens | {f} cache read" for f in ("tbq4_0", "tbq3_0"))
            + " |\n"
        )
        text += "|---|" + "---|" * 6 + "\n"
        by = {(s["format"], s["tokens"]): s for s in doc["sweep"]}
        for t in sorted({s["tokens"] for s in doc["sweep"]}):
            cells = []
            for f in ("tbq4_0", "tbq3_0"):
                s = by.get((f, t))
                cells += (
                    [
                        f"{s['best']:.2f} ms",
                        f"{s['best'] / (t / 1024):.3f} ms",
                        f"{s['cache_bytes'] / s['best'] / 1e6:.1f} GB/s",
                    ]
                    if s
                    else ["–"] * 3
                )
            text += f"| {t // 1024}K | " + " | ".join(cells) + " |\n"
        text += f"\nGrowth of one decode step with the cache (2 threads, best of {max(3, doc['rounds'] // 2)})."
    if doc.get("prefill"):
        p0 = doc["prefill"][0]
        text += "\n\n" + "\n".join(_table(doc["prefill"], th, doc, "cache (prefill)"))
        text += (
            f"\n\nPrefill-shaped call: {p0['n_query']} query tokens, causal (query token i sees the cache up to itself), "
            f"{p0['tokens']:,} cached tokens, same heads; ggml with the causal mask; best of {max(3, doc['rounds'] // 2)}."
        )
    return text


if __name__ == "__main__":
    sys.exit(main())
