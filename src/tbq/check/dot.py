"""Checking dot-product kernels: ggml's ``ggml_vec_dot_<fmt>_<vec_dot_type>`` against an exact reference.

ggml's signature is ``void f(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by,
int nrc)``: ``x`` holds ``n / block_size`` blocks of the left format, ``y`` as many of the right one (the
format's :attr:`~tbq.formats.capabilities.CheckTraits.vec_dot_type`), ``*s`` receives the dot product (``nrc = 1``).

The reference is exact. Where both operands have an integer form (:meth:`~tbq.formats.capabilities.CheckTraits.dot_parts`: each
block is ``codes * scale``) it works block by block as ggml does: a block contributes ``sumi * dx * dy`` with the
integer ``sumi = sum(cx * cy)``, plus ``mx * sy`` where the left block has a minimum and the right one a stored sum
(:meth:`~tbq.formats.capabilities.CheckTraits.dot_offset`: q4_1 and q5_1 x q8_1). A left operand without an integer form (the fork's
TBQ types, whose values come out of an inverse rotation) is taken as its float32 decoded values ``x_j`` against the
right operand's ``cy_j * dy``, value by value (the blocks may differ in size: TBQ's 128 against q8_K's 256). Every
term is exact in float64 (``dy`` split into two 12-bit halves where it is a float32), the row's sum is correctly
rounded (``math.fsum``) then rounded to float32. A kernel's result is

- ``exact``: the float32 of the exact sum;
- ``fragile``: within the accumulation bound of a float32 kernel: ``(m + 8) * 2**-24 * sum |term|`` plus ``m``
  times the smallest subnormal, with ``m`` the number of additions (blocks on the integer path, where ``|term|``
  weighs the code products' magnitudes, so that SIMD lanes splitting ``sumi`` are covered; values on the value
  path): one rounding per addition in any order, FMA or not, plus :data:`ROUNDINGS` for the scale product, the
  horizontal sum and the conversion (a first-order bound, widened by 1%);
- ``wrong``: anything else (NaN included).

Phases: ``golden`` (tbq's encodings of the golden families, one call per row of 1 to 8 blocks, so tails of
every length meet the kernel) and ``bytes`` (codes of random values, as the encoder writes them, with random
finite fp16 scales from 2**-14 to 65504).

>>> import tbq, numpy as np
>>> def dot(x, y, n):  # a correct dot product written with tbq's own decoders (float64 sum)
...     return float(np.dot(tbq.dequantize(x, "q4_0").astype(np.float64), tbq.dequantize(y, "q8_0").astype(np.float64)))
>>> r = check_dot(CallableDot(tbq.get_format("q4_0"), tbq.get_format("q8_0"), dot), blocks=200)
>>> r.ok, r.counts("dot")["wrong"]
(True, 0)
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..codecs import codec_from
from ..errors import TbqValueError, check_int
from ..formats import Format
from .classify import ACCEPTED, CLASSES, EXACT, FRAGILE, WRONG
from .counterexample import link_args, write_repro
from .diagnose import AGREE, Diagnosis
from .dot_reference import (
    ROUNDINGS,
    U32,
    _dot_parts,
    _terms,
    _value_terms,
    pair_unit,
    reference_dot,
    right_format,
)
from .dot_targets import CallableDot, DotTarget, LibraryDot
from .report import CheckReport, PhaseResult
from .runner import DEFAULT_BLOCKS, accept_names, golden_rows, require_hypothesis

__all__ = [
    "DotTarget",
    "LibraryDot",
    "CallableDot",
    "check_dot",
    "reference_dot",
    "right_format",
    "pair_unit",
    "DotCounterexample",
    "diagnose_dot",
    "DOT_DIAGNOSES",
    "check_dot_accept",
]

#: Blocks per call cycle through 1 .. MAX_CALL_BLOCKS (so every tail length reaches the kernel).
MAX_CALL_BLOCKS = 8
#: Wrong calls kept for :func:`diagnose_dot`.
KEEP_CALLS = 256


@dataclass(kw_only=True)
class DotCounterexample:
    """The shortest failing dot product found: the operands, tbq's exact value and bound, the kernel's result."""

    phase: str
    classification: str
    x: NDArray[np.uint8]
    y: NDArray[np.uint8]
    n: int
    expected: float
    bound: float
    got: float
    how: str = ""
    direction: str = "dot"
    #: ``(sumi, term)`` per block of the right operand: the integer sum (``None`` where the left operand has no
    #: integer codes) and the block's exact contribution (``sumi * dx * dy``, plus ``mx * sy`` with offsets)
    per_block: list[tuple[int | None, float]] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            f"dot: first minimal {self.classification} dot product ({self.phase} phase; {self.how})",
            f"  n = {self.n} ({len(self.per_block)} block{'s' * (len(self.per_block) != 1)}): tbq {float(self.expected)!r} "
            "(the float32 of the exact sum), "
            f"target {float(self.got)!r}, difference {abs(float(self.got) - float(self.expected)):.6g}, bound {self.bound:.6g}",
        ]
        for i, (sumi, t) in enumerate(self.per_block[:8]):
            if sumi is None:
                out.append(f"  right block {i}: exact sum of its values' products = {t!r}")
            else:
                out.append(f"  block {i}: sumi = {sumi}, exact term = {t!r}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "direction": "dot",
            "phase": self.phase,
            "classification": self.classification,
            "how": self.how,
            "n": self.n,
            "x": self.x.tobytes().hex(),
            "y": self.y.tobytes().hex(),
            "expected": float(self.expected),
            "bound": self.bound,
            "got": float(self.got),
        }

    def save(
        self, directory: str | os.PathLike[str], fmt: Format, symbol: str | None = None, link: list[str] | None = None
    ) -> list[Path]:
        arrays = {
            "x": self.x,
            "y": self.y,
            "n": np.int64(self.n),
            "expected": np.float32(self.expected),
            "bound": np.float64(self.bound),
            "got": np.float32(self.got),
        }
        return write_repro(directory, f"{fmt.name}-dot", arrays, {".c": self.c_source(fmt, symbol or "vec_dot", link)})

    def c_source(self, fmt: Format, symbol: str, link: list[str] | None = None) -> str:
        src = f"{fmt.name}-dot.c"
        libs = link_args(link) or "./libmykernel.so -Wl,-rpath,$PWD"

        def arr(name: str, a: NDArray[np.uint8]) -> str:
            return f"static const uint8_t {name}[{a.size}] = {{{', '.join(f'0x{int(v):02X}' for v in a)}}};"

        e = int(np.array(np.float32(self.expected)).view(np.uint32))
        return "\n".join(
            [
                f"/* Counterexample from `tbq check --dot`: {fmt.name} dot product, {self.phase} phase ({self.how}).",
                f" * tbq's value is the float32 of the exact sum; a correct float32 kernel lands within {self.bound!r} of it.",
                " * Build and run (exit status 1 while the kernel is outside the bound):",
                f" *     cc -O2 -o repro {src} {libs} -lm",
                " *     ./repro */",
                "#include <math.h>",
                "#include <stdint.h>",
                "#include <stdio.h>",
                "#include <string.h>",
                "#include <stddef.h>",
                "",
                f"void {symbol}(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc);",
                "",
                arr("x", self.x),
                arr("y", self.y),
                "",
                "int main(void) {",
                f"    uint32_t eb = 0x{e:08X}u; float e, s = NAN;",
                "    memcpy(&e, &eb, 4);",
                f"    {symbol}({self.n}, &s, 0, x, 0, y, 0, 1);",
                f"    const double diff = fabs((double)s - (double)e), bound = {self.bound!r};",
                '    printf("target %.9g, tbq %.9g, difference %.6g, bound %.6g\\n", s, e, diff, bound);',
                "    return !(diff <= bound);",
                "}",
                "",
            ]
        )


def _random_blocks(fmt: Format, n: int, rng: np.random.Generator) -> NDArray[np.uint8]:
    """Codes the encoder writes (of uniform random values) with random finite fp16 scales (exponents 1..30, either sign).

    Only codes the reference encoder can write: ggml's SIMD kernels assume them (q8_0's -128 never occurs).
    """
    x = rng.uniform(-1, 1, (n, fmt.block_size)).astype(np.float32)
    x[rng.random(n) < 0.25, 0] = 1  # some blocks reach their largest codes
    data = codec_from(fmt.name, fmt.config(), on_overflow="inf").encode(x).reshape(n, fmt.type_size)
    for f in fmt.info.layout:
        if f.kind == "f16" and f.size == 2:
            bits = (rng.integers(0, 2, n) << 15) | (rng.integers(1, 31, n) << 10) | rng.integers(0, 1024, n)
            data[:, f.offset : f.offset + 2] = bits.astype("<u2").view(np.uint8).reshape(n, 2)
    return data


def _classify(got: np.float32, exact: np.float32, bound: float) -> int:
    if np.array(got).view(np.uint32) == np.array(exact).view(np.uint32):
        return EXACT
    with np.errstate(all="ignore"):
        ok = np.isfinite(got) and np.isfinite(exact) and abs(float(got) - float(exact)) <= bound
    return FRAGILE if ok else WRONG


def check_dot(
    target: DotTarget,
    *,
    blocks: int = DEFAULT_BLOCKS,
    examples: int = 0,
    exact: bool = False,
    seed: int = 0,
    out: str | os.PathLike[str] | None = None,
    accept: str | Iterable[str] | None = (),
) -> CheckReport:
    """Check a dot-product kernel on ``blocks`` blocks of the golden and bytes phases and ``examples`` hypothesis
    examples (the fuzz phase, between them, as for the row kernels; 0 skips it); returns a
    :class:`~tbq.check.report.CheckReport` with direction ``"dot"`` (each dot product counts as one;
    ``exact=True`` refuses results that are only within the bound).

    ``accept``: ``"fragile"`` (accepted even under ``exact``) or a diagnosis of :data:`DOT_DIAGNOSES`: a wrong
    dot product that diagnosis explains by itself (``unsigned_codes``: the result is what the kernel gives when one
    operand's negative codes are read as unsigned bytes) is counted ``accepted``, so that the check goes on to the
    next distinct failure; the diagnosis is still reported."""
    waive = check_dot_accept(accept)
    check_int(blocks, "blocks", lo=1, expected="an integer >= 1", error=TbqValueError)
    check_int(examples, "examples", lo=0, expected="an integer >= 0", error=TbqValueError)
    if examples:
        require_hypothesis()
    L, R = target.left, target.right
    unsigned = "unsigned_codes" in waive and _integer_path(L, R)  # waive the wrong calls that reading explains
    refuse_fragile = bool(exact) and "fragile" not in waive
    unit = pair_unit(L, R)
    kx, ky = unit // L.block_size, unit // R.block_size  # blocks of each operand in one unit of the call
    units = max(1, int(blocks) // kx)
    t_start = time.perf_counter()
    report = CheckReport(
        L.name,
        options=L.config(),
        target=target.description,
        settings={
            "blocks": int(blocks),
            "examples": int(examples),
            "exact": bool(exact),
            "seed": seed,
            "rhs": R.name,
            "bound": "(m + 8) * 2**-24 * sum |term|, m additions (blocks, or values where the left has no integer form)",
            "accept": sorted(waive),
        },
    )
    report.provenance = target.provenance()
    report.unit = "dot products"
    first: tuple[str, NDArray[np.uint8], NDArray[np.uint8], int, int] | None = None  # (phase, x, y, units, cls)
    kept: list[tuple[NDArray[np.uint8], NDArray[np.uint8], float]] = []  # wrong calls (x, y, result), for diagnoses
    rng = np.random.default_rng(seed * 1000 + 19)
    try:
        for phase in ("golden", "fuzz", "bytes"):
            t0 = time.perf_counter()
            if phase == "fuzz":
                if examples:
                    counts, found = _fuzz(target, examples, seed, refuse_fragile, unsigned)
                    report.phases.append(
                        PhaseResult.from_counts(
                            "dot", "fuzz", counts, time.perf_counter() - t0, _fuzz_note(int(counts.sum()), found)
                        )
                    )
                    if found is not None and first is None:
                        first = found
                continue
            if phase == "golden":
                n = units * unit
                xv = _golden_values(L, n, seed)[:n]
                yv = _golden_values(R, n, seed + 1).reshape(-1, R.block_size)
                yv = yv[rng.permutation(yv.shape[0])].reshape(-1)[:n]
                xb = (
                    codec_from(L.name, L.config(), on_overflow="inf")
                    .encode(xv.reshape(-1, L.block_size))
                    .reshape(-1, L.type_size)
                )
                yb = (
                    codec_from(R.name, R.config(), on_overflow="inf")
                    .encode(yv.reshape(-1, R.block_size))
                    .reshape(-1, R.type_size)
                )
            else:
                xb, yb = _random_blocks(L, units * kx, rng), _random_blocks(R, units * ky, rng)
            counts = np.zeros(len(CLASSES), np.int64)
            have = min(units, xb.shape[0] // kx, yb.shape[0] // ky)  # golden_rows gives about as many as asked
            u0, m = 0, 0
            while u0 < have:
                nu = min(1 + m % MAX_CALL_BLOCKS, have - u0)
                m += 1
                x = xb[u0 * kx : (u0 + nu) * kx].reshape(-1)
                y = yb[u0 * ky : (u0 + nu) * ky].reshape(-1)
                u0 += nu
                e, bound = reference_dot(L, R, x, y)
                if not np.isfinite(e):
                    continue  # an overflowing reference (scales of the bytes phase): no spec value to compare with
                got = target.dot(x, y, nu * unit)
                cls = _classify(got, e, bound)
                if cls == WRONG and len(kept) < KEEP_CALLS:
                    kept.append((x, y, float(got)))
                cls = _waived(L, R, x, y, got, cls, unsigned)
                counts[cls] += 1
                failing = cls == WRONG or (refuse_fragile and cls == FRAGILE)
                if failing and first is None:
                    first = (phase, x, y, nu, cls)
            report.phases.append(
                PhaseResult.from_counts(
                    "dot",
                    phase,
                    counts,
                    time.perf_counter() - t0,
                    f"golden families, 1 to {MAX_CALL_BLOCKS} {_unit_name(L, R)} a call"
                    if phase == "golden"
                    else "encoder codes, random finite fp16 scales",
                )
            )
        if first is not None:
            report.counterexamples["dot"] = _minimal(target, *first)
        report.diagnoses.extend(diagnose_dot(L, R, kept))
    finally:
        target.close()
    report.faults = dict(target.faults)
    report.seconds = time.perf_counter() - t_start
    if out is not None and report.counterexamples:
        try:
            report.save(out, L, {"dot": target.symbol}, {"dot": target.link_libraries()})
        except OSError as exc:
            report.notes.append(f"the counterexample files could not be written to {out}: {exc.strerror or exc}")
    return report


#: The diagnoses of a dot-product check (what its ``accept`` may name besides ``"fragile"``).
DOT_DIAGNOSES = ("unsigned_codes",)
#: The readings ``unsigned_codes`` tries, simplest first: which operand's codes were read as unsigned bytes.
_READINGS = {"left": (True, False), "right": (False, True), "both": (True, True)}


def check_dot_accept(accept: str | Iterable[str] | None) -> frozenset[str]:
    """``accept`` of a dot-product check as a set of names (``"fragile"`` or :data:`DOT_DIAGNOSES`); anything else
    is refused naming the choices."""
    names = accept_names(accept)
    bad = sorted(str(n) for n in names if n not in ("fragile", *DOT_DIAGNOSES))
    if bad:
        raise TbqValueError(
            f"cannot accept {', '.join(map(repr, bad))} in a dot-product check: choose fragile or a diagnosis of "
            f"dot products: {', '.join(DOT_DIAGNOSES)}"
        )
    return names


def _integer_path(left: Format, right: Format) -> bool:
    """Both operands have integer codes (:meth:`~tbq.formats.capabilities.CheckTraits.dot_parts`): the only path ``unsigned_codes``
    reads."""
    zl, zr = np.zeros((1, left.type_size), np.uint8), np.zeros((1, right.type_size), np.uint8)
    return left.checker.dot_parts(zl) is not None and right.checker.dot_parts(zr) is not None


def _unsigned_reading(
    left: Format, right: Format, x: NDArray[np.uint8], y: NDArray[np.uint8], got: float, ul: bool, ur: bool
) -> bool | None:
    """Whether ``got`` is exact or within the accumulation bound of the dot product with the left (``ul``) and/or
    right (``ur``) operand's negative codes read as unsigned bytes; ``None`` where that reading changes nothing
    (no negative code there) or overflows."""
    xb, yb = x.reshape(-1, left.type_size), y.reshape(-1, right.type_size)
    cx, dx = _dot_parts(left, xb)
    cy, dy = _dot_parts(right, yb)
    if (ul and not (cx < 0).any()) or (ur and not (cy < 0).any()):
        return None
    cx = _signed_as_unsigned(cx) if ul else cx
    cy = _signed_as_unsigned(cy) if ur else cy
    with np.errstate(all="ignore"):
        terms = (cx * cy).sum(axis=1).astype(np.float64) * dx * dy  # exact, as in _terms
        mags = np.abs(cx * cy).sum(axis=1).astype(np.float64) * np.abs(dx * dy)
        ox, oy = left.checker.dot_offset(xb), right.checker.dot_offset(yb)
        if ox is not None and oy is not None:
            terms, mags = np.concatenate([terms, ox * oy]), mags + np.abs(ox * oy)
    if not np.isfinite(terms).all():
        return None
    with np.errstate(over="ignore"):
        e = np.float32(math.fsum(terms.tolist()))
    bound = 1.01 * (mags.size + ROUNDINGS) * U32 * float(mags.sum()) + mags.size * 2.0**-149
    return _classify(np.float32(got), e, bound) != WRONG


def _waived(
    left: Format, right: Format, x: NDArray[np.uint8], y: NDArray[np.uint8], got: Any, cls: int, unsigned: bool
) -> int:
    """``cls``, or ``ACCEPTED`` for a wrong call that the accepted ``unsigned_codes`` reading explains by itself
    (``unsigned``: it is accepted and both operands have integer codes)."""
    if cls != WRONG or not unsigned:
        return cls
    for ul, ur in _READINGS.values():
        if _unsigned_reading(left, right, x, y, float(got), ul, ur):
            return ACCEPTED
    return cls


def _signed_as_unsigned(codes: NDArray[np.int64]) -> NDArray[np.int64]:
    """Integer codes as an unsigned byte multiply reads their int8 bytes: a negative ``c`` becomes ``c + 256``."""
    return np.where(codes < 0, codes + 256, codes)


def diagnose_dot(
    left: Format, right: Format, kept: Sequence[tuple[NDArray[np.uint8], NDArray[np.uint8], float]]
) -> list[Diagnosis]:
    """Patterns of wrong dot products ``(x, y, result)``: ``unsigned_codes``, the kernel multiplied one operand's
    negative integer codes as unsigned bytes (``c + 256``; x86's ``vpdpbusd`` and ``pmaddubsw`` take an unsigned
    byte operand, and a kernel, or a compiler's auto-vectoriser, that feeds them signed codes without the sign
    trick computes this). Named when at least :data:`~tbq.check.diagnose.AGREE` of the calls are exact or within
    the bound of that reading; integer path only (both operands with :meth:`~tbq.formats.capabilities.CheckTraits.dot_parts`).

    >>> import tbq
    >>> q5, q8 = tbq.get_format("q5_0"), tbq.get_format("q8_0")
    >>> rng = np.random.default_rng(1)
    >>> v = rng.uniform(-1, 1, (2, 32)).astype(np.float32)
    >>> x, y = q5.encode(v), q8.encode(v)
    >>> (cx, dx), (cy, dy) = q5.checker.dot_parts(x), q8.checker.dot_parts(y)
    >>> bad = float(np.float32(((np.where(cx < 0, cx + 256, cx) * cy).sum(axis=1) * dx * dy).sum()))
    >>> [g.name for g in diagnose_dot(q5, q8, [(x.reshape(-1), y.reshape(-1), bad)])]
    ['unsigned_codes']
    """
    if not kept or not _integer_path(left, right):
        return []
    out = []
    for which, (ul, ur) in _READINGS.items():
        hits, negative = 0, 0
        for x, y, got in kept:
            explained = _unsigned_reading(left, right, x, y, got, ul, ur)
            if explained is None:
                continue  # this reading changes nothing here: no evidence either way
            negative += 1
            hits += explained
        if negative and hits >= AGREE * len(kept):
            names = {"left": f"the left operand's ({left.name})", "right": f"the right operand's ({right.name})"}
            whose = names.get(which, f"both operands' ({left.name}, {right.name})")
            out.append(
                Diagnosis(
                    "unsigned_codes",
                    f"{whose} negative integer codes were multiplied as unsigned bytes (c + 256): a signed operand "
                    "fed to an unsigned-by-signed byte multiply (x86 vpdpbusd / pmaddubsw) without the sign trick",
                    [
                        f"{hits:,} of {len(kept):,} wrong dot products kept are what that reading gives (exact or "
                        "within the accumulation bound)",
                        "the error of a block is 256 * (the sum of the other operand's codes where these are "
                        "negative) * dx * dy",
                    ],
                    direction="dot",
                )
            )
            break  # the first (simplest) reading that explains them
    return out


def _fuzz_note(n: int, found: Any) -> str:
    return f"{n} hypothesis example{'s' * (n != 1)}" + (" (stopped at the first failure; shrunk)" if found else "")


def _fuzz(
    target: DotTarget, examples: int, seed: int, refuse_fragile: bool, unsigned: bool = False
) -> tuple[NDArray[np.int64], tuple[str, NDArray[np.uint8], NDArray[np.uint8], int, int] | None]:
    """The fuzz phase: hypothesis draws 1 to :data:`MAX_CALL_BLOCKS` units of both operands from
    :func:`tbq.testing.strategies.float_blocks` (each format's rounding hazards), encodes them as tbq does and calls
    the kernel; the first failure stops the search and hypothesis shrinks it. Returns the counts and the shrunk call
    ``(phase, x, y, units, class)`` or ``None``. ``refuse_fragile``: a fragile result fails (``exact`` and not
    accepted); ``unsigned``: wrong results the accepted ``unsigned_codes`` reading explains are accepted."""
    import hypothesis
    from hypothesis import strategies as st
    from hypothesis.errors import NoSuchExample

    from ..testing import strategies as tst
    from .runner import find_settings, hypothesis_scratch

    L, R = target.left, target.right
    unit = pair_unit(L, R)
    kx, ky = unit // L.block_size, unit // R.block_size
    cl = codec_from(L.name, L.config(), on_overflow="inf")
    cr = codec_from(R.name, R.config(), on_overflow="inf")
    strat = st.integers(1, MAX_CALL_BLOCKS).flatmap(
        lambda nu: st.tuples(
            st.just(nu),
            tst.float_blocks(cl, min_blocks=nu * kx, max_blocks=nu * kx, leading_shape=()),
            tst.float_blocks(cr, min_blocks=nu * ky, max_blocks=nu * ky, leading_shape=()),
        )
    )
    counts = np.zeros(len(CLASSES), np.int64)
    state: dict[str, Any] = {"found": False}

    def call(ex: tuple[int, NDArray[np.float32], NDArray[np.float32]]) -> tuple[Any, Any, int, int]:
        nu, xv, yv = ex
        x = cl.encode(xv.reshape(-1, L.block_size)).reshape(-1)
        y = cr.encode(yv.reshape(-1, R.block_size)).reshape(-1)
        e, bound = reference_dot(L, R, x, y)
        if not np.isfinite(e):
            return x, y, nu, -1
        got = target.dot(x, y, nu * unit)
        return x, y, nu, _waived(L, R, x, y, got, _classify(got, e, bound), unsigned)

    def condition(ex: tuple[int, NDArray[np.float32], NDArray[np.float32]]) -> bool:
        _, _, _, cls = call(ex)
        failing = cls == WRONG or (refuse_fragile and cls == FRAGILE)
        if not state["found"] and cls >= 0:
            counts[cls] += 1
            state["found"] = failing
        return failing

    with hypothesis_scratch():
        try:
            ex = hypothesis.find(
                strat, condition, settings=find_settings(examples), random=random.Random(seed * 7919 + 1)
            )
        except NoSuchExample:
            return counts, None
    x, y, nu, cls = call(ex)
    return counts, ("fuzz", x, y, nu, cls)


def _golden_values(fmt: Format, n: int, seed: int) -> NDArray[np.float32]:
    """At least ``n`` values of :func:`~tbq.check.runner.golden_rows` for ``fmt`` (which gives *about* as many blocks as
    asked: rows of 128 values, fewer blocks of a format with larger ones), asking for more until there are."""
    blocks = -(-n // fmt.block_size)
    while True:
        v = golden_rows(fmt, blocks, seed).reshape(-1)
        if v.size >= n:
            return v
        blocks = 2 * blocks + 1


def _unit_name(left: Format, right: Format) -> str:
    """What one unit of a call is: ``blocks``, or e.g. ``256-value units`` where the block sizes differ."""
    return "blocks" if left.block_size == right.block_size else f"{pair_unit(left, right)}-value units"


def _minimal(
    target: DotTarget, phase: str, x: NDArray[np.uint8], y: NDArray[np.uint8], nu: int, cls: int
) -> DotCounterexample:
    """The failing call cut to fewer units (from the end, then the start) while it still fails the same way."""
    L, R = target.left, target.right
    unit = pair_unit(L, R)
    tl, tr = unit // L.block_size * L.type_size, unit // R.block_size * R.type_size  # bytes of a unit

    def fails(a: int, b: int) -> bool:
        xs, ys = x[a * tl : b * tl], y[a * tr : b * tr]
        e, bound = reference_dot(L, R, xs, ys)
        return bool(np.isfinite(e)) and _classify(target.dot(xs, ys, (b - a) * unit), e, bound) == cls

    a, b = 0, nu
    while b - a > 1 and fails(a, b - 1):
        b -= 1
    while b - a > 1 and fails(a + 1, b):
        a += 1
    xs, ys = x[a * tl : b * tl].copy(), y[a * tr : b * tr].copy()
    e, bound = reference_dot(L, R, xs, ys)
    per_block = _per_block(L, R, xs, ys)
    what = _unit_name(L, R)
    how = f"{what} {a}..{b - 1} of a call of {nu} {what}" + (" (the shortest that still fails)" if b - a < nu else "")
    got = target.dot(xs, ys, (b - a) * unit)
    return DotCounterexample(
        phase=phase,
        classification=CLASSES[cls],
        x=xs,
        y=ys,
        n=(b - a) * unit,
        expected=float(e),
        bound=bound,
        got=float(got),
        how=how,
        per_block=per_block,
    )


def _per_block(
    left: Format, right: Format, x: NDArray[np.uint8], y: NDArray[np.uint8]
) -> list[tuple[int | None, float]]:
    """``(sumi, term)`` per right-operand block: the integer sum and the block's exact contribution (``sumi`` is
    ``None`` on the value path, where the left operand has no integer codes)."""
    xb, yb = x.reshape(-1, left.type_size), y.reshape(-1, right.type_size)
    cy, dy = _dot_parts(right, yb)
    parts = left.checker.dot_parts(xb)
    if parts is not None:
        sumi = (parts[0] * cy).sum(axis=1)
        terms, _ = _terms(left, right, xb, yb)
        per = terms[: sumi.size] + (terms[sumi.size :] if terms.size > sumi.size else 0.0)
        return [(int(si), float(t)) for si, t in zip(sumi, per, strict=True)]
    hi, lo, _ = _value_terms(left, right, xb, yb)
    br = right.block_size
    return [(None, math.fsum(np.concatenate([hi[j : j + br], lo[j : j + br]]).tolist())) for j in range(0, hi.size, br)]
