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
# # What the randomized Hadamard rotation does to a key block
#
# Keys have a few channels that are much larger than the rest. A block
# quantizer that scales by the block's maximum (q4_0) or that codes each
# coordinate against a table fitted for N(0, 1/128) (Lloyd–Max on the
# normalised block) then either wastes its levels or clips the outliers. TBQ
# first applies `R(x) = s2 * H(s1 * x)`: orthonormal, so norms and dot products
# survive, and every output coordinate is a ±1 mix of all 128 inputs, so an
# outlier's energy is spread evenly.
#
# This notebook looks at key blocks with outlier channels (channels 5, 37, 64
# and 111 scaled by 20, `tbq.synthetic.keys_with_outliers`) before and after
# the rotation, and at the error of the same Lloyd–Max quantizer with and
# without it (`tbq.study.LloydMaxNoRotation` against the `tbq4_0`/`tbq3_0`
# codecs; the study quantizer is not a byte format). The last section sets the
# 128-point Hadamard rotation against the two smaller rotations of the fork's
# other formats, on the same data: 2-D Givens rotations of channel pairs
# (`planar3_0`, `planar4_0`) and 4-D quaternion products on groups of four
# channels (`iso3_0`, `iso4_0`).

# %%
import numpy as np
from IPython.display import Image, display

import tbq
from tbq import metrics, plots, study, synthetic

SMALL = plots.small_mode()
TOKENS, HEADS = (32, 2) if SMALL else (1024, 8)
OUTLIERS, FACTOR = synthetic.DEFAULT_OUTLIER_CHANNELS, 20.0
keys = synthetic.keys_with_outliers(TOKENS, HEADS, seed=1, channels=OUTLIERS, factor=FACTOR)
gauss = synthetic.gaussian(TOKENS, HEADS, seed=2)
rotation = tbq.get_codec("tbq4_0").rotation  # the deployed ("turboq-mtp") sign tables
print(f"{TOKENS * HEADS:,} key blocks of 128 values; outlier channels {OUTLIERS} scaled by {FACTOR:g}")

# %% [markdown]
# ## One block, and all blocks, before and after
#
# Both domains are shown for the unit-norm block `u = x / |x|` (what TBQ
# quantizes). Excess kurtosis is 0 for a Gaussian; max/RMS is the ratio an
# absmax scale has to cover.


# %%
def unit_blocks(x):
    b = x.reshape(-1, 128).astype(np.float64)
    return b / np.linalg.norm(b, axis=1, keepdims=True)


def rotate(u):
    return rotation.forward(u.astype(np.float32)).astype(np.float64)


stats = {}
for label, x in (("outlier keys", keys), ("gaussian", gauss)):
    u = unit_blocks(x)
    r = rotate(u)
    stats[label] = {
        "kurtosis before": metrics.kurtosis(u, axis=1),
        "kurtosis after": metrics.kurtosis(r, axis=1),
        "max/RMS before": metrics.peak_to_rms(u),
        "max/RMS after": metrics.peak_to_rms(r),
        "largest coordinate share of energy before": np.max(u * u, axis=1),
        "largest coordinate share of energy after": np.max(r * r, axis=1),
    }
for label, st in stats.items():
    print(label)
    for k, v in st.items():
        print(f"  {k:44s} median {np.median(v):8.3f}   max {np.max(v):8.3f}")

u_out = unit_blocks(keys)
share = np.sum(u_out[:, list(OUTLIERS)] ** 2, axis=1)
print(
    f"\nthe {len(OUTLIERS)} outlier channels hold {np.median(share):.1%} of a key block's energy (median over blocks)"
)

