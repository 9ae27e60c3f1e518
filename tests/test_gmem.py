# amaranth: UnusedElaboratable=no

import random

import pytest
from amaranth.back import verilog
from amaranth.hdl import Shape
from amaranth.sim import Simulator

from fusetile.hdl.gmem import GlobalMemory, GmemPortSignature
from fusetile.kernels.config import TileConfig

from wb_helpers import wb_read, wb_write


SMALL = TileConfig(gmem_bytes=1024)           # 128 words of 64 bits


def run(dut, bench, vcd=None):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


def test_config_checked():
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 3"):
        GlobalMemory(3)
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not None"):
        GmemPortSignature(None)


def dut_shape(sig, name):
    return Shape.cast(sig.members[name].shape).width


def test_signature():
    sig = GmemPortSignature(SMALL)
    assert sig == GmemPortSignature(SMALL)
    assert dut_shape(sig, "raddr") == 7
    assert dut_shape(sig, "rdata") == 64
    dut = GlobalMemory(SMALL)
    assert dut.bus.adr.shape().width == 18


@pytest.mark.parametrize("config", [SMALL, TileConfig(word_bytes=4, gmem_bytes=256),
                                    TileConfig(word_bytes=16, gmem_bytes=512)])
def test_host_round_trip(config):
    dut = GlobalMemory(config)
    host_words = config.gmem_bytes // 4
    rng = random.Random(1)

    async def bench(ctx):
        model = {}
        for _ in range(40):
            w = rng.randrange(host_words)
            v = rng.getrandbits(32)
            assert await wb_write(ctx, dut.bus, w, v) == "ack"
            model[w] = v
        for w, v in model.items():
            assert await wb_read(ctx, dut.bus, w) == (v, "ack")
        # Byte lanes: only the selected bytes change.
        assert await wb_write(ctx, dut.bus, 3, 0x11223344) == "ack"
        assert await wb_write(ctx, dut.bus, 3, 0xAABBCCDD, sel=0b0101) == "ack"
        assert await wb_read(ctx, dut.bus, 3) == (0x11BB33DD, "ack")
        assert await wb_write(ctx, dut.bus, 3, 0xEEFF0000, sel=0b1000) == "ack"
        assert await wb_read(ctx, dut.bus, 3) == (0xEEBB33DD, "ack")
        # Beyond gmem_bytes: ERR, both ways; memory unchanged (it would alias word 0).
        assert await wb_write(ctx, dut.bus, 0, 0x12345678) == "ack"
        for w in (host_words, host_words + 1, (1 << 18) - 1):
            assert await wb_write(ctx, dut.bus, w, 0xDEADBEEF) == "err"
            assert (await wb_read(ctx, dut.bus, w))[1] == "err"
        assert await wb_read(ctx, dut.bus, 0) == (0x12345678, "ack")

    run(dut, bench)


def test_answer_timing():
    """ACK exactly one cycle after STB, once, even with STB held high."""
    dut = GlobalMemory(SMALL)

    async def bench(ctx):
        bus = dut.bus
        ctx.set(bus.cyc, 1); ctx.set(bus.stb, 1); ctx.set(bus.adr, 5)
        assert not ctx.get(bus.ack)
        await ctx.tick()
        assert ctx.get(bus.ack) and not ctx.get(bus.err)
        await ctx.tick()         # stb still high in the ack cycle: ignored
        assert not ctx.get(bus.ack)
        await ctx.tick()         # ...then seen again as the next access
        assert ctx.get(bus.ack)
        ctx.set(bus.stb, 0)
        await ctx.tick()
        assert not ctx.get(bus.ack)
        await ctx.tick()
        assert not ctx.get(bus.ack)

    run(dut, bench)


def test_little_endian_and_dma_port():
    dut = GlobalMemory(SMALL)

    async def bench(ctx):
        # Host writes word 2 of GMEM as two 32-bit halves, LSW at the lower address.
        assert await wb_write(ctx, dut.bus, 4, 0x03020100) == "ack"
        assert await wb_write(ctx, dut.bus, 5, 0x07060504) == "ack"
        ctx.set(dut.dma.raddr, 2)
        ctx.set(dut.dma.re, 1)
        await ctx.tick()
        ctx.set(dut.dma.re, 0)
        assert ctx.get(dut.dma.rdata) == 0x0706050403020100
        # DMA write seen by the host; a DMA read and write in the same cycle.
        ctx.set(dut.dma.waddr, 127)
        ctx.set(dut.dma.wdata, 0xCAFEF00D_12345678)
        ctx.set(dut.dma.we, 1)
        ctx.set(dut.dma.raddr, 2)
        ctx.set(dut.dma.re, 1)
        await ctx.tick()
        ctx.set(dut.dma.we, 0)
        ctx.set(dut.dma.re, 0)
        assert ctx.get(dut.dma.rdata) == 0x0706050403020100
        assert await wb_read(ctx, dut.bus, 254) == (0x12345678, "ack")
        assert await wb_read(ctx, dut.bus, 255) == (0xCAFEF00D, "ack")
        # A DMA read the cycle after a write sees the new data.
        ctx.set(dut.dma.raddr, 127)
        ctx.set(dut.dma.re, 1)
        await ctx.tick()
        ctx.set(dut.dma.re, 0)
        assert ctx.get(dut.dma.rdata) == 0xCAFEF00D_12345678

    run(dut, bench)


def test_verilog():
    text = verilog.convert(GlobalMemory(SMALL), name="gmem")
    assert "module gmem" in text
