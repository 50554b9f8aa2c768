"""Classification of every block a target got: ``exact``, ``fragile`` or ``wrong``.

- **exact**: identical bytes (encoders) or identical float32 bits (decoders).
- **fragile**: the difference is one a correct kernel with another reduction
  order or fused multiply-adds may legitimately make:

  - encoders (the golden fragility masks, built on the format's trace:
    :meth:`~tbq.formats.Format.fragile_values` and
    :meth:`~tbq.formats.Format.fragile_scales`, the machinery of
    :func:`tbq.golden.fragility`): every differing value code is inside the
    mask and one step from the reference's code; a differing scale ``d`` is
    the neighbouring fp16 value of a block whose scale is fragile, or, for
    rotated formats whose scale is the corrected norm (the trace has
    ``norm``), the scale the target's own (legitimately different) codes
    imply; every other field is identical;
  - decoders: every differing value lies within
    :meth:`~tbq.formats.Format.decode_tolerance` (0 for exact decoders), or
    both values are NaN with different payloads (GPUs return a canonical
    NaN).

- **equivalent** (encoders): different bytes that decode to the same values
  (:meth:`~tbq.formats.capabilities.CheckTraits.equivalent_blocks`: a zero scale with any
  codes, a zero of the other sign); always accepted, counted and shown.
- **tie_rule** (encoders): only value codes differ, each by one step, and
  every one of them sits on an exact tie of the value the format rounds
  (:meth:`~tbq.formats.capabilities.QuantizerTraits.value_table`): another tie rule (to even where
  the spec rounds half away from zero, or the reverse). Accepted unless
  ``exact``, never folded into fragile.
- **undefined** (encoders): a block on which the C reference's behaviour is
  undefined (:meth:`~tbq.formats.capabilities.CheckTraits.undefined_blocks`: 1/d overflows,
  an exponent below range). Accepted unless ``exact``.
- **wrong**: anything else.

Only the blocks that differ are classified, vectorised over the blocks.

>>> import tbq
>>> f = tbq.get_format("q8_0")
>>> x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
>>> ref = f.encode(x)
>>> bad = ref.copy(); bad[0, 5] ^= 0x40  # a code of the first block
>>> [CLASSES[c] for c in classify_encoded(f, x, ref, bad, k=4).cls]
['wrong', 'exact']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..formats import Format
from ..formats.base import ordered_field_code

__all__ = [
    "EXACT",
    "FRAGILE",
    "WRONG",
    "EQUIVALENT",
    "UNDEFINED",
    "TIE_RULE",
    "ACCEPTED",
    "CLASSES",
    "ACCEPTED_UNLESS_EXACT",
    "Classified",
    "classify_encoded",
    "classify_decoded",
    "encoder_trace",
    "value_codes",
    "ordered_code",
    "row_kw",
    "tie_blocks",
]

EXACT, FRAGILE, WRONG, EQUIVALENT, UNDEFINED, TIE_RULE, ACCEPTED = 0, 1, 2, 3, 4, 5, 6
#: Class names, indexed by the class codes :data:`EXACT`, :data:`FRAGILE`, :data:`WRONG`, :data:`EQUIVALENT`,
#: :data:`UNDEFINED`, :data:`TIE_RULE`, :data:`ACCEPTED` (a wrong block waived by ``accept``: a named diagnosis
#: explains it).
CLASSES = ("exact", "fragile", "wrong", "equivalent", "undefined", "tie_rule", "accepted")
#: The classes accepted unless ``exact`` (equivalent blocks are always accepted, wrong ones never).
ACCEPTED_UNLESS_EXACT = (FRAGILE, UNDEFINED, TIE_RULE)
#: Relative width of the window around the scale a rotated format's codes imply (k float32
#: ulps of the norm plus the rounding of the decoded block's norm), in units of 2**-23.
_SCALE_WINDOW_ULPS = 4

#: A format's fields of some blocks, ``{name: array (blocks, m)}`` (:meth:`~tbq.formats.Format.fields`).
Fields = dict[str, NDArray[Any]]
#: A reference encoder's trace, ``{name: array or value}`` (:meth:`~tbq.formats.Format.reference_encode`).
Trace = dict[str, Any]


@dataclass
class Classified:
    """The class of every block (``cls``, uint8) and the flat indices of the blocks that differ (``idx``)."""

    cls: NDArray[np.uint8]
    idx: NDArray[np.intp] = field(
        default_factory=lambda: np.zeros(0, np.int64)
    )  #: flat indices of the differing blocks

    def counts(self) -> tuple[int, ...]:
        """Blocks of each class, in the order of :data:`CLASSES`."""
        return tuple(int(v) for v in np.bincount(self.cls, minlength=len(CLASSES)))


def row_kw(fmt: Format, row_blocks: int) -> dict[str, int]:
    """The keyword a row-rule format's reference encoder needs (``{}`` for the others)."""
    return {"row_blocks": int(row_blocks)} if fmt.row_rule else {}


