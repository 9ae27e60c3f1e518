# amaranth: UnusedElaboratable=no

import random

import pytest
from amaranth.back import verilog
from amaranth.sim import Simulator

from fusetile.hdl.scratchpad import Scratchpad, SpadPortSignature
from fusetile.kernels.config import TileConfig


CFG = TileConfig(spad_banks=4, spad_bank_words=16, partitions=4)     # 64 words


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def set_table(ctx, dut, table):
    for i, (base, length) in enumerate(table):
        ctx.set(dut.part_base[i], base)
        ctx.set(dut.part_len[i], length)


async def access(ctx, dut, part, offset, data=None):
    """One access; return (fault, performed read/write pulses, read data or None)."""
    port = dut.dma
    ctx.set(port.part, part)
    ctx.set(port.offset, offset)
    ctx.set(port.we, data is not None)
    ctx.set(port.wdata, data or 0)
    ctx.set(port.en, 1)
    fault = ctx.get(port.fault)
    pulses = (ctx.get(dut.reads), ctx.get(dut.writes))
    await ctx.tick()
    ctx.set(port.en, 0)
    return fault, pulses, ctx.get(port.rdata)


def test_config_checked():
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 4"):
        Scratchpad(4)
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 4"):
        SpadPortSignature(4)


def test_ports():
    dut = Scratchpad(CFG)
    assert len(dut.part_base.as_value()) == 16 * CFG.partitions
    assert len(dut.dma.rdata) == CFG.word_bits
    assert Scratchpad.PORTS == ("dma",)


@pytest.mark.parametrize("config", [CFG, TileConfig(spad_banks=3, spad_bank_words=10,
                                                    partitions=2, word_bytes=4)])
def test_round_trip_and_interleaving(config):
    dut = Scratchpad(config)
    words = config.spad_words
    rng = random.Random(5)

    async def bench(ctx):
        # One partition over the whole scratchpad, one over its second half.
        set_table(ctx, dut, [(0, words), (words // 2, words - words // 2)])
        model = [rng.getrandbits(config.word_bits) for _ in range(words)]
        for w, v in enumerate(model):
            assert (await access(ctx, dut, 0, w, v))[:2] == (0, (0, 1))
        for w in rng.sample(range(words), words):
            fault, pulses, data = await access(ctx, dut, 0, w)
            assert (fault, pulses, data) == (0, (1, 0), model[w])
        for off in range(words - words // 2):
            assert (await access(ctx, dut, 1, off))[2] == model[words // 2 + off]

    run(dut, bench)


def test_bank_mapping():
    """Word w is in bank w % banks at row w // banks."""
    dut = Scratchpad(CFG)
    # Elaborate once ourselves so the testbench can look into the bank memories.
    top = dut.elaborate(None)
    banks = [getattr(top.submodules, f"bank{b}") for b in range(CFG.spad_banks)]

    async def bench(ctx):
        set_table(ctx, dut, [(8, CFG.spad_words - 8)])
        for off in range(CFG.spad_words - 8):
            await access(ctx, dut, 0, off, 1000 + off)
        for w in range(8, CFG.spad_words):
            assert ctx.get(banks[w % 4].data[w // 4]) == 1000 + w - 8

    run(top, bench)


def test_partition_faults():
    dut = Scratchpad(CFG)

    async def bench(ctx):
        # Partition 0: words 0..15; 1: 16..39; 2: 40..63 but claims 40 words (past the
        # end of the scratchpad); 3: empty.
        set_table(ctx, dut, [(0, 16), (16, 24), (40, 40), (0, 0)])
        for w in range(CFG.spad_words):
            await access(ctx, dut, 0 if w < 16 else 1 if w < 40 else 2,
                         w if w < 16 else w - 16 if w < 40 else w - 40, w)
        faulting = [
            (0, 16),          # offset >= length
            (1, 24),
            (1, 0xFFFF),
            (2, 24),          # within length, base + offset beyond the scratchpad
            (2, 39),
            (3, 0),           # empty partition
            (4, 0),           # part >= partitions
            (15, 0),
        ]
        for part, off in faulting:
            for data in (None, 0xDEAD):
                fault, pulses, _ = await access(ctx, dut, part, off, data)
                assert (fault, pulses) == (1, (0, 0)), (part, off, data)
        # Nothing was written: every word still holds its index.
        set_table(ctx, dut, [(0, 64)])
        for w in range(CFG.spad_words):
            assert (await access(ctx, dut, 0, w))[2] == w
        # No fault without en.
        ctx.set(dut.dma.part, 9)
        ctx.set(dut.dma.en, 0)
        assert not ctx.get(dut.dma.fault)

    run(dut, bench)


def test_read_after_write_and_latency():
    dut = Scratchpad(CFG)

    async def bench(ctx):
        set_table(ctx, dut, [(5, 20)])
        port = dut.dma
        # Back to back: write 3, read 3, write 4, read 4 in consecutive cycles.
        for off, v in ((3, 111), (4, 222)):
            ctx.set(port.part, 0); ctx.set(port.offset, off)
            ctx.set(port.en, 1); ctx.set(port.we, 1); ctx.set(port.wdata, v)
            await ctx.tick()
            ctx.set(port.we, 0)
            await ctx.tick()
            assert ctx.get(port.rdata) == v
        # Streaming reads: one per cycle, each data a cycle after its address.
        ctx.set(port.offset, 3)
        await ctx.tick()
        ctx.set(port.offset, 4)
        assert ctx.get(port.rdata) == 111
        await ctx.tick()
        ctx.set(port.en, 0)
        assert ctx.get(port.rdata) == 222

    run(dut, bench)


def test_verilog():
    verilog.convert(Scratchpad(CFG), name="scratchpad")
    verilog.convert(Scratchpad(TileConfig(spad_banks=3, spad_bank_words=7)), name="spad3")
