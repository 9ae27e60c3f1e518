# amaranth: UnusedElaboratable=no

import random
from types import SimpleNamespace

import pytest
from amaranth.back import verilog
from amaranth.hdl import Elaboratable, Module, Signal, Mux
from amaranth.lib import wiring
from amaranth.sim import Simulator

from fusetile.hdl.dma import Dma, DmaCommand
from fusetile.hdl.gmem import GlobalMemory
from fusetile.hdl.scratchpad import Scratchpad, SpadPortSignature
from fusetile.kernels.config import TileConfig
from fusetile.kernels.isa import FaultCause

from wb_helpers import wb_read, wb_write


CFG = TileConfig(gmem_bytes=2048, spad_banks=4, spad_bank_words=64, partitions=4)
GW = CFG.gmem_words        # 256
SW = CFG.spad_words        # 256
DIRECT = 3                 # partition covering the whole scratchpad, for the testbench


class Harness(Elaboratable):
    """DMA + GMEM + scratchpad; the testbench can take over the scratchpad port."""

    def __init__(self, config):
        self.dma = Dma(config)
        self.gmem = GlobalMemory(config)
        self.spad = Scratchpad(config)
        self.direct = Signal()
        self.tb = SpadPortSignature(config).create()

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma = self.dma
        m.submodules.gmem = self.gmem
        m.submodules.spad = self.spad
        wiring.connect(m, self.dma.gmem, self.gmem.dma)
        port, dma = self.spad.dma, self.dma.spad
        for name in ("part", "offset", "en", "we", "wdata"):
            m.d.comb += getattr(port, name).eq(
                Mux(self.direct, getattr(self.tb, name), getattr(dma, name)))
        m.d.comb += [
            dma.rdata.eq(port.rdata),
            dma.fault.eq(port.fault & ~self.direct),
            self.tb.rdata.eq(port.rdata),
            self.tb.fault.eq(port.fault),
        ]
        return m


def run(dut, bench, vcd=None):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


def cmd(store=0, gmem_addr=0, gmem_stride=0, part=0, spad_addr=0, spad_stride=0, rows=1,
        cols=1):
    """A DMA command as plain integers (``.const`` packs it)."""
    fields = dict(store=store, gmem_addr=gmem_addr, gmem_stride=gmem_stride, part=part,
                  spad_addr=spad_addr, spad_stride=spad_stride, rows=rows, cols=cols)
    return SimpleNamespace(**fields, const=DmaCommand.const(fields))


def words_of(c):
    """Yield (gmem word, spad offset) of a command in transfer order."""
    for r in range(c.rows):
        for k in range(c.cols):
            yield c.gmem_addr + r * c.gmem_stride + k, c.spad_addr + r * c.spad_stride + k


async def set_partitions(ctx, h, table):
    bases = [b for b, _ in table] + [0] * (CFG.partitions - len(table))
    lens = [n for _, n in table] + [0] * (CFG.partitions - len(table))
    bases[DIRECT], lens[DIRECT] = 0, SW
    for i in range(CFG.partitions):
        ctx.set(h.spad.part_base[i], bases[i])
        ctx.set(h.spad.part_len[i], lens[i])


async def issue(ctx, h, c, limit=5000):
    """Run command ``c``; return (busy cycles, word pulses)."""
    dma = h.dma
    assert ctx.get(dma.cmd.ready)
    ctx.set(dma.cmd.payload, c.const)
    ctx.set(dma.cmd.valid, 1)
    await ctx.tick()
    ctx.set(dma.cmd.valid, 0)
    cycles = words = 0
    while ctx.get(dma.busy):
        words += ctx.get(dma.word_in) + ctx.get(dma.word_out)
        await ctx.tick()
        cycles += 1
        assert cycles < limit
    return cycles, words


async def gmem_fill(ctx, h, values):
    for w, v in enumerate(values):
        assert await wb_write(ctx, h.gmem.bus, 2 * w, v & 0xFFFFFFFF) == "ack"
        assert await wb_write(ctx, h.gmem.bus, 2 * w + 1, v >> 32) == "ack"


