"""Simulation top for the UART path: the tile behind the UART register bridge.

``uart_top(config)`` is the tile as the board tops build it (``Tile(config,
gmem_ports="shared")``, see :mod:`fusetile.hdl.board`) with a
:class:`~fusetile.hdl.uart_bridge.UartBridge` (``divisor`` :data:`DIVISOR`, the boards' bus
timeout) driving its bus; ``rx``/``tx`` are the top's pins. It is
built like the other tops (``fusetile.sim.build.build(sim, config, top=uart_top)``);
because every top must have the ports of :data:`fusetile.sim.verilog.PORTS`, the
internal bus is brought out as ``bus__*`` *outputs* (a monitor: nothing drives the bus
from outside).
"""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..hdl.board import BUS_TIMEOUT as BOARD_BUS_TIMEOUT
from ..hdl.regmap import ADDR_WIDTH
from ..hdl.tile import Tile
from ..hdl.uart_bridge import UartBridge


__all__ = ["DIVISOR", "BUS_TIMEOUT", "UartTop", "uart_top"]


#: Clock cycles per bit on the simulated line (the bridge's minimum).
DIVISOR = 4
#: Cycles a bus access may wait for ACK/ERR before the bridge answers BUS_ERROR: the
#: boards' (a host access to GMEM may wait for a DMA transfer).
BUS_TIMEOUT = BOARD_BUS_TIMEOUT

_BUS_WIDTHS = {"cyc": 1, "stb": 1, "we": 1, "adr": ADDR_WIDTH - 2, "dat_w": 32,
               "dat_r": 32, "sel": 4, "ack": 1, "err": 1}


class UartTop(wiring.Component):
    """``Tile(config, gmem_ports="shared")`` behind a ``UartBridge``.

    Attributes
    ----------
    rx : In(1)
        Requests to the bridge, idle high.
    tx : Out(1)
        Responses from the bridge, idle high.
    irq : Out(1)
        The tile's interrupt.
    bus : Out(...)
        Every signal of the bridge-to-tile Wishbone bus, as outputs (a monitor).
    """

    def __init__(self, config, *, divisor=DIVISOR, timeout_cycles=BUS_TIMEOUT):
        self.config = config
        self.divisor = divisor
        self.timeout_cycles = timeout_cycles
        super().__init__({
            "rx": In(1, init=1),
            "tx": Out(1, init=1),
            "irq": Out(1),
            "bus": Out(wiring.Signature({n: Out(w) for n, w in _BUS_WIDTHS.items()})),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.tile = tile = Tile(self.config, gmem_ports="shared")
        m.submodules.bridge = bridge = UartBridge(self.divisor, addr_width=ADDR_WIDTH - 2,
                                                  timeout_cycles=self.timeout_cycles,
                                                  compact=self.config.compact)
        wiring.connect(m, bridge.bus, tile.bus)
        m.d.comb += [
            bridge.rx.eq(self.rx),
            self.tx.eq(bridge.tx),
            self.irq.eq(tile.irq),
        ]
        for name in _BUS_WIDTHS:
            m.d.comb += getattr(self.bus, name).eq(getattr(bridge.bus, name))
        return m


def uart_top(config):
    """The top for :func:`fusetile.sim.build.build`: ``UartTop(config)``."""
    return UartTop(config)
