"""Dask arrays: block quantization and error metrics chunk by chunk (optional extra ``zarr``).

:func:`quantize` and :func:`dequantize` map :func:`tbq.quantize` /
:func:`tbq.dequantize` over the chunks of a Dask array, so a KV cache larger
than memory (for example ``dask.array.from_zarr`` of an on-disk store) is
processed a few chunks at a time, on any Dask scheduler. The bytes are those of
the in-memory functions: blocks never straddle a chunk because the chunks are
aligned to whole blocks along the last axis.

:func:`error_metrics` reduces NMSE, SNR and max abs error over a whole array
from per-chunk partial sums (sum of squared error, sum of squares, max abs
error), never materialising either array.

Nothing here is imported by ``import tbq``: dask is an optional dependency.

>>> import numpy as np, dask.array as da, tbq.dask
>>> x = da.from_array(np.linspace(-1, 1, 4 * 256, dtype=np.float32).reshape(4, 256), chunks=(2, 128))
>>> q = tbq.dask.quantize(x, "q8_0")
>>> q.dtype, q.shape, q.chunks
(dtype('uint8'), (4, 272), ((2, 2), (136, 136)))
>>> y = tbq.dask.dequantize(q, "q8_0")
>>> round(tbq.dask.error_metrics(x, y)["snr_db"], 1)
52.6
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

try:
    import dask.array as da
    import dask.base
    from dask.delayed import delayed
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tbq.dask needs the optional dependency dask[array]; install it with `pip install 'tbq[zarr]'`"
    ) from _exc

from .codecs import Codec, codec_from_config, get_codec, partial_blocks
from .errors import BlockShapeError, EncodedLengthError, TbqTypeError, TbqValueError
from .parallel import fork_safe_lock

__all__ = ["quantize", "dequantize", "error_metrics", "aligned_chunks"]

#: Values per step inside one chunk of :func:`error_metrics` (bounds float64 temporaries to ~24 MiB).
METRICS_STEP = 1 << 20

_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

_cache_lock = fork_safe_lock()
_codec_cache: dict[str, Codec] = {}


def _codec(cfg_json: str) -> Codec:
    """The codec of a JSON config, built once per process (workers rebuild it from plain data)."""
    c = _codec_cache.get(cfg_json)
    if c is None:
        c = codec_from_config(json.loads(cfg_json))
        with _cache_lock:
            _codec_cache.setdefault(cfg_json, c)
    return c


def _prepare_codec(fmt: str, config: dict[str, Any]) -> tuple[Codec, str]:
    config = dict(config)
    # Dask runs chunks in parallel already; one codec thread per chunk avoids oversubscription.
    config.setdefault("threads", 1)
    codec = get_codec(fmt, **config)
    return codec, json.dumps(codec.get_config(), sort_keys=True)


def aligned_chunks(chunks: Any, unit: int) -> int | None:
    """``None`` when every chunk is a multiple of ``unit``, else a chunk size to rechunk to.

    The proposal is the largest chunk rounded down to a multiple of ``unit`` (at
    least ``unit``), so chunk memory stays about the same.

    >>> aligned_chunks((128, 128, 64), 32) is None
    True
    >>> aligned_chunks((100, 100, 56), 32)
    96
    """
    if all(c % unit == 0 for c in chunks):
        return None
    return max(unit, max(chunks) // unit * unit)


def _as_dask(x: Any) -> Any:
    return x if isinstance(x, da.Array) else da.asarray(x)


def _last_axis_chunks(arr: Any, unit: int, rechunk: bool, what: str, fmt: str, error: Any = BlockShapeError) -> Any:
    last = arr.chunks[-1]
    target = aligned_chunks(last, unit)
    if target is None:
        return arr
    bad = sorted({c for c in last if c % unit})
    if not rechunk:
        raise error(
            f"tbq.dask {fmt}: the last-axis chunks {last} are not all multiples of the {what} {unit} "
            f"(offending sizes: {bad}); blocks cannot straddle chunks. Rechunk first, e.g. "
            f"arr.rechunk({{-1: {target}}}), or pass rechunk=True"
        )
    return arr.rechunk({arr.ndim - 1: target})


def _encode_block(x: Any, cfg_json: Any) -> Any:
    return _codec(cfg_json).encode(x)


def _decode_block(q: Any, cfg_json: Any) -> Any:
    return _codec(cfg_json).decode(q)


def quantize(darr: Any, fmt: str, *, rechunk: bool = True, **config: Any) -> Any:
    """Encode a float Dask array chunk by chunk; returns a uint8 Dask array.

    Parameters
    ----------
    darr : dask.array.Array or array-like
        float16/float32/float64 values, the last axis a multiple of the block size.
    fmt : str
        A format name (:func:`tbq.formats`), e.g. ``"q8_0"`` or ``"tbq4_0"``.
    rechunk : bool
        When the last-axis chunks are not whole blocks, rechunk them to
        multiples of the block size (default), or raise
        :class:`tbq.BlockShapeError` naming the chunk sizes (``rechunk=False``).
    **config
        Core codec configuration (see :func:`tbq.get_codec`). ``threads``
        defaults to 1 here, since Dask already runs chunks in parallel.

    Returns
    -------
    dask.array.Array
        The result has shape ``darr.shape[:-1] + (n // block_size * type_size,)``,
        the leading chunks of ``darr`` and last-axis chunks
        ``c // block_size * type_size``; its bytes equal ``tbq.quantize(darr.compute(), fmt)``.
    """
    return _map_codec(darr, fmt, rechunk, config, "values")


def dequantize(qarr: Any, fmt: str, *, rechunk: bool = True, **config: Any) -> Any:
    """Decode a uint8 Dask array of blocks chunk by chunk; returns a float32 Dask array.

    ``qarr``'s last axis must be a multiple of the type size; its last-axis
    chunks are rechunked to whole blocks unless ``rechunk=False``, which raises
    :class:`tbq.EncodedLengthError` (a :class:`tbq.BlockShapeError`) naming them.
    The result equals ``tbq.dequantize(qarr.compute(), fmt)`` bit for bit.
    """
    return _map_codec(qarr, fmt, rechunk, config, "bytes")


def _map_codec(arr: Any, fmt: str, rechunk: bool, config: dict[str, Any], unit: str) -> Any:
    """:func:`quantize` (``unit`` "values") or :func:`dequantize` (``unit`` "bytes") of ``arr``: the input checked,
    its last-axis chunks made whole blocks, and the codec mapped over the chunks."""
    a = _as_dask(arr)
    codec, cfg_json = _prepare_codec(fmt, config)
    encoding = unit == "values"
    func = "quantize" if encoding else "dequantize"
    if encoding and a.dtype not in _FLOATS:
        raise TbqTypeError(f"tbq.dask.quantize: input must be float16/float32/float64, got dtype {a.dtype}")
    if not encoding and a.dtype != np.uint8:
        raise TbqTypeError(f"tbq.dask.dequantize: encoded data must be uint8, got dtype {a.dtype}")
    error = BlockShapeError if encoding else EncodedLengthError
    if a.ndim == 0:
        what = "input" if encoding else "encoded data"
        raise error(f"tbq.dask.{func}: {what} must have at least one axis, got a 0-d array")
    bs, ts = codec.block_size, codec.type_size
    size_in, size_out = (bs, ts) if encoding else (ts, bs)
    problem = partial_blocks(a.shape[-1], size_in, unit)
    if problem:
        raise error(f"tbq.dask.{func} {fmt}: {problem}" + ("; no rechunking can fix that" if encoding else ""))
    a = _last_axis_chunks(a, size_in, rechunk, "block size" if encoding else "type size (bytes per block)", fmt, error)
    out_dtype = np.uint8 if encoding else np.float32
    return da.map_blocks(
        _encode_block if encoding else _decode_block,
        a,
        cfg_json,
        dtype=out_dtype,
        chunks=a.chunks[:-1] + (tuple(c // size_in * size_out for c in a.chunks[-1]),),
        meta=np.empty((0,) * a.ndim, out_dtype),
        name=f"tbq-{func}-{codec.name}-" + dask.base.tokenize(a, cfg_json),
    )


# ---------------------------------------------------------------------------
# Error metrics
# ---------------------------------------------------------------------------


def _block_stats(x: Any, y: Any) -> Any:
    """``[sum (y-x)^2, sum x^2, max |y-x|, count]`` of one chunk pair, float64, in bounded steps."""
    xf = x.reshape(-1)
    yf = y.reshape(-1)
    sse = np.float64(0.0)
    ss = np.float64(0.0)
    mx = np.float64(0.0)
    for s in range(0, xf.size, METRICS_STEP):
        xs = xf[s : s + METRICS_STEP].astype(np.float64)
        d = yf[s : s + METRICS_STEP].astype(np.float64)
        d -= xs
        # einsum, not np.dot: BLAS ddot spawns its own threads and crawls under Dask's
        sse += np.einsum("i,i->", d, d)
        ss += np.einsum("i,i->", xs, xs)
        np.abs(d, out=d)
        mx = np.maximum(mx, d.max())  # propagates NaN like tbq.metrics.max_abs_error
    return np.array([sse, ss, mx, xf.size], np.float64).reshape((1,) * x.ndim + (4,))


def _finalize(sse: Any, ss: Any, mx: Any, count: Any) -> dict[str, Any]:
    sse, ss, mx, count = float(sse), float(ss), float(mx), int(count)
    if ss == 0.0:
        nmse = 0.0 if sse == 0.0 else float("inf")
    else:
        nmse = sse / ss
    snr = float("inf") if nmse == 0.0 else float(-10.0 * np.log10(nmse))
    return {
        "nmse": nmse,
        "snr_db": snr,
        "max_abs_error": mx,
        "sum_squared_error": sse,
        "sum_squares": ss,
        "count": count,
    }


def error_metrics(x: Any, y: Any, *, compute: bool = True) -> Any:
    """NMSE, SNR (dB) and max abs error of reconstruction ``y`` against reference ``x``, chunk by chunk.

    Same definitions as :mod:`tbq.metrics` (float64 arithmetic): ``nmse =
    sum((y-x)**2) / sum(x**2)``, ``snr_db = -10 log10(nmse)``, ``max_abs_error =
    max |y-x|``. Each chunk pair contributes a partial sum of squared error,
    sum of squares and max abs error (computed in steps of
    :data:`METRICS_STEP` values); the partials are combined by a tree
    reduction, so neither array is ever held whole. Results agree with the
    in-memory functions to float64 rounding (the summation order differs);
    ``max_abs_error`` is exact.

    Returns a dict with ``nmse``, ``snr_db``, ``max_abs_error``,
    ``sum_squared_error``, ``sum_squares`` and ``count``; with
    ``compute=False`` a :class:`dask.delayed.Delayed` producing it, so it can
    be computed together with, e.g., a ``da.store`` of the quantized array
    (one pass over the input).
    """
    x = _as_dask(x)
    y = _as_dask(y)
    if x.shape != y.shape:
        raise TbqValueError(f"reference and reconstruction shapes differ: {x.shape} vs {y.shape}")
    if x.ndim == 0:
        x, y = x[None], y[None]
    if x.size == 0:
        res = _finalize(0.0, 0.0, 0.0, 0)
        return res if compute else delayed(res)
    if y.chunks != x.chunks:
        y = y.rechunk(x.chunks)
    stats = da.map_blocks(
        _block_stats,
        x,
        y,
        new_axis=x.ndim,
        chunks=tuple((1,) * len(c) for c in x.chunks) + ((4,),),
        dtype=np.float64,
        meta=np.empty((0,) * (x.ndim + 1), np.float64),
    )
    sums = stats.sum(axis=tuple(range(x.ndim)))  # [sse, ss, (unused), count]
    mx = stats[..., 2].max()
    # one collection into one delayed call: separate array arguments would each be
    # optimised on their own and the per-chunk statistics computed several times
    agg = da.concatenate([sums, mx[None]])  # [sse, ss, -, count, max]
    out = delayed(_finalize_vector)(agg)
    return out.compute() if compute else out


def _finalize_vector(agg: Any) -> dict[str, Any]:
    return _finalize(agg[0], agg[1], agg[4], agg[3])
