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


@pytest.mark.parametrize("ports", GlobalMemory.PORTS)
@pytest.mark.parametrize("config", [SMALL, TileConfig(word_bytes=4, gmem_bytes=256),
                                    TileConfig(word_bytes=16, gmem_bytes=512)])
def test_host_round_trip(config, ports):
    dut = GlobalMemory(config, ports=ports)
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
    """A write is ACKed exactly one cycle after STB, a read two (its word registered),
    once each, even with STB held high."""
    dut = GlobalMemory(SMALL)

    async def bench(ctx):
        bus = dut.bus
        ctx.set(bus.cyc, 1); ctx.set(bus.stb, 1); ctx.set(bus.adr, 5)
        ctx.set(bus.we, 1); ctx.set(bus.sel, 0xF); ctx.set(bus.dat_w, 0x5EED)
        assert not ctx.get(bus.ack)
        await ctx.tick()
        assert ctx.get(bus.ack) and not ctx.get(bus.err)
        ctx.set(bus.we, 0)
        await ctx.tick()         # stb still high in the ack cycle: ignored
        assert not ctx.get(bus.ack)
        await ctx.tick()         # ...then seen again, as a read: its word comes out
        assert not ctx.get(bus.ack)
        await ctx.tick()         # ...and is answered
        assert ctx.get(bus.ack) and ctx.get(bus.dat_r) == 0x5EED
        ctx.set(bus.stb, 0)
        await ctx.tick()
        assert not ctx.get(bus.ack)
        await ctx.tick()
        assert not ctx.get(bus.ack)

    run(dut, bench)


@pytest.mark.parametrize("ports", GlobalMemory.PORTS)
def test_little_endian_and_dma_port(ports):
    dut = GlobalMemory(SMALL, ports=ports)

    async def bench(ctx):
        # Host writes word 2 of GMEM as two 32-bit halves, LSW at the lower address.
        assert await wb_write(ctx, dut.bus, 4, 0x03020100) == "ack"
        assert await wb_write(ctx, dut.bus, 5, 0x07060504) == "ack"
        ctx.set(dut.dma.raddr, 2)
        ctx.set(dut.dma.re, 1)
        await ctx.tick()
        ctx.set(dut.dma.re, 0)
        assert ctx.get(dut.dma.rdata) == 0x0706050403020100
        # DMA write seen by the host.
        ctx.set(dut.dma.waddr, 127)
        ctx.set(dut.dma.wdata, 0xCAFEF00D_12345678)
        ctx.set(dut.dma.we, 1)
        ctx.set(dut.dma.wclaim, 1)
        await ctx.tick()
        ctx.set(dut.dma.we, 0)
        ctx.set(dut.dma.wclaim, 0)
        assert await wb_read(ctx, dut.bus, 254) == (0x12345678, "ack")
        assert await wb_read(ctx, dut.bus, 255) == (0xCAFEF00D, "ack")
        # A DMA read the cycle after a write sees the new data.
        ctx.set(dut.dma.raddr, 127)
        ctx.set(dut.dma.re, 1)
        await ctx.tick()
        ctx.set(dut.dma.re, 0)
        assert ctx.get(dut.dma.rdata) == 0xCAFEF00D_12345678

    run(dut, bench)


@pytest.mark.parametrize("write", [False, True])
@pytest.mark.parametrize("ports", GlobalMemory.PORTS)
def test_host_waits_only_for_a_shared_port(ports, write):
    """With a port each, a host access is answered one cycle after STB even while the
    DMA side is busy. With shared ports or a single port, the host waits while the DMA
    side reads or writes (so that no word is taken from a read that met a write), with
    shared ports for the DMA side's last posted write too."""
    dut = GlobalMemory(SMALL, ports=ports)
    busy = 6

    async def bench(ctx):
        bus = dut.bus
        assert await wb_write(ctx, bus, 8, 0x600DF00D) == "ack"
        for host_writes in (False, True):
            ctx.set(bus.cyc, 1); ctx.set(bus.stb, 1); ctx.set(bus.adr, 8)
            ctx.set(bus.we, host_writes); ctx.set(bus.sel, 0xF)
            ctx.set(bus.dat_w, 0x600DF00D)
            # The DMA side starts in the same cycle as the host's access.
            dma_side = [dut.dma.we, dut.dma.wclaim] if write else [dut.dma.re]
            for s in dma_side:
                ctx.set(s, 1)
            if write:
                ctx.set(dut.dma.waddr, 1)
            waited = 0
            while True:
                await ctx.tick()
                waited += 1
                if waited == busy:
                    for s in dma_side:
                        ctx.set(s, 0)
                if ctx.get(bus.ack):
                    break
                assert waited < 3 * busy
            ctx.set(bus.cyc, 0); ctx.set(bus.stb, 0)
            for s in dma_side:
                ctx.set(s, 0)
            waits = ports != "dual"
            # Shared ports post their writes: the host waits for the last to land.
            posted = ports == "shared" and write
            assert waited == (busy + 1 + posted if waits else 1) + (not host_writes)
            if not host_writes:
                assert ctx.get(bus.dat_r) == 0x600DF00D
            await ctx.tick().repeat(busy)
        assert await wb_read(ctx, bus, 8) == (0x600DF00D, "ack")

    run(dut, bench)


