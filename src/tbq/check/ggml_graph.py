"""A ggml build's CPU flash attention as an attention target: ``ggml_flash_attn_ext`` through ctypes.

:class:`GgmlAttention` loads ``libggml-cpu.so`` (which finds ``libggml-base.so`` beside it), calls
``ggml_cpu_init`` once, and for each batch of cases builds a graph as ``../shared/ggml/fa_bench.c`` does:
``q`` float32 ``[D, n_q, n_head]``, ``k`` and ``v`` tensors of the cache types ``[D, T, n_head_kv]`` filled with
tbq's bytes, an f16 mask ``[T, n_q]`` (absent when nothing is masked), ``ggml_flash_attn_ext(q, k, v, mask,
scale, 0, softcap)``, sink logits through ``ggml_flash_attn_ext_add_sinks``, computed with
``ggml_graph_compute_with_ctx`` on ``threads`` threads; the output ``[D, n_head, n_q]`` is read back through
``ggml_get_data``. Decode cases over one cache run in one graph call: their query heads stacked (ggml computes
every query row on its own, so the rows are what separate calls give).

Before anything runs in this process, a child process loads the build, calls ``ggml_cpu_init``, lists the
build's type names (from ``ggml.h`` beside the library when it is there, else up to the first entry that is not
a type name) and computes one small flash attention over the checked types: a build for another CPU, or a type
the build's CPU backend cannot attend over, ends that child, not the check (:class:`~tbq.check.targets.TargetError`).

Formats decoded in a rotated domain (the community fork's turbo types: ``decode(encode(x))`` is ``R(x)``) need
the graph's rotations: the fork's llama.cpp graph rotates the query and rotates the output back. With
``rotate=True`` (the default) this target does the same with tbq's rotation of the format
(:meth:`~tbq.formats.capabilities.DomainTraits.to_decode_domain` on the query, :meth:`~tbq.formats.capabilities.DomainTraits.from_decode_domain` on
the output); ``rotate=False`` checks the bare kernel.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..codecs import codec_from
from ..formats import Format, get_format
from .attention import (
    Arithmetic,
    AttentionCase,
    AttentionCounterexample,
    AttentionSettings,
    AttentionTarget,
    same_cache_groups,
)
from .sharedlib import load_library, resolve_library, signal_words
from .targets import TargetError, defining_file

__all__ = ["GgmlAttention", "ggml_type_name"]

P = ctypes.c_void_p


class _InitParams(ctypes.Structure):
    """``struct ggml_init_params`` of ggml.h: ``size_t mem_size; void *mem_buffer; bool no_alloc``."""

    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", P), ("no_alloc", ctypes.c_bool)]


def _declare(lib: Any) -> None:
    """The argument and result types of the ggml functions the target calls (ggml.h's signatures)."""
    lib.ggml_cpu_init.argtypes, lib.ggml_cpu_init.restype = (), None
    lib.ggml_type_name.argtypes, lib.ggml_type_name.restype = (ctypes.c_int,), ctypes.c_char_p
    lib.ggml_init.argtypes, lib.ggml_init.restype = (_InitParams,), P
    lib.ggml_free.argtypes, lib.ggml_free.restype = (P,), None
    lib.ggml_new_tensor_1d.argtypes, lib.ggml_new_tensor_1d.restype = (P, ctypes.c_int, ctypes.c_int64), P
    lib.ggml_new_tensor_4d.argtypes = (P, ctypes.c_int) + (ctypes.c_int64,) * 4
    lib.ggml_new_tensor_4d.restype = P
    lib.ggml_get_data.argtypes, lib.ggml_get_data.restype = (P,), P
    lib.ggml_nbytes.argtypes, lib.ggml_nbytes.restype = (P,), ctypes.c_size_t
    lib.ggml_flash_attn_ext.argtypes = (P, P, P, P, P, ctypes.c_float, ctypes.c_float, ctypes.c_float)
    lib.ggml_flash_attn_ext.restype = P
    lib.ggml_new_graph.argtypes, lib.ggml_new_graph.restype = (P,), P
    lib.ggml_build_forward_expand.argtypes, lib.ggml_build_forward_expand.restype = (P, P), None
    lib.ggml_graph_compute_with_ctx.argtypes = (P, P, ctypes.c_int)
    lib.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    if hasattr(lib, "ggml_flash_attn_ext_add_sinks"):
        lib.ggml_flash_attn_ext_add_sinks.argtypes, lib.ggml_flash_attn_ext_add_sinks.restype = (P, P), None


def _type_names(lib: Any, header: str) -> dict[str, int]:
    """``{name: type id}`` of the build: ids below ``GGML_TYPE_COUNT`` of ``header`` (ggml.h beside the library),
    or without a header up to the first entry that is not a type name (reading past the table is undefined:
    only the probe child does it)."""
    count = None
    if header:
        m = re.search(r"GGML_TYPE_COUNT\s*=\s*(\d+)", Path(header).read_text(errors="replace"))
        count = int(m.group(1)) if m else None
    names: dict[str, int] = {}
    for i in range(count or 128):
        raw = lib.ggml_type_name(i)
        if raw is None:
            continue
        n = raw.decode("ascii", errors="replace")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,15}", n):
            if count is None:
                break
            continue
        names.setdefault(n, i)
    return names


