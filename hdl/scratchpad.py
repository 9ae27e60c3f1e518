"""The partitionable, banked scratchpad.

Word ``w`` of the scratchpad lives in bank ``w % spad_banks`` at row
``w // spad_banks``, so consecutive words are in different banks and units that
stream through memory (DMA, MAC array operand fetch, vector unit) can share it.

Every access is made as (partition, offset). A partition starts at a multiple of
``spad_banks`` words, so an offset's bank is the same in every partition and the
arbitration between units needs no adder. One partition is *open* at a time, the
executing kernel's (all of a kernel's scratchpad accesses, compute and DMA alike, are
made in its slot's partition, and a kernel returns only once they are done): the
partition table (base, length per partition; CSRs owned by the tile) gives its extent,
which is looked up once, when the open partition changes, and kept in registers. An
access to another partition, at or beyond the partition's length, to a partition that
does not exist (or does not start at a multiple of ``spad_banks``), or past the end
of the scratchpad is *not performed* and reported on the port's ``fault`` in the same
cycle. This is what keeps a kernel from corrupting a neighbour's data. (The lookup
was made per access and per port before: an eight-way selection of base and length
on every unit's path into the banks, the longest paths of the ULX3S build;
docs/fpga-timing.md, step 15.)

Units reach the scratchpad through ports of fixed priority. Each bank has one read
and one write port, so two ports that read (or write) the same bank in the same cycle
conflict: the port of higher priority is served, the other one is told to *stall* and
presents its access again.
"""

import operator
from functools import reduce
from types import SimpleNamespace

from amaranth.hdl import Module, Signal, Array, Cat, Mux, Value
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..kernels.config import TileConfig
from .compare import at_least
from .copies import copy


__all__ = ["SpadPortSignature", "Scratchpad", "point", "spad_read_parts",
           "registered_word"]


def point(offset, outside, value, limit):
    """Statements that set a unit's scratchpad ``offset`` register to ``value`` and
    ``outside`` to the partition test of it against ``limit`` (:attr:`Scratchpad.limit`
    of the open partition), registered with it: the units make the test as they set an
    address, so that none of their decisions waits for the port's ``fault``. ``limit``
    is at most 2**16, so an offset past the port's 16 bits is outside. (The test is a
    carry chain, :func:`~fusetile.hdl.compare.at_least`: as a comparison, Yosys built
    the compute unit's as ripples of LUTs.)"""
    value = Value.cast(value)[:len(offset)]
    return [offset.eq(value), outside.eq(at_least(value, limit))]


def _select(values, index):
    """``values[index]``, 0 past the end, as a tree of two-way multiplexers on the bits
    of ``index``. (An :class:`Array`'s selection is a case per value, each comparing
    the whole index: from `kernel_part` through it into the ports' limits was six
    LUTs, 10.23 ns of ce9846f's routed paths; docs/fpga-timing.md, step 48.)"""
    values = list(values) + [0] * ((1 << len(index)) - len(values))
    for bit in Value.cast(index):
        values = [Mux(bit, high, low) for low, high in zip(values[0::2], values[1::2])]
    return values[0]


def spad_read_parts(config):
    """How many parts a scratchpad port's read word comes in (``rdata_parts``)."""
    return (config.spad_banks + 1) // 2


def registered_word(m, port, name, *, load=None):
    """The word ``port`` read, through a register per part of it (``rdata_parts``).

    Returns the parts' OR: valid two cycles after the read, one LUT after the
    registers. (The bank selection's second LUT in front of a register was 10.3 ns
    of the ULX3S build's routed paths into the compute unit, 10.4 to 10.75 into the
    DMA engine's store word: docs/fpga-timing.md, steps 39 and 40.) With ``load``
    (a signal high in the cycle after each read the port performed), the registers
    take a word only then, and hold the last word read.
    """
    parts = [Signal(len(port.rdata), reset_less=True, name=f"{name}_{k}")
             for k in range(len(port.rdata_parts))]
    take = [part.eq(port.rdata_parts[k]) for k, part in enumerate(parts)]
    if load is None:
        m.d.sync += take
    else:
        with m.If(load):
            m.d.sync += take
    return reduce(operator.or_, parts)


def _check_config(config):
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig, not {config!r}")


