import random

import pytest

from wb_helpers import raises_in_constructor
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from fusetile.hdl import tile
from fusetile.hdl.counters import CounterReadSignature, PerfCounters
from fusetile.hdl.regmap import PIPELINED_COUNTERS
from fusetile.kernels.config import TileConfig


# Each behaviour of both builds: pipelined for a fast clock, and for area (compact).
BUILDS = pytest.mark.parametrize("compact", [False, True], ids=["deep", "compact"])


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


async def read(ctx, dut, name, *, limit=12):
    """Read counter ``name`` through the read port: (value, cycles from stb to ack)."""
    ctx.set(dut.read.stb, 1)
    ctx.set(dut.read.index, dut.names.index(name) if name in dut.names else len(dut.names))
    await ctx.tick()
    ctx.set(dut.read.stb, 0)
    for cycles in range(1, limit):
        if ctx.get(dut.read.ack):
            return ctx.get(dut.read.data), cycles
        await ctx.tick()
    raise AssertionError(f"no answer to a read of {name} in {limit} cycles")


async def read_all(ctx, dut, names):
    return [(await read(ctx, dut, n))[0] for n in names]


@BUILDS
def test_count_freeze_clear(compact):
    """``A``, ``B`` and ``D`` live in the RAM (``D`` pipelined), ``C`` in a register;
    freeze and clear act on the events of their own cycle either way."""
    dut = PerfCounters(["A", "B", "C", "D"], immediate=["C"], pipelined=["D"], compact=compact)

    async def bench(ctx):
        assert await read_all(ctx, dut, "ABCD") == [0, 0, 0, 0]
        ctx.set(dut.inc["A"], 1)
        ctx.set(dut.inc["B"], 8)
        ctx.set(dut.inc["C"], 1)
        ctx.set(dut.inc["D"], 1)
        await ctx.tick().repeat(5)
        ctx.set(dut.freeze, 1)
        # Five cycles' events; none of the freeze's own, nor of the reads' cycles.
        assert await read_all(ctx, dut, "ABCD") == [5, 40, 5, 5]
        assert ctx.get(dut.value["C"]) == 5
        await ctx.tick().repeat(50)
        assert await read_all(ctx, dut, "ABCD") == [5, 40, 5, 5]
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        assert await read_all(ctx, dut, "ABCD") == [0, 0, 0, 0]
        ctx.set(dut.freeze, 0)
        await ctx.tick().repeat(2)
        ctx.set(dut.freeze, 1)
        assert await read_all(ctx, dut, "ABCD") == [2, 16, 2, 2]
        ctx.set(dut.freeze, 0)
        # An event in a clear's cycle is not counted, one just before it is cleared.
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        ctx.set(dut.inc["A"], 0)
        ctx.set(dut.inc["B"], 0)
        ctx.set(dut.inc["D"], 0)
        await ctx.tick().repeat(3)
        assert (await read(ctx, dut, "A"))[0] == 0
        assert (await read(ctx, dut, "B"))[0] == 0
        assert (await read(ctx, dut, "D"))[0] == 0

    run(dut, bench)


@BUILDS
def test_carries_into_high_word(compact):
    dut = PerfCounters(["A"], inc_width=32, compact=compact)

    async def bench(ctx):
        ctx.set(dut.inc["A"], 0xFFFF_FFFF)
        await ctx.tick().repeat(3)
        ctx.set(dut.freeze, 1)
        assert (await read(ctx, dut, "A"))[0] == 3 * 0xFFFF_FFFF

    run(dut, bench)


@BUILDS
def test_an_answer_holds_until_the_next_read(compact):
    """``data`` keeps a read's answer, from the RAM or a register, while the counters
    go on counting, until the next ``stb``: the CSR bank built for area answers a
    counter's high word from it."""
    dut = PerfCounters(["A", "B", "C"], inc_width=4, immediate=["C"], compact=compact)

    async def bench(ctx):
        for n in dut.names:
            ctx.set(dut.inc[n], 5)
        await ctx.tick().repeat(6)
        for n in ("A", "C", "B", "A"):
            value, _ = await read(ctx, dut, n)
            assert value > 0
            for _ in range(40):
                await ctx.tick()
                assert ctx.get(dut.read.data) == value
            assert (await read(ctx, dut, n))[0] > value

    run(dut, bench)


