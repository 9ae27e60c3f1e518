"""The ``serial`` transport against a board stand-in behind a pseudo-terminal.

The host opens ``serial:<pty>@3000000``; a :class:`~fusetile.sim.uart_board.UartBoard`
thread on the other side parses the frames as the gateware bridge does and carries them
out on the golden model. Covered: the spine scenarios and a compiled MLP through the
link; resends after BAD_CRC / TIMEOUT and no blind retry of lost or garbled responses;
errors (missing port, silent board, bad targets); bursts split into frames of at most
MAX_WORDS and FIXED frames for FIFO-style bursts; the bridge model's parser on its own.
"""

import os
import time
import tty

import numpy as np
import pytest

from fusetile.hdl import regmap
from fusetile.host.device import Device
from fusetile.host.runner import infer, load_program
from fusetile.host.serial_transport import SerialTransport, parse_port
from fusetile.host.transport import (BusError, TransportError, open_transport,
                                     transport_class, transport_names)
from fusetile.host.uart_protocol import (SYNC_REQ, MAX_WORDS, Cmd, Status, decode_response,
                                         encode_request, encode_response)
from fusetile.kernels.config import TileConfig
from fusetile.sim.uart_board import BridgeModel, UartBoard

from scenarios import SCENARIOS


# As tests/test_model.py.
CONFIG = TileConfig(gmem_bytes=4096, spad_bank_words=128, trace_depth=8)
MM = regmap.tile_memory_map(CONFIG)
GMEM = MM["GMEM"].addr
WATCHDOG = MM["WATCHDOG"].addr


@pytest.fixture
def board():
    with UartBoard(BridgeModel(config=CONFIG)) as board:
        yield board


@pytest.fixture
def link(board):
    with open_transport(f"serial:{board.port}@3000000", timeout=0.3, config=CONFIG) as transport:
        yield transport


@pytest.fixture
def dev(link):
    return Device(link)


def _frames(board, since=0):
    return [(f.cmd, f.addr, f.count, f.status) for f in board.frames[since:]]


# -- the spine through the link ---------------------------------------------------------

def test_registered():
    assert "serial" in transport_names()
    assert transport_class("serial") is SerialTransport


def test_identity(dev, board):
    with open_transport("model", config=CONFIG) as model:
        assert dev.identity() == Device(model).identity()
    assert dev.hardware_profile() == CONFIG == dev.config
    assert dev.version() == regmap.VERSION
    assert board.frames[0].cmd == Cmd.READ and board.frames[0].count == 6, \
        "the identity registers in one burst"


def windows_round_trip(dev):
    """Bursts of GMEM, plan and kernel words written through ``dev`` read back."""
    data = bytes(range(7, 7 + 203))
    dev.write_window("GMEM", 5, data)
    assert dev.read_window("GMEM", 5, len(data)) == data
    plan = [0x1234_5678_9ABC_DEF0 + i for i in range(40)]
    dev.write_plan(1, plan)
    assert dev.read_plan(1, 40) == plan
    kernel = [(1 << 127) | i << 64 | 0xA5A5_A5A5 for i in range(20)]   # SYNC_REQ in data
    dev.write_kernel(3, kernel)
    assert dev.read_kernel(3, 20) == kernel


def test_windows_and_registers_round_trip(dev):
    windows_round_trip(dev)
    dev.regs.WATCHDOG.write(limit=123_456)
    assert dev.regs.WATCHDOG.read().limit == 123_456
    dev.set_partition(2, base=0x40, length=64)
    view = dev.regs.PART[2].read()
    assert (view.base, view.length) == (0x40, 64)


def test_bus_error_names_the_register(dev):
    with pytest.raises(BusError, match=r"read from 0x00008000 \(unmapped\)") as err:
        dev.transport.read32(0x8000)
    assert err.value.addr == 0x8000 and not err.value.write
    with pytest.raises(BusError, match=r"write to 0x00000024 \(STATUS\)"):
        dev.transport.write32(dev.regs.STATUS.addr, 1)    # read-only: the tile answers ERR


