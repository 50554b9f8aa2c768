"""Checking fused attention kernels over quantized KV caches: ``tbq check --attention``.

A kernel computes ``out = softmax(scale * q . k_t + mask_t) . v`` over a K cache and a V cache that tbq
encodes (:func:`tbq.quantize`, any registered format, K and V separately). The check judges the kernel's float32
output against tbq's reference **over the same stored bytes**, in float64, with a tolerance **derived** from the
arithmetic the kernel declares (:class:`Arithmetic`), per output row:

- ``q``: the query the scores use: kept (``"float32"``), rounded to ``"float16"`` or ``"bfloat16"``, or converted
  as ggml converts it to the K type's ``vec_dot_type`` (``"q8_0"`` for q4_0/q8_0/iq4_nl, ``"q8_k"`` for the fork's
  TBQ types; float16 for an f16 K) -- the reference applies the same conversion with tbq's codec, and the bound
  allows every converted value that a few-ulp difference of the converter can move (``Format.fragile_values``)
  one code step;
- ``softmax``: the weights ``exp(s_t - M)`` in ``"float32"`` or rounded to ``"float16"``;
- ``v``: the accumulator ``sum_t w_t v_t`` in ``"float32"`` or ``"float16"`` (ggml's CPU kernel accumulates an
  f16 V in f16).

The bound of one output row (query token, head), first order in the unit roundoffs ``u = 2**-24`` (float32) and
``2**-11`` (float16), with ``D = head_dim``, ``T`` the visible tokens, ``q'`` the converted query:

``eps_t = scale * ((D + 8) u sum_j |q'_j| |k_tj| + sum_j dq_j |k_tj| + sum_j |q'_j| dk_tj) + 4 u |s_t|``, the
error of a score (a ``D``-term float32 dot product in any order, FMA or not; ``dq`` the converter's fragile steps;
``dk`` the decoder's legitimate deviation, ``Format.decode_tolerance``, plus a float32 rotation's roundings for
formats read in a rotated domain); scores each off by at most ``eps = max_t eps_t`` move the softmax weights by
factors within ``exp(+-2 eps)``, so the output by at most ``expm1(2 eps) max|V|``; then

``bound = 1.01 ((expm1(2 eps) + (2 T + 2) u_acc + 16 u + 2 u_sm + u (spread + 1)) max|V| + u |o|)``

with one rounding per token's addition and per online-softmax rescale in any order and any split of the tokens
among threads (``u_acc``: the accumulator's unit roundoff), 16 for exp, the division, the merge and the output,
``u_sm`` 2**-11 for float16 weights (else 0), ``spread`` the range of the visible scores (the rounding of
``s_t - M``), plus ``(log2(128) + 2) u sqrt(128) max|V|`` for a V format read in a rotated domain.

A kernel's row is ``exact`` (the float32 of tbq's value, bit for bit), ``in bound`` or ``wrong`` (NaN included).
An all-masked row is defined as zeros (ggml's and FlashAttention's convention); a NaN there is wrong, diagnosed.

Cases (:func:`make_cases`): decode (one query token) over contexts from 1 token up, prefill (many query tokens,
causal), GQA ratios, masks with fully masked rows, sink logits (gpt-oss style, ggml's
``ggml_flash_attn_ext_add_sinks``), soft-capping, and the softmax-stress cases (one dominant score, all scores
equal, huge and tiny norms). For a wrong output the check looks for the smallest failing case (fewest tokens,
one head) and names the defect its output matches (:data:`DIAGNOSES`), writing an ``.npz`` and a Python and C
reproducer.

>>> import numpy as np, tbq
>>> def kernel(q, k, v, meta):  # a correct kernel: tbq's decoder, float64 attention
...     K = tbq.dequantize(k, meta["k_type"]).reshape(meta["n_tokens"], meta["n_head_kv"], -1).astype(np.float64)
...     V = tbq.dequantize(v, meta["v_type"]).reshape(meta["n_tokens"], meta["n_head_kv"], -1).astype(np.float64)
...     g = np.arange(meta["n_head"]) // (meta["n_head"] // meta["n_head_kv"])
...     s = np.einsum("qhd,thd->qht", q, K[:, g]) * meta["scale"] + meta["mask"][:, None, :]
...     p = np.exp(s - s.max(-1, keepdims=True))
...     return np.einsum("qht,thd->qhd", p / p.sum(-1, keepdims=True), V[:, g])
>>> r = check_attention(kernel, AttentionSettings("q8_0", "q4_0", head_dim=64, contexts=(1, 9, 40), families=("decode",)))
>>> r.ok, r.counts()["wrong"]
(True, 0)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import ConfigError, check_int
from ..formats import get_format
from .attention_cases import (
    DEFAULT_FAMILIES,
    DIAGNOSES,
    FAMILIES,
    PRECISIONS,
    Q_TYPES,
    Arithmetic,
    AttentionCase,
    AttentionSettings,
    _causal,
    make_cases,
    same_cache_groups,
    stack_rows,
)
from .attention_reference import (
    _attend,
    _classify_rows,
    _prepare,
    _Prepared,
    _pv,
    _qk,
    attention_bound,
    reference_attention,
)
from .attention_repro import AttentionCounterexample
from .attention_targets import PROGRAM_PLACEHOLDERS, AttentionTarget, CallableAttention, ProgramAttention
from .classify import CLASSES, FRAGILE, WRONG
from .diagnose import Diagnosis
from .report import CheckReport, PhaseResult

__all__ = [
    "Arithmetic",
    "AttentionSettings",
    "AttentionCase",
    "AttentionTarget",
    "CallableAttention",
    "ProgramAttention",
    "PROGRAM_PLACEHOLDERS",
    "AttentionReport",
    "AttentionCounterexample",
    "check_attention",
    "make_cases",
    "same_cache_groups",
    "stack_rows",
    "reference_attention",
    "attention_bound",
    "diagnose_attention",
    "DIAGNOSES",
    "FAMILIES",
    "DEFAULT_FAMILIES",
    "Q_TYPES",
    "PRECISIONS",
]

# ---------------------------------------------------------------------------------------------------------------
# classification, minimal case, diagnosis
# ---------------------------------------------------------------------------------------------------------------


def _hypotheses(case: AttentionCase, s: AttentionSettings, p: _Prepared) -> dict[str, NDArray[np.float64]]:
    """The output of each defect of :data:`DIAGNOSES` that applies to ``case`` (float64)."""
    n_q, H, G, T, D = case.shape
    sc, cap, mask, sinks = case.scale, case.softcap, case.mask, case.sinks
    hyp: dict[str, NDArray[np.float64]] = {}
    hyp["uniform"] = _attend(np.zeros_like(p.q), p.K, p.V, mask, sc, cap, sinks)[0]
    hyp["scale_1_over_d"] = _attend(p.q, p.K, p.V, mask, 1.0 / D, cap, sinks)[0]
    hyp["scale_missing"] = _attend(p.q, p.K, p.V, mask, 1.0, cap, sinks)[0]
    hyp["kv_swapped"] = _attend(p.q, p.V, p.K, mask, sc, cap, sinks)[0]
    if G > 1 and H > G:
        hyp["gqa_modulo"] = _attend(p.q, p.K, p.V, mask, sc, cap, sinks, mapping="mod")[0]
    if n_q > 1 and np.array_equal(mask, _causal(n_q, T)):
        plus = np.where(np.arange(T)[None, :] <= T - n_q + np.arange(n_q)[:, None] + 1, 0, -np.inf).astype(np.float32)
        minus = np.where(np.arange(T)[None, :] < T - n_q + np.arange(n_q)[:, None], 0, -np.inf).astype(np.float32)
        hyp["causal_plus_one"] = _attend(p.q, p.K, p.V, plus, sc, cap, sinks)[0]
        hyp["causal_minus_one"] = _attend(p.q, p.K, p.V, minus, sc, cap, sinks)[0]
    if sinks is not None:
        hyp["sinks_ignored"] = _attend(p.q, p.K, p.V, mask, sc, cap, None)[0]
    if cap:
        hyp["softcap_missing"] = _attend(p.q, p.K, p.V, mask, sc, 0.0, sinks)[0]
    kf, vf = s.k_format, s.v_format
    rotation = getattr(kf, "rotation", None)
    if rotation is not None and (kf.domain.decode_domain == "rotated" or kf.attention.domain == "rotated"):
        bs = kf.block_size

        def rot(x: NDArray[np.float64], n: int) -> NDArray[np.float64]:
            y = x.reshape(*x.shape[:-1], -1, bs)
            for _ in range(abs(n)):
                y = np.asarray(rotation.forward(y) if n > 0 else rotation.inverse(y), np.float64)
            return y.reshape(x.shape)

        # the kernel reads the keys in the rotated domain, R(k): q . R(k) (missing), R(R(q)) . R(k) (twice)
        Kr = rot(p.K, 1)
        hyp["q_rotation_missing"] = _attend(p.q, Kr, p.V, mask, sc, cap, sinks)[0]
        hyp["q_rotation_twice"] = _attend(rot(p.q, 2), Kr, p.V, mask, sc, cap, sinks)[0]
    vrot = getattr(vf, "rotation", None)
    if vrot is not None and (vf.domain.decode_domain == "rotated" or vf.attention.domain == "rotated"):
        bs = vf.block_size
        ref = _attend(p.q, p.K, p.V, mask, sc, cap, sinks)[0]
        r1 = np.asarray(vrot.forward(ref.reshape(n_q, H, -1, bs)), np.float64)
        hyp["out_rotation_missing"] = r1.reshape(ref.shape)
        hyp["out_rotation_twice"] = np.asarray(vrot.inverse(ref.reshape(n_q, H, -1, bs)), np.float64).reshape(ref.shape)
    return hyp


def diagnose_attention(
    case: AttentionCase,
    got: NDArray[np.float32],
    ref: NDArray[np.float64],
    bound: NDArray[np.float64],
    s: AttentionSettings,
    p: _Prepared,
    ar: Arithmetic | None = None,
) -> list[Diagnosis]:
    """The defects whose output ``got`` matches (every row within the bound of the defect's output, or the
    deviation from tbq explained to 5%), with the evidence."""
    n_q, H, G, T, D = case.shape
    found: list[Diagnosis] = []
    masked = ~np.any(np.isfinite(case.mask), axis=1)  # (n_q,)
    nan_rows = ~np.all(np.isfinite(got), axis=-1)  # (n_q, H)
    if masked.any() and nan_rows[masked].any() and not nan_rows[~masked].any():
        rows = np.flatnonzero(masked).tolist()
        found.append(
            Diagnosis(
                "nan_all_masked",
                DIAGNOSES["nan_all_masked"],
                [
                    f"query rows {rows} have every token masked (-inf): tbq gives zeros there, the kernel NaN",
                    "the other rows are finite; define the empty softmax as zeros (S == 0 -> output 0)",
                ],
                "attention",
            )
        )
        return found
    if nan_rows.any():
        w = np.broadcast_to(np.exp(np.where(np.isfinite(case.mask)[:, None, :], 0.0, -np.inf)), (n_q, H, T))
        peak = float(np.max(_pv(w, np.abs(p.V))))  # the unnormalized sum at equal weights
        over = float(np.max(np.abs(_pv(w, p.V))))
        if over > 65504 or peak > 65504:
            found.append(
                Diagnosis(
                    "f16_overflow",
                    DIAGNOSES["f16_overflow"],
                    [
                        f"{int(nan_rows.sum())} of {nan_rows.size} rows are inf or NaN where tbq's output is finite "
                        f"(largest |tbq| {np.max(np.abs(ref)):.6g})",
                        f"the sum of |v| over the visible tokens reaches {peak:.6g} (f16's largest finite value: 65504): "
                        "an f16 accumulator of sum_t exp(s_t - M) v_t overflows; accumulate in f32 or rescale",
                    ],
                    "attention",
                )
            )
            return found
    dev = np.abs(got.astype(np.float64) - ref)
    total = float(np.max(dev)) if np.all(np.isfinite(dev)) else np.inf
    a = ar or Arithmetic("float32", "float32", "float32")
    if a.v == "float32" or a.softmax == "float32":
        b16 = attention_bound(case, s, a.q or "float32", "float16", "float16", p)
        if np.all(np.isfinite(dev)) and np.all(np.max(dev, axis=-1) <= b16):
            found.append(
                Diagnosis(
                    "f16_undeclared",
                    DIAGNOSES["f16_undeclared"],
                    [
                        f"largest difference from tbq {total:.3g}: outside the declared bound "
                        f"{float(np.max(bound)):.3g}, inside the f16 one {float(np.max(b16)):.3g}",
                        "if the kernel accumulates or weights in f16 by design, declare it (--v-acc float16, "
                        "--softmax float16; Arithmetic(v='float16', softmax='float16'))",
                    ],
                    "attention",
                )
            )
            return found
    scored = []
    for name, h in _hypotheses(case, s, p).items():
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.max(np.abs(got.astype(np.float64) - h), axis=-1)
        if not np.all(np.isfinite(e)):
            continue
        within = bool(np.all(e <= bound))  # the defect's output, to the kernel's own rounding
        explained = bool(np.isfinite(total) and float(np.max(e)) <= 0.05 * total)
        if within or explained:
            scored.append((float(np.max(e)), name, within))
    best = min((x[0] for x in scored), default=0.0)
    for e_max, name, within in sorted(scored):
        if e_max > 2 * best + 1e-300 and not within:
            continue  # another defect explains the output better
        found.append(
            Diagnosis(
                name,
                DIAGNOSES[name],
                [
                    f"the kernel's output is within {e_max:.3g} of that defect's output "
                    + ("(inside the bound of every row; " if within else "(")
                    + f"largest difference from tbq {total:.3g}, bound {float(np.max(bound)):.3g})"
                ]
                + (_uniform_evidence(case, p) if name == "uniform" else []),
                "attention",
            )
        )
    return found


def _uniform_evidence(case: AttentionCase, p: _Prepared) -> list[str]:
    n_q, H, G, T, D = case.shape
    sc = _qk(p.q, p.K) * case.scale
    return [
        f"tbq's scores of this case span {float(sc.min()):.4g} .. {float(sc.max()):.4g}; the kernel's output is "
        "what scores all 0 give: every visible token weighted 1/T",
        "e.g. a query converted to a block type whose blocks are longer than head_dim (ggml's q8_K: 256 values) "
        "leaves no block to multiply",
    ]


class AttentionReport(CheckReport):
    """A :class:`~tbq.check.report.CheckReport` of an attention check: direction ``"attention"``, phases the
    families, counts per output row (query token x head): exact, in bound (the ``fragile`` count), wrong."""

    @property
    def directions(self) -> list[str]:
        return ["attention"] if self.phases else []

    def table(self) -> str:
        return super().table().replace("    blocks", "      rows", 1).replace("  fragile", " in bound", 1)

    def verdict(self) -> str:
        c = self.counts()
        if self.ok:
            return (
                f"PASS: {c['blocks']:,} output rows, none wrong; {c['exact']:,} exact, {c['fragile']:,} within the "
                "derived bound"
            )
        return f"FAIL: {c['wrong']:,} wrong of {c['blocks']:,} output rows"


# ---------------------------------------------------------------------------------------------------------------
# the check
# ---------------------------------------------------------------------------------------------------------------


def _declared(target: AttentionTarget, s: AttentionSettings) -> tuple[Arithmetic, list[str]]:
    """The arithmetic the bound uses: the settings' where given, else the target's defaults; notes on choices."""
    base = target.defaults(s)
    a = s.arithmetic
    ar = Arithmetic(
        a.q or base.q or "float32", a.softmax if a.softmax != "float32" else base.softmax, a.v or base.v or "float32"
    )
    notes = []
    if ar.q is not None and ar.q not in PRECISIONS:
        bs = get_format(ar.q).block_size
        if s.head_dim % bs:
            notes.append(
                f"the query's declared conversion {ar.q} takes blocks of {bs} values and head_dim is {s.head_dim}: "
                "the reference keeps the query in float32"
            )
            ar = replace(ar, q="float32")
    return ar, notes


def check_attention(
    target: AttentionTarget | Callable[..., Any],
    settings: AttentionSettings,
    *,
    out: str | os.PathLike[str] | None = None,
    batch: int = 256,
) -> AttentionReport:
    """Check an attention kernel (an :class:`AttentionTarget`, or a Python function ``(q, k, v, meta) -> out``)
    on the cases of ``settings``; returns an :class:`AttentionReport` (``report.ok``; ``str(report)``).

    ``out``: a directory for the smallest failing case's ``.npz``, ``.py`` (and, for a ggml build, ``.c``)
    reproducers, written only when something is wrong. ``batch``: cases given to the target at once."""
    if not isinstance(settings, AttentionSettings):
        raise ConfigError(f"settings must be an AttentionSettings, got {type(settings).__name__}")
    tgt = target if isinstance(target, AttentionTarget) else CallableAttention(target)
    check_int(batch, "batch", lo=1, error=ConfigError)
    t_start = time.perf_counter()
    try:
        s, filled = tgt.check_settings(settings)
        ar, notes = _declared(tgt, s)
        notes = filled + notes
        opts = {"k_type": s.k_type, **{f"k.{k}": v for k, v in s.k_options.items()}}
        opts.update({"v_type": s.v_type, **{f"v.{k}": v for k, v in s.v_options.items()}, "head_dim": s.head_dim})
        report = AttentionReport(
            "attention",
            options=opts,
            target=tgt.description,
            settings={
                "families": list(s.families),
                "contexts": list(s.contexts),
                "ratios": list(s.ratios),
                "prefill": list(s.prefill),
                "seed": s.seed,
                "arithmetic": {"q": ar.q, "softmax": ar.softmax, "v": ar.v},
                "bound": "(expm1(2 eps) + (2 T + 16) u_acc + 2 u_softmax + u (spread + 1)) max|V| + u |o|, widened 1%",
            },
        )
        report.unit = "output rows"
        report.provenance = tgt.provenance()
        report.notes.extend(notes)
        cases = make_cases(s)
        # the smallest wrong case: a plain one (no sinks, softcap or mask) before others, then the fewest tokens
        worst: tuple[tuple[int, int, int], AttentionCase] | None = None
        for fam in s.families:
            t0 = time.perf_counter()
            fc = [c for c in cases if c.family == fam]
            counts = np.zeros(len(CLASSES), np.int64)
            tight = 0.0  # the largest |out - tbq| / bound of the rows in bound
            for b0 in range(0, len(fc), batch):
                chunk = fc[b0 : b0 + batch]
                outs = tgt.run_many(chunk, s)
                for group in same_cache_groups(chunk):
                    # the decode steps over one cache judged at once, as the rows of one call (the bound is per row)
                    cls_all, ref_all, bound_all, _ = _judge(
                        stack_rows([chunk[i] for i in group]), np.concatenate([outs[i] for i in group]), s, ar
                    )
                    for n_row, i in enumerate(group):
                        c, got = chunk[i], outs[i]
                        rows = slice(n_row, n_row + 1) if len(group) > 1 else slice(None)
                        cls, ref, bound = cls_all[rows], ref_all[rows], bound_all[rows]
                        counts += np.bincount(cls.reshape(-1), minlength=len(CLASSES))
                        with np.errstate(invalid="ignore", divide="ignore"):
                            err = np.max(np.abs(got - ref), axis=-1)
                            used = np.where(bound > 0, err / np.where(bound > 0, bound, 1), 0.0)
                        if np.any(cls == FRAGILE):
                            tight = max(tight, float(np.max(used[cls == FRAGILE])))
                        if np.any(cls == WRONG):
                            extras = c.sinks is not None or bool(c.softcap) or not np.all(c.mask == 0)
                            key = (int(extras), c.shape[3], c.shape[1] * c.shape[0])
                            if worst is None or key < worst[0]:
                                worst = (key, c)
            n = len(fc)
            note = f"{n} case{'s' * (n != 1)}" + (f"; rows in bound use up to {_percent(tight)} of it" if tight else "")
            report.phases.append(PhaseResult.from_counts("attention", fam, counts, time.perf_counter() - t0, note))
        if worst is not None:
            ce, diags = _minimal(tgt, worst[1], s, ar)
            report.counterexamples["attention"] = ce
            report.diagnoses.extend(diags)
    finally:
        tgt.close()
    report.seconds = time.perf_counter() - t_start
    if out is not None and report.counterexamples:
        try:
            report.save(out, s.k_format, {"attention": tgt.symbol}, {"attention": tgt.link_libraries()})
        except OSError as exc:
            report.notes.append(f"the counterexample files could not be written to {out}: {exc.strerror or exc}")
    return report


def _percent(x: float) -> str:
    """``0.072%``, ``9.6%``, ``99%``: two significant digits, never an exponent."""
    p = 100 * x
    return f"{p:.0f}%" if p >= 10 else f"{p:.2g}%" if p >= 0.01 else "<0.01%"


def _judge(
    c: AttentionCase, got: NDArray[np.float32], s: AttentionSettings, ar: Arithmetic
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64], _Prepared]:
    p = _prepare(c, s, ar.q or "float32")
    ref = _attend(p.q, p.K, p.V, c.mask, c.scale, c.softcap, c.sinks)[0]
    bound = attention_bound(c, s, ar.q or "float32", ar.v or "float32", ar.softmax, p, ref)
    return _classify_rows(got, ref, bound), ref, bound, p


def _minimal(
    tgt: AttentionTarget, case: AttentionCase, s: AttentionSettings, ar: Arithmetic
) -> tuple[AttentionCounterexample, list[Diagnosis]]:
    """The smallest failing variant of ``case``: one head where one head fails, then the fewest tokens."""
    calls = 0

    def fails(c: AttentionCase) -> bool:
        nonlocal calls
        calls += 1
        got = tgt.run(c, s)
        return bool(np.any(_judge(c, got, s, ar)[0] == WRONG))

    best = case
    T = case.shape[3]
    got = tgt.run(case, s)
    rows = _judge(case, got, s, ar)[0]
    wrong_heads = np.flatnonzero(np.any(rows == WRONG, axis=0))
    for h in wrong_heads[:4]:
        one = case.subset(heads=[int(h)])
        if fails(one):
            best = one
            break
    steps = sorted({1, 2, 3, 4, 8, 16, 32, 64, 128, 256} | {T})
    for t in steps:
        if t >= best.shape[3]:
            break
        n_q, T_best = best.shape[0], best.shape[3]
        if n_q > 1 and np.array_equal(best.mask, _causal(n_q, T_best)) and n_q - (T_best - t) < 1:
            continue  # no query of the causal prefill lies within the first t tokens
        c = best.subset(tokens=t)
        if not np.any(np.isfinite(c.mask)) and np.any(np.isfinite(best.mask)):
            continue
        if fails(c):
            best = c
            break
    got = tgt.run(best, s)
    cls, ref, bound, p = _judge(best, got, s, ar)
    how = f"the first wrong case cut to {best.shape[1]} head{'s' * (best.shape[1] != 1)} and {best.shape[3]} tokens ({calls} kernel calls)"
    ce = AttentionCounterexample(case=best, expected=ref, bound=bound, got=got, settings=s, arithmetic=ar, how=how)
    ce.c_source = tgt.repro_c(ce, s)
    return ce, diagnose_attention(best, got, ref, bound, s, p, ar)
