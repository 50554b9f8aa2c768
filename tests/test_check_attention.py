"""tbq check --attention: the derived bound, planted defects (one per diagnosis), the targets, the CLI, real builds."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tbq
from tbq.check import (
    Arithmetic,
    AttentionSettings,
    CallableAttention,
    ProgramAttention,
    check_attention,
)
from tbq.check.attention import DIAGNOSES, attention_bound, make_cases, reference_attention
from tbq.check.attention_cases import U32, _causal
from tbq.cli import main

ROOT = Path(__file__).resolve().parents[1]
GGML = ROOT.parent / "shared" / "ggml"

# ---------------------------------------------------------------------------------------------------------------
# a correct kernel, and the same kernel with one defect planted
# ---------------------------------------------------------------------------------------------------------------


def _rows(data, fmt, meta, rotated=False):
    """The cache's float64 values (T, G, D); ``rotated``: in the rotated domain R(x) a fused kernel reads."""
    f = tbq.get_format(fmt, **meta[f"{'k' if fmt == meta['k_type'] else 'v'}_options"])
    T, G = meta["n_tokens"], meta["n_head_kv"]
    y = tbq.dequantize(data.reshape(T * G, -1), fmt).astype(np.float64)
    y = np.asarray(f.domain.from_decode_domain(y), np.float64)
    if rotated:
        y = np.asarray(f.rotation.forward(y.reshape(T * G, -1, f.block_size)), np.float64)
    return y.reshape(T, G, -1)


def kernel(q, k, v, meta, defect=None):
    """Attention in float64 over tbq's decoded caches; ``defect`` plants one bug of DIAGNOSES."""
    H, G, D = meta["n_head"], meta["n_head_kv"], meta["head_dim"]
    K, V = _rows(k, meta["k_type"], meta), _rows(v, meta["v_type"], meta)
    q = q.astype(np.float64)
    if defect == "kv_swapped":
        K, V = V, K
    if defect in ("q_rotation_missing", "q_rotation_twice"):
        rot = tbq.get_format(meta["k_type"]).rotation
        K = _rows(k, meta["k_type"], meta, rotated=True)
        if defect == "q_rotation_twice":
            q = np.asarray(rot.forward(rot.forward(q.reshape(*q.shape[:2], -1, 128))), np.float64).reshape(q.shape)
    g = np.arange(H) % G if defect == "gqa_modulo" else np.arange(H) // (H // G)
    scale = {"scale_1_over_d": 1.0 / D, "scale_missing": 1.0}.get(defect, meta["scale"])
    s = np.einsum("qhd,thd->qht", q, K[:, g]) * scale
    if defect == "uniform":
        s = 0 * s
    if meta["softcap"] and defect != "softcap_missing":
        s = meta["softcap"] * np.tanh(s / meta["softcap"])
    mask = meta["mask"].astype(np.float64)
    n_q, T = mask.shape
    if defect in ("causal_plus_one", "causal_minus_one") and n_q > 1 and np.array_equal(mask, _causal(n_q, T)):
        shift = 1 if defect == "causal_plus_one" else -1
        mask = np.where(np.arange(T)[None, :] <= T - n_q + np.arange(n_q)[:, None] + shift, 0.0, -np.inf)
    z = s + mask[:, None, :]
    M = z.max(-1, keepdims=True)
    sinks = meta["sinks"] if defect != "sinks_ignored" else None
    if sinks is not None:
        M = np.maximum(M, sinks[None, :, None])
    with np.errstate(invalid="ignore", over="ignore"):
        w = np.exp(z - M)
        tot = w.sum(-1) + (0 if sinks is None else np.exp(sinks[None, :] - M[..., 0]))
        if defect == "f16_overflow":  # the unnormalized sum kept in f16
            acc = np.zeros((n_q, H, D), np.float16)
            for t in range(T):
                acc = (acc + (w[:, :, t, None] * V[t, g][None]).astype(np.float16)).astype(np.float16)
            out = acc.astype(np.float64) / tot[..., None]
        else:
            out = np.einsum("qht,thd->qhd", w, V[:, g]) / tot[..., None]
    if defect != "nan_all_masked":
        out = np.where(np.isfinite(M), out, 0.0)  # an all-masked row: zeros
    if defect in ("out_rotation_missing", "out_rotation_twice"):
        rot = tbq.get_format(meta["v_type"]).rotation
        b = out.reshape(n_q, H, -1, 128)
        out = (rot.forward(b) if defect == "out_rotation_missing" else rot.inverse(b)).reshape(out.shape)
    return out.astype(np.float32)


