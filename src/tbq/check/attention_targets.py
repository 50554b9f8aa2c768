"""The attention kernels a check runs: a Python function (:class:`CallableAttention`) or a program
(:class:`ProgramAttention`), behind :class:`AttentionTarget`."""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .attention_cases import (
    Arithmetic,
    AttentionCase,
    AttentionSettings,
)
from .attention_repro import AttentionCounterexample
from .targets import TargetError, _to_numpy

# ---------------------------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------------------------


class AttentionTarget:
    """An attention kernel: ``run(case, settings) -> float32 (n_q, n_head, D)``; ``run_many`` may batch.

    ``defaults``: the arithmetic the target declares where the settings leave it open (``q``, ``v``)."""

    description = "attention kernel"
    symbol = "attention"

    def defaults(self, s: AttentionSettings) -> Arithmetic:
        return Arithmetic("float32", "float32", "float32")

    def check_settings(self, s: AttentionSettings) -> tuple[AttentionSettings, list[str]]:
        """Refuse settings the target cannot run (a format it lacks), before any case; returns the settings to
        run (a target may fill in what the settings leave open) and notes saying what it filled in."""
        return s, []

    def run(self, case: AttentionCase, s: AttentionSettings) -> NDArray[np.float32]:  # pragma: no cover - abstract
        raise NotImplementedError

    def run_many(self, cases: Sequence[AttentionCase], s: AttentionSettings) -> list[NDArray[np.float32]]:
        return [self.run(c, s) for c in cases]

    def provenance(self) -> dict[str, dict[str, Any]]:
        return {}

    def link_libraries(self) -> list[str]:
        return []

    def repro_c(self, ce: AttentionCounterexample, s: AttentionSettings) -> str | None:
        """A C program reproducing ``ce`` (ggml builds), or None."""
        return None

    def close(self) -> None:
        """Nothing to release by default."""


def _shaped_out(out: Any, shape: tuple[int, ...], what: str) -> NDArray[np.float32]:
    a = _to_numpy(out)
    if a.dtype.kind not in "fiu":
        raise TargetError(f"{what} returned {a.dtype} values; return float32 (n_query, n_head, head_dim)")
    if a.size != math.prod(shape):
        raise TargetError(f"{what} returned shape {a.shape}; expected {shape} (n_query, n_head, head_dim)")
    return np.ascontiguousarray(a.reshape(shape).astype(np.float32))


