"""``tbq golden``: golden test vectors for quantization and attention kernels.

Kernel authors (CPU SIMD, CUDA, Metal, Vulkan) get, per format, the inputs, the
exact bytes a correct quantizer writes, the exact floats a correct dequantizer
returns, and *fragility masks* marking the few places where a kernel with
another reduction order cannot be expected to be bit-exact. With
``attention=True`` it also writes reference outputs of a fused attention
kernel over quantized K/V caches (:mod:`tbq.attention`).

For each format ``<fmt>`` the output directory receives

- ``<fmt>.npz``: the arrays (see :data:`FORMAT_ARRAYS`), indexed by block;
- ``<fmt>.json``: the manifest: format, exact codec configuration (codebook
  and sign tables as exact values), families and their derived seeds, block
  counts, fragility parameters, library version and the SHA-256 of every
  array; :func:`regenerate` rebuilds the same arrays bit for bit from it;
- ``<fmt>.h``: a self-contained C/C++ header with ``#define``\\ s and
  ``static const`` arrays (exact hex-float literals).

Inputs are rows of 128 values for every format (so a Q8_0/Q4_0 row is 4
blocks of 32, a TBQ row 1 block of 128) and every format encodes the *same*
rows. ``blocks`` (CLI ``--blocks``) is the number of 128-value rows per
family; a format's block count is ``rows * 128 / block_size``.

Family ``f`` (index ``i`` in :data:`FAMILIES`, whichever subset is requested)
draws from ``numpy.random.default_rng(seed * 1000 + 1 + i)`` (PCG64); the
attention data from ``default_rng(seed * 1000 + 100)``. See
``docs/golden-vectors.md`` for how a kernel test uses the files.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     s = generate(d, formats=["q4_0"], families=["gaussian"], blocks=2)
...     sorted(p.name for p in __import__("pathlib").Path(d).iterdir())
['q4_0.h', 'q4_0.json', 'q4_0.npz']
>>> s.rows[0]["format"], s.rows[0]["blocks"]
('q4_0', 8)
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import __version__, reference
from .codebooks import Codebook, get_codebook
from .codecs import Codec, get_codec
from .errors import ConfigError, TbqValueError
from .formats import FORMATS, format_info, formats
from .packing import unpack3, unpack4_halves, unpack4_pairs
from .rotation import RandomizedHadamard, get_rotation

__all__ = [
    "FAMILIES",
    "EDGE_KINDS",
    "FORMAT_ARRAYS",
    "DEFAULT_BLOCKS",
    "DEFAULT_K",
    "TBQ_ULP_FLOOR",
    "GoldenSet",
    "Summary",
    "family_seed",
    "attention_seed",
    "make_inputs",
    "rotated_coordinates",
    "fragility",
    "build_format",
    "build_attention",
    "c_header",
    "hex_literal",
    "sha256_array",
    "write_set",
    "generate",
    "regenerate",
    "verify",
]

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
DEFAULT_SEED = 0
#: Default fragility margin in float32 ulps.
DEFAULT_K = 4
#: Below this magnitude a TBQ rotated coordinate's ulp is taken as that of the
#: floor (2^-4: ulp = 2^-27 ~ 7.5e-9). A rotated coordinate is computed from
#: partial sums of magnitude ~1/sqrt(128), so its rounding error is a few ulps
#: of *that*, not of the (possibly tiny) coordinate; without the floor the
#: mask would be blind at the threshold 0. 0 gives the literal ulp distance.
TBQ_ULP_FLOOR = 2.0**-4

DEFAULT_ATTENTION_PAIRS = (("tbq4_0", "tbq4_0"), ("q8_0", "tbq4_0"))
ATTENTION_KEY_OUTLIER_FACTOR = 8.0

#: Arrays of ``<fmt>.npz`` (all formats) and their meaning.
FORMAT_ARRAYS = {
    "input": "float32 (blocks, block_size): the values to quantize",
    "bytes": "uint8 (blocks, type_size): what a correct quantizer writes",
    "decoded": "float32 (blocks, block_size): what a correct dequantizer returns for `bytes`",
    "fragile": "uint8 (blocks, block_size): 1 where the value's code may legitimately differ by one",
    "scale_fragile": "uint8 (blocks,): 1 where the fp16 scale may legitimately be the neighbouring fp16 value",
    "scale_f32": "float32 (blocks,): the float32 scale d before rounding to fp16",
    "family": "uint8 (blocks,): index into the manifest's families",
    "kind": "uint8 (blocks,): index into edge_kinds for the edge family, 255 otherwise",
}
TBQ_ARRAYS = {
    "norm": "float32 (blocks,): the float32 norm of step 1 (TBQ3_0: after the 1e-10 clamp)",
    "centroids": "float32 (2^bits,): codebook centroids",
    "thresholds": "float32 (2^bits - 1,): codebook decision thresholds",
    "signs1": "int8 (128,): first sign vector of the rotation",
    "signs2": "int8 (128,): second sign vector of the rotation",
}


# ---------------------------------------------------------------------------
# seeds, literals, hashes
# ---------------------------------------------------------------------------


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise TbqValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


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


def hex_literal(v: float, suffix: str = "f") -> str:
    """Exact C99 hex-float literal of a finite float (``suffix`` ``"f"`` for float, ``""`` for double).

    >>> hex_literal(3.0), hex_literal(-0.0), hex_literal(0.1, "")
    ('0x1.8p+1f', '-0x0p+0f', '0x1.999999999999ap-4')
    """
    v = float(v)
    if not math.isfinite(v):
        raise TbqValueError(f"{v!r} cannot be written as a C literal (golden data must be finite)")
    if v == 0.0:
        return ("-" if math.copysign(1.0, v) < 0 else "") + "0x0p+0" + suffix
    s = v.hex()
    sign = "-" if s.startswith("-") else ""
    mant, exp = s.lstrip("-")[2:].split("p")
    if "." in mant:
        ip, fp = mant.split(".")
        fp = fp.rstrip("0")
        mant = ip + ("." + fp if fp else "")
    return f"{sign}0x{mant}p{exp}{suffix}"


def sha256_array(a: np.ndarray) -> str:
    """SHA-256 of an array's bytes in C order (little-endian dtypes as stored)."""
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _le(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.astype(a.dtype.newbyteorder("<"), copy=False)


# ---------------------------------------------------------------------------
# tables (codebooks and sign vectors)
# ---------------------------------------------------------------------------

_TBQ_BITS = {"tbq4_0": 4, "tbq3_0": 3}


@dataclass(frozen=True)
class _Tables:
    codebooks: dict  # "tbq4_0" / "tbq3_0" -> Codebook
    rotation: RandomizedHadamard


def _resolve_tables(codebook="lloyd-max", signs="turboq-mtp") -> _Tables:
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
        fmt = {16: "tbq4_0", 8: "tbq3_0"}.get(n)
        if fmt is None:
            raise ConfigError(f"a codebook for the golden set needs 16 (tbq4_0) or 8 (tbq3_0) centroids, got {n}")
        per = {fmt: codebook}
    elif isinstance(codebook, str):
        per = {f: codebook for f in _TBQ_BITS}
    else:
        raise ConfigError(f"codebook must be a name, a Codebook, or a dict, got {type(codebook).__name__}")
    cbs = {f: get_codebook(per.get(f, "lloyd-max"), bits) for f, bits in _TBQ_BITS.items()}
    return _Tables(cbs, get_rotation(signs, ROW_SIZE))


def _exact_codebook(cb: Codebook) -> dict:
    return {"centroids": [float(v) for v in cb.centroids], "thresholds": [float(v) for v in cb.thresholds]}


def _exact_signs(rot: RandomizedHadamard) -> dict:
    return {"signs1": [int(v) for v in rot.signs1], "signs2": [int(v) for v in rot.signs2]}


def _hex_table(values) -> dict:
    a = np.asarray(values, np.float32)
    return {"hex": [hex_literal(v, "") for v in a], "float32_bits": [f"0x{int(b):08x}" for b in a.view(np.uint32)]}


def _exact_config(fmt: str, tables: _Tables) -> dict:
    """Codec config of ``fmt`` with exact tables (accepted by :func:`tbq.codec_from_config`)."""
    cfg = {"name": fmt, "on_overflow": "raise"}
    if fmt in _TBQ_BITS:
        cfg["codebook"] = _exact_codebook(tables.codebooks[fmt])
        cfg["signs"] = _exact_signs(tables.rotation)
    return cfg


def _codec(fmt: str, tables: _Tables, backend: str | None = "numpy") -> Codec:
    cfg = _exact_config(fmt, tables)
    del cfg["name"]
    return get_codec(fmt, backend=backend, **cfg)


def _named_config(codec: Codec) -> dict:
    cfg = codec.get_config()
    for key in ("backend", "threads"):
        cfg.pop(key, None)
    return cfg


def _edge_tables_json(tables: _Tables) -> dict:
    return {
        "tbq4_0_codebook": _exact_codebook(tables.codebooks["tbq4_0"]),
        "tbq3_0_codebook": _exact_codebook(tables.codebooks["tbq3_0"]),
        "signs": _exact_signs(tables.rotation),
    }


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------


def _tbq_scale(x: np.ndarray, bits: int, cb: Codebook, rot: RandomizedHadamard) -> np.float32:
    with np.errstate(all="ignore"):
        return reference.encode_tbq(np.ascontiguousarray(x[None, :], np.float32), bits, cb, rot)[1][0]


def _fp16_midpoint_near(d: float) -> float:
    h = np.float16(d)
    up = np.nextafter(h, np.float16(np.inf))
    return (float(h) + float(up)) / 2.0  # 12 significant bits: exact in float32


def _threshold_row(rng, cb: Codebook, rot: RandomizedHadamard) -> np.ndarray:
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
        top = 8.0 if kind == "fp16_tie_q4" else 127.0
        x = np.empty(n, f32)
        for b in range(0, n, 32):
            e = int(rng.integers(-10, 5))
            mant = int(rng.integers(0, 1023))
            t = (1.0 + (mant + 0.5) / 1024.0) * 2.0**e  # halfway between two normal fp16 numbers
            vals = rng.uniform(-0.9, 0.9, 32) * top * t
            vals[rng.integers(32)] = rng.choice([-1.0, 1.0]) * top * t
            x[b : b + 32] = vals.astype(f32)
        return x
    if kind == "fp16_tie_tbq4":
        cb, rot = tables.codebooks["tbq4_0"], tables.rotation
        g = rng.standard_normal(n, dtype=f32).astype(np.float64)
        mid = _fp16_midpoint_near(float(_tbq_scale(g.astype(f32), 4, cb, rot)))
        best, best_dist, c = g.astype(f32), math.inf, 1.0
        for _ in range(16):
            y = (g * c).astype(f32)
            d = float(_tbq_scale(y, 4, cb, rot))
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
        e = np.zeros(n)
        e[rng.integers(n)] = 1.0
        return (tables.rotation.inverse(e) * rng.choice([1.0, -1.0, 3.0])).astype(f32)
    if kind == "tbq4_thresholds":
        return _threshold_row(rng, tables.codebooks["tbq4_0"], tables.rotation)
    if kind == "tbq3_thresholds":
        return _threshold_row(rng, tables.codebooks["tbq3_0"], tables.rotation)
    raise AssertionError(kind)  # pragma: no cover


def _family_rows(family: str, n: int, rng: np.random.Generator, tables: _Tables):
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


def _check_families(families) -> tuple[str, ...]:
    if isinstance(families, str):
        families = [f for f in families.split(",") if f]
    fams = tuple(families)
    if not fams:
        raise ConfigError("at least one family is needed")
    for f in fams:
        if f not in FAMILIES:
            raise ConfigError(f"unknown family {f!r}; known families: {', '.join(FAMILIES)}")
    if len(set(fams)) != len(fams):
        raise ConfigError(f"a family is listed twice: {', '.join(fams)}")
    return fams


def _check_blocks(blocks) -> int:
    if isinstance(blocks, bool) or not isinstance(blocks, (int, np.integer)) or blocks < 1:
        raise TbqValueError(f"blocks (rows of 128 values per family) must be a positive integer, got {blocks!r}")
    return int(blocks)


def make_inputs(blocks: int = DEFAULT_BLOCKS, seed: int = DEFAULT_SEED, families=FAMILIES, *, codebook="lloyd-max", signs="turboq-mtp") -> dict:
    """The input rows shared by every format.

    Returns ``{"x": float32 (rows, 128), "family": uint8 (rows,), "kind":
    uint8 (rows,), "families": [manifest entries]}``. ``blocks`` rows per
    family, families in the order given. The ``edge`` family depends on the
    TBQ tables (``codebook``, ``signs``) through its rotation-aware kinds.
    """
    blocks = _check_blocks(blocks)
    seed = _check_seed(seed)
    fams = _check_families(families)
    tables = codebook if isinstance(codebook, _Tables) else _resolve_tables(codebook, signs)
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


# ---------------------------------------------------------------------------
# fragility
# ---------------------------------------------------------------------------


def _ulp32(a: np.ndarray) -> np.ndarray:
    """Spacing of float32 at ``|a|`` (float64 result; a float32 subnormal step at 0)."""
    return np.spacing(np.abs(np.asarray(a, np.float64)).astype(np.float32)).astype(np.float64)


def _band(code, v: np.ndarray, k: int, floor: float = 0.0) -> np.ndarray:
    """True where ``code`` differs between ``v - w`` and ``v + w``, ``w = k * ulp32(max(|v|, floor))``.

    ``code`` must be monotone; it is evaluated exactly in float64. This is "v
    lies within k ulps of a boundary": the code can change under a
    perturbation of at most k ulps (a value exactly on a boundary counts).
    """
    v64 = np.asarray(v, np.float64)
    w = k * _ulp32(np.maximum(np.abs(v64), floor))
    return code(v64 - w) != code(v64 + w)


def _roundf64(y: np.ndarray) -> np.ndarray:
    t = np.trunc(y)
    return t + np.where(np.abs(y - t) >= 0.5, np.sign(y), 0.0)


def _q4_code_t(t: np.ndarray) -> np.ndarray:
    return np.minimum(15.0, np.trunc(t))


def _q4_code_v(v: np.ndarray) -> np.ndarray:
    t = (np.asarray(v, np.float64) + 8.5).astype(np.float32)  # the encoder's second rounding
    return _q4_code_t(t.astype(np.float64))


def rotated_coordinates(codec: Codec, xb: np.ndarray):
    """The TBQ encoder's steps 1-2 on blocks ``xb`` (float32 ``(blocks, 128)``): ``(r, norm)``.

    The same float32 operations as :func:`tbq.reference.encode_tbq` (sequential
    sum of squares, reciprocal or division, the butterfly), so ``r`` is
    bit-identical to the encoder's rotated coordinates.
    """
    norm, r = reference.tbq_rotate(np.ascontiguousarray(xb, np.float32), codec.info.index_bits, codec.rotation)
    return r, norm


def fragility(codec: Codec, xb: np.ndarray, data: np.ndarray, k: int = DEFAULT_K, ulp_floor: float | None = None) -> dict:
    """Fragility masks of blocks ``xb`` (float32 ``(blocks, block_size)``) encoded as ``data``.

    Returns ``{"fragile": uint8 (blocks, block_size), "scale_fragile": uint8
    (blocks,), "scale_f32": float32 (blocks,)}`` plus ``"norm"`` for TBQ.

    Per value, with the encoder's own float32 quantity ``v``:

    - TBQ: ``v = r``, the rotated coordinate; boundaries: the thresholds;
    - Q8_0: ``v = x * id``; boundaries: the half-integers (``roundf``);
    - Q4_0: ``v = x * id`` and ``t = float32(v + 8.5)``; boundaries: the
      integers of ``t`` where ``min(15, trunc(t))`` changes; a value is
      fragile if a k-ulp change of ``v`` *or* of ``t`` can change the code.

    A value is fragile when its code changes somewhere in ``[v - w, v + w]``,
    ``w = k * ulp(max(|v|, floor))`` (float32 ulps; ``floor`` =
    :data:`TBQ_ULP_FLOOR` for TBQ, 0 otherwise). Per block, the float32 scale
    ``d`` is fragile when ``fp16(d - w) != fp16(d + w)`` with ``w = k *
    ulp(d)``: an fp16 rounding boundary (a midpoint) lies within k ulps.

    The codes recomputed from these quantities are checked against the bytes,
    so the masks are guaranteed to describe the encoder's actual arithmetic.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise TbqValueError(f"k (the fragility margin in ulps) must be a non-negative integer, got {k!r}")
    k = int(k)
    xb = np.ascontiguousarray(xb, np.float32)
    data = np.ascontiguousarray(data, np.uint8)
    name = codec.name
    out: dict = {}
    with np.errstate(all="ignore"):
        if codec.info.rotated:
            bits = codec.info.index_bits
            floor = TBQ_ULP_FLOOR if ulp_floor is None else float(ulp_floor)
            r, norm = rotated_coordinates(codec, xb)
            idx = unpack4_pairs(data[:, 2:], backend="numpy") if bits == 4 else unpack3(data[:, 2:], backend="numpy")
            if not np.array_equal(codec.codebook.index(r), idx):
                raise AssertionError(f"{name}: recomputed rotated coordinates do not give the encoded indices")
            thr = codec.codebook.thresholds.astype(np.float64)
            fragile = _band(lambda y: np.searchsorted(thr, y, side="right"), r, k, floor)
            d = reference.encode_tbq(xb, bits, codec.codebook, codec.rotation)[1]
            out["norm"] = norm.astype(np.float32)
        elif name == "q8_0":
            amax = np.max(np.abs(xb), axis=1)
            d = amax / np.float32(127)
            v = xb * reference._safe_reciprocal(d)[:, None]
            if not np.array_equal(reference.roundf(v).astype(np.int8), data[:, 2:].view(np.int8)):
                raise AssertionError("q8_0: recomputed x*id does not give the encoded codes")
            fragile = _band(_roundf64, v, k)
        elif name == "q4_0":
            m = xb[np.arange(xb.shape[0]), np.argmax(np.abs(xb), axis=1)]
            d = m / np.float32(-8)
            v = xb * reference._safe_reciprocal(d)[:, None]
            t = v + np.float32(8.5)
            q = np.minimum(np.trunc(t), np.float32(15)).astype(np.uint8)
            if not np.array_equal(q, unpack4_halves(data[:, 2:], backend="numpy")):
                raise AssertionError("q4_0: recomputed x*id + 8.5 does not give the encoded codes")
            fragile = _band(_q4_code_v, v, k) | _band(_q4_code_t, t, k)
        else:  # pragma: no cover
            raise ConfigError(f"no fragility rule for {name}")
        d = np.asarray(d, np.float32)
        d16 = data[:, 0:2].copy().view("<f2")[:, 0]
        if not np.array_equal(d.astype(np.float16), d16):  # by value: +0 == -0
            raise AssertionError(f"{name}: recomputed float32 scale does not give the stored fp16 scale")
        d64 = d.astype(np.float64)
        w = k * _ulp32(d64)
        scale_fragile = (d64 - w).astype(np.float16) != (d64 + w).astype(np.float16)
    out["fragile"] = fragile.astype(np.uint8)
    out["scale_fragile"] = scale_fragile.astype(np.uint8)
    out["scale_f32"] = d
    return out


# ---------------------------------------------------------------------------
# golden sets
# ---------------------------------------------------------------------------


@dataclass
class GoldenSet:
    """One golden file set in memory: ``<name>.npz`` arrays, ``<name>.json`` manifest, ``<name>.h`` header."""

    name: str
    arrays: dict
    manifest: dict
    header: str
    summary: list = field(default_factory=list)


def _array_entries(arrays: dict) -> dict:
    return {k: {"dtype": a.dtype.str, "shape": list(a.shape), "sha256": sha256_array(a)} for k, a in arrays.items()}


def _library() -> dict:
    return {"name": "tbq", "version": __version__, "numpy": np.__version__}


def _backend_check(ref_codec: Codec, xb: np.ndarray, data: np.ndarray, decoded: np.ndarray):
    """Compare the golden bytes/floats (library default backend) with the NumPy reference backend.

    Returns ``"identical"`` or a dict listing the blocks that differ (and warns):
    the two backends are documented to be byte-identical, so a difference is a
    library defect worth knowing about; the golden files keep the default
    backend's output, which is what ``tbq.quantize`` returns.
    """
    ref = ref_codec.encode(xb)
    enc_bad = np.flatnonzero((ref != data).any(axis=1))
    dec_bad = np.flatnonzero((ref_codec.decode(data).view(np.uint32) != decoded.view(np.uint32)).any(axis=1))
    if not enc_bad.size and not dec_bad.size:
        return "identical"
    import warnings

    warnings.warn(
        f"{ref_codec.name}: the numba and numpy backends disagree on {enc_bad.size} encoded and {dec_bad.size} decoded "
        f"golden blocks (first: {(enc_bad.tolist() + dec_bad.tolist())[:4]}); the golden files use the default backend",
        RuntimeWarning,
        stacklevel=3,
    )
    return {"encode_differs_in_blocks": enc_bad.tolist(), "decode_differs_in_blocks": dec_bad.tolist()}


def build_format(
    fmt: str,
    *,
    blocks: int = DEFAULT_BLOCKS,
    seed: int = DEFAULT_SEED,
    families=FAMILIES,
    codebook="lloyd-max",
    signs="turboq-mtp",
    k: int = DEFAULT_K,
    ulp_floor: float | None = None,
    inputs: dict | None = None,
) -> GoldenSet:
    """The golden set of one format (in memory; :func:`write_set` writes it)."""
    info = format_info(fmt)
    fams = _check_families(families)
    tables = codebook if isinstance(codebook, _Tables) else _resolve_tables(codebook, signs)
    if inputs is None:
        inputs = make_inputs(blocks, seed, fams, codebook=tables)
    rows = inputs["x"].shape[0]
    per_row = ROW_SIZE // info.block_size
    codec = _codec(fmt, tables, backend=None)  # what tbq.quantize uses (numba when it imports)
    ref_codec = _codec(fmt, tables, backend="numpy")
    xb = np.ascontiguousarray(inputs["x"].reshape(-1, info.block_size))
    data = codec.encode(xb)  # raises ScaleOverflowError if a scale does not fit fp16
    decoded = codec.decode(data)
    backend_check = _backend_check(ref_codec, xb, data, decoded) if codec.backend != "numpy" else "numpy only"
    fr = fragility(ref_codec, xb, data, k, ulp_floor)
    floor = (TBQ_ULP_FLOOR if ulp_floor is None else float(ulp_floor)) if info.rotated else 0.0
    arrays = {
        "input": _le(xb),
        "bytes": data,
        "decoded": _le(decoded),
        "fragile": fr["fragile"],
        "scale_fragile": fr["scale_fragile"],
        "scale_f32": _le(fr["scale_f32"]),
        "family": np.repeat(inputs["family"], per_row).astype(np.uint8),
        "kind": np.repeat(inputs["kind"], per_row).astype(np.uint8),
    }
    if info.rotated:
        arrays.update(
            norm=_le(fr["norm"]),
            centroids=_le(codec.codebook.centroids.copy()),
            thresholds=_le(codec.codebook.thresholds.copy()),
            signs1=codec.rotation.signs1.astype(np.int8),
            signs2=codec.rotation.signs2.astype(np.int8),
        )
    for key in ("input", "decoded", "scale_f32"):
        if not np.isfinite(arrays[key]).all():  # pragma: no cover - cannot happen by construction
            raise AssertionError(f"{fmt}: {key} holds a non-finite value")
    fam_info = [dict(f, blocks=[f["rows"][0] * per_row, f["rows"][1] * per_row]) for f in inputs["families"]]
    summary = []
    for f in fam_info:
        sl = slice(*f["blocks"])
        summary.append(
            {
                "format": fmt,
                "family": f["name"],
                "blocks": f["blocks"][1] - f["blocks"][0],
                "values": (f["blocks"][1] - f["blocks"][0]) * info.block_size,
                "fragile_values": int(arrays["fragile"][sl].sum()),
                "fragile_blocks": int(arrays["scale_fragile"][sl].sum()),
            }
        )
    manifest = {
        "kind": "tbq-golden-format",
        "schema": 1,
        "format": fmt,
        "block_size": info.block_size,
        "type_size": info.type_size,
        "blocks": int(xb.shape[0]),
        "rows": rows,
        "row_size": ROW_SIZE,
        "blocks_per_row": per_row,
        "values": int(xb.size),
        "library": _library(),
        "codec_config": _exact_config(fmt, tables),
        "codec_config_named": _named_config(codec),
        "backend": codec.backend,
        "backend_check": backend_check,
        "generator": {
            "seed": int(inputs.get("seed", seed)),
            "rows_per_family": int(inputs.get("blocks", blocks)),
            "families": fam_info,
            "rng": "numpy.random.default_rng(family_seed) (PCG64)",
            "outlier_channels": list(OUTLIER_CHANNELS),
            "outlier_factor": OUTLIER_FACTOR,
            "edge_kinds": list(EDGE_KINDS),
            "edge_tables": _edge_tables_json(tables),
        },
        "fragility": {
            "k": int(k),
            "ulp_floor": floor,
            "values": "code(v - w) != code(v + w), w = k * float32_ulp(max(|v|, ulp_floor)); v = rotated coordinate (TBQ), x*id (Q8_0), x*id and t = float32(x*id + 8.5) (Q4_0)",
            "blocks": "fp16(d - w) != fp16(d + w), w = k * float32_ulp(|d|), d the float32 scale",
        },
        "arrays": _array_entries(arrays),
        "array_meaning": dict(FORMAT_ARRAYS, **(TBQ_ARRAYS if info.rotated else {})),
        "sha256_of": "the array's bytes in C order, dtypes as listed (little-endian)",
        "summary": summary,
        "regenerate": f"tbq golden --from-manifest {fmt}.json --out DIR (or tbq.golden.regenerate('{fmt}.json', DIR))",
    }
    if info.rotated:
        manifest["tables"] = {
            "centroids": _hex_table(codec.codebook.centroids),
            "thresholds": _hex_table(codec.codebook.thresholds),
        }
    gs = GoldenSet(fmt, arrays, manifest, "", summary)
    gs.header = c_header(gs)
    manifest["header"] = {"file": f"{fmt}.h", "sha256": hashlib.sha256(gs.header.encode()).hexdigest()}
    return gs


def _check_attention_args(tokens, n_head, n_head_kv, n_sink, sink_format) -> None:
    from .attention import SINK_FORMATS

    for label, val, lo in (("tokens", tokens, 1), ("n_head", n_head, 1), ("n_head_kv", n_head_kv, 1), ("n_sink", n_sink, 0)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < lo:
            raise TbqValueError(f"{label} must be an integer >= {lo}, got {val!r}")
    if n_head % n_head_kv:
        raise TbqValueError(f"n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv})")
    if n_sink > tokens:
        raise TbqValueError(f"n_sink ({n_sink}) cannot exceed tokens ({tokens})")
    if sink_format not in SINK_FORMATS:
        raise ConfigError(f"sink_format must be one of {SINK_FORMATS}, got {sink_format!r}")


def build_attention(
    k_fmt: str,
    v_fmt: str,
    *,
    seed: int = DEFAULT_SEED,
    tokens: int = 32,
    n_head: int = 8,
    n_head_kv: int = 2,
    n_sink: int = 0,
    sink_format: str = "f16",
    codebook="lloyd-max",
    signs="turboq-mtp",
) -> GoldenSet:
    """The golden set of one attention case: ``attention_<k_fmt>_<v_fmt>``.

    Data from ``default_rng(seed * 1000 + 100)``: ``q`` standard normal
    ``(n_head, 128)``, then K standard normal ``(tokens, n_head_kv, 128)`` with
    channels 5, 37, 64, 111 multiplied by 8, then V standard normal, all
    float32. Both caches keep their first ``n_sink`` tokens in ``sink_format``.
    """
    from .attention import attention_dequantized, attention_rotated, encode_kv, f32_tolerance, score_condition

    for f in (k_fmt, v_fmt):
        format_info(f)
    _check_attention_args(tokens, n_head, n_head_kv, n_sink, sink_format)
    tables = codebook if isinstance(codebook, _Tables) else _resolve_tables(codebook, signs)
    aseed = attention_seed(seed)
    rng = np.random.default_rng(aseed)
    dim = ROW_SIZE
    q = rng.standard_normal((n_head, dim), dtype=np.float32)
    k = rng.standard_normal((tokens, n_head_kv, dim), dtype=np.float32)
    k[..., list(OUTLIER_CHANNELS)] *= np.float32(ATTENTION_KEY_OUTLIER_FACTOR)
    v = rng.standard_normal((tokens, n_head_kv, dim), dtype=np.float32)

    def cfg(f):
        c = _exact_config(f, tables)
        del c["name"]
        return c

    K, V = encode_kv(k, v, k_fmt, v_fmt, n_sink=n_sink, sink_format=sink_format, k_config=cfg(k_fmt), v_config=cfg(v_fmt))
    scale = 1.0 / math.sqrt(dim)
    ref = attention_dequantized(q, K, V)
    rot64 = attention_rotated(q, K, V, dtype=np.float64)
    rot32 = attention_rotated(q, K, V, dtype=np.float32)
    tol = f32_tolerance(q, K, V)
    err64 = float(np.max(np.abs(rot64 - ref)))
    err32 = float(np.max(np.abs(rot32.astype(np.float64) - ref)))
    if err32 > tol or err64 > 1e-12 * max(1.0, float(np.max(np.abs(V.dequantize(np.float64))))):  # pragma: no cover
        raise AssertionError(f"attention {k_fmt}/{v_fmt}: the algorithms disagree (f64 {err64:.3g}, f32 {err32:.3g} > {tol:.3g})")
    arrays = {
        "q": _le(q),
        "k_input": _le(k),
        "v_input": _le(v),
        "k_bytes": K.data,
        "v_bytes": V.data,
    }
    if n_sink:
        arrays["k_sink"] = K.sink
        arrays["v_sink"] = V.sink
    arrays.update(out_dequantized=_le(ref), out_rotated_f64=_le(rot64), out_rotated_f32=_le(rot32))
    for name, tb_fmt in (("k", k_fmt), ("v", v_fmt)):
        if tb_fmt in _TBQ_BITS:
            c = _codec(tb_fmt, tables)
            arrays[f"{name}_centroids"] = _le(c.codebook.centroids.copy())
            arrays[f"{name}_signs1"] = c.rotation.signs1.astype(np.int8)
            arrays[f"{name}_signs2"] = c.rotation.signs2.astype(np.int8)
    stem = f"attention_{k_fmt}_{v_fmt}"
    summary = [
        {
            "k_format": k_fmt,
            "v_format": v_fmt,
            "tokens": tokens,
            "n_head": n_head,
            "n_head_kv": n_head_kv,
            "n_sink": n_sink,
            "sink_format": sink_format if n_sink else "-",
            "err_f64": err64,
            "err_f32": err32,
            "tol_f32": tol,
        }
    ]
    manifest = {
        "kind": "tbq-golden-attention",
        "schema": 1,
        "k_format": k_fmt,
        "v_format": v_fmt,
        "k_config": _exact_config(k_fmt, tables),
        "v_config": _exact_config(v_fmt, tables),
        "n_head": n_head,
        "n_head_kv": n_head_kv,
        "head_dim": dim,
        "tokens": tokens,
        "n_sink": n_sink,
        "sink_format": sink_format,
        "gqa": "query head h reads KV head h // (n_head // n_head_kv)",
        "scale": scale,
        "scale_hex": hex_literal(scale, ""),
        "library": _library(),
        "generator": {
            "seed": int(seed),
            "attention_seed": aseed,
            "seed_derivation": "seed * 1000 + 100",
            "rng": "numpy.random.default_rng(attention_seed) (PCG64)",
            "draws": "q = standard_normal((n_head, 128), float32); k = standard_normal((tokens, n_head_kv, 128), float32) "
            f"with channels {list(OUTLIER_CHANNELS)} x float32({ATTENTION_KEY_OUTLIER_FACTOR}); v = standard_normal(same, float32)",
            "edge_tables": _edge_tables_json(tables),
        },
        "algorithms": {
            "out_dequantized": "tbq.attention.attention_dequantized: exact float64 dequantization, then softmax attention in float64",
            "out_rotated_f64": "tbq.attention.attention_rotated(dtype=float64): rotate q once, scores from centroid x scale, softmax, weighted centroid sum, rotate back once",
            "out_rotated_f32": "the same in float32 (every sum sequential in index order, exp in float64 rounded to float32)",
        },
        "max_abs_diff": {"rotated_f64_vs_dequantized": err64, "rotated_f32_vs_dequantized": err32},
        "f32_tolerance": tol,
        "f32_tolerance_rule": "4 * 2^-24 * max|V| * (1 + max_{h,t} scale * sum_j |q_hj| |k_tj|) (tbq.attention.f32_tolerance)",
        "score_condition": score_condition(q, K),
        "arrays": _array_entries(arrays),
        "sha256_of": "the array's bytes in C order, dtypes as listed (little-endian)",
        "summary": summary,
        "regenerate": f"tbq golden --from-manifest {stem}.json --out DIR",
    }
    gs = GoldenSet(stem, arrays, manifest, "", summary)
    gs.header = c_header(gs)
    manifest["header"] = {"file": f"{stem}.h", "sha256": hashlib.sha256(gs.header.encode()).hexdigest()}
    return gs


# ---------------------------------------------------------------------------
# C headers
# ---------------------------------------------------------------------------

_UNUSED_BLOCK = """#ifndef TBQ_GOLDEN_UNUSED
#if defined(__GNUC__) || defined(__clang__)
#define TBQ_GOLDEN_UNUSED __attribute__((unused))
#else
#define TBQ_GOLDEN_UNUSED
#endif
#endif
"""


def _literals(a: np.ndarray) -> list[str]:
    a = np.asarray(a).reshape(-1)
    if a.dtype == np.float32:
        return [hex_literal(v, "f") for v in a.tolist()]
    if a.dtype == np.float64:
        return [hex_literal(v, "") for v in a.tolist()]
    if a.dtype in (np.uint8, np.int8):
        return [str(int(v)) for v in a.tolist()]
    raise TypeError(a.dtype)  # pragma: no cover


_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double", np.dtype(np.uint8): "uint8_t", np.dtype(np.int8): "int8_t"}


def _c_array(name: str, a: np.ndarray, size: str, comment: str = "") -> str:
    lits = _literals(a)
    if not lits:  # pragma: no cover - callers never emit empty arrays (C forbids them)
        raise AssertionError(f"{name} is empty")
    per_line = 16 if a.dtype in (np.uint8, np.int8) else 4
    lines = [", ".join(lits[i : i + per_line]) for i in range(0, len(lits), per_line)]
    head = f"/* {comment} */\n" if comment else ""
    body = ",\n    ".join(lines)
    return f"{head}static const {_CTYPE[a.dtype]} {name}[{size}] TBQ_GOLDEN_UNUSED = {{\n    {body}\n}};\n"


def c_header(gs: GoldenSet) -> str:
    """The C/C++ header text of a golden set (self-contained, ``static const`` arrays).

    Compiles warning-free with ``gcc -std=c11 -Wall -Wextra -Werror`` and
    ``g++ -std=c++17 -Wall -Werror`` and can be included from several
    translation units (and next to the other formats' headers).
    """
    m = gs.manifest
    stem = gs.name
    P = f"TBQ_GOLDEN_{stem.upper()}"
    p = f"tbq_golden_{stem}"
    A = gs.arrays
    out = [
        f"/* {stem}.h: golden vectors generated by `tbq golden` (tbq {__version__}). Do not edit.\n",
    ]
    if m["kind"] == "tbq-golden-format":
        fmt = m["format"]
        fams = m["generator"]["families"]
        out.append(
            f" * Format {fmt}: {m['blocks']} blocks of {m['block_size']} values, {m['type_size']} bytes each\n"
            f" * ({m['rows']} input rows of 128 values, {m['blocks_per_row']} block(s) per row; seed {m['generator']['seed']}).\n"
            " * Families (index: name, blocks [first, last+1), derived seed):\n"
        )
        for f in fams:
            out.append(f" *   {f['index']}: {f['name']}, [{f['blocks'][0]}, {f['blocks'][1]}), seed {f['seed']}\n")
        out.append(
            f" * Fragility: k = {m['fragility']['k']} float32 ulps"
            + (f", ulp floor {m['fragility']['ulp_floor']!r}" if m["fragility"]["ulp_floor"] else "")
            + ".\n"
            " *   _fragile[i] = 1: value i's code may be the neighbouring code (index +-1);\n"
            " *   _scale_fragile[b] = 1: block b's fp16 scale may be the neighbouring fp16 value.\n"
            " *   Compare everything else exactly; _decoded is exact for the given _bytes everywhere.\n"
            f" * Regenerate bit for bit: tbq golden --from-manifest {fmt}.json --out DIR\n */\n"
        )
        out.append(f"#ifndef {P}_H\n#define {P}_H\n\n#include <stdint.h>\n\n{_UNUSED_BLOCK}\n")
        defines = [
            ("BLOCKS", m["blocks"]),
            ("BLOCK_SIZE", m["block_size"]),
            ("TYPE_SIZE", m["type_size"]),
            ("VALUES", m["values"]),
            ("ROWS", m["rows"]),
            ("ROW_SIZE", m["row_size"]),
            ("N_FAMILIES", len(fams)),
            ("FRAGILE_K", m["fragility"]["k"]),
        ]
        if "centroids" in A:
            defines += [("INDEX_BITS", format_info(fmt).index_bits), ("N_CENTROIDS", A["centroids"].size)]
        for name, val in defines:
            out.append(f"#define {P}_{name} {val}\n")
        out.append("\n")
        names = ", ".join(f'"{f["name"]}"' for f in fams)
        out.append(f"static const char *const {p}_family_names[{P}_N_FAMILIES] TBQ_GOLDEN_UNUSED = {{{names}}};\n")
        kinds = ", ".join(f'"{k}"' for k in EDGE_KINDS)
        out.append("/* _kind[b] indexes this list for the edge family and is 255 elsewhere. */\n")
        out.append(f"static const char *const {p}_edge_kind_names[{len(EDGE_KINDS)}] TBQ_GOLDEN_UNUSED = {{{kinds}}};\n\n")
        V, B = f"{P}_VALUES", f"{P}_BLOCKS"
        out.append(_c_array(f"{p}_input", A["input"], V, "inputs, block after block"))
        out.append(_c_array(f"{p}_bytes", A["bytes"], f"{B} * {P}_TYPE_SIZE", "encoded blocks, back to back"))
        out.append(_c_array(f"{p}_decoded", A["decoded"], V, "decoded values of _bytes (bit-exact)"))
        out.append(_c_array(f"{p}_fragile", A["fragile"], V, "per value: 1 = the code may be the neighbouring one"))
        out.append(_c_array(f"{p}_scale_fragile", A["scale_fragile"], B, "per block: 1 = the fp16 scale may be the neighbouring fp16 value"))
        out.append(_c_array(f"{p}_scale_f32", A["scale_f32"], B, "per block: the float32 scale before fp16 rounding"))
        out.append(_c_array(f"{p}_family", A["family"], B, "per block: family index"))
        out.append(_c_array(f"{p}_kind", A["kind"], B, "per block: edge kind index or 255"))
        if "centroids" in A:
            out.append(_c_array(f"{p}_norm", A["norm"], B, "per block: float32 norm of encoder step 1 (to recompute d from other indices)"))
            out.append(_c_array(f"{p}_centroids", A["centroids"], f"{P}_N_CENTROIDS", "codebook centroids"))
            out.append(_c_array(f"{p}_thresholds", A["thresholds"], f"{P}_N_CENTROIDS - 1", "codebook decision thresholds"))
            out.append(_c_array(f"{p}_signs1", A["signs1"], "128", "rotation sign vector s1: R(x) = s2 * H(s1 * x)"))
            out.append(_c_array(f"{p}_signs2", A["signs2"], "128", "rotation sign vector s2"))
    else:
        kf, vf = m["k_format"], m["v_format"]
        out.append(
            f" * Attention reference: K cache {kf}, V cache {vf}; {m['n_head']} query heads, {m['n_head_kv']} KV heads "
            f"(head h reads KV head h / {m['n_head'] // m['n_head_kv']}),\n"
            f" * head_dim {m['head_dim']}, {m['tokens']} tokens, the first {m['n_sink']} in {m['sink_format']} (sink arrays), softmax scale 1/sqrt(128).\n"
            " * Caches are [token][kv_head][row bytes]; a row is head_dim / block_size blocks.\n"
            " * _out_dequantized (double): attention over the dequantized caches in float64.\n"
            " * _out_rotated_f64 / _out_rotated_f32: the fused rotated-domain algorithm in float64 / float32.\n"
            f" * A float32 kernel should match _out_dequantized within {P}_F32_TOLERANCE (absolute).\n"
            f" * Regenerate: tbq golden --from-manifest {stem}.json --out DIR\n */\n"
        )
        out.append(f"#ifndef {P}_H\n#define {P}_H\n\n#include <stdint.h>\n\n{_UNUSED_BLOCK}\n")

        def rb(fmt):
            return format_info(fmt).row_bytes(m["head_dim"])

        defines = [
            ("N_HEAD", m["n_head"]),
            ("N_HEAD_KV", m["n_head_kv"]),
            ("HEAD_DIM", m["head_dim"]),
            ("N_TOKENS", m["tokens"]),
            ("N_SINK", m["n_sink"]),
            ("K_BLOCK_SIZE", format_info(kf).block_size),
            ("K_TYPE_SIZE", format_info(kf).type_size),
            ("K_ROW_BYTES", rb(kf)),
            ("V_BLOCK_SIZE", format_info(vf).block_size),
            ("V_TYPE_SIZE", format_info(vf).type_size),
            ("V_ROW_BYTES", rb(vf)),
            ("SINK_ROW_BYTES", 2 * m["head_dim"] if m["sink_format"] == "f16" else format_info("q8_0").row_bytes(m["head_dim"])),
            ("SINK_IS_F16", 1 if m["sink_format"] == "f16" else 0),
            ("SCALE", hex_literal(m["scale"], "")),
            ("F32_TOLERANCE", hex_literal(m["f32_tolerance"], "")),
        ]
        for name, val in defines:
            out.append(f"#define {P}_{name} {val}\n")
        out.append("\n")
        T_main = f"({P}_N_TOKENS - {P}_N_SINK)"
        out.append(_c_array(f"{p}_q", A["q"], f"{P}_N_HEAD * {P}_HEAD_DIM", "queries [head][dim]"))
        out.append(_c_array(f"{p}_k_input", A["k_input"], f"{P}_N_TOKENS * {P}_N_HEAD_KV * {P}_HEAD_DIM", "keys before quantization"))
        out.append(_c_array(f"{p}_v_input", A["v_input"], f"{P}_N_TOKENS * {P}_N_HEAD_KV * {P}_HEAD_DIM", "values before quantization"))
        if A["k_bytes"].size:
            out.append(_c_array(f"{p}_k_bytes", A["k_bytes"], f"{T_main} * {P}_N_HEAD_KV * {P}_K_ROW_BYTES", f"K cache tokens n_sink.. in {kf}"))
            out.append(_c_array(f"{p}_v_bytes", A["v_bytes"], f"{T_main} * {P}_N_HEAD_KV * {P}_V_ROW_BYTES", f"V cache tokens n_sink.. in {vf}"))
        if "k_sink" in A:
            out.append(_c_array(f"{p}_k_sink", A["k_sink"], f"{P}_N_SINK * {P}_N_HEAD_KV * {P}_SINK_ROW_BYTES", f"K sink tokens in {m['sink_format']}"))
            out.append(_c_array(f"{p}_v_sink", A["v_sink"], f"{P}_N_SINK * {P}_N_HEAD_KV * {P}_SINK_ROW_BYTES", f"V sink tokens in {m['sink_format']}"))
        out.append(_c_array(f"{p}_out_dequantized", A["out_dequantized"], f"{P}_N_HEAD * {P}_HEAD_DIM", "float64 reference output [head][dim]"))
        out.append(_c_array(f"{p}_out_rotated_f64", A["out_rotated_f64"], f"{P}_N_HEAD * {P}_HEAD_DIM", "fused algorithm, float64"))
        out.append(_c_array(f"{p}_out_rotated_f32", A["out_rotated_f32"], f"{P}_N_HEAD * {P}_HEAD_DIM", "fused algorithm, float32"))
        for c in ("k", "v"):
            if f"{c}_centroids" in A:
                out.append(_c_array(f"{p}_{c}_centroids", A[f"{c}_centroids"], str(A[f"{c}_centroids"].size), f"{c.upper()} codebook centroids"))
                out.append(_c_array(f"{p}_{c}_signs1", A[f"{c}_signs1"], "128", f"{c.upper()} rotation s1"))
                out.append(_c_array(f"{p}_{c}_signs2", A[f"{c}_signs2"], "128", f"{c.upper()} rotation s2"))
    out.append(f"\n#endif /* {P}_H */\n")
    return "".join(out)


# ---------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------


def write_set(gs: GoldenSet, out) -> list[Path]:
    """Write ``<name>.npz``, ``<name>.json`` and ``<name>.h`` into directory ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{gs.name}.npz", out / f"{gs.name}.json", out / f"{gs.name}.h"]
    np.savez_compressed(paths[0], **gs.arrays)
    paths[1].write_text(json.dumps(gs.manifest, indent=1) + "\n")
    paths[2].write_text(gs.header)
    return paths


class _Progress:
    """A tiny progress bar on stderr (``\\r`` updates on a terminal, one line per step otherwise)."""

    def __init__(self, total: int, enabled: bool, stream=None, label: str = "tbq golden"):
        self.total, self.enabled, self.n, self.label = max(total, 1), enabled, 0, label
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, what: str) -> None:
        if not self.enabled:
            return
        self.n += 1
        width = 24
        done = int(width * self.n / self.total)
        bar = "#" * done + "." * (width - done)
        text = f"{self.label} [{bar}] {self.n}/{self.total} {what}"
        if self.tty:
            self.stream.write("\r" + text.ljust(79))
            if self.n >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


@dataclass
class Summary:
    """What :func:`generate` wrote: per-family rows, attention rows, and the file paths."""

    rows: list
    attention: list
    paths: list

    def table(self) -> str:
        """The summary table: format, family, blocks, values, fragile values, fragile blocks."""
        lines = []
        if self.rows:
            cols = [("format", "format"), ("family", "family"), ("blocks", "blocks"), ("values", "values"),
                    ("fragile values", "fragile_values"), ("fragile blocks", "fragile_blocks")]
            cells = [[c for c, _ in cols]] + [[str(r[key]) for _, key in cols] for r in self.rows]
            lines += _align(cells, left=2)
        if self.attention:
            if lines:
                lines.append("")
            cols = [("attention K", "k_format"), ("V", "v_format"), ("tokens", "tokens"), ("heads", "n_head"),
                    ("kv heads", "n_head_kv"), ("sink", "n_sink"), ("sink fmt", "sink_format")]
            head = [c for c, _ in cols] + ["max|f64 fused-ref|", "max|f32 fused-ref|", "f32 tolerance"]
            body = [[str(r[key]) for _, key in cols] + [f"{r['err_f64']:.2e}", f"{r['err_f32']:.2e}", f"{r['tol_f32']:.2e}"] for r in self.attention]
            lines += _align([head] + body, left=2)
        return "\n".join(lines)


def _align(cells, left: int) -> list[str]:
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    out = []
    for n, row in enumerate(cells):
        out.append("  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def _check_formats(fmts) -> tuple[str, ...]:
    if isinstance(fmts, str):
        fmts = [f for f in fmts.split(",") if f]
    fmts = tuple(fmts)
    if not fmts:
        raise ConfigError("at least one format is needed")
    for f in fmts:
        format_info(f)
    return tuple(dict.fromkeys(fmts))


def _check_pairs(pairs) -> tuple:
    if isinstance(pairs, str):
        items = [p for p in pairs.split(",") if p]
        pairs = []
        for it in items:
            if it.count(":") != 1:
                raise ConfigError(f"an attention pair is K_FORMAT:V_FORMAT, got {it!r}")
            pairs.append(tuple(it.split(":")))
    out = []
    for pr in pairs:
        kf, vf = pr
        format_info(kf)
        format_info(vf)
        out.append((kf, vf))
    return tuple(dict.fromkeys(out))


def generate(
    out,
    *,
    formats=None,
    families=FAMILIES,
    blocks: int = DEFAULT_BLOCKS,
    seed: int = DEFAULT_SEED,
    codebook="lloyd-max",
    signs="turboq-mtp",
    k: int = DEFAULT_K,
    ulp_floor: float | None = None,
    attention: bool = False,
    attention_pairs=DEFAULT_ATTENTION_PAIRS,
    tokens: int = 32,
    n_head: int = 8,
    n_head_kv: int = 2,
    n_sink: int = 0,
    sink_format: str = "f16",
    progress: bool = False,
) -> Summary:
    """Write the golden files of ``formats`` (default: all four) into directory ``out``.

    The Python side of ``tbq golden``; parameters mirror the CLI flags:
    ``families`` and ``blocks`` (rows of 128 values per family), ``seed``,
    ``codebook`` / ``signs`` (TBQ tables: a name, an integer seed for signs,
    exact values), ``k`` and ``ulp_floor`` (fragility), and with ``attention``
    one ``attention_<k>_<v>`` set per pair of ``attention_pairs`` with
    ``tokens``, ``n_head``, ``n_head_kv``, ``n_sink`` and ``sink_format``.
    Returns a :class:`Summary` (``print(summary.table())``).
    """
    fmts = _check_formats(formats if formats is not None else tuple(FORMATS))
    fams = _check_families(families)
    blocks = _check_blocks(blocks)
    seed = _check_seed(seed)
    pairs = _check_pairs(attention_pairs) if attention else ()
    if attention:
        _check_attention_args(tokens, n_head, n_head_kv, n_sink, sink_format)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise TbqValueError(f"k (the fragility margin in ulps) must be a non-negative integer, got {k!r}")
    tables = _resolve_tables(codebook, signs)
    bar = _Progress(1 + len(fmts) + len(pairs), progress)
    inputs = make_inputs(blocks, seed, fams, codebook=tables)
    inputs.update(seed=seed, blocks=blocks)
    bar.step("inputs")
    rows, att, paths = [], [], []
    for fmt in fmts:
        gs = build_format(fmt, blocks=blocks, seed=seed, families=fams, codebook=tables, k=k, ulp_floor=ulp_floor, inputs=inputs)
        paths += write_set(gs, out)
        rows += gs.summary
        bar.step(fmt)
    for kf, vf in pairs:
        gs = build_attention(kf, vf, seed=seed, tokens=tokens, n_head=n_head, n_head_kv=n_head_kv, n_sink=n_sink, sink_format=sink_format, codebook=tables)
        paths += write_set(gs, out)
        att += gs.summary
        bar.step(f"attention {kf}/{vf}")
    return Summary(rows, att, paths)


def _load_manifest(manifest) -> dict:
    if isinstance(manifest, dict):
        return manifest
    try:
        return json.loads(Path(manifest).read_text())
    except (OSError, ValueError) as exc:
        raise TbqValueError(f"cannot read the manifest {manifest}: {exc}") from None


def _tables_from_manifest(m: dict) -> _Tables:
    et = m["generator"]["edge_tables"]
    return _resolve_tables({"tbq4_0": et["tbq4_0_codebook"], "tbq3_0": et["tbq3_0_codebook"]}, et["signs"])


def regenerate(manifest, out=None) -> GoldenSet:
    """Rebuild a golden set from its manifest (a path or the parsed dict); write it into ``out`` if given.

    The result's arrays are bit-identical to the original ones (compare
    ``result.manifest["arrays"]`` with the original's SHA-256 entries).
    """
    m = _load_manifest(manifest)
    kind = m.get("kind")
    if kind not in ("tbq-golden-format", "tbq-golden-attention"):
        raise TbqValueError(f"not a tbq golden manifest (kind {kind!r})")
    tables = _tables_from_manifest(m)
    g = m["generator"]
    if kind == "tbq-golden-format":
        fams = [f["name"] for f in g["families"]]
        for f in g["families"]:
            if family_seed(g["seed"], f["name"]) != f["seed"]:
                raise TbqValueError(f"family {f['name']}: the manifest's seed {f['seed']} does not follow this version's derivation")
        gs = build_format(
            m["format"],
            blocks=g["rows_per_family"],
            seed=g["seed"],
            families=fams,
            codebook=tables,
            k=m["fragility"]["k"],
            ulp_floor=m["fragility"]["ulp_floor"] if FORMATS[m["format"]].rotated else None,
        )
    else:
        gs = build_attention(
            m["k_format"],
            m["v_format"],
            seed=g["seed"],
            tokens=m["tokens"],
            n_head=m["n_head"],
            n_head_kv=m["n_head_kv"],
            n_sink=m["n_sink"],
            sink_format=m["sink_format"],
            codebook=tables,
        )
    if out is not None:
        write_set(gs, out)
    return gs


def verify(directory) -> list[str]:
    """Check every golden set in ``directory``: the SHA-256 of each ``.npz`` array against its manifest.

    Returns a list of problems (empty when everything matches).
    """
    problems = []
    d = Path(directory)
    found = 0
    for mpath in sorted(d.glob("*.json")):
        try:
            m = json.loads(mpath.read_text())
        except ValueError:
            continue
        if m.get("kind") not in ("tbq-golden-format", "tbq-golden-attention"):
            continue
        found += 1
        npz = mpath.with_suffix(".npz")
        if not npz.exists():
            problems.append(f"{npz.name}: missing")
            continue
        with np.load(npz) as z:
            names = set(z.files)
            for name, entry in m["arrays"].items():
                if name not in names:
                    problems.append(f"{npz.name}: array {name} missing")
                elif sha256_array(z[name]) != entry["sha256"]:
                    problems.append(f"{npz.name}: array {name} does not match its SHA-256")
        h = mpath.with_suffix(".h")
        if h.exists() and hashlib.sha256(h.read_bytes()).hexdigest() != m.get("header", {}).get("sha256"):
            problems.append(f"{h.name}: does not match its SHA-256")
    if not found:
        problems.append(f"no tbq golden manifest in {d}")
    return problems
