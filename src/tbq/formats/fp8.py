"""FP8_E4M3 and FP8_E5M2 (vLLM's FP8 KV cache): one byte per value and a per-tensor scale.

docs/formats.md, "FP8_E4M3 / FP8_E5M2". A "block" is one value (block size
1); the float32 per-tensor ``scale`` ``s`` (vLLM's ``k_scale`` / ``v_scale``,
1.0 when not calibrated) is a format option, not stored in the bytes.

- Encode: ``v = x / s`` (a correctly rounded float32 division, not
  ``x * (1/s)``), then NVIDIA's ``__nv_cvt_float_to_fp8(v, ...)``: round to
  nearest, ties to even, onto the format's grid, subnormals included, signed
  zeros kept. A ``|v|`` that rounds beyond the largest finite value (E4M3:
  ``|v| > 464``, above 448 = ``0x7E``; E5M2: ``|v| >= 61440``, above 57344 =
  ``0x7B``) is refused by default; ``on_overflow="saturate"`` stores the
  largest finite value with the sign (``__NV_SATFINITE``, what vLLM stores),
  ``on_overflow="inf"`` the non-saturating result (``__NV_NOSAT``: E4M3 NaN
  ``0x7F``/``0xFF``, E5M2 ``+-inf`` ``0x7C``/``0xFC``).
- Decode: ``y = float32(fp8) * s``, one float32 multiplication; NaN bytes
  decode to the canonical NaN ``0x7FFFFFFF`` whatever their sign (CUDA's
  ``fp8 -> half -> float`` path), E5M2's infinities to ``+-inf * s``.

The rounding is integer arithmetic on the float32 bits of ``v`` (one formula
shared with the kernels): normal results round the dropped mantissa bits to
nearest even (a carry into the exponent is the correct rounding); subnormal
results add ``|v|`` to the power of two whose float32 ulp is the FP8
subnormal step (2**14 for E4M3, 2**7 for E5M2), so the float32 addition does
the round to nearest even.

>>> FP8_E4M3().encode(np.float32([1.0, -0.0, 448.0, 464.0, 2.0**-10])).tolist()
[56, 128, 126, 126, 0]
>>> FP8_E5M2(scale=0.5).decode(np.uint8([0x3C, 0x7B, 0x7C])).tolist()
[0.5, 28672.0, inf]
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..errors import ConfigError, ScaleOverflowError
from .base import Field, Format, FormatInfo, Option, Trace, band
from .capabilities import AttentionTraits, CapabilitySlot, FuzzTraits, GoldenTraits, QuantizerTraits

F32 = np.float32
_U = np.uint32

#: float32 canonical NaN (what CUDA's fp8 -> half -> float gives for every NaN byte)
NAN_BITS = 0x7FFFFFFF


class Grid:
    """The constants of one FP8 encoding (``m`` mantissa bits, exponent ``bias``)."""

    def __init__(
        self, name: str, m: int, bias: int, max_code: int, nosat_code: int, overflow_bits: int, has_inf: bool
    ) -> None:
        self.name, self.m, self.bias = name, m, bias
        self.shift = 23 - m  #: dropped float32 mantissa bits of a normal result
        self.rebias = (127 - bias) << m  #: subtracted from the rounded float32 pattern >> shift
        self.min_normal_bits = (128 - bias) << 23  #: float32 bits of 2**(1 - bias)
        #: float32 bits of 2**k whose ulp 2**(k - 23) is the subnormal step 2**(1 - bias - m)
        self.sub_add_bits = (127 + 23 + 1 - bias - m) << 23
        self.max_code = max_code  #: the largest finite magnitude code
        self.nosat_code = nosat_code  #: what the non-saturating conversion stores on overflow
        self.overflow_bits = overflow_bits  #: |v| float32 bits at and above which v overflows
        self.has_inf = has_inf

    def specials(self) -> tuple[tuple[str, int, int], ...]:
        """The special bytes arbitrary-byte fuzzing injects (:attr:`Field.specials`): zeros, the infinities where
        there are any, the NaNs, the largest finite magnitude and the subnormals, each sign."""
        inf = ((1 << (7 - self.m)) - 1) << self.m  # the top exponent, mantissa 0
        nan = inf + 1 if self.has_inf else 0x7F
        sub = (1 << self.m) - 1
        ranges = [("+0", 0, 0)]
        ranges += [("+inf", inf, inf)] if self.has_inf else []
        ranges += [("nan", nan, 0x7F), ("max", self.max_code, self.max_code), ("subnormal", 1, sub)]
        # each positive range, then the same bytes with the sign bit (-0 after +0, and so on)
        return tuple(r for n, lo, hi in ranges for r in ((n, lo, hi), ("-" + n.lstrip("+"), lo | 0x80, hi | 0x80)))

    @functools.cached_property
    def values(self) -> NDArray[np.float32]:
        """float32 (256,): the exact value of every byte (NaN bytes as the canonical ``0x7FFFFFFF``)."""
        c = np.arange(256)
        sign = np.where(c & 0x80, -1.0, 1.0)
        e = (c >> self.m) & ((1 << (7 - self.m)) - 1)
        mant = c & ((1 << self.m) - 1)
        mag = np.where(
            e == 0, mant * 2.0 ** (1 - self.bias - self.m), (1 + mant / 2.0**self.m) * 2.0 ** (e - self.bias)
        )
        top = (1 << (7 - self.m)) - 1
        if self.has_inf:
            special = e == top
            mag = np.where(special & (mant == 0), np.inf, mag)
            nan = special & (mant != 0)
        else:
            nan = (c & 0x7F) == 0x7F
        v = (sign * mag).astype(np.float32)
        v.view(np.uint32)[nan] = NAN_BITS
        v.setflags(write=False)
        return v


E4M3 = Grid("E4M3", 3, 7, 0x7E, 0x7F, 0x43E80001, False)  # |v| > 464 = 0x43E80000 overflows
E5M2 = Grid("E5M2", 2, 15, 0x7B, 0x7C, 0x47700000, True)  # |v| >= 61440 = 0x47700000 overflows


def fp8_codes(v: ArrayLike, g: Grid, saturate: bool) -> NDArray[np.uint8]:
    """FP8 bytes (uint8) of finite-or-infinite float32 values ``v``: round to nearest even (the spec's step 2).

    Overflowing values store ``g.max_code`` (``saturate``) or ``g.nosat_code``, with the sign.
    """
    u = np.ascontiguousarray(v, np.float32).view(np.uint32)
    sign = (u >> _U(24)) & _U(0x80)
    a = u & _U(0x7FFFFFFF)
    normal = ((a + _U((1 << (g.shift - 1)) - 1) + ((a >> _U(g.shift)) & _U(1))) >> _U(g.shift)) - _U(g.rebias)
    with np.errstate(over="ignore"):
        sub = (a.view(np.float32) + _U(g.sub_add_bits).view(np.float32)).view(np.uint32) - _U(g.sub_add_bits)
    code = np.where(a < _U(g.min_normal_bits), sub, normal)
    over = a >= _U(g.overflow_bits)
    code = np.where(over, _U(g.max_code if saturate else g.nosat_code), code)
    return (code | sign).astype(np.uint8)


def _code64(g: Grid) -> Callable[[NDArray[np.float64]], NDArray[np.float64]]:
    """The FP8 rounding of float64 values as a monotone code (the fragility code function)."""

    def code(y: NDArray[np.float64]) -> NDArray[np.float64]:
        y = np.asarray(y, np.float64)
        _, e = np.frexp(y)  # y = f * 2**e, 0.5 <= |f| < 1
        step = np.ldexp(1.0, np.maximum(e - 1, 1 - g.bias) - g.m)
        return np.rint(y / step) * step

    return code


def _scale_f32(value: object, name: str) -> np.float32:
    """The scale option as a float32: a real number, finite and > 0 after the float32 rounding."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ConfigError(
            f"bad configuration for {name}: scale must be a real number (float32, finite, > 0), got {value!r}"
        )
    with np.errstate(all="ignore"):
        s = np.float32(value)
    if not (np.isfinite(s) and s > 0):
        raise ConfigError(
            f"bad configuration for {name}: scale must be finite and > 0 as a float32, got {value!r} (float32 {float(s)!r})"
        )
    return s