async def gmem_dump(ctx, h):
    out = []
    for w in range(GW):
        lo, _ = await wb_read(ctx, h.gmem.bus, 2 * w)
        hi, _ = await wb_read(ctx, h.gmem.bus, 2 * w + 1)
        out.append(hi << 32 | lo)
    return out


async def spad_access(ctx, h, offset, data=None):
    tb = h.tb
    ctx.set(h.direct, 1)
    ctx.set(tb.part, DIRECT)
    ctx.set(tb.offset, offset)
    ctx.set(tb.we, data is not None)
    ctx.set(tb.wdata, data or 0)
    ctx.set(tb.en, 1)
    await ctx.tick()
    ctx.set(tb.en, 0)
    ctx.set(h.direct, 0)
    return ctx.get(tb.rdata)


async def spad_fill(ctx, h, values):
    for w, v in enumerate(values):
        await spad_access(ctx, h, w, v)


async def spad_dump(ctx, h):
    return [await spad_access(ctx, h, w) for w in range(SW)]


def random_command(rng, store, table):
    part = rng.randrange(len(table))
    base, length = table[part]
    rows, cols = rng.randint(1, 5), rng.randint(1, 8)
    sstride = rng.randint(cols, cols + 3)
    gstride = rng.randint(cols, cols + 20)
    spad_addr = rng.randint(0, length - ((rows - 1) * sstride + cols))
    gmem_addr = rng.randint(0, GW - ((rows - 1) * gstride + cols))
    return cmd(store=store, gmem_addr=gmem_addr, gmem_stride=gstride, part=part,
               spad_addr=spad_addr, spad_stride=sstride, rows=rows, cols=cols)


TABLE = [(0, 64), (64, 100), (170, 80)]


def test_config_checked():
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 1"):
        Dma(1)


def test_command_layout():
    assert DmaCommand.as_shape().size == 1 + 24 + 16 + 4 + 16 + 16 + 12 + 12


def test_random_transfers():
    """Random loads and stores against a Python model; one word per cycle."""
    h = Harness(CFG)
    rng = random.Random(7)

    async def bench(ctx):
        await set_partitions(ctx, h, TABLE)
        gmem = [rng.getrandbits(64) for _ in range(GW)]
        spad = [rng.getrandbits(64) for _ in range(SW)]
        await gmem_fill(ctx, h, gmem)
        await spad_fill(ctx, h, spad)
        for i in range(24):
            c = random_command(rng, store=i % 2, table=TABLE)
            base = TABLE[c.part][0]
            cycles, words = await issue(ctx, h, c)
            n = c.rows * c.cols
            assert words == n
            assert cycles == n + 1, (c, cycles)
            for g, s in words_of(c):
                if c.store:
                    gmem[g] = spad[base + s]
                else:
                    spad[base + s] = gmem[g]
            assert not ctx.get(h.dma.fault)
        assert await spad_dump(ctx, h) == spad
        assert await gmem_dump(ctx, h) == gmem

    run(h, bench)


def test_back_to_back_and_empty():
    h = Harness(CFG)

    async def bench(ctx):
        await set_partitions(ctx, h, TABLE)
        await gmem_fill(ctx, h, range(16))
        # Empty commands complete at once, with no access.
        for c in (cmd(rows=0, cols=5), cmd(rows=3, cols=0, store=1)):
            ctx.set(h.dma.cmd.payload, c.const)
            ctx.set(h.dma.cmd.valid, 1)
            assert ctx.get(h.dma.cmd.ready)
            await ctx.tick()
            ctx.set(h.dma.cmd.valid, 0)
            assert not ctx.get(h.dma.busy) and ctx.get(h.dma.cmd.ready)
            assert not ctx.get(h.spad.writes) and not ctx.get(h.dma.gmem.we)
        # A 1x1 load, then a 1x1 store issued the cycle the engine goes idle.
        assert await issue(ctx, h, cmd(gmem_addr=5, spad_addr=3)) == (2, 1)
        assert await issue(ctx, h, cmd(store=1, gmem_addr=9, spad_addr=3)) == (2, 1)
        data, _ = await wb_read(ctx, h.gmem.bus, 18)
        assert data == 5
        # cmd.ready is low while busy.
        ctx.set(h.dma.cmd.payload, cmd(rows=2, cols=2).const)
        ctx.set(h.dma.cmd.valid, 1)
        await ctx.tick()
        ctx.set(h.dma.cmd.valid, 0)
        assert ctx.get(h.dma.busy) and not ctx.get(h.dma.cmd.ready)

    run(h, bench)


