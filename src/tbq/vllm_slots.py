"""vLLM's TurboQuant KV-cache slots: the four ``--kv-cache-dtype turboquant_*`` presets, byte for byte.

docs/formats-vllm.md, "Slots". One slot is one (token, kv-head): the key part
(``KP`` bytes: FP8 E4M3 bytes, or indices then the fp16 norm), the value part
(``VP`` bytes: codes, fp16 scale, fp16 minimum), and one pad byte when
``KP + VP`` is odd (vLLM allocates ``S_al``, ``S`` rounded up to even). vLLM's
store kernel never writes the pad byte; tbq writes 0 there and ignores it when
decoding. The presets are data (:data:`tbq.formats.vllm_turboquant.PRESETS`):
their key and value formats are tbq formats (``fp8_e4m3`` with scale 1 and
saturation for ``turboquant_k8v4``; ``vllm_tq4_k`` / ``vllm_tq3_k`` and
``vllm_tq4_v`` / ``vllm_tq3_v``), so every byte here is a codec's.

``layout="qgroup4"`` is vLLM's page-plane layout of ``turboquant_4bit_nc`` and
``turboquant_k3v4_nc`` (used when 4 query heads share a kv-head): the same
bytes of each page (cache block) rearranged into a key-index plane, a
value-code plane and 6 metadata bytes per slot; the array keeps the shape of
vLLM's kernel view ``(num_blocks, block_size, num_kv_heads, S_al)``.

>>> slot_bytes("turboquant_4bit_nc", 128), slot_bytes("turboquant_k8v4", 64)
((134, 134), (100, 100))
>>> k = np.linspace(-2, 2, 256, dtype=np.float32).reshape(2, 128)
>>> s = encode_slots(k, k, "turboquant_3bit_nc", backend="numpy")
>>> s.shape, s.dtype
((2, 102), dtype('uint8'))
>>> yk, yv = decode_slots(s, "turboquant_3bit_nc", head_dim=128, backend="numpy")
>>> float(yv[0, 0]), float(yv[1, -1])
(-2.0, 2.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .codecs import Codec, get_codec
from .errors import BlockShapeError, ConfigError, EncodedLengthError, TbqTypeError
from .formats import takes_option
from .formats.vllm_turboquant import PRESETS, Preset

__all__ = [
    "PRESET_NAMES",
    "preset",
    "slot_bytes",
    "encode_slots",
    "decode_slots",
    "to_qgroup4",
    "from_qgroup4",
    "vector_set",
]

#: vLLM's ``--kv-cache-dtype`` names of the TurboQuant presets.
PRESET_NAMES = tuple(PRESETS)
LAYOUTS = ("standard", "qgroup4")


def preset(name: str) -> Preset:
    """The preset ``name`` (one of :data:`PRESET_NAMES`).

    >>> preset("turboquant_k3v4_nc").key, preset("turboquant_k3v4_nc").value
    ('vllm_tq3_k', 'vllm_tq4_v')
    """
    p = PRESETS.get(name) if isinstance(name, str) else None
    if p is None:
        raise ConfigError(f"unknown vLLM TurboQuant preset {name!r}; the presets: {', '.join(PRESET_NAMES)}")
    return p


def _check_head_dim(p: Preset, head_dim: object) -> int:
    """``head_dim`` checked by the preset's two formats (a power of two for the MSE keys)."""
    if not isinstance(head_dim, (int, np.integer)) or isinstance(head_dim, bool):
        raise ConfigError(f"{p.name}: head_dim must be an integer, got {head_dim!r}")
    for name in (p.key, p.value):
        if takes_option(name, "head_dim"):
            get_codec(name, head_dim=int(head_dim), backend="numpy")  # the format's own check and message
    return int(head_dim)


def slot_bytes(preset_name: str, head_dim: int) -> tuple[int, int]:
    """``(S, S_al)``: the bytes a slot's fields take and the bytes vLLM allocates per slot (``S`` rounded up to even).

    >>> [slot_bytes(p, 128) for p in PRESET_NAMES]
    [(196, 196), (134, 134), (118, 118), (102, 102)]
    """
    p = preset(preset_name)
    d = _check_head_dim(p, head_dim)
    s = p.key_bytes(d) + p.value_bytes(d)
    return s, s + s % 2


