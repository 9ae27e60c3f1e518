"""Instruction stores: the two plan banks and the kernel slots.

Both are memories with a 32-bit host window (for loading programs) and a read port
for the control unit. The host writes whole 32-bit words only; a write the running
program could observe half-done (the active plan bank, the executing kernel slot) is
refused with ERR and reported on ``refused``.

The host reads through a read port of its own, or (``shared_read``) through the
control unit's, in the cycles the control unit does not read (``rd_en`` low): a block
RAM with one read port then holds the store, half the iCE40 block RAMs of two.

No read the control unit uses meets a host write of its word: the writes refused by
policy cover everything it reads, when it reads it and in the cycle before, in which
a write that lands with the read would have been decided (host writes are posted; the
build for area's land in the cycle that decides them). Refused are the writes to the
active plan bank, or both while ``lock_all``; to the kernel slot ``locked_slot`` while
``lock``, which the control unit registers for the slot it executes and, from its
execution cycle, for the slot a CALL fetches from, the kernel store's writes waiting
out the CALL's decode cycle, ``hold``. And the host's own read
never shares a cycle with its write. The bitstream builds rely
on it: they tell Yosys that such a collision may read anything
(``fusetile.host.fpga.UNDEFINED_COLLISIONS``), which spares the logic that would make
it read the old word, on the path out of the block RAM. (A port that reads every
cycle, ``shared_read`` off, may read a word being written in a cycle whose word the
control unit does not use.)
"""

from amaranth.hdl import C, Module, Signal, Cat, Mux
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..kernels.config import TileConfig
from ..kernels.isa import (PLAN_INSTR_BITS, MICRO_INSTR_BITS, COMPUTE_OPS, MicroOp,
                           MicroInstr, GmemBase)
from . import wishbone


__all__ = ["PlanStore", "KernelStore", "MicroClass", "micro_class"]


class MicroClass(data.Struct):
    """What a micro-instruction is, one bit each (exactly one is set): the kernel
    store works it out when the host writes the instruction's first word and keeps
    it beside the instruction, so the control unit's decisions start at a flip-flop
    per class rather than at a decode of the opcode (docs/fpga-timing.md, step 39)."""
    nop:     1
    ret:     1
    dma:     1      #: DMA_LOAD or DMA_STORE with a defined GMEM base
    wait:    1
    compute: 1      #: MATMUL, ACC_BIAS, REQUANT and the vector ops
    illegal: 1      #: a reserved opcode, or a DMA with the reserved GMEM base


def micro_class(word):
    """The :class:`MicroClass` of a micro-instruction, from its first 32-bit word
    (the opcode and a DMA's GMEM base)."""
    instr = MicroInstr(Cat(word[:32], C(0, MICRO_INSTR_BITS - 32)))
    op = instr.op.as_value()
    dma = op.matches(MicroOp.DMA_LOAD, MicroOp.DMA_STORE)
    base_ok = instr.args.dma.gmem_base.as_value().matches(GmemBase.ABS, GmemBase.ARG0,
                                                          GmemBase.ARG1)
    compute = op.matches(*COMPUTE_OPS)
    known = op.matches(MicroOp.NOP, MicroOp.RET, MicroOp.WAIT) | dma | compute
    return MicroClass(Cat(op == MicroOp.NOP, op == MicroOp.RET, dma & base_ok,
                          op == MicroOp.WAIT, compute, ~known | dma & ~base_ok))


def _check_config(config):
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig, not {config!r}")


def _log2_ceil(n):
    return (n - 1).bit_length()


class _InstructionWindow:
    """Decoding shared by both stores: a host window of ``units`` regions (banks,
    slots), each ``span_words`` 32-bit words long (a power of two) and holding
    ``depth`` instructions of ``instr_words`` 32-bit words each."""

    def __init__(self, *, units, depth, instr_words):
        self.units = units
        self.depth = depth
        self.instr_words = instr_words
        self.word_bits = _log2_ceil(instr_words)        # 32-bit word within an instruction
        self.index_bits = _log2_ceil(depth)             # instruction within a region
        self.span_words = 1 << (self.word_bits + self.index_bits)
        self.unit_bits = _log2_ceil(units)
        self.addr_width = self.word_bits + self.index_bits + self.unit_bits

    def split(self, adr):
        """(32-bit word within the instruction, instruction index, region) of ``adr``."""
        w, i = self.word_bits, self.index_bits
        return adr[:w], adr[w:w + i], adr[w + i:]


