"""A stand-in for the tile with the same ports, to test the simulation harness alone.

Byte addresses (the tile's layout where it matters)::

    0x000000  ID       read: regmap.MAGIC; write: ERR
    0x000004  SCRATCH  read/write, byte lanes; irq = SCRATCH[0]
    0x000FFC  SILENT   never answered (to test bus timeouts)
    0x100000  RAM      RAM_WORDS 32-bit words, byte lanes (where GMEM is on the tile)
    elsewhere          ERR
"""

from amaranth import Module, Signal, C
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from fusetile.hdl import wishbone
from fusetile.hdl.regmap import MAGIC, GMEM_BASE


__all__ = ["WishboneStandIn", "standin_top", "RAM_WORDS", "ID_ADDR", "SCRATCH_ADDR",
           "RAM_BASE", "ERR_ADDR", "SILENT_ADDR"]


RAM_WORDS = 1024
ID_ADDR = 0x000
SCRATCH_ADDR = 0x004
RAM_BASE = GMEM_BASE
#: An address nothing decodes: accesses there are answered with ERR.
ERR_ADDR = 0x000100
SILENT_ADDR = 0x000FFC


class WishboneStandIn(wiring.Component):
    """ID register, a scratch register and a RAM behind the tile's bus port.

    Answers every access with a registered ACK or ERR, one cycle after it sees STB,
    and ignores the cycle in which it answers (the contract of ``hdl/wishbone.py``).

    Attributes
    ----------
    bus : In(wishbone.Signature(addr_width=19))
    irq : Out(1)
    """

    bus: In(wishbone.Signature(addr_width=19))
    irq: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.submodules.ram = ram = Memory(shape=32, depth=RAM_WORDS, init=[])
        rd = ram.read_port()
        wr = ram.write_port(granularity=8)

        scratch = Signal(32)
        answer_ram = Signal()
        answer_scratch = Signal()

        word = self.bus.adr
        ram_base = RAM_BASE >> 2
        in_ram = (word >= ram_base) & (word < ram_base + RAM_WORDS)
        is_id = word == (ID_ADDR >> 2)
        is_scratch = word == (SCRATCH_ADDR >> 2)
        is_silent = word == (SILENT_ADDR >> 2)
        access = self.bus.cyc & self.bus.stb & ~self.bus.ack & ~self.bus.err

        m.d.comb += [
            rd.addr.eq(word - ram_base),
            wr.addr.eq(word - ram_base),
            wr.data.eq(self.bus.dat_w),
            self.irq.eq(scratch[0]),
        ]
        m.d.sync += [self.bus.ack.eq(0), self.bus.err.eq(0)]
        with m.If(access):
            with m.If(in_ram):
                m.d.sync += [self.bus.ack.eq(1), answer_ram.eq(1), answer_scratch.eq(0)]
                with m.If(self.bus.we):
                    m.d.comb += wr.en.eq(self.bus.sel)
            with m.Elif(is_scratch):
                m.d.sync += [self.bus.ack.eq(1), answer_ram.eq(0), answer_scratch.eq(1)]
                with m.If(self.bus.we):
                    for i in range(4):
                        with m.If(self.bus.sel[i]):
                            m.d.sync += scratch[8*i:8*i+8].eq(self.bus.dat_w[8*i:8*i+8])
            with m.Elif(is_id & ~self.bus.we):
                m.d.sync += [self.bus.ack.eq(1), answer_ram.eq(0), answer_scratch.eq(0)]
            with m.Elif(is_silent):
                pass
            with m.Else():
                m.d.sync += self.bus.err.eq(1)

        with m.If(answer_ram):
            m.d.comb += self.bus.dat_r.eq(rd.data)
        with m.Elif(answer_scratch):
            m.d.comb += self.bus.dat_r.eq(scratch)
        with m.Else():
            m.d.comb += self.bus.dat_r.eq(C(MAGIC, 32))
        return m


def standin_top(config):
    """``top`` factory for :func:`fusetile.sim.verilog.tile_verilog`."""
    return WishboneStandIn()
