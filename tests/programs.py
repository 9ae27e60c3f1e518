"""Random valid programs over the whole ISA, and a runner that makes their effects
visible, for differential tests of the golden model against the RTL.

:func:`random_program` builds, from a seeded :class:`random.Random`, a program that
uses every plan and micro-instruction: DMA loads and stores with tokens and WAITs,
MATMUL, ACC_BIAS, REQUANT (per-tensor and per-channel), VADD, VPOOL, VCLAMP, VCMP,
VARGMAX (packed and column, with and without a flag test), VCFG; a plan of CALLs,
MARKs, BRANCHes, JUMPs and SWITCHes on the flags and index registers the kernels set,
sometimes an ASSUME .. COMMIT region with a fallback plan in the other bank, and now
and then one deliberate fault.

The programs are free of timing-dependent results, so every target must agree on
them exactly. The RTL runs compute instructions beside the kernel sequencer and the
DMA engine, while the model applies each of them at once; the generator therefore:

* WAITs for the DMA tokens a compute instruction's operands or results overlap, and
  for the compute unit before a DMA that overlaps the last compute instruction;
* never lets an instruction's output overlap its own inputs (the compute unit reads
  up to 9 words ahead of its writes);
* drains the DMA queue and the compute unit before anything that can fault, and waits
  right after it, so that a fault finds nothing in flight;
* in kernels called inside a speculative region, drains before and after every VCMP
  and every VARGMAX with a flag test (they may miss) and runs every store alone (it may
  overflow the staging buffer), so a miss, too, finds nothing in flight.

:func:`run_program` runs one on a :class:`~fusetile.host.device.Device`: a prologue
kernel resets the architectural registers and fills the scratchpad from GMEM, the
program runs, its state is read back, and an epilogue kernel stores every partition
the program used to GMEM, so the scratchpad becomes visible in the GMEM image.
"""

import random
from dataclasses import dataclass, field

from fusetile.host.device import TileFault
from fusetile.kernels.isa import (FLAGS, INDEX_REGS, DMA_TOKENS, DmaArgs, GmemBase, MicroInstr,
                                  MicroOp, PlanInstr, PlanOp, CmpOp, VectorCfg)
from fusetile.kernels.program import (
    VCFG_RANGES, acc_bias, assume, branch, call, commit, dma_load, dma_store, done, jump,
    mark, matmul, micro_nop, nop, requant, ret, switch, vadd, vargmax, vcfg, vclamp, vcmp,
    vpool, wait)


__all__ = ["Program", "random_program", "run_program", "differences", "FAULT_KINDS",
           "SPAN_WORDS", "TAIL_WORDS", "RESET_PART", "RESET_SLOT", "EXACT_COUNTERS"]


#: GMEM and scratchpad words a program uses (from word 0): the smallest test
#: configuration has 256 of each.
SPAN_WORDS = 256
#: The slot and partition the prologue and epilogue kernels use (the program never).
RESET_SLOT = RESET_PART = 7
#: Program kernels live in slots 0..PROGRAM_SLOTS-1; slots from PROGRAM_SLOTS to
#: RESET_SLOT-1 are never loaded (a CALL of one is a SLOT_INVALID fault).
PROGRAM_SLOTS = 4

# GMEM layout (words): the epilogue's dump of the partitions, data, per-channel
# requantisation tables, and the region program stores go to.
DUMP_AT, DUMP_WORDS = 0, 64
TABLES_AT, TABLES = 128, 4
STORES_AT = 160
ARG0_MAX = 32                           # CALL a: a data address
ARG1_LO, ARG1_HI = STORES_AT, STORES_AT + 16   # CALL b: a store address

#: Counters that are architectural (exact on every target).
EXACT_COUNTERS = ("plan_retired", "micro_retired", "kernel_calls", "inferences", "faults",
                  "dma_bytes_in", "dma_bytes_out", "macs", "saturations", "spec_hits",
                  "spec_misses", "spec_faults", "swaps", "refused_writes")

#: The deliberate faults :func:`random_program` can plant.
FAULT_KINDS = ("dma_partition", "dma_gmem", "compute_partition", "micro_reserved",
               "micro_operand", "compute_operand", "plan_reserved", "plan_operand",
               "slot_invalid")
#: Flags speculative regions mostly guard on (and their kernels' VCMPs and testing
#: VARGMAXes mostly write), so that guards fail in the middle of a kernel too, not only
#: at COMMIT.
GUARD_FLAGS = (0, 1)


