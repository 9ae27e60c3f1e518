import pytest

from amaranth.hdl import Array, Elaboratable, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from fusetile.hdl import wishbone
from fusetile.hdl.wishbone import Decoder

from wb_helpers import raises_in_constructor, wb_read, wb_write


class FakeRam(wiring.Component):
    """A tiny Wishbone RAM: registered answer after ``latency`` cycles; writes to word 0
    are answered with ERR when ``err_word0`` (to see a slave's ERR go through)."""

    def __init__(self, addr_width, *, latency=1, err_word0=False):
        self.words = Array(Signal(32, name=f"word{i}") for i in range(1 << addr_width))
        self.latency = latency
        self.err_word0 = err_word0
        self.accesses = Signal(8)
        super().__init__({"bus": In(wishbone.Signature(addr_width=addr_width))})

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        wait = Signal(range(self.latency + 1))
        m.d.sync += [bus.ack.eq(0), bus.err.eq(0)]
        with m.If(bus.cyc & bus.stb & ~bus.ack & ~bus.err):
            with m.If(wait + 1 < self.latency):
                m.d.sync += wait.eq(wait + 1)
            with m.Else():
                m.d.sync += [wait.eq(0), self.accesses.eq(self.accesses + 1)]
                with m.If(bus.we & (bus.adr == 0) & self.err_word0):
                    m.d.sync += bus.err.eq(1)
                with m.Elif(bus.we):
                    m.d.sync += [bus.ack.eq(1), self.words[bus.adr].eq(bus.dat_w)]
                with m.Else():
                    m.d.sync += [bus.ack.eq(1), bus.dat_r.eq(self.words[bus.adr])]
        return m


class Fabric(Elaboratable):
    def __init__(self):
        self.dec = Decoder(addr_width=12)
        self.sigs = {
            "a": self.dec.add("a", addr=0x0000, size=0x20),
            "b": self.dec.add("b", addr=0x1000, size=0x40),
            "c": self.dec.add("c", addr=0x2000, size=0x1000),
        }
        self.rams = {
            "a": FakeRam(3),
            "b": FakeRam(4, latency=3),
            "c": FakeRam(10, err_word0=True),
        }

    def elaborate(self, platform):
        m = Module()
        m.submodules.dec = self.dec
        for name, ram in self.rams.items():
            m.submodules[name] = ram
            wiring.connect(m, self.dec.sub(name), ram.bus)
        return m


def _silence(*elaboratables):
    # Built to inspect, not to simulate.
    for e in elaboratables:
        e._MustUse__silence = True


def run(dut, bench, *, vcd=None):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


def test_add_returns_sub_bus_signature():
    dut = Fabric()
    _silence(dut, dut.dec, *dut.rams.values())
    assert dut.sigs["a"] == wishbone.Signature(addr_width=3)
    assert dut.sigs["b"] == wishbone.Signature(addr_width=4)
    assert dut.sigs["c"] == wishbone.Signature(addr_width=10)
    assert dut.dec.sub("b").signature == dut.sigs["b"]
    assert dut.dec.windows == {"a": (0, 0x20), "b": (0x1000, 0x40), "c": (0x2000, 0x1000)}


def test_routing_and_relative_addresses():
    dut = Fabric()
    bus = dut.dec.bus

    async def bench(ctx):
        assert await wb_write(ctx, bus, 0x000 + 5, 0xAAAA0005) == "ack"
        assert await wb_write(ctx, bus, 0x400 + 5, 0xBBBB0005) == "ack"
        assert await wb_write(ctx, bus, 0x800 + 5, 0xCCCC0005) == "ack"
        assert await wb_write(ctx, bus, 0x800 + 0x3FF, 0xCCCC03FF) == "ack"
        # Each slave saw the word address relative to its window.
        assert ctx.get(dut.rams["a"].words[5]) == 0xAAAA0005
        assert ctx.get(dut.rams["b"].words[5]) == 0xBBBB0005
        assert ctx.get(dut.rams["c"].words[5]) == 0xCCCC0005
        assert ctx.get(dut.rams["c"].words[0x3FF]) == 0xCCCC03FF
        assert await wb_read(ctx, bus, 0x000 + 5) == (0xAAAA0005, "ack")
        assert await wb_read(ctx, bus, 0x400 + 5) == (0xBBBB0005, "ack")
        assert await wb_read(ctx, bus, 0x800 + 5) == (0xCCCC0005, "ack")
        # Only the addressed slave saw each access.
        assert [ctx.get(dut.rams[n].accesses) for n in "abc"] == [2, 2, 3]

    run(dut, bench)


def test_slave_err_passes_through():
    dut = Fabric()
    bus = dut.dec.bus

    async def bench(ctx):
        assert await wb_write(ctx, bus, 0x800, 1) == "err"
        assert await wb_write(ctx, bus, 0x801, 1) == "ack"

    run(dut, bench)


