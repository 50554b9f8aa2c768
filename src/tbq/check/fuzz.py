"""The fuzz phase of a row-function check: a hypothesis search for a failing batch of rows, shrunk on failure.

Every example is a batch of rows (one target call) from :mod:`tbq.testing.strategies` (``float_blocks`` for
encoders; ``encoded_blocks``, valid and arbitrary, for decoders); ``examples`` examples, or rounds of
:data:`ROUND_EXAMPLES` until ``seconds`` have passed. Hypothesis shrinks a failure for at most
:data:`SHRINK_SECONDS`; its minimal example's first failing block becomes the direction's first failure.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ..errors import TbqValueError
from .classify import CLASSES
from .directions import CheckRun, Direction
from .report import PhaseResult
from .targets import TargetError

if TYPE_CHECKING:  # hypothesis is optional: imported where the fuzz phase runs
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "FuzzPhase",
    "FuzzUnavailable",
    "require_hypothesis",
    "hypothesis_scratch",
    "find_settings",
    "FUZZ_ROWS",
    "SHRINK_SECONDS",
    "ROUND_EXAMPLES",
]

#: Rows per fuzz example (each example is one target call).
FUZZ_ROWS = 4
#: Seconds hypothesis may spend shrinking a failure (its own limit is 5 minutes; a failure that depends on the
#: length of the call, such as a SIMD body's, makes it try tens of thousands of candidates). The check's own
#: reduction then cuts the example further.
SHRINK_SECONDS = 10.0
#: Examples per hypothesis run when the fuzz phase has a time budget (``seconds``).
ROUND_EXAMPLES = 25


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


class FuzzPhase:
    """The fuzz phase of a check (:meth:`run` once per direction)."""

    def __init__(self, check: CheckRun) -> None:
        self.check = check

    def strategy(self, d: Direction) -> SearchStrategy[NDArray[Any]]:
        from hypothesis import strategies as st

        bs = self.check.fmt.block_size
        max_blocks = max(2, min(32, 128 // bs))
        lead = st.integers(1, FUZZ_ROWS).map(lambda r: (r,))
        return d.strategy(max_blocks, lead)

    def run(self, d: Direction) -> None:
        import hypothesis
        from hypothesis.errors import HypothesisException, NoSuchExample

        t0 = time.perf_counter()
        strat = self.strategy(d)
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
                batch = self.check.classify(d, rows)
            except TargetError as exc:
                raise _Abort(exc) from None
            cls = batch[0].cls
            failing = bool(self.check.failing(cls).any())
            if not state["found"]:
                state["examples"] += 1
                counts[:] += np.bincount(cls, minlength=len(CLASSES))
                self.check.record(d, "fuzz", rows, batch)
                if failing:
                    state["found"], state["first"], state["found_at"] = True, rows.copy(), time.perf_counter()
            if failing and (state["best"] is None or rows.size < state["best"].size):
                state["best"] = rows.copy()
            return failing

        minimal, why = None, ""
        rounds = 0
        while True:
            n = self.check.settings.examples if not self.check.settings.seconds else ROUND_EXAMPLES
            try:
                minimal = hypothesis.find(
                    strat,
                    condition,
                    settings=find_settings(n),
                    random=random.Random(self.check.settings.seed * 7919 + rounds),
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
                self.check.notes.append(f"{d.name} fuzz: {why}")
                break
            rounds += 1
            if not self.check.settings.seconds or time.perf_counter() - t0 >= self.check.settings.seconds:
                break
        if minimal is not None:
            self._set_first(d, np.ascontiguousarray(minimal), "shrunk by hypothesis")
        elif state["best"] is not None and why.startswith("shrinking stopped"):
            self._set_first(d, state["best"], f"shrunk by hypothesis ({why})")
        elif state["first"] is not None:
            self._set_first(d, state["first"], f"not shrunk: {why}" if why else "not shrunk")
        n = state["examples"]
        note = f"{n} hypothesis example{'s' if n != 1 else ''}" + (
            " (stopped at the first failure)" if state["found"] else ""
        )
        d.phases.append(PhaseResult.from_counts(d.name, "fuzz", counts, time.perf_counter() - t0, note))

    def _set_first(self, d: Direction, example: NDArray[Any], how: str) -> None:
        """The minimal fuzz example's first failing block replaces the golden one (it is shrunk)."""
        rows = example if example.ndim == 2 else example[None, :]
        c, _, _ = self.check.classify(d, rows)
        bad = np.flatnonzero(self.check.failing(c.cls))
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
        d.batch[int(c.cls[b])] = self.check.call_of(rows, b, per_row)
