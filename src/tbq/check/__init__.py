"""Conformance and fuzz testing of other people's kernels, with a diagnosis: "your kernel is wrong on this block, in this way".

Three kinds of target, one check (:mod:`tbq.check.runner`):

- :func:`check_library`: a shared library with ggml's row functions
  ``quantize_row_<fmt>_ref`` / ``dequantize_row_<fmt>`` (ctypes);
- :func:`check_kernel`: Python callables (a NumPy, PyTorch or Triton kernel
  you wrap), usable inside your own pytest suite;
- :func:`check_program`: an external program that reads one file and writes
  another (a GPU binary): ``"./mykernel {op} {in} {out}"``.

Fused attention kernels over quantized caches: :func:`check_attention`
(:mod:`tbq.check.attention`; a ggml build's ``ggml_flash_attn_ext`` is
:class:`GgmlAttention`, :mod:`tbq.check.ggml_graph`).

Each direction the target implements goes through the golden families in
bulk, a hypothesis fuzz (``examples`` examples or ``seconds`` seconds,
shrunk to a minimal block on failure) and, for decoders, arbitrary bytes with
special fp16 scales. Every block is ``exact``, ``fragile`` (a legitimate
reduction-order or FMA difference inside the golden fragility masks; accepted
unless ``exact=True``), ``equivalent`` (other bytes, the same decoded values),
``tie_rule`` (another tie rule at exact ties), ``undefined`` (an input the C
reference leaves undefined), ``accepted`` (waived by ``accept``) or ``wrong``
(:mod:`tbq.check.classify`). Dot-product kernels: :mod:`tbq.check.dot`. The
:class:`CheckReport` gives the counts per direction and phase, the first
minimal failing block with its differing bytes, fields and tbq's trace, and
the patterns it recognises (:mod:`tbq.check.diagnose`).

Works for every registered format, with its options (TBQ's ``codebook`` and
``signs``). The CLI is ``tbq check`` (docs/checking-kernels.md).

>>> import tbq
>>> report = check_kernel("q4_0", quantize=lambda x: tbq.quantize(x, "q4_0"), blocks=400, examples=0)
>>> report.ok, report.counts("quantize")["wrong"]
(True, 0)
>>> def swapped(x):  # a Q4_0 encoder that swaps the nibbles of every code byte
...     q = tbq.quantize(x, "q4_0").reshape(-1, 18)
...     q[:, 2:] = (q[:, 2:] >> 4) | (q[:, 2:] << 4)
...     return q
>>> report = check_kernel("q4_0", quantize=swapped, blocks=400, examples=0)
>>> report.ok, [d.name for d in report.diagnoses if d.scope == "wrong"]
(False, ['nibble_order'])
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from numpy.typing import NDArray

from ..codecs import Codec
from ..errors import ConfigError
from ..formats import Format, get_format
from ..golden.settings import refuse_keywords_beside
from .attention import (
    Arithmetic,
    AttentionReport,
    AttentionSettings,
    AttentionTarget,
    CallableAttention,
    ProgramAttention,
    check_attention,
)
from .classify import CLASSES, EXACT, FRAGILE, WRONG
from .diagnose import Diagnosis
from .dot import CallableDot, LibraryDot, check_dot, right_format
from .ggml_graph import GgmlAttention
from .report import CheckReport, Counterexample, PhaseResult
from .runner import FuzzUnavailable, run_check
from .settings import DEFAULT_BLOCKS, DEFAULT_EXAMPLES, DEFAULT_K, CheckSettings
from .targets import CallableTarget, LibraryTarget, ProgramTarget, Target, TargetError, default_symbol

__all__ = [
    "check_kernel",
    "check_library",
    "check_program",
    "check_target",
    "CheckSettings",
    "check_dot",
    "check_attention",
    "AttentionSettings",
    "Arithmetic",
    "AttentionReport",
    "AttentionTarget",
    "CallableAttention",
    "ProgramAttention",
    "GgmlAttention",
    "CheckReport",
    "Counterexample",
    "PhaseResult",
    "Diagnosis",
    "Target",
    "LibraryTarget",
    "CallableTarget",
    "ProgramTarget",
    "TargetError",
    "FuzzUnavailable",
    "default_symbol",
    "resolve_format",
    "CLASSES",
    "EXACT",
    "FRAGILE",
    "WRONG",
    "DEFAULT_BLOCKS",
    "DEFAULT_EXAMPLES",
    "DEFAULT_K",
]


def resolve_format(
    fmt: str | Format | Codec, codebook: Any = None, signs: Any = None, options: dict[str, Any] | None = None
) -> Format:
    """The :class:`~tbq.formats.Format` to check against: a name with its ``options`` (TBQ's ``codebook``/``signs``
    are spellings of two of them), a Format or a Codec.

    >>> resolve_format("tbq3_0", codebook="turboq-mtp").config()["codebook"]
    'turboq-mtp'
    >>> resolve_format("fp8_e4m3", options={"scale": 0.5}).config()
    {'scale': 0.5}
    """
    if options is not None and not isinstance(options, dict):
        raise ConfigError(f"options must be a dict of format options, e.g. {{'scale': 0.0173}}, got {options!r}")
    opts = dict(options or {})
    opts.update({k: v for k, v in (("codebook", codebook), ("signs", signs)) if v is not None})
    if isinstance(fmt, Format):
        if opts:
            raise ConfigError("pass format options with a format name; a Format already carries its options")
        return fmt
    inner = getattr(fmt, "__dict__", {}).get("format")
    if isinstance(inner, Format):  # a tbq.Codec
        if opts:
            raise ConfigError("pass format options with a format name; a Codec already carries its options")
        return inner
    if not isinstance(fmt, str):
        raise ConfigError(
            f"fmt must be a format name such as 'q8_0', a tbq Format or a tbq Codec, got {type(fmt).__name__}"
        )
    return get_format(fmt, **opts)


def _finish(report: CheckReport, target: Target, out: str | os.PathLike[str] | None) -> CheckReport:
    """Write the counterexamples into ``out`` (only when something failed); a directory that cannot be written is a note."""
    if out is not None and report.counterexamples:
        links = {d: target.link_libraries(d) for d in report.counterexamples}
        try:
            report.save(out, target.format, {d: target.symbols.get(d) for d in report.counterexamples}, links)
        except OSError as exc:
            report.notes.append(f"the counterexample files could not be written to {out}: {exc.strerror or exc}")
    return report


#: The settings a dot-product check (:func:`tbq.check.dot.check_dot`) takes.
_DOT_SETTINGS = ("blocks", "examples", "exact", "seed", "out", "accept")


def _settings_or_keywords(settings: CheckSettings, given: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Refuse a :class:`CheckSettings` given together with setting keywords (changed from their defaults)."""
    if not isinstance(settings, CheckSettings):
        raise ConfigError(f"settings must be a tbq.check.CheckSettings, got {type(settings).__name__}")
    refuse_keywords_beside(given, defaults, "the check's settings")


