"""docs/architecture.md's rules, checked: imports run one way (down the layers) and never in a cycle.

Every import counts, including those inside functions: a function-level import
that goes up a layer is the kind of hidden cycle these rules exist to prevent.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tbq"

#: The layers of docs/architecture.md, bottom first. A module may import from its own layer or below.
LAYERS = [
    {"errors", "backend", "half", "progress", "units", "parallel", "numba_cache"},
    {"packing", "reference", "float32", "kernels", "intrinsics", "packing_kernels"},
    {"rotation", "codebooks"},
    {"formats"},
    {"codecs"},
    {
        "golden",
        "attention",
        "attention_kernels",
        "metrics",
        "study",
        "budget",
        "numcodecs",
        "dask",
        "testing",
        "compare",
        "warmup",  # the multi-process numba warm-up scheduler of tbq compare
        "synthetic",
        "plots",
        "check",
        "hf",
        "vllm_slots",  # vLLM's TurboQuant slots: the presets' formats through the codecs
    },
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
    raise AssertionError(
        f"module tbq.{top} is in no layer of docs/architecture.md; add it to the picture and to LAYERS"
    )


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
        if (
            all(c == pkg or c.startswith(pkg + ".") for c in comp)
            and (SRC.parent / pkg.replace(".", "/") / "__init__.py").exists()
        ):
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


# ---------------------------------------------------------------------------
# formats are reached through their declarations, never by name or type
# ---------------------------------------------------------------------------

#: Where a format name is part of stable data outside formats/ (docs/architecture.md lists them).
FORMAT_NAME_EXCEPTIONS = {
    "golden/cheader.py": "the attention header's SINK_IS_F16 define, a flag C consumers of the golden headers read",
    "golden/manifest.py": "the manifest's edge_tables keys (tbq4_0_codebook, tbq3_0_codebook): stable golden data",
    "hf/engine.py": "llama.cpp's own per-type behaviour (the fork's row rule and defects, q8_0's SIMD writer, the community "
    "fork's turbo types and silent type changes), "
    "keyed by the names users pass to -ctk/-ctv: what one engine does with a type, not a property of the format",
}


def _format_names():
    import tbq

    return set(tbq.format_names())


def _format_class_names():
    from tbq.formats import FORMAT_CLASSES

    return {c.__name__ for c in FORMAT_CLASSES.values()}


def test_no_format_name_or_type_test_outside_the_formats_package():
    """Outside src/tbq/formats/: no comparison with a format's name (``== "q8_0"``, ``in ("f16", ...)``, a dict keyed by
    format names, ``.startswith("tbq")``) and no ``type(x) is <a Format class>``. Field kinds compared as kinds
    (``f.kind == "f16"``) are not format names."""
    names, classes = _format_names(), _format_class_names()
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("formats/") or rel in FORMAT_NAME_EXCEPTIONS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{rel}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Compare):
                sides = [node.left] + node.comparators
                if any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides):
                    continue  # a field kind
                consts = []
                for c in sides:
                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                        consts.append(c.value)
                    elif isinstance(c, (ast.Tuple, ast.List, ast.Set)):
                        consts += [e.value for e in c.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if any(v in names for v in consts):
                    bad.append(f"{where}: compares with a format name: {ast.unparse(node)}")
                if isinstance(node.left, ast.Call) and getattr(node.left.func, "id", "") == "type":
                    for c in node.comparators:
                        n = c.id if isinstance(c, ast.Name) else c.attr if isinstance(c, ast.Attribute) else ""
                        if n in classes or n.endswith("Format"):
                            bad.append(f"{where}: tests a format's type: {ast.unparse(node)}")
            elif isinstance(node, ast.Dict):
                if any(isinstance(k, ast.Constant) and k.value in names for k in node.keys):
                    bad.append(f"{where}: a dict keyed by format names: {ast.unparse(node)[:80]}")
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "startswith" and node.args:
                a = node.args[0]
                if (
                    isinstance(a, ast.Constant)
                    and isinstance(a.value, str)
                    and len(a.value) >= 2
                    and any(n.startswith(a.value) for n in names)
                ):
                    bad.append(f"{where}: a format-name prefix test: {ast.unparse(node)}")
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------
# private names stay in their package
# ---------------------------------------------------------------------------

#: (importer, source, name) still imported across modules, and who removes them.
PRIVATE_IMPORT_EXCEPTIONS = {
    ("tbq.cli.budget", "tbq.budget", "_BITS"): "left for the merge with issue 21, which rewrites the budget output",
    ("tbq.cli.budget", "tbq.budget", "_count"): "issue 21 merge (budget output)",
    ("tbq.cli.budget", "tbq.budget", "_out"): "issue 21 merge (budget output)",
    ("tbq.cli.budget", "tbq.budget", "_parse_formats"): "issue 21 merge (budget output)",
}


def _subpackage(modname: str):
    """'tbq.golden.generate' -> 'golden'; a top-level module ('tbq.codecs') has none."""
    parts = modname.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (SRC / parts[1]).is_dir()) else None


def test_no_private_name_imported_across_modules():
    """``from X import _name`` only inside one subpackage (tbq/golden/ from tbq/golden/, ...): everything else goes
    through public names, so a module's private helpers can change without breaking another."""
    found = set()
    for modname, path in _modules():
        pkg = modname if path.name == "__init__.py" else modname.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            if not (src == "tbq" or src.startswith("tbq.")):
                continue
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    sub = _subpackage(modname)
                    if sub is None or sub != _subpackage(src):
                        found.add((modname, src, a.name))
    new = sorted(found - set(PRIVATE_IMPORT_EXCEPTIONS))
    assert not new, "private names imported across modules:\n" + "\n".join(
        f"{m} imports {n} from {s}" for m, s, n in new
    )
    stale = sorted(set(PRIVATE_IMPORT_EXCEPTIONS) - found)
    assert not stale, f"fixed: drop these from PRIVATE_IMPORT_EXCEPTIONS: {stale}"