def test_bus_error_mid_burst_names_the_word(dev, board):
    end = GMEM + CONFIG.gmem_bytes
    with pytest.raises(BusError, match=rf"write to {end:#010x} \(GMEM \+ 0x1000\)") as err:
        dev.transport.write_burst(end - 8, [1, 2, 3, 4])
    assert err.value.addr == end and err.value.write
    assert dev.transport.read_burst(end - 8, 2) == [1, 2], "the words before it were written"
    with pytest.raises(BusError) as err:
        dev.transport.read_burst(end - 4, 2)
    assert err.value.addr == end


# The board's tile runs on its own clock: the host's wait_cycles sleeps, so a check of
# how far the counters moved in a wait means nothing over the link.
_CLOCK_EXACT = {"counters_freeze_and_clear"}


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s.__name__ not in _CLOCK_EXACT],
                         ids=lambda s: s.__name__)
def test_scenario(dev, scenario):
    scenario(dev)


def test_mlp_on_a_free_running_board():
    from fusetile.host.bench import _workload
    from fusetile.kernels.compiler import compile_graph
    from fusetile.workloads.digits import load_split

    graph = _workload("mlp")
    x_test = load_split()[2][:16]
    x = graph.quantize_input(x_test.reshape((len(x_test),) + tuple(
        graph.tensors[graph.input].shape)))
    program = compile_graph(graph, TileConfig())

    with open_transport("model") as model:
        dev = Device(model)
        load_program(dev, program)
        want, _ = infer(dev, program, x)

    clock_hz = 1e6                     # the stand-in's tile runs at this (wall) clock
    with UartBoard(BridgeModel(clock_hz=clock_hz)) as board:
        with open_transport(f"serial:{board.port}@3000000", clock_hz=clock_hz) as link:
            dev = Device(link)
            load_program(dev, program)
            got, stats = infer(dev, program, x)
        assert board.bridge.cycles > 0, "the tile ran on its own between polls"
    assert np.array_equal(got, want)
    assert stats.samples == 16 and stats.macs > 0


# -- resends, and no blind retries -------------------------------------------------------

def test_corrupted_request_is_resent(link, board):
    link.write32(WATCHDOG, 77)
    since = len(board.frames)
    board.corrupt(1, skip=6)                          # the CRC byte of a read request
    assert link.read32(WATCHDOG) == 77
    assert link.resends == 1
    word = WATCHDOG >> 2
    assert _frames(board, since) == [(Cmd.READ, word, 1, Status.BAD_CRC),
                                     (Cmd.READ, word, 1, Status.OK)]


def test_corrupted_write_is_not_carried_out_then_resent(link, board):
    values = list(range(100, 100 + MAX_WORDS))
    since = len(board.frames)
    board.corrupt(1, skip=6 + 4 * 10)                 # a data byte of word 10
    link.write_burst(GMEM, values)
    assert link.resends == 1
    assert [f.status for f in board.frames[since:]] == [Status.BAD_CRC, Status.OK]
    assert link.read_burst(GMEM, MAX_WORDS) == values


def test_resends_give_up(link, board):
    board.corrupt(1, skip=6)
    link.retries = 0
    with pytest.raises(TransportError, match=r"answered BAD_CRC to a read of 1 word at "
                                             r"0x00000028 \(WATCHDOG\) 1 time in a row"):
        link.read32(WATCHDOG)
    assert link.resends == 0
    port = ScriptedPort(*[encode_response(Status.BAD_CRC)] * 5)
    scripted = SerialTransport(port)
    with pytest.raises(TransportError, match=r"on scripted answered BAD_CRC to a write of 1 "
                                             r"word at 0x00000028 4 times in a row: the link "
                                             r"loses or corrupts requests"):
        scripted.write32(WATCHDOG, 1)
    assert scripted.resends == 3 and len(port.requests) == 4


