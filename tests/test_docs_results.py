"""docs/performance.md and docs/robustness.md quote committed results, and every results file is indexed.

Each table on those pages is what ``benchmarks/docs_tables.py`` renders from a
file under ``benchmarks/results/``; the attention tables are also read back
cell by cell against the results JSON (the tbq times, the ggml times and the
memory floor recomputed here from the cache's bytes and the run's copy rate),
so the renderer cannot drift from the files either.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import itertools
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"


def _docs_tables():
    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "benchmarks" / "docs_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


DT = _docs_tables()


@pytest.mark.parametrize("name", list(DT.TABLES))
def test_each_table_on_the_page_is_the_rendering_of_its_results_file(name):
    page, render = DT.TABLES[name]
    table = render().strip()
    assert table.count("\n|") >= 2, f"{name}: a table with no rows"
    assert table in (DOCS / page).read_text(encoding="utf-8"), (
        f"docs/{page}: the {name} table is not what `python benchmarks/docs_tables.py {name}` prints"
    )


def _page_rows(text: str, after: str) -> list[list[str]]:
    """The cells of the first table that follows the line starting with ``after``."""
    i = text.index(after)
    rows = []
    for line in text[i:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # the header and its rule


def _pair(cell: str) -> list[float | None]:
    cells = [x.strip().rstrip("msx ") for x in cell.split("/")]
    return [None if x in ("–", "failed") else float(x) for x in cells]


@pytest.mark.parametrize(
    ("heading", "kind"),
    [
        ("**Intel Xeon, AVX-512**", DT.XEON),
        ("**AMD EPYC, AVX2 only**", DT.EPYC_AVX2),
        ("**AMD EPYC, AVX-512**", DT.EPYC_AVX512),
    ],
)
def test_attention_cells_match_the_results_json(heading, kind):
    rows = _page_rows((DOCS / "performance.md").read_text(encoding="utf-8"), heading)
    docs = [json.loads((RESULTS / f).read_text()) for f in DT.ATTENTION_RUNS[kind]]
    want = {}
    for doc in docs:  # first met wins, unless it has no ggml figures and a later run's row has (the turbo types)
        for r in doc["rows"]:
            old = want.get(r["format"])
            if old is None or ("ggml_1" not in old[0] and "ggml_1" in r):
                want[r["format"]] = (r, doc)
    assert [r[0] for r in rows] == list(want), "the page's formats are those of the results files, in order"
    for fmt, mb, floor, tbq, x_floor, ggml, _ratio in rows:
        r, doc = want[fmt]
        assert float(mb) == pytest.approx(r["cache_bytes"] / 1e6, abs=0.05)
        copy = (doc["copy"]["gb_per_s_1_thread"], doc["copy"]["gb_per_s_2_threads"])
        floors = [r["cache_bytes"] / (c * 1e9) * 1e3 for c in copy]
        assert _pair(floor) == pytest.approx(floors, abs=0.05), f"{fmt}: floor"
        times = [r[f"tbq_{t}"]["best"] for t in (1, 2)]
        assert _pair(tbq) == pytest.approx(times, abs=0.05), f"{fmt}: tbq"
        assert _pair(x_floor) == pytest.approx([t / f for t, f in zip(times, floors, strict=True)], abs=0.05)
        g = [(r.get(f"ggml_{t}") or {}).get("best") for t in (1, 2)]
        assert (_pair(ggml) if ggml != "–" else [None, None]) == pytest.approx(g, abs=0.05), f"{fmt}: ggml"


def _expand(pattern: str) -> list[str]:
    """``a{b,c}d`` -> ``abd``, ``acd`` (any number of brace groups)."""
    parts = re.split(r"\{([^}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def test_the_results_index_names_every_results_file():
    readme = (RESULTS / "README.md").read_text(encoding="utf-8")
    patterns = [p.rstrip("/") for code in re.findall(r"`([^`]+)`", readme) for p in _expand(code)]
    entries = sorted(p.name for p in RESULTS.iterdir() if p.name != "README.md")
    missing = [e for e in entries if not any(fnmatch.fnmatchcase(e, p) for p in patterns)]
    assert not missing, f"benchmarks/results/README.md does not index {missing}"


@pytest.mark.parametrize("doc", ["docs/performance.md", "docs/robustness.md", "benchmarks/README.md"])
def test_every_results_path_the_docs_name_exists(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    names = {m.rstrip("/") for m in re.findall(r"results/([\w.{},*\-/]+)", text)}
    named = [n for n in names if n and not n.endswith(".") and not n.isupper()]  # FILE: a placeholder
    assert named, f"{doc} names no results file: the check would be empty"
    for n in named:
        for path in _expand(n):
            assert list(RESULTS.glob(path)), f"{doc} names benchmarks/results/{path}, which does not exist"