@dataclass
class Program:
    """One generated program (all instructions as ints)."""
    seed: int
    gmem: bytes                          # the first SPAN_WORDS words of GMEM
    parts: list                          # [(base, length)] of partitions 0..
    kernels: dict                        # slot -> (partition, [micro])
    plan: list                           # the active bank
    fallback: list = None                # the other bank (speculation), or None
    fault: str = None                    # the deliberate fault planted, if any
    notes: list = field(default_factory=list)

    def describe(self):
        from fusetile.kernels.asm import disassemble_kernel, disassemble_plan
        lines = [f"seed {self.seed}, fault {self.fault}, partitions {self.parts}"]
        for slot, (part, body) in sorted(self.kernels.items()):
            lines.append(f"kernel {slot} (partition {part}):")
            lines += ["    " + l for l in disassemble_kernel(body).splitlines()]
        lines.append("plan:")
        lines += ["    " + l for l in disassemble_plan(self.plan).splitlines()]
        if self.fallback:
            lines.append("fallback (other bank):")
            lines += ["    " + l for l in disassemble_plan(self.fallback).splitlines()]
        return "\n".join(lines)


# Bit of a micro-instruction where a DMA's gmem base starts.
DMA_BASE_BIT = MicroInstr.as_shape()["args"].offset + DmaArgs.as_shape()["gmem_base"].offset


def _int8(rng):
    return rng.randrange(-128, 128)


def _words(start, count, stride=1):
    return {start + i * stride for i in range(count)}


