"""Transports: argument checks, the registry, and the Amaranth-simulator transport
against a small stand-in tile."""

import subprocess
import sys

import pytest
from amaranth import Module, Mux
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from fusetile.hdl import wishbone
from fusetile.hdl.regmap import (tile_memory_map, hwcfg_values, CSR_SPAN, PLAN_BASE,
                                 SLOT_BASE, GMEM_BASE, ADDR_WIDTH)
from fusetile.kernels.config import TileConfig
from fusetile.host import transport as transport_mod
from fusetile.host.transport import (Transport, TransportError, BusError, register_transport,
                                     register_transport_path, transport_names,
                                     transport_class, open_transport)
from fusetile.host.amaranth_sim import AmaranthTransport


CONFIG = TileConfig()
MM = tile_memory_map(CONFIG)


class StandInTile(wiring.Component):
    """A stand-in with the tile's ports, for testing the host without the real tile.

    The identity registers answer with ``hwcfg_values(config)``; the rest of the CSR
    space is a RAM; the first ``gmem_words`` bus words of GMEM are a RAM; the plan
    windows never answer (a bus timeout); any other address answers ERR. ``irq`` is
    bit 0 of the CSR RAM word at IRQ_ENABLE.
    """

    bus: In(wishbone.Signature(addr_width=ADDR_WIDTH - 2))
    irq: Out(1)

    def __init__(self, config=CONFIG, *, gmem_words=64):
        self.config = config
        self.gmem_words = gmem_words
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        mm = tile_memory_map(self.config)
        bus = self.bus
        m.submodules.csr = csr = Memory(shape=32, depth=CSR_SPAN // 4, init=[])
        m.submodules.gmem = gmem = Memory(shape=32, depth=self.gmem_words, init=[])
        csr_r, csr_w = csr.read_port(domain="comb"), csr.write_port(granularity=8)
        gmem_r, gmem_w = gmem.read_port(domain="comb"), gmem.write_port(granularity=8)
        irq_r = csr.read_port(domain="comb")
        m.d.comb += [
            csr_r.addr.eq(bus.adr), csr_w.addr.eq(bus.adr), csr_w.data.eq(bus.dat_w),
            gmem_r.addr.eq(bus.adr), gmem_w.addr.eq(bus.adr), gmem_w.data.eq(bus.dat_w),
            irq_r.addr.eq(mm.addr("IRQ_ENABLE") >> 2), self.irq.eq(irq_r.data[0]),
        ]
        ident = {mm.addr(name) >> 2: value for name, value in hwcfg_values(self.config).items()}
        gmem_word = GMEM_BASE >> 2
        m.d.sync += [bus.ack.eq(0), bus.err.eq(0)]
        with m.If(bus.cyc & bus.stb & ~bus.ack & ~bus.err):
            with m.If(bus.adr < CSR_SPAN // 4):
                m.d.sync += bus.ack.eq(1)
                with m.Switch(bus.adr):
                    for word, value in ident.items():
                        with m.Case(word):
                            m.d.sync += bus.dat_r.eq(value)
                    with m.Default():
                        m.d.sync += bus.dat_r.eq(csr_r.data)
                        m.d.comb += csr_w.en.eq(Mux(bus.we, bus.sel, 0))
            with m.Elif((bus.adr >= gmem_word) & (bus.adr < gmem_word + self.gmem_words)):
                m.d.sync += [bus.ack.eq(1), bus.dat_r.eq(gmem_r.data)]
                m.d.comb += gmem_w.en.eq(Mux(bus.we, bus.sel, 0))
            with m.Elif((bus.adr >= PLAN_BASE >> 2) & (bus.adr < SLOT_BASE >> 2)):
                pass    # never answers: exercises the bus timeout
            with m.Else():
                m.d.sync += bus.err.eq(1)
        return m


# An address the stand-in answers with ERR: the first kernel slot window.
ERR_ADDR = MM.addr("KERNEL[0]") + 8
SILENT_ADDR = MM.addr("PLAN[1]")
GMEM = MM.addr("GMEM")


class RamTransport(Transport):
    """A dict of words; ERR above ``err_from``."""

    def __init__(self, err_from=None, **kwargs):
        super().__init__(**kwargs)
        self.mem = {}
        self.log = []
        self.err_from = err_from
        self.waited = 0

    def _read32(self, addr):
        self.log.append(("r", addr))
        if self.err_from is not None and addr >= self.err_from:
            raise self._bus_error(addr, False)
        return self.mem.get(addr, 0)

    def _write32(self, addr, value):
        self.log.append(("w", addr, value))
        if self.err_from is not None and addr >= self.err_from:
            raise self._bus_error(addr, True)
        self.mem[addr] = value

    def wait_cycles(self, n):
        self.waited += n


@pytest.fixture(scope="module")
def sim():
    with AmaranthTransport(CONFIG, top=StandInTile()) as t:
        yield t


# -- base class checks ---------------------------------------------------------------

def test_misaligned_address_raises_before_bus():
    t = RamTransport()
    with pytest.raises(ValueError, match=r"Address must be 4-byte aligned, not 0x6"):
        t.read32(6)
    with pytest.raises(ValueError, match="aligned"):
        t.write32(0x101, 0)
    with pytest.raises(ValueError, match="aligned"):
        t.read_burst(2, 4)
    assert t.log == []


def test_out_of_range_address_and_value_raise_before_bus():
    t = RamTransport()
    top = 1 << ADDR_WIDTH
    with pytest.raises(ValueError, match=r"range 0x0\.\.0x1ffffc, not 0x200000"):
        t.read32(top)
    with pytest.raises(ValueError, match="range"):
        t.read32(-4)
    with pytest.raises(ValueError, match="burst of 2 words"):
        t.read_burst(top - 4, 2)
    t.read_burst(top - 4, 5, increment=False)   # one address, many reads: fine
    with pytest.raises(ValueError, match=r"32-bit unsigned integer, not 4294967296"):
        t.write32(0, 1 << 32)
    with pytest.raises(ValueError, match="32-bit"):
        t.write32(0, -1)
    with pytest.raises(ValueError, match="32-bit"):
        t.write_burst(0, [1, 2, 1 << 40])
    with pytest.raises(TypeError, match=r"Address must be an integer, not '4'"):
        t.read32("4")
    with pytest.raises(TypeError, match="Value must be an integer"):
        t.write32(0, 1.0)
    assert [e for e in t.log if e[1] != top - 4] == []


def test_default_bursts_loop_over_words():
    t = RamTransport()
    t.write_burst(0x100, [1, 2, 3])
    assert t.read_burst(0x100, 3) == [1, 2, 3]
    assert t.read_burst(0x104, 3, increment=False) == [2, 2, 2]
    t.write_burst(0x200, [7, 8], increment=False)
    assert t.mem[0x200] == 8 and 0x204 not in t.mem
    assert t.read_burst(0x100, 0) == []


def test_closed_transport_refuses_access():
    t = RamTransport()
    with t:
        t.write32(0, 1)
    with pytest.raises(TransportError, match="RamTransport is closed"):
        t.read32(0)
    t.close()


def test_bus_error_names_the_region():
    e = BusError(MM.addr("PART[2]"), True, MM)
    assert str(e) == "bus error: write to 0x00000108 (PART[2])"
    assert e.region == "PART[2]" and e.write and e.addr == 0x108
    e = BusError(GMEM + 0x40, False, MM)
    assert str(e) == "bus error: read from 0x00100040 (GMEM + 0x40)"
    assert str(BusError(0x3000, False, MM)) == "bus error: read from 0x00003000 (unmapped)"
    assert str(BusError(0x3000, False)) == "bus error: read from 0x00003000"
    assert isinstance(e, TransportError)


def test_bus_error_from_transport_uses_its_memory_map():
    t = RamTransport(err_from=GMEM, memory_map=MM)
    with pytest.raises(BusError, match=r"read from 0x00100000 \(GMEM\)$"):
        t.read_burst(GMEM - 4, 3)  # the second word is the first in GMEM


# -- registry --------------------------------------------------------------------------

def test_unknown_transport_lists_known_ones():
    with pytest.raises(ValueError, match=r"Unknown transport 'nope'; known transports: "
                                         r"amaranth, .*icarus, .*verilator"):
        open_transport("nope")


def test_builtin_names_registered_lazily():
    assert {"amaranth", "verilator", "icarus"} <= set(transport_names())
    assert transport_class("amaranth") is AmaranthTransport


def test_register_transport_and_target_argument(monkeypatch):
    monkeypatch.setattr(transport_mod, "_registry", dict(transport_mod._registry))

    @register_transport("ram")
    class NamedRam(RamTransport):
        def __init__(self, port=None, **kwargs):
            super().__init__(**kwargs)
            self.port = port

    with open_transport("ram") as t:
        assert isinstance(t, NamedRam) and t.port is None
    with open_transport("ram:/dev/ttyUSB0", memory_map=MM) as t:
        assert t.port == "/dev/ttyUSB0" and t.memory_map is MM
    with pytest.raises(TypeError, match="Transport subclass"):
        register_transport("bad")(object)
    with pytest.raises(TypeError, match="Transport name"):
        register_transport("a:b")


def test_lazy_registration_failure_is_a_transport_error(monkeypatch):
    monkeypatch.setattr(transport_mod, "_registry", dict(transport_mod._registry))
    register_transport_path("ghost", "fusetile.no_such_module:Ghost")
    with pytest.raises(TransportError, match=r"Transport 'ghost' is not available: "
                                             r"No module named 'fusetile.no_such_module'"):
        open_transport("ghost")
    with pytest.raises(TypeError, match="module:ClassName"):
        register_transport_path("ghost", "no_colon")


def test_importing_host_does_not_import_cocotb():
    code = ("import sys, fusetile.host, fusetile.host.transport, fusetile.host.device; "
            "sys.exit('cocotb' in sys.modules or 'amaranth.sim' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# -- Amaranth simulator transport ----------------------------------------------------------

def test_amaranth_reads_identity(sim):
    values = hwcfg_values(CONFIG)
    ident = MM.group("identity")
    assert sim.read_burst(ident[0].addr, len(ident)) == [values[e.item.name] for e in ident]
    assert sim.read32(MM.addr("ID")) == values["ID"]


def test_amaranth_round_trip(sim):
    sim.write32(GMEM, 0xDEADBEEF)
    assert sim.read32(GMEM) == 0xDEADBEEF
    words = [(i * 0x01010101) ^ 0x5A5A5A5A for i in range(8)]
    sim.write_burst(GMEM + 16, words)
    assert sim.read_burst(GMEM + 16, 8) == words
    assert sim.read_burst(GMEM + 16, 3, increment=False) == [words[0]] * 3
    part = MM.addr("PART[1]")
    sim.write32(part, 0x00400010)
    assert sim.read32(part) == 0x00400010


def test_amaranth_bus_error(sim):
    with pytest.raises(BusError, match=r"write to 0x00020008 \(KERNEL\[0\] \+ 0x8\)") as info:
        sim.write32(ERR_ADDR, 1)
    assert info.value.addr == ERR_ADDR and info.value.write
    # The bus is usable after an error.
    assert sim.read32(MM.addr("ID")) == hwcfg_values(CONFIG)["ID"]


def test_amaranth_bus_timeout():
    with AmaranthTransport(CONFIG, top=StandInTile(), bus_timeout=8) as t:
        with pytest.raises(TransportError, match=r"bus timeout: no ACK or ERR for a read from "
                                                 r"0x00010400 within 8 cycles"):
            t.read32(SILENT_ADDR)
        assert t.read32(MM.addr("ID")) == hwcfg_values(CONFIG)["ID"]


def test_amaranth_wait_cycles_and_irq(sim):
    before = sim.cycles
    sim.wait_cycles(100)
    assert sim.cycles == before + 100
    sim.wait_cycles(0)
    irq_enable = MM.addr("IRQ_ENABLE")
    sim.write32(irq_enable, 1)
    assert sim.irq() == 1
    sim.write32(irq_enable, 0)
    assert sim.irq() == 0
    with pytest.raises(ValueError, match="non-negative"):
        sim.wait_cycles(-1)


def test_amaranth_two_cycles_per_access(sim):
    before = sim.cycles
    sim.read_burst(GMEM, 10)
    assert sim.cycles - before == 20


def test_amaranth_simulator_exception_propagates(monkeypatch):
    t = AmaranthTransport(CONFIG, top=StandInTile())

    async def broken(ctx):
        raise RuntimeError("boom")
    monkeypatch.setattr(t, "_tb_irq", broken)
    with pytest.raises(TransportError, match="simulator stopped: RuntimeError: boom"):
        t.irq()
    with pytest.raises(TransportError, match="simulator stopped"):
        t.read32(0)
    t.close()
    t.close()


def test_amaranth_open_by_name_and_close(tmp_path):
    vcd = tmp_path / "bus.vcd"
    with open_transport("amaranth", config=CONFIG, top=StandInTile(), vcd=str(vcd)) as t:
        t.read32(0)
    assert not t._thread.is_alive()
    assert vcd.stat().st_size > 0
    with pytest.raises(TransportError, match="closed"):
        t.read32(0)


def test_amaranth_checks_arguments():
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 3"):
        AmaranthTransport(3)
    with pytest.raises(TypeError, match=r"top must be a component with `bus` and `irq` ports"):
        AmaranthTransport(top=object())
    with pytest.raises(ValueError, match=r"bus_timeout must be a positive integer, not 0"):
        AmaranthTransport(bus_timeout=0)


def test_amaranth_real_tile_identity():
    pytest.importorskip("fusetile.hdl.tile")
    with open_transport("amaranth") as t:
        ident = MM.group("identity")
        values = hwcfg_values(CONFIG)
        assert t.read_burst(ident[0].addr, len(ident)) == [values[e.item.name] for e in ident]
