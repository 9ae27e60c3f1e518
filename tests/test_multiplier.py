# amaranth: UnusedElaboratable=no

import random

import pytest
from amaranth.back import verilog
from amaranth.hdl import signed, unsigned
from amaranth.sim import Simulator
from amaranth_boards.ulx3s import ULX3S_85F_Platform

from fusetile.hdl.multiplier import Multiplier

from icarus import run_testbench


# (a, b) shapes: the MAC array's int8 lanes, and the vector unit's 16-bit pieces with
# a signed top piece.
SHAPES = [(signed(8), signed(8)), (unsigned(16), signed(17)), (unsigned(16), unsigned(16)),
          (signed(18), signed(18)), (unsigned(18), unsigned(1))]
IDS = ["s8xs8", "u16xs17", "u16xu16", "s18xs18", "u18xu1"]


def operands(a_shape, b_shape, n, seed):
    rng = random.Random(seed)

    def value(shape):
        lo = -(1 << shape.width - 1) if shape.signed else 0
        hi = (1 << shape.width - 1) - 1 if shape.signed else (1 << shape.width) - 1
        return rng.choice([lo, hi, 0, rng.randint(lo, hi)])

    return [(value(a_shape), value(b_shape)) for _ in range(n)]


@pytest.mark.parametrize("latency", [1, 2])
@pytest.mark.parametrize("a_shape, b_shape", SHAPES, ids=IDS)
def test_product_comes_latency_cycles_later(a_shape, b_shape, latency):
    dut = Multiplier(a_shape, b_shape, latency=latency)
    pairs = operands(a_shape, b_shape, 60, seed=a_shape.width * 31 + b_shape.width)
    got = []

    async def bench(ctx):
        for a, b in pairs + [(0, 0)] * latency:
            ctx.set(dut.a, a)
            ctx.set(dut.b, b)
            await ctx.tick()
            got.append(ctx.get(dut.p))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got[latency - 1:latency - 1 + len(pairs)] == [a * b for a, b in pairs]


def test_product_shape_is_amaranths():
    assert Multiplier(signed(8), signed(8)).p.shape() == signed(16)
    assert Multiplier(unsigned(16), signed(17)).p.shape() == signed(33)
    assert Multiplier(unsigned(18), unsigned(18)).p.shape() == unsigned(36)


