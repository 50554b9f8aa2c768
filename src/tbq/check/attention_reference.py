"""The fused-attention check's reference: tbq's attention over the stored bytes in float64
(:func:`reference_attention`) and the tolerance derived from a kernel's arithmetic (:func:`attention_bound`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ..codecs import codec_from
from ..formats import Format, get_format
from .attention_cases import (
    EXTRA_ROUNDINGS,
    PRECISIONS,
    Q_FRAGILE_ULPS,
    U16,
    U32,
    AttentionCase,
    AttentionSettings,
)
from .classify import EXACT, FRAGILE, WRONG


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


def _classify_rows(got: NDArray[np.float32], ref: NDArray[np.float64], bound: NDArray[np.float64]) -> NDArray[np.int64]:
    """Per row (n_q, H): EXACT, FRAGILE (in bound) or WRONG."""
    r32 = ref.astype(np.float32)
    exact = np.all(got.view(np.uint32) == r32.view(np.uint32), axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.max(np.abs(got.astype(np.float64) - ref), axis=-1)
        ok = np.all(np.isfinite(got), axis=-1) & (err <= bound)
    return np.where(exact, EXACT, np.where(ok, FRAGILE, WRONG))
