"""The carry-chain comparisons of :mod:`fusetile.hdl.compare` against Amaranth's own."""

import itertools

import pytest
from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.sim import Simulator

from fusetile.hdl.compare import at_least, below


def _values(shape):
    if shape.signed:
        return range(-(1 << (shape.width - 1)), 1 << (shape.width - 1))
    return range(1 << shape.width)


@pytest.mark.parametrize("shape_a, shape_b", [
    (signed(6), signed(4)), (unsigned(5), unsigned(7)), (unsigned(6), signed(4)),
    (signed(5), unsigned(5)), (signed(4), signed(4)),
])
def test_every_pair_of_values(shape_a, shape_b):
    a, b = Signal(shape_a), Signal(shape_b)
    lt, ge = Signal(), Signal()
    m = Module()
    m.d.comb += [lt.eq(below(a, b)), ge.eq(at_least(a, b))]

    async def testbench(ctx):
        for x, y in itertools.product(_values(shape_a), _values(shape_b)):
            ctx.set(a, x)
            ctx.set(b, y)
            assert (ctx.get(lt), ctx.get(ge)) == (x < y, x >= y), (x, y)

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
