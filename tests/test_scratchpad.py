# amaranth: UnusedElaboratable=no

import random
from dataclasses import replace

import pytest
from amaranth.back import verilog
from amaranth.hdl import unsigned
from amaranth.sim import Simulator

from fusetile.hdl.scratchpad import Scratchpad, SpadPortSignature
from fusetile.kernels.config import TileConfig


CFG = TileConfig(spad_banks=4, spad_bank_words=16, partitions=4)     # 64 words
#: The partition tests run on both builds: built for area (``compact``), only the open
#: partition's limit is worked out, after its entry is selected.
BUILDS = pytest.mark.parametrize("config", [CFG, replace(CFG, compact=True)],
                                 ids=["deep", "compact"])


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


async def set_table(ctx, dut, table, part=0):
    """Write the partition table and open ``part``; the checks follow a base three
    cycles later (its room, the limit, the open partition's limit), a length two
    (built for area, both one)."""
    for i, (base, length) in enumerate(table):
        ctx.set(dut.part_base[i], base)
        ctx.set(dut.part_len[i], length)
    ctx.set(dut.part, part)
    await ctx.tick().repeat(3)


async def open_part(ctx, dut, part):
    """Open ``part`` (from the next cycle on) unless it is open."""
    if ctx.get(dut.part) != part:
        ctx.set(dut.part, part)
        await ctx.tick()


async def access(ctx, dut, part, offset, data=None):
    """One access through ``dma``, in ``part`` (opened first if it is not); return
    (fault, (bank_reads, bank_writes), read data)."""
    await open_part(ctx, dut, part)
    port = dut.dma
    ctx.set(port.part, part)
    ctx.set(port.offset, offset)
    ctx.set(port.we, data is not None)
    ctx.set(port.wdata, data or 0)
    ctx.set(port.en, 1)
    fault = ctx.get(port.fault)
    pulses = (ctx.get(dut.bank_reads), ctx.get(dut.bank_writes))
    await ctx.tick()
    ctx.set(port.en, 0)
    rdata = ctx.get(port.rdata)
    # The word's parts: one holds it (that of its bank's pair), the others are 0.
    parts = [ctx.get(port.rdata_parts[k]) for k in range(len(port.rdata_parts))]
    assert parts == [rdata if k == (offset % len(dut.bank_reads)) // 2 else 0
                     for k in range(len(parts))], (offset, parts, rdata)
    return fault, pulses, rdata


def test_config_checked():
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 4"):
        Scratchpad(4)
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 4"):
        SpadPortSignature(4)


def test_ports():
    dut = Scratchpad(CFG)
    assert len(dut.part_base.as_value()) == 16 * CFG.partitions
    assert Scratchpad.PORTS == ("a", "b", "w", "dma")
    for name in Scratchpad.PORTS:
        assert len(getattr(dut, name).rdata) == CFG.word_bits
        assert len(getattr(dut, name).stall) == 1
    assert len(dut.bank_reads) == len(dut.bank_writes) == CFG.spad_banks
    assert dut.conflicts.shape() == unsigned(3)      # range(len(PORTS) + 1)


@pytest.mark.parametrize("config", [CFG, TileConfig(spad_banks=3, spad_bank_words=10,
                                                    partitions=2, word_bytes=4)])
