"""tbq.study: comparison quantizers and cache policies; tbq.plots; tbq compare's attention columns and --plot."""

import math
from pathlib import Path

import numpy as np
import pytest

import tbq
from tbq import cli, metrics, study, synthetic
from tbq.errors import ConfigError, TbqValueError


def test_every_study_quantizer_says_it_is_not_a_byte_format():
    for cls in (study.KIVI, study.LloydMaxNoRotation, study.RotatedLloydMax, study.Quantizer):
        assert "not a byte format" in " ".join(cls.__doc__.split()).lower()
    assert "nothing in this module is a byte format" in " ".join(study.__doc__.split()).lower()


# ---------------------------------------------------------------- KIVI


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("axis", ["channel", "token"])
def test_kivi_error_is_at_most_half_a_step(bits, axis):
    x = synthetic.keys_with_outliers(70, 3, seed=bits)  # 70 tokens: a partial last group per channel
    q = study.KIVI(bits, group_size=32, axis=axis)
    codes, scale, zero = q.quantize(x)
    assert codes.max() <= 2**bits - 1
    assert scale.dtype == np.float16 and zero.dtype == np.float16
    y = q.roundtrip(x)
    assert y.shape == x.shape and y.dtype == np.float32
    step = q.step(x)
    err = np.abs(y.astype(np.float64) - x)
    assert np.all(err <= step / 2 * (1 + 1e-6) + 1e-6 * np.abs(x))
    # and the bound is nearly reached: the grid is not finer than claimed
    assert np.max(err / step) > 0.45
    # the extremes of each group are representable: min and max codes are used
    assert codes.min() == 0 and codes.max() == 2**bits - 1


def test_kivi_groups_run_along_the_documented_axis():
    x = np.zeros((64, 1, 64), np.float32)
    x[:, 0, 5] = np.linspace(0, 100, 64)  # one big channel
    x[:, 0, 6] = np.linspace(0, 1, 64)  # a small channel next to it
    # per channel: channel 6 gets its own small step
    ych = study.KIVI(2, 32, "channel")(x)
    assert np.max(np.abs(ych[:, 0, 6] - x[:, 0, 6])) < 0.5 / 3 / 2 * 1.01 + 1e-3
    # per token: channel 6 shares its group (channels 0..31) with channel 5 and is lost
    ytok = study.KIVI(2, 32, "token")(x)
    assert np.max(np.abs(ytok[:, 0, 6] - x[:, 0, 6])) > 0.4
    with pytest.raises(TbqValueError):
        study.KIVI(2, 48, "token")(x)  # 64 channels are not a multiple of 48


def test_kivi_per_channel_beats_per_token_on_outlier_keys():
    k = synthetic.keys_with_outliers(128, 2, seed=0)
    e_ch = metrics.nmse(k, study.KIVI(3, 32, "channel")(k))
    e_tok = metrics.nmse(k, study.KIVI(3, 32, "token")(k))
    assert e_ch < 0.6 * e_tok


def test_kivi_bits_and_names():
    q = study.KIVI(2, 32)
    assert q.bits_per_value == 3.0 and q.code_bits == 2 and q.name == "kivi2-g32-channel"
    assert study.KIVI(4, 128, "token", param_dtype=np.float32).bits_per_value == 4.5
    with pytest.raises(ConfigError):
        study.KIVI(0)
    with pytest.raises(ConfigError):
        study.KIVI(2, axis="head")


def test_kivi_constant_group_is_exact():
    x = np.full((32, 1, 32), 0.75, np.float32)
    assert np.array_equal(study.KIVI(2, 32)(x), x)


# ---------------------------------------------------------------- Lloyd-Max with and without rotation


def test_lloyd_max_without_rotation_on_gaussian_data_is_near_the_gaussian_distortion():
    x = synthetic.gaussian(512, 4, seed=1)
    for b in (3, 4):
        e = metrics.nmse(x, study.LloydMaxNoRotation(b)(x))
        assert e == pytest.approx(metrics.lloyd_max_distortion(b), rel=0.06)


def test_rotation_reduces_peak_to_rms_and_error_on_outlier_blocks():
    k = synthetic.keys_with_outliers(64, 2, seed=2)
    rot = tbq.get_codec("tbq4_0").rotation
    u = k.reshape(-1, 128) / np.linalg.norm(k.reshape(-1, 128), axis=1, keepdims=True)
    before = metrics.peak_to_rms(u)
    after = metrics.peak_to_rms(rot.forward(u))
    assert np.all(after < 0.5 * before)
    for b, fmt in ((4, "tbq4_0"), (3, "tbq3_0")):
        e_no = metrics.nmse(k, study.LloydMaxNoRotation(b)(k))
        e_rot = metrics.nmse(k, study.get_quantizer(fmt)(k))
        assert e_rot < e_no / 5


