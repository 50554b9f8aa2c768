"""The budget's table of formats: bits per value of every KV cache format (the registry's cache types, f32
included, the KV pairs ``k:v`` and vLLM's presets), their block sizes, and which formats a head size cannot
hold."""

from __future__ import annotations

import numbers
import operator
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from ..errors import ConfigError, TbqTypeError, TbqValueError
from ..formats import FORMATS, FormatInfo, cache_types, format_info
from ..units import (  # re-exported: tbq.budget was their home before tbq.units
    MAX_QUANTITY,
)
from ..units import exact as _exact
from ..vllm_slots import PRESET_NAMES, slot_bytes

__all__ = [
    "KV_FORMAT_BITS",
    "DEFAULT_FORMATS",
    "DEFAULT_CONTEXTS",
    "bits_per_value",
    "format_bits",
    "format_block_size",
    "incompatible_formats",
    "VLLM_BOUNDARY_LAYERS",
    "PRESET_HEAD_DIM",
]

# ---------------------------------------------------------------------------
# Format table
# ---------------------------------------------------------------------------

#: Other spellings; ``fp8`` is vLLM's ``kv_cache_dtype="fp8"``, which means E4M3.
_ALIASES = {"fp32": "f32", "float32": "f32", "fp16": "f16", "float16": "f16", "bfloat16": "bf16", "fp8": "fp8_e4m3"}


def _block_bits(info: FormatInfo) -> Fraction:
    return Fraction(info.type_size * 8, info.block_size)


def _build_bits() -> dict[str, Fraction]:
    """Every registered cache type (:func:`tbq.formats.cache_types`: a dot-product operand format such as q8_1 or
    q8_k stores no cache) with its exact bits. Listing order: the unscaled float types of 16 bits or more (one
    value a block: f32, then f16 and bf16), widest first, then the registry's order."""
    table = {name: _block_bits(FORMATS[name]) for name in cache_types()}
    wide = [n for n, b in table.items() if FORMATS[n].block_size == 1 and b >= 16]
    ordered = {name: table[name] for name in sorted(wide, key=lambda n: -table[n])}  # a stable sort
    ordered.update({name: bits for name, bits in table.items() if name not in ordered})
    return ordered


_BITS: dict[str, Fraction] = _build_bits()

#: Bits per value of every named KV format, block scales included, e.g.
#: ``f32`` 32, ``f16``/``bf16`` 16, ``fp8_e4m3``/``fp8_e5m2`` 8, ``q8_0`` 8.5, ``q4_0`` 4.5,
#: ``nvfp4`` 4.5, ``mxfp4`` 4.25, ``tbq4_0`` 4.125, ``tbq3_0`` 3.125.
KV_FORMAT_BITS: dict[str, float] = {name: float(bits) for name, bits in _BITS.items()}

DEFAULT_FORMATS = ("f16", "q8_0", "q4_0", "tbq4_0", "tbq3_0")
DEFAULT_CONTEXTS = ("4K", "8K", "16K", "32K", "64K", "128K", "256K")


#: vLLM keeps this many first and last decoder layers of a dense model in the model's dtype (16 bits) when a
#: TurboQuant preset is the cache type (``kv_cache_dtype_skip_layers``; ``min(2, n_layers // 2)`` each end).
VLLM_BOUNDARY_LAYERS = 2
#: The head_dim a preset's slot is sized at when no geometry is given (vLLM's tests and vectors use 128).
PRESET_HEAD_DIM = 128