# %%
so = stats["outlier keys"]
kb, ka = np.median(so["kurtosis before"]), np.median(so["kurtosis after"])
pb, pa = np.median(so["max/RMS before"]), np.median(so["max/RMS after"])
pg = np.median(stats["gaussian"]["max/RMS before"])
print(
    f"Before the rotation a key block has median excess kurtosis {kb:.1f} and max/RMS {pb:.2f} (a one-hot block "
    f"would have {np.sqrt(128):.2f}); after it, kurtosis {ka:.2f} and max/RMS {pa:.2f}, "
    f"{'below' if pa < pg else 'about'} the {pg:.2f} of a Gaussian block."
)
if ka < -0.3:
    print(
        "The rotated coordinates are not exactly Gaussian either: with a few dominant channels each coordinate is "
        "essentially a +-1 combination of those few values, a light-tailed (negative kurtosis) distribution. "
        "Its extremes are bounded, which is easy for the Lloyd-Max table."
    )

# %%
i0 = 0
path = plots.plot_rotation_block(
    u_out[i0],
    rotate(u_out[i0 : i0 + 1])[0],
    plots.figure_path("rotation_block.png"),
    peak_rms={"before": so["max/RMS before"], "after rotation": so["max/RMS after"]},
    title=f"A key block with outlier channels {OUTLIERS} (x{FACTOR:g}) before and after the randomized Hadamard transform",
)
display(Image(filename=str(path)))

# %% [markdown]
# ## Lloyd–Max with and without the rotation, on the same data
#
# The quantizers below share everything (unit-norm block, the same fitted
# codebook, the corrected fp16 norm) except the rotation. `rlm<b>` with seeded
# signs checks that the particular sign tables do not matter.

# %%
pairs = {4: ("lm4", "tbq4_0", "rlm4"), 3: ("lm3", "tbq3_0", "rlm3")}
err = {}
for label, x in (("outlier keys", keys), ("gaussian", gauss)):
    for specs in pairs.values():
        for spec in specs:
            q = study.get_quantizer(spec, signs=7) if spec.startswith("rlm") else study.get_quantizer(spec)
            err[label, q.name] = metrics.nmse(x, q(x))
    err[label, "q4_0"] = metrics.nmse(x, study.get_quantizer("q4_0")(x))
for (label, name), e in err.items():
    print(f"{label:13s} {name:10s} NMSE {e:.4e}   SNR {-10 * np.log10(e):6.2f} dB")

# %%
for bits in (4, 3):
    no, yes = err["outlier keys", f"lm{bits}-norot"], err["outlier keys", f"tbq{bits}_0"]
    gno, gyes = err["gaussian", f"lm{bits}-norot"], err["gaussian", f"tbq{bits}_0"]
    print(
        f"{bits} bits on outlier keys: without rotation NMSE {no:.4f}, with it {yes:.4f} ({no / yes:.0f}x less error). "
        f"On Gaussian data the two give {gno:.4f} and {gyes:.4f} (ratio {gno / gyes:.2f})"
        + (": the rotation costs nothing where it is not needed." if abs(gno / gyes - 1) < 0.1 else ".")
    )

# %% [markdown]
# ## Where the error goes: per channel
#
# Without the rotation, compare the normalised outlier coordinates with the
# codebook's range, and the other channels with its spacing; with the rotation,
# look at how evenly the error is spread over channels.

