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
# # The TurboQuant caches people run: turbo2/3/4 and vLLM's presets
#
# Two families of rotated KV caches that tbq reproduces bit for bit
# (docs/formats.md, docs/formats-vllm.md):
#
# - the community llama.cpp fork's `turbo2`, `turbo3`, `turbo4` (one fp16
#   norm and 2/3/4-bit indices per 128 values, TBQ's randomized Hadamard
#   rotation, the fork's own tables; turbo4 also stores an fp16 `rnorm` that is
#   always zero);
# - vLLM's `--kv-cache-dtype turboquant_*` presets: per (token, KV head) a
#   slot holding the key (FP8 E4M3 without a scale for `k8v4`, else a
#   Sylvester-Hadamard-rotated Lloyd–Max key with an fp16 norm) and the value
#   (uniform asymmetric codes with an fp16 scale and zero point).
#
# Questions:
#
# 1. What does each cost in bytes per token (`tbq.budget`: turbo's head
#    padding, vLLM's slot rounding and unquantized boundary layers included)?
# 2. At those bytes, where do they stand against tbq4_0/tbq3_0, q4_0 and iq4_nl
#    with llama.cpp's attention rotation, and q8_0, as a key cache and as a
#    value cache, on synthetic and on real K/V (NMSE, logit error, softmax KL,
#    top-8, attention-output NMSE)?
# 3. At model level (perplexity, KL against the f16 cache) on the shipped model.
# 4. What each defect or choice listed in the two SPECs' quirk sections costs,
#    measured.
#
# The study quantizers return each cache's reconstruction in the input's
# domain (`tbq.study.CodecQuantizer`; turbo's decoders return the rotated
# domain and are rotated back with `Format.from_decode_domain`). The TBQ
# formats use tbq's fitted Lloyd–Max tables (the `tbq` default), not the
# other fork's `turboq-mtp` tables (the codebooks notebook).

# %%
import numpy as np
from IPython.display import Image, display

import tbq
from tbq import budget, metrics, plots, study, synthetic
from tbq.codebooks import lloyd_max, trapezoid_lloyd_max
from tbq.formats.turbo import TABLES, turbo_index
from tbq.rotation import fwht

SMALL = plots.small_mode()
TOKENS, HEADS = (256, 2) if SMALL else (2048, 8)
N_QUERIES = 8 if SMALL else 32
HEAD_DIM = 128
print(f"synthetic data: {TOKENS} tokens x {HEADS} heads x {HEAD_DIM}; {N_QUERIES} random queries per head")

# %% [markdown]
# ## 1. Bytes per token
#
# `tbq.budget` charges every cache type its stored bytes: turbo2/3/4 pad a
# head to a multiple of 128 values; a vLLM preset stores one slot per (token,
# KV head) of `S_al` bytes (the slot rounded up to an even size) for K and V
# together, and leaves the first and last two layers of a dense model at 16
# bits. The columns: bits per value of a quantized layer at head_dim 128 and
# 64, and the bytes per token of the shipped model (4 layers, 2 KV heads of
# 128) and of a 32-layer model with 8 KV heads of 128.

# %%
CACHE_TYPES = {
    "q8_0": ("q8_0", "q8_0"),
    "q4_0": ("q4_0", "q4_0"),
    "iq4_nl": ("iq4_nl", "iq4_nl"),
    "tbq4_0": ("tbq4_0", "tbq4_0"),
    "tbq3_0": ("tbq3_0", "tbq3_0"),
    "turbo4": ("turbo4", "turbo4"),
    "turbo3": ("turbo3", "turbo3"),
    "turbo2": ("turbo2", "turbo2"),
    "q8_0:turbo3": ("q8_0", "turbo3"),
    "turboquant_k8v4": ("fp8_e4m3", "vllm_tq4_v"),
    "turboquant_4bit_nc": ("vllm_tq4_k", "vllm_tq4_v"),
    "turboquant_k3v4_nc": ("vllm_tq3_k", "vllm_tq4_v"),
    "turboquant_3bit_nc": ("vllm_tq3_k", "vllm_tq3_v"),
}


def bits(ct, head_dim=HEAD_DIM, n_layers=None):
    geom = {"head_dim": head_dim} | ({"n_layers": n_layers} if n_layers else {})
    return float(budget.format_bits(ct, geom)[1])


