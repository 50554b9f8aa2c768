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
# # A real model: what each cache type does to its predictions, and to its real keys and values
#
# The other notebooks measure formats on synthetic keys and values. Here the
# data is a real model's: the small Llama tbq ships (`tbq.hf.load()`, trained on
# Python's standard library, docs/model.md), run with its KV cache stored
# bit-exactly in each format as llama.cpp stores it (`tbq.hf.TbqCache`, the
# `llama.cpp` engine: GGUF channel order, attention rotation, Q as q8_0), and
# scored on held-out text the way `llama-perplexity` scores it.
#
# Questions:
#
# 1. Perplexity, KL and top-1 for every format as K (V in f16) and as V (K in
#    f16), with llama.cpp's attention rotation and without it.
# 2. Does the synthetic study's ranking of the formats hold on the real model?
# 3. The channel statistics of real keys: outlier channels or not, and what
#    llama.cpp's Hadamard rotation and TBQ's randomized Hadamard do to them.
# 4. llama.cpp's q4_0 and iq4_nl caches are already Hadamard-rotated: does
#    TBQ4's Lloyd–Max grid still beat them at about the same bits, on real K and
#    V, and what does TBQ's own rotation add on top of llama.cpp's (a tbq4_0 K
#    cache is rotated twice)?
# 5. Sink tokens in f16; which layers are sensitive.
#
# A model of a few million parameters tells what a cache type does to *this*
# model; docs/study.md says what that can and cannot tell about large models.

# %%
import numpy as np
from IPython.display import Image, display

import tbq
from tbq import metrics, plots
from tbq.hf import capture_kv, evaluate, load
from tbq.hf import engine as hfe
from tbq.hf.evaluation import text_tokens
from tbq.hf.shipped import heldout_text

SMALL = plots.small_mode()
CONTEXT, CHUNKS = (256, 2) if SMALL else (512, 4)
model, tokenizer = load()
tokens = text_tokens(tokenizer, heldout_text(), model.config.bos_token_id)
n_layers, kv_heads, head_dim = model.config.num_hidden_layers, model.config.num_key_value_heads, model.config.head_dim
print(
    f"{sum(p.numel() for p in model.parameters()):,} parameters, {n_layers} layers, {kv_heads} KV heads of {head_dim}; "
    f"held-out text: {len(tokens):,} tokens; {CHUNKS} chunks of {CONTEXT}"
)

# %% [markdown]
# ## 1. Every format as K and as V, with and without the attention rotation
#
# `K:f16` puts the format in the K cache only, `f16:V` in the V cache only.
# KL is `KL(f16 cache ‖ type)` of the next-token distributions, averaged over
# the scored positions; the perplexity change is against the f16 cache.
# vLLM's FP8 formats are not llama.cpp cache types: they are stored plain
# (`@plain`, vLLM has no rotation), in both columns.

# %%
FORMATS = [f for f in tbq.formats.cache_formats() if f != "f16"]


def label(k, v):
    """The cache-type label: llama.cpp's engine for its types, plain rows for the others (FP8)."""
    plain = not (hfe.is_llama_cpp_type(k) and hfe.is_llama_cpp_type(v))
    return f"{k}:{v}" + ("@plain" if plain else "")


runs = {}
for rot in (True, False):
    types = [label(f, "f16") for f in FORMATS] + [label("f16", f) for f in FORMATS]
    runs[rot] = evaluate(
        model, tokens, types, context=CONTEXT, chunks=CHUNKS, rotate_attention=rot, model_name="shipped"
    )


def kl(res, k, v):
    return res.row(label(k, v)).kl_mean


print(
    f"{'format':<10} {'bits':>5} {'K: KL rot':>10} {'K: KL no rot':>12} {'V: KL rot':>10} {'V: KL no rot':>12} {'K: dPPL% rot':>13}"
)
for f in FORMATS:
    print(
        f"{f:<10} {tbq.FORMATS[f].bits_per_value:>5.3g} {kl(runs[True], f, 'f16'):>10.2e} {kl(runs[False], f, 'f16'):>12.2e} "
        f"{kl(runs[True], 'f16', f):>10.2e} {kl(runs[False], 'f16', f):>12.2e} {runs[True].row(label(f, 'f16')).delta_ppl_pct:>+13.3f}"
    )