#: The settings that show each defect (the formats and families where it can appear), small enough to run fast.
SMALL = dict(head_dim=128, contexts=(1, 3, 40), ratios=(1, 4), prefill=(5, 24), queries=1)
DEFECTS = {
    "uniform": AttentionSettings("q8_0", "q8_0", families=("decode",), **SMALL),
    "scale_1_over_d": AttentionSettings("q4_0", "q8_0", families=("decode",), **SMALL),
    "scale_missing": AttentionSettings("q4_0", "f16", families=("decode",), **SMALL),
    "kv_swapped": AttentionSettings("q8_0", "q8_0", families=("decode",), **SMALL),
    "gqa_modulo": AttentionSettings("q8_0", "q4_0", families=("gqa",), **SMALL),
    "causal_plus_one": AttentionSettings("q8_0", "q8_0", families=("prefill",), **SMALL),
    "causal_minus_one": AttentionSettings("f16", "f16", families=("prefill",), **SMALL),
    "sinks_ignored": AttentionSettings("q8_0", "q8_0", families=("sinks",), **SMALL),
    "softcap_missing": AttentionSettings("q8_0", "q8_0", families=("softcap",), **SMALL),
    "nan_all_masked": AttentionSettings("q8_0", "q8_0", families=("mask",), **SMALL),
    "f16_overflow": AttentionSettings("q8_0", "f16", families=("overflow",), **SMALL),
    "f16_undeclared": AttentionSettings("q8_0", "f16", families=("decode",), **SMALL),
    "q_rotation_missing": AttentionSettings("tbq4_0", "q8_0", families=("decode",), **SMALL),
    "q_rotation_twice": AttentionSettings("tbq4_0", "q8_0", families=("decode",), **SMALL),
    "out_rotation_missing": AttentionSettings("q8_0", "tbq4_0", families=("decode",), **SMALL),
    "out_rotation_twice": AttentionSettings("q8_0", "tbq4_0", families=("decode",), **SMALL),
}


def test_every_diagnosis_has_a_planted_kernel():
    assert set(DEFECTS) == set(DIAGNOSES)


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_a_planted_defect_is_wrong_and_diagnosed(defect, tmp_path):
    s = DEFECTS[defect]
    planted = "f16_overflow" if defect == "f16_undeclared" else defect  # an f16 accumulator, declared f32
    declared = Arithmetic("float32", "float32", "float16" if defect == "f16_overflow" else "float32")
    target = CallableAttention(lambda q, k, v, m: kernel(q, k, v, m, planted), arithmetic=declared)
    r = check_attention(target, s, out=tmp_path)
    assert not r.ok and r.counts()["wrong"] > 0, r.text()
    names = [d.name for d in r.diagnoses]
    assert names[:1] == [defect], (defect, names, r.text())
    ce = r.counterexample
    # the smallest wrong case: one head (GQA mapping needs two KV heads), the fewest tokens that show it
    assert ce is not None and ce.case.shape[3] <= (256 if defect == "f16_overflow" else 40), ce.case.shape
    assert (ce.case.shape[1] == 1) != (defect == "gqa_modulo"), ce.case.shape
    # the reproducer: the .npz holds the case, the .py exits 1 with the kernel's output, 0 with tbq's
    (npz,) = tmp_path.glob("*.npz")
    (py,) = tmp_path.glob("*.py")
    data = np.load(npz)
    assert np.array_equal(data["got"], ce.got, equal_nan=True) and np.array_equal(data["k"], ce.case.k)
    assert subprocess.run([sys.executable, py], capture_output=True).returncode == 1
    py.write_text(py.read_text().replace('return case["got"]', 'return case["expected"]'))
    assert subprocess.run([sys.executable, py], capture_output=True).returncode == 0


def test_the_correct_kernel_passes_every_family_and_format_pair():
    for kt, vt in (("q8_0", "q4_0"), ("f16", "f16"), ("tbq4_0", "tbq3_0"), ("iq4_nl", "q8_0")):
        s = AttentionSettings(kt, vt, **SMALL)
        r = check_attention(kernel, s)
        assert r.ok and r.counts()["wrong"] == 0 and r.counts()["blocks"] == 484, r.text()


# ---------------------------------------------------------------------------------------------------------------
# the bound: derived, passes a float32 kernel that rounds each term once more, fails a wrong scale
# ---------------------------------------------------------------------------------------------------------------


