"""Loading a shared library to check: what it needs, and refusing a load that would bind it to another build.

A ggml build is two libraries: ``libggml-cpu.so.0`` needs ``libggml-base.so.0`` and finds it beside itself
(``RUNPATH $ORIGIN``). The dynamic loader binds a needed soname to the object of that name *already loaded* in the
process, if there is one. So after one build was loaded, loading a second build's ``libggml-cpu.so.0`` binds it to
the first build's base library: its ``_ref`` functions, its tables, or a failure on a symbol the first build lacks
(``undefined symbol: quantize_row_tbq4_0_ref``). A check would then judge a mixture no one runs.
:func:`load_library` refuses that load with a one-line :class:`~tbq.check.targets.TargetError` instead.

The needed sonames and search paths come from the file's ELF dynamic section (:func:`elf_dependencies`; 32- and
64-bit, either byte order); what is loaded, from ``/proc/self/maps`` (Linux). Where either is unknown (another
system, a file that is not ELF) there is nothing to compare and the library is loaded as ctypes would.

>>> import sys
>>> deps = elf_dependencies(sys.executable)  # None on a system whose executables are not ELF
>>> deps is None or all(isinstance(name, str) for name in deps.needed)
True
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ElfDependencies",
    "elf_dependencies",
    "loaded_objects",
    "load_library",
    "resolve_library",
    "foreign_dependencies",
    "Probe",
    "probe_calls",
    "signal_words",
]

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 15, 29
#: Dynamic entries read at most (a real library has a few dozen; a corrupt count must not run away).
_MAX_DYNAMIC = 4096


@dataclass(frozen=True)
class ElfDependencies:
    """``needed``: the ``DT_NEEDED`` sonames in order; ``search``: the ``RUNPATH`` (or ``RPATH``) directories, with
    ``$ORIGIN`` already replaced by the file's directory."""

    needed: tuple[str, ...]
    search: tuple[str, ...]


def elf_dependencies(path: str | os.PathLike[str] | None) -> ElfDependencies | None:
    """The needed sonames and search directories of the ELF file ``path``, or None where it is not a readable ELF
    shared object (never an exception: the bytes are someone else's).

    >>> elf_dependencies("/nonexistent") is None
    True
    """
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        return _parse(data, os.path.dirname(os.path.abspath(os.fspath(path))))
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        return None


