"""README facts that come from the code: the formats table is the registry, the layout names every module."""

from pathlib import Path

import tbq
from tbq.formats import FORMATS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_formats_table_is_the_registry():
    rows = [line for line in README.splitlines() if line.startswith("| ") and line.count("|") == 6]
    table = {
        r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:5]]
        for r in rows
        if r.split("|")[1].strip() in FORMATS
    }
    assert list(table) == list(tbq.format_names())
    for name, (bs, ts, bits) in table.items():
        info = FORMATS[name]
        assert (int(bs), int(ts), float(bits)) == (info.block_size, info.type_size, info.bits_per_value), name


def test_layout_names_every_module():
    layout = README[README.index("## Layout") :]
    src = ROOT / "src" / "tbq"
    for path in sorted(src.glob("*.py")):
        if path.stem != "__init__":
            assert f"`{path.name}`" in layout, path.name
    for pkg in ("formats", "golden", "check", "cli", "testing"):
        assert f"`{pkg}/" in layout or f"src/tbq/{pkg}/" in layout, pkg
    for path in sorted((src / "formats").glob("*.py")):
        stem = path.stem.removesuffix("_kernels")
        if stem not in ("__init__", "base"):
            assert f"`{stem}`" in layout, path.name
