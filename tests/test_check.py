"""tbq.check / tbq check: small C kernels of our own (tests/c, written from docs/formats.md), correct and broken,
must each be classified correctly, with the right diagnosis; Python callables and --exec programs take the same paths.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tbq
from tbq.check import CheckReport, TargetError, check_kernel, check_library, check_program
from tbq.check.classify import EXACT, FRAGILE, TIE_RULE, WRONG, classify_decoded, classify_encoded
from tbq.cli import main
from tbq.golden import hex_literal

C_DIR = Path(__file__).parent / "c"
CC = shutil.which("gcc") or shutil.which("cc")
needs_cc = pytest.mark.skipif(
    CC is None, reason="no C compiler (gcc or cc) on PATH: the C kernels of tests/c cannot be built"
)

#: small runs: the phases, not their length, are under test (the suite stays well under a minute)
FAST = dict(blocks=1500, examples=15)


# ---------------------------------------------------------------------------
# building the kernels
# ---------------------------------------------------------------------------


def _tables_headers() -> dict:
    def arr(name, a):
        return (
            f"static const float {name}[{np.size(a)}] = {{{', '.join(hex_literal(float(v)) for v in np.ravel(a))}}};\n"
        )

    t4, t3 = tbq.get_format("tbq4_0").tables(), tbq.get_format("tbq3_0").tables()
    tbq_h = (
        "#pragma once\n"
        + arr("TBQ4_CENTROIDS", t4["centroids"])
        + arr("TBQ4_THRESHOLDS", t4["thresholds"])
        + arr("TBQ3_CENTROIDS", t3["centroids"])
        + arr("TBQ3_THRESHOLDS", t3["thresholds"])
        + arr("TBQ_SIGNS1", t4["signs1"])
        + arr("TBQ_SIGNS2", t4["signs2"])
    )
    p3, i3, p4 = (tbq.get_format(f).tables() for f in ("planar3_0", "iso3_0", "planar4_0"))
    pi_h = (
        "#pragma once\n"
        + arr("PI_CENTROIDS3", p3["centroids"])
        + arr("PI_CENTROIDS4", p4["centroids"])
        + arr("GIVENS_COS", p3["givens_cos"])
        + arr("GIVENS_SIN", p3["givens_sin"])
        + "".join(arr("QUAT_" + c.upper(), i3["quat_" + c]) for c in "wxyz")
    )
    return {"tbq_tables.h": tbq_h, "planar_iso_tables.h": pi_h}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """``build(source, *defines, exe=False)``: compile a kernel of tests/c (cached), return its path."""
    if CC is None:
        pytest.skip("no C compiler (gcc or cc) on PATH: the C kernels of tests/c cannot be built")
    out = tmp_path_factory.mktemp("kernels")
    for (
        name,
        text,
    ) in _tables_headers().items():  # the kernels' tables, exactly tbq's (as tbq golden's headers give them)
        (out / name).write_text(text)
    made = {}

    def make(*sources, defines=(), exe=False, contract=False, libs=()):
        key = (sources, tuple(defines), exe, contract, tuple(map(str, libs)))
        if key not in made:
            name = "_".join(Path(s).stem for s in sources) + "".join("_" + d.replace("=", "") for d in defines)
            path = out / (name if exe else f"lib{name}.so")
            flags = ["-O2", f"-I{out}", f"-I{C_DIR}"] + ([] if exe else ["-shared", "-fPIC"])
            flags += [] if contract else ["-ffp-contract=off"]  # the correct kernels: no FMA contraction
            linked = ["-Wl,--no-as-needed"] * bool(libs) + [
                a for lib in libs for a in (str(lib), f"-Wl,-rpath,{Path(lib).parent}")
            ]
            cmd = [
                CC,
                *flags,
                *(f"-D{d}" for d in defines),
                *(str(C_DIR / s) for s in sources),
                *linked,
                "-o",
                str(path),
                "-lm",
            ]
            subprocess.run(cmd, check=True, capture_output=True)
            made[key] = path
        return made[key]

    return make


KERNELS = {"q8_0": "q8_0.c", "q4_0": "q4_0.c", "tbq4_0": "tbq.c", "tbq3_0": "tbq.c"}
KERNELS.update({f: "ggml_extra.c" for f in ("f16", "bf16", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4", "nvfp4")})
KERNELS.update({f: "planar_iso.c" for f in ("planar3_0", "iso3_0", "planar4_0", "iso4_0")})
KERNELS.update({f: "fp8.c" for f in ("fp8_e4m3", "fp8_e5m2")})
#: ggml's own names where they are not quantize_row_<fmt>_ref / dequantize_row_<fmt>
SYMBOLS = {
    "f16": ("ggml_fp32_to_fp16_row", "ggml_fp16_to_fp32_row"),
    "bf16": ("ggml_fp32_to_bf16_row_ref", "ggml_bf16_to_fp32_row"),
}


def names(report: CheckReport, direction: str | None = None, scope: str = "wrong") -> list[str]:
    return [
        d.name
        for d in report.diagnoses
        if (direction is None or d.direction in (direction, "both")) and d.scope == scope
    ]


def assert_counts_add_up(report: CheckReport) -> None:
    for p in report.phases:
        assert p.blocks == p.exact + p.fragile + p.wrong + p.equivalent + p.undefined + p.tie_rule, p


# ---------------------------------------------------------------------------
# correct kernels pass, exactly
# ---------------------------------------------------------------------------


@needs_cc
@pytest.mark.parametrize("fmt", [f for f in KERNELS if f in tbq.format_names()])
def test_correct_kernel_passes_bit_exact(build, fmt):
    q, d = SYMBOLS.get(fmt, (None, None))
    report = check_library(build(KERNELS[fmt]), fmt, quantize=q, dequantize=d, **FAST)
    assert report.ok, report
    assert_counts_add_up(report)
    for d in ("quantize", "dequantize"):
        for phase in ("golden", "fuzz"):
            c = report.counts(d, phase)
            assert c["exact"] == c["blocks"] > 0, (d, phase, c)  # bit-exact, and the phase ran
    # arbitrary bytes with NaN/Inf scales: a NaN of another payload is fragile (x86 picks the NaN
    # operand by position: q5_1's 0 * Inf + NaN(m) keeps the product's NaN in this C, m's in tbq)
    c = report.counts("dequantize", "bytes")
    assert c["wrong"] == 0 and c["blocks"] >= FAST["blocks"]
    assert report.counts("dequantize", "bytes")["blocks"] >= FAST["blocks"]
    assert not report.counterexamples and not report.diagnoses


# ---------------------------------------------------------------------------
# each broken kernel: the right class and the right diagnosis
# ---------------------------------------------------------------------------


@needs_cc
def test_tbq3_shift_bug_is_wrong_in_the_golden_phase_with_the_shift_diagnosis(build):
    report = check_library(build("tbq.c", defines=["SHIFT_BUG"]), "tbq3_0", blocks=500, examples=0)
    golden = report.counts("quantize", "golden")
    assert golden["wrong"] > 0.9 * golden["blocks"]
    assert not report.failed("dequantize")  # only the packer is broken
    assert names(report, "quantize")[0] == "shift_bug_3bit"
    diag = next(d for d in report.diagnoses if d.name == "shift_bug_3bit")
    # the all-zero blocks decode to zeros whatever the bug writes: equivalent, and the packer reproduces every wrong block
    wrong = report.counts("quantize")["wrong"]
    assert wrong + report.counts("quantize")["equivalent"] == 500
    assert any(f"reproduces the target's bytes in {wrong} of {wrong}" in e for e in diag.evidence), diag.evidence
    # the title states what was measured: the positions that differ include t = 0 and 2 (the fork's packer)
    assert (
        "codes 0, 2, 3, 4, 5, 6, 7 of the 8-value groups differ" in diag.title
        and f"reproduces {wrong} of {wrong}" in diag.title
    )
    ce = report.counterexamples["quantize"]
    assert ce.phase == "golden" and ce.classification == "wrong" and ce.input.size == 128
    assert any(f["field"] == "idx" for f in ce.fields)


@needs_cc
@pytest.mark.parametrize("variant", ["FMA_SCALE", "PAIRWISE_NORM"])
def test_tbq4_fma_scale_or_pairwise_norm_is_only_fragile(build, variant):
    lib = build("tbq.c", defines=[variant])
    report = check_library(lib, "tbq4_0", blocks=8000, examples=10)
    assert report.ok, report
    assert report.counts()["wrong"] == 0 and report.counts("quantize")["fragile"] > 0
    assert not report.failed("dequantize") and report.counts("dequantize")["fragile"] == 0
    strict = check_library(lib, "tbq4_0", blocks=8000, examples=0, exact=True)
    assert not strict.ok and strict.counts()["wrong"] == 0 and strict.counts()["fragile"] > 0
    assert strict.counterexamples["quantize"].classification == "fragile"


@needs_cc
@pytest.mark.parametrize("fmt", ["planar3_0", "iso4_0"])
def test_fma_decoder_of_a_rotated_format_is_fragile_within_decode_tolerance(build, fmt):
    lib = build("planar_iso.c", defines=["FMA_DECODE"])
    report = check_library(lib, fmt, only="dequantize", blocks=1500, examples=0)
    golden = report.counts("dequantize", "golden")
    assert golden["wrong"] == 0 and golden["fragile"] > 0.9 * golden["blocks"]  # every block with d != 0
    assert not check_library(lib, fmt, only="dequantize", blocks=1500, examples=0, exact=True).ok


@needs_cc
def test_fma_decoder_of_a_rotated_format_passes_on_arbitrary_bytes(build):
    """Regression: decode_tolerance once took the signed scale, so a negative fp16 scale (arbitrary
    bytes) got a negative tolerance and an FMA decoder was called wrong there."""
    report = check_library(
        build("planar_iso.c", defines=["FMA_DECODE"]), "planar3_0", only="dequantize", blocks=1500, examples=0
    )
    assert report.ok, report


@needs_cc
def test_tbq4_one_flipped_sign_is_wrong_with_the_sign_table_diagnosis(build):
    report = check_library(build("tbq.c", defines=["FLIP_SIGNS2=5"]), "tbq4_0", **FAST)
    assert report.counts("quantize")["wrong"] > 0 and report.counts("dequantize")["wrong"] > 0
    enc = next(d for d in report.diagnoses if d.name == "rotated_sign" and d.direction == "quantize")
    dec = next(d for d in report.diagnoses if d.name == "rotated_sign" and d.direction == "dequantize")
    assert "signs2[5]" in enc.title and "signs2[5]" in dec.title
    assert "round_trip" in names(report)  # its own round trip agrees, decoding tbq's bytes does not
    ce = report.counterexamples["quantize"]
    assert [f["field"] for f in ce.fields] == ["idx"] and ce.fields[0]["positions"] == [5]


@needs_cc
def test_kernel_built_with_another_codebook_names_it(build):
    # the kernel has the lloyd-max tables; checking it as turboq-mtp (the fork's tables) fails and says which it uses
    report = check_library(build("tbq.c"), "tbq3_0", codebook="turboq-mtp", blocks=600, examples=0)
    assert report.counts("quantize")["wrong"] > 0
    d = next(g for g in report.diagnoses if g.name == "codebook")
    assert "'lloyd-max'" in d.title
    assert check_library(build("tbq.c"), "tbq3_0", codebook="lloyd-max", blocks=600, examples=0).ok
    # the known tables and sign seeds, tried in both directions: the one the kernel follows is named
    for direction in ("quantize", "dequantize"):
        (g,) = [g for g in report.diagnoses if g.name == "format_options" and g.direction == direction]
        assert g.title == "the target follows tbq3_0 with codebook='lloyd-max' (check with --codebook lloyd-max)", (
            g.title
        )
        assert "gives exactly the target's output in" in g.evidence[0]
    seeded = check_library(build("tbq.c"), "tbq4_0", signs=7, blocks=300, examples=0)
    titles = [g.title for g in seeded.diagnoses if g.name == "format_options"]
    assert titles == ["the target follows tbq4_0 with signs='turboq-mtp' (check with --signs turboq-mtp)"] * 2, titles


@needs_cc
def test_q4_0_swapped_nibbles_is_wrong_with_the_nibble_diagnosis(build):
    report = check_library(build("q4_0.c", defines=["SWAP_NIBBLES"]), "q4_0", **FAST)
    for d in ("quantize", "dequantize"):
        assert report.counts(d, "golden")["wrong"] > 0
        assert names(report, d)[0] == "nibble_order"
        assert "high and low" in next(g for g in report.diagnoses if g.direction == d and g.scope == "wrong").title
    # hypothesis found it and it was shrunk to a single block
    ce = report.counterexamples["quantize"]
    assert ce.phase == "fuzz" and "shrunk by hypothesis" in ce.how and ce.input.size == 32


@needs_cc
@pytest.mark.parametrize(
    "fmt, source, variant, spec",
    [
        ("q8_0", "q8_0.c", "ROUND_HALF_EVEN", "half away from zero"),
        ("mxfp4", "ggml_extra.c", "FP4_TIES_EVEN", "half toward zero"),
    ],
)
def test_another_tie_rule_is_its_own_class_never_fragile_and_exact_refuses_it(build, fmt, source, variant, spec):
    lib = build(source, defines=[variant])
    report = check_library(lib, fmt, only="quantize", blocks=4000, examples=0)
    c = report.counts()
    assert report.ok and c["tie_rule"] > 0 and c["fragile"] == 0 and c["wrong"] == 0, c
    assert_counts_add_up(report)
    (diag,) = [g for g in report.diagnoses if g.scope == "tie_rule"]
    assert diag.name == "tie_rounding"
    assert (
        diag.title
        == f"ties are rounded half to even (rintf, nearbyintf, cvtps2dq, __float2int_rn) where the spec rounds {spec}"
        + (" (roundf)" if "away" in spec else "")
    ), diag.title
    assert f"{c['tie_rule']:,} of the {c['tie_rule']:,} blocks whose bytes differ (100%)" in diag.evidence[0]
    assert "the even level in 100%" in diag.evidence[1]
    assert "blocks with another tie rule accepted" in report.verdict() and "tie_rule" in report.table()
    strict = check_library(lib, fmt, only="quantize", blocks=4000, examples=0, exact=True)
    assert not strict.ok and f"{c['tie_rule']:,} tie-rule (refused by --exact)" in strict.verdict()
    assert strict.counterexamples["quantize"].classification == "tie_rule"


@needs_cc
def test_a_zero_scale_of_the_other_sign_is_equivalent_with_the_signed_zero_diagnosis(build):
    report = check_library(
        build("q4_0.c", defines=["SIGN_FROM_FIRST"]), "q4_0", only="quantize", blocks=3000, examples=30
    )
    c = report.counts()
    assert report.ok and c["equivalent"] > 0 and c["wrong"] == 0, c
    assert check_library(
        build("q4_0.c", defines=["SIGN_FROM_FIRST"]), "q4_0", only="quantize", blocks=3000, examples=30, exact=True
    ).ok  # equivalent blocks decode to the same values: accepted even under exact
    (diag,) = [g for g in report.diagnoses if g.scope == "equivalent"]
    assert diag.name == "signed_zero" and diag.title == "only the sign of a zero d differs (+0 against -0)"
    assert (
        f"in all {c['equivalent']} blocks the only difference is the sign of a zero in field d: tbq stores -0 in "
        f"{c['equivalent']} of them" in diag.evidence[0]
    )
    assert "is the opposite of the sign of x[0] in every one of them" in diag.evidence[2]
    assert "x[0] = -0.0" in diag.evidence[3]  # the example shows the -0 that decides it


@needs_cc
def test_garbage_codes_in_zero_scale_blocks_are_equivalent_not_wrong(build):
    lib = build("q8_0.c", defines=["ZERO_BLOCK_GARBAGE"])
    report = check_library(lib, "q8_0", only="quantize", blocks=3000, examples=0)
    c = report.counts()
    assert report.ok and c["equivalent"] > 0 and c["wrong"] == 0, c
    (diag,) = [g for g in report.diagnoses if g.scope == "equivalent"]
    assert diag.name == "equivalent" and "decode to the same values" in diag.title


def test_undefined_inputs_are_their_own_class_accepted_unless_exact():
    tiny = np.float32(2.0**-140)

    def q8(
        x,
    ):  # ggml's SIMD q8_0 where 1/d overflows: -128 codes instead of 0 ... and here a non-zero scale, so it shows
        out = tbq.quantize(x, "q8_0").reshape(-1, 34)
        amax = np.abs(x.reshape(-1, 32)).max(axis=1)
        with np.errstate(divide="ignore", over="ignore"):
            bad = (amax > 0) & np.isinf(np.float32(1) / (amax / np.float32(127)))
        out[bad, 2:] = 0x7F
        out[bad, 0:2] = (1, 0)  # the smallest fp16 subnormal: the codes now decode to something
        return out

    x = np.zeros((4, 64), np.float32)
    x[:, 0] = tiny
    r = check_kernel("q8_0", quantize=q8, blocks=200, examples=0)
    assert r.counts()["undefined"] == 0  # the golden families do not reach there; the rule is the format's
    mask, rule = tbq.get_format("q8_0").checker.undefined_blocks({"d": np.float32([tiny / 127, 1.0, 0.0])})
    assert mask.tolist() == [True, False, False] and "1/d overflows float32" in rule
    from tbq.check.classify import UNDEFINED, classify_encoded

    got = q8(x)
    c = classify_encoded(tbq.get_format("q8_0"), x, tbq.quantize(x, "q8_0"), got, k=8)
    assert set(c.cls.reshape(4, 2)[:, 0].tolist()) == {UNDEFINED}


@needs_cc
def test_overrun_and_unwritten_bytes_are_faults(build):
    over = check_library(build("q8_0.c", defines=["OVERRUN"]), "q8_0", only="quantize", blocks=200, examples=0)
    assert not over.ok and over.counts()["wrong"] == 0
    assert "writes past the end of its output" in over.faults["quantize"][0]
    unw = check_library(build("q8_0.c", defines=["UNWRITTEN"]), "q8_0", only="quantize", blocks=200, examples=0)
    assert unw.counts()["wrong"] > 0
    diag = next(d for d in unw.diagnoses if d.name == "unwritten")
    assert "bytes 33 of the output" in diag.evidence[0] and "fields: qs" in diag.evidence[0]


# ---------------------------------------------------------------------------
# Python callables and --exec programs go through the same paths
# ---------------------------------------------------------------------------


def _swapped_q4_0(x):
    q = tbq.quantize(x, "q4_0").reshape(-1, 18)
    q[:, 2:] = (q[:, 2:] >> 4) | (q[:, 2:] << 4)
    return q


def test_python_callable_is_classified_like_a_library():
    good = check_kernel(
        "q4_0", quantize=lambda x: tbq.quantize(x, "q4_0"), dequantize=lambda d: tbq.dequantize(d, "q4_0"), **FAST
    )
    assert good.ok and good.counts()["exact"] == good.counts()["blocks"]
    bad = check_kernel("q4_0", quantize=_swapped_q4_0, **FAST)
    assert not bad.ok and bad.directions == ["quantize"]
    assert names(bad) == ["nibble_order"]
    with pytest.raises(AssertionError, match="nibble order swapped"):
        bad.assert_ok()


def test_python_callable_shapes_are_checked():
    with pytest.raises(TargetError, match="returned 17 values"):
        check_kernel("q8_0", quantize=lambda x: np.zeros(17, np.uint8), examples=0)
    with pytest.raises(TargetError, match="dtype float64"):
        check_kernel("q8_0", dequantize=lambda d: tbq.dequantize(d, "q8_0").astype(np.float64), examples=0)
    with pytest.raises(TargetError, match="nothing to check"):
        check_kernel("q8_0")


@needs_cc
def test_exec_program_is_classified_like_a_library(build, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    good = build("exec_main.c", "q8_0.c", defines=["FMT=q8_0", "TYPE_SIZE=34", "BLOCK=32"], exe=True)
    assert (
        main(
            [
                "check",
                "--format",
                "q8_0",
                "--exec",
                f"{good} {{op}} {{in}} {{out}}",
                "--blocks",
                "600",
                "--examples",
                "8",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert "PASS" in out.out and out.err == ""  # no progress when stderr is not a terminal
    bad = build("exec_main.c", "q4_0.c", defines=["FMT=q4_0", "TYPE_SIZE=18", "BLOCK=32", "SWAP_NIBBLES"], exe=True)
    report = check_program(f"{bad} {{op}} {{in}} {{out}}", "q4_0", blocks=600, examples=8)
    assert names(report, "quantize")[0] == "nibble_order" and names(report, "dequantize")[0] == "nibble_order"
    one = check_program(f"{bad} quantize {{in}} {{out}}", "q4_0", only="quantize", blocks=600, examples=0)
    assert one.directions == ["quantize"] and one.counts()["wrong"] > 0


def test_exec_errors_are_target_errors(tmp_path):
    with pytest.raises(TargetError, match="no {op} placeholder"):
        check_program("prog {in} {out}", "q8_0")
    with pytest.raises(TargetError, match="unknown placeholder {input}"):
        check_program("prog {op} {input} {out}", "q8_0")
    with pytest.raises(TargetError, match="command not found"):
        check_program(f"{tmp_path / 'missing'} {{op}} {{in}} {{out}}", "q8_0", examples=0)
    with pytest.raises(TargetError, match="exited with status 1"):
        check_program("false {in} {out}", "q8_0", only="quantize", examples=0)
    with pytest.raises(TargetError, match=r"died of SIGILL \(illegal instruction\) \(quantize, "):
        check_program("sh -c 'kill -ILL $$' {in} {out}", "q8_0", only="quantize", examples=0)  # a build for another CPU
    with pytest.raises(TargetError, match="wrote no {out} file"):
        check_program("true {in} {out}", "q8_0", only="quantize", examples=0)


# ---------------------------------------------------------------------------
# every registered format is checkable with no code of its own
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", tbq.format_names())
def test_every_format_checks_its_reference_and_catches_a_flipped_code_bit(fmt):
    def ref(x):
        return tbq.quantize(x, fmt, on_overflow="inf")

    report = check_kernel(fmt, quantize=ref, dequantize=lambda d: tbq.dequantize(d, fmt), blocks=300, examples=4)
    assert report.ok and report.counts()["exact"] == report.counts()["blocks"], report
    ts = tbq.format_info(fmt).type_size

    def broken(x):  # bit 4 of the last byte of every block: a code (or, for 2-byte formats, the exponent)
        q = ref(x).reshape(-1, ts)
        q[:, -1] ^= 0x10
        return q

    bad = check_kernel(fmt, quantize=broken, blocks=300, examples=0)
    assert bad.counts("quantize", "golden")["wrong"] > 0, bad
    assert bad.counterexamples["quantize"].offsets  # the differing byte offsets are named


def test_unknown_option_and_format_are_config_errors():
    with pytest.raises(tbq.ConfigError, match="no option 'codebook'"):
        check_kernel("q8_0", quantize=lambda x: x, codebook="lloyd-max")
    with pytest.raises(tbq.ConfigError, match="unknown format"):
        check_kernel("q9_9", quantize=lambda x: x)


# ---------------------------------------------------------------------------
# classification and diagnoses of decoders, on Python kernels
# ---------------------------------------------------------------------------


def test_classification_of_encoders_uses_the_fragility_mask():
    f = tbq.get_format("q8_0")
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1], x[0, 2] = 127.0, 2.5, 1.2  # d = 1: x*id = 2.5 is an exact tie (fragile), 1.2 is not
    ref = f.encode(x)
    tie, far, two = ref.copy(), ref.copy(), ref.copy()
    tie[0, 3] -= 1  # the tie rounded the other way: another tie rule, its own class (not fragile)
    far[0, 4] -= 1  # 1.2 -> 0: wrong
    two[0, 3] -= 2  # two steps, even at a tie: wrong
    classes = [classify_encoded(f, x, ref, got, k=4).cls[0] for got in (ref, tie, far, two)]
    assert classes == [EXACT, TIE_RULE, WRONG, WRONG]


def test_classification_of_decoders_nan_payloads_are_fragile_values_are_exact():
    f = tbq.get_format("q8_0")
    data = np.zeros((1, 34), np.uint8)
    data[0, :2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)  # inf * 0 = NaN
    ref = f.decode(data)[None, :]
    canonical = ref.copy()
    canonical.view(np.uint32)[:] = 0x7FFFFFFF  # what a GPU returns for any NaN
    off = ref.copy()
    off[0, 0] = 1.0
    assert [classify_decoded(f, data, ref, g).cls[0] for g in (ref, canonical, off)] == [EXACT, FRAGILE, WRONG]


def test_flush_to_zero_decoder_is_diagnosed_in_the_bytes_phase():
    def ftz(data):
        y = tbq.dequantize(data, "q8_0").reshape(-1, 32)
        bits = data.reshape(-1, 34)[:, :2].copy().view("<u2").reshape(-1)
        y[((bits & 0x7C00) == 0) & ((bits & 0x3FF) != 0)] = 0.0  # subnormal fp16 scales flushed
        return y

    report = check_kernel("q8_0", dequantize=ftz, blocks=2000, examples=0)
    assert report.counts("dequantize", "bytes")["wrong"] > 0
    assert "flush_to_zero" in names(report, "dequantize")


def test_flush_to_zero_is_diagnosed_where_the_scale_is_not_the_first_field():
    # vLLM's key norm "d" follows the 64 index bytes: the diagnosis reads the field where the layout puts it
    d = next(f for f in tbq.format_info("vllm_tq4_k").layout if f.name == "d")
    assert d.offset == 64

    def ftz(data):
        y = tbq.dequantize(data, "vllm_tq4_k").reshape(-1, 128)
        bits = data.reshape(-1, 66)[:, 64:66].copy().view("<u2").reshape(-1)
        y[((bits & 0x7C00) == 0) & ((bits & 0x3FF) != 0)] = 0.0  # subnormal fp16 norms flushed
        return y

    report = check_kernel("vllm_tq4_k", dequantize=ftz, blocks=2000, examples=0)
    assert report.counts("dequantize", "bytes")["wrong"] > 0
    assert "flush_to_zero" in names(report, "dequantize")


def test_scale_one_fp16_step_off_is_named():
    def bumped(x):
        q = tbq.quantize(x, "q8_0").reshape(-1, 34)
        h = q[:, :2].copy().view("<u2")
        h += (h & 0x7FFF) != 0x7BFF  # one fp16 step up (away from zero), codes untouched
        q[:, :2] = h.view(np.uint8)
        return q

    report = check_kernel("q8_0", quantize=bumped, blocks=600, examples=0)
    assert report.counts()["wrong"] > 0
    d = next(g for g in report.diagnoses if g.name == "scale_ulp")
    assert "--fragile-ulps" in d.evidence[1]


def test_truncating_fp16_conversion_is_named_not_blamed_on_fma():
    f = tbq.get_format("q8_0")

    def truncated(x):  # the scale converted to fp16 toward zero instead of to nearest even
        q = tbq.quantize(x, "q8_0").reshape(-1, 34)
        d = f.encode(x.reshape(-1, 32), trace=True)[1]["d"].reshape(-1)
        h = d.astype(np.float16)
        bits = h.view(np.uint16).astype(np.int64)
        bits = np.where(np.abs(h.astype(np.float64)) > np.abs(d), bits - 1, bits)
        q[:, :2] = bits.astype("<u2").view(np.uint8).reshape(-1, 2)
        return q

    report = check_kernel("q8_0", quantize=truncated, blocks=600, examples=0)
    assert names(report) == ["scale_conversion"] and "truncates" in report.diagnoses[0].title


def test_fuzz_finds_and_shrinks_what_the_golden_phase_skips():
    def bad(x):  # wrong only on blocks whose first value is negative and large
        q = tbq.quantize(x, "q8_0").reshape(-1, 34)
        blocks = x.reshape(-1, 32)
        q[blocks[:, 0] < -1000, 2] ^= 1
        return q

    report = check_kernel("q8_0", quantize=bad, blocks=0, examples=200)
    assert report.counts("quantize", "fuzz")["wrong"] >= 1
    ce = report.counterexamples["quantize"]
    assert ce.phase == "fuzz" and "shrunk by hypothesis" in ce.how
    assert ce.input.size == 32 and ce.input[0] < -1000 and np.count_nonzero(ce.input) <= 2


def test_seconds_budget_runs_the_fuzz():
    report = check_kernel("q4_0", quantize=lambda x: tbq.quantize(x, "q4_0"), blocks=0, seconds=0.5)
    assert report.ok and report.counts("quantize", "fuzz")["blocks"] > 0


@pytest.mark.parametrize("bad", [0, -1.5, float("nan"), float("inf"), True, "1"])
def test_seconds_must_be_a_finite_positive_number(bad):
    """A budget of inf seconds was taken and fuzzed a passing kernel forever (the CLI already refused it)."""
    ok = lambda x: tbq.quantize(x, "q4_0")  # noqa: E731
    with pytest.raises(tbq.TbqValueError, match=r"^seconds must be a positive number of seconds or None, got "):
        check_kernel("q4_0", quantize=ok, blocks=0, seconds=bad)


# ---------------------------------------------------------------------------
# the CLI: exit status, JSON, counterexample files, missing hypothesis
# ---------------------------------------------------------------------------


@needs_cc
def test_cli_failure_writes_json_npz_and_a_c_repro_that_fails(build, tmp_path, capsys):
    lib = build("q4_0.c", defines=["SWAP_NIBBLES"])
    out = tmp_path / "ce"
    js = tmp_path / "r.json"
    code = main(
        [
            "check",
            "--format",
            "q4_0",
            "--lib",
            str(lib),
            "--blocks",
            "500",
            "--examples",
            "5",
            "--out",
            str(out),
            "--json",
            str(js),
        ]
    )
    text = capsys.readouterr().out
    assert code == 1 and "FAIL" in text and "nibble order swapped" in text
    data = json.loads(js.read_text())
    assert data["ok"] is False and data["totals"]["quantize"]["wrong"] > 0
    assert data["totals"]["quantize"]["blocks"] == sum(
        p["blocks"] for p in data["phases"] if p["direction"] == "quantize"
    )
    assert {d["name"] for d in data["diagnoses"]} >= {"nibble_order", "round_trip"}
    with np.load(out / "q4_0-quantize.npz") as z:  # closed here: an open NpzFile warns when collected later
        assert z["input"].dtype == np.float32 and z["expected"].dtype == np.uint8
        assert not np.array_equal(z["expected"], z["got"])
    # the C repro: compiled against the broken kernel it fails, against the correct one it passes
    for kernel, want in ((lib, 1), (build("q4_0.c"), 0)):
        for direction in ("quantize", "dequantize"):
            exe = tmp_path / f"repro_{want}_{direction}"
            subprocess.run([CC, "-O2", str(out / f"q4_0-{direction}.c"), str(kernel), "-o", str(exe)], check=True)
            res = subprocess.run([str(exe)], capture_output=True, text=True)
            assert res.returncode == want, (direction, kernel, res.stdout)


@needs_cc
def test_cli_exit_2_for_loading_and_usage_errors(build, tmp_path, capsys):
    lib = build("q4_0.c")
    cases = [
        (["--lib", str(lib), "--format", "q8_0"], "no symbol 'quantize_row_q8_0_ref'"),
        (["--lib", str(lib), "--format", "q4_0", "--quantize", "nope"], "no symbol 'nope'"),
        (["--lib", str(tmp_path / "missing.so"), "--format", "q4_0"], "no such file"),
        (["--lib", __file__, "--format", "q4_0"], "cannot load"),
        (["--format", "q4_0"], "give the kernel under test"),
        (["--exec", "prog {in}", "--format", "q4_0"], "no {out} placeholder"),
        (["--lib", str(lib), "--format", "q4_0", "--codebook", "lloyd-max"], "no option 'codebook'"),
    ]
    for argv, message in cases:
        assert main(["check", *argv, "--examples", "0"]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


@needs_cc
def test_a_flattened_symbolic_link_loads_the_file_it_names(build, capsys):
    # an archive or a copy leaves libx.so -> libx.so.0 as a text file holding "libx.so.0" (../shared/ggml's builds):
    # tbq check loads the file named, as the link would have, and the report names that file
    lib = build("q4_0.c")
    flat = lib.parent / "libflat.so"
    flat.write_text(lib.name)
    assert main(["check", "--lib", str(flat), "--format", "q4_0", "--examples", "0"]) == 0
    out = capsys.readouterr().out
    assert f"library {lib.name}" in out and "libflat" not in out, out
    text = lib.parent / "libtext.so"  # a text file naming nothing beside it is not a link: refused as before
    text.write_text("no such library")
    assert main(["check", "--lib", str(text), "--format", "q4_0", "--examples", "0"]) == 2
    assert "cannot load" in capsys.readouterr().err


@needs_cc
def test_a_kernel_that_dies_of_a_signal_is_an_error_naming_it_not_a_crash(build, capsys):
    # a build for another CPU dies of SIGILL in its first SIMD call (the ../shared builds do on an AVX2 machine):
    # tbq check calls every function once in a probe process first, so the check exits 2 with one line instead
    lib = str(build("crash.c"))
    cases = [
        (["--init", "init_ill"], "--init init_ill (libcrash.so) died of SIGILL (illegal instruction)"),
        (["--init", "init_ok", "--only", "quantize"], "quantize quantize_row_q8_0_ref (libcrash.so) died of SIGILL"),
        (["--only", "dequantize"], "dequantize dequantize_row_q8_0 (libcrash.so) died of SIGSEGV (segmentation fault)"),
        (["--dot", "ggml_vec_dot_q8_0_q8_0"], "--dot ggml_vec_dot_q8_0_q8_0 (libcrash.so) died of SIGILL"),
    ]
    errors = []
    for argv, message in cases:
        assert main(["check", "--format", "q8_0", "--lib", lib, *argv, "--blocks", "10", "--examples", "0"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)
        assert ("instructions this CPU lacks" in err) == ("SIGILL" in message), err
        errors.append(err.strip())
    # the guide pastes this line for ggml's build: the same words, with its names
    pasted = errors[0].replace("init_ill", "ggml_cpu_init").replace("libcrash.so", "libggml-cpu.so.0")
    assert pasted in DOC.read_text().splitlines(), pasted
    with pytest.raises(TargetError, match=r"init_ill .*SIGILL"):  # the library API says the same
        check_library(lib, "q8_0", init=["init_ill"], blocks=10, examples=0)
    # the probe names a missing symbol to the caller's own message, and a clean library passes it
    assert main(["check", "--format", "q8_0", "--lib", lib, "--init", "nope", "--examples", "0"]) == 2
    assert "no symbol 'nope' (--init)" in capsys.readouterr().err
    assert check_library(build("q8_0.c"), "q8_0", blocks=50, examples=0).ok


@needs_cc
def test_cli_only_one_direction_and_json_on_stdout(build, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lib = build("q8_0.c")
    assert (
        main(
            [
                "check",
                "--format",
                "q8_0",
                "--lib",
                str(lib),
                "--only",
                "dequantize",
                "--blocks",
                "300",
                "--examples",
                "0",
                "--json",
                "-",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert list(data["totals"]) == ["dequantize"] and "PASS" in out.err


def test_fuzz_without_hypothesis_is_a_clear_usage_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # `import hypothesis` now raises ImportError
    with pytest.raises(tbq.TbqError, match="needs the hypothesis package.*--examples 0"):
        check_kernel("q8_0", quantize=lambda x: tbq.quantize(x, "q8_0"), blocks=100)
    assert check_kernel("q8_0", quantize=lambda x: tbq.quantize(x, "q8_0"), blocks=100, examples=0).ok
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--format", "q8_0", "--exec", "prog {op} {in} {out}"]) == 2
    assert "needs the hypothesis package" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# output hygiene, provenance, init functions (issue 19)
# ---------------------------------------------------------------------------


@needs_cc
def test_nothing_is_written_in_the_working_directory_when_nothing_fails(build, tmp_path, monkeypatch, capsys):
    lib = build("q8_0.c")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--format", "q8_0", "--lib", str(lib), "--blocks", "300", "--examples", "5"]) == 0
    assert list(tmp_path.iterdir()) == []  # no .hypothesis/, no tbq-check-q8_0/
    # a read-only working directory does not stop a correct kernel from being checked
    tmp_path.chmod(0o555)
    try:
        assert (
            main(["check", "--format", "q8_0", "--lib", str(lib), "--blocks", "300", "--examples", "5", "--quiet"]) == 0
        )
    finally:
        tmp_path.chmod(0o755)
    assert "PASS" in capsys.readouterr().out


def test_zero_blocks_and_zero_examples_are_refused(capsys):
    with pytest.raises(tbq.TbqError, match="nothing would be checked"):
        check_kernel("q8_0", quantize=lambda x: tbq.quantize(x, "q8_0"), blocks=0, examples=0)
    assert (
        main(
            [
                "check",
                "--format",
                "q8_0",
                "--exec",
                "prog {in} {out}",
                "--only",
                "quantize",
                "--blocks",
                "0",
                "--examples",
                "0",
            ]
        )
        == 2
    )
    assert "checks nothing" in capsys.readouterr().err


@needs_cc
def test_the_repro_compile_line_runs_as_printed(build, tmp_path, capsys):
    lib = build("q4_0.c", defines=["SWAP_NIBBLES"])
    out = tmp_path / "ce"
    assert (
        main(
            [
                "check",
                "--format",
                "q4_0",
                "--lib",
                str(lib),
                "--only",
                "quantize",
                "--blocks",
                "300",
                "--examples",
                "0",
                "--out",
                str(out),
            ]
        )
        == 1
    )
    src = (out / "q4_0-quantize.c").read_text()
    line = next(ln for ln in src.splitlines() if ln.lstrip(" *").startswith("cc "))
    assert f"-Wl,-rpath,{lib.parent}" in line
    subprocess.run(line.lstrip(" *").replace("cc ", f"{CC} ", 1), shell=True, check=True, cwd=out)
    res = subprocess.run(["./repro"], cwd=out, capture_output=True, text=True)  # no LD_LIBRARY_PATH needed
    assert res.returncode == 1 and "differ from tbq" in res.stdout, res.stdout + res.stderr


@needs_cc
def test_provenance_names_the_file_that_defines_the_symbol_and_strict_lib_refuses_a_dependency(build, capsys):
    base = build("q8_0.c")
    wrapper = build("wrapper.c", libs=[base])
    report = check_library(wrapper, "q8_0", blocks=300, examples=0)
    assert report.ok
    pv = report.provenance["quantize"]
    assert pv == {
        "symbol": "quantize_row_q8_0_ref",
        "file": str(base.resolve()),
        "library": str(wrapper.resolve()),
        "elsewhere": True,
    }
    assert f"quantize_row_q8_0_ref from {base.resolve()}  (NOT the library given)" in report.text()
    assert any("is not defined in" in n and "--strict-lib" in n for n in report.notes)
    assert json.loads(report.to_json())["provenance"]["dequantize"]["file"] == str(base.resolve())
    own = check_library(base, "q8_0", blocks=300, examples=0)
    assert own.provenance["quantize"]["elsewhere"] is False and not own.notes
    with pytest.raises(TargetError, match="is defined in .*libq8_0.so, not in .*libwrapper.so"):
        check_library(wrapper, "q8_0", blocks=300, examples=0, strict_lib=True)
    assert main(["check", "--format", "q8_0", "--lib", str(wrapper), "--strict-lib", "--examples", "0"]) == 2
    assert "not in" in capsys.readouterr().err


@needs_cc
def test_a_kernel_that_needs_an_init_call_is_wrong_without_it_and_exact_with_it(build, capsys):
    lib = build("needs_init.c")
    without = check_library(lib, "q8_0", only="quantize", blocks=300, examples=0)
    assert not without.ok and without.counts()["wrong"] > 0
    with_init = check_library(lib, "q8_0", only="quantize", blocks=300, examples=0, init=["kernel_init"])
    assert with_init.ok and with_init.counts()["exact"] == with_init.counts()["blocks"]
    assert with_init.provenance["init kernel_init"]["symbol"] == "kernel_init"
    assert (
        main(
            [
                "check",
                "--format",
                "q8_0",
                "--lib",
                str(lib),
                "--only",
                "quantize",
                "--init",
                "kernel_init",
                "--blocks",
                "300",
                "--examples",
                "0",
                "--quiet",
            ]
        )
        == 0
    )
    assert (
        main(
            ["check", "--format", "q8_0", "--lib", str(lib), "--only", "quantize", "--init", "nope", "--examples", "0"]
        )
        == 2
    )
    assert "no symbol 'nope' (--init)" in capsys.readouterr().err


def test_an_exception_in_a_python_kernel_names_the_block_and_keeps_the_traceback():
    def picky(x):
        if (np.abs(x) > 3.9).any():
            raise OverflowError("my kernel cannot take values above 3.9")
        return tbq.quantize(x, "q8_0")

    with pytest.raises(TargetError) as info:
        check_kernel("q8_0", quantize=picky, blocks=400, examples=0)
    msg = str(info.value)
    assert "quantize raised OverflowError: my kernel cannot take values above 3.9 on block" in msg
    assert "(alone it raises too)" in msg and "Traceback (most recent call last)" in msg and "in picky" in msg
    assert isinstance(info.value.__cause__, OverflowError)


def test_a_kernel_returning_none_or_objects_is_told_so():
    with pytest.raises(
        TargetError, match=r"returned None; return the encoded rows \(uint8\), 136 bytes, shape \(1, 136\)"
    ):
        check_kernel("q8_0", quantize=lambda x: None, blocks=100, examples=0)
    with pytest.raises(TargetError, match="that NumPy reads as Python objects"):
        check_kernel("q8_0", dequantize=lambda d: [object()] * 32, blocks=100, examples=0)


@needs_cc
def test_accept_waives_a_known_deviation_and_the_next_distinct_one_is_found(build, tmp_path, capsys):
    lib = build("q4_0.c", defines=["SWAP_NIBBLES", "NEGATE_BIG"])
    first = check_library(lib, "q4_0", only="quantize", blocks=3000, examples=0)
    assert not first.ok and names(first, "quantize")[0] == "nibble_order"
    both = check_library(lib, "q4_0", only="quantize", blocks=3000, examples=0, accept=["nibble_order"])
    c = both.counts()
    assert not both.ok and c["accepted"] > 0 and 0 < c["wrong"] < first.counts()["wrong"], c
    assert c["accepted"] + c["wrong"] + c["equivalent"] + c["exact"] == c["blocks"]
    ce = both.counterexamples["quantize"]
    assert np.abs(ce.input.reshape(-1, 32)[ce.block]).max() > 64  # the second bug's block, not a nibble-swapped one
    (waived,) = [g for g in both.diagnoses if g.scope == "accepted"]
    assert waived.name == "nibble_order" and waived.evidence[-1].startswith("e.g. the block with input ")
    assert "wrong blocks waived by --accept" not in both.verdict() and "accepted" in both.table()
    # the blocks the second bug does not touch are explained by the first: waiving it leaves only the big blocks wrong
    assert check_library(
        build("q4_0.c", defines=["SWAP_NIBBLES"]),
        "q4_0",
        only="quantize",
        blocks=3000,
        examples=0,
        accept=["nibble_order"],
    ).ok
    assert (
        main(
            [
                "check",
                "--format",
                "q4_0",
                "--lib",
                str(lib),
                "--only",
                "quantize",
                "--blocks",
                "3000",
                "--examples",
                "0",
                "--accept",
                "nibble_order",
                "--out",
                str(tmp_path / "ce"),
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert "quantize: " in out and "accepted blocks: " in out and "waived by accept='nibble_order'" in out
    with pytest.raises(tbq.TbqError, match="cannot accept 'wrong'"):
        check_library(lib, "q4_0", blocks=100, examples=0, accept=["wrong"])
    assert main(["check", "--format", "q4_0", "--lib", str(lib), "--accept", "nope", "--examples", "0"]) == 2
    assert "cannot accept 'nope'" in capsys.readouterr().err


@needs_cc
def test_accept_a_class_lets_exact_look_past_it(build):
    lib = build("q8_0.c", defines=["ROUND_HALF_EVEN"])
    assert not check_library(lib, "q8_0", only="quantize", blocks=2000, examples=0, exact=True).ok
    r = check_library(lib, "q8_0", only="quantize", blocks=2000, examples=0, exact=True, accept=["tie_rule"])
    assert r.ok and r.counts()["tie_rule"] > 0, r.verdict()


@needs_cc
def test_a_body_that_flushes_subnormals_gives_a_minimal_failing_row_and_a_repro_that_exits_1(
    build, tmp_path, monkeypatch
):
    import tbq.check.fuzz as fuzz

    monkeypatch.setattr(
        fuzz, "SHRINK_SECONDS", 2.0
    )  # hypothesis's shrink of a length-dependent failure is slow; ours cuts it
    lib = build("simd_tail.c")
    report = check_library(
        lib, "bf16", quantize="ggml_fp32_to_bf16_row_ref", only="quantize", blocks=2000, examples=20, out=tmp_path
    )
    assert not report.ok and report.counts()["wrong"] > 0
    ce = report.counterexamples["quantize"]
    assert ce.classification == "wrong" and ce.input.size == 16, (ce.input.size, ce.how)  # one pass of the 16-wide body
    assert "the block alone passes: the minimal failing row is 16 values (16 blocks" in ce.how
    x = ce.input[ce.block]
    assert x != 0 and abs(x) < np.finfo(np.float32).tiny  # the subnormal the body flushed
    assert "(subnormal)" in "\n".join(ce.lines())
    with np.load(tmp_path / "bf16-quantize.npz") as z:
        assert z["input"].size == 16 and not np.array_equal(z["expected"], z["got"])
    line = next(
        ln for ln in (tmp_path / "bf16-quantize.c").read_text().splitlines() if ln.lstrip(" *").startswith("cc ")
    )
    subprocess.run(line.lstrip(" *").replace("cc ", f"{CC} ", 1), shell=True, check=True, cwd=tmp_path)
    res = subprocess.run(["./repro"], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 1 and "differ from tbq" in res.stdout, res.stdout


# ---------------------------------------------------------------------------
# dot-product kernels
# ---------------------------------------------------------------------------


@needs_cc
@pytest.mark.parametrize("fmt", ["q4_0", "q8_0", "q4_1", "mxfp4"])
def test_dot_products_correct_exact_or_within_the_bound_and_broken_ones_wrong(build, fmt, tmp_path, capsys):
    sym = f"ggml_vec_dot_{fmt}_{tbq.get_format(fmt).checker.vec_dot_type}"  # q4_1 pairs with q8_1 (its stored sum s)
    good = check_library(build("vec_dot.c"), fmt, dot=sym, blocks=3000)
    c = good.counts("dot")
    assert good.ok and c["wrong"] == 0 and c["exact"] > 0 and c["blocks"] > 1000, c
    assert good.provenance["dot"]["symbol"] == sym and "dot" in good.table()
    for variant in ("WRONG_PARTIAL", "DROP_TAIL"):
        lib = build("vec_dot.c", defines=[variant])
        bad = check_library(lib, fmt, dot=sym, blocks=3000, out=tmp_path / variant)
        assert not bad.ok and bad.counts("dot")["wrong"] > 0.5 * bad.counts("dot")["blocks"], bad.counts("dot")
        ce = bad.counterexamples["dot"]
        assert ce.n == 32, (variant, ce.n, ce.how)  # the shortest failing call: one block
        assert variant != "DROP_TAIL" or ce.got == 0.0  # its only block dropped
        assert abs(ce.got - ce.expected) > ce.bound
        line = next(
            ln
            for ln in (tmp_path / variant / f"{fmt}-dot.c").read_text().splitlines()
            if ln.lstrip(" *").startswith("cc ")
        )
        subprocess.run(line.lstrip(" *").replace("cc ", f"{CC} ", 1), shell=True, check=True, cwd=tmp_path / variant)
        assert subprocess.run(["./repro"], cwd=tmp_path / variant, capture_output=True).returncode == 1
    assert main(["check", "--format", fmt, "--lib", str(build("vec_dot.c")), "--dot", sym, "--blocks", "500"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert (
        main(
            [
                "check",
                "--format",
                fmt,
                "--lib",
                str(build("vec_dot.c", defines=["DROP_TAIL"])),
                "--dot",
                sym,
                "--blocks",
                "500",
                "--out",
                str(tmp_path / "cli"),
            ]
        )
        == 1
    )


def test_dot_of_a_python_kernel_and_formats_without_an_exact_form(capsys):
    def dot(x, y, n):
        return float(np.dot(tbq.dequantize(x, "q8_0").astype(np.float64), tbq.dequantize(y, "q8_0").astype(np.float64)))

    r = check_kernel("q8_0", dot=dot, blocks=500, examples=40)
    assert r.ok and r.counts("dot")["exact"] == r.counts("dot")["blocks"]
    (fz,) = [ph for ph in r.phases if ph.phase == "fuzz"]
    assert fz.blocks == 40 and "40 hypothesis examples" in r.table()  # one dot product an example

    def loses_the_last_value(x, y, n):  # wrong only where the last value of the row is non-zero
        a, b = tbq.dequantize(x, "q8_0").astype(np.float64), tbq.dequantize(y, "q8_0").astype(np.float64)
        return float(np.dot(a[:-1], b[:-1]))

    bad = check_kernel("q8_0", dot=loses_the_last_value, blocks=1, examples=200)
    assert not bad.ok and "(stopped at the first failure; shrunk)" in bad.table()
    r = check_kernel("q8_0", dot=lambda x, y, n: dot(x, y, n) * (1 + 2.0**-10), blocks=500)
    assert not r.ok and "dot: first minimal wrong dot product" in r.text()
    with pytest.raises(tbq.TbqError, match="does not check f16 dot products"):
        check_kernel("f16", dot=dot, blocks=10)
    with pytest.raises(tbq.TbqError, match="pairs them only with a right operand that stores its block sum"):
        check_kernel("q4_1", dot=dot, rhs="q8_0", blocks=10)  # m * s needs q8_1's s
    with pytest.raises(tbq.TbqError, match="do not pair"):
        check_kernel("q8_0", dot=dot, rhs="q8_K", blocks=10)  # an integer pair needs equal blocks


def _vnni_q5_0(x, y, n):
    """ggml_vec_dot_q5_0_q8_0_generic as GCC 12.2 auto-vectorises it with AVX-512 VNNI (the ../shared builds):
    ``vpdpbusd`` multiplies the q5_0 codes ``((qs & 15) | qh << 4) - 16`` as unsigned bytes, so a negative code
    counts as ``code + 256``; then ``sumf = fma(dx * dy, sumi, sumf)`` block by block."""
    q5, q8 = tbq.get_format("q5_0"), tbq.get_format("q8_0")
    (cx, dx), (cy, dy) = q5.checker.dot_parts(x.reshape(-1, 22)), q8.checker.dot_parts(y.reshape(-1, 34))
    sumi = (np.where(cx < 0, cx + 256, cx) * cy).sum(axis=1)
    acc = np.float32(0)
    for si, a, b in zip(sumi, dx, dy, strict=True):
        acc = _fma32(np.float32(a * b), np.float32(si), acc)
    return acc


def test_a_dot_check_accepts_unsigned_codes_and_goes_on_to_the_next_failure(capsys):
    # the VNNI-miscompiled kernel passes once its one known deviation is waived: every wrong call was that reading,
    # counted accepted, and the diagnosis still shown; a second bug on top of it (the last block dropped) still fails
    r = check_kernel("q5_0", dot=_vnni_q5_0, blocks=400, examples=30, accept="unsigned_codes")
    c = r.counts("dot")
    assert r.ok and c["wrong"] == 0 and c["accepted"] > c["blocks"] // 2, c
    assert [g.name for g in r.diagnoses] == ["unsigned_codes"] and "waived by --accept" in r.verdict()

    def also_drops_the_last_block(x, y, n):
        return _vnni_q5_0(x[:-22], y[:-34], n - 32) if n > 32 else np.float32(0)

    bad = check_kernel("q5_0", dot=also_drops_the_last_block, blocks=400, examples=0, accept=["unsigned_codes"])
    assert not bad.ok and bad.counts("dot")["wrong"] > 0
    assert check_kernel("q5_0", dot=_vnni_q5_0, blocks=100, examples=0).counts("dot")["accepted"] == 0
    with pytest.raises(tbq.TbqValueError, match="cannot accept 'nibble_order' in a dot-product check"):
        check_kernel("q5_0", dot=_vnni_q5_0, blocks=10, accept="nibble_order")
    # the CLI: --accept unsigned_codes goes with --dot, a row diagnosis does not (exit 2 before loading anything)
    argv = ["check", "--format", "q8_0", "--lib", "nowhere.so", "--dot", "ggml_vec_dot_q8_0_q8_0"]
    assert main([*argv, "--accept", "nibble_order"]) == 2
    assert "cannot accept 'nibble_order' in a dot-product check" in capsys.readouterr().err
    assert main([*argv, "--accept", "unsigned_codes"]) == 2  # accepted; then the library is missing
    assert "cannot load nowhere.so" in capsys.readouterr().err


def _fma32(a, b, c):
    """float32 ``fma(a, b, c)``, one rounding: ``a * b`` is exact in float64, ``+ c`` too by TwoSum's error term,
    which decides a float64 sum that sits exactly halfway between two float32 values."""
    p = float(a) * float(b)
    s = p + float(c)
    bb = s - p
    err = (p - (s - bb)) + (float(c) - bb)
    r = np.float32(s)
    if err and float(r) != s:
        lo, hi = sorted((float(r), float(np.nextafter(r, np.float32(np.inf if s > float(r) else -np.inf)))))
        if s - lo == hi - s:  # a float64 tie that the exact sum breaks
            r = np.float32(hi if err > 0 else lo)
    return r


def test_dot_diagnosis_names_signed_codes_multiplied_as_unsigned_bytes():
    r = check_kernel("q5_0", dot=_vnni_q5_0, blocks=400, examples=0)  # the fuzz phase's calls are not kept
    c = r.counts("dot")
    assert not r.ok and c["wrong"] > c["blocks"] // 2, c
    (g,) = r.diagnoses
    assert g.name == "unsigned_codes" and g.direction == "dot"
    assert g.title.startswith("the left operand's (q5_0) negative integer codes were multiplied as unsigned bytes")
    assert f"{min(c['wrong'], tbq.check.dot.KEEP_CALLS):,} of " in g.evidence[0]
    assert "diagnosis:\n    the left operand's (q5_0)" in r.text() and "no known pattern" not in r.text()
    # the right operand read unsigned instead: named as such; a wrong scale is not this pattern
    q5, q8 = tbq.get_format("q5_0"), tbq.get_format("q8_0")

    def right_unsigned(x, y, n):
        (cx, dx), (cy, dy) = q5.checker.dot_parts(x.reshape(-1, 22)), q8.checker.dot_parts(y.reshape(-1, 34))
        return float(((cx * np.where(cy < 0, cy + 256, cy)).sum(axis=1) * dx * dy).sum())

    (g,) = check_kernel("q5_0", dot=right_unsigned, blocks=200).diagnoses
    assert g.title.startswith("the right operand's (q8_0) negative integer codes")
    off = check_kernel("q5_0", dot=lambda x, y, n: _vnni_q5_0(x, y, n) * 0 + 1.5, blocks=200)
    assert not off.ok and off.diagnoses == [] and "no known pattern matches" in off.text()


def _seq_fma(left, right):
    """A float32 vec_dot on decoded values, one accumulator, as the fork's TBQ x q8_K kernel (FMA: one rounding)."""

    def dot(x, y, n):
        a = left.decode(x.reshape(-1, left.type_size)).reshape(-1).astype(np.float64)
        cy, dy = right.checker.dot_parts(y.reshape(-1, right.type_size))
        b = (cy.astype(np.float32) * np.repeat(dy, right.block_size).astype(np.float32).reshape(cy.shape)).reshape(-1)
        acc = np.float32(0)
        for i in range(n):  # fma(a, b, acc): the product exact in float64 (48 bits), one rounding to float32
            acc = np.float32(float(acc) + a[i] * float(b[i]))
        return acc

    return dot


