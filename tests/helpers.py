"""Shared test helpers: conformance data loading and exact comparisons."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data" / "conformance"

#: (conformance file stem, format, TBQ codebook or None)
CONFORMANCE_CASES = [
    ("q8_0__strict", "q8_0", None),
    ("q4_0__strict", "q4_0", None),
    ("tbq4_fork__strict", "tbq4_0", "turboq-mtp"),
    ("tbq4_fitted__strict", "tbq4_0", "lloyd-max"),
    ("tbq3_fixed_fork__strict", "tbq3_0", "turboq-mtp"),
    ("tbq3_fixed_fitted__strict", "tbq3_0", "lloyd-max"),
]

BACKENDS = ("numpy", "numba")


@lru_cache(maxsize=None)
def load_npz(stem: str) -> dict:
    with np.load(DATA / f"{stem}.npz") as z:
        return {k: z[k] for k in z.files}


@lru_cache(maxsize=None)
def tables() -> dict:
    return json.loads((DATA / "tables.json").read_text())


def table_f32(entry: dict) -> np.ndarray:
    return np.array([int(b, 16) for b in entry["float32_bits"]], dtype=np.uint32).view(np.float32)


def codec_config(codebook):
    return {} if codebook is None else {"codebook": codebook}


def assert_bits_equal(a: np.ndarray, b: np.ndarray, what: str = "") -> None:
    """Exact float32 equality by bit pattern (distinguishes -0.0, compares NaN payloads)."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    ua, ub = a.view(np.uint32), b.view(np.uint32)
    bad = np.argwhere(ua != ub)
    assert bad.size == 0, f"{what}: {len(bad)} float32 values differ; first at {tuple(bad[0])}: {a[tuple(bad[0])]!r} != {b[tuple(bad[0])]!r}"


def assert_bytes_equal(a: np.ndarray, b: np.ndarray, what: str = "") -> None:
    assert a.dtype == np.uint8 and b.dtype == np.uint8, (a.dtype, b.dtype)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    bad = np.argwhere(a != b)
    assert bad.size == 0, f"{what}: {len(bad)} bytes differ; first at {tuple(bad[0])}: {a[tuple(bad[0])]:#04x} != {b[tuple(bad[0])]:#04x}"