def test_strategies_are_a_package_of_small_modules():
    """testing/strategies/ is split by concern, no module over 400 lines."""
    pkg = SRC / "testing" / "strategies"
    assert (pkg / "__init__.py").exists() and not (SRC / "testing" / "strategies.py").exists()
    for path in pkg.glob("*.py"):
        assert len(path.read_text().splitlines()) < 400, path


# ---------------------------------------------------------------------------
# inside the features layer: tiers
# ---------------------------------------------------------------------------

#: The tiers of the features layer of docs/architecture.md, bottom first. A feature imports only features of lower
#: tiers (and modules of its own package); every tier may use the codecs and the layers below. One module a line.
FEATURE_TIERS = [
    {  # building blocks: each stands on the codecs and the layers below alone
        "attention_kernels",
        "dask",
        "metrics",
        "numcodecs",
        "synthetic",
        "testing",
        "vllm_slots",
    },
    {  # computations over the building blocks
        "attention",
        "plots",
        "study",
    },
    {  # tools: golden sets, the warm-up of the kernels, the KV budget, models in transformers
        "budget",
        "golden",
        "hf",
        "warmup",
    },
    {  # the tools that drive other tools: the kernel checker (golden's families, the strategies), tbq compare
        "check",
        "compare",
    },
]

#: The inner picture of each package of docs/architecture.md, bottom first ("__init__" is the package's own module).
#: A module of the package imports modules of its package from its own tier or below (cycles: test_no_import_cycle).
PACKAGE_TIERS = {
    "hf": [
        {  # model files, and what an engine does to K, V and Q around its cache
            "__init__",  # lazy public names and ENGINES: it imports no module of the package at import time
            "engine",
            "loader",
            "shipped",
            "transforms",  # the engine's float32 transforms (channel order, rotation, SIMD q8_0)
            "stats",  # llama-perplexity's statistics
        },
        {  # the cache inside transformers
            "attention",
            "cache",
            "capture",
            "store",  # a layer's stored rows
        },
        {  # measuring a cache type
            "evaluation",
            "generation",  # greedy agreement on the user's prompts (evaluate runs it)
            "plot",
        },
        {  # the shipped model's making, and the comparisons with llama.cpp's own programs
            "arch_compare",
            "gguf_export",
            "train",
            "turbo_compare",
        },
    ],
    "check": [
        {  # what a target is, how a block is judged, the inputs a check draws
            "attention_cases",  # the fused-attention check's inputs (arithmetic, settings, cases)
            "attention_reference",  # its float64 reference over the stored bytes and its derived bound
            "classify",
            "dot_reference",  # the dot-product check's reference, its pairing of formats and its bound
            "dot_targets",  # the dot-product kernels a check runs (a library's vec_dot, a function)
            "inputs",
            "sharedlib",
            "targets",
        },
        {  # what a check is asked, what it found and how it says it
            "attention_repro",  # the fused-attention check's counterexample and reproducers
            "counterexample",  # a conversion check's counterexample, its text and its C reproducer
            "diagnose",
            "report",
            "settings",  # one frozen settings object of a check
        },
        {  # the checks: conversions (runner), dot products, fused attention (and a ggml build's)
            "attention",
            "attention_targets",  # the attention kernels a check runs (a function, a program)
            "dot",
            "directions",  # a conversion check's directions (quantize, dequantize, round trip)
            "fuzz",  # the hypothesis phase of a check
            "ggml_graph",
            "runner",
        },
        {"__init__"},  # the public API: check_kernel, check_library, check_program, check_target
    ],
    "golden": [
        {"families", "fragility"},  # the input rows and the fragility masks
        {"cheader", "manifest", "settings"},  # the files beside the arrays; what a set is asked (GoldenSettings)
        {"generate"},  # building, writing, regenerating, verifying a set
        {"__init__"},
    ],
    "budget": [
        {"bits"},
        {"arithmetic"},
        {"report"},
        {"__init__"},
    ],
}


