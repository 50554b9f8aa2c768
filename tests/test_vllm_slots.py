"""tbq.vllm_slots: vLLM's TurboQuant slots byte for byte (the SPEC's vectors), sizes, the qgroup4 page layout, and
the boundary checks."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import BACKENDS, assert_bits_equal, assert_bytes_equal, load_npz

import tbq
from tbq.vllm_slots import (
    PRESET_NAMES,
    decode_slots,
    encode_slots,
    from_qgroup4,
    preset,
    slot_bytes,
    to_qgroup4,
    vector_set,
)

ROT = {"rotation": "pr38479", "layer": 2}
MSE = ("turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
VECTORS = [(f"vllm/{p}", p, {}) for p in PRESET_NAMES] + [(f"vllm/{p}__pr38479_signs_layer2", p, ROT) for p in MSE]

#: SPEC section 1: slot bytes S of each preset at D = 64, 128, 256
SIZES = {
    "turboquant_k8v4": (100, 196, 388),
    "turboquant_4bit_nc": (70, 134, 262),
    "turboquant_k3v4_nc": (62, 118, 230),
    "turboquant_3bit_nc": (54, 102, 198),
}


def test_sizes_are_the_specs():
    for name, sizes in SIZES.items():
        assert tuple(slot_bytes(name, d)[0] for d in (64, 128, 256)) == sizes
        assert all(slot_bytes(name, d)[1] == slot_bytes(name, d)[0] for d in (64, 128, 256))  # all even there
    assert slot_bytes("turboquant_k3v4_nc", 8) == (13, 14)  # an odd slot gets vLLM's pad byte
    assert slot_bytes("turboquant_k8v4", 96) == (148, 148)  # FP8 keys and uniform values take any multiple of 8


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stem, name, kopt", VECTORS, ids=[v[0] for v in VECTORS])
def test_vectors_slots_and_decode_bit_for_bit(stem, name, kopt, backend):
    ref = load_npz(stem)
    x = load_npz("inputs")["x"]
    q = encode_slots(x, x, name, head_dim=128, backend=backend, **kopt)
    assert_bytes_equal(q, ref["q"], f"{stem} slots")
    yk, yv = decode_slots(ref["q"], name, head_dim=128, backend=backend, **kopt)
    assert_bits_equal(yk, ref["yk"], f"{stem} yk")
    assert_bits_equal(yv, ref["yv"], f"{stem} yv")
    ykr, yv2 = decode_slots(ref["q"], name, head_dim=128, rotated_keys=True, backend=backend, **kopt)
    assert_bits_equal(ykr, ref["yk_rot"], f"{stem} yk_rot")
    assert_bits_equal(yv2, ref["yv"], f"{stem} yv (rotated call)")


@pytest.mark.parametrize("stem, name, kopt", VECTORS, ids=[v[0] for v in VECTORS])
def test_vector_set_rebuilds_the_files(stem, name, kopt):
    """vector_set on the inputs gives every array of the SPEC's file bit for bit (k8v4's informative y_rot and
    knorm, which its key path never uses, are torch-CPU's and are not part of it)."""
    ref = load_npz(stem)
    got = vector_set(load_npz("inputs")["x"], name, **kopt)
    expected = {"q", "yk", "yk_rot", "yv"} | ({"y_rot", "knorm", "centroids", "midpoints"} if name in MSE else set())
    assert expected <= set(got) and ("signs" in got) == (name in MSE)
    for key in sorted(expected | ({"signs"} & set(ref))):
        if got[key].dtype == np.uint8:
            assert_bytes_equal(got[key], ref[key], f"{stem} {key}")
        else:
            assert_bits_equal(got[key], ref[key], f"{stem} {key}")
    if name in MSE and not kopt:  # vLLM main: no signs
        assert (got["signs"] == 1).all()


