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
# # Value tables against the Lloyd–Max optimum: TBQ's fitted and `turboq-mtp` tables, and every other shipped table
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
# the resulting error, and what it means for attention, with the conclusion
# for a user of the fork. The last part holds **every** value table the
# sixteen formats ship (TBQ's two sets, the planar/iso centroids, iq4_nl's
# grid, FP4's E2M1 grid, the uniform grids of the integer formats) against the
# Lloyd–Max optimum of the distribution each one actually meets.

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
    print(
        f"{ds:13s} {b} bits {label:6s}: entropy {h:.3f} bits of {b}; share in the two middle cells {middle[ds, b, label]:.2%}"
    )

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
        print(
            f"K tbq{b}_0 {label:10s}: logit RMSE {m['logit_rmse']:.3f}  KL {m['kl_mean']:.4f}  top-8 {m['topk_agreement']:.3f}"
        )

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

# %% [markdown]
# ## Every shipped table against the Lloyd–Max optimum of what it meets
#
# A scalar table is only as good as its fit to the values it is given. For
# each table below, `tbq.study.table_inputs` reads those values from the
# format's own encoder trace, in the units of the table
# (`tbq.study.table_levels`):
#
# * rotated formats (tbq, planar, iso): the coordinates `r` of the unit-norm
#   block after the format's own rotation; about N(0, 1/128) when the rotation
#   makes them Gaussian;
# * iq4_nl: `a = x / d0` with `d0 = max / -127`, the values its nearest-entry
#   search rounds to the int8 table (the stored scale is refitted afterwards);
# * mxfp4, nvfp4: `x / d` with the halved block (or sub-block) scale, rounded
#   to the doubled E2M1 values `0, ±1, ±2, ±3, ±4, ±6, ±8, ±12`;
# * the integer formats: `v = x / d` (q4_0, q5_0, q8_0) or `(x - min) / d`
#   (q4_1, q5_1), rounded to the uniform grid of their codes.
#
# The **distortion ratio** (`tbq.metrics.table_distortion`) is the table's MSE
# on those values divided by the MSE of the Lloyd–Max quantizer of the same
# values with as many levels as the format has codes (`2^b`: FP4 spends two
# codes on zero, q8_0 never uses code -128, and both count against them). It
# is 1 for a Lloyd–Max table and above 1 for any other. For the rotated
# formats it is also computed in closed form against N(0, 1/128)
# (`tbq.metrics.gaussian_distortion`, `tbq.metrics.lloyd_max_levels`). The
# *best-scale* ratio rescales the table first: what its shape alone costs,
# with the scale set right.
#
# The values come from the Gaussian data above, and for the rotated formats
# also from the keys with outlier channels. The ratio concerns the table at
# the point where the encoder rounds; a format's final error also depends on
# what it does with the scale afterwards (TBQ's corrected norm, iq4_nl's
# least-squares scale), which the `formats` notebook measures.

# %%
SHIPPED = [  # (label, format, format options)
    ("TBQ4 lloyd-max", "tbq4_0", {}),
    ("TBQ4 turboq-mtp", "tbq4_0", {"codebook": "turboq-mtp"}),
    ("TBQ3 lloyd-max", "tbq3_0", {}),
    ("TBQ3 turboq-mtp", "tbq3_0", {"codebook": "turboq-mtp"}),
    ("planar/iso 4-bit in planar4_0", "planar4_0", {}),
    ("planar/iso 4-bit in iso4_0", "iso4_0", {}),
    ("planar/iso 3-bit in planar3_0", "planar3_0", {}),
    ("planar/iso 3-bit in iso3_0", "iso3_0", {}),
    ("iq4_nl K", "iq4_nl", {}),
    ("E2M1 in mxfp4", "mxfp4", {}),
    ("E2M1 in nvfp4", "nvfp4", {}),
    ("q4_0 grid", "q4_0", {}),
    ("q5_0 grid", "q5_0", {}),
    ("q8_0 grid", "q8_0", {}),
    ("q4_1 grid", "q4_1", {}),
    ("q5_1 grid", "q5_1", {}),
]
inputs, dist = {}, {}
for label, fmt, opts in SHIPPED:
    levels = study.table_levels(fmt, **opts)
    n = 1 << tbq.format_info(fmt).index_bits
    assert len(levels) == n
    row = {"format": fmt, "levels": levels, "n": n}
    for ds in ("gaussian", "outlier keys") if tbq.format_info(fmt).rotated else ("gaussian",):
        inputs[label, ds] = study.table_inputs(fmt, data[ds], **opts)
        row[ds] = metrics.table_distortion(levels, samples=inputs[label, ds], n_levels=n)
    if tbq.format_info(fmt).rotated:
        row["N(0, 1/128)"] = metrics.table_distortion(levels, sigma=SIGMA_128, n_levels=n)
    dist[label] = row

