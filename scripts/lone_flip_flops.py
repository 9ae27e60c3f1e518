"""The flip-flops of an iCE40 build that take a logic cell of their own, by block.

An iCE40 logic cell holds a LUT4 and the flip-flop after it. nextpnr's packer puts a
flip-flop in its LUT's cell when the LUT feeds that flip-flop alone; any other
flip-flop (fed by another flip-flop, a block RAM, a DSP, or a LUT with other loads)
takes a cell alone, which nextpnr counts as "LCs used as DFF only". This script finds
those in the netlist Yosys wrote for ``fusetile build`` and counts them by the name
of the net they drive, cut to ``--depth`` levels of hierarchy, largest first::

    .venv/bin/fusetile build --board icebreaker --out build/fpga/icebreaker
    .venv/bin/python scripts/lone_flip_flops.py build/fpga/icebreaker/fusetile.json
    .venv/bin/python scripts/lone_flip_flops.py build/fpga/icebreaker/fusetile.json --depth 5

It applies the packer's rule as stated above and no more (nextpnr also moves LUTs
between cells), so its total is near nextpnr's count, not equal to it: step 56 of
``docs/fpga-timing.md`` used it to find what the UP5K's cells went to.
"""

import argparse
import collections
import json
import re


def lone_flip_flops(netlist):
    """``(kinds, blocks)``: Counters of the lone flip-flops by what drives them and by
    the (full) name of the net each drives."""
    top = next(m for m in netlist["modules"].values() if m.get("attributes", {}).get("top"))
    drivers, loads = {}, collections.Counter()
    for name, cell in top["cells"].items():
        directions = cell.get("port_directions", {})
        for port, bits in cell["connections"].items():
            for bit in bits:
                if isinstance(bit, str):        # a constant
                    continue
                if directions.get(port) == "output":
                    drivers[bit] = cell["type"]
                else:
                    loads[bit] += 1
    # Each bit by its shortest user-given net name.
    names = {}
    for name, net in top["netnames"].items():
        if net.get("hide_name"):
            continue
        for bit in net["bits"]:
            if isinstance(bit, int) and (bit not in names or len(name) < len(names[bit])):
                names[bit] = name
    kinds, blocks = collections.Counter(), collections.Counter()
    for name, cell in top["cells"].items():
        if not cell["type"].startswith("SB_DFF"):
            continue
        d, q = cell["connections"]["D"][0], cell["connections"]["Q"][0]
        driver = "a constant" if isinstance(d, str) else drivers.get(d, "an input")
        if driver.startswith("SB_DFF"):
            driver = "a flip-flop"
        elif driver == "SB_LUT4":
            if loads[d] == 1:
                continue                        # packs with its LUT
            driver = "a LUT with other loads"
        kinds[driver] += 1
        blocks[names.get(q, name)] += 1
    return kinds, blocks


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("netlist", help="the Yosys JSON of an iCE40 build (fusetile.json)")
    parser.add_argument("--depth", type=int, default=4,
                        help="levels of the net names' hierarchy to count by (default 4)")
    parser.add_argument("--top", type=int, default=40, help="blocks to list (default 40)")
    args = parser.parse_args(argv)
    with open(args.netlist) as f:
        kinds, blocks = lone_flip_flops(json.load(f))
    by_block = collections.Counter()
    for name, count in blocks.items():
        by_block[re.sub(r"\[\d+\]$", "", ".".join(name.split(".")[:args.depth]))] += count
    print(f"{sum(kinds.values())} flip-flops alone; fed by: " +
          ", ".join(f"{kind} {count}" for kind, count in kinds.most_common()))
    for block, count in by_block.most_common(args.top):
        print(f"{count:6d}  {block}")


if __name__ == "__main__":
    main()
