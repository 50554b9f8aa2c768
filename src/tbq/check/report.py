"""The result of a check: counts per direction and phase, counterexamples, diagnoses; table, JSON, files.

:class:`CheckReport` is what :func:`tbq.check.check_kernel` and friends
return. ``report.ok`` is True when no block is wrong (and, with
``exact=True``, none is fragile either) and the target made no fault (a write
past its output, into its input). ``str(report)`` is the human report, so
``assert report.ok, report`` prints everything a failing test needs.

A :class:`Counterexample` is the first minimal failing block of a direction:
the input, tbq's output and the target's, the differing byte offsets and
fields, and tbq's trace for the block. :meth:`CheckReport.save` writes each as
``<fmt>-<direction>.npz`` plus ``<fmt>-<direction>.c``, a self-contained C
program that calls the ggml row function on that input and compares with
tbq's result (exit status 1 while they differ).

>>> r = CheckReport("q8_0", {}, "demo", {"exact": False}, [PhaseResult("quantize", "golden", 10, 9, 1, 0, 0.01)])
>>> r.ok, r.counts()
(True, {'blocks': 10, 'exact': 9, 'fragile': 1, 'wrong': 0, 'equivalent': 0, 'undefined': 0, 'tie_rule': 0, 'accepted': 0})
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from ..formats import Format
from .classify import CLASSES, Trace, ordered_code
from .diagnose import Diagnosis, describe_values
from .targets import DIRECTIONS, default_symbol

__all__ = ["PhaseResult", "Counterexample", "CheckReport", "make_counterexample"]

PHASES = ("golden", "fuzz", "bytes")


@dataclass
class PhaseResult:
    """Counts of one phase of one direction."""

    direction: str
    phase: str
    blocks: int
    exact: int
    fragile: int
    wrong: int
    seconds: float
    note: str = ""
    equivalent: int = 0  #: other bytes decoding to the same values (always accepted)
    undefined: int = 0  #: inputs on which the C reference is undefined (accepted unless exact)
    tie_rule: int = 0  #: another tie rule on exact ties (accepted unless exact)
    accepted: int = 0  #: wrong blocks waived by ``accept`` (a named diagnosis explains them)

    @classmethod
    def from_counts(
        cls, direction: str, phase: str, counts: Iterable[int | np.integer[Any]], seconds: float, note: str = ""
    ) -> PhaseResult:
        """From the blocks of each class, in the order of :data:`~tbq.check.classify.CLASSES`."""
        c = dict(zip(CLASSES, (int(v) for v in counts), strict=True))
        return cls(
            direction,
            phase,
            sum(c.values()),
            c["exact"],
            c["fragile"],
            c["wrong"],
            seconds,
            note,
            c["equivalent"],
            c["undefined"],
            c["tie_rule"],
            c["accepted"],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "direction": self.direction,
            "phase": self.phase,
            "blocks": self.blocks,
            "exact": self.exact,
            "fragile": self.fragile,
            "wrong": self.wrong,
            "equivalent": self.equivalent,
            "undefined": self.undefined,
            "tie_rule": self.tie_rule,
            "accepted": self.accepted,
            "seconds": round(self.seconds, 4),
            "note": self.note,
        }


def _num(v: Any) -> float | str:
    """A number for JSON: a finite float as it is, a non-finite one as its repr (``'nan'``, ``'inf'``)."""
    x = float(v)
    return x if math.isfinite(x) else repr(x)


def _f32_text(v: Any) -> str:
    f = np.float32(v)
    return f"{float(f)!r} (0x{int(np.array(f).view(np.uint32)):08X})"


class AnyCounterexample(Protocol):
    """What a report reads of a counterexample: a block's (:class:`Counterexample`) or a dot product's
    (:class:`tbq.check.dot.DotCounterexample`)."""

    direction: str
    classification: str

    def lines(self) -> list[str]: ...

    def to_dict(self) -> dict[str, Any]: ...

    def save(
        self, directory: str | os.PathLike[str], fmt: Format, symbol: str | None = None, link: list[str] | None = None
    ) -> list[Path]: ...


@dataclass
class Counterexample:
    """The first minimal failing block of one direction.

    ``input`` is float32 values (quantize) or encoded bytes (dequantize): one
    block, or a whole row when the format's blocks depend on their row;
    ``block`` is the failing block within it. ``expected`` is tbq's output,
    ``got`` the target's. ``offsets`` lists the differing byte offsets
    (quantize) or value positions (dequantize) within the block; ``fields``
    the differing fields; ``trace`` tbq's intermediates for the block.
    """

    direction: str
    phase: str
    classification: str
    input: NDArray[Any]
    expected: NDArray[Any]
    got: NDArray[Any]
    block: int
    offsets: list[int]
    fields: list[dict[str, Any]]
    trace: dict[str, str]
    how: str = ""  #: how it was made minimal

    def lines(self) -> list[str]:
        what = "bytes" if self.direction == "quantize" else "values"
        out = [f"{self.direction}: first minimal {self.classification} block ({self.phase} phase; {self.how})"]
        if self.direction == "quantize":
            out.append(f"  input: {self.input.size} float32 values; {describe_values(self.input)}")
        else:
            out.append(
                f"  input: {self.input.size} bytes: {self.input.tobytes().hex(' ')}"
                if self.input.size <= 72
                else f"  input: {self.input.size} bytes"
            )
        out.append(
            f"  differing {what} (block {self.block}): {', '.join(map(str, self.offsets[:24]))}"
            + (" ..." if len(self.offsets) > 24 else "")
        )
        for f in self.fields:
            out.append(f"  {f['text']}")
        for key, v in self.trace.items():
            out.append(f"  trace {key}: {v}")
        return out

    def to_dict(self) -> dict[str, Any]:
        def arr(values: NDArray[Any]) -> str | list[str]:
            a = np.asarray(values)
            if a.dtype == np.uint8:
                return a.tobytes().hex()
            return [f"0x{int(b):08X}" for b in a.astype(np.float32).view(np.uint32)]

        return {
            "direction": self.direction,
            "phase": self.phase,
            "classification": self.classification,
            "how": self.how,
            "block": self.block,
            "input": arr(self.input),
            "expected": arr(self.expected),
            "got": arr(self.got),
            "offsets": [int(o) for o in self.offsets],
            "fields": [{k: v for k, v in f.items() if k != "text"} for f in self.fields],
            "trace": self.trace,
            "encoding": "uint8 as hex strings, float32 as bit patterns",
        }

    # -- files -----------------------------------------------------------------------------
    def save(
        self, directory: str | os.PathLike[str], fmt: Format, symbol: str | None = None, link: list[str] | None = None
    ) -> list[Path]:
        """Write ``<fmt>-<direction>.npz`` and ``<fmt>-<direction>.c`` into ``directory``; return their paths.

        ``link``: the shared libraries the repro links with (its compile line names them with an rpath).
        """
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        stem = d / f"{fmt.name}-{self.direction}"
        npz = stem.with_suffix(".npz")
        np.savez(
            npz,
            input=self.input,
            expected=self.expected,
            got=self.got,
            block=np.int64(self.block),
            format=np.array(fmt.name),
            direction=np.array(self.direction),
            phase=np.array(self.phase),
            options=np.array(json.dumps(fmt.config())),
            offsets=np.asarray(self.offsets, np.int64),
        )
        c = stem.with_suffix(".c")
        c.write_text(self.c_source(fmt, symbol, link))
        return [npz, c]

    def c_source(self, fmt: Format, symbol: str | None = None, link: list[str] | None = None) -> str:
        """A self-contained C program reproducing this counterexample with ggml's row signature.

        ``link``: shared libraries to name in its compile line (each with ``-Wl,-rpath`` to its folder, so the
        program runs without ``LD_LIBRARY_PATH``); without them the line names a placeholder library.
        """
        sym = symbol or default_symbol(self.direction, fmt.name)
        src = f"{fmt.name}-{self.direction}.c"
        if link:
            libs = " ".join(f"{shlex.quote(str(p))} -Wl,-rpath,{shlex.quote(str(Path(p).parent))}" for p in link)
            build = f" *     cc -O2 -o repro {src} {libs} -lm"
        else:
            build = f" *     cc -O2 -o repro {src} ./libmykernel.so -Wl,-rpath,$PWD -lm     (or your kernel's .c file)"
        opts = json.dumps(fmt.config()) if fmt.config() else "none"
        names = _byte_fields(fmt)
        head = [
            f"/* Counterexample from `tbq check`: {fmt.name} {self.direction}, {self.phase} phase ({self.how}).",
            f" * Format options: {opts}. Block {self.block} of this input is {self.classification}: tbq (the bit-exact",
            " * reference of docs/formats.md) and the kernel under test disagree on it.",
            " * Build it with your kernel and run it; it exits with status 1 while they disagree:",
            build,
            " *     ./repro",
            f" * Rename {sym} if your function has another name. */",
            "#include <stdint.h>",
            "#include <stdio.h>",
            "#include <string.h>",
            "",
        ]
        if self.direction == "quantize":
            k, nbytes = self.input.size, self.expected.size
            body = [
                f"void {sym}(const float *x, void *y, int64_t k);",
                "",
                f"#define K {k}",
                f"#define NBYTES {nbytes}",
                f"#define TYPE_SIZE {fmt.type_size}",
                f"static const uint32_t input_bits[K] = {{{_c_list([f'0x{int(v):08X}u' for v in self.input.view(np.uint32)])}}};",
                f"static const uint8_t expected[NBYTES] = {{{_c_list([f'0x{int(v):02X}' for v in self.expected])}}};",
                f"static const char *const field_of_byte[TYPE_SIZE] = {{{_c_list([json.dumps(n) for n in names])}}};",
                "",
                "int main(void) {",
                "    float x[K];",
                "    uint8_t y[NBYTES];",
                "    memcpy(x, input_bits, sizeof x);",
                "    memset(y, 0x5A, sizeof y);",
                f"    {sym}(x, y, K);",
                "    int bad = 0;",
                "    for (int i = 0; i < NBYTES; i++) {",
                "        if (y[i] != expected[i]) {",
                "            if (bad < 32)",
                '                printf("block %d byte %2d (%s): got 0x%02x, tbq 0x%02x\\n", i / TYPE_SIZE, i % TYPE_SIZE,',
                "                       field_of_byte[i % TYPE_SIZE], y[i], expected[i]);",
                "            bad++;",
                "        }",
                "    }",
                '    if (bad) printf("%d of %d bytes differ from tbq\\n", bad, NBYTES);',
                '    else printf("identical to tbq (%d bytes)\\n", NBYTES);',
                "    return bad != 0;",
                "}",
            ]
        else:
            k, nbytes = self.expected.size, self.input.size
            body = [
                f"void {sym}(const void *x, float *y, int64_t k);",
                "",
                f"#define K {k}",
                f"#define NBYTES {nbytes}",
                f"static const uint8_t input[NBYTES] = {{{_c_list([f'0x{int(v):02X}' for v in self.input])}}};",
                f"static const uint32_t expected_bits[K] = {{{_c_list([f'0x{int(v):08X}u' for v in self.expected.view(np.uint32)])}}};",
                "",
                "int main(void) {",
                "    float y[K], e;",
                "    uint32_t got;",
                "    memset(y, 0xA5, sizeof y);",
                f"    {sym}(input, y, K);",
                "    int bad = 0;",
                "    for (int i = 0; i < K; i++) {",
                "        memcpy(&got, &y[i], 4);",
                "        if (got != expected_bits[i]) {",
                "            memcpy(&e, &expected_bits[i], 4);",
                '            if (bad < 32) printf("value %3d: got %a (0x%08x), tbq %a (0x%08x)\\n", i, y[i], got, e, expected_bits[i]);',
                "            bad++;",
                "        }",
                "    }",
                '    if (bad) printf("%d of %d values differ from tbq\\n", bad, K);',
                '    else printf("identical to tbq (%d values)\\n", K);',
                "    return bad != 0;",
                "}",
            ]
        return "\n".join(head + body) + "\n"


def _c_list(items: list[str], per_line: int = 8) -> str:
    rows = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
    return "\n    " + ",\n    ".join(rows) + "\n"


def _byte_fields(fmt: Format) -> list[str]:
    """The layout field name of each byte of a block."""
    names = ["?"] * fmt.type_size
    for f in fmt.info.layout:
        for o in range(f.offset, f.offset + f.size):
            names[o] = f.name
    return names


# ---------------------------------------------------------------------------
# building a counterexample
# ---------------------------------------------------------------------------


def _short(items: list[str], n: int = 8) -> str:
    vals = list(items)
    return ", ".join(vals[:n]) + (" ..." if len(vals) > n else "")


def make_counterexample(
    fmt: Format,
    direction: str,
    phase: str,
    inp: NDArray[Any],
    expected: NDArray[Any],
    got: NDArray[Any],
    block: int,
    cls: int,
    trace: Trace | None,
    k: int,
    how: str,
) -> Counterexample:
    """Describe block ``block`` of one failing row: differing offsets, fields and tbq's trace."""
    bs, ts = fmt.block_size, fmt.type_size
    fields: list[dict[str, Any]] = []
    tr: dict[str, str] = {}
    if direction == "quantize":
        e = expected.reshape(-1, ts)[block]
        g = got.reshape(-1, ts)[block]
        offsets = np.flatnonzero(e != g).tolist()
        Fe = {n: np.asarray(v).reshape(-1) for n, v in fmt.fields(e[None, :]).items()}
        Fg = {n: np.asarray(v).reshape(-1) for n, v in fmt.fields(g[None, :]).items()}
        spans = {f.name: (f.offset, f.offset + f.size) for f in fmt.info.layout}
        value_pos: list[int] = []
        for n in Fe:
            a, b = Fe[n], Fg[n]
            neq = (
                (a.astype(np.float32).view(np.uint32) != b.astype(np.float32).view(np.uint32))
                if a.dtype.kind == "f"
                else a != b
            )
            if not neq.any():
                continue
            pos = np.flatnonzero(neq)
            span = spans.get(n)
            where = f" (bytes {span[0]}-{span[1] - 1})" if span else ""
            if a.size == 1:
                text = f"field {n}{where}: tbq {_fmt_val(a[0])}, target {_fmt_val(b[0])}"
                if a.dtype.kind == "f":
                    steps = int(abs(ordered_code(b, "f16")[0] - ordered_code(a, "f16")[0]))
                    text += f" ({steps} fp16 step{'s' if steps != 1 else ''} apart)"
            else:
                if a.size == bs:
                    value_pos = pos.tolist()
                text = f"field {n}{where}: {pos.size} of {a.size} entries differ; at " + _short(
                    [f"[{p}] tbq {_fmt_val(a[p])} target {_fmt_val(b[p])}" for p in pos], 6
                )
            fields.append(
                {
                    "field": n,
                    "bytes": list(span) if span else None,
                    "positions": pos.tolist()[:64],
                    "expected": [_num(v) for v in a[pos][:64]],
                    "got": [_num(v) for v in b[pos][:64]],
                    "text": text,
                }
            )
        if trace:
            per_block: dict[str, NDArray[Any]] = {}
            per_value: dict[str, NDArray[Any]] = {}
            for key, value in trace.items():
                v = np.asarray(value)
                if v.ndim == 1:
                    per_block[key] = v
                elif v.ndim == 2 and v.shape[1] == bs:
                    per_value[key] = v
            for key, v in per_block.items():
                tr[key] = _f32_text(v[0]) if v.dtype.kind == "f" else str(v[0].item())
            try:
                with np.errstate(all="ignore"):
                    frag = np.asarray(fmt.fragile_values(trace, k), bool).reshape(1, bs)[0]
            except Exception:  # pragma: no cover - a trace the format cannot read back
                frag = np.zeros(bs, bool)
            thr = fmt.tables().get("thresholds")
            show = value_pos[:8] if value_pos else []
            for p in show:
                parts = []
                for key, v in per_value.items():
                    val = float(v[0, p])
                    part = f"{key} = {val!r}"
                    if thr is not None and v.dtype.kind == "f":
                        t = np.asarray(thr, np.float64)
                        j = int(np.searchsorted(t, val, side="right"))
                        below = f"{float(t[j - 1])!r}" if j > 0 else "-inf"
                        above = f"{float(t[j])!r}" if j < t.size else "+inf"
                        part += f" between thresholds {below} and {above}"
                    parts.append(part)
                parts.append("fragile" if frag[p] else "not fragile")
                tr[f"value {p}"] = "; ".join(parts)
    else:
        e = expected.reshape(-1, bs)[block]
        g = got.reshape(-1, bs)[block]
        neq = e.view(np.uint32) != g.view(np.uint32)
        offsets = np.flatnonzero(neq).tolist()
        data_block = inp.reshape(-1, ts)[block]
        F = {n: np.asarray(v).reshape(-1) for n, v in fmt.fields(data_block[None, :]).items()}
        tol = np.asarray(fmt.decode_tolerance(data_block[None, :]), np.float64).reshape(-1)
        for n, a in F.items():
            if a.size == 1:
                fields.append({"field": n, "value": _num(a[0]), "text": f"field {n}: {_fmt_val(a[0])}"})
        pos = np.array(offsets[:64], np.int64)
        for n, a in F.items():
            if a.size == bs and pos.size:
                fields.append(
                    {
                        "field": n,
                        "positions": pos.tolist(),
                        "codes": [_num(v) for v in a[pos]],
                        "text": f"field {n} at the differing values: "
                        + _short([f"[{p}] {_fmt_val(a[p])}" for p in pos], 8),
                    }
                )
        fields.append(
            {
                "field": "decoded",
                "positions": pos.tolist(),
                "expected": [_num(v) for v in e[pos]],
                "got": [_num(v) for v in g[pos]],
                "tolerance": [_num(v) for v in tol[pos]],
                "text": "decoded: " + _short([f"[{p}] tbq {_f32_text(e[p])} target {_f32_text(g[p])}" for p in pos], 4),
            }
        )
    return Counterexample(
        direction,
        phase,
        CLASSES[cls],
        np.asarray(inp).reshape(-1),
        np.asarray(expected).reshape(-1),
        np.asarray(got).reshape(-1),
        int(block),
        offsets,
        fields,
        tr,
        how,
    )


