"""tbq.dask: quantize/dequantize over Dask chunks and chunk-wise error metrics.

Every result is compared with the in-memory path (identical bytes / float32
bits) on the synchronous, local threaded and in-process distributed
schedulers. The docs example (docs/examples/scale_out) runs here on a small array.
"""

from __future__ import annotations

import importlib.util
import math
import pickle
from pathlib import Path

import numpy as np
import pytest

dask = pytest.importorskip("dask", reason="optional extra 'zarr' (dask[array]) is not installed")
da = pytest.importorskip("dask.array", reason="optional extra 'zarr' (dask[array]) is not installed")

from helpers import assert_bits_equal, assert_bytes_equal  # noqa: E402

import tbq  # noqa: E402
import tbq.dask as td  # noqa: E402
from tbq import metrics  # noqa: E402
from tbq.synthetic import keys_with_outliers  # noqa: E402

FORMATS = tbq.format_names()
EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "scale_out" / "kv_cache_scale_out.py"


def kv(tokens=64, layers=3, heads=2, head_dim=256, seed=0):
    """tokens x layers x heads x head_dim keys with outlier channels (two 128-blocks per row)."""
    return keys_with_outliers(tokens, layers * heads, head_dim, seed=seed).reshape(tokens, layers, heads, head_dim)


@pytest.fixture(scope="module")
def x():
    return kv()


def check_same_as_memory(x_np, dx, fmt, scheduler, **config):
    q = td.quantize(dx, fmt, **config)
    y = td.dequantize(q, fmt, **config)
    qq, yy = dask.compute(q, y, scheduler=scheduler)
    q_ref = tbq.quantize(x_np, fmt, **config)
    assert_bytes_equal(qq, q_ref, f"{fmt} quantize ({scheduler})")
    assert_bits_equal(yy, tbq.dequantize(q_ref, fmt, **config), f"{fmt} dequantize ({scheduler})")
    return q, y