def _features() -> set[str]:
    return LAYERS[_layer("golden")]


def _tier(top: str) -> int:
    for i, tier in enumerate(FEATURE_TIERS):
        if top in tier:
            return i
    raise AssertionError(
        f"feature tbq.{top} is in no tier of the features layer of docs/architecture.md; "
        "add it to the picture and to FEATURE_TIERS"
    )


def _imports_resolved(modname: str, path: Path):
    """Like :func:`_imports`, but ``from . import x`` and ``from tbq.pkg import x`` name the submodule x when there
    is one (the package's own module otherwise)."""
    yield from _imports(modname, path)
    pkg = modname if path.name == "__init__.py" else modname.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                mod = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = SRC.parent / (mod.replace(".", "/") + "/" + a.name)
                if mod.startswith("tbq.") and (sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()):
                    yield f"{mod}.{a.name}"


def _feature_tier_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports of ``graph`` (module -> imported modules) from one feature to another of its own tier or above."""
    bad = []
    for modname, targets in sorted(graph.items()):
        own = _top(modname)
        if own not in _features():
            continue
        for target in sorted(targets):
            t = _top(target)
            if t != own and t in _features() and _tier(t) >= _tier(own):
                bad.append(f"{modname} (tier {_tier(own) + 1}) imports {target} (tier {_tier(t) + 1})")
    return bad


def _package_tier(pkg: str, modname: str) -> int:
    name = modname.split(".")[2] if modname.count(".") >= 2 else "__init__"
    for i, tier in enumerate(PACKAGE_TIERS[pkg]):
        if name in tier:
            return i
    raise AssertionError(
        f"module {modname} is in no tier of the picture of tbq/{pkg}/ in docs/architecture.md; "
        f'add it to the picture and to PACKAGE_TIERS["{pkg}"]'
    )


def _package_tier_violations(pkg: str, graph: dict[str, set[str]]) -> list[str]:
    """Imports inside tbq/<pkg>/ from a module to one of a higher tier of the package's picture."""
    inside = f"tbq.{pkg}"
    bad = []
    for modname, targets in sorted(graph.items()):
        if not (modname == inside or modname.startswith(inside + ".")):
            continue
        own = _package_tier(pkg, modname)
        for target in sorted(targets):
            inner = target != modname and (target == inside or target.startswith(inside + "."))
            if inner and _package_tier(pkg, target) > own:
                bad.append(f"{modname} (tier {own + 1}) imports {target} (tier {_package_tier(pkg, target) + 1})")
    return bad


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Module -> the tbq modules it imports (submodules resolved); built once per test session (read-only)."""
    return {m: set(_imports_resolved(m, p)) for m, p in _modules()}


def test_every_feature_is_in_a_tier():
    for modname, _ in _modules():
        if _top(modname) in _features():
            _tier(_top(modname))
    listed = set().union(*FEATURE_TIERS)
    assert listed == _features(), (
        f"FEATURE_TIERS and the features layer of LAYERS differ: only in the tiers {sorted(listed - _features())}, "
        f"only in LAYERS {sorted(_features() - listed)}"
    )
    assert sum(len(t) for t in FEATURE_TIERS) == len(listed), "a feature is in two tiers"


def test_features_import_only_lower_tiers():
    bad = _feature_tier_violations(_graph())
    assert not bad, "\n".join(bad)


def test_the_tier_rule_catches_what_it_is_for():
    """An upward or sideways import between features is reported; one inside a package, or down, is not."""
    assert _feature_tier_violations({"tbq.golden.generate": {"tbq.check.runner"}}) == [
        "tbq.golden.generate (tier 3) imports tbq.check.runner (tier 4)"
    ]
    assert _feature_tier_violations({"tbq.study": {"tbq.plots"}}) == ["tbq.study (tier 2) imports tbq.plots (tier 2)"]
    assert _feature_tier_violations({"tbq.check.runner": {"tbq.check.report", "tbq.golden", "tbq.codecs"}}) == []
    with pytest.raises(AssertionError, match="add it to the picture and to FEATURE_TIERS"):
        _tier("a_new_feature")
    assert _package_tier_violations("hf", {"tbq.hf.engine": {"tbq.hf.evaluation", "tbq.codecs"}}) == [
        "tbq.hf.engine (tier 1) imports tbq.hf.evaluation (tier 3)"
    ]
    with pytest.raises(AssertionError, match=r'PACKAGE_TIERS\["hf"\]'):
        _package_tier("hf", "tbq.hf.a_new_module")


@pytest.mark.parametrize("pkg", sorted(PACKAGE_TIERS))
def test_packages_import_down_their_pictures(pkg):
    """Every module of the package is in its picture, and imports its package's modules of its own tier or below."""
    graph = _graph()
    for modname in graph:
        if modname == f"tbq.{pkg}" or modname.startswith(f"tbq.{pkg}."):
            _package_tier(pkg, modname)
    bad = _package_tier_violations(pkg, graph)
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------
# the page draws the code: docs/architecture.md against the import graph
# ---------------------------------------------------------------------------

