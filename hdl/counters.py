"""Performance counters: 64-bit event counters with freeze and clear."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In


__all__ = ["PerfCounters"]


class PerfCounters(wiring.Component):
    """A set of named 64-bit counters.

    The host reads them through the CSR bank, which latches the high word on a read of
    the low word; ``freeze`` stops every counter at once so a whole set can be read
    consistently.

    Increments are registered before they are added: an event shows in its counter
    one cycle after the cycle it happened in, so that the logic which decides an
    event (the control unit's stall and fault decisions, the scratchpad's
    arbitration) and the 64-bit adder are not one path. ``freeze`` and ``clear`` act
    on the events of their own cycle, as if counting were immediate: an event in the
    cycle before a freeze is still counted (in the freeze's first cycle), one in a
    clear's cycle is not. The counters named in ``immediate`` add in the cycle of the
    increment (``CYCLES``, whose increment is a constant and whose value the control
    unit stamps into trace records).

    Parameters
    ----------
    names : iterable of str
        Counter names, unique.
    inc_width : int
        Width of each counter's per-cycle increment.
    immediate : iterable of str
        Names of counters whose increments are not registered.

    Attributes
    ----------
    freeze : In(1)
        While high, no event is counted.
    clear : In(1)
        Zero every counter (wins over increments; works while frozen).
    inc : dict of str to Signal(inc_width)
        Amount added to each counter this cycle; driven by the parent (0 if undriven).
    value : dict of str to Signal(64)
        Current value of each counter.
    """

    freeze: In(1)
    clear: In(1)

    def __init__(self, names, *, inc_width=8, immediate=()):
        names = list(names)
        if len(set(names)) != len(names):
            raise ValueError(f"Counter names must be unique, not {names!r}")
        if not isinstance(inc_width, int) or not 1 <= inc_width <= 32:
            raise ValueError(f"inc_width must be an integer from 1 to 32, not {inc_width!r}")
        unknown = set(immediate) - set(names)
        if unknown:
            raise ValueError(f"immediate names counters that do not exist: {sorted(unknown)!r}")
        self.names = names
        self.immediate = frozenset(immediate)
        self.inc = {n: Signal(inc_width, name=f"inc_{_ident(n)}") for n in names}
        self.value = {n: Signal(64, name=f"ctr_{_ident(n)}") for n in names}
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        for n in self.names:
            if n in self.immediate:
                with m.If(self.clear):
                    m.d.sync += self.value[n].eq(0)
                with m.Elif(~self.freeze):
                    m.d.sync += self.value[n].eq(self.value[n] + self.inc[n])
            else:
                staged = Signal.like(self.inc[n], name=f"staged_{_ident(n)}")
                m.d.sync += staged.eq(Mux(self.freeze | self.clear, 0, self.inc[n]))
                with m.If(self.clear):
                    m.d.sync += self.value[n].eq(0)
                with m.Else():
                    m.d.sync += self.value[n].eq(self.value[n] + staged)
        return m


def _ident(name):
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()
