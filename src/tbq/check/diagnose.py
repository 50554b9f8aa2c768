"""Pattern diagnoses of wrong blocks: what kind of bug the differences point to, with the evidence.

Each diagnosis looks at every wrong block kept by the check (up to
:data:`KEEP_BLOCKS` per direction) and reports only what its evidence shows,
with the numbers that show it. They key on the format's layout (field kinds
and offsets), its ``info`` and its ``tables()``, never on its name:

encoders
    - ``shift_bug_3bit`` (``u3_lanes`` fields): codes 3-7 of every 8-value
      group differ and bytes 1-2 of the 24-bit lanes are never written; the
      fork's buggy packer applied to tbq's codes reproduces the bytes;
    - ``nibble_order`` (``u4_halves`` / ``u4_pairs`` fields): another nibble
      order (low/high swapped, split halves vs adjacent pairs) reads the
      target's bytes as tbq's codes;
    - ``scale_ulp``: every differing scale is one fp16 step away and the
      codes are equal or fragile (FMA contraction, another reduction order);
    - ``scale_conversion``: the scale bits are tbq's float32 scale converted
      another way (truncated fp16, bfloat16, subnormals flushed);
    - ``tie_rounding``: every differing code sits on an exact tie of a traced
      intermediate (``x * id = k + 1/2``);
    - ``rotated_sign`` / ``input_sign`` (rotated formats): the codes of fixed
      rotated coordinates are mirrored, or the bytes are tbq's for the input
      with one value negated: a sign table differs;
    - ``permutation``: the codes are tbq's codes in another order;

decoders
    - ``nibble_order``: tbq's decoder gives the target's values after
      reading the nibbles in another order;
    - ``decoder_ulp``: every differing value is within a few float32 ulps;
    - ``signed_zero``: only the sign of zeros differs;
    - ``special_scales`` / ``flush_to_zero``: only blocks whose fp16 scale is
      Inf/NaN, or subnormal (decoded as zeros), differ;
    - ``output_sign`` / ``rotated_sign``: values (or rotated coordinates) at
      fixed positions have the wrong sign;
    - ``scale_factor``: the decoded block is tbq's times one factor per block.

The round-trip diagnosis ("the target's own encode/decode round trip agrees,
but decoding tbq's bytes does not") and the unwritten-bytes diagnosis need the
target and are made by :mod:`tbq.check.runner`.

>>> Diagnosis("demo", "a title", ["one fact"]).text()
'a title\\n    - one fact'

Why one module of this length: it is the one catalogue of named diagnoses (the encoder's and
the decoder's), each a pattern over the same kept blocks read with the same code readers and
evidence helpers, and ``tbq check --accept`` names them from this one list; the next cut, when it
grows, is one module per direction over a shared module of readers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..formats import Field, Format
from ..packing import pack4_halves, pack4_pairs, unpack3, unpack4_halves, unpack4_pairs
from .classify import CLASSES, Fields, _flat_fields, _neq, ordered_code, row_kw, value_codes
from .targets import FILL_BYTE

__all__ = [
    "Diagnosis",
    "Kept",
    "KEEP_BLOCKS",
    "DIAGNOSES",
    "select_kept",
    "diagnose_encoder",
    "diagnose_decoder",
    "diagnose_fragile",
    "diagnose_accepted",
    "describe_differences",
    "describe_values",
]

#: Failing blocks kept per direction for the diagnoses and the report.
KEEP_BLOCKS = 4096
#: The names of the diagnoses a check makes (what ``accept`` may name).
DIAGNOSES = (
    "shift_bug_3bit",
    "nibble_order",
    "scale_ulp",
    "scale_conversion",
    "tie_rounding",
    "rotated_sign",
    "input_sign",
    "permutation",
    "decoder_ulp",
    "signed_zero",
    "special_scales",
    "flush_to_zero",
    "output_sign",
    "codebook",
    "scale_factor",
    "round_trip",
    "unwritten",
    "format_options",
)
#: Share of the evidence that must agree before a pattern is named.
AGREE = 0.9

#: Kept blocks as :meth:`Kept.get` gives them: ``cls``, ``where`` (a list of ``(phase, block)``), the arrays
#: ``x``/``data``, ``ref``, ``got`` and the ``trace`` dict; their kinds differ, so the values are Any.
KeptBlocks = dict[str, Any]


@dataclass
class Diagnosis:
    """A recognised pattern: ``name`` (stable id), ``title`` (one line), ``evidence`` (facts that show it)."""

    name: str
    title: str
    evidence: list[str] = field(default_factory=list)
    direction: str = ""
    scope: str = "wrong"  #: the blocks it describes: "wrong", or "fragile" (a pattern hidden inside the fragility mask)

    def text(self) -> str:
        return "\n".join([self.title] + [f"    - {e}" for e in self.evidence])

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "direction": self.direction,
            "scope": self.scope,
            "title": self.title,
            "evidence": list(self.evidence),
        }


class Kept:
    """Failing blocks of one direction, kept for the diagnoses (at most :data:`KEEP_BLOCKS`).

    Encoders: ``x`` (inputs), ``ref``/``got`` (bytes), ``trace``; decoders:
    ``data`` (input bytes), ``ref``/``got`` (floats). ``cls`` holds each
    block's class, ``where`` its ``(phase, block)``.
    """

    def __init__(self) -> None:
        self.parts: list[dict[str, Any]] = []
        self.n = 0

    @property
    def room(self) -> int:
        """How many more blocks it keeps."""
        return max(0, KEEP_BLOCKS - self.n)

    def add(self, cls: NDArray[np.uint8], where: Sequence[tuple[str, int]], **arrays: Any) -> None:
        room = KEEP_BLOCKS - self.n
        if room <= 0 or not cls.size:
            return
        take = slice(0, min(room, cls.size))
        part: dict[str, Any] = {"cls": cls[take], "where": where[take]}
        for key, a in arrays.items():
            if isinstance(a, dict):
                part[key] = {k: (v[take] if np.ndim(v) and np.shape(v)[0] == cls.size else v) for k, v in a.items()}
            else:
                part[key] = None if a is None else a[take]
        self.parts.append(part)
        self.n += part["cls"].size

    def get(self, which: str = "wrong") -> KeptBlocks:
        """The kept blocks as arrays (``{}`` when none): ``which`` is a class name (:data:`~tbq.check.classify.CLASSES`)
        or ``"all"``."""
        if not self.parts:
            return {}
        out: KeptBlocks = {}
        for key in self.parts[0]:
            vals = [p[key] for p in self.parts]
            if key == "where":
                out[key] = [w for v in vals for w in v]
            elif isinstance(vals[0], dict):
                keys = [k for k in vals[0] if all(k in v for v in vals)]
                out[key] = {k: _cat([v[k] for v in vals]) for k in keys}
            elif vals[0] is None:
                out[key] = None
            else:
                out[key] = np.concatenate(vals)
        if which != "all":
            sel = np.flatnonzero(out["cls"] == CLASSES.index(which))
            out = _select(out, sel)
        return out if out["cls"].size else {}


def _cat(vals: list[Any]) -> Any:
    """The kept parts of one trace entry joined, or the first part's value where they do not join (a scalar)."""
    if all(np.ndim(v) for v in vals):
        try:
            return np.concatenate(vals)
        except ValueError:
            return vals[0]
    return vals[0]