class _StoreBase(wiring.Component):
    """Host window + control-unit read port over one memory; subclasses say which
    writes are refused."""

    def _elaborate_store(self, m, window, instr_bits, refuse, rd_addr, rd_en, rd_data,
                         hold=0):
        bus = self.bus
        m.submodules.mem = mem = Memory(shape=instr_bits, depth=window.units * window.depth,
                                        init=[])
        host_w = mem.write_port(granularity=32)
        ctrl_r = mem.read_port()
        host_r = ctrl_r if self.shared_read else mem.read_port()

        word, index, unit = window.split(bus.adr)
        answered = bus.ack | bus.err
        # A host read's word is registered before it is answered, as GMEM's is: from
        # the block RAM through the bus's read multiplexers into the bridge was the
        # worst path of a ULX3S build (step 32).
        reading = Signal()      # the read's word comes out of the memory this cycle
        addressing = Signal()   # (own read port) the read's address is presented
        held = Signal()         # the read's word is registered (`held_data`, `held_word`)
        # A write waits while `hold` is high: the refusals do not cover that cycle.
        access = (bus.cyc & bus.stb & ~answered & ~addressing & ~reading & ~held &
                  ~(bus.we & hold))
        # Regions are powers of two long, so the instruction index never exceeds the
        # depth; only the region number can be out of range (kernel_slots not a
        # power of two).
        in_range = unit < window.units
        mem_addr = Cat(index, unit)
        write = access & bus.we
        write_ok = write & in_range & (bus.sel == 0xF) & ~refuse(unit)

        # The host's write is posted: the cycle that decides it registers it, and it
        # reaches the memory in the next, from registers (the bus's decode and the
        # refusal in front of every block RAM's write enable were 30 of step 34's late
        # endpoints, 14.3 ns). The refusals hold for that cycle too: the control unit
        # locks what it reads a cycle before it reads it (the called slot from the
        # CALL's decode; the banks while it runs) and the host cannot swap the banks
        # or start a run before its write has landed.
        # Built for area (`compact`), the write is not posted: it reaches the memory in
        # the cycle that decides it. Its registers took 32 logic cells of the UP5K
        # and more, loaded from the bus with no LUT between; the refusals cover that
        # cycle as they do the next (the control unit's lock is up in the cycle
        # before it reads), and the word is there a cycle sooner.
        host_addr = Signal.like(mem_addr, name="host_addr", reset_less=True)
        host_data = Signal(instr_bits, name="host_data", reset_less=True)
        host_we = Signal(window.instr_words, name="host_we")
        m.d["comb" if self.config.compact else "sync"] += [
            host_addr.eq(mem_addr),
            host_data.eq(Cat(bus.dat_w for _ in range(window.instr_words))),
            host_we.eq(Mux(write_ok, 1 << word, 0)),
        ]
        m.d.comb += [
            host_w.addr.eq(host_addr),
            host_w.data.eq(host_data),
            host_w.en.eq(host_we),
            rd_data.eq(ctrl_r.data),
        ]

        host_read = access & ~bus.we & in_range
        if self.shared_read:
            # The control unit's port, in the cycles it does not read: a host read
            # waits (is not answered) while `rd_en` is high.
            access = access & ~(host_read & rd_en)
            host_read = host_read & ~rd_en
            m.d.comb += [
                ctrl_r.addr.eq(Mux(rd_en, rd_addr, mem_addr)),
                ctrl_r.en.eq(rd_en | host_read),
            ]
        else:
            # Both read ports read in every cycle (their `en` is left at 1): the control
            # unit uses a word only the cycle after `rd_en`, and `reading` takes the
            # host's two cycles after the access, which the host's port reads at the
            # posted write's address register (one read-write port: the memory keeps
            # two ports). Enables from the bus and from the control unit's decisions
            # drove every block RAM of the stores (7 ns of wire on the ULX3S build;
            # step 33).
            m.d.comb += [
                host_r.addr.eq(host_addr),
                ctrl_r.addr.eq(rd_addr),
            ]

        ok = Mux(bus.we, write_ok, in_range)
        read = access & ~bus.we & ok
        if self.shared_read:
            m.d.sync += reading.eq(read)
        else:
            m.d.sync += [addressing.eq(read), reading.eq(addressing)]
        # The read's instruction is registered whole before its word is selected: the
        # wire from the block RAMs (a kernel store's 32 on the ULX3S) to the selection
        # in front of `dat_r` was 5.9 ns of d3bfcf1's routed paths (12.3 ns in all).
        # Built for area (`compact`), the word is selected first and registered alone,
        # in the same cycle, and answered from there (below): a fourth of the
        # flip-flops for a kernel store.
        if self.config.compact:
            m.d.sync += held.eq(reading)
        else:
            held_data = Signal(instr_bits, name="held_data", reset_less=True)
            m.d.sync += [held.eq(reading), held_data.eq(host_r.data)]
        m.d.sync += [
            bus.ack.eq(access & bus.we & ok | held),
            bus.err.eq(access & ~ok),
            # Only writes that are in range, whole-word, and refused by policy count:
            # malformed accesses are plain bus errors.
            self.refused.eq(write & in_range & (bus.sel == 0xF) & refuse(unit)),
        ]
        read_word = Signal(max(window.word_bits, 1))
        with m.If(access):
            m.d.sync += read_word.eq(word)
        if self.config.compact:
            # ... and answered from that register, which holds it until the next read.
            held_word = Signal(32, name="held_word", reset_less=True)
            with m.If(reading):
                m.d.sync += held_word.eq(host_r.data.word_select(read_word, 32))
            m.d.comb += bus.dat_r.eq(held_word)
        else:
            with m.If(held):
                m.d.sync += bus.dat_r.eq(held_data.word_select(read_word, 32))
        return host_addr, host_data, host_we