def test_dropped_response_is_not_retried(link, board):
    since = len(board.frames)
    board.drop(1)
    start = time.monotonic()
    with pytest.raises(TransportError, match=r"no answer from the board on .* within 0\.3 s "
                                             r"to a write of 1 word at 0x00000028 \(WATCHDOG\)"):
        link.write32(WATCHDOG, 4242)
    assert 0.25 < time.monotonic() - start < 3
    assert link.resends == 0 and board.dropped == 1
    assert _frames(board, since) == [(Cmd.WRITE, WATCHDOG >> 2, 1, Status.OK)], \
        "sent once, carried out"
    assert link.read32(WATCHDOG) == 4242, "the link works again"


def test_garbled_response_shows_the_bytes(link, board):
    link.write32(WATCHDOG, 5)
    since = len(board.frames)
    board.garble(1)
    with pytest.raises(TransportError, match=r"sent a bad response \(bad CRC\) to a read of "
                                             r"1 word at 0x00000028 \(WATCHDOG\): "
                                             r"5a 00 00 05 00 00 00 [0-9a-f]{2}$"):
        link.read32(WATCHDOG)
    assert link.resends == 0 and len(board.frames) == since + 1
    assert link.read32(WATCHDOG) == 5


class ScriptedPort:
    """An open port that answers each request with the next of ``answers``."""

    name = "scripted"

    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests = []
        self._pending = b""

    def write(self, data):
        self.requests.append(bytes(data))
        if self.answers:
            self._pending += self.answers.pop(0)

    def read(self, n):
        data, self._pending = self._pending[:n], self._pending[n:]
        return data

    def reset_input_buffer(self):
        self._pending = b""


def test_timeout_status_is_resent():
    port = ScriptedPort(encode_response(Status.TIMEOUT), encode_response(Status.OK, 0, [9]))
    link = SerialTransport(port)
    assert link.read32(0x24) == 9
    assert link.resends == 1
    assert port.requests == [encode_request(Cmd.READ, 9, 1)] * 2
    link.close()
    assert port.answers == [], "an object given as the port stays open"


def test_bad_answers_are_not_retried():
    cases = [
        (encode_response(Status.BAD_COMMAND), r"answered BAD_COMMAND to a read of 1 word"),
        (b"\x00\xffhello", r"sent not a response to a read of 1 word at 0x00000024: "
                           r"00 ff 68 65 6c 6c 6f$"),
        (encode_response(Status.OK, 0, [1])[:5], r"sent a response cut short .*: 5a 00 00 01 00$"),
        (encode_response(Status.OK, 3, [1]), r"a response to another request \(OK, ARG 3\)"),
        (bytes([0x5A, 0x77, 0]), r"sent not a response .*: 5a 77 00$"),
    ]
    for answer, message in cases:
        link = SerialTransport(ScriptedPort(answer, encode_response(Status.OK, 0, [1])))
        with pytest.raises(TransportError, match=message):
            link.read32(0x24)
        assert link.resends == 0


def test_long_garbage_is_truncated():
    link = SerialTransport(ScriptedPort(bytes(range(200))))
    with pytest.raises(TransportError, match=r": 00 01 02 .* 17 \.\.\. \(\d+ bytes\)$"):
        link.read_burst(0, 40)


def test_bus_error_status_names_the_word():
    config_link = SerialTransport(ScriptedPort(encode_response(Status.BUS_ERROR, 2)),
                                  config=CONFIG)
    with pytest.raises(BusError, match=r"write to 0x00000108 \(PART\[2\]\)") as err:
        config_link.write_burst(0x100, [1, 2, 3, 4])
    assert err.value.region == "PART[2]"
    fixed = SerialTransport(ScriptedPort(encode_response(Status.BUS_ERROR, 3)))
    with pytest.raises(BusError) as err:
        fixed.read_burst(0x74, 5, increment=False)
    assert err.value.addr == 0x74 and not err.value.write