# ---------------------------------------------------------------------------
# codes
# ---------------------------------------------------------------------------


def ordered_code(a: NDArray[Any], kind: str = "") -> NDArray[np.int64]:
    """Field values as integers where neighbours differ by one (int64): the field kind's own order
    (:func:`tbq.formats.base.ordered_field_code`: integers as they are, ``f16``/``bf16`` by their bits, else float32).

    >>> ordered_code(np.float32([0.0, -0.0, 1.0, 1.0009766]), "f16").tolist()
    [0, -1, 15360, 15361]
    """
    return ordered_field_code(a, kind)


def _layout_kinds(fmt: Format) -> dict[str, str]:
    return {f.name: f.kind for f in fmt.info.layout}


def _flat_fields(fmt: Format, data: NDArray[np.uint8]) -> Fields:
    """``fmt.fields`` of blocks ``data`` (blocks, type_size), every entry shaped (blocks, m)."""
    nb = data.shape[0]
    return {name: np.asarray(v).reshape(nb, -1) for name, v in fmt.fields(data).items()}


def value_codes(fmt: Format, fields: Fields) -> NDArray[np.int64] | None:
    """The per-value code of each block ``(blocks, block_size)`` int64 from flattened fields, or None.

    A field with ``block_size`` entries per block is a value code (the scale
    ``d`` of a 1-value format excepted). Several such fields (a low and a
    high part) are combined, the field with more bits per value in the low
    bits (the widths come from the layout); a combination the layout cannot
    order gives None.
    """
    bs = fmt.block_size
    kinds = _layout_kinds(fmt)
    sizes = {f.name: f.size for f in fmt.info.layout}
    entries = [(n, a) for n, a in fields.items() if a.shape[1] == bs and not (n == "d" and bs == 1 and len(fields) > 1)]
    if not entries:
        return None
    if len(entries) == 1:
        n, a = entries[0]
        return ordered_code(a, kinds.get(n, ""))
    if not all(n in sizes and np.asarray(a).dtype.kind in "iub" for n, a in entries):
        return None
    entries.sort(key=lambda e: -sizes[e[0]])
    code = np.zeros(entries[0][1].shape, np.int64)
    shift = 0
    for n, a in entries:
        code |= a.astype(np.int64) << shift
        shift += max(1, sizes[n] * 8 // bs)
    return code


def _value_names(fmt: Format, fields: Fields) -> set[str]:
    bs = fmt.block_size
    return {n for n, a in fields.items() if a.shape[1] == bs and not (n == "d" and bs == 1 and len(fields) > 1)}


def _neq(a: NDArray[Any], b: NDArray[Any]) -> NDArray[np.bool_]:
    """Elementwise "not the same bits" (floats compared by their float32 pattern: -0 != +0, NaN payloads count)."""
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        return np.asarray(a, np.float32).view(np.uint32) != np.asarray(b, np.float32).view(np.uint32)
    return a != b


# ---------------------------------------------------------------------------
# encoders
# ---------------------------------------------------------------------------


def encoder_trace(
    fmt: Format, x_rows: NDArray[np.float32], blocks: NDArray[np.integer[Any]]
) -> tuple[Trace, NDArray[np.float32]]:
    """The reference trace and input values of the flat ``blocks`` of the rows ``x_rows`` (rows, k).

    The trace is computed on the whole rows that hold them (a row-rule
    block depends on earlier blocks of its row).
    """
    bs = fmt.block_size
    per_row = x_rows.shape[1] // bs
    rows = blocks // per_row
    urows, inv = np.unique(rows, return_inverse=True)
    xb = np.ascontiguousarray(x_rows[urows], np.float32).reshape(-1, bs)
    with np.errstate(all="ignore"):
        _, tr = fmt.reference_encode(xb, **row_kw(fmt, per_row))
    sel = inv.reshape(-1) * per_row + blocks % per_row
    n = xb.shape[0]
    out: Trace = {}
    for key, value in tr.items():
        v = np.asarray(value)
        out[key] = v[sel] if v.ndim and v.shape[0] == n else v
    return out, xb[sel]


def _fragile_scales(fmt: Format, trace: Trace, k: int, nb: int) -> NDArray[np.bool_]:
    try:
        with np.errstate(all="ignore"):
            s = np.asarray(fmt.fragile_scales(trace, k), bool).reshape(-1)
    except KeyError:  # a format without a traced scale
        return np.zeros(nb, bool)
    return s if s.size == nb else np.zeros(nb, bool)


def _implied_scale_ok(
    fmt: Format, trace: Trace, got: NDArray[np.uint8], d_got: NDArray[Any], k: int
) -> NDArray[np.bool_]:
    """Rotated corrected-norm formats: is the target's scale the one its own codes imply?

    The scale is ``d = norm / recon`` with ``recon`` the norm of the block's
    codebook values, so a legitimately different code changes ``d``. The
    target's codes' ``recon`` is the norm of its block decoded at unit scale
    (the rotation is orthonormal); the fp16 scale must round a value within
    ``k + 4`` float32 ulps of ``norm / recon``.
    """
    d_field = next((f for f in fmt.info.layout if f.name == "d" and f.kind == "f16" and f.size == 2), None)
    view = fmt.quantizer.rotated_view(trace)  # (norm, r) of a rotated format, declared by the format
    if d_field is None or view is None:
        return np.zeros(got.shape[0], bool)
    unit = got.copy()
    unit[:, d_field.offset : d_field.offset + 2] = np.array([0x00, 0x3C], np.uint8)  # fp16 1.0
    with np.errstate(all="ignore"):
        y1 = fmt.reference_decode(unit).astype(np.float64)
        recon = np.sqrt((y1 * y1).sum(axis=1))
        implied = np.asarray(view[0], np.float64).reshape(-1) / recon
        w = (k + _SCALE_WINDOW_ULPS) * 2.0**-23
        lo = (implied * (1 - w)).astype(np.float16).astype(np.float64)
        hi = (implied * (1 + w)).astype(np.float16).astype(np.float64)
    d = np.asarray(d_got, np.float64).reshape(-1)
    return np.isfinite(implied) & (d >= np.minimum(lo, hi)) & (d <= np.maximum(lo, hi))


def _field_diffs(fmt: Format, ref: NDArray[np.uint8], got: NDArray[np.uint8]) -> dict[str, Any]:
    """Fields of both sides, per-value codes, and which blocks could still be fragile (a cheap first pass)."""
    nb = ref.shape[0]
    kinds = _layout_kinds(fmt)
    Fr, Fg = _flat_fields(fmt, ref), _flat_fields(fmt, got)
    values = _value_names(fmt, Fr)
    cr, cg = value_codes(fmt, Fr), value_codes(fmt, Fg)
    neq_v = np.zeros((nb, fmt.block_size), bool)
    for n in values:
        neq_v |= _neq(Fr[n], Fg[n])
    code_changed = neq_v.any(axis=1)
    if cr is not None:
        assert cg is not None  # one format's fields of as many blocks: codes on both sides or on neither
        adj = np.abs(cg - cr) == 1
    else:
        adj = np.ones_like(neq_v)
    maybe = ~(neq_v & ~adj).any(axis=1)
    any_field = code_changed.copy()
    d_neq = d_adj = None
    for n in Fr:
        if n in values:
            continue
        neq = _neq(Fr[n], Fg[n]).any(axis=1)
        any_field |= neq
        if n == "d" and Fr[n].shape[1] == 1:
            kind = kinds.get("d", "f16")
            d_neq = neq
            d_adj = (np.abs(ordered_code(Fg[n], kind) - ordered_code(Fr[n], kind)) == 1).reshape(-1)
            implied = code_changed if (fmt.info.rotated and fmt.info.layout) else np.zeros(nb, bool)
            maybe &= ~neq | d_adj | implied
        else:
            maybe &= ~neq
    maybe &= any_field  # bytes that differ where no field reads them are wrong
    return dict(Fr=Fr, Fg=Fg, neq_v=neq_v, adj=adj, code_changed=code_changed, d_neq=d_neq, d_adj=d_adj, maybe=maybe)


def classify_encoded_blocks(
    fmt: Format,
    trace: Trace,
    ref: NDArray[np.uint8],
    got: NDArray[np.uint8],
    k: int,
    diffs: dict[str, Any] | None = None,
) -> NDArray[np.uint8]:
    """Classes of blocks whose bytes differ: ``ref``/``got`` uint8 (blocks, type_size), ``trace`` of those blocks."""
    nb = ref.shape[0]
    if nb == 0:
        return np.zeros(0, np.uint8)
    f = diffs if diffs is not None else _field_diffs(fmt, ref, got)
    ok = f["maybe"].copy()
    with np.errstate(all="ignore"):
        fragile_v = np.asarray(fmt.fragile_values(trace, k), bool).reshape(nb, -1)
    ok &= ~(f["neq_v"] & ~(fragile_v & f["adj"])).any(axis=1)
    if f["d_neq"] is not None:
        neq = f["d_neq"]
        okd = ~neq | (_fragile_scales(fmt, trace, k, nb) & f["d_adj"])
        if fmt.quantizer.rotated_view(trace) is not None:
            okd |= neq & f["code_changed"] & _implied_scale_ok(fmt, trace, got, f["Fg"]["d"], k)
        ok &= okd
    return np.where(ok, FRAGILE, WRONG).astype(np.uint8)


def classify_encoded(
    fmt: Format, x_rows: NDArray[np.float32], ref: NDArray[np.uint8], got: NDArray[np.uint8], k: int
) -> Classified:
    """Classify every block of an encoder's rows: ``x_rows`` float32 (rows, n), ``ref``/``got`` uint8 (rows, bytes).

    A cheap pass over the fields first: a block whose codes differ by more
    than one step, or whose other fields differ, is wrong without a trace;
    only the rest get the reference trace and the fragility masks.
    """
    ts = fmt.type_size
    rb = np.ascontiguousarray(ref).reshape(-1, ts)
    gb = np.ascontiguousarray(got).reshape(-1, ts)
    cls = np.zeros(rb.shape[0], np.uint8)
    idx = np.flatnonzero((rb != gb).any(axis=1))
    if not idx.size:
        return Classified(cls)
    cls[idx] = WRONG
    gb = _follow_derived(fmt, x_rows, idx, rb, gb)
    f = _field_diffs(fmt, rb[idx], gb[idx])
    cand = np.flatnonzero(f["maybe"])
    if cand.size:
        sub = {
            key: (v[cand] if isinstance(v, np.ndarray) and v.shape[:1] == (idx.size,) else v)
            for key, v in f.items()
            if key not in ("Fr", "Fg")
        }
        sub["Fr"] = {n: v[cand] for n, v in f["Fr"].items()}
        sub["Fg"] = {n: v[cand] for n, v in f["Fg"].items()}
        trace, _ = encoder_trace(fmt, np.ascontiguousarray(x_rows, np.float32), idx[cand])
        cls[idx[cand]] = classify_encoded_blocks(fmt, trace, rb[idx[cand]], gb[idx[cand]], k, sub)
    cls[idx] = _accepted_kinds(fmt, x_rows, idx, rb[idx], gb[idx], cls[idx])
    return Classified(cls, idx)


def _follow_derived(
    fmt: Format, x_rows: NDArray[np.float32], idx: NDArray[np.intp], rb: NDArray[np.uint8], gb: NDArray[np.uint8]
) -> NDArray[np.uint8]:
    """The target's bytes with each derived field (:attr:`~tbq.formats.base.Field.derived`) that is what the target's
    own codes give replaced by the reference's, so that the rest is classified as usual (q8_1's ``s`` follows a
    code one step off at a tie); a derived field that is not what its codes give stays, and makes the block wrong."""
    cols = [np.arange(fl.offset, fl.offset + fl.size) for fl in fmt.info.layout if fl.derived]
    if not cols:
        return gb
    trace, _ = encoder_trace(fmt, np.ascontiguousarray(x_rows, np.float32), idx)
    own = fmt.checker.derived(gb[idx], trace)
    if own is None:
        return gb
    c = np.concatenate(cols)
    consistent = (np.asarray(own)[:, c] == gb[idx][:, c]).all(axis=1)
    out = gb.copy()
    rows = idx[consistent]
    out[np.ix_(rows, c)] = rb[np.ix_(rows, c)]
    return out


def tie_blocks(fmt: Format, trace: Trace, ref: NDArray[np.uint8], got: NDArray[np.uint8]) -> NDArray[np.bool_]:
    """bool (blocks,): blocks whose only difference is value codes one step apart, every one on an exact tie.

    A tie: the value the format rounds (:meth:`~tbq.formats.capabilities.QuantizerTraits.value_table`) lies exactly halfway between
    two neighbouring levels, so that another tie rule picks the other one.
    """
    nb = ref.shape[0]
    vt = fmt.quantizer.value_table(trace)
    if vt is None or nb == 0:
        return np.zeros(nb, bool)
    levels, v = vt
    lv = np.unique(np.asarray(levels, np.float64))
    v = np.asarray(v, np.float64)
    if v.size != nb * fmt.block_size or lv.size < 2:
        return np.zeros(nb, bool)
    v = v.reshape(nb, fmt.block_size)
    Fr, Fg = _flat_fields(fmt, ref), _flat_fields(fmt, got)
    cr, cg = value_codes(fmt, Fr), value_codes(fmt, Fg)
    if cr is None:
        return np.zeros(nb, bool)
    assert cg is not None  # one format's fields of as many blocks: codes on both sides or on neither
    values = _value_names(fmt, Fr)
    others_same = np.ones(nb, bool)
    for n in Fr:
        if n not in values:
            others_same &= ~_neq(Fr[n], Fg[n]).any(axis=1)
    diff = cr != cg
    with np.errstate(all="ignore"):
        j = np.clip(np.searchsorted(lv, v, side="right"), 1, lv.size - 1)
        lo, hi = lv[j - 1], lv[j]
        on_tie = np.isfinite(v) & (v * 2 == lo + hi) & (v > lo) & (v < hi)
    ok = ~(diff & ~(on_tie & (np.abs(cg - cr) == 1))).any(axis=1)
    return others_same & diff.any(axis=1) & ok


def _accepted_kinds(
    fmt: Format,
    x_rows: NDArray[np.float32],
    idx: NDArray[np.intp],
    rb: NDArray[np.uint8],
    gb: NDArray[np.uint8],
    cls: NDArray[np.uint8],
) -> NDArray[np.uint8]:
    """Differing blocks that are equivalent, another tie rule or undefined in C, out of the fragile and wrong ones."""
    out = cls.copy()
    with np.errstate(all="ignore"):
        eq = np.asarray(fmt.checker.equivalent_blocks(rb, gb), bool).reshape(-1)
    out[eq] = EQUIVALENT
    rest = np.flatnonzero(~eq)
    if not rest.size:
        return out
    trace, _ = encoder_trace(fmt, np.ascontiguousarray(x_rows, np.float32), idx[rest])
    with np.errstate(all="ignore"):
        ties = tie_blocks(fmt, trace, rb[rest], gb[rest])
        undef = np.asarray(fmt.checker.undefined_blocks(trace)[0], bool).reshape(-1)
    if undef.size != rest.size:
        undef = np.zeros(rest.size, bool)
    out[rest[ties]] = TIE_RULE
    out[rest[undef & ~ties]] = UNDEFINED
    return out


# ---------------------------------------------------------------------------
# decoders
# ---------------------------------------------------------------------------


def classify_decoded(
    fmt: Format, data: NDArray[np.uint8], ref_y: NDArray[np.float32], got_y: NDArray[np.float32]
) -> Classified:
    """Classify every block of a decoder's rows: ``data`` uint8 (rows, bytes), ``ref_y``/``got_y`` float32 (rows, n)."""
    ts, bs = fmt.type_size, fmt.block_size
    db = np.ascontiguousarray(data).reshape(-1, ts)
    r = np.ascontiguousarray(ref_y, np.float32).reshape(-1, bs)
    g = np.ascontiguousarray(got_y, np.float32).reshape(-1, bs)
    neq = r.view(np.uint32) != g.view(np.uint32)
    cls = np.zeros(db.shape[0], np.uint8)
    idx = np.flatnonzero(neq.any(axis=1))
    if not idx.size:
        return Classified(cls)
    rest = neq[idx] & ~(np.isnan(r[idx]) & np.isnan(g[idx]))  # NaN vs NaN (another payload) is fragile
    ok = ~rest.any(axis=1)
    tol = np.asarray(fmt.decode_tolerance(db[idx]), np.float32).reshape(idx.size, bs)
    need = np.flatnonzero(~ok & (tol > 0).any(axis=1))
    if need.size:
        with np.errstate(all="ignore"):
            r64, g64 = r[idx[need]].astype(np.float64), g[idx[need]].astype(np.float64)
            within = np.isfinite(r64) & np.isfinite(g64) & (np.abs(g64 - r64) <= tol[need].astype(np.float64))
        ok[need] = ~(rest[need] & ~within).any(axis=1)
    cls[idx] = np.where(ok, FRAGILE, WRONG)
    return Classified(cls, idx)
