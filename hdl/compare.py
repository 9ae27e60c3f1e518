"""Comparisons that map to carry chains.

Yosys' ECP5 flow builds some comparisons as a ripple of LUTs where a subtraction is
always a carry chain: VPOOL's merge compared a 16-bit accumulator through ten LUT
levels (docs/fpga-timing.md, step 24). These helpers write the comparison as the sign of a
subtraction wide enough not to overflow; the result is the same. They pay where the
comparison starts near registers; inside a larger cone of logic ABC's LUTs can come
out shorter (the rough model said so for the scratchpad's offset check).
"""

from amaranth.hdl import Value


__all__ = ["below", "at_least"]


def below(a, b):
    """``a < b`` (signed or unsigned, as Amaranth compares them), as the sign bit of
    ``a - b``."""
    diff = Value.cast(a) - Value.cast(b)
    return diff[len(diff) - 1]


def at_least(a, b):
    """``a >= b``, as the inverted sign bit of ``a - b``."""
    return ~below(a, b)
