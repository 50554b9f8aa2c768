"""Manifests of the golden sets: building, loading, SHA-256 of arrays, exact hex and JSON tables.

A manifest (``<name>.json``) records everything :func:`tbq.golden.regenerate`
needs to rebuild a set bit for bit (format, exact codec tables, seeds, row
counts, fragility parameters) plus the SHA-256 of every array and of the
header. :func:`hex_literal` writes the exact C99 hex-float literals used by
the manifests' tables and the C headers.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..codebooks import Codebook
from ..codecs import Codec
from ..errors import TbqValueError
from ..formats import Format, format_class
from ..rotation import RandomizedHadamard
from .families import (
    ATTENTION_KEY_OUTLIER_FACTOR,
    EDGE_KINDS,
    OUTLIER_CHANNELS,
    OUTLIER_FACTOR,
    ROW_SIZE,
    _resolve_tables,
    _Tables,
)

#: The ``kind`` of a format manifest and of an attention manifest.
MANIFEST_KINDS = ("tbq-golden-format", "tbq-golden-attention")

#: Arrays of ``<fmt>.npz`` (all formats) and their meaning.
FORMAT_ARRAYS = {
    "input": "float32 (blocks, block_size): the values to quantize",
    "bytes": "uint8 (blocks, type_size): what a correct quantizer writes",
    "decoded": "float32 (blocks, block_size): what a correct dequantizer returns for `bytes`",
    "fragile": "uint8 (blocks, block_size): 1 where the value's code may legitimately differ by one",
    "scale_fragile": "uint8 (blocks,): 1 where the fp16 scale may legitimately be the neighbouring fp16 value",
    "scale_f32": "float32 (blocks,): the float32 scale d before rounding to fp16",
    "decode_tolerance": "float32 (blocks, block_size): the largest legitimate |difference| of a decoded value from "
    "`decoded` (an FMA build of the decoder); only for formats whose decoder arithmetic FMA changes (planar/iso)",
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
# literals, hashes
# ---------------------------------------------------------------------------


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
# exact tables as JSON
# ---------------------------------------------------------------------------


def _exact_codebook(cb: Codebook) -> dict[str, Any]:
    return {"centroids": [float(v) for v in cb.centroids], "thresholds": [float(v) for v in cb.thresholds]}


def _exact_signs(rot: RandomizedHadamard) -> dict[str, Any]:
    return {"signs1": [int(v) for v in rot.signs1], "signs2": [int(v) for v in rot.signs2]}


def _hex_table(values: Any) -> dict[str, Any]:
    a = np.asarray(values, np.float32)
    return {"hex": [hex_literal(v, "") for v in a], "float32_bits": [f"0x{int(b):08x}" for b in a.view(np.uint32)]}


#: What scale_fragile means for formats whose block scales are not one fp16 number.
OTHER_SCALE_FRAGILE = (
    "uint8 (blocks,): 1 where a stored scale of the block (E8M0 exponent, UE4M3 sub-block scales) may legitimately "
    "be the neighbouring representable value; 0 for formats without a scale (f16, bf16)"
)


def _array_meaning(arrays: dict[str, Any]) -> dict[str, Any]:
    """The meaning of each array the set holds (FORMAT_ARRAYS, then TBQ_ARRAYS), in that order."""
    meaning = {k: v for k, v in FORMAT_ARRAYS.items() if k in arrays}
    if "scale_f32" not in arrays and "scale_fragile" in meaning:
        meaning["scale_fragile"] = OTHER_SCALE_FRAGILE
    meaning.update({k: v for k, v in TBQ_ARRAYS.items() if k in arrays})
    meaning.update(
        {k: "float32 table of the format (exact values; see docs/formats.md)" for k in arrays if k not in meaning}
    )
    return meaning


def _exact_config(fmt: str, tables: _Tables, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Codec config of ``fmt`` with exact tables (accepted by :func:`tbq.codec_from_config`).

    ``options``: the format's own options for a format without golden tables
    (FP8's ``scale``; default: the declared defaults), recorded as the format's
    config so ``--from-manifest`` rebuilds the same codec.
    """
    cfg: dict[str, Any] = {"name": fmt, "on_overflow": format_class(fmt).golden.on_overflow}
    if fmt in tables.codebooks:  # the formats with codebook and signs options
        cfg["codebook"] = _exact_codebook(tables.codebooks[fmt])
        cfg["signs"] = _exact_signs(tables.rotation)
    else:  # any other format's own options
        cls: type[Format] = format_class(fmt)
        cfg.update(cls(**cls.check_options(options or {})).config())
    return cfg


def own_options(fmt: str, config: dict[str, Any], tables: _Tables) -> dict[str, Any]:
    """The options of a manifest's ``codec_config`` that :func:`_exact_config` took from ``options`` (not from the tables)."""
    if fmt in tables.codebooks:
        return {}
    return {k: config[k] for k in format_class(fmt).options if k in config}


def _named_config(codec: Codec) -> dict[str, Any]:
    cfg = codec.get_config()
    for key in ("backend", "threads"):
        cfg.pop(key, None)
    return cfg


def _edge_tables_json(tables: _Tables) -> dict[str, Any]:
    return {
        "tbq4_0_codebook": _exact_codebook(tables.codebooks["tbq4_0"]),
        "tbq3_0_codebook": _exact_codebook(tables.codebooks["tbq3_0"]),
        "signs": _exact_signs(tables.rotation),
    }