def _codecs(p: Preset, head_dim: int, backend: str | None, key_options: dict[str, Any]) -> tuple[Codec, Codec]:
    kopt = {**dict(p.key_options), **key_options}
    vopt: dict[str, Any] = {}
    if takes_option(p.key, "head_dim"):
        kopt["head_dim"] = head_dim
    if takes_option(p.value, "head_dim"):
        vopt["head_dim"] = head_dim
    kc = get_codec(p.key, backend=backend, on_overflow=p.key_overflow, **kopt)
    vc = get_codec(p.value, backend=backend, on_overflow=p.value_overflow, **vopt)
    return kc, vc


def _float_input(a: ArrayLike, what: str, p: Preset) -> NDArray[Any]:
    x = np.asarray(a)
    if x.dtype.name == "bfloat16":  # ml_dtypes' bfloat16 (the model dtype): exact in float32
        x = x.astype(np.float32)
    if x.dtype.kind != "f" or x.dtype.itemsize not in (2, 4, 8):
        raise TbqTypeError(
            f"{p.name}: {what} must be float16, bfloat16, float32 or float64 (the model's keys and values), got dtype {x.dtype}"
        )
    if x.ndim == 0:
        raise BlockShapeError(f"{p.name}: {what} must have a last axis of head_dim values, got a scalar")
    return x