@pytest.mark.parametrize("args, kwargs, message", [
    ((signed(19), signed(8)), {}, r"a_shape must be 1 to 18 bits wide, not signed\(19\)"),
    ((signed(8), unsigned(0)), {}, r"b_shape must be 1 to 18 bits wide, not unsigned\(0\)"),
    ((signed(8), signed(8)), {"latency": 3}, r"latency must be 1 or 2, not 3"),
])
def test_bad_parameters_are_refused(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Multiplier(*args, **kwargs)


def _mult18x18d_model():
    """A behavioural MULT18X18D for what :class:`Multiplier` uses of it, as Lattice's
    sysDSP usage guide (TN1267) describes the block: A and B (18 bits, signed when
    SIGNEDA / SIGNEDB), each through its input register when REG_INPUTx_CLK is CLK0,
    their 36-bit product through the output register when REG_OUTPUT_CLK is CLK0;
    registers clocked by CLK0 and enabled by CE0, with GSR and RST off. Yosys' model
    of the cell stops at registered modes (``ERROR_UNMODELLED_MULT18X18D_MODE``), so
    the test brings its own; what it checks is the instance's wiring and parameters."""
    a = ", ".join(f"A{k}" for k in range(18))
    b = ", ".join(f"B{k}" for k in range(18))
    c = ", ".join(f"C{k}" for k in range(18))
    p = ", ".join(f"P{k}" for k in range(36))
    a_bus = ", ".join(f"A{k}" for k in reversed(range(18)))
    b_bus = ", ".join(f"B{k}" for k in reversed(range(18)))
    return f"""module MULT18X18D({a}, {b}, {c}, SIGNEDA, SIGNEDB, SOURCEA, SOURCEB,
    CLK0, CLK1, CLK2, CLK3, CE0, CE1, CE2, CE3, RST0, RST1, RST2, RST3, {p});
    input {a}, {b}, {c}, SIGNEDA, SIGNEDB, SOURCEA, SOURCEB;
    input CLK0, CLK1, CLK2, CLK3, CE0, CE1, CE2, CE3, RST0, RST1, RST2, RST3;
    output {p};
    parameter REG_INPUTA_CLK = "NONE";
    parameter REG_INPUTB_CLK = "NONE";
    parameter REG_OUTPUT_CLK = "NONE";
    parameter GSR = "ENABLED";
    wire [17:0] a_in = {{{a_bus}}};
    wire [17:0] b_in = {{{b_bus}}};
    reg [17:0] a_reg = 0, b_reg = 0;
    reg sa_reg = 0, sb_reg = 0;
    always @(posedge CLK0) if (CE0) begin
        a_reg <= a_in; b_reg <= b_in; sa_reg <= SIGNEDA; sb_reg <= SIGNEDB;
    end
    wire [17:0] a = REG_INPUTA_CLK == "CLK0" ? a_reg : a_in;
    wire [17:0] b = REG_INPUTB_CLK == "CLK0" ? b_reg : b_in;
    wire sa = REG_INPUTA_CLK == "CLK0" ? sa_reg : SIGNEDA;
    wire sb = REG_INPUTB_CLK == "CLK0" ? sb_reg : SIGNEDB;
    wire signed [36:0] product = $signed({{sa & a[17], a}}) * $signed({{sb & b[17], b}});
    reg [35:0] p_reg = 0;
    always @(posedge CLK0) if (CE0) p_reg <= product[35:0];
    wire [35:0] p = REG_OUTPUT_CLK == "CLK0" ? p_reg : product[35:0];
    assign {{{", ".join(f"P{k}" for k in reversed(range(36)))}}} = p;
endmodule
"""


@pytest.mark.parametrize("fabric_product", [False, True], ids=["block", "fabric"])
@pytest.mark.parametrize("latency", [1, 2])
@pytest.mark.parametrize("a_shape, b_shape", SHAPES, ids=IDS)
def test_mult18x18d_instance_in_icarus(a_shape, b_shape, latency, fabric_product, tmp_path):
    """The multiplier as built for the ECP5 (a MULT18X18D instance) in Icarus, with the
    model above: the same products, the same number of cycles later, with the product's
    register in the block or in the fabric."""
    dut = Multiplier(a_shape, b_shape, latency=latency, fabric_product=fabric_product)
    netlist = verilog.convert(dut, name="mul", platform=ULX3S_85F_Platform())
    assert netlist.count("MULT18X18D ") == 1 and " * " not in netlist   # no fabric multiply
    output_register = '"NONE"' if fabric_product else '"CLK0"'
    assert f".REG_OUTPUT_CLK({output_register})" in netlist
    (tmp_path / "mul.v").write_text(netlist)
    (tmp_path / "mult18x18d.v").write_text(_mult18x18d_model())
    pairs = operands(a_shape, b_shape, 60, seed=a_shape.width * 17 + b_shape.width)
    aw, bw, pw = a_shape.width, b_shape.width, len(dut.p)
    out = run_testbench(tmp_path, f"""    reg [{aw - 1}:0] a = 0;
    reg [{bw - 1}:0] b = 0;
    wire [{pw - 1}:0] p;
    mul dut(.clk(clk), .rst(rst), .a(a), .b(b), .p(p));""",
        [f"a = {aw}'d{a % (1 << aw)}; b = {bw}'d{b % (1 << bw)}; "
         f"@(posedge clk); #1 $display(\"%d\", p);" for a, b in pairs + [(0, 0)] * latency],
        ["mul.v", "mult18x18d.v"])
    got = [int(v) for v in out if v.strip().isdigit()]
    wrap = [(x - (1 << pw) if dut.p.shape().signed and x >> pw - 1 else x) for x in got]
    assert wrap[latency - 1:latency - 1 + len(pairs)] == [a * b for a, b in pairs]
