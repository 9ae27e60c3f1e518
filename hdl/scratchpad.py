"""The partitionable, banked scratchpad.

Word ``w`` of the scratchpad lives in bank ``w % spad_banks`` at row
``w // spad_banks``, so consecutive words are in different banks and units that
stream through memory (DMA, MAC array operand fetch, vector unit) can share it.

Every access is made as (partition, offset). The partition table (base, length per
partition; CSRs owned by the tile) turns it into a scratchpad word; an access at or
beyond the partition's length, to a partition that does not exist, or past the end of
the scratchpad is *not performed* and reported on the port's ``fault`` in the same
cycle. This is what keeps a kernel from corrupting a neighbour's data.
"""

from amaranth.hdl import Module, Signal, Array
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..kernels.config import TileConfig


__all__ = ["SpadPortSignature", "Scratchpad"]


def _check_config(config):
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig, not {config!r}")


class SpadPortSignature(wiring.Signature):
    """An access port into the scratchpad, from the accessing unit's point of view.

    Parameters
    ----------
    config : TileConfig

    Members
    -------
    part : Out(4)
        Partition of the access.
    offset : Out(16)
        Word offset within the partition.
    en : Out(1)
        Access this cycle.
    we : Out(1)
        The access is a write of ``wdata`` (else a read).
    wdata : Out(word_bits)
    rdata : In(word_bits)
        Word read; valid the cycle after a performed read (not held afterwards).
    fault : In(1)
        Combinational, in the cycle of ``en``: the access is outside its partition
        (``offset >= length``, ``part >= partitions``, or ``base + offset >=
        spad_words``) and was not performed.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig`.
    """

    def __init__(self, config):
        _check_config(config)
        self.config = config
        super().__init__({
            "part":   Out(4),
            "offset": Out(16),
            "en":     Out(1),
            "we":     Out(1),
            "wdata":  Out(config.word_bits),
            "rdata":  In(config.word_bits),
            "fault":  In(1),
        })

    def __eq__(self, other):
        return isinstance(other, SpadPortSignature) and self.config == other.config

    def __repr__(self):
        return f"SpadPortSignature({self.config!r})"


class Scratchpad(wiring.Component):
    """``spad_banks`` banks of ``spad_bank_words`` words, accessed through partitions.

    Parameters
    ----------
    config : TileConfig

    Attributes
    ----------
    part_base : In(data.ArrayLayout(16, partitions))
        First scratchpad word of each partition (from the partition table CSRs).
    part_len : In(data.ArrayLayout(16, partitions))
        Length of each partition in words.
    dma : In(SpadPortSignature(config))
        The DMA engine's port. Read latency 1 cycle; a write takes effect at the clock
        edge (a read of the same word in the next cycle sees it).
    reads : Out(1)
        Combinational pulse in the cycle of each performed read.
    writes : Out(1)
        Combinational pulse in the cycle of each performed write.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig`.
    """

    #: Access ports, highest priority first. Later units (MAC operand fetch, vector
    #: unit) are added here; elaborate() already decodes and routes every port in this
    #: list, but a bank has one read and one write port, so until bank-conflict
    #: arbitration (a per-port ``grant``/stall) is added, only one port may be used.
    PORTS = ("dma",)

    def __init__(self, config):
        _check_config(config)
        self._config = config
        members = {
            "part_base": In(data.ArrayLayout(16, config.partitions)),
            "part_len":  In(data.ArrayLayout(16, config.partitions)),
            "reads":     Out(1),
            "writes":    Out(1),
        }
        for name in self.PORTS:
            members[name] = In(SpadPortSignature(config))
        super().__init__(members)

    @property
    def config(self):
        return self._config

    def _decode(self, m, name, port):
        """Resolve a port's (part, offset) into (performed, bank, row)."""
        cfg = self._config
        part_ok = port.part < cfg.partitions
        base = self.part_base[port.part]
        length = self.part_len[port.part]
        word = Signal(17, name=f"{name}_word")
        m.d.comb += word.eq(base + port.offset)
        outside = ~part_ok | (port.offset >= length) | (word >= cfg.spad_words)
        performed = Signal(name=f"{name}_performed")
        m.d.comb += [
            port.fault.eq(port.en & outside),
            performed.eq(port.en & ~outside),
        ]
        banks = cfg.spad_banks
        if banks & (banks - 1) == 0:
            bank_bits = (banks - 1).bit_length()
            bank, row = word[:bank_bits], word[bank_bits:]
        else:
            bank, row = word % banks, word // banks
        return performed, bank, row

    def elaborate(self, platform):
        cfg = self._config
        m = Module()

        mems = []
        for b in range(cfg.spad_banks):
            mem = Memory(shape=cfg.word_bits, depth=cfg.spad_bank_words, init=[])
            m.submodules[f"bank{b}"] = mem
            wp, rp = mem.write_port(), mem.read_port()
            # A read port's `en` is 1 unless driven: only read on a performed read.
            m.d.comb += rp.en.eq(0)
            mems.append((wp, rp))

        for name in self.PORTS:
            port = getattr(self, name)
            performed, bank, row = self._decode(m, name, port)
            # Banks are driven in PORTS order: the first port to claim a bank in a
            # cycle gets it (the `If` below is the place for a conflict check).
            for b, (wp, rp) in enumerate(mems):
                with m.If(performed & (bank == b)):
                    m.d.comb += [
                        wp.addr.eq(row),
                        wp.data.eq(port.wdata),
                        wp.en.eq(port.we),
                        rp.addr.eq(row),
                        rp.en.eq(~port.we),
                    ]
            read_bank = Signal(range(cfg.spad_banks), name=f"{name}_read_bank")
            with m.If(performed & ~port.we):
                m.d.sync += read_bank.eq(bank)
            m.d.comb += port.rdata.eq(Array(rp.data for _, rp in mems)[read_bank])
            m.d.comb += [
                self.reads.eq(performed & ~port.we),
                self.writes.eq(performed & port.we),
            ]
        return m