def test_rotated_lloyd_max_matches_the_tbq_codec():
    x = synthetic.keys_with_outliers(32, 2, seed=3)
    for b in (3, 4):
        y_study = study.RotatedLloydMax(b, signs="turboq-mtp")(x)
        y_codec = study.get_quantizer(f"tbq{b}_0")(x)
        # same algorithm, different float32 operation order: nearly always the same index
        assert metrics.nmse(y_codec, y_study) < 1e-3 * metrics.nmse(x, y_codec)
    assert study.RotatedLloydMax(6).bits_per_value == 6.125
    e6 = metrics.nmse(x, study.RotatedLloydMax(6)(x))
    assert e6 < metrics.nmse(x, study.RotatedLloydMax(5)(x))


def test_indices_of_block_quantizers():
    x = synthetic.gaussian(16, 1, seed=4)
    q = study.LloydMaxNoRotation(3)
    idx = q.indices(x)
    assert idx.shape == x.shape and idx.max() <= 7
    assert metrics.entropy_bits(idx) > 2.5


# ---------------------------------------------------------------- codecs and factory


def test_codec_quantizer_is_the_real_format():
    x = synthetic.gaussian(8, 2, seed=5)
    q = study.get_quantizer("tbq3_0:turboq-mtp", signs=11)
    assert q.name == "tbq3_0:turboq-mtp:signs=11" and q.bits_per_value == 3.125 and q.code_bits == 3
    c = tbq.get_codec("tbq3_0", codebook="turboq-mtp", signs=11)
    assert np.array_equal(q(x), c.decode(c.encode(x)))
    assert study.get_quantizer("q8_0").name == "q8_0"


def test_get_quantizer_names():
    assert study.get_quantizer("kivi3", role="key").axis == "channel"
    assert study.get_quantizer("kivi3", role="value").axis == "token"
    assert study.get_quantizer("kivi3-g64-token", role="key").group_size == 64
    assert isinstance(study.get_quantizer("lm4"), study.LloydMaxNoRotation)
    assert isinstance(study.get_quantizer("rlm2", signs=3), study.RotatedLloydMax)
    assert study.get_quantizer("f16").bits_per_value == 16
    x = np.float32([1.0, 1e-4, 3.14159])
    assert np.array_equal(study.get_quantizer("f16")(x), x.astype(np.float16).astype(np.float32))
    assert np.array_equal(study.get_quantizer("f32")(x), x)
    for bad in ("kivi", "tbq5_0", "lm4:turboq-mtp", 3):
        with pytest.raises(ConfigError):
            study.get_quantizer(bad)


# ---------------------------------------------------------------- cache policies


def test_cache_policy_keeps_sinks_in_higher_precision():
    kv = synthetic.llm_like_kv(64, 2, seed=0)
    k, v = kv["keys"], kv["values"]
    p = study.CachePolicy("tbq3_0", "tbq4_0", n_sink=2, sink="f16")
    kh, vh = p.apply(k, v)
    assert np.array_equal(kh[:2], k[:2].astype(np.float16).astype(np.float32))
    assert np.array_equal(vh[:2], v[:2].astype(np.float16).astype(np.float32))
    t3, t4 = study.get_quantizer("tbq3_0"), study.get_quantizer("tbq4_0")
    assert np.array_equal(kh[2:], t3(k[2:]))
    assert np.array_equal(vh[2:], t4(v[2:]))
    q8 = study.CachePolicy("tbq3_0", "tbq3_0", n_sink=1, sink="q8_0").apply_keys(k)
    assert np.array_equal(q8[:1], study.get_quantizer("q8_0")(k[:1]))


def test_cache_policy_bits_and_sink_benefit():
    p = study.CachePolicy("tbq3_0", "tbq3_0", n_sink=4, sink="q8_0")
    assert p.bits_per_value(1000) == pytest.approx((4 * 8.5 + 996 * 3.125) / 1000)
    assert study.CachePolicy("kivi2", "kivi2").v.axis == "token"
    assert "sink" in p.label
    # on data with a sink token, protecting it lowers the softmax KL
    kv = synthetic.llm_like_kv(256, 2, seed=1)
    q = metrics.random_queries(16, 128, 2, seed=2)
    kl = {}
    for n in (0, 1):
        kh = study.CachePolicy("tbq3_0", "f32", n_sink=n).apply_keys(kv["keys"])
        kl[n] = metrics.attention_error(q, kv["keys"], None, kh)["kl_mean"]
    assert kl[1] < 0.7 * kl[0]
    with pytest.raises(ConfigError):
        study.CachePolicy(n_sink=-1)


