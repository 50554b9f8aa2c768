"""The two directions of a row-function check, the target's encoder and decoder: what differs between them.

The check (:mod:`tbq.check.runner`) runs the same phases, records, reductions and counterexamples for both and
asks a :class:`Direction` for the unit of an input row, the reference and target calls, what to keep of a
non-exact block, the fuzz strategy, the signature of a difference and the diagnoses. A direction reads the
check through :class:`CheckRun`, the part of it that the directions and the fuzz phase use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from numpy.typing import NDArray

from ..codecs import Codec
from ..formats import Format
from .classify import CLASSES, Classified, Trace, classify_decoded, classify_encoded, encoder_trace
from .diagnose import Diagnosis, Kept, KeptBlocks, diagnose_decoder, diagnose_encoder
from .report import PhaseResult
from .settings import CheckSettings
from .targets import Target

if TYPE_CHECKING:  # hypothesis is optional: imported where the fuzz phase runs
    from hypothesis.strategies import SearchStrategy

__all__ = ["Batch", "Signature", "CheckRun", "Direction", "Encoder", "Decoder", "DIRECTIONS"]

#: A batch's classes with tbq's and the target's outputs: ``(Classified, ref, got)``.
Batch = tuple[Classified, NDArray[Any], NDArray[Any]]
#: What tells two failures of one block apart while reducing: the differing fields (encoders) or whether
#: values differ beyond signed zeros and NaN payloads (decoders).
Signature = tuple[str, ...] | bool


class CheckRun(Protocol):
    """What the directions and the fuzz phase read of a check under way."""

    fmt: Format
    codec: Codec
    target: Target
    settings: CheckSettings
    notes: list[str]

    def classify(self, d: Direction, rows: NDArray[Any]) -> Batch: ...

    def failing(self, cls: NDArray[np.uint8]) -> NDArray[np.bool_]: ...

    def record(self, d: Direction, phase: str, rows: NDArray[Any], batch: Batch, offset: int = 0) -> None: ...

    def call_of(self, rows: NDArray[Any], b: int, per_row: int) -> tuple[NDArray[Any], int] | None: ...


class Direction:
    """One direction of the check (the target's encoder or decoder): everything that differs between them.

    The check itself (:class:`tbq.check.runner._Check`, a :class:`CheckRun`) runs the same phases, records, reductions and counterexamples for
    both, asking its direction objects for the unit of an input row (``width``), the reference and
    target calls (``run``), what to keep of a non-exact block, the fuzz strategy, the signature of a
    difference and the diagnoses.
    """

    name = ""
    unit = ""  #: what an input row holds ("values" / "bytes")
    phase_names: tuple[str, ...] = ("golden", "fuzz")  #: the phases of :data:`PHASES` this direction runs

    def __init__(self, check: CheckRun) -> None:
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
        """Add blocks ``keep`` of a batch (input ``rows``, outputs ``ref``/``got``) to ``kept``, with their classes and places."""
        kept.add(cls, where, **self.kept_arrays(rows, keep, ref, got))

    def kept_arrays(
        self, rows: NDArray[Any], keep: NDArray[np.intp], ref: NDArray[Any], got: NDArray[Any]
    ) -> dict[str, Any]:
        """What :class:`Kept` stores of flat blocks ``keep``: the inputs, both outputs (and an encoder's trace)."""
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


class Encoder(Direction):
    name, unit = "quantize", "values"

    def width(self) -> int:
        return self.fmt.block_size

    def run(self, x: NDArray[np.float32]) -> Batch:
        """Classify the target's bytes of rows ``x``."""
        ref = self.check.codec.encode(x)
        got = self.check.target.quantize(x)
        return classify_encoded(self.fmt, x, ref, got, self.check.settings.k), ref, got

    def kept_arrays(
        self, rows: NDArray[Any], keep: NDArray[np.intp], ref: NDArray[Any], got: NDArray[Any]
    ) -> dict[str, Any]:
        ts = self.fmt.type_size
        trace, xb = encoder_trace(self.fmt, rows, keep)
        return {"x": xb, "ref": ref.reshape(-1, ts)[keep], "got": got.reshape(-1, ts)[keep], "trace": trace}

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


class Decoder(Direction):
    name, unit = "dequantize", "bytes"
    phase_names = ("golden", "fuzz", "bytes")  # decoders also meet arbitrary bytes

    def width(self) -> int:
        return self.fmt.type_size

    def run(self, data: NDArray[np.uint8]) -> Batch:
        ref = self.check.codec.decode(data)
        got = self.check.target.dequantize(data)
        return classify_decoded(self.fmt, data, ref, got), ref, got

    def kept_arrays(
        self, rows: NDArray[Any], keep: NDArray[np.intp], ref: NDArray[Any], got: NDArray[Any]
    ) -> dict[str, Any]:
        ts, bs = self.fmt.type_size, self.fmt.block_size
        return {"data": rows.reshape(-1, ts)[keep], "ref": ref.reshape(-1, bs)[keep], "got": got.reshape(-1, bs)[keep]}

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


#: The direction class of each direction name a target implements.
DIRECTIONS: dict[str, type[Direction]] = {d.name: d for d in (Encoder, Decoder)}
