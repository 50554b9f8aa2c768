"""The format interface split: Format's own members are the core every format defines, and each consumer's needs
are a named capability (tbq.formats.capabilities) that only that consumer reads.

Checks: the core surface is the listed set; every registered format's capabilities are consistent with each other
and with the registry; no module reads a capability member directly off a format (an AST scan of src/tbq, shown to
catch a violation); the old spellings still read the capabilities; FormatInfo is keyword-only.
"""

from __future__ import annotations

import ast
import inspect
import math
import pickle
from pathlib import Path

import numpy as np
import pytest

import tbq
from tbq.errors import ConfigError
from tbq.formats import capabilities as caps_mod
from tbq.formats.base import _MOVED, FORMAT_CLASSES, FORMATS, Format, FormatInfo
from tbq.formats.capabilities import (
    CAPABILITIES,
    DOMAINS,
    TIE_RULES,
    AttentionTraits,
    Capability,
    CapabilitySlot,
    CheckTraits,
)
from tbq.testing.strategies._machinery import HAZARD_FAMILIES

SRC = Path(tbq.__file__).resolve().parent

#: Format's public members: what every format defines (layout, options, the reference and kernels, fragility,
#: what the codec refuses), the validated convenience pair, and the six capability slots.
CORE = {
    # layout and identity
    "info", "name", "block_size", "type_size", "fields", "config",
    # options
    "options", "option_defaults", "check_options",
    # the spec and its numba twins
    "reference_encode", "reference_decode", "kernel_module", "kernels", "kernel_encode", "kernel_decode", "tables",
    # the validated NumPy convenience pair
    "encode", "decode",
    # what the codec refuses and how it chunks
    "row_rule", "overflow_modes", "overflow_kw", "invalid_blocks", "scale_overflows", "encode_error",
    # the fragility of the spec's roundings
    "fragile_values", "fragile_scales", "decode_tolerance",
    # the capabilities
    *CAPABILITIES,
}  # fmt: skip


def _formats() -> list[Format]:
    return [c() for c in FORMAT_CLASSES.values()]


def test_format_public_surface_is_the_core():
    public = {n for n in [*dir(Format), *Format.__annotations__] if not n.startswith("_")}
    assert public == CORE, f"added: {sorted(public - CORE)}, missing: {sorted(CORE - public)}"
    # the old members are gone from the class body (they live only on the capabilities)
    assert not set(_MOVED) & set(vars(Format))


def test_capability_slots_are_the_declared_classes():
    for name, base in CAPABILITIES.items():
        slot = vars(Format)[name]
        assert isinstance(slot, CapabilitySlot) and slot.cls is base
    for n, cls in FORMAT_CLASSES.items():
        f = cls()
        for name, base in CAPABILITIES.items():
            cap_cls = getattr(cls, name)  # on the class: the capability class
            assert isinstance(cap_cls, type) and issubclass(cap_cls, base), (n, name)
            cap = getattr(f, name)  # on an instance: bound to it, made once
            assert type(cap) is cap_cls and cap.format is f and getattr(f, name) is cap, (n, name)


def test_every_capability_is_documented():
    for name, base in CAPABILITIES.items():
        doc = inspect.getdoc(base) or ""
        assert len(doc) > 100, name
        own = [m for m in vars(base) if not m.startswith("_") and m not in ("format",)]
        for m in own:
            member = vars(base)[m]
            if callable(member) or isinstance(member, staticmethod):
                assert inspect.getdoc(getattr(base, m)), f"{base.__name__}.{m} has no docstring"
            else:
                assert f"``{m}``" in doc, f"{base.__name__}'s docstring does not describe {m}"


