"""Wishbone B4 classic, 32-bit: the tile's register interface.

Only the signals the tile uses: CYC, STB, WE, ADR (word address), DAT_W, DAT_R, SEL,
ACK, ERR. Every access is answered by exactly one of ACK or ERR, one or more cycles
after STB; an access nobody decodes is answered with ERR.
"""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


__all__ = ["Signature"]


class Signature(wiring.Signature):
    """Wishbone B4 classic bus, from the initiator's point of view.

    Parameters
    ----------
    addr_width : int
        Width of ``adr``, a *word* address (byte address >> 2).
    data_width : int
        Width of ``dat_w`` / ``dat_r``; only 32 is supported.

    Members
    -------
    cyc, stb, we : Out(1)
    adr : Out(addr_width)
    dat_w : Out(32)
    dat_r : In(32)
    sel : Out(4)
        Byte lanes of a write.
    ack, err : In(1)
    """

    def __init__(self, *, addr_width, data_width=32):
        if not isinstance(addr_width, int) or addr_width < 0:
            raise TypeError(f"addr_width must be a non-negative integer, not {addr_width!r}")
        if data_width != 32:
            raise ValueError(f"data_width must be 32, not {data_width!r}")
        self.addr_width = addr_width
        self.data_width = data_width
        super().__init__({
            "cyc":   Out(1),
            "stb":   Out(1),
            "we":    Out(1),
            "adr":   Out(addr_width),
            "dat_w": Out(data_width),
            "dat_r": In(data_width),
            "sel":   Out(data_width // 8),
            "ack":   In(1),
            "err":   In(1),
        })

    def __eq__(self, other):
        return (isinstance(other, Signature) and self.addr_width == other.addr_width
                and self.data_width == other.data_width)

    def __repr__(self):
        return f"wishbone.Signature(addr_width={self.addr_width}, data_width={self.data_width})"