def select_kept(d: KeptBlocks, sel: NDArray[np.intp]) -> KeptBlocks:
    """The blocks ``sel`` (indices) of kept blocks ``d`` (from :meth:`Kept.get`)."""
    return _select(d, sel)


def _select(d: KeptBlocks, sel: NDArray[np.intp]) -> KeptBlocks:
    n = d["cls"].size
    out: KeptBlocks = {}
    for key, v in d.items():
        if key == "where":
            out[key] = [v[i] for i in sel]
        elif isinstance(v, dict):
            out[key] = {k: (a[sel] if np.ndim(a) and np.shape(a)[0] == n else a) for k, a in v.items()}
        elif v is None:
            out[key] = None
        else:
            out[key] = v[sel]
    return out


def percent(a: float) -> str:
    return f"{100 * a:.0f}%"


def _positions(positions: Iterable[int | np.integer[Any]]) -> str:
    ps = [int(p) for p in positions]
    return ", ".join(map(str, ps[:12])) + (", ..." if len(ps) > 12 else "")


# ---------------------------------------------------------------------------
# what differs (not a diagnosis: the facts every report shows)
# ---------------------------------------------------------------------------


def describe_differences(fmt: Format, direction: str, kept: KeptBlocks) -> list[str]:
    """One line per field (encoders) or one line (decoders) saying what differs in the wrong blocks."""
    if not kept:
        return []
    n = kept["cls"].size
    if direction == "dequantize":
        neq = kept["ref"].view(np.uint32) != kept["got"].view(np.uint32)
        return [
            f"{n} wrong blocks: {int(neq.sum())} of {neq.size} decoded values differ "
            f"(per block: median {int(np.median(neq.sum(1)))}, at most {int(neq.sum(1).max())})"
        ]
    Fr, Fg = _flat_fields(fmt, kept["ref"]), _flat_fields(fmt, kept["got"])
    lines = []
    for name in Fr:
        a, b = Fr[name], Fg[name]
        neq = _neq(a, b)
        nb = int(neq.any(1).sum())
        if not nb:
            lines.append(f"{name}: identical in all {n} wrong blocks")
        elif a.shape[1] == 1:
            lines.append(f"{name}: differs in {nb} of {n} wrong blocks")
        else:
            lines.append(f"{name}: differs in {nb} of {n} wrong blocks ({int(neq.sum())} of {neq.size} entries)")
    return lines


# ---------------------------------------------------------------------------
# encoders
# ---------------------------------------------------------------------------