def _parse(data: bytes, origin: str) -> ElfDependencies | None:
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return None
    wide, end = data[4] == 2, "<" if data[5] == 1 else ">"
    if wide:
        phoff, phentsize, phnum = struct.unpack_from(end + "Q", data, 32)[0], *struct.unpack_from(end + "HH", data, 54)
        ph, dyn = end + "IIQQQQQQ", end + "qQ"  # type flags offset vaddr paddr filesz memsz align; tag value
    else:
        phoff, phentsize, phnum = struct.unpack_from(end + "I", data, 28)[0], *struct.unpack_from(end + "HH", data, 42)
        ph, dyn = end + "IIIIIIII", end + "iI"  # type offset vaddr paddr filesz memsz flags align
    loads, dynamic = [], None
    for i in range(phnum):
        f = struct.unpack_from(ph, data, phoff + i * phentsize)
        p_type, offset, vaddr, filesz = (f[0], f[2], f[3], f[5]) if wide else (f[0], f[1], f[2], f[4])
        if p_type == _PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (offset, filesz)
    if dynamic is None:
        return None
    entries, size = [], struct.calcsize(dyn)
    for i in range(min(dynamic[1] // size, _MAX_DYNAMIC)):
        tag, value = struct.unpack_from(dyn, data, dynamic[0] + i * size)
        if tag == _DT_NULL:
            break
        entries.append((tag, value))
    strtab = next((v for t, v in entries if t == _DT_STRTAB), None)
    if strtab is None:
        return None
    # DT_STRTAB is an address: the file offset is the one of the PT_LOAD segment that maps it
    base = next((off + strtab - va for va, off, sz in loads if va <= strtab < va + sz), None)
    if base is None:
        return None

    def string(at: int) -> str:
        start = base + at
        stop = data.index(b"\0", start)
        return data[start:stop].decode()

    needed = tuple(string(v) for t, v in entries if t == _DT_NEEDED)
    runpath = [string(v) for t, v in entries if t == _DT_RUNPATH]
    paths = runpath or [string(v) for t, v in entries if t == _DT_RPATH]  # RPATH only counts without RUNPATH
    search = tuple(d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin) for p in paths for d in p.split(":") if d)
    return ElfDependencies(needed, search)


def loaded_objects() -> dict[str, str]:
    """``{file name: real path}`` of the shared objects mapped into this process (``/proc/self/maps``; empty where
    the system has none)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            out.setdefault(os.path.basename(parts[5]), os.path.realpath(parts[5]))
    return out


def foreign_dependencies(path: str) -> list[tuple[str, str, str]]:
    """``(soname, already loaded from, would be loaded from)`` for each library ``path`` needs that this process
    already holds from another file than the one ``path``'s own search directories give (another build)."""
    deps = elf_dependencies(path)
    if deps is None:
        return []
    loaded = loaded_objects()
    out = []
    for soname in deps.needed:
        have = loaded.get(soname)
        if have is None:
            continue
        for d in deps.search:
            mine = os.path.join(d, soname)
            if os.path.isfile(mine):
                if os.path.realpath(mine) != have:
                    out.append((soname, have, os.path.realpath(mine)))
                break
    return out


def resolve_library(path: str) -> str:
    """The file to load for ``path``: ``path`` itself, or where it is a flattened symbolic link (a short text file
    naming a file beside it, as an archive or a copy leaves ``libggml-base.so -> libggml-base.so.0``) the file it
    names, which is what the link would have loaded. Reports name the file loaded.

    >>> resolve_library("libc.so.6")
    'libc.so.6'
    """
    link = _flattened_link(path)
    return link[0] if link else path


def load_library(path: str, error: type[Exception]) -> ctypes.CDLL:
    """``ctypes.CDLL`` of ``path`` (:func:`resolve_library`), refused with ``error`` (one line) where the loader would
    bind one of the libraries it needs to a file of another build already loaded (:func:`foreign_dependencies`) or
    cannot load it at all."""
    path = resolve_library(path)
    if os.path.exists(path):
        clash = foreign_dependencies(path)
        if clash:
            soname, have, mine = clash[0]
            raise error(
                f"cannot check {path}: it needs {soname}, which this process already loaded from {have}; the dynamic "
                f"loader would bind it to that file, not to {mine} (another build): check each build in its own "
                "process"
            )
    try:
        return ctypes.CDLL(path)
    except OSError as exc:
        raise error(f"cannot load {path} as a shared library: {' '.join(str(exc).split())}") from None


def _flattened_link(path: str) -> tuple[str, int] | None:
    """``(path of the file named, size)`` where ``path`` is a short text file holding the name of a file beside it
    (as a symbolic link ``libx.so -> libx.so.0`` becomes when an archive or a copy flattens links), else None."""
    try:
        with open(path, "rb") as f:
            data = f.read(4097)
    except OSError:
        return None
    if not 0 < len(data) <= 4096 or data.startswith(b"\x7fELF"):
        return None
    try:
        name = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    if not name or "\n" in name or "\0" in name:
        return None
    target = os.path.join(os.path.dirname(path), name)
    return (target, len(data)) if os.path.isfile(target) else None


# ---------------------------------------------------------------------------
# calling a library's functions first in a child process
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One call :func:`probe_calls` makes: ``kind`` ``"init"`` (``void f(void)``), ``"quantize"`` (``f(const float
    *x, void *y, int64_t k)``), ``"dequantize"`` (``f(const void *x, float *y, int64_t k)``) or ``"dot"`` (ggml's
    ``vec_dot``, ``nrc = 1``); ``k`` values, in ``nbytes`` bytes of blocks (of the left operand for ``dot``; its
    right operand's in ``rbytes``). ``label`` names the call in a message (``"quantize"``, ``"--init"``)."""

    kind: str
    symbol: str
    label: str
    k: int = 0
    nbytes: int = 0
    rbytes: int = 0


#: The child: load the library, call each function once on small zero-filled (or ramp) buffers with room to
#: spare, print the index of the call about to run. A missing library or symbol ends it quietly: the caller
#: reports those itself, with its own message.
_PROBE_CHILD = r"""
import ctypes, sys
try:  # a crash leaves no core file behind
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
except (ImportError, ValueError, OSError):
    pass
path, calls = sys.argv[1], [c.split(":") for c in sys.argv[2:]]
try:
    lib = ctypes.CDLL(path)
except OSError:
    sys.exit(0)
for i, (kind, sym, k, nbytes, rbytes) in enumerate(calls):
    k, nbytes, rbytes = int(k), int(nbytes), int(rbytes)
    fn = getattr(lib, sym, None)
    if fn is None:
        sys.exit(0)
    print(i, flush=True)
    if kind == "init":
        fn.argtypes, fn.restype = (), None
        fn()
    elif kind == "quantize":
        x = (ctypes.c_float * k)(*[(j % 17) / 8.0 - 1.0 for j in range(k)])
        fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64), None
        fn(x, ctypes.create_string_buffer(nbytes + 256), k)
    elif kind == "dequantize":
        fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64), None
        fn(ctypes.create_string_buffer(nbytes), (ctypes.c_float * (k + 64))(), k)
    else:
        s = (ctypes.c_float * 2)()
        x, y = ctypes.create_string_buffer(nbytes + 256), ctypes.create_string_buffer(rbytes + 256)
        fn.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                       ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        fn.restype = None
        fn(k, s, 0, x, 0, y, 0, 1)
"""

#: Seconds the probe may take (ggml_cpu_init builds its fp16 tables: well under one).
PROBE_TIMEOUT = 120.0


def signal_words(sig: int) -> str:
    """``"SIGILL (illegal instruction)"`` for a signal number.

    >>> signal_words(11)
    'SIGSEGV (segmentation fault)'
    """
    try:
        name = signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
    desc = signal.strsignal(sig) or ""
    return f"{name} ({desc.lower()})" if desc else name


def probe_calls(path: str, calls: Sequence[Probe], error: type[Exception]) -> None:
    """Make ``calls`` of the library at ``path`` once in a child process first, and raise ``error`` (one line,
    naming the function and the signal) if one of them kills it.

    A library built for instructions this CPU lacks (``GGML_NATIVE=ON`` or ``-march=native`` on another machine:
    AVX-512 where this CPU has AVX2) dies of ``SIGILL`` in its first SIMD function; called in the checking process,
    that would end it with no message. The child loads the library and calls the init functions and each kernel
    once on a few blocks; the checking process calls nothing until the child came back. A missing library or
    symbol is left to the caller's own message; a crash on other data later in the check is not foreseen.

    >>> probe_calls("libc.so.6", [Probe("init", "abort", "--init")], ValueError)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --init abort (libc.so.6) died of SIGABRT (aborted) when a probe process called it ...
    """
    if not calls:
        return
    args = [f"{c.kind}:{c.symbol}:{c.k}:{c.nbytes}:{c.rbytes}" for c in calls]
    try:
        r = subprocess.run(
            [sys.executable, "-I", "-c", _PROBE_CHILD, path, *args],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise error(
            f"cannot check {path}: a probe process calling its functions once did not return within "
            f"{PROBE_TIMEOUT:.0f} s"
        ) from None
    except OSError:  # no interpreter to start (an embedded Python): check without the probe, as before it
        return
    if r.returncode >= 0:
        return
    started = r.stdout.split()
    c = calls[int(started[-1])] if started and started[-1].isdigit() and int(started[-1]) < len(calls) else None
    what = f"{c.label} {c.symbol} ({os.path.basename(path)})" if c else os.path.basename(path)
    hint = ""
    if -r.returncode == signal.SIGILL:
        hint = (
            ": the library uses instructions this CPU lacks (built with GGML_NATIVE=ON or -march=native for "
            "another CPU?); build it on this machine"
        )
    raise error(
        f"{what} died of {signal_words(-r.returncode)} when a probe process called it once, so tbq check did not "
        f"call it{hint}"
    )