class PlanStore(_StoreBase):
    """The two plan banks: one memory of ``2 * plan_depth`` 64-bit plan instructions,
    the bank being the top address bit.

    Host window (mapped at PLAN_BASE, ``2 * span`` bytes, ``span =
    pow2ceil(plan_depth * 8)``): word ``2*i`` of a bank is bits [31:0] of its
    instruction ``i``, word ``2*i + 1`` bits [63:32]. Reads are allowed at any time.
    Writes with ``sel != 0xF``, and writes to the active bank, are answered with ERR
    and leave the memory unchanged; the latter also pulse ``refused`` (in the cycle
    of the ERR). Every write and every ERR is answered one cycle after ``stb`` is
    seen (a write reaches the memory in the cycle of its answer), a read four (its
    instruction registered, then its word), a read with ``shared_read`` three after
    the cycle it gets the port (it waits while ``rd_en`` is high).

    Parameters
    ----------
    config : TileConfig
    shared_read : bool
        The host reads through the control unit's read port (module docstring).

    Attributes
    ----------
    bus : In(wishbone.Signature(addr_width=log2(plan_depth) + 2))
        Host window, word address relative to PLAN_BASE.
    active_bank : In(1)
        Bank the control unit runs: host writes to it are refused.
    lock_all : In(1)
        Refuse writes to both banks (a speculative plan runs: a miss continues in the
        other bank, so that one must stay as it is too).
    refused : Out(1)
        One-cycle pulse per refused write, aligned with its ERR.
    rd_bank : In(1)
    rd_pc : In(range(plan_depth))
    rd_en : In(1)
        Read instruction ``rd_pc`` of bank ``rd_bank``.
    rd_data : Out(64)
        The instruction read, valid the cycle after ``rd_en`` (not held otherwise).

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig`.
    """

    def __init__(self, config, *, shared_read=False):
        _check_config(config)
        self._config = config
        self.shared_read = bool(shared_read)
        self._window = _InstructionWindow(units=2, depth=config.plan_depth,
                                          instr_words=PLAN_INSTR_BITS // 32)
        super().__init__({
            "bus":         In(wishbone.Signature(addr_width=self._window.addr_width)),
            "active_bank": In(1),
            "lock_all":    In(1),
            "refused":     Out(1),
            "rd_bank":     In(1),
            "rd_pc":       In(range(config.plan_depth)),
            "rd_en":       In(1),
            "rd_data":     Out(PLAN_INSTR_BITS),
        })

    @property
    def config(self):
        return self._config

    @property
    def span(self):
        """Bytes of one bank's window."""
        return self._window.span_words * 4

    def elaborate(self, platform):
        m = Module()
        pc = Signal(self._window.index_bits)
        m.d.comb += pc.eq(self.rd_pc)
        self._elaborate_store(m, self._window, PLAN_INSTR_BITS,
                              refuse=lambda bank: (bank == self.active_bank) | self.lock_all,
                              rd_addr=Cat(pc, self.rd_bank), rd_en=self.rd_en,
                              rd_data=self.rd_data)
        return m


class KernelStore(_StoreBase):
    """The kernel slots: one memory of ``kernel_slots * slot_depth`` 128-bit
    micro-instructions, the slot index being the top address bits.

    Host window (mapped at SLOT_BASE; slot ``k`` at ``k * span``, ``span =
    pow2ceil(slot_depth * 16)`` bytes): words ``4*i .. 4*i + 3`` of a slot are
    micro-instruction ``i``, least significant word first. Reads are allowed at any
    time. Accesses to slots ``>= kernel_slots`` and writes with ``sel != 0xF`` are
    answered with ERR; while ``lock`` is high, writes to slot ``locked_slot`` are
    answered with ERR, leave the memory unchanged and pulse ``refused``. A write waits
    while ``hold`` is high. Every write and every ERR is answered one cycle after
    ``stb`` is seen (a write reaches the memory in the cycle of its answer), a read
    four (its instruction registered, then its word), a read with ``shared_read``
    three after the cycle it gets the port (it waits while ``rd_en`` is high).

    Parameters
    ----------
    config : TileConfig
    shared_read : bool
        The host reads through the control unit's read port (module docstring).

    Attributes
    ----------
    bus : In(wishbone.Signature(addr_width=log2(slot_depth) + 2 + ceil_log2(kernel_slots)))
        Host window, word address relative to SLOT_BASE.
    lock : In(1)
    locked_slot : In(4)
        While ``lock``, host writes to ``locked_slot`` are refused (the executing slot,
        or the slot a CALL fetches from: ``ControlUnit.slot_lock``).
    hold : In(1)
        While high, host writes wait (are not answered): the cycles the lock does not
        cover yet (``ControlUnit.slot_hold``).
    refused : Out(1)
        One-cycle pulse per refused write, aligned with its ERR.
    rd_slot : In(4)
    rd_upc : In(range(slot_depth))
    rd_en : In(1)
        Read micro-instruction ``rd_upc`` of slot ``rd_slot`` (which must be
        ``< kernel_slots``; other slots read undefined data).
    rd_data : Out(128)
        The micro-instruction read, valid the cycle after ``rd_en`` (not held otherwise).
    rd_class : Out(MicroClass)
        Its class (:func:`micro_class`), with it. A memory of its own beside the
        instructions keeps it: written with the instruction's first word, read with
        the same address, as the host's policy protects both alike.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig`.
    """

    def __init__(self, config, *, shared_read=False):
        _check_config(config)
        self._config = config
        self.shared_read = bool(shared_read)
        self._window = _InstructionWindow(units=config.kernel_slots, depth=config.slot_depth,
                                          instr_words=MICRO_INSTR_BITS // 32)
        super().__init__({
            "bus":         In(wishbone.Signature(addr_width=self._window.addr_width)),
            "lock":        In(1),
            "locked_slot": In(4),
            "hold":        In(1),
            "refused":     Out(1),
            "rd_slot":     In(4),
            "rd_upc":      In(range(config.slot_depth)),
            "rd_en":       In(1),
            "rd_data":     Out(MICRO_INSTR_BITS),
            "rd_class":    Out(MicroClass),
        })

    @property
    def config(self):
        return self._config

    @property
    def span(self):
        """Bytes of one slot's window."""
        return self._window.span_words * 4

    def elaborate(self, platform):
        m = Module()
        upc = Signal(self._window.index_bits)
        m.d.comb += upc.eq(self.rd_upc)
        slot_bits = self._window.unit_bits
        rd_addr = Cat(upc, self.rd_slot[:slot_bits])
        host_addr, host_data, host_we = self._elaborate_store(
            m, self._window, MICRO_INSTR_BITS,
            refuse=lambda slot: self.lock & (slot == self.locked_slot),
            rd_addr=rd_addr, rd_en=self.rd_en, rd_data=self.rd_data, hold=self.hold)
        # The classes: an unwritten instruction is 0, a NOP.
        depth = self._window.units * self._window.depth
        m.submodules.classes = classes = Memory(shape=MicroClass, depth=depth,
                                                init=[{"nop": 1}] * depth)
        class_w = classes.write_port()
        class_r = classes.read_port()
        m.d.comb += [
            class_w.addr.eq(host_addr),
            class_w.data.eq(micro_class(host_data)),
            class_w.en.eq(host_we[0]),
            class_r.addr.eq(rd_addr),
            self.rd_class.eq(class_r.data),
        ]
        return m