print(
    f"{'table':30s} {'codes':>5s} {'N(0,1/128)':>10s} {'gaussian data':>13s} {'best scale':>10s} {'at scale':>8s} {'outlier keys':>12s}"
)
for label, row in dist.items():
    g = row["gaussian"]
    closed = f"{row['N(0, 1/128)']['ratio']:10.3f}" if "N(0, 1/128)" in row else f"{'':10s}"
    outl = f"{row['outlier keys']['ratio']:12.3f}" if "outlier keys" in row else ""
    print(
        f"{label:30s} {row['n']:5d} {closed} {g['ratio']:13.3f} {g['best_ratio']:10.3f} {g['best_scale']:8.3f} {outl}"
    )
print(
    "Columns: the distortion ratio in closed form on N(0, 1/128) (rotated formats), measured on the values the table meets "
    "with Gaussian data, the same at the best scale and that scale, and measured on the keys with outlier channels."
)

# %% [markdown]
# What the rotations deliver to their tables: the measured coordinates'
# standard deviation (times √128, so 1 means σ = 1/√128) and excess kurtosis
# (0 for a Gaussian; the coordinates of a uniformly random unit vector in 128
# dimensions have `-6/130`).

# %%
for label, fmt in (
    ("TBQ4 lloyd-max", "Hadamard (tbq)"),
    ("planar/iso 4-bit in planar4_0", "Givens pairs (planar)"),
    ("planar/iso 4-bit in iso4_0", "quaternion groups (iso)"),
):
    for ds in ("gaussian", "outlier keys"):
        r = inputs[label, ds]
        print(
            f"{fmt:24s} {ds:13s} std x sqrt(128) {np.std(r) * np.sqrt(128):7.4f}   excess kurtosis {metrics.kurtosis(r):7.3f}"
        )
print(f"a uniformly random unit vector in 128 dimensions: excess kurtosis {-6 / 130:.3f}")

# %%
PANELS = [
    "TBQ4 lloyd-max",
    "TBQ3 lloyd-max",
    "TBQ4 turboq-mtp",
    "TBQ3 turboq-mtp",
    "planar/iso 4-bit in planar4_0",
    "planar/iso 3-bit in planar3_0",
    "iq4_nl K",
    "E2M1 in mxfp4",
    "E2M1 in nvfp4",
    "q4_0 grid",
    "q5_0 grid",
    "q8_0 grid",
]
path = plots.plot_value_tables(
    {
        f"{lab} (ratio {dist[lab]['gaussian']['ratio']:.2f})": {
            "samples": inputs[lab, "gaussian"],
            "tables": {
                "shipped table": dist[lab]["levels"],
                "Lloyd-Max of these values": dist[lab]["gaussian"]["lloyd_max_levels"],
            },
        }
        for lab in PANELS
    },
    plots.figure_path("codebooks_shipped.png"),
    title="Shipped value tables over the values they meet (Gaussian data), with the Lloyd-Max table of those values",
)
display(Image(filename=str(path)))

# %%
path = plots.plot_bars(
    {
        "distortion ratio, Gaussian data": {lab: row["gaussian"]["ratio"] for lab, row in dist.items()},
        "at the best scale": {lab: row["gaussian"]["best_ratio"] for lab, row in dist.items()},
        "outlier keys (rotated formats)": {
            lab: row["outlier keys"]["ratio"] for lab, row in dist.items() if "outlier keys" in row
        },
    },
    plots.figure_path("codebooks_ratios.png"),
    ncols=3,
    hline={
        k: (1.0, "Lloyd-Max")
        for k in ("distortion ratio, Gaussian data", "at the best scale", "outlier keys (rotated formats)")
    },
    title="Table MSE / Lloyd-Max MSE at the same number of codes",
)
display(Image(filename=str(path)))

# %% [markdown]
# ### What the tables show

