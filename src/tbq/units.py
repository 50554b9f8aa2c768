"""Units of the KV budget: sizes in bytes, bandwidths, contexts in tokens.

Units are explicit. Sizes are strings with a unit (``"18.8GiB"``, ``"32GB"``)
or plain numbers of bytes; bandwidths are byte units per second
(``"1296GB/s"``); contexts are tokens, as integers or strings like ``"128K"``
(K = 1024 tokens). Binary (KiB, MiB, GiB) and decimal (kB, MB, GB) units are
never confused, and spellings that could be read two ways (``"32G"``,
``"32KB"``, ``"32Gb"``) are rejected with a message that says how to write
them. :mod:`tbq.budget` re-exports every public name, so
``from tbq.budget import parse_bytes`` keeps working.

>>> parse_bytes("32GB"), parse_bytes("32GiB")
(32000000000, 34359738368)
>>> format_bytes(2**34), format_rate(1296 * 10**9), format_context(262144)
('16.00 GiB', '1.296 TB/s', '256K')
"""

from __future__ import annotations

import contextlib
import math
import numbers
import re
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from .errors import TbqTypeError, TbqValueError

__all__ = [
    "parse_bytes",
    "parse_rate",
    "parse_context",
    "parse_contexts",
    "format_bytes",
    "format_rate",
    "format_context",
]


#: The largest number any quantity of the budget may be (bytes, bytes per second, tokens, values):
#: nothing in a KV budget comes near it, and below it every product the budget forms stays a
#: finite float (10^30 x 10^30 x 10^30 x 64 bits is far below the float maximum of 1.8e308).
MAX_QUANTITY = 10**30


def _not_huge(v: Fraction, what: str, text: Any) -> Fraction:
    if abs(v) > MAX_QUANTITY:
        raise TbqValueError(f"{what} {_show(text)} is too large: at most 10^30 is taken")
    return v


def _show(x: Any) -> str:
    """``x`` for a message: short, and never a NumPy repr (``np.float32(inf)`` shows as ``inf``)."""
    if isinstance(x, numbers.Real) and not isinstance(x, (bool, int)):
        with contextlib.suppress(OverflowError, ValueError):
            x = float(x)
    text = repr(x) if isinstance(x, str) else str(x)
    return text if len(text) <= 40 else text[:37] + "..."


def _float(x: numbers.Real) -> float:
    """``float(x)``, with a number beyond float's range (a huge int or Fraction) as ``inf``, which callers refuse as
    not finite."""
    try:
        return float(x)
    except OverflowError:
        return math.inf


