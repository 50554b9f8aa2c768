"""The study notebooks: the .ipynb files match their jupytext .py sources, carry no
outputs, keep measured numbers out of the prose, and run (small sizes) producing
their figures. The figures linked from docs/study.md exist in docs/figures/."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"

#: figures each notebook saves (through tbq.plots into $TBQ_FIGURE_DIR)
FIGURES = {
    "formats": ["formats_rate_distortion.png", "formats_attention.png"],
    "rotation": [
        "rotation_block.png",
        "rotation_channels.png",
        "rotation_error.png",
        "rotation_planar_iso.png",
        "rotation_nmse.png",
    ],
    "keys_vs_values": ["kv_context.png", "kv_key_axis.png", "kv_bits.png", "kv_sinks.png"],
    "codebooks": ["codebooks_tables.png", "codebooks_indices.png", "codebooks_shipped.png", "codebooks_ratios.png"],
    "real_model": ["real_kl.png", "real_key_channels.png", "real_layers.png"],
    "turboquant": ["turbo_rate_distortion.png", "turbo_attention.png", "turbo_model.png", "turbo_quirks.png"],
}
NAMES = list(FIGURES)


def _run_all():
    spec = importlib.util.spec_from_file_location("tbq_notebooks_run_all", NB_DIR / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_notebook_list_is_complete():
    assert tuple(NAMES) == _run_all().NOTEBOOKS
    assert sorted(p.stem for p in NB_DIR.glob("*.ipynb")) == sorted(NAMES)
    assert sorted(p.stem for p in NB_DIR.glob("*.py") if p.stem != "run_all") == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_ipynb_matches_py_and_has_no_outputs(name):
    pytest.importorskip("jupytext")
    nbformat = pytest.importorskip("nbformat")
    from_py = _run_all().read_source(name)
    committed = nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4)
    nbformat.validate(committed)
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in from_py.cells], (
        f"notebooks/{name}.ipynb is out of date: run `python notebooks/run_all.py --sync`"
    )
    for c in committed.cells:
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None, (
                f"{name}.ipynb has outputs: strip them (run_all.py --sync)"
            )
    assert committed.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent"


# A measured number in prose would be a decimal, a percentage or a "3.2x"-style ratio.
NUMBER = re.compile(r"\d+\.\d+|\d+\s*%|\b\d+(\.\d+)?\s*[x×]\b|\b\d+e-?\d+\b")


@pytest.mark.parametrize("name", NAMES)
def test_prose_has_no_hard_coded_measurements(name):
    text = (NB_DIR / f"{name}.py").read_text(encoding="utf-8")
    cells = re.split(r"^# %%", text, flags=re.M)
    md = [c for c in cells if c.startswith(" [markdown]")]
    assert md, "every notebook explains itself in markdown cells"
    for cell in md:
        hits = NUMBER.findall(cell)
        assert not NUMBER.search(cell), f"{name}: markdown cell states a number ({hits}); print it from a code cell"


def test_number_pattern_catches_measurements():
    for bad in ("NMSE 0.0095", "about 12%", "7.3x wider", "3x less", "1e-3"):
        assert NUMBER.search(bad), bad
    for ok in ("4 bits", "channels 5, 37, 64 and 111", "`4^-b`", "(√3·π/2)·4^-b", "tbq4_0", "q8_0"):
        assert not NUMBER.search(ok), ok


@pytest.mark.parametrize("name", NAMES)
def test_notebook_executes_small_and_saves_its_figures(name, tmp_path):
    for mod in ("jupytext", "nbclient", "nbformat", "ipykernel", "matplotlib"):
        pytest.importorskip(mod)
    nb = _run_all().execute(name, small=True, figure_dir=tmp_path, timeout=300)
    for fig in FIGURES[name]:
        p = tmp_path / fig
        assert p.is_file() and p.read_bytes()[:4] == b"\x89PNG", f"{name} did not save {fig}"
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert len(printed) > 500  # the findings are printed from code


def test_docs_link_existing_figures():
    doc = (ROOT / "docs" / "study.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\(figures/([\w.-]+\.png)\)", doc))
    assert linked >= {f for figs in FIGURES.values() for f in figs}
    for f in linked:
        p = ROOT / "docs" / "figures" / f
        assert p.is_file() and p.read_bytes()[:4] == b"\x89PNG", f"docs/figures/{f} is missing"
