"""The inputs of a check's bulk phases: golden rows for the golden phase, arbitrary encoded blocks for the
decoders' bytes phase (deterministic in the seed, as ``tbq golden --seed``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..formats import Format
from ..formats.base import FIELD_KINDS
from ..golden.families import EDGE_KINDS, ROW_SIZE, make_inputs

__all__ = ["golden_rows", "random_blocks", "row_len", "EDGE_REPEATS", "SPECIAL_F16", "SPECIAL_BF16"]

#: At most this many rows of each edge kind (they are built one at a time; about 0.4 ms a row).
EDGE_REPEATS = 32

#: fp16 (and bfloat16) bit-pattern ranges the bytes phase writes into scale fields, inclusive.
#: The special fp16 / bf16 patterns (the field kinds' own lists, :data:`tbq.formats.base.FIELD_KINDS`).
SPECIAL_F16 = FIELD_KINDS["f16"].specials
SPECIAL_BF16 = FIELD_KINDS["bf16"].specials


def row_len(fmt: Format) -> int:
    """Values per input row of ``fmt``: a golden row of 128, or whole blocks of a block that does not divide it."""
    bs = fmt.block_size
    return ROW_SIZE if ROW_SIZE % bs == 0 else bs * -(-ROW_SIZE // bs)


def _table_kw(fmt: Format) -> dict[str, Any]:
    """The golden tables (codebook, signs) the edge rows are built with: the format's own where it has them."""
    cfg = fmt.config()
    return {key: cfg[key] for key in ("codebook", "signs") if key in cfg}


def golden_rows(fmt: Format, blocks: int, seed: int = 0) -> NDArray[np.float32]:
    """float32 rows of 128 values holding about ``blocks`` blocks of ``fmt`` from the golden families.

    Every edge kind of :data:`tbq.golden.EDGE_KINDS` at least once (about a
    tenth of the rows, at most :data:`EDGE_REPEATS` of each), the rest split over the Gaussian, outlier and
    heavy-tailed families; the same seeds as ``tbq golden --seed``.

    >>> golden_rows(__import__("tbq").get_format("q4_0"), 400).shape
    (100, 128)
    """
    per_row = row_len(fmt) // fmt.block_size
    n_rows = max(1, -(-blocks // per_row))
    reps = max(1, min(EDGE_REPEATS, round(n_rows * 0.1 / len(EDGE_KINDS))))
    edge_rows = len(EDGE_KINDS) * reps
    rest = max(0, n_rows - edge_rows)
    kw = _table_kw(fmt)
    parts = [make_inputs(edge_rows, seed, ("edge",), **kw)["x"]]
    if rest:
        parts.append(make_inputs(-(-rest // 3), seed, ("gaussian", "outliers", "heavy_tail"), **kw)["x"])
    x = np.concatenate(parts)
    if row_len(fmt) != ROW_SIZE:  # a block longer than a golden row, or one that does not divide it
        flat = x.reshape(-1)
        x = flat[: flat.size // row_len(fmt) * row_len(fmt)].reshape(-1, row_len(fmt))
    return np.ascontiguousarray(x[:n_rows], np.float32)


def random_blocks(fmt: Format, blocks: int, seed: int = 0) -> NDArray[np.uint8]:
    """uint8 rows of arbitrary encoded blocks: random bytes and patterns, most scale fields special values.

    Every field whose kind has special 16-bit patterns (``f16``: :data:`SPECIAL_F16`,
    ``bf16``: ``SPECIAL_BF16``) gets, in two blocks of three, one of them in turn.

    >>> random_blocks(__import__("tbq").get_format("q8_0"), 8).shape
    (2, 136)
    """
    ts = fmt.type_size
    per_row = row_len(fmt) // fmt.block_size
    n_rows = max(1, -(-blocks // per_row))
    n = n_rows * per_row
    rng = np.random.default_rng(seed * 1000 + 77)
    data = rng.integers(0, 256, (n, ts), dtype=np.uint8)
    for i, byte in enumerate((0x00, 0xFF, 0x0F, 0xF0, 0x55, 0xAA, 0x88, 0x77)):
        if 8 * i < n:
            data[8 * i] = byte
    for f in fmt.info.layout:
        table = FIELD_KINDS[f.kind].specials if f.kind in FIELD_KINDS else None
        if not table or f.size % 2:
            continue
        kinds = list(table.values())
        for off in range(f.offset, f.offset + f.size, 2):
            pick = np.flatnonzero(np.arange(n) % 3 != 2)
            which = (pick // 3 * 2 + pick % 3 + off) % len(kinds)
            lo = np.array([kinds[w][0] for w in which])
            hi = np.array([kinds[w][1] for w in which])
            bits = (lo + rng.integers(0, 1 << 16, pick.size) % (hi - lo + 1)).astype("<u2")
            data[pick, off : off + 2] = bits.view(np.uint8).reshape(-1, 2)
    return data.reshape(n_rows, per_row * ts)