def _f32_kernel(q, k, v, meta, jitter=None):
    """Online-softmax attention in float32, token by token, as a fused CPU kernel computes it; ``jitter`` moves
    each product, weight and accumulation by one float32 rounding (a relative 2**-24, random sign)."""
    H, G, D = meta["n_head"], meta["n_head_kv"], meta["head_dim"]
    K = _rows(k, meta["k_type"], meta).astype(np.float32)
    V = _rows(v, meta["v_type"], meta).astype(np.float32)
    g = np.arange(H) // (H // G)
    n_q, T = meta["mask"].shape
    f = np.float32

    def r(x):
        return x if jitter is None else (x * (1 + jitter.choice([-1, 1], x.shape) * f(2**-24))).astype(f)

    M = np.full((n_q, H), -np.inf, f)
    S = np.zeros((n_q, H), f)
    acc = np.zeros((n_q, H, D), f)
    for t in range(T):
        s = r((r(q * K[t, g][None]).sum(-1, dtype=f) * f(meta["scale"])).astype(f)) + meta["mask"][:, t, None]
        newM = np.maximum(M, s)
        with np.errstate(invalid="ignore"):
            ms = np.where(np.isfinite(newM), np.exp(M - newM), 0).astype(f)
            vs = np.where(np.isfinite(s), r(np.exp(s - newM).astype(f)), 0).astype(f)
        acc = r(acc * ms[..., None] + vs[..., None] * V[t, g][None])
        S = r(S * ms + vs)
        M = newM
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(S[..., None] > 0, acc / S[..., None], 0).astype(f)


def test_a_float32_kernel_one_rounding_off_per_term_passes_and_a_wrong_scale_fails():
    s = AttentionSettings("q8_0", "q4_0", families=("decode", "prefill", "mask", "stress"), **SMALL)
    rng = np.random.default_rng(1)
    r = check_attention(lambda *a: _f32_kernel(*a, jitter=rng), s)
    assert r.ok, r.text()
    c = r.counts()
    assert c["fragile"] > c["exact"], c  # mostly inside the bound, not equal: the bound is what lets it pass

    def wrong_scale(q, k, v, meta):
        return _f32_kernel(q, k, v, dict(meta, scale=np.float32(1.0 / meta["head_dim"])))

    bad = check_attention(wrong_scale, s)
    assert not bad.ok and bad.diagnoses[0].name == "scale_1_over_d", bad.text()


def test_the_bound_is_the_documented_formula():
    s = AttentionSettings("f16", "f16", head_dim=64, contexts=(10,), families=("decode",), queries=1)
    (case, *_) = make_cases(s)
    b = attention_bound(case, s, "float32", "float32")
    # the formula of the module docstring and docs/checking-kernels.md, written out for one decode step
    K = tbq.dequantize(case.k.reshape(-1, 64), "f16").reshape(10, 2, 64).astype(np.float64)
    V = tbq.dequantize(case.v.reshape(-1, 64), "f16").reshape(10, 2, 64).astype(np.float64)
    q, g, u = case.q[0].astype(np.float64), np.arange(8) // 4, U32
    raw = np.einsum("hd,thd->ht", q, K[:, g]) * case.scale
    eps = np.max(
        case.scale * (64 + 8) * u * np.einsum("hd,thd->ht", np.abs(q), np.abs(K[:, g])) + 4 * u * np.abs(raw), 1
    )
    spread = raw.max(1) - raw.min(1)
    vmax = np.abs(V).max(axis=(0, 2))[g]
    out = reference_attention(case, s)[0]
    want = 1.01 * ((np.expm1(2 * eps) + (2 * 10 + 2) * u + 16 * u + u * (spread + 1)) * vmax + u * np.abs(out).max(1))
    assert np.allclose(b[0], want, rtol=1e-12, atol=0), (b[0], want)
    b16 = attention_bound(case, s, "float32", "float16")  # an f16 accumulator: (2 T + 2) * 2**-11 of max|V| instead
    assert np.allclose(b16[0] - b[0], 1.01 * 22 * (2.0**-11 - u) * vmax, rtol=1e-9)


def test_a_causal_prefill_cut_to_fewer_tokens_keeps_the_queries_there_and_their_outputs():
    s = AttentionSettings("q8_0", "q4_0", head_dim=64, prefill=(6,), families=("prefill",))
    case = [c for c in make_cases(s) if c.shape[3] == 43][0]  # 6 queries over 43 tokens: positions 37 .. 42
    cut = case.subset(tokens=40)  # positions 37, 38, 39
    assert cut.shape[:1] + cut.shape[3:4] == (3, 40) and np.array_equal(cut.mask, _causal(3, 40))
    assert np.array_equal(reference_attention(cut, s), reference_attention(case, s)[:3])
    with pytest.raises(Exception, match="none within"):
        case.subset(tokens=37)


