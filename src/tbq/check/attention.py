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

import json
import math
import os
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..codecs import codec_from
from ..errors import ConfigError, check_choice, check_int, check_number
from ..formats import Format, format_name, get_format
from .classify import CLASSES, EXACT, FRAGILE, WRONG
from .diagnose import Diagnosis
from .report import CheckReport, PhaseResult
from .targets import TargetError, _to_numpy

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

U32 = 2.0**-24
U16 = 2.0**-11
#: Conversions of the query a kernel may declare: kept in float32, or ggml's vec_dot_type conversions.
#: Float precisions a kernel may compute in (numpy's names; bfloat16 rounds to nearest even on the top 16 bits).
PRECISIONS = ("float32", "float16", "bfloat16")
Q_TYPES = PRECISIONS + ("q8_0", "q8_k")
#: The families of cases, in the order they run. ``overflow`` (not run by default) holds value caches whose
#: unnormalized weighted sum exceeds f16's range (65504): right in float32, out of reach of an f16 accumulator.
FAMILIES = ("decode", "prefill", "gqa", "mask", "sinks", "softcap", "stress", "overflow")
#: The families a check runs unless told otherwise.
DEFAULT_FAMILIES = FAMILIES[:-1]
#: Roundings besides one per addition and rescale: the scale product, exp, the division, the output, a split
#: of the tokens among threads and its merge.
EXTRA_ROUNDINGS = 16
#: Fragility margin (float32 ulps) of the query's converter: a SIMD converter multiplies by ``127/max`` where the
#: reference multiplies by ``1/d`` and rounds ties to even; 8 ulps covers both (``tbq check``'s row margin).
Q_FRAGILE_ULPS = 8
#: The diagnoses :func:`diagnose_attention` tries, in order: ``name -> title``.
DIAGNOSES = {
    "nan_all_masked": "NaN from an all-masked row: a query row whose every token is masked gives NaN (0/0), not zeros",
    "f16_overflow": "f16 overflow in the accumulator: the unnormalized sum of weighted values exceeds 65504",
    "f16_undeclared": "f16 arithmetic not declared: the output is within the bound of an f16 accumulator and f16 "
    "weights, not of the float32 arithmetic declared",
    "uniform": "all scores zero: uniform attention, the output is the mean of V over the visible tokens",
    "scale_1_over_d": "softmax scale wrong: 1/head_dim instead of 1/sqrt(head_dim)",
    "scale_missing": "softmax scale missing: the scores are not scaled",
    "kv_swapped": "K and V swapped: the scores read the V cache and the output the K cache",
    "gqa_modulo": "GQA head mapping wrong: query head h reads KV head h % n_kv instead of h // (n_head / n_kv)",
    "causal_plus_one": "causal mask off by one: each query token also sees the next token",
    "causal_minus_one": "causal mask off by one: each query token does not see itself",
    "sinks_ignored": "sinks ignored: the sink logits are left out of the softmax's denominator",
    "softcap_missing": "soft-capping missing: the scores are not capped (softcap * tanh(s / softcap))",
    "q_rotation_missing": "Q rotation missing: the scores take the unrotated query against the rotated keys",
    "q_rotation_twice": "Q rotation applied twice",
    "out_rotation_missing": "output rotation missing: the output stays in the rotated domain",
    "out_rotation_twice": "output rotation applied twice",
}


# ---------------------------------------------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arithmetic:
    """What a kernel declares about its arithmetic; the bound follows from it.

    ``q``: the query's conversion before the scores (:data:`Q_TYPES`; ``None``: the target's default);
    ``softmax``: ``"float32"`` or ``"float16"`` (the weights ``exp(s - M)`` rounded to f16); ``v``: the accumulator of
    the weighted values, ``"float32"`` or ``"float16"`` (``None``: the target's default)."""

    q: str | None = None
    softmax: str = "float32"
    v: str | None = None

    def __post_init__(self) -> None:
        if self.q is not None:
            check_choice(self.q, "q (the query's conversion)", Q_TYPES, error=ConfigError)
        check_choice(self.softmax, "softmax", PRECISIONS[:2], error=ConfigError)
        if self.v is not None:
            check_choice(self.v, "v (the accumulator)", PRECISIONS[:2], error=ConfigError)