def test_pad_byte_is_zero_and_never_read():
    rng = np.random.default_rng(0)
    k = rng.standard_normal((3, 2, 8)).astype(np.float32)
    s = encode_slots(k, k, "turboquant_k3v4_nc", backend="numpy")
    assert s.shape == (3, 2, 14) and (s[..., 13] == 0).all()
    t = s.copy()
    t[..., 13] = 0xAB
    for a, b in zip(
        decode_slots(s, "turboquant_k3v4_nc", head_dim=8),
        decode_slots(t, "turboquant_k3v4_nc", head_dim=8),
        strict=True,
    ):
        assert_bits_equal(a, b, "pad byte ignored")


def test_saturation_and_infinite_fields_are_stored_as_vllm_stores_them():
    k = np.zeros((1, 128), np.float32)
    k[0, :3] = [500.0, -1e6, 448.0]
    s = encode_slots(k, k, "turboquant_k8v4", backend="numpy")
    assert s[0, :3].tolist() == [0x7E, 0xFE, 0x7E]
    big = np.full((1, 128), 6000.0, np.float32)  # key norm 67882 and a value minimum of 6000: the norm is inf
    s = encode_slots(big, big, "turboquant_4bit_nc", backend="numba")
    assert s[0, 64:66].view("<u2")[0] == 0x7C00
    yk, _ = decode_slots(s, "turboquant_4bit_nc", head_dim=128)
    assert not np.isfinite(yk).any()


def test_half_and_bfloat16_inputs_are_exact_upcasts():
    rng = np.random.default_rng(1)
    k = rng.standard_normal((4, 64)).astype(np.float16)
    v = rng.standard_normal((4, 64)).astype(np.float16)
    assert_bytes_equal(
        encode_slots(k, v, "turboquant_4bit_nc"),
        encode_slots(k.astype(np.float32), v.astype(np.float32), "turboquant_4bit_nc"),
    )
    ml = pytest.importorskip("ml_dtypes")
    kb, vb = k.astype(ml.bfloat16), v.astype(ml.bfloat16)
    assert_bytes_equal(
        encode_slots(kb, vb, "turboquant_3bit_nc"),
        encode_slots(kb.astype(np.float32), vb.astype(np.float32), "turboquant_3bit_nc"),
    )


# ---------------------------------------------------------------------------
# qgroup4
# ---------------------------------------------------------------------------


def _page_by_the_formula(slots, name, d):
    """SPEC section 1.2 written as loops: where each byte of each standard slot goes in its block's page."""
    p = preset(name)
    kp, vp = p.key_bytes(d), p.value_bytes(d)
    mb, vdb = kp - 2, vp - 4
    nb, bs, hk, s_al = slots.shape
    out = np.zeros((nb, hk * bs * s_al), np.uint8)
    for b in range(nb):
        for pos in range(bs):
            for h in range(hk):
                sl = slots[b, pos, h]
                for j in range(mb):
                    out[b, h * mb * bs + j * bs + pos] = sl[j]
                for j in range(vdb):
                    out[b, hk * mb * bs + h * vdb * bs + j * bs + pos] = sl[kp + j]
                meta = hk * (mb + vdb) * bs + (pos * hk + h) * 6
                out[b, meta : meta + 6] = np.concatenate([sl[mb:kp], sl[kp + vdb : kp + vdb + 4]])
    return out.reshape(slots.shape)


@pytest.mark.parametrize(
    "name, d", [("turboquant_4bit_nc", 128), ("turboquant_k3v4_nc", 64), ("turboquant_k3v4_nc", 8)]
)
def test_qgroup4_is_the_specs_mapping(name, d):
    rng = np.random.default_rng(2)
    k = rng.standard_normal((3, 16, 2, d)).astype(np.float32)
    v = rng.standard_normal((3, 16, 2, d)).astype(np.float32)
    std = encode_slots(k, v, name, backend="numpy")
    q = encode_slots(k, v, name, layout="qgroup4", backend="numpy")
    assert_bytes_equal(q, _page_by_the_formula(std, name, d), "qgroup4 page bytes")
    assert_bytes_equal(to_qgroup4(std, name, d), q)
    assert_bytes_equal(from_qgroup4(q, name, d), std)
    for a, b in zip(
        decode_slots(q, name, head_dim=d, layout="qgroup4"), decode_slots(std, name, head_dim=d), strict=True
    ):
        assert_bits_equal(a, b, "qgroup4 decode")
    # the same bytes, rearranged (with the pad of an odd slot at the page's end)
    assert sorted(q.reshape(3, -1)[0].tolist()) == sorted(std[0].reshape(-1).tolist())


