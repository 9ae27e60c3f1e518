"""The spine's behaviour, as host-level scenarios that run on every target.

Each scenario takes a freshly reset tile behind a :class:`fusetile.host.device.Device`
and asserts what the tile must do. ``tests/test_tile.py`` runs them on the Amaranth
simulator; ``tests/rtl/test_spine.py`` runs the same functions under cocotb on Icarus
and Verilator, so both simulators are held to one specification.

Scenarios go only through the host API (no addresses, no bit positions): they double
as a check that the host runtime can drive every part of the tile.
"""

import random
from dataclasses import replace

import numpy as np

from fusetile.hdl.regmap import tile_memory_map
from fusetile.host.device import TileFault
from fusetile.host.transport import BusError
from fusetile.kernels import arith
from fusetile.kernels.isa import (FaultCause, GmemBase, PlanOp, PlanInstr, CmpOp, VectorCfg,
                                  INDEX_REGS)
from fusetile.kernels.program import (call, done, mark, nop, ret, wait, dma_load, dma_store,
                                      jump, branch, switch, assume, commit, matmul, acc_bias,
                                      micro_nop, requant, vadd, vcfg, vclamp, vcmp, vargmax,
                                      vpool)


__all__ = ["SCENARIOS"]


def _raises(exc, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        return e
    raise AssertionError(f"{fn.__name__} did not raise {exc.__name__}")


def _run(dev, plan, *, timeout=20_000):
    dev.load_plan(plan)
    assert not int(dev.status().swap_pending), "an idle tile takes a swap at once"
    dev.start()
    return dev.wait_done(timeout_cycles=timeout, poll_cycles=16)


def _fault(dev, plan, *, timeout=20_000):
    err = _raises(TileFault, _run, dev, plan, timeout=timeout)
    status = dev.status()
    assert int(status.faulted) and not int(status.running) and not int(status.dma_busy)
    return err


def _until(dev, predicate, *, limit=200):
    """Poll STATUS until ``predicate(status)`` holds (a few cycles per poll)."""
    for _ in range(limit):
        status = dev.status()
        if predicate(status):
            return status
    raise AssertionError("the tile never reached the expected state")


def _words(data, word_bytes):
    return [data[i:i + word_bytes] for i in range(0, len(data), word_bytes)]


def identity(dev):
    """The tile reports its configuration: the hardware profile."""
    assert dev.hardware_profile() == dev.config
    status = dev.status()
    assert not int(status.running) and not int(status.faulted)


def gmem_round_trip(dev):
    """The host reads back what it writes, at any byte offset; past the end is ERR."""
    rng = random.Random(2)
    size = dev.config.gmem_bytes
    for offset, length in ((0, 16), (3, 9), (size - 8, 8), (101, 40)):
        data = bytes(rng.randrange(256) for _ in range(length))
        dev.write_window("GMEM", offset, data)
        assert dev.read_window("GMEM", offset, length) == data
    gmem = dev.memory_map["GMEM"].addr
    _raises(BusError, dev.transport.read32, gmem + size)
    _raises(BusError, dev.transport.write32, gmem + size, 0)


def unmapped_address_is_bus_error(dev):
    """An address no block decodes answers ERR, not silence."""
    err = _raises(BusError, dev.transport.read32, 0x8000)
    assert err.addr == 0x8000 and not err.write
    _raises(BusError, dev.transport.write32, 0x0FFC, 1)     # inside the CSR window, unmapped


def dma_kernel(dev):
    """A plan CALLs a DMA kernel: a 2-D strided load into scratchpad and a store back
    with other strides; counters and the trace record account for every word."""
    cfg = dev.config
    wb = cfg.word_bytes
    rng = random.Random(3)
    rows, cols = 3, 4
    src, dst = 16, 96                        # GMEM word bases, passed as CALL arguments
    src_stride, dst_stride, spad_stride = 6, 5, 4
    gmem = bytearray(rng.randrange(256) for _ in range(128 * wb))
    dev.write_window("GMEM", 0, bytes(gmem))

    dev.set_partition(1, base=8, length=rows * spad_stride)
    dev.load_kernel(2, [
        dma_load(gmem=1, spad=0, rows=rows, cols=cols, gmem_stride=src_stride,
                 spad_stride=spad_stride, base=GmemBase.ARG0),
        wait(),
        dma_store(gmem=0, spad=0, rows=rows, cols=cols, gmem_stride=dst_stride,
                  spad_stride=spad_stride, base=GmemBase.ARG1),
        ret(),
    ], part=1)
    dev.clear_counters()
    _run(dev, [mark(7), call(2, a=src, b=dst), done()])

    expected = bytearray(gmem)
    words = _words(gmem, wb)
    for r in range(rows):
        for c in range(cols):
            at = (dst + r * dst_stride + c) * wb
            expected[at:at + wb] = words[src + 1 + r * src_stride + c]
    assert dev.read_window("GMEM", 0, len(gmem)) == bytes(expected)

    moved = rows * cols * wb
    ctr = dev.counters()
    assert ctr["dma_bytes_in"] == moved and ctr["dma_bytes_out"] == moved
    assert ctr["kernel_calls"] == 1 and ctr["inferences"] == 1
    assert ctr["plan_retired"] == 3 and ctr["micro_retired"] == 4
    assert ctr["dma_busy"] >= 2 * rows * cols
    assert 0 < ctr["active_cycles"] <= ctr["cycles"]
    assert ctr["faults"] == 0
    assert int(dev.regs.MARK.read().value) == 7

    if not cfg.traced:
        return
    (record,) = dev.read_trace()
    assert record.slot == 2 and record.pc == 1 and not record.faulted
    assert record.bytes_in == moved and record.bytes_out == moved
    assert record.dma_busy >= 2 * rows * cols
    slots = dev.slot_counters()
    if slots:
        assert slots[2]["calls"] == 1
        assert slots[2]["cycles"] == record.cycles
    assert dev.read_trace() == []


def partition_fault(dev):
    """An access outside the slot's partition faults with partition and offset, and
    never touches the neighbouring partition."""
    wb = dev.config.word_bytes
    pattern = bytes(range(256))[:16 * wb]
    dev.write_window("GMEM", 0, pattern)
    dev.set_partition(2, base=16, length=16)
    dev.set_partition(3, base=32, length=16)       # the neighbour
    dev.load_kernel(0, [dma_load(gmem=0, spad=0, rows=1, cols=16), ret()], part=3)
    dev.load_kernel(1, [dma_load(gmem=0, spad=12, rows=1, cols=8), ret()], part=2)
    dev.load_kernel(2, [dma_store(gmem=64, spad=0, rows=1, cols=16), ret()], part=3)
    _run(dev, [call(0), done()])

    err = _fault(dev, [call(1), done()])
    assert err.cause == FaultCause.PARTITION
    assert err.part == 2 and err.addr == 16 and err.in_kernel and err.slot == 1
    assert err.plan_pc == 0
    assert dev.counter("faults") == 1
    assert dev.transport.irq() in (None, 1)
    if dev.config.traced:
        (record,) = dev.read_trace()[-1:]
        assert record.faulted and record.slot == 1

    dev.clear_fault()
    assert not int(dev.status().faulted)
    _run(dev, [call(2), done()])
    assert dev.read_window("GMEM", 64 * wb, 16 * wb) == pattern

    # A partition starts at a bank's first word: one written (raw: set_partition
    # refuses it) to start elsewhere has no words.
    if dev.config.spad_banks > 1:
        dev.regs.PART[2].write(base=17, length=16)
        err = _fault(dev, [call(1), done()])
        assert (err.cause, err.part, err.addr) == (FaultCause.PARTITION, 2, 12)
        dev.clear_fault()


def gmem_range_fault(dev):
    """A DMA past the end of GMEM faults with the word address."""
    words = dev.config.gmem_words
    dev.set_partition(0, base=0, length=64)
    dev.load_kernel(0, [dma_load(gmem=words - 2, spad=0, rows=1, cols=4), ret()], part=0)
    err = _fault(dev, [call(0), done()])
    assert err.cause == FaultCause.GMEM_RANGE and err.addr == words


def illegal_instructions(dev):
    """Reserved opcodes and calls of invalid slots stop the tile with a cause."""
    dev.set_partition(0, base=0, length=8)
    reserved_plan = 15           # op field (bits 3:0) = 15, a reserved opcode
    err = _fault(dev, [nop(), reserved_plan, done()])
    assert err.cause == FaultCause.ILLEGAL_PLAN and err.plan_pc == 1
    dev.clear_fault()

    err = _fault(dev, [call(dev.config.kernel_slots - 1), done()])
    assert err.cause == FaultCause.SLOT_INVALID
    dev.clear_fault()

    reserved_micro = 63          # op field (bits 5:0) = 63, a reserved opcode
    dev.load_kernel(0, [wait(), reserved_micro, ret()], part=0)
    err = _fault(dev, [call(0), done()])
    assert err.cause == FaultCause.ILLEGAL_MICRO and err.micro_pc == 1 and err.in_kernel
    assert err.addr == reserved_micro & 0xFFFF_FFFF
    dev.clear_fault()
    _run(dev, [done()])
    assert dev.counter("faults") == 3


def kernel_runs_off_its_slot(dev):
    """A kernel without RET stops the tile with SLOT_RANGE past its last instruction."""
    depth = dev.config.slot_depth
    dev.set_partition(0, base=0, length=8)
    dev.load_kernel(0, [micro_nop()] * depth, part=0)
    err = _fault(dev, [call(0), done()])
    assert err.cause == FaultCause.SLOT_RANGE and err.in_kernel
    assert err.micro_pc == depth and err.addr == depth
    dev.clear_fault()


def bank_swap_is_atomic(dev):
    """A swap requested while a plan runs waits for its DONE: the running plan is never
    split, and the active bank cannot be written."""
    dev.set_partition(0, base=0, length=64)
    # A slow kernel, so the host can act while the plan runs.
    dev.load_kernel(0, [dma_load(gmem=0, spad=0, rows=1, cols=64), ret()], part=0)
    plan_a = [mark(1), call(0), mark(2), call(0), mark(3), call(0), mark(0xA), done()]
    plan_b = [mark(0xB), done()]
    bank_a = dev.load_plan(plan_a)
    assert int(dev.status().active_bank) == bank_a
    dev.clear_counters()
    dev.start()

    bank_b = dev.load_plan(plan_b)
    status = dev.status()
    assert int(status.running), "the plan must still be running for this test to mean anything"
    assert int(status.swap_pending) and int(status.active_bank) == bank_a

    active = dev.memory_map[f"PLAN[{bank_a}]"].addr
    err = _raises(BusError, dev.transport.write32, active, 0)
    assert err.write
    assert int(dev.regs.REFUSED_ADDR.read().addr) == active
    assert dev.read_plan(bank_a, 1) == [plan_a[0]]

    dev.wait_done(timeout_cycles=20_000, poll_cycles=16)
    assert int(dev.regs.MARK.read().value) == 0xA, "plan A ran to its end"
    status = dev.status()
    assert int(status.active_bank) == bank_b and not int(status.swap_pending)
    ctr = dev.counters()
    assert ctr["swaps"] == 1 and ctr["kernel_calls"] == 3 and ctr["refused_writes"] == 1

    dev.start()
    dev.wait_done(timeout_cycles=2_000, poll_cycles=16)
    assert int(dev.regs.MARK.read().value) == 0xB


def slot_protection(dev):
    """The executing slot and its table entries cannot be overwritten; other slots can."""
    dev.set_partition(0, base=0, length=256)
    dev.set_partition(1, base=256, length=8)
    slow = [dma_load(gmem=0, spad=0, rows=4, cols=64), ret()]
    dev.load_kernel(0, slow, part=0)
    dev.load_plan([call(0), done()])
    dev.clear_counters()
    dev.start()
    status = _until(dev, lambda s: int(s.in_kernel))
    assert int(status.slot) == 0

    _raises(BusError, dev.write_kernel, 0, [ret()])
    _raises(BusError, dev.regs.SLOT[0].write, valid=0, part=0)
    _raises(BusError, dev.regs.PART[0].write, base=0, length=1)
    dev.load_kernel(1, [ret()], part=1)             # another slot loads while 0 runs
    dev.set_partition(1, base=256, length=16)

    dev.wait_done(timeout_cycles=20_000, poll_cycles=16)
    assert dev.read_kernel(0, 2) == slow
    assert dev.counter("refused_writes") == 3
    assert int(dev.regs.SLOT[0].read().valid) == 1
    dev.write_kernel(0, [ret()])                     # idle again: writable


def counters_freeze_and_clear(dev):
    """Counters are 64-bit, stop while frozen, and clear to zero."""
    dev.clear_counters()
    before = dev.counter("cycles")
    dev.transport.wait_cycles(100)
    after = dev.counter("cycles")
    assert 100 <= after - before < 200
    dev.freeze_counters(True)
    frozen = dev.counter("cycles")
    dev.transport.wait_cycles(50)
    assert dev.counter("cycles") == frozen
    dev.clear_counters()
    assert dev.counter("cycles") == 0
    dev.freeze_counters(False)
    dev.transport.wait_cycles(10)
    assert 10 <= dev.counter("cycles") < 100


def trace_fifo(dev):
    """One record per call, in order, drained in one burst; overflow is counted. A
    tile without a trace FIFO has no TRACE registers: reading them is a bus error."""
    depth = dev.config.trace_depth
    dev.set_partition(0, base=0, length=8)
    dev.load_kernel(0, [ret()], part=0)
    dev.load_kernel(1, [dma_load(gmem=0, spad=0, rows=1, cols=2), ret()], part=0)
    _run(dev, [call(0), call(1), call(0), done()])
    if not dev.config.traced:
        for offset in (0x070, 0x074):                   # TRACE_STATUS, TRACE_DATA
            err = _raises(BusError, dev.transport.read32, offset)
            assert err.addr == offset and not err.write
        assert "TRACE_STATUS" not in dev.memory_map and "TRACE_DATA" not in dev.memory_map
        assert dev.read_trace() == [] and dev.trace_dropped() == 0
        assert dev.counter("kernel_calls") == 3
        return
    records = dev.read_trace()
    assert [(r.slot, r.pc) for r in records] == [(0, 0), (1, 1), (0, 2)]
    assert records[0].start < records[1].start < records[2].start
    assert records[1].bytes_in == 2 * dev.config.word_bytes

    _run(dev, [call(0)] * (depth + 3) + [done()], timeout=50_000)
    assert len(dev.read_trace()) == depth
    assert dev.trace_dropped() == 3


def watchdog(dev):
    """A plan that runs too long is stopped by the watchdog; the DMA stops with it. A
    tile without one (``TileConfig.watchdog`` False) has no WATCHDOG register: its
    address answers a bus error, the plan runs on past the host's wait, and the
    host's abort stops it."""
    dev.set_partition(0, base=0, length=512)
    dev.load_kernel(0, [dma_load(gmem=0, spad=0, rows=8, cols=64), ret()], part=0)
    if not dev.config.watchdog:
        assert "WATCHDOG" not in dev.regs
        # (where the register is on a tile that has one)
        addr = tile_memory_map(replace(dev.config, watchdog=True))["WATCHDOG"].addr
        _raises(BusError, dev.transport.write32, addr, 100)
        _raises(BusError, dev.transport.read32, addr)
        dev.load_plan([call(0), call(0), done()])
        dev.start()
        _raises(TimeoutError, dev.wait_done, timeout_cycles=300, poll_cycles=16)
        assert int(dev.status().running)
        dev.abort()
        assert dev.fault().cause == FaultCause.ABORTED
        dev.clear_fault()
        _run(dev, [done()])
        return
    dev.regs.WATCHDOG.write(limit=100)
    err = _fault(dev, [call(0), done()])
    assert err.cause == FaultCause.WATCHDOG and err.addr == 100 and err.in_kernel
    irq = dev.transport.irq()
    assert irq in (None, 1)
    dev.clear_fault()
    dev.regs.WATCHDOG.write(limit=0)
    _run(dev, [done()])


def abort(dev):
    """CTRL.abort stops a running plan at once, as a fault."""
    dev.set_partition(0, base=0, length=512)
    dev.load_kernel(0, [dma_load(gmem=0, spad=0, rows=8, cols=64), ret()], part=0)
    dev.load_plan([call(0), done()])
    dev.start()
    dev.abort()
    err = dev.fault()
    assert err is not None and err.cause == FaultCause.ABORTED
    assert not int(dev.status().dma_busy)
    dev.clear_fault()


SCENARIOS = [
    identity, gmem_round_trip, unmapped_address_is_bus_error, dma_kernel, partition_fault,
    gmem_range_fault, illegal_instructions, kernel_runs_off_its_slot, bank_swap_is_atomic,
    slot_protection, counters_freeze_and_clear, trace_fifo, watchdog, abort,
]


# -- plan control flow and speculation ----------------------------------------------------
# Until the vector unit can set them (VCMP, VARGMAX), flags and index registers hold
# their reset value 0; these scenarios steer with that.

def _plan(op, sel=0, cond=0, a=0, b=0):
    return PlanInstr.const({"op": op, "sel": sel, "cond": cond, "a": a, "b": b}).as_bits()


def _load_speculative(dev, plan, fallback):
    """Install ``plan`` as the active bank and ``fallback`` in the other one."""
    home = dev.load_plan(plan)
    dev.write_plan(1 - home, fallback)
    return home


def branch_jump_switch(dev):
    """BRANCH tests a flag, JUMP goes anywhere in the bank, SWITCH indexes a table;
    per-flag counters count taken and not-taken branches."""
    dev.clear_counters()
    _run(dev, [
        _plan(PlanOp.BRANCH, sel=0, cond=1, a=6),   # F0 is 0: not taken
        _plan(PlanOp.BRANCH, sel=0, cond=0, a=3),   # taken
        mark(0xBAD),
        _plan(PlanOp.SWITCH, sel=0, a=5, b=2),      # X0 = 0: table entry 0
        mark(0xBAD),
        _plan(PlanOp.JUMP, a=7),                    # table[0]
        _plan(PlanOp.JUMP, a=4),                    # table[1]
        mark(0x600D),
        done(),
    ])
    assert int(dev.regs.MARK.read().value) == 0x600D
    assert dev.branch_counters()[0] == {"taken": 1, "not_taken": 1}
    assert dev.counter("plan_retired") == 6

    err = _fault(dev, [_plan(PlanOp.SWITCH, sel=0, a=0, b=0), done()])
    assert err.cause == FaultCause.SWITCH_RANGE and err.addr == 0
    dev.clear_fault()
    err = _fault(dev, [_plan(PlanOp.JUMP, a=dev.config.plan_depth), done()])
    assert err.cause == FaultCause.PLAN_RANGE and err.addr == dev.config.plan_depth
    dev.clear_fault()
    # A branch past the bank faults when taken and only then; so does a SWITCH
    # whose table entry is past it.
    past = dev.config.plan_depth + 3
    _run(dev, [_plan(PlanOp.BRANCH, sel=0, cond=1, a=past), mark(0x600D), done()])
    assert int(dev.regs.MARK.read().value) == 0x600D
    err = _fault(dev, [_plan(PlanOp.BRANCH, sel=0, cond=0, a=past), done()])
    assert err.cause == FaultCause.PLAN_RANGE and err.addr == past
    dev.clear_fault()
    err = _fault(dev, [_plan(PlanOp.SWITCH, sel=0, a=past, b=1), done()])
    assert err.cause == FaultCause.PLAN_RANGE and err.addr == past
    dev.clear_fault()
    err = _fault(dev, [_plan(PlanOp.COMMIT), done()])
    assert err.cause == FaultCause.ILLEGAL_PLAN


def _copy_kernels(dev, words):
    """Slot 0 copies GMEM words [0, words) to a quarter of the way into GMEM; slot 1 to
    half-way. Returns those two word addresses."""
    quarter = dev.config.gmem_words // 4
    dev.set_partition(0, base=0, length=128)
    for slot, dst in ((0, quarter), (1, 2 * quarter)):
        dev.load_kernel(slot, [dma_load(gmem=0, spad=0, rows=1, cols=words), wait(),
                               dma_store(gmem=dst, spad=0, rows=1, cols=words), ret()], part=0)
    return quarter, 2 * quarter


def speculation_hit_publishes(dev):
    """A region whose guard holds publishes its stores at COMMIT; while it is open,
    both plan banks refuse host writes. On a tile without speculation ASSUME is an
    illegal instruction: the plan stops there, having stored nothing."""
    wb = dev.config.word_bytes
    data = bytes(range(64)) * wb
    dev.write_window("GMEM", 0, data)
    dst, _ = _copy_kernels(dev, 64)
    dev.write_window("GMEM", dst * wb, bytes(64 * wb))
    plan = [
        _plan(PlanOp.ASSUME, sel=0, cond=0, a=0),   # F0 == 0 holds
        call(0),
        _plan(PlanOp.COMMIT),
        mark(1),
        done(),
    ]
    dev.clear_counters()
    if not dev.config.speculates:
        err = _fault(dev, plan)
        assert err.cause == FaultCause.ILLEGAL_PLAN and err.plan_pc == 0
        assert not int(dev.status().speculating)
        assert dev.read_window("GMEM", dst * wb, 64 * wb) == bytes(64 * wb)
        ctr = dev.counters()
        assert ctr["kernel_calls"] == 0 and ctr["spec_hits"] == ctr["spec_misses"] == 0
        return
    home = _load_speculative(dev, plan, [mark(2), done()])
    dev.start()
    _until(dev, lambda s: int(s.speculating))
    for bank in (0, 1):
        _raises(BusError, dev.write_plan, bank, [done()])
    dev.wait_done(timeout_cycles=20_000, poll_cycles=16)

    assert int(dev.regs.MARK.read().value) == 1
    assert dev.read_window("GMEM", dst * wb, 64 * wb) == data[:64 * wb]
    ctr = dev.counters()
    assert ctr["spec_hits"] == 1 and ctr["spec_misses"] == 0
    assert int(dev.status().active_bank) == home


def speculation_miss_rolls_back(dev):
    """A region whose guard fails leaves GMEM exactly as the unspeculated plan does and
    continues by itself in the other bank at the resume PC."""
    size = dev.config.gmem_bytes
    rng = random.Random(5)
    dev.write_window("GMEM", 0, bytes(rng.randrange(256) for _ in range(size)))
    _copy_kernels(dev, 16)
    before = dev.read_window("GMEM", 0, size)

    # The unspeculated plan: the fallback alone.
    _run(dev, [call(1), mark(2), done()])
    unspeculated = dev.read_window("GMEM", 0, size)
    dev.write_window("GMEM", 0, before)

    home = _load_speculative(dev, [
        mark(7),
        _plan(PlanOp.ASSUME, sel=0, cond=1, a=3),   # guesses F0 == 1: wrong
        call(0),
        _plan(PlanOp.COMMIT),
        mark(1),
        done(),
    ], [mark(0xBAD), mark(0xBAD), mark(0xBAD), call(1), mark(2), done()])
    dev.clear_counters()
    dev.start()
    dev.wait_done(timeout_cycles=20_000, poll_cycles=16)

    assert dev.read_window("GMEM", 0, size) == unspeculated
    assert int(dev.regs.MARK.read().value) == 2
    ctr = dev.counters()
    assert ctr["spec_misses"] == 1 and ctr["spec_hits"] == 0 and ctr["faults"] == 0
    assert ctr["rollback_cycles"] == 5     # the miss, ROLLBACK, fetch, decode, execute
    assert int(dev.regs.MISS_PC.read().pc) == 1
    status = dev.status()
    assert int(status.active_bank) == home, "the speculative plan stays installed"
    assert not int(status.speculating)

    # A resume PC past the bank faults when the rollback fetches there.
    past = dev.config.plan_depth + 2
    _load_speculative(dev, [_plan(PlanOp.ASSUME, sel=0, cond=1, a=past),
                            _plan(PlanOp.COMMIT), done()], [done()])
    dev.start()
    err = _raises(TileFault, dev.wait_done, timeout_cycles=2_000, poll_cycles=16)
    assert err.cause == FaultCause.PLAN_RANGE and err.addr == past
    assert int(dev.regs.FAULT_PC.read().plan) == past
    dev.clear_fault()


def speculation_overflow_and_fault_roll_back(dev):
    """Stores that overflow the staging buffer, and faults inside the region, are
    misses: the fallback runs, the tile does not stop."""
    wb = dev.config.word_bytes
    words = dev.config.staging_words + 8
    dst = dev.config.gmem_words // 2
    dev.set_partition(0, base=0, length=words)
    dev.load_kernel(0, [dma_load(gmem=0, spad=0, rows=1, cols=words), wait(),
                        dma_store(gmem=dst, spad=0, rows=1, cols=words), ret()], part=0)
    dev.load_kernel(1, [dma_load(gmem=0, spad=words, rows=1, cols=1), ret()], part=0)
    dev.write_window("GMEM", dst * wb, bytes(words * wb))
    for kernel in (0, 1):
        _load_speculative(dev, [
            _plan(PlanOp.ASSUME, sel=0, cond=0, a=0),
            call(kernel),
            _plan(PlanOp.COMMIT),
            mark(1),
            done(),
        ], [mark(2), done()])
        dev.clear_counters()
        dev.start()
        dev.wait_done(timeout_cycles=20_000, poll_cycles=16)
        assert int(dev.regs.MARK.read().value) == 2
        ctr = dev.counters()
        assert ctr["spec_misses"] == 1 and ctr["faults"] == 0
        assert ctr["spec_faults"] == kernel
        assert dev.read_window("GMEM", dst * wb, words * wb) == bytes(words * wb)


SCENARIOS += [branch_jump_switch, speculation_hit_publishes, speculation_miss_rolls_back,
              speculation_overflow_and_fault_roll_back]


# -- compute ------------------------------------------------------------------------------

def _lanes(words, wb):
    """int8 lanes of little-endian words, as an array of shape (words, wb)."""
    return np.frombuffer(words, dtype=np.int8).reshape(-1, wb)


def matmul_requant(dev):
    """A kernel loads int8 operands and int32 biases, multiplies on the MAC array and
    requantises into int8: bit-exact against kernels/arith, counted by the counters."""
    cfg = dev.config
    wb, R, C = cfg.word_bytes, cfg.rows, cfg.cols
    k = 24
    rng = np.random.default_rng(7)
    a = rng.integers(-128, 128, size=(k, wb), dtype=np.int8)
    b = rng.integers(-128, 128, size=(k, wb), dtype=np.int8)
    bias = rng.integers(-2**20, 2**20, size=R).astype(np.int32)
    bias_words = -(-4 * R // wb)
    gmem = a.tobytes() + b.tobytes() + bias.tobytes().ljust(bias_words * wb, b"\0")
    dev.write_window("GMEM", 0, gmem)
    out_at = len(gmem) // wb
    mult, shift, zp = 0x5A000000, 9, -3

    a_at, b_at, bias_at, res_at = 0, k + 1, 2 * k + 1, 2 * k + 1 + bias_words
    dev.set_partition(0, base=0, length=res_at + R)
    dev.load_kernel(0, [
        dma_load(gmem=0, spad=a_at, cols=k),
        dma_load(gmem=k, spad=b_at, cols=k, token=1),    # b one word off: other banks
        dma_load(gmem=2 * k, spad=bias_at, cols=bias_words, token=2),
        wait(0b100),
        acc_bias(bias_at),
        wait(0b011),
        matmul(a=a_at, b=b_at, k=k, accumulate=True),
        vcfg(VectorCfg.MULT_A, mult), vcfg(VectorCfg.SHIFT, shift),
        vcfg(VectorCfg.ZP_OUT, zp),
        requant(out=res_at),
        wait(compute=True),
        dma_store(gmem=out_at, spad=res_at, cols=R),
        ret(),
    ], part=0)
    dev.clear_counters()
    _run(dev, [call(0), done()])

    acc = bias[:, None].astype(np.int64) + a[:, :R].astype(np.int64).T @ b[:, :C].astype(np.int64)
    want, saturated = arith.requantize(acc, mult, shift, zp, -128, 127)
    got = _lanes(dev.read_window("GMEM", out_at * wb, R * wb), wb)
    assert np.array_equal(got[:, :C], want)
    assert not got[:, C:].any()
    ctr = dev.counters()
    assert ctr["macs"] == R * C * k
    assert ctr["saturations"] == int(saturated.sum())
    assert ctr["mac_busy"] >= k
    if not dev.config.traced:
        return
    (record,) = dev.read_trace()
    # The one call is all the compute unit did: its record counts the same cycles.
    assert (record.mac_busy, record.vec_busy) == (ctr["mac_busy"], ctr["vec_busy"])
    assert record.vec_busy > 0


def vector_flags_steer_the_plan(dev):
    """VCMP sets a flag that BRANCH tests; VARGMAX sets an index that SWITCH uses. On a
    tile without them (``TileConfig.decisions`` False) each is an illegal
    micro-instruction that writes nothing, and the flags and index registers stay 0;
    without ``pool_average`` so is an averaging VPOOL, and without ``word_ops`` every
    VADD, VPOOL and VCLAMP."""
    wb = dev.config.word_bytes
    lanes = np.array([3, -7, 25, 25, 9, -128, 0, 1] * (wb // 8), dtype=np.int8)
    dev.write_window("GMEM", 0, lanes.tobytes())
    dev.set_partition(0, base=0, length=4)
    decisions = [
        vcmp(addr=0, lane=7, op=CmpOp.GE, imm=20, flag=3, reduce=True),   # max 25 >= 20
        vcmp(addr=0, lane=1, op=CmpOp.LT, imm=-8, flag=4),                # -7 < -8: no
        vargmax(addr=0, n=8, index=1),                                    # lanes 2, 3: 2
    ]
    average = vpool(src=0, out=1, n=1, window=1, stride=1, step=1, average=True)
    words = [vadd(a=0, b=0, out=1, n=1), vpool(src=0, out=1, n=1, window=1, stride=1, step=1),
             vclamp(src=0, out=1, n=1, lo=0, hi=127)]
    left_out = (([] if dev.config.pool_average else [average]) +
                ([] if dev.config.decisions else decisions) +
                ([] if dev.config.word_ops else words))
    for instr in left_out:
        dev.load_kernel(0, [dma_load(gmem=0, spad=0), wait(), instr, ret()], part=0)
        err = _fault(dev, [call(0), done()])
        assert err.cause == FaultCause.ILLEGAL_MICRO and err.micro_pc == 2, (instr, err)
        assert err.addr == instr & 0xFFFF_FFFF
        dev.clear_fault()
    if not dev.config.decisions:
        assert int(dev.regs.FLAGS.read().flags) == 0
        assert all(int(dev.regs[f"INDEX[{i}]"].read().value) == 0 for i in range(INDEX_REGS))
        return
    dev.load_kernel(0, [dma_load(gmem=0, spad=0), wait(), *decisions, ret()], part=0)
    _run(dev, [
        call(0),
        branch(4, 6),                      # F4 = 0: not taken
        branch(3, 3),                      # F3 = 1: taken
        mark(0xBAD),
        switch(1, 7, 4),                   # X1 = 2: table entry 2 (pc 9)
        mark(0xBAD),
        mark(0xBAD),
        jump(10), jump(10), mark(0x600D), done(),   # table: 7, 8, 9, 10
        mark(0xBAD), done(),
    ])
    assert int(dev.regs.MARK.read().value) == 0x600D
    assert int(dev.regs.FLAGS.read().flags) & 0b11000 == 0b01000
    assert int(dev.regs["INDEX[1]"].read().value) == 2


def speculation_miss_on_vcmp(dev):
    """A VCMP that writes the guarded flag with the other value rolls back at once,
    mid-kernel: the rest of the kernel never runs and its stores never land."""
    wb = dev.config.word_bytes
    dev.write_window("GMEM", 0, bytes([5] * wb))
    dst = dev.config.gmem_words // 2
    dev.write_window("GMEM", dst * wb, bytes(wb))
    dev.set_partition(0, base=0, length=4)
    dev.load_kernel(0, [
        dma_load(gmem=0, spad=0), wait(),
        dma_store(gmem=dst, spad=0), wait(),          # staged, then discarded
        vcmp(addr=0, lane=0, op=CmpOp.GT, imm=10, flag=2),   # 5 > 10: F2 = 0, guess was 1
        wait(compute=True),                           # the miss lands while waiting here
        dma_store(gmem=dst, spad=0), wait(),          # never reached
        ret(),
    ], part=0)
    _load_speculative(dev, [assume(2, 0, expect=True), call(0), commit(), mark(1), done()],
                      [mark(2), done()])
    dev.clear_counters()
    dev.start()
    dev.wait_done(timeout_cycles=20_000, poll_cycles=16)
    assert int(dev.regs.MARK.read().value) == 2
    assert dev.read_window("GMEM", dst * wb, wb) == bytes(wb)
    ctr = dev.counters()
    assert ctr["spec_misses"] == 1 and ctr["micro_retired"] == 5


def speculation_on_vargmax_test(dev):
    """Per-sample routing, speculated: the plan guesses the expert of one sample (the
    argmax of its gate logits: one lane of n words, lanes carrying samples) and runs
    ahead; a column VARGMAX with a test writes the guarded flag. The right guess
    commits (the staged store is published); a wrong one misses at once, mid-kernel:
    the rest of the kernel never runs, its stores never land, and the tile continues in
    the other bank at the resume PC."""
    wb = dev.config.word_bytes
    experts, sample = 6, 3
    logits = np.random.default_rng(11).integers(-128, 128, size=(experts, wb), dtype=np.int8)
    logits[:, sample] = [-7, 20, -128, 45, 45, 3]     # a tie: the lowest expert, 3, wins
    logits[:, sample + 1] = 127                       # other samples do not matter
    dev.write_window("GMEM", 0, logits.tobytes())
    dst = dev.config.gmem_words // 2
    dev.set_partition(0, base=0, length=8)
    dev.load_kernel(1, [dma_store(gmem=dst + 2, spad=2), wait(), ret()], part=0)
    for guess, hit in ((3, True), (4, False)):
        dev.write_window("GMEM", dst * wb, bytes(3 * wb))
        dev.load_kernel(0, [
            dma_load(gmem=0, spad=0, cols=experts), wait(),
            dma_store(gmem=dst, spad=0), wait(),             # staged
            vargmax(addr=0, n=experts, index=2, lane=sample, flag=6, expect=guess),
            wait(compute=True),                              # a miss lands here
            dma_store(gmem=dst + 1, spad=1), wait(),
            ret(),
        ], part=0)
        home = _load_speculative(dev, [mark(0x5A), assume(6, 2), call(0), commit(), mark(1),
                                       done()],
                                 [mark(0xBAD), mark(0xBAD), call(1), mark(2), done()])
        dev.clear_counters()
        dev.start()
        dev.wait_done(timeout_cycles=20_000, poll_cycles=16)

        assert int(dev.regs["INDEX[2]"].read().value) == 3, "written either way"
        assert (int(dev.regs.FLAGS.read().flags) >> 6) & 1 == int(hit)
        ctr = dev.counters()
        stored = _words(dev.read_window("GMEM", dst * wb, 3 * wb), wb)
        status = dev.status()
        assert int(status.active_bank) == home and not int(status.speculating)
        if hit:
            assert int(dev.regs.MARK.read().value) == 1
            assert (ctr["spec_hits"], ctr["spec_misses"]) == (1, 0)
            assert stored == [logits[0].tobytes(), logits[1].tobytes(), bytes(wb)]
            assert int(status.exec_bank) == home
        else:
            assert int(dev.regs.MARK.read().value) == 2
            assert (ctr["spec_hits"], ctr["spec_misses"], ctr["faults"]) == (0, 1, 0)
            assert int(dev.regs.MISS_PC.read().pc) == 1
            assert stored == [bytes(wb), bytes(wb), logits[2].tobytes()], \
                "speculative stores discarded; the fallback's landed"
            assert int(status.exec_bank) == 1 - home
            assert ctr["micro_retired"] == 5 + 3, "the kernel stopped at the VARGMAX"


SCENARIOS += [matmul_requant, vector_flags_steer_the_plan, speculation_miss_on_vcmp,
              speculation_on_vargmax_test]