@dataclass(frozen=True)
class AttentionSettings:
    """What an attention check runs: the caches' formats and shapes, the families of cases, the arithmetic.

    ``k_type``/``v_type``: registered formats (``k_options``/``v_options``: their options, e.g.
    ``{"codebook": "turboq-mtp"}``); ``head_dim``; ``contexts``: the cache lengths of the decode family (the
    other families take theirs from it); ``ratios``: GQA ratios ``n_head / n_head_kv`` of the ``gqa`` family;
    ``queries``: decode steps per cache; ``prefill``: query tokens of the prefill family's calls (each over a
    cache of as many tokens, causal); ``families``: which of :data:`FAMILIES` run; ``scale``: the logit scale
    (``None``: ``1/sqrt(head_dim)``); ``softcap`` of the softcap family; ``arithmetic``; ``seed``."""

    k_type: str
    v_type: str
    head_dim: int = 128
    k_options: dict[str, Any] = field(default_factory=dict)
    v_options: dict[str, Any] = field(default_factory=dict)
    contexts: tuple[int, ...] = (1, 2, 5, 16, 33, 100, 512, 4096, 32768)
    ratios: tuple[int, ...] = (1, 4, 8)
    queries: int = 2
    prefill: tuple[int, ...] = (7, 64, 256)
    families: tuple[str, ...] = DEFAULT_FAMILIES
    scale: float | None = None
    softcap: float = 20.0
    arithmetic: Arithmetic = field(default_factory=Arithmetic)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("k_type", "v_type"):
            try:
                object.__setattr__(self, name, format_name(getattr(self, name)))
            except ConfigError:
                raise ConfigError(f"{name} {getattr(self, name)!r} is not a registered format") from None
        for name in ("k_options", "v_options"):
            if not isinstance(getattr(self, name), dict):
                raise ConfigError(f"{name} must be a dict of format options, got {getattr(self, name)!r}")
        check_int(self.head_dim, "head_dim", lo=1, hi=4096, error=ConfigError)
        for fmt in (self.k_format, self.v_format):
            if self.head_dim % fmt.block_size:
                raise ConfigError(
                    f"head_dim {self.head_dim} is not a multiple of {fmt.name}'s block size {fmt.block_size}"
                )
        for name, lo in (("contexts", 1), ("ratios", 1), ("prefill", 1)):
            v = getattr(self, name)
            if isinstance(v, (int, np.integer)):
                v = (int(v),)
            try:
                v = tuple(int(check_int(x, name, lo=lo, hi=1 << 20, error=ConfigError)) for x in v)
            except TypeError:
                raise ConfigError(f"{name} must be integers, got {v!r}") from None
            if not v and name == "contexts":
                raise ConfigError("contexts must hold at least one cache length")
            object.__setattr__(self, name, v)
        check_int(self.queries, "queries", lo=1, hi=4096, error=ConfigError)
        fams = (self.families,) if isinstance(self.families, str) else tuple(self.families)
        for f in fams:
            check_choice(f, "family", FAMILIES, error=ConfigError)
        if not fams:
            raise ConfigError(f"families must name at least one of {', '.join(FAMILIES)}")
        object.__setattr__(self, "families", fams)
        if self.scale is not None:
            check_number(self.scale, "scale", lo=0, lo_open=True, hi=1e30)
        check_number(self.softcap, "softcap", lo=0, lo_open=True, hi=1e6)
        if not isinstance(self.arithmetic, Arithmetic):
            raise ConfigError(f"arithmetic must be an Arithmetic, got {type(self.arithmetic).__name__}")
        check_int(self.seed, "seed", lo=0, error=ConfigError)

    @property
    def k_format(self) -> Format:
        return get_format(self.k_type, **self.k_options)

    @property
    def v_format(self) -> Format:
        return get_format(self.v_type, **self.v_options)

    @property
    def logit_scale(self) -> float:
        return float(np.float32(1.0 / math.sqrt(self.head_dim) if self.scale is None else self.scale))


# ---------------------------------------------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class AttentionCase:
    """One call of the kernel. ``q`` float32 ``(n_q, n_head, D)``; ``k``/``v`` uint8 ``(T, n_head_kv, row
    bytes)`` (each row ``D`` values encoded in the format); ``mask`` float32 ``(n_q, T)`` added to the scores
    (0 or -inf; f16-exact); ``sinks`` float32 ``(n_head,)`` sink logits or None; ``scale``, ``softcap`` (0: none)."""

    family: str
    label: str
    q: NDArray[np.float32]
    k: NDArray[np.uint8]
    v: NDArray[np.uint8]
    mask: NDArray[np.float32]
    sinks: NDArray[np.float32] | None
    scale: float
    softcap: float = 0.0

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """``(n_q, n_head, n_head_kv, T, D)``."""
        return (self.q.shape[0], self.q.shape[1], self.k.shape[1], self.k.shape[0], self.q.shape[2])

    def meta(self, s: AttentionSettings) -> dict[str, Any]:
        """What a Python kernel receives besides the arrays."""
        n_q, H, G, T, D = self.shape
        return {
            "k_type": s.k_type,
            "v_type": s.v_type,
            "k_options": dict(s.k_options),
            "v_options": dict(s.v_options),
            "head_dim": D,
            "n_query": n_q,
            "n_head": H,
            "n_head_kv": G,
            "n_tokens": T,
            "scale": self.scale,
            "softcap": self.softcap,
            "mask": self.mask.copy(),
            "sinks": None if self.sinks is None else self.sinks.copy(),
        }

    def subset(self, heads: Sequence[int] | None = None, tokens: int | None = None) -> AttentionCase:
        """This case with the query heads ``heads`` of one KV head (then ``n_head_kv = 1``) and/or the first
        ``tokens`` tokens (a causal prefill keeps the queries at those positions, causal)."""
        c = self
        if heads is not None:
            n_q, H, G, T, D = c.shape
            g = heads[0] // (H // G)
            c = replace(
                c,
                q=np.ascontiguousarray(c.q[:, list(heads)]),
                k=np.ascontiguousarray(c.k[:, g : g + 1]),
                v=np.ascontiguousarray(c.v[:, g : g + 1]),
                sinks=None if c.sinks is None else np.ascontiguousarray(c.sinks[list(heads)]),
            )
        if tokens is not None:
            n_q, T = c.q.shape[0], c.k.shape[0]
            q, mask = c.q, c.mask[:, :tokens]
            if n_q > 1 and np.array_equal(c.mask, _causal(n_q, T)):  # a causal prefill stays one: the queries
                keep = n_q - (T - tokens)  # at the first `tokens` positions, each seeing up to itself
                if keep < 1:
                    raise ConfigError(f"a causal case of {n_q} queries over {T} tokens has none within {tokens}")
                q, mask = c.q[:keep], _causal(keep, tokens)
            c = replace(
                c,
                q=np.ascontiguousarray(q),
                k=np.ascontiguousarray(c.k[:tokens]),
                v=np.ascontiguousarray(c.v[:tokens]),
                mask=np.ascontiguousarray(mask),
            )
        return c


