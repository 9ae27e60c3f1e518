"""The CSR bank: the tile's control/status registers and counters on a Wishbone bus.

The bank is elaborated from a :class:`~fusetile.hdl.registers.MemoryMap`, so the
register layout lives in one place (:mod:`fusetile.hdl.regmap`). Each field becomes a
plain signal the rest of the tile reads or drives; nothing here knows what a register
means.
"""

import re

from amaranth.hdl import Array, C, Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from . import wishbone
from .counters import CounterReadSignature
from .registers import Access, MemoryMap


__all__ = ["CsrBank"]


def _signal_name(*parts):
    return "_".join(re.sub(r"\W+", "_", p).strip("_") for p in parts)


class CsrBank(wiring.Component):
    """Registers and 64-bit counters of a memory map, answering a Wishbone bus.

    The bank takes the registers and counters of ``memory_map`` that lie in the CSR
    window ``[0, 4 << addr_width)`` bytes (other entries, such as memory windows, are
    ignored). The cycle an access is seen registers it (address, ``we``, ``sel``), the
    next decodes it from there, if the master still holds it: the decode starts at
    flip-flops of its own, not at the far end of the wire from the master (the UART
    bridge's address register through the decode were 11.0 to 11.6 ns of the ULX3S
    build's routed paths after step 35 of docs/fpga-timing.md). Every access is answered with
    exactly one of ``ack`` or ``err``, two cycles after it is seen, but a whole-word
    write to a writable register three cycles after, a register read four (a
    counter's low word: one cycle after the counters answer):

    * a read of a register ACKs with its value (W1 fields read as 0): the decode
      registers which register it is, the next cycle its value among each group of
      :attr:`READ_GROUP` registers, the one after the group's (the address decode and
      the multiplexer over every register, one after the other, were the ULX3S build's
      routed worst path, step 28; the multiplexer alone was 19 of step 34's late
      endpoints); built for area (``compact``), all the registers are one group;
    * a read of a counter's ``_LO`` word asks :attr:`counter_read` for the counter
      (from the decode) and ACKs with bits [31:0] of its value the cycle after the
      answer, latching bits [63:32] into a shadow register shared by all counters
      (built for area, the answer's, which holds until the next read); a read of a
      ``_HI`` word ACKs with the shadow (as a register read), so reading LO then HI is
      atomic;
    * a write ACKs and updates the register's RW fields and pulses its W1 fields, if
      the register has a writable field, ``sel`` is ``0b1111`` and the register's
      :attr:`refuse` signal is low in the cycle of the answer; a refused write is
      answered with ERR, leaves the register unchanged and pulses :attr:`refused`.
      Either answer comes three cycles after the access is seen: the decode registers
      which register it is, the cycle after writes it or refuses it (the address
      decode and the refusal in front of the enables of every field, one after the
      other, were 220 of the ULX3S build's late endpoints, step 33);
    * writes to counters or to registers without writable fields, writes with a partial
      ``sel``, and any access to an address with no register are answered with ERR.

    Parameters
    ----------
    memory_map : MemoryMap
    addr_width : int
        Word address bits of the bus; the CSR window is ``4 << addr_width`` bytes.
    compact : bool
        Built for area (:attr:`TileConfig.compact`): a read's value is selected among
        all the registers in one cycle, with no register per group (the same
        latency).

    Attributes
    ----------
    bus : In(wishbone.Signature(addr_width=addr_width))
    refused : Out(1)
        Pulses for one cycle (the cycle of the ERR) when a write was refused.
    refused_addr : Out(addr_width)
        Word address of the last refused write (valid from the cycle ``refused`` is high).
    hold : In(1)
        While high, a write that would be performed or refused waits: the cycles a
        :attr:`refuse` does not cover yet (the control unit's ``slot_hold``).
    fields : dict of str to dict of str to Signal
        ``fields[register][field]``, ``Signal(field.width)``. RW: the bank drives it
        (the field's storage). R: the parent drives it (0 if left undriven). W1: the
        bank drives a one-cycle pulse of the bits the host wrote as 1, in the cycle of
        the ACK.
    read_strobe : dict of str to Signal
        For registers with ``read_strobe=True``: ``Signal(1)``, high in the cycle the
        read is answered. The data was taken in the cycles before, so a FIFO popped on
        the strobe returns its head as it was before the pop.
    refuse : dict of str to Signal
        For registers with a writable field: ``Signal(1)``, driven by the parent; a
        write whose answer comes while it is high is refused (the write is performed
        in the cycle of its answer).
    counter_read : Out(CounterReadSignature(count=len(counter_names)))
        Reads a counter by its index in :attr:`counter_names` (present only if the
        window holds a counter); connect to :class:`~fusetile.hdl.counters.PerfCounters`.
    counter_names : list of str
        The counters in the window, in memory-map order.

    Raises
    ------
    TypeError
        If ``memory_map`` is not a MemoryMap or ``addr_width`` not a positive integer.
    ValueError
        If the CSR window holds a memory window, or no register or counter.
    """

    #: Registers per group of the read multiplexer's first stage (a power of two).
    READ_GROUP = 8

    def __init__(self, memory_map, *, addr_width=10, compact=False):
        if not isinstance(memory_map, MemoryMap):
            raise TypeError(f"memory_map must be a MemoryMap, not {memory_map!r}")
        if not isinstance(addr_width, int) or isinstance(addr_width, bool) or addr_width < 1:
            raise TypeError(f"addr_width must be a positive integer, not {addr_width!r}")
        limit = 4 << addr_width
        for entry in memory_map.windows():
            if entry.addr < limit:
                raise ValueError(f"Window {entry.item.name} at {entry.addr:#x} lies in the "
                                 f"CSR window [0, {limit:#x})")
        self._registers = [e for e in memory_map.registers() if e.addr < limit]
        self._counters = [e for e in memory_map.counters() if e.addr + 8 <= limit]
        if not self._registers and not self._counters:
            raise ValueError(f"memory_map must have a register or counter in the CSR "
                             f"window [0, {limit:#x}), not none")

        self.fields = {}
        self.read_strobe = {}
        self.refuse = {}
        for entry in self._registers:
            reg = entry.item
            self.fields[reg.name] = {
                f.name: Signal(f.width, init=f.init, name=_signal_name("csr", reg.name, f.name))
                for f in reg.fields
            }
            if reg.read_strobe:
                self.read_strobe[reg.name] = Signal(name=_signal_name("csr", reg.name, "rstb"))
            if reg.writable:
                self.refuse[reg.name] = Signal(name=_signal_name("csr", reg.name, "refuse"))
        self.counter_names = [e.item.name for e in self._counters]
        self.compact = bool(compact)

        members = {
            "bus": In(wishbone.Signature(addr_width=addr_width)),
            "refused": Out(1),
            "refused_addr": Out(addr_width),
            "hold": In(1),
        }
        if self._counters:
            members["counter_read"] = Out(CounterReadSignature(count=len(self._counters)))
        super().__init__(members)

    def _read_value(self, reg):
        """The 32-bit value a read of ``reg`` returns."""
        return Cat(C(0, f.width) if f.access is Access.W1 else self.fields[reg.name][f.name]
                   for f in reg.fields)

    def _write(self, m, reg):
        """Update ``reg``'s fields from the bus data."""
        for f, offset in reg.field_offsets():
            if f.access.writable:
                m.d.sync += self.fields[reg.name][f.name].eq(self.bus.dat_w[offset:offset + f.width])

    def elaborate(self, platform):
        m = Module()
        bus = self.bus

        # The high word of the last counter whose LO word was read. Built for area, the
        # counters' answer itself, which holds until the next read: a copy took 32
        # logic cells of the UP5K, loaded from another register with no LUT between.
        if self._counters and self.compact:
            shadow = self.counter_read.data[32:]
        else:
            shadow = Signal(32)
        # A counter's LO word is being read: the access waits for the counters.
        counting = Signal()
        # The access as it was seen a cycle ago (the master holds it until the answer).
        seen = Signal()
        adr = Signal.like(bus.adr, name="seen_adr")
        we = Signal(name="seen_we")
        sel = Signal.like(bus.sel, name="seen_sel")

        m.d.sync += [bus.ack.eq(0), bus.err.eq(0), self.refused.eq(0)]
        m.d.sync += [strobe.eq(0) for strobe in self.read_strobe.values()]
        for entry in self._registers:
            for f in entry.item.fields:
                if f.access is Access.W1:
                    m.d.sync += self.fields[entry.item.name][f.name].eq(0)

        def answer_read(value):
            m.d.sync += [bus.dat_r.eq(value), bus.ack.eq(1)]

        # A read of a register (or of the counters' shadow) names it in `read_sel`; the
        # next cycle registers its value in each group of READ_GROUP registers
        # (`grouped`), the one after answers with its group's.
        values = [self._read_value(entry.item) for entry in self._registers] + [shadow]
        n = len(values) if self.compact else self.READ_GROUP
        groups = [values[i:i + n] for i in range(0, len(values), n)]
        reading = Signal()          # read_sel names the register read
        answering = Signal()        # `grouped` holds its value
        read_sel = Signal(range(len(values)))
        in_group = read_sel[:(n - 1).bit_length()]
        grouped = [Signal(32, name=f"read_group{k}") for k in range(len(groups))]
        which = Signal(range(len(groups)))
        m.d.sync += [reading.eq(0), answering.eq(reading)]
        with m.If(reading):
            m.d.sync += which.eq(read_sel >> (n - 1).bit_length())
            for value, group in zip(grouped, groups):
                m.d.sync += value.eq(Array(group + [C(0, 32)] * (n - len(group)))[in_group])
        with m.If(answering):
            answer_read(Array(grouped)[which])
            for i, entry in enumerate(self._registers):
                if entry.item.read_strobe:
                    m.d.sync += self.read_strobe[entry.item.name].eq(read_sel == i)

        def read_register(index):
            m.d.sync += [reading.eq(1), read_sel.eq(index)]

        # A write to a register likewise names it in `write_sel` and is performed or
        # refused from there a cycle later, or later while `hold` is high (the master
        # holds `dat_w` until the answer).
        writing = Signal()
        write_sel = Signal(range(len(self._registers)))
        with m.If(writing & ~self.hold):
            m.d.sync += writing.eq(0)
            with m.Switch(write_sel):
                for index, entry in enumerate(self._registers):
                    reg = entry.item
                    if not reg.writable:
                        continue
                    with m.Case(index):
                        with m.If(self.refuse[reg.name]):
                            m.d.sync += [bus.err.eq(1), self.refused.eq(1),
                                         self.refused_addr.eq(adr)]
                        with m.Else():
                            m.d.sync += bus.ack.eq(1)
                            self._write(m, reg)

        if self._counters:
            ctr = self.counter_read
            m.d.sync += ctr.stb.eq(0)
            with m.If(counting & ctr.ack):
                answer_read(ctr.data[:32])
                m.d.sync += [*([] if self.compact else [shadow.eq(ctr.data[32:])]),
                             counting.eq(0)]

        # An access is registered the cycle it is seen (`seen`) and decoded from there
        # the cycle after, if the master still holds it (one that was withdrawn is not
        # decoded from its stale address). The cycles of the decode, of the answer and
        # of a read's or a write's selection are ignored so that the same access is not
        # answered twice.
        m.d.sync += seen.eq(0)
        with m.If(bus.cyc & bus.stb & ~bus.ack & ~bus.err & ~seen & ~counting & ~reading &
                  ~answering & ~writing):
            m.d.sync += [seen.eq(1), adr.eq(bus.adr), we.eq(bus.we), sel.eq(bus.sel)]

        # The decode. Anything but a read of a register or a counter's word, or a
        # whole-word write to a writable register, is answered with ERR the cycle after.
        with m.If(seen & bus.cyc & bus.stb):
            with m.Switch(adr):
                for index, entry in enumerate(self._registers):
                    reg = entry.item
                    with m.Case(entry.addr // 4):
                        with m.If(~we):
                            read_register(index)
                        if reg.writable:
                            with m.Elif(sel != 0b1111):
                                m.d.sync += bus.err.eq(1)
                            with m.Else():
                                m.d.sync += [writing.eq(1), write_sel.eq(index)]
                        else:
                            with m.Else():
                                m.d.sync += bus.err.eq(1)

                for index, entry in enumerate(self._counters):
                    with m.Case(entry.addr // 4):
                        with m.If(~we):
                            m.d.sync += [ctr.stb.eq(1), ctr.index.eq(index), counting.eq(1)]
                        with m.Else():
                            m.d.sync += bus.err.eq(1)
                    with m.Case(entry.addr // 4 + 1):
                        with m.If(~we):
                            read_register(len(values) - 1)
                        with m.Else():
                            m.d.sync += bus.err.eq(1)

                with m.Default():
                    m.d.sync += bus.err.eq(1)

        return m
