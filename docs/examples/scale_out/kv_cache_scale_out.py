#!/usr/bin/env python
"""Store and study a synthetic KV cache bigger than RAM with Zarr + Dask + tbq.

Three passes, each with bounded memory (a few chunks in flight):

1. **generate**: write a float32 Zarr array ``kv.zarr`` of shape
   ``tokens x layers x heads x head_dim`` chunk by chunk (keys with outlier
   channels; every chunk seeded by its chunk index, so the data is
   reproducible and never exists in RAM as a whole).
2. **quantize**: read ``kv.zarr`` once and, in the same Dask graph, write
   * ``kv.<fmt>.blocks.zarr``: the raw uint8 blocks of ``tbq.dask.quantize``
     (the bytes a kernel would read; the codec config is in the attributes), and
   * ``kv.<fmt>.zarr``: a float32 Zarr array stored with the tbq Zarr 3
     serializer (``tbq.numcodecs.zarr_codec``), i.e. compressed storage that
     reads back as ``dequantize(quantize(x))``.
3. **metrics**: read everything back from disk and compute NMSE, SNR and max
   abs error of the blocks against the original chunk by chunk
   (``tbq.dask.error_metrics``), and count float32 values where the
   serializer-stored array differs from ``tbq.dask.dequantize`` of the blocks
   (expected: 0).

Usage (the numbers in docs/scale-out.md come from the first line)::

    python kv_cache_scale_out.py --root /tmp/kv --tokens 32768   # 4 GiB float32
    python kv_cache_scale_out.py --root /tmp/kv --tokens 512 --layers 4   # quick

Prints a JSON report: shapes, bytes on disk, per-pass wall time and peak RSS
(``VmHWM`` from /proc, reset between passes where Linux allows it), the
process-wide ``ru_maxrss`` (self and children) and the metrics. ``--cleanup``
deletes the stores at the end. ``tests/test_dask.py`` runs :func:`run` on a
small array.

Progress goes to stderr, so stdout stays the JSON report: one line per pass,
and on the local schedulers a Dask progress bar for any computation longer
than a second. It is shown only when stderr is a terminal; ``--quiet``
turns it off.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import sys
import time
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import zarr

import tbq
import tbq.dask
import tbq.numcodecs
from tbq.progress import stderr_is_terminal
from tbq.units import format_bytes

OUTLIER_CHANNELS = (5, 37, 64, 111)


# ---------------------------------------------------------------------------
# memory measurement (stdlib only)
# ---------------------------------------------------------------------------


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset VmHWM (peak RSS) to the current RSS (Linux >= 4.0); False when not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _mib(kib) -> float | None:
    return None if kib is None else round(kib / 1024, 1)


class Phase:
    """Context manager measuring wall time and peak RSS of one pass."""

    def __init__(self, name: str, report: dict):
        self.name, self.report = name, report

    def __enter__(self):
        self.reset = _reset_peak()
        self.rss0 = _status_kib("VmRSS")
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        dt = time.perf_counter() - self.t0
        self.report.setdefault("phases", {})[self.name] = {
            "seconds": round(dt, 2),
            "rss_start_mib": _mib(self.rss0),
            "peak_rss_mib": _mib(_status_kib("VmHWM")),
            "peak_is_per_phase": self.reset,
        }
        return False


@contextlib.contextmanager
def announce(text: str, *, show: bool, bar: bool):
    """Progress of one pass on stderr: ``text``, then a Dask progress bar (``bar``) or the time taken."""
    if not show:
        yield
        return
    t0 = time.perf_counter()
    print(text, file=sys.stderr, flush=True)
    if bar:  # dask.diagnostics works with the local schedulers only
        from dask.diagnostics import ProgressBar

        with ProgressBar(minimum=1.0, dt=0.5, out=sys.stderr):
            yield
    else:
        yield
        print(f"  done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# the three passes
# ---------------------------------------------------------------------------


def _synthetic_chunk(block_info=None, *, seed: int, dtype=np.float32):
    """One chunk of keys with outlier channels, seeded by the chunk's position."""
    info = block_info[None]
    shape = info["chunk-shape"]
    rng = np.random.default_rng([seed, *info["chunk-location"]])
    x = rng.standard_normal(shape, dtype=np.float32)
    ch = [c for c in OUTLIER_CHANNELS if c < shape[-1]]
    x[..., ch] *= np.float32(20.0)
    return x


def synthetic_kv(shape, chunks, seed: int = 0):
    """A lazy Dask array of synthetic keys; no chunk exists until computed."""
    return da.map_blocks(
        _synthetic_chunk,
        seed=seed,
        chunks=da.core.normalize_chunks(chunks, shape),
        dtype=np.float32,
        meta=np.empty((0,) * len(shape), np.float32),
    )


def generate(root: Path, shape, chunks, seed: int = 0) -> zarr.Array:
    src = zarr.create_array(
        store=root / "kv.zarr",
        shape=shape,
        chunks=chunks,
        dtype="float32",
        compressors=None,
        dimension_names=("token", "layer", "head", "dim"),
        attributes={"seed": seed, "generator": "keys with outlier channels x20"},
        overwrite=True,
    )
    da.store(synthetic_kv(shape, chunks, seed), src, lock=False)
    return src