def _array_entries(arrays: dict[str, Any]) -> dict[str, Any]:
    return {k: {"dtype": a.dtype.str, "shape": list(a.shape), "sha256": sha256_array(a)} for k, a in arrays.items()}


def _library() -> dict[str, Any]:
    return {"name": "tbq", "version": __version__, "numpy": np.__version__}


def header_entry(name: str, header: str) -> dict[str, Any]:
    """The manifest's ``"header"`` entry: the header file name and the SHA-256 of its text."""
    return {"file": f"{name}.h", "sha256": hashlib.sha256(header.encode()).hexdigest()}


# ---------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------


def format_manifest(
    fmt: str,
    *,
    codec: Codec,
    tables: _Tables,
    arrays: dict[str, Any],
    rows: int,
    seed: int,
    rows_per_family: int,
    fam_info: list[Any],
    k: int,
    ulp_floor: float,
    backend_check: Any,
    summary: list[Any],
) -> dict[str, Any]:
    """The manifest of one format's golden set (without its ``"header"`` entry, which needs the header text)."""
    info = codec.info  # the instance's sizes (vLLM's head_dim option sets them), not the registry's row
    manifest = {
        "kind": "tbq-golden-format",
        "schema": 1,
        "format": fmt,
        "block_size": info.block_size,
        "type_size": info.type_size,
        "blocks": int(arrays["input"].shape[0]),
        "rows": rows,
        "row_size": ROW_SIZE,
        "blocks_per_row": ROW_SIZE // info.block_size,
        "values": int(arrays["input"].size),
        "library": _library(),
        "codec_config": _exact_config(fmt, tables, codec.format.config()),
        "codec_config_named": _named_config(codec),
        "backend": codec.backend,
        "backend_check": backend_check,
        "generator": {
            "seed": int(seed),
            "rows_per_family": int(rows_per_family),
            "families": fam_info,
            "rng": "numpy.random.default_rng(family_seed) (PCG64)",
            "outlier_channels": list(OUTLIER_CHANNELS),
            "outlier_factor": OUTLIER_FACTOR,
            "edge_kinds": list(EDGE_KINDS),
            "edge_tables": _edge_tables_json(tables),
        },
        "fragility": {
            "k": int(k),
            "ulp_floor": ulp_floor,
            "values": "code(v - w) != code(v + w), w = k * float32_ulp(max(|v|, ulp_floor)); v = rotated coordinate (TBQ), x*id (Q8_0), x*id and t = float32(x*id + 8.5) (Q4_0)",
            "blocks": "fp16(d - w) != fp16(d + w), w = k * float32_ulp(|d|), d the float32 scale",
        },
        "arrays": _array_entries(arrays),
        "array_meaning": _array_meaning(arrays),
        "sha256_of": "the array's bytes in C order, dtypes as listed (little-endian)",
        "summary": summary,
        "regenerate": f"tbq golden --from-manifest {fmt}.json --out DIR (or tbq.golden.regenerate('{fmt}.json', DIR))",
    }
    tabs = codec.format.tables()
    if tabs:
        manifest["tables"] = {key: _hex_table(v) for key, v in tabs.items() if np.asarray(v).dtype.kind == "f"}
    return manifest


def attention_manifest(
    k_fmt: str,
    v_fmt: str,
    *,
    tables: _Tables,
    arrays: dict[str, Any],
    seed: int,
    attention_seed: int,
    tokens: int,
    n_head: int,
    n_head_kv: int,
    n_sink: int,
    sink_format: str,
    scale: float,
    err64: float,
    err32: float,
    tol: float,
    score_condition: Any,
    summary: list[Any],
) -> dict[str, Any]:
    """The manifest of one attention golden set (without its ``"header"`` entry)."""
    stem = f"attention_{k_fmt}_{v_fmt}"
    return {
        "kind": "tbq-golden-attention",
        "schema": 1,
        "k_format": k_fmt,
        "v_format": v_fmt,
        "k_config": _exact_config(k_fmt, tables),
        "v_config": _exact_config(v_fmt, tables),
        "n_head": n_head,
        "n_head_kv": n_head_kv,
        "head_dim": ROW_SIZE,
        "tokens": tokens,
        "n_sink": n_sink,
        "sink_format": sink_format,
        "gqa": "query head h reads KV head h // (n_head // n_head_kv)",
        "scale": scale,
        "scale_hex": hex_literal(scale, ""),
        "library": _library(),
        "generator": {
            "seed": int(seed),
            "attention_seed": attention_seed,
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
        "score_condition": score_condition,
        "arrays": _array_entries(arrays),
        "sha256_of": "the array's bytes in C order, dtypes as listed (little-endian)",
        "summary": summary,
        "regenerate": f"tbq golden --from-manifest {stem}.json --out DIR",
    }


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------


def load_manifest(manifest: Any) -> dict[str, Any]:
    """A manifest from a path (or the parsed dict itself); :class:`~tbq.errors.TbqValueError` if unreadable."""
    if isinstance(manifest, dict):
        return manifest
    try:
        m = json.loads(Path(manifest).read_text())
    except (OSError, ValueError) as exc:
        raise TbqValueError(f"cannot read the manifest {manifest}: {exc}") from None
    if not isinstance(m, dict):
        raise TbqValueError(f"{manifest} is not a tbq golden manifest (a JSON object)")
    return m


def _tables_from_manifest(m: dict[str, Any]) -> _Tables:
    et = m["generator"]["edge_tables"]
    return _resolve_tables({"tbq4_0": et["tbq4_0_codebook"], "tbq3_0": et["tbq3_0_codebook"]}, et["signs"])
