"""The built package: a wheel made from this tree, installed into a fresh virtual
environment, works without the source checkout.

Everything else in the suite imports tbq from the checkout (or an editable
install of it), so a file missing from the wheel (package data such as the
planar/iso tables, the shipped model, py.typed, an entry point) would pass every
other test. This one builds the wheel with ``python -m build`` (the ``build``
package is in the ``test`` extra), installs it with ``--no-deps --ignore-installed`` into a venv
that sees the site-packages of the interpreter running the tests (numpy, scipy, numba, torch:
not downloaded again) and runs the installed ``tbq`` from a directory outside the checkout,
checking that every ``tbq`` module it imports comes from the venv.

"The running interpreter's site-packages" is what ``site.getsitepackages()`` says: the base
interpreter's when the suite runs there (CI), the user's own venv's when it runs in one (the
README's quick start in a fresh ``python3 -m venv``). ``system_site_packages=True`` would give
the *base* interpreter's in both cases, which in a user's venv has none of tbq's dependencies.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "src" / "tbq" / "data" / "model"


def _have_build() -> bool:
    """Whether the ``build`` package is installed (not merely a ``build/`` directory on sys.path)."""
    try:
        return importlib.util.find_spec("build.__main__") is not None
    except ImportError:
        return False


pytestmark = pytest.mark.skipif(
    not _have_build(),
    reason="the 'build' package is not installed (it is in the test extra: pip install '.[test]')",
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, tbq script, working directory) of a fresh venv holding only the wheel built from this tree."""
    tmp = tmp_path_factory.mktemp("package")
    dist = tmp / "dist"
    # Build from a clean copy of what the wheel is made of: a checkout's src/tbq.egg-info (left by
    # `pip install -e .`) lists every file once installed, and setuptools would add them all to
    # the wheel again whatever pyproject's package-data says.
    src = tmp / "src"
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "*.py[cod]"))
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, src / name)
    # The isolated build environment needs setuptools from the index (pip's cache when warm).
    r = subprocess.run(  # from tmp: a checkout's build/ directory must not shadow the build package
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)],
        cwd=tmp,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, f"python -m build failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    wheels = sorted(dist.glob("tbq-*.whl"))
    assert len(wheels) == 1, wheels
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    _see_running_site_packages(python)
    r = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            # CI's `pip install .` leaves this very version in the base interpreter's site-packages,
            # which the venv sees: without this pip reports it satisfied and installs nothing.
            "--ignore-installed",
            "--disable-pip-version-check",
            "-q",
            str(wheels[0]),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    work = tmp / "elsewhere"  # not the checkout: nothing can be imported from ./src by accident
    work.mkdir()
    return python, env_dir / "bin" / "tbq", work


def _see_running_site_packages(python: Path) -> None:
    """Put this interpreter's site-packages on the venv's ``sys.path``, after the venv's own.

    Plain path lines of a ``.pth`` file are appended as they are; the ``.pth`` files inside those folders are
    not run, so an editable install of this checkout there (its import hook) cannot shadow the wheel.
    """
    r = subprocess.run(
        [str(python), "-c", "import site, sys; print(site.getsitepackages()[0])"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    outer = [p for p in site.getsitepackages() if Path(p).is_dir()]
    assert outer, site.getsitepackages()
    (Path(r.stdout.strip()) / "_tbq_test_outer_site.pth").write_text("".join(f"{p}\n" for p in outer))


def _env():
    """This environment without PYTHONPATH (which may point at a checkout's src/)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_installed_wheel_runs_tbq_compare(installed):
    python, tbq_script, work = installed
    r = subprocess.run(
        [str(tbq_script), "compare", "--formats", "q8_0"], cwd=work, capture_output=True, text=True, env=_env()
    )
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.split()[1:2] == ["q8_0"]]
    assert rows, r.stdout  # one row per data set, all of format q8_0
    assert "Traceback" not in r.stderr


def test_installed_wheel_holds_the_package_data(installed):
    python, _, work = installed
    want = {name: hashlib.sha256((MODEL_DIR / name).read_bytes()).hexdigest() for name in sorted(os.listdir(MODEL_DIR))}
    script = """
import hashlib, importlib.metadata, json, sys
from importlib import resources
import tbq, tbq.numcodecs, tbq.codebooks, tbq.formats.planar_iso
from tbq.hf import shipped

files = {name: hashlib.sha256((shipped.MODEL_DIR / name).read_bytes()).hexdigest() for name in shipped.FILES}
dist = importlib.metadata.distribution("tbq")
print(json.dumps({
    "modules": sorted({m.__file__ for n, m in list(sys.modules.items()) if n.split(".")[0] == "tbq" and getattr(m, "__file__", None)}),
    "model_dir": str(shipped.MODEL_DIR),
    "files": files,
    "version": tbq.__version__,
    "metadata_version": dist.version,
    "licence": [str(f) for f in dist.files if f.name == "LICENSE"],
    "py_typed": resources.files("tbq").joinpath("py.typed").is_file(),
    "codec": tbq.numcodecs.Q8_0Numcodec().codec_id,
    "tables": sorted(tbq.codebooks.tables()),
    "planar_roundtrip": tbq.dequantize(tbq.quantize([[0.5] * 128], "planar3_0"), "planar3_0").shape,
}))
"""
    r = subprocess.run([str(python), "-c", script], cwd=work, capture_output=True, text=True, env=_env())
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    venv_dir = str(python.parent.parent)
    assert got["modules"] and all(m.startswith(venv_dir) for m in got["modules"]), got["modules"][:3]
    assert got["model_dir"].startswith(venv_dir)
    assert got["files"] == {name: want[name] for name in got["files"]} and set(got["files"]) <= set(want)
    assert got["version"] == got["metadata_version"]
    assert got["licence"] and got["py_typed"]
    assert got["codec"] == "tbq.q8_0"
    want_tables = sorted(json.loads((ROOT / "src" / "tbq" / "data" / "tables.json").read_text()))
    assert got["tables"] == want_tables
    assert got["planar_roundtrip"] == [1, 128]


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None,
    reason="the hf extra (torch, transformers) is not installed",
)
def test_installed_wheel_loads_the_shipped_model(installed):
    python, _, work = installed
    script = """
import json, torch
from tbq import hf
from tbq.hf import shipped
model, tok = hf.load()
ids = tok(shipped.heldout_text()[:200])["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits
print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "shape": list(logits.shape),
                  "finite": bool(torch.isfinite(logits).all())}))
"""
    r = subprocess.run([str(python), "-c", script], cwd=work, capture_output=True, text=True, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["params"] == 2_262_720  # docs/model.md: the shipped model's parameter count
    assert got["shape"][0] == 1 and got["shape"][2] == 1024 and got["finite"]
