"""A format from another package (tests/plugin: one file plus its entry points) works in every feature and on the CLI.

The plugin is found the way an installed one is: tests/plugin holds the module and a ``.dist-info`` directory whose
``entry_points.txt`` names it in the ``tbq.formats`` group (and the numcodecs / Zarr codec ids), so a fresh process
with tests/plugin on ``sys.path`` sees it through ``importlib.metadata``. Nothing outside tests/plugin names it.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).parent
PLUGIN = HERE / "plugin"
SRC = HERE.parent / "src"


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), str(PLUGIN), str(HERE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    return env


def _run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, env=_env(), timeout=600, **kw)


def _cli(*args, cwd=None):
    return _run([sys.executable, "-c", "import sys; from tbq.cli import main; sys.exit(main())", *args], cwd=cwd)


def test_plugin_format_in_every_feature(tmp_path):
    script = textwrap.dedent(
        """
        import sys, warnings, numpy as np
        import tbq
        assert "demo_q8r" in tbq.format_names() and tbq.format_info("demo_q8r").code == 200, tbq.format_names()
        from helpers import check_format
        check_format("demo_q8r")                                  # codecs, both backends, bad input, config, trace
        from tbq.testing import strategies as tst                  # strategies
        warnings.simplefilter("ignore")
        assert tst.float_blocks("demo_q8r", leading_shape=(2,)).example().shape[-1] % 32 == 0
        assert tst.encoded_blocks("demo_q8r", valid=False).example().shape[-1] % 34 == 0
        from tbq.budget import bits_per_value                      # budget
        assert bits_per_value("demo_q8r") == 8.5
        from tbq.golden import generate, regenerate                # golden
        out = sys.argv[1]
        generate(out + "/g", formats=["demo_q8r"], rows_per_family=4)
        again = regenerate(out + "/g/demo_q8r.json")
        with np.load(out + "/g/demo_q8r.npz") as z:
            assert all(z[k].tobytes() == np.asarray(again.arrays[k]).tobytes() for k in z.files)
        from tbq.compare import compare                            # compare
        from tbq.synthetic import keys_with_outliers
        rows = compare({"keys": keys_with_outliers(32, 2, seed=1)}, ["demo_q8r", "q8_0"], repeat=1, n_queries=2, topk=2)
        assert [r["format"] for r in rows] == ["demo_q8r", "q8_0"] and rows[0]["NMSE"] < 1e-3
        from tbq import study                                      # study
        assert study.rate_distortion_rows({"k": keys_with_outliers(32, 2, seed=2)}, ["demo_q8r"], n_queries=2, topk=2)[0]["bits_per_value"] == 8.5
        import zarr, tbq.numcodecs as tn                           # numcodecs / Zarr
        x = keys_with_outliers(64, 2, seed=3)
        c = tn.get_numcodec("demo_q8r")
        assert np.array_equal(c.decode(c.encode(x)), tbq.dequantize(tbq.quantize(x, "demo_q8r"), "demo_q8r"))
        a = zarr.create_array(store=out + "/z.zarr", shape=x.shape, chunks=(32, 2, 128), dtype="float32",
                              serializer=tn.zarr_codec("demo_q8r"))
        a[:] = x
        np.save(out + "/want.npy", tbq.dequantize(tbq.quantize(x, "demo_q8r"), "demo_q8r"))
        print("ok")
        """
    )
    r = _run([sys.executable, "-c", script, str(tmp_path)])
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
    # a fresh process that never imports tbq reads the Zarr store: the plugin's numcodecs/zarr entry points find the codec
    child = "import sys, numpy as np, zarr; a = zarr.open_array(sys.argv[1] + '/z.zarr', mode='r'); np.save(sys.argv[1] + '/got.npy', a[:]); print('tbq.numcodecs' in sys.modules)"
    r = _run([sys.executable, "-c", child, str(tmp_path)])
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-3000:]
    import numpy as np

    assert np.load(tmp_path / "got.npy").tobytes() == np.load(tmp_path / "want.npy").tobytes()


def test_plugin_format_on_the_cli(tmp_path):
    r = _cli("golden", "--out", str(tmp_path / "g"), "--formats", "demo_q8r", "--quiet")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "g" / "demo_q8r.json").read_text())
    r = _cli(
        "golden", "--out", str(tmp_path / "g2"), "--from-manifest", str(tmp_path / "g" / "demo_q8r.json"), "--quiet"
    )
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "g2" / "demo_q8r.json").read_text())["arrays"] == m["arrays"]  # bit for bit
    r = _cli("compare", "--formats", "demo_q8r,q8_0", "--quiet", "--repeat", "1")
    assert r.returncode == 0 and "demo_q8r" in r.stdout, r.stderr
    prog = (
        f"{sys.executable} -c 'import sys, tbq_demo_plugin as p; sys.exit(p._main(sys.argv[1:]))' {{op}} {{in}} {{out}}"
    )
    r = _cli(
        "check",
        "--exec",
        prog,
        "--format",
        "demo_q8r",
        "--examples",
        "10",
        "--blocks",
        "400",
        "--quiet",
        "--out",
        str(tmp_path / "c"),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = _cli(
        "budget",
        "--formats",
        "demo_q8r,q8_0",
        "--layers",
        "2",
        "--kv-heads",
        "2",
        "--head-dim",
        "128",
        "--contexts",
        "4K",
    )
    assert r.returncode == 0 and "demo_q8r" in r.stdout, r.stderr
    r = _cli("compare", "--formats", "demo_q8r", "--option", "scale=2")  # options are still checked for a plugin
    assert r.returncode == 2 and "'scale' is not an option of demo_q8r" in r.stderr and "Traceback" not in r.stderr


def test_a_broken_plugin_warns_and_tbq_still_loads(tmp_path):
    d = tmp_path / "bad-0.1.dist-info"
    d.mkdir()
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: bad\nVersion: 0.1\n")
    (d / "entry_points.txt").write_text("[tbq.formats]\nbad = no_such_module_for_tbq\n")
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(tmp_path)])
    r = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import tbq; print(len(tbq.format_names()))"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0 and "format plugin 'bad'" in r.stderr and int(r.stdout) >= 18, r.stderr


def test_the_recipe_shows_the_plugin_as_it_is():
    """docs/architecture.md's plugin class is the test plugin's code, line for line."""
    doc = (HERE.parent / "docs" / "architecture.md").read_text()
    block = doc[doc.index("class DEMO_Q8R(Format):") :]
    block = block[: block.index("```")]
    src = (PLUGIN / "tbq_demo_plugin.py").read_text()
    for line in block.strip().splitlines():
        assert line in src, line
    assert (PLUGIN / "tbq_demo_plugin-0.1.dist-info" / "entry_points.txt").read_text().count("demo_q8r") == 3