class _KernelBuilder:
    """Builds one kernel for a partition of ``length`` words, tracking what is in
    flight so that the result does not depend on timing."""

    def __init__(self, rng, config, length, *, speculative):
        self.rng = rng
        self.cfg = config
        self.R = config.rows
        self.wb = config.word_bytes
        self.L = length
        self.speculative = speculative
        self.body = []
        self.pending = []           # DMAs that may be in flight: (token, is_load, words)
        self.compute = None         # (reads, writes) of the compute op that may be running

    # -- hazards ---------------------------------------------------------------------
    def drain(self):
        self.body += [wait(compute=True), wait()]
        self.pending, self.compute = [], None

    def _dma(self, instr, store, words, token):
        if self.speculative and store:
            # A store may overflow the staging buffer: it must run alone.
            self.drain()
        elif self.compute is not None:
            reads, writes = self.compute
            if words & (writes if store else reads | writes):
                self.body.append(wait(compute=True))
                self.compute = None
        self.body.append(instr)
        self.pending.append((token, not store, words))
        if self.speculative and store:
            self.body.append(wait())
            self.pending = []

    def _compute(self, instr, reads, writes):
        tokens = {t for t, load, words in self.pending
                  if words & (reads | writes if load else writes)}
        if tokens:
            self.body.append(wait(sum(1 << t for t in tokens)))
            self.pending = [p for p in self.pending if p[0] not in tokens]
        self.body.append(instr)
        self.compute = (reads, writes)

    # -- places ------------------------------------------------------------------------
    def _place(self, size, avoid=frozenset(), tries=20):
        """A start offset for ``size`` contiguous-ish words ending inside the partition,
        whose words (as ``words(start)``) miss ``avoid``."""
        if size > self.L:
            return None
        for _ in range(tries):
            start = self.rng.randrange(self.L - size + 1)
            if not _words(start, size) & avoid:
                return start
        return None

    def _fits(self, words):
        return all(0 <= w < self.L for w in words)

    # -- operations ------------------------------------------------------------------
    def dma(self, store=None):
        rng = self.rng
        store = rng.random() < 0.35 if store is None else store
        rows, cols = rng.choice([(1, rng.randrange(1, 7)), (rng.randrange(1, 4),
                                                            rng.randrange(1, 5)),
                                 (rng.randrange(0, 2), rng.randrange(0, 3))])
        spad_stride = rng.choice([cols, cols, rng.randrange(0, 7)])
        gmem_stride = rng.choice([cols, cols, rng.randrange(0, 9)])
        words = {r * spad_stride + c for r in range(rows) for c in range(cols)}
        extent = max(words) + 1 if words else 0
        if extent > self.L:
            return
        spad = rng.randrange(self.L - extent + 1)
        words = {spad + w for w in words}
        gext = (rows - 1) * gmem_stride + cols if rows and cols else 0
        if store:
            base = rng.choice([GmemBase.ABS, GmemBase.ARG1, GmemBase.ARG1])
            hi = SPAN_WORDS - gext - (ARG1_HI if base == GmemBase.ARG1 else 0)
            lo = 0 if base == GmemBase.ARG1 else STORES_AT
        else:
            base = rng.choice(list(GmemBase))
            off = {GmemBase.ABS: 0, GmemBase.ARG0: ARG0_MAX, GmemBase.ARG1: ARG1_HI}[base]
            lo, hi = 0, SPAN_WORDS - gext - off
        if hi < lo:
            return
        token = rng.randrange(DMA_TOKENS)
        instr = (dma_store if store else dma_load)(
            gmem=rng.randrange(lo, hi + 1), spad=spad, rows=rows, cols=cols,
            gmem_stride=gmem_stride, spad_stride=spad_stride, base=base, token=token)
        self._dma(instr, store, words, token)

    def table_load(self, avoid):
        """Load a per-channel table from GMEM; its scratchpad offset, or None."""
        n = -(-8 * self.R // self.wb)
        at = self._place(n, avoid)
        if at is None:
            return None
        token = self.rng.randrange(DMA_TOKENS)
        table = self.rng.randrange(TABLES)
        self._dma(dma_load(gmem=TABLES_AT + table * n, spad=at, cols=n, token=token),
                  False, _words(at, n), token)
        return at

    def matmul(self):
        rng = self.rng
        k = rng.choice([0, 1, 2, rng.randrange(1, 12)])
        a_stride, b_stride = rng.randrange(4), rng.randrange(4)
        span_a = (k - 1) * a_stride + 1 if k else 1
        span_b = (k - 1) * b_stride + 1 if k else 1
        if max(span_a, span_b) > self.L:
            return
        a = rng.randrange(self.L - span_a + 1)
        b = rng.randrange(self.L - span_b + 1)
        reads = _words(a, k, a_stride) | _words(b, k, b_stride)
        self._compute(matmul(a=a, b=b, k=k, a_stride=a_stride, b_stride=b_stride,
                             accumulate=rng.random() < 0.5), reads, set())

    def acc_bias(self):
        n = -(-4 * self.R // self.wb)
        at = self._place(n)
        if at is not None:
            self._compute(acc_bias(at), _words(at, n), set())

    def requant(self):
        rng = self.rng
        stride = rng.choice([1, 1, 2, 0, 3])
        span = (self.R - 1) * stride + 1
        if span > self.L:
            return
        out = rng.randrange(self.L - span + 1)
        writes = _words(out, self.R, stride)
        per_channel = rng.random() < 0.5
        reads, params = set(), 0
        if per_channel:
            params = self.table_load(writes)
            if params is None:
                per_channel, params = False, 0
            else:
                reads = _words(params, -(-8 * self.R // self.wb))
        self._compute(requant(out=out, out_stride=stride, per_channel=per_channel,
                              params=params), reads, writes)

    def _streams(self, n, inputs):
        """Starts of ``inputs`` streams of ``n`` words and a disjoint output stream."""
        starts = [self._place(n) for _ in range(inputs)]
        if None in starts:
            return None
        reads = set().union(*(_words(s, n) for s in starts))
        out = self._place(n, reads)
        if out is None:
            return None
        return starts, out, reads, _words(out, n)

    def vadd(self):
        n = self.rng.choice([0, 1, 2, self.rng.randrange(1, 7)])
        placed = self._streams(max(n, 1), 2)
        if placed:
            (a, b), out, reads, writes = placed
            self._compute(vadd(a=a, b=b, out=out, n=n), reads if n else set(),
                          writes if n else set())

    def vclamp(self):
        rng = self.rng
        n = rng.choice([0, 1, rng.randrange(1, 7)])
        placed = self._streams(max(n, 1), 1)
        if placed:
            (src,), out, reads, writes = placed
            lo, hi = sorted((_int8(rng), _int8(rng)))
            if rng.random() < 0.1:
                lo, hi = hi, lo
            self._compute(vclamp(src=src, out=out, n=n, lo=lo, hi=hi),
                          reads if n else set(), writes if n else set())

    def vpool(self):
        rng = self.rng
        n = rng.choice([0, 1, rng.randrange(1, 5)])
        window = rng.choice([1, 2, rng.randrange(1, 5), rng.randrange(1, 16)])
        stride, step = rng.randrange(4), rng.randrange(5)
        offsets = {o * step + t * stride for o in range(max(n, 1)) for t in range(window)}
        span = max(offsets) + 1
        if span > self.L:
            return
        src = rng.randrange(self.L - span + 1)
        reads = {src + w for w in offsets}
        out = self._place(max(n, 1), reads)
        if out is None:
            return
        # (An average only where VPOOL averages: TileConfig.pool_average.)
        average = rng.random() < 0.5 and self.cfg.pool_average
        self._compute(vpool(src=src, out=out, n=n, window=window, stride=stride, step=step,
                            average=average, pairs=rng.random() < 0.4),
                      reads if n else set(), _words(out, n))

    def vcmp(self, flag=None):
        rng = self.rng
        lane = rng.choice([rng.randrange(self.wb), rng.randrange(min(4 * self.wb, 256))])
        reduce = rng.random() < 0.5
        nwords = lane // self.wb + 1
        if nwords > self.L:
            return
        addr = rng.randrange(self.L - nwords + 1)
        first = 0 if reduce else lane // self.wb
        reads = _words(addr + first, nwords - first)
        if flag is None:
            # Kernels called in a region mostly write the flags guards test.
            flag = rng.choice(GUARD_FLAGS) if self.speculative and rng.random() < 0.7 else \
                rng.randrange(FLAGS)
        instr = vcmp(addr=addr, lane=lane, op=rng.choice(list(CmpOp)), imm=_int8(rng),
                     flag=flag, reduce=reduce)
        if self.speculative:
            # It may write the guard flag: a miss must find nothing in flight.
            self.drain()
            self._compute(instr, reads, set())
            self.body.append(wait(compute=True))
            self.compute = None
        else:
            self._compute(instr, reads, set())

    def vargmax(self):
        rng = self.rng
        if rng.random() < 0.4:
            # Column mode: lane `lane` of n words (one sample's values).
            n = rng.choice([1, rng.randrange(1, 9), rng.randrange(1, 17)])
            nwords = n
            lane = rng.choice([0, self.wb - 1, rng.randrange(self.wb)])
        else:
            n = rng.choice([rng.randrange(1, 9)] * 4 + [rng.randrange(1, 25)])
            nwords = -(-n // self.wb)
            lane = None
        flag = expect = None
        if rng.random() < 0.4:
            # A flag test: F[flag] = (result == expect). Kernels called in a region
            # mostly write the flags guards test; the guess is right now and then.
            flag = rng.choice(GUARD_FLAGS) if self.speculative and rng.random() < 0.7 else \
                rng.randrange(FLAGS)
            expect = rng.choice([0, rng.randrange(n), rng.randrange(n), rng.randrange(1 << 12)])
        if nwords > self.L:
            return
        addr = rng.randrange(self.L - nwords + 1)
        instr = vargmax(addr=addr, n=n, index=rng.randrange(INDEX_REGS), lane=lane,
                        flag=flag, expect=expect)
        reads = _words(addr, nwords)
        if self.speculative and flag is not None:
            # It may write the guard flag: a miss must find nothing in flight.
            self.drain()
            self._compute(instr, reads, set())
            self.body.append(wait(compute=True))
            self.compute = None
        else:
            self._compute(instr, reads, set())

    def vcfg(self):
        rng = self.rng
        reg = rng.choice(list(VectorCfg))
        lo, hi = VCFG_RANGES[reg]
        if reg in (VectorCfg.MULT_A, VectorCfg.MULT_B):
            value = rng.choice([0, 1 << 30, hi, rng.randrange(1 << 24, 1 << 31),
                                rng.randrange(hi + 1)])
        elif reg == VectorCfg.SHIFT:
            value = rng.choice([0, 0, 1, rng.randrange(8), rng.randrange(32)])
        else:
            value = rng.randrange(lo, hi + 1)
        # VCFG waits for the compute unit in the RTL and acts at once in the model:
        # either way it follows the previous compute instruction.
        self.body.append(vcfg(reg, value))

    def waits(self):
        rng = self.rng
        tokens = rng.randrange(1 << DMA_TOKENS)
        on_compute = rng.random() < 0.4
        self.body.append(wait(tokens, compute=on_compute))
        if on_compute:
            self.compute = None
        mask = tokens or (0 if on_compute else 0xF)
        self.pending = [p for p in self.pending if not mask >> p[0] & 1]

    OPS = (("dma", 24), ("store", 10), ("waits", 6), ("matmul", 10), ("acc_bias", 5),
           ("requant", 9), ("vadd", 7), ("vpool", 8), ("vclamp", 5), ("vcmp", 7),
           ("vargmax", 5), ("vcfg", 10), ("nop", 2))

    def random_op(self):
        # (VCMP and VARGMAX only where they are built, TileConfig.decisions; VADD,
        # VPOOL and VCLAMP likewise, word_ops.)
        names, weights = zip(*(op for op in self.OPS
                               if (self.cfg.decisions or op[0] not in ("vcmp", "vargmax")) and
                               (self.cfg.word_ops or op[0] not in ("vadd", "vpool", "vclamp"))))
        name = self.rng.choices(names, weights)[0]
        if name == "store":
            self.dma(store=True)
        elif name == "nop":
            self.body.append(micro_nop())
        else:
            getattr(self, name)()

    # -- deliberate faults ---------------------------------------------------------------
    def fault(self, kind):
        rng = self.rng
        self.drain()
        L = self.L
        if kind == "dma_partition":
            cols = rng.randrange(2, 6)
            spad = rng.choice([L - rng.randrange(1, cols), L + rng.randrange(8), 0xFFFF])
            store = rng.random() < 0.4
            instr = (dma_store if store else dma_load)(
                gmem=STORES_AT if store else rng.randrange(64), spad=spad, cols=cols,
                token=rng.randrange(DMA_TOKENS))
            self.body += [instr, wait()]
        elif kind == "dma_gmem":
            words = self.cfg.gmem_words
            cols = rng.randrange(2, 6)
            gmem = rng.choice([words - rng.randrange(1, cols), words + rng.randrange(4)])
            store = rng.random() < 0.4
            instr = (dma_store if store else dma_load)(
                gmem=gmem, spad=0, cols=min(cols, L), token=rng.randrange(DMA_TOKENS))
            self.body += [instr, wait()]
        elif kind == "compute_partition":
            n = rng.randrange(2, 6)
            out = L - rng.randrange(1, n)                  # the output runs past the end
            choice = rng.randrange(6)
            if choice == 0:
                instr = vclamp(src=0, out=out, n=n, lo=-5, hi=5)
            elif choice == 1:
                instr = vadd(a=0, b=rng.randrange(out - n + 1), out=out, n=n)
            elif choice == 2:
                instr = matmul(a=L - rng.randrange(1, 3), b=0, k=rng.randrange(3, 6))
            elif choice == 3:
                instr = vcmp(addr=L - 1, lane=rng.randrange(self.wb, 3 * self.wb), op="GE",
                             imm=0, flag=rng.randrange(FLAGS), reduce=rng.random() < 0.5)
            elif choice == 4:
                instr = acc_bias(L - rng.randrange(1, 4))
            else:                                          # an input runs past the end
                instr = vpool(src=L - 2, out=0, n=n, window=2, stride=1, step=1)
            self.body.append(instr)
        elif kind == "micro_reserved":
            op = rng.choice([5, 6, 7, 17, 31, 63])
            self.body.append(op | rng.randrange(1 << 120) << 8)
        elif kind == "micro_operand":
            # gmem base 3 is reserved (the builders cannot make it).
            store = rng.random() < 0.5
            self.body.append((dma_store if store else dma_load)(
                gmem=rng.randrange(64), spad=0, token=rng.randrange(DMA_TOKENS)) |
                3 << DMA_BASE_BIT)
        elif kind == "compute_operand":
            self.body += [rng.choice([
                MicroInstr.const({"op": MicroOp.VCFG, "args": {"raw": rng.randrange(8, 16)}}),
                MicroInstr.const({"op": MicroOp.VPOOL, "args": {"vpool": {
                    "n": rng.randrange(1, 4), "window": 0}}}),
                MicroInstr.const({"op": MicroOp.VARGMAX, "args": {"vargmax": {"n": 0}}}),
                # VARGMAX: a lane beyond the word (column), a lane without column, a
                # flag or an expect without test.
                MicroInstr.const({"op": MicroOp.VARGMAX, "args": {"vargmax": {
                    "n": rng.randrange(1, 4), "column": 1,
                    "lane": rng.randrange(self.wb, 256)}}}),
                MicroInstr.const({"op": MicroOp.VARGMAX, "args": {"vargmax": {
                    "n": 1, "lane": rng.randrange(1, 256)}}}),
                MicroInstr.const({"op": MicroOp.VARGMAX, "args": {"vargmax": {
                    "n": 1, "column": rng.randrange(2), rng.choice(["flag", "expect"]):
                    rng.randrange(1, 8)}}}),
            ]).as_bits()]
        else:
            raise ValueError(kind)


def _kernel(rng, config, length, *, speculative, fault=None):
    k = _KernelBuilder(rng, config, length, speculative=speculative)
    if rng.random() < 0.5:
        # The prologue zeroes the multipliers: set some so requantisation does work.
        for _ in range(rng.randrange(1, 4)):
            k.vcfg()
    ops = rng.randrange(3, 13)
    fault_at = rng.randrange(ops + 1) if fault else None
    for i in range(ops):
        if i == fault_at:
            k.fault(fault)
        k.random_op()
    if fault_at == ops:
        k.fault(fault)
    if rng.random() < 0.3:
        k.body.append(wait(compute=rng.random() < 0.5))
    return k.body + [ret()]


def _raw_plan(op, **fields):
    return PlanInstr.const({"op": op, **fields}).as_bits()


def _plan(rng, config, slots, spec_slots, fault, must_call=None):
    """The active bank and, with a speculative region, the fallback bank."""
    def call_item(candidates):
        return ("call", rng.choice(candidates), rng.randrange(ARG0_MAX + 1),
                rng.randrange(ARG1_LO, ARG1_HI + 1))

    def item():
        r = rng.random()
        if r < 0.5:
            return call_item(slots)
        if r < 0.6:
            return ("mark", rng.randrange(1 << 24))
        if r < 0.65:
            return ("nop",)
        if r < 0.8:
            return ("branch", rng.randrange(FLAGS), rng.random() < 0.5)
        if r < 0.88:
            return ("jump",)
        return ("switch", rng.randrange(INDEX_REGS),
                8 if rng.random() < 0.7 else rng.randrange(1, 9))

    items = [item() for _ in range(rng.randrange(2, 9))]
    if not any(i[0] == "call" for i in items):
        items.insert(rng.randrange(len(items) + 1), call_item(slots))
    if must_call is not None:
        items.insert(rng.randrange(len(items) + 1), call_item([must_call]))
    region = None
    fallback = None
    if spec_slots and rng.random() < 0.35:
        body = [call_item(spec_slots) if rng.random() < 0.75 else ("mark", rng.randrange(256))
                for _ in range(rng.randrange(1, 4))]
        at = rng.randrange(len(items) + 1)
        resume = rng.randrange(4)
        guard = rng.choice(GUARD_FLAGS) if rng.random() < 0.7 else rng.randrange(FLAGS)
        items[at:at] = [("assume", guard, rng.random() < 0.5, resume)] + body + \
            [("commit",)]
        region = (at, at + len(body) + 1)
        fallback = [mark(0xF0 + i) for i in range(resume)]
        for _ in range(rng.randrange(3)):
            _, slot, a, b = call_item(slots)
            fallback.append(call(slot, a=a, b=b))
        fallback += [mark(0xFA11), done()]
    if fault in ("plan_reserved", "plan_operand", "slot_invalid"):
        at = rng.randrange(len(items) + 1)
        items.insert(at, ("fault", fault))
        # Inside a region (a miss, not a stop) or not.
        if region is not None and at <= region[1]:
            region = (region[0] + (at <= region[0]), region[1] + 1)
    items += [("mark", rng.randrange(1 << 24)), ("done",)]

    # Forward targets only (no loops), never into a region.
    def target(i):
        choices = [t for t in range(i + 1, len(items))
                   if region is None or not region[0] < t <= region[1]]
        return rng.choice(choices)

    pcs, pc = [], 0
    for it in items:
        pcs.append(pc)
        pc += 1 + (it[2] if it[0] == "switch" else 0)
    plan = []
    for i, it in enumerate(items):
        kind = it[0]
        inside = region is not None and region[0] < i < region[1]
        if kind == "call":
            plan.append(call(it[1], a=it[2], b=it[3]))
        elif kind == "mark":
            plan.append(mark(it[1]))
        elif kind == "nop":
            plan.append(nop())
        elif kind == "done":
            plan.append(done())
        elif kind == "commit":
            plan.append(commit())
        elif kind == "assume":
            plan.append(assume(it[1], it[3], expect=it[2]))
        elif kind in ("branch", "jump", "switch") and inside:
            plan.append(nop())
        elif kind == "branch":
            plan.append(branch(it[1], pcs[target(i)], if_set=it[2]))
        elif kind == "jump":
            plan.append(jump(pcs[target(i)]))
        elif kind == "switch":
            plan.append(switch(it[1], pcs[i] + 1, it[2]))
            plan += [jump(pcs[target(i)]) for _ in range(it[2])]
        elif kind == "fault":
            plan.append(_plan_fault(rng, config, it[1]))
    return plan, fallback


def _plan_fault(rng, config, kind):
    if kind == "plan_reserved":
        return rng.randrange(9, 16) | rng.randrange(1 << 60) << 4
    if kind == "slot_invalid":
        return call(rng.randrange(PROGRAM_SLOTS, RESET_SLOT))
    return rng.choice([
        _raw_plan(PlanOp.BRANCH, sel=rng.randrange(FLAGS, 256)),
        _raw_plan(PlanOp.SWITCH, sel=rng.randrange(INDEX_REGS, 256), b=8),
        _raw_plan(PlanOp.JUMP, cond=rng.randrange(1, 16)),
        _raw_plan(PlanOp.MARK, cond=1, a=5),
        _raw_plan(PlanOp.JUMP, a=config.plan_depth + rng.randrange(64)),
    ])


def random_program(seed, config, *, fault_rate=0.12, fault_kinds=FAULT_KINDS):
    """A random valid program for ``config`` (at least SPAN_WORDS words of GMEM and
    scratchpad, 8 slots and 8 partitions), from ``seed``; with probability
    ``fault_rate`` it plants one fault of a kind from ``fault_kinds``."""
    rng = random.Random(seed)
    wb = config.word_bytes
    assert config.gmem_words >= SPAN_WORDS and config.spad_words >= SPAN_WORDS
    assert config.kernel_slots >= 8 and config.partitions >= 8

    gmem = bytearray(rng.randrange(256) for _ in range(SPAN_WORDS * wb))
    n = -(-8 * config.rows // wb)
    for t in range(TABLES):
        for row in range(config.rows):
            at = (TABLES_AT + t * n) * wb + 8 * row
            mult = rng.choice([rng.randrange(1 << 31), 1 << 30, (1 << 31) - 1,
                               rng.randrange(1 << 20, 1 << 28)])
            shift = rng.choice([0, rng.randrange(8), rng.randrange(256)])
            gmem[at:at + 4] = mult.to_bytes(4, "little")
            gmem[at + 4] = shift

    # Partitions: 1..3, at most DUMP_WORDS words in all, disjoint, inside SPAN_WORDS.
    nparts = rng.choice([1, 2, 2, 3])
    lengths = []
    left = DUMP_WORDS
    for i in range(nparts):
        lo = 12
        hi = left - lo * (nparts - i - 1)
        lengths.append(rng.randrange(lo, min(hi, 40) + 1))
        left -= lengths[-1]
    cells = list(range(SPAN_WORDS // 64))       # one partition per 64-word quarter
    rng.shuffle(cells)
    banks = config.spad_banks                   # a partition starts at a bank's first word
    parts = [(cells[i] * 64 + rng.randrange(64 - lengths[i] + 1) // banks * banks, lengths[i])
             for i in range(nparts)]

    fault = rng.choice(fault_kinds) if rng.random() < fault_rate else None
    nslots = rng.randrange(1, PROGRAM_SLOTS + 1)
    spec = [rng.random() < 0.5 for _ in range(nslots)]
    if not any(spec) and rng.random() < 0.5:
        spec[0] = True
    faulty = rng.randrange(nslots) if fault and fault.startswith(("dma", "compute", "micro")) \
        else None
    kernels = {}
    for slot in range(nslots):
        part = rng.randrange(nparts)
        kernels[slot] = (part, _kernel(rng, config, parts[part][1], speculative=spec[slot],
                                       fault=fault if slot == faulty else None))
    spec_slots = [s for s in range(nslots) if spec[s]]
    plan, fallback = _plan(rng, config, list(range(nslots)), spec_slots, fault,
                           must_call=faulty)
    return Program(seed=seed, gmem=bytes(gmem), parts=parts, kernels=kernels, plan=plan,
                   fallback=fallback, fault=fault)


# -- running ---------------------------------------------------------------------------

def _prologue(config):
    """Slot RESET_SLOT's kernel before a program: scratchpad words [0, SPAN_WORDS) from
    GMEM, vector configuration, ACC, flags and index registers to known values."""
    bias = -(-4 * config.rows // config.word_bytes)
    body = [dma_load(gmem=0, spad=0, cols=SPAN_WORDS), wait()]
    body += [vcfg(reg, 0) for reg in VectorCfg if reg not in (VectorCfg.LO, VectorCfg.HI)]
    if config.word_ops:
        zeros = SPAN_WORDS - bias
        body += [vcfg(VectorCfg.LO, -128), vcfg(VectorCfg.HI, 127),
                 vclamp(src=0, out=zeros, n=bias, lo=0, hi=0), acc_bias(zeros)]
    else:
        # (No VCLAMP: REQUANT clamped to [0, 0] writes ACC's rows as zeros, at least
        # as many words as the bias.)
        zeros = SPAN_WORDS - config.rows
        body += [vcfg(VectorCfg.LO, 0), vcfg(VectorCfg.HI, 0), requant(out=zeros),
                 vcfg(VectorCfg.LO, -128), vcfg(VectorCfg.HI, 127), acc_bias(zeros)]
    if config.decisions:        # (else nothing writes them: they stay 0)
        body += [vcmp(addr=0, lane=0, op="LT", imm=-128, flag=f) for f in range(FLAGS)]
        body += [vargmax(addr=0, n=1, index=x) for x in range(INDEX_REGS)]
    # Restore the words the zeros went to (the program sees GMEM's image).
    body += [wait(compute=True), dma_load(gmem=zeros, spad=zeros, cols=SPAN_WORDS - zeros),
             ret()]
    return body


def _epilogue(program):
    body = []
    at = DUMP_AT
    for base, length in program.parts:
        body.append(dma_store(gmem=at, spad=base, cols=length))
        at += length
    return body + [ret()]


def _run_plan(dev, plan, timeout):
    dev.load_plan(plan)
    dev.start()
    dev.wait_done(timeout_cycles=timeout, poll_cycles=32)


#: GMEM words at the end of GMEM a DMA fault (GMEM_RANGE) may have written.
TAIL_WORDS = 8


def run_program(dev, program, *, timeout=100_000, whole_gmem=True):
    """Run ``program`` on ``dev`` and return everything architectural it left:
    {name: value}, comparable between targets.

    With ``whole_gmem`` all of GMEM is written before and read after; else only the
    words a program can reach (its SPAN_WORDS and the last TAIL_WORDS), which saves
    most of the bus traffic on a big GMEM (compare the rest once, at the end)."""
    cfg = dev.config
    wb = cfg.word_bytes
    tail = (cfg.gmem_words - TAIL_WORDS) * wb
    if whole_gmem:
        image = program.gmem + bytes(cfg.gmem_bytes - len(program.gmem))
        dev.write_window("GMEM", 0, image)
    else:
        dev.write_window("GMEM", 0, program.gmem)
        dev.write_window("GMEM", tail, bytes(TAIL_WORDS * wb))
    dev.set_partition(RESET_PART, base=0, length=SPAN_WORDS)
    dev.load_kernel(RESET_SLOT, _prologue(cfg), part=RESET_PART)
    _run_plan(dev, [call(RESET_SLOT), done()], timeout)

    for i, (base, length) in enumerate(program.parts):
        dev.set_partition(i, base=base, length=length)
    for slot, (part, body) in program.kernels.items():
        dev.load_kernel(slot, body, part=part)
    dev.read_trace()
    home = dev.load_plan(program.plan)
    if program.fallback:
        dev.write_plan(1 - home, program.fallback)
    dev.clear_counters()
    dev.start()
    out = {}
    try:
        dev.wait_done(timeout_cycles=timeout, poll_cycles=32)
        out["fault"] = None
    except TileFault as e:
        out["fault"] = dict(cause=e.cause, bank=e.bank, in_kernel=e.in_kernel, slot=e.slot,
                            part=e.part, plan_pc=e.plan_pc, micro_pc=e.micro_pc, addr=e.addr)
    status = dev.status()
    out["status"] = {f: int(getattr(status, f)) for f in (
        "running", "done", "faulted", "active_bank", "exec_bank", "speculating",
        "in_kernel", "dma_busy", "swap_pending")}
    out["flags"] = int(dev.regs.FLAGS.read().flags)
    out["index"] = [int(dev.regs[f"INDEX[{x}]"].read().value) for x in range(INDEX_REGS)]
    out["mark"] = int(dev.regs.MARK.read().value)
    out["miss_pc"] = int(dev.regs.MISS_PC.read().pc)
    counters = dev.counters()
    out["counters"] = {name: counters[name] for name in EXACT_COUNTERS}
    out["branches"] = dev.branch_counters()
    out["slot_calls"] = [s["calls"] for s in dev.slot_counters()]
    out["trace"] = [dict(slot=int(r.slot), pc=int(r.pc), bank=int(r.bank),
                         faulted=int(r.faulted), bytes_in=int(r.bytes_in),
                         bytes_out=int(r.bytes_out)) for r in dev.read_trace()]
    if out["fault"] is not None:
        dev.clear_fault()

    dev.load_kernel(RESET_SLOT, _epilogue(program), part=RESET_PART)
    _run_plan(dev, [call(RESET_SLOT), done()], timeout)
    if whole_gmem:
        out["gmem"] = dev.read_window("GMEM", 0, cfg.gmem_bytes)
    else:
        out["gmem"] = dev.read_window("GMEM", 0, len(program.gmem))
        out["gmem_tail"] = dev.read_window("GMEM", tail, TAIL_WORDS * wb)
    return out


def differences(expected, got, word_bytes=8):
    """Readable differences between two :func:`run_program` results (empty: equal)."""
    diffs = []
    for key in expected:
        if expected[key] == got[key]:
            continue
        if key == "gmem":
            a, b = expected[key], got[key]
            words = [i // word_bytes for i in range(0, len(a), word_bytes)
                     if a[i:i + word_bytes] != b[i:i + word_bytes]]
            diffs.append(f"gmem differs in {len(words)} words, first {words[:8]}: "
                         + "; ".join(f"{w}: rtl {a[w * word_bytes:(w + 1) * word_bytes].hex()} "
                                     f"model {b[w * word_bytes:(w + 1) * word_bytes].hex()}"
                                     for w in words[:4]))
        else:
            diffs.append(f"{key}: rtl {expected[key]!r} model {got[key]!r}")
    return diffs