def exact(x: Any, what: str, *, positive: bool = False) -> Fraction:
    """A non-negative (or positive) finite number, at most :data:`MAX_QUANTITY`, as an exact Fraction."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TbqTypeError(f"{what} must be a number, got {x!r}")
    if isinstance(x, numbers.Rational):
        v = Fraction(x)
    else:
        xf = _float(x)
        if not math.isfinite(xf):
            raise TbqValueError(f"{what} must be finite, got {xf}")
        v = Fraction(xf)
    if v < 0 or (positive and v == 0):
        raise TbqValueError(f"{what} must be {'positive' if positive else 'non-negative'}, got {_show(x)}")
    return _not_huge(v, what, x)


_NUM = r"[+-]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_QTY = re.compile(rf"^\s*(?P<num>{_NUM})\s*(?P<unit>.*?)\s*$")

_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
_BIN_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_DEC_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def _split_quantity(text: Any, what: str) -> tuple[Fraction, str, str]:
    if not isinstance(text, str):
        raise TbqTypeError(f"{what} must be a string, got {text!r}")
    m = _QTY.match(text)
    if m is None:
        raise TbqValueError(f"cannot read {what} {text!r}: expected a number followed by a unit, e.g. 18.8GiB")
    num = m.group("num")
    value = Fraction(num.replace("_", ""))
    return _not_huge(value, what, text), num, m.group("unit")


def _byte_multiplier(unit: str, num: str, text: str, per: str = "") -> int:
    """Bytes per unit of a byte unit ("GiB" -> 2**30, "GB" -> 10**9); rejects ambiguous spellings."""
    if unit == "B" or unit.lower() in ("byte", "bytes"):
        return 1
    if not unit:
        raise TbqValueError(
            f"{text!r} has no unit; write {num}B for bytes, or a unit such as "
            f"{num}GB (10^9 bytes) or {num}GiB (2^30 bytes)"
        )
    unknown = f"unknown byte unit {unit!r} in {text!r}; use B, kB, MB, GB, TB or KiB, MiB, GiB, TiB"
    if unit == "b" or unit.lower() in ("bit", "bits"):
        raise TbqValueError(f"{text!r} is in bits; sizes here are in bytes: write {num}B (or convert bits to bytes)")
    m = re.fullmatch(r"([A-Za-z])([iI]?)([A-Za-z]?)", unit)
    if m is None or m.group(1).upper() not in _BINARY:
        raise TbqValueError(unknown)
    p, i, b = m.groups()
    dec = "k" if p in "kK" else p.upper()  # the decimal spelling of the prefix: kB, MB, GB, ...
    bi = p.upper()  # the binary spelling: KiB, MiB, GiB, ...
    if b == "":
        raise TbqValueError(
            f"{text!r} is ambiguous: {unit!r} could mean decimal or binary bytes; "
            f"write {num}{dec}B{per} (decimal, 10^3 steps) or {num}{bi}iB{per} (binary, 2^10 steps)"
        )
    if b == "b":
        raise TbqValueError(
            f"{text!r}: a lowercase 'b' means bits, but sizes here are in bytes; "
            f"write {num}{dec}B{per} (decimal) or {num}{bi}iB{per} (binary) with an uppercase B"
        )
    if b != "B":
        raise TbqValueError(unknown)
    if i:  # binary: the prefix letter's case does not matter (KiB, kiB, KIB)
        return _BINARY[bi]
    if p == "K":
        raise TbqValueError(
            f"{text!r} is ambiguous: 'KB' is used for both 1000 and 1024 bytes; "
            f"write {num}kB{per} (1000) or {num}KiB{per} (1024)"
        )
    if p == "m":
        raise TbqValueError(
            f"{text!r}: 'mB' would be millibytes; write {num}MB{per} (10^6 bytes) or {num}MiB{per} (2^20 bytes)"
        )
    return _DECIMAL[dec]


def parse_bytes(text: Any) -> int:
    """A size in bytes from a string with an explicit unit, rounded to the nearest byte.

    Decimal units are B, kB, MB, GB, TB, PB (powers of 1000); binary units are
    KiB, MiB, GiB, TiB, PiB (powers of 1024; the prefix letter may be any case).
    A plain ``int``/``float`` is taken as bytes. Spellings that could be read
    two ways are rejected: no unit (``"32"``), no ``B`` (``"32G"``, ``"32Gi"``),
    ``"KB"`` (1000 or 1024?), and a lowercase ``b`` (bits: ``"32Gb"``, ``"32gb"``).

    >>> parse_bytes("32GB"), parse_bytes("32GiB"), parse_bytes("4224MiB")
    (32000000000, 34359738368, 4429185024)
    >>> parse_bytes("18.8GiB")          # 18.8 * 1,073,741,824 = 20,186,346,291.2
    20186346291
    >>> parse_bytes("1.5 kB"), parse_bytes("512B"), parse_bytes(4096)
    (1500, 512, 4096)
    >>> parse_bytes("32G")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tbq.errors.TbqValueError: '32G' is ambiguous: ... write 32GB (decimal, 10^3 steps) or 32GiB (binary, 2^10 steps)
    """
    if not isinstance(text, str):
        return round(exact(text, "a size in bytes"))
    value, num, unit = _split_quantity(text, "a size")
    mult = _byte_multiplier(unit, num, text)
    if value < 0:
        raise TbqValueError(f"a size cannot be negative: {text!r}")
    return int(_not_huge(Fraction(round(value * mult)), "a size", text))


def parse_rate(text: Any) -> int:
    """A bandwidth in bytes per second from a string like ``"1296GB/s"`` or ``"900GiB/s"``.

    The unit is a byte unit (see :func:`parse_bytes`) followed by ``/s``. Bit
    rates (``"Gb/s"``, ``"Gbps"``) are rejected. A plain number is taken as bytes/s.

    >>> parse_rate("1296GB/s"), parse_rate("1 TiB/s")
    (1296000000000, 1099511627776)
    >>> parse_rate("100Gb/s")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tbq.errors.TbqValueError: '100Gb/s': a lowercase 'b' means bits, ... write 100GB/s (decimal) or 100GiB/s ...
    """
    if not isinstance(text, str):
        return round(exact(text, "a bandwidth in bytes/s", positive=True))
    value, num, unit = _split_quantity(text, "a bandwidth")
    m = re.fullmatch(r"(.*?)\s*/\s*s(?:ec)?", unit)
    if m is None:
        if not unit:
            raise TbqValueError(f"{text!r} has no unit; write a bandwidth in bytes per second such as {num}GB/s")
        if unit.endswith("bps"):
            raise TbqValueError(f"{text!r} is a bit rate; write the bandwidth in bytes per second, e.g. {num}GB/s")
        if unit.endswith("ps"):
            raise TbqValueError(f"{text!r}: write the bandwidth as bytes per second with '/s', e.g. {unit[:-2]}/s")
        raise TbqValueError(f"{text!r} is not a bandwidth; use a byte unit per second, e.g. {num}GB/s or {num}GiB/s")
    mult = _byte_multiplier(m.group(1), num, text, per="/s")
    if value <= 0:
        raise TbqValueError(f"a bandwidth must be positive: {text!r}")
    rate = round(value * mult)
    if rate < 1:
        raise TbqValueError(f"a bandwidth must be at least 1 byte per second: {text!r}")
    return _not_huge(Fraction(rate), "a bandwidth", text).numerator


_CONTEXT_UNITS = {"": 1, "k": 1024, "m": 1024 * 1024}


def parse_context(x: Any) -> int:
    """A context length in tokens: an integer, or a string with ``K`` (1024) or ``M`` (1024 K).

    ``K`` is 1024 tokens, so ``"256K"`` is 262,144 tokens (2^18) while
    ``"262K"`` is 262 * 1024 = 268,288 tokens. Fractions are fine when the
    result is a whole number of tokens (``"1.5K"`` = 1536).

    >>> parse_context("8K"), parse_context("256K"), parse_context("262K"), parse_context(262144)
    (8192, 262144, 268288, 262144)
    >>> parse_context("1M"), parse_context("1.5k")
    (1048576, 1536)
    """
    if isinstance(x, bool):
        raise TbqTypeError(f"a context must be a number of tokens, got {x!r}")
    if isinstance(x, numbers.Integral):
        n = int(x)
    elif isinstance(x, numbers.Real):
        xf = _float(x)
        if not math.isfinite(xf):
            raise TbqValueError(f"a context must be a finite number of tokens, got {_show(x)}")
        if not xf.is_integer():
            raise TbqValueError(f"a context must be a whole number of tokens, got {x!r}")
        n = int(xf)
    elif isinstance(x, str):
        m = _QTY.match(x)
        unit = m.group("unit") if m else ""
        if m is None or unit.lower() not in _CONTEXT_UNITS:
            if m is not None and unit.lower().endswith("b"):
                raise TbqValueError(
                    f"context {x!r}: a context counts tokens, not bytes; write e.g. 8K (8,192 tokens) or 8192"
                )
            raise TbqValueError(
                f"cannot read context {x!r}: expected a token count such as 8192, 8K or 1M (K = 1024 tokens, M = 1024K)"
            )
        v = _not_huge(Fraction(m.group("num").replace("_", "")), "context", x) * _CONTEXT_UNITS[unit.lower()]
        if v.denominator != 1:
            raise TbqValueError(f"context {x!r} is {float(v):g} tokens, not a whole number")
        n = int(v)
    else:
        raise TbqTypeError(f"a context must be a number of tokens, got {x!r}")
    if n < 0:
        raise TbqValueError(f"a context cannot be negative: {_show(x)}")
    return int(_not_huge(Fraction(n), "context", x))


def parse_contexts(spec: Any) -> list[int]:
    """A list of contexts from ``"8K,32K,128K"`` or an iterable of ints/strings (order kept, duplicates dropped).

    >>> parse_contexts("8K, 32K,128K,262144")
    [8192, 32768, 131072, 262144]
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec) if isinstance(spec, Iterable) else [spec]
    out: list[int] = []
    for item in items:
        if isinstance(item, str) and not item.strip():
            raise TbqValueError(f"empty entry in the context list {spec!r}")
        n = parse_context(item)
        if n not in out:
            out.append(n)
    if not out:
        raise TbqValueError("no contexts given")
    return out


