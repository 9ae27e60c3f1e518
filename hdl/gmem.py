"""The global memory (GMEM): on-chip memory shared by the host and the DMA engine.

The host sees GMEM through a 32-bit Wishbone window; the DMA engine sees it through
a word-wide port (:class:`GmemPortSignature`) with a read and a write side, one used at
a time.
"""

from amaranth.hdl import Module, Signal, Cat, Mux
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..kernels.config import TileConfig
from . import wishbone
from .single_port_ram import SinglePortRam


__all__ = ["GMEM_BUS_ADDR_WIDTH", "GmemPortSignature", "GlobalMemory"]


#: Word-address bits of the host window: GMEM_SPAN (1 MiB) in 32-bit words.
GMEM_BUS_ADDR_WIDTH = 18


def _check_config(config):
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig, not {config!r}")


class GmemPortSignature(wiring.Signature):
    """The DMA engine's port into GMEM, from the DMA engine's point of view.

    A cycle reads or writes, not both (``re`` and ``we`` are never high together;
    ``wclaim`` can be high with ``re``: a write that waits for the read).
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
        The word read; valid the cycle after ``re`` only (not held: GMEM may read
        another word for the host in the cycles between).
    waddr : Out(range(gmem_words))
        Word address of a write.
    we : Out(1)
        Write ``wdata`` to ``waddr`` this cycle (the whole word).
    wdata : Out(word_bits)
    wclaim : Out(1)
        The port may write this cycle: high whenever ``we`` is, worked out from
        registers, and also in a cycle whose write is cancelled late (an abort). GMEM
        arbitrates its host's writes against it and steers its write port's address
        and data by it, so that the host's bus answer and the write data do not wait
        for the cancel (the ULX3S build's worst path did); only the write enable
        follows ``we``.

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
            "wclaim": Out(1),
        })

    def __eq__(self, other):
        return isinstance(other, GmemPortSignature) and self.config == other.config

    def __repr__(self):
        return f"GmemPortSignature({self.config!r})"


class GlobalMemory(wiring.Component):
    """Global memory of ``config.gmem_words`` words of ``config.word_bits``, with a
    host window and a DMA port.

    Host window: 32-bit word ``w`` of the window is bits ``[32*(w % k) +: 32]`` of
    memory word ``w // k`` with ``k = word_bytes // 4``, so host byte address ``a`` is
    byte ``a % word_bytes`` of word ``a // word_bytes`` (little-endian). Writes honour
    ``sel``. An access at or beyond ``gmem_bytes`` is answered with ERR at once.

    The DMA engine reads or writes, never both in one cycle (the port's ``re`` and
    ``we`` must not both be high), and is never held up. How the host gets in depends
    on ``ports``:

    * ``"dual"``: two read-write ports, one for the host and one for the DMA engine
      (what the simulators build; Yosys maps no such memory to block RAM, see
      ``docs/fpga.md``). Every host write is answered one cycle after ``stb`` is
      seen, a read two (its word registered). If the host and the DMA engine write
      the same word in the same cycle, which write wins is undefined.
    * ``"shared"``: one read port and one write port, for block RAMs that have no
      more (the ECP5 board top's choice). Writes are *posted*: they reach the
      memory at the end of the cycle after the write (a read in that cycle returns
      the old word). The DMA engine has the ports first: a host access waits while
      the DMA engine reads or writes and while a posted write lands, and is answered
      one cycle after the cycle it gets the ports (a read two). So the host never
      takes a word read in the cycle it is written (the read port reads every cycle,
      and only the words of cycles with no write are taken), nor does the DMA engine
      (a load starts two cycles after a store's last write at the earliest), except
      in a program that races a DMA load against a host write or a COMMIT's drain of
      the same word; the bitstream builds declare such a read undefined
      (``host/fpga.py``), which leaves the block RAMs without Yosys' emulation of
      the old word, whose address comparison was on the ULX3S build's worst path
      (step 35).
    * ``"single"``: one port (:class:`~fusetile.hdl.single_port_ram.SinglePortRam`:
      the iCE40UP's SPRAM, 128 KiB). A host access waits while the DMA engine reads
      or writes, and is answered one cycle after the cycle it gets the port (a read
      two).

    Parameters
    ----------
    config : TileConfig
    ports : str
        ``"dual"``, ``"shared"`` or ``"single"`` (above).

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
    ValueError
        If ``ports`` is not one of :attr:`PORTS`.
    """

    #: The ways GMEM's ports can be built (above).
    PORTS = ("dual", "shared", "single")

    def __init__(self, config, *, ports="dual"):
        _check_config(config)
        if ports not in self.PORTS:
            raise ValueError(f"ports must be one of {', '.join(self.PORTS)}, not {ports!r}")
        self._config = config
        self.ports = ports
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
        whole_word = (1 << cfg.word_bytes) - 1

        bus, dma = self.bus, self.dma
        answered = bus.ack | bus.err
        # A host read's word is registered before it is answered: from the block RAM
        # through the lane selection and the bus's multiplexers into the bridge's
        # buffer was one of the ULX3S build's worst paths (step 32). (Below: the lane
        # is chosen after the register.)
        reading = Signal()      # the read's word comes out of the memory this cycle
        access = bus.cyc & bus.stb & ~answered & ~reading
        in_range = bus.adr < cfg.gmem_bytes // 4
        # With 32-bit words (k == 1) the lane index is an empty slice: every
        # expression below still holds.
        lane = bus.adr[:lane_bits]
        word = bus.adr[lane_bits:]
        host_data = Cat(bus.dat_w for _ in range(k))
        host_sel = bus.sel << (4 * lane)

        # `go`: the host's access is carried out this cycle.
        go = Signal()
        if self.ports == "single":
            m.submodules.ram = ram = SinglePortRam(cfg.word_bits, cfg.gmem_words)
            m.d.comb += [
                go.eq(access & in_range & ~dma.wclaim & ~dma.re),
                ram.addr.eq(Mux(dma.re, dma.raddr, Mux(dma.wclaim, dma.waddr, word))),
                ram.re.eq(dma.re | (go & ~bus.we)),
                ram.wdata.eq(Mux(dma.wclaim, dma.wdata, host_data)),
                ram.we.eq(Mux(dma.we, whole_word, Mux(go & bus.we, host_sel, 0))),
                dma.rdata.eq(ram.rdata),
            ]
            host_rdata = ram.rdata
        elif self.ports == "shared":
            m.submodules.mem = mem = Memory(shape=cfg.word_bits, depth=cfg.gmem_words,
                                            init=[])
            w = mem.write_port(granularity=8)
            # The read port reads in every cycle (its `en` is left at 1): each side
            # takes its word the cycle after its own read, which selected the address.
            # An enable from the DMA engine's and the host's requests drove all 32 of
            # the ULX3S build's block RAMs (7.6 ns of wire; step 33).
            r = mem.read_port()
            # Writes are posted: registered, they reach the block RAM in the next
            # cycle, so that only registers drive its write port (the host's request
            # through the bus decoder into 32 block RAMs' write enables was the worst
            # path of the ULX3S build, step 35). A host access also waits out a
            # posted write, so it never reads a word in the cycle it is written.
            posted = w.en.any()
            m.d.comb += [
                go.eq(access & in_range & ~dma.wclaim & ~dma.re & ~posted),
                r.addr.eq(Mux(dma.re, dma.raddr, word)),
                dma.rdata.eq(r.data),
            ]
            m.d.sync += [
                w.addr.eq(Mux(dma.wclaim, dma.waddr, word)),
                w.data.eq(Mux(dma.wclaim, dma.wdata, host_data)),
                w.en.eq(Mux(dma.we, whole_word, Mux(go & bus.we, host_sel, 0))),
            ]
            host_rdata = r.data
        else:
            # Each side's read and write share an address: one read-write port each.
            m.submodules.mem = mem = Memory(shape=cfg.word_bits, depth=cfg.gmem_words,
                                            init=[])
            host_w = mem.write_port(granularity=8)
            host_r = mem.read_port()
            dma_w = mem.write_port(granularity=8)
            dma_r = mem.read_port()
            dma_addr = Mux(dma.we, dma.waddr, dma.raddr)
            m.d.comb += [
                go.eq(access & in_range),
                host_w.addr.eq(word),
                host_w.data.eq(host_data),
                host_w.en.eq(Mux(go & bus.we, host_sel, 0)),
                host_r.addr.eq(word),
                host_r.en.eq(go & ~bus.we),
                dma_r.addr.eq(dma_addr),
                dma_r.en.eq(dma.re),
                dma.rdata.eq(dma_r.data),
                dma_w.addr.eq(dma_addr),
                dma_w.data.eq(dma.wdata),
                dma_w.en.eq(Mux(dma.we, whole_word, 0)),
            ]
            host_rdata = host_r.data

        m.d.sync += [
            bus.ack.eq(go & bus.we | reading),
            bus.err.eq(access & ~in_range),
            reading.eq(go & ~bus.we),
        ]
        # The read's whole word is registered as it leaves the memory, and its lane
        # chosen after the register, on the way to the bus: the lane choice between
        # the block RAMs, spread over the device, and a register was 10.05 ns of
        # e0f2cb7's routed build (docs/fpga-timing.md, step 43). Registering the lane's word
        # a cycle later instead cost a bus cycle per host read.
        read_word = Signal(cfg.word_bits)
        read_lane = Signal(max(lane_bits, 1))
        with m.If(access):
            m.d.sync += read_lane.eq(lane)
        with m.If(reading):
            m.d.sync += read_word.eq(host_rdata)
        m.d.comb += bus.dat_r.eq(read_word if k == 1 else read_word.word_select(read_lane, 32))
        return m
