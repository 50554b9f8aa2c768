"""The phases of a check, in order, for each direction the target implements.

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

import contextlib
import os
import random
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ..codecs import codec_from
from ..errors import TbqValueError
from ..formats import Format
from ..formats.base import FIELD_KINDS
from ..golden.families import EDGE_KINDS, ROW_SIZE, make_inputs
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
    Classified,
    Trace,
    classify_decoded,
    classify_encoded,
    encoder_trace,
)
from .diagnose import (
    KEEP_BLOCKS,
    Diagnosis,
    Kept,
    KeptBlocks,
    describe_differences,
    describe_values,
    diagnose_accepted,
    diagnose_decoder,
    diagnose_encoder,
    diagnose_fragile,
    percent,
    select_kept,
)
from .report import CheckReport, Counterexample, PhaseResult, make_counterexample
from .settings import DEFAULT_BLOCKS, DEFAULT_EXAMPLES, DEFAULT_K, CheckSettings, accept_names, check_accept
from .targets import CALL_VALUES, Target, TargetError

if TYPE_CHECKING:  # hypothesis is optional: imported where the fuzz phase runs
    from hypothesis.strategies import SearchStrategy

#: A batch's classes with tbq's and the target's outputs: ``(Classified, ref, got)``.
Batch = tuple[Classified, NDArray[Any], NDArray[Any]]
#: What tells two failures of one block apart while reducing: the differing fields (encoders) or whether
#: values differ beyond signed zeros and NaN payloads (decoders).
Signature = tuple[str, ...] | bool

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


#: Rows per fuzz example (each example is one target call).
FUZZ_ROWS = 4
#: At most this many target calls go into reducing a golden counterexample.
SHRINK_CALLS = 200
#: Seconds hypothesis may spend shrinking a failure (its own limit is 5 minutes; a failure that depends on the
#: length of the call, such as a SIMD body's, makes it try tens of thousands of candidates). The check's own
#: reduction then cuts the example further.
SHRINK_SECONDS = 10.0
#: Examples per hypothesis run when the fuzz phase has a time budget (``seconds``).
ROUND_EXAMPLES = 25

#: At most this many rows of each edge kind (they are built one at a time; about 0.4 ms a row).
EDGE_REPEATS = 32

#: fp16 (and bfloat16) bit-pattern ranges the bytes phase writes into scale fields, inclusive.
#: The special fp16 / bf16 patterns (the field kinds' own lists, :data:`tbq.formats.base.FIELD_KINDS`).
SPECIAL_F16 = FIELD_KINDS["f16"].specials
SPECIAL_BF16 = FIELD_KINDS["bf16"].specials


class FuzzUnavailable(TbqValueError):
    """The fuzz phase was asked for but hypothesis is not installed."""


def require_hypothesis() -> None:
    """Raise :class:`FuzzUnavailable` (one line) unless hypothesis imports."""
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise FuzzUnavailable(
            "the fuzz phase needs the hypothesis package (pip install hypothesis, or pip install 'tbq[test]'); "
            "pass --examples 0 (examples=0 in Python) to skip the fuzz phase"
        ) from None


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------


def _row_len(fmt: Format) -> int:
    bs = fmt.block_size
    return ROW_SIZE if ROW_SIZE % bs == 0 else bs * -(-ROW_SIZE // bs)


def _table_kw(fmt: Format) -> dict[str, Any]:
    """The golden tables (codebook, signs) the edge rows are built with: the format's own where it has them."""
    cfg = fmt.config()
    return {key: cfg[key] for key in ("codebook", "signs") if key in cfg}


