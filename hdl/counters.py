"""Performance counters: 64-bit event counters with freeze and clear."""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In


__all__ = ["PerfCounters"]


class PerfCounters(wiring.Component):
    """A set of named 64-bit counters.

    The host reads them through the CSR bank, which latches the high word on a read of
    the low word; ``freeze`` stops every counter at once so a whole set can be read
    consistently.

    Parameters
    ----------
    names : iterable of str
        Counter names, unique.
    inc_width : int
        Width of each counter's per-cycle increment.

    Attributes
    ----------
    freeze : In(1)
        While high, no counter changes.
    clear : In(1)
        Zero every counter (wins over increments; works while frozen).
    inc : dict of str to Signal(inc_width)
        Amount added to each counter this cycle; driven by the parent (0 if undriven).
    value : dict of str to Signal(64)
        Current value of each counter.
    """

    freeze: In(1)
    clear: In(1)

    def __init__(self, names, *, inc_width=8):
        names = list(names)
        if len(set(names)) != len(names):
            raise ValueError(f"Counter names must be unique, not {names!r}")
        if not isinstance(inc_width, int) or not 1 <= inc_width <= 32:
            raise ValueError(f"inc_width must be an integer from 1 to 32, not {inc_width!r}")
        self.names = names
        self.inc = {n: Signal(inc_width, name=f"inc_{_ident(n)}") for n in names}
        self.value = {n: Signal(64, name=f"ctr_{_ident(n)}") for n in names}
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        for n in self.names:
            with m.If(self.clear):
                m.d.sync += self.value[n].eq(0)
            with m.Elif(~self.freeze):
                m.d.sync += self.value[n].eq(self.value[n] + self.inc[n])
        return m


def _ident(name):
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()
