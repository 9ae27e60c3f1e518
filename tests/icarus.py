"""A testbench in Icarus Verilog for a netlist: a clock, a reset, a list of steps."""

import subprocess


def run_testbench(tmp_path, declarations, steps, sources, *, flags=()):
    """Write ``tb.v`` into ``tmp_path``: ``declarations`` (the stimulus registers, the
    wires and the instance under test, which takes ``clk`` and ``rst``), a 10 ns
    clock, reset released after the first rising edge, then ``steps`` (Verilog
    statements, one per line). Compile it with ``sources`` (paths relative to
    ``tmp_path`` or absolute) and ``flags``, run it, and return the lines it prints."""
    body = "\n".join(f"    {step}" for step in steps)
    (tmp_path / "tb.v").write_text(f"""`timescale 1ns/1ps
module tb;
    reg clk = 0, rst = 1;
{declarations}
    always #5 clk = ~clk;
    initial begin
    @(posedge clk); #1 rst = 0;
{body}
    $finish;
    end
endmodule
""")
    subprocess.run(["iverilog", "-g2012", *flags, "-o", "tb.vvp", "tb.v", *map(str, sources)],
                   cwd=tmp_path, check=True)
    return subprocess.run(["vvp", "-n", "tb.vvp"], cwd=tmp_path, check=True,
                          capture_output=True, text=True).stdout.splitlines()
