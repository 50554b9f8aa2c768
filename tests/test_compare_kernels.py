"""``tbq compare`` with the fused attention kernel, and its cold start (compiling on every core)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tbq
from tbq.compare import attention_columns, compare
from tbq.metrics import random_queries
from tbq.synthetic import builtin_kv


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "tbq4_0", "tbq3_0", "iq4_nl"])
def test_fused_attention_columns_equal_the_dense_metrics(fmt):
    """The kernel path (blocks read directly, BLAS logits) gives the metrics of tbq.metrics.attention_error."""
    d = builtin_kv(seed=1)
    x, p = d["keys"][:200], d["values"][:200]
    c = tbq.get_codec(fmt)
    queries = random_queries(16, 128, 8, seed=3)
    for role, a, b in (("keys", x, p), ("values", p, x)):
        q = c.encode(a)
        y = c.decode(q)
        dense = attention_columns(a, y, role=role, partner=b, queries=queries, topk=8)
        fused = attention_columns(a, y, role=role, partner=b, queries=queries, topk=8, encoded=(q, c))
        for key, want in dense.items():
            if want is None:
                assert fused[key] is None
            elif key == "top-k":
                assert fused[key] == want
            else:
                assert fused[key] == pytest.approx(want, rel=1e-4, abs=1e-12), key
        single = attention_columns(a, y, role=role, queries=queries, encoded=(q, c))
        assert single["out NMSE"] is None


def test_compare_rows_carry_the_fused_out_nmse():
    """Each row's out NMSE is the attention-output NMSE of that array quantized, its partner exact.

    Computed here from scratch: softmax(q k / sqrt(128)) v in float64 per (head, query) with
    compare's seeded queries, pooled NMSE over every output.
    """
    d = builtin_kv(seed=0)
    k, v = d["keys"][:128], d["values"][:128]
    rows = compare({"keys": k, "values": v}, ["tbq4_0", "q8_0"], repeat=1)
    queries = random_queries(16, 128, k.shape[1], seed=0).astype(np.float64)

    def output(keys, vals):
        z = np.einsum("qhd,thd->hqt", queries, keys.astype(np.float64)) / np.sqrt(128.0)
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        return np.einsum("hqt,thd->qhd", p, vals.astype(np.float64))

    exact = output(k, v)
    assert len(rows) == 4
    for r in rows:
        c = tbq.get_codec(r["format"])
        kk, vv = (c.decode(c.encode(k)), v) if r["data"] == "keys" else (k, c.decode(c.encode(v)))
        o = output(kk, vv)
        want = float(np.sum((o - exact) ** 2) / np.sum(exact**2))
        assert r["out NMSE"] == pytest.approx(want, rel=1e-3), r
    by = {(r["data"], r["format"]): r["out NMSE"] for r in rows}
    assert by["keys", "q8_0"] < by["keys", "tbq4_0"] and by["values", "q8_0"] < by["values", "tbq4_0"]


def _last_json(code: str, **env: str) -> object:
    """Run ``code`` in a new interpreter with ``env`` added to this one's environment; the JSON of its last line
    of output."""
    r = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _last_json_in_a_fresh_cache(code: str, cache) -> object:
    """:func:`_last_json` in a new interpreter whose numba cache is the empty folder ``cache``."""
    return _last_json(code, NUMBA_CACHE_DIR=str(cache))


def test_cold_cache_is_seen_and_filled_by_helper_processes(tmp_path):
    """In a fresh numba cache, kernels_cached says so, and warm_up on two processes fills it."""
    code = (
        "import json, tbq.warmup as c\n"
        "f = ['q8_0', 'q4_0']\n"
        "before = c.kernels_cached(f, attention=False)\n"
        "c.warm_up(f, {}, attention=False, processes=2)\n"
        "print(json.dumps([before, c.kernels_cached(f, attention=False)]))\n"
    )
    assert _last_json_in_a_fresh_cache(code, tmp_path / "numba") == [False, True]
    names = {p.name.split(".")[0] for p in (tmp_path / "numba").rglob("*.nbi")}
    assert {"q8_0_kernels", "q4_0_kernels"} <= names  # both modules compiled (one of them by the helper process)


def test_the_cold_start_queue_takes_the_heaviest_compile_first_and_each_module_once(tmp_path, monkeypatch):
    """The queue's order is compile cost, not file size: the two large compiles (the TBQ kernels and the attention
    kernels, whose IR codegen, Python and not numba-compiled, does not count) before the small ones; a lazily
    compiled kernel does not count either. Each module is compiled by the one process that claims it first, and
    only the formats the comparison kept."""
    import importlib.util

    import tbq.warmup as c

    units = c._units_by_weight(["q8_0", "q4_0", "tbq4_0", "tbq3_0"], True)
    source = {u: Path(importlib.util.find_spec(u).origin).read_text() for u in units}
    weight = {u: c._compile_weight(source[u]) for u in units}
    assert [weight[u] for u in units] == sorted(weight.values(), reverse=True)
    assert sorted(units[:2]) == ["tbq.attention_kernels", "tbq.formats.tbq_kernels"]
    assert sorted(units[2:]) == ["tbq.formats.q4_0_kernels", "tbq.formats.q8_0_kernels"]
    assert weight[units[1]] > 10 * weight[units[2]]
    # the attention module's codegen and docstrings are most of its lines, and not counted
    assert weight["tbq.attention_kernels"] < source["tbq.attention_kernels"].count("\n") / 2
    src = "_LAZY_KERNELS = ('g',)\n\n\n@jit\ndef f():\n    pass\n\n\n@jit\ndef g():\n    pass\n"
    assert c._compile_weight(src) == 3  # g is compiled only on demand
    done = []
    monkeypatch.setattr(c, "_warm", lambda f, config, attention, readers: done.append((list(f), attention)))
    fmts = ["q8_0", "tbq4_0", "tbq3_0"]
    units = c._units_by_weight(fmts, True)
    c._claim(str(tmp_path), "tbq.formats.q8_0_kernels")  # another process took q8_0's module
    c._warm_queue(units, fmts, {}, str(tmp_path), True, keep={"tbq4_0", "q8_0"})
    # tbq3_0 left out of the comparison: not compiled; the two large modules in the queue's order
    tbq_first = units.index("tbq.formats.tbq_kernels") < units.index("tbq.attention_kernels")
    big = [(["tbq4_0"], False), ([], True)]
    assert done == (big if tbq_first else big[::-1])
    c._warm_queue(units, fmts, {}, str(tmp_path), True)  # a second process: nothing left to claim
    assert len(done) == 2
    # one process alone (processes=1, or no writable temporary folder) claims without files: everything
    monkeypatch.setattr("tempfile.mkdtemp", _no_tmp)
    w = c.start_warm_up(fmts, {}, attention=True, processes=2)
    assert w._procs == [] and w._claims is None
    w.finish()
    big = [["tbq4_0", "tbq3_0"], []]
    assert [f for f, _ in done[2:]] == (big if tbq_first else big[::-1]) + [["q8_0"]]


def test_a_cold_start_removes_the_claim_folders_killed_runs_left_and_nothing_else(tmp_path, monkeypatch):
    """A CLI killed with SIGKILL during its warm-up leaves its ``tbq-warm-*`` claim folder: the next cold start
    removes those over an hour old that hold only claim files, and leaves fresh ones (a run under way), other
    names, files and folders holding a subfolder alone."""
    import os
    import time

    import tbq.warmup as c

    now = time.time()
    old = now - c.STALE_CLAIMS_S - 60

    def make(name, files=(), sub=False, age=old):
        d = tmp_path / name
        d.mkdir()
        for f in files:
            (d / f).write_text("")
        if sub:
            (d / "sub").mkdir()
        os.utime(d, (age, age))
        return d

    stale = make("tbq-warm-abc", ["tbq.formats.q8_0_kernels", "tbq.attention_kernels"])
    empty = make("tbq-warm-def")
    fresh = make("tbq-warm-ghi", ["tbq.formats.q8_0_kernels"], age=now - 5)
    other = make("tbq-other-old", ["x"])
    nested = make("tbq-warm-nested", ["x"], sub=True)
    (tmp_path / "tbq-warm-file").write_text("")
    os.utime(tmp_path / "tbq-warm-file", (old, old))
    assert sorted(c._remove_stale_claims(str(tmp_path), now)) == ["tbq-warm-abc", "tbq-warm-def"]
    assert not stale.exists() and not empty.exists()
    assert fresh.exists() and other.exists() and nested.exists() and (tmp_path / "tbq-warm-file").exists()
    assert c._remove_stale_claims(str(tmp_path / "missing"), now) == []  # no folder: nothing to do, no error
    # start_warm_up does it before it makes its own claim folder
    make("tbq-warm-jkl")
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr("tempfile.mkdtemp", _no_tmp)  # then: no folder of its own, no helper
    w = c.start_warm_up(["q8_0", "tbq4_0"], {}, attention=False, processes=2)
    assert w._procs == [] and not (tmp_path / "tbq-warm-jkl").exists()


def _no_tmp(*args, **kwargs):
    raise PermissionError(13, "Permission denied")


def test_a_started_warm_up_is_finished_or_cancelled(tmp_path, monkeypatch):
    """start_warm_up's helpers compile while the caller works; cancel() stops them (the CLI does so when the
    comparison fails before it needs the kernels), finish() waits for them and compiles this process's share."""
    from tbq.warmup import start_warm_up

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))  # the helpers' cache: empty, so they compile
    w = start_warm_up(["q8_0", "q4_0"], {}, attention=False, processes=2)
    assert len(w._procs) == 1 and w._procs[0].poll() is None  # compiling
    w.cancel()
    assert w._procs[0].returncode is not None  # stopped and reaped
    code = (
        "import json, tbq.warmup as c\n"
        "w = c.start_warm_up(['q8_0', 'q4_0'], {}, attention=False, processes=2)\n"
        "w.finish(['q8_0', 'q4_0'])\n"
        "print(json.dumps([p.returncode for p in w._procs] + [c.kernels_cached(['q8_0', 'q4_0'], attention=False)]))\n"
    )
    assert _last_json_in_a_fresh_cache(code, tmp_path / "numba2") == [0, True]


