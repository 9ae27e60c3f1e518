# amaranth: UnusedElaboratable=no

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
from amaranth.back import verilog
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from fusetile.hdl.dma import Dma, DmaCommand
from fusetile.hdl.gmem import GlobalMemory
from fusetile.hdl.scratchpad import Scratchpad
from fusetile.kernels.config import TileConfig
from fusetile.kernels.isa import FaultCause

from conftest import take_during_abort
from wb_helpers import wb_read, wb_write


CFG = TileConfig(gmem_bytes=2048, spad_banks=4, spad_bank_words=64, partitions=4)
#: The engine with 32-bit address registers, and built for area (``compact``) with as
#: many bits as the addresses a transfer uses can need (``hdl/dma.py``).
CONFIGS = pytest.mark.parametrize("cfg", [CFG, replace(CFG, compact=True)],
                                  ids=["deep", "compact"])
GW = CFG.gmem_words        # 256
SW = CFG.spad_words        # 256
DIRECT = 3                 # partition covering the whole scratchpad, for the testbench


class Harness(Elaboratable):
    """DMA + GMEM + scratchpad, the DMA on the scratchpad's ``dma`` port.

    The testbench uses the ports above it: ``a`` to read and ``w`` to write the
    scratchpad directly (in partition ``DIRECT``), and both to take banks from the DMA
    engine (see :class:`Interferer`). It opens a command's partition as it issues it,
    as the tile opens the calling slot's.
    """

    def __init__(self, config, gmem_ports="dual"):
        self.dma = Dma(config)
        self.gmem = GlobalMemory(config, ports=gmem_ports)
        self.spad = Scratchpad(config)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma = self.dma
        m.submodules.gmem = self.gmem
        m.submodules.spad = self.spad
        wiring.connect(m, self.dma.gmem, self.gmem.dma)
        wiring.connect(m, self.dma.spad, self.spad.dma)
        m.d.comb += self.dma.limit.eq(self.spad.limit)      # as the tile wires it
        m.d.comb += self.spad.abort.eq(self.dma.abort)      # as the tile wires it
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
    ctx.set(h.spad.part, DIRECT)
    await ctx.tick().repeat(3)  # the scratchpad's checks follow a base 3 cycles later


async def open_part(ctx, h, part):
    """Open partition ``part`` of the scratchpad (from the next cycle on)."""
    if ctx.get(h.spad.part) != part:
        ctx.set(h.spad.part, part)
        await ctx.tick()


class Interferer:
    """The compute unit as the DMA engine sees it: reads through ``a`` and writes
    through ``w``, both of higher priority than ``dma``.

    When ``steal(k)`` is true for the DMA engine's ``k``-th scratchpad access (from 0,
    counting every presentation), both access the bank of that access, so it stalls
    unless it faults; in other cycles each accesses another bank with probability
    ``other``. Both access the command's partition, the open one (where it has a word
    in the bank); ``w`` writes only words the command does not touch, and ``written``
    holds what it wrote until :meth:`apply`.
    """

    def __init__(self, h, rng, steal, other=0.3):
        self.h, self.rng, self.steal, self.other = h, rng, steal, other
        self.written = {}
        self.accesses = 0
        self._pending = None

    def drive(self, ctx, c):
        """Drive ``a`` and ``w`` for this cycle of command ``c``."""
        spad, dma, rng = self.h.spad, self.h.dma.spad, self.rng
        banks = CFG.spad_banks
        base = ctx.get(spad.part_base[c.part])
        inside = range(base, base + ctx.get(spad.limit))
        touched = {base + s for _, s in words_of(c)}
        target = None
        if ctx.get(dma.en):
            target = (base + ctx.get(dma.offset)) % banks
        steal = target is not None and self.steal(self.accesses)
        self.accesses += target is not None
        self._pending = None
        for port, write in ((spad.a, False), (spad.w, True)):
            if steal:
                bank = target
            elif rng.random() < self.other:
                bank = rng.choice([b for b in range(banks) if b != target])
            else:
                ctx.set(port.en, 0)
                continue
            words = [w for w in inside[(bank - base) % banks::banks]
                     if not write or w not in touched]
            if not words:
                ctx.set(port.en, 0)
                continue
            word = rng.choice(words)
            if write:
                self._pending = word, rng.getrandbits(CFG.word_bits)
                data = self._pending[1]
            else:
                data = None
            ctx.set(port.part, c.part)
            ctx.set(port.offset, word - base)
            ctx.set(port.we, write)
            ctx.set(port.wdata, data or 0)
            ctx.set(port.en, 1)
        # The testbench's ports are never stalled, so every conflict is the DMA's.
        assert not ctx.get(spad.a.stall) and not ctx.get(spad.w.stall)

    def ticked(self):
        if self._pending is not None:
            self.written[self._pending[0]] = self._pending[1]

    def stop(self, ctx):
        ctx.set(self.h.spad.a.en, 0)
        ctx.set(self.h.spad.w.en, 0)

    def apply(self, spad):
        """Put what ``w`` wrote into the model ``spad``, and forget it."""
        for w, v in self.written.items():
            spad[w] = v
        self.written.clear()


