import itertools

import pytest

from amaranth.back import rtlil, verilog
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from fusetile.hdl import wishbone
from fusetile.hdl.csr import CsrBank
from fusetile.hdl.wishbone import Decoder
from fusetile.hdl.registers import Access, Field, MemoryMap, Register, Window
from fusetile.hdl.regmap import tile_memory_map
from fusetile.kernels.config import TileConfig
from fusetile.kernels.isa import FaultCause

from wb_helpers import raises_in_constructor, wb_read, wb_write


MM = tile_memory_map(TileConfig())
#: The behaviour tests run on both builds: built for area (``compact``), a read's
#: value is selected among all the registers at once.
BUILDS = pytest.mark.parametrize("compact", [False, True], ids=["deep", "compact"])


def word(name, hi=False):
    """Word address of register ``name`` (or of a counter's LO / HI word)."""
    return MM.addr(name) // 4 + int(hi)


def reg(name):
    return MM[name].item


def run(dut, bench, *, monitors=(), vcd=None):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    for monitor in monitors:
        sim.add_testbench(monitor, background=True)
    sim.add_testbench(bench)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


def pulse_monitor(signals, log):
    """A background testbench appending ``(cycle, name)`` for every cycle a signal is high."""
    async def monitor(ctx):
        cycle = 0
        while True:
            await ctx.tick()
            cycle += 1
            for name, sig in signals.items():
                if ctx.get(sig):
                    log.append((cycle, name))
    return monitor


def test_takes_csr_window_entries():
    bank = CsrBank(MM)
    bank._MustUse__silence = True
    assert set(bank.fields) == {e.item.name for e in MM.registers()}
    assert bank.counter_names == [e.item.name for e in MM.counters()]
    assert "CYCLES" in bank.counter_names and "SLOT_CALLS[2]" in bank.counter_names
    assert set(bank.read_strobe) == {"TRACE_DATA"}
    assert set(bank.refuse) == {e.item.name for e in MM.registers() if e.item.writable}
    assert "STATUS" not in bank.refuse and "SLOT[3]" in bank.refuse
    assert len(bank.fields["PART[3]"]["base"]) == 16
    assert len(bank.counter_read.index) == 7
    assert len(bank.counter_read.data) == 64
    assert len(bank.refused_addr) == 10

    small = CsrBank(MM, addr_width=6)       # 256 bytes: identity .. trace only
    small._MustUse__silence = True
    assert "TRACE_DATA" in small.fields and "PART[0]" not in small.fields
    assert small.counter_names == [] and not hasattr(small, "counter_read")


def test_elaborates_to_rtlil():
    rtlil.convert(CsrBank(MM))


@BUILDS
def test_rw_storage_and_init(compact):
    bank = CsrBank(MM, compact=compact)

    async def bench(ctx):
        assert ctx.get(bank.fields["IRQ_ENABLE"]["fault"]) == 1
        assert await wb_read(ctx, bank.bus, word("IRQ_ENABLE")) == \
            (reg("IRQ_ENABLE").pack(fault=1), "ack")
        assert await wb_read(ctx, bank.bus, word("WATCHDOG")) == (0, "ack")

        assert await wb_write(ctx, bank.bus, word("WATCHDOG"), 0x12345678) == "ack"
        assert ctx.get(bank.fields["WATCHDOG"]["limit"]) == 0x12345678
        assert await wb_read(ctx, bank.bus, word("WATCHDOG")) == (0x12345678, "ack")

        value = reg("PART[3]").pack(base=0x123, length=0x456)
        assert await wb_write(ctx, bank.bus, word("PART[3]"), value) == "ack"
        assert ctx.get(bank.fields["PART[3]"]["base"]) == 0x123
        assert ctx.get(bank.fields["PART[3]"]["length"]) == 0x456
        assert ctx.get(bank.fields["PART[2]"]["base"]) == 0
        assert await wb_read(ctx, bank.bus, word("PART[3]")) == (value, "ack")

        # R fields inside a writable register keep reading what the parent drives.
        assert await wb_write(ctx, bank.bus, word("SLOT[2]"), 0xFFFFFFFF) == "ack"
        assert await wb_read(ctx, bank.bus, word("SLOT[2]")) == \
            (reg("SLOT[2]").pack(valid=1, part=0xF, version=0xFFFF), "ack")

    run(bank, bench)