BITS = {ct: bits(ct) for ct in CACHE_TYPES}
print(
    f"{'cache type':<20} {'K:V formats':<24} {'bits/value':>10} {'at hd 64':>9} {'B/token shipped':>16} {'B/token 32x8x128':>17}"
)
for ct, (k, v) in CACHE_TYPES.items():
    print(
        f"{ct:<20} {k + ':' + v:<24} {BITS[ct]:>10.4g} {bits(ct, 64):>9.4g} "
        f"{budget.kv_bytes_per_token(4, 2, 128, ct):>16,} {budget.kv_bytes_per_token(32, 8, 128, ct):>17,}"
    )
shipped_vllm = bits("turboquant_4bit_nc", 128, 4)
print(
    f"\nvLLM keeps the first and last two layers unquantized: on the shipped model's 4 layers every layer is f16 "
    f"({shipped_vllm:g} bits per value for every preset); on 32 layers turboquant_4bit_nc costs "
    f"{bits('turboquant_4bit_nc', 128, 32):.4g} bits per value instead of {BITS['turboquant_4bit_nc']:.4g}"
)
print(
    f"turbo at head_dim 64 pads every head to 128 values: turbo3 {bits('turbo3', 64):.4g} bits per value "
    f"({bits('turbo3', 64) / BITS['turbo3']:.2f}x its {BITS['turbo3']:.4g}), turbo4 {bits('turbo4', 64):.4g}"
)

# %% [markdown]
# ## 2. Every cache as K and as V, synthetic and real
#
# llama.cpp's attention rotation: a quantized K cache stores `K @ H_128` (the
# orthonormal Sylvester Walsh–Hadamard matrix) and a quantized V cache
# `V @ H_64` in 64-value blocks (`tbq.hf.engine`); the study applies it around
# q8_0, q4_0 and iq4_nl (`+H` below). tbq4_0/tbq3_0 and turbo2/3/4 carry their
# own randomized Hadamard rotation, vLLM's keys their own Sylvester Hadamard
# rotation; vLLM's values and FP8 keys are stored as they are.
#
# Each side's bits per value is its format's (`tbq.budget`); a cache type
# costs the mean of its two sides. K is scored with V exact and the reverse;
# the attention output with both quantized is scored last.


# %%
class Rotated(study.Quantizer):
    """``fmt`` behind llama.cpp's attention rotation: ``x @ H_n`` in ``n``-value blocks, the format, ``@ H_n`` back."""

    def __init__(self, fmt, n):
        self.inner = study.CodecQuantizer(fmt)
        self.n = n
        self.name = f"{fmt}+H{n}"
        self.bits_per_value = self.inner.bits_per_value
        self.code_bits = self.inner.code_bits

    def roundtrip(self, x):
        x = np.asarray(x, np.float32)
        blocks = x.reshape(*x.shape[:-1], -1, self.n)
        y = self.inner(fwht(blocks).reshape(x.shape)).reshape(blocks.shape)
        return fwht(y).reshape(x.shape).astype(np.float32)


def side_quantizer(fmt, role):
    if fmt in ("q8_0", "q4_0", "iq4_nl"):
        return Rotated(fmt, 128 if role == "K" else 64)
    return study.CodecQuantizer(fmt)


def side_bits(fmt):
    return float(budget.format_bits(fmt, {"head_dim": HEAD_DIM})[1])


K_FORMATS = list(dict.fromkeys(k for k, _ in CACHE_TYPES.values()))
V_FORMATS = list(dict.fromkeys(v for _, v in CACHE_TYPES.values()))


def measure(keys, values, seed=1):
    """Per side: NMSE and attention metrics; per cache type: both sides together."""
    q = metrics.random_queries(N_QUERIES, HEAD_DIM, keys.shape[1], seed=seed)
    k_hat = {f: side_quantizer(f, "K")(keys) for f in K_FORMATS}
    v_hat = {f: side_quantizer(f, "V")(values) for f in V_FORMATS}
    side = {}
    for f in K_FORMATS:
        a = metrics.attention_error(q, keys, values, k_hat[f], None)
        side[("K", f)] = {"nmse": metrics.nmse(keys, k_hat[f])} | a
    for f in V_FORMATS:
        a = metrics.attention_error(q, keys, values, None, v_hat[f])
        side[("V", f)] = {"nmse": metrics.nmse(values, v_hat[f])} | a
    both = {ct: metrics.attention_error(q, keys, values, k_hat[k], v_hat[v]) for ct, (k, v) in CACHE_TYPES.items()}
    return side, both


def print_sides(side, title):
    print(title)
    print(
        f"  {'side':<4} {'format':<12} {'bits':>6} {'NMSE':>10} {'logit RMSE':>11} {'KL':>10} {'top-8':>6} {'out NMSE':>10}"
    )
    for (role, f), r in side.items():
        print(
            f"  {role:<4} {side_quantizer(f, role).name:<12} {side_bits(f):>6.4g} {r['nmse']:>10.3e} "
            f"{r['logit_rmse']:>11.4f} {r['kl_mean']:>10.3e} {r['topk_agreement']:>6.3f} {r['output_nmse']:>10.3e}"
        )