def random_steal(rng, rate):
    return lambda access: rng.random() < rate


async def issue(ctx, h, c, intf=None, limit=5000):
    """Run command ``c``; return (busy cycles, word pulses, stalled cycles)."""
    dma = h.dma
    assert ctx.get(dma.cmd.ready)
    await open_part(ctx, h, c.part)     # the engine tests its addresses from the start
    ctx.set(dma.cmd.payload, c.const)
    ctx.set(dma.cmd.valid, 1)
    await ctx.tick()
    ctx.set(dma.cmd.valid, 0)
    cycles = words = stalls = 0
    while ctx.get(dma.busy):
        if intf is not None:
            intf.drive(ctx, c)
        stalled = ctx.get(dma.spad.stall)
        assert ctx.get(h.spad.conflicts) == stalled
        raddr = ctx.get(dma.gmem.raddr)
        if stalled and not c.store:
            # A load freezes: nothing written; the issue stage stays on its word (a
            # GMEM read then is of that word, and is made again).
            assert not ctx.get(dma.word_in)
        words += ctx.get(dma.word_in) + ctx.get(dma.word_out)
        stalls += stalled
        await ctx.tick()
        if stalled and not c.store and ctx.get(dma.busy):
            assert ctx.get(dma.gmem.raddr) == raddr
        if intf is not None:
            intf.ticked()
        cycles += 1
        assert cycles < limit
    if intf is not None:
        intf.stop(ctx)
    return cycles, words, stalls


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
    await open_part(ctx, h, DIRECT)
    port = h.spad.a if data is None else h.spad.w
    ctx.set(port.part, DIRECT)
    ctx.set(port.offset, offset)
    ctx.set(port.we, data is not None)
    ctx.set(port.wdata, data or 0)
    ctx.set(port.en, 1)
    await ctx.tick()
    ctx.set(port.en, 0)
    return ctx.get(port.rdata)


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


TABLE = [(0, 64), (64, 100), (168, 80)]


def test_config_checked():
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 1"):
        Dma(1)


def test_command_layout():
    assert DmaCommand.as_shape().size == 1 + 24 + 16 + 4 + 16 + 16 + 12 + 12


@pytest.mark.parametrize("stall_rate", [0, 0.4])
@CONFIGS
def test_random_transfers(stall_rate, cfg):
    """Random loads and stores against a Python model: one word per cycle, one cycle
    more per stalled scratchpad access, every word moved exactly once."""
    h = Harness(cfg)
    rng = random.Random(7)
    intf = Interferer(h, rng, random_steal(rng, stall_rate)) if stall_rate else None

    async def bench(ctx):
        await set_partitions(ctx, h, TABLE)
        gmem = [rng.getrandbits(64) for _ in range(GW)]
        spad = [rng.getrandbits(64) for _ in range(SW)]
        await gmem_fill(ctx, h, gmem)
        await spad_fill(ctx, h, spad)
        total_stalls = 0
        for i in range(24):
            c = random_command(rng, store=i % 2, table=TABLE)
            base = TABLE[c.part][0]
            cycles, words, stalls = await issue(ctx, h, c, intf)
            n = c.rows * c.cols
            assert words == n
            assert cycles == n + 1 + c.store + stalls, (c, cycles, stalls)
            total_stalls += stalls
            for g, s in words_of(c):
                if c.store:
                    gmem[g] = spad[base + s]
                else:
                    spad[base + s] = gmem[g]
            if intf is not None:
                intf.apply(spad)
            assert not ctx.get(h.dma.fault)
        if intf is None:
            assert total_stalls == 0
        else:
            assert total_stalls > 50
        assert await spad_dump(ctx, h) == spad
        assert await gmem_dump(ctx, h) == gmem

    run(h, bench)


