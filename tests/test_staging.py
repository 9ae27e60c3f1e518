"""The speculation staging buffer (``hdl/staging.py``) on its own: speculative stores
held back, published in order, and a publish that shares GMEM's DMA side with reads."""

import dataclasses
import random
from types import SimpleNamespace

import pytest
from amaranth.sim import Simulator

from fusetile.hdl.staging import StagingBuffer
from fusetile.kernels.config import TileConfig


CONFIG = TileConfig(gmem_bytes=1024, staging_words=8)

# Each behaviour of both builds: the entry registered for a fast clock, and built for
# area (compact) the block RAM's output held instead.
BUILDS = pytest.mark.parametrize("config", [CONFIG, dataclasses.replace(CONFIG, compact=True)],
                                 ids=["deep", "compact"])


async def stage(ctx, dut, addrs):
    """Speculative DMA writes of ``addrs`` (the data: each address times 3), one a
    cycle; speculation ends with the last."""
    ctx.set(dut.speculate, 1)
    for addr in addrs:
        ctx.set(dut.dma.waddr, addr)
        ctx.set(dut.dma.wdata, addr * 3)
        ctx.set(dut.dma.we, 1)
        await ctx.tick()
    ctx.set(dut.dma.we, 0)
    ctx.set(dut.speculate, 0)


def run(bench, config):
    """Run ``bench(ctx, dut, seen)`` on a fresh buffer built for ``config`` and watch
    its GMEM side in ``seen`` (returned): the ``writes`` that reached GMEM (cycle,
    addr, data), the cycles of DMA ``reading`` and those with ``draining`` high. Every
    write claims the port."""
    dut = StagingBuffer(config)
    seen = SimpleNamespace(writes=[], reading=[], draining=[])

    async def monitor(ctx):
        cycle = 0
        async for _, _, we, waddr, wdata, re, claim, busy in ctx.tick().sample(
                dut.gmem.we, dut.gmem.waddr, dut.gmem.wdata, dut.gmem.re, dut.gmem.wclaim,
                dut.draining):
            if we:
                assert claim
                seen.writes.append((cycle, waddr, wdata))
            if re:
                seen.reading.append(cycle)
            if busy:
                seen.draining.append(cycle)
            cycle += 1

    async def testbench(ctx):
        await bench(ctx, dut, seen)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(monitor, background=True)
    sim.add_testbench(testbench)
    sim.run()
    return seen


@BUILDS
def test_publish_waits_for_dma_reads(config):
    """Two speculative stores reach GMEM only on publish, in order, and never in a
    cycle in which the DMA engine reads GMEM (the port reads or writes, not both)."""
    async def bench(ctx, dut, seen):
        ctx.set(dut.speculate, 1)
        for addr, data in ((5, 0x55), (9, 0x99)):
            ctx.set(dut.dma.waddr, addr)
            ctx.set(dut.dma.wdata, data)
            ctx.set(dut.dma.we, 1)
            await ctx.tick()
        ctx.set(dut.dma.we, 0)
        ctx.set(dut.speculate, 0)
        await ctx.tick().repeat(3)
        assert seen.writes == [] and ctx.get(dut.level) == 2
        # Publish while the DMA engine reads for 5 cycles.
        ctx.set(dut.publish, 1)
        ctx.set(dut.dma.re, 1)
        ctx.set(dut.dma.raddr, 3)
        await ctx.tick()
        ctx.set(dut.publish, 0)
        await ctx.tick().repeat(4)
        assert ctx.get(dut.draining) and seen.writes == []
        ctx.set(dut.dma.re, 0)
        for _ in range(10):
            await ctx.tick()
            if not ctx.get(dut.draining):
                break
        assert not ctx.get(dut.draining) and ctx.get(dut.level) == 0

    seen = run(bench, config)
    assert [(a, d) for _, a, d in seen.writes] == [(5, 0x55), (9, 0x99)]
    assert seen.writes[0][0] > seen.reading[-1]     # nothing before the reads ended
    assert not {c for c, _, _ in seen.writes} & set(seen.reading)


