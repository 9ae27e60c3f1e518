"""The tile's register and memory map, built from a :class:`TileConfig`.

This is the one place that says where everything is. The gateware elaborates its
CSR bank and bus decoder from :func:`tile_memory_map`; the host binds its typed
register access to it; ``fusetile regmap`` generates ``docs/registers.md`` and the C
header from it.

Layout (byte addresses from the tile's base; word-addressed Wishbone, 32-bit data)::

    0x0000_0000  CSRs: identity, control/status, faults, partition and slot tables,
                 performance counters, trace FIFO          (4 KiB)
    0x0001_0000  plan bank 0, then plan bank 1              (64-bit instructions)
    0x0002_0000  kernel slot 0, 1, ...                      (128-bit micro-instructions)
    0x0010_0000  GMEM                                        (up to 1 MiB)
"""

from functools import lru_cache

from amaranth.lib import enum

from ..kernels.config import TileConfig
from ..kernels.isa import PLAN_INSTR_BITS, MICRO_INSTR_BITS, FaultCause, TraceRecord, \
    FLAGS, INDEX_REGS
from .registers import Access, Field, Register, Counter, Window, MemoryMap


__all__ = [
    "MAGIC", "VERSION", "CSR_BASE", "CSR_SPAN", "PLAN_BASE", "SLOT_BASE", "GMEM_BASE",
    "ADDR_WIDTH", "COUNTERS", "DEBUG_COUNTERS", "SLOT_COUNTERS", "BRANCH_COUNTERS",
    "BANK_COUNTERS", "PIPELINED_COUNTERS", "TRACE_WORDS", "NO_DMA_QUEUE",
    "tile_memory_map", "bus_regions", "hwcfg_values", "config_from_hwcfg",
]


MAGIC = 0x4654494C                 # "FTIL"
VERSION = (0, 4, 0)                # (major, minor, patch) of the register map and ISA
#: HWCFG_CTRL.dma_queue_log2 of a tile with no DMA queue (a depth is at most 2**4).
NO_DMA_QUEUE = 7

CSR_BASE  = 0x0000_0000
CSR_SPAN  = 0x0000_1000
PLAN_BASE = 0x0001_0000
SLOT_BASE = 0x0002_0000
GMEM_BASE = 0x0010_0000
GMEM_SPAN = 0x0010_0000
ADDR_WIDTH = 21                    # bytes: GMEM_BASE + GMEM_SPAN

PART_TABLE_BASE    = 0x100
SLOT_TABLE_BASE    = 0x180
COUNTER_BASE       = 0x400
SLOT_COUNTER_BASE  = 0x600
BRANCH_COUNTER_BASE = 0x700
BANK_COUNTER_BASE  = 0x780

TRACE_WORDS = TraceRecord.as_shape().size // 32




# Global performance counters, in address order: (name, doc). The gateware builds
# one 64-bit counter for each and the host reads them by these names.
COUNTERS = (
    ("cycles",         "Clock cycles since the last clear (counts while not frozen)."),
    ("active_cycles",  "Cycles a plan was running (START to DONE or fault)."),
    ("dma_busy",       "Cycles the DMA engine was busy."),
    ("mac_busy",       "Cycles the MAC array was busy."),
    ("vec_busy",       "Cycles the vector unit was busy."),
    ("stall_dma",      "Cycles the kernel sequencer waited for the DMA engine."),
    ("stall_compute",  "Cycles the kernel sequencer waited for the compute unit."),
    ("dma_bytes_in",   "Bytes moved GMEM -> scratchpad."),
    ("dma_bytes_out",  "Bytes moved scratchpad -> GMEM."),
    ("plan_retired",   "Plan instructions retired."),
    ("micro_retired",  "Micro-instructions retired."),
    ("kernel_calls",   "Kernel calls completed."),
    ("inferences",     "Plans run to DONE."),
    ("swaps",          "Plan bank swaps taken."),
    ("faults",         "Faults that stopped the tile."),
    ("refused_writes", "Bus writes refused (active plan bank, executing slot, ...)."),
    ("spec_hits",      "COMMITs that found their guard true (staged stores published)."),
    ("spec_misses",    "Speculative regions rolled back to the other bank."),
    ("spec_faults",    "... of which because of a fault inside the region."),
    ("rollback_cycles", "Cycles from a failed guard to the fallback's first instruction."),
    ("macs",           "Multiply-accumulates performed by the MAC array."),
    ("saturations",    "Lanes clamped by requantisation (REQUANT, VADD, average VPOOL)."),
    ("bank_conflicts", "Scratchpad accesses stalled by a higher-priority port."),
)