def format_bits(fmt: Any, geometry: dict[str, int] | None = None) -> tuple[str, Fraction]:
    """(display name, exact bits per value) of a format name, FormatInfo, ``"K:V"`` pair, vLLM preset or number of bits.

    ``geometry`` (``n_layers``, ``head_dim``) makes the cost the cache's own where it depends on the shape: a
    ``"K:V"`` pair costs the mean of its sides (K and V hold as many values); a format whose engine pads heads
    (turbo2/3/4) stores ``stored_head_dim`` values per head; a vLLM preset (``turboquant_4bit_nc``, ...) stores
    one slot per token and KV head of ``S_al`` bytes (:func:`tbq.vllm_slots.slot_bytes`, the slot rounded up to
    an even size) for K and V together, at the geometry's head_dim (else :data:`PRESET_HEAD_DIM`), and with
    ``n_layers`` its boundary layers (:data:`VLLM_BOUNDARY_LAYERS` each end) at 16 bits.

    >>> format_bits("q8_0:turbo3")
    ('q8_0:turbo3', Fraction(93, 16))
    >>> format_bits("turboquant_4bit_nc")  # 134 bytes per (token, head) for 2 x 128 values
    ('turboquant_4bit_nc', Fraction(67, 16))
    >>> float(format_bits("turboquant_4bit_nc", {"n_layers": 32, "head_dim": 128})[1])  # 28 layers + 4 at 16 bits
    5.6640625
    >>> float(format_bits("turbo3", {"n_layers": 32, "head_dim": 64})[1])  # 64 values padded to one 128-value block
    6.25
    """
    if isinstance(fmt, str) and ":" in fmt:
        k, _, v = fmt.partition(":")
        if not k.strip() or not v.strip() or ":" in v:
            raise ConfigError(f"a K:V cache type is two formats joined by one ':', got {fmt!r}")
        (kn, kb), (vn, vb) = format_bits(k, geometry), format_bits(v, geometry)
        return (kn if kn == vn else f"{kn}:{vn}"), (kb + vb) / 2
    if isinstance(fmt, str) and fmt.strip().lower() in PRESET_NAMES:
        return _preset_bits(fmt.strip().lower(), geometry or {})
    name, bits = _plain_format_bits(fmt)
    info = FORMATS.get(name)
    head_dim = (geometry or {}).get("head_dim")
    if info is not None and head_dim is not None:
        bits = bits * info.stored_head_dim(head_dim) / head_dim
    return name, bits