def test_the_warm_up_scheduler_lives_in_tbq_warmup_and_tbq_compare_still_names_it():
    """The scheduler moved to its own module; the public names users import from ``tbq.compare`` are the same
    objects."""
    import tbq.compare as c
    import tbq.warmup as w

    for name in ("warm_up", "start_warm_up", "WarmUp", "kernels_cached"):
        assert getattr(c, name) is getattr(w, name) and name in c.__all__
    assert not hasattr(c, "_warm_queue")  # one home: the queue is not copied into compare


def test_the_attention_warm_up_compiles_the_kernel_that_reads_tbq_codes():
    """With AVX-512VL the fused attention reads TBQ4_0/TBQ3_0 codes in another kernel (``_attend_codes``): a
    warm-up that includes a rotated format runs it, so the first TBQ attention of a comparison does not compile it
    (about 5 s). Without AVX-512VL no cache takes that kernel, and the warm-up leaves it alone."""
    from tbq.kernels import TARGET_AVX512VL

    code = (
        "import json, tbq.warmup as w, tbq.attention_kernels as k\n"
        "w._warm(['q8_0', 'tbq4_0'], {}, True)\n"
        "print(json.dumps(len(k._attend_codes.signatures)))\n"
    )
    assert _last_json(code) == (1 if TARGET_AVX512VL else 0)