class _FP8Attention(AttentionTraits):
    """FP8's :class:`AttentionTraits`."""

    format: _FP8

    read = "attention_read"

    def tables(self) -> NDArray[np.float32]:
        return self.format._table.view(np.float32)  # the 256 decoded values


class _FP8Fuzz(FuzzTraits):
    """FP8's :class:`FuzzTraits`."""

    format: _FP8

    hazards = {"fp8_grid": {}}  #: on an instance: the grid, its limits and the scale (see ``__init__``)

    def __init__(self, fmt: _FP8) -> None:
        super().__init__(fmt)
        g = fmt.grid.values.astype(np.float64)
        fin = np.unique(np.abs(g[np.isfinite(g)]))
        self.hazards = {
            "fp8_grid": {
                "values": tuple(fin.tolist()),
                "limit": float(fin[-1] + (fin[-1] - fin[-2]) / 2),
                "min_normal": 2.0 ** (1 - fmt.grid.bias),
                "scale": float(fmt.scale),
            }
        }


class _FP8Quantizer(QuantizerTraits):
    """FP8's :class:`QuantizerTraits`."""

    format: _FP8

    def value_table(self, trace: Trace) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        # every finite byte's value (both zeros kept), met by v = x / s
        g = self.format.grid.values.astype(np.float64)
        return g[np.isfinite(g)], np.asarray(trace["v"], np.float64).ravel()