@BUILDS
def test_discard_the_cycle_after_publish_writes_nothing(config):
    """The control unit publishes at COMMIT whatever else its cycle decides, and a
    fault or miss in that cycle discards the buffer a cycle later: no staged word
    reaches GMEM, and the buffer is empty and idle after."""
    async def bench(ctx, dut, seen):
        await stage(ctx, dut, (5, 9, 12))
        ctx.set(dut.publish, 1)
        await ctx.tick()
        ctx.set(dut.publish, 0)
        ctx.set(dut.discard, 1)
        assert ctx.get(dut.draining)
        await ctx.tick()
        ctx.set(dut.discard, 0)
        await ctx.tick().repeat(6)
        assert not ctx.get(dut.draining) and ctx.get(dut.level) == 0
        assert not ctx.get(dut.overflow)

    assert run(bench, config).writes == []


@BUILDS
def test_drain_takes_two_cycles_a_word_and_one_more(config):
    """With no DMA reads, ``n`` staged words drain in ``2 n + 1`` cycles: each entry is
    read, registered, then written (the next one read with the write), so the first
    write comes three cycles after the publish and the rest every other cycle."""
    async def bench(ctx, dut, seen):
        await stage(ctx, dut, (5, 9, 12))
        ctx.set(dut.publish, 1)          # in cycle 3
        await ctx.tick()
        ctx.set(dut.publish, 0)
        await ctx.tick().repeat(12)

    seen = run(bench, config)
    assert [(c, a) for c, a, _ in seen.writes] == [(6, 5), (8, 9), (10, 12)]
    assert seen.draining == list(range(4, 4 + 2 * 3 + 1))


@BUILDS
def test_reads_at_any_cycle_of_a_drain_delay_it_and_lose_nothing(config):
    """DMA reads in any pattern during a drain of a full buffer: each read holds the
    next write back, and every staged word still reaches GMEM once, in order, with its
    data. (The buffer reads its next entry while it holds one, written or not.)"""
    rng = random.Random(45)
    addrs = list(range(40, 40 + CONFIG.staging_words))
    for _ in range(6):
        pattern = [rng.random() < 0.5 for _ in range(40)]

        async def bench(ctx, dut, seen):
            await stage(ctx, dut, addrs)
            ctx.set(dut.publish, 1)
            await ctx.tick()
            ctx.set(dut.publish, 0)
            for read in pattern:
                ctx.set(dut.dma.re, read)
                await ctx.tick()
            ctx.set(dut.dma.re, 0)
            await ctx.tick().repeat(2 * len(addrs) + 2)
            assert not ctx.get(dut.draining) and ctx.get(dut.level) == 0

        seen = run(bench, config)
        assert [(a, d) for _, a, d in seen.writes] == [(a, a * 3) for a in addrs]
        assert not {c for c, _, _ in seen.writes} & set(seen.reading)


@BUILDS
def test_a_second_region_publishes_from_its_first_entry(config):
    """Regions back to back in one buffer: one published, one discarded half-way
    through its drain, one published. Each publish starts from the first entry (a
    drain's end and a discard leave the buffer's read position at it), so only the
    first and last regions' words reach GMEM, each once and in order."""
    first, second, third = (5, 9, 12), (20, 21, 22, 23), (30, 31)

    async def bench(ctx, dut, seen):
        for addrs, discard_after in ((first, None), (second, 4), (third, None)):
            await stage(ctx, dut, addrs)
            ctx.set(dut.publish, 1)
            await ctx.tick()
            ctx.set(dut.publish, 0)
            if discard_after is not None:
                await ctx.tick().repeat(discard_after)     # two words written
                ctx.set(dut.discard, 1)
                await ctx.tick()
                ctx.set(dut.discard, 0)
            await ctx.tick().repeat(2 * len(addrs) + 2)
            assert not ctx.get(dut.draining) and ctx.get(dut.level) == 0

    writes = [(a, d) for _, a, d in run(bench, config).writes]
    assert writes == [(a, a * 3) for a in (*first, 20, 21, *third)]