# %%
R = lambda lab, key="ratio", ds="gaussian": dist[lab][ds][key]  # noqa: E731
C = lambda lab, key="ratio": dist[lab]["N(0, 1/128)"][key]  # noqa: E731
print(
    f"TBQ's fitted tables are Lloyd-Max for N(0, 1/128) by construction (closed-form ratio {C('TBQ4 lloyd-max'):.4f} and "
    f"{C('TBQ3 lloyd-max'):.4f}) and stay there on the measured coordinates ({R('TBQ4 lloyd-max'):.3f}, "
    f"{R('TBQ3 lloyd-max'):.3f}); the fork's 4-bit table is the same ({R('TBQ4 turboq-mtp'):.3f})."
)
print(
    f"The fork's 3-bit table has ratio {R('TBQ3 turboq-mtp'):.1f} at the scale the encoder uses; rescaled it would be "
    f"{R('TBQ3 turboq-mtp', 'best_ratio'):.3f}: the right shape, for a Gaussian {1 / C('TBQ3 turboq-mtp', 'best_scale'):.2f} "
    "times wider than the rotated coordinates (TBQ's corrected norm recovers part of the loss; the NMSE above is what remains)."
)
p3, p4 = "planar/iso 3-bit in planar3_0", "planar/iso 4-bit in planar4_0"
print(
    f"planar/iso 3-bit: ratio {C(p3):.3f} on N(0, 1/128) and {R(p3):.3f} measured: "
    + (
        "a Lloyd-Max table for the Gaussian the rotations deliver on Gaussian data."
        if R(p3) < 1.02
        else "not quite Lloyd-Max."
    )
    + f" planar/iso 4-bit: ratio {C(p4):.2f} on N(0, 1/128) and {R(p4):.2f} measured; it fits best a Gaussian "
    f"{1 / C(p4, 'best_scale'):.2f} times as wide (sigma {SIGMA_128 / C(p4, 'best_scale'):.4f}), where its ratio is "
    f"{C(p4, 'best_ratio'):.3f}: too narrow for the coordinates it meets"
    + (", and not a Lloyd-Max shape even at its best scale." if C(p4, "best_ratio") > 1.02 else ".")
)
print(
    f"On keys with outlier channels the planar/iso tables meet coordinates that the small rotations left spiky: "
    f"ratio {R(p4, ds='outlier keys'):.1f} (4-bit, Givens), {R('planar/iso 4-bit in iso4_0', ds='outlier keys'):.1f} "
    f"(4-bit, quaternion), {R(p3, ds='outlier keys'):.1f} and {R('planar/iso 3-bit in iso3_0', ds='outlier keys'):.1f} (3-bit), "
    f"against {R('TBQ4 lloyd-max', ds='outlier keys'):.2f} and {R('TBQ3 lloyd-max', ds='outlier keys'):.2f} for TBQ's tables "
    "behind the Hadamard rotation (whose coordinates are then lighter-tailed than a Gaussian, so a table fitted to them "
    "could do a little better)."
)
mx = inputs["E2M1 in mxfp4", "gaussian"].reshape(-1, tbq.format_info("mxfp4").block_size)
mx_top = float(np.max(dist["E2M1 in mxfp4"]["levels"]))
mx_sat = float(np.mean(np.max(np.abs(mx), axis=1) > mx_top))
print(
    f"iq4_nl's non-uniform int8 table: ratio {R('iq4_nl K'):.3f} on the block-normalised Gaussian values x/d0"
    + (": close to the Lloyd-Max table of what it meets." if R("iq4_nl K") < 1.05 else ".")
    + f" The E2M1 grid: {R('E2M1 in mxfp4'):.2f} in mxfp4 ({R('E2M1 in mxfp4', 'best_ratio'):.2f} at the best scale: "
    f"its power-of-two scale puts the largest values of {mx_sat:.0%} of the blocks beyond the top level, where they "
    "saturate) and "
    f"{R('E2M1 in nvfp4'):.2f} in nvfp4 ({R('E2M1 in nvfp4', 'best_ratio'):.2f} at the best scale): a float grid, dense "
    "near zero and coarse at the top, is a poor shape for block-normalised Gaussian values."
)
print(
    "The uniform grids: "
    + ", ".join(
        f"{lab.split()[0]} {R(lab):.3f}" for lab in ("q4_0 grid", "q5_0 grid", "q8_0 grid", "q4_1 grid", "q5_1 grid")
    )
    + f": a uniform grid over the block's range loses between {min(R(l) for l in ('q4_0 grid', 'q5_0 grid', 'q8_0 grid', 'q4_1 grid', 'q5_1 grid')) - 1:.0%} "
    f"and {max(R(l) for l in ('q4_0 grid', 'q5_0 grid', 'q8_0 grid', 'q4_1 grid', 'q5_1 grid')) - 1:.0%} "
    "to the optimal non-uniform one; iq4_nl's table shows how much of that a fixed non-uniform grid recovers."
)