path = plots.plot_bars(
    {
        "K cache (V f16), llama.cpp rotation": {f: kl(runs[True], f, "f16") for f in FORMATS},
        "K cache, no rotation": {f: kl(runs[False], f, "f16") for f in FORMATS},
        "V cache (K f16), llama.cpp rotation": {f: kl(runs[True], "f16", f) for f in FORMATS},
        "V cache, no rotation": {f: kl(runs[False], "f16", f) for f in FORMATS},
    },
    plots.figure_path("real_kl.png"),
    title="mean KL(f16 cache || type) of the next-token distribution, shipped model",
    ncols=2,
)
display(Image(filename=str(path)))

# %% [markdown]
# The llama.cpp engine stores the fork's TBQ types with the fork's own tables
# (`codebook="turboq-mtp"`), as the fork does; its 3-bit table is scaled far
# from the Lloyd–Max levels (docs/formats.md). The same caches with the fitted
# Lloyd–Max tables (a `tbq.Codec` carries the option):

# %%
tables = {}
for bits in ("tbq4_0", "tbq3_0"):
    for book in ("turboq-mtp", "lloyd-max"):
        codec = tbq.get_codec(bits, codebook=book)
        for role, kv in (("K", (codec, "f16")), ("V", ("f16", codec))):
            res = evaluate(model, tokens, [kv], context=CONTEXT, chunks=CHUNKS)
            tables[(bits, book, role)] = res.rows[2]
for (bits, book, role), r in tables.items():
    print(f"{bits} {book:<10} in {role}: KL {r.kl_mean:.2e}  dPPL {r.delta_ppl_pct:+.3f} %  top-1 {r.top1:.3f}")

# %% [markdown]
# What the fork itself does with these types on its CPU build, reproduced by
# the `llama.cpp-fork` engine (`@fork`): a tbq4_0/tbq3_0 K cache at head_dim
# 128 gets no q8_K block for Q, so every attention score is 0, and tbq3_0
# rows are packed by the buggy 3-bit packer (docs/eval.md holds the same
# figures against `llama-perplexity`).

# %%
fork = evaluate(
    model, tokens, ["tbq4_0", "tbq4_0@fork", "tbq3_0", "tbq3_0@fork", "f16:tbq3_0@fork"], context=CONTEXT, chunks=CHUNKS
)
for r in fork.rows[1:]:
    print(f"{r.cache:<22} PPL {r.ppl:9.3f}  KL {r.kl_mean:.2e}  top-1 {r.top1:.3f}")

# %% [markdown]
# ## 2. Does the synthetic ranking hold?
#
# The synthetic study ranks formats by attention KL on keys with outlier
# channels (`tbq.study`, the formats notebook). Here the same formats are ranked
# by the model-level KL of a K-only cache; Spearman's rank correlation says how
# well one ranking predicts the other.

# %%
from scipy.stats import spearmanr

from tbq import synthetic

syn = synthetic.llm_like_kv(256 if SMALL else 1024, 2 if SMALL else 4, seed=0)
q = metrics.random_queries(8, 128, syn["keys"].shape[1], seed=1)
syn_kl = {}
for f in FORMATS:
    k_hat = tbq.dequantize(tbq.quantize(syn["keys"], f), f)
    syn_kl[f] = float(
        np.mean(metrics.softmax_kl(metrics.attention_logits(q, syn["keys"]), metrics.attention_logits(q, k_hat)))
    )
real_kl = [kl(runs[True], f, "f16") for f in FORMATS]
rho = spearmanr([syn_kl[f] for f in FORMATS], real_kl).statistic
print(f"Spearman rank correlation, synthetic attention KL vs real-model KL (K caches): {rho:.2f}")
order_syn = sorted(FORMATS, key=syn_kl.get)
order_real = [f for _, f in sorted(zip(real_kl, FORMATS, strict=True))]
print("synthetic order:", ", ".join(order_syn))
print("real order:     ", ", ".join(order_real))

# %% [markdown]
# ## 3. Real keys: outlier channels, and what each rotation does to them
#
# `capture_kv` returns each layer's post-RoPE K and its V. Per channel, the RMS
# over tokens shows whether a few channels carry most of the energy (the
# outlier channels that hurt per-block scales); the kurtosis of a block's values
# and its max/RMS say how hard a block is for a uniform grid. The same
# statistics after llama.cpp's attention rotation (`H_128` per head) and after
# TBQ's randomized Hadamard (signs, `H_128`, signs).

# %%
kv = capture_kv(model, tokens[:CONTEXT])
keys = np.concatenate([kv[i]["k"] for i in kv], axis=1)  # (tokens, layers x heads, 128)
values = np.concatenate([kv[i]["v"] for i in kv], axis=1)
import torch