class _FP8(Format):
    """Shared body of FP8_E4M3 and FP8_E5M2."""

    kernel_module = "tbq.formats.fp8_kernels"
    attention = CapabilitySlot(_FP8Attention)
    golden = CapabilitySlot(GoldenTraits, on_overflow="saturate")
    fuzz = CapabilitySlot(_FP8Fuzz)
    quantizer = CapabilitySlot(_FP8Quantizer)

    options = {
        "scale": Option(
            1.0,
            "float32, finite, > 0",
            "the per-tensor scale s: v = x / s, y = fp8 * s",
            check=lambda v, name: _scale_f32(v, name),
        )
    }
    overflow_modes = ("raise", "inf", "saturate")
    grid: Grid

    def __init__(self, *, scale: float | np.floating[Any] = 1.0) -> None:
        self.scale = _scale_f32(scale, self.info.name)
        self._table = (self.grid.values * self.scale).view(np.uint32)  # spec decode: float32(fp8) * s
        self._table.setflags(write=False)

    def config(self) -> dict[str, Any]:
        return {"scale": float(self.scale)}

    def overflow_kw(self, on_overflow: str) -> dict[str, bool]:
        return {"saturate": on_overflow == "saturate"}

    # -- spec ----------------------------------------------------------------------------
    def reference_encode(self, x: NDArray[np.float32], saturate: bool = False) -> tuple[NDArray[np.uint8], Trace]:
        v = x / self.scale  # a division, not a multiply by 1/s
        out = fp8_codes(v.reshape(-1), self.grid, saturate).reshape(x.shape[0], 1)
        return out, {"v": v}

    def reference_decode(self, data: NDArray[np.uint8]) -> NDArray[np.float32]:
        return self._table[np.asarray(data).reshape(-1)].view(np.float32).reshape(-1, 1)

    # -- kernels ---------------------------------------------------------------------------
    def kernel_encode(
        self, x: NDArray[np.float32], out: NDArray[np.uint8], raise_overflow: bool, saturate: bool = False
    ) -> tuple[int, int]:
        g = self.grid
        return self.kernels().encode(
            x.reshape(-1), out.reshape(-1), self.scale, raise_overflow, saturate, *_kernel_grid(g)
        )

    def kernel_decode(self, data: NDArray[np.uint8], out: NDArray[np.float32]) -> None:
        self.kernels().decode(data.reshape(-1), out.view(np.uint32).reshape(-1), self._table)

    # -- refusals and fragility -------------------------------------------------------------
    def scale_overflows(self, trace: Trace) -> NDArray[np.bool_]:
        """bool (values,): values whose ``x / s`` rounds beyond the largest finite FP8 value (there is no block scale)."""
        a = np.asarray(trace["v"], np.float32).reshape(-1).view(np.uint32) & np.uint32(0x7FFFFFFF)
        return a >= np.uint32(self.grid.overflow_bits)

    def encode_error(self, status: int, block: int, values: NDArray[np.float32]) -> Exception:
        x = float(np.float32(values[0]))
        v = float(np.float32(values[0]) / self.scale)
        big = float(self.grid.values[self.grid.max_code])
        return ScaleOverflowError(
            f"{self.name}: value {block} is {x!r}; divided by the scale {float(self.scale)!r} it is {v!r}, which "
            f"rounds beyond the largest finite {self.grid.name} value {big:g}. Pass on_overflow='saturate' to store "
            f"{'-' if v < 0 else '+'}{big:g} as vLLM does, or on_overflow='inf' for the non-saturating result "
            f"({'+-inf' if self.grid.has_inf else 'NaN'})",
            block=block,
            scale=x,
        )

    def fragile_values(self, trace: Trace, k: int, ulp_floor: float | None = None) -> NDArray[np.bool_]:
        # v = x / s: fragile when a k-ulp change of v crosses an FP8 rounding midpoint.
        return band(_code64(self.grid), trace["v"], k)

    def fragile_scales(self, trace: Trace, k: int) -> NDArray[np.bool_]:
        return np.zeros(np.asarray(trace["v"]).shape[0], bool)  # no stored scale

    def tables(self) -> dict[str, NDArray[Any]]:
        """The decode table of this instance as float32 bit patterns: uint32 (256,), the value of every byte times
        the scale (bits, because NaN and inf entries have no C float literal)."""
        return {"decode_bits": self._table.copy()}


