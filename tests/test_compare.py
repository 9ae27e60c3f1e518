"""The comparisons of hdl/compare.py against Python's, for every pair of values of
operands of unequal widths and signedness."""

import itertools

import pytest
from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.sim import Simulator

from fusetile.hdl.compare import ge, gt, lt


def _values(shape):
    if shape.signed:
        return range(-(1 << (shape.width - 1)), 1 << (shape.width - 1))
    return range(1 << shape.width)


@pytest.mark.parametrize("shape_a, shape_b", [
    (unsigned(3), unsigned(5)), (unsigned(5), unsigned(3)),
    (signed(3), signed(5)), (signed(5), signed(3)),
    (signed(4), unsigned(4)), (unsigned(4), signed(4)),
])
def test_comparisons_exhaustive(shape_a, shape_b):
    a, b = Signal(shape_a), Signal(shape_b)
    outs = {name: Signal(name=name) for name in ("lt", "ge", "gt")}
    m = Module()
    m.d.comb += [outs["lt"].eq(lt(a, b)), outs["ge"].eq(ge(a, b)), outs["gt"].eq(gt(a, b))]
    wrong = []

    async def testbench(ctx):
        for x, y in itertools.product(_values(shape_a), _values(shape_b)):
            ctx.set(a, x)
            ctx.set(b, y)
            got = {name: ctx.get(sig) for name, sig in outs.items()}
            want = {"lt": int(x < y), "ge": int(x >= y), "gt": int(x > y)}
            if got != want:
                wrong.append((x, y, got, want))

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()
    assert not wrong, wrong[:5]
