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
# codecs; the study quantizer is not a byte format).

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
print(f"\nthe {len(OUTLIERS)} outlier channels hold {np.median(share):.1%} of a key block's energy (median over blocks)")

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
    for bits, specs in pairs.items():
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
sweep = {name: [] for name in ("lm4", "tbq4_0", "lm3", "tbq3_0", "q4_0")}
for f in factors:
    x = synthetic.keys_with_outliers(TOKENS, HEADS, seed=1, channels=OUTLIERS, factor=f)
    for name in sweep:
        q = study.get_quantizer(name)
        sweep[name].append(metrics.nmse(x, q(x)))
labels = {"lm4": "Lloyd-Max 4 bit, no rotation", "tbq4_0": "tbq4_0", "lm3": "Lloyd-Max 3 bit, no rotation",
          "tbq3_0": "tbq3_0", "q4_0": "q4_0"}
path = plots.plot_lines(
    factors,
    {"NMSE against outlier size": {labels[k]: v for k, v in sweep.items()}},
    plots.figure_path("rotation_error.png"),
    xlabel="outlier channel factor",
    logx=10,
    styles={labels["lm4"]: "--", labels["lm3"]: "--"},
)
display(Image(filename=str(path)))
cross = next((f for f, a, b in zip(factors, sweep["lm4"], sweep["tbq4_0"]) if a > 2 * b), None)
print(
    f"At factor {factors[0]:g} (no outliers) 4-bit NMSE is {sweep['lm4'][0]:.4f} without and {sweep['tbq4_0'][0]:.4f} "
    f"with rotation; without rotation the error doubles by factor {cross:g} and reaches {sweep['lm4'][-1]:.3f} "
    f"at {factors[-1]:g}, while tbq4_0 stays between {min(sweep['tbq4_0']):.4f} and {max(sweep['tbq4_0']):.4f}."
)