@pytest.mark.parametrize("ports", GlobalMemory.PORTS)
def test_read_the_cycle_after_a_write(ports):
    """Shared ports post their writes: a DMA read in the cycle after a DMA write of the
    same word returns the old word, one a cycle later the new one. The other ways
    write at once."""
    dut = GlobalMemory(SMALL, ports=ports)

    async def bench(ctx):
        for value in (0x1111, 0x2222):
            ctx.set(dut.dma.waddr, 9)
            ctx.set(dut.dma.wdata, value)
            ctx.set(dut.dma.we, 1)
            ctx.set(dut.dma.wclaim, 1)
            await ctx.tick()
            ctx.set(dut.dma.we, 0)
            ctx.set(dut.dma.wclaim, 0)
            ctx.set(dut.dma.raddr, 9)
            ctx.set(dut.dma.re, 1)
            await ctx.tick()
            old = 0 if value == 0x1111 else 0x1111
            assert ctx.get(dut.dma.rdata) == (old if ports == "shared" else value)
            await ctx.tick()
            ctx.set(dut.dma.re, 0)
            assert ctx.get(dut.dma.rdata) == value

    run(dut, bench)


@pytest.mark.parametrize("ports", ["shared", "single"])
def test_cancelled_dma_write_holds_the_host_write_and_writes_nothing(ports):
    """A DMA write claimed and cancelled (``wclaim`` without ``we``, an abort's cycle):
    a host write waits for the claim to go, then writes its own data where it asked;
    the DMA's word is written nowhere."""
    dut = GlobalMemory(SMALL, ports=ports)

    async def bench(ctx):
        bus = dut.bus
        ctx.set(dut.dma.waddr, 3)
        ctx.set(dut.dma.wdata, 0xBAD0BAD0_BAD0BAD0)
        ctx.set(dut.dma.wclaim, 1)
        ctx.set(bus.cyc, 1); ctx.set(bus.stb, 1); ctx.set(bus.adr, 8)
        ctx.set(bus.we, 1); ctx.set(bus.sel, 0xF); ctx.set(bus.dat_w, 0x600DF00D)
        for _ in range(3):
            await ctx.tick()
            assert not ctx.get(bus.ack)
        ctx.set(dut.dma.wclaim, 0)
        await ctx.tick()
        assert ctx.get(bus.ack)
        ctx.set(bus.cyc, 0); ctx.set(bus.stb, 0)
        await ctx.tick()
        assert await wb_read(ctx, bus, 8) == (0x600DF00D, "ack")
        assert await wb_read(ctx, bus, 6) == (0, "ack")
        assert await wb_read(ctx, bus, 7) == (0, "ack")

    run(dut, bench)


def test_ports_checked():
    with pytest.raises(ValueError, match=r"ports must be one of dual, shared, single, "
                                         r"not 'two'"):
        GlobalMemory(SMALL, ports="two")


def test_single_port_in_spram():
    """Built for an iCE40UP, a single-port GMEM is SB_SPRAM256KA blocks: 16-bit slices
    side by side, 16K-word banks one above the other, four at most."""
    from amaranth.back import rtlil
    from amaranth_boards.icebreaker import ICEBreakerPlatform
    from fusetile.hdl.single_port_ram import SinglePortRam, spram_blocks, uses_spram

    platform = ICEBreakerPlatform()
    assert uses_spram(platform) and not uses_spram(None)
    config = TileConfig(word_bytes=4, gmem_bytes=128 * 1024)
    text = rtlil.convert(GlobalMemory(config, ports="single"), platform=platform)
    assert text.count("cell \\SB_SPRAM256KA") == 4
    assert spram_blocks(32, 32768) == 4 and spram_blocks(64, 100) == 4
    assert spram_blocks(32, 16385) == 4 and spram_blocks(16, 16384) == 1
    too_big = GlobalMemory(TileConfig(word_bytes=8, gmem_bytes=256 * 1024), ports="single")
    with pytest.raises(ValueError, match=r"32768 words of 64 bits need 8 SPRAM blocks; "
                                         r"iCE40UP5K has 4"):
        rtlil.convert(too_big, platform=platform)
    with pytest.raises(ValueError, match=r"width must be a positive multiple of 16, not 8"):
        SinglePortRam(8, 16)


def test_verilog():
    text = verilog.convert(GlobalMemory(SMALL), name="gmem")
    assert "module gmem" in text
