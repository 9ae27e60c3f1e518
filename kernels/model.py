"""The golden model: one fusetile in NumPy, bit-exact, with a cycle estimate.

:class:`TileModel` holds the tile's whole architectural state (GMEM, scratchpad,
plan banks, kernel slots, partition and slot tables, ACC, flags F0..F7, index
registers X0..X3, vector configuration registers, the DMA queue, the speculation
staging buffer, the fault record, the trace FIFO and the performance counters) and
executes the full ISA of :mod:`fusetile.kernels.isa` with the arithmetic of
:mod:`fusetile.kernels.arith`. Instructions are decoded through the ISA layouts (the
field offsets and widths of ``PlanInstr``, ``MicroInstr`` and the argument structs).

The model advances in clock cycles (:meth:`TileModel.step`), so a plan takes time and
a host can act while it runs; :mod:`fusetile.host.model_transport` puts the tile's
register map in front of it. What is exact and what is an estimate:

*Exact* (what every target must agree on): GMEM, scratchpad, ACC, flags, index and
vector configuration registers, fault records (cause, bank, in_kernel, slot,
partition, plan PC, address), the plan/micro instructions retired, DMA bytes, kernel
calls, inferences, swaps, faults, refused writes, speculation hits / misses / faults
and the per-slot call and per-flag branch counts.

*Cycle-exact with the RTL for the spine* (plan sequencing, DMA queue and engine,
WAIT/RET, faults, watchdog, speculation control): the control unit, the DMA queue
(:mod:`fusetile.hdl.dma_queue`), the DMA engine and the staging buffer are modelled
state for state, so for DMA-only kernels the cycle counters (and the micro PC of a
DMA fault) match the RTL:

* a plan instruction takes 3 cycles (fetch, decode, execute); a micro-instruction 2
  cycles;
* a DMA command enters the queue in the cycle its micro-instruction executes, reaches
  the engine 2 cycles later (the queue's output register) if the engine is idle, and
  the engine is then busy ``rows * cols + 1`` cycles (a store ``rows * cols + 2``),
  one word per cycle; the next command starts the cycle after; the sequencer runs on
  meanwhile and only waits at WAIT / RET (until the tagged commands have completed)
  or when the queue is full (with ``dma_queue`` 1, a command reaches the engine the
  cycle after it enters the queue's one register; with 0 there is no queue: the
  engine takes the command in the cycle it executes, and the micro-instruction
  waits there while the engine is busy);
* COMMIT's publication of staged stores takes 2 cycles per word.

*Estimated* (the compute micro-instructions; the RTL's sequencing of the MAC array and
the vector unit may differ): the compute unit runs beside the sequencer, as the DMA
engine does, through a command register (as in the RTL), and the sequencer sees the
unit's busy a cycle late. A compute micro-instruction issues when the register is empty
and the unit was idle the cycle before (else the sequencer stalls, counted in
``stall_compute``), retires in 5 cycles (fetch, three of check, issue; VPOOL 6; on a
tile built for area MATMUL, REQUANT and VPOOL check 15 cycles longer, their products
made in the fabric a bit per cycle) and goes into the register; the unit takes it the
next cycle, when it takes effect at once (all of it), and is busy for the next
``extra`` cycles. ``WAIT`` with ``compute`` and ``RET`` wait as an issue does:

=========  ====================================================  ========
op         busy cycles (``extra``)                               unit
=========  ====================================================  ========
MATMUL     ``k + 4`` (array latency 3; 0 if ``k == 0``)          MAC
ACC_BIAS   words of bias + 2                                     MAC
REQUANT    ``R + 7``; per-channel, parameter words + 1 more      vector
VADD       ``n + 12`` (vector unit latency 11; 0 if ``n == 0``)  vector
VPOOL      ``n * window + 12`` (0 if ``n == 0``)                 vector
VCLAMP     ``n + 12`` (0 if ``n == 0``)                          vector
VCMP       words read + 12                                       vector
VARGMAX    words read + 12 (``n`` words with ``column``)         vector
VCFG       0                                                     --
=========  ====================================================  ========

With fewer vector lanes than bytes in a word (P = ``vector_passes`` > 1) a row or a
scaled word takes P cycles of the lane multipliers and every vector result comes
P - 1 cycles later, as in the RTL: REQUANT ``R * P + 7``, VADD ``n * P + 12``, an
average VPOOL ``(n - 1) * max(window, P) + window + 11 + P``, the other vector
operations ``P - 1`` more than above. (The latencies are
:mod:`fusetile.kernels.config`'s, which the gateware is built to.) A tile built for
area (``TileConfig.compact``) has a vector unit 5 cycles shorter for its scaled
results and a requantiser 2 cycles shorter, and its unscaled results come in 3
cycles whatever P: REQUANT ``R * P + 5``, VADD and an average VPOOL 5 fewer than
above, VCLAMP, a maximum VPOOL, VCMP and VARGMAX ``n + 4`` (words read + 4).

MATMUL adds ``k * R * C`` to the ``macs`` counter; every lane a requantisation clamps
(REQUANT, VADD, average VPOOL) adds one to ``saturations`` (both are model counters the
register map may not have).

A compute micro-instruction spends its first three execute cycles (VPOOL four) on the
operand check of :mod:`fusetile.kernels.operands` (as the control unit does): an illegal operand
(ILLEGAL_MICRO) or an operand that does not fit in the slot's partition (PARTITION,
address = the end of the first such operand, partition = the slot's) faults in the
cycle it would issue, having done nothing. Inputs are read before outputs are written,
as the pipelined vector unit does. VCFG truncates to the register's width (MULT_A/B 32 bits,
SHIFT 5, the int8 registers 8); a per-channel REQUANT entry's shift is its byte 4
modulo 32.

Speculation follows :mod:`fusetile.hdl.control`: any fault inside an open region
other than WATCHDOG and ABORTED (a DMA fault, a nested ASSUME, a DONE, ...) is a
miss (``spec_faults``), not a stop; a staging overflow is found at the store word
that does not fit and is a miss in the next cycle; a call abandoned by a miss is
traced with ``faulted`` set and not counted as a kernel call; a miss switches the
*executed* bank (STATUS.exec_bank) while the installed bank (``active_bank``) stays,
and the next START runs the installed bank again. Staged words count in
``dma_bytes_out`` when the DMA moves them, whether or not they are published.
"""

from collections import deque
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import arith
from .operands import check_latency, illegal_operands, operand_ends
from .config import TileConfig, MAC_LATENCY
from .isa import (PlanOp, PlanInstr, MicroOp, MicroInstr, GmemBase, FaultCause, TraceRecord,
                  DmaArgs, WaitArgs, MatmulArgs, AccBiasArgs, RequantArgs, VaddArgs, VpoolArgs,
                  VclampArgs, VcmpArgs, VargmaxArgs, VcfgArgs, CmpOp, VectorCfg,
                  COMPUTE_OPS, FLAGS, INDEX_REGS, DMA_TOKENS)


__all__ = ["TileModel", "FaultRecord", "COUNTER_NAMES", "decode_plan", "decode_micro"]


#: Global counters the model keeps: the register map's (hdl/regmap.py COUNTERS) and
#: the model-only ``macs`` and ``saturations``.
COUNTER_NAMES = (
    "cycles", "active_cycles", "dma_busy", "mac_busy", "vec_busy", "stall_dma",
    "stall_compute", "dma_bytes_in", "dma_bytes_out", "plan_retired", "micro_retired", "kernel_calls",
    "inferences", "swaps", "faults", "refused_writes", "spec_hits", "spec_misses",
    "spec_faults", "rollback_cycles", "macs", "saturations",
)