# %%
lm4, t4 = study.get_quantizer("lm4"), study.get_quantizer("tbq4_0")
c = lm4.codebook.centroids
print(
    f"normalised outlier coordinates: median |u| = {np.median(np.abs(u_out[:, list(OUTLIERS)])):.3f}; the 4-bit table's "
    f"largest level is {c[-1]:.3f}, so they are clipped. Other channels: median |u| = "
    f"{np.median(np.abs(np.delete(u_out, list(OUTLIERS), axis=1))):.4f}, against a smallest level of {c[len(c) // 2]:.4f}."
)
ch_no = metrics.per_channel_error(keys, lm4(keys), "nmse")
ch_yes = metrics.per_channel_error(keys, t4(keys), "nmse")
normal = np.setdiff1d(np.arange(128), OUTLIERS)
print(
    f"per-channel NMSE without rotation: outlier channels {np.mean(ch_no[list(OUTLIERS)]):.3f}, "
    f"others {np.mean(ch_no[normal]):.3f}; with rotation: outlier channels {np.mean(ch_yes[list(OUTLIERS)]):.4f}, "
    f"others {np.mean(ch_yes[normal]):.3f}"
)
mse_yes = metrics.per_channel_error(keys, t4(keys), "mse")
print(
    f"With rotation the absolute error (MSE) of the outlier channels is {np.mean(mse_yes[list(OUTLIERS)]) / np.mean(mse_yes[normal]):.2f} "
    f"times that of the others: the error is spread over the channels regardless of their size, so the small channels, which hold {1 - np.median(share):.1%} of the "
    "energy, carry a larger relative error than the outliers. Without rotation the clipped outliers make the "
    "corrected norm too large, which scales the small channels up: a relative error above 1 means worse than "
    "storing zeros."
    if np.mean(ch_no[normal]) > 1
    else ""
)
path = plots.plot_lines(
    np.arange(128),
    {"per-channel NMSE, 4 bits, outlier keys": {"Lloyd-Max, no rotation": ch_no, "tbq4_0 (rotated)": ch_yes}},
    plots.figure_path("rotation_channels.png"),
    xlabel="channel",
)
display(Image(filename=str(path)))

# %% [markdown]
# ## How large must an outlier be before the rotation matters?

# %%
factors = [1, 2, 5, 10, 20, 50] if SMALL else [1, 1.5, 2, 3, 5, 7, 10, 15, 20, 30, 50, 100]
sweep = {name: [] for name in ("lm4", "tbq4_0", "lm3", "tbq3_0", "q4_0", "planar4_0", "iso4_0")}
for f in factors:
    x = synthetic.keys_with_outliers(TOKENS, HEADS, seed=1, channels=OUTLIERS, factor=f)
    for name in sweep:
        q = study.get_quantizer(name)
        sweep[name].append(metrics.nmse(x, q(x)))
labels = {
    "lm4": "Lloyd-Max 4 bit, no rotation",
    "tbq4_0": "tbq4_0",
    "lm3": "Lloyd-Max 3 bit, no rotation",
    "tbq3_0": "tbq3_0",
    "q4_0": "q4_0",
    "planar4_0": "planar4_0 (Givens pairs)",
    "iso4_0": "iso4_0 (quaternion groups)",
}
path = plots.plot_lines(
    factors,
    {"NMSE against outlier size": {labels[k]: v for k, v in sweep.items()}},
    plots.figure_path("rotation_error.png"),
    xlabel="outlier channel factor",
    logx=10,
    styles={labels["lm4"]: "--", labels["lm3"]: "--", labels["planar4_0"]: ":", labels["iso4_0"]: ":"},
)
display(Image(filename=str(path)))
cross = next((f for f, a, b in zip(factors, sweep["lm4"], sweep["tbq4_0"], strict=True) if a > 2 * b), None)
print(
    f"At factor {factors[0]:g} (no outliers) 4-bit NMSE is {sweep['lm4'][0]:.4f} without and {sweep['tbq4_0'][0]:.4f} "
    f"with rotation; without rotation the error doubles by factor {cross:g} and reaches {sweep['lm4'][-1]:.3f} "
    f"at {factors[-1]:g}, while tbq4_0 stays between {min(sweep['tbq4_0']):.4f} and {max(sweep['tbq4_0']):.4f}."
)

print(
    f"The small rotations follow the unrotated curve, not TBQ's: at factor {factors[-1]:g} planar4_0 has NMSE "
    f"{sweep['planar4_0'][-1]:.3f} and iso4_0 {sweep['iso4_0'][-1]:.3f}, at factor {factors[0]:g} "
    f"{sweep['planar4_0'][0]:.4f} and {sweep['iso4_0'][0]:.4f}."
)

