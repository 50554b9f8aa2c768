"""Capabilities that several format modules declare alike, written once.

A format names one of these in its slot (``attention = CapabilitySlot(BlockAttention)``) where its own
would only repeat it; a format with a difference declares its own subclass (docs/architecture.md, "How to
add a format", step 6).
"""

from __future__ import annotations

from .capabilities import AttentionTraits

__all__ = ["BlockAttention"]


class BlockAttention(AttentionTraits):
    """The :class:`AttentionTraits` of a format whose kernel module reads its blocks with ``attention_read`` and
    the default tables (ggml's fp16-scale types: q4_0, q4_1, q5_0, q8_0, iq4_nl)."""

    read = "attention_read"
