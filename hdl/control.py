"""The control unit: runs a plan from the active plan bank and, for each CALL, the
kernel in a slot, micro-instruction by micro-instruction."""

import operator
from functools import reduce

from amaranth.hdl import Array, Module, Signal, Mux, Value
from amaranth.lib import wiring, data, enum, stream
from amaranth.lib.wiring import In, Out

from ..kernels.config import TileConfig
from ..kernels.isa import PlanOp, PlanInstr, MicroOp, MicroInstr, GmemBase, FaultCause, \
    TraceRecord, FLAGS, INDEX_REGS
from .dma_queue import QueuedDmaCommand
from .compare import at_least
from .compute import ComputeCommand, port_starts, vector_steps
from .copies import copy
from .operands import OperandCheck
from .stores import MicroClass


__all__ = ["ControlUnit", "ControlEvents"]


def _one_of(choices):
    """The value of the one ``(select, value)`` of ``choices`` whose select is high, 0
    if none: an AND-OR, for selects that exclude one another, where a priority
    selection (``m.If`` after ``m.If``) puts each select in front of the later ones."""
    return reduce(operator.or_, (Mux(select, Value.cast(value), 0)
                                 for select, value in choices))


class _State(enum.Enum):
    """The sequencers' states; the state register is one-hot, bit ``value`` is the
    state (see ``at``)."""
    IDLE        = 0
    PLAN_FETCH  = 1   # the store's word out: the instruction register takes it
    PLAN_EXEC   = 2
    MICRO_FETCH = 3
    MICRO_EXEC  = 4
    FAULT       = 5
    PUBLISH     = 6   # COMMIT hit: staged stores drain into GMEM
    PLAN_DECODE = 7   # from the instruction register: where it goes, whether legal
    ROLLBACK    = 8   # a miss: the fallback's instruction is read (the other bank)

    @property
    def code(self):
        """The state register's value in this state (one-hot)."""
        return 1 << self.value


class ControlEvents(data.Struct):
    """What the control unit did this cycle, for the performance counters.

    ``void`` cancels the retirements of its cycle (``plan_retired``, ``micro_retired``,
    ``call_done``, ``inference``, ``branch``, ``spec_hit``) and its ``swap``: a fault
    or a miss abandons it. The counters apply it after registering the events
    (``PerfCounters.void``), so that the fault decision is not in front of every
    counter's increment.
    """
    active:        1   #: a plan is running
    plan_retired:  1
    micro_retired: 1
    stall_dma:     1   #: the kernel sequencer waits for the DMA engine
    stall_compute: 1   #: the kernel sequencer waits for the compute unit
    call_done:     1   #: a kernel call returned
    inference:     1   #: a plan reached DONE
    swap:          1   #: the active plan bank changes (unless ``void``)
    fault:         1   #: the tile stopped on a fault
    branch:        1   #: a BRANCH retired (on flag ``flag``)
    taken:         1   #: ... and was taken
    flag:          3
    spec_hit:      1   #: a COMMIT found its guard true
    spec_miss:     1   #: a guard failed: rolled back to the other bank
    spec_fault:    1   #: ... because of a fault inside the speculative region
    rollback:      1   #: a cycle between a failed guard and the fallback's first instruction
    void:          1   #: a fault or a miss abandons this cycle: its retirements do not count