@pytest.mark.parametrize("store", [0, 1])
def test_stall_schedule(store):
    """Stalls on the first word, for several cycles in a row, and on the last word."""
    h = Harness(CFG)
    # Presentations 3, 4, 6, 7, 12..15 and 18 are the nine words.
    stolen = {0, 1, 2, 5, 8, 9, 10, 11, 16, 17}
    intf = Interferer(h, random.Random(3), lambda access: access in stolen, other=0.5)

    async def bench(ctx):
        await set_partitions(ctx, h, TABLE)
        gmem = [0x1100 + i for i in range(GW)]
        spad = [0x2200 + i for i in range(SW)]
        await gmem_fill(ctx, h, gmem)
        await spad_fill(ctx, h, spad)
        c = cmd(store=store, gmem_addr=30, gmem_stride=5, part=1, spad_addr=7,
                spad_stride=3, rows=3, cols=3)
        assert await issue(ctx, h, c, intf) == (9 + 1 + store + 10, 9, 10)
        assert intf.accesses == 9 + 10
        for g, s in words_of(c):
            if store:
                gmem[g] = spad[64 + s]
            else:
                spad[64 + s] = gmem[g]
        intf.apply(spad)
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
            assert not ctx.get(h.spad.bank_writes) and not ctx.get(h.dma.gmem.we)
        # A 1x1 load, then a 1x1 store issued the cycle the engine goes idle.
        assert await issue(ctx, h, cmd(gmem_addr=5, spad_addr=3)) == (2, 1, 0)
        assert await issue(ctx, h, cmd(store=1, gmem_addr=9, spad_addr=3)) == (3, 1, 0)
        data, _ = await wb_read(ctx, h.gmem.bus, 18)
        assert data == 5
        # cmd.ready is low while busy.
        ctx.set(h.dma.cmd.payload, cmd(rows=2, cols=2).const)
        ctx.set(h.dma.cmd.valid, 1)
        await ctx.tick()
        ctx.set(h.dma.cmd.valid, 0)
        assert ctx.get(h.dma.busy) and not ctx.get(h.dma.cmd.ready)

    run(h, bench)


@pytest.mark.parametrize("stall_rate", [0, 0.5])
@CONFIGS
def test_load_partition_fault(stall_rate, cfg):
    h = Harness(cfg)
    rng = random.Random(13)
    intf = Interferer(h, rng, random_steal(rng, stall_rate)) if stall_rate else None

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
        cycles, words, stalls = await issue(ctx, h, c, intf)
        assert (stalls > 0) == bool(intf)
        done = list(words_of(c))[:22]
        assert words == len(done) == 2 * 8 + 6
        assert ctx.get(h.dma.fault) and not ctx.get(h.dma.busy)
        assert not ctx.get(h.dma.cmd.ready)
        assert ctx.get(h.dma.fault_cause) == FaultCause.PARTITION
        assert ctx.get(h.dma.fault_addr) == 36
        assert ctx.get(h.dma.fault_part) == 1
        for g, s in done:
            spad[64 + s] = gmem[g]
        if intf is not None:
            intf.apply(spad)
        assert await spad_dump(ctx, h) == spad        # neighbours untouched
        # Stays faulted (no access) until abort.
        for _ in range(3):
            assert not ctx.get(h.spad.bank_writes)
            await ctx.tick()
        ctx.set(h.dma.abort, 1)
        await ctx.tick()
        ctx.set(h.dma.abort, 0)
        assert not ctx.get(h.dma.fault) and ctx.get(h.dma.cmd.ready)
        assert ctx.get(h.dma.fault_cause) == FaultCause.NONE

    run(h, bench)