def _check_layout(p: Preset, layout: str, shape: tuple[int, ...], what: str) -> None:
    if layout not in LAYOUTS:
        raise ConfigError(f"{p.name}: layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "qgroup4":
        if not p.qgroup4:
            raise ConfigError(
                f"{p.name}: vLLM has the qgroup4 page layout only for turboquant_4bit_nc and turboquant_k3v4_nc"
            )
        if len(shape) != 4:
            raise BlockShapeError(
                f"{p.name}: layout='qgroup4' takes the cache's {what} as (num_blocks, block_size, num_kv_heads, ...), "
                f"got shape {shape}"
            )


def encode_slots(
    k: ArrayLike,
    v: ArrayLike,
    preset_name: str,
    *,
    head_dim: int | None = None,
    layout: str = "standard",
    backend: str | None = None,
    **key_options: Any,
) -> NDArray[np.uint8]:
    """vLLM's slots of keys ``k`` and values ``v`` (float, same shape ``(..., head_dim)``): uint8 ``(..., S_al)``.

    ``head_dim``, when given, must be the last axis. ``key_options`` go to the
    key format (``rotation="pr38479", layer=2`` for PR #38479's per-layer
    signs). ``layout="qgroup4"``: ``k`` and ``v`` are a whole cache,
    ``(num_blocks, block_size, num_kv_heads, head_dim)``, and each block's
    bytes are in vLLM's page-plane order (:func:`to_qgroup4`). Finite input
    only; what does not fit is stored as vLLM stores it (FP8 keys saturate,
    an fp16 norm, scale or minimum beyond 65504 becomes inf).
    """
    p = preset(preset_name)
    kx, vx = _float_input(k, "k", p), _float_input(v, "v", p)
    if kx.shape != vx.shape:
        raise BlockShapeError(f"{p.name}: k and v must have the same shape, got {kx.shape} and {vx.shape}")
    d = kx.shape[-1]
    if head_dim is not None and head_dim != d:
        raise BlockShapeError(f"{p.name}: head_dim={head_dim!r} but the last axis of k and v has {d} values")
    d = _check_head_dim(p, d)
    _check_layout(p, layout, kx.shape, "keys")
    kc, vc = _codecs(p, d, backend, key_options)
    s, s_al = slot_bytes(p.name, d)
    kp = kc.info.row_bytes(d)
    out = np.zeros(kx.shape[:-1] + (s_al,), np.uint8)
    out[..., :kp] = kc.encode(kx)
    out[..., kp:s] = vc.encode(vx)
    return to_qgroup4(out, p.name, d) if layout == "qgroup4" else out


def decode_slots(
    slots: ArrayLike,
    preset_name: str,
    *,
    head_dim: int,
    layout: str = "standard",
    rotated_keys: bool = False,
    backend: str | None = None,
    **key_options: Any,
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """``(yk, yv)``, float32 ``(..., head_dim)`` each, of uint8 slots ``(..., S_al)``: vLLM's ``_tq_full_dequant_kv``.

    ``yk`` is the key in the model's domain (vLLM's un-rotation, its exact sum
    rounded once to fp16); ``rotated_keys=True`` gives ``yk_rot``, the MSE
    presets' key in the rotated domain (FP8 keys have none: the same values).
    Every value is an fp16 value. The pad byte is not read.
    """
    p = preset(preset_name)
    data = np.asarray(slots)
    if data.dtype != np.uint8:
        raise TbqTypeError(f"{p.name}: slots must be uint8, got dtype {data.dtype}")
    d = _check_head_dim(p, head_dim)
    s, s_al = slot_bytes(p.name, d)
    if data.ndim == 0 or data.shape[-1] != s_al:
        n = data.shape[-1] if data.ndim else 0
        raise EncodedLengthError(f"{p.name}: a slot at head_dim {d} is {s_al} bytes, but the last axis has {n}")
    _check_layout(p, layout, data.shape, "slots")
    if layout == "qgroup4":
        data = from_qgroup4(data, p.name, d)
    kc, vc = _codecs(p, d, backend, key_options)
    kp = kc.info.row_bytes(d)
    kdata = np.ascontiguousarray(data[..., :kp])
    rot = getattr(kc.format, "decode_rotated", None) if rotated_keys else None
    yk = rot(kdata, backend=kc.backend) if rot is not None else kc.decode(kdata)
    return yk, vc.decode(np.ascontiguousarray(data[..., kp:s]))


def vector_set(
    x: ArrayLike,
    preset_name: str,
    *,
    layout: str = "standard",
    backend: str | None = None,
    **key_options: Any,
) -> dict[str, NDArray[Any]]:
    """Golden arrays of rows ``x`` (each row a key and its value, the conformance files' convention) named as the
    SPEC's vector files: ``q`` (the slots, in ``layout``), ``yk``, ``yk_rot``, ``yv``; for the MSE presets also
    ``y_rot`` and ``knorm`` (the float32 rotated unit key and norm), ``centroids``, ``midpoints`` and ``signs``.
    ``np.savez(path, **vector_set(...))`` writes a file a kernel's test can read at any head_dim.

    >>> v = vector_set(np.ones((2, 64), np.float32), "turboquant_3bit_nc", backend="numpy")
    >>> v["q"].shape, v["centroids"].size, float(v["knorm"][0])
    ((2, 54), 8, 8.0)
    """
    p = preset(preset_name)
    xa = np.asarray(x)
    q = encode_slots(xa, xa, p.name, layout=layout, backend=backend, **key_options)
    d = xa.shape[-1]
    yk, yv = decode_slots(q, p.name, head_dim=d, layout=layout, backend=backend, **key_options)
    yk_rot = decode_slots(q, p.name, head_dim=d, layout=layout, rotated_keys=True, backend=backend, **key_options)[0]
    out: dict[str, NDArray[Any]] = {"q": q, "yk": yk, "yk_rot": yk_rot, "yv": yv}
    kc = _codecs(p, d, backend, key_options)[0]
    rotate = getattr(kc.format, "rotate", None)
    if rotate is not None:  # the MSE keys: the encoder's float32 intermediates and tables
        rows = np.ascontiguousarray(_float_input(xa, "x", p), np.float32).reshape(-1, d)
        knorm, y_rot = rotate(rows)
        t = kc.format.tables()
        out.update(
            y_rot=y_rot.reshape(xa.shape),
            knorm=knorm.reshape(xa.shape[:-1]),
            centroids=t["centroids"],
            midpoints=t["thresholds"],
            signs=t["signs"].astype(np.float32),
        )
    return out


def _planes(p: Preset, head_dim: int) -> tuple[int, int, int, int]:
    """``(MB, KP, VDB, S_al)``: key-index bytes, key part, value-code bytes, slot."""
    kp, vp = p.key_bytes(head_dim), p.value_bytes(head_dim)
    s = kp + vp
    return kp - 2, kp, vp - 4, s + s % 2


def to_qgroup4(slots: ArrayLike, preset_name: str, head_dim: int) -> NDArray[np.uint8]:
    """Standard slots ``(num_blocks, block_size, num_kv_heads, S_al)`` in vLLM's qgroup4 page-plane order.

    Within the page of block ``b`` (``Hk * BS * S_al`` bytes, ``P`` its first): key-index byte ``j`` of
    (head ``h``, position ``p``) at ``P + h*MB*BS + j*BS + p``; value-code byte ``j`` at
    ``P + Hk*MB*BS + h*VDB*BS + j*BS + p``; the 6 bytes [fp16 norm, fp16 scale, fp16 zero] at
    ``P + Hk*(MB+VDB)*BS + (p*Hk + h)*6``; the page's last ``Hk*BS*(S_al - S)`` bytes are pad (0).

    >>> s = np.arange(2 * 16 * 1 * 134, dtype=np.int64).astype(np.uint8).reshape(2, 16, 1, 134)
    >>> q = to_qgroup4(s, "turboquant_4bit_nc", 128)
    >>> int(q.reshape(2, -1)[0, 16]) == int(s[0, 0, 0, 1]), bool((from_qgroup4(q, "turboquant_4bit_nc", 128) == s).all())
    (True, True)
    """
    p = preset(preset_name)
    a = np.asarray(slots)
    _check_qgroup4(p, a, head_dim)
    mb, kp, vdb, s_al = _planes(p, head_dim)
    nb, bs, hk, _ = a.shape
    page = np.zeros((nb, hk * bs * s_al), np.uint8)
    k_end, v_end = hk * mb * bs, hk * (mb + vdb) * bs
    page[:, :k_end] = a[..., :mb].transpose(0, 2, 3, 1).reshape(nb, -1)
    page[:, k_end:v_end] = a[..., kp : kp + vdb].transpose(0, 2, 3, 1).reshape(nb, -1)
    meta = np.concatenate([a[..., mb:kp], a[..., kp + vdb : kp + vdb + 4]], axis=-1)  # norm, scale, zero
    page[:, v_end : v_end + bs * hk * 6] = meta.reshape(nb, -1)
    return page.reshape(a.shape)


def from_qgroup4(slots: ArrayLike, preset_name: str, head_dim: int) -> NDArray[np.uint8]:
    """The inverse of :func:`to_qgroup4`: standard slots (pad bytes 0) from a qgroup4 cache of the same shape."""
    p = preset(preset_name)
    a = np.asarray(slots)
    _check_qgroup4(p, a, head_dim)
    mb, kp, vdb, s_al = _planes(p, head_dim)
    nb, bs, hk, _ = a.shape
    page = a.reshape(nb, -1)
    out = np.zeros(a.shape, np.uint8)
    k_end, v_end = hk * mb * bs, hk * (mb + vdb) * bs
    out[..., :mb] = page[:, :k_end].reshape(nb, hk, mb, bs).transpose(0, 3, 1, 2)
    out[..., kp : kp + vdb] = page[:, k_end:v_end].reshape(nb, hk, vdb, bs).transpose(0, 3, 1, 2)
    meta = page[:, v_end : v_end + bs * hk * 6].reshape(nb, bs, hk, 6)
    out[..., mb:kp] = meta[..., :2]
    out[..., kp + vdb : kp + vdb + 4] = meta[..., 2:]
    return out


def _check_qgroup4(p: Preset, a: NDArray[Any], head_dim: int) -> None:
    if a.dtype != np.uint8:
        raise TbqTypeError(f"{p.name}: slots must be uint8, got dtype {a.dtype}")
    _check_layout(p, "qgroup4", a.shape, "slots")
    s_al = slot_bytes(p.name, head_dim)[1]
    if a.shape[-1] != s_al:
        raise EncodedLengthError(
            f"{p.name}: a slot at head_dim {head_dim} is {s_al} bytes, but the last axis has {a.shape[-1]}"
        )