def print_both(both, title):
    print(title)
    print(f"  {'cache type':<20} {'bits':>6} {'KL':>10} {'top-8':>6} {'out NMSE':>10} {'out NMSE p90':>13}")
    for ct, r in sorted(both.items(), key=lambda kv: BITS[kv[0]]):
        print(
            f"  {ct:<20} {BITS[ct]:>6.4g} {r['kl_mean']:>10.3e} {r['topk_agreement']:>6.3f} "
            f"{r['output_nmse']:>10.3e} {r['output_nmse_p90']:>13.3e}"
        )


# %% [markdown]
# ### Synthetic K/V
#
# `tbq.synthetic.llm_like_kv`: keys with outlier channels, RoPE structure and
# an attention sink, heavy-tailed values; and Gaussian keys and values.

# %%
llm = synthetic.llm_like_kv(TOKENS, HEADS, HEAD_DIM, seed=0)
DATA = {
    "gaussian": (
        synthetic.gaussian(TOKENS, HEADS, HEAD_DIM, seed=2),
        synthetic.gaussian(TOKENS, HEADS, HEAD_DIM, seed=3),
    ),
    "llm-like": (llm["keys"], llm["values"]),
}
results = {}
for name, (k, v) in DATA.items():
    results[name] = measure(k, v)
    print_sides(results[name][0], f"{name}: each side alone (the other exact)")
    print_both(results[name][1], f"{name}: K and V both quantized, by bits per value")
    print()

# %% [markdown]
# ### Real K/V of the shipped model
#
# `tbq.hf.capture_kv` on held-out text: each layer's post-RoPE K and its V,
# all layers and KV heads side by side. The queries are random, as above.

# %%
from tbq.hf import capture_kv, evaluate, load
from tbq.hf.evaluation import text_tokens
from tbq.hf.shipped import heldout_text

CONTEXT, CHUNKS = (256, 2) if SMALL else (512, 4)
model, tokenizer = load()
tokens = text_tokens(tokenizer, heldout_text(), model.config.bos_token_id)
n_layers = model.config.num_hidden_layers
kv = capture_kv(model, tokens[:CONTEXT])
real_k = np.concatenate([kv[i]["k"] for i in sorted(kv)], axis=1)
real_v = np.concatenate([kv[i]["v"] for i in sorted(kv)], axis=1)
norms = np.linalg.norm(real_k.astype(np.float64), axis=-1)
print(
    f"real K/V: {real_k.shape[0]} tokens x {real_k.shape[1]} (layer, KV head) pairs x {real_k.shape[2]}; "
    f"key norms {norms.min():.3g} .. {norms.max():.3g} (median {np.median(norms):.3g}), "
    f"key RMS {np.sqrt(np.mean(real_k.astype(np.float64) ** 2)):.3g}, value RMS {np.sqrt(np.mean(real_v.astype(np.float64) ** 2)):.3g}"
)
DATA["real"] = (real_k, real_v)
results["real"] = measure(real_k, real_v)
print_sides(results["real"][0], "real: each side alone (the other exact)")
print_both(results["real"][1], "real: K and V both quantized, by bits per value")

# %% [markdown]
# The figures: each side's NMSE against its bits per value between the
# Shannon bound and the TurboQuant upper bound (`tbq.plots.plot_rate_distortion`),
# and per cache type the softmax KL of the key side and the output NMSE with
# both sides quantized.

# %%
rows = [
    {"dataset": f"{ds} {role}", "name": side_quantizer(f, role).name, "bits_per_value": side_bits(f), "nmse": r["nmse"]}
    for ds, (side, _) in results.items()
    if ds != "gaussian"
    for (role, f), r in side.items()
]
path = plots.plot_rate_distortion(
    rows, plots.figure_path("turbo_rate_distortion.png"), bits_range=(1.5, 9.0), title="NMSE per side"
)
display(Image(filename=str(path)))
path = plots.plot_bars(
    {
        f"{ds}: K only, softmax KL": {f: results[ds][0][("K", f)]["kl_mean"] for f in K_FORMATS}
        for ds in ("llm-like", "real")
    }
    | {
        f"{ds}: K and V, output NMSE": {
            ct: results[ds][1][ct]["output_nmse"] for ct in sorted(CACHE_TYPES, key=BITS.get)
        }
        for ds in ("llm-like", "real")
    },
    plots.figure_path("turbo_attention.png"),
    title="attention error (random queries)",
    ncols=2,
)
display(Image(filename=str(path)))

