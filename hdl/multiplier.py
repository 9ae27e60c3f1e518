"""A pipelined multiplier: on an ECP5 one MULT18X18D with its own registers.

``p = a * b``, the product registered, and with ``latency=2`` the operands too. Built
for anything but an ECP5 these are flip-flops and a ``*`` (the simulators; on an iCE40
Yosys pulls them into the SB_MAC16 itself). Built for an ECP5 they are the DSP block's
input and output registers: Yosys maps a ``*`` to a MULT18X18D but never pulls a
register into it (``synth_ecp5`` has no DSP register packing), so the registers stay
in the fabric, and the path from one to the other crosses the routing twice around
the multiplier's 3.9 ns. On the ULX3S build that was the worst path of the tile
(15.4 ns from the MAC array's operand registers to its product registers: 65 MHz,
``docs/fpga-timing.md``, steps 29 to 31). A lone MULT18X18D with its registers times
at 651 MHz in nextpnr, the same with flip-flops around it at 147 MHz.

The registers in the block have no reset (``GSR`` and the reset inputs off), like the
flip-flops they replace (``reset_less``): they hold whatever they held until the
pipeline fills again.
"""

from amaranth.hdl import ClockSignal, Instance, Module, Shape, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.vendor import LatticeECP5Platform


__all__ = ["Multiplier"]


_DSP_BITS = 18      # operand width of a MULT18X18D (signed, or unsigned with SIGNEDx = 0)
_DSP_PRODUCT = 36


def _check_shape(name, shape):
    shape = Shape.cast(shape)
    if not 0 < shape.width <= _DSP_BITS:
        raise ValueError(f"{name} must be 1 to {_DSP_BITS} bits wide, not {shape!r}")
    return shape


class Multiplier(wiring.Component):
    """``p = a * b``, ``latency`` cycles after ``a`` and ``b`` are given.

    With ``latency=1`` the product is registered: ``p`` in cycle ``t + 1`` is the
    product of ``a`` and ``b`` in cycle ``t``. With ``latency=2`` the operands are
    registered as well (``p`` in cycle ``t + 2``). Every register loads every cycle.

    Parameters
    ----------
    a_shape, b_shape : shape-castable
        The operands' shapes: signed or unsigned, at most 18 bits.
    latency : 1 or 2
    fabric_product : bool
        On an ECP5, register the product in the fabric instead of the DSP block, so
        that the placer can put the register beside the logic that reads it: the
        block's output register puts the wire out of the block in front of that
        logic, the fabric's puts it behind the multiply. Same cycles.

    Attributes
    ----------
    a : In(a_shape)
    b : In(b_shape)
    p : Out(shape of ``a * b``)
        The product, shaped as Amaranth shapes ``a * b`` (signed if either operand is).

    Raises
    ------
    ValueError
        If an operand is wider than 18 bits or ``latency`` is not 1 or 2.
    """

    def __init__(self, a_shape, b_shape, *, latency=2, fabric_product=False):
        a_shape = _check_shape("a_shape", a_shape)
        b_shape = _check_shape("b_shape", b_shape)
        if latency not in (1, 2):
            raise ValueError(f"latency must be 1 or 2, not {latency!r}")
        self.latency = latency
        self.fabric_product = bool(fabric_product)
        product = (Signal(a_shape) * Signal(b_shape)).shape()
        super().__init__({
            "a": In(a_shape),
            "b": In(b_shape),
            "p": Out(product),
        })

    def elaborate(self, platform):
        m = Module()
        if isinstance(platform, LatticeECP5Platform):
            self._elaborate_mult18x18d(m)
            return m

        a, b = self.a, self.b
        if self.latency == 2:
            a = Signal.like(self.a, name="a_reg", reset_less=True)
            b = Signal.like(self.b, name="b_reg", reset_less=True)
            m.d.sync += [a.eq(self.a), b.eq(self.b)]
        p = Signal.like(self.p, name="p_reg", reset_less=True)
        m.d.sync += p.eq(a * b)
        m.d.comb += self.p.eq(p)
        return m

    def _elaborate_mult18x18d(self, m):
        # Each operand extended to 18 bits by its own signedness (an assignment
        # extends so), which SIGNEDA/B tell the block; the 36-bit product is then right
        # either way.
        a = Signal(_DSP_BITS)
        b = Signal(_DSP_BITS)
        p = Signal(_DSP_PRODUCT)
        m.d.comb += [a.eq(self.a), b.eq(self.b)]
        if self.fabric_product:
            p_reg = Signal.like(self.p, name="p_reg", reset_less=True)
            m.d.sync += p_reg.eq(p[:len(self.p)])
            m.d.comb += self.p.eq(p_reg)
        else:
            m.d.comb += self.p.eq(p[:len(self.p)])
        operand_clock = "CLK0" if self.latency == 2 else "NONE"
        ports = {}
        for k in range(_DSP_BITS):
            ports[f"i_A{k}"] = a[k]
            ports[f"i_B{k}"] = b[k]
            ports[f"i_C{k}"] = 0
        for k in range(_DSP_PRODUCT):
            ports[f"o_P{k}"] = p[k]
        for k in range(4):
            ports[f"i_CLK{k}"] = ClockSignal() if k == 0 else 0
            ports[f"i_CE{k}"] = 1
            ports[f"i_RST{k}"] = 0
        m.submodules.dsp = Instance(
            "MULT18X18D",
            p_REG_INPUTA_CLK=operand_clock,
            p_REG_INPUTB_CLK=operand_clock,
            p_REG_OUTPUT_CLK="NONE" if self.fabric_product else "CLK0",
            p_GSR="DISABLED",
            i_SIGNEDA=int(self.a.shape().signed),
            i_SIGNEDB=int(self.b.shape().signed),
            i_SOURCEA=0,
            i_SOURCEB=0,
            **ports,
        )