def test_round_trip_and_interleaving(config):
    dut = Scratchpad(config)
    words = config.spad_words
    rng = random.Random(5)

    async def bench(ctx):
        # One partition over the whole scratchpad, one over its second half.
        await set_table(ctx, dut, [(0, words), (words // 2, words - words // 2)])
        model = [rng.getrandbits(config.word_bits) for _ in range(words)]
        banks = config.spad_banks
        for w, v in enumerate(model):
            assert (await access(ctx, dut, 0, w, v))[:2] == (0, (0, 1 << w % banks))
        await ctx.tick()            # the last write is posted
        for w in rng.sample(range(words), words):
            fault, pulses, data = await access(ctx, dut, 0, w)
            assert (fault, pulses, data) == (0, (1 << w % banks, 0), model[w])
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
        await set_table(ctx, dut, [(8, CFG.spad_words - 8)])
        for off in range(CFG.spad_words - 8):
            await access(ctx, dut, 0, off, 1000 + off)
        await ctx.tick()            # the last write is posted
        for w in range(8, CFG.spad_words):
            assert ctx.get(banks[w % 4].data[w // 4]) == 1000 + w - 8

    run(top, bench)


@BUILDS
def test_partition_faults(config):
    dut = Scratchpad(config)

    async def bench(ctx):
        # Partition 0: words 0..15; 1: 16..39; 2: 40..63 but claims 40 words (past the
        # end of the scratchpad); 3: empty.
        await set_table(ctx, dut, [(0, 16), (16, 24), (40, 40), (0, 0)])
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
        await set_table(ctx, dut, [(0, 64)])
        for w in range(CFG.spad_words):
            assert (await access(ctx, dut, 0, w))[2] == w
        # No fault without en.
        ctx.set(dut.dma.part, 9)
        ctx.set(dut.dma.en, 0)
        assert not ctx.get(dut.dma.fault)

    run(dut, bench)


def test_abort_cancels_the_cycles_accesses():
    """With `abort` no access is performed (the units are being aborted); the ports'
    fault and stall are as without it."""
    dut = Scratchpad(CFG)

    async def bench(ctx):
        await set_table(ctx, dut, [(0, 16)])
        await access(ctx, dut, 0, 5, 0x55)
        ctx.set(dut.abort, 1)
        assert (await access(ctx, dut, 0, 5, 0xAA))[:2] == (0, (0, 0))     # no write
        assert (await access(ctx, dut, 0, 5))[:2] == (0, (0, 0))           # no read
        assert (await access(ctx, dut, 0, 16, 0xAA))[0] == 1               # still faults
        # `w` writes offset 1, in the bank of offset 5: the DMA port's write to 5 is
        # told to stall, as without abort, and neither write is performed.
        for port, offset in ((dut.w, 1), (dut.dma, 5)):
            ctx.set(port.part, 0)
            ctx.set(port.offset, offset)
            ctx.set(port.we, 1)
            ctx.set(port.wdata, 0xAA)
            ctx.set(port.en, 1)
        assert ctx.get(dut.dma.stall) and not ctx.get(dut.w.stall)
        assert (ctx.get(dut.bank_reads), ctx.get(dut.bank_writes)) == (0, 0)
        await ctx.tick()
        ctx.set(dut.w.en, 0)
        ctx.set(dut.dma.en, 0)
        ctx.set(dut.abort, 0)
        assert (await access(ctx, dut, 0, 5))[1:] == ((1 << 5 % 4, 0), 0x55)
        assert (await access(ctx, dut, 0, 1))[2] == 0

    run(dut, bench)


@BUILDS
def test_limit_is_the_open_partitions_extent(config):
    """``limit`` is the first offset that faults, for every table shape above."""
    dut = Scratchpad(config)

    async def bench(ctx):
        await set_table(ctx, dut, [(0, 16), (16, 24), (40, 40), (0, 0)])
        for part, limit in [(0, 16), (1, 24), (2, 24), (3, 0), (4, 0), (15, 0)]:
            await open_part(ctx, dut, part)
            assert ctx.get(dut.limit) == limit, part
            for offset, faults in ((limit - 1, False), (limit, True)):
                if offset >= 0:
                    assert (await access(ctx, dut, part, offset))[0] == faults, \
                        (part, offset)
        for part in (0, 1):
            await set_table(ctx, dut, [(64, 5), (70, 1)], part)      # bases past the end
            assert ctx.get(dut.limit) == 0
        # A base that is not a bank's first word: the partition has no words.
        for base in (1, 2, 3, 18):
            await set_table(ctx, dut, [(base, 8), (0, 8)])
            assert ctx.get(dut.limit) == 0, base
            assert (await access(ctx, dut, 0, 0, 0xAA))[:2] == (1, (0, 0)), base
        await set_table(ctx, dut, [(20, 8)])
        assert ctx.get(dut.limit) == 8

    run(dut, bench)


@BUILDS
def test_one_partition_open_registered(config):
    """Only the open partition is reachable, and opening one, or changing the table,
    takes effect the cycle after (a length, two cycles after, but built for area)."""
    dut = Scratchpad(config)

    async def bench(ctx):
        await set_table(ctx, dut, [(0, 16), (16, 24)])
        await access(ctx, dut, 1, 3, 0x33)          # word 19
        present(ctx, dut.dma, 0, 3)
        assert ctx.get(dut.dma.fault) and ctx.get(dut.limit) == 24     # 1 is open
        ctx.set(dut.part, 0)
        assert ctx.get(dut.dma.fault)               # ... until the next cycle
        await ctx.tick()
        assert not ctx.get(dut.dma.fault) and ctx.get(dut.limit) == 16
        present(ctx, dut.a, 1, 3)
        assert ctx.get(dut.a.fault)
        idle(ctx, dut.a, dut.dma)
        # A new base for the open partition moves its accesses a cycle later.
        ctx.set(dut.part_base[0], 16)
        present(ctx, dut.dma, 0, 3)
        await ctx.tick()
        assert ctx.get(dut.dma.rdata) != 0x33       # word 3, as the table was
        await ctx.tick()
        assert ctx.get(dut.dma.rdata) == 0x33       # word 19
        # A new length is checked two cycles later (built for area, one).
        ctx.set(dut.part_len[0], 3)
        await ctx.tick()
        if not config.compact:
            assert not ctx.get(dut.dma.fault) and ctx.get(dut.limit) == 16
            await ctx.tick()
        assert ctx.get(dut.dma.fault) and ctx.get(dut.limit) == 3
        idle(ctx, dut.dma)

    run(dut, bench)


def test_read_after_write_and_latency():
    dut = Scratchpad(CFG)

    async def bench(ctx):
        await set_table(ctx, dut, [(8, 20)])
        port = dut.dma
        # A write is posted: a read of its word in the next cycle returns the old word
        # (in simulation; undefined on an FPGA), from the cycle after on the new one.
        for off, v in ((3, 111), (4, 222)):
            ctx.set(port.part, 0); ctx.set(port.offset, off)
            ctx.set(port.en, 1); ctx.set(port.we, 1); ctx.set(port.wdata, v)
            await ctx.tick()
            ctx.set(port.we, 0)
            await ctx.tick()
            assert ctx.get(port.rdata) == 0
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


def present(ctx, port, part, offset, data=None):
    """Drive an access on ``port`` (a write if ``data`` is given) without a clock."""
    ctx.set(port.part, part)
    ctx.set(port.offset, offset)
    ctx.set(port.we, data is not None)
    ctx.set(port.wdata, data or 0)
    ctx.set(port.en, 1)


def idle(ctx, *ports):
    for port in ports:
        ctx.set(port.en, 0)


def stalls(ctx, dut):
    return tuple(ctx.get(getattr(dut, name).stall) for name in Scratchpad.PORTS)


def faults(ctx, dut):
    return tuple(ctx.get(getattr(dut, name).fault) for name in Scratchpad.PORTS)


def stats(ctx, dut):
    return ctx.get(dut.bank_reads), ctx.get(dut.bank_writes), ctx.get(dut.conflicts)


async def fill(ctx, dut, values):
    for w, v in enumerate(values):
        await access(ctx, dut, 0, w, v)


def test_same_bank_priority_and_retry():
    dut = Scratchpad(CFG)
    a, b, w, dma = (getattr(dut, name) for name in Scratchpad.PORTS)

    async def bench(ctx):
        await set_table(ctx, dut, [(0, CFG.spad_words)])
        await fill(ctx, dut, [100 + i for i in range(CFG.spad_words)])
        # Four reads of bank 1 in one cycle: one is performed per cycle, in priority
        # order; the others stall and present their access again.
        offsets = {a: 1, b: 5, w: 9, dma: 13}
        waiting = [a, b, w, dma]
        while waiting:
            for port in waiting:
                present(ctx, port, 0, offsets[port])
            expect = tuple(int(p in waiting[1:]) for p in (a, b, w, dma))
            assert stalls(ctx, dut) == expect
            assert faults(ctx, dut) == (0, 0, 0, 0)
            assert stats(ctx, dut) == (0b0010, 0, len(waiting) - 1)
            await ctx.tick()
            winner = waiting.pop(0)
            idle(ctx, winner)
            assert ctx.get(winner.rdata) == 100 + offsets[winner]

        # Two writes of bank 2: w wins, dma stalls (nothing is written by it).
        present(ctx, w, 0, 2, 0xAAA)
        present(ctx, dma, 0, 6, 0xBBB)
        assert stalls(ctx, dut) == (0, 0, 0, 1)
        assert stats(ctx, dut) == (0, 0b0100, 1)
        await ctx.tick()
        idle(ctx, w)
        # dma presents its write again, while a reads the same word: a read and a
        # write of one bank by different ports are both performed, and the read sees
        # the word as it was before the write.
        present(ctx, a, 0, 6)
        assert stalls(ctx, dut) == (0, 0, 0, 0)
        assert stats(ctx, dut) == (0b0100, 0b0100, 0)
        await ctx.tick()
        idle(ctx, dma)
        assert ctx.get(a.rdata) == 106
        idle(ctx, a)
        await ctx.tick()            # the posted write reaches the bank
        present(ctx, a, 0, 6)
        await ctx.tick()
        assert ctx.get(a.rdata) == 0xBBB
        present(ctx, a, 0, 2)
        await ctx.tick()
        idle(ctx, a)
        assert ctx.get(a.rdata) == 0xAAA

        # Writes are arbitrated by the same priority, whichever ports make them.
        present(ctx, a, 0, 0, 1)
        present(ctx, b, 0, 4, 2)
        assert stalls(ctx, dut) == (0, 1, 0, 0)
        assert stats(ctx, dut) == (0, 0b0001, 1)
        # Without en there is no request: no stall, no fault.
        idle(ctx, a, b)
        ctx.set(b.part, 9)
        assert stalls(ctx, dut) == faults(ctx, dut) == (0, 0, 0, 0)
        assert stats(ctx, dut) == (0, 0, 0)

    run(dut, bench)


def test_different_banks_and_rdata_routing():
    dut = Scratchpad(CFG)
    a, b, w, dma = (getattr(dut, name) for name in Scratchpad.PORTS)

    async def bench(ctx):
        await set_table(ctx, dut, [(0, CFG.spad_words)])
        await fill(ctx, dut, [100 + i for i in range(CFG.spad_words)])
        # Four ports, four banks: all performed in the same cycle.
        present(ctx, a, 0, 0)
        present(ctx, b, 0, 5)
        present(ctx, dma, 0, 10)
        present(ctx, w, 0, 15, 0x515)
        assert stalls(ctx, dut) == (0, 0, 0, 0)
        assert stats(ctx, dut) == (0b0111, 0b1000, 0)
        await ctx.tick()
        # Each port sees the word of the bank it read, while the next reads go on.
        assert (ctx.get(a.rdata), ctx.get(b.rdata), ctx.get(dma.rdata)) == (100, 105, 110)
        idle(ctx, w)
        present(ctx, a, 0, 14)
        present(ctx, b, 0, 4)
        present(ctx, dma, 0, 1)
        assert stats(ctx, dut) == (0b0111, 0, 0)
        await ctx.tick()
        assert (ctx.get(a.rdata), ctx.get(b.rdata), ctx.get(dma.rdata)) == (114, 104, 101)
        # A read and a write of the same bank, different words: both performed.
        idle(ctx, b)
        present(ctx, a, 0, 3)
        present(ctx, dma, 0, 7, 0x707)
        assert stalls(ctx, dut) == (0, 0, 0, 0)
        assert stats(ctx, dut) == (0b1000, 0b1000, 0)
        await ctx.tick()
        idle(ctx, dma)
        assert ctx.get(a.rdata) == 103
        idle(ctx, a)
        await ctx.tick()            # the posted write reaches the bank
        for off, value in ((7, 0x707), (15, 0x515)):
            present(ctx, a, 0, off)
            await ctx.tick()
            assert ctx.get(a.rdata) == value
        idle(ctx, a)

    run(dut, bench)


def test_fault_wins_over_stall():
    dut = Scratchpad(CFG)
    a, b, w, dma = (getattr(dut, name) for name in Scratchpad.PORTS)

    async def bench(ctx):
        # Partition 1 is words 0..7.
        await set_table(ctx, dut, [(0, CFG.spad_words), (0, 8)])
        await fill(ctx, dut, [100 + i for i in range(CFG.spad_words)])
        # dma's access is outside its partition and loses bank 0 to a (or w): it
        # faults, and its stall (which does not wait for the partition test) is not
        # counted as a conflict.
        for data in (None, 0xDEAD):
            present(ctx, a if data is None else w, 0, 4, data)
            present(ctx, dma, 1, 8, data)
            assert faults(ctx, dut) == (0, 0, 0, 1)
            assert stalls(ctx, dut) == (0, 0, 0, 1)
            assert stats(ctx, dut) == ((0b0001, 0, 0) if data is None else (0, 0b0001, 0))
            await ctx.tick()
            idle(ctx, a, w, dma)
        # A faulting access still takes its bank (arbitration does not wait for the
        # partition test): a port below it that wants the bank stalls.
        present(ctx, a, 1, 16)
        present(ctx, b, 0, 0)
        present(ctx, w, 4, 0, 0xBAD)
        present(ctx, dma, 0, 12, 0x1212)
        assert faults(ctx, dut) == (1, 0, 1, 0)
        assert stalls(ctx, dut) == (0, 1, 0, 1)
        assert stats(ctx, dut) == (0, 0, 2)
        await ctx.tick()
        idle(ctx, a, w)
        assert stalls(ctx, dut) == (0, 0, 0, 0)
        assert stats(ctx, dut) == (0b0001, 0b0001, 0)
        await ctx.tick()
        idle(ctx, b, dma)
        assert ctx.get(b.rdata) == 100
        for off, value in ((0, 100), (4, 0xDEAD), (8, 108), (12, 0x1212)):
            present(ctx, a, 0, off)
            await ctx.tick()
            assert ctx.get(a.rdata) == value
        idle(ctx, a)

    run(dut, bench)


@pytest.mark.parametrize("config", [CFG, TileConfig(spad_banks=3, spad_bank_words=10,
                                                    partitions=2, word_bytes=4),
                                    replace(CFG, compact=True)],
                         ids=["4-banks", "3-banks", "compact"])
def test_random_arbitration(config):
    """Random traffic on every port against a model of the arbitration."""
    dut = Scratchpad(config)
    ports = [getattr(dut, name) for name in Scratchpad.PORTS]
    words, banks = config.spad_words, config.spad_banks
    table = [(0, words), (words // 2, words // 4)][:config.partitions]
    rng = random.Random(11)

    async def bench(ctx):
        await set_table(ctx, dut, table)
        model = [rng.getrandbits(config.word_bits) for _ in range(words)]
        await fill(ctx, dut, model)
        await open_part(ctx, dut, 0)
        await ctx.tick()            # the last write is posted
        is_open = 0
        total_conflicts = 0
        posted = {}                 # the writes of the cycle before: {word: data}
        for _ in range(400):
            expect_fault, expect_stall, reads, writes = [], [], {}, {}
            taken_rd, taken_wr = set(), set()
            for port in ports:
                en = rng.random() < 0.8
                # Mostly the open partition, sometimes another (or none).
                part = is_open if rng.random() < 0.8 else rng.randrange(len(table) + 1)
                # Small offsets: conflicts are frequent, some land outside.
                off = rng.randrange(words // 3)
                data = rng.getrandbits(config.word_bits) if rng.random() < 0.4 else None
                present(ctx, port, part, off, data)
                ctx.set(port.en, en)
                base, length = table[part] if part < len(table) else (0, 0)
                outside = part != is_open or off >= length or base + off >= words
                fault = stall = 0
                if en:
                    # Every access claims its offset's bank (partitions start at a
                    # bank's first word); one outside its partition faults and is
                    # not performed (its stall, as without the fault, is not a
                    # conflict).
                    bank = off % banks
                    taken = taken_wr if data is not None else taken_rd
                    stall = int(bank in taken)
                    fault = int(outside)
                    if not fault and not stall:
                        claimed = writes if data is not None else reads
                        claimed[bank] = (port, base + off, data)
                    taken.add(bank)
                expect_fault.append(fault)
                expect_stall.append(stall)
            assert faults(ctx, dut) == tuple(expect_fault)
            assert stalls(ctx, dut) == tuple(expect_stall)
            conflicts = sum(s & ~f for s, f in zip(expect_stall, expect_fault))
            assert stats(ctx, dut) == (sum(1 << b for b in reads),
                                       sum(1 << b for b in writes), conflicts)
            total_conflicts += conflicts
            if rng.random() < 0.05:         # open another partition from the next cycle
                ctx.set(dut.part, rng.randrange(len(table) + 1))
            await ctx.tick()
            is_open = ctx.get(dut.part)
            # A read sees the writes of two cycles before and earlier (writes are
            # posted; a read of a word written the cycle before returns the old word).
            for port, word, _ in reads.values():
                assert ctx.get(port.rdata) == model[word]
            for word, data in posted.items():
                model[word] = data
            posted = {word: data for _, word, data in writes.values()}
        assert total_conflicts > 50      # the traffic did exercise the arbitration
        for word, data in posted.items():
            model[word] = data
        idle(ctx, *ports)
        await ctx.tick()
        for w in range(words):
            assert (await access(ctx, dut, 0, w))[2] == model[w]

    run(dut, bench)


def test_verilog():
    verilog.convert(Scratchpad(CFG), name="scratchpad")
    verilog.convert(Scratchpad(TileConfig(spad_banks=3, spad_bank_words=7)), name="spad3")
