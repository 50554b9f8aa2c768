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
- ``<fmt>.h``: a self-contained C/C++ header with ``#define`` lines and
  ``static const`` arrays (exact hex-float literals).

Inputs are rows of 128 values for every format (so a Q8_0/Q4_0 row is 4
blocks of 32, a TBQ row 1 block of 128) and every format encodes the *same*
rows. ``rows_per_family`` (CLI ``--rows-per-family``, old name ``blocks`` /
``--blocks``) is the number of 128-value rows per family; a format's block
count is ``rows * 128 / block_size``.

Family ``f`` (index ``i`` in :data:`FAMILIES`, whichever subset is requested)
draws from ``numpy.random.default_rng(seed * 1000 + 1 + i)`` (PCG64); the
attention data from ``default_rng(seed * 1000 + 100)``. See
``docs/golden-vectors.md`` for how a kernel test uses the files.

The package, bottom to top (each module imports only those above it in this list):

- :mod:`~tbq.golden.families`: input families, edge kinds, seeds,
  :func:`make_inputs`, the attention data, TBQ table resolution;
- :mod:`~tbq.golden.manifest`: manifest building and loading, SHA-256 of
  arrays, :func:`hex_literal`, exact tables as JSON;
- :mod:`~tbq.golden.cheader`: the C header writer :func:`c_header`;
- :mod:`~tbq.golden.fragility`: :func:`fragility` masks, built on each
  format's trace (:meth:`tbq.formats.Format.reference_encode`);
- :mod:`~tbq.golden.generate`: :func:`build_format`, :func:`build_attention`,
  :class:`GoldenSet`, :func:`write_set`, :class:`Summary`, :func:`generate`,
  :func:`regenerate`, :func:`verify`.

The functions :func:`fragility` and :func:`generate` share their names with
their modules, so ``tbq.golden.fragility`` is the function; reach a module
with ``from tbq.golden.fragility import ...`` or :func:`importlib.import_module`.

Nothing here prints; ``tbq golden``'s arguments and output are in
:mod:`tbq.cli.golden`.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     s = generate(d, formats=["q4_0"], families=["gaussian"], rows_per_family=2)
...     sorted(p.name for p in __import__("pathlib").Path(d).iterdir())
['q4_0.h', 'q4_0.json', 'q4_0.npz']
>>> s.rows[0]["format"], s.rows[0]["blocks"]
('q4_0', 8)
"""

from __future__ import annotations

from ..formats.tbq import TBQ_ULP_FLOOR
from .cheader import c_header
from .families import (
    ATTENTION_KEY_OUTLIER_FACTOR,
    DEFAULT_BLOCKS,
    DEFAULT_ROWS_PER_FAMILY,
    DEFAULT_SEED,
    EDGE_KINDS,
    FAMILIES,
    FAMILY_GENERATORS,
    OUTLIER_CHANNELS,
    OUTLIER_FACTOR,
    ROW_SIZE,
    attention_inputs,
    attention_seed,
    family_seed,
    make_inputs,
)
from .fragility import DEFAULT_K, fragility
from .generate import (
    DEFAULT_ATTENTION_PAIRS,
    GoldenSet,
    Summary,
    attention_memory,
    build_attention,
    build_format,
    check_out_dir,
    generate,
    generate_memory,
    golden_formats,
    manifest_memory,
    regenerate,
    verify,
    write_set,
)
from .manifest import (
    FORMAT_ARRAYS,
    MANIFEST_KINDS,
    TBQ_ARRAYS,
    hex_literal,
    load_manifest,
    sha256_array,
)
from .settings import GoldenSettings

__all__ = [
    "FAMILIES",
    "EDGE_KINDS",
    "FORMAT_ARRAYS",
    "DEFAULT_BLOCKS",
    "DEFAULT_ROWS_PER_FAMILY",
    "DEFAULT_K",
    "DEFAULT_SEED",
    "DEFAULT_ATTENTION_PAIRS",
    "ROW_SIZE",
    "OUTLIER_CHANNELS",
    "OUTLIER_FACTOR",
    "ATTENTION_KEY_OUTLIER_FACTOR",
    "FAMILY_GENERATORS",
    "MANIFEST_KINDS",
    "TBQ_ARRAYS",
    "TBQ_ULP_FLOOR",
    "GoldenSet",
    "GoldenSettings",
    "Summary",
    "family_seed",
    "attention_seed",
    "make_inputs",
    "attention_inputs",
    "fragility",
    "build_format",
    "build_attention",
    "c_header",
    "hex_literal",
    "sha256_array",
    "load_manifest",
    "check_out_dir",
    "write_set",
    "generate",
    "generate_memory",
    "golden_formats",
    "attention_memory",
    "manifest_memory",
    "regenerate",
    "verify",
]
