"""Comparisons that map to carry chains.

Yosys' ECP5 flow builds some comparisons (``a < b`` on a multiplexed or wide operand,
``offset >= limit``) as a ripple of LUTs, one level per bit pair or two, where a
subtraction is always a carry chain: ten LUT levels against one chain for 16 bits, on
the tile's longest paths (docs/fpga.md, step 24). These helpers write the comparison
as the sign of a subtraction wide enough not to overflow; the result is the same.
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