@BUILDS
def test_index_past_the_last_reads_zero(compact):
    # Index 3 is past the last.
    dut = PerfCounters(["A", "B", "C"], inc_width=4, compact=compact)

    async def bench(ctx):
        ctx.set(dut.inc["A"], 3)
        await ctx.tick().repeat(4)
        assert (await read(ctx, dut, "nothing"))[0] == 0
        assert (await read(ctx, dut, "A"))[0] > 0

    run(dut, bench)


@BUILDS
def test_exact_under_reads_freeze_and_clear(compact):
    """Many counters near their largest increment every cycle, reads back to back (the
    scanner's slowest pace), random freezes, clears (in a read's ``stb`` cycle and while
    it waits) and voids (of every third counter): every read is the count of one cycle
    from its ``stb`` to its ``ack`` (from two cycles before, for the pipelined counters:
    every fourth), and a frozen set reads exactly. No cycle reads the RAM word it writes."""
    rng = random.Random(7)
    names = [f"E{i}" for i in range(20)] + ["CYCLES"]
    widths = {n: 1 + i % 5 for i, n in enumerate(names)}
    voidable = names[:-1:3]
    pipelined = names[1:-1:4]
    assert set(voidable) & set(pipelined)
    dut = PerfCounters(names, inc_width=widths, immediate=["CYCLES"], voidable=voidable,
                       pipelined=pipelined, compact=compact)

    async def bench(ctx):
        counts = dict.fromkeys(names, 0)     # what each counter should hold now
        before = dict(counts)                # and held a cycle ago
        incs = dict.fromkeys(names, 0)
        control = {"freeze": 0, "clear": 0, "clears": 0, "void": 0}

        wr, rp = dut.ram_ports
        collisions = 0

        async def cycle(clear_next=False):
            nonlocal collisions
            # No RAM read of the word written in its cycle (the iCE40 build declares
            # that such a read may return anything: `fusetile.host.fpga`).
            collisions += ctx.get(wr.en) and ctx.get(wr.addr) == ctx.get(rp.addr)
            await ctx.tick()
            before.update(counts)
            for n in names:
                if control["clear"]:
                    counts[n] = 0
                elif not control["freeze"] and not (control["void"] and n in voidable):
                    counts[n] += incs[n]
            control["clears"] += control["clear"]
            control["clear"] = int(clear_next)
            ctx.set(dut.clear, control["clear"])

        latencies = set()
        voids = 0
        clears_seen = 0     # reads a clear cut
        for step in range(300):
            for n in names:
                top = (1 << widths[n]) - 1
                incs[n] = top if rng.random() < 0.8 else rng.randrange(top + 1)
                ctx.set(dut.inc[n], incs[n])
            control["freeze"] = rng.random() < 0.1
            control["clear"] = rng.random() < 0.02
            control["void"] = rng.random() < 0.2
            voids += control["void"]
            ctx.set(dut.freeze, control["freeze"])
            ctx.set(dut.clear, control["clear"])
            ctx.set(dut.void, control["void"])
            name = rng.choice(names)
            history = [before[name]] if name in pipelined else []
            history.append(counts[name])
            ctx.set(dut.read.stb, 1)
            ctx.set(dut.read.index, names.index(name))
            await cycle(clear_next=rng.random() < 0.03)
            history.append(counts[name])
            ctx.set(dut.read.stb, 0)
            cycles = 1
            while not ctx.get(dut.read.ack):
                await cycle(clear_next=rng.random() < 0.03)
                history.append(counts[name])
                cycles += 1
                assert cycles < 12
            latencies.add(cycles)
            value = ctx.get(dut.read.data)
            assert value in history, (step, name, value, history)
            clears_seen += 0 in history[1:] and history[0] != 0
        # From a register, 2; from the RAM, 6 to 8, a cycle fewer built compact.
        assert latencies <= ({2, 5, 6, 7} if compact else {2, 6, 7, 8})
        assert len(latencies) > 2, latencies
        assert clears_seen > 5
        ctx.set(dut.freeze, 1)
        control["freeze"] = 1
        await cycle()
        assert await read_all(ctx, dut, names) == [counts[n] for n in names]
        assert all(counts[n] > 0 for n in names)
        assert voids > 20
        assert collisions == 0

    run(dut, bench)


@BUILDS
def test_flushes_keep_up_with_back_to_back_reads(compact):
    """64 counters counting every cycle while reads go back to back (each read step
    delays the scanner): after a freeze each holds exactly the cycles counted."""
    names = [f"E{i}" for i in range(64)] + ["CYCLES"]
    dut = PerfCounters(names, inc_width=1, immediate=["CYCLES"], compact=compact)

    async def bench(ctx):
        for n in names:
            ctx.set(dut.inc[n], 1)
        for i in range(300):
            await read(ctx, dut, names[i % 64])
        ctx.set(dut.freeze, 1)
        values = await read_all(ctx, dut, names)
        assert values == [values[-1]] * len(names) and values[-1] > 1000, values

    run(dut, bench)