# %%
K4 = ["q4_0", "iq4_nl", "tbq4_0", "turbo4", "vllm_tq4_k"]
for ds in ("gaussian", "llm-like", "real"):
    side = results[ds][0]
    best = min(K4, key=lambda f: side[("K", f)]["nmse"])
    print(
        f"{ds}: 4-bit-class keys, NMSE "
        + ", ".join(f"{f} {side[('K', f)]['nmse']:.3e} ({side_bits(f):.4g} b)" for f in K4)
        + f"; lowest: {best}"
    )
    print(
        f"{ds}: 4-bit-class values, NMSE "
        + ", ".join(
            f"{f} {side[('V', f)]['nmse']:.3e} ({side_bits(f):.4g} b)"
            for f in ["q4_0", "iq4_nl", "tbq4_0", "turbo4", "vllm_tq4_v"]
        )
    )
    print(
        f"{ds}: 3-bit-class keys, NMSE "
        + ", ".join(f"{f} {side[('K', f)]['nmse']:.3e}" for f in ["tbq3_0", "turbo3", "vllm_tq3_k"])
        + f"; values tbq3_0 {side[('V', 'tbq3_0')]['nmse']:.3e}, turbo3 {side[('V', 'turbo3')]['nmse']:.3e}, "
        f"vllm_tq3_v {side[('V', 'vllm_tq3_v')]['nmse']:.3e}"
    )

# %% [markdown]
# ## 3. Model level: perplexity and KL against the f16 cache
#
# `tbq.hf.evaluate` on the shipped model. The llama.cpp types run under
# llama.cpp's engine (attention rotation; tbq4_0/tbq3_0 with the fitted
# tables). turbo2/3/4 run under the fork's engine (`llama.cpp-turbo`, `@turbo`)
# and the presets under vLLM's (`vllm`, `@vllm`) when this tbq has them
# (`tbq.hf.ENGINES`); otherwise under the `plain` engine, which stores the
# rows as the model computes them and is labelled `@plain`, never as the
# fork's or vLLM's. vLLM leaves the first and last two layers unquantized,
# which on this 4-layer model is every layer, so the presets' formats also run
# on every layer under `plain`: what vLLM does to a layer it quantizes. `K:f16`
# and `f16:V` put a format in one side only.

# %%
import tbq.hf as tbq_hf
from tbq.hf.evaluation import CacheType

HAVE_TURBO = "llama.cpp-turbo" in tbq_hf.ENGINES
HAVE_VLLM = "vllm" in tbq_hf.ENGINES
TURBO_ENGINE = "llama.cpp-turbo" if HAVE_TURBO else "plain"
print(f"engines in this tbq: {', '.join(tbq_hf.ENGINES)}")
print(f"turbo2/3/4 run under: {TURBO_ENGINE}; vLLM presets under vLLM's engine: {HAVE_VLLM}")


def lm(fmt):
    return tbq.get_codec(fmt, codebook="lloyd-max")


MODEL_TYPES = {
    "q8_0": CacheType("q8_0", "q8_0"),
    "q4_0": CacheType("q4_0", "q4_0"),
    "iq4_nl": CacheType("iq4_nl", "iq4_nl"),
    "tbq4_0": CacheType(lm("tbq4_0"), lm("tbq4_0")),
    "tbq3_0": CacheType(lm("tbq3_0"), lm("tbq3_0")),
    "tbq4_0@plain": CacheType(lm("tbq4_0"), lm("tbq4_0"), "plain"),
}
for t in ("turbo4", "turbo3", "turbo2"):
    MODEL_TYPES[f"{t}@{TURBO_ENGINE}"] = CacheType(t, t, TURBO_ENGINE)
MODEL_TYPES[f"q8_0:turbo3@{TURBO_ENGINE}"] = CacheType("q8_0", "turbo3", TURBO_ENGINE)
for ct in [c for c in CACHE_TYPES if c.startswith("turboquant")]:
    k, v = CACHE_TYPES[ct]
    if HAVE_VLLM:
        MODEL_TYPES[f"{ct}@vllm"] = CacheType(ct, ct, "vllm")
    MODEL_TYPES[f"{k}:{v}@plain (every layer)"] = CacheType(k, v, "plain")
