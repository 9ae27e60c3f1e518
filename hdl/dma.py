"""The DMA engine: 2-D strided copies between GMEM and the scratchpad.

One word moves per cycle. A transfer is a pipeline: the *issue* stage walks the 2-D
address pattern and reads the source (GMEM for a load, the scratchpad for a store);
the *write* stage writes the word it read to the destination, one cycle later for a
load, two for a store (whose word is registered first). Address checks happen where
the access is made, so a transfer that runs out of its partition or off the end of
GMEM stops before it writes anything it must not: every word before the faulting one
is written, no word after it is.

The scratchpad port may *stall* (a unit of higher priority uses the bank). A stalled
access is presented *again* in the next cycle, from registers that kept it: the offset
on the port, and for a load the word, which the scratchpad keeps (the port's
``repeat``: the word goes from GMEM's block RAM straight onto the port). The issue
stage does not wait for the stall: in the cycle of a stall it goes on to the next
word, and it waits in the cycle of the replay instead, a decision from a register. A
load's next word, read from GMEM in the cycle of the stall, is lost while the replay
is written, so the replay's cycle reads it again (``prev_*``: the last word the issue
stage left). The GMEM writes of a store's words read before a stall still complete. A
stall costs one cycle and no word, and decides only the port's registers (its offset,
the write stage's valid bits and the replay's), not the address registers: from the
compute unit's read request through the scratchpad's arbitration into the enables of
every address register was the ULX3S build's most common late path (step 36,
docs/fpga-timing.md).

The engine makes the scratchpad's partition test itself, as it sets an address: the
offset against the open partition's ``limit``, registered with the offset. It presents
no access the test finds outside (it faults instead), so nothing it decides waits for
the scratchpad's own test, which it would otherwise meet twice on the way to every
address register's enable: in ``fault`` and in ``stall`` (the ULX3S build's most
common late endpoints after the kernel store's, step 33).
"""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..kernels.config import TileConfig
from ..kernels.isa import FaultCause
from .gmem import GmemPortSignature
from .scratchpad import SpadPortSignature, registered_word


__all__ = ["DmaCommand", "Dma"]


class DmaCommand(data.Struct):
    """One DMA transfer: ``rows`` x ``cols`` words.

    Row ``r``, column ``c`` is GMEM word ``gmem_addr + r * gmem_stride + c`` and
    scratchpad offset ``spad_addr + r * spad_stride + c`` in partition ``part``.
    Words move in row-major order.
    """
    store:       1    #: 0: GMEM -> scratchpad (load); 1: scratchpad -> GMEM (store)
    gmem_addr:   24   #: absolute GMEM word address (already relocated)
    gmem_stride: 16
    part:        4
    spad_addr:   16
    spad_stride: 16
    rows:        12
    cols:        12


# Wide enough for gmem_addr + 4095 * gmem_stride + 4095 (and the scratchpad
# equivalent) without wrapping, so an address past the end is seen, not aliased.
_ADDR_BITS = 32


def _address_bits(config):
    """Bits of the engine's GMEM and scratchpad address registers: ``_ADDR_BITS`` for
    each, or built for area (``config.compact``) only as many as the addresses a
    transfer uses can need. Every address a transfer uses but its first is an address
    that passed its check (below GMEM's size, or the partition's limit and so 2**16)
    plus a 16-bit stride or 1, and the first is the command's (24 or 16 bits): so the
    address of the word that faults, the one the fault reports, is exact too. (An
    address worked out ahead from a first that faults may wrap; it is never used.)"""
    if not config.compact:
        return _ADDR_BITS, _ADDR_BITS
    layout = DmaCommand.as_shape()
    in_range = max((config.gmem_words - 1).bit_length(), layout["gmem_stride"].width)
    return (max(layout["gmem_addr"].width, in_range + 1),
            max(layout["spad_addr"].width, layout["spad_stride"].width) + 1)


