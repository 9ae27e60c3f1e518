"""The longest register-to-register paths of the ULX3S build, in two minutes.

nextpnr names the worst path of a design only once it has routed it, and a route
of the ULX3S build takes about two hours (``docs/fpga.md``). This script maps the board's core
(``BoardCore``: the tile and its UART bridge, no PLL or I/O) to ECP5 cells with Yosys,
the same flow as ``fusetile build``, and walks the netlist with a rough delay model,
enough to rank paths and name the blocks they cross::

    .venv/bin/python scripts/timing_paths.py                  # 25 worst endpoints
    .venv/bin/python scripts/timing_paths.py --path spad__part  # one path, net by net
    .venv/bin/python scripts/timing_paths.py --by-start       # the worst per starting block
    .venv/bin/python scripts/timing_paths.py --histogram      # endpoints by their delay
    .venv/bin/python scripts/timing_paths.py --deepest        # what ends the deepest LUT chains
    .venv/bin/python scripts/timing_paths.py --netlist build/timing/mapped.json ...

The model (ns, ECP5 speed grade 6, rounded): a LUT4 0.4, a routed net 0.8, a carry
cell's ripple 0.05, the 18 x 18 multiplier (not registered) 4.5, block RAM clock to
output 4.3 (not registered), a flip-flop's clock to output 0.4 and setup 0.2. It ranks
paths; it does not sign them off (on this design it says about 40 ns where nextpnr
estimates 51 ns after placement).
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from amaranth.back import rtlil

from fusetile.hdl.board import BoardCore, DEFAULT_BAUD, board as find_board
from fusetile.host.fpga import _SYNTH_OPTIONS, tool_environment


ROUTE = 0.8
LUT, CARRY, CARRY_IN, MUX = 0.4, 0.05, 0.3, 0.2
MULT, BRAM_OUT, FF_OUT, SETUP = 4.5, 4.3, 0.4, 0.2


def map_core(board, config, out, script, *, log):
    """Write ``board``'s core (``BoardCore``: the tile and its UART bridge, no PLL or
    I/O) with ``config`` to ``out/core.il`` and run Yosys there on it with ``script``
    (the lines after reading it), logging to ``out/log``."""
    _, divisor = board.clock_plan(None, DEFAULT_BAUD)
    out.mkdir(parents=True, exist_ok=True)
    core = BoardCore(config, divisor=divisor, leds=board.leds, gmem_ports=board.gmem_ports,
                     store_ports=board.store_ports, trace_width=board.trace_width)
    # With the board's platform: what is built for its family (the iCE40UP's SPRAM).
    (out / "core.il").write_text(rtlil.convert(core, name="fusetile",
                                               platform=board.make_platform()))
    (out / "map.ys").write_text("\n".join(["read_rtlil core.il", *script]) + "\n")
    yosys = tool_environment(board.family)["YOSYS"]
    print(f"mapping {board.name}'s core with {yosys} (a few minutes)...", file=sys.stderr)
    subprocess.run([yosys, "-q", "-l", log, "map.ys"], cwd=out, check=True, env=os.environ)


def synthesize(board_name, out):
    """Map the board's core to ECP5 cells; the path of the netlist (Yosys JSON)."""
    board = find_board(board_name)
    if board.family != "ecp5":
        raise SystemExit(f"{board_name}: only the ECP5 flow is modelled")
    options = _SYNTH_OPTIONS["ecp5"]
    map_core(board, board.config, out, [
        options["script_after_read"],
        f"synth_ecp5 -top fusetile {options['synth_opts']}",
        options["script_after_synth"],
        "write_json mapped.json",
    ], log="map.log")
    return out / "mapped.json"


