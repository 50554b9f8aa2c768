"""Input families of the golden sets, their seeds, and the TBQ tables the edge rows are built with.

Every format encodes the same rows of :data:`ROW_SIZE` (128) values. Family
``f`` (index ``i`` in :data:`FAMILIES`, whichever subset is requested) draws
from ``numpy.random.default_rng(seed * 1000 + 1 + i)``; the attention data
(:func:`attention_inputs`) from ``default_rng(seed * 1000 + 100)``.

>>> x = make_inputs(2, 0, ["gaussian", "edge"])
>>> x["x"].shape, x["family"].tolist(), x["kind"].tolist()
((4, 128), [0, 0, 1, 1], [255, 255, 0, 1])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..codebooks import Codebook, get_codebook
from ..errors import ConfigError, TbqValueError, check_int
from ..formats import FORMATS, get_format
from ..formats.base import FORMAT_CLASSES
from ..rotation import RandomizedHadamard, get_rotation

ROW_SIZE = 128

#: Input families, in the order that fixes their index (and so their derived seed).
FAMILIES = ("gaussian", "outliers", "heavy_tail", "edge")

FAMILY_GENERATORS = {
    "gaussian": "rng.standard_normal((n, 128), dtype=float32)",
    "outliers": "rng.standard_normal((n, 128), dtype=float32); columns 5, 37, 64, 111 multiplied by float32(25)",
    "heavy_tail": "rng.standard_t(3, size=(n, 128)) (float64) cast to float32",
    "edge": "hand-built edge cases; row r has kind EDGE_KINDS[r % len(EDGE_KINDS)]; random parameters drawn from rng in row order",
}

OUTLIER_CHANNELS = (5, 37, 64, 111)
OUTLIER_FACTOR = 25.0

#: Edge-case kinds of the ``edge`` family (row ``r`` has kind ``r % len(EDGE_KINDS)``).
EDGE_KINDS = (
    "zero",  # every value +0
    "neg_zero",  # every value -0 (the headers must write -0x0p+0f)
    "const_0.5",
    "const_-0.5",
    "one_hot",  # one value of magnitude 1, 0.5, 2.75, 100 or 0.003
    "two_hot_equal",  # v and +-v: half of the rotated coordinates are exactly 0
    "q4_ties",  # per 32 values: (k + 0.5) * 2^e and one +-8 * 2^e: x*id lands on half-integers
    "q8_ties",  # per 32 values: (k + 0.5) * 2^e and one +-127 * 2^e
    "maxabs_sign_tie",  # +a and -a with the largest magnitude: Q4_0 takes the first
    "fp16_tie_q4",  # the Q4_0 scale is exactly halfway between two fp16 numbers
    "fp16_tie_q8",  # the Q8_0 scale is exactly halfway between two fp16 numbers
    "fp16_tie_tbq4",  # a Gaussian row scaled so the TBQ4_0 scale lands (almost) on an fp16 midpoint
    "tiny_1e-6",  # Gaussian x 1e-6: fp16 subnormal Q8_0/Q4_0 scales
    "tiny_1e-9",  # Gaussian x 1e-9: Q8_0/Q4_0 scales round to fp16 zero
    "large_x1000",  # Gaussian x 1000 (TBQ scale ~ 11000, still finite in fp16)
    "rotated_one_hot",  # c * R^-1(e_k): the rotation gives an exact one-hot vector
    "tbq4_thresholds",  # rotated coordinates placed on the 4-bit decision thresholds
    "tbq3_thresholds",  # rotated coordinates placed on the 3-bit decision thresholds
)

#: Default rows per family: every edge kind appears once.
DEFAULT_BLOCKS = len(EDGE_KINDS)
#: The documented name of :data:`DEFAULT_BLOCKS` (rows of 128 values per family).
DEFAULT_ROWS_PER_FAMILY = DEFAULT_BLOCKS
DEFAULT_SEED = 0

#: Attention keys: channels :data:`OUTLIER_CHANNELS` are multiplied by this factor.
ATTENTION_KEY_OUTLIER_FACTOR = 8.0


# ---------------------------------------------------------------------------
# seeds and argument checks
# ---------------------------------------------------------------------------


def _check_seed(seed: Any) -> int:
    return check_int(seed, "seed", lo=0, expected="a non-negative integer", error=TbqValueError)


def family_seed(seed: int, family: str) -> int:
    """The seed of one family: ``seed * 1000 + 1 + FAMILIES.index(family)``.

    >>> family_seed(7, "edge")
    7004
    """
    if family not in FAMILIES:
        raise ConfigError(f"unknown family {family!r}; known families: {', '.join(FAMILIES)}")
    return _check_seed(seed) * 1000 + 1 + FAMILIES.index(family)


def attention_seed(seed: int) -> int:
    """The seed of the attention data: ``seed * 1000 + 100``."""
    return _check_seed(seed) * 1000 + 100


def _names(value: Any, what: str) -> tuple[Any, ...]:
    """A list setting (``families``, ``formats``): a comma-separated string or any iterable, as a tuple of at least
    one entry."""
    if isinstance(value, str):
        value = [f for f in value.split(",") if f]
    names = tuple(value)
    if not names:
        raise ConfigError(f"at least one {what} is needed")
    return names


def _check_families(families: Any) -> tuple[str, ...]:
    fams = _names(families, "family")
    for f in fams:
        if f not in FAMILIES:
            raise ConfigError(f"unknown family {f!r}; known families: {', '.join(FAMILIES)}")
    if len(set(fams)) != len(fams):
        raise ConfigError(f"a family is listed twice: {', '.join(fams)}")
    return fams


def _check_blocks(blocks: Any) -> int:
    return check_int(
        blocks,
        "rows per family (rows of 128 values; --rows-per-family)",
        lo=1,
        expected="a positive integer",
        error=TbqValueError,
    )


def _rows_per_family(rows_per_family: Any = None, blocks: Any = None) -> int:
    """``rows_per_family`` or its old name ``blocks`` (default :data:`DEFAULT_ROWS_PER_FAMILY`), checked."""
    if rows_per_family is not None and blocks is not None and rows_per_family != blocks:
        raise TbqValueError(
            f"rows_per_family ({rows_per_family!r}) and its old name blocks ({blocks!r}) disagree; give one"
        )
    n = rows_per_family if rows_per_family is not None else blocks
    return _check_blocks(DEFAULT_ROWS_PER_FAMILY if n is None else n)


# ---------------------------------------------------------------------------
# tables (codebooks and sign vectors)
# ---------------------------------------------------------------------------

#: Formats that take a ``codebook`` option, with their index bits (from the registry: tbq4_0, tbq3_0).
_TBQ_BITS = {name: FORMATS[name].index_bits for name, cls in FORMAT_CLASSES.items() if "codebook" in cls.options}


@dataclass(frozen=True)
class _Tables:
    codebooks: dict[str, Any]  # "tbq4_0" / "tbq3_0" -> Codebook
    rotation: RandomizedHadamard


def _resolve_tables(codebook: Any = "lloyd-max", signs: Any = "turboq-mtp") -> _Tables:
    """Codebooks for both TBQ formats and the rotation from the user's specs.

    ``codebook``: a name (both widths), a :class:`Codebook` or a
    ``{"centroids", "thresholds"}`` dict (the width it fits; the other width
    gets ``lloyd-max``), or a dict keyed by ``"tbq4_0"`` / ``"tbq3_0"``.
    """
    per = {}
    if isinstance(codebook, dict) and set(codebook) <= set(_TBQ_BITS) and codebook:
        per = dict(codebook)
    elif isinstance(codebook, (Codebook, dict)):
        c = codebook.centroids if isinstance(codebook, Codebook) else codebook.get("centroids", [])
        n = len(c)
        fmt = {1 << bits: name for name, bits in _TBQ_BITS.items()}.get(n)
        if fmt is None:
            need = " or ".join(f"{1 << b} ({f})" for f, b in _TBQ_BITS.items())
            raise ConfigError(f"a codebook for the golden set needs {need} centroids, got {n}")
        per = {fmt: codebook}
    elif isinstance(codebook, str):
        per = {f: codebook for f in _TBQ_BITS}
    else:
        raise ConfigError(f"codebook must be a name, a Codebook, or a dict, got {type(codebook).__name__}")
    cbs = {f: get_codebook(per.get(f, "lloyd-max"), bits) for f, bits in _TBQ_BITS.items()}
    return _Tables(cbs, get_rotation(signs, ROW_SIZE))


def _tables(codebook: Any, signs: Any) -> _Tables:
    """``codebook`` if it already is resolved :class:`_Tables`, else :func:`_resolve_tables`."""
    return codebook if isinstance(codebook, _Tables) else _resolve_tables(codebook, signs)


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------


def _scale(fmt: str, x: np.ndarray, tables: _Tables) -> np.float32:
    """The float32 scale ``d`` of one row ``x`` in ``fmt`` with the golden tables (the format's trace)."""
    f = get_format(fmt, codebook=tables.codebooks[fmt], signs=tables.rotation)
    with np.errstate(all="ignore"):
        return f.reference_encode(np.ascontiguousarray(x[None, :], np.float32))[1]["d"][0]


def _fp16_midpoint_near(d: float) -> float:
    h = np.float16(d)
    up = np.nextafter(h, np.float16(np.inf))
    return (float(h) + float(up)) / 2.0  # 12 significant bits: exact in float32


def _threshold_row(rng: Any, cb: Codebook, rot: RandomizedHadamard) -> np.ndarray:
    """A row whose rotated coordinates sit on the codebook's thresholds (unit norm target)."""
    m = cb.thresholds.astype(np.float64)
    pos = rng.permutation(ROW_SIZE)
    order = rng.permutation(m.size)
    r = np.zeros(ROW_SIZE)
    budget = 1.0 - 0.35**2  # keep room for a filler coordinate far above every threshold
    s = 0.0
    for n, p in enumerate(pos[:-1]):
        v = m[order[n % m.size]]
        if s + v * v <= budget:
            r[p] = v
            s += v * v
    r[pos[-1]] = math.sqrt(1.0 - s)
    x = rot.inverse(r) * rng.uniform(0.5, 4.0)
    return x.astype(np.float32)


def _edge_row(kind: str, rng: np.random.Generator, tables: _Tables) -> np.ndarray:
    f32 = np.float32
    n = ROW_SIZE
    if kind == "zero":
        return np.zeros(n, f32)
    if kind == "neg_zero":
        return np.full(n, -0.0, f32)
    if kind == "const_0.5":
        return np.full(n, 0.5, f32)
    if kind == "const_-0.5":
        return np.full(n, -0.5, f32)
    if kind == "one_hot":
        x = np.zeros(n, f32)
        x[rng.integers(n)] = rng.choice([1.0, 0.5, 2.75, 100.0, 0.003]) * rng.choice([-1.0, 1.0])
        return x
    if kind == "two_hot_equal":
        x = np.zeros(n, f32)
        i, j = rng.choice(n, 2, replace=False)
        v = rng.choice([0.25, 1.0, 7.0])
        x[i], x[j] = v, v * rng.choice([-1.0, 1.0])
        return x
    if kind in ("q4_ties", "q8_ties"):
        top, lo, hi = (8, -8, 8) if kind == "q4_ties" else (127, -127, 127)
        x = np.empty(n, f32)
        for b in range(0, n, 32):
            s = 2.0 ** int(rng.integers(-6, 3))
            vals = (rng.integers(lo, hi, 32) + 0.5) * s
            vals[rng.integers(32)] = rng.choice([-top, top]) * s
            x[b : b + 32] = vals
        return x
    if kind == "maxabs_sign_tie":
        x = rng.standard_normal(n, dtype=f32)
        for b in range(0, n, 32):
            a = f32(1.5) * np.max(np.abs(x[b : b + 32]))
            i, j = rng.choice(32, 2, replace=False)
            x[b + i], x[b + j] = a, -a
        return x
    if kind in ("fp16_tie_q4", "fp16_tie_q8"):
        top_f = 8.0 if kind == "fp16_tie_q4" else 127.0
        x = np.empty(n, f32)
        for b in range(0, n, 32):
            e = int(rng.integers(-10, 5))
            mant = int(rng.integers(0, 1023))
            t = (1.0 + (mant + 0.5) / 1024.0) * 2.0**e  # halfway between two normal fp16 numbers
            vals = rng.uniform(-0.9, 0.9, 32) * top_f * t
            vals[rng.integers(32)] = rng.choice([-1.0, 1.0]) * top_f * t
            x[b : b + 32] = vals.astype(f32)
        return x
    if kind == "fp16_tie_tbq4":
        g = rng.standard_normal(n, dtype=f32).astype(np.float64)
        mid = _fp16_midpoint_near(float(_scale("tbq4_0", g.astype(f32), tables)))
        best, best_dist, c = g.astype(f32), math.inf, 1.0
        for _ in range(16):
            y = (g * c).astype(f32)
            d = float(_scale("tbq4_0", y, tables))
            dist = abs(d - mid)
            if dist < best_dist:
                best, best_dist = y, dist
            if d == mid:
                break
            c *= mid / d
        return best
    if kind in ("tiny_1e-6", "tiny_1e-9", "large_x1000"):
        factor = {"tiny_1e-6": 1e-6, "tiny_1e-9": 1e-9, "large_x1000": 1000.0}[kind]
        return rng.standard_normal(n, dtype=f32) * f32(factor)
    if kind == "rotated_one_hot":
        one_hot = np.zeros(n)
        one_hot[rng.integers(n)] = 1.0
        return (tables.rotation.inverse(one_hot) * rng.choice([1.0, -1.0, 3.0])).astype(f32)
    if kind == "tbq4_thresholds":
        return _threshold_row(rng, tables.codebooks["tbq4_0"], tables.rotation)
    if kind == "tbq3_thresholds":
        return _threshold_row(rng, tables.codebooks["tbq3_0"], tables.rotation)
    raise AssertionError(kind)  # pragma: no cover


def _family_rows(family: str, n: int, rng: np.random.Generator, tables: _Tables) -> Any:
    kinds = np.full(n, 255, np.uint8)
    if family == "gaussian":
        x = rng.standard_normal((n, ROW_SIZE), dtype=np.float32)
    elif family == "outliers":
        x = rng.standard_normal((n, ROW_SIZE), dtype=np.float32)
        x[:, list(OUTLIER_CHANNELS)] *= np.float32(OUTLIER_FACTOR)
    elif family == "heavy_tail":
        x = rng.standard_t(3, size=(n, ROW_SIZE)).astype(np.float32)
    elif family == "edge":
        x = np.empty((n, ROW_SIZE), np.float32)
        for r in range(n):
            kinds[r] = r % len(EDGE_KINDS)
            x[r] = _edge_row(EDGE_KINDS[kinds[r]], rng, tables)
    else:  # pragma: no cover - validated by the callers
        raise ConfigError(f"unknown family {family!r}")
    return x, kinds


def make_inputs(
    rows_per_family: int | None = None,
    seed: int = DEFAULT_SEED,
    families: Any = FAMILIES,
    *,
    codebook: Any = "lloyd-max",
    signs: Any = "turboq-mtp",
    blocks: int | None = None,
) -> dict[str, Any]:
    """The input rows shared by every format.

    Returns ``{"x": float32 (rows, 128), "family": uint8 (rows,), "kind":
    uint8 (rows,), "families": [manifest entries]}``. ``rows_per_family``
    rows (old name ``blocks``; default :data:`DEFAULT_ROWS_PER_FAMILY`) per
    family, families in the order given. The ``edge`` family depends on the
    TBQ tables (``codebook``, ``signs``) through its rotation-aware kinds.
    """
    blocks = _rows_per_family(rows_per_family, blocks)
    seed = _check_seed(seed)
    fams = _check_families(families)
    tables = _tables(codebook, signs)
    xs, fam_idx, kinds, info = [], [], [], []
    for i, fam in enumerate(fams):
        fseed = family_seed(seed, fam)
        x, k = _family_rows(fam, blocks, np.random.default_rng(fseed), tables)
        xs.append(x)
        kinds.append(k)
        fam_idx.append(np.full(blocks, i, np.uint8))
        info.append(
            {
                "name": fam,
                "index": i,
                "seed": fseed,
                "seed_derivation": f"seed * 1000 + 1 + {FAMILIES.index(fam)} (position of '{fam}' in {list(FAMILIES)})",
                "rows": [i * blocks, (i + 1) * blocks],
                "generator": FAMILY_GENERATORS[fam],
            }
        )
    x = np.concatenate(xs)
    if not np.isfinite(x).all():  # pragma: no cover - by construction
        raise AssertionError("golden inputs must be finite")
    return {"x": x, "family": np.concatenate(fam_idx), "kind": np.concatenate(kinds), "families": info}


def attention_inputs(seed: int, tokens: int, n_head: int, n_head_kv: int) -> tuple[Any, ...]:
    """The attention data ``(q, k, v)`` of :func:`tbq.golden.build_attention`, all float32.

    From ``default_rng(seed * 1000 + 100)``: ``q`` standard normal ``(n_head,
    128)``, then K standard normal ``(tokens, n_head_kv, 128)`` with channels
    :data:`OUTLIER_CHANNELS` multiplied by :data:`ATTENTION_KEY_OUTLIER_FACTOR`,
    then V standard normal of the same shape.
    """
    rng = np.random.default_rng(attention_seed(seed))
    dim = ROW_SIZE
    q = rng.standard_normal((n_head, dim), dtype=np.float32)
    k = rng.standard_normal((tokens, n_head_kv, dim), dtype=np.float32)
    k[..., list(OUTLIER_CHANNELS)] *= np.float32(ATTENTION_KEY_OUTLIER_FACTOR)
    v = rng.standard_normal((tokens, n_head_kv, dim), dtype=np.float32)
    return q, k, v