# The global counters only a person debugging reads (the runtime reads none of them):
# a tile without the debugging registers (TileConfig.debug_regs) has none of them, and
# the others keep their addresses.
DEBUG_COUNTERS = ("plan_retired", "micro_retired", "swaps", "faults", "refused_writes",
                  "saturations")

# Per-bank scratchpad counters: BANK_<NAME>[b].
BANK_COUNTERS = (
    ("reads",  "Words read from this scratchpad bank."),
    ("writes", "Words written to this scratchpad bank."),
)

# Per-flag branch counters: BRANCH_<NAME>[f], f = the flag a BRANCH tests.
BRANCH_COUNTERS = (
    ("taken",     "BRANCHes on this flag that were taken."),
    ("not_taken", "BRANCHes on this flag that were not taken."),
)

# Per-slot counters: SLOT_<NAME>[i].
SLOT_COUNTERS = (
    ("calls",  "Calls of this kernel slot."),
    ("cycles", "Cycles spent in this kernel slot."),
)

# The counters that take their events a cycle later than the others, by name (an
# indexed set by its name without the index): one more register behind the
# scratchpad's arbitration, whose bank accesses and conflicts are decided late in the
# cycle (docs/fpga-timing.md, step 49). Freezes and clears apply to them exactly as to
# the others; only a read sees their events a cycle later.
# (tests/test_counters.py holds the tile to it, so a name that is not a counter fails.)
PIPELINED_COUNTERS = ("BANK_CONFLICTS", "BANK_READS", "BANK_WRITES")


def _log2(n):
    return n.bit_length() - 1


def _pow2_ceil(n):
    return 1 << (n - 1).bit_length()