def _probe_main(argv: Sequence[str]) -> None:
    """The probe child: load the build, init, print its type names (JSON), compute one small flash attention over
    the types of tbq's formats ``argv[2:4]`` (head_dim ``argv[4]``) and print ``status <ggml status>``."""
    path, header, k_fmt, v_fmt, D = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    lib = ctypes.CDLL(path)
    _declare(lib)
    lib.ggml_cpu_init()
    names = _type_names(lib, header)
    print(json.dumps(names), flush=True)
    kt, vt = ggml_type_name(k_fmt, names), ggml_type_name(v_fmt, names)
    if kt is None or vt is None:
        return
    ctx = lib.ggml_init(_InitParams(64 << 20, None, False))
    q = lib.ggml_new_tensor_4d(ctx, names["f32"], D, 1, 2, 1)
    k = lib.ggml_new_tensor_4d(ctx, names[kt], D, 4, 1, 1)
    v = lib.ggml_new_tensor_4d(ctx, names[vt], D, 4, 1, 1)
    for t in (q, k, v):
        ctypes.memset(lib.ggml_get_data(t), 0, lib.ggml_nbytes(t))
    o = lib.ggml_flash_attn_ext(ctx, q, k, v, None, 0.125, 0.0, 0.0)
    g = lib.ggml_new_graph(ctx)
    lib.ggml_build_forward_expand(g, o)
    print("status", lib.ggml_graph_compute_with_ctx(ctx, g, 1), flush=True)


#: The probe child's command (``python -c``): it imports this module and runs :func:`_probe_main`.
_PROBE = "import sys; from tbq.check.ggml_graph import _probe_main; _probe_main(sys.argv[1:])"


def _float_kind(fmt: Format) -> str | None:
    """``"float16"``/``"bfloat16"`` for a format whose values are stored as plain f16/bf16 numbers (ggml pairs
    such a K with a query converted to the same type, and accumulates an f16 V in f16), else None."""
    layout = fmt.info.layout
    if len(layout) == 1 and layout[0].kind in ("f16", "bf16"):
        return "float16" if layout[0].kind == "f16" else "bfloat16"
    return None


def ggml_type_name(fmt: str, names: dict[str, int]) -> str | None:
    """The build's name of tbq's format ``fmt`` (``turbo3`` is ``turbo3_0`` in the community fork), or None."""
    for n in (fmt, f"{fmt}_0", fmt.replace("_", "")):
        if n in names:
            return n
    return None


def _resolve(path: str) -> str:
    """The file to load: ``path``, or the file a flattened symbolic link names (``libggml-cpu.so`` holding the
    text ``libggml-cpu.so.0``, as an archive or a copy leaves links)."""
    if "/" in path and not Path(path).is_file():
        raise TargetError(f"cannot load {path}: no such file")
    return os.path.realpath(resolve_library(path))