def golden_rows(fmt: Format, blocks: int, seed: int = 0) -> NDArray[np.float32]:
    """float32 rows of 128 values holding about ``blocks`` blocks of ``fmt`` from the golden families.

    Every edge kind of :data:`tbq.golden.EDGE_KINDS` at least once (about a
    tenth of the rows, at most :data:`EDGE_REPEATS` of each), the rest split over the Gaussian, outlier and
    heavy-tailed families; the same seeds as ``tbq golden --seed``.

    >>> golden_rows(__import__("tbq").get_format("q4_0"), 400).shape
    (100, 128)
    """
    per_row = _row_len(fmt) // fmt.block_size
    n_rows = max(1, -(-blocks // per_row))
    reps = max(1, min(EDGE_REPEATS, round(n_rows * 0.1 / len(EDGE_KINDS))))
    edge_rows = len(EDGE_KINDS) * reps
    rest = max(0, n_rows - edge_rows)
    kw = _table_kw(fmt)
    parts = [make_inputs(edge_rows, seed, ("edge",), **kw)["x"]]
    if rest:
        parts.append(make_inputs(-(-rest // 3), seed, ("gaussian", "outliers", "heavy_tail"), **kw)["x"])
    x = np.concatenate(parts)
    if _row_len(fmt) != ROW_SIZE:  # a block longer than a golden row, or one that does not divide it
        flat = x.reshape(-1)
        x = flat[: flat.size // _row_len(fmt) * _row_len(fmt)].reshape(-1, _row_len(fmt))
    return np.ascontiguousarray(x[:n_rows], np.float32)


def random_blocks(fmt: Format, blocks: int, seed: int = 0) -> NDArray[np.uint8]:
    """uint8 rows of arbitrary encoded blocks: random bytes and patterns, most scale fields special values.

    Every field whose kind has special 16-bit patterns (``f16``: :data:`SPECIAL_F16`,
    ``bf16``: ``SPECIAL_BF16``) gets, in two blocks of three, one of them in turn.

    >>> random_blocks(__import__("tbq").get_format("q8_0"), 8).shape
    (2, 136)
    """
    ts = fmt.type_size
    per_row = _row_len(fmt) // fmt.block_size
    n_rows = max(1, -(-blocks // per_row))
    n = n_rows * per_row
    rng = np.random.default_rng(seed * 1000 + 77)
    data = rng.integers(0, 256, (n, ts), dtype=np.uint8)
    for i, byte in enumerate((0x00, 0xFF, 0x0F, 0xF0, 0x55, 0xAA, 0x88, 0x77)):
        if 8 * i < n:
            data[8 * i] = byte
    for f in fmt.info.layout:
        table = FIELD_KINDS[f.kind].specials if f.kind in FIELD_KINDS else None
        if not table or f.size % 2:
            continue
        kinds = list(table.values())
        for off in range(f.offset, f.offset + f.size, 2):
            pick = np.flatnonzero(np.arange(n) % 3 != 2)
            which = (pick // 3 * 2 + pick % 3 + off) % len(kinds)
            lo = np.array([kinds[w][0] for w in which])
            hi = np.array([kinds[w][1] for w in which])
            bits = (lo + rng.integers(0, 1 << 16, pick.size) % (hi - lo + 1)).astype("<u2")
            data[pick, off : off + 2] = bits.view(np.uint8).reshape(-1, 2)
    return data.reshape(n_rows, per_row * ts)


# ---------------------------------------------------------------------------
# the check
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def hypothesis_scratch() -> Iterator[None]:
    """Hypothesis's storage (its example database is off; it also caches constants) in a temporary directory.

    Unless the user chose a place (``HYPOTHESIS_STORAGE_DIRECTORY`` or
    ``hypothesis.configuration.set_hypothesis_home_dir``), hypothesis writes
    ``.hypothesis/`` into the working directory: a check writes nothing there.
    """
    from hypothesis import configuration

    key = "__hypothesis_home_directory"
    if os.getenv("HYPOTHESIS_STORAGE_DIRECTORY") or getattr(configuration, key, None) is not None:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="tbq-check-hypothesis-") as tmp:
        configuration.set_hypothesis_home_dir(tmp)
        try:
            yield
        finally:
            configuration.set_hypothesis_home_dir(None)


def find_settings(max_examples: int) -> Any:
    """The settings of a fuzz phase's ``hypothesis.find``: at least one example, no deadline, no example database,
    quiet, generate and shrink only, no health checks (a target's speed and its inputs are not the user's tests)."""
    import hypothesis
    from hypothesis import HealthCheck, Phase, Verbosity

    return hypothesis.settings(
        max_examples=max(1, max_examples),
        deadline=None,
        database=None,
        verbosity=Verbosity.quiet,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )


class _ShrinkTimeout(BaseException):
    """Stops hypothesis's shrink once :data:`SHRINK_SECONDS` have passed (a BaseException: hypothesis does not shrink it)."""


class _Abort(BaseException):
    """Carries a TargetError out of hypothesis without a shrink (hypothesis would shrink an Exception)."""


class _Direction:
    """One direction of the check (the target's encoder or decoder): everything that differs between them.

    The check itself (:class:`_Check`) runs the same phases, records, reductions and counterexamples for
    both, asking its direction objects for the unit of an input row (``width``), the reference and
    target calls (``run``), what to keep of a non-exact block, the fuzz strategy, the signature of a
    difference and the diagnoses.
    """

    name = ""
    unit = ""  #: what an input row holds ("values" / "bytes")
    phase_names: tuple[str, ...] = ("golden", "fuzz")  #: the phases of :data:`PHASES` this direction runs

    def __init__(self, check: _Check) -> None:
        self.check, self.fmt = check, check.fmt
        self.phases: list[PhaseResult] = []
        self.kept = {c: Kept() for c in range(1, len(CLASSES))}  # every class but exact
        self.first: dict[
            int, tuple[str, NDArray[Any], int, str]
        ] = {}  # class -> (phase, input row(s), block index, how)
        #: class -> (the target call's rows up to the failing one as one row, the failing block in it), or None
        self.batch: dict[int, tuple[NDArray[Any], int] | None] = {}

    def width(self) -> int:
        """Input items per block."""
        raise NotImplementedError

    def run(self, rows: NDArray[Any]) -> Batch:
        """``(Classified, ref, got)`` of input ``rows``."""
        raise NotImplementedError

    def keep(
        self,
        kept: Kept,
        cls: NDArray[np.uint8],
        where: list[tuple[str, int]],
        rows: NDArray[Any],
        keep: NDArray[np.intp],
        ref: NDArray[Any],
        got: NDArray[Any],
    ) -> None:
        raise NotImplementedError

    def golden_input(self, x: NDArray[np.float32], ref_bytes: NDArray[np.uint8]) -> NDArray[Any]:
        raise NotImplementedError

    def strategy(self, max_blocks: int, lead: SearchStrategy[tuple[int, ...]]) -> SearchStrategy[NDArray[Any]]:
        raise NotImplementedError

    def signature(self, ref: NDArray[Any], got: NDArray[Any], b: int) -> Signature:
        raise NotImplementedError

    def trace(self, row: NDArray[Any], blk: int) -> Trace | None:
        return None

    def outputs(self, row: NDArray[Any]) -> tuple[NDArray[Any], NDArray[Any], int, str]:
        """The target's outputs of ``row`` into buffers filled two ways (``(a, b, width, unit)``), for the unwritten check."""
        raise NotImplementedError

    def field_names(self, diff: NDArray[np.intp], width: int) -> list[str]:
        return []

    def diagnose(self, kept: KeptBlocks) -> list[Diagnosis]:
        raise NotImplementedError

    def smoke(self, x: NDArray[np.float32]) -> None:
        """One target call on float32 rows ``x`` (encoded first for a decoder)."""
        raise NotImplementedError


class _Encoder(_Direction):
    name, unit = "quantize", "values"

    def width(self) -> int:
        return self.fmt.block_size

    def run(self, x: NDArray[np.float32]) -> Batch:
        """Classify the target's bytes of rows ``x``."""
        ref = self.check.codec.encode(x)
        got = self.check.target.quantize(x)
        return classify_encoded(self.fmt, x, ref, got, self.check.settings.k), ref, got

    def keep(
        self,
        kept: Kept,
        cls: NDArray[np.uint8],
        where: list[tuple[str, int]],
        rows: NDArray[Any],
        keep: NDArray[np.intp],
        ref: NDArray[Any],
        got: NDArray[Any],
    ) -> None:
        ts = self.fmt.type_size
        trace, xb = encoder_trace(self.fmt, rows, keep)
        kept.add(cls, where, x=xb, ref=ref.reshape(-1, ts)[keep], got=got.reshape(-1, ts)[keep], trace=trace)

    def golden_input(self, x: NDArray[np.float32], ref_bytes: NDArray[np.uint8]) -> NDArray[Any]:
        return x

    def strategy(self, max_blocks: int, lead: SearchStrategy[tuple[int, ...]]) -> SearchStrategy[NDArray[Any]]:
        from ..testing import strategies as tst

        return tst.float_blocks(self.check.codec, min_blocks=1, max_blocks=max_blocks, leading_shape=lead)

    def signature(self, ref: NDArray[Any], got: NDArray[Any], b: int) -> Signature:
        """The fields that differ (reduction keeps them)."""
        ts = self.fmt.type_size
        e, g = ref.reshape(-1, ts)[b : b + 1], got.reshape(-1, ts)[b : b + 1]
        Fe, Fg = self.fmt.fields(e), self.fmt.fields(g)
        return tuple(
            n for n in Fe if not np.array_equal(np.asarray(Fe[n]).view(np.uint8), np.asarray(Fg[n]).view(np.uint8))
        )

    def trace(self, row: NDArray[Any], blk: int) -> Trace | None:
        return encoder_trace(self.fmt, row[None, :], np.array([blk]))[0]

    def outputs(self, row: NDArray[Any]) -> tuple[NDArray[Any], NDArray[Any], int, str]:
        t = self.check.target
        return t.quantize(row, fill=0x00), t.quantize(row, fill=0xFF), self.fmt.type_size, "byte"

    def field_names(self, diff: NDArray[np.intp], width: int) -> list[str]:
        names = {o: f.name for f in self.fmt.info.layout for o in range(f.offset, f.offset + f.size)}
        return sorted({names.get(int(o) % width, "?") for o in diff})

    def diagnose(self, kept: KeptBlocks) -> list[Diagnosis]:
        return diagnose_encoder(self.fmt, kept, self.check.settings.k)

    def smoke(self, x: NDArray[np.float32]) -> None:
        self.check.target.quantize(x)


class _Decoder(_Direction):
    name, unit = "dequantize", "bytes"
    phase_names = ("golden", "fuzz", "bytes")  # decoders also meet arbitrary bytes

    def width(self) -> int:
        return self.fmt.type_size

    def run(self, data: NDArray[np.uint8]) -> Batch:
        ref = self.check.codec.decode(data)
        got = self.check.target.dequantize(data)
        return classify_decoded(self.fmt, data, ref, got), ref, got

    def keep(
        self,
        kept: Kept,
        cls: NDArray[np.uint8],
        where: list[tuple[str, int]],
        rows: NDArray[Any],
        keep: NDArray[np.intp],
        ref: NDArray[Any],
        got: NDArray[Any],
    ) -> None:
        ts, bs = self.fmt.type_size, self.fmt.block_size
        kept.add(
            cls, where, data=rows.reshape(-1, ts)[keep], ref=ref.reshape(-1, bs)[keep], got=got.reshape(-1, bs)[keep]
        )

    def golden_input(self, x: NDArray[np.float32], ref_bytes: NDArray[np.uint8]) -> NDArray[Any]:
        return ref_bytes

    def strategy(self, max_blocks: int, lead: SearchStrategy[tuple[int, ...]]) -> SearchStrategy[NDArray[Any]]:
        from hypothesis import strategies as st

        from ..testing import strategies as tst

        c = self.check.codec
        return st.one_of(
            tst.encoded_blocks(c, valid=True, min_blocks=1, max_blocks=max_blocks, leading_shape=lead),
            tst.encoded_blocks(c, valid=False, min_blocks=1, max_blocks=max_blocks, leading_shape=lead),
        )

    def signature(self, ref: NDArray[Any], got: NDArray[Any], b: int) -> Signature:
        """Whether values differ beyond the sign of zero and NaN payloads."""
        bs = self.fmt.block_size
        e, g = ref.reshape(-1, bs)[b].astype(np.float64), got.reshape(-1, bs)[b].astype(np.float64)
        with np.errstate(all="ignore"):
            return bool(((e != g) & ~(np.isnan(e) & np.isnan(g))).any())

    def outputs(self, row: NDArray[Any]) -> tuple[NDArray[Any], NDArray[Any], int, str]:
        t = self.check.target
        a, b = t.dequantize(row, fill=0x00000000), t.dequantize(row, fill=0xFFFFFFFF)
        return a.view(np.uint32), b.view(np.uint32), self.fmt.block_size, "value"

    def diagnose(self, kept: KeptBlocks) -> list[Diagnosis]:
        return diagnose_decoder(self.fmt, kept)

    def smoke(self, x: NDArray[np.float32]) -> None:
        self.check.target.dequantize(self.check.codec.encode(x))


_DIRECTIONS: dict[str, type[_Direction]] = {d.name: d for d in (_Encoder, _Decoder)}


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
        self.dirs = {d: _DIRECTIONS[d](self) for d in target.directions}
        self.notes: list[str] = []
        self.diagnoses: list[Diagnosis] = []
        self.golden_x: NDArray[np.float32] | None = None

    # -- one batch --------------------------------------------------------------------------
    def _failing(self, cls: NDArray[np.uint8]) -> NDArray[np.bool_]:
        return np.isin(cls, self.failing_classes)

    def quantize_batch(self, x: NDArray[np.float32]) -> Batch:
        """Classify the target's bytes of rows ``x``; returns (Classified, ref, got)."""
        return _Encoder(self).run(x)

    def dequantize_batch(self, data: NDArray[np.uint8]) -> Batch:
        return _Decoder(self).run(data)

    def _classify(self, d: _Direction, rows: NDArray[Any]) -> Batch:
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

    def _record(
        self,
        d: _Direction,
        phase: str,
        rows: NDArray[Any],
        c: Classified,
        ref: NDArray[Any],
        got: NDArray[Any],
        offset: int = 0,
    ) -> None:
        """Keep the non-exact blocks of a batch for the diagnoses and remember the first failing ones."""
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
                d.batch[cls] = self._call_of(rows, b, per_row)
            keep = bi[: d.kept[cls].room]
            if not keep.size:
                continue
            where = [(phase, offset + int(i)) for i in keep]
            d.keep(d.kept[cls], c.cls[keep], where, rows, keep, ref, got)

    def _phase(self, d: _Direction, phase: str, rows: NDArray[Any]) -> None:
        """One bulk phase, in chunks of about :data:`CHUNK_BLOCKS` blocks (one target call per chunk where it allows)."""
        t0 = time.perf_counter()
        width = d.width()
        step = max(1, CHUNK_BLOCKS // max(1, rows.shape[1] // width))
        counts = np.zeros(len(CLASSES), np.int64)
        for r0 in range(0, rows.shape[0], step):
            chunk = rows[r0 : r0 + step]
            c, ref, got = self._classify(d, chunk)
            self._record(d, phase, chunk, c, ref, got, offset=r0 * (rows.shape[1] // width))
            counts += np.bincount(c.cls, minlength=len(CLASSES))
        d.phases.append(PhaseResult.from_counts(d.name, phase, counts, time.perf_counter() - t0, _PHASE[phase].note))

    # -- fuzz -------------------------------------------------------------------------------
    def _strategy(self, d: _Direction) -> SearchStrategy[NDArray[Any]]:
        from hypothesis import strategies as st

        bs = self.fmt.block_size
        max_blocks = max(2, min(32, 128 // bs))
        lead = st.integers(1, FUZZ_ROWS).map(lambda r: (r,))
        return d.strategy(max_blocks, lead)

    def _fuzz(self, d: _Direction) -> None:
        import hypothesis
        from hypothesis.errors import HypothesisException, NoSuchExample

        t0 = time.perf_counter()
        strat = self._strategy(d)
        counts = np.zeros(len(CLASSES), np.int64)
        # found (bool), examples (int), first and best (the first and the smallest failing rows), found_at (seconds)
        state: dict[str, Any] = {"found": False, "examples": 0, "first": None, "best": None, "found_at": 0.0}

        def condition(example: NDArray[Any]) -> bool:
            rows = np.ascontiguousarray(example)
            if rows.ndim == 1:
                rows = rows[None, :]
            if state["found"] and time.perf_counter() - state["found_at"] > SHRINK_SECONDS:
                raise _ShrinkTimeout()  # the shrink's time is up: the smallest failing example seen is kept
            try:
                c, ref, got = self._classify(d, rows)
            except TargetError as exc:
                raise _Abort(exc) from None
            failing = bool(self._failing(c.cls).any())
            if not state["found"]:
                state["examples"] += 1
                counts[:] += np.bincount(c.cls, minlength=len(CLASSES))
                self._record(d, "fuzz", rows, c, ref, got)
                if failing:
                    state["found"], state["first"], state["found_at"] = True, rows.copy(), time.perf_counter()
            if failing and (state["best"] is None or rows.size < state["best"].size):
                state["best"] = rows.copy()
            return failing

        minimal, why = None, ""
        rounds = 0
        while True:
            n = self.settings.examples if not self.settings.seconds else ROUND_EXAMPLES
            try:
                minimal = hypothesis.find(
                    strat,
                    condition,
                    settings=find_settings(n),
                    random=random.Random(self.settings.seed * 7919 + rounds),
                )
                break
            except NoSuchExample:
                pass
            except _Abort as a:
                raise a.args[0] from None
            except _ShrinkTimeout:
                why = f"shrinking stopped after {SHRINK_SECONDS:g} s; the smallest failing example seen"
                break
            except HypothesisException as exc:  # e.g. Flaky: the target answered the same input differently
                why = f"hypothesis stopped ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
                self.notes.append(f"{d.name} fuzz: {why}")
                break
            rounds += 1
            if not self.settings.seconds or time.perf_counter() - t0 >= self.settings.seconds:
                break
        if minimal is not None:
            self._set_fuzz_first(d, np.ascontiguousarray(minimal), "shrunk by hypothesis")
        elif state["best"] is not None and why.startswith("shrinking stopped"):
            self._set_fuzz_first(d, state["best"], f"shrunk by hypothesis ({why})")
        elif state["first"] is not None:
            self._set_fuzz_first(d, state["first"], f"not shrunk: {why}" if why else "not shrunk")
        n = state["examples"]
        note = f"{n} hypothesis example{'s' if n != 1 else ''}" + (
            " (stopped at the first failure)" if state["found"] else ""
        )
        d.phases.append(PhaseResult.from_counts(d.name, "fuzz", counts, time.perf_counter() - t0, note))

    def _call_of(self, rows: NDArray[Any], b: int, per_row: int) -> tuple[NDArray[Any], int] | None:
        """The rows of the target call that got flat block ``b``, as one row (blocks are independent),
        and ``b``'s index in it: a kernel whose result depends on the call's length fails there, maybe not on one row."""
        if self.fmt.row_rule:
            return None
        r = b // per_row
        k = rows.shape[1] if rows.dtype == np.float32 else rows.shape[1] // self.fmt.type_size * self.fmt.block_size
        per_call = max(1, CALL_VALUES // max(1, k))  # the rows of one call (LibraryTarget's chunks)
        r0 = r // per_call * per_call
        return np.ascontiguousarray(rows[r0 : r0 + per_call]).reshape(-1).copy(), (r - r0) * per_row + b % per_row

    def _set_fuzz_first(self, d: _Direction, example: NDArray[Any], how: str) -> None:
        """The minimal fuzz example's first failing block replaces the golden one (it is shrunk)."""
        rows = example if example.ndim == 2 else example[None, :]
        c, _, _ = self._classify(d, rows)
        bad = np.flatnonzero(self._failing(c.cls))
        if not bad.size:  # pragma: no cover - hypothesis only returns failing examples
            return
        width = d.width()
        per_row = rows.shape[1] // width
        b = int(bad[0])
        row, blk = rows[b // per_row], b % per_row
        d.first[int(c.cls[b])] = (
            "fuzz",
            row.copy(),
            blk,
            how,
        )  # the reduction cuts it to the block where that still fails
        d.batch[int(c.cls[b])] = self._call_of(rows, b, per_row)

    # -- counterexamples ---------------------------------------------------------------------
    def _fails(self, d: _Direction, row: NDArray[Any]) -> tuple[bool, int, int, Signature | None]:
        """``(failing, first failing block, its class, its signature)`` of one input row."""
        c, ref, got = self._classify(d, row[None, :])
        bad = np.flatnonzero(self._failing(c.cls))
        if not bad.size:
            return False, -1, EXACT, None
        b = int(bad[0])
        return True, b, int(c.cls[b]), d.signature(ref, got, b)

    def _reduce(
        self, d: _Direction, row: NDArray[Any], blk: int, batch: tuple[NDArray[Any], int] | None = None
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

    def counterexample(self, d: _Direction) -> Counterexample | None:
        refused = [c for c in self.failing_classes if c in d.first]
        pick = refused[0] if refused else None
        if pick is None:
            return None
        phase, row, blk, how = d.first[pick]
        row, blk, reduced = self._reduce(d, row, blk, d.batch.get(pick))
        how = f"{how}; then {reduced}" if how else reduced
        c, ref, got = self._classify(d, row[None, :])
        bad = np.flatnonzero(self._failing(c.cls))
        if not bad.size:  # pragma: no cover - a target that does not answer the same input the same way
            return None
        if blk not in bad:
            blk = int(bad[0])
        trace = d.trace(row, blk)
        return make_counterexample(
            self.fmt, d.name, phase, row, ref, got, blk, int(c.cls[blk]), trace, self.settings.k, how
        )

    # -- diagnoses that need the target -----------------------------------------------------------
    def _unwritten(self, d: _Direction, ce: Counterexample | None) -> Diagnosis | None:
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

    def _direction_failed(self, d: _Direction) -> bool:
        w = sum(p.wrong for p in d.phases)
        f = sum(getattr(p, CLASSES[c]) for p in d.phases for c in self.failing_classes if c != WRONG)
        return bool(w or f or self.target.faults.get(d.name))

    def _accepted_diagnoses(self, d: _Direction) -> list[Diagnosis]:
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
        t0 = time.perf_counter()
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
                        self._fuzz(d)
                    bar.step(f"{d.name} fuzz")
                else:
                    d.phases.append(PhaseResult(d.name, "fuzz", 0, 0, 0, 0, 0.0, "skipped (examples 0)"))
            for d in bytes_dirs:
                self._phase(d, "bytes", random_blocks(self.fmt, self.settings.blocks, self.settings.seed))
                bar.step(f"{d.name} bytes")
        report = CheckReport(
            self.fmt.name, self.fmt.config(), self.target.description, self.settings.report_settings(self.codec.backend)
        )
        report.provenance = self.target.provenance()
        for key, pv in report.provenance.items():
            if pv.get("elsewhere"):
                self.notes.append(
                    f"{key}: {pv['symbol']} is not defined in {pv['library']} but in {pv['file']} (a dependency the "
                    "dynamic loader searched): that file's function was checked; --strict-lib refuses it"
                )
        for d in self.dirs.values():
            report.phases.extend(sorted(d.phases, key=lambda p: PHASES.index(_PHASE[p.phase])))
        for d in self.dirs.values():
            report.diagnoses.extend(diagnose_fragile(self.fmt, d.name, d.kept[FRAGILE].get("fragile")))
            report.diagnoses.extend(self._accepted_diagnoses(d))
            if not self._direction_failed(d):
                continue
            ce = self.counterexample(d)
            if ce is not None:
                report.counterexamples[d.name] = ce
            kept = d.kept[WRONG].get()
            report.differences[d.name] = describe_differences(self.fmt, d.name, kept)
            found = d.diagnose(kept)
            extra = self._unwritten(d, ce)
            report.diagnoses.extend(([extra] if extra else []) + found)
        rt = self._round_trip()
        if rt is not None:
            report.diagnoses.append(rt)
        for name, msgs in self.target.faults.items():
            report.faults[name] = list(msgs)
        report.notes = self.notes
        report.seconds = time.perf_counter() - t0
        return report

    def _smoke(self) -> None:
        """One call per direction on a row of zeros, so a target that cannot run fails before any work."""
        x = np.zeros((1, _row_len(self.fmt)), np.float32)
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