def _bank_row(word, config):
    """(bank, row) of scratchpad word ``word`` (or of an offset from a row's start)."""
    banks = config.spad_banks
    if banks & (banks - 1) == 0:
        bank_bits = (banks - 1).bit_length()
        return word[:bank_bits], word[bank_bits:]
    return word % banks, word // banks


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
    repeat : Out(1)
        The access is a write presented again after it stalled: its data is the
        ``wdata`` of its first presentation (this cycle's is not used). A port whose
        write data comes straight from a block RAM (the DMA engine's, from GMEM)
        needs no register and selection of its own for the word that stalled: the
        selection after GMEM's block RAM was 10.19 ns of e0f2cb7's routed paths
        (docs/fpga-timing.md, step 42).
    rdata : In(word_bits)
        Word read; valid the cycle after a performed read (not held afterwards).
    rdata_parts : In(ArrayLayout(word_bits, ceil(spad_banks / 2)))
        The same word in parts whose OR is ``rdata``: each is the word of one of two
        banks, or 0. Each part is one LUT from the block RAMs' outputs (the bank
        selection is one-hot, from registers), so a unit that registers the parts and
        ORs them after its registers has the second LUT of the bank selection off its
        path from the block RAMs (5.8 ns of clock-to-output on the ULX3S;
        docs/fpga-timing.md, step 39).
    fault : In(1)
        Combinational, in the cycle of ``en``: the access is outside its partition
        (``part`` is not the open partition, ``offset >= length``, ``part >=
        partitions``, or ``base + offset >= spad_words``) and was not performed.
    stall : In(1)
        Combinational, in the cycle of ``en``: a port of higher priority uses the
        bank's read (or write) port this cycle; the access was not performed and must
        be presented again. ``fault`` wins over ``stall``: an access outside its
        partition may see both (``stall`` does not wait for the partition test).

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
            "repeat": Out(1),
            "rdata":  In(config.word_bits),
            "rdata_parts": In(data.ArrayLayout(config.word_bits, spad_read_parts(config))),
            "fault":  In(1),
            "stall":  In(1),
        })

    def __eq__(self, other):
        return isinstance(other, SpadPortSignature) and self.config == other.config

    def __repr__(self):
        return f"SpadPortSignature({self.config!r})"