ROLE_FORMATS = {
    "q4_0": "llama.cpp",
    "iq4_nl": "llama.cpp",
    "tbq4_0": "llama.cpp",
    "turbo4": TURBO_ENGINE,
    "turbo3": TURBO_ENGINE,
    "vllm_tq4_k": "plain",
    "vllm_tq3_k": "plain",
    "fp8_e4m3": "plain",
    "vllm_tq4_v": "plain",
    "vllm_tq3_v": "plain",
}
for f, eng in ROLE_FORMATS.items():
    side = lm(f) if f.startswith("tbq") else f
    if not f.endswith("_v"):
        MODEL_TYPES[f"K {f}@{eng}"] = CacheType(side, "f16", eng)
    if not (f.endswith("_k") or f.startswith("fp8")):
        MODEL_TYPES[f"V {f}@{eng}"] = CacheType("f16", side, eng)
# for section 4: turbo4's table against the same rotation with the Lloyd-Max table (tbq4_0, rows as computed),
# and vLLM's keys with PR #38479's random signs
MODEL_TYPES["K tbq4_0@plain"] = CacheType(lm("tbq4_0"), "f16", "plain")
MODEL_TYPES["V tbq4_0@plain"] = CacheType("f16", lm("tbq4_0"), "plain")
for f in ("vllm_tq4_k", "vllm_tq3_k"):
    MODEL_TYPES[f"K {f}(pr38479, layer 0)@plain"] = CacheType(
        tbq.get_codec(f, rotation="pr38479", layer=0), "f16", "plain"
    )
ratio_heads = model.config.num_attention_heads // model.config.num_key_value_heads
print(
    f"the fork's TURBO_AUTO_ASYMMETRIC (turbo K to q8_0 when n_head/n_head_kv >= 6): n_head/n_head_kv = {ratio_heads}, "
    f"{'applies' if ratio_heads >= 6 else 'does not apply'}; TURBO_LAYER_ADAPTIVE mode 7 (turbo2 V, >= 8 layers): "
    f"{n_layers} layers, {'applies' if n_layers >= 8 else 'does not apply'}"
)

res = evaluate(model, tokens, list(MODEL_TYPES.values()), context=CONTEXT, chunks=CHUNKS, model_name="shipped")
model_rows = dict(zip(MODEL_TYPES, res.rows[2:], strict=True))
f16_ppl = res.rows[1].ppl
print(f"f16 cache: PPL {f16_ppl:.3f} over {CHUNKS} chunks of {CONTEXT}")
print(f"{'cache type':<42} {'B/token':>8} {'PPL':>9} {'dPPL %':>8} {'KL':>10} {'top-1':>6}")
for label, r in model_rows.items():
    print(
        f"{label:<42} {r.bytes_per_token:>8} {r.ppl:>9.3f} {r.delta_ppl_pct:>+8.3f} {r.kl_mean:>10.3e} {r.top1:>6.3f}"
    )
for label, r in model_rows.items():
    if label.endswith("@vllm"):
        print(
            f"{label}: KL {r.kl_mean:.1e}, the f32 cache's ({res.rows[0].kl_mean:.1e}): vLLM's engine keeps all "
            f"{n_layers} layers of this model unquantized (not in the figure)"
        )

path = plots.plot_bars(
    {
        "K and V in the type": {
            lab: r.kl_mean for lab, r in model_rows.items() if not lab.startswith(("K ", "V ")) and r.kl_mean > 1e-7
        },
        "K only (V f16) and V only (K f16)": {
            lab: r.kl_mean for lab, r in model_rows.items() if lab.startswith(("K ", "V ")) and r.kl_mean > 1e-7
        },
    },
    plots.figure_path("turbo_model.png"),
    title="mean KL(f16 cache || type), shipped model",
    ncols=2,
)
display(Image(filename=str(path)))

# %% [markdown]
# ## 4. What each quirk costs, measured
#
# The quirk sections of the two SPECs (turbo's section 10, vLLM's section 9)
# list what the reference code does that a careful implementation would not.
# Each is measured here against the same scheme without it: the same
# rotation with another table, the same indices with exact midpoints, the
# same codes with a float32 zero point, and so on. Data: the Gaussian and
# llm-like keys above, and the real keys and values.

# %%
from tbq.formats.vllm_turboquant import vllm_centroids

quirks = []  # (SPEC item, what is measured, data, with the quirk, without it, unit)


def add(item, what, data, with_quirk, without, unit="NMSE"):
    quirks.append((item, what, data, with_quirk, without, unit))


def rotated(fmt, x, **opts):
    """The format's unit-norm rotated coordinates and block norms, from its own encoder trace (float64)."""
    fm = tbq.get_format(fmt, **opts)
    _, trace = fm.encode(np.asarray(x, np.float32), trace=True)
    norm, r = fm.quantizer.rotated_view(trace)
    n = fm.info.block_size
    return np.asarray(r, np.float64).reshape(-1, n), np.asarray(norm, np.float64).reshape(-1)


