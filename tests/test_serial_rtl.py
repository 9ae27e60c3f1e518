"""The ``serial`` transport against the gateware: the UART bridge and the tile in Verilator.

As ``tests/test_serial_transport.py``, but the pseudo-terminal's other side is
:class:`~fusetile.sim.uart_rtl.RtlBridge`: the bytes are bit-banged onto the ``rx`` pin
of ``Tile`` + ``UartBridge`` (``fusetile.sim.uart_top``) under cocotb and the responses
decoded from ``tx``. One simulator serves the module; the top is reset before each
test.
"""

import numpy as np
import pytest

from fusetile.hdl.board import BOARDS
from fusetile.hdl.regmap import tile_memory_map
from fusetile.host.device import Device
from fusetile.host.runner import infer, load_program
from fusetile.host.transport import BusError, open_transport
from fusetile.host.uart_protocol import Cmd, Status

from conftest import require_simulator
from scenarios import SCENARIOS
# The same checks as over the stand-in, collected here, so with this module's fixtures:
# the link and the board are the RTL's.
from test_serial_transport import (CONFIG, WATCHDOG, _frames,  # noqa: F401
                                   test_bus_error_mid_burst_names_the_word,
                                   test_bus_error_names_the_register,
                                   test_corrupted_request_is_resent,
                                   test_corrupted_write_is_not_carried_out_then_resent,
                                   test_identity, test_windows_and_registers_round_trip,
                                   windows_round_trip)


pytestmark = pytest.mark.cocotb

# The tile only runs while the simulator serves a request: wait_cycles need not sleep.
CLOCK_HZ = 1e9
# Seconds the host waits for a response: the simulator may be slow on a busy machine.
TIMEOUT = 20.0


@pytest.fixture(scope="module")
def rtl_board():
    require_simulator("verilator")
    from fusetile.sim.uart_board import UartBoard
    from fusetile.sim.uart_rtl import RtlBridge

    with UartBoard(RtlBridge(CONFIG)) as board:
        yield board


@pytest.fixture
def board(rtl_board):
    rtl_board.bridge.reset()
    rtl_board.frames.clear()
    return rtl_board


@pytest.fixture
def link(board):
    with open_transport(f"serial:{board.port}@3000000", timeout=TIMEOUT, clock_hz=CLOCK_HZ,
                        config=CONFIG) as transport:
        yield transport


@pytest.fixture
def dev(link):
    return Device(link)


# As over the stand-in: the host's wait_cycles does not run the tile's clock (here the
# simulator stands still while the host sleeps), so a check of how far the counters
# moved in a wait means nothing over the link.
_CLOCK_EXACT = {"counters_freeze_and_clear"}
# These watch the tile mid-plan (start, then see it running / in a kernel / speculating,
# or abort it). One register access over the line costs ~15 byte times (600 cycles at
# divisor 4; ~2500 at 3 Mbaud and 50 MHz on a board), so their "slow" kernels are done
# before the host looks: the stand-in passes them only because its tile's clock moves
# just a few cycles per access.
_TOO_FAST_FOR_THE_LINE = {"bank_swap_is_atomic", "slot_protection", "abort",
                          "speculation_hit_publishes"}


# Moves all of GMEM over the line five times (~20 KB, ~850k cycles: about a minute at
# the ~25k cycles/s the Verilator model runs at under cocotb); fills a kernel slot (4 KB).
_SLOW_OVER_THE_LINE = {"speculation_miss_rolls_back", "kernel_runs_off_its_slot"}


@pytest.mark.parametrize("scenario", [
    pytest.param(s, marks=[pytest.mark.slow] if s.__name__ in _SLOW_OVER_THE_LINE else [])
    for s in SCENARIOS if s.__name__ not in _CLOCK_EXACT | _TOO_FAST_FOR_THE_LINE],
    ids=lambda s: s.__name__)
def test_scenario(dev, scenario):
    scenario(dev)


def test_mlp_on_eight_digits(dev, board):
    mlp_on_eight_digits(dev, board, CONFIG)


def mlp_on_eight_digits(dev, board, config):
    """The digits MLP on eight test digits through ``dev`` (``board``'s tile, of
    ``config``): bit for bit the golden model's."""
    from fusetile.host.bench import _workload
    from fusetile.kernels.compiler import compile_graph
    from fusetile.workloads.digits import load_split

    graph = _workload("mlp")
    x_test = load_split()[2][:8]
    x = graph.quantize_input(x_test.reshape((len(x_test),) + tuple(
        graph.tensors[graph.input].shape)))
    program = compile_graph(graph, config)

    with open_transport("model", config=config) as model:
        golden = Device(model)
        load_program(golden, program)
        want, _ = infer(golden, program, x)

    load_program(dev, program)
    before = board.bridge.cycles
    got, stats = infer(dev, program, x)
    assert np.array_equal(got, want)
    assert board.bridge.cycles > before
    assert stats.samples == 8 and stats.macs > 0


def test_frame_timeout_through_the_rtl(board):
    """A frame cut short is dropped by the gateware's own frame timeout."""
    import serial
    from fusetile.host.uart_protocol import decode_response, encode_request, encode_response

    with serial.Serial(board.port, 3_000_000, timeout=TIMEOUT) as line:
        line.write(bytes([0xA5, 0x33]))
        assert line.read(4) == encode_response(Status.BAD_COMMAND), "answered at once"
        line.write(encode_request(Cmd.READ, WATCHDOG >> 2, 1)[:4])
        assert line.read(4) == encode_response(Status.TIMEOUT)
        line.write(b"\x00\x5a" + encode_request(Cmd.READ, WATCHDOG >> 2, 1))
        assert decode_response(line.read(8)) == (Status.OK, 0, [0])
    assert _frames(board)[-3:] == [(0x33, None, None, Status.BAD_COMMAND),
                                   (Cmd.READ, None, None, Status.TIMEOUT),
                                   (Cmd.READ, WATCHDOG >> 2, 1, Status.OK)]


#: The iCEBreaker's tile, its units and its bridge built for area, as its board top has
#: them (GMEM behind the tile's shared port here, not in the SPRAM).
SMALL = BOARDS["icebreaker"].config


@pytest.fixture(scope="module")
def small_board():
    require_simulator("verilator")
    from fusetile.sim.uart_board import UartBoard
    from fusetile.sim.uart_rtl import RtlBridge

    with UartBoard(RtlBridge(SMALL)) as board:
        yield board


def test_the_icebreakers_tile_through_its_bridge(small_board):
    """The iCEBreaker's configuration behind its bridge (which keeps its words in the
    burst buffer alone): the profile reads back, bursts of GMEM, plan and kernel words
    round-trip, a burst that runs off GMEM's end stops at its first word past it, and
    the MLP classifies eight digits as the golden model does."""
    small_board.bridge.reset()
    with open_transport(f"serial:{small_board.port}@3000000", timeout=TIMEOUT,
                        clock_hz=CLOCK_HZ, config=SMALL) as link:
        dev = Device(link)
        assert dev.hardware_profile() == SMALL
        windows_round_trip(dev)
        end = tile_memory_map(SMALL)["GMEM"].addr + SMALL.gmem_bytes
        with pytest.raises(BusError) as err:
            link.read_burst(end - 8, 4)
        assert err.value.addr == end and not err.value.write
        mlp_on_eight_digits(dev, small_board, SMALL)