class CallableAttention(AttentionTarget):
    """A Python kernel ``fn(q, k_bytes, v_bytes, meta) -> out``: ``q`` float32 ``(n_q, n_head, D)``, the caches
    uint8 ``(T, n_head_kv, row bytes)``, ``meta`` (:meth:`AttentionCase.meta`); ``out`` ``(n_q, n_head, D)``,
    anything array-like (NumPy, a PyTorch tensor on any device)."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None, arithmetic: Arithmetic | None = None) -> None:
        if not callable(fn):
            raise TargetError(f"the kernel must be a function (q, k, v, meta) -> out, got {type(fn).__name__}")
        self.fn = fn
        self.description = name or f"python {getattr(fn, '__qualname__', type(fn).__name__)}"
        self._declared = arithmetic or Arithmetic("float32", "float32", "float32")

    def defaults(self, s: AttentionSettings) -> Arithmetic:
        return self._declared

    def run(self, case: AttentionCase, s: AttentionSettings) -> NDArray[np.float32]:
        out = self.fn(case.q.copy(), case.k.copy(), case.v.copy(), case.meta(s))
        return _shaped_out(out, case.q.shape, self.description)


#: The placeholders of :class:`ProgramAttention`'s command: files, then numbers and names.
PROGRAM_PLACEHOLDERS = (
    "q",
    "k",
    "v",
    "mask",
    "sinks",
    "meta",
    "out",
    "n_query",
    "n_head",
    "n_head_kv",
    "n_tokens",
    "head_dim",
    "scale",
    "softcap",
    "k_type",
    "v_type",
)


class ProgramAttention(AttentionTarget):
    """An external program run once per case: ``command`` with placeholders (:data:`PROGRAM_PLACEHOLDERS`).

    Files: ``{q}`` raw float32 ``(n_query, n_head, D)``; ``{k}``/``{v}`` the cache bytes ``(T, n_head_kv, row
    bytes)``; ``{mask}`` raw float32 ``(n_query, T)`` (0 and -inf); ``{sinks}`` raw float32 ``(n_head,)`` (empty
    without sink logits); ``{meta}`` JSON (:meth:`AttentionCase.meta`, the mask as lists with ``"-inf"``); the
    program writes raw float32 ``(n_query, n_head, D)`` to ``{out}`` and exits 0. Numbers: ``{n_query}``,
    ``{n_head}``, ``{n_head_kv}``, ``{n_tokens}``, ``{head_dim}``, ``{scale}`` and ``{softcap}`` (float32 values
    printed exactly), ``{k_type}``, ``{v_type}``. ``{q}``, ``{k}``, ``{v}`` and ``{out}`` are required."""

    def __init__(self, command: str, timeout: float = 600.0) -> None:
        if not isinstance(command, str):
            raise TargetError(f"the command must be a string, got {type(command).__name__}")
        missing = [p for p in ("q", "k", "v", "out") if "{" + p + "}" not in command]
        if missing:
            raise TargetError(
                f"the command lacks the placeholder{'s' * (len(missing) > 1)} {', '.join('{' + p + '}' for p in missing)}"
                f"; it may use {', '.join('{' + p + '}' for p in PROGRAM_PLACEHOLDERS)}"
            )
        unknown = sorted(set(re.findall(r"\{(\w+)\}", command)) - set(PROGRAM_PLACEHOLDERS))
        if unknown:
            raise TargetError(
                f"unknown placeholder {{{unknown[0]}}}; the placeholders: {', '.join(PROGRAM_PLACEHOLDERS)}"
            )
        self.command, self.timeout = command, float(timeout)
        self.description = f"program {command.split()[0]}"
        self._dir = tempfile.TemporaryDirectory(prefix="tbq-check-attention-")

    def run(self, case: AttentionCase, s: AttentionSettings) -> NDArray[np.float32]:
        d = Path(self._dir.name)
        files = {n: d / f"{n}.bin" for n in ("q", "k", "v", "mask", "sinks", "out")}
        files["meta"] = d / "meta.json"
        case.q.astype("<f4").tofile(files["q"])
        case.k.tofile(files["k"])
        case.v.tofile(files["v"])
        case.mask.astype("<f4").tofile(files["mask"])
        (np.zeros(0, "<f4") if case.sinks is None else case.sinks.astype("<f4")).tofile(files["sinks"])
        meta = case.meta(s)
        meta["mask"] = [[("-inf" if not np.isfinite(x) else float(x)) for x in row] for row in case.mask]
        meta["sinks"] = None if case.sinks is None else [float(x) for x in case.sinks]
        files["meta"].write_text(json.dumps(meta))
        files["out"].unlink(missing_ok=True)
        n_q, H, G, T, D = case.shape
        values: dict[str, object] = {k: shlex.quote(str(v)) for k, v in files.items()}
        values.update(n_query=n_q, n_head=H, n_head_kv=G, n_tokens=T, head_dim=D, k_type=s.k_type, v_type=s.v_type)
        values.update(scale=repr(float(np.float32(case.scale))), softcap=repr(float(np.float32(case.softcap))))
        cmd = self.command.format(**values)
        try:
            r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise TargetError(f"{cmd} did not finish within {self.timeout:g} s") from None
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            raise TargetError(f"{cmd} exited with status {r.returncode}: {last}")
        want = case.q.size * 4
        got = files["out"].stat().st_size if files["out"].exists() else -1
        if got != want:
            raise TargetError(f"{cmd} wrote {max(got, 0)} bytes to {{out}}; expected {want} (float32 n_q x n_head x D)")
        return np.fromfile(files["out"], "<f4").reshape(case.q.shape)

    def close(self) -> None:
        self._dir.cleanup()


# Their public home stays tbq.check.attention (the name in pickles, reprs and the API's records).
for _cls in (AttentionTarget, CallableAttention, ProgramAttention):
    _cls.__module__ = "tbq.check.attention"