def _kernel_grid(g: Grid) -> tuple[np.uint32, ...]:

    return (
        np.uint32(g.shift),
        np.uint32(g.rebias),
        np.uint32(g.min_normal_bits),
        np.uint32(g.sub_add_bits),
        np.uint32(g.max_code),
        np.uint32(g.nosat_code),
        np.uint32(g.overflow_bits),
    )


def _info(grid: Grid, code: int) -> FormatInfo:
    """The table row of ``grid``'s FP8 type: one byte a value, its special bytes from the grid."""
    e = grid.name.lower()
    return FormatInfo(
        name=f"fp8_{e}",
        block_size=1,
        index_bits=8,
        description=f"FP8 {grid.name} per value (vLLM fp8_{e}), per-tensor float32 scale",
        code=code,
        layout=(
            Field(
                "q", 0, 1, "uint8", f"{grid.name} byte of x / scale, round to nearest even", specials=grid.specials()
            ),
        ),
    )


class FP8_E4M3(_FP8):
    """FP8 E4M3 ("fn": no infinities; 448 is the largest value) with a per-tensor scale."""

    info = _info(E4M3, 17)
    grid = E4M3


class FP8_E5M2(_FP8):
    """FP8 E5M2 (IEEE-like: infinities and NaNs; 57344 is the largest finite value) with a per-tensor scale."""

    info = _info(E5M2, 18)
    grid = E5M2


__all__ = ["FP8_E4M3", "FP8_E5M2", "E4M3", "E5M2", "Grid", "fp8_codes"]