@BUILDS
def test_r_fields_read_parent_values(compact):
    bank = CsrBank(MM, compact=compact)

    async def bench(ctx):
        ctx.set(bank.fields["ID"]["magic"], 0x4654494C)
        ctx.set(bank.fields["STATUS"]["running"], 1)
        ctx.set(bank.fields["STATUS"]["slot"], 5)
        ctx.set(bank.fields["FAULT"]["cause"], FaultCause.WATCHDOG.value)
        ctx.set(bank.fields["FAULT"]["part"], 0xA)
        assert await wb_read(ctx, bank.bus, word("ID")) == (0x4654494C, "ack")
        assert await wb_read(ctx, bank.bus, word("STATUS")) == \
            (reg("STATUS").pack(running=1, slot=5), "ack")
        data, status = await wb_read(ctx, bank.bus, word("FAULT"))
        assert status == "ack"
        fault = reg("FAULT").unpack(data)
        assert fault.cause == FaultCause.WATCHDOG and fault.part == 0xA
        # The value is taken when the read is answered, not when the bank was built.
        ctx.set(bank.fields["STATUS"]["running"], 0)
        assert await wb_read(ctx, bank.bus, word("STATUS")) == \
            (reg("STATUS").pack(slot=5), "ack")

    run(bank, bench)


@BUILDS
def test_w1_pulses_one_cycle(compact):
    bank = CsrBank(MM, compact=compact)
    ctrl = bank.fields["CTRL"]
    log = []
    monitor = pulse_monitor({**ctrl, "ack": bank.bus.ack, "clear": bank.fields["PERF_CTRL"]["clear"]},
                            log)

    async def bench(ctx):
        assert await wb_write(ctx, bank.bus, word("CTRL"),
                              reg("CTRL").pack(start=1, abort=1)) == "ack"
        cycles = [c for c, name in log if name == "ack"]
        assert len(cycles) == 1
        # Both pulses, for exactly the cycle of the ACK.
        assert sorted(log) == sorted([(cycles[0], "ack"), (cycles[0], "start"),
                                      (cycles[0], "abort")])
        for _ in range(3):
            await ctx.tick()
        assert len(log) == 3
        # W1 fields read as 0; a write of 0 pulses nothing.
        assert await wb_read(ctx, bank.bus, word("CTRL")) == (0, "ack")
        assert await wb_write(ctx, bank.bus, word("CTRL"), 0) == "ack"
        assert [name for _, name in log[3:]] == ["ack", "ack"]
        # A W1 field beside an RW field: the RW field is stored, the W1 one pulses.
        del log[:]
        assert await wb_write(ctx, bank.bus, word("PERF_CTRL"),
                              reg("PERF_CTRL").pack(freeze=1, clear=1)) == "ack"
        assert sorted(name for _, name in log) == ["ack", "clear"]
        assert ctx.get(bank.fields["PERF_CTRL"]["freeze"]) == 1
        assert await wb_read(ctx, bank.bus, word("PERF_CTRL")) == \
            (reg("PERF_CTRL").pack(freeze=1), "ack")

    run(bank, bench, monitors=[monitor])


