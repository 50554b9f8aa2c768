"""The tables of docs/performance.md and docs/robustness.md, rendered from the committed results files.

    python benchmarks/docs_tables.py              # every table, each under the page and section it belongs to
    python benchmarks/docs_tables.py attention    # one of them (the names are the keys of TABLES)

Each table is a function of files under ``benchmarks/results/`` only, so every
figure on those pages can be traced to a committed run
(``benchmarks/results/README.md`` says which script wrote each file, on which
machine kind and when). ``tests/test_docs_results.py`` checks that the pages
hold these tables verbatim: rerun a benchmark, commit its results file, point
the table here at it and paste the new output into the page.

The memory floor of an attention figure is the time a plain memory copy of the
same run takes to move the cache's bytes (K and V, as stored): ``cache_bytes /
copy rate`` on the same number of threads. A decode step cannot read its cache
faster than that; ``x floor`` is how far above it the kernel is.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

#: Machine kinds, in the order the pages list them.
XEON = "Intel Xeon, AVX-512"
EPYC_AVX2 = "AMD EPYC, AVX2 only"
EPYC_AVX512 = "AMD EPYC, AVX-512"


def _load(rel: str) -> Any:
    return json.loads((RESULTS / rel).read_text())


def _script(name: str):
    """A benchmark script as a module (its table functions), without running it."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


def _pair(cells: list[str], unit: str = "") -> str:
    """``a / b`` (with the unit once), or ``–`` when neither was measured."""
    if all(c == "–" for c in cells):
        return "–"
    return " / ".join(cells) + (unit if any(c not in ("–", "failed") for c in cells) else "")


def _cell(row: dict, key: str) -> dict | None:
    c = row.get(key)
    return c if isinstance(c, dict) else None


def _best(row: dict, key: str) -> float | None:
    c = _cell(row, key)
    return None if c is None or "best" not in c else c["best"]


def _floor_ms(nbytes: int, copy: dict, threads: int) -> float:
    rate = copy["gb_per_s_1_thread"] if threads == 1 else copy["gb_per_s_2_threads"]
    return nbytes / (rate * 1e9) * 1e3


# ---------------------------------------------------------------------------------------------- attention


#: The decode-step runs quoted, per machine kind: results files, merged row by row (the first file's row wins).
ATTENTION_RUNS = {
    XEON: ["attention.json"],
    EPYC_AVX2: ["attention_epyc_avx2/attention.json"],
    EPYC_AVX512: ["attention_epyc_avx512/attention.json", "turbo_attention_epyc_avx512/attention.json"],
}


def attention_table(files: list[str]) -> str:
    """One decode step at 32K tokens for every format of the runs: tbq, its memory floor, ggml, the ratios."""
    lines = [
        "| cache | MB read | floor, 1 / 2 thr | tbq fused, 1 / 2 thr | tbq / floor | ggml FA, 1 / 2 thr | ggml / tbq |",
        "|---|---|---|---|---|---|---|",
    ]
    # one row per format, in the order first met; a later run's row replaces one without ggml figures (the turbo
    # types: only the community fork's build, timed in its own run, has them)
    picked: dict[str, tuple[dict, dict]] = {}
    notes = []
    for rel in files:
        doc = _load(rel)
        for r in doc["rows"]:
            old = picked.get(r["format"])
            if old is None or (_best(old[0], "ggml_1") is None and _best(r, "ggml_1") is not None):
                picked[r["format"]] = (r, doc)
        ggml = f"`{doc['ggml']}`" + (f" (`{doc['ggml_lib']['folder']}/`)" if doc.get("ggml_lib") else "")
        notes.append(
            f"`{rel}`: {', '.join(r['format'] for r in doc['rows'])}; best of {doc['rounds']} rounds; ggml {ggml}; "
            f"copy {doc['copy']['gb_per_s_1_thread']:.1f} / {doc['copy']['gb_per_s_2_threads']:.1f} GB/s; "
            f"load {doc['load_before'][0]:.1f} before, {doc['load_after'][0]:.1f} after"
        )
    for r, doc in picked.values():
        fl = [_floor_ms(r["cache_bytes"], doc["copy"], t) for t in (1, 2)]
        tb = [_best(r, f"tbq_{t}") for t in (1, 2)]
        gg = []
        for t in (1, 2):
            c = _cell(r, f"ggml_{t}")
            gg.append("failed" if c is not None and "error" in c else _ms(_best(r, f"ggml_{t}")))
        ratio = [
            "–" if _best(r, f"ggml_{t}") is None or tb[i] is None else f"{_best(r, f'ggml_{t}') / tb[i]:.2f}x"
            for i, t in enumerate((1, 2))
        ]
        lines.append(
            f"| {r['format']} | {r['cache_bytes'] / 1e6:.1f} | {fl[0]:.1f} / {fl[1]:.1f} ms | "
            f"{_ms(tb[0])} / {_ms(tb[1])} ms | {tb[0] / fl[0]:.1f}x / {tb[1] / fl[1]:.1f}x | "
            f"{_pair(gg, ' ms')} | {_pair(ratio)} |"
        )
    return "\n".join(lines) + "\n\n" + "Runs: " + "; ".join(notes) + "."