@lru_cache(maxsize=None)
def tile_memory_map(config):
    """Build the :class:`MemoryMap` of a tile with configuration ``config``."""
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig, not {config!r}")
    mm = MemoryMap()
    R, RW, W1 = Access.R, Access.RW, Access.W1
    reg = mm.add_register

    # -- identity: the hardware profile --------------------------------------------
    reg(Register("ID", [Field("magic", 32, R, doc='0x4654494C, "FTIL".')],
                 "Identifies a fusetile."), 0x000, group="identity")
    reg(Register("VERSION", [Field("patch", 8, R), Field("minor", 8, R), Field("major", 8, R)],
                 "Version of the register map and ISA."), 0x004, group="identity")
    reg(Register("HWCFG_ARRAY", [
            Field("rows", 8, R, doc="MAC array rows."),
            Field("cols", 8, R, doc="MAC array columns."),
            Field("word_bytes", 8, R, doc="Bytes per scratchpad/DMA/GMEM word."),
            Field("vector_lanes", 7, R, doc="Lanes the vector unit scales per cycle "
                  "(0, from tiles before register map 0.2: word_bytes)."),
            Field("no_pool_average", 1, R, doc="VPOOL does not average: a VPOOL with "
                  "average is ILLEGAL_MICRO (TileConfig.pool_average False; tiles before "
                  "it read 0 and average)."),
        ], "Compute array configuration."), 0x008, group="identity")
    reg(Register("HWCFG_SPAD", [
            Field("bank_words", 16, R, doc="Words per scratchpad bank."),
            Field("banks", 8, R, doc="Scratchpad banks."),
            Field("partitions", 8, R, doc="Partition table entries."),
        ], "Scratchpad configuration."), 0x00C, group="identity")
    reg(Register("HWCFG_CTRL", [
            Field("kernel_slots", 7, R, doc="Kernel slots."),
            Field("no_slot_versions", 1, R, doc="The slot table has no version tags: "
                  "SLOT[i] has no `version` field (TileConfig.slot_versions False; tiles "
                  "before it read 0 and have them)."),
            Field("slot_depth_log2", 4, R, doc="log2(micro-instructions per slot)."),
            Field("plan_depth_log2", 4, R, doc="log2(plan instructions per bank)."),
            Field("trace_depth_log2", 4, R, doc="log2(trace FIFO records); 0: no trace "
                  "FIFO, and no TRACE_STATUS or TRACE_DATA (a depth of one record is not "
                  "built)."),
            Field("slot_counters", 1, R, doc="Per-slot counters are present."),
            Field("staging_words_log2", 4, R, doc="log2(speculation staging words); 0: "
                  "no speculation (ASSUME and COMMIT are illegal)."),
            Field("dma_queue_log2", 3, R, doc="log2(DMA commands queued); 7: no queue "
                  "(a DMA instruction waits for an idle engine)."),
            Field("branch_counters", 1, R, doc="Per-flag branch counters are present "
                  "(tiles before register map 0.3 have them and read 0)."),
            Field("bank_counters", 1, R, doc="Per-bank scratchpad counters are present "
                  "(tiles before register map 0.3 have them and read 0)."),
            Field("compact", 1, R, doc="The units are built for area, with cycle counts "
                  "of their own (TileConfig.compact; tiles before it read 0 and are not)."),
            Field("no_decisions", 1, R, doc="VCMP and VARGMAX are not built: they are "
                  "ILLEGAL_MICRO, and the flags and index registers stay 0 "
                  "(TileConfig.decisions False; tiles before it read 0 and have them)."),
        ], "Control configuration."), 0x010, group="identity")
    # (HWCFG_GMEM's upper byte, which `bytes` does not need, holds the last flags: a
    # register of its own would change the ULX3S's CSR multiplexer, and its route.)
    reg(Register("HWCFG_GMEM", [
            Field("bytes", 24, R, doc="GMEM size in bytes."),
            Field("no_word_ops", 1, R, doc="VADD, VPOOL and VCLAMP are not built: they "
                  "are ILLEGAL_MICRO (TileConfig.word_ops False; tiles before it read 0 "
                  "and have them)."),
            Field("no_watchdog", 1, R, doc="There is no watchdog: no WATCHDOG register, "
                  "and a plan runs until DONE, a fault or the host's abort "
                  "(TileConfig.watchdog False; tiles before it read 0 and have one)."),
            Field("no_debug_regs", 1, R, doc="There are no MARK and REFUSED_ADDR "
                  "registers and no DEBUG_COUNTERS, and the plan's MARK is a NOP "
                  "(TileConfig.debug_regs False; tiles before it read 0 and have them)."),
        ], "Global memory configuration, and whether the word operations, the "
           "watchdog and the debugging registers are built."),
        0x014, group="identity")

    # -- control and status -------------------------------------------------------
    reg(Register("CTRL", [
            Field("start", 1, W1, doc="Run the active plan bank from PC 0."),
            Field("swap", 1, W1, doc="Request a plan bank swap at the next safe point."),
            Field("clear_fault", 1, W1, doc="Leave the fault state (the tile goes idle)."),
            Field("abort", 1, W1, doc="Stop a running plan at once (as a fault would)."),
        ], "Commands."), 0x020, group="control")
    reg(Register("STATUS", [
            Field("running", 1, R, doc="A plan is running."),
            Field("done", 1, R, doc="The last plan ran to DONE (cleared by START)."),
            Field("faulted", 1, R, doc="The tile stopped on a fault (see FAULT)."),
            Field("active_bank", 1, R, doc="Plan bank the control unit runs."),
            Field("swap_pending", 1, R, doc="A swap is requested and not yet taken."),
            Field("dma_busy", 1, R, doc="The DMA engine is busy."),
            Field("in_kernel", 1, R, doc="A kernel slot is executing."),
            Field("slot", 4, R, doc="The slot executing (valid while in_kernel)."),
            Field("speculating", 1, R, doc="A speculative region (ASSUME .. COMMIT) is open."),
            Field("exec_bank", 1, R, doc="Bank being executed (the other one after a miss)."),
        ], "Tile state."), 0x024, group="control")
    if config.watchdog:
        reg(Register("WATCHDOG", [Field("limit", 32, RW,
                                        doc="Cycle limit per plan run; 0 = off.")],
                     "Watchdog: a plan still running after `limit` cycles faults with "
                     "WATCHDOG. Not built on a tile without a watchdog "
                     "(HWCFG_GMEM.no_watchdog)."),
            0x028, group="control")
    reg(Register("IRQ_ENABLE", [
            Field("done", 1, RW, doc="Raise `irq` while STATUS.done."),
            Field("fault", 1, RW, init=1, doc="Raise `irq` while STATUS.faulted."),
        ], "Interrupt enables."), 0x02C, group="control")
    if config.debug_regs:
        reg(Register("MARK", [Field("value", 24, R, doc="Operand of the last MARK.")],
                     "Progress marker written by the plan. Not built on a tile without "
                     "the debugging registers (HWCFG_GMEM.no_debug_regs)."),
            0x030, group="control")
    reg(Register("PC", [Field("plan", 16, R, doc="Plan PC."), Field("micro", 16, R, doc="Micro PC.")],
                 "Current program counters."), 0x034, group="control")
    reg(Register("FLAGS", [Field("flags", FLAGS, R, doc="F0 (bit 0) .. F7.")],
                 "Flag registers (written by VCMP, tested by BRANCH and ASSUME)."),
        0x038, group="control")
    reg(Register("MISS_PC", [Field("pc", 16, R)],
                 "Plan PC of the ASSUME whose guard failed last."), 0x03C, group="control")
    for i in range(INDEX_REGS):
        reg(Register(f"INDEX[{i}]", [Field("value", 16, R)],
                     f"Index register X{i} (written by VARGMAX, read by SWITCH)."),
            0x080 + 4 * i, group="index", index=i)

    # -- faults -------------------------------------------------------------------
    reg(Register("FAULT", [
            Field("cause", 4, R, enum=FaultCause, doc="Why the tile stopped."),
            Field("bank", 1, R, doc="Plan bank at the fault."),
            Field("in_kernel", 1, R, doc="The fault happened inside a kernel."),
            Field("slot", 4, R, doc="Executing slot at the fault."),
            Field("part", 4, R, doc="Partition of a PARTITION fault."),
        ], "Cause of the last fault (valid while STATUS.faulted)."), 0x040, group="fault")
    reg(Register("FAULT_PC", [Field("plan", 16, R), Field("micro", 16, R)],
                 "Plan and micro PC of the faulting instruction."), 0x044, group="fault")
    reg(Register("FAULT_ADDR", [Field("addr", 32, R)],
                 "Offending address: partition offset (PARTITION), GMEM word (GMEM_RANGE), "
                 "instruction bits [31:0] (ILLEGAL_*), cycle count (WATCHDOG)."),
        0x048, group="fault")
    if config.debug_regs:
        reg(Register("REFUSED_ADDR", [Field("addr", 32, R)],
                     "Byte address of the last refused bus write. Not built on a tile "
                     "without the debugging registers (HWCFG_GMEM.no_debug_regs)."),
            0x04C, group="fault")

    # -- counters control and trace FIFO -----------------------------------------
    reg(Register("PERF_CTRL", [
            Field("freeze", 1, RW, doc="Stop all counters (reads stay consistent)."),
            Field("clear", 1, W1, doc="Zero all counters."),
        ], "Performance counter control."), 0x060, group="perf")
    if config.traced:
        reg(Register("TRACE_STATUS", [
                Field("level", 16, R, doc="Records in the trace FIFO."),
                Field("dropped", 16, R,
                      doc="Records dropped because the FIFO was full (saturates)."),
            ], f"Trace FIFO state. A record is {TRACE_WORDS} words."), 0x070, group="trace")
        reg(Register("TRACE_DATA", [Field("data", 32, R)],
                     "Next word of the head trace record, LSB word first; reading the last word "
                     "of a record pops it. Reads 0 when empty.", read_strobe=True),
            0x074, group="trace")

    # -- partition and slot tables ------------------------------------------------
    # A tile's only partition is the whole scratchpad, and has no table entry: a
    # base would only leave the words below it unused, a length those above it, and
    # the runtime's programs use the whole scratchpad (`Program.partition`); the
    # base's adders and the length's comparisons are in front of every scratchpad
    # access.
    for i in range(config.partitions if config.partitions > 1 else 0):
        reg(Register(f"PART[{i}]", [
                Field("base", 16, RW, doc="First scratchpad word: a multiple of spad_banks "
                                          "(from register map 0.4; a partition that starts "
                                          "elsewhere has no words: every access to it "
                                          "faults)."),
                Field("length", 16, RW, doc="Words; offsets >= length fault."),
            ], f"Scratchpad partition {i}."), PART_TABLE_BASE + 4 * i, group="part", index=i)
    for i in range(config.kernel_slots):
        reg(Register(f"SLOT[{i}]", [
                Field("valid", 1, RW, doc="The slot holds a kernel that may be called."),
                Field("part", 4, RW, doc="Partition the kernel's scratchpad accesses use."),
                Field("_pad", 3, R),
                *([Field("version", 16, RW, doc="Host-defined kernel version tag.")]
                  if config.slot_versions else []),
            ], f"Kernel slot {i}. Refused while slot {i} executes."),
            SLOT_TABLE_BASE + 4 * i, group="slot", index=i)

    # -- performance counters -----------------------------------------------------
    for i, (name, doc) in enumerate(COUNTERS):
        if config.debug_regs or name not in DEBUG_COUNTERS:
            mm.add_counter(Counter(name.upper(), doc), COUNTER_BASE + 8 * i, group="counter",
                           index=i)
    # The indexed sets, each built or not: SLOT_CALLS[i], BRANCH_TAKEN[f], BANK_READS[b]...
    for prefix, names, count, base, built in (
            ("SLOT", SLOT_COUNTERS, config.kernel_slots, SLOT_COUNTER_BASE,
             config.slot_counters),
            ("BRANCH", BRANCH_COUNTERS, FLAGS, BRANCH_COUNTER_BASE, config.branch_counters),
            ("BANK", BANK_COUNTERS, config.spad_banks, BANK_COUNTER_BASE,
             config.bank_counters)):
        if not built:
            continue
        stride = 8 * len(names)
        for i in range(count):
            for j, (name, doc) in enumerate(names):
                mm.add_counter(Counter(f"{prefix}_{name.upper()}[{i}]", doc),
                               base + stride * i + 8 * j,
                               group=f"{prefix.lower()}_counter_{name}", index=i)

    # -- memory windows -----------------------------------------------------------
    plan_bytes = config.plan_depth * PLAN_INSTR_BITS // 8
    plan_span = _pow2_ceil(plan_bytes)
    for b in range(2):
        mm.add_window(Window(f"PLAN[{b}]", plan_bytes, plan_span, PLAN_INSTR_BITS,
                             f"Plan bank {b}. Writes are refused while it is the active bank."),
                      PLAN_BASE + b * plan_span)
    slot_bytes = config.slot_depth * MICRO_INSTR_BITS // 8
    slot_span = _pow2_ceil(slot_bytes)
    for k in range(config.kernel_slots):
        mm.add_window(Window(f"KERNEL[{k}]", slot_bytes, slot_span, MICRO_INSTR_BITS,
                             f"Microcode of kernel slot {k}. Writes are refused while it executes."),
                      SLOT_BASE + k * slot_span)
    mm.add_window(Window("GMEM", config.gmem_bytes, GMEM_SPAN, config.word_bits,
                         "Global memory (host port of the dual-ported GMEM)."), GMEM_BASE)
    assert mm.size <= 1 << ADDR_WIDTH
    return mm