def _fmt_val(value: Any) -> str:
    v = np.asarray(value)
    if v.dtype.kind == "f":
        return repr(float(v))
    return str(int(v))


# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------


#: The classes beyond exact/fragile/wrong, with their table column widths.
_EXTRA_CLASSES = ("equivalent", "undefined", "tie_rule", "accepted")
_WIDTH = {"equivalent": 12, "undefined": 11, "tie_rule": 10, "accepted": 10}
#: How the verdict names accepted non-exact blocks.
_ACCEPTED_TEXT = {
    "fragile": "fragile blocks accepted (legitimate reduction-order/FMA differences; --exact refuses them)",
    "equivalent": "equivalent blocks accepted (other bytes, the same decoded values)",
    "tie_rule": "blocks with another tie rule accepted (exact ties rounded differently from the spec; --exact refuses them)",
    "undefined": "undefined blocks accepted (inputs on which the C reference is undefined; --exact refuses them)",
    "accepted": "wrong blocks waived by --accept (a named diagnosis explains them)",
}


@dataclass
class CheckReport:
    """Everything a check found. See the module docstring."""

    format: str
    options: dict[str, Any]
    target: str
    settings: dict[str, Any]
    phases: list[PhaseResult] = field(default_factory=list)
    counterexamples: dict[str, AnyCounterexample] = field(default_factory=dict)  #: direction -> Counterexample
    diagnoses: list[Diagnosis] = field(default_factory=list)  #: Diagnosis objects, both directions
    #: direction -> lines saying what differs in the wrong blocks
    differences: dict[str, list[str]] = field(default_factory=dict)
    #: direction -> messages (writes past the output, into the input)
    faults: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: what was called, per direction (and init function): ``{"symbol", "file", "library", "elsewhere"}``
    provenance: dict[str, dict[str, Any]] = field(default_factory=dict)
    unit: str = "blocks"  #: what the counts count ("dot products" for a dot-product check)

    @property
    def exact(self) -> bool:
        return bool(self.settings.get("exact", False))

    def counts(self, direction: str | None = None, phase: str | None = None) -> dict[str, int]:
        """``{"blocks", "exact", "fragile", "wrong", "equivalent", "undefined", "tie_rule", "accepted"}`` over the phases of
        ``direction`` (default: all)."""
        out = {
            "blocks": 0,
            "exact": 0,
            "fragile": 0,
            "wrong": 0,
            "equivalent": 0,
            "undefined": 0,
            "tie_rule": 0,
            "accepted": 0,
        }
        for p in self.phases:
            if (direction is None or p.direction == direction) and (phase is None or p.phase == phase):
                for key in out:
                    out[key] += getattr(p, key)
        return out

    @property
    def directions(self) -> list[str]:
        return [d for d in DIRECTIONS + ("dot",) if any(p.direction == d for p in self.phases)]

    def failed(self, direction: str | None = None) -> bool:
        c = self.counts(direction)
        faults = self.faults.get(direction) if direction else any(self.faults.values())
        waived = set(self.settings.get("accept") or ())
        refused = [k for k in ("fragile", "undefined", "tie_rule") if k not in waived]
        return bool(c["wrong"] or (self.exact and any(c[k] for k in refused)) or faults)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong (and nothing fragile under ``exact``) and the target made no fault."""
        return not self.failed()

    @property
    def wrong(self) -> int:
        return self.counts()["wrong"]

    @property
    def fragile(self) -> int:
        return self.counts()["fragile"]

    @property
    def counterexample(self) -> AnyCounterexample | None:
        """The first direction's counterexample (None when nothing failed)."""
        return next(iter(self.counterexamples.values()), None)

    # -- text -------------------------------------------------------------------------------
    def table(self) -> str:
        """The table: one row per direction and phase, then the direction's total."""
        total = self.counts()
        extra = [k for k in _EXTRA_CLASSES if total[k]]  # columns of the other classes, where any block has one

        def cells(c: dict[str, Any]) -> str:
            return "".join(f"{c[k]:>{_WIDTH[k]},}" for k in extra)

        head = (
            f"{'direction':<11}{'phase':<8}{'blocks':>10}{'exact':>10}{'fragile':>9}"
            + "".join(f"{k:>{_WIDTH[k]}}" for k in extra)
            + f"{'wrong':>9}{'time':>9}  note"
        )
        lines = [head, "-" * len(head)]
        for d in self.directions:
            rows = [p for p in self.phases if p.direction == d]
            for p in rows:
                lines.append(
                    f"{d:<11}{p.phase:<8}{p.blocks:>10,}{p.exact:>10,}{p.fragile:>9,}{cells(p.to_dict())}{p.wrong:>9,}"
                    f"{p.seconds:>7.2f} s  {p.note}".rstrip()
                )
            c = self.counts(d)
            t = sum(p.seconds for p in rows)
            lines.append(
                f"{d:<11}{'total':<8}{c['blocks']:>10,}{c['exact']:>10,}{c['fragile']:>9,}{cells(c)}{c['wrong']:>9,}{t:>7.2f} s  "
                f"{'FAIL' if self.failed(d) else 'ok'}"
            )
        return "\n".join(lines)

    def verdict(self) -> str:
        c = self.counts()
        if self.ok:
            extra = "".join(f"; {c[k]:,} {text}" for k, text in _ACCEPTED_TEXT.items() if c[k])
            return f"PASS: {c['blocks']:,} {self.unit}, none wrong{extra}"
        parts = []
        if c["wrong"]:
            parts.append(f"{c['wrong']:,} wrong")
        for k in ("fragile", "tie_rule", "undefined"):
            if self.exact and c[k] and k not in (self.settings.get("accept") or ()):
                parts.append(f"{c[k]:,} {k.replace('_', '-')} (refused by --exact)")
        if any(self.faults.values()):
            parts.append("target faults")
        return f"FAIL: {', '.join(parts)} of {c['blocks']:,} {self.unit}"

    def text(self) -> str:
        """The full human report: header, table, verdict, then per failing direction the details."""
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items() if not isinstance(v, (dict, list))) or "no options"
        lines = [f"tbq check: {self.format} ({opts}), {self.target}"]
        for key, pv in self.provenance.items():
            where = pv.get("file") or "an unknown file"
            lines.append(
                f"  {key}: {pv['symbol']} from {where}" + ("  (NOT the library given)" if pv.get("elsewhere") else "")
            )
        lines += ["", self.table(), "", self.verdict()]
        for note in self.notes:
            lines.append(f"note: {note}")
        for d in self.directions:
            for g in self.diagnoses:
                if g.direction == d and g.scope in _EXTRA_CLASSES:
                    lines.append("")
                    lines.append(
                        f"{d}: {self.counts(d)[g.scope]:,} {g.scope.replace('_', '-')} blocks: "
                        + g.text().replace("\n", "\n  ")
                    )
            hidden = [g for g in self.diagnoses if g.direction == d and g.scope == "fragile"]
            if hidden:
                lines.append("")
                lines.append(
                    f"{d}: the fragile blocks follow a pattern (fragile blocks pass unless exact; this one may be a bug "
                    "hiding inside the fragility mask):"
                )
                for g in hidden:
                    lines.append("    " + g.text().replace("\n", "\n    "))
            if not self.failed(d):
                continue
            lines.append("")
            for msg in self.faults.get(d, []):
                lines.append(f"{d}: FAULT: {msg}")
            ce = self.counterexamples.get(d)
            if ce is not None:
                lines.extend(ce.lines())
            diff = self.differences.get(d)
            if diff:
                lines.append("  what differs in the wrong blocks:")
                lines.extend(f"    {x}" for x in diff)
            diags = [g for g in self.diagnoses if g.direction in (d, "both") and g.scope == "wrong"]
            if diags:
                lines.append("  diagnosis:")
                for g in diags:
                    lines.append("    " + g.text().replace("\n", "\n    "))
            elif ce is not None and ce.classification == "wrong":
                lines.append("  diagnosis: no known pattern matches; see the counterexample")
        if self.files:
            lines.append("")
            lines.append("counterexample files: " + ", ".join(str(f) for f in self.files))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def assert_ok(self) -> None:
        """Raise ``AssertionError`` with the full report unless :attr:`ok` (for pytest suites)."""
        if not self.ok:
            raise AssertionError("\n" + self.text())

    # -- data -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (what ``--json FILE`` writes)."""
        return {
            "format": self.format,
            "options": self.options,
            "target": self.target,
            "provenance": self.provenance,
            "settings": self.settings,
            "ok": self.ok,
            "verdict": self.verdict(),
            "totals": {d: dict(self.counts(d), failed=self.failed(d)) for d in self.directions},
            "phases": [p.to_dict() for p in self.phases],
            "counterexamples": {d: c.to_dict() for d, c in self.counterexamples.items()},
            "differences": self.differences,
            "diagnoses": [g.to_dict() for g in self.diagnoses],
            "faults": self.faults,
            "notes": self.notes,
            "files": [str(f) for f in self.files],
            "seconds": round(self.seconds, 3),
        }

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), indent=kw.pop("indent", 2), **kw)

    def save(
        self,
        directory: str | os.PathLike[str],
        fmt: Format,
        symbols: dict[str, str | None] | None = None,
        links: dict[str, list[str]] | None = None,
    ) -> list[Path]:
        """Write every counterexample (``.npz`` and ``.c``) into ``directory``; returns the paths (also kept in :attr:`files`).

        ``symbols``/``links``: per direction, the C symbol and the libraries its repro links with.
        """
        paths = []
        for d, ce in self.counterexamples.items():
            paths += ce.save(directory, fmt, (symbols or {}).get(d), (links or {}).get(d))
        self.files = [str(p) for p in paths]
        return paths