def test_qgroup4_refusals():
    k = np.zeros((1, 16, 1, 128), np.float32)
    for name in ("turboquant_k8v4", "turboquant_3bit_nc"):
        with pytest.raises(tbq.ConfigError, match="qgroup4"):
            encode_slots(k, k, name, layout="qgroup4")
    with pytest.raises(tbq.BlockShapeError, match="num_blocks"):
        encode_slots(k[0], k[0], "turboquant_4bit_nc", layout="qgroup4")
    with pytest.raises(tbq.ConfigError, match="layout"):
        encode_slots(k, k, "turboquant_4bit_nc", layout="planes")


# ---------------------------------------------------------------------------
# the boundary
# ---------------------------------------------------------------------------


def test_bad_calls_are_one_line_typed_errors():
    k = np.zeros((2, 128), np.float32)
    s = encode_slots(k, k, "turboquant_4bit_nc")
    nan = k.copy()
    nan[1, 5] = np.nan
    cases = [
        (tbq.ConfigError, "presets", lambda: encode_slots(k, k, "turboquant_2bit")),
        (tbq.BlockShapeError, "same shape", lambda: encode_slots(k, k[:, :64], "turboquant_4bit_nc")),
        (tbq.BlockShapeError, "head_dim=64", lambda: encode_slots(k, k, "turboquant_4bit_nc", head_dim=64)),
        (tbq.TbqTypeError, "float16", lambda: encode_slots(k.astype(np.int32), k, "turboquant_4bit_nc")),
        (tbq.ConfigError, "power of two", lambda: encode_slots(k[:, :96], k[:, :96], "turboquant_4bit_nc")),
        (
            tbq.NonFiniteError,
            "block 1",
            lambda: encode_slots(nan, k, "turboquant_4bit_nc"),
        ),
        (tbq.TbqTypeError, "uint8", lambda: decode_slots(s.astype(np.int8), "turboquant_4bit_nc", head_dim=128)),
        (tbq.EncodedLengthError, "134 bytes", lambda: decode_slots(s[:, :130], "turboquant_4bit_nc", head_dim=128)),
        (tbq.EncodedLengthError, "118 bytes", lambda: decode_slots(s, "turboquant_k3v4_nc", head_dim=128)),
        (tbq.ConfigError, "integer", lambda: decode_slots(s, "turboquant_4bit_nc", head_dim=128.0)),
        (tbq.ConfigError, "no option", lambda: encode_slots(k, k, "turboquant_k8v4", rotation="pr38479", layer=2)),
    ]
    for err, words, call in cases:
        with pytest.raises(err, match=words) as e:
            call()
        assert "\n" not in str(e.value), str(e.value)


def test_k8v4_takes_head_dims_that_are_not_powers_of_two():
    rng = np.random.default_rng(3)
    k = rng.standard_normal((5, 96)).astype(np.float32)
    s = encode_slots(k, k, "turboquant_k8v4")
    assert s.shape == (5, 148)
    assert_bytes_equal(s[:, :96], tbq.quantize(k, "fp8_e4m3", on_overflow="saturate"))
    yk, yv = decode_slots(s, "turboquant_k8v4", head_dim=96)
    assert_bits_equal(yk, tbq.dequantize(s[:, :96], "fp8_e4m3"), "fp8 keys")