def test_an_all_masked_row_is_zeros_in_the_reference():
    s = AttentionSettings("q8_0", "q8_0", head_dim=64, families=("mask",))
    case = make_cases(s)[0]
    ref = reference_attention(case, s)
    assert np.all(ref[1] == 0) and np.all(np.isfinite(ref))


def test_q8_0_conversion_of_the_query_is_the_reference_when_declared():
    s = AttentionSettings("q4_0", "q4_0", head_dim=64, contexts=(7,), families=("decode",), queries=1)
    case = make_cases(s)[0]
    a, b = reference_attention(case, s, "float32"), reference_attention(case, s, "q8_0")
    assert 0 < np.max(np.abs(a - b)) < 0.05  # the query's q8_0 rounding moves the output, a little

    def q8_kernel(q, k, v, meta):
        qq = tbq.dequantize(tbq.quantize(q.reshape(-1, 64), "q8_0"), "q8_0").reshape(q.shape)
        return kernel(qq, k, v, meta)

    assert check_attention(CallableAttention(q8_kernel, arithmetic=Arithmetic("q8_0", "float32", "float32")), s).ok
    # a kernel that keeps the query in float32 where it declares q8_0 is judged against the q8_0 reference
    assert not check_attention(CallableAttention(kernel, arithmetic=Arithmetic("q8_0", "float32", "float32")), s).ok


# ---------------------------------------------------------------------------------------------------------------
# targets and the command line
# ---------------------------------------------------------------------------------------------------------------

PROGRAM = r"""
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_check_attention import kernel
qf, kf, vf, mf, of = sys.argv[1:6]
meta = json.load(open(mf))
meta["mask"] = np.array([[float(x) for x in row] for row in meta["mask"]], np.float32)
meta["sinks"] = None if meta["sinks"] is None else np.float32(meta["sinks"])
T, G, D = meta["n_tokens"], meta["n_head_kv"], meta["head_dim"]
q = np.fromfile(qf, "<f4").reshape(meta["n_query"], meta["n_head"], D)
k = np.fromfile(kf, np.uint8).reshape(T, G, -1)
v = np.fromfile(vf, np.uint8).reshape(T, G, -1)
kernel(q, k, v, meta, {defect!r}).astype("<f4").tofile(of)
"""


def test_a_program_target(tmp_path):
    s = AttentionSettings("q8_0", "q4_0", head_dim=64, contexts=(1, 9), families=("decode", "mask"), queries=1)
    for defect, ok in ((None, True), ("kv_swapped", False)):
        prog = tmp_path / f"k{defect}.py"
        prog.write_text(PROGRAM.format(tests=str(Path(__file__).parent), defect=defect))
        r = check_attention(ProgramAttention(f"{sys.executable} {prog} {{q}} {{k}} {{v}} {{meta}} {{out}}"), s)
        assert r.ok == ok, r.text()
    assert r.diagnoses[0].name == "kv_swapped"


C_DIR = Path(__file__).parent / "c"
EXEC_ARGS = "{q} {k} {v} {mask} {sinks} {out} {n_query} {n_head} {n_head_kv} {n_tokens} {head_dim} {scale}"


@pytest.mark.parametrize(
    "define, diagnosis",
    [
        (None, None),
        ("SCALE_1_OVER_D", "scale_1_over_d"),
        ("GQA_MODULO", "gqa_modulo"),
        ("NAN_ALL_MASKED", "nan_all_masked"),
    ],
)
def test_the_c_program_of_the_guide(define, diagnosis, tmp_path):
    # tests/c/attention_q8_0.c: float32 online softmax over q8_0 caches, run through --exec, its planted defects named
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on PATH")
    exe = tmp_path / "attention"
    flags = [f"-D{define}"] if define else []
    subprocess.run(
        [cc, "-O2", *flags, "-I", str(C_DIR), str(C_DIR / "attention_q8_0.c"), "-o", str(exe), "-lm"], check=True
    )
    s = AttentionSettings(
        "q8_0", "q8_0", contexts=(1, 7, 300), prefill=(7, 40), ratios=(1, 4), families=("decode", "prefill", "gqa", "mask", "sinks", "stress")
    )  # fmt: skip
    r = check_attention(ProgramAttention(f"{exe} {EXEC_ARGS}"), s)
    assert r.ok == (define is None), r.text()
    assert [d.name for d in r.diagnoses][:1] == ([diagnosis] if diagnosis else []), r.text()


