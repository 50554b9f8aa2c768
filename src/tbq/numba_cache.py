"""numba's on-disk cache, keyed by every tbq module a kernel can depend on, not only its own file.

numba (``cache=True``) stores a compiled function's machine code beside its
source (``__pycache__``, or under ``NUMBA_CACHE_DIR``) and reuses it for as
long as the function's *own* file is unchanged. But a tbq kernel's machine
code also holds code and values from other modules: the helpers it calls
(:mod:`tbq.kernels`, :mod:`tbq.intrinsics`, :mod:`tbq.packing_kernels`,
inlined or linked in), and the module globals numba freezes as constants
(``TARGET_AVX2``, the status codes, a format's tables). With numba's own key,
an edit to one of those leaves every dependent kernel's stale machine code in
use, silently, until the cache files are deleted.

Importing this module (:mod:`tbq.kernels` does, before any kernel is defined)
puts :class:`DependencyLocator` first in numba's list of cache locators. For
a function defined in a file of the tbq package it keeps numba's own choice
of where the cache lives and of the function's key, and adds to the cache's
freshness stamp the SHA-256 of the text of every tbq module the function's
module imports, directly or through others (read from their ``import``
statements, top level and inside functions alike, so the set is the same in
every process). An edit to any of them, a helper or a table, makes the next
process recompile the dependent kernels; an unchanged tree reuses the cache as
before. Functions outside the package are left to numba's locators.

The stamp is computed once per source file and process (an edit takes effect
in the next process, as an edited module does). ``NUMBA_CACHE_LOCATOR_CLASSES``,
when set, replaces numba's list and with it this locator: then clear the cache
after editing a helper (``find src -name '*.nbi' -delete; find src -name
'*.nbc' -delete``).
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path
from typing import Any

from numba.core import caching

#: The tbq package's directory: its files' functions are cached by :class:`DependencyLocator`.
ROOT = Path(__file__).resolve().parent

#: The package directories whose functions :class:`DependencyLocator` keys (:func:`register`).
_ROOTS: list[Path] = []


def _module_file(root: Path, parts: list[str]) -> Path | None:
    """The file of module ``parts`` (dotted name below the package ``root``; ``[]`` is the package), if any."""
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py") if parts else None, base / "__init__.py"):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


@functools.cache
def _read(path: Path) -> tuple[str, tuple[Path, ...]]:
    """(SHA-256 of the file's bytes, the package files its ``import`` statements name) of a file below a root."""
    root = next(r for r in _ROOTS if path.is_relative_to(r))
    text = path.read_bytes()
    rel = path.relative_to(root).with_suffix("").parts
    package = list(rel[:-1])  # the module's package (an __init__'s is its own directory)
    found: set[Path] = set()

    def add(parts: list[str], names: list[str]) -> None:
        for name in names:  # ``from pkg import submodule``: the submodule's file, else the package's own
            sub = _module_file(root, [*parts, name]) if name != "*" else None
            if sub is not None:
                found.add(sub)
            else:
                own = _module_file(root, parts)
                if own is not None:
                    found.add(own)

    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package[: len(package) - (node.level - 1)]
            elif node.module and node.module.split(".")[0] == root.name:
                parts = []
            else:
                continue
            module = node.module.split(".") if node.module else []
            if not node.level:
                module = module[1:]  # below the package: "tbq.kernels" -> ["kernels"]
            add([*parts, *module], [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            for a in node.names:
                dotted = a.name.split(".")
                if dotted[0] == root.name:
                    target = _module_file(root, dotted[1:])
                    if target is not None:
                        found.add(target)
    return hashlib.sha256(text).hexdigest(), tuple(sorted(found))


def dependencies(path: str | Path) -> list[Path]:
    """The package files the module at ``path`` imports, directly or through others, itself included, sorted.

    ``path`` is a file below a registered package directory (:data:`ROOT`, or one given to :func:`register`).
    """
    start = Path(path).resolve()
    seen = {start}
    todo = [start]
    while todo:
        for dep in _read(todo.pop())[1]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return sorted(seen)


@functools.cache
def dependency_digest(path: str | Path) -> str:
    """SHA-256 over the names and texts of :func:`dependencies` of ``path``: what the cache stamp adds."""
    start = Path(path).resolve()
    root = next(r for r in _ROOTS if start.is_relative_to(r))
    h = hashlib.sha256()
    for dep in dependencies(start):
        h.update(f"{dep.relative_to(root).as_posix()}\0{_read(dep)[0]}\n".encode())
    return h.hexdigest()


class DependencyLocator(caching._CacheLocator):
    """numba's own locator for a function of a registered package, with :func:`dependency_digest` in its stamp.

    Where the cache lives and how entries are named are numba's (the first of its locators that accepts the
    function: ``NUMBA_CACHE_DIR``, ``__pycache__``, the user-wide directory); only the stamp an index is
    valid for differs, so an index written before an edit of any dependency is treated as empty.
    """

    def __init__(self, inner: Any, py_file: str) -> None:
        self._inner = inner
        self._py_file = py_file

    def ensure_cache_path(self) -> None:
        self._inner.ensure_cache_path()

    def get_cache_path(self) -> str:
        return str(self._inner.get_cache_path())

    def get_disambiguator(self) -> str:
        return str(self._inner.get_disambiguator())

    def get_source_stamp(self) -> Any:
        return (self._inner.get_source_stamp(), dependency_digest(self._py_file))

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> DependencyLocator | None:
        try:
            path = Path(py_file).resolve()
        except (OSError, RuntimeError):
            return None
        if not path.is_file() or not any(path.is_relative_to(r) for r in _ROOTS):
            return None
        numbas: list[Any] = caching.CacheImpl._locator_classes
        for other in numbas:  # numba's own, in its order
            if other is cls:
                continue
            inner = other.from_function(py_func, py_file)
            if inner is not None:
                return cls(inner, py_file)
        return None


def register(root: str | Path) -> None:
    """Key the cache of every function defined below package directory ``root`` by its module's dependencies.

    tbq registers its own package (:data:`ROOT`) on import; a package that compiles kernels with tbq's
    helpers can register its own directory the same way. Idempotent.
    """
    path = Path(root).resolve()
    if path not in _ROOTS:
        _ROOTS.append(path)
    locators = caching.CacheImpl._locator_classes  # shared by every numba cache implementation (jit, cfunc)
    if DependencyLocator not in locators:
        locators.insert(0, DependencyLocator)


register(ROOT)
