"""The fused-attention check's inputs: what a kernel declares (:class:`Arithmetic`), what a check is asked
(:class:`AttentionSettings`), the cases it draws (:func:`make_cases`) and the defects it can name (:data:`DIAGNOSES`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..codecs import codec_from
from ..errors import ConfigError, check_choice, check_int, check_number
from ..formats import Format, format_name, get_format

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
    _: KW_ONLY
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
    _: KW_ONLY
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
        sk = None if sinks is None else np.float32(sinks)
        out.append(AttentionCase(family, label, q=q, k=kb, v=vb, mask=m, sinks=sk, scale=sc, softcap=cap))

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

# Their public home stays tbq.check.attention (the name in pickles, reprs and the API's records).
for _cls in (Arithmetic, AttentionSettings, AttentionCase):
    _cls.__module__ = "tbq.check.attention"