_MASK32 = 0xFFFF_FFFF


# -- decoding through the ISA layouts ---------------------------------------------------

def _fields(layout, base=0):
    """{name: (bit offset, width)} of a Struct's fields, offset by ``base``."""
    return {name: (base + f.offset, f.width) for name, f in layout.as_shape()}


_PLAN_FIELDS = _fields(PlanInstr)
_MICRO_FIELDS = _fields(MicroInstr)
_ARGS_BASE = _MICRO_FIELDS["args"][0]
_ARG_FIELDS = {
    MicroOp.DMA_LOAD: _fields(DmaArgs, _ARGS_BASE),
    MicroOp.DMA_STORE: _fields(DmaArgs, _ARGS_BASE),
    MicroOp.WAIT: _fields(WaitArgs, _ARGS_BASE),
    MicroOp.MATMUL: _fields(MatmulArgs, _ARGS_BASE),
    MicroOp.ACC_BIAS: _fields(AccBiasArgs, _ARGS_BASE),
    MicroOp.REQUANT: _fields(RequantArgs, _ARGS_BASE),
    MicroOp.VADD: _fields(VaddArgs, _ARGS_BASE),
    MicroOp.VPOOL: _fields(VpoolArgs, _ARGS_BASE),
    MicroOp.VCLAMP: _fields(VclampArgs, _ARGS_BASE),
    MicroOp.VCMP: _fields(VcmpArgs, _ARGS_BASE),
    MicroOp.VARGMAX: _fields(VargmaxArgs, _ARGS_BASE),
    MicroOp.VCFG: _fields(VcfgArgs, _ARGS_BASE),
}
_PLAN_OPS = {op.value: op for op in PlanOp}
_MICRO_OPS = {op.value: op for op in MicroOp}


def _extract(bits, fields):
    return {name: (bits >> off) & ((1 << width) - 1) for name, (off, width) in fields.items()}


@lru_cache(maxsize=4096)
def decode_plan(bits):
    """A plan instruction's fields as ``(op, fields)``: ``op`` a :class:`PlanOp` or
    ``None`` (reserved), ``fields`` {name: int} (``op`` raw)."""
    f = _extract(bits, _PLAN_FIELDS)
    return _PLAN_OPS.get(f["op"]), f


@lru_cache(maxsize=4096)
def decode_micro(bits):
    """A micro-instruction as ``(op, args)``: ``op`` a :class:`MicroOp` or ``None``
    (reserved), ``args`` {name: int} of that op's argument struct (enums raw)."""
    op = _MICRO_OPS.get((bits >> _MICRO_FIELDS["op"][0]) & ((1 << _MICRO_FIELDS["op"][1]) - 1))
    fields = _ARG_FIELDS.get(op)
    return op, (_extract(bits, fields) if fields else {})


def _int8(value):
    value &= 0xFF
    return value - 256 if value & 0x80 else value


# -- records ----------------------------------------------------------------------------

@dataclass
class FaultRecord:
    """What the tile recorded when it stopped (the FAULT, FAULT_PC, FAULT_ADDR CSRs)."""
    cause: FaultCause = FaultCause.NONE
    bank: int = 0
    in_kernel: int = 0
    slot: int = 0
    part: int = 0
    plan_pc: int = 0
    micro_pc: int = 0
    addr: int = 0


@dataclass
class _Transfer:
    """One DMA command, from the queue through the engine."""
    store: bool
    gmem: int
    gmem_stride: int
    spad: int
    spad_stride: int
    rows: int
    cols: int
    part: int
    token: int
    # Set when the engine takes it (cycle x): busy x+1..end; word i moves in cycle
    # x + lag + i (a store's word is registered between its read and its write).
    x: int = None
    end: int = None
    n_ok: int = 0
    moved: int = 0
    fault: tuple = None        # (cause, addr, part)

    @property
    def lag(self):
        return 3 if self.store else 2


# Control unit states (as hdl/control.py's _State).
(_IDLE, _PLAN_FETCH, _PLAN_EXEC, _MICRO_FETCH, _MICRO_EXEC, _FAULT, _PUBLISH, _PLAN_DECODE,
 _ROLLBACK) = range(9)

def _check_cycles(config, op):
    """Cycles compute micro-instruction ``op`` spends in the operand check: its stages,
    the last registering the answer (:func:`~fusetile.kernels.operands.check_latency`
    + 1)."""
    return check_latency(op, config) + 1


_VCFG_BITS = {
    VectorCfg.MULT_A: 32, VectorCfg.MULT_B: 32, VectorCfg.SHIFT: 5, VectorCfg.ZP_A: 8,
    VectorCfg.ZP_B: 8, VectorCfg.ZP_OUT: 8, VectorCfg.LO: 8, VectorCfg.HI: 8,
}
_VCFG_SIGNED = frozenset({VectorCfg.ZP_A, VectorCfg.ZP_B, VectorCfg.ZP_OUT, VectorCfg.LO,
                          VectorCfg.HI})

_STOPPING = frozenset({FaultCause.WATCHDOG, FaultCause.ABORTED})


