# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Keys vs values: how quantization error reaches attention
#
# A key error changes the logits `q·k/√d`, hence *which* tokens a query
# attends to; a value error changes *what* is read from them. The two
# propagate differently, and the cache policy (bits for K and for V, per-channel
# or per-token grouping, sink tokens in higher precision) should follow.
#
# Data: `tbq.synthetic.llm_like_kv`, keys with rotary-position structure, four
# slowly rotating channel pairs scaled up (outlier channels) and an attention-sink
# first token with a large key; Student-t values (heavy tails). Queries: seeded
# random N(0, 1) vectors, per head. Attention is exact float64 softmax attention
# (`tbq.metrics`), so every difference below comes from the cache.
#
# Metrics, per (head, query) and then averaged: logit RMSE (softmax units),
# `KL(p ‖ p̂)` in nats, the share of the exact top-8 tokens still in the
# top 8, and the NMSE of the attention output vector. The output NMSE is taken
# per (head, query), each output against its own norm, and summarised by the
# median (a typical query) and the 90th percentile (the bad queries): a query
# whose exact output is small, because its attention is spread over many
# tokens, can have a large relative error, and a mean would be dominated by a few such queries.

# %%
import numpy as np
from IPython.display import Image, display

from tbq import metrics, plots, study, synthetic

SMALL = plots.small_mode()
TOKENS, HEADS, NQ = (256, 2, 8) if SMALL else (4096, 8, 32)
kv = synthetic.llm_like_kv(TOKENS, HEADS, seed=0)
K, V = kv["keys"], kv["values"]
Q = metrics.random_queries(NQ, 128, HEADS, seed=5)

norms = np.linalg.norm(K.astype(np.float64), axis=-1)
p_full = metrics.softmax(metrics.attention_logits(Q, K))
print(f"{TOKENS} tokens x {HEADS} heads x 128; {NQ} queries per head")
print(
    f"sink key norm / median key norm: {np.median(norms[0]) / np.median(norms[1:]):.1f}; "
    f"mean attention weight on the sink: {p_full[..., 0].mean():.2f} "
    f"(uniform would be {1 / TOKENS:.4f}); value excess kurtosis: {metrics.kurtosis(V):.1f}"
)


# %%
def evaluate(policy, ctx=None):
    """Attention metrics of a CachePolicy on the first ctx tokens (all by default)."""
    k_hat, v_hat = policy.apply(K[:ctx], V[:ctx])
    m = metrics.attention_error(Q, K[:ctx], V[:ctx], k_hat, v_hat, topk=8)
    m["key_nmse"] = metrics.nmse(K[:ctx], k_hat)
    m["value_nmse"] = metrics.nmse(V[:ctx], v_hat)
    m["bits_per_value"] = policy.bits_per_value(k_hat.shape[0])
    return m


# %% [markdown]
# ## 1. Key errors and value errors as the context grows
#
# Each policy quantizes only one of the two tensors (the other stays exact),
# with TBQ at 3 or 4 bits. The contexts are prefixes of the same cache.

