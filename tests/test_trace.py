import random

from wb_helpers import raises_in_constructor
from amaranth.sim import Simulator

from fusetile.hdl.trace import TraceFifo, TRACE_WORDS
from fusetile.kernels.isa import TraceRecord


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def make_record(i):
    return {"slot": i % 16, "pc": i, "start": 1000 + i, "cycles": 7 * i,
            "dma_busy": i, "bytes_in": 8 * i, "bytes_out": 16 * i}


async def push(ctx, dut, fields):
    """Push a record; it is in the FIFO when this returns (a cycle after the push)."""
    ctx.set(dut.record, TraceRecord.const(fields))
    ctx.set(dut.push, 1)
    await ctx.tick()
    ctx.set(dut.push, 0)
    ctx.set(dut.record, TraceRecord.const(make_record(99)))   # registered with the push
    await ctx.tick()


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


def test_records_in_order_and_level():
    dut = TraceFifo(4)

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


def test_push_written_a_cycle_later_and_clear_drops_it():
    dut = TraceFifo(4)

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


def test_full_fifo_drops_and_counts():
    dut = TraceFifo(4)

    async def bench(ctx):
        for i in range(6):
            await push(ctx, dut, make_record(i))
        assert ctx.get(dut.level) == 4
        assert ctx.get(dut.dropped) == 2
        for i in range(4):
            assert (await read_record(ctx, dut)).pc == i

    run(dut, bench)


def test_push_while_draining():
    dut = TraceFifo(8)
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


def test_depth_checked():
    raises_in_constructor(ValueError, "depth must be a power of two >= 2, not 3", TraceFifo, 3)