def test_load_partition_fault():
    h = Harness(CFG)

    async def bench(ctx):
        # Partition 1 is words 64..99; partition 2 (its neighbour) starts at 100.
        await set_partitions(ctx, h, [(0, 64), (64, 36), (100, 50)])
        gmem = list(range(1000, 1000 + GW))
        spad = [0x5A5A0000 + i for i in range(SW)]
        await gmem_fill(ctx, h, gmem)
        await spad_fill(ctx, h, spad)
        # 4 rows of 8 at stride 10 from offset 10: row 2 runs 30..37, 36 faults.
        c = cmd(gmem_addr=20, gmem_stride=8, part=1, spad_addr=10, spad_stride=10,
                rows=4, cols=8)
        cycles, words = await issue(ctx, h, c)
        done = list(words_of(c))[:22]
        assert words == len(done) == 2 * 8 + 6
        assert ctx.get(h.dma.fault) and not ctx.get(h.dma.busy)
        assert not ctx.get(h.dma.cmd.ready)
        assert ctx.get(h.dma.fault_cause) == FaultCause.PARTITION
        assert ctx.get(h.dma.fault_addr) == 36
        assert ctx.get(h.dma.fault_part) == 1
        for g, s in done:
            spad[64 + s] = gmem[g]
        assert await spad_dump(ctx, h) == spad        # neighbours untouched
        # Stays faulted (no access) until abort.
        for _ in range(3):
            assert not ctx.get(h.spad.writes)
            await ctx.tick()
        ctx.set(h.dma.abort, 1)
        await ctx.tick()
        ctx.set(h.dma.abort, 0)
        assert not ctx.get(h.dma.fault) and ctx.get(h.dma.cmd.ready)
        assert ctx.get(h.dma.fault_cause) == FaultCause.NONE

    run(h, bench)


def test_store_partition_fault_and_wide_offset():
    h = Harness(CFG)

    async def bench(ctx):
        await set_partitions(ctx, h, [(0, 64), (64, 36)])
        spad = [0x77000000 + i for i in range(SW)]
        await spad_fill(ctx, h, spad)
        # Column runs past the partition length at row 1.
        c = cmd(store=1, gmem_addr=100, gmem_stride=4, part=1, spad_addr=20, spad_stride=14,
                rows=3, cols=4)
        cycles, words = await issue(ctx, h, c)
        assert words == 4 + 2          # offsets 20..23, 34, 35; 36 faults
        assert ctx.get(h.dma.fault_cause) == FaultCause.PARTITION
        assert ctx.get(h.dma.fault_addr) == 36
        gmem = await gmem_dump(ctx, h)
        assert gmem[100:104] == spad[84:88]
        assert gmem[104:106] == spad[98:100]
        assert gmem[106:112] == [0] * 6
        ctx.set(h.dma.abort, 1)
        await ctx.tick()
        ctx.set(h.dma.abort, 0)
        # base + offset beyond the scratchpad, inside the partition's length.
        await set_partitions(ctx, h, [(0, 0xFFFF)])
        await issue(ctx, h, cmd(store=1, part=0, spad_addr=0xFFF0, rows=1, cols=2))
        assert ctx.get(h.dma.fault_cause) == FaultCause.PARTITION
        assert ctx.get(h.dma.fault_addr) == 0xFFF0
        ctx.set(h.dma.abort, 1)
        await ctx.tick()
        ctx.set(h.dma.abort, 0)
        # An offset past 16 bits is outside every partition (it must not alias to a
        # small offset): reported in full.
        for store in (0, 1):
            c = cmd(store=store, part=0, spad_addr=0x10, spad_stride=0xFFFF, rows=2, cols=1)
            assert (await issue(ctx, h, c))[1] == 1
            assert ctx.get(h.dma.fault_cause) == FaultCause.PARTITION
            assert ctx.get(h.dma.fault_addr) == 0x1000F
            ctx.set(h.dma.abort, 1)
            await ctx.tick()
            ctx.set(h.dma.abort, 0)

    run(h, bench)


