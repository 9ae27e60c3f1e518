"""The fusetile tile: everything behind one Wishbone register interface."""

from amaranth.hdl import Const, Module, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..kernels.config import TileConfig
from . import wishbone
from ..kernels.isa import FLAGS, INDEX_REGS
from .regmap import (tile_memory_map, bus_regions, hwcfg_values, COUNTERS, SLOT_COUNTERS,
                     BRANCH_COUNTERS, BANK_COUNTERS, PIPELINED_COUNTERS, ADDR_WIDTH,
                     CSR_SPAN)
from .csr import CsrBank
from .counters import PerfCounters
from .trace import TraceFifo
from .gmem import GlobalMemory
from .scratchpad import Scratchpad
from .dma import Dma
from .dma_queue import DmaQueue
from .staging import StagingBuffer
from .stores import PlanStore, KernelStore
from .control import ControlUnit
from .compute import ComputeUnit


__all__ = ["TileLights", "Tile"]


class TileLights(data.StructLayout):
    """What a board shows on its LEDs: bits of ``STATUS`` (see ``docs/registers.md``)."""

    def __init__(self):
        super().__init__({"running": 1, "done": 1, "faulted": 1, "speculating": 1})


class Tile(wiring.Component):
    """One NPU tile.

    Parameters
    ----------
    config : TileConfig
    gmem_ports : str
        How the host and the DMA engine share GMEM: ``"dual"`` (a read-write port
        each), ``"shared"`` (one read and one write port, for block RAMs with no more)
        or ``"single"`` (one port: the iCE40UP's SPRAM). Host accesses may wait in the
        latter two. See :class:`~fusetile.hdl.gmem.GlobalMemory`.
    store_ports : str
        How the host reads the plan banks and kernel slots: ``"dual"`` (a read port of
        its own) or ``"shared"`` (the control unit's, when it does not fetch: one
        block RAM read port per store; host reads may wait a cycle). See
        :mod:`fusetile.hdl.stores`.
    trace_width : int
        Bits of the trace FIFO's memory: 256 (a record a word), 128 or 64 (a record
        written over two or four cycles, in a half or a quarter of the block RAMs;
        see :class:`~fusetile.hdl.trace.TraceFifo`). Not used by a tile without a
        trace FIFO (``config.trace_depth`` 0).

    Attributes
    ----------
    bus : In(wishbone.Signature(addr_width=19))
        Register interface (word addresses; see ``docs/registers.md``).
    irq : Out(1)
        High while an enabled interrupt condition holds (fault, done).
    lights : Out(TileLights)
        ``STATUS`` bits for a board's LEDs.
    """

    def __init__(self, config=None, *, gmem_ports="dual", store_ports="dual",
                 trace_width=256):
        if config is None:
            config = TileConfig()
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        self.config = config
        if gmem_ports not in GlobalMemory.PORTS:
            raise ValueError(f"gmem_ports must be one of {', '.join(GlobalMemory.PORTS)}, "
                             f"not {gmem_ports!r}")
        self.gmem_ports = gmem_ports
        if store_ports not in ("dual", "shared"):
            raise ValueError(f"store_ports must be dual or shared, not {store_ports!r}")
        self.store_ports = store_ports
        if trace_width not in TraceFifo.WIDTHS:
            raise ValueError(f"trace_width must be one of "
                             f"{', '.join(map(str, TraceFifo.WIDTHS))}, not {trace_width!r}")
        self.trace_width = trace_width
        self.memory_map = tile_memory_map(config)
        super().__init__({
            "bus": In(wishbone.Signature(addr_width=ADDR_WIDTH - 2)),
            "irq": Out(1),
            "lights": Out(TileLights()),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        mm = self.memory_map

        m.submodules.csr = csr = CsrBank(mm, addr_width=(CSR_SPAN // 4).bit_length() - 1,
                                         compact=cfg.compact)
        m.submodules.gmem = gmem = GlobalMemory(cfg, ports=self.gmem_ports)
        m.submodules.spad = spad = Scratchpad(cfg)
        m.submodules.dma = dma = Dma(cfg)
        m.submodules.dma_queue = dma_queue = DmaQueue(cfg)
        if cfg.speculates:
            m.submodules.staging = staging = StagingBuffer(cfg)
        shared = self.store_ports == "shared"
        m.submodules.plans = plans = PlanStore(cfg, shared_read=shared)
        m.submodules.kernels = kernels = KernelStore(cfg, shared_read=shared)
        m.submodules.control = ctrl = ControlUnit(cfg)
        m.submodules.compute = compute = ComputeUnit(cfg)
        if cfg.traced:
            m.submodules.trace = trace = TraceFifo(cfg.trace_depth, width=self.trace_width,
                                                    compact=cfg.compact)

        # -- bus fabric -------------------------------------------------------------
        m.submodules.decoder = dec = wishbone.Decoder(addr_width=ADDR_WIDTH - 2)
        for name, (base, size) in bus_regions(cfg).items():
            dec.add(name, addr=base, size=size)
        wiring.connect(m, wiring.flipped(self.bus), dec.bus)
        wiring.connect(m, dec.sub("csr"), csr.bus)
        wiring.connect(m, dec.sub("plan"), plans.bus)
        wiring.connect(m, dec.sub("kernel"), kernels.bus)
        wiring.connect(m, dec.sub("gmem"), gmem.bus)

        # -- datapath -----------------------------------------------------------------
        if cfg.speculates:
            wiring.connect(m, dma.gmem, staging.dma)
            wiring.connect(m, staging.gmem, gmem.dma)
        else:
            wiring.connect(m, dma.gmem, gmem.dma)
        wiring.connect(m, dma.spad, spad.dma)
        for port in ("a", "b", "w"):
            wiring.connect(m, getattr(compute, port), getattr(spad, port))
        # The units test their scratchpad offsets against the open partition's limit
        # as they set them, and present no access outside it (hdl/dma.py,
        # hdl/compute.py): the scratchpad's own test stays off their decisions.
        m.d.comb += [dma.limit.eq(spad.limit), compute.limit.eq(spad.limit)]
        wiring.connect(m, ctrl.compute_cmd, compute.cmd)
        wiring.connect(m, ctrl.dma_push, dma_queue.push)
        wiring.connect(m, dma_queue.cmd, dma.cmd)
        m.d.comb += [
            dma_queue.engine_busy.eq(dma.busy),
            dma_queue.flush.eq(ctrl.dma_abort),
            ctrl.dma_outstanding.eq(dma_queue.outstanding),
            *([staging.speculate.eq(ctrl.speculating),
               staging.publish.eq(ctrl.staging_publish),
               staging.discard.eq(ctrl.staging_discard),
               ctrl.staging_draining.eq(staging.draining),
               ctrl.staging_overflow.eq(staging.overflow)] if cfg.speculates else []),
            ctrl.compute_busy.eq(compute.busy),
            ctrl.compute_fault.eq(compute.fault),
            ctrl.compute_fault_cause.eq(compute.fault_cause),
            ctrl.compute_fault_addr.eq(compute.fault_addr),
            ctrl.compute_fault_part.eq(compute.fault_part),
            *([ctrl.mac_busy.eq(compute.mac_busy),
               ctrl.vec_busy.eq(compute.vec_busy)] if cfg.traced else []),
            compute.abort.eq(ctrl.dma_abort),
            *([ctrl.flag_we.eq(compute.flag_we),
               ctrl.flag_sel.eq(compute.flag_sel),
               ctrl.flag_value.eq(compute.flag_value),
               ctrl.index_we.eq(compute.index_we),
               ctrl.index_sel.eq(compute.index_sel),
               ctrl.index_value.eq(compute.index_value)] if cfg.decisions else []),
            *([ctrl.dma_busy.eq(dma.busy)] if cfg.traced else []),
            ctrl.dma_fault.eq(dma.fault),
            ctrl.dma_fault_cause.eq(dma.fault_cause),
            ctrl.dma_fault_addr.eq(dma.fault_addr),
            ctrl.dma_fault_part.eq(dma.fault_part),
            *([ctrl.dma_word_in.eq(dma.word_in),
               ctrl.dma_word_out.eq(dma.word_out)] if cfg.traced else []),
            dma.abort.eq(ctrl.dma_abort),
            spad.abort.eq(ctrl.dma_abort),

            plans.rd_bank.eq(ctrl.plan_rd_bank),
            plans.rd_pc.eq(ctrl.plan_rd_pc),
            # With a port of their own the stores read every cycle (no enable logic in
            # front of the block RAM); shared, only when the control unit fetches.
            plans.rd_en.eq(ctrl.plan_rd_en if shared else 1),
            ctrl.plan_rd_data.eq(plans.rd_data),
            plans.active_bank.eq(ctrl.active_bank),
            plans.lock_all.eq(ctrl.plan_lock_all),

            kernels.rd_slot.eq(ctrl.kern_rd_slot),
            kernels.rd_upc.eq(ctrl.kern_rd_upc),
            kernels.rd_en.eq(ctrl.kern_rd_en if shared else 1),
            ctrl.kern_rd_data.eq(kernels.rd_data),
            ctrl.kern_rd_class.eq(kernels.rd_class),
            kernels.lock.eq(ctrl.slot_lock),
            kernels.locked_slot.eq(ctrl.locked_slot),
            kernels.hold.eq(ctrl.slot_hold),
        ]
        if cfg.traced:
            m.d.comb += [trace.push.eq(ctrl.trace_push), trace.record.eq(ctrl.trace_record)]

        # -- registers ------------------------------------------------------------------
        f = csr.fields

        for name, value in hwcfg_values(cfg).items():
            for field, offset in mm[name].item.field_offsets():
                m.d.comb += f[name][field.name].eq((value >> offset) & ((1 << field.width) - 1))

        m.d.comb += [
            ctrl.start.eq(f["CTRL"]["start"]),
            ctrl.swap.eq(f["CTRL"]["swap"]),
            ctrl.clear_fault.eq(f["CTRL"]["clear_fault"]),
            ctrl.abort.eq(f["CTRL"]["abort"]),
            *([ctrl.watchdog_limit.eq(f["WATCHDOG"]["limit"])] if cfg.watchdog else []),

            f["STATUS"]["running"].eq(ctrl.running),
            f["STATUS"]["done"].eq(ctrl.done),
            f["STATUS"]["faulted"].eq(ctrl.faulted),
            f["STATUS"]["active_bank"].eq(ctrl.active_bank),
            f["STATUS"]["swap_pending"].eq(ctrl.swap_pending),
            f["STATUS"]["dma_busy"].eq(~dma_queue.idle),
            f["STATUS"]["in_kernel"].eq(ctrl.in_kernel),
            f["STATUS"]["slot"].eq(ctrl.slot),
            f["STATUS"]["speculating"].eq(ctrl.speculating),
            f["STATUS"]["exec_bank"].eq(ctrl.exec_bank),
            f["FLAGS"]["flags"].eq(ctrl.flags),
            f["MISS_PC"]["pc"].eq(ctrl.miss_pc),
            *([f["MARK"]["value"].eq(ctrl.mark)] if cfg.debug_regs else []),
            f["PC"]["plan"].eq(ctrl.plan_pc),
            f["PC"]["micro"].eq(ctrl.micro_pc),

            f["FAULT"]["cause"].eq(ctrl.fault_cause),
            f["FAULT"]["bank"].eq(ctrl.fault_bank),
            f["FAULT"]["in_kernel"].eq(ctrl.fault_in_kernel),
            f["FAULT"]["slot"].eq(ctrl.fault_slot),
            f["FAULT"]["part"].eq(ctrl.fault_part),
            f["FAULT_PC"]["plan"].eq(ctrl.fault_pc),
            f["FAULT_PC"]["micro"].eq(ctrl.fault_upc),
            f["FAULT_ADDR"]["addr"].eq(ctrl.fault_addr),

            self.irq.eq((f["IRQ_ENABLE"]["done"] & ctrl.done) |
                        (f["IRQ_ENABLE"]["fault"] & ctrl.faulted)),
            self.lights.running.eq(ctrl.running),
            self.lights.done.eq(ctrl.done),
            self.lights.faulted.eq(ctrl.faulted),
            self.lights.speculating.eq(ctrl.speculating),
        ]
        if cfg.traced:
            m.d.comb += [
                f["TRACE_STATUS"]["level"].eq(trace.level),
                f["TRACE_STATUS"]["dropped"].eq(trace.dropped),
                f["TRACE_DATA"]["data"].eq(trace.data),
                trace.read.eq(csr.read_strobe["TRACE_DATA"]),
            ]

        for i in range(INDEX_REGS):
            m.d.comb += f[f"INDEX[{i}]"]["value"].eq(ctrl.index[i])

        # Partition and slot tables. The scratchpad opens the executing kernel's
        # partition, its slot's entry as CALL registered it (`kernel_part`, set with
        # the slot two cycles before the kernel's first access; the slot table's
        # entry selected by the slot was in front of the open partition's limit).
        # The entries a running kernel depends on cannot be rewritten under it: such
        # writes are refused like writes to an executing slot, the slot's from the
        # CALL that reads it (as the kernel store's), the partition's while the
        # kernel runs.
        m.d.comb += [
            spad.part.eq(ctrl.kernel_part),
            ctrl.part_limit.eq(spad.limit),
        ]
        if cfg.partitions == 1:
            # A tile's only partition is the whole scratchpad: no table entry.
            m.d.comb += [spad.part_base[0].eq(0), spad.part_len[0].eq(cfg.spad_words)]
        else:
            for i in range(cfg.partitions):
                m.d.comb += [
                    spad.part_base[i].eq(f[f"PART[{i}]"]["base"]),
                    spad.part_len[i].eq(f[f"PART[{i}]"]["length"]),
                    csr.refuse[f"PART[{i}]"].eq(ctrl.in_kernel & (ctrl.kernel_part == i)),
                ]
        for i in range(cfg.kernel_slots):
            m.d.comb += [
                ctrl.slot_valid[i].eq(f[f"SLOT[{i}]"]["valid"]),
                ctrl.slot_part[i].eq(f[f"SLOT[{i}]"]["part"]),
                csr.refuse[f"SLOT[{i}]"].eq(ctrl.slot_lock & (ctrl.locked_slot == i)),
            ]
        # The slot's lock covers a CALL from its execution cycle; its decode, which
        # tests the slot's entry, holds the host's writes (every register's: one
        # cycle).
        m.d.comb += csr.hold.eq(ctrl.slot_hold)

        # -- refused writes -------------------------------------------------------------
        refused = Signal()
        m.d.comb += refused.eq(csr.refused | plans.refused | kernels.refused)
        # A slave refuses an access while the master still holds it, so the address
        # of the access being refused is the one on the bus a cycle before the ERR (a
        # master may already move on while it sees ERR). Only REFUSED_ADDR keeps it:
        # without the debugging registers the master has the ERR, and its address.
        if cfg.debug_regs:
            access_addr = Signal(32)
            refused_addr = Signal(32)
            with m.If(self.bus.cyc & self.bus.stb):
                m.d.sync += access_addr.eq(self.bus.adr << 2)
            with m.If(refused):
                m.d.sync += refused_addr.eq(access_addr)
            m.d.comb += f["REFUSED_ADDR"]["addr"].eq(refused_addr)

        # -- performance counters -------------------------------------------------------
        ev = ctrl.events
        increments = {
            "cycles":         Const(1),
            "active_cycles":  ev.active,
            "dma_busy":       dma.busy,
            "mac_busy":       compute.mac_busy,
            "vec_busy":       compute.vec_busy,
            "stall_dma":      ev.stall_dma,
            "stall_compute":  ev.stall_compute,
            "dma_bytes_in":   dma.word_in * cfg.word_bytes,
            "dma_bytes_out":  dma.word_out * cfg.word_bytes,
            "plan_retired":   ev.plan_retired,
            "micro_retired":  ev.micro_retired,
            "kernel_calls":   ev.call_done,
            "inferences":     ev.inference,
            "swaps":          ev.swap,
            "faults":         ev.fault,
            "refused_writes": refused,
            "spec_hits":      ev.spec_hit,
            "spec_misses":    ev.spec_miss,
            "spec_faults":    ev.spec_fault,
            "rollback_cycles": ev.rollback,
            "macs":           compute.macs,
            "saturations":    compute.saturations,
            "bank_conflicts": spad.conflicts,
        }
        assert set(increments) == {name for name, _ in COUNTERS}
        # The map says which global counters the tile has (not regmap.DEBUG_COUNTERS
        # without `debug_regs`).
        increments = {name.upper(): inc for name, inc in increments.items()
                      if name.upper() in mm}
        if cfg.slot_counters:
            for s in range(cfg.kernel_slots):
                increments[f"SLOT_CALLS[{s}]"] = ev.call_done & (ctrl.slot == s)
                increments[f"SLOT_CYCLES[{s}]"] = ctrl.in_kernel & (ctrl.slot == s)
            assert {n for n, _ in SLOT_COUNTERS} == {"calls", "cycles"}
        if cfg.branch_counters:
            for f_ in range(FLAGS):
                on_flag = ev.branch & (ev.flag == f_)
                increments[f"BRANCH_TAKEN[{f_}]"] = on_flag & ev.taken
                increments[f"BRANCH_NOT_TAKEN[{f_}]"] = on_flag & ~ev.taken
            assert {n for n, _ in BRANCH_COUNTERS} == {"taken", "not_taken"}
        if cfg.bank_counters:
            for b in range(cfg.spad_banks):
                increments[f"BANK_READS[{b}]"] = spad.bank_reads[b]
                increments[f"BANK_WRITES[{b}]"] = spad.bank_writes[b]
            assert {n for n, _ in BANK_COUNTERS} == {"reads", "writes"}

        names = csr.counter_names
        assert set(names) == set(increments)
        # The retirements and swaps the control unit signals before its fault decision,
        # which the counters apply (`ControlEvents.void`).
        voidable = [n for n in names
                    if n in ("PLAN_RETIRED", "MICRO_RETIRED", "KERNEL_CALLS", "INFERENCES",
                             "SWAPS", "SPEC_HITS") or n.startswith(("SLOT_CALLS[", "BRANCH_"))]
        # The scratchpad's bank accesses and conflicts are decided behind its
        # arbitration, from the DMA port's offset: into the counters' first registers,
        # they were 10.03 and 9.67 ns of 0059dff's routed build (docs/fpga-timing.md,
        # step 49).
        pipelined = [n for n in names if n.split("[")[0] in PIPELINED_COUNTERS]
        # CYCLES is a register, readable every cycle, for the trace records' stamps;
        # without a trace FIFO it is in the RAM with the others.
        m.submodules.counters = counters = PerfCounters(
            names, inc_width={n: len(Value.cast(increments[n])) for n in names},
            immediate=["CYCLES"] if cfg.traced else [], voidable=voidable,
            pipelined=pipelined, compact=cfg.compact)
        m.d.comb += counters.void.eq(ev.void)
        wiring.connect(m, csr.counter_read, counters.read)
        m.d.comb += [
            counters.freeze.eq(f["PERF_CTRL"]["freeze"]),
            counters.clear.eq(f["PERF_CTRL"]["clear"]),
            *([ctrl.cycles.eq(counters.value["CYCLES"][:32])] if cfg.traced else []),
        ]
        m.d.comb += [counters.inc[n].eq(increments[n]) for n in names]

        return m