@pytest.mark.parametrize("stall_rate", [0, 0.5])
@CONFIGS
def test_store_partition_fault_and_wide_offset(stall_rate, cfg):
    h = Harness(cfg)
    rng = random.Random(17)
    intf = Interferer(h, rng, random_steal(rng, stall_rate)) if stall_rate else None

    async def bench(ctx):
        await set_partitions(ctx, h, [(0, 64), (64, 36)])
        spad = [0x77000000 + i for i in range(SW)]
        await spad_fill(ctx, h, spad)
        # Column runs past the partition length at row 1.
        c = cmd(store=1, gmem_addr=100, gmem_stride=4, part=1, spad_addr=20, spad_stride=14,
                rows=3, cols=4)
        cycles, words, stalls = await issue(ctx, h, c, intf)
        assert words == 4 + 2          # offsets 20..23, 34, 35; 36 faults
        assert (stalls > 0) == bool(intf)
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
        await issue(ctx, h, cmd(store=1, part=0, spad_addr=0xFFF0, rows=1, cols=2), intf)
        assert ctx.get(h.dma.fault_cause) == FaultCause.PARTITION
        assert ctx.get(h.dma.fault_addr) == 0xFFF0
        ctx.set(h.dma.abort, 1)
        await ctx.tick()
        ctx.set(h.dma.abort, 0)
        # An offset past 16 bits is outside every partition (it must not alias to a
        # small offset): reported in full.
        for store in (0, 1):
            c = cmd(store=store, part=0, spad_addr=0x10, spad_stride=0xFFFF, rows=2, cols=1)
            assert (await issue(ctx, h, c, intf))[1] == 1
            assert ctx.get(h.dma.fault_cause) == FaultCause.PARTITION
            assert ctx.get(h.dma.fault_addr) == 0x1000F
            ctx.set(h.dma.abort, 1)
            await ctx.tick()
            ctx.set(h.dma.abort, 0)

    run(h, bench)


@pytest.mark.parametrize("stall_rate", [0, 0.5])
@pytest.mark.parametrize("store", [0, 1])
@CONFIGS
def test_gmem_range_fault(store, stall_rate, cfg):
    h = Harness(cfg)
    rng = random.Random(19 + store)
    intf = Interferer(h, rng, random_steal(rng, stall_rate)) if stall_rate else None

    async def bench(ctx):
        await set_partitions(ctx, h, TABLE)
        spad = [0x33000000 + i for i in range(SW)]
        gmem = [0x44000000 + i for i in range(GW)]
        await spad_fill(ctx, h, spad)
        await gmem_fill(ctx, h, gmem)
        # Rows at GMEM 240..247, 250..257: word 256 (row 1, column 6) is beyond GMEM.
        c = cmd(store=store, gmem_addr=240, gmem_stride=10, part=0, spad_addr=0,
                spad_stride=8, rows=3, cols=8)
        cycles, words, stalls = await issue(ctx, h, c, intf)
        assert words == 14
        assert cycles == 14 + 1 + store + stalls and (stalls > 0) == bool(intf)
        assert ctx.get(h.dma.fault_cause) == FaultCause.GMEM_RANGE
        assert ctx.get(h.dma.fault_addr) == 256
        for g, s in list(words_of(c))[:14]:
            if store:
                gmem[g] = spad[s]
            else:
                spad[s] = gmem[g]
        if intf is not None:
            intf.apply(spad)
        assert await spad_dump(ctx, h) == spad
        assert await gmem_dump(ctx, h) == gmem
        # A transfer starting far beyond GMEM (24-bit address) faults at once (a store
        # in the cycle after: its fault waits for the words before it, none here).
        ctx.set(h.dma.abort, 1)
        await ctx.tick()
        ctx.set(h.dma.abort, 0)
        assert await issue(ctx, h, cmd(store=store, gmem_addr=0xFFFFFF, rows=2, cols=2),
                           intf) == (1 + store, 0, 0)
        assert ctx.get(h.dma.fault_addr) == 0xFFFFFF
        # A row's first word a whole stride past the last word of GMEM: its address
        # reported in full (17 bits here).
        ctx.set(h.dma.abort, 1)
        await ctx.tick()
        ctx.set(h.dma.abort, 0)
        c = cmd(store=store, gmem_addr=GW - 1, gmem_stride=0xFFFF, part=0, rows=2, cols=1)
        assert (await issue(ctx, h, c, intf))[1] == 1
        assert ctx.get(h.dma.fault_cause) == FaultCause.GMEM_RANGE
        assert ctx.get(h.dma.fault_addr) == GW - 1 + 0xFFFF

    run(h, bench)


