from wb_helpers import raises_in_constructor
from amaranth.sim import Simulator

from fusetile.hdl.counters import PerfCounters


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_count_freeze_clear():
    """Events show a cycle after they happen (``A``, ``B``) or at once (``C``,
    immediate); freeze and clear act on the events of their own cycle either way."""
    dut = PerfCounters(["A", "B", "C"], immediate=["C"])

    async def bench(ctx):
        ctx.set(dut.inc["A"], 1)
        ctx.set(dut.inc["B"], 8)
        ctx.set(dut.inc["C"], 1)
        await ctx.tick().repeat(5)
        assert [ctx.get(dut.value[n]) for n in "ABC"] == [4, 32, 5]
        ctx.set(dut.freeze, 1)
        await ctx.tick()
        # The fifth cycle's events are counted in the freeze's first; none of its own.
        assert [ctx.get(dut.value[n]) for n in "ABC"] == [5, 40, 5]
        await ctx.tick().repeat(3)
        assert [ctx.get(dut.value[n]) for n in "ABC"] == [5, 40, 5]
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        assert [ctx.get(dut.value[n]) for n in "ABC"] == [0, 0, 0]
        ctx.set(dut.freeze, 0)
        await ctx.tick().repeat(2)
        assert [ctx.get(dut.value[n]) for n in "ABC"] == [1, 8, 2]
        # An event in a clear's cycle is not counted, one just before it is cleared.
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        ctx.set(dut.inc["A"], 0)
        await ctx.tick().repeat(3)
        assert ctx.get(dut.value["A"]) == 0

    run(dut, bench)


def test_carries_into_high_word():
    dut = PerfCounters(["A"], inc_width=32)

    async def bench(ctx):
        ctx.set(dut.inc["A"], 0xFFFF_FFFF)
        await ctx.tick().repeat(4)
        assert ctx.get(dut.value["A"]) == 3 * 0xFFFF_FFFF

    run(dut, bench)


def test_names_must_be_unique():
    raises_in_constructor(ValueError, r"Counter names must be unique, not \['A', 'A'\]",
                          PerfCounters, ["A", "A"])


def test_inc_width_checked():
    raises_in_constructor(ValueError, "inc_width must be an integer from 1 to 32, not 0",
                          PerfCounters, ["A"], inc_width=0)


def test_immediate_names_checked():
    raises_in_constructor(ValueError, r"immediate names counters that do not exist: \['B'\]",
                          PerfCounters, ["A"], immediate=["B"])