# ---------------------------------------------------------------- plots and tbq compare


def test_compare_attention_columns():
    from tbq.compare import compare

    rows = compare(synthetic.builtin_kv(tokens=64, heads=2), ["q8_0", "tbq3_0"], repeat=1, n_queries=8)
    by = {(r["data"], r["format"]): r for r in rows}
    k8, k3 = by["keys", "q8_0"], by["keys", "tbq3_0"]
    assert 0 < k8["softmax KL"] < k3["softmax KL"]
    assert 0 < k8["logit rmse"] < k3["logit rmse"]
    assert 0 <= k3["top-k"] <= k8["top-k"] <= 1
    assert by["values", "tbq3_0"]["softmax KL"] is None  # values do not enter the logits
    assert 0 < by["values", "q8_0"]["out NMSE"] < by["values", "tbq3_0"]["out NMSE"]
    rows = compare({"x": synthetic.gaussian(8, 1)}, ["q4_0"], repeat=1, attention=False)
    assert rows[0]["softmax KL"] is None


def test_compare_cli_attention_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "sub" / "cmp.png"
    f = tmp_path / "k.npy"
    np.save(f, synthetic.keys_with_outliers(32, 2, seed=0))
    assert (
        cli.main(["compare", str(f), "--formats", "q4_0,tbq4_0", "--repeat", "1", "--topk", "4", "--plot", str(png)])
        == 0
    )
    out = capsys.readouterr().out
    assert "softmax KL" in out and "top-4" in out and "figure saved" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _drawn(fig):
    """What a figure shows, per visible axes: title, labels, scales, named lines, bar/patch count."""
    out = []
    for ax in fig.axes:
        if ax.get_visible():
            lines = [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")]
            out.append(
                (
                    ax.get_title(),
                    ax.get_xlabel(),
                    ax.get_ylabel(),
                    ax.get_xscale(),
                    ax.get_yscale(),
                    lines,
                    len(ax.patches),
                )
            )
    return out


def test_plots_write_pngs(tmp_path, monkeypatch):
    """Every plot writes a PNG, and draws what it is given: panels, series, labels and the data itself."""
    pytest.importorskip("matplotlib")
    from tbq import plots

    figs = {}
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.setdefault(Path(path).name, fig) and save(fig, path))
    cb = {
        "a": study.get_quantizer("tbq3_0").codec.codebook,
        "b": study.get_quantizer("tbq3_0:turboq-mtp").codec.codebook,
    }
    paths = [
        plots.plot_rate_distortion(
            [
                {"dataset": "g", "name": "tbq4_0", "bits_per_value": 4.125, "nmse": 0.0095},
                {"dataset": "g", "name": "rlm3", "family": "rlm", "bits_per_value": 3.125, "nmse": 0.034},
                {"dataset": "g", "name": "rlm4", "family": "rlm", "bits_per_value": 4.125, "nmse": 0.0095},
            ],
            tmp_path / "rd.png",
        ),
        plots.plot_rotation_block(np.arange(128.0), np.ones(128), tmp_path / "rot.png", peak_rms={"x": [1.0, 2.0]}),
        plots.plot_lines([1, 2, 4], {"p": {"a": [1, 2, 3]}, "q": {"a": [3, 2, 1]}}, tmp_path / "lines.png", logx=True),
        plots.plot_bars({"p": {"a": 1.0, "b": 2.0}}, tmp_path / "bars.png", hline={"p": (1.5, "ref")}),
        plots.plot_codebooks({"3 bits": cb}, tmp_path / "cb.png", sigma=0.088),
        plots.plot_index_histograms({"h": {"a": [1, 2, 3], "b": [3, 2, 1]}}, tmp_path / "h.png"),
        plots.plot_format_metrics(
            [
                {"dataset": d, "name": n, "bits_per_value": b, "nmse": e, "kl_mean": e / 2}
                for d in ("g", "o")
                for n, b, e in (("q4_0", 4.5, 0.007), ("tbq4_0", 4.125, 0.009), ("f16", 16.0, 4e-8))
            ],
            tmp_path / "fm.png",
            metrics={"nmse": "NMSE", "kl_mean": "KL"},
            groups={"q4_0": "grid", "tbq4_0": "rotation"},
        ),
        plots.plot_rotated_blocks(
            {"a": np.arange(128.0), "b": np.ones(128)},
            tmp_path / "rb.png",
            mark=[4, 5],
            distributions={"d": {"x": [1.0, 2.0]}},
        ),
        plots.plot_value_tables(
            {"t": {"samples": np.linspace(-1, 1, 100), "tables": {"a": [-0.5, 0.5], "b": [-0.6, 0.6]}}},
            tmp_path / "vt.png",
        ),
    ]
    for p in paths:
        assert p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG"
    assert set(figs) == {p.name for p in paths}
    bounds = ["Shannon lower bound $4^{-b}$", "upper bound $(\\sqrt{3}\\pi/2)\\,4^{-b}$", "Gaussian Lloyd-Max"]
    assert _drawn(figs["rd.png"])[:2] == [
        ("g", "", "NMSE", "linear", "log", bounds + ["rlm", "tbq4_0"], 0),
        (
            "",
            "bits per value (storage, including scales)",
            "NMSE / 4^-b",
            "linear",
            "log",
            bounds + ["rlm", "tbq4_0"],
            0,
        ),
    ]
    rlm = next(ln for ln in figs["rd.png"].axes[0].get_lines() if ln.get_label() == "rlm")
    assert list(rlm.get_xdata()) == [3.125, 4.125] and list(rlm.get_ydata()) == [0.034, 0.0095]
    assert _drawn(figs["lines.png"]) == [("p", "", "", "log", "log", ["a"], 0), ("q", "", "", "log", "log", ["a"], 0)]
    assert [list(ax.get_lines()[0].get_ydata()) for ax in figs["lines.png"].axes[:2]] == [[1, 2, 3], [3, 2, 1]]
    bars = figs["bars.png"].axes[0]
    assert [b.get_height() for b in bars.patches] == [1.0, 2.0] and list(bars.get_lines()[0].get_ydata()) == [1.5, 1.5]
    assert _drawn(figs["bars.png"]) == [("p", "", "", "linear", "log", ["ref"], 2)]
    assert [t[:3] for t in _drawn(figs["rot.png"])] == [
        ("one block, per coordinate", "channel", "value / block RMS"),
        ("histogram of the block", "value / block RMS", ""),
        ("peak-to-RMS over all blocks", "max|x| / RMS per block", "blocks"),
    ]
    assert _drawn(figs["rot.png"])[0][5] == ["before", "after rotation"]
    assert [t[0] for t in _drawn(figs["fm.png"])] == ["g", "o", "", ""]
    assert all(t[5] == ["q4_0 (grid)", "tbq4_0 (rotation)", "f16"] for t in _drawn(figs["fm.png"]))
    assert _drawn(figs["h.png"]) == [("h", "index", "fraction of coordinates", "linear", "linear", [], 6)]
    assert [t[0] for t in _drawn(figs["cb.png"])] == ["3 bits"] and len(figs["cb.png"].axes[0].collections) == 5
    assert [t[0] for t in _drawn(figs["rb.png"])] == ["a", "b", "d"]
    assert [t[0] for t in _drawn(figs["vt.png"])] == ["t"] and len(figs["vt.png"].axes[0].collections) == 2


