"""The phases of a check, in order, for each direction the target implements; the check's own module.

The parts live beside it: the inputs of the bulk phases (:mod:`tbq.check.inputs`), what differs between
an encoder and a decoder (:mod:`tbq.check.directions`), the fuzz phase (:mod:`tbq.check.fuzz`) and the
settings (:mod:`tbq.check.settings`); this module runs the phases, keeps what fails, reduces the
counterexamples and assembles the report.

1. ``golden``: the golden input families of :mod:`tbq.golden` in bulk (every
   edge kind, then Gaussian, outlier and heavy-tailed rows), in rows of 128
   values; the decoder gets tbq's bytes of the same rows.
2. ``fuzz``: a hypothesis search over :mod:`tbq.testing.strategies`
   (``float_blocks`` for encoders; ``encoded_blocks``, valid and arbitrary,
   for decoders) for ``examples`` examples or ``seconds`` seconds. Every
   example is a batch of rows (one target call); hypothesis shrinks a failure
   to a minimal example.
3. ``bytes`` (decoders): arbitrary blocks (random bytes and fixed patterns),
   most with special fp16 scales (+-Inf, NaN, subnormals, +-0, +-65504).

Every block is classified by :mod:`tbq.check.classify` against tbq's own
codec (numba when it imports; identical bytes and bits to the NumPy spec),
with vectorised comparisons: only differing blocks are looked at closely.
Then the first minimal failing block of each direction becomes the
counterexample (hypothesis-shrunk when the fuzz phase found one, else the
first failing golden/bytes block reduced by zeroing values while it still
fails), and the diagnoses run over the kept failing blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..codecs import codec_from
from ..formats import Format
from ..parallel import require_memory
from ..progress import Progress
from .classify import (
    ACCEPTED,
    ACCEPTED_UNLESS_EXACT,
    CLASSES,
    EQUIVALENT,
    EXACT,
    FRAGILE,
    TIE_RULE,
    UNDEFINED,
    WRONG,
)
from .diagnose import (
    KEEP_BLOCKS,
    Diagnosis,
    Kept,
    describe_differences,
    describe_values,
    diagnose_accepted,
    diagnose_fragile,
    percent,
    select_kept,
)
from .directions import DIRECTIONS, Batch, Decoder, Direction, Encoder, Signature
from .fuzz import FuzzPhase, FuzzUnavailable, find_settings, hypothesis_scratch, require_hypothesis
from .inputs import golden_rows, random_blocks, row_len
from .report import CheckReport, Counterexample, PhaseResult, make_counterexample
from .settings import DEFAULT_BLOCKS, DEFAULT_EXAMPLES, DEFAULT_K, CheckSettings, accept_names, check_accept
from .targets import CALL_VALUES, Target, TargetError

__all__ = [
    "DEFAULT_BLOCKS",
    "DEFAULT_EXAMPLES",
    "DEFAULT_K",
    "run_check",
    "CheckSettings",
    "accept_names",
    "check_accept",
    "golden_rows",
    "random_blocks",
    "require_hypothesis",
    "find_settings",
    "FuzzUnavailable",
    "hypothesis_scratch",
]

#: Blocks classified at a time in the bulk phases (bounds the memory of a check of millions of blocks).
CHUNK_BLOCKS = 1 << 15
#: Peak bytes of the bulk phases per block: per value of the golden rows (the families' inputs and
#: what building them keeps: 9 to 11 bytes measured with tracemalloc) and per byte of the random
#: encoded blocks, plus a per-block allowance; rounded up. The classification itself is chunked.
BYTES_PER_VALUE, BYTES_PER_ENCODED_BYTE, BYTES_PER_BLOCK = 16, 4, 64


def check_memory(fmt: Format, blocks: int) -> int:
    """Bytes the golden and random-bytes phases of ``blocks`` blocks of ``fmt`` need (an estimate that errs high)."""
    info = fmt.info
    return int(blocks) * (BYTES_PER_VALUE * info.block_size + BYTES_PER_ENCODED_BYTE * info.type_size + BYTES_PER_BLOCK)


#: At most this many target calls go into reducing a golden counterexample.
SHRINK_CALLS = 200


# ---------------------------------------------------------------------------
# the check
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Phase:
    """One phase of the check: its name (the report's order is this list's) and its report note."""

    name: str
    note: str


#: The phases, in the report's order (the one list of them).
PHASES = (
    _Phase("golden", "edge kinds + gaussian, outliers, heavy_tail"),
    _Phase("fuzz", ""),
    _Phase("bytes", "arbitrary bytes, special fp16 scales"),
)
_PHASE = {p.name: p for p in PHASES}


class _Check:
    """One check of ``target`` under ``settings``: the phases of each direction, then the report."""

    def __init__(self, target: Target, settings: CheckSettings) -> None:
        self.target, self.fmt, self.settings = target, target.format, settings
        self.accept_diagnoses = settings.accept - set(CLASSES)
        #: the classes that fail: wrong, and under exact the ones accepted unless exact that accept does not waive
        self.failing_classes = [WRONG] + (
            [c for c in ACCEPTED_UNLESS_EXACT if CLASSES[c] not in settings.accept] if settings.exact else []
        )
        # what the reference writers store for a value that does not fit: the C code's infinities, FP8's saturation
        stored = self.fmt.golden.on_overflow if self.fmt.golden.on_overflow != "raise" else "inf"
        self.codec = codec_from(self.fmt.name, self.fmt.config(), on_overflow=stored)
        self.dirs = {d: DIRECTIONS[d](self) for d in target.directions}
        self.notes: list[str] = []
        self.diagnoses: list[Diagnosis] = []
        self.golden_x: NDArray[np.float32] | None = None

    # -- one batch --------------------------------------------------------------------------
    def failing(self, cls: NDArray[np.uint8]) -> NDArray[np.bool_]:
        return np.isin(cls, self.failing_classes)

    def quantize_batch(self, x: NDArray[np.float32]) -> Batch:
        """Classify the target's bytes of rows ``x``; returns (Classified, ref, got)."""
        return Encoder(self).run(x)

    def dequantize_batch(self, data: NDArray[np.uint8]) -> Batch:
        return Decoder(self).run(data)

    def classify(self, d: Direction, rows: NDArray[Any]) -> Batch:
        """``d.run(rows)``, then the wrong blocks a diagnosis named in ``accept`` explains by themselves become accepted."""
        c, ref, got = d.run(rows)
        if self.accept_diagnoses and c.idx.size:
            wrong = c.idx[c.cls[c.idx] == WRONG]
            for w0 in range(0, wrong.size, KEEP_BLOCKS):
                part = wrong[w0 : w0 + KEEP_BLOCKS]
                kept = Kept()
                d.keep(kept, c.cls[part], [("", 0)] * part.size, rows, part, ref, got)
                allk = kept.get("wrong")
                for i, b in enumerate(part):
                    one = select_kept(allk, np.array([i]))
                    with np.errstate(all="ignore"):
                        names = {g.name for g in d.diagnose(one)}
                    if names & self.accept_diagnoses:
                        c.cls[b] = ACCEPTED
        return c, ref, got

    def record(self, d: Direction, phase: str, rows: NDArray[Any], batch: Batch, offset: int = 0) -> None:
        """Keep the non-exact blocks of a ``batch`` (of input ``rows``) for the diagnoses and remember the first failing ones."""
        c, ref, got = batch
        per_row = rows.shape[1] // d.width()
        idx = c.idx
        if not idx.size:
            return
        for cls in range(1, len(CLASSES)):
            bi = idx[c.cls[idx] == cls]
            if not bi.size:
                continue
            if cls not in d.first:
                b = int(bi[0])
                d.first[cls] = (phase, rows[b // per_row].copy(), b % per_row, "")
                d.batch[cls] = self.call_of(rows, b, per_row)
            keep = bi[: d.kept[cls].room]
            if not keep.size:
                continue
            where = [(phase, offset + int(i)) for i in keep]
            d.keep(d.kept[cls], c.cls[keep], where, rows, keep, ref, got)

    def _phase(self, d: Direction, phase: str, rows: NDArray[Any]) -> None:
        """One bulk phase, in chunks of about :data:`CHUNK_BLOCKS` blocks (one target call per chunk where it allows)."""
        t0 = time.perf_counter()
        width = d.width()
        step = max(1, CHUNK_BLOCKS // max(1, rows.shape[1] // width))
        counts = np.zeros(len(CLASSES), np.int64)
        for r0 in range(0, rows.shape[0], step):
            chunk = rows[r0 : r0 + step]
            batch = self.classify(d, chunk)
            self.record(d, phase, chunk, batch, offset=r0 * (rows.shape[1] // width))
            counts += np.bincount(batch[0].cls, minlength=len(CLASSES))
        d.phases.append(PhaseResult.from_counts(d.name, phase, counts, time.perf_counter() - t0, _PHASE[phase].note))

    def call_of(self, rows: NDArray[Any], b: int, per_row: int) -> tuple[NDArray[Any], int] | None:
        """The rows of the target call that got flat block ``b``, as one row (blocks are independent),
        and ``b``'s index in it: a kernel whose result depends on the call's length fails there, maybe not on one row."""
        if self.fmt.row_rule:
            return None
        r = b // per_row
        k = rows.shape[1] if rows.dtype == np.float32 else rows.shape[1] // self.fmt.type_size * self.fmt.block_size
        per_call = max(1, CALL_VALUES // max(1, k))  # the rows of one call (LibraryTarget's chunks)
        r0 = r // per_call * per_call
        return np.ascontiguousarray(rows[r0 : r0 + per_call]).reshape(-1).copy(), (r - r0) * per_row + b % per_row

    # -- counterexamples ---------------------------------------------------------------------
    def _fails(self, d: Direction, row: NDArray[Any]) -> tuple[bool, int, int, Signature | None]:
        """``(failing, first failing block, its class, its signature)`` of one input row."""
        c, ref, got = self.classify(d, row[None, :])
        bad = np.flatnonzero(self.failing(c.cls))
        if not bad.size:
            return False, -1, EXACT, None
        b = int(bad[0])
        return True, b, int(c.cls[b]), d.signature(ref, got, b)

    def _reduce(
        self, d: Direction, row: NDArray[Any], blk: int, batch: tuple[NDArray[Any], int] | None = None
    ) -> tuple[NDArray[Any], int, str]:
        """A smaller failing input: the block alone (when blocks are independent); when the block alone passes, the
        shortest run of blocks around it that still fails (a kernel whose body and tail differ); then values zeroed
        while it fails in the same way (the same fields differ; decoders: the same kind of value difference)."""
        width = d.width()
        calls = 1
        cur = row
        start = ""
        ok, first, _, sig = self._fails(d, cur)
        if not ok and batch is not None and batch[0].size > row.size:
            cur, blk = batch
            calls += 1
            ok, first, _, sig = self._fails(d, cur)
            start = (
                f"its row alone passes, the {cur.size // row.size} rows of the target call up to it fail as one row; "
            )
        if not ok:  # pragma: no cover - a target that does not answer the same input the same way
            return row, blk, "not reduced: the target does not fail on it again"
        blk = first
        shrunk_row = False
        if not self.fmt.row_rule and cur.size > width:
            single = cur[blk * width : (blk + 1) * width].copy()
            calls += 1
            ok, _, _, s1 = self._fails(d, single)
            if ok and s1 == sig:
                cur, blk = single, 0
            else:  # the block alone passes: cut whole blocks from the end, then from the start, while it still fails
                # cuts of multiples of large powers of two first: a SIMD body's alignment survives them
                # (the end: keep a multiple of p blocks through the failing one; the start: drop a multiple of p)
                for side in ("end", "start", "end"):
                    p = 1 << 30
                    while p >= 1 and calls < SHRINK_CALLS:
                        n = cur.size // width
                        cut = n - -(-(blk + 1) // p) * p if side == "end" else blk // p * p
                        if cut <= 0:
                            p //= 2
                            continue
                        cand = cur[: (n - cut) * width] if side == "end" else cur[cut * width :]
                        calls += 1
                        ok, f2, _, s2 = self._fails(d, cand)
                        if ok and s2 == sig and f2 == (blk if side == "end" else blk - cut):
                            cur, blk = cand.copy(), f2
                        else:
                            p //= 2
                shrunk_row = True
        bits = cur.view(np.uint32) if cur.dtype == np.float32 else cur
        chunk = max(1, cur.size // 2)
        zeroed = 0
        while chunk >= 1 and calls < SHRINK_CALLS:
            for i in range(0, cur.size, chunk):
                if calls >= SHRINK_CALLS:
                    break
                if not bits[i : i + chunk].any():
                    continue
                cand = cur.copy()
                cand[i : i + chunk] = 0
                calls += 1
                ok, first, _, s2 = self._fails(d, cand)
                if ok and s2 == sig:
                    zeroed += int(np.count_nonzero(bits[i : i + chunk]))
                    cur, blk = cand, first
                    bits = cur.view(np.uint32) if cur.dtype == np.float32 else cur
            chunk //= 2
        if shrunk_row:
            how = (
                f"{start}the block alone passes: the minimal failing row is {cur.size} {d.unit} ({cur.size // width} blocks, "
                "cut while it kept failing)"
            )
        else:
            how = start + ("the block alone" if cur.size == width else "its row (blocks depend on their row)")
        how += f", {zeroed} {d.unit} zeroed while it kept failing the same way ({calls} target calls)"
        return cur, blk, how

    def counterexample(self, d: Direction) -> Counterexample | None:
        refused = [c for c in self.failing_classes if c in d.first]
        pick = refused[0] if refused else None
        if pick is None:
            return None
        phase, row, blk, how = d.first[pick]
        row, blk, reduced = self._reduce(d, row, blk, d.batch.get(pick))
        how = f"{how}; then {reduced}" if how else reduced
        c, ref, got = self.classify(d, row[None, :])
        bad = np.flatnonzero(self.failing(c.cls))
        if not bad.size:  # pragma: no cover - a target that does not answer the same input the same way
            return None
        if blk not in bad:
            blk = int(bad[0])
        trace = d.trace(row, blk)
        return make_counterexample(
            self.fmt,
            d.name,
            phase,
            inp=row,
            expected=ref,
            got=got,
            block=blk,
            cls=int(c.cls[blk]),
            trace=trace,
            k=self.settings.k,
            how=how,
        )

    # -- diagnoses that need the target -----------------------------------------------------------
    def _unwritten(self, d: Direction, ce: Counterexample | None) -> Diagnosis | None:
        if self.target.kind != "library" or ce is None:
            return None
        row = ce.input[None, :]
        a, b, width, unit = d.outputs(row)
        diff = np.flatnonzero((a != b).reshape(-1))
        if not diff.size:
            return None
        where = d.field_names(diff, width)
        return Diagnosis(
            "unwritten",
            f"the kernel leaves part of its output unwritten ({diff.size} {unit}s of the counterexample)",
            [
                f"{unit}s {', '.join(str(int(o)) for o in diff[:16])}{' ...' if diff.size > 16 else ''} of the output keep whatever the "
                "buffer held before the call (they differ between a buffer filled with 0x00 and one filled with 0xFF)"
                + (f"; fields: {', '.join(where)}" if where else "")
            ],
            d.name,
        )

    def _round_trip(self) -> Diagnosis | None:
        if len(self.dirs) < 2 or not any(self._direction_failed(d) for d in self.dirs.values()):
            return None
        kept = self.dirs["quantize"].kept[WRONG].get()
        bs = self.fmt.block_size
        if kept and kept["cls"].size >= 16 and not self.fmt.row_rule:
            xs = kept["x"][:256]  # one block per row: the blocks are independent
        elif self.golden_x is not None:
            xs = self.golden_x[-min(64, self.golden_x.shape[0]) :]
        else:
            return None
        xs = np.ascontiguousarray(xs, np.float32)
        own_bytes = self.target.quantize(xs)
        ref_bytes = self.codec.encode(xs)
        if np.array_equal(own_bytes, ref_bytes):
            return None
        yt = self.target.dequantize(own_bytes).reshape(-1, bs).astype(np.float64)
        yx = self.target.dequantize(ref_bytes).reshape(-1, bs).astype(np.float64)
        yr = self.codec.decode(ref_bytes).reshape(-1, bs).astype(np.float64)
        # the input in the decoder's domain (turbo's rotated one; the identity for most formats): what y approximates
        x = np.asarray(self.fmt.domain.to_decode_domain(xs.reshape(-1, bs).astype(np.float64)), np.float64)
        with np.errstate(all="ignore"):
            nx = np.sqrt((x * x).sum(1))
            keep = (nx > 0) & np.isfinite(nx)
            if keep.sum() < 4:
                return None

            def err(y: NDArray[np.float64]) -> NDArray[np.float64]:
                return np.sqrt(((y - x) ** 2).sum(1))[keep] / nx[keep]

            bt, bx, br = err(yt), err(yx), err(yr)
            et, ex, er = (float(np.nanmedian(b)) for b in (bt, bx, br))
            worse = float(
                np.mean(~(bx <= 1.01 * bt))
            )  # blocks where decoding tbq's bytes is worse than the own round trip
        # the own round trip is as good as tbq's (within 10%), decoding tbq's bytes clearly worse, block after block
        if not (np.isfinite(et) and et <= 1.1 * er + 1e-7 and not ex <= 1.25 * er + 1e-6 and worse >= 0.75):
            return None
        return Diagnosis(
            "round_trip",
            "the target's own encode/decode round trip agrees, but decoding tbq's bytes does not: the "
            "target gives the bytes another meaning (a different sign table, rotation or codebook, or another packing)",
            [
                f"median relative error over {int(keep.sum())} blocks: target encode + target decode {et:.4g}, tbq round trip {er:.4g}, "
                f"target decoding tbq's bytes {ex:.4g} (worse than the target's own round trip in {percent(worse)} of the blocks)",
                "so the target's encoder and decoder agree with each other but not with tbq's bytes",
            ],
            "both",
        )

    def _direction_failed(self, d: Direction) -> bool:
        w = sum(p.wrong for p in d.phases)
        f = sum(getattr(p, CLASSES[c]) for p in d.phases for c in self.failing_classes if c != WRONG)
        return bool(w or f or self.target.faults.get(d.name))

    def _accepted_diagnoses(self, d: Direction) -> list[Diagnosis]:
        """What the blocks of the accepted non-exact classes are (equivalent, undefined, tie_rule)."""
        total = sum(p.blocks - p.exact for p in d.phases)
        out: list[Diagnosis] = []
        waived = d.kept[ACCEPTED].get("accepted")
        if waived:
            for g in d.diagnose(waived):
                if g.name in self.accept_diagnoses:
                    g.direction, g.scope = d.name, "accepted"
                    g.evidence.append(f"waived by accept={g.name!r}; the check went on looking for other failures")
                    if waived.get("x") is not None:
                        g.evidence.append(f"e.g. the block with input {describe_values(waived['x'][0])}")
                    elif waived.get("data") is not None:
                        g.evidence.append(f"e.g. the block with bytes {waived['data'][0].tobytes().hex(' ')}")
                    out.append(g)
        for c in (EQUIVALENT, UNDEFINED, TIE_RULE):
            kept = d.kept[c].get(CLASSES[c])
            rule = ""
            if c == UNDEFINED and kept:
                rule = self.fmt.checker.undefined_blocks(kept["trace"])[1]
            out += diagnose_accepted(self.fmt, d.name, CLASSES[c], kept, total, rule)
        return out

    # -- all of it -------------------------------------------------------------------------------
    def run(self) -> CheckReport:
        """Every phase of every direction, then the report."""
        t0 = time.perf_counter()
        self._run_phases()
        report = CheckReport(
            self.fmt.name,
            options=self.fmt.config(),
            target=self.target.description,
            settings=self.settings.report_settings(self.codec.backend),
        )
        report.provenance = self.target.provenance()
        self._note_provenance(report.provenance)
        for d in self.dirs.values():
            report.phases.extend(sorted(d.phases, key=lambda p: PHASES.index(_PHASE[p.phase])))
        for d in self.dirs.values():
            self._report_direction(report, d)
        rt = self._round_trip()
        if rt is not None:
            report.diagnoses.append(rt)
        for name, msgs in self.target.faults.items():
            report.faults[name] = list(msgs)
        report.notes = self.notes
        report.seconds = time.perf_counter() - t0
        return report

    def _run_phases(self) -> None:
        """The golden, fuzz and bytes phases of each direction, with a progress bar."""
        fuzz = self.settings.fuzzes
        golden = len(self.dirs) if self.settings.blocks else 0
        bytes_dirs = [d for d in self.dirs.values() if "bytes" in d.phase_names] if self.settings.blocks else []
        steps = golden + (len(self.dirs) if fuzz else 0) + len(bytes_dirs)
        with Progress(max(1, steps), "tbq check", enabled=self.settings.progress) as bar:
            self._smoke()
            if self.settings.blocks:
                x = golden_rows(self.fmt, self.settings.blocks, self.settings.seed)
                self.golden_x = x
                ref_bytes = self.codec.encode(x)
                for d in self.dirs.values():
                    self._phase(d, "golden", d.golden_input(x, ref_bytes))
                    bar.step(f"{d.name} golden")
            for d in self.dirs.values():
                if fuzz:
                    with hypothesis_scratch():
                        FuzzPhase(self).run(d)
                    bar.step(f"{d.name} fuzz")
                else:
                    d.phases.append(
                        PhaseResult.from_counts(d.name, "fuzz", [0] * len(CLASSES), 0.0, "skipped (examples 0)")
                    )
            for d in bytes_dirs:
                self._phase(d, "bytes", random_blocks(self.fmt, self.settings.blocks, self.settings.seed))
                bar.step(f"{d.name} bytes")

    def _note_provenance(self, provenance: dict[str, dict[str, Any]]) -> None:
        """A note for each symbol the dynamic loader found in a dependency rather than in the library named."""
        for key, pv in provenance.items():
            if pv.get("elsewhere"):
                self.notes.append(
                    f"{key}: {pv['symbol']} is not defined in {pv['library']} but in {pv['file']} (a dependency the "
                    "dynamic loader searched): that file's function was checked; --strict-lib refuses it"
                )

    def _report_direction(self, report: CheckReport, d: Direction) -> None:
        """One direction's diagnoses into ``report``, and when it failed its counterexample and differences."""
        report.diagnoses.extend(diagnose_fragile(self.fmt, d.name, d.kept[FRAGILE].get("fragile")))
        report.diagnoses.extend(self._accepted_diagnoses(d))
        if not self._direction_failed(d):
            return
        ce = self.counterexample(d)
        if ce is not None:
            report.counterexamples[d.name] = ce
        kept = d.kept[WRONG].get()
        report.differences[d.name] = describe_differences(self.fmt, d.name, kept)
        found = d.diagnose(kept)
        extra = self._unwritten(d, ce)
        report.diagnoses.extend(([extra] if extra else []) + found)

    def _smoke(self) -> None:
        """One call per direction on a row of zeros, so a target that cannot run fails before any work."""
        x = np.zeros((1, row_len(self.fmt)), np.float32)
        for d in self.dirs.values():
            d.smoke(x)


def run_check(target: Target, settings: CheckSettings | None = None, **keywords: Any) -> CheckReport:
    """Run every phase on ``target`` and return the :class:`~tbq.check.report.CheckReport`.

    ``settings``: a :class:`~tbq.check.settings.CheckSettings`; ``keywords``: its fields (``blocks=``,
    ``examples=``, ``seconds=``, ``exact=``, ``k=``, ``seed=``, ``progress=``, ``accept=``), replacing the
    ones of ``settings`` when both are given. The fields' meanings are :class:`~tbq.check.settings.CheckSettings`'.
    """
    s = CheckSettings.of(settings, keywords)
    if not target.directions:
        raise TargetError(f"{target.description} implements neither quantize nor dequantize")
    if s.fuzzes:
        require_hypothesis()
    require_memory(check_memory(target.format, s.blocks), f"checking {s.blocks:,} blocks of {target.format.name}")
    return _Check(target, s).run()