def _same_cache(a: AttentionCase, b: AttentionCase) -> bool:
    """True when ``a`` and ``b`` are decode steps (one query token) over the same cache arrays, with the same
    mask, scale and softcap and no sink logits: one call of the kernel, or one judgement, may take both."""
    return (
        a.k is b.k
        and a.v is b.v
        and a.q.shape == b.q.shape
        and a.q.shape[0] == 1
        and a.sinks is None
        and b.sinks is None
        and a.scale == b.scale
        and a.softcap == b.softcap
        and np.array_equal(a.mask, b.mask)
    )


def same_cache_groups(cases: Sequence[AttentionCase]) -> list[list[int]]:
    """Indices of consecutive ``cases`` that :func:`_same_cache` puts together, in order."""
    groups: list[list[int]] = []
    for i, c in enumerate(cases):
        if groups and _same_cache(cases[groups[-1][0]], c):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def stack_rows(cases: Sequence[AttentionCase]) -> AttentionCase:
    """Decode steps over one cache (:func:`same_cache_groups`) as one case whose query rows are theirs."""
    if len(cases) == 1:
        return cases[0]
    c = cases[0]
    q = np.concatenate([x.q for x in cases])
    return replace(c, q=q, mask=np.repeat(c.mask, len(cases), axis=0))


def _encode(fmt: Format, x: NDArray[np.float32]) -> NDArray[np.uint8]:
    """float32 ``(T, G, D)`` -> uint8 ``(T, G, row bytes)`` in ``fmt`` (tbq's codec, the fast backend)."""
    T, G, D = x.shape
    data = codec_from(fmt.name, fmt.config()).encode(x.reshape(T * G, D))
    return np.ascontiguousarray(data.reshape(T, G, -1))


def _causal(n_q: int, T: int) -> NDArray[np.float32]:
    """Query token ``i`` is the cache's token ``T - n_q + i`` and sees the tokens up to itself."""
    t = np.arange(T)[None, :]
    i = np.arange(n_q)[:, None]
    return np.where(t <= T - n_q + i, np.float32(0), np.float32(-np.inf)).astype(np.float32)


