"""A board's top as Amaranth's RTLIL with the ``src`` attributes left out: what a
gateware change does to a board's netlist, in seconds, without a route.

The ULX3S build meets its 100 MHz by a few hundredths of a nanosecond with the
placement its seed gives (``docs/fpga.md``), and any change to its netlist moves
that placement. A change that leaves this text the same leaves the placement and the
route the same: nextpnr does not read the ``src`` attributes (step 55's routes,
``docs/fpga-timing.md``, were the same iteration by iteration and wrote the same
bitstream)::

    .venv/bin/python scripts/board_rtlil.py ulx3s-85f > before.il
    ... change the gateware ...
    .venv/bin/python scripts/board_rtlil.py ulx3s-85f > after.il
    cmp before.il after.il
"""

import argparse
import sys

from fusetile.hdl.board import BoardTop, board as find_board


def board_rtlil(name):
    """The RTLIL of board ``name``'s top, as ``fusetile build`` elaborates it, less
    its ``src`` attribute lines."""
    b = find_board(name)
    plan = b.make_platform().build(BoardTop(b), name="fusetile", do_build=False)
    text = plan.files["fusetile.il"]
    text = text.decode() if isinstance(text, bytes) else text
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.lstrip().startswith("attribute \\src"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("board", help="ulx3s-85f or icebreaker")
    sys.stdout.write(board_rtlil(parser.parse_args(argv).board))


if __name__ == "__main__":
    main()