def _preset_bits(name: str, geometry: dict[str, int]) -> tuple[str, Fraction]:
    head_dim = geometry.get("head_dim", PRESET_HEAD_DIM)
    _, s_al = slot_bytes(name, head_dim)
    bits = Fraction(8 * s_al, 2 * head_dim)
    layers = geometry.get("n_layers")
    if layers is not None:
        skip = 2 * min(VLLM_BOUNDARY_LAYERS, layers // 2)
        bits = ((layers - skip) * bits + skip * 16) / layers
    return name, bits


def _plain_format_bits(fmt: Any) -> tuple[str, Fraction]:
    """(display name, exact bits per value) of a format name, FormatInfo or number of bits."""
    if isinstance(fmt, bool):
        raise TbqTypeError(f"a format must be a name or a number of bits per value, not {fmt!r}")
    if isinstance(fmt, FormatInfo):
        return fmt.name, _block_bits(fmt)
    if isinstance(fmt, str):
        key = fmt.strip().lower()
        key = _ALIASES.get(key, key)
        if key in _BITS:
            return key, _BITS[key]
        try:
            bits = Fraction(key.replace("_", ""))
        except (ValueError, ZeroDivisionError):
            raise ConfigError(
                f"unknown KV format {fmt!r}; known formats: {', '.join(_BITS)}; "
                "or give the bits per value as a number, e.g. 5.5"
            ) from None
    elif isinstance(fmt, (numbers.Rational, float)):
        bits = _exact(fmt, "bits per value")
    else:
        raise TbqTypeError(f"a format must be a name or a number of bits per value, not {type(fmt).__name__}")
    if not 0 < bits <= 64:
        raise TbqValueError(f"bits per value must be in (0, 64], got {float(bits):g} (from {fmt!r})")
    return f"{float(bits):g}-bit", bits


def bits_per_value(fmt: Any) -> float:
    """Storage bits per cached value of ``fmt`` (a name, a FormatInfo, or a number of bits).

    >>> bits_per_value("tbq4_0"), bits_per_value("nvfp4"), bits_per_value("mxfp4"), bits_per_value(6)
    (4.125, 4.5, 4.25, 6.0)
    """
    return float(format_bits(fmt)[1])


def format_block_size(fmt: Any) -> int | None:
    """Values per block of a format (from :func:`tbq.format_info`; ``None`` for plain bit counts, pairs and presets).

    ggml's NVFP4 block is 64 values (four 16-value sub-blocks with their own
    scales), so a head must be a multiple of 64 values.

    >>> format_block_size("q8_0"), format_block_size("tbq3_0"), format_block_size("nvfp4"), format_block_size("f32")
    (32, 128, 64, 1)
    """
    if isinstance(fmt, str) and (":" in fmt or fmt.strip().lower() in PRESET_NAMES):
        return None  # a K:V pair or a vLLM preset: two formats
    name, _ = _plain_format_bits(fmt)
    if name in FORMATS:
        return format_info(name).block_size
    return None


def incompatible_formats(head_dim: int, formats: Any, n_kv_heads: int | None = None) -> list[tuple[str, int]]:
    """``(format, block size)`` of each format in ``formats`` whose blocks cannot tile the cache's rows.

    llama.cpp quantizes each token's row of ``n_kv_heads x head_dim`` values
    in blocks along the row. For ggml's types it requires the block size to
    divide ``head_dim`` (a block never spans two heads); the fork's TBQ types
    (``FormatInfo.row_tiled``) need it to divide only the row, so at head_dim
    64 one 128-value TBQ block holds two heads. Without ``n_kv_heads`` every
    format is held to the head rule. For the formats listed a bytes-per-value
    budget describes a cache that cannot exist.

    >>> incompatible_formats(100, "f16,q8_0,tbq4_0")
    [('q8_0', 32), ('tbq4_0', 128)]
    >>> incompatible_formats(96, "q8_0,q4_0,mxfp4,nvfp4,tbq3_0")
    [('nvfp4', 64), ('tbq3_0', 128)]
    >>> incompatible_formats(64, "q8_0,tbq4_0", n_kv_heads=8), incompatible_formats(64, "tbq4_0", n_kv_heads=1)
    ([], [('tbq4_0', 128)])
    """
    head_dim = _count(head_dim, "head_dim")
    heads = None if n_kv_heads is None else _count(n_kv_heads, "n_kv_heads")
    out: list[tuple[str, int]] = []
    for entry, _ in _parse_formats(formats):
        for name in entry.split(":"):  # each side of a K:V pair; a vLLM preset checks its head_dim itself
            size = format_block_size(name) if not name.endswith("-bit") else None
            info = FORMATS.get(name)
            if size is None or info is None or info.padded_heads:  # turbo's engine pads a head to whole blocks
                continue
            fits = info.tiles(heads, head_dim) if heads is not None else head_dim % size == 0
            if not fits and (name, size) not in out:
                out.append((name, size))
    return out


def _count(x: Any, what: str) -> int:
    """A positive integer count (layers, heads, sequences)."""
    if isinstance(x, bool):
        raise TbqTypeError(f"{what} must be an integer, got {x!r}")
    try:
        n = operator.index(x)
    except TypeError:
        raise TbqTypeError(f"{what} must be an integer, got {x!r}") from None
    if n < 1:
        raise TbqValueError(f"{what} must be at least 1, got {n}")
    if n > MAX_QUANTITY:
        raise TbqValueError(f"{what} {n:.3g} is too large: at most 10^30 is taken")
    return n


def _parse_formats(formats: Any, geometry: dict[str, int] | None = None) -> list[tuple[str, Fraction]]:
    if isinstance(formats, str):
        items = formats.split(",")
    else:
        items = list(formats) if isinstance(formats, Iterable) else [formats]
    out: list[tuple[str, Fraction]] = []
    for item in items:
        if isinstance(item, str) and not item.strip():
            raise TbqValueError(f"empty entry in the format list {formats!r}")
        pair = format_bits(item, geometry)
        if pair[0] not in [n for n, _ in out]:
            out.append(pair)
    if not out:
        raise TbqValueError("no formats given")
    return out