# ---------------------------------------------------------------------------
# quantize / dequantize
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_identical_to_in_memory(x, fmt, scheduler):
    bs, ts = tbq.format_info(fmt).block_size, tbq.format_info(fmt).type_size
    w = max(128, bs)  # last-axis chunks of whole blocks: 128 values, or one q8_k block of 256
    dx = da.from_array(x, chunks=(16, 2, 1, w))
    q, y = check_same_as_memory(x, dx, fmt, scheduler)
    assert q.dtype == np.uint8 and y.dtype == np.float32
    assert q.shape == x.shape[:-1] + (x.shape[-1] // bs * ts,)
    assert q.chunks[:-1] == dx.chunks[:-1]
    assert q.chunks[-1] == (w // bs * ts,) * (256 // w)
    assert y.chunks == dx.chunks and y.shape == x.shape
    assert q.npartitions == dx.npartitions  # no rechunking when aligned


@pytest.mark.parametrize("fmt", FORMATS)
def test_config_passes_through(x, fmt):
    cfg = {"codebook": "turboq-mtp", "signs": 5} if fmt.startswith("tbq") else {"on_overflow": "inf"}
    check_same_as_memory(x, da.from_array(x, chunks=(32, 3, 2, 256)), fmt, "threads", backend="numpy", **cfg)


def test_float64_and_float16_input(x):
    for dtype in (np.float64, np.float16):
        xd = x.astype(dtype)
        q = td.quantize(da.from_array(xd, chunks=(16, 3, 2, 256)), "q8_0").compute()
        assert_bytes_equal(q, tbq.quantize(xd, "q8_0"), str(dtype))


def test_numpy_input_accepted(x):
    assert_bytes_equal(td.quantize(x, "tbq3_0").compute(), tbq.quantize(x, "tbq3_0"))


def test_misaligned_chunks_are_rechunked(x):
    dx = da.from_array(x, chunks=(16, 3, 2, 100))  # 100 + 100 + 56
    for fmt in FORMATS:
        bs = tbq.format_info(fmt).block_size
        q, y = check_same_as_memory(x, dx, fmt, "threads")
        assert all(c % tbq.format_info(fmt).type_size == 0 for c in q.chunks[-1])
        # uniform chunks of the largest chunk (100) rounded down to whole blocks, at least one block
        size = max(bs, 100 // bs * bs)
        want = tuple(min(size, 256 - s) for s in range(0, 256, size))
        assert y.chunks[-1] == want and all(c % bs == 0 for c in y.chunks[-1])
    # encoded data with chunks that split blocks
    q = td.quantize(da.from_array(x, chunks=(16, 3, 2, 256)), "tbq4_0").rechunk({3: 50})
    assert_bits_equal(td.dequantize(q, "tbq4_0").compute(), tbq.dequantize(tbq.quantize(x, "tbq4_0"), "tbq4_0"))


def test_rechunk_false_raises_naming_chunks(x):
    dx = da.from_array(x, chunks=(16, 3, 2, 100))
    with pytest.raises(
        tbq.BlockShapeError,
        match=r"last-axis chunks \(100, 100, 56\).*block size 32.*offending sizes: \[56, 100\].*rechunk\(\{-1: 96\}\)",
    ):
        td.quantize(dx, "q8_0", rechunk=False)
    q = td.quantize(da.from_array(x, chunks=(16, 3, 2, 256)), "q4_0").rechunk({3: 100})
    with pytest.raises(tbq.EncodedLengthError, match=r"last-axis chunks \(100, 44\).*type size \(bytes per block\) 18"):
        td.dequantize(q, "q4_0", rechunk=False)
    with pytest.raises(tbq.BlockShapeError):  # EncodedLengthError is a BlockShapeError
        td.dequantize(q, "q4_0", rechunk=False)


def test_shape_and_dtype_errors():
    with pytest.raises(tbq.BlockShapeError, match="100 values.*block size 32.*no rechunking"):
        td.quantize(da.zeros((4, 100), chunks=(2, 100), dtype=np.float32), "q8_0")
    with pytest.raises(tbq.TbqTypeError, match="int32"):
        td.quantize(da.zeros((4, 128), chunks=(2, 128), dtype=np.int32), "q8_0")
    with pytest.raises(tbq.EncodedLengthError, match="67 bytes.*66 bytes"):
        td.dequantize(da.zeros((4, 67), chunks=(2, 67), dtype=np.uint8), "tbq4_0")
    with pytest.raises(tbq.TbqTypeError, match="uint8"):
        td.dequantize(da.zeros((4, 66), chunks=(2, 66), dtype=np.float32), "tbq4_0")
    with pytest.raises(tbq.ConfigError):
        td.quantize(da.zeros((4, 128), chunks=(2, 128), dtype=np.float32), "q9_9")
    with pytest.raises(tbq.ConfigError):  # config is validated eagerly, not at compute time
        td.quantize(da.zeros((4, 128), chunks=(2, 128), dtype=np.float32), "tbq4_0", codebook="nope")


def test_encode_errors_surface_at_compute():
    xa = np.ones((4, 128), np.float32)
    xa[3, 5] = np.nan
    q = td.quantize(da.from_array(xa, chunks=(2, 128)), "q8_0")
    with pytest.raises(tbq.NonFiniteError):
        q.compute(scheduler="sync")


def test_graph_is_picklable_and_deterministic(x):
    dx = da.from_array(x, chunks=(16, 3, 2, 256))
    q = td.quantize(dx, "tbq4_0")
    assert q.name == td.quantize(dx, "tbq4_0").name  # same input and config -> same keys
    assert q.name != td.quantize(dx, "tbq4_0", signs=1).name
    pickle.loads(pickle.dumps(dict(q.__dask_graph__())))


def test_empty_leading_axis():
    e = da.zeros((0, 128), chunks=(1, 128), dtype=np.float32)
    assert td.quantize(e, "tbq4_0").compute().shape == (0, 66)
    assert td.error_metrics(e, e) == {
        "nmse": 0.0,
        "snr_db": math.inf,
        "max_abs_error": 0.0,
        "sum_squared_error": 0.0,
        "sum_squares": 0.0,
        "count": 0,
    }


# ---------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_metrics_match_in_memory(x, fmt):
    dx = da.from_array(x, chunks=(16, 1, 2, 256))
    y_np = tbq.dequantize(tbq.quantize(x, fmt), fmt)
    m = td.error_metrics(dx, td.dequantize(td.quantize(dx, fmt), fmt))
    assert m["nmse"] == pytest.approx(metrics.nmse(x, y_np), rel=1e-12)
    assert m["snr_db"] == pytest.approx(metrics.snr_db(x, y_np), rel=1e-12)
    assert m["max_abs_error"] == metrics.max_abs_error(x, y_np)
    assert m["count"] == x.size
    d = y_np.astype(np.float64) - x
    assert m["sum_squared_error"] == pytest.approx(float(np.sum(d * d)), rel=1e-12)
    assert m["sum_squares"] == pytest.approx(float(np.sum(x.astype(np.float64) ** 2)), rel=1e-12)


def test_metrics_edge_cases(x):
    dx = da.from_array(x, chunks=(16, 3, 2, 256))
    exact = td.error_metrics(dx, dx)
    assert exact["nmse"] == 0.0 and exact["snr_db"] == math.inf and exact["max_abs_error"] == 0.0
    z = da.zeros_like(dx)
    assert td.error_metrics(z, z)["nmse"] == 0.0
    assert td.error_metrics(z, dx)["nmse"] == math.inf
    # different chunkings of x and y are unified
    y = dx + 1
    m = td.error_metrics(dx.rechunk((16, 2, 1, 128)), y.rechunk((32, 3, 2, 256)))
    assert m["max_abs_error"] == metrics.max_abs_error(x, x + 1)
    assert m["nmse"] == pytest.approx(metrics.nmse(x, x + 1), rel=1e-12)
    # NaN propagates like tbq.metrics.max_abs_error
    xn = x.copy()
    xn[3, 0, 0, 7] = np.nan
    assert math.isnan(td.error_metrics(da.from_array(xn, chunks=(16, 3, 2, 256)), dx)["max_abs_error"])
    with pytest.raises(tbq.TbqValueError, match="shapes differ"):
        td.error_metrics(dx, dx[1:])


def test_metrics_delayed_shares_one_pass(x):
    """compute=False: compute the metrics together with the quantized array in one graph."""
    dx = da.from_array(x, chunks=(16, 3, 2, 256))
    q = td.quantize(dx, "tbq4_0")
    m = td.error_metrics(dx, td.dequantize(q, "tbq4_0"), compute=False)
    from dask.delayed import Delayed

    assert isinstance(m, Delayed)
    qq, mm = dask.compute(q, m)
    assert_bytes_equal(qq, tbq.quantize(x, "tbq4_0"))
    assert mm == td.error_metrics(dx, td.dequantize(q, "tbq4_0"))


def test_metrics_compute_each_chunk_once(x, monkeypatch):
    """The per-chunk statistics run once per chunk (the partial sums share one graph)."""
    calls = []
    real = td._block_stats

    def counting(a, b):
        calls.append(a.shape)
        return real(a, b)

    monkeypatch.setattr(td, "_block_stats", counting)
    dx = da.from_array(x, chunks=(16, 3, 2, 256))
    td.error_metrics(dx, dx + 1)
    assert len(calls) == dx.npartitions == 4


def test_metrics_run_chunk_by_chunk():
    """No task result is ever bigger than one input chunk: nothing is materialised whole."""
    from dask.callbacks import Callback

    shape, chunks = (512, 4, 2, 128), (32, 2, 2, 128)  # 2 MiB float32 in 32 chunks of 64 KiB
    dx = da.random.default_rng(0).standard_normal(shape, chunks=chunks, dtype=np.float32)
    chunk_bytes = math.prod(chunks) * 4
    largest = []

    class Track(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            largest.append(getattr(result, "nbytes", 0))

    with Track():
        m = td.error_metrics(dx, td.dequantize(td.quantize(dx, "tbq3_0"), "tbq3_0"))
    assert max(largest) <= chunk_bytes, (max(largest), chunk_bytes)
    assert 0.02 < m["nmse"] < 0.045


# ---------------------------------------------------------------------------
# distributed
# ---------------------------------------------------------------------------


def test_distributed_local_cluster(x):
    distributed = pytest.importorskip("distributed", reason="optional extra 'zarr' (distributed) is not installed")
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        misaligned = da.from_array(x, chunks=(32, 3, 1, 100))  # rechunked on the cluster
        dx = da.from_array(x, chunks=(32, 3, 1, 256))
        for fmt in FORMATS:
            check_same_as_memory(x, misaligned, fmt, client)
            y_np = tbq.dequantize(tbq.quantize(x, fmt), fmt)
            m = client.compute(td.error_metrics(dx, td.dequantize(td.quantize(dx, fmt), fmt), compute=False)).result()
            assert m["max_abs_error"] == metrics.max_abs_error(x, y_np)
            assert m["nmse"] == pytest.approx(metrics.nmse(x, y_np), rel=1e-12)


# ---------------------------------------------------------------------------
# the docs example, small
# ---------------------------------------------------------------------------


def _example():
    pytest.importorskip("zarr", reason="optional extra 'zarr' (zarr>=3) is not installed")
    spec = importlib.util.spec_from_file_location("kv_cache_scale_out", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("scheduler", ["threads", "distributed"])
def test_docs_example_small(tmp_path, scheduler):
    """The ≥4 GB worked example's code path on 64 tokens x 4 layers x 2 heads."""
    import zarr

    ex = _example()
    if scheduler == "distributed":
        pytest.importorskip("distributed", reason="optional extra 'zarr' (distributed) is not installed")
    rep = ex.run(
        tmp_path, tokens=64, layers=4, heads=2, chunk_tokens=16, chunk_layers=2, fmt="tbq4_0", scheduler=scheduler
    )
    assert rep["shape"] == [64, 4, 2, 128]
    assert set(rep["phases"]) == {"generate", "quantize_and_store", "metrics_from_disk"}
    assert rep["metrics"]["serializer_vs_blocks_mismatches"] == 0
    # the generated data is the chunk-seeded synthetic array, reproducible in memory
    x = zarr.open_array(tmp_path / "kv.zarr", mode="r")[:]
    assert_bits_equal(x, ex.synthetic_kv(x.shape, (16, 2, 2, 128), seed=0).compute())
    q = zarr.open_array(tmp_path / "kv.tbq4_0.blocks.zarr", mode="r")
    assert q.attrs["tbq_codec"] == tbq.get_codec("tbq4_0").get_config()
    assert_bytes_equal(q[:], tbq.quantize(x, "tbq4_0"))
    y = tbq.dequantize(q[:], "tbq4_0")
    assert_bits_equal(zarr.open_array(tmp_path / "kv.tbq4_0.zarr", mode="r")[:], y)
    assert rep["metrics"]["max_abs_error"] == metrics.max_abs_error(x, y)
    assert rep["metrics"]["nmse"] == pytest.approx(metrics.nmse(x, y), rel=1e-12)
    assert rep["bytes_on_disk"]["kv.zarr"] >= x.nbytes
    assert rep["phases"]["metrics_from_disk"]["peak_rss_mib"] is not None


def test_docs_example_cli(tmp_path, capsys):
    ex = _example()
    assert (
        ex.main(
            [
                "--root",
                str(tmp_path),
                "--tokens",
                "32",
                "--layers",
                "2",
                "--heads",
                "1",
                "--chunk-tokens",
                "16",
                "--format",
                "q4_0",
                "--cleanup",
            ]
        )
        == 0
    )
    import json

    rep = json.loads(capsys.readouterr().out)
    assert rep["metrics"]["serializer_vs_blocks_mismatches"] == 0 and rep["format"] == "q4_0"
    assert not list(tmp_path.glob("kv*.zarr"))
