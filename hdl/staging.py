"""The speculation staging buffer: GMEM stores of a speculative region wait here
until COMMIT publishes them or a miss discards them."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..kernels.config import TileConfig
from .gmem import GmemPortSignature


__all__ = ["StagingBuffer"]


class StagingBuffer(wiring.Component):
    """Sits on the DMA engine's GMEM port and holds back its writes while speculating.

    Reads always pass straight through (a speculative region must not read back what
    it stored: there is no forwarding). Outside speculation writes pass through too.
    While ``speculate`` is high, each write is appended to the buffer instead; a write
    that finds it full is dropped and raises ``overflow`` (the control unit treats that
    as a miss). ``publish`` drains the buffer into GMEM in order while ``draining`` is
    high: ``2 n + 1`` cycles for ``n`` words (an entry is read, registered, then
    written, the next entry read with the write); ``discard`` empties it. A drain
    reads an entry before it writes it, so a discard the cycle after a publish (the
    control unit's abort of a COMMIT that faults or misses) leaves GMEM as it was.
    GMEM's DMA side reads or writes in a cycle, not both, so a draining write waits
    while the DMA engine reads.

    Parameters
    ----------
    config : TileConfig
        ``staging_words`` sets the capacity.

    Attributes
    ----------
    dma : In(GmemPortSignature(config))
        From the DMA engine.
    gmem : Out(GmemPortSignature(config))
        To GMEM.
    speculate : In(1)
    publish, discard : In(1)
        One-cycle commands.
    draining : Out(1)
    overflow : Out(1)
        Sticky until ``discard``: a speculative write did not fit.
    level : Out(range(staging_words + 1))
    """

    def __init__(self, config):
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        self.config = config
        super().__init__({
            "dma": In(GmemPortSignature(config)),
            "gmem": Out(GmemPortSignature(config)),
            "speculate": In(1),
            "publish": In(1),
            "discard": In(1),
            "draining": Out(1),
            "overflow": Out(1),
            "level": Out(range(config.staging_words + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        depth = cfg.staging_words
        addr_bits = len(self.dma.waddr)

        m.submodules.mem = mem = Memory(shape=addr_bits + cfg.word_bits, depth=depth, init=[])
        wr = mem.write_port()
        # Not transparent: entries are written only outside a drain and read only
        # during one, so no read wants the word written in its cycle (the bypass was
        # a comparison of the two addresses in front of a register, 9.73 ns of
        # e964b34's routed ULX3S build, docs/fpga-timing.md step 45).
        rd = mem.read_port()

        count = self.level
        head = Signal(range(depth))      # next entry to publish
        fetched = Signal()               # rd.data holds entry `head`
        loaded = Signal()                # `entry` holds entry `head`
        # The entry being written, registered: from the buffer's block RAM straight to
        # GMEM's write port was the worst path of the ULX3S build (12.88 ns, step 35).
        # Built for area, `entry` is the block RAM's output itself, held by its read
        # enable: the register took 47 logic cells of the UP5K, loaded from the RAM
        # with no LUT in front. The drain's cycles are the same.
        if cfg.compact:
            entry = rd.data
        else:
            entry = Signal.like(rd.data)

        m.d.comb += [
            self.gmem.raddr.eq(self.dma.raddr),
            self.gmem.re.eq(self.dma.re),
            self.dma.rdata.eq(self.gmem.rdata),
        ]

        stage = Signal()
        m.d.comb += stage.eq(self.speculate & self.dma.we)
        full = count == depth
        m.d.comb += [
            wr.addr.eq(count),
            wr.data.eq(self.dma.wdata << addr_bits | self.dma.waddr),
            wr.en.eq(stage & ~full & ~self.draining),
        ]
        with m.If(stage & ~full & ~self.draining):
            m.d.sync += count.eq(count + 1)
        with m.If(stage & full):
            m.d.sync += self.overflow.eq(1)

        writing = Signal()              # a draining write is made this cycle
        m.d.comb += [
            writing.eq(self.draining & loaded & ~self.dma.re),
            # While `entry` holds entry `head`, the next entry is read, written or not:
            # the write moves on to it in the next cycle. (With the write's decision
            # in front, the DMA engine's read request was in front of the block RAM's
            # address: 9.80 ns of e964b34's routed ULX3S build, step 45.)
            rd.addr.eq(Mux(loaded, head + 1, head)),
        ]
        if cfg.compact:
            # The RAM reads an entry where the register would take one (`fetched`):
            # in the cycle before, and in a write's cycle, the next entry; else it
            # holds.
            m.d.comb += rd.en.eq(self.draining & ~fetched & ~loaded | writing)
        with m.If(self.draining):
            # A cycle to read an entry, one to register it, one to write it, the next
            # entry read in the write's cycle: two cycles a word, simple, and a commit
            # of a few dozen words is short next to the kernels that produced them.
            # GMEM's DMA side reads or writes in a cycle, not both: a DMA read goes
            # first.
            with m.If(~fetched & ~loaded):
                m.d.sync += fetched.eq(1)
            with m.If(fetched):
                m.d.sync += [*([] if cfg.compact else [entry.eq(rd.data)]),
                             loaded.eq(1), fetched.eq(0)]
            with m.If(loaded):
                m.d.comb += [
                    self.gmem.waddr.eq(entry[:addr_bits]),
                    self.gmem.wdata.eq(entry[addr_bits:]),
                    self.gmem.wclaim.eq(1),
                ]
            with m.If(writing):
                m.d.comb += self.gmem.we.eq(1)
                m.d.sync += [loaded.eq(0), fetched.eq(1), head.eq(head + 1)]
                with m.If(head == count - 1):
                    m.d.sync += [self.draining.eq(0), count.eq(0), head.eq(0),
                                 fetched.eq(0)]
        with m.Else():
            m.d.comb += [
                self.gmem.waddr.eq(self.dma.waddr),
                self.gmem.wdata.eq(self.dma.wdata),
                self.gmem.we.eq(self.dma.we & ~self.speculate),
                self.gmem.wclaim.eq(self.dma.wclaim & ~self.speculate),
            ]

        # Outside a drain `head`, `fetched` and `loaded` are already 0 (a drain's last
        # write and a discard clear them), so a publish only sets `draining`: clearing
        # them again put the control unit's COMMIT decode in front of their
        # synchronous resets, 11.82 ns of 36f2362's routed ULX3S build (step 51).
        with m.If(self.publish & ~self.draining & (count != 0)):
            m.d.sync += self.draining.eq(1)
        with m.If(self.discard):
            m.d.sync += [count.eq(0), head.eq(0), self.draining.eq(0), self.overflow.eq(0),
                         fetched.eq(0), loaded.eq(0)]
        return m