def test_plots_module_does_not_import_matplotlib():
    import subprocess
    import sys

    code = "import sys, tbq.plots, tbq.compare, tbq.study; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_small_mode_and_figure_path(monkeypatch, tmp_path):
    from tbq import plots

    monkeypatch.setenv("TBQ_NOTEBOOK_SMALL", "0")
    assert not plots.small_mode()
    monkeypatch.setenv("TBQ_NOTEBOOK_SMALL", "1")
    assert plots.small_mode()
    monkeypatch.setenv("TBQ_FIGURE_DIR", str(tmp_path / "figs"))
    assert plots.figure_path("a.png") == tmp_path / "figs" / "a.png"
    assert (tmp_path / "figs").is_dir()


# ---------------------------------------------------------------- rate-distortion rows, tables, rotated NMSE


def test_rate_distortion_rows_cover_every_format_and_match_direct_computation():
    x = synthetic.keys_with_outliers(64, 2, seed=6)
    rows = study.rate_distortion_rows({"k": x}, n_queries=4, topk=4, seed=9)
    assert [r["name"] for r in rows] == list(tbq.formats.cache_formats())  # the default: cache types (not q8_1, q8_k)
    q = metrics.random_queries(4, 128, 2, seed=9).astype(np.float64)  # the seeded queries (data, not a metric)
    x64 = x.astype(np.float64)
    za = np.einsum("qhd,thd->hqt", q, x64) / math.sqrt(128)  # exact logits, (head, query, token)
    for r in rows:  # every metric recomputed here from its definition, not with tbq.metrics
        c = tbq.get_codec(r["name"])
        y = c.format.domain.from_decode_domain(c.decode(c.encode(x))).astype(np.float64)  # turbo decodes rotated
        assert r["bits_per_value"] == tbq.format_info(r["name"]).bits_per_value
        nmse = float(np.sum((y - x64) ** 2) / np.sum(x64**2))
        assert r["nmse"] == pytest.approx(nmse, rel=1e-12) and r["snr_db"] == pytest.approx(
            -10 * math.log10(nmse), rel=1e-12
        )
        zb = np.einsum("qhd,thd->hqt", q, y) / math.sqrt(128)
        la = za - za.max(-1, keepdims=True)
        la -= np.log(np.exp(la).sum(-1, keepdims=True))
        lb = zb - zb.max(-1, keepdims=True)
        lb -= np.log(np.exp(lb).sum(-1, keepdims=True))
        kl = np.maximum(np.sum(np.exp(la) * (la - lb), axis=-1), 0.0)
        top = [
            len(set(np.argsort(-za[h, i], kind="stable")[:4]) & set(np.argsort(-zb[h, i], kind="stable")[:4])) / 4
            for h in range(2)
            for i in range(4)
        ]
        assert r["logit_rmse"] == pytest.approx(math.sqrt(np.mean((zb - za) ** 2)), rel=1e-9, abs=1e-15)
        assert r["kl_mean"] == pytest.approx(float(kl.mean()), rel=1e-6, abs=1e-15)
        assert r["topk_agreement"] == pytest.approx(float(np.mean(top)), abs=1e-12)
    by = {r["name"]: r for r in rows}
    # round to nearest: relative error <= 2^-11 (f16) and 2^-8 (bf16) per value, so NMSE <= their squares
    assert by["f16"]["nmse"] <= 2.0**-22 and by["bf16"]["nmse"] <= 2.0**-16
    # a quantizer spec is a row too, charged its own bits
    r = study.rate_distortion_rows({"k": x}, ["kivi3-g32-channel"], n_queries=2)[0]
    assert r["name"] == "kivi3-g32-channel" and r["bits_per_value"] == 4.0 and r["code_bits"] == 3
    with pytest.raises(TbqValueError):
        study.rate_distortion_rows({"flat": x.reshape(-1)}, ["q8_0"])


