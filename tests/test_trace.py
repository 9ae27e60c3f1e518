import random

import pytest
from wb_helpers import raises_in_constructor
from amaranth.sim import Simulator

from fusetile.hdl.trace import PUSH_SPACING, TraceFifo, TRACE_WORDS
from fusetile.kernels.isa import TraceRecord


# A record per memory word, or written over two or four cycles; from a copy of the
# record, or from the record held still (`compact`).
WIDTHS = pytest.mark.parametrize("width", TraceFifo.WIDTHS)
BUILDS = pytest.mark.parametrize("compact", (False, True), ids=("deep", "compact"))

#: Cycles the control unit built for area holds a pushed record still: the push's and
#: two more (TraceFifo's `compact`).
HELD = 3


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def make_record(i):
    return {"slot": i % 16, "pc": i, "start": 1000 + i, "cycles": 7 * i,
            "dma_busy": i, "bytes_in": 8 * i, "bytes_out": 16 * i}


async def push(ctx, dut, fields, cycles=PUSH_SPACING + 1):
    """Push a record and wait ``cycles`` cycles (it is in the FIFO a cycle after the
    push; the next push comes after ``cycles``). The record then changes: at once
    (the FIFO registered it with the push), or, for a ``compact`` FIFO, its first 64
    bits at once and the statistics after :data:`HELD` cycles (with fewer
    ``cycles``, they stay until the next push), as the control unit's do."""
    ctx.set(dut.record, TraceRecord.const(fields))
    ctx.set(dut.push, 1)
    await ctx.tick()
    ctx.set(dut.push, 0)
    held = HELD - 1 if dut.compact else 0
    if held:
        ctx.set(dut.record, TraceRecord.const({**fields, **{
            name: value for name, value in make_record(99).items()
            if name in ("slot", "pc", "start")}, "bank": 1, "faulted": 1}))
    for cycle in range(1, cycles):
        if cycle == held + 1:
            ctx.set(dut.record, TraceRecord.const(make_record(99)))
        await ctx.tick()
    if cycles == held + 1:
        ctx.set(dut.record, TraceRecord.const(make_record(99)))


def raw(fields):
    return TraceRecord.const(fields).as_value().value


async def read_record(ctx, dut):
    words = []
    for _ in range(TRACE_WORDS):
        await ctx.tick()          # the CSR bank reads at least one cycle apart
        words.append(ctx.get(dut.data))
        ctx.set(dut.read, 1)
        await ctx.tick()
        ctx.set(dut.read, 0)
    raw = sum(w << (32 * i) for i, w in enumerate(words))
    return TraceRecord.from_bits(raw)


@BUILDS
@WIDTHS
def test_records_in_order_and_level(width, compact):
    dut = TraceFifo(4, width=width, compact=compact)

    async def bench(ctx):
        assert ctx.get(dut.level) == 0
        assert ctx.get(dut.data) == 0
        for i in range(3):
            await push(ctx, dut, make_record(i))
        assert ctx.get(dut.level) == 3
        for i in range(3):
            rec = await read_record(ctx, dut)
            assert rec.pc == i and rec.cycles == 7 * i and rec.bytes_out == 16 * i
        assert ctx.get(dut.level) == 0

    run(dut, bench)


@BUILDS
@WIDTHS
def test_push_written_a_cycle_later_and_clear_drops_it(width, compact):
    dut = TraceFifo(4, width=width, compact=compact)

    async def bench(ctx):
        ctx.set(dut.record, TraceRecord.const(make_record(1)))
        ctx.set(dut.push, 1)
        await ctx.tick()
        ctx.set(dut.push, 0)
        assert ctx.get(dut.level) == 0
        await ctx.tick()
        assert ctx.get(dut.level) == 1
        # A push in the cycle of a clear is dropped with the rest.
        ctx.set(dut.push, 1)
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.push, 0)
        ctx.set(dut.clear, 0)
        await ctx.tick().repeat(2)
        assert ctx.get(dut.level) == 0 and ctx.get(dut.dropped) == 0
        await push(ctx, dut, make_record(2))
        assert (await read_record(ctx, dut)).pc == 2

    run(dut, bench)


@BUILDS
@WIDTHS
def test_full_fifo_drops_and_counts(width, compact):
    dut = TraceFifo(4, width=width, compact=compact)

    async def bench(ctx):
        for i in range(6):
            await push(ctx, dut, make_record(i))
        assert ctx.get(dut.level) == 4
        assert ctx.get(dut.dropped) == 2
        for i in range(4):
            assert (await read_record(ctx, dut)).pc == i

    run(dut, bench)


@BUILDS
@WIDTHS
def test_push_while_draining(width, compact):
    dut = TraceFifo(8, width=width, compact=compact)
    rng = random.Random(1)

    async def bench(ctx):
        pushed = popped = 0
        while popped < 20:
            if pushed < 20 and ctx.get(dut.level) < 8 and rng.random() < 0.5:
                await push(ctx, dut, make_record(pushed))
                pushed += 1
            elif ctx.get(dut.level):
                assert (await read_record(ctx, dut)).pc == popped
                popped += 1
            else:
                await ctx.tick()

    run(dut, bench)


@BUILDS
@WIDTHS
def test_records_as_close_as_the_control_unit_pushes_them(width, compact):
    """Records as close as calls return (every 4 cycles) or are cut short (3; with
    four beats the last beat of a record then waits for the next to start), each read
    from the second cycle after its push (``data`` is registered: a host that has seen
    the record in ``level`` reads it later still) at the CSR bank's fastest (a word
    sampled two cycles after the last read's strobe): every word is the record's. A
    clear while a record is written drops it."""
    dut = TraceFifo(8, width=width, compact=compact)

    async def bench(ctx):
        gaps = (4, 3, 4, 4, 5, 3, 6)
        for i, gap in enumerate(gaps):
            await push(ctx, dut, make_record(i), gap)
        assert ctx.get(dut.level) == len(gaps) and ctx.get(dut.dropped) == 0
        for i in range(len(gaps)):
            assert (await read_record(ctx, dut)).as_value().value == raw(make_record(i))
        for i in (7, 8):
            await push(ctx, dut, make_record(i), 2)
            assert (await read_record(ctx, dut)).as_value().value == raw(make_record(i))
        for i in (10, 11):
            await push(ctx, dut, make_record(i), 3)
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        await ctx.tick().repeat(6)
        assert ctx.get(dut.level) == 0
        await push(ctx, dut, make_record(12))
        assert (await read_record(ctx, dut)).pc == 12

    run(dut, bench)


@BUILDS
@WIDTHS
def test_record_that_comes_too_early_is_dropped(width, compact):
    """Two records 3 cycles after the ones before: with four beats the second finds
    two beats of the one before still to write and is dropped and counted (the
    FIFO's documented limit); fewer beats keep up."""
    dut = TraceFifo(8, width=width, compact=compact)

    async def bench(ctx):
        for i, gap in enumerate((3, 3, 8)):
            await push(ctx, dut, make_record(i), gap)
        kept = [0, 1] if width == 64 else [0, 1, 2]
        assert ctx.get(dut.level) == len(kept)
        assert ctx.get(dut.dropped) == 3 - len(kept)
        for i in kept:
            assert (await read_record(ctx, dut)).as_value().value == raw(make_record(i))

    run(dut, bench)


def test_depth_and_width_checked():
    raises_in_constructor(ValueError, "depth must be a power of two >= 2, not 3", TraceFifo, 3)
    raises_in_constructor(ValueError, "width must be one of 256, 128, 64, not 32",
                          TraceFifo, 4, width=32)
