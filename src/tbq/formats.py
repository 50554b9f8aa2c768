"""The table of block formats.

One row per format drives every shape computation and check in the library
(the way gguf-py's ``GGML_QUANT_SIZES`` does): a row of ``n`` values is
``n // block_size`` blocks of ``type_size`` bytes each.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FormatInfo", "FORMATS", "formats", "format_info"]


@dataclass(frozen=True)
class FormatInfo:
    """Static facts about one block format."""

    name: str
    block_size: int  #: values per block
    type_size: int  #: bytes per block
    rotated: bool  #: True for the TBQ formats (randomized Hadamard + codebook)
    index_bits: int  #: bits per stored value code
    description: str

    @property
    def bits_per_value(self) -> float:
        """Storage cost including the per-block scale, e.g. 4.125 for tbq4_0."""
        return self.type_size * 8 / self.block_size

    def row_bytes(self, n_values: int) -> int:
        """Bytes of a row of ``n_values`` values (which must be whole blocks)."""
        if n_values % self.block_size:
            from .errors import BlockShapeError

            raise BlockShapeError(f"{n_values} values is not a multiple of {self.name}'s block size {self.block_size}")
        return n_values // self.block_size * self.type_size


FORMATS: dict[str, FormatInfo] = {
    f.name: f
    for f in (
        FormatInfo("q8_0", 32, 34, False, 8, "ggml Q8_0: fp16 scale + 32 int8 codes"),
        FormatInfo("q4_0", 32, 18, False, 4, "ggml Q4_0: fp16 scale + 32 4-bit codes (split halves)"),
        FormatInfo("tbq4_0", 128, 66, True, 4, "TBQ4_0: fp16 norm + 128 rotated 4-bit Lloyd-Max indices"),
        FormatInfo("tbq3_0", 128, 50, True, 3, "TBQ3_0: fp16 norm + 128 rotated 3-bit Lloyd-Max indices"),
    )
}


def formats() -> tuple[str, ...]:
    """Names of the block formats, in the order of the spec.

    >>> formats()
    ('q8_0', 'q4_0', 'tbq4_0', 'tbq3_0')
    """
    return tuple(FORMATS)


def format_info(name: str) -> FormatInfo:
    """The :class:`FormatInfo` row of ``name`` (raises ``ConfigError`` when unknown)."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        from .errors import ConfigError

        raise ConfigError(f"unknown format {name!r}; known formats: {', '.join(FORMATS)}") from None