def check_target(target: Target, settings: CheckSettings | None = None, **keywords: Any) -> CheckReport:
    """Check any :class:`Target` under ``settings`` (a :class:`CheckSettings`) or its fields as ``keywords`` (see
    :func:`check_kernel`); closes the target afterwards."""
    try:
        s = CheckSettings.of(settings, keywords)
        return _finish(run_check(target, s), target, s.out)
    finally:
        target.close()


def check_kernel(
    fmt: str | Format | Codec,
    quantize: Callable[[NDArray[Any]], Any] | None = None,
    dequantize: Callable[[NDArray[Any]], Any] | None = None,
    *,
    codebook: Any = None,
    signs: Any = None,
    options: dict[str, Any] | None = None,
    blocks: int = DEFAULT_BLOCKS,
    examples: int = DEFAULT_EXAMPLES,
    seconds: float | None = None,
    exact: bool = False,
    k: int = DEFAULT_K,
    seed: int = 0,
    out: str | os.PathLike[str] | None = None,
    progress: bool | None = False,
    name: str | None = None,
    accept: str | Iterable[str] | None = (),
    dot: Callable[[NDArray[Any], NDArray[Any], int], Any] | None = None,
    rhs: str | Format | None = None,
    settings: CheckSettings | None = None,
) -> CheckReport:
    """Check Python kernels of format ``fmt`` against tbq; returns a :class:`CheckReport`.

    ``quantize(x)`` takes float32 rows ``(rows, k)`` and returns the encoded
    rows (uint8, anything array-like: NumPy, a PyTorch tensor on any device,
    bytes); ``dequantize(data)`` takes uint8 rows and returns float32. Give
    either or both.

    ``options``: the format's own options (FP8: ``{"scale": 0.0173}``);
    ``codebook`` and ``signs`` are spellings of TBQ's two.

    Settings: ``blocks`` (golden and random-bytes blocks, default
    20,000), ``examples`` (hypothesis examples per direction, default 100;
    0 skips the fuzz phase, which needs hypothesis) or ``seconds`` (a time
    budget per direction instead), ``exact`` (refuse fragile differences),
    ``k`` (the fragility margin in float32 ulps, default 4), ``seed``,
    ``out`` (a directory for the counterexamples' ``.npz`` and ``.c`` files,
    written only when something fails), ``progress`` (``None``: on stderr
    when it is a terminal), ``accept`` (names of classes or diagnoses to
    waive so that the check goes on to the next distinct failure, e.g.
    ``accept=["nibble_order"]``: a wrong block that diagnosis explains by
    itself is counted ``accepted``; ``"tie_rule"``, ``"undefined"``,
    ``"fragile"`` pass even with ``exact``).

    ``dot``: a dot-product kernel ``dot(x, y, n) -> float`` instead (``x``
    encoded in ``fmt``, ``y`` in ``rhs``, default the format ggml pairs it
    with): checked by :func:`tbq.check.dot.check_dot` (``blocks``,
    ``examples``, ``exact``, ``seed``, ``out`` and ``accept``, there
    ``"fragile"`` or ``"unsigned_codes"``, apply).

    ``settings``: all of those at once, a :class:`CheckSettings` (then leave their keywords out).

    In a pytest suite: ``report = check_kernel(...); assert report.ok, report``.
    """
    f = resolve_format(fmt, codebook, signs, options)
    given: dict[str, Any] = {name: value for name, value in locals().items() if name in _KERNEL_DEFAULTS}
    if settings is not None:
        _settings_or_keywords(settings, given, _KERNEL_DEFAULTS)
        given = {name: getattr(settings, name) for name in given}
    if dot is not None:
        if quantize is not None or dequantize is not None:
            raise ConfigError("give dot= alone: a dot-product check does not take quantize= or dequantize=")
        return check_dot(CallableDot(f, right_format(f, rhs), dot, name=name), **{n: given[n] for n in _DOT_SETTINGS})
    return check_target(CallableTarget(f, quantize, dequantize, name=name), CheckSettings.of(None, given))