perm = hfe.gguf_permutation(head_dim)
k_llama = keys[..., perm]  # llama.cpp's channel order
k_rot = hfe.rotate(torch.from_numpy(np.ascontiguousarray(k_llama)), 128).numpy()
tbq_rot = tbq.rotation.get_rotation("turboq-mtp")
k_tbq = tbq_rot.forward(k_llama.reshape(-1, 128).astype(np.float32)).reshape(k_llama.shape)
views = {"as stored (llama.cpp order)": k_llama, "llama.cpp's H_128": k_rot, "TBQ's randomized Hadamard": k_tbq}
rms = {name: np.sqrt((v.astype(np.float64) ** 2).mean(axis=(0, 1))) for name, v in views.items()}
for name, v in views.items():
    b = v.reshape(-1, 128)
    print(
        f"{name:<28} channel RMS max/median {rms[name].max() / np.median(rms[name]):6.2f}   "
        f"block kurtosis {np.mean(metrics.kurtosis(b, axis=-1)):6.2f}   block max/RMS {np.mean(metrics.peak_to_rms(b)):5.2f}"
    )
path = plots.plot_lines(
    np.arange(128),
    {"per-channel RMS of real keys (all layers, heads, tokens)": rms},
    plots.figure_path("real_key_channels.png"),
    xlabel="channel (llama.cpp order)",
    logy=True,
)
display(Image(filename=str(path)))

# %% [markdown]
# ## 4. TBQ4 against rotated q4_0 and iq4_nl, on real K and V
#
# The error of each 4-bit-class format on the rows llama.cpp stores (rotated
# by its `H_128` for K and `H_64` blocks for V), as NMSE; for TBQ4 also on the
# unrotated rows (what its own rotation does alone) — a tbq4_0 K cache in
# llama.cpp is rotated twice.


# %%
def stored_rows(x, n):
    return hfe.rotate(torch.from_numpy(np.ascontiguousarray(x)), n).numpy().reshape(len(x), -1)


rows = {
    "K": (stored_rows(k_llama, 128), k_llama.reshape(len(k_llama), -1)),
    "V": (stored_rows(values, 64), values.reshape(len(values), -1)),
}
table = {}
for role, (rotated, plain) in rows.items():
    for f, opts in (
        ("q4_0", {}),
        ("iq4_nl", {}),
        ("q4_1", {}),
        ("mxfp4", {}),
        ("tbq4_0", {"codebook": "turboq-mtp"}),
        ("tbq4_0", {}),
    ):
        label = f + (" (fork tables)" if opts else "")
        for name, data in (("llama.cpp-rotated", rotated), ("unrotated", plain)):
            if f != "tbq4_0" and name == "unrotated":
                continue
            y = tbq.dequantize(tbq.quantize(data, f, **opts), f, **opts)
            table[(role, label, name)] = metrics.nmse(data, y)
for key, v in table.items():
    print(
        f"{key[0]}  {key[1]:<22} {key[2]:<18} bits {tbq.FORMATS[key[1].split()[0]].bits_per_value:5.3g}   NMSE {v:.3e}"
    )

# %% [markdown]
# ## 5. Sinks and layers
#
# The first tokens of a chunk in f16 (`sinks=N`), for the 3- and 4-bit
# caches; then one layer at a time in the type (the rest f16).

# %%
sink_counts = [0, 4, 16] if not SMALL else [0, 4]
sink_kl = {}
for n in sink_counts:
    res = evaluate(model, tokens, ["q4_0", "tbq3_0", "tbq4_0:tbq3_0"], context=CONTEXT, chunks=CHUNKS, sinks=n)
    sink_kl[n] = {r.cache: r.kl_mean for r in res.rows[2:]}
    print(f"sinks {n:>2}: " + "  ".join(f"{c} KL {v:.2e}" for c, v in sink_kl[n].items()))

layer_res = evaluate(model, tokens, ["q4_0", "tbq3_0"], context=CONTEXT, chunks=CHUNKS, per_layer=True)
per_layer = {c: [layer_res.row(c, layer=i).kl_mean for i in range(n_layers)] for c in ("q4_0:q4_0", "tbq3_0:tbq3_0")}
for c, vals in per_layer.items():
    print(f"{c}: KL with one layer in the type, layers 0..{n_layers - 1}: " + ", ".join(f"{v:.2e}" for v in vals))
path = plots.plot_lines(
    np.arange(n_layers),
    {"mean KL with one layer in the type (rest f16)": per_layer},
    plots.figure_path("real_layers.png"),
    xlabel="layer",
    logy=True,
)
display(Image(filename=str(path)))
