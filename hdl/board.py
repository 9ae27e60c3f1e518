"""Board tops: the tile on a real FPGA board, driven over the board's USB UART.

:data:`BOARDS` lists the supported boards (amaranth-boards platforms) with the tile
configuration and clock each is built for by default. :class:`BoardTop` is what is
built for one: a PLL makes the tile's clock from the board's oscillator, reset is
held until the PLL locks (and while the reset button is pressed), the tile sits
behind a :class:`~fusetile.hdl.uart_bridge.UartBridge` on the board's UART (the
framed protocol of ``docs/uart.md``, at :data:`DEFAULT_BAUD` unless told otherwise)
and the LEDs show what it is doing (:data:`LED_MEANINGS`). ``fusetile build`` builds
it (``fusetile.host.fpga``); ``docs/fpga.md`` has the figures.
"""

from dataclasses import dataclass
import importlib

from amaranth.hdl import ClockDomain, Module, Signal
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In, Out
from amaranth.lib.cdc import ResetSynchronizer

from ..kernels.config import TileConfig
from .pll import Pll, ecp5_pll_params, ice40_pll_params
from .regmap import ADDR_WIDTH
from .single_port_ram import check_spram, uses_spram
from .tile import Tile
from .uart_bridge import UartBridge


__all__ = ["DEFAULT_BAUD", "BUS_TIMEOUT", "LED_MEANINGS", "Board", "BOARDS", "board", "BoardCore", "BoardTop"]


#: Line rate of the board's UART unless told otherwise (the serial transport's default).
DEFAULT_BAUD = 1_000_000

#: Cycles a bus access may wait before the UART bridge answers BUS_ERROR: a host access
#: to GMEM waits while a DMA transfer uses its port, and a transfer of a whole 64 KiB
#: GMEM is 8,192 cycles.
BUS_TIMEOUT = 1 << 16

#: What LED ``n`` shows, in order; a board with fewer LEDs shows the first ones.
LED_MEANINGS = (
    ("heartbeat", "blinks at about 1 Hz while the tile's clock runs"),
    ("faulted", "STATUS.faulted: the tile stopped on a fault (FAULT has the cause)"),
    ("running", "STATUS.running: a plan is executing"),
    ("done", "STATUS.done: the last plan finished"),
    ("speculating", "STATUS.speculating: inside an ASSUME region"),
    ("uart_rx", "a request is arriving on the UART"),
    ("uart_tx", "a response is leaving on the UART"),
    ("locked", "the PLL has locked"),
)


@dataclass(frozen=True)
class Board:
    """A board the tile can be built for.

    Attributes
    ----------
    name : str
        What ``fusetile build --board`` takes.
    platform : str
        ``module:Class`` of the amaranth-boards platform.
    family : str
        ``"ecp5"`` or ``"ice40"`` (which PLL and which nextpnr).
    clock : str
        The platform's oscillator resource.
    reset : str
        The platform's button resource used as reset.
    leds : int
        LEDs the platform has as ``led`` 0..n-1.
    config : TileConfig
        The tile configuration built by default.
    clock_hz : float
        The tile's clock built by default (what timing must close at).
    gmem_ports : str
        How GMEM is built (:class:`~fusetile.hdl.gmem.GlobalMemory`): ``"shared"``, a
        read and a write port in block RAM, or ``"single"``, one port in the iCE40UP's
        SPRAM.
    store_ports : str
        How the host reads the plan banks and kernel slots (:class:`Tile`): ``"dual"``,
        a read port of its own, or ``"shared"``, the control unit's (half the block
        RAMs).
    trace_width : int
        Bits of the trace FIFO's memory (:class:`Tile`): 256, a record a word, or down
        to 64, a record over four cycles in a quarter of the block RAMs.
    seed : int
        nextpnr's placement seed built by default. A placement is the same for the same
        netlist and seed, and placement alone moves the Fmax by several MHz
        (docs/fpga-timing.md): the default is the seed of the best route measured for
        the default configuration, so that a plain build reproduces it.
    description : str
    """

    name: str
    platform: str
    family: str
    clock: str
    reset: str
    leds: int
    config: TileConfig
    clock_hz: float
    gmem_ports: str
    store_ports: str
    trace_width: int
    seed: int
    description: str

    def make_platform(self):
        """An instance of the amaranth-boards platform."""
        module, cls = self.platform.split(":")
        return getattr(importlib.import_module(module), cls)()

    def clock_plan(self, clock_hz=None, baud=DEFAULT_BAUD):
        """The PLL settings that make ``clock_hz`` (default :attr:`clock_hz`) from the
        board's oscillator, and the UART divisor (cycles per bit) for ``baud``.

        Returns
        -------
        (PllParams, int)

        Raises
        ------
        ValueError
            If the PLL cannot make the clock, or the clock cannot make ``baud`` (a
            divisor below the bridge's minimum of 4, or more than 2 % off).
        """
        clock_hz = self.clock_hz if clock_hz is None else clock_hz
        f_in = self.make_platform().lookup(self.clock, 0).clock.frequency
        pll = {"ecp5": ecp5_pll_params, "ice40": ice40_pll_params}[self.family](f_in, clock_hz)
        divisor = round(pll.f_out / baud)
        if divisor < 4:
            raise ValueError(f"{baud} baud needs a clock of at least {4 * baud / 1e6:g} MHz, "
                             f"not {pll.f_out / 1e6:g} MHz")
        if abs(pll.f_out / divisor - baud) > 0.02 * baud:
            raise ValueError(f"{pll.f_out / 1e6:g} MHz cannot make {baud} baud within 2 %")
        return pll, divisor