class Scratchpad(wiring.Component):
    """``spad_banks`` banks of ``spad_bank_words`` words, accessed through partitions.

    Several units share the scratchpad through the ports of :attr:`PORTS`. Each bank
    has one read port and one write port (it maps to one FPGA block RAM), so
    arbitration is per bank and per direction: a port's read is performed unless a
    port of higher priority reads the same bank in the same cycle, and a write unless
    a port of higher priority writes the same bank. A read and a write of the same bank
    by different ports are both performed; if they are of the same word, the read
    returns the word as it was before the write. An access that loses its bank is not
    performed and is reported on the port's ``stall`` (present it again); an access
    outside its partition faults instead (and may see ``stall`` too: ``fault`` wins).
    Arbitration does not wait for the partition test: a faulting access still takes
    its bank, and a port of lower priority that wants the same bank stalls that
    cycle. (In the tile only the compute unit's ports
    are above another, and the control unit's operand check keeps their accesses
    inside the partition.)

    Every port has a read latency of 1 cycle. A write is *posted*: the cycle it is
    performed registers it, and it reaches its bank at the end of the next cycle. A
    read of the word in that next cycle returns the old word in simulation and an
    undefined one built for an FPGA (the bitstream builds declare the banks'
    collisions undefined: `fusetile.host.fpga.UNDEFINED_COLLISIONS`); a read from the
    cycle after on returns the new word. In the tile, only a program that races a DMA
    transfer against an instruction on the same words reads a word the cycle after
    it is written (``docs/architecture.md``, "Scratchpad races"). Any port may read or
    write: the roles listed below are how the tile uses them. A port left undriven is
    idle.

    Parameters
    ----------
    config : TileConfig

    Attributes
    ----------
    part_base : In(data.ArrayLayout(16, partitions))
        First scratchpad word of each partition (from the partition table CSRs). It
        must be a multiple of ``spad_banks``, so that an offset alone names its bank
        (offset ``o`` is in bank ``o % spad_banks`` in every partition); a partition
        whose base is not has no words (its ``limit`` is 0: every access faults).
    part_len : In(data.ArrayLayout(16, partitions))
        Length of each partition in words.
    part : In(4)
        The open partition. Its extent is registered: an access in cycle ``t`` is
        placed by ``part`` and ``part_base`` as they were in cycle ``t - 1``, and
        checked by ``part`` as it was then and ``part_len`` and ``part_base`` as they
        were in cycle ``t - 2``. So the open partition must hold still from the cycle
        before an access stream into it, and its table entry from two cycles before
        (the tile opens the executing slot's partition at CALL, two cycles before the
        kernel's first access, and refuses writes to its entry while the kernel runs).
    limit : Out(17)
        Registered: the number of offsets inside the open partition (an access at
        offset ``o`` is inside exactly when ``o < limit``): its length, cut at the end
        of the scratchpad; 0 for a partition that does not exist.
    a, b : In(SpadPortSignature(config))
        The compute unit's operand ports (it only reads through them); ``a`` has the
        highest priority.
    w : In(SpadPortSignature(config))
        The compute unit's result port (it only writes through it).
    dma : In(SpadPortSignature(config))
        The DMA engine's port (reads for stores, writes for loads); lowest priority.
    bank_reads : Out(spad_banks)
        Combinational: bit ``b`` is high in a cycle in which a read is performed in
        bank ``b``.
    bank_writes : Out(spad_banks)
        Combinational: bit ``b`` is high in a cycle in which a write is performed in
        bank ``b`` (it reaches the bank in the next).
    conflicts : Out(range(len(PORTS) + 1))
        Combinational: the number of accesses inside their partition stalled this
        cycle.
    abort : In(1)
        No access is performed this cycle (the units behind the ports are being
        aborted). Applied at the banks, after arbitration: the ports' ``fault`` and
        ``stall`` are as without it, and nothing else waits for it.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig`.
    """

    #: Access ports, highest priority first. The compute unit's operand reads come
    #: first so that a kernel's inner loop is not slowed by a DMA running beside it;
    #: the DMA engine only loses cycles, never words.
    PORTS = ("a", "b", "w", "dma")

    def __init__(self, config):
        _check_config(config)
        self._config = config
        members = {
            "part_base":   In(data.ArrayLayout(16, config.partitions)),
            "part_len":    In(data.ArrayLayout(16, config.partitions)),
            "part":        In(4),
            "limit":       Out(17),
            "bank_reads":  Out(config.spad_banks),
            "bank_writes": Out(config.spad_banks),
            "conflicts":   Out(range(len(self.PORTS) + 1)),
            "abort":       In(1),
        }
        for name in self.PORTS:
            members[name] = In(SpadPortSignature(config))
        super().__init__(members)

    @property
    def config(self):
        return self._config

    def _open(self, m):
        """The open partition's number and extent, registered, for each port (a dict
        of port name to (part, first row, limit)), where ``limit`` is the number of
        offsets inside it (its length cut at the end of the scratchpad; 0 if it does
        not exist or its base is not a multiple of ``spad_banks``).

        Every partition's limit is worked out from the table ahead, so that opening a
        partition is a selection, not arithmetic after one: its room from its base in
        one cycle, the limit from the room and its length in the next (in one, the two
        comparisons and the subtraction were 136 of the ULX3S build's late endpoints).
        A length written reaches the checks two cycles later, a base three (its room,
        the limit, the open partition's limit), sooner than the host's next bus access
        can start a kernel. Built for area, the open partition's limit alone is worked
        out, after the selection: a base or a length written reaches the checks a
        cycle later."""
        cfg = self._config

        def room(base):
            """Words from ``base`` to the scratchpad's end (0 unless it is the first word
            of a row)."""
            aligned = _bank_row(base, cfg)[0] == 0
            return Mux((base < cfg.spad_words) & aligned, cfg.spad_words - base, 0)

        limits = []
        if not cfg.compact:
            for p in range(cfg.partitions):
                base, length = self.part_base[p], self.part_len[p]
                part_room = Signal(17, name=f"part{p}_room")
                part_limit = Signal(17, name=f"part{p}_limit")
                m.d.sync += part_room.eq(room(base))
                m.d.sync += part_limit.eq(Mux(length < part_room, length, part_room))
                limits.append(part_limit)
        open_part = Signal(4)
        m.d.sync += open_part.eq(self.part)
        first_row = Signal(16)
        limit = Signal(17)
        bases = [_bank_row(self.part_base[p], cfg)[1] for p in range(cfg.partitions)]
        if cfg.compact:
            # Built for area, only the open partition's limit is worked out, from its
            # entry after the selection, in the cycle the partition opens.
            base, length = _select(self.part_base, self.part), _select(self.part_len, self.part)
            open_room = room(base)
            m.d.comb += [first_row.eq(_select(bases, self.part)),
                         limit.eq(Mux(length < open_room, length, open_room))]
        else:
            m.d.comb += [first_row.eq(_select(bases, self.part)),
                         limit.eq(_select(limits, self.part))]
        m.d.sync += self.limit.eq(limit)
        # Each port tests and places its accesses with registers of its own, copies
        # (`copy`) that the build keeps apart: one register for all four ports sat
        # across the device from some of their adders (5.35 ns of wire from the open
        # partition's first row into the row adder of `b`, on the way into a bank's
        # read address, in step 36's best ULX3S build).
        extents = {}
        for name in self.PORTS:
            port_row = copy(Signal(16, name=f"{name}_open_row"))
            port_limit = copy(Signal(17, name=f"{name}_limit"))
            m.d.sync += [port_row.eq(first_row), port_limit.eq(limit)]
            extents[name] = open_part, port_row, port_limit
        return extents

    def _decode(self, m, name, port, extent):
        """Resolve a port's (part, offset) into (inside, bank, row); drives ``fault``
        (``inside`` and ``fault`` imply ``en``)."""
        cfg = self._config
        open_part, open_row, limit = extent
        outside = (port.part != open_part) | (port.offset >= limit)
        inside = Signal(name=f"{name}_inside")
        m.d.comb += [
            port.fault.eq(port.en & outside),
            inside.eq(port.en & ~outside),
        ]
        # The partition starts at a bank's first word, so the offset alone names the
        # bank: no adder in front of the arbitration, only beside it on the row.
        bank, in_row = _bank_row(port.offset, cfg)
        row = Signal(17, name=f"{name}_row")
        m.d.comb += row.eq(open_row + in_row)
        return inside, bank, row

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        extents = self._open(m)

        mems = []
        for b in range(cfg.spad_banks):
            mem = Memory(shape=cfg.word_bits, depth=cfg.spad_bank_words, init=[])
            m.submodules[f"bank{b}"] = mem
            wp, rp = mem.write_port(), mem.read_port()
            mems.append((wp, rp))

        # Requests in priority order. A request claims its bank whether or not the
        # access is inside its partition: the partition test (a comparison with the
        # limit) is then beside the bank selection, not in front of every grant below
        # it (it was on the compute unit's path from an operand's offset through the
        # grants into its pointers), nor does a port's stall: the DMA engine tests its
        # own accesses ahead, and its stall decides its every address register
        # (docs/fpga-timing.md, step 33). A faulting access is not performed; its stall does
        # not count.
        reqs = []
        for name in self.PORTS:
            port = getattr(self, name)
            inside, bank, row = self._decode(m, name, port, extents[name])
            rd = Signal(name=f"{name}_rd")
            wr = Signal(name=f"{name}_wr")
            m.d.comb += [rd.eq(port.en & ~port.we), wr.eq(port.en & port.we)]
            reqs.append(SimpleNamespace(name=name, port=port, inside=inside, rd=rd, wr=wr,
                                        bank=bank, row=row))

        stalls = []
        for i, req in enumerate(reqs):
            higher = reqs[:i]
            rd_lost = Cat(h.rd & (h.bank == req.bank) for h in higher).any()
            wr_lost = Cat(h.wr & (h.bank == req.bank) for h in higher).any()
            req.rd_claim = Signal(name=f"{req.name}_rd_claim")
            req.rd_grant = Signal(name=f"{req.name}_rd_grant")
            req.wr_grant = Signal(name=f"{req.name}_wr_grant")
            m.d.comb += [
                req.rd_claim.eq(req.rd & ~rd_lost),
                req.rd_grant.eq(req.rd_claim & req.inside),
                req.wr_grant.eq(req.wr & req.inside & ~wr_lost),
                req.port.stall.eq(req.rd & rd_lost | req.wr & wr_lost),
            ]
            stalls.append(req.port.stall & req.inside)

        # Grants are one per bank and direction, so these are plain selects. Writes
        # are posted (above): a bank's write port is driven from registers only, not
        # through the units' requests, the partition test and the grants (6c60865's
        # routed worst path ended at a bank's write enable). Every port's word and row
        # are registered each cycle, granted or not, and each bank registers which
        # port it writes for: the wide registers load without an enable from the
        # grants, which was the ULX3S build's second worst path (13.9 ns, step 31).
        # A port's word holds while it repeats a stalled write (`repeat`, a register
        # of the unit's).
        for req in reqs:
            req.posted_row = Signal.like(req.row, name=f"{req.name}_posted_row",
                                         reset_less=True)
            req.posted_data = Signal.like(req.port.wdata, name=f"{req.name}_posted_data",
                                          reset_less=True)
            m.d.sync += req.posted_row.eq(req.row)
            with m.If(~req.port.repeat):
                m.d.sync += req.posted_data.eq(req.port.wdata)
        posted_rows = Array(req.posted_row for req in reqs)
        posted_data = Array(req.posted_data for req in reqs)
        reads, writes = [], []
        for b, (wp, rp) in enumerate(mems):
            write = Signal(name=f"bank{b}_write")
            writer = Signal(range(len(reqs)), name=f"bank{b}_writer")
            # The address is that of the first port (in priority order) that reads
            # the bank, which is the port that claims it: a priority selection on each
            # port's own request, with no claim (the ports above it) in front of it.
            # Neither the partition test (step 31's routed worst path, the limit
            # through the grant into a bank's read address) nor the claims are on it
            # (they were 54 of step 33's late endpoints, 12.6 ns). The last port's
            # row is the default, unconditional: the address matters only when the
            # bank reads (`reading`), and the last port's test in front of its row was
            # one LUT more on the DMA engine's way into the banks (10.4 to 11.1 ns,
            # 7a057ba's ULX3S builds, docs/fpga-timing.md step 40).
            with m.If(reqs[0].rd & (reqs[0].bank == b)):
                m.d.comb += rp.addr.eq(reqs[0].row)
            for req in reqs[1:-1]:
                with m.Elif(req.rd & (req.bank == b)):
                    m.d.comb += rp.addr.eq(req.row)
            with m.Else():
                m.d.comb += rp.addr.eq(reqs[-1].row)
            # Likewise the bank reads whenever a port reads it, inside its partition or
            # not: a read has no effect but its word, which only the port it is granted
            # to takes (`read_bank`), and none at all on an abort. With the partition
            # test in front of it (the limit through the grant), the read enable was
            # the worst path of step 34's last build (13.01 ns).
            reading = Signal(name=f"bank{b}_reading")
            m.d.comb += reading.eq(Cat(req.rd & (req.bank == b) for req in reqs).any())
            m.d.comb += rp.en.eq(reading & ~self.abort)
            performed = Signal(name=f"bank{b}_performed")
            m.d.comb += performed.eq(
                Cat(req.rd_grant & (req.bank == b) for req in reqs).any() & ~self.abort)
            reads.append(performed)
            # The writer is the first port (in priority order) that writes the bank,
            # which is the port that claims it, whether or not its access is inside
            # its partition: `writer` loads from the requests alone, and only the
            # enable (`write`) waits for the partition test. (From the limit
            # through the grants into `writer`'s enable was 3 of the late endpoints
            # of each bank in step 36's best ULX3S build.)
            with m.If(reqs[0].wr & (reqs[0].bank == b)):
                m.d.sync += writer.eq(0)
            for i, req in enumerate(reqs[1:], 1):
                with m.Elif(req.wr & (req.bank == b)):
                    m.d.sync += writer.eq(i)
            for req in reqs:
                with m.If(req.wr_grant & (req.bank == b)):
                    m.d.comb += write.eq(~self.abort)
            m.d.sync += wp.en.eq(write)
            m.d.comb += [wp.addr.eq(posted_rows[writer]), wp.data.eq(posted_data[writer])]
            writes.append(write)

        for req in reqs:
            # A bank's read data is only valid the cycle after the read, and the next
            # read (by any port) replaces it: each port takes its word from the bank
            # it addressed the cycle before, read or not (with the grant in front of
            # its enable, the partition test was on the way into it). The selection is
            # one-hot, in parts of two banks (`rdata_parts`).
            read_sel = Signal(cfg.spad_banks, name=f"{req.name}_read_sel")
            m.d.sync += read_sel.eq(Cat(req.bank == b for b in range(cfg.spad_banks)))
            words = [Mux(read_sel[b], rp.data, 0) for b, (_, rp) in enumerate(mems)]
            parts = [words[i] | (words[i + 1] if i + 1 < len(words) else 0)
                     for i in range(0, len(words), 2)]
            m.d.comb += [req.port.rdata_parts[k].eq(part) for k, part in enumerate(parts)]
            m.d.comb += req.port.rdata.eq(reduce(operator.or_, parts))

        m.d.comb += [
            self.bank_reads.eq(Cat(reads)),
            self.bank_writes.eq(Cat(writes)),
            self.conflicts.eq(sum(stalls)),
        ]
        return m