def test_a_program_command_is_validated(tmp_path):
    from tbq.check import TargetError

    with pytest.raises(TargetError, match=r"lacks the placeholders \{k\}, \{out\}"):
        ProgramAttention("./kernel {q} {v}")
    with pytest.raises(TargetError, match=r"unknown placeholder \{in\}"):
        ProgramAttention("./kernel {q} {k} {v} {out} {in}")


def test_settings_are_validated_at_the_boundary():
    from tbq.errors import ConfigError

    with pytest.raises(ConfigError, match="block size 32"):
        AttentionSettings("q8_0", "q8_0", head_dim=48)
    with pytest.raises(ConfigError, match="family"):
        AttentionSettings("q8_0", "q8_0", families=("decoder",))
    with pytest.raises(ConfigError, match="not a registered format"):
        AttentionSettings("q9_0", "q8_0")
    with pytest.raises(ConfigError, match="AttentionSettings"):
        check_attention(kernel, {"k_type": "q8_0"})


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--attention", "--lib", "x.so", "--v-type", "q8_0"], "--k-type FMT and --v-type FMT"),
        (["--attention", "--k-type", "q8_0", "--v-type", "q8_0"], "--lib PATH"),
        (["--k-type", "q8_0", "--lib", "x.so"], "--k-type goes with --attention"),
        (["--lib", "x.so"], "give --format FMT"),
        (["--attention", "--lib", "x.so", "--k-type", "q8_0", "--v-type", "q8_0", "--exact"], "--exact is for row"),
        (
            ["--attention", "--lib", "x.so", "--k-type", "q8_0", "--v-type", "q8_0", "--families", "foo"],
            "family must be",
        ),
        (["--attention", "--lib", "x.so", "--k-type", "q8_0", "--v-type", "q8_0", "--head-dim", "100"], "multiple of"),
        (
            ["--attention", "--lib", "/nonexistent/libggml-cpu.so", "--k-type", "q8_0", "--v-type", "q8_0"],
            "no such file",
        ),
        (
            ["--attention", "--lib", "x.so", "--k-type", "q8_0", "--v-type", "q8_0", "--codebook", "turboq-mtp"],
            "takes the option codebook",
        ),
    ],
)
def test_cli_usage_errors_exit_2_with_one_line(argv, message, capsys):
    assert main(["check", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


# ---------------------------------------------------------------------------------------------------------------
# real ggml builds (../shared/ggml), each in a process of its own
# ---------------------------------------------------------------------------------------------------------------


def _build(name: str) -> Path:
    lib = GGML / name / "lib" / "libggml-cpu.so.0"
    if not lib.is_file():
        pytest.skip(f"{lib} is absent: the real ggml builds live outside the repo (../shared/ggml)")
    return lib


def _tbq_check(*args: str) -> tuple[int, dict, str]:
    r = subprocess.run(
        [sys.executable, "-m", "tbq", "check", *args, "--json", "-"], capture_output=True, text=True, timeout=1200
    )
    if r.returncode == -4 or "SIGILL" in r.stderr:
        pytest.skip("the ../shared ggml build died of SIGILL on this CPU")
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout), r.stderr


@pytest.mark.parametrize("kv", ["f16", "q8_0", "q4_0", "iq4_nl"])
def test_real_upstream_flash_attention_passes(kv, tmp_path):
    lib = _build("upstream")
    rc, rep, _ = _tbq_check("--attention", "--lib", str(lib), "--k-type", kv, "--v-type", kv, "--out", str(tmp_path))
    assert rc == 0 and rep["ok"] and rep["totals"]["attention"]["wrong"] == 0, rep["verdict"]
    assert rep["settings"]["arithmetic"] == {
        "q": "float16" if kv == "f16" else "q8_0",
        "softmax": "float32",
        "v": "float16" if kv == "f16" else "float32",
    }


@pytest.mark.parametrize("head_dim", [64, 256])
def test_real_upstream_flash_attention_at_other_head_dims(head_dim, tmp_path):
    lib = _build("upstream")
    rc, rep, _ = _tbq_check(
        "--attention", "--lib", str(lib), "--k-type", "q8_0", "--v-type", "q4_0", "--head-dim", str(head_dim),
        "--contexts", "1,7,300", "--out", str(tmp_path),
    )  # fmt: skip
    assert rc == 0 and rep["ok"] and rep["totals"]["attention"]["blocks"] > 2000, rep["verdict"]


def test_real_fork_tbq4_0_at_head_dim_128_is_uniform_attention_and_at_256_right(tmp_path):
    lib = _build("fork")
    rc, rep, text = _tbq_check(
        "--attention",
        "--lib",
        str(lib),
        "--k-type",
        "tbq4_0",
        "--v-type",
        "f16",
        "--head-dim",
        "128",
        "--out",
        str(tmp_path),
    )
    assert rc == 1 and not rep["ok"]
    assert [d["name"] for d in rep["diagnoses"]] == ["uniform"], rep["diagnoses"]
    assert rep["counterexamples"]["attention"]["shape"]["n_head"] == 1
    assert "codebook=turboq-mtp" in " ".join(rep["notes"])
    c_file = next(tmp_path.glob("*.c"))
    exe = tmp_path / "repro"
    libdir = lib.parent
    cc = subprocess.run(
        [
            "cc",
            "-O2",
            "-I",
            str(GGML / "fork" / "include"),
            "-o",
            str(exe),
            str(c_file),
            str(libdir / "libggml-base.so.0"),
            str(lib),
            f"-Wl,-rpath,{libdir}",
            "-lm",
        ],
        capture_output=True,
        text=True,
    )
    if cc.returncode == 0:  # a C compiler is there: the reproducer fails as the check did
        assert subprocess.run([str(exe)], capture_output=True).returncode == 1
    rc, rep, _ = _tbq_check(
        "--attention", "--lib", str(lib), "--k-type", "tbq4_0", "--v-type", "f16", "--head-dim", "256"
    )
    assert rc == 0 and rep["ok"], rep["verdict"]


# ---------------------------------------------------------------------------------------------------------------
# docs/checking-kernels.md, section 4: the pasted outputs are what the commands print
# ---------------------------------------------------------------------------------------------------------------

DOC = ROOT / "docs" / "checking-kernels.md"
_TIME = re.compile(r"\b\d+\.\d+ s\b")


def _doc_runs() -> list[tuple[str, list[str]]]:
    runs, block = [], None
    for line in DOC.read_text().splitlines():
        if line.startswith("```text"):
            block = []
        elif line.startswith("```") and block is not None:
            if block and block[0].startswith("$ tbq check --attention"):
                runs.append((block[0][2:], block[1:]))
            block = None
        elif block is not None:
            block.append(line)
    return runs


def test_the_guide_pastes_attention_runs():
    cmds = [c for c, _ in _doc_runs()]
    assert any("fork" in c and "128" in c for c in cmds) and any("fork" in c and "256" in c for c in cmds), cmds
    assert sum("upstream" in c for c in cmds) >= 4, cmds


@pytest.mark.parametrize(
    "cmd, pasted", _doc_runs(), ids=lambda v: v.split("--lib ")[-1][:60] if isinstance(v, str) else ""
)
def test_the_guides_attention_outputs_are_what_the_commands_print(cmd, pasted, tmp_path):
    args = cmd.split()[1:]
    for i, a in enumerate(args):
        if a.startswith("../shared/ggml/"):
            p = GGML / a[len("../shared/ggml/") :]
            _build(p.parts[-3])
            args[i] = str(p)
    r = subprocess.run([sys.executable, "-m", "tbq", *args], capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    if r.returncode == -4:
        pytest.skip("the ../shared ggml build died of SIGILL on this CPU")
    assert r.returncode in (0, 1), r.stderr
    # the report names the loaded file's real path: ../shared may be a link (resolved) or a folder
    out = r.stdout.replace(str(GGML.resolve()), "../shared/ggml").replace(str(GGML), "../shared/ggml")
    printed = [_TIME.sub("_ s", " ".join(ln.split())) for ln in out.splitlines()]
    i = 0
    for want in pasted:
        w = _TIME.sub("_ s", " ".join(want.split()))
        if w in ("", "...") or w.startswith("..."):
            continue
        pat = re.compile(".*".join(re.escape(p) for p in w.split("...")) + ("" if w.endswith("...") else "$"))
        while i < len(printed) and not pat.match(printed[i]):
            i += 1
        assert i < len(printed), f"docs/checking-kernels.md: {want!r} is not printed (in order) by {cmd}"
        i += 1
