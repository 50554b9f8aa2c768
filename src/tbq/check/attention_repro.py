"""The fused-attention check's counterexample: the smallest wrong case, written as ``.npz`` and a Python
reproducer (:class:`AttentionCounterexample`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..formats import Format
from .attention_cases import (
    Arithmetic,
    AttentionCase,
    AttentionSettings,
)
from .attention_reference import _classify_rows
from .classify import WRONG
from .counterexample import write_repro

# ---------------------------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class AttentionCounterexample:
    """The smallest failing case found, tbq's output and bound, the kernel's output."""

    case: AttentionCase
    expected: NDArray[np.float64]
    bound: NDArray[np.float64]
    got: NDArray[np.float32]
    settings: AttentionSettings
    arithmetic: Arithmetic
    how: str = ""
    c_source: str | None = None
    classification: str = "wrong"
    direction: str = "attention"

    def lines(self) -> list[str]:
        c = self.case
        n_q, H, G, T, D = c.shape
        rows = _classify_rows(self.got, self.expected, self.bound)
        bad = np.argwhere(rows == WRONG)
        i, h = (int(bad[0][0]), int(bad[0][1])) if len(bad) else (0, 0)
        with np.errstate(invalid="ignore"):
            e = np.abs(self.got[i, h].astype(np.float64) - self.expected[i, h])
        j = int(np.nanargmax(np.where(np.isfinite(e), e, np.inf)))
        out = [
            f"attention: smallest wrong case ({c.family}: {c.label}; {self.how})",
            f"  n_query {n_q}, n_head {H}, n_head_kv {G}, tokens {T}, head_dim {D}, scale {c.scale!r}"
            + (f", softcap {c.softcap:g}" if c.softcap else "")
            + ("" if c.sinks is None else ", sink logits")
            + f"; {int(np.sum(rows == WRONG))} of {rows.size} rows wrong",
            f"  row (query {i}, head {h}), value {j}: tbq {self.expected[i, h, j]:.9g}, kernel {float(self.got[i, h, j]):.9g}, "
            f"bound {float(self.bound[i, h]):.3g} (largest difference in the row {float(np.nanmax(e)):.3g})",
        ]
        return out

    def to_dict(self) -> dict[str, Any]:
        c = self.case
        return {
            "direction": "attention",
            "family": c.family,
            "label": c.label,
            "how": self.how,
            "shape": dict(zip(("n_query", "n_head", "n_head_kv", "n_tokens", "head_dim"), c.shape, strict=True)),
            "scale": c.scale,
            "softcap": c.softcap,
            "largest_difference": float(np.nanmax(np.abs(self.got - self.expected))),
            "bound": float(np.max(self.bound)),
        }

    def save(
        self, directory: str | os.PathLike[str], fmt: Format, symbol: str | None = None, link: list[str] | None = None
    ) -> list[Path]:
        s, c = self.settings, self.case
        name = f"attention-{s.k_type}-{s.v_type}-d{c.q.shape[2]}"
        arrays = {
            "q": c.q,
            "k": c.k,
            "v": c.v,
            "mask": c.mask,
            "sinks": np.zeros(0, np.float32) if c.sinks is None else c.sinks,
            "scale": np.float32(c.scale),
            "softcap": np.float32(c.softcap),
            "expected": self.expected,
            "bound": self.bound,
            "got": self.got,
            "k_type": s.k_type,
            "v_type": s.v_type,
            "k_options": json.dumps(s.k_options),
            "v_options": json.dumps(s.v_options),
            "arithmetic": json.dumps(self.arithmetic.__dict__),
        }
        sources = {".py": _PY_REPRO.format(npz=Path(name).with_suffix(".npz").name)}
        if self.c_source:
            sources[".c"] = self.c_source
        return write_repro(directory, name, arrays, sources)


_PY_REPRO = '''"""Counterexample from `tbq check --attention`: the smallest wrong case, tbq's output and its derived bound.

Run: python {{this file}} (exit status 1 while `kernel` below is outside the bound); put your kernel in `kernel`.
"""
import sys
from pathlib import Path

import numpy as np

case = np.load(Path(__file__).with_name("{npz}"))


def kernel(q, k, v, meta):  # your attention kernel: return float32 (n_query, n_head, head_dim)
    return case["got"]


n_q, H, D = case["q"].shape
T, G = case["k"].shape[:2]
meta = dict(k_type=str(case["k_type"]), v_type=str(case["v_type"]), head_dim=D, n_query=n_q, n_head=H,
            n_head_kv=G, n_tokens=T, scale=float(case["scale"]), softcap=float(case["softcap"]),
            mask=case["mask"], sinks=case["sinks"] if case["sinks"].size else None)
got = np.asarray(kernel(case["q"], case["k"], case["v"], meta), np.float32).reshape(n_q, H, D)
err = np.max(np.abs(got.astype(np.float64) - case["expected"]), axis=-1)
bad = ~(err <= case["bound"])
print(f"{{int(bad.sum())}} of {{bad.size}} rows outside the bound; largest difference {{float(np.nanmax(err)):.6g}}")
sys.exit(1 if bad.any() else 0)
'''

# Its public home stays tbq.check.attention (the name in pickles, reprs and the API's records).
AttentionCounterexample.__module__ = "tbq.check.attention"