# %%
contexts = [c for c in (64, 128, 256, 512, 1024, 2048, 4096) if c <= TOKENS]
series = {
    "K tbq3_0": study.CachePolicy("tbq3_0", "f32"),
    "K tbq4_0": study.CachePolicy("tbq4_0", "f32"),
    "V tbq3_0": study.CachePolicy("f32", "tbq3_0"),
    "V tbq4_0": study.CachePolicy("f32", "tbq4_0"),
    "K tbq3_0, sink in f16": study.CachePolicy("tbq3_0", "f32", n_sink=1),
}
ctx_res = {name: [evaluate(pol, c) for c in contexts] for name, pol in series.items()}
panels = {
    "logit RMSE": "logit_rmse",
    "softmax KL (nats)": "kl_mean",
    "top-8 agreement": "topk_agreement",
    "output NMSE, median query": "output_nmse_median",
    "output NMSE, 90th percentile query": "output_nmse_p90",
}
path = plots.plot_lines(
    contexts,
    {t: {n: [m[key] for m in ctx_res[n]] for n in series} for t, key in panels.items()},
    plots.figure_path("kv_context.png"),
    xlabel="context (tokens)",
    logx=True,
    logy={"top-8 agreement": False},
    styles={"V tbq3_0": "--", "V tbq4_0": "--"},
    title="Quantizing only K or only V: attention error against context length",
    ncols=3,
)
display(Image(filename=str(path)))
print(f"{'policy':24s} {'ctx':>5s} {'logit rmse':>10s} {'KL':>9s} {'top-8':>6s} {'out median':>10s} {'out p90':>9s}")
for n in series:
    for c, m in zip(contexts, ctx_res[n], strict=True):
        if c in (contexts[0], contexts[-1]):
            print(
                f"{n:24s} {c:5d} {m['logit_rmse']:10.4f} {m['kl_mean']:9.2e} {m['topk_agreement']:6.3f} "
                f"{m['output_nmse_median']:10.2e} {m['output_nmse_p90']:9.2e}"
            )

# %%
k3, k4, v3, v4 = (ctx_res[n] for n in ("K tbq3_0", "K tbq4_0", "V tbq3_0", "V tbq4_0"))
print(
    f"Value errors pass to the output almost unchanged: with V in tbq3_0 the median output NMSE is "
    f"{v3[0]['output_nmse_median']:.4f} at {contexts[0]} tokens and {v3[-1]['output_nmse_median']:.4f} at "
    f"{contexts[-1]} (90th percentile {v3[-1]['output_nmse_p90']:.4f}), next to the values' own NMSE "
    f"{v3[-1]['value_nmse']:.4f} (tbq4_0: {v4[-1]['output_nmse_median']:.4f} vs {v4[-1]['value_nmse']:.4f}). Both the "
    "output and its error are weighted averages of independent value vectors, so they shrink together as "
    "attention spreads out, whatever the context."
)
print(
    f"Key errors never touch the values but change the weights: with K in tbq3_0 the median output NMSE is "
    f"{k3[-1]['output_nmse_median']:.4f} at {contexts[-1]} tokens "
    f"({k3[-1]['output_nmse_median'] / v3[-1]['output_nmse_median']:.1f}x that of V in tbq3_0) and the 90th "
    f"percentile {k3[-1]['output_nmse_p90']:.3f} ({k3[-1]['output_nmse_p90'] / v3[-1]['output_nmse_p90']:.1f}x), with a "
    f"softmax KL of {k3[-1]['kl_mean']:.3f} nats and a top-8 agreement of {k3[-1]['topk_agreement']:.2f} "
    f"(it was {k3[0]['topk_agreement']:.2f} at {contexts[0]} tokens"
    + (": more tokens, more near-ties to swap). " if k3[-1]["topk_agreement"] < k3[0]["topk_agreement"] else "). ")
    + f"At 4 bits: KL {k4[-1]['kl_mean']:.3f}, top-8 {k4[-1]['topk_agreement']:.2f}."
)

# %% [markdown]
# ## 2. Per-channel or per-token key quantization
#
# KIVI-style asymmetric integer quantization (`tbq.study.KIVI`, a comparison
# quantizer, not a byte format) with groups of 32: per channel (each channel
# over 32 consecutive tokens, KIVI's choice for keys) or per token (32
# consecutive channels of one token). Only the keys are quantized; TBQ for
# reference.

# %%
key_specs = [
    "kivi2-channel",
    "kivi2-token",
    "kivi3-channel",
    "kivi3-token",
    "kivi4-channel",
    "kivi4-token",
    "tbq3_0",
    "tbq4_0",
]
axis_res = {}
for spec in key_specs:
    pol = study.CachePolicy(spec, "f32")
    axis_res[f"{pol.k.name} ({pol.k.bits_per_value:g} b)"] = evaluate(pol)