# -- errors ----------------------------------------------------------------------------------

def test_missing_port():
    with pytest.raises(TransportError, match=r"Serial port /dev/no-such-tty does not exist"):
        open_transport("serial:/dev/no-such-tty@115200")


def test_silent_board():
    master, slave = os.openpty()
    tty.setraw(slave)
    try:
        path = os.ttyname(slave)
        with open_transport(f"serial:{path}", timeout=0.2) as link:
            assert link.baud == 1_000_000
            start = time.monotonic()
            with pytest.raises(TransportError, match=rf"no answer from the board on {path} "
                                                     r"within 0\.2 s to a read of 6 words"):
                Device(link)
            assert 0.15 < time.monotonic() - start < 3
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("target, message", [
    ("serial:/dev/ttyUSB0@fast", r"Baud rate must be a positive decimal integer, not 'fast' "
                                 r"\(in '/dev/ttyUSB0@fast'\)"),
    ("serial:/dev/ttyUSB0@0", r"not '0'"),
    ("serial:/dev/ttyUSB0@-9600", r"not '-9600'"),
    ("serial:/dev/ttyUSB0@", r"not ''"),
    ("serial:@3000000", r"must be 'serial:PORT\[@BAUD\]' .*: no port"),
    ("serial:", r"no port"),
    ("serial", r"needs a port: 'serial:PORT\[@BAUD\]'"),
])
def test_bad_targets(target, message):
    with pytest.raises(ValueError, match=message):
        open_transport(target)


def test_bad_arguments(board):
    assert parse_port("/dev/ttyUSB0@3000000") == ("/dev/ttyUSB0", 3000000)
    assert parse_port("COM3") == ("COM3", None)
    for kwargs, message in [({"timeout": 0}, r"timeout must be a positive number, not 0"),
                            ({"retries": -1}, r"retries must be a non-negative integer"),
                            ({"clock_hz": "fast"}, r"clock_hz must be a positive number"),
                            ({"baud": 9600}, r"Two baud rates: 3000000 .* and baud=9600")]:
        with pytest.raises(ValueError, match=message):
            open_transport(f"serial:{board.port}@3000000", **kwargs)
    with pytest.raises(TypeError, match=r"port must be a 'PORT\[@BAUD\]' string or an open"):
        SerialTransport(42)


# -- bursts --------------------------------------------------------------------------------

def test_bursts_are_split(link, board):
    values = list(range(1, 151))
    since = len(board.frames)
    link.write_burst(GMEM, values)
    assert link.read_burst(GMEM, 150) == values
    word = GMEM >> 2
    splits = [(word, 64), (word + 64, 64), (word + 128, 22)]
    assert _frames(board, since) == (
        [(Cmd.WRITE, a, n, Status.OK) for a, n in splits]
        + [(Cmd.READ, a, n, Status.OK) for a, n in splits])
    assert (link.words_written, link.words_read) == (150, 150)


def test_fixed_bursts(link, board):
    since = len(board.frames)
    link.write_burst(WATCHDOG, list(range(70)), increment=False)
    assert link.read_burst(WATCHDOG, 3, increment=False) == [69] * 3
    assert link.read_burst(MM["TRACE_DATA"].addr, 2 * MAX_WORDS, increment=False) \
        == [0] * 2 * MAX_WORDS
    word = WATCHDOG >> 2
    trace = MM["TRACE_DATA"].addr >> 2
    assert _frames(board, since) == [
        (Cmd.WRITE_FIXED, word, 64, Status.OK), (Cmd.WRITE_FIXED, word, 6, Status.OK),
        (Cmd.READ_FIXED, word, 3, Status.OK),
        (Cmd.READ_FIXED, trace, 64, Status.OK), (Cmd.READ_FIXED, trace, 64, Status.OK)]