def nmse_from_indices(r, norm, c, idx):
    """NMSE of the corrected-norm reconstruction ``norm * c[idx] / |c[idx]|`` in the rotated domain."""
    q = c[idx]
    est = q / np.sqrt(np.sum(q * q, axis=1, keepdims=True))
    return float(np.sum(np.sum((r - est) ** 2, axis=1) * norm**2) / np.sum(norm**2))


KEYS = {"gaussian": DATA["gaussian"][0], "llm-like keys": DATA["llm-like"][0], "real keys": real_k}
VALUES = {"heavy-tailed values": DATA["llm-like"][1], "real values": real_v}

# turbo, Q4: turbo4's 4-bit table is not Lloyd-Max (same rotation, TBQ's Lloyd-Max table instead)
for ds, x in (KEYS | VALUES).items():
    add(
        "turbo Q4",
        "turbo4 table vs 4-bit Lloyd-Max, same rotation",
        ds,
        study.rotated_nmse("turbo4", x),
        study.rotated_nmse("turbo4", x, lloyd_max(4).centroids),
    )

# turbo, Q5: the 6-digit literal thresholds vs the exact midpoints of the same centroids
for t, b in (("turbo2", 2), ("turbo3", 3), ("turbo4", 4)):
    c = TABLES[f"centroids_{b}bit"].astype(np.float64)
    mid = 0.5 * (c[1:] + c[:-1])
    for ds, x in KEYS.items():
        r, norm = rotated(t, x)
        lit = turbo_index(r.astype(np.float32), TABLES[f"thresholds_{b}bit"]).astype(np.intp)
        exact = np.searchsorted(mid, r, side="right")
        changed = float(np.mean(lit != exact))
        add(
            "turbo Q5",
            f"{t}: 6-digit thresholds vs exact midpoints (indices changed: {changed:.2e})",
            ds,
            nmse_from_indices(r, norm, c, lit),
            nmse_from_indices(r, norm, c, exact),
        )

# turbo, Q5: turbo4's CPU vs CUDA thresholds (the option thresholds="cuda")
for ds, x in KEYS.items():
    a = tbq.get_codec("turbo4").encode(np.asarray(x, np.float32))
    b_ = tbq.get_codec("turbo4", thresholds="cuda").encode(np.asarray(x, np.float32))
    blocks = float(np.mean(np.any(a.reshape(-1, 68) != b_.reshape(-1, 68), axis=1)))
    add(
        "turbo Q5",
        f"turbo4 CPU vs CUDA thresholds (blocks that differ: {blocks:.2e})",
        ds,
        metrics.nmse(x, study.CodecQuantizer("turbo4")(x)),
        metrics.nmse(x, study.CodecQuantizer("turbo4", thresholds="cuda")(x)),
    )

# turbo, Q1: the decoder's output taken as K (the rotated domain, not the input's)
for ds, x in KEYS.items():
    codec = tbq.get_codec("turbo3")
    y = codec.decode(codec.encode(np.asarray(x, np.float32)))
    add(
        "turbo Q1",
        "turbo3 decode() read as if it were x vs rotated back",
        ds,
        metrics.nmse(x, y),
        metrics.nmse(x, codec.format.domain.from_decode_domain(y)),
    )

# vLLM 1: no random signs (vLLM main) vs PR #38479's per-layer signs, on structured and real keys
rng = np.random.default_rng(7)
n_struct = 64 if SMALL else 512
eye = np.eye(HEAD_DIM, dtype=np.float32)
pos = rng.integers(0, HEAD_DIM, size=(n_struct, 2))
pos[:, 1] = (pos[:, 0] + 1 + rng.integers(0, HEAD_DIM - 1, size=n_struct)) % HEAD_DIM
scale = rng.uniform(0.5, 4.0, size=(n_struct, 1)).astype(np.float32)
STRUCT = {
    "constant keys": np.ones((n_struct, HEAD_DIM), np.float32) * scale,
    "one-hot keys": eye[pos[:, 0]] * scale,
    "two-hot keys": (eye[pos[:, 0]] + eye[pos[:, 1]]) * scale,
}
for fmt in ("vllm_tq4_k", "vllm_tq3_k"):
    for ds, x in (STRUCT | {"llm-like keys": KEYS["llm-like keys"]}).items():
        add(
            "vLLM 1",
            f"{fmt}: no random signs vs PR #38479's signs",
            ds,
            metrics.nmse(x, study.CodecQuantizer(fmt)(x)),
            metrics.nmse(x, study.CodecQuantizer(fmt, rotation="pr38479", layer=0)(x)),
        )
    err = {"hadamard": 0.0, "pr38479": 0.0}
    for i in sorted(kv):
        k64 = kv[i]["k"].astype(np.float64)
        for rot in err:
            opts = {"rotation": rot, "layer": i} if rot == "pr38479" else {}
            err[rot] += float(np.sum((k64 - study.CodecQuantizer(fmt, **opts)(kv[i]["k"])) ** 2))
    energy = sum(float(np.sum(kv[i]["k"].astype(np.float64) ** 2)) for i in kv)
    add(
        "vLLM 1",
        f"{fmt}: no random signs vs PR #38479's signs (each layer's own)",
        "real keys",
        err["hadamard"] / energy,
        err["pr38479"] / energy,
    )

