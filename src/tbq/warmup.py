"""The first run of a comparison: compiling its numba kernels into numba's on-disk cache, on every core.

Numba compiles one function at a time per process. A cold start
(:func:`start_warm_up`) runs helper interpreters beside the caller; the
kernel modules of the formats form one queue, heaviest first by an AST
estimate of their compile cost (:func:`_compile_weight`), and every process
takes the next module no other has claimed (an ``O_EXCL`` file in a
``tbq-warm-*`` folder of the temporary folder). A claim folder that a killed
process left behind is removed by a later cold start once it is an hour old.

:mod:`tbq.compare` re-exports the public names (``warm_up``,
``start_warm_up``, ``WarmUp``, ``kernels_cached``); ``tbq compare`` starts the
helpers as soon as it knows the cache is cold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .attention import KVCache, attention_fused
from .codecs import get_codec
from .formats import config_for, format_class

__all__ = ["kernels_cached", "warm_up", "start_warm_up", "WarmUp", "ATTENTION_UNIT", "CLAIMS_PREFIX", "STALE_CLAIMS_S"]

#: Head size of the rows the warm-up runs the fused attention kernel on (the built-in data set's).
HEAD_DIM = 128

# ---------------------------------------------------------------------------
# the first run: compiling the numba kernels, on every core
# ---------------------------------------------------------------------------


#: The fused attention kernel's module, a unit of a cold start's queue beside the formats' kernel modules.
ATTENTION_UNIT = "tbq.attention_kernels"


def _kernel_units(fmts: Any, attention: bool) -> list[str]:
    """The kernel modules a comparison compiles (formats sharing a module share its kernels)."""
    units = [format_class(f).kernel_module for f in fmts]
    if attention:
        units.append(ATTENTION_UNIT)
    return [u for u in dict.fromkeys(units) if u]


def _compile_weight(source: str) -> int:
    r"""A proxy for the seconds numba takes to compile a kernel module: the source lines of its top-level
    functions decorated with ``jit`` or ``njit`` (numba compiles those; an LLVM-IR intrinsic's Python
    codegen and docstrings are not compiled code), less those the module names in ``_LAZY_KERNELS`` (compiled
    only for unusual shapes). At least 1.

    >>> _compile_weight("@jit\ndef f(x):\n    return x\n\n\ndef g():\n    pass\n")
    3
    """
    import ast

    tree = ast.parse(source)
    lazy: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_LAZY_KERNELS" for t in node.targets
        ):
            lazy = {str(e.value) for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}

    def numba_compiled(d: ast.expr) -> bool:
        f = d.func if isinstance(d, ast.Call) else d
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        return name in ("jit", "njit")

    lines = sum(
        (node.end_lineno or node.lineno) - node.decorator_list[0].lineno + 1
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and node.name not in lazy
        and node.decorator_list
        and any(numba_compiled(d) for d in node.decorator_list)
    )
    return max(1, lines)


def _units_by_weight(fmts: Any, attention: bool) -> list[str]:
    """The kernel modules of a comparison of ``fmts``, heaviest first by :func:`_compile_weight` (a cold start's
    processes take them in this order, so the last to be taken are the lightest)."""
    import importlib.util

    units = _kernel_units(fmts, attention)
    weight = {}
    for u in units:
        spec = importlib.util.find_spec(u)
        weight[u] = _compile_weight(Path(spec.origin).read_text()) if spec and spec.origin else 1
    return sorted(units, key=lambda u: -weight[u])


def kernels_cached(fmts: Any, attention: bool = True) -> bool | None:
    """True when numba's cache holds compiled kernels of every module ``fmts`` (and attention) use.

    ``False`` means a module was never compiled here (the first run in a fresh
    environment); ``None`` when numba's cache cannot be inspected. A cache
    that numba finds stale (the source changed) still counts as present.
    """
    import importlib

    try:
        from numba.core.caching import NullCache
        from numba.core.registry import CPUDispatcher
    except ImportError:  # pragma: no cover - numba is a dependency
        return None
    try:
        for unit in _kernel_units(fmts, attention):
            mod = importlib.import_module(unit)
            disps = [v for v in vars(mod).values() if isinstance(v, CPUDispatcher) and v.__module__ == unit]
            # an inlined helper (tbq.kernels.jit_inline) has numba's NullCache: nothing on disk to look for
            cached = [d for d in disps if not isinstance(getattr(d, "_cache", None), (NullCache, type(None)))]
            paths = [d._cache._cache_file._index_path for d in cached]  # type: ignore[attr-defined]  # numba internals
            if paths and not any(os.path.exists(p) for p in paths):
                return False
    except Exception:  # numba internals moved: say nothing rather than guess
        return None
    return True


def _warm(fmts: Any, config: dict[str, Any], attention: bool, readers: bool | None = None) -> None:
    """Compile (or load from the cache) the kernels a comparison of ``fmts`` uses, on small inputs of the same types
    (``readers``, default ``attention``: the formats' attention readers too)."""
    x = np.zeros((64, 1024), np.float32)  # 64 rows of 8 heads: whole blocks of every format, >= 32 blocks a call
    x[:, ::7] = 1.0
    for f in fmts:
        cfg = dict(config_for(f, config))
        cfg["on_overflow"] = "inf"
        c = get_codec(f, **cfg)
        if c.backend == "numba":
            c.decode(c.encode(x))
        if (attention if readers is None else readers) and c.format.attention.domain == "rotated":
            c.format.attention.reader()  # the fused kernel's reader of a rotated format (the others' rows are decoded)
    if attention:  # one kernel for every format (the formats' readers are run-time arguments)
        rows = x.reshape(64, 8, HEAD_DIM)
        q = np.ones((8, HEAD_DIM), np.float32)
        attention_fused(q, rows, rows, threads=1)
        # a rotated format's cache: on AVX-512VL the kernel reads its codes itself (another kernel, _attend_codes)
        rotated = [f for f in fmts if format_class(f).attention.domain == "rotated"]
        if rotated:
            cache = KVCache.encode(rows, rotated[0], config=config_for(rotated[0], config))
            attention_fused(q, cache, cache, threads=1)


#: A cold start's claim folders (:func:`start_warm_up`) are ``tbq-warm-*`` in the temporary folder; one left by a
#: process that was killed (SIGKILL: no clean-up) is removed by the next cold start once it is this old (a cold
#: start takes seconds, so no folder of a running one is this old).
CLAIMS_PREFIX = "tbq-warm-"
STALE_CLAIMS_S = 3600.0


def _remove_stale_claims(folder: str, now: float | None = None) -> list[str]:
    """Remove the claim folders in ``folder`` last changed more than :data:`STALE_CLAIMS_S` ago; their names.
    Only directories named ``tbq-warm-*`` holding nothing but plain files (a queue's claims) are touched; any
    error leaves a folder in place."""
    import shutil

    now = time.time() if now is None else now
    removed: list[str] = []
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except OSError:
        return removed
    for e in entries:
        try:
            if not (e.name.startswith(CLAIMS_PREFIX) and e.is_dir(follow_symlinks=False)):
                continue
            if now - e.stat(follow_symlinks=False).st_mtime <= STALE_CLAIMS_S:
                continue
            with os.scandir(e.path) as it:
                if any(not f.is_file(follow_symlinks=False) for f in it):
                    continue
            shutil.rmtree(e.path)
        except OSError:
            continue
        removed.append(e.name)
    return removed


def _claim(claims: str | None, unit: str) -> bool:
    """True for the one process that creates ``unit``'s claim file in ``claims`` first (``O_EXCL``: atomic);
    always True without a folder (``None``: a process alone)."""
    if claims is None:
        return True
    try:
        os.close(os.open(os.path.join(claims, unit), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


def _warm_queue(
    units: list[str],
    fmts: list[str],
    config: dict[str, Any],
    claims: str | None,
    readers: bool,
    keep: Any = None,
) -> None:
    """Compile the kernel modules ``units`` in order, each in the process that claims it first (:func:`_claim`):
    a cold start's processes work through the same queue until it is empty, so none waits while another still
    has modules to go (``keep``: only those formats of a claimed module, when given)."""
    for u in units:
        if not _claim(claims, u):
            continue
        mine = [f for f in fmts if format_class(f).kernel_module == u and (keep is None or f in keep)]
        _warm(mine, config, u == ATTENTION_UNIT, readers)


class WarmUp:
    """A cold start's compilation under way (:func:`start_warm_up`): the helper processes already take kernel
    modules from the queue; :meth:`finish` takes the rest in this process and waits for them, :meth:`cancel`
    stops them."""

    def __init__(
        self,
        procs: list[Any],
        units: list[str],
        fmts: list[str],
        config: dict[str, Any],
        claims: str | None,
        readers: bool,
    ):
        self._procs, self._units, self._fmts, self._config = procs, units, fmts, config
        self._claims, self._readers = claims, readers
        self._t0 = time.perf_counter()

    def finish(self, fmts: Any = None) -> float:
        """Compile the modules no helper has claimed yet (only the formats in ``fmts`` when given: those the
        comparison kept), wait for the helpers; the seconds since the start."""
        keep = None if fmts is None else set(fmts)
        try:
            _warm_queue(self._units, self._fmts, self._config, self._claims, self._readers, keep)
        finally:
            for pr in self._procs:
                pr.wait()
            self._cleanup()
        return time.perf_counter() - self._t0

    def cancel(self) -> None:
        """Stop the helper processes (the comparison failed before it needed their kernels)."""
        for pr in self._procs:
            pr.kill()
            pr.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        import shutil

        if self._claims is not None:
            shutil.rmtree(self._claims, ignore_errors=True)


def start_warm_up(
    fmts: Any, config: dict[str, Any] | None = None, *, attention: bool = True, processes: int | None = None
) -> WarmUp:
    """Start compiling the kernels of a comparison of ``fmts`` into numba's cache, on ``processes`` cores.

    Numba compiles one function at a time per process, so a cold start runs
    ``processes - 1`` helper interpreters (``python -c``) beside this process.
    The kernel modules form one queue, heaviest first by :func:`_compile_weight`
    (a proxy for compile time; formats that share a module stay together);
    every process takes the next module no other has claimed (an ``O_EXCL``
    file in a temporary folder) and compiles it into the shared on-disk cache,
    until none is left. This process joins in :meth:`WarmUp.finish`, after it
    built the codecs and the data; afterwards every kernel loads from the cache.
    A queue, not a fixed split: the processes start at different times and the
    weights are only a proxy, so a fixed split left one process idle while the
    other still compiled. ``processes=1`` starts no helper. The CLI starts the
    helpers as soon as it knows the cache is cold, before it builds the codecs
    and the data. A claim folder that a killed process left behind is removed
    by a later cold start once it is an hour old (:func:`_remove_stale_claims`).
    """
    import tempfile

    config = dict(config or {})
    fmts = list(fmts)
    if processes is None:
        try:
            processes = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover
            processes = os.cpu_count() or 1
    units = _units_by_weight(fmts, attention)
    helpers = max(0, min(processes, len(units)) - 1)
    claims: str | None = None
    if helpers:
        _remove_stale_claims(tempfile.gettempdir())
        try:
            claims = tempfile.mkdtemp(prefix=CLAIMS_PREFIX)
        except OSError:  # no writable temporary folder: no queue to share, so this process compiles everything
            helpers = 0
    procs = []
    for _ in range(helpers):
        job = {"units": units, "formats": fmts, "config": config, "claims": claims, "readers": attention}
        code = (
            f"import json, tbq.warmup as c; j = json.loads({json.dumps(json.dumps(job))}); "
            "c._warm_queue(j['units'], j['formats'], j['config'], j['claims'], j['readers'])"
        )
        procs.append(
            subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
    return WarmUp(procs, units, fmts, config, claims, attention)


def warm_up(
    fmts: Any, config: dict[str, Any] | None = None, *, attention: bool = True, processes: int | None = None
) -> float:
    """Compile the kernels of a comparison of ``fmts`` into numba's cache, on ``processes`` cores at once
    (:func:`start_warm_up`, then :meth:`WarmUp.finish`). Returns the seconds spent."""
    return start_warm_up(fmts, config, attention=attention, processes=processes).finish()