class Netlist:
    """Arrival times of every net bit of a flat ECP5 netlist under the model above."""

    def __init__(self, path):
        top = next(m for m in json.loads(Path(path).read_text())["modules"].values()
                   if m.get("attributes", {}).get("top"))
        self.cells = top["cells"]
        self.names = {}                       # bit -> the shortest user-given net name
        for name, net in top["netnames"].items():
            for b in net["bits"]:
                old = self.names.get(b)
                if old is None or (old.startswith("$"), len(old)) > \
                        (name.startswith("$"), len(name)):
                    self.names[b] = name
        self.driver = {}
        for cn, c in self.cells.items():
            for port, bits in c["connections"].items():
                if c["port_directions"].get(port) == "output":
                    for b in bits:
                        self.driver[b] = (cn, port)
        self.arrival, self.prev = {}, {}

    def _inputs(self, c):
        return [(p, b) for p, bits in c["connections"].items()
                if c["port_directions"].get(p) == "input" for b in bits if isinstance(b, int)]

    @staticmethod
    def _start(c):
        """The launch time if the cell's outputs start a path, else None."""
        t = c["type"]
        if t == "TRELLIS_FF":
            return FF_OUT
        if t == "DP16KD":
            return BRAM_OUT
        if t == "MULT18X18D" and c["parameters"].get("REG_OUTPUT_CLK", "NONE") != "NONE":
            return FF_OUT
        return None

    def _edge(self, c, port_in, port_out):
        t = c["type"]
        if t == "LUT4":
            return LUT + ROUTE
        if t == "CCU2C":
            if port_in == "CIN":
                return CARRY if port_out == "COUT" else CARRY_IN
            return LUT + ROUTE
        if t in ("PFUMX", "L6MUX21"):
            return MUX if port_in in ("ALUT", "BLUT", "D0", "D1") else MUX + ROUTE
        if t == "MULT18X18D":
            return MULT + ROUTE
        if t == "TRELLIS_DPR16X4":
            return LUT + ROUTE if port_in.startswith("RAD") else None  # reads are async
        return LUT + ROUTE

    def time(self, bit):
        """Arrival time of ``bit`` (iteratively: paths run thousands of cells deep)."""
        stack = [bit]
        while stack:
            b = stack[-1]
            if b in self.arrival or not isinstance(b, int):
                stack.pop()
                continue
            if b not in self.driver:
                self.arrival[b] = 0.0
                stack.pop()
                continue
            cn, port = self.driver[b]
            c = self.cells[cn]
            start = self._start(c)
            if start is not None:
                self.arrival[b], self.prev[b] = start, None
                stack.pop()
                continue
            edges = [(i, e) for p, i in self._inputs(c)
                     if (e := self._edge(c, p, port)) is not None]
            todo = [i for i, _ in edges if i not in self.arrival]
            if todo:
                stack.extend(todo)
                continue
            best, prev = 0.0, None
            for i, edge in edges:
                if self.arrival[i] + edge > best:
                    best, prev = self.arrival[i] + edge, i
            self.arrival[b], self.prev[b] = best, prev
            stack.pop()
        return self.arrival.get(bit, 0.0)

    def endpoints(self):
        """(required time, endpoint name, port, bit) of every flip-flop and block RAM
        input, worst first."""
        out = []
        for cn, c in self.cells.items():
            if c["type"] == "TRELLIS_FF":
                name = self.names.get(c["connections"]["Q"][0], cn)
                for port in ("DI", "CE", "LSR"):
                    for b in c["connections"].get(port, []):
                        out.append((self.time(b) + SETUP, name, port, b))
            elif c["type"] == "DP16KD":
                for port, b in self._inputs(c):
                    if not port.startswith("CLK"):
                        out.append((self.time(b) + SETUP, cn, port, b))
        return sorted(out, key=lambda e: -e[0])

    def lut_levels(self):
        """The LUT4 cells by their depth in LUTs from anything else (flip-flops, carry
        chains, block RAMs, multipliers): {depth: [cell names]}. Yosys' ABC maps to the
        least depth it can and then trades every path's spare levels for area, so the
        deepest chain sets how deep every other path may come out."""
        level = {}
        for cn, c in self.cells.items():
            if c["type"] != "LUT4" or cn in level:
                continue
            stack = [cn]
            while stack:
                top = stack[-1]
                feeding = [d for _, b in self._inputs(self.cells[top])
                           if (d := self.driver.get(b, (None,))[0]) is not None
                           and self.cells[d]["type"] == "LUT4"]
                todo = [d for d in feeding if d not in level]
                if todo:
                    stack.extend(todo)
                    continue
                level[top] = 1 + max((level[d] for d in feeding), default=0)
                stack.pop()
        out = collections.defaultdict(list)
        for cn, n in level.items():
            out[n].append(cn)
        return dict(out)

    def path(self, bit):
        """The nets of the slowest path into ``bit``, first to last: (time, name, cell)."""
        steps = []
        while isinstance(bit, int):
            cn = self.driver.get(bit, (None,))[0]
            steps.append((self.arrival.get(bit, 0.0), self.names.get(bit, "?"),
                          self.cells[cn]["type"] if cn else "input"))
            bit = self.prev.get(bit)
        return steps[::-1]