BOARDS = {b.name: b for b in (
    Board(
        name="ulx3s-85f",
        platform="amaranth_boards.ulx3s:ULX3S_85F_Platform",
        family="ecp5", clock="clk25", reset="button_fire", leds=8,
        config=TileConfig(),
        clock_hz=100e6,
        gmem_ports="shared",
        store_ports="dual",
        trace_width=256,
        # bf01de7's route with seed 3: 100.22 MHz, timing met (seeds 1 and 2 were
        # stopped in routing, unfinished; docs/fpga.md, step 54).
        seed=3,
        description="Radiona ULX3S, Lattice ECP5 LFE5U-85F (84k LUT4, 156 MULT18, 208 EBR)",
    ),
    Board(
        name="icebreaker",
        platform="amaranth_boards.icebreaker:ICEBreakerPlatform",
        family="ice40", clock="clk12", reset="button", leds=2,
        # A 2 x 2 array on 32-bit words (a DSP per product: 4 of the UP5K's 8, the
        # vector unit's lane multiplier the other 4), one vector lane for the four,
        # GMEM in the SPRAM (128 KiB), small memories, a scratchpad of one bank (42
        # logic cells fewer than two of half the words; the digits MLP's cycles the
        # same), one partition (the one the runtime uses: then it is the whole
        # scratchpad, with no table entry, about 240 logic cells; with a table, one
        # partition was 97 logic cells fewer than two, and two 195 fewer than
        # four), no DMA queue (a DMA instruction waits for an idle engine, which
        # takes it at once: 85 logic cells, and the digits workloads 0.2 % faster),
        # no per-slot,
        # per-flag or per-bank counters, no trace FIFO (about 1,000 logic cells:
        # with slots of 64 the runtime's fusion has nothing to gain here) and no
        # speculation (about 300: the data-dependent workloads need 11 and 21
        # slots), nor VCMP and VARGMAX, which only they use (`decisions`), no
        # averaging VPOOL, which the compiler never asks for (`pool_average`), no
        # kernel version tags, which only the host reads (`slot_versions`: about 125
        # logic cells), no VADD, VPOOL or VCLAMP (`word_ops`: a network of Gemms, as
        # the digits MLP, needs none; the CNNs do not run here), no watchdog (the
        # host stops a plan that runs too long with CTRL.abort: about 200 logic
        # cells), no MARK or REFUSED_ADDR register and no counters of retired
        # instructions, swaps, faults, refused writes or saturated lanes, which only
        # a person debugging reads (`debug_regs`: the transport has a refused
        # write's ERR, with its address; 266 logic cells), the units built for area
        # where they have such a build
        # (`compact`). So it fits: 5,192 of the UP5K's 5,280 logic cells (docs/fpga.md,
        # step 71).
        config=TileConfig(rows=2, cols=2, word_bytes=4, spad_banks=1, spad_bank_words=512,
                          partitions=1, kernel_slots=4, slot_depth=64, plan_depth=64,
                          gmem_bytes=128 * 1024, trace_depth=0, staging_words=0,
                          dma_queue=0, slot_counters=False, branch_counters=False,
                          bank_counters=False, vector_lanes=1, compact=True,
                          decisions=False, pool_average=False, slot_versions=False,
                          word_ops=False, watchdog=False, debug_regs=False),
        # The PLL's nearest to 20 MHz (DIVF 52, DIVQ 5): routed at 22.46 MHz, timing
        # met; at 24 MHz asked it routes at 21.83 (step 71).
        clock_hz=19.875e6,
        gmem_ports="single",
        store_ports="shared",
        trace_width=64,     # for a --config with a trace FIFO
        seed=1,             # nextpnr's own default: step 71's route, the only one measured
        description="1BitSquared iCEBreaker, Lattice iCE40UP5K (5,280 LUT4, 30 EBR, 8 DSP)",
    ),
)}


