"""numba's on-disk cache with tbq's locator (:mod:`tbq.numba_cache`): an edited helper in another module is
recompiled into the kernels that use it, where numba's own cache keeps running the old machine code.

Each scenario compiles a cached kernel that calls a helper from another module in a fresh process, edits the
helper, and runs the kernel again in another fresh process (the way an edit-test loop meets the cache).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tbq
from tbq import numba_cache

SRC = Path(tbq.__file__).resolve().parents[1]

_HELPER = """
from numba import njit

@njit(cache=True)
def value():
    return 1
"""

_USER = """
from numba import njit

from .helper import value

@njit(cache=True)
def kernel():
    return value() + 10
"""

#: The child: optionally registers the package with tbq's locator, runs the kernel, prints its result and
#: whether it came from the cache.
_CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "1":
    from tbq import numba_cache
    numba_cache.register(Path(sys.argv[1]) / "pkgx")
from pkgx.user import kernel
print(kernel(), kernel.stats.cache_hits.get(next(iter(kernel.signatures)), 0) if kernel.signatures else 0)
"""


def _run(code: str, *args: str, env_extra: dict[str, str] | None = None) -> list[int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return [int(w) for w in r.stdout.split()]


def _tree(tmp_path: Path) -> Path:
    pkg = tmp_path / "pkgx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text(textwrap.dedent(_HELPER))
    (pkg / "user.py").write_text(textwrap.dedent(_USER))
    return pkg


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize("registered", [True, False], ids=["tbq-locator", "plain-numba"])
def test_an_edited_helper_is_recompiled_into_its_callers(tmp_path, registered):
    """The kernel (``value() + 10``) is compiled and cached, then found in the cache by a second process (the
    locator keeps caching: an unchanged tree is a cache hit). After ``value`` is edited to return 2, a third
    process must give 12. numba's own locators give 11, the stale machine code, which is the hazard the
    locator exists for; this case shows the test tells the two apart."""
    pkg = _tree(tmp_path)
    flag = "1" if registered else "0"
    assert _run(_CHILD, str(tmp_path), flag) == [11, 0]  # compiled
    assert _run(_CHILD, str(tmp_path), flag) == [11, 1]  # from the cache
    _edit(pkg / "helper.py", "return 1", "return 2")
    if registered:
        assert _run(_CHILD, str(tmp_path), flag) == [12, 0]  # recompiled with the new helper
        assert _run(_CHILD, str(tmp_path), flag) == [12, 1]  # and cached again
    else:
        assert _run(_CHILD, str(tmp_path), flag) == [11, 1]  # numba's key: the caller's file only, stale


def test_the_user_cache_directory_is_keyed_too(tmp_path):
    """With ``NUMBA_CACHE_DIR`` (numba's first locator, which the tests' children use) the cache lives there and
    an edited helper is recompiled all the same."""
    pkg = _tree(tmp_path)
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    assert _run(_CHILD, str(tmp_path), "1", env_extra=env) == [11, 0]
    assert _run(_CHILD, str(tmp_path), "1", env_extra=env) == [11, 1]
    assert list((tmp_path / "cache").rglob("*.nbi")), "the cache is not in NUMBA_CACHE_DIR"
    assert not list(pkg.rglob("*.nbi"))
    _edit(pkg / "helper.py", "return 1", "return 2")
    assert _run(_CHILD, str(tmp_path), "1", env_extra=env) == [12, 0]


#: In a copy of the tbq package: a kernel in packing_kernels.py calling a helper appended to kernels.py.
_TBQ_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
import tbq.packing_kernels as pk
assert pk.__file__.startswith(sys.argv[1]), pk.__file__
k = pk.probe_kernel
print(k(), k.stats.cache_hits.get(next(iter(k.signatures)), 0))
"""


def test_tbq_kernels_are_recompiled_after_a_shared_helper_is_edited(tmp_path):
    """The same in a copy of tbq itself, which registers its package on import: a jitted function of
    ``packing_kernels.py`` calling a helper of ``kernels.py`` gives the edited helper's result."""
    copy = tmp_path / "tbq"
    shutil.copytree(SRC / "tbq", copy, ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    with (copy / "kernels.py").open("a") as f:
        f.write("\n\n@jit\ndef probe_helper():\n    return 1\n")
    with (copy / "packing_kernels.py").open("a") as f:
        f.write("\n\nfrom .kernels import probe_helper  # noqa: E402\n\n\n@jit\ndef probe_kernel():\n")
        f.write("    return probe_helper() + 10\n")
    assert _run(_TBQ_CHILD, str(tmp_path)) == [11, 0]
    assert _run(_TBQ_CHILD, str(tmp_path)) == [11, 1]
    _edit(copy / "kernels.py", "    return 1\n", "    return 2\n")
    assert _run(_TBQ_CHILD, str(tmp_path)) == [12, 0]


def test_every_kernel_module_is_keyed_by_the_shared_helpers():
    """Every cached function of tbq's kernel modules gets tbq's locator, and its stamp covers the shared
    helpers (kernels, intrinsics, packing_kernels) and the module itself."""
    import importlib
    import pkgutil

    from numba.core.dispatcher import Dispatcher

    import tbq.formats

    names = ["tbq.kernels", "tbq.packing_kernels", "tbq.attention_kernels"] + [
        f"tbq.formats.{m.name}" for m in pkgutil.iter_modules(tbq.formats.__path__) if m.name.endswith("_kernels")
    ]
    pkg = Path(tbq.__file__).resolve().parent
    shared = {pkg / "kernels.py", pkg / "intrinsics.py", pkg / "backend.py"}
    seen = 0
    for name in names:
        mod = importlib.import_module(name)
        deps = set(numba_cache.dependencies(mod.__file__))
        assert Path(mod.__file__).resolve() in deps and shared <= deps, (name, sorted(deps))
        for obj in vars(mod).values():
            if isinstance(obj, Dispatcher) and obj.__module__ == name and obj._cache.__class__.__name__ != "NullCache":
                locator = obj._cache._impl.locator
                assert isinstance(locator, numba_cache.DependencyLocator), (name, obj)
                assert locator.get_source_stamp()[1] == numba_cache.dependency_digest(mod.__file__)
                seen += 1
    assert seen > 40, seen  # the encoders, decoders and readers of every format
    assert pkg / "packing_kernels.py" in numba_cache.dependencies(pkg / "formats" / "tbq_kernels.py")


def test_dependencies_follow_every_import_form(tmp_path):
    """Relative imports of any level, ``from package import submodule``, absolute ``import pkg.mod`` and
    imports inside functions all count; modules outside the package do not."""
    pkg = tmp_path / "pkgy"
    (pkg / "sub").mkdir(parents=True)
    for rel in ("__init__.py", "a.py", "b.py", "c.py", "d.py", "sub/__init__.py", "sub/e.py", "sub/f.py"):
        (pkg / rel).write_text("")
    (pkg / "sub" / "__init__.py").write_text("X = 1\n")
    (pkg / "sub" / "e.py").write_text("import os\nfrom .. import a\nfrom ..b import thing\nfrom . import X\n")
    (pkg / "b.py").write_text("def f():\n    import pkgy.c\n")
    (pkg / "c.py").write_text("from pkgy.sub import f\n")
    numba_cache.register(pkg)
    got = {p.relative_to(pkg).as_posix() for p in numba_cache.dependencies(pkg / "sub" / "e.py")}
    assert got == {"sub/e.py", "a.py", "b.py", "c.py", "sub/__init__.py", "sub/f.py"}