def bus_regions(config):
    """The regions the bus decoder routes, {name: (base, size)} in bytes: the CSRs, both
    plan banks, all kernel slots, GMEM (sizes are powers of two, as the decoder wants)."""
    mm = tile_memory_map(config)
    plan_span = mm["PLAN[1]"].addr - mm["PLAN[0]"].addr
    slot_span = mm["KERNEL[0]"].item.span
    return {
        "csr": (CSR_BASE, CSR_SPAN),
        "plan": (PLAN_BASE, 2 * plan_span),
        "kernel": (SLOT_BASE, _pow2_ceil(config.kernel_slots * slot_span)),
        "gmem": (GMEM_BASE, GMEM_SPAN),
    }


def hwcfg_values(config):
    """The constant values of the identity registers for ``config``: {name: int}."""
    mm = tile_memory_map(config)
    pack = lambda name, **kw: mm[name].item.pack(**kw)
    return {
        "ID": pack("ID", magic=MAGIC),
        "VERSION": pack("VERSION", major=VERSION[0], minor=VERSION[1], patch=VERSION[2]),
        "HWCFG_ARRAY": pack("HWCFG_ARRAY", rows=config.rows, cols=config.cols,
                            word_bytes=config.word_bytes, vector_lanes=config.scaler_lanes,
                            no_pool_average=int(not config.pool_average)),
        "HWCFG_SPAD": pack("HWCFG_SPAD", bank_words=config.spad_bank_words,
                           banks=config.spad_banks, partitions=config.partitions),
        "HWCFG_CTRL": pack("HWCFG_CTRL", kernel_slots=config.kernel_slots,
                           no_slot_versions=int(not config.slot_versions),
                           slot_depth_log2=_log2(config.slot_depth),
                           plan_depth_log2=_log2(config.plan_depth),
                           trace_depth_log2=_log2(config.trace_depth) if config.traced else 0,
                           slot_counters=int(config.slot_counters),
                           staging_words_log2=(_log2(config.staging_words)
                                               if config.speculates else 0),
                           dma_queue_log2=(_log2(config.dma_queue) if config.dma_queue
                                           else NO_DMA_QUEUE),
                           branch_counters=int(config.branch_counters),
                           bank_counters=int(config.bank_counters),
                           compact=int(config.compact),
                           no_decisions=int(not config.decisions)),
        "HWCFG_GMEM": pack("HWCFG_GMEM", bytes=config.gmem_bytes,
                           no_word_ops=int(not config.word_ops),
                           no_watchdog=int(not config.watchdog),
                           no_debug_regs=int(not config.debug_regs)),
    }