@CONFIGS
def test_abort(cfg):
    h = Harness(cfg)

    async def bench(ctx):
        await set_partitions(ctx, h, TABLE)
        await gmem_fill(ctx, h, [0xABC0 + i for i in range(GW)])
        ctx.set(h.spad.part, 2)
        ctx.set(h.dma.cmd.payload, cmd(gmem_addr=0, gmem_stride=8, part=2, spad_addr=0,
                                       spad_stride=8, rows=8, cols=8).const)
        ctx.set(h.dma.cmd.valid, 1)
        await ctx.tick()
        ctx.set(h.dma.cmd.valid, 0)
        written = 0
        for _ in range(10):
            written += ctx.get(h.spad.bank_writes).bit_count()
            await ctx.tick()
        ctx.set(h.dma.abort, 1)
        # Nothing is written in the abort cycle.
        assert not ctx.get(h.spad.bank_writes) and not ctx.get(h.dma.word_in)
        await ctx.tick()
        ctx.set(h.dma.abort, 0)
        assert not ctx.get(h.dma.busy) and ctx.get(h.dma.cmd.ready)
        for _ in range(3):
            assert not ctx.get(h.spad.bank_writes)
            await ctx.tick()
        assert written == 9
        spad = await spad_dump(ctx, h)
        assert spad[168:168 + 9] == [0xABC0 + i for i in range(8)] + [0xABC8]
        assert spad[168 + 9:168 + 12] == [0] * 3
        # The engine works normally afterwards.
        assert await issue(ctx, h, cmd(gmem_addr=3, part=2, spad_addr=40)) == (2, 1, 0)
        # A command taken in an abort's cycle is dropped: no access, no word, idle after.
        await take_during_abort(
            ctx, h.dma, cmd(gmem_addr=0, part=2, spad_addr=50, cols=4).const.as_bits())
        for _ in range(6):
            assert not ctx.get(h.dma.busy) and not ctx.get(h.spad.bank_writes)
            assert not ctx.get(h.dma.word_in) and not ctx.get(h.dma.fault)
            await ctx.tick()
        assert (await spad_dump(ctx, h))[168 + 50:168 + 54] == [0] * 4

    run(h, bench)


@pytest.mark.parametrize("ports", ["shared", "single"])
def test_abort_of_a_store(ports):
    """A store aborted while it writes: `wclaim` is high whenever `we` is, and in the
    abort cycle without it (the write is cancelled after GMEM has steered its port
    to it); GMEM holds exactly the words written before the abort, whatever its ports."""
    h = Harness(CFG, gmem_ports=ports)

    async def bench(ctx):
        await set_partitions(ctx, h, TABLE)
        await gmem_fill(ctx, h, [0] * GW)
        await spad_fill(ctx, h, [0x5100 + i for i in range(CFG.spad_words)])
        ctx.set(h.spad.part, 1)
        ctx.set(h.dma.cmd.payload, cmd(store=1, gmem_addr=16, gmem_stride=8, part=1,
                                       spad_addr=0, spad_stride=8, rows=4, cols=8).const)
        ctx.set(h.dma.cmd.valid, 1)
        await ctx.tick()
        ctx.set(h.dma.cmd.valid, 0)
        written = 0
        while written < 9:
            we, claim = ctx.get(h.dma.gmem.we), ctx.get(h.dma.gmem.wclaim)
            assert we == claim
            written += we
            await ctx.tick()
        assert ctx.get(h.dma.gmem.wclaim)       # the tenth word's write, ...
        ctx.set(h.dma.abort, 1)
        assert not ctx.get(h.dma.gmem.we)       # ... cancelled
        await ctx.tick()
        ctx.set(h.dma.abort, 0)
        assert not ctx.get(h.dma.gmem.wclaim) and not ctx.get(h.dma.busy)
        gmem = await gmem_dump(ctx, h)
        assert gmem[16:16 + 9] == [0x5140 + i for i in range(9)]
        assert gmem[16 + 9:16 + 12] == [0] * 3

    run(h, bench)


def test_verilog():
    verilog.convert(Dma(CFG), name="dma")
