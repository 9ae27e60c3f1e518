"""Comparisons of two signals as the sign of their difference.

Yosys maps ``a >= b`` on the ECP5 to a carry chain with levels of LUTs after it (a
16-bit signed ``>=``: 8 CCU2C and 14 LUT4), while the sign of ``a - b`` is the carry
chain alone (9 CCU2C and 1 LUT4). Several of the tile's longest paths go through
comparisons, and those compare through these; where one sits inside a larger cone of
logic, ABC's LUTs can come out shorter (``docs/fpga.md``, step 15). Amaranth widens a
difference by one bit, signed, so its top bit is ``a < b`` for any pair of shapes; a
comparison with a constant is cheap either way and keeps the operator.
"""

__all__ = ["lt", "ge", "gt"]


def lt(a, b):
    """``a < b``."""
    return (a - b)[-1]


def ge(a, b):
    """``a >= b``."""
    return ~lt(a, b)


def gt(a, b):
    """``a > b``."""
    return lt(b, a)