def check_library(
    path: str | os.PathLike[str],
    fmt: str | Format | Codec,
    *,
    quantize: str | None = None,
    dequantize: str | None = None,
    only: str | None = None,
    init: str | Iterable[str] = (),
    strict_lib: bool = False,
    codebook: Any = None,
    signs: Any = None,
    options: dict[str, Any] | None = None,
    dot: str | None = None,
    rhs: str | Format | None = None,
    settings: CheckSettings | None = None,
    **keywords: Any,
) -> CheckReport:
    """Check a shared library's ggml row functions (default names ``quantize_row_<fmt>_ref``, ``dequantize_row_<fmt>``).

    ``quantize`` / ``dequantize`` name other symbols; ``only`` (``"quantize"``
    or ``"dequantize"``) checks one direction. ``init``: names of ``void
    f(void)`` functions called once after loading, in order (ggml's CPU
    backend needs ``ggml_cpu_init``). The report names each symbol and the
    file that defines it (``dladdr``); ``strict_lib=True`` refuses a symbol
    that a dependency of the library defines. ``settings`` (a
    :class:`CheckSettings`) or its fields as keywords, as in :func:`check_kernel`. A library that does not load or lacks a symbol
    raises :class:`TargetError`. ``dot``: the symbol of a ggml ``vec_dot``
    kernel instead (``rhs``: its right operand's format, default the one
    ggml pairs ``fmt`` with), checked by :func:`tbq.check.dot.check_dot`.
    """
    f = resolve_format(fmt, codebook, signs, options)
    if dot is not None:
        if settings is not None:
            raise ConfigError("a dot-product check takes its settings as keywords, not a CheckSettings")
        extra = set(keywords) - set(_DOT_SETTINGS)
        if extra or quantize or dequantize or only:
            raise ConfigError(
                "a dot-product check takes blocks, examples, exact, seed, out and accept, not "
                f"{', '.join(sorted(extra)) or 'row symbols'}"
            )
        keywords.setdefault("examples", DEFAULT_EXAMPLES)  # the fuzz phase, as for row functions
        return check_dot(LibraryDot(path, dot, f, right_format(f, rhs), init=init, strict_lib=strict_lib), **keywords)
    s = CheckSettings.of(settings, keywords)  # validated before the library is loaded
    return check_target(
        LibraryTarget(path, f, quantize=quantize, dequantize=dequantize, only=only, init=init, strict_lib=strict_lib),
        s,
    )


def check_program(
    command: str,
    fmt: str | Format | Codec,
    *,
    only: str | None = None,
    timeout: float = 600.0,
    codebook: Any = None,
    signs: Any = None,
    options: dict[str, Any] | None = None,
    settings: CheckSettings | None = None,
    **keywords: Any,
) -> CheckReport:
    """Check an external program: ``command`` with ``{in}``, ``{out}`` and optionally ``{op}``, ``{k}``, ``{rows}``, ``{format}``.

    The program reads ``{in}`` (raw little-endian float32 to quantize, or
    encoded bytes to dequantize; rows back to back) and writes ``{out}``.
    Without ``{op}`` it implements one direction: say which with ``only``.
    ``settings`` (a :class:`CheckSettings`) or its fields as keywords, as in :func:`check_kernel`.
    """
    f = resolve_format(fmt, codebook, signs, options)
    s = CheckSettings.of(settings, keywords)  # validated before the program is run
    return check_target(ProgramTarget(command, f, only=only, timeout=timeout), s)


#: check_kernel's keyword defaults (a CheckSettings given with settings= refuses keywords changed from them).
_KERNEL_DEFAULTS = {
    "blocks": DEFAULT_BLOCKS,
    "examples": DEFAULT_EXAMPLES,
    "seconds": None,
    "exact": False,
    "k": DEFAULT_K,
    "seed": 0,
    "out": None,
    "progress": False,
    "accept": (),
}