def config_from_hwcfg(values):
    """Rebuild a :class:`TileConfig` from identity register values {name: int}.

    Raises
    ------
    ValueError
        If ``ID`` does not hold the fusetile magic number, or the version is unknown.
    """
    if values["ID"] != MAGIC:
        raise ValueError(f"ID register reads {values['ID']:#010x}, not the fusetile magic "
                         f"{MAGIC:#010x}: is a fusetile there?")
    # The identity registers' layouts do not depend on the configuration.
    mm = tile_memory_map(TileConfig())
    view = lambda name: mm[name].item.unpack(values[name])
    version = view("VERSION")
    if int(version.major) != VERSION[0]:
        raise ValueError(f"Tile reports register map version {int(version.major)}."
                         f"{int(version.minor)}, this host speaks {VERSION[0]}.{VERSION[1]}")
    array, spad, ctrl, gmem = (view(n) for n in ("HWCFG_ARRAY", "HWCFG_SPAD", "HWCFG_CTRL",
                                                 "HWCFG_GMEM"))
    word_bytes, vector_lanes = int(array.word_bytes), int(array.vector_lanes)
    before_0_3 = int(version.minor) < 3       # every counter present, the bits 0
    return TileConfig(
        rows=int(array.rows), cols=int(array.cols), word_bytes=word_bytes,
        vector_lanes=None if vector_lanes in (0, word_bytes) else vector_lanes,
        spad_banks=int(spad.banks), spad_bank_words=int(spad.bank_words),
        partitions=int(spad.partitions),
        kernel_slots=int(ctrl.kernel_slots), slot_depth=1 << int(ctrl.slot_depth_log2),
        plan_depth=1 << int(ctrl.plan_depth_log2),
        trace_depth=1 << int(ctrl.trace_depth_log2) if int(ctrl.trace_depth_log2) else 0,
        slot_counters=bool(int(ctrl.slot_counters)),
        staging_words=(1 << int(ctrl.staging_words_log2)
                       if int(ctrl.staging_words_log2) else 0),
        dma_queue=(0 if int(ctrl.dma_queue_log2) == NO_DMA_QUEUE
                   else 1 << int(ctrl.dma_queue_log2)),
        branch_counters=before_0_3 or bool(int(ctrl.branch_counters)),
        bank_counters=before_0_3 or bool(int(ctrl.bank_counters)),
        compact=bool(int(ctrl.compact)),
        decisions=not int(ctrl.no_decisions),
        pool_average=not int(array.no_pool_average),
        slot_versions=not int(ctrl.no_slot_versions),
        word_ops=not int(gmem.no_word_ops),
        watchdog=not int(gmem.no_watchdog),
        debug_regs=not int(gmem.no_debug_regs),
        gmem_bytes=int(gmem.bytes),
    )