class TileModel:
    """One fusetile: architectural state and a cycle-stepped executor.

    Host-side access (:meth:`write_gmem`, :meth:`write_plan`, :meth:`set_partition`,
    ...) changes state directly, in no time and without the tile's write protection;
    :class:`fusetile.host.model_transport.ModelTransport` adds the bus, its timing and
    its refusals. Commands (:meth:`start`, :meth:`request_swap`, :meth:`clear_fault`,
    :meth:`clear_counters`) take one cycle each, as CTRL pulses do; :meth:`abort` takes
    two, as the control unit takes its pulse the cycle after it.

        model = TileModel(TileConfig())
        model.set_partition(0, base=0, length=64)
        model.load_kernel(0, [dma_load(gmem=0, spad=0, cols=4), ret()], part=0)
        model.load_plan([call(0), done()])
        model.run()          # -> FaultRecord or None

    Parameters
    ----------
    config : TileConfig or None
        ``None``: the default configuration.

    Attributes
    ----------
    config : TileConfig
    now : int
        Cycles simulated since construction.
    gmem : numpy.ndarray
        GMEM bytes (uint8, ``gmem_bytes``).
    spad : numpy.ndarray
        Scratchpad bytes (uint8, ``spad_words * word_bytes``), by scratchpad word.
    plans : list of two lists of int
        The plan banks (64-bit instructions).
    kernels : list of lists of int
        The kernel slots (128-bit micro-instructions).
    part_base, part_len : list of int
        The partition table.
    slot_valid, slot_part, slot_version : list of int
        The slot table.
    acc : numpy.ndarray
        ACC, int32, ``rows`` x ``cols``.
    flags : list of int
        F0..F7.
    index : list of int
        X0..X3.
    vcfg : dict of VectorCfg to int
        Vector configuration registers (int8 ones as signed values).
    counters : dict of str to int
        :data:`COUNTER_NAMES`.
    slot_calls, slot_cycles, branch_taken, branch_not_taken : list of int
        Per-slot and per-flag counters.
    fault : FaultRecord
        The last fault (valid while :attr:`faulted`).
    trace : collections.deque of int
        Trace records (256-bit ints, :class:`TraceRecord` bits), oldest first (none
        on a tile without a trace FIFO).
    trace_dropped : int
    running, done, faulted, active_bank, exec_bank, swap_pending, in_kernel, slot,
    speculating : int
        Control state, as in STATUS.
    plan_pc, micro_pc, mark, miss_pc : int
        PCs, MARK's value (0 on a tile without it: ``TileConfig.debug_regs``, where
        MARK is a NOP) and MISS_PC's.
    watchdog_limit, freeze, irq_enable_done, irq_enable_fault : int
        Host-set control values (WATCHDOG, PERF_CTRL.freeze, IRQ_ENABLE).
    """

    def __init__(self, config=None):
        if config is None:
            config = TileConfig()
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        if config.rows > config.word_bytes or config.cols > config.word_bytes:
            raise ValueError(f"config.rows and config.cols must be at most config.word_bytes "
                             f"({config.word_bytes}), not {config.rows} x {config.cols}")
        self.config = c = config
        self.wb = c.word_bytes
        self.now = 0

        self.gmem = np.zeros(c.gmem_bytes, dtype=np.uint8)
        self.spad = np.zeros(c.spad_words * c.word_bytes, dtype=np.uint8)
        self.plans = [[0] * c.plan_depth for _ in range(2)]
        self.kernels = [[0] * c.slot_depth for _ in range(c.kernel_slots)]
        self.part_base = [0] * c.partitions
        # (A tile's only partition is the whole scratchpad.)
        self.part_len = [c.spad_words] if c.partitions == 1 else [0] * c.partitions
        self.slot_valid = [0] * c.kernel_slots
        self.slot_part = [0] * c.kernel_slots
        self.slot_version = [0] * c.kernel_slots
        self.watchdog_limit = 0
        self.freeze = 0
        self.irq_enable_done = 0
        self.irq_enable_fault = 1

        self.acc = np.zeros((c.rows, c.cols), dtype=np.int32)
        self.flags = [0] * FLAGS
        self.index = [0] * INDEX_REGS
        self.vcfg = {reg: 0 for reg in VectorCfg}
        self.vcfg[VectorCfg.LO] = arith.INT8_MIN
        self.vcfg[VectorCfg.HI] = arith.INT8_MAX

        # control unit
        self.state = _IDLE
        self.running = self.done = self.faulted = 0
        self.active_bank = self.exec_bank = 0
        self.swap_pending = 0
        self.in_kernel = 0
        self.slot = 0
        self.plan_pc = self.micro_pc = 0
        self.mark = 0
        self.watchdog = 0
        self.arg_a = self.arg_b = 0
        self.part = 0
        self._compute_left = 0       # cycles the compute unit stays busy
        self._compute_cmd = None     # the command register: (op, fields) or None
        self._busy_seen = 0          # the unit's busy, as the sequencer sees it (registered)
        self._abort_units = 0        # a fault or miss last cycle: the units are aborted
                                     # in this one (the control unit's register)
        self._abort_taken = 0        # the host's abort pulse of last cycle, taken in
                                     # this one (the control unit's register)
        self._pending_flag = None    # (flag, value) a VCMP (or a VARGMAX with test)
                                     # writes in its last busy cycle
        self._checked = 0            # cycles the compute instruction in MICRO_EXEC has
                                     # been checked (_check_cycles: done)
        self._compute_unit = None    # its busy counter: "mac_busy" or "vec_busy"
        self.speculating = 0
        self.guard_flag = self.guard_value = 0
        self.resume_pc = 0
        self.miss_pc = 0
        self.rolling_back = 0
        self.fault = FaultRecord()
        self._call = None            # statistics of the current kernel call

        # DMA queue (a SyncFIFOBuffered: inner storage + output register, or with a
        # depth of 1 the output register alone) and engine
        self._inner = deque()
        self._out = None
        self._engine = None          # the transfer the engine took last
        self._in_engine = 0
        self._engine_fault = None    # sticky (cause, addr, part)
        self._tokens = [0] * DMA_TOKENS

        # speculation staging buffer
        self.staging = []            # [(gmem word, bytes)]
        self._staging_overflow = 0
        self._draining = 0
        self._drain_head = 0
        self._drain_fetched = 0

        # trace FIFO
        self.trace = deque()
        self.trace_dropped = 0
        self._trace_word = 0

        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        self.slot_calls = [0] * c.kernel_slots
        self.slot_cycles = [0] * c.kernel_slots
        self.branch_taken = [0] * FLAGS
        self.branch_not_taken = [0] * FLAGS

    # -- host-side access (no bus, no time) -------------------------------------------
    def write_gmem(self, offset, data):
        """Write bytes at GMEM byte ``offset``."""
        data = np.frombuffer(bytes(data), dtype=np.uint8)
        if not 0 <= offset <= offset + len(data) <= len(self.gmem):
            raise ValueError(f"GMEM bytes {offset:#x}..{offset + len(data):#x} are outside "
                             f"GMEM ({len(self.gmem):#x} bytes)")
        self.gmem[offset:offset + len(data)] = data

    def read_gmem(self, offset, length):
        """``length`` bytes from GMEM byte ``offset``."""
        if not 0 <= offset <= offset + length <= len(self.gmem):
            raise ValueError(f"GMEM bytes {offset:#x}..{offset + length:#x} are outside "
                             f"GMEM ({len(self.gmem):#x} bytes)")
        return self.gmem[offset:offset + length].tobytes()

    def write_spad(self, word, data):
        """Write bytes at absolute scratchpad word ``word`` (host-side only: the real tile
        has no host path into the scratchpad)."""
        data = np.frombuffer(bytes(data), dtype=np.uint8)
        start = word * self.wb
        self.spad[start:start + len(data)] = data

    def read_spad(self, word, count=1):
        """``count`` words from absolute scratchpad word ``word``, as bytes."""
        return self.spad[word * self.wb:(word + count) * self.wb].tobytes()

    def write_plan(self, bank, instrs, *, start=0):
        for i, instr in enumerate(instrs):
            self.plans[bank][start + i] = _as_int(instr)

    def write_kernel(self, slot, instrs, *, start=0):
        for i, instr in enumerate(instrs):
            self.kernels[slot][start + i] = _as_int(instr)

    def set_partition(self, index, *, base, length):
        words = self.config.spad_words
        if self.config.partitions == 1 and (base, length) != (0, words):
            raise ValueError(f"this tile has one partition, the whole scratchpad (base 0, "
                             f"length {words}), not base {base}, length {length}")
        self.part_base[index] = base
        self.part_len[index] = length

    def set_slot(self, slot, *, valid, part, version=0):
        if version and not self.config.slot_versions:
            raise ValueError(f"this tile keeps no kernel version tags "
                             f"(TileConfig.slot_versions): version must be 0, not {version!r}")
        self.slot_valid[slot], self.slot_part[slot], self.slot_version[slot] = \
            int(valid), part, version

    def load_kernel(self, slot, instrs, *, part, version=0):
        """Write a kernel into ``slot`` and bind it (valid) to partition ``part``."""
        self.write_kernel(slot, instrs)
        self.set_slot(slot, valid=1, part=part, version=version)

    def load_plan(self, instrs):
        """Write ``instrs`` into the inactive bank and swap (one cycle, on an idle tile
        the swap is immediate). Returns the bank."""
        bank = 1 - self.active_bank
        self.write_plan(bank, instrs)
        self.request_swap()
        return bank

    # -- commands (one cycle each, like CTRL pulses; abort two) -------------------------
    def start(self):
        self.step(1, start=1)

    def request_swap(self):
        self.step(1, swap=1)

    def clear_fault(self):
        self.step(1, clear_fault=1)

    def abort(self):
        """The pulse, and the cycle after it, in which the control unit takes it."""
        self.step(2, abort=1)

    def clear_counters(self):
        self.step(1, perf_clear=1)

    def run(self, max_cycles=1_000_000):
        """Start the active bank and run until DONE or a fault.

        Returns the :class:`FaultRecord` if the tile faulted, else ``None``.

        Raises
        ------
        TimeoutError
            If the plan is still running after ``max_cycles``.
        """
        self.start()
        self.run_until_idle(max_cycles)
        return self.fault if self.faulted else None

    def run_until_idle(self, max_cycles=1_000_000):
        """Step until the plan stops running (DONE or fault)."""
        limit = self.now + max_cycles
        while self.running:
            if self.now >= limit:
                raise TimeoutError(f"plan still running after {max_cycles} cycles "
                                   f"(plan pc {self.plan_pc})")
            self.step(min(4096, limit - self.now))

    @property
    def irq(self):
        return int(bool((self.irq_enable_done and self.done) or
                        (self.irq_enable_fault and self.faulted)))

    @property
    def dma_busy(self):
        """A DMA command is queued or in the engine (STATUS.dma_busy)."""
        return int(any(self._tokens))

    def trace_records(self):
        """The trace FIFO's records as ``TraceRecord`` views (not popped)."""
        return [TraceRecord.from_bits(r) for r in self.trace]

    def trace_read_word(self):
        """The TRACE_DATA word a read returns now (0 when empty)."""
        if not self.trace:
            return 0
        return (self.trace[0] >> (32 * self._trace_word)) & _MASK32

    # -- time ----------------------------------------------------------------------------
    def step(self, n=1, **pulses):
        """Advance ``n`` cycles; ``pulses`` (start, swap, clear_fault, abort,
        perf_clear, trace_read, refused) are high in the first of them."""
        if n <= 0:
            return
        self._cycle(pulses)
        n -= 1
        while n > 0:
            k = self._skippable(n)
            if k:
                self._skip(k)
                n -= k
            else:
                self._cycle(None)
                n -= 1

    # -- the DMA queue and engine ---------------------------------------------------------
    def _queue_w_rdy(self):
        if self.config.dma_queue == 0:
            # No queue: the engine takes the command if it is idle and not faulted.
            return not self._engine_busy(self.now) and self._engine_fault is None
        if self.config.dma_queue == 1:
            return self._out is None        # a single register, free once taken
        return len(self._inner) != self.config.dma_queue - 1

    def _engine_busy(self, c):
        """Whether the engine is busy in cycle ``c`` (a transfer's words, from the
        cycle after the engine took it)."""
        t = self._engine
        return t is not None and t.x + 1 <= c <= t.end and not (t.rows == 0 or t.cols == 0)

    def _schedule(self, t, x):
        """The engine takes transfer ``t`` in cycle ``x``: find where it faults."""
        cfg = self.config
        t.x = x
        if t.rows == 0 or t.cols == 0:
            t.end = x
            return
        part = t.part
        limit = self._limit(part)
        cols = np.arange(t.cols, dtype=np.int64)
        n_ok = 0
        for r in range(t.rows):
            g = t.gmem + r * t.gmem_stride + cols
            s = t.spad + r * t.spad_stride + cols
            gbad = g >= cfg.gmem_words
            sbad = (s >= 1 << 16) | (s >= limit)
            bad = gbad | sbad
            if bad.any():
                f = int(np.argmax(bad))
                if gbad[f]:
                    t.fault = (FaultCause.GMEM_RANGE, int(g[f]) & _MASK32, part)
                else:
                    t.fault = (FaultCause.PARTITION, int(s[f]) & _MASK32, part)
                n_ok += f
                break
            n_ok += t.cols
        t.n_ok = n_ok
        if t.store:
            t.end = x + n_ok + 2            # a fault waits for the words before it
        elif t.fault is not None and t.fault[0] == FaultCause.PARTITION:
            t.end = x + n_ok + 2            # detected in the load's write stage
        else:
            t.end = x + n_ok + 1

    def _move_words(self, t, upto, speculating):
        """Move the words of transfer ``t`` scheduled before cycle ``upto``, stores to
        the staging buffer while ``speculating``. Returns (words moved, cycle of a
        staging overflow or None)."""
        last = min(t.n_ok, upto - (t.x + t.lag))
        if last <= t.moved:
            return 0, None
        wb = self.wb
        cfg = self.config
        base = self.part_base[t.part]
        start = t.moved
        overflow_at = None
        for i in range(start, last):
            r, col = divmod(i, t.cols)
            g = (t.gmem + r * t.gmem_stride + col) * wb
            s = (base + t.spad + r * t.spad_stride + col) * wb
            if t.store:
                if speculating:
                    # A word that does not fit is dropped (the miss the overflow
                    # causes comes the next cycle, the engine's abort the one after).
                    if len(self.staging) < cfg.staging_words:
                        self.staging.append((g // wb, self.spad[s:s + wb].copy()))
                    elif overflow_at is None:
                        overflow_at = t.x + t.lag + i
                else:
                    self.gmem[g:g + wb] = self.spad[s:s + wb]
            else:
                self.spad[s:s + wb] = self.gmem[g:g + wb]
        t.moved = last
        return last - start, overflow_at

    def _dma_words(self, upto, speculating):
        """Move the engine's words up to cycle ``upto``; account bytes."""
        t = self._engine
        if t is None or t.moved >= t.n_ok:
            return 0
        n, overflow_at = self._move_words(t, upto, speculating)
        if overflow_at is not None:
            self._staging_overflow = 1
        if n:
            key = "dma_bytes_out" if t.store else "dma_bytes_in"
            if not self.freeze:
                self.counters[key] += n * self.wb
            if self._call is not None:
                self._call["out" if t.store else "in"] += n
        return n

    def _dma_cycle(self, c, push, flush, speculating):
        """The queue and the engine in cycle ``c``, after the control unit decided;
        ``flush``: the control unit aborts them (and empties the staging buffer),
        ``speculating``: at the start of the cycle."""
        if flush:
            self._discard_staging()
            t = self._engine
            if t is not None:
                # No access is made in the cycle of the abort (earlier words moved in
                # their own cycles).
                t.n_ok = t.moved
            self._inner.clear()
            self._out = None
            self._engine = None
            self._in_engine = 0
            self._engine_fault = None
            self._tokens = [0] * DMA_TOKENS
            return
        self._dma_words(c + 1, speculating)
        t = self._engine
        busy = self._engine_busy(c)
        ready = not busy and self._engine_fault is None
        if push is not None and self.config.dma_queue == 0:
            self._out = push                # no queue: the engine takes it now
        issued = self._out is not None and ready
        completed = self._in_engine and not busy
        inner_read = bool(self._inner) and (self._out is None or issued)
        if completed:
            self._tokens[t.token] -= 1
        if issued:
            new = self._out
            self._schedule(new, c)
            self._engine = new
            self._in_engine = 1
        elif completed:
            self._in_engine = 0
        if inner_read:
            self._out = self._inner.popleft()
        elif issued:
            self._out = None
        if push is not None:
            if self.config.dma_queue == 1:
                self._out = push            # the register, as it was empty
            elif self.config.dma_queue > 1:
                self._inner.append(push)
            self._tokens[push.token] += 1
        # A transfer that faulted raises the engine's sticky fault after its last
        # busy cycle.
        t = self._engine
        if t is not None and t.fault is not None and c == t.end:
            self._engine_fault = t.fault

    # -- one cycle -------------------------------------------------------------------------
    def _cycle(self, pulses):
        p = pulses or {}
        c = self.now
        cfg = self.config
        ctr = self.counters
        count = not self.freeze

        # Inputs, as they are at the start of the cycle.
        t = self._engine
        dma_busy = t is not None and t.x + 1 <= c <= t.end and not (t.rows == 0 or t.cols == 0)
        dma_fault = self._engine_fault
        outstanding = 0
        for i, n in enumerate(self._tokens):
            if n:
                outstanding |= 1 << i
        running, in_kernel, speculating = self.running, self.in_kernel, self.speculating
        state = self.state
        slot = self.slot
        exec_bank = self.exec_bank
        rolling_back = self.rolling_back
        trace_nonempty = bool(self.trace)
        compute_busy = self._compute_left > 0
        unit_busy = self._compute_unit if compute_busy else None
        compute_pending = self._compute_cmd is not None or self._busy_seen
        abort_units = self._abort_units
        abort_taken, self._abort_taken = self._abort_taken, int(bool(p.get("abort")))

        ev = _Events()
        tr = {}                 # the sequencer's state changes, unless a fault/miss wins
        seq_fault = None
        seq_miss = False
        push = None
        publish = False
        ret_trace = False
        take_swap = False
        flag_write = None
        compute_issue = None

        def fetch(target):
            # RET and PUBLISH go on to the next PC whatever it is, and a fetch past the
            # bank faults (as a rollback's does).
            tr["plan_pc"] = target
            tr["state"] = _PLAN_FETCH
            ev.plan_retired = 1

        def goto(target):
            # The other plan instructions test their targets when they execute.
            nonlocal seq_fault
            if target >= cfg.plan_depth:
                seq_fault = (FaultCause.PLAN_RANGE, target, 0)
            else:
                fetch(target)

        def micro_next():
            tr["micro_pc"] = self.micro_pc + 1
            tr["state"] = _MICRO_FETCH
            ev.micro_retired = 1

        if state == _IDLE:
            if self.swap_pending or p.get("swap"):
                take_swap = True
            if p.get("start"):
                tr.update(running=1, done=0, plan_pc=0, exec_bank=self.active_bank,
                          watchdog=0, state=_PLAN_FETCH)

        elif state == _PLAN_FETCH:
            if self.plan_pc >= cfg.plan_depth:
                seq_fault = (FaultCause.PLAN_RANGE, self.plan_pc, 0)
            else:
                tr["state"] = _PLAN_DECODE

        elif state == _PLAN_DECODE:
            tr["state"] = _PLAN_EXEC

        elif state == _ROLLBACK:        # a miss's fallback is read from the other bank
            tr["state"] = _PLAN_FETCH

        elif state == _PLAN_EXEC:
            bits = self.plans[self.exec_bank][self.plan_pc]
            op, f = decode_plan(bits)
            cond, sel, a, b = f["cond"], f["sel"], f["a"], f["b"]
            pc = self.plan_pc
            illegal = False
            if cond >> 1 or (cond and op not in (PlanOp.BRANCH, PlanOp.ASSUME)):
                illegal = True
            elif op == PlanOp.NOP:
                goto(pc + 1)
            elif op == PlanOp.MARK:
                if self.config.debug_regs:
                    self.mark = a
                goto(pc + 1)
            elif op == PlanOp.JUMP:
                goto(a)
            elif op == PlanOp.BRANCH:
                if sel >= FLAGS:
                    illegal = True
                else:
                    taken = self.flags[sel] == (cond & 1)
                    ev.branch = (sel, taken)
                    goto(a if taken else pc + 1)
            elif op == PlanOp.SWITCH:
                if sel >= INDEX_REGS:
                    illegal = True
                elif self.index[sel] >= b:
                    seq_fault = (FaultCause.SWITCH_RANGE, self.index[sel], 0)
                else:
                    goto(a + self.index[sel])
            elif op == PlanOp.ASSUME:
                if sel >= FLAGS or speculating or not cfg.speculates:
                    illegal = True
                else:
                    tr.update(speculating=1, guard_flag=sel, guard_value=cond & 1,
                              resume_pc=a, miss_pc=pc)
                    goto(pc + 1)
            elif op == PlanOp.COMMIT:
                if not speculating:
                    illegal = True
                elif self.flags[self.guard_flag] != self.guard_value:
                    seq_miss = True
                else:
                    publish = True
                    ev.spec_hit = 1
                    tr.update(speculating=0, state=_PUBLISH)
            elif op == PlanOp.DONE:
                if speculating:
                    illegal = True
                else:
                    tr.update(running=0, done=1, state=_IDLE)
                    ev.plan_retired = 1
                    ev.inference = 1
                    if self.swap_pending or p.get("swap"):
                        take_swap = True
            elif op == PlanOp.CALL:
                if sel >= cfg.kernel_slots or not self.slot_valid[sel]:
                    seq_fault = (FaultCause.SLOT_INVALID, sel, 0)
                else:
                    tr.update(slot=sel, part=self.slot_part[sel], arg_a=a, arg_b=b,
                              in_kernel=1, micro_pc=0, state=_MICRO_FETCH,
                              _call={"pc": pc, "start": ctr["cycles"] & _MASK32, "cycles": 0,
                                     "dma_busy": 0, "mac_busy": 0, "vec_busy": 0,
                                     "in": 0, "out": 0})
            else:
                illegal = True
            if illegal:
                seq_fault = (FaultCause.ILLEGAL_PLAN, bits & _MASK32, 0)

        elif state == _PUBLISH:
            if not self._draining:
                fetch(self.plan_pc + 1)

        elif state == _MICRO_FETCH:
            if self.micro_pc >= cfg.slot_depth:
                seq_fault = (FaultCause.SLOT_RANGE, self.micro_pc, 0)
            else:
                tr["state"] = _MICRO_EXEC

        elif state == _MICRO_EXEC:
            bits = self.kernels[slot][self.micro_pc]
            op, f = decode_micro(bits)
            if op == MicroOp.NOP:
                micro_next()
            elif op in (MicroOp.DMA_LOAD, MicroOp.DMA_STORE):
                base = f["gmem_base"]
                if base == GmemBase.ARG0.value:
                    base = self.arg_a
                elif base == GmemBase.ARG1.value:
                    base = self.arg_b
                elif base == GmemBase.ABS.value:
                    base = 0
                else:
                    seq_fault = (FaultCause.ILLEGAL_MICRO, bits & _MASK32, 0)
                if seq_fault is None:
                    if self._queue_w_rdy():
                        push = _Transfer(
                            store=op == MicroOp.DMA_STORE,
                            gmem=(base + f["gmem_addr"]) & 0xFF_FFFF,
                            gmem_stride=f["gmem_stride"], spad=f["spad_addr"],
                            spad_stride=f["spad_stride"], rows=f["rows"], cols=f["cols"],
                            part=self.part, token=f["token"])
                        micro_next()
                    else:
                        ev.stall_dma = 1
            elif op == MicroOp.WAIT:
                on_compute = f.get("compute", 0)
                mask = f["tokens"] or (0 if on_compute else (1 << DMA_TOKENS) - 1)
                if on_compute and compute_pending:
                    ev.stall_compute = 1
                elif outstanding & mask:
                    ev.stall_dma = 1
                else:
                    micro_next()
            elif op == MicroOp.RET:
                if compute_pending:
                    ev.stall_compute = 1
                elif outstanding:
                    ev.stall_dma = 1
                else:
                    tr["in_kernel"] = 0
                    ev.micro_retired = 1
                    ev.call_done = 1
                    ret_trace = True
                    fetch(self.plan_pc + 1)
            elif op in COMPUTE_OPS:
                if self._checked < _check_cycles(self.config, op):
                    # Its first cycles check the operands (the RTL's stages).
                    tr["_checked"] = self._checked + 1
                elif compute_pending:
                    ev.stall_compute = 1
                else:
                    seq_fault = self._check(op, f, bits)
                    if seq_fault is None:
                        compute_issue = (op, f)
                        micro_next()
            else:
                seq_fault = (FaultCause.ILLEGAL_MICRO, bits & _MASK32, 0)

        elif state == _FAULT:
            if p.get("clear_fault"):
                tr.update(faulted=0, state=_IDLE)

        # Faults from the DMA engine, the watchdog and the host win, in that order.
        fault = seq_fault
        if running and dma_fault is not None and not abort_units:
            fault = dma_fault
        if running and self.watchdog_limit and self.watchdog >= self.watchdog_limit:
            fault = (FaultCause.WATCHDOG, self.watchdog, 0)
        if running and abort_taken:
            fault = (FaultCause.ABORTED, 0, 0)

        # As in the RTL, a VCMP's flag (and a testing VARGMAX's) lands in the compute
        # unit's last busy cycle, not when the sequencer issues it (a miss it causes
        # comes at the same time), unless the unit is being aborted in that cycle.
        if self._pending_flag is not None and self._compute_left == 1 and not abort_units:
            flag_write, self._pending_flag = self._pending_flag, None
            self.flags[flag_write[0]] = flag_write[1]

        miss = seq_miss
        spec_fault = False
        if speculating:
            if flag_write is not None and flag_write[0] == self.guard_flag and \
                    flag_write[1] != self.guard_value:
                miss = True
            if self._staging_overflow:
                miss = True
            if fault is not None:
                miss = True
                spec_fault = True
        stop = fault is not None and not (speculating and fault[0] not in _STOPPING)

        trace_fault = False
        if stop:
            cause, addr, fpart = fault
            self.fault = FaultRecord(cause=FaultCause(cause), bank=exec_bank,
                                     in_kernel=in_kernel, slot=slot, part=fpart,
                                     plan_pc=self.plan_pc & 0xFFFF,
                                     micro_pc=self.micro_pc & 0xFFFF, addr=addr & _MASK32)
            self.running = 0
            self.faulted = 1
            self.in_kernel = 0
            self.speculating = 0
            self.rolling_back = 0
            self.state = _FAULT
            ev = ev.suppressed()
            ev.fault = 1
            trace_fault = in_kernel
        elif miss:
            self.rolling_back = 1
            self.speculating = 0
            self.in_kernel = 0
            self.exec_bank ^= 1
            self.plan_pc = self.resume_pc & 0xFFFF
            self.state = _ROLLBACK
            ev = ev.suppressed()
            ev.spec_miss = 1
            ev.spec_fault = int(spec_fault)
            ev.rollback = 1
            trace_fault = in_kernel
        else:
            if state == _PLAN_EXEC:
                self.rolling_back = 0
            call = tr.pop("_call", None)
            if call is not None:
                self._call = call
            for name, value in tr.items():
                setattr(self, name, value)
            if publish:
                self._publish()
        if state != _MICRO_EXEC:
            self._checked = 0

        if take_swap:
            self.active_bank ^= 1
            self.swap_pending = 0
            ev.swap = 1
        elif p.get("swap"):
            self.swap_pending = 1

        # The call's statistics and its trace record.
        call = self._call
        if in_kernel and call is not None:
            if ret_trace and not (stop or miss):
                self._push_trace(call, slot, exec_bank, faulted=0)
            elif trace_fault:
                self._push_trace(call, slot, exec_bank, faulted=1)
            call["cycles"] += 1
            call["dma_busy"] += dma_busy
            if unit_busy is not None:
                call[unit_busy] += 1
        if running:
            self.watchdog += 1

        # A fault or a miss aborts the units the cycle after it (the control unit's
        # `abort_units` register); the sequencer issues nothing in its own cycle.
        if stop or miss:
            push = compute_issue = None
        self._abort_units = int(stop or miss)

        # The compute unit: aborted with the kernel. It takes the command register's
        # command in a cycle it is idle (all of the command's effects then); an
        # instruction issued this cycle is in the register next.
        if abort_units:
            # The unit takes a command in the abort's cycle too (it is idle then), and
            # drops it; only a VCFG's register is written by then.
            if self._compute_cmd is not None and self._compute_cmd[0] == MicroOp.VCFG:
                self._execute(*self._compute_cmd)
            self._compute_left = 0
            self._pending_flag = None
            self._compute_cmd = None
            self._busy_seen = 0
        else:
            taken = self._compute_cmd is not None and not compute_busy
            self._busy_seen = int(compute_busy or taken)
            if self._compute_left:
                self._compute_left -= 1
            if taken:
                extra, unit, flag = self._execute(*self._compute_cmd)
                self._compute_cmd = None
                if flag is not None:
                    self._pending_flag = flag
                if extra:
                    self._compute_left, self._compute_unit = extra, unit
            if compute_issue is not None:
                self._compute_cmd = compute_issue

        # The staging buffer drains one word per two cycles after a COMMIT hit (and
        # one cycle more).
        if self._draining and not publish:
            self._drain_step()

        # Counters (the trace read strobe and refusals arrive with the pulses).
        if count:
            ctr["cycles"] += 1
            ctr["active_cycles"] += running
            ctr["dma_busy"] += dma_busy
            if unit_busy is not None:
                ctr[unit_busy] += 1
            ctr["stall_dma"] += ev.stall_dma
            ctr["stall_compute"] += ev.stall_compute
            ctr["plan_retired"] += ev.plan_retired
            ctr["micro_retired"] += ev.micro_retired
            ctr["kernel_calls"] += ev.call_done
            ctr["inferences"] += ev.inference
            ctr["swaps"] += ev.swap
            ctr["faults"] += ev.fault
            ctr["refused_writes"] += bool(p.get("refused"))
            ctr["spec_hits"] += ev.spec_hit
            ctr["spec_misses"] += ev.spec_miss
            ctr["spec_faults"] += ev.spec_fault
            ctr["rollback_cycles"] += bool(ev.rollback or rolling_back)
            if in_kernel:
                self.slot_cycles[slot] += 1
                self.slot_calls[slot] += ev.call_done
            if ev.branch is not None:
                flag, taken = ev.branch
                if taken:
                    self.branch_taken[flag] += 1
                else:
                    self.branch_not_taken[flag] += 1

        if p.get("trace_read") and trace_nonempty:
            if self._trace_word == 7:
                self._trace_word = 0
                self.trace.popleft()
            else:
                self._trace_word += 1

        self._dma_cycle(c, push, abort_units, speculating)
        if p.get("perf_clear"):
            self._clear_counters()
        self.now = c + 1

    def _clear_counters(self):
        for name in self.counters:
            self.counters[name] = 0
        for lst in (self.slot_calls, self.slot_cycles, self.branch_taken,
                    self.branch_not_taken):
            lst[:] = [0] * len(lst)

    def _push_trace(self, call, slot, bank, *, faulted):
        if not self.config.traced:
            return
        if len(self.trace) >= self.config.trace_depth:
            self.trace_dropped = min(self.trace_dropped + 1, 0xFFFF)
            return
        record = TraceRecord.const({
            "slot": slot, "bank": bank, "faulted": faulted, "pc": call["pc"] & 0xFFFF,
            "start": call["start"], "cycles": (call["cycles"] + 1) & _MASK32,
            "dma_busy": call["dma_busy"] & _MASK32, "mac_busy": call["mac_busy"] & _MASK32,
            "vec_busy": call["vec_busy"] & _MASK32,
            "bytes_in": (call["in"] * self.wb) & _MASK32,
            "bytes_out": (call["out"] * self.wb) & _MASK32,
        }).as_bits()
        self.trace.append(record)

    # -- speculation staging -------------------------------------------------------------
    def _discard_staging(self):
        self.staging = []
        self._staging_overflow = 0
        self._draining = 0
        self._drain_head = 0
        self._drain_fetched = 0

    def _publish(self):
        if self.staging and not self._draining:
            self._draining = 1
            self._drain_head = 0
            self._drain_fetched = 0

    def _drain_step(self):
        # 0: the first entry is read; 1: an entry is registered; 2: it is written (and
        # the next one read): 2 n + 1 cycles for n words.
        if self._drain_fetched < 2:
            self._drain_fetched += 1
            return
        word, data = self.staging[self._drain_head]
        self.gmem[word * self.wb:(word + 1) * self.wb] = data
        self._drain_fetched = 1
        self._drain_head += 1
        if self._drain_head == len(self.staging):
            self._discard_staging()

    # -- fast-forward ------------------------------------------------------------------------
    def _skippable(self, n):
        """How many of the next ``n`` cycles change nothing but counts, countdowns and
        DMA words (0: step one cycle)."""
        if n < 2 or self._inner or self._draining or self._staging_overflow or \
                self._engine_fault is not None or self._abort_units or self._abort_taken:
            return 0
        c = self.now
        if self.state in (_IDLE, _FAULT):
            if self.swap_pending or self._compute_left or self._busy_seen or \
                    self._compute_cmd is not None or self._engine is not None and \
                    (self._in_engine or self._out is not None):
                return 0
            return n
        if self.state != _MICRO_EXEC:
            return 0
        limit = n
        if self.running and self.watchdog_limit:
            limit = min(limit, self.watchdog_limit - self.watchdog)
        t = self._engine
        if self._in_engine:
            if not self._engine_busy(c):
                return 0
            limit = min(limit, t.end - c)       # stop before the cycle after its end
            if t.store and self.speculating:
                room = self.config.staging_words - len(self.staging)
                first_full = t.x + t.lag + t.moved + room
                limit = min(limit, first_full - c)
        elif self._out is not None:
            return 0
        if self._compute_left:
            # The stall may change its cause, or end, when the unit goes idle (and takes
            # a command from the register); a pending flag lands in its last busy cycle.
            limit = min(limit, self._compute_left - (self._pending_flag is not None))
        elif self._busy_seen or self._compute_cmd is not None:
            return 0
        if self._stall_cause() is None:
            return 0
        return max(0, limit)

    def _stall_cause(self):
        """The counter the sequencer's current stall counts in, or ``None`` if the
        micro-instruction in MICRO_EXEC would not stall this cycle."""
        op, f = decode_micro(self.kernels[self.slot][self.micro_pc])
        pending = self._compute_cmd is not None or self._busy_seen
        outstanding = any(self._tokens)
        if op == MicroOp.RET:
            return "stall_compute" if pending else "stall_dma" if outstanding else None
        if op == MicroOp.WAIT:
            if f["compute"] and pending:
                return "stall_compute"
            mask = f["tokens"] or (0 if f["compute"] else 0xF)
            return "stall_dma" if any(self._tokens[i] for i in range(DMA_TOKENS)
                                      if mask >> i & 1) else None
        if op in (MicroOp.DMA_LOAD, MicroOp.DMA_STORE):
            return "stall_dma" if not self._queue_w_rdy() and f["gmem_base"] != 3 else None
        if op in COMPUTE_OPS:
            checked = self._checked == _check_cycles(self.config, op)
            return "stall_compute" if pending and checked else None
        return None

    def _skip(self, k):
        """Advance ``k`` cycles of a wait found by :meth:`_skippable`."""
        c = self.now
        end = c + k
        t = self._engine
        busy = 0
        if t is not None and not (t.rows == 0 or t.cols == 0):
            busy = max(0, min(end - 1, t.end) - max(c, t.x + 1) + 1)
        self._dma_words(end, self.speculating)
        count = not self.freeze
        unit = self._compute_unit if self._compute_left else None
        stall = self._stall_cause() if self.state == _MICRO_EXEC else None
        if self._compute_left:
            self._compute_left -= k
            self._busy_seen = 1
            if count:
                self.counters[unit] += k
        if self.state == _MICRO_EXEC:
            if count:
                self.counters[stall] += k
            if self.in_kernel and self._call is not None:
                call = self._call
                call["cycles"] += k
                call["dma_busy"] += busy
                if unit is not None:
                    call[unit] += k
            if count and self.in_kernel:
                self.slot_cycles[self.slot] += k
        if count:
            self.counters["cycles"] += k
            self.counters["active_cycles"] += k * self.running
            self.counters["dma_busy"] += busy
            self.counters["rollback_cycles"] += k * self.rolling_back
        if self.running:
            self.watchdog += k
        self.now = end

    # -- compute micro-instructions ------------------------------------------------------
    def _limit(self, part):
        """The number of offsets inside partition ``part`` (as the scratchpad's
        ``limit``: 0 for a partition that does not exist or does not start at a
        multiple of ``spad_banks``)."""
        cfg = self.config
        if part >= cfg.partitions:
            return 0
        base, length = self.part_base[part], self.part_len[part]
        if base % cfg.spad_banks:
            return 0
        return max(0, min(length, cfg.spad_words - base))

    def _words(self, offsets):
        """Absolute scratchpad words of (checked) partition offsets."""
        return self.part_base[self.part] + np.asarray(offsets, dtype=np.int64)

    def _read_lanes(self, words):
        """int8 lanes of absolute scratchpad words: shape words.shape + (word_bytes,)."""
        wb = self.wb
        words = np.asarray(words, dtype=np.int64)
        idx = words[..., None] * wb + np.arange(wb)
        return self.spad[idx].view(np.int8)

    def _write_lanes(self, words, lanes):
        wb = self.wb
        for w, row in zip(np.asarray(words, dtype=np.int64).ravel(),
                          np.asarray(lanes, dtype=np.int8).reshape(-1, wb)):
            self.spad[w * wb:(w + 1) * wb] = row.view(np.uint8)

    def _vregs(self):
        v = self.vcfg
        return dict(mult_a=v[VectorCfg.MULT_A], mult_b=v[VectorCfg.MULT_B],
                    shift=v[VectorCfg.SHIFT], zp_a=v[VectorCfg.ZP_A], zp_b=v[VectorCfg.ZP_B],
                    zp_out=v[VectorCfg.ZP_OUT], lo=v[VectorCfg.LO], hi=v[VectorCfg.HI])

    def _saturated(self, sat):
        if not self.freeze:
            self.counters["saturations"] += int(np.count_nonzero(sat))

    def _check(self, op, f, bits):
        """The operand check of a compute micro-instruction: ``None``, or the fault
        (cause, address, partition) if an operand is illegal or does not fit in the
        calling slot's partition."""
        if illegal_operands(op, f, self.config):
            return FaultCause.ILLEGAL_MICRO, bits & _MASK32, 0
        limit = self._limit(self.part)
        for end in operand_ends(op, f, self.config):
            if end >= limit:
                return FaultCause.PARTITION, end & _MASK32, self.part
        return None

    def _execute(self, op, f):
        """Execute a compute micro-instruction that passed its check (:meth:`_check`).
        Returns (extra cycles, unit counter name or None, flag write (flag, value) or
        None)."""
        cfg = self.config
        R, C, wb = cfg.rows, cfg.cols, self.wb
        P = cfg.vector_passes
        vector_end = cfg.vector_latency + 1     # from the last word read to the unit idle
        unscaled_end = cfg.unscaled_latency + 1    # the same, for an unscaled result

        if op == MicroOp.MATMUL:
            k = f["k"]
            if k == 0:
                return 0, None, None
            t = np.arange(k, dtype=np.int64)
            a = self._read_lanes(self._words(f["a_addr"] + t * f["a_stride"]))[:, :R]
            b = self._read_lanes(self._words(f["b_addr"] + t * f["b_stride"]))[:, :C]
            total = np.einsum("ti,tj->ij", a.astype(np.int64), b.astype(np.int64))
            if f["accumulate"]:
                total = total + self.acc.astype(np.int64)
            self.acc = ((total + 2**31) % 2**32 - 2**31).astype(np.int32)
            if not self.freeze:
                self.counters["macs"] += k * R * C
            return k + MAC_LATENCY + 1, "mac_busy", None

        if op == MicroOp.ACC_BIAS:
            n = -(-4 * R // wb)
            raw = self._read_lanes(self._words(f["addr"] + np.arange(n))).view(np.uint8).tobytes()
            bias = np.frombuffer(raw[:4 * R], dtype="<i4").astype(np.int32)
            self.acc = np.repeat(bias[:, None], C, axis=1).astype(np.int32)
            return n + 2, "mac_busy", None

        if op == MicroOp.REQUANT:
            v = self._vregs()
            extra = (R - 1) * P + cfg.requant_latency + 1  # the last row's result, then idle
            if f["per_channel"]:
                n = -(-8 * R // wb)
                table = self._read_lanes(self._words(f["param_addr"] + np.arange(n)))
                raw = np.frombuffer(table.view(np.uint8).tobytes()[:8 * R],
                                    dtype=np.uint8).reshape(R, 8)
                mult = raw[:, :4].copy().view("<u4").astype(np.int64).reshape(R, 1)
                shift = (raw[:, 4].astype(np.int64) & 31).reshape(R, 1)
                extra += n + 1     # the table's words, then the rows
            else:
                mult, shift = v["mult_a"], v["shift"]
            out, sat = arith.requantize(self.acc, mult, shift, v["zp_out"], v["lo"], v["hi"])
            lanes = np.zeros((R, wb), dtype=np.int8)
            lanes[:, :C] = out
            rows = f["out_addr"] + np.arange(R, dtype=np.int64) * f["out_stride"]
            self._write_lanes(self._words(rows), lanes)
            self._saturated(sat)
            return extra, "vec_busy", None

        if op == MicroOp.VADD:
            n = f["n"]
            if n == 0:
                return 0, None, None
            w = np.arange(n, dtype=np.int64)
            out, sat = arith.vadd(self._read_lanes(self._words(f["a_addr"] + w)),
                                  self._read_lanes(self._words(f["b_addr"] + w)),
                                  **self._vregs())
            self._write_lanes(self._words(f["out_addr"] + w), out)
            self._saturated(sat)
            return (n - 1) * P + vector_end + 1, "vec_busy", None

        if op == MicroOp.VPOOL:
            window, n = f["window"], f["n"]
            if n == 0:
                return 0, None, None
            o = np.arange(n, dtype=np.int64)[:, None]
            ins = f["in_addr"] + o * f["in_step"] + np.arange(window, dtype=np.int64) * \
                f["in_stride"]
            lanes = self._read_lanes(self._words(ins))
            v = self._vregs()
            outs = np.zeros((n, wb), dtype=np.int8)
            sats = np.zeros((n, wb), dtype=bool)
            for i in range(n):
                outs[i], sats[i] = arith.vpool(
                    lanes[i], average=bool(f["average"]), pairs=bool(f["pairs"]),
                    mult=v["mult_a"], shift=v["shift"], zp_in=v["zp_a"],
                    zp_out=v["zp_out"], lo=v["lo"], hi=v["hi"])
            self._write_lanes(self._words(f["out_addr"] + o[:, 0]), outs)
            self._saturated(sats)
            if f["average"]:
                return (n - 1) * max(window, P) + window + vector_end, "vec_busy", None
            return n * window + unscaled_end, "vec_busy", None

        if op == MicroOp.VCLAMP:
            n = f["n"]
            if n == 0:
                return 0, None, None
            w = np.arange(n, dtype=np.int64)
            out = arith.vclamp(self._read_lanes(self._words(f["in_addr"] + w)),
                               _int8(f["lo"]), _int8(f["hi"]))
            self._write_lanes(self._words(f["out_addr"] + w), out)
            return n + unscaled_end, "vec_busy", None

        if op == MicroOp.VCMP:
            lane = f["lane"]
            first = 0 if f["reduce"] else lane // wb
            nwords = lane // wb - first + 1
            lanes = self._read_lanes(self._words(f["addr"] + first + np.arange(nwords)))
            lanes = lanes.reshape(-1)
            if f["reduce"]:
                value = int(lanes[:lane + 1].max())
            else:
                value = int(lanes[lane % wb])
            flag = int(arith.vcmp(value, CmpOp(f["op"]), _int8(f["imm"])))
            return nwords + unscaled_end, "vec_busy", (f["flag"], flag)

        if op == MicroOp.VARGMAX:
            n = f["n"]
            nwords = n if f["column"] else -(-n // wb)
            words = self._read_lanes(self._words(f["addr"] + np.arange(nwords)))
            if f["column"]:
                result = arith.vargmax_column(words, f["lane"])
            else:
                result = arith.vargmax(words.reshape(-1)[:n])
            self.index[f["index"]] = result & 0xFFFF
            # With ``test``, the flag is written as VCMP's is (in the unit's last busy
            # cycle, which is when the RTL writes the index register too).
            flag = (f["flag"], int(arith.vargmax_test(result, f["expect"]))) \
                if f["test"] else None
            return nwords + unscaled_end, "vec_busy", flag

        if op == MicroOp.VCFG:
            reg = VectorCfg(f["reg"])
            value = f["value"] & ((1 << _VCFG_BITS[reg]) - 1)
            if reg in _VCFG_SIGNED:
                value = _int8(value)
            self.vcfg[reg] = value
            return 0, None, None

        raise AssertionError(f"{op!r} is not a compute micro-instruction")


class _Events:
    """What happened in one cycle, for the counters."""
    __slots__ = ("plan_retired", "micro_retired", "stall_dma", "stall_compute", "call_done",
                 "inference",
                 "swap", "fault", "branch", "spec_hit", "spec_miss", "spec_fault", "rollback")

    def __init__(self):
        self.plan_retired = self.micro_retired = self.stall_dma = self.stall_compute = 0
        self.call_done = 0
        self.inference = self.swap = self.fault = 0
        self.branch = None
        self.spec_hit = self.spec_miss = self.spec_fault = self.rollback = 0

    def suppressed(self):
        """The events that survive a fault or a miss in the same cycle."""
        ev = _Events()
        ev.stall_dma = self.stall_dma
        ev.stall_compute = self.stall_compute
        ev.inference = self.inference
        ev.branch = self.branch
        return ev


def _as_int(instr):
    if hasattr(instr, "as_bits"):
        instr = instr.as_bits()
    if not isinstance(instr, int) or isinstance(instr, bool):
        raise TypeError(f"Instruction must be an integer or a data.Const, not {instr!r}")
    return instr