def _blocks(steps):
    """The hierarchy a path crosses, in order (``tile.control > tile.spad > ...``)."""
    out = []
    for _, name, _ in steps:
        if name.startswith("$") or "." not in name:
            continue
        block = name.rsplit(".", 1)[0]
        if not out or out[-1] != block:
            out.append(block)
    return " > ".join(out)


def _endpoint(name, port):
    """An endpoint's register and port: a net bit's name without its bit index."""
    return re.sub(r"\[\d+\]$", "", name) + "." + port


def _once(ends):
    """``ends`` with each register's bits and each port once (its worst bit), as
    (delay, endpoint, bit)."""
    seen = set()
    for t, name, port, bit in ends:
        key = _endpoint(name, port)
        if key not in seen:
            seen.add(key)
            yield t, key, bit


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--board", default="ulx3s-85f")
    parser.add_argument("--netlist", type=Path, help="a mapped netlist from an earlier run")
    parser.add_argument("--out", type=Path, default=Path("build/timing"))
    parser.add_argument("--top", type=int, default=25, help="endpoints to list")
    parser.add_argument("--path", help="print the worst path into the first endpoint "
                                       "whose name contains this, net by net")
    parser.add_argument("--by-start", action="store_true",
                        help="list only the worst path of each block paths start in")
    parser.add_argument("--histogram", action="store_true",
                        help="count the endpoints (bits of one register once) by delay")
    parser.add_argument("--deepest", action="store_true",
                        help="name the nets at the end of the deepest LUT chains")
    args = parser.parse_args(argv)
    netlist = Netlist(args.netlist or synthesize(args.board, args.out))
    ends = netlist.endpoints()
    counts = collections.Counter(c["type"] for c in netlist.cells.values())
    print("cells: " + ", ".join(f"{t} {n}" for t, n in counts.most_common()))
    levels = netlist.lut_levels() or {0: []}
    deepest = max(levels)
    print("LUT4 by depth in LUTs: "
          + ", ".join(f"{n}: {len(levels[n])}" for n in sorted(levels))
          + f" (ABC lets every path grow to {deepest})")
    if args.deepest:
        ends = collections.Counter(
            re.split(r"_TRELLIS|_LUT4|_CCU2|\$|\[", netlist.names.get(
                netlist.cells[cn]["connections"]["Z"][0], cn))[0] for cn in levels[deepest])
        for name, n in ends.most_common():
            print(f"  {n:4d}  {name}")
        return
    if args.path:
        found = [e for e in ends if args.path in e[1]]
        if not found:
            raise SystemExit(f"no register or block RAM input is named like {args.path!r}")
        t, name, port, bit = found[0]
        print(f"{t:.1f} ns into {name}.{port}:")
        last = None
        for at, net, cell in netlist.path(bit):
            if net != last and not net.startswith("$"):
                print(f"  {at:5.1f} ns  {cell:10s} {net}")
            last = net
        return
    if args.histogram:
        bins = collections.Counter()
        for t, _, _ in _once(ends):
            bins[min(14, max(6, int(t // 2) * 2))] += 1
        for low in (14, 12, 10, 8, 6):
            span = f">= {low}" if low == 14 else f"< {low + 2}" if low == 6 else \
                f"{low} to {low + 2}"
            print(f"{span:>8} ns  {bins[low]:6d} endpoints")
        return
    shown, starts = 0, set()
    print(f"{'ns':>5} {'nets':>5}  endpoint (bits of one register shown once)")
    for t, key, bit in _once(ends):
        steps = netlist.path(bit)
        if args.by_start:
            start = _blocks(steps).split(" > ")[0]
            if start in starts:
                continue
            starts.add(start)
        shown += 1
        print(f"{t:5.1f} {len(steps):5d}  {key}\n{'':13}via {_blocks(steps)}")
        if shown == args.top:
            break


if __name__ == "__main__":
    main()
