"""Sync and execute the study notebooks.

The ``.py`` files (jupytext percent format) are the sources; the ``.ipynb``
files are generated from them with outputs stripped, so that they can be
opened in Jupyter and diffed in git.

    python notebooks/run_all.py            # full size: figures -> docs/figures/, executed copies -> notebooks/_executed/
    python notebooks/run_all.py --small    # small sizes (TBQ_NOTEBOOK_SMALL=1), figures -> notebooks/_executed/figures/
    python notebooks/run_all.py --sync     # only rewrite the .ipynb files from the .py files
    python notebooks/run_all.py formats    # a subset, by name

Execution uses nbclient with the ``python3`` kernel, working directory
``notebooks/``. Needs the ``notebooks`` extra (jupytext, nbclient, nbformat,
ipykernel, matplotlib).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NOTEBOOKS = ("formats", "rotation", "keys_vs_values", "codebooks", "real_model", "turboquant")


def read_source(name: str):
    """The notebook built from ``name.py`` (no outputs), with deterministic cell ids ``<name>-<index>``."""
    import jupytext

    nb = jupytext.read(HERE / f"{name}.py")
    for i, cell in enumerate(nb.cells):
        cell.id = f"{name}-{i}"
    return nb


def sync(name: str) -> Path:
    """Write ``name.ipynb`` from ``name.py`` (outputs stripped); returns the path."""
    import jupytext

    path = HERE / f"{name}.ipynb"
    jupytext.write(read_source(name), path)
    return path


def execute(name: str, *, small: bool, figure_dir: Path, out_dir: Path | None = None, timeout: int = 900):
    """Execute the notebook of ``name.py`` and return the executed notebook (saved to ``out_dir`` if given)."""
    import nbformat
    from nbclient import NotebookClient

    nb = read_source(name)
    env_keys = ("TBQ_NOTEBOOK_SMALL", "TBQ_FIGURE_DIR", "MPLBACKEND")
    saved = {k: os.environ.get(k) for k in env_keys}
    os.environ["TBQ_NOTEBOOK_SMALL"] = "1" if small else "0"
    os.environ["TBQ_FIGURE_DIR"] = str(Path(figure_dir).resolve())
    os.environ["MPLBACKEND"] = "Agg"
    try:
        NotebookClient(
            nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
        ).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out_dir / f"{name}.ipynb")
    return nb


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help=f"notebooks to run (default: all of {', '.join(NOTEBOOKS)})")
    p.add_argument("--small", action="store_true", help="small sizes, as in the test suite")
    p.add_argument("--sync", action="store_true", help="only regenerate the .ipynb files from the .py files")
    args = p.parse_args(argv)
    names = args.names or list(NOTEBOOKS)
    unknown = [n for n in names if n not in NOTEBOOKS]
    if unknown:
        p.error(f"unknown notebooks {unknown}; choose from {NOTEBOOKS}")
    for n in names:
        print(f"synced {sync(n).relative_to(ROOT)}")
    if args.sync:
        return 0
    out_dir = HERE / "_executed"
    figure_dir = out_dir / "figures" if args.small else ROOT / "docs" / "figures"
    for n in names:
        t0 = time.perf_counter()
        execute(n, small=args.small, figure_dir=figure_dir, out_dir=out_dir)
        print(f"executed {n} in {time.perf_counter() - t0:.1f} s -> {(out_dir / (n + '.ipynb')).relative_to(ROOT)}")
    print(f"figures in {figure_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