@pytest.mark.parametrize("name", list(FORMAT_CLASSES))
def test_capabilities_are_consistent(name):
    f = FORMAT_CLASSES[name]()
    ck = f.checker
    assert ck.tie_rule in TIE_RULES
    assert ck.vec_dot_type == "" or ck.vec_dot_type in FORMATS
    assert isinstance(ck.reciprocal_scale, bool) and isinstance(ck.symbol_stem, str)
    zeros = np.zeros((1, f.type_size), np.uint8)
    if ck.vec_dot_type:
        right = tbq.get_format(ck.vec_dot_type)
        # ggml's right operand has an integer form of its own (a q8 type) and the left's block tiles it
        assert right.checker.dot_parts(np.zeros((1, right.type_size), np.uint8)) is not None
        if ck.dot_parts(zeros) is not None:
            assert right.block_size == f.block_size
        if ck.dot_offset(zeros) is not None:  # a left operand with an offset pairs with a right one with a sum
            assert right.checker.dot_offset(np.zeros((1, right.type_size), np.uint8)) is not None
    # derived fields and the derived hook come together
    has_derived = any(fl.derived for fl in f.info.layout)
    x = np.random.default_rng(0).standard_normal((2, f.block_size)).astype(np.float32)
    data, trace = f.reference_encode(x, **({"row_blocks": 2} if f.row_rule else {}))
    assert (ck.derived(data, trace) is not None) == has_derived
    mask, rule = ck.undefined_blocks(trace)
    assert mask.shape == (2,) and mask.dtype == bool and isinstance(rule, str)
    assert ck.equivalent_blocks(data, data).all()
    # the quantizer's rotated view is declared exactly by the rotated formats
    assert (f.quantizer.rotated_view(trace) is not None) == f.info.rotated
    # golden
    g = f.golden
    assert g.on_overflow in f.overflow_modes
    assert math.isfinite(g.ulp_floor) and g.ulp_floor >= 0
    # attention: a domain, a reader named in the kernel module, a rotation for the rotated domain
    a = f.attention
    assert a.domain in DOMAINS
    if not f.info.cache_type:  # an operand-only type has no cache to read
        assert a.read == ""
    if a.read:
        assert callable(getattr(f.kernels(), a.read)), a.read
        assert a.tables().dtype == np.float32
    if a.domain == "rotated":
        assert hasattr(f, "rotation")
    # fuzz hazards name strategy families
    assert set(f.fuzz.hazards) <= set(HAZARD_FAMILIES), f.fuzz.hazards
    # the decoder's domain: the two maps are inverse, the identity for the original domain
    d = f.domain
    assert d.decode_domain in DOMAINS
    y = np.asarray(d.from_decode_domain(d.to_decode_domain(x.astype(np.float64))))
    if d.decode_domain == "original":
        assert d.to_decode_domain(x) is x
    else:
        assert np.allclose(y, x, rtol=0, atol=1e-12)
        assert hasattr(f, "rotation")


def test_turbo_and_vllm_formats_fit_the_recipe():
    """The TurboQuant caches declare only what differs from the defaults, each on its capability."""
    assert FORMAT_CLASSES["turbo3"].checker.symbol_stem == "turbo3_0"
    assert FORMAT_CLASSES["turbo3"].domain.decode_domain == "rotated"
    assert FORMAT_CLASSES["turbo3"].attention.domain == "rotated"
    assert FORMAT_CLASSES["vllm_tq4_k"].attention.read == "attention_read_keys"
    assert FORMAT_CLASSES["vllm_tq4_v"].checker.tie_rule == "up"
    for n in ("turbo2", "turbo3", "turbo4", "vllm_tq4_k", "vllm_tq3_k", "vllm_tq4_v", "vllm_tq3_v"):
        assert not set(_MOVED) & set(vars(FORMAT_CLASSES[n])), n


def test_fp8_hazards_follow_the_instance_and_survive_pickling():
    f = tbq.get_format("fp8_e4m3", scale=2.0)
    assert f.fuzz.hazards["fp8_grid"]["scale"] == 2.0 and f.fuzz.hazards["fp8_grid"]["limit"] == 464.0
    assert FORMAT_CLASSES["fp8_e4m3"].fuzz.hazards == {"fp8_grid": {}}  # the class lists the family
    g = pickle.loads(pickle.dumps(f))
    assert not any(k.startswith("_capability_") for k in vars(g))
    assert g.fuzz.hazards["fp8_grid"]["scale"] == 2.0


def test_old_spellings_read_the_capabilities_with_a_deprecation_warning():
    for f in _formats():
        for old, (cap, new) in _MOVED.items():
            want = getattr(getattr(f, cap), new)
            with pytest.warns(DeprecationWarning, match=rf"\.{old} is deprecated: read .*\.{cap}\.{new}"):
                got = getattr(f, old)
            assert got == want, (f.name, old)
            with pytest.warns(DeprecationWarning, match=rf"\.{old} is deprecated"):
                cls_value = getattr(type(f), old)
            assert cls_value == getattr(getattr(type(f), cap), new), (f.name, old)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        tbq.get_format("q8_0").nothing  # noqa: B018