path = plots.plot_bars(
    {
        "key NMSE": {n: m["key_nmse"] for n, m in axis_res.items()},
        "softmax KL (nats)": {n: m["kl_mean"] for n, m in axis_res.items()},
        "top-8 agreement": {n: m["topk_agreement"] for n, m in axis_res.items()},
    },
    plots.figure_path("kv_key_axis.png"),
    logy={"top-8 agreement": False},
    title=f"Keys only, {TOKENS} tokens: per-channel vs per-token grouping (bits per value in brackets)",
)
display(Image(filename=str(path)))
for n, m in axis_res.items():
    print(
        f"{n:34s} key NMSE {m['key_nmse']:.2e}  logit RMSE {m['logit_rmse']:.3f}  KL {m['kl_mean']:.2e}  top-8 {m['topk_agreement']:.3f}"
    )


# %%
def kivi(bits, axis):
    return next(m for n, m in axis_res.items() if n.startswith(f"kivi{bits}-g32-{axis}"))


for b in (2, 3, 4):
    c, t = kivi(b, "channel"), kivi(b, "token")
    print(
        f"KIVI {b} bits: per channel KL {c['kl_mean']:.3f}, per token {t['kl_mean']:.3f} "
        f"({t['kl_mean'] / c['kl_mean']:.1f}x); key NMSE {c['key_nmse']:.4f} vs {t['key_nmse']:.4f}."
    )
if all(kivi(b, "channel")["kl_mean"] < kivi(b, "token")["kl_mean"] for b in (2, 3, 4)):
    print(
        "Per channel wins at every width: per-channel groups give each outlier channel its own range and follow "
        "the slow drift of a channel over neighbouring tokens; per-token groups let one outlier set the step for "
        "the 31 small channels of its group."
    )

# %% [markdown]
# ## 3. Three or four bits, for K and for V
#
# All four combinations of `tbq3_0` and `tbq4_0`, over the whole context.

# %%
grid = {}
for kf in ("tbq3_0", "tbq4_0"):
    for vf in ("tbq3_0", "tbq4_0"):
        pol = study.CachePolicy(kf, vf)
        grid[f"K{kf[3]} V{vf[3]}"] = evaluate(pol)
for n, m in grid.items():
    print(
        f"{n}: {m['bits_per_value']:.3f} bits/value  KL {m['kl_mean']:.4f}  top-8 {m['topk_agreement']:.3f}  "
        f"output NMSE median {m['output_nmse_median']:.4f}  p90 {m['output_nmse_p90']:.4f}"
    )
path = plots.plot_bars(
    {
        "softmax KL (nats)": {n: m["kl_mean"] for n, m in grid.items()},
        "output NMSE, median query": {n: m["output_nmse_median"] for n, m in grid.items()},
        "output NMSE, 90th percentile query": {n: m["output_nmse_p90"] for n, m in grid.items()},
    },
    plots.figure_path("kv_bits.png"),
    logy=False,
    title="3 or 4 bits for K and for V (TBQ, no sink protection)",
)
display(Image(filename=str(path)))
gain_k = grid["K3 V3"]["output_nmse_median"] - grid["K4 V3"]["output_nmse_median"]
gain_v = grid["K3 V3"]["output_nmse_median"] - grid["K3 V4"]["output_nmse_median"]
print(
    f"Starting from K3 V3 (median output NMSE {grid['K3 V3']['output_nmse_median']:.4f}), one more bit for K lowers it by "
    f"{gain_k:.4f} and one more bit for V by {gain_v:.4f}: the extra bit is worth "
    f"{'more on K' if gain_k > gain_v else 'more on V'} here ({max(gain_k, gain_v) / min(gain_k, gain_v):.1f}x), "
    f"and only a K bit improves the softmax (KL {grid['K3 V3']['kl_mean']:.3f} -> {grid['K4 V3']['kl_mean']:.3f})."
)

# %% [markdown]
# ## 4. Keeping sink tokens in higher precision
#
# The sink key is many times longer than the others. TBQ's error is relative to
# the block norm, so the sink's absolute key error, and with it the error of
# the logit that decides most of the attention mass, is many times larger.
# `CachePolicy(n_sink=...)` keeps the first tokens of K and V in f16 or q8_0.

