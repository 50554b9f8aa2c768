"""docs/architecture.md's rules, checked: imports run one way (down the layers) and never in a cycle.

Every import counts, including those inside functions: a function-level import
that goes up a layer is the kind of hidden cycle these rules exist to prevent.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tbq"

#: The layers of docs/architecture.md, bottom first. A module may import from its own layer or below.
LAYERS = [
    {"errors", "backend", "half", "progress", "units", "parallel"},
    {"packing", "reference", "kernels", "packing_kernels"},
    {"rotation", "codebooks"},
    {"formats"},
    {"codecs"},
    {"golden", "attention", "attention_kernels", "metrics", "study", "budget", "numcodecs", "dask", "testing", "compare", "synthetic", "plots", "check", "hf"},
    {"cli", "__main__"},
]
TOP = {"tbq"}  # the package __init__: the public API, may import any layer below cli


def _top(modname: str) -> str:
    """'tbq.formats.q8_0' -> 'formats'; 'tbq' -> 'tbq'."""
    parts = modname.split(".")
    return parts[1] if len(parts) > 1 else "tbq"


def _layer(top: str) -> int:
    if top in TOP:
        return len(LAYERS) - 1
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"module tbq.{top} is in no layer of docs/architecture.md; add it to the picture and to LAYERS")


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _imports(modname: str, path: Path):
    """Absolute names of the tbq modules ``modname`` imports anywhere in its body."""
    tree = ast.parse(path.read_text())
    pkg = modname if path.name == "__init__.py" else modname.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "tbq" or a.name.startswith("tbq."):
                    yield a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod == "tbq" or mod.startswith("tbq."):
                if mod == "tbq":  # from tbq import x: x may be a module
                    for a in node.names:
                        yield f"tbq.{a.name}"
                else:
                    yield mod


def test_every_module_is_in_a_layer():
    for modname, _ in _modules():
        _layer(_top(modname))


def test_imports_run_down_the_layers():
    bad = []
    for modname, path in _modules():
        own = _layer(_top(modname))
        for target in _imports(modname, path):
            t = _top(target)
            if t in TOP or t == "__version__":
                continue  # `from .. import __version__`
            if _layer(t) > own:
                bad.append(f"{modname} (layer {own}) imports {target} (layer {_layer(t)})")
    assert not bad, "\n".join(bad)


def _strongly_connected(graph: dict) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (name -> set of names)."""
    index, low, on, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    """No two modules import each other, directly or through others (function-level imports included).

    The one tolerated shape is Python's package pattern: a package's __init__
    importing its submodules while they import a sibling through it; every
    such component lies inside one package and contains that package itself.
    """
    graph = {m: {t for t in _imports(m, p) if t != m} for m, p in _modules()}
    bad = []
    for comp in _strongly_connected(graph):
        if len(comp) < 2:
            continue
        pkg = min(comp, key=len)
        if all(c == pkg or c.startswith(pkg + ".") for c in comp) and (SRC.parent / pkg.replace(".", "/") / "__init__.py").exists():
            continue
        bad.append(" <-> ".join(comp))
    assert not bad, "import cycles: " + "; ".join(bad)


@pytest.mark.parametrize("name", ["formats", "codecs"])
def test_no_format_names_outside_the_format_modules(name):
    """Sanity anchor for the recipe: codecs.py and the formats package base never branch on a format's name."""
    target = SRC / ("formats/base.py" if name == "formats" else "codecs.py")
    text = target.read_text()
    for fmt in ("q8_0", "q4_0", "tbq4_0", "tbq3_0"):
        assert f'== "{fmt}"' not in text and f"== '{fmt}'" not in text, (target, fmt)