def test_table_levels_are_the_spec_tables():
    from importlib import import_module

    iq4 = import_module("tbq.formats.iq4_nl")
    fp4 = import_module("tbq.formats.fp4")
    assert np.array_equal(study.table_levels("q4_0"), np.arange(-8, 8))
    assert np.array_equal(study.table_levels("q5_0"), np.arange(-16, 16))
    assert np.array_equal(study.table_levels("q8_0"), np.arange(-128, 128))
    assert np.array_equal(study.table_levels("q4_1"), np.arange(16))
    assert np.array_equal(study.table_levels("q5_1"), np.arange(32))
    assert np.array_equal(study.table_levels("iq4_nl"), iq4.IQ4_NL_VALUES)
    for f in ("mxfp4", "nvfp4"):
        assert np.array_equal(study.table_levels(f), np.sort(fp4.E2M1_VALUES))
    for f in ("tbq4_0", "tbq3_0", "planar4_0", "planar3_0", "iso4_0", "iso3_0"):
        assert np.array_equal(study.table_levels(f), tbq.get_format(f).tables()["centroids"])
    fork = tbq.get_format("tbq3_0", codebook="turboq-mtp").tables()["centroids"]
    assert np.array_equal(study.table_levels("tbq3_0", codebook="turboq-mtp"), fork)
    for f in ("f16", "bf16"):
        with pytest.raises(ConfigError):
            study.table_levels(f)