@pytest.mark.parametrize("fmt", ["tbq4_0", "tbq3_0"])
def test_dot_of_a_rotated_format_against_q8_K_works_value_by_value(fmt):
    # TBQ has no integer form (its values come out of an inverse rotation): the reference takes its float32
    # decoded values against q8_K's codes * d, 256-value units (two TBQ blocks, one q8_K block) a call
    left = tbq.get_format(fmt, codebook="turboq-mtp")
    right = tbq.get_format("q8_K")
    assert left.checker.vec_dot_type == "q8_k" and tbq.check.dot.pair_unit(left, right) == 256
    r = check_kernel(left, dot=_seq_fma(left, right), blocks=200)
    c = r.counts("dot")
    assert r.ok and c["wrong"] == 0 and c["fragile"] > 0 and c["blocks"] > 30, c
    assert "256-value units a call" in r.table()
    assert not check_kernel(left, dot=_seq_fma(left, right), blocks=200, exact=True).ok
    # the other table set (centroids a few percent apart): beyond the accumulation bound on part of the rows
    other = tbq.get_format(fmt, codebook="lloyd-max")
    bad = check_kernel(left, dot=_seq_fma(other, right), blocks=200)
    assert not bad.ok and bad.counts("dot")["wrong"] > 0
    ce = bad.counterexamples["dot"]
    assert ce.n == 256 and len(ce.per_block) == 1 and ce.per_block[0][0] is None
    assert "right block 0: exact sum of its values' products" in "\n".join(ce.lines())