@BUILDS
def test_read_strobe_pops_after_read(compact):
    bank = CsrBank(MM, compact=compact)
    strobe = bank.read_strobe["TRACE_DATA"]
    data = bank.fields["TRACE_DATA"]["data"]
    fifo = [0x111, 0x222, 0x333]
    log = []

    async def parent(ctx):
        # A FIFO head that pops on the strobe, as the trace FIFO will.
        ctx.set(data, fifo[0])
        async for _, _, strobed in ctx.tick().sample(strobe):
            if strobed and fifo:
                fifo.pop(0)
                ctx.set(data, fifo[0] if fifo else 0)

    async def bench(ctx):
        await ctx.tick()
        assert await wb_read(ctx, bank.bus, word("TRACE_STATUS")) == (0, "ack")
        assert [name for _, name in log] == ["ack"]
        del log[:]
        assert await wb_read(ctx, bank.bus, word("TRACE_DATA")) == (0x111, "ack")
        # The strobe is high for exactly the cycle of the ACK.
        assert log == [(log[0][0], "ack"), (log[0][0], "strobe")]
        assert await wb_read(ctx, bank.bus, word("TRACE_DATA")) == (0x222, "ack")
        assert await wb_read(ctx, bank.bus, word("TRACE_DATA")) == (0x333, "ack")
        assert await wb_read(ctx, bank.bus, word("TRACE_DATA")) == (0, "ack")
        assert [name for _, name in log].count("strobe") == 4
        # A write is not a read.
        assert await wb_write(ctx, bank.bus, word("TRACE_DATA"), 1) == "err"
        assert [name for _, name in log].count("strobe") == 4

    run(bank, bench, monitors=[parent, pulse_monitor({"ack": bank.bus.ack, "strobe": strobe},
                                                     log)])