# the same two at model level (section 3's runs): KL of the K-only and V-only caches
for role in ("K", "V"):
    add(
        "turbo Q4",
        "turbo4 table vs 4-bit Lloyd-Max, same rotation: model KL",
        f"shipped model, {role} only",
        model_rows[f"{role} turbo4@{TURBO_ENGINE}"].kl_mean,
        model_rows[f"{role} tbq4_0@plain"].kl_mean,
        "KL",
    )
for f in ("vllm_tq4_k", "vllm_tq3_k"):
    add(
        "vLLM 1",
        f"{f}: no random signs vs PR #38479's signs: model KL",
        "shipped model, K only",
        model_rows[f"K {f}@plain"].kl_mean,
        model_rows[f"K {f}(pr38479, layer 0)@plain"].kl_mean,
        "KL",
    )

# vLLM 2: the 4-bit table is the solver's 200th iterate, not converged (same rotation, converged Lloyd-Max table)
c_vllm = vllm_centroids(4, HEAD_DIM)[0].astype(np.float64)
c_lm = np.asarray(lloyd_max(4, 1 / np.sqrt(HEAD_DIM)).centroids, np.float64)
print(f"vLLM's 4-bit table vs converged Lloyd-Max: largest relative difference {np.max(np.abs(c_vllm / c_lm - 1)):.3e}")
for ds, x in KEYS.items():
    add(
        "vLLM 2",
        "vllm_tq4_k table vs converged 4-bit Lloyd-Max",
        ds,
        study.rotated_nmse("vllm_tq4_k", x),
        study.rotated_nmse("vllm_tq4_k", x, c_lm),
    )

# vLLM 3: float32 midpoints vs the solver's float64 boundaries
for b in (3, 4):
    c64 = trapezoid_lloyd_max(b, HEAD_DIM)[0]
    m32 = vllm_centroids(b, HEAD_DIM)[1].astype(np.float64)
    m64 = 0.5 * (c64[1:] + c64[:-1])
    for ds, x in KEYS.items():
        r, norm = rotated(f"vllm_tq{b}_k", x)
        i32, i64 = np.searchsorted(m32, r, side="right"), np.searchsorted(m64, r, side="right")
        cf = vllm_centroids(b, HEAD_DIM)[0].astype(np.float64)
        add(
            "vLLM 3",
            f"vllm_tq{b}_k float32 midpoints vs float64 (indices changed: {np.mean(i32 != i64):.2e})",
            ds,
            nmse_from_indices(r, norm, cf, i32),
            nmse_from_indices(r, norm, cf, i64),
        )

# vLLM 4: the fp16 zero point (codes computed against the float32 minimum)
OFFSET = {"heavy-tailed values": VALUES["heavy-tailed values"], "real values": real_v}
for off in (100.0, 1000.0):
    OFFSET[f"heavy-tailed values + {off:g}"] = VALUES["heavy-tailed values"] + np.float32(off)
for fmt in ("vllm_tq4_v", "vllm_tq3_v"):
    for ds, x in OFFSET.items():
        fm = tbq.get_format(fmt)
        blocks = np.asarray(x, np.float32).reshape(-1, HEAD_DIM)
        f = fm.fields(fm.encode(blocks))
        exact_zero = f["qs"].reshape(blocks.shape).astype(np.float32) * f["d"].reshape(-1, 1) + blocks.min(
            axis=1, keepdims=True
        )
        centred = np.asarray(x, np.float64) - np.asarray(x, np.float64).mean()
        denom = float(np.sum(centred**2))  # the error relative to the values' spread, not their offset
        err_q = float(np.sum((blocks.astype(np.float64) - study.CodecQuantizer(fmt)(blocks).astype(np.float64)) ** 2))
        err_e = float(np.sum((blocks.astype(np.float64) - exact_zero.astype(np.float64)) ** 2))
        add("vLLM 4", f"{fmt}: fp16 zero point vs float32 (error / centred energy)", ds, err_q / denom, err_e / denom)

