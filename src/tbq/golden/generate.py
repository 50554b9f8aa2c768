"""Golden sets: build them in memory, write, regenerate from a manifest, verify (the work of ``tbq golden``).

:func:`build_format` and :func:`build_attention` return a :class:`GoldenSet`
(arrays, manifest, header text); :func:`write_set` writes its three files;
:func:`generate` does all of it for a list of formats and attention pairs and
returns a :class:`Summary`. Nothing here prints: progress goes to the
``progress`` callback and the summary table is returned as text.

Why one module of this length: building, writing, regenerating and verifying golden sets share
the per-format and attention builders and the manifest checks; the settings are
:mod:`tbq.golden.settings`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..attention import (
    attention_dequantized,
    attention_rotated,
    encode_kv,
    f32_tolerance,
    score_condition,
)
from ..codecs import Codec, codec_from
from ..errors import ConfigError, TbqTypeError, TbqValueError
from ..formats import config_for, format_name, get_format
from ..parallel import require_memory
from .cheader import c_header
from .families import (
    DEFAULT_SEED,
    FAMILIES,
    ROW_SIZE,
    _check_families,
    _rows_per_family,
    _Tables,
    _tables,
    attention_inputs,
    attention_seed,
    family_seed,
    make_inputs,
)
from .fragility import DEFAULT_K, fragility
from .manifest import (
    MANIFEST_KINDS,
    _exact_config,
    _le,
    _tables_from_manifest,
    attention_manifest,
    format_manifest,
    header_entry,
    load_manifest,
    own_options,
    sha256_array,
)
from .settings import DEFAULT_ATTENTION_PAIRS as DEFAULT_ATTENTION_PAIRS  # re-exported: tbq.golden reads it here
from .settings import (
    GoldenSettings,
    _check_attention_args,
    _check_ulp_floor,
    refuse_keywords_beside,
)
from .settings import golden_formats as golden_formats


@dataclass
class GoldenSet:
    """One golden file set in memory: ``<name>.npz`` arrays, ``<name>.json`` manifest, ``<name>.h`` header."""

    name: str
    arrays: dict[str, Any]
    manifest: dict[str, Any]
    header: str
    summary: list[Any] = field(default_factory=list)


# ---------------------------------------------------------------------------
# memory and the output directory (the settings are checked in tbq.golden.settings)
# ---------------------------------------------------------------------------


#: Peak memory of :func:`generate` per row of 128 values and family, whatever the formats (the inputs
#: and one format's traces and masks at a time), and per row, family and format (what is kept
#: until the end), in bytes; measured with ``ru_maxrss`` (20 KiB and 1.1 KiB), rounded up.
ROW_BYTES, ROW_FORMAT_BYTES = 24 * 1024, 1536
#: Peak memory of one attention set per token and head (query and KV heads), in bytes; measured
#: likewise (about 5 KiB at 128 values per head), rounded up.
ATTENTION_TOKEN_HEAD_BYTES = 6 * 1024


def generate_memory(rows: int, n_families: int, n_formats: int) -> int:
    """Bytes the row sets of :func:`generate` need at their peak (an estimate that errs high)."""
    return int(rows) * int(n_families) * (ROW_BYTES + ROW_FORMAT_BYTES * int(n_formats))


def attention_memory(tokens: int, n_head: int, n_head_kv: int) -> int:
    """Bytes one attention set of :func:`build_attention` needs at its peak (an estimate that errs high)."""
    return int(tokens) * (int(n_head) + int(n_head_kv)) * ATTENTION_TOKEN_HEAD_BYTES


def check_out_dir(out: Any) -> Path:
    """``out`` as a :class:`~pathlib.Path` if it is, or can be created as, a writable directory.

    Raises :class:`~tbq.errors.TbqValueError` otherwise (a regular file on the
    way, no write permission), so that no work is done for nothing. Creates
    nothing.
    """
    p = Path(out)
    existing = p
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = (
            "exists and is not a directory" if existing == p else f"cannot be created: {existing} is not a directory"
        )
        raise TbqValueError(f"output directory {p} {where}")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is not writable" if existing == p else f"cannot be created: {existing} is not writable"
        raise TbqValueError(f"output directory {p} {where}")
    return p


# ---------------------------------------------------------------------------
# one set
# ---------------------------------------------------------------------------


def _codec(fmt: str, tables: _Tables, backend: str | None = "numpy", options: dict[str, Any] | None = None) -> Codec:
    return codec_from(fmt, _exact_config(fmt, tables, options), backend=backend)


def _backend_check(ref_codec: Codec, xb: np.ndarray, data: np.ndarray, decoded: np.ndarray) -> Any:
    """Compare the golden bytes/floats (library default backend) with the NumPy reference backend.

    Returns ``"identical"`` or a dict listing the blocks that differ (and warns):
    the two backends are documented to be byte-identical, so a difference is a
    library defect worth knowing about; the golden files keep the default
    backend's output, which is what ``tbq.quantize`` returns.
    """
    ref = ref_codec.encode(xb).reshape(data.shape)
    enc_bad = np.flatnonzero((ref != data).any(axis=1))
    dec_bad = np.flatnonzero((ref_codec.decode(data).view(np.uint32) != decoded.view(np.uint32)).any(axis=1))
    if not enc_bad.size and not dec_bad.size:
        return "identical"
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
    rows_per_family: int | None = None,
    blocks: int | None = None,
    seed: int = DEFAULT_SEED,
    families: Any = FAMILIES,
    codebook: Any = "lloyd-max",
    signs: Any = "turboq-mtp",
    k: int = DEFAULT_K,
    ulp_floor: float | None = None,
    inputs: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
) -> GoldenSet:
    """The golden set of one format (in memory; :func:`write_set` writes it).

    ``rows_per_family`` (old name ``blocks``) rows of 128 values per family;
    ``inputs`` (from :func:`make_inputs`) reuses rows already drawn;
    ``options``: the format's own options (FP8: ``{"scale": 0.0173}``), recorded
    in the manifest.
    """
    fmt = format_name(fmt)
    fams = _check_families(families)
    rows_per_family = _rows_per_family(rows_per_family, blocks)
    _check_ulp_floor(ulp_floor)
    tables = _tables(codebook, signs)
    own = config_for(fmt, dict(options or {}))
    codec = _codec(fmt, tables, backend=None, options=own)  # what tbq.quantize uses (numba when it imports)
    ref_codec = _codec(fmt, tables, backend="numpy", options=own)
    # the instance's sizes: a format option may change them (vLLM's head_dim), so not the registry's row
    info = codec.info
    if ROW_SIZE % info.block_size:
        given = f" with {own}" if own else ""
        raise ConfigError(
            f"{fmt}: a golden set is rows of {ROW_SIZE} values, one C call per row, and {fmt}'s{given} "
            f"{info.block_size}-value block does not fit one; golden sets hold {', '.join(golden_formats())}"
        )
    if inputs is None:
        inputs = make_inputs(rows_per_family, seed, fams, codebook=tables)
    rows = inputs["x"].shape[0]
    per_row = ROW_SIZE // info.block_size
    xb = np.ascontiguousarray(inputs["x"].reshape(-1, info.block_size))
    # Encode rows of ROW_SIZE values, as the C vectors do (one call per row): a row-rule
    # format (IQ4_NL) depends on earlier blocks of the same row.
    data = codec.encode(inputs["x"]).reshape(-1, info.type_size)  # raises ScaleOverflowError if a scale does not fit
    decoded = codec.decode(data)
    backend_check = _backend_check(ref_codec, inputs["x"], data, decoded) if codec.backend != "numpy" else "numpy only"
    fr = fragility(ref_codec, xb, data, k, ulp_floor, row_blocks=per_row)
    # the floor the format's fragility rule used (formats without one ignore ulp_floor: recorded as 0)
    floor = (
        (codec.format.golden.ulp_floor if ulp_floor is None else float(ulp_floor))
        if codec.format.golden.ulp_floor
        else 0.0
    )
    arrays: dict[str, Any] = {  # (the order of the keys is the order of the stored arrays)
        "input": _le(xb),
        "bytes": data,
        "decoded": _le(decoded),
        "fragile": fr["fragile"],
        "scale_fragile": fr["scale_fragile"],
        "scale_f32": _le(fr["scale_f32"]) if "scale_f32" in fr else None,
        "family": np.repeat(inputs["family"], per_row).astype(np.uint8),
        "kind": np.repeat(inputs["kind"], per_row).astype(np.uint8),
    }
    if arrays["scale_f32"] is None:  # no fp16 scale (f16, bf16, MXFP4, NVFP4)
        del arrays["scale_f32"]
    tol = codec.format.decode_tolerance(data)
    if np.any(tol):  # decoders an FMA build may legitimately change (planar/iso)
        arrays["decode_tolerance"] = _le(np.asarray(tol, np.float32))
    if "norm" in fr:
        arrays["norm"] = _le(fr["norm"])
    arrays.update({key: _le(a) for key, a in codec.format.tables().items()})  # TBQ: centroids, thresholds, signs
    for key in ("input", "decoded", "scale_f32"):
        if key in arrays and not np.isfinite(arrays[key]).all():  # pragma: no cover - cannot happen by construction
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
                "fragile_blocks": int(arrays["scale_fragile"][sl].sum()),  # blocks whose fp16 scale is fragile
            }
        )
    manifest = format_manifest(
        fmt,
        codec=codec,
        tables=tables,
        arrays=arrays,
        rows=rows,
        seed=inputs.get("seed", seed),
        rows_per_family=inputs.get("rows_per_family", rows_per_family),
        fam_info=fam_info,
        k=k,
        ulp_floor=floor,
        backend_check=backend_check,
        summary=summary,
    )
    gs = GoldenSet(fmt, arrays, manifest, "", summary)
    gs.header = c_header(gs)
    manifest["header"] = header_entry(fmt, gs.header)
    return gs


def build_attention(
    k_fmt: str,
    v_fmt: str,
    *,
    seed: int = DEFAULT_SEED,
    tokens: int = GoldenSettings.tokens,
    n_head: int = GoldenSettings.n_head,
    n_head_kv: int = GoldenSettings.n_head_kv,
    n_sink: int = GoldenSettings.n_sink,
    sink_format: str = GoldenSettings.sink_format,
    codebook: Any = "lloyd-max",
    signs: Any = "turboq-mtp",
) -> GoldenSet:
    """The golden set of one attention case: ``attention_<k_fmt>_<v_fmt>``.

    Data from ``default_rng(seed * 1000 + 100)``: ``q`` standard normal
    ``(n_head, 128)``, then K standard normal ``(tokens, n_head_kv, 128)`` with
    channels 5, 37, 64, 111 multiplied by 8, then V standard normal, all
    float32 (:func:`attention_inputs`). Both caches keep their first
    ``n_sink`` tokens in ``sink_format``.
    """
    k_fmt, v_fmt = format_name(k_fmt), format_name(v_fmt)
    _check_attention_args(tokens, n_head, n_head_kv, n_sink, sink_format)
    tables = _tables(codebook, signs)
    aseed = attention_seed(seed)
    q, k, v = attention_inputs(seed, tokens, n_head, n_head_kv)

    def cfg(f: Any) -> Any:
        c = _exact_config(f, tables)
        del c["name"]
        return c

    K, V = encode_kv(
        k, v, k_fmt, v_fmt, n_sink=n_sink, sink_format=sink_format, k_config=cfg(k_fmt), v_config=cfg(v_fmt)
    )
    scale = 1.0 / math.sqrt(ROW_SIZE)
    ref = attention_dequantized(q, K, V)
    rot64 = attention_rotated(q, K, V, dtype=np.float64)
    rot32 = attention_rotated(q, K, V, dtype=np.float32)
    tol = f32_tolerance(q, K, V)
    err64 = float(np.max(np.abs(rot64 - ref)))
    err32 = float(np.max(np.abs(rot32.astype(np.float64) - ref)))
    if err32 > tol or err64 > 1e-12 * max(1.0, float(np.max(np.abs(V.dequantize(np.float64))))):  # pragma: no cover
        raise AssertionError(
            f"attention {k_fmt}/{v_fmt}: the algorithms disagree (f64 {err64:.3g}, f32 {err32:.3g} > {tol:.3g})"
        )
    arrays = {
        "q": _le(q),
        "k_input": _le(k),
        "v_input": _le(v),
        "k_bytes": K.data,
        "v_bytes": V.data,
    }
    if n_sink:
        assert K.sink is not None and V.sink is not None  # KVCache.encode with n_sink >= 1 keeps that many sink tokens
        arrays["k_sink"] = K.sink
        arrays["v_sink"] = V.sink
    arrays.update(out_dequantized=_le(ref), out_rotated_f64=_le(rot64), out_rotated_f32=_le(rot32))
    for name, tb_fmt in (("k", k_fmt), ("v", v_fmt)):
        tabs = _codec(tb_fmt, tables).format.tables()
        for key in ("centroids", "signs1", "signs2"):  # what a fused rotated-domain kernel reads
            if key in tabs:
                arrays[f"{name}_{key}"] = _le(tabs[key])
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
    manifest = attention_manifest(
        k_fmt,
        v_fmt,
        tables=tables,
        arrays=arrays,
        seed=seed,
        attention_seed=aseed,
        tokens=tokens,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_sink=n_sink,
        sink_format=sink_format,
        scale=scale,
        err64=err64,
        err32=err32,
        tol=tol,
        score_condition=score_condition(q, K),
        summary=summary,
    )
    gs = GoldenSet(stem, arrays, manifest, "", summary)
    gs.header = c_header(gs)
    manifest["header"] = header_entry(stem, gs.header)
    return gs


def write_set(gs: GoldenSet, out: Any) -> list[Path]:
    """Write ``<name>.npz``, ``<name>.json`` and ``<name>.h`` into directory ``out`` (created if needed)."""
    out = check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{gs.name}.npz", out / f"{gs.name}.json", out / f"{gs.name}.h"]
    np.savez_compressed(paths[0], **gs.arrays)
    paths[1].write_text(json.dumps(gs.manifest, indent=1) + "\n")
    paths[2].write_text(gs.header)
    return paths


# ---------------------------------------------------------------------------
# many sets
# ---------------------------------------------------------------------------

#: The line under the format table of :meth:`Summary.table`.
SUMMARY_NOTE = (
    "fragile values: the code may be the neighbouring one; fragile scales: blocks whose fp16 scale\n"
    "  may be the neighbouring fp16 value"
)
#: Under the attention table: what its error columns are (the table itself stays within 100 columns).
ATTENTION_NOTE = (
    "f64 err, f32 err: max |fused - dequantized reference| in float64 and float32; f32 tol: the\n"
    "  float32 tolerance (attention.f32_tolerance)"
)


@dataclass
class Summary:
    """What :func:`generate` wrote: per-family rows, attention rows, and the file paths.

    A row's ``fragile_values`` counts values whose code may legitimately be
    the neighbouring one; ``fragile_blocks`` counts blocks whose fp16 *scale*
    may legitimately be the neighbouring fp16 value (the table's "fragile
    scales").
    """

    rows: list[Any]
    attention: list[Any]
    paths: list[Any]

    def table(self) -> str:
        """The summary table: format, family, blocks, values, fragile values, fragile scales (and attention errors)."""
        lines = []
        if self.rows:
            cols = [
                ("format", "format"),
                ("family", "family"),
                ("blocks", "blocks"),
                ("values", "values"),
                ("fragile values", "fragile_values"),
                ("fragile scales", "fragile_blocks"),
            ]
            cells = [[c for c, _ in cols]] + [[str(r[key]) for _, key in cols] for r in self.rows]
            lines += _align(cells, left=2)
            lines.append(SUMMARY_NOTE)
        if self.attention:
            if lines:
                lines.append("")
            cols = [
                ("attention K", "k_format"),
                ("V", "v_format"),
                ("tokens", "tokens"),
                ("heads", "n_head"),
                ("kv heads", "n_head_kv"),
                ("sink", "n_sink"),
                ("sink fmt", "sink_format"),
            ]
            head = [c for c, _ in cols] + ["f64 err", "f32 err", "f32 tol"]
            body = [
                [str(r[key]) for _, key in cols] + [f"{r['err_f64']:.2e}", f"{r['err_f32']:.2e}", f"{r['tol_f32']:.2e}"]
                for r in self.attention
            ]
            lines += _align([head] + body, left=2)
            lines.append(ATTENTION_NOTE)
        return "\n".join(lines)


def _align(cells: Any, left: int) -> list[str]:
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    out = []
    for n, row in enumerate(cells):
        out.append(
            "  ".join(
                c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def generate(
    out: Any,
    *,
    formats: Any = None,
    families: Any = FAMILIES,
    rows_per_family: int | None = None,
    blocks: int | None = None,
    seed: int = DEFAULT_SEED,
    codebook: Any = "lloyd-max",
    signs: Any = "turboq-mtp",
    k: int = DEFAULT_K,
    ulp_floor: float | None = None,
    attention: bool = False,
    attention_pairs: Any = DEFAULT_ATTENTION_PAIRS,
    tokens: int = GoldenSettings.tokens,
    n_head: int = GoldenSettings.n_head,
    n_head_kv: int = GoldenSettings.n_head_kv,
    n_sink: int = GoldenSettings.n_sink,
    sink_format: str = GoldenSettings.sink_format,
    progress: Any = None,
    options: dict[str, Any] | None = None,
    settings: GoldenSettings | None = None,
) -> Summary:
    """Write the golden files of ``formats`` (default: :func:`golden_formats`) into directory ``out``.

    The Python side of ``tbq golden``; parameters mirror the CLI flags:
    ``families`` and ``rows_per_family`` (rows of 128 values per family; old
    name ``blocks``), ``seed``, ``codebook`` / ``signs`` (TBQ tables: a name,
    an integer seed for signs, exact values), ``k`` and ``ulp_floor``
    (fragility), and with ``attention`` one ``attention_<k>_<v>`` set per pair
    of ``attention_pairs`` with ``tokens``, ``n_head``, ``n_head_kv``,
    ``n_sink`` and ``sink_format``. Every argument, and whether ``out`` can be
    written, is checked before any work. ``progress``, if given, is called as
    ``progress(label, done, total)`` after each step (the CLI draws a
    :class:`tbq.progress.Progress` bar with it). ``options``: format options
    (FP8's ``scale``), each going to the formats that take it (one that none of
    ``formats`` takes is an error). Returns a :class:`Summary`
    (``print(summary.table())``). ``settings``: all but ``out`` and ``progress`` at once, a
    :class:`~tbq.golden.settings.GoldenSettings` (then leave their keywords out).
    """
    given: dict[str, Any] = {name: value for name, value in locals().items() if name in _GENERATE_DEFAULTS}
    if settings is None:
        given["rows_per_family"] = _rows_per_family(rows_per_family, blocks)
        s = GoldenSettings(**given)
    else:
        # blocks, the old name of rows_per_family, is no field: given at all, it is given beside the settings
        refuse_keywords_beside(
            {**given, "blocks": blocks}, {**_GENERATE_DEFAULTS, "blocks": None}, "the golden settings"
        )
        s = GoldenSettings.of(settings)
    if progress is not None and not callable(progress):
        raise TbqTypeError(f"progress must be None or a callable progress(label, done, total), got {progress!r}")
    return _generate(out, s, progress)


def _generate(out: Any, s: GoldenSettings, progress: Any) -> Summary:
    """:func:`generate` with its settings checked: the memory and ``out``, then the work."""
    fmts, fams, rows = s.formats, s.families, s.rows_per_family
    pairs = s.attention_pairs if s.attention else ()
    require_memory(
        generate_memory(rows, len(fams), len(fmts)),
        f"{rows:,} rows per family x {len(fams)} families x {len(fmts)} formats",
    )
    if pairs:
        require_memory(
            attention_memory(s.tokens, s.n_head, s.n_head_kv),
            f"an attention set of {s.tokens:,} tokens x {s.n_head} + {s.n_head_kv} heads",
        )
    check_out_dir(out)
    total, done = 1 + len(fmts) + len(pairs), 0

    def step(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(label, done, total)

    inputs = make_inputs(rows, s.seed, fams, codebook=s.tables)
    inputs.update(seed=s.seed, rows_per_family=rows)
    step("inputs")
    rows_out, att, paths = [], [], []
    for fmt in fmts:
        gs = build_format(
            fmt,
            rows_per_family=rows,
            seed=s.seed,
            families=fams,
            codebook=s.tables,
            k=s.k,
            ulp_floor=s.ulp_floor,
            inputs=inputs,
            options=s.options,
        )
        paths += write_set(gs, out)
        rows_out += gs.summary
        step(fmt)
    for kf, vf in pairs:
        gs = build_attention(
            kf,
            vf,
            seed=s.seed,
            tokens=s.tokens,
            n_head=s.n_head,
            n_head_kv=s.n_head_kv,
            n_sink=s.n_sink,
            sink_format=s.sink_format,
            codebook=s.tables,
        )
        paths += write_set(gs, out)
        att += gs.summary
        step(f"attention {kf}/{vf}")
    return Summary(rows_out, att, paths)


#: generate's keyword defaults (a GoldenSettings given with settings= refuses keywords changed from them).
_GENERATE_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(GoldenSettings) if f.init}


def regenerate(manifest: Any, out: Any = None) -> GoldenSet:
    """Rebuild a golden set from its manifest (a path or the parsed dict); write it into ``out`` if given.

    The result's arrays are bit-identical to the original ones (compare
    ``result.manifest["arrays"]`` with the original's SHA-256 entries).
    """
    m = load_manifest(manifest)
    source = "the manifest" if isinstance(manifest, dict) else str(manifest)
    kind = m.get("kind")
    if kind not in MANIFEST_KINDS:
        raise TbqValueError(f"{source} is not a tbq golden manifest (kind {kind!r})")
    if out is not None:
        check_out_dir(out)
    try:
        tables = _tables_from_manifest(m)
        g = m["generator"]
        if kind == "tbq-golden-format":
            fams = [f["name"] for f in g["families"]]
            for f in g["families"]:
                if family_seed(g["seed"], f["name"]) != f["seed"]:
                    raise TbqValueError(
                        f"family {f['name']}: the manifest's seed {f['seed']} does not follow this version's derivation"
                    )
            fmt = m["format"]
            args = dict(
                rows_per_family=g["rows_per_family"],
                seed=g["seed"],
                families=fams,
                codebook=tables,
                k=m["fragility"]["k"],
                ulp_floor=m["fragility"]["ulp_floor"] if get_format(fmt).golden.ulp_floor else None,
                options=own_options(fmt, m["codec_config"], tables),
            )
        else:
            fmts = (m["k_format"], m["v_format"])
            args = dict(
                seed=g["seed"],
                tokens=m["tokens"],
                n_head=m["n_head"],
                n_head_kv=m["n_head_kv"],
                n_sink=m["n_sink"],
                sink_format=m["sink_format"],
                codebook=tables,
            )
    except (KeyError, TypeError) as exc:
        raise TbqValueError(f"{source}: incomplete tbq golden manifest ({type(exc).__name__}: {exc})") from None
    require_memory(manifest_memory(m), f"{source} (regenerating its set)")
    gs = build_format(fmt, **args) if kind == "tbq-golden-format" else build_attention(*fmts, **args)
    if out is not None:
        write_set(gs, out)
    return gs


def manifest_memory(manifest: Any) -> int:
    """Bytes :func:`regenerate` needs for ``manifest`` (a path or the parsed dict), its sizes checked first."""
    m = load_manifest(manifest)
    source = "the manifest" if isinstance(manifest, dict) else str(manifest)
    if m.get("kind") not in MANIFEST_KINDS:
        raise TbqValueError(f"{source} is not a tbq golden manifest (kind {m.get('kind')!r})")
    try:
        if m.get("kind") == "tbq-golden-format":
            g = m["generator"]
            rows = _rows_per_family(g["rows_per_family"], None)
            return generate_memory(rows, len(g["families"]), 1)
        _check_attention_args(m["tokens"], m["n_head"], m["n_head_kv"], m["n_sink"], m["sink_format"])
        return attention_memory(m["tokens"], m["n_head"], m["n_head_kv"])
    except (KeyError, TypeError) as exc:
        raise TbqValueError(f"{source}: incomplete tbq golden manifest ({type(exc).__name__}: {exc})") from None
    except TbqValueError as exc:
        raise TbqValueError(f"{source}: {exc}") from None


def verify(directory: str | os.PathLike[str]) -> list[str]:
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
        if not isinstance(m, dict) or m.get("kind") not in MANIFEST_KINDS:
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