def board(name):
    """The :class:`Board` called ``name``.

    Raises
    ------
    ValueError
        If there is no such board (the message lists those there are).
    """
    try:
        return BOARDS[name]
    except KeyError:
        raise ValueError(f"unknown board {name!r}; known boards: "
                         f"{', '.join(sorted(BOARDS))}") from None


def _stretched(m, name, pulse, cycles):
    """A signal high for ``cycles`` after each cycle ``pulse`` is high (an LED that a
    one-bit blip would not light visibly)."""
    count = Signal(range(cycles + 1), name=f"{name}_stretch")
    with m.If(pulse):
        m.d.sync += count.eq(cycles)
    with m.Elif(count != 0):
        m.d.sync += count.eq(count - 1)
    return count != 0


class BoardCore(wiring.Component):
    """What every board top has inside its clock and reset: the tile behind a
    ``UartBridge``, and the LEDs. No primitives of its own, so it simulates anywhere
    (built for an iCE40UP with ``gmem_ports="single"``, GMEM is in its SPRAM).

    Parameters
    ----------
    config : TileConfig
    divisor : int
        Clock cycles per UART bit.
    leds : int
        How many of :data:`LED_MEANINGS` to drive.
    heartbeat_cycles : int
        Period of the heartbeat LED, in cycles (a power of two is used: the next
        one up).
    blink_cycles : int
        How long a UART byte keeps its activity LED lit, in cycles.
    gmem_ports, store_ports : str
    trace_width : int
        How GMEM, the instruction stores and the trace FIFO are built (:class:`Board`).

    Attributes
    ----------
    rx : In(1)
        The UART's receive pin (idle high).
    tx : Out(1)
        The UART's transmit pin (idle high).
    locked : In(1)
        The PLL's lock, for its LED.
    leds : Out(leds)
        LED ``n`` shows ``LED_MEANINGS[n]``.
    """

    def __init__(self, config, *, divisor, leds=len(LED_MEANINGS), heartbeat_cycles=1 << 26,
                 blink_cycles=1 << 20, gmem_ports="shared", store_ports="dual",
                 trace_width=256):
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        if not 0 <= leds <= len(LED_MEANINGS):
            raise ValueError(f"leds must be 0 to {len(LED_MEANINGS)}, not {leds!r}")
        self.config = config
        self.divisor = divisor
        self.gmem_ports = gmem_ports
        self.store_ports = store_ports
        self.trace_width = trace_width
        self.heartbeat_cycles = heartbeat_cycles
        self.blink_cycles = blink_cycles
        super().__init__({
            "rx": In(1, init=1),
            "tx": Out(1, init=1),
            "locked": In(1),
            "leds": Out(leds),
        })

    def elaborate(self, platform):
        m = Module()
        # GMEM's ports shared by the host and the DMA engine: a read and a write port,
        # what Yosys maps to block RAM on both families (two read-write ports with
        # Amaranth's read-during-write rules end up in flip-flops on the ECP5), or the
        # one port of the iCE40UP's SPRAM.
        m.submodules.tile = tile = Tile(self.config, gmem_ports=self.gmem_ports,
                                        store_ports=self.store_ports,
                                        trace_width=self.trace_width)
        # A host access to GMEM may wait for a DMA transfer: give it a millisecond-scale
        # bus timeout, not the simulation top's 256 cycles.
        m.submodules.bridge = bridge = UartBridge(self.divisor, addr_width=ADDR_WIDTH - 2,
                                                  timeout_cycles=BUS_TIMEOUT,
                                                  compact=self.config.compact)
        wiring.connect(m, bridge.bus, tile.bus)
        m.d.comb += [bridge.rx.eq(self.rx), self.tx.eq(bridge.tx)]

        heartbeat = Signal(max(1, (self.heartbeat_cycles - 1).bit_length()))
        m.d.sync += heartbeat.eq(heartbeat + 1)
        lights = {
            "heartbeat": heartbeat[-1],
            "faulted": tile.lights.faulted,
            "running": tile.lights.running,
            "done": tile.lights.done,
            "speculating": tile.lights.speculating,
            "uart_rx": _stretched(m, "uart_rx", ~bridge.rx, self.blink_cycles),
            "uart_tx": _stretched(m, "uart_tx", ~bridge.tx, self.blink_cycles),
            "locked": self.locked,
        }
        for n, (name, _) in enumerate(LED_MEANINGS[:len(self.leds)]):
            m.d.comb += self.leds[n].eq(lights[name])
        return m