def test_board_resyncs_over_the_line(board):
    import serial

    with serial.Serial(board.port, 3_000_000, timeout=1) as line:
        line.write(bytes([SYNC_REQ, 0x33]))
        assert line.read(4) == encode_response(Status.BAD_COMMAND), "answered at once"
        start = time.monotonic()
        line.write(encode_request(Cmd.READ, WATCHDOG >> 2, 1)[:4])
        assert line.read(4) == encode_response(Status.TIMEOUT)
        # The board stamps bytes with when it last looked at the line (up to a poll
        # earlier than they came), so its timeout may end a little before ours: it
        # waited, rather than answering at once.
        assert time.monotonic() - start >= board.bridge.frame_timeout / 2
        line.write(b"\x00\x5a" + encode_request(Cmd.READ, WATCHDOG >> 2, 1))
        assert decode_response(line.read(8)) == (Status.OK, 0, [0])


# -- the bridge model on its own -------------------------------------------------------------

def _decode(responses):
    return [decode_response(r)[:2] for r in responses]


def test_bridge_resyncs():
    bridge = BridgeModel(config=CONFIG)
    read = encode_request(Cmd.READ, WATCHDOG >> 2, 1)
    assert bridge.feed(b"\x00\x13\x5a" + read, now=0) == [encode_response(Status.OK, 0, [0])], \
        "bytes outside a frame are ignored"
    assert _decode(bridge.feed(bytes([SYNC_REQ, 0x33]), now=0)) == [(Status.BAD_COMMAND, 0)], \
        "an unknown CMD is answered at once"
    responses = []
    for byte in read:                                   # one byte at a time
        responses += bridge.feed(bytes([byte]), now=1)
    assert _decode(responses) == [(Status.OK, 0)]
    bridge.close()


def test_bridge_frame_timeout():
    bridge = BridgeModel(config=CONFIG, frame_timeout=0.05)
    write = encode_request(Cmd.WRITE, WATCHDOG >> 2, data=[99])
    assert bridge.feed(write[:6], now=10.0) == []
    assert bridge.deadline == pytest.approx(10.05)
    assert bridge.poll(now=10.04) == []
    assert _decode(bridge.poll(now=10.06)) == [(Status.TIMEOUT, 0)]
    assert bridge.deadline is None
    assert bridge.frames[-1][:3] == (Cmd.WRITE, WATCHDOG >> 2, 1)
    assert bridge.backend.read32(WATCHDOG) == 0, "a dropped frame is not carried out"
    assert _decode(bridge.feed(write[:3], now=11.0)) == []
    assert _decode(bridge.feed(write[3:] + write, now=11.1)) == [(Status.TIMEOUT, 0),
                                                                  (Status.OK, 0)], \
        "a gap of the frame timeout drops the frame before the new bytes are parsed"
    assert bridge.backend.read32(WATCHDOG) == 99
    bridge.close()


def test_bridge_checks_the_crc_before_writing():
    bridge = BridgeModel(config=CONFIG)
    write = bytearray(encode_request(Cmd.WRITE, WATCHDOG >> 2, data=[99]))
    write[-1] ^= 1
    assert _decode(bridge.feed(write, now=0)) == [(Status.BAD_CRC, 0)]
    assert bridge.backend.read32(WATCHDOG) == 0
    bridge.close()


def test_bridge_free_running_clock():
    with open_transport("model", config=CONFIG) as model:
        bridge = BridgeModel(model, clock_hz=1000, max_step=300)
        bridge.poll(now=5.0)
        before = model.cycles
        bridge.poll(now=5.2)
        assert model.cycles - before == 200
        bridge.poll(now=6.2)                            # 1000 due: 300 run, the rest lost
        assert model.cycles - before == 500 and bridge.cycles == 500
        bridge.poll(now=6.3)
        assert model.cycles - before == pytest.approx(600, abs=1), "on from the late point"
        bridge.close()
        assert not model.closed, "a backend given is not closed"
