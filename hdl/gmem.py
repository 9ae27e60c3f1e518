"""The global memory (GMEM): on-chip memory shared by the host and the DMA engine.

The host sees GMEM through a 32-bit Wishbone window; the DMA engine sees it through
a word-wide port (:class:`GmemPortSignature`) with independent read and write
addresses, so it can read one word and write another in the same cycle.
"""

from amaranth.hdl import Module, Signal, Cat, Mux
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..kernels.config import TileConfig
from . import wishbone


__all__ = ["GMEM_BUS_ADDR_WIDTH", "GmemPortSignature", "GlobalMemory"]


#: Word-address bits of the host window: GMEM_SPAN (1 MiB) in 32-bit words.
GMEM_BUS_ADDR_WIDTH = 18


def _check_config(config):
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig, not {config!r}")


class GmemPortSignature(wiring.Signature):
    """The DMA engine's port into GMEM, from the DMA engine's point of view.

    A read and a write may be issued in the same cycle, at different addresses.
    Addresses are not range checked by the memory: the initiator must keep them
    below ``config.gmem_words``.

    Parameters
    ----------
    config : TileConfig

    Members
    -------
    raddr : Out(range(gmem_words))
        Word address of a read.
    re : Out(1)
        Read ``raddr`` this cycle.
    rdata : In(word_bits)
        The word read; valid the cycle after ``re``.
    waddr : Out(range(gmem_words))
        Word address of a write.
    we : Out(1)
        Write ``wdata`` to ``waddr`` this cycle (the whole word).
    wdata : Out(word_bits)

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig`.
    """

    def __init__(self, config):
        _check_config(config)
        self.config = config
        addr = range(config.gmem_words)
        super().__init__({
            "raddr": Out(addr),
            "re":    Out(1),
            "rdata": In(config.word_bits),
            "waddr": Out(addr),
            "we":    Out(1),
            "wdata": Out(config.word_bits),
        })

    def __eq__(self, other):
        return isinstance(other, GmemPortSignature) and self.config == other.config

    def __repr__(self):
        return f"GmemPortSignature({self.config!r})"


class GlobalMemory(wiring.Component):
    """Dual-ported global memory of ``config.gmem_words`` words of ``config.word_bits``.

    Host window: 32-bit word ``w`` of the window is bits ``[32*(w % k) +: 32]`` of
    memory word ``w // k`` with ``k = word_bytes // 4``, so host byte address ``a`` is
    byte ``a % word_bytes`` of word ``a // word_bytes`` (little-endian). Writes honour
    ``sel``. An access at or beyond ``gmem_bytes`` is answered with ERR. Every access
    is answered one cycle after ``stb`` is seen (read data in that cycle).

    The host and the DMA engine may write the same word in the same cycle; which
    write wins is then undefined.

    Parameters
    ----------
    config : TileConfig

    Attributes
    ----------
    bus : In(wishbone.Signature(addr_width=18))
        Host window, word address relative to GMEM_BASE.
    dma : In(GmemPortSignature(config))
        DMA engine port: read latency 1 cycle, writes take effect at the clock edge.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig`.
    """

    def __init__(self, config):
        _check_config(config)
        self._config = config
        super().__init__({
            "bus": In(wishbone.Signature(addr_width=GMEM_BUS_ADDR_WIDTH)),
            "dma": In(GmemPortSignature(config)),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        k = cfg.word_bytes // 4
        lane_bits = (k - 1).bit_length()

        m.submodules.mem = mem = Memory(shape=cfg.word_bits, depth=cfg.gmem_words, init=[])
        host_w = mem.write_port(granularity=8)
        host_r = mem.read_port()
        dma_w = mem.write_port(granularity=8)
        dma_r = mem.read_port()

        # -- host window ----------------------------------------------------------
        bus = self.bus
        answered = self.bus.ack | self.bus.err
        access = bus.cyc & bus.stb & ~answered
        in_range = bus.adr < cfg.gmem_bytes // 4
        # With 32-bit words (k == 1) the lane index is an empty slice: every
        # expression below still holds.
        lane = bus.adr[:lane_bits]
        word = bus.adr[lane_bits:]

        m.d.comb += [
            host_w.addr.eq(word),
            host_w.data.eq(Cat(bus.dat_w for _ in range(k))),
            host_r.addr.eq(word),
            host_r.en.eq(access & ~bus.we & in_range),
        ]
        with m.If(access & bus.we & in_range):
            m.d.comb += host_w.en.eq(bus.sel << (4 * lane))

        m.d.sync += [
            bus.ack.eq(access & in_range),
            bus.err.eq(access & ~in_range),
        ]
        read_lane = Signal(max(lane_bits, 1))
        with m.If(access):
            m.d.sync += read_lane.eq(lane)
        if k == 1:
            m.d.comb += bus.dat_r.eq(host_r.data)
        else:
            m.d.comb += bus.dat_r.eq(host_r.data.word_select(read_lane, 32))

        # -- DMA port -------------------------------------------------------------
        m.d.comb += [
            dma_r.addr.eq(self.dma.raddr),
            dma_r.en.eq(self.dma.re),
            self.dma.rdata.eq(dma_r.data),
            dma_w.addr.eq(self.dma.waddr),
            dma_w.data.eq(self.dma.wdata),
            dma_w.en.eq(Mux(self.dma.we, (1 << cfg.word_bytes) - 1, 0)),
        ]
        return m