class ControlUnit(wiring.Component):
    """Plan sequencer and kernel sequencer.

    The plan sequencer fetches plan instructions from the active bank. CALL checks the
    slot table, latches the call's arguments and hands over to the kernel sequencer,
    which runs the slot's micro-instructions until RET; DMA micro-instructions are
    relocated (GMEM base from the CALL arguments, scratchpad partition from the slot
    table) and queued to the DMA engine. DONE ends the plan and is the safe point where
    a requested bank swap is taken; an idle tile takes a swap at once.

    Plan control flow: JUMP, BRANCH on a flag, SWITCH on an index register. ASSUME
    opens a speculative region: the staging buffer holds the region's GMEM stores and
    both plan banks are locked. A miss (the guarded flag written with the other value,
    the guard false at COMMIT, staging overflow, or a fault inside the region) discards
    the staged stores and the running kernel and continues *in the other bank* at the
    ASSUME's resume PC, with no host involvement; a hit (guard true at COMMIT)
    publishes the staged stores. After DONE the tile returns to the bank it started
    in (``active_bank``), so a speculative plan stays installed across inferences.

    Every other error stops the tile in the fault state with cause, bank, slot, PCs and
    an address recorded, and the DMA engine aborted. The tile leaves the fault state
    only on ``clear_fault``.

    Parameters
    ----------
    config : TileConfig

    Attributes
    ----------
    start, swap, clear_fault, abort : In(1)
        Host commands (one-cycle pulses from CTRL). ``abort`` is taken the cycle after
        its pulse.
    watchdog_limit : In(32)
        Cycle limit for one plan run; 0 disables the watchdog (unused on a tile
        without one: ``TileConfig.watchdog``).
    slot_valid : In(kernel_slots)
        Slot table: which slots may be called.
    slot_part : In(ArrayLayout(4, kernel_slots))
        Slot table: the partition each slot's scratchpad accesses use.
    plan_rd_bank, plan_rd_pc : Out
        Plan store read address (data one cycle later on ``plan_rd_data``).
    plan_rd_en : Out(1)
        The next cycle fetches a plan instruction: the plan store must read
        ``plan_rd_bank``, ``plan_rd_pc`` in this one. The control unit uses
        ``plan_rd_data`` only then, so a store may serve the host in other cycles.
    plan_rd_data : In(64)
    kern_rd_slot, kern_rd_upc : Out
        Kernel store read address (data one cycle later on ``kern_rd_data``).
    kern_rd_en : Out(1)
        As ``plan_rd_en``, for the kernel store and a micro-instruction fetch.
    kern_rd_data : In(128)
    kern_rd_class : In(MicroClass)
        The class of the micro-instruction on ``kern_rd_data`` (the kernel store's
        ``rd_class``).
    slot_lock : Out(1)
    locked_slot : Out(4)
        Host writes to slot ``locked_slot`` (its instructions and its SLOT entry) must
        be refused while ``slot_lock`` is high: the executing slot, and from a CALL's
        execution cycle the slot it calls (the decode tests the slot's entry, the
        execution reads it). Every kernel store read the control unit uses is of that
        slot. Both are registers, a cycle behind the state they lock for (no fetch or
        fault decision, nor the state's decode, in front of the host's answers).
    slot_hold : Out(1)
        Host writes to the kernel slots and their SLOT entries must wait while it is
        high (a register): a plan instruction's decode cycle, which the locks, a
        cycle behind, do not yet cover for a CALL.
    dma_push : Out(stream.Signature(QueuedDmaCommand))
        To the DMA queue.
    dma_outstanding : In(DMA_TOKENS)
        Tokens with a queued or running DMA.
    compute_cmd : Out(stream.Signature(ComputeCommand))
        Compute micro-instructions (MATMUL, vector ops), to the compute unit, from a
        register: ``valid`` and ``payload`` are flip-flops, set the cycle after the
        instruction issues and kept until ``ready``.
    compute_busy : In(1)
        The compute unit is executing. Registered here: a compute instruction issues,
        and WAIT with ``compute`` and RET go on, only when the command register is
        empty and ``compute_busy`` was low in the cycle before.
    part_limit : In(17)
        The number of offsets inside the executing slot's partition (the scratchpad's
        ``limit``, registered there), for the operand check of compute
        micro-instructions. It follows ``slot`` a cycle later; the tile refuses writes
        to a running kernel's partition, so it does not change under a call.
    compute_fault : In(1)
    compute_fault_cause : In(FaultCause)
    compute_fault_addr : In(32)
    compute_fault_part : In(4)
        A fault the compute unit raised. The operand check makes every compute fault
        the control unit's own, raised before the instruction issues; the compute
        unit's checks stay as a second line (a fault from it would be imprecise).
    mac_busy, vec_busy, dma_busy : In(1)
        Whether the compute unit's MAC array, its vector unit and the DMA engine are
        busy (for trace records; these, ``dma_word_in``, ``dma_word_out``, ``cycles``,
        ``trace_push`` and ``trace_record`` are only there with a trace FIFO,
        ``config.traced``).
    dma_fault : In(1)
    dma_fault_cause : In(FaultCause)
    dma_fault_addr : In(32)
    dma_fault_part : In(4)
    dma_abort : Out(1)
        Stop the DMA engine and flush its queue (fault, rollback); the tile aborts the
        compute unit and the scratchpad's accesses with it. A register: it comes the
        cycle after the fault or miss, so the units finish that cycle's work (the
        sequencer issues nothing in it) and the decision does not fan out to them.
    dma_word_in, dma_word_out : In(1)
        One pulse per word the DMA moved (for the call's trace record).
    cycles : In(32)
        The CYCLES counter, stamped into trace records.
    flag_we, flag_value : In(1)
    flag_sel : In(3)
        A vector instruction (VCMP, or VARGMAX with ``test``) writes flag ``flag_sel``.
    index_we : In(1)
    index_sel : In(2)
    index_value : In(16)
        A vector instruction (VARGMAX) writes index register ``index_sel``. These six
        ports exist only on a tile with ``config.decisions``.
    flags : Out(FLAGS)
    index : Out(ArrayLayout(16, INDEX_REGS))
        The flag and index registers (0 after reset; without ``config.decisions``
        nothing writes them).
    speculating : Out(1)
        A speculative region is open (stores go to the staging buffer).
    plan_lock_all : Out(1)
        Both plan banks must refuse host writes.
    staging_publish, staging_discard : Out(1)
    staging_draining, staging_overflow : In(1)
        The staging buffer's commands and state; only on a tile with speculation
        (``config.speculates``: without it ASSUME and COMMIT are illegal, and
        ``speculating`` stays 0).
    miss_pc : Out(16)
        PC of the ASSUME whose guard failed last.
    running, done, faulted, active_bank, swap_pending, in_kernel : Out(1)
    exec_bank : Out(1)
        The bank being executed (differs from ``active_bank`` after a miss).
    slot : Out(4)
        The executing slot (valid while ``in_kernel``).
    kernel_part : Out(4)
        The executing slot's partition, registered at CALL (valid while ``in_kernel``;
        the host cannot rewrite the slot's entry under it: ``slot_lock``).
    plan_pc, micro_pc : Out(16)
    mark : Out(24)
        The operand of the last MARK; 0 on a tile without the MARK register
        (``TileConfig.debug_regs``), where nothing drives it.
    fault_cause : Out(FaultCause)
    fault_bank, fault_in_kernel : Out(1)
    fault_slot, fault_part : Out(4)
    fault_pc, fault_upc : Out(16)
    fault_addr : Out(32)
    events : Out(ControlEvents)
    trace_push : Out(1)
    trace_record : Out(TraceRecord)
    """

    def __init__(self, config):
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        self.config = config
        k = config.kernel_slots
        traced, speculates = config.traced, config.speculates
        super().__init__({
            "start": In(1), "swap": In(1), "clear_fault": In(1), "abort": In(1),
            "watchdog_limit": In(32),
            "slot_valid": In(k),
            "slot_part": In(data.ArrayLayout(4, k)),
            "plan_rd_bank": Out(1), "plan_rd_pc": Out(16), "plan_rd_en": Out(1),
            "plan_rd_data": In(64),
            "kern_rd_slot": Out(4), "kern_rd_upc": Out(16), "kern_rd_en": Out(1),
            "kern_rd_data": In(128), "kern_rd_class": In(MicroClass),
            "slot_lock": Out(1), "locked_slot": Out(4), "slot_hold": Out(1),
            "dma_push": Out(stream.Signature(QueuedDmaCommand)),
            "dma_outstanding": In(4),
            "compute_cmd": Out(stream.Signature(ComputeCommand)),
            "compute_busy": In(1), "part_limit": In(17),
            "compute_fault": In(1), "compute_fault_cause": In(FaultCause),
            "compute_fault_addr": In(32), "compute_fault_part": In(4),
            **({"mac_busy": In(1), "vec_busy": In(1), "dma_busy": In(1)} if traced else {}),
            "dma_fault": In(1), "dma_fault_cause": In(FaultCause),
            "dma_fault_addr": In(32), "dma_fault_part": In(4), "dma_abort": Out(1),
            **({"dma_word_in": In(1), "dma_word_out": In(1), "cycles": In(32)}
               if traced else {}),
            **({"flag_we": In(1), "flag_sel": In(3), "flag_value": In(1),
                "index_we": In(1), "index_sel": In(2), "index_value": In(16)}
               if config.decisions else {}),
            "flags": Out(FLAGS), "index": Out(data.ArrayLayout(16, INDEX_REGS)),
            "speculating": Out(1), "plan_lock_all": Out(1),
            **({"staging_publish": Out(1), "staging_discard": Out(1),
                "staging_draining": In(1), "staging_overflow": In(1)} if speculates else {}),
            "miss_pc": Out(16), "exec_bank": Out(1),
            "running": Out(1), "done": Out(1), "faulted": Out(1), "active_bank": Out(1),
            "swap_pending": Out(1), "in_kernel": Out(1), "slot": Out(4),
            "kernel_part": Out(4),
            "plan_pc": Out(16), "micro_pc": Out(16), "mark": Out(24),
            "fault_cause": Out(FaultCause), "fault_bank": Out(1), "fault_in_kernel": Out(1),
            "fault_slot": Out(4), "fault_part": Out(4), "fault_pc": Out(16),
            "fault_upc": Out(16), "fault_addr": Out(32),
            "events": Out(ControlEvents),
            **({"trace_push": Out(1), "trace_record": Out(TraceRecord)} if traced else {}),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config

        # The instruction registers: a fetch cycle registers the word the stores read
        # for it in the cycle before, so decoding starts from a flip-flop rather than
        # from a block RAM's output (see "the store read ports" below).
        plan_ir = Signal(64)
        micro_ir = copy(Signal(128, name="micro_ir"))     # a twin of `check_ir`, below
        plan = PlanInstr(plan_ir)
        micro = MicroInstr(micro_ir)
        dma_args = micro.args.dma
        # The operand check's own copy of the micro-instruction (`hdl/copies.py`; both
        # twins are marked, or Yosys merges the unmarked one into the other). From
        # `micro_ir`, which the issue and the DMA push decode too, synthesis merged
        # the check's opcode decode with theirs: six LUTs into the check's first
        # stage, 11.16 ns of 36f2362's routed ULX3S build (step 51).
        check_ir = copy(Signal(128, name="check_ir"))
        checked_micro = MicroInstr(check_ir)
        # The instruction's class, registered with it: MICRO_EXEC's decisions test a
        # flip-flop per class. Decoded from the opcode there, the decode came first on
        # the fault decision's worst paths (three LUTs of b3f276a's 11.71 ns;
        # docs/fpga-timing.md, step 39).
        exec_class = Signal(MicroClass)

        # The CALL's DMA bases and plan PC, and a SWITCH's index, are copied where the
        # deep build reads them; built for area the control unit reads them where they
        # hold still (the plan's instruction register and plan_pc, the index register
        # the fetch chose), and has no copies.
        copied = not cfg.compact
        arg_a = Signal(24, name="arg_a") if copied else None
        arg_b = Signal(24, name="arg_b") if copied else None
        part = self.kernel_part
        # A plan run's cycles, for the watchdog (a tile may have none: `watchdog`).
        watchdog = Signal(32, name="watchdog") if cfg.watchdog else None

        # Statistics of the current kernel call, for its trace record (none without a
        # trace FIFO).
        traced = cfg.traced
        speculates = cfg.speculates
        call_pc = Signal(16, name="call_pc") if copied and traced else None
        if traced:
            call_start = Signal(32)
            call_cycles = Signal(32)
            call_dma_busy = Signal(32)
            call_words_in = Signal(32)
            call_words_out = Signal(32)
            call_mac_busy = Signal(32)
            call_vec_busy = Signal(32)

        # The speculative region: its guard and where a miss continues.
        guard_flag = Signal(3)
        guard_value = Signal()
        resume_pc = Signal(24)
        resume_outside = Signal()   # ... and whether it is past the bank

        # Whether micro_pc is past the slot and plan_pc past the bank, registered with
        # them: MICRO_FETCH and PLAN_FETCH fault on them. Compared there, the test came
        # first on the path that decides a fault and everything a fault abandons.
        # plan_pc gets past the bank only by a rollback, a RET or a publish: the plan
        # instructions that go elsewhere test their targets when they execute.
        micro_pc_outside = Signal()
        plan_pc_outside = Signal()

        # The store read ports are addressed one cycle ahead: the cycle that decides
        # the next plan (micro) PC presents it, so the word is out of the block RAM in
        # the fetch cycle, which registers it. Both addresses are from the state and
        # registers in every cycle (the plan store's below, with the plan predecode).
        # The kernel store is read by CALL (the first micro-instruction of the slot it
        # calls) and by MICRO_EXEC (the next one, micro_pc + 1): a cycle that stalls or
        # faults does not use the word, and no decision is on the address. Only the
        # cycles that go on need the read (`plan_rd_en`, `kern_rd_en`): they are every
        # way into PLAN_FETCH and MICRO_FETCH, the states that use the word.
        m.d.comb += [
            self.plan_rd_bank.eq(self.exec_bank),
            self.plan_lock_all.eq(self.running &
                                  (self.speculating | (self.exec_bank != self.active_bank))),
        ]

        # -- flags and index registers ----------------------------------------------------
        if cfg.decisions:
            with m.If(self.flag_we):
                m.d.sync += self.flags.bit_select(self.flag_sel, 1).eq(self.flag_value)
            with m.If(self.index_we):
                m.d.sync += self.index[self.index_sel].eq(self.index_value)

        # -- fault entry ------------------------------------------------------------
        # A fault is decided (`fault`) apart from what it records (its cause, an
        # address, a partition). Each sequencer fault is raised in a state of its own
        # (`where`, from registers), so its record is chosen by the state alone, in an
        # AND-OR (`recorded`, below), not by the decisions that raise the faults: when
        # each raise chose its own record, in a priority chain, those decisions were in
        # front of the fault address (10.27 ns of e0f2cb7's routed build; docs/fpga-timing.md,
        # step 43). The units' faults, the watchdog and the host's abort win over the
        # sequencers' (`raise_overriding_fault`).
        fault = Signal()
        sequencer_records = []
        overriding = Signal()
        overriding_cause = Signal(FaultCause)
        overriding_addr = Signal(32)
        overriding_part = Signal(4)

        def raise_fault(where, cause, addr=0, part_=0):
            """A sequencer's fault, raised in the cycles ``where`` is high (no two
            sequencer faults share one)."""
            m.d.comb += fault.eq(1)
            sequencer_records.append(dict(where=where, cause=cause, addr=addr, part=part_))

        def raise_overriding_fault(cause, addr=0, part_=0):
            """A fault that wins over the sequencers' and over those raised before it."""
            m.d.comb += [fault.eq(1), overriding.eq(1), overriding_cause.eq(cause),
                         overriding_addr.eq(addr), overriding_part.eq(part_)]

        # -- swap: an idle tile takes it at once, a running one at DONE ---------------
        # A swap is due at those points, and taken unless the cycle is abandoned (a
        # fault or a miss). The counter counts it as due and voids it with the cycle
        # (10.6 ns of 07016dc's ULX3S build with the decision in front of the counter,
        # docs/fpga-timing.md step 38). Of what abandons a cycle, only a unit's fault, the
        # watchdog and the host's abort can come at those points: an idle tile is not
        # running, and a DONE that executes is legal, so not speculative, and raises
        # nothing itself. The swap waits for those alone (the whole decision in front
        # of it, RET's return past the bank first, was 11.38 ns of 7a057ba's build,
        # docs/fpga-timing.md step 40).
        swap_due = Signal()
        unit_fault = Signal()       # a unit's fault, new this cycle, while running
        hard_fault = Signal()       # the watchdog or the host's abort, while running
        # Whether the tile runs, as the fault decision reads it: a copy of `running`
        # kept apart (`hdl/copies.py`; both twins are marked), set and cleared with
        # it at START, DONE and a stop. `running` is read across the tile (the status
        # register, the watchdog, the counters): its wire to the decision's first
        # LUT was 2.2 ns of 88176a6's routed worst path (10.07 ns, into the state's
        # reset through `hard_fault` and `void`; docs/fpga-timing.md, step 54).
        faults_running = copy(Signal(name="faults_running"))
        copy(self.running)
        take_swap = Signal()
        m.d.comb += take_swap.eq(swap_due & ~unit_fault & ~hard_fault)
        with m.If(take_swap):
            m.d.sync += [self.active_bank.eq(~self.active_bank), self.swap_pending.eq(0)]
        with m.Elif(self.swap):
            m.d.sync += self.swap_pending.eq(1)
        m.d.comb += self.events.swap.eq(swap_due)

        # -- trace record of the current call -----------------------------------------
        if traced:
            # The DMA's word pulses and the compute unit's busy bits are registered
            # before they are added: they come out of the scratchpad's arbitration and
            # the compute unit's completion late in the cycle, and a 32-bit adder after
            # them was the longest path of the ULX3S build (docs/fpga-timing.md, steps 18
            # and 31). The record adds the last cycle's pulse itself, so it still counts
            # every word moved and every busy cycle before the cycle it is pushed in.
            words_in = Signal()
            words_out = Signal()
            mac_busy = Signal()
            vec_busy = Signal()
            m.d.sync += [words_in.eq(self.in_kernel & self.dma_word_in),
                         words_out.eq(self.in_kernel & self.dma_word_out),
                         mac_busy.eq(self.in_kernel & self.mac_busy),
                         vec_busy.eq(self.in_kernel & self.vec_busy)]
            # Built for area, the record's statistics hold still for two cycles after
            # its push, so that the trace FIFO writes them from here rather than from a
            # copy (TraceFifo's `compact`): they stop with `in_kernel`, which falls after
            # the push, and the next CALL zeroes them two cycles later at the soonest (a
            # plan fetch, then the CALL). The last cycle's pulses are added to the sums
            # only while `in_kernel` is high, and the DMA's busy bit is not added in the
            # cycle of the push (the record does not count it), so that the sums that
            # went into the pushed record are the record after it.
            dma_busy = self.dma_busy
            if cfg.compact:
                dma_busy = self.dma_busy & ~self.trace_push
                last = self.in_kernel
                pulses = [pulse & last for pulse in (words_in, words_out, mac_busy, vec_busy)]
            else:
                last = 1
                pulses = [words_in, words_out, mac_busy, vec_busy]
            record = self.trace_record
            m.d.comb += [
                record.slot.eq(self.slot),
                record.bank.eq(self.exec_bank),
                # (Built for area, the CALL's plan PC is plan_pc itself: it holds still
                # from the CALL's fetch until the RET, or the fault or miss that cuts the
                # call short, the cycles a record is pushed in.)
                record.pc.eq(call_pc if copied else self.plan_pc),
                record.start.eq(call_start),
                # The cycle that returns (or faults) counts too, as in SLOT_CYCLES.
                record.cycles.eq(call_cycles + last),
                record.dma_busy.eq(call_dma_busy),
                record.bytes_in.eq((call_words_in + pulses[0]) * cfg.word_bytes),
                record.bytes_out.eq((call_words_out + pulses[1]) * cfg.word_bytes),
                record.mac_busy.eq(call_mac_busy + pulses[2]),
                record.vec_busy.eq(call_vec_busy + pulses[3]),
            ]
            # (The sums are the record's, so that each adder is one: `last` and the
            # pulses gated by `in_kernel` are the same here, where it is high.)
            with m.If(self.in_kernel):
                m.d.sync += [
                    call_cycles.eq(call_cycles + last),
                    call_dma_busy.eq(call_dma_busy + dma_busy),
                    call_words_in.eq(call_words_in + pulses[0]),
                    call_words_out.eq(call_words_out + pulses[1]),
                    call_mac_busy.eq(call_mac_busy + pulses[2]),
                    call_vec_busy.eq(call_vec_busy + pulses[3]),
                ]

        m.d.comb += self.events.active.eq(self.running)
        # Whether the watchdog is at its limit, worked out a cycle ahead from the
        # count's next value (START zeroes it) and registered: the 32-bit comparison in
        # front of the fault decision was the ULX3S build's routed worst path (ad84542).
        # A new limit counts from the cycle after the one the CSR takes it in. The
        # running bit is the adder's carry in and the comparison the sign of a
        # subtraction, two carry chains: ABC built the comparison as six LUTs after
        # the adder (10.29 ns of c475267's routed paths, docs/fpga-timing.md step 39).
        watchdog_hit = Signal()     # (not registered alone: `hard_hit`, below)
        if cfg.watchdog:
            with m.If(self.running):
                m.d.sync += watchdog.eq(watchdog + 1)
            watchdog_next = Signal(32)
            m.d.comb += [watchdog_next.eq(watchdog + self.running),
                         watchdog_hit.eq((self.watchdog_limit != 0) &
                                         at_least(watchdog_next, self.watchdog_limit))]
        # The watchdog at its limit or the host's abort, in one flip-flop: the fault
        # decision has one source for both (`hard_fault`, below), and `abort_taken`
        # chooses the cause (the host's over the watchdog's). The abort is taken
        # the cycle after its pulse, from a register of the control unit's own: from
        # the CSR's flip-flop, across the device, it was the first 1.5 ns of 0059dff's
        # routed worst path (10.55 ns, into the state's reset through the fault and
        # `void`; docs/fpga-timing.md, step 49). A bus write takes several cycles, so
        # the host sees no difference.
        abort_taken = Signal()
        hard_hit = Signal()
        m.d.sync += [abort_taken.eq(self.abort), hard_hit.eq(watchdog_hit | self.abort)]

        # -- the sequencers -----------------------------------------------------------
        next_pc = self.plan_pc + 1
        # An explicit state register rather than m.FSM: faults and misses from any
        # state are one override at the end instead of a check in every state. It is
        # one-hot, so that a decision tests one flip-flop for its state: the decode of
        # a binary state came in front of every term of the fault decision.
        state = Signal(len(_State), init=_State.IDLE.code)

        def at(s):
            return state[s.value]

        # micro_pc + 1, kept in a register beside it rather than added: it addresses
        # the kernel store in MICRO_EXEC, and the adder in front of the fan-out to the
        # store's block RAMs made that the ULX3S build's most common late endpoint
        # (278 of eba74bb's seed-2 build; the state's and the instruction's decode in
        # front of it were a8fc9f8's 295). Outside a kernel the only kernel read is a
        # CALL's, of its slot's first micro-instruction: the slot is the one locked
        # against host writes either way.
        # Built for area, micro_pc and next_upc are as wide as their values: micro_pc
        # gets past the slot's last instruction only to slot_depth, where its fetch
        # faults, so next_upc only to slot_depth + 1.
        if cfg.compact:
            micro_pc = Signal(range(cfg.slot_depth + 1), name="micro_pc")
            next_upc = Signal(range(cfg.slot_depth + 2), init=1)
            m.d.comb += self.micro_pc.eq(micro_pc)
        else:
            micro_pc = self.micro_pc
            next_upc = Signal(16, init=1)
        m.d.comb += [self.kern_rd_slot.eq(self.locked_slot),
                     self.kern_rd_upc.eq(Mux(self.in_kernel, next_upc, 0))]
        # next_pc and whether it is past the bank, registered: RET and PUBLISH go
        # there, and plan_pc has held still since the fetch of their CALL / COMMIT;
        # the plan predecode reads them too, plan_pc having held still since the
        # fetch.
        next_q = Signal(16)
        next_outside = Signal()
        m.d.sync += [next_q.eq(next_pc), next_outside.eq(next_pc >= cfg.plan_depth)]

        def plan_goto(pc, outside=0):
            # `outside`: pc is past the bank, and the fetch faults. PLAN_EXEC's decode
            # tests its own targets (`plan_bad`); RET and PUBLISH go to next_q whatever
            # it is: tested in their decision, RET's wait for the units came in front
            # of the fault (11.12 ns of e0f2cb7's routed paths, docs/fpga-timing.md step 41).
            m.d.sync += [self.plan_pc.eq(pc), plan_pc_outside.eq(outside),
                         state.eq(_State.PLAN_FETCH.code)]
            m.d.comb += [self.events.plan_retired.eq(1), self.plan_rd_en.eq(1)]

        def micro_next():
            m.d.sync += [micro_pc.eq(next_upc), next_upc.eq(next_upc + 1),
                         micro_pc_outside.eq(next_upc >= cfg.slot_depth),
                         state.eq(_State.MICRO_FETCH.code)]
            m.d.comb += [self.events.micro_retired.eq(1), self.kern_rd_en.eq(1)]

        # The stores refuse host writes into what the control unit reads, so that no
        # read meets a write of its word (`hdl/stores.py`). The plan fetches read the
        # active bank or, under `plan_lock_all`, either; the kernel fetches read the
        # executing slot, and a CALL's execution cycle the first micro-instruction of
        # the slot it calls, whatever it then decides (a fault, a miss). The slot's
        # entry must not change between the CALL's decode, which tests it, and its
        # execution. The slot's lock is registered from the cycle's state (the state's
        # decode and the wire to the host's answers were 12.3 ns of d3bfcf1's routed
        # paths, docs/fpga-timing.md step 36), so it covers a CALL from its execution cycle,
        # and host writes to the slots wait out every decode cycle (`slot_hold`): a
        # write decided there would land with the CALL's fetch, or between its test of
        # the entry and its use.
        calling = Signal()
        m.d.comb += calling.eq((at(_State.PLAN_DECODE) | at(_State.PLAN_EXEC)) &
                               (plan.op == PlanOp.CALL))
        m.d.sync += [
            self.slot_lock.eq(self.in_kernel | calling),
            self.locked_slot.eq(Mux(self.in_kernel, self.slot, plan.sel)),
            self.slot_hold.eq(at(_State.PLAN_FETCH)),
        ]

        # -- plan predecode: a cycle between fetch and execution works out where the ----
        # instruction goes, so that executing it starts from registers. It decodes the
        # instruction register, not the store's output: a block RAM's clock-to-output
        # leaves no room for logic after it (docs/fpga-timing.md, step 28). The flags and
        # index registers it reads do not change between decode and execution: only
        # the compute unit writes them, and it is idle between kernel calls.
        fetched = PlanInstr(plan_ir)
        fetched_where = Signal(16)
        fetched_taken = Signal()
        fetched_target = Signal(25)
        m.d.comb += [
            fetched_where.eq(self.index[fetched.sel[:2]]),
            fetched_taken.eq(self.flags.bit_select(fetched.sel[:3], 1) == fetched.cond[0]),
            fetched_target.eq(next_q),
        ]
        # Whether the target is past the bank, tested on each candidate beside the
        # selection (the instruction, through the flag test, chose a target and then
        # compared it: once the longest path into the control unit). plan_depth is a
        # power of two: a value is past the bank when a bit above its PC bits is set,
        # and a sum of two such values also when their PC bits carry.
        pc_bits = (cfg.plan_depth - 1).bit_length()
        fetched_outside = Signal()
        # (From next_q and next_outside, not from plan_pc's adder: with the adder,
        # the target's test was in front of plan_bad and commit_misses, 9.74 ns of
        # 88176a6's routed paths, docs/fpga-timing.md step 53.)
        next_past = next_outside
        a_past = fetched.a[pc_bits:].any()
        # SWITCH's tests are made against every index register at once and selected
        # by `sel` after: the selection of the index register, then the carry of its
        # sum with `a` (or its comparison with the length) from the store's word, was
        # the ULX3S build's worst path (e2bfed1, from the store's output then).
        # Built for area, the index register is selected first (`fetched_where`), and
        # one adder and one comparison follow.
        if cfg.compact:
            switched_past = (a_past | fetched_where[pc_bits:].any() |
                             (fetched.a[:pc_bits] + fetched_where[:pc_bits])[pc_bits])
            switched_target = fetched.a + fetched_where
            where_outside_value = fetched_where >= fetched.b
        else:
            index_past = [self.index[i][pc_bits:].any() |
                          (fetched.a[:pc_bits] + self.index[i][:pc_bits])[pc_bits]
                          for i in range(INDEX_REGS)]
            index_outside = [self.index[i] >= fetched.b for i in range(INDEX_REGS)]
            switched_past = a_past | Array(index_past)[fetched.sel[:2]]
            # ... and so is the target: `a` plus every index register, selected after
            # the adders (with the selection in front of the adder it was 14 of step
            # 33's late endpoints, 11.5 ns into `goto`).
            switched = Array(fetched.a + self.index[i] for i in range(INDEX_REGS))
        m.d.comb += fetched_outside.eq(next_past)
        with m.Switch(fetched.op):
            with m.Case(PlanOp.JUMP):
                m.d.comb += [fetched_target.eq(fetched.a), fetched_outside.eq(a_past)]
            with m.Case(PlanOp.BRANCH):
                m.d.comb += [fetched_target.eq(Mux(fetched_taken, fetched.a, next_q)),
                             fetched_outside.eq(Mux(fetched_taken, a_past, next_past))]
            with m.Case(PlanOp.SWITCH):
                m.d.comb += [fetched_target.eq(switched_target if cfg.compact
                                               else switched[fetched.sel[:2]]),
                             fetched_outside.eq(switched_past)]
        # Whether the instruction is illegal: an operand out of its range, or ASSUME,
        # COMMIT and DONE in or out of a speculative region. (`speculating` cannot
        # change between the decode and the execution either: only a miss changes it
        # outside PLAN_EXEC, and a miss fetches again.)
        fetched_illegal = Signal()
        with m.Switch(fetched.op):
            with m.Case(PlanOp.NOP, PlanOp.MARK, PlanOp.JUMP, PlanOp.CALL):
                m.d.comb += fetched_illegal.eq(0)
            with m.Case(PlanOp.BRANCH):
                m.d.comb += fetched_illegal.eq(fetched.sel >= FLAGS)
            with m.Case(PlanOp.SWITCH):
                m.d.comb += fetched_illegal.eq(fetched.sel >= INDEX_REGS)
            with m.Case(PlanOp.ASSUME):
                m.d.comb += fetched_illegal.eq((fetched.sel >= FLAGS) | self.speculating
                                               if speculates else 1)
            with m.Case(PlanOp.COMMIT):
                m.d.comb += fetched_illegal.eq(~self.speculating)
            with m.Case(PlanOp.DONE):
                m.d.comb += fetched_illegal.eq(self.speculating)
            with m.Default():
                m.d.comb += fetched_illegal.eq(1)
        # Only BRANCH and ASSUME use cond, and only its bit 0.
        cond_illegal = (fetched.cond[1:] != 0) | (
            (fetched.cond != 0) & (fetched.op != PlanOp.BRANCH) & (fetched.op != PlanOp.ASSUME))

        illegal_plan = Signal()     # the instruction is illegal (ILLEGAL_PLAN)
        plan_bad = Signal()         # ... or faults otherwise (below)
        switches = Signal()         # SWITCH
        calls = Signal()            # CALL
        # MARK (a NOP on a tile without the MARK register: `debug_regs`)
        marks = Signal(name="marks") if cfg.debug_regs else None
        commit_misses = Signal()    # COMMIT, its guard is false, and it does not fault
        publishes = Signal()        # COMMIT, legal, and its guard is true
        where = Signal(16, name="where") if copied else None    # SWITCH: the index register
        where_outside = Signal()    # ... not below the table's length
        taken = Signal()            # BRANCH: the flag has the value that takes it
        goto = Signal(25)           # the plan PC the instruction goes to
        # The plan store's read address, from the state and registers alone: every
        # cycle that may go to PLAN_FETCH presents the instruction it would fetch
        # (START the first, an instruction its target, ROLLBACK the fallback's, RET and
        # PUBLISH the next), and the word is used only if it does. With the decisions
        # (the fault and miss decision last) in front of it, the address was the worst
        # path of step 34's first build (12.93 ns).
        with m.If(at(_State.IDLE)):
            m.d.comb += self.plan_rd_pc.eq(0)
        with m.Elif(at(_State.PLAN_EXEC)):
            m.d.comb += self.plan_rd_pc.eq(goto)
        with m.Elif(at(_State.ROLLBACK)):
            m.d.comb += self.plan_rd_pc.eq(resume_pc)
        with m.Else():
            m.d.comb += self.plan_rd_pc.eq(next_q)

        # Whether the instruction faults when it executes (in this order: illegal, a
        # SWITCH index, the CALLed slot, the target), decided here and registered
        # (`plan_bad`) beside the terms that choose its record: the fault decision
        # has one flip-flop for PLAN_EXEC's faults, and one for its miss, a COMMIT
        # whose guard is false (`commit_misses`, only when it does not fault). With
        # the terms registered and ORed in PLAN_EXEC, they were seven of the inputs
        # of that decision, the routed worst path of 9f60a10's ULX3S build
        # (docs/fpga-timing.md, steps 52 and 53).
        guard_holds = self.flags.bit_select(guard_flag, 1) == guard_value
        fetched_bad = Signal()
        fetched_slot_ok = Signal()
        fetched_where_outside = Signal()
        fetched_goes = Signal()
        fetched_wrong = Signal()      # illegal_plan's decode
        m.d.comb += [
            # CALL: the slot exists and is valid. Its entry is locked from here on
            # (see `calling`), so the test holds in the execution cycle; made there,
            # the selection of the slot's valid bit came first on the fault
            # decision's path into the staging buffer and everything a fault
            # abandons (step 33's worst).
            fetched_slot_ok.eq((fetched.sel < cfg.kernel_slots) &
                               self.slot_valid.bit_select(fetched.sel, 1)),
            fetched_where_outside.eq(where_outside_value if cfg.compact
                                     else Array(index_outside)[fetched.sel[:2]]),
            fetched_goes.eq(fetched.op.as_value().matches(
                PlanOp.NOP, PlanOp.MARK, PlanOp.JUMP, PlanOp.BRANCH, PlanOp.SWITCH,
                PlanOp.ASSUME)),
            fetched_wrong.eq(fetched_illegal | cond_illegal),
            fetched_bad.eq(fetched_wrong |
                           (fetched.op == PlanOp.SWITCH) & fetched_where_outside |
                           (fetched.op == PlanOp.CALL) & ~fetched_slot_ok |
                           fetched_goes & fetched_outside),
        ]
        with m.If(at(_State.PLAN_DECODE)):
            m.d.sync += [
                illegal_plan.eq(fetched_wrong),
                switches.eq(fetched.op == PlanOp.SWITCH),
                calls.eq(fetched.op == PlanOp.CALL),
                *([marks.eq(fetched.op == PlanOp.MARK)] if cfg.debug_regs else []),
                plan_bad.eq(fetched_bad),
                # (A COMMIT faults only when it is illegal.)
                commit_misses.eq((fetched.op == PlanOp.COMMIT) & ~guard_holds & ~fetched_wrong),
                publishes.eq((fetched.op == PlanOp.COMMIT) & guard_holds & ~fetched_wrong),
                # (Built for area, the fault's address is the selected index register
                # itself, which holds still until the instruction has executed.)
                *([where.eq(fetched_where)] if copied else []),
                where_outside.eq(fetched_where_outside),
                taken.eq(fetched_taken),
                goto.eq(fetched_target),
            ]
        # Why the executed instruction faults, from those registers alone.
        plan_bad_cause = Signal(FaultCause)
        plan_bad_addr = Signal(32)
        with m.If(illegal_plan):
            m.d.comb += [plan_bad_cause.eq(FaultCause.ILLEGAL_PLAN),
                         plan_bad_addr.eq(plan_ir[:32])]
        with m.Elif(switches & where_outside):
            m.d.comb += [plan_bad_cause.eq(FaultCause.SWITCH_RANGE),
                         plan_bad_addr.eq(where if copied else fetched_where)]
        with m.Elif(calls):
            m.d.comb += [plan_bad_cause.eq(FaultCause.SLOT_INVALID), plan_bad_addr.eq(plan.sel)]
        with m.Else():
            m.d.comb += [plan_bad_cause.eq(FaultCause.PLAN_RANGE), plan_bad_addr.eq(goto)]

        # -- the operand check of compute micro-instructions ------------------------------
        # It takes the instruction register (not the kernel store's output, which
        # leaves no room for logic after the block RAM: docs/fpga-timing.md, step 28) from
        # MICRO_EXEC's first cycle, and its answer is registered here in the cycle it
        # is valid.
        m.submodules.operand_check = check = OperandCheck(cfg)
        m.d.comb += [check.op.eq(checked_micro.op), check.args.eq(checked_micro.args),
                     check.limit.eq(self.part_limit)]
        check_started = Signal()    # the check has the instruction in MICRO_EXEC
        checked = Signal()          # ... and its answer is registered
        check_illegal = Signal()
        armed = Signal()            # ... and it is illegal or outside: the instruction
                                    # faults when it would issue
        with m.If(~at(_State.MICRO_EXEC)):
            m.d.sync += [check_started.eq(0), checked.eq(0), armed.eq(0)]
        # Which operands end outside the slot's partition (the check's comparison),
        # registered. The extent is registered in the scratchpad: CALL sets the slot
        # three cycles before the check takes the partition's length (MICRO_FETCH and
        # the check's first cycle between), and the extent follows a cycle after the
        # slot, so the check compares with the slot's own extent. The ends are the
        # check's registers (built for area, its sums), valid from the cycle after its
        # answer while the instruction is held.
        outside = Signal.like(check.outside)
        outside_end = Signal(32)    # the end of the first operand outside the partition
        for i in reversed(range(len(outside))):
            with m.If(outside[i]):
                m.d.comb += outside_end.eq(check.ends[i])
        # -- the compute unit's command register ------------------------------------------
        # A compute micro-instruction goes to the compute unit through a register, and
        # the sequencer sees the unit's `busy` through one: neither way is combinational
        # between the two units (the unit's command decode starts at flip-flops, and
        # the sequencer's decisions, and the fault and miss decisions after them, do
        # not wait for the unit's completion logic). A compute instruction issues, and
        # WAIT with `compute` and RET go on, only when the register is empty and the
        # unit was idle the cycle before (`compute_pending` low), so the unit is idle
        # when it takes the command, the cycle after the issue: as before, an issued
        # instruction's predecessor has completed.
        cmd_valid = Signal()
        cmd_payload = Signal.like(self.compute_cmd.payload)
        issue_compute = Signal()
        busy_seen = Signal()
        compute_pending = Signal()      # a command in the register or being executed
        cmd_taken = Signal()
        m.d.comb += [
            self.compute_cmd.valid.eq(cmd_valid),
            self.compute_cmd.payload.eq(cmd_payload),
            cmd_taken.eq(cmd_valid & self.compute_cmd.ready),
            compute_pending.eq(cmd_valid | busy_seen),
        ]
        # The payload follows the instruction in MICRO_EXEC while the register is free,
        # so its enable does not wait for the issue decision.
        a_first, b_first, w_first = port_starts(m, micro.op, micro.args, cfg.word_bytes)
        payload = [cmd_payload.op.eq(micro.op), cmd_payload.args.eq(micro.args),
                   cmd_payload.part.eq(part),
                   cmd_payload.a_first.eq(a_first),
                   cmd_payload.b_first.eq(b_first),
                   cmd_payload.w_first.eq(w_first),
                   cmd_payload.steps.eq(vector_steps(micro.op, micro.args, cfg.word_bytes))]
        if cfg.compact:
            # Built for area, only `valid` is a register: the payload is decoded from
            # the instruction register as the unit takes it. The unit takes it in the
            # cycle after the issue: it was idle the cycle before the issue, and nothing
            # was in the register. That cycle is the next instruction's MICRO_FETCH,
            # which registers its word only at its end: `micro_ir` still holds the
            # issued one. (A command the unit does not take then is one a stopped unit
            # refuses until the abort that empties the register.)
            m.d.comb += payload
        else:
            with m.If(~cmd_valid):
                m.d.sync += payload
        with m.If(cmd_taken):
            m.d.sync += cmd_valid.eq(0)
        with m.If(issue_compute):
            m.d.sync += cmd_valid.eq(1)
        # (dma_abort also aborts the compute unit: the register is emptied with it.)
        with m.If(self.dma_abort):
            m.d.sync += cmd_valid.eq(0)
        m.d.sync += busy_seen.eq((self.compute_busy | cmd_taken) & ~self.dma_abort)

        # -- the DMA command -----------------------------------------------------------
        # Decoded from the instruction register whatever the state: the push alone
        # waits for MICRO_EXEC. Inside the state's case, the state's decode came in
        # front of the GMEM relocation adder and the DMA queue's LUT RAM (10.5 ns of
        # 07016dc's routed paths, docs/fpga-timing.md step 38).
        # (The reserved GmemBase makes the instruction's class `illegal`.)
        # Built for area, the CALL's arguments are read from the plan's instruction
        # register, which holds the CALL from its fetch until the fetch after the
        # kernel's RET: no copy of them.
        base = Signal(24)
        with m.Switch(dma_args.gmem_base):
            with m.Case(GmemBase.ARG0):
                m.d.comb += base.eq(arg_a if copied else plan.a)
            with m.Case(GmemBase.ARG1):
                m.d.comb += base.eq(arg_b if copied else plan.b)
        dma_cmd = self.dma_push.payload.command
        m.d.comb += [
            dma_cmd.store.eq(micro.op == MicroOp.DMA_STORE),
            dma_cmd.gmem_addr.eq(base + dma_args.gmem_addr),
            dma_cmd.gmem_stride.eq(dma_args.gmem_stride),
            dma_cmd.part.eq(part),
            dma_cmd.spad_addr.eq(dma_args.spad_addr),
            dma_cmd.spad_stride.eq(dma_args.spad_stride),
            dma_cmd.rows.eq(dma_args.rows),
            dma_cmd.cols.eq(dma_args.cols),
            self.dma_push.payload.token.eq(dma_args.token),
        ]

        # A rollback (the counter's event) lasts from a miss to the fallback's first
        # instruction: the miss's cycle, ROLLBACK, and the fallback's fetch, decode and
        # execution (`rolled_back`). From the states alone: a register of its own had
        # the whole miss decision in front of its enable, the routed worst path of
        # 9f60a10's seed-4 build (10.31 ns, docs/fpga-timing.md step 52).
        miss = Signal()
        rolled_back = Signal()      # the fallback's fetch and decode follow ROLLBACK
        fetching = at(_State.PLAN_FETCH) | at(_State.PLAN_DECODE)
        m.d.sync += rolled_back.eq(at(_State.ROLLBACK) | rolled_back & fetching)
        m.d.comb += self.events.rollback.eq(
            at(_State.ROLLBACK) | rolled_back & (fetching | at(_State.PLAN_EXEC)))

        # The states, each on its own flip-flop (exactly one is set).
        with m.If(at(_State.IDLE)):
            m.d.comb += self.plan_rd_bank.eq(self.active_bank)
            with m.If(self.swap_pending | self.swap):
                m.d.comb += swap_due.eq(1)
            with m.If(self.start):
                m.d.comb += self.plan_rd_en.eq(1)
                m.d.comb += watchdog_hit.eq(0)    # the count starts at 0
                m.d.sync += [
                    self.running.eq(1), faults_running.eq(1), self.done.eq(0),
                    self.plan_pc.eq(0),
                    plan_pc_outside.eq(0), self.exec_bank.eq(self.active_bank),
                    state.eq(_State.PLAN_FETCH.code),
                ]
                if cfg.watchdog:
                    m.d.sync += watchdog.eq(0)

        with m.If(at(_State.PLAN_FETCH)):
            m.d.sync += plan_ir.eq(self.plan_rd_data)
            with m.If(plan_pc_outside):
                raise_fault(at(_State.PLAN_FETCH), FaultCause.PLAN_RANGE, self.plan_pc)
            with m.Else():
                m.d.sync += state.eq(_State.PLAN_DECODE.code)

        with m.If(at(_State.PLAN_DECODE)):
            m.d.sync += state.eq(_State.PLAN_EXEC.code)

        with m.If(at(_State.ROLLBACK)):
            m.d.comb += self.plan_rd_en.eq(1)
            m.d.sync += [self.plan_pc.eq(resume_pc), plan_pc_outside.eq(resume_outside),
                         state.eq(_State.PLAN_FETCH.code)]

        with m.If(at(_State.PLAN_EXEC)):
            # MARK writes the register even when its target faults (as the golden
            # model, kernels/model.py, does); a tile without it has none to write.
            if cfg.debug_regs:
                with m.If(marks & ~illegal_plan):
                    m.d.sync += self.mark.eq(plan.a)
            with m.If(plan_bad):
                raise_fault(at(_State.PLAN_EXEC), plan_bad_cause, plan_bad_addr)
            with m.Elif(commit_misses):
                m.d.comb += miss.eq(1)
            with m.Else():
                with m.Switch(plan.op):
                    with m.Case(PlanOp.NOP, PlanOp.MARK, PlanOp.JUMP, PlanOp.SWITCH):
                        plan_goto(goto)
                    with m.Case(PlanOp.BRANCH):
                        m.d.comb += [self.events.branch.eq(1),
                                     self.events.taken.eq(taken),
                                     self.events.flag.eq(plan.sel)]
                        plan_goto(goto)
                    if speculates:
                        with m.Case(PlanOp.ASSUME):
                            m.d.sync += [
                                self.speculating.eq(1), guard_flag.eq(plan.sel),
                                guard_value.eq(plan.cond[0]), resume_pc.eq(plan.a),
                                resume_outside.eq(plan.a[:16] >= cfg.plan_depth),
                                self.miss_pc.eq(self.plan_pc),
                            ]
                            plan_goto(goto)
                        with m.Case(PlanOp.COMMIT):
                            # The publish is `publishes` (below), the same decision.
                            m.d.sync += [self.speculating.eq(0),
                                         state.eq(_State.PUBLISH.code)]
                    with m.Case(PlanOp.DONE):
                        m.d.sync += [self.running.eq(0), faults_running.eq(0),
                                     self.done.eq(1), state.eq(_State.IDLE.code)]
                        m.d.comb += [self.events.plan_retired.eq(1),
                                     self.events.inference.eq(1)]
                        with m.If(self.swap_pending | self.swap):
                            m.d.comb += swap_due.eq(1)
                    with m.Case(PlanOp.CALL):
                        m.d.comb += self.kern_rd_en.eq(1)
                        m.d.sync += [
                            self.slot.eq(plan.sel),
                            part.eq(self.slot_part[plan.sel[:4]]),
                            *([arg_a.eq(plan.a), arg_b.eq(plan.b)] if copied else []),
                            self.in_kernel.eq(1), micro_pc.eq(0), next_upc.eq(1),
                            micro_pc_outside.eq(0),
                            *([call_pc.eq(self.plan_pc)] if call_pc is not None else []),
                            *([call_start.eq(self.cycles),
                               call_cycles.eq(0), call_dma_busy.eq(0),
                               call_words_in.eq(0), call_words_out.eq(0),
                               call_mac_busy.eq(0), call_vec_busy.eq(0)] if traced else []),
                            state.eq(_State.MICRO_FETCH.code),
                        ]

        # A COMMIT that executes publishes, from the decode's register: decided here,
        # the opcode's decode, the fault and the miss came in front of the staging
        # buffer's registers (11.82 ns of 36f2362's routed ULX3S build, step 51).
        # Like every publish it does not wait for the cycle's hard faults: the discard
        # a cycle later empties the buffer before it writes a word (`abandon`).
        if speculates:
            m.d.comb += [self.staging_publish.eq(at(_State.PLAN_EXEC) & publishes),
                         self.events.spec_hit.eq(self.staging_publish)]

            with m.If(at(_State.PUBLISH)):
                # The COMMIT retires once its stores are in GMEM.
                with m.If(~self.staging_draining):
                    plan_goto(next_q, next_outside)

        with m.If(at(_State.MICRO_FETCH)):
            m.d.sync += [micro_ir.eq(self.kern_rd_data), check_ir.eq(self.kern_rd_data),
                         exec_class.eq(self.kern_rd_class)]
            with m.If(micro_pc_outside):
                raise_fault(at(_State.MICRO_FETCH), FaultCause.SLOT_RANGE, micro_pc)
            with m.Else():
                m.d.sync += state.eq(_State.MICRO_EXEC.code)

        # MICRO_EXEC, by the instruction's class (one flip-flop each, one set).
        executing = Signal.like(exec_class)
        m.d.comb += executing.eq(Mux(at(_State.MICRO_EXEC), exec_class, 0))
        with m.If(executing.nop):
            micro_next()
        with m.If(executing.dma):
            # The command itself is decoded above, outside the states. Pushed
            # whatever else faults in this cycle (not `~fault`): see abandon().
            m.d.comb += self.dma_push.valid.eq(1)
            with m.If(self.dma_push.ready):
                micro_next()
            with m.Else():
                m.d.comb += self.events.stall_dma.eq(1)
        with m.If(executing.compute):
            # The first cycles check the operands (the check's stages; the last
            # registers its answer: 3, VPOOL 4). The compute unit runs beside the
            # sequencer, which only waits for it when it is still busy with the
            # previous instruction; an instruction that fails its check faults when
            # it would issue (`armed`, below), so everything before it has completed
            # and nothing of it has happened.
            with m.If(~check_started):
                m.d.comb += check.start.eq(1)
                m.d.sync += check_started.eq(1)
            with m.Elif(~checked):
                with m.If(check.valid):
                    m.d.sync += [checked.eq(1), check_illegal.eq(check.illegal),
                                 outside.eq(check.outside),
                                 armed.eq(check.illegal | check.outside.any())]
            with m.Elif(compute_pending):
                m.d.comb += self.events.stall_compute.eq(1)
            with m.Elif(~armed):
                m.d.comb += issue_compute.eq(1)
                micro_next()
        # `armed` is set only under a compute instruction's class and cleared outside
        # MICRO_EXEC, so the fault needs neither the class nor `checked`.
        with m.If(at(_State.MICRO_EXEC) & armed & ~compute_pending):
            raise_fault(at(_State.MICRO_EXEC) & armed,
                        Mux(check_illegal, FaultCause.ILLEGAL_MICRO, FaultCause.PARTITION),
                        Mux(check_illegal, micro_ir[:32], outside_end),
                        Mux(check_illegal, 0, part))
        with m.If(executing.wait):
            tokens = micro.args.wait.tokens
            on_compute = micro.args.wait.compute
            # Plain WAIT (no tokens, no compute) waits for every DMA.
            mask = Mux((tokens == 0) & ~on_compute, 0b1111, tokens)
            with m.If(on_compute & compute_pending):
                m.d.comb += self.events.stall_compute.eq(1)
            with m.Elif((self.dma_outstanding & mask) != 0):
                m.d.comb += self.events.stall_dma.eq(1)
            with m.Else():
                micro_next()
        with m.If(executing.ret):
            with m.If(compute_pending):
                m.d.comb += self.events.stall_compute.eq(1)
            with m.Elif(self.dma_outstanding != 0):
                m.d.comb += self.events.stall_dma.eq(1)
            with m.Else():
                m.d.sync += self.in_kernel.eq(0)
                m.d.comb += [
                    self.events.micro_retired.eq(1),
                    self.events.call_done.eq(1),
                    *([self.trace_push.eq(1)] if traced else []),
                ]
                plan_goto(next_q, next_outside)
        with m.If(executing.illegal):
            raise_fault(at(_State.MICRO_EXEC) & ~armed, FaultCause.ILLEGAL_MICRO, micro_ir[:32])

        with m.If(at(_State.FAULT)):
            with m.If(self.clear_fault):
                m.d.sync += [self.faulted.eq(0), state.eq(_State.IDLE.code)]

        # Faults raised by the DMA engine, the watchdog or the host win over
        # whatever the sequencers were doing this cycle. A unit's fault is still up in
        # the cycle that aborts it (`abort_units`, below), which is not a new one.
        # That test reads a copy of `abort_units` of its own, placed beside the fault's
        # decision: the register the units read, across the device, was the first
        # 2 ns of five of e964b34's routed late paths, into the state's reset through
        # the fault and `void` (docs/fpga-timing.md, step 45).
        abort_units = Signal()
        units_aborted = copy(Signal(name="units_aborted"))
        m.d.comb += unit_fault.eq(faults_running & (self.dma_fault | self.compute_fault) &
                                  ~units_aborted)
        # (The compute unit's fault wins over the DMA engine's.)
        with m.If(unit_fault):
            raise_overriding_fault(
                Mux(self.compute_fault, self.compute_fault_cause, self.dma_fault_cause),
                Mux(self.compute_fault, self.compute_fault_addr, self.dma_fault_addr),
                Mux(self.compute_fault, self.compute_fault_part, self.dma_fault_part))

        # -- speculation: a miss continues in the other bank ------------------------------
        # (Without speculation no ASSUME executes: `speculating` stays 0, and nothing
        # misses.)
        if speculates:
            with m.If(self.speculating):
                # (Without decisions the flags never change: the guard, tested at
                # ASSUME, holds until COMMIT.)
                if cfg.decisions:
                    with m.If(self.flag_we & (self.flag_sel == guard_flag) &
                              (self.flag_value != guard_value)):
                        m.d.comb += miss.eq(1)
                with m.If(self.staging_overflow):
                    m.d.comb += miss.eq(1)
                # A fault the guess may have caused rolls back instead of stopping the tile
                # (but for the watchdog's and the host's: `hard_fault`, below). The event
                # says so itself, rather than being undone by the stop: with the stop's
                # decision in front, it was a 10.06 ns path into its counter's register on
                # e964b34's ULX3S build (docs/fpga-timing.md, step 44).
                with m.If(fault):
                    m.d.comb += [miss.eq(1), self.events.spec_fault.eq(~hard_fault)]

        # The watchdog and the host's abort stop the tile even inside a speculative
        # region; they are raised last, so their cause wins (the host's over the
        # watchdog's).
        m.d.comb += hard_fault.eq(faults_running & hard_hit)
        with m.If(hard_fault):
            if cfg.watchdog:
                raise_overriding_fault(Mux(abort_taken, FaultCause.ABORTED,
                                           FaultCause.WATCHDOG),
                                       Mux(abort_taken, 0, watchdog))
            else:
                raise_overriding_fault(FaultCause.ABORTED, 0)
        stop = Signal()
        m.d.comb += stop.eq(fault & ~self.speculating | hard_fault)

        def abandon():
            """What a miss and a stop share: nothing of this cycle takes effect (its
            retirements are void for the counters), the units are aborted, staged
            stores are dropped, and a call cut short is still traced, marked as
            faulted. A DMA command pushed or a compute command issued in this cycle is
            dropped the next (`dma_abort` flushes the DMA queue before the engine can
            take the command, and empties the compute command register; the compute
            unit drops a command it takes during the abort): the push and the issue do
            not wait for the fault decision, which was in front of the DMA queue's
            write enable (104 of the ULX3S build's late endpoints) and the compute
            command register's (13.56 ns; step 33). A COMMIT's publish goes to the
            staging buffer likewise, and the discard a cycle later empties it before
            it has written a word: in front of the buffer's registers, the decision
            was the routed worst path of step 33's last build (13.66 ns)."""
            m.d.comb += [
                self.events.void.eq(1),
                *([self.trace_push.eq(self.in_kernel),
                   self.trace_record.faulted.eq(1)] if traced else []),
            ]

        # The units are aborted, and staged stores dropped, the cycle after a fault or
        # a miss, from a register: the decision (a dozen sources, a dozen LUTs deep)
        # fanned out from here into every unit's cancels, the scratchpad's and GMEM's
        # write enables and addresses, the ULX3S build's routed worst paths since
        # step 28 (docs/fpga-timing.md, step 29). In the cycle between, the sequencer issues
        # nothing (`abandon`) and the units do that cycle's work: a DMA word moves, a
        # speculative store still goes to the staging buffer that the abort empties,
        # and a compute step lands (its flag or index write too, as before). Every
        # fault is either a stop or (inside a speculative region) a miss.
        m.d.sync += [abort_units.eq(fault | miss), units_aborted.eq(fault | miss)]
        m.d.comb += [self.dma_abort.eq(abort_units),
                     *([self.staging_discard.eq(abort_units)] if speculates else [])]

        # A miss goes to the other bank and reads the fallback's instruction in the
        # next cycle (ROLLBACK), from registers: the miss decision (the fault decision
        # behind it) stays off the plan store's address and plan_pc's enable, which it
        # was the last of on ad84542's routed worst path and on 64 of step 33's late
        # endpoints. (A miss happens only inside a speculative region, where both banks
        # refuse host writes.)
        with m.If(miss & ~stop):
            m.d.sync += [
                self.speculating.eq(0), self.in_kernel.eq(0),
                self.exec_bank.eq(~self.exec_bank),
                state.eq(_State.ROLLBACK.code),
            ]
            abandon()
            m.d.comb += [self.events.spec_miss.eq(1), self.events.rollback.eq(1)]

        def recorded(field, overriding_value):
            """What the fault records in ``field`` ("cause", "addr" or "part")."""
            return Mux(overriding, overriding_value,
                       _one_of((r["where"], r[field]) for r in sequencer_records))

        with m.If(stop):
            m.d.sync += [
                self.running.eq(0), faults_running.eq(0), self.faulted.eq(1),
                self.in_kernel.eq(0), self.speculating.eq(0),
                # An instruction retiring in the cycle of the fault has no effect.
                self.done.eq(self.done),
                self.fault_cause.eq(recorded("cause", overriding_cause)),
                self.fault_addr.eq(recorded("addr", overriding_addr)),
                self.fault_part.eq(recorded("part", overriding_part)),
                self.fault_bank.eq(self.exec_bank),
                self.fault_in_kernel.eq(self.in_kernel), self.fault_slot.eq(self.slot),
                # (A rollback's plan_pc is the fallback's from its ROLLBACK cycle on.)
                self.fault_pc.eq(Mux(at(_State.ROLLBACK), resume_pc, self.plan_pc)),
                self.fault_upc.eq(micro_pc),
                state.eq(_State.FAULT.code),
            ]
            abandon()
            m.d.comb += [
                self.events.fault.eq(1),
                self.events.spec_miss.eq(0),
            ]
        return m