def attention_growth(rel: str = "attention.json") -> str:
    """One decode step, 2 threads, as the cache grows, beside its memory floor."""
    doc = _load(rel)
    by = {(s["format"], s["tokens"]): s for s in doc["sweep"]}
    fmts = list(dict.fromkeys(s["format"] for s in doc["sweep"]))
    lines = [
        "| tokens | " + " | ".join(f"{f}, 2 thr | {f} floor | {f} per 1K tokens" for f in fmts) + " |",
        "|---|" + "---|---|---|" * len(fmts),
    ]
    for t in sorted({s["tokens"] for s in doc["sweep"]}):
        cells = []
        for f in fmts:
            s = by.get((f, t))
            cells += (
                [
                    f"{s['best']:.2f} ms",
                    f"{_floor_ms(s['cache_bytes'], doc['copy'], 2):.2f} ms",
                    f"{s['best'] / (t / 1024):.3f} ms",
                ]
                if s
                else ["–"] * 3
            )
        lines.append(f"| {t // 1024}K | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def attention_prefill(rel: str = "attention.json") -> str:
    """A 64-token causal prefill over 4K cached tokens, tbq against ggml."""
    doc = _load(rel)
    lines = ["| cache | tbq fused, 1 / 2 thr | ggml FA, 1 / 2 thr | ggml / tbq |", "|---|---|---|---|"]
    for r in doc["prefill"]:
        tb = [_best(r, f"tbq_{t}") for t in (1, 2)]
        gg = [_best(r, f"ggml_{t}") for t in (1, 2)]
        ratio = _pair(["–" if g is None or b is None else f"{g / b:.2f}x" for g, b in zip(gg, tb, strict=True)])
        lines.append(
            f"| {r['format']} | {_ms(tb[0])} / {_ms(tb[1])} ms | {_pair([_ms(g) for g in gg], ' ms')} | {ratio} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- codecs


#: The rotated encoders' current runs, per machine kind (none of the current encoder on the Xeon kind yet).
ROTATED_RUNS = {
    EPYC_AVX2: "codecs_rotated_epyc_avx2/bench.json",
    EPYC_AVX512: "codecs_rotated_epyc_avx512/bench.json",
}


def codecs_table() -> str:
    """Every format against C on the Xeon (the README's table too)."""
    return _script("bench_codecs").markdown_table(RESULTS / "bench.json")


def rotated_codecs_table() -> str:
    """TBQ encode and decode by machine kind, one thread, 16M values, with the in-run C anchor's ratio."""
    by_of = _script("bench_codecs")._by
    lines = [
        "| machine kind | tbq4_0 encode / decode | x C in-run | tbq3_0 encode / decode | x C in-run | copy, 1 thread | results |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, rel in ROTATED_RUNS.items():
        doc = _load(rel)
        by = by_of(doc)
        cells = []
        for f in ("tbq4_0", "tbq3_0"):
            q, d = (by[(f, x, "numba-1")]["mvalues_per_s"] for x in ("encode", "decode"))
            qc, dc = (by[(f, x, "C")]["mvalues_per_s"] for x in ("encode", "decode"))
            cells += [f"{q:,.0f} / {d:,.0f}", f"{q / qc:.1f}x / {d / dc:.1f}x"]
        lines.append(
            f"| {kind} | "
            + " | ".join(cells)
            + f" | {doc['copy']['gb_per_s_1_thread']:.1f} GB/s | `{rel.split('/')[0]}/` |"
        )
    return "\n".join(lines)


def latency_table() -> str:
    return _script("bench_latency").markdown_table(RESULTS / "latency.json")


# ---------------------------------------------------------------------------------------------- cold start, memory, eval

COLD_RUNS = {
    XEON: "cold_start.json",
    EPYC_AVX2: "cold_start_epyc_avx2/cold_start.json",
    EPYC_AVX512: "cold_start_epyc_avx512/cold_start.json",
}


def cold_start_table() -> str:
    """The first `tbq compare` with an empty numba cache, by machine kind."""
    lines = [
        "| machine kind | `tbq compare` formats | notice | cold (stderr a pipe) | cold (terminal) | warm | `import tbq` |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, rel in COLD_RUNS.items():
        doc = _load(rel)
        for r in doc["rows"]:
            c = r["cold"]["total_s"]
            if "cold_rounds" in r:
                c = r["cold_rounds"]["this"]["median_s"]
            lines.append(
                f"| {kind} | {'all' if r['formats'] == 'all' else r['formats']} | {r['cold']['notice_s']:.2f} s | "
                f"{c:.1f} s | {r['cold_tty']['total_s']:.1f} s | {r['warm']['total_s']:.1f} s | {doc['import_s']:.2f} s |"
            )
    return "\n".join(lines)


def memory_table() -> str:
    doc = _load("compare_memory.json")
    lines = ["| input | tokens x 8 x 128 | peak RSS | (peak - fixed) / input |", "|---|---|---|---|"]
    for r in doc["runs"]:
        lines.append(f"| {r['input_mib']:.0f} MiB | {r['tokens']:,} | {r['peak_mib']:.0f} MiB | {r['ratio']:.2f} |")
    return "\n".join(lines) + f"\n\nFixed overhead {doc['fixed_mib']:.0f} MiB (the peak on a 16-token file)."


#: The committed run of benchmarks/bench_eval.py the performance page quotes.
EVAL_OVERHEAD_RUN = "eval_overhead_epyc_avx512.json"


def eval_overhead_table() -> str:
    """What the quantized cache adds to a forward pass of `tbq eval`'s engine, per cache type."""
    doc = _load(EVAL_OVERHEAD_RUN)
    runs = doc["models"]
    fmts = list(dict.fromkeys(f for run in runs for f in run["rows"]))
    lines = [
        "| model | parameters | context | forward, no cache (CPU) | " + " | ".join(fmts) + " |",
        "|---|---|---|---|" + "---|" * len(fmts),
    ]
    for run in runs:
        cells = [f"{run['rows'][f]['cpu_overhead']:+.0%}" if f in run["rows"] else "–" for f in fmts]
        lines.append(
            f"| {run['label']} | {run['params'] / 1e6:,.1f}M | {run['context']} | {run['own_cpu_ms']:,.0f} ms | "
            + " | ".join(cells)
            + " |"
        )
    m = doc["machine"]
    load = f"{m['loadavg_before'][0]:.0f} before / {m['loadavg_after'][0]:.0f} after"
    return "\n".join(lines) + (
        f"\n\nCPU time of the process, best of the rounds, torch on {m['torch_threads']} thread; "
        f"{m['cpu']}, {m['cores']} cores, load average {load}."
    )


# ---------------------------------------------------------------------------------------------- robustness


def fuzz_table() -> str:
    return _script("run_fuzz").markdown(_load("fuzz_plan_100k.json"))


def mutation_tables() -> str:
    return _script("mutation").markdown(_load("mutation.json"))


#: name -> (page, the function that renders its table from the results files)
TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "codecs": ("performance.md", codecs_table),
    "rotated_codecs": ("performance.md", rotated_codecs_table),
    "latency": ("performance.md", latency_table),
    **{
        f"attention_{k}": ("performance.md", (lambda files=files: attention_table(files)))
        for k, files in zip(("xeon", "epyc_avx2", "epyc_avx512"), ATTENTION_RUNS.values(), strict=True)
    },
    "attention_growth": ("performance.md", attention_growth),
    "attention_prefill": ("performance.md", attention_prefill),
    "cold_start": ("performance.md", cold_start_table),
    "memory": ("performance.md", memory_table),
    "eval_overhead": ("performance.md", eval_overhead_table),
    "fuzz": ("robustness.md", fuzz_table),
    "mutation": ("robustness.md", mutation_tables),
}


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(TABLES)
    for name in names:
        page, fn = TABLES[name]
        print(f"<!-- {name}: docs/{page} -->\n{fn()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
