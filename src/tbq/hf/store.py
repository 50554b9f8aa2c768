"""The bytes of one role (K or V) of one cache layer: sink rows, main rows and the float32 residual window.

:class:`Store` is what a :class:`~tbq.hf.cache.TbqLayer` holds per role: rows
encoded by the engine's :class:`~tbq.hf.engine.Side` (one codec call over all
new rows of a write, one decode over all stored rows of a read), in token
order, with the sink tokens in their own type. Split from :mod:`tbq.hf.cache`,
which speaks transformers' cache protocol.
"""

from __future__ import annotations

import numpy as np
import torch

from .engine import Side

__all__ = ["Store"]


class Store:
    """The bytes of one role of one layer: sink rows, main rows, and the float32 residual window, in token order."""

    def __init__(self, side: Side, sink_side: Side | None, row: int) -> None:
        self.side, self.sink_side, self.row = side, sink_side, row
        self.sink: np.ndarray | None = None  # (B, s, sink row bytes)
        self.main: np.ndarray | None = None  # (B, n, row bytes)
        self.resid: torch.Tensor | None = None  # (B, r, row) float32, stored domain

    @staticmethod
    def _cat(a: np.ndarray | None, b: np.ndarray) -> np.ndarray:
        return b if a is None else np.concatenate([a, b], axis=1)

    def write(self, rows: torch.Tensor, first: int, sinks: int, residual: int) -> None:
        """Store ``rows`` (B, T, row) float32, the tokens at positions ``first, first + 1, ...``."""
        n_sink = min(max(sinks - first, 0), rows.shape[1])
        if n_sink:
            assert self.sink_side is not None  # sinks > 0: the store was built with a sink side
            self.sink = self._cat(self.sink, self.sink_side.encode(rows[:, :n_sink].numpy()))
            rows = rows[:, n_sink:]
        if rows.shape[1] == 0:
            return
        if residual:
            self.resid = rows.clone() if self.resid is None else torch.cat([self.resid, rows], 1)
        else:
            self.main = self._cat(self.main, self.side.encode(rows.numpy()))

    def flush(self, residual: int) -> None:
        """Encode the residual window's oldest tokens until at most ``residual`` are left."""
        if self.resid is None or self.resid.shape[1] <= residual:
            return
        cut = self.resid.shape[1] - residual
        self.main = self._cat(self.main, self.side.encode(self.resid[:, :cut].numpy()))
        self.resid = self.resid[:, cut:].clone()

    def read(self) -> torch.Tensor | None:
        """Every stored token's row, decoded: (B, T, row) float32 in the stored domain (None: no token)."""
        parts = []
        if self.sink is not None:
            assert self.sink_side is not None  # sink bytes exist only with a sink side
            parts.append(torch.from_numpy(self.sink_side.decode(self.sink, self.row)))
        if self.main is not None:
            parts.append(torch.from_numpy(self.side.decode(self.main, self.row)))
        if self.resid is not None:
            parts.append(self.resid)
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    @property
    def length(self) -> int:
        return sum(0 if a is None else int(a.shape[1]) for a in (self.sink, self.main, self.resid))

    def keep(self, lo: int, hi: int) -> None:
        """Keep only the tokens ``lo .. hi - 1`` (indices into the stored tokens, in order)."""
        pos = 0
        for name in ("sink", "main", "resid"):
            a = getattr(self, name)
            if a is None:
                continue
            n = int(a.shape[1])
            s, e = max(lo - pos, 0), min(hi - pos, n)
            if e <= s:
                setattr(self, name, None)
            elif (s, e) != (0, n):
                part = a[:, s:e]
                setattr(self, name, part.clone() if isinstance(part, torch.Tensor) else part.copy())
            pos += n

    def batch(self, index: np.ndarray) -> None:
        """Rows of the batch in the order ``index`` (beam reordering, selection, repetition)."""
        for name in ("sink", "main", "resid"):
            a = getattr(self, name)
            if a is not None:
                setattr(self, name, a[torch.from_numpy(index)] if isinstance(a, torch.Tensor) else a[index])

    @property
    def nbytes(self) -> int:
        n = sum(a.nbytes for a in (self.sink, self.main) if a is not None)
        return n + (0 if self.resid is None else self.resid.numel() * 4)