def quantize(root: Path, fmt: str, **config) -> tuple[zarr.Array, zarr.Array]:
    x = da.from_zarr(zarr.open_array(root / "kv.zarr", mode="r"))
    q = tbq.dask.quantize(x, fmt, **config)
    codec_cfg = tbq.get_codec(fmt, **config).get_config()
    blocks = zarr.create_array(
        store=root / f"kv.{fmt}.blocks.zarr",
        shape=q.shape,
        chunks=tuple(c[0] for c in q.chunks),
        dtype="uint8",
        compressors=None,
        attributes={"tbq_codec": codec_cfg, "float_shape": list(x.shape)},
        overwrite=True,
    )
    stored = zarr.create_array(
        store=root / f"kv.{fmt}.zarr",
        shape=x.shape,
        chunks=tuple(c[0] for c in x.chunks),
        dtype="float32",
        serializer=tbq.numcodecs.zarr_codec(fmt, **config),
        compressors=None,
        overwrite=True,
    )
    # one graph: the input chunks are read once and feed both stores
    da.store([q, x], [blocks, stored], lock=False)
    return blocks, stored


def metrics(root: Path, fmt: str, **config) -> dict:
    x = da.from_zarr(zarr.open_array(root / "kv.zarr", mode="r"))
    q = da.from_zarr(zarr.open_array(root / f"kv.{fmt}.blocks.zarr", mode="r"))
    y = tbq.dask.dequantize(q, fmt, **config)
    s = da.from_zarr(zarr.open_array(root / f"kv.{fmt}.zarr", mode="r"))
    m = tbq.dask.error_metrics(x, y, compute=False)
    mismatches = (s.view(np.uint32) != y.view(np.uint32)).sum()
    m, mismatches = dask.compute(m, mismatches)
    m["serializer_vs_blocks_mismatches"] = int(mismatches)
    return m


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(
    root,
    *,
    tokens=32768,
    layers=32,
    heads=8,
    head_dim=128,
    chunk_tokens=1024,
    chunk_layers=4,
    fmt="tbq4_0",
    seed=0,
    scheduler="threads",
    workers=2,
    cleanup=False,
    progress=None,
    **config,
) -> dict:
    """Run the three passes under ``root`` and return the report dict.

    ``progress``: report each pass on stderr (``None``: only when stderr is a terminal).
    """
    show = stderr_is_terminal() if progress is None else bool(progress)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    shape = (tokens, layers, heads, head_dim)
    chunks = (min(chunk_tokens, tokens), min(chunk_layers, layers), heads, head_dim)
    report = {
        "shape": list(shape),
        "chunks": list(chunks),
        "format": fmt,
        "float32_bytes": int(np.prod(shape)) * 4,
        "scheduler": scheduler,
        "workers": workers,
        "machine": {
            "cpus": os.cpu_count(),
            "mem_total_gib": _mem_total_gib(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "dask": dask.__version__,
            "zarr": zarr.__version__,
            "tbq": tbq.__version__,
        },
        "rss_after_imports_mib": _mib(_status_kib("VmRSS")),
    }
    cluster = client = None
    if scheduler == "distributed":
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=1, threads_per_worker=workers, processes=False, dashboard_address=None)
        client = Client(cluster)
        ctx = dask.config.set(scheduler=client)
    else:
        ctx = dask.config.set(scheduler=scheduler, num_workers=workers)
    nbytes = report["float32_bytes"]
    n_chunks = int(np.prod([-(-s // c) for s, c in zip(shape, chunks, strict=True)]))
    bar = scheduler != "distributed"
    try:
        with ctx:
            with (
                Phase("generate", report),
                announce(
                    f"[1/3] generate: write {format_bytes(nbytes)} of float32 in {n_chunks} chunk{'s' if n_chunks != 1 else ''}"
                    f" to {root / 'kv.zarr'}",
                    show=show,
                    bar=bar,
                ),
            ):
                generate(root, shape, chunks, seed)
            with (
                Phase("quantize_and_store", report),
                announce(
                    f"[2/3] quantize_and_store: read {format_bytes(nbytes)}, write {fmt} blocks and the serializer array"
                    " (the first run also compiles the numba kernels)",
                    show=show,
                    bar=bar,
                ),
            ):
                quantize(root, fmt, **config)
            with (
                Phase("metrics_from_disk", report),
                announce(
                    "[3/3] metrics_from_disk: read everything back, NMSE / SNR / max error and mismatches",
                    show=show,
                    bar=bar,
                ),
            ):
                report["metrics"] = metrics(root, fmt, **config)
    finally:
        if client is not None:
            client.close()
            cluster.close()
    report["bytes_on_disk"] = {p.name: _du(p) for p in sorted(root.glob("kv*.zarr"))}
    ru_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ru_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    report["ru_maxrss_mib"] = {"self": _mib(ru_self), "children": _mib(ru_children)}
    report["total_seconds"] = round(sum(p["seconds"] for p in report["phases"].values()), 2)
    if cleanup:
        for p in root.glob("kv*.zarr"):
            shutil.rmtree(p)
    return report


def _mem_total_gib():
    try:
        with open("/proc/meminfo") as f:
            return round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--root", required=True, help="directory for the Zarr stores")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--chunk-tokens", type=int, default=1024)
    p.add_argument("--chunk-layers", type=int, default=4)
    p.add_argument("--format", default="tbq4_0", choices=tbq.format_names())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scheduler", default="threads", choices=("threads", "sync", "distributed"))
    p.add_argument(
        "--workers", type=int, default=2, help="threads (threads scheduler) or threads of the one local worker"
    )
    p.add_argument("--cleanup", action="store_true", help="delete the stores at the end")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr (shown only on a terminal anyway)")
    a = p.parse_args(argv)
    report = run(
        a.root,
        tokens=a.tokens,
        layers=a.layers,
        heads=a.heads,
        head_dim=a.head_dim,
        chunk_tokens=a.chunk_tokens,
        chunk_layers=a.chunk_layers,
        fmt=a.format,
        seed=a.seed,
        scheduler=a.scheduler,
        workers=a.workers,
        cleanup=a.cleanup,
        progress=False if a.quiet else None,
    )
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