class BoardTop(wiring.Component):
    """The tile on ``board``: a PLL, reset, and a :class:`BoardCore` on the board's
    UART and LEDs.

    Parameters
    ----------
    board : Board
    config : TileConfig, optional
        Default: ``board.config``.
    clock_hz : float, optional
        The tile's clock; default ``board.clock_hz``. The PLL gets as near as its
        dividers allow (:attr:`pll`.f_out is what it makes; set by elaboration).
    baud : int
        The UART's line rate.

    Raises ``ValueError`` if GMEM is to be in SPRAM and does not fit it; elaboration
    raises ``ValueError`` if the PLL cannot make ``clock_hz`` or the clock cannot make
    ``baud`` (:meth:`Board.clock_plan` says so before that).
    """

    def __init__(self, board, config=None, *, clock_hz=None, baud=DEFAULT_BAUD):
        if not isinstance(board, Board):
            raise TypeError(f"board must be a Board, not {board!r}")
        self.board = board
        self.config = board.config if config is None else config
        if not isinstance(self.config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {self.config!r}")
        if not isinstance(baud, int) or isinstance(baud, bool) or baud <= 0:
            raise ValueError(f"baud must be a positive integer, not {baud!r}")
        self.baud = baud
        self.clock_hz = board.clock_hz if clock_hz is None else float(clock_hz)
        self.pll = None
        # Said before anything is elaborated: GMEM built in SPRAM must fit it.
        platform = board.make_platform()
        if board.gmem_ports == "single" and uses_spram(platform):
            check_spram(self.config.word_bits, self.config.gmem_words, platform.device)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        b = self.board
        self.pll, divisor = b.clock_plan(self.clock_hz, self.baud)

        def pin(direction, name, number=0, port=None):
            port = platform.request(name, number, dir="-") if port is None else port
            m.submodules[f"{name}_{number}"] = buffer = io.Buffer(direction, port)
            return buffer

        if b.family == "ice40":
            clk_in = platform.request(b.clock, 0, dir="-").io     # SB_PLL40_PAD takes the pad
        else:
            clk_in = pin("i", b.clock).i
        m.domains.sync = sync = ClockDomain("sync")
        m.submodules.pll = pll = Pll(self.pll, clk_in, sync.clk)

        # Reset until the PLL locks and while the button is held, released in step
        # with the clock.
        button = pin("i", b.reset)
        m.submodules.reset_sync = ResetSynchronizer(~pll.locked | button.i, domain="sync")

        f_clk = int(self.pll.f_out)
        m.submodules.core = core = BoardCore(
            self.config, divisor=divisor, leds=b.leds, gmem_ports=b.gmem_ports,
            store_ports=b.store_ports, trace_width=b.trace_width,
            heartbeat_cycles=f_clk, blink_cycles=f_clk // 50)   # ~1 Hz; 20 ms per byte
        uart = platform.request("uart", 0, dir="-")
        m.d.comb += [
            core.rx.eq(pin("i", "uart_rx", port=uart.rx).i),
            pin("o", "uart_tx", port=uart.tx).o.eq(core.tx),
            core.locked.eq(pll.locked),
        ]
        for n in range(b.leds):
            m.d.comb += pin("o", "led", n).o.eq(core.leds[n])
        return m
