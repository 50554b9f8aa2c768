"""A conversion check's counterexample: the first minimal failing block of a direction, its text and its C
reproducer (:class:`Counterexample`, built by :func:`make_counterexample`)."""

from __future__ import annotations

import json
import math
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from ..formats import Format
from .classify import CLASSES, Trace, _neq, ordered_code
from .diagnose import describe_values
from .targets import default_symbol


def _num(v: Any) -> float | str:
    """A number for JSON: a finite float as it is, a non-finite one as its repr (``'nan'``, ``'inf'``)."""
    x = float(v)
    return x if math.isfinite(x) else repr(x)


def _f32_text(v: Any) -> str:
    f = np.float32(v)
    return f"{float(f)!r} (0x{int(np.array(f).view(np.uint32)):08X})"


def write_repro(
    directory: str | os.PathLike[str], name: str, arrays: dict[str, Any], sources: dict[str, str]
) -> list[Path]:
    """Write a counterexample's files into ``directory`` (made if needed): ``<name>.npz`` holding ``arrays``, then one
    ``<name><suffix>`` per entry of ``sources`` (suffix to text: the C or Python reproducer); return their paths,
    the ``.npz`` first. Every kind of counterexample (a block's, a dot product's, an attention case's) saves with it."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    stem = d / name
    paths = [stem.with_suffix(".npz")]
    np.savez(paths[0], **arrays)
    for suffix, text in sources.items():
        paths.append(stem.with_suffix(suffix))
        paths[-1].write_text(text)
    return paths


def link_args(link: list[str] | None) -> str:
    """The compile line's words for the shared libraries ``link`` (each with ``-Wl,-rpath`` to its folder, so the
    reproducer runs without ``LD_LIBRARY_PATH``), shell-quoted; empty without them."""
    return " ".join(f"{shlex.quote(str(p))} -Wl,-rpath,{shlex.quote(str(Path(p).parent))}" for p in (link or []))


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


@dataclass(kw_only=True)
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
        arrays = {
            "input": self.input,
            "expected": self.expected,
            "got": self.got,
            "block": np.int64(self.block),
            "format": np.array(fmt.name),
            "direction": np.array(self.direction),
            "phase": np.array(self.phase),
            "options": np.array(json.dumps(fmt.config())),
            "offsets": np.asarray(self.offsets, np.int64),
        }
        return write_repro(directory, f"{fmt.name}-{self.direction}", arrays, {".c": self.c_source(fmt, symbol, link)})

    def c_source(self, fmt: Format, symbol: str | None = None, link: list[str] | None = None) -> str:
        """A self-contained C program reproducing this counterexample with ggml's row signature.

        ``link``: shared libraries to name in its compile line (each with ``-Wl,-rpath`` to its folder, so the
        program runs without ``LD_LIBRARY_PATH``); without them the line names a placeholder library.
        """
        sym = symbol or default_symbol(self.direction, fmt.name)
        src = f"{fmt.name}-{self.direction}.c"
        libs = link_args(link)
        if libs:
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
            body = _c_main(
                f"void {sym}(const float *x, void *y, int64_t k);",
                k,
                nbytes,
                [
                    f"#define TYPE_SIZE {fmt.type_size}",
                    f"static const uint32_t input_bits[K] = {_c_bits(self.input)};",
                    f"static const uint8_t expected[NBYTES] = {_c_bytes(self.expected)};",
                    f"static const char *const field_of_byte[TYPE_SIZE] = {{{_c_list([json.dumps(n) for n in names])}}};",
                ],
                [
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
                ],
                "NBYTES",
                "bytes",
            )
        else:
            k, nbytes = self.expected.size, self.input.size
            body = _c_main(
                f"void {sym}(const void *x, float *y, int64_t k);",
                k,
                nbytes,
                [
                    f"static const uint8_t input[NBYTES] = {_c_bytes(self.input)};",
                    f"static const uint32_t expected_bits[K] = {_c_bits(self.expected)};",
                ],
                [
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
                ],
                "K",
                "values",
            )
        return "\n".join(head + body) + "\n"


def _c_list(items: list[str], per_line: int = 8) -> str:
    rows = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
    return "\n    " + ",\n    ".join(rows) + "\n"


def _c_bytes(a: NDArray[Any]) -> str:
    """The initializer of a C ``uint8_t`` array holding bytes ``a``."""
    return "{" + _c_list([f"0x{int(v):02X}" for v in a]) + "}"


def _c_bits(a: NDArray[Any]) -> str:
    """The initializer of a C ``uint32_t`` array holding the bit patterns of float32 values ``a``."""
    return "{" + _c_list([f"0x{int(v):08X}u" for v in a.view(np.uint32)]) + "}"


def _c_main(decl: str, k: int, nbytes: int, data: list[str], compare: list[str], count: str, unit: str) -> list[str]:
    """A repro's lines after the includes: the row function's declaration ``decl``, the sizes ``K`` (values) and
    ``NBYTES``, the ``data`` definitions, then ``main``: the call and the comparison that counts ``bad`` (``compare``)
    and the verdict over ``count`` ``unit``; the exit status is 1 while anything differs."""
    return [
        decl,
        "",
        f"#define K {k}",
        f"#define NBYTES {nbytes}",
        *data,
        "",
        "int main(void) {",
        *compare,
        f'    if (bad) printf("%d of %d {unit} differ from tbq\\n", bad, {count});',
        f'    else printf("identical to tbq (%d {unit})\\n", {count});',
        "    return bad != 0;",
        "}",
    ]


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
    *,
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
            neq = _neq(a, b)
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
        direction=direction,
        phase=phase,
        classification=CLASSES[cls],
        input=np.asarray(inp).reshape(-1),
        expected=np.asarray(expected).reshape(-1),
        got=np.asarray(got).reshape(-1),
        block=int(block),
        offsets=offsets,
        fields=fields,
        trace=tr,
        how=how,
    )


def _fmt_val(value: Any) -> str:
    v = np.asarray(value)
    if v.dtype.kind == "f":
        return repr(float(v))
    return str(int(v))


# Their public home stays tbq.check.report (the name in pickles, reprs and the API's records).
Counterexample.__module__ = "tbq.check.report"
make_counterexample.__module__ = "tbq.check.report"