class Dma(wiring.Component):
    """2-D strided DMA between GMEM and the scratchpad, one word per cycle.

    A command is accepted (``cmd.ready``) only while the engine is idle and not
    faulted; ``ready`` does not wait for ``abort``: a command accepted in an abort's
    cycle is dropped with it. A transfer of ``rows * cols`` words keeps ``busy`` high for
    ``rows * cols + 1`` cycles plus one per stalled scratchpad access, starting the
    cycle after the command is accepted (a store: ``rows * cols + 2``); a command with
    ``rows == 0`` or ``cols == 0`` is accepted and completes at once (``busy`` stays
    low, no access).

    Faults: for each word, the GMEM address is checked first (``>= gmem_words``:
    GMEM_RANGE, ``fault_addr`` = the GMEM word address), then the scratchpad offset
    (``>= limit``, which covers offsets ``>= 2**16``: PARTITION, ``fault_addr`` = the
    offset). ``limit`` must be that of the command's partition, open in the scratchpad,
    from the cycle the command is accepted until the transfer ends (the tile opens
    the calling slot's partition at CALL; a kernel's partition does not change under
    it). The faulting word and every later one are not
    written; every earlier one is. The engine then stops (``busy`` low) with ``fault``
    high and the cause latched until ``abort``. A transfer that faults after ``n``
    words is busy ``n + 1`` cycles, ``n + 2`` for a store (the words before the fault
    are written first) and for a load's PARTITION fault (found by the write stage).

    Parameters
    ----------
    config : TileConfig

    Attributes
    ----------
    cmd : In(stream.Signature(DmaCommand))
        Commands, valid/ready.
    gmem : Out(GmemPortSignature(config))
        To :attr:`GlobalMemory.dma`.
    spad : Out(SpadPortSignature(config))
        To a scratchpad access port (:attr:`Scratchpad.dma`); ``stall`` is honoured,
        ``fault`` is never raised (the engine tests its accesses first).
    limit : In(17)
        :attr:`Scratchpad.limit`: the offsets inside the open partition.
    busy : Out(1)
        A transfer is in progress (accepted, not finished, not faulted).
    word_in : Out(1)
        Pulse per word written to the scratchpad (load).
    word_out : Out(1)
        Pulse per word written to GMEM (store).
    fault : Out(1)
        Sticky: the engine stopped on a fault. Cleared by ``abort``.
    fault_cause : Out(FaultCause)
        PARTITION or GMEM_RANGE while ``fault``; NONE otherwise.
    fault_addr : Out(32)
        Scratchpad offset (PARTITION) or GMEM word address (GMEM_RANGE).
    fault_part : Out(4)
        Partition of the faulting transfer.
    abort : In(1)
        Drop the current transfer at once, clear the fault and go idle. No GMEM write
        is made in this cycle and no word counted; the scratchpad access the engine
        presents in this cycle must be cancelled by the scratchpad
        (:attr:`Scratchpad.abort`, wired to the same signal).

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig`.
    """

    def __init__(self, config):
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        self._config = config
        super().__init__({
            "cmd":         In(stream.Signature(DmaCommand)),
            "gmem":        Out(GmemPortSignature(config)),
            "spad":        Out(SpadPortSignature(config)),
            "limit":       In(17),
            "busy":        Out(1),
            "word_in":     Out(1),
            "word_out":    Out(1),
            "fault":       Out(1),
            "fault_cause": Out(FaultCause),
            "fault_addr":  Out(32),
            "fault_part":  Out(4),
            "abort":       In(1),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        gmem_bits, spad_bits = _address_bits(cfg)

        running = Signal()      # a transfer is in progress
        store = Signal()
        part = Signal(4)
        gmem_stride = Signal(16)
        spad_stride = Signal(16)
        last_row = Signal(12)   # rows - 1
        last_col = Signal(12)   # cols - 1
        # Whether the issue stage's word is the last of its row (of the transfer), set
        # a word ahead: the advance decides from a register, not a 12-bit comparison
        # (from `col` through the comparison into the offset registers was 10.59 ns
        # of step 37's first ULX3S build).
        col_last = Signal()
        row_last = Signal()

        # Issue stage: the word at (row, col).
        issuing = Signal()
        row = Signal(12)
        col = Signal(12)
        gaddr = Signal(gmem_bits)
        gmem_oob = Signal()     # gaddr >= gmem_words, worked out as gaddr is set
        saddr = Signal(spad_bits)
        spad_oob = Signal()     # saddr >= limit, worked out as saddr is set
        # The first word of the next row, kept ahead, and the open partition's limit
        # less one, a cycle behind (the limit does not change under a transfer): an
        # address set by an advance and its range test each come from registers
        # through one adder or one comparison, not an adder and then a comparison
        # (the DMA engine's late endpoints on the ULX3S at 3247880, docs/fpga-timing.md
        # step 35).
        next_row_gaddr = Signal(gmem_bits)
        next_row_saddr = Signal(spad_bits)
        limit_less_1 = Signal(signed(18))
        m.d.sync += limit_less_1.eq(self.limit - 1)

        # Write stage: the word read by the issue stage in the previous cycle, or (a
        # load whose scratchpad write stalled, `again`) the one the scratchpad kept.
        wvalid = Signal()
        w_gaddr = Signal(gmem_bits)
        # The offset on the scratchpad port, a register of its own: the write stage's
        # for a load, a copy of `saddr` for a store (a choice between two registers
        # was in front of the scratchpad's row adder and bank address, step 35). After
        # a stall it keeps the stalled access's offset while the issue stage goes on.
        port_offset = Signal(spad_bits)
        w_spad_oob = Signal()
        # What the offset becomes unless the port's access stalls, from the engine's
        # registers only; a stall keeps the offset. The stall comes through the
        # scratchpad's arbitration from the compute unit's requests: chosen in the
        # last LUT, not in front of the engine's decisions, it is not in series with
        # them (it was, in the deepest LUT chains of the design: `port_offset`, 7
        # LUTs from the compute unit's registers in `scripts/timing_paths.py
        # --deepest`, docs/fpga-timing.md step 46).
        next_offset = Signal(spad_bits)
        m.d.comb += next_offset.eq(port_offset)
        with m.If(~self.spad.stall):
            m.d.sync += port_offset.eq(next_offset)
        # The access on the port this cycle is one that stalled in the last: a load
        # repeats its write, and the issue stage waits while it is replayed.
        again = Signal()
        # The last word the issue stage left (its GMEM address, scratchpad offset and
        # partition test). `reread`: a load's word read in a stall's cycle, which the
        # replay's cycle reads again and writes next.
        prev_gaddr = Signal(gmem_bits)
        prev_saddr = Signal(spad_bits)
        prev_spad_oob = Signal()
        reread = Signal()

        # A store's GMEM write stage, a cycle after the scratchpad's word is read: the
        # word is registered first (`sword`, in the scratchpad's parts). From the
        # scratchpad's block RAM to GMEM's and the staging buffer's write data in one
        # cycle was 120 of the ULX3S build's late endpoints (step 32). A fault found
        # by the issue stage waits (`pend_*`) until the words before it are written.
        w2valid = Signal()
        w2_gaddr = Signal(gmem_bits)
        sword = registered_word(m, self.spad, "sword")
        pend = Signal()
        pend_cause = Signal(FaultCause)
        pend_addr = Signal(max(gmem_bits, spad_bits))

        m.d.comb += [
            self.busy.eq(running),
            self.cmd.ready.eq(~running & ~self.fault),
            self.spad.part.eq(part),
            self.spad.offset.eq(port_offset),
        ]

        def stop(cause, addr):
            m.d.sync += [
                running.eq(0),
                issuing.eq(0),
                wvalid.eq(0),
                w2valid.eq(0),
                again.eq(0),
                reread.eq(0),
                pend.eq(0),
                self.fault.eq(1),
                self.fault_cause.eq(cause),
                self.fault_addr.eq(addr),
                self.fault_part.eq(part),
            ]

        def set_gaddr(value, outside):
            # The range check is registered with the address: compared where the
            # address is used, it came before the engine's decisions in one path.
            m.d.sync += [gaddr.eq(value[:len(gaddr)]), gmem_oob.eq(outside)]

        def set_saddr(value, outside):
            # Likewise the partition test. A store's port offset is a copy, except
            # that it keeps a stalled read's offset for the replay.
            m.d.sync += [saddr.eq(value[:len(saddr)]), spad_oob.eq(outside)]
            with m.If(store):
                m.d.comb += next_offset.eq(value[:len(saddr)])

        def advance():
            # The issue stage leaves its word: whether the word's access stalls
            # decides nothing here.
            m.d.sync += [
                prev_gaddr.eq(gaddr),
                prev_saddr.eq(saddr),
                prev_spad_oob.eq(spad_oob),
            ]
            with m.If(col_last):
                m.d.sync += [
                    col.eq(0),
                    col_last.eq(last_col == 0),
                    row.eq(row + 1),
                    row_last.eq(row + 1 == last_row),
                    next_row_gaddr.eq(next_row_gaddr + gmem_stride),
                    next_row_saddr.eq(next_row_saddr + spad_stride),
                ]
                set_saddr(next_row_saddr, next_row_saddr >= self.limit)
                set_gaddr(next_row_gaddr, next_row_gaddr >= cfg.gmem_words)
                with m.If(row_last):
                    m.d.sync += issuing.eq(0)
            with m.Else():
                m.d.sync += [col.eq(col + 1), col_last.eq(col + 1 == last_col)]
                # (No address used wraps: `_address_bits`.)
                if cfg.compact:
                    # Built for area, the next offset itself against the limit (no
                    # `limit_less_1`, which is then left out).
                    set_saddr(saddr + 1, saddr + 1 >= self.limit)
                else:
                    set_saddr(saddr + 1, saddr >= limit_less_1)
                set_gaddr(gaddr + 1, gaddr >= cfg.gmem_words - 1)

        # The ports are driven from the engine's own state only; `abort` acts last: on
        # the registers here, and on the scratchpad's banks there (the tile wires
        # `Scratchpad.abort` to the same signal).
        with m.If(~running):
            # A command's operands load in every cycle the engine is idle, whether the
            # queue offers one or not (they mean nothing until `running` rises): only
            # the state waits for `valid`. (The queue's `valid` in front of every
            # operand register's enable was 10.17 ns of ce9846f's routed paths, into
            # `row`; docs/fpga-timing.md, step 48.)
            p = self.cmd.payload
            m.d.sync += [
                store.eq(p.store),
                part.eq(p.part),
                gmem_stride.eq(p.gmem_stride),
                spad_stride.eq(p.spad_stride),
                last_row.eq(p.rows - 1),
                last_col.eq(p.cols - 1),
                row_last.eq(p.rows == 1),
                col_last.eq(p.cols == 1),
                row.eq(0),
                col.eq(0),
                next_row_gaddr.eq(p.gmem_addr + p.gmem_stride),
                next_row_saddr.eq(p.spad_addr + p.spad_stride),
            ]
            m.d.comb += next_offset.eq(p.spad_addr)
            set_saddr(p.spad_addr, p.spad_addr >= self.limit)
            set_gaddr(p.gmem_addr, p.gmem_addr >= cfg.gmem_words)
            with m.If(self.cmd.valid & self.cmd.ready):
                empty = (p.rows == 0) | (p.cols == 0)
                m.d.sync += [
                    running.eq(~empty),
                    issuing.eq(~empty),
                    wvalid.eq(0),
                    w2valid.eq(0),
                    again.eq(0),
                    reread.eq(0),
                    pend.eq(0),
                ]

        with m.Elif(~store):
            # Load. Write stage first: it holds the earlier word, so its fault wins.
            write_fault = Signal()
            write_stall = Signal()
            m.d.comb += [
                self.spad.we.eq(1),
                self.spad.wdata.eq(self.gmem.rdata),
                self.spad.repeat.eq(again),
            ]
            with m.If(wvalid):
                m.d.comb += [
                    self.spad.en.eq(~w_spad_oob),
                    write_fault.eq(w_spad_oob),
                    write_stall.eq(self.spad.stall),
                    self.word_in.eq(~write_fault & ~write_stall),
                ]
            m.d.sync += [wvalid.eq(0), again.eq(0), reread.eq(0)]
            # The read does not wait for the write stage: GMEM's read port (and the
            # host's reads behind it) no longer waits for the scratchpad's arbitration
            # (the ULX3S build's worst paths ran from there into GMEM's read address).
            # In a replay's cycle (`reread`, set only with `again`) the port reads the
            # word read in the stall's cycle again, and the issue stage waits; else it
            # reads its own word and moves on, stall or not. A write fault stops the
            # engine in this cycle, and `stop` wins over what the advance would change
            # (a new command sets all of that again): the advance does not wait for it.
            # The write stage's partition test and `again` in front of the advance
            # were 10.60 ns of e0f2cb7's routed paths, into the next row's addresses
            # (docs/fpga-timing.md step 41).
            issue = Signal()
            m.d.comb += [
                issue.eq(issuing & ~gmem_oob & ~reread),
                self.gmem.raddr.eq(Mux(reread, prev_gaddr, gaddr)),
                self.gmem.re.eq(reread | (issuing & ~gmem_oob)),
            ]
            with m.If(issue):
                advance()
            # The port's next word, unless this cycle's write stalls (which keeps the
            # offset, above) or faults (which stops the engine): the replay's, else the
            # issue stage's.
            with m.If(reread):
                m.d.comb += next_offset.eq(prev_saddr)
            with m.Elif(issuing & ~gmem_oob):
                m.d.comb += next_offset.eq(saddr)
            with m.If(write_fault):
                stop(FaultCause.PARTITION, port_offset)
            with m.Elif(write_stall):
                # Present the word again next cycle, and keep the word read now (if
                # one was) to read again then.
                m.d.sync += [wvalid.eq(1), again.eq(1), reread.eq(reread | issue)]
            with m.Elif(reread):
                # The replay is written: the word read again now is written next.
                m.d.sync += [wvalid.eq(1), w_spad_oob.eq(prev_spad_oob)]
            with m.Elif(issuing):
                with m.If(gmem_oob):
                    stop(FaultCause.GMEM_RANGE, gaddr)
                with m.Else():
                    m.d.sync += [wvalid.eq(1), w_spad_oob.eq(spad_oob)]
            with m.Elif(wvalid):
                m.d.sync += running.eq(0)       # the last word is written this cycle

        with m.Else():
            # Store: issue (the scratchpad read), then the word registered (`wvalid`),
            # then the GMEM write (`w2valid`). The words behind the issue stage have
            # been checked: they always complete.
            present = Signal()
            m.d.comb += [
                present.eq(again | (issuing & ~gmem_oob & ~spad_oob)),
                self.gmem.waddr.eq(w2_gaddr),
                self.gmem.wdata.eq(sword),
                self.gmem.we.eq(w2valid),
                self.word_out.eq(w2valid),
                self.spad.en.eq(present),
                self.spad.we.eq(0),
            ]
            m.d.sync += [
                wvalid.eq(present & ~self.spad.stall),
                again.eq(self.spad.stall),
                w_gaddr.eq(Mux(again, prev_gaddr, gaddr)),
                w2valid.eq(wvalid),
                w2_gaddr.eq(w_gaddr),
            ]
            with m.If(again):
                # A replay: the issue stage waits. Once it is read, the port moves on
                # to the issue stage's word.
                m.d.comb += next_offset.eq(saddr)
            with m.Elif(issuing):
                with m.If(gmem_oob | spad_oob):
                    m.d.sync += [
                        issuing.eq(0),
                        pend.eq(1),
                        pend_cause.eq(Mux(gmem_oob, FaultCause.GMEM_RANGE,
                                          FaultCause.PARTITION)),
                        pend_addr.eq(Mux(gmem_oob, gaddr, saddr)),
                    ]
                with m.Else():
                    advance()
            with m.Elif(~wvalid):
                # The last word is written this cycle (or there was none to write).
                with m.If(pend):
                    stop(pend_cause, pend_addr)
                with m.Else():
                    m.d.sync += running.eq(0)

        # The store's write, before `abort` cancels it: from registers only.
        m.d.comb += self.gmem.wclaim.eq(running & store & w2valid)
        with m.If(self.abort):
            m.d.comb += [self.gmem.we.eq(0), self.word_in.eq(0), self.word_out.eq(0)]
            m.d.sync += [
                running.eq(0),
                issuing.eq(0),
                wvalid.eq(0),
                w2valid.eq(0),
                again.eq(0),
                reread.eq(0),
                pend.eq(0),
                self.fault.eq(0),
                self.fault_cause.eq(FaultCause.NONE),
            ]

        return m