def test_no_added_latency():
    dut = Fabric()
    bus = dut.dec.bus

    async def bench(ctx):
        for adr, latency in ((0x001, 1), (0x401, 3)):
            ctx.set(bus.cyc, 1)
            ctx.set(bus.stb, 1)
            ctx.set(bus.adr, adr)
            for cycle in range(latency):
                assert not ctx.get(bus.ack)
                await ctx.tick()
            assert ctx.get(bus.ack) and not ctx.get(bus.err)
            await ctx.tick()
            ctx.set(bus.stb, 0)
            ctx.set(bus.cyc, 0)
            assert not ctx.get(bus.ack)

    run(dut, bench)


def test_unmapped_is_err_once():
    dut = Fabric()
    bus = dut.dec.bus

    async def bench(ctx):
        # Just past window a, between windows, just past c and at the top of the bus.
        for adr in (0x008, 0x300, 0x410, 0xC00, 0xFFF):
            assert await wb_read(ctx, bus, adr) == (0, "err")
            assert await wb_write(ctx, bus, adr, 0x1234) == "err"
        # Registered ERR, one cycle after the access, and not repeated while stb stays.
        ctx.set(bus.cyc, 1)
        ctx.set(bus.stb, 1)
        ctx.set(bus.adr, 0x300)
        assert not ctx.get(bus.err)
        await ctx.tick()
        assert ctx.get(bus.err) and not ctx.get(bus.ack)
        await ctx.tick()
        assert not ctx.get(bus.err)
        ctx.set(bus.stb, 0)
        ctx.set(bus.cyc, 0)
        await ctx.tick()
        assert not ctx.get(bus.err)
        assert [ctx.get(dut.rams[n].accesses) for n in "abc"] == [0, 0, 0]

    run(dut, bench)


def test_no_windows_everything_errs():
    dec = Decoder(addr_width=4)

    async def bench(ctx):
        assert await wb_read(ctx, dec.bus, 3) == (0, "err")

    run(dec, bench)


def test_helper_timeout():
    class Mute(wiring.Component):
        bus: In(wishbone.Signature(addr_width=2))

        def elaborate(self, platform):
            m = Module()
            m.d.sync += self.bus.ack.eq(0)
            return m

    dut = Mute()

    async def bench(ctx):
        with pytest.raises(TimeoutError, match=r"no ack or err within 4 cycles"):
            await wb_read(ctx, dut.bus, 1, timeout=4)

    run(dut, bench)


@pytest.mark.parametrize("addr_width", [-1, 1.5, "19", True])
def test_decoder_addr_width_checked(addr_width):
    raises_in_constructor(TypeError, r"^addr_width must be a non-negative integer, not ",
                          Decoder, addr_width=addr_width)


@pytest.mark.parametrize("addr, size, exc, message", [
    (0x0, 0x30, ValueError, r"^Window size must be a power of two of at least 4, not 0x30$"),
    (0x0, 2, ValueError, r"^Window size must be a power of two of at least 4, not 0x2$"),
    (0x10, 0x20, ValueError, r"^Window address must be a multiple of its size 0x20, not 0x10$"),
    (0x4000, 0x20, ValueError, r"^Window 'w' at 0x4000 \+ 0x20 does not fit the 0x4000-byte bus$"),
    (0x1000, 0x800, ValueError, r"^Window 'w' at 0x1000 overlaps window 'x' at 0x1000$"),
    (0x0, 0x4000, ValueError, r"^Window 'w' at 0x0 overlaps window 'x' at 0x1000$"),
    (0x0, 32.0, TypeError, r"^Window size must be an integer, not 32.0$"),
])
def test_decoder_add_checked(addr, size, exc, message):
    dec = Decoder(addr_width=12)
    _silence(dec)
    dec.add("x", addr=0x1000, size=0x100)
    with pytest.raises(exc, match=message):
        dec.add("w", addr=addr, size=size)


def test_decoder_names_checked():
    dec = Decoder(addr_width=12)
    _silence(dec)
    dec.add("x", addr=0x1000, size=0x100)
    with pytest.raises(ValueError, match=r"^Window name 'x' is already used$"):
        dec.add("x", addr=0x0, size=0x100)
    with pytest.raises(TypeError, match=r"^Window name must be a string, not 3$"):
        dec.add(3, addr=0x0, size=0x100)
    with pytest.raises(KeyError, match=r"Decoder has no window named 'y'"):
        dec.sub("y")


def test_decoder_frozen_after_elaborate():
    dec = Decoder(addr_width=12)
    dec.add("x", addr=0x1000, size=0x100)
    _silence(dec, dec.elaborate(None))
    with pytest.raises(RuntimeError, match=r"^Cannot add window 'y': the decoder is already "
                                           r"elaborated$"):
        dec.add("y", addr=0x0, size=0x100)


def test_connect_checks_window_width():
    dec = Decoder(addr_width=12)
    dec.add("x", addr=0x1000, size=0x100)
    ram = FakeRam(4)
    m = Module()
    _silence(dec, ram, m)
    with pytest.raises(wiring.ConnectionError):
        wiring.connect(m, dec.sub("x"), ram.bus)