def test_a_format_declaring_a_moved_member_is_refused():
    with pytest.raises(ConfigError, match=r"tie_rule -> checker\.tie_rule"):

        class _Bad(Format):  # no info: not registered
            tie_rule = "away"

    with pytest.raises(ConfigError, match="checker must be CapabilitySlot"):

        class _Bad2(Format):
            checker = CapabilitySlot(AttentionTraits)  # type: ignore[assignment]

    class _Good(Format):
        class _Checks(CheckTraits):
            tie_rule = "even"

        checker = CapabilitySlot(_Checks)

    assert _Good.checker.tie_rule == "even" and "_Good" not in FORMAT_CLASSES


def test_format_info_is_keyword_only():
    with pytest.raises(TypeError):
        FormatInfo("x", 32, 34, False, 8, "positional")  # type: ignore[misc]
    info = FormatInfo(name="x", block_size=32, type_size=34, rotated=False, index_bits=8, description="d")
    assert info.bits_per_value == 8.5


# ---------------------------------------------------------------------------
# no consumer reads a capability member off a format
# ---------------------------------------------------------------------------

#: Attribute reads named like a moved member whose receiver is not a format: (module, expression) -> what it is.
NOT_A_FORMAT = {
    ("check/classify.py", "fl.derived"): "Field.derived, a layout flag",
    ("check/report.py", "self.tie_rule"): "the report's own field",
    ("cli/golden.py", "args.ulp_floor"): "the command-line option",
    ("golden/generate.py", "s.ulp_floor"): "GoldenSettings.ulp_floor, the caller's override",
    ("golden/settings.py", "self.ulp_floor"): "GoldenSettings' own field",
    ("testing/strategies/_machinery.py", "self.hazards"): "the strategy context's copy of fmt.fuzz.hazards",
    **{
        (m, "ctx.hazards"): "the strategy context"
        for m in ("testing/strategies/_blocks.py", "testing/strategies/_fp4.py", "testing/strategies/_fp8.py")
    },
    ("testing/strategies/_scalar.py", "ctx.hazards"): "the strategy context",
}


def _capability_classes() -> set[str]:
    names = {c.__name__ for c in vars(caps_mod).values() if isinstance(c, type) and issubclass(c, Capability)}
    for cls in FORMAT_CLASSES.values():
        for cap in CAPABILITIES:
            names.update(k.__name__ for k in getattr(cls, cap).__mro__ if issubclass(k, Capability))
    return names


def _direct_reads(tree: ast.AST, module: str, cap_classes: set[str]) -> list[str]:
    """``module:line expr`` of every read of a moved member that does not go through a capability."""
    out: list[str] = []

    def visit(node: ast.AST, in_capability: bool) -> None:
        if isinstance(node, ast.ClassDef):
            in_capability = node.name in cap_classes
        if isinstance(node, ast.Attribute) and node.attr in _MOVED:
            v = node.value
            text = ast.unparse(node)
            via_capability = isinstance(v, ast.Attribute) and v.attr in CAPABILITIES
            own = in_capability and (
                (isinstance(v, ast.Name) and v.id == "self")
                or (isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super")
            )
            if not (via_capability or own or (module, text) in NOT_A_FORMAT):
                out.append(f"{module}:{node.lineno} {text}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in _MOVED
        ):  # getattr(fmt, "tie_rule", ""): the same read, spelled as a string
            out.append(f"{module}:{node.lineno} {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, in_capability)

    visit(tree, False)
    return out


def test_no_module_reads_a_capability_member_off_a_format():
    cap_classes = _capability_classes()
    bad: list[str] = []
    for p in sorted(SRC.rglob("*.py")):
        module = p.relative_to(SRC).as_posix()
        bad += _direct_reads(ast.parse(p.read_text()), module, cap_classes)
    assert not bad, "read these through the format's capability (fmt.checker.tie_rule, ...):\n" + "\n".join(bad)


def test_the_scan_catches_a_direct_read():
    src = "def f(fmt):\n    return fmt.tie_rule, fmt.checker.tie_rule, fmt.attention_reader()\n"
    assert _direct_reads(ast.parse(src), "x.py", set()) == ["x.py:2 fmt.tie_rule", "x.py:2 fmt.attention_reader"]
    spelled = "def f(fmt):\n    return getattr(fmt, 'tie_rule', '')\n"
    assert _direct_reads(ast.parse(spelled), "x.py", set()) == ["x.py:2 getattr(fmt, 'tie_rule', '')"]
    inside = "class Q8_0Checks(CheckTraits):\n    def g(self):\n        return self.reciprocal_scale\n"
    assert _direct_reads(ast.parse(inside), "x.py", {"Q8_0Checks"}) == []
    assert _direct_reads(ast.parse(inside), "x.py", set()) == ["x.py:3 self.reciprocal_scale"]