@pytest.mark.parametrize("head_dim", [64, 256])
def test_the_study_reads_a_format_instances_own_sizes(head_dim):
    """vLLM's TurboQuant block is one head (``head_dim``, a format option; the registry's row is 128's): the study
    charges the instance's bits per value and probes tables with the instance's block."""
    x = synthetic.keys_with_outliers(16, 2, seed=3, head_dim=head_dim)
    for f in ("vllm_tq4_k", "vllm_tq3_v"):
        codec = tbq.get_codec(f, head_dim=head_dim)
        info = codec.info
        assert info.block_size == head_dim and info.bits_per_value != tbq.format_info(f).bits_per_value
        (row,) = study.rate_distortion_rows({"k": x}, [codec], n_queries=2)
        assert row["bits_per_value"] == info.type_size * 8 / head_dim
    levels = study.table_levels("vllm_tq3_v", head_dim=head_dim)
    assert np.array_equal(levels, np.arange(8))
    cents = study.table_levels("vllm_tq4_k", head_dim=head_dim)
    assert np.array_equal(cents, tbq.get_format("vllm_tq4_k", head_dim=head_dim).tables()["centroids"])


def _nearest(levels, v):
    c = np.unique(levels)
    return c[np.searchsorted(0.5 * (c[1:] + c[:-1]), v, side="right")]


def test_table_inputs_rounded_to_the_table_are_the_stored_codes():
    """The values table_inputs reports, rounded to the nearest level, are the codes each encoder writes."""
    x = synthetic.heavy_tailed_values(16, 2, seed=7)
    for f in ("q4_0", "q5_0", "q8_0", "q4_1", "q5_1"):
        fm = tbq.get_format(f)
        data = fm.encode(x)
        fl = fm.fields(data)
        d = fl["d"].astype(np.float64)
        m = fl["m"].astype(np.float64) if "m" in fl else 0.0
        y = fm.decode(data).reshape(d.shape + (-1,)).astype(np.float64)
        stored = (y - (m[..., None] if "m" in fl else 0.0)) / d[..., None]  # the integer level of every value
        got = _nearest(study.table_levels(f), study.table_inputs(f, x))
        assert np.array_equal(got, np.rint(stored).ravel()) and np.allclose(stored, np.rint(stored), atol=1e-3), f
    fm = tbq.get_format("iq4_nl")
    idx = fm.fields(fm.encode(x))["qs"].ravel()
    assert np.array_equal(
        _nearest(study.table_levels("iq4_nl"), study.table_inputs("iq4_nl", x)), fm.tables()["values"][idx]
    )
    for f in (
        "mxfp4",
        "nvfp4",
    ):  # codes 0..15 -> doubled E2M1 values; ties (to the smaller magnitude) do not occur here
        fm = tbq.get_format(f)
        codes = fm.fields(fm.encode(x))["qs"].ravel()
        assert np.array_equal(
            _nearest(study.table_levels(f), study.table_inputs(f, x)), fm.tables()["values"][codes].astype(np.float64)
        ), f
    for f in ("tbq4_0", "tbq3_0", "planar4_0", "iso3_0"):
        fm = tbq.get_format(f)
        key = [k for k in fm.fields(fm.encode(x)) if k != "d"][0]
        idx = fm.fields(fm.encode(x))[key].ravel()
        assert np.array_equal(
            _nearest(study.table_levels(f), study.table_inputs(f, x)), fm.tables()["centroids"][idx].astype(np.float64)
        ), f


def test_rotated_nmse_reproduces_the_format_and_swaps_tables():
    from tbq.codebooks import lloyd_max

    for x in (synthetic.gaussian(32, 2, seed=8), synthetic.keys_with_outliers(32, 2, seed=8)):
        for f in ("tbq4_0", "tbq3_0", "planar4_0", "planar3_0", "iso4_0", "iso3_0"):
            real = metrics.nmse(x, study.get_quantizer(f)(x))
            mine = study.rotated_nmse(f, x)
            # they differ only by the fp16 rounding of the stored norm (relative 2^-11 on every decoded value)
            # and float32 rounding: |sqrt(real) - sqrt(mine)| <= 2^-11 (1 + sqrt(mine)) + slack
            assert abs(math.sqrt(real) - math.sqrt(mine)) <= 2.0**-11 * (1 + math.sqrt(mine)) + 1e-5, (f, real, mine)
            assert study.rotated_nmse(f, x, tbq.get_format(f).tables()["centroids"]) == mine
    # on Gaussian data every rotation gives Gaussian coordinates: planar's rotation with TBQ's table is TBQ's error
    g = synthetic.gaussian(256, 2, seed=9)
    assert study.rotated_nmse("planar4_0", g, lloyd_max(4).centroids) == pytest.approx(
        study.rotated_nmse("tbq4_0", g), rel=0.05
    )
    with pytest.raises(ConfigError):
        study.rotated_nmse("q4_0", g)