# vLLM 5: FP8 keys without a scale, on keys of small magnitude (k8v4), vs a per-tensor scale amax/448
q_small = metrics.random_queries(N_QUERIES, HEAD_DIM, real_k.shape[1], seed=5)
for s in (1.0, 0.1, 0.01):
    x = (real_k * np.float32(s)).astype(np.float32)
    sc = float(np.max(np.abs(x))) / 448.0
    y0, y1 = study.CodecQuantizer("fp8_e4m3")(x), study.CodecQuantizer("fp8_e4m3", scale=sc)(x)
    add(
        "vLLM 5",
        "fp8_e4m3 keys, scale 1 vs per-tensor amax/448",
        f"real keys x {s:g}",
        metrics.nmse(x, y0),
        metrics.nmse(x, y1),
    )
    add(
        "vLLM 5",
        "  the same, softmax KL (queries scaled by 1/s)",
        f"real keys x {s:g}",
        metrics.attention_error(q_small / s, x, None, y0)["kl_mean"],
        metrics.attention_error(q_small / s, x, None, y1)["kl_mean"],
        "KL",
    )

# vLLM 7: norm + 1e-8 in the denominator: the indices of a tiny key against those of the same key at norm 1
# (vLLM's decoder renormalises the centroids, so the epsilon acts through the indices only); then the whole
# round trip at that norm, where the fp16 norm and fp16 outputs become subnormal as well
g = DATA["gaussian"][0][:64]
unit = (g / np.linalg.norm(g, axis=-1, keepdims=True)).astype(np.float32)
fm_k = tbq.get_format("vllm_tq4_k")
idx_unit = fm_k.fields(fm_k.encode(unit))["idx"]
ref = metrics.nmse(unit, study.CodecQuantizer("vllm_tq4_k")(unit))
for n in (1e-4, 1e-5, 1e-6, 1e-7):
    x = (unit * np.float32(n)).astype(np.float32)
    moved = float(np.mean(fm_k.fields(fm_k.encode(x))["idx"] != idx_unit))
    add(
        "vLLM 7",
        f"vllm_tq4_k at key norm n vs norm 1 (indices moved by the epsilon: {moved:.2e})",
        f"gaussian, norm {n:g}",
        metrics.nmse(x, study.CodecQuantizer("vllm_tq4_k")(x)),
        ref,
    )
print(f"smallest real key norm: {norms.min():.3g}")

# bytes: turbo4's rnorm (always 0), turbo's head padding, vLLM's boundary layers (tbq.budget, bits per value)
add(
    "turbo rnorm",
    "turbo4 with its 2-byte rnorm vs without (tbq4_0's size)",
    "any",
    BITS["turbo4"],
    BITS["tbq4_0"],
    "bits",
)
add("turbo pad", "turbo3 at head_dim 64: padded to 128 vs unpadded", "any", bits("turbo3", 64), BITS["turbo3"], "bits")
add(
    "vLLM skip",
    "turboquant_4bit_nc on 32 layers: 4 at 16 bits vs all quantized",
    "any",
    bits("turboquant_4bit_nc", 128, 32),
    BITS["turboquant_4bit_nc"],
    "bits",
)

print(f"{'item':<11} {'what':<78} {'data':<30} {'unit':<5} {'with':>10} {'without':>10} {'ratio':>8}")
for item, what, ds, a, b_, unit in quirks:
    ratio = a / b_ if b_ > 0 else float("inf")
    print(f"{item:<11} {what:<78} {ds:<30} {unit:<5} {a:>10.4g} {b_:>10.4g} {ratio:>8.3f}")

# %% [markdown]
# The figure shows the ratio "with the quirk / without it" of each row
# (log scale; 1 is no cost).

# %%
worst = {}
for item, what, ds, a, b_, unit in quirks:
    if b_ > 0 and unit != "KL":
        key = f"{item}: {what.split(':')[0].split(' vs ')[0][:28]}"
        if a / b_ >= worst.get(key, (0.0, ""))[0]:
            worst[key] = (a / b_, ds)
for key, (ratio, ds) in worst.items():
    print(f"largest cost of {key:<44} {ratio:8.3f}x  ({ds})")
bars = {
    "vector error (largest ratio over the data sets)": {
        k: r for k, (r, _) in worst.items() if "rnorm" not in k and "pad" not in k and "skip" not in k
    },
    "bits per value": {k: r for k, (r, _) in worst.items() if "rnorm" in k or "pad" in k or "skip" in k},
}
path = plots.plot_bars(bars, plots.figure_path("turbo_quirks.png"), title="cost of each quirk: with / without", ncols=2)
display(Image(filename=str(path)))