# %% [markdown]
# ## Givens pairs and quaternion groups: rotations that stay local
#
# The fork's `planar` formats rotate each channel pair `(2p, 2p+1)` by its own
# fixed angle (64 independent 2-D Givens rotations); the `iso` formats multiply
# each group of four channels `(4g … 4g+3)` by its own fixed unit quaternion
# (32 independent 4-D rotations). Both are orthonormal, like the Hadamard
# transform, and both then code every coordinate with a codebook fitted for
# N(0, 1/128). But a Givens pair mixes only two channels and a quaternion group
# only four: an outlier channel's energy stays inside its own pair or group,
# split over two or four coordinates, while the randomized Hadamard transform
# adds `±x/√128` of every channel `x` to **every** coordinate. On Gaussian data
# all three rotations give the same i.i.d. Gaussian coordinates (any rotation
# of an isotropic Gaussian does); on keys with outlier channels only the
# Hadamard transform makes them Gaussian-like.
#
# The rotated coordinates below are the formats' own: the trace `r` of
# `tbq.get_format(name).encode(x, trace=True)`, the unit-norm block after the
# format's rotation, exactly what its codebook sees. The coordinates of the
# outlier channels' pairs (for the Givens rotation) and groups (quaternions)
# are the same index sets in every domain, so their share of the block's
# energy can be compared across rotations (in the figure, the groups are
# shaded).