@pytest.mark.parametrize("store", [0, 1])
def test_gmem_range_fault(store):
    h = Harness(CFG)

    async def bench(ctx):
        await set_partitions(ctx, h, TABLE)
        spad = [0x33000000 + i for i in range(SW)]
        gmem = [0x44000000 + i for i in range(GW)]
        await spad_fill(ctx, h, spad)
        await gmem_fill(ctx, h, gmem)
        # Rows at GMEM 240..247, 250..257: word 256 (row 1, column 6) is beyond GMEM.
        c = cmd(store=store, gmem_addr=240, gmem_stride=10, part=0, spad_addr=0,
                spad_stride=8, rows=3, cols=8)
        cycles, words = await issue(ctx, h, c)
        assert words == 14
        assert ctx.get(h.dma.fault_cause) == FaultCause.GMEM_RANGE
        assert ctx.get(h.dma.fault_addr) == 256
        for g, s in list(words_of(c))[:14]:
            if store:
                gmem[g] = spad[s]
            else:
                spad[s] = gmem[g]
        assert await spad_dump(ctx, h) == spad
        assert await gmem_dump(ctx, h) == gmem
        # A transfer starting far beyond GMEM (24-bit address) faults at once.
        ctx.set(h.dma.abort, 1)
        await ctx.tick()
        ctx.set(h.dma.abort, 0)
        assert await issue(ctx, h, cmd(store=store, gmem_addr=0xFFFFFF, rows=2, cols=2)) \
            == (1, 0)
        assert ctx.get(h.dma.fault_addr) == 0xFFFFFF

    run(h, bench)


def test_abort():
    h = Harness(CFG)

    async def bench(ctx):
        await set_partitions(ctx, h, TABLE)
        await gmem_fill(ctx, h, [0xABC0 + i for i in range(GW)])
        ctx.set(h.dma.cmd.payload, cmd(gmem_addr=0, gmem_stride=8, part=2, spad_addr=0,
                                       spad_stride=8, rows=8, cols=8).const)
        ctx.set(h.dma.cmd.valid, 1)
        await ctx.tick()
        ctx.set(h.dma.cmd.valid, 0)
        written = 0
        for _ in range(10):
            written += ctx.get(h.spad.writes)
            await ctx.tick()
        ctx.set(h.dma.abort, 1)
        # Nothing is written in the abort cycle.
        assert not ctx.get(h.spad.writes) and not ctx.get(h.dma.word_in)
        await ctx.tick()
        ctx.set(h.dma.abort, 0)
        assert not ctx.get(h.dma.busy) and ctx.get(h.dma.cmd.ready)
        for _ in range(3):
            assert not ctx.get(h.spad.writes)
            await ctx.tick()
        assert written == 9
        spad = await spad_dump(ctx, h)
        assert spad[170:170 + 9] == [0xABC0 + i for i in range(8)] + [0xABC8]
        assert spad[170 + 9:170 + 12] == [0] * 3
        # The engine works normally afterwards.
        assert await issue(ctx, h, cmd(gmem_addr=3, part=2, spad_addr=40)) == (2, 1)

    run(h, bench)


def test_verilog():
    verilog.convert(Dma(CFG), name="dma")