def _fork_pack3(idx: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """The fork's buggy 3-bit packer (docs/formats.md, "The 3-bit shift bug"), on x86: nothing reaches bytes 1-2."""
    lanes = idx.reshape(idx.shape[0], -1, 8).astype(np.uint32)
    out = np.zeros(lanes.shape[:-1] + (3,), np.uint32)
    for t in range(8):
        bit = 3 * t
        out[..., 0] |= (lanes[..., t] << (bit if bit < 8 else 0)) & 0xFF
    return out.astype(np.uint8).reshape(idx.shape[0], -1)


def _differing_fields(
    fmt: Format, kept: KeptBlocks, kinds: Iterable[str]
) -> Iterator[tuple[Field, NDArray[np.intp], NDArray[np.uint8], NDArray[np.uint8]]]:
    """Each field of a kind in ``kinds`` whose bytes differ in some kept block of an encoder: ``(field, those
    blocks, tbq's bytes of the field in them, the target's)``."""
    for f in fmt.info.layout:
        if f.kind not in kinds:
            continue
        R = kept["ref"][:, f.offset : f.offset + f.size]
        G = kept["got"][:, f.offset : f.offset + f.size]
        rows = np.flatnonzero((R != G).any(axis=1))
        if rows.size:
            yield f, rows, R[rows], G[rows]


def _shift_bug(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    for f, rows, R, G in _differing_fields(fmt, kept, ("u3_lanes",)):
        cr, cg = unpack3(R, backend="numpy"), unpack3(G, backend="numpy")
        neq = (cr != cg).reshape(rows.size, -1, 8)
        per_t = neq.sum(axis=(0, 1))
        total = int(per_t.sum())
        late = per_t[3:].sum() / total if total else 0.0
        lg, lr = G.reshape(rows.size, -1, 3), R.reshape(rows.size, -1, 3)
        ref_high = (lr[..., 1:] != 0).any(-1)
        unwritten = ((lg[..., 1:] == 0) | (lg[..., 1:] == FILL_BYTE)).all(-1)
        high_lost = unwritten[ref_high].mean() if ref_high.any() else 0.0
        repro = (_fork_pack3(cr) == G).all(axis=1)
        if not (repro.mean() >= AGREE or (late >= 0.8 and high_lost >= AGREE)):
            continue
        groups = neq.shape[0] * neq.shape[1]
        ev = [
            f"differing {f.name} codes by position t in the 8-value group, t = 0..7: {per_t.tolist()} over {groups} groups "
            f"of {rows.size} wrong blocks; t = 3..7 hold {percent(late)} of them",
            f"bytes 1 and 2 of {percent(high_lost)} of the 24-bit lanes that tbq writes non-zero are 0 "
            f"(or the unwritten fill 0x{FILL_BYTE:02X}) in the target's output",
        ]
        if repro.any():
            ev.append(
                f"the fork's buggy packer (qs[0] |= idx << (bit < 8 ? bit : 0); for bit >= 8 qs[1] |= idx >> (8 - bit), "
                f"a negative shift) applied to tbq's codes reproduces the target's bytes in {int(repro.sum())} of {rows.size} blocks"
            )
        differing = [t for t in range(8) if per_t[t]]
        title = (
            f'3-bit packer shift bug (docs/formats.md, "The 3-bit shift bug"): codes {_positions(differing)} of the '
            f"8-value groups differ, {percent(late)} of them at t = 3..7; bytes 1-2 of {percent(high_lost)} of the "
            "24-bit lanes are not written"
        )
        if repro.any():
            title += f"; the fork's buggy packer reproduces {int(repro.sum())} of {rows.size} wrong blocks"
        return Diagnosis("shift_bug_3bit", title, ev)
    return None


_READ4: dict[str, Callable[[NDArray[np.uint8]], NDArray[np.uint8]]] = {
    "u4_halves": lambda b: unpack4_halves(b, backend="numpy"),
    "u4_pairs": lambda b: unpack4_pairs(b, backend="numpy"),
}
_PACK4: dict[str, Callable[[NDArray[np.uint8]], NDArray[np.uint8]]] = {
    "u4_halves": lambda q: pack4_halves(q, backend="numpy"),
    "u4_pairs": lambda q: pack4_pairs(q, backend="numpy"),
}
_LAYOUT4 = {
    ("u4_halves", False): "byte j = q[j] | q[j+16] << 4 (split halves)",
    ("u4_halves", True): "byte j = q[j+16] | q[j] << 4 (split halves, high and low nibbles swapped)",
    ("u4_pairs", False): "byte j = q[2j] | q[2j+1] << 4 (adjacent pairs)",
    ("u4_pairs", True): "byte j = q[2j+1] | q[2j] << 4 (adjacent pairs, high and low nibbles swapped)",
}


def _swap_nibbles(b: NDArray[np.uint8]) -> NDArray[np.uint8]:
    return ((b >> 4) | (b << 4)).astype(np.uint8)


def _nibble_alternatives(kind: str) -> list[tuple[str, bool]]:
    other = "u4_pairs" if kind == "u4_halves" else "u4_halves"
    return [(kind, True), (other, False), (other, True)]


def _nibble_title(kind: str, alt_kind: str, swap: bool) -> str:
    if alt_kind == kind:
        return "nibble order swapped: high and low nibbles are exchanged"
    return (
        f"nibble order swapped: {'adjacent pairs' if alt_kind == 'u4_pairs' else 'split halves'} instead of "
        f"{'split halves' if kind == 'u4_halves' else 'adjacent pairs'}" + (", high and low exchanged" if swap else "")
    )


def _nibble_order(f: Field, alt_kind: str, swap: bool, finding: str) -> Diagnosis:
    """The ``nibble_order`` diagnosis of 4-bit field ``f`` stored as ``alt_kind`` (nibbles swapped or not): what
    reading it that way reproduced (``finding``, each direction's own evidence), then the layout the format stores."""
    ev = [finding, f"the format stores {_LAYOUT4[(f.kind, False)]}"]
    return Diagnosis("nibble_order", _nibble_title(f.kind, alt_kind, swap), ev)


def _nibble_encoder(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    for f, rows, R, G in _differing_fields(fmt, kept, _READ4):
        cr = _READ4[f.kind](R)
        for alt, swap in _nibble_alternatives(f.kind):
            G2 = _swap_nibbles(G) if swap else G
            match = (_READ4[alt](G2) == cr).all(axis=1)
            if match.mean() >= AGREE:
                return _nibble_order(
                    f,
                    alt,
                    swap,
                    f"reading the target's {f.name} bytes as {_LAYOUT4[(alt, swap)]} gives exactly tbq's codes in "
                    f"{int(match.sum())} of {rows.size} wrong blocks whose {f.name} differs",
                )
    return None


def _fp16_step(d_ref: NDArray[Any], d_got: NDArray[Any], kind: str = "f16") -> NDArray[np.int64]:
    return np.abs(ordered_code(d_got, kind) - ordered_code(d_ref, kind)).reshape(-1)


def _scale_ulp(fmt: Format, kept: KeptBlocks, k: int) -> Diagnosis | None:
    if "d" not in kept.get("trace", {}):
        return None
    Fr, Fg = _flat_fields(fmt, kept["ref"]), _flat_fields(fmt, kept["got"])
    if "d" not in Fr or Fr["d"].shape[1] != 1:
        return None
    kind = {f.name: f.kind for f in fmt.info.layout}.get("d", "f16")
    dneq = (Fr["d"].view(np.uint32) != Fg["d"].view(np.uint32)).reshape(-1)
    if not dneq.any():
        return None
    step = _fp16_step(Fr["d"], Fg["d"], kind)[dneq]
    if not (step == 1).all():
        return None
    cr, cg = value_codes(fmt, Fr), value_codes(fmt, Fg)
    if cr is not None:
        assert cg is not None  # one format's fields of as many blocks: codes on both sides or on neither
        with np.errstate(all="ignore"):
            fragile = np.asarray(fmt.fragile_values(kept["trace"], k), bool).reshape(cr.shape)
        codes_ok = ~((cr != cg) & ~(fragile & (np.abs(cr - cg) == 1))).any(axis=1)
        if not codes_ok[dneq].all():
            return None
    for n in Fr:  # every other field must agree
        if n != "d" and (cr is None or Fr[n].shape[1] != fmt.block_size) and (Fr[n] != Fg[n]).any():
            return None
    # how far the target's float32 d must have been from tbq's to round to its fp16 value
    d32 = np.asarray(kept["trace"]["d"], np.float64).reshape(-1)[dneq]
    dg = Fg["d"].reshape(-1)[dneq].astype(np.float64)
    with np.errstate(all="ignore"):
        h = dg.astype(np.float16)
        back = np.where(dg > d32, -np.inf, np.inf).astype(np.float16)  # toward tbq's side
        nb = np.nextafter(h, back).astype(np.float64)  # the neighbouring fp16 value on tbq's side
        boundary = (dg + nb) / 2
        ulps = np.ceil(np.abs(boundary - d32) / np.spacing(np.abs(d32).astype(np.float32)).astype(np.float64))
    ulps = ulps[np.isfinite(ulps)]
    ev = [
        f"{int(dneq.sum())} wrong blocks differ in d, every one by exactly one fp16 step; their codes equal tbq's "
        "or differ by one at fragile positions"
    ]
    if ulps.size:
        ev.append(
            f"to round to the target's fp16 values its float32 d must have been {int(ulps.min())} to {int(ulps.max())} "
            f"float32 ulps from tbq's (median {int(np.median(ulps))}); the fragility margin is k = {k} "
            f"(--fragile-ulps {int(ulps.max())} would accept them as fragile)"
        )
    if ulps.size and ulps.min() > 64:  # no reduction order moves a float32 scale that far
        return Diagnosis(
            "scale_ulp",
            "every differing scale is one fp16 step from tbq's, too far from tbq's float32 scale "
            "for a reduction-order difference: the conversion to fp16 rounds differently",
            ev,
        )
    return Diagnosis(
        "scale_ulp",
        "every differing scale is one fp16 ulp from tbq's: FMA contraction or another reduction "
        "order in the scale's arithmetic, beyond the fragility margin",
        ev,
    )


def _f16_bits(v64: NDArray[np.floating[Any]]) -> NDArray[np.int64]:
    with np.errstate(all="ignore"):
        return np.asarray(v64, np.float32).astype(np.float16).view(np.uint16).astype(np.int64)


def _scale_conversion(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    f = next((f for f in fmt.info.layout if f.name == "d" and f.kind == "f16" and f.size == 2), None)
    if f is None or "d" not in kept.get("trace", {}):
        return None
    R = kept["ref"][:, f.offset : f.offset + 2].copy().view("<u2").reshape(-1).astype(np.int64)
    G = kept["got"][:, f.offset : f.offset + 2].copy().view("<u2").reshape(-1).astype(np.int64)
    rows = R != G
    if not rows.any():
        return None
    d = np.asarray(kept["trace"]["d"], np.float32).reshape(-1)
    u = d.view(np.uint32).astype(np.int64)
    rne = _f16_bits(d)
    with np.errstate(all="ignore"):
        over = np.abs(rne.astype(np.uint16).view(np.float16).astype(np.float64)) > np.abs(d.astype(np.float64))
    trunc = np.where(over & ((rne & 0x7FFF) > 0), rne - 1, rne)  # one step toward zero (magnitude - 1)
    ftz = np.where((np.abs(d) < 2.0**-14), np.where(np.signbit(d), 0x8000, 0), rne)
    bf16_rne = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    alts = {
        "the fp16 conversion truncates (rounds toward zero) instead of rounding to nearest even": trunc,
        "subnormal fp16 scales are flushed to zero (FTZ)": ftz,
        "the scale is stored as bfloat16 (the float32's top 16 bits, truncated)": (u >> 16) & 0xFFFF,
        "the scale is stored as bfloat16 (rounded to nearest even), not fp16": bf16_rne,
        "the scale field holds the low 16 bits of the float32 scale": u & 0xFFFF,
    }
    for title, alt in alts.items():
        explains = alt[rows] == G[rows]
        if explains.mean() >= AGREE and (alt != R).any():
            ev = [
                f"in {int(explains.sum())} of {int(rows.sum())} wrong blocks whose d differs, the target's 2 scale bytes equal "
                f"that conversion of tbq's float32 d (e.g. d = {float(d[rows][0])!r}: tbq 0x{int(R[rows][0]):04X}, "
                f"target 0x{int(G[rows][0]):04X})"
            ]
            return Diagnosis("scale_conversion", title, ev)
    return None


def _kept_codes(fmt: Format, kept: KeptBlocks) -> tuple[Fields, Fields, NDArray[np.int64], NDArray[np.int64]] | None:
    """tbq's and the target's fields of the kept encoder blocks and their value codes (:func:`value_codes`), or None
    for a format whose fields give no value codes."""
    Fr, Fg = _flat_fields(fmt, kept["ref"]), _flat_fields(fmt, kept["got"])
    cr, cg = value_codes(fmt, Fr), value_codes(fmt, Fg)
    if cr is None:
        return None
    assert cg is not None  # one format's fields of as many blocks: codes on both sides or on neither
    return Fr, Fg, cr, cg


def _ties(fmt: Format, kept: KeptBlocks, min_codes: int = 4, need_rule: bool = False) -> Diagnosis | None:
    codes = _kept_codes(fmt, kept)
    if codes is None:
        return None
    Fr, Fg, cr, cg = codes
    diff = cr != cg
    if not diff.any():
        return None
    for n in Fr:  # only the codes may differ
        if Fr[n].shape[1] != fmt.block_size and (Fr[n].astype(np.float64) != Fg[n].astype(np.float64)).any():
            return None
    for name, T in kept["trace"].items():
        T = np.asarray(T)
        if T.dtype.kind != "f" or T.shape != diff.shape:
            continue
        t = T[diff].astype(np.float64)
        if not (np.isfinite(t).all() and ((t - np.floor(t)) == 0.5).all()):
            continue
        step = (cg - cr)[diff]
        if not (np.abs(step) == 1).all() or step.size < min_codes:
            continue
        ev = [
            f"all {int(diff.sum())} differing codes sit on exact ties: the traced {name} is exactly k + 1/2 there",
            f"the target's code is tbq's - 1 in {int((step < 0).sum())} of them, + 1 in {int((step > 0).sum())}",
        ]
        title = "ties are rounded differently"
        if (np.rint(t) == cg[diff]).all():
            title = "ties are rounded to even (rintf, nearbyintf, cvtps2dq, __float2int_rn) where the spec rounds half away from zero (roundf)"
            ev.append("the target's codes equal round-half-to-even of the traced value at every one of them")
        elif (np.trunc(t) == cg[diff]).all():
            title = "ties are rounded toward zero where the spec rounds half away from zero (roundf)"
            ev.append("the target's codes equal the traced value truncated toward zero at every one of them")
        elif need_rule:
            return None
        return Diagnosis("tie_rounding", title, ev)
    return None


def _rotated_sign(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    if not fmt.info.rotated:
        return None
    tables = fmt.tables()
    c = tables.get("centroids")
    if c is None or not np.array_equal(np.asarray(c), -np.asarray(c)[::-1]):
        return None
    codes = _kept_codes(fmt, kept)
    if codes is None:
        return None
    _, _, cr, cg = codes
    diff = cr != cg
    blocks = diff.any(axis=1)
    if not blocks.any():
        return None
    J = np.flatnonzero(diff.any(axis=0))
    if J.size > 8:
        return None
    top = len(c) - 1
    mirror = (cg == top - cr)[diff]
    if mirror.mean() < AGREE:
        return None
    ev = [
        f"the codes differ only at rotated coordinate(s) {_positions(J)} ({int(blocks.sum())} wrong blocks)",
        f"there the target's index is the mirror image {top} - idx of tbq's (the centroid of -r) in {int(mirror.sum())} "
        f"of {mirror.size} differing codes",
    ]
    hint = ""
    if "signs2" in tables:
        hint = f": the target's signs2[{_positions(J)}] differs from tbq's (tbq: {_positions(np.asarray(tables['signs2'])[J])})"
    return Diagnosis(
        "rotated_sign",
        f"rotated coordinate(s) {_positions(J)} are negated before quantizing: a different "
        f"sign table or rotation{hint}",
        ev,
    )


def _input_sign(fmt: Format, kept: KeptBlocks, tries: int = 4) -> Diagnosis | None:
    if not fmt.info.rotated or fmt.row_rule or kept.get("x") is None:
        return None
    bs = fmt.block_size
    found = []
    for b in range(min(tries, kept["cls"].size)):
        x = kept["x"][b]
        cand = np.repeat(x[None, :], bs, axis=0)
        cand[np.arange(bs), np.arange(bs)] *= np.float32(-1)
        with np.errstate(all="ignore"):
            enc, _ = fmt.reference_encode(cand, **row_kw(fmt, 1))
        hits = set(np.flatnonzero((enc == kept["got"][b]).all(axis=1)).tolist())
        if not hits:
            return None
        found.append(hits)
    common = set.intersection(*found) if found else set()
    if not common:
        return None
    i = min(common)
    tables = fmt.tables()
    hint = (
        f": the target's signs1[{i}] differs from tbq's (tbq: {int(tables['signs1'][i])})" if "signs1" in tables else ""
    )
    ev = [
        f"in each of {len(found)} wrong blocks tried, tbq's encoding of the input with value {i} negated equals the target's bytes exactly"
    ]
    return Diagnosis(
        "input_sign",
        f"the sign of input value {i} is flipped before the rotation: a different first sign table{hint}",
        ev,
    )


def _permutation(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    codes = _kept_codes(fmt, kept)
    if codes is None:
        return None
    _, _, cr, cg = codes
    rows = np.flatnonzero((cr != cg).any(axis=1))
    if rows.size < 4:
        return None
    cr, cg = cr[rows], cg[rows]
    same_multiset = (np.sort(cr, axis=1) == np.sort(cg, axis=1)).all(axis=1)
    if same_multiset.mean() < AGREE:
        return None
    bs = fmt.block_size
    perm = []
    for j in range(bs):
        src = np.flatnonzero((cg[:, j][:, None] == cr).all(axis=0))
        if not src.size:
            return Diagnosis(
                "permutation",
                "the target's codes are tbq's codes in another order",
                [
                    f"in {int(same_multiset.sum())} of {rows.size} blocks whose codes differ, the target's codes are the same multiset as tbq's"
                ],
            )
        perm.append(int(src[0]) if j not in src else j)
    moved = [(j, p) for j, p in enumerate(perm) if p != j]
    return Diagnosis(
        "permutation",
        "the target's codes are tbq's codes in another order",
        [
            f"in {int(same_multiset.sum())} of {rows.size} blocks whose codes differ, the target's codes are the same multiset as tbq's",
            "value j holds the code of value p(j), consistently over those blocks: "
            + ", ".join(f"{j} <- {p}" for j, p in moved[:10])
            + (", ..." if len(moved) > 10 else ""),
        ],
    )


def _known_options(fmt: Format) -> Iterator[tuple[dict[str, Any], Format]]:
    """Every combination of the format's declared known option values other than its own (``Option.known``)."""
    import itertools

    from ..formats import get_format

    names = [n for n, o in fmt.options.items() if o.known]
    if not names:
        return
    own = fmt.config()
    for combo in itertools.product(*(fmt.options[n].known for n in names)):
        opts = dict(own, **dict(zip(names, combo, strict=True)))
        if all(opts[n] == own.get(n) for n in names):
            continue
        try:
            yield opts, get_format(fmt.name, **opts)
        except Exception:  # a known value this format's width does not take
            continue


def _other_options(fmt: Format, kept: KeptBlocks, direction: str) -> Diagnosis | None:
    """The target matches tbq with other known option values (another build's tables or sign seed)."""
    from ..codecs import codec_from

    n = kept["cls"].size
    for opts, alt in _known_options(fmt):
        codec = codec_from(alt.name, alt.config(), on_overflow="inf")
        with np.errstate(all="ignore"):
            if direction == "quantize":
                same = (codec.encode(np.ascontiguousarray(kept["x"], np.float32)).reshape(n, -1) == kept["got"]).all(
                    axis=1
                )
            else:
                y = codec.decode(kept["data"]).reshape(n, -1)
                same = (y.view(np.uint32) == kept["got"].view(np.uint32)).all(axis=1)
        if same.mean() >= AGREE:
            own = fmt.config()
            changed = {k: v for k, v in opts.items() if own.get(k) != v}
            flags = " ".join(
                f"--{k} {v}" if k in ("codebook", "signs") else f"--option {k}={v}" for k, v in changed.items()
            )
            return Diagnosis(
                "format_options",
                f"the target follows {fmt.name} with {', '.join(f'{k}={v!r}' for k, v in changed.items())} "
                f"(check with {flags})",
                [
                    f"tbq's {direction} with those options gives exactly the target's output in {int(same.sum())} of {n} wrong blocks",
                    "tried every combination of the known values: "
                    + "; ".join(
                        f"{k}: {', '.join(map(repr, fmt.options[k].known))}"
                        for k in fmt.options
                        if fmt.options[k].known
                    ),
                ],
            )
    return None


def _run_diagnoses(
    fmt: Format,
    kept: KeptBlocks,
    direction: str,
    fns: Iterable[Callable[[Format, KeptBlocks], Diagnosis | None]],
) -> list[Diagnosis]:
    """The diagnoses among ``fns`` that match ``kept``, in order, each marked with its ``direction``."""
    out = []
    for fn in fns:
        with np.errstate(all="ignore"):
            d = fn(fmt, kept)
        if d is not None:
            d.direction = direction
            out.append(d)
    return out


def diagnose_encoder(fmt: Format, kept: KeptBlocks, k: int) -> list[Diagnosis]:
    """Diagnoses of an encoder's wrong blocks (``kept`` from :meth:`Kept.get`)."""
    if not kept:
        return []
    out = _run_diagnoses(
        fmt,
        kept,
        "quantize",
        (
            _shift_bug,
            _nibble_encoder,
            lambda f, kp: _scale_ulp(f, kp, k),
            _scale_conversion,
            _ties,
            _rotated_sign,
            _input_sign,
            lambda f, kp: _other_options(f, kp, "quantize"),
        ),
    )
    if any(d.name == "scale_conversion" for d in out):  # the specific explanation of a one-step scale difference
        out = [d for d in out if d.name != "scale_ulp"]
    if not any(d.name in ("nibble_order", "shift_bug_3bit") for d in out):
        d = _permutation(fmt, kept)
        if d is not None:
            d.direction = "quantize"
            out.append(d)
    return out


def describe_values(x: NDArray[Any], limit: int = 6) -> str:
    """The float32 values of an input that matter: every non-+0 value (so -0 shows), specials named.

    >>> describe_values(np.float32([0.0, -0.0, 1.5, np.inf, 1e-45, np.nan]))
    '5 of 6 values other than +0: x[1] = -0.0, x[2] = 1.5, x[3] = inf, x[4] = 1e-45 (subnormal), x[5] = nan'
    """
    x = np.asarray(x, np.float32).reshape(-1)
    bits = x.view(np.uint32)
    nz = np.flatnonzero(bits != 0)
    if not nz.size:
        return f"all {x.size} values +0"

    def one(i: int) -> str:
        v = x[i]
        text = f"x[{i}] = {str(v)}"  # float32 shortest repr (round-trips as float32)
        if np.isfinite(v) and v != 0 and abs(v) < np.finfo(np.float32).tiny:
            text += " (subnormal)"
        return text

    return (
        f"{nz.size} of {x.size} values other than +0: "
        + ", ".join(one(i) for i in nz[:limit])
        + (" ..." if nz.size > limit else "")
    )


def _tie_share(fmt: Format, kept: KeptBlocks) -> tuple[int, float, float, int] | None:
    """Over the exact ties of ``kept`` blocks: ``(differing codes, target away share, target even share, agreeing ties)``.

    At a differing tie the target took the other level than tbq: the one farther from zero when its decoded
    value is larger in magnitude; "even" is the level whose rank among the levels' magnitudes is even (the even
    integer, the even E2M1 mantissa).
    """
    vt = fmt.quantizer.value_table(kept["trace"])
    if vt is None or fmt.quantizer.rotated_view(kept["trace"]) is not None:
        return None
    lv = np.unique(np.asarray(vt[0], np.float64))
    mags = np.unique(np.abs(lv))
    v = np.asarray(vt[1], np.float64).reshape(kept["ref"].shape[0], fmt.block_size)
    yr = fmt.reference_decode(kept["ref"]).reshape(v.shape).astype(np.float64)
    yg = fmt.reference_decode(kept["got"]).reshape(v.shape).astype(np.float64)
    j = np.clip(np.searchsorted(lv, v, side="right"), 1, lv.size - 1)
    lo, hi = lv[j - 1], lv[j]
    on_tie = np.isfinite(v) & (v * 2 == lo + hi) & (v > lo) & (v < hi)
    diff = (yr != yg) & on_tie
    if not diff.any():
        return None
    lo, hi = lo[diff], hi[diff]
    away = np.abs(yg[diff]) > np.abs(yr[diff])
    big = np.where(np.abs(hi) >= np.abs(lo), hi, lo)
    small = np.where(np.abs(hi) >= np.abs(lo), lo, hi)
    level_t = np.where(away, big, small)
    even = np.searchsorted(mags, np.abs(level_t)) % 2 == 0
    return int(diff.sum()), float(away.mean()), float(even.mean()), int((on_tie & (yr == yg)).sum())


_RULES = {
    "even": "half to even (rintf, nearbyintf, cvtps2dq, __float2int_rn)",
    "away": "half away from zero (roundf)",
    "toward": "half toward zero",
    "odd": "half to odd",
    "up": "half up (trunc(v + k + 1/2))",
}
_COMPLEMENT = {"even": "odd", "odd": "even", "away": "toward", "toward": "away"}


def _target_rule(away: float, even: float, spec: str, agreeing: int) -> str:
    """The one tie rule the differing ties fit (not the spec's; not its complement when some ties agree), or ``""``."""
    fits = {"even": even == 1, "odd": even == 0, "away": away == 1, "toward": away == 0}
    cand = [r for r, ok in fits.items() if ok and r != spec]
    if len(cand) > 1 and agreeing and _COMPLEMENT.get(spec) in cand:
        cand.remove(_COMPLEMENT[spec])  # the complement of the spec's rule would differ at every tie
    return cand[0] if len(cand) == 1 else ""


def _tie_rule(fmt: Format, kept: KeptBlocks, total_differing: int) -> Diagnosis | None:
    share = _tie_share(fmt, kept)
    if share is None:
        return None
    n, away, even, agreeing = share
    spec = fmt.checker.tie_rule
    target = _target_rule(away, even, spec, agreeing)
    nb = kept["cls"].size
    title = "ties are rounded " + (_RULES[target] if target else "by another rule")
    title += f" where the spec rounds {_RULES[spec]}" if spec in _RULES else " than the spec's"
    ev = [
        f"{nb:,} of the {total_differing:,} blocks whose bytes differ ({percent(nb / max(1, total_differing))}) differ only in "
        f"value codes one step apart that sit on exact ties of the value the format rounds ({n:,} codes)",
        f"at those ties the target takes the level farther from zero in {percent(away)} and the even level in {percent(even)}; "
        f"at {agreeing:,} other exact ties of the same blocks it agrees with tbq",
        "accepted unless --exact (exact=True): a different tie rule is a real difference from the spec, not a reduction-order one",
    ]
    return Diagnosis("tie_rounding", title, ev, scope="tie_rule")


def _signed_zero(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    """Only the sign of zero-valued fields differs (+0 against -0); the rule the target's sign follows, when one input's does."""
    Fr, Fg = _flat_fields(fmt, kept["ref"]), _flat_fields(fmt, kept["got"])
    names = []
    for n in Fr:
        a, b = Fr[n], Fg[n]
        if a.dtype.kind != "f":
            if (a != b).any():
                return None
            continue
        ba, bb = a.astype(np.float32).view(np.uint32), b.astype(np.float32).view(np.uint32)
        neq = ba != bb
        if not neq.any():
            continue
        if not ((ba[neq] & 0x7FFFFFFF) == 0).all() or not ((bb[neq] & 0x7FFFFFFF) == 0).all():
            return None
        names.append(n)
    if not names:
        return None
    n = names[0]
    a, b = Fr[n], Fg[n]
    rows = _neq(a, b).any(axis=1)
    tneg = int(np.signbit(a[rows]).any(axis=1).sum())
    ev = [
        f"in all {int(rows.sum())} blocks the only difference is the sign of a zero in field {', '.join(names)}: tbq stores -0 "
        f"in {tneg} of them and +0 in {int(rows.sum()) - tneg}, the target the other one",
        "they decode to the same values (zeros of one sign or the other): equivalent, accepted",
    ]
    x = kept.get("x")
    if x is not None and a.shape[1] == 1:
        sg = np.signbit(b[rows, 0])
        xs = np.signbit(np.asarray(x, np.float32)[rows])
        for j in range(xs.shape[1]):
            if (xs[:, j] == sg).all():
                ev.append(f"the target's sign of {n} is the sign of x[{j}] in every one of them")
                break
            if (xs[:, j] != sg).all():
                ev.append(
                    f"the target's sign of {n} is the opposite of the sign of x[{j}] in every one of them (as {n} = x[{j}] / "
                    "a negative constant would give)"
                )
                break
        ev.append(f"e.g. the input {describe_values(np.asarray(x, np.float32)[rows][0])}")
    return Diagnosis("signed_zero", f"only the sign of a zero {', '.join(names)} differs (+0 against -0)", ev)


def diagnose_accepted(
    fmt: Format, direction: str, cls_name: str, kept: KeptBlocks, total_differing: int, rule: str = ""
) -> list[Diagnosis]:
    """What the accepted non-exact blocks of one class (``equivalent``, ``undefined``, ``tie_rule``) are, with the evidence."""
    if not kept or direction != "quantize":
        return []
    nb = kept["cls"].size
    out = []
    with np.errstate(all="ignore"):
        if cls_name == "tie_rule":
            d = _tie_rule(fmt, kept, total_differing)
            out += [d] if d else []
        elif cls_name == "equivalent":
            d = _signed_zero(fmt, kept)
            if d is None:
                ex = kept["x"][0] if kept.get("x") is not None else None
                d = Diagnosis(
                    "equivalent",
                    f"{nb:,} blocks have other bytes than tbq's that decode to the same values",
                    [
                        "a zero scale makes every code decode to zero (C leaves those codes to whatever the kernel computes), or a "
                        "zero of the other sign"
                    ]
                    + ([f"e.g. the input {describe_values(ex)}"] if ex is not None else []),
                )
            out.append(d)
        elif cls_name == "undefined":
            ex = kept["x"][0] if kept.get("x") is not None else None
            out.append(
                Diagnosis(
                    "undefined",
                    f"{nb:,} blocks are inputs on which the C reference's behaviour is undefined",
                    [
                        f"the rule: {rule}" if rule else "the format declares these blocks undefined",
                        "accepted unless --exact (exact=True); tbq's bytes there are what x86-64 gcc's build of the reference writes",
                    ]
                    + ([f"e.g. the input {describe_values(ex)}"] if ex is not None else []),
                )
            )
    for d in out:
        d.direction, d.scope = direction, cls_name
    return out


def diagnose_fragile(fmt: Format, direction: str, kept: KeptBlocks) -> list[Diagnosis]:
    """Systematic patterns among fragile blocks (accepted, but a rounding-mode bug can hide there): exact ties."""
    if not kept or direction != "quantize":
        return []
    with np.errstate(all="ignore"):
        d = _ties(fmt, kept, min_codes=8, need_rule=True)
    if d is None:
        return []
    d.direction, d.scope = direction, "fragile"
    return [d]


# ---------------------------------------------------------------------------
# decoders
# ---------------------------------------------------------------------------


def _nibble_decoder(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    data = kept["data"]
    g = kept["got"].view(np.uint32)
    for f in fmt.info.layout:
        if f.kind not in _READ4:
            continue
        raw = data[:, f.offset : f.offset + f.size]
        for alt, swap in _nibble_alternatives(f.kind):
            codes = _READ4[alt](_swap_nibbles(raw) if swap else raw)
            moved = data.copy()
            moved[:, f.offset : f.offset + f.size] = _PACK4[f.kind](codes)
            rows = np.flatnonzero((moved != data).any(axis=1))
            if not rows.size:
                continue
            with np.errstate(all="ignore"):
                y = fmt.reference_decode(moved[rows])
            match = (y.view(np.uint32) == g[rows]).all(axis=1)
            if match.mean() >= AGREE:
                return _nibble_order(
                    f,
                    alt,
                    swap,
                    f"tbq's decoder gives exactly the target's values in {int(match.sum())} of {rows.size} wrong blocks "
                    f"once {f.name} is read as {_LAYOUT4[(alt, swap)]}",
                )
    return None


def _ulp_distance(a: NDArray[np.float32], b: NDArray[np.float32]) -> NDArray[np.int64]:
    return np.abs(ordered_code(a.astype(np.float32)) - ordered_code(b.astype(np.float32)))


def _decoder_values(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    r, g = kept["ref"], kept["got"]
    tol = np.asarray(fmt.decode_tolerance(kept["data"]), np.float64).reshape(r.shape)
    fin = np.isfinite(r) & np.isfinite(g)
    with np.errstate(all="ignore"):
        within = fin & (np.abs(r.astype(np.float64) - g.astype(np.float64)) <= tol)
    # the values that make the blocks wrong: not a NaN pair, not within the format's tolerance
    neq = (r.view(np.uint32) != g.view(np.uint32)) & ~(np.isnan(r) & np.isnan(g)) & ~within
    if not neq.any():
        return None
    if (neq & ~fin).any():
        return None
    dist = _ulp_distance(r[neq], g[neq])
    zeros = (r[neq] == 0) & (g[neq] == 0)
    if zeros.all():
        return Diagnosis(
            "signed_zero",
            "only the sign of zero differs",
            [
                f"all {int(neq.sum())} differing values are zeros of the opposite sign (e.g. -0.0 where the C reference gives "
                "+0.0): the order of a subtraction or a multiply by a signed zero scale differs from the spec's"
            ],
        )
    if dist.max() <= 4:
        exact = not (tol > 0).any()
        ev = [
            f"all {int(neq.sum())} differing values are within {int(dist.max())} float32 ulp(s) of tbq's "
            f"({int((dist == 1).sum())} at one ulp)"
        ]
        ev.append(
            "the format's decoder is exact (products of a code and a scale), so tbq expects identical bits"
            if exact
            else "they lie beyond the format's decode_tolerance (the largest legitimate FMA difference)"
        )
        return Diagnosis(
            "decoder_ulp",
            "decoded values off by a few float32 ulps: FMA contraction or another order of operations in the decoder",
            ev,
        )
    return None


def _decoder_scales(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    # the block's fp16 scale "d" wherever the layout puts it (vLLM's key norm follows the indices), else a first
    # fp16 field at byte 0
    fields = [f for f in fmt.info.layout if f.kind == "f16" and f.size == 2 and fmt.block_size > 1]
    f = next((f for f in fields if f.name == "d"), next((f for f in fields if f.offset == 0), None))
    if f is None:
        return None
    bits = kept["data"][:, f.offset : f.offset + 2].copy().view("<u2").reshape(-1)
    exp, mant = (bits >> 10) & 0x1F, bits & 0x3FF
    special = exp == 0x1F
    subnormal = (exp == 0) & (mant != 0)
    n = bits.size
    if special.all():
        return Diagnosis(
            "special_scales",
            "only blocks whose fp16 scale is Inf or NaN decode differently",
            [
                f"every one of the {n} wrong blocks has an Inf or NaN scale (tbq returns what the C reference computes: "
                "+-Inf for non-zero codes, NaN for a zero code times Inf, NaN for a NaN scale)"
            ],
        )
    if subnormal.all():
        g = kept["got"]
        flushed = (g == 0).all(axis=1)
        if flushed.mean() >= AGREE:
            return Diagnosis(
                "flush_to_zero",
                "subnormal fp16 scales are flushed to zero (FTZ/DAZ, e.g. CUDA's -ftz=true or --use_fast_math)",
                [
                    f"every one of the {n} wrong blocks has a subnormal fp16 scale, and the target "
                    f"decodes {int(flushed.sum())} of them to all zeros"
                ],
            )
    return None


def _output_sign(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    r, g = kept["ref"], kept["got"]
    rb, gb = r.view(np.uint32), g.view(np.uint32)
    neg = gb == (rb ^ np.uint32(0x80000000))
    neq = rb != gb
    if not neq.any() or (neq & ~neg).any():
        return None
    J = np.flatnonzero(neq.any(axis=0))
    if J.size > 8:
        return None
    tables = fmt.tables()
    # signs1 is the decoder's last step only where it returns the original domain (not turbo's rotated one)
    own = "signs1" in tables and fmt.domain.decode_domain == "original"
    hint = f": the target's signs1[{_positions(J)}] differs from tbq's" if own else ""
    return Diagnosis(
        "output_sign",
        f"decoded value(s) {_positions(J)} have the wrong sign{hint}",
        [
            f"in all {kept['cls'].size} wrong blocks the only differences are exact negations, at value position(s) {_positions(J)}"
        ],
    )


def _decoder_rotated_sign(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    if not fmt.info.rotated or fmt.row_rule:
        return None
    r, g = kept["ref"], kept["got"]
    ok = np.isfinite(r).all(1) & np.isfinite(g).all(1) & (np.abs(r).sum(1) > 0) & (np.abs(g).sum(1) > 0)
    if ok.sum() < 1:
        return None
    with np.errstate(all="ignore"):
        try:
            # decoded values back in the input's domain (turbo decodes to the rotated one) before re-encoding
            tr_r = fmt.reference_encode(np.ascontiguousarray(fmt.domain.from_decode_domain(r[ok]), np.float32))[1].get(
                "r"
            )
            tr_g = fmt.reference_encode(np.ascontiguousarray(fmt.domain.from_decode_domain(g[ok]), np.float32))[1].get(
                "r"
            )
        except Exception:  # pragma: no cover - a format without a rotation trace
            return None
    if tr_r is None or tr_g is None:
        return None
    a, b = np.asarray(tr_r, np.float64), np.asarray(tr_g, np.float64)
    scale = np.abs(a).max(axis=1, keepdims=True)
    close = np.abs(a - b) <= 1e-3 * scale
    flipped = (np.abs(a + b) <= 1e-3 * scale) & ~close
    if not flipped.any() or not (close | flipped).all(axis=1).mean() >= AGREE:
        return None
    J = np.flatnonzero(flipped.any(axis=0))
    if J.size > 8:
        return None
    tables = fmt.tables()
    own = (
        "signs2" in tables and fmt.domain.decode_domain == "original"
    )  # a decoder that rotates back applies signs2 first
    hint = f": the target's signs2[{_positions(J)}] differs from tbq's" if own else ""
    return Diagnosis(
        "rotated_sign",
        f"rotated coordinate(s) {_positions(J)} are negated before the inverse rotation{hint}",
        [
            f"rotating the target's decoded blocks with tbq's rotation gives tbq's rotated block with coordinate(s) "
            f"{_positions(J)} negated in {int((close | flipped).all(axis=1).sum())} of {int(ok.sum())} wrong blocks"
        ],
    )


def _decoder_codebook(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    """Rotated formats: read the target's codebook back from its decoded blocks (R(y) / d = the centroids of the codes)."""
    if not fmt.info.rotated or fmt.row_rule or "centroids" not in fmt.tables():
        return None
    ours = np.asarray(fmt.tables()["centroids"], np.float64)
    F = _flat_fields(fmt, kept["data"])
    codes = value_codes(fmt, F)
    if codes is None or "d" not in F or F["d"].shape[1] != 1:
        return None
    d = F["d"].reshape(-1).astype(np.float64)
    g = kept["got"].astype(np.float64)
    ok = np.isfinite(d) & (d > 2.0**-14) & np.isfinite(g).all(axis=1) & (np.abs(g).sum(axis=1) > 0)
    if ok.sum() < 4:
        return None
    with np.errstate(all="ignore"):
        norm, r = _rotate_trace(fmt, kept["got"][ok])
        if r is None:
            return None
        c = r * (norm / d[ok])[:, None]  # the target's centroid of each code
    found: list[float] = []
    spread: list[float] = []
    for i in range(ours.size):
        v = c[codes[ok] == i]
        if v.size < 4:
            return None
        med = float(np.median(v))
        found.append(med)
        spread.append(float(np.max(np.abs(v - med))))
    levels = np.asarray(found)
    if not (np.asarray(spread) <= 1e-3 * np.abs(levels).max()).all():
        return None  # not one level per code: the rotation differs, not (only) the codebook
    if np.allclose(levels, ours, rtol=1e-4, atol=1e-7):
        return None
    ev = [
        f"rotating the target's decoded blocks with tbq's rotation gives one value per code over {int(ok.sum())} wrong blocks: "
        f"its centroids are {', '.join(f'{v:.6g}' for v in levels)}",
        f"tbq's ({fmt.config().get('codebook', 'this format') if isinstance(fmt.config().get('codebook'), str) else 'custom'}) "
        f"are {', '.join(f'{v:.6g}' for v in ours)}",
    ]
    title = "the decoder uses another codebook"
    if "codebook" in fmt.options:
        from ..codebooks import CODEBOOK_NAMES, named_codebook

        for name in CODEBOOK_NAMES:
            try:
                cb = named_codebook(name, fmt.info.index_bits).centroids.astype(np.float64)
            except Exception:  # a name without a table of this width
                continue
            if cb.size == levels.size and np.allclose(levels, cb, rtol=1e-4, atol=1e-7):
                title = f"the decoder uses the {name!r} codebook (check with --codebook {name})"
                break
    return Diagnosis("codebook", title, ev)


def _rotate_trace(fmt: Format, y: NDArray[Any]) -> tuple[NDArray[np.float64], NDArray[np.float64]] | tuple[None, None]:
    """``(norm, r)`` of decoded blocks ``y`` from the format's reference trace of them, back in the input's domain
    (None when it traces no rotation)."""
    try:
        _, tr = fmt.reference_encode(np.ascontiguousarray(fmt.domain.from_decode_domain(y), np.float32))
    except Exception:  # a format without a rotation trace
        return None, None
    view = fmt.quantizer.rotated_view(tr)  # declared by the format (None: no rotation)
    if view is None:
        return None, None
    return np.asarray(view[0], np.float64), np.asarray(view[1], np.float64)


def _scale_factor(fmt: Format, kept: KeptBlocks) -> Diagnosis | None:
    r, g = kept["ref"].astype(np.float64), kept["got"].astype(np.float64)
    nz = (r != 0) & np.isfinite(r) & np.isfinite(g)
    with np.errstate(all="ignore"):
        ratio = np.where(nz, g / np.where(nz, r, 1), np.inf)
        lo = np.where(nz.any(axis=1), np.min(np.where(nz, ratio, np.inf), axis=1), np.nan)
        hi = np.where(nz.any(axis=1), np.max(np.where(nz, ratio, -np.inf), axis=1), np.nan)
    const = np.isfinite(lo) & (np.abs(hi - lo) <= 1e-6 * np.abs(lo)) & (np.abs(lo - 1) > 1e-6)
    if const.mean() < AGREE:
        return None
    f = lo[const]
    ev = [
        f"in {int(const.sum())} of {const.size} wrong blocks the target's values are tbq's times one factor per block "
        f"(median {float(np.median(f)):.6g}, from {float(f.min()):.6g} to {float(f.max()):.6g})"
    ]
    d_field = next((x for x in fmt.info.layout if x.name == "d" and x.kind == "f16" and x.size == 2), None)
    title = "the decoded block is tbq's times a per-block factor: the scale is read or applied differently"
    if d_field is not None:
        swapped = kept["data"].copy()
        o = d_field.offset
        swapped[:, [o, o + 1]] = swapped[:, [o + 1, o]]
        with np.errstate(all="ignore"):
            y = fmt.reference_decode(swapped)
        if (y.view(np.uint32) == kept["got"].view(np.uint32)).all(axis=1).mean() >= AGREE:
            title = "the fp16 scale is read big-endian (its two bytes swapped)"
            ev.append("tbq's decoder gives the target's values once the scale's two bytes are swapped")
    return Diagnosis("scale_factor", title, ev)


def diagnose_decoder(fmt: Format, kept: KeptBlocks) -> list[Diagnosis]:
    """Diagnoses of a decoder's wrong blocks (``kept`` from :meth:`Kept.get`)."""
    if not kept:
        return []
    out = _run_diagnoses(
        fmt,
        kept,
        "dequantize",
        (
            _nibble_decoder,
            _decoder_scales,
            _decoder_values,
            _output_sign,
            _decoder_rotated_sign,
            _decoder_codebook,
            _scale_factor,
            lambda f, kp: _other_options(f, kp, "dequantize"),
        ),
    )
    return out
