"""The definition of done: every strict conformance file, reproduced exactly by both backends."""

import numpy as np
import pytest
from helpers import _NOT_FAMILY_FOLDERS, DATA, assert_bits_equal, conformance_cases, load_npz, table_f32, tables

import tbq
from tbq.codebooks import lloyd_max, named_codebook

# Every strict file is reproduced exactly, both backends, by the format battery
# (tests/helpers.py check_format -> _check_conformance), which each format's
# test module runs. This module checks the data and the tables behind them.


def test_every_conformance_file_belongs_to_a_format_battery():
    """No vector file is left out: each strict file maps to a format that runs the battery."""
    # the top folder and a family's folder of it (turbo/), not the decode-only folders (decode_random/, special/)
    files = [*DATA.glob("*__strict.npz"), *DATA.glob("*/*__strict.npz")]
    stems = {p.relative_to(DATA).with_suffix("").as_posix() for p in files if p.parent.name not in _NOT_FAMILY_FOLDERS}
    stems -= {"tbq3_buggy_vs_fixed__strict"}  # the shift-bug file has its own test
    covered = {stem for fmt in tbq.format_names() for stem, _ in conformance_cases(fmt)}
    assert stems and stems <= covered, sorted(stems - covered)


def test_inputs_match_the_documented_generators():
    """Family rows 0..5 are re-drawn from their documented seeds (guards the data copy)."""
    z = load_npz("inputs")
    x = z["x"]
    rng = np.random.default_rng(2001)
    np.testing.assert_array_equal(x[:256], rng.standard_normal((256, 128), dtype=np.float32))
    assert np.array_equal(np.bincount(z["family"]), [256] * 7)


@pytest.mark.parametrize("bits,key", [(4, "tbq4"), (3, "tbq3")])
def test_lloyd_max_reproduces_fitted_tables_bit_for_bit(bits, key):
    cb = lloyd_max(bits)
    fitted = tables()["fitted"]
    assert_bits_equal(cb.centroids, table_f32(fitted[f"{key}_centroids"]), "centroids")
    assert_bits_equal(cb.thresholds, table_f32(fitted[f"{key}_midpoints"]), "thresholds")
    assert cb.thresholds[(1 << bits) // 2 - 1] == 0.0


def test_fork_tables_distance_from_lloyd_max():
    """How far the turboq-mtp tables are from Lloyd-Max (reported in docs/formats.md).

    4-bit: every centroid within 0.04% (relative). 3-bit: the fork's levels are
    7-9x the Lloyd-Max levels for sigma = 1/sqrt(128).
    """
    rel4 = np.abs(named_codebook("turboq-mtp", 4).centroids / lloyd_max(4).centroids - 1)
    assert rel4.max() < 4e-4
    ratio3 = named_codebook("turboq-mtp", 3).centroids / lloyd_max(3).centroids
    assert ratio3.min() > 7.0 and ratio3.max() < 9.0
