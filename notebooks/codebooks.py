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
# # Fitted Lloyd–Max tables vs the `turboq-mtp` tables of the llama.cpp fork
#
# A TBQ block is normalised to unit norm and rotated; its 128 coordinates are
# then close to N(0, σ²) with σ = 1/√128, and each is coded with the nearest
# level of a fixed table. `tbq` fits that table (Lloyd–Max for N(0, σ²),
# codebook `"lloyd-max"`, the default) and also ships the literal tables of the
# llama.cpp-turboq-mtp fork (codebook `"turboq-mtp"`), so that golden vectors
# for kernels built with that fork can be produced.
#
# This notebook compares the two for TBQ4 and TBQ3: the levels, how the
# rotated coordinates fall into the cells (index histograms and their entropy),
# the resulting error, and what it means for attention. It ends with the
# conclusion for a user of the fork.

# %%
import numpy as np
from IPython.display import Image, display

import tbq
from tbq import metrics, plots, study, synthetic
from tbq.codebooks import SIGMA_128, fork_vs_lloyd_max, named_codebook

SMALL = plots.small_mode()
TOKENS, HEADS = (64, 2) if SMALL else (2048, 8)
fitted = {b: named_codebook("lloyd-max", b) for b in (3, 4)}
fork = {b: named_codebook("turboq-mtp", b) for b in (3, 4)}
print(f"sigma of a rotated unit-norm 128-block coordinate: {SIGMA_128:.5f}")

# %% [markdown]
# ## The tables

