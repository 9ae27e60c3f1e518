"""Where a board's logic goes: the cells of each block of the tile, from Yosys.

``fusetile build`` flattens the design, so nextpnr's figures are for the whole of it.
This script maps the board's core (``BoardCore``: the tile and its UART bridge, no PLL
or I/O) with the board's synthesis flow but the hierarchy kept, and prints each block's
LUTs, carry cells, flip-flops, block RAMs and multipliers (its own, not its
sub-blocks'), largest first::

    .venv/bin/python scripts/block_sizes.py --board icebreaker
    .venv/bin/python scripts/block_sizes.py --board icebreaker --config '{"rows": 2, "cols": 2}'
    .venv/bin/python scripts/block_sizes.py --board ulx3s-85f

``--config`` changes fields of the board's configuration. Blocks mapped apart are not
optimised across their edges, so the total is not a flat build's: it ranks the blocks,
it does not replace nextpnr's count. Both flows map LUTs with
the classic ABC, as the ECP5 build does: ABC9 trips an assertion on this design when
the hierarchy is kept, on the iCE40 too (``host/fpga.py``).
"""

import argparse
import dataclasses
import json
import re
from pathlib import Path

from fusetile.hdl.board import board as find_board
from fusetile.hdl.copies import KEEP_COPIES
from fusetile.host.fpga import ECP5_LUT_MAPPING, ICE40_LUT_MAPPING, undefined_collisions

from timing_paths import map_core       # scripts/ is on the path when run as a script


# Yosys script per family, after the board's declarations of the RAMs whose collisions
# are undefined: the board's flow up to LUT mapping, the classic ABC, the rest.
FLOWS = {
    "ecp5": [
        *KEEP_COPIES,
        "synth_ecp5 -noflatten -top fusetile -run begin:map_luts",
        *ECP5_LUT_MAPPING,
        "synth_ecp5 -noflatten -top fusetile -run map_cells:",
    ],
    "ice40": [
        "synth_ice40 -dsp -noflatten -top fusetile -run begin:map_luts",
        *ICE40_LUT_MAPPING,
        "synth_ice40 -dsp -noflatten -top fusetile -run map_cells:",
    ],
}

# Column -> Yosys cell types counted in it, per family.
_COLUMNS = {
    "ecp5": {"LUT": ("LUT4",), "carry": ("CCU2C",), "FF": ("TRELLIS_FF",),
             "BRAM": ("DP16KD",), "DSP": ("MULT18X18D",), "LUTRAM": ("TRELLIS_DPR16X4",)},
    "ice40": {"LUT": ("SB_LUT4",), "carry": ("SB_CARRY",), "FF": ("SB_DFF",),
              "BRAM": ("SB_RAM40_4K",), "DSP": ("SB_MAC16",), "SPRAM": ("SB_SPRAM256KA",)},
}


def synthesize(board, config, out):
    """Map ``board``'s core with ``config``; the text of Yosys' ``stat``."""
    map_core(board, config, out, [*undefined_collisions(board.family, config),
                                  *FLOWS[board.family], "tee -q -o stat.txt stat"],
             log="blocks.log")
    return (out / "stat.txt").read_text()


def block_cells(stat, family):
    """{block: {column: count}} from Yosys' ``stat`` of a design mapped with its
    hierarchy kept (each block's own cells)."""
    columns = _COLUMNS[family]
    parts = re.split(r"^=== (.+?) ===$", stat, flags=re.M)
    blocks = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name == "design hierarchy":
            continue
        counts = dict.fromkeys(columns, 0)
        for line in body.splitlines():
            fields = line.split()
            if len(fields) < 2 or not fields[0].isdigit():
                continue
            for column, prefixes in columns.items():
                if fields[1].startswith(prefixes):
                    counts[column] += int(fields[0])
        blocks[name.removeprefix("fusetile.").removeprefix("fusetile") or "(top)"] = counts
    return blocks


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--board", default="icebreaker")
    parser.add_argument("--config", metavar="JSON",
                        help="fields of the board's configuration to change")
    parser.add_argument("--out", type=Path, help="work folder (default: build/blocks/BOARD)")
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args(argv)
    board = find_board(args.board)
    config = board.config
    if args.config:
        config = dataclasses.replace(config, **json.loads(args.config))
    blocks = block_cells(synthesize(board, config, args.out or Path("build/blocks") / board.name),
                         board.family)
    columns = list(_COLUMNS[board.family])
    total = {c: sum(b[c] for b in blocks.values()) for c in columns}
    if args.json:
        print(json.dumps({"board": board.name, "config": config.as_dict(), "blocks": blocks,
                          "total": total}, indent=2))
        return
    rows = sorted(blocks.items(), key=lambda item: -item[1]["LUT"])
    width = max(len(name) for name in blocks)
    print(f"{'block':{width}} " + " ".join(f"{c:>7}" for c in columns))
    for name, counts in rows + [("total", total)]:
        if any(counts.values()):
            print(f"{name:{width}} " + " ".join(f"{counts[c]:>7,}" for c in columns))


if __name__ == "__main__":
    main()