def _nvfp4_dot(scale_of=lambda s: s):
    """``ggml_vec_dot_nvfp4_q8_0_generic`` in float32: per 16-value sub-block ``s`` of a 64-value nvfp4 block, the
    integer sum of ``kvalues_mxfp4[c]`` times half ``s % 2`` of q8_0 block ``s // 2``, then ``sumf += dy * d * sumi``
    with ``d`` the sub-block's scale (``scale_of(s)``: the sub-block whose scale is read)."""
    from tbq.formats.fp4 import E2M1_VALUES, ue4m3_to_f32

    nv = tbq.get_format("nvfp4")

    def dot(x, y, n):
        xb = np.frombuffer(bytes(x), np.uint8).reshape(-1, nv.type_size)
        yb = np.frombuffer(bytes(y), np.uint8).reshape(-1, 34)
        vx = E2M1_VALUES.astype(np.int64)[nv.fields(xb)["qs"]].reshape(-1, 4, 16)
        cy = yb[:, 2:].view(np.int8).astype(np.int64).reshape(-1, 4, 16)  # two q8_0 blocks an nvfp4 block
        dy = yb[:, :2].copy().view("<f2").astype(np.float32).reshape(-1, 2)
        dd = ue4m3_to_f32(xb[:, :4])
        sumf = np.float32(0)
        for ib in range(xb.shape[0]):
            for s in range(4):
                sumi = np.float32((vx[ib, s] * cy[ib, s]).sum())
                sumf = np.float32(sumf + np.float32(dy[ib, s // 2] * dd[ib, scale_of(s)]) * sumi)
        return float(sumf)

    return dot


def test_dot_of_nvfp4_against_q8_0_takes_its_sub_block_scales_value_by_value():
    # ggml converts the other operand to q8_0 (ggml_vec_dot_nvfp4_q8_0): two q8_0 blocks against one nvfp4 block,
    # each 16-value sub-block with its own UE4M3 scale, so the reference goes value by value (64-value units)
    left = tbq.get_format("nvfp4")
    assert left.checker.vec_dot_type == "q8_0" and left.checker.dot_parts(np.zeros((1, 36), np.uint8)) is None
    assert tbq.check.dot.pair_unit(left, tbq.get_format("q8_0")) == 64
    r = check_kernel(left, dot=_nvfp4_dot(), blocks=400)
    c = r.counts("dot")
    assert r.ok and c["wrong"] == 0 and c["exact"] > 0 and c["blocks"] > 80, c
    assert "64-value units a call" in r.table()
    # a kernel that scales each sub-block by its neighbour's scale (s ^ 1: the other half of the q8_0 block)
    bad = check_kernel(left, dot=_nvfp4_dot(lambda s: s ^ 1), blocks=400)
    assert not bad.ok and bad.counts("dot")["wrong"] > 0.5 * bad.counts("dot")["blocks"], bad.counts("dot")
    ce = bad.counterexamples["dot"]
    assert ce.n == 64 and len(ce.per_block) == 2 and all(sumi is None for sumi, _ in ce.per_block)
    assert abs(ce.got - ce.expected) > ce.bound


def test_the_value_path_reference_is_the_exact_sum():
    # a float32 d (q8_K) times a 32-bit product x_j * c_j needs 56 bits: the split keeps every term exact
    from fractions import Fraction

    left, right = tbq.get_format("tbq4_0"), tbq.get_format("q8_K")
    rng = np.random.default_rng(5)
    x = left.encode(rng.standard_normal((2, 128)).astype(np.float32))
    y = right.encode(rng.standard_normal((1, 256)).astype(np.float32) * np.float32(3.3))
    exact, bound = tbq.check.dot.reference_dot(left, right, x, y)
    xv = left.decode(x).reshape(-1)
    cy, dy = right.checker.dot_parts(y)
    want = sum(Fraction(float(a)) * int(c) * Fraction(float(dy[0])) for a, c in zip(xv, cy.reshape(-1), strict=True))
    assert exact == np.float32(float(want)) and 0 < bound < 1e-3 * float(np.abs(xv).sum())


def _twin_builds(root: Path) -> list[Path]:
    """Two "builds" as ggml's are made: ``<b>/libtwin_cpu.so`` needs ``libtbqtwin.so.0`` (q8_0's row functions) and
    finds it beside itself (``$ORIGIN``); the same soname in both folders, as ``libggml-base.so.0`` is."""
    if CC is None:
        pytest.skip("no C compiler (gcc or cc) on PATH")
    out = []
    for b in ("a", "b"):
        d = root / b
        d.mkdir()
        base = d / "libtbqtwin.so.0"
        flags = ["-O2", "-shared", "-fPIC", "-ffp-contract=off", f"-I{C_DIR}"]
        subprocess.run(
            [CC, *flags, "-Wl,-soname,libtbqtwin.so.0", str(C_DIR / "q8_0.c"), "-o", str(base), "-lm"],
            check=True,
            capture_output=True,
        )
        (d / "cpu.c").write_text("int twin_cpu_marker = 1;\n")
        cpu = d / "libtwin_cpu.so"
        subprocess.run(
            [
                CC,
                "-shared",
                "-fPIC",
                str(d / "cpu.c"),
                "-o",
                str(cpu),
                "-Wl,--no-as-needed",
                f"-L{d}",
                "-l:libtbqtwin.so.0",
                "-Wl,-rpath,$ORIGIN",
            ],
            check=True,
            capture_output=True,
        )
        out.append(cpu)
    return out


def test_a_second_build_whose_base_library_the_process_already_holds_is_refused(tmp_path, capsys):
    # the loader binds a needed soname to the object of that name already loaded: build b's CPU library would run
    # on build a's base library, a mixture no one runs; tbq refuses it (one line, naming both files)
    a, b = _twin_builds(tmp_path)
    deps = tbq.check.sharedlib.elf_dependencies(b)
    assert deps.needed[0] == "libtbqtwin.so.0" and deps.search == (str(b.parent),), deps
    r = check_library(a, "q8_0", blocks=20, examples=0)
    assert r.ok and r.provenance["quantize"]["file"] == str((a.parent / "libtbqtwin.so.0").resolve())
    with pytest.raises(TargetError, match=r"needs libtbqtwin\.so\.0, which this process already loaded from .*/a/lib"):
        check_library(b, "q8_0", blocks=20, examples=0)
    with pytest.raises(TargetError, match="another build"):
        check_library(b, "q8_0", dot="ggml_vec_dot_q8_0_q8_0", blocks=20)
    capsys.readouterr()
    assert main(["check", "--lib", str(b), "--format", "q8_0", "--examples", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "check each build in its own process" in err and "Traceback" not in err
    assert check_library(a, "q8_0", blocks=20, examples=0).ok  # the same build again is fine


def test_the_elf_reader_never_raises_on_bytes(tmp_path):
    a, _ = _twin_builds(tmp_path)
    data = a.read_bytes()
    rng = np.random.default_rng(3)
    cuts = [0, 3, 4, 16, 52, 63, 64, 200, len(data) // 2, len(data) - 1]
    for i, n in enumerate(cuts + [len(data)] * 40):
        blob = bytearray(data[:n])
        if n == len(data) and i > len(cuts):  # flip bytes of the header, program headers and dynamic section
            for j in rng.integers(0, min(len(blob), 4096), 8):
                blob[j] = int(rng.integers(0, 256))
        f = tmp_path / f"cut{i}.so"
        f.write_bytes(bytes(blob))
        got = tbq.check.sharedlib.elf_dependencies(f)
        assert got is None or all(isinstance(x, str) for x in got.needed + got.search)
    assert tbq.check.sharedlib.elf_dependencies(tmp_path / "cut0.so") is None  # empty: not ELF


# ---------------------------------------------------------------------------
# the real ggml builds (../shared/ggml: by hand elsewhere; here where the folder exists)
# ---------------------------------------------------------------------------

GGML = Path(__file__).resolve().parents[1].parent / "shared" / "ggml"


#: The CPU flags ../shared/ggml/README.md names for its ``lib-avx512/`` builds.
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512_vnni", "avx512_bf16")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}


def _ggml_cpu(build_name: str, folder: str = "lib") -> Path:
    """``libggml-cpu.so.0`` of a ../shared build: ``folder`` ``"lib"`` (portable, AVX2: every machine kind here) or
    ``"lib-avx512"`` (skipped, with the reason, on a CPU without the flags it was built for)."""
    lib = GGML / build_name / folder / "libggml-cpu.so.0"
    if not lib.is_file():
        pytest.skip(
            f"{lib} is absent: the real ggml builds live outside the repo (../shared/ggml), not on users' machines"
        )
    if folder == "lib-avx512":
        missing = [f for f in AVX512_FLAGS if f not in _cpu_flags()]
        if missing:
            pytest.skip(f"{lib} needs the CPU flags {' '.join(missing)}, which this CPU lacks")
    why = _why_it_cannot_run(str(lib))
    if why:
        pytest.skip(f"{lib} cannot run on this CPU: {why}")
    return lib


@functools.cache
def _why_it_cannot_run(lib: str) -> str:
    """``""`` when ``lib`` loads and its ``ggml_cpu_init`` returns here, else why not; tried in a child process.

    The builds use the AVX-512 instructions of the machine they were built on: on a CPU without them the first
    call dies of SIGILL, which would end the whole test session, so the child takes it.
    """
    code = f"import ctypes; ctypes.CDLL({lib!r}).ggml_cpu_init()"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if r.returncode == 0:
        return ""
    if r.returncode < 0:
        return f"ggml_cpu_init died of signal {-r.returncode} (built for AVX-512 CPUs)"
    return f"it does not load ({' '.join(r.stderr.split()[-12:])})"


def _skip_on_sigill(returncode: int, what: str, stderr: str = "") -> None:
    """Skip, with the reason, when a child running a ../shared build died of SIGILL: ``ggml_cpu_init`` ran
    (``_why_it_cannot_run``), but a kernel uses an instruction this CPU lacks (the builds target the Intel machine
    they were built on; an AMD EPYC with AVX-512 runs ``ggml_cpu_init`` and then stops in the f16 and q8_0 kernels).
    tbq's kernels are compiled for the host's own features (``tbq.kernels._target_has``), so a SIGILL there comes
    from the build, unless ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` claim features the CPU lacks: then no
    skip. tbq check's own probe process (``tbq.check.sharedlib.probe_calls``) turns the build's SIGILL into an error
    saying so (``stderr``): that skips too."""
    died = returncode == -signal.SIGILL or (returncode != 0 and "died of SIGILL" in stderr)
    if died and not (os.environ.get("NUMBA_CPU_NAME") or os.environ.get("NUMBA_CPU_FEATURES")):
        pytest.skip(f"{what}: the ../shared ggml build died of SIGILL on this CPU (built for another instruction set)")


def _alone(fn) -> None:
    """Run ``fn``, a function of this file, in a child process and fail with its traceback if it fails.

    Each real build gets a process of its own: the builds share the soname ``libggml-base.so.0``, and a process
    that loaded one build's base library cannot load the other's CPU library (tbq refuses it: the loader would
    bind it to the first build's base; ``test_a_second_build_..._is_refused``).
    """
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_check; test_check.{fn.__name__}()"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1200)
    _skip_on_sigill(r.returncode, fn.__name__, r.stderr)
    assert r.returncode == 0, f"{fn.__name__} in a child process (exit {r.returncode}):\n{r.stderr[-6000:]}"


def test_real_ggml_cpu_library_provenance_simd_q8_0_tie_rule_and_dot_products():
    _ggml_cpu("upstream")  # skips here, with the reason, where the build is absent or cannot run
    _alone(_upstream_checks)


def _upstream_checks():
    lib = GGML / "upstream" / "lib" / "libggml-cpu.so.0"
    ref = check_library(lib, "q8_0", blocks=2000, examples=0)
    assert (
        ref.ok
        and ref.provenance["quantize"]["elsewhere"]
        and ref.provenance["quantize"]["file"].endswith("libggml-base.so.0")
    )
    with pytest.raises(TargetError, match="not in"):
        check_library(lib, "q8_0", blocks=100, examples=0, strict_lib=True)
    simd = check_library(
        lib, "q8_0", quantize="quantize_row_q8_0", only="quantize", init=["ggml_cpu_init"], blocks=20000, examples=0
    )
    c = simd.counts()
    assert simd.ok and c["tie_rule"] > 0 and c["wrong"] == 0, c  # ggml's SIMD q8_0 rounds exact ties to even
    (g,) = [g for g in simd.diagnoses if g.scope == "tie_rule"]
    assert "ties are rounded half to even" in g.title and "where the spec rounds half away from zero" in g.title
    assert not check_library(
        lib,
        "q8_0",
        quantize="quantize_row_q8_0",
        only="quantize",
        init=["ggml_cpu_init"],
        blocks=20000,
        examples=0,
        exact=True,
    ).ok
    for fmt in ("q4_0", "q8_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4", "nvfp4"):
        rhs = tbq.get_format(fmt).checker.vec_dot_type
        for sym in (f"ggml_vec_dot_{fmt}_{rhs}", f"ggml_vec_dot_{fmt}_{rhs}_generic"):
            r = check_library(lib, fmt, dot=sym, init=["ggml_cpu_init"], blocks=2000)
            assert r.provenance["dot"]["file"] == str(lib.resolve()), sym
            assert r.ok, (sym, r.verdict())  # the portable build's q5_0 generic loop included (see below)


def test_real_avx512_build_q5_0_generic_dot_is_miscompiled_and_diagnosed():
    # GCC 12.2 vectorised ggml_vec_dot_q5_0_q8_0_generic's scalar loop with AVX-512 VNNI vpdpbusd in the lib-avx512
    # build (the portable lib/ build, without VNNI, is right: the loop above passes there)
    _ggml_cpu("upstream", "lib-avx512")
    _alone(_avx512_q5_0_checks)


def _avx512_q5_0_checks():
    lib = GGML / "upstream" / "lib-avx512" / "libggml-cpu.so.0"
    sym = "ggml_vec_dot_q5_0_q8_0_generic"
    r = check_library(lib, "q5_0", dot=sym, init=["ggml_cpu_init"], blocks=2000)
    # vpdpbusd reads the signed codes ((qs & 15) | qh << 4) - 16 as unsigned bytes (the disassembly shows it); tbq's
    # model of that, _vnni_q5_0, gives the same counterexample (sumi -6672: 0.38734 exact, -5.81014 here)
    assert not r.ok and [g.name for g in r.diagnoses] == ["unsigned_codes"], r.text()
    assert "left operand's (q5_0)" in r.diagnoses[0].title
    waived = check_library(lib, "q5_0", dot=sym, init=["ggml_cpu_init"], blocks=2000, accept="unsigned_codes")
    assert waived.ok and waived.counts("dot")["accepted"] > 0, waived.text()  # nothing else is wrong
    assert check_library(lib, "q5_0", dot="ggml_vec_dot_q5_0_q8_0", init=["ggml_cpu_init"], blocks=2000).ok


def test_real_fork_tbq_dot_products_against_q8_K():
    # the fork's ggml_vec_dot_tbq{4,3}_0_q8_K: its own dequantize_row_tbq*_0 (the fork's tables), then one float32
    # FMA accumulator over the row: within the accumulation bound, never wrong; the fitted tables are refused
    _ggml_cpu("fork")
    _alone(_fork_checks)


def _fork_checks():
    lib = GGML / "fork" / "lib" / "libggml-cpu.so.0"
    for fmt in ("tbq4_0", "tbq3_0"):
        sym = f"ggml_vec_dot_{fmt}_q8_K"
        r = check_library(lib, fmt, dot=sym, codebook="turboq-mtp", init=["ggml_cpu_init"], blocks=2000)
        c = r.counts("dot")
        assert r.ok and c["wrong"] == 0 and c["blocks"] > 300, (sym, r.verdict())
        bad = check_library(lib, fmt, dot=sym, codebook="lloyd-max", init=["ggml_cpu_init"], blocks=400)
        assert not bad.ok, sym


# ---------------------------------------------------------------------------
# docs/checking-kernels.md: its pasted outputs are what the commands print
# ---------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "checking-kernels.md"
_TIME = re.compile(r"\b\d+\.\d+ s\b")


def _doc_runs() -> list[tuple[str, list[str]]]:
    """``(command, pasted lines)`` of every ```text block of the guide that starts with ``$ tbq check`` (but
    ``--attention``, whose runs tests/test_check_attention.py replays)."""
    runs, block = [], None
    for line in DOC.read_text().splitlines():
        if line.startswith("```text"):
            block = []
        elif line.startswith("```") and block is not None:
            if block and block[0].startswith("$ tbq check ") and "--attention" not in block[0]:
                runs.append((block[0][2:], block[1:]))  # --attention runs: tests/test_check_attention.py
            block = None
        elif block is not None:
            block.append(line)
    return runs


def _normal(line: str) -> str:
    return _TIME.sub("_ s", " ".join(line.split()))


def _pasted_lines_match(pasted: list[str], printed: str) -> None:
    """Every pasted line is a printed line, in order: times masked, ``...`` standing for an elided part (a whole
    line, a path's start, or a line's end), the fuzz phase's counts (hypothesis's own draws) not compared."""
    out = [_normal(ln) for ln in printed.splitlines()]
    fuzzed = any(_normal(ln).split()[1:2] == ["fuzz"] for ln in pasted)
    i = 0
    for want in pasted:
        w = _normal(want)
        if w in ("", "...") or w.startswith("..."):
            continue
        if fuzzed and want.startswith(" "):  # a counterexample's details: hypothesis shrinks for at most 10 s
            continue
        if w.split()[1:2] == ["fuzz"] or (fuzzed and w.split()[1:2] == ["total"]):
            w = " ".join(w.split()[:2]) + " ..."  # direction and phase only: hypothesis's draws differ by version
        elif fuzzed and w.split()[0] in ("PASS:", "FAIL:"):
            w = w.split()[0] + " ..."  # its counts include the fuzz phase's
        parts = [re.escape(p) for p in w.split("...")]
        if fuzzed and w.split()[1:2] not in (["golden"], ["bytes"]):  # counts that include the fuzz phase's
            parts = [re.sub(r"\d[\d,]*", lambda _: r"\d[\d,]*", q) for q in parts]
        pat = re.compile(".*".join(parts) + ("" if w.endswith("...") else "$"))
        while i < len(out) and not pat.match(out[i]):
            i += 1
        assert i < len(out), f"docs/checking-kernels.md: {want!r} is not printed (in order) by the command"
        i += 1


def test_the_guide_pastes_every_kind_of_check():
    cmds = [c for c, _ in _doc_runs()]
    assert len(cmds) >= 6, cmds  # the two-bug kernel, the ggml build's rows, SIMD rows and three dot products
    assert sum("--dot" in c for c in cmds) >= 3 and any("--init" in c and "--quantize" in c for c in cmds)


@pytest.mark.parametrize("cmd, pasted", _doc_runs(), ids=lambda v: v.split()[-1] if isinstance(v, str) else "")
def test_the_guides_pasted_outputs_are_what_the_commands_print(build, capsys, tmp_path, monkeypatch, cmd, pasted):
    monkeypatch.chdir(tmp_path)  # counterexample folders land here
    args = cmd.split()[1:]
    for i, a in enumerate(args):
        m = re.fullmatch(r"\./lib([a-z0-9_]+?)((?:_[A-Z]+)*)\.so", a)
        if m:  # the test suite's kernels, ./lib<source>_<DEFINES>.so as build() names them
            src, tail = m.group(1), m.group(2).lstrip("_")
            known = set(re.findall(r"#ifn?def (\w+)", (C_DIR / f"{src}.c").read_text()))
            names = [d for d in sorted(known, key=tail.find) if d in tail]
            assert "_".join(names) == tail, (a, names)
            args[i] = str(build(f"{src}.c", defines=names))
        elif a.rsplit("/", 1)[-1] in ("libggml-cpu.so", "libggml-base.so"):  # lib/ or lib-avx512/<name>
            build_name = "fork" if "--format tbq" in cmd else "upstream"
            folder, _, name = a.rpartition("/")
            args[i] = str(_ggml_cpu(build_name, folder or "lib").parent / f"{name}.0")
    if any(a.startswith(str(GGML)) for a in args):  # a real build: a process of its own (see _alone)
        r = subprocess.run([sys.executable, "-m", "tbq", *args], capture_output=True, text=True, timeout=1200)
        _skip_on_sigill(r.returncode, " ".join(cmd.split()[:4]), r.stderr)
        assert r.returncode in (0, 1), r.stderr
        printed = r.stdout
    else:
        capsys.readouterr()
        main(args)
        printed = capsys.readouterr().out
    _pasted_lines_match(pasted, printed.replace(str(GGML), "..."))


def test_the_settings_are_one_frozen_record_validated_once_and_keywords_still_work():
    """check_kernel's keywords and settings=CheckSettings(...) give the same report settings; a CheckSettings is
    frozen and refuses a bad value at construction with the message run_check gave; both ways at once, or a keyword
    that is not a setting, is refused."""
    import dataclasses

    from tbq.check import CheckSettings, check_kernel, check_target
    from tbq.check.targets import CallableTarget
    from tbq.errors import ConfigError, TbqValueError

    enc = lambda x: tbq.quantize(x, "q4_0")  # noqa: E731
    by_keywords = check_kernel("q4_0", quantize=enc, blocks=64, examples=0, seed=3, accept="fragile")
    s = CheckSettings(blocks=64, examples=0, seed=3, accept="fragile")
    by_settings = check_kernel("q4_0", quantize=enc, settings=s)
    assert by_keywords.settings == by_settings.settings
    assert by_keywords.settings["accept"] == ["fragile"] and by_keywords.settings["blocks"] == 64
    assert s.accept == frozenset({"fragile"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.blocks = 1  # type: ignore[misc]
    with pytest.raises(TbqValueError, match="blocks must be an integer >= 0"):
        CheckSettings(blocks=-1)
    with pytest.raises(TbqValueError, match="cannot accept 'nonsense'"):
        CheckSettings(accept="nonsense")
    with pytest.raises(TbqValueError, match="nothing would be checked"):
        CheckSettings(blocks=0, examples=0)
    with pytest.raises(ConfigError, match=r"not both \(blocks given as keywords\)"):
        check_kernel("q4_0", quantize=enc, settings=s, blocks=5)
    with pytest.raises(ConfigError, match="unknown tbq.check.CheckSettings field bloks"):
        check_target(CallableTarget(tbq.get_format("q4_0"), enc, None), bloks=5)
    # keywords replace fields of a given CheckSettings in the functions that take both
    r = check_target(CallableTarget(tbq.get_format("q4_0"), enc, None), s, seed=4)
    assert r.settings["seed"] == 4 and r.settings["blocks"] == 64