def format_bytes(n: Any, binary: bool = True, precision: int = 2) -> str:
    """A byte count in the largest binary (KiB, MiB, GiB) or decimal (kB, MB, GB) unit below it.

    >>> format_bytes(65536), format_bytes(16896), format_bytes(2**34), format_bytes(512)
    ('64.00 KiB', '16.50 KiB', '16.00 GiB', '512 B')
    >>> format_bytes(32 * 10**9), format_bytes(32 * 10**9, binary=False), format_bytes(-1.5 * 2**30)
    ('29.80 GiB', '32.00 GB', '-1.50 GiB')
    """
    v = float(n)
    base = 1024.0 if binary else 1000.0
    units = _BIN_UNITS if binary else _DEC_UNITS
    sign = "-" if v < 0 else ""
    a = abs(v)
    if a < base:
        return f"{sign}{a:.0f} B" if a.is_integer() else f"{sign}{a:.{precision}f} B"
    i = 0
    while a >= base and i < len(units) - 1:
        a /= base
        i += 1
    s = f"{a:.{precision}f}"
    if float(s) >= base and i < len(units) - 1:  # 1023.999 KiB -> 1.00 MiB
        a /= base
        i += 1
        s = f"{a:.{precision}f}"
    return f"{sign}{s} {units[i]}"


def format_rate(bytes_per_s: Any, binary: bool = False, precision: int = 3) -> str:
    """A bandwidth, decimal by default, without trailing zeros.

    >>> format_rate(1296 * 10**9), format_rate(900 * 2**30, binary=True), format_rate(10**12)
    ('1.296 TB/s', '900 GiB/s', '1 TB/s')
    """
    num, unit = format_bytes(bytes_per_s, binary=binary, precision=precision).split(" ")
    if "." in num:
        num = num.rstrip("0").rstrip(".")
    return f"{num} {unit}/s"


def format_context(n: int) -> str:
    """A context in the ``K`` (1024) notation when exact, else with thousands separators.

    >>> format_context(262144), format_context(268288), format_context(1048576), format_context(54626)
    ('256K', '262K', '1M', '54,626')
    """
    n = int(n)
    if n and n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)}M"
    if n and n % 1024 == 0:
        return f"{n // 1024}K"
    return f"{n:,}"