DOC = SRC.parents[1] / "docs" / "architecture.md"


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _names(cell: str) -> set[str]:
    return {n.strip("`/") for n in cell.replace(",", " ").split() if n.startswith("`")}


def test_the_tier_table_is_the_import_graph():
    """The page's table of tiers lists every feature in its FEATURE_TIERS tier, with the features it imports."""
    graph = _graph()
    measured: dict[str, set[str]] = {t: set() for t in _features()}
    for modname, targets in graph.items():
        own = _top(modname)
        if own in _features():
            measured[own] |= {_top(t) for t in targets if _top(t) in _features() and _top(t) != own}
    rows, tier = {}, None
    for line in _section("Inside the features layer: tiers").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`"):
            continue
        tier = int(cells[0].split(":")[0]) if cells[0] else tier
        (module,) = _names(cells[1])
        rows[module] = (tier, _names(cells[3]))
    assert set(rows) == _features(), f"the table's features differ: {sorted(set(rows) ^ _features())}"
    for module, (tier, imports) in sorted(rows.items()):
        assert tier == _tier(module) + 1, f"{module}: tier {tier} in the page, {_tier(module) + 1} in FEATURE_TIERS"
        assert imports == measured[module], f"{module} imports the features {sorted(measured[module])}, page: {imports}"


def test_the_pictures_name_every_module():
    """The layer picture names every top-level module and package of src/tbq; each package picture its modules."""
    layers = _section("The layers").split("```")[1]  # the picture, not the prose
    words = set(layers.replace("/", " ").replace(".py", " ").replace("(", " ").split())
    tops = {_top(m) for m, _ in _modules()} - TOP
    assert tops <= words, f"not in the layer picture of docs/architecture.md: {sorted(tops - words)}"
    pictures = _section("Inside the packages")
    block = pictures[pictures.index("```") : pictures.rindex("```")]
    for pkg in PACKAGE_TIERS:
        start = block.index(f" {pkg}/ ")
        nxt = [block.find(f" {p}/ ") for p in PACKAGE_TIERS if block.find(f" {p}/ ") > start]
        words = set(block[start : min(nxt, default=len(block))].split())
        here = {m.split(".")[2] if m.count(".") >= 2 else "__init__" for m, _ in _modules() if _top(m) == pkg}
        assert here <= words, f"not in the picture of {pkg}/ in docs/architecture.md: {sorted(here - words)}"