# %%
sink_res = {}
for n_sink, sink in ((0, "f16"), (1, "f16"), (1, "q8_0"), (4, "f16"), (4, "q8_0"), (16, "q8_0")):
    pol = study.CachePolicy("tbq3_0", "tbq3_0", n_sink=n_sink, sink=sink)
    m = evaluate(pol)
    k_hat = pol.apply_keys(K)
    m["sink_logit_rmse"] = metrics.logit_error(Q, K[:1], k_hat[:1])["rmse"]
    m["other_logit_rmse"] = metrics.logit_error(Q, K[1:], k_hat[1:])["rmse"]
    sink_res["no sink protection" if n_sink == 0 else f"{n_sink} sink {sink}"] = m
for n, m in sink_res.items():
    print(
        f"{n:20s} {m['bits_per_value']:.4f} bits/value  sink logit RMSE {m['sink_logit_rmse']:.3f}  other tokens "
        f"{m['other_logit_rmse']:.3f}  KL {m['kl_mean']:.4f}  top-8 {m['topk_agreement']:.3f}  output NMSE median "
        f"{m['output_nmse_median']:.4f} p90 {m['output_nmse_p90']:.4f} mean {m['output_nmse_mean']:.4f}"
    )
path = plots.plot_bars(
    {
        "logit RMSE of the sink token": {n: m["sink_logit_rmse"] for n, m in sink_res.items()},
        "softmax KL (nats)": {n: m["kl_mean"] for n, m in sink_res.items()},
        "output NMSE, 90th percentile query": {n: m["output_nmse_p90"] for n, m in sink_res.items()},
    },
    plots.figure_path("kv_sinks.png"),
    logy={"softmax KL (nats)": False, "output NMSE, 90th percentile query": False},
    title=f"K and V in tbq3_0, {TOKENS} tokens: the first tokens kept in f16 or q8_0",
)
display(Image(filename=str(path)))

# %%
base, s1 = sink_res["no sink protection"], sink_res["1 sink f16"]
s1q = sink_res["1 sink q8_0"]
print(
    f"Without protection the sink's logit error is {base['sink_logit_rmse']:.2f} (RMS over queries), against "
    f"{base['other_logit_rmse']:.2f} for the other tokens. Keeping one sink token in f16 cuts the softmax KL from "
    f"{base['kl_mean']:.3f} to {s1['kl_mean']:.3f} ({base['kl_mean'] / s1['kl_mean']:.1f}x); the output NMSE of the "
    f"90th-percentile query falls from {base['output_nmse_p90']:.3f} to {s1['output_nmse_p90']:.3f} and that of the "
    f"median query from {base['output_nmse_median']:.4f} to {s1['output_nmse_median']:.4f}"
    + (
        f" (the sink error hits few queries hard: the mean over queries drops from {base['output_nmse_mean']:.2f} "
        f"to {s1['output_nmse_mean']:.3f})"
        if base["output_nmse_mean"] / s1["output_nmse_mean"] > 3 * base["output_nmse_median"] / s1["output_nmse_median"]
        else ""
    )
    + f", for "
    f"{s1['bits_per_value'] - base['bits_per_value']:.4f} extra bits per value at {TOKENS} tokens. With the sink in q8_0 instead the KL is "
    f"{s1q['kl_mean']:.3f}"
    + (", as good as f16 at half the cost." if abs(s1q["kl_mean"] / s1["kl_mean"] - 1) < 0.1 else ".")
)
s4 = sink_res["4 sink f16"]
if abs(s4["kl_mean"] / s1["kl_mean"] - 1) < 0.1:
    print(
        f"Four sink tokens instead of one change the KL only from {s1['kl_mean']:.4f} to {s4['kl_mean']:.4f}: only "
        "the first token is a sink in this data, so the extra tokens protect ordinary keys."
    )