@BUILDS
def test_each_counter_reads_its_own(compact):
    """Counters in several groups of the read's pending-count selection (the last one
    part-filled), a register among them, each counting its own amount: every read
    returns its counter's count, frozen or running."""
    names = [f"E{i}" for i in range(10)] + ["CYCLES"] + [f"E{i}" for i in range(10, 19)]
    ram = [n for n in names if n != "CYCLES"]
    assert len(ram) > 2 * PerfCounters.READ_GROUP
    dut = PerfCounters(names, inc_width=5, immediate=["CYCLES"], compact=compact)

    async def bench(ctx):
        for i, n in enumerate(ram):
            ctx.set(dut.inc[n], i + 1)
        ctx.set(dut.inc["CYCLES"], 1)
        await ctx.tick().repeat(40)
        for n in names:
            # A read counts the events up to a cycle between its stb and its ack.
            stb = ctx.get(dut.value["CYCLES"])
            value, cycles = await read(ctx, dut, n)
            rate = 1 if n == "CYCLES" else ram.index(n) + 1
            assert value % rate == 0 and stb <= value // rate <= stb + cycles, (n, value)
        ctx.set(dut.freeze, 1)
        await ctx.tick()
        cycles = ctx.get(dut.value["CYCLES"])
        assert await read_all(ctx, dut, names) == \
            [cycles * (1 if n == "CYCLES" else ram.index(n) + 1) for n in names]

    run(dut, bench)


def test_read_signature():
    sig = CounterReadSignature(count=5)
    assert sig == CounterReadSignature(count=5) and sig != CounterReadSignature(count=6)
    assert repr(sig) == "CounterReadSignature(count=5)"
    assert len(sig.create().index) == 3 and len(sig.create().data) == 64
    raises_in_constructor(TypeError, r"^count must be a positive integer, not 0$",
                          CounterReadSignature, count=0)


def test_names_must_be_unique():
    raises_in_constructor(ValueError, r"Counter names must be unique and at least one, "
                          r"not \['A', 'A'\]", PerfCounters, ["A", "A"])
    raises_in_constructor(ValueError, r"Counter names must be unique and at least one, not \[\]",
                          PerfCounters, [])


def test_inc_width_checked():
    raises_in_constructor(ValueError, "inc_width must be an integer from 1 to 32, not 0",
                          PerfCounters, ["A"], inc_width=0)
    raises_in_constructor(ValueError, "inc_width must be an integer from 1 to 32, not 33",
                          PerfCounters, ["A", "B"], inc_width={"A": 1, "B": 33})
    raises_in_constructor(ValueError, r"inc_width must give a width for each counter and no "
                          r"other, not for \['A'\]", PerfCounters, ["A", "B"], inc_width={"A": 1})


def test_immediate_names_checked():
    raises_in_constructor(ValueError, r"immediate names counters that do not exist: \['B'\]",
                          PerfCounters, ["A"], immediate=["B"])


def test_voidable_names_checked():
    raises_in_constructor(ValueError, r"voidable names counters that do not exist or are "
                          r"immediate: \['B', 'C'\]",
                          PerfCounters, ["A", "C"], immediate=["C"], voidable=["A", "B", "C"])


def test_pipelined_names_checked():
    raises_in_constructor(ValueError, r"pipelined names counters that do not exist or are "
                          r"immediate: \['B', 'C'\]",
                          PerfCounters, ["A", "C"], immediate=["C"], pipelined=["A", "B", "C"])


def test_tile_pipelines_the_register_maps_counters(monkeypatch):
    """The tile pipelines exactly the counters `PIPELINED_COUNTERS` names (the list
    docs/registers.md's sentence on them is generated from), every index of a set."""
    built = []

    class Recorded(PerfCounters):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(tile, "PerfCounters", Recorded)
    cfg = TileConfig()
    assert cfg.bank_counters
    Fragment.get(tile.Tile(cfg), None)
    (counters,) = built
    assert counters.pipelined == {n for n in counters.names
                                  if n.split("[")[0] in PIPELINED_COUNTERS}
    assert {n.split("[")[0] for n in counters.pipelined} == set(PIPELINED_COUNTERS)
    assert sum(n.startswith("BANK_READS[") for n in counters.pipelined) == cfg.spad_banks