#: The layer names of the picture, in the order of LAYERS.
LAYER_NAMES = ["base", "layouts", "tables", "formats", "codecs", "features", "cli"]


def _picture_rows() -> tuple[dict[str, set[str]], dict[str, set[int]]]:
    """The layer picture read back: the layer row(s) each module is drawn in, and the tier(s) of each feature.

    A row starts with its layer's name; a module is a ``name.py`` or ``name/`` token (``tbq/cli/`` is ``cli``),
    or in the features rows any word after ``tier N``."""
    block = _section("The layers").split("```")[1]
    layers: dict[str, set[str]] = {}
    tiers: dict[str, set[int]] = {}
    label = tier = None
    for line in block.splitlines():
        head, body = line[:12].strip(" |"), line[12:]
        label = head or label
        if label == "features":
            words = body.split()
            if words[:1] == ["tier"]:
                tier, words = int(words[1]), words[2:]
            for w in words:
                layers.setdefault(w.strip("/"), set()).add(label)
                tiers.setdefault(w.strip("/"), set()).add(tier)
            continue
        for token in body.replace("(", " ").replace(")", " ").replace(";", " ").split():
            token = token.rstrip(":,")
            if token.endswith(".py") or token.endswith("/"):
                name = token.rstrip("/").rsplit("/", 1)[-1].removesuffix(".py")
                layers.setdefault(name, set()).add(label)
    return layers, tiers


def test_the_layer_picture_draws_each_module_in_its_layer_and_tier():
    """Each top-level module is drawn in the row of its LAYERS layer only, each feature in its FEATURE_TIERS tier."""
    layers, tiers = _picture_rows()
    bad = []
    for top in sorted({_top(m) for m, _ in _modules()} - TOP):
        want = LAYER_NAMES[_layer(top)]
        if layers.get(top) != {want}:
            bad.append(f"tbq.{top}: drawn in {sorted(layers.get(top, ()))}, in LAYERS the {want} layer")
        if want == "features" and tiers.get(top) != {_tier(top) + 1}:
            bad.append(f"tbq.{top}: drawn in tier {sorted(tiers.get(top, ()))}, in FEATURE_TIERS tier {_tier(top) + 1}")
    assert not bad, "docs/architecture.md's layer picture:\n" + "\n".join(bad)