# %%
for b in (4, 3):
    print(f"{b}-bit centroids (upper half; the tables are symmetric)")
    print(f"  {'i':>2s} {'fitted':>10s} {'fork':>10s} {'fork/fitted':>11s} {'fitted/sigma':>12s}")
    n = len(fitted[b].centroids)
    for i in range(n // 2, n):
        f, k = float(fitted[b].centroids[i]), float(fork[b].centroids[i])
        print(f"  {i:2d} {f:10.6f} {k:10.6f} {k / f:11.4f} {f / SIGMA_128:12.4f}")
diff = fork_vs_lloyd_max()
print(
    f"\n4 bits: the largest relative centroid difference is {diff['tbq4_max_relative_difference']:.2e}. "
    f"3 bits: the fork's levels are {diff['tbq3_ratio_min']:.2f}x to {diff['tbq3_ratio_max']:.2f}x the fitted ones; "
    f"its innermost thresholds are +-{float(fork[3].thresholds[4]):.4f} = +-{float(fork[3].thresholds[4]) / SIGMA_128:.2f} sigma."
)

# %%
path = plots.plot_codebooks(
    {
        "4 bits": {"fitted (lloyd-max)": fitted[4], "fork (turboq-mtp)": fork[4]},
        "3 bits": {"fitted (lloyd-max)": fitted[3], "fork (turboq-mtp)": fork[3]},
    },
    plots.figure_path("codebooks_tables.png"),
    sigma=SIGMA_128,
    title="Codebook levels over the density of the rotated coordinates",
)
display(Image(filename=str(path)))

# %% [markdown]
# ## Where the rotated coordinates fall
#
# The indices below are exactly those the encoder writes: unit-norm block,
# rotation with the deployed sign tables, then the table's thresholds. Data:
# Gaussian values and keys with outlier channels. The entropy of the index
# histogram is the information a stored index actually carries (at most 3 or
# 4 bits).

# %%
data = {
    "gaussian": synthetic.gaussian(TOKENS, HEADS, seed=0),
    "outlier keys": synthetic.keys_with_outliers(TOKENS, HEADS, seed=1),
}
rotation = tbq.get_codec("tbq3_0").rotation
hist, ent, middle = {}, {}, {}
for ds, x in data.items():
    u = x.reshape(-1, 128) / np.linalg.norm(x.reshape(-1, 128), axis=1, keepdims=True)
    r = rotation.forward(u.astype(np.float32))
    for b in (4, 3):
        for label, cb in (("fitted", fitted[b]), ("fork", fork[b])):
            idx = cb.index(r)
            counts = np.bincount(idx.ravel(), minlength=1 << b)
            hist[ds, b, label] = counts
            ent[ds, b, label] = metrics.entropy_bits(counts, counts=True)
            mid = (1 << b) // 2
            middle[ds, b, label] = counts[mid - 1 : mid + 1].sum() / counts.sum()
for (ds, b, label), h in ent.items():
    print(f"{ds:13s} {b} bits {label:6s}: entropy {h:.3f} bits of {b}; share in the two middle cells {middle[ds, b, label]:.2%}")

# %%
path = plots.plot_index_histograms(
    {f"{b} bits, gaussian data": {lab: hist["gaussian", b, lab] for lab in ("fitted", "fork")} for b in (4, 3)},
    plots.figure_path("codebooks_indices.png"),
    title="Index histograms of rotated Gaussian blocks",
)
display(Image(filename=str(path)))

# %% [markdown]
# ## The error
#
# NMSE of the real codecs (`tbq4_0`, `tbq3_0`) with each table, next to the
# Gaussian Lloyd–Max distortions, and q4_0 for scale. TBQ's corrected norm
# (`d = |x| / |c[idx]|`) rescales whatever levels are chosen, so a table that
# is too wide does not make the output too large; it wastes the levels.

# %%
err = {}
for ds, x in data.items():
    for b in (4, 3):
        for label in ("lloyd-max", "turboq-mtp"):
            q = study.get_quantizer(f"tbq{b}_0", codebook=label)
            err[ds, b, label] = metrics.nmse(x, q(x))
    err[ds, "q4_0"] = metrics.nmse(x, study.get_quantizer("q4_0")(x))
for k, e in err.items():
    print(f"{' '.join(map(str, k)):30s} NMSE {e:.4e}  SNR {-10 * np.log10(e):6.2f} dB")
lm = {b: metrics.lloyd_max_distortion(b) for b in (1, 2, 3, 4)}
print("Gaussian Lloyd-Max distortion: " + ", ".join(f"{b} bit {d:.4f}" for b, d in lm.items()))
# A sign quantizer whose output keeps the norm of the input (what TBQ's corrected norm does when every
# coordinate lands in one of the two middle cells) reconstructs sign(x) * |x|_2 / sqrt(n): NMSE 2 - 2 E|x| / sigma.
SIGN_NORM = 2 - 2 * np.sqrt(2 / np.pi)
print(f"norm-preserving sign quantizer of a Gaussian: NMSE {SIGN_NORM:.4f}")

# %% [markdown]
# ## What it does to attention
#
# Keys quantized with each 3-bit table (values exact), against seeded random
# queries, on the keys with outlier channels.

# %%
Kx = data["outlier keys"]
Qr = metrics.random_queries(16, 128, HEADS, seed=3)
att = {}
for b in (4, 3):
    for label in ("lloyd-max", "turboq-mtp"):
        q = study.get_quantizer(f"tbq{b}_0", codebook=label)
        att[b, label] = metrics.attention_error(Qr, Kx, None, q(Kx), topk=8)
        m = att[b, label]
        print(f"K tbq{b}_0 {label:10s}: logit RMSE {m['logit_rmse']:.3f}  KL {m['kl_mean']:.4f}  top-8 {m['topk_agreement']:.3f}")

# %% [markdown]
# ## Conclusion for a user of the fork

# %%
g = "gaussian"
e3f, e3k = err[g, 3, "lloyd-max"], err[g, 3, "turboq-mtp"]
e4f, e4k = err[g, 4, "lloyd-max"], err[g, 4, "turboq-mtp"]
print(
    f"TBQ4: the fork's 4-bit table is the Lloyd-Max table to within {diff['tbq4_max_relative_difference']:.1e} "
    f"(relative), the index entropy is {ent[g, 4, 'fork']:.3f} vs {ent[g, 4, 'fitted']:.3f} bits and the NMSE "
    f"{e4k:.5f} vs {e4f:.5f}: a tbq4_0 cache from the fork is as good as one built with the fitted table."
)
print(
    f"TBQ3: the fork's 3-bit levels are {diff['tbq3_ratio_min']:.1f}-{diff['tbq3_ratio_max']:.1f}x too wide for "
    f"sigma = 1/sqrt(128). {middle[g, 3, 'fork']:.2%} of the rotated coordinates fall into the two middle cells, "
    f"so a stored 3-bit index carries {ent[g, 3, 'fork']:.2f} bits of information instead of "
    f"{ent[g, 3, 'fitted']:.2f}: the cache stores 3.125 bits per value but behaves like a sign quantizer with a norm. "
    f"Its NMSE is {e3k:.3f} against {e3f:.4f} with the fitted table ({e3k / e3f:.1f}x the error, SNR "
    f"{-10 * np.log10(e3k):.1f} dB instead of {-10 * np.log10(e3f):.1f} dB), "
    f"{'close to' if abs(e3k / SIGN_NORM - 1) < 0.1 else 'compare with'} the {SIGN_NORM:.3f} of a norm-preserving "
    f"sign quantizer, {'above even' if e3k > lm[1] else 'below'} the 1-bit Lloyd-Max distortion {lm[1]:.3f} and "
    f"{'worse' if e3k > lm[2] else 'better'} than 2-bit Lloyd-Max ({lm[2]:.3f}); q4_0 at 4.5 bits gives "
    f"{err[g, 'q4_0']:.4f}."
)
a3f, a3k = att[3, "lloyd-max"], att[3, "turboq-mtp"]
print(
    f"For attention over keys with outlier channels the fork's 3-bit table gives a softmax KL of {a3k['kl_mean']:.3f} "
    f"nats against {a3f['kl_mean']:.3f} with the fitted table ({a3k['kl_mean'] / a3f['kl_mean']:.1f}x), and keeps "
    f"{a3k['topk_agreement']:.0%} of the top-8 tokens instead of {a3f['topk_agreement']:.0%}."
)
print(
    "What to do: with that fork, prefer tbq4_0 (unaffected) or q8_0 for the cache; if you use tbq3_0, rebuild "
    "with the fitted 3-bit table (tbq's default 'lloyd-max'), which is a table change, not a format change: "
    "the bytes layout is identical, but caches written with one table must be read with the same one."
)