class GgmlAttention(AttentionTarget):
    """``ggml_flash_attn_ext`` of the ggml build at ``path`` (its ``libggml-cpu.so``), on ``threads`` threads."""

    symbol = "ggml_flash_attn_ext"

    def __init__(self, path: str | os.PathLike[str], *, threads: int = 2, rotate: bool = True) -> None:
        given = os.fspath(path)
        self.path = _resolve(given)
        if not isinstance(threads, int) or threads < 1:
            raise TargetError(f"threads must be a positive integer, got {threads!r}")
        self.threads, self.rotate = threads, bool(rotate)
        self.description = f"ggml build {Path(given).name} ({Path(self.path).parent})"
        self.names: dict[str, int] | None = None
        self.lib: Any = None
        hdr = Path(self.path).parent.parent / "include" / "ggml.h"
        self.header = str(hdr) if hdr.is_file() else ""

    # -- before any case --------------------------------------------------------------------------------------
    def check_settings(self, s: AttentionSettings) -> tuple[AttentionSettings, list[str]]:
        try:  # everything once in a child first: a build for another CPU dies there, not here
            r = subprocess.run(
                [sys.executable, "-c", _PROBE, self.path, self.header, s.k_type, s.v_type, str(s.head_dim)],
                capture_output=True,
                text=True,
                timeout=300,
                env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
            )
        except subprocess.TimeoutExpired:
            raise TargetError(f"a probe process computing one flash attention of {self.path} did not return") from None
        first = r.stdout.splitlines()[0] if r.stdout.strip() else ""
        names = json.loads(first) if first.startswith("{") else {}
        if names.get("f32") is None:  # ggml's type table (a dict of type names), not a format test
            raise TargetError(f"cannot use {self.path} as a ggml build: {self._died(r, 'ggml_cpu_init')}")
        kt, vt = ggml_type_name(s.k_type, names), ggml_type_name(s.v_type, names)
        for fmt, t in ((s.k_type, kt), (s.v_type, vt)):
            if t is None:
                raise TargetError(
                    f"the ggml build {self.path} has no type {fmt}; its types: {', '.join(sorted(names))}"
                )
        assert kt is not None and vt is not None
        if r.returncode != 0 or "status 0" not in r.stdout:
            raise TargetError(
                f"ggml_flash_attn_ext over a {kt} K cache and a {vt} V cache with head_dim {s.head_dim} "
                f"({Path(self.path).name}): {self._died(r, 'ggml_flash_attn_ext')}"
            )
        self.names, self.k_name, self.v_name = names, kt, vt
        self._load()
        s, notes = self._match_tables(s)
        rotated = [f.name for f in (s.k_format, s.v_format) if f.domain.decode_domain == "rotated"]
        if rotated and self.rotate:
            notes.append(
                f"{' and '.join(dict.fromkeys(rotated))} decode{'s' * (len(set(rotated)) == 1)} to the rotated domain: "
                "the query is rotated before ggml_flash_attn_ext (K) and the output rotated back after it (V) with "
                "tbq's rotation, as the fork's llama.cpp graph does (--bare: the kernel alone)"
            )
        return s, notes

    def _died(self, r: subprocess.CompletedProcess[str], what: str) -> str:
        if r.returncode < 0:
            hint = " (a build for instructions this CPU lacks?)" if r.returncode == -4 else ""
            return f"a probe process died of {signal_words(-r.returncode)} in {what}{hint}"
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        return f"a probe process failed in {what} (exit {r.returncode}: {' '.join(last.split())[:300]})"

    def _load(self) -> None:
        if self.lib is not None:
            return
        lib = load_library(self.path, TargetError)
        for name in ("ggml_cpu_init", "ggml_init", "ggml_flash_attn_ext", "ggml_graph_compute_with_ctx"):
            if not hasattr(lib, name):
                raise TargetError(f"{self.path} has no symbol {name}: not a ggml CPU backend")
        _declare(lib)
        lib.ggml_cpu_init()
        self.has_sinks = hasattr(lib, "ggml_flash_attn_ext_add_sinks")
        self.lib = lib
        self._prov = {
            "attention": {
                "symbol": "ggml_flash_attn_ext",
                "file": defining_file(lib.ggml_flash_attn_ext),
                "library": self.path,
                "elsewhere": False,
            }
        }

    def _decodes_as_tbq(self, fmt: Format) -> bool | None:
        """Whether the build's ``dequantize_row_<type>`` reads tbq's bytes of ``fmt`` as tbq does (None: no such
        function, or a format decoded without tables)."""
        fn = getattr(self.lib, f"dequantize_row_{ggml_type_name(fmt.name, self.names or {})}", None)
        if fn is None:  # f16 and bf16 rows have no dequantize_row_ function (and no tables)
            return None
        fn.argtypes, fn.restype = (P, P, ctypes.c_int64), None
        x = np.random.default_rng(5).standard_normal((8, fmt.block_size)).astype(np.float32)
        codec = codec_from(fmt.name, fmt.config())
        data = np.ascontiguousarray(codec.encode(x))
        out = np.zeros(x.size, np.float32)
        fn(data.ctypes.data, out.ctypes.data, x.size)
        return bool(np.array_equal(out.reshape(x.shape), codec.decode(data).reshape(x.shape)))

    def _match_tables(self, s: AttentionSettings) -> tuple[AttentionSettings, list[str]]:
        """The build's decoders must read tbq's bytes as tbq does, else the check would judge other tables: an
        option the settings leave at its default is matched among the format's known values (said in a note)."""
        notes = []
        for which in ("k", "v"):
            fmt: Format = getattr(s, f"{which}_format")
            if self._decodes_as_tbq(fmt) is not False:
                continue
            given: dict[str, Any] = getattr(s, f"{which}_options")
            free = {n: o.known for n, o in type(fmt).options.items() if n not in given and o.known}
            found = None
            for combo in itertools.product(*free.values()):
                opts = dict(given, **dict(zip(free, combo, strict=True)))
                if self._decodes_as_tbq(get_format(fmt.name, **opts)):
                    found = opts
                    break
            if found is None:
                text = ", ".join(f"{k}={v}" for k, v in fmt.config().items()) or "no options"
                raise TargetError(
                    f"the build's dequantize_row_{fmt.name} decodes tbq's {fmt.name} ({text}) bytes to other values, "
                    "and so it does with every known value of the options not given: it uses other tables"
                )
            default = {n: o.default for n, o in type(fmt).options.items()}
            found = {k: v for k, v in found.items() if k in given or v != default[k]}
            s = replace(s, k_options=found) if which == "k" else replace(s, v_options=found)
            chosen = ", ".join(f"{k}={found[k]}" for k in free if k in found)
            notes.append(
                f"the build's dequantize_row_{fmt.name} reads {fmt.name} bytes with {chosen} (not the format's "
                f"defaults): the {'K' if which == 'k' else 'V'} cache is encoded and judged with those tables"
            )
        return s, notes

    def defaults(self, s: AttentionSettings) -> Arithmetic:
        """ggml's CPU kernel: the query converted to the K type's vec_dot_type (f16 for f16 K); an f16 V
        accumulated in f16, any other V decoded to float32 and accumulated in float32."""
        q = _float_kind(s.k_format) or s.k_format.checker.vec_dot_type or "float32"
        return Arithmetic(q, "float32", "float16" if _float_kind(s.v_format) == "float16" else "float32")

    def provenance(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in getattr(self, "_prov", {}).items()}

    def link_libraries(self) -> list[str]:
        base = Path(self.path).parent / "libggml-base.so.0"
        return [self.path] + ([str(base)] if base.is_file() else [])

    # -- running ----------------------------------------------------------------------------------------------
    def run(self, case: AttentionCase, s: AttentionSettings) -> NDArray[np.float32]:
        return self.run_many([case], s)[0]

    def run_many(self, cases: Sequence[AttentionCase], s: AttentionSettings) -> list[NDArray[np.float32]]:
        outs: list[NDArray[np.float32]] = []
        for group in same_cache_groups(cases):  # decode steps over one cache: one call, their heads stacked
            c = cases[group[0]]
            if len(group) == 1:
                outs.append(self._call(c, s))
                continue
            n_q, H, G, T, D = c.shape
            r, m = H // G, len(group)
            q = np.stack([cases[i].q[0].reshape(G, r, D) for i in group], axis=1).reshape(1, G * m * r, D)
            o = self._call(replace(c, q=q), s).reshape(G, m, r, D)
            outs.extend(np.ascontiguousarray(o[:, j].reshape(1, H, D)) for j in range(m))
        return outs

    def _call(self, case: AttentionCase, s: AttentionSettings) -> NDArray[np.float32]:
        if self.lib is None:
            self.check_settings(s)
        lib, names = self.lib, self.names or {}
        n_q, H, G, T, D = case.shape
        q = case.q
        kf, vf = s.k_format, s.v_format
        if self.rotate and kf.domain.decode_domain == "rotated":  # the fork's graph rotates the query
            q = np.asarray(kf.domain.to_decode_domain(q), np.float32)
        mask = None if np.all(case.mask == 0) else case.mask
        size = q.nbytes + case.k.nbytes + case.v.nbytes + n_q * H * D * 4 + (0 if mask is None else mask.size * 2)
        ctx = lib.ggml_init(_InitParams(size + (64 << 20) + 4096 * H, None, False))
        if not ctx:
            raise TargetError(f"ggml_init could not allocate {size + (64 << 20):,} bytes")
        try:
            tq = lib.ggml_new_tensor_4d(ctx, names["f32"], D, n_q, H, 1)
            tk = lib.ggml_new_tensor_4d(ctx, names[self.k_name], D, T, G, 1)
            tv = lib.ggml_new_tensor_4d(ctx, names[self.v_name], D, T, G, 1)
            self._put(tq, q.transpose(1, 0, 2))
            self._put(tk, case.k.transpose(1, 0, 2))
            self._put(tv, case.v.transpose(1, 0, 2))
            tm = None
            if mask is not None:
                tm = lib.ggml_new_tensor_4d(ctx, names["f16"], T, n_q, 1, 1)
                self._put(tm, mask.astype(np.float16))
            o = lib.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, float(case.scale), 0.0, float(case.softcap))
            if case.sinks is not None:
                if not self.has_sinks:
                    raise TargetError(f"{self.path} has no ggml_flash_attn_ext_add_sinks: it cannot take sink logits")
                ts = lib.ggml_new_tensor_1d(ctx, names["f32"], H)
                self._put(ts, case.sinks)
                lib.ggml_flash_attn_ext_add_sinks(o, ts)
            g = lib.ggml_new_graph(ctx)
            lib.ggml_build_forward_expand(g, o)
            status = lib.ggml_graph_compute_with_ctx(ctx, g, self.threads)
            if status != 0:
                raise TargetError(f"ggml_graph_compute_with_ctx returned status {status}")
            if lib.ggml_nbytes(o) != n_q * H * D * 4:
                raise TargetError(
                    f"ggml_flash_attn_ext's result holds {lib.ggml_nbytes(o)} bytes, not {n_q * H * D * 4}"
                )
            buf = (ctypes.c_char * (n_q * H * D * 4)).from_address(lib.ggml_get_data(o))
            out = np.frombuffer(memoryview(buf), np.float32).reshape(n_q, H, D).copy()
        finally:
            lib.ggml_free(ctx)
        if self.rotate and vf.domain.decode_domain == "rotated":  # and rotates the output back
            out = np.asarray(vf.domain.from_decode_domain(out), np.float32)
        return out

    def _put(self, t: Any, a: NDArray[Any]) -> None:
        b = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
        n = self.lib.ggml_nbytes(t)
        if n != b.size:
            raise TargetError(f"a ggml tensor holds {n} bytes where tbq has {b.size}: the build's type sizes differ")
        ctypes.memmove(self.lib.ggml_get_data(t), b.ctypes.data, b.size)

    # -- a C reproducer ---------------------------------------------------------------------------------------
    def repro_c(self, ce: AttentionCounterexample, s: AttentionSettings) -> str | None:
        c = ce.case
        if self.names is None or (
            self.rotate
            and (s.k_format.domain.decode_domain == "rotated" or s.v_format.domain.decode_domain == "rotated")
        ):
            return None
        n_q, H, G, T, D = c.shape
        inc = Path(self.header).parent if self.header else Path("include")
        lib_dir = Path(self.path).parent

        def arr(name: str, a: NDArray[Any]) -> str:
            b = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
            body = ",".join(f"0x{int(x):02X}" for x in b)
            return f"static const unsigned char {name}[{b.size}] = {{{body}}};"

        exp = np.asarray(ce.expected, np.float64)
        lines = [
            f"/* Counterexample from `tbq check --attention`: ggml_flash_attn_ext over a {self.k_name} K cache and a",
            f" * {self.v_name} V cache, {c.family} case ({c.label}); tbq's float64 output and its derived bound per row.",
            " * Build and run (exit status 1 while a row is outside the bound):",
            f" *     cc -O2 -I {inc} -o repro attention-{s.k_type}-{s.v_type}-d{D}.c {' '.join(self.link_libraries())} "
            f"-Wl,-rpath,{lib_dir} -lm && ./repro */",
            '#include "ggml.h"',
            '#include "ggml-cpu.h"',
            "#include <math.h>",
            "#include <stdio.h>",
            "#include <string.h>",
            "",
            arr("Q", c.q.transpose(1, 0, 2)),
            arr("K", c.k.transpose(1, 0, 2)),
            arr("V", c.v.transpose(1, 0, 2)),
            arr("MASK", c.mask.astype(np.float16)),
            arr("SINKS", np.zeros(1, np.float32) if c.sinks is None else c.sinks),
            arr("EXPECTED", exp.astype("<f8")),
            arr("BOUND", np.asarray(ce.bound, "<f8")),
            "",
            "static int type_of(const char *name) {",
            "    for (int i = 0; i < GGML_TYPE_COUNT; i++) { const char *n = ggml_type_name((enum ggml_type)i); "
            "if (n && !strcmp(n, name)) return i; }",
            "    return -1;",
            "}",
            "",
            "int main(void) {",
            f"    const int D = {D}, NQ = {n_q}, H = {H}, G = {G}, T = {T}, has_mask = {int(not np.all(c.mask == 0))}, "
            f"has_sinks = {int(c.sinks is not None)};",
            "    ggml_cpu_init();",
            "    struct ggml_init_params ip = {(size_t)64 << 20 | sizeof(K) + sizeof(V) + sizeof(Q) * 2 + sizeof(MASK), NULL, false};",
            "    struct ggml_context *ctx = ggml_init(ip);",
            "    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, NQ, H, 1);",
            f'    struct ggml_tensor *k = ggml_new_tensor_4d(ctx, (enum ggml_type)type_of("{self.k_name}"), D, T, G, 1);',
            f'    struct ggml_tensor *v = ggml_new_tensor_4d(ctx, (enum ggml_type)type_of("{self.v_name}"), D, T, G, 1);',
            "    memcpy(q->data, Q, sizeof(Q)); memcpy(k->data, K, sizeof(K)); memcpy(v->data, V, sizeof(V));",
            "    struct ggml_tensor *m = NULL;",
            "    if (has_mask) { m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, T, NQ, 1, 1); memcpy(m->data, MASK, sizeof(MASK)); }",
            f"    struct ggml_tensor *o = ggml_flash_attn_ext(ctx, q, k, v, m, {float(c.scale)!r}f, 0.0f, {float(c.softcap)!r}f);",
            "    if (has_sinks) { struct ggml_tensor *s = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, H); "
            "memcpy(s->data, SINKS, sizeof(SINKS)); ggml_flash_attn_ext_add_sinks(o, s); }",
            "    struct ggml_cgraph *g = ggml_new_graph(ctx);",
            "    ggml_build_forward_expand(g, o);",
            f"    ggml_graph_compute_with_ctx(ctx, g, {self.threads});",
            "    const float *out = (const float *)ggml_get_data(o);",
            "    const double *e = (const double *)EXPECTED, *b = (const double *)BOUND;",
            "    int bad = 0;",
            "    for (int i = 0; i < NQ * H; i++) {",
            "        double worst = 0;",
            "        for (int j = 0; j < D; j++) { double d = fabs((double)out[i * D + j] - e[i * D + j]); "
            "if (!(d <= worst)) worst = d; }",
            '        if (!(worst <= b[i])) { bad++; if (bad <= 4) printf("query %d head %d: largest difference %.6g, bound %.6g\\n", i / H, i % H, worst, b[i]); }',
            "    }",
            '    printf("%d of %d rows outside the bound\\n", bad, NQ * H);',
            "    ggml_free(ctx);",
            "    return bad != 0;",
            "}",
            "",
        ]
        return "\n".join(lines)

    def close(self) -> None:
        """The library stays loaded (ctypes cannot unload it safely)."""