@BUILDS
def test_a_slot_table_without_version_tags(compact):
    """TileConfig.slot_versions False: SLOT[i] keeps its valid bit and partition, and
    a write's version bits are dropped (the field is not in the map): the slot reads
    back without them, and the bank has no storage for them."""
    mm = tile_memory_map(TileConfig(slot_versions=False))
    bank = CsrBank(mm, compact=compact)
    assert set(bank.fields["SLOT[1]"]) == {"valid", "part", "_pad"}
    full = reg("SLOT[1]").pack(valid=1, part=5, version=0xBEEF)

    async def bench(ctx):
        assert await wb_write(ctx, bank.bus, mm.addr("SLOT[1]") // 4, full) == "ack"
        assert (ctx.get(bank.fields["SLOT[1]"]["valid"]),
                ctx.get(bank.fields["SLOT[1]"]["part"])) == (1, 5)
        assert await wb_read(ctx, bank.bus, mm.addr("SLOT[1]") // 4) == (
            full & 0xFF, "ack")

    run(bank, bench)


@BUILDS
def test_refuse(compact):
    bank = CsrBank(MM, compact=compact)
    log = []
    monitor = pulse_monitor({"refused": bank.refused, "err": bank.bus.err}, log)

    async def bench(ctx):
        assert await wb_write(ctx, bank.bus, word("SLOT[1]"), reg("SLOT[1]").pack(valid=1)) == "ack"
        ctx.set(bank.refuse["SLOT[1]"], 1)
        assert await wb_write(ctx, bank.bus, word("SLOT[1]"), reg("SLOT[1]").pack(version=7)) == "err"
        assert ctx.get(bank.fields["SLOT[1]"]["valid"]) == 1
        assert ctx.get(bank.fields["SLOT[1]"]["version"]) == 0
        assert ctx.get(bank.refused_addr) == word("SLOT[1]")
        (cycle, _), *rest = log
        assert sorted(log) == [(cycle, "err"), (cycle, "refused")]
        # Reads are not refused; other registers are not affected.
        assert await wb_read(ctx, bank.bus, word("SLOT[1]")) == (reg("SLOT[1]").pack(valid=1), "ack")
        assert await wb_write(ctx, bank.bus, word("SLOT[2]"), reg("SLOT[2]").pack(valid=1)) == "ack"
        ctx.set(bank.refuse["SLOT[1]"], 0)
        assert await wb_write(ctx, bank.bus, word("SLOT[1]"), reg("SLOT[1]").pack(version=7)) == "ack"
        assert ctx.get(bank.fields["SLOT[1]"]["version"]) == 7
        assert [name for _, name in log].count("refused") == 1
        # A refused W1 write does not pulse.
        ctx.set(bank.refuse["CTRL"], 1)
        assert await wb_write(ctx, bank.bus, word("CTRL"), reg("CTRL").pack(start=1)) == "err"
        assert [name for _, name in log].count("refused") == 2
        assert ctx.get(bank.refused_addr) == word("CTRL")

    start_log = []
    run(bank, bench, monitors=[monitor, pulse_monitor(
        {"start": bank.fields["CTRL"]["start"]}, start_log)])
    assert start_log == []


def counter_responder(bank, values, delays):
    """A background testbench answering the bank's counter reads from ``values``
    ({name: int}), each after the next of ``delays`` cycles (going round)."""
    delays = itertools.cycle(delays)

    async def responder(ctx):
        port = bank.counter_read
        while True:
            await ctx.tick()
            if ctx.get(port.stb):
                name = bank.counter_names[ctx.get(port.index)]
                for _ in range(next(delays)):
                    await ctx.tick()
                ctx.set(port.ack, 1)
                ctx.set(port.data, values[name])
                await ctx.tick()
                ctx.set(port.ack, 0)
    return responder


@BUILDS
def test_counter_lo_hi_latching(compact):
    bank = CsrBank(MM, compact=compact)
    values = {"CYCLES": 0x11111111_22222222, "SLOT_CALLS[2]": 0xAAAAAAAA_BBBBBBBB}

    async def bench(ctx):
        assert await wb_read(ctx, bank.bus, word("CYCLES")) == (0x22222222, "ack")
        values["CYCLES"] = 0x33333333_44444444
        assert await wb_read(ctx, bank.bus, word("CYCLES", hi=True)) == (0x11111111, "ack")
        # One shared shadow: the last LO read decides what any HI read returns.
        assert await wb_read(ctx, bank.bus, word("SLOT_CALLS[2]")) == (0xBBBBBBBB, "ack")
        assert await wb_read(ctx, bank.bus, word("CYCLES", hi=True)) == (0xAAAAAAAA, "ack")
        assert await wb_read(ctx, bank.bus, word("CYCLES")) == (0x44444444, "ack")
        assert await wb_read(ctx, bank.bus, word("CYCLES", hi=True)) == (0x33333333, "ack")
        for hi in (False, True):
            assert await wb_write(ctx, bank.bus, word("CYCLES", hi=hi), 0) == "err"

    run(bank, bench, monitors=[counter_responder(bank, values, [0, 5, 2])])


@BUILDS
def test_counter_read_waits_for_the_counters(compact):
    """A LO read is answered the cycle after the counters answer, however long they
    take, and not before."""
    bank = CsrBank(MM, compact=compact)

    async def bench(ctx):
        for delay in (7, 0, 3):
            ctx.set(bank.bus.cyc, 1)
            ctx.set(bank.bus.stb, 1)
            ctx.set(bank.bus.adr, word("MACS"))
            cycles = 0
            while not (ctx.get(bank.bus.ack) or ctx.get(bank.bus.err)):
                await ctx.tick()
                cycles += 1
            assert (ctx.get(bank.bus.ack), ctx.get(bank.bus.dat_r)) == (1, 0x89ABCDEF)
            ctx.set(bank.bus.stb, 0)
            ctx.set(bank.bus.cyc, 0)
            await ctx.tick()
            # Seen, decoded, the counters asked, their answer ``delay`` cycles on, then
            # the ACK.
            assert cycles == delay + 3
        assert await wb_read(ctx, bank.bus, word("MACS", hi=True)) == (0x01234567, "ack")

    run(bank, bench, monitors=[counter_responder(bank, {"MACS": 0x01234567_89ABCDEF},
                                                 [7, 0, 3])])


@BUILDS
def test_errors(compact):
    bank = CsrBank(MM, compact=compact)

    async def bench(ctx):
        # Registers without a writable field.
        for name in ("ID", "STATUS", "TRACE_STATUS", "REFUSED_ADDR"):
            assert await wb_write(ctx, bank.bus, word(name), 0xFFFFFFFF) == "err"
        assert await wb_read(ctx, bank.bus, word("STATUS")) == (0, "ack")
        # Partial writes.
        for sel in (0b0000, 0b0001, 0b0111, 0b1110):
            assert await wb_write(ctx, bank.bus, word("WATCHDOG"), 0xFFFFFFFF, sel=sel) == "err"
        assert ctx.get(bank.fields["WATCHDOG"]["limit"]) == 0
        # Unmapped addresses, read and write.
        for adr in (0x050 // 4, 0x078 // 4, 0x3FF):
            assert MM.lookup(adr * 4) is None
            assert await wb_read(ctx, bank.bus, adr) == (0, "err")
            assert await wb_write(ctx, bank.bus, adr, 0) == "err"
        # One answer per access: seen, decoded, ERR for one cycle, then nothing while
        # stb stays high.
        ctx.set(bank.bus.cyc, 1)
        ctx.set(bank.bus.stb, 1)
        ctx.set(bank.bus.adr, 0x3FF)
        answers = []
        for _ in range(4):
            await ctx.tick()
            answers.append((ctx.get(bank.bus.ack), ctx.get(bank.bus.err)))
        assert answers == [(0, 0), (0, 1), (0, 0), (0, 0)]
        ctx.set(bank.bus.stb, 0)

    run(bank, bench)


def test_constructor_checks():
    raises_in_constructor(TypeError, r"^memory_map must be a MemoryMap, not 'x'$", CsrBank, "x")
    for addr_width in (0, -1, 10.0, True):
        raises_in_constructor(TypeError, rf"^addr_width must be a positive integer, not "
                              rf"{addr_width!r}$", CsrBank, MM, addr_width=addr_width)

    with_window = MemoryMap()
    with_window.add_register(Register("A", [Field("a", 1, Access.RW)]), 0x0)
    with_window.add_window(Window("W", 0x40, 0x40, 32), 0x40)
    raises_in_constructor(ValueError, r"^Window W at 0x40 lies in the CSR window \[0, 0x1000\)$",
                          CsrBank, with_window)

    raises_in_constructor(ValueError, r"^memory_map must have a register or counter in the CSR "
                          r"window \[0, 0x1000\), not none$", CsrBank, MemoryMap())


class _TileLike(wiring.Component):
    """The CSR bank behind a decoder, wired the way the tile top does it."""
    bus: In(wishbone.Signature(addr_width=19))

    def __init__(self):
        super().__init__()
        self.csr = CsrBank(MM)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dec = dec = Decoder(addr_width=19)
        assert dec.add("csr", addr=0x0, size=0x1000) == self.csr.bus.signature.flip()
        m.submodules.csr = self.csr
        wiring.connect(m, wiring.flipped(self.bus), dec.bus)
        wiring.connect(m, dec.sub("csr"), self.csr.bus)
        return m


def test_behind_decoder():
    dut = _TileLike()

    async def bench(ctx):
        assert await wb_write(ctx, dut.bus, word("WATCHDOG"), 99) == "ack"
        assert await wb_read(ctx, dut.bus, word("WATCHDOG")) == (99, "ack")
        assert await wb_read(ctx, dut.bus, 0x3FF) == (0, "err")            # CSR hole
        assert await wb_read(ctx, dut.bus, 0x1000 // 4) == (0, "err")      # decoder hole

    run(dut, bench)


def test_converts_to_verilog():
    text = verilog.convert(_TileLike(), name="csr_top")
    assert "module csr_top" in text


@BUILDS
def test_answer_latency(compact):
    """A register write is answered three cycles after it is seen, a read four (the
    access is registered, decoded, then the read's value is selected within its group
    of registers, then among the groups), an ERR from the decode two."""
    bank = CsrBank(MM, compact=compact)

    async def answered_after(ctx, addr, we, data=0, sel=0b1111):
        bus = bank.bus
        ctx.set(bus.adr, addr)
        ctx.set(bus.we, we)
        ctx.set(bus.dat_w, data)
        ctx.set(bus.sel, sel)
        ctx.set(bus.cyc, 1)
        ctx.set(bus.stb, 1)
        cycles = 0
        while not (ctx.get(bus.ack) or ctx.get(bus.err)):
            await ctx.tick()
            cycles += 1
        value, ok = ctx.get(bus.dat_r), ctx.get(bus.ack)
        ctx.set(bus.cyc, 0)
        ctx.set(bus.stb, 0)
        await ctx.tick()
        return cycles, value, ok

    async def bench(ctx):
        await ctx.tick()
        # Every register of the map, so that each group of the multiplexer answers.
        registers = [e for e in MM.registers() if e.item.name in bank.fields]
        assert len(registers) > 2 * CsrBank.READ_GROUP
        for entry in registers:
            cycles, _, ok = await answered_after(ctx, entry.addr // 4, 0)
            assert (cycles, ok) == (4, 1), entry.item.name
        pattern = reg("WATCHDOG").pack(limit=0x1234)
        assert await answered_after(ctx, word("WATCHDOG"), 1, pattern) == (3, 0, 1)
        assert await answered_after(ctx, word("WATCHDOG"), 0) == (4, pattern, 1)
        for addr, we, sel in ((word("WATCHDOG"), 1, 0b0111), (word("ID"), 1, 0b1111),
                              (0x3FF, 0, 0b1111)):
            cycles, _, ok = await answered_after(ctx, addr, we, sel=sel)
            assert (cycles, ok) == (2, 0)

    run(bank, bench)


@BUILDS
def test_back_to_back_accesses(compact):
    """A master that keeps ``cyc`` and ``stb`` high and presents its next access the
    cycle after an answer (it holds the last one through the answer's cycle) gets each
    answered once, from its own address."""
    bank = CsrBank(MM, compact=compact)
    bus = bank.bus
    log = []

    async def bench(ctx):
        await ctx.tick()
        accesses = [(word("WATCHDOG"), 1, 0x55), (word("ID"), 0, 0), (0x3FF, 0, 0),
                    (word("WATCHDOG"), 0, 0), (word("ID"), 1, 0), (word("PART[1]"), 1, 0x77),
                    (word("PART[1]"), 0, 0)]
        ctx.set(bank.fields["ID"]["magic"], 0x4654494C)
        ctx.set(bus.cyc, 1)
        ctx.set(bus.stb, 1)
        ctx.set(bus.sel, 0b1111)
        for adr, we, data in accesses:
            ctx.set(bus.adr, adr)
            ctx.set(bus.we, we)
            ctx.set(bus.dat_w, data)
            cycles = 0
            while True:
                await ctx.tick()
                cycles += 1
                ack, err = ctx.get(bus.ack), ctx.get(bus.err)
                if ack or err:
                    log.append((cycles, ack, ctx.get(bus.dat_r) if ack and not we else None))
                    await ctx.tick()
                    break
        ctx.set(bus.cyc, 0)
        ctx.set(bus.stb, 0)
        for _ in range(6):
            await ctx.tick()
            assert not (ctx.get(bus.ack) or ctx.get(bus.err))
        assert log == [(3, 1, None), (4, 1, 0x4654494C), (2, 0, None), (4, 1, 0x55),
                       (2, 0, None), (3, 1, None), (4, 1, 0x77)]

    run(bank, bench)


@BUILDS
def test_withdrawn_access_is_not_decoded(compact):
    """An access the master drops the cycle after it is seen is neither answered nor
    performed, and the next one is decoded from its own address."""
    bank = CsrBank(MM, compact=compact)
    bus = bank.bus
    log = []
    monitor = pulse_monitor({"ack": bus.ack, "err": bus.err}, log)

    async def bench(ctx):
        await ctx.tick()
        ctx.set(bus.cyc, 1)
        ctx.set(bus.stb, 1)
        ctx.set(bus.we, 1)
        ctx.set(bus.sel, 0b1111)
        ctx.set(bus.adr, word("WATCHDOG"))
        ctx.set(bus.dat_w, 0x99)
        await ctx.tick()
        ctx.set(bus.cyc, 0)
        ctx.set(bus.stb, 0)
        ctx.set(bus.we, 0)
        await ctx.tick().repeat(5)
        assert log == []
        assert ctx.get(bank.fields["WATCHDOG"]["limit"]) == 0
        assert await wb_read(ctx, bus, 0x3FF) == (0, "err")
        assert await wb_read(ctx, bus, word("WATCHDOG")) == (0, "ack")

    run(bank, bench, monitors=[monitor])


@BUILDS
def test_refuse_in_the_cycle_of_the_answer(compact):
    """A write is refused if ``refuse`` is high in the cycle its answer is decided (the
    cycle before the ERR), whatever it was in the cycles before."""
    bank = CsrBank(MM, compact=compact)
    bus = bank.bus
    refuse = bank.refuse["WATCHDOG"]

    async def bench(ctx):
        await ctx.tick()
        for high in (0, 1, 2, None):
            ctx.set(bus.cyc, 1)
            ctx.set(bus.stb, 1)
            ctx.set(bus.we, 1)
            ctx.set(bus.sel, 0b1111)
            ctx.set(bus.adr, word("WATCHDOG"))
            ctx.set(bus.dat_w, 10 + (high or 0))
            cycle = 0
            while not (ctx.get(bus.ack) or ctx.get(bus.err)):
                ctx.set(refuse, cycle == high)
                await ctx.tick()
                cycle += 1
            refused = ctx.get(bus.err)
            assert cycle == 3
            assert refused == (high == 2), high
            assert ctx.get(bank.refused) == refused
            ctx.set(refuse, 0)
            ctx.set(bus.cyc, 0)
            ctx.set(bus.stb, 0)
            await ctx.tick()
            if not refused:
                assert ctx.get(bank.fields["WATCHDOG"]["limit"]) == 10 + (high or 0)
        assert ctx.get(bank.fields["WATCHDOG"]["limit"]) == 10

    run(bank, bench)


@BUILDS
def test_hold_delays_the_deciding_cycle(compact):
    """A write waits while ``hold`` is high in its deciding cycle, and is then performed
    or refused by ``refuse`` as it is in the cycle it goes on; reads do not wait."""
    bank = CsrBank(MM, compact=compact)
    bus = bank.bus
    refuse = bank.refuse["WATCHDOG"]

    async def write(ctx, data, held, refused):
        ctx.set(bus.cyc, 1)
        ctx.set(bus.stb, 1)
        ctx.set(bus.we, 1)
        ctx.set(bus.sel, 0b1111)
        ctx.set(bus.adr, word("WATCHDOG"))
        ctx.set(bus.dat_w, data)
        cycle = 0
        while not (ctx.get(bus.ack) or ctx.get(bus.err)):
            # Held in the deciding cycle (the third) and `held` - 1 more; the refusal
            # is up only while held.
            hold = 2 <= cycle < 2 + held
            ctx.set(bank.hold, hold)
            ctx.set(refuse, hold or (refused and cycle == 2 + held))
            await ctx.tick()
            cycle += 1
        answer = ctx.get(bus.ack), ctx.get(bus.err)
        ctx.set(bank.hold, 0)
        ctx.set(refuse, 0)
        ctx.set(bus.cyc, 0)
        ctx.set(bus.stb, 0)
        await ctx.tick()
        return cycle, answer

    async def bench(ctx):
        await ctx.tick()
        assert await write(ctx, 5, held=0, refused=False) == (3, (1, 0))
        assert await write(ctx, 6, held=2, refused=False) == (5, (1, 0))
        assert ctx.get(bank.fields["WATCHDOG"]["limit"]) == 6
        assert await write(ctx, 7, held=1, refused=True) == (4, (0, 1))
        assert ctx.get(bank.fields["WATCHDOG"]["limit"]) == 6
        ctx.set(bank.hold, 1)
        assert await wb_read(ctx, bus, word("WATCHDOG")) == (6, "ack")

    run(bank, bench)
