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

>>> p = PhaseResult("quantize", "golden", blocks=10, exact=9, fragile=1, wrong=0, seconds=0.01)
>>> r = CheckReport("q8_0", options={}, target="demo", settings={"exact": False}, phases=[p])
>>> r.ok, r.counts()
(True, {'blocks': 10, 'exact': 9, 'fragile': 1, 'wrong': 0, 'equivalent': 0, 'undefined': 0, 'tie_rule': 0, 'accepted': 0})
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..formats import Format
from .classify import CLASSES
from .counterexample import AnyCounterexample, Counterexample, make_counterexample
from .diagnose import Diagnosis
from .targets import DIRECTIONS

__all__ = ["PhaseResult", "Counterexample", "CheckReport", "make_counterexample"]

PHASES = ("golden", "fuzz", "bytes")


@dataclass
class PhaseResult:
    """Counts of one phase of one direction."""

    direction: str
    phase: str
    _: KW_ONLY
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
            blocks=sum(c.values()),
            exact=c["exact"],
            fragile=c["fragile"],
            wrong=c["wrong"],
            seconds=seconds,
            note=note,
            equivalent=c["equivalent"],
            undefined=c["undefined"],
            tie_rule=c["tie_rule"],
            accepted=c["accepted"],
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
    _: KW_ONLY
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