# %%
ROTATIONS = {
    "Hadamard (tbq)": ("tbq4_0", "tbq3_0"),
    "Givens pairs (planar)": ("planar4_0", "planar3_0"),
    "quaternion groups (iso)": ("iso4_0", "iso3_0"),
}
PAIRS = sorted({c ^ 1 for c in OUTLIERS} | set(OUTLIERS))  # the Givens pair (2p, 2p+1) of each outlier channel
GROUPS = sorted({4 * (c // 4) + i for c in OUTLIERS for i in range(4)})  # its quaternion group


def rotated(fmt, x):
    """The unit-norm rotated coordinates of every block, from the format's own encoder trace."""
    _, tr = tbq.get_format(fmt).encode(x, trace=True)
    return np.asarray(tr["r"], np.float64).reshape(-1, 128)


def energy_share(v, idx):
    e = v * v
    return e[:, idx].sum(axis=1) / e.sum(axis=1)


coords = {("before rotation", "outlier keys"): unit_blocks(keys), ("before rotation", "gaussian"): unit_blocks(gauss)}
for label, (f4, _) in ROTATIONS.items():
    coords[label, "outlier keys"] = rotated(f4, keys)
    coords[label, "gaussian"] = rotated(f4, gauss)
rot_stats = {}
print(
    f"{'domain':24s} {'data':13s} {'kurtosis':>9s} {'max/RMS':>8s} {'top coord':>9s} {'pairs':>7s} {'groups':>7s}   (medians over blocks)"
)
for (label, ds), v in coords.items():
    st = rot_stats[label, ds] = {
        "kurtosis": metrics.kurtosis(v, axis=1),
        "max/RMS": metrics.peak_to_rms(v),
        "top": np.max(v * v, axis=1) / np.sum(v * v, axis=1),
        "pairs": energy_share(v, PAIRS),
        "groups": energy_share(v, GROUPS),
    }
    print(
        f"{label:24s} {ds:13s} {np.median(st['kurtosis']):9.2f} {np.median(st['max/RMS']):8.2f} {np.median(st['top']):9.3f} "
        f"{np.median(st['pairs']):7.3f} {np.median(st['groups']):7.3f}"
    )
print(
    f"'top coord': the largest coordinate's share of the block's energy; 'pairs': the share of the {len(PAIRS)} coordinates "
    f"of the outlier channels' Givens pairs; 'groups': of the {len(GROUPS)} coordinates of their quaternion groups "
    f"(a share spread evenly over the block would be {len(PAIRS) / 128:.3f} and {len(GROUPS) / 128:.3f})."
)

# %%
H, P, Q, B = "Hadamard (tbq)", "Givens pairs (planar)", "quaternion groups (iso)", "before rotation"
m = lambda label, key, ds="outlier keys": float(np.median(rot_stats[label, ds][key]))  # noqa: E731
print(
    f"Before any rotation the outlier channels' groups hold {m(B, 'groups'):.1%} of a key block's energy. After the "
    f"Givens rotation the {len(PAIRS)} coordinates of their pairs hold {m(P, 'pairs'):.1%}, after the quaternion rotation "
    f"the {len(GROUPS)} coordinates of their groups {m(Q, 'groups'):.1%}: the energy stays where it was. After the "
    f"Hadamard rotation the same {len(GROUPS)} coordinates hold {m(H, 'groups'):.1%}, about their fair share "
    f"{len(GROUPS) / 128:.1%}."
)
print(
    f"Median max/RMS: {m(B, 'max/RMS'):.2f} before, {m(P, 'max/RMS'):.2f} after Givens, {m(Q, 'max/RMS'):.2f} after "
    f"quaternions, {m(H, 'max/RMS'):.2f} after Hadamard (a Gaussian block: {m(B, 'max/RMS', 'gaussian'):.2f}). Median "
    f"excess kurtosis: {m(B, 'kurtosis'):.1f}, {m(P, 'kurtosis'):.1f}, {m(Q, 'kurtosis'):.1f} and {m(H, 'kurtosis'):.2f}."
)
print(
    "On Gaussian data the three rotations give the same coordinates statistically: median kurtosis "
    + ", ".join(f"{m(lab, 'kurtosis', 'gaussian'):.2f}" for lab in (H, P, Q))
    + ", max/RMS "
    + ", ".join(f"{m(lab, 'max/RMS', 'gaussian'):.2f}" for lab in (H, P, Q))
    + " (Hadamard, Givens, quaternion); the coordinates' standard deviation times sqrt(128): "
    + ", ".join(f"{np.std(coords[lab, 'gaussian']) * np.sqrt(128):.4f}" for lab in (H, P, Q))
    + "."
)

# %%
path = plots.plot_rotated_blocks(
    {
        "before rotation": coords[B, "outlier keys"][i0],
        "randomized Hadamard (tbq)": coords[H, "outlier keys"][i0],
        "Givens pairs (planar)": coords[P, "outlier keys"][i0],
        "quaternion groups (iso)": coords[Q, "outlier keys"][i0],
    },
    plots.figure_path("rotation_planar_iso.png"),
    mark=GROUPS,
    distributions={
        "max/RMS per key block": {lab: rot_stats[lab, "outlier keys"]["max/RMS"] for lab in (H, P, Q)},
        "energy share of the outlier groups": {lab: rot_stats[lab, "outlier keys"]["groups"] for lab in (H, P, Q)},
    },
    title=f"A key block with outlier channels {OUTLIERS} under the three rotations (shaded: the outlier channels' quaternion groups)",
)
display(Image(filename=str(path)))

# %% [markdown]
# ### The error, with each format's own table and with the same table
#
# The formats differ in their codebooks too: the 3-bit planar/iso table is
# close to Lloyd–Max for N(0, 1/128), the 4-bit one is narrower (see the
# `codebooks` notebook). To separate the rotation from the table,
# `tbq.study.rotated_nmse` takes each format's rotated coordinates and norms
# from its encoder and codes them with any table: with the format's own table
# it reproduces the format's NMSE (up to the fp16 rounding of the stored norm),
# with TBQ's Lloyd–Max table it shows the rotation alone.

# %%
from tbq.codebooks import lloyd_max

nm = {}
for ds, x in (("outlier keys", keys), ("gaussian", gauss)):
    for bits in (4, 3):
        for label, fmts in ROTATIONS.items():
            f = fmts[0] if bits == 4 else fmts[1]
            nm[ds, bits, label, "own table"] = metrics.nmse(x, study.get_quantizer(f)(x))
            nm[ds, bits, label, "Lloyd-Max table"] = study.rotated_nmse(f, x, lloyd_max(bits).centroids)
            own_check = study.rotated_nmse(f, x)
            assert abs(own_check / nm[ds, bits, label, "own table"] - 1) < 1e-2, (f, own_check)
        nm[ds, bits, "no rotation", "Lloyd-Max table"] = err[ds, f"lm{bits}-norot"]
print(f"{'data':13s} {'bits':>4s} {'rotation':24s} {'own table':>10s} {'Lloyd-Max table':>16s}")
for (ds, bits, label, table), e in nm.items():
    if table == "own table":
        print(f"{ds:13s} {bits:4d} {label:24s} {e:10.4f} {nm[ds, bits, label, 'Lloyd-Max table']:16.4f}")
    elif label == "no rotation":
        print(f"{ds:13s} {bits:4d} {label:24s} {'':10s} {e:16.4f}")

# %%
panels = {}
for ds in ("outlier keys", "gaussian"):
    for bits in (4, 3):
        bars = {}
        for label, fmts in ROTATIONS.items():
            name = fmts[0] if bits == 4 else fmts[1]
            bars[name] = nm[ds, bits, label, "own table"]
            if label != H:
                bars[f"{label.split(' (')[0]} + Lloyd-Max table"] = nm[ds, bits, label, "Lloyd-Max table"]
        bars["no rotation, Lloyd-Max"] = nm[ds, bits, "no rotation", "Lloyd-Max table"]
        panels[f"{ds}, {bits} bits"] = bars
path = plots.plot_bars(
    panels,
    plots.figure_path("rotation_nmse.png"),
    ncols=2,
    logy=False,
    title="NMSE of the three rotations, with each format's own table and with TBQ's Lloyd-Max table",
)
display(Image(filename=str(path)))


# %%
def nmse_at(data, bits):
    """The NMSE of `data` at `bits` bits, looked up by (rotation label, table)."""
    return lambda label, table: nm[data, bits, label, table]


for bits in (4, 3):
    o, g = nmse_at("outlier keys", bits), nmse_at("gaussian", bits)
    t = o(H, "own table")
    print(
        f"{bits} bits, outlier keys: tbq NMSE {t:.4f}; planar {o(P, 'own table'):.4f} ({o(P, 'own table') / t:.0f}x) and iso "
        f"{o(Q, 'own table'):.4f} ({o(Q, 'own table') / t:.0f}x). With the Lloyd-Max table instead of their own: planar "
        f"{o(P, 'Lloyd-Max table'):.4f}, iso {o(Q, 'Lloyd-Max table'):.4f}, still {o(P, 'Lloyd-Max table') / t:.0f}x and "
        f"{o(Q, 'Lloyd-Max table') / t:.0f}x tbq's; no rotation at all gives {o('no rotation', 'Lloyd-Max table'):.4f}."
    )
    print(
        f"{bits} bits, gaussian: tbq {g(H, 'own table'):.4f}, planar {g(P, 'own table'):.4f}, iso {g(Q, 'own table'):.4f} "
        f"with their own tables; with the Lloyd-Max table planar {g(P, 'Lloyd-Max table'):.4f} and iso "
        f"{g(Q, 'Lloyd-Max table'):.4f}"
        + (
            ": on Gaussian data the rotations are equivalent and only the table differs."
            if max(abs(g(lab, "Lloyd-Max table") / g(H, "own table") - 1) for lab in (P, Q)) < 0.05
            else "."
        )
    )
o4 = lambda label, table: nm["outlier keys", 4, label, table]  # noqa: E731
share_table = (o4(P, "own table") - o4(P, "Lloyd-Max table")) / (o4(P, "own table") - o4(H, "own table"))
print(
    f"Of planar4_0's excess error over tbq4_0 on outlier keys, the table accounts for {share_table:.0%} and the rotation "
    f"for {1 - share_table:.0%}: a rotation that mixes two or four channels cannot spread an outlier, whatever the table."
)