def make_cases(s: AttentionSettings) -> list[AttentionCase]:
    """The cases of the settings' families (deterministic in ``s.seed``)."""
    rng = np.random.default_rng(s.seed * 7919 + 11)
    D, kf, vf, sc = s.head_dim, s.k_format, s.v_format, s.logit_scale
    out: list[AttentionCase] = []
    encoded: dict[tuple[int, str], tuple[Any, NDArray[np.uint8]]] = {}  # id of the float values -> their bytes

    def enc(fmt: Format, x: Any) -> NDArray[np.uint8]:
        key = (id(x), fmt.name)
        if key not in encoded:  # the decode steps over one cache share its bytes (one array)
            encoded[key] = (x, _encode(fmt, np.asarray(x, np.float32)))
        return encoded[key][1]

    def case(
        family: str, label: str, q: Any, k: Any, v: Any, mask: Any = None, sinks: Any = None, cap: float = 0.0
    ) -> None:
        q = np.asarray(q, np.float32)
        T = np.asarray(k).shape[0]
        m = np.zeros((q.shape[0], T), np.float32) if mask is None else np.asarray(mask, np.float32)
        kb, vb = enc(kf, k), enc(vf, v)
        out.append(AttentionCase(family, label, q, kb, vb, m, None if sinks is None else np.float32(sinks), sc, cap))

    def normal(*shape: int) -> NDArray[np.float32]:
        return rng.standard_normal(shape).astype(np.float32)

    for fam in s.families:
        if fam == "decode":
            for T in s.contexts:
                k, v = normal(T, 2, D), normal(T, 2, D)
                for i in range(s.queries):
                    case(fam, f"T={T} H=8 G=2 #{i}", normal(1, 8, D), k, v)
        elif fam == "prefill":
            for n in s.prefill:
                for T, G in ((n, 1), (n + 37, 2)):  # the prompt alone, then after 37 earlier tokens
                    q, k, v = normal(n, 4, D), normal(T, G, D), normal(T, G, D)
                    case(fam, f"n_q={n} T={T} causal H=4 G={G}", q, k, v, _causal(n, T))
        elif fam == "gqa":
            for r in s.ratios:
                for T in sorted({min(s.contexts), 16, max(s.contexts)}):
                    G = 2 if r > 1 else 4
                    case(fam, f"ratio={r} T={T} H={G * r} G={G}", normal(1, G * r, D), normal(T, G, D), normal(T, G, D))
        elif fam == "mask":
            for T in (3, 40, 300):
                m = np.where(rng.random((4, T)) < 0.3, np.float32(-np.inf), np.float32(0)).astype(np.float32)
                m[1] = -np.inf  # a fully masked row
                m[2, :] = -np.inf
                m[2, T // 2] = 0  # one visible token
                case(
                    fam,
                    f"n_q=4 T={T} random -inf, row 1 all -inf",
                    normal(4, 4, D),
                    normal(T, 2, D),
                    normal(T, 2, D),
                    m,
                )
        elif fam == "sinks":
            for T in (1, 20, 200):
                sinks = rng.uniform(-2, 6, 8).astype(np.float32)
                case(fam, f"T={T} sink logits", normal(1, 8, D), normal(T, 2, D), normal(T, 2, D), sinks=sinks)
        elif fam == "softcap":
            for T in (2, 30, 300):
                case(
                    fam,
                    f"T={T} softcap={s.softcap:g}",
                    6 * normal(1, 8, D),
                    normal(T, 2, D),
                    normal(T, 2, D),
                    cap=s.softcap,
                )
        elif fam == "stress":
            for T in (8, 256):
                k, v = normal(T, 2, D), normal(T, 2, D)
                q = normal(1, 8, D) * 0.05
                q[0, :4] = k[T // 3, 0] * 3  # one dominant score per head of KV head 0
                case(fam, f"T={T} one dominant score", q, k, v)
                case(fam, f"T={T} all scores equal (q = 0)", np.zeros((1, 8, D), np.float32), k, v)
                kk = np.repeat(normal(1, 2, D), T, axis=0)
                case(fam, f"T={T} all keys equal", normal(1, 8, D), kk, v)
                case(fam, f"T={T} huge norms (|q| x 64, |k| x 64)", normal(1, 8, D) * 64, k * 64, v)
                case(fam, f"T={T} tiny norms (x 2**-20)", normal(1, 8, D) * 2**-20, k * 2**-20, v * 2**-20)
                case(fam, f"T={T} large values (|v| x 1000)", normal(1, 8, D), k, v * 1000)
        elif fam == "overflow":
            for T, mean in ((256, 300.0), (1024, 100.0)):
                k = normal(T, 2, D)
                v = mean + normal(T, 2, D)
                case(fam, f"T={T} all scores equal, v = {mean:g} + N(0, 1)", np.zeros((1, 8, D), np.float32), k, v)
                case(fam, f"T={T} random scores, v = {mean:g} + N(0, 1)", normal(1, 8, D), k, v)
    return out


# ---------------------------------------------------------------------------------------------------------------
# reference and bound
# ---------------------------------------------------------------------------------------------------------------


def _rotated(fmt: Format) -> bool:
    """True for a format decoded or read in a rotated domain (TBQ, turbo): a kernel's float32 rotation rounds."""
    return fmt.domain.decode_domain == "rotated" or fmt.attention.domain == "rotated"


def _values(fmt: Format, data: NDArray[np.uint8], D: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(values, slack)`` float64 ``(T, G, D)`` of a cache in the original domain: tbq's float32 decoder (mapped
    back from the rotated domain for turbo types, in float64) and the largest legitimate deviation of a kernel's
    decoded value (``decode_tolerance``, plus for formats decoded or read in a rotated domain the roundings of a
    float32 rotation, ``(log2(block) + 2) * u * sum|block| / sqrt(block)``)."""
    T, G, _ = data.shape
    blocks = data.reshape(-1, fmt.type_size)
    y = codec_from(fmt.name, fmt.config()).decode(blocks).reshape(T * G, D)
    vals = np.asarray(fmt.domain.from_decode_domain(y.astype(np.float64)), np.float64).reshape(T, G, D)
    slack = np.asarray(fmt.decode_tolerance(blocks), np.float64).reshape(T, G, D)
    if _rotated(fmt):
        bs = fmt.block_size
        b = np.abs(vals.reshape(T, G, D // bs, bs)).sum(-1, keepdims=True) / math.sqrt(bs)
        slack = slack + np.broadcast_to((math.log2(bs) + 2) * U32 * b, (T, G, D // bs, bs)).reshape(T, G, D)
    return vals, slack


def _round_float(x: NDArray[np.float32], precision: str) -> NDArray[np.float64]:
    """float32 ``x`` rounded to ``precision`` (:data:`PRECISIONS`, to nearest even), as float64."""
    if precision == "bfloat16":
        b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
        r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
        return (r & 0xFFFFFFFF).astype(np.uint32).view(np.float32).astype(np.float64)
    return x.astype(np.dtype(precision)).astype(np.float64)


def _convert_q(q: NDArray[np.float32], q_type: str) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(q', dq)``: the query as the kernel's scores use it (float64) and the step a fragile converted value may
    be off by (0 elsewhere)."""
    shape = q.shape
    if q_type in PRECISIONS:  # rounded to nearest even: no converter may differ
        return _round_float(q, q_type), np.zeros(shape)
    fmt = get_format(q_type)
    rows = q.reshape(-1, fmt.block_size)
    data, trace = fmt.encode(rows, trace=True)
    qv = fmt.decode(data).astype(np.float64).reshape(shape)
    d = np.abs(np.asarray(fmt.fields(data)["d"], np.float64)).reshape(-1, 1)
    frag = np.asarray(fmt.fragile_values(trace, Q_FRAGILE_ULPS), bool).reshape(rows.shape)
    step = np.where(frag, d, 0.0)
    fp16_scale = any(f.name == "d" and f.kind == "f16" for f in fmt.info.layout)  # q8_0's; q8_k's is float32
    fs = np.asarray(fmt.fragile_scales(trace, Q_FRAGILE_ULPS), bool).reshape(-1, 1) if fp16_scale else None
    if fs is not None:  # a scale one fp16 ulp away moves every value of the block by 2**-10 of itself
        step = step + np.where(fs, np.abs(qv.reshape(rows.shape)) * 2.0**-10, 0.0)
    return qv, step.reshape(shape)


@dataclass
class _Prepared:
    """A case's reference pieces, in float64: values, slacks, the converted query."""

    K: NDArray[np.float64]
    V: NDArray[np.float64]
    dK: NDArray[np.float64]
    q: NDArray[np.float64]
    dq: NDArray[np.float64]


#: Decoded caches kept for the cases that share them: ``(id(bytes), format) -> (bytes, values, slack)``.
_DECODED: dict[tuple[int, Format], tuple[NDArray[np.uint8], NDArray[np.float64], NDArray[np.float64]]] = {}
_DECODED_KEEP = 8


def _decoded(fmt: Format, data: NDArray[np.uint8], D: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    key = (id(data), fmt)
    hit = _DECODED.get(key)
    if hit is None or hit[0] is not data:
        vals, slack = _values(fmt, data, D)
        while len(_DECODED) >= _DECODED_KEEP:
            _DECODED.pop(next(iter(_DECODED)))
        _DECODED[key] = hit = (data, vals, slack)
    return hit[1], hit[2]


def _prepare(case: AttentionCase, s: AttentionSettings, q_type: str) -> _Prepared:
    D = case.q.shape[2]
    K, dK = _decoded(s.k_format, case.k, D)
    V, _ = _decoded(s.v_format, case.v, D)
    qv, dq = _convert_q(case.q, q_type)
    return _Prepared(K, V, dK, qv, dq)


def _kv_of_head(H: int, G: int, mapping: str = "div") -> NDArray[np.intp]:
    return np.arange(H) // (H // G) if mapping == "div" else np.arange(H) % G


def _qk(q: NDArray[np.float64], K: NDArray[np.float64], mapping: str = "div") -> NDArray[np.float64]:
    """``q . k_t`` ``(n_q, H, T)`` for query heads ``(n_q, H, D)`` over a cache ``(T, G, D)``: query head ``h``
    reads KV head ``h // (H / G)`` (``mapping="mod"``: ``h % G``), without copying the cache per head."""
    n_q, H, D = q.shape
    T, G, _ = K.shape
    if mapping != "div":
        return np.einsum("qhd,thd->qht", q, K[:, _kv_of_head(H, G, mapping)], optimize=True)
    return np.einsum("qgrd,tgd->qgrt", q.reshape(n_q, G, H // G, D), K, optimize=True).reshape(n_q, H, T)


def _pv(w: NDArray[np.float64], V: NDArray[np.float64], mapping: str = "div") -> NDArray[np.float64]:
    """``sum_t w_t v_t`` ``(n_q, H, D)`` for weights ``(n_q, H, T)`` over a cache ``(T, G, D)``."""
    n_q, H, T = w.shape
    G, D = V.shape[1], V.shape[2]
    if mapping != "div":
        return np.einsum("qht,thd->qhd", w, V[:, _kv_of_head(H, G, mapping)], optimize=True)
    return np.einsum("qgrt,tgd->qgrd", w.reshape(n_q, G, H // G, T), V, optimize=True).reshape(n_q, H, D)


def _attend(
    q: NDArray[np.float64],
    K: NDArray[np.float64],
    V: NDArray[np.float64],
    mask: NDArray[np.float32],
    scale: float,
    softcap: float,
    sinks: NDArray[np.float32] | None,
    mapping: str = "div",
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """float64 attention: ``(out (n_q, H, D), scores (n_q, H, T) before the mask)``; an all-masked row is zeros."""
    n_q, H, D = q.shape
    s = _qk(q, K, mapping) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    z = s + mask.astype(np.float64)[:, None, :]
    with np.errstate(invalid="ignore", over="ignore"):
        M = np.max(z, axis=-1, keepdims=True)
        if sinks is not None:
            M = np.maximum(M, sinks.astype(np.float64)[None, :, None])
        Mf = np.where(np.isfinite(M), M, 0.0)
        w = np.exp(z - Mf)
        tot = w.sum(-1)
        if sinks is not None:
            tot = tot + np.exp(sinks.astype(np.float64)[None, :] - Mf[..., 0])
        o = _pv(w, V, mapping)
        out = np.where(tot[..., None] > 0, o / np.where(tot > 0, tot, 1.0)[..., None], 0.0)
    return out, s


def reference_attention(case: AttentionCase, s: AttentionSettings, q_type: str = "float32") -> NDArray[np.float64]:
    """tbq's float64 output ``(n_q, n_head, D)`` of ``case``: the query converted as ``q_type`` declares, the caches
    decoded by tbq (in the original domain), exact softmax; an all-masked row is zeros."""
    p = _prepare(case, s, q_type)
    return _attend(p.q, p.K, p.V, case.mask, case.scale, case.softcap, case.sinks)[0]


def attention_bound(
    case: AttentionCase,
    s: AttentionSettings,
    q_type: str,
    v_acc: str,
    softmax: str = "float32",
    p: _Prepared | None = None,
    out: NDArray[np.float64] | None = None,
) -> NDArray[np.float64]:
    """The derived bound ``(n_q, n_head)`` of each output row (module docstring)."""
    p = p or _prepare(case, s, q_type)
    n_q, H, D = p.q.shape
    aK = np.abs(p.K)
    mag = _qk(np.abs(p.q), aK)
    frag = _qk(p.dq, aK)
    dec = _qk(np.abs(p.q), p.dK)
    if _rotated(s.k_format):  # the query rotated in float32 too: as many roundings as the keys' rotation
        dec = 2 * dec
    raw = _qk(p.q, p.K) * case.scale
    eps_t = case.scale * ((D + 8) * U32 * mag + frag + dec) + 4 * U32 * np.abs(raw)
    if case.softcap:
        eps_t = eps_t + 4 * U32 * case.softcap
    visible = np.isfinite(case.mask)[:, None, :]  # (n_q, 1, T)
    eps = np.max(np.where(visible, eps_t, 0.0), axis=-1)
    s_cap = case.softcap * np.tanh(raw / case.softcap) if case.softcap else raw
    z = s_cap + np.where(np.isfinite(case.mask), case.mask, 0.0)[:, None, :]
    hi, lo = np.max(np.where(visible, z, -np.inf), -1), np.min(np.where(visible, z, np.inf), -1)
    spread = np.where(np.isfinite(hi), hi - lo, 0.0)  # the largest |s_t - M| (0 for an all-masked row)
    if case.sinks is not None:
        spread = spread + np.abs(case.sinks)[None, :] + np.where(np.isfinite(hi), np.maximum(abs(hi), abs(lo)), 0.0)
    vt = np.abs(p.V).max(-1)[:, _kv_of_head(H, p.V.shape[1])]  # (T, H): the largest |v| of each token
    vmax = np.max(np.where(visible[:, 0, :, None], vt[None], 0.0), axis=1)  # (n_q, H): over the visible tokens
    T = np.sum(np.isfinite(case.mask), axis=1)[:, None]
    u_acc = U16 if v_acc == "float16" else U32
    u_sm = U16 if softmax == "float16" else 0.0
    rel = np.expm1(2 * eps) + (2 * T + 2) * u_acc + EXTRA_ROUNDINGS * U32 + 2 * u_sm + U32 * (spread + 1)
    if _rotated(s.v_format):  # a float32 rotation of the values or of the output: log2(block) + 2 roundings
        bs = s.v_format.block_size
        rel = rel + (math.log2(bs) + 2) * U32 * math.sqrt(bs)
    if out is None:
        out = _attend(p.q, p.K, p.V, case.mask, case.scale, case.softcap, case.sinks)[0]
    return 1.01 * (rel * vmax + U32 * np.max(np.abs(out), -1))


# ---------------------------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------------------------


class AttentionTarget:
    """An attention kernel: ``run(case, settings) -> float32 (n_q, n_head, D)``; ``run_many`` may batch.

    ``defaults``: the arithmetic the target declares where the settings leave it open (``q``, ``v``)."""

    description = "attention kernel"
    symbol = "attention"

    def defaults(self, s: AttentionSettings) -> Arithmetic:
        return Arithmetic("float32", "float32", "float32")

    def check_settings(self, s: AttentionSettings) -> tuple[AttentionSettings, list[str]]:
        """Refuse settings the target cannot run (a format it lacks), before any case; returns the settings to
        run (a target may fill in what the settings leave open) and notes saying what it filled in."""
        return s, []

    def run(self, case: AttentionCase, s: AttentionSettings) -> NDArray[np.float32]:  # pragma: no cover - abstract
        raise NotImplementedError

    def run_many(self, cases: Sequence[AttentionCase], s: AttentionSettings) -> list[NDArray[np.float32]]:
        return [self.run(c, s) for c in cases]

    def provenance(self) -> dict[str, dict[str, Any]]:
        return {}

    def link_libraries(self) -> list[str]:
        return []

    def repro_c(self, ce: AttentionCounterexample, s: AttentionSettings) -> str | None:
        """A C program reproducing ``ce`` (ggml builds), or None."""
        return None

    def close(self) -> None:
        """Nothing to release by default."""


def _shaped_out(out: Any, shape: tuple[int, ...], what: str) -> NDArray[np.float32]:
    a = _to_numpy(out)
    if a.dtype.kind not in "fiu":
        raise TargetError(f"{what} returned {a.dtype} values; return float32 (n_query, n_head, head_dim)")
    if a.size != math.prod(shape):
        raise TargetError(f"{what} returned shape {a.shape}; expected {shape} (n_query, n_head, head_dim)")
    return np.ascontiguousarray(a.reshape(shape).astype(np.float32))


class CallableAttention(AttentionTarget):
    """A Python kernel ``fn(q, k_bytes, v_bytes, meta) -> out``: ``q`` float32 ``(n_q, n_head, D)``, the caches
    uint8 ``(T, n_head_kv, row bytes)``, ``meta`` (:meth:`AttentionCase.meta`); ``out`` ``(n_q, n_head, D)``,
    anything array-like (NumPy, a PyTorch tensor on any device)."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None, arithmetic: Arithmetic | None = None) -> None:
        if not callable(fn):
            raise TargetError(f"the kernel must be a function (q, k, v, meta) -> out, got {type(fn).__name__}")
        self.fn = fn
        self.description = name or f"python {getattr(fn, '__qualname__', type(fn).__name__)}"
        self._declared = arithmetic or Arithmetic("float32", "float32", "float32")

    def defaults(self, s: AttentionSettings) -> Arithmetic:
        return self._declared

    def run(self, case: AttentionCase, s: AttentionSettings) -> NDArray[np.float32]:
        out = self.fn(case.q.copy(), case.k.copy(), case.v.copy(), case.meta(s))
        return _shaped_out(out, case.q.shape, self.description)


#: The placeholders of :class:`ProgramAttention`'s command: files, then numbers and names.
PROGRAM_PLACEHOLDERS = (
    "q",
    "k",
    "v",
    "mask",
    "sinks",
    "meta",
    "out",
    "n_query",
    "n_head",
    "n_head_kv",
    "n_tokens",
    "head_dim",
    "scale",
    "softcap",
    "k_type",
    "v_type",
)


class ProgramAttention(AttentionTarget):
    """An external program run once per case: ``command`` with placeholders (:data:`PROGRAM_PLACEHOLDERS`).

    Files: ``{q}`` raw float32 ``(n_query, n_head, D)``; ``{k}``/``{v}`` the cache bytes ``(T, n_head_kv, row
    bytes)``; ``{mask}`` raw float32 ``(n_query, T)`` (0 and -inf); ``{sinks}`` raw float32 ``(n_head,)`` (empty
    without sink logits); ``{meta}`` JSON (:meth:`AttentionCase.meta`, the mask as lists with ``"-inf"``); the
    program writes raw float32 ``(n_query, n_head, D)`` to ``{out}`` and exits 0. Numbers: ``{n_query}``,
    ``{n_head}``, ``{n_head_kv}``, ``{n_tokens}``, ``{head_dim}``, ``{scale}`` and ``{softcap}`` (float32 values
    printed exactly), ``{k_type}``, ``{v_type}``. ``{q}``, ``{k}``, ``{v}`` and ``{out}`` are required."""

    def __init__(self, command: str, timeout: float = 600.0) -> None:
        if not isinstance(command, str):
            raise TargetError(f"the command must be a string, got {type(command).__name__}")
        missing = [p for p in ("q", "k", "v", "out") if "{" + p + "}" not in command]
        if missing:
            raise TargetError(
                f"the command lacks the placeholder{'s' * (len(missing) > 1)} {', '.join('{' + p + '}' for p in missing)}"
                f"; it may use {', '.join('{' + p + '}' for p in PROGRAM_PLACEHOLDERS)}"
            )
        unknown = sorted(set(re.findall(r"\{(\w+)\}", command)) - set(PROGRAM_PLACEHOLDERS))
        if unknown:
            raise TargetError(
                f"unknown placeholder {{{unknown[0]}}}; the placeholders: {', '.join(PROGRAM_PLACEHOLDERS)}"
            )
        self.command, self.timeout = command, float(timeout)
        self.description = f"program {command.split()[0]}"
        self._dir = tempfile.TemporaryDirectory(prefix="tbq-check-attention-")

    def run(self, case: AttentionCase, s: AttentionSettings) -> NDArray[np.float32]:
        d = Path(self._dir.name)
        files = {n: d / f"{n}.bin" for n in ("q", "k", "v", "mask", "sinks", "out")}
        files["meta"] = d / "meta.json"
        case.q.astype("<f4").tofile(files["q"])
        case.k.tofile(files["k"])
        case.v.tofile(files["v"])
        case.mask.astype("<f4").tofile(files["mask"])
        (np.zeros(0, "<f4") if case.sinks is None else case.sinks.astype("<f4")).tofile(files["sinks"])
        meta = case.meta(s)
        meta["mask"] = [[("-inf" if not np.isfinite(x) else float(x)) for x in row] for row in case.mask]
        meta["sinks"] = None if case.sinks is None else [float(x) for x in case.sinks]
        files["meta"].write_text(json.dumps(meta))
        files["out"].unlink(missing_ok=True)
        n_q, H, G, T, D = case.shape
        values: dict[str, object] = {k: shlex.quote(str(v)) for k, v in files.items()}
        values.update(n_query=n_q, n_head=H, n_head_kv=G, n_tokens=T, head_dim=D, k_type=s.k_type, v_type=s.v_type)
        values.update(scale=repr(float(np.float32(case.scale))), softcap=repr(float(np.float32(case.softcap))))
        cmd = self.command.format(**values)
        try:
            r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise TargetError(f"{cmd} did not finish within {self.timeout:g} s") from None
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            raise TargetError(f"{cmd} exited with status {r.returncode}: {last}")
        want = case.q.size * 4
        got = files["out"].stat().st_size if files["out"].exists() else -1
        if got != want:
            raise TargetError(f"{cmd} wrote {max(got, 0)} bytes to {{out}}; expected {want} (float32 n_q x n_head x D)")
        return np.fromfile(files["out"], "<f4").reshape(case.q.shape)

    def close(self) -> None:
        self._dir.cleanup()


# ---------------------------------------------------------------------------------------------------------------
# classification, minimal case, diagnosis
# ---------------------------------------------------------------------------------------------------------------


def _classify_rows(got: NDArray[np.float32], ref: NDArray[np.float64], bound: NDArray[np.float64]) -> NDArray[np.int64]:
    """Per row (n_q, H): EXACT, FRAGILE (in bound) or WRONG."""
    r32 = ref.astype(np.float32)
    exact = np.all(got.view(np.uint32) == r32.view(np.uint32), axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.max(np.abs(got.astype(np.float64) - ref), axis=-1)
        ok = np.all(np.isfinite(got), axis=-1) & (err <= bound)
    return np.where(exact, EXACT, np.where(ok, FRAGILE, WRONG))


def _excess(got: NDArray[np.float32], ref: NDArray[np.float64], bound: NDArray[np.float64]) -> float:
    """The largest ``|got - ref| / bound`` over the rows (inf for a NaN)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.max(np.abs(got.astype(np.float64) - ref), axis=-1)
        err = np.where(np.isfinite(err), err, np.inf)
        return float(np.max(err / np.maximum(bound, 1e-300)))


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


# ---------------------------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class AttentionCounterexample:
    """The smallest failing case found, tbq's output and bound, the kernel's output."""

    case: AttentionCase
    expected: NDArray[np.float64]
    bound: NDArray[np.float64]
    got: NDArray[np.float32]
    settings: AttentionSettings
    arithmetic: Arithmetic
    how: str = ""
    c_source: str | None = None
    classification: str = "wrong"
    direction: str = "attention"

    def lines(self) -> list[str]:
        c = self.case
        n_q, H, G, T, D = c.shape
        rows = _classify_rows(self.got, self.expected, self.bound)
        bad = np.argwhere(rows == WRONG)
        i, h = (int(bad[0][0]), int(bad[0][1])) if len(bad) else (0, 0)
        with np.errstate(invalid="ignore"):
            e = np.abs(self.got[i, h].astype(np.float64) - self.expected[i, h])
        j = int(np.nanargmax(np.where(np.isfinite(e), e, np.inf)))
        out = [
            f"attention: smallest wrong case ({c.family}: {c.label}; {self.how})",
            f"  n_query {n_q}, n_head {H}, n_head_kv {G}, tokens {T}, head_dim {D}, scale {c.scale!r}"
            + (f", softcap {c.softcap:g}" if c.softcap else "")
            + ("" if c.sinks is None else ", sink logits")
            + f"; {int(np.sum(rows == WRONG))} of {rows.size} rows wrong",
            f"  row (query {i}, head {h}), value {j}: tbq {self.expected[i, h, j]:.9g}, kernel {float(self.got[i, h, j]):.9g}, "
            f"bound {float(self.bound[i, h]):.3g} (largest difference in the row {float(np.nanmax(e)):.3g})",
        ]
        return out

    def to_dict(self) -> dict[str, Any]:
        c = self.case
        return {
            "direction": "attention",
            "family": c.family,
            "label": c.label,
            "how": self.how,
            "shape": dict(zip(("n_query", "n_head", "n_head_kv", "n_tokens", "head_dim"), c.shape, strict=True)),
            "scale": c.scale,
            "softcap": c.softcap,
            "largest_difference": float(np.nanmax(np.abs(self.got - self.expected))),
            "bound": float(np.max(self.bound)),
        }

    def save(
        self, directory: str | os.PathLike[str], fmt: Format, symbol: str | None = None, link: list[str] | None = None
    ) -> list[Path]:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        s, c = self.settings, self.case
        stem = d / f"attention-{s.k_type}-{s.v_type}-d{c.q.shape[2]}"
        np.savez(
            stem.with_suffix(".npz"),
            q=c.q,
            k=c.k,
            v=c.v,
            mask=c.mask,
            sinks=np.zeros(0, np.float32) if c.sinks is None else c.sinks,
            scale=np.float32(c.scale),
            softcap=np.float32(c.softcap),
            expected=self.expected,
            bound=self.bound,
            got=self.got,
            k_type=s.k_type,
            v_type=s.v_type,
            k_options=json.dumps(s.k_options),
            v_options=json.dumps(s.v_options),
            arithmetic=json.dumps(self.arithmetic.__dict__),
        )
        paths = [stem.with_suffix(".npz")]
        py = stem.with_suffix(".py")
        py.write_text(_PY_REPRO.format(npz=stem.with_suffix(".npz").name))
        paths.append(py)
        if self.c_source:
            stem.with_suffix(".c").write_text(self.c_source)
            paths.append(stem.with_suffix(".c"))
        return paths


_PY_REPRO = '''"""Counterexample from `tbq check --attention`: the smallest wrong case, tbq's output and its derived bound.

Run: python {{this file}} (exit status 1 while `kernel` below is outside the bound); put your kernel in `kernel`.
"""
import sys
from pathlib import Path

import numpy as np

case = np.load(Path(__file__).with_name("{npz}"))


def kernel(q, k, v, meta):  # your attention kernel: return float32 (n_query, n_head, head_dim)
    return case["got"]


n_q, H, D = case["q"].shape
T, G = case["k"].shape[:2]
meta = dict(k_type=str(case["k_type"]), v_type=str(case["v_type"]), head_dim=D, n_query=n_q, n_head=H,
            n_head_kv=G, n_tokens=T, scale=float(case["scale"]), softcap=float(case["softcap"]),
            mask=case["mask"], sinks=case["sinks"] if case["sinks"].size else None)
got = np.asarray(kernel(case["q"], case["k"], case["v"], meta), np.float32).reshape(n_q, H, D)
err = np.max(np.abs(got.astype(np.float64) - case["expected"]), axis=-1)
bad = ~(err <= case["bound"])
print(f"{{int(bad.sum())}} of {{bad.size}} rows outside the bound; largest difference {{float(np.nanmax(err)):.6g}}")
sys.exit(1 if bad.any() else 0)
'''


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
            opts,
            tgt.description,
            {
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
    ce = AttentionCounterexample(best, ref, bound, got, s, ar, how)
    ce.c_source = tgt.repro_c(ce, s)
    return ce, diagnose_attention(best, got, ref, bound, s, p, ar)
